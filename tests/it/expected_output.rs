//! `output_reservation = "expected"`: thinking turns
//! reserve, on the tenant's budgets, the p90 of the (model, tenant)'s
//! settled outputs once 20 are known, within a per-budget exposure past
//! which a turn reserves its whole cap; deployment budgets reserve the
//! whole cap in both modes; `"cap"` is unchanged; 50 concurrent turns of
//! the committed output sizes, largest first, never spend past the quota
//! plus `max_exposure`.

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::output_reservation::RawMaxExposure;
use serde_json::json;

use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// The cap every turn sends (Claude Code's default `max_tokens`).
const CAP: u64 = 64_000;

/// The committed output sizes (`scripts/output_sizes.py`), in order.
fn output_sizes() -> Vec<u64> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/agent_turns/output_sizes.txt"
    );
    std::fs::read_to_string(path)
        .expect("output sizes")
        .lines()
        .map(|l| l.trim().parse().expect("a size"))
        .collect()
}

/// `claude-test` on one Anthropic deployment (`output_tpm` large enough
/// for every test), tenant `t1` with `tokens_per_day = quota` in `mode`.
fn config(mock: &MockUpstream, quota: u64, mode: Option<&str>) -> TestConfig {
    let mut c = TestConfig::new();
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-messages".into()],
        limits: limits().output_tpm(10_000_000).output_tpm_burst(10_000_000),
        ..config::upstream("claude0", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(4096),
        max_output_tokens: Some(CAP as i64),
        token_ratio: Some(1000),
        ..config::model("claude-test", &["claude0"])
    });
    let mut t = config::tenant("t1", "k1", KEY, limits().tokens_per_day(quota));
    t.output_reservation = mode.map(str::to_string);
    c.tenants.push(t);
    c
}

/// A thinking turn whose answer is `output` tokens (thinking and text).
async fn turn(gw: &Gateway, output: u64) -> reqwest::Response {
    let body = json!({
        "model": "claude-test", "max_tokens": CAP, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 32_000},
        "messages": [{"role": "user", "content": "hi"}],
    });
    reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header(
            "x-mock-messages",
            format!("input=100,thinking={}", output.saturating_sub(1)),
        )
        .json(&body)
        .send()
        .await
        .expect("POST /v1/messages")
}

/// Runs `n` turns of `output` tokens each, one after the other.
async fn answered(gw: &Gateway, n: usize, output: u64) {
    for _ in 0..n {
        let r = turn(gw, output).await;
        assert_eq!(r.status(), 200);
        let _ = r.text().await;
    }
    gw.all_settled().await;
}

/// What budget `name` of `scope` holds while one more turn waits upstream.
async fn held_by_one_turn(
    gw: &Gateway,
    mock: &MockUpstream,
    scope: Scope,
    name: BudgetName,
) -> u64 {
    let before = gw.used(scope.clone(), name).await;
    mock.state.hold();
    let pending = tokio::spawn({
        let url = gw.base_url();
        async move { post_turn(&url, 1500).await }
    });
    wait_held(mock, 1).await;
    let during = gw.used(scope, name).await;
    mock.state.release();
    let r = pending.await.expect("turn task");
    assert_eq!(r.0, 200);
    gw.all_settled().await;
    during - before
}

