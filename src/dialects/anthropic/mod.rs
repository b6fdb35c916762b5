//! Anthropic Messages (`POST /v1/messages`; Anthropic API reference,
//! "Messages" and "Streaming Messages"), a native passthrough: the
//! client's body goes upstream with only `model` changed, and the answer
//! comes back byte for byte.
//!
//! What differs from the OpenAI dialects: the client's key comes in
//! `x-api-key` (or `Authorization: Bearer`, which the official SDK sends
//! when given `auth_token`), the request is named by `request-id`, the
//! output cap `max_tokens` is required, output is a list of content blocks
//! (not choices), usage reports the cache apart (`input_tokens` is the
//! uncached input; `cache_read_input_tokens` and
//! `cache_creation_input_tokens` are beside it, never inside it), errors
//! are `{"type":"error","error":{"type","message"}}`, and the rate-limit
//! headers are `anthropic-ratelimit-*`.
//!
//! - Input estimation (text times the model's `token_ratio`, images by
//!   size, PDFs by page) is the estimator's: [`crate::estimate::messages`].
//! - [`stream`]: the event stream's metering, cutoff and error events.
//! - [`headers`]: `anthropic-ratelimit-*` describing the gateway's budgets.
//! - [`error`]: the error body and its `type` per status.
//! - [`betas`]: which `anthropic-beta` values a model passes upstream.

pub mod betas;
pub mod error;
pub mod headers;
pub mod stream;

use axum::http::{header, HeaderName};
use serde_json::Value;

use super::usage::{read_count, Rejected, UsageBreakdown};
use super::KeyHeader;
use crate::config::estimate::Encoding;
pub use crate::estimate::messages::scale;

/// Path under an Anthropic base URL (`https://api.anthropic.com`).
pub const PATH: &str = "v1/messages";

/// The output-cap field; required on every request.
pub const CAP_FIELD: &str = "max_tokens";

/// `x-api-key: <key>` as Anthropic's API takes it, and `Authorization:
/// Bearer <key>` (the SDK's `auth_token`, and what SDK 2.14 sends with
/// `api_key=` in some set-ups, as seen with the pinned SDK).
pub static KEY_HEADERS: [KeyHeader; 2] = [
    KeyHeader::Plain(HeaderName::from_static("x-api-key")),
    KeyHeader::Bearer(header::AUTHORIZATION),
];

/// The header the Anthropic SDKs read as the request id (`_request_id`).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

/// The API version header, passed from the client to the upstream.
pub const VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// The beta-features header.
pub const BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// The breakdown of an Anthropic `usage` object. `input_tokens` is the
/// uncached input; cache reads and cache writes are reported beside it
/// (Anthropic API reference, "Messages", `usage`; prompt caching guide:
/// "total input tokens = cache_read_input_tokens +
/// cache_creation_input_tokens + input_tokens"). The
/// `cache_creation.ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`
/// object is a breakdown of `cache_creation_input_tokens` and is never added.
pub fn usage_from_value(u: &Value) -> UsageBreakdown {
    let mut fields = UsageFields::default();
    fields.merge(u);
    fields.breakdown()
}

/// Usage fields as they were last reported: a stream reports them in
/// `message_start` and again (cumulative) in each `message_delta`; each
/// field present replaces the one before, and none is ever summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageFields {
    input: Option<u64>,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    /// `cache_creation.ephemeral_1h_input_tokens`: the 1-hour part of the writes.
    cache_creation_1h: Option<u64>,
    output: Option<u64>,
    /// `server_tool_use`: the calls of server tools priced per call.
    hosted: crate::money::HostedCalls,
    /// A field any report sent that was no count (it stays rejected: an
    /// upstream that sent one is not trusted for the rest of the answer).
    rejected: Rejected,
}

/// The `usage.server_tool_use` counts of server tools billed per call
/// (Anthropic API reference, "Messages", `usage.server_tool_use`), and
/// the kind each prices as.
const SERVER_TOOL_USAGE: [(&str, crate::money::HostedKind); 2] = [
    ("web_search_requests", crate::money::HostedKind::WebSearch),
    ("web_fetch_requests", crate::money::HostedKind::WebFetch),
];

