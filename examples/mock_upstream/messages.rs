//! The simulated Anthropic Messages API (`POST /v1/messages`), streamed and
//! not. Generated text is `K = min(output_tokens, max_tokens)` tokens of
//! [`super::WORDS`], one token per `text_delta`.
//!
//! Scenario controls, in the `x-mock-messages` request header as
//! comma-separated `name=value` pairs (a gateway forwards it when its
//! upstream lists it in `forward_client_headers`):
//!
//! * `input=N`: report `input_tokens: N` (else the mock's own count);
//! * `cache_read=N`, `cache_creation=N`: cache usage (the creation split
//!   5m/1h in `cache_creation`, never added);
//! * `thinking=N`: a thinking block of N tokens (and a signature) first;
//!   with `"display": "omitted"` in the body's `thinking` (as newer models
//!   answer it) the block carries the signature alone, no thinking text,
//!   while `output_tokens` still counts the N;
//! * `tool_use=1`: a `tool_use` block after the text, `stop_reason: tool_use`;
//! * `cumulative=N`: N `message_delta` events with growing cumulative
//!   `output_tokens` before the final one;
//! * `late_cache=1`: cache fields appear first in the final `message_delta`;
//! * `drop=1`: the stream stops after three text deltas, connection aborted;
//! * `no_stop=1`: the stream ends after `message_delta` without `message_stop`.
//! * `web_search=N`, `web_fetch=N`: when the body offers that server tool
//!   (`web_search_20250305`…), report N calls (at most the tool's
//!   `max_uses`) in `usage.server_tool_use` (`web_search_requests`,
//!   `web_fetch_requests`), in the final `message_delta` of a stream.
//!
//! [`super::Fault::Overloaded`] answers 529 `overloaded_error`; a
//! `RateLimited` fault answers 429 in Anthropic's shape. Every answer
//! carries the mock's own `anthropic-ratelimit-*` headers (which a gateway
//! must not relay) and a `request-id`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt as _;
use serde_json::{json, Value};

use super::{
    bpe_for, count_tokens, generated_text, lock, word, Fault, MockState, ABORT_FLUSH_DELAY,
};

/// The scenario of one request (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Scenario {
    pub input: Option<u64>,
    pub cache_read: u64,
    pub cache_creation: u64,
    pub thinking: u64,
    pub tool_use: bool,
    pub cumulative: u64,
    pub late_cache: bool,
    pub drop: bool,
    pub no_stop: bool,
    pub web_search: u64,
    pub web_fetch: u64,
}

impl Scenario {
    /// Reads the `x-mock-messages` header.
    pub fn from_headers(h: &HeaderMap) -> Scenario {
        let mut s = Scenario::default();
        let Some(v) = h.get("x-mock-messages").and_then(|v| v.to_str().ok()) else {
            return s;
        };
        for pair in v.split(',') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, "1"));
            let n = v.trim().parse::<u64>().unwrap_or(0);
            match k.trim() {
                "input" => s.input = Some(n),
                "cache_read" => s.cache_read = n,
                "cache_creation" => s.cache_creation = n,
                "thinking" => s.thinking = n,
                "tool_use" => s.tool_use = n > 0,
                "cumulative" => s.cumulative = n,
                "late_cache" => s.late_cache = n > 0,
                "drop" => s.drop = n > 0,
                "no_stop" => s.no_stop = n > 0,
                "web_search" => s.web_search = n,
                "web_fetch" => s.web_fetch = n,
                _ => {}
            }
        }
        s
    }
}

fn anthropic_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    let id = format!("req_mock_{}", uuid::Uuid::new_v4().simple());
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert("request-id", v);
    }
    for (k, v) in [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "1"),
        ("anthropic-ratelimit-requests-reset", "2020-01-01T00:00:00Z"),
        ("anthropic-ratelimit-tokens-limit", "999"),
        ("anthropic-ratelimit-tokens-remaining", "1"),
        ("anthropic-ratelimit-tokens-reset", "2020-01-01T00:00:00Z"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    r
}

/// An Anthropic error answer.
pub fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    anthropic_headers(r)
}

/// The answer to a fault on this route, if the fault answers at once.
pub fn fault_response(fault: Fault) -> Option<Response> {
    match fault {
        Fault::Overloaded => Some(error(
            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error",
            "Overloaded (mock)",
        )),
        Fault::RateLimited => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit (mock)",
            );
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("2"));
            Some(r)
        }
        _ => None,
    }
}

