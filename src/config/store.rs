//! How the budget store is configured (`[store]`, `on_store_error`): the
//! settings and the defaults validation fills in, read by the stores and
//! the admission layers.

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
    /// Budget domain: the hash tag shared by every key in the `single`
    /// layout, the first word of every tag in the `tenant` layout (DESIGN
    /// sections 3 and 22).
    pub domain: String,
    /// `store.layout`: one domain (`single`, the default) or one per tenant
    /// tree and deployment group (`tenant`).
    pub layout: super::placement::Layout,
    /// Share of every budget (0 < share ≤ 1) one gateway may use on its own
    /// while the store is down, for `fail_open` tenants (e.g. 1/N for N gateways).
    pub fallback_share: f64,
    /// Where the memory store keeps its state across restarts (`None`: the
    /// default data directory, `budget::memory::snapshot::default_path`).
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
    /// Quota leases (`[store.lease]`, Redis store only).
    pub lease: LeasePolicy,
}

/// Whether budgets may be leased (`lease = "auto" | "off"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseMode {
    /// A budget is leased once this gateway's demand on it passes `min_rate`.
    #[default]
    Auto,
    /// Every budget stays exact: one store call per reservation.
    Off,
}

/// `[store.lease]`: quota leases (`crate::admission::quota_lease`).
#[derive(Debug, Clone, PartialEq)]
pub struct LeasePolicy {
    /// `auto` (the Redis store's default) or `off` (the memory store's).
    pub mode: LeaseMode,
    /// Requests per second on one budget, at this gateway, from which it is leased.
    pub min_rate: u64,
    /// How long a lease lives without a report (store time).
    pub ttl: Duration,
    /// How often a live lease reports what it spent (and is renewed).
    pub report_interval: Duration,
    /// Largest share of a budget's capacity one lease may hold, (0, 1].
    pub max_fraction: f64,
    /// Stop spending a lease this long before its expiry (clock safety).
    pub clock_margin: Duration,
    /// Gateways of the fleet, for the bound `check-config` prints.
    pub fleet_size: u64,
    /// Tenants with `lease = "off"`: their own budgets stay exact.
    pub off_tenants: Vec<String>,
    /// `(tenant, key id)` of keys with `lease = "off"`.
    pub off_keys: Vec<(String, String)>,
    /// Deployments with `lease = "off"`.
    pub off_deployments: Vec<String>,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            mode: LeaseMode::Auto,
            min_rate: 50,
            ttl: Duration::from_secs(5),
            report_interval: Duration::from_secs(1),
            max_fraction: 0.25,
            clock_margin: Duration::from_millis(250),
            fleet_size: 1,
            off_tenants: Vec::new(),
            off_keys: Vec::new(),
            off_deployments: Vec::new(),
        }
    }
}

/// What a store failure does to a tenant's requests (DESIGN section 7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Fall back to a local limiter.
    FailOpen,
    /// Answer 503.
    #[default]
    FailClosed,
}

/// Default owner-record lifetime: 30 days, the provider's retention of
/// stored responses (`store.record_ttl_secs`).
pub const DEFAULT_RECORD_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default cap on owner records kept in memory (`store.max_memory_records`).
pub const DEFAULT_MAX_MEMORY_RECORDS: usize = 100_000;
/// Budgets the deny cache remembers when `store.deny_cache_entries` is not set.
pub const DEFAULT_DENY_CACHE_ENTRIES: usize = 100_000;
/// Budgets the fail-open limiter keeps state for when
/// `store.fail_open_entries` is not set.
pub const DEFAULT_FAIL_OPEN_ENTRIES: usize = 100_000;
