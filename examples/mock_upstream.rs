//! A simulated OpenAI-compatible upstream for budgetgate's integration tests
//! and for trying the gateway locally (README quick start).
//!
//! Run it as a binary:
//!
//! ```text
//! cargo run --example mock_upstream -- --listen 127.0.0.1:9000 [--token-delay-ms 0] [--output-tokens 64]
//! ```
//!
//! or include it from an integration test:
//!
//! ```ignore
//! #[path = "../examples/mock_upstream.rs"]
//! mod mock_upstream;
//! let mock = mock_upstream::start(mock_upstream::MockConfig::default()).await?;
//! ```
//!
//! Behaviour, in brief:
//!
//! * `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
//!   `POST /v1/messages` (Anthropic Messages, [`messages`]),
//!   `GET /v1/models`, and the Azure forms
//!   `POST /openai/deployments/{deployment}/{chat/completions|completions|embeddings}`.
//! * The Responses API (`POST /v1/responses`, whole and streamed, and the
//!   stored-response routes; Azure under `/openai/responses`): see
//!   [`responses`] for its counting, output and scenario controls
//!   (`response_incomplete`, `response_failed`, `response_failed_no_usage`
//!   faults; [`MockState::set_responses_details`] for cached and reasoning
//!   tokens).
//! * Generated text is exactly `K = min(output_tokens, cap)` tokens, where `cap`
//!   is the smaller of the request's `max_completion_tokens` / `max_tokens`; every
//!   generated word ([`WORDS`]) is exactly one token in both `o200k_base` and
//!   `cl100k_base`, and one streamed delta carries exactly one token.
//! * Prompt tokens are counted with the mock's own code, following OpenAI's
//!   published rule (3 tokens per message, +1 per `name`, +3 reply priming).
//! * Every request is recorded in [`MockState`] before any hold or fault logic;
//!   with `--log-requests` (or [`MockConfig::log_requests`]) it is also printed
//!   as one JSON line (method, path, query, every header): the request log.
//! * The Gemini API (`/v1beta/models/{model}:generateContent`, streamed
//!   as SSE or a JSON array, `:countTokens`, the model list) and Vertex
//!   Gemini: [`gemini`].
//! * Amazon Bedrock (its Messages endpoint, InvokeModel with event-stream
//!   answers, SigV4 verified) and the AWS credential endpoints: [`bedrock`].
//! * Per-tenant and per-deployment counts of requests and tokens
//!   (`GET /_counters`, [`counters`]).
//! * Faults ([`Fault`]) are chosen per request: the `x-mock-fault` header first,
//!   then a `fault-<name>` substring in the request's `model`, then the state's
//!   fault.
#![allow(dead_code)]

#[path = "mock_upstream/messages.rs"]
pub mod messages;

#[path = "mock_upstream/bedrock.rs"]
pub mod bedrock;

#[path = "mock_upstream/counters.rs"]
pub mod counters;

#[path = "mock_upstream/vertex.rs"]
pub mod vertex;

#[path = "mock_upstream/gemini.rs"]
pub mod gemini;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use futures_util::StreamExt as _;
use serde_json::{json, Map, Value};
use tiktoken_rs::CoreBPE;

#[path = "mock_responses/responses.rs"]
pub mod responses;

/// Words the mock generates, in rotation. Each is exactly one token in both
/// `o200k_base` and `cl100k_base`, and stays one token when concatenated with
/// the others (checked by `tests/mock_upstream_selftest.rs`).
pub const WORDS: &[&str] = &[
    " the", " of", " and", " to", " in", " is", " it", " on", " for", " with", " as", " at", " by",
    " from", " that", " this", " be", " are", " was", " we",
];

/// Number of floats in each embedding vector unless the request asks for `dimensions`.
pub const EMBEDDING_DIMS: usize = 8;

/// Largest `dimensions` an embeddings request may ask for.
pub const MAX_EMBEDDING_DIMS: u64 = 4096;

/// Fixed prompt cost the mock charges for each image part of a chat message.
pub const IMAGE_PART_TOKENS: u64 = 85;

/// How long a dropped response waits, after its last frame, before aborting
/// the connection (so the frames before the drop reach the client).
pub const ABORT_FLUSH_DELAY: Duration = Duration::from_millis(100);

/// Model ids listed by `GET /v1/models`.
pub const MODEL_IDS: &[&str] = &[
    "mock-gpt",
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1-mini",
    "gpt-4",
    "gpt-3.5-turbo",
    "gpt-3.5-turbo-instruct",
    "text-embedding-3-small",
];

/// Configuration of a mock upstream.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Delay before each streamed token (non-streaming responses wait `K × token_delay`).
    pub token_delay: Duration,
    /// Completion length when the request carries no smaller cap.
    pub output_tokens: u64,
    /// How long [`Fault::SlowFirstByte`] waits before sending headers.
    pub first_byte_delay: Duration,
    /// When set, the Azure routes require this `api-version` and `api-key`.
    pub expect_azure: Option<AzureExpect>,
    /// Print every request (method, path, query, all headers) as one JSON
    /// line on stdout: the request log an operator reads to see what the
    /// gateway sends upstream.
    pub log_requests: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            token_delay: Duration::ZERO,
            output_tokens: 64,
            first_byte_delay: Duration::from_secs(2),
            expect_azure: None,
            log_requests: false,
        }
    }
}

/// What the Azure routes require when [`MockConfig::expect_azure`] is set:
/// a wrong or missing `api-version` query answers 400, a wrong or missing
/// `api-key` header answers 401 (both with an OpenAI error body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AzureExpect {
    /// Required value of the `api-version` query parameter.
    pub api_version: String,
    /// Required value of the `api-key` header.
    pub api_key: String,
}

