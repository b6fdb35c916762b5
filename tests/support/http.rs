//! Talking to a gateway (in-process or a child process): requests,
//! response headers, SSE bodies and the Prometheus exposition.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, Response};
use serde_json::{json, Value};

/// Something serving the gateway's HTTP API.
#[allow(async_fn_in_trait)]
pub trait Endpoint {
    /// `http://127.0.0.1:PORT` (or `https://…`).
    fn root_url(&self) -> String;

    /// `http://127.0.0.1:PORT/v1`
    fn base_url(&self) -> String {
        format!("{}/v1", self.root_url())
    }

    /// The gateway's Prometheus exposition text (`GET /metrics`).
    async fn metrics_text(&self) -> String {
        reqwest::get(format!("{}/metrics", self.root_url()))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body")
    }
}

impl Endpoint for str {
    fn root_url(&self) -> String {
        self.trim_end_matches('/').to_string()
    }
}

impl Endpoint for String {
    fn root_url(&self) -> String {
        self.as_str().root_url()
    }
}

/// A chat body for `gpt-4o-mini` saying "hi", output capped at `max_tokens`.
pub fn hi(max_tokens: u64) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
}

/// `POST /v1/chat/completions` with bearer `key` and JSON `body`, not sent yet.
pub fn chat_request(gw: &(impl Endpoint + ?Sized), key: &str, body: &Value) -> RequestBuilder {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(key)
        .json(body)
}

/// Sends `POST /v1/chat/completions`.
pub async fn post_chat(gw: &(impl Endpoint + ?Sized), key: &str, body: &Value) -> Response {
    chat_request(gw, key, body)
        .send()
        .await
        .expect("gateway reachable")
}

/// Sends `POST /v1/chat/completions` with [`hi`]`(5)` as `key`, bounded
/// by 5 s (no request may hang).
pub async fn send_hi(gw: &(impl Endpoint + ?Sized), key: &str) -> Response {
    chat_request(gw, key, &hi(5))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("no request hangs")
}

/// [`send_hi`]'s status.
pub async fn post_hi(gw: &(impl Endpoint + ?Sized), key: &str) -> u16 {
    send_hi(gw, key).await.status().as_u16()
}

/// Sends `POST /v1/chat/completions`; returns status, JSON body (`null`
/// when not JSON) and headers.
pub async fn post_chat_json(
    gw: &(impl Endpoint + ?Sized),
    key: &str,
    body: &Value,
) -> (u16, Value, HeaderMap) {
    let r = post_chat(gw, key, body).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.json().await.unwrap_or(Value::Null), headers)
}

/// Sends raw `body` bytes as JSON to `POST /v1{path}`, with bearer `key`
/// when given; returns status and JSON body (`null` when not JSON).
pub async fn post_raw(
    gw: &(impl Endpoint + ?Sized),
    path: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}{path}", gw.base_url()))
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    (status, r.json::<Value>().await.unwrap_or(Value::Null))
}

/// `GET {root}{path}` with bearer `token` when given (the admin API).
pub async fn admin_get(gw: &(impl Endpoint + ?Sized), path: &str, token: Option<&str>) -> Response {
    let mut req = reqwest::Client::new().get(format!("{}{path}", gw.root_url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("gateway reachable")
}

/// Response header `name` as text, if present.
pub fn header(r: &Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("header is text").to_string())
}

/// Response header `name`, which must be present.
pub fn must_header(r: &Response, name: &str) -> String {
    header(r, name).unwrap_or_else(|| panic!("no {name} header"))
}

/// Response header `name` as a number, which must be present.
pub fn header_u64(r: &Response, name: &str) -> u64 {
    must_header(r, name)
        .parse()
        .unwrap_or_else(|e| panic!("{name} is not a number: {e}"))
}

/// The `data:` payloads of an LF-framed SSE body (`[DONE]` kept as text).
pub fn sse_data(body: &(impl AsRef<[u8]> + ?Sized)) -> Vec<String> {
    String::from_utf8_lossy(body.as_ref())
        .split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The JSON chunks of an LF-framed SSE body (`[DONE]` left out).
pub fn sse_chunks(body: &(impl AsRef<[u8]> + ?Sized)) -> Vec<Value> {
    sse_data(body)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk is not JSON ({e}): {d}")))
        .collect()
}

/// How many of `chunks` carry content (a non-empty `delta.content` of
/// their first choice).
pub fn content_chunks(chunks: &[Value]) -> usize {
    chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count()
}

/// The parsed Prometheus exposition of a gateway.
pub async fn scrape(gw: &(impl Endpoint + ?Sized)) -> prometheus_parse::Scrape {
    let text = gw.metrics_text().await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text exposition")
}

/// Sum of the samples of `metric` whose labels include every `labels` pair.
pub fn sample_sum(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// One call to the admin API: `method path` with bearer `token` and JSON
/// `body`; the status and the JSON answer (`null` when there is none).
pub async fn admin_call(
    gw: &(impl Endpoint + ?Sized),
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", gw.root_url()))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    let text = r.text().await.expect("admin body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}
