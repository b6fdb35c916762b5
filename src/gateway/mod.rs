//! The gateway's state and budget plan: what every phase of the request
//! path reads ([`AppState`], built once and shared by the serving
//! threads; [`BudgetPlan`], the budgets of one tenant, key and model under
//! a policy version), and the request-ending error ([`error::ApiError`])
//! with its rendering. It sits under the lifecycle and the HTTP face and
//! imports neither.
//!
//! - [`error`]: every error → status, body in the dialect's shape, retry
//!   headers; [`refusal_text`]: the words of a budget refusal.
//! - [`recent_refusals`]: each tenant's last refusals, for the budget page.
//! - [`own_budgets`]: the cache of `GET /v1/budget`'s answers.
//! - [`observers`]: the settlement observers, registered in one place.

pub mod error;
pub mod observers;
pub mod own_budgets;
pub mod recent_refusals;
pub mod refusal_text;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::admission::amounts::Counting;
use crate::admission::deny::DenyCachedStore;
use crate::admission::plan;
use crate::admission::{DenyRelease, GatewayStore, SettlementTracker};
use crate::budget::deny_cache::DenyCache;
use crate::budget::guarded::GuardedStore;
use crate::budget::keys::KeySpace;
use crate::budget::memory::MemoryStore;
use crate::budget::records::{MemoryRecords, Records};
use crate::budget::redis::records::RedisRecords;
use crate::budget::{BudgetSpec, BudgetStore, Requester};
use crate::clock::Clock;
use crate::config::{DeploymentId, KeyId, ModelId, Policy, TenantId};
use crate::metrics::{DeploymentMetrics, TenantMetrics};
use crate::money::PriceTable;
use crate::upstreams::UpstreamClient;

/// Everything a request needs. One per serving thread: the store handle
/// (and with it the store connection and circuit breaker) is the thread's
/// own, everything else is shared by all threads ([`AppState::with_store`]).
pub struct AppState {
    /// The active policy; swapped atomically on reload, each request keeps the one it started with.
    pub policy: Arc<ArcSwap<Policy>>,
    /// Budget state: the failure policy over the deny cache over the
    /// guarded store (timeout, metrics, circuit breaker).
    pub store: Arc<GatewayStore>,
    /// Time source (the store reads its own; this one stamps logs and responses).
    pub clock: Arc<dyn Clock>,
    /// Pooled upstream client.
    pub upstream: UpstreamClient,
    /// Settlement tasks in flight.
    pub settlements: SettlementTracker,
    /// Deployments that answered 429 (or were unwell, or refused the
    /// gateway's credentials): no traffic until the given UTC µs (per gateway).
    cooldowns: Arc<Mutex<HashMap<String, Cooling>>>,
    /// SHA-256 of the admin API bearer token; `None` disables the admin API.
    admin_token: Arc<Mutex<Option<[u8; 32]>>>,
    /// Budget lists per (tenant, key, model) of the active policy.
    plans: Arc<Mutex<PlanCache>>,
    /// Owner records of stored responses (one per process, every serving thread shares it).
    pub records: Arc<Records>,
    /// Each tenant's last budget refusals (per process), for the budget page.
    pub recent_refusals: Arc<recent_refusals::RecentRefusals>,
    /// Requests waiting for capacity (per process, every serving thread's).
    pub queue: Arc<crate::queue::Queue>,
    /// The spend ledger's buffer, set once at start; unset while the ledger is off.
    pub ledger: Arc<std::sync::OnceLock<Arc<crate::ledger::Ledger>>>,
    /// The exporter of request spans, set once at start; unset while telemetry is off.
    pub spans: Arc<std::sync::OnceLock<Arc<crate::telemetry::Spans>>>,
    /// The spend ledger's queries, set once at start; unset without a database.
    pub spend: Arc<std::sync::OnceLock<Arc<dyn crate::ledger::SpendReader>>>,
    /// The control plane (runtime tenants and keys), set once at start.
    pub control: Arc<std::sync::OnceLock<Arc<crate::control::ControlPlane>>>,
    /// `GET /v1/budget`'s last answer per key (at most a second old).
    pub own_budgets: Arc<own_budgets::Answers>,
    /// Expected-output windows and exposure book (per process).
    pub expected: Arc<crate::admission::expected::ExpectedBooks>,
}

