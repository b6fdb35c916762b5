//! The Redis store: one atomic Lua script call per operation, exact across a
//! fleet of gateways sharing one Redis (or one Redis Cluster slot).
//!
//! Semantics are those of [`super::memory::MemoryStore`], reproduced exactly:
//! the scripts in `lua/` mirror its decisions and the integer arithmetic of
//! [`super::bucket`] and [`super::calendar`] line for line (DESIGN sections 2
//! and 3). The conformance suite (`tests/store_conformance.rs`) and the
//! differential property test run both stores side by side.
//!
//! - Scripts: `lua/lib.lua` (shared math and storage helpers) is prepended to
//!   each of `extend.lua`, `renew.lua`, `inspect.lua` and `lower.lua`, and
//!   to `reserve.lua` and `settle.lua`, which define one function each: a
//!   call sent alone runs it, a batch (`batch.lua`, both functions) runs
//!   many in order. Reserve and settle calls go through the batcher
//!   (`redis_batch.rs`): calls that arrive while two batches are on the wire
//!   go together in the next. Each script is called with EVALSHA and
//!   reloaded on NOSCRIPT (on every primary of a cluster).
//! - Keys: every key a call touches is passed in `KEYS` and carries the
//!   budget domain's hash tag ([`KeySpace`]), so each call runs on one slot.
//! - Time: Redis `TIME`, one clock for the fleet. Builds with the
//!   `test-clock` feature may inject a [`Clock`] instead
//!   ([`RedisStore::with_test_clock`]); release builds never pass a time.
//! - Holds: a compact text record per reservation id of what was debited
//!   where ([`HoldRecord`]; layout in `lua/lib.lua`), shrunk to a tombstone
//!   at settle (enough to answer "already settled" and to replay the
//!   admission). Extend, renew and settle need the hold's budget keys up
//!   front (cluster routing and script hygiene both want `KEYS` complete),
//!   so the store remembers them for the holds it created and otherwise
//!   reads the hold first; the script verifies the list and answers `K` when
//!   it is stale, which makes the two-step read safe.
//! - Cost: every `redis.call`, number conversion and string built in a
//!   script costs server time on the one slot all reservations share, so
//!   the scripts read each key once per call, keep budget state binary
//!   (exact doubles) and format only what they reply or store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Script, Value};

use super::store_config::{StoreKind, StorePolicy};
#[cfg(feature = "test-clock")]
use crate::clock::Clock;

use super::keys::KeySpace;
pub use super::redis_batch::BatchCounts;
use super::redis_batch::{run_script, BatchOp, BatchScripts, Batcher, ScriptArgs};
use super::{
    Admission, BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, Denial, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement,
    StoreError, Window, WouldDeny,
};

/// Source of `lua/lib.lua`, the helpers every script starts with.
pub const LIB_LUA: &str = include_str!("../../lua/lib.lua");
/// Source of the reserve script for a call sent alone (library included;
/// the same `reserve(KEYS, ARGV)` as in [`BATCH_LUA`], without the batch
/// driver's per-item bookkeeping).
pub const RESERVE_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/reserve.lua"),
    "\nlocal reply = reserve(KEYS, ARGV)\nflush()\nreturn words(reply)\n"
);
/// Source of the settle script for a call sent alone (library included).
pub const SETTLE_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/settle.lua"),
    "\nlocal reply = settle(KEYS, ARGV)\nflush()\nreturn words(reply)\n"
);
/// Source of the batch script: the library, `reserve(KEYS, ARGV)`,
/// `settle(KEYS, ARGV)` and the driver that runs a batch of them in order
/// (see `src/reserve/redis_batch.rs`).
pub const BATCH_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/reserve.lua"),
    "\n",
    include_str!("../../lua/settle.lua"),
    "\n",
    include_str!("../../lua/batch.lua")
);
/// Source of the extend script (library included).
pub const EXTEND_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/extend.lua")
);
/// Source of the renew script (library included).
pub const RENEW_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/renew.lua")
);
/// Source of the lower script (library included).
pub const LOWER_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/lower.lua")
);
/// Source of the inspect script (library included).
pub const INSPECT_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/inspect.lua")
);

/// Hold budget-key lists remembered locally before the map is cleared
/// (a cleared entry only costs one extra read at settle).
const HOLD_CACHE_MAX: usize = 100_000;

/// A Redis-backed [`BudgetStore`] for one budget domain.
pub struct RedisStore {
    conn: Conn,
    keys: KeySpace,
    timeout: Duration,
    scripts: Scripts,
    /// Reserve and settle calls, sent in batches.
    batcher: Arc<Batcher>,
    /// Reservation id → the hold's budget specs in line order, for the holds
    /// this process created (saves a read at extend/renew/settle).
    holds: Mutex<HashMap<String, Arc<Vec<BudgetSpec>>>>,
    #[cfg(feature = "test-clock")]
    clock: Option<Arc<dyn Clock>>,
}

struct Scripts {
    extend: Script,
    renew: Script,
    inspect: Script,
    lower: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            extend: Script::new(EXTEND_LUA),
            renew: Script::new(RENEW_LUA),
            inspect: Script::new(INSPECT_LUA),
            lower: Script::new(LOWER_LUA),
        }
    }
}

