//! A simulated Gemini API (`kind = "gemini"`, Google AI Studio) and the
//! Gemini models of Vertex AI (`publishers/google`, served from
//! [`super::vertex`] after its token check).
//!
//! * `POST /v1beta/models/{model}:generateContent`: one answer.
//! * `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`: one SSE
//!   event (`data: {chunk}\r\n\r\n`, as Google frames them) per generated
//!   token; without `alt=sse`, the same chunks as one JSON array written as
//!   they are produced (`[{..}\n,\r\n{..}\n]`).
//! * `POST /v1beta/models/{model}:countTokens`: `{"totalTokens": N}`.
//! * `GET /v1beta/models`: the models listed by [`MODELS`].
//! * `POST /v1beta/openai/chat/completions` ([`OPENAI_CHAT_PATH`]): the
//!   OpenAI-compatible endpoint, the key as `Authorization: Bearer`; and
//!   Vertex's `.../endpoints/openapi/chat/completions` (from
//!   [`super::vertex`], the model named `google/{model}`). Both answer as
//!   the mock's chat completions do, with [`GeminiState::set_thoughts`]
//!   thinking tokens spent inside the cap and reported as Google reports
//!   them: outside `completion_tokens`, inside `total_tokens` and as
//!   `completion_tokens_details.reasoning_tokens`.
//!
//! Every request is recorded with all its headers ([`GeminiRequest`]).
//!
//! The key comes in `x-goog-api-key` or `?key=`; when
//! [`GeminiState::set_api_key`] set one, any other is refused as Google
//! refuses it (400 `INVALID_ARGUMENT`, reason `API_KEY_INVALID`).
//!
//! Counting (the mock's own, independent of the gateway): the prompt is
//! the `o200k_base` tokens of every text part (system instruction,
//! contents, function calls and responses as their JSON), 258 per image
//! part, and the JSON of the tool declarations; each candidate is
//! `K = min(output_tokens, maxOutputTokens - thoughts)` one-token words,
//! or, when `toolConfig.functionCallingConfig.mode` is `ANY`, a call to
//! the first function declared, or, for `responseMimeType:
//! "application/json"`, a value of the response schema (an enum's first
//! value, every property).
//! Thoughts are [`GeminiState::set_thoughts`] tokens, at most a positive
//! `thinkingBudget` (none with `thinkingBudget: 0`), counted once per
//! answer inside `maxOutputTokens` as Gemini 2.5 counts them.
//! `usageMetadata` carries promptTokenCount, candidatesTokenCount,
//! thoughtsTokenCount, cachedContentTokenCount, toolUsePromptTokenCount
//! and totalTokenCount (their sum); streamed chunks carry the prompt
//! count and the last chunk the whole usage with `finishReason`.
//!
//! Faults, from the `x-mock-gemini` header, a `fault-<name>` in the path's
//! model or the state ([`GeminiFault`]): `throttle` (429
//! `RESOURCE_EXHAUSTED` with `RetryInfo` `retryDelay: "2s"`), `quota_day`
//! (429 `RESOURCE_EXHAUSTED` naming a per-day quota, no `RetryInfo`),
//! `invalid` (400 `INVALID_ARGUMENT`), `denied` (403 `PERMISSION_DENIED`),
//! `unavailable` (503 `UNAVAILABLE`), `internal` (500 `INTERNAL`),
//! `no_usage` (no `usageMetadata`), `drop` (a stream cut after three
//! chunks), `ignore_cap` (output as if `maxOutputTokens` were absent).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::{count_tokens, lock, word, MockState};

/// Model ids `GET /v1beta/models` lists.
pub const MODELS: &[&str] = &["gemini-2.5-flash", "gemini-2.5-pro", "gemini-2.0-flash"];

/// Prompt tokens Gemini charges for one image part (Gemini API docs,
/// "Understand and count tokens": images of at most 384 px per side).
pub const IMAGE_TOKENS: u64 = 258;

/// A failure the mock Gemini answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeminiFault {
    Throttle,
    QuotaDay,
    Invalid,
    Denied,
    Unavailable,
    Internal,
    NoUsage,
    Drop,
    IgnoreCap,
}

