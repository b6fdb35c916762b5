//! The spend ledger (docs/LEDGER.md): one row per settlement and per
//! void of a held reservation, for finance queries the Prometheus counters
//! cannot answer (per user, per model, last month).
//!
//! - [`capture`]: the ledger's settlement observer ([`LedgerRows`]): the
//!   [`SpendRow`] of a settlement, built from the settlement event once
//!   the store has answered it.
//! - [`buffer`]: the bounded in-memory buffer rows wait in; recording never
//!   blocks a request, a full buffer drops the row and counts it.
//! - [`batcher`]: the writer task that moves the buffer to a [`LedgerSink`]
//!   in batches, off the request path, retrying while the sink is down,
//!   and prunes rows past the retention.
//! - [`sql`]: the sink and the queries over the control database.
//! - [`cli`]: `budgetgate spend` and `budgetgate reconcile`, over HTTP.
//! - [`crash`]: the run marker that tells a restarted gateway its
//!   previous run crashed (and lost at most its buffer).
//! - `start`: the ledger's wiring in `serve` ([`start()`]).
//! - [`query`]: spend grouped by tenant, key, model, end user and day or
//!   month; top N; CSV.
//! - [`window`]: the spend of one budget over its window (a refusal's
//!   explanation, reconciliation).
//! - [`reconcile`]: the ledger's sums against the store's calendar quota
//!   counters, the difference explained by its known causes.
//!
//! Guarantees (docs/LEDGER.md): rows are idempotent by reservation id (the
//! primary key; a retried settlement writes one row); a crash loses at
//! most the rows still buffered, i.e. at most one batch interval of
//! settlements (plus what the sink's outage kept buffered).

pub mod batcher;
pub mod buffer;
pub mod capture;
pub mod cli;
pub mod crash;
pub mod query;
pub mod reconcile;
pub mod sql;
mod start;
pub mod window;

use std::sync::Arc;

pub use batcher::LedgerWriter;
pub use batcher::{LedgerError, LedgerSink};
pub use buffer::LedgerBuffer;
pub use capture::{LedgerRows, LedgerScope};
pub use query::{SpendQuery, SpendReader};
pub use start::start;

/// How the reservation of a row ended (the settlement's outcome).
pub use crate::settlement::Outcome as SpendOutcome;

/// One ledger row: a settled or voided reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendRow {
    /// The reservation id (the primary key), made by the gateway.
    pub reservation_id: String,
    /// The request id the client saw (`x-request-id`, `request-id` on
    /// Messages): the client's own when it sent a usable one, so not
    /// unique across tenants. Empty on rows written before migration 0101.
    pub request_id: String,
    /// Which reservation of its request this is: 1, then 2, … for each
    /// retry on another deployment (0 on rows written before migration 0101).
    pub attempt: u32,
    /// When the settlement was applied, UTC µs.
    pub at_micros: u64,
    /// The request's tenant.
    pub tenant: Arc<str>,
    /// Its ancestors, nearest first (at most four levels in all).
    pub ancestors: Arc<[Arc<str>]>,
    /// The key id (the name of its `key:` scope, never the key).
    pub key_id: Arc<str>,
    /// The keyed hash of the end user's id, when the request named one.
    pub end_user: Option<Arc<str>>,
    /// The public model name.
    pub model: Arc<str>,
    /// The deployment the reservation was admitted on.
    pub deployment: Arc<str>,
    /// The API surface (`chat`, `completions`, `embeddings`, `responses`, `messages`).
    pub dialect: &'static str,
    /// Input tokens not read from a cache.
    pub input_tokens: u64,
    /// Input tokens read from the provider's cache.
    pub cached_read_tokens: u64,
    /// Input tokens written to the provider's cache.
    pub cache_write_tokens: u64,
    /// Output tokens (reasoning included).
    pub output_tokens: u64,
    /// Reasoning tokens (a part of `output_tokens`).
    pub reasoning_tokens: u64,
    /// Tokens the settlement charged the token budgets.
    pub charged_tokens: u64,
    /// The settled cost, µ$ (0 when the deployment has no price).
    pub cost_micros: u64,
    /// How the reservation ended.
    pub outcome: SpendOutcome,
    /// The version of the policy whose prices the cost was computed at.
    pub price_version: Arc<str>,
    /// The layer that admitted the reservation: `store`, `lease` or
    /// `local_limiter` (a `fail_open` tenant's request while the store
    /// failed, whose spend never reached the store's counters); empty on
    /// rows written before migration 0102.
    pub decided_by: &'static str,
    /// The run the request belonged to (`x-budgetgate-run`), when it named
    /// one (`None` too on rows written before migration 0103).
    pub run_id: Option<Arc<str>>,
}

impl SpendRow {
    /// The tenant, then its ancestors: every level the row's spend counts for.
    pub fn levels(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.tenant).chain(self.ancestors.iter().map(|a| &**a))
    }
}

/// Where settled reservations' rows go, as the request path sees it: the
/// ledger's buffer and the clock that stamps rows. Unset in
/// [`crate::gateway::AppState`] while the ledger is off.
pub struct Ledger {
    buffer: Arc<LedgerBuffer>,
    clock: Arc<dyn crate::clock::Clock>,
    /// The previous run of this gateway, when it crashed ([`crash`]).
    previous_crash: Option<crash::Crash>,
}

impl Ledger {
    /// A ledger recording into `buffer`, stamping rows with `clock`.
    pub fn new(buffer: Arc<LedgerBuffer>, clock: Arc<dyn crate::clock::Clock>) -> Self {
        Self {
            buffer,
            clock,
            previous_crash: None,
        }
    }

    /// This ledger, knowing that the previous run crashed (`crash`).
    pub fn after_crash(mut self, crash: Option<crash::Crash>) -> Self {
        self.previous_crash = crash;
        self
    }

    /// The previous run's crash, found at start.
    pub fn previous_crash(&self) -> Option<crash::Crash> {
        self.previous_crash
    }

    /// The buffer rows wait in (always there: a ledger is set only
    /// while it is on).
    pub fn buffer(&self) -> Option<&Arc<LedgerBuffer>> {
        Some(&self.buffer)
    }

    /// Now, UTC µs, from the gateway's clock.
    pub fn now_micros(&self) -> u64 {
        self.clock.now_micros()
    }
}
