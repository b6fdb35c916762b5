//! Redis killed mid-load (issue: failure policy): fail-open tenants keep
//! getting answers within the timeout, limited by the local share;
//! fail-closed tenants get 503; once Redis is back, decisions return to it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::legacy::*;
use crate::support::redis_server::RedisServer;
use crate::support::*;
use budgetgate::clock::ManualClock;
use budgetgate::reserve::keys::KeySpace;
use budgetgate::reserve::redis::RedisStore;
use budgetgate::reserve::BudgetStore;
use serde_json::json;

async fn post(gw: &Gateway, key: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(key)
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("no request hangs")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_fails_open_or_closed_per_tenant_and_recovers() {
    let redis = RedisServer::start();
    let port = redis.port();
    let mock = start_mock().await;
    let closed_key = "sk-closed-tenant";
    let extra = format!(
        "on_store_error = \"fail_open\"\n[[tenants]]\nname = \"closed\"\nkeys = [{{ id = \"k\", sha256 = \"{}\" }}]\nlimits = {{ rpm = 100 }}\non_store_error = \"fail_closed\"",
        budgetgate::config::hash_key(closed_key)
    );
    let cfg = config(&mock.base_url(), 50, "rpm = 10", &extra)
        .replace("name = \"t1\"", "name = \"open\"")
        .replace(
            "[estimation]",
            &format!("[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 100\nfallback_share = 0.5\n[estimation]", redis.url()),
        );
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::connect(
            &redis.url(),
            Duration::from_millis(100),
            KeySpace::new("budgetgate", "default"),
        )
        .await
        .expect("connect"),
    );
    let gw = start_gateway_with(&cfg, ManualClock::new(NOON), store).await;
    assert_eq!(post(&gw, KEY).await, 200);
    assert_eq!(post(&gw, closed_key).await, 200);

    drop(redis); // SIGKILL
    let started = Instant::now();
    let mut open = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        open.push(post(&gw, KEY).await);
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
    assert_eq!(post(&gw, closed_key).await, 503, "fail-closed");
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
        let s = post(&gw, closed_key).await;
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
    assert_eq!(post(&gw, KEY).await, 200);
}
