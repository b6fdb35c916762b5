//! Budget alerts (docs/LEDGER.md "Alerts") with a real
//! HTTP receiver in the test: the 80 % webhook of a daily token quota
//! fires once, signed with HMAC-SHA-256 over its body under the secret
//! from the environment; a firing made while the receiver is down is
//! delivered once it is back, under one idempotency id. Faults guarded
//! against: a threshold fired on every check, an unsigned or wrongly
//! signed body, a firing lost to a receiver outage.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use budgetgate::alerts::webhook::{signature, IDEMPOTENCY_ID, SIGNATURE};
use budgetgate::budget::{BudgetName, Scope};
use serde_json::Value;

use crate::support::*;

const SECRET: &str = "alert-secret-of-the-test-0123456789";
const SECRET_ENV: &str = "BUDGETGATE_TEST_ALERT_SECRET_ALERTS";

/// One delivery as the receiver saw it.
#[derive(Debug, Clone)]
struct Delivery {
    signature: String,
    id: String,
    body: Vec<u8>,
}

impl Delivery {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// A webhook receiver on a fixed loopback port that can be taken down and
/// brought back on the same port.
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Delivery>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut r = Receiver {
            port,
            got: Arc::default(),
            task: None,
        };
        r.serve(listener);
        r
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let got = self.got.clone();
        let app = axum::Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let got = got.clone();
                async move {
                    let h = |n: &str| {
                        headers
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    got.lock().unwrap().push(Delivery {
                        signature: h(SIGNATURE),
                        id: h(IDEMPOTENCY_ID),
                        body: body.to_vec(),
                    });
                    "ok"
                }
            }),
        );
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    async fn resume(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("the receiver's port again");
        self.serve(listener);
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.got.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize, within: Duration) -> Vec<Delivery> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let d = self.deliveries();
            if d.len() >= n || tokio::time::Instant::now() > deadline {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Sends requests as `key` until `tenant`'s daily tokens are at least
/// `percent` % used.
async fn spend_until(gw: &Gateway, key: &str, tenant: &str, limit: u64, percent: u64) {
    for _ in 0..200 {
        if gw
            .used(Scope::Tenant(tenant.into()), BudgetName::TokensPerDay)
            .await
            * 100
            >= limit * percent
        {
            return;
        }
        assert_eq!(post_hi(gw, key).await, 200);
        gw.settled().await;
    }
    panic!("{tenant} never reached {percent} %");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_80_percent_webhook_fires_once_signed_and_again_after_a_receiver_outage() {
    // SAFETY of the test: the variable is this suite's own.
    std::env::set_var(SECRET_ENV, SECRET);
    let mock = start_mock().await;
    let mut receiver = Receiver::start().await;
    const LIMIT: u64 = 2_000;
    let mut c = TestConfig::standard(&mock.base_url(), 20, limits().tokens_per_day(LIMIT));
    c.tenants.push(config::tenant(
        "t2",
        "k2",
        "sk-test-second",
        limits().tokens_per_day(LIMIT),
    ));
    c.alerts.webhook_url = Some(receiver.url());
    c.alerts.secret_env = Some(SECRET_ENV.into());
    c.alerts.thresholds_percent = Some(vec![80]);
    c.alerts.check_interval_ms = Some(100);
    let gw = c.start().await;

    spend_until(&gw, KEY, "t1", LIMIT, 80).await;
    let got = receiver.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let d = &got[0];
    assert_eq!(d.signature, signature(SECRET.as_bytes(), &d.body));
    let body = d.json();
    assert_eq!(body["threshold_percent"], 80);
    assert_eq!(body["scope"], "tenant:t1");
    assert_eq!(body["budget"], "tokens_per_day");
    assert_eq!(body["limit"], LIMIT);
    assert!(body["used"].as_u64().unwrap() * 100 >= LIMIT * 80, "{body}");
    assert_eq!(body["id"], d.id.as_str());
    // More traffic and many more checks: still once.
    assert_eq!(post_hi(&gw, KEY).await, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        receiver.deliveries().len(),
        1,
        "{:?}",
        receiver.deliveries()
    );

    // The receiver goes away; t2 crosses 80 % meanwhile.
    receiver.stop();
    spend_until(&gw, "sk-test-second", "t2", LIMIT, 80).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(receiver.deliveries().len(), 1);
    receiver.resume().await;
    let got = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert!(
        got.len() >= 2,
        "the firing made during the outage never arrived: {got:?}"
    );
    let later: Vec<&Delivery> = got[1..].iter().collect();
    assert!(later.iter().all(|d| d.id == later[0].id), "{later:?}");
    assert_ne!(later[0].id, got[0].id);
    for d in &later {
        assert_eq!(d.signature, signature(SECRET.as_bytes(), &d.body));
        assert_eq!(d.json()["scope"], "tenant:t2");
    }
    let scrape = scrape(&gw).await;
    assert!(
        sample_sum(
            &scrape,
            "budgetgate_alerts_fired_total",
            &[("threshold", "80")]
        ) >= 2.0,
        "each firing is counted"
    );
}
