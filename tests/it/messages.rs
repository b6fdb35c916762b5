//! Anthropic Messages (`POST /v1/messages`) through the gateway to the
//! simulated upstream: shapes, headers, cache-token settlement, stream
//! usage, cutoff, upstream failures, and the official `anthropic` SDK.

use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

use crate::support::mock_upstream::{Fault, MockUpstream};
use crate::support::*;

/// Anthropic upstream(s) serving `claude-test` (token_ratio 1000, default
/// output 256, at most 64000), tenant `t1` with `tenant_limits`; the
/// upstream key is the test process's `CARGO_PKG_NAME`, which cargo sets.
fn config(mocks: &[&MockUpstream], tenant_limits: Limits) -> TestConfig {
    let mut c = TestConfig::new();
    c.estimation.stream_extension_step = Some(256);
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        let name = format!("claude{i}");
        c.upstreams.push(config::RawUpstream {
            api_key_env: Some("CARGO_PKG_NAME".into()),
            forward_client_headers: vec!["x-mock-messages".into()],
            ..config::upstream(&name, Kind::Anthropic, &m.root_url())
        });
        names.push(name);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        token_ratio: Some(1000),
        anthropic_betas: vec!["allowed-beta-2025".into()],
        ..config::model("claude-test", &names)
    });
    c.upstreams.push(config::upstream(
        "oai",
        Kind::SelfHosted,
        &mocks[0].base_url(),
    ));
    c.models.push(config::model("gpt-4o-mini", &["oai"]));
    c.tenants
        .push(config::tenant("t1", "k1", KEY, tenant_limits));
    c
}

fn body(max_tokens: Option<u64>, stream: bool) -> Value {
    let mut b = json!({"model": "claude-test", "messages": [{"role": "user", "content": "hi"}], "stream": stream});
    if let Some(m) = max_tokens {
        b["max_tokens"] = json!(m);
    }
    b
}

async fn post(
    gw: &Gateway,
    key_header: (&str, &str),
    b: &Value,
    scenario: &str,
) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header(key_header.0, key_header.1)
        .header("anthropic-version", "2023-06-01")
        .header("x-mock-messages", scenario)
        .json(b)
        .send()
        .await
        .expect("POST /v1/messages")
}

