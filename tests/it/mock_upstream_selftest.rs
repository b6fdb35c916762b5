//! Self-test of the simulated upstream in `examples/mock_upstream.rs`.

use crate::support::mock_upstream;
use crate::support::{content_chunks, rule_count, sse_chunks, sse_data};

use std::time::{Duration, Instant};

use mock_upstream::{AzureExpect, Fault, MockConfig, MockUpstream};
use serde_json::{json, Value};

async fn mock() -> MockUpstream {
    mock_upstream::start(MockConfig::default())
        .await
        .expect("start mock")
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    client().post(url).json(body).send().await.expect("send")
}

async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let r = post(url, body).await;
    let status = r.status().as_u16();
    let v = r.json::<Value>().await.expect("json body");
    (status, v)
}

fn o200k(s: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64
}

fn cl100k(s: &str) -> u64 {
    tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(s)
        .len() as u64
}

fn stream_content(chunks: &[Value], index: u64) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter(|ch| ch["index"] == index)
        .filter_map(|ch| ch["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// Reads a body to its end; returns what arrived and whether it ended in an error.
async fn read_all(resp: reqwest::Response) -> (Vec<u8>, bool) {
    use futures_util::StreamExt as _;
    let mut s = resp.bytes_stream();
    let mut out = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(b) => out.extend_from_slice(&b),
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

#[test]
fn words_are_single_tokens_in_both_encodings() {
    for w in mock_upstream::WORDS {
        assert_eq!(o200k(w), 1, "{w:?} in o200k_base");
        assert_eq!(cl100k(w), 1, "{w:?} in cl100k_base");
    }
    for k in 0..=300u64 {
        let text = mock_upstream::generated_text(k);
        assert_eq!(o200k(&text), k, "o200k, k={k}");
        assert_eq!(cl100k(&text), k, "cl100k, k={k}");
    }
}

#[test]
fn fault_names_round_trip() {
    for f in Fault::ALL {
        assert_eq!(Fault::parse(f.name()), Some(f));
    }
    assert_eq!(Fault::parse("rate_limited"), Some(Fault::RateLimited));
    assert_eq!(Fault::parse("nope"), None);
}

#[test]
fn base64_matches_rfc4648_vectors() {
    let e = mock_upstream::base64_encode;
    assert_eq!(e(b""), "");
    assert_eq!(e(b"f"), "Zg==");
    assert_eq!(e(b"fo"), "Zm8=");
    assert_eq!(e(b"foo"), "Zm9v");
    assert_eq!(e(b"foobar"), "Zm9vYmFy");
}

/// The example from OpenAI's cookbook "How to count tokens with tiktoken"
/// (129 prompt tokens for gpt-3.5-turbo-0613 / gpt-4-0613).
fn sample_messages() -> Value {
    json!([
        {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
        {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
        {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
        {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
        {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
        {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."},
    ])
}

/// OpenAI's published rule, written independently of the mock.
#[tokio::test]
async fn chat_non_streaming_shape_usage_and_headers() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let msgs = sample_messages();
    for (model, count) in [
        ("gpt-4o-mini", o200k as fn(&str) -> u64),
        ("gpt-4.1-mini", o200k),
        ("gpt-4-0613", cl100k),
        ("gpt-3.5-turbo", cl100k),
    ] {
        let r = post(&url, &json!({"model": model, "messages": msgs})).await;
        assert_eq!(r.status(), 200);
        let h = r.headers().clone();
        assert!(h["x-request-id"].to_str().unwrap().starts_with("req_mock_"));
        assert_eq!(h["openai-organization"], "mock-org");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "999000");
        assert_eq!(h["x-ratelimit-limit-tokens"], "1000000");
        assert_eq!(h["x-ratelimit-remaining-requests"], "9999");
        assert_eq!(h["x-ratelimit-limit-requests"], "10000");
        assert!(h["set-cookie"].to_str().unwrap().starts_with("mock=1"));
        assert!(h["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let v: Value = r.json().await.unwrap();
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], model);
        assert_eq!(v["system_fingerprint"], "fp_mock");
        let c = &v["choices"][0];
        assert_eq!(c["index"], 0);
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["message"]["refusal"], Value::Null);
        assert_eq!(c["finish_reason"], "stop");
        let text = c["message"]["content"].as_str().unwrap();
        assert_eq!(count(text), 64);
        let expected = rule_count(&msgs, count);
        assert_eq!(v["usage"]["prompt_tokens"], expected, "{model}");
        assert_eq!(v["usage"]["completion_tokens"], 64);
        assert_eq!(v["usage"]["total_tokens"], expected + 64);
    }
    // Cross-check the cookbook's published figure.
    let (_, v) = post_json(&url, &json!({"model": "gpt-4-0613", "messages": msgs})).await;
    assert_eq!(v["usage"]["prompt_tokens"], 129);
}

#[tokio::test]
async fn chat_counts_tools_and_content_parts() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let (_, v) = post_json(
        &url,
        &json!({
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}, {"type": "text", "text": "again"}]}],
            "tools": tools,
        }),
    )
    .await;
    let expected =
        3 + 3 + o200k("user") + o200k("hello there") + o200k("again") + o200k(&tools.to_string());
    assert_eq!(v["usage"]["prompt_tokens"], expected);
}

#[tokio::test]
async fn output_length_honours_caps_and_n() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let text_of = |v: &Value, i: usize| {
        v["choices"][i]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };

    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 10}),
    )
    .await;
    assert_eq!(o200k(&text_of(&v, 0)), 10);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 10);

    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 10, "max_completion_tokens": 5}),
    )
    .await;
    assert_eq!(o200k(&text_of(&v, 0)), 5);

    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_completion_tokens": 64}),
    )
    .await;
    assert_eq!(
        v["choices"][0]["finish_reason"], "stop",
        "cap == output_tokens"
    );
    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_completion_tokens": 500}),
    )
    .await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 64);

    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 7, "n": 3}),
    )
    .await;
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    for i in 0..3 {
        assert_eq!(v["choices"][i]["index"], i);
        assert_eq!(o200k(&text_of(&v, i)), 7);
    }
    assert_eq!(v["usage"]["completion_tokens"], 21);

    m.state.set_output_tokens(3);
    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 10}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let (status, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 0}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "max_tokens");
}

