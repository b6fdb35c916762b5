//! Metering a Messages event stream (Anthropic API reference, "Streaming
//! Messages"): `message_start`, then per content block
//! `content_block_start`, `content_block_delta`s and `content_block_stop`,
//! then `message_delta` (stop reason, cumulative usage) and
//! `message_stop`; `ping` and `error` may come at any point. Every event
//! is relayed as it came; this state only reads them.
//!
//! Output is counted from `text_delta`, `input_json_delta` and
//! `thinking_delta` (a `signature_delta` is not output the client can
//! count). Usage fields come from `message.usage` of `message_start` and
//! then from each `message_delta`'s `usage`, last value wins, never summed;
//! so are the server tool calls (`usage.server_tool_use`), and a stream
//! that ends before its final usage is charged at least the
//! `server_tool_use` blocks it started.
//!
//! A cutoff ends the message the way the API ends one that reached
//! `max_tokens`: `content_block_stop` for a block still open,
//! `message_delta` with `stop_reason: "max_tokens"` and the output
//! delivered, `message_stop`. The SDKs accumulate that into a final
//! message without raising.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::{json, Value};

use super::{block_tokens, scale, UsageFields};
use crate::config::estimate::Encoding;
use crate::dialects::json_scan::{Fields, Scan};
use crate::dialects::UsageBreakdown;

/// What the relay learns from one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Any event that does not end the stream.
    Event,
    /// `message_stop`.
    Stop,
    /// An `error` event.
    Error,
}

/// What the relay reads of a `content_block_delta` event, borrowed from
/// its JSON by the forward-only reader: the delta's output string, as [`block_tokens`]
/// picks it. Other events, and deltas of other shapes (a `tool_use`
/// delta, a non-string `text`), do not parse and are read as trees.
#[derive(Debug, serde::Deserialize)]
pub struct BlockDelta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    delta: crate::dialects::stream_fields::Object<DeltaFields<'a>>,
}

#[derive(Debug, serde::Deserialize)]
struct DeltaFields<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    partial_json: Option<Cow<'a, str>>,
}

impl<'a> BlockDelta<'a> {
    /// Parses an event's data; `None` unless it is a `content_block_delta`
    /// whose output is a string (or none).
    pub fn parse(data: &'a str) -> Option<BlockDelta<'a>> {
        let mut s = Scan::new(data);
        let e = Self::scan(&mut s)?;
        s.end()?;
        let known = !matches!(
            e.delta.0.kind.as_deref(),
            Some("tool_use" | "server_tool_use")
        );
        (e.kind == "content_block_delta" && known).then_some(e)
    }

    /// The event read by [`Scan`], as serde's derive above reads it.
    fn scan(s: &mut Scan<'a>) -> Option<Self> {
        let (mut kind, mut delta) = (None, None);
        let mut seen = Fields::default();
        s.object(|s, key| {
            match &*key {
                "type" => kind = seen.once(0, s, |s| s.string())?,
                "delta" => {
                    delta = seen.once(1, s, |s| {
                        let mut d = DeltaFields {
                            kind: None,
                            text: None,
                            thinking: None,
                            partial_json: None,
                        };
                        let mut seen = Fields::default();
                        s.object(|s, key| {
                            match &*key {
                                "type" => d.kind = seen.once(0, s, |s| s.string())?,
                                "text" => d.text = seen.once(1, s, |s| s.string())?,
                                "thinking" => d.thinking = seen.once(2, s, |s| s.string())?,
                                "partial_json" => {
                                    d.partial_json = seen.once(3, s, |s| s.string())?
                                }
                                _ => s.skip()?,
                            }
                            Some(())
                        })?;
                        Some(crate::dialects::stream_fields::Object(d))
                    })?
                }
                _ => s.skip()?,
            }
            Some(())
        })?;
        Some(BlockDelta {
            kind: kind?,
            delta: delta?,
        })
    }

    /// The delta's output string ("" when it carries none).
    pub fn output(&self) -> &str {
        let d = &self.delta.0;
        let field = match d.kind.as_deref() {
            Some("text" | "text_delta") => &d.text,
            Some("thinking" | "thinking_delta") => &d.thinking,
            Some("input_json_delta") => &d.partial_json,
            _ => return "",
        };
        field.as_deref().unwrap_or("")
    }
}

/// The metering state of one Messages stream.
#[derive(Debug, Clone, Default)]
pub struct MessagesStream {
    usage: UsageFields,
    /// Output counted from deltas, tiktoken tokens before the ratio
    /// (scaled once when read: a ceiling per delta would count one-token
    /// deltas twice at a ratio of 1.5).
    raw_counted: u64,
    /// Index of the content block started and not yet stopped.
    open_block: Option<u64>,
    /// A `message_delta` with a stop reason passed: the usage it carries is final.
    stopped: bool,
    ratio: u64,
    /// Server tool calls whose `server_tool_use` block started: what a
    /// stream that ends before its final usage is charged for them.
    calls_seen: crate::money::HostedCalls,
}

impl MessagesStream {
    /// A stream whose text is counted at `ratio` per mille.
    pub fn new(ratio: u64) -> Self {
        Self {
            ratio,
            ..Self::default()
        }
    }

