//! Group commit for the Redis store: reserve and settle calls that arrive
//! while earlier ones are on the wire wait, and go together in one call of
//! `lua/batch.lua`.
//!
//! Every request writes the same few budgets of its tenant and upstream,
//! and each script call pays its own dispatch and reads. One batch reads
//! each key once (one MGET), writes each budget once and sets each slot
//! set's TTL once, whatever the number of items; the items still apply in
//! order, each all-or-nothing, exactly as separate calls would (the
//! differential test issues concurrent waves and compares every outcome).
//!
//! Measured (`valgrind --tool=callgrind` on `redis-server` 7.0, replaying a
//! gateway's reservation with 7 budgets): a reservation sent alone costs
//! Redis ~710k instructions, one in a batch of 20 ~570k; in a gateway run at
//! concurrency 64 Redis CPU per request fell by a fifth. Most of what is
//! left is the Lua interpreter itself (~50 instructions per Lua VM
//! instruction, ~1.7k per `tonumber`, ~12k per `redis.call('SET', …)`).
//!
//! No call waits for a batch to fill: a call goes at once when fewer than
//! [`MAX_IN_FLIGHT`] batches are on the wire, so at low load every batch has
//! one item, sent as a plain call of its own script (`RESERVE_LUA`,
//! `SETTLE_LUA`). Batches are sent by a task (not by a caller's future,
//! which a client disconnect may drop), with one timer per batch, set to
//! the latest deadline of its items (each is the store timeout from the
//! call). An item whose deadline passed while it waited is failed with
//! [`StoreError::Timeout`] and never sent, so it cannot have been applied;
//! a sent item waits at most the timeout plus the time it queued (under the
//! timeout), so at most twice the timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::{Arg, Cmd, ErrorKind, FromRedisValue, ServerErrorKind, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::conn::{map_err, Conn};
use super::scripts::LuaScript;
use crate::budget::StoreError;

/// Batches on the wire at once. Two lets a reservation go out while the
/// previous request's settlement is still on the wire (at concurrency 1 it
/// would otherwise wait for it); more only makes batches smaller.
pub const MAX_IN_FLIGHT: usize = 2;

/// Items per batch at most: a reservation costs Redis ~0.1–0.15 ms on the
/// development machine, and Redis serves no other client (no other gateway)
/// while a batch runs, so a batch is kept to a few milliseconds.
pub const MAX_BATCH: usize = 32;

/// One script call, written straight into a command buffer as
/// `EVALSHA <sha> <numkeys> keys… args…` (redis-rs's `ScriptInvocation`
/// keeps each argument in a `Vec<u8>` of its own: ~80 allocations per
/// reservation). Sent alone as it is; a batch copies its keys and arguments.
pub struct ScriptArgs {
    cmd: Cmd,
    keys: usize,
    keys_added: usize,
}

/// `EVALSHA`, the SHA and the key count precede the keys.
const HEADER: usize = 3;

impl ScriptArgs {
    /// A call of `script` with exactly `keys` keys, with room for the
    /// arguments of a reservation over them (~160 bytes and 9 arguments per
    /// key) without regrowth.
    pub fn new(script: &LuaScript, keys: usize) -> Self {
        let mut cmd = Cmd::with_capacity(HEADER + 16 + 10 * keys, 256 + 160 * keys);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self {
            cmd,
            keys,
            keys_added: 0,
        }
    }

    /// Appends a key (`KEYS[n]`); all keys come before the first argument.
    pub fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        self.keys_added += 1;
        self.cmd.arg(key);
        self
    }

    /// Appends an argument (`ARGV[n]`).
    pub fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        debug_assert_eq!(
            self.keys_added, self.keys,
            "keys as declared, before arguments"
        );
        self.cmd.arg(arg);
        self
    }

    /// Number of keys.
    pub fn key_count(&self) -> usize {
        self.keys
    }

    /// Number of arguments.
    pub fn arg_count(&self) -> usize {
        self.cmd.args_iter().len() - HEADER - self.keys
    }

    /// The command for a call sent alone.
    pub fn command(&self) -> &Cmd {
        &self.cmd
    }

    fn bytes(&self) -> usize {
        self.cmd.args_iter().skip(HEADER).map(arg_len).sum()
    }

    fn parts(
        &self,
    ) -> (
        impl Iterator<Item = Arg<&[u8]>>,
        impl Iterator<Item = Arg<&[u8]>>,
    ) {
        let keys = self.cmd.args_iter().skip(HEADER).take(self.keys);
        let args = self.cmd.args_iter().skip(HEADER + self.keys);
        (keys, args)
    }
}

fn arg_len(a: Arg<&[u8]>) -> usize {
    match a {
        Arg::Simple(b) => b.len(),
        _ => 0,
    }
}

fn copy_args<'a>(into: &mut Cmd, from: impl Iterator<Item = Arg<&'a [u8]>>) {
    for a in from {
        if let Arg::Simple(b) = a {
            into.arg(b);
        }
    }
}

