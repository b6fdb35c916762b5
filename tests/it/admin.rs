//! The admin API: 401 without the token,
//! 404 while disabled, nothing that reveals keys, and budget numbers that
//! match the `x-ratelimit-*` headers of the request made just before, once
//! it settled (frozen clock: no refill in between).

use serde_json::{json, Value};

use crate::support::config::{model, tenant, upstream, RawModel, RawUpstream};
use crate::support::*;
use budgetgate::config::hash_key;

const TOKEN: &str = "admin-secret-token";

/// Upstream `mock` of kind `openai` (unused output is not refunded to it)
/// holds the only TPM bucket, so the response's token headers describe it;
/// key `t1/k1` has the tightest RPM bucket, so the request headers describe it.
fn admin_config(mock: &str) -> TestConfig {
    let mut config = TestConfig::new();
    config.upstreams.push(RawUpstream {
        limits: limits().tpm(2000).max_concurrent(10),
        ..upstream("mock", Kind::Openai, mock)
    });
    config.models.push(RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(100),
        ..model("gpt-4o-mini", &["mock"])
    });
    let mut t1 = tenant("t1", "k1", KEY, limits().rpm(100).tokens_per_day(1000000));
    t1.keys[0].limits = limits().rpm(50);
    t1.model_limits.insert(
        "gpt-4o-mini".into(),
        limits().rpm(1000).tokens_per_day(500000),
    );
    config.with_tenant(t1)
}

fn budget<'a>(body: &'a Value, scope: &str, name: &str) -> &'a Value {
    body["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["scope"] == scope && b["budget"] == name)
        .unwrap_or_else(|| panic!("no {scope} {name} in {body}"))
}

#[tokio::test]
async fn without_the_token_the_admin_api_answers_401_and_when_disabled_404() {
    let mock = start_mock().await;
    let gw = admin_config(&mock.base_url()).start().await;

    // Disabled: as if the routes did not exist.
    for path in ["/admin/v1/policy", "/admin/v1/tenants/t1/budgets"] {
        let r = admin_get(&gw, path, Some(TOKEN)).await;
        assert_eq!(r.status(), 404, "{path}");
    }

    gw.state.set_admin_token(Some(TOKEN));
    for path in [
        "/admin/v1/policy",
        "/admin/v1/tenants/t1/budgets",
        "/admin/v1/upstreams/mock/budgets",
    ] {
        for token in [
            None,
            Some("wrong"),
            Some(KEY),
            Some(""),
            Some("admin-secret-tokenX"),
        ] {
            let r = admin_get(&gw, path, token).await;
            assert_eq!(r.status(), 401, "{path} {token:?}");
            assert_eq!(
                must_header(&r, "www-authenticate"),
                "Bearer realm=\"budgetgate-admin\""
            );
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "invalid_admin_token");
            assert_eq!(body["error"]["type"], "invalid_request_error");
            assert!(body["error"]["param"].is_null());
        }
        // Not a bearer token.
        let r = reqwest::Client::new()
            .get(format!("{}{path}", gw.root_url()))
            .basic_auth("admin", Some(TOKEN))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(admin_get(&gw, path, Some(TOKEN)).await.status(), 200);
    }
    let r = admin_get(&gw, "/admin/v1/tenants/nobody/budgets", Some(TOKEN)).await;
    assert_eq!(r.status(), 404);
    let r = admin_get(&gw, "/admin/v1/upstreams/nowhere/budgets", Some(TOKEN)).await;
    assert_eq!(r.status(), 404);

    gw.state.set_admin_token(None);
    assert_eq!(
        admin_get(&gw, "/admin/v1/policy", Some(TOKEN))
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn the_policy_endpoint_names_things_and_reveals_no_key() {
    let mock = start_mock().await;
    let gw = admin_config(&mock.base_url()).start().await;
    gw.state.set_admin_token(Some(TOKEN));
    let r = admin_get(&gw, "/admin/v1/policy", Some(TOKEN)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains(KEY));
    assert!(!text.contains(&hash_key(KEY)));
    assert!(!text.contains(TOKEN));
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["version"], json!(gw.state.policy.load().version));
    assert_eq!(body["tenants"][0]["name"], "t1");
    assert_eq!(body["tenants"][0]["keys"], json!(["k1"]));
    assert_eq!(body["models"][0]["name"], "gpt-4o-mini");
    assert_eq!(body["models"][0]["upstreams"], json!(["mock"]));
    assert_eq!(
        body["upstreams"][0],
        json!({"name": "mock", "kind": "openai"})
    );
}

