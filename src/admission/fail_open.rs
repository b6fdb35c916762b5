//! The failure policy as a store wrapper (DESIGN section 7): when the
//! store fails a reservation, a `fail_closed` tenant's request fails (503),
//! a `fail_open` tenant's request is reserved on a local in-process limiter
//! that enforces this gateway's share of every budget. The reservations
//! held there are remembered by id, so their extensions, renewals and
//! settlements go where they were reserved.
//!
//! The limiter counts the gateway's own requests in flight: a concurrency
//! budget's slots this gateway's live reservations hold in the store
//! ([`super::slot_renewal::SlotRenewer::slots_taken`]) are taken from the
//! limiter's share of it, so a store that stalls under open streams admits
//! no more than the limit on this gateway. Rate and quota budgets start at
//! the share: they measure what was spent, which only the store knows.
//!
//! The limiter keeps state for at most `store.fail_open_entries` budgets
//! (default [`DEFAULT_FAIL_OPEN_ENTRIES`]): end users make the number of budgets
//! unbounded, and an outage is when they pile up. The least recently
//! reserved budget is forgotten first (it starts full again: the limiter
//! is this gateway's share of a budget, not the budget), and counted
//! (`budgetgate_fail_open_evictions_total`).

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lru::LruCache;

use super::compensate::{outcome_unknown, Compensation, Compensator};
use super::deny::{count_refusal, AnsweredBy, DenyCachedStore};
use super::quota_lease::{Decision, HeldSettle, OverflowEnd, QuotaLeases, StoreStep};
use super::slot_renewal::SlotRenewer;
use super::SettlementTracker;
use crate::budget::memory::MemoryStore;
use crate::budget::parts;
use crate::budget::{
    Actual, Admission, BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, ExtendOutcome,
    RenewOutcome, ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement, Step,
    StoreError,
};
use crate::config::store::DEFAULT_FAIL_OPEN_ENTRIES;
use crate::config::OnStoreError;
use crate::metrics;

/// The budget keys the local limiter holds state for, least recently
/// reserved first.
struct Tracked(Mutex<LruCache<String, ()>>);

impl Tracked {
    fn new(entries: usize) -> Self {
        let n = NonZeroUsize::MIN.saturating_add(entries.saturating_sub(1));
        Tracked(Mutex::new(LruCache::new(n)))
    }

    /// Marks the budgets of `r` used; forgets in `limiter` the budgets
    /// pushed out.
    fn touch(&self, r: &ReserveRequest, limiter: &MemoryStore) {
        let mut keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for spec in r.common.iter().chain(r.candidates.iter().flatten()) {
            if keys.get(&*spec.key).is_some() {
                continue;
            }
            if let Some((old, ())) = keys.push(spec.key.to_string(), ()) {
                limiter.forget(&old);
                metrics::fail_open_eviction();
            }
        }
    }
}

/// Reservations held by the local limiter, by id.
#[derive(Default)]
struct LocalHolds {
    /// How many ids `ids` holds: read without the lock on every call, so
    /// the common case (the store is up) never takes it.
    count: AtomicUsize,
    ids: Mutex<HashSet<String>>,
}