/// Where a hold call goes: its own script, or a batch item.
enum Route<'a> {
    Direct(&'a Script),
    Batched(BatchOp),
}

/// A single-node or cluster connection; both are cheap handles to one
/// multiplexed connection (set), cloned per call.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Node URLs of a `redis+cluster://[user:pass@]h1:p1,h2:p2[/]` URL, or `None`
/// for a plain single-node URL. Credentials apply to every node.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return None;
    };
    let rest = rest.trim_end_matches('/');
    let (auth, hosts) = match rest.rfind('@') {
        Some(i) => (&rest[..=i], &rest[i + 1..]),
        None => ("", rest),
    };
    Some(
        hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{auth}{h}"))
            .collect(),
    )
}

pub(super) fn map_err(e: RedisError) -> StoreError {
    if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_cluster_error()
    {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Protocol(e.to_string())
    }
}

fn protocol(what: impl std::fmt::Display) -> StoreError {
    StoreError::Protocol(what.to_string())
}

impl RedisStore {
    /// Connects to `url` (`redis://…` for one node, `redis+cluster://h1:p1,h2:p2`
    /// for Redis Cluster). Every later call is bounded by `timeout`
    /// (→ [`StoreError::Timeout`]); keys are named by `keys`.
    pub async fn connect(url: &str, timeout: Duration, keys: KeySpace) -> Result<Self, StoreError> {
        // Reconnection attempts get more time than one call: a call that
        // times out is the caller's problem, a reconnect should still finish.
        let connect_timeout = timeout.max(Duration::from_secs(1));
        let conn = match cluster_nodes(url) {
            Some(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(connect_timeout)
                    .build()
                    .map_err(map_err)?;
                let c = tokio::time::timeout(connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|_| StoreError::Timeout)?
                    .map_err(map_err)?;
                Conn::Cluster(c)
            }
            None => {
                let client = redis::Client::open(url).map_err(map_err)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    // Calls are bounded by `bounded` (this store's timeout);
                    // a second timer per call would cost an eventfd write
                    // on the serving thread's runtime (see guarded.rs).
                    .set_response_timeout(None)
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                let c = tokio::time::timeout(
                    connect_timeout,
                    ConnectionManager::new_with_config(client, config),
                )
                .await
                .map_err(|_| StoreError::Timeout)?
                .map_err(map_err)?;
                Conn::Single(c)
            }
        };
        Ok(Self {
            batcher: Batcher::new(
                conn.clone(),
                BatchScripts {
                    batch: Script::new(BATCH_LUA),
                    reserve: Script::new(RESERVE_LUA),
                    settle: Script::new(SETTLE_LUA),
                },
                timeout,
            ),
            conn,
            keys,
            timeout,
            scripts: Scripts::new(),
            holds: Mutex::new(HashMap::new()),
            #[cfg(feature = "test-clock")]
            clock: None,
        })
    }

    /// Connects as `[store]` configures (`kind` must be `redis`).
    pub async fn from_policy(policy: &StorePolicy) -> Result<Self, StoreError> {
        let StoreKind::Redis { url } = &policy.kind else {
            return Err(StoreError::Unavailable(
                "store.kind is not \"redis\"".into(),
            ));
        };
        Self::connect(
            url,
            policy.timeout,
            KeySpace::new(&policy.key_prefix, &policy.domain),
        )
        .await
    }

    /// Test builds only: pass `clock`'s time to every script instead of
    /// Redis `TIME`, so tests can cross UTC boundaries and expire leases
    /// without sleeping.
    #[cfg(feature = "test-clock")]
    pub fn with_test_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// How many batches of reserve and settle calls were sent, and how many
    /// calls they carried (calls that arrive while earlier ones are on the
    /// wire go together: see `redis_batch`).
    pub fn batch_counts(&self) -> BatchCounts {
        self.batcher.counts()
    }

    /// The key space this store names holds in.
    pub fn key_space(&self) -> &KeySpace {
        &self.keys
    }

