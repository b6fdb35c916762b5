//! The ledger reconciled against the budgets:
//! `GET /admin/v1/reconcile` and `budgetgate reconcile` compare each
//! calendar quota's store counter with the ledger's sum over its window and
//! explain the difference by its known causes. On real `budgetgate serve`
//! processes:
//!
//! - Redis replies lost (a delaying proxy, as `redis_lost_replies`): the
//!   compensated reservations leave nothing unexplained;
//! - PostgreSQL stopped (`ledger_faults`, which calls [`assert_reconciled`]
//!   at its end): the dropped rows explain the difference;
//! - kill -9 of a gateway on Redis: after the restart, the difference is
//!   within the crash-loss bound and named `lost_in_a_crash`, also when
//!   no row of the window survived;
//! - rows deleted by hand: the command exits non-zero naming the quota.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::redis_lost_replies::DelayProxy;
use crate::support::redis_server::RedisServer;
use crate::support::*;

const TOKEN: &str = "reconcile-admin-token";

/// The reconciliation of every tenant, as `token` reads it.
pub(crate) async fn reconciled(gw: &(impl Endpoint + ?Sized), token: &str) -> Value {
    let (s, v) = admin_call(gw, reqwest::Method::GET, "/admin/v1/reconcile", token, None).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Quota `budget` of `tenant:t1` in a reconciliation.
pub(crate) fn quota<'a>(v: &'a Value, budget: &str) -> &'a Value {
    v["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["scope"] == "tenant:t1" && q["budget"] == budget)
        .unwrap_or_else(|| panic!("no {budget} of tenant:t1 in {v}"))
}

/// The units cause `cause` explains in quota `q` (0 when absent).
pub(crate) fn explains(q: &Value, cause: &str) -> u64 {
    q["causes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cause"] == cause)
        .map_or(0, |c| c["explains"].as_u64().unwrap())
}

/// Asserts that nothing is unexplained in `tenant:t1`'s `tokens_per_day`
/// and that its ledger counted something; returns the quota.
pub(crate) async fn assert_reconciled(gw: &(impl Endpoint + ?Sized), token: &str) -> Value {
    let v = reconciled(gw, token).await;
    let q = quota(&v, "tokens_per_day").clone();
    println!("reconciled: {q}");
    assert!(q["ledger"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(q["unexplained"], 0, "{v}");
    assert_eq!(v["over_threshold"], false, "{v}");
    q
}

/// Waits until the gateway has no ledger row buffered (past a batch
/// interval first: the gauge is set when a write ends).
pub(crate) async fn flushed(gw: &GatewayProcess) {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while gw.metric("budgetgate_ledger_buffered_rows", &[]).await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the ledger was not written in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ask() -> Value {
    serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 20,
        "messages": [{"role": "user", "content": "hello there"}]})
}

/// `n` requests, one after the other; their statuses.
async fn send(gw: &GatewayProcess, n: usize, pause: Duration) -> Vec<u16> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for _ in 0..n {
        let r = http
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(KEY)
            .json(&ask())
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("no request hangs");
        out.push(r.status().as_u16());
        let _ = r.bytes().await;
        tokio::time::sleep(pause).await;
    }
    out
}

fn no_leases() -> budgetgate::config::raw::RawLease {
    budgetgate::config::raw::RawLease {
        mode: Some("off".into()),
        ..Default::default()
    }
}

