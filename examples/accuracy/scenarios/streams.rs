//! 200 concurrent long streams (150 tokens each, 20 ms apart: 3 s) into a
//! small tpm and a smaller daily quota: streams reserve in steps of 32
//! (`client_cap_reservation = "incremental"`) and are cut off when a step
//! is refused (DESIGN section 5). Memory store (one gateway) and Redis
//! (three gateways).
//!
//! Bound (a): what the upstream was admitted to produce — input plus the
//! output it sent, less the one delta per cut-off stream that section 5
//! lets pass the reservation (one token here) — ≤ min(tokens_per_day,
//! tpm + tpm/60 × D) (section 2: a quota does not refill; a bucket's
//! contract). (b) spent (input plus every token the upstream sent: what a
//! provider bills for an aborted stream) ≤ that bound + one delta per
//! cut-off stream (section 5's tolerance) + 0 estimate error.

use std::time::Duration;

use super::super::client::burst;
use super::super::config::{Lease, Setup, Store, Tenant};
use super::super::procs::{Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, statuses};

const TPM: u64 = 20_000;
const QUOTA: u64 = 12_000;
const STREAMS: usize = 200;
const MAX_TOKENS: u64 = 150;
const TENANT: &str = "streams";

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let mut rows = vec![variant(ctx, "3 gateways, Redis", 3).await?];
    if !ctx.quick {
        rows.push(variant(ctx, "1 gateway, memory", 1).await?);
    }
    Ok(rows)
}

async fn variant(ctx: &Ctx, label: &str, n: usize) -> Result<Row, String> {
    let mock = Mock::start(
        &ctx.bins,
        &[
            "--output-tokens",
            &MAX_TOKENS.to_string(),
            "--token-delay-ms",
            "20",
        ],
    )
    .await?;
    let server = if n > 1 {
        Some(Redis::start(&[]).await?)
    } else {
        None
    };
    let store = match &server {
        Some(r) => Store::Redis {
            url: r.url(),
            prefix: "acc".into(),
            lease: Lease::Off,
            fleet: n,
            timeout_ms: 2000,
        },
        None => Store::Memory,
    };
    let mut setup = Setup::new(store, &mock.base_url());
    setup.step = 32;
    setup
        .chat_model
        .push("client_cap_reservation = \"incremental\"".into());
    setup.tenants.push(Tenant::new(
        TENANT,
        &format!("{{ tpm = {TPM}, tokens_per_day = {QUOTA} }}"),
    ));
    let mut fleet = Fleet::start(ctx, &setup, n).await?;
    let reqs = chats(&fleet.addrs(), TENANT, STREAMS, MAX_TOKENS, true);
    let b = burst(&reqs, Duration::from_secs(120)).await;
    // The last settlements land after the last answer is read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let bound = contract(TPM, TPM, b.window_ms).min(QUOTA as f64);
    let mut row = Row::new(
        "streams",
        label.into(),
        Check::new(
            "within reservations (spent − 1 per cut stream)",
            t.spent().saturating_sub(t.streams_cut),
            bound,
            "tok",
        ),
        Check::new("spent", t.spent(), bound + t.streams_cut as f64, "tok"),
    );
    row.bound = format!(
        "min(tokens_per_day {QUOTA}, tpm {TPM} + {}/s × D) (DESIGN §2), D = {:.0} ms; (b) + 1 delta × {} streams cut upstream (§5)",
        TPM / 60,
        b.window_ms,
        t.streams_cut
    );
    row.health = fleet.health().await;
    row.spread_ms = b.spread_ms;
    row.window_ms = b.window_ms;
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, true);
    row.notes.push(format!(
        "upstream: {} streams, {} cut off, {} input + {} output tokens",
        t.streams, t.streams_cut, t.input_tokens, t.output_tokens
    ));
    if b.other() + b.failed() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other() + b.failed()));
    }
    if b.cut() == 0 {
        row.invalid
            .push("no stream was cut off: the budgets were not reached".into());
    }
    Ok(row)
}
