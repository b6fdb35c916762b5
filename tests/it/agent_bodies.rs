//! What the coding-agent CLIs send is accounted, not just admitted: the
//! default turns recorded from the pinned CLIs through the gateway on the
//! shipped configs (`tests/fixtures/agent_turns/`, each body with its entry
//! in `recorded.json`: CLI, version, day, config, the input tokens the
//! upstream reported with it; `AGENT_TURNS_RECORD=1 cargo test --test it
//! agents_cli::`).
//!
//! * Each recorded body's input estimate, on the entry of its shipped
//!   config, is at least the input the upstream reported with it, and the
//!   pinned versions of `tests/agents/package.json` each have a recording.
//! * Tools are estimated as sent: a `defer_loading` tool (which the
//!   provider keeps out of the prompt until a search loads it) and the
//!   tool-search tool each add at least their JSON's tokens to the
//!   estimate; deferring a tool never lowers it.
//! * Adaptive thinking with `output_config.effort` and `display: "omitted"`
//!   (the newest Claude Code's default turn, the thinking text left out of
//!   the stream, its tokens only in the usage): reserved as a thinking turn
//!   (the whole `max_tokens` in cap mode, the expected output in expected
//!   mode, never extended), settled at the usage's `output_tokens`
//!   (thinking included), not at the deltas the stream showed; in expected
//!   mode what passed the reservation settles as debt.

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::Policy;
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, ModelEstimation, TokenRoom};
use serde_json::{json, Value};

use crate::agents_cli::shipped;
use crate::support::*;

/// One recorded body and its `recorded.json` entry.
struct Recorded {
    file: String,
    entry: Value,
    body: Value,
}

impl Recorded {
    fn cli(&self) -> &str {
        self.entry["cli"].as_str().unwrap_or_default()
    }

    fn dialect(&self) -> Dialect {
        let request = self.entry["request"].as_str().unwrap_or_default();
        if request.starts_with("POST /v1/messages") {
            Dialect::Messages
        } else if request.starts_with("POST /v1/responses") {
            Dialect::Responses
        } else {
            panic!("{}: an unexpected request {request}", self.file)
        }
    }
}

fn agent_turns(file: &str) -> std::path::PathBuf {
    repo_path(&format!("tests/fixtures/agent_turns/{file}"))
}

fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every recorded body of `recorded.json`.
fn recorded() -> Vec<Recorded> {
    let manifest = read_json(&agent_turns("recorded.json"));
    let entries = manifest.as_object().expect("recorded.json is an object");
    entries
        .iter()
        .map(|(file, entry)| Recorded {
            file: file.clone(),
            entry: entry.clone(),
            body: read_json(&agent_turns(file)),
        })
        .collect()
}

/// The recording of `cli` at `version`.
fn recording(cli: &str, version: &str) -> Recorded {
    recorded()
        .into_iter()
        .find(|r| r.cli() == cli && r.entry["version"] == version)
        .unwrap_or_else(|| {
            panic!("no recording of {cli} {version}: AGENT_TURNS_RECORD=1 cargo test --test it agents_cli::")
        })
}

/// The version of `cli` pinned in `tests/agents/package.json`.
fn pinned(cli: &str) -> String {
    let p = read_json(&repo_path("tests/agents/package.json"));
    p["dependencies"][cli]
        .as_str()
        .unwrap_or_else(|| panic!("{cli} is not pinned"))
        .to_string()
}

