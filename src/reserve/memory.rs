//! The in-process store: exact within one process, the embedded default and
//! the fail-open fallback. One mutex guards all state, so every operation is
//! atomic, like one Lua script call in the Redis store.

// foldhash: these maps are looked up several times per request; their keys
// are config-derived budget keys and gateway-made reservation ids.
use foldhash::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::bucket::BucketState;
use super::{
    Admission, BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, Denial, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement,
    StoreError, WouldDeny,
};
use crate::clock::Clock;

/// Operations between sweeps of expired holds, leases and full idle buckets.
const SWEEP_EVERY: u64 = 4096;

/// In-process [`BudgetStore`]. Time comes from the injected [`Clock`].
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    buckets: HashMap<String, BucketState>,
    quotas: HashMap<String, QuotaState>,
    slots: HashMap<String, HashMap<String, u64>>,
    /// Live (unsettled) holds: as many as requests in flight.
    holds: HashMap<String, Hold>,
    /// Settled holds.
    settled: Tombstones,
    ops: u64,
}

/// Settled holds: what a retried settle (`AlreadySettled`) and a replayed
/// reserve need, ~40 bytes each instead of a whole hold. They must answer
/// as long as the hold would have lived (`hold_ttl`, 15 minutes by
/// default), which at thousands of requests per second is millions of
/// entries, so they are never scanned: entries go into `current`; once per
/// `period` (the longest remaining hold lifetime seen) `current` becomes
/// `previous` and the old `previous` is dropped whole. An entry is kept one
/// to two periods and answers only until its own expiry.
#[derive(Default)]
struct Tombstones {
    current: HashMap<Box<str>, Tombstone>,
    previous: HashMap<Box<str>, Tombstone>,
    rotated_at: u64,
    period: u64,
}

#[derive(Debug, Clone, Copy)]
struct Tombstone {
    expires_at: u64,
    /// The admission's store time and chosen candidate, for replays.
    now_micros: u64,
    candidate: usize,
}

impl Tombstones {
    /// The unexpired tombstone of `id`.
    fn get(&self, id: &str, now: u64) -> Option<Tombstone> {
        self.current
            .get(id)
            .or_else(|| self.previous.get(id))
            .copied()
            .filter(|t| t.expires_at > now)
    }

    fn insert(&mut self, id: &str, t: Tombstone, now: u64) {
        // An entry inserted now is dropped two rotations later, at least
        // `period` from now: the period covers its remaining lifetime.
        self.period = self.period.max(t.expires_at.saturating_sub(now));
        self.current.insert(id.into(), t);
    }