/// A fault the mock injects into a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `retry-after: 2` and an OpenAI `rate_limit_exceeded` error body.
    RateLimited,
    /// 500 with an OpenAI `server_error` body.
    ServerError,
    /// 400 with an OpenAI `invalid_request_error` body, `param: "messages"`.
    BadRequest,
    /// 401 with an OpenAI `invalid_api_key` body.
    Unauthorized,
    /// 200 with a `text/html` body.
    NonJson,
    /// Streaming: three content chunks, then the connection is aborted without
    /// `[DONE]`. Non-streaming: the body is aborted half way.
    DropMidStream,
    /// Sleep [`MockConfig::first_byte_delay`] before sending headers, then answer normally.
    SlowFirstByte,
    /// Never report usage: non-streaming omits `usage`; streaming never sends the
    /// usage chunk, even when asked.
    MissingUsage,
    /// Streaming: finish normally but close without `data: [DONE]`.
    NoDone,
    /// Streaming: Azure-style chunks with empty `choices` and
    /// `prompt_filter_results` before the content, and `: keep-alive` comment
    /// frames between chunks.
    ContentFilterChunks,
    /// Read only `max_tokens` as the output cap, as llama.cpp's server does:
    /// `max_completion_tokens` is ignored.
    MaxTokensOnly,
    /// Responses: end `incomplete` (`max_output_tokens`) after half the output, with usage.
    ResponseIncomplete,
    /// Responses: end `failed` after half the output, with usage.
    ResponseFailed,
    /// Responses: end `failed` after half the output, without usage.
    ResponseFailedNoUsage,
    /// 529 with Anthropic's `overloaded_error` body.
    Overloaded,
}

impl Fault {
    /// Every fault, in declaration order.
    pub const ALL: [Fault; 15] = [
        Fault::RateLimited,
        Fault::ServerError,
        Fault::BadRequest,
        Fault::Unauthorized,
        Fault::NonJson,
        Fault::DropMidStream,
        Fault::SlowFirstByte,
        Fault::MissingUsage,
        Fault::NoDone,
        Fault::ContentFilterChunks,
        Fault::MaxTokensOnly,
        Fault::ResponseIncomplete,
        Fault::ResponseFailed,
        Fault::ResponseFailedNoUsage,
        Fault::Overloaded,
    ];

    /// Parses a snake_case fault name (`rate_limited`, `server_error`, …).
    pub fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == s.trim())
    }

    /// The snake_case name of this fault, as accepted by [`Fault::parse`].
    pub fn name(self) -> &'static str {
        match self {
            Fault::RateLimited => "rate_limited",
            Fault::ServerError => "server_error",
            Fault::BadRequest => "bad_request",
            Fault::Unauthorized => "unauthorized",
            Fault::NonJson => "non_json",
            Fault::DropMidStream => "drop_mid_stream",
            Fault::SlowFirstByte => "slow_first_byte",
            Fault::MissingUsage => "missing_usage",
            Fault::NoDone => "no_done",
            Fault::ContentFilterChunks => "content_filter_chunks",
            Fault::MaxTokensOnly => "max_tokens_only",
            Fault::ResponseIncomplete => "response_incomplete",
            Fault::ResponseFailed => "response_failed",
            Fault::ResponseFailedNoUsage => "response_failed_no_usage",
            Fault::Overloaded => "overloaded",
        }
    }
}

/// One request as the mock received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Request path without the query, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Raw query string, if any.
    pub query: Option<String>,
    /// Headers in arrival order, names lower-case, values lossily decoded.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON, or `Null` when it is empty or not JSON.
    pub body: Value,
    /// The body as received, byte for byte.
    pub raw_body: Bytes,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Shared, test-controllable state of a running mock.
#[derive(Debug)]
pub struct MockState {
    requests: Mutex<Vec<RecordedRequest>>,
    output_tokens: AtomicU64,
    token_delay: Mutex<Duration>,
    fault: Mutex<Option<Fault>>,
    usage_override: Mutex<(Option<u64>, Option<u64>)>,
    hold: tokio::sync::watch::Sender<bool>,
    held: AtomicUsize,
    first_byte_delay: Duration,
    expect_azure: Option<AzureExpect>,
    log_requests: bool,
    /// Responses created (stored), by id.
    stored: Arc<Mutex<std::collections::HashMap<String, Value>>>,
    /// The `input` of each stored response.
    stored_inputs: Mutex<std::collections::HashMap<String, Value>>,
    /// Responses usage details: (cached input tokens, reasoning tokens).
    responses_details: Mutex<(u64, u64)>,
    /// Responses: `web_search_call` items an answer reports when its body
    /// offers a web search tool (at most its `max_tool_calls`).
    web_search_calls: AtomicU64,
    /// Chat and completions: the context length of a vLLM-style server
    /// (0: none), [`MockState::set_context_window`].
    context_window: AtomicU64,
    /// Amazon Bedrock: region, known credentials, faults ([`bedrock`]).
    pub bedrock: bedrock::BedrockState,
    /// The Gemini API and Vertex Gemini: key, counts, faults ([`gemini`]).
    pub gemini: gemini::GeminiState,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MockState {
    /// Creates the state for `config`.
    pub fn new(config: &MockConfig) -> MockState {
        MockState {
            requests: Mutex::new(Vec::new()),
            output_tokens: AtomicU64::new(config.output_tokens),
            token_delay: Mutex::new(config.token_delay),
            fault: Mutex::new(None),
            usage_override: Mutex::new((None, None)),
            hold: tokio::sync::watch::Sender::new(false),
            held: AtomicUsize::new(0),
            first_byte_delay: config.first_byte_delay,
            expect_azure: config.expect_azure.clone(),
            log_requests: config.log_requests,
            stored: Arc::default(),
            stored_inputs: Mutex::default(),
            responses_details: Mutex::default(),
            web_search_calls: AtomicU64::new(0),
            context_window: AtomicU64::new(0),
            bedrock: bedrock::BedrockState::default(),
            gemini: gemini::GeminiState::default(),
        }
    }

    /// Responses: report `n` `web_search_call` items in an answer whose
    /// body offers a `web_search` tool (at most its `max_tool_calls`).
    pub fn set_web_search_calls(&self, n: u64) {
        self.web_search_calls.store(n, Ordering::SeqCst);
    }

    /// Responses: report `cached` input tokens (inside `input_tokens`) and
    /// `reasoning` tokens (added to `output_tokens`, spent without deltas).
    pub fn set_responses_details(&self, cached: u64, reasoning: u64) {
        *lock(&self.responses_details) = (cached, reasoning);
    }

    /// A stored response by id (as the mock would answer a GET).
    pub fn stored_response(&self, id: &str) -> Option<Value> {
        lock(&self.stored).get(id).cloned()
    }

    fn stored_handle(&self) -> Arc<Mutex<std::collections::HashMap<String, Value>>> {
        self.stored.clone()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.requests).clone()
    }

