//! Upstream deployments (issue: per-provider budgets, budget-aware routing
//! and fallback, Azure OpenAI). Two simulated upstreams A and B serve one
//! model; the clock is frozen.

use crate::support::config::{model, tenant, upstream, RawModel, RawUpstream};
use crate::support::mock_upstream::{self, Fault, MockUpstream};
use crate::support::*;
use budgetgate::budget::{BudgetName, Scope};
use serde_json::{json, Value};

/// Two deployments of `gpt-4o-mini` (A then B, each `tpm = 1000`) and
/// tenant `t1` with `tenant_limits`.
fn two_deployments(a: &str, b: &str, kind: Kind, tenant_limits: Limits) -> TestConfig {
    let mut config = TestConfig::new();
    for (name, url) in [("A", a), ("B", b)] {
        config.upstreams.push(RawUpstream {
            limits: limits().tpm(1000),
            ..upstream(name, kind, url)
        });
    }
    config.models.push(RawModel {
        default_max_output_tokens: Some(100),
        ..model("gpt-4o-mini", &["A", "B"])
    });
    config.with_tenant(tenant("t1", "k1", KEY, tenant_limits))
}

/// A request costing exactly 100 tokens, with a mock that uses all of it.
fn hundred_token_body(mocks: &[&MockUpstream]) -> Value {
    let mut body =
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]});
    let input = chat_input_tokens(&body);
    body["max_tokens"] = json!(100 - input);
    for m in mocks {
        m.state.set_output_tokens(100 - input);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_uses_every_deployment_and_never_pushes_one_past_its_quota() {
    let (a, b) = (start_mock().await, start_mock().await);
    let gw = two_deployments(
        &a.base_url(),
        &b.base_url(),
        Kind::Openai,
        limits().tpm(5000),
    )
    .start()
    .await;
    let body = hundred_token_body(&[&a, &b]);
    for i in 0..20 {
        let (s, v, _) = post_chat_json(&gw, KEY, &body).await;
        assert_eq!(s, 200, "request {i}: {v}");
    }
    assert_eq!(a.state.request_count(), 10, "A holds exactly 1000 tokens");
    assert_eq!(b.state.request_count(), 10, "B holds exactly 1000 tokens");
    let (s, v, h) = post_chat_json(&gw, KEY, &body).await;
    assert_eq!(s, 429, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("upstream:"),
        "the refusal names the upstream budget: {msg}"
    );
    assert!(h.get("retry-after").is_some());
    assert_eq!(a.state.request_count() + b.state.request_count(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_429_moves_the_request_to_the_next_deployment_and_cools_the_first() {
    let (a, b) = (start_mock().await, start_mock().await);
    let gw = two_deployments(
        &a.base_url(),
        &b.base_url(),
        Kind::SelfHosted,
        limits().tpm(5000).rpm(100),
    )
    .start()
    .await;
    let body = hundred_token_body(&[&a, &b]);
    a.state.set_fault(Some(Fault::RateLimited));
    let (s, v, _) = post_chat_json(&gw, KEY, &body).await;
    assert_eq!(s, 200, "served by B: {v}");
    assert_eq!((a.state.request_count(), b.state.request_count()), (1, 1));
    gw.settled().await;
    assert_eq!(
        gw.remaining(Scope::Tenant("t1".into()), BudgetName::Tpm)
            .await,
        4900,
        "tokens charged once"
    );
    assert_eq!(
        gw.remaining(Scope::Tenant("t1".into()), BudgetName::Rpm)
            .await,
        99,
        "request counted once"
    );
    assert_eq!(
        gw.remaining(Scope::Upstream("A".into()), BudgetName::Tpm)
            .await,
        1000,
        "A refunded"
    );
    a.state.set_fault(None);
    for _ in 0..3 {
        gw.clock.advance(600_000);
        assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
    }
    assert_eq!(
        a.state.request_count(),
        1,
        "A gets no traffic for its retry-after (2 s)"
    );
    gw.clock.advance(200_000); // 2.0 s since the 429
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
    assert_eq!(
        a.state.request_count(),
        2,
        "A is used again once the cool-down ends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_that_is_down_is_skipped_and_leaks_no_tokens() {
    let b = start_mock().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gw = two_deployments(
        &format!("http://127.0.0.1:{dead}/v1"),
        &b.base_url(),
        Kind::SelfHosted,
        limits().tpm(5000),
    )
    .start()
    .await;
    let body = hundred_token_body(&[&b]);
    let (s, v, _) = post_chat_json(&gw, KEY, &body).await;
    assert_eq!(s, 200, "{v}");
    gw.settled().await;
    assert_eq!(
        gw.remaining(Scope::Upstream("A".into()), BudgetName::Tpm)
            .await,
        1000
    );
    assert_eq!(
        gw.remaining(Scope::Upstream("B".into()), BudgetName::Tpm)
            .await,
        900
    );
    assert_eq!(
        gw.remaining(Scope::Tenant("t1".into()), BudgetName::Tpm)
            .await,
        4900
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_output_is_refunded_to_self_hosted_upstreams_only() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let mut config = TestConfig::new();
    for (name, kind) in [("openai-kind", Kind::Openai), ("vllm", Kind::SelfHosted)] {
        config.upstreams.push(RawUpstream {
            limits: limits().tpm(10000),
            ..upstream(name, kind, &mock.base_url())
        });
    }
    config.models.push(RawModel {
        default_max_output_tokens: Some(100),
        ..model("gpt-4o-mini", &["openai-kind"])
    });
    config.models.push(RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(100),
        ..model("local-llama", &["vllm"])
    });
    let config = config.with_tenant(tenant("t1", "k1", KEY, limits()));
    let gw = config.start().await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let e = chat_input_tokens(&body) + 100;
    let a = chat_input_tokens(&body) + 10;
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
    assert_eq!(
        post_chat_json(
            &gw,
            KEY,
            &json!({"model": "local-llama", "messages": [{"role": "user", "content": "hi"}]})
        )
        .await
        .0,
        200
    );
    gw.settled().await;
    assert_eq!(
        gw.remaining(Scope::Upstream("openai-kind".into()), BudgetName::Tpm)
            .await,
        10000 - e as i64
    );
    assert_eq!(
        gw.remaining(Scope::Upstream("vllm".into()), BudgetName::Tpm)
            .await,
        10000 - a as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_only_upstreams_get_the_cap_as_max_tokens() {
    let mock = start_mock().await;
    let mut config = TestConfig::standard(&mock.base_url(), 100, limits().tpm(10000));
    config.upstream("mock").max_tokens_only = Some(true);
    let gw = config.start().await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9});
    assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
    let sent = &mock.state.requests()[0].body;
    assert_eq!(sent["max_tokens"], 9);
    assert!(sent.get("max_completion_tokens").is_none(), "{sent}");
    let n3 =
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "n": 3});
    config.upstream("mock").supports_n = Some(false);
    let gw2 = config.start().await;
    let (s, v, _) = post_chat_json(&gw2, KEY, &n3).await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("n")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_upstreams_get_their_url_form_and_key_and_the_azure_sdk_works_inbound() {
    let mock = mock_upstream::start(mock_upstream::MockConfig {
        expect_azure: Some(mock_upstream::AzureExpect {
            api_version: "2024-10-21".into(),
            api_key: "azure-secret-key-1".into(),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    // SAFETY: a variable only this test reads, set before any thread reads it.
    unsafe { std::env::set_var("BUDGETGATE_TEST_AZURE_KEY", "azure-secret-key-1") };
    let mut config = TestConfig::new();
    config.upstreams.push(RawUpstream {
        api_key_env: Some("BUDGETGATE_TEST_AZURE_KEY".into()),
        api_version: Some("2024-10-21".into()),
        ..upstream("azure-east", Kind::Azure, &mock.root_url())
    });
    config.models.push(RawModel {
        upstream_model: Some("my-4o-deployment".into()),
        ..model("gpt-4o-mini", &["azure-east"])
    });
    let gw = config
        .with_tenant(tenant("t1", "k1", KEY, limits()))
        .start()
        .await;
    let r = run_python("sdk_azure.py", &gw.root_url(), &[]).await.json();
    assert!(!r["content"].as_str().unwrap().is_empty());
    assert_eq!(r["content"], r["stream"]);
    let reqs = mock.state.requests();
    assert_eq!(reqs.len(), 2);
    for req in &reqs {
        assert_eq!(
            req.path,
            "/openai/deployments/my-4o-deployment/chat/completions"
        );
        assert_eq!(req.query.as_deref(), Some("api-version=2024-10-21"));
        assert_eq!(req.header("api-key"), Some("azure-secret-key-1"));
        assert!(req.header("authorization").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_keys_never_reach_responses_or_logs() {
    let mock = start_mock().await;
    let secret = "sk-upstream-SECRET-4242";
    let dir = tempfile::tempdir().unwrap();
    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().tpm(100000));
    let up = config.upstream("mock");
    up.kind = Some("openai".into());
    up.api_key_env = Some("BG_SECRET_KEY".into());
    let gw = GatewayProcess::start(
        &config.write(dir.path()),
        &[("BG_SECRET_KEY", secret), ("RUST_LOG", "debug")],
    )
    .await;
    let addr = gw.root.clone();
    let client = reqwest::Client::new();
    let mut seen = String::new();
    for fault in [
        None,
        Some(Fault::Unauthorized),
        Some(Fault::ServerError),
        Some(Fault::BadRequest),
    ] {
        mock.state.set_fault(fault);
        for stream in [false, true] {
            let r = client
                .post(format!("{addr}/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": stream}))
                .send()
                .await
                .unwrap();
            seen.push_str(&format!("{:?}", r.headers()));
            seen.push_str(&r.text().await.unwrap());
        }
    }
    assert!(mock
        .state
        .requests()
        .iter()
        .all(|r| r.header("authorization") == Some(&format!("Bearer {secret}"))));
    // Every request's final line (the one with an outcome) is in, and
    // with it every line written before.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while gw
        .logs()
        .iter()
        .filter(|l| l.pointer("/fields/outcome").is_some())
        .count()
        < 8
    {
        assert!(std::time::Instant::now() < deadline, "{}", gw.dump_logs());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    seen.push_str(&gw.dump_logs());
    assert!(seen.contains("request finished"), "logs were captured");
    assert!(!seen.contains(secret), "the upstream key leaked");
    assert!(!seen.contains(KEY), "the client key leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_utilised_routing_prefers_the_deployment_with_most_spare_share() {
    let (a, b) = (start_mock().await, start_mock().await);
    let mut config = two_deployments(
        &a.base_url(),
        &b.base_url(),
        Kind::Openai,
        limits().tpm(50000),
    );
    config.upstream("B").limits = limits().tpm(2000);
    config.model("gpt-4o-mini").routing = Some("least_utilised".into());
    let gw = config.start().await;
    let body = hundred_token_body(&[&a, &b]);
    // A: 1000, B: 2000. Shares after each request: A .9/B 1 → B; A .9/B .95 → B; A .9/B .9 → A (tie keeps order).
    for _ in 0..4 {
        assert_eq!(post_chat_json(&gw, KEY, &body).await.0, 200);
    }
    assert_eq!((a.state.request_count(), b.state.request_count()), (2, 2));
    // Priority order would have sent all four to A.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_request_ids_are_echoed_and_organisation_headers_are_dropped_unless_configured() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10000))
        .start()
        .await;
    let send = |gw_url: String, rid: Option<&'static str>| async move {
        let mut r = reqwest::Client::new()
            .post(format!("{gw_url}/chat/completions"))
            .bearer_auth(KEY)
            .header("openai-organization", "org-client")
            .json(
                &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
            );
        if let Some(id) = rid {
            r = r.header("x-request-id", id);
        }
        r.send().await.unwrap()
    };
    let r = send(gw.base_url(), Some("client-trace-123")).await;
    assert_eq!(r.headers()["x-request-id"], "client-trace-123");
    assert!(r.headers().get("x-reservation-id").is_some());
    assert!(
        r.headers().get("openai-organization").is_none(),
        "upstream organisation not relayed"
    );
    assert!(
        r.headers().get("set-cookie").is_none(),
        "upstream cookies not relayed"
    );
    let r2 = send(gw.base_url(), None).await;
    assert_eq!(
        r2.headers()["x-request-id"],
        r2.headers()["x-reservation-id"]
    );
    let reqs = mock.state.requests();
    assert_eq!(
        reqs[0].header("x-request-id"),
        Some("client-trace-123"),
        "forwarded upstream"
    );
    assert!(reqs
        .iter()
        .all(|r| r.header("openai-organization").is_none()));

    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10000));
    config.upstream("mock").forward_client_headers = vec!["OpenAI-Organization".into()];
    let gw2 = config.start().await;
    send(gw2.base_url(), None).await;
    assert_eq!(
        mock.state
            .requests()
            .last()
            .unwrap()
            .header("openai-organization"),
        Some("org-client")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_follows_the_providers_remaining_tokens_when_configured() {
    let mock = start_mock().await; // reports x-ratelimit-remaining-tokens: 999000
    let mut config = TestConfig::standard(&mock.base_url(), 50, limits().tpm(100000));
    let up = config.upstream("mock");
    up.learn_from_headers = Some(true);
    up.limits = limits().tpm(2000000);
    let gw = config.start().await;
    assert_eq!(
        post_chat_json(
            &gw,
            KEY,
            &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
        )
        .await
        .0,
        200
    );
    gw.settled().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = gw
            .remaining(Scope::Upstream("mock".into()), BudgetName::Tpm)
            .await;
        if r == 999_000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "remaining stayed at {r}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_reach_the_upstream_untouched() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 50, limits().tpm(100000))
        .start()
        .await;
    let extra = json!({
        "seed": 12345678901234567u64,
        "temperature": 0.25,
        "logit_bias": {"50256": -100},
        "metadata": {"zeta": [1, {"nested": "é ✓"}], "alpha": null},
        "user": "user-42",
        "response_format": {"type": "json_object"},
    });
    let mut body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": true,
        "stream_options": {"include_usage": false, "vendor_flag": 7}});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    let sent = &mock.state.requests()[0].body;
    for (k, v) in extra.as_object().unwrap() {
        assert_eq!(&sent[k], v, "field {k} changed on the way");
    }
    assert_eq!(sent["messages"], body["messages"]);
    assert_eq!(
        sent["stream_options"],
        json!({"include_usage": true, "vendor_flag": 7}),
        "only include_usage is forced"
    );
    assert!(
        sent.get("max_completion_tokens").is_none(),
        "an uncapped stream goes upstream uncapped: {sent}"
    );
}
