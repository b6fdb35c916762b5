//! Dollar budgets (docs/MONEY.md) through the gateway to the
//! simulated upstream, on the memory store: admissions and refusals by
//! the price arithmetic to the micro-dollar, the refusal's shape and
//! headers, the admin API's dollar strings and the spend counter. Every
//! expected figure is computed here from the prices and the usage the
//! upstream reported. Faults guarded against: a dollar budget counting
//! tokens, a deny cache comparing µ$ with tokens, a refusal that says
//! nothing in dollars, headers that read as requests.

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::money::format_usd;
use serde_json::{json, Value};

use crate::support::*;

/// gpt-4o-mini's prices, µ$ per million tokens ($0.15 in, $0.60 out).
pub const IN: u64 = 150_000;
pub const OUT: u64 = 600_000;

/// `ceil((input × $0.15 + output × $0.60) / 10^6)` µ$.
pub fn cost(input: u64, output: u64) -> u64 {
    (input * IN + output * OUT).div_ceil(1_000_000)
}

/// The standard config with tenant `t1` renamed `tenant` (its own metric
/// series in this shared test process) and gpt-4o-mini priced $0.15 / $0.60
/// with room for large caps.
pub fn priced(mock: &str, tenant: &str, tenant_limits: Limits) -> TestConfig {
    let mut c = TestConfig::standard(mock, 16, tenant_limits);
    c.tenant("t1").name = tenant.into();
    let m = c.model("gpt-4o-mini");
    m.price = Some(price("0.15", "0.60"));
    m.max_output_tokens = Some(200_000);
    c
}

fn usd_day(tenant: &str) -> (Scope, BudgetName) {
    (Scope::Tenant(tenant.into()), BudgetName::UsdPerDay)
}

async fn used(gw: &Gateway, tenant: &str) -> u64 {
    let (scope, name) = usd_day(tenant);
    gw.used(scope, name).await
}

