//! A burst far over an rpm and a tpm limit: 900 requests at once (three
//! times the rpm, about three times the tpm) against one gateway or three
//! on one Redis, leases off and on (and one gateway on the memory store).
//! The *warm* variants send three waves of 30 requests (10 a gateway,
//! 100 ms apart) first, so that every gateway holds leases of both budgets
//! when the burst comes; their figures count the waves too.
//!
//! Bound (DESIGN section 2): over the burst's window `D` (first byte
//! written to last answer read), requests ≤ rpm + rpm/60 × D and reserved
//! tokens ≤ tpm + tpm/60 × D. With leases (section 14) the run starts cold
//! (no lease out; a warm variant's `D` starts at its first wave), so no
//! lease term: a lease is debited before it is spent.
//! Spent ≤ reserved: every answer is within its cap and the prompt's
//! estimate is ≥ its count (section 4), so the debt terms are zero. And a
//! floor: reserved ≥ 90 % of the tpm (what leases off admit is all of it;
//! section 14, "Leases that do not strand the limit").

use std::time::Duration;

use super::super::client::{burst, merged};
use super::super::config::{Lease, Setup, Store, Tenant, STORE_TIMEOUT_MS};
use super::super::procs::{Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, statuses};

const RPM: u64 = 300;
const TPM: u64 = 30_000;
const MAX_TOKENS: u64 = 100;
const REQUESTS: usize = 900;
const TENANT: &str = "burst";
/// At least this share of the tpm is admitted: the units leases hold are
/// not refused (leases off admit the whole tpm; the acceptance: 90 %).
const ADMITTED_AT_LEAST: f64 = 0.9;
/// The warm variants' waves: how many, of how many requests, how far apart.
const WARM_WAVES: usize = 3;
const WARM_WAVE: usize = 30;
const WARM_EVERY: Duration = Duration::from_millis(100);

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let variants: &[(&str, bool, usize, Lease, bool)] = &[
        ("3 gateways, Redis, leases on", true, 3, Lease::On, false),
        ("3 gateways, Redis, leases off", true, 3, Lease::Off, false),
        (
            "3 gateways, Redis, leases on, warm",
            true,
            3,
            Lease::On,
            true,
        ),
        (
            "3 gateways, Redis, leases off, warm",
            true,
            3,
            Lease::Off,
            true,
        ),
        ("1 gateway, Redis, leases on", true, 1, Lease::On, false),
        ("1 gateway, Redis, leases off", true, 1, Lease::Off, false),
        ("1 gateway, memory", false, 1, Lease::Off, false),
    ];
    let mut rows = Vec::new();
    for (i, (label, redis, n, lease, warm)) in variants.iter().enumerate() {
        if ctx.quick && i > 0 {
            break;
        }
        rows.push(variant(ctx, label, *redis, *n, *lease, *warm).await?);
    }
    Ok(rows)
}

async fn variant(
    ctx: &Ctx,
    label: &str,
    redis: bool,
    n: usize,
    lease: Lease,
    warm: bool,
) -> Result<Row, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    let server = if redis {
        Some(Redis::start(&[]).await?)
    } else {
        None
    };
    let store = match &server {
        Some(r) => Store::Redis {
            url: r.url(),
            prefix: "acc".into(),
            lease,
            fleet: n,
            timeout_ms: STORE_TIMEOUT_MS,
        },
        None => Store::Memory,
    };
    let mut setup = Setup::new(store, &mock.base_url());
    setup.tenants.push(Tenant::new(
        TENANT,
        &format!("{{ rpm = {RPM}, tpm = {TPM} }}"),
    ));
    let mut fleet = Fleet::start(ctx, &setup, n).await?;
    let mut bursts = Vec::new();
    if warm {
        for _ in 0..WARM_WAVES {
            let wave = chats(&fleet.addrs(), TENANT, WARM_WAVE, MAX_TOKENS, false);
            bursts.push(burst(&wave, Duration::from_secs(60)).await);
            tokio::time::sleep(WARM_EVERY).await;
        }
    }
    let reqs = chats(&fleet.addrs(), TENANT, REQUESTS, MAX_TOKENS, false);
    bursts.push(burst(&reqs, Duration::from_secs(120)).await);
    let b = merged(&bursts);
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let req_bound = contract(RPM, RPM, b.window_ms);
    let tok_bound = contract(TPM, TPM, b.window_ms);
    let mut row = Row::new(
        "burst",
        label.into(),
        Check::new("reserved", t.reserved(), tok_bound, "tok"),
        Check::new("spent", t.spent(), tok_bound, "tok"),
    );
    row.extra
        .push(Check::new("requests", t.requests, req_bound, "req"));
    // Not stranded: a limit the burst saturates is used, leases on or off
    // (DESIGN section 14, "Leases that do not strand the limit": at least
    // 90 % of what leases off admit, which is the whole tpm).
    row.extra.push(Check::at_least(
        "reserved, not stranded",
        t.reserved(),
        TPM as f64 * ADMITTED_AT_LEAST,
        "tok",
    ));
    row.bound = format!(
        "tpm {TPM} + {}/s × D, rpm {RPM} + {}/s × D (DESIGN §2); cold start{}, no lease term (§14); debt terms 0 (caps honoured, estimate ≥ count, §4); D = {:.0} ms",
        TPM / 60,
        RPM / 60,
        if warm {
            " (D from the first warm-up wave)"
        } else {
            ""
        },
        b.window_ms
    );
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, true);
    if b.other() + b.failed() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other() + b.failed()));
    }
    Ok(row)
}

/// Drives a peer gateway (`PEER_URL`, `PEER_KEY`) through the same burst,
/// its upstream the mock started here (`PEER_CONFIG_HOOK`, a shell command,
/// is run first with `MOCK_URL`, `TENANT`, `RPM`, `TPM` in its
/// environment, to point the peer at it). Printed, never asserted; nothing
/// is installed or downloaded.
pub async fn peer(ctx: &Ctx, url: &str) {
    let Ok(mock) = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await
    else {
        println!("peer: the mock did not start");
        return;
    };
    if let Ok(hook) = std::env::var("PEER_CONFIG_HOOK") {
        let status = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&hook)
            .env("MOCK_URL", mock.base_url())
            .env("TENANT", TENANT)
            .env("RPM", RPM.to_string())
            .env("TPM", TPM.to_string())
            .status()
            .await;
        println!("peer: config hook {hook:?}: {status:?}");
    }
    let key = std::env::var("PEER_KEY").unwrap_or_default();
    let rest = url.trim_start_matches("http://");
    let (addr, base) = rest.split_once('/').unwrap_or((rest, "v1"));
    let path = format!("/{}/chat/completions", base.trim_matches('/'));
    let mut reqs = chats(&[addr.to_string()], TENANT, REQUESTS, MAX_TOKENS, false);
    for r in &mut reqs {
        r.path = path.replace("//", "/");
        r.headers[0].1 = format!("Bearer {key}");
    }
    let b = burst(&reqs, Duration::from_secs(120)).await;
    let t = mock
        .counters()
        .await
        .map(|c| c.tenant(TENANT))
        .unwrap_or_default();
    println!(
        "peer {url}: {}; upstream counted {} requests (rpm bound {:.0}), {} reserved tokens and {} spent (tpm bound {:.0}); spread {:.1} ms, window {:.0} ms (printed, not asserted)",
        statuses(&b),
        t.requests,
        contract(RPM, RPM, b.window_ms),
        t.reserved(),
        t.spent(),
        contract(TPM, TPM, b.window_ms),
        b.spread_ms,
        b.window_ms
    );
}
