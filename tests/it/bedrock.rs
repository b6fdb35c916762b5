//! `kind = "bedrock"` through the gateway to the simulated
//! Bedrock (`examples/mock_upstream/bedrock.rs`), in this process, with a
//! Bedrock API key (SigV4 and the credential providers run the binary with
//! its own environment: `bedrock_sigv4`). Each test names the endpoint it
//! covers: InvokeModel / InvokeModelWithResponseStream (`api = "invoke"`,
//! event-stream answers), or the Anthropic Messages endpoint of
//! bedrock-mantle / bedrock-runtime (`api = "messages"`, SSE).

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::bedrock::RawBedrock;
use serde_json::{json, Value};

use crate::support::mock_upstream::bedrock::BedrockFault;
use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// The Bedrock id of the public `claude-test`.
pub const ID: &str = "us.anthropic.claude-test-v1:0";
/// [`ID`] as one path segment.
pub const ID_IN_PATH: &str = "us.anthropic.claude-test-v1%3A0";

/// A Bedrock deployment `name` on `mock` calling `api`, keyed by
/// `CARGO_PKG_NAME` (which the mock is told to accept), mapping
/// `claude-test` to [`ID`].
pub fn bedrock_upstream(name: &str, mock: &MockUpstream, api: &str) -> config::RawUpstream {
    mock.state.bedrock.set_api_key(env!("CARGO_PKG_NAME"));
    config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-messages".into()],
        models: Some([("claude-test".to_string(), ID.to_string())].into()),
        bedrock: Some(RawBedrock {
            region: Some("us-east-1".into()),
            api: Some(api.into()),
            ..RawBedrock::default()
        }),
        ..config::upstream(name, Kind::Bedrock, &mock.root_url())
    }
}

/// `claude-test` over `upstreams` (in order), tenant `t1` with `tenant`.
pub fn config_of(upstreams: Vec<config::RawUpstream>, tenant: Limits) -> TestConfig {
    let mut c = TestConfig::new();
    c.estimation.stream_extension_step = Some(256);
    let names: Vec<String> = upstreams.iter().map(|u| u.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        token_ratio: Some(1000),
        anthropic_betas: vec!["allowed-beta-2025".into()],
        ..config::model("claude-test", &names)
    });
    c.upstreams = upstreams;
    c.tenants.push(config::tenant("t1", "k1", KEY, tenant));
    c
}

pub fn body(max_tokens: u64, stream: bool) -> Value {
    json!({"model": "claude-test", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]})
}

pub async fn post(gw: &Gateway, b: &Value, scenario: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/messages", gw.base_url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "allowed-beta-2025")
        .header("x-mock-messages", scenario)
        .json(b)
        .send()
        .await
        .expect("POST /v1/messages")
}

fn upstream(name: &str) -> Scope {
    Scope::Upstream(name.into())
}

/// Endpoint: InvokeModelWithResponseStream and InvokeModel. The body goes
/// without `model`, with `anthropic_version` and the betas in
/// `anthropic_beta`, to `/model/{percent-encoded id}/…`; the event-stream
/// answer reaches the client as Anthropic SSE, metered and settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_streams_event_frames_as_sse_and_settles_the_usage() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(15);
    let gw = config_of(
        vec![bedrock_upstream("br", &mock, "invoke")],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = post(&gw, &body(1000, true), "input=10,cache_read=30").await;
    assert_eq!(r.status(), 200);
    assert!(must_header(&r, "content-type").starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    for e in [
        "message_start",
        "content_block_delta",
        "message_delta",
        "message_stop",
    ] {
        assert!(text.contains(&format!("event: {e}\n")), "{e}: {text}");
    }
    assert_eq!(text.matches("event: content_block_delta").count(), 15);
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 10 + 30 + 15);
    let sent = &mock.state.requests()[0];
    assert_eq!(
        sent.path,
        format!("/model/{ID_IN_PATH}/invoke-with-response-stream")
    );
    assert_eq!(sent.body.get("model"), None);
    assert_eq!(sent.body.get("stream"), None);
    assert_eq!(sent.body["anthropic_version"], "bedrock-2023-05-31");
    assert_eq!(sent.body["anthropic_beta"], json!(["allowed-beta-2025"]));
    assert_eq!(sent.header("anthropic-beta"), None, "in the body instead");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {}", env!("CARGO_PKG_NAME")).as_str())
    );

    let r = post(&gw, &body(1000, false), "input=7").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["usage"]["output_tokens"], 15);
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 55 + 7 + 15);
    assert_eq!(
        mock.state.requests()[1].path,
        format!("/model/{ID_IN_PATH}/invoke")
    );
}

