//! Requests cut off during their reservation (DESIGN section 13): a client
//! resets its connection right after sending the request, while the
//! gateway waits for Redis to answer the reservation. The reservation may
//! apply with nobody left to settle it; the gateway voids its id as it
//! voids a lost reply's, so no slot stays taken and no token stays charged.
//!
//! A proxy in front of Redis holds every reply for a while (never the
//! commands: a reservation applies at once and only its answer is late).
//!
//! Run: `cargo test --test it redis_cut_off:: -- --nocapture`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::reconcile::{explains, quota, reconciled};
use crate::support::redis_server::RedisServer;
use crate::support::*;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{BudgetKind, BudgetName, BudgetSpec, BudgetStore, Scope};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PREFIX: &str = "bgcut";
const TOKEN: &str = "cut-off-admin-token";
const SLOTS: u64 = 1_000;

/// A TCP proxy to `upstream` passing commands on at once and every reply
/// `delay` ms after it came (each chunk its own delay, in order: replies
/// are late, never reordered or made later by a queue of delays).
struct ReplyDelay {
    port: u16,
    delay: Arc<AtomicU64>,
}

impl ReplyDelay {
    async fn start(upstream: u16) -> Self {
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
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let (replies, mut due_replies) = tokio::sync::mpsc::unbounded_channel();
                let d = d.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let due = Instant::now() + Duration::from_millis(d.load(Ordering::SeqCst));
                        if replies.send((due, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    while let Some((due, bytes)) = due_replies.recv().await {
                        tokio::time::sleep_until(due.into()).await;
                        if cw.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { port, delay }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn set_delay(&self, ms: u64) {
        self.delay.store(ms, Ordering::SeqCst);
    }
}

/// The gateway: `gpt-4o-mini` on an OpenAI-style upstream, `claude-test`
/// on an Anthropic one (the same mock), tenant `t1` fail-closed with
/// [`SLOTS`] concurrent requests, the store behind `redis_url`.
fn gateway_config(mock: &mock_upstream::MockUpstream, redis_url: &str) -> TestConfig {
    let mut c = TestConfig::standard(
        &mock.base_url(),
        50,
        limits()
            .max_concurrent(SLOTS)
            .tpm(100_000_000)
            .tokens_per_day(1_000_000_000),
    )
    .redis(redis_url);
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        ..config::upstream("claude", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(50),
        max_output_tokens: Some(4096),
        ..config::model("claude-test", &["claude"])
    });
    c.store.timeout_ms = Some(2_000);
    c.store.key_prefix = Some(PREFIX.into());
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        mode: Some("off".into()),
        ..Default::default()
    });
    c.tenant("t1").on_store_error = Some("fail_closed".into());
    c.ledger.batch_interval_ms = Some(100);
    c
}

/// The raw HTTP/1.1 request of kind `i` (chat or Messages, streamed or not).
fn request_bytes(i: usize) -> Vec<u8> {
    let stream = i % 2 == 1;
    let (path, auth, body) = if i % 4 < 2 {
        let body = json!({"model": "gpt-4o-mini", "stream": stream, "max_tokens": 50,
            "messages": [{"role": "user", "content": "hello there"}]});
        (
            "/v1/chat/completions",
            format!("authorization: Bearer {KEY}"),
            body,
        )
    } else {
        let body = json!({"model": "claude-test", "stream": stream, "max_tokens": 50,
            "messages": [{"role": "user", "content": "hello there"}]});
        (
            "/v1/messages",
            format!("x-api-key: {KEY}\r\nanthropic-version: 2023-06-01"),
            body,
        )
    };
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends request `i`, waits `after`, then resets the connection (RST).
async fn send_and_reset(addr: &str, i: usize, after: Duration) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&request_bytes(i)).await.expect("request bytes");
    tokio::time::sleep(after).await;
    // A zero linger sends the RST at once on close: nothing to block on.
    #[allow(deprecated)]
    s.set_linger(Some(Duration::ZERO)).expect("linger 0");
    drop(s);
}

fn slots_spec(ks: &KeySpace) -> BudgetSpec {
    let scope = Scope::Tenant("t1".into());
    BudgetSpec {
        key: ks.budget(&scope, BudgetName::MaxConcurrent).into(),
        scope,
        name: BudgetName::MaxConcurrent,
        kind: BudgetKind::Concurrency { max: SLOTS },
        refund_unused: true,
        shadow: false,
    }
}

