//! A [`BudgetStore`] wrapper that bounds every call by a timeout, records
//! its latency and errors in metrics, and stops calling a failing store for
//! a short, growing back-off (a circuit breaker), so requests do not each pay
//! the timeout while the store is down. Recovery is automatic: the first
//! call after the back-off probes the store again.
//!
//! A busy store is not a failed one. At most [`MAX_IN_FLIGHT`] calls are
//! outstanding per wrapper and budget domain; the others wait their turn here (up to
//! [`QUEUE_WAIT`]), so a burst of a thousand requests is served at the
//! store's pace instead of timing out together in its queue (measured: 1,000
//! streams opened at once against one Redis timed out two thirds of their
//! reservations at the 50 ms timeout and the breaker then refused everything
//! for seconds). And a failure opens the breaker only when no call has
//! succeeded for [`ALIVE_WITHIN`]: while some calls still succeed, the store
//! is overloaded, not down, and each request keeps its own chance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::metrics;
use super::{
    BudgetSpec, BudgetState, BudgetStore, ExtendOutcome, RenewOutcome, ReserveOutcome,
    ReserveRequest, SettleOutcome, Settlement, Step, StoreError,
};

/// First back-off after a failure.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest back-off: once the store is back, calls reach it again within
/// this time (the store contract asks for one second after a Redis
/// restart; the connection itself is replaced before the first call).
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Most calls outstanding at once per wrapper (one per serving thread)
/// and budget domain.
pub const MAX_IN_FLIGHT: usize = 64;
/// Shortest a call waits for its turn before failing as a timeout (without
/// opening the breaker: the wait measures this gateway's load, not the
/// store). A longer store timeout lengthens the wait to match: an operator
/// who lets the store take 5 s has said a busy gateway may wait that long,
/// and a fixed second refused an overloaded debug gateway's burst with 503s
/// under a 5 s timeout (docs/ACCURACY.md).
pub const QUEUE_WAIT: Duration = Duration::from_secs(1);
/// A success this recent means the store is alive: failures do not open the breaker.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(1);

struct Breaker {
    open_until: Option<Instant>,
    backoff: Duration,
    last_success: Option<Instant>,
}

/// One domain's turns and breaker.
struct Lane {
    breaker: Mutex<Breaker>,
    turns: tokio::sync::Semaphore,
}

impl Lane {
    fn new() -> Self {
        Self {
            breaker: Mutex::new(Breaker {
                open_until: None,
                backoff: BACKOFF_START,
                last_success: None,
            }),
            turns: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        }
    }

    fn is_open(&self) -> bool {
        let b = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        b.open_until.is_some_and(|t| Instant::now() < t)
    }
}

/// Domains given lanes of their own at most; the calls of any further
/// domain share the store's own lane (a fleet has a domain per top-level
/// tenant and deployment group: thousands at most).
const MAX_LANES: usize = 4096;

/// Timeout + metrics + circuit breaker around another store.
///
/// Turns and breaker are per budget domain
/// ([`BudgetStore::domain_of_reservation`]): in the `tenant` layout a
/// primary that fails over takes only its own domains' calls out, and its
/// calls, waiting up to the timeout, hold only their own domain's turns
/// (DESIGN section 22). A store of one domain (the `single` layout, the
/// memory store) has the one lane it always had.
pub struct GuardedStore<S: ?Sized> {
    inner: std::sync::Arc<S>,
    timeout: Duration,
    /// The longer of [`QUEUE_WAIT`] and `timeout`.
    queue_wait: Duration,
    /// The store's own domain (domain 0).
    own: Lane,
    /// The other domains', made at their first call.
    lanes: Mutex<HashMap<u64, Arc<Lane>>>,
    call_metrics: metrics::StoreCallMetrics,
}

