//! Bad input and upstream failures: each gets the right status and an
//! OpenAI-shaped error, charges nothing (or only the request count when the
//! upstream was called), and never leaks the concurrency slot.

use crate::support::mock_upstream::Fault;
use crate::support::*;
use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

/// Tenant `t1`'s limits in every test here.
fn tenant_limits() -> Limits {
    limits().tpm(10000).rpm(100).max_concurrent(1)
}

fn assert_openai_error(v: &Value) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.as_object().unwrap().contains_key("param"), "{v}");
    assert!(e.as_object().unwrap().contains_key("code"), "{v}");
}

fn chat(extra: Value) -> Vec<u8> {
    let mut b = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    serde_json::to_vec(&b).unwrap()
}

/// `prefix` followed by an unterminated 40,000-byte string: invalid JSON
/// larger than the 32 KB that is parsed on the serving thread.
fn large(prefix: &[u8]) -> Vec<u8> {
    let mut b = prefix.to_vec();
    b.push(b'"');
    b.extend(std::iter::repeat_n(b'a', 40_000));
    b
}

/// After a failure: nothing charged and the single slot is free again.
async fn assert_nothing_leaked(gw: &Gateway, rpm_spent: i64) {
    gw.settled().await;
    assert_eq!(gw.t1(BudgetName::Tpm).await, 10000, "tokens were charged");
    assert_eq!(gw.t1(BudgetName::Rpm).await, 100 - rpm_spent);
    assert_eq!(
        gw.t1(BudgetName::MaxConcurrent).await,
        1,
        "the concurrency slot leaked"
    );
}

