//! The bounded buffer ledger rows wait in until the writer takes them.
//! Recording is a push under a mutex held for the push only: a request
//! never waits for the database. When the buffer holds its bound (rows
//! waiting plus the batch being written), a new row is dropped and counted
//! (`budgetgate_ledger_rows_total{outcome="dropped"}`): the ledger gives
//! way, the requests do not.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

use tokio::sync::Notify;

use super::query::SpendTotals;
use super::SpendRow;

/// Rows waiting to be written, bounded.
pub struct LedgerBuffer {
    inner: Mutex<Inner>,
    capacity: usize,
    /// Wakes the writer when a batch is full.
    full_batch: Notify,
    batch_rows: usize,
    dropped: AtomicU64,
    /// What the dropped rows counted, per tenant level and UTC day, for
    /// reconciliation (touched only when a row is dropped).
    dropped_by: Mutex<HashMap<(Arc<str>, i64), SpendTotals>>,
}

/// (Tenant level, day) pairs whose dropped rows are summed; beyond, a
/// dropped row is only counted.
pub const DROPPED_SUMS_MAX: usize = 100_000;

/// The totals one row adds.
pub fn totals_of(row: &SpendRow) -> SpendTotals {
    SpendTotals {
        requests: 1,
        input_tokens: row.input_tokens,
        cached_read_tokens: row.cached_read_tokens,
        cache_write_tokens: row.cache_write_tokens,
        output_tokens: row.output_tokens,
        reasoning_tokens: row.reasoning_tokens,
        charged_tokens: row.charged_tokens,
        cost_micros: row.cost_micros,
    }
}

struct Inner {
    rows: VecDeque<SpendRow>,
    /// Rows taken by the writer and not yet confirmed: they count toward
    /// the bound, since a failed write puts them back.
    in_flight: usize,
}

