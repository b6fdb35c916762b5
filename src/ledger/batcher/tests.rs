use super::*;
use crate::clock::ManualClock;
use crate::config::ledger::WRITE_TIMEOUT;
use crate::ledger::capture::tests::row;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A sink in memory that can be taken down, keyed like the table.
#[derive(Default)]
struct MemorySink {
    rows: Mutex<BTreeMap<String, SpendRow>>,
    down: AtomicBool,
    /// While down: whether it refuses connections (else it accepts them
    /// and fails).
    refuses: AtomicBool,
    writes: Mutex<Vec<usize>>,
    pruned_before: Mutex<Vec<u64>>,
    /// How long one prune statement takes (a large table's).
    prune_takes: Mutex<Duration>,
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
    async fn prune(&self, before: u64, at_most: u64) -> Result<u64, LedgerError> {
        self.pruned_before.lock().unwrap().push(before);
        let takes = *self.prune_takes.lock().unwrap();
        tokio::time::sleep(takes).await;
        let mut t = self.rows.lock().unwrap();
        let mut old: Vec<(u64, String)> = t
            .values()
            .filter(|r| r.at_micros < before)
            .map(|r| (r.at_micros, r.reservation_id.clone()))
            .collect();
        old.sort();
        old.truncate(at_most as usize);
        for (_, id) in &old {
            t.remove(id);
        }
        Ok(old.len() as u64)
    }
    async fn refuses_connections(&self, _within: Duration) -> bool {
        self.down.load(Ordering::SeqCst) && self.refuses.load(Ordering::SeqCst)
    }
}

fn settings(buffer_rows: usize) -> LedgerSettings {
    LedgerSettings {
        enabled: true,
        batch_interval: Duration::from_secs(1),
        batch_rows: 3,
        buffer_rows,
        retention: None,
        write_timeout: WRITE_TIMEOUT,
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

/// A sink down at shutdown (refusing connections or not), back after
/// `back_after` if any; returns how long the shutdown of a 30 s grace took
/// and the rows written.
async fn shutdown_while_down(refuses: bool, back_after: Option<Duration>) -> (Duration, usize) {
    let sink = Arc::new(MemorySink::default());
    sink.down.store(true, Ordering::SeqCst);
    sink.refuses.store(refuses, Ordering::SeqCst);
    let (buffer, w) = start(&sink, settings(100));
    buffer.record(row("r1", 5));
    buffer.record(row("r2", 5));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    if let Some(after) = back_after {
        let sink = sink.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            sink.down.store(false, Ordering::SeqCst);
        });
    }
    let started = tokio::time::Instant::now();
    w.shutdown(Duration::from_secs(30)).await;
    let written = sink.rows.lock().unwrap().len();
    (started.elapsed(), written)
}

#[tokio::test(start_paused = true)]
async fn a_database_refusing_connections_at_shutdown_is_given_up_after_refused_for() {
    let (took, written) = shutdown_while_down(true, None).await;
    assert_eq!(written, 0);
    assert!(
        took >= REFUSED_FOR && took < REFUSED_FOR + Duration::from_millis(100),
        "shutdown took {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_database_back_within_refused_for_gets_every_row_at_shutdown() {
    let (took, written) = shutdown_while_down(true, Some(Duration::from_secs(2))).await;
    assert_eq!(written, 2);
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_database_that_accepts_connections_keeps_the_whole_grace() {
    // Back after 20 s: past REFUSED_FOR, within the grace.
    let (took, written) = shutdown_while_down(false, Some(Duration::from_secs(20))).await;
    assert_eq!(written, 2);
    assert!(took >= Duration::from_secs(20), "shutdown took {took:?}");
    let (took, written) = shutdown_while_down(false, None).await;
    assert_eq!(written, 0);
    assert!(took >= Duration::from_secs(29), "shutdown took {took:?}");
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
    async fn prune(&self, before: u64, at_most: u64) -> Result<u64, LedgerError> {
        self.inner.prune(before, at_most).await
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
async fn a_shutdown_interrupts_a_write_in_flight_and_writes_its_batch_again() {
    let sink = hanging(1);
    let buffer = Arc::new(LedgerBuffer::new(100, 3));
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(10_000_000_000));
    let w = LedgerWriter::spawn(buffer.clone(), sink.clone(), settings(100), clock);
    buffer.record(row("r1", 5));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(buffer.held(), 1, "the first write hangs");
    let started = tokio::time::Instant::now();
    w.shutdown(Duration::from_secs(3)).await;
    assert_eq!(sink.inner.rows.lock().unwrap().len(), 1);
    assert!(started.elapsed() < Duration::from_millis(100));
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

/// A row settled now (the writer's clock), inside the retention.
fn fresh(id: &str) -> SpendRow {
    let mut r = row(id, 5);
    r.at_micros = 10_000_000_000;
    r
}

/// `n` rows settled at `at` µs, named `{prefix}{i}`.
fn old_rows(sink: &MemorySink, prefix: &str, n: u64, at: u64) {
    let mut t = sink.rows.lock().unwrap();
    for i in 0..n {
        let mut r = row(&format!("{prefix}{i}"), 1);
        r.at_micros = at;
        t.insert(r.reservation_id.clone(), r);
    }
}

#[tokio::test(start_paused = true)]
async fn rows_settled_during_a_long_prune_are_written_between_its_batches() {
    // Five batches of old rows, each batch's DELETE taking 2 s: the prune
    // runs 10 s, a row settled meanwhile waits for one batch at most.
    let sink = Arc::new(MemorySink::default());
    old_rows(&sink, "old", 5 * PRUNE_ROWS, 1);
    *sink.prune_takes.lock().unwrap() = Duration::from_secs(2);
    let s = LedgerSettings {
        retention: Some(Duration::from_secs(1_000)),
        ..settings(100)
    };
    let (buffer, _w) = start(&sink, s);
    tokio::time::sleep(Duration::from_millis(500)).await;
    buffer.record(fresh("during"));
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let has = |id: &str| sink.rows.lock().unwrap().contains_key(id);
    assert!(has("during"), "written after the batch under way");
    assert!(
        sink.rows.lock().unwrap().len() > 3 * PRUNE_ROWS as usize,
        "the prune is not over"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(sink.rows.lock().unwrap().len(), 1, "every old row deleted");
    assert_eq!(
        sink.pruned_before.lock().unwrap().len(),
        6,
        "five full batches, then one that finds none"
    );
}

#[tokio::test(start_paused = true)]
async fn a_prune_batch_past_the_write_timeout_is_retried_smaller() {
    let sink = Arc::new(MemorySink::default());
    old_rows(&sink, "old", 10, 1);
    *sink.prune_takes.lock().unwrap() = WRITE_TIMEOUT + Duration::from_secs(1);
    let s = LedgerSettings {
        retention: Some(Duration::from_secs(1_000)),
        ..settings(100)
    };
    let (buffer, _w) = start(&sink, s);
    tokio::time::sleep(Duration::from_secs(5)).await;
    buffer.record(fresh("during"));
    // The database is fast again, but the batch under way still hangs.
    *sink.prune_takes.lock().unwrap() = Duration::from_millis(10);
    tokio::time::sleep(WRITE_TIMEOUT - Duration::from_secs(5) - Duration::from_millis(1)).await;
    assert_eq!(sink.rows.lock().unwrap().len(), 10, "nothing deleted yet");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ids: Vec<String> = sink.rows.lock().unwrap().keys().cloned().collect();
    assert_eq!(
        ids,
        ["during"],
        "given up at the timeout, then deleted by a smaller batch"
    );
}
