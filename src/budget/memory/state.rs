//! The store's state under its one lock, and the checks and debits a
//! reservation makes on it.

// foldhash: these maps are looked up several times per request; their keys
// are config-derived budget keys and gateway-made reservation ids.
use foldhash::HashMap;

use super::tombstones::Tombstones;
use crate::budget::bucket::BucketState;
use crate::budget::rolling::Rolling;
use crate::budget::share::ShareState;
use crate::budget::{
    Admission, BudgetKind, BudgetSpec, BudgetState, Denial, Impossibility, ReserveOutcome,
    ReserveRequest, Window, WouldDeny,
};
use crate::budget::{MAX_AMOUNT, MAX_COUNT};
use crate::config::bounds::MAX_LIMIT;

/// Operations between sweeps of expired holds, leases, full idle buckets
/// and past quota windows.
const SWEEP_EVERY: u64 = 4096;

/// Longest time between sweeps while the store is used at all, µs: a
/// quiet store (one whose end users went away) frees their state too.
const SWEEP_PERIOD: u64 = 60_000_000;

#[derive(Default)]
pub(super) struct Inner {
    pub(super) buckets: HashMap<String, BucketState>,
    pub(super) quotas: HashMap<String, QuotaState>,
    /// Rolling quotas (`budget::rolling`) and their windows, by budget key.
    pub(super) rolling: HashMap<String, (Window, Rolling)>,
    pub(super) slots: HashMap<String, HashMap<String, u64>>,
    /// Live (unsettled) holds: as many as requests in flight.
    pub(super) holds: HashMap<String, Hold>,
    /// Settled holds.
    pub(super) settled: Tombstones,
    /// Quota leases per budget key (`lease`).
    pub(super) leases: HashMap<String, super::quota_lease::BudgetLeases>,
    /// Share states of contended deployments, by share key (`budget::share`).
    pub(super) shares: HashMap<String, ShareState>,
    /// Run records by key (`budget::RunRecord`).
    pub(super) runs: HashMap<String, RunState>,
    /// Each tenant's index of active runs, by index key (`KeySpace::run_index`).
    pub(super) run_index: HashMap<String, RunIndex>,
    pub(super) ops: u64,
    /// Time of the last sweep, UTC µs.
    pub(super) swept_at: u64,
}

/// What a run started with, and until when its record lives.
pub(super) struct RunState {
    pub(super) limits: std::sync::Arc<str>,
    pub(super) expires_at: u64,
}

