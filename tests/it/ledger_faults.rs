//! The spend ledger under faults (docs/LEDGER.md), on a real
//! PostgreSQL and real `budgetgate serve` processes:
//!
//! - kill -9 under load: after a restart the ledger has lost only rows
//!   answered within the stated bound (one batch interval, plus the batch
//!   whose write the kill interrupted) before the kill, and holds no row
//!   twice;
//! - PostgreSQL stopped under load: every request is still answered; the
//!   buffer keeps rows up to its bound and drops the rest, counted in
//!   `budgetgate_ledger_rows_total{outcome="dropped"}`; once PostgreSQL is
//!   back the buffer is written, and the ledger holds every answered
//!   request but the dropped ones.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::postgres::PgServer;
use crate::support::process::GatewayProcess;
use crate::support::*;

const TOKEN: &str = "ledger-faults-admin-token";

/// What the load saw: each answer's request id and when it arrived.
#[derive(Default)]
struct Seen {
    answered: Mutex<Vec<(Instant, String)>>,
    other: Mutex<BTreeMap<String, usize>>,
    slowest: Mutex<Duration>,
}

/// `workers` clients sending chat requests to `root` until `until` or
/// until the gateway stops answering.
fn drive(
    root: String,
    workers: usize,
    until: Instant,
    seen: Arc<Seen>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    (0..workers)
        .map(|w| {
            let (client, root, seen) = (client.clone(), root.clone(), seen.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < until {
                    i += 1;
                    let sent = Instant::now();
                    let r = client
                        .post(format!("{root}/v1/chat/completions"))
                        .bearer_auth(KEY)
                        .json(&serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 8,
                            "messages": [{"role": "user", "content": format!("worker {w} call {i}")}]}))
                        .send()
                        .await;
                    let r = match r {
                        Ok(r) => r,
                        // The gateway was killed: this worker is done.
                        Err(_) => return,
                    };
                    let status = r.status().as_u16();
                    let id = header(&r, "x-request-id").unwrap_or_default();
                    let body = r.bytes().await;
                    let took = sent.elapsed();
                    {
                        let mut s = seen.slowest.lock().unwrap();
                        *s = (*s).max(took);
                    }
                    if status == 200 && body.is_ok() {
                        seen.answered.lock().unwrap().push((Instant::now(), id));
                    } else {
                        *seen.other.lock().unwrap().entry(status.to_string()).or_default() += 1;
                    }
                }
            })
        })
        .collect()
}

