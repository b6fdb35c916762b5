//! Input estimation of a Gemini `generateContent` body, and its output
//! reservation. Gemini's tokenizer (a SentencePiece model) is not shipped
//! with the gateway (docs/GEMINI.md, "Input estimate", says why), so text
//! is counted with the model's tiktoken encoding and scaled by the
//! model's `token_ratio` (per mille, rounded up once per request; a
//! Gemini model's default is [`crate::config::gemini::DEFAULT_TOKEN_RATIO`]).
//! An underestimate settles as debt at the reported `usageMetadata`.
//!
//! What is counted (text before the ratio):
//! - `systemInstruction` and every `contents` entry: its text parts,
//!   [`TOKENS_PER_CONTENT`] of framing each; `functionCall`,
//!   `functionResponse`, `executableCode` and `codeExecutionResult` parts
//!   as their JSON; `thoughtSignature`s are opaque and cost nothing;
//! - `tools` (function declarations, built-in tools) as their JSON;
//! - media parts, not scaled, by Google's published rules ("Understand
//!   and count tokens", <https://ai.google.dev/gemini-api/docs/tokens>):
//!   an image with both sides at most 384 px is 258 tokens, a larger one
//!   258 per 768×768 tile; audio 32 tokens per second; video 263 per
//!   second; a PDF 258 per page ("Document understanding",
//!   <https://ai.google.dev/gemini-api/docs/document-processing>). The
//!   size of a base64 PNG or GIF is read from its header, the pages of a
//!   base64 PDF from its page objects; the length of inline audio and
//!   video is bounded from its bytes at a low bit rate
//!   ([`AUDIO_BYTES_PER_SECOND`], [`VIDEO_BYTES_PER_SECOND`]); what cannot
//!   be read (JPEG or WebP, file URIs) costs a flat allowance per part.
//!   Inline `text/*` data is counted as text.

use serde_json::{Map, Value};

use super::messages::{decode_base64, image_size, pdf_pages, scale};
use super::room::default_output;
use super::{describe, Encoding, Estimate, EstimateError, ModelEstimation, TokenRoom};

/// The most candidates one request may ask for (Gemini API reference,
/// `GenerationConfig.candidateCount`: 1 to 8).
pub const MAX_CANDIDATES: u64 = 8;
/// Framing of one content entry (role and turn markers; not published).
pub const TOKENS_PER_CONTENT: u64 = 5;
/// An image with both sides at most 384 px, and each 768×768 tile of a
/// larger one.
pub const IMAGE_TILE_TOKENS: u64 = 258;
/// An image whose size the gateway cannot read: Gemini 3's
/// `media_resolution_high` per image (1120), the largest default.
pub const IMAGE_UNKNOWN_TOKENS: u64 = 1_120;
/// Audio tokens per second.
pub const AUDIO_TOKENS_PER_SECOND: u64 = 32;
/// Video tokens per second (frames at 1 fps and the audio track).
pub const VIDEO_TOKENS_PER_SECOND: u64 = 263;
/// Inline audio is at least this many bytes per second (8 kbit/s, below
/// any speech codec Gemini accepts): its length is at most bytes / this.
pub const AUDIO_BYTES_PER_SECOND: u64 = 1_000;
/// Inline video is at least this many bytes per second (100 kbit/s).
pub const VIDEO_BYTES_PER_SECOND: u64 = 12_500;
/// A PDF page.
pub const PDF_PAGE_TOKENS: u64 = 258;
/// Pages charged for a PDF the gateway cannot read (a file URI, object
/// streams that hide its pages).
pub const PDF_UNKNOWN_PAGES: u64 = 50;
/// Audio or video given by URI: its length is unknown; an hour of audio
/// or two minutes of video.
pub const MEDIA_UNKNOWN_TOKENS: u64 = 3_600 * AUDIO_TOKENS_PER_SECOND;

/// What a body's input costs: text (to scale) and media (flat).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    text: u64,
    flat: u64,
}

impl Count {
    fn total(self, ratio: u64) -> u64 {
        scale(self.text, ratio).saturating_add(self.flat)
    }
}

fn invalid(param: &str, message: impl Into<String>) -> EstimateError {
    EstimateError::Invalid {
        param: Some(param.to_string()),
        message: message.into(),
    }
}

