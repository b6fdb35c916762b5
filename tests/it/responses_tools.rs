//! Responses tools wherever a coding agent puts them:
//! `namespace` groups of function tools (Codex CLI's shape, top-level or
//! in an `additional_tools` input item) are admitted, estimated with their
//! members and metered as function calls; a hosted tool nested in a group
//! is refused with its path; groups nest at most 4 deep; an unknown tool
//! type is refused with the config line that would allow it.

use budgetgate::budget::{BudgetName, Scope};
use serde_json::{json, Value};

use crate::support::*;

fn function(name: &str) -> Value {
    json!({"type": "function", "name": name, "description": format!("Runs {name} for the agent."),
           "strict": false, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}})
}

fn namespace(name: &str, tools: Vec<Value>) -> Value {
    json!({"type": "namespace", "name": name, "description": "", "tools": tools})
}

fn config(mock: &str) -> TestConfig {
    TestConfig::standard(
        mock,
        100,
        limits().tpm(1_000_000).tokens_per_day(10_000_000),
    )
}

async fn post(gw: &Gateway, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", gw.base_url()))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .expect("request")
}

async fn input_tokens(gw: &Gateway, body: &Value) -> u64 {
    let r = post(gw, "/responses/input_tokens", body).await;
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap()
}

/// Fault: every Codex turn was refused with 400 "Hosted tool `namespace`
/// runs on the provider's side", though a namespace is a client-side
/// group of function tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_groups_are_admitted_estimated_with_their_members_and_metered() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(30);
    let gw = config(&mock.base_url()).start().await;
    let members = vec![function("exec_command"), function("write_stdin")];
    let grouped = json!({"model": "gpt-4o-mini", "input": "list the files",
        "tools": [namespace("functions", members.clone())]});
    let flat = json!({"model": "gpt-4o-mini", "input": "list the files", "tools": members});
    let bare = json!({"model": "gpt-4o-mini", "input": "list the files",
        "tools": [namespace("functions", vec![])]});
    let (g, f, b) = (
        input_tokens(&gw, &grouped).await,
        input_tokens(&gw, &flat).await,
        input_tokens(&gw, &bare).await,
    );
    assert!(
        g >= f,
        "a group is estimated with its members: {g} < {f} flat"
    );
    assert!(g > b + 2 * 20, "the members count: {g} vs {b} without them");
    // Codex puts the same group in an `additional_tools` input item.
    let codex = json!({"model": "gpt-4o-mini", "input": [
        {"type": "additional_tools", "role": "developer", "tools": [namespace("functions", vec![function("exec_command"), function("write_stdin")])]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]}]});
    assert!(input_tokens(&gw, &codex).await >= f);
    // A streamed call of a grouped function is admitted and metered.
    let mut call = grouped.clone();
    call["stream"] = json!(true);
    call["tool_choice"] = json!({"type": "function", "name": "exec_command"});
    let r = post(&gw, "/responses", &call).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("response.function_call_arguments.delta"),
        "{text}"
    );
    assert!(text.contains("response.completed"));
    gw.all_settled().await;
    let sent = &mock.state.requests()[0].body;
    assert_eq!(
        sent["tools"][0]["type"], "namespace",
        "the group went as sent"
    );
    let used = gw.t1_used(BudgetName::TokensPerDay).await;
    let completed = text
        .split("\n\n")
        .find(|e| e.contains("event: response.completed"))
        .and_then(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .expect("a completed event");
    let usage = &completed["response"]["usage"];
    assert_eq!(
        used,
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap(),
        "settled at the answer's usage"
    );
    assert_eq!(codex["input"][0]["type"], "additional_tools");
    let r = post(&gw, "/responses", &codex).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

/// Fault: a hosted tool passed unmetered when it sat inside a group, or
/// was refused without saying where (Codex sends 15+ tools).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_tool_inside_a_group_is_refused_with_its_path_and_the_allowing_line() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let mut tools: Vec<Value> = (0..4).map(|i| function(&format!("f{i}"))).collect();
    tools.push(namespace(
        "functions",
        vec![function("a"), function("b"), json!({"type": "web_search"})],
    ));
    let body = json!({"model": "gpt-4o-mini", "input": "hi", "tools": tools});
    let r = post(&gw, "/responses", &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "tools[4].tools[2].type", "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("`web_search`") && m.contains("model `gpt-4o-mini`"),
        "{m}"
    );
    assert!(m.contains("hosted_tools"), "quotes the allowing line: {m}");
    // In Codex's `additional_tools` item too.
    let codex = json!({"model": "gpt-4o-mini", "input": [
        {"type": "additional_tools", "tools": [namespace("functions", vec![function("a"), json!({"type": "file_search"})])]}]});
    let e: Value = post(&gw, "/responses", &codex).await.json().await.unwrap();
    assert_eq!(
        e["error"]["param"], "input[0].tools[0].tools[1].type",
        "{e}"
    );
    assert_eq!(mock.state.request_count(), 0);
}

/// Fault: groups nested without bound let a body make the gateway recurse
/// as deep as the client liked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_nest_at_most_four_deep() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let wrap = |t: Value| namespace("n", vec![t]);
    let four = json!({"model": "gpt-4o-mini", "input": "hi",
        "tools": [wrap(wrap(wrap(function("f"))))]});
    assert_eq!(post(&gw, "/responses", &four).await.status(), 200);
    let five = json!({"model": "gpt-4o-mini", "input": "hi",
        "tools": [wrap(wrap(wrap(wrap(function("f")))))]});
    let r = post(&gw, "/responses", &five).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(
        e["error"]["param"],
        "tools[0].tools[0].tools[0].tools[0].tools"
    );
}

