//! The mock's own accounting, per tenant and per deployment, for the
//! enforcement-accuracy benchmark (`examples/accuracy/`): what reached the
//! upstream, counted here and never taken from the gateway.
//!
//! * The **tenant** of a request is its `x-mock-tenant` header (a gateway
//!   forwards it when the deployment lists it in `forward_client_headers`),
//!   else `-`.
//! * The **deployment** is the Azure path's deployment, else the upstream
//!   key the gateway presented (`authorization: Bearer …` or `x-api-key`):
//!   give each deployment its own key (`api_key_env`) to tell them apart.
//!
//! Per request on a generation route (chat, completions, messages): one
//! request; its input tokens (the usage the mock reported, else its own
//! count of a chat prompt); its output cap as sent (the smallest of
//! `max_tokens`, `max_completion_tokens`, `max_output_tokens`, else the
//! mock's default length); its output tokens (the usage reported at the
//! end of a finished answer, else the tokens delivered before the stream
//! was dropped: what a provider bills for an aborted stream); whether a
//! stream was dropped before its end (`cut`). Arrival times are kept as
//! milliseconds since the mock started.
//!
//! `GET /_counters` answers the totals as JSON
//! (`{"tenants": {name: tally}, "deployments": {name: tally}}`);
//! `DELETE /_counters` clears them.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::HttpBody;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

/// The routes whose requests are counted.
fn is_generation(path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    ["/chat/completions", "/completions", "/messages"]
        .iter()
        .any(|s| path.ends_with(s))
}

/// Totals of one tenant or deployment.
#[derive(Clone, Debug, Default)]
struct Tally {
    requests: u64,
    input_tokens: u64,
    cap_tokens: u64,
    output_tokens: u64,
    streams: u64,
    streams_cut: u64,
    first_ms: Option<u64>,
    last_ms: u64,
}

impl Tally {
    fn json(&self) -> Value {
        json!({
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "cap_tokens": self.cap_tokens,
            "output_tokens": self.output_tokens,
            "streams": self.streams,
            "streams_cut": self.streams_cut,
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
        })
    }
}

/// Every tally of one mock.
#[derive(Debug)]
pub struct Counters {
    started: Instant,
    tallies: Mutex<(BTreeMap<String, Tally>, BTreeMap<String, Tally>)>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            started: Instant::now(),
            tallies: Mutex::default(),
        }
    }
}

/// One request's part of the tallies, added when its answer is over.
#[derive(Debug, Default)]
struct Entry {
    tenant: String,
    deployment: String,
    at_ms: u64,
    cap: u64,
    prompt_counted: u64,
    reported_input: Option<u64>,
    reported_output: Option<u64>,
    delivered: u64,
    stream: bool,
    finished: bool,
}

impl Counters {
    fn add(&self, e: &Entry) {
        let mut g = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        let (tenants, deployments) = &mut *g;
        let output = match (e.finished, e.reported_output) {
            (true, Some(n)) => n.max(e.delivered),
            _ => e.delivered,
        };
        for t in [
            tenants.entry(e.tenant.clone()).or_default(),
            deployments.entry(e.deployment.clone()).or_default(),
        ] {
            t.requests += 1;
            t.input_tokens += e.reported_input.unwrap_or(e.prompt_counted);
            t.cap_tokens += e.cap;
            t.output_tokens += output;
            t.streams += u64::from(e.stream);
            t.streams_cut += u64::from(e.stream && !e.finished);
            t.first_ms = Some(t.first_ms.map_or(e.at_ms, |f| f.min(e.at_ms)));
            t.last_ms = t.last_ms.max(e.at_ms);
        }
    }

