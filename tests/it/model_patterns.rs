//! Model name patterns through the gateway: a
//! `[[models]]` entry named `zz-*` serves every name starting `zz-` with
//! one set of budgets and metric labels (the entry's), the name the
//! client sent goes upstream, an exact entry wins over a pattern, the
//! longest prefix over a shorter one, and an unknown name's 404 lists the
//! names and patterns there are.

use budgetgate::budget::{BudgetName, Scope};
use serde_json::{json, Value};

use crate::support::*;

/// The standard config plus `zz-*` (pattern), `zz-long-*` (a longer
/// pattern, sent upstream as `long-upstream`) and `zz-exact` (exact), all
/// on the mock; tenant `t1` limits `zz-*` to 1,000,000 tokens a minute.
fn config(mock: &str) -> TestConfig {
    let mut c = TestConfig::standard(mock, 16, limits().rpm(100_000).tpm(10_000_000));
    for name in ["zz-*", "zz-long-*", "zz-exact"] {
        c.models.push(config::RawModel {
            encoding: Some("o200k_base".into()),
            default_max_output_tokens: Some(16),
            max_output_tokens: Some(4096),
            ..config::model(name, &["mock"])
        });
    }
    c.model("zz-long-*").upstream_model = Some("long-upstream".into());
    c.tenant("t1")
        .model_limits
        .insert("zz-*".into(), limits().tpm(1_000_000));
    c
}

fn body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
}

/// Fault: each name a client invented got budgets and metric series of its
/// own, so a tenant escaped its per-model limit by varying the name (and
/// the metrics grew without bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_names_of_one_pattern_share_its_budget_and_labels() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = config(&mock.base_url()).start().await;
    let names: Vec<String> = (0..100).map(|i| format!("zz-invented-{i:03}")).collect();
    for n in &names {
        let r = post_chat(&gw, KEY, &body(n)).await;
        assert_eq!(
            r.status(),
            200,
            "{n}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    gw.all_settled().await;
    // Every request went upstream under the name its client sent.
    let sent: Vec<String> = mock
        .state
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(sent, names);
    // One tenant×model budget, the pattern entry's, holds all of them.
    let used = gw
        .used(
            Scope::TenantModel("t1".into(), "zz-*".into()),
            BudgetName::Tpm,
        )
        .await;
    let each = gw.t1_used(BudgetName::Tpm).await / 100;
    assert!(each > 5, "each request used input and output ({each})");
    assert_eq!(
        used,
        100 * each,
        "every request counted on tenant_model:t1/zz-*"
    );
    // The budget an invented name would have had, were names budgets, is
    // untouched in the store.
    let policy = gw.state.policy.load_full();
    let ks = budgetgate::gateway::AppState::key_space(&policy);
    let limits = policy.tenants[0].model_limits["zz-*"].clone();
    for n in ["zz-invented-000", "zz-invented-099"] {
        let scope = Scope::TenantModel("t1".into(), n.into());
        let specs = budgetgate::admission::plan::scope_budgets(&ks, scope, &limits, true);
        let state = gw.store.inspect(&specs).await.expect("inspect");
        assert!(
            state.iter().all(|s| s.remaining == s.limit as i64),
            "{n} has a budget of its own: {state:?}"
        );
    }
    // No metric series names an invented name; the entry's label is there.
    let text = gw.metrics_text().await;
    assert!(
        !text.contains("zz-invented"),
        "a series carries a name the client invented"
    );
    assert!(
        text.contains("model=\"zz-*\""),
        "the calibration series is the entry's"
    );
}

/// Fault: a pattern shadowed an exact entry (or a shorter prefix a longer
/// one), so a model got another entry's budgets, prices and upstream name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_entry_wins_then_the_longest_prefix() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let mut totals = Vec::new();
    for name in ["zz-exact", "zz-long-7", "zz-other"] {
        let r = post_chat(&gw, KEY, &body(name)).await;
        assert_eq!(r.status(), 200, "{name}");
        let v: Value = r.json().await.unwrap();
        totals.push(v["usage"]["total_tokens"].as_u64().expect("usage"));
    }
    gw.all_settled().await;
    let sent: Vec<String> = mock
        .state
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        sent,
        ["zz-exact", "long-upstream", "zz-other"],
        "exact as named; zz-long-* renamed by its upstream_model; zz-* as sent"
    );
    // Only `zz-other` reached the `zz-*` budget.
    let pattern = gw
        .used(
            Scope::TenantModel("t1".into(), "zz-*".into()),
            BudgetName::Tpm,
        )
        .await;
    assert_eq!(pattern, totals[2]);
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        totals.iter().sum::<u64>()
    );
}

/// Fault: an unknown name's 404 left the client guessing which names the
/// gateway serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_name_is_told_the_names_and_patterns() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let r = post_chat(&gw, KEY, &body("nope-1")).await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    let m = v["error"]["message"].as_str().unwrap();
    for name in [
        "`nope-1`",
        "`gpt-4o-mini`",
        "`zz-*`",
        "`zz-long-*`",
        "`zz-exact`",
    ] {
        assert!(m.contains(name), "{name} missing from: {m}");
    }
    assert_eq!(mock.state.request_count(), 0);
}

/// Fault: a pattern entry's `max_output_tokens` refused the cap a client
/// released after the config sends (Claude Code 2.1.332's 128000 against
/// `claude-*`'s 64000): every turn a 400. An exact entry, which mirrors
/// one model's documented maximum, still refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_entry_never_refuses_a_larger_client_cap_an_exact_entry_does() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = config(&mock.base_url()).start().await;
    let mut b = body("zz-new-model");
    b["max_tokens"] = json!(128_000);
    let r = post_chat(&gw, KEY, &b).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let sent = &mock.state.requests()[0].body;
    assert_eq!(
        sent["max_tokens"], 128_000,
        "the client's cap goes upstream"
    );
    b["model"] = json!("zz-exact");
    let r = post_chat(&gw, KEY, &b).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "max_tokens");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("at most 4096"), "{m}");
    assert_eq!(
        mock.state.request_count(),
        1,
        "the refused one never went up"
    );
    gw.all_settled().await;
}

/// The newest Claude Code's default turn (recorded shape: model
/// `claude-opus-5-5`, `max_tokens: 128000`, adaptive thinking, effort)
/// on `config/local-anthropic.toml` as shipped: admitted and answered, and
/// in the shipped expected mode it reserves its input and the default
/// output, not its 128,000 cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_claude_code_default_turn_runs_on_the_shipped_config() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    let gw = crate::agents_cli::shipped("local-anthropic.toml", &mock)
        .start()
        .await;
    let body = json!({
        "model": "claude-opus-5-5", "max_tokens": 128_000, "stream": true,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "medium"},
        "messages": [{"role": "user", "content": "say hi"}],
    });
    mock.state.hold();
    let url = gw.base_url();
    let turn = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(format!("{url}/messages"))
            .header("x-api-key", "sk-local-claude")
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .expect("POST /v1/messages");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while mock.state.held_count() < 1 {
        if turn.is_finished() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let held = gw
        .used(Scope::Tenant("coder".into()), BudgetName::Tpm)
        .await;
    mock.state.release();
    let (status, text) = turn.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        held < 128_000,
        "expected mode: input plus the default output reserved, not the cap: {held}"
    );
    assert_eq!(mock.state.requests()[0].body["max_tokens"], 128_000);
    gw.all_settled().await;
}
