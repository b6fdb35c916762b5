//! How the gateway counts and bounds output: a Messages
//! model's `token_ratio` applied once to the output delivered, not per
//! delta; and a model without a configured `max_output_tokens` forwarding
//! the client's cap instead of refusing it at an invented limit.

use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// An Anthropic upstream serving `claude-test` (default output 256, its
/// `token_ratio` and `max_output_tokens` as given) and a self-hosted one
/// serving `gpt-4o-mini` (no configured limit), tenant `t1` with `limits`.
fn config(
    mock: &MockUpstream,
    token_ratio: u64,
    max_output: Option<i64>,
    limits: Limits,
) -> TestConfig {
    let mut c = TestConfig::new();
    c.estimation.stream_extension_step = Some(256);
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-messages".into()],
        ..config::upstream("claude", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: max_output,
        token_ratio: Some(token_ratio as i64),
        ..config::model("claude-test", &["claude"])
    });
    c.upstreams
        .push(config::upstream("oai", Kind::SelfHosted, &mock.base_url()));
    c.models.push(config::RawModel {
        default_max_output_tokens: Some(256),
        ..config::model("gpt-4o-mini", &["oai"])
    });
    c.tenants.push(config::tenant("t1", "k1", KEY, limits));
    c
}

async fn post_messages(gw: &Gateway, body: &Value, scenario: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("x-mock-messages", scenario)
        .json(body)
        .send()
        .await
        .expect("POST /v1/messages")
}

/// The events of a Messages SSE body: (event name, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(|frame| {
            let mut name = None;
            let mut data = None;
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            Some((name?, data?))
        })
        .collect()
}

fn messages_body(max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cutoff_after_288_one_token_deltas_at_a_ratio_of_1500_reports_and_charges_432() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(2000);
    // 432 output tokens in all: 256 reserved, then the 176 left granted;
    // ceil(287 × 1.5) = 431 < 432 ≤ ceil(288 × 1.5), so the stream is cut
    // off after its 288th one-token delta.
    let gw = config(
        &mock,
        1500,
        Some(64000),
        limits().tpm(100_000).output_tpm(432),
    )
    .start()
    .await;
    let r = post_messages(&gw, &messages_body(1000, true), "input=10").await;
    assert_eq!(r.status(), 200);
    let events = events(&r.text().await.unwrap());
    let deltas = events
        .iter()
        .filter(|(name, d)| name == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .count();
    assert_eq!(deltas, 288, "one-token deltas relayed before the cutoff");
    let (_, closing) = events
        .iter()
        .rfind(|(name, _)| name == "message_delta")
        .expect("a closing message_delta");
    assert_eq!(closing["delta"]["stop_reason"], "max_tokens");
    assert_eq!(
        closing["usage"]["output_tokens"], 432,
        "ceil(288 × 1.5), the ratio applied once"
    );
    assert_eq!(events.last().map(|(n, _)| n.as_str()), Some("message_stop"));
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::OutputTpm).await, 432);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 10 + 432);
}

/// The output cap a chat request went upstream with (either field).
fn chat_cap_sent(body: &Value) -> Option<u64> {
    body.get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_32000_cap_on_a_model_without_a_configured_limit_is_forwarded_and_served() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    let gw = config(&mock, 1000, None, limits().tpm(1_000_000))
        .start()
        .await;
    for stream in [false, true] {
        let r = post_messages(&gw, &messages_body(32000, stream), "").await;
        assert_eq!(r.status(), 200, "stream: {stream}");
        let _ = r.text().await;
    }
    let mut b = hi(32000);
    let r = post_chat(&gw, KEY, &b).await;
    assert_eq!(r.status(), 200, "every dialect: chat too");
    let _ = r.text().await;
    // An uncapped stream of a model without a limit is sent its
    // reservation (the default, 256): no larger cap is known to pass.
    b.as_object_mut().unwrap().remove("max_tokens");
    b["stream"] = json!(true);
    let r = post_chat(&gw, KEY, &b).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    let sent = mock.state.requests();
    assert_eq!(sent.len(), 4);
    assert_eq!(sent[0].body["max_tokens"], 32000, "forwarded unchanged");
    assert_eq!(sent[1].body["max_tokens"], 32000, "forwarded unchanged");
    assert_eq!(chat_cap_sent(&sent[2].body), Some(32000));
    assert_eq!(chat_cap_sent(&sent[3].body), Some(256));
    gw.all_settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_above_a_configured_limit_is_still_refused_and_never_forwarded() {
    let mock = start_mock().await;
    let gw = config(&mock, 1000, Some(16384), limits().tpm(1_000_000))
        .start()
        .await;
    let r = post_messages(&gw, &messages_body(32000, false), "").await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["type"], "error", "Anthropic's error shape: {e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    let message = e["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at most 16384"), "{message}");
    assert_eq!(mock.state.request_count(), 0);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0, "nothing reserved");
    let r = post_messages(&gw, &messages_body(16384, false), "").await;
    assert_eq!(r.status(), 200, "at the limit is served");
}

#[test]
fn check_config_warns_on_stderr_about_a_model_without_a_limit_and_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    // `standard`: gpt-4o-mini has max_output_tokens = 4096, the
    // embeddings model none.
    let cfg =
        TestConfig::standard("http://127.0.0.1:9/v1", 50, limits().tpm(1000)).write(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .arg("check-config")
        .arg(&cfg)
        .env_remove("BUDGETGATE_CONFIG")
        .output()
        .expect("run budgetgate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "warning: models[1] (text-embedding-3-small) has no max_output_tokens: client caps go upstream unchecked"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("gpt-4o-mini"), "{stderr}");
}
