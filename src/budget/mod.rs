//! The budget model and the stores that enforce it (DESIGN sections 2 and 3).
//!
//! This module knows nothing of HTTP. A request handler turns policy into a
//! [`ReserveRequest`] (one [`BudgetSpec`] per budget the request touches),
//! calls [`BudgetStore::reserve`] once, and later settles by reservation id.
//!
//! - [`bucket`]: token-bucket arithmetic in exact integer units.
//! - [`calendar`]: UTC day/month quota windows.
//! - [`rolling`]: rolling 5-hour, 24-hour and weekly quota windows.
//! - [`keys`]: the one pure function that names stored keys.
//! - [`placement`]: which domain (hash tag) a scope's keys live in.
//! - [`quota_lease`]: the store calls of quota leases ([`quota_lease::LeaseStore`]).
//! - [`memory`]: the in-process store.
//! - [`guarded`]: timeout, metrics and circuit breaker around a store.
//! - [`metrics`]: the stores' own metrics (store calls, batches, debt).
//! - [`deny_cache`]: local refusals for budgets known to be empty.
//! - [`redis`]: the Redis store (Lua scripts in `lua/`), for a fleet of gateways.
//! - [`share`]: fleet-wide weighted shares of a contended deployment.
//! - `amounts`: what a call asks of each budget ([`Costs`], [`Step`],
//!   [`Actual`]) and who asks ([`Requester`]).

mod amounts;
pub mod bucket;
pub mod calendar;
pub mod deny_cache;
pub mod guarded;
pub mod keys;
pub mod memory;
pub mod metrics;
pub mod parts;
pub mod placement;
pub mod quota_lease;
pub mod records;
pub mod redis;
pub mod rolling;
pub mod share;

pub use amounts::{Actual, Costs, Requester, Step, MAX_AMOUNT, MAX_COUNT, MAX_RATE, RATE_ONE};

use async_trait::async_trait;
use serde::Serialize;

pub use calendar::Window;

use std::sync::Arc;

/// Who shares a budget. Names are shared strings (`Arc<str>`): a scope is
/// cloned into every budget state and hold a request produces, and a clone
/// is then a reference count, not an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum Scope {
    /// Every request of a tenant: `tenant:<t>`.
    Tenant(Arc<str>),
    /// One API key of a tenant: `key:<t>/<key id>`.
    Key(Arc<str>, Arc<str>),
    /// A tenant's use of one public model: `tenant_model:<t>/<model>`.
    TenantModel(Arc<str>, Arc<str>),
    /// One upstream deployment, shared by all tenants: `upstream:<deployment>`.
    Upstream(Arc<str>),
    /// One end user of a tenant, by the keyed hash of its id (32 hex
    /// digits, `config::end_user`): `end_user:<t>/<hash>`.
    EndUser(Arc<str>, Arc<str>),
    /// One run of a tenant, named by the caller (`x-budgetgate-run`,
    /// `[A-Za-z0-9._:-]`, at most 128 bytes): `run:<t>/<run id>`.
    Run(Arc<str>, Arc<str>),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Tenant(t) => write!(f, "tenant:{t}"),
            Scope::Key(t, k) => write!(f, "key:{t}/{k}"),
            Scope::TenantModel(t, m) => write!(f, "tenant_model:{t}/{m}"),
            Scope::Upstream(u) => write!(f, "upstream:{u}"),
            Scope::EndUser(t, h) => write!(f, "end_user:{t}/{h}"),
            Scope::Run(t, r) => write!(f, "run:{t}/{r}"),
        }
    }
}

impl Scope {
    /// True for `upstream:` scopes.
    pub fn is_upstream(&self) -> bool {
        matches!(self, Scope::Upstream(_))
    }
}

