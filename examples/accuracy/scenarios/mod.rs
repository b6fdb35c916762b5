//! The scenarios, one file each; each returns one row per variant it ran
//! (`QUICK=1`: the first variant only).

pub mod agents;
pub mod burst;
pub mod dollars;
pub mod fail_open;
pub mod failover;
pub mod kill;
pub mod reload;
pub mod shards;
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
    (
        "shards",
        "tenant domains on a 3-primary Redis Cluster, one primary failed over mid-load",
    ),
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
        "shards" => shards::run(ctx).await,
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
        path: "/v1/chat/completions".into(),
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

/// Counts `reqs` upstream under `label` instead of their tenant's name.
pub fn relabel(mut reqs: Vec<Req>, label: &str) -> Vec<Req> {
    for r in &mut reqs {
        for h in &mut r.headers {
            if h.0 == "x-mock-tenant" {
                h.1 = label.to_string();
            }
        }
    }
    reqs
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Burst, Outcome};
    use crate::procs::{Counters, Tally};
    use crate::report::Check;

    #[test]
    fn the_contract_counts_one_millisecond_more_of_refill() {
        assert_eq!(contract(300, 300, 0.0), 300.0 + 300.0 / 60_000.0);
        assert_eq!(contract(300, 600, 999.0), 300.0 + 10.0);
    }

    fn burst(ok: usize, refused: usize) -> Burst {
        let mut outcomes = vec![
            Outcome::Status {
                code: 200,
                cut: false
            };
            ok
        ];
        outcomes.extend(vec![
            Outcome::Status {
                code: 429,
                cut: false
            };
            refused
        ]);
        Burst {
            outcomes,
            ..Burst::default()
        }
    }

    fn counters(requests: u64, deployment: u64) -> Counters {
        let mut c = Counters::default();
        c.tenants.insert(
            "t".into(),
            Tally {
                requests,
                ..Tally::default()
            },
        );
        c.deployments.insert(
            "mock".into(),
            Tally {
                requests: deployment,
                ..Tally::default()
            },
        );
        c
    }

    fn checked(b: &Burst, c: &Counters, exact: bool) -> Vec<String> {
        let mut r = Row::new(
            "t",
            "v".into(),
            Check::new("a", 0, 0.0, ""),
            Check::new("b", 0, 0.0, ""),
        );
        cross_check(&mut r, b, c, "t", exact);
        r.invalid
    }

    #[test]
    fn a_run_the_upstream_did_not_fully_see_or_that_never_reached_its_limits_is_invalid() {
        assert!(checked(&burst(5, 3), &counters(5, 5), true).is_empty());
        assert_eq!(checked(&burst(5, 3), &counters(4, 4), false).len(), 1);
        assert_eq!(checked(&burst(5, 3), &counters(6, 6), true).len(), 1);
        assert!(checked(&burst(5, 3), &counters(6, 6), false).is_empty());
        assert_eq!(checked(&burst(5, 0), &counters(5, 5), true).len(), 1);
        assert_eq!(checked(&burst(5, 3), &counters(5, 4), true).len(), 1);
        assert_eq!(checked(&burst(0, 3), &counters(0, 0), true).len(), 1);
    }
}
