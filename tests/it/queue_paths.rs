//! Wait queues, the paths around the wait: a waiter admitted
//! when the bucket refills (streams answered only then) or when a
//! settlement refunds, the queue's visibility (budget list, final log
//! line, metrics), its bounds, and what stays as it was without
//! contention (store calls) or with another deployment free. Faults
//! guarded against: a stream answered before its reservation; a waiter
//! woken only by polling; the wait invisible; queued bytes unbounded; a
//! store call added to every request; a request kept waiting for a busy
//! deployment while another is free.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use budgetgate::budget::memory::MemoryStore;
use budgetgate::clock::{ManualClock, SystemClock};
use budgetgate::config::raw::RawQueue;
use serde_json::Value;

use super::queue::{drain, queue_of, queued_config, wait_depth};
use crate::support::mock_upstream::MockUpstream;
use crate::support::store_spy;
use crate::support::*;

/// A gateway whose store reads the system clock: the bucket refills.
async fn refilling(mock: &MockUpstream, queue: RawQueue) -> Gateway {
    let store = std::sync::Arc::new(MemoryStore::new(std::sync::Arc::new(SystemClock)));
    queued_config(mock, Some(queue))
        .start_with(ManualClock::new(NOON), store)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_stream_sends_nothing_until_admitted_and_says_how_long_it_waited() {
    let mock = start_mock().await;
    let gw = refilling(&mock, queue_of(&[("standard", 5000)])).await;
    drain(&gw).await;
    let mut body = hi(40);
    body["stream"] = serde_json::json!(true);
    let started = Instant::now();
    let r = post_chat(&gw, KEY, &body).await;
    let headers_after = started.elapsed();
    assert_eq!(r.status(), 200);
    let queued = header_u64(&r, "x-budgetgate-queued-ms");
    // About 44 tokens at 100 per second.
    assert!(
        headers_after >= Duration::from_millis(250),
        "headers after {headers_after:?}: sent before the reservation"
    );
    assert!(
        (200..2000).contains(&queued),
        "x-budgetgate-queued-ms {queued}"
    );
    let text = r.text().await.unwrap();
    assert!(text.contains("[DONE]"));
    // Not streamed, the same.
    let r = post_chat(&gw, KEY, &hi(40)).await;
    assert_eq!(r.status(), 200);
    assert!(header_u64(&r, "x-budgetgate-queued-ms") >= 200);
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.contains("budgetgate_queue_admitted_total{class=\"standard\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("budgetgate_queue_wait_seconds_bucket{class=\"standard\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("budgetgate_queue_depth{class=\"batch\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("budgetgate_queue_full_total{class=\"interactive\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_list_shows_the_queue_depth_by_class() {
    let mock = start_mock().await;
    let mut c = queued_config(&mock, Some(queue_of(&[("standard", 8000)])));
    c.server.admin_token_env = Some("BUDGETGATE_QUEUE_TEST_TOKEN".into());
    let gw = c.start().await;
    gw.state.set_admin_token(Some("queue-admin"));
    drain(&gw).await;
    let waiter = tokio::spawn({
        let url = gw.root_url();
        async move { post_chat(&url, KEY, &hi(40)).await.status().as_u16() }
    });
    wait_depth(&gw, 1).await;
    let r = admin_get(&gw, "/admin/v1/budgets", Some("queue-admin")).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["queue"]["enabled"], true, "{body}");
    assert_eq!(body["queue"]["depth"]["standard"], 1, "{body}");
    assert_eq!(body["queue"]["depth"]["batch"], 0, "{body}");
    waiter.abort();
}

/// Counts store calls by kind.
#[derive(Default)]
struct Counting(std::sync::Mutex<BTreeMap<String, usize>>);

#[async_trait::async_trait]
impl store_spy::Hooks for Counting {
    async fn before(&self, call: store_spy::Call) -> Result<u64, budgetgate::budget::StoreError> {
        *self
            .0
            .lock()
            .unwrap()
            .entry(format!("{call:?}"))
            .or_default() += 1;
        Ok(0)
    }
}

async fn store_calls(mock: &MockUpstream, queue: Option<RawQueue>) -> BTreeMap<String, usize> {
    let clock = ManualClock::new(NOON);
    let spy = std::sync::Arc::new(store_spy::Spy {
        inner: std::sync::Arc::new(MemoryStore::new(std::sync::Arc::new(clock.clone()))),
        hooks: Counting::default(),
    });
    let gw = queued_config(mock, queue)
        .start_with(clock, spy.clone())
        .await;
    for _ in 0..2 {
        let r = post_chat(&gw, KEY, &hi(5)).await;
        assert_eq!(r.status(), 200);
        assert!(
            header(&r, "x-budgetgate-queued-ms").is_none(),
            "nothing waited"
        );
    }
    gw.settled().await;
    let calls = spy.0.lock().unwrap().clone();
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_request_makes_the_same_store_calls_with_a_queue_configured() {
    let mock = start_mock().await;
    let without = store_calls(&mock, None).await;
    let with = store_calls(&mock, Some(queue_of(&[("standard", 5000)]))).await;
    assert_eq!(with, without);
    assert_eq!(with.get("Reserve"), Some(&2), "{with:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_body_bytes_are_bounded() {
    let mock = start_mock().await;
    let mut q = queue_of(&[("standard", 5000)]);
    // Room for one small request (its body and the fixed overhead), not two.
    q.max_queued_bytes = Some(2048 + 400);
    let gw = queued_config(&mock, Some(q)).start().await;
    drain(&gw).await;
    let first = tokio::spawn({
        let url = gw.root_url();
        async move { post_chat(&url, KEY, &hi(40)).await.status().as_u16() }
    });
    wait_depth(&gw, 1).await;
    let r = post_chat(&gw, KEY, &hi(40)).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    first.abort();
    wait_depth(&gw, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_log_line_carries_the_wait() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = queued_config(&mock, Some(queue_of(&[("standard", 5000)]))).write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    for _ in 0..2 {
        assert_eq!(post_chat(&gw.root, KEY, &hi(40)).await.status(), 200);
    }
    let r = chat_request(&gw.root, KEY, &hi(40))
        .header("x-request-id", "queued-log")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let queued = header_u64(&r, "x-budgetgate-queued-ms");
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let found = gw.logs().into_iter().find(|l| {
            l.pointer("/fields/request_id").and_then(Value::as_str) == Some("queued-log")
                && l.pointer("/fields/outcome").is_some()
        });
        if let Some(l) = found {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "no final line: {}",
            gw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        line.pointer("/fields/queued_ms").and_then(Value::as_u64),
        Some(queued),
        "{line:#}"
    );
    assert!(queued >= 200, "{queued}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_another_deployment_free_does_not_wait_behind_a_busy_one() {
    let mock = start_mock().await;
    let mut c = queued_config(&mock, Some(queue_of(&[("standard", 3000)])));
    c.upstreams.push(config::upstream(
        "mock2",
        Kind::SelfHosted,
        &mock.base_url(),
    ));
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(16),
        ..config::model("gpt-4o", &["mock", "mock2"])
    });
    let gw = c.start().await;
    drain(&gw).await;
    // A waiter for `mock` (gpt-4o-mini is served there only).
    let waiter = tokio::spawn({
        let url = gw.root_url();
        async move { post_chat(&url, KEY, &hi(40)).await.status().as_u16() }
    });
    wait_depth(&gw, 1).await;
    let mut body = hi(40);
    body["model"] = "gpt-4o".into();
    let started = Instant::now();
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 200);
    assert!(
        header(&r, "x-budgetgate-queued-ms").is_none(),
        "it did not wait"
    );
    assert!(started.elapsed() < Duration::from_millis(500));
    waiter.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_that_refunds_wakes_the_waiter_before_the_refill_time() {
    let mock = start_mock().await;
    let mut c = queued_config(&mock, Some(queue_of(&[("standard", 8000)])));
    // Refunded, and slow to refill: 44 missing tokens take 4.4 s.
    let u = c.upstream("mock");
    u.limits = limits().tpm(600).tpm_burst(100);
    u.refund_unused = Some(true);
    let gw = c.start().await;
    // Each answer uses about 13 of the 48 tokens reserved.
    mock.state.set_output_tokens(5);
    mock.state.hold();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = gw.root_url();
            tokio::spawn(async move { post_chat(&url, KEY, &hi(40)).await.status().as_u16() })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while mock.state.held_count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the two requests never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiter = tokio::spawn({
        let url = gw.root_url();
        async move {
            let r = post_chat(&url, KEY, &hi(40)).await;
            (r.status().as_u16(), header(&r, "x-budgetgate-queued-ms"))
        }
    });
    wait_depth(&gw, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    mock.state.release();
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
    let (status, queued) = waiter.await.unwrap();
    assert_eq!(
        status, 200,
        "admitted on the refund (the store's clock is frozen: no refill)"
    );
    let queued: u64 = queued.expect("it waited").parse().unwrap();
    assert!(
        (400..3000).contains(&queued),
        "admitted {queued} ms after joining: not woken by the refund"
    );
}