/// Which limit of a scope a budget enforces. Its serde spelling is its
/// config spelling ([`BudgetName::as_str`]), also how stored holds name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetName {
    /// Requests per minute (token bucket, 1 per request).
    Rpm,
    /// Tokens per minute, input + output (token bucket).
    Tpm,
    /// Input tokens per minute (token bucket): the input alone, as
    /// Anthropic's ITPM; extensions of the output never touch it.
    InputTpm,
    /// Output tokens per minute (token bucket): the output alone (reasoning
    /// included), as Anthropic's OTPM.
    OutputTpm,
    /// Requests in flight (slots under a slot lease).
    MaxConcurrent,
    /// Tokens per UTC day (calendar quota).
    TokensPerDay,
    /// Tokens per UTC month (calendar quota).
    TokensPerMonth,
    /// Requests per UTC day (calendar quota).
    RequestsPerDay,
    /// Micro-dollars per UTC day (calendar quota in µ$, `crate::money`).
    UsdPerDay,
    /// Micro-dollars per UTC month (calendar quota in µ$).
    UsdPerMonth,
    /// Tokens in the last 5 hours (rolling quota, [`rolling`]).
    #[serde(rename = "tokens_per_5h")]
    TokensPer5h,
    /// Tokens in the last 24 hours (rolling quota).
    #[serde(rename = "tokens_per_24h")]
    TokensPer24h,
    /// Tokens in the last 7 days (rolling quota).
    TokensPerWeek,
    /// Micro-dollars in the last 5 hours (rolling quota in µ$).
    #[serde(rename = "usd_per_5h")]
    UsdPer5h,
    /// Micro-dollars in the last 24 hours (rolling quota in µ$).
    #[serde(rename = "usd_per_24h")]
    UsdPer24h,
    /// Micro-dollars in the last 7 days (rolling quota in µ$).
    UsdPerWeek,
    /// Requests in the last 5 hours (rolling quota; run budgets).
    #[serde(rename = "requests_per_5h")]
    RequestsPer5h,
    /// Requests in the last 24 hours (rolling quota; run budgets).
    #[serde(rename = "requests_per_24h")]
    RequestsPer24h,
    /// Requests in the last 7 days (rolling quota; run budgets).
    RequestsPerWeek,
    /// Runs a key starts per UTC day (calendar quota, counted by the run
    /// record of a reservation, never held: `runs_per_day`).
    RunsPerDay,
}

impl BudgetName {
    /// Config spelling, e.g. `tpm`.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetName::Rpm => "rpm",
            BudgetName::Tpm => "tpm",
            BudgetName::InputTpm => "input_tpm",
            BudgetName::OutputTpm => "output_tpm",
            BudgetName::MaxConcurrent => "max_concurrent",
            BudgetName::TokensPerDay => "tokens_per_day",
            BudgetName::TokensPerMonth => "tokens_per_month",
            BudgetName::RequestsPerDay => "requests_per_day",
            BudgetName::UsdPerDay => "usd_per_day",
            BudgetName::UsdPerMonth => "usd_per_month",
            BudgetName::TokensPer5h => "tokens_per_5h",
            BudgetName::TokensPer24h => "tokens_per_24h",
            BudgetName::TokensPerWeek => "tokens_per_week",
            BudgetName::UsdPer5h => "usd_per_5h",
            BudgetName::UsdPer24h => "usd_per_24h",
            BudgetName::UsdPerWeek => "usd_per_week",
            BudgetName::RequestsPer5h => "requests_per_5h",
            BudgetName::RequestsPer24h => "requests_per_24h",
            BudgetName::RequestsPerWeek => "requests_per_week",
            BudgetName::RunsPerDay => "runs_per_day",
        }
    }

    /// True when the budget counts micro-dollars (a price times the
    /// tokens; always refunded to the actual cost at settle).
    pub fn counts_usd(self) -> bool {
        matches!(
            self,
            BudgetName::UsdPerDay
                | BudgetName::UsdPerMonth
                | BudgetName::UsdPer5h
                | BudgetName::UsdPer24h
                | BudgetName::UsdPerWeek
        )
    }

    /// Parses [`BudgetName::as_str`]'s spelling.
    pub fn parse(name: &str) -> Option<Self> {
        serde::Deserialize::deserialize(
            serde::de::value::StrDeserializer::<serde::de::value::Error>::new(name),
        )
        .ok()
    }

    /// True when the budget counts requests (one per request, or a slot):
    /// stores change it only by a void settle. Every other budget counts an
    /// amount (tokens, µ$) that settlement refunds or charges.
    pub fn counts_requests(self) -> bool {
        matches!(
            self,
            BudgetName::Rpm
                | BudgetName::RequestsPerDay
                | BudgetName::MaxConcurrent
                | BudgetName::RequestsPer5h
                | BudgetName::RequestsPer24h
                | BudgetName::RequestsPerWeek
                | BudgetName::RunsPerDay
        )
    }

    /// True when the budget counts tokens (and is refunded/charged at settle).
    pub fn counts_tokens(self) -> bool {
        matches!(
            self,
            BudgetName::Tpm
                | BudgetName::InputTpm
                | BudgetName::OutputTpm
                | BudgetName::TokensPerDay
                | BudgetName::TokensPerMonth
                | BudgetName::TokensPer5h
                | BudgetName::TokensPer24h
                | BudgetName::TokensPerWeek
        )
    }

    /// True for the rolling quotas (`tokens_per_5h` … `usd_per_week`).
    pub fn is_rolling(self) -> bool {
        matches!(
            self,
            BudgetName::TokensPer5h
                | BudgetName::TokensPer24h
                | BudgetName::TokensPerWeek
                | BudgetName::UsdPer5h
                | BudgetName::UsdPer24h
                | BudgetName::UsdPerWeek
                | BudgetName::RequestsPer5h
                | BudgetName::RequestsPer24h
                | BudgetName::RequestsPerWeek
        )
    }

    /// True for the per-minute token buckets (`tpm`, `input_tpm`,
    /// `output_tpm`).
    pub fn is_token_rate(self) -> bool {
        matches!(
            self,
            BudgetName::Tpm | BudgetName::InputTpm | BudgetName::OutputTpm
        )
    }
}

