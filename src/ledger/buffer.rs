//! The bounded buffer ledger rows wait in until the writer takes them.
//! Recording is a push under a mutex held for the push only: a request
//! never waits for the database. When the buffer holds its bound (rows
//! waiting plus the batch being written), a new row is dropped and counted
//! (`budgetgate_ledger_rows_total{outcome="dropped"}`): the ledger gives
//! way, the requests do not.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;

use super::SpendRow;

/// Rows waiting to be written, bounded.
pub struct LedgerBuffer {
    inner: Mutex<Inner>,
    capacity: usize,
    /// Wakes the writer when a batch is full.
    full_batch: Notify,
    batch_rows: usize,
    dropped: AtomicU64,
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
