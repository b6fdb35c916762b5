//! The writer: moves buffered rows to the sink in batches, off the
//! request path. It wakes every batch interval, or sooner when a batch's
//! worth is waiting; a batch the sink refuses goes back to the buffer and
//! is tried again at the next wake-up (the buffer's bound then decides
//! what is dropped). Once an hour it deletes rows past the retention. At
//! shutdown it writes what is waiting, for a bounded time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
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

/// The running writer: a task on the caller's runtime ([`Self::spawn`],
/// for tests and tools) or a thread of its own ([`Self::spawn_thread`],
/// what `serve` runs, so that batching, encoding and the database driver
/// never run on a serving thread).
pub struct LedgerWriter {
    stop: watch::Sender<Option<Duration>>,
    runs: Runs,
    /// For the count of rows a cut-short shutdown leaves unwritten.
    buffer: Arc<LedgerBuffer>,
}

/// What a shutdown may wait beyond its grace (the last attempt's end).
const SHUTDOWN_SLACK: Duration = Duration::from_millis(500);

enum Runs {
    Task(Option<JoinHandle<()>>),
    /// Resolves when the thread's loop has returned.
    Thread(Option<oneshot::Receiver<()>>),
}

/// Opens the sink on the writer's own runtime (a pool must be created on
/// the runtime that drives its connections).
pub type OpenSink = Box<dyn FnOnce() -> Result<Arc<dyn LedgerSink>, String> + Send>;

impl LedgerWriter {
    /// Starts the writer of `buffer` into `sink` on the current runtime.
    pub fn spawn(
        buffer: Arc<LedgerBuffer>,
        sink: Arc<dyn LedgerSink>,
        settings: LedgerSettings,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (stop, stop_rx) = watch::channel(None);
        let task = tokio::spawn(run(buffer.clone(), sink, settings, clock, stop_rx));
        Self {
            stop,
            runs: Runs::Task(Some(task)),
            buffer,
        }
    }

    /// Starts the writer of `buffer` on a thread of its own
    /// (`budgetgate-ledger`, a single-threaded runtime), writing into the
    /// sink `open` makes there.
    pub fn spawn_thread(
        buffer: Arc<LedgerBuffer>,
        open: OpenSink,
        settings: LedgerSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let (stop, stop_rx) = watch::channel(None);
        let (done_tx, done_rx) = oneshot::channel();
        let held = buffer.clone();
        std::thread::Builder::new()
            .name("budgetgate-ledger".into())
            .spawn(move || writer_thread(buffer, open, settings, clock, stop_rx, done_tx))
            .map_err(|e| format!("cannot start the ledger's writer thread: {e}"))?;
        Ok(Self {
            stop,
            runs: Runs::Thread(Some(done_rx)),
            buffer: held,
        })
    }

    /// Writes what is waiting (trying for up to `grace` while the sink
    /// fails) and stops the writer. Waits at most `grace` plus
    /// [`SHUTDOWN_SLACK`]: a write already in flight when the shutdown
    /// began (a database that hangs) does not hold the process longer.
    pub async fn shutdown(mut self, grace: Duration) {
        self.stop.send_replace(Some(grace));
        let bound = grace + SHUTDOWN_SLACK;
        let finished = match &mut self.runs {
            Runs::Task(t) => match t.take() {
                Some(t) => tokio::time::timeout(bound, t).await.is_ok(),
                None => true,
            },
            Runs::Thread(done) => match done.take() {
                Some(done) => tokio::time::timeout(bound, done).await.is_ok(),
                None => true,
            },
        };
        if !finished {
            tracing::error!(
                rows = self.buffer.held(),
                grace_ms = grace.as_millis() as u64,
                "ledger rows not written at shutdown: the database did not answer within the grace period"
            );
        }
    }
}

