//! Chat completions for Gemini models: the gateway sends them to each
//! surface's OpenAI-compatible endpoint (the Gemini API's
//! `/v1beta/openai/chat/completions` with the deployment's key as a
//! bearer token; Vertex's `.../endpoints/openapi/chat/completions` with
//! the access token and the model as `google/{model}`), and settles what
//! that endpoint reports: thoughts outside `completion_tokens`, inside
//! `total_tokens` and as `completion_tokens_details.reasoning_tokens`, all
//! charged as output. Then Antigravity's enterprise-gateway requests
//! (OpenAI's wire protocol, its attribution headers `User-Agent` and
//! `X-Goog-Api-Client`): the headers reach both kinds of Gemini
//! deployment. `agy` itself is no registry package (docs/GEMINI.md), so
//! its documented request shape is sent with reqwest.

use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

use crate::gemini::{config, start_vertex, studio, vertex_gemini, MODEL, UPSTREAM_KEY};
use crate::support::*;

/// What Antigravity sends to an enterprise gateway besides the key, in
/// the form its public descriptions give.
const AGY_USER_AGENT: &str = "antigravity/1.15.8 linux/amd64";
const AGY_API_CLIENT: &str = "google-cloud-sdk vscode_cloudshelleditor/0.1";

fn chat(stream: bool) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 200,
        "messages": [{"role": "user", "content": "Say hello to the budget gate"}]});
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

async fn post_chat(root: &str, b: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{root}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(b);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.expect("POST /v1/chat/completions")
}

/// The `usage` of a whole answer, or of a stream's usage chunk.
async fn usage_of(r: reqwest::Response, stream: bool) -> Value {
    assert_eq!(r.status(), 200);
    if !stream {
        let v: Value = r.json().await.expect("a JSON answer");
        return v["usage"].clone();
    }
    let text = r.text().await.expect("the stream");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .expect("a usage chunk")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_go_to_the_gemini_apis_openai_endpoint_and_settle_its_thoughts() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    mock.state.gemini.set_thoughts(30);
    mock.state.gemini.set_api_key(Some(UPSTREAM_KEY));
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().tpm(100_000).input_tpm(100_000).output_tpm(100_000),
    )
    .start()
    .await;
    let mut prompts = 0;
    for stream in [false, true] {
        let u = usage_of(post_chat(&gw.root_url(), &chat(stream), &[]).await, stream).await;
        let prompt = u["prompt_tokens"].as_u64().expect("prompt_tokens");
        prompts += prompt;
        // Google's shape: the thoughts are outside completion_tokens.
        assert_eq!(u["completion_tokens"], 20, "{u}");
        assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], 30);
        assert_eq!(u["total_tokens"].as_u64(), Some(prompt + 50));
    }
    let sent = mock.state.gemini.requests();
    assert_eq!(sent.len(), 2);
    for q in &sent {
        assert_eq!(q.surface, "ai_studio_openai");
        assert_eq!(q.key.as_deref(), Some(UPSTREAM_KEY), "the deployment's key");
        assert_eq!(q.body["model"], MODEL);
        assert_eq!(q.body["max_tokens"], 200, "the cap as max_tokens");
        assert!(q.body.get("max_completion_tokens").is_none());
    }
    let paths: Vec<String> = mock
        .state
        .requests()
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(paths, ["/v1beta/openai/chat/completions"; 2]);
    assert_no_header_holds(&mock.state.requests(), KEY);
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::OutputTpm).await,
        2 * 50,
        "thoughts are output"
    );
    assert_eq!(gw.t1_used(BudgetName::InputTpm).await, prompts);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, prompts + 2 * 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_go_to_vertexs_openai_endpoint_with_the_access_token() {
    let m = start_vertex().await;
    m.state.messages.set_output_tokens(20);
    m.state.messages.gemini.set_thoughts(30);
    let dir = tempfile::tempdir().unwrap();
    let gw = config(
        vec![vertex_gemini("east", &m, crate::vertex::EAST, dir.path())],
        limits().tpm(100_000).output_tpm(100_000),
    )
    .start()
    .await;
    let u = usage_of(post_chat(&gw.root_url(), &chat(false), &[]).await, false).await;
    let prompt = u["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(u["completion_tokens"], 20);
    let sent = m.state.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].method, "chat/completions");
    assert_eq!(sent[0].region, crate::vertex::EAST);
    assert_eq!(
        sent[0].model,
        format!("google/{MODEL}"),
        "the publisher first"
    );
    let bearer = sent[0].header("authorization").unwrap_or_default();
    assert!(
        m.state
            .issued_tokens()
            .iter()
            .any(|t| bearer == format!("Bearer {t}")),
        "an access token the mock issued: {bearer}"
    );
    assert_eq!(
        m.state.messages.gemini.requests()[0].surface,
        "vertex_openai"
    );
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::OutputTpm).await, 50);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, prompt + 50);
}

/// Antigravity's enterprise-gateway mode: OpenAI's wire protocol, a
/// streamed chat completion, its attribution headers. They arrive at a
/// Vertex Gemini deployment and at a Gemini API deployment as sent; the
/// gateway key does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn antigravitys_attribution_headers_reach_both_kinds_of_gemini_deployment() {
    let agy = [
        ("user-agent", AGY_USER_AGENT),
        ("x-goog-api-client", AGY_API_CLIENT),
    ];
    let m = start_vertex().await;
    m.state.messages.set_output_tokens(5);
    let dir = tempfile::tempdir().unwrap();
    let gw = config(
        vec![vertex_gemini("east", &m, crate::vertex::EAST, dir.path())],
        limits().tpm(100_000),
    )
    .start()
    .await;
    usage_of(post_chat(&gw.root_url(), &chat(true), &agy).await, true).await;
    let sent = m.state.messages.gemini.requests();
    assert_eq!(sent.len(), 1);
    for (k, v) in agy {
        assert_eq!(sent[0].header(k), Some(v), "{k} at Vertex");
    }
    assert!(sent[0].headers.iter().all(|(_, v)| !v.contains(KEY)));

    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().tpm(100_000),
    )
    .start()
    .await;
    usage_of(post_chat(&gw.root_url(), &chat(true), &agy).await, true).await;
    let sent = mock.state.gemini.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].surface, "ai_studio_openai");
    for (k, v) in agy {
        assert_eq!(sent[0].header(k), Some(v), "{k} at the Gemini API");
    }
    assert_no_header_holds(&mock.state.requests(), KEY);
}