impl<S: BudgetStore + ?Sized> GuardedStore<S> {
    /// Wraps `inner`; each call fails with [`StoreError::Timeout`] after `timeout`.
    pub fn new(inner: Arc<S>, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            queue_wait: timeout.max(QUEUE_WAIT),
            own: Lane::new(),
            lanes: Mutex::new(HashMap::new()),
            call_metrics: metrics::StoreCallMetrics::new(),
        }
    }

    /// True while the breaker keeps calls of the store's own domain (every
    /// call of a store of one domain) away from the store.
    pub fn is_open(&self) -> bool {
        self.own.is_open()
    }

    /// True while the breaker of `domain` keeps its calls away from the store.
    pub fn is_open_in(&self, domain: u64) -> bool {
        if domain == 0 {
            return self.own.is_open();
        }
        let lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.get(&domain).is_some_and(|l| l.is_open())
    }

    /// The lane of `domain` other than the store's own (`None`: past
    /// [`MAX_LANES`], the own lane).
    fn lane(&self, domain: u64) -> Option<Arc<Lane>> {
        // Lanes are never removed: a panic mid-insert loses nothing held.
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = lanes.get(&domain) {
            return Some(l.clone());
        }
        if lanes.len() >= MAX_LANES {
            return None;
        }
        let l = Arc::new(Lane::new());
        lanes.insert(domain, l.clone());
        Some(l)
    }

    async fn call<T, F>(&self, op: &'static str, domain: u64, fut: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let other = if domain == 0 { None } else { self.lane(domain) };
        let lane = other.as_deref().unwrap_or(&self.own);
        if lane.is_open() {
            metrics::store_call(op, 0.0, false);
            return Err(StoreError::NotSent(
                "store calls paused after recent failures".into(),
            ));
        }
        let start = Instant::now();
        let Ok(Ok(_turn)) = tokio::time::timeout(self.queue_wait, lane.turns.acquire()).await
        else {
            metrics::store_call(op, start.elapsed().as_secs_f64(), false);
            return Err(StoreError::NotSent(
                "no turn for the call within the queue wait".into(),
            ));
        };
        // One timer per call at most: on a current-thread runtime, arming a
        // timer that is due before the driver's next planned wake-up writes
        // to the runtime's eventfd (tokio `time::Handle::reregister`), and
        // stacked timeouts cost one such write each (measured: three per
        // Redis call, six per request, before this).
        let result = if self.inner.times_out_calls() {
            fut.await
        } else {
            match tokio::time::timeout(self.timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout),
            }
        };
        let now = Instant::now();
        self.call_metrics
            .record(op, (now - start).as_secs_f64(), result.is_ok());
        let mut b = lane.breaker.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            Ok(_) => {
                b.open_until = None;
                b.backoff = BACKOFF_START;
                b.last_success = Some(now);
            }
            Err(e) if b.last_success.is_some_and(|t| now - t < ALIVE_WITHIN) => {
                tracing::debug!(op, domain, error = %e, "budget store call failed; the domain answered other calls within the last second, so calls go on");
            }
            Err(e) => {
                tracing::warn!(op, domain, error = %e, backoff_ms = b.backoff.as_millis() as u64, "budget store call failed; pausing the domain's store calls");
                b.open_until = Some(now + b.backoff);
                b.backoff = (b.backoff * 2).min(BACKOFF_MAX);
            }
        }
        result
    }
}

