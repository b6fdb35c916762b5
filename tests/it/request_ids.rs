//! Every answer names its request: success or refusal, on every route, the
//! response carries the dialect's request-id header (`x-request-id` for
//! the OpenAI dialects, `request-id` for Anthropic's) and the request's
//! final log line has the same id, so a user can match a 429 to its line.
//! Fault guarded against: refusals carried no id and logged
//! `request_id=""`, and the Anthropic route's refusals lacked `request-id`.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::config::{self, tenant};
use crate::support::*;

/// A tenant allowed one request a minute: its second request is a 429 on any route.
const ONE_KEY: &str = "sk-request-ids-one-rpm";

/// The mock as `mock` (OpenAI models) and `claude` (Anthropic), tenant
/// `t1` ([`KEY`]) and tenant `one` ([`ONE_KEY`], 1 RPM), bodies up to 4 KiB.
fn gateway_config(mock: &mock_upstream::MockUpstream) -> TestConfig {
    let mut c = TestConfig::standard(&mock.base_url(), 20, limits().tpm(1_000_000));
    c.server.max_body_bytes = Some(4096);
    c.upstreams.push(config::upstream(
        "claude",
        Kind::Anthropic,
        &mock.root_url(),
    ));
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        max_output_tokens: Some(4096),
        ..config::model("claude-test", &["claude"])
    });
    c.tenants.push(tenant("one", "k", ONE_KEY, limits().rpm(1)));
    c
}

