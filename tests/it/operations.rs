//! Operating under trouble (issue: failure policy, deny cache, metrics):
//! store outages with fail-open / fail-closed tenants, the local deny cache,
//! and the Prometheus exposition.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::config::{tenant, RawTenant};
use crate::support::store_spy::{Call, Hooks, Spy};
use crate::support::*;
use async_trait::async_trait;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::*;
use budgetgate::clock::{Clock, ManualClock};
use serde_json::{json, Value};

/// The hooks of a memory store that counts its calls, can be switched
/// "down", and can hold settlements until released.
struct FlakyHooks {
    down: AtomicBool,
    reserves: AtomicUsize,
    settles: AtomicUsize,
    /// extend, renew, void, inspect and lower calls.
    others: AtomicUsize,
    /// While true, settle calls wait (before touching the store).
    hold_settles: tokio::sync::watch::Sender<bool>,
}

type Flaky = Spy<MemoryStore, FlakyHooks>;

fn flaky(clock: &ManualClock) -> Arc<Flaky> {
    let c: Arc<dyn Clock> = Arc::new(clock.clone());
    Arc::new(Spy {
        inner: Arc::new(MemoryStore::new(c)),
        hooks: FlakyHooks {
            down: AtomicBool::new(false),
            reserves: AtomicUsize::new(0),
            settles: AtomicUsize::new(0),
            others: AtomicUsize::new(0),
            hold_settles: tokio::sync::watch::Sender::new(false),
        },
    })
}

#[async_trait]
impl Hooks for FlakyHooks {
    async fn before(&self, call: Call) -> Result<u64, StoreError> {
        match call {
            Call::Reserve => self.reserves.fetch_add(1, Ordering::SeqCst),
            Call::Settle => {
                let n = self.settles.fetch_add(1, Ordering::SeqCst);
                let _ = self.hold_settles.subscribe().wait_for(|held| !held).await;
                n
            }
            _ => self.others.fetch_add(1, Ordering::SeqCst),
        };
        // `lower` is the deny cache's own repair, never failed here.
        if call != Call::Lower && self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        Ok(0)
    }
}

/// A gateway on a [`Flaky`] store with tenant limits `limits`, in front of
/// a simulated upstream (returned to keep it running), at a frozen clock.
/// Store calls time out after 10 s, not the default 50 ms: a settle held by
/// a test must not time out and be retried (which would be right, but
/// would change the call counts the tests assert).
async fn flaky_gateway(
    tenant_limits: Limits,
) -> (
    mock_upstream::MockUpstream,
    ManualClock,
    Arc<Flaky>,
    Gateway,
) {
    let mock = start_mock().await;
    let clock = ManualClock::new(NOON);
    let store = flaky(&clock);
    let mut config = TestConfig::standard(&mock.base_url(), 50, tenant_limits);
    config.store.timeout_ms = Some(10000);
    let gw = config.start_with(clock.clone(), store.clone()).await;
    (mock, clock, store, gw)
}