    fn json(&self) -> Value {
        let g = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        let map = |m: &BTreeMap<String, Tally>| -> Value {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), v.json())).collect())
        };
        json!({"tenants": map(&g.0), "deployments": map(&g.1)})
    }

    fn clear(&self) {
        let mut g = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        g.0.clear();
        g.1.clear();
    }
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn deployment_of(path: &str, h: &HeaderMap) -> String {
    if let Some(rest) = path.strip_prefix("/openai/deployments/") {
        if let Some((dep, _)) = rest.split_once('/') {
            return dep.to_string();
        }
    }
    header_str(h, "authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| header_str(h, "x-api-key"))
        .unwrap_or("-")
        .to_string()
}

/// The middleware: answers `/_counters`, counts generation requests.
pub async fn count(State(c): State<Arc<Counters>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if path == "/_counters" {
        if req.method() == Method::DELETE {
            c.clear();
        }
        let mut r = Response::new(Body::from(c.json().to_string()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        return r;
    }
    if req.method() != Method::POST || !is_generation(&path) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024 * 1024).await else {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    };
    let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let model = parsed.get("model").and_then(Value::as_str).unwrap_or("");
    let cap = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .filter_map(|k| parsed.get(*k).and_then(Value::as_u64))
        .min();
    let mut entry = Entry {
        tenant: header_str(&parts.headers, "x-mock-tenant")
            .unwrap_or("-")
            .to_string(),
        deployment: deployment_of(&path, &parts.headers),
        at_ms: c.started.elapsed().as_millis() as u64,
        cap: cap.unwrap_or(0),
        prompt_counted: if path.ends_with("/chat/completions") {
            super::chat_prompt_tokens(super::bpe_for(model), &parsed)
        } else {
            0
        },
        ..Entry::default()
    };
    let default_cap = entry.cap == 0;
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (parts, body) = resp.into_parts();
    entry.stream = sse;
    // The body passes through as it is (a fault's cut body stays cut); it
    // is read on the way, and the entry added when it ends or is dropped.
    let counted = Counted {
        inner: body,
        buf: Vec::new(),
        entry,
        default_cap,
        sse,
        counters: c,
    };
    // Its size hint is the answer's: a whole answer keeps its
    // content-length (the gateway reads it as it reads a provider's).
    Response::from_parts(parts, Body::new(counted))
}

/// Reads an OpenAI (`prompt_tokens`, `completion_tokens`) or Anthropic
/// (`input_tokens`, `output_tokens`) usage object.
fn read_usage(e: &mut Entry, u: &Value) {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(i) = n("prompt_tokens").or_else(|| n("input_tokens")) {
        e.reported_input = Some(i);
    }
    if let Some(o) = n("completion_tokens").or_else(|| n("output_tokens")) {
        e.reported_output = Some(o);
    }
}

/// A streamed answer passing through: its frames are read as they leave,
/// and the entry is added when the stream ends or is dropped.
struct Counted<S> {
    inner: S,
    buf: Vec<u8>,
    entry: Entry,
    default_cap: bool,
    /// An event stream (read frame by frame), else a whole JSON answer.
    sse: bool,
    counters: Arc<Counters>,
}

impl<S> Counted<S> {
    fn frames(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&frame);
            for line in text.lines() {
                if let Some(data) = line.strip_prefix("data:") {
                    self.data(data.trim());
                }
            }
        }
    }

    fn data(&mut self, data: &str) {
        if data == "[DONE]" {
            self.entry.finished = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let e = &mut self.entry;
        match v.get("type").and_then(Value::as_str) {
            // Anthropic Messages: one token per text or thinking delta.
            Some("content_block_delta") => {
                let kind = v.pointer("/delta/type").and_then(Value::as_str);
                if matches!(kind, Some("text_delta" | "thinking_delta")) {
                    e.delivered += 1;
                }
            }
            Some("message_start") => {
                if let Some(u) = v.pointer("/message/usage") {
                    read_usage(e, u);
                    e.reported_output = None;
                }
            }
            Some("message_delta") => {
                if let Some(u) = v.get("usage") {
                    read_usage(e, u);
                }
            }
            Some("message_stop") => e.finished = true,
            _ => {
                // OpenAI chunks: one token per delta with content.
                if let Some(choices) = v.get("choices").and_then(Value::as_array) {
                    for c in choices {
                        let text = c
                            .pointer("/delta/content")
                            .or_else(|| c.get("text"))
                            .and_then(Value::as_str);
                        if text.is_some_and(|t| !t.is_empty()) {
                            e.delivered += 1;
                        }
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    read_usage(e, u);
                }
            }
        }
    }
}

impl<S> Drop for Counted<S> {
    fn drop(&mut self) {
        if !self.sse {
            // A whole answer counts its usage; a cut one (no valid JSON) none.
            if let Ok(v) = serde_json::from_slice::<Value>(&self.buf) {
                if let Some(u) = v.get("usage") {
                    read_usage(&mut self.entry, u);
                }
                self.entry.finished = true;
                self.entry.delivered = self.entry.reported_output.unwrap_or(0);
            }
        }
        if self.default_cap {
            self.entry.cap = self.entry.delivered;
        }
        self.counters.add(&self.entry);
    }
}

impl HttpBody for Counted<Body> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let next = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &next {
            if let Some(chunk) = frame.data_ref() {
                let chunk = chunk.clone();
                if self.sse {
                    self.frames(&chunk);
                } else {
                    self.buf.extend_from_slice(&chunk);
                }
            }
        }
        next
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    async fn post(base: &str, tenant: &str, key: &str, body: Value) -> String {
        reqwest::Client::new()
            .post(format!("{base}/chat/completions"))
            .header("x-mock-tenant", tenant)
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .expect("POST")
            .text()
            .await
            // A dropped stream ends in an error: its body does not matter here.
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn counts_requests_and_tokens_per_tenant_and_deployment() {
        let mock = super::super::start(super::super::MockConfig::default())
            .await
            .expect("mock");
        mock.state.set_output_tokens(7);
        let base = mock.base_url();
        let msg = json!([{"role": "user", "content": "hello there"}]);
        post(
            &base,
            "a",
            "dep1",
            json!({"model": "gpt-4o-mini", "messages": msg, "max_tokens": 5}),
        )
        .await;
        post(
            &base,
            "a",
            "dep2",
            json!({"model": "gpt-4o-mini", "messages": msg, "max_tokens": 50, "stream": true,
                   "stream_options": {"include_usage": true}}),
        )
        .await;
        post(
            &base,
            "b",
            "dep2",
            json!({"model": "gpt-4o-mini", "messages": msg}),
        )
        .await;
        // An aborted stream counts the tokens sent before the drop.
        mock.state
            .set_fault(Some(super::super::Fault::DropMidStream));
        post(
            &base,
            "c",
            "dep1",
            json!({"model": "gpt-4o-mini", "messages": msg, "max_tokens": 50, "stream": true}),
        )
        .await;
        let v: Value = reqwest::get(format!("{}/_counters", mock.root_url()))
            .await
            .expect("GET")
            .json()
            .await
            .expect("json");
        let input = super::super::chat_prompt_tokens(
            super::super::bpe_for("gpt-4o-mini"),
            &json!({"messages": msg}),
        );
        let a = &v["tenants"]["a"];
        assert_eq!(a["requests"], 2, "{v}");
        assert_eq!(a["input_tokens"], 2 * input, "{v}");
        assert_eq!(a["cap_tokens"], 5 + 50, "{v}");
        assert_eq!(a["output_tokens"], 5 + 7, "{v}");
        assert_eq!(a["streams"], 1);
        assert_eq!(a["streams_cut"], 0);
        let b = &v["tenants"]["b"];
        assert_eq!(b["cap_tokens"], 7, "no cap: what it answered, {v}");
        let c = &v["tenants"]["c"];
        assert_eq!(c["streams_cut"], 1, "{v}");
        assert_eq!(c["output_tokens"], 3, "three deltas before the drop: {v}");
        assert_eq!(v["deployments"]["dep1"]["requests"], 2, "{v}");
        assert_eq!(v["deployments"]["dep2"]["requests"], 2, "{v}");
        let cleared = reqwest::Client::new()
            .delete(format!("{}/_counters", mock.root_url()))
            .send()
            .await
            .expect("DELETE");
        assert_eq!(cleared.status(), 200);
        let v: Value = reqwest::get(format!("{}/_counters", mock.root_url()))
            .await
            .expect("GET")
            .json()
            .await
            .expect("json");
        assert_eq!(v["tenants"], json!({}));
    }
}
