//! Input tokens of an OpenAI Responses body (`POST /v1/responses`). All
//! counts are in tokens.
//!
//! # Framing (documented; `docs/API.md` repeats it)
//!
//! The Responses API renders its input into the same chat format as chat
//! completions, so the published chat rule applies to what is text:
//!
//! * `instructions` is one developer message: [`TOKENS_PER_MESSAGE`] +
//!   tokens of `"developer"` + tokens of the text.
//! * `input` as a string is one user message: [`TOKENS_PER_MESSAGE`] +
//!   tokens of `"user"` + tokens of the text.
//! * A message item (`{"role", "content"}`, with or without
//!   `"type": "message"`): [`TOKENS_PER_MESSAGE`] + tokens of its role +
//!   its content: a string, or the `text` of every `input_text` /
//!   `output_text` part and the `refusal` of `refusal` parts, each counted
//!   exactly. Image parts cost [`EstimateSettings::image_part_tokens`],
//!   file and audio parts [`EstimateSettings::audio_part_tokens`] (flat,
//!   no margin).
//! * [`REPLY_PRIMING_TOKENS`] once.
//!
//! Everything else is *structured* and carries the structured margin
//! (`structured_margin_percent` of its count, rounded up, plus
//! `structured_margin_tokens` once per request): `function_call` items
//! (name + arguments + call id + [`TOOL_CALL_OVERHEAD_TOKENS`]),
//! `function_call_output` and `custom_tool_call_output` items (call id +
//! output + [`TOOL_CALL_OVERHEAD_TOKENS`]), reasoning items passed back
//! (the text of their summary and content parts; `encrypted_content` is
//! opaque and not text), other items (their JSON), `tools` (each tool's
//! JSON: name, description, parameter schema), an object `tool_choice`,
//! and the `text.format` schema of structured output.

use serde_json::{Map, Value};

use super::input::{json_tokens, Tally};
use super::{
    describe, Encoding, EstimateError, EstimateSettings, REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE,
    TOOL_CALL_OVERHEAD_TOKENS,
};

/// Prompt tokens of a Responses body (see the module docs).
pub(super) fn input(
    body: &Map<String, Value>,
    enc: Encoding,
    settings: &EstimateSettings,
) -> Result<u64, EstimateError> {
    let mut t = Tally::default();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => message_text(&mut t, enc, "developer", s),
        Some(other) => {
            return Err(EstimateError::invalid(
                Some("instructions"),
                format!("'instructions' must be a string, got {}", describe(other)),
            ))
        }
    }
    match body.get("input") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => message_text(&mut t, enc, "user", s),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let Value::Object(item) = item else {
                    return Err(EstimateError::invalid(
                        Some("input"),
                        format!("'input[{i}]' must be an object, got {}", describe(item)),
                    ));
                };
                item_tokens(item, enc, settings, &mut t);
            }
        }
        Some(other) => {
            return Err(EstimateError::invalid(
                Some("input"),
                format!(
                    "'input' must be a string or an array of items, got {}",
                    describe(other)
                ),
            ))
        }
    }
    t.exact(REPLY_PRIMING_TOKENS);
    if let Some(Value::Array(tools)) = body.get("tools") {
        for tool in tools {
            t.structured(json_tokens(enc, tool));
        }
    }
    if let Some(v @ Value::Object(_)) = body.get("tool_choice") {
        t.structured(json_tokens(enc, v));
    }
    if let Some(format) = body
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| f.is_object())
    {
        if format.get("type").and_then(Value::as_str) == Some("json_schema") {
            t.structured(json_tokens(enc, format.get("schema").unwrap_or(format)));
        }
    }
    Ok(t.total(settings))
}

/// One message of plain text.
fn message_text(t: &mut Tally, enc: Encoding, role: &str, text: &str) {
    t.exact(
        TOKENS_PER_MESSAGE
            .saturating_add(enc.count_cached(role))
            .saturating_add(enc.count_cached(text)),
    );
}

fn text_of(v: Option<&Value>, enc: Encoding) -> u64 {
    v.and_then(Value::as_str).map_or(0, |s| enc.count_cached(s))
}

/// Adds one input item.
fn item_tokens(
    item: &Map<String, Value>,
    enc: Encoding,
    settings: &EstimateSettings,
    t: &mut Tally,
) {
    let kind = item.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") if item.contains_key("role") => {
            t.exact(TOKENS_PER_MESSAGE.saturating_add(text_of(item.get("role"), enc)));
            match item.get("content") {
                Some(Value::String(s)) => t.exact(enc.count_cached(s)),
                Some(Value::Array(parts)) => {
                    for part in parts {
                        part_tokens(part, enc, settings, t);
                    }
                }
                None | Some(Value::Null) => {}
                Some(other) => t.structured(json_tokens(enc, other)),
            }
        }
        Some("function_call") => t.structured(
            text_of(item.get("name"), enc)
                .saturating_add(text_of(item.get("arguments"), enc))
                .saturating_add(text_of(item.get("call_id"), enc))
                .saturating_add(TOOL_CALL_OVERHEAD_TOKENS),
        ),
        Some("function_call_output") | Some("custom_tool_call_output") => {
            let output = match item.get("output") {
                Some(Value::String(s)) => enc.count_cached(s),
                Some(other) => json_tokens(enc, other),
                None => 0,
            };
            t.structured(
                output
                    .saturating_add(text_of(item.get("call_id"), enc))
                    .saturating_add(TOOL_CALL_OVERHEAD_TOKENS),
            )
        }
        Some("reasoning") => {
            let mut n = 0u64;
            for key in ["summary", "content"] {
                if let Some(Value::Array(parts)) = item.get(key) {
                    for p in parts {
                        n = n.saturating_add(text_of(p.get("text"), enc));
                    }
                }
            }
            t.structured(n)
        }
        _ => t.structured(json_tokens(enc, &Value::Object(item.clone()))),
    }
}

/// Adds one content part of a message item.
fn part_tokens(part: &Value, enc: Encoding, settings: &EstimateSettings, t: &mut Tally) {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text") | Some("output_text") | Some("text") => match part.get("text") {
            Some(Value::String(s)) => t.exact(enc.count_cached(s)),
            _ => t.structured(json_tokens(enc, part)),
        },
        Some("refusal") => t.exact(text_of(part.get("refusal"), enc)),
        Some("input_image") => t.flat = t.flat.saturating_add(settings.image_part_tokens),
        Some("input_file") | Some("input_audio") => {
            t.flat = t.flat.saturating_add(settings.audio_part_tokens)
        }
        _ => t.structured(json_tokens(enc, part)),
    }
}