    /// Reads the hold of `id` as stored (for tests and the admin API);
    /// `None` when Redis has no such key.
    pub async fn read_hold(&self, id: &str) -> Result<Option<HoldRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let raw: Option<String> = self
            .bounded(
                redis::cmd("GET")
                    .arg(self.keys.hold(id))
                    .query_async(&mut conn),
            )
            .await?;
        raw.map(|r| HoldRecord::parse(&r)).transpose()
    }

    /// `""` (scripts read Redis `TIME`) unless a test clock is injected.
    fn now_arg(&self) -> String {
        #[cfg(feature = "test-clock")]
        if let Some(c) = &self.clock {
            return c.now_micros().to_string();
        }
        String::new()
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    async fn invoke(&self, script: &Script, call: &ScriptArgs) -> Result<Vec<String>, StoreError> {
        self.bounded(run_script(&self.conn, script, call.command()))
            .await
    }

    fn cached_hold(&self, id: &str) -> Option<Arc<Vec<BudgetSpec>>> {
        self.lock_holds().get(id).cloned()
    }

    fn remember_hold(&self, id: &str, specs: Vec<BudgetSpec>) {
        let mut holds = self.lock_holds();
        if holds.len() >= HOLD_CACHE_MAX {
            holds.clear();
        }
        holds.insert(id.to_string(), Arc::new(specs));
    }

    fn forget_hold(&self, id: &str) {
        self.lock_holds().remove(id);
    }

    fn lock_holds(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Vec<BudgetSpec>>>> {
        // The map is a cache: a panic mid-update cannot make it wrong, only stale.
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hold's specs as stored, or empty when there is no hold (the
    /// script then answers "unknown").
    async fn fetch_hold_specs(&self, id: &str) -> Result<Arc<Vec<BudgetSpec>>, StoreError> {
        Ok(Arc::new(match self.read_hold(id).await? {
            // A settled hold keeps no budget keys; the script answers from the hold alone.
            Some(h) if h.settlement.is_none() => h.lines.into_iter().map(|l| l.spec).collect(),
            _ => Vec::new(),
        }))
    }

    /// Runs a hold script (`extend`, `renew`, `settle`) with the hold's keys,
    /// refreshing them once when the script says they are stale.
    async fn hold_call(
        &self,
        route: Route<'_>,
        id: &str,
        args: &[String],
    ) -> Result<(Vec<String>, Arc<Vec<BudgetSpec>>), StoreError> {
        let mut specs = match self.cached_hold(id) {
            Some(s) => s,
            None => self.fetch_hold_specs(id).await?,
        };
        for attempt in 0..2 {
            let script = match route {
                Route::Direct(script) => script,
                Route::Batched(op) => self.batcher.script_for(op),
            };
            let mut inv = ScriptArgs::new(script, 1 + specs.len());
            inv.key(self.keys.hold(id));
            for s in specs.iter() {
                inv.key(&s.key);
            }
            inv.arg(self.now_arg()).arg(id);
            for a in args {
                inv.arg(a);
            }
            let reply = match route {
                Route::Direct(script) => self.invoke(script, &inv).await?,
                Route::Batched(op) => self.batcher.call(op, inv).await?,
            };
            if reply.first().map(String::as_str) != Some("K") {
                return Ok((reply, specs));
            }
            if attempt == 0 {
                specs = self.fetch_hold_specs(id).await?;
            }
        }
        Err(protocol(format!("hold {id}: budget keys keep changing")))
    }
}

/// The numbers `lua/reserve.lua` reads of each spec, as one string: per
/// spec kind (1 bucket, 2 quota, 3 concurrency), a, b, cost and shadow (1
/// or 0), each an f64 in little-endian order (`struct.pack('<d')`; every
/// value is an integer below 2^53, exact as a double). One `struct.unpack`
/// in the script reads them all: cheaper in Redis than five decimal strings
/// per spec, each interned as a Lua string and converted by `tonumber`.
fn spec_numbers(specs: &[&BudgetSpec], tokens: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(specs.len() * 40);
    for spec in specs {
        let (kind, a, b) = match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => (1, per_minute, burst),
            BudgetKind::Quota { limit, window } => (
                2,
                limit,
                match window {
                    Window::Day => 0,
                    Window::Month => 1,
                },
            ),
            BudgetKind::Concurrency { max } => (3, max, 0),
        };
        for x in [kind, a, b, spec.cost(tokens), u64::from(spec.shadow)] {
            out.extend_from_slice(&(x as f64).to_le_bytes());
        }
    }
    out
}

/// The spec's live entry of the hold (layout in `lua/lib.lua`) without its
/// line index, which the script prepends: `" B <ref> <a> <b> ;"`,
/// `" Q <ref> <a> <b> "` (the script appends `"<window>:<tokens>;"`) or
/// `" C 0 <max> 0 ;"`; empty for a budget that keeps no live entry (a bucket
/// or quota that does not count tokens: extend and settle leave it alone).
/// Built with `push_str` and `itoa`: `format!` cost ~2k instructions per
/// argument on this path (callgrind).
fn live_line(spec: &BudgetSpec) -> String {
    let refund = if spec.refund_unused { " 1 " } else { " 0 " };
    let mut out = String::with_capacity(48);
    let mut num = itoa::Buffer::new();
    match spec.kind {
        BudgetKind::Bucket { per_minute, burst } if spec.name.counts_tokens() => {
            out.push_str(" B");
            out.push_str(refund);
            out.push_str(num.format(per_minute));
            out.push(' ');
            out.push_str(num.format(burst));
            out.push_str(" ;");
        }
        BudgetKind::Quota { limit, window } if spec.name.counts_tokens() => {
            out.push_str(" Q");
            out.push_str(refund);
            out.push_str(num.format(limit));
            out.push(' ');
            out.push_str(window_letter(window));
            out.push(' ');
        }
        BudgetKind::Concurrency { max } => {
            out.push_str(" C 0 ");
            out.push_str(num.format(max));
            out.push_str(" 0 ;");
        }
        _ => {}
    }
    out
}

/// The first six adm fields of the spec in the hold (layout in
/// `lua/lib.lua`): kind, a, b, cost, refund flag and meta, tab-separated.
/// The script appends the remaining amount and reset time it computed.
fn adm_fields(spec: &BudgetSpec, tokens: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    let mut num = itoa::Buffer::new();
    let (kind, a, b) = match spec.kind {
        BudgetKind::Bucket { per_minute, burst } => ("B", per_minute, num.format(burst)),
        BudgetKind::Quota { limit, window } => ("Q", limit, window_letter(window)),
        BudgetKind::Concurrency { max } => ("C", max, "0"),
    };
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(a).as_bytes());
    out.push(b'\t');
    out.extend_from_slice(b.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(spec.cost(tokens)).as_bytes());
    out.extend_from_slice(if spec.refund_unused {
        b"\t1\t"
    } else {
        b"\t0\t"
    });
    out.extend_from_slice(meta_of(spec).as_bytes());
    out
}