impl GeminiFault {
    pub fn parse(s: &str) -> Option<GeminiFault> {
        Some(match s.trim() {
            "throttle" => GeminiFault::Throttle,
            "quota_day" => GeminiFault::QuotaDay,
            "invalid" => GeminiFault::Invalid,
            "denied" => GeminiFault::Denied,
            "unavailable" => GeminiFault::Unavailable,
            "internal" => GeminiFault::Internal,
            "no_usage" => GeminiFault::NoUsage,
            "drop" => GeminiFault::Drop,
            "ignore_cap" => GeminiFault::IgnoreCap,
            _ => return None,
        })
    }
}

/// The Gemini API's OpenAI-compatible chat completions route.
pub const OPENAI_CHAT_PATH: &str = "/v1beta/openai/chat/completions";

/// One Gemini model request as the mock understood it.
#[derive(Clone, Debug)]
pub struct GeminiRequest {
    /// `ai_studio`, `vertex`, `ai_studio_openai` or `vertex_openai`.
    pub surface: &'static str,
    pub model: String,
    /// `generateContent`, `streamGenerateContent`, `countTokens` or
    /// `chat/completions`.
    pub method: String,
    /// `alt=sse` was asked.
    pub sse: bool,
    /// The key presented (AI Studio), from the header or the query.
    pub key: Option<String>,
    /// The raw query.
    pub query: Option<String>,
    /// Every header, names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl GeminiRequest {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn header_list(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// What the mock Gemini does and saw.
#[derive(Debug, Default)]
pub struct GeminiState {
    api_key: Mutex<Option<String>>,
    thoughts: AtomicU64,
    cached: AtomicU64,
    tool_use_prompt: AtomicU64,
    fault: Mutex<Option<GeminiFault>>,
    requests: Mutex<Vec<GeminiRequest>>,
}

impl GeminiState {
    /// The only key AI Studio routes accept (`None`: any).
    pub fn set_api_key(&self, key: Option<&str>) {
        *lock(&self.api_key) = key.map(str::to_string);
    }
    /// Thinking tokens an answer spends (at most its budget and its cap).
    pub fn set_thoughts(&self, n: u64) {
        self.thoughts.store(n, Ordering::SeqCst);
    }
    /// `cachedContentTokenCount` reported (at most the prompt).
    pub fn set_cached(&self, n: u64) {
        self.cached.store(n, Ordering::SeqCst);
    }
    /// `toolUsePromptTokenCount` reported.
    pub fn set_tool_use_prompt(&self, n: u64) {
        self.tool_use_prompt.store(n, Ordering::SeqCst);
    }
    pub fn set_fault(&self, f: Option<GeminiFault>) {
        *lock(&self.fault) = f;
    }
    /// Model requests, in order (refused keys included).
    pub fn requests(&self) -> Vec<GeminiRequest> {
        lock(&self.requests).clone()
    }
}

/// Google's error body, with `details` when given.
pub fn google_error(status: StatusCode, word: &str, message: &str, details: Value) -> Response {
    let mut error = json!({"code": status.as_u16(), "message": message, "status": word});
    if details.as_array().is_some_and(|d| !d.is_empty()) {
        error["details"] = details;
    }
    let mut r = Response::new(Body::from(json!({ "error": error }).to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    r
}

/// Whether `path` is one of the AI Studio routes this module answers.
pub fn is_gemini_path(path: &str) -> bool {
    path.starts_with("/v1beta/models") || (path.starts_with("/v1/models/") && path.contains(':'))
}

fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| v.to_string())
    })
}