#[tokio::test]
async fn budget_numbers_match_the_headers_of_the_request_before_once_settled() {
    let mock = start_mock().await;
    let gw = admin_config(&mock.base_url()).start().await;
    gw.state.set_admin_token(Some(TOKEN));

    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "max_tokens": 50,
            "messages": [{"role": "user", "content": "What is a token bucket?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let limit_tokens = must_header(&r, "x-ratelimit-limit-tokens");
    let remaining_tokens: i64 = must_header(&r, "x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    let reset_tokens = must_header(&r, "x-ratelimit-reset-tokens");
    let remaining_requests: i64 = must_header(&r, "x-ratelimit-remaining-requests")
        .parse()
        .unwrap();
    let reset_requests = must_header(&r, "x-ratelimit-reset-requests");
    let resp: Value = r.json().await.unwrap();
    let actual = resp["usage"]["total_tokens"].as_i64().unwrap();
    gw.settled().await;
    assert_eq!(limit_tokens, "2000", "the upstream's TPM is the only one");

    // Upstream: OpenAI-kind budgets keep the reservation (no refund), so
    // after settlement they read exactly what the headers said.
    let r = admin_get(&gw, "/admin/v1/upstreams/mock/budgets", Some(TOKEN)).await;
    assert_eq!(r.status(), 200);
    let up: Value = r.json().await.unwrap();
    assert_eq!(up["upstream"], "mock");
    assert_eq!(up["policy_version"], json!(gw.state.policy.load().version));
    let tpm = budget(&up, "upstream:mock", "tpm");
    assert_eq!(tpm["remaining"], json!(remaining_tokens));
    assert_eq!(tpm["limit"], 2000);
    assert_eq!(tpm["capacity"], 2000);
    assert_eq!(tpm["kind"], "bucket");
    assert_eq!(tpm["reset"], json!(reset_tokens));
    let reset_micros = tpm["reset_micros"].as_u64().unwrap();
    assert_eq!(
        json!(budgetgate::dialects::rate_limit_headers::go_duration(
            reset_micros
        )),
        tpm["reset"]
    );
    // The slot was freed at settlement.
    let slots = budget(&up, "upstream:mock", "max_concurrent");
    assert_eq!(slots["remaining"], 10);
    assert_eq!(slots["limit"], 10);
    assert_eq!(slots["kind"], "concurrency");
    let reserved = 2000 - remaining_tokens;
    assert!(reserved >= actual, "estimate {reserved} < actual {actual}");

    // Tenant: request counts are never refunded, so the key's RPM matches
    // the header; token quotas got the unused reservation back.
    let r = admin_get(&gw, "/admin/v1/tenants/t1/budgets", Some(TOKEN)).await;
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["tenant"], "t1");
    let key_rpm = budget(&t, "key:t1/k1", "rpm");
    assert_eq!(key_rpm["remaining"], json!(remaining_requests));
    assert_eq!(key_rpm["remaining"], 49);
    assert_eq!(key_rpm["reset"], json!(reset_requests));
    assert_eq!(budget(&t, "tenant:t1", "rpm")["remaining"], 99);
    assert_eq!(
        budget(&t, "tenant_model:t1/gpt-4o-mini", "rpm")["remaining"],
        999
    );
    let day = budget(&t, "tenant:t1", "tokens_per_day");
    assert_eq!(day["remaining"], json!(1_000_000 - actual));
    assert_eq!(day["kind"], "quota");
    assert_eq!(day["window"], "day");
    // NOON: 12 h to the end of the UTC day.
    assert_eq!(day["reset_micros"], json!(12u64 * 3600 * 1_000_000));
    assert_eq!(day["reset"], "12h0m0s");
    let tm_day = budget(&t, "tenant_model:t1/gpt-4o-mini", "tokens_per_day");
    assert_eq!(tm_day["remaining"], json!(500_000 - actual));
    assert_eq!(tm_day["capacity"], 500_000);
    // Every budget of the tenant: tenant (2) + key (1) + tenant×model (2).
    assert_eq!(t["budgets"].as_array().unwrap().len(), 5, "{t}");
}

#[tokio::test]
async fn input_and_output_limits_are_shown_like_tpm_each_with_its_own_use() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(7);
    let mut config = admin_config(&mock.base_url());
    config.upstream("mock").limits = limits()
        .input_tpm(3000)
        .output_tpm(900)
        .output_tpm_burst(1200);
    config.tenant("t1").limits = limits().input_tpm(5000).output_tpm(400);
    let gw = config.start().await;
    gw.state.set_admin_token(Some(TOKEN));
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 50,
        "messages": [{"role": "user", "content": "What is a token bucket?"}]});
    let input = chat_input_tokens(&body) as i64;
    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    gw.settled().await;
    let t: Value = admin_get(&gw, "/admin/v1/tenants/t1/budgets", Some(TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let i = budget(&t, "tenant:t1", "input_tpm");
    assert_eq!(
        (i["limit"].clone(), i["kind"].clone(), i["unit"].clone()),
        (json!(5000), json!("bucket"), json!("tokens"))
    );
    assert_eq!(i["remaining"], json!(5000 - input));
    assert_eq!(budget(&t, "tenant:t1", "output_tpm")["remaining"], 400 - 7);
    let up: Value = admin_get(&gw, "/admin/v1/upstreams/mock/budgets", Some(TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        budget(&up, "upstream:mock", "input_tpm")["remaining"],
        json!(3000 - input)
    );
    let out = budget(&up, "upstream:mock", "output_tpm");
    assert_eq!(out["capacity"], 1200);
    // OpenAI counts the cap at request start and never refunds it.
    assert_eq!(out["remaining"], 1200 - 50);
}
