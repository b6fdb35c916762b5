//! Nested tenants through the gateway: a request
//! reserves on its key, its tenant and every ancestor in one call, a
//! refusal names the refusing level and the request's tenant in each
//! dialect's error shape, settlement refunds every level it reserved on
//! even after a reload moved the tenant, and the admin API shows the
//! ancestors' budgets. The clock is frozen: nothing refills.

use std::sync::Arc;

use budgetgate::budget::{BudgetName, Scope};
use serde_json::{json, Value};

use crate::support::*;

const ML_KEY: &str = "sk-ml-team";
const RESEARCH_KEY: &str = "sk-research-team";
const ORG_TPD: u64 = 10_000;

/// `acme` (no keys: a pure budget holder, `tokens_per_day` [`ORG_TPD`])
/// with children `ml` (key `k-ml` with its own `tpm`) and `research`.
fn org(mock: &str) -> TestConfig {
    let mut c = TestConfig::standard(mock, 100, limits());
    c.tenants.push(config::RawTenant {
        name: "acme".into(),
        limits: limits().tokens_per_day(ORG_TPD).rpm(1000),
        ..Default::default()
    });
    let mut ml = config::tenant("ml", "k-ml", ML_KEY, limits().tpm(50_000).rpm(1000));
    ml.parent = Some("acme".into());
    ml.keys[0].limits = limits().tpm(40_000);
    c.tenants.push(ml);
    let mut research = config::tenant("research", "k-r", RESEARCH_KEY, limits());
    research.parent = Some("acme".into());
    c.tenants.push(research);
    c
}

fn tenant(name: &str) -> Scope {
    Scope::Tenant(name.into())
}

/// A chat request whose answer uses exactly what it reserves (the mock
/// answers `max_tokens` tokens): its tokens, input included.
fn exact(max_tokens: u64) -> (Value, u64) {
    let body = hi(max_tokens);
    let tokens = chat_input_tokens(&body) + max_tokens;
    (body, tokens)
}

/// Fault: the org's budget was never consulted for a child's key, so a
/// team with room spent what the organisation no longer had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_key_is_refused_by_its_exhausted_org_although_the_team_has_room() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(1000);
    let gw = org(&mock.base_url()).start().await;
    // The sibling team spends the organisation's day but for a few tokens.
    let (body, e) = exact(1000);
    let fits = ORG_TPD / e;
    for _ in 0..fits {
        assert_eq!(post_chat(&gw, RESEARCH_KEY, &body).await.status(), 200);
    }
    gw.settled().await;
    assert_eq!(
        gw.remaining(tenant("acme"), BudgetName::TokensPerDay).await,
        (ORG_TPD - fits * e) as i64
    );
    let ml_before = gw.remaining(tenant("ml"), BudgetName::Tpm).await;
    assert!(ml_before as u64 >= e, "the team has room");

    let (status, v, h) = post_chat_json(&gw, ML_KEY, &body).await;
    assert_eq!(status, 429, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tenant:acme (tokens_per_day) for tenant ml, child of acme"),
        "{message}"
    );
    assert_eq!(v["error"]["code"], "insufficient_quota");
    assert_eq!(h["x-should-retry"], "false");
    // Nothing was debited anywhere: the reservation is all-or-nothing.
    assert_eq!(gw.remaining(tenant("ml"), BudgetName::Tpm).await, ml_before);
    assert_eq!(
        gw.remaining(Scope::Key("ml".into(), "k-ml".into()), BudgetName::Tpm)
            .await,
        40_000
    );
    assert_eq!(mock.state.request_count() as u64, fits);

    // Embeddings (another OpenAI body) are refused by the org the same way.
    let (status, v) = post_raw(
        &gw,
        "/embeddings",
        Some(ML_KEY),
        serde_json::to_vec(
            &json!({"model": "text-embedding-3-small", "input": "hello ".repeat(2000)}),
        )
        .unwrap(),
    )
    .await;
    assert_eq!(status, 429, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tenant:acme (tokens_per_day) for tenant ml, child of acme"));
}

/// The same refusal in Anthropic's error shape on `/v1/messages`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_org_refusal_keeps_the_anthropic_error_shape() {
    let mock = start_mock().await;
    let mut c = org(&mock.base_url());
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        ..config::upstream("claude", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        token_ratio: Some(1000),
        max_output_tokens: Some(64000),
        ..config::model("claude-test", &["claude"])
    });
    c.tenant("acme").limits = limits().tokens_per_day(50);
    let gw = c.start().await;
    let r = reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", ML_KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-test", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let r2 = reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", ML_KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-test", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    // The first may fit the 50 tokens; the second cannot.
    let refused = if r.status() == 429 { r } else { r2 };
    assert_eq!(refused.status(), 429);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tenant:acme (tokens_per_day) for tenant ml, child of acme"),
        "{message}"
    );
}

/// `org` with a third level: `acme` > `ml` > `vision`, each with a `tpm`.
fn three_levels(mock: &str) -> TestConfig {
    let mut c = org(mock);
    c.tenant("acme").limits = limits().tpm(90_000);
    let mut vision = config::tenant("vision", "k-v", "sk-vision", limits().tpm(70_000));
    vision.parent = Some("ml".into());
    vision.keys[0].limits = limits().tpm(60_000);
    c.tenants.push(vision);
    c
}

/// Fault: a refund reached only the request's own tenant, so its
/// ancestors kept the unused part of every reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_after_settlement_shows_on_all_three_levels() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let gw = three_levels(&mock.base_url()).start().await;
    let body = hi(500);
    let input = chat_input_tokens(&body);
    assert_eq!(post_chat(&gw, "sk-vision", &body).await.status(), 200);
    gw.settled().await;
    let used = (input + 10) as i64;
    let levels = [
        (Scope::Key("vision".into(), "k-v".into()), 60_000),
        (tenant("vision"), 70_000),
        (tenant("ml"), 50_000),
        (tenant("acme"), 90_000),
    ];
    for (scope, limit) in levels {
        assert_eq!(
            gw.remaining(scope.clone(), BudgetName::Tpm).await,
            limit - used,
            "{scope}: reserved {} and refunded down to the {used} used",
            input + 500
        );
    }
}

