//! Wait queues (issue 28) on one gateway, on a frozen store clock: the
//! deployment's bucket never refills, so a waiter waits until its
//! `max_wait` and what it gets then can be compared with what a gateway
//! without a queue answers in the same state. Faults guarded against: a
//! full queue that blocks or admits; a timed-out waiter whose 429 differs
//! from the one it would have had (a header family or Retry-After lost);
//! a client gone while waiting that still reaches the upstream or is
//! charged; a raised `x-budgetgate-priority` honoured, a lowered one or
//! `x-budgetgate-max-wait-ms` ignored; waiters left hanging at shutdown;
//! a stream answered before its reservation; the queue invisible.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use budgetgate::clock::{ManualClock, SystemClock};
use budgetgate::config::raw::{RawQueue, RawQueueClass};
use budgetgate::reserve::memory::MemoryStore;
use budgetgate::reserve::{BudgetName, Scope};
use serde_json::Value;

use crate::support::mock_upstream::MockUpstream;
use crate::support::store_spy;
use crate::support::*;

/// The deployment `mock`: 100 tokens of burst refilled at 100 per second,
/// not refunded; every [`hi`]`(40)` costs about 48, so two empty it.
pub fn queued_config(mock: &MockUpstream, queue: Option<RawQueue>) -> TestConfig {
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits());
    let u = c.upstream("mock");
    u.limits = limits().rpm(1000).tpm(6000).tpm_burst(100);
    u.refund_unused = Some(false);
    c.queue = queue;
    c
}

/// `[queue]` with these `max_wait_ms` per class.
pub fn queue_of(max_wait_ms: &[(&str, i64)]) -> RawQueue {
    RawQueue {
        classes: max_wait_ms
            .iter()
            .map(|(c, ms)| {
                (
                    c.to_string(),
                    RawQueueClass {
                        max_wait_ms: Some(*ms),
                        max_starve_ms: None,
                    },
                )
            })
            .collect(),
        ..RawQueue::default()
    }
}

fn mock_scope() -> Scope {
    Scope::Upstream("mock".into())
}

/// Spends the deployment's bucket: two admitted requests.
async fn drain(gw: &Gateway) {
    for _ in 0..2 {
        let r = post_chat(gw, KEY, &hi(40)).await;
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
    }
}

