//! 200 concurrent long streams (100 tokens each, 40 ms apart: 4 s) into a
//! small tpm and a smaller daily quota: streams reserve in steps of 32
//! (`client_cap_reservation = "incremental"`) and are cut off when a step
//! is refused (DESIGN section 5). Memory store (one gateway) and Redis
//! (three gateways).
//!
//! Bound (a): what the upstream was admitted to produce — input plus the
//! output it sent, less [`PAST_CUT`] per cut-off stream — ≤
//! min(tokens_per_day, tpm + tpm/60 × D) (section 2: a quota does not
//! refill; a bucket's contract). (b) spent (input plus every token the
//! upstream sent: what a provider bills for an aborted stream) ≤ that
//! bound + [`PAST_CUT`] per cut-off stream + 0 estimate error. Tokens the
//! upstream sent that the gateway had not read yet when it cut (a gateway
//! reading behind, on an overloaded machine) have no bound in DESIGN: they
//! show as the gap between the upstream's count and the gateways' own.

use std::time::Duration;

use super::super::client::burst;
use super::super::config::{Lease, Setup, Store, Tenant, STORE_TIMEOUT_MS};
use super::super::procs::{metric_sum, Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, statuses};

const TPM: u64 = 20_000;
const QUOTA: u64 = 12_000;
const STREAMS: usize = 200;
const MAX_TOKENS: u64 = 100;
/// One token every TOKEN_DELAY_MS: 4 s streams.
const TOKEN_DELAY_MS: u64 = 40;
const TENANT: &str = "streams";
/// What a cut stream may cost upstream past what the gateway admitted, in
/// tokens (one per delta here): the delta that crosses the reservation
/// (DESIGN section 5) and the one the upstream writes before it learns of
/// the abort (a server sees a closed connection when it next writes).
const PAST_CUT: u64 = 2;

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
            &TOKEN_DELAY_MS.to_string(),
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
            timeout_ms: STORE_TIMEOUT_MS,
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
            "before the cuts (spent − 2 per cut stream)",
            t.spent().saturating_sub(PAST_CUT * t.streams_cut),
            bound,
            "tok",
        ),
        Check::new(
            "spent",
            t.spent(),
            bound + (PAST_CUT * t.streams_cut) as f64,
            "tok",
        ),
    );
    row.bound = format!(
        "min(tokens_per_day {QUOTA}, tpm {TPM} + {}/s × D) (DESIGN §2), D = {:.0} ms; (b) + 2 tokens × {} streams cut upstream (one delta past the reservation, §5; one the upstream writes before it sees the abort)",
        TPM / 60,
        b.window_ms,
        t.streams_cut
    );
    fleet.report(&mut row).await;
    let mut settled = 0.0;
    for g in &fleet.gws {
        if let Ok(text) = g.metrics().await {
            settled += metric_sum(
                &text,
                "budgetgate_settled_tokens_total",
                &[("tenant", TENANT)],
            );
        }
    }
    row.notes.push(format!(
        "the gateways settled {settled} tokens (their own count, not a figure here): the upstream sent {} tokens more, in flight when the streams were cut",
        t.spent() as f64 - settled
    ));
    row.set_burst(&b);
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
    let nominal_ms = (MAX_TOKENS * TOKEN_DELAY_MS) as f64;
    if b.window_ms > nominal_ms + 2000.0 {
        row.invalid.push(format!(
            "the gateways relayed the streams at less than the upstream's pace ({:.0} ms for {nominal_ms:.0} ms streams): an overloaded machine measures how far a gateway reads behind, not its limits",
            b.window_ms
        ));
    }
    if b.cut() == 0 {
        row.invalid
            .push("no stream was cut off: the budgets were not reached".into());
    }
    Ok(row)
}