/// A non-streaming request costs exactly two store calls (one
/// reserve, one settle), and its settlement is off the response's critical
/// path: the client has the whole answer while the settle is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_costs_one_reserve_and_one_settle_and_is_answered_before_its_settle() {
    let (_mock, _clock, store, gw) = flaky_gateway(limits().rpm(1000)).await;
    store.hold_settles.send_replace(true);
    // Were the settle awaited before answering, this would never complete.
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let r = send_hi(&gw, KEY).await;
        assert_eq!(r.status(), 200);
        r.json::<serde_json::Value>()
            .await
            .expect("whole JSON answer")
    })
    .await
    .expect("answered while the settlement is held");
    assert!(answer["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0);
    let start = std::time::Instant::now();
    while store.settles.load(Ordering::SeqCst) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no settle started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        gw.state.settlements.pending(),
        1,
        "the settle is still held"
    );
    store.hold_settles.send_replace(false);
    gw.settled().await;

    for _ in 0..4 {
        assert_eq!(send_hi(&gw, KEY).await.status(), 200);
    }
    gw.settled().await;
    assert_eq!(store.reserves.load(Ordering::SeqCst), 5);
    assert_eq!(store.settles.load(Ordering::SeqCst), 5);
    assert_eq!(
        store.others.load(Ordering::SeqCst),
        0,
        "no extend, renew, inspect or lower"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_tenant_costs_at_most_one_store_call_per_retry_interval() {
    let (_mock, clock, store, gw) = flaky_gateway(limits().rpm(2)).await;
    for _ in 0..2 {
        assert_eq!(send_hi(&gw, KEY).await.status(), 200);
    }
    let before = store.reserves.load(Ordering::SeqCst);
    for _ in 0..50 {
        let r = send_hi(&gw, KEY).await;
        assert_eq!(r.status(), 429);
        assert!(r.headers().get("retry-after").is_some());
    }
    assert_eq!(
        store.reserves.load(Ordering::SeqCst) - before,
        1,
        "one store call, 49 local refusals"
    );
    // rpm = 2: one request refills every 30 s.
    clock.advance(29_999_999);
    assert_eq!(send_hi(&gw, KEY).await.status(), 429);
    assert_eq!(
        store.reserves.load(Ordering::SeqCst) - before,
        1,
        "still known empty"
    );
    clock.advance(1);
    assert_eq!(
        send_hi(&gw, KEY).await.status(),
        200,
        "the cache never refuses what fits"
    );
    assert_eq!(store.reserves.load(Ordering::SeqCst) - before, 2);
}

/// A refund by this gateway clears what its deny cache knew of the budgets
/// it credits: a request refused while a large reservation was live is
/// admitted once that reservation settles under its estimate (before, a
/// daily-quota refusal stayed cached until UTC midnight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_by_this_gateway_clears_its_cached_refusals() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = TestConfig::standard(&mock.base_url(), 50, limits().tokens_per_day(2000))
        .start()
        .await;
    let chat = |max_tokens: u64| {
        let url = format!("{}/chat/completions", gw.base_url());
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(KEY)
                .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}))
                .send()
                .await
                .expect("send")
        }
    };
    // A reserves ~1,900 tokens and waits at the upstream.
    mock.state.hold();
    let big = tokio::spawn(chat(1900));
    let start = std::time::Instant::now();
    while mock.state.held_count() < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "A never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // B does not fit beside it: refused by the store, then by the cache.
    for _ in 0..2 {
        let r = chat(1000).await;
        assert_eq!(r.status(), 429);
    }
    let hits = || async {
        let text = gw.metrics_text().await;
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("valid Prometheus text exposition");
        sample_sum(
            &scrape,
            "budgetgate_deny_cache_hits_total",
            &[("tenant", "t1")],
        )
    };
    assert!(
        hits().await >= 1.0,
        "the second refusal came from the cache"
    );
    // A ends with 5 output tokens: ~1,890 go back to the quota.
    mock.state.release();
    assert_eq!(big.await.expect("A").status(), 200);
    gw.settled().await;
    assert_eq!(chat(1000).await.status(), 200, "B fits after the refund");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_fails_open_to_the_local_share_or_closed_per_tenant_and_recovers() {
    let mock = start_mock().await;
    let clock = ManualClock::new(NOON);
    let store = flaky(&clock);
    let closed_key = "sk-closed-tenant";
    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().rpm(10));
    config.tenant("t1").on_store_error = Some("fail_open".into());
    config.tenants.push(RawTenant {
        on_store_error: Some("fail_closed".into()),
        ..tenant("t2", "k", closed_key, limits().rpm(10))
    });
    config.store.kind = Some("memory".into());
    config.store.fallback_share = Some(0.5);
    let gw = config.start_with(clock.clone(), store.clone()).await;
    assert_eq!(send_hi(&gw, KEY).await.status(), 200);
    store.down.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(send_hi(&gw, KEY).await.status().as_u16());
    }
    assert_eq!(
        statuses,
        vec![200, 200, 200, 200, 200, 429, 429],
        "fail-open: limited by the local share (5 of 10 rpm)"
    );
    assert_eq!(
        send_hi(&gw, closed_key).await.status(),
        503,
        "fail-closed tenant"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no request hangs"
    );
    let text = gw.metrics_text().await;
    assert!(
        text.contains("budgetgate_degraded_decisions_total{tenant=\"t1\",mode=\"fail_open\"}"),
        "{text}"
    );
    assert!(
        text.contains("budgetgate_degraded_decisions_total{tenant=\"t2\",mode=\"fail_closed\"}"),
        "{text}"
    );

    store.down.store(false, Ordering::SeqCst);
    // Decisions return to the store once the back-off (≤ 5 s, here the first steps) has passed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = store.reserves.load(Ordering::SeqCst);
        let s = send_hi(&gw, closed_key).await.status();
        if s == 200 {
            assert!(store.reserves.load(Ordering::SeqCst) > before);
            break;
        }
        assert_eq!(s, 503);
        assert!(std::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_carry_the_operational_series() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 50, limits().rpm(1).tpm(100000))
        .start()
        .await;
    assert_eq!(send_hi(&gw, KEY).await.status(), 200);
    assert_eq!(send_hi(&gw, KEY).await.status(), 429);
    assert_eq!(send_hi(&gw, KEY).await.status(), 429); // deny cache
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .unwrap();
    let _ = r.text().await;
    gw.settled().await;
    let text = gw.metrics_text().await;
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text exposition");
    let names: std::collections::BTreeSet<&str> =
        scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    for series in [
        "budgetgate_decisions_total",
        "budgetgate_reserved_tokens_total",
        "budgetgate_settled_tokens_total",
        "budgetgate_store_call_seconds_count",
        "budgetgate_deny_cache_hits_total",
        "budgetgate_upstream_requests_total",
        "budgetgate_upstream_latency_seconds_count",
        "budgetgate_estimate_ratio_count",
        "budgetgate_policy_info",
    ] {
        assert!(names.contains(series), "{series} missing from:\n{text}");
    }
    assert!(!text.contains(KEY), "no keys in metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_tenant_over_its_limit_is_served_and_each_would_be_denial_is_counted() {
    let mock = start_mock().await;
    // The whole tenant in shadow mode, and a trial TPM in shadow on top.
    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().rpm(2));
    let t = config.tenant("t1");
    t.name = "shadowed".into();
    t.shadow = Some(true);
    t.shadow_limits = limits().tpm(1000000);
    let gw = config.start().await;
    let count = || async {
        let text = gw.metrics_text().await;
        text.lines()
            .filter(|l| {
                l.starts_with("budgetgate_shadow_denials_total{")
                    && l.contains("tenant=\"shadowed\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    let before = count().await;
    for _ in 0..7 {
        assert_eq!(
            send_hi(&gw, KEY).await.status(),
            200,
            "shadow mode never blocks"
        );
    }
    // rpm = 2: the first two fit, the next five would have been denied.
    assert_eq!(count().await - before, 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_values_count_every_request_across_policy_versions_in_one_series() {
    // Tenant and deployment names of their own: the recorder is shared by
    // every test of this binary.
    let mock = start_mock().await;
    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().rpm(1000));
    config.tenant("t1").name = "metered".into();
    config.rename_upstream("mock", "metered-mock");
    let gw = config.start().await;
    let v1 = gw.state.policy.load().version.clone();
    let mut used = 0.0;
    for _ in 0..3 {
        let r = send_hi(&gw, KEY).await;
        assert_eq!(r.status(), 200);
        let body: serde_json::Value = r.json().await.unwrap();
        used += body["usage"]["total_tokens"].as_f64().unwrap();
    }
    // A reload: admissions go on in the same series (no label per policy
    // version: every admin write is one).
    let reloaded = {
        config.tenant("metered").limits = limits().rpm(999);
        config.policy()
    };
    let v2 = reloaded.version.clone();
    assert_ne!(v1, v2);
    gw.state.policy.store(Arc::new(reloaded));
    for _ in 0..2 {
        assert_eq!(send_hi(&gw, KEY).await.status(), 200);
    }
    gw.settled().await;
    let text = gw.metrics_text().await;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text exposition");
    let sum = |metric: &str, labels: &[(&str, &str)]| sample_sum(&scrape, metric, labels);
    let tenant = ("tenant", "metered");
    let deployment = ("deployment", "metered-mock");
    assert_eq!(
        sum(
            "budgetgate_decisions_total",
            &[tenant, ("outcome", "admitted")]
        ),
        5.0,
        "{text}"
    );
    let admitted_series: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("budgetgate_decisions_total{") && l.contains("tenant=\"metered\"")
        })
        .collect();
    assert_eq!(admitted_series.len(), 1, "{admitted_series:?}");
    assert!(!text.contains("policy_version="), "{text}");
    assert_eq!(
        sum(
            "budgetgate_upstream_requests_total",
            &[deployment, ("status", "200")]
        ),
        5.0
    );
    assert_eq!(
        sum("budgetgate_upstream_latency_seconds_count", &[deployment]),
        5.0
    );
    assert_eq!(sum("budgetgate_estimate_ratio_count", &[tenant]), 5.0);
    // The simulated upstream reports these on every answer.
    assert_eq!(
        sum(
            "budgetgate_provider_remaining",
            &[deployment, ("limit", "tokens")]
        ),
        999000.0
    );
    assert_eq!(
        sum(
            "budgetgate_provider_remaining",
            &[deployment, ("limit", "requests")]
        ),
        9999.0
    );
    // Every reserved token is settled, refunded or both (debt when the
    // answer used more than reserved).
    let reserved = sum("budgetgate_reserved_tokens_total", &[tenant]);
    let settled = sum("budgetgate_settled_tokens_total", &[tenant]);
    let refunded = sum("budgetgate_refunded_tokens_total", &[tenant]);
    let debt = sum("budgetgate_debt_tokens_total", &[tenant]);
    assert!(settled >= used && reserved > 0.0, "{text}");
    assert_eq!(reserved - refunded + debt, settled, "{text}");
    assert!(sum("budgetgate_store_call_seconds_count", &[("op", "reserve")]) >= 5.0);
    assert!(sum("budgetgate_store_call_seconds_count", &[("op", "settle")]) >= 5.0);
}

/// Fault guarded against: a fail-closed store outage told clients
/// `"type": "upstream_error"`, blaming the provider for the gateway's store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_store_outage_answers_503_budget_store_unavailable() {
    let mock = start_mock().await;
    let clock = ManualClock::new(NOON);
    let store = flaky(&clock);
    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().rpm(10));
    config.tenant("t1").on_store_error = Some("fail_closed".into());
    let gw = config.start_with(clock.clone(), store.clone()).await;
    store.down.store(true, Ordering::SeqCst);
    let r = send_hi(&gw, KEY).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({"error": {
            "message": "The budget store is unavailable; please retry.",
            "type": "server_error",
            "param": null,
            "code": "budget_store_unavailable"
        }})
    );
    assert_eq!(mock.state.request_count(), 0, "nothing was forwarded");
}