/// Endpoint: the Anthropic Messages endpoint (`/anthropic/v1/messages`):
/// the Anthropic body with `model` = the Bedrock id, `anthropic-version`,
/// the betas as the header, the API key as `x-api-key`; SSE relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messages_endpoint_gets_the_bedrock_id_version_and_key() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(9);
    let gw = config_of(
        vec![bedrock_upstream("mantle", &mock, "messages")],
        limits().tpm(100_000),
    )
    .start()
    .await;
    let r = post(&gw, &body(500, true), "input=4").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 4 + 9);
    let sent = &mock.state.requests()[0];
    assert_eq!(sent.path, "/anthropic/v1/messages");
    assert_eq!(sent.body["model"], ID);
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("anthropic-beta"), Some("allowed-beta-2025"));
    assert_eq!(sent.header("x-api-key"), Some(env!("CARGO_PKG_NAME")));
}

/// The Messages estimate, usage and cache accounting are the same on an
/// `anthropic` deployment, on `bedrock` ones (each API) and on a `vertex`
/// one: the same requests leave the same tenant and deployment budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounting_is_the_same_on_anthropic_bedrock_and_vertex_deployments() {
    let mut seen = Vec::new();
    for kind in ["anthropic", "invoke", "messages", "vertex"] {
        let mock = start_mock().await;
        let vertex = crate::vertex::start_vertex().await;
        let dir = tempfile::tempdir().expect("temp dir");
        // The Messages answers come from the mock's state on every kind.
        let state = match kind {
            "vertex" => vertex.state.messages.clone(),
            _ => mock.state.clone(),
        };
        state.set_output_tokens(21);
        let up = match kind {
            "vertex" => {
                let key = crate::vertex::key_file(dir.path(), &vertex);
                crate::vertex::deployment("d", &vertex, crate::vertex::EAST, Some(&key))
            }
            "anthropic" => config::RawUpstream {
                api_key_env: Some("CARGO_PKG_NAME".into()),
                forward_client_headers: vec!["x-mock-messages".into()],
                ..config::upstream("d", Kind::Anthropic, &mock.root_url())
            },
            api => bedrock_upstream("d", &mock, api),
        };
        let up = config::RawUpstream {
            limits: limits()
                .tpm(1_000_000)
                .input_tpm(1_000_000)
                .output_tpm(1_000_000),
            ..up
        };
        let gw = config_of(vec![up], limits().tpm(1_000_000)).start().await;
        // The estimate: what a request holds while it runs.
        state.hold();
        let held = {
            let gw_url = gw.base_url();
            let task = tokio::spawn(async move {
                reqwest::Client::new()
                    .post(format!("{gw_url}/messages"))
                    .header("x-api-key", KEY)
                    .header("x-mock-messages", "input=50")
                    .json(&body(300, false))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            });
            while state.held_count() == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let reserved = gw.t1_used(BudgetName::Tpm).await;
            state.release();
            assert_eq!(task.await.unwrap().unwrap(), 200);
            reserved
        };
        let mut row = vec![held];
        for (b, scenario) in [
            (
                body(1000, true),
                "input=10,cache_read=300,cache_creation=40",
            ),
            (body(1000, false), "input=20,cache_read=100"),
            (body(64, true), "input=5,thinking=10"),
        ] {
            let r = post(&gw, &b, scenario).await;
            assert_eq!(r.status(), 200, "{kind}");
            let _ = r.text().await;
            gw.all_settled().await;
            row.push(gw.t1_used(BudgetName::Tpm).await);
        }
        for name in [BudgetName::Tpm] {
            row.push(gw.t1_used(name).await);
        }
        for name in [BudgetName::Tpm, BudgetName::InputTpm, BudgetName::OutputTpm] {
            row.push(gw.used(upstream("d"), name).await);
        }
        seen.push((kind, row));
    }
    assert!(seen[0].1.iter().all(|&n| n > 0), "{seen:?}");
    assert_eq!(
        seen[0].1, seen[1].1,
        "anthropic vs bedrock invoke: {seen:?}"
    );
    assert_eq!(
        seen[0].1, seen[2].1,
        "anthropic vs bedrock messages: {seen:?}"
    );
    assert_eq!(seen[0].1, seen[3].1, "anthropic vs vertex: {seen:?}");
}