impl Drop for LedgerWriter {
    fn drop(&mut self) {
        // A thread sees its stop sender gone and returns after one last write.
        if let Runs::Task(Some(t)) = &mut self.runs {
            t.abort();
        }
    }
}

/// The writer thread's body: its runtime, its sink, the loop.
#[inline(never)]
fn writer_thread(
    buffer: Arc<LedgerBuffer>,
    open: OpenSink,
    settings: LedgerSettings,
    clock: Arc<dyn Clock>,
    stop: watch::Receiver<Option<Duration>>,
    done: oneshot::Sender<()>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "ledger writer: no runtime; rows stay buffered until dropped");
            return;
        }
    };
    rt.block_on(async move {
        match open() {
            Ok(sink) => run(buffer, sink, settings, clock, stop).await,
            Err(e) => {
                tracing::error!(error = %e, "ledger writer: the database cannot be opened; rows stay buffered until dropped")
            }
        }
    });
    let _ = done.send(());
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
        let orphaned = tokio::select! {
            _ = tokio::time::sleep(settings.batch_interval) => false,
            _ = buffer.batch_ready() => false,
            changed = stop.changed() => changed.is_err(),
        };
        if orphaned {
            // The writer's handle was dropped without a shutdown.
            write_waiting(&buffer, &*sink, settings.batch_rows, WRITE_TIMEOUT).await;
            return;
        }
        let grace = *stop.borrow();
        match grace {
            None => {
                write_waiting(&buffer, &*sink, settings.batch_rows, WRITE_TIMEOUT).await;
            }
            Some(grace) => {
                // Every attempt ends by the deadline: a database that is
                // down or hung costs the shutdown at most its grace.
                let deadline = tokio::time::Instant::now() + grace;
                loop {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let limit = left.min(WRITE_TIMEOUT);
                    if !limit.is_zero()
                        && write_waiting(&buffer, &*sink, settings.batch_rows, limit).await
                    {
                        break;
                    }
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

/// Longest one batch's write may take before it is given up (the batch
/// goes back to the buffer and is tried again): a connection that went
/// half-open mid-statement would otherwise stop the ledger for good. A
/// write given up after the database applied it is harmless: the retry's
/// rows are already there (primary key).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes every row waiting now, batch by batch, each write given at most
/// `limit`; false when the sink failed or timed out (the failed batch is
/// back in the buffer).
async fn write_waiting(
    buffer: &LedgerBuffer,
    sink: &dyn LedgerSink,
    batch_rows: usize,
    limit: Duration,
) -> bool {
    loop {
        let batch = buffer.take(batch_rows);
        if batch.is_empty() {
            crate::metrics::ledger_buffered(buffer.held());
            return true;
        }
        let outcome = match tokio::time::timeout(limit, sink.write(&batch)).await {
            Ok(r) => r,
            Err(_) => Err(LedgerError(format!(
                "the write did not finish within {} ms",
                limit.as_millis()
            ))),
        };
        match outcome {
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

    #[tokio::test]
    async fn the_writer_thread_writes_off_the_callers_runtime_and_flushes_at_shutdown() {
        let sink = Arc::new(MemorySink::default());
        let s = LedgerSettings {
            batch_interval: Duration::from_millis(20),
            ..settings(100)
        };
        let buffer = Arc::new(LedgerBuffer::new(s.buffer_rows, s.batch_rows));
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(10_000_000_000));
        let opened_on = Arc::new(Mutex::new(None));
        let open: OpenSink = {
            let (sink, opened_on) = (sink.clone(), opened_on.clone());
            Box::new(move || {
                *opened_on.lock().unwrap() = std::thread::current().name().map(String::from);
                Ok(sink as Arc<dyn LedgerSink>)
            })
        };
        let w = LedgerWriter::spawn_thread(buffer.clone(), open, s, clock).unwrap();
        buffer.record(row("r1", 5));
        for _ in 0..200 {
            if !sink.rows.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            sink.rows.lock().unwrap().len(),
            1,
            "written within a few intervals"
        );
        assert_eq!(
            opened_on.lock().unwrap().as_deref(),
            Some("budgetgate-ledger")
        );
        buffer.record(row("r2", 5));
        w.shutdown(Duration::from_secs(5)).await;
        assert_eq!(sink.rows.lock().unwrap().len(), 2, "the shutdown flush");
    }

    #[tokio::test]
    async fn a_dropped_writer_thread_writes_once_more_and_ends() {
        let sink = Arc::new(MemorySink::default());
        let buffer = Arc::new(LedgerBuffer::new(100, 3));
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(10_000_000_000));
        let open: OpenSink = {
            let sink = sink.clone();
            Box::new(move || Ok(sink as Arc<dyn LedgerSink>))
        };
        let w = LedgerWriter::spawn_thread(buffer.clone(), open, settings(100), clock).unwrap();
        buffer.record(row("r1", 5));
        drop(w);
        for _ in 0..200 {
            if Arc::strong_count(&buffer) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            Arc::strong_count(&buffer),
            1,
            "the thread ended (its buffer handle is gone)"
        );
        assert_eq!(sink.rows.lock().unwrap().len(), 1);
    }

    /// A sink whose first `hangs` writes never finish (a half-open
    /// connection), then writes into `inner`.
    struct HangingSink {
        inner: MemorySink,
        hangs: Mutex<usize>,
    }

    #[async_trait::async_trait]
    impl LedgerSink for HangingSink {
        async fn write(&self, rows: &[SpendRow]) -> Result<u64, LedgerError> {
            let hang = {
                let mut h = self.hangs.lock().unwrap();
                let hang = *h > 0;
                *h = h.saturating_sub(1);
                hang
            };
            if hang {
                std::future::pending::<()>().await;
            }
            self.inner.write(rows).await
        }
        async fn prune(&self, before: u64) -> Result<u64, LedgerError> {
            self.inner.prune(before).await
        }
    }

    fn hanging(hangs: usize) -> Arc<HangingSink> {
        Arc::new(HangingSink {
            inner: MemorySink::default(),
            hangs: Mutex::new(hangs),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_hangs_is_given_up_and_its_batch_written_again() {
        let sink = hanging(1);
        let buffer = Arc::new(LedgerBuffer::new(100, 3));
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(10_000_000_000));
        let _w = LedgerWriter::spawn(buffer.clone(), sink.clone(), settings(100), clock);
        buffer.record(row("r1", 5));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            sink.inner.rows.lock().unwrap().is_empty(),
            "the first write hangs"
        );
        assert_eq!(buffer.held(), 1, "its row is still held");
        tokio::time::sleep(WRITE_TIMEOUT + Duration::from_secs(2)).await;
        assert_eq!(
            sink.inner.rows.lock().unwrap().len(),
            1,
            "written on the retry"
        );
        assert_eq!(buffer.held(), 0);
    }

    #[tokio::test]
    async fn a_shutdown_waits_at_most_its_grace_for_a_database_that_hangs() {
        let sink = hanging(usize::MAX);
        let s = LedgerSettings {
            batch_interval: Duration::from_millis(50),
            ..settings(100)
        };
        let buffer = Arc::new(LedgerBuffer::new(s.buffer_rows, s.batch_rows));
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(10_000_000_000));
        let open: OpenSink = {
            let sink = sink.clone();
            Box::new(move || Ok(sink as Arc<dyn LedgerSink>))
        };
        let w = LedgerWriter::spawn_thread(buffer.clone(), open, s, clock).unwrap();
        buffer.record(row("r1", 5));
        // Let a write start and hang, then shut down with a short grace.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        w.shutdown(Duration::from_millis(300)).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(300) + SHUTDOWN_SLACK + Duration::from_millis(400),
            "shutdown took {took:?}"
        );
        assert!(sink.inner.rows.lock().unwrap().is_empty());
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