/// The budgets a request of one (tenant, key, model) reserves against,
/// derived from the policy once rather than on every request.
pub struct BudgetPlan {
    /// Tenant-side budgets (tenant, key, tenant × model, shadow limits).
    pub common: Vec<BudgetSpec>,
    /// How each of `common` counts a request (same order).
    pub common_counting: Vec<Counting>,
    /// Every deployment of the model, in configured order.
    pub upstreams: Vec<PlannedDeployment>,
    /// Metric handles of the tenant under this policy version.
    pub tenant_metrics: Arc<TenantMetrics>,
    /// The deny-cache entries a refund of this plan's reservations clears.
    pub deny_release: Arc<DenyRelease>,
    /// Who the plan's reservations are for (tenant, policy version, failure policy).
    pub requester: Arc<Requester>,
    /// What every ledger row of the plan's reservations shares.
    pub ledger: Arc<crate::ledger::LedgerScope>,
    /// `output_reservation` of the tenant or key: what requests not
    /// metered as they stream reserve (looked at only by those that may
    /// reserve less than they can answer).
    pub expected: crate::admission::expected::ExpectedPlan,
}

/// One deployment a request of a [`BudgetPlan`] may be sent to.
pub struct PlannedDeployment {
    /// The deployment.
    pub upstream: DeploymentId,
    /// The deployment's budgets.
    pub budgets: Vec<BudgetSpec>,
    /// How each of `budgets` counts a request of the plan's model (same order).
    pub counting: Vec<Counting>,
    /// The model's prices on this deployment, under the plan's policy: a
    /// request prices its usage at the prices it was admitted under, even
    /// after a reload.
    pub price: Option<Arc<PriceTable>>,
    /// Metric handles of the deployment.
    pub metrics: DeploymentMetrics,
}

/// A deployment's cool-down: until when (UTC µs) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooling {
    /// Its end.
    pub until: u64,
    /// Its reason.
    pub reason: CoolingReason,
}

/// Why a deployment cools down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoolingReason {
    /// It answered 429, or was unavailable: requests wait (429 with
    /// `retry-after` when no deployment is left).
    RateLimited,
    /// It refused the gateway's credentials: no wait helps the client
    /// (502 naming it when no deployment is left).
    AccessDenied,
}

impl CoolingReason {
    /// Its name in `/readyz`.
    pub fn name(self) -> &'static str {
        match self {
            CoolingReason::RateLimited => "rate_limited",
            CoolingReason::AccessDenied => "access_denied",
        }
    }
}

#[derive(Default)]
struct PlanCache {
    /// Version of the policy the plans belong to.
    version: String,
    /// foldhash: the look-up is on every request, and SipHash of three
    /// ids cost it about 200 instructions.
    plans: foldhash::HashMap<(TenantId, KeyId, ModelId), Arc<BudgetPlan>>,
}

impl AppState {
    /// State for `policy` over `store`.
    /// The store is composed once into a [`GatewayStore`].
    pub fn new(policy: Policy, store: Arc<dyn BudgetStore>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_leases(policy, store, clock, None)
    }

    /// [`Self::new`], deciding what `leases` cover from them
    /// ([`crate::admission::quota_lease`]).
    pub fn with_leases(
        policy: Policy,
        store: Arc<dyn BudgetStore>,
        clock: Arc<dyn Clock>,
        leases: Option<Arc<crate::admission::quota_lease::QuotaLeases>>,
    ) -> Arc<Self> {
        // Before the store wrapper registers its metric handles.
        crate::metrics::install();
        let guarded: Arc<dyn BudgetStore> =
            Arc::new(GuardedStore::new(store, policy.store.timeout));
        let deny_cache = Arc::new(DenyCache::with_capacity(policy.store.deny_cache_entries));
        let mut gateway = GatewayStore::bounded(
            DenyCachedStore::new(guarded, deny_cache, clock.clone()),
            Arc::new(MemoryStore::new(clock.clone())),
            policy.store.fallback_share,
            policy.store.fail_open_entries,
        );
        if let Some(l) = leases {
            crate::admission::quota_lease::metrics::register();
            gateway = gateway.with_leases(l);
        }
        let (queue, ledger, spans) = (Arc::default(), Arc::default(), Arc::default());
        let observers = observers::observers(&queue, &ledger, &spans, &clock);
        let settlements = SettlementTracker::new(observers);
        let store = Arc::new(gateway.counting_live(&settlements));
        crate::metrics::policy_installed(None, &policy);
        crate::queue::metrics::register();
        let records = Arc::new(records_for(&policy.store));
        Arc::new(Self {
            policy: Arc::new(ArcSwap::from_pointee(policy)),
            store,
            clock,
            upstream: UpstreamClient::new(),
            settlements,
            cooldowns: Arc::new(Mutex::new(HashMap::new())),
            admin_token: Arc::new(Mutex::new(None)),
            plans: Arc::default(),
            records,
            recent_refusals: Arc::default(),
            own_budgets: Arc::default(),
            expected: Arc::default(),
            queue,
            ledger,
            spans,
            spend: Arc::default(),
            control: Arc::default(),
        })
    }