/// The gateway's input estimate of `body` on the entry serving its model
/// in `config` (as `budgetgate estimate` computes it).
fn input_estimate(config: &str, dialect: Dialect, body: &Value) -> u64 {
    let policy = Policy::load(&repo_path(config)).expect("the shipped config loads");
    let name = body["model"].as_str().expect("a model");
    let m = policy
        .model(name)
        .unwrap_or_else(|| panic!("{config} serves no {name}"));
    let me = ModelEstimation {
        encoding: m.encoding,
        default_max_output_tokens: m.default_max_output_tokens,
        max_output_tokens: m.refused_above(),
        min_output_tokens: policy.min_output_tokens,
        token_ratio: m.token_ratio,
        image: m.image,
    };
    estimate(dialect, body, &me, &policy.estimation, TokenRoom::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .input_tokens
}

#[test]
fn recorded_bodies_estimate_at_least_the_input_reported_with_them() {
    let all = recorded();
    for cli in ["@anthropic-ai/claude-code", "@openai/codex"] {
        // The pinned (newest passing) release's turn is among them.
        recording(cli, &pinned(cli));
    }
    for r in &all {
        let config = r.entry["config"].as_str().expect("config");
        let reported = r.entry["input_tokens_reported"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: input_tokens_reported", r.file));
        let estimated = input_estimate(config, r.dialect(), &r.body);
        eprintln!(
            "agent_bodies {}: estimate {estimated}, reported {reported} ({:.2}x)",
            r.file,
            estimated as f64 / reported as f64
        );
        assert!(
            reported > 1_000,
            "{}: a whole default turn's prompt was reported ({reported})",
            r.file
        );
        assert!(
            estimated >= reported,
            "{}: the estimate {estimated} is below the reported input {reported}",
            r.file
        );
        if r.dialect() == Dialect::Messages {
            // Within the stated bound (docs/API.md, "token_ratio"): at least
            // every string the model reads, tools included, at the entry's
            // ratio.
            let policy = Policy::load(&repo_path(config)).expect("config");
            let ratio = policy
                .model(r.body["model"].as_str().expect("model"))
                .expect("entry")
                .token_ratio;
            let read: u64 = ["tools", "system", "messages"]
                .iter()
                .map(|k| strings(&r.body[*k]))
                .sum();
            let bound = budgetgate::estimate::messages::scale(read, ratio);
            assert!(
                estimated >= bound,
                "{}: the estimate {estimated} is below the text sent at token_ratio {ratio}: {bound}",
                r.file
            );
        }
    }
}

/// o200k tokens of every string in `v`.
fn strings(v: &Value) -> u64 {
    match v {
        Value::String(s) => tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64,
        Value::Array(a) => a.iter().map(strings).sum(),
        Value::Object(o) => o.values().map(strings).sum(),
        _ => 0,
    }
}

/// The tool-search tool as Anthropic's tool-search guide defines it (the
/// regex variant).
fn tool_search_tool() -> Value {
    json!({"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"})
}

/// o200k tokens of `v`'s JSON, scaled as Messages text is at `ratio`.
fn scaled_json(v: &Value, ratio: u64) -> u64 {
    let text = v.to_string();
    let n = tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(&text)
        .len() as u64;
    budgetgate::estimate::messages::scale(n, ratio)
}

/// `body`'s estimate drops by at least the scaled tokens of the tool at
/// `i` when that tool is left out (the scaling rounds up once per body).
fn counted_as_sent(est: &dyn Fn(&Value) -> u64, body: &Value, i: usize, ratio: u64) {
    let mut without = body.clone();
    let removed = without["tools"].as_array_mut().expect("tools").remove(i);
    let (with, less) = (est(body), est(&without));
    assert!(
        with - less >= scaled_json(&removed, ratio).saturating_sub(1),
        "tool {} (defer_loading {}) counted as sent: {with} with it, {less} without",
        removed["name"],
        removed["defer_loading"]
    );
}

#[test]
fn deferred_tools_and_the_tool_search_tool_are_estimated_as_sent() {
    let cli = "@anthropic-ai/claude-code";
    let r = recording(cli, &pinned(cli));
    let config = r.entry["config"].as_str().expect("config");
    let est = |b: &Value| input_estimate(config, Dialect::Messages, b);
    let policy = Policy::load(&repo_path(config)).expect("config");
    let ratio = policy
        .model(r.body["model"].as_str().expect("model"))
        .expect("entry")
        .token_ratio;
    let tools = r.body["tools"].as_array().expect("tools").clone();

    // As recorded: Claude Code's own tool search (a client-run `ToolSearch`
    // tool) and a tool sent with `defer_loading: true`.
    let position = |f: &dyn Fn(&Value) -> bool| tools.iter().position(f);
    let search = position(&|t| t["name"] == "ToolSearch")
        .unwrap_or_else(|| panic!("{}: no ToolSearch tool", r.file));
    let deferred = position(&|t| t["defer_loading"] == true)
        .unwrap_or_else(|| panic!("{}: no deferred tool", r.file));
    counted_as_sent(&est, &r.body, search, ratio);
    counted_as_sent(&est, &r.body, deferred, ratio);

    // The same turn with every tool deferred and Anthropic's server-side
    // tool-search tool added: deferring lowers nothing, and each tool still
    // counts as sent.
    let mut all_deferred = r.body.clone();
    let mut sent: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t["defer_loading"] = json!(true);
            t
        })
        .collect();
    sent.push(tool_search_tool());
    all_deferred["tools"] = json!(sent);
    let (plain, with_search) = (est(&r.body), est(&all_deferred));
    assert!(
        with_search >= plain + scaled_json(&tool_search_tool(), ratio).saturating_sub(1),
        "deferring lowers nothing and the tool-search tool is counted: {plain} -> {with_search}"
    );
    for i in [0, sent.len() / 2, sent.len() - 1] {
        counted_as_sent(&est, &all_deferred, i, ratio);
    }
}