/// Redis replies late (past the store timeout) for a while: the gateway
/// fails closed and compensates the reservations the scripts applied
/// anyway. Once they land, the ledger and the store agree to the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_lost_replies_nothing_is_unexplained() {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(redis.port()).await;
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(
        &mock.base_url(),
        50,
        limits().tpm(100_000).rpm(1_000).tokens_per_day(1_000_000),
    )
    .redis(&proxy.url());
    c.store.timeout_ms = Some(100);
    c.store.key_prefix = Some("bgreconlost".into());
    c.store.lease = Some(no_leases());
    c.tenant("t1").on_store_error = Some("fail_closed".into());
    c.ledger.batch_interval_ms = Some(100);
    let gw =
        GatewayProcess::start(&c.write(dir.path()), &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    assert!(send(&gw, 10, Duration::ZERO)
        .await
        .iter()
        .all(|s| *s == 200));
    proxy.set_delay(300);
    let lost = send(&gw, 10, Duration::from_millis(150)).await;
    assert!(lost.iter().all(|s| *s == 503), "{lost:?}");
    proxy.set_delay(0);
    // Once the store answers in time again (calls paused after the
    // failures resume), more are admitted.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut admitted = 0;
    while admitted < 5 {
        assert!(Instant::now() < deadline, "the store never answered again");
        admitted += send(&gw, 1, Duration::from_millis(100))
            .await
            .iter()
            .filter(|s| **s == 200)
            .count();
    }
    flushed(&gw).await;
    // The compensations land in the background.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = reconciled(&gw, TOKEN).await;
        let q = quota(&v, "tokens_per_day");
        if q["difference"] == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let q = assert_reconciled(&gw, TOKEN).await;
    assert_eq!(q["difference"], 0, "{q}");
    assert!(q["ledger_rows"].as_u64().unwrap() >= 15, "{q}");
    assert_eq!(q["store"], q["ledger"], "{q}");
}

/// kill -9 of a gateway on Redis under load: the rows it still buffered
/// are lost; the restarted gateway knows its previous run crashed, and the
/// difference is within the crash-loss bound, named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_difference_is_within_the_crash_bound_and_named() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(
        &mock.base_url(),
        8,
        limits().tpm(1_000_000_000).tokens_per_day(1_000_000_000),
    )
    .redis(&redis.url());
    c.store.key_prefix = Some("bgreconkill".into());
    c.store.lease = Some(no_leases());
    c.ledger.batch_interval_ms = Some(1_000);
    c.control.database_url = Some(format!(
        "sqlite://{}",
        dir.path().join("control.db").display()
    ));
    let path = c.write(dir.path());
    let state_dir = state.path().to_str().unwrap().to_string();
    let env = [
        ("BUDGETGATE_ADMIN_TOKEN", TOKEN),
        ("RUST_LOG", "warn"),
        ("STATE_DIRECTORY", state_dir.as_str()),
    ];
    let gw = GatewayProcess::start(&path, &env).await;
    let until = Instant::now() + Duration::from_millis(2_600);
    let root = gw.base_url();
    let mut load = Vec::new();
    for _ in 0..6 {
        let root = root.clone();
        load.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut answered = 0u64;
            while Instant::now() < until {
                let r = http
                    .post(format!("{root}/chat/completions"))
                    .bearer_auth(KEY)
                    .json(&ask())
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => answered += 1,
                    Ok(_) => {}
                    Err(_) => return answered,
                }
            }
            answered
        }));
    }
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    gw.kill().await;
    let mut answered = 0;
    for l in load {
        answered += l.await.unwrap();
    }
    assert!(answered > 50, "load before the kill: {answered}");

    let gw = GatewayProcess::start(&path, &env).await;
    flushed(&gw).await;
    let v = reconciled(&gw, TOKEN).await;
    println!("after kill -9 ({answered} answered): {v}");
    let crash = &v["previous_crash"];
    assert!(crash["started_micros"].is_u64(), "{v}");
    assert_eq!(crash["buffer_rows"], 100_000, "{v}");
    let q = quota(&v, "tokens_per_day");
    let difference = q["difference"].as_i64().unwrap();
    assert!(difference > 0, "the kill lost buffered rows: {v}");
    assert_eq!(q["unexplained"], 0, "{v}");
    let lost = explains(q, "lost_in_a_crash");
    assert!(lost > 0, "named as lost in a crash: {v}");
    assert_eq!(
        lost + explains(q, "holds_in_flight"),
        difference as u64,
        "{v}"
    );
    // Lost rows are rows the ledger never got: it counted fewer than answered.
    assert!(q["ledger_rows"].as_u64().unwrap() < answered, "{v}");
}

