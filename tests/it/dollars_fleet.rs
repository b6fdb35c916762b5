//! Fleet exactness in dollars: three `budgetgate
//! serve` processes on one Redis, 200 concurrent clients, one dollar budget
//! B, every request costing exactly C µ$ (its usage equals its
//! reservation): exactly floor(B / C) requests are admitted fleet-wide, and
//! the budget's final spend is the sum of the settled costs. Fault guarded
//! against: a dollar budget reserved counter by counter or checked after
//! the call, which over-admits under concurrency.
//!
//! Run: `cargo test --test it dollars_fleet:: -- --nocapture` (needs
//! `redis-server`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use budgetgate::admission::plan;
use budgetgate::budget::{BudgetName, Scope};
use budgetgate::clock::{Clock, SystemClock};
use budgetgate::gateway::AppState;

use super::dollars::{cost, priced};
use crate::support::redis_server::RedisServer;
use crate::support::*;

const CLIENTS: usize = 200;
const GATEWAYS: usize = 3;
const MAX_TOKENS: u64 = 40;
/// The budget: 20,000 µ$ (two cents).
const BUDGET: &str = "0.02";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_admit_exactly_what_the_dollars_pay_for() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let tenant = "payer-fleet";
    let cfg = priced(&mock.base_url(), tenant, limits().usd_per_day(BUDGET))
        .redis_fleet(&redis.url(), "bgdollars");
    let body = hi(MAX_TOKENS);
    let input = chat_input_tokens(&body);
    // Usage equal to the reservation: the estimate's input, the whole cap.
    mock.state.set_usage_override(Some(input), Some(MAX_TOKENS));
    let c = cost(input, MAX_TOKENS);
    let b = 20_000u64;
    let want = b / c;
    assert!(want > 100 && want < 1000, "{want} requests of {c} µ$");

    let dir = tempfile::tempdir().expect("temp dir");
    let path = cfg.write(dir.path());
    let mut gateways = Vec::new();
    for _ in 0..GATEWAYS {
        gateways.push(GatewayProcess::start(&path, &[("RUST_LOG", "warn")]).await);
    }
    let bases: Arc<Vec<String>> = Arc::new(gateways.iter().map(|g| g.base_url()).collect());
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .expect("client");
    let (ok, refused, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (http, bases, body) = (http.clone(), bases.clone(), body.clone());
        let (ok, refused, other) = (ok.clone(), refused.clone(), other.clone());
        tasks.push(tokio::spawn(async move {
            // Each client sends until the fleet refuses it for good.
            for n in 0.. {
                let base = &bases[(client + n) % bases.len()];
                let resp = http
                    .post(format!("{base}/chat/completions"))
                    .bearer_auth(KEY)
                    .json(&body)
                    .send()
                    .await;
                let Ok(resp) = resp else {
                    other.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                match status {
                    200 => ok.fetch_add(1, Ordering::Relaxed),
                    429 if text.contains("insufficient_quota") => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    _ => {
                        eprintln!("client {client}: {status} {text}");
                        other.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                };
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let (ok, refused, other) = (
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
    );
    println!(
        "dollar fleet: {GATEWAYS} gateways, {CLIENTS} clients, budget {b} µ$, {c} µ$ per request: \
         {ok} admitted (floor(B / C) = {want}), {refused} refused, {other} other"
    );
    assert_eq!(other, 0, "every answer is 200 or an insufficient_quota 429");
    assert_eq!(
        refused, CLIENTS as u64,
        "every client was refused in the end"
    );
    assert_eq!(ok, want, "exactly floor(B / C) admitted fleet-wide");

    // The spend, read from Redis once every settlement has run, is the sum
    // of the settled costs; so is the gateways' spend counter.
    let mut settled = 0.0;
    for _ in 0..100 {
        settled = 0.0;
        for g in &gateways {
            settled += g
                .metric(
                    "budgetgate_settled_spend_micro_usd_total",
                    &[("tenant", tenant)],
                )
                .await;
        }
        if settled as u64 == ok * c {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(settled as u64, ok * c, "Σ settled costs");
    let policy = cfg.policy();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = budgetgate::app::build_store(&policy, clock)
        .await
        .expect("store");
    let ks = AppState::key_space(&policy);
    let specs: Vec<_> = plan::scope_budgets(
        &ks,
        Scope::Tenant(tenant.into()),
        &policy.tenants[0].limits,
        true,
    )
    .into_iter()
    .filter(|s| s.name == BudgetName::UsdPerDay)
    .collect();
    let state = store.inspect(&specs).await.expect("inspect").remove(0);
    assert_eq!(
        (b as i64 - state.remaining) as u64,
        ok * c,
        "final spend = Σ settled"
    );
    drop(gateways);
}
