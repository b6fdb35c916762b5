//! The writer: moves buffered rows to the sink in batches, off the
//! request path. It wakes every batch interval, or sooner when a batch's
//! worth is waiting; a batch the sink refuses goes back to the buffer and
//! is tried again at the next wake-up (the buffer's bound then decides
//! what is dropped). Once an hour it deletes rows past the retention. At
//! shutdown it writes what is waiting, for a bounded time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::buffer::LedgerBuffer;
use super::SpendRow;
use crate::clock::Clock;

/// Why the sink could not write or read.
#[derive(Debug, thiserror::Error)]
#[error("ledger database: {0}")]
pub struct LedgerError(pub String);

/// Where rows are written: idempotent by reservation id (a row whose id is
/// there already is ignored).
#[async_trait::async_trait]
pub trait LedgerSink: Send + Sync + 'static {
    /// Writes `rows` in one transaction; returns how many were new.
    async fn write(&self, rows: &[SpendRow]) -> Result<u64, LedgerError>;
    /// Deletes the rows settled before `before_micros`; returns how many.
    async fn prune(&self, before_micros: u64) -> Result<u64, LedgerError>;
}

/// `[ledger]` as the writer uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSettings {
    /// Whether settlements are recorded at all.
    pub enabled: bool,
    /// Longest a row waits in the buffer while the sink is up: the crash
    /// loss bound.
    pub batch_interval: Duration,
    /// Most rows per write.
    pub batch_rows: usize,
    /// Most rows buffered (waiting or being written); past it rows are dropped.
    pub buffer_rows: usize,
    /// Rows older than this are deleted; `None` keeps them.
    pub retention: Option<Duration>,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            batch_interval: Duration::from_secs(1),
            batch_rows: 500,
            buffer_rows: 100_000,
            retention: Some(Duration::from_secs(400 * 86_400)),
        }
    }
}

/// How often rows past the retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3_600);

/// The running writer task.
pub struct LedgerWriter {
    stop: watch::Sender<Option<Duration>>,
    task: Option<JoinHandle<()>>,
}

