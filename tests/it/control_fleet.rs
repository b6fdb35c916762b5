//! The control plane of a fleet: three gateways on one real
//! PostgreSQL see a key created through one of them within a second, and
//! refuse it within a second once revoked through another; with
//! PostgreSQL stopped under load, requests keep being served with the
//! last known keys while admin writes answer 503, and writes work again
//! once it is back.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::control::{new_key, ROOT};
use crate::support::postgres::PgServer;
use crate::support::*;

fn fleet_config(mock: &str, pg: &PgServer) -> TestConfig {
    let mut c = TestConfig::standard(mock, 50, limits().tpm(10_000_000));
    c.control.database_url = Some(pg.url());
    c
}

/// Waits until `key` gets `status` on `gw`; how long that took from `since`.
async fn until_status(gw: &Gateway, key: &str, status: u16, since: Instant) -> Duration {
    loop {
        if post_hi(gw, key).await == status {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{} never answered {status}",
            gw.addr
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_created_on_one_gateway_answers_on_all_three_within_a_second_and_is_refused_within_a_second_once_revoked(
) {
    let pg = PgServer::start();
    let mock = start_mock().await;
    let cfg = fleet_config(&mock.base_url(), &pg);
    let gws = [cfg.start().await, cfg.start().await, cfg.start().await];
    for gw in &gws {
        gw.state.set_admin_token(Some(ROOT));
        // Warm (the tokenizer, connections): what is timed is propagation.
        assert_eq!(post_hi(gw, KEY).await, 200);
    }
    let (s, v) = admin_call(
        &gws[0],
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "ml"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let created = Instant::now();
    let key = new_key(&gws[0], "ml", "laptop").await;
    println!("the create call took {:?}", created.elapsed());
    for gw in &gws {
        let took = until_status(gw, &key, 200, created).await;
        println!("key answered 200 on {} after {took:?}", gw.addr);
        assert!(took < Duration::from_secs(1), "{} took {took:?}", gw.addr);
    }
    let revoked = Instant::now();
    let (s, v) = admin_call(
        &gws[1],
        Method::POST,
        "/admin/v1/tenants/ml/keys/laptop/revoke",
        ROOT,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    for gw in &gws {
        let took = until_status(gw, &key, 401, revoked).await;
        println!("key answered 401 on {} after {took:?}", gw.addr);
        assert!(took < Duration::from_secs(1), "{} took {took:?}", gw.addr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_load_requests_are_served_with_the_last_known_keys_and_admin_writes_answer_503(
) {
    let mut pg = PgServer::start();
    let mock = start_mock().await;
    let cfg = fleet_config(&mock.base_url(), &pg);
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, _) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "ml"})),
    )
    .await;
    assert_eq!(s, 201);
    let key = new_key(&gw, "ml", "k").await;

    let root = gw.root_url();
    let load_key = key.clone();
    let load = tokio::spawn(async move {
        let (mut ok, mut other) = (0u32, 0u32);
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if post_hi(&root, &load_key).await == 200 {
                ok += 1;
            } else {
                other += 1;
            }
        }
        (ok, other)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    pg.stop();
    // Past a poll and a failed refresh: the gateway knows the database is gone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "late"})),
    )
    .await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "control_database_unavailable");
    let (s, _) = admin_call(&gw, Method::GET, "/admin/v1/tenants/ml", ROOT, None).await;
    assert_eq!(s, 200, "reads come from the last snapshot");
    let (ok, other) = load.await.unwrap();
    println!("under the outage: {ok} requests answered 200, {other} otherwise");
    assert!(ok > 0);
    assert_eq!(other, 0, "every request was served with the last known key");

    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _) = admin_call(
            &gw,
            Method::POST,
            "/admin/v1/tenants",
            ROOT,
            Some(json!({"name": "late"})),
        )
        .await;
        if s == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "writes never came back ({s})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(post_hi(&gw, &key).await, 200);
}