/// `output_token_weight = 5` (Bedrock's burndown for Claude 4 output),
/// as AWS counts it ("How tokens are counted in Amazon Bedrock"): the
/// deployment's `tpm` holds input + `max_tokens` while the request runs
/// and keeps input + 5 × output after it; the tenant's counts 1 ×.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_weight_of_five_moves_the_deployment_tpm_five_times_per_output_token() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(30);
    let up = config::RawUpstream {
        output_token_weight: Some(5),
        limits: limits().tpm(1_000_000),
        ..bedrock_upstream("br", &mock, "invoke")
    };
    let gw = config_of(vec![up], limits().tpm(1_000_000)).start().await;
    mock.state.hold();
    let url = gw.base_url();
    let task = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{url}/messages"))
            .header("x-api-key", KEY)
            .header("x-mock-messages", "input=40")
            .json(&body(200, true))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    while mock.state.held_count() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let tenant_held = gw.t1_used(BudgetName::Tpm).await;
    let input = tenant_held - 200;
    assert_eq!(
        gw.used(upstream("br"), BudgetName::Tpm).await,
        input + 200,
        "input + max_tokens reserved"
    );
    mock.state.release();
    assert!(task.await.unwrap().contains("message_stop"));
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 40 + 30);
    assert_eq!(
        gw.used(upstream("br"), BudgetName::Tpm).await,
        40 + 5 * 30,
        "input + 5 × output settled"
    );
}

/// Fault guarded against: a Bedrock deployment reserved input + 5 ×
/// `max_tokens`, so Claude Code's 64,000 cap (128,000 in its newest
/// release) on a 200,000 tpm quota was refused as "can never be
/// admitted". Ten Claude Code-sized turns (a cached prefix read, some
/// written, both caps, streamed and not) are all admitted, and the
/// deployment's `tpm` ends at AWS's formula: Σ input + cache writes + 5 ×
/// output; the tenant's at Σ every token once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_turns_on_bedrock_are_admitted_and_charged_as_aws_counts_them() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    let up = config::RawUpstream {
        output_token_weight: Some(5),
        limits: limits().tpm(200_000),
        ..bedrock_upstream("br-quota", &mock, "invoke")
    };
    let mut c = config_of(vec![up], limits().tpm(10_000_000));
    c.models[0].max_output_tokens = Some(128_000);
    let gw = c.start().await;
    let (input, cache_read, cache_writes, output) = (2_000, 20_000, 1_000, 300);
    let scenario = format!("input={input},cache_read={cache_read},cache_creation={cache_writes}");
    for turn in 0..10u64 {
        let max_tokens = if turn % 2 == 0 { 64_000 } else { 128_000 };
        let r = post(&gw, &body(max_tokens, turn % 3 != 0), &scenario).await;
        assert_eq!(r.status(), 200, "turn {turn}: {}", r.text().await.unwrap());
        r.text().await.unwrap();
        gw.all_settled().await;
    }
    assert_eq!(
        gw.used(upstream("br-quota"), BudgetName::Tpm).await,
        10 * (input + cache_writes + 5 * output),
        "AWS's formula"
    );
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        10 * (input + cache_read + cache_writes + output)
    );
}

