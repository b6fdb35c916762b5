//! Input and output limits (`input_tpm`, `output_tpm`) and cache tokens
//! counted per budget, through the gateway to the simulated upstream:
//! each budget is reserved, extended and settled with its own amount.
//! Faults guarded against: one token number applied to every budget (an
//! input limit charged the output, an extension debiting input limits,
//! cache reads charged to a provider budget that leaves them out, a
//! cacheable prefix making a request impossible there, an upstream budget
//! reserving a stream's cap incrementally while its provider counts it
//! whole at request start).

use budgetgate::budget::{BudgetName, Scope};
use serde_json::{json, Value};

use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

fn t1() -> Scope {
    Scope::Tenant("t1".into())
}

/// Anthropic upstream `claude0` (`upstream_limits`) serving `claude-test`
/// (token_ratio 1000, default output 256), tenant `t1` with `tenant_limits`.
fn messages_config(
    mock: &MockUpstream,
    tenant_limits: Limits,
    upstream_limits: Limits,
) -> TestConfig {
    let mut c = TestConfig::new();
    c.estimation.stream_extension_step = Some(256);
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-messages".into()],
        limits: upstream_limits,
        ..config::upstream("claude0", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        token_ratio: Some(1000),
        ..config::model("claude-test", &["claude0"])
    });
    c.tenants
        .push(config::tenant("t1", "k1", KEY, tenant_limits));
    c
}

fn claude0() -> Scope {
    Scope::Upstream("claude0".into())
}