fn window_letter(window: Window) -> &'static str {
    match window {
        Window::Day => "D",
        Window::Month => "M",
    }
}

/// `kind, a, b` as the scripts expect them (see the ARGV of `lua/reserve.lua`),
/// numbers written straight into the command.
fn push_kind(inv: &mut ScriptArgs, kind: &BudgetKind) {
    match *kind {
        BudgetKind::Bucket { per_minute, burst } => inv.arg("B").arg(per_minute).arg(burst),
        BudgetKind::Quota { limit, window } => inv.arg("Q").arg(limit).arg(window_letter(window)),
        BudgetKind::Concurrency { max } => inv.arg("C").arg(max).arg("0"),
    };
}

/// Scope and budget name as a JSON array, stored opaquely in the hold so a
/// gateway that did not create it can still name the budget that refused.
fn meta_of(spec: &BudgetSpec) -> String {
    let mut parts: Vec<&str> = match &spec.scope {
        Scope::Tenant(t) => vec!["tenant", t],
        Scope::Key(t, k) => vec!["key", t, k],
        Scope::TenantModel(t, m) => vec!["tenant_model", t, m],
        Scope::Upstream(u) => vec!["upstream", u],
    };
    parts.push(spec.name.as_str());
    serde_json::to_string(&parts).unwrap_or_default()
}

fn parse_meta(meta: &str) -> Result<(Scope, BudgetName), StoreError> {
    let parts: Vec<String> =
        serde_json::from_str(meta).map_err(|e| protocol(format!("hold meta {meta:?}: {e}")))?;
    let bad = || protocol(format!("hold meta {meta:?}"));
    let (name, scope) = parts.split_last().ok_or_else(bad)?;
    let scope = match scope {
        [k, t] if k == "tenant" => Scope::Tenant(t.as_str().into()),
        [k, t, key] if k == "key" => Scope::Key(t.as_str().into(), key.as_str().into()),
        [k, t, m] if k == "tenant_model" => {
            Scope::TenantModel(t.as_str().into(), m.as_str().into())
        }
        [k, u] if k == "upstream" => Scope::Upstream(u.as_str().into()),
        _ => return Err(bad()),
    };
    let name = match name.as_str() {
        "rpm" => BudgetName::Rpm,
        "tpm" => BudgetName::Tpm,
        "max_concurrent" => BudgetName::MaxConcurrent,
        "tokens_per_day" => BudgetName::TokensPerDay,
        "tokens_per_month" => BudgetName::TokensPerMonth,
        "requests_per_day" => BudgetName::RequestsPerDay,
        _ => return Err(bad()),
    };
    Ok((scope, name))
}

fn window_of(kind: &BudgetKind) -> Option<Window> {
    match kind {
        BudgetKind::Quota { window, .. } => Some(*window),
        _ => None,
    }
}

/// A script reply: a flat array of strings read front to back.
struct Reply<'a> {
    items: &'a [String],
    pos: usize,
}

impl<'a> Reply<'a> {
    fn new(items: &'a [String]) -> Self {
        Self { items, pos: 0 }
    }

    fn str(&mut self) -> Result<&'a str, StoreError> {
        let v = self
            .items
            .get(self.pos)
            .ok_or_else(|| protocol(format!("short reply {:?}", self.items)))?;
        self.pos += 1;
        Ok(v)
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let s = self.str()?;
        s.parse()
            .map_err(|_| protocol(format!("bad number {s:?} in reply")))
    }

    fn i64(&mut self) -> Result<i64, StoreError> {
        let s = self.str()?;
        s.parse()
            .map_err(|_| protocol(format!("bad number {s:?} in reply")))
    }

    fn usize(&mut self) -> Result<usize, StoreError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| protocol(format!("index {v} out of range")))
    }

    fn rest(&self) -> usize {
        self.items.len() - self.pos
    }
}

fn state(spec: &BudgetSpec, remaining: i64, reset_micros: u64) -> BudgetState {
    BudgetState {
        scope: spec.scope.clone(),
        name: spec.name,
        limit: spec.limit(),
        remaining,
        reset_micros,
        window: window_of(&spec.kind),
    }
}

/// The inverse of [`push_kind`].
fn parse_kind(kind: &str, a: u64, b: &str) -> Result<BudgetKind, StoreError> {
    Ok(match kind {
        "B" => BudgetKind::Bucket {
            per_minute: a,
            burst: b
                .parse()
                .map_err(|_| protocol(format!("bad burst {b:?}")))?,
        },
        "Q" => BudgetKind::Quota {
            limit: a,
            window: match b {
                "D" => Window::Day,
                "M" => Window::Month,
                w => return Err(protocol(format!("bad window {w:?}"))),
            },
        },
        "C" => BudgetKind::Concurrency { max: a },
        k => return Err(protocol(format!("bad budget kind {k:?}"))),
    })
}

