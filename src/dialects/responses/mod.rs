//! The OpenAI Responses API (`POST /v1/responses`, OpenAI API reference,
//! "Responses"): input is `instructions`, `input` items, `tools` and the
//! `text.format` schema (framing in [`crate::estimate`]'s Responses
//! module); the output cap is `max_output_tokens` (the API refuses less
//! than [`crate::config::bounds::RESPONSES_MIN_CAP`]); usage is `input_tokens` (with the cached subset
//! `input_tokens_details.cached_tokens`) and `output_tokens` (with the
//! reasoning subset `output_tokens_details.reasoning_tokens`), in the body
//! and in the terminal stream event; streams never ask for usage.
//!
//! - [`stream`]: named stream events: output counting, terminal events,
//!   the cutoff's `response.incomplete`, the `error` event.
//! - [`refuse`]: what a body refers to that cannot be metered or isolated.
//! - [`tools`]: the tools of a body wherever they sit (`namespace` groups,
//!   `additional_tools` items), classed by who runs them.

pub mod refuse;
pub mod stream;
pub mod tools;

use serde_json::Value;

use super::usage::{read_count, Rejected, UsageBreakdown};
use crate::config::estimate::Encoding;

/// Path under an OpenAI-style base URL.
pub const PATH: &str = "responses";

/// The output-cap field sent upstream.
pub const CAP_FIELD: &str = "max_output_tokens";

/// Whether `id` has the shape of a response id the gateway handles:
/// `[A-Za-z0-9_-]{1,128}`. Anything else is never looked up.
pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The breakdown of a Responses `usage` object.
pub fn usage_from_value(u: &Value) -> UsageBreakdown {
    let mut rejected = Rejected::default();
    let input = read_count(u.get("input_tokens"), "input_tokens", &mut rejected.input);
    let output = read_count(
        u.get("output_tokens"),
        "output_tokens",
        &mut rejected.output,
    );
    let cached = read_count(
        u.pointer("/input_tokens_details/cached_tokens"),
        "cached_tokens",
        &mut rejected.input,
    )
    .unwrap_or(0);
    let reasoning = read_count(
        u.pointer("/output_tokens_details/reasoning_tokens"),
        "reasoning_tokens",
        &mut rejected.output,
    )
    .unwrap_or(0);
    let cached_input = input.map_or(0, |i| cached.min(i));
    UsageBreakdown {
        uncached_input: input.map(|i| i - cached_input),
        cached_input,
        cache_writes: 0,
        cache_writes_1h: 0,
        output,
        reasoning: output.map_or(0, |o| reasoning.min(o)),
        hosted: Default::default(),
        rejected_input: None,
        rejected_output: None,
    }
    .rejecting(rejected)
}

/// Uses of priced hosted tools an answer's `output` items report: one per
/// `web_search_call`, `file_search_call` and `image_generation_call`; one
/// session per distinct container of its `code_interpreter_call`s.
pub fn hosted_uses<'a>(items: impl IntoIterator<Item = &'a Value>) -> crate::money::HostedCalls {
    use crate::money::HostedKind;
    let mut uses = crate::money::HostedCalls::default();
    let mut containers: Vec<&str> = Vec::new();
    for item in items {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .and_then(HostedKind::of_output_item);
        match kind {
            Some(HostedKind::CodeInterpreter) => {
                let c = item
                    .get("container_id")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !containers.contains(&c) {
                    containers.push(c);
                    uses.add(HostedKind::CodeInterpreter, 1);
                }
            }
            Some(k) => uses.add(k, 1),
            None => {}
        }
    }
    uses
}

/// The breakdown of a raw `usage` member.
pub fn usage_from_raw(raw: &str) -> Option<UsageBreakdown> {
    if !raw.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(raw).ok()?;
    Some(usage_from_value(&v))
}

/// Output tokens of a whole response: the text of every output item
/// (message text and refusals, function-call names and arguments,
/// custom-tool input, reasoning summaries and text).
pub fn count_answer_output(answer: &Value, enc: Encoding) -> u64 {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, |s| enc.count(s));
    let parts = |v: Option<&Value>, key: &str| {
        v.and_then(Value::as_array)
            .map_or(0, |ps| ps.iter().map(|p| text(p.get(key))).sum::<u64>())
    };
    let Some(items) = answer.get("output").and_then(Value::as_array) else {
        return 0;
    };
    items
        .iter()
        .map(|item| match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                parts(item.get("content"), "text") + parts(item.get("content"), "refusal")
            }
            Some("function_call") => text(item.get("name")) + text(item.get("arguments")),
            Some("custom_tool_call") => text(item.get("name")) + text(item.get("input")),
            Some("reasoning") => {
                parts(item.get("summary"), "text") + parts(item.get("content"), "text")
            }
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subsets_are_never_added_twice() {
        let u = usage_from_value(&json!({
            "input_tokens": 100, "output_tokens": 40, "total_tokens": 140,
            "input_tokens_details": {"cached_tokens": 60},
            "output_tokens_details": {"reasoning_tokens": 30}
        }));
        assert_eq!(u.uncached_input, Some(40));
        assert_eq!(u.cached_input, 60);
        assert_eq!(u.input(), Some(100));
        assert_eq!(u.reasoning, 30);
        assert_eq!(u.total(), 140);
    }

    #[test]
    fn ids() {
        assert!(valid_id("resp_0123abcDEF-_"));
        assert!(!valid_id(""));
        assert!(!valid_id("resp/../x"));
        assert!(!valid_id(&"a".repeat(129)));
        assert!(valid_id(&"a".repeat(128)));
    }

    #[test]
    fn whole_output_counts_every_item_kind() {
        let enc = Encoding::O200kBase;
        let a = json!({"output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": " the"}]},
            {"type": "message", "content": [{"type": "output_text", "text": " of and"}]},
            {"type": "function_call", "name": "f", "arguments": "{}"}
        ]});
        assert_eq!(
            count_answer_output(&a, enc),
            1 + 2 + enc.count("f") + enc.count("{}")
        );
    }
}
