//! Redis killed mid-load (issue: failure policy): fail-open tenants keep
//! getting answers within the timeout, limited by the local share;
//! fail-closed tenants get 503; once Redis is back, decisions return to it.

use std::time::{Duration, Instant};

use crate::support::config::{tenant, RawTenant};
use crate::support::redis_server::RedisServer;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_fails_open_or_closed_per_tenant_and_recovers() {
    let redis = RedisServer::start();
    let port = redis.port();
    let mock = start_mock().await;
    let closed_key = "sk-closed-tenant";
    let mut config =
        TestConfig::standard(&mock.base_url(), 50, limits().rpm(10)).redis(&redis.url());
    let open = config.tenant("t1");
    open.name = "open".into();
    open.on_store_error = Some("fail_open".into());
    config.tenants.push(RawTenant {
        on_store_error: Some("fail_closed".into()),
        ..tenant("closed", "k", closed_key, limits().rpm(100))
    });
    config.store.timeout_ms = Some(100);
    config.store.fallback_share = Some(0.5);
    // The Redis store the config names, read by the gateway as in production.
    let gw = config.start().await;
    assert_eq!(post_hi(&gw, KEY).await, 200);
    assert_eq!(post_hi(&gw, closed_key).await, 200);

    drop(redis); // SIGKILL
    let started = Instant::now();
    let mut open = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        open.push(post_hi(&gw, KEY).await);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a degraded answer took {:?}",
            t.elapsed()
        );
    }
    assert_eq!(
        open,
        vec![200, 200, 200, 200, 200, 429, 429],
        "fail-open: half of rpm 10 locally"
    );
    assert_eq!(post_hi(&gw, closed_key).await, 503, "fail-closed");
    assert!(started.elapsed() < Duration::from_secs(10));
    let text = gw.metrics_text().await;
    assert!(
        text.contains("budgetgate_degraded_decisions_total{tenant=\"open\",mode=\"fail_open\"} 7"),
        "{text}"
    );
    assert!(
        text.contains(
            "budgetgate_degraded_decisions_total{tenant=\"closed\",mode=\"fail_closed\"} 1"
        ),
        "{text}"
    );

    let _redis = RedisServer::start_on(port).expect("restart Redis on the same port");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = post_hi(&gw, closed_key).await;
        if s == 200 {
            break;
        }
        assert_eq!(s, 503);
        assert!(
            Instant::now() < deadline,
            "decisions never returned to Redis"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Back on Redis: the open tenant's budget there is its full rpm again (minus the first request).
    assert_eq!(post_hi(&gw, KEY).await, 200);
}

/// With two streams of a `fail_open` tenant open through Redis on its two
/// slots, Redis paused: the local limiter counts the two the gateway has in
/// flight and admits none more (it used to start empty and admit two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_store_admits_no_more_than_max_concurrent_on_one_gateway() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let mut config =
        TestConfig::standard(&mock.base_url(), 50, limits().max_concurrent(2)).redis(&redis.url());
    config.tenant("t1").on_store_error = Some("fail_open".into());
    config.store.timeout_ms = Some(100);
    config.store.fallback_share = Some(1.0);
    config.store.lease = Some(budgetgate::config::raw::RawLease {
        mode: Some("off".into()),
        ..Default::default()
    });
    let gw = config.start().await;
    mock.state.hold();
    let send = |stream: bool| {
        let url = format!("{}/chat/completions", gw.base_url());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(KEY)
                .json(
                    &serde_json::json!({"model": "gpt-4o-mini", "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}),
                )
                .timeout(Duration::from_secs(4))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let streams = [send(true), send(true)];
    let until = Instant::now() + Duration::from_secs(5);
    while mock.state.held_count() < 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(mock.state.held_count(), 2, "two streams in flight");
    redis.cli(&["client", "pause", "3000", "all"]);
    let paused = Instant::now();
    let more: Vec<_> = (0..4).map(|i| send(i % 2 == 0)).collect();
    let mut most = 0;
    while paused.elapsed() < Duration::from_millis(1_500) {
        most = most.max(mock.state.held_count());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let in_flight = mock.state.held_count();
    mock.state.release();
    let mut statuses = Vec::new();
    for r in more {
        statuses.push(r.await.expect("task").map_err(|e| e.to_string()));
    }
    for s in streams {
        assert_eq!(s.await.expect("task").expect("stream"), 200);
    }
    println!("store paused: at most {most} requests in flight; the 4 more: {statuses:?}");
    assert!(most <= 2 && in_flight <= 2, "{most} in flight on 2 slots");
    assert_eq!(
        statuses,
        vec![Ok(429); 4],
        "refused by the limiter's count of the two"
    );
}