impl std::fmt::Display for BudgetName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a budget is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BudgetKind {
    /// Token bucket: capacity `burst`, refilled continuously at `per_minute / 60` per second.
    Bucket {
        /// Refill, tokens (or requests) per minute.
        per_minute: u64,
        /// Capacity, tokens (or requests).
        burst: u64,
    },
    /// Calendar-window counter, reset at the UTC boundary; or, for a
    /// rolling window ([`Window::is_rolling`]), a counter over sub-buckets
    /// ([`rolling`]).
    Quota {
        /// Tokens (or requests) per window.
        limit: u64,
        /// Window length.
        window: Window,
    },
    /// Slots under a slot lease.
    Concurrency {
        /// Slots.
        max: u64,
    },
}

/// One budget a request touches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetSpec {
    /// Who shares it.
    pub scope: Scope,
    /// Which limit.
    pub name: BudgetName,
    /// Its parameters under the current policy.
    pub kind: BudgetKind,
    /// Stored key name (from [`keys::KeySpace::budget`]).
    pub key: Arc<str>,
    /// Whether unused reserved tokens go back at settle (false for upstreams
    /// that count the output cap at request time, DESIGN section 1.8).
    pub refund_unused: bool,
    /// Shadow budget: evaluated in the same call and debited when it admits,
    /// but a refusal is only reported (as [`Admission::would_deny`]), never enforced.
    pub shadow: bool,
}

impl BudgetSpec {
    /// Amount one request of `tokens` debits from this budget at reserve.
    pub fn cost(&self, tokens: u64) -> u64 {
        match self.name.counts_requests() {
            true => 1,
            false => tokens,
        }
    }

    /// Capacity in the budget's unit: burst, quota limit or slots.
    pub fn capacity(&self) -> u64 {
        match self.kind {
            BudgetKind::Bucket { burst, .. } => burst,
            BudgetKind::Quota { limit, .. } => limit,
            BudgetKind::Concurrency { max } => max,
        }
    }

    /// The per-minute or per-window limit shown to clients.
    pub fn limit(&self) -> u64 {
        match self.kind {
            BudgetKind::Bucket { per_minute, .. } => per_minute,
            BudgetKind::Quota { limit, .. } => limit,
            BudgetKind::Concurrency { max } => max,
        }
    }
}

/// What a reservation of a run ([`Scope::Run`]) asks of the run's record,
/// in the same atomic call as its budgets: the record is set to `limits`
/// when absent (the run starts: counted on `starts` when set, refused
/// beyond it) and compared otherwise (another value: nothing is written,
/// [`ReserveOutcome::RunConflict`]). Only an admission writes it, and
/// every admission keeps it another `ttl_micros`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// The run.
    pub scope: Scope,
    /// Where its record is stored ([`keys::KeySpace::run_record`]).
    pub key: Arc<str>,
    /// Its tenant's index of active runs by spend
    /// ([`keys::KeySpace::run_index`]): every admission adds its tokens.
    pub index: Arc<str>,
    /// What the run started with, as one word without spaces: its limits
    /// and its end user (`lifecycle::run`).
    pub limits: Arc<str>,
    /// How long the record lives after the run's last admission, µs.
    pub ttl_micros: u64,
    /// The key's `runs_per_day` (a calendar-day quota of requests, scope
    /// `key:`), counted when the run starts; `None`: not bounded.
    pub starts: Option<BudgetSpec>,
}