    /// Number of requests received so far.
    pub fn request_count(&self) -> usize {
        lock(&self.requests).len()
    }

    /// From now on, requests wait (after being recorded, before answering) until [`release`](Self::release).
    pub fn hold(&self) {
        self.hold.send_replace(true);
    }

    /// Lets every held and future request proceed.
    pub fn release(&self) {
        self.hold.send_replace(false);
    }

    /// Number of requests currently waiting on the hold.
    pub fn held_count(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Chat and completions answer as a vLLM server with a context of `n`
    /// tokens does (0: no context limit): 400 when the prompt plus the
    /// request's cap exceed it; without a cap, the output is at most what
    /// the prompt leaves of it.
    pub fn set_context_window(&self, n: u64) {
        self.context_window.store(n, Ordering::SeqCst);
    }

    /// Completion length when the request has no smaller cap.
    pub fn set_output_tokens(&self, n: u64) {
        self.output_tokens.store(n, Ordering::SeqCst);
    }

    /// Current completion length (see [`set_output_tokens`](Self::set_output_tokens)).
    pub fn output_tokens(&self) -> u64 {
        self.output_tokens.load(Ordering::SeqCst)
    }

    /// Sets the fault applied to every following request (`None` clears it).
    /// A `x-mock-fault` header or a `fault-<name>` model still takes precedence.
    pub fn set_fault(&self, fault: Option<Fault>) {
        *lock(&self.fault) = fault;
    }

    /// Reports these usage numbers instead of the counted ones (simulates an
    /// upstream that tokenizes differently); the generated content is unchanged.
    pub fn set_usage_override(&self, prompt_tokens: Option<u64>, completion_tokens: Option<u64>) {
        *lock(&self.usage_override) = (prompt_tokens, completion_tokens);
    }

    /// Delay before each streamed token.
    pub fn set_token_delay(&self, d: Duration) {
        *lock(&self.token_delay) = d;
    }

    fn record(&self, r: RecordedRequest) {
        if self.log_requests {
            // One JSON line per request: method, path, query and every header.
            let headers: Map<String, Value> = r
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            println!(
                "{}",
                json!({"method": r.method, "path": r.path, "query": r.query, "headers": headers})
            );
        }
        lock(&self.requests).push(r);
    }

    /// Waits while [`MockState::hold`] holds requests (the Vertex mock's
    /// answers wait here too).
    pub async fn wait_hold(&self) {
        let mut rx = self.hold.subscribe();
        if !*rx.borrow_and_update() {
            return;
        }
        struct Held<'a>(&'a AtomicUsize);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let _guard = Held(&self.held);
        // The sender lives as long as the state, so this cannot fail.
        let _ = rx.wait_for(|held| !*held).await;
    }

    fn usage(&self, prompt: u64, completion: u64) -> (u64, u64) {
        let (p, c) = *lock(&self.usage_override);
        (p.unwrap_or(prompt), c.unwrap_or(completion))
    }
}

/// A running mock upstream.
#[derive(Debug)]
pub struct MockUpstream {
    /// The bound address.
    pub addr: SocketAddr,
    /// Shared state: recorded requests, hold, faults, overrides.
    pub state: Arc<MockState>,
    server: tokio::task::AbortHandle,
}

impl MockUpstream {
    /// The OpenAI-style base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The server root, `http://127.0.0.1:PORT` (for Azure-style upstreams).
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections (connections already open finish on their own).
    pub fn shutdown(&self) {
        self.server.abort();
    }
}

/// Binds `127.0.0.1:0` and serves on the current tokio runtime.
pub async fn start(config: MockConfig) -> std::io::Result<MockUpstream> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    Ok(start_on(listener, config).await)
}

/// Serves on `listener` on the current tokio runtime.
pub async fn start_on(listener: tokio::net::TcpListener, config: MockConfig) -> MockUpstream {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let state = Arc::new(MockState::new(&config));
    let app = router(state.clone());
    let task = tokio::spawn(async move {
        // Frames leave at once (no Nagle delay), like a real provider's stream.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let _ = axum::serve(listener, app).await;
    });
    MockUpstream {
        addr,
        state,
        server: task.abort_handle(),
    }
}

/// The mock's axum router (every path goes through one dispatcher).
pub fn router(state: Arc<MockState>) -> Router {
    Router::new()
        .fallback(handle)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(counters::Counters::default()),
            counters::count,
        ))
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

// ---------------------------------------------------------------------------
// Token counting (the mock's own; independent of the budgetgate crate)
// ---------------------------------------------------------------------------