/// Reads `available, retry_after, reset` of a refusing `spec` into a [`Denial`].
fn denial(
    r: &mut Reply<'_>,
    spec: &BudgetSpec,
    requested: u64,
    now_micros: u64,
) -> Result<Denial, StoreError> {
    let available = r.i64()?;
    let retry_after_micros = r.u64()?;
    let reset = r.u64()?;
    Ok(Denial {
        scope: spec.scope.clone(),
        name: spec.name,
        limit: spec.limit(),
        requested,
        available,
        retry_after_micros,
        now_micros,
        state: state(spec, available, reset),
    })
}

#[async_trait]
impl BudgetStore for RedisStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        let all: Vec<&BudgetSpec> = req
            .common
            .iter()
            .chain(req.candidates.iter().flatten())
            .collect();
        let mut inv = ScriptArgs::new(self.batcher.script_for(BatchOp::Reserve), 1 + all.len());
        inv.key(self.keys.hold(&req.id));
        for s in &all {
            inv.key(&s.key);
        }
        inv.arg(self.now_arg())
            .arg(&req.id)
            .arg(req.tokens)
            .arg(req.lease_micros)
            .arg(req.hold_ttl_micros)
            .arg(req.common.len())
            .arg(req.candidates.len());
        for c in &req.candidates {
            inv.arg(c.len());
        }
        inv.arg(spec_numbers(&all, req.tokens).as_slice());
        for s in &all {
            inv.arg(live_line(s))
                .arg(adm_fields(s, req.tokens).as_slice());
        }
        let items = self.batcher.call(BatchOp::Reserve, inv).await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        match tag {
            "A" => {
                let candidate = r.usize()?;
                let replayed = r.str()? == "1";
                if replayed {
                    // The first admission, described by the hold itself.
                    self.forget_hold(&req.id);
                    let hold = HoldRecord::parse(r.str()?)?;
                    let budgets = hold
                        .lines
                        .iter()
                        .filter_map(|l| {
                            let (remaining, reset_micros) = l.admitted?;
                            Some(BudgetState {
                                scope: l.spec.scope.clone(),
                                name: l.spec.name,
                                limit: l.spec.limit(),
                                remaining,
                                reset_micros,
                                window: window_of(&l.spec.kind),
                            })
                        })
                        .collect();
                    return Ok(ReserveOutcome::Admitted(Admission {
                        now_micros: now,
                        candidate,
                        budgets,
                        replayed,
                        would_deny: hold.would_deny,
                    }));
                }
                let n_would_deny = r.usize()?;
                let mut would_deny = Vec::with_capacity(n_would_deny);
                let mut denied_idx = Vec::with_capacity(n_would_deny);
                for _ in 0..n_would_deny {
                    let idx = r.usize()?;
                    let spec = all
                        .get(idx)
                        .ok_or_else(|| protocol("would-deny names no budget"))?;
                    denied_idx.push(idx);
                    would_deny.push(WouldDeny {
                        scope: spec.scope.clone(),
                        name: spec.name,
                    });
                }
                let budgets = {
                    // Spec indexes into `all` of the common specs and the chosen candidate's.
                    let cand_start = req.common.len()
                        + req
                            .candidates
                            .iter()
                            .take(candidate)
                            .map(Vec::len)
                            .sum::<usize>();
                    let cand_len = req.candidates.get(candidate).map_or(0, Vec::len);
                    let chosen: Vec<BudgetSpec> = (0..req.common.len())
                        .chain(cand_start..cand_start + cand_len)
                        .filter(|i| !denied_idx.contains(i))
                        .filter_map(|i| all.get(i).map(|s| (*s).clone()))
                        .collect();
                    let metered: Vec<&BudgetSpec> = chosen
                        .iter()
                        .filter(|s| !matches!(s.kind, BudgetKind::Concurrency { .. }))
                        .collect();
                    if r.rest() != 2 * metered.len() {
                        return Err(protocol(format!(
                            "admission of {} has {} values for {} budgets",
                            req.id,
                            r.rest(),
                            metered.len()
                        )));
                    }
                    let mut budgets = Vec::with_capacity(metered.len());
                    for spec in metered {
                        let remaining = r.i64()?;
                        let reset = r.u64()?;
                        budgets.push(state(spec, remaining, reset));
                    }
                    self.remember_hold(&req.id, chosen);
                    budgets
                };
                Ok(ReserveOutcome::Admitted(Admission {
                    now_micros: now,
                    candidate,
                    budgets,
                    replayed,
                    would_deny,
                }))
            }
            "D" => {
                let spec = all
                    .get(r.usize()?)
                    .ok_or_else(|| protocol("denial names no budget"))?;
                let d = denial(&mut r, spec, spec.cost(req.tokens), now)?;
                Ok(ReserveOutcome::Denied(d))
            }
            "I" => {
                let spec = all
                    .get(r.usize()?)
                    .ok_or_else(|| protocol("impossibility names no budget"))?;
                Ok(ReserveOutcome::Impossible(Impossibility {
                    scope: spec.scope.clone(),
                    name: spec.name,
                    capacity: spec.capacity(),
                    requested: spec.cost(req.tokens),
                }))
            }
            other => Err(protocol(format!("reserve replied {other:?}"))),
        }
    }

    async fn extend(&self, id: &str, tokens: u64) -> Result<ExtendOutcome, StoreError> {
        let (items, specs) = self
            .hold_call(
                Route::Direct(&self.scripts.extend),
                id,
                &[tokens.to_string()],
            )
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        match tag {
            "E" => Ok(ExtendOutcome::Extended {
                granted: r.u64()?,
                now_micros: now,
            }),
            "X" => {
                let spec = specs
                    .get(r.usize()?)
                    .ok_or_else(|| protocol("exhaustion names no budget"))?;
                Ok(ExtendOutcome::Exhausted(denial(&mut r, spec, tokens, now)?))
            }
            "U" => {
                self.forget_hold(id);
                Ok(ExtendOutcome::Unknown)
            }
            "S" => {
                self.forget_hold(id);
                Ok(ExtendOutcome::AlreadySettled)
            }
            other => Err(protocol(format!("extend replied {other:?}"))),
        }
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        let (items, _) = self
            .hold_call(Route::Direct(&self.scripts.renew), id, &[])
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let _now = r.u64()?;
        match tag {
            "R" => Ok(RenewOutcome::Renewed {
                lease_until_micros: r.u64()?,
            }),
            "U" => {
                self.forget_hold(id);
                Ok(RenewOutcome::Unknown)
            }
            "S" => {
                self.forget_hold(id);
                Ok(RenewOutcome::AlreadySettled)
            }
            other => Err(protocol(format!("renew replied {other:?}"))),
        }
    }

    async fn settle(&self, id: &str, s: Settlement) -> Result<SettleOutcome, StoreError> {
        let args = [
            s.actual_tokens.to_string(),
            if s.upstream_failed { "1" } else { "0" }.to_string(),
        ];
        let (items, _) = self
            .hold_call(Route::Batched(BatchOp::Settle), id, &args)
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        let outcome = match tag {
            "T" => SettleOutcome::Settled {
                reserved: r.u64()?,
                refunded: r.u64()?,
                debt: r.u64()?,
                now_micros: now,
            },
            "U" => SettleOutcome::Unknown,
            "S" => SettleOutcome::AlreadySettled,
            other => return Err(protocol(format!("settle replied {other:?}"))),
        };
        self.forget_hold(id);
        Ok(outcome)
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        let BudgetKind::Bucket { per_minute, burst } = spec.kind else {
            let states = self.inspect(std::slice::from_ref(spec)).await?;
            return Ok(states.first().map_or(0, |s| s.remaining));
        };
        let mut inv = ScriptArgs::new(&self.scripts.lower, 1);
        inv.key(&spec.key)
            .arg(self.now_arg())
            .arg(per_minute)
            .arg(burst)
            .arg(at_most);
        let items = self.invoke(&self.scripts.lower, &inv).await?;
        let mut r = Reply::new(&items);
        let _now = r.u64()?;
        r.i64()
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        if specs.is_empty() {
            // The health check: a round trip proves the store answers.
            let mut conn = self.conn.clone();
            let _: String = self
                .bounded(redis::cmd("PING").query_async(&mut conn))
                .await?;
            return Ok(Vec::new());
        }
        let mut inv = ScriptArgs::new(&self.scripts.inspect, specs.len());
        for s in specs {
            inv.key(&s.key);
        }
        inv.arg(self.now_arg());
        for s in specs {
            push_kind(&mut inv, &s.kind);
        }
        let items = self.invoke(&self.scripts.inspect, &inv).await?;
        let mut r = Reply::new(&items);
        let _now = r.u64()?;
        if r.rest() != 2 * specs.len() {
            return Err(protocol(format!("inspect replied {items:?}")));
        }
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            let remaining = r.i64()?;
            let reset = r.u64()?;
            out.push(state(spec, remaining, reset));
        }
        Ok(out)
    }

    /// Every round trip is bounded by this store's timeout (`bounded`).
    fn times_out_calls(&self) -> bool {
        true
    }
}