impl LedgerBuffer {
    /// A buffer of at most `capacity` rows (≥ 1) that wakes its writer
    /// every `batch_rows` rows.
    pub fn new(capacity: usize, batch_rows: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                rows: VecDeque::new(),
                in_flight: 0,
            }),
            capacity: capacity.max(1),
            full_batch: Notify::new(),
            batch_rows: batch_rows.max(1),
            dropped: AtomicU64::new(0),
            dropped_by: Mutex::new(HashMap::new()),
        }
    }

    /// The bound, rows.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds `row`; false (and counted) when the buffer is full.
    pub fn record(&self, row: SpendRow) -> bool {
        let mut inner = self.lock();
        if inner.rows.len() + inner.in_flight >= self.capacity {
            drop(inner);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            crate::metrics::ledger_rows("dropped", 1);
            self.sum_dropped(&row);
            return false;
        }
        inner.rows.push_back(row);
        let waiting = inner.rows.len();
        drop(inner);
        if waiting >= self.batch_rows {
            self.full_batch.notify_one();
        }
        true
    }

    /// Rows waiting (not counting a batch being written).
    pub fn waiting(&self) -> usize {
        self.lock().rows.len()
    }

    /// Rows waiting or being written.
    pub fn held(&self) -> usize {
        let inner = self.lock();
        inner.rows.len() + inner.in_flight
    }

    /// Rows dropped because the buffer was full, since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn sum_dropped(&self, row: &SpendRow) {
        let day = super::query::day_of(row.at_micros);
        let t = totals_of(row);
        let mut by = self.dropped_by.lock().unwrap_or_else(|e| e.into_inner());
        for level in std::iter::once(&row.tenant).chain(row.ancestors.iter()) {
            let key = (level.clone(), day);
            if by.len() >= DROPPED_SUMS_MAX && !by.contains_key(&key) {
                continue;
            }
            by.entry(key).or_default().add(&t);
        }
    }

    /// What the rows dropped so far counted for tenant `level` (its
    /// subtree) on the UTC days `days` (days since the epoch).
    pub fn dropped_of(&self, level: &str, days: std::ops::Range<i64>) -> SpendTotals {
        let by = self.dropped_by.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = SpendTotals::default();
        for ((l, d), t) in by.iter() {
            if &**l == level && days.contains(d) {
                out.add(t);
            }
        }
        out
    }

    /// What the rows waiting count for tenant `level` (its subtree),
    /// settled within `[from, to)` UTC µs (a batch being written is
    /// counted once written).
    pub fn waiting_of(&self, level: &str, from: u64, to: u64) -> SpendTotals {
        let inner = self.lock();
        let mut out = SpendTotals::default();
        for row in &inner.rows {
            if (from..to).contains(&row.at_micros) && row.levels().any(|l| l == level) {
                out.add(&totals_of(row));
            }
        }
        out
    }

    /// Takes up to `max` of the oldest rows as the batch being written.
    pub(super) fn take(&self, max: usize) -> Vec<SpendRow> {
        let mut inner = self.lock();
        let n = inner.rows.len().min(max);
        let batch: Vec<SpendRow> = inner.rows.drain(..n).collect();
        inner.in_flight += batch.len();
        batch
    }

    /// The batch taken was written: it leaves the bound.
    pub(super) fn written(&self, n: usize) {
        let mut inner = self.lock();
        inner.in_flight = inner.in_flight.saturating_sub(n);
    }

    /// The batch taken could not be written: it goes back to the front,
    /// in order, to be tried again.
    pub(super) fn put_back(&self, batch: Vec<SpendRow>) {
        let mut inner = self.lock();
        inner.in_flight = inner.in_flight.saturating_sub(batch.len());
        for row in batch.into_iter().rev() {
            inner.rows.push_front(row);
        }
    }

    /// Resolves when a batch's worth of rows is waiting (or at once, if
    /// one was signalled since the last wait).
    pub(super) async fn batch_ready(&self) {
        self.full_batch.notified().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::capture::tests::row;

    #[test]
    fn what_waits_and_what_was_dropped_is_summed_per_tenant_level_and_window() {
        let b = LedgerBuffer::new(2, 10);
        let (r1, r2, r3) = (row("r1", 10), row("r2", 20), row("r3", 40));
        let tenant = r1.tenant.to_string();
        let at = r1.at_micros;
        assert!(b.record(r1) && b.record(r2));
        assert!(!b.record(r3));
        let waiting = b.waiting_of(&tenant, at, at + 1);
        assert_eq!((waiting.requests, waiting.cost_micros), (2, 30));
        assert_eq!(b.waiting_of(&tenant, at + 1, at + 2).requests, 0);
        assert_eq!(b.waiting_of("nobody", at, at + 1).requests, 0);
        let day = crate::ledger::query::day_of(at);
        let dropped = b.dropped_of(&tenant, day..day + 1);
        assert_eq!((dropped.requests, dropped.cost_micros), (1, 40));
        assert_eq!(b.dropped_of(&tenant, day + 1..day + 2).requests, 0);
    }

    #[test]
    fn a_full_buffer_drops_and_counts_the_new_row() {
        let b = LedgerBuffer::new(2, 10);
        assert!(b.record(row("r1", 10)));
        assert!(b.record(row("r2", 10)));
        assert!(!b.record(row("r3", 10)));
        assert_eq!(b.dropped(), 1);
        assert_eq!(b.waiting(), 2);
    }

    #[test]
    fn rows_being_written_count_toward_the_bound_and_come_back_in_order() {
        let b = LedgerBuffer::new(3, 10);
        for id in ["r1", "r2", "r3"] {
            assert!(b.record(row(id, 1)));
        }
        let batch = b.take(2);
        assert_eq!(batch.len(), 2);
        assert_eq!(b.held(), 3);
        assert!(!b.record(row("r4", 1)), "the batch in flight still counts");
        b.put_back(batch);
        let again = b.take(10);
        let ids: Vec<&str> = again.iter().map(|r| r.reservation_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2", "r3"]);
        b.written(again.len());
        assert_eq!(b.held(), 0);
        assert!(b.record(row("r5", 1)));
    }
}
