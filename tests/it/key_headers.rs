//! The client's gateway key never leaves in any header: not as its request
//! id (`x-request-id`, `request-id`), not inside a forwarded header's value
//! (`Bearer <key>` in a non-credential header), not as `anthropic-version`,
//! on any route that calls an upstream. Nor is it echoed back or logged.
//! Fault guarded against: a key sent as `x-request-id` was forwarded
//! upstream, echoed and logged; only configured forwarded headers were
//! compared with the key.

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::config;
use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// A header the deployments forward (no credential by name).
const NOTE: &str = "x-trace-note";

/// `mock` (self-hosted) and `claude` (Anthropic) on one simulated
/// upstream, both forwarding [`NOTE`].
fn gateway_config(mock: &MockUpstream) -> TestConfig {
    let mut c = TestConfig::standard(&mock.base_url(), 20, limits().tpm(1_000_000));
    c.upstream("mock").forward_client_headers = vec![NOTE.into()];
    c.upstreams.push(config::RawUpstream {
        forward_client_headers: vec![NOTE.into()],
        ..config::upstream("claude", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        max_output_tokens: Some(4096),
        ..config::model("claude-test", &["claude"])
    });
    c
}

/// Sends `body` to `path` with the key in the dialect's key header and
/// again in every header that could carry it on: the request id, the
/// forwarded note (as `Bearer <key>`) and, on Messages, the version.
async fn send_with_key_everywhere(
    gw: &GatewayProcess,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let anthropic = path.starts_with("/v1/messages");
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", gw.root))
        .header(NOTE, format!("Bearer {KEY}"));
    req = if anthropic {
        req.header("x-api-key", KEY)
            .header("request-id", KEY)
            .header("anthropic-version", KEY)
    } else {
        req.bearer_auth(KEY)
            .header("x-request-id", format!("id-{KEY}"))
    };
    if let Some(b) = body {
        req = req.json(b);
    }
    req.send().await.expect("gateway")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_key_sent_in_any_header_never_reaches_the_upstream_on_any_route() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(4);
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = GatewayProcess::start(&gateway_config(&mock).write(dir.path()), &[]).await;

    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let stream = json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let completion = json!({"model": "gpt-4o-mini", "prompt": "hi"});
    let embedding = json!({"model": "text-embedding-3-small", "input": "hi"});
    let response = json!({"model": "gpt-4o-mini", "input": "hi"});
    let message = json!({"model": "claude-test", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let count = json!({"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]});
    let mut stored_id = String::new();
    let posts = [
        ("/v1/chat/completions", &chat),
        ("/v1/chat/completions", &stream),
        ("/v1/completions", &completion),
        ("/v1/embeddings", &embedding),
        ("/openai/deployments/gpt-4o-mini/chat/completions", &chat),
        ("/v1/responses", &response),
        ("/v1/responses/input_tokens", &response),
        ("/v1/messages", &message),
        ("/v1/messages/count_tokens", &count),
    ];
    for (path, body) in posts {
        let r = send_with_key_everywhere(&gw, Method::POST, path, Some(body)).await;
        assert_eq!(r.status(), 200, "{path}");
        for (name, value) in r.headers() {
            let value = String::from_utf8_lossy(value.as_bytes());
            assert!(!value.contains(KEY), "{path}: the key came back in {name}");
        }
        let text = r.text().await.expect("body");
        if path == "/v1/responses" {
            let v: Value = serde_json::from_str(&text).expect("json");
            stored_id = v["id"].as_str().expect("response id").to_string();
        }
    }
    // The stored-response routes (delete last: it removes the record).
    for (method, path) in [
        (Method::GET, format!("/v1/responses/{stored_id}")),
        (
            Method::GET,
            format!("/v1/responses/{stored_id}/input_items"),
        ),
        (Method::POST, format!("/v1/responses/{stored_id}/cancel")),
        (Method::DELETE, format!("/v1/responses/{stored_id}")),
    ] {
        let r = send_with_key_everywhere(&gw, method.clone(), &path, None).await;
        assert!(r.status().as_u16() < 500, "{method} {path}: {}", r.status());
        r.bytes().await.expect("body");
    }

    let log = mock.state.requests();
    // Every route that calls an upstream did (count_tokens and input_tokens do not).
    assert_eq!(log.len(), posts.len() - 2 + 4, "{log:#?}");
    assert_no_header_holds(&log, KEY);
    for r in &log {
        assert!(
            r.header(NOTE).is_none(),
            "{}: the note held the key",
            r.path
        );
    }
    let messages = log
        .iter()
        .find(|r| r.path.ends_with("/messages"))
        .expect("a Messages call");
    assert_eq!(
        messages.header("anthropic-version"),
        Some("2023-06-01"),
        "the upstream's version replaces the client's"
    );
    let logs = gw.dump_logs();
    assert!(!logs.contains(KEY), "the key was logged:\n{logs}");

    // The same headers without the key are forwarded: the checks above could fail.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root))
        .bearer_auth(KEY)
        .header(NOTE, "note-1")
        .header("x-request-id", "trace-1")
        .json(&chat)
        .send()
        .await
        .expect("gateway");
    assert_eq!(r.status(), 200);
    assert_eq!(must_header(&r, "x-request-id"), "trace-1");
    let last = mock.state.requests().pop().expect("a request");
    assert_eq!(last.header(NOTE), Some("note-1"));
    assert_eq!(last.header("x-request-id"), Some("trace-1"));
}