/// The coder tenant's `tpm` in use.
async fn coder_tpm(gw: &Gateway) -> u64 {
    gw.used(Scope::Tenant("coder".into()), BudgetName::Tpm)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_thinking_with_effort_reserves_a_thinking_turn_and_settles_its_omitted_thinking() {
    let cli = "@anthropic-ai/claude-code";
    let r = recording(cli, &pinned(cli));
    let body = &r.body;
    assert_eq!(body["thinking"]["type"], "adaptive", "{}", body["thinking"]);
    assert_eq!(body["thinking"]["display"], "omitted");
    assert!(body["output_config"]["effort"].is_string(), "{body:#}");
    let cap = body["max_tokens"].as_u64().expect("max_tokens");
    const THINKING: u64 = 9_000;
    const TEXT: u64 = 12;
    for mode in ["cap", "expected"] {
        let mock = start_mock().await;
        mock.state.set_output_tokens(TEXT);
        let mut c = shipped("local-anthropic.toml", &mock);
        c.upstreams[0].forward_client_headers = vec!["x-mock-messages".into()];
        c.tenant("coder").output_reservation = Some(mode.into());
        let gw = c.start().await;
        let input = input_estimate(r.entry["config"].as_str().unwrap(), Dialect::Messages, body);

        mock.state.hold();
        let pending = tokio::spawn({
            let (url, body) = (gw.base_url(), body.clone());
            async move {
                let r = reqwest::Client::new()
                    .post(format!("{url}/messages?beta=true"))
                    .header("x-api-key", "sk-local-claude")
                    .header("anthropic-version", "2023-06-01")
                    .header("x-mock-messages", format!("thinking={THINKING}"))
                    .json(&body)
                    .send()
                    .await
                    .expect("POST /v1/messages");
                (r.status().as_u16(), r.text().await.unwrap_or_default())
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mock.state.held_count() < 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode}: never upstream"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let reserved = coder_tpm(&gw).await;
        // Cap mode: the whole max_tokens (a thinking stream is never
        // extended); expected mode: the entry's default output until 20
        // answers are known.
        let output = if mode == "cap" { cap } else { 4096 };
        assert_eq!(reserved, input + output, "{mode}: reserved");
        mock.state.release();
        let (status, stream) = pending.await.expect("turn");
        assert_eq!(status, 200, "{mode}: {stream}");
        assert!(
            stream.contains(r#""type":"signature_delta""#) && !stream.contains("thinking_delta"),
            "{mode}: the thinking left out of the stream"
        );
        gw.all_settled().await;
        let usage_input: u64 = stream
            .split(r#""input_tokens":"#)
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .expect("message_start's input_tokens");
        let settled = coder_tpm(&gw).await;
        assert_eq!(
            settled,
            usage_input + THINKING + TEXT,
            "{mode}: settled at the usage, the omitted thinking included"
        );
        let s = scrape(&gw).await;
        let debt = sample_sum(
            &s,
            "budgetgate_output_debt_tokens_total",
            &[("tenant", "coder")],
        ) as u64;
        let expected_debt = if mode == "cap" {
            0
        } else {
            THINKING + TEXT - 4096
        };
        assert_eq!(debt, expected_debt, "{mode}: output past the reservation");
    }
}