/// Runs a tenant's index of active runs keeps ([`BudgetStore::runs_of`]):
/// the ones with the most tokens reserved; an admission that would make
/// more drops the least.
pub const RUN_INDEX_MAX: usize = 100;

/// One active run of a tenant as its index lists it ([`BudgetStore::runs_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRun {
    /// The run id.
    pub id: Arc<str>,
    /// Tokens reserved by the run's admitted requests since it started
    /// (the admissions' estimates: settlement's refunds are not taken off).
    pub spent: u64,
    /// Its record's limits word ([`RunRecord::limits`]).
    pub limits: Arc<str>,
}

/// One reservation attempt.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    /// Gateway-generated reservation id (also the hold's name).
    pub id: String,
    /// What the reservation costs each budget.
    pub costs: Costs,
    /// Budgets every candidate shares (tenant, key, tenant×model).
    pub common: Vec<BudgetSpec>,
    /// Upstream deployments in preference order, each with its own budgets;
    /// the first whose budgets admit (together with `common`) is chosen.
    /// Must hold at least one entry (which may be empty).
    pub candidates: Vec<Vec<BudgetSpec>>,
    /// Slot lease: how long a concurrency slot is held without renewal, µs.
    pub slot_lease_micros: u64,
    /// How long the hold lives, microseconds (max request duration + settle-retry window).
    pub hold_ttl_micros: u64,
    /// Who asks: read by the gateway's store wrappers (deny cache, failure
    /// policy), ignored by the stores.
    pub requester: Arc<Requester>,
    /// The tenant's claim to a weighted share of a contended deployment
    /// ([`share`]); `None`: the stores decide by the budgets alone.
    pub share: Option<share::ShareClaim>,
}

/// A budget's state as seen by one decision, in its own unit (tokens or requests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetState {
    /// Who shares it.
    pub scope: Scope,
    /// Which limit.
    pub name: BudgetName,
    /// Per-minute (buckets) or per-window (quotas) limit, or slots.
    pub limit: u64,
    /// Whole units available now (floor; negative while in debt).
    pub remaining: i64,
    /// Microseconds until full (buckets), until the window resets (calendar
    /// quotas) or until every unit has slid out (rolling quotas); 0 for
    /// concurrency.
    pub reset_micros: u64,
    /// Window, for quotas.
    pub window: Option<Window>,
}

/// The oldest units of a rolling window still counted: they slide out
/// together, at the end of their sub-bucket's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Slide {
    /// Microseconds from the read until they slide out.
    pub in_micros: u64,
    /// How many (in the budget's unit).
    pub units: u64,
}

/// The holds in flight on one budget (the "why was this refused?"
/// record, `crate::gateway::recent_refusals`): read only after a refusal,
/// never on the admission path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeldOn {
    /// Live (unsettled) holds debiting the budget.
    pub holds: u64,
    /// What they hold, in the budget's unit (0 for concurrency: a hold
    /// takes one slot).
    pub units: u64,
    /// The largest of them, as `(reservation id, units)`, largest first,
    /// at most [`HELD_ON_LISTED`].
    pub largest: Vec<(String, u64)>,
    /// True when the store stopped reading before it had seen every hold
    /// ([`HELD_ON_SCAN_MAX`]): the figures are then a lower bound.
    pub partial: bool,
}

/// Holds named per budget in [`HeldOn::largest`].
pub const HELD_ON_LISTED: usize = 10;
/// Hold records a store reads for one [`BudgetStore::holds_on`] call at most.
pub const HELD_ON_SCAN_MAX: usize = 20_000;

impl HeldOn {
    /// Counts a hold of `units` by `id`.
    pub fn add(&mut self, id: &str, units: u64) {
        self.holds += 1;
        self.units = self.units.saturating_add(units);
        self.largest.push((id.to_string(), units));
        self.largest
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        self.largest.truncate(HELD_ON_LISTED);
    }
}

/// A successful reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Admission {
    /// Store time of the decision, UTC µs.
    pub now_micros: u64,
    /// Index into [`ReserveRequest::candidates`] of the chosen deployment.
    pub candidate: usize,
    /// State of every touched bucket and quota after the debit.
    pub budgets: Vec<BudgetState>,
    /// True when this id was already admitted and the first result is returned again.
    pub replayed: bool,
    /// Shadow budgets that would have refused (not debited).
    pub would_deny: Vec<WouldDeny>,
}

/// A shadow budget that would have refused this request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WouldDeny {
    /// Who would have refused.
    pub scope: Scope,
    /// Which limit.
    pub name: BudgetName,
}