#[async_trait]
impl<S: BudgetStore + ?Sized> BudgetStore for GuardedStore<S> {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.call(
            "reserve",
            self.inner.domain_of_reservation(req),
            self.inner.reserve(req),
        )
        .await
    }

    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.call(
            "extend",
            self.inner.domain_of_hold(id),
            self.inner.extend(id, step),
        )
        .await
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.call("renew", self.inner.domain_of_hold(id), self.inner.renew(id))
            .await
    }

    async fn settle(&self, id: &str, settlement: &Settlement) -> Result<SettleOutcome, StoreError> {
        self.call(
            "settle",
            self.inner.domain_of_hold(id),
            self.inner.settle(id, settlement),
        )
        .await
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        // A read of several domains waits in its first one's lane (an
        // admin read; the health check reads none: the store's own).
        let domain = specs.first().map_or(0, |s| self.inner.domain_of_budget(s));
        self.call("inspect", domain, self.inner.inspect(specs))
            .await
    }

    async fn runs_of(
        &self,
        ks: &crate::budget::keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Result<Vec<crate::budget::ListedRun>, StoreError> {
        self.inner.runs_of(ks, tenant, n).await
    }

    async fn holds_on(&self, specs: &[BudgetSpec]) -> Result<Vec<super::HeldOn>, StoreError> {
        // A read for a refusal's record or a reconciliation: never a turn
        // of the admissions' queue nor a failure that pauses them (the
        // caller bounds it).
        self.inner.holds_on(specs).await
    }

    async fn slides(&self, specs: &[BudgetSpec]) -> Result<Vec<Option<super::Slide>>, StoreError> {
        // An admin read, like holds_on: outside the admissions' queue.
        self.inner.slides(specs).await
    }

    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        self.call(
            "void",
            self.inner.domain_of_hold(id),
            self.inner.void(id, hold_ttl_micros),
        )
        .await
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.call(
            "lower",
            self.inner.domain_of_budget(spec),
            self.inner.lower(spec, at_most),
        )
        .await
    }

    fn times_out_calls(&self) -> bool {
        true
    }

    fn domain_of_reservation(&self, req: &ReserveRequest) -> u64 {
        self.inner.domain_of_reservation(req)
    }

    fn domain_of_hold(&self, id: &str) -> u64 {
        self.inner.domain_of_hold(id)
    }

    fn domain_of_budget(&self, spec: &BudgetSpec) -> u64 {
        self.inner.domain_of_budget(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A store that serves one call at a time, each taking `service` (like
    /// Redis running scripts), and fails the calls `fail` says to.
    struct Serial {
        lock: tokio::sync::Mutex<()>,
        service: Duration,
        calls: AtomicUsize,
        fail: fn(usize) -> bool,
        own_timeout: bool,
    }

    #[async_trait]
    impl BudgetStore for Serial {
        async fn reserve(&self, _: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
            unimplemented!()
        }
        async fn extend(&self, _: &str, _: &Step) -> Result<ExtendOutcome, StoreError> {
            unimplemented!()
        }
        async fn renew(&self, _: &str) -> Result<RenewOutcome, StoreError> {
            unimplemented!()
        }
        async fn settle(&self, _: &str, _: &Settlement) -> Result<SettleOutcome, StoreError> {
            unimplemented!()
        }
        async fn void(&self, _: &str, _: u64) -> Result<SettleOutcome, StoreError> {
            unimplemented!()
        }
        async fn inspect(&self, _: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
            let _one_at_a_time = self.lock.lock().await;
            tokio::time::sleep(self.service).await;
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if (self.fail)(n) {
                Err(StoreError::Unavailable("scripted failure".into()))
            } else {
                Ok(Vec::new())
            }
        }
        async fn lower(&self, _: &BudgetSpec, _: u64) -> Result<i64, StoreError> {
            unimplemented!()
        }
        fn times_out_calls(&self) -> bool {
            self.own_timeout
        }
    }

    fn serial(service: Duration, fail: fn(usize) -> bool) -> Arc<Serial> {
        Arc::new(Serial {
            lock: tokio::sync::Mutex::new(()),
            service,
            calls: AtomicUsize::new(0),
            fail,
            own_timeout: false,
        })
    }

    // Paused time: the store's service time is virtual and exact.
    #[tokio::test(start_paused = true)]
    async fn a_burst_is_served_at_the_store_pace_without_timeouts() {
        // 500 calls of 1 ms each (tokio's timer resolution) need 500 ms of
        // store time, five times the 100 ms timeout; waiting here, each call
        // spends at most 64 × 1 ms in the store's own queue.
        let store = serial(Duration::from_millis(1), |_| false);
        let guarded = Arc::new(GuardedStore::new(store.clone(), Duration::from_millis(100)));
        let calls: Vec<_> = (0..500)
            .map(|_| {
                let g = guarded.clone();
                tokio::spawn(async move { g.inspect(&[]).await })
            })
            .collect();
        let mut ok = 0;
        for c in calls {
            if c.await.unwrap().is_ok() {
                ok += 1;
            }
        }
        assert_eq!(ok, 500);
        assert_eq!(store.calls.load(Ordering::SeqCst), 500);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_beside_recent_successes_do_not_pause_the_store() {
        let store = serial(Duration::from_micros(100), |n| n % 2 == 1);
        let guarded = GuardedStore::new(store.clone(), Duration::from_millis(50));
        for _ in 0..10 {
            let _ = guarded.inspect(&[]).await;
        }
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            10,
            "every call reached the store"
        );
        assert!(!guarded.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_stopped_answering_is_paused() {
        let store = serial(Duration::from_micros(100), |n| n >= 1);
        let guarded = GuardedStore::new(store.clone(), Duration::from_millis(50));
        assert!(guarded.inspect(&[]).await.is_ok());
        tokio::time::sleep(ALIVE_WITHIN).await;
        assert!(guarded.inspect(&[]).await.is_err());
        assert!(
            guarded.is_open(),
            "no success within the last second: paused"
        );
        assert!(guarded.inspect(&[]).await.is_err());
        assert_eq!(
            store.calls.load(Ordering::SeqCst),
            2,
            "the paused call never reached the store"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_guard_times_out_only_stores_without_their_own_timeout() {
        let slow = serial(Duration::from_millis(80), |_| false);
        let guarded = GuardedStore::new(slow, Duration::from_millis(50));
        assert!(matches!(
            guarded.inspect(&[]).await,
            Err(StoreError::Timeout)
        ));
        // A store that bounds its own calls (Redis) gets no second timer:
        // its answer stands, whatever the guard's timeout.
        let self_timed = Arc::new(Serial {
            lock: tokio::sync::Mutex::new(()),
            service: Duration::from_millis(80),
            calls: AtomicUsize::new(0),
            fail: |_| false,
            own_timeout: true,
        });
        let guarded = GuardedStore::new(self_timed, Duration::from_millis(50));
        assert!(guarded.inspect(&[]).await.is_ok());
        assert!(guarded.times_out_calls());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_waits_its_turn_as_long_as_the_store_timeout() {
        // 65 calls of 1.5 s each on a store serving one at a time, with a
        // timeout long enough for all of them: the 65th waits 1.5 s for a
        // turn, past the one-second floor, and must be served, not refused
        // as "no turn".
        let store = serial(Duration::from_millis(1500), |_| false);
        let guarded = Arc::new(GuardedStore::new(store.clone(), Duration::from_secs(500)));
        let calls: Vec<_> = (0..MAX_IN_FLIGHT + 1)
            .map(|_| {
                let g = guarded.clone();
                tokio::spawn(async move { g.inspect(&[]).await })
            })
            .collect();
        let mut refused = 0;
        for c in calls {
            if let Err(StoreError::NotSent(_)) = c.await.unwrap() {
                refused += 1;
            }
        }
        assert_eq!(refused, 0, "no call refused for want of a turn");
    }

    /// A store of two domains (in the `tenant` layout, two primaries): the
    /// renewals of ids starting `dead` go to a primary that never answers,
    /// the others are answered in 1 ms.
    struct TwoDomains {
        answered: AtomicUsize,
    }

    #[async_trait]
    impl BudgetStore for TwoDomains {
        async fn reserve(&self, _: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
            unimplemented!()
        }
        async fn extend(&self, _: &str, _: &Step) -> Result<ExtendOutcome, StoreError> {
            unimplemented!()
        }
        async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
            if id.starts_with("dead") {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.answered.fetch_add(1, Ordering::SeqCst);
            Ok(RenewOutcome::Unknown)
        }
        async fn settle(&self, _: &str, _: &Settlement) -> Result<SettleOutcome, StoreError> {
            unimplemented!()
        }
        async fn void(&self, _: &str, _: u64) -> Result<SettleOutcome, StoreError> {
            unimplemented!()
        }
        async fn inspect(&self, _: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
            unimplemented!()
        }
        async fn lower(&self, _: &BudgetSpec, _: u64) -> Result<i64, StoreError> {
            unimplemented!()
        }
        fn domain_of_hold(&self, id: &str) -> u64 {
            if id.starts_with("dead") {
                7
            } else {
                9
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_waiting_on_a_dead_domain_take_no_turn_of_another() {
        let store = Arc::new(TwoDomains {
            answered: AtomicUsize::new(0),
        });
        let guarded = Arc::new(GuardedStore::new(store.clone(), Duration::from_secs(5)));
        // Three times the turns of a lane, all waiting on the dead domain.
        let dead: Vec<_> = (0..3 * MAX_IN_FLIGHT)
            .map(|i| {
                let g = guarded.clone();
                tokio::spawn(async move { g.renew(&format!("dead{i}")).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let start = Instant::now();
        let live: Vec<_> = (0..2 * MAX_IN_FLIGHT)
            .map(|i| {
                let g = guarded.clone();
                tokio::spawn(async move { g.renew(&format!("live{i}")).await })
            })
            .collect();
        for c in live {
            assert!(c.await.unwrap().is_ok(), "the live domain's call answered");
        }
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "promptly, not after the dead domain's timeout: {:?}",
            start.elapsed()
        );
        assert_eq!(store.answered.load(Ordering::SeqCst), 2 * MAX_IN_FLIGHT);
        for c in dead {
            assert!(c.await.unwrap().is_err());
        }
        assert!(guarded.is_open_in(7), "the dead domain is paused");
        assert!(!guarded.is_open_in(9), "the live one is not");
        assert!(guarded.renew("live-after").await.is_ok());
        assert!(guarded.renew("dead-after").await.is_err());
        assert!(!guarded.is_open(), "nor is the store's own domain");
    }
}
