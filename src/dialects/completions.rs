//! OpenAI legacy completions (OpenAI API reference, "Completions"): output
//! is each choice's `text`, capped by `max_tokens`.

use serde_json::{json, Value};

use crate::config::estimate::Encoding;

/// Path under an OpenAI-style base URL.
pub const PATH: &str = "completions";

/// `object` of stream chunks.
pub const CHUNK_OBJECT: &str = "text_completion";

/// The output-cap field sent upstream.
pub const CAP_FIELD: &str = "max_tokens";

/// Output tokens of a choice (answer or stream event alike).
pub fn count_output(choice: &Value, enc: Encoding) -> u64 {
    choice
        .get("text")
        .and_then(Value::as_str)
        .map_or(0, |s| enc.count(s))
}

/// The final choice of a stream that was cut off.
pub fn cutoff_choice(index: u64) -> Value {
    json!({"index": index, "text": "", "logprobs": null, "finish_reason": "length"})
}