#[tokio::test]
async fn streaming_matches_non_streaming() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let msgs = json!([{"role": "user", "content": "stream please"}]);
    let (_, full) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 12, "n": 2}),
    )
    .await;

    // Without include_usage.
    let r = post(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 12, "n": 2, "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let body = r.text().await.unwrap();
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let cs = sse_chunks(&body);
    // 2 role chunks + 2*12 content chunks + 2 finish chunks.
    assert_eq!(cs.len(), 2 + 24 + 2);
    for c in &cs {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c.get("usage").is_none(), "no usage key unless asked");
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
    assert_eq!(
        cs[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    // Round-robin interleaving.
    assert_eq!(cs[2]["choices"][0]["index"], 0);
    assert_eq!(cs[3]["choices"][0]["index"], 1);
    for i in 0..2u64 {
        assert_eq!(
            stream_content(&cs, i),
            full["choices"][i as usize]["message"]["content"]
                .as_str()
                .unwrap()
        );
    }
    let finishes: Vec<&Value> = cs[26..]
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .collect();
    assert_eq!(finishes, vec!["length", "length"]);

    // With include_usage.
    let body = post(
        &url,
        &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 12, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await
    .text()
    .await
    .unwrap();
    let cs = sse_chunks(&body);
    let last = cs.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 12);
    assert_eq!(
        last["usage"]["prompt_tokens"],
        full["usage"]["prompt_tokens"]
    );
    for c in &cs[..cs.len() - 1] {
        assert_eq!(c["usage"], Value::Null);
        assert!(c.as_object().unwrap().contains_key("usage"));
    }
    assert_eq!(sse_data(&body).last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn streaming_is_incremental_with_token_delay() {
    let m = mock().await;
    m.state.set_token_delay(Duration::from_millis(100));
    let url = format!("{}/chat/completions", m.base_url());
    let started = Instant::now();
    let r = post(
        &url,
        &json!({"model": "gpt-4o", "messages": [], "max_tokens": 5, "stream": true}),
    )
    .await;
    use futures_util::StreamExt as _;
    let mut s = r.bytes_stream();
    let first = s.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "first frame not buffered"
    );
    while s.next().await.is_some() {}
    assert!(started.elapsed() >= Duration::from_millis(500));
}

#[tokio::test]
async fn hold_and_release() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    m.state.hold();
    let task = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &json!({"model": "gpt-4o", "messages": []})).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while m.state.held_count() < 1 {
        assert!(Instant::now() < deadline, "request never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Recorded before the hold.
    assert_eq!(m.state.request_count(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished());
    m.state.release();
    let (status, _) = task.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(m.state.held_count(), 0);
    // Released state lets later requests through at once.
    let (status, _) = post_json(&url, &json!({"model": "gpt-4o", "messages": []})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn requests_are_recorded() {
    let m = mock().await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9});
    client()
        .post(format!("{}/chat/completions?a=1", m.base_url()))
        .header("authorization", "Bearer sk-upstream")
        .json(&body)
        .send()
        .await
        .unwrap();
    client()
        .post(format!("{}/chat/completions", m.base_url()))
        .body("not json")
        .send()
        .await
        .unwrap();
    let reqs = m.state.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].query.as_deref(), Some("a=1"));
    assert_eq!(reqs[0].header("Authorization"), Some("Bearer sk-upstream"));
    assert_eq!(reqs[0].body, body);
    assert_eq!(reqs[1].body, Value::Null);
}

#[tokio::test]
async fn errors_invalid_json_and_unknown_paths() {
    let m = mock().await;
    let r = client()
        .post(format!("{}/chat/completions", m.base_url()))
        .header("content-type", "application/json")
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let r = client()
        .post(format!("{}/files", m.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/files"));

    let (status, _) = post_json(
        &format!("{}/chat/completions", m.base_url()),
        &json!({"model": "gpt-4o"}),
    )
    .await;
    assert_eq!(status, 400, "messages missing");
    let (status, _) = post_json(
        &format!("{}/chat/completions", m.base_url()),
        &json!([1, 2]),
    )
    .await;
    assert_eq!(status, 400, "not an object");
}

#[tokio::test]
async fn models_list() {
    let m = mock().await;
    let v: Value = client()
        .get(format!("{}/models", m.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "list");
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["object"] == "model" && d["id"].is_string()));
}

#[tokio::test]
async fn legacy_completions() {
    let m = mock().await;
    let url = format!("{}/completions", m.base_url());
    let (_, v) = post_json(&url, &json!({"model": "gpt-3.5-turbo-instruct", "prompt": "Say this is a test", "max_tokens": 6})).await;
    assert_eq!(v["object"], "text_completion");
    assert_eq!(cl100k(v["choices"][0]["text"].as_str().unwrap()), 6);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], cl100k("Say this is a test"));
    assert_eq!(v["usage"]["completion_tokens"], 6);

    let (_, v) = post_json(
        &url,
        &json!({"model": "davinci-002", "prompt": [1, 2, 3, 4], "max_tokens": 2}),
    )
    .await;
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let (_, v) = post_json(
        &url,
        &json!({"model": "davinci-002", "prompt": ["a b", "c"], "max_tokens": 2}),
    )
    .await;
    assert_eq!(v["usage"]["prompt_tokens"], o200k("a b") + o200k("c"));
    assert_eq!(
        v["choices"].as_array().unwrap().len(),
        2,
        "one choice per prompt"
    );

    let body = post(
        &url,
        &json!({"model": "davinci-002", "prompt": "x", "max_tokens": 4, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await
    .text()
    .await
    .unwrap();
    let cs = sse_chunks(&body);
    let text: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, mock_upstream::generated_text(4));
    assert_eq!(cs.last().unwrap()["usage"]["completion_tokens"], 4);
    assert_eq!(sse_data(&body).last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn embeddings_float_and_base64() {
    let m = mock().await;
    let url = format!("{}/embeddings", m.base_url());
    let (_, v) = post_json(
        &url,
        &json!({"model": "text-embedding-3-small", "input": ["hello world", "bye"]}),
    )
    .await;
    assert_eq!(v["object"], "list");
    assert_eq!(
        v["usage"]["prompt_tokens"],
        o200k("hello world") + o200k("bye")
    );
    assert_eq!(v["usage"]["total_tokens"], v["usage"]["prompt_tokens"]);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let floats: Vec<f32> = data[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(floats.len(), 8);

    let (_, b) = post_json(
        &url,
        &json!({"model": "text-embedding-3-small", "input": ["hello world", "bye"], "encoding_format": "base64"}),
    )
    .await;
    let encoded = b["data"][0]["embedding"].as_str().unwrap();
    let expected: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
    assert_eq!(encoded, mock_upstream::base64_encode(&expected));

    let (_, v) = post_json(&url, &json!({"model": "m", "input": [[1, 2, 3], [4, 5]]})).await;
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    let (_, v) = post_json(&url, &json!({"model": "m", "input": [1, 2, 3]})).await;
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn usage_override() {
    let m = mock().await;
    m.state.set_usage_override(Some(1000), Some(7));
    let url = format!("{}/chat/completions", m.base_url());
    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": [], "max_tokens": 10}),
    )
    .await;
    assert_eq!(v["usage"]["prompt_tokens"], 1000);
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(v["usage"]["total_tokens"], 1007);
    assert_eq!(
        o200k(v["choices"][0]["message"]["content"].as_str().unwrap()),
        10
    );
    m.state.set_usage_override(None, None);
    let (_, v) = post_json(
        &url,
        &json!({"model": "gpt-4o", "messages": [], "max_tokens": 10}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 10);
}

#[tokio::test]
async fn simple_faults_by_header_model_and_state() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let cases = [
        (Fault::RateLimited, 429u16),
        (Fault::ServerError, 500),
        (Fault::BadRequest, 400),
        (Fault::Unauthorized, 401),
    ];
    for (fault, status) in cases {
        let by_header = client()
            .post(&url)
            .header("x-mock-fault", fault.name())
            .json(&json!({"model": "gpt-4o", "messages": []}))
            .send()
            .await
            .unwrap();
        let by_model = post(
            &url,
            &json!({"model": format!("gpt-4o fault-{}", fault.name()), "messages": []}),
        )
        .await;
        let by_model2 = post(
            &url,
            &json!({"model": format!("mock-fault-{}", fault.name()), "messages": []}),
        )
        .await;
        m.state.set_fault(Some(fault));
        let by_state = post(&url, &json!({"model": "gpt-4o", "messages": []})).await;
        m.state.set_fault(None);
        for r in [by_header, by_model, by_model2, by_state] {
            assert_eq!(r.status().as_u16(), status, "{fault:?}");
            if fault == Fault::RateLimited {
                assert_eq!(r.headers()["retry-after"], "2");
            }
            let v: Value = r.json().await.unwrap();
            assert!(v["error"]["message"].is_string(), "{fault:?}");
            match fault {
                Fault::RateLimited => assert_eq!(v["error"]["code"], "rate_limit_exceeded"),
                Fault::BadRequest => assert_eq!(v["error"]["param"], "messages"),
                Fault::Unauthorized => assert_eq!(v["error"]["code"], "invalid_api_key"),
                _ => {}
            }
        }
    }
    // Header beats model beats state.
    m.state.set_fault(Some(Fault::ServerError));
    let r = client()
        .post(&url)
        .header("x-mock-fault", "unauthorized")
        .json(&json!({"model": "x fault-bad_request", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(
        &url,
        &json!({"model": "x fault-bad_request", "messages": []}),
    )
    .await;
    assert_eq!(r.status(), 400);
    m.state.set_fault(None);

    // Non-JSON.
    let r = post(&url, &json!({"model": "x fault-non_json", "messages": []})).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.json::<Value>().await.is_err());
}

#[tokio::test]
async fn drop_mid_stream() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let r = post(
        &url,
        &json!({"model": "x fault-drop_mid_stream", "messages": [], "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let (body, errored) = read_all(r).await;
    assert!(errored, "connection must be aborted");
    let body = String::from_utf8(body).unwrap();
    assert!(!body.contains("[DONE]"));
    let cs = sse_chunks(&body);
    assert_eq!(content_chunks(&cs), 3);

    let r = post(
        &url,
        &json!({"model": "x fault-drop_mid_stream", "messages": []}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let (_, errored) = read_all(r).await;
    assert!(errored, "non-streaming body must be cut");
}

#[tokio::test]
async fn slow_first_byte() {
    let m = mock_upstream::start(MockConfig {
        first_byte_delay: Duration::from_millis(300),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/chat/completions", m.base_url());
    let started = Instant::now();
    let (status, _) = post_json(
        &url,
        &json!({"model": "x fault-slow_first_byte", "messages": []}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn missing_usage() {
    let m = mock().await;
    m.state.set_fault(Some(Fault::MissingUsage));
    let url = format!("{}/chat/completions", m.base_url());
    let (_, v) = post_json(&url, &json!({"model": "gpt-4o", "messages": []})).await;
    assert!(v.get("usage").is_none());
    let body = post(
        &url,
        &json!({"model": "gpt-4o", "messages": [], "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await
    .text()
    .await
    .unwrap();
    let cs = sse_chunks(&body);
    assert!(cs.iter().all(|c| c["usage"].is_null()));
    assert!(cs
        .iter()
        .all(|c| !c["choices"].as_array().unwrap().is_empty()));
    assert!(body.ends_with("data: [DONE]\n\n"));
    let (_, v) = post_json(
        &format!("{}/embeddings", m.base_url()),
        &json!({"model": "e", "input": "x"}),
    )
    .await;
    assert!(v.get("usage").is_none());
}

#[tokio::test]
async fn no_done() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let r = post(
        &url,
        &json!({"model": "x fault-no_done", "messages": [], "max_tokens": 4, "stream": true}),
    )
    .await;
    let (body, errored) = read_all(r).await;
    assert!(!errored, "a clean close");
    let body = String::from_utf8(body).unwrap();
    assert!(!body.contains("[DONE]"));
    let cs = sse_chunks(&body);
    assert_eq!(cs.last().unwrap()["choices"][0]["finish_reason"], "length");
    assert_eq!(stream_content(&cs, 0), mock_upstream::generated_text(4));
}

#[tokio::test]
async fn content_filter_chunks() {
    let m = mock().await;
    let url = format!("{}/chat/completions", m.base_url());
    let body = post(
        &url,
        &json!({"model": "x fault-content_filter_chunks", "messages": [], "max_tokens": 4, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(body.contains("\n\n: keep-alive\n\n"));
    let cs = sse_chunks(&body);
    assert_eq!(cs[0]["choices"], json!([]));
    assert!(cs[0]["prompt_filter_results"].is_array());
    assert_eq!(stream_content(&cs, 0), mock_upstream::generated_text(4));
    assert_eq!(cs.last().unwrap()["usage"]["completion_tokens"], 4);
    assert!(body.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn azure_routes() {
    let m = mock_upstream::start(MockConfig {
        expect_azure: Some(AzureExpect {
            api_version: "2024-10-21".into(),
            api_key: "azure-key".into(),
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let base = format!("http://{}/openai/deployments/my-gpt4o", m.addr);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});

    let r = client()
        .post(format!("{base}/chat/completions?api-version=2024-10-21"))
        .header("api-key", "azure-key")
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "my-gpt4o");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(
        v["usage"]["prompt_tokens"],
        rule_count(&chat["messages"], o200k)
    );

    let r = client()
        .post(format!("{base}/chat/completions?api-version=2023-01-01"))
        .header("api-key", "azure-key")
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client()
        .post(format!("{base}/chat/completions"))
        .header("api-key", "azure-key")
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client()
        .post(format!("{base}/chat/completions?api-version=2024-10-21"))
        .header("api-key", "wrong")
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string());

    let r = client()
        .post(format!("{base}/embeddings?api-version=2024-10-21"))
        .header("api-key", "azure-key")
        .json(&json!({"input": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "my-gpt4o");

    let r = client()
        .post(format!("{base}/completions?api-version=2024-10-21"))
        .header("api-key", "azure-key")
        .json(&json!({"prompt": "hello", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);

    let recorded = m.state.requests();
    assert_eq!(
        recorded[0].path,
        "/openai/deployments/my-gpt4o/chat/completions"
    );
    assert_eq!(recorded[0].query.as_deref(), Some("api-version=2024-10-21"));
    assert_eq!(recorded[0].header("api-key"), Some("azure-key"));
}

#[tokio::test]
async fn shutdown_stops_accepting() {
    let m = mock().await;
    let url = format!("{}/models", m.base_url());
    assert!(client().get(&url).send().await.is_ok());
    m.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
        .get(&url)
        .send()
        .await;
    assert!(r.is_err());
}
