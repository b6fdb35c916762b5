//! A leased stream outlives the lease state it started under
//! (DESIGN section 14, "Leases under change"): a real `budgetgate
//! serve` on a real Redis with leases on, a 300-token stream admitted from
//! the tenant's lease and extended 10 tokens at a time. Fault guarded
//! against: the stream was cut off at 208 tokens when the tenant's
//! background traffic stopped (its lease closed), and at 112 when a reload
//! lowered `tpm` from 1,000,000 to 900,000 (its lease fell under the old
//! policy), with the budget nearly full both times; leases off, it
//! completed.
//!
//! Run: `cargo test --test it lease_streams:: -- --nocapture`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::redis_server::RedisServer;
use crate::support::*;

/// Output tokens of the long stream; the mock streams one token per chunk.
const STREAM_TOKENS: u64 = 300;
/// The stream's first reservation (the model's default output) and each
/// extension: about 30 extensions over the stream.
const DEFAULT_OUT: u64 = 16;
const STEP: u64 = 10;

fn config(mock: &str, redis: &str, tpm: u64) -> TestConfig {
    let mut c = TestConfig::standard(mock, DEFAULT_OUT, limits().tpm(tpm))
        .redis_fleet(redis, "bgleasestream");
    c.estimation.stream_extension_step = Some(STEP as i64);
    // Hot at 10 requests a second, ended below 5: the background traffic
    // below (about 60 a second) leases the tenant's budget at once, and
    // its stopping ends the lease within a quarter second or so.
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        min_rate: Some(10),
        report_interval_ms: Some(250),
        ..Default::default()
    });
    c
}

/// Small requests of the tenant until `stop` is set; counts the answers
/// other than 200.
fn background(
    root: &str,
    stop: Arc<AtomicBool>,
    bad: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let http = reqwest::Client::new();
    (0..4)
        .map(|_| {
            let (http, root, stop, bad) = (http.clone(), root.to_string(), stop.clone(), bad.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(60));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let r = http
                        .post(format!("{root}/v1/chat/completions"))
                        .bearer_auth(KEY)
                        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
                        .send()
                        .await
                        .expect("the gateway answers");
                    if r.status() != 200 {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = r.bytes().await;
                }
            })
        })
        .collect()
}

fn prompt() -> Value {
    json!([{"role": "user", "content": "Write an endless story."}])
}