/// [`turn`] by URL (spawned tasks): status and body.
async fn post_turn(base_url: &str, output: u64) -> (u16, String) {
    let body = json!({
        "model": "claude-test", "max_tokens": CAP, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 32_000},
        "messages": [{"role": "user", "content": "hi"}],
    });
    let r = reqwest::Client::new()
        .post(format!("{base_url}/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header(
            "x-mock-messages",
            format!("input=100,thinking={}", output.saturating_sub(1)),
        )
        .json(&body)
        .send()
        .await
        .expect("POST /v1/messages");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

async fn wait_held(mock: &MockUpstream, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while mock.state.held_count() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} turns never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

fn t1() -> Scope {
    Scope::Tenant("t1".into())
}

fn deployment() -> Scope {
    Scope::Upstream("claude0".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_mode_reserves_the_default_then_near_the_p90_after_twenty_answers() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(1);
    let gw = config(&mock, 10_000_000, Some("expected")).start().await;
    let first = held_by_one_turn(&gw, &mock, t1(), BudgetName::TokensPerDay).await;
    assert!(
        (4096..4096 + 100).contains(&first),
        "until 20 answers are known: the model's default output, held {first}"
    );
    // 1 answer already; 19 more of 1,500 make 20 known.
    answered(&gw, 19, 1500).await;
    let held = held_by_one_turn(&gw, &mock, t1(), BudgetName::TokensPerDay).await;
    assert!(
        (1500..1600).contains(&held),
        "the p90 of 20 answers of 1,500 (and the input estimate), not the cap: held {held}"
    );
    assert_eq!(
        held_by_one_turn(&gw, &mock, deployment(), BudgetName::OutputTpm).await,
        CAP,
        "the deployment's output_tpm reserves the whole max_tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenants_window_is_forgotten_and_a_tenant_of_its_name_starts_afresh() {
    use budgetgate::config::reload::{ReloadOutcome, Trigger};
    let mock = start_mock().await;
    mock.state.set_output_tokens(1);
    let dir = tempfile::tempdir().unwrap();
    let mut with_t1 = config(&mock, 10_000_000, Some("expected"));
    with_t1.control.database_url = Some(format!("sqlite://{}", dir.path().join("c.db").display()));
    let gw = with_t1.start().await;
    answered(&gw, 20, 1500).await;
    let held = held_by_one_turn(&gw, &mock, t1(), BudgetName::TokensPerDay).await;
    assert!((1500..1600).contains(&held), "learned: held {held}");

    // A reload deletes `t1`, another brings a tenant of that name back.
    let control = gw.state.control.get().expect("control plane").clone();
    let mut without = with_t1.clone();
    without.tenants.clear();
    for cfg in [&without, &with_t1] {
        cfg.write_to(&gw.config_path);
        let outcome = control.reload_file(Trigger::Signal);
        assert!(
            matches!(outcome, ReloadOutcome::Applied { .. }),
            "{outcome:?}"
        );
    }
    let first = held_by_one_turn(&gw, &mock, t1(), BudgetName::TokensPerDay).await;
    assert!(
        (4096..4096 + 100).contains(&first),
        "the new t1 knows no answer yet: the model's default output, held {first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cap_mode_is_unchanged_and_the_deployment_reserves_the_whole_cap() {
    for mode in [None, Some("cap")] {
        let mock = start_mock().await;
        mock.state.set_output_tokens(1);
        let gw = config(&mock, 10_000_000, mode).start().await;
        answered(&gw, 25, 1500).await;
        let held = held_by_one_turn(&gw, &mock, t1(), BudgetName::TokensPerDay).await;
        assert!(
            (CAP..CAP + 100).contains(&held),
            "{mode:?}: the whole cap, held {held}"
        );
        assert_eq!(
            held_by_one_turn(&gw, &mock, deployment(), BudgetName::OutputTpm).await,
            CAP
        );
        // Settled at what the answers used, in either mode.
        assert_eq!(
            gw.used(t1(), BudgetName::TokensPerDay).await,
            27 * (100 + 1500)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_exposure_a_turn_reserves_its_whole_cap_and_the_exposure_comes_back() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(1);
    let mut c = config(&mock, 10_000_000, Some("expected"));
    // One turn's exposure (64,000 − 1,500) fits, two do not.
    c.tenant("t1").max_exposure = Some(RawMaxExposure::Tokens(100_000));
    let gw = c.start().await;
    answered(&gw, 20, 1500).await;
    let before = gw.used(t1(), BudgetName::TokensPerDay).await;
    mock.state.hold();
    let url = gw.base_url();
    let a = tokio::spawn({
        let url = url.clone();
        async move { post_turn(&url, 1500).await }
    });
    wait_held(&mock, 1).await;
    let one = gw.used(t1(), BudgetName::TokensPerDay).await - before;
    let b = tokio::spawn(async move { post_turn(&url, 1500).await });
    wait_held(&mock, 2).await;
    let two = gw.used(t1(), BudgetName::TokensPerDay).await - before;
    assert!(one < 1600, "the first within max_exposure: {one}");
    assert!(
        two - one >= CAP,
        "the second would pass max_exposure: its whole cap ({})",
        two - one
    );
    mock.state.release();
    assert_eq!(a.await.unwrap().0, 200);
    assert_eq!(b.await.unwrap().0, 200);
    gw.all_settled().await;
    assert_eq!(
        gw.state.expected.exposure.in_use(&gw.budgets(t1())[0].key),
        0
    );
    // Given back: the next turn is lowered again.
    let again = held_by_one_turn(&gw, &mock, t1(), BudgetName::TokensPerDay).await;
    assert!(again < 1600, "exposure released at settlement: {again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_above_the_reservation_settles_as_debt_in_full() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(1);
    let gw = config(&mock, 10_000_000, Some("expected")).start().await;
    answered(&gw, 20, 1500).await;
    let before = gw.used(t1(), BudgetName::TokensPerDay).await;
    answered(&gw, 1, 30_000).await;
    assert_eq!(
        gw.used(t1(), BudgetName::TokensPerDay).await - before,
        100 + 30_000,
        "charged what it used, far above its 1,500 reserved"
    );
    // The metric registry is the test process's: other tests' t1 count too.
    let scrape = scrape(&gw).await;
    assert!(
        sample_sum(
            &scrape,
            "budgetgate_output_past_reservation_total",
            &[("tenant", "t1")]
        ) >= 1.0
    );
    assert!(
        sample_sum(
            &scrape,
            "budgetgate_output_debt_tokens_total",
            &[("tenant", "t1")]
        ) >= 28_500.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_thinking_turns_never_spend_past_the_quota_plus_max_exposure() {
    const QUOTA: u64 = 2_000_000;
    const MAX_EXPOSURE: u64 = QUOTA / 10;
    let mut sizes = output_sizes();
    let known: Vec<u64> = sizes[..20].to_vec();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    for mode in ["expected", "cap"] {
        let mock = start_mock().await;
        mock.state.set_output_tokens(1);
        let gw = config(&mock, QUOTA, Some(mode)).start().await;
        for &k in &known {
            answered(&gw, 1, k).await;
        }
        mock.state.hold();
        let mut turns = Vec::new();
        for &out in &sizes[..50] {
            let url = gw.base_url();
            turns.push(tokio::spawn(async move { post_turn(&url, out).await }));
            // Largest first: each turn is in flight (or refused) before the next.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while turns.iter().filter(|t| t.is_finished()).count() + mock.state.held_count() < 50 {
            assert!(
                std::time::Instant::now() < deadline,
                "turns neither admitted nor refused"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let admitted = mock.state.held_count();
        let held = gw.used(t1(), BudgetName::TokensPerDay).await;
        assert!(
            held <= QUOTA,
            "{mode}: reservations within the quota: {held}"
        );
        mock.state.release();
        let mut ok = 0;
        for t in turns {
            let (status, _) = t.await.unwrap();
            assert!(status == 200 || status == 429, "{mode}: {status}");
            ok += usize::from(status == 200);
        }
        gw.all_settled().await;
        let spent = gw.used(t1(), BudgetName::TokensPerDay).await;
        println!("{mode}: {ok} of 50 admitted ({admitted} in flight at once), spent {spent}");
        assert_eq!(ok, admitted);
        assert!(
            spent <= QUOTA + MAX_EXPOSURE,
            "{mode}: spent {spent} > quota + max_exposure"
        );
        if mode == "cap" {
            assert!(spent <= QUOTA, "cap mode never over-admits: {spent}");
        } else {
            assert!(ok > 0, "expected mode admits turns");
        }
    }
}

/// The two agent shapes the benchmark replays.
#[derive(Clone, Copy, PartialEq)]
enum Cli {
    /// Claude Code: Messages, thinking, the body's `max_tokens` (64,000
    /// from 2.1.197, 128,000 from 2.1.332).
    ClaudeCode { cap: u64 },
    /// Codex: Responses, a `reasoning = true` model, no cap sent (the
    /// entry's 16,000), ~13k input.
    Codex,
}

impl Cli {
    fn name(self) -> &'static str {
        match self {
            Cli::ClaudeCode { .. } => "claude-code",
            Cli::Codex => "codex",
        }
    }

    /// The output cap a turn runs under.
    fn cap(self) -> u64 {
        match self {
            Cli::ClaudeCode { cap } => cap,
            Cli::Codex => CODEX_CAP,
        }
    }

    /// The output an expected-mode turn reserves until 20 are known.
    fn default_output(self) -> u64 {
        match self {
            Cli::ClaudeCode { .. } => 4096,
            Cli::Codex => CODEX_CAP,
        }
    }
}

/// Codex's cap: `max_output_tokens` of the `gpt-6*` entry in `config/local.toml`.
const CODEX_CAP: u64 = 16_000;

/// `config` plus `gpt-test`, a Responses model like the one serving
/// Codex's default turn (`reasoning = true`, cap 16,000), and `claude-test`
/// allowing `cli`'s cap.
fn bench_config(mock: &MockUpstream, mode: &str, cli: Cli) -> TestConfig {
    let mut c = config(mock, 1_000_000_000_000, Some(mode));
    c.model("claude-test").max_output_tokens = Some(cli.cap().max(CAP) as i64);
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-responses".into()],
        ..config::upstream("openai0", Kind::Openai, &mock.base_url())
    });
    c.models.push(config::RawModel {
        reasoning: Some(true),
        default_max_output_tokens: Some(CODEX_CAP as i64),
        max_output_tokens: Some(CODEX_CAP as i64),
        ..config::model("gpt-test", &["openai0"])
    });
    c
}

/// The recorded default turns (`tests/fixtures/agent_turns/recorded.json`:
/// each pinned CLI's body as recorded against the mock, `AGENT_TURNS_RECORD=1
/// cargo test --test it agents_cli::`, ids stripped, paths neutralised), on
/// the benchmark's models: (label, shape, body), one per CLI version,
/// those `AGENT_TURNS_ONLY` names (labels containing it) when set.
fn bench_bodies() -> Vec<(String, Cli, serde_json::Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/agent_turns");
    let read = |file: &str| -> serde_json::Value {
        let path = format!("{dir}/{file}");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let only = std::env::var("AGENT_TURNS_ONLY").ok();
    let manifest = read("recorded.json");
    let mut out = Vec::new();
    for (file, entry) in manifest.as_object().expect("recorded.json") {
        let label = format!(
            "{}@{}",
            entry["cli"].as_str().unwrap_or(file),
            entry["version"].as_str().unwrap_or("?")
        );
        if only.as_deref().is_some_and(|o| !label.contains(o)) {
            continue;
        }
        let mut body = read(file);
        let cli = if entry["request"]
            .as_str()
            .is_some_and(|r| r.starts_with("POST /v1/messages"))
        {
            body["model"] = json!("claude-test");
            Cli::ClaudeCode {
                cap: body["max_tokens"].as_u64().expect("max_tokens"),
            }
        } else {
            body["model"] = json!("gpt-test");
            Cli::Codex
        };
        out.push((label, cli, body));
    }
    out
}

/// One turn of `cli` with `body`; the mock reports `input` and answers
/// `output` tokens (Claude Code: thinking; Codex: reasoning).
async fn bench_turn(
    base_url: &str,
    cli: Cli,
    body: &serde_json::Value,
    input: u64,
    output: u64,
) -> u16 {
    let output = output.clamp(1, cli.cap());
    let (path, header, scenario) = match cli {
        Cli::ClaudeCode { .. } => (
            "messages",
            "x-mock-messages",
            format!("input={input},thinking={}", output - 1),
        ),
        Cli::Codex => (
            "responses",
            "x-mock-responses",
            format!("input={input},output=1,reasoning={}", output - 1),
        ),
    };
    let r = reqwest::Client::new()
        .post(format!("{base_url}/{path}"))
        .bearer_auth(KEY)
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header(header, scenario)
        .json(body)
        .send()
        .await
        .expect("POST a turn");
    let status = r.status().as_u16();
    let _ = r.text().await;
    status
}

/// The agent-turns benchmark (`scripts/agent_turns.sh`; printed, never
/// asserted): per recorded CLI version, 4 agents × 200 turns, outputs in order from
/// the committed list, the mock reporting the gateway's input estimate,
/// under a quota the exposure cap does not bind, in "expected" and in
/// "cap" mode. The bodies are each CLI's recorded default turn
/// ([`bench_bodies`]). Then, per mode, the smallest tenant `tpm` without a
/// 429, by bisection over runs ([`smallest_tpm`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark: scripts/agent_turns.sh"]
async fn agent_turns_benchmark() {
    const AGENTS: usize = 4;
    let turns: usize = std::env::var("AGENT_TURNS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(200);
    let sizes = output_sizes();
    for (label, cli, body) in bench_bodies() {
        for mode in ["expected", "cap"] {
            let tenant = format!("bench-{}-{mode}", cli.name());
            let mock = start_mock().await;
            mock.state.set_output_tokens(1);
            let mut c = bench_config(&mock, mode, cli);
            c.tenant("t1").name = tenant.clone();
            c.tenant(&tenant).max_exposure = Some(RawMaxExposure::Tokens(1_000_000_000_000));
            let gw = c.start().await;
            let scope = Scope::Tenant(tenant.as_str().into());
            // The gateway's input estimate of the body: what the mock reports.
            let input = {
                let before = gw.used(scope.clone(), BudgetName::TokensPerDay).await;
                mock.state.hold();
                let (url, b) = (gw.base_url(), body.clone());
                let t = tokio::spawn(async move { bench_turn(&url, cli, &b, 2, 1).await });
                wait_held(&mock, 1).await;
                let held = gw.used(scope.clone(), BudgetName::TokensPerDay).await - before;
                mock.state.release();
                assert_eq!(t.await.unwrap(), 200);
                gw.all_settled().await;
                held - if mode == "cap" {
                    cli.cap()
                } else {
                    cli.default_output()
                }
            };
            let sum =
                |s: &prometheus_parse::Scrape, m: &str| sample_sum(s, m, &[("tenant", &tenant)]);
            let before = scrape(&gw).await;
            // The counters are the process's: a tenant name seen in an
            // earlier run (another version of the same CLI) starts above 0.
            let (r0, s0, d0, p0) = (
                sum(&before, "budgetgate_reserved_tokens_total"),
                sum(&before, "budgetgate_settled_tokens_total"),
                sum(&before, "budgetgate_output_debt_tokens_total"),
                sum(&before, "budgetgate_output_past_reservation_total"),
            );
            let key = gw.budgets(scope.clone())[0].key.clone();
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sampler = tokio::spawn({
                let (book, done) = (gw.state.expected.clone(), done.clone());
                async move {
                    let mut peak = 0;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        peak = peak.max(book.exposure.in_use(&key));
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                    peak
                }
            });
            let started = std::time::Instant::now();
            let mut agents = Vec::new();
            for a in 0..AGENTS {
                let (url, sizes, body) = (gw.base_url(), sizes.clone(), body.clone());
                agents.push(tokio::spawn(async move {
                    let mut refused = 0;
                    for i in 0..turns {
                        let out = sizes[(a * turns + i) % sizes.len()];
                        refused +=
                            usize::from(bench_turn(&url, cli, &body, input, out).await != 200);
                    }
                    refused
                }));
            }
            let mut refused = 0;
            for a in agents {
                refused += a.await.unwrap();
            }
            gw.all_settled().await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            let peak_exposure = sampler.await.unwrap();
            let after = scrape(&gw).await;
            let reserved = sum(&after, "budgetgate_reserved_tokens_total") - r0;
            let settled = sum(&after, "budgetgate_settled_tokens_total") - s0;
            let debt = (sum(&after, "budgetgate_output_debt_tokens_total") - d0) as u64;
            let past = (sum(&after, "budgetgate_output_past_reservation_total") - p0) as u64;
            let (largest_debt, peak_turn) = replay(cli, mode, &sizes, AGENTS * turns, input);
            println!(
                "agent_turns {label} {mode}: {AGENTS} agents x {turns} turns, input {input}/turn, cap {}, {refused} refused; \
                 reserved/settled {:.3} ({reserved} / {settled}); turns past their reservation {past}, debt {debt} tokens \
                 (largest one turn's {largest_debt}); peak exposure {peak_exposure}; largest reservation of one turn {peak_turn}; {:.1} s",
                cli.cap(),
                reserved / settled,
                started.elapsed().as_secs_f64(),
            );
            drop(gw);
            let started = std::time::Instant::now();
            let (tpm, runs, rounds) = smallest_tpm(cli, mode, &body, input, &sizes).await;
            println!(
                "agent_turns {label} {mode}: smallest tenant tpm without a 429: {tpm} ({AGENTS} agents, one turn each a minute, \
                 in flight at once, {rounds} minutes; bisection to 1,000 tokens, {runs} runs); {:.1} s",
                started.elapsed().as_secs_f64(),
            );
        }
    }
}

/// The smallest tenant `tpm` (its bucket's capacity, the default burst)
/// at which `cli`'s turns in `mode` meet no 429, measured: runs of
/// `AGENT_TURNS_TPM_ROUNDS` (default 50) minutes, each minute the 4 agents
/// starting one turn each (outputs from the list in order), all four in
/// flight at once (the mock holds them until each is admitted or
/// refused), the clock then moved a minute on; bisected between 0 and
/// four whole-cap turns to within 1,000 tokens. Returns (tpm, runs, minutes).
async fn smallest_tpm(
    cli: Cli,
    mode: &str,
    body: &serde_json::Value,
    input: u64,
    sizes: &[u64],
) -> (u64, usize, usize) {
    const AGENTS: usize = 4;
    let rounds: usize = std::env::var("AGENT_TURNS_TPM_ROUNDS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(50);
    let refusals = |tpm: u64| async move {
        let mock = start_mock().await;
        mock.state.set_output_tokens(1);
        let mut c = bench_config(&mock, mode, cli);
        c.tenant("t1").max_exposure = Some(RawMaxExposure::Tokens(1_000_000_000_000));
        let l = std::mem::take(&mut c.tenant("t1").limits);
        c.tenant("t1").limits = l.tpm(tpm);
        let gw = c.start().await;
        let mut refused = 0;
        for round in 0..rounds {
            mock.state.hold();
            let mut turns = Vec::new();
            for a in 0..AGENTS {
                let (url, b) = (gw.base_url(), body.clone());
                let out = sizes[(a * rounds + round) % sizes.len()];
                turns.push(tokio::spawn(async move {
                    bench_turn(&url, cli, &b, input, out).await
                }));
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while turns.iter().filter(|t| t.is_finished()).count() + mock.state.held_count()
                < AGENTS
            {
                assert!(std::time::Instant::now() < deadline, "turns stuck");
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            mock.state.release();
            for t in turns {
                refused += usize::from(t.await.expect("turn task") != 200);
            }
            gw.all_settled().await;
            gw.clock.advance(60_000_000);
        }
        refused
    };
    let (mut lo, mut hi) = (0, AGENTS as u64 * (input + cli.cap()) + 1_000);
    let mut runs = 1;
    assert_eq!(refusals(hi).await, 0, "four whole-cap turns fit");
    while hi - lo > 1_000 {
        let mid = (lo + hi) / 2;
        runs += 1;
        if refusals(mid).await == 0 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (hi, runs, rounds)
}

/// Replayed from the list in order (the 4 agents' turns interleave, so
/// this is the list's figure, not the run's): the largest debt of one turn
/// (its output above the p90 of the 200 answers before it; 0 in cap mode)
/// and the largest reservation of one turn (the smallest `tpm` that admits
/// every turn alone).
fn replay(cli: Cli, mode: &str, sizes: &[u64], n: usize, input: u64) -> (u64, u64) {
    if mode == "cap" {
        return (0, input + cli.cap());
    }
    let mut w: Vec<u64> = Vec::new();
    let (mut debt, mut peak) = (0, 0);
    for i in 0..n {
        let out = sizes[i % sizes.len()].clamp(1, cli.cap());
        let mut sorted = w.clone();
        sorted.sort_unstable();
        let e = if sorted.len() < 20 {
            cli.default_output()
        } else {
            sorted[(sorted.len() * 900).div_ceil(1000) - 1]
        }
        .min(cli.cap());
        debt = u64::max(debt, out.saturating_sub(e));
        peak = u64::max(peak, input + e);
        w.push(out);
        if w.len() > 200 {
            w.remove(0);
        }
    }
    (debt, peak)
}
