//! The mock's OpenAI Responses API: `POST /v1/responses` (whole and
//! streamed), and for stored responses `GET /v1/responses/{id}`,
//! `DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`,
//! `GET /v1/responses/{id}/input_items` (Azure: the same under
//! `/openai/responses…?api-version=`).
//!
//! * Input tokens follow the framing budgetgate documents for plain text:
//!   3 per message + the role's tokens + the text's tokens, `instructions`
//!   as a `developer` message, a string `input` as a `user` message, 3 to
//!   prime the reply; other items, `tools` and `text.format` count the
//!   tokens of their JSON. A `previous_response_id` adds the stored
//!   response's context (its input + output tokens); an unknown one is a
//!   404 `previous_response_not_found`.
//! * Output is `K = min(output_tokens, max_output_tokens)` words of
//!   [`super::WORDS`], one token per delta; when the output was cut at
//!   `max_output_tokens` the response ends `incomplete`
//!   (`max_output_tokens`). With `tool_choice: "required"` (or a named
//!   function) the output is one `function_call` of the first function
//!   tool, arguments `{"q":"<K words>"}`.
//! * Reasoning and cached tokens ([`MockState::set_responses_details`]):
//!   `reasoning_tokens` are added to `output_tokens` (spent without
//!   deltas), `cached_tokens` reported inside `input_tokens`.
//! * Faults: `drop_mid_stream` (three deltas, then the connection drops),
//!   `missing_usage` (terminal event and body without `usage`),
//!   `response_incomplete` (ends `incomplete`, `max_output_tokens`, after
//!   half the output), `response_failed` / `response_failed_no_usage`
//!   (ends `failed` after half the output, with / without usage),
//!   `max_tokens_only` (ignores `max_output_tokens`), `slow_first_byte` as
//!   for the other routes.
//! * Web searches ([`MockState::set_web_search_calls`]): an answer whose
//!   body offers a `web_search` tool reports that many `web_search_call`
//!   items before its message (at most the body's `max_tool_calls`).
//! * Per request, the `x-mock-responses` header (comma-separated
//!   `name=value`, as `x-mock-messages`): `input=N` reports N input tokens
//!   (else the mock's own count), `output=N` answers N visible tokens
//!   (else the mock's output setting, within `max_output_tokens`),
//!   `reasoning=N` adds N reasoning tokens (else
//!   [`MockState::set_responses_details`]'s).
//! * Every response is stored at creation (status `in_progress` while it
//!   streams), so it can be fetched while the stream runs.

use super::*;

/// Tokens of `text` under `bpe`.
fn t(bpe: &CoreBPE, s: &str) -> u64 {
    count_tokens(bpe, s)
}

/// Input tokens of a Responses body by the documented framing (see the
/// module docs), without any stored context.
pub fn responses_input_tokens(bpe: &CoreBPE, body: &Value) -> u64 {
    let msg = |role: &str, text: &str| 3 + t(bpe, role) + t(bpe, text);
    let mut n = 3u64;
    if let Some(s) = body.get("instructions").and_then(Value::as_str) {
        n += msg("developer", s);
    }
    match body.get("input") {
        Some(Value::String(s)) => n += msg("user", s),
        Some(Value::Array(items)) => {
            for item in items {
                let role = item.get("role").and_then(Value::as_str);
                match (role, item.get("content")) {
                    (Some(role), Some(Value::String(s))) => n += msg(role, s),
                    (Some(role), Some(Value::Array(parts))) => {
                        n += 3 + t(bpe, role);
                        for p in parts {
                            n += match p.get("type").and_then(Value::as_str) {
                                Some("input_text") | Some("output_text") => {
                                    t(bpe, p.get("text").and_then(Value::as_str).unwrap_or(""))
                                }
                                Some("input_image") => IMAGE_PART_TOKENS,
                                _ => t(bpe, &p.to_string()),
                            };
                        }
                    }
                    _ => n += t(bpe, &item.to_string()),
                }
            }
        }
        _ => {}
    }
    if let Some(Value::Array(tools)) = body.get("tools") {
        n += tools.iter().map(|x| t(bpe, &x.to_string())).sum::<u64>();
    }
    if let Some(schema) = body.pointer("/text/format/schema") {
        n += t(bpe, &schema.to_string());
    }
    n
}

/// The `x-mock-responses` controls of one request (module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Scenario {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub reasoning: Option<u64>,
}

