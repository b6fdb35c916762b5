//! The Redis store: one atomic Lua script call per operation, exact across a
//! fleet of gateways sharing one Redis (or one Redis Cluster slot).
//!
//! Semantics are those of [`super::memory::MemoryStore`], reproduced exactly:
//! the scripts in `lua/` mirror its decisions and the integer arithmetic of
//! [`super::bucket`] and [`super::calendar`] line for line (DESIGN sections 2
//! and 3). The conformance suite (`tests/it/store_conformance.rs`) and the
//! differential property test run both stores side by side.
//!
//! Modules, one seam each: `scripts` (assembly of the Lua sources), `conn`
//! (the connection and its errors), `wire` (argument encodings and reply
//! reading), `hold` (the stored hold record), `batch` (group commit of
//! reserve and settle calls, one batcher per domain), `domains` (a
//! reservation over a tenant domain and a deployment domain, the `tenant`
//! layout), `migrate` (`budgetgate store migrate`: counters copied from the
//! `single` layout to the `tenant` layout), `store` (the [`super::BudgetStore`]
//! operations) and `quota_lease` ([`super::quota_lease::LeaseStore`]); this file holds the store's state and the calls they share.
//!
//! - Scripts: `lua/lib.lua` (shared math and storage helpers) is prepended to
//!   each of `extend.lua`, `renew.lua`, `inspect.lua` and `lower.lua`, and
//!   to `reserve.lua` and `settle.lua`, which define one function each: a
//!   call sent alone runs it, a batch (`batch.lua`, both functions) runs
//!   many in order. Reserve and settle calls go through the batcher
//!   (`batch.rs`): calls that arrive while two batches are on the wire
//!   go together in the next. Each script is called with EVALSHA and
//!   reloaded on NOSCRIPT (on every primary of a cluster).
//! - Keys: every key a call touches is passed in `KEYS` and carries the
//!   budget domain's hash tag ([`KeySpace`]), so each call runs on one slot
//!   (in the `tenant` layout, each call runs in one domain: `domains`).
//! - Time: Redis `TIME`, one clock for the fleet. Tests inject a [`Clock`]
//!   instead through a hidden constructor ([`RedisStore::with_test_clock`],
//!   called from code only: no config setting reaches it), so the
//!   conformance and differential suites run in every build; the gateway
//!   never calls it and never passes a time.
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

mod batch;
mod conn;
mod domains;
mod held_on;
mod hold;
pub mod migrate;
mod quota_lease;
pub mod records;
mod scripts;
mod store;
mod wire;

// foldhash, as the memory store's maps: hold keys and domains are looked up on every call.
use foldhash::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::config::store::{StoreKind, StorePolicy};

use super::keys::{self, KeySpace};
use super::placement::Layout;
use super::{BudgetSpec, StoreError};
use batch::{run_script, BatchOp, BatchScripts, Batcher, ScriptArgs};
use conn::{map_err, Conn};
use scripts::{LuaScript, Scripts};
use wire::protocol;

pub use batch::BatchCounts;
pub use conn::cluster_nodes;
pub use hold::{HoldLine, HoldRecord, HoldSettlement};
pub use scripts::{prelude, TTL_MARGIN_MS};

/// Hold budget-key lists remembered locally before the map is cleared
/// (a cleared entry only costs one extra read at settle).
const HOLD_CACHE_MAX: usize = 100_000;

/// A Redis-backed [`BudgetStore`] for one budget domain.
pub struct RedisStore {
    conn: Conn,
    keys: KeySpace,
    timeout: Duration,
    scripts: Scripts,
    /// Reserve and settle calls of the store's own domain, sent in batches.
    batcher: Arc<Batcher>,
    /// The batchers of the other domains (`tenant` layout): a batch runs on
    /// one slot, so each domain batches its own calls.
    domain_batchers: Mutex<HashMap<Arc<str>, Arc<Batcher>>>,
    /// Hold key → the hold's budget specs in line order, for the holds
    /// this process created (saves a read at extend/renew/settle).
    holds: Mutex<HashMap<String, Arc<Vec<BudgetSpec>>>>,
    /// Reservation id → the domains its holds are in, for reservations
    /// made outside the store's own domain (`tenant` layout; `domains`).
    placed: domains::Placements,
    /// `store.layout`, bound at start: in the `tenant` layout a reservation
    /// goes to the domains its budgets' keys name.
    layout: Layout,
    /// Tests only ([`RedisStore::with_test_clock`]): the time passed to
    /// every script instead of Redis `TIME`.
    clock: Option<Arc<dyn Clock>>,
}

