//! Local deny cache (DESIGN section 7): after the store refuses a request
//! because a tenant-side budget is empty, later requests that certainly
//! cannot fit are refused locally, without a store call, until they could.
//!
//! What is cached is an *upper bound* of the budget: for a bucket, the
//! level at the refusal derived from the store's exact retry time (buckets
//! refill in whole milliseconds, `bucket` module: the refused cost fits
//! after `ceil(retry / 1 ms)` credited milliseconds and not one earlier, so
//! the level was at most `cost − (ms − 1) × rate − 1` units, and the store
//! had accrued `ms × 1 ms − retry` of the current millisecond), growing by
//! the refill rate millisecond by millisecond exactly as the store's bucket
//! does; for a quota, what was left in the window. A request is refused locally only when its cost exceeds that
//! bound, so the cache never refuses what the store would admit — except
//! after a refund elsewhere (another gateway settling under its estimate),
//! which the cache cannot see: worst case, a tenant is refused until the
//! cached retry time although a refund freed room earlier. This gateway's
//! own refunds clear the entries of the budgets they credit
//! ([`DenyCache::forget`]). The cache never
//! admits anything, and concurrency refusals are never cached (a slot can
//! free at any moment). Upstream budgets are not cached: another deployment
//! may serve the request. An entry recorded under other limits (before a
//! reload) is dropped, and a request larger than the budget's capacity is
//! left to the store, which refuses it for good rather than with a wait.
//!
//! Bounded: at most `store.deny_cache_entries` budgets (default
//! [`DEFAULT_DENY_CACHE_ENTRIES`]) are remembered, the least recently used forgotten
//! first and counted (`budgetgate_deny_cache_evictions_total`); end users
//! make the number of budgets unbounded. Forgetting is always safe: the
//! store then answers.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;

use super::bucket::{ceil_div, to_units, MAX_WAIT_MS};
use super::{BudgetKind, BudgetName, BudgetSpec, Denial};
use crate::config::store::DEFAULT_DENY_CACHE_ENTRIES;

struct Entry {
    /// The budget's limits at the refusal: an entry recorded under other
    /// limits (before a reload) says nothing of the budget now.
    kind: BudgetKind,
    /// Time of the refusal, UTC µs.
    t0: u64,
    /// Upper bound of what was available at `t0`: units (1/60,000 token)
    /// for buckets, the budget's own unit for quotas.
    available_bound: i64,
    /// Refill, per minute (units per ms); 0 for quotas.
    rate: u64,
    /// Buckets: the time the store's bucket was refilled up to at `t0`
    /// (`t0` minus the part of a millisecond it had accrued), UTC µs.
    last0: u64,
    /// When the entry stops mattering (bucket full again / window reset), UTC µs.
    until: u64,
    denial: Denial,
    /// The reservation id of the refused request the entry was recorded
    /// from (a later local refusal names it: "why was this refused?").
    by: String,
}

/// Refusals known locally, by budget key.
pub struct DenyCache {
    entries: Mutex<LruCache<String, Entry>>,
}

impl Default for DenyCache {
    fn default() -> Self {
        Self::new()
    }
}

