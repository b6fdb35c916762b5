//! Google's Gemini API as a dialect (`POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent`, `:countTokens`): the model and the method are
//! in the path, the body is `contents` + `generationConfig`; usage is the
//! answer's `usageMetadata`; the output cap is
//! `generationConfig.maxOutputTokens` per candidate, `candidateCount`
//! candidates; errors are Google's (`{"error":{"code","message","status","details"}}`).
//!
//! - [`error`]: Google's error body and the details Google's clients act
//!   on (`RetryInfo`, `QuotaFailure`).
//! - [`path`]: the model and method of a request path, refused when the
//!   model name could reach another resource.

pub mod error;
pub mod path;

use axum::http::{header, HeaderName};
use serde_json::Value;

use super::usage::{read_count, Rejected};
use super::{KeyHeader, UsageBreakdown};
use crate::config::estimate::Encoding;

/// What the path of a model call says beside the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// `:streamGenerateContent`.
    pub stream: bool,
    /// `alt=sse`: the stream as SSE events, else as one JSON array.
    pub sse: bool,
}

/// The route label of the model routes (final line, metrics).
pub const PATH: &str = "/v1beta/models/{model}";

/// The API key header Google's SDKs and Gemini CLI send.
pub const API_KEY: HeaderName = HeaderName::from_static("x-goog-api-key");

/// Where a Gemini client's key may be: Google's key header, or a bearer
/// token (`?key=` is moved into [`API_KEY`] by the route, so the query is
/// never read again).
pub static KEY_HEADERS: [KeyHeader; 2] = [
    KeyHeader::Plain(API_KEY),
    KeyHeader::Bearer(header::AUTHORIZATION),
];

/// The field holding the output cap: `generationConfig.maxOutputTokens`.
pub const CAP_FIELD: &str = "maxOutputTokens";

pub use crate::estimate::gemini::MAX_CANDIDATES;

/// Whether the body lets the model think in tokens that produce no
/// visible output (so a stream's reservation cannot grow with its text):
/// a `thinkingConfig` other than `thinkingBudget: 0`. (A model that
/// thinks by default is flagged `reasoning = true` by the operator.)
pub fn thinks(body: &Value) -> bool {
    let Some(tc) = body
        .get("generationConfig")
        .and_then(|g| g.get("thinkingConfig"))
        .filter(|t| t.is_object())
    else {
        return false;
    };
    match tc.get("thinkingBudget").and_then(Value::as_i64) {
        Some(0) => tc.get("thinkingLevel").is_some(),
        _ => true,
    }
}

/// The thinking a body allows beside its visible output, when it states
/// a number: a positive `thinkingBudget`. `thinkingBudget: -1` (dynamic)
/// and `thinkingLevel` state none: such a request is uncapped in its
/// thinking and bounded only by the cap (or, without one, by the model).
pub fn thinking_budget(body: &Value) -> Option<u64> {
    body.get("generationConfig")
        .and_then(|g| g.get("thinkingConfig"))
        .and_then(|t| t.get("thinkingBudget"))
        .and_then(Value::as_i64)
        .filter(|b| *b > 0)
        .map(|b| b as u64)
}

/// A built-in tool Google bills per use beside the tokens (Grounding
/// with Google Search and with Google Maps, Gemini API pricing): a
/// dollar budget cannot price it.
pub fn billed_tool(body: &Value) -> Option<&'static str> {
    const BILLED: [&str; 3] = ["googleSearch", "googleSearchRetrieval", "googleMaps"];
    body.get("tools")?
        .as_array()?
        .iter()
        .find_map(|t| BILLED.into_iter().find(|b| t.get(*b).is_some()))
}

