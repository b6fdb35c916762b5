//! OpenAI chat completions (OpenAI API reference, "Chat"): output is the
//! message (or delta) content, refusal, tool-call and legacy function-call
//! names and arguments; the output cap is `max_completion_tokens`
//! (`max_tokens` for upstreams that take only that).

use serde_json::{json, Value};

use super::Part;
use crate::config::estimate::Encoding;

/// Path under an OpenAI-style base URL.
pub const PATH: &str = "chat/completions";

/// `object` of stream chunks.
pub const CHUNK_OBJECT: &str = "chat.completion.chunk";

/// The output-cap field sent upstream.
pub fn cap_field(max_tokens_only: bool) -> &'static str {
    if max_tokens_only {
        "max_tokens"
    } else {
        "max_completion_tokens"
    }
}

/// Output tokens of a choice: its `message` in an answer, its `delta` in a
/// stream event.
pub fn count_output(choice: &Value, part: Part, enc: Encoding) -> u64 {
    let key = match part {
        Part::Answer => "message",
        Part::Delta => "delta",
    };
    let Some(m) = choice.get(key) else {
        return 0;
    };
    let count = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, |s| enc.count(s));
    let call = |f: Option<&Value>| {
        count(f.and_then(|f| f.get("arguments"))) + count(f.and_then(|f| f.get("name")))
    };
    let mut n = count(m.get("content")) + count(m.get("refusal"));
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        n += calls.iter().map(|c| call(c.get("function"))).sum::<u64>();
    }
    n + call(m.get("function_call"))
}

/// The final choice of a stream that was cut off.
pub fn cutoff_choice(index: u64) -> Value {
    json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": "length"})
}
