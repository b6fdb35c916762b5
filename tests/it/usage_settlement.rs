//! Settlement from the upstream's usage when it lacks `prompt_tokens`.
//! Fault guarded against: the stream relay read a missing `prompt_tokens`
//! as 0 (under-charging the whole prompt), and the non-streamed path
//! ignored the whole usage and charged its own count of the output
//! instead of the reported `completion_tokens`. Both now settle the input
//! estimate plus `completion_tokens`.
//!
//! And settlement when the usage is no count: a `self_hosted` upstream
//! reporting negative counts was settled at 0, one reporting 2^64 − 1
//! prompt tokens charged the largest cost (a tenant's day). Both now
//! settle at the gateway's own count.

use crate::support::*;
use axum::routing::post;
use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

const COMPLETION_TOKENS: u64 = 7;

/// An upstream whose answers report `{"completion_tokens": 7}` and no
/// `prompt_tokens`; its content ("Hello there") is 2 tokens, not 7.
async fn upstream_without_prompt_tokens() -> String {
    upstream_reporting(json!({"completion_tokens": COMPLETION_TOKENS})).await
}

/// An upstream whose answers ("Hello there", 2 tokens) report `usage`.
async fn upstream_reporting(usage: Value) -> String {
    async fn answer(usage: Value, body: Value) -> axum::response::Response {
        use axum::response::IntoResponse;
        if body["stream"] == json!(true) {
            let chunk = |choices: Value, usage: Option<&Value>| {
                let mut c = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices});
                if let Some(u) = usage {
                    c["usage"] = u.clone();
                }
                format!("data: {c}\n\n")
            };
            let text = [
                chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": "Hello there"}, "finish_reason": null}]), None),
                chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]), None),
                chunk(json!([]), Some(&usage)),
                "data: [DONE]\n\n".to_string(),
            ]
            .concat();
            ([("content-type", "text/event-stream")], text).into_response()
        } else {
            axum::Json(json!({
                "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}],
                "usage": usage,
            }))
            .into_response()
        }
    }
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |axum::Json(body): axum::Json<Value>| answer(usage.clone(), body)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

async fn settles_input_estimate_plus_completion_tokens(stream: bool) {
    let upstream = upstream_without_prompt_tokens().await;
    let gw = TestConfig::standard(&upstream, 50, limits().tokens_per_day(100000))
        .start()
        .await;
    let messages = json!([{"role": "user", "content": "Say hello to the whole wide world."}]);
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "messages": messages, "stream": stream}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(body.contains("Hello there"), "{body}");
    gw.settled().await;
    assert!(input > 5, "a real prompt: {input}");
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input + COMPLETION_TOKENS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_usage_without_prompt_tokens_settles_the_input_estimate_plus_completion_tokens()
{
    settles_input_estimate_plus_completion_tokens(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_usage_without_prompt_tokens_settles_the_input_estimate_plus_completion_tokens() {
    settles_input_estimate_plus_completion_tokens(false).await;
}

/// The gateway's own count of the answer "Hello there" (o200k_base).
const COUNTED_OUTPUT: u64 = 2;

async fn bad_usage_settles_the_gateways_count(usage: Value, stream: bool) {
    let upstream = upstream_reporting(usage.clone()).await;
    let gw = TestConfig::standard(&upstream, 50, limits().tokens_per_day(100000))
        .start()
        .await;
    let messages = json!([{"role": "user", "content": "Say hello to the whole wide world."}]);
    let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "messages": messages, "stream": stream}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(body.contains("Hello there"), "{body}");
    gw.settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input + COUNTED_OUTPUT,
        "usage {usage}, stream {stream}"
    );
    let metrics = gw.metrics_text().await;
    assert!(
        metrics.lines().any(
            |l| l.starts_with("budgetgate_upstream_usage_rejected_total{")
                && l.contains("deployment=\"mock\"")
                && l.contains("field=\"prompt_tokens\"")
        ),
        "{metrics}"
    );
}

fn bad_usages() -> [Value; 3] {
    [
        json!({"prompt_tokens": -5, "completion_tokens": -3, "total_tokens": -8}),
        json!({"prompt_tokens": 18446744073709551615u64, "completion_tokens": 18446744073709551615u64}),
        json!({"prompt_tokens": 12.5, "completion_tokens": 3.5, "total_tokens": 16}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_huge_and_fractional_usage_settles_the_gateways_count() {
    for usage in bad_usages() {
        bad_usage_settles_the_gateways_count(usage, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_huge_and_fractional_streamed_usage_settles_the_gateways_count() {
    for usage in bad_usages() {
        bad_usage_settles_the_gateways_count(usage, true).await;
    }
}

/// A well-formed count above what the request could use (its prompt is
/// a few tokens; the cap sent is 50) is not trusted either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_above_the_requests_bounds_settles_the_gateways_count() {
    for stream in [false, true] {
        let usage = json!({"prompt_tokens": 5_000_000, "completion_tokens": 90_000});
        let upstream = upstream_reporting(usage).await;
        let gw = TestConfig::standard(&upstream, 50, limits().tokens_per_day(100000))
            .start()
            .await;
        let messages = json!([{"role": "user", "content": "Say hello."}]);
        let input = chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages}));
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(KEY)
            .json(&json!({"model": "gpt-4o-mini", "messages": messages, "stream": stream, "max_tokens": 50}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
        gw.settled().await;
        assert_eq!(
            gw.t1_used(BudgetName::TokensPerDay).await,
            input + COUNTED_OUTPUT,
            "stream {stream}"
        );
    }
}