/// The long stream, read to its end: (content chunks, finish_reason,
/// usage's completion_tokens).
async fn long_stream(root: String, id: &'static str) -> (usize, Value, Value) {
    let r = reqwest::Client::new()
        .post(format!("{root}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-request-id", id)
        .json(&json!({
            "model": "gpt-4o-mini",
            "messages": prompt(),
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(r.status(), 200, "the stream is admitted");
    let body = r.bytes().await.expect("the stream's body");
    let chunks = sse_chunks(&body);
    let finish = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/finish_reason"))
        .find(|f| !f.is_null())
        .cloned()
        .unwrap_or(Value::Null);
    let completion = chunks
        .iter()
        .filter_map(|c| c.pointer("/usage/completion_tokens"))
        .find(|u| !u.is_null())
        .cloned()
        .unwrap_or(Value::Null);
    (content_chunks(&chunks), finish, completion)
}

/// The stream's "stream finished" line: decided from the lease, settled
/// in full.
fn check_log(gw: &GatewayProcess, id: &str) {
    let line = gw
        .logs_with("stream finished")
        .into_iter()
        .find(|l| l.pointer("/fields/request_id") == Some(&json!(id)))
        .unwrap_or_else(|| panic!("no log line of {id}:\n{}", gw.dump_logs()));
    assert_eq!(
        line.pointer("/fields/decided_by"),
        Some(&json!("lease")),
        "the stream was admitted from the tenant's lease: {line}"
    );
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": prompt()}));
    assert_eq!(
        line.pointer("/fields/settled"),
        Some(&json!(input + STREAM_TOKENS)),
        "the stream settled what it used: {line}"
    );
}

async fn overflows(gw: &GatewayProcess) -> f64 {
    gw.metric("budgetgate_quota_lease_overflows_total", &[])
        .await
}

/// Background traffic leases the tenant's `tpm`, the stream starts from
/// that lease, the background stops: the lease closes while the stream
/// still needs about 25 extensions, and the stream completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_stream_completes_after_the_background_traffic_stops() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    mock.state.set_output_tokens(STREAM_TOKENS);
    mock.state.set_token_delay(Duration::from_millis(10));
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = config(&mock.base_url(), &redis.url(), 1_000_000).write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[]).await;
    let (stop, bad) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let clients = background(&gw.root, stop.clone(), bad.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        gw.metric("budgetgate_quota_leases_held", &[]).await > 0.0,
        "the background traffic leases the tenant's budget"
    );
    let stream = tokio::spawn(long_stream(gw.root.clone(), "long-stream-demand-falls"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("background client");
    }
    let (delivered, finish, completion) = stream.await.expect("the stream's task");
    let over = overflows(&gw).await;
    println!("demand fell: {delivered} tokens delivered, finish {finish}, {over} overflow steps");
    // The quota lease metrics keep their former names for
    // one release, with the same values (read once the traffic is over:
    // the two names of a counter are incremented one after the other).
    for (new, old, labels) in [
        (
            "budgetgate_quota_lease_overflows_total",
            "budgetgate_lease_overflows_total",
            &[][..],
        ),
        (
            "budgetgate_quota_lease_decisions_total",
            "budgetgate_lease_decisions_total",
            &[("decided_by", "lease")][..],
        ),
        (
            "budgetgate_quota_leases_total",
            "budgetgate_leases_total",
            &[("event", "granted")][..],
        ),
    ] {
        let scrape = crate::support::http::scrape(&gw).await;
        let (a, b) = (
            crate::support::http::sample_sum(&scrape, new, labels),
            crate::support::http::sample_sum(&scrape, old, labels),
        );
        assert!(a > 0.0 && a == b, "{new} {a} and its former name {old} {b}");
    }

    assert!(
        over >= 1.0,
        "the lease stopped paying mid-stream: some step went to the store as an exact reservation"
    );
    assert_eq!(
        bad.load(Ordering::Relaxed),
        0,
        "the background fits the budget"
    );
    assert_eq!(finish, json!("stop"), "the stream is not cut off");
    assert_eq!(delivered as u64, STREAM_TOKENS, "every token delivered");
    assert_eq!(completion, json!(STREAM_TOKENS));
    check_log(&gw, "long-stream-demand-falls");
}

/// Background traffic keeps the tenant leased; a reload lowers the same
/// `tpm` (room left) while the stream runs: its lease falls under the old
/// policy and the stream completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_stream_completes_across_a_reload_lowering_its_limit() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    mock.state.set_output_tokens(STREAM_TOKENS);
    mock.state.set_token_delay(Duration::from_millis(10));
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = config(&mock.base_url(), &redis.url(), 1_000_000).write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[]).await;
    let (stop, bad) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let clients = background(&gw.root, stop.clone(), bad.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        gw.metric("budgetgate_quota_leases_held", &[]).await > 0.0,
        "the background traffic leases the tenant's budget"
    );

    let stream = tokio::spawn(long_stream(gw.root.clone(), "long-stream-reload"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    config(&mock.base_url(), &redis.url(), 900_000).write_to(&cfg);
    gw.signal("HUP");
    gw.wait_log("policy reloaded", 1).await;
    let (delivered, finish, completion) = stream.await.expect("the stream's task");
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("background client");
    }
    let over = overflows(&gw).await;
    println!("reload: {delivered} tokens delivered, finish {finish}, {over} overflow steps");
    assert!(
        over >= 1.0,
        "the lease stopped paying mid-stream: some step went to the store as an exact reservation"
    );
    assert_eq!(
        bad.load(Ordering::Relaxed),
        0,
        "the background fits the budget"
    );
    assert_eq!(finish, json!("stop"), "the stream is not cut off");
    assert_eq!(delivered as u64, STREAM_TOKENS, "every token delivered");
    assert_eq!(completion, json!(STREAM_TOKENS));
    check_log(&gw, "long-stream-reload");
}
