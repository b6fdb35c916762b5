//! Token-cost estimation of OpenAI-compatible request bodies (DESIGN §1.4, §4).
//!
//! [`estimate`] turns a parsed request body into an [`Estimate`]: the prompt
//! (input) tokens counted with the model's tiktoken [`Encoding`], plus the
//! output tokens the gateway reserves (`choices × output cap per choice`).
//! Every figure is in **tokens**.
//!
//! # Input
//!
//! * **Chat completions** follow OpenAI's published counting rule for plain
//!   and named text messages (OpenAI Cookbook, "How to count tokens with
//!   tiktoken", `num_tokens_from_messages`,
//!   <https://cookbook.openai.com/examples/how_to_count_tokens_with_tiktoken>):
//!   [`TOKENS_PER_MESSAGE`] (3) per message, the token count of every string
//!   field value (`role`, `content`, `name`, and any other string such as
//!   `tool_call_id` or `refusal`), [`TOKENS_PER_NAME`] (1) more per `name`,
//!   and [`REPLY_PRIMING_TOKENS`] (3) once to prime the reply. For such
//!   messages the estimate *equals* the rule.
//! * **Structured content** has no published exact rule: content-part text,
//!   `tools` / `functions` definitions (counted as their JSON serialisation),
//!   assistant `tool_calls` / `function_call` (name + arguments +
//!   [`TOOL_CALL_OVERHEAD_TOKENS`] per call), `tool_choice` objects,
//!   `response_format` JSON schemas, unknown content parts and unknown
//!   non-string message fields (JSON serialisation). Their token count `s` is
//!   charged as `s + ceil(s × structured_margin_percent / 100)`, and
//!   `structured_margin_tokens` is added once per request when any
//!   structured content is present. JSON serialisation over-counts the
//!   TypeScript-like form OpenAI renders tools into, so together with the
//!   margin this errs on the high side.
//! * **Image parts** cost the model's [`ImageCost`] for their `detail`
//!   (OpenAI's published rule per model family, see [`image`]; unknown
//!   models [`EstimateSettings::image_part_tokens`]); **audio and file
//!   parts** a flat [`EstimateSettings::audio_part_tokens`].
//! * **Tool calls and their results** are counted as [`agent`] documents:
//!   name and arguments exactly, framing estimated, no margin.
//! * **Legacy completions** count every prompt (`prompt` may be a string, an
//!   array of strings, a token array or an array of token arrays; token
//!   arrays count their length) plus `suffix`.
//! * **Embeddings** count `input` the same way and reserve no output.
//! * **Responses** bodies: `instructions`, `input` (string or items),
//!   `tools`, `tool_choice` and the `text.format` schema, framed as
//!   documented in [`responses`] (one choice, capped by `max_output_tokens`).
//! * **Anthropic Messages** bodies: [`messages`] (text at the model's
//!   `token_ratio`, images by size, PDFs by page).
//!
//! Which of these a body is comes as a [`BodyShape`]: the estimator knows
//! the shapes of bodies, not the API surfaces (`dialects` maps each
//! [`Dialect`](crate::dialects::Dialect) to its shape).
//!
//! Strings are counted with `encode_ordinary`, so client text such as
//! `<|endoftext|>` counts as ordinary text and can never be interpreted as a
//! special token.
//!
//! # Output
//!
//! See [`estimate`]: the client's cap (the larger of `max_tokens` /
//! `max_completion_tokens`) when given, otherwise the model's default output
//! cap, lowered to fit the tightest token bucket capacity but never below
//! `min_output_tokens`.

mod agent;
pub mod cache;
pub mod gemini;
mod image;
mod input;
pub mod messages;
pub mod pool;
mod responses;
mod room;
#[cfg(test)]
mod tests;

use crate::config::estimate::{Encoding, EstimateSettings, ImageCost};
pub use agent::{
    FUNCTION_CALL_FRAMING_TOKENS, FUNCTION_OUTPUT_FRAMING_TOKENS, REASONING_FRAMING_TOKENS,
    UNKNOWN_NAME_TOKENS,
};
use room::default_output;
pub use room::{fit_output, TokenRoom};
use serde_json::{Map, Value};