fn usage(body: &Value) -> (u64, u64) {
    let n = |k: &str| {
        body["usage"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage.{k}: {body}"))
    };
    (n("prompt_tokens"), n("completion_tokens"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dollar_a_day_admits_and_refuses_exactly_by_the_price_arithmetic() {
    let mock = start_mock().await;
    let tenant = "payer-day";
    let gw = priced(&mock.base_url(), tenant, limits().usd_per_day("1.00"))
        .start()
        .await;
    let limit = 1_000_000u64;

    // Eight answers at the model's largest cap, each reporting all of it
    // (an upstream's usage above the cap sent is not trusted): settled at
    // their price.
    mock.state.set_usage_override(None, Some(200_000));
    let mut spent = 0;
    for _ in 0..8 {
        let r = post_chat(&gw, KEY, &hi(200_000)).await;
        assert_eq!(r.status(), 200);
        let (prompt, completion) = usage(&r.json().await.unwrap());
        assert_eq!(completion, 200_000);
        spent += cost(prompt, completion);
    }
    gw.settled().await;
    mock.state.set_usage_override(None, None);
    assert_eq!(
        used(&gw, tenant).await,
        spent,
        "settled at $0.15 / $0.60 per million"
    );
    let left = limit - spent;
    assert!(left > 1000 && left < 100_000, "{left} µ$ left");

    // The smallest cap whose reservation costs more than what is left.
    let input = chat_input_tokens(&hi(1));
    let over = (1..).find(|&m| cost(input, m) > left).unwrap();
    assert!(cost(input, over - 1) <= left);
    let r = post_chat(&gw, KEY, &hi(over)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(must_header(&r, "x-should-retry"), "false");
    // From noon UTC to the end of the day.
    assert_eq!(header_u64(&r, "retry-after"), 12 * 3600);
    let policy = must_header(&r, "ratelimit-policy");
    assert!(
        policy.contains("\"tenant-usd-per-day\";q=1000000;w=86400;budgetgate-unit=usd-micros"),
        "{policy}"
    );
    let state = must_header(&r, "ratelimit");
    assert!(
        state.contains(&format!("\"tenant-usd-per-day\";r={left};t=43200")),
        "{state}"
    );
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "insufficient_quota");
    let msg = err["error"]["message"].as_str().unwrap();
    for part in [
        "tenant:payer-day (usd_per_day)".to_string(),
        "limit $1.00".to_string(),
        format!("spent ${}", format_usd(spent as i64)),
        format!("needs ${}", format_usd(cost(input, over) as i64)),
    ] {
        assert!(msg.contains(&part), "{part:?} not in {msg:?}");
    }

    // One token less fits: admitted, past the deny cache that recorded the
    // refusal (it compares µ$ with µ$).
    let r = post_chat(&gw, KEY, &hi(over - 1)).await;
    assert_eq!(r.status(), 200);
    let (p2, c2) = usage(&r.json().await.unwrap());
    gw.settled().await;
    let total = spent + cost(p2, c2);
    assert_eq!(
        used(&gw, tenant).await,
        total,
        "refunded to the actual cost"
    );

    // The admin API in dollars, and the spend counter in µ$.
    gw.state.set_admin_token(Some("admin-secret"));
    let r = admin_get(
        &gw,
        &format!("/admin/v1/tenants/{tenant}/budgets"),
        Some("admin-secret"),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    let b = v["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["budget"] == "usd_per_day")
        .unwrap_or_else(|| panic!("no usd_per_day in {v}"))
        .clone();
    assert_eq!(b["unit"], "usd_micros");
    assert_eq!(b["usd"]["limit"], "1.00");
    assert_eq!(b["usd"]["spent"], format_usd(total as i64));
    assert_eq!(b["usd"]["remaining"], format_usd((limit - total) as i64));
    let s = scrape(&gw).await;
    let counted = sample_sum(
        &s,
        "budgetgate_settled_spend_micro_usd_total",
        &[("tenant", tenant)],
    );
    assert_eq!(counted as u64, total);
}

/// A request of every dialect settles its reported usage at its price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_settles_at_its_price() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    let tenant = "payer-dialects";
    let mut c = priced(&mock.base_url(), tenant, limits().usd_per_month("5"));
    c.model("text-embedding-3-small").price = Some(price("0.02", "0"));
    let gw = c.start().await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        client
            .post(format!("{}/{path}", gw.base_url()))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    let scope = Scope::Tenant(tenant.into());
    let mut total = 0;

    let r = post("chat/completions", json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30})).await.unwrap();
    assert_eq!(r.status(), 200);
    let (p, o) = usage(&r.json().await.unwrap());
    total += cost(p, o);

    let r = post(
        "completions",
        json!({"model": "gpt-4o-mini", "prompt": "Say something", "max_tokens": 25}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let (p, o) = usage(&r.json().await.unwrap());
    assert_eq!(o, 25);
    total += cost(p, o);

    let r = post(
        "embeddings",
        json!({"model": "text-embedding-3-small", "input": "a few words to embed"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    total += (v["usage"]["prompt_tokens"].as_u64().unwrap() * 20_000).div_ceil(1_000_000);

    // Responses: 3 cached input tokens at $0.15 (no cached price given:
    // no discount), 5 reasoning tokens at the output price.
    mock.state.set_responses_details(3, 5);
    let r = post(
        "responses",
        json!({"model": "gpt-4o-mini", "input": "hello there", "max_output_tokens": 64}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let (i, o) = (
        v["usage"]["input_tokens"].as_u64().unwrap(),
        v["usage"]["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 5);
    total += cost(i, o);

    gw.settled().await;
    assert_eq!(gw.used(scope, BudgetName::UsdPerMonth).await, total);
}

/// Under an enforced dollar budget a request that cannot be priced is
/// refused in its dialect's shape before anything is reserved or sent;
/// the same request from a tenant without a dollar budget goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpriceable_requests_are_refused_never_admitted_unmetered() {
    let mock = start_mock().await;
    let mut c = priced(&mock.base_url(), "payer-strict", limits().usd_per_day("1"));
    c.model("gpt-4o-mini").price = None;
    let c = c.with_tenant(config::tenant(
        "tokens-only",
        "k2",
        "sk-tokens-only",
        limits().tpm(100_000),
    ));
    let gw = c.start().await;

    let r = post_chat(&gw, KEY, &hi(10)).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "unpriceable_request");
    assert_eq!(v["error"]["param"], "model");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`gpt-4o-mini` has no price")
            && msg.contains("tenant:payer-strict (usd_per_day)"),
        "{msg}"
    );
    assert_eq!(mock.state.request_count(), 0, "nothing sent upstream");
    assert_eq!(used(&gw, "payer-strict").await, 0, "nothing reserved");

    assert_eq!(
        post_chat(&gw, "sk-tokens-only", &hi(10)).await.status(),
        200
    );
}

/// A priced model asked for an unpriced service tier, and a Messages
/// server tool: refused (the latter in Anthropic's error shape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpriced_tiers_and_per_use_tools_are_refused_in_the_dialects_shape() {
    let mock = start_mock().await;
    let gw = priced(&mock.base_url(), "payer-tiers", limits().usd_per_day("1"))
        .start()
        .await;
    let mut flex = hi(10);
    flex["service_tier"] = json!("flex");
    let r = post_chat(&gw, KEY, &flex).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"]["code"].as_str(), v["error"]["param"].as_str()),
        (Some("unpriceable_request"), Some("service_tier"))
    );
    let mut auto = hi(10);
    auto["service_tier"] = json!("auto");
    assert_eq!(post_chat(&gw, KEY, &auto).await.status(), 200);

    let mut c = super::dollars_flow::claude_config(&mock, "payer-tools");
    c.model("claude-test").allow_server_tools = Some(true);
    let gw = c.start().await;
    let r = reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": "news?"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server tools are billed per use"),
        "{v}"
    );
}

/// A tenant in shadow mode: its dollar budget is evaluated and reports
/// what it would refuse, and refuses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_dollar_budgets_report_and_never_refuse() {
    let mock = start_mock().await;
    let tenant = "payer-shadow";
    let mut c = priced(&mock.base_url(), tenant, limits().usd_per_day("0.0001"));
    c.tenant(tenant).shadow = Some(true);
    let gw = c.start().await;
    // Each request reserves more than 100 µ$: 300 output tokens at $0.60 per million.
    for _ in 0..3 {
        assert_eq!(post_chat(&gw, KEY, &hi(300)).await.status(), 200);
    }
    let s = scrape(&gw).await;
    let denied = sample_sum(
        &s,
        "budgetgate_shadow_denials_total",
        &[("tenant", tenant), ("budget", "usd_per_day")],
    );
    assert_eq!(denied, 3.0);
}
