//! What the Gemini routes add to the phases: which routes a Gemini model
//! answers on, `:countTokens` from the gateway's own estimate, the model
//! list, and the JSON-array framing of a stream asked for without
//! `alt=sse` (the relay meters SSE; the array is its events, re-framed).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body::Frame;
use serde_json::{json, Value};

use super::authenticate;
use super::context::RequestContext;
use super::decode::read_body;
use super::prepare::invalid;
use crate::budget::{BudgetName, Scope};
use crate::config::{ModelPolicy, Policy};
use crate::dialects::Dialect;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;

/// Refuses a Gemini model on a route its deployments do not serve, and a
/// model of another family on the Gemini route: Gemini models answer on
/// `generateContent` and on chat completions (each deployment's
/// OpenAI-compatible endpoint, the Gemini API's or Vertex's), never on
/// the Responses API (neither surface serves it).
pub fn check_route(policy: &Policy, model: &ModelPolicy, dialect: Dialect) -> Result<(), ApiError> {
    if dialect.is_gemini() && !model.gemini {
        return Err(ApiError::ModelNotFound {
            model: model.name.clone(),
            known: gemini_names(policy),
        });
    }
    if dialect.is_gemini() {
        return Ok(());
    }
    if dialect == Dialect::ChatCompletions {
        return Ok(());
    }
    Err(invalid(
        Some("model"),
        format!(
            "The model `{}` is served on POST /v1beta/models/{}:generateContent (the Gemini API) and on POST /v1/chat/completions.",
            model.name, model.name,
        ),
    ))
}

fn gemini_names(policy: &Policy) -> String {
    policy
        .models
        .iter()
        .filter(|m| m.gemini)
        .map(|m| format!("`{}`", m.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `generateContent` body sent upstream: the client's, with
/// `generationConfig.maxOutputTokens` set where the gateway must send a
/// cap (DESIGN section 1.6: the client gave none and no bound lets the
/// request go uncapped, or its cap was clamped). The model and the method
/// are in the URL, so nothing else changes; the body is re-encoded only
/// when a cap is set.
pub fn upstream_body(
    p: &super::prepare::Prepared,
    model: &ModelPolicy,
) -> Result<Vec<u8>, serde_json::Error> {
    let uncapped = p.uncapped_bound(model).is_some_and(|b| !b.sent);
    if uncapped || (p.estimate.client_max_output.is_some() && !p.clamped) {
        return Ok(p.raw.to_vec());
    }
    let cap = super::rewrite::output_cap(p, model).max(1);
    let mut body: serde_json::Map<String, Value> = serde_json::from_slice(&p.raw)?;
    let config = body
        .entry("generationConfig")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if !config.is_object() {
        // Prepare refused any other generationConfig.
        *config = Value::Object(serde_json::Map::new());
    }
    if let Some(c) = config.as_object_mut() {
        c.insert(crate::dialects::gemini::CAP_FIELD.into(), json!(cap));
    }
    serde_json::to_vec(&body)
}

/// `POST /v1beta/models/{model}:countTokens`: the input the gateway would
/// reserve for a `generateContent` request with these contents (an upper
/// bound at the model's `token_ratio`, media by Google's per-part rules),
/// never sent upstream. Charged to the caller's request budgets only.
pub async fn count_tokens(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    model: String,
) -> Response {
    let mut cx = RequestContext::new(st, Dialect::Gemini, &headers)
        .at("POST", "/v1beta/models/{model}:countTokens");
    let answer = count(&mut cx, &headers, body, &model).await;
    super::conclude(cx, answer)
}

async fn count(
    cx: &mut RequestContext,
    headers: &HeaderMap,
    body: Body,
    name: &str,
) -> Result<Response, ApiError> {
    let caller = authenticate::authenticate(cx, headers)?;
    let policy = cx.policy.clone();
    let bytes = read_body(body, policy.server.max_body_bytes, headers).await?;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(invalid(None, "The request body must be a JSON object."));
    };
    let key = policy.key(caller.tenant, caller.key);
    let model_id = policy
        .model_id(name)
        .filter(|_| key.allows(name))
        .ok_or_else(|| super::prepare::not_found(&policy, key, Dialect::Gemini, name))?;
    let model = policy.model_at(model_id);
    check_route(&policy, model, Dialect::Gemini)?;
    // countTokens takes the contents, or a whole generateContent request.
    let request = match body.get("generateContentRequest") {
        Some(Value::Object(r)) => r,
        _ => &body,
    };
    let input = crate::estimate::gemini::input_tokens(request, model.encoding, model.token_ratio)
        .map_err(|e| {
        let tenant = policy.tenant(caller.tenant).name.as_str();
        ApiError::from_estimate(e, |_| (Scope::Tenant(tenant.into()), BudgetName::Tpm))
    })?;
    super::count_tokens::charge_request_once(
        cx,
        &caller,
        model_id,
        json!({ "totalTokens": input }),
        "application/json; charset=UTF-8",
    )
    .await
}

/// `GET /v1beta/models`: the Gemini models the key may use, in Google's
/// shape (`models[]` of `{name: "models/{model}", …}`).
pub async fn list(st: Arc<AppState>, headers: HeaderMap) -> Response {
    let mut cx = RequestContext::new(st, Dialect::Gemini, &headers).at("GET", "/v1beta/models");
    let answer = (|| {
        let caller = authenticate::authenticate(&mut cx, &headers)?;
        let key = cx.policy.key(caller.tenant, caller.key);
        let models: Vec<Value> = cx
            .policy
            .models
            .iter()
            .filter(|m| m.gemini)
            .flat_map(|m| {
                if m.pattern {
                    m.listed.clone()
                } else {
                    vec![m.name.clone()]
                }
                .into_iter()
                .filter(|n| key.allows(n))
                .map(|n| {
                    let mut v = json!({
                        "name": format!("models/{n}"),
                        "displayName": n,
                        "supportedGenerationMethods": ["generateContent", "countTokens"],
                    });
                    if let Some(w) = m.context_window {
                        v["inputTokenLimit"] = json!(w);
                    }
                    if let Some(o) = m.max_output_tokens {
                        v["outputTokenLimit"] = json!(o);
                    }
                    v
                })
                .collect::<Vec<_>>()
            })
            .collect();
        let mut r = Response::new(Body::from(json!({ "models": models }).to_string()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=UTF-8"),
        );
        Ok(r)
    })();
    super::conclude(cx, answer)
}

/// A relayed SSE body re-framed as Google's JSON array: each event's data
/// becomes an element (`[{…}` then `\n,\r\n{…}`), and the array is closed
/// when the relay ends, whatever ended it — so a stream cut off at the
/// budget is still one well-formed array.
pub struct ArrayBody {
    inner: Body,
    /// Bytes of an event not yet complete.
    pending: BytesMut,
    elements: u64,
    closed: bool,
}

impl ArrayBody {
    /// `inner` (SSE events) as a JSON array.
    pub fn new(inner: Body) -> Self {
        Self {
            inner,
            pending: BytesMut::new(),
            elements: 0,
            closed: false,
        }
    }

    /// The elements of every complete event in `pending`.
    fn drain_events(&mut self, out: &mut BytesMut) {
        while let Some((end, sep)) = event_end(&self.pending) {
            let event = self.pending.split_to(end + sep);
            let text = String::from_utf8_lossy(&event[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue;
            }
            out.extend_from_slice(if self.elements == 0 { b"[" } else { b"\n,\r\n" });
            out.extend_from_slice(data.join("\n").as_bytes());
            self.elements += 1;
        }
    }

    fn closing(&self) -> &'static [u8] {
        if self.elements == 0 {
            b"[]"
        } else {
            b"\n]"
        }
    }
}

/// The end of the first complete SSE event and its separator's length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if buf[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

impl http_body::Body for ArrayBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.closed {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.pending.extend_from_slice(&data);
                    let mut out = BytesMut::new();
                    this.drain_events(&mut out);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    this.pending.extend_from_slice(b"\n\n");
                    let mut out = BytesMut::new();
                    this.drain_events(&mut out);
                    out.extend_from_slice(this.closing());
                    this.closed = true;
                    return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                }
            }
        }
    }
}

