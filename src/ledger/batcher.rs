//! The writer: moves buffered rows to the sink in batches, off the
//! request path. It wakes every batch interval, or sooner when a batch's
//! worth is waiting; a batch the sink refuses goes back to the buffer and
//! is tried again at the next wake-up (the buffer's bound then decides
//! what is dropped). Once an hour it deletes rows past the retention, in
//! batches of at most [`PRUNE_ROWS`], each under the write timeout, with
//! the waiting rows written between batches: a prune of millions of rows
//! never holds the writer (or SQLite's write lock) for long. At shutdown it
//! writes what is waiting, for a bounded time: the grace period while the
//! database accepts connections, at most [`REFUSED_FOR`] of it while the
//! database refuses them (stopped before the gateway, as a stack's `down`
//! does): a database that comes back within that time still gets every
//! row, one that does not costs the shutdown no more.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::buffer::LedgerBuffer;
use super::SpendRow;
use crate::clock::Clock;
use crate::config::ledger::LedgerSettings;

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
    /// Deletes at most `at_most` of the rows settled before
    /// `before_micros`, oldest first; returns how many. Fewer than
    /// `at_most` means none is left.
    async fn prune(&self, before_micros: u64, at_most: u64) -> Result<u64, LedgerError>;
    /// Whether the database refuses connections now (nothing listens at
    /// its address, or the name does not resolve), asked for at most
    /// `within`: a shutdown then stops waiting for it after
    /// [`REFUSED_FOR`]. False when it cannot tell (an embedded database,
    /// one that accepts but answers slowly).
    async fn refuses_connections(&self, within: Duration) -> bool {
        let _ = within;
        false
    }
}

/// The longest a shutdown keeps retrying a database that refuses
/// connections (also bounded by the grace period): long enough for a
/// restart to be seen, short enough that a gateway whose database is
/// already gone exits promptly.
pub const REFUSED_FOR: Duration = Duration::from_secs(5);

/// The longest the check of [`LedgerSink::refuses_connections`] may take.
const REFUSAL_CHECK: Duration = Duration::from_secs(1);

/// How often rows past the retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3_600);

/// Most rows one prune statement deletes: tens of milliseconds on SQLite
/// (four indexes to update per row), so rows settled meanwhile wait that
/// long at most, while each batch's commit (a sync to disk) is shared by
/// enough rows. Halved after a batch that timed out.
pub const PRUNE_ROWS: u64 = 10_000;

/// A prune under way: rows settled before `before` are being deleted.
struct Pruning {
    before: u64,
    batch: u64,
    deleted: u64,
    started: tokio::time::Instant,
}

/// The running writer: a task on the caller's runtime ([`Self::spawn`],
/// for tests and tools) or a thread of its own ([`Self::spawn_thread`],
/// what `serve` runs, so that batching, encoding and the database driver
/// never run on a serving thread).
pub struct LedgerWriter {
    stop: watch::Sender<Option<Duration>>,
    runs: Runs,
    /// For the count of rows a cut-short shutdown leaves unwritten.
    buffer: Arc<LedgerBuffer>,
    /// This run's crash marker, removed once the buffer is written.
    marker: Option<super::crash::RunMarker>,
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
            marker: None,
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
            marker: None,
        })
    }

    /// This writer with the run's crash marker ([`super::crash`]), removed
    /// at a graceful shutdown.
    pub fn with_marker(mut self, marker: Option<super::crash::RunMarker>) -> Self {
        self.marker = marker;
        self
    }

    /// Writes what is waiting (trying for up to `grace` while the sink
    /// fails, at most [`REFUSED_FOR`] of it while the database refuses
    /// connections) and stops the writer. Waits at most `grace` plus
    /// [`SHUTDOWN_SLACK`]: a write that hangs does not hold the process
    /// longer.
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
        if let Some(m) = self.marker.take() {
            // Graceful: what was not written by now is logged below, not
            // lost to a crash.
            m.clean_end();
        }
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
    let mut pruning: Option<Pruning> = None;
    let write_timeout = settings.write_timeout;
    loop {
        if let Some(retention) = settings.retention {
            if pruning.is_none() && tokio::time::Instant::now() >= next_prune {
                next_prune += PRUNE_EVERY;
                pruning = Some(Pruning {
                    before: clock
                        .now_micros()
                        .saturating_sub(retention.as_micros() as u64),
                    batch: PRUNE_ROWS,
                    deleted: 0,
                    started: tokio::time::Instant::now(),
                });
            }
        }
        if let Some(p) = &mut pruning {
            if prune_batch(&*sink, p, write_timeout).await {
                pruning = None;
            }
        }
        let orphaned = if pruning.is_some() {
            // Mid-prune: write what waits now, then the next batch; a
            // shutdown is seen between batches.
            stop.has_changed().is_err()
        } else {
            tokio::select! {
                _ = tokio::time::sleep(settings.batch_interval) => false,
                _ = buffer.batch_ready() => false,
                changed = stop.changed() => changed.is_err(),
            }
        };
        if orphaned {
            // The writer's handle was dropped without a shutdown.
            write_waiting(
                &buffer,
                &*sink,
                settings.batch_rows,
                write_timeout,
                std::future::pending(),
            )
            .await;
            return;
        }
        let grace = *stop.borrow();
        let grace = match grace {
            Some(grace) => grace,
            None => {
                // A shutdown interrupts this write (the batch goes back to
                // the buffer): its own attempts are bounded from its start.
                let mut stopping = stop.clone();
                let shutdown = async move {
                    if stopping.wait_for(Option::is_some).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                write_waiting(
                    &buffer,
                    &*sink,
                    settings.batch_rows,
                    write_timeout,
                    shutdown,
                )
                .await;
                let Some(grace) = *stop.borrow_and_update() else {
                    continue;
                };
                grace
            }
        };
        flush_at_shutdown(&buffer, &*sink, &settings, grace).await;
        return;
    }
}