async fn wait_depth(gw: &Gateway, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.state.queue.depth().iter().sum::<usize>() != n {
        assert!(
            Instant::now() < deadline,
            "queue depth never became {n}: {:?}",
            gw.state.queue.depth()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every header a refusal carries, but those naming this request or
/// its wait.
fn refusal_headers(h: &reqwest::header::HeaderMap) -> BTreeMap<String, String> {
    h.iter()
        .filter(|(n, _)| {
            !matches!(
                n.as_str(),
                "x-request-id" | "x-reservation-id" | "date" | "x-budgetgate-queued-ms"
            )
        })
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_times_out_gets_the_429_it_would_have_had_without_the_queue() {
    let mock = start_mock().await;
    let with = queued_config(&mock, Some(queue_of(&[("standard", 1500)])))
        .start()
        .await;
    let without = queued_config(&mock, None).start().await;
    drain(&with).await;
    drain(&without).await;

    let (status, body, headers) = post_chat_json(&without, KEY, &hi(40)).await;
    assert_eq!(status, 429);
    let started = Instant::now();
    let (q_status, q_body, q_headers) = post_chat_json(&with, KEY, &hi(40)).await;
    let waited = started.elapsed();
    assert_eq!(q_status, 429);
    assert!(
        waited >= Duration::from_millis(1400),
        "answered after {waited:?}: it did not wait"
    );
    assert_eq!(q_body, body, "the body of the refusal");
    assert_eq!(refusal_headers(&q_headers), refusal_headers(&headers));
    for h in [
        "retry-after",
        "retry-after-ms",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-limit-requests",
    ] {
        assert!(q_headers.contains_key(h), "no {h}: {q_headers:?}");
    }
    let queued: u64 = q_headers["x-budgetgate-queued-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1400..3000).contains(&queued),
        "x-budgetgate-queued-ms {queued}"
    );
    assert!(!headers.contains_key("x-budgetgate-queued-ms"));
    assert_eq!(
        mock.state.request_count(),
        4,
        "no waiter reached the upstream"
    );
    let text = with.metrics_text().await;
    assert!(
        text.contains("budgetgate_queue_timeouts_total{class=\"standard\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_queue_full_at_once() {
    let mock = start_mock().await;
    let mut q = queue_of(&[("standard", 5000)]);
    q.max_queued = Some(1);
    let gw = queued_config(&mock, Some(q)).start().await;
    drain(&gw).await;
    let first = tokio::spawn({
        let url = gw.root_url();
        async move { post_chat(&url, KEY, &hi(40)).await.status().as_u16() }
    });
    wait_depth(&gw, 1).await;
    let started = Instant::now();
    let r = post_chat(&gw, KEY, &hi(40)).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a full queue answers at once"
    );
    assert_eq!(r.status(), 429);
    let retry: u64 = must_header(&r, "retry-after").parse().unwrap();
    assert!(retry >= 1);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    first.abort();
    wait_depth(&gw, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_after_a_second_of_waiting_causes_no_upstream_call_and_no_charge() {
    let mock = start_mock().await;
    let gw = queued_config(&mock, Some(queue_of(&[("standard", 8000)])))
        .start()
        .await;
    drain(&gw).await;
    gw.settled().await;
    let used = gw.used(mock_scope(), BudgetName::Tpm).await;
    let requests = gw.used(mock_scope(), BudgetName::Rpm).await;
    let client = tokio::spawn({
        let url = gw.root_url();
        async move { post_chat(&url, KEY, &hi(40)).await.status().as_u16() }
    });
    wait_depth(&gw, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    client.abort();
    let gone = Instant::now();
    wait_depth(&gw, 0).await;
    assert!(
        gone.elapsed() < Duration::from_secs(2),
        "the waiter left when its client did"
    );
    gw.all_settled().await;
    assert_eq!(mock.state.request_count(), 2, "no upstream call");
    assert_eq!(
        gw.used(mock_scope(), BudgetName::Tpm).await,
        used,
        "no tokens charged"
    );
    assert_eq!(
        gw.used(mock_scope(), BudgetName::Rpm).await,
        requests,
        "no request charged"
    );
    assert_eq!(gw.memory().live_holds(), 0, "nothing reserved");
}

/// Waits (and times out) with `headers`; returns the wait the gateway reports.
async fn timed_wait(gw: &Gateway, headers: &[(&str, &str)]) -> u64 {
    let mut req = chat_request(gw, KEY, &hi(40));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 429);
    header_u64(&r, "x-budgetgate-queued-ms")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_priority_is_ignored_a_lowered_one_and_a_shorter_max_wait_are_honoured() {
    let mock = start_mock().await;
    let gw = queued_config(
        &mock,
        Some(queue_of(&[
            ("interactive", 300),
            ("standard", 1200),
            ("batch", 2400),
        ])),
    )
    .start()
    .await;
    drain(&gw).await;
    let raised = timed_wait(&gw, &[("x-budgetgate-priority", "interactive")]).await;
    assert!(
        (1100..2000).contains(&raised),
        "a raise is ignored: waited {raised} ms"
    );
    let lowered = timed_wait(&gw, &[("x-budgetgate-priority", "batch")]).await;
    assert!(
        (2300..3500).contains(&lowered),
        "a lowering is honoured: waited {lowered} ms"
    );
    let shorter = timed_wait(&gw, &[("x-budgetgate-max-wait-ms", "700")]).await;
    assert!(
        (650..1100).contains(&shorter),
        "max-wait lowered: waited {shorter} ms"
    );
    // Below the store's retry time (about 440 ms): it could never fit in
    // time, so it is answered at once, as without a queue.
    let started = Instant::now();
    let r = chat_request(&gw, KEY, &hi(40))
        .header("x-budgetgate-max-wait-ms", "100")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(
        header(&r, "x-budgetgate-queued-ms").is_none(),
        "it did not wait"
    );
    assert!(started.elapsed() < Duration::from_millis(300));
    let longer = timed_wait(&gw, &[("x-budgetgate-max-wait-ms", "60000")]).await;
    assert!(
        (1100..2000).contains(&longer),
        "max-wait never raised: waited {longer} ms"
    );
    println!("queue waits: raised {raised} ms, lowered {lowered} ms, max-wait 700: {shorter} ms, max-wait 60000: {longer} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_the_capacity_or_not_allowed_to_wait_is_answered_at_once() {
    let mock = start_mock().await;
    let mut c = queued_config(&mock, Some(queue_of(&[("standard", 3000)])));
    // The tenant's own entitlement: only batch waits for it by default.
    c.tenant("t1").limits = limits().rpm(2);
    let gw = c.start().await;
    let started = Instant::now();
    let r = post_chat(&gw, KEY, &hi(400)).await;
    assert_eq!(r.status(), 429, "larger than the deployment's burst");
    assert_eq!(must_header(&r, "x-should-retry"), "false");
    for _ in 0..2 {
        assert_eq!(post_chat(&gw, KEY, &hi(5)).await.status(), 200);
    }
    let r = post_chat(&gw, KEY, &hi(5)).await;
    assert_eq!(r.status(), 429, "the tenant's own rpm");
    assert!(header(&r, "x-budgetgate-queued-ms").is_none());
    assert!(started.elapsed() < Duration::from_secs(2), "nothing waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_waiters_503_with_retry_after() {
    let mock = start_mock().await;
    let gw = queued_config(&mock, Some(queue_of(&[("standard", 8000)])))
        .start()
        .await;
    drain(&gw).await;
    let waiter = tokio::spawn({
        let url = gw.root_url();
        async move {
            let r = post_chat(&url, KEY, &hi(40)).await;
            (r.status().as_u16(), header(&r, "retry-after"))
        }
    });
    wait_depth(&gw, 1).await;
    let state = gw.state.clone();
    let started = Instant::now();
    drop(gw);
    let (status, retry) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was answered")
        .unwrap();
    assert_eq!(status, 503);
    assert!(retry.is_some(), "503 with Retry-After");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered at once, not at its max_wait"
    );
    assert_eq!(state.queue.depth().iter().sum::<usize>(), 0);
}

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
    async fn before(&self, call: store_spy::Call) -> Result<u64, budgetgate::reserve::StoreError> {
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