/// A refusal that may succeed later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    /// Who refused.
    pub scope: Scope,
    /// Which limit refused.
    pub name: BudgetName,
    /// Per-minute or per-window limit (or slots).
    pub limit: u64,
    /// What this request asked of it.
    pub requested: u64,
    /// What it had (floor; negative in debt).
    pub available: i64,
    /// Microseconds until the request would fit (buckets: exact ceiling;
    /// calendar quotas: until the window resets; rolling quotas: until
    /// enough has slid out; concurrency: 0 — the caller applies its hint).
    pub retry_after_micros: u64,
    /// Store time, UTC µs.
    pub now_micros: u64,
    /// State of the refusing budget.
    pub state: BudgetState,
    /// The budgets would have admitted it, but the deployment's capacity
    /// goes to a tenant behind it in its weighted share ([`share`]).
    pub held_for_share: bool,
}

/// A refusal that can never succeed: larger than the budget's capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Impossibility {
    /// Who refused.
    pub scope: Scope,
    /// Which limit refused.
    pub name: BudgetName,
    /// Capacity (burst or quota limit).
    pub capacity: u64,
    /// What this request asked.
    pub requested: u64,
}

/// Result of [`BudgetStore::reserve`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ReserveOutcome {
    /// Every budget was debited and a hold recorded.
    Admitted(Admission),
    /// Nothing changed; retry later.
    Denied(Denial),
    /// Nothing changed; never retry.
    Impossible(Impossibility),
    /// This id was voided ([`BudgetStore::void`]) before or after it was
    /// reserved: nothing was written, and the id is never admitted (a
    /// reservation whose reply was lost and compensated, arriving late).
    Voided,
    /// The run ([`Requester::run`]) was started with other limits (or by
    /// another end user): nothing was written; the scope names the run.
    RunConflict(Scope),
}

/// Result of [`BudgetStore::extend`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ExtendOutcome {
    /// `granted` tokens (1 ..= requested) were debited from every token budget of the hold.
    Extended {
        /// Tokens granted.
        granted: u64,
        /// Store time, UTC µs.
        now_micros: u64,
    },
    /// No budget can give even one token now.
    Exhausted(Denial),
    /// No such hold.
    Unknown,
    /// The hold was settled already.
    AlreadySettled,
}

/// Result of [`BudgetStore::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RenewOutcome {
    /// The slot lease now ends at `slot_lease_until_micros`.
    Renewed {
        /// New slot lease end, UTC µs.
        slot_lease_until_micros: u64,
    },
    /// No such hold.
    Unknown,
    /// The hold was settled already.
    AlreadySettled,
}

/// What to settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// Tokens actually used (input + output): what the settlement reports
    /// (refunded, debt), and every amount budget's actual under
    /// [`Actual::Tokens`].
    pub actual_tokens: u64,
    /// The upstream never accepted the work (connect error, 5xx, 429 before
    /// output): refund upstream budgets too, even where `refund_unused` is false.
    pub upstream_failed: bool,
    /// The amount per budget, or `Void`.
    pub actual: Actual,
}

/// Result of [`BudgetStore::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SettleOutcome {
    /// Applied now.
    Settled {
        /// Tokens reserved in all (initial + extensions).
        reserved: u64,
        /// Tokens returned to refundable budgets (reserved − actual, when positive).
        refunded: u64,
        /// Tokens charged beyond the reservation (actual − reserved, when positive).
        debt: u64,
        /// Store time, UTC µs.
        now_micros: u64,
    },
    /// A settle of this id was applied before; nothing changed.
    AlreadySettled,
    /// No hold with this id (never reserved, or expired); nothing changed.
    Unknown,
    /// [`BudgetStore::void`] of an id with no hold: a void tombstone now
    /// stands for it, so a reserve of the id arriving later writes nothing
    /// and answers [`ReserveOutcome::Voided`].
    Voided,
}

/// A store failure (timeout, connection, script error). The failure policy
/// decides what the request gets.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The call did not finish within the configured timeout.
    #[error("budget store timed out")]
    Timeout,
    /// The store could not be reached or answered with an error.
    #[error("budget store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something this version does not understand.
    #[error("budget store protocol error: {0}")]
    Protocol(String),
    /// The call provably never reached the store (no connection, calls
    /// paused after failures, expired while queued): nothing was applied,
    /// so nothing needs compensating (DESIGN section 13).
    #[error("budget store call not sent: {0}")]
    NotSent(String),
}

