//! Fleet-wide weighted shares: three
//! gateways on one Redis (started here on a free port), one contended
//! deployment, two `standard` tenants of weights 3 and 1 both saturating
//! it. Their settled tokens over the window must be 3 : 1 within ±10 %,
//! whichever gateways each tenant's traffic reaches. The window is
//! `BUDGETGATE_QUEUE_WINDOW_SECS` (default 15 s, after a 3 s warm-up that
//! is not counted; the design's is 60 s), as in `queue_fairness`. Ratios are
//! printed. Faults guarded against: each gateway's queue racing the others
//! at every refill, so that a tenant's share follows how many gateways
//! its traffic reaches instead of its weight; a tenant deferred for share
//! blocking its gateway's line for the other tenant's waiters.
//!
//! In-process gateways (whose stores never lease) and `budgetgate serve`
//! processes (quota leases on, as by default).
//!
//! Order within a tenant: with 10 clients a tenant, the light
//! tenant's requests must be served about in the order they came,
//! whichever gateway each waits at, and none may wait its whole
//! `max_wait`. Faults guarded against: each gateway serving its own
//! waiters of a tenant, so that the one at a gateway that loses the races
//! for the refills waits while later ones of its tenant elsewhere pass it
//! (overtaken by 8 to 15, some answered 429 after their whole `max_wait`).
//!
//! Run: `cargo test --test it share_fleet:: -- --nocapture --test-threads=1`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use budgetgate::config::raw::RawQueue;

use super::queue_fairness::{class, tenant, weights_ratio, WARM_UP};
use crate::support::redis_server::RedisServer;
use crate::support::*;

const TPM: u64 = 60_000;
const GATEWAYS: usize = 3;
const CLIENTS: usize = 20;

/// The config of a fleet on `redis`: deployment `mock` (`TPM`, a second of
/// it as burst, not refunded: the mock answers every cap in full, so
/// settled = reserved) shared by `heavy` (weight 3) and `light` (weight 1).
async fn fleet_config(
    redis: &RedisServer,
    prefix: &str,
) -> (TestConfig, mock_upstream::MockUpstream) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(100_000);
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits());
    c.tenants.clear();
    c.tenants.push(tenant("heavy", "sk-heavy", "standard", 3));
    c.tenants.push(tenant("light", "sk-light", "standard", 1));
    let u = c.upstream("mock");
    u.limits = limits().tpm(TPM).tpm_burst(TPM / 60);
    u.refund_unused = Some(false);
    c.queue = Some(RawQueue {
        classes: [("standard".to_string(), class(20_000))]
            .into_iter()
            .collect(),
        ..RawQueue::default()
    });
    (c.redis_fleet(&redis.url(), prefix), mock)
}

/// `GATEWAYS` in-process gateways (their stores never lease).
async fn in_process(c: &TestConfig) -> Vec<Gateway> {
    let mut gws = Vec::new();
    for _ in 0..GATEWAYS {
        gws.push(c.start().await);
    }
    gws
}

/// Runs `CLIENTS` closed loops per tenant, each tenant's clients spread
/// over the gateways of its list (indexes into `gws`), and returns the
/// settled-token ratio.
async fn ratio(gws: &[String], heavy_on: &[usize], light_on: &[usize], what: &str) -> f64 {
    let urls = |on: &[usize]| -> Vec<String> { on.iter().map(|&g| gws[g].clone()).collect() };
    let what = format!("on {GATEWAYS} gateways, {what}");
    weights_ratio(&urls(heavy_on), &urls(light_on), CLIENTS, TPM, &what).await
}

/// [`ratio`] on in-process gateways.
async fn in_process_ratio(prefix: &str, heavy_on: &[usize], light_on: &[usize], what: &str) -> f64 {
    let redis = RedisServer::start();
    let (c, _mock) = fleet_config(&redis, prefix).await;
    let gws = in_process(&c).await;
    let urls: Vec<String> = gws.iter().map(|g| g.base_url()).collect();
    ratio(&urls, heavy_on, light_on, what).await
}