/// kill -9 before the ledger wrote any row of the window (a tenant whose
/// day began shortly before the crash): every row of it was lost, and the
/// difference is still named `lost_in_a_crash`, within a bound of the
/// largest request the tenant's budgets admit (no row survived to size it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_that_lost_every_row_of_the_window_the_difference_is_named() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(
        &mock.base_url(),
        8,
        limits().tpm(100_000).tokens_per_day(1_000_000),
    )
    .redis(&redis.url());
    c.store.key_prefix = Some("bgreconall".into());
    c.store.lease = Some(no_leases());
    // No batch is written before the kill.
    c.ledger.batch_interval_ms = Some(60_000);
    c.control.database_url = Some(format!(
        "sqlite://{}",
        dir.path().join("control.db").display()
    ));
    let path = c.write(dir.path());
    let state_dir = state.path().to_str().unwrap().to_string();
    let env = [
        ("BUDGETGATE_ADMIN_TOKEN", TOKEN),
        ("RUST_LOG", "warn"),
        ("STATE_DIRECTORY", state_dir.as_str()),
    ];
    let gw = GatewayProcess::start(&path, &env).await;
    assert!(send(&gw, 10, Duration::ZERO)
        .await
        .iter()
        .all(|s| *s == 200));
    gw.kill().await;

    let gw = GatewayProcess::start(&path, &env).await;
    let v = reconciled(&gw, TOKEN).await;
    println!("after kill -9, no row written: {v}");
    assert!(v["previous_crash"]["started_micros"].is_u64(), "{v}");
    let q = quota(&v, "tokens_per_day");
    assert_eq!(q["ledger_rows"], 0, "every row was lost: {v}");
    let difference = q["difference"].as_i64().unwrap();
    assert!(difference > 0, "{v}");
    assert_eq!(q["unexplained"], 0, "{v}");
    assert_eq!(explains(q, "lost_in_a_crash"), difference as u64, "{v}");
    let bound = q["causes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cause"] == "lost_in_a_crash")
        .and_then(|c| c["bound"].as_u64());
    // 100,000 rows of at most the tpm burst.
    assert_eq!(bound, Some(100_000 * 100_000), "{v}");
}

/// Rows deleted from the ledger by hand: `budgetgate reconcile` exits
/// non-zero and names the quota and the unexplained difference, exactly
/// the deleted rows' tokens; a threshold above it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_deleted_by_hand_are_unexplained_and_the_command_fails() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let mut c = TestConfig::standard(
        &mock.base_url(),
        8,
        limits().tpm(1_000_000).tokens_per_day(1_000_000),
    );
    c.control.database_url = Some(format!("sqlite://{}", db.display()));
    c.ledger.batch_interval_ms = Some(100);
    let gw =
        GatewayProcess::start(&c.write(dir.path()), &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    assert!(send(&gw, 12, Duration::ZERO)
        .await
        .iter()
        .all(|s| *s == 200));
    flushed(&gw).await;
    let before = assert_reconciled(&gw, TOKEN).await;
    assert_eq!(before["difference"], 0, "{before}");

    // The drift: three rows deleted by hand.
    let pool = sqlx::sqlite::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let deleted: i64 = sqlx::query_scalar(
        "SELECT SUM(charged_tokens) FROM (SELECT charged_tokens FROM spend_ledger ORDER BY at_micros LIMIT 3)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM spend_ledger WHERE reservation_id IN (SELECT reservation_id FROM spend_ledger ORDER BY at_micros LIMIT 3)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert!(deleted > 0);

    let run = |threshold: u64| {
        let root = gw.root_url();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
                .args([
                    "reconcile",
                    "--url",
                    &root,
                    "--threshold",
                    &threshold.to_string(),
                ])
                .env("BUDGETGATE_ADMIN_TOKEN", TOKEN)
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(0).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tokens_per_day of tenant:t1")
            && stderr.contains(&format!("{deleted} unexplained")),
        "{stderr}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let q = quota(&v, "tokens_per_day");
    assert_eq!(q["difference"], deleted, "{v}");
    assert_eq!(q["unexplained"], deleted, "{v}");
    let out = run(deleted as u64).await;
    assert!(out.status.success(), "{out:?}");
}

/// A TCP proxy to `upstream` that can be unplugged: while it is, every
/// connection through it is closed and new ones are closed at once (the
/// store is unreachable; nothing sent reaches it).
struct Plug {
    port: u16,
    on: tokio::sync::watch::Sender<bool>,
}

impl Plug {
    async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (on, _) = tokio::sync::watch::channel(true);
        let plugged = on.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut off = plugged.subscribe();
                if !*off.borrow_and_update() {
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut cr, &mut sw) => {}
                        _ = tokio::io::copy(&mut sr, &mut cw) => {}
                        _ = off.wait_for(|on| !*on) => {}
                    }
                });
            }
        });
        Self { port, on }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn set(&self, on: bool) {
        self.on.send_replace(on);
    }
}