/// The AI Studio routes.
pub async fn handle_ai_studio(
    st: &MockState,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let rest = path
        .strip_prefix("/v1beta/models")
        .or_else(|| path.strip_prefix("/v1/models"))
        .unwrap_or("");
    let key = headers
        .get("x-goog-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| query_value(query, "key"));
    if rest.is_empty() || rest == "/" {
        if method != Method::GET {
            return google_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "INVALID_ARGUMENT",
                "method not allowed",
                json!([]),
            );
        }
        let models: Vec<Value> = MODELS
            .iter()
            .map(|m| json!({"name": format!("models/{m}"), "displayName": m, "inputTokenLimit": 1_048_576, "outputTokenLimit": 65_536, "supportedGenerationMethods": ["generateContent", "countTokens"]}))
            .collect();
        return json_answer(json!({ "models": models }));
    }
    let Some((model, op)) = rest.trim_start_matches('/').rsplit_once(':') else {
        return google_error(StatusCode::NOT_FOUND, "NOT_FOUND", "no method", json!([]));
    };
    let parsed = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    lock(&st.gemini.requests).push(GeminiRequest {
        surface: "ai_studio",
        model: model.to_string(),
        method: op.to_string(),
        sse: query_value(query, "alt").as_deref() == Some("sse"),
        key: key.clone(),
        query: query.map(str::to_string),
        headers: header_list(headers),
        body: parsed.clone(),
    });
    let expected = lock(&st.gemini.api_key).clone();
    if let Some(expected) = expected {
        if key.as_deref() != Some(expected.as_str()) {
            return google_error(
                StatusCode::BAD_REQUEST,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]),
            );
        }
    }
    let fault = headers
        .get("x-mock-gemini")
        .and_then(|v| v.to_str().ok())
        .and_then(GeminiFault::parse)
        .or_else(|| fault_in_model(model));
    let sse = query_value(query, "alt").as_deref() == Some("sse");
    answer(st, model, op, sse, fault, parsed).await
}

/// Records a Vertex Gemini request (its token already checked) and answers it.
pub async fn handle_vertex(
    st: &MockState,
    model: &str,
    op: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let parsed = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    let sse = query_value(query, "alt").as_deref() == Some("sse");
    lock(&st.gemini.requests).push(GeminiRequest {
        surface: "vertex",
        model: model.to_string(),
        method: op.to_string(),
        sse,
        key: None,
        query: query.map(str::to_string),
        headers: header_list(headers),
        body: parsed.clone(),
    });
    let fault = headers
        .get("x-mock-gemini")
        .and_then(|v| v.to_str().ok())
        .and_then(GeminiFault::parse)
        .or_else(|| fault_in_model(model));
    answer(st, model, op, sse, fault, parsed).await
}

/// A chat completion on an OpenAI-compatible endpoint (`surface`
/// `ai_studio_openai`: the key as a bearer token, checked as on the
/// native routes; `vertex_openai`: the token already checked, the model
/// named `google/{model}`). Recorded, then answered by
/// [`super::gemini_chat`].
pub async fn handle_openai(
    st: &MockState,
    surface: &'static str,
    method: &Method,
    headers: &HeaderMap,
    body: Option<Value>,
) -> Response {
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let body = body.unwrap_or(Value::Null);
    let model = body["model"].as_str().unwrap_or_default().to_string();
    lock(&st.gemini.requests).push(GeminiRequest {
        surface,
        model: model.clone(),
        method: "chat/completions".into(),
        sse: body["stream"].as_bool().unwrap_or(false),
        key: key.clone(),
        query: None,
        headers: header_list(headers),
        body: body.clone(),
    });
    if method != Method::POST {
        return google_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "INVALID_ARGUMENT",
            "method not allowed",
            json!([]),
        );
    }
    let expected = lock(&st.gemini.api_key).clone();
    if let (Some(expected), "ai_studio_openai") = (expected, surface) {
        if key.as_deref() != Some(expected.as_str()) {
            return google_error(
                StatusCode::BAD_REQUEST,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]),
            );
        }
    }
    let named = match surface {
        "vertex_openai" => model.strip_prefix("google/"),
        _ => Some(model.strip_prefix("models/").unwrap_or(&model)),
    };
    let Some(named) = named.filter(|m| !m.is_empty()) else {
        return google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            &format!("Invalid model {model:?}: name a Gemini model (on Vertex: google/{{model}})"),
            json!([]),
        );
    };
    let thoughts = st.gemini.thoughts.load(Ordering::SeqCst);
    super::gemini_chat(st, named.to_string(), body, thoughts).await
}

fn fault_in_model(model: &str) -> Option<GeminiFault> {
    let i = model.find("fault-")?;
    GeminiFault::parse(&model[i + "fault-".len()..])
}

fn json_answer(v: Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    r
}

