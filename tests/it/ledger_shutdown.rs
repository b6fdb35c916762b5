//! The spend ledger's flush at SIGTERM when PostgreSQL is gone (docs/LEDGER.md,
//! "Crash loss bound"), on a real PostgreSQL and a real `budgetgate serve`
//! with the default 30 s grace:
//!
//! - PostgreSQL stopped before the gateway (a stack's `down` in that
//!   order): the gateway exits within 6 s, the rows it could not write
//!   counted in its log, `shutdown complete` its last line;
//! - PostgreSQL back 2 s after the SIGTERM: no row is lost.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::postgres::PgServer;
use crate::support::process::GatewayProcess;
use crate::support::*;

const TOKEN: &str = "ledger-shutdown-admin-token";

fn config(dir: &std::path::Path, mock: &str, pg: &PgServer) -> std::path::PathBuf {
    let mut c = TestConfig::standard(mock, 8, limits().tpm(1_000_000));
    c.control.database_url = Some(pg.url());
    c.server.shutdown_grace_secs = Some(30);
    c.ledger.batch_interval_ms = Some(100);
    c.write(dir)
}

async fn start(path: &std::path::Path) -> GatewayProcess {
    GatewayProcess::start(path, &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await
}

/// `n` chat requests, each answered 200; their request ids.
async fn answered(gw: &GatewayProcess, n: usize) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let r = client
            .post(format!("{}/v1/chat/completions", gw.root))
            .bearer_auth(KEY)
            .json(&json!({"model": "gpt-4o-mini", "max_tokens": 8,
                "messages": [{"role": "user", "content": format!("call {i}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        ids.push(header(&r, "x-request-id").unwrap());
        r.bytes().await.unwrap();
    }
    ids
}

/// The ledger's request ids, read through a gateway's admin API.
async fn ledger_request_ids(gw: &GatewayProcess) -> BTreeSet<String> {
    let r = admin_get(gw, "/admin/v1/spend/rows?limit=100000", Some(TOKEN)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_string())
        .collect()
}

/// A gateway stopped with PostgreSQL down: the ids of its answers, when
/// the SIGTERM was sent, its config (and the upstream it names).
struct Stopping {
    gw: GatewayProcess,
    ids: Vec<String>,
    sigterm: Instant,
    path: std::path::PathBuf,
    _mock: mock_upstream::MockUpstream,
}

/// Starts a gateway on PostgreSQL, answers 3 requests (written), stops
/// PostgreSQL, answers 4 more (buffered), and sends SIGTERM.
async fn sigterm_with_postgres_stopped(pg: &PgServer, dir: &std::path::Path) -> Stopping {
    let mock = start_mock().await;
    let path = config(dir, &mock.base_url(), pg);
    let gw = start(&path).await;
    let mut ids = answered(&gw, 3).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw
        .metric("budgetgate_ledger_rows_total", &[("outcome", "written")])
        .await
        < 3.0
    {
        assert!(Instant::now() < deadline, "{}", gw.dump_logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pg.stop();
    ids.extend(answered(&gw, 4).await);
    // The writer is trying to write them (a refused connection is retried
    // until the pool's acquire timeout): SIGTERM comes in the middle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.signal("TERM");
    Stopping {
        gw,
        ids,
        sigterm: Instant::now(),
        path,
        _mock: mock,
    }
}

fn message_of(line: &Value) -> Option<&str> {
    line.pointer("/fields/message").and_then(Value::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_stopped_before_the_gateway_sigterm_exits_within_6_s_counting_the_lost_rows()
{
    let pg = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    let Stopping {
        mut gw, sigterm, ..
    } = sigterm_with_postgres_stopped(&pg, dir.path()).await;
    let status = gw.wait_exit(Duration::from_secs(40)).await;
    let took = sigterm.elapsed();
    println!("postgres stopped before the gateway: SIGTERM to exit in {took:?}");
    assert_eq!(status.code(), Some(0), "{}", gw.dump_logs());
    crate::shutdown::assert_shutdown_complete_last(&gw).await;
    assert!(
        took < Duration::from_secs(6),
        "SIGTERM to exit took {took:?}:\n{}",
        gw.dump_logs()
    );
    let lost = gw.logs_with("ledger rows lost at shutdown: not written to the database");
    assert_eq!(lost.len(), 1, "{}", gw.dump_logs());
    assert_eq!(lost[0].pointer("/fields/rows"), Some(&json!(4)));
    assert_eq!(
        lost[0].pointer("/fields/reason"),
        Some(&json!("the database refuses connections"))
    );
    // Its outcome comes before the last line.
    let logs = gw.logs();
    let at = |m: &str| logs.iter().position(|l| message_of(l) == Some(m));
    assert!(
        at("ledger rows lost at shutdown: not written to the database") < at("shutdown complete")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_back_2_s_after_sigterm_no_ledger_row_is_lost() {
    let mut pg = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    let Stopping {
        mut gw,
        ids,
        sigterm,
        path,
        _mock,
    } = sigterm_with_postgres_stopped(&pg, dir.path()).await;
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(sigterm.elapsed())).await;
    pg.restart();
    let status = gw.wait_exit(Duration::from_secs(40)).await;
    let took = sigterm.elapsed();
    println!("postgres back 2 s after SIGTERM: SIGTERM to exit in {took:?}");
    assert_eq!(status.code(), Some(0), "{}", gw.dump_logs());
    crate::shutdown::assert_shutdown_complete_last(&gw).await;
    assert!(
        gw.logs_with("ledger rows lost at shutdown: not written to the database")
            .is_empty(),
        "{}",
        gw.dump_logs()
    );
    assert!(
        took < Duration::from_secs(6),
        "SIGTERM to exit took {took:?}"
    );
    // Every answer has its row: read through a gateway started afresh.
    let again = start(&path).await;
    let rows = ledger_request_ids(&again).await;
    for id in &ids {
        assert!(rows.contains(id), "no ledger row for {id}: {rows:?}");
    }
    assert_eq!(rows.len(), ids.len());
}