/// A hold as stored in Redis: what one reservation debited where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRecord {
    /// Reservation id.
    pub id: String,
    /// Store time of the admission, UTC µs.
    pub admitted_micros: u64,
    /// Logical expiry, UTC µs (the key's TTL adds a margin).
    pub expires_micros: u64,
    /// Concurrency lease, µs.
    pub lease_micros: u64,
    /// Tokens reserved, initial + extensions.
    pub reserved_tokens: u64,
    /// Index of the chosen candidate deployment.
    pub candidate: usize,
    /// One line per budget debited, in order (common, then the candidate's).
    pub lines: Vec<HoldLine>,
    /// Shadow budgets that would have refused the admission (not debited).
    pub would_deny: Vec<WouldDeny>,
    /// Extensions as `(store time µs, tokens granted)`.
    pub extensions: Vec<(u64, u64)>,
    /// Set once settled.
    pub settlement: Option<HoldSettlement>,
}

/// One budget of a hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldLine {
    /// The budget, with the policy it was reserved under. Its `key` is empty
    /// once the hold is settled (the tombstone keeps no keys).
    pub spec: BudgetSpec,
    /// What the reservation debited from it, in its unit.
    pub cost: u64,
    /// Token-quota debits as `(window id, amount)`, reservation and
    /// extensions (what settle refunds from); empty for other budgets and
    /// once settled.
    pub quota_debits: Vec<(u64, u64)>,
    /// `(remaining, reset µs)` answered at admission (buckets and quotas).
    pub admitted: Option<(i64, u64)>,
}