async fn answer(
    st: &MockState,
    model: &str,
    op: &str,
    sse: bool,
    fault: Option<GeminiFault>,
    body: Value,
) -> Response {
    let fault = fault.or(*lock(&st.gemini.fault));
    match fault {
        Some(GeminiFault::Throttle) => {
            let mut r = google_error(
                StatusCode::TOO_MANY_REQUESTS,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota, please check your plan and billing details. (mock)",
                json!([
                    {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "quotaDimensions": {"model": model, "location": "global"}, "quotaValue": "10"}]},
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}
                ]),
            );
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("2"));
            return r;
        }
        Some(GeminiFault::QuotaDay) => return google_error(
            StatusCode::TOO_MANY_REQUESTS,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. (mock)",
            json!([
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier", "quotaDimensions": {"model": model, "location": "global"}, "quotaValue": "250"}]}
            ]),
        ),
        Some(GeminiFault::Invalid) => {
            return google_error(
                StatusCode::BAD_REQUEST,
                "INVALID_ARGUMENT",
                "* GenerateContentRequest.contents: contents is not specified (mock)",
                json!([]),
            )
        }
        Some(GeminiFault::Denied) => {
            return google_error(
                StatusCode::FORBIDDEN,
                "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (mock)",
                json!([]),
            )
        }
        Some(GeminiFault::Unavailable) => {
            return google_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                "The model is overloaded. Please try again later.",
                json!([]),
            )
        }
        Some(GeminiFault::Internal) => {
            return google_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL",
                "An internal error has occurred. (mock)",
                json!([]),
            )
        }
        _ => {}
    }
    if !body.is_object() {
        return google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "Invalid JSON payload received.",
            json!([]),
        );
    }
    let prompt = prompt_tokens(&body);
    match op {
        "countTokens" => {
            // countTokens takes `contents` or a whole `generateContentRequest`.
            let counted = body
                .get("generateContentRequest")
                .map_or(prompt, prompt_tokens);
            json_answer(json!({"totalTokens": counted}))
        }
        "generateContent" | "streamGenerateContent" => {
            let plan = Plan::new(st, model, &body, prompt, fault);
            if op == "generateContent" {
                let delay = *lock(&st.token_delay);
                if !delay.is_zero() {
                    tokio::time::sleep(delay * plan.k as u32).await;
                }
                json_answer(plan.whole())
            } else {
                stream(st, plan, sse)
            }
        }
        _ => google_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            &format!("unknown method {op}"),
            json!([]),
        ),
    }
}

/// The mock's prompt count of a generateContent body.
pub fn prompt_tokens(body: &Value) -> u64 {
    let bpe = tiktoken_rs::o200k_base_singleton();
    let parts = |content: &Value| -> u64 {
        content
            .get("parts")
            .and_then(Value::as_array)
            .map_or(0, |ps| ps.iter().map(|p| part_tokens(bpe, p)).sum())
    };
    let system = body.get("systemInstruction").map_or(0, parts);
    let contents = body
        .get("contents")
        .and_then(Value::as_array)
        .map_or(0, |cs| cs.iter().map(parts).sum());
    let tools = body
        .get("tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        .map_or(0, |t| count_tokens(bpe, &t.to_string()));
    system + contents + tools
}

fn part_tokens(bpe: &tiktoken_rs::CoreBPE, part: &Value) -> u64 {
    if let Some(t) = part.get("text").and_then(Value::as_str) {
        return count_tokens(bpe, t);
    }
    for k in ["inlineData", "fileData"] {
        if let Some(d) = part.get(k) {
            let mime = d.get("mimeType").and_then(Value::as_str).unwrap_or("");
            if mime.starts_with("image/") {
                return IMAGE_TOKENS;
            }
            // Other media: a fixed count the tests can predict.
            return 1000;
        }
    }
    for k in ["functionCall", "functionResponse"] {
        if let Some(v) = part.get(k) {
            return count_tokens(bpe, &v.to_string());
        }
    }
    0
}

/// One answer's shape and counts.
struct Plan {
    model: String,
    id: String,
    candidates: u64,
    /// Tokens per candidate.
    k: u64,
    thoughts: u64,
    include_thoughts: bool,
    prompt: u64,
    cached: u64,
    tool_use: u64,
    finish: &'static str,
    fault: Option<GeminiFault>,
    function_call: Option<String>,
    /// The answer to a request for JSON (`responseMimeType`), made from
    /// its schema: the whole text, in one chunk.
    json: Option<String>,
    token_delay: std::time::Duration,
}

/// A value of `schema` (JSON Schema or Google's OpenAPI subset): an
/// enum's first value, every property of an object, one item of an array.
fn example(schema: &Value) -> Value {
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("string")
        .to_ascii_lowercase();
    match ty.as_str() {
        "object" => Value::Object(
            schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|ps| ps.iter().map(|(k, s)| (k.clone(), example(s))).collect())
                .unwrap_or_default(),
        ),
        "array" => json!([example(schema.get("items").unwrap_or(&Value::Null))]),
        "integer" | "number" => json!(1),
        "boolean" => json!(true),
        _ => json!("the"),
    }
}