impl LocalHolds {
    fn contains(&self, id: &str) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.lock().contains(id)
    }

    fn insert(&self, id: &str) {
        let mut ids = self.lock();
        if ids.insert(id.to_string()) {
            self.count.fetch_add(1, Ordering::Release);
        }
    }

    fn remove(&self, id: &str) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        if self.lock().remove(id) {
            self.count.fetch_sub(1, Ordering::Release);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The gateway's budget store: the failure policy over the deny cache over
/// the guarded store. Composed once at start-up (and once per serving
/// thread's store handle, sharing cache, local limiter and holds).
pub struct GatewayStore {
    inner: DenyCachedStore,
    fallback: Arc<MemoryStore>,
    /// This gateway's share of every budget while failing open, (0, 1].
    share: f64,
    local: Arc<LocalHolds>,
    /// Reservations served by the local limiter whose store reservation
    /// has an unknown outcome, with their hold lifetime: settled in the
    /// store too when they end ([`super::compensate`]).
    lost: Arc<Mutex<HashMap<String, Duration>>>,
    compensator: Arc<Compensator>,
    tracked: Arc<Tracked>,
    /// Quota leases (Redis store with `lease = "auto"`): reservations they
    /// cover are decided there, before any other layer.
    leases: Option<Arc<QuotaLeases>>,
    /// The gateway's live reservations: the slots its requests in flight
    /// hold in the store, which the local limiter counts.
    live: Option<SlotRenewer>,
}

impl GatewayStore {
    /// The same store deciding what `leases` cover from them.
    pub fn with_leases(mut self, leases: Arc<QuotaLeases>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// The same store with a local limiter that counts the slots the live
    /// reservations of `tracker` hold in the store.
    pub fn counting_live(mut self, tracker: &SettlementTracker) -> Self {
        self.live = Some(tracker.slot_renewer().clone());
        self
    }

    /// The lease layer, when leases are on.
    pub fn leases(&self) -> Option<&Arc<QuotaLeases>> {
        self.leases.as_ref()
    }

    fn leased(&self, id: &str) -> Option<&QuotaLeases> {
        self.leases.as_deref().filter(|l| l.holds(id))
    }

    /// `inner` with the local limiter `fallback` enforcing `share` of every
    /// budget for `fail_open` tenants while `inner` fails.
    /// The limiter keeps state for [`DEFAULT_FAIL_OPEN_ENTRIES`] budgets.
    pub fn new(inner: DenyCachedStore, fallback: Arc<MemoryStore>, share: f64) -> Self {
        Self::bounded(inner, fallback, share, DEFAULT_FAIL_OPEN_ENTRIES)
    }

    /// [`Self::new`] with a limiter that keeps state for at most `entries`
    /// budgets.
    pub fn bounded(
        inner: DenyCachedStore,
        fallback: Arc<MemoryStore>,
        share: f64,
        entries: usize,
    ) -> Self {
        Self {
            inner,
            fallback,
            share,
            local: Arc::default(),
            lost: Arc::default(),
            compensator: Arc::default(),
            tracked: Arc::new(Tracked::new(entries)),
            leases: None,
            live: None,
        }
    }

    /// `local` with each concurrency budget's slots lowered by those this
    /// gateway's live reservations hold of it in the store; and by how much
    /// each was lowered.
    fn seeded(&self, mut local: ReserveRequest) -> (ReserveRequest, Vec<(Scope, BudgetName, u64)>) {
        let Some(live) = &self.live else {
            return (local, Vec::new());
        };
        let keys: Vec<Arc<str>> = local
            .common
            .iter()
            .chain(local.candidates.iter().flatten())
            .filter(|s| matches!(s.kind, BudgetKind::Concurrency { .. }))
            .map(|s| s.key.clone())
            .collect();
        if keys.is_empty() {
            return (local, Vec::new());
        }
        let taken = live.slots_taken(&keys.iter().map(|k| &**k).collect::<Vec<_>>());
        let taken_of = |key: &str| {
            keys.iter()
                .position(|k| **k == *key)
                .map_or(0, |i| taken[i])
        };
        let mut lowered = Vec::new();
        let all = local
            .common
            .iter_mut()
            .chain(local.candidates.iter_mut().flatten());
        for spec in all {
            if let BudgetKind::Concurrency { max } = &mut spec.kind {
                let by = taken_of(&spec.key).min(*max);
                if by > 0 {
                    *max -= by;
                    lowered.push((spec.scope.clone(), spec.name, by));
                }
            }
        }
        (local, lowered)
    }

    fn compensate(&self, id: &str, what: Compensation, hold_ttl: Duration) {
        self.compensator
            .submit(self.inner.store().clone(), id.to_string(), what, hold_ttl);
    }

    fn lost_reply(&self, id: &str) -> Option<Duration> {
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if lost.is_empty() {
            return None;
        }
        lost.remove(id)
    }

    /// The same layers over another handle to the budget store.
    pub fn with_inner(&self, inner: Arc<dyn BudgetStore>) -> Self {
        Self {
            inner: self.inner.with_inner(inner),
            fallback: self.fallback.clone(),
            share: self.share,
            local: self.local.clone(),
            lost: self.lost.clone(),
            compensator: self.compensator.clone(),
            tracked: self.tracked.clone(),
            leases: self.leases.clone(),
            live: self.live.clone(),
        }
    }

    /// The deny cache layer.
    pub fn deny_cache(&self) -> &Arc<crate::budget::deny_cache::DenyCache> {
        self.inner.cache()
    }

    /// Reserves in the store; when it fails, applies the requester's
    /// failure policy.
    pub async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.reserve_answered(r).await.map(|(o, _)| o)
    }

    /// [`Self::reserve`], and which layer answered.
    pub async fn reserve_answered(
        &self,
        r: &ReserveRequest,
    ) -> Result<(ReserveOutcome, AnsweredBy), StoreError> {
        let mut split = None;
        if let Some(l) = &self.leases {
            match l.reserve(r) {
                Decision::Local(o) => {
                    match &o {
                        ReserveOutcome::Denied(d) => count_refusal(r, &d.scope, d.name, "denied"),
                        ReserveOutcome::Impossible(i) => {
                            count_refusal(r, &i.scope, i.name, "impossible")
                        }
                        _ => {}
                    }
                    return Ok((o, AnsweredBy::Lease));
                }
                Decision::Split { local, store } => split = Some((l, local, store)),
                Decision::Store => {}
            }
        }
        let e = match split {
            Some((l, local, part)) => match Box::pin(self.reserve_split(l, r, local, part)).await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            },
            None => {
                let call = InFlight {
                    store: self,
                    r,
                    answered: false,
                };
                match self.inner.reserve_answered(r).await {
                    Ok((ReserveOutcome::Denied(d), by)) if !d.held_for_share => {
                        let refused = call.answered((ReserveOutcome::Denied(d), by));
                        // Units this gateway holds on leases are not the
                        // store's to count: its own leases may still cover
                        // the request (a share's turn, the store's to give,
                        // is left to it).
                        if let Some(l) = &self.leases {
                            if let Some(o) = l.reserve_refused(r).await {
                                return Ok((o, AnsweredBy::Lease));
                            }
                        }
                        return Ok(refused);
                    }
                    Ok(o) => return Ok(call.answered(o)),
                    Err(e) => call.answered(e),
                }
            }
        };
        if let Some(l) = &self.leases {
            l.store_failed(r);
        }
        let who = &r.requester;
        // The store may have applied it: whatever this request gets, the
        // reservation is settled under its own id when the request ends.
        let unknown = outcome_unknown(&e);
        let hold_ttl = Duration::from_micros(r.hold_ttl_micros);
        match who.on_store_error {
            OnStoreError::FailClosed => {
                tracing::error!(error = %e, tenant = %who.tenant, policy_version = %who.policy_version, "budget store failed; failing closed");
                metrics::degraded(&who.tenant, "fail_closed");
                metrics::decision(&who.tenant, "tenant", "none", "fail_closed");
                if unknown {
                    self.compensate(&r.id, Compensation::Void, hold_ttl);
                }
                Err(e)
            }
            OnStoreError::FailOpen => {
                tracing::warn!(error = %e, tenant = %who.tenant, policy_version = %who.policy_version, "budget store failed; failing open to the local limiter");
                metrics::degraded(&who.tenant, "fail_open");
                self.tracked.touch(r, &self.fallback);
                let (local, lowered) = self.seeded(scaled(r, self.share));
                let mut outcome = self.fallback.reserve(&local).await?;
                if let ReserveOutcome::Denied(d) = &mut outcome {
                    // The budget's own share is its limit, not what is left of it.
                    if let Some((_, _, by)) = lowered
                        .iter()
                        .find(|(scope, name, _)| *scope == d.scope && *name == d.name)
                    {
                        d.limit += by;
                        d.state.limit += by;
                    }
                }
                match &outcome {
                    ReserveOutcome::Admitted(_) => {
                        self.local.insert(&r.id);
                        if unknown {
                            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
                            lost.insert(r.id.clone(), hold_ttl);
                        }
                    }
                    ReserveOutcome::Denied(d) => count_refusal(r, &d.scope, d.name, "denied"),
                    ReserveOutcome::Impossible(i) => {
                        count_refusal(r, &i.scope, i.name, "impossible")
                    }
                    ReserveOutcome::Voided | ReserveOutcome::RunConflict(_) => {}
                }
                if unknown && !matches!(outcome, ReserveOutcome::Admitted(_)) {
                    self.compensate(&r.id, Compensation::Void, hold_ttl);
                }
                Ok((outcome, AnsweredBy::LocalLimiter))
            }
        }
    }

    /// A split reservation (DESIGN "Leased deployments beside exact
    /// tenants"): `local`, the deployment's budgets, already held from
    /// this gateway's leases; `part`, the common budgets, reserved in the
    /// store. The store's refusal (or a cut-off call) voids the local hold,
    /// and the request gets the store's answer unless this gateway's
    /// leases now cover it whole (stranding rule two, as for a whole
    /// reservation the store refused); a store failure voids it
    /// too and returns the error, for the failure policy over the whole
    /// reservation.
    async fn reserve_split(
        &self,
        l: &QuotaLeases,
        r: &ReserveRequest,
        local: Admission,
        part: ReserveRequest,
    ) -> Result<(ReserveOutcome, AnsweredBy), StoreError> {
        let held = LocalPart {
            leases: l,
            id: &r.id,
            kept: false,
        };
        let call = InFlight {
            store: self,
            r: &part,
            answered: false,
        };
        let answer = call.answered(self.inner.reserve_answered(&part).await);
        match answer {
            Ok((ReserveOutcome::Admitted(a), _)) => {
                held.keep();
                Ok((
                    ReserveOutcome::Admitted(parts::joined(a, local, 0)),
                    AnsweredBy::Split,
                ))
            }
            Ok((ReserveOutcome::Denied(d), by)) if !d.held_for_share => {
                drop(held);
                // As a whole reservation the store refused: this
                // gateway's leases may come to cover it (a leased common
                // budget short of it, whose top-up is on the wire).
                if let Some(o) = l.reserve_refused(r).await {
                    return Ok((o, AnsweredBy::Lease));
                }
                Ok((ReserveOutcome::Denied(d), by))
            }
            // `held` voids the local hold on its way out.
            other => other,
        }
    }

    /// Settles split reservation `id`: the local hold first, then the
    /// store's hold of its first `n` specs. The local hold needs no store
    /// call (but its overflows'): settled first, a store that fails past
    /// the settlement's retries leaves only its own hold, which expires
    /// there charged whole as any other, not this gateway's leased units
    /// and slots held for good. A retry finds the local hold settled
    /// ([`Self::settle_at`] settles the store's alone).
    async fn settle_split(
        &self,
        l: &QuotaLeases,
        id: &str,
        s: &Settlement,
        n: usize,
    ) -> Result<SettleOutcome, StoreError> {
        let void = matches!(s.actual, Actual::Void);
        let local = match l.settle_held(id, s) {
            HeldSettle::Done(o) => o,
            HeldSettle::Overflows(ends) => {
                self.end_overflows(ends).await?;
                l.settle(id, s)
            }
        };
        let store = self.inner.settle(id, &first_specs(s, n)).await?;
        Ok(match local {
            Some(o) => parts::settled(&[store, o], (!void).then_some(s.actual_tokens)),
            None => store,
        })
    }

    /// Extends split reservation `id`: the store's hold of its first `n`
    /// specs first (the tenant's, as the two-domain store asks its tenant
    /// domain first), then the local hold (from the leases, or its
    /// overflow in the store) by what the store granted. A smaller local
    /// grant leaves the tenant hold's surplus reserved until settlement
    /// refunds it; the deployment, whose budgets often refund nothing
    /// unused, never holds more than it was granted.
    async fn extend_split(
        &self,
        l: &QuotaLeases,
        id: &str,
        step: &Step,
        n: usize,
    ) -> Result<ExtendOutcome, StoreError> {
        let store = self.inner.extend(id, &first_steps(step, n)).await?;
        let Some(granted) = parts::granted(&store) else {
            return Ok(store);
        };
        let part = Step {
            tokens: granted,
            rates: step.rates.clone(),
        };
        match l.extend(id, &part).await {
            Some(Ok(o)) => Ok(o),
            Some(Err(call)) => self.overflow(l, id, call).await,
            // Its local hold is settled (a settlement raced the step).
            None => Ok(ExtendOutcome::AlreadySettled),
        }
    }

    /// Extends where the reservation is held.
    pub async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        if let Some(l) = self.leased(id) {
            if let Some(n) = l.split_at(id) {
                return Box::pin(self.extend_split(l, id, step, n)).await;
            }
            match l.extend(id, step).await {
                Some(Ok(o)) => return Ok(o),
                Some(Err(call)) => return self.overflow(l, id, call).await,
                None => {}
            }
        }
        if self.local.contains(id) {
            return self.fallback.extend(id, step).await;
        }
        self.inner.extend(id, step).await
    }

    /// An extension of leased reservation `id` its leases could not pay,
    /// made in the store (`quota_lease::local_hold`): past the deny cache
    /// (its refusal is the extension's answer) and the failure policy (a
    /// failed extension leaves the stream to its upstream cap).
    async fn overflow(
        &self,
        l: &QuotaLeases,
        id: &str,
        call: StoreStep,
    ) -> Result<ExtendOutcome, StoreError> {
        super::quota_lease::metrics::overflow();
        let store = self.inner.store();
        match call {
            StoreStep::Reserve(r) => {
                let tokens = r.costs.tokens;
                let o = store.reserve(&r).await;
                let admitted = match &o {
                    Ok(ReserveOutcome::Admitted(_)) => Some(true),
                    Ok(ReserveOutcome::Denied(_) | ReserveOutcome::Impossible(_)) => Some(false),
                    // Voided: a settlement voided it first; unknown: the call failed.
                    _ => None,
                };
                l.overflow_reserved(id, &r.id, admitted, tokens);
                match o? {
                    ReserveOutcome::Admitted(a) => Ok(ExtendOutcome::Extended {
                        granted: tokens,
                        now_micros: a.now_micros,
                    }),
                    ReserveOutcome::Voided => Ok(ExtendOutcome::AlreadySettled),
                    refused => Ok(super::quota_lease::exhausted(&refused, 0)
                        .map_or(ExtendOutcome::AlreadySettled, ExtendOutcome::Exhausted)),
                }
            }
            StoreStep::Extend { id: ov, step } => {
                let o = store.extend(&ov, &step).await?;
                if let ExtendOutcome::Extended { granted, .. } = o {
                    l.overflow_extended(id, granted);
                }
                Ok(o)
            }
        }
    }

    /// Settles the overflows of leased reservation `id` in the store
    /// (before its local hold: a failure leaves both to the retry).
    async fn settle_overflows(
        &self,
        l: &QuotaLeases,
        id: &str,
        s: &Settlement,
    ) -> Result<(), StoreError> {
        self.end_overflows(l.overflow_ends(id, s)).await
    }

    /// Settles or voids overflow reservations in the store.
    async fn end_overflows(&self, ends: Vec<OverflowEnd>) -> Result<(), StoreError> {
        let store = self.inner.store();
        for end in ends {
            match end {
                OverflowEnd::Settle(ov, s) => {
                    store.settle(&ov, &s).await?;
                }
                OverflowEnd::Void(ov, ttl) => {
                    store.void(&ov, ttl).await?;
                }
            }
        }
        Ok(())
    }

    /// Settles where the reservation is held (looked up: the lease book,
    /// the local limiter, the store, in order).
    pub async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        if let Some(l) = self.leased(id) {
            if let Some(n) = l.split_at(id) {
                return Box::pin(self.settle_split(l, id, s, n)).await;
            }
            self.settle_overflows(l, id, s).await?;
            if let Some(o) = l.settle(id, s) {
                return Ok(o);
            }
        }
        if self.local.contains(id) {
            return self.settle_local(id, s).await;
        }
        self.inner.settle(id, s).await
    }

    /// Settles a reservation `at` the layer that admitted it, without
    /// asking the others: a hold of the store or of the local limiter
    /// never touches the lease book, a lease's takes its lock once (twice
    /// more when it has overflows to settle in the store).
    pub async fn settle_at(
        &self,
        at: AnsweredBy,
        id: &str,
        s: &Settlement,
    ) -> Result<SettleOutcome, StoreError> {
        match (at, &self.leases) {
            (AnsweredBy::Lease, Some(l)) => {
                match l.settle_held(id, s) {
                    HeldSettle::Done(Some(o)) => return Ok(o),
                    HeldSettle::Done(None) => {}
                    HeldSettle::Overflows(ends) => {
                        self.end_overflows(ends).await?;
                        if let Some(o) = l.settle(id, s) {
                            return Ok(o);
                        }
                    }
                }
                self.inner.settle(id, s).await
            }
            (AnsweredBy::Split, Some(l)) => match l.split_at(id) {
                Some(n) => Box::pin(self.settle_split(l, id, s, n)).await,
                // Its local hold is settled: the store's is what is left.
                None => self.inner.settle(id, s).await,
            },
            (AnsweredBy::LocalLimiter, _) if self.local.contains(id) => {
                self.settle_local(id, s).await
            }
            _ => self.inner.settle(id, s).await,
        }
    }

    /// Settles a reservation of the local limiter, and in the store too
    /// when its store reservation's outcome was unknown.
    async fn settle_local(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        let o = self.fallback.settle(id, s).await;
        if o.is_ok() {
            self.local.remove(id);
            if let Some(ttl) = self.lost_reply(id) {
                self.compensate(id, Compensation::Settle(s.clone()), ttl);
            }
        }
        o
    }

    /// Extends a reservation `at` the layer that admitted it (see
    /// [`Self::settle_at`]).
    pub async fn extend_at(
        &self,
        at: AnsweredBy,
        id: &str,
        step: &Step,
    ) -> Result<ExtendOutcome, StoreError> {
        match (at, &self.leases) {
            (AnsweredBy::Lease, Some(l)) => match l.extend(id, step).await {
                Some(Ok(o)) => Ok(o),
                Some(Err(call)) => self.overflow(l, id, call).await,
                None => self.inner.extend(id, step).await,
            },
            (AnsweredBy::Split, Some(l)) => match l.split_at(id) {
                Some(n) => Box::pin(self.extend_split(l, id, step, n)).await,
                None => Ok(ExtendOutcome::AlreadySettled),
            },
            (AnsweredBy::LocalLimiter, _) if self.local.contains(id) => {
                self.fallback.extend(id, step).await
            }
            _ => self.inner.extend(id, step).await,
        }
    }

    /// Where the slots of a reservation admitted `at` a layer are renewed:
    /// the store, the local limiter, or this store (whose renewal asks the
    /// lease book once).
    pub fn renewal_store(self: &Arc<Self>, at: AnsweredBy) -> Arc<dyn BudgetStore> {
        match at {
            AnsweredBy::Lease if self.leases.is_some() => self.clone(),
            // Leases hold no slots past their own life: the store's hold
            // has the slots to renew.
            AnsweredBy::Split => self.inner.store().clone(),
            AnsweredBy::LocalLimiter => self.fallback.clone(),
            _ => self.inner.store().clone(),
        }
    }

    /// Reads budgets from the store.
    pub async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        BudgetStore::inspect(&self.inner, specs).await
    }

    /// Lowers a token bucket in the store (see [`BudgetStore::lower`]).
    pub async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        BudgetStore::lower(&self.inner, spec, at_most).await
    }
}