    /// Output counted from deltas so far, in the model's tokens.
    pub fn counted(&self) -> u64 {
        scale(self.raw_counted, self.ratio)
    }

    /// Adds output counted elsewhere (raw tiktoken tokens, before the ratio).
    pub fn add_raw(&mut self, tokens: u64) {
        self.raw_counted += tokens;
    }

    /// The most [`counted`](Self::counted) can be once `raw_at_most` more
    /// raw tokens are added: the ratio applied once to the sum.
    pub fn counted_at_most(&self, raw_at_most: u64) -> u64 {
        scale(self.raw_counted.saturating_add(raw_at_most), self.ratio)
    }

    /// True when [`used`](Self::used) or the cutoff reads the gateway's
    /// count: the stream has no final usage with its output.
    pub fn needs_count(&self) -> bool {
        !self.stopped || self.usage.output().is_none() || self.usage.output_rejected()
    }

    /// True once the message has its stop reason (no more output can come).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Reads one event's data.
    pub fn on_event(&mut self, v: &Value, enc: Encoding) -> Seen {
        match v.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(u) = v.pointer("/message/usage") {
                    self.usage.merge(u);
                }
            }
            Some("content_block_start") => {
                self.open_block = Some(v.get("index").and_then(Value::as_u64).unwrap_or(0));
                // A block may start with content (a tool_use name, text).
                if let Some(b) = v.get("content_block") {
                    self.raw_counted += block_tokens(b, enc);
                    if b.get("type").and_then(Value::as_str) == Some("server_tool_use") {
                        let kind = b.get("name").and_then(Value::as_str);
                        if let Some(k) = kind.and_then(crate::money::HostedKind::of_tool_type) {
                            self.calls_seen.add(k, 1);
                        }
                    }
                }
            }
            Some("content_block_delta") => {
                if let Some(d) = v.get("delta") {
                    self.raw_counted += block_tokens(d, enc);
                }
            }
            Some("content_block_stop") => self.open_block = None,
            Some("message_delta") => {
                if let Some(u) = v.get("usage") {
                    self.usage.merge(u);
                }
                if v.pointer("/delta/stop_reason")
                    .is_some_and(|r| !r.is_null())
                {
                    self.stopped = true;
                }
            }
            Some("message_stop") => return Seen::Stop,
            Some("error") => return Seen::Error,
            _ => {}
        }
        Seen::Event
    }

    /// Output delivered so far: the upstream's last count or the
    /// gateway's, whichever is larger (`message_start` reports 1 before
    /// any output, and a cumulative `message_delta` may lag the deltas).
    pub fn delivered_output(&self) -> u64 {
        self.usage.output().unwrap_or(0).max(self.counted())
    }

    /// What the stream used. Once the final `message_delta` passed, its
    /// usage is the provider's count; a stream that ended before it is
    /// charged the output delivered.
    pub fn used(&self) -> UsageBreakdown {
        let mut u = self.usage.breakdown();
        if !self.stopped {
            u.output = Some(self.delivered_output());
            for k in crate::money::HostedKind::ALL {
                u.hosted.set(k, u.hosted.get(k).max(self.calls_seen.get(k)));
            }
        } else if u.output.is_none() {
            u.output = Some(self.counted());
        }
        u
    }

    /// The events that end a message cut off by the gateway.
    pub fn cutoff_frames(&self) -> Vec<Bytes> {
        let mut out = Vec::with_capacity(3);
        if let Some(index) = self.open_block {
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        out.push(event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                "usage": {"output_tokens": self.delivered_output()}
            }),
        ));
        out.push(completion_frame());
        out
    }
}