/// A `fail_open` tenant's requests while Redis is unreachable are served
/// by the local limiter: their spend is in the ledger and never in the
/// store. Reconciliation names it (`served_by_fail_open_limiter`), to the
/// token; it used to report the whole difference with `causes: []`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_fail_open_limiter_served_is_named_with_its_amount() {
    let redis = RedisServer::start();
    let plug = Plug::start(redis.port()).await;
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(
        &mock.base_url(),
        50,
        limits().tpm(100_000).rpm(1_000).tokens_per_day(1_000_000),
    )
    .redis(&plug.url());
    c.store.timeout_ms = Some(200);
    c.store.key_prefix = Some("bgreconopen".into());
    c.store.lease = Some(no_leases());
    c.tenant("t1").on_store_error = Some("fail_open".into());
    c.ledger.batch_interval_ms = Some(100);
    let gw =
        GatewayProcess::start(&c.write(dir.path()), &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    assert!(send(&gw, 5, Duration::ZERO).await.iter().all(|s| *s == 200));
    flushed(&gw).await;
    let before = assert_reconciled(&gw, TOKEN).await;
    assert_eq!(before["difference"], 0, "{before}");

    plug.set(false);
    let served = send(&gw, 5, Duration::from_millis(50)).await;
    assert!(served.iter().all(|s| *s == 200), "{served:?}");
    plug.set(true);
    flushed(&gw).await;
    // The store answers again (the connection is replaced) and the
    // compensations of the calls that failed have landed.
    let deadline = Instant::now() + Duration::from_secs(15);
    let v = loop {
        let (s, v) = admin_call(
            &gw,
            reqwest::Method::GET,
            "/admin/v1/reconcile",
            TOKEN,
            None,
        )
        .await;
        if s == 200 && quota(&v, "tokens_per_day")["store"] == before["store"] {
            break v;
        }
        assert!(Instant::now() < deadline, "the store never answered: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let q = quota(&v, "tokens_per_day");
    println!("after 5 requests served by the fail-open limiter: {q}");
    let limiter = q["ledger"].as_u64().unwrap() - before["ledger"].as_u64().unwrap();
    assert!(limiter > 0, "{v}");
    assert_eq!(
        q["store"], before["store"],
        "the store never counted them: {v}"
    );
    assert_eq!(q["difference"], -(limiter as i64), "{v}");
    assert_eq!(explains(q, "served_by_fail_open_limiter"), limiter, "{v}");
    assert_eq!(q["unexplained"], 0, "{v}");
}