impl DenyCache {
    /// An empty cache of [`DEFAULT_DENY_CACHE_ENTRIES`].
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_DENY_CACHE_ENTRIES)
    }

    /// An empty cache remembering at most `entries` budgets (at least one).
    pub fn with_capacity(entries: usize) -> Self {
        Self {
            entries: Mutex::new(LruCache::new(
                NonZeroUsize::MIN.saturating_add(entries.saturating_sub(1)),
            )),
        }
    }

    /// Budgets remembered now.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remembers a store refusal of `spec` (the budget named by `denial`)
    /// taken at `now` (UTC µs). Concurrency and upstream refusals are ignored.
    pub fn record(&self, spec: &BudgetSpec, denial: &Denial, now: u64) {
        self.record_by(spec, denial, now, "")
    }

    /// [`Self::record`] of the refusal of reservation `by`.
    pub fn record_by(&self, spec: &BudgetSpec, denial: &Denial, now: u64, by: &str) {
        if spec.name == BudgetName::MaxConcurrent || spec.scope.is_upstream() {
            return;
        }
        let (bound, rate, last0, until) = match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => {
                let rate = per_minute as i64;
                let ms = denial.retry_after_micros.div_ceil(1000);
                let accrued = ms * 1000 - denial.retry_after_micros;
                let ms = (ms as i64).min(MAX_WAIT_MS);
                let bound = to_units(denial.requested) - (ms - 1).max(0) * rate - 1;
                let last0 = now.saturating_sub(accrued);
                let missing = (to_units(burst) - bound).max(0);
                let until = last0 + wait_micros(missing, rate);
                (bound, per_minute, last0, until)
            }
            // A rolling window's count changes only when a sub-bucket
            // leaves, at a sub-bucket's end (`budget::rolling`): a smaller
            // request may fit from there on, before this one's hint.
            BudgetKind::Quota { window, .. } if window.is_rolling() => {
                let until = (now + denial.retry_after_micros).min(window.end(now));
                (denial.available, 0, now, until)
            }
            BudgetKind::Quota { .. } => (denial.available, 0, now, now + denial.retry_after_micros),
            BudgetKind::Concurrency { .. } => return,
        };
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let pushed = e.push(
            spec.key.to_string(),
            Entry {
                kind: spec.kind,
                t0: now,
                available_bound: bound,
                rate,
                last0,
                until,
                denial: denial.clone(),
                by: by.to_string(),
            },
        );
        if pushed.is_some_and(|(k, _)| *k != *spec.key) {
            super::metrics::deny_cache_eviction();
        }
    }

    /// Drops what is known of the budgets `keys`: this gateway has just
    /// refunded tokens to them, so the bound recorded at the refusal may be
    /// too low (the cache must never refuse what the store would admit).
    pub fn forget(&self, keys: &[String]) {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if e.is_empty() {
            return;
        }
        for k in keys {
            e.pop(k);
        }
    }

    /// The store refusal the entry of budget `key` was recorded from: the
    /// refused reservation's id and when (UTC µs). Read after a local
    /// refusal, for its record; does not touch the entry's recency.
    pub fn origin(&self, key: &str) -> Option<(String, u64)> {
        let e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        e.peek(key).map(|entry| (entry.by.clone(), entry.t0))
    }

    /// A local refusal for a request costing `costs` (in order) on `specs`
    /// at `now`, when one of them certainly cannot fit; the refusal's wait
    /// is the time until it could.
    pub fn check(&self, specs: &[BudgetSpec], costs: &[u64], now: u64) -> Option<Denial> {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if e.is_empty() {
            return None;
        }
        let mut worst: Option<Denial> = None;
        for (spec, cost) in specs.iter().zip(costs) {
            let Some(entry) = e.get(&*spec.key) else {
                continue;
            };
            if now >= entry.until || now < entry.t0 || entry.kind != spec.kind {
                e.pop(&*spec.key);
                continue;
            }
            if *cost > spec.capacity() {
                // It can never fit: the store says so, without a retry hint.
                continue;
            }
            let cost = *cost as i64;
            let wait = if entry.rate > 0 {
                let credited_ms = ((now - entry.last0) / 1000).min(MAX_WAIT_MS as u64);
                let bound_units = entry.available_bound + credited_ms as i64 * entry.rate as i64;
                let need = to_units(cost as u64) - bound_units;
                if need <= 0 {
                    continue;
                }
                // As the store's wait: whole ms, less the part of the current one accrued.
                let into_ms = now - entry.last0 - credited_ms * 1000;
                wait_micros(need, entry.rate as i64)
                    .saturating_sub(into_ms)
                    .max(1)
            } else {
                if cost <= entry.available_bound {
                    continue;
                }
                entry.until - now
            };
            if worst.as_ref().is_none_or(|w| wait > w.retry_after_micros) {
                let mut d = entry.denial.clone();
                d.retry_after_micros = wait;
                d.requested = cost as u64;
                d.now_micros = now;
                worst = Some(d);
            }
        }
        worst
    }
}

