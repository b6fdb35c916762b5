//! API dialects (DESIGN section 11): everything that differs between the
//! API surfaces the gateway serves, behind one type, so that the
//! lifecycle, the stores and the stream relay stay dialect-free.
//!
//! A dialect says how a body is estimated, which field caps the output
//! upstream and whether usage must be asked for on streams, where usage is
//! (answer body, stream events) as one [`UsageBreakdown`], how the output
//! of a choice is counted (one implementation for message bodies and
//! stream deltas), what a clean cutoff looks like, which headers carry the
//! client's key and name the request, and the error body. (The three
//! OpenAI dialects share the `x-ratelimit-*` header family of
//! [`rate_limit_headers`] and keep the end user in `user`; chat,
//! completions and embeddings have no provider-side objects a body refers
//! to; [`responses`] names them ([`responses::refuse`]) and streams named
//! events ([`responses::stream`]).)
//!
//! - [`chat`], [`completions`], [`embeddings`], [`responses`],
//!   [`anthropic`] (Messages), [`gemini`] (Gemini's `generateContent`):
//!   one module per dialect.
//! - [`openai`]: what the OpenAI dialects share (usage object, chunks).
//! - [`usage`]: the usage breakdown and its clamping of bad fields.
//! - [`error`]: the error body, for HTTP, admin and SSE errors.
//! - [`rate_limit_headers`]: `x-ratelimit-*` and the IETF `RateLimit`
//!   fields (Anthropic's family is [`anthropic::headers`]).
//! - [`chat_stream`], [`stream_fields`], [`json_scan`]: the few fields
//!   the relay reads of each stream event, without a tree.
//!
//! [`Dialect`] is an enum with one module per variant, not a trait object:
//! the set of dialects is closed (every one is written here), the request
//! path calls a dialect several times per request and per stream frame,
//! and an enum `match` is static dispatch that inlines, with no vtable
//! call or boxed state per request. Adding a dialect is a new variant and
//! a new module; the compiler lists every `match` to extend.

pub mod anthropic;
pub mod chat;
pub mod chat_stream;
pub mod completions;
pub mod embeddings;
pub mod error;
pub mod gemini;
pub mod json_scan;
pub mod openai;
pub mod rate_limit_headers;
pub mod responses;
pub mod stream_fields;
pub mod usage;

use axum::http::HeaderName;
use serde_json::Value;

pub use usage::UsageBreakdown;

use crate::config::estimate::{Encoding, EstimateSettings};
use crate::estimate::{self, Estimate, EstimateError, ModelEstimation};

/// An API surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI chat completions: `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI legacy completions: `POST /v1/completions`.
    Completions,
    /// OpenAI embeddings: `POST /v1/embeddings`.
    Embeddings,
    /// OpenAI Responses: `POST /v1/responses`.
    Responses,
    /// Anthropic Messages: `POST /v1/messages`.
    Messages,
    /// Gemini: `POST /v1beta/models/{model}:generateContent` (and
    /// `:streamGenerateContent`).
    Gemini,
}

impl From<Dialect> for estimate::BodyShape {
    fn from(d: Dialect) -> Self {
        match d {
            Dialect::ChatCompletions => Self::ChatCompletions,
            Dialect::Completions => Self::Completions,
            Dialect::Embeddings => Self::Embeddings,
            Dialect::Responses => Self::Responses,
            Dialect::Messages => Self::Messages,
            Dialect::Gemini => Self::Gemini,
        }
    }
}

/// A request header that may carry the client's key.
#[derive(Debug, Clone)]
pub enum KeyHeader {
    /// `<name>: Bearer <key>` (scheme case-insensitive, RFC 9110 section 11.6.2).
    Bearer(HeaderName),
    /// `<name>: <key>`.
    Plain(HeaderName),
}

/// Which part of a choice carries its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// A whole answer's choice.
    Answer,
    /// A stream event's choice (deltas).
    Delta,
}