/// Runs `cmd` (an EVALSHA of `script`); when Redis does not have the
/// script (first use, restart, `SCRIPT FLUSH`: the NOSCRIPT error means
/// nothing ran), sends the same call as EVAL with the source, which also
/// caches it for the next EVALSHA. Never `SCRIPT LOAD`: a Redis user may be
/// denied the `SCRIPT` command and still run scripts.
pub async fn run_script<T: FromRedisValue>(
    conn: &Conn,
    script: &LuaScript,
    cmd: &Cmd,
) -> redis::RedisResult<T> {
    let mut conn = conn.clone();
    match cmd.query_async(&mut conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut eval = Cmd::with_capacity(cmd.args_iter().len(), script.source().len() + 64);
            eval.arg("EVAL").arg(script.source());
            // `EVALSHA <sha>` → `EVAL <source>`; key count, keys, arguments as they were.
            copy_args(&mut eval, cmd.args_iter().skip(2));
            eval.query_async(&mut conn).await
        }
        r => r,
    }
}

/// What a batch item runs (`lua/batch.lua`'s op field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp {
    /// `reserve.lua`'s `reserve(KEYS, ARGV)`.
    Reserve,
    /// `settle.lua`'s `settle(KEYS, ARGV)`.
    Settle,
}

impl BatchOp {
    fn code(self) -> &'static str {
        match self {
            BatchOp::Reserve => "R",
            BatchOp::Settle => "S",
        }
    }
}

type ItemReply = Result<Vec<String>, StoreError>;

struct Pending {
    op: BatchOp,
    call: ScriptArgs,
    deadline: Instant,
    reply: oneshot::Sender<ItemReply>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Pending>,
    in_flight: usize,
}

/// The scripts a [`Batcher`] calls.
#[derive(Clone)]
pub struct BatchScripts {
    /// `lua/batch.lua` with its library and both item functions.
    pub batch: LuaScript,
    /// The reserve function alone: a batch of one reservation.
    pub reserve: LuaScript,
    /// The settle function alone: a batch of one settlement.
    pub settle: LuaScript,
}

/// Sends reserve and settle calls in batches (see the module docs).
pub struct Batcher {
    conn: Conn,
    scripts: BatchScripts,
    timeout: Duration,
    queue: Mutex<Queue>,
    batches: AtomicU64,
    items: AtomicU64,
}

/// Batches sent and items they carried since the store connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchCounts {
    /// Script calls of `lua/batch.lua` sent.
    pub batches: u64,
    /// Reserve and settle calls they carried (≥ `batches`).
    pub items: u64,
}

