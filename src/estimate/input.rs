//! Input (prompt) token counting per endpoint. All counts are in tokens.

use serde_json::{Map, Value};

use super::agent::Calls;
use super::{
    describe, Encoding, EstimateError, EstimateSettings, ImageCost, REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE, TOKENS_PER_NAME, TOOL_CALL_OVERHEAD_TOKENS,
};

/// Running input count of one request.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Tokens counted by the published rule (exact for plain text messages).
    pub(super) exact: u64,
    /// Tokens of structured content, before the percentage margin.
    structured: u64,
    /// Flat per-part costs (images, audio, files): already conservative, no
    /// margin on top.
    pub(super) flat: u64,
    /// Whether any structured content was seen (adds the fixed margin once).
    pub(super) any_structured: bool,
}

impl Tally {
    pub(super) fn structured(&mut self, tokens: u64) {
        self.structured = self.structured.saturating_add(tokens);
        self.any_structured = true;
    }

    pub(super) fn exact(&mut self, tokens: u64) {
        self.exact = self.exact.saturating_add(tokens);
    }

    pub(super) fn total(&self, settings: &EstimateSettings) -> u64 {
        let pct = self
            .structured
            .saturating_mul(settings.structured_margin_percent)
            .div_ceil(100);
        let fixed = if self.any_structured {
            settings.structured_margin_tokens
        } else {
            0
        };
        self.exact
            .saturating_add(self.flat)
            .saturating_add(self.structured)
            .saturating_add(pct)
            .saturating_add(fixed)
    }
}

/// Tokens of a value's compact JSON serialisation.
pub(super) fn json_tokens(enc: Encoding, v: &Value) -> u64 {
    match v {
        // A bare string serialises with quotes and escapes; count it as text.
        Value::String(s) => enc.count_cached(s),
        _ => serde_json::to_string(v).map_or(0, |s| enc.count_cached(&s)),
    }
}

/// Prompt tokens of a chat completions body (`messages`, `tools`,
/// `functions`, `tool_choice`, `response_format`).
pub(super) fn chat_input(
    body: &Map<String, Value>,
    enc: Encoding,
    settings: &EstimateSettings,
    image: ImageCost,
) -> Result<u64, EstimateError> {
    let messages = match body.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(EstimateError::invalid(
                Some("messages"),
                "'messages' must be a non-empty array",
            ))
        }
        None | Some(Value::Null) => {
            return Err(EstimateError::invalid(
                Some("messages"),
                "'messages' is required",
            ))
        }
        Some(other) => {
            return Err(EstimateError::invalid(
                Some("messages"),
                format!("'messages' must be an array, got {}", describe(other)),
            ))
        }
    };

    let mut t = Tally::default();
    let mut calls = Calls::default();
    for (i, message) in messages.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err(EstimateError::invalid(
                Some("messages"),
                format!(
                    "'messages[{i}]' must be an object, got {}",
                    describe(message)
                ),
            ));
        };
        message_tokens(message, enc, settings, image, &mut t, &mut calls);
    }
    calls.finish(&mut t, enc, body.get("tools").or(body.get("functions")));
    t.exact(REPLY_PRIMING_TOKENS);

    for key in ["tools", "functions"] {
        match body.get(key) {
            None | Some(Value::Null) => {}
            Some(v) => t.structured(json_tokens(enc, v)),
        }
    }
    if let Some(v @ Value::Object(_)) = body.get("tool_choice") {
        t.structured(json_tokens(enc, v));
    }
    if let Some(Value::Object(rf)) = body.get("response_format") {
        if rf.get("type").and_then(Value::as_str) == Some("json_schema") {
            let schema = rf.get("json_schema").unwrap_or(&Value::Null);
            t.structured(json_tokens(enc, schema));
        }
    }
    Ok(t.total(settings))
}

/// Adds one chat message: the published rule for string fields, margins for
/// everything structured. Tool calls are agent turns ([`Calls`]), framed as
/// in a Responses body.
fn message_tokens(
    message: &Map<String, Value>,
    enc: Encoding,
    settings: &EstimateSettings,
    image: ImageCost,
    t: &mut Tally,
    calls: &mut Calls,
) {
    // A `tool` / `function` result is a plain message under the published
    // rule: its role and call id stand in for the output frame and name.
    t.exact(TOKENS_PER_MESSAGE);
    for (key, value) in message {
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("name", Value::String(s)) => {
                t.exact(enc.count_cached(s).saturating_add(TOKENS_PER_NAME))
            }
            // role, string content, tool_call_id, refusal, and any other
            // string field: the rule counts every string value.
            (_, Value::String(s)) => t.exact(enc.count_cached(s)),
            ("content", Value::Array(parts)) => {
                t.any_structured = true;
                for part in parts {
                    part_tokens(part, enc, settings, image, t);
                }
            }
            ("tool_calls", Value::Array(list)) => {
                for call in list {
                    tool_call(call, enc, t, calls);
                }
            }
            ("function_call", Value::Object(f)) => function_call(f, enc, t, calls),
            // Unknown non-string fields (e.g. `audio: {id}`): serialisation.
            (_, other) => t.structured(json_tokens(enc, other)),
        }
    }
}

