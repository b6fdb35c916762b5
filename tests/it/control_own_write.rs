//! A client reads its own write on the gateway that made it (issue 29):
//! a key created through the admin API answers 200 at once on that
//! gateway, every time. The propagation task refreshes concurrently (the
//! counter poll; on PostgreSQL also the notification of the write
//! itself), and a refresh that read the database before a write must not
//! be installed after the write's own.

use std::time::Instant;

use reqwest::Method;
use serde_json::json;

use super::control::{config, new_key, ROOT};
use crate::support::postgres::PgServer;
use crate::support::*;

/// Creates `rounds` keys on `gw` one after the other, each used at once;
/// the statuses that were not 200, by round.
async fn create_and_use_at_once(gw: &Gateway, rounds: usize) -> Vec<(usize, u16)> {
    let (s, v) = admin_call(
        gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "fresh"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let started = Instant::now();
    let mut wrong = Vec::new();
    for round in 0..rounds {
        let key = new_key(gw, "fresh", &format!("k{round}")).await;
        let status = post_hi(gw, &key).await;
        if status != 200 {
            wrong.push((round, status));
        }
    }
    println!(
        "{rounds} keys created and used at once in {:?}: {} answered otherwise than 200 {wrong:?}",
        started.elapsed(),
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
    assert_eq!(create_and_use_at_once(&gw, 60).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_created_on_postgres_answers_200_at_once_on_the_same_gateway() {
    let pg = PgServer::start();
    let mock = start_mock().await;
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10_000_000));
    cfg.control.database_url = Some(pg.url());
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    assert_eq!(create_and_use_at_once(&gw, 60).await, vec![]);
}
