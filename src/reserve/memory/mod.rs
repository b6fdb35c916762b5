//! The in-process store: exact within one process, the embedded default and
//! the fail-open fallback. One mutex guards all state, so every operation is
//! atomic, like one Lua script call in the Redis store.
//!
//! - `state`: the maps under the lock, and the checks and debits of a reservation.
//! - `tombstones`: settled holds, kept as long as their holds would have lived.
//! - [`snapshot`]: the embedded default's persistence across restarts.

pub mod snapshot;
mod state;
mod tombstones;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    Admission, BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, Denial, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement, Step,
    StoreError,
};
use crate::clock::Clock;
use crate::reserve::bucket::MAX_LIMIT;
use state::{store_at, Check, Inner, QuotaState};
use tombstones::Tombstone;

/// In-process [`BudgetStore`]. Time comes from the injected [`Clock`].
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    inner: Arc<Mutex<Inner>>,
    /// Set when the store persists its state ([`MemoryStore::persistent`]).
    snapshots: Option<Arc<snapshot::Snapshotter>>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            inner: Arc::default(),
            snapshots: None,
        }
    }

    /// A store that restores its state from `path` (if the file exists)
    /// and writes it there every second; call [`Self::finish_snapshots`]
    /// at shutdown. Fails when another process holds `path`, or the file
    /// cannot be read.
    pub fn persistent(clock: Arc<dyn Clock>, path: &std::path::Path) -> Result<Self, String> {
        let inner: Arc<Mutex<Inner>> = Arc::default();
        let snapshots = snapshot::Snapshotter::start(path, inner.clone(), clock.clone())?;
        Ok(Self {
            clock,
            inner,
            snapshots: Some(snapshots),
        })
    }

    /// Stops the periodic snapshots and writes the final one (no-op for a
    /// store that does not persist). Returns false when that write failed.
    pub fn finish_snapshots(&self) -> bool {
        self.snapshots.as_ref().is_none_or(|s| s.finish())
    }

    /// Number of live (unsettled, unexpired) holds; used by tests to wait
    /// for settlement.
    pub fn live_holds(&self) -> usize {
        let now = self.clock.now_micros();
        self.lock()
            .holds
            .values()
            .filter(|h| h.expires_at > now)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied
        // decision (checks happen before writes), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Synchronous core of [`BudgetStore::reserve`].
    pub fn reserve_sync(&self, req: &ReserveRequest) -> ReserveOutcome {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        inner.tick(now);
        if let Some(hold) = inner.holds.get(&req.id) {
            if hold.expires_at > now {
                let mut admission = hold.admission.clone();
                admission.replayed = true;
                return ReserveOutcome::Admitted(admission);
            }
        } else if let Some(t) = inner.settled.get(&req.id, now) {
            if t.voided {
                // Compensated before it arrived (or after): never admitted.
                return ReserveOutcome::Voided;
            }
            // Settled: the first admission, without budget states (they
            // changed since; like the Redis tombstone).
            return ReserveOutcome::Admitted(Admission {
                now_micros: t.now_micros,
                candidate: t.candidate,
                budgets: Vec::new(),
                replayed: true,
                would_deny: Vec::new(),
            });
        }
        match inner.check_all(&req.common, req, now) {
            Check::Ok => {}
            Check::Denied(d) => {
                inner.adopt_policies(req, now);
                return ReserveOutcome::Denied(d);
            }
            Check::Impossible(i) => {
                inner.adopt_policies(req, now);
                return ReserveOutcome::Impossible(i);
            }
        }
        let mut chosen = None;
        let mut best_denial: Option<Denial> = None;
        let mut first_impossible: Option<Impossibility> = None;
        for (idx, cand) in req.candidates.iter().enumerate() {
            match inner.check_all(cand, req, now) {
                Check::Ok => {
                    chosen = Some(idx);
                    break;
                }
                Check::Denied(d) => {
                    if best_denial
                        .as_ref()
                        .is_none_or(|b| d.retry_after_micros < b.retry_after_micros)
                    {
                        best_denial = Some(d);
                    }
                }
                Check::Impossible(i) => {
                    first_impossible.get_or_insert(i);
                }
            }
        }
        let Some(candidate) = chosen else {
            if best_denial.is_some() || first_impossible.is_some() {
                inner.adopt_policies(req, now);
            }
            if let Some(d) = best_denial {
                return ReserveOutcome::Denied(d);
            }
            if let Some(i) = first_impossible {
                return ReserveOutcome::Impossible(i);
            }
            // No candidates at all: treat as an empty one.
            return inner.admit(req, &[], 0, now);
        };
        let cand = req.candidates[candidate].clone();
        inner.admit(req, &cand, candidate, now)
    }

    /// Synchronous core of [`BudgetStore::extend`].
    pub fn extend_sync(&self, id: &str, want: u64) -> ExtendOutcome {
        let want = want.min(MAX_LIMIT);
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        inner.tick(now);
        let Some(hold) = inner.holds.get(id) else {
            return match inner.settled.get(id, now) {
                Some(_) => ExtendOutcome::AlreadySettled,
                None => ExtendOutcome::Unknown,
            };
        };
        if hold.expires_at <= now {
            return ExtendOutcome::Unknown;
        }
        let specs: Vec<BudgetSpec> = hold
            .lines
            .iter()
            .filter(|l| l.spec.name.counts_tokens())
            .map(|l| l.spec.clone())
            .collect();
        let mut grant = want;
        let mut tightest: Option<(i64, &BudgetSpec)> = None;
        for spec in &specs {
            let avail = inner.available(spec, now);
            if tightest.is_none_or(|(a, _)| avail < a) {
                tightest = Some((avail, spec));
            }
            grant = grant.min(avail.max(0) as u64);
        }
        if grant == 0 && want > 0 {
            let (avail, spec) = tightest.expect("a zero grant needs a limiting budget");
            let state = inner.state_of(spec, now);
            let retry = inner.wait_for(spec, 1, now);
            return ExtendOutcome::Exhausted(Denial {
                scope: spec.scope.clone(),
                name: spec.name,
                limit: spec.limit(),
                requested: want,
                available: avail,
                retry_after_micros: retry,
                now_micros: now,
                state,
            });
        }
        let mut window_debits = Vec::with_capacity(specs.len());
        for spec in &specs {
            window_debits.push(inner.debit(spec, grant, now, id));
        }
        let hold = inner.holds.get_mut(id).expect("hold checked above");
        let mut wd = window_debits.into_iter();
        for line in hold
            .lines
            .iter_mut()
            .filter(|l| l.spec.name.counts_tokens())
        {
            if let Some(Some(w)) = wd.next() {
                line.debits.push((w, grant));
            }
        }
        hold.reserved_tokens += grant;
        ExtendOutcome::Extended {
            granted: grant,
            now_micros: now,
        }
    }

    /// Synchronous core of [`BudgetStore::renew`].
    pub fn renew_sync(&self, id: &str) -> RenewOutcome {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        inner.tick(now);
        let Some(hold) = inner.holds.get(id) else {
            return match inner.settled.get(id, now) {
                Some(_) => RenewOutcome::AlreadySettled,
                None => RenewOutcome::Unknown,
            };
        };
        if hold.expires_at <= now {
            return RenewOutcome::Unknown;
        }
        let until = now + hold.lease_micros;
        let keys: Vec<String> = hold
            .lines
            .iter()
            .filter(|l| matches!(l.spec.kind, BudgetKind::Concurrency { .. }))
            .map(|l| l.spec.key.clone())
            .collect();
        for key in keys {
            if let Some(lease) = inner.slots.get_mut(&key).and_then(|s| s.get_mut(id)) {
                // An expired lease stays expired: renewing it could exceed the limit.
                if *lease > now {
                    *lease = until;
                }
            }
        }
        RenewOutcome::Renewed {
            lease_until_micros: until,
        }
    }

    /// Synchronous core of [`BudgetStore::settle`].
    pub fn settle_sync(&self, id: &str, s: Settlement) -> SettleOutcome {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        inner.tick(now);
        match inner.holds.get(id) {
            Some(h) if h.expires_at > now => {}
            Some(_) => return SettleOutcome::Unknown,
            None => {
                return match inner.settled.get(id, now) {
                    Some(_) => SettleOutcome::AlreadySettled,
                    None => SettleOutcome::Unknown,
                };
            }
        }
        let Some(hold) = inner.holds.remove(id) else {
            return SettleOutcome::Unknown;
        };
        // Like the Redis tombstone: a settled hold answers (retried settles,
        // replayed reserves) as long as the hold would have lived, but keeps
        // neither its lines nor its budget states.
        inner.settled.insert(id, Tombstone::of(&hold, false), now);
        let reserved = hold.reserved_tokens;
        let lines: Vec<(BudgetSpec, Vec<(u64, u64)>)> =
            hold.lines.into_iter().map(|l| (l.spec, l.debits)).collect();
        // Counts beyond a single cost's bound are charged as that bound.
        let actual = s.actual_tokens.min(MAX_LIMIT);
        let unused = reserved.saturating_sub(actual);
        let debt = actual.saturating_sub(reserved);
        let mut refunded = 0;
        for (spec, debits) in &lines {
            match spec.kind {
                BudgetKind::Concurrency { .. } => {
                    if let Some(set) = inner.slots.get_mut(&spec.key) {
                        set.remove(id);
                    }
                }
                _ if !spec.name.counts_tokens() => {}
                BudgetKind::Bucket { per_minute, burst } => {
                    let refundable = spec.refund_unused || s.upstream_failed;
                    let mut b = inner.bucket(&spec.key, per_minute, burst, now);
                    if unused > 0 && refundable {
                        b.credit(unused);
                        refunded = unused;
                    }
                    if debt > 0 {
                        crate::metrics::debt_forgiven(b.debit(debt));
                    }
                    store_at(&mut inner.buckets, &spec.key, b);
                }
                BudgetKind::Quota { window, .. } => {
                    let refundable = spec.refund_unused || s.upstream_failed;
                    let w = window.id(now);
                    let q = inner.quota(&spec.key, w);
                    let mut used = q.used;
                    if unused > 0 && refundable {
                        let debited_here: u64 = debits
                            .iter()
                            .filter(|(dw, _)| *dw == w)
                            .map(|(_, a)| a)
                            .sum();
                        used = used.saturating_sub(unused.min(debited_here));
                        refunded = unused;
                    }
                    if debt > 0 {
                        used += debt;
                    }
                    store_at(&mut inner.quotas, &spec.key, QuotaState { window: w, used });
                }
            }
        }
        SettleOutcome::Settled {
            reserved,
            refunded,
            debt,
            now_micros: now,
        }
    }

    /// Synchronous core of [`BudgetStore::void`].
    pub fn void_sync(&self, id: &str, hold_ttl_micros: u64) -> SettleOutcome {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        inner.tick(now);
        let live = inner.holds.get(id).is_some_and(|h| h.expires_at > now);
        if !live {
            if inner.settled.get(id, now).is_some() {
                return SettleOutcome::AlreadySettled;
            }
            if hold_ttl_micros == 0 {
                return SettleOutcome::Unknown;
            }
            // No hold: a void tombstone, living as long as the hold would have.
            inner.holds.remove(id);
            let stone = Tombstone {
                expires_at: now.saturating_add(hold_ttl_micros),
                now_micros: now,
                candidate: 0,
                voided: true,
            };
            inner.settled.insert(id, stone, now);
            return SettleOutcome::Voided;
        }
        let Some(hold) = inner.holds.remove(id) else {
            return SettleOutcome::Unknown;
        };
        inner.settled.insert(id, Tombstone::of(&hold, true), now);
        let reserved = hold.reserved_tokens;
        for line in hold.lines {
            let spec = &line.spec;
            match spec.kind {
                BudgetKind::Concurrency { .. } => {
                    if let Some(set) = inner.slots.get_mut(&spec.key) {
                        set.remove(id);
                    }
                }
                BudgetKind::Bucket { per_minute, burst } => {
                    // Every token and request budget, refundable or not.
                    let amount = if spec.name.counts_tokens() {
                        reserved
                    } else {
                        spec.cost(reserved)
                    };
                    let mut b = inner.bucket(&spec.key, per_minute, burst, now);
                    b.credit(amount);
                    store_at(&mut inner.buckets, &spec.key, b);
                }
                BudgetKind::Quota { window, .. } => {
                    let w = window.id(now);
                    let here: u64 = line
                        .debits
                        .iter()
                        .filter(|(dw, _)| *dw == w)
                        .map(|(_, a)| a)
                        .sum();
                    let q = inner.quota(&spec.key, w);
                    let used = q.used.saturating_sub(here);
                    store_at(&mut inner.quotas, &spec.key, QuotaState { window: w, used });
                }
            }
        }
        SettleOutcome::Settled {
            reserved,
            refunded: reserved,
            debt: 0,
            now_micros: now,
        }
    }

    /// Synchronous core of [`BudgetStore::lower`].
    pub fn lower_sync(&self, spec: &BudgetSpec, at_most: u64) -> i64 {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        let BudgetKind::Bucket { per_minute, burst } = spec.kind else {
            return inner.available(spec, now);
        };
        let mut b = inner.bucket(&spec.key, per_minute, burst, now);
        let cap = crate::reserve::bucket::to_units(at_most);
        if b.level > cap {
            b.level = cap;
            store_at(&mut inner.buckets, &spec.key, b);
        }
        b.available()
    }

    /// Synchronous core of [`BudgetStore::inspect`].
    pub fn inspect_sync(&self, specs: &[BudgetSpec]) -> Vec<BudgetState> {
        let now = self.clock.now_micros();
        let inner = self.lock();
        specs.iter().map(|s| inner.state_of(s, now)).collect()
    }
}

#[async_trait]
impl BudgetStore for MemoryStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        Ok(self.reserve_sync(req))
    }

    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        Ok(self.extend_sync(id, step.tokens))
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        Ok(self.renew_sync(id))
    }

    async fn settle(&self, id: &str, settlement: &Settlement) -> Result<SettleOutcome, StoreError> {
        if settlement.actual == crate::reserve::Actual::Void {
            // Mode void of a hold; no tombstone for an id without one.
            return Ok(self.void_sync(id, 0));
        }
        Ok(self.settle_sync(id, settlement.as_v2()))
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        Ok(self.inspect_sync(specs))
    }

    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        Ok(self.void_sync(id, hold_ttl_micros))
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        Ok(self.lower_sync(spec, at_most))
    }
}

/// Names used only to keep `BudgetName` imported for docs of this module.
#[allow(dead_code)]
const _NAMES: [BudgetName; 1] = [BudgetName::Tpm];
