//! Quota leases across a fleet: three `budgetgate serve`
//! processes on one real Redis, a hot tenant driven at twice its limits
//! from 64 clients spread over the gateways, a cold tenant beside it.
//!
//! Run: `cargo test --test it lease_fleet:: -- --nocapture` (prints the
//! figures). `BUDGETGATE_LEASE_RUN_SECS` changes the 30 s of the main run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::config::tenant;
use crate::support::redis_server::RedisServer;
use crate::support::*;

pub(crate) const HOT_KEY: &str = "sk-hot-0123456789";
pub(crate) const COLD_KEY: &str = "sk-cold-0123456789";
const PREFIX: &str = "bglease";
const ADMIN: &str = "lease-admin-token";
/// The hot tenant's limits (the design's example) and bursts small enough that a
/// run of seconds is contended (a full minute's burst would not be).
pub(crate) const RPM: u64 = 6_000;
pub(crate) const TPM: u64 = 600_000;
pub(crate) const RPM_BURST: u64 = 500;
pub(crate) const TPM_BURST: u64 = 50_000;
const MAX_TOKENS: u64 = 80;

pub(crate) fn fleet_config(upstream: &str, redis_url: &str, rpm: u64) -> TestConfig {
    let mut c = TestConfig::standard(upstream, 64, limits()).redis_fleet(redis_url, PREFIX);
    c.tenants.clear();
    c.tenants.push(tenant(
        "hot",
        "hk",
        HOT_KEY,
        limits()
            .rpm(rpm)
            .rpm_burst(RPM_BURST)
            .tpm(TPM)
            .tpm_burst(TPM_BURST),
    ));
    c.tenants.push(tenant(
        "cold",
        "ck",
        COLD_KEY,
        limits().rpm(600).tpm(60_000),
    ));
    for t in &mut c.0.tenants {
        t.on_store_error = Some("fail_closed".into());
    }
    c.server.admin_token_env = Some("LEASE_ADMIN".into());
    c
}

/// What a load run saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub ok: AtomicU64,
    pub refused: AtomicU64,
    pub other: AtomicU64,
    /// Tokens of the answers' `usage.total_tokens` (what was settled).
    pub tokens: AtomicU64,
}