/// Tokens of framing per chat message (OpenAI Cookbook,
/// `num_tokens_from_messages`: `tokens_per_message = 3`).
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// Extra tokens per message that carries a `name` field (OpenAI Cookbook,
/// `num_tokens_from_messages`: `tokens_per_name = 1`).
pub const TOKENS_PER_NAME: u64 = 1;
/// Tokens added once per chat request to prime the assistant's reply
/// (OpenAI Cookbook, `num_tokens_from_messages`: "every reply is primed with
/// `<|start|>assistant<|message|>`", 3 tokens).
pub const REPLY_PRIMING_TOKENS: u64 = 3;
/// Framing tokens charged per assistant tool call / legacy `function_call`,
/// on top of the function name and arguments (no published rule; before the
/// structured margin).
pub const TOOL_CALL_OVERHEAD_TOKENS: u64 = 8;
/// Largest accepted `n` (choices per request), as OpenAI's API enforces.
pub const MAX_N: u64 = 128;

impl Encoding {
    /// Number of tokens in `text` under this encoding, counting every byte as
    /// ordinary text (`encode_ordinary`: special-token text such as
    /// `<|endoftext|>` is not special).
    /// Loads this encoding's tables now (40–160 ms) instead of on the first request.
    pub fn warm_up(self) {
        let _ = self.count("warm up");
    }

    pub fn count(self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        self.bpe().encode_ordinary(text).len() as u64
    }

    /// [`count`](Self::count) through the process-wide bounded cache of
    /// token counts keyed by content hash ([`cache`]): a string seen
    /// before (a system prompt, a tool schema) costs a hash, not a
    /// tokenisation. Same result as `count`.
    pub fn count_cached(self, text: &str) -> u64 {
        if cache::bypassed() {
            return self.count(text);
        }
        cache::GLOBAL.count(self, text)
    }

    fn bpe(self) -> &'static tiktoken_rs::CoreBPE {
        match self {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }
}

/// Forces both encoders to load so the first request does not pay for it
/// (building one takes 40–160 ms). Call once at start-up; idempotent.
pub fn warm_up() {
    for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
        enc.warm_up();
    }
}

/// Request bodies larger than this (in bytes) are estimated off the async
/// I/O threads ([`off_io_threads`]): counting an uncached 32 KB prompt takes
/// about 1.5 ms of CPU.
pub const OFF_IO_THREAD_BYTES: usize = 32 * 1024;

/// Runs `f` (parsing and estimating a body of `body_len` bytes) so that a
/// large body does not stall the other requests of the serving thread it
/// arrived on, nor take CPU from them: above [`OFF_IO_THREAD_BYTES`],
/// inside a tokio runtime, on the low-priority estimation threads
/// ([`pool`]); the serving thread goes on with its other connections
/// meanwhile. Small bodies, and callers outside a runtime, run `f` inline.
/// `None` when no estimation thread could run it (or it panicked).
pub async fn off_io_threads<R, F>(body_len: usize, f: F) -> Option<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if body_len > OFF_IO_THREAD_BYTES && tokio::runtime::Handle::try_current().is_ok() {
        return pool::run(f).await;
    }
    Some(f())
}

/// What the caller knows about the model (from config). All figures in
/// tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEstimation {
    /// The model's tiktoken encoding.
    pub encoding: Encoding,
    /// Output tokens reserved per choice when the client gives no cap.
    pub default_max_output_tokens: u64,
    /// The model's configured output limit in tokens (≥ the default); a
    /// client cap above it is rejected. `None`: no limit is checked.
    pub max_output_tokens: Option<u64>,
    /// The floor, in tokens per choice, below which a lowered default makes
    /// the request impossible (default 16).
    pub min_output_tokens: u64,
    /// Anthropic Messages only: the model's tokens per 1000 tiktoken
    /// tokens of text (its tokenizer is not public); 1000 elsewhere.
    pub token_ratio: u64,
    /// What an image part costs on this model, by `detail`.
    pub image: ImageCost,
}