/// A tenant's active runs (lua/reserve.lua's two sorted sets): tokens
/// reserved and record expiry by run id, at most `RUN_INDEX_MAX`.
#[derive(Default)]
pub(super) struct RunIndex {
    pub(super) runs: HashMap<std::sync::Arc<str>, (u64, u64)>,
    /// The latest record expiry of its runs (the Redis keys' TTL).
    pub(super) expires_at: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct QuotaState {
    pub(super) window: u64,
    pub(super) used: u64,
    /// End of the window, UTC µs: the entry is swept from then on (its
    /// count would read as 0 anyway).
    pub(super) end: u64,
}

pub(super) struct Hold {
    pub(super) lines: Vec<HoldLine>,
    pub(super) reserved_tokens: u64,
    pub(super) slot_lease_micros: u64,
    pub(super) expires_at: u64,
    pub(super) admission: Admission,
}

pub(super) struct HoldLine {
    pub(super) spec: BudgetSpec,
    /// The spec's position among the reservation's specs (common, then the
    /// chosen candidate's): what extension rates and settled actuals are
    /// indexed by.
    pub(super) pos: usize,
    /// What the line holds in the spec's unit, reservation and extensions.
    pub(super) held: u64,
    /// Quota debits as `(window id, amount)`, so refunds go only to the window debited.
    pub(super) debits: Vec<(u64, u64)>,
}

pub(super) enum Check {
    Ok,
    Denied(Denial),
    Impossible(Impossibility),
}

impl Inner {
    pub(super) fn tick(&mut self, now: u64) {
        self.ops += 1;
        self.settled.rotate(now);
        if self.ops.is_multiple_of(SWEEP_EVERY) || now >= self.swept_at.saturating_add(SWEEP_PERIOD)
        {
            self.swept_at = now;
            self.quotas.retain(|_, q| q.end > now);
            // A rolling window whose last sub-bucket has left is empty.
            self.rolling.retain(|_, (w, r)| r.until_empty(*w, now) > 0);
            self.holds.retain(|_, h| h.expires_at > now);
            self.runs.retain(|_, r| r.expires_at > now);
            self.run_index.retain(|_, x| x.expires_at > now);
            super::quota_lease::sweep(&mut self.leases, now);
            self.shares.retain(|_, st| {
                st.live(now);
                !st.is_empty()
            });
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

    /// A refused reservation still brings every bucket it names under the
    /// request's policy, when the stored limit or burst differ (a reload
    /// changed them): refill up to now at the old rate, the new rate from
    /// now on. Without it a refused tenant's bucket would keep refilling at
    /// the old rate until some request is admitted, while the retry hints
    /// use the new one. Written once per bucket per policy change.
    pub(super) fn adopt_policies(&mut self, req: &ReserveRequest, now: u64) {
        for spec in req.common.iter().chain(req.candidates.iter().flatten()) {
            let BudgetKind::Bucket { per_minute, burst } = spec.kind else {
                continue;
            };
            if let Some(b) = self.buckets.get_mut(&*spec.key) {
                if (b.per_minute, b.burst) != (per_minute, burst) {
                    *b = b.advance(per_minute, burst, now);
                }
            }
        }
    }

    pub(super) fn bucket(&self, key: &str, per_minute: u64, burst: u64, now: u64) -> BucketState {
        match self.buckets.get(key) {
            Some(b) => b.advance(per_minute, burst, now),
            None => BucketState::full(per_minute, burst, now),
        }
    }

    /// The bucket at `key` brought to `now` under the policy it is stored
    /// with (`per_minute` and `burst` only when none is stored: full under
    /// them). For counts taken under a policy that a reload may have
    /// changed since (a settle, an extension, a lease's debt, give back or
    /// end): they change the level, never the policy, so the next
    /// reservation refills at the stored (new) rate (`lua/lib.lua`'s
    /// `bucket_stored`). A bucket full by now carries no state worth its
    /// policy (the Redis store's key may have expired already): it is
    /// brought under the given policy, as [`Self::bucket`] does.
    pub(super) fn stored_bucket(
        &self,
        key: &str,
        per_minute: u64,
        burst: u64,
        now: u64,
    ) -> BucketState {
        match self.buckets.get(key) {
            Some(b) => {
                let stored = b.advance(b.per_minute, b.burst, now);
                if stored.is_full() {
                    b.advance(per_minute, burst, now)
                } else {
                    stored
                }
            }
            None => BucketState::full(per_minute, burst, now),
        }
    }

    /// `spec` under the policy its bucket is stored with (other kinds, and
    /// a bucket with no state, as they are): what an extension of a hold
    /// taken under an older policy counts with ([`Self::stored_bucket`]).
    pub(super) fn at_stored_policy(&self, spec: &BudgetSpec, now: u64) -> BudgetSpec {
        let mut s = spec.clone();
        if let (BudgetKind::Bucket { .. }, Some(b)) = (spec.kind, self.buckets.get(&*spec.key)) {
            if !b.advance(b.per_minute, b.burst, now).is_full() {
                s.kind = BudgetKind::Bucket {
                    per_minute: b.per_minute,
                    burst: b.burst,
                };
            }
        }
        s
    }

    /// The counter of calendar or first-use quota `window` at `key` in
    /// force at `now` ([`Window::current`]): the stored one when it is of
    /// that window, else an empty one, its end set.
    pub(super) fn quota_at(&self, key: &str, window: Window, now: u64) -> QuotaState {
        let stored = self.quotas.get(key);
        let (id, end) = window.current(stored.map(|q| q.window), now);
        match stored {
            Some(q) if q.window == id => QuotaState { end, ..*q },
            _ => QuotaState {
                window: id,
                used: 0,
                end,
            },
        }
    }

    /// The rolling window at `key` (empty when absent), not yet advanced.
    pub(super) fn rolling(&self, key: &str) -> Option<&Rolling> {
        self.rolling.get(key).map(|(_, r)| r)
    }

    /// The rolling window at `key`, advanced to `now`, for a write.
    pub(super) fn rolling_mut(&mut self, key: &str, window: Window, now: u64) -> &mut Rolling {
        if !self.rolling.contains_key(key) {
            self.rolling
                .insert(key.to_owned(), (window, Rolling::default()));
        }
        // Present: inserted above if it was not.
        let (w, r) = self.rolling.get_mut(key).expect("inserted above");
        *w = window;
        r.advance(window, now);
        r
    }

    pub(super) fn live_slots(&self, key: &str, now: u64) -> u64 {
        self.slots
            .get(key)
            .map(|s| s.values().filter(|lease| **lease > now).count() as u64)
            .unwrap_or(0)
    }

    pub(super) fn available(&self, spec: &BudgetSpec, now: u64) -> i64 {
        match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                self.bucket(&spec.key, per_minute, burst, now).available()
            }
            BudgetKind::Quota { limit, window } if window.is_rolling() => {
                limit as i64
                    - self
                        .rolling(&spec.key)
                        .map_or(0, |r| r.used_at(window, now)) as i64
            }
            BudgetKind::Quota { limit, window } => {
                limit as i64 - self.quota_at(&spec.key, window, now).used as i64
            }
            BudgetKind::Concurrency { max } => max as i64 - self.live_slots(&spec.key, now) as i64,
        }
    }