impl LedgerWriter {
    /// Starts the writer of `buffer` into `sink` on the current runtime.
    pub fn spawn(
        buffer: Arc<LedgerBuffer>,
        sink: Arc<dyn LedgerSink>,
        settings: LedgerSettings,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (stop, stop_rx) = watch::channel(None);
        let task = tokio::spawn(run(buffer, sink, settings, clock, stop_rx));
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Writes what is waiting (trying for up to `grace` while the sink
    /// fails) and stops the task.
    pub async fn shutdown(mut self, grace: Duration) {
        self.stop.send_replace(Some(grace));
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for LedgerWriter {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn run(
    buffer: Arc<LedgerBuffer>,
    sink: Arc<dyn LedgerSink>,
    settings: LedgerSettings,
    clock: Arc<dyn Clock>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let mut next_prune = tokio::time::Instant::now();
    loop {
        if let Some(retention) = settings.retention {
            if tokio::time::Instant::now() >= next_prune {
                next_prune += PRUNE_EVERY;
                prune(&*sink, &*clock, retention).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.batch_interval) => {}
            _ = buffer.batch_ready() => {}
            _ = stop.changed() => {}
        }
        let grace = *stop.borrow();
        match grace {
            None => {
                write_waiting(&buffer, &*sink, settings.batch_rows).await;
            }
            Some(grace) => {
                let deadline = tokio::time::Instant::now() + grace;
                while !write_waiting(&buffer, &*sink, settings.batch_rows).await {
                    if tokio::time::Instant::now() + settings.batch_interval > deadline {
                        tracing::error!(
                            rows = buffer.held(),
                            "ledger rows not written at shutdown"
                        );
                        break;
                    }
                    tokio::time::sleep(settings.batch_interval).await;
                }
                return;
            }
        }
    }
}

/// Writes every row waiting now, batch by batch; false when the sink
/// failed (the failed batch is back in the buffer).
async fn write_waiting(buffer: &LedgerBuffer, sink: &dyn LedgerSink, batch_rows: usize) -> bool {
    loop {
        let batch = buffer.take(batch_rows);
        if batch.is_empty() {
            crate::metrics::ledger_buffered(buffer.held());
            return true;
        }
        match sink.write(&batch).await {
            Ok(new) => {
                let n = batch.len();
                buffer.written(n);
                crate::metrics::ledger_rows("written", new);
                crate::metrics::ledger_rows("duplicate", n as u64 - new.min(n as u64));
            }
            Err(e) => {
                tracing::warn!(error = %e, rows = batch.len(), buffered = buffer.held(), "ledger batch not written; kept in the buffer");
                crate::metrics::ledger_write_failed();
                buffer.put_back(batch);
                crate::metrics::ledger_buffered(buffer.held());
                return false;
            }
        }
    }
}

async fn prune(sink: &dyn LedgerSink, clock: &dyn Clock, retention: Duration) {
    let before = clock
        .now_micros()
        .saturating_sub(retention.as_micros() as u64);
    match sink.prune(before).await {
        Ok(n) if n > 0 => tracing::info!(rows = n, "ledger rows past the retention deleted"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "ledger retention: rows not deleted"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::ledger::capture::tests::row;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// A sink in memory that can be taken down, keyed like the table.
    #[derive(Default)]
    struct MemorySink {
        rows: Mutex<BTreeMap<String, SpendRow>>,
        down: AtomicBool,
        writes: Mutex<Vec<usize>>,
        pruned_before: Mutex<Vec<u64>>,
    }

    #[async_trait::async_trait]
    impl LedgerSink for MemorySink {
        async fn write(&self, rows: &[SpendRow]) -> Result<u64, LedgerError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(LedgerError("down".into()));
            }
            self.writes.lock().unwrap().push(rows.len());
            let mut t = self.rows.lock().unwrap();
            let mut new = 0;
            for r in rows {
                if !t.contains_key(&r.reservation_id) {
                    t.insert(r.reservation_id.clone(), r.clone());
                    new += 1;
                }
            }
            Ok(new)
        }
        async fn prune(&self, before: u64) -> Result<u64, LedgerError> {
            self.pruned_before.lock().unwrap().push(before);
            let mut t = self.rows.lock().unwrap();
            let n = t.len();
            t.retain(|_, r| r.at_micros >= before);
            Ok((n - t.len()) as u64)
        }
    }

    fn settings(buffer_rows: usize) -> LedgerSettings {
        LedgerSettings {
            enabled: true,
            batch_interval: Duration::from_secs(1),
            batch_rows: 3,
            buffer_rows,
            retention: None,
        }
    }

    fn start(sink: &Arc<MemorySink>, s: LedgerSettings) -> (Arc<LedgerBuffer>, LedgerWriter) {
        let buffer = Arc::new(LedgerBuffer::new(s.buffer_rows, s.batch_rows));
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(10_000_000_000));
        let w = LedgerWriter::spawn(buffer.clone(), sink.clone(), s, clock);
        (buffer, w)
    }

    #[tokio::test(start_paused = true)]
    async fn rows_are_written_within_one_batch_interval_in_batches() {
        let sink = Arc::new(MemorySink::default());
        let (buffer, _w) = start(&sink, settings(100));
        buffer.record(row("r1", 5));
        buffer.record(row("r2", 5));
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(sink.rows.lock().unwrap().len(), 2);
        for i in 0..7 {
            buffer.record(row(&format!("s{i}"), 1));
        }
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(sink.rows.lock().unwrap().len(), 9);
        assert!(sink.writes.lock().unwrap().iter().all(|&n| n <= 3));
        assert_eq!(buffer.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sink_outage_keeps_rows_up_to_the_bound_then_writes_them_when_it_returns() {
        let sink = Arc::new(MemorySink::default());
        sink.down.store(true, Ordering::SeqCst);
        let (buffer, _w) = start(&sink, settings(5));
        for i in 0..8 {
            buffer.record(row(&format!("r{i}"), 1));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(buffer.dropped(), 3);
        assert_eq!(buffer.held(), 5);
        sink.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let ids: Vec<String> = sink.rows.lock().unwrap().keys().cloned().collect();
        assert_eq!(ids, ["r0", "r1", "r2", "r3", "r4"]);
        assert_eq!(buffer.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_row_written_twice_is_one_row() {
        let sink = Arc::new(MemorySink::default());
        let (buffer, _w) = start(&sink, settings(100));
        buffer.record(row("r1", 5));
        buffer.record(row("r1", 5));
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(sink.rows.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_writes_what_is_waiting() {
        let sink = Arc::new(MemorySink::default());
        let (buffer, w) = start(&sink, settings(100));
        buffer.record(row("r1", 5));
        w.shutdown(Duration::from_secs(5)).await;
        assert_eq!(sink.rows.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn rows_past_the_retention_are_deleted() {
        let sink = Arc::new(MemorySink::default());
        let s = LedgerSettings {
            retention: Some(Duration::from_secs(1_000)),
            ..settings(100)
        };
        let (_buffer, _w) = start(&sink, s);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            *sink.pruned_before.lock().unwrap(),
            [10_000_000_000 - 1_000_000_000]
        );
    }
}
