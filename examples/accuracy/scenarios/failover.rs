//! A Redis failover in the middle of a burst, leases on, three gateways.
//! One primary and one replica behind a local TCP proxy ([`Proxy`]), as a
//! cloud's failover endpoint: mid-run the primary is killed (SIGKILL: what
//! it had not replicated is lost), the proxy drops every connection, and
//! 500 ms later the replica is promoted (`REPLICAOF NO ONE`) and the proxy
//! re-pointed at it. The replication lag is measured during
//! the load (a key written to the primary, read back from the replica),
//! and the replication offsets at the cut give the bytes the failover lost.
//!
//! Bound (stated in docs/DESIGN.md, "Exact reservations across a Redis
//! failover"): the promoted replica misses what the primary acknowledged
//! in the last `lag` before the cut; at saturation (the bucket empty, as
//! here: most requests are refused before the cut) that is at most
//! rate × lag, so the fleet may admit rate × lag more than the contract
//! (section 2); a lost grant adds at most one lease per gateway (section
//! 14: `max_fraction` × capacity). Degraded decisions (fail_closed, 503)
//! while the store is unreachable are intended.

use std::time::{Duration, Instant};

use super::super::client::{merged, waves};
use super::super::config::{Lease, Setup, Store, Tenant, LEASE_MAX_FRACTION, STORE_TIMEOUT_MS};
use super::super::procs::{info_field, Mock, Redis};
use super::super::proxy::Proxy;
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, statuses};

const RPM: u64 = 300;
const TPM: u64 = 30_000;
const MAX_TOKENS: u64 = 50;
const WAVE: usize = 150;
const TENANT: &str = "failover";
const GATEWAYS: usize = 3;
/// From the primary's death to the replica's promotion.
const OUTAGE: Duration = Duration::from_millis(500);

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    let mut primary = Redis::start(&[]).await?;
    let replica = Redis::start(&["--replicaof", "127.0.0.1", &primary.port.to_string()]).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = replica.cmd(&["INFO", "replication"]).await?;
        if info_field(&info, "master_link_status").as_deref() == Some("up") {
            break;
        }
        if Instant::now() > deadline {
            return Err("the replica never synced".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let proxy = Proxy::start(primary.port).await?;
    let mut setup = Setup::new(
        Store::Redis {
            url: proxy.url(),
            prefix: "acc".into(),
            lease: Lease::On,
            fleet: GATEWAYS,
            timeout_ms: STORE_TIMEOUT_MS,
        },
        &mock.base_url(),
    );
    setup.tenants.push(Tenant::new(
        TENANT,
        &format!("{{ rpm = {RPM}, tpm = {TPM} }}"),
    ));
    let mut fleet = Fleet::start(ctx, &setup, GATEWAYS).await?;
    let run = Duration::from_secs(if ctx.quick { 3 } else { 5 });
    let cut_at = Duration::from_millis(1500);
    let addrs = fleet.addrs();
    let load = tokio::spawn(async move {
        waves(
            run,
            Duration::from_millis(100),
            |_| chats(&addrs, TENANT, WAVE, MAX_TOKENS, false),
            Duration::from_secs(60),
        )
        .await
    });
    let t0 = Instant::now();
    let lags = sample_lag(
        primary.port,
        replica.port,
        t0 + cut_at - Duration::from_millis(100),
    )
    .await;
    if let Some(rest) = (t0 + cut_at).checked_duration_since(Instant::now()) {
        tokio::time::sleep(rest).await;
    }
    // The primary dies (what it had not yet sent to the replica is lost),
    // the endpoint stops answering, and the replica is promoted after
    // OUTAGE (a failover's detection time).
    let p_off = info_field(
        &primary.cmd(&["INFO", "replication"]).await?,
        "master_repl_offset",
    )
    .and_then(|v| v.parse::<i64>().ok())
    .unwrap_or(0);
    primary.sigkill().await;
    proxy.cut();
    let r_off = info_field(
        &replica.cmd(&["INFO", "replication"]).await?,
        "slave_repl_offset",
    )
    .and_then(|v| v.parse::<i64>().ok())
    .unwrap_or(0);
    tokio::time::sleep(OUTAGE).await;
    replica.cmd(&["REPLICAOF", "NO", "ONE"]).await?;
    proxy.point(replica.port);
    let down_ms = (Instant::now() - (t0 + cut_at)).as_secs_f64() * 1e3;
    let bursts = load.await.map_err(|e| e.to_string())?;
    let b = merged(&bursts);
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let lag_ms = lags.iter().copied().fold(0.0, f64::max);
    let mut sorted = lags.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let lease_req = GATEWAYS as f64 * LEASE_MAX_FRACTION * RPM as f64;
    let lease_tok = GATEWAYS as f64 * LEASE_MAX_FRACTION * TPM as f64;
    let req_bound = contract(RPM, RPM, b.window_ms) + RPM as f64 * lag_ms / 60_000.0 + lease_req;
    let tok_bound = contract(TPM, TPM, b.window_ms) + TPM as f64 * lag_ms / 60_000.0 + lease_tok;
    let mut row = Row::new(
        "failover",
        "primary + replica behind a proxy, 3 gateways, leases on".into(),
        Check::new("requests", t.requests, req_bound, "req"),
        Check::new("spent", t.spent(), tok_bound, "tok"),
    );
    row.extra
        .push(Check::new("reserved", t.reserved(), tok_bound, "tok"));
    row.extra.push(Check::new(
        "requests without the lease term",
        t.requests,
        req_bound - lease_req,
        "req",
    ));
    row.bound = format!(
        "rpm {RPM} + {}/s × D + rate × lag ({:.3} ms: {:.3} req) + 3 leases × {LEASE_MAX_FRACTION} × {RPM} (§14, a lost grant); tpm likewise; D = {:.0} ms",
        RPM / 60,
        lag_ms,
        RPM as f64 * lag_ms / 60_000.0,
        b.window_ms
    );
    row.degraded_intended = true;
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, false);
    row.notes.push(format!(
        "replication lag over {} samples: median {median:.3} ms, max {lag_ms:.3} ms; the primary's offset read just before its SIGKILL {p_off}, the replica's after it {r_off} ({:+} bytes); store unreachable {down_ms:.0} ms (kill to re-point)",
        lags.len(),
        r_off - p_off
    ));
    if b.failed() > 0 {
        row.invalid
            .push(format!("{} requests without an answer", b.failed()));
    }
    Ok(vec![row])
}

/// Replication lag samples (ms) until `until`: a key written to the
/// primary, the time until the replica answers it (one connection to each,
/// kept open).
async fn sample_lag(primary: u16, replica: u16, until: Instant) -> Vec<f64> {
    let mut out = Vec::new();
    let (Ok(mut p), Ok(mut r)) = (connect(primary).await, connect(replica).await) else {
        return out;
    };
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg("accuracy:lag")
            .arg(n)
            .query_async(&mut p)
            .await;
        if set.is_err() {
            break;
        }
        let written = Instant::now();
        loop {
            let got: redis::RedisResult<Option<u64>> = redis::cmd("GET")
                .arg("accuracy:lag")
                .query_async(&mut r)
                .await;
            if got.is_ok_and(|v| v == Some(n)) {
                out.push(written.elapsed().as_secs_f64() * 1e3);
                break;
            }
            if written.elapsed() > Duration::from_secs(2) {
                out.push(2000.0);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

async fn connect(port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}
