//! The scenarios, one file each; each returns one row per variant it ran
//! (`QUICK=1`: the first variant only).

pub mod agents;
pub mod burst;
pub mod dollars;
pub mod fail_open;
pub mod failover;
pub mod kill;
pub mod reload;
pub mod streams;

use super::client::Req;
use super::config::key_of;
use super::report::{failed, Row};
use super::Ctx;

/// Every scenario, in order, with what it shows.
pub const ALL: &[(&str, &str)] = &[
    ("burst", "a burst far over rpm and tpm"),
    (
        "streams",
        "200 long streams into a small tpm and a daily quota",
    ),
    ("dollars", "a dollar budget, 200 clients, three gateways"),
    ("failover", "a Redis failover mid-burst"),
    ("kill", "a gateway killed with SIGKILL mid-burst"),
    ("reload", "a limit lowered by reload mid-burst"),
    (
        "agents",
        "thinking turns, output_reservation = \"expected\"",
    ),
    ("fail_open", "fail_open during a store outage"),
];

pub async fn run(name: &str, ctx: &Ctx) -> Vec<Row> {
    let res = match name {
        "burst" => burst::run(ctx).await,
        "streams" => streams::run(ctx).await,
        "dollars" => dollars::run(ctx).await,
        "failover" => failover::run(ctx).await,
        "kill" => kill::run(ctx).await,
        "reload" => reload::run(ctx).await,
        "agents" => agents::run(ctx).await,
        "fail_open" => fail_open::run(ctx).await,
        _ => Ok(Vec::new()),
    };
    res.unwrap_or_else(|e| {
        vec![failed(
            ALL.iter().find(|(n, _)| *n == name).map_or("?", |(n, _)| n),
            "setup".into(),
            e,
        )]
    })
}

/// A chat request of `tenant` to the gateway at `addr`.
pub fn chat(addr: &str, tenant: &str, i: usize, max_tokens: u64, stream: bool) -> Req {
    let body = serde_json::json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": format!("accuracy request {i}")}],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    Req {
        addr: addr.to_string(),
        path: "/v1/chat/completions",
        headers: vec![
            ("authorization".into(), format!("Bearer {}", key_of(tenant))),
            ("x-mock-tenant".into(), tenant.to_string()),
        ],
        body: body.to_string(),
    }
}

/// `n` chat requests spread round-robin over `addrs`.
pub fn chats(addrs: &[String], tenant: &str, n: usize, max_tokens: u64, stream: bool) -> Vec<Req> {
    (0..n)
        .map(|i| chat(&addrs[i % addrs.len()], tenant, i, max_tokens, stream))
        .collect()
}

/// The contract of a bucket over `window_ms`: burst + rate × window, with
/// one millisecond more of refill (a millisecond accrued before the window
/// may be credited inside it: `tests/it/redis_fleet.rs`).
pub fn contract(burst: u64, per_minute: u64, window_ms: f64) -> f64 {
    burst as f64 + per_minute as f64 * (window_ms + 1.0) / 60_000.0
}

/// A statuses summary for the notes.
pub fn statuses(b: &super::client::Burst) -> String {
    format!(
        "client saw {} × 200, {} × 429, {} other, {} without an answer, {} cut off",
        b.count(200),
        b.count(429),
        b.other(),
        b.failed(),
        b.cut()
    )
}

/// Cross-checks the upstream's counters with the client: every answered
/// 200 must have reached the upstream (fewer: the counters missed some, and
/// the run is invalid); `exact` when no fault can leave a request counted
/// upstream but unanswered. The deployment's totals must match the
/// tenants' (one deployment, key `mock`).
pub fn cross_check(
    row: &mut Row,
    b: &super::client::Burst,
    c: &super::procs::Counters,
    tenant: &str,
    exact: bool,
) {
    let t = c.tenant(tenant);
    let answered = b.count(200) as u64;
    if t.requests == 0 {
        row.invalid.push("the upstream counted no request".into());
    } else if t.requests < answered || (exact && t.requests != answered) {
        row.invalid.push(format!(
            "the upstream counted {} requests, the client {answered} answers",
            t.requests
        ));
    }
    if b.count(429) == 0 && b.cut() == 0 {
        row.invalid
            .push("nothing was refused or cut off: the limits were never reached".into());
    }
    let all: u64 = c.tenants.values().map(|t| t.requests).sum();
    let dep: u64 = c.deployments.values().map(|t| t.requests).sum();
    if all != dep {
        row.invalid.push(format!(
            "tenants' requests {all} ≠ deployments' {dep} upstream"
        ));
    }
}