    /// What the gateway does when a policy is installed: forgets the
    /// budget plans (a version may come back, a file edit undone, and its
    /// plans must not hold what the one between dropped) and the
    /// expected-output windows of the tenants and models gone.
    pub fn on_policy_installed(&self) -> impl Fn(&Policy) + Send + Sync + 'static {
        let (plans, expected) = (self.plans.clone(), self.expected.clone());
        move |policy| {
            let mut cache = plans.lock().unwrap_or_else(|e| e.into_inner());
            cache.version.clone_from(&policy.version);
            cache.plans.clear();
            drop(cache);
            expected.prune(policy);
        }
    }

    /// The budget plan of `tenant`, `key` and `model` under `policy`; built
    /// on first use per policy version.
    pub fn budget_plan(
        &self,
        policy: &Policy,
        tenant_id: TenantId,
        key_id: KeyId,
        model_id: ModelId,
    ) -> Arc<BudgetPlan> {
        let mut cache = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if cache.version != policy.version {
            cache.version.clone_from(&policy.version);
            cache.plans.clear();
        }
        let (tenant, key, model) = (
            policy.tenant(tenant_id),
            policy.key(tenant_id, key_id),
            policy.model_at(model_id),
        );
        cache
            .plans
            .entry((tenant_id, key_id, model_id))
            .or_insert_with(|| {
                let ks = Self::key_space(policy);
                let (common, common_counting) = plan::tenant_plan(&ks, policy, tenant, key, model);
                let deny_release =
                    Arc::new(DenyRelease::of(self.store.deny_cache().clone(), &common));
                Arc::new(BudgetPlan {
                    common,
                    common_counting,
                    deny_release,
                    upstreams: policy
                        .deployments_of(model_id)
                        .map(|u| {
                            let deployment = policy.deployment(u);
                            let budgets = plan::upstream_budgets(&ks, deployment);
                            PlannedDeployment {
                                upstream: u,
                                counting: plan::upstream_counting(&budgets, deployment, model),
                                budgets,
                                metrics: DeploymentMetrics::new(&deployment.name),
                                price: model.price_on(deployment),
                            }
                        })
                        .collect(),
                    ledger: Arc::new(crate::ledger::LedgerScope {
                        tenant: tenant.name.as_str().into(),
                        ancestors: tenant
                            .ancestors
                            .iter()
                            .map(|&a| Arc::<str>::from(policy.tenants[a].name.as_str()))
                            .collect(),
                        key_id: key.id.as_str().into(),
                        model: model.name.as_str().into(),
                        price_version: policy.version.as_str().into(),
                        deployments: policy
                            .deployments_of(model_id)
                            .map(|u| Arc::<str>::from(policy.deployment(u).name.as_str()))
                            .collect(),
                        providers: policy
                            .deployments_of(model_id)
                            .map(|u| crate::telemetry::provider_name(policy.deployment(u).kind))
                            .collect(),
                        upstream_model: model.upstream_model.as_str().into(),
                    }),
                    expected: self.expected.plan(
                        tenant.output_reservation(key),
                        &tenant.name,
                        &model.name,
                        model.default_max_output_tokens,
                    ),
                    tenant_metrics: Arc::new(TenantMetrics::new(&tenant.name)),
                    requester: Arc::new(Requester {
                        tenant: tenant.name.as_str().into(),
                        policy_version: policy.version.as_str().into(),
                        on_store_error: tenant.on_store_error,
                        run: None,
                    }),
                })
            })
            .clone()
    }

    /// The same gateway state over another handle to the budget store (a
    /// serving thread's own Redis connection, or the shared memory store),
    /// wrapped in its own [`GuardedStore`] and the shared layers of the
    /// [`GatewayStore`]. Policy, reloads, settlements,
    /// leases, deny cache, cool-downs, fallback limiter and admin token are
    /// shared with `self`.
    pub fn with_store(&self, store: Arc<dyn BudgetStore>) -> Arc<Self> {
        let timeout = self.policy.load().store.timeout;
        Arc::new(Self {
            policy: self.policy.clone(),
            store: Arc::new(
                self.store
                    .with_inner(Arc::new(GuardedStore::new(store, timeout))),
            ),
            clock: self.clock.clone(),
            upstream: self.upstream.clone(),
            settlements: self.settlements.clone(),
            cooldowns: self.cooldowns.clone(),
            admin_token: self.admin_token.clone(),
            plans: self.plans.clone(),
            records: self.records.clone(),
            recent_refusals: self.recent_refusals.clone(),
            own_budgets: self.own_budgets.clone(),
            expected: self.expected.clone(),
            queue: self.queue.clone(),
            ledger: self.ledger.clone(),
            spans: self.spans.clone(),
            spend: self.spend.clone(),
            control: self.control.clone(),
        })
    }

    /// Enables the admin API with bearer `token`, or disables it (`None` or
    /// empty). Only the token's SHA-256 is kept.
    pub fn set_admin_token(&self, token: Option<&str>) {
        use sha2::Digest;
        let digest = token
            .filter(|t| !t.is_empty())
            .map(|t| <[u8; 32]>::from(sha2::Sha256::digest(t.as_bytes())));
        *self.admin_token.lock().unwrap_or_else(|e| e.into_inner()) = digest;
    }

    /// SHA-256 of the admin token, when the admin API is enabled.
    pub fn admin_token_digest(&self) -> Option<[u8; 32]> {
        *self.admin_token.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps traffic away from `deployment` until `until_micros` (UTC µs):
    /// it is rate limited or unwell.
    pub fn cool_down(&self, deployment: &str, until_micros: u64) {
        self.cool_down_for(deployment, until_micros, CoolingReason::RateLimited);
    }

    /// Keeps traffic away from `deployment` until `until_micros` (UTC µs)
    /// for `reason`; the later end (and its reason) wins.
    pub fn cool_down_for(&self, deployment: &str, until_micros: u64, reason: CoolingReason) {
        let mut c = self.cooldowns.lock().unwrap_or_else(|e| e.into_inner());
        let entry = c
            .entry(deployment.to_string())
            .or_insert(Cooling { until: 0, reason });
        if until_micros > entry.until {
            *entry = Cooling {
                until: until_micros,
                reason,
            };
        }
    }

    /// When `deployment` is cooling down at `now` (UTC µs), until when and why.
    pub fn cooldown(&self, deployment: &str, now: u64) -> Option<Cooling> {
        let c = self.cooldowns.lock().unwrap_or_else(|e| e.into_inner());
        c.get(deployment).copied().filter(|c| c.until > now)
    }

    /// Every deployment cooling down at `now` (UTC µs), by name (`/readyz`).
    pub fn cooling(&self, now: u64) -> Vec<(String, Cooling)> {
        let c = self.cooldowns.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, Cooling)> = c
            .iter()
            .filter(|(_, c)| c.until > now)
            .map(|(n, c)| (n.clone(), *c))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Key space of the current policy.
    pub fn key_space(policy: &Policy) -> KeySpace {
        plan::key_space(policy)
    }
}

/// The owner-record store of the configured store kind.
fn records_for(store: &crate::config::store::StorePolicy) -> Records {
    use crate::config::store::StoreKind;
    match &store.kind {
        StoreKind::Memory => Records::Memory(MemoryRecords::new(
            store.max_memory_records,
            store.record_ttl,
        )),
        StoreKind::Redis { url } => Records::Redis(RedisRecords::new(
            url,
            &store.key_prefix,
            store.timeout,
            store.record_ttl,
        )),
    }
}