/// A model over two Bedrock regions and an Anthropic deployment: the
/// first region throttles, the request goes to the second within the same
/// request (the client sees 200), and each region's budgets count what it
/// served (the throttled one a request, no tokens). Every region
/// throttling: 429 with `retry-after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_region_fails_over_within_the_request_and_each_counts_what_it_served() {
    let east = start_mock().await;
    let west = start_mock().await;
    let anth = start_mock().await;
    for m in [&east, &west, &anth] {
        m.state.set_output_tokens(12);
    }
    west.state.bedrock.set_region("us-west-2");
    let mut w = bedrock_upstream("us-west-2", &west, "invoke");
    w.bedrock.as_mut().unwrap().region = Some("us-west-2".into());
    let ups: Vec<config::RawUpstream> = vec![
        bedrock_upstream("us-east-1", &east, "invoke"),
        w,
        config::RawUpstream {
            api_key_env: Some("CARGO_PKG_NAME".into()),
            forward_client_headers: vec!["x-mock-messages".into()],
            ..config::upstream("anthropic", Kind::Anthropic, &anth.root_url())
        },
    ]
    .into_iter()
    .map(|u| config::RawUpstream {
        limits: limits().rpm(100).tpm(100_000),
        cooldown_secs: Some(7),
        ..u
    })
    .collect();
    let gw = config_of(ups, limits().tpm(100_000)).start().await;
    east.state.bedrock.set_fault(BedrockFault::Throttling, 1);
    let r = post(&gw, &body(100, true), "input=8").await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("message_stop"));
    gw.all_settled().await;
    assert_eq!(east.state.requests().len(), 1);
    assert_eq!(west.state.requests().len(), 1);
    assert_eq!(anth.state.requests().len(), 0);
    assert_eq!(gw.used(upstream("us-east-1"), BudgetName::Tpm).await, 0);
    assert_eq!(gw.used(upstream("us-east-1"), BudgetName::Rpm).await, 1);
    assert_eq!(
        gw.used(upstream("us-west-2"), BudgetName::Tpm).await,
        8 + 12
    );
    // us-east-1 cools down: the next request starts at us-west-2.
    let r = post(&gw, &body(100, false), "input=8").await;
    assert_eq!(r.status(), 200);
    assert_eq!(east.state.requests().len(), 1);
    assert_eq!(west.state.requests().len(), 2);
    // Throttled everywhere (quota exceeded on us-west-2, the Anthropic
    // deployment rate-limited): 429 with retry-after, nothing kept.
    west.state.bedrock.set_fault(BedrockFault::QuotaExceeded, 1);
    anth.state
        .set_fault(Some(mock_upstream::Fault::RateLimited));
    let r = post(&gw, &body(100, false), "input=8").await;
    assert_eq!(r.status(), 429);
    assert!(header_u64(&r, "retry-after") >= 1);
    assert_eq!(anth.state.requests().len(), 1);
    gw.all_settled().await;
    assert_eq!(gw.used(upstream("anthropic"), BudgetName::Tpm).await, 0);
}

/// A model over two Bedrock regions and one Vertex region: a
/// throttled region hands the request to the next within the same request,
/// across clouds (the client sees 200 each time), and each region's
/// budgets count what it served: a throttled attempt a request and no
/// tokens, a served one its input and output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_over_bedrock_and_vertex_regions_fails_over_across_clouds() {
    let east = start_mock().await;
    let west = start_mock().await;
    let vertex = crate::vertex::start_vertex().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let key = crate::vertex::key_file(dir.path(), &vertex);
    for state in [&east.state, &west.state, &vertex.state.messages] {
        state.set_output_tokens(12);
    }
    west.state.bedrock.set_region("us-west-2");
    let mut w = bedrock_upstream("us-west-2", &west, "invoke");
    if let Some(b) = w.bedrock.as_mut() {
        b.region = Some("us-west-2".into());
    }
    let ups: Vec<config::RawUpstream> = vec![
        bedrock_upstream("us-east-1", &east, "invoke"),
        w,
        crate::vertex::deployment("vertex-east5", &vertex, crate::vertex::EAST, Some(&key)),
    ]
    .into_iter()
    .map(|u| config::RawUpstream {
        limits: limits().rpm(100).tpm(100_000),
        cooldown_secs: Some(30),
        ..u
    })
    .collect();
    let gw = config_of(ups, limits().tpm(100_000)).start().await;
    // us-east-1 throttles: us-west-2 serves the same request.
    east.state.bedrock.set_fault(BedrockFault::Throttling, 1);
    let r = post(&gw, &body(100, true), "input=8").await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap_or_default().contains("message_stop"));
    // us-east-1 cools down and us-west-2 is out of quota: Vertex serves.
    west.state.bedrock.set_fault(BedrockFault::QuotaExceeded, 1);
    let r = post(&gw, &body(100, true), "input=8").await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap_or_default().contains("message_stop"));
    gw.all_settled().await;
    assert_eq!(east.state.requests().len(), 1);
    assert_eq!(west.state.requests().len(), 2);
    assert_eq!(vertex.state.requests().len(), 1);
    for (name, rpm, tpm) in [
        ("us-east-1", 1, 0),
        ("us-west-2", 2, 8 + 12),
        ("vertex-east5", 1, 8 + 12),
    ] {
        assert_eq!(
            gw.used(upstream(name), BudgetName::Rpm).await,
            rpm,
            "{name} rpm"
        );
        assert_eq!(
            gw.used(upstream(name), BudgetName::Tpm).await,
            tpm,
            "{name} tpm"
        );
    }
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 2 * (8 + 12));
}