    pub(super) fn wait_for(&self, spec: &BudgetSpec, cost: u64, now: u64) -> u64 {
        match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => self
                .bucket(&spec.key, per_minute, burst, now)
                .wait_for(cost, now),
            BudgetKind::Quota { limit, window } if window.is_rolling() => {
                self.rolling(&spec.key).map_or(0, |r| {
                    let need = r.used_at(window, now) as i64 + cost as i64 - limit as i64;
                    r.wait_for(window, now, need)
                })
            }
            BudgetKind::Quota { window, .. } => self.quota_at(&spec.key, window, now).end - now,
            BudgetKind::Concurrency { .. } => 0,
        }
    }

    pub(super) fn state_of(&self, spec: &BudgetSpec, now: u64) -> BudgetState {
        let (remaining, reset, window) = match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                let b = self.bucket(&spec.key, per_minute, burst, now);
                (b.available(), b.until_full(now), None)
            }
            BudgetKind::Quota { limit, window } if window.is_rolling() => {
                let r = self.rolling(&spec.key);
                (
                    limit as i64 - r.map_or(0, |r| r.used_at(window, now)) as i64,
                    r.map_or(0, |r| r.until_empty(window, now)),
                    Some(window),
                )
            }
            BudgetKind::Quota { limit, window } => {
                let q = self.quota_at(&spec.key, window, now);
                (limit as i64 - q.used as i64, q.end - now, Some(window))
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

    /// The state of `spec` refusing a request that fits in `retry` µs: a
    /// rolling window's reset is then that instant (when enough will have
    /// slid out for it, what `x-ratelimit-reset-*` say), not when it empties.
    pub(super) fn refused_state(&self, spec: &BudgetSpec, retry: u64, now: u64) -> BudgetState {
        let mut state = self.state_of(spec, now);
        if matches!(spec.kind, BudgetKind::Quota { window, .. } if window.is_rolling()) {
            state.reset_micros = retry;
        }
        state
    }

    pub(super) fn check(&self, spec: &BudgetSpec, cost: u64, id: &str, now: u64) -> Check {
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
                        .get(&*spec.key)
                        .and_then(|s| s.get(id))
                        .is_some_and(|lease| *lease > now)
            }
            _ => available >= cost as i64,
        };
        if fits {
            Check::Ok
        } else {
            let retry = self.wait_for(spec, cost, now);
            Check::Denied(Denial {
                held_for_share: false,
                scope: spec.scope.clone(),
                name: spec.name,
                limit: spec.limit(),
                requested: cost,
                available,
                retry_after_micros: retry,
                now_micros: now,
                state: self.refused_state(spec, retry, now),
            })
        }
    }

    /// Checks every spec of `specs` (at `first` onwards among candidate
    /// `candidate`'s specs, for their costs) after `worst`, the result of
    /// earlier specs; an impossible budget wins over a denial, and among
    /// denials the longest wait, the first of equals (every budget must admit).
    pub(super) fn check_all(
        &self,
        specs: &[BudgetSpec],
        req: &ReserveRequest,
        (candidate, first): (usize, usize),
        worst: Option<Denial>,
        now: u64,
    ) -> Check {
        let mut worst = worst;
        for (j, spec) in specs.iter().enumerate() {
            if spec.shadow {
                // Evaluated again at admission; a shadow refusal never blocks.
                continue;
            }
            let cost = req.costs.of(candidate, first + j, spec);
            match self.check(spec, cost, &req.id, now) {
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
    pub(super) fn debit(
        &mut self,
        spec: &BudgetSpec,
        amount: u64,
        now: u64,
        id: &str,
    ) -> Option<u64> {
        match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                let mut b = self.bucket(&spec.key, per_minute, burst, now);
                // Admitted amounts fit what is available: nothing passes the floor.
                b.debit(amount);
                store_at(&mut self.buckets, &spec.key, b);
                None
            }
            BudgetKind::Quota { window, .. } if window.is_rolling() => Some(
                self.rolling_mut(&spec.key, window, now)
                    .debit(window, now, amount),
            ),
            BudgetKind::Quota { window, .. } => {
                let mut q = self.quota_at(&spec.key, window, now);
                q.used += amount;
                store_at(&mut self.quotas, &spec.key, q);
                Some(q.window)
            }
            BudgetKind::Concurrency { .. } => {
                // The lease end is written by the caller, which knows the lease length.
                let _ = id;
                None
            }
        }
    }

    pub(super) fn admit(
        &mut self,
        req: &ReserveRequest,
        cand: &[BudgetSpec],
        candidate: usize,
        now: u64,
    ) -> ReserveOutcome {
        let mut lines = Vec::with_capacity(req.common.len() + cand.len());
        let mut budgets = Vec::with_capacity(lines.capacity());
        let mut would_deny = Vec::new();
        for (pos, spec) in req.common.iter().chain(cand.iter()).enumerate() {
            let cost = req.costs.of(candidate, pos, spec);
            if spec.shadow && !matches!(self.check(spec, cost, &req.id, now), Check::Ok) {
                would_deny.push(WouldDeny {
                    scope: spec.scope.clone(),
                    name: spec.name,
                });
                continue;
            }
            let window = self.debit(spec, cost, now, &req.id);
            if let BudgetKind::Concurrency { .. } = spec.kind {
                let lease_end = now + req.slot_lease_micros;
                match self.slots.get_mut(&*spec.key) {
                    Some(set) => {
                        set.insert(req.id.clone(), lease_end);
                    }
                    None => {
                        let set = HashMap::from_iter([(req.id.clone(), lease_end)]);
                        self.slots.insert(spec.key.to_string(), set);
                    }
                }
            } else {
                budgets.push(self.state_of(spec, now));
            }
            let held = match spec.kind {
                BudgetKind::Concurrency { .. } => 0,
                _ => cost,
            };
            lines.push(HoldLine {
                spec: spec.clone(),
                pos,
                held,
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
                reserved_tokens: req.costs.tokens,
                slot_lease_micros: req.slot_lease_micros,
                expires_at: now + req.hold_ttl_micros,
                admission: admission.clone(),
            },
        );
        ReserveOutcome::Admitted(admission)
    }
}

impl Inner {
    /// Settles one line of a hold with its actual `used` (`None`: a void,
    /// which gives back everything, refundable or not, request counts
    /// included): refunds what it held beyond `used` when refundable (a
    /// quota only to the current window's debits), charges what `used`
    /// exceeds as debt, frees its slot. True when something was refunded.
    pub(super) fn settle_line(
        &mut self,
        id: &str,
        line: &HoldLine,
        used: Option<u64>,
        failed: bool,
        now: u64,
    ) -> bool {
        let spec = &line.spec;
        let refundable = spec.refund_unused || failed;
        match spec.kind {
            BudgetKind::Concurrency { .. } => {
                if let Some(set) = self.slots.get_mut(&*spec.key) {
                    set.remove(id);
                }
                false
            }
            // Request budgets: only a void gives them back.
            _ if spec.name.counts_requests() && used.is_some() => false,
            BudgetKind::Bucket { per_minute, burst } => {
                let used = used.map_or(0, |u| u.min(MAX_LIMIT));
                // The hold's policy may be older than the bucket's.
                let mut b = self.stored_bucket(&spec.key, per_minute, burst, now);
                let refunded = used < line.held && refundable;
                if refunded {
                    b.credit(line.held - used);
                } else if used > line.held {
                    crate::budget::metrics::debt_forgiven(b.debit(used - line.held));
                }
                store_at(&mut self.buckets, &spec.key, b);
                refunded
            }
            BudgetKind::Quota { window, .. } if window.is_rolling() => {
                let used = used.map_or(0, |u| u.min(MAX_AMOUNT));
                let refunded = used < line.held && refundable;
                let r = self.rolling_mut(&spec.key, window, now);
                if refunded {
                    // Back to the sub-buckets the hold debited, newest first.
                    r.refund(window, now, &line.debits, line.held - used);
                } else if used > line.held {
                    r.debit(window, now, used - line.held);
                }
                refunded
            }
            BudgetKind::Quota { window, .. } => {
                let used = used.map_or(0, |u| u.min(MAX_AMOUNT));
                let q = self.quota_at(&spec.key, window, now);
                let (w, end) = (q.window, q.end);
                let mut count = q.used;
                let refunded = used < line.held && refundable;
                if refunded {
                    let here: u64 = line
                        .debits
                        .iter()
                        .filter(|(dw, _)| *dw == w)
                        .map(|(_, a)| a)
                        .sum();
                    count = count.saturating_sub((line.held - used).min(here));
                } else if used > line.held {
                    count = (count + (used - line.held)).min(MAX_COUNT);
                }
                // A settlement that charges nothing after a window from
                // first use ended must not start the next one.
                let starts_window = window.from_first_use().is_some()
                    && self.quotas.get(&*spec.key).is_none_or(|s| s.window != w);
                if count > 0 || !starts_window {
                    store_at(
                        &mut self.quotas,
                        &spec.key,
                        QuotaState {
                            window: w,
                            used: count,
                            end,
                        },
                    );
                }
                refunded
            }
        }
    }
}

/// Writes `v` at `key`, allocating the key only when it is new (every
/// reservation rewrites the same few budget keys).
pub(super) fn store_at<V>(map: &mut HashMap<String, V>, key: &str, v: V) {
    match map.get_mut(key) {
        Some(slot) => *slot = v,
        None => {
            map.insert(key.to_owned(), v);
        }
    }
}