/// The encoding the mock uses for `model`: `cl100k_base` for `gpt-4*` (but not
/// `gpt-4o*` / `gpt-4.1*`) and `gpt-3.5*`, `o200k_base` otherwise.
pub fn bpe_for(model: &str) -> &'static CoreBPE {
    if is_cl100k(model) {
        tiktoken_rs::cl100k_base_singleton()
    } else {
        tiktoken_rs::o200k_base_singleton()
    }
}

/// Whether `model` uses `cl100k_base` (see [`bpe_for`]).
pub fn is_cl100k(model: &str) -> bool {
    let m = model.trim().to_ascii_lowercase();
    (m.starts_with("gpt-4") && !m.starts_with("gpt-4o") && !m.starts_with("gpt-4.1"))
        || m.starts_with("gpt-3.5")
}

/// Number of tokens of `s` (special-token text is treated as ordinary text).
pub fn count_tokens(bpe: &CoreBPE, s: &str) -> u64 {
    bpe.encode_ordinary(s).len() as u64
}

/// Prompt tokens of a chat request body, by OpenAI's published rule: 3 per
/// message, plus the tokens of each string value of the message, plus 1 per
/// `name`, plus 3 to prime the reply. Content-part arrays count their text
/// parts (image parts cost [`IMAGE_PART_TOKENS`]); `tool_calls` count the
/// tokens of their JSON; `tools`/`functions` count the tokens of their JSON.
pub fn chat_prompt_tokens(bpe: &CoreBPE, body: &Value) -> u64 {
    let mut n = 3u64;
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for msg in messages {
            n += 3;
            let Some(obj) = msg.as_object() else { continue };
            for (key, value) in obj {
                match value {
                    Value::String(s) => n += count_tokens(bpe, s),
                    Value::Array(parts) if key == "content" => {
                        for part in parts {
                            n += content_part_tokens(bpe, part);
                        }
                    }
                    Value::Array(_) | Value::Object(_)
                        if key == "tool_calls" || key == "function_call" =>
                    {
                        n += count_tokens(bpe, &value.to_string());
                    }
                    _ => {}
                }
                if key == "name" {
                    n += 1;
                }
            }
        }
    }
    for key in ["tools", "functions"] {
        if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
            n += count_tokens(bpe, &v.to_string());
        }
    }
    n
}

