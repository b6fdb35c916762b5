//! Quota leases under change and faults: a reload that halves
//! the hot tenant's rpm, a gateway killed under load, Redis unavailable
//! for 5 s. Three `budgetgate serve` processes on one real Redis.
//!
//! Run: `cargo test --test it lease_faults:: -- --nocapture`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lease_fleet::{bound, drive, fleet_config, leased_view, start_fleet, COLD_KEY, HOT_KEY};
use crate::support::redis_server::RedisServer;
use crate::support::*;
use budgetgate::config::raw::RawLease;

/// Short leases, so that a test of expiry takes seconds.
fn short_leases(c: &mut TestConfig) {
    c.store.lease = Some(RawLease {
        ttl_ms: Some(2000),
        report_interval_ms: Some(500),
        clock_margin_ms: Some(200),
        ..RawLease::default()
    });
}

fn bases(gws: &[GatewayProcess]) -> Arc<Vec<String>> {
    Arc::new(gws.iter().map(|g| format!("{}/v1", g.root)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_halves_the_rpm_is_followed_within_ttl_and_one_report() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = fleet_config(&mock.base_url(), &redis.url(), 6_000);
    short_leases(&mut c);
    c.tenant("hot").limits.rpm_burst = Some(100);
    let path = c.write(dir.path());
    let gws = start_fleet(&path, 3).await;
    let b = bases(&gws);
    // 200 requests a second throughout: twice the old rpm, four times the new.
    let every = Duration::from_millis(320);
    let _ = drive(
        b.clone(),
        HOT_KEY,
        64,
        every,
        Instant::now() + Duration::from_secs(4),
    )
    .await;
    c.tenant("hot").limits.rpm = Some(3_000);
    c.write_to(&path);
    // Every gateway has the new policy within a moment (its file watcher);
    // the old leases are spent out or fenced within ttl + one report.
    let _ = drive(
        b.clone(),
        HOT_KEY,
        64,
        every,
        Instant::now() + Duration::from_millis(2_000 + 500 + 500),
    )
    .await;
    let window = Instant::now();
    let seen = drive(
        b.clone(),
        HOT_KEY,
        64,
        every,
        window + Duration::from_secs(6),
    )
    .await;
    let secs = window.elapsed().as_secs_f64();
    let admitted = seen.ok.load(Ordering::Relaxed) as f64;
    let new_bound = bound(3_000, 100, secs);
    let old_rate = bound(6_000, 100, secs);
    println!("reload: {admitted} admitted in the {secs:.1} s after ttl + one report; new-rate bound {new_bound:.0}, the old rate would admit {old_rate:.0}");
    assert!(
        admitted <= new_bound,
        "admitted {admitted} above the new rate's bound {new_bound}"
    );
    assert!(
        admitted >= 0.8 * (new_bound - 100.0),
        "admitted {admitted}: far below the new rate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_under_load_loses_only_its_leases_until_they_expire() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = fleet_config(&mock.base_url(), &redis.url(), 6_000);
    short_leases(&mut c);
    let path = c.write(dir.path());
    let mut gws = start_fleet(&path, 3).await;
    let until = Instant::now() + Duration::from_secs(3);
    let _ = drive(bases(&gws), HOT_KEY, 48, Duration::from_millis(320), until).await;
    let view = leased_view(&gws[1], "hot").await;
    let leases = |v: &[serde_json::Value]| {
        v.iter()
            .map(|b| b["leased"]["leases"].as_u64().unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    assert_eq!(
        leases(&view),
        3,
        "every gateway holds a lease of each hot budget: {view:?}"
    );
    let dead = gws.remove(0);
    dead.kill().await;
    // The other two keep serving, from their own leases.
    let until = Instant::now() + Duration::from_secs(4);
    let seen = drive(bases(&gws), HOT_KEY, 32, Duration::from_millis(320), until).await;
    let ok = seen.ok.load(Ordering::Relaxed);
    println!(
        "kill -9: the two left answered {ok} (refused {}, other {})",
        seen.refused.load(Ordering::Relaxed),
        seen.other.load(Ordering::Relaxed)
    );
    assert!(ok > 200, "the fleet kept serving: {ok}");
    assert_eq!(seen.other.load(Ordering::Relaxed), 0);
    // After the dead gateway's lease expired, the store no longer counts it
    // as out: its unspent part was counted as spent (a bucket refills it).
    let view = leased_view(&gws[0], "hot").await;
    println!("kill -9: leased view after expiry {view:?}");
    assert!(
        leases(&view) <= 2,
        "the dead gateway's leases expired: {view:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unavailable_leased_budgets_admit_within_their_leases_and_exact_ones_fail_closed() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = fleet_config(&mock.base_url(), &redis.url(), 6_000);
    short_leases(&mut c);
    c.store.timeout_ms = Some(200);
    let path = c.write(dir.path());
    let gws = start_fleet(&path, 3).await;
    let b = bases(&gws);
    let _ = drive(
        b.clone(),
        HOT_KEY,
        48,
        Duration::from_millis(320),
        Instant::now() + Duration::from_secs(3),
    )
    .await;
    // What the fleet's leases of the hot rpm hold now: the most it may admit while Redis is away.
    let mut held = 0;
    for g in &gws {
        let view = leased_view(g, "hot").await;
        held += view
            .iter()
            .filter(|b| b["budget"] == "rpm")
            .map(|b| b["leased"]["here"].as_i64().unwrap_or(0).max(0))
            .sum::<i64>();
    }
    // Redis stops answering for 5 s (clients paused: nothing it holds is lost).
    let port = redis.port();
    // CLIENT PAUSE answers at once and holds every other client from then on.
    let paused = crate::support::redis_server::cli(port, &["CLIENT", "PAUSE", "5000", "ALL"]);
    assert_eq!(paused.trim(), "OK");
    let until = Instant::now() + Duration::from_millis(4_500);
    let (hot, cold) = tokio::join!(
        drive(b.clone(), HOT_KEY, 48, Duration::from_millis(320), until),
        drive(b.clone(), COLD_KEY, 2, Duration::from_millis(500), until),
    );
    let ok = hot.ok.load(Ordering::Relaxed) as i64;
    println!(
        "redis away 5 s: hot admitted {ok} (leases held {held} requests), other {}; cold: ok {}, other {}",
        hot.other.load(Ordering::Relaxed),
        cold.ok.load(Ordering::Relaxed),
        cold.other.load(Ordering::Relaxed)
    );
    assert!(ok > 0, "leased budgets keep admitting");
    // The leases a gateway holds, and what a top-up on the wire when Redis
    // stopped may have brought (one more lease per gateway at most).
    let one_lease = crate::lease_fleet::RPM_BURST / 4;
    assert!(
        ok <= held + 3 * one_lease as i64,
        "admitted {ok} beyond the leases {held}"
    );
    assert_eq!(
        cold.ok.load(Ordering::Relaxed),
        0,
        "an exact fail-closed tenant is refused while the store is away"
    );
    assert!(
        cold.other.load(Ordering::Relaxed) > 0,
        "503s for the exact tenant"
    );
}