impl UsageFields {
    /// Takes every field `u` reports (last value wins).
    pub fn merge(&mut self, u: &Value) {
        let take = |slot: &mut Option<u64>, name: &'static str, rejected: &mut _| {
            if let Some(n) = read_count(u.get(name), name, rejected) {
                *slot = Some(n);
            }
        };
        let r = &mut self.rejected;
        take(&mut self.input, "input_tokens", &mut r.input);
        take(
            &mut self.cache_read,
            "cache_read_input_tokens",
            &mut r.input,
        );
        take(
            &mut self.cache_creation,
            "cache_creation_input_tokens",
            &mut r.input,
        );
        take(&mut self.output, "output_tokens", &mut r.output);
        if let Some(split) = u.get("cache_creation") {
            if let Some(n) = read_count(
                split.get("ephemeral_1h_input_tokens"),
                "ephemeral_1h_input_tokens",
                &mut r.input,
            ) {
                self.cache_creation_1h = Some(n);
            }
        }
        if let Some(calls) = u.get("server_tool_use") {
            for (field, kind) in SERVER_TOOL_USAGE {
                // A call count that is no count is left out (the calls
                // seen in the stream still count, see `stream`).
                if let Some(n) = read_count(calls.get(field), field, &mut None) {
                    self.hosted.set(kind, u32::try_from(n).unwrap_or(u32::MAX));
                }
            }
        }
    }

    /// The output tokens last reported.
    pub fn output(&self) -> Option<u64> {
        self.output
    }

    /// Some report's output was no count: the gateway counts the output.
    pub fn output_rejected(&self) -> bool {
        self.rejected.output.is_some()
    }

    /// The usage breakdown of these fields.
    pub fn breakdown(&self) -> UsageBreakdown {
        UsageBreakdown {
            uncached_input: self.input,
            cached_input: self.cache_read.unwrap_or(0),
            cache_writes: self.cache_creation.unwrap_or(0),
            cache_writes_1h: self.cache_creation_1h.unwrap_or(0),
            output: self.output,
            reasoning: 0,
            hosted: self.hosted,
            rejected_input: None,
            rejected_output: None,
        }
        .rejecting(self.rejected)
    }
}

/// Tiktoken tokens of a content block of an answer, or of a
/// `content_block_delta`'s `delta`: text, tool input (the JSON as sent),
/// thinking. A thinking block's `signature` and redacted thinking are not
/// output the client can count. Unscaled: the model's ratio is applied
/// once to a total ([`scale`]), since a ceiling per block or delta
/// would count a one-token delta as two at a ratio of 1.5.
pub fn block_tokens(block: &Value, enc: Encoding) -> u64 {
    let text = |k: &str| block.get(k).and_then(Value::as_str);
    match block.get("type").and_then(Value::as_str) {
        Some("text" | "text_delta") => text("text").map_or(0, |s| enc.count(s)),
        Some("thinking" | "thinking_delta") => text("thinking").map_or(0, |s| enc.count(s)),
        Some("input_json_delta") => text("partial_json").map_or(0, |s| enc.count(s)),
        Some("tool_use" | "server_tool_use") => {
            let input = block.get("input").map(Value::to_string).unwrap_or_default();
            enc.count(&input) + text("name").map_or(0, |s| enc.count(s))
        }
        _ => 0,
    }
}

/// Output tokens of a whole answer: every content block, at `ratio` per
/// mille of their summed tiktoken count.
pub fn count_answer_output(answer: &Value, enc: Encoding, ratio: u64) -> u64 {
    let raw = answer
        .get("content")
        .and_then(Value::as_array)
        .map_or(0, |bs| bs.iter().map(|b| block_tokens(b, enc)).sum());
    scale(raw, ratio)
}