/// Where a hold call goes: its own script, or a batch item.
#[derive(Clone, Copy)]
enum Route<'a> {
    Direct(&'a LuaScript),
    Batched(BatchOp),
}

impl RedisStore {
    /// Connects to `url` (`redis://…` for one node, `redis+cluster://h1:p1,h2:p2`
    /// for Redis Cluster). Every later call is bounded by `timeout`
    /// (→ [`StoreError::Timeout`]); keys are named by `keys`.
    pub async fn connect(url: &str, timeout: Duration, keys: KeySpace) -> Result<Self, StoreError> {
        let conn = Conn::open(url, timeout).await?;
        let store = Self {
            batcher: Batcher::new(
                conn.clone(),
                BatchScripts {
                    batch: LuaScript::batch(),
                    reserve: LuaScript::reserve(),
                    settle: LuaScript::settle(),
                },
                timeout,
            ),
            conn,
            keys,
            timeout,
            scripts: Scripts::new(),
            domain_batchers: Mutex::new(HashMap::default()),
            holds: Mutex::new(HashMap::default()),
            placed: domains::Placements::default(),
            layout: Layout::Single,
            clock: None,
        };
        // A user that may not run scripts can enforce no budget: refuse to
        // start (the error names the permission) instead of serving 503s.
        let first = timeout.max(Duration::from_secs(1));
        match tokio::time::timeout(first, store.probe_call()).await {
            Ok(r) => r?,
            Err(_) => return Err(StoreError::Timeout),
        }
        Ok(store)
    }

