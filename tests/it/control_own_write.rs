//! A client reads its own write on the gateway that made it:
//! a key created through the admin API answers 200 at once on that
//! gateway, every time. Refreshes run concurrently (the counter poll, the
//! notifications of PostgreSQL, other admin calls' own refreshes): one
//! that read the database before a write must not be installed after the
//! write's own, nor may a write answer before its gateway serves it. Other
//! writes run meanwhile (on the same gateway on SQLite, on a second
//! gateway of the same PostgreSQL), so that the race shows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use reqwest::Method;
use serde_json::json;

use super::control::{config, new_key, ROOT};
use crate::support::postgres::PgServer;
use crate::support::*;

/// Changes the alias of key `bg` of tenant `fresh` through `other` until
/// `stop`; how many changes it made.
fn other_writes(other: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            let (s, v) = admin_call(
                other.as_str(),
                Method::PATCH,
                "/admin/v1/tenants/fresh/keys/bg",
                ROOT,
                Some(json!({ "alias": format!("change {n}") })),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            n += 1;
        }
        n
    })
}

/// Creates `rounds` keys on `gw` one after the other, each used at once,
/// while `other` (a gateway on the same database, maybe `gw`) changes
/// another key; the statuses that were not 200, by round.
async fn create_and_use_at_once(gw: &Gateway, other: &str, rounds: usize) -> Vec<(usize, u16)> {
    let (s, v) = admin_call(
        gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "fresh"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    new_key(gw, "fresh", "bg").await;
    let seen = Instant::now();
    while admin_call(
        other,
        Method::GET,
        "/admin/v1/tenants/fresh/keys/bg",
        ROOT,
        None,
    )
    .await
    .0 != 200
    {
        assert!(seen.elapsed().as_secs() < 2, "{other} never saw key bg");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|_| other_writes(other.to_string(), stop.clone()))
        .collect();
    let started = Instant::now();
    let mut wrong = Vec::new();
    for round in 0..rounds {
        let key = new_key(gw, "fresh", &format!("k{round}")).await;
        let status = post_hi(gw, &key).await;
        if status != 200 {
            wrong.push((round, status));
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut changes = 0;
    for w in writers {
        changes += w.await.unwrap();
    }
    println!(
        "{rounds} keys created and used at once in {took:?} beside {changes} other changes: {} answered otherwise than 200 {wrong:?}",
        wrong.len()
    );
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_created_on_sqlite_answers_200_at_once_on_the_same_gateway() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("control.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    assert_eq!(
        create_and_use_at_once(&gw, &gw.root_url(), 40).await,
        vec![]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_created_on_postgres_answers_200_at_once_on_the_same_gateway() {
    let pg = PgServer::start();
    let mock = start_mock().await;
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10_000_000));
    cfg.control.database_url = Some(pg.url());
    let gw = cfg.start().await;
    let other = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    other.state.set_admin_token(Some(ROOT));
    assert_eq!(
        create_and_use_at_once(&gw, &other.root_url(), 150).await,
        vec![]
    );
}
