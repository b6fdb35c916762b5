//! `fail_open` during a store outage: three gateways on one Redis, the
//! tenant `on_store_error = "fail_open"`, `fallback_share = 0.5`; Redis is
//! killed (SIGKILL) mid-run and stays down. This scenario alone runs with a
//! short store timeout (200 ms) and expects degraded decisions.
//!
//! Bound (DESIGN section 7; docs/OPERATIONS.md, "Failure policy"): while
//! the store is down each gateway's local limiter holds `fallback_share` of
//! each budget, so the fleet admits at most gateways × share × (burst +
//! rate × D_out) — the documented multiplier, 3 × 0.5 = 1.5 — on top of
//! the store's contract for the run (burst + rate × D).

use std::time::{Duration, Instant};

use super::super::client::{merged, waves};
use super::super::config::{Lease, Setup, Store, Tenant};
use super::super::procs::{Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, statuses};

const RPM: u64 = 120;
const TPM: u64 = 12_000;
const SHARE: f64 = 0.5;
const GATEWAYS: usize = 3;
const MAX_TOKENS: u64 = 50;
const WAVE: usize = 60;
const TENANT: &str = "open";

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    let mut redis = Redis::start(&[]).await?;
    let mut setup = Setup::new(
        Store::Redis {
            url: redis.url(),
            prefix: "acc".into(),
            lease: Lease::Off,
            fleet: GATEWAYS,
            timeout_ms: 200,
        },
        &mock.base_url(),
    );
    setup.fallback_share = Some(SHARE);
    setup.tenants.push(
        Tenant::new(TENANT, &format!("{{ rpm = {RPM}, tpm = {TPM} }}"))
            .with("on_store_error = \"fail_open\""),
    );
    let mut fleet = Fleet::start(ctx, &setup, GATEWAYS).await?;
    let run = Duration::from_secs(if ctx.quick { 3 } else { 5 });
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
    tokio::time::sleep(Duration::from_millis(1000)).await;
    redis.sigkill().await;
    let down = Instant::now();
    let bursts = load.await.map_err(|e| e.to_string())?;
    let b = merged(&bursts);
    let end = b
        .started
        .map(|s| s + Duration::from_secs_f64(b.window_ms / 1e3))
        .unwrap_or(down);
    let out_ms = end.saturating_duration_since(down).as_secs_f64() * 1e3;
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let mult = GATEWAYS as f64 * SHARE;
    let req_bound = contract(RPM, RPM, b.window_ms) + mult * contract(RPM, RPM, out_ms);
    let tok_bound = contract(TPM, TPM, b.window_ms) + mult * contract(TPM, TPM, out_ms);
    let mut row = Row::new(
        "fail_open",
        "Redis killed, 3 gateways, fallback_share 0.5".into(),
        Check::new("requests", t.requests, req_bound, "req"),
        Check::new("spent", t.spent(), tok_bound, "tok"),
    );
    row.extra
        .push(Check::new("reserved", t.reserved(), tok_bound, "tok"));
    row.bound = format!(
        "contract rpm {RPM} + {}/s × D (D = {:.0} ms) + {GATEWAYS} × {SHARE} × (rpm {RPM} + {}/s × D_out) (D_out = {out_ms:.0} ms; DESIGN §7, the fail_open multiplier {mult}); tpm likewise",
        RPM / 60,
        b.window_ms,
        RPM / 60
    );
    row.degraded_intended = true;
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, true);
    if b.other() + b.failed() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other() + b.failed()));
    }
    if row.health.degraded == 0 {
        row.invalid
            .push("no degraded decision: the outage was not reached".into());
    }
    Ok(vec![row])
}