fn content_part_tokens(bpe: &CoreBPE, part: &Value) -> u64 {
    match part {
        Value::String(s) => count_tokens(bpe, s),
        Value::Object(o) => {
            if let Some(t) = o.get("text").and_then(Value::as_str) {
                count_tokens(bpe, t)
            } else if o.get("refusal").and_then(Value::as_str).is_some() {
                count_tokens(bpe, o["refusal"].as_str().unwrap_or(""))
            } else if o.contains_key("image_url") {
                IMAGE_PART_TOKENS
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// Prompts of a legacy completion / embeddings input: string, array of
/// strings, token array, or array of token arrays. Returns the token count of
/// each prompt, or `None` when the shape is invalid.
pub fn input_token_counts(bpe: &CoreBPE, input: &Value) -> Option<Vec<u64>> {
    match input {
        Value::String(s) => Some(vec![count_tokens(bpe, s)]),
        Value::Array(items) if items.is_empty() => None,
        Value::Array(items) if items.iter().all(Value::is_u64) => Some(vec![items.len() as u64]),
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Some(count_tokens(bpe, s)),
                Value::Array(toks) if toks.iter().all(Value::is_u64) => Some(toks.len() as u64),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// The text of `k` generated tokens: the first `k` words of the rotation.
pub fn generated_text(k: u64) -> String {
    (0..k).map(word).collect()
}

/// The `i`-th generated word.
pub fn word(i: u64) -> &'static str {
    WORDS[(i % WORDS.len() as u64) as usize]
}

// ---------------------------------------------------------------------------
// Request dispatch
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Chat,
    Completions,
    Embeddings,
    Messages,
}

enum Route {
    Op { op: Op, deployment: Option<String> },
    Models,
    NotFound,
    MethodNotAllowed,
}

fn route(method: &Method, path: &str) -> Route {
    let op_of = |rest: &str| match rest {
        "chat/completions" => Some(Op::Chat),
        "completions" => Some(Op::Completions),
        "embeddings" => Some(Op::Embeddings),
        "messages" => Some(Op::Messages),
        _ => None,
    };
    let path = path.strip_suffix('/').unwrap_or(path);
    let (op, deployment) = if let Some(rest) = path.strip_prefix("/v1/") {
        if rest == "models" {
            return if method == Method::GET {
                Route::Models
            } else {
                Route::MethodNotAllowed
            };
        }
        match op_of(rest) {
            Some(op) => (op, None),
            None => return Route::NotFound,
        }
    } else if let Some(rest) = path.strip_prefix("/openai/deployments/") {
        let Some((dep, rest)) = rest.split_once('/') else {
            return Route::NotFound;
        };
        match op_of(rest) {
            Some(op) if !dep.is_empty() => (op, Some(dep.to_string())),
            _ => return Route::NotFound,
        }
    } else {
        return Route::NotFound;
    };
    if method != Method::POST {
        return Route::MethodNotAllowed;
    }
    Route::Op { op, deployment }
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| v.to_string())
    })
}

/// Fault named by a `fault-<name>` substring of `model`.
fn fault_from_model(model: &str) -> Option<Fault> {
    let idx = model.find("fault-")?;
    let rest = &model[idx + "fault-".len()..];
    let name = rest.split_whitespace().next().unwrap_or("");
    Fault::parse(name)
}

async fn handle(
    State(st): State<Arc<MockState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    st.record(RecordedRequest {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: parsed.clone().unwrap_or(Value::Null),
        raw_body: body.clone(),
    });
    st.wait_hold().await;

    if let Some(r) = bedrock::handle(&st, &method, &uri, &headers, &body, parsed.clone()).await {
        return r;
    }

    if uri.path() == gemini::OPENAI_CHAT_PATH {
        return gemini::handle_openai(&st, "ai_studio_openai", &method, &headers, parsed).await;
    }
    if gemini::is_gemini_path(uri.path()) {
        return gemini::handle_ai_studio(&st, &method, uri.path(), uri.query(), &headers, &body)
            .await;
    }

    if responses::is_responses_path(uri.path()) {
        let fault = headers
            .get("x-mock-fault")
            .and_then(|v| v.to_str().ok())
            .and_then(Fault::parse)
            .or_else(|| {
                parsed
                    .as_ref()
                    .and_then(|b| b.get("model"))
                    .and_then(Value::as_str)
                    .and_then(fault_from_model)
            })
            .or(*lock(&st.fault));
        let sc = responses::Scenario::from_headers(&headers);
        return responses::handle(&st, &method, uri.path(), parsed, fault, sc).await;
    }

    let (op, deployment) = match route(&method, uri.path()) {
        Route::Op { op, deployment } => (op, deployment),
        Route::Models => return models_response(),
        Route::NotFound => {
            return error_response(
                StatusCode::NOT_FOUND,
                &format!("Invalid URL ({} {})", method, uri.path()),
                "invalid_request_error",
                None,
                None,
            )
        }
        Route::MethodNotAllowed => {
            return error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("Method {} not allowed for {}", method, uri.path()),
                "invalid_request_error",
                None,
                None,
            )
        }
    };

    if let (Some(_), Some(expect)) = (&deployment, &st.expect_azure) {
        let version = query_param(uri.query(), "api-version");
        if version.as_deref() != Some(expect.api_version.as_str()) {
            return error_response(
                StatusCode::BAD_REQUEST,
                &format!(
                    "Unsupported or missing api-version {:?} (expected {:?})",
                    version.unwrap_or_default(),
                    expect.api_version
                ),
                "invalid_request_error",
                Some("api-version"),
                None,
            );
        }
        let key = headers.get("api-key").and_then(|v| v.to_str().ok());
        if key != Some(expect.api_key.as_str()) {
            return error_response(
                StatusCode::UNAUTHORIZED,
                "Access denied due to invalid subscription key or wrong API endpoint.",
                "invalid_request_error",
                None,
                Some("401"),
            );
        }
    }

    let body_model = parsed
        .as_ref()
        .and_then(|b| b.get("model"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let fault = headers
        .get("x-mock-fault")
        .and_then(|v| v.to_str().ok())
        .and_then(Fault::parse)
        .or_else(|| body_model.as_deref().and_then(fault_from_model))
        .or_else(|| deployment.as_deref().and_then(fault_from_model))
        .or(*lock(&st.fault));

    if op == Op::Messages {
        if let Some(resp) = fault.and_then(messages::fault_response) {
            return resp;
        }
    }
    if let Some(resp) = fault_response(&st, fault).await {
        return resp;
    }

    let Some(body) = parsed else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
            "invalid_request_error",
            None,
            None,
        );
    };
    if !body.is_object() {
        return error_response(
            StatusCode::BAD_REQUEST,
            "The request body must be a JSON object.",
            "invalid_request_error",
            None,
            None,
        );
    }
    let model = match (deployment, body_model) {
        (Some(dep), _) => dep,
        (None, Some(m)) => m,
        (None, None) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "you must provide a model parameter",
                "invalid_request_error",
                None,
                None,
            )
        }
    };
    let req = Req {
        model,
        body,
        fault,
        thoughts: 0,
    };
    let result = match op {
        Op::Messages => Ok(messages::messages(&st, &headers, req.model, req.body).await),
        Op::Chat | Op::Completions => generate(&st, op, req).await,
        Op::Embeddings => embeddings(&st, req).await,
    };
    result.unwrap_or_else(|e| e)
}

struct Req {
    model: String,
    body: Value,
    fault: Option<Fault>,
    /// Thinking tokens the answer spends (Gemini's OpenAI-compatible
    /// endpoints; 0 elsewhere), reported as Google reports them: outside
    /// `completion_tokens`, inside `total_tokens` and as
    /// `completion_tokens_details.reasoning_tokens`.
    thoughts: u64,
}

/// A chat completion (streamed or whole) as Gemini's OpenAI-compatible
/// endpoints answer it ([`gemini::handle_openai`]): the model spends
/// `thoughts` thinking tokens inside the request's cap, which the usage
/// reports as Google does ([`Req::thoughts`]).
pub async fn gemini_chat(st: &MockState, model: String, body: Value, thoughts: u64) -> Response {
    let req = Req {
        model,
        body,
        fault: None,
        thoughts,
    };
    generate(st, Op::Chat, req).await.unwrap_or_else(|e| e)
}