/// The errors table, one row each, on InvokeModel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_errors_answer_as_the_table_says() {
    let mock = start_mock().await;
    let spare = start_mock().await;
    let up = |name: &str, m: &MockUpstream| config::RawUpstream {
        cooldown_secs: Some(30),
        ..bedrock_upstream(name, m, "invoke")
    };
    let gw = config_of(vec![up("br", &mock)], limits().tpm(100_000))
        .start()
        .await;
    // Validation: 400 invalid_request_error with the cloud's message.
    mock.state.bedrock.set_fault(BedrockFault::Validation, 1);
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(
        v["error"]["message"],
        "messages.0.content: mock validation failure from Bedrock"
    );
    // Access denied: 502 naming the deployment (never the credential).
    mock.state.bedrock.set_fault(BedrockFault::AccessDenied, 1);
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 502);
    let text = r.text().await.unwrap();
    assert!(text.contains("Deployment br rejected"), "{text}");
    assert!(!text.contains(env!("CARGO_PKG_NAME")), "{text}");
    // It cools down, its reason in /readyz; with no other deployment the
    // model answers 502 naming it meanwhile, never a rate limit.
    let before = mock.state.requests().len();
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 502);
    assert!(r.headers().get("retry-after").is_none());
    let text = r.text().await.unwrap();
    assert!(text.contains("br"), "{text}");
    assert_eq!(mock.state.requests().len(), before, "not sent while denied");
    let ready: Value = reqwest::get(format!("{}/readyz", gw.root_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        ready["cooling_deployments"][0],
        json!({"deployment": "br", "reason": "access_denied", "seconds_left": 30}),
        "{ready}"
    );
    drop(gw);
    let gw = config_of(vec![up("br", &mock)], limits().tpm(100_000))
        .start()
        .await;
    // Model not ready: 503 and the deployment cools down.
    mock.state.bedrock.set_fault(BedrockFault::ModelNotReady, 1);
    let before = mock.state.requests().len();
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 503);
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 429, "cooling down: nothing else to try");
    assert!(header_u64(&r, "retry-after") >= 1);
    assert_eq!(
        mock.state.requests().len(),
        before + 1,
        "not sent during its cool-down"
    );
    drop(gw);
    // Model timeout: 504 and cool-down; the request fails over.
    let gw = config_of(
        vec![up("br", &mock), up("spare", &spare)],
        limits().tpm(100_000),
    )
    .start()
    .await;
    mock.state
        .bedrock
        .set_fault(BedrockFault::ModelTimeout, u64::MAX);
    spare.state.bedrock.set_fault(BedrockFault::ModelTimeout, 1);
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 504);
    let r = post(&gw, &body(100, false), "").await;
    assert_eq!(r.status(), 429, "both cooling down");
    mock.state.bedrock.clear_fault();
}

/// A pattern model whose deployments map names differently: one by a
/// template, one by an explicit list. A name only the template covers
/// skips the listing deployment; a name neither covers is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_without_an_id_for_the_name_is_skipped() {
    let listed = start_mock().await;
    let templated = start_mock().await;
    let mut a = bedrock_upstream("listed", &listed, "invoke");
    a.models = Some(
        [(
            "claude-x-1".to_string(),
            "eu.anthropic.claude-x-1-v1:0".to_string(),
        )]
        .into(),
    );
    let mut b = bedrock_upstream("templated", &templated, "messages");
    b.models = Some(
        [(
            "claude-x*".to_string(),
            "global.anthropic.{model}-v2:0".to_string(),
        )]
        .into(),
    );
    let mut c = config_of(vec![a, b], limits().tpm(100_000));
    c.models[0].name = "claude-x*".into();
    let gw = c.start().await;
    let named = |m: &str| {
        let mut v = body(50, false);
        v["model"] = json!(m);
        v
    };
    assert_eq!(post(&gw, &named("claude-x-1"), "").await.status(), 200);
    assert_eq!(
        listed.state.requests()[0].path,
        "/model/eu.anthropic.claude-x-1-v1%3A0/invoke"
    );
    assert_eq!(post(&gw, &named("claude-x-2"), "").await.status(), 200);
    assert_eq!(
        listed.state.requests().len(),
        1,
        "skipped: no id for claude-x-2"
    );
    assert_eq!(
        templated.state.requests()[0].body["model"],
        "global.anthropic.claude-x-2-v2:0"
    );
}

