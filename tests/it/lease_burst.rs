//! A fleet burst on a budget every gateway already holds a lease of:
//! three `budgetgate serve` processes on one real Redis, the hot
//! tenant first driven below its limits until all three gateways lease its
//! `rpm` budget, then 64 clients send as fast as they are answered.
//!
//! Leases are pre-debited: over the whole run (which starts with no lease
//! out) the fleet admits at most burst + rate × time. A window that starts
//! with leases out may admit, besides burst + rate × its length, at most the
//! units those leases held unspent at its start (they were debited before
//! the window: DESIGN section 14, "Bounds"). And the leases must not strand
//! more than 10 % of what the bucket gives over the burst.
//!
//! Run: `cargo test --test it lease_burst:: -- --nocapture` (prints the figures).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::lease_fleet::{
    bound, drive, fleet_config, leased_view, start_fleet, HOT_KEY, RPM, RPM_BURST, TPM, TPM_BURST,
};
use crate::support::redis_server::RedisServer;
use crate::support::*;

/// Per gateway, 20 requests a second make a budget hot here (the default 50
/// would need more than the tenant's whole rpm spread over three gateways).
const MIN_RATE: i64 = 20;
const WARM_UP: Duration = Duration::from_secs(4);
const BURST: Duration = Duration::from_secs(6);

/// The `rpm` budget's leases as the store counts them, from one gateway's view.
fn rpm_leases(view: &[Value]) -> u64 {
    view.iter()
        .filter(|b| b["budget"] == "rpm")
        .map(|b| b["leased"]["leases"].as_u64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_budget_leased_by_every_gateway_stays_within_the_limit() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = fleet_config(&mock.base_url(), &redis.url(), RPM);
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        min_rate: Some(MIN_RATE),
        ..Default::default()
    });
    let cfg = c.write(dir.path());
    let gws = start_fleet(&cfg, 3).await;
    let bases: Arc<Vec<String>> = Arc::new(gws.iter().map(|g| format!("{}/v1", g.root)).collect());
    let started = Instant::now();

    // Below the limits: 75 requests a second (25 per gateway) against a
    // refill of 100, so the bucket is full when the burst starts.
    let warm = drive(
        bases.clone(),
        HOT_KEY,
        30,
        Duration::from_millis(400),
        started + WARM_UP,
    )
    .await;
    let mut leased_everywhere = Vec::new();
    for g in &gws {
        leased_everywhere.push(rpm_leases(&leased_view(g, "hot").await));
    }
    let here: Vec<u64> = {
        let mut v = Vec::new();
        for g in &gws {
            let view = leased_view(g, "hot").await;
            v.push(
                view.iter()
                    .filter(|b| b["budget"] == "rpm")
                    .map(|b| b["leased"]["here"].as_u64().unwrap_or(0))
                    .sum(),
            );
        }
        v
    };

    // The burst: 64 clients, each sending again as soon as it is answered.
    let burst_started = Instant::now();
    let burst = drive(
        bases.clone(),
        HOT_KEY,
        64,
        Duration::from_millis(1),
        burst_started + BURST,
    )
    .await;
    let burst_secs = burst_started.elapsed().as_secs_f64();
    let total_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (warm_ok, burst_ok) = (
        warm.ok.load(Ordering::Relaxed) as f64,
        burst.ok.load(Ordering::Relaxed) as f64,
    );
    let tokens =
        (warm.tokens.load(Ordering::Relaxed) + burst.tokens.load(Ordering::Relaxed)) as f64;
    let total_bound = bound(RPM, RPM_BURST, total_secs);
    let tpm_bound = bound(TPM, TPM_BURST, total_secs);
    let burst_bound = bound(RPM, RPM_BURST, burst_secs);
    println!(
        "lease burst: warm-up {warm_ok} admitted, {} refused; rpm leases seen by each gateway {leased_everywhere:?}, units held here {here:?}",
        warm.refused.load(Ordering::Relaxed)
    );
    println!(
        "  burst {burst_secs:.1} s: {burst_ok} admitted of bound {burst_bound:.0} ({:.1} %), {} refused, {} other; \
         whole run {:.0} of bound {total_bound:.0}, settled {tokens} tokens of bound {tpm_bound:.0}",
        100.0 * burst_ok / burst_bound,
        burst.refused.load(Ordering::Relaxed),
        burst.other.load(Ordering::Relaxed),
        warm_ok + burst_ok,
    );
    assert_eq!(
        warm.refused.load(Ordering::Relaxed),
        0,
        "warm-up is below the limits"
    );
    assert!(
        leased_everywhere.iter().all(|&n| n >= 3) && here.iter().all(|&u| u > 0),
        "every gateway holds a lease of the rpm budget when the burst starts: {leased_everywhere:?} {here:?}"
    );
    let held: u64 = here.iter().sum();
    assert!(
        burst_ok <= burst_bound + held as f64,
        "the burst admitted {burst_ok}: above {burst_bound} + the {held} units its leases held"
    );
    assert!(
        warm_ok + burst_ok <= total_bound,
        "admitted {} above the rpm bound {total_bound}",
        warm_ok + burst_ok
    );
    assert!(
        tokens <= tpm_bound,
        "settled {tokens} above the tpm bound {tpm_bound}"
    );
    assert!(
        burst_ok >= 0.9 * burst_bound,
        "the burst admitted {burst_ok}: stranding above 10 % of {burst_bound}"
    );
    assert_eq!(burst.other.load(Ordering::Relaxed), 0, "only 200 and 429");
}