impl Plan {
    fn new(
        st: &MockState,
        model: &str,
        body: &Value,
        prompt: u64,
        fault: Option<GeminiFault>,
    ) -> Plan {
        let gc = body.get("generationConfig");
        let cap = gc
            .and_then(|g| g.get("maxOutputTokens"))
            .and_then(Value::as_u64)
            .filter(|_| fault != Some(GeminiFault::IgnoreCap));
        let candidates = gc
            .and_then(|g| g.get("candidateCount"))
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .max(1);
        let tc = gc.and_then(|g| g.get("thinkingConfig"));
        let budget = tc
            .and_then(|t| t.get("thinkingBudget"))
            .and_then(Value::as_i64);
        let mut thoughts = st.gemini.thoughts.load(Ordering::SeqCst);
        match budget {
            Some(0) => thoughts = 0,
            Some(b) if b > 0 => thoughts = thoughts.min(b as u64),
            _ => {}
        }
        if let Some(cap) = cap {
            thoughts = thoughts.min(cap);
        }
        let json = gc
            .filter(|g| {
                g.get("responseMimeType").and_then(Value::as_str) == Some("application/json")
            })
            .map(|g| {
                let schema = g
                    .get("responseJsonSchema")
                    .or_else(|| g.get("responseSchema"))
                    .unwrap_or(&Value::Null);
                example(schema).to_string()
            });
        let wanted = match &json {
            Some(text) => count_tokens(tiktoken_rs::o200k_base_singleton(), text),
            None => st.output_tokens(),
        };
        let k = match cap {
            Some(cap) => wanted.min(cap - thoughts),
            None => wanted,
        };
        let finish = if cap.is_some_and(|c| wanted + thoughts > c) {
            "MAX_TOKENS"
        } else {
            "STOP"
        };
        // A request that makes the model call a function (`toolConfig`
        // mode `ANY`) gets a call to the first one offered.
        let must_call = body
            .pointer("/toolConfig/functionCallingConfig/mode")
            .and_then(Value::as_str)
            == Some("ANY");
        let function_call = body
            .get("tools")
            .filter(|_| must_call)
            .and_then(Value::as_array)
            .and_then(|ts| {
                ts.iter().find_map(|t| {
                    t.get("functionDeclarations")
                        .and_then(Value::as_array)
                        .and_then(|f| f.first())
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                })
            })
            .map(str::to_string);
        Plan {
            model: model.to_string(),
            id: format!("mock-{}", uuid::Uuid::new_v4().simple()),
            candidates,
            k,
            thoughts,
            include_thoughts: tc
                .and_then(|t| t.get("includeThoughts"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            prompt,
            cached: st.gemini.cached.load(Ordering::SeqCst).min(prompt),
            tool_use: st.gemini.tool_use_prompt.load(Ordering::SeqCst),
            finish,
            fault,
            function_call,
            json,
            token_delay: *lock(&st.token_delay),
        }
    }

    fn usage(&self) -> Option<Value> {
        if self.fault == Some(GeminiFault::NoUsage) {
            return None;
        }
        let candidates = self.k * self.candidates;
        let mut u = json!({
            "promptTokenCount": self.prompt,
            "candidatesTokenCount": candidates,
            "totalTokenCount": self.prompt + self.tool_use + candidates + self.thoughts,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": self.prompt}],
        });
        if self.thoughts > 0 {
            u["thoughtsTokenCount"] = json!(self.thoughts);
        }
        if self.cached > 0 {
            u["cachedContentTokenCount"] = json!(self.cached);
        }
        if self.tool_use > 0 {
            u["toolUsePromptTokenCount"] = json!(self.tool_use);
        }
        Some(u)
    }

    fn whole(&self) -> Value {
        let candidates: Vec<Value> = (0..self.candidates)
            .map(|i| {
                let mut parts = Vec::new();
                if self.include_thoughts && self.thoughts > 0 {
                    parts.push(json!({"text": "Thinking it over.", "thought": true}));
                }
                match (&self.function_call, &self.json) {
                    (Some(name), _) => parts.push(json!({"functionCall": {"name": name, "args": {"location": "Boston"}}})),
                    (None, Some(text)) => parts.push(json!({"text": text})),
                    (None, None) => parts.push(json!({"text": super::generated_text(self.k)})),
                }
                json!({"content": {"role": "model", "parts": parts}, "finishReason": self.finish, "index": i})
            })
            .collect();
        let mut v =
            json!({"candidates": candidates, "modelVersion": self.model, "responseId": self.id});
        if let Some(u) = self.usage() {
            v["usageMetadata"] = u;
        }
        v
    }

    fn chunk(&self, parts: Vec<(u64, Value)>, finish: Option<&str>, last: bool) -> Value {
        let candidates: Vec<Value> = parts
            .into_iter()
            .map(|(i, part)| {
                let mut c = json!({"content": {"role": "model", "parts": [part]}, "index": i});
                if let Some(f) = finish {
                    c["finishReason"] = json!(f);
                }
                c
            })
            .collect();
        let mut v =
            json!({"candidates": candidates, "modelVersion": self.model, "responseId": self.id});
        if last {
            if let Some(u) = self.usage() {
                v["usageMetadata"] = u;
            }
        } else if self.fault != Some(GeminiFault::NoUsage) {
            v["usageMetadata"] =
                json!({"promptTokenCount": self.prompt, "totalTokenCount": self.prompt});
        }
        v
    }

    /// Every chunk of the stream, in order.
    fn chunks(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.include_thoughts && self.thoughts > 0 {
            let parts = (0..self.candidates)
                .map(|i| (i, json!({"text": "Thinking it over.", "thought": true})))
                .collect();
            out.push(self.chunk(parts, None, false));
        }
        if let Some(name) = &self.function_call {
            let parts = (0..self.candidates)
                .map(|i| {
                    (
                        i,
                        json!({"functionCall": {"name": name, "args": {"location": "Boston"}}}),
                    )
                })
                .collect();
            out.push(self.chunk(parts, Some(self.finish), true));
            return out;
        }
        if let Some(text) = &self.json {
            let parts = (0..self.candidates)
                .map(|i| (i, json!({"text": text})))
                .collect();
            out.push(self.chunk(parts, Some(self.finish), true));
            return out;
        }
        for t in 0..self.k {
            let last = t + 1 == self.k;
            let parts = (0..self.candidates)
                .map(|i| (i, json!({"text": word(t)})))
                .collect();
            out.push(self.chunk(parts, last.then_some(self.finish), last));
        }
        if self.k == 0 {
            let parts = (0..self.candidates)
                .map(|i| (i, json!({"text": ""})))
                .collect();
            out.push(self.chunk(parts, Some(self.finish), true));
        }
        out
    }
}

type Frame = Result<Bytes, std::io::Error>;

fn stream(_st: &MockState, plan: Plan, sse: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame>(4);
    tokio::spawn(async move {
        let chunks = plan.chunks();
        let n = chunks.len();
        for (i, c) in chunks.into_iter().enumerate() {
            if plan.fault == Some(GeminiFault::Drop) && i == 3 {
                tokio::time::sleep(super::ABORT_FLUSH_DELAY).await;
                let _ = tx
                    .send(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "mock: dropped mid-stream",
                    )))
                    .await;
                return;
            }
            if !plan.token_delay.is_zero() {
                tokio::time::sleep(plan.token_delay).await;
            }
            let text = if sse {
                format!("data: {c}\r\n\r\n")
            } else if i == 0 {
                format!("[{c}")
            } else {
                format!("\n,\r\n{c}")
            };
            if tx.send(Ok(Bytes::from(text))).await.is_err() {
                return;
            }
            if !sse && i + 1 == n && tx.send(Ok(Bytes::from_static(b"\n]"))).await.is_err() {
                return;
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if sse {
            "text/event-stream"
        } else {
            "application/json; charset=UTF-8"
        }),
    );
    r
}