fn within_ten_percent(ratio: f64) {
    assert!(
        (2.7..=3.3).contains(&ratio),
        "settled tokens {ratio:.3} : 1, not 3 : 1 within 10 %"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_hold_with_each_tenant_on_all_three_gateways() {
    let all = [0, 1, 2];
    within_ten_percent(in_process_ratio("bgshare1", &all, &all, "each tenant on all three").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_hold_whichever_gateways_a_tenant_reaches() {
    // The weight-1 tenant's traffic reaches one gateway, the weight-3
    // tenant's all three: without fleet-wide shares each gateway's
    // queue takes a third of the deployment, two of them all for heavy.
    within_ten_percent(
        in_process_ratio("bgshare2", &[0, 1, 2], &[0], "light on one gateway").await,
    );
}

/// The same on three `budgetgate serve` processes, quota leases on (the
/// Redis store's default): a deployment lease never decides for a claim it
/// cannot pay, and a saturated shared deployment does not suit a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_hold_on_three_serve_processes_with_leases_on() {
    let redis = RedisServer::start();
    let (c, _mock) = fleet_config(&redis, "bgshare3").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = c.write(dir.path());
    let mut gws = Vec::new();
    for _ in 0..GATEWAYS {
        gws.push(GatewayProcess::start(&path, &[("RUST_LOG", "warn")]).await);
    }
    let urls: Vec<String> = gws.iter().map(|g| g.base_url()).collect();
    let all = [0, 1, 2];
    let r = ratio(
        &urls,
        &all,
        &all,
        "serve processes, each tenant on all three",
    )
    .await;
    let mut leased = 0.0;
    for g in &gws {
        leased += g
            .metric(
                "budgetgate_quota_lease_decisions_total",
                &[("decided_by", "lease")],
            )
            .await;
    }
    println!("reservations decided from leases: {leased}");
    within_ten_percent(r);
}

/// One request as a client saw it.
#[derive(Clone, Copy)]
struct Sent {
    light: bool,
    started: Duration,
    ended: Duration,
    status: u16,
    tokens: u64,
}

/// `clients` closed loops per tenant on `gws` (client `i` starts at
/// gateway `i`, then takes the next each time) for `load`: every request.
async fn every_request(gws: &[String], clients: usize, load: Duration) -> Vec<Sent> {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for light in [false, true] {
        for i in 0..clients {
            let (stop, sent, client, gws) =
                (stop.clone(), sent.clone(), client.clone(), gws.to_vec());
            tasks.push(tokio::spawn(async move {
                let key = if light { "sk-light" } else { "sk-heavy" };
                let mut n = i;
                while !stop.load(Ordering::Relaxed) {
                    let started = t0.elapsed();
                    let r = client
                        .post(format!("{}/chat/completions", gws[n % gws.len()]))
                        .bearer_auth(key)
                        .json(&hi(40))
                        .send()
                        .await
                        .expect("gateway reachable");
                    n += 1;
                    let status = r.status().as_u16();
                    let body: serde_json::Value = r.json().await.unwrap_or_default();
                    let tokens = body["usage"]["total_tokens"].as_u64().unwrap_or(0);
                    let ended = t0.elapsed();
                    sent.lock().unwrap().push(Sent {
                        light,
                        started,
                        ended,
                        status,
                        tokens,
                    });
                }
            }));
        }
    }
    tokio::time::sleep(load).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let all = sent.lock().unwrap().clone();
    all
}

/// Of the tenant's requests started after the warm-up: the most later
/// ones of its tenant answered before one was, the longest time one took,
/// and the refused ones.
fn order_of(all: &[Sent], light: bool) -> (usize, Duration, Vec<Sent>) {
    let mine: Vec<&Sent> = all.iter().filter(|s| s.light == light).collect();
    let counted = || mine.iter().filter(|s| s.started >= WARM_UP);
    let overtaken = counted()
        .map(|s| {
            mine.iter()
                .filter(|o| o.started > s.started && o.ended < s.ended && o.status == 200)
                .count()
        })
        .max()
        .unwrap_or(0);
    let longest = counted()
        .map(|s| s.ended - s.started)
        .max()
        .unwrap_or_default();
    let refused = counted().filter(|s| s.status != 200).map(|s| **s).collect();
    (overtaken, longest, refused)
}

/// The fleet the design names (three gateways, 60,000 tpm, weights 3 : 1, 10
/// clients each) with `max_wait` scaled down from its 10 s to 4 s: a light
/// request's turn comes about every 2 s (10 clients, about 5 of its
/// requests a second), so served in order none waits near 4 s (longest
/// 2.6–3.0 s in 15 runs), while with each gateway serving its own waiters
/// 2–3 light requests a run were answered 429 after 4 s and one was passed
/// by 12–14 later ones (3 of 3 runs failed). DESIGN §11, "Order within a
/// tenant".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenants_requests_are_served_in_order_across_the_fleet_and_none_waits_out_its_max_wait(
) {
    const MAX_WAIT: Duration = Duration::from_secs(4);
    let redis = RedisServer::start();
    let (mut c, _mock) = fleet_config(&redis, "bgorder").await;
    c.queue = Some(RawQueue {
        classes: [("standard".to_string(), class(MAX_WAIT.as_millis() as i64))]
            .into_iter()
            .collect(),
        ..RawQueue::default()
    });
    let gws = in_process(&c).await;
    let urls: Vec<String> = gws.iter().map(|g| g.base_url()).collect();
    let all = every_request(&urls, 10, WARM_UP + Duration::from_secs(9)).await;
    let (light_passed, light_longest, light_refused) = order_of(&all, true);
    let (heavy_passed, heavy_longest, heavy_refused) = order_of(&all, false);
    let tokens = |light: bool| -> u64 {
        let counted = all
            .iter()
            .filter(|s| s.light == light && s.ended >= WARM_UP);
        counted.map(|s| s.tokens).sum()
    };
    println!(
        "fleet order, 10 clients a tenant, max_wait {MAX_WAIT:?}: light passed by at most {light_passed} later requests, longest {light_longest:?}, {} refused; heavy passed by at most {heavy_passed}, longest {heavy_longest:?}, {} refused; settled tokens {} : {}",
        light_refused.len(),
        heavy_refused.len(),
        tokens(false),
        tokens(true),
    );
    for s in &light_refused {
        // Its tenant's share of what was settled while it waited.
        let during = all
            .iter()
            .filter(|o| o.status == 200 && o.ended > s.started && o.ended < s.ended);
        let (light, total) = during.fold((0, 0), |(l, t), o| {
            (l + if o.light { o.tokens } else { 0 }, t + o.tokens)
        });
        println!(
            "light refused {} after {:?}; light's share meanwhile {:.3}",
            s.status,
            s.ended - s.started,
            light as f64 / total.max(1) as f64
        );
    }
    assert!(
        light_refused.is_empty() && heavy_refused.is_empty(),
        "a request waited out its max_wait"
    );
    // DESIGN §11 ("Order within a tenant"): the store orders the waiters it
    // has seen; one not yet seen may be passed by a few.
    assert!(
        light_passed <= 6,
        "a light request was passed by {light_passed} later ones of its tenant"
    );
}
