//! The mock's Gemini API and Vertex Gemini (`examples/mock_upstream/gemini.rs`)
//! answer with Google's wire shapes: what the gateway's Gemini tests rely on.

use serde_json::{json, Value};

use crate::support::mock_upstream::gemini::{prompt_tokens, GeminiFault};
use crate::support::*;

fn body(max_output: u64) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": "Say hello"}]}],
           "generationConfig": {"maxOutputTokens": max_output}})
}

async fn post(url: String, b: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("x-goog-api-key", "k")
        .json(b)
        .send()
        .await
        .expect("POST to the mock")
}

#[tokio::test]
async fn whole_answers_carry_every_usage_field_and_their_sum() {
    let m = start_mock().await;
    m.state.set_output_tokens(10);
    m.state.gemini.set_thoughts(4);
    m.state.gemini.set_cached(2);
    m.state.gemini.set_tool_use_prompt(3);
    let b = body(12);
    let r = post(
        format!("{}/v1beta/models/gemini-x:generateContent", m.root_url()),
        &b,
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let u = &v["usageMetadata"];
    let p = prompt_tokens(&b);
    // 12 = 4 thoughts + 8 candidate tokens: the cap holds both.
    assert_eq!(u["candidatesTokenCount"], 8);
    assert_eq!(u["thoughtsTokenCount"], 4);
    assert_eq!(u["cachedContentTokenCount"], 2);
    assert_eq!(u["toolUsePromptTokenCount"], 3);
    assert_eq!(u["promptTokenCount"], p);
    assert_eq!(u["totalTokenCount"], p + 3 + 8 + 4);
    assert_eq!(v["candidates"][0]["finishReason"], "MAX_TOKENS");
}

#[tokio::test]
async fn streams_are_sse_with_alt_sse_and_a_json_array_without() {
    let m = start_mock().await;
    m.state.set_output_tokens(3);
    let b = body(100);
    let r = post(
        format!(
            "{}/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
            m.root_url()
        ),
        &b,
    )
    .await;
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("text/event-stream")
    );
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .split("\r\n\r\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "{text}");
    assert_eq!(events[2]["candidates"][0]["finishReason"], "STOP");
    assert_eq!(events[2]["usageMetadata"]["candidatesTokenCount"], 3);
    assert!(events[0]["candidates"][0].get("finishReason").is_none());

    let r = post(
        format!(
            "{}/v1beta/models/gemini-x:streamGenerateContent",
            m.root_url()
        ),
        &b,
    )
    .await;
    let text = r.text().await.unwrap();
    let array: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(array.len(), 3);
    assert_eq!(
        array[2]["usageMetadata"]["totalTokenCount"],
        prompt_tokens(&b) + 3
    );
}

#[tokio::test]
async fn count_tokens_the_model_list_the_key_and_faults() {
    let m = start_mock().await;
    let b = body(10);
    let r = post(
        format!("{}/v1beta/models/gemini-x:countTokens", m.root_url()),
        &b,
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["totalTokens"], prompt_tokens(&b));
    let v: Value = reqwest::get(format!("{}/v1beta/models", m.root_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v["models"].as_array().is_some_and(|a| !a.is_empty()));

    m.state.gemini.set_api_key(Some("right"));
    let r = post(
        format!("{}/v1beta/models/gemini-x:generateContent", m.root_url()),
        &b,
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["details"][0]["reason"], "API_KEY_INVALID");
    let r = post(
        format!(
            "{}/v1beta/models/gemini-x:generateContent?key=right",
            m.root_url()
        ),
        &b,
    )
    .await;
    assert_eq!(r.status(), 400, "the header's key is read first");
    m.state.gemini.set_api_key(None);

    m.state.gemini.set_fault(Some(GeminiFault::Throttle));
    let r = post(
        format!("{}/v1beta/models/gemini-x:generateContent", m.root_url()),
        &b,
    )
    .await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
    assert_eq!(v["error"]["details"][1]["retryDelay"], "2s");
    m.state.gemini.set_fault(None);
    let r = post(
        format!(
            "{}/v1beta/models/gemini-x-fault-quota_day:generateContent",
            m.root_url()
        ),
        &b,
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["details"][0]["violations"][0]["quotaId"],
        "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
    );
}

#[tokio::test]
async fn vertex_gemini_checks_the_token_and_throttles_by_region() {
    let m = crate::support::mock_upstream::vertex::start("p1", "us-east5")
        .await
        .unwrap();
    m.state.messages.set_output_tokens(2);
    let path = |region: &str| {
        format!(
            "{}/v1/projects/p1/locations/{region}/publishers/google/models/gemini-x:generateContent",
            m.root_url()
        )
    };
    let r = reqwest::Client::new()
        .post(path("us-east5"))
        .bearer_auth("not-issued")
        .json(&body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    m.state.add_refresh_token("rt");
    let token: Value = reqwest::Client::new()
        .post(format!("{}/token", m.root_url()))
        .form(&[("grant_type", "refresh_token"), ("refresh_token", "rt")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let bearer = token["access_token"].as_str().unwrap_or("").to_string();
    let r = reqwest::Client::new()
        .post(path("us-east5"))
        .bearer_auth(&bearer)
        .json(&body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 2);
    m.state.throttle_region("us-east5");
    let r = reqwest::Client::new()
        .post(path("us-east5"))
        .bearer_auth(&bearer)
        .json(&body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
    let sent = m.state.messages.gemini.requests();
    assert_eq!(sent.len(), 1, "throttled before the model");
    assert_eq!(sent[0].surface, "vertex");
}
