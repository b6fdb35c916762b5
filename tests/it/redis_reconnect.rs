//! A Redis restart: each serving thread's dead
//! connection is replaced before its next call, and store calls are not
//! paused for long after the outage, so once Redis answers again a
//! fail-closed tenant is served at once.
//!
//! Run: `cargo test --all-features --test redis_reconnect -- --nocapture`.

use std::time::{Duration, Instant};

use crate::support::mock_upstream::{self, MockConfig};
use crate::support::redis_server::{cli, RedisServer};
use crate::support::*;

fn config(upstream: &str, redis_url: &str) -> TestConfig {
    let mut c =
        TestConfig::standard(upstream, 16, limits().rpm(100_000).tpm(10_000_000)).redis(redis_url);
    c.store.timeout_ms = Some(200);
    c.store.key_prefix = Some("bgreconnect".into());
    c.tenant("t1").on_store_error = Some("fail_closed".into());
    c
}

/// One request on a fresh connection (so requests spread over the
/// gateway's serving threads, each with its own Redis connection).
async fn post(base: &str) -> u16 {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    http.post(format!("{base}/chat/completions"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        }))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_redis_restart_every_request_succeeds_once_redis_answers_for_a_second() {
    let redis = RedisServer::start();
    let port = redis.port();
    let mock = mock_upstream::start(MockConfig::default())
        .await
        .expect("mock");
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("reconnect.toml");
    config(&mock.base_url(), &redis.url()).write_to(&cfg);
    let gw = GatewayProcess::start(&cfg, &[("RUST_LOG", "warn")]).await;
    for _ in 0..10 {
        assert_eq!(post(&gw.base_url()).await, 200, "before the restart");
    }

    drop(redis); // SIGKILL
                 // An outage of ~6 s with traffic: every thread finds its connection
                 // dead and its calls failing.
    let down = Instant::now();
    let mut during = Vec::new();
    while down.elapsed() < Duration::from_secs(6) {
        during.push(post(&gw.base_url()).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        during.iter().all(|s| *s == 503),
        "fail-closed while Redis is down: {during:?}"
    );

    let _redis = RedisServer::start_on(port).expect("restart Redis on the same port");
    let answered = Instant::now();
    while cli(port, &["ping"]).trim() != "PONG" {
        assert!(answered.elapsed() < Duration::from_secs(5), "Redis back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut after = Vec::new();
    for _ in 0..20 {
        after.push(post(&gw.base_url()).await);
    }
    let failed = after.iter().filter(|s| **s != 200).count();
    println!("after the restart: {failed} of 20 failed ({after:?})");
    assert_eq!(failed, 0, "{after:?}");
}