/// A reservation whose store call is under way. When the caller's future
/// is dropped before the store answers (the client reset its connection),
/// the call may still apply, with nobody left to settle it: on drop, the
/// id is voided as a lost reply's is ([`super::compensate`]). The guard is
/// a flag on the request's own future; a task is spawned only for a call
/// that was cut off.
struct InFlight<'a> {
    store: &'a GatewayStore,
    r: &'a ReserveRequest,
    answered: bool,
}

impl InFlight<'_> {
    fn answered<T>(mut self, answer: T) -> T {
        self.answered = true;
        answer
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Outside a runtime only at process exit: the hold then expires.
        if self.answered || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        tracing::debug!(reservation_id = %self.r.id, tenant = %self.r.requester.tenant, "reservation cut off by its request's end; voiding it");
        let ttl = Duration::from_micros(self.r.hold_ttl_micros);
        self.store.compensate(&self.r.id, Compensation::Void, ttl);
    }
}

/// The local hold of a split reservation while its store part is
/// decided: voided on drop unless kept (the store did not admit, or the
/// request's future was dropped mid-call).
struct LocalPart<'a> {
    leases: &'a QuotaLeases,
    id: &'a str,
    kept: bool,
}

impl LocalPart<'_> {
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for LocalPart<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.leases.void_local(self.id);
        }
    }
}

