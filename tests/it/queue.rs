//! Wait queues on one gateway, on a frozen store clock: the
//! deployment's bucket never refills, so a waiter waits until its
//! `max_wait` and what it gets then can be compared with what a gateway
//! without a queue answers in the same state. Faults guarded against: a
//! full queue that blocks or admits; a timed-out waiter whose 429 differs
//! from the one it would have had (a header family or Retry-After lost);
//! a client gone while waiting that still reaches the upstream or is
//! charged; a raised `x-budgetgate-priority` honoured, a lowered one or
//! `x-budgetgate-max-wait-ms` ignored; a request that can never fit in
//! time kept waiting; waiters left hanging at shutdown. The paths around
//! the wait are in `queue_paths`, contention in `queue_fairness`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::raw::{RawQueue, RawQueueClass};
use serde_json::Value;

use crate::support::mock_upstream::MockUpstream;
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
pub async fn drain(gw: &Gateway) {
    for _ in 0..2 {
        let r = post_chat(gw, KEY, &hi(40)).await;
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
    }
}

pub async fn wait_depth(gw: &Gateway, n: usize) {
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
    // The line's retry time: what is left of its head's refusal's wait
    // (about 44 tokens at 100 a second), not a fixed second.
    let retry_ms: u64 = must_header(&r, "retry-after-ms").parse().unwrap();
    assert!(
        (1..=450).contains(&retry_ms),
        "retry-after-ms {retry_ms}: not the line's retry time"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    first.abort();
    wait_depth(&gw, 0).await;
}

/// A waiter whose turn comes with less time left than the refusing
/// budget's retry time is answered at once; it waited all the same. The
/// fault: that refusal carried no `x-budgetgate-queued-ms`, logged
/// `queued_ms=0` and was not counted in `budgetgate_queue_timeouts_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_a_wait_says_how_long_it_waited_and_counts_as_a_timeout() {
    let mock = start_mock().await;
    let mut c = queued_config(&mock, Some(queue_of(&[("standard", 5000)])));
    // 100 tokens of burst refilled at 24 a second: a request of about 48
    // tokens fits every 2 s.
    c.upstream("mock").limits = limits().rpm(1000).tpm(1440).tpm_burst(100);
    let dir = tempfile::tempdir().unwrap();
    let gw = GatewayProcess::start(&c.write(dir.path()), &[]).await;
    for _ in 0..2 {
        assert_eq!(post_chat(&gw.root, KEY, &hi(40)).await.status(), 200);
    }
    // The first waits about 1.8 s for its refill, then is admitted.
    let first = tokio::spawn({
        let root = gw.root.clone();
        async move { post_chat(&root, KEY, &hi(40)).await.status().as_u16() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The second joins its line; when its turn comes (the first admitted,
    // the bucket empty), the 2 s refill is longer than what is left of its
    // 2.5 s: answered then, after about 1.5 s in the queue.
    let started = Instant::now();
    let r = chat_request(&gw.root, KEY, &hi(40))
        .header("x-request-id", "waited-then-refused")
        .header("x-budgetgate-max-wait-ms", "2500")
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(r.status(), 429);
    assert_eq!(first.await.unwrap(), 200);
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_millis(2500),
        "answered after {took:?}"
    );
    let queued = header(&r, "x-budgetgate-queued-ms")
        .expect("a refusal after a wait carries x-budgetgate-queued-ms")
        .parse::<u64>()
        .unwrap();
    assert!(
        queued >= 900 && queued as u128 <= took.as_millis(),
        "x-budgetgate-queued-ms {queued} after {took:?}"
    );
    assert_eq!(
        gw.metric("budgetgate_queue_timeouts_total", &[("class", "standard")])
            .await,
        1.0,
        "counted as a timeout"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let found = gw.logs().into_iter().find(|l| {
            l.pointer("/fields/request_id").and_then(Value::as_str) == Some("waited-then-refused")
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