/// 300 connections, streamed and not, chat and Messages, each reset 80 ms
/// after its request bytes while the store's reply is held 300 ms: within
/// a second of the last, no slot is taken and the ledger and the store
/// agree to the token (nothing held in flight, nothing unexplained).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_reset_during_their_reservation_leave_nothing_held() {
    let redis = RedisServer::start();
    let proxy = ReplyDelay::start(redis.port()).await;
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let gw = GatewayProcess::start(
        &gateway_config(&mock, &proxy.url()).write(dir.path()),
        &[("BUDGETGATE_ADMIN_TOKEN", TOKEN), ("RUST_LOG", "warn")],
    )
    .await;
    let direct = RedisStore::connect(
        &redis.url(),
        Duration::from_secs(2),
        KeySpace::new(PREFIX, "default"),
    )
    .await
    .expect("connect");
    let slots = slots_spec(&KeySpace::new(PREFIX, "default"));
    let free = || {
        let (direct, slots) = (&direct, &slots);
        async move {
            direct
                .inspect(std::slice::from_ref(slots))
                .await
                .expect("inspect")[0]
                .remaining
        }
    };
    // Every kind answers while the store is prompt.
    let http = reqwest::Client::new();
    for i in 0..4 {
        let mut r = http.post(format!(
            "{}{}",
            gw.root_url(),
            ["/v1/chat/completions", "/v1/messages"][i / 2]
        ));
        r = if i < 2 {
            r.bearer_auth(KEY)
        } else {
            r.header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01")
        };
        let model = ["gpt-4o-mini", "claude-test"][i / 2];
        let r = r
            .json(
                &json!({"model": model, "stream": i % 2 == 1, "max_tokens": 50,
                "messages": [{"role": "user", "content": "hello there"}]}),
            )
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200, "kind {i}");
        let _ = r.bytes().await;
    }
    // Their settlements land in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    while free().await != SLOTS as i64 {
        assert!(
            Instant::now() < deadline,
            "the first requests' slots are free"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    proxy.set_delay(300);
    let addr = gw.root_url().trim_start_matches("http://").to_string();
    let started = Instant::now();
    let mut resets = Vec::new();
    for i in 0..300 {
        let addr = addr.clone();
        resets.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(8 * i as u64)).await;
            send_and_reset(&addr, i, Duration::from_millis(80)).await;
        }));
    }
    let mut held_during = SLOTS as i64;
    for r in resets {
        r.await.expect("reset");
        held_during = held_during.min(free().await);
    }
    let last = Instant::now();
    proxy.set_delay(0);
    println!(
        "300 connections reset in {} ms; at most {} slots taken meanwhile",
        (last - started).as_millis(),
        SLOTS as i64 - held_during
    );

    let mut taken;
    let mut q;
    loop {
        taken = SLOTS as i64 - free().await;
        q = quota(&reconciled(&gw, TOKEN).await, "tokens_per_day").clone();
        let settled = taken == 0 && q["unexplained"] == 0 && explains(&q, "holds_in_flight") == 0;
        if settled || last.elapsed() > Duration::from_secs(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at = last.elapsed();
    let voided = gw
        .metric("budgetgate_compensations_total", &[("outcome", "voided")])
        .await
        + gw.metric(
            "budgetgate_compensations_total",
            &[("outcome", "voided_ahead")],
        )
        .await;
    println!(
        "{} ms after the last reset: {taken} slots taken; {} reservations voided; tokens_per_day reconciled: {q}",
        at.as_millis(),
        voided as u64
    );
    assert!(
        SLOTS as i64 - held_during > 0,
        "the resets came while reservations were held"
    );
    assert_eq!(taken, 0, "no slot left taken");
    assert_eq!(explains(&q, "holds_in_flight"), 0, "{q}");
    assert_eq!(q["unexplained"], 0, "{q}");
    assert!(
        at <= Duration::from_millis(1_100),
        "within a second of the last reset"
    );
    assert!(
        voided >= 100.0,
        "most resets came during the store call: {voided} voided"
    );
}
