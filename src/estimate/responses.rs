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
//!   exactly. Image parts cost the model's [`ImageCost`] for their
//!   `detail` ([`super::image`]), file and audio parts
//!   [`EstimateSettings::audio_part_tokens`] (flat, no margin).
//! * Agent items, framed as [`super::agent`] documents, their text exact:
//!   `function_call` and `custom_tool_call` items (name + arguments or
//!   input), `function_call_output` and `custom_tool_call_output` items
//!   (their output, a string or parts as in a message, and the function's
//!   name), reasoning items passed back (the text of their summary and
//!   content parts; `encrypted_content` is opaque and not text).
//! * [`REPLY_PRIMING_TOKENS`] once.
//!
//! Everything else is *structured* and carries the structured margin
//! (`structured_margin_percent` of its count, rounded up, plus
//! `structured_margin_tokens` once per request): other items (their JSON),
//! `tools` (each tool's JSON: name, description, parameter schema), an
//! object `tool_choice`, and the `text.format` schema of structured output.

use serde_json::{Map, Value};

use super::agent::{self, Calls};
use super::input::{json_tokens, Tally};
use super::{
    describe, Encoding, EstimateError, EstimateSettings, ImageCost, REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
};

/// What every item of one body is counted with.
struct Ctx<'a> {
    enc: Encoding,
    settings: &'a EstimateSettings,
    image: ImageCost,
}

/// Prompt tokens of a Responses body (see the module docs).
pub(super) fn input(
    body: &Map<String, Value>,
    enc: Encoding,
    settings: &EstimateSettings,
    image: ImageCost,
) -> Result<u64, EstimateError> {
    let cx = Ctx {
        enc,
        settings,
        image,
    };
    let mut t = Tally::default();
    let mut calls = Calls::default();
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
                item_tokens(item, &cx, &mut t, &mut calls);
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
    calls.finish(&mut t, enc, body.get("tools"));
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
fn item_tokens(item: &Map<String, Value>, cx: &Ctx, t: &mut Tally, calls: &mut Calls) {
    let enc = cx.enc;
    let str_of = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or("");
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") if item.contains_key("role") => {
            t.exact(TOKENS_PER_MESSAGE.saturating_add(text_of(item.get("role"), enc)));
            content_tokens(item.get("content"), cx, t);
        }
        Some("function_call") => calls.call(t, enc, str_of("name"), str_of("arguments")),
        Some("custom_tool_call") => calls.call(t, enc, str_of("name"), str_of("input")),
        Some("function_call_output") | Some("custom_tool_call_output") => {
            calls.output(t);
            content_tokens(item.get("output"), cx, t);
        }
        Some("reasoning") => agent::reasoning(t, enc, item),
        Some("additional_tools") => {
            // Codex's tools ride in the input (namespace groups of function
            // tools): counted as tool definitions, structured, as `tools` is.
            calls.tools(enc, item.get("tools"));
            t.structured(json_tokens(enc, &Value::Object(item.clone())));
        }
        _ => t.structured(json_tokens(enc, &Value::Object(item.clone()))),
    }
}

/// Adds a message's `content` or an output's `output`: a string, or parts.
fn content_tokens(content: Option<&Value>, cx: &Ctx, t: &mut Tally) {
    match content {
        Some(Value::String(s)) => t.exact(cx.enc.count_cached(s)),
        Some(Value::Array(parts)) => {
            for part in parts {
                part_tokens(part, cx, t);
            }
        }
        None | Some(Value::Null) => {}
        Some(other) => t.structured(json_tokens(cx.enc, other)),
    }
}

/// Adds one content part of a message item.
fn part_tokens(part: &Value, cx: &Ctx, t: &mut Tally) {
    let enc = cx.enc;
    match part.get("type").and_then(Value::as_str) {
        Some("input_text") | Some("output_text") | Some("text") => match part.get("text") {
            Some(Value::String(s)) => t.exact(enc.count_cached(s)),
            _ => t.structured(json_tokens(enc, part)),
        },
        Some("refusal") => t.exact(text_of(part.get("refusal"), enc)),
        Some("input_image") => {
            let detail = part.get("detail").and_then(Value::as_str);
            t.flat = t.flat.saturating_add(cx.image.of(detail));
        }
        Some("input_file") | Some("input_audio") => {
            t.flat = t.flat.saturating_add(cx.settings.audio_part_tokens)
        }
        _ => t.structured(json_tokens(enc, part)),
    }
}
