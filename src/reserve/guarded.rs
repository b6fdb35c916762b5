//! A [`BudgetStore`] wrapper that bounds every call by a timeout, records
//! its latency and errors in metrics, and stops calling a failing store for
//! a short, growing back-off (a circuit breaker), so requests do not each pay
//! the timeout while the store is down. Recovery is automatic: the first
//! call after the back-off probes the store again.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{
    BudgetSpec, BudgetState, BudgetStore, ExtendOutcome, RenewOutcome, ReserveOutcome,
    ReserveRequest, SettleOutcome, Settlement, StoreError,
};
use crate::metrics;

/// First back-off after a failure.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest back-off.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

struct Breaker {
    open_until: Option<Instant>,
    backoff: Duration,
}

/// Timeout + metrics + circuit breaker around another store.
pub struct GuardedStore<S: ?Sized> {
    inner: std::sync::Arc<S>,
    timeout: Duration,
    breaker: Mutex<Breaker>,
}

impl<S: BudgetStore + ?Sized> GuardedStore<S> {
    /// Wraps `inner`; each call fails with [`StoreError::Timeout`] after `timeout`.
    pub fn new(inner: std::sync::Arc<S>, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            breaker: Mutex::new(Breaker {
                open_until: None,
                backoff: BACKOFF_START,
            }),
        }
    }

    /// True while the breaker keeps calls away from the store.
    pub fn is_open(&self) -> bool {
        let b = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        b.open_until.is_some_and(|t| Instant::now() < t)
    }

    async fn call<T, F>(&self, op: &'static str, fut: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        if self.is_open() {
            metrics::store_call(op, 0.0, false);
            return Err(StoreError::Unavailable(
                "store calls paused after recent failures".into(),
            ));
        }
        let start = Instant::now();
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout),
        };
        metrics::store_call(op, start.elapsed().as_secs_f64(), result.is_ok());
        let mut b = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            Ok(_) => {
                b.open_until = None;
                b.backoff = BACKOFF_START;
            }
            Err(e) => {
                tracing::warn!(op, error = %e, backoff_ms = b.backoff.as_millis() as u64, "budget store call failed; pausing store calls");
                b.open_until = Some(Instant::now() + b.backoff);
                b.backoff = (b.backoff * 2).min(BACKOFF_MAX);
            }
        }
        result
    }
}

#[async_trait]
impl<S: BudgetStore + ?Sized> BudgetStore for GuardedStore<S> {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.call("reserve", self.inner.reserve(req)).await
    }

    async fn extend(&self, id: &str, tokens: u64) -> Result<ExtendOutcome, StoreError> {
        self.call("extend", self.inner.extend(id, tokens)).await
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.call("renew", self.inner.renew(id)).await
    }

    async fn settle(&self, id: &str, settlement: Settlement) -> Result<SettleOutcome, StoreError> {
        self.call("settle", self.inner.settle(id, settlement)).await
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        self.call("inspect", self.inner.inspect(specs)).await
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.call("lower", self.inner.lower(spec, at_most)).await
    }
}