/// The input tokens of `body` (a `generateContent` request).
pub fn input_tokens(
    body: &Map<String, Value>,
    enc: Encoding,
    ratio: u64,
) -> Result<u64, EstimateError> {
    let mut count = Count::default();
    match body.get("contents") {
        Some(Value::Array(cs)) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                content(c, enc, &mut count).map_err(|m| invalid(&format!("contents[{i}]"), m))?;
            }
        }
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(invalid("contents", "contents is not specified"))
        }
        Some(v) => {
            return Err(invalid(
                "contents",
                format!("contents must be an array, not {}", describe(v)),
            ))
        }
    }
    if let Some(s) = body.get("systemInstruction").filter(|v| !v.is_null()) {
        content(s, enc, &mut count).map_err(|m| invalid("systemInstruction", m))?;
    }
    if let Some(t) = body.get("tools").filter(|v| !v.is_null()) {
        count.text = count.text.saturating_add(json_tokens(t, enc));
    }
    if let Some(t) = body.get("toolConfig").filter(|v| !v.is_null()) {
        count.text = count.text.saturating_add(json_tokens(t, enc));
    }
    Ok(count.total(ratio))
}

fn json_tokens(v: &Value, enc: Encoding) -> u64 {
    serde_json::to_string(v).map_or(0, |s| enc.count_cached(&s))
}

fn content(c: &Value, enc: Encoding, count: &mut Count) -> Result<(), String> {
    let Some(c) = c.as_object() else {
        return Err("a content must be an object with parts".into());
    };
    count.flat = count.flat.saturating_add(TOKENS_PER_CONTENT);
    let parts = match c.get("parts") {
        Some(Value::Array(ps)) => ps,
        None | Some(Value::Null) => return Ok(()),
        Some(_) => return Err("parts must be an array".into()),
    };
    for p in parts {
        part(p, enc, count);
    }
    Ok(())
}

fn part(p: &Value, enc: Encoding, count: &mut Count) {
    let Some(p) = p.as_object() else {
        count.text = count.text.saturating_add(json_tokens(p, enc));
        return;
    };
    if let Some(t) = p.get("text").and_then(Value::as_str) {
        count.text = count.text.saturating_add(enc.count_cached(t));
    }
    for k in [
        "functionCall",
        "functionResponse",
        "executableCode",
        "codeExecutionResult",
    ] {
        if let Some(v) = p.get(k) {
            count.text = count.text.saturating_add(json_tokens(v, enc));
        }
    }
    if let Some(d) = p.get("inlineData") {
        let mime = d.get("mimeType").and_then(Value::as_str).unwrap_or("");
        let data = d.get("data").and_then(Value::as_str).unwrap_or("");
        inline(mime, data, enc, count);
    }
    if let Some(f) = p.get("fileData") {
        let mime = f.get("mimeType").and_then(Value::as_str).unwrap_or("");
        count.flat = count.flat.saturating_add(by_reference(mime));
    }
}

/// Tokens of an image `width` × `height` px.
pub fn image_tokens(width: u64, height: u64) -> u64 {
    if width <= 384 && height <= 384 {
        return IMAGE_TILE_TOKENS;
    }
    width
        .div_ceil(768)
        .max(1)
        .saturating_mul(height.div_ceil(768).max(1))
        .saturating_mul(IMAGE_TILE_TOKENS)
}

fn inline(mime: &str, data: &str, enc: Encoding, count: &mut Count) {
    // Base64: 4 characters per 3 bytes.
    let bytes = (data.len() as u64).saturating_mul(3) / 4;
    let flat = if mime.starts_with("image/") {
        image_size(&decode_base64(data.get(..64).unwrap_or(data)))
            .map_or(IMAGE_UNKNOWN_TOKENS, |(w, h)| image_tokens(w, h))
    } else if mime.starts_with("audio/") {
        bytes
            .div_ceil(AUDIO_BYTES_PER_SECOND)
            .max(1)
            .saturating_mul(AUDIO_TOKENS_PER_SECOND)
    } else if mime.starts_with("video/") {
        bytes
            .div_ceil(VIDEO_BYTES_PER_SECOND)
            .max(1)
            .saturating_mul(VIDEO_TOKENS_PER_SECOND)
    } else if mime == "application/pdf" {
        pdf_pages(data)
            .unwrap_or(PDF_UNKNOWN_PAGES)
            .saturating_mul(PDF_PAGE_TOKENS)
    } else {
        // Text documents (text/plain, text/html, CSV…) are read as text.
        let text = String::from_utf8_lossy(&decode_base64(data)).into_owned();
        count.text = count.text.saturating_add(enc.count(&text));
        0
    };
    count.flat = count.flat.saturating_add(flat);
}

fn by_reference(mime: &str) -> u64 {
    if mime.starts_with("image/") {
        IMAGE_UNKNOWN_TOKENS
    } else if mime == "application/pdf" {
        PDF_UNKNOWN_PAGES * PDF_PAGE_TOKENS
    } else {
        MEDIA_UNKNOWN_TOKENS
    }
}

