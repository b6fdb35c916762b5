//! What a settlement is about: the hold's tenant, the deny-cache entries a
//! refund clears, the budgets whose capacity comes back, and who, what and
//! where for the spend ledger and the request spans. Built once at
//! admission ([`Subject`]) and carried by the hold without being looked
//! into; each observer reads its part of it.

use std::sync::Arc;

use axum::http::HeaderValue;

use crate::budget::deny_cache::DenyCache;
use crate::budget::BudgetSpec;
use crate::dialects::Dialect;

/// A tenant's settlement counters (the tenant metrics implement it).
pub trait Tally: Send + Sync {
    /// A settlement of a hold that reserved `estimated` tokens and used `actual`.
    fn settled(&self, estimated: u64, actual: u64);
    /// A settlement's cost at its deployment's prices, µ$.
    fn spent(&self, micros: u64);
}

/// The budgets a settlement returns capacity to (the wait queue's wake-up).
pub trait Returned: Send + Sync {
    /// Calls `key` with the key of every budget a settlement that refunded
    /// `refunded` tokens gave capacity back to (its slots are free in any case).
    fn each(&self, refunded: u64, key: &mut dyn FnMut(&str));
}

/// The local deny-cache entries a refund must clear: the refundable token
/// budgets of a tenant's budget plan. Built once per plan.
pub struct DenyRelease {
    /// The gateway's deny cache.
    pub cache: Arc<DenyCache>,
    /// Budget keys of the plan's refundable, token-counting tenant budgets.
    pub keys: Vec<String>,
}

impl DenyRelease {
    /// The release of `specs`' entries in `cache`.
    pub fn of(cache: Arc<DenyCache>, specs: &[BudgetSpec]) -> Self {
        let mut r = DenyRelease {
            cache,
            keys: Vec::new(),
        };
        r.keys.extend(Self::released(specs));
        r
    }

    /// This release and that of `more` (a request's end-user budgets).
    pub fn with(&self, more: &[BudgetSpec]) -> Self {
        let mut keys = self.keys.clone();
        keys.extend(Self::released(more));
        DenyRelease {
            cache: self.cache.clone(),
            keys,
        }
    }

    /// Keys of the budgets among `specs` a settlement may refund:
    /// refundable token budgets, and dollar budgets (always refunded to
    /// the actual cost).
    fn released(specs: &[BudgetSpec]) -> impl Iterator<Item = String> + '_ {
        specs
            .iter()
            .filter(|s| s.refund_unused && s.name.counts_tokens() || s.name.counts_usd())
            .map(|s| s.key.to_string())
    }
}

/// What a settlement is about, each part for the observer that reads it;
/// a part left `None` is one no observer acts on for this hold.
#[derive(Default)]
pub struct Subject {
    /// The tenant's settlement counters.
    pub tenant: Option<Arc<dyn Tally>>,
    /// The deny-cache entries a refund clears.
    pub release: Option<Arc<DenyRelease>>,
    /// The budgets whose capacity comes back (only when the gateway queues).
    pub returned: Option<Arc<dyn Returned>>,
    /// Who, what and where, while the ledger or the request spans are on.
    pub who: Option<Box<Who>>,
    /// What the hold keeps until its settlement is applied and every
    /// observer has run, then drops: an expected-output hold's exposure
    /// (`admission::exposure`), given back exactly once on every path
    /// (settlement, refund, void, drop backstop).
    pub until_settled: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// What every reservation of one budget plan (tenant, key, model, policy)
/// shares in its ledger row and its span; built once per plan.
#[derive(Debug)]
pub struct Scope {
    /// The tenant.
    pub tenant: Arc<str>,
    /// Its ancestors, nearest first.
    pub ancestors: Arc<[Arc<str>]>,
    /// The key id.
    pub key_id: Arc<str>,
    /// The public model.
    pub model: Arc<str>,
    /// The policy version (the prices are the policy's).
    pub price_version: Arc<str>,
    /// Names of the plan's deployments, in the plan's order.
    pub deployments: Vec<Arc<str>>,
    /// The `gen_ai.provider.name` of each deployment (request spans).
    pub providers: Vec<&'static str>,
    /// The model name sent upstream (request spans).
    pub upstream_model: Arc<str>,
}

/// Who, what and where of one reservation, fixed at admission.
#[derive(Debug, Clone)]
pub struct Who {
    /// What the plan's reservations share.
    pub scope: Arc<Scope>,
    /// The deployment admitted on.
    pub deployment: Arc<str>,
    /// Its `gen_ai.provider.name`.
    pub provider: &'static str,
    /// UTC µs of the admission: a request span's start (0 without spans).
    pub admitted_micros: u64,
    /// The request id the client saw (a header value: a reference-counted
    /// copy of the one the response carries).
    pub request_id: HeaderValue,
    /// Which reservation of the request this is, from 1.
    pub attempt: u32,
    /// The API surface.
    pub dialect: Dialect,
    /// The keyed hash of the end user's id, when the request named one.
    pub end_user: Option<Arc<str>>,
    /// Position among the hold's amounts of a dollar budget: what the drop
    /// backstop charged it is the cost then.
    pub usd_index: Option<usize>,
    /// The layer that admitted it (`store`, `lease`, `local_limiter`).
    pub decided_by: &'static str,
    /// The run the request belongs to (`x-budgetgate-run`), if any.
    pub run: Option<Arc<str>>,
}

impl Who {
    /// A reservation of `scope`'s plan on its `deployment`-th deployment.
    pub fn new(
        scope: Arc<Scope>,
        deployment: usize,
        dialect: Dialect,
        end_user: Option<Arc<str>>,
        usd_index: Option<usize>,
    ) -> Self {
        let provider = scope.providers.get(deployment).copied().unwrap_or("");
        let deployment = scope
            .deployments
            .get(deployment)
            .cloned()
            .unwrap_or_default();
        Self {
            scope,
            deployment,
            provider,
            admitted_micros: 0,
            request_id: HeaderValue::from_static(""),
            attempt: 1,
            dialect,
            end_user,
            usd_index,
            decided_by: "store",
            run: None,
        }
    }

    /// The reservation belongs to run `run`.
    pub fn of_run(mut self, run: Option<Arc<str>>) -> Self {
        self.run = run;
        self
    }

    /// The reservation was admitted by the layer labelled `decided_by`
    /// ([`crate::admission::AnsweredBy::label`]).
    pub fn decided_by(mut self, decided_by: &'static str) -> Self {
        self.decided_by = decided_by;
        self
    }

    /// The reservation was admitted at `micros` (UTC µs).
    pub fn admitted_at(mut self, micros: u64) -> Self {
        self.admitted_micros = micros;
        self
    }

    /// The reservation is the `attempt`-th (from 1) of the request the
    /// client knows as `request_id`.
    pub fn of_request(mut self, request_id: HeaderValue, attempt: u32) -> Self {
        self.request_id = request_id;
        self.attempt = attempt;
        self
    }
}

/// Every dialect's ledger column value.
pub const DIALECTS: [&str; 6] = [
    "chat",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "gemini",
];

/// The ledger column value (and span attribute) of a dialect.
pub const fn dialect_name(d: Dialect) -> &'static str {
    match d {
        Dialect::ChatCompletions => "chat",
        Dialect::Completions => "completions",
        Dialect::Embeddings => "embeddings",
        Dialect::Responses => "responses",
        Dialect::Messages => "messages",
        Dialect::Gemini => "gemini",
    }
}
