//! Lost replies (DESIGN section 13): Redis answers a
//! reservation later than `store.timeout_ms`, so the gateway gives up, but
//! the script runs anyway. A delaying TCP proxy in front of Redis makes
//! the replies late. The reservation is settled under its own id when the
//! request ends, so a refused request costs nothing and a request served
//! by the local limiter costs the store at most its real usage.
//!
//! Run: `cargo test --all-features --test redis_lost_replies -- --nocapture`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::redis_server::RedisServer;
use crate::support::*;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveOutcome, ReserveRequest, Scope,
    SettleOutcome, StoreError, Window,
};
use budgetgate::clock::ManualClock;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to `upstream` that holds every client→server chunk for
/// `delay` ms (0: none) before passing it on, in order.
pub(crate) struct DelayProxy {
    port: u16,
    delay: Arc<AtomicU64>,
}

impl DelayProxy {
    pub(crate) async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let delay = Arc::new(AtomicU64::new(0));
        let d = delay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let d = d.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let ms = d.load(Ordering::SeqCst);
                        if ms > 0 {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
            }
        });
        Self { port, delay }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(crate) fn set_delay(&self, ms: u64) {
        self.delay.store(ms, Ordering::SeqCst);
    }
}

fn spec(ks: &KeySpace, name: BudgetName, kind: BudgetKind) -> BudgetSpec {
    let scope = Scope::Tenant("t1".into());
    BudgetSpec {
        key: ks.budget(&scope, name).into(),
        scope,
        name,
        kind,
        refund_unused: true,
        shadow: false,
    }
}

/// The tenant budgets of the gateway tests' config (`TestConfig::standard`
/// with the limits below), as the store names them.
fn tenant_budgets(ks: &KeySpace) -> Vec<BudgetSpec> {
    let day = |name, limit| {
        spec(
            ks,
            name,
            BudgetKind::Quota {
                limit,
                window: Window::Day,
            },
        )
    };
    vec![
        spec(
            ks,
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: 1000,
                burst: 1000,
            },
        ),
        spec(
            ks,
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: 100,
                burst: 100,
            },
        ),
        day(BudgetName::TokensPerDay, 100_000),
        day(BudgetName::RequestsPerDay, 1000),
    ]
}

fn tenant_limits() -> Limits {
    limits()
        .tpm(1000)
        .rpm(100)
        .tokens_per_day(100_000)
        .requests_per_day(1000)
}

async fn remaining(store: &RedisStore, specs: &[BudgetSpec]) -> Vec<i64> {
    store
        .inspect(specs)
        .await
        .expect("inspect")
        .iter()
        .map(|s| s.remaining)
        .collect()
}

/// Void before reserve through the proxy: the reservation times out at the
/// gateway, a void overtakes it on another connection, and the late
/// reservation writes nothing and answers `Voided`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_void_that_overtakes_its_reservation_leaves_every_budget_unchanged() {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(redis.port()).await;
    let ks = KeySpace::new("bglost", "a");
    let slow = RedisStore::connect(&proxy.url(), Duration::from_millis(100), ks.clone())
        .await
        .expect("connect through the proxy");
    let fast = RedisStore::connect(&redis.url(), Duration::from_secs(2), ks.clone())
        .await
        .expect("connect");
    let specs = tenant_budgets(&ks);
    let before = remaining(&fast, &specs).await;
    let req = ReserveRequest {
        share: None,
        id: "lost-1".into(),
        costs: budgetgate::budget::Costs::tokens(300),
        common: specs.clone(),
        candidates: vec![vec![]],
        slot_lease_micros: 10_000_000,
        hold_ttl_micros: 60_000_000,
        requester: Default::default(),
    };
    proxy.set_delay(400);
    let r = slow.reserve(&req).await;
    assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
    let v = fast.void("lost-1", 60_000_000).await.expect("void");
    assert_eq!(v, SettleOutcome::Voided);
    // The late reservation reaches Redis now.
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.set_delay(0);
    assert_eq!(remaining(&fast, &specs).await, before, "nothing written");
    let hold = fast
        .read_hold("lost-1")
        .await
        .expect("read")
        .expect("tombstone");
    assert!(hold.voided && hold.lines.is_empty(), "{hold:?}");
    assert_eq!(
        fast.reserve(&req).await.expect("reserve"),
        ReserveOutcome::Voided
    );
}

async fn post(gw: &Gateway) -> (u16, u64) {
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("no request hangs");
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    (status, body["usage"]["total_tokens"].as_u64().unwrap_or(0))
}

async fn gateway_through(proxy: &DelayProxy, policy: &str) -> Gateway {
    let mock = start_mock().await;
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, tenant_limits()).redis(&proxy.url());
    cfg.store.timeout_ms = Some(100);
    cfg.store.key_prefix = Some("bglost".into());
    cfg.store.domain = Some(policy.into());
    cfg.tenant("t1").on_store_error = Some(policy.into());
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::connect(
            &proxy.url(),
            Duration::from_millis(100),
            KeySpace::new("bglost", policy),
        )
        .await
        .expect("connect"),
    );
    std::mem::forget(mock);
    cfg.start_with(ManualClock::new(NOON), store).await
}

/// Waits until `f` holds (compensations land in the background).
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < Duration::from_secs(15), "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_requests_whose_replies_were_lost_cost_nothing() {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(redis.port()).await;
    let gw = gateway_through(&proxy, "fail_closed").await;
    let ks = KeySpace::new("bglost", "fail_closed");
    let direct = RedisStore::connect(&redis.url(), Duration::from_secs(2), ks.clone())
        .await
        .expect("connect");
    let specs = tenant_budgets(&ks);
    let full = remaining(&direct, &specs).await;

    proxy.set_delay(300);
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(post(&gw).await.0);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    proxy.set_delay(0);
    eventually("every budget and quota back where it was", async || {
        remaining(&direct, &specs).await == full
    })
    .await;
    let text = gw.metrics_text().await;
    let compensated: f64 = text
        .lines()
        .filter(|l| l.starts_with("budgetgate_compensations_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!("fail-closed: 20 requests answered 503, {compensated} reservations compensated, budgets unchanged");
    assert!(compensated >= 1.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_requests_whose_replies_were_lost_cost_at_most_their_usage() {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(redis.port()).await;
    let gw = gateway_through(&proxy, "fail_open").await;
    let ks = KeySpace::new("bglost", "fail_open");
    let direct = RedisStore::connect(&redis.url(), Duration::from_secs(2), ks.clone())
        .await
        .expect("connect");
    let specs = tenant_budgets(&ks);
    let full = remaining(&direct, &specs).await;

    proxy.set_delay(300);
    let mut used = 0;
    let mut served = 0;
    for _ in 0..5 {
        let (status, tokens) = post(&gw).await;
        assert_eq!(status, 200, "served by the local limiter");
        used += tokens;
        served += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    proxy.set_delay(0);
    // Compensations land: every hold settled or voided.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = remaining(&direct, &specs).await;
    let charged_tokens = (full[2] - now[2]) as u64;
    let charged_requests = (full[3] - now[3]) as u64;
    println!(
        "fail-open: {served} requests served, {used} tokens of real usage; the store was charged {charged_tokens} tokens and {charged_requests} requests"
    );
    assert!(
        charged_tokens <= used,
        "at most the real usage, never a reservation"
    );
    assert!(charged_requests <= served);
    // Nothing left in flight: no reservation still holds tokens.
    eventually("no reservation left charged", async || {
        let n = remaining(&direct, &specs).await;
        (full[2] - n[2]) as u64 <= used
    })
    .await;
}