/// How a test request presents its key.
#[derive(Clone, Copy)]
enum Auth {
    NoKey,
    Bearer(&'static str),
    XApiKey(&'static str),
}

/// One request: method, path, key, body (a JSON value, or raw text).
struct Call {
    method: Method,
    path: &'static str,
    auth: Auth,
    body: Option<String>,
}

fn call(method: Method, path: &'static str, auth: Auth, body: Option<Value>) -> Call {
    Call {
        method,
        path,
        auth,
        body: body.map(|b| b.to_string()),
    }
}

fn raw(path: &'static str, auth: Auth, body: String) -> Call {
    Call {
        method: Method::POST,
        path,
        auth,
        body: Some(body),
    }
}

/// Sends `c`; returns the status and the value of `id_header`.
async fn send(gw: &GatewayProcess, c: &Call, id_header: &str) -> (u16, Option<String>) {
    let mut req = reqwest::Client::new()
        .request(c.method.clone(), format!("{}{}", gw.root, c.path))
        .header("anthropic-version", "2023-06-01");
    req = match c.auth {
        Auth::NoKey => req,
        Auth::Bearer(k) => req.bearer_auth(k),
        Auth::XApiKey(k) => req.header("x-api-key", k),
    };
    if let Some(b) = &c.body {
        req = req
            .header("content-type", "application/json")
            .body(b.clone());
    }
    let r = req.send().await.expect("gateway");
    let status = r.status().as_u16();
    let id = header(&r, id_header);
    r.bytes().await.expect("body");
    (status, id)
}

/// The final line of request `id` (the one with an `outcome`), waited for.
async fn final_line(gw: &GatewayProcess, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = gw.logs().into_iter().find(|l| {
            l.pointer("/fields/request_id").and_then(Value::as_str) == Some(id)
                && l.pointer("/fields/outcome").is_some()
        });
        if let Some(l) = found {
            return l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no final line with request_id {id}; logs:\n{}",
            gw.dump_logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends every call of `calls` in order, each expected to answer its
/// status with an id in `id_header` that its final line repeats.
async fn check(gw: &GatewayProcess, id_header: &str, calls: &[(Call, u16)]) {
    for (c, want) in calls {
        let what = format!("{} {}", c.method, c.path);
        let (status, id) = send(gw, c, id_header).await;
        assert_eq!(status, *want, "{what}");
        let id = id.unwrap_or_else(|| panic!("{what} ({status}): no {id_header} header"));
        assert!(!id.is_empty(), "{what}: empty {id_header}");
        let line = final_line(gw, &id).await;
        let outcome = line.pointer("/fields/outcome").and_then(Value::as_str);
        let expected = if *want < 300 { "answered" } else { "refused" };
        assert_eq!(outcome, Some(expected), "{what}: {line:#}");
        if *want >= 400 {
            assert_eq!(
                line.pointer("/fields/status").and_then(Value::as_u64),
                Some(u64::from(*want)),
                "{what}: {line:#}"
            );
        }
    }
}

fn chat() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
}

fn message() -> Value {
    json!({"model": "claude-test", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

/// A JSON body over the 4 KiB limit.
fn too_large(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "x".repeat(8192)}]}).to_string()
}

async fn started() -> (
    mock_upstream::MockUpstream,
    GatewayProcess,
    tempfile::TempDir,
) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(4);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = gateway_config(&mock).write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    (mock, gw, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_openai_dialect_answer_and_refusal_has_an_x_request_id_its_log_line_repeats() {
    let (_mock, gw, _dir) = started().await;
    use Auth::*;
    let bad = || Some(json!({"model": "gpt-4o-mini"}));
    let calls = [
        // The one request tenant `one` may make this minute; all its later ones are 429s.
        (
            call(
                Method::POST,
                "/v1/chat/completions",
                Bearer(ONE_KEY),
                Some(chat()),
            ),
            200,
        ),
        (
            call(
                Method::POST,
                "/v1/chat/completions",
                Bearer(ONE_KEY),
                Some(chat()),
            ),
            429,
        ),
        (
            call(Method::POST, "/v1/chat/completions", NoKey, Some(chat())),
            401,
        ),
        (
            call(
                Method::POST,
                "/v1/chat/completions",
                Bearer("sk-wrong"),
                Some(chat()),
            ),
            401,
        ),
        (
            call(Method::POST, "/v1/chat/completions", Bearer(KEY), bad()),
            400,
        ),
        (
            raw("/v1/chat/completions", Bearer(KEY), "{not json".into()),
            400,
        ),
        (
            call(
                Method::POST,
                "/v1/chat/completions",
                Bearer(KEY),
                Some(json!({"model": "no-such-model", "messages": []})),
            ),
            404,
        ),
        (
            raw(
                "/v1/chat/completions",
                Bearer(KEY),
                too_large("gpt-4o-mini"),
            ),
            413,
        ),
        (
            call(
                Method::POST,
                "/v1/completions",
                Bearer(ONE_KEY),
                Some(json!({"model": "gpt-4o-mini", "prompt": "hi"})),
            ),
            429,
        ),
        (call(Method::POST, "/v1/completions", NoKey, None), 401),
        (
            call(
                Method::POST,
                "/v1/embeddings",
                Bearer(ONE_KEY),
                Some(json!({"model": "text-embedding-3-small", "input": "hi"})),
            ),
            429,
        ),
        (
            call(
                Method::POST,
                "/v1/embeddings",
                Bearer(KEY),
                Some(json!({"model": "text-embedding-3-small"})),
            ),
            400,
        ),
        (
            call(
                Method::POST,
                "/v1/responses",
                Bearer(KEY),
                Some(json!({"model": "gpt-4o-mini", "input": "hi"})),
            ),
            200,
        ),
        (
            call(
                Method::POST,
                "/v1/responses",
                Bearer(ONE_KEY),
                Some(json!({"model": "gpt-4o-mini", "input": "hi"})),
            ),
            429,
        ),
        (
            call(
                Method::POST,
                "/v1/responses",
                Bearer(KEY),
                Some(json!({"input": "hi"})),
            ),
            400,
        ),
        (
            call(
                Method::POST,
                "/v1/responses/input_tokens",
                Bearer(ONE_KEY),
                Some(json!({"model": "gpt-4o-mini", "input": "hi"})),
            ),
            429,
        ),
        (
            call(
                Method::POST,
                "/v1/responses/input_tokens",
                Bearer(KEY),
                Some(json!({"model": "gpt-4o-mini", "input": "hi"})),
            ),
            200,
        ),
        // Stored-response routes: unknown ids, and no key.
        (
            call(Method::GET, "/v1/responses/resp_unknown", Bearer(KEY), None),
            404,
        ),
        (
            call(Method::DELETE, "/v1/responses/resp_unknown", NoKey, None),
            401,
        ),
        (
            call(
                Method::POST,
                "/v1/responses/resp_unknown/cancel",
                Bearer(KEY),
                None,
            ),
            404,
        ),
        (
            call(
                Method::GET,
                "/v1/responses/resp_unknown/input_items",
                Bearer(KEY),
                None,
            ),
            404,
        ),
        // Routes the gateway answers itself (`/v1/models` answers in
        // Anthropic's shape here: every call carries anthropic-version).
        (
            call(Method::GET, "/v1/no-such-route", Bearer(KEY), None),
            404,
        ),
        (
            call(Method::GET, "/v1/chat/completions", Bearer(KEY), None),
            405,
        ),
        // Azure's path form.
        (
            call(
                Method::POST,
                "/openai/deployments/gpt-4o-mini/chat/completions",
                NoKey,
                Some(chat()),
            ),
            401,
        ),
    ];
    check(&gw, "x-request-id", &calls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_anthropic_answer_and_refusal_has_a_request_id_its_log_line_repeats() {
    let (_mock, gw, _dir) = started().await;
    use Auth::*;
    let count =
        || Some(json!({"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]}));
    let calls = [
        (
            call(
                Method::POST,
                "/v1/messages",
                XApiKey(ONE_KEY),
                Some(message()),
            ),
            200,
        ),
        (
            call(
                Method::POST,
                "/v1/messages",
                XApiKey(ONE_KEY),
                Some(message()),
            ),
            429,
        ),
        (
            call(Method::POST, "/v1/messages", NoKey, Some(message())),
            401,
        ),
        (
            call(
                Method::POST,
                "/v1/messages",
                XApiKey("sk-wrong"),
                Some(message()),
            ),
            401,
        ),
        (
            call(
                Method::POST,
                "/v1/messages",
                XApiKey(KEY),
                Some(json!({"model": "claude-test"})),
            ),
            400,
        ),
        (
            call(
                Method::POST,
                "/v1/messages",
                Bearer(KEY),
                Some(json!({"model": "gpt-4o-mini", "max_tokens": 5, "messages": []})),
            ),
            404,
        ),
        (
            raw("/v1/messages", XApiKey(KEY), too_large("claude-test")),
            413,
        ),
        // Model discovery, in Anthropic's shape (the call carries anthropic-version).
        (call(Method::GET, "/v1/models", NoKey, None), 401),
        (call(Method::GET, "/v1/models", XApiKey(KEY), None), 200),
        (call(Method::GET, "/v1/models", Bearer(KEY), None), 200),
        (
            call(Method::GET, "/v1/models/no-such-model", XApiKey(KEY), None),
            404,
        ),
        (
            call(
                Method::POST,
                "/v1/messages/count_tokens",
                XApiKey(KEY),
                count(),
            ),
            200,
        ),
        (
            call(
                Method::POST,
                "/v1/messages/count_tokens",
                XApiKey(ONE_KEY),
                count(),
            ),
            429,
        ),
        (
            call(Method::POST, "/v1/messages/count_tokens", NoKey, count()),
            401,
        ),
        (
            call(
                Method::POST,
                "/v1/messages/count_tokens",
                XApiKey(KEY),
                Some(json!({"messages": []})),
            ),
            400,
        ),
    ];
    check(&gw, "request-id", &calls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_answer_names_the_request_and_a_client_id_is_kept() {
    let (_mock, gw, _dir) = started().await;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/v1/responses", gw.root))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "input": "hi"}))
        .send()
        .await
        .expect("gateway");
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let r = client
        .get(format!("{}/v1/responses/{id}", gw.root))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("gateway");
    assert_eq!(r.status(), 200);
    let rid = must_header(&r, "x-request-id");
    assert_eq!(
        final_line(&gw, &rid).await.pointer("/fields/outcome"),
        Some(&json!("answered"))
    );
    // A client's own id names its refusal too.
    let r = client
        .post(format!("{}/v1/messages", gw.root))
        .header("request-id", "client-trace-401")
        .json(&message())
        .send()
        .await
        .expect("gateway");
    assert_eq!(r.status(), 401);
    assert_eq!(must_header(&r, "request-id"), "client-trace-401");
    assert_eq!(
        final_line(&gw, "client-trace-401")
            .await
            .pointer("/fields/error"),
        Some(&json!("missing_key"))
    );
}
