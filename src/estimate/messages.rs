//! Input estimation of a Messages body. Anthropic's tokenizer is not
//! public, so text is counted with the model's tiktoken encoding and
//! scaled by the model's `token_ratio` (per mille, rounded up once per
//! request); the settled/estimated input metric
//! (`budgetgate_input_settled_per_estimated`) is how an operator
//! calibrates it. An underestimate settles as debt, never as a refusal
//! after the fact.
//!
//! What is counted (before the ratio):
//! - `system`, a string or text blocks;
//! - each message: [`TOKENS_PER_MESSAGE`] of framing, then its content (a
//!   string or blocks): `text`; `tool_use` (name and input as JSON);
//!   `tool_result` (its content, recursively); `thinking` (the thinking
//!   text; the signature is opaque and costs nothing here);
//!   `redacted_thinking` (its data as text, an upper bound); `document`
//!   (text sources as text, PDFs by page, below); `image` (below); any
//!   other block as its JSON text;
//! - `tools`: name, description and input schema as JSON, plus Anthropic's
//!   published tool-use system prompt ([`TOOL_SYSTEM_PROMPT_TOKENS`]).
//!
//! Images are not text and are not scaled: Anthropic's vision guide gives
//! `tokens = width × height / 750`, with images larger than about 1,600
//! tokens (long edge over 1568 px) scaled down first. The size is read
//! from a base64 PNG or GIF header; any other image (JPEG, WebP, URL or
//! file sources) costs the cap [`IMAGE_MAX_TOKENS`].
//!
//! PDFs: Anthropic's PDF support guide says each page costs its text
//! (typically 1,500–3,000 tokens per page) plus the page as an image; a
//! page is charged [`PDF_PAGE_TOKENS`] (3,000 + the image cap). Pages are
//! counted in a base64 PDF (`/Type /Page` objects); a PDF given by URL or
//! file id is charged [`PDF_UNKNOWN_PAGES`] pages.

use serde_json::{Map, Value};

use super::{Encoding, EstimateError};

/// `tokens × ratio / 1000`, rounded up, saturating: tiktoken counts in
/// Anthropic tokens at a model's `token_ratio` per mille.
pub fn scale(tokens: u64, ratio: u64) -> u64 {
    let scaled = (tokens as u128 * ratio as u128).div_ceil(1000);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// Framing tokens per message (role and turn markers; not published).
pub const TOKENS_PER_MESSAGE: u64 = 4;
/// Tokens of the system prompt Anthropic adds when `tools` are given
/// (tool use guide, "Pricing": 346 with `tool_choice` auto or none on
/// Claude 4 models, the largest figure in its table).
pub const TOOL_SYSTEM_PROMPT_TOKENS: u64 = 346;
/// Pixels per image token (vision guide: `tokens = (width px * height px)/750`).
pub const PIXELS_PER_TOKEN: u64 = 750;
/// An image's largest cost before Anthropic scales it down (vision guide:
/// "more than ~1,600 tokens, it will first be scaled down").
pub const IMAGE_MAX_TOKENS: u64 = 1_600;
/// One PDF page: the top of the guide's 1,500–3,000 text tokens per page
/// plus the page as an image.
pub const PDF_PAGE_TOKENS: u64 = 3_000 + IMAGE_MAX_TOKENS;
/// Pages charged for a PDF the gateway cannot read (URL, file id).
pub const PDF_UNKNOWN_PAGES: u64 = 10;

/// Input of a Messages body, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    /// Every input token.
    pub tokens: u64,
    /// Of `tokens`, the cacheable prefix: everything up to and including
    /// the last block marked `cache_control`, in the order Anthropic caches
    /// a prompt (tools, system, messages; prompt caching guide); all of it
    /// when the request sets `cache_control` at its top level (automatic
    /// caching: the breakpoint goes on the last cacheable block). 0 without
    /// a breakpoint.
    pub cacheable_prefix: u64,
}

/// Input tokens of a Messages body.
pub fn input_tokens(
    body: &Map<String, Value>,
    enc: Encoding,
    ratio: u64,
) -> Result<u64, EstimateError> {
    input(body, enc, ratio).map(|i| i.tokens)
}