impl Scenario {
    /// Reads the `x-mock-responses` header.
    pub fn from_headers(h: &axum::http::HeaderMap) -> Scenario {
        let mut s = Scenario::default();
        let Some(v) = h.get("x-mock-responses").and_then(|v| v.to_str().ok()) else {
            return s;
        };
        for pair in v.split(',') {
            let Some((k, v)) = pair.split_once('=') else {
                continue;
            };
            let n = v.trim().parse::<u64>().ok();
            match k.trim() {
                "input" => s.input = n,
                "output" => s.output = n,
                "reasoning" => s.reasoning = n,
                _ => {}
            }
        }
        s
    }
}

fn usage(st: &MockState, input: u64, visible_output: u64, sc: Scenario) -> Value {
    let (cached, reasoning) = *lock(&st.responses_details);
    let reasoning = sc.reasoning.unwrap_or(reasoning);
    let (input, visible_output) = st.usage(input, visible_output);
    let output = visible_output + reasoning;
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached.min(input)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output,
    })
}

fn stored_id(path: &str) -> Option<(&str, &str)> {
    let rest = path
        .strip_prefix("/v1/responses/")
        .or_else(|| path.strip_prefix("/openai/responses/"))?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

/// Whether `path` is one of the Responses routes.
pub fn is_responses_path(path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    path == "/v1/responses" || path == "/openai/responses" || stored_id(path).is_some()
}

/// Serves a Responses route (the request is already recorded).
pub async fn handle(
    st: &MockState,
    method: &Method,
    path: &str,
    body: Option<Value>,
    fault: Option<Fault>,
    sc: Scenario,
) -> Response {
    let path = path.strip_suffix('/').unwrap_or(path);
    if let Some((id, action)) = stored_id(path) {
        return stored(st, method, id, action);
    }
    if method != Method::POST {
        return error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            "invalid_request_error",
            None,
            None,
        );
    }
    if let Some(r) = fault_response(st, fault).await {
        return r;
    }
    let Some(body) = body.filter(Value::is_object) else {
        return bad_param("body", "The request body must be a JSON object.");
    };
    let Some(model) = body
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return bad_param("model", "you must provide a model parameter");
    };
    let bpe = bpe_for(&model);
    let mut input = responses_input_tokens(bpe, &body);
    if let Some(prev) = body.get("previous_response_id").and_then(Value::as_str) {
        let context = lock(&st.stored).get(prev).and_then(|r| {
            let u = r.get("usage")?;
            Some(u.get("input_tokens")?.as_u64()? + u.get("output_tokens")?.as_u64()?)
        });
        match context {
            Some(c) => input += c,
            None => {
                return error_response(
                    StatusCode::NOT_FOUND,
                    &format!("Previous response with id '{prev}' not found."),
                    "invalid_request_error",
                    Some("previous_response_id"),
                    Some("previous_response_not_found"),
                )
            }
        }
    }
    let cap = match body.get("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(c) if c >= 16 => Some(c),
            _ => return bad_param(
                "max_output_tokens",
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16.",
            ),
        },
    };
    if body.pointer("/stream_options/include_usage").is_some() {
        return bad_param(
            "stream_options.include_usage",
            "Unknown parameter: 'stream_options.include_usage'.",
        );
    }
    // An upstream that ignores the cap (as `max_tokens_only` servers ignore
    // every cap field but `max_tokens`).
    let cap = cap.filter(|_| fault != Some(Fault::MaxTokensOnly));
    let wanted = sc.output.unwrap_or_else(|| st.output_tokens());
    let input = sc.input.unwrap_or(input);
    let mut k = cap.map_or(wanted, |c| wanted.min(c));
    let mut ending = if cap.is_some_and(|c| wanted > c) {
        Ending::Incomplete
    } else {
        Ending::Completed
    };
    match fault {
        Some(Fault::ResponseIncomplete) => {
            k /= 2;
            ending = Ending::Incomplete;
        }
        Some(Fault::ResponseFailed) => {
            k /= 2;
            ending = Ending::Failed { usage: true };
        }
        Some(Fault::ResponseFailedNoUsage) => {
            k /= 2;
            ending = Ending::Failed { usage: false };
        }
        _ => {}
    }
    let call = tool_call(&body);
    let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let plan = Plan {
        id: id.clone(),
        item_id: format!("{}_{}", if call.is_some() { "fc" } else { "msg" }, &id[5..]),
        model,
        created_at: now_secs(),
        k,
        call,
        input,
        ending,
        usage_missing: fault == Some(Fault::MissingUsage),
        body: body.clone(),
        scenario: sc,
    };
    lock(&st.stored).insert(id.clone(), plan.response("in_progress", vec![], None, st));
    if let Some(items) = body.get("input") {
        lock(&st.stored_inputs).insert(id.clone(), items.clone());
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return stream(st, plan, fault);
    }
    let delay = *lock(&st.token_delay) * k as u32;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let done = plan.final_response(st);
    lock(&st.stored).insert(id, done.clone());
    if fault == Some(Fault::DropMidStream) {
        return dropped_json_response(&done);
    }
    json_response(StatusCode::OK, &done)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Completed,
    Incomplete,
    Failed { usage: bool },
}

