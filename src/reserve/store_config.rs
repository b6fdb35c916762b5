//! How the budget store is configured (`[store]`): read by the stores,
//! validated and loaded by `config`.

use std::time::Duration;

/// Which store holds budget state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// In-process, exact within one gateway.
    Memory,
    /// Redis or Redis Cluster at `url`.
    Redis {
        /// `redis://host:port/db` or `redis+cluster://h1:p1,h2:p2`.
        url: String,
    },
}

/// `[store]`.
#[derive(Debug, Clone)]
pub struct StorePolicy {
    /// Memory or Redis.
    pub kind: StoreKind,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Prefix of every stored key (no `{`/`}`).
    pub key_prefix: String,
    /// Budget domain: the hash tag shared by every key (DESIGN section 3).
    pub domain: String,
    /// Share of every budget (0 < share ≤ 1) one gateway may use on its own
    /// while the store is down, for `fail_open` tenants (e.g. 1/N for N gateways).
    pub fallback_share: f64,
    /// Where the memory store keeps its state across restarts (`None`: the
    /// default data directory, `reserve::memory::snapshot::default_path`).
    pub snapshot_path: Option<std::path::PathBuf>,
    /// How long an owner record of a stored response is kept (default 30 days).
    pub record_ttl: Duration,
    /// Most owner records the memory store keeps (least recently used evicted).
    pub max_memory_records: usize,
    /// Most budgets the deny cache remembers (least recently used evicted).
    pub deny_cache_entries: usize,
    /// Most budgets the fail-open limiter keeps state for (least recently
    /// used forgotten: it then starts full again).
    pub fail_open_entries: usize,
}
