//! A refusal decided from a quota lease carries both `x-ratelimit-*`
//! families, as every other refusal the store decides (docs/API.md: only
//! deny-cache and local-limiter refusals describe the refusing budget
//! alone). Fault guarded against: a lease's 429 carried only the
//! `-requests` family (30 of 30 seen). A real `budgetgate serve`
//! on a real Redis: leases live in `serve` only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::redis_server::RedisServer;
use crate::support::*;

/// Per 429 seen: its request id and whether both families came with it.
type Refusals = Arc<Mutex<HashMap<String, (bool, bool)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_decided_from_a_lease_carries_both_header_families() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    // An rpm budget hot at once (min_rate 5), its lease allowed a quarter
    // second of the demand below (160 a second; a lease may hold the whole
    // burst of 60), saturated by it (10 a second refill): the lease runs
    // dry between top-ups and refuses locally.
    let mut c = TestConfig::standard(
        &mock.base_url(),
        16,
        limits().rpm(600).rpm_burst(60).tpm(6_000_000),
    )
    .redis_fleet(&redis.url(), "bgleaseref");
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        min_rate: Some(5),
        max_fraction: Some(1.0),
        report_interval_ms: Some(250),
        ..Default::default()
    });
    let gw = GatewayProcess::start(&c.write(dir.path()), &[]).await;
    let refusals: Refusals = Arc::default();
    let until = Instant::now() + Duration::from_secs(4);
    let http = reqwest::Client::new();
    let mut clients = Vec::new();
    for c in 0..8 {
        let (http, root, refusals) = (http.clone(), gw.root.clone(), refusals.clone());
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while Instant::now() < until {
                tick.tick().await;
                n += 1;
                let id = format!("lease-refusal-{c}-{n}");
                let r = http
                    .post(format!("{root}/v1/chat/completions"))
                    .bearer_auth(KEY)
                    .header("x-request-id", &id)
                    .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}))
                    .send()
                    .await
                    .expect("the gateway answers");
                if r.status() == 429 {
                    let has = |h: &str| r.headers().contains_key(h);
                    let both = (
                        has("x-ratelimit-limit-requests"),
                        has("x-ratelimit-limit-tokens"),
                    );
                    refusals.lock().unwrap().insert(id, both);
                }
                let _ = r.bytes().await;
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let by_lease: Vec<String> = gw
        .logs_with("request refused")
        .iter()
        .filter(|l| l.pointer("/fields/decided_by") == Some(&json!("lease")))
        .filter_map(|l| l.pointer("/fields/request_id").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    let seen = refusals.lock().unwrap().clone();
    println!(
        "{} refusals, {} of them decided from a lease",
        seen.len(),
        by_lease.len()
    );
    assert!(
        !by_lease.is_empty(),
        "no refusal was decided from a lease ({} refusals in all)",
        seen.len()
    );
    for id in &by_lease {
        let both = seen.get(id).copied();
        assert_eq!(
            both,
            Some((true, true)),
            "{id}: the lease's refusal lacks a header family"
        );
    }
}