struct Plan {
    id: String,
    item_id: String,
    model: String,
    created_at: u64,
    k: u64,
    /// Name of the function to call instead of answering with text.
    call: Option<String>,
    input: u64,
    ending: Ending,
    usage_missing: bool,
    body: Value,
    scenario: Scenario,
}

fn tool_call(body: &Value) -> Option<String> {
    let first_function = || {
        body.get("tools")?
            .as_array()?
            .iter()
            .find(|x| x.get("type").and_then(Value::as_str) == Some("function"))?
            .get("name")?
            .as_str()
            .map(str::to_string)
    };
    match body.get("tool_choice") {
        Some(Value::String(s)) if s == "required" => first_function(),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            o.get("name").and_then(Value::as_str).map(str::to_string)
        }
        _ => None,
    }
}

impl Plan {
    fn text(&self) -> String {
        generated_text(self.k)
    }

    fn arguments(&self) -> String {
        json!({"q": self.text()}).to_string()
    }

    fn visible_output(&self) -> u64 {
        match &self.call {
            None => self.k,
            Some(_) => count_tokens(bpe_for(&self.model), &self.arguments()),
        }
    }

    fn item(&self, status: &str, complete: bool) -> Value {
        match &self.call {
            Some(name) => json!({
                "id": self.item_id, "type": "function_call", "status": status,
                "call_id": format!("call_{}", &self.id[5..]), "name": name,
                "arguments": if complete { self.arguments() } else { String::new() },
            }),
            None => json!({
                "id": self.item_id, "type": "message", "role": "assistant", "status": status,
                "content": if complete {
                    json!([{"type": "output_text", "text": self.text(), "annotations": [], "logprobs": []}])
                } else {
                    json!([])
                },
            }),
        }
    }

    fn response(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<Value>,
        _st: &MockState,
    ) -> Value {
        let b = &self.body;
        let get = |k: &str, d: Value| b.get(k).cloned().unwrap_or(d);
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        let error = (status == "failed")
            .then(|| json!({"code": "server_error", "message": "The mock failed the response."}));
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": false, "error": error,
            "incomplete_details": incomplete,
            "instructions": get("instructions", Value::Null),
            "max_output_tokens": get("max_output_tokens", Value::Null),
            "model": self.model, "output": output, "parallel_tool_calls": true,
            "previous_response_id": get("previous_response_id", Value::Null),
            "reasoning": {"effort": null, "summary": null},
            "store": true, "temperature": 1.0,
            "text": get("text", json!({"format": {"type": "text"}})),
            "tool_choice": get("tool_choice", json!("auto")),
            "tools": get("tools", json!([])), "top_p": 1.0, "truncation": "disabled",
            "usage": usage, "user": null, "metadata": {},
        })
    }

    fn final_status(&self) -> &'static str {
        match self.ending {
            Ending::Completed => "completed",
            Ending::Incomplete => "incomplete",
            Ending::Failed { .. } => "failed",
        }
    }

    fn final_usage(&self, st: &MockState) -> Option<Value> {
        let missing = self.usage_missing || self.ending == (Ending::Failed { usage: false });
        (!missing).then(|| usage(st, self.input, self.visible_output(), self.scenario))
    }

    fn final_response(&self, st: &MockState) -> Value {
        let done = self.ending == Ending::Completed;
        let item = self.item(if done { "completed" } else { "incomplete" }, true);
        let mut output = self.web_searches(st);
        output.push(item);
        self.response(self.final_status(), output, self.final_usage(st), st)
    }

    /// The `web_search_call` items of the answer: as many as the mock was
    /// told ([`MockState::set_web_search_calls`]), at most the body's
    /// `max_tool_calls`, when the body offers a web search tool.
    fn web_searches(&self, st: &MockState) -> Vec<Value> {
        let offered = self.body["tools"].as_array().is_some_and(|ts| {
            ts.iter().any(|t| {
                t["type"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("web_search"))
            })
        });
        if !offered {
            return Vec::new();
        }
        let n = st.web_search_calls.load(Ordering::SeqCst);
        let n = self.body["max_tool_calls"].as_u64().map_or(n, |m| n.min(m));
        (0..n)
            .map(|i| {
                json!({"id": format!("ws_{i}_{}", &self.id[5..]), "type": "web_search_call",
                "status": "completed", "action": {"type": "search", "query": "budgetgate"}})
            })
            .collect()
    }
}

