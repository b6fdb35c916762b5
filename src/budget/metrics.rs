//! The budget model's own metrics, through the `metrics` facade (the
//! exporter is installed by `crate::metrics`): store call latency and
//! errors, Redis batches, forgiven debt, deny-cache evictions, memory-store
//! snapshots. Here rather than in `crate::metrics` so that the stores, a
//! floor below the layers, import no layer.

use metrics::{counter, histogram, Histogram};

/// A store call's latency (seconds) and whether it failed.
pub fn store_call(op: &'static str, seconds: f64, ok: bool) {
    store_call_histogram(op).record(seconds);
    if !ok {
        counter!("budgetgate_store_errors_total", "op" => op).increment(1);
    }
}

/// The latency series of store call `op` (registered ahead by
/// `crate::metrics::policy_installed`).
pub fn store_call_histogram(op: &'static str) -> Histogram {
    histogram!("budgetgate_store_call_seconds", "op" => op)
}

/// Latency handles of the two store calls every request makes (`reserve`,
/// `settle`), registered once per store wrapper (as `crate::metrics::TenantMetrics`
/// registers a tenant's).
pub struct StoreCallMetrics {
    reserve: Histogram,
    settle: Histogram,
}

impl StoreCallMetrics {
    /// Registers the two series.
    pub fn new() -> Self {
        Self {
            reserve: store_call_histogram("reserve"),
            settle: store_call_histogram("settle"),
        }
    }

    /// As [`store_call`], through a registered handle when `op` has one.
    pub fn record(&self, op: &'static str, seconds: f64, ok: bool) {
        match (op, ok) {
            ("reserve", true) => self.reserve.record(seconds),
            ("settle", true) => self.settle.record(seconds),
            _ => store_call(op, seconds, ok),
        }
    }
}

impl Default for StoreCallMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One batch of `calls` reserve and settle calls sent to Redis (calls
/// that arrive while earlier batches are on the wire go together; calls per
/// batch = `budgetgate_redis_batch_calls_total / budgetgate_redis_batches_total`).
pub fn redis_batch(calls: usize) {
    counter!("budgetgate_redis_batches_total").increment(1);
    counter!("budgetgate_redis_batch_calls_total").increment(calls as u64);
}

/// The deny cache forgot its least recently used budget to remember
/// another (`store.deny_cache_entries`).
pub fn deny_cache_eviction() {
    counter!("budgetgate_deny_cache_evictions_total").increment(1);
}

/// A memory-store snapshot written (`ok`) or failed.
pub fn store_snapshot(ok: bool) {
    if ok {
        counter!("budgetgate_store_snapshots_total").increment(1);
    } else {
        counter!("budgetgate_store_snapshot_failures_total").increment(1);
    }
}

/// Units (1/60,000 token) of debt that passed a bucket's floor
/// (`budget::bucket::DEBT_FLOOR`): counted, never silently forgiven.
pub fn debt_forgiven(units: i64) {
    if units > 0 {
        counter!("budgetgate_debt_forgiven_tokens_total")
            .increment((units as u64).div_ceil(super::bucket::UNITS_PER_TOKEN as u64));
    }
}
