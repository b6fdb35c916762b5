//! The spend ledger (issue 29, point 4): one row per settlement and per
//! void of a held reservation, for finance queries the Prometheus counters
//! cannot answer (per user, per model, last month).
//!
//! - [`capture`]: what a reservation knows of its row from admission on
//!   ([`LedgerDraft`]), completed into a [`SpendRow`] when the store has
//!   applied the settlement.
//! - [`buffer`]: the bounded in-memory buffer rows wait in; recording never
//!   blocks a request, a full buffer drops the row and counts it.
//! - [`batcher`]: the writer task that moves the buffer to a [`LedgerSink`]
//!   in batches, off the request path, retrying while the sink is down,
//!   and prunes rows past the retention.
//! - [`sql`]: the sink and the queries over the control database.
//! - [`cli`]: `budgetgate spend`, the queries over HTTP.
//! - `start`: the ledger's wiring in `serve` ([`start()`]).
//! - [`query`]: spend grouped by tenant, key, model, end user and day or
//!   month; top N; CSV.
//!
//! Guarantees (docs/LEDGER.md): rows are idempotent by reservation id (the
//! primary key; a retried settlement writes one row); a crash loses at
//! most the rows still buffered, i.e. at most one batch interval of
//! settlements (plus what the sink's outage kept buffered).

pub mod batcher;
pub mod buffer;
pub mod capture;
pub mod cli;
pub mod query;
pub mod sql;
mod start;

use std::sync::Arc;

pub use batcher::{LedgerError, LedgerSink};
pub use batcher::{LedgerSettings, LedgerWriter};
pub use buffer::LedgerBuffer;
pub use capture::{LedgerCapture, LedgerDraft, LedgerScope};
pub use query::{SpendQuery, SpendReader};
pub use start::start;

/// How the reservation of a row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendOutcome {
    /// The upstream answered (a whole answer, or a stream that completed).
    Answered,
    /// A stream cut off by the gateway (budget, time limit, cap, shutdown)
    /// or ended by the client going away; what was delivered is charged.
    CutOff,
    /// The upstream failed (before any output: refunded; mid-stream: what
    /// was delivered is charged).
    UpstreamFailed,
    /// The request never reached the upstream: every budget refunded.
    Voided,
    /// The reservation was dropped unsettled (its handler cancelled before
    /// an answer was read): charged whole, the drop backstop.
    Abandoned,
    /// The store never confirmed the settlement within its retry window
    /// (a reply lost, the store down): either it applied (the row's
    /// figures were charged) or the hold expires charged whole.
    Unknown,
}

impl SpendOutcome {
    /// The column's value.
    pub const fn as_str(self) -> &'static str {
        match self {
            SpendOutcome::Answered => "answered",
            SpendOutcome::CutOff => "cut_off",
            SpendOutcome::UpstreamFailed => "upstream_failed",
            SpendOutcome::Voided => "voided",
            SpendOutcome::Abandoned => "abandoned",
            SpendOutcome::Unknown => "unknown",
        }
    }

    /// The outcome a column value names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "answered" => SpendOutcome::Answered,
            "cut_off" => SpendOutcome::CutOff,
            "upstream_failed" => SpendOutcome::UpstreamFailed,
            "voided" => SpendOutcome::Voided,
            "abandoned" => SpendOutcome::Abandoned,
            "unknown" => SpendOutcome::Unknown,
            _ => return None,
        })
    }
}

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
}

impl SpendRow {
    /// The tenant, then its ancestors: every level the row's spend counts for.
    pub fn levels(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.tenant).chain(self.ancestors.iter().map(|a| &**a))
    }
}

/// Where settled reservations go, as the request path sees it: the
/// ledger's buffer, the exporter of request spans (each when it is on),
/// and the clock that stamps rows. `None` in [`crate::gateway::AppState`]
/// when both are off: no row is then even drafted.
pub struct Ledger {
    buffer: Option<Arc<LedgerBuffer>>,
    spans: Option<Arc<crate::telemetry::Spans>>,
    clock: Arc<dyn crate::clock::Clock>,
}

impl Ledger {
    /// A ledger recording into `buffer`, stamping rows with `clock`.
    pub fn new(buffer: Arc<LedgerBuffer>, clock: Arc<dyn crate::clock::Clock>) -> Self {
        Self {
            buffer: Some(buffer),
            spans: None,
            clock,
        }
    }

    /// Rows go to `buffer` (the ledger is on) and their spans to `spans`
    /// (telemetry is on).
    pub fn with(
        buffer: Option<Arc<LedgerBuffer>>,
        spans: Option<Arc<crate::telemetry::Spans>>,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Self {
        Self {
            buffer,
            spans,
            clock,
        }
    }

    /// The buffer rows wait in, while the ledger is on.
    pub fn buffer(&self) -> Option<&Arc<LedgerBuffer>> {
        self.buffer.as_ref()
    }

    /// The exporter of request spans, while telemetry is on.
    pub fn spans(&self) -> Option<&crate::telemetry::Spans> {
        self.spans.as_deref()
    }

    /// The exporter of request spans, shared, while telemetry is on.
    pub fn spans_arc(&self) -> Option<&Arc<crate::telemetry::Spans>> {
        self.spans.as_ref()
    }

    /// Now, UTC µs, from the gateway's clock.
    pub fn now_micros(&self) -> u64 {
        self.clock.now_micros()
    }
}