/// `s` for the first `n` specs of a hold (a split reservation's store part).
fn first_specs(s: &Settlement, n: usize) -> Settlement {
    Settlement {
        actual_tokens: s.actual_tokens,
        upstream_failed: s.upstream_failed,
        actual: match &s.actual {
            Actual::PerSpec(a) => Actual::PerSpec(a[..n.min(a.len())].to_vec()),
            other => other.clone(),
        },
    }
}

/// `step` for the first `n` specs of a hold.
fn first_steps(step: &Step, n: usize) -> Step {
    Step {
        tokens: step.tokens,
        rates: step.rates[..n.min(step.rates.len())].to_vec(),
    }
}

/// The same reservation scaled to this gateway's share of every budget.
fn scaled(req: &ReserveRequest, share: f64) -> ReserveRequest {
    let scale = |v: u64| ((v as f64 * share).floor() as u64).max(1);
    let shrink = |s: &BudgetSpec| {
        let mut s = s.clone();
        s.kind = match s.kind {
            BudgetKind::Bucket { per_minute, burst } => BudgetKind::Bucket {
                per_minute: scale(per_minute),
                burst: scale(burst),
            },
            BudgetKind::Quota { limit, window } => BudgetKind::Quota {
                limit: scale(limit),
                window,
            },
            BudgetKind::Concurrency { max } => BudgetKind::Concurrency { max: scale(max) },
        };
        s
    };
    ReserveRequest {
        share: None,
        common: req.common.iter().map(shrink).collect(),
        candidates: req
            .candidates
            .iter()
            .map(|c| c.iter().map(shrink).collect())
            .collect(),
        ..req.clone()
    }
}