    /// The readiness probe: a read-only script round trip (the inspect
    /// script over no budget: it reads the clock and writes nothing), so a
    /// store is ready only when scripts run, never by making a reservation.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.bounded_store(self.probe_call()).await
    }

    async fn probe_call(&self) -> Result<(), StoreError> {
        let script = &self.scripts.inspect;
        let mut inv = ScriptArgs::new(script, 0);
        inv.arg(self.now_arg());
        let _: Vec<String> = run_script(&self.conn, script, inv.command())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn bounded_store<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }

    /// Connects as `[store]` configures (`kind` must be `redis`).
    pub async fn from_policy(policy: &StorePolicy) -> Result<Self, StoreError> {
        let StoreKind::Redis { url } = &policy.kind else {
            return Err(StoreError::Unavailable(
                "store.kind is not \"redis\"".into(),
            ));
        };
        Ok(Self::connect(
            url,
            policy.timeout,
            KeySpace::new(&policy.key_prefix, &policy.domain),
        )
        .await?
        .with_layout(policy.layout))
    }

    /// This store under `layout` (`connect` makes a `single` one).
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// For tests: pass `clock`'s time to every script instead of Redis
    /// `TIME`, so tests can cross UTC boundaries and expire leases without
    /// sleeping. Hidden: nothing in the gateway or its config calls it.
    #[doc(hidden)]
    pub fn with_test_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// How many batches of reserve and settle calls were sent, and how many
    /// calls they carried (calls that arrive while earlier ones are on the
    /// wire go together: see `batch`).
    pub fn batch_counts(&self) -> BatchCounts {
        let mut c = self.batcher.counts();
        for b in self.lock_batchers().values() {
            let o = b.counts();
            c.batches += o.batches;
            c.items += o.items;
        }
        c
    }

    /// The batcher of the domain tagged `tag` (`None`: the store's own).
    fn batcher_of(&self, tag: Option<&str>) -> Arc<Batcher> {
        let Some(tag) = tag.filter(|t| Some(*t) != keys::hash_tag(self.keys.base())) else {
            return self.batcher.clone();
        };
        let mut all = self.lock_batchers();
        if let Some(b) = all.get(tag) {
            return b.clone();
        }
        let b = Batcher::new(
            self.conn.clone(),
            self.batcher.scripts().clone(),
            self.timeout,
        );
        all.insert(Arc::from(tag), b.clone());
        b
    }

    fn lock_batchers(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Batcher>>> {
        // A cache of stateless senders: a panic mid-insert cannot make it wrong.
        self.domain_batchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Key of the hold of `id` in the domain tagged `tag` (`None`: the store's own).
    fn hold_key(&self, tag: Option<&str>, id: &str) -> String {
        match tag {
            None => self.keys.hold(id),
            Some(t) => self.keys.in_domain(t).hold(id),
        }
    }

    /// The key space this store names holds in.
    pub fn key_space(&self) -> &KeySpace {
        &self.keys
    }

    /// Reads the hold of `id` as stored (for tests and the admin API);
    /// `None` when Redis has no such key.
    pub async fn read_hold(&self, id: &str) -> Result<Option<HoldRecord>, StoreError> {
        self.read_hold_at(&self.keys.hold(id)).await
    }

    /// Reads the hold of `id` in the domain tagged `tag` (the `tenant`
    /// layout's holds live beside their budgets), for tests.
    pub async fn read_hold_in(
        &self,
        tag: &str,
        id: &str,
    ) -> Result<Option<HoldRecord>, StoreError> {
        self.read_hold_at(&self.keys.in_domain(tag).hold(id)).await
    }

    async fn read_hold_at(&self, key: &str) -> Result<Option<HoldRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let raw: Option<String> = self
            .bounded(redis::cmd("GET").arg(key).query_async(&mut conn))
            .await?;
        raw.map(|r| HoldRecord::parse(&r)).transpose()
    }

    /// The previous layout's key of each quota spec, in order (see
    /// [`KeySpace::previous_layout`]; the scripts read it when the current
    /// counter is absent).
    fn previous_quota_keys<'a>(&self, specs: impl Iterator<Item = &'a BudgetSpec>) -> Vec<String> {
        specs
            .filter(|s| matches!(s.kind, super::BudgetKind::Quota { .. }))
            .map(|s| {
                self.keys
                    .previous_layout(&s.key)
                    .unwrap_or_else(|| s.key.to_string())
            })
            .collect()
    }

    /// `""` (scripts read Redis `TIME`) unless a test clock is injected.
    fn now_arg(&self) -> String {
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

    async fn invoke(
        &self,
        script: &LuaScript,
        call: &ScriptArgs,
    ) -> Result<Vec<String>, StoreError> {
        self.bounded(run_script(&self.conn, script, call.command()))
            .await
    }

    fn cached_hold(&self, hold_key: &str) -> Option<Arc<Vec<BudgetSpec>>> {
        self.lock_holds().get(hold_key).cloned()
    }

    fn remember_hold(&self, hold_key: String, specs: Vec<BudgetSpec>) {
        let mut holds = self.lock_holds();
        if holds.len() >= HOLD_CACHE_MAX {
            holds.clear();
        }
        holds.insert(hold_key, Arc::new(specs));
    }

    fn forget_hold(&self, hold_key: &str) {
        self.lock_holds().remove(hold_key);
    }

    fn lock_holds(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Vec<BudgetSpec>>>> {
        // The map is a cache: a panic mid-update cannot make it wrong, only stale.
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hold's specs as stored, or empty when there is no hold (the
    /// script then answers "unknown").
    async fn fetch_hold_specs(&self, hold_key: &str) -> Result<Arc<Vec<BudgetSpec>>, StoreError> {
        Ok(Arc::new(match self.read_hold_at(hold_key).await? {
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
        hold_key: &str,
        tag: Option<&str>,
        id: &str,
        args: &[Vec<u8>],
    ) -> Result<(Vec<String>, Arc<Vec<BudgetSpec>>), StoreError> {
        let mut specs = match self.cached_hold(hold_key) {
            Some(s) => s,
            None => self.fetch_hold_specs(hold_key).await?,
        };
        let batcher = match route {
            Route::Direct(_) => None,
            Route::Batched(_) => Some(self.batcher_of(tag)),
        };
        for attempt in 0..2 {
            let script = match route {
                Route::Direct(script) => script,
                Route::Batched(op) => self.batcher.script_for(op),
            };
            let mut inv = ScriptArgs::new(script, 1 + specs.len());
            inv.key(hold_key);
            for s in specs.iter() {
                inv.key(&*s.key);
            }
            inv.arg(self.now_arg()).arg(id);
            for a in args {
                inv.arg(a);
            }
            let reply = match (route, &batcher) {
                (Route::Batched(op), Some(b)) => b.call(op, inv).await?,
                (Route::Batched(op), None) => self.batcher.call(op, inv).await?,
                (Route::Direct(script), _) => self.invoke(script, &inv).await?,
            };
            if reply.first().map(String::as_str) != Some("K") {
                return Ok((reply, specs));
            }
            if attempt == 0 {
                specs = self.fetch_hold_specs(hold_key).await?;
            }
        }
        Err(protocol(format!("hold {id}: budget keys keep changing")))
    }
}
