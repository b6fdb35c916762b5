//! Agent turns: function calls, their outputs and passed-back reasoning,
//! counted like messages (their text exactly, only the framing estimated).
//! Shared by chat (`tool_calls`) and Responses items.
//!
//! # Framing
//!
//! OpenAI publishes how these items are rendered for its open-weight
//! models, in the harmony format (<https://github.com/openai/harmony>,
//! "OpenAI Harmony Response Format" in the OpenAI Cookbook), the same
//! `<|start|>role<|message|>text<|end|>` frame as the chat rule's
//! 3 tokens per message:
//!
//! ```text
//! call:      <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS<|call|>
//! output:    <|start|>functions.NAME to=assistant<|channel|>commentary<|message|>OUTPUT<|end|>
//! reasoning: <|start|>assistant<|channel|>analysis<|message|>TEXT<|end|>
//! ```
//!
//! Call ids are not rendered. The constants below are the tokens of that
//! framing beyond [`TOKENS_PER_MESSAGE`], the role and the text, plus one
//! token where a name or text meets the framing (BPE may split there).
//! An output names its function, but only its call carries the name: each
//! call's name is charged a second time for its output, and an output whose
//! call is not in the request (a `previous_response_id` turn) is charged
//! the longest function name the request knows, or [`UNKNOWN_NAME_TOKENS`].

use serde_json::Value;

use super::input::Tally;
use super::TOKENS_PER_MESSAGE;
use crate::config::estimate::Encoding;

/// Framing of a call beyond 3 + `assistant` + name + arguments:
/// `<|channel|>`, `commentary`, ` to=functions.`, ` `, `<|constrain|>`,
/// `json`, and one boundary token.
pub const FUNCTION_CALL_FRAMING_TOKENS: u64 = 9;
/// Framing of an output beyond 3 + name + output: `functions.`,
/// ` to=assistant`, `<|channel|>`, `commentary`, and one boundary token.
pub const FUNCTION_OUTPUT_FRAMING_TOKENS: u64 = 8;
/// Framing of a reasoning item beyond 3 + `assistant` + its text:
/// `<|channel|>`, `analysis`.
pub const REASONING_FRAMING_TOKENS: u64 = 2;
/// Tokens charged for the name of a function the request does not name.
pub const UNKNOWN_NAME_TOKENS: u64 = 16;

/// The calls and outputs of one request's input.
#[derive(Debug, Default)]
pub(super) struct Calls {
    /// Tokens of every call's name (charged again for its output).
    names: u64,
    /// Tokens of the longest call name.
    longest: u64,
    calls: u64,
    outputs: u64,
}

impl Calls {
    /// One call of function `name` with `arguments` (text the model wrote).
    pub(super) fn call(&mut self, t: &mut Tally, enc: Encoding, name: &str, arguments: &str) {
        let name = enc.count_cached(name);
        self.names = self.names.saturating_add(name);
        self.longest = self.longest.max(name);
        self.calls = self.calls.saturating_add(1);
        t.exact(
            TOKENS_PER_MESSAGE
                .saturating_add(enc.count_cached("assistant"))
                .saturating_add(FUNCTION_CALL_FRAMING_TOKENS)
                .saturating_add(name)
                .saturating_add(enc.count_cached(arguments)),
        );
    }

    /// One output item's frame; its content is counted by the caller.
    /// (A chat `tool` message is a plain message under the published rule,
    /// not one of these.)
    pub(super) fn output(&mut self, t: &mut Tally) {
        self.outputs = self.outputs.saturating_add(1);
        t.exact(TOKENS_PER_MESSAGE.saturating_add(FUNCTION_OUTPUT_FRAMING_TOKENS));
    }

    /// Tool definitions found among the input items (Codex's
    /// `additional_tools`): their names count as the request's own for
    /// outputs whose call is not in the request.
    pub(super) fn tools(&mut self, enc: Encoding, tools: Option<&Value>) {
        self.longest = self.longest.max(longest_tool_name(tools, enc));
    }

    /// Charges the names outputs carry; `tools` are the request's tool
    /// definitions (for the name of a call made in an earlier turn).
    pub(super) fn finish(&self, t: &mut Tally, enc: Encoding, tools: Option<&Value>) {
        if self.outputs == 0 {
            return;
        }
        let unmatched = self.outputs.saturating_sub(self.calls);
        let mut names = self.names;
        if unmatched > 0 {
            let longest = longest_tool_name(tools, enc).max(self.longest);
            let each = if longest == 0 {
                UNKNOWN_NAME_TOKENS
            } else {
                longest
            };
            names = names.saturating_add(unmatched.saturating_mul(each));
        }
        t.exact(names);
    }
}

/// Tokens of the longest function name among tool definitions (Responses
/// `{"name"}` and chat `{"function": {"name"}}` shapes), members of
/// Responses `namespace` groups included (a call names its function; the
/// group's name is charged as its own: `functions.NAME` already frames
/// one namespace).
fn longest_tool_name(tools: Option<&Value>, enc: Encoding) -> u64 {
    fn walk(tools: &[Value], enc: Encoding, depth: usize) -> u64 {
        tools
            .iter()
            .map(|tool| {
                let own = tool
                    .get("name")
                    .or_else(|| tool.get("function").and_then(|f| f.get("name")))
                    .and_then(Value::as_str)
                    .map_or(0, |name| enc.count_cached(name));
                let members = match tool.get("tools") {
                    // Nesting is bounded by the Responses checks; this
                    // bound only keeps a hostile body from recursing far.
                    Some(Value::Array(m)) if depth < 8 => walk(m, enc, depth + 1),
                    _ => 0,
                };
                own.max(members)
            })
            .max()
            .unwrap_or(0)
    }
    match tools {
        Some(Value::Array(tools)) => walk(tools, enc, 0),
        _ => 0,
    }
}

/// One passed-back reasoning item: the text of its `summary` and `content`
/// parts, one frame, one separator token between parts.
/// `encrypted_content` is opaque (not text the gateway can count).
pub(super) fn reasoning(t: &mut Tally, enc: Encoding, item: &serde_json::Map<String, Value>) {
    let mut text = 0u64;
    let mut parts = 0u64;
    for key in ["summary", "content"] {
        if let Some(Value::Array(list)) = item.get(key) {
            for p in list {
                if let Some(s) = p.get("text").and_then(Value::as_str) {
                    text = text.saturating_add(enc.count_cached(s));
                    parts = parts.saturating_add(1);
                }
            }
        }
    }
    t.exact(
        TOKENS_PER_MESSAGE
            .saturating_add(enc.count_cached("assistant"))
            .saturating_add(REASONING_FRAMING_TOKENS)
            .saturating_add(text)
            .saturating_add(parts.saturating_sub(1)),
    );
}
