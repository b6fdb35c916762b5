//! What the OpenAI dialects share: the `usage` object (OpenAI API
//! reference: `prompt_tokens` includes `prompt_tokens_details.cached_tokens`;
//! `completion_tokens` includes `completion_tokens_details.reasoning_tokens`).

use axum::http::{header, HeaderName};
use serde_json::Value;

use super::usage::{clamp_count, UsageBreakdown};
use super::KeyHeader;

/// `Authorization: Bearer <key>`, and `api-key: <key>` as Azure clients send it.
pub static KEY_HEADERS: [KeyHeader; 2] = [
    KeyHeader::Bearer(header::AUTHORIZATION),
    KeyHeader::Plain(HeaderName::from_static("api-key")),
];

/// The request id header (OpenAI API reference, "Debugging requests").
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The breakdown of an OpenAI `usage` object given as raw JSON.
pub fn usage_from_raw(raw: &str) -> Option<UsageBreakdown> {
    if !raw.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(raw).ok()?;
    Some(usage_from_value(&v))
}

/// The breakdown of an OpenAI `usage` object. Subsets are taken out of
/// the counts they belong to, never added twice.
pub fn usage_from_value(u: &Value) -> UsageBreakdown {
    let prompt = clamp_count(u.get("prompt_tokens"), "prompt_tokens");
    let completion = clamp_count(u.get("completion_tokens"), "completion_tokens");
    let cached = clamp_count(
        u.pointer("/prompt_tokens_details/cached_tokens"),
        "cached_tokens",
    )
    .unwrap_or(0);
    let reasoning = clamp_count(
        u.pointer("/completion_tokens_details/reasoning_tokens"),
        "reasoning_tokens",
    )
    .unwrap_or(0);
    // A subset larger than its whole is the upstream's mistake: bounded by the whole.
    let cached_input = prompt.map_or(0, |p| cached.min(p));
    UsageBreakdown {
        uncached_input: prompt.map(|p| p - cached_input),
        cached_input,
        cache_writes: 0,
        output: completion,
        reasoning: completion.map_or(0, |c| reasoning.min(c)),
    }
}