impl Batcher {
    /// A batcher calling `scripts` on `conn`; each call waits at most
    /// `timeout` (→ [`StoreError::Timeout`]).
    pub fn new(conn: Conn, scripts: BatchScripts, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            conn,
            scripts,
            timeout,
            queue: Mutex::new(Queue::default()),
            batches: AtomicU64::new(0),
            items: AtomicU64::new(0),
        })
    }

    /// The script a call of `op` sent alone runs: build its [`ScriptArgs`]
    /// for this one.
    pub fn script_for(&self, op: BatchOp) -> &LuaScript {
        match op {
            BatchOp::Reserve => &self.scripts.reserve,
            BatchOp::Settle => &self.scripts.settle,
        }
    }

    /// The scripts this batcher calls (shared by every domain's batcher).
    pub fn scripts(&self) -> &BatchScripts {
        &self.scripts
    }

    /// Batches sent so far and the items in them.
    pub fn counts(&self) -> BatchCounts {
        BatchCounts {
            batches: self.batches.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while holding the lock; a poisoned queue is still whole.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one item and returns its reply (the strings the item's script
    /// returned). Errors: [`StoreError::Timeout`] past the store timeout
    /// (counted from this call), [`StoreError::Unavailable`] when Redis
    /// cannot be reached, [`StoreError::Protocol`] when the item's script
    /// raised an error.
    pub async fn call(self: &Arc<Self>, op: BatchOp, call: ScriptArgs) -> ItemReply {
        let (tx, rx) = oneshot::channel();
        let pending = Pending {
            op,
            call,
            deadline: Instant::now() + self.timeout,
            reply: tx,
        };
        let lead = {
            let mut q = self.lock();
            q.waiting.push(pending);
            if q.in_flight < MAX_IN_FLIGHT {
                q.in_flight += 1;
                Some(take_batch(&mut q))
            } else {
                None
            }
        };
        if let Some(batch) = lead {
            tokio::spawn(self.clone().send_batches(batch));
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(
                "the batch carrying this call was dropped (runtime shutting down)".into(),
            )),
        }
    }

    /// Sends `batch`, then whatever queued meanwhile, until the queue is empty.
    async fn send_batches(self: Arc<Self>, mut batch: Vec<Pending>) {
        let mut slot = InFlight {
            batcher: &self,
            done: false,
        };
        loop {
            self.send(batch).await;
            let mut q = self.lock();
            if q.waiting.is_empty() {
                q.in_flight -= 1;
                slot.done = true;
                return;
            }
            batch = take_batch(&mut q);
        }
    }

    async fn send(&self, batch: Vec<Pending>) {
        let now = Instant::now();
        let (late, batch): (Vec<Pending>, Vec<Pending>) =
            batch.into_iter().partition(|p| p.deadline <= now);
        for p in late {
            // Never sent: it cannot have been applied.
            let _ = p.reply.send(Err(StoreError::NotSent(
                "the store timeout passed before the batch left".into(),
            )));
        }
        // The latest deadline bounds the batch: with the earliest, one item
        // about to expire would time out every fresh item beside it, and a
        // timed-out batch may still have been applied by Redis (its
        // reservations then wait for their TTL, unknown to their callers).
        let Some(deadline) = batch.iter().map(|p| p.deadline).max() else {
            return;
        };
        // A batch of one goes as a plain call of its own script: the batch
        // driver's bookkeeping is ~15% of a lone reservation's Redis time.
        let batched;
        let (script, cmd) = match batch.as_slice() {
            [one] => (self.script_for(one.op), one.call.command()),
            _ => {
                batched = self.command(&batch);
                (&self.scripts.batch, &batched)
            }
        };
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(batch.len() as u64, Ordering::Relaxed);
        crate::budget::metrics::redis_batch(batch.len());
        let result =
            match tokio::time::timeout_at(deadline, run_script::<Value>(&self.conn, script, cmd))
                .await
            {
                Ok(Ok(v)) if batch.len() == 1 => Ok(vec![v]),
                Ok(Ok(Value::Array(v))) if v.len() == batch.len() => Ok(v),
                Ok(Ok(v)) => Err(StoreError::Protocol(format!(
                    "batch of {} answered {v:?}",
                    batch.len()
                ))),
                Ok(Err(e)) => Err(map_err(e)),
                Err(_) => Err(StoreError::Timeout),
            };
        match result {
            Ok(replies) => {
                for (p, v) in batch.into_iter().zip(replies) {
                    let _ = p.reply.send(item_reply(v));
                }
            }
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// `EVALSHA <batch> <keys> keys… N (op nkeys nargs)×N args…`.
    fn command(&self, batch: &[Pending]) -> Cmd {
        let keys: usize = batch.iter().map(|p| p.call.key_count()).sum();
        let args: usize = batch.iter().map(|p| p.call.arg_count()).sum();
        let bytes: usize = batch.iter().map(|p| p.call.bytes()).sum();
        let mut cmd = Cmd::with_capacity(
            4 + keys + 3 * batch.len() + args,
            64 + bytes + 8 * (keys + args + 3 * batch.len()),
        );
        cmd.arg("EVALSHA")
            .arg(self.scripts.batch.get_hash())
            .arg(keys);
        for p in batch {
            copy_args(&mut cmd, p.call.parts().0);
        }
        cmd.arg(batch.len());
        for p in batch {
            cmd.arg(p.op.code())
                .arg(p.call.key_count())
                .arg(p.call.arg_count());
        }
        for p in batch {
            copy_args(&mut cmd, p.call.parts().1);
        }
        cmd
    }
}

fn take_batch(q: &mut Queue) -> Vec<Pending> {
    if q.waiting.len() <= MAX_BATCH {
        std::mem::take(&mut q.waiting)
    } else {
        q.waiting.drain(..MAX_BATCH).collect()
    }
}

/// One item's reply: its words (one string, split here: lib.lua's
/// `words`), or the error its script raised.
fn item_reply(v: Value) -> ItemReply {
    if let Value::BulkString(bytes) = &v {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| StoreError::Protocol("batch item reply is not UTF-8".into()))?;
        return Ok(text.split_ascii_whitespace().map(str::to_string).collect());
    }
    let items: Vec<String> = FromRedisValue::from_redis_value(v)
        .map_err(|e| StoreError::Protocol(format!("batch item reply: {e}")))?;
    if items.first().map(String::as_str) == Some("!") {
        return Err(StoreError::Protocol(format!(
            "script error: {}",
            items.get(1).map_or("", String::as_str)
        )));
    }
    Ok(items)
}

/// The in-flight count a batch task holds. If the task is dropped before
/// it finishes (its runtime stopped), the count is given back and the calls
/// still queued are failed, not left waiting for a task that will not come.
struct InFlight<'a> {
    batcher: &'a Batcher,
    done: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let waiting = {
            let mut q = self.batcher.lock();
            q.in_flight -= 1;
            if q.in_flight == 0 {
                std::mem::take(&mut q.waiting)
            } else {
                Vec::new()
            }
        };
        for p in waiting {
            let _ = p.reply.send(Err(StoreError::Unavailable(
                "the Redis batch task stopped (runtime shutting down)".into(),
            )));
        }
    }
}