/// Microseconds until `need` units refill at `rate` units per ms (whole
/// milliseconds, capped before the conversion).
fn wait_micros(need: i64, rate: i64) -> u64 {
    ceil_div(need, rate).clamp(0, MAX_WAIT_MS) as u64 * 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{BudgetState, Scope};

    fn spec(name: BudgetName, kind: BudgetKind) -> BudgetSpec {
        BudgetSpec {
            scope: Scope::Tenant("t".into()),
            name,
            kind,
            key: format!("k:{name}").into(),
            refund_unused: true,
            shadow: false,
        }
    }

    fn denial(name: BudgetName, available: i64, retry: u64) -> Denial {
        Denial {
            held_for_share: false,
            scope: Scope::Tenant("t".into()),
            name,
            limit: 60,
            requested: 1,
            available,
            retry_after_micros: retry,
            now_micros: 0,
            state: BudgetState {
                scope: Scope::Tenant("t".into()),
                name,
                limit: 60,
                remaining: available,
                reset_micros: 0,
                window: None,
            },
        }
    }

    /// Fault: one entry per refused end user, kept until each one's wait
    /// passed, without bound.
    #[test]
    fn a_full_cache_forgets_its_least_recently_used_budget() {
        let c = DenyCache::with_capacity(2);
        let quota = |key: &str| {
            let mut s = spec(
                BudgetName::TokensPerDay,
                BudgetKind::Quota {
                    limit: 100,
                    window: crate::budget::Window::Day,
                },
            );
            s.key = key.into();
            s
        };
        let (a, b, x) = (quota("a"), quota("b"), quota("x"));
        let d = denial(BudgetName::TokensPerDay, 0, 60_000_000);
        c.record(&a, &d, 0);
        c.record(&b, &d, 0);
        // `a` is used again, so `b` is the least recently used.
        assert!(c.check(std::slice::from_ref(&a), &[10], 1).is_some());
        c.record(&x, &d, 1);
        assert_eq!(c.len(), 2);
        assert!(c.check(std::slice::from_ref(&a), &[10], 2).is_some());
        assert!(c.check(std::slice::from_ref(&x), &[10], 2).is_some());
        assert!(
            c.check(std::slice::from_ref(&b), &[10], 2).is_none(),
            "forgotten: the store answers"
        );
    }

    #[test]
    fn tpm_refuses_locally_only_what_cannot_fit_even_after_refill() {
        let c = DenyCache::new();
        let tpm = spec(
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: 60,
                burst: 60,
            },
        );
        // 10 tokens refused with retry 9 s at 60/min (1 token per second): the level was ~1 token.
        let mut d = denial(BudgetName::Tpm, 1, 9_000_000);
        d.requested = 10;
        c.record(&tpm, &d, 0);
        let again = c
            .check(std::slice::from_ref(&tpm), &[10], 0)
            .expect("10 tokens cannot fit");
        assert_eq!(
            again.retry_after_micros, 9_000_000,
            "the store's exact wait"
        );
        assert!(c
            .check(std::slice::from_ref(&tpm), &[10], 8_999_999)
            .is_some());
        assert!(
            c.check(std::slice::from_ref(&tpm), &[1], 0).is_none(),
            "1 token might fit: ask the store"
        );
        assert!(
            c.check(std::slice::from_ref(&tpm), &[10], 9_000_000)
                .is_none(),
            "refilled enough by then"
        );
    }

    #[test]
    fn concurrency_and_upstream_refusals_are_never_cached() {
        let c = DenyCache::new();
        let conc = spec(
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max: 1 },
        );
        c.record(&conc, &denial(BudgetName::MaxConcurrent, 0, 0), 0);
        assert!(c.check(&[conc], &[1], 0).is_none());
        let mut up = spec(
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: 1,
                burst: 1,
            },
        );
        up.scope = Scope::Upstream("u".into());
        c.record(&up, &denial(BudgetName::Rpm, 0, 60_000_000), 0);
        assert!(c.check(&[up], &[1], 0).is_none());
    }

    #[test]
    fn exhausted_quota_refuses_until_the_window_resets() {
        let c = DenyCache::new();
        let q = spec(
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit: 100,
                window: crate::budget::Window::Day,
            },
        );
        c.record(&q, &denial(BudgetName::TokensPerDay, 5, 1_000), 0);
        assert_eq!(
            c.check(std::slice::from_ref(&q), &[6], 400)
                .unwrap()
                .retry_after_micros,
            600
        );
        assert!(c.check(std::slice::from_ref(&q), &[5], 400).is_none());
        assert!(c.check(std::slice::from_ref(&q), &[6], 1_000).is_none());
    }

    fn day_quota(limit: u64) -> BudgetSpec {
        spec(
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit,
                window: crate::budget::Window::Day,
            },
        )
    }

    /// A cache that saw a 100-token day quota refuse at t = 0 with 5 left
    /// and the window ending at t = 1,000 µs.
    fn refused_day_quota_100() -> DenyCache {
        let c = DenyCache::new();
        c.record(
            &day_quota(100),
            &denial(BudgetName::TokensPerDay, 5, 1_000),
            0,
        );
        c
    }

    #[test]
    fn an_entry_recorded_under_other_limits_is_dropped() {
        let c = refused_day_quota_100();
        assert!(c.check(&[day_quota(100)], &[6], 400).is_some());
        // A reload raised the quota: the same key, other limits.
        assert!(c.check(&[day_quota(5000)], &[6], 400).is_none());
        assert!(
            c.check(&[day_quota(100)], &[6], 400).is_none(),
            "dropped, not kept for the old limits"
        );
    }

    #[test]
    fn a_request_above_capacity_is_left_to_the_store() {
        let c = refused_day_quota_100();
        assert!(
            c.check(&[day_quota(100)], &[101], 400).is_none(),
            "the store refuses it for good, without a wait"
        );
        assert!(c.check(&[day_quota(100)], &[100], 400).is_some());
    }

    #[test]
    fn forget_drops_the_named_budgets_only() {
        let c = DenyCache::new();
        let tpd = day_quota(100);
        let rpm = spec(
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: 1,
                burst: 1,
            },
        );
        c.record(&tpd, &denial(BudgetName::TokensPerDay, 5, 1_000), 0);
        c.record(&rpm, &denial(BudgetName::Rpm, 0, 60_000_000), 0);
        c.forget(&[tpd.key.to_string()]);
        assert!(c.check(std::slice::from_ref(&tpd), &[6], 400).is_none());
        assert!(c.check(std::slice::from_ref(&rpm), &[1], 400).is_some());
    }
}
