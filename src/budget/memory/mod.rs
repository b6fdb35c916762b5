//! The in-process store: exact within one process, the embedded default and
//! the fail-open fallback. One mutex guards all state, so every operation is
//! atomic, like one Lua script call in the Redis store.
//!
//! - `state`: the maps under the lock, and the checks and debits of a reservation.
//! - `tombstones`: settled holds, kept as long as their holds would have lived.
//! - `lease`: quota leases (`budget::quota_lease`), next to the holds.
//! - `shares`: the share states of contended deployments (`budget::share`).
//! - [`snapshot`]: the embedded default's persistence across restarts.

mod quota_lease;
mod shares;
pub mod snapshot;
mod state;
mod tombstones;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    Actual, Admission, BudgetKind, BudgetSpec, BudgetState, BudgetStore, Denial, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement, Step,
    StoreError, MAX_RATE, RATE_ONE,
};
use crate::clock::Clock;
use crate::config::bounds::MAX_LIMIT;
use state::{store_at, Check, Inner};
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

    /// Number of budget entries held (bucket states, quota counters, slot
    /// sets, run records): per scope, so bounded by the sweeps however many
    /// end users and runs come and go. Holds and settled holds are per
    /// request, not counted.
    pub fn budget_entries(&self) -> usize {
        let inner = self.lock();
        inner.buckets.len()
            + inner.quotas.len()
            + inner.rolling.len()
            + inner.slots.len()
            + inner.runs.len()
            + inner.run_index.len()
    }

    /// The limits run record `key` holds now, if any (tests).
    pub fn run_record(&self, key: &str) -> Option<String> {
        let now = self.clock.now_micros();
        self.lock()
            .runs
            .get(key)
            .filter(|r| r.expires_at > now)
            .map(|r| r.limits.to_string())
    }

    /// Drops the bucket and quota state of budget `key` (it reads as full
    /// or unused again); its live slots stay. For a bounded local limiter
    /// (`admission::fail_open`).
    pub fn forget(&self, key: &str) {
        let mut inner = self.lock();
        inner.buckets.remove(key);
        inner.quotas.remove(key);
        inner.rolling.remove(key);
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
        // The run's record, compared or (absent) its start counted,
        // before any budget is checked (lua/reserve.lua).
        let run = req.requester.run.as_ref();
        let mut starts = None;
        if let Some(r) = run {
            match inner.runs.get(&*r.key).filter(|held| held.expires_at > now) {
                Some(held) if held.limits != r.limits => {
                    return ReserveOutcome::RunConflict(r.scope.clone())
                }
                Some(_) => {}
                None => {
                    if let Some(spec) = &r.starts {
                        match inner.check(spec, 1, &req.id, now) {
                            Check::Ok => starts = Some(spec),
                            Check::Denied(d) => return ReserveOutcome::Denied(d),
                            Check::Impossible(i) => return ReserveOutcome::Impossible(i),
                        }
                    }
                }
            }
        }
        let out = decide(&mut inner, req, now);
        if let (Some(r), ReserveOutcome::Admitted(_)) = (run, &out) {
            let held = state::RunState {
                limits: r.limits.clone(),
                expires_at: now.saturating_add(r.ttl_micros),
            };
            inner.runs.insert(r.key.to_string(), held);
            if let Some(spec) = starts {
                inner.debit(spec, 1, now, &req.id);
            }
            index_run(&mut inner, r, req.costs.tokens, now);
        }
        out
    }

    /// Synchronous core of [`BudgetStore::extend`]: grants the largest
    /// number of tokens ≤ `step.tokens` every amount line can pay for at its
    /// rate, debiting each `ceil(g × rate / RATE_ONE)` (lua/extend.lua).
    pub fn extend_sync(&self, id: &str, step: &Step) -> ExtendOutcome {
        let want = step.tokens.min(MAX_LIMIT);
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
        // (line index, spec, rate) of every amount line the step touches.
        let paying: Vec<(usize, BudgetSpec, u64)> = hold
            .lines
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                !l.spec.name.counts_requests()
                    && !matches!(l.spec.kind, BudgetKind::Concurrency { .. })
            })
            .map(|(i, l)| {
                let rate = if step.rates.is_empty() {
                    RATE_ONE
                } else {
                    step.rates.get(l.pos).copied().unwrap_or(0).min(MAX_RATE)
                };
                (i, l.spec.clone(), rate)
            })
            .filter(|(_, _, rate)| *rate > 0)
            .collect();
        // Counted at the stored policy: the hold's may be older (a reload
        // since), and writing it back would refill at the old rate.
        let paying: Vec<(usize, BudgetSpec, u64)> = paying
            .into_iter()
            .map(|(i, spec, rate)| (i, inner.at_stored_policy(&spec, now), rate))
            .collect();
        let mut grant = want;
        // The line granting least (the lowest available among equals, then the first).
        let mut tightest: Option<(u64, i64, &BudgetSpec, u64)> = None;
        for (_, spec, rate) in &paying {
            let avail = inner.available(spec, now);
            let cap = Step::grant(avail, *rate, want);
            if tightest.is_none_or(|(c, a, _, _)| cap < c || (cap == c && avail < a)) {
                tightest = Some((cap, avail, spec, *rate));
            }
            grant = grant.min(cap);
        }
        if grant == 0 && want > 0 {
            let (_, avail, spec, rate) = tightest.expect("a zero grant needs a limiting budget");
            let retry = inner.wait_for(spec, Step::debit(1, rate), now);
            let mut state = inner.refused_state(spec, retry, now);
            // The limit the hold was taken under, as the Redis store answers.
            let limit = hold
                .lines
                .iter()
                .find(|l| l.spec.key == spec.key)
                .map_or(spec.limit(), |l| l.spec.limit());
            state.limit = limit;
            return ExtendOutcome::Exhausted(Denial {
                held_for_share: false,
                scope: spec.scope.clone(),
                name: spec.name,
                limit,
                requested: want,
                available: avail,
                retry_after_micros: retry,
                now_micros: now,
                state,
            });
        }
        let mut debits = Vec::with_capacity(paying.len());
        for (i, spec, rate) in &paying {
            let amount = Step::debit(grant, *rate);
            if amount > 0 {
                debits.push((*i, amount, inner.debit(spec, amount, now, id)));
            }
        }
        let hold = inner.holds.get_mut(id).expect("hold checked above");
        for (i, amount, window) in debits {
            let line = &mut hold.lines[i];
            line.held += amount;
            if let Some(w) = window {
                line.debits.push((w, amount));
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
        let until = now + hold.slot_lease_micros;
        let keys: Vec<std::sync::Arc<str>> = hold
            .lines
            .iter()
            .filter(|l| matches!(l.spec.kind, BudgetKind::Concurrency { .. }))
            .map(|l| l.spec.key.clone())
            .collect();
        for key in keys {
            if let Some(lease) = inner.slots.get_mut(&*key).and_then(|s| s.get_mut(id)) {
                // An expired lease stays expired: renewing it could exceed the limit.
                if *lease > now {
                    *lease = until;
                }
            }
        }
        RenewOutcome::Renewed {
            slot_lease_until_micros: until,
        }
    }

    /// Synchronous core of [`BudgetStore::settle`]: each amount line is
    /// charged its own actual (lua/settle.lua).
    pub fn settle_sync(&self, id: &str, s: &Settlement) -> SettleOutcome {
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
        // Counts beyond a single cost's bound are charged as that bound.
        let actual = s.actual_tokens.min(MAX_LIMIT);
        let mut refunded_any = false;
        for line in &hold.lines {
            let used = match &s.actual {
                Actual::PerSpec(amounts) => amounts.get(line.pos).copied().unwrap_or(0),
                _ => actual,
            };
            refunded_any |= inner.settle_line(id, line, Some(used), s.upstream_failed, now);
        }
        SettleOutcome::Settled {
            reserved,
            refunded: if refunded_any {
                reserved.saturating_sub(actual)
            } else {
                0
            },
            debt: actual.saturating_sub(reserved),
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
        for line in &hold.lines {
            inner.settle_line(id, line, None, true, now);
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
        let cap = crate::budget::bucket::to_units(at_most);
        if b.level > cap {
            b.level = cap;
            store_at(&mut inner.buckets, &spec.key, b);
        }
        b.available()
    }

    /// Synchronous core of [`BudgetStore::runs_of`].
    pub fn runs_of_sync(
        &self,
        ks: &super::keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Vec<super::ListedRun> {
        let now = self.clock.now_micros();
        let inner = self.lock();
        let Some(index) = inner
            .run_index
            .get(&ks.run_index(tenant))
            .filter(|x| x.expires_at > now)
        else {
            return Vec::new();
        };
        let mut listed: Vec<(&Arc<str>, u64)> = index
            .runs
            .iter()
            .map(|(id, &(spent, _))| (id, spent))
            .collect();
        // Most first, the greater id first among equals (Redis ZREVRANGE).
        listed.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(a.0)));
        listed
            .into_iter()
            .filter_map(|(id, spent)| {
                let scope = super::Scope::Run(tenant.into(), id.clone());
                let record = inner
                    .runs
                    .get(&ks.run_record(&scope))
                    .filter(|r| r.expires_at > now)?;
                Some(super::ListedRun {
                    id: id.clone(),
                    spent,
                    limits: record.limits.clone(),
                })
            })
            .take(n)
            .collect()
    }

    /// Synchronous core of [`BudgetStore::holds_on`].
    pub fn holds_on_sync(&self, specs: &[BudgetSpec]) -> Vec<super::HeldOn> {
        let now = self.clock.now_micros();
        let inner = self.lock();
        let mut out = vec![super::HeldOn::default(); specs.len()];
        for (seen, (id, hold)) in inner.holds.iter().enumerate() {
            if seen >= super::HELD_ON_SCAN_MAX {
                out.iter_mut().for_each(|h| h.partial = true);
                break;
            }
            if hold.expires_at <= now {
                continue;
            }
            for line in &hold.lines {
                if let Some(i) = specs.iter().position(|s| s.key == line.spec.key) {
                    out[i].add(id, line.held);
                }
            }
        }
        out
    }

    /// Synchronous core of [`BudgetStore::slides`].
    pub fn slides_sync(&self, specs: &[BudgetSpec]) -> Vec<Option<crate::budget::Slide>> {
        let now = self.clock.now_micros();
        let inner = self.lock();
        specs
            .iter()
            .map(|s| match s.kind {
                BudgetKind::Quota { window, .. } if window.is_rolling() => inner
                    .rolling(&s.key)
                    .and_then(|r| r.next_slide(window, now))
                    .map(|(in_micros, units)| crate::budget::Slide { in_micros, units }),
                _ => None,
            })
            .collect()
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
        Ok(self.extend_sync(id, step))
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        Ok(self.renew_sync(id))
    }

    async fn settle(&self, id: &str, settlement: &Settlement) -> Result<SettleOutcome, StoreError> {
        if settlement.actual == crate::budget::Actual::Void {
            // Mode void of a hold; no tombstone for an id without one.
            return Ok(self.void_sync(id, 0));
        }
        Ok(self.settle_sync(id, settlement))
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        Ok(self.inspect_sync(specs))
    }

    async fn slides(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<Vec<Option<crate::budget::Slide>>, StoreError> {
        Ok(self.slides_sync(specs))
    }

    async fn holds_on(&self, specs: &[BudgetSpec]) -> Result<Vec<super::HeldOn>, StoreError> {
        Ok(self.holds_on_sync(specs))
    }

    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        Ok(self.void_sync(id, hold_ttl_micros))
    }

    async fn runs_of(
        &self,
        ks: &super::keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Result<Vec<super::ListedRun>, StoreError> {
        Ok(self.runs_of_sync(ks, tenant, n))
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        Ok(self.lower_sync(spec, at_most))
    }
}

/// True when some candidate costs a common spec differently from the first.
fn common_costs_differ(req: &ReserveRequest) -> bool {
    let cost = |c: usize, i: usize| req.costs.of(c, i, &req.common[i]);
    (1..req.candidates.len()).any(|c| (0..req.common.len()).any(|i| cost(c, i) != cost(0, i)))
}

/// An admission of run `r` of `tokens` in its tenant's index (as
/// lua/reserve.lua): runs whose record has expired leave it (a run started
/// again counts from 0), the run gains `tokens` and its record's expiry,
/// and beyond [`super::RUN_INDEX_MAX`] runs the least (the smaller id
/// first among equals: Redis' rank order) leave.
fn index_run(inner: &mut Inner, r: &super::RunRecord, tokens: u64, now: u64) {
    let super::Scope::Run(_, id) = &r.scope else {
        return;
    };
    let expires = now.saturating_add(r.ttl_micros);
    let index = inner.run_index.entry(r.index.to_string()).or_default();
    index.runs.retain(|_, &mut (_, e)| e > now);
    let entry = index.runs.entry(id.clone()).or_insert((0, 0));
    entry.0 = entry.0.saturating_add(tokens);
    entry.1 = expires;
    index.expires_at = expires;
    while index.runs.len() > super::RUN_INDEX_MAX {
        let least = index
            .runs
            .iter()
            .min_by(|a, b| a.1 .0.cmp(&b.1 .0).then_with(|| a.0.cmp(b.0)))
            .map(|(id, _)| id.clone());
        match least {
            Some(least) => index.runs.remove(&least),
            None => break,
        };
    }
}

/// The reservation's budgets decided (after its replay and its run's
/// record): common ones once when their costs are alike, else candidate
/// by candidate.
fn decide(inner: &mut Inner, req: &ReserveRequest, now: u64) -> ReserveOutcome {
    // Common costs alike for every candidate (the usual case): the
    // common specs are checked once, and their refusal is the answer.
    // Else, candidate by candidate, the first whose budgets admit
    // together with the common ones (costed for it) is chosen
    // (lua/reserve.lua).
    let n = req.common.len();
    let per_candidate_common = common_costs_differ(req);
    if !per_candidate_common {
        match inner.check_all(&req.common, req, (0, 0), None, now) {
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
    }
    if req.candidates.is_empty() {
        // No candidates at all: admit on the common budgets alone.
        return inner.admit(req, &[], 0, now);
    }
    let mut chosen = None;
    let mut best_denial: Option<Denial> = None;
    let mut first_impossible: Option<Impossibility> = None;
    // The candidates whose own budgets (or share) refused this claim.
    let mut contended: Vec<usize> = Vec::new();
    for idx in 0..req.candidates.len() {
        let before = if per_candidate_common {
            inner.check_all(&req.common, req, (idx, 0), None, now)
        } else {
            Check::Ok
        };
        let result = inner.check_candidate(req, (idx, n), before, &mut contended, now);
        match result {
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
        inner.adopt_policies(req, now);
        return match (best_denial, first_impossible) {
            (Some(d), _) => {
                inner.share_refused(req, &contended, now);
                ReserveOutcome::Denied(d)
            }
            (None, Some(i)) => ReserveOutcome::Impossible(i),
            // Every candidate refused, so one of the two is set.
            (None, None) => inner.admit(req, &[], 0, now),
        };
    };
    inner.share_admitted(req, candidate, now);
    inner.admit(req, &req.candidates[candidate], candidate, now)
}