/// Cost breakdown of one request, in tokens.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Estimate {
    /// Estimated prompt tokens, framing and margins included.
    pub input_tokens: u64,
    /// Of `input_tokens`, the cacheable prefix: input up to and including
    /// the last `cache_control` breakpoint (Anthropic bodies; 0 elsewhere
    /// and where the body has none).
    pub cacheable_prefix_tokens: u64,
    /// The reserved output cap per choice, in tokens (0 for embeddings).
    pub output_tokens_per_choice: u64,
    /// Number of choices the output cap applies to: `n` (chat);
    /// `prompts × max(n, best_of)` (legacy completions, which generate that
    /// many completions per prompt); 0 for embeddings.
    pub choices: u64,
    /// `choices × output_tokens_per_choice`, in tokens.
    pub output_tokens: u64,
    /// `input_tokens + output_tokens`: the cost to reserve.
    pub total_tokens: u64,
    /// The client's own output cap per choice in tokens (the larger of
    /// `max_tokens` / `max_completion_tokens`), when it gave one.
    pub client_max_output: Option<u64>,
    /// True when the model's default output cap was lowered to fit the
    /// tightest token capacity.
    pub lowered_default: bool,
}

/// Why a request could not be estimated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EstimateError {
    /// The body is invalid: maps to HTTP 400 `invalid_request_error` with
    /// `param`.
    #[error("{message}")]
    Invalid {
        /// The offending request parameter (OpenAI's `param`), if one.
        param: Option<String>,
        /// Human-readable message for the client.
        message: String,
    },
    /// No output cap fits: even `min_output_tokens` per choice would not fit
    /// the tightest token capacity (tokens).
    #[error(
        "request needs at least {needed} tokens (prompt plus the minimum output per choice), \
         more than the {capacity}-token capacity of the tightest token budget"
    )]
    Impossible {
        /// Prompt tokens plus `choices × min_output_tokens`.
        needed: u64,
        /// The tightest token capacity it was compared with.
        capacity: u64,
    },
}

impl EstimateError {
    fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        EstimateError::Invalid {
            param: param.map(str::to_owned),
            message: message.into(),
        }
    }
}

/// The shape of a request body, as the estimator reads it: where the
/// input is, which fields cap the output and how many choices it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyShape {
    /// `messages`, capped by `max_tokens` / `max_completion_tokens`, `n` choices.
    ChatCompletions,
    /// `prompt` (one or several), capped by `max_tokens`, `n` × `best_of`.
    Completions,
    /// `input`, no output.
    Embeddings,
    /// `instructions` and `input`, capped by `max_output_tokens`, one choice.
    Responses,
    /// Anthropic's `system` and `messages`, `max_tokens` required.
    Messages,
    /// Gemini `generateContent` ([`gemini`]).
    Gemini,
}