/// The breakdown of a `usageMetadata` object: input is the sum of
/// `promptTokenCount` and `toolUsePromptTokenCount` (of which
/// `cachedContentTokenCount` was read from a cache), output the sum of
/// `candidatesTokenCount` and `thoughtsTokenCount` (the thoughts its
/// reasoning part). Google's `totalTokenCount` is the sum of the four;
/// when it reports more, the excess is output the other fields did not
/// name, charged as output (never less than what the fields add up to).
pub fn usage_from_value(u: &Value) -> UsageBreakdown {
    let mut rejected = Rejected::default();
    let mut input_rejected = None;
    let mut output_rejected = None;
    let prompt = read_count(
        u.get("promptTokenCount"),
        "promptTokenCount",
        &mut input_rejected,
    );
    let tool_use = read_count(
        u.get("toolUsePromptTokenCount"),
        "toolUsePromptTokenCount",
        &mut input_rejected,
    )
    .unwrap_or(0);
    let cached = read_count(
        u.get("cachedContentTokenCount"),
        "cachedContentTokenCount",
        &mut input_rejected,
    )
    .unwrap_or(0);
    let candidates = read_count(
        u.get("candidatesTokenCount"),
        "candidatesTokenCount",
        &mut output_rejected,
    );
    let thoughts = read_count(
        u.get("thoughtsTokenCount"),
        "thoughtsTokenCount",
        &mut output_rejected,
    )
    .unwrap_or(0);
    let total = read_count(u.get("totalTokenCount"), "totalTokenCount", &mut None);
    rejected.input = input_rejected;
    rejected.output = output_rejected;
    let input = prompt.map(|p| p.saturating_add(tool_use));
    // A stream's early chunks carry the prompt only: no output yet.
    let output = match (candidates, thoughts) {
        (None, 0) if prompt.is_some() && total.is_none_or(|t| Some(t) == input) => None,
        (c, t) => Some(c.unwrap_or(0).saturating_add(t)),
    };
    let output = match (input, output, total) {
        (Some(i), Some(o), Some(t)) if t > i.saturating_add(o) => Some(t - i),
        (_, o, _) => o,
    };
    let cached = match input {
        Some(i) => cached.min(i),
        None => 0,
    };
    UsageBreakdown {
        uncached_input: input.map(|i| i - cached),
        cached_input: cached,
        output,
        reasoning: thoughts.min(output.unwrap_or(0)),
        ..UsageBreakdown::default()
    }
    .rejecting(rejected)
}

/// The `usageMetadata` of an answer given as raw JSON.
pub fn usage_from_raw(raw: &str) -> Option<UsageBreakdown> {
    serde_json::from_str::<Value>(raw)
        .ok()
        .filter(Value::is_object)
        .map(|u| usage_from_value(&u))
}

/// Output tokens of one candidate (an answer's, or a stream chunk's):
/// its text parts (thoughts included) and function calls as their JSON.
pub fn candidate_tokens(candidate: &Value, enc: Encoding) -> u64 {
    candidate
        .get("content")
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array)
        .map_or(0, |parts| parts.iter().map(|p| part_tokens(p, enc)).sum())
}

fn part_tokens(part: &Value, enc: Encoding) -> u64 {
    if let Some(t) = part.get("text").and_then(Value::as_str) {
        return enc.count(t);
    }
    part.get("functionCall")
        .map_or(0, |call| enc.count(&call.to_string()))
}

/// Output tokens of a whole answer: every candidate, at `ratio` per mille
/// of their tiktoken count.
pub fn count_answer_output(answer: &Value, enc: Encoding, ratio: u64) -> u64 {
    let raw = answer
        .get("candidates")
        .and_then(Value::as_array)
        .map_or(0, |cs| cs.iter().map(|c| candidate_tokens(c, enc)).sum());
    crate::estimate::messages::scale(raw, ratio)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_adds_tool_use_to_input_and_thoughts_to_output_once() {
        let u = usage_from_value(&json!({
            "promptTokenCount": 100, "toolUsePromptTokenCount": 20,
            "cachedContentTokenCount": 60, "candidatesTokenCount": 7,
            "thoughtsTokenCount": 30, "totalTokenCount": 157
        }));
        assert_eq!(u.uncached_input, Some(60));
        assert_eq!(u.cached_input, 60);
        assert_eq!(u.input(), Some(120));
        assert_eq!(u.output, Some(37));
        assert_eq!(u.reasoning, 30);
    }

    #[test]
    fn a_total_above_the_fields_is_charged_as_output() {
        let u = usage_from_value(&json!({
            "promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 40
        }));
        assert_eq!(u.input(), Some(10));
        assert_eq!(u.output, Some(30));
    }

    #[test]
    fn a_chunk_with_the_prompt_only_reports_no_output() {
        let u = usage_from_value(&json!({"promptTokenCount": 10, "totalTokenCount": 10}));
        assert_eq!(u.input(), Some(10));
        assert_eq!(u.output, None);
    }

    #[test]
    fn a_count_that_is_no_count_rejects_its_side() {
        let u = usage_from_value(&json!({
            "promptTokenCount": -3, "candidatesTokenCount": 5
        }));
        assert_eq!(u.input(), None);
        assert_eq!(u.rejected_input, Some("promptTokenCount"));
        assert_eq!(u.output, Some(5));
    }

    #[test]
    fn thinking_is_read_from_the_thinking_config() {
        let b = |tc: Value| json!({"generationConfig": {"thinkingConfig": tc}});
        assert!(!thinks(&json!({})));
        assert!(!thinks(&b(json!({"thinkingBudget": 0}))));
        assert!(thinks(&b(json!({"thinkingBudget": -1}))));
        assert!(thinks(&b(json!({"thinkingLevel": "low"}))));
        assert_eq!(
            thinking_budget(&b(json!({"thinkingBudget": 512}))),
            Some(512)
        );
        assert_eq!(thinking_budget(&b(json!({"thinkingBudget": -1}))), None);
    }
}