/// `message_stop`, appended when the upstream ended a finished message
/// without it.
pub fn completion_frame() -> Bytes {
    event("message_stop", &json!({"type": "message_stop"}))
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(s: &mut MessagesStream, events: &[Value]) {
        for e in events {
            s.on_event(e, Encoding::O200kBase);
        }
    }

    #[test]
    fn usage_last_value_wins_and_cumulative_deltas_settle_the_last() {
        let mut s = MessagesStream::new(1000);
        feed(
            &mut s,
            &[
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello there"}}),
                json!({"type": "message_delta", "delta": {"stop_reason": null}, "usage": {"output_tokens": 5}}),
                json!({"type": "message_delta", "delta": {"stop_reason": null}, "usage": {"output_tokens": 10}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}}),
            ],
        );
        let u = s.used();
        assert_eq!(u.output, Some(15));
        assert_eq!(u.total(), 24);
    }

    #[test]
    fn server_tool_calls_settle_as_reported_or_as_started_when_cut() {
        use crate::money::HostedKind::WebSearch;
        let start = json!({"type": "message_start", "message": {"usage": {"input_tokens": 9,
            "output_tokens": 1, "server_tool_use": {"web_search_requests": 0}}}});
        let call = json!({"type": "content_block_start", "index": 0, "content_block":
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}});
        let mut s = MessagesStream::new(1000);
        feed(&mut s, &[start.clone(), call.clone(), call.clone()]);
        assert_eq!(s.used().hosted.get(WebSearch), 2, "cut: the calls started");
        feed(
            &mut s,
            &[
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 5, "server_tool_use": {"web_search_requests": 3}}}),
            ],
        );
        assert_eq!(s.used().hosted.get(WebSearch), 3, "the final count");
    }

    #[test]
    fn the_ratio_applies_once_to_the_total_of_one_token_deltas() {
        let mut s = MessagesStream::new(1500);
        s.on_event(
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            Encoding::O200kBase,
        );
        let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " word"}});
        assert_eq!(Encoding::O200kBase.count(" word"), 1);
        for _ in 0..288 {
            s.on_event(&delta, Encoding::O200kBase);
        }
        assert_eq!(s.counted(), 432, "ceil(288 × 1.5), not 288 × ceil(1.5)");
        assert_eq!(s.used().output, Some(432));
        let cutoff = String::from_utf8(s.cutoff_frames()[1].to_vec()).unwrap();
        assert!(cutoff.contains("\"output_tokens\":432"), "{cutoff}");
    }

    #[test]
    fn signature_is_not_output_and_cutoff_closes_the_open_block() {
        let mut s = MessagesStream::new(1000);
        feed(
            &mut s,
            &[
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 1}}}),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "a very long opaque signature string"}}),
            ],
        );
        assert_eq!(s.counted(), 0);
        feed(
            &mut s,
            &[
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "one two three"}}),
            ],
        );
        let n = Encoding::O200kBase.count("one two three");
        assert_eq!(s.counted(), n);
        let frames: Vec<String> = s
            .cutoff_frames()
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        assert_eq!(frames.len(), 3);
        assert!(frames[0].starts_with("event: content_block_stop\n"));
        assert!(frames[1].contains("\"stop_reason\":\"max_tokens\""));
        assert!(frames[1].contains(&format!("\"output_tokens\":{n}")));
        assert_eq!(
            frames[2],
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        assert_eq!(s.used().output, Some(n));
    }

    mod generated {
        use super::*;
        use crate::dialects::json_scan::generate::{object, or_other, string, value};
        use proptest::prelude::*;

        fn event() -> BoxedStrategy<String> {
            let delta_kind = prop_oneof![
                proptest::sample::select(vec![
                    "text_delta",
                    "thinking_delta",
                    "input_json_delta",
                    "text",
                    "tool_use",
                    "signature_delta",
                ])
                .prop_map(|k| format!("\"{k}\"")),
                string(),
            ];
            let delta = object(vec![
                ("type", or_other(delta_kind.boxed())),
                ("text", or_other(string().boxed())),
                ("thinking", or_other(string().boxed())),
                ("partial_json", or_other(string().boxed())),
            ]);
            let kind = prop_oneof![
                3 => Just("\"content_block_delta\"".to_string()),
                1 => string(),
            ];
            object(vec![
                ("type", or_other(kind.boxed())),
                ("index", value().boxed()),
                ("delta", or_other(delta)),
            ])
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]
            /// The reader and serde's derive agree on every generated event.
            #[test]
            fn the_reader_reads_what_serde_reads(data in event()) {
                let ours = BlockDelta::parse(&data).map(|e| format!("{e:?}"));
                let theirs = crate::dialects::stream_fields::parse::<BlockDelta<'_>>(&data)
                    .filter(|e| {
                        e.kind == "content_block_delta"
                            && !matches!(e.delta.0.kind.as_deref(), Some("tool_use" | "server_tool_use"))
                    })
                    .map(|e| format!("{e:?}"));
                prop_assert_eq!(ours, theirs, "{}", data);
            }
        }
    }
}