async fn fault_response(st: &MockState, fault: Option<Fault>) -> Option<Response> {
    let resp = match fault? {
        Fault::RateLimited => {
            let mut r = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                "Rate limit reached for requests (mock). Please try again in 2s.",
                "requests",
                None,
                Some("rate_limit_exceeded"),
            );
            let h = r.headers_mut();
            h.insert("retry-after", HeaderValue::from_static("2"));
            h.insert("retry-after-ms", HeaderValue::from_static("2000"));
            h.insert("x-ratelimit-remaining-requests", HeaderValue::from_static("0"));
            r
        }
        Fault::ServerError => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The server had an error while processing your request. Sorry about that! (mock)",
            "server_error",
            None,
            None,
        ),
        Fault::BadRequest => error_response(
            StatusCode::BAD_REQUEST,
            "Invalid 'messages': mock bad request.",
            "invalid_request_error",
            Some("messages"),
            None,
        ),
        Fault::Unauthorized => error_response(
            StatusCode::UNAUTHORIZED,
            "Incorrect API key provided: sk-mock***. You can find your API key at https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            None,
            Some("invalid_api_key"),
        ),
        Fault::NonJson => {
            let mut r = Response::new(Body::from(
                "<html><head><title>502 Bad Gateway</title></head><body>mock upstream: not json</body></html>",
            ));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
            with_common_headers(r)
        }
        Fault::Overloaded => return messages::fault_response(Fault::Overloaded),
        Fault::SlowFirstByte => {
            tokio::time::sleep(st.first_byte_delay).await;
            return None;
        }
        Fault::DropMidStream
        | Fault::MissingUsage
        | Fault::NoDone
        | Fault::ContentFilterChunks
        | Fault::MaxTokensOnly
        | Fault::ResponseIncomplete
        | Fault::ResponseFailed
        | Fault::ResponseFailedNoUsage => return None,
    };
    Some(resp)
}

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn with_common_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    let id = format!("req_mock_{}", uuid::Uuid::new_v4().simple());
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert("x-request-id", v);
    }
    for (k, v) in [
        ("openai-organization", "mock-org"),
        ("openai-version", "2020-10-01"),
        ("openai-processing-ms", "1"),
        ("x-ratelimit-limit-requests", "10000"),
        ("x-ratelimit-limit-tokens", "1000000"),
        ("x-ratelimit-remaining-requests", "9999"),
        ("x-ratelimit-remaining-tokens", "999000"),
        ("x-ratelimit-reset-requests", "6ms"),
        ("x-ratelimit-reset-tokens", "60ms"),
        ("set-cookie", "mock=1; path=/; HttpOnly"),
    ] {
        if !h.contains_key(k) {
            h.insert(k, HeaderValue::from_static(v));
        }
    }
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    with_common_headers(r)
}

/// An OpenAI-shaped error response.
fn error_response(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "param": param, "code": code}}),
    )
}

fn bad_param(param: &str, message: &str) -> Response {
    error_response(
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        Some(param),
        None,
    )
}

/// A 200 JSON response whose body is aborted half way (content-length promises the whole).
fn dropped_json_response(v: &Value) -> Response {
    let full = Bytes::from(v.to_string());
    let half = full.slice(..full.len() / 2);
    let stream = futures_util::stream::iter([Ok::<Bytes, std::io::Error>(half)]).chain(
        futures_util::stream::once(async {
            // Give the server time to flush what was sent before aborting.
            tokio::time::sleep(ABORT_FLUSH_DELAY).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "mock: dropped mid-body",
            ))
        }),
    );
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(full.len()));
    with_common_headers(r)
}

fn models_response() -> Response {
    let data: Vec<Value> = MODEL_IDS
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 1_700_000_000u64, "owned_by": "mock"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

fn usage_json(prompt: u64, completion: Option<u64>) -> Value {
    match completion {
        Some(c) => json!({
            "prompt_tokens": prompt,
            "completion_tokens": c,
            "total_tokens": prompt.saturating_add(c),
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        }),
        None => json!({"prompt_tokens": prompt, "total_tokens": prompt}),
    }
}

fn prompt_filter_results() -> Value {
    json!([{
        "prompt_index": 0,
        "content_filter_results": {
            "hate": {"filtered": false, "severity": "safe"},
            "self_harm": {"filtered": false, "severity": "safe"},
            "sexual": {"filtered": false, "severity": "safe"},
            "violence": {"filtered": false, "severity": "safe"},
        }
    }])
}

/// Reads an optional positive integer parameter.
fn positive_param(body: &Value, key: &str) -> Result<Option<u64>, ParamError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ParamError {
                param: key.to_string(),
                message: format!("Invalid '{key}': expected an integer >= 1, got {v}."),
            }),
        },
    }
}

/// An invalid request parameter (answered as a 400).
struct ParamError {
    param: String,
    message: String,
}

impl From<ParamError> for Response {
    fn from(e: ParamError) -> Response {
        bad_param(&e.param, &e.message)
    }
}