/// Fault: a tool type the gateway did not know was refused as "hosted"
/// with no way to allow it, or passed as if the client ran it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tool_type_is_refused_saying_how_to_allow_it() {
    let mock = start_mock().await;
    let mut c = config(&mock.base_url());
    let gw = c.start().await;
    let body = json!({"model": "gpt-4o-mini", "input": "hi",
        "tools": [namespace("ns", vec![json!({"type": "teleport"})])]});
    let r = post(&gw, "/responses", &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "tools[0].tools[0].type");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.contains("`teleport` is unknown to this gateway"), "{m}");
    assert!(m.contains("hosted_tools"), "{m}");
    drop(gw);
    // Listed by the operator, it passes.
    c.model("gpt-4o-mini").hosted_tools = vec!["teleport".to_string()].into();
    let gw = c.start().await;
    assert_eq!(post(&gw, "/responses", &body).await.status(), 200);
}

/// `gpt-4o-mini` priced $0.15 / $0.60 per million tokens, web search at
/// $0.01 per call, at most 3 calls a request, 1000 input tokens reserved
/// per call; tenant `t1` with `usd` a day.
fn priced_search(mock: &str, usd: &str) -> TestConfig {
    use budgetgate::config::raw::{RawHostedTool, RawHostedTools};
    let mut c = TestConfig::standard(mock, 100, limits().usd_per_day(usd).tpm(1_000_000));
    let m = c.model("gpt-4o-mini");
    m.price = Some(price("0.15", "0.60"));
    m.hosted_tools = RawHostedTools::Priced(
        [(
            "web_search".to_string(),
            RawHostedTool {
                per: "call".into(),
                usd: "0.01".into(),
            },
        )]
        .into(),
    );
    m.max_tool_calls = Some(3);
    m.hosted_call_input_tokens = Some(1000);
    c
}

/// Fault: a web search ran on the provider's bill with nothing reserved
/// or charged for it, or was refused without saying how to allow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpriced_web_search_is_refused_quoting_the_line_that_prices_it() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let body = json!({"model": "gpt-4o-mini", "input": "news?", "tools": [{"type": "web_search"}]});
    let r = post(&gw, "/responses", &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.contains(r#"hosted_tools = { web_search = { per = "call", usd = "…" } }"#),
        "{m}"
    );
    // Allowed by the list form (unpriced), a dollar budget still refuses it.
    let mut c = priced_search(&mock.base_url(), "1");
    c.model("gpt-4o-mini").hosted_tools = vec!["web_search".to_string()].into();
    let gw = c.start().await;
    let r = post(&gw, "/responses", &body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "unpriceable_request", "{e}");
    assert_eq!(mock.state.request_count(), 0);
}

/// Fault: a priced web search reserved nothing for its calls (a dollar
/// budget overspent by every search), was settled without them, or the
/// client's `max_tool_calls` was raised to the model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priced_web_search_reserves_its_price_and_settles_the_calls_reported() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    mock.state.set_web_search_calls(2);
    // $0.03: the tokens fit, three calls at $0.01 with them do not.
    let gw = priced_search(&mock.base_url(), "0.03").start().await;
    let usd = || gw.used(Scope::Tenant("t1".into()), BudgetName::UsdPerDay);
    let body = |extra: Value| {
        let mut b = json!({"model": "gpt-4o-mini", "input": "news?",
            "tools": [function("f"), {"type": "web_search"}]});
        if let Value::Object(o) = extra {
            b.as_object_mut().unwrap().extend(o);
        }
        b
    };
    let r = post(&gw, "/responses", &body(json!({}))).await;
    assert_eq!(r.status(), 429, "3 calls × $0.01 + tokens > $0.03");
    assert_eq!(mock.state.request_count(), 0);
    // The client asks for at most 2 calls: reserved 2 × $0.01, sent as is.
    let r = post(&gw, "/responses", &body(json!({"max_tool_calls": 2}))).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let v: Value = r.json().await.unwrap();
    gw.all_settled().await;
    let sent = &mock.state.requests()[0].body;
    assert_eq!(
        sent["max_tool_calls"], 2,
        "a client's value is never raised"
    );
    let u = &v["usage"];
    let (input, output) = (
        u["input_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    );
    let tokens = (input * 150_000 + output * 600_000).div_ceil(1_000_000);
    let calls = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "web_search_call")
        .count() as u64;
    assert_eq!(calls, 2);
    assert_eq!(
        usd().await,
        tokens + calls * 10_000,
        "the calls reported, charged"
    );
    // A larger client value is lowered to the model's maximum (streamed).
    drop(gw);
    let gw = priced_search(&mock.base_url(), "1").start().await;
    let mut b = body(json!({"max_tool_calls": 50}));
    b["stream"] = json!(true);
    let r = post(&gw, "/responses", &b).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("response.completed"));
    gw.all_settled().await;
    let sent = &mock.state.requests()[1].body;
    assert_eq!(sent["max_tool_calls"], 3, "lowered to the model's maximum");
    let used = gw
        .used(Scope::Tenant("t1".into()), BudgetName::UsdPerDay)
        .await;
    assert!(
        (2 * 10_000..3 * 10_000).contains(&used),
        "two calls charged on the stream: {used}"
    );
}