/// Fault: a reload that moved a tenant under another parent made the
/// settlement refund the new tree's levels, which had reserved nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_after_a_reload_moved_the_tenant_refunds_the_levels_it_reserved_on() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    mock.state.hold();
    let mut c = three_levels(&mock.base_url());
    c.tenants.push(config::RawTenant {
        name: "other-org".into(),
        limits: limits().tpm(80_000),
        ..Default::default()
    });
    let gw = c.start().await;
    let body = hi(500);
    let input = chat_input_tokens(&body);
    let e = (input + 500) as i64;
    let gw_url = gw.base_url();
    let pending = tokio::spawn({
        let body = body.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{gw_url}/chat/completions"))
                .bearer_auth("sk-vision")
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    while mock.state.held_count() < 1 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        gw.remaining(tenant("acme"), BudgetName::Tpm).await,
        90_000 - e
    );
    // The reload: vision now hangs under other-org, ml is gone from its tree.
    c.tenant("vision").parent = Some("other-org".into());
    gw.state.policy.store(Arc::new(c.policy()));
    mock.state.release();
    assert_eq!(pending.await.unwrap(), 200);
    gw.settled().await;
    let used = (input + 10) as i64;
    assert_eq!(
        gw.remaining(tenant("acme"), BudgetName::Tpm).await,
        90_000 - used
    );
    assert_eq!(
        gw.remaining(tenant("ml"), BudgetName::Tpm).await,
        50_000 - used
    );
    assert_eq!(
        gw.remaining(tenant("vision"), BudgetName::Tpm).await,
        70_000 - used
    );
    assert_eq!(
        gw.remaining(tenant("other-org"), BudgetName::Tpm).await,
        80_000,
        "the new parent reserved nothing and is refunded nothing"
    );
    // The next request reserves on the new tree.
    assert_eq!(post_chat(&gw, "sk-vision", &body).await.status(), 200);
    gw.settled().await;
    assert_eq!(
        gw.remaining(tenant("other-org"), BudgetName::Tpm).await,
        80_000 - used
    );
    assert_eq!(
        gw.remaining(tenant("ml"), BudgetName::Tpm).await,
        50_000 - used
    );
}

/// Ancestors' `model_limits` and shadow settings apply to a child's
/// requests: the org's per-model limit refuses, its shadow limit only
/// reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ancestors_model_limits_refuse_and_their_shadow_limits_only_report() {
    let mock = start_mock().await;
    let mut c = org(&mock.base_url());
    c.tenant("acme")
        .model_limits
        .insert("gpt-4o-mini".into(), limits().rpm(2));
    c.tenant("acme").shadow_limits = limits().rpm(1);
    let gw = c.start().await;
    assert_eq!(post_hi(&gw, ML_KEY).await, 200);
    assert_eq!(post_hi(&gw, RESEARCH_KEY).await, 200);
    let (status, v, _) = post_chat_json(&gw, ML_KEY, &hi(5)).await;
    assert_eq!(status, 429, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tenant_model:acme/gpt-4o-mini (rpm) for tenant ml, child of acme"));
    let s = scrape(&gw).await;
    assert!(
        sample_sum(
            &s,
            "budgetgate_shadow_denials_total",
            &[("tenant", "research")]
        ) >= 1.0,
        "the org's shadow rpm of 1 would have refused the second request, research's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_shows_a_tenants_own_budgets_and_its_ancestors() {
    let mock = start_mock().await;
    let gw = three_levels(&mock.base_url()).start().await;
    gw.state.set_admin_token(Some("admin-secret"));
    assert_eq!(post_hi(&gw, "sk-vision").await, 200);
    gw.settled().await;
    let r = admin_get(
        &gw,
        "/admin/v1/tenants/vision/budgets",
        Some("admin-secret"),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let scopes = |budgets: &Value| -> Vec<String> {
        budgets
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                format!(
                    "{} {}",
                    b["scope"].as_str().unwrap(),
                    b["budget"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        scopes(&v["budgets"]),
        ["tenant:vision tpm", "key:vision/k-v tpm"]
    );
    let ancestors = v["ancestors"].as_array().unwrap();
    assert_eq!(ancestors.len(), 2);
    assert_eq!(ancestors[0]["tenant"], "ml");
    assert_eq!(
        scopes(&ancestors[0]["budgets"]),
        ["tenant:ml rpm", "tenant:ml tpm"]
    );
    assert_eq!(ancestors[1]["tenant"], "acme");
    assert_eq!(scopes(&ancestors[1]["budgets"]), ["tenant:acme tpm"]);
    let used = |b: &Value| b["capacity"].as_i64().unwrap() - b["remaining"].as_i64().unwrap();
    let acme_tpm = &ancestors[1]["budgets"][0];
    assert!(used(acme_tpm) > 0, "{acme_tpm}");
    assert_eq!(used(acme_tpm), used(&v["budgets"][0]));
    let policy: Value = admin_get(&gw, "/admin/v1/policy", Some("admin-secret"))
        .await
        .json()
        .await
        .unwrap();
    let parents: Vec<(String, Value)> = policy["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t["parent"].clone()))
        .collect();
    assert!(
        parents.contains(&("vision".into(), json!("ml"))),
        "{parents:?}"
    );
    assert!(
        parents.contains(&("acme".into(), Value::Null)),
        "{parents:?}"
    );
}
