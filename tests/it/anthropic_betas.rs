//! `anthropic-beta` through the gateway: forwarded by
//! default on `/v1/messages` and `/v1/messages/count_tokens`, except the
//! families that reach provider objects or bill beside the tokens (and an
//! operator's additions); a model's allow list keeps its meaning; no beta
//! lifts a body check; betas are never metric labels.

use serde_json::{json, Value};

use crate::support::*;

/// The betas Claude Code 2.1.197 sends with its default turn (recorded).
const CLAUDE_CODE_BETAS: &str = "claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14,thinking-token-count-2026-05-13,context-management-2025-06-27,prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,effort-2025-11-24";

/// An Anthropic upstream on `mock` serving `claude-*` (default beta
/// policy, one operator addition) and `claude-listed` (an allow list).
fn config(mock: &str) -> TestConfig {
    let mut c = TestConfig::new();
    c.upstreams
        .push(config::upstream("claude", Kind::Anthropic, mock));
    let model = |name: &str| config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        token_ratio: Some(1000),
        ..config::model(name, &["claude"])
    };
    c.models.push(config::RawModel {
        anthropic_betas_deny: vec!["web-fetch-*".into()],
        ..model("claude-*")
    });
    c.models.push(config::RawModel {
        anthropic_betas: vec![
            "claude-code-20250219".into(),
            "mcp-client-2025-04-04".into(),
        ],
        ..model("claude-listed")
    });
    c.tenants.push(config::tenant(
        "t1",
        "k1",
        KEY,
        limits().rpm(1000).tpm(1_000_000),
    ));
    c
}

async fn post(gw: &Gateway, path: &str, betas: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", betas)
        .json(body)
        .send()
        .await
        .expect("request")
}

fn body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "say hi"}]})
}

/// Fault: Claude Code got 400 "anthropic-beta: `claude-code-20250219` is
/// not enabled" on every turn, and its token counts likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_betas_pass_on_both_routes_and_go_upstream() {
    let mock = start_mock().await;
    let gw = config(&mock.root_url()).start().await;
    let r = post(
        &gw,
        "/messages",
        CLAUDE_CODE_BETAS,
        &body("claude-opus-4-8"),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let sent = &mock.state.requests()[0];
    assert_eq!(sent.header("anthropic-beta"), Some(CLAUDE_CODE_BETAS));
    assert_eq!(sent.body["model"], "claude-opus-4-8");
    let r = post(
        &gw,
        "/messages/count_tokens",
        &format!("token-counting-2024-11-01,{CLAUDE_CODE_BETAS}"),
        &body("claude-opus-4-8"),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.json::<Value>().await.unwrap()["input_tokens"].as_u64() > Some(0));
    // Never a metric label.
    gw.all_settled().await;
    let text = gw.metrics_text().await;
    assert!(!text.contains("claude-code-2025"), "a beta in a series");
}

/// Fault: a beta reaching provider objects (files, code execution, MCP,
/// skills) went upstream on one route or the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_beta_is_refused_naming_it_on_both_routes() {
    let mock = start_mock().await;
    let gw = config(&mock.root_url()).start().await;
    for beta in [
        "files-api-2025-04-14",
        "code-execution-2025-08-25",
        "mcp-client-2025-11-20",
        "skills-2025-10-02",
        "web-fetch-2025-09-10",
    ] {
        for path in ["/messages", "/messages/count_tokens"] {
            let r = post(
                &gw,
                path,
                &format!("claude-code-20250219, {beta}"),
                &body("claude-sonnet-4-5"),
            )
            .await;
            assert_eq!(r.status(), 400, "{beta} on {path}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["type"], "error");
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains(&format!("`{beta}`")), "{m}");
        }
    }
    assert_eq!(mock.state.request_count(), 0);
}

/// Fault: listing a beta let its body features through, or an allow list
/// stopped meaning "only these" once betas passed by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_beta_lifts_a_body_check_and_an_allow_list_keeps_its_meaning() {
    let mock = start_mock().await;
    let gw = config(&mock.root_url()).start().await;
    let mut mcp = body("claude-listed");
    mcp["mcp_servers"] = json!([{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]);
    for (model, betas) in [
        ("claude-listed", "mcp-client-2025-04-04"),
        ("claude-sonnet-4-5", "claude-code-20250219"),
    ] {
        mcp["model"] = json!(model);
        let r = post(&gw, "/messages", betas, &mcp).await;
        assert_eq!(r.status(), 400, "{model}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("mcp_servers"),
            "{v}"
        );
    }
    // The allow list: a beta it does not name is refused.
    let r = post(
        &gw,
        "/messages",
        "context-1m-2025-08-07",
        &body("claude-listed"),
    )
    .await;
    assert_eq!(r.status(), 400);
    let r = post(
        &gw,
        "/messages",
        "claude-code-20250219",
        &body("claude-listed"),
    )
    .await;
    assert_eq!(r.status(), 200);
}