/// Work a Messages body asks for that the provider does and bills beside
/// the token usage, so the gateway cannot meter or isolate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmetered {
    /// A server tool (`web_search`, `web_fetch`, `code_execution`…): any
    /// tool with a `type` other than `custom` and Anthropic's client tools
    /// (`bash`, `text_editor`, `computer`, `memory`), which the client runs.
    ServerTool,
    /// `mcp_servers`: the provider calls remote MCP servers.
    McpServers,
    /// `container`: a code-execution container kept between requests.
    Container,
    /// A `file_id` source: a file uploaded to the provider's Files API
    /// (owned by whoever holds the provider key: the gateway's).
    FileId,
}

impl std::fmt::Display for Unmetered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unmetered::ServerTool => "server tools",
            Unmetered::McpServers => "MCP servers",
            Unmetered::Container => "containers",
            Unmetered::FileId => "file_id sources",
        })
    }
}

impl Unmetered {
    /// The request parameter that asks for it.
    pub fn param(self) -> &'static str {
        match self {
            Unmetered::ServerTool => "tools",
            Unmetered::McpServers => "mcp_servers",
            Unmetered::Container => "container",
            Unmetered::FileId => "messages",
        }
    }
}

/// The server tools of `body`: each one's index in `tools` and `type`
/// (any `type` other than `custom` and Anthropic's client tools `bash`,
/// `text_editor`, `computer`, `memory`, which the client runs).
pub fn server_tools(body: &Value) -> impl Iterator<Item = (usize, &str)> {
    const CLIENT_TOOLS: [&str; 4] = ["bash", "text_editor", "computer", "memory"];
    let tools = body.get("tools").and_then(Value::as_array);
    tools
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, t)| Some((i, t.get("type").and_then(Value::as_str)?)))
        .filter(|(_, ty)| *ty != "custom" && !CLIENT_TOOLS.iter().any(|c| ty.starts_with(c)))
}

/// The name of server tool type `ty` without its version date
/// (`web_search_20250305` is `web_search`): the name `hosted_tools`
/// allows and prices it by.
pub fn server_tool_name(ty: &str) -> &str {
    match ty.rsplit_once('_') {
        Some((name, date)) if date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => ty,
    }
}

/// The first unmetered feature `body` asks for, if any.
pub fn unmetered(body: &Value) -> Option<Unmetered> {
    if server_tools(body).next().is_some() {
        return Some(Unmetered::ServerTool);
    }
    unmetered_beside_tools(body)
}

/// The first unmetered feature `body` asks for beside its server tools
/// (which are allowed one by one, [`server_tools`]).
pub fn unmetered_beside_tools(body: &Value) -> Option<Unmetered> {
    let present = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if present("mcp_servers") {
        return Some(Unmetered::McpServers);
    }
    if present("container") {
        return Some(Unmetered::Container);
    }
    fn has_file_id(v: &Value) -> bool {
        match v {
            Value::Object(o) => {
                o.get("type").and_then(Value::as_str) == Some("file") && o.contains_key("file_id")
                    || o.values().any(has_file_id)
            }
            Value::Array(a) => a.iter().any(has_file_id),
            _ => false,
        }
    }
    ["messages", "system"]
        .iter()
        .any(|k| body.get(*k).is_some_and(has_file_id))
        .then_some(Unmetered::FileId)
}