const XKEY: (&str, &str) = ("x-api-key", KEY);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_in_anthropic_shape_with_own_headers_and_cache_tokens_settled_exactly() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(50);
    let gw = config(&[&mock], limits().rpm(100).tpm(100_000))
        .start()
        .await;
    let r = post(
        &gw,
        XKEY,
        &body(Some(1000), false),
        "input=7,cache_read=10000,cache_creation=2000",
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-tokens-limit"),
        "100000"
    );
    assert_eq!(must_header(&r, "anthropic-ratelimit-requests-limit"), "100");
    let reset = must_header(&r, "anthropic-ratelimit-tokens-reset");
    assert!(
        reset.starts_with("2026-11-30T12:") && reset.ends_with('Z'),
        "{reset}"
    );
    assert_ne!(
        must_header(&r, "anthropic-ratelimit-tokens-remaining"),
        "1",
        "the upstream's own are not relayed"
    );
    assert!(header(&r, "x-ratelimit-limit-tokens").is_none());
    assert!(header(&r, "request-id").is_some());
    assert!(must_header(&r, "x-upstream-request-id").starts_with("req_mock_"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["usage"]["cache_read_input_tokens"], 10000);
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        12_057,
        "7 + 10000 + 2000 + 50"
    );
    let sent = &mock.state.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(
        sent.header("x-api-key"),
        Some(env!("CARGO_PKG_NAME")),
        "the gateway's key upstream"
    );
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert!(sent.header("authorization").is_none());
    assert_eq!(
        sent.raw_body.len(),
        serde_json::to_vec(&body(Some(1000), false)).unwrap().len(),
        "body passed as sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_usage_is_last_value_wins_and_late_fields_count() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(15);
    let gw = config(&[&mock], limits().tpm(100_000)).start().await;
    let r = post(
        &gw,
        ("authorization", &format!("Bearer {KEY}")),
        &body(Some(1000), true),
        "input=10,cumulative=2,late_cache=1,cache_read=30",
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: message_stop"));
    assert_eq!(
        text.matches("event: message_delta").count(),
        3,
        "5, 10, then 15"
    );
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        10 + 30 + 15,
        "never summed; cache read first seen in message_delta"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_in_anthropic_shape_with_nothing_reserved() {
    let mock = start_mock().await;
    let gw = config(&[&mock], limits().tpm(100_000)).start().await;
    let r = post(&gw, XKEY, &body(None, false), "").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = post(&gw, ("x-api-key", "sk-nobody"), &body(Some(10), false), "").await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "authentication_error"
    );
    let r = reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .bearer_auth("sk-other")
        .json(&body(Some(10), false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "two different keys");
    let r = reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-beta", "allowed-beta-2025, secret-beta")
        .json(&body(Some(10), false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("secret-beta"));
    // An anthropic model answers only on /v1/messages, and an OpenAI one not there.
    let r = post_chat(
        &gw,
        KEY,
        &json!({"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("/v1/messages"));
    let mut b = body(Some(10), false);
    b["model"] = json!("gpt-4o-mini");
    let r = post(&gw, XKEY, &b, "").await;
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "not_found_error"
    );
    // x-api-key is accepted on /v1/messages only.
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .header("x-api-key", KEY)
        .json(&hi(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0, "nothing reserved");
    assert_eq!(mock.state.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_goes_to_the_next_deployment_refunded_and_529_when_all_are() {
    let (a, b) = (start_mock().await, start_mock().await);
    a.state.set_fault(Some(Fault::Overloaded));
    b.state.set_output_tokens(5);
    let gw = config(&[&a, &b], limits().tpm(100_000)).start().await;
    let r = post(&gw, XKEY, &body(Some(100), false), "input=20").await;
    assert_eq!(r.status(), 200);
    gw.all_settled().await;
    assert_eq!((a.state.request_count(), b.state.request_count()), (1, 1));
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        25,
        "the overloaded attempt refunded"
    );
    b.state.set_fault(Some(Fault::Overloaded));
    let r = post(&gw, XKEY, &body(Some(100), false), "").await;
    assert_eq!(r.status(), 529);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "overloaded_error"
    );
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_is_reserved_whole_and_plain_streams_incrementally() {
    let mock = start_mock().await;
    let gw = config(&[&mock], limits().tpm(600)).start().await;
    let mut b = body(Some(1000), true);
    b["thinking"] = json!({"type": "enabled", "budget_tokens": 500});
    let r = post(&gw, XKEY, &b, "").await;
    assert_eq!(
        r.status(),
        429,
        "1000 reserved up front never fits a 600-token budget"
    );
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "rate_limit_error"
    );
    let r = post(&gw, XKEY, &body(Some(1000), true), "input=5").await;
    assert_eq!(
        r.status(),
        200,
        "incremental: admitted at the model's default output"
    );
    let _ = r.text().await;
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 5 + 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_ends_in_an_api_error_event() {
    let mock = start_mock().await;
    let gw = config(&[&mock], limits().tpm(100_000)).start().await;
    let r = post(&gw, XKEY, &body(Some(100), true), "drop=1").await;
    let text = r.text().await.unwrap();
    let error = text
        .split("event: error\ndata: ")
        .nth(1)
        .expect("an error event");
    let v: Value = serde_json::from_str(error.trim()).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "api_error");
    assert!(!text.contains("message_stop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_create_stream_helper_and_tool_use() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(8);
    let gw = config(&[&mock], limits().tpm(1_000_000)).start().await;
    let r = run_python("anthropic_sdk.py", &gw.base_url(), &["basic"])
        .await
        .json();
    assert_eq!(r["text"], r["stream_text"]);
    assert_eq!(r["text"], r["final_text"]);
    assert_eq!(r["usage"]["output_tokens"], 8);
    assert_eq!(r["tool"]["stop_reason"], "tool_use");
    assert_eq!(r["tool"]["input"], json!({"city": "Paris"}));
    assert_eq!(r["headers"]["anthropic-ratelimit-tokens-limit"], "1000000");
    gw.all_settled().await;
    assert_eq!(gw.memory().live_holds(), 0);
    // Charged what the upstream reported, request by request.
    let expected: u64 = mock
        .state
        .requests()
        .iter()
        .map(|q| {
            let n = budgetgate_mock_input(&q.body);
            let tool = tiktoken_rs::o200k_base_singleton()
                .encode_ordinary("{\"city\": \"Paris\"}")
                .len() as u64;
            let out = if q.header("x-mock-messages") == Some("tool_use=1") {
                8 + tool
            } else {
                8
            };
            n + out
        })
        .sum();
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, expected);
}

/// The mock's own input count (see `examples/mock_upstream/messages.rs`).
fn budgetgate_mock_input(body: &Value) -> u64 {
    fn strings(v: &Value) -> u64 {
        let bpe = tiktoken_rs::o200k_base_singleton();
        match v {
            Value::String(s) => bpe.encode_ordinary(s).len() as u64,
            Value::Array(a) => a.iter().map(strings).sum(),
            Value::Object(o) => o.values().map(strings).sum(),
            _ => 0,
        }
    }
    let m = body["messages"].as_array().unwrap();
    4 * m.len() as u64 + m.iter().map(strings).sum::<u64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_cutoff_of_a_32k_cap_finishes_cleanly_and_charges_what_was_delivered() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5000);
    let gw = config(&[&mock], limits().tpm(1000)).start().await;
    let h = run_python("anthropic_sdk.py", &gw.base_url(), &["cutoff_helper"])
        .await
        .json();
    assert_eq!(h["stop_reason"], "max_tokens");
    let delivered = h["output_tokens"].as_u64().unwrap();
    assert_eq!(
        h["text_tokens"], delivered,
        "output_tokens is what was delivered"
    );
    assert!((256..1000).contains(&delivered), "{delivered}");
    gw.all_settled().await;
    let input = budgetgate_mock_input(&mock.state.requests()[0].body);
    let used = gw.t1_used(BudgetName::Tpm).await;
    assert_eq!(used, input + delivered, "prompt + delivered output");
    // A minute later the bucket is full again: the other SDK style.
    gw.clock.advance(60_000_000);
    let c = run_python("anthropic_sdk.py", &gw.base_url(), &["cutoff_create"])
        .await
        .json();
    assert_eq!(c["stop_reason"], "max_tokens");
    let second = c["output_tokens"].as_u64().unwrap();
    assert!((256..1000).contains(&second), "{second}");
    gw.all_settled().await;
    // The refill of a minute is capped at the capacity; a debt the first
    // stream left (the prompt underestimated) is still owed.
    let left_after_refill = (1000 - used as i64 + 1000).min(1000);
    let expected = 1000 - (left_after_refill - (input + second) as i64);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await as i64, expected);
    assert_eq!(
        mock.state.requests()[0].body["max_tokens"],
        32000,
        "the client's cap went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_rate_limit_error_carries_retry_after_and_our_headers() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5950);
    let gw = config(&[&mock], limits().tpm(6000)).start().await;
    // Use most of the minute's budget: the SDK's call then waits about a second.
    let r = post(&gw, XKEY, &body(Some(5950), false), "input=5").await;
    assert_eq!(r.status(), 200);
    gw.all_settled().await;
    let r = run_python("anthropic_sdk.py", &gw.base_url(), &["rate_limited"])
        .await
        .json();
    assert_eq!(r["error"], "RateLimitError");
    assert_eq!(r["type"], "rate_limit_error");
    assert!(r["retry_after"].as_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(r["tokens_limit"], "6000");
    assert!(r["tokens_reset"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        r["should_retry"],
        Value::Null,
        "a rate refusal may be retried"
    );
    assert_eq!(
        r["requests_sent"], 3,
        "the SDK's two retries honoured retry-after and were refused too"
    );
    assert_eq!(
        mock.state.request_count(),
        1,
        "refusals never reach the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_does_not_retry_a_day_quota_refusal() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(100);
    let gw = config(&[&mock], limits().tokens_per_day(150)).start().await;
    let r = post(&gw, XKEY, &body(Some(100), false), "input=40").await;
    assert_eq!(r.status(), 200);
    gw.all_settled().await;
    let r = run_python("anthropic_sdk.py", &gw.base_url(), &["rate_limited"])
        .await
        .json();
    assert_eq!(r["error"], "RateLimitError");
    assert_eq!(r["should_retry"], "false");
    assert_eq!(r["requests_sent"], 1, "x-should-retry: false is obeyed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_the_gateway_estimate_charged_to_request_budgets_only() {
    let mock = start_mock().await;
    let mut c = config(&[&mock], limits().rpm(10).tpm(100_000));
    c.model("claude-test").token_ratio = Some(1500);
    let gw = c.start().await;
    let r = run_python("anthropic_sdk.py", &gw.base_url(), &["count_tokens"])
        .await
        .json();
    // 4 tokens of framing + "Say hello." (3 in o200k_base) at 1.5, rounded up.
    let text = 4 + tiktoken_rs::o200k_base_singleton()
        .encode_ordinary("Say hello.")
        .len() as u64;
    assert_eq!(r["input_tokens"], (text * 3).div_ceil(2));
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Rpm).await, 1, "the request counts");
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0, "no token is spent");
    assert_eq!(mock.state.request_count(), 0, "never sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tools_mcp_containers_and_file_ids_only_where_allowed() {
    let mock = start_mock().await;
    let mut c = config(&[&mock], limits().tpm(100_000));
    let gw = c.start().await;
    let with = |extra: Value| {
        let mut b = body(Some(10), false);
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let web = json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    let file = json!({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": "file_1"}}]}]});
    // Named in the request's terms, never by a Rust type name (`ServerTool`).
    for (extra, param, named) in [
        (web.clone(), "tools", "server tools are not enabled"),
        (
            json!({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}),
            "mcp_servers",
            "MCP servers are not enabled",
        ),
        (
            json!({"container": "container_1"}),
            "container",
            "containers are not enabled",
        ),
        (file.clone(), "messages", "file_id sources are not enabled"),
    ] {
        let r = post(&gw, XKEY, &with(extra), "").await;
        assert_eq!(r.status(), 400, "{param}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(param), "{message}");
        assert!(message.contains(named), "{message}");
    }
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0, "nothing reserved");
    assert_eq!(mock.state.request_count(), 0);
    drop(gw);
    // Allowed per model (file ids also per tenant): forwarded.
    c.model("claude-test").allow_server_tools = Some(true);
    c.model("claude-test").allow_file_ids = Some(true);
    let gw = c.start().await;
    assert_eq!(post(&gw, XKEY, &with(web), "").await.status(), 200);
    assert_eq!(
        post(&gw, XKEY, &with(file.clone()), "").await.status(),
        400,
        "the tenant has not allowed file ids"
    );
    drop(gw);
    c.tenant("t1").allow_file_ids = Some(true);
    let gw = c.start().await;
    assert_eq!(post(&gw, XKEY, &with(file), "").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_reserve_a_client_cap_incrementally_when_the_model_says_so() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(2000);
    let mut c = config(&[&mock], limits().tpm(600));
    c.model("gpt-4o-mini").default_max_output_tokens = Some(256);
    c.model("gpt-4o-mini").max_output_tokens = Some(4096);
    let full = c.start().await;
    let mut b = hi(4000);
    b["stream"] = json!(true);
    let r = post_chat(&full, KEY, &b).await;
    assert_eq!(
        r.status(),
        429,
        "\"full\" (the OpenAI default) reserves 4000 up front"
    );
    drop(full);
    c.model("gpt-4o-mini").client_cap_reservation = Some("incremental".into());
    let gw = c.start().await;
    let r = post_chat(&gw, KEY, &b).await;
    assert_eq!(r.status(), 200, "admitted at the model's default output");
    let chunks = sse_chunks(&r.bytes().await.unwrap());
    let delivered = content_chunks(&chunks) as u64;
    assert!((256..600).contains(&delivered), "{delivered}");
    let last = chunks
        .iter()
        .rev()
        .find(|c| !c["choices"][0].is_null())
        .unwrap();
    assert_eq!(
        last["choices"][0]["finish_reason"], "length",
        "cut off cleanly"
    );
    assert_eq!(
        mock.state.requests()[0].body["max_tokens"],
        4000,
        "the client's cap went upstream"
    );
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        chat_input_tokens(&b) + delivered
    );
}