/// The one interface to budget state. Implementations: [`memory::MemoryStore`]
/// and the Redis store; both pass the same conformance suite.
///
/// Every operation is idempotent by reservation id: a retried reserve returns
/// the first admission, a retried settle changes nothing.
#[async_trait]
pub trait BudgetStore: Send + Sync + 'static {
    /// Reserves `req.costs` atomically across `req.common` and the first
    /// admitting candidate, all-or-nothing.
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError>;
    /// Debits up to `step` more from every token budget of the hold: all
    /// of it when every budget admits, else the largest amount all admit (≥ 1).
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError>;
    /// Renews the hold's slot leases for another slot lease period.
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError>;
    /// Settles the hold once: refunds or charges debt, frees slots.
    async fn settle(&self, id: &str, settlement: &Settlement) -> Result<SettleOutcome, StoreError>;
    /// Settle mode `void` (DESIGN section 13): refunds every token and
    /// request budget of the hold (refundable or not) and frees its slots
    /// (→ `Settled` with everything refunded). For an id with no hold it
    /// writes a void tombstone living `hold_ttl_micros` (as long as the
    /// hold would have), so a reserve of the id that arrives later writes
    /// nothing and answers [`ReserveOutcome::Voided`] (→ `Voided`). A hold
    /// or tombstone already settled or voided: `AlreadySettled`. With
    /// `hold_ttl_micros` 0 no tombstone is written (`Unknown`): a settle of
    /// `Actual::Void` is this, for a hold the request knows exists.
    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError>;
    /// Reads budgets without changing them (admin API, tests).
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError>;
    /// The live holds debiting each of `specs` (by key), read without
    /// changing anything: after a refusal, for its record, and by
    /// reconciliation. Stores keep no per-budget sum of holds (that would
    /// cost every admission): this walks the holds, bounded by
    /// [`HELD_ON_SCAN_MAX`]. The default answers that the store cannot.
    async fn holds_on(&self, specs: &[BudgetSpec]) -> Result<Vec<HeldOn>, StoreError> {
        let _ = specs;
        Err(StoreError::Unavailable(
            "this store does not list its holds".into(),
        ))
    }
    /// The next units to slide out of each rolling window of `specs`
    /// (`None` for the other budgets and for an empty window), read without
    /// changing anything: the admin API's budget list. The default answers
    /// `None` for every budget (a store without rolling windows).
    async fn slides(&self, specs: &[BudgetSpec]) -> Result<Vec<Option<Slide>>, StoreError> {
        Ok(vec![None; specs.len()])
    }
    /// The live runs of `tenant` with the most tokens reserved, at most
    /// `n`, most first (ties: the greater id first), read from the
    /// tenant's run index (at most [`RUN_INDEX_MAX`] runs) and their
    /// records without changing anything. A run whose record has expired
    /// is not listed. The default answers that the store cannot.
    async fn runs_of(
        &self,
        ks: &keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Result<Vec<ListedRun>, StoreError> {
        let _ = (ks, tenant, n);
        Err(StoreError::Unavailable(
            "this store does not list its runs".into(),
        ))
    }
    /// Lowers a token bucket (never raises it) so that at most `at_most`
    /// whole units remain now: the gateway follows a provider's own
    /// `x-ratelimit-remaining-*` view of a deployment. Returns the whole
    /// units remaining afterwards. Non-bucket specs are left alone.
    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError>;
    /// True when every call of this store already ends by its own timeout
    /// (with [`StoreError::Timeout`]), so a wrapper need not add a timer of
    /// its own. Default `false`.
    fn times_out_calls(&self) -> bool {
        false
    }
    /// The budget domain a reservation's first call goes to, as a number:
    /// `0` for the store's own domain, and for every call of a store whose
    /// domains cannot fail apart (the default: one Redis, the memory
    /// store). A wrapper keys its turns and breaker by it
    /// ([`guarded::GuardedStore`]), so calls waiting on a primary that
    /// fails over hold only their own domains' turns.
    fn domain_of_reservation(&self, req: &ReserveRequest) -> u64 {
        let _ = req;
        0
    }
    /// [`Self::domain_of_reservation`] for the extension, renewal,
    /// settlement and void of reservation `id`: its first hold's domain.
    fn domain_of_hold(&self, id: &str) -> u64 {
        let _ = id;
        0
    }
    /// [`Self::domain_of_reservation`] for a call on one budget.
    fn domain_of_budget(&self, spec: &BudgetSpec) -> u64 {
        let _ = spec;
        0
    }
}