/// Input tokens of a Messages body and its cacheable prefix.
pub fn input(body: &Map<String, Value>, enc: Encoding, ratio: u64) -> Result<Input, EstimateError> {
    let mut c = Counter {
        enc,
        text: 0,
        fixed: 0,
        prefix: None,
    };
    // Counted in the order of the cached prefix: tools, system, messages.
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            if !tools.is_empty() {
                c.fixed += TOOL_SYSTEM_PROMPT_TOKENS;
            }
            for t in tools {
                c.json(t);
                c.mark(t);
            }
        }
        Some(_) => return Err(invalid("tools", "`tools` must be a list.")),
    }
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => c.text(s),
        Some(Value::Array(blocks)) => blocks.iter().for_each(|b| c.block(b)),
        Some(_) => {
            return Err(invalid(
                "system",
                "`system` must be a string or a list of blocks.",
            ))
        }
    }
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(invalid(
            "messages",
            "`messages` must be a list of messages.",
        ));
    };
    for m in messages {
        let Value::Object(m) = m else {
            return Err(invalid("messages", "Each message must be an object."));
        };
        c.text += TOKENS_PER_MESSAGE;
        match m.get("content") {
            Some(Value::String(s)) => c.text(s),
            Some(Value::Array(blocks)) => blocks.iter().for_each(|b| c.block(b)),
            _ => {
                return Err(invalid(
                    "messages",
                    "Each message's `content` must be a string or a list of blocks.",
                ))
            }
        }
    }
    if body.get("cache_control").is_some_and(|v| !v.is_null()) {
        c.prefix = Some((c.text, c.fixed));
    }
    // Fields this estimator does not know (new betas add them: Claude Code
    // sends `context_management` and `output_config`) may carry text the
    // model reads (a structured-output schema): counted as their JSON.
    for (k, v) in body {
        if !NO_PROMPT_TEXT.contains(&k.as_str()) && !v.is_null() {
            c.json(v);
        }
    }
    let tokens = |(text, fixed): (u64, u64)| scale(text, ratio).saturating_add(fixed);
    Ok(Input {
        tokens: tokens((c.text, c.fixed)),
        cacheable_prefix: c.prefix.map_or(0, tokens),
    })
}

/// Top-level fields that put no text in the prompt, or whose text is
/// counted above (`tools`, `system`, `messages`).
const NO_PROMPT_TEXT: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_k",
    "top_p",
    "tool_choice",
    "thinking",
    "cache_control",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
];

fn invalid(param: &str, message: &str) -> EstimateError {
    EstimateError::Invalid {
        param: Some(param.into()),
        message: message.into(),
    }
}

/// Text tokens (scaled by the ratio at the end) and fixed tokens (images,
/// PDFs, published overheads: not scaled); `prefix`, both counts at the
/// last `cache_control` breakpoint seen.
struct Counter {
    enc: Encoding,
    text: u64,
    fixed: u64,
    prefix: Option<(u64, u64)>,
}

impl Counter {
    fn text(&mut self, s: &str) {
        self.text = self.text.saturating_add(self.enc.count_cached(s));
    }

    fn json(&mut self, v: &Value) {
        self.text(&v.to_string());
    }

    fn str_field(&mut self, b: &Value, k: &str) {
        if let Some(s) = b.get(k).and_then(Value::as_str) {
            self.text(s);
        }
    }

    /// Ends the cacheable prefix after `b` when `b` is a breakpoint.
    fn mark(&mut self, b: &Value) {
        if b.get("cache_control").is_some_and(|v| !v.is_null()) {
            self.prefix = Some((self.text, self.fixed));
        }
    }

    fn block(&mut self, b: &Value) {
        self.block_content(b);
        self.mark(b);
    }