/// The response of a Gemini stream: SSE as relayed, or the same events
/// as one JSON array when the client did not ask for `alt=sse`.
pub fn framed(call: Option<crate::dialects::gemini::Call>, mut response: Response) -> Response {
    let Some(call) = call else {
        return response;
    };
    if call.sse {
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    Response::from_parts(parts, Body::new(ArrayBody::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn array_of(chunks: &[&'static str]) -> String {
        let stream = futures_util::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c.as_bytes())))
                .collect::<Vec<_>>(),
        );
        let body = ArrayBody::new(Body::from_stream(stream));
        let bytes = axum::body::to_bytes(Body::new(body), 1 << 20)
            .await
            .unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn events_split_anywhere_become_one_closed_array() {
        let got = array_of(&["data: {\"a\":1}\r", "\n\r\ndata: {\"b\"", ":2}\n\n"]).await;
        let v: Value = serde_json::from_str(&got).unwrap_or(Value::Null);
        assert_eq!(v, json!([{"a": 1}, {"b": 2}]), "{got}");
    }

    #[tokio::test]
    async fn an_empty_stream_is_an_empty_array_and_comments_are_dropped() {
        assert_eq!(array_of(&[]).await, "[]");
        let got = array_of(&[": keep-alive\n\n", "data: {\"a\":1}\n\n"]).await;
        assert_eq!(
            serde_json::from_str::<Value>(&got).ok(),
            Some(json!([{"a": 1}]))
        );
    }

    #[tokio::test]
    async fn an_event_without_its_blank_line_still_closes_the_array() {
        let got = array_of(&["data: {\"a\":1}\n\ndata: {\"b\":2}"]).await;
        assert_eq!(
            serde_json::from_str::<Value>(&got).ok(),
            Some(json!([{"a": 1}, {"b": 2}]))
        );
    }
}