    fn rotate(&mut self, now: u64) {
        if now >= self.rotated_at.saturating_add(self.period) {
            let old = std::mem::replace(&mut self.previous, std::mem::take(&mut self.current));
            self.rotated_at = now;
            // Freeing millions of entries takes long: not under the store's lock.
            if old.len() > 10_000 {
                let dropped = std::thread::Builder::new()
                    .name("budgetgate-tombstones".into())
                    .spawn(move || drop(old));
                if let Err(e) = dropped {
                    tracing::warn!(error = %e, "could not free settled holds on a thread");
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct QuotaState {
    window: u64,
    used: u64,
}

struct Hold {
    lines: Vec<HoldLine>,
    reserved_tokens: u64,
    lease_micros: u64,
    expires_at: u64,
    admission: Admission,
}

struct HoldLine {
    spec: BudgetSpec,
    /// Quota debits as `(window id, tokens)`, so refunds go only to the window debited.
    debits: Vec<(u64, u64)>,
}

enum Check {
    Ok,
    Denied(Denial),
    Impossible(Impossibility),
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            inner: Mutex::new(Inner::default()),
        }
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
            Check::Denied(d) => return ReserveOutcome::Denied(d),
            Check::Impossible(i) => return ReserveOutcome::Impossible(i),
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
        let tombstone = Tombstone {
            expires_at: hold.expires_at,
            now_micros: hold.admission.now_micros,
            candidate: hold.admission.candidate,
        };
        inner.settled.insert(id, tombstone, now);
        let reserved = hold.reserved_tokens;
        let lines: Vec<(BudgetSpec, Vec<(u64, u64)>)> =
            hold.lines.into_iter().map(|l| (l.spec, l.debits)).collect();
        let actual = s.actual_tokens;
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
                        b.debit(debt);
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

    /// Synchronous core of [`BudgetStore::lower`].
    pub fn lower_sync(&self, spec: &BudgetSpec, at_most: u64) -> i64 {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        let BudgetKind::Bucket { per_minute, burst } = spec.kind else {
            return inner.available(spec, now);
        };
        let mut b = inner.bucket(&spec.key, per_minute, burst, now);
        let cap = at_most as i64 * super::bucket::UNITS_PER_TOKEN;
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

impl Inner {
    fn tick(&mut self, now: u64) {
        self.ops += 1;
        self.settled.rotate(now);
        if self.ops.is_multiple_of(SWEEP_EVERY) {
            self.holds.retain(|_, h| h.expires_at > now);
            for set in self.slots.values_mut() {
                set.retain(|_, lease| *lease > now);
            }
            self.slots.retain(|_, s| !s.is_empty());
            self.buckets.retain(|_, b| {
                let b = b.advance(b.per_minute, b.burst, now);
                !b.is_full()
            });
        }
    }

    fn bucket(&self, key: &str, per_minute: u64, burst: u64, now: u64) -> BucketState {
        match self.buckets.get(key) {
            Some(b) => b.advance(per_minute, burst, now),
            None => BucketState::full(per_minute, burst, now),
        }
    }

    fn quota(&self, key: &str, window: u64) -> QuotaState {
        match self.quotas.get(key) {
            Some(q) if q.window == window => *q,
            _ => QuotaState { window, used: 0 },
        }
    }

    fn live_slots(&self, key: &str, now: u64) -> u64 {
        self.slots
            .get(key)
            .map(|s| s.values().filter(|lease| **lease > now).count() as u64)
            .unwrap_or(0)
    }

    fn available(&self, spec: &BudgetSpec, now: u64) -> i64 {
        match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                self.bucket(&spec.key, per_minute, burst, now).available()
            }
            BudgetKind::Quota { limit, window } => {
                limit as i64 - self.quota(&spec.key, window.id(now)).used as i64
            }
            BudgetKind::Concurrency { max } => max as i64 - self.live_slots(&spec.key, now) as i64,
        }
    }

    fn wait_for(&self, spec: &BudgetSpec, cost: u64, now: u64) -> u64 {
        match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => self
                .bucket(&spec.key, per_minute, burst, now)
                .wait_for(cost),
            BudgetKind::Quota { window, .. } => window.end(now) - now,
            BudgetKind::Concurrency { .. } => 0,
        }
    }

    fn state_of(&self, spec: &BudgetSpec, now: u64) -> BudgetState {
        let (remaining, reset, window) = match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                let b = self.bucket(&spec.key, per_minute, burst, now);
                (b.available(), b.until_full(), None)
            }
            BudgetKind::Quota { limit, window } => {
                let q = self.quota(&spec.key, window.id(now));
                (
                    limit as i64 - q.used as i64,
                    window.end(now) - now,
                    Some(window),
                )
            }
            BudgetKind::Concurrency { max } => {
                (max as i64 - self.live_slots(&spec.key, now) as i64, 0, None)
            }
        };
        BudgetState {
            scope: spec.scope.clone(),
            name: spec.name,
            limit: spec.limit(),
            remaining,
            reset_micros: reset,
            window,
        }
    }

    fn check(&self, spec: &BudgetSpec, tokens: u64, id: &str, now: u64) -> Check {
        let cost = spec.cost(tokens);
        if !matches!(spec.kind, BudgetKind::Concurrency { .. }) && cost > spec.capacity() {
            return Check::Impossible(Impossibility {
                scope: spec.scope.clone(),
                name: spec.name,
                capacity: spec.capacity(),
                requested: cost,
            });
        }
        let available = self.available(spec, now);
        let fits = match spec.kind {
            BudgetKind::Concurrency { .. } => {
                // Only a live lease of this id counts: an expired one lingers
                // until the next sweep, and honouring it would make the
                // decision depend on sweep timing (and exceed the limit).
                available >= 1
                    || self
                        .slots
                        .get(&spec.key)
                        .and_then(|s| s.get(id))
                        .is_some_and(|lease| *lease > now)
            }
            _ => available >= cost as i64,
        };
        if fits {
            Check::Ok
        } else {
            Check::Denied(Denial {
                scope: spec.scope.clone(),
                name: spec.name,
                limit: spec.limit(),
                requested: cost,
                available,
                retry_after_micros: self.wait_for(spec, cost, now),
                now_micros: now,
                state: self.state_of(spec, now),
            })
        }
    }

    /// Checks every spec; an impossible budget wins over a denial, and among
    /// denials the longest wait (every budget must admit).
    fn check_all(&self, specs: &[BudgetSpec], req: &ReserveRequest, now: u64) -> Check {
        let mut worst: Option<Denial> = None;
        for spec in specs {
            if spec.shadow {
                // Evaluated again at admission; a shadow refusal never blocks.
                continue;
            }
            match self.check(spec, req.tokens, &req.id, now) {
                Check::Ok => {}
                Check::Impossible(i) => return Check::Impossible(i),
                Check::Denied(d) => {
                    if worst
                        .as_ref()
                        .is_none_or(|w| d.retry_after_micros > w.retry_after_micros)
                    {
                        worst = Some(d);
                    }
                }
            }
        }
        match worst {
            Some(d) => Check::Denied(d),
            None => Check::Ok,
        }
    }

    /// Debits `amount` (in the spec's unit) and returns the quota window debited, if any.
    fn debit(&mut self, spec: &BudgetSpec, amount: u64, now: u64, id: &str) -> Option<u64> {
        match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                let mut b = self.bucket(&spec.key, per_minute, burst, now);
                b.debit(amount);
                store_at(&mut self.buckets, &spec.key, b);
                None
            }
            BudgetKind::Quota { window, .. } => {
                let w = window.id(now);
                let mut q = self.quota(&spec.key, w);
                q.used += amount;
                store_at(&mut self.quotas, &spec.key, q);
                Some(w)
            }
            BudgetKind::Concurrency { .. } => {
                // The lease end is written by the caller, which knows the lease length.
                let _ = id;
                None
            }
        }
    }

    fn admit(
        &mut self,
        req: &ReserveRequest,
        cand: &[BudgetSpec],
        candidate: usize,
        now: u64,
    ) -> ReserveOutcome {
        let mut lines = Vec::with_capacity(req.common.len() + cand.len());
        let mut budgets = Vec::new();
        let mut would_deny = Vec::new();
        for spec in req.common.iter().chain(cand.iter()) {
            if spec.shadow && !matches!(self.check(spec, req.tokens, &req.id, now), Check::Ok) {
                would_deny.push(WouldDeny {
                    scope: spec.scope.clone(),
                    name: spec.name,
                });
                continue;
            }
            let cost = spec.cost(req.tokens);
            let window = self.debit(spec, cost, now, &req.id);
            if let BudgetKind::Concurrency { .. } = spec.kind {
                let lease_end = now + req.lease_micros;
                match self.slots.get_mut(spec.key.as_str()) {
                    Some(set) => {
                        set.insert(req.id.clone(), lease_end);
                    }
                    None => {
                        let set = HashMap::from_iter([(req.id.clone(), lease_end)]);
                        self.slots.insert(spec.key.clone(), set);
                    }
                }
            } else {
                budgets.push(self.state_of(spec, now));
            }
            lines.push(HoldLine {
                spec: spec.clone(),
                debits: window.map(|w| vec![(w, cost)]).unwrap_or_default(),
            });
        }
        let admission = Admission {
            now_micros: now,
            candidate,
            budgets,
            replayed: false,
            would_deny,
        };
        self.holds.insert(
            req.id.clone(),
            Hold {
                lines,
                reserved_tokens: req.tokens,
                lease_micros: req.lease_micros,
                expires_at: now + req.hold_ttl_micros,
                admission: admission.clone(),
            },
        );
        ReserveOutcome::Admitted(admission)
    }
}

