//! A dollar budget with 200 clients across three gateways on one Redis
//! (leases on: a quota near its end is never leased, DESIGN section 14):
//! two bursts of 200 requests, each from 200 connections, against
//! `usd_per_day = "0.05"`. Prices are whole µ$ per token (input 1, output
//! 4), so the upstream's counts give the cost exactly.
//!
//! Bound (section 12, 2): a quota does not refill: the cost the upstream
//! was asked for (input + 4 × each cap) ≤ 50,000 µ$; (b) the cost of what
//! it produced ≤ the same (caps honoured, estimate ≥ count: no debt).

use std::time::Duration;

use super::super::client::{burst, merged};
use super::super::config::{Lease, Setup, Store, Tenant, STORE_TIMEOUT_MS};
use super::super::procs::{Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, cross_check, statuses};

const BUDGET_MICRO_USD: u64 = 50_000;
const IN_PRICE: u64 = 1;
const OUT_PRICE: u64 = 4;
const CLIENTS: usize = 200;
const MAX_TOKENS: u64 = 50;
const TENANT: &str = "dollars";

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
    setup.chat_model.push(format!(
        "price = {{ input = \"{IN_PRICE}.00\", output = \"{OUT_PRICE}.00\" }}"
    ));
    setup.tenants.push(Tenant::new(
        TENANT,
        &format!(
            "{{ usd_per_day = \"{}.{:02}\" }}",
            BUDGET_MICRO_USD / 1_000_000,
            BUDGET_MICRO_USD / 10_000 % 100
        ),
    ));
    let mut fleet = Fleet::start(ctx, &setup, 3).await?;
    let mut bursts = Vec::new();
    for _ in 0..2 {
        let reqs = chats(&fleet.addrs(), TENANT, CLIENTS, MAX_TOKENS, false);
        bursts.push(burst(&reqs, Duration::from_secs(120)).await);
    }
    let b = merged(&bursts);
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let asked = t.input_tokens * IN_PRICE + t.cap_tokens * OUT_PRICE;
    let spent = t.input_tokens * IN_PRICE + t.output_tokens * OUT_PRICE;
    let mut row = Row::new(
        "dollars",
        "3 gateways, Redis, 200 clients".into(),
        Check::new("reserved", asked, BUDGET_MICRO_USD as f64, "µ$"),
        Check::new("spent", spent, BUDGET_MICRO_USD as f64, "µ$"),
    );
    row.bound = format!(
        "usd_per_day {BUDGET_MICRO_USD} µ$ (DESIGN §2 quota, §12), no refill, no lease near the end (§14); debt 0"
    );
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, true);
    row.notes.push(format!(
        "upstream: {} requests; the budget's last {} µ$ unspent",
        t.requests,
        BUDGET_MICRO_USD.saturating_sub(asked)
    ));
    if b.other() + b.failed() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other() + b.failed()));
    }
    if b.count(429) == 0 {
        row.invalid.push("the budget was never reached".into());
    }
    Ok(vec![row])
}