/// (what, path, key, body, expected status, expected `param`).
type Case = (
    &'static str,
    &'static str,
    Option<&'static str>,
    Vec<u8>,
    u16,
    Option<&'static str>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_input_gets_its_status_and_charges_nothing() {
    let mock = start_mock().await;
    // A small body cap keeps the oversized body within socket buffers, so the
    // client always reads the 413 instead of racing a reset connection.
    let mut config = TestConfig::standard(&mock.base_url(), 100, tenant_limits());
    config.server.max_body_bytes = Some(65536);
    let gw = config.start().await;
    let cases: Vec<Case> = vec![
        (
            "missing key",
            "/chat/completions",
            None,
            chat(json!({})),
            401,
            None,
        ),
        (
            "unknown key",
            "/chat/completions",
            Some("sk-wrong"),
            chat(json!({})),
            401,
            None,
        ),
        (
            "malformed JSON",
            "/chat/completions",
            Some(KEY),
            b"{\"model\": ".to_vec(),
            400,
            None,
        ),
        (
            "body over the cap",
            "/chat/completions",
            Some(KEY),
            vec![b' '; 70_000],
            413,
            None,
        ),
        (
            "unknown model",
            "/chat/completions",
            Some(KEY),
            chat(json!({"model": "gpt-nope"})),
            404,
            Some("model"),
        ),
        (
            "negative max_tokens",
            "/chat/completions",
            Some(KEY),
            chat(json!({"max_tokens": -5})),
            400,
            Some("max_tokens"),
        ),
        (
            "zero max_tokens",
            "/chat/completions",
            Some(KEY),
            chat(json!({"max_tokens": 0})),
            400,
            Some("max_tokens"),
        ),
        (
            "fractional max_tokens",
            "/chat/completions",
            Some(KEY),
            chat(json!({"max_tokens": 1.5})),
            400,
            Some("max_tokens"),
        ),
        (
            "string max_completion_tokens",
            "/chat/completions",
            Some(KEY),
            chat(json!({"max_completion_tokens": "9"})),
            400,
            Some("max_completion_tokens"),
        ),
        (
            "n = 0",
            "/chat/completions",
            Some(KEY),
            chat(json!({"n": 0})),
            400,
            Some("n"),
        ),
        (
            "messages missing",
            "/chat/completions",
            Some(KEY),
            br#"{"model":"gpt-4o-mini"}"#.to_vec(),
            400,
            Some("messages"),
        ),
        // Bodies over 32 KB are parsed on the estimation threads:
        // the same errors, the same nothing charged.
        (
            "malformed JSON over 32 KB",
            "/chat/completions",
            Some(KEY),
            large(br#"{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "#),
            400,
            None,
        ),
        (
            "unknown model over 32 KB",
            "/chat/completions",
            Some(KEY),
            chat(json!({"model": "gpt-nope", "user": "x".repeat(40_000)})),
            404,
            Some("model"),
        ),
        (
            "negative max_tokens over 32 KB",
            "/chat/completions",
            Some(KEY),
            chat(json!({"max_tokens": -5, "user": "x".repeat(40_000)})),
            400,
            Some("max_tokens"),
        ),
        (
            "unknown path",
            "/assistants",
            Some(KEY),
            chat(json!({})),
            404,
            None,
        ),
        (
            "unknown nested path",
            "/chat/completions/extra",
            Some(KEY),
            chat(json!({})),
            404,
            None,
        ),
    ];
    for (what, path, key, body, status, param) in cases {
        let (got, v) = post_raw(&gw, path, key, body).await;
        assert_eq!(got, status, "{what}: {v}");
        assert_openai_error(&v);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{what}: {v}");
        }
        assert_nothing_leaked(&gw, 0).await;
    }
    assert_eq!(
        mock.state.request_count(),
        0,
        "no rejected request reached the upstream"
    );
    let (s, v) = post_raw(
        &gw,
        "/chat/completions",
        Some(KEY),
        chat(json!({"model": "gpt-nope"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_refund_tokens_and_free_the_slot() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, tenant_limits())
        .start()
        .await;
    let mut spent = 0;
    for (fault, status) in [
        (Fault::NonJson, 502u16),
        (Fault::BadRequest, 400),
        (Fault::Unauthorized, 502),
        (Fault::ServerError, 502),
        (Fault::RateLimited, 429),
    ] {
        mock.state.set_fault(Some(fault));
        let (got, v) = post_raw(&gw, "/chat/completions", Some(KEY), chat(json!({}))).await;
        assert_eq!(got, status, "{fault:?}: {v}");
        assert_openai_error(&v);
        if fault == Fault::BadRequest {
            assert_eq!(
                v["error"]["param"], "messages",
                "the upstream's 400 body is passed through: {v}"
            );
        }
        let text = v.to_string();
        assert!(
            !text.contains("127.0.0.1"),
            "internal address leaked: {text}"
        );
        spent += 1; // the request count stays spent once the upstream was called
        assert_nothing_leaked(&gw, spent).await;
    }
    mock.state.set_fault(None);
    let (got, v) = post_raw(&gw, "/chat/completions", Some(KEY), chat(json!({}))).await;
    assert_eq!(
        got, 429,
        "the deployment cools down for the upstream's retry-after: {v}"
    );
    assert_eq!(
        mock.state.request_count(),
        5,
        "no traffic to a cooling deployment"
    );
    gw.clock.advance(2_000_000);
    let (got, _) = post_raw(&gw, "/chat/completions", Some(KEY), chat(json!({}))).await;
    assert_eq!(
        got, 200,
        "a healthy request is admitted after the cool-down"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502_that_charges_no_tokens() {
    // Bind and drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gw = TestConfig::standard(&format!("http://127.0.0.1:{port}/v1"), 100, tenant_limits())
        .start()
        .await;
    let (got, v) = post_raw(&gw, "/chat/completions", Some(KEY), chat(json!({}))).await;
    assert_eq!(got, 502, "{v}");
    assert_openai_error(&v);
    assert!(
        !v.to_string().contains(&port.to_string()),
        "internal address leaked: {v}"
    );
    // The request never reached the upstream: voided, its request count
    // refunded too (store contract v3, DESIGN section 13).
    assert_nothing_leaked(&gw, 0).await;
}

#[test]
fn check_config_prints_every_error_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        r#"
[[upstreams]]
name = "u"
base_url = "not a url"
[[models]]
name = "m"
upstreams = ["missing"]
[[tenants]]
name = "t"
limits = { tpm = 0 }
"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // Errors go to stderr, nothing to stdout.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let stdout = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("upstreams[0].base_url: not an http(s) URL"),
        "{stdout}"
    );
    assert!(
        stdout.contains("models[0].upstreams[0]: unknown upstream \"missing\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("tenants[0].limits.tpm: must be > 0"),
        "{stdout}"
    );
}

/// The `Bearer` scheme is case-insensitive and may be followed by a tab
/// (RFC 9110 section 11.1, 11.6.2); a scheme without credentials is no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_matched_case_insensitively() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, tenant_limits())
        .start()
        .await;
    for (auth, status) in [
        (format!("BEARER {KEY}"), 200),
        (format!("bearer {KEY}"), 200),
        (format!("Bearer\t{KEY}"), 200),
        (format!("Bearer   {KEY}  "), 200),
        ("Bearer ".to_string(), 401),
        (format!("Basic {KEY}"), 401),
    ] {
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", gw.base_url()))
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .body(chat(json!({"max_tokens": 5})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{auth:?}");
        gw.settled().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_and_unreadable_keys_still_get_openai_shaped_errors() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, tenant_limits())
        .start()
        .await;
    let client = reqwest::Client::new();
    let r = client
        .get(format!("{}/chat/completions", gw.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_openai_error(&v);
    let r = client
        .post(format!("{}/chat/completions", gw.base_url()))
        .header(
            "authorization",
            reqwest::header::HeaderValue::from_bytes(b"Bearer sk-\xe9t\xe9").unwrap(),
        )
        .body(chat(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["code"], "invalid_api_key",
        "a present but unreadable key is invalid, not missing: {v}"
    );
}

/// Fault guarded against: a request carrying a key in `Authorization` and
/// another in `api-key` was charged to whichever header was read first.
/// Two different keys are a 401; the same key twice is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_carrying_two_different_keys_gets_401() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, tenant_limits())
        .start()
        .await;
    for (api_key, status) in [("sk-someone-else", 401), (KEY, 200)] {
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(KEY)
            .header("api-key", api_key)
            .header("content-type", "application/json")
            .body(chat(json!({"max_tokens": 5})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{api_key}");
        if status == 401 {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert_eq!(mock.state.request_count(), 0, "never forwarded");
        }
        gw.settled().await;
    }
}

/// Fault guarded against: two `Authorization` headers with different keys
/// were admitted as the first (while two keys across header names were
/// refused). Both are a 401 alike, on both dialects' key headers; the
/// same key twice is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_values_of_one_key_header_with_different_keys_get_401() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, tenant_limits())
        .start()
        .await;
    let cases = [
        (
            "authorization",
            format!("Bearer {KEY}"),
            "Bearer sk-someone-else".to_string(),
            401,
        ),
        (
            "authorization",
            "Bearer sk-someone-else".to_string(),
            format!("Bearer {KEY}"),
            401,
        ),
        (
            "api-key",
            KEY.to_string(),
            "sk-someone-else".to_string(),
            401,
        ),
        (
            "authorization",
            format!("Bearer {KEY}"),
            format!("bearer  {KEY}"),
            200,
        ),
    ];
    for (header, first, second, status) in cases {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.append(header, first.parse().unwrap());
        headers.append(header, second.parse().unwrap());
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", gw.base_url()))
            .headers(headers)
            .header("content-type", "application/json")
            .body(chat(json!({"max_tokens": 5})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{header}: {first} / {second}");
        if status == 401 {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert_eq!(mock.state.request_count(), 0, "never forwarded");
        }
        gw.settled().await;
    }
}

/// Fault guarded against: a body with `max_tokens` (or `n`, `stream`,
/// `model`) twice was forwarded byte for byte while the gateway reserved
/// by the last one (an upstream reading the first produced more than was
/// reserved). A member the gateway reads, twice, is a 400 naming it,
/// never forwarded nor reserved; other members may repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_member_sent_twice_is_a_400_naming_it() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 100, tenant_limits())
        .start()
        .await;
    let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
    let cases = [
        (
            format!(r#"{{"model":"gpt-4o-mini",{msgs},"max_tokens":5000,"max_tokens":5}}"#),
            Some("max_tokens"),
        ),
        (
            format!(r#"{{"model":"gpt-4o-mini",{msgs},"n":1,"max_tokens":5,"n":3}}"#),
            Some("n"),
        ),
        (
            format!(r#"{{"stream":true,"model":"gpt-4o-mini",{msgs},"stream":false}}"#),
            Some("stream"),
        ),
        (
            format!(r#"{{"model":"gpt-4o",{msgs},"model":"gpt-4o-mini"}}"#),
            Some("model"),
        ),
        (
            format!(r#"{{"model":"gpt-4o-mini",{msgs},"max_tokens":5,"x-note":1,"x-note":2}}"#),
            None,
        ),
    ];
    for (body, repeated) in cases {
        let before = mock.state.request_count();
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        gw.settled().await;
        match repeated {
            Some(name) => {
                assert_eq!(status, 400, "{body}: {v}");
                assert_openai_error(&v);
                assert_eq!(v["error"]["param"], name, "{v}");
                assert!(
                    v["error"]["message"].as_str().unwrap().contains(name),
                    "{v}"
                );
                assert_eq!(mock.state.request_count(), before, "never forwarded");
                assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0, "nothing reserved");
            }
            None => assert_eq!(status, 200, "{body}: {v}"),
        }
    }
}