/// Estimates the token cost of one request body.
///
/// Validates what affects cost (the input field's shape, `max_tokens`,
/// `max_completion_tokens`, `n`, `best_of`), counts the input (see the
/// module docs), and picks the output cap per choice:
///
/// * **Client cap** (the larger of `max_tokens` / `max_completion_tokens`
///   for chat, `max_tokens` for completions): used as is, never lowered; a
///   cap above a configured `model.max_output_tokens` is
///   [`Invalid`](EstimateError::Invalid).
/// * **No client cap**: `model.default_max_output_tokens`, lowered to fit
///   `room` ([`TokenRoom`]: `input + choices × default` within the
///   tightest input + output capacity, `choices × default` within the
///   tightest output-only one) as `floor(room / choices)`
///   (`lowered_default = true`), never below `model.min_output_tokens`;
///   if even that does not fit, [`Impossible`](EstimateError::Impossible).
/// * **Embeddings** reserve no output (`choices = 0`).
///
/// Arithmetic saturates; it never panics on any input.
pub fn estimate(
    endpoint: impl Into<BodyShape>,
    body: &Value,
    model: &ModelEstimation,
    settings: &EstimateSettings,
    room: TokenRoom,
) -> Result<Estimate, EstimateError> {
    let Value::Object(body) = body else {
        return Err(EstimateError::invalid(
            None,
            "the request body must be a JSON object",
        ));
    };
    let endpoint: BodyShape = endpoint.into();
    if endpoint == BodyShape::Gemini {
        return gemini::estimate(body, model, room);
    }
    let enc = model.encoding;
    let mut cacheable_prefix = 0;
    let (input_tokens, prompts) = match endpoint {
        BodyShape::ChatCompletions => (input::chat_input(body, enc, settings, model.image)?, 1),
        BodyShape::Completions => input::completions_input(body, enc)?,
        BodyShape::Responses => (responses::input(body, enc, settings, model.image)?, 1),
        BodyShape::Messages => {
            if matches!(body.get("max_tokens"), None | Some(Value::Null)) {
                return Err(EstimateError::invalid(
                    Some("max_tokens"),
                    "max_tokens: Field required",
                ));
            }
            let counted = messages::input(body, enc, model.token_ratio)?;
            cacheable_prefix = counted.cacheable_prefix;
            (counted.tokens, 1)
        }
        BodyShape::Gemini => (gemini::input_tokens(body, enc, model.token_ratio)?, 1),
        BodyShape::Embeddings => {
            let tokens = input::embeddings_input(body, enc)?;
            return Ok(Estimate {
                input_tokens: tokens,
                cacheable_prefix_tokens: 0,
                output_tokens_per_choice: 0,
                choices: 0,
                output_tokens: 0,
                total_tokens: tokens,
                client_max_output: None,
                lowered_default: false,
            });
        }
    };

    // Output parameters.
    let n = positive_int(body, "n")?.unwrap_or(1);
    if n > MAX_N {
        return Err(EstimateError::invalid(
            Some("n"),
            format!("'n' must be at most {MAX_N}, got {n}"),
        ));
    }
    let (choices, caps): (u64, &[&str]) = match endpoint {
        BodyShape::ChatCompletions => (n, &["max_tokens", "max_completion_tokens"]),
        BodyShape::Responses => (1, &["max_output_tokens"]),
        BodyShape::Messages => (1, &["max_tokens"]),
        _ => {
            let best_of = positive_int(body, "best_of")?.unwrap_or(1);
            (prompts.saturating_mul(n.max(best_of)), &["max_tokens"])
        }
    };
    let mut client_max_output: Option<u64> = None;
    for &param in caps {
        if let Some(cap) = positive_int(body, param)? {
            if let Some(max) = model.max_output_tokens.filter(|&max| cap > max) {
                return Err(EstimateError::invalid(
                    Some(param),
                    format!(
                        "'{param}' is {cap}, but this model supports at most {max} output tokens"
                    ),
                ));
            }
            client_max_output = Some(client_max_output.map_or(cap, |c| c.max(cap)));
        }
    }

    let (per_choice, lowered_default) = match client_max_output {
        Some(cap) => (cap, false),
        None => default_output(input_tokens, choices, model, room)?,
    };
    let output_tokens = choices.saturating_mul(per_choice);
    Ok(Estimate {
        input_tokens,
        cacheable_prefix_tokens: cacheable_prefix,
        output_tokens_per_choice: per_choice,
        choices,
        output_tokens,
        total_tokens: input_tokens.saturating_add(output_tokens),
        client_max_output,
        lowered_default,
    })
}

/// Reads an optional integer parameter that must be ≥ 1 (absent and `null`
/// mean "not given").
fn positive_int(body: &Map<String, Value>, param: &str) -> Result<Option<u64>, EstimateError> {
    match body.get(param) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(x) if x >= 1 => Ok(Some(x)),
            _ => Err(EstimateError::invalid(
                Some(param),
                format!("'{param}' must be an integer >= 1, got {}", describe(v)),
            )),
        },
    }
}

/// A short description of a JSON value for error messages (never echoes a
/// long client string).
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(_) => "a string".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}