/// The mock's own input count: 4 per message and the tokens of every
/// string in `system` and `messages`.
fn input_tokens(model: &str, body: &Value) -> u64 {
    fn strings(v: &Value, bpe: &tiktoken_rs::CoreBPE) -> u64 {
        match v {
            Value::String(s) => count_tokens(bpe, s),
            Value::Array(a) => a.iter().map(|x| strings(x, bpe)).sum(),
            Value::Object(o) => o.values().map(|x| strings(x, bpe)).sum(),
            _ => 0,
        }
    }
    let bpe = bpe_for(model);
    let messages = body.get("messages").and_then(Value::as_array);
    let n = messages.map_or(0, |m| m.len() as u64);
    4 * n
        + body.get("system").map_or(0, |s| strings(s, bpe))
        + messages.map_or(0, |m| m.iter().map(|x| strings(x, bpe)).sum())
}

const TOOL_INPUT: &str = "{\"city\": \"Paris\"}";

/// `POST /v1/messages`.
pub async fn messages(st: &MockState, headers: &HeaderMap, model: String, body: Value) -> Response {
    let sc = Scenario::from_headers(headers);
    if !body.get("messages").is_some_and(Value::is_array) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "messages: Field required",
        );
    }
    let Some(max_tokens) = body.get("max_tokens").and_then(Value::as_u64) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "max_tokens: Field required",
        );
    };
    let bpe = bpe_for(&model);
    let thinking = sc.thinking.min(max_tokens);
    let k = st.output_tokens().min(max_tokens - thinking);
    let tool_tokens = if sc.tool_use {
        count_tokens(bpe, TOOL_INPUT)
    } else {
        0
    };
    let stop_reason = if sc.tool_use {
        "tool_use"
    } else if thinking + k == max_tokens && st.output_tokens() > k {
        "max_tokens"
    } else {
        "end_turn"
    };
    let (input, output) = st.usage(
        sc.input.unwrap_or_else(|| input_tokens(&model, &body)),
        thinking + k + tool_tokens,
    );
    let mut usage = json!({
        "input_tokens": input,
        "cache_creation_input_tokens": sc.cache_creation,
        "cache_read_input_tokens": sc.cache_read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": sc.cache_creation - sc.cache_creation / 4,
            "ephemeral_1h_input_tokens": sc.cache_creation / 4
        },
        "output_tokens": output,
        "service_tier": "standard"
    });
    if let Some(calls) = server_tool_calls(&sc, &body) {
        usage["server_tool_use"] = calls;
    }
    let id = format!("msg_mock_{}", uuid::Uuid::new_v4().simple());
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let omitted = body["thinking"]["display"].as_str() == Some("omitted");
    let delay = *lock(&st.token_delay);
    if stream {
        return stream_response(Plan {
            id,
            model,
            sc,
            thinking,
            omitted,
            k,
            stop_reason,
            usage,
            delay,
        });
    }
    tokio::time::sleep(delay * (k as u32)).await;
    let mut content = Vec::new();
    if thinking > 0 {
        let text = if omitted {
            String::new()
        } else {
            generated_text(thinking)
        };
        content.push(json!({"type": "thinking", "thinking": text, "signature": "mock-signature"}));
    }
    content.push(json!({"type": "text", "text": generated_text(k)}));
    if sc.tool_use {
        content.push(
            json!({"type": "tool_use", "id": "toolu_mock_1", "name": "get_weather",
            "input": serde_json::from_str::<Value>(TOOL_INPUT).unwrap_or(Value::Null)}),
        );
    }
    let answer = json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": null, "usage": usage
    });
    let mut r = Response::new(Body::from(answer.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    anthropic_headers(r)
}

/// `usage.server_tool_use` of an answer whose body offers a web search or
/// fetch server tool: the calls the scenario asks for, at most each
/// tool's `max_uses`.
fn server_tool_calls(sc: &Scenario, body: &Value) -> Option<Value> {
    let tools = body.get("tools").and_then(Value::as_array)?;
    let offered = |prefix: &str| {
        tools
            .iter()
            .find(|t| t["type"].as_str().is_some_and(|ty| ty.starts_with(prefix)))
    };
    let calls = |prefix: &str, n: u64| {
        offered(prefix).map_or(0, |t| t["max_uses"].as_u64().map_or(n, |m| n.min(m)))
    };
    if offered("web_search_").is_none() && offered("web_fetch_").is_none() {
        return None;
    }
    Some(json!({
        "web_search_requests": calls("web_search_", sc.web_search),
        "web_fetch_requests": calls("web_fetch_", sc.web_fetch)
    }))
}

struct Plan {
    id: String,
    model: String,
    sc: Scenario,
    thinking: u64,
    /// The thinking text left out of the stream (`display: "omitted"`).
    omitted: bool,
    k: u64,
    stop_reason: &'static str,
    usage: Value,
    delay: Duration,
}

fn event(name: &str, data: Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

type Tx = tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>;

async fn send(tx: &Tx, b: Bytes, delay: Duration) -> Result<(), ()> {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    tx.send(Ok(b)).await.map_err(|_| ())
}

async fn produce(p: Plan, tx: &Tx) -> Result<(), ()> {
    let z = Duration::ZERO;
    let mut start_usage = json!({"input_tokens": p.usage["input_tokens"], "output_tokens": 1});
    if !p.sc.late_cache {
        for k in [
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "cache_creation",
        ] {
            start_usage[k] = p.usage[k].clone();
        }
    }
    send(
        tx,
        event(
            "message_start",
            json!({"type": "message_start", "message": {
        "id": p.id, "type": "message", "role": "assistant", "model": p.model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
        ),
        z,
    )
    .await?;
    send(tx, event("ping", json!({"type": "ping"})), z).await?;
    let mut index = 0;
    if p.thinking > 0 {
        send(
            tx,
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            ),
            z,
        )
        .await?;
        let shown = if p.omitted { 0 } else { p.thinking };
        for i in 0..shown {
            send(
                tx,
                event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "thinking_delta", "thinking": word(i)}}),
                ),
                p.delay,
            )
            .await?;
        }
        send(
            tx,
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "signature_delta", "signature": "mock-signature"}}),
            ),
            z,
        )
        .await?;
        send(
            tx,
            event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ),
            z,
        )
        .await?;
        index += 1;
    }
    send(
        tx,
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
        "content_block": {"type": "text", "text": ""}}),
        ),
        z,
    )
    .await?;
    let every = if p.sc.cumulative > 0 {
        (p.k / (p.sc.cumulative + 1)).max(1)
    } else {
        u64::MAX
    };
    let mut reported = 0;
    for i in 0..p.k {
        if p.sc.drop && i == 3 {
            tokio::time::sleep(ABORT_FLUSH_DELAY).await;
            let _ = tx
                .send(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "mock: dropped",
                )))
                .await;
            return Err(());
        }
        send(
            tx,
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": word(i)}}),
            ),
            p.delay,
        )
        .await?;
        if (i + 1) % every == 0 && reported < p.sc.cumulative {
            reported += 1;
            send(
                tx,
                event(
                    "message_delta",
                    json!({"type": "message_delta",
                "delta": {"stop_reason": null, "stop_sequence": null},
                "usage": {"output_tokens": p.thinking + i + 1}}),
                ),
                z,
            )
            .await?;
        }
    }
    send(
        tx,
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ),
        z,
    )
    .await?;
    if p.sc.tool_use {
        index += 1;
        send(tx, event("content_block_start", json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": "toolu_mock_1", "name": "get_weather", "input": {}}})), z).await?;
        send(
            tx,
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": TOOL_INPUT}}),
            ),
            z,
        )
        .await?;
        send(
            tx,
            event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ),
            z,
        )
        .await?;
    }
    let mut final_usage = json!({"output_tokens": p.usage["output_tokens"]});
    if let Some(calls) = p.usage.get("server_tool_use") {
        final_usage["server_tool_use"] = calls.clone();
    }
    if p.sc.late_cache {
        for k in ["cache_creation_input_tokens", "cache_read_input_tokens"] {
            final_usage[k] = p.usage[k].clone();
        }
    }
    send(
        tx,
        event(
            "message_delta",
            json!({"type": "message_delta",
        "delta": {"stop_reason": p.stop_reason, "stop_sequence": null}, "usage": final_usage}),
        ),
        z,
    )
    .await?;
    if !p.sc.no_stop {
        send(
            tx,
            event("message_stop", json!({"type": "message_stop"})),
            z,
        )
        .await?;
    }
    Ok(())
}

fn stream_response(p: Plan) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let _ = produce(p, &tx).await;
    });
    let body =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut r = Response::new(Body::from_stream(body.boxed()));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    anthropic_headers(r)
}