    fn block_content(&mut self, b: &Value) {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => self.str_field(b, "text"),
            Some("thinking") => self.str_field(b, "thinking"),
            Some("redacted_thinking") => self.str_field(b, "data"),
            Some("tool_use" | "server_tool_use") => {
                self.str_field(b, "name");
                if let Some(input) = b.get("input") {
                    self.json(input);
                }
            }
            Some("tool_result") => match b.get("content") {
                Some(Value::String(s)) => self.text(s),
                Some(Value::Array(blocks)) => blocks.iter().for_each(|x| self.block(x)),
                _ => {}
            },
            Some("image") => self.fixed = self.fixed.saturating_add(image_tokens(b)),
            Some("document") => self.document(b),
            _ => self.json(b),
        }
    }

    fn document(&mut self, b: &Value) {
        let source = b.get("source");
        let kind = source.and_then(|s| s.get("type")).and_then(Value::as_str);
        match kind {
            Some("text") => {
                if let Some(s) = source.and_then(|s| s.get("data")).and_then(Value::as_str) {
                    self.text(s);
                }
            }
            Some("content") => match source.and_then(|s| s.get("content")) {
                Some(Value::String(s)) => self.text(s),
                Some(Value::Array(blocks)) => blocks.iter().for_each(|x| self.block(x)),
                _ => {}
            },
            Some("base64") => {
                let pages = source
                    .and_then(|s| s.get("data"))
                    .and_then(Value::as_str)
                    .and_then(pdf_pages)
                    .unwrap_or(PDF_UNKNOWN_PAGES);
                self.fixed = self
                    .fixed
                    .saturating_add(pages.saturating_mul(PDF_PAGE_TOKENS));
            }
            _ => {
                self.fixed = self
                    .fixed
                    .saturating_add(PDF_UNKNOWN_PAGES * PDF_PAGE_TOKENS)
            }
        }
        self.str_field(b, "title");
        self.str_field(b, "context");
    }
}

/// Tokens of an image block: by size when a base64 PNG or GIF header
/// gives it, else the cap.
pub fn image_tokens(b: &Value) -> u64 {
    let data = b
        .get("source")
        .filter(|s| s.get("type").and_then(Value::as_str) == Some("base64"))
        .and_then(|s| s.get("data"))
        .and_then(Value::as_str);
    let Some((w, h)) = data.and_then(|d| image_size(&decode_base64(d.get(..64).unwrap_or(d))))
    else {
        return IMAGE_MAX_TOKENS;
    };
    (w.saturating_mul(h))
        .div_ceil(PIXELS_PER_TOKEN)
        .clamp(1, IMAGE_MAX_TOKENS)
}

/// Width and height from a PNG IHDR or a GIF logical screen descriptor.
pub(super) fn image_size(head: &[u8]) -> Option<(u64, u64)> {
    if head.len() >= 24 && head.starts_with(b"\x89PNG\r\n\x1a\n") && &head[12..16] == b"IHDR" {
        let be = |i: usize| u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        return Some((be(16) as u64, be(20) as u64));
    }
    if head.len() >= 10 && (head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a")) {
        let le = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]) as u64;
        return Some((le(6), le(8)));
    }
    None
}