/// True when the body asks for extended thinking in any form other than
/// `disabled` (enabled, adaptive; interleaved thinking rides on these):
/// the output holds tokens the stream shows late or never, so the
/// reservation is the whole `max_tokens` and is never extended.
pub fn thinks(body: &Value) -> bool {
    match body.get("thinking") {
        None | Some(Value::Null) => false,
        Some(t) => t.get("type").and_then(Value::as_str) != Some("disabled"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cache_counts_beside_input_never_added_twice() {
        let u = usage_from_value(&json!({
            "input_tokens": 7, "cache_read_input_tokens": 10000,
            "cache_creation_input_tokens": 2000, "output_tokens": 50,
            "cache_creation": {"ephemeral_5m_input_tokens": 1500, "ephemeral_1h_input_tokens": 500}
        }));
        assert_eq!(u.uncached_input, Some(7));
        assert_eq!(u.cached_input, 10000);
        assert_eq!(u.cache_writes, 2000);
        assert_eq!(u.total(), 12_057);
    }

    #[test]
    fn stream_usage_is_last_value_wins() {
        let mut f = UsageFields::default();
        f.merge(&json!({"input_tokens": 20, "output_tokens": 1}));
        for n in [5, 10, 15] {
            f.merge(&json!({"output_tokens": n}));
        }
        // A field that first appears in a message_delta is honoured.
        f.merge(&json!({"output_tokens": 15, "cache_read_input_tokens": 30}));
        let u = f.breakdown();
        assert_eq!(u.output, Some(15));
        assert_eq!(u.cached_input, 30);
        assert_eq!(u.total(), 65);
    }

    #[test]
    fn ratio_rounds_up() {
        assert_eq!(scale(10, 1500), 15);
        assert_eq!(scale(3, 1333), 4);
        assert_eq!(scale(0, 1500), 0);
        assert_eq!(scale(u64::MAX, 2000), u64::MAX);
    }

    #[test]
    fn an_answer_is_scaled_once_not_per_block() {
        // Three one-token blocks at 1.5: ceil(4.5) = 5, not 3 × ceil(1.5) = 6.
        let answer = json!({"content": [
            {"type": "text", "text": "hi"},
            {"type": "text", "text": "hi"},
            {"type": "text", "text": "hi"}]});
        let one = Encoding::O200kBase.count("hi");
        assert_eq!(one, 1);
        assert_eq!(count_answer_output(&answer, Encoding::O200kBase, 1500), 5);
    }

    #[test]
    fn unmetered_features_are_found() {
        assert_eq!(
            unmetered(&json!({"tools": [{"name": "f", "input_schema": {}}]})),
            None
        );
        assert_eq!(
            unmetered(&json!({"tools": [{"type": "bash_20250124", "name": "bash"}]})),
            None
        );
        assert_eq!(
            unmetered(&json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            Some(Unmetered::ServerTool)
        );
        assert_eq!(
            unmetered(&json!({"mcp_servers": [{"url": "https://x"}]})),
            Some(Unmetered::McpServers)
        );
        assert_eq!(
            unmetered(&json!({"container": "c1"})),
            Some(Unmetered::Container)
        );
        let file = json!({"messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "file", "file_id": "file_1"}}]}]});
        assert_eq!(unmetered(&file), Some(Unmetered::FileId));
    }

    #[test]
    fn server_tools_are_named_without_their_date_and_their_calls_read() {
        let body = json!({"tools": [{"name": "f", "input_schema": {}},
            {"type": "bash_20250124", "name": "bash"},
            {"type": "web_search_20250305", "name": "web_search"},
            {"type": "code_execution_20250825", "name": "code_execution"},
            {"type": "mcp_toolset", "mcp_server_name": "x"}]});
        let names: Vec<(usize, &str)> = server_tools(&body)
            .map(|(i, t)| (i, server_tool_name(t)))
            .collect();
        assert_eq!(
            names,
            [(2, "web_search"), (3, "code_execution"), (4, "mcp_toolset")]
        );
        assert_eq!(server_tool_name("web_fetch_20250910"), "web_fetch");
        assert_eq!(server_tool_name("web_fetch_2025"), "web_fetch_2025");
        let mut f = UsageFields::default();
        f.merge(&json!({"input_tokens": 5, "server_tool_use": {"web_search_requests": 0}}));
        f.merge(&json!({"output_tokens": 9,
            "server_tool_use": {"web_search_requests": 3, "web_fetch_requests": 1}}));
        let h = f.breakdown().hosted;
        assert_eq!(h.get(crate::money::HostedKind::WebSearch), 3);
        assert_eq!(h.get(crate::money::HostedKind::WebFetch), 1);
    }

    #[test]
    fn thinking_other_than_disabled_thinks() {
        assert!(!thinks(&json!({})));
        assert!(!thinks(&json!({"thinking": {"type": "disabled"}})));
        assert!(thinks(
            &json!({"thinking": {"type": "enabled", "budget_tokens": 2000}})
        ));
        assert!(thinks(&json!({"thinking": {"type": "adaptive"}})));
    }
}