/// Writes `v` at `key`, allocating the key only when it is new (every
/// reservation rewrites the same few budget keys).
fn store_at<V>(map: &mut HashMap<String, V>, key: &str, v: V) {
    match map.get_mut(key) {
        Some(slot) => *slot = v,
        None => {
            map.insert(key.to_owned(), v);
        }
    }
}

#[async_trait]
impl BudgetStore for MemoryStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        Ok(self.reserve_sync(req))
    }

    async fn extend(&self, id: &str, tokens: u64) -> Result<ExtendOutcome, StoreError> {
        Ok(self.extend_sync(id, tokens))
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        Ok(self.renew_sync(id))
    }

    async fn settle(&self, id: &str, settlement: Settlement) -> Result<SettleOutcome, StoreError> {
        Ok(self.settle_sync(id, settlement))
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        Ok(self.inspect_sync(specs))
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        Ok(self.lower_sync(spec, at_most))
    }
}

/// Names used only to keep `BudgetName` imported for docs of this module.
#[allow(dead_code)]
const _NAMES: [BudgetName; 1] = [BudgetName::Tpm];

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000;

    fn stone(expires_at: u64) -> Tombstone {
        Tombstone {
            expires_at,
            now_micros: 0,
            candidate: 0,
        }
    }

    #[test]
    fn a_tombstone_answers_until_its_expiry_across_rotations_then_is_freed() {
        let mut t = Tombstones::default();
        // Settled at minute 0 and minute 10, each hold living 15 minutes from
        // its admission (the second admitted at minute 5).
        t.insert("a", stone(15 * MIN), 0);
        t.rotate(10 * MIN);
        t.insert("b", stone(20 * MIN), 10 * MIN);
        for now in (0..15 * MIN).step_by(MIN as usize) {
            t.rotate(now);
            assert!(t.get("a", now).is_some(), "a at minute {}", now / MIN);
        }
        t.rotate(15 * MIN);
        assert!(t.get("a", 15 * MIN).is_none(), "expired");
        for now in (15 * MIN..20 * MIN).step_by(MIN as usize) {
            t.rotate(now);
            assert!(t.get("b", now).is_some(), "b at minute {}", now / MIN);
        }
        assert!(t.get("b", 20 * MIN).is_none());
        // Two periods with nothing settled: both generations are gone.
        t.rotate(40 * MIN);
        t.rotate(60 * MIN);
        assert_eq!(t.current.len() + t.previous.len(), 0);
    }
}