/// A stored response: fetch, delete, cancel, list input items.
fn stored(st: &MockState, method: &Method, id: &str, action: &str) -> Response {
    let not_found = || {
        error_response(
            StatusCode::NOT_FOUND,
            &format!("Response with id '{id}' not found."),
            "invalid_request_error",
            None,
            None,
        )
    };
    let found = lock(&st.stored).get(id).cloned();
    let Some(resp) = found else {
        return not_found();
    };
    match (method.as_str(), action) {
        ("GET", "") => json_response(StatusCode::OK, &resp),
        ("DELETE", "") => {
            lock(&st.stored).remove(id);
            json_response(
                StatusCode::OK,
                &json!({"id": id, "object": "response.deleted", "deleted": true}),
            )
        }
        ("POST", "cancel") => {
            let mut r = resp;
            r["status"] = json!("cancelled");
            json_response(StatusCode::OK, &r)
        }
        ("GET", "input_items") => {
            let items = match lock(&st.stored_inputs).get(id).cloned() {
                Some(Value::String(s)) => vec![json!({
                    "id": format!("msg_in_{id}"), "type": "message", "role": "user",
                    "status": "completed", "content": [{"type": "input_text", "text": s}]
                })],
                Some(Value::Array(a)) => a,
                _ => vec![],
            };
            json_response(
                StatusCode::OK,
                &json!({"object": "list", "data": items, "first_id": null, "last_id": null, "has_more": false}),
            )
        }
        _ => not_found(),
    }
}

fn stream(st: &MockState, plan: Plan, fault: Option<Fault>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame>(4);
    let mut e = Emitter {
        tx,
        keepalive: false,
        sent: false,
    };
    let delay = *lock(&st.token_delay);
    let done = plan.final_response(st);
    let created = plan.response("in_progress", vec![], None, st);
    let stored = st.stored_handle();
    tokio::spawn(async move {
        let mut seq = 0u64;
        let mut send = |e: &mut Emitter, kind: &str, mut v: Value| {
            v["type"] = json!(kind);
            v["sequence_number"] = json!(seq);
            seq += 1;
            let frame = Bytes::from(format!("event: {kind}\ndata: {v}\n\n"));
            let tx = e.tx.clone();
            async move { tx.send(Ok(frame)).await.map_err(|_| ()) }
        };
        let run = async {
            send(&mut e, "response.created", json!({"response": created})).await?;
            send(&mut e, "response.in_progress", json!({"response": created})).await?;
            send(
                &mut e,
                "response.output_item.added",
                json!({"output_index": 0, "item": plan.item("in_progress", false)}),
            )
            .await?;
            let pieces: Vec<String> = match &plan.call {
                None => {
                    send(&mut e, "response.content_part.added", json!({"item_id": plan.item_id, "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})).await?;
                    (0..plan.k).map(|i| word(i).to_string()).collect()
                }
                // Arguments in pieces: the opening, one word each, the closing.
                Some(_) => {
                    let mut p = vec!["{\"q\":\"".to_string()];
                    p.extend((0..plan.k).map(|i| word(i).to_string()));
                    p.push("\"}".to_string());
                    p
                }
            };
            let kind = if plan.call.is_some() {
                "response.function_call_arguments.delta"
            } else {
                "response.output_text.delta"
            };
            for (i, piece) in pieces.iter().enumerate() {
                if fault == Some(Fault::DropMidStream) && i == 3 {
                    return Err(());
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                send(&mut e, kind, json!({"item_id": plan.item_id, "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []})).await?;
            }
            if fault == Some(Fault::DropMidStream) {
                return Err(());
            }
            // The message (or call) is the last item, after any web searches.
            let item = done["output"]
                .as_array()
                .and_then(|a| a.last())
                .cloned()
                .unwrap_or(Value::Null);
            if plan.call.is_none() {
                send(&mut e, "response.output_text.done", json!({"item_id": plan.item_id, "output_index": 0, "content_index": 0, "text": plan.text(), "logprobs": []})).await?;
                send(&mut e, "response.content_part.done", json!({"item_id": plan.item_id, "output_index": 0, "content_index": 0, "part": item["content"][0]})).await?;
            } else {
                send(&mut e, "response.function_call_arguments.done", json!({"item_id": plan.item_id, "output_index": 0, "arguments": plan.arguments()})).await?;
            }
            send(
                &mut e,
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            )
            .await?;
            lock(&stored).insert(plan.id.clone(), done.clone());
            let terminal = format!("response.{}", plan.final_status());
            send(&mut e, &terminal, json!({"response": done})).await?;
            Ok::<(), ()>(())
        };
        if run.await.is_err() && fault == Some(Fault::DropMidStream) {
            e.abort().await;
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    with_common_headers(r)
}