/// One entry of `tool_calls`: a function or custom tool call, or (any
/// other shape) its JSON with the margin.
fn tool_call(call: &Value, enc: Encoding, t: &mut Tally, calls: &mut Calls) {
    match (call.get("function"), call.get("custom")) {
        (Some(Value::Object(f)), _) => function_call(f, enc, t, calls),
        (_, Some(Value::Object(c))) if c.get("input").is_none_or(Value::is_string) => {
            let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
            calls.call(t, enc, field("name"), field("input"));
        }
        _ => t.structured(json_tokens(enc, call).saturating_add(TOOL_CALL_OVERHEAD_TOKENS)),
    }
}

/// A `{name, arguments}` call; arguments that are not a string (invalid,
/// but priced) are counted by their JSON with the margin.
fn function_call(f: &Map<String, Value>, enc: Encoding, t: &mut Tally, calls: &mut Calls) {
    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
    match f.get("arguments") {
        None | Some(Value::Null) | Some(Value::String(_)) => {
            let args = f.get("arguments").and_then(Value::as_str).unwrap_or("");
            calls.call(t, enc, name, args);
        }
        Some(other) => {
            calls.call(t, enc, name, "");
            t.structured(json_tokens(enc, other));
        }
    }
}

/// Adds one content part.
fn part_tokens(
    part: &Value,
    enc: Encoding,
    settings: &EstimateSettings,
    image: ImageCost,
    t: &mut Tally,
) {
    let kind = part.get("type").and_then(Value::as_str);
    match kind {
        Some("text") | Some("refusal") => {
            let key = kind.unwrap_or("text");
            match part.get(key) {
                Some(Value::String(s)) => t.structured(enc.count_cached(s)),
                _ => t.structured(json_tokens(enc, part)),
            }
        }
        Some("image_url") | Some("image") | Some("input_image") => {
            // Chat nests `detail` in `image_url`; Responses puts it on the part.
            let detail = part
                .get("image_url")
                .and_then(|u| u.get("detail"))
                .or(part.get("detail"))
                .and_then(Value::as_str);
            t.flat = t.flat.saturating_add(image.of(detail));
        }
        Some("input_audio") | Some("audio") | Some("file") | Some("input_file") => {
            t.flat = t.flat.saturating_add(settings.audio_part_tokens);
        }
        _ => t.structured(json_tokens(enc, part)),
    }
}

/// Counts a string | array of strings | token array | array of token arrays.
/// Returns `(total tokens, number of prompts)`. `allow_empty_string`:
/// whether `""` is accepted as a prompt.
fn count_text_or_tokens(
    v: Option<&Value>,
    param: &str,
    enc: Encoding,
    allow_empty_string: bool,
) -> Result<(u64, u64), EstimateError> {
    let bad = |msg: String| EstimateError::invalid(Some(param), msg);
    let shape_msg = || {
        format!(
            "'{param}' must be a string, an array of strings, an array of token ids, \
             or an array of arrays of token ids"
        )
    };
    let token_array = |a: &[Value]| -> Result<u64, EstimateError> {
        if a.is_empty() {
            return Err(bad(format!(
                "'{param}' must not contain an empty token array"
            )));
        }
        if a.iter().all(Value::is_u64) {
            Ok(a.len() as u64)
        } else {
            Err(bad(format!(
                "'{param}' token ids must be non-negative integers"
            )))
        }
    };
    match v {
        None | Some(Value::Null) => Err(bad(format!("'{param}' is required"))),
        Some(Value::String(s)) => {
            if s.is_empty() && !allow_empty_string {
                return Err(bad(format!("'{param}' must not be an empty string")));
            }
            Ok((enc.count_cached(s), 1))
        }
        Some(Value::Array(a)) => match a.first() {
            None => Err(bad(format!("'{param}' must not be an empty array"))),
            Some(Value::String(_)) => {
                let mut tokens = 0u64;
                for item in a {
                    let Value::String(s) = item else {
                        return Err(bad(shape_msg()));
                    };
                    if s.is_empty() && !allow_empty_string {
                        return Err(bad(format!("'{param}' must not contain empty strings")));
                    }
                    tokens = tokens.saturating_add(enc.count_cached(s));
                }
                Ok((tokens, a.len() as u64))
            }
            Some(Value::Number(_)) => Ok((token_array(a)?, 1)),
            Some(Value::Array(_)) => {
                let mut tokens = 0u64;
                for item in a {
                    let Value::Array(inner) = item else {
                        return Err(bad(shape_msg()));
                    };
                    tokens = tokens.saturating_add(token_array(inner)?);
                }
                Ok((tokens, a.len() as u64))
            }
            Some(_) => Err(bad(shape_msg())),
        },
        Some(_) => Err(bad(shape_msg())),
    }
}

/// Prompt tokens of a legacy completions body and the number of prompts it
/// carries (each prompt gets its own `max(n, best_of)` completions).
pub(super) fn completions_input(
    body: &Map<String, Value>,
    enc: Encoding,
) -> Result<(u64, u64), EstimateError> {
    let (tokens, prompts) = count_text_or_tokens(body.get("prompt"), "prompt", enc, true)?;
    // `suffix` goes with every prompt of a batch.
    let suffix = match body.get("suffix") {
        Some(Value::String(s)) => enc.count_cached(s).saturating_mul(prompts),
        _ => 0,
    };
    Ok((tokens.saturating_add(suffix), prompts))
}

/// Input tokens of an embeddings body.
pub(super) fn embeddings_input(
    body: &Map<String, Value>,
    enc: Encoding,
) -> Result<u64, EstimateError> {
    let (tokens, _) = count_text_or_tokens(body.get("input"), "input", enc, false)?;
    Ok(tokens)
}