/// An exception frame in the middle of an InvokeModelWithResponseStream
/// answer: the client's stream ends with an Anthropic `error` event, and
/// the stream is settled as `upstream_failed` (its ending counted as
/// `upstream_error`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_stream_exception_ends_in_an_error_event_settled_as_upstream_failed() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    let gw = config_of(
        vec![bedrock_upstream("br-stream-exception", &mock, "invoke")],
        limits().tpm(100_000),
    )
    .start()
    .await;
    mock.state
        .bedrock
        .set_fault(BedrockFault::StreamException, 1);
    let r = post(&gw, &body(100, true), "input=5").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: error\n"), "{text}");
    assert!(
        text.contains("api_error") && text.contains("The model stream failed"),
        "{text}"
    );
    assert!(!text.contains("message_stop"), "{text}");
    gw.all_settled().await;
    let ended = sample_sum(
        &scrape(&gw).await,
        "budgetgate_streams_ended_total",
        &[
            ("deployment", "br-stream-exception"),
            ("ending", "upstream_error"),
        ],
    );
    assert_eq!(ended, 1.0);
}

/// Fault guarded against: an InvokeModel stream past the deployment's
/// `timeout_secs` ended with an `error` event (`upstream_error`) where an
/// Anthropic deployment's ends cleanly at `max_tokens` (`time_limit`):
/// the event-stream reader turned the read timeout into another error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoke_stream_past_its_timeout_ends_cleanly_at_the_time_limit() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(400);
    mock.state
        .set_token_delay(std::time::Duration::from_millis(10));
    let up = config::RawUpstream {
        timeout_secs: Some(1),
        ..bedrock_upstream("br-slow", &mock, "invoke")
    };
    let gw = config_of(vec![up], limits().tpm(1_000_000)).start().await;
    let started = std::time::Instant::now();
    let r = post(&gw, &body(1000, true), "input=5").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    assert!(!text.contains("event: error\n"), "{text}");
    assert!(text.contains(r#""stop_reason":"max_tokens""#), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    gw.all_settled().await;
    let ended = sample_sum(
        &scrape(&gw).await,
        "budgetgate_streams_ended_total",
        &[("deployment", "br-slow"), ("ending", "time_limit")],
    );
    assert_eq!(ended, 1.0);
}

/// Fault guarded against: a deployment's `AccessDeniedException` (an IAM
/// policy, an expired role) failed the request although the model's next
/// deployment could serve it. It is retried there, once per request; the
/// denying deployment cools down (`/readyz`: `access_denied`) and is not
/// sent the next request; a second denial within a request ends it with
/// 502, never 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_denied_deployment_cools_down_and_the_next_one_serves() {
    let (a, b, c) = (start_mock().await, start_mock().await, start_mock().await);
    for m in [&a, &b, &c] {
        m.state.set_output_tokens(5);
    }
    let up = |name: &str, m: &MockUpstream| config::RawUpstream {
        cooldown_secs: Some(60),
        ..bedrock_upstream(name, m, "invoke")
    };
    let gw = config_of(
        vec![up("br-a", &a), up("br-b", &b), up("br-c", &c)],
        limits().tpm(100_000),
    )
    .start()
    .await;
    a.state.bedrock.set_fault(BedrockFault::AccessDenied, 1);
    for stream in [true, false] {
        let r = post(&gw, &body(100, stream), "input=5").await;
        assert_eq!(r.status(), 200, "stream {stream}");
        r.text().await.unwrap();
    }
    assert_eq!(a.state.requests().len(), 1, "denied once, then cooling");
    assert_eq!(b.state.requests().len(), 2);
    let ready: Value = reqwest::get(format!("{}/readyz", gw.root_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["cooling_deployments"][0]["deployment"], "br-a");
    assert_eq!(ready["cooling_deployments"][0]["reason"], "access_denied");
    // br-b and br-c both deny: the request ends at the second denial.
    b.state.bedrock.set_fault(BedrockFault::AccessDenied, 1);
    c.state.bedrock.set_fault(BedrockFault::AccessDenied, 1);
    let r = post(&gw, &body(100, false), "input=5").await;
    assert_eq!(r.status(), 502);
    let text = r.text().await.unwrap();
    assert!(text.contains("Deployment br-c rejected"), "{text}");
    assert_eq!(c.state.requests().len(), 1);
    assert_eq!(b.state.requests().len(), 3);
    // Every deployment denied: 502 naming them, not 429.
    let r = post(&gw, &body(100, false), "input=5").await;
    assert_eq!(r.status(), 502);
    assert!(r.headers().get("retry-after").is_none());
    gw.all_settled().await;
}