impl Dialect {
    /// Path of the endpoint under an OpenAI-style base URL.
    pub fn path(self) -> &'static str {
        match self {
            Dialect::ChatCompletions => chat::PATH,
            Dialect::Completions => completions::PATH,
            Dialect::Embeddings => embeddings::PATH,
            Dialect::Responses => responses::PATH,
            Dialect::Messages => anthropic::PATH,
            Dialect::Gemini => gemini::PATH,
        }
    }

    /// The request headers that may carry the client's key.
    pub fn key_headers(self) -> &'static [KeyHeader] {
        match self {
            Dialect::Messages => &anthropic::KEY_HEADERS,
            Dialect::Gemini => &gemini::KEY_HEADERS,
            _ => &openai::KEY_HEADERS,
        }
    }

    /// The header naming the request (the client's id in, the gateway's out).
    pub fn request_id_header(self) -> HeaderName {
        match self {
            Dialect::Messages => anthropic::REQUEST_ID,
            _ => openai::REQUEST_ID,
        }
    }

    /// True for Anthropic's Messages API (models whose deployments are
    /// `anthropic` answer only there).
    pub fn is_anthropic(self) -> bool {
        matches!(self, Dialect::Messages)
    }

    /// True for Gemini's `generateContent` (models whose deployments speak
    /// Gemini answer there, and on chat completions where the upstream
    /// has an OpenAI-compatible endpoint).
    pub fn is_gemini(self) -> bool {
        matches!(self, Dialect::Gemini)
    }

    /// The body fields that name the request's end user, in the order they
    /// are read (each a path of object members): OpenAI's
    /// `safety_identifier`, then its older `user`; Anthropic's
    /// `metadata.user_id`.
    pub fn end_user_fields(self) -> &'static [&'static [&'static str]] {
        match self {
            Dialect::Messages => &[&["metadata", "user_id"]],
            // Gemini's body names no end user; the end-user header does.
            Dialect::Gemini => &[],
            _ => &[&["safety_identifier"], &["user"]],
        }
    }

    /// The rate-limit headers describing `states` (right after this
    /// request's debit) at `now_micros`: OpenAI's `x-ratelimit-*` or
    /// Anthropic's `anthropic-ratelimit-*`, with the IETF fields.
    pub fn rate_limit_headers(
        self,
        states: &[crate::budget::BudgetState],
        now_micros: u64,
    ) -> axum::http::HeaderMap {
        match self {
            Dialect::Messages => anthropic::headers::rate_limit_headers(states, now_micros),
            _ => rate_limit_headers::rate_limit_headers(states),
        }
    }

    /// Whether a body may ask for `stream: true`.
    pub fn streams(self) -> bool {
        !matches!(self, Dialect::Embeddings)
    }

    /// Estimates a parsed body: input tokens and the output reservation.
    pub fn estimate(
        self,
        body: &Value,
        model: &ModelEstimation,
        settings: &EstimateSettings,
        room: estimate::TokenRoom,
    ) -> Result<Estimate, EstimateError> {
        estimate::estimate(self, body, model, settings, room)
    }

    /// The field that caps the output upstream (`None`: the dialect
    /// produces no output), given whether the upstream takes only `max_tokens`.
    pub fn cap_field(self, max_tokens_only: bool) -> Option<&'static str> {
        match self {
            Dialect::ChatCompletions => Some(chat::cap_field(max_tokens_only)),
            Dialect::Completions => Some(completions::CAP_FIELD),
            Dialect::Responses => Some(responses::CAP_FIELD),
            Dialect::Messages => Some(anthropic::CAP_FIELD),
            Dialect::Gemini => Some(gemini::CAP_FIELD),
            Dialect::Embeddings => None,
        }
    }

    /// The lowest output cap the API accepts.
    pub fn min_cap(self) -> u64 {
        match self {
            Dialect::Responses => crate::config::bounds::RESPONSES_MIN_CAP,
            _ => 1,
        }
    }

    /// Whether streams must ask for usage upstream
    /// (`stream_options.include_usage`). The Responses API reports usage
    /// in its terminal event and rejects chat's option.
    pub fn asks_stream_usage(self) -> bool {
        matches!(self, Dialect::ChatCompletions | Dialect::Completions)
    }

    /// Usage of a whole answer, from its raw `usage` member.
    pub fn usage_from_answer(self, raw_usage: &str) -> Option<UsageBreakdown> {
        match self {
            Dialect::Embeddings => embeddings::usage(raw_usage),
            Dialect::Responses => responses::usage_from_raw(raw_usage),
            Dialect::Messages => serde_json::from_str::<Value>(raw_usage)
                .ok()
                .filter(Value::is_object)
                .map(|u| anthropic::usage_from_value(&u)),
            Dialect::Gemini => gemini::usage_from_raw(raw_usage),
            _ => openai::usage_from_raw(raw_usage),
        }
    }

    /// Output tokens of one choice of an answer or of a stream event.
    pub fn count_output(self, choice: &Value, part: Part, enc: Encoding) -> u64 {
        match self {
            Dialect::ChatCompletions => chat::count_output(choice, part, enc),
            Dialect::Completions => completions::count_output(choice, enc),
            Dialect::Messages => anthropic::block_tokens(choice, enc),
            Dialect::Gemini => gemini::candidate_tokens(choice, enc),
            Dialect::Embeddings | Dialect::Responses => 0,
        }
    }

    /// Output tokens of a whole answer (every choice; every output item;
    /// every content block of a Message, at the model's `token_ratio` per mille).
    pub fn count_answer_output(self, answer: &Value, enc: Encoding, token_ratio: u64) -> u64 {
        if self == Dialect::Messages {
            return anthropic::count_answer_output(answer, enc, token_ratio);
        }
        if self == Dialect::Responses {
            return responses::count_answer_output(answer, enc);
        }
        if self == Dialect::Gemini {
            return gemini::count_answer_output(answer, enc, token_ratio);
        }
        answer
            .get("choices")
            .and_then(Value::as_array)
            .map_or(0, |cs| {
                cs.iter()
                    .map(|c| self.count_output(c, Part::Answer, enc))
                    .sum()
            })
    }

    /// The `object` of this dialect's stream chunks.
    pub fn chunk_object(self) -> &'static str {
        match self {
            Dialect::Completions => completions::CHUNK_OBJECT,
            _ => chat::CHUNK_OBJECT,
        }
    }

    /// The choice that ends choice `index` of a stream that was cut off.
    pub fn cutoff_choice(self, index: u64) -> Value {
        match self {
            Dialect::Completions => completions::cutoff_choice(index),
            _ => chat::cutoff_choice(index),
        }
    }
}