/// Pages of a base64 PDF: `/Type /Page` objects (not `/Pages`); `None`
/// when none is found (compressed object streams hide them).
pub(super) fn pdf_pages(data: &str) -> Option<u64> {
    let bytes = decode_base64(data);
    let mut pages = 0u64;
    let mut i = 0;
    while let Some(at) = find(&bytes[i..], b"/Type") {
        let mut j = i + at + 5;
        while bytes.get(j).is_some_and(|b| b.is_ascii_whitespace()) {
            j += 1;
        }
        if bytes[j..].starts_with(b"/Page") && !bytes[j + 5..].starts_with(b"s") {
            pages += 1;
        }
        i = j;
    }
    (pages > 0).then_some(pages)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Standard base64 (padding and whitespace ignored; decoding stops at the
/// first byte outside the alphabet).
pub(super) fn decode_base64(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' | b'\n' | b'\r' | b' ' => continue,
            _ => break,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // A 1×1 PNG and a 100×50 GIF header, base64.
    const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

    #[test]
    fn images_by_size_else_the_cap() {
        let img = |data: &str| json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}});
        assert_eq!(image_tokens(&img(PNG_1X1)), 1);
        let gif = {
            let mut h = b"GIF89a".to_vec();
            h.extend_from_slice(&1000u16.to_le_bytes());
            h.extend_from_slice(&750u16.to_le_bytes());
            h.extend_from_slice(&[0; 8]);
            encode(&h)
        };
        assert_eq!(image_tokens(&img(&gif)), 1000);
        let huge = {
            let mut h = b"GIF89a".to_vec();
            h.extend_from_slice(&8000u16.to_le_bytes());
            h.extend_from_slice(&8000u16.to_le_bytes());
            h.extend_from_slice(&[0; 8]);
            encode(&h)
        };
        assert_eq!(image_tokens(&img(&huge)), IMAGE_MAX_TOKENS);
        assert_eq!(
            image_tokens(&json!({"type": "image", "source": {"type": "url", "url": "https://x"}})),
            IMAGE_MAX_TOKENS
        );
    }

    fn encode(b: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for ch in b.chunks(3) {
            let n = ch
                .iter()
                .enumerate()
                .fold(0u32, |a, (i, &x)| a | (u32::from(x) << (16 - 8 * i)));
            for i in 0..=ch.len() {
                s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        s
    }

    #[test]
    fn pdf_pages_counted() {
        let pdf = encode(b"%PDF-1.4 1 0 obj << /Type /Pages /Count 2 >> 2 0 obj << /Type /Page >> 3 0 obj <</Type/Page>>");
        assert_eq!(pdf_pages(&pdf), Some(2));
        assert_eq!(pdf_pages(&encode(b"%PDF-1.7 compressed")), None);
    }

    #[test]
    fn blocks_system_and_tools_are_counted_with_the_ratio() {
        let enc = Encoding::O200kBase;
        let body = json!({
            "system": [{"type": "text", "text": "You are terse."}],
            "messages": [
                {"role": "user", "content": "What is the weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}
                ]}
            ],
            "tools": [{"name": "weather", "description": "Weather by city", "input_schema": {"type": "object"}}]
        });
        let Value::Object(b) = body else {
            unreachable!()
        };
        let at_1000 = input_tokens(&b, enc, 1000).unwrap();
        let at_1500 = input_tokens(&b, enc, 1500).unwrap();
        let text = at_1000 - TOOL_SYSTEM_PROMPT_TOKENS;
        assert_eq!(at_1500 - TOOL_SYSTEM_PROMPT_TOKENS, (text * 3).div_ceil(2));
        assert!(text > 3 * TOKENS_PER_MESSAGE + enc.count("What is the weather?"));
        let missing = serde_json::Map::new();
        assert!(input_tokens(&missing, enc, 1000).is_err());
    }

    /// Fault: a field a new beta added passed unestimated though it put
    /// text before the model (a structured-output schema).
    #[test]
    fn fields_it_does_not_know_are_counted_as_their_json() {
        let enc = Encoding::O200kBase;
        let base = json!({"messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100, "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}});
        let schema = json!({"type": "object", "properties": {"answer": {"type": "string", "description": "the whole answer, in full sentences"}}});
        let mut with = base.clone();
        with["output_config"] =
            json!({"effort": "high", "format": {"type": "json_schema", "schema": schema}});
        with["a_future_field"] = json!("Some text a future beta puts before the model.");
        let (Value::Object(b), Value::Object(w)) = (base, with) else {
            unreachable!()
        };
        let plain = input_tokens(&b, enc, 1000).unwrap();
        let more = input_tokens(&w, enc, 1000).unwrap();
        assert!(
            more >= plain + enc.count(&schema.to_string()) + 8,
            "{more} vs {plain}"
        );
    }

    #[test]
    fn the_cacheable_prefix_ends_at_the_last_breakpoint_in_cache_order() {
        let enc = Encoding::O200kBase;
        let long = "Rules of the house. ".repeat(50);
        let at = |body: Value| {
            let Value::Object(b) = body else {
                unreachable!()
            };
            input(&b, enc, 1500).unwrap()
        };
        let cc = json!({"type": "ephemeral"});
        // No breakpoint: no prefix.
        let none = at(json!({"system": long, "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(none.cacheable_prefix, 0);
        // A breakpoint on the system block: the system is the prefix.
        let system = at(json!({
            "system": [{"type": "text", "text": long, "cache_control": cc}],
            "messages": [{"role": "user", "content": "hi"}]
        }));
        assert_eq!(system.tokens, none.tokens);
        assert_eq!(system.cacheable_prefix, scale(enc.count(&long), 1500));
        // Tools come first in the cache: a breakpoint in the messages
        // covers tools, system and the messages up to it; a later one in
        // a tool definition does not move it back.
        let tool = json!({"name": "t", "description": "d", "input_schema": {"type": "object"}, "cache_control": cc});
        let all = at(json!({
            "tools": [tool],
            "system": long,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "first", "cache_control": cc}]},
                {"role": "user", "content": "second"}
            ]
        }));
        let tail = scale(TOKENS_PER_MESSAGE + enc.count("second"), 1500);
        assert!(all.cacheable_prefix > TOOL_SYSTEM_PROMPT_TOKENS + scale(enc.count(&long), 1500));
        assert!(all.tokens - all.cacheable_prefix <= tail + 1, "{all:?}");
        // Automatic caching (top-level cache_control): all of it.
        let auto = at(
            json!({"cache_control": cc, "system": long, "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(auto.cacheable_prefix, auto.tokens);
    }
}