/// The settle applied to a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSettlement {
    /// Store time of the settle, UTC µs.
    pub now_micros: u64,
    /// Tokens refunded to refundable budgets.
    pub refunded: u64,
    /// Tokens charged as debt.
    pub debt: u64,
}

fn hold_num<T: std::str::FromStr>(s: Option<&str>, what: &str) -> Result<T, StoreError> {
    s.and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol(format!("hold field {what} missing or not a number")))
}

/// `"a:b a:b"`-style pairs (`sep` between pairs).
fn hold_pairs(s: &str, sep: char, what: &str) -> Result<Vec<(u64, u64)>, StoreError> {
    s.split(sep)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (a, b) = p
                .split_once(':')
                .ok_or_else(|| protocol(format!("hold field {what}: bad pair {p:?}")))?;
            Ok((hold_num(Some(a), what)?, hold_num(Some(b), what)?))
        })
        .collect()
}

impl HoldRecord {
    /// Decodes the text the scripts store (layout v2, see `lua/lib.lua`):
    /// header, keys, live entries, extensions, admission, id, one per line.
    pub fn parse(raw: &str) -> Result<Self, StoreError> {
        let mut sections = raw.splitn(6, '\n');
        let mut section = |what: &str| {
            sections
                .next()
                .ok_or_else(|| protocol(format!("hold: no {what} section")))
        };
        let header = section("header")?;
        let keys = section("keys")?;
        let live = section("live")?;
        let ext = section("ext")?;
        let adm = section("adm")?;
        let id = section("id")?;

        let mut h = header.split(' ');
        let settled = match h.next() {
            Some("0") => false,
            Some("1") => true,
            other => return Err(protocol(format!("hold: bad state {other:?}"))),
        };
        let expires_micros = hold_num(h.next(), "exp")?;
        let reserved_tokens = hold_num(h.next(), "res")?;
        let lease_micros = hold_num(h.next(), "lease")?;
        let admitted_micros = hold_num(h.next(), "now")?;
        let candidate = hold_num(h.next(), "cand")?;
        let settlement = HoldSettlement {
            now_micros: hold_num(h.next(), "snow")?,
            refunded: hold_num(h.next(), "refunded")?,
            debt: hold_num(h.next(), "debt")?,
        };

        // Quota debits by 1-based line index, from the live entries.
        let mut debits: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for entry in live.split(';').filter(|e| !e.is_empty()) {
            let f: Vec<&str> = entry.splitn(6, ' ').collect();
            if f.len() != 6 {
                return Err(protocol(format!("hold: bad live entry {entry:?}")));
            }
            if f[1] == "Q" {
                debits.insert(hold_num(Some(f[0]), "line")?, hold_pairs(f[5], ',', "d")?);
            }
        }

        let mut a = adm.split('\t');
        let n_would_deny: usize = hold_num(a.next(), "adm")?;
        let mut would_deny = Vec::with_capacity(n_would_deny);
        for _ in 0..n_would_deny {
            let (scope, name) = parse_meta(a.next().ok_or_else(|| protocol("hold: short adm"))?)?;
            would_deny.push(WouldDeny { scope, name });
        }
        let fields: Vec<&str> = a.collect();
        if !fields.len().is_multiple_of(8) {
            return Err(protocol(format!("hold: adm has {} fields", fields.len())));
        }
        let keys: Vec<&str> = keys.split(' ').filter(|k| !k.is_empty()).collect();
        if !settled && keys.len() != fields.len() / 8 {
            return Err(protocol(format!(
                "hold: {} keys for {} lines",
                keys.len(),
                fields.len() / 8
            )));
        }
        let mut lines = Vec::with_capacity(fields.len() / 8);
        for (j, f) in fields.chunks(8).enumerate() {
            let kind = parse_kind(f[0], hold_num(Some(f[1]), "a")?, f[2])?;
            let (scope, name) = parse_meta(f[5])?;
            let admitted = if f[0] == "C" {
                None
            } else {
                Some((hold_num(Some(f[6]), "rem")?, hold_num(Some(f[7]), "reset")?))
            };
            lines.push(HoldLine {
                spec: BudgetSpec {
                    scope,
                    name,
                    kind,
                    key: keys.get(j).map_or_else(String::new, |k| k.to_string()),
                    refund_unused: f[4] == "1",
                    shadow: false,
                },
                cost: hold_num(Some(f[3]), "cost")?,
                quota_debits: debits.remove(&(j + 1)).unwrap_or_default(),
                admitted,
            });
        }
        Ok(HoldRecord {
            id: id.to_string(),
            admitted_micros,
            expires_micros,
            lease_micros,
            reserved_tokens,
            candidate,
            lines,
            would_deny,
            extensions: hold_pairs(ext, ' ', "ext")?,
            settlement: settled.then_some(settlement),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_become_node_lists() {
        assert_eq!(cluster_nodes("redis://127.0.0.1:7000/"), None);
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7001,127.0.0.1:7002/").unwrap(),
            vec!["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@h1:1,h2:2").unwrap(),
            vec!["redis://u:p@h1:1", "redis://u:p@h2:2"]
        );
    }

    #[test]
    fn meta_round_trips_every_scope() {
        let ks = KeySpace::new("bg", "d");
        for scope in [
            Scope::Tenant("acme".into()),
            Scope::Key("acme".into(), "batch".into()),
            Scope::TenantModel("acme".into(), "meta/llama:3".into()),
            Scope::Upstream("azure \"east\"".into()),
        ] {
            let spec = BudgetSpec {
                key: ks.budget(&scope, BudgetName::TokensPerDay),
                scope: scope.clone(),
                name: BudgetName::TokensPerDay,
                kind: BudgetKind::Quota {
                    limit: 5,
                    window: Window::Day,
                },
                refund_unused: true,
                shadow: false,
            };
            assert_eq!(
                parse_meta(&meta_of(&spec)).unwrap(),
                (scope, BudgetName::TokensPerDay)
            );
        }
    }

    /// The static hold text the gateway renders for `lua/reserve.lua`, in the
    /// exact layout of `lua/lib.lua` (the Lua side only prepends the line
    /// index, appends a quota's window and tokens, and the remaining/reset).
    #[test]
    fn hold_text_of_each_kind_of_spec() {
        let ks = KeySpace::new("bg", "d");
        let spec = |name: BudgetName, kind: BudgetKind, refund_unused: bool| BudgetSpec {
            key: ks.budget(&Scope::Tenant("t".into()), name),
            scope: Scope::Tenant("t".into()),
            name,
            kind,
            refund_unused,
            shadow: false,
        };
        let tpm = spec(
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: 1000,
                burst: 1500,
            },
            true,
        );
        let rpm = spec(
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: 60,
                burst: 60,
            },
            false,
        );
        let month = spec(
            BudgetName::TokensPerMonth,
            BudgetKind::Quota {
                limit: 9000000000,
                window: Window::Month,
            },
            false,
        );
        let slots = spec(
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max: 4 },
            true,
        );
        assert_eq!(live_line(&tpm), " B 1 1000 1500 ;");
        assert_eq!(live_line(&rpm), "", "a request budget keeps no live entry");
        assert_eq!(live_line(&month), " Q 0 9000000000 M ");
        assert_eq!(live_line(&slots), " C 0 4 0 ;");
        let adm = |s: &BudgetSpec| String::from_utf8(adm_fields(s, 77)).unwrap();
        assert_eq!(
            adm(&tpm),
            "B\t1000\t1500\t77\t1\t[\"tenant\",\"t\",\"tpm\"]"
        );
        assert_eq!(adm(&rpm), "B\t60\t60\t1\t0\t[\"tenant\",\"t\",\"rpm\"]");
        assert_eq!(
            adm(&month),
            "Q\t9000000000\tM\t77\t0\t[\"tenant\",\"t\",\"tokens_per_month\"]"
        );
        assert_eq!(
            adm(&slots),
            "C\t4\t0\t1\t1\t[\"tenant\",\"t\",\"max_concurrent\"]"
        );
        let nums = spec_numbers(&[&tpm, &month, &slots], 77);
        let got: Vec<f64> = nums
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            got,
            [1.0, 1000.0, 1500.0, 77.0, 0.0, 2.0, 9e9, 1.0, 77.0, 0.0, 3.0, 4.0, 0.0, 1.0, 0.0]
        );
    }

    #[test]
    fn empty_hold_and_tombstone_parse() {
        let h = HoldRecord::parse("0 9 7 3 5 0 0 0 0\n\n\n\n0\nr1").unwrap();
        assert!(h.lines.is_empty() && h.extensions.is_empty() && h.settlement.is_none());
        assert_eq!(
            (h.id.as_str(), h.reserved_tokens, h.expires_micros),
            ("r1", 7, 9)
        );
        let raw = "1 9 7 3 5 1 6 2 0\n\n\n6:4\n1\t[\"tenant\",\"t\",\"tpm\"]\t\
                   B\t100\t100\t3\t1\t[\"tenant\",\"t\",\"tpm\"]\t97\t1800\t\
                   C\t2\t0\t1\t1\t[\"tenant\",\"t\",\"max_concurrent\"]\t\t\nid\nwith newline";
        let h = HoldRecord::parse(raw).unwrap();
        assert_eq!(h.id, "id\nwith newline");
        assert_eq!(h.extensions, vec![(6, 4)]);
        assert_eq!(h.would_deny.len(), 1);
        assert_eq!(h.lines.len(), 2);
        assert_eq!(h.lines[0].admitted, Some((97, 1800)));
        assert_eq!(h.lines[0].cost, 3);
        assert!(h.lines[0].spec.key.is_empty() && h.lines[1].admitted.is_none());
        assert_eq!(
            h.settlement,
            Some(HoldSettlement {
                now_micros: 6,
                refunded: 2,
                debt: 0
            })
        );
    }
}