/// The ledger's reservation ids, read through the admin API.
async fn ledger_ids(gw: &GatewayProcess) -> Vec<String> {
    let r = admin_get(gw, "/admin/v1/spend/rows?limit=100000", Some(TOKEN)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reservation_id"].as_str().unwrap().to_string())
        .collect()
}

fn config(
    dir: &std::path::Path,
    mock: &str,
    pg: &PgServer,
    batch_ms: i64,
    buffer_rows: i64,
) -> std::path::PathBuf {
    let mut c = TestConfig::standard(
        mock,
        8,
        limits().tpm(1_000_000_000).tokens_per_day(1_000_000_000),
    );
    c.control.database_url = Some(pg.url());
    c.ledger.batch_interval_ms = Some(batch_ms);
    c.ledger.buffer_rows = Some(buffer_rows);
    c.write(dir)
}

async fn start(path: &std::path::Path) -> GatewayProcess {
    GatewayProcess::start(
        path,
        &[("BUDGETGATE_ADMIN_TOKEN", TOKEN), ("RUST_LOG", "warn")],
    )
    .await
}

/// Rows the gateway's ledger wrote (new ones) since it started.
async fn written(gw: &GatewayProcess) -> usize {
    gw.metric("budgetgate_ledger_rows_total", &[("outcome", "written")])
        .await as usize
}

/// Waits until the gateway has no ledger row buffered.
async fn flushed(gw: &GatewayProcess) {
    // Past a batch interval first: the gauge is set when a write ends, and
    // rows recorded since wait for the next one.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while gw.metric("budgetgate_ledger_buffered_rows", &[]).await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the ledger buffer was not written within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_at_most_the_last_batch_interval_and_never_a_row_twice() {
    const BATCH_MS: u64 = 500;
    let pg = PgServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &mock.base_url(), &pg, BATCH_MS as i64, 100_000);
    let gw = start(&path).await;

    let seen = Arc::new(Seen::default());
    let workers = drive(
        gw.root.clone(),
        8,
        Instant::now() + Duration::from_secs(30),
        seen.clone(),
    );
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let killed_at = Instant::now();
    gw.kill().await;
    for w in workers {
        w.await.unwrap();
    }
    let before: Vec<(Instant, String)> = seen.answered.lock().unwrap().clone();
    assert!(before.len() > 100, "load before the kill: {}", before.len());

    let gw = start(&path).await;
    // More load after the restart, then everything written.
    let after_seen = Arc::new(Seen::default());
    for w in drive(
        gw.root.clone(),
        4,
        Instant::now() + Duration::from_millis(800),
        after_seen.clone(),
    ) {
        w.await.unwrap();
    }
    flushed(&gw).await;

    let ids = ledger_ids(&gw).await;
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a reservation written twice");
    let after: Vec<String> = after_seen
        .answered
        .lock()
        .unwrap()
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    for id in &after {
        assert!(
            unique.contains(id),
            "{id}, answered after the restart, has no row"
        );
    }
    let answered: BTreeSet<&String> = before
        .iter()
        .map(|(_, id)| id)
        .chain(after.iter())
        .collect();
    for id in &ids {
        assert!(answered.contains(id), "row {id} is no answered request");
    }
    let lost: Vec<Duration> = before
        .iter()
        .filter(|(_, id)| !unique.contains(id))
        .map(|(at, _)| killed_at.saturating_duration_since(*at))
        .collect();
    let oldest = lost.iter().max().copied().unwrap_or_default();
    println!(
        "kill -9: {} answered before the kill, {} rows of them kept, {} lost (answered at most {oldest:?} before the kill; batch interval {BATCH_MS} ms); {} answered after the restart, all in the ledger",
        before.len(),
        before.len() - lost.len(),
        lost.len(),
        after.len()
    );
    // The stated bound: one batch interval of settlements, and the batch
    // being written when the process died (its write takes a few ms here;
    // 250 ms is the margin for a loaded machine).
    assert!(
        oldest <= Duration::from_millis(BATCH_MS + 250),
        "a row answered {oldest:?} before the kill was lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_load_the_ledger_buffers_to_its_bound_drops_with_a_metric_and_writes_the_rest_when_it_returns(
) {
    // Far above a batch interval's rows (100 ms of this load), far below
    // the outage's.
    const BOUND: usize = 600;
    let mut pg = PgServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &mock.base_url(), &pg, 100, BOUND as i64);
    let gw = start(&path).await;
    // Load with PostgreSQL up, all of it written.
    let before = Arc::new(Seen::default());
    for w in drive(
        gw.root.clone(),
        4,
        Instant::now() + Duration::from_millis(800),
        before.clone(),
    ) {
        w.await.unwrap();
    }
    flushed(&gw).await;
    let written_before = written(&gw).await;
    let answered_before = before.answered.lock().unwrap().len();
    assert_eq!(
        written_before, answered_before,
        "every answer written while the database is up"
    );

    // Load with PostgreSQL stopped: long enough to fill the bound many times over.
    pg.stop();
    let during = Arc::new(Seen::default());
    for w in drive(
        gw.root.clone(),
        4,
        Instant::now() + Duration::from_millis(2_500),
        during.clone(),
    ) {
        w.await.unwrap();
    }
    let answered_during = during.answered.lock().unwrap().len();
    let other = during.other.lock().unwrap().clone();
    let slowest = *during.slowest.lock().unwrap();
    let dropped = gw
        .metric("budgetgate_ledger_rows_total", &[("outcome", "dropped")])
        .await as usize;
    assert!(
        other.is_empty(),
        "every request was answered 200 during the outage: {other:?}"
    );
    assert!(
        answered_during > 2 * BOUND,
        "load during the outage: {answered_during}"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "a request waited {slowest:?}: the ledger must never block requests"
    );

    // PostgreSQL back: the buffer (the bound's worth) is written.
    pg.restart();
    flushed(&gw).await;
    let written_after = written(&gw).await - written_before;
    let ids = ledger_ids(&gw).await;
    let unique: BTreeSet<&String> = ids.iter().collect();
    println!(
        "postgres stopped: {answered_during} requests answered during the outage (slowest {slowest:?}), buffer bound {BOUND}: {dropped} dropped (budgetgate_ledger_rows_total{{outcome=\"dropped\"}}), {written_after} written once it was back; {} rows in all for {} answered",
        ids.len(),
        answered_before + answered_during
    );
    assert_eq!(
        dropped,
        answered_during - BOUND,
        "past the bound, each row dropped and counted"
    );
    assert_eq!(
        written_after, BOUND,
        "the buffer held its bound and was written"
    );
    assert_eq!(unique.len(), ids.len(), "a reservation written twice");
    assert_eq!(
        ids.len(),
        answered_before + answered_during - dropped,
        "rows = answered − dropped"
    );
    let answered: BTreeSet<String> = before
        .answered
        .lock()
        .unwrap()
        .iter()
        .chain(during.answered.lock().unwrap().iter())
        .map(|(_, id)| id.clone())
        .collect();
    for id in &ids {
        assert!(answered.contains(id), "row {id} is no answered request");
    }
    // Reconciled: the store counted every answer, the ledger
    // all but the dropped rows, and the dropped rows explain the rest.
    let q = crate::reconcile::assert_reconciled(&gw, TOKEN).await;
    let difference = q["difference"].as_i64().unwrap();
    assert!(difference > 0, "{q}");
    assert_eq!(
        crate::reconcile::explains(&q, "dropped"),
        difference as u64,
        "{q}"
    );
}
