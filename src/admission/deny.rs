//! The deny cache as a store wrapper (DESIGN section 7): a reservation
//! that certainly cannot fit a tenant-side budget the store refused a
//! moment ago is refused here, without a store call; every refusal of the
//! store is remembered. The decision metrics of store refusals are counted
//! here too, since only this layer knows whether a refusal came from the
//! cache or from the store.

use std::sync::Arc;

use async_trait::async_trait;

use crate::budget::deny_cache::DenyCache;
use crate::budget::{
    BudgetSpec, BudgetState, BudgetStore, ExtendOutcome, RenewOutcome, ReserveOutcome,
    ReserveRequest, SettleOutcome, Settlement, Step, StoreError,
};
use crate::clock::Clock;
use crate::metrics;

/// Which layer answered a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    /// The budget store.
    Store,
    /// The local deny cache, without a store call.
    DenyCache,
    /// The local limiter of a `fail_open` tenant while the store fails.
    LocalLimiter,
    /// This gateway's quota leases, without a store call.
    Lease,
    /// Split: the deployment's budgets from this gateway's quota leases,
    /// the rest by the store (one call where two domains would take two).
    Split,
}

impl AnsweredBy {
    /// The layers that admit reservations (a deny cache only refuses).
    pub const ADMITTING: [AnsweredBy; 4] = [
        AnsweredBy::Store,
        AnsweredBy::Lease,
        AnsweredBy::Split,
        AnsweredBy::LocalLimiter,
    ];

    /// The label of the request log line's `decided_by`.
    pub fn label(self) -> &'static str {
        match self {
            AnsweredBy::Store => "store",
            AnsweredBy::DenyCache => "deny_cache",
            AnsweredBy::LocalLimiter => "local_limiter",
            AnsweredBy::Lease => "lease",
            AnsweredBy::Split => "split",
        }
    }
}

/// A store behind a local deny cache.
pub struct DenyCachedStore {
    inner: Arc<dyn BudgetStore>,
    cache: Arc<DenyCache>,
    clock: Arc<dyn Clock>,
}

impl DenyCachedStore {
    /// `inner` behind `cache`; `clock` dates the refusals.
    pub fn new(inner: Arc<dyn BudgetStore>, cache: Arc<DenyCache>, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            cache,
            clock,
        }
    }

    /// The same cache in front of another store handle.
    pub fn with_inner(&self, inner: Arc<dyn BudgetStore>) -> Self {
        Self::new(inner, self.cache.clone(), self.clock.clone())
    }

    /// The store behind the cache (for calls the cache has no part in).
    pub fn store(&self) -> &Arc<dyn BudgetStore> {
        &self.inner
    }

    /// The cache (a refund of this gateway clears its entries).
    pub fn cache(&self) -> &Arc<DenyCache> {
        &self.cache
    }

    /// Refuses locally when the cache knows the request cannot fit, else
    /// asks the store and remembers a refusal of a tenant-side budget.
    pub async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.reserve_answered(r).await.map(|(o, _)| o)
    }

    /// [`Self::reserve`], and who answered: a refusal from the cache knows
    /// only the refusing budget (the rate-limit headers of the refusal say
    /// so), one from the store may be described in full.
    pub async fn reserve_answered(
        &self,
        r: &ReserveRequest,
    ) -> Result<(ReserveOutcome, AnsweredBy), StoreError> {
        let now = self.clock.now_micros();
        let who = &r.requester;
        // A common budget priced per candidate refuses locally only when
        // even the cheapest candidate cannot fit.
        let ncand = r.candidates.len().max(1);
        let costs: Vec<u64> = r
            .common
            .iter()
            .enumerate()
            .map(|(i, s)| (0..ncand).map(|c| r.costs.of(c, i, s)).min().unwrap_or(0))
            .collect();
        if let Some(denial) = self.cache.check(&r.common, &costs, now) {
            metrics::deny_cache_hit(&who.tenant, denial.name);
            metrics::decision(
                &who.tenant,
                metrics::scope_kind(&denial.scope),
                denial.name.as_str(),
                "deny_cache",
            );
            return Ok((ReserveOutcome::Denied(denial), AnsweredBy::DenyCache));
        }
        let outcome = self.inner.reserve(r).await?;
        match &outcome {
            ReserveOutcome::Admitted(_) => {}
            ReserveOutcome::Denied(denial) => {
                count_refusal(r, &denial.scope, denial.name, "denied");
                let spec = r
                    .common
                    .iter()
                    .find(|s| s.scope == denial.scope && s.name == denial.name);
                if let Some(spec) = spec {
                    self.cache.record_by(spec, denial, now, &r.id);
                }
            }
            ReserveOutcome::Impossible(i) => count_refusal(r, &i.scope, i.name, "impossible"),
            ReserveOutcome::Voided | ReserveOutcome::RunConflict(_) => {}
        }
        Ok((outcome, AnsweredBy::Store))
    }

    /// Passed to the store.
    pub async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.inner.extend(id, step).await
    }

    /// Passed to the store.
    pub async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        self.inner.settle(id, s).await
    }
}

/// Counts a refusal in the decision metrics of the request's tenant.
pub(super) fn count_refusal(
    r: &ReserveRequest,
    scope: &crate::budget::Scope,
    name: crate::budget::BudgetName,
    outcome: &'static str,
) {
    metrics::decision(
        &r.requester.tenant,
        metrics::scope_kind(scope),
        name.as_str(),
        outcome,
    );
}

#[async_trait]
impl BudgetStore for DenyCachedStore {
    async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        DenyCachedStore::reserve(self, r).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        DenyCachedStore::extend(self, id, step).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(id).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        DenyCachedStore::settle(self, id, s).await
    }
    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        self.inner.void(id, hold_ttl_micros).await
    }
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        self.inner.inspect(specs).await
    }
    async fn holds_on(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<Vec<crate::budget::HeldOn>, StoreError> {
        self.inner.holds_on(specs).await
    }
    async fn slides(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<Vec<Option<crate::budget::Slide>>, StoreError> {
        self.inner.slides(specs).await
    }
    async fn runs_of(
        &self,
        ks: &crate::budget::keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Result<Vec<crate::budget::ListedRun>, StoreError> {
        self.inner.runs_of(ks, tenant, n).await
    }
    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.inner.lower(spec, at_most).await
    }
    fn times_out_calls(&self) -> bool {
        self.inner.times_out_calls()
    }
}