async fn post_messages(gw: &Gateway, b: &Value, scenario: &str) -> reqwest::Response {
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

fn messages_body(max_tokens: u64, stream: bool) -> Value {
    json!({"model": "claude-test", "max_tokens": max_tokens, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

/// A system prompt of about `tokens` tokens, cached or not.
fn with_system(mut b: Value, tokens: usize, cached: bool) -> Value {
    let mut block = json!({"type": "text", "text": "alpha ".repeat(tokens)});
    if cached {
        block["cache_control"] = json!({"type": "ephemeral"});
    }
    b["system"] = json!([block]);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_tokens_settle_on_each_budget_as_it_counts_them() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(50);
    let tenant = limits()
        .tpm(100_000)
        .input_tpm(50_000)
        .output_tpm(5_000)
        .tokens_per_day(1_000_000);
    let upstream = limits().tpm(100_000).input_tpm(50_000).output_tpm(5_000);
    let mut c = messages_config(&mock, tenant, upstream);
    c.tenant("t1").keys[0].limits = limits().tpm(100_000).cache_read_weight(100);
    let gw = c.start().await;
    let r = post_messages(
        &gw,
        &messages_body(1000, false),
        "input=7,cache_read=10000,cache_creation=2000",
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-input-tokens-limit"),
        "50000"
    );
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-output-tokens-limit"),
        "5000"
    );
    let _ = r.text().await;
    gw.all_settled().await;
    // The tenant counts every input token.
    assert_eq!(
        gw.used(t1(), BudgetName::Tpm).await,
        12_057,
        "7 + 10000 + 2000 + 50"
    );
    assert_eq!(gw.used(t1(), BudgetName::TokensPerDay).await, 12_057);
    assert_eq!(gw.used(t1(), BudgetName::InputTpm).await, 12_007);
    assert_eq!(gw.used(t1(), BudgetName::OutputTpm).await, 50);
    // The key weights cache reads at 100 per mille.
    let key = Scope::Key("t1".into(), "k1".into());
    assert_eq!(gw.used(key, BudgetName::Tpm).await, 7 + 1000 + 2000 + 50);
    // Anthropic's own limits leave cache reads out.
    assert_eq!(gw.used(claude0(), BudgetName::Tpm).await, 2_057);
    assert_eq!(gw.used(claude0(), BudgetName::InputTpm).await, 2_007);
    assert_eq!(gw.used(claude0(), BudgetName::OutputTpm).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cacheable_prefix_never_makes_a_request_impossible_where_cache_reads_are_left_out() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    let gw = messages_config(&mock, limits().tpm(1_000_000), limits().input_tpm(1000))
        .start()
        .await;
    let uncached = with_system(messages_body(100, false), 3000, false);
    let r = post_messages(&gw, &uncached, "").await;
    assert_eq!(r.status(), 429, "3000 input tokens never fit 1000");
    assert_eq!(header(&r, "x-should-retry").as_deref(), Some("false"));
    let cached = with_system(messages_body(100, false), 3000, true);
    let r = post_messages(&gw, &cached, "input=10,cache_read=3000").await;
    assert_eq!(
        r.status(),
        200,
        "the cacheable prefix is reserved at weight 0"
    );
    let _ = r.text().await;
    gw.all_settled().await;
    assert_eq!(gw.used(claude0(), BudgetName::InputTpm).await, 10);
    assert_eq!(
        gw.used(t1(), BudgetName::Tpm).await,
        3030,
        "the tenant counts the reads"
    );
    // The prefix missed the cache: what was reserved at weight 0 settles as debt.
    let r = post_messages(&gw, &cached, "input=10,cache_creation=3000").await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    gw.all_settled().await;
    assert_eq!(gw.used(claude0(), BudgetName::InputTpm).await, 10 + 3010);
    assert!(
        gw.remaining(claude0(), BudgetName::InputTpm).await < 0,
        "in debt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_budgets_reserve_the_whole_cap_their_provider_counts_at_request_start() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    let gw = messages_config(&mock, limits().tpm(1_000_000), limits().output_tpm(20_000))
        .start()
        .await;
    // The tenant reserves 256 of the stream's 32,000 incrementally;
    // Anthropic counts all 32,000 against its output limit at the start.
    let r = post_messages(&gw, &messages_body(32_000, true), "").await;
    assert_eq!(r.status(), 429, "{}", r.text().await.unwrap_or_default());
    let r = post_messages(&gw, &messages_body(16_000, true), "input=5").await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    gw.all_settled().await;
    // Anthropic adjusts to the actual output at the end: so does its budget.
    assert_eq!(gw.used(claude0(), BudgetName::OutputTpm).await, 40);
    assert_eq!(gw.used(t1(), BudgetName::Tpm).await, 45);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_input_and_output_headers_on_200_and_429() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(200);
    let gw = messages_config(&mock, limits().input_tpm(5000).output_tpm(300), limits())
        .start()
        .await;
    let r = post_messages(&gw, &messages_body(200, false), "input=100").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-input-tokens-limit"),
        "5000"
    );
    let input_left = header_u64(&r, "anthropic-ratelimit-input-tokens-remaining");
    assert!(
        input_left < 5000,
        "after this request's debit: {input_left}"
    );
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-output-tokens-limit"),
        "300"
    );
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-output-tokens-remaining"),
        "100"
    );
    assert!(must_header(&r, "anthropic-ratelimit-output-tokens-reset").ends_with('Z'));
    assert!(
        header(&r, "anthropic-ratelimit-tokens-limit").is_none(),
        "no tpm"
    );
    let _ = r.text().await;
    gw.all_settled().await;
    assert_eq!(gw.used(t1(), BudgetName::InputTpm).await, 100);
    assert_eq!(gw.used(t1(), BudgetName::OutputTpm).await, 200);
    // 200 more output does not fit the 100 left: refused by output_tpm.
    let r = post_messages(&gw, &messages_body(200, false), "").await;
    assert_eq!(r.status(), 429);
    assert!(header_u64(&r, "retry-after") >= 1);
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-output-tokens-remaining"),
        "100"
    );
    assert_eq!(
        must_header(&r, "anthropic-ratelimit-input-tokens-limit"),
        "5000"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("output_tpm"),
        "{v}"
    );
}

/// `gpt-4o-mini` on the self-hosted mock (default output `default_out`),
/// tenant `t1` with `tenant_limits`.
fn chat_config(mock: &MockUpstream, default_out: u64, tenant_limits: Limits) -> TestConfig {
    TestConfig::standard(&mock.base_url(), default_out, tenant_limits)
}

fn chat(content: &str, max_tokens: Option<u64>) -> Value {
    let mut b = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]});
    if let Some(m) = max_tokens {
        b["max_tokens"] = json!(m);
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_and_output_limits_on_an_openai_chat_tenant_admit_refuse_and_settle_each_its_own() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    // A default output of 150 is lowered to fit the output limit's 100.
    let gw = chat_config(&mock, 150, limits().input_tpm(20).output_tpm(100))
        .start()
        .await;
    let first = chat("hi", None);
    let input = chat_input_tokens(&first);
    let r = post_chat(&gw, KEY, &first).await;
    assert_eq!(r.status(), 200);
    let policy = must_header(&r, "ratelimit-policy");
    assert!(
        policy.contains("\"tenant-input-tpm\";q=20;w=60"),
        "{policy}"
    );
    assert!(
        policy.contains("\"tenant-output-tpm\";q=100;w=60"),
        "{policy}"
    );
    let _ = r.text().await;
    assert_eq!(mock.state.requests()[0].body["max_completion_tokens"], 100);
    gw.all_settled().await;
    assert_eq!(gw.used(t1(), BudgetName::InputTpm).await, input);
    assert_eq!(gw.used(t1(), BudgetName::OutputTpm).await, 10);
    // 95 more output does not fit the 90 left; the input would.
    let r = post_chat(&gw, KEY, &chat("hi", Some(95))).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(output_tpm)"),
        "{v}"
    );
    // More output than the output limit holds: never admitted.
    let r = post_chat(&gw, KEY, &chat("hi", Some(101))).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-should-retry").as_deref(), Some("false"));
    // A prompt larger than the input left; its output would fit.
    let long = chat(
        "one two three four five six seven eight nine ten eleven twelve",
        Some(5),
    );
    assert!(chat_input_tokens(&long) > 20 - input);
    let r = post_chat(&gw, KEY, &long).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(input_tpm)"),
        "{v}"
    );
    // Both fit: admitted.
    let r = post_chat(&gw, KEY, &chat("hi", Some(90))).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    gw.all_settled().await;
    assert_eq!(gw.used(t1(), BudgetName::InputTpm).await, 2 * input);
    assert_eq!(gw.used(t1(), BudgetName::OutputTpm).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_extension_debits_output_limits_only() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    let b = json!({"model": "gpt-4o-mini", "stream": true,
                   "messages": [{"role": "user", "content": "hi"}]});
    let input = chat_input_tokens(&b);
    // Room for the input and 5 tokens more: an extension of 256 that
    // debited input limits would be cut off after 5.
    let gw = chat_config(&mock, 16, limits().input_tpm(input + 5).output_tpm(10_000))
        .start()
        .await;
    let r = post_chat(&gw, KEY, &b).await;
    assert_eq!(r.status(), 200);
    let chunks = sse_chunks(&r.bytes().await.unwrap());
    assert_eq!(content_chunks(&chunks), 300, "never cut off");
    gw.all_settled().await;
    assert_eq!(gw.used(t1(), BudgetName::InputTpm).await, input);
    assert_eq!(gw.used(t1(), BudgetName::OutputTpm).await, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cached_tokens_are_inside_the_prompt_and_weighted_per_scope() {
    let upstream = cached_usage_upstream().await;
    let mut c = TestConfig::standard(&upstream, 50, limits().tpm(100_000));
    c.tenant("t1").keys[0].limits = limits().tpm(100_000).cache_read_weight(0);
    c.upstream("mock").kind = Some("openai".into());
    c.upstream("mock").limits = limits().tpm(100_000).input_tpm(100_000);
    let gw = c.start().await;
    let r = post_chat(&gw, KEY, &chat("hi", Some(30))).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    gw.all_settled().await;
    assert_eq!(
        gw.used(t1(), BudgetName::Tpm).await,
        10_359,
        "not 20,677, not 41"
    );
    let key = Scope::Key("t1".into(), "k1".into());
    assert_eq!(
        gw.used(key, BudgetName::Tpm).await,
        41,
        "reads left out on this key"
    );
    let mock = Scope::Upstream("mock".into());
    assert_eq!(
        gw.used(mock.clone(), BudgetName::InputTpm).await,
        10_339,
        "OpenAI counts them"
    );
}

/// An OpenAI-shaped upstream whose answers report 10,339 prompt tokens of
/// which 10,318 cached, and 20 completion tokens.
async fn cached_usage_upstream() -> String {
    async fn answer() -> axum::Json<Value> {
        axum::Json(json!({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10339, "completion_tokens": 20, "total_tokens": 10359,
                      "prompt_tokens_details": {"cached_tokens": 10318}},
        }))
    }
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}
