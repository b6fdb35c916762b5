//! Agent turns with thinking on and `output_reservation = "expected"` into
//! a small daily quota, one gateway (memory) and three (Redis). Each
//! gateway first answers 20 turns one at a time (its window of settled
//! outputs: the expected reservation is their p90 from then on); then
//! waves of 12 turns at once, largest first, until the quota refuses a
//! whole wave. Output sizes: the committed agent
//! turns (`tests/fixtures/agent_turns/output_sizes.txt`) and Claude
//! Code's cap (64,000), both divided by 10 to keep the run short; thinking
//! streamed. `max_exposure` (20 % of the quota) must pass cap − expected
//! for a turn to reserve less than its cap at all (docs/AGENTS.md).
//!
//! Bound (DESIGN section 15, "Exposure and the bound"; docs/AGENTS.md):
//! what the quota admitted beyond its capacity is at most
//! `fleet_size × max_exposure`, so spent ≤ tokens_per_day + gateways ×
//! max_exposure; (b) adds the estimate error (0: the input estimate is ≥
//! the upstream's count with `token_ratio = 1000`).

use std::time::Duration;

use super::super::client::{burst, merged, Req};
use super::super::config::{key_of, Lease, Setup, Store, Tenant, STORE_TIMEOUT_MS};
use super::super::procs::{Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{cross_check, statuses};

const QUOTA: u64 = 80_000;
const MAX_EXPOSURE: u64 = 16_000;
const CAP: u64 = 6_400;
/// Turns per wave (four per gateway of three).
const WAVE: usize = 12;
const MAX_WAVES: usize = 40;
const TENANT: &str = "agents";

fn sizes() -> Result<Vec<u64>, String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/agent_turns/output_sizes.txt"
    );
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .map(|n| (n / 10).max(2))
        .collect())
}

fn turn(addr: &str, output: u64) -> Req {
    let body = serde_json::json!({
        "model": "claude-test", "max_tokens": CAP, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 32_000},
        "messages": [{"role": "user", "content": "hi"}],
    });
    Req {
        addr: addr.to_string(),
        path: "/v1/messages".into(),
        headers: vec![
            ("x-api-key".into(), key_of(TENANT)),
            ("anthropic-version".into(), "2023-06-01".into()),
            ("x-mock-tenant".into(), TENANT.into()),
            (
                "x-mock-messages".into(),
                format!("thinking={}", output.saturating_sub(1)),
            ),
        ],
        body: body.to_string(),
    }
}

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let mut rows = vec![variant(ctx, 3).await?];
    if !ctx.quick {
        rows.push(variant(ctx, 1).await?);
    }
    Ok(rows)
}

async fn variant(ctx: &Ctx, n: usize) -> Result<Row, String> {
    let sizes = sizes()?;
    let mock = Mock::start(&ctx.bins, &["--output-tokens", "1"]).await?;
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
    setup.extra_tables.push(format!(
        "[[upstreams]]\nname = \"claude0\"\nkind = \"anthropic\"\nbase_url = \"{}\"\napi_key_env = \"{}\"\nforward_client_headers = [\"x-mock-messages\", \"x-mock-tenant\"]\nlimits = {{ output_tpm = 10000000, output_tpm_burst = 10000000 }}",
        mock.root_url(),
        super::super::procs::DEPLOYMENT_KEY_ENV
    ));
    setup.extra_tables.push(format!(
        "[[models]]\nname = \"claude-test\"\nupstreams = [\"claude0\"]\nencoding = \"o200k_base\"\ndefault_max_output_tokens = 4096\nmax_output_tokens = {CAP}\ntoken_ratio = 1000"
    ));
    setup.tenants.push(
        Tenant::new(TENANT, &format!("{{ tokens_per_day = {QUOTA} }}"))
            .with("output_reservation = \"expected\"")
            .with(&format!("max_exposure = {MAX_EXPOSURE}")),
    );
    let mut fleet = Fleet::start(ctx, &setup, n).await?;
    let addrs = fleet.addrs();
    let mut bursts = Vec::new();
    for &k in &sizes[..20] {
        let reqs: Vec<Req> = addrs.iter().map(|a| turn(a, k)).collect();
        bursts.push(burst(&reqs, Duration::from_secs(60)).await);
    }
    let warm = merged(&bursts);
    let mut big: Vec<u64> = sizes[20..].to_vec();
    big.sort_unstable_by(|a, b| b.cmp(a));
    // Waves of turns, largest first, until the quota refuses a whole wave.
    let mut waves = Vec::new();
    for w in 0..MAX_WAVES {
        let reqs: Vec<Req> = (0..WAVE)
            .map(|i| turn(&addrs[i % addrs.len()], big[(w * WAVE + i) % big.len()]))
            .collect();
        let b = burst(&reqs, Duration::from_secs(120)).await;
        let done = b.count(200) == 0;
        waves.push(b);
        if done {
            break;
        }
    }
    let b = merged(&waves);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = mock.counters().await?;
    let t = c.tenant(TENANT);
    let bound = QUOTA as f64 + n as f64 * MAX_EXPOSURE as f64;
    let mut row = Row::new(
        "agents",
        format!(
            "{n} gateway{}, {}",
            if n > 1 { "s" } else { "" },
            if n > 1 { "Redis" } else { "memory" }
        ),
        Check::new("admitted", t.spent(), bound, "tok"),
        Check::new("spent", t.spent(), bound, "tok"),
    );
    row.bound = format!(
        "tokens_per_day {QUOTA} + {n} × max_exposure {MAX_EXPOSURE} (DESIGN §15 exposure bound); estimate error 0"
    );
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(format!("warm-up: {}", statuses(&warm)));
    row.notes
        .push(format!("{} waves: {}", waves.len(), statuses(&b)));
    cross_check(
        &mut row,
        &merged(&[warm.clone(), b.clone()]),
        &c,
        TENANT,
        true,
    );
    row.notes.push(format!(
        "upstream: {} turns, {} input + {} output tokens; in cap mode the quota alone would bound them",
        t.requests, t.input_tokens, t.output_tokens
    ));
    let unexpected = warm.other() + warm.failed() + b.other() + b.failed();
    if unexpected > 0 {
        row.invalid.push(format!("{unexpected} unexpected answers"));
    }
    if t.spent() < QUOTA * 9 / 10 {
        row.invalid
            .push("less than 90 % of the quota spent: the quota was never reached".into());
    }
    Ok(row)
}