/// The estimate of a `generateContent` body: input, and the output
/// reserved per candidate: the client's `generationConfig.maxOutputTokens`
/// (which bounds thoughts and answer together), else the model's default
/// (lowered to fit the budgets) plus a positive `thinkingBudget`.
pub fn estimate(
    body: &Map<String, Value>,
    model: &ModelEstimation,
    room: TokenRoom,
) -> Result<Estimate, EstimateError> {
    let input_tokens = input_tokens(body, model.encoding, model.token_ratio)?;
    let config = match body.get("generationConfig") {
        None | Some(Value::Null) => None,
        Some(Value::Object(c)) => Some(c),
        Some(v) => {
            return Err(invalid(
                "generationConfig",
                format!("generationConfig must be an object, not {}", describe(v)),
            ))
        }
    };
    let int = |name: &str| -> Result<Option<u64>, EstimateError> {
        match config.and_then(|c| c.get(name)) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) if x >= 1 => Ok(Some(x)),
                _ => Err(invalid(
                    &format!("generationConfig.{name}"),
                    format!("{name} must be an integer >= 1, got {}", describe(v)),
                )),
            },
        }
    };
    let choices = int("candidateCount")?.unwrap_or(1);
    if choices > MAX_CANDIDATES {
        return Err(invalid(
            "generationConfig.candidateCount",
            format!(
                "candidateCount must be at most {}, got {choices}",
                MAX_CANDIDATES
            ),
        ));
    }
    let client_max_output = int("maxOutputTokens")?;
    if let (Some(cap), Some(max)) = (client_max_output, model.max_output_tokens) {
        if cap > max {
            return Err(invalid(
                "generationConfig.maxOutputTokens",
                format!(
                    "maxOutputTokens is {cap}, but this model supports at most {max} output tokens"
                ),
            ));
        }
    }
    let (per_choice, lowered_default) = match client_max_output {
        Some(cap) => (cap, false),
        None => {
            let (out, lowered) = default_output(input_tokens, choices, model, room)?;
            // A positive thinking budget is spent beside the answer.
            let thinking = config
                .and_then(|c| c.get("thinkingConfig"))
                .and_then(|t| t.get("thinkingBudget"))
                .and_then(Value::as_i64)
                .filter(|b| *b > 0)
                .map_or(0, |b| b as u64);
            (out.saturating_add(thinking), lowered)
        }
    };
    let output_tokens = choices.saturating_mul(per_choice);
    Ok(Estimate {
        input_tokens,
        cacheable_prefix_tokens: 0,
        output_tokens_per_choice: per_choice,
        choices,
        output_tokens,
        total_tokens: input_tokens.saturating_add(output_tokens),
        client_max_output,
        lowered_default,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn images_follow_the_tile_rule() {
        assert_eq!(image_tokens(384, 384), 258);
        assert_eq!(image_tokens(600, 400), 258);
        assert_eq!(image_tokens(1000, 1000), 4 * 258);
        assert_eq!(image_tokens(3000, 10), 4 * 258);
    }

    #[test]
    fn text_is_scaled_and_media_is_not() {
        let enc = Encoding::O200kBase;
        let body = obj(json!({"contents": [{"role": "user", "parts": [
            {"text": "hello there"},
            {"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://b/x.jpg"}}
        ]}]}));
        let text = enc.count("hello there");
        assert_eq!(
            input_tokens(&body, enc, 2000).ok(),
            Some(2 * text + TOKENS_PER_CONTENT + IMAGE_UNKNOWN_TOKENS)
        );
    }

    #[test]
    fn inline_audio_is_bounded_by_its_bytes() {
        let enc = Encoding::O200kBase;
        // 4000 base64 characters: 3000 bytes, at most 3 s at 8 kbit/s.
        let data = "A".repeat(4000);
        let body = obj(json!({"contents": [{"parts": [
            {"inlineData": {"mimeType": "audio/mp3", "data": data}}
        ]}]}));
        assert_eq!(
            input_tokens(&body, enc, 1000).ok(),
            Some(TOKENS_PER_CONTENT + 3 * AUDIO_TOKENS_PER_SECOND)
        );
    }

    #[test]
    fn contents_are_required() {
        let enc = Encoding::O200kBase;
        assert!(input_tokens(&obj(json!({})), enc, 1000).is_err());
        assert!(input_tokens(&obj(json!({"contents": "hi"})), enc, 1000).is_err());
    }
}