#[async_trait]
impl BudgetStore for GatewayStore {
    async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        GatewayStore::reserve(self, r).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        GatewayStore::extend(self, id, step).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        // One lock of the book: its renewal looks the hold up itself (a
        // split's answers `None`: its slots are its store hold's).
        if let Some(o) = self.leases.as_ref().and_then(|l| l.renew(id)) {
            return Ok(o);
        }
        if self.local.contains(id) {
            return self.fallback.renew(id).await;
        }
        self.inner.renew(id).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        GatewayStore::settle(self, id, s).await
    }
    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        let void = Settlement {
            actual_tokens: 0,
            upstream_failed: true,
            actual: crate::budget::Actual::Void,
        };
        if let Some(l) = self.leased(id) {
            if l.split_at(id).is_some() {
                // The local hold first, as a settlement (`settle_split`).
                self.settle_overflows(l, id, &void).await?;
                let local = l.settle(id, &void);
                let o = self.inner.void(id, hold_ttl_micros).await?;
                return Ok(match local {
                    Some(local) => parts::settled(&[o, local], None),
                    None => o,
                });
            }
            self.settle_overflows(l, id, &void).await?;
            if let Some(o) = l.settle(id, &void) {
                return Ok(o);
            }
        }
        if self.local.contains(id) {
            let o = self.fallback.void(id, hold_ttl_micros).await;
            if o.is_ok() {
                self.local.remove(id);
                if let Some(ttl) = self.lost_reply(id) {
                    self.compensate(id, Compensation::Void, ttl);
                }
            }
            return o;
        }
        self.inner.void(id, hold_ttl_micros).await
    }
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        GatewayStore::inspect(self, specs).await
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
        GatewayStore::lower(self, spec, at_most).await
    }
    fn times_out_calls(&self) -> bool {
        self.inner.times_out_calls()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Costs, Requester, Scope};
    use crate::clock::ManualClock;

    fn request(id: &str, key: &str) -> ReserveRequest {
        let spec = BudgetSpec {
            scope: Scope::Tenant("t".into()),
            name: crate::budget::BudgetName::Rpm,
            kind: BudgetKind::Bucket {
                per_minute: 10,
                burst: 10,
            },
            key: key.into(),
            refund_unused: true,
            shadow: false,
        };
        ReserveRequest {
            share: None,
            id: id.into(),
            costs: Costs::tokens(1),
            common: vec![spec],
            candidates: Vec::new(),
            slot_lease_micros: 1_000_000,
            hold_ttl_micros: 1_000_000,
            requester: Arc::new(Requester {
                tenant: "t".into(),
                policy_version: "v".into(),
                on_store_error: OnStoreError::FailOpen,
                run: None,
            }),
        }
    }

    /// Fault: the local limiter kept a budget per end user seen during an
    /// outage, without bound.
    #[test]
    fn the_limiter_keeps_state_for_its_most_recent_budgets_only() {
        let limiter = MemoryStore::new(Arc::new(ManualClock::new(1_000_000)));
        let tracked = Tracked::new(2);
        for (i, key) in ["a", "b", "a", "c"].into_iter().enumerate() {
            let r = request(&format!("r{i}"), key);
            tracked.touch(&r, &limiter);
            assert!(matches!(
                limiter.reserve_sync(&r),
                ReserveOutcome::Admitted(_)
            ));
        }
        // `b` was the least recently reserved when `c` came: forgotten.
        assert_eq!(limiter.budget_entries(), 2);
        let state = |key: &str| limiter.inspect_sync(&request("x", key).common)[0].remaining;
        assert_eq!(state("a"), 8);
        assert_eq!(state("c"), 9);
        assert_eq!(state("b"), 10, "starts full again");
    }

    /// A store that applies a reservation at once and never answers: the
    /// reply a reset connection never waits for.
    struct Unanswered(Arc<MemoryStore>);

    #[async_trait]
    impl BudgetStore for Unanswered {
        async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
            self.0.reserve_sync(r);
            std::future::pending().await
        }
        async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
            self.0.extend(id, step).await
        }
        async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
            self.0.renew(id).await
        }
        async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
            self.0.settle(id, s).await
        }
        async fn void(&self, id: &str, ttl: u64) -> Result<SettleOutcome, StoreError> {
            self.0.void(id, ttl).await
        }
        async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
            self.0.inspect(specs).await
        }
        async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
            self.0.lower(spec, at_most).await
        }
    }

    /// Fault: a request whose connection was reset while its reservation
    /// was in the store kept what the store applied (its slot until the
    /// lease ran out, its tokens for good).
    #[tokio::test]
    async fn a_reservation_cut_off_before_its_reply_is_voided() {
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(ManualClock::new(1_000_000));
        let applied = Arc::new(MemoryStore::new(clock.clone()));
        let store = GatewayStore::new(
            DenyCachedStore::new(
                Arc::new(Unanswered(applied.clone())),
                Arc::new(crate::budget::deny_cache::DenyCache::new()),
                clock.clone(),
            ),
            Arc::new(MemoryStore::new(clock)),
            1.0,
        );
        let mut r = request("cut", "rpm");
        r.common.push(BudgetSpec {
            key: "slots".into(),
            name: crate::budget::BudgetName::MaxConcurrent,
            kind: BudgetKind::Concurrency { max: 1 },
            ..r.common[0].clone()
        });
        let left = || -> Vec<i64> {
            applied
                .inspect_sync(&r.common)
                .iter()
                .map(|s| s.remaining)
                .collect()
        };
        // The request's future ends while the store call is under way.
        let cut = tokio::time::timeout(Duration::from_millis(20), store.reserve(&r)).await;
        assert!(cut.is_err(), "no answer");
        assert_eq!(left(), vec![9, 0], "applied in the store");
        while store.compensator.pending() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(left(), vec![10, 1], "voided: every budget back");
        assert_eq!(
            applied.reserve_sync(&r),
            ReserveOutcome::Voided,
            "a late copy writes nothing"
        );
    }

    /// A store that is down: every call fails before it is sent.
    struct Down;

    #[async_trait]
    impl BudgetStore for Down {
        async fn reserve(&self, _: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
        async fn extend(&self, _: &str, _: &Step) -> Result<ExtendOutcome, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
        async fn renew(&self, _: &str) -> Result<RenewOutcome, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
        async fn settle(&self, _: &str, _: &Settlement) -> Result<SettleOutcome, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
        async fn void(&self, _: &str, _: u64) -> Result<SettleOutcome, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
        async fn inspect(&self, _: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
        async fn lower(&self, _: &BudgetSpec, _: u64) -> Result<i64, StoreError> {
            Err(StoreError::NotSent("down".into()))
        }
    }

    /// Fault: with two requests in flight through the store on a budget of
    /// two slots, a store stall let the local limiter admit two more.
    #[tokio::test]
    async fn the_limiter_counts_the_slots_the_gateways_requests_hold_in_the_store() {
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(ManualClock::new(1_000_000));
        let tracker = SettlementTracker::default();
        let store = GatewayStore::new(
            DenyCachedStore::new(
                Arc::new(Down),
                Arc::new(crate::budget::deny_cache::DenyCache::new()),
                clock.clone(),
            ),
            Arc::new(MemoryStore::new(clock)),
            1.0,
        )
        .counting_live(&tracker);
        let slots = BudgetSpec {
            key: "slots".into(),
            scope: Scope::Tenant("t".into()),
            name: BudgetName::MaxConcurrent,
            kind: BudgetKind::Concurrency { max: 2 },
            refund_unused: true,
            shadow: false,
        };
        let asking = |id: &str| ReserveRequest {
            common: vec![slots.clone()],
            ..request(id, "rpm")
        };
        // One request in flight through the store, one of the limiter's own.
        let renewer = tracker.slot_renewer();
        let lease = Duration::from_secs(30);
        let in_store = renewer.register("s1", Arc::new(Down), lease, vec![slots.key.clone()]);
        let admitted = store.reserve(&asking("local-1")).await.expect("limiter");
        assert!(
            matches!(admitted, ReserveOutcome::Admitted(_)),
            "{admitted:?}"
        );
        let ReserveOutcome::Denied(d) = store.reserve(&asking("local-2")).await.expect("limiter")
        else {
            panic!("a third request on two slots");
        };
        assert_eq!(
            (d.name, d.limit, d.available),
            (BudgetName::MaxConcurrent, 2, 0)
        );
        // The store's request ends: its slot is the limiter's again.
        drop(in_store);
        let admitted = store.reserve(&asking("local-3")).await.expect("limiter");
        assert!(
            matches!(admitted, ReserveOutcome::Admitted(_)),
            "{admitted:?}"
        );
    }
}
