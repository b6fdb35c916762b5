//! A gateway killed with SIGKILL in the middle of a burst, leases on,
//! three gateways on one Redis: its leases, holds and in-flight requests
//! are lost; the clients go on with the other two.
//!
//! Bound (DESIGN section 14, "With faults"): a killed gateway's lease is
//! assumed spent by the store until its record expires (under-admission,
//! never over), so the run keeps the contract of section 2 from its cold
//! start: requests ≤ rpm + rpm/60 × D, reserved tokens ≤ tpm + tpm/60 × D.
//! Spent ≤ reserved (caps honoured, estimate ≥ count).

use std::time::{Duration, Instant};

use super::super::client::{merged, waves};
use super::super::config::{Lease, Setup, Store, Tenant, STORE_TIMEOUT_MS};
use super::super::procs::{Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, statuses};

const RPM: u64 = 300;
const TPM: u64 = 30_000;
const MAX_TOKENS: u64 = 50;
const WAVE: usize = 150;
const TENANT: &str = "kill";

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    let redis = Redis::start(&[]).await?;
    let mut setup = Setup::new(
        Store::Redis {
            url: redis.url(),
            prefix: "acc".into(),
            lease: Lease::On,
            fleet: 3,
            timeout_ms: STORE_TIMEOUT_MS,
        },
        &mock.base_url(),
    );
    setup.tenants.push(Tenant::new(
        TENANT,
        &format!("{{ rpm = {RPM}, tpm = {TPM} }}"),
    ));
    let mut fleet = Fleet::start(ctx, &setup, 3).await?;
    let run = Duration::from_secs(if ctx.quick { 3 } else { 5 });
    let kill_at = Duration::from_millis(1500);
    let all = fleet.addrs();
    let survivors: Vec<String> = all[..2].to_vec();
    let t0 = Instant::now();
    let load = tokio::spawn(async move {
        waves(
            run,
            Duration::from_millis(100),
            move |_| {
                // The killed gateway's clients move to the others once it is gone.
                let addrs = if t0.elapsed() < kill_at + Duration::from_millis(200) {
                    &all
                } else {
                    &survivors
                };
                chats(addrs, TENANT, WAVE, MAX_TOKENS, false)
            },
            Duration::from_secs(60),
        )
        .await
    });
    tokio::time::sleep(kill_at).await;
    let _ = fleet.health().await;
    fleet.gws[2].sigkill().await;
    let bursts = load.await.map_err(|e| e.to_string())?;
    let b = merged(&bursts);
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let req_bound = contract(RPM, RPM, b.window_ms);
    let tok_bound = contract(TPM, TPM, b.window_ms);
    let mut row = Row::new(
        "kill",
        "SIGKILL 1 of 3 gateways, Redis, leases on".into(),
        Check::new("requests", t.requests, req_bound, "req"),
        Check::new("spent", t.spent(), tok_bound, "tok"),
    );
    row.extra
        .push(Check::new("reserved", t.reserved(), tok_bound, "tok"));
    row.bound = format!(
        "rpm {RPM} + {}/s × D, tpm {TPM} + {}/s × D (DESIGN §2; §14: a killed gateway's lease counts as spent); D = {:.0} ms",
        RPM / 60,
        TPM / 60,
        b.window_ms
    );
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, false);
    row.notes
        .push("requests without an answer: those in flight at the killed gateway".into());
    if b.other() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other()));
    }
    Ok(vec![row])
}
