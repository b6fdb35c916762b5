//! Anthropic Messages server tools priced per model
//! (docs/MONEY.md): a server tool (`web_search_20250305`…) is refused
//! unless the model allows it in `hosted_tools`, the refusal quoting the
//! line that would; priced, a request reserves the price of the most
//! calls it may make (each tool's `max_uses`, set upstream from the
//! model's `max_tool_calls`, a client's value lowered, never raised) and
//! settles the calls `usage.server_tool_use` reports, streamed or not.
//! `mcp_servers` stays refused.

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::raw::{RawHostedTool, RawHostedTools};
use serde_json::{json, Value};

use super::dollars_flow::claude_config;
use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

const TENANT: &str = "payer-tools";

async fn post(gw: &Gateway, b: &Value, scenario: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("x-mock-messages", scenario)
        .json(b)
        .send()
        .await
        .expect("POST /v1/messages")
}

fn body(tools: Value) -> Value {
    json!({"model": "claude-test", "max_tokens": 50,
        "messages": [{"role": "user", "content": "news?"}], "tools": tools})
}

fn search(max_uses: Option<u64>) -> Value {
    let mut t = json!({"type": "web_search_20250305", "name": "web_search"});
    if let Some(n) = max_uses {
        t["max_uses"] = json!(n);
    }
    t
}

fn weather() -> Value {
    json!({"name": "get_weather", "description": "Weather of a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}})
}

/// `claude-test` at Sonnet's prices ($3 / $15 per million tokens), web
/// search at $0.01 and web fetch at $0.002 per call, at most 3 calls per
/// tool, 1000 input tokens reserved per call; tenant [`TENANT`] with
/// `usd` a day.
fn priced(mock: &MockUpstream, usd: &str) -> TestConfig {
    let mut c = claude_config(mock, TENANT);
    c.tenant(TENANT).limits = limits().usd_per_day(usd);
    let m = c.model("claude-test");
    let per_call = |usd: &str| RawHostedTool {
        per: "call".into(),
        usd: usd.into(),
    };
    m.hosted_tools = RawHostedTools::Priced(
        [
            ("web_search".to_string(), per_call("0.01")),
            ("web_fetch".to_string(), per_call("0.002")),
        ]
        .into(),
    );
    m.max_tool_calls = Some(3);
    m.hosted_call_input_tokens = Some(1000);
    c
}

/// µ$ of the tokens an answer's `usage` reports at Sonnet's prices.
fn tokens_cost(u: &Value) -> u64 {
    u["input_tokens"].as_u64().unwrap() * 3 + u["output_tokens"].as_u64().unwrap() * 15
}

/// Fault: a server tool ran on the provider's bill unmetered, or was
/// refused without saying how to allow it; or a list-allowed (unpriced)
/// one passed under a dollar budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpriced_server_tool_is_refused_quoting_the_line_that_prices_it() {
    let mock = start_mock().await;
    let mut c = claude_config(&mock, TENANT);
    let gw = c.start().await;
    let r = post(&gw, &body(json!([weather(), search(None)])), "").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("`tools[1].type`"), "{m}");
    assert!(m.contains("model `claude-test`"), "{m}");
    assert!(
        m.contains(r#"hosted_tools = { web_search = { per = "call", usd = "…" } }"#),
        "{m}"
    );
    // A tool the gateway cannot count is allowed by the list form only.
    let code = json!([{"type": "code_execution_20250825", "name": "code_execution"}]);
    let r = post(&gw, &body(code), "").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains(r#"hosted_tools = ["code_execution"]"#), "{m}");
    drop(gw);
    // Allowed unpriced (the list form): a dollar budget refuses it.
    c.model("claude-test").hosted_tools = vec!["web_search".to_string()].into();
    let gw = c.start().await;
    let r = post(&gw, &body(json!([search(None)])), "").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server tools are billed per use"),
        "{v}"
    );
    assert_eq!(mock.state.request_count(), 0);
    // Priced, web search does not admit `mcp_servers`.
    drop(gw);
    let gw = priced(&mock, "1").start().await;
    let mut b = body(json!([search(None)]));
    b["mcp_servers"] = json!([{"type": "url", "url": "https://mcp.example", "name": "x"}]);
    let r = post(&gw, &b, "").await;
    assert_eq!(r.status(), 400);
    assert_eq!(mock.state.request_count(), 0);
}

/// Fault: a priced web search reserved nothing for its calls (a dollar
/// budget overspent by every search), was settled without them, or the
/// client's `max_uses` was raised to the model's (non-streamed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priced_web_search_reserves_its_calls_and_settles_the_calls_reported() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    // $0.035: three calls ($0.03) with 3000 input tokens of allowance do
    // not fit; two calls ($0.02) with 2000 do.
    let gw = priced(&mock, "0.035").start().await;
    let usd = || gw.used(Scope::Tenant(TENANT.into()), BudgetName::UsdPerDay);
    let r = post(&gw, &body(json!([weather(), search(None)])), "web_search=2").await;
    assert_eq!(r.status(), 429, "3 calls × $0.01 + 3000 tokens > $0.035");
    assert_eq!(mock.state.request_count(), 0);
    let r = post(
        &gw,
        &body(json!([weather(), search(Some(2))])),
        "web_search=2",
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let v: Value = r.json().await.unwrap();
    gw.all_settled().await;
    let sent = &mock.state.requests()[0].body;
    assert_eq!(sent["tools"][1]["max_uses"], 2, "a client's value is kept");
    assert_eq!(sent["tools"][0], weather(), "a client tool is untouched");
    assert_eq!(v["usage"]["server_tool_use"]["web_search_requests"], 2);
    assert_eq!(
        usd().await,
        tokens_cost(&v["usage"]) + 2 * 10_000,
        "the calls reported, charged"
    );
}

/// Fault: a stream's server tool calls went unsettled (they come in the
/// final `message_delta`), `max_uses` was not set when absent, or a
/// client's larger value went upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_settle_and_max_uses_is_set_and_lowered() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let gw = priced(&mock, "1").start().await;
    let fetch = json!({"type": "web_fetch_20250910", "name": "web_fetch"});
    let mut b = body(json!([search(Some(50)), fetch]));
    b["stream"] = json!(true);
    let r = post(&gw, &b, "web_search=2,web_fetch=1").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("message_stop"), "{text}");
    gw.all_settled().await;
    let sent = &mock.state.requests()[0].body;
    assert_eq!(sent["tools"][0]["max_uses"], 3, "lowered to the model's");
    assert_eq!(sent["tools"][1]["max_uses"], 3, "set when absent");
    let used = gw
        .used(Scope::Tenant(TENANT.into()), BudgetName::UsdPerDay)
        .await;
    let calls = 2 * 10_000 + 2_000;
    // A count is the body's tokens, without the calls' input allowance.
    let r = reqwest::Client::new()
        .post(format!("{}/messages/count_tokens", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&body(json!([search(None)])))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let counted = v["input_tokens"].as_u64().unwrap();
    assert!((1..1000).contains(&counted), "{v}");
    assert!(
        (calls..calls + 10_000).contains(&used),
        "two searches and a fetch charged on the stream, with the tokens: {used}"
    );
}