/// `clients` clients, each sending one request every `every`, spread over
/// `bases` in turn, with `key`, until `until`.
pub(crate) async fn drive(
    bases: Arc<Vec<String>>,
    key: &'static str,
    clients: usize,
    every: Duration,
    until: Instant,
) -> Arc<Seen> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .expect("client");
    let seen = Arc::new(Seen::default());
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (http, bases, seen) = (http.clone(), bases.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            // Clients start spread over one period, not in lockstep.
            tokio::time::sleep(every * c as u32 / clients as u32).await;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0usize;
            while Instant::now() < until {
                tick.tick().await;
                let base = &bases[(c + n) % bases.len()];
                n += 1;
                let body = serde_json::json!({
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": MAX_TOKENS,
                });
                let sent = http
                    .post(format!("{base}/chat/completions"))
                    .bearer_auth(key)
                    .json(&body)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                let Ok(resp) = sent else {
                    seen.other.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                match resp.status().as_u16() {
                    200 => {
                        let v: Value = resp.json().await.unwrap_or_default();
                        let t = v["usage"]["total_tokens"].as_u64().unwrap_or(0);
                        seen.tokens.fetch_add(t, Ordering::Relaxed);
                        seen.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    429 => {
                        let _ = resp.bytes().await;
                        seen.refused.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        let _ = resp.bytes().await;
                        seen.other.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    seen
}

/// The most a bucket admits over `secs`: burst + rate × time.
pub(crate) fn bound(per_minute: u64, burst: u64, secs: f64) -> f64 {
    burst as f64 + per_minute as f64 * secs / 60.0
}

pub(crate) async fn start_fleet(cfg: &std::path::Path, n: usize) -> Vec<GatewayProcess> {
    let mut gateways = Vec::new();
    for _ in 0..n {
        gateways.push(
            GatewayProcess::start(cfg, &[("RUST_LOG", "warn"), ("LEASE_ADMIN", ADMIN)]).await,
        );
    }
    gateways
}

/// Sum of a counter over the fleet.
pub(crate) async fn fleet_metric(
    gws: &[GatewayProcess],
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    let mut sum = 0.0;
    for g in gws {
        sum += g.metric(name, labels).await;
    }
    sum
}

/// The `leased` object of every budget of tenant `name` in one gateway's
/// admin budget view.
pub(crate) async fn leased_view(g: &GatewayProcess, name: &str) -> Vec<Value> {
    let v: Value = reqwest::Client::new()
        .get(format!("{}/admin/v1/budgets", g.root))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("admin budgets")
        .json()
        .await
        .expect("admin json");
    v["tenants"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["name"] == name)
        .flat_map(|t| t["budgets"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Seconds before the steady state's counters are read.
const WARM_UP: u64 = 3;

/// The fleet's decision counters at one moment.
struct Counters {
    local: f64,
    by_store: f64,
    calls: f64,
}

impl Counters {
    async fn read(gws: &[GatewayProcess]) -> Self {
        Self {
            local: fleet_metric(
                gws,
                "budgetgate_quota_lease_decisions_total",
                &[("decided_by", "lease")],
            )
            .await,
            by_store: fleet_metric(
                gws,
                "budgetgate_quota_lease_decisions_total",
                &[("decided_by", "store")],
            )
            .await,
            calls: fleet_metric(gws, "budgetgate_quota_lease_calls_total", &[]).await,
        }
    }
}

fn run_secs() -> u64 {
    std::env::var("BUDGETGATE_LEASE_RUN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_tenant_is_served_from_leases_without_over_admission() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = fleet_config(&mock.base_url(), &redis.url(), RPM).write(dir.path());
    let gws = start_fleet(&cfg, 3).await;
    let bases: Arc<Vec<String>> = Arc::new(gws.iter().map(|g| format!("{}/v1", g.root)).collect());
    let secs = run_secs();
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    // Twice the rpm: 200 requests a second from 64 clients.
    let hot = tokio::spawn(drive(
        bases.clone(),
        HOT_KEY,
        64,
        Duration::from_millis(320),
        until,
    ));
    let cold = tokio::spawn(drive(
        bases.clone(),
        COLD_KEY,
        1,
        Duration::from_secs(1),
        until,
    ));
    // After the warm-up (the first requests of a budget go to the store
    // until its rate shows), the steady state's counters...
    tokio::time::sleep(Duration::from_secs(WARM_UP)).await;
    let warm = Counters::read(&gws).await;
    // ...and mid-run: the hot tenant's budgets are out on leases, the cold one's not.
    tokio::time::sleep(Duration::from_secs(secs / 2 - WARM_UP)).await;
    let hot_view = leased_view(&gws[0], "hot").await;
    let cold_view = leased_view(&gws[0], "cold").await;
    let (hot, cold) = (hot.await.expect("hot"), cold.await.expect("cold"));
    let end = Counters::read(&gws).await;
    let elapsed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let ok = hot.ok.load(Ordering::Relaxed) as f64;
    let tokens = hot.tokens.load(Ordering::Relaxed) as f64;
    let (rpm_bound, tpm_bound) = (
        bound(RPM, RPM_BURST, elapsed),
        bound(TPM, TPM_BURST, elapsed),
    );
    let local = fleet_metric(
        &gws,
        "budgetgate_quota_lease_decisions_total",
        &[("decided_by", "lease")],
    )
    .await;
    let by_store = fleet_metric(
        &gws,
        "budgetgate_quota_lease_decisions_total",
        &[("decided_by", "store")],
    )
    .await;
    let calls = fleet_metric(&gws, "budgetgate_quota_lease_calls_total", &[]).await;
    let cold_ok = cold.ok.load(Ordering::Relaxed) as f64;
    // Each reservation the store decides costs a reserve and a settle call.
    let hot_store_calls =
        2.0 * (by_store - cold_ok - cold.refused.load(Ordering::Relaxed) as f64).max(0.0) + calls;
    let per_admitted = hot_store_calls / ok.max(1.0);
    // Steady state: each cold request is one store decision too.
    let cold_secs = secs.saturating_sub(WARM_UP) as f64;
    let steady_calls =
        2.0 * (end.by_store - warm.by_store - cold_secs).max(0.0) + (end.calls - warm.calls);
    let steady =
        steady_calls / (end.local - warm.local + end.by_store - warm.by_store - cold_secs).max(1.0);
    println!(
        "lease fleet: 3 gateways, {elapsed:.1} s: hot admitted {ok} of bound {rpm_bound:.0} ({:.1} %), refused {}, other {}; \
         settled {tokens} tokens of bound {tpm_bound:.0} ({:.1} %)",
        100.0 * ok / rpm_bound,
        hot.refused.load(Ordering::Relaxed),
        hot.other.load(Ordering::Relaxed),
        100.0 * tokens / tpm_bound
    );
    println!(
        "  decisions: {local} from leases, {by_store} by the store; {calls} lease calls; hot tenant store calls per admitted request {per_admitted:.4} over the run, {steady:.4} after the first {WARM_UP} s"
    );
    let mut events = Vec::new();
    for e in ["granted", "topped_up", "returned", "expired", "fenced"] {
        events.push((
            e,
            fleet_metric(&gws, "budgetgate_quota_leases_total", &[("event", e)]).await,
        ));
    }
    println!("  lease events: {events:?}");
    println!("  cold: {cold_ok} admitted; mid-run leased view hot {hot_view:?} cold {cold_view:?}");
    assert!(
        ok <= rpm_bound,
        "admitted {ok} above the rpm bound {rpm_bound}"
    );
    assert!(
        tokens <= tpm_bound,
        "settled {tokens} above the tpm bound {tpm_bound}"
    );
    assert!(
        ok >= 0.9 * rpm_bound,
        "admitted {ok}: stranding above 10 % of {rpm_bound}"
    );
    assert_eq!(hot.other.load(Ordering::Relaxed), 0, "only 200 and 429");
    assert!(
        steady <= 0.1,
        "store calls per admitted request after the warm-up {steady}"
    );
    let units = |view: &[Value]| {
        view.iter()
            .map(|b| b["leased"]["units"].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert!(
        units(&hot_view) > 0,
        "the hot tenant's budgets are leased: {hot_view:?}"
    );
    assert!(
        cold_view
            .iter()
            .all(|b| b["leased"]["leases"].as_u64() == Some(0)),
        "the cold tenant is exact: {cold_view:?}"
    );
    assert_eq!(cold.refused.load(Ordering::Relaxed), 0);
}

#[test]
fn check_config_prints_the_lease_bounds_for_the_fleet() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = fleet_config("http://127.0.0.1:9/v1", "redis://127.0.0.1:6399/", RPM);
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        fleet_size: Some(3),
        ..Default::default()
    });
    c.tenant("cold").lease = Some("off".into());
    let path = c.write(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("run check-config");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("fleet of 3 gateway(s)"), "{text}");
    assert!(text.contains("without faults: over-admission 0"), "{text}");
    // The slots of a fenced or expired concurrency lease.
    assert!(
        text.contains("slots: requests still running on a concurrency lease that is fenced"),
        "{text}"
    );
    // rpm 6000 with a burst of 500: a lease holds at most a quarter, 125;
    // three gateways strand at most 375.
    assert!(text.contains("tenant:hot rpm: one lease at most 125; stranded at most 375 across the fleet; a lost grant over-admits at most 125, a lost lease refills in 1.2 s"), "{text}");
    assert!(
        text.contains("tenant:cold rpm: exact (lease = \"off\")"),
        "{text}"
    );
}