/// Chat completions and legacy completions, streaming or not.
async fn generate(st: &MockState, op: Op, req: Req) -> Result<Response, Response> {
    let Req {
        model,
        body,
        fault,
        thoughts,
    } = req;
    let bpe = bpe_for(&model);

    // Prompt.
    let (prompt_tokens, prompts) = match op {
        Op::Chat => {
            if !body.get("messages").is_some_and(Value::is_array) {
                return Err(bad_param(
                    "messages",
                    "Missing required parameter: 'messages'.",
                ));
            }
            (chat_prompt_tokens(bpe, &body), 1u64)
        }
        _ => match body.get("prompt") {
            None | Some(Value::Null) => (0, 1),
            Some(p) => match input_token_counts(bpe, p) {
                Some(counts) => (counts.iter().sum(), counts.len() as u64),
                None => return Err(bad_param(
                    "prompt",
                    "Invalid 'prompt': expected a string, an array of strings, or token arrays.",
                )),
            },
        },
    };

    // Output length.
    let n = positive_param(&body, "n")?.unwrap_or(1);
    if n > 128 {
        return Err(bad_param(
            "n",
            "Invalid 'n': integer above maximum value (128).",
        ));
    }
    let completion_cap = match fault {
        Some(Fault::MaxTokensOnly) => None,
        _ => positive_param(&body, "max_completion_tokens")?,
    };
    let mut cap = [completion_cap, positive_param(&body, "max_tokens")?]
        .into_iter()
        .flatten()
        .min();
    let context = st.context_window.load(Ordering::SeqCst);
    if context > 0 {
        let completion = cap.unwrap_or(1);
        if prompt_tokens.saturating_add(completion) > context {
            return Err(bad_param(
                "max_tokens",
                &format!(
                    "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
                    prompt_tokens.saturating_add(completion)
                ),
            ));
        }
        cap = cap.or(Some(context - prompt_tokens));
    }
    // Thoughts come first, inside the cap; the answer has what is left.
    let thoughts = thoughts.min(cap.unwrap_or(u64::MAX));
    let cap = cap.map(|c| c - thoughts);
    let output_tokens = st.output_tokens();
    let k = cap.map_or(output_tokens, |c| c.min(output_tokens));
    let finish = if cap == Some(k) && k < output_tokens {
        "length"
    } else {
        "stop"
    };
    let choices = n.saturating_mul(prompts);
    let (p_usage, c_usage) = st.usage(prompt_tokens, choices.saturating_mul(k));
    let usage = (fault != Some(Fault::MissingUsage)).then(|| {
        let mut u = usage_json(p_usage, Some(c_usage));
        if thoughts > 0 {
            let spent = choices.saturating_mul(thoughts);
            u["total_tokens"] = json!(p_usage.saturating_add(c_usage).saturating_add(spent));
            u["completion_tokens_details"]["reasoning_tokens"] = json!(spent);
        }
        u
    });
    let token_delay = *lock(&st.token_delay);
    let created = now_secs();
    let id = match op {
        Op::Chat => format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        _ => format!("cmpl-{}", uuid::Uuid::new_v4().simple()),
    };

    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if stream {
        let include_usage = body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let plan = StreamPlan {
            op,
            id,
            created,
            model,
            choices,
            k,
            finish,
            include_usage,
            usage: usage.filter(|_| include_usage),
            token_delay,
            fault,
        };
        return Ok(stream_response(plan));
    }

    // Non-streaming: generation takes K token delays.
    if !token_delay.is_zero() && k > 0 {
        tokio::time::sleep(token_delay.saturating_mul(k.min(u32::MAX as u64) as u32)).await;
    }
    let text = generated_text(k);
    let choice_list: Vec<Value> = (0..choices)
        .map(|i| match op {
            Op::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": finish,
            }),
            _ => json!({"index": i, "text": text, "logprobs": null, "finish_reason": finish}),
        })
        .collect();
    let mut out = Map::new();
    out.insert("id".into(), json!(id));
    out.insert(
        "object".into(),
        json!(if op == Op::Chat {
            "chat.completion"
        } else {
            "text_completion"
        }),
    );
    out.insert("created".into(), json!(created));
    out.insert("model".into(), json!(model));
    out.insert("choices".into(), Value::Array(choice_list));
    if let Some(u) = usage {
        out.insert("usage".into(), u);
    }
    out.insert("system_fingerprint".into(), json!("fp_mock"));
    if fault == Some(Fault::ContentFilterChunks) {
        out.insert("prompt_filter_results".into(), prompt_filter_results());
    }
    let out = Value::Object(out);
    if fault == Some(Fault::DropMidStream) {
        return Ok(dropped_json_response(&out));
    }
    Ok(json_response(StatusCode::OK, &out))
}

struct StreamPlan {
    op: Op,
    id: String,
    created: u64,
    model: String,
    choices: u64,
    k: u64,
    finish: &'static str,
    include_usage: bool,
    usage: Option<Value>,
    token_delay: Duration,
    fault: Option<Fault>,
}