/// Writes what is waiting at shutdown. Every attempt ends by the deadline
/// (`grace` from now): a database that hangs costs the shutdown at most its
/// grace. Until [`REFUSED_FOR`] (or the grace, if shorter) no attempt
/// outlasts that mark; past it, a database that refuses connections is
/// given up at once. Rows left are logged as lost.
async fn flush_at_shutdown(
    buffer: &LedgerBuffer,
    sink: &dyn LedgerSink,
    settings: &LedgerSettings,
    grace: Duration,
) {
    let start = tokio::time::Instant::now();
    let deadline = start + grace;
    let refusal_mark = start + grace.min(REFUSED_FOR);
    loop {
        let now = tokio::time::Instant::now();
        let end = if now < refusal_mark {
            refusal_mark
        } else {
            deadline
        };
        let limit = end
            .saturating_duration_since(now)
            .min(settings.write_timeout);
        if !limit.is_zero()
            && write_waiting(
                buffer,
                sink,
                settings.batch_rows,
                limit,
                std::future::pending(),
            )
            .await
        {
            return;
        }
        let now = tokio::time::Instant::now();
        if now >= refusal_mark {
            let within = deadline.saturating_duration_since(now).min(REFUSAL_CHECK);
            if sink.refuses_connections(within).await {
                lost_at_shutdown(buffer, "the database refuses connections", start);
                return;
            }
        }
        let now = tokio::time::Instant::now();
        if now + settings.batch_interval > deadline {
            lost_at_shutdown(buffer, "the grace period is over", start);
            return;
        }
        let pause = if now < refusal_mark {
            settings.batch_interval.min(refusal_mark - now)
        } else {
            settings.batch_interval
        };
        tokio::time::sleep(pause).await;
    }
}

/// Logs the rows a shutdown could not write, with their count (the
/// process is about to exit: no metric would be scraped).
fn lost_at_shutdown(buffer: &LedgerBuffer, why: &'static str, start: tokio::time::Instant) {
    let rows = buffer.held();
    tracing::error!(
        rows,
        reason = why,
        tried_ms = start.elapsed().as_millis() as u64,
        "ledger rows lost at shutdown: not written to the database"
    );
}

/// Writes every row waiting now, batch by batch, each write given at most
/// `limit`; false when the sink failed or timed out, or `interrupt`
/// resolved first (the batch is back in the buffer).
async fn write_waiting(
    buffer: &LedgerBuffer,
    sink: &dyn LedgerSink,
    batch_rows: usize,
    limit: Duration,
    interrupt: impl std::future::Future<Output = ()>,
) -> bool {
    tokio::pin!(interrupt);
    loop {
        let batch = buffer.take(batch_rows);
        if batch.is_empty() {
            crate::metrics::ledger_buffered(buffer.held());
            return true;
        }
        let outcome = tokio::select! {
            r = tokio::time::timeout(limit, sink.write(&batch)) => match r {
                Ok(r) => r,
                Err(_) => Err(LedgerError(format!(
                    "the write did not finish within {} ms",
                    limit.as_millis()
                ))),
            },
            () = &mut interrupt => Err(LedgerError("interrupted by the shutdown".into())),
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

/// Deletes the next batch of `p`'s rows, given at most `limit`; true when
/// the prune is over (no row left past the retention, or the database
/// failed: tried again at the next hour).
async fn prune_batch(sink: &dyn LedgerSink, p: &mut Pruning, limit: Duration) -> bool {
    match tokio::time::timeout(limit, sink.prune(p.before, p.batch)).await {
        Ok(Ok(n)) => {
            p.deleted += n;
            if n < p.batch {
                if p.deleted > 0 {
                    tracing::info!(
                        rows = p.deleted,
                        took_ms = p.started.elapsed().as_millis() as u64,
                        "ledger rows past the retention deleted"
                    );
                }
                return true;
            }
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, deleted = p.deleted, "ledger retention: rows not deleted; tried again in an hour");
            true
        }
        Err(_) if p.batch <= 1 => {
            tracing::warn!(
                timeout_ms = limit.as_millis() as u64,
                deleted = p.deleted,
                "ledger retention: the database does not delete one row in time; tried again in an hour"
            );
            true
        }
        Err(_) => {
            // Rolled back (the statement's future was dropped): smaller
            // batches, so each fits the timeout.
            p.batch /= 2;
            tracing::warn!(
                timeout_ms = limit.as_millis() as u64,
                next_batch = p.batch,
                "ledger retention: a batch did not finish in time; trying smaller ones"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests;