impl StreamPlan {
    fn chunk(&self, choices: Value) -> Value {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert(
            "object".into(),
            json!(if self.op == Op::Chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            }),
        );
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("system_fingerprint".into(), json!("fp_mock"));
        m.insert("choices".into(), choices);
        if self.include_usage {
            m.insert("usage".into(), Value::Null);
        }
        Value::Object(m)
    }

    fn choice(&self, index: u64, content: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        let mut c = match self.op {
            Op::Chat => {
                let delta = match (role, content) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    (false, Some(w)) => json!({"content": w}),
                    (false, None) => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            _ => {
                json!({"index": index, "text": content.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        };
        if self.fault == Some(Fault::ContentFilterChunks) && content.is_some() {
            c["content_filter_results"] = json!({
                "hate": {"filtered": false, "severity": "safe"},
                "violence": {"filtered": false, "severity": "safe"},
            });
        }
        c
    }
}

type Frame = Result<Bytes, std::io::Error>;

struct Emitter {
    tx: tokio::sync::mpsc::Sender<Frame>,
    keepalive: bool,
    sent: bool,
}

impl Emitter {
    async fn raw(&mut self, b: Bytes) -> Result<(), ()> {
        self.tx.send(Ok(b)).await.map_err(|_| ())
    }

    async fn data(&mut self, v: &Value) -> Result<(), ()> {
        if self.keepalive && self.sent {
            self.raw(Bytes::from_static(b": keep-alive\n\n")).await?;
        }
        self.sent = true;
        self.raw(Bytes::from(format!("data: {v}\n\n"))).await
    }

    async fn abort(&mut self) {
        // Give the server time to flush the frames already sent before aborting.
        tokio::time::sleep(ABORT_FLUSH_DELAY).await;
        let _ = self
            .tx
            .send(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "mock: dropped mid-stream",
            )))
            .await;
    }
}

async fn produce(plan: StreamPlan, e: &mut Emitter) -> Result<(), ()> {
    let fault = plan.fault;
    if fault == Some(Fault::ContentFilterChunks) {
        e.data(&json!({
            "choices": [], "created": 0, "id": "", "model": "", "object": "",
            "prompt_filter_results": prompt_filter_results(),
        }))
        .await?;
    }
    if plan.op == Op::Chat {
        for i in 0..plan.choices {
            e.data(&plan.chunk(json!([plan.choice(i, None, true, None)])))
                .await?;
        }
    }
    let mut content_chunks = 0u64;
    for t in 0..plan.k {
        for i in 0..plan.choices {
            if fault == Some(Fault::DropMidStream) && content_chunks == 3 {
                e.abort().await;
                return Err(());
            }
            if !plan.token_delay.is_zero() {
                tokio::time::sleep(plan.token_delay).await;
            }
            e.data(&plan.chunk(json!([plan.choice(i, Some(word(t)), false, None)])))
                .await?;
            content_chunks += 1;
        }
    }
    if fault == Some(Fault::DropMidStream) {
        e.abort().await;
        return Err(());
    }
    for i in 0..plan.choices {
        e.data(&plan.chunk(json!([plan.choice(i, None, false, Some(plan.finish))])))
            .await?;
    }
    if let Some(usage) = &plan.usage {
        let mut c = plan.chunk(json!([]));
        c["usage"] = usage.clone();
        e.data(&c).await?;
    }
    if fault != Some(Fault::NoDone) {
        e.raw(Bytes::from_static(b"data: [DONE]\n\n")).await?;
    }
    Ok(())
}

fn stream_response(plan: StreamPlan) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame>(4);
    let mut emitter = Emitter {
        tx,
        keepalive: plan.fault == Some(Fault::ContentFilterChunks),
        sent: false,
    };
    tokio::spawn(async move {
        let _ = produce(plan, &mut emitter).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_common_headers(r)
}

/// Embeddings: one deterministic vector per input.
async fn embeddings(st: &MockState, req: Req) -> Result<Response, Response> {
    let Req {
        model, body, fault, ..
    } = req;
    let bpe = bpe_for(&model);
    let Some(input) = body.get("input") else {
        return Err(bad_param("input", "Missing required parameter: 'input'."));
    };
    let Some(counts) = input_token_counts(bpe, input) else {
        return Err(bad_param(
            "input",
            "Invalid 'input': expected a string, an array of strings, or token arrays.",
        ));
    };
    let dims = match positive_param(&body, "dimensions")? {
        Some(d) if d > MAX_EMBEDDING_DIMS => {
            return Err(bad_param("dimensions", "Invalid 'dimensions': too large."))
        }
        Some(d) => d as usize,
        None => EMBEDDING_DIMS,
    };
    let base64 = match body.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(bad_param(
                "encoding_format",
                &format!("Invalid 'encoding_format': {other:?}; expected 'float' or 'base64'."),
            ))
        }
    };
    let seeds: Vec<String> = match input {
        Value::Array(items) if !items.iter().all(Value::is_u64) => {
            items.iter().map(Value::to_string).collect()
        }
        other => vec![other.to_string()],
    };
    let data: Vec<Value> = seeds
        .iter()
        .enumerate()
        .map(|(i, seed)| {
            let v = embedding_vector(seed, dims);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64_encode(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let (p, _) = st.usage(counts.iter().sum(), 0);
    let mut out = json!({"object": "list", "data": data, "model": model});
    if fault != Some(Fault::MissingUsage) {
        out["usage"] = usage_json(p, None);
    }
    if fault == Some(Fault::DropMidStream) {
        return Ok(dropped_json_response(&out));
    }
    Ok(json_response(StatusCode::OK, &out))
}

/// A deterministic unit-length vector derived from `seed`.
pub fn embedding_vector(seed: &str, dims: usize) -> Vec<f32> {
    // FNV-1a seed, then xorshift64*.
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes() {
        x ^= b as u64;
        x = x.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut v: Vec<f32> = (0..dims)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let norm = v.iter().map(|f| f * f).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|f| *f /= norm);
    }
    v
}

/// Standard base64 (RFC 4648, with padding).
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Binary entry point
// ---------------------------------------------------------------------------

/// Command line of the `mock_upstream` example binary.
#[derive(clap::Parser, Debug)]
#[command(
    name = "mock_upstream",
    about = "Simulated OpenAI-compatible upstream for budgetgate"
)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Delay before each streamed token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    token_delay_ms: u64,
    /// Completion length when the request has no smaller cap.
    #[arg(long, default_value_t = 64)]
    output_tokens: u64,
    /// Delay of the slow_first_byte fault, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    first_byte_delay_ms: u64,
    /// Fault applied to every request (snake_case name, e.g. rate_limited).
    #[arg(long, value_parser = parse_fault)]
    fault: Option<Fault>,
    /// Require this api-version on the Azure routes (needs --azure-api-key too).
    #[arg(long, requires = "azure_api_key")]
    azure_api_version: Option<String>,
    /// Require this api-key header on the Azure routes.
    #[arg(long, requires = "azure_api_version")]
    azure_api_key: Option<String>,
    /// Print every request (method, path, query, headers) as a JSON line on stdout.
    #[arg(long)]
    log_requests: bool,
}

fn parse_fault(s: &str) -> Result<Fault, String> {
    Fault::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
        format!("unknown fault {s:?}; expected one of: {}", names.join(", "))
    })
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    use clap::Parser as _;
    use std::io::Write as _;

    let cli = Cli::parse();
    let config = MockConfig {
        token_delay: Duration::from_millis(cli.token_delay_ms),
        output_tokens: cli.output_tokens,
        first_byte_delay: Duration::from_millis(cli.first_byte_delay_ms),
        expect_azure: match (cli.azure_api_version, cli.azure_api_key) {
            (Some(api_version), Some(api_key)) => Some(AzureExpect {
                api_version,
                api_key,
            }),
            _ => None,
        },
        log_requests: cli.log_requests,
    };
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    let mock = start_on(listener, config).await;
    mock.state.set_fault(cli.fault);
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "mock_upstream listening on http://{}", mock.addr)?;
        out.flush()?;
    }
    std::future::pending::<()>().await;
    Ok(())
}
