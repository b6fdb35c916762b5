//! Responses streams: SSE with named events and no `[DONE]` (OpenAI API
//! reference, "Streaming events"). The relay forwards every event byte
//! for byte; this state reads them:
//!
//! - Output is counted from the `delta` string of every `response.*.delta`
//!   event that carries model output ([`OUTPUT_DELTAS`]); an unknown delta
//!   type is counted too (and logged once per stream): over-counting costs
//!   the tenant a little, under-counting would let output pass unmetered.
//! - The terminal event is `response.completed`, `response.incomplete` or
//!   `response.failed`; its `response.usage` settles.
//! - For a clean cutoff, the state keeps the `response.created` object,
//!   the output items as delivered, and the last `sequence_number`, so the
//!   gateway can end the stream with a `response.incomplete` of the same
//!   response (same id, model, `created_at`, tools), its delivered output
//!   and usage, and the next sequence number.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Value};

use super::usage_from_value;
use crate::config::estimate::Encoding;
use crate::dialects::json_scan::{Fields, Scan};
use crate::dialects::UsageBreakdown;

/// Delta events that carry model output (text the model generated).
pub const OUTPUT_DELTAS: &[&str] = &[
    "response.output_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.mcp_call_arguments.delta",
    "response.code_interpreter_call_code.delta",
    "response.audio.transcript.delta",
];

/// Delta events whose `delta` is not text the model generated in tokens
/// (base64 audio): not counted.
const NOT_OUTPUT_DELTAS: &[&str] = &["response.audio.delta"];

/// The terminal events.
pub const TERMINAL: &[&str] = &[
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// What one event meant.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventOutcome {
    /// Output tokens counted from its delta.
    pub output_tokens: u64,
    /// The usage it carried (a terminal event's).
    pub usage: Option<UsageBreakdown>,
    /// It ended the response.
    pub terminal: bool,
    /// It was an `error` event.
    pub error: bool,
    /// The id of the response it created (`response.created`).
    pub created_id: bool,
}

/// What the relay reads of an output delta event (one of
/// [`OUTPUT_DELTAS`]), borrowed from its JSON (forward-only reader). An event with
/// other types than these does not parse and is read as a tree.
#[derive(Debug, serde::Deserialize)]
pub struct DeltaEvent<'a> {
    /// `type`.
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    /// `delta`: the text whose tokens are output.
    #[serde(borrow)]
    pub delta: Cow<'a, str>,
    /// `sequence_number`.
    #[serde(default)]
    pub sequence_number: Option<u64>,
    /// `output_index`.
    #[serde(default)]
    pub output_index: Option<u64>,
    /// `content_index`.
    #[serde(default)]
    pub content_index: Option<u64>,
}

impl<'a> DeltaEvent<'a> {
    /// Parses an event's data; `None` unless it is an output delta of these shapes.
    pub fn parse(data: &'a str) -> Option<DeltaEvent<'a>> {
        let mut s = Scan::new(data);
        let e = Self::scan(&mut s)?;
        s.end()?;
        OUTPUT_DELTAS.contains(&e.kind.as_ref()).then_some(e)
    }

    /// The event read by [`Scan`], as serde's derive above reads it.
    fn scan(s: &mut Scan<'a>) -> Option<Self> {
        let (mut kind, mut delta) = (None, None);
        let (mut sequence_number, mut output_index, mut content_index) = (None, None, None);
        let mut seen = Fields::default();
        s.object(|s, key| {
            match &*key {
                "type" => kind = seen.once(0, s, |s| s.string())?,
                "delta" => delta = seen.once(1, s, |s| s.string())?,
                "sequence_number" => sequence_number = seen.once(2, s, |s| s.u64())?,
                "output_index" => output_index = seen.once(3, s, |s| s.u64())?,
                "content_index" => content_index = seen.once(4, s, |s| s.u64())?,
                _ => s.skip()?,
            }
            Some(())
        })?;
        Some(DeltaEvent {
            kind: kind?,
            delta: delta?,
            sequence_number,
            output_index,
            content_index,
        })
    }
}

/// What the relay knows of one Responses stream.
#[derive(Debug, Default)]
pub struct StreamState {
    created: Option<Value>,
    items: BTreeMap<u64, Value>,
    done_items: std::collections::BTreeSet<u64>,
    last_sequence: Option<u64>,
    warned_unknown: bool,
}

impl StreamState {
    /// The response id, once `response.created` passed.
    pub fn response_id(&self) -> Option<&str> {
        self.created.as_ref()?.get("id")?.as_str()
    }

    /// Output tokens an event carries: the `delta` of an output delta event
    /// (an unknown delta type counts too, logged once per stream).
    pub fn output_of(&mut self, v: &Value, enc: Encoding) -> u64 {
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
        let Some(d) = v.get("delta").and_then(Value::as_str) else {
            return 0;
        };
        if !kind.ends_with(".delta") || NOT_OUTPUT_DELTAS.contains(&kind) {
            return 0;
        }
        if !OUTPUT_DELTAS.contains(&kind) && !self.warned_unknown {
            self.warned_unknown = true;
            tracing::warn!(
                event = kind,
                "unknown Responses delta event; counted as output"
            );
        }
        enc.count(d)
    }

    /// Reads one event's data (`v`, already parsed) whose output
    /// [`output_of`](Self::output_of) counted as `output_tokens`; the event
    /// is relayed.
    pub fn on_event(&mut self, v: &Value, output_tokens: u64) -> EventOutcome {
        let mut out = EventOutcome {
            output_tokens,
            ..EventOutcome::default()
        };
        self.sequence(v.get("sequence_number").and_then(Value::as_u64));
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
        let index = v.get("output_index").and_then(Value::as_u64);
        let delta = v.get("delta").and_then(Value::as_str);
        match kind {
            "response.created" if self.created.is_none() => {
                self.created = v.get("response").filter(|r| r.is_object()).cloned();
                out.created_id = self.response_id().is_some();
            }
            "error" => out.error = true,
            k if TERMINAL.contains(&k) => {
                out.terminal = true;
                out.usage = v
                    .pointer("/response/usage")
                    .filter(|u| u.is_object())
                    .map(usage_from_value)
                    .map(|mut u| {
                        // The uses of hosted tools: the final output's
                        // items, else the items delivered.
                        u.hosted = match v.pointer("/response/output") {
                            Some(Value::Array(items)) if !items.is_empty() => {
                                super::hosted_uses(items)
                            }
                            _ => super::hosted_uses(self.items.values()),
                        };
                        u
                    });
            }
            "response.output_item.added" => {
                if let (Some(i), Some(item)) = (index, v.get("item")) {
                    self.items.insert(i, item.clone());
                }
            }
            "response.output_item.done" => {
                if let (Some(i), Some(item)) = (index, v.get("item")) {
                    self.items.insert(i, item.clone());
                    self.done_items.insert(i);
                }
            }
            "response.content_part.added" => {
                let content = index
                    .and_then(|i| self.items.get_mut(&i))
                    .and_then(|item| item.get_mut("content"))
                    .and_then(Value::as_array_mut);
                if let (Some(content), Some(part)) = (content, v.get("part")) {
                    content.push(part.clone());
                }
            }
            _ => {}
        }
        if let Some(d) = delta.filter(|_| OUTPUT_DELTAS.contains(&kind)) {
            self.append_delta(
                kind,
                index,
                v.get("content_index").and_then(Value::as_u64),
                d,
            );
        }
        out
    }

    /// Reads an output delta event: what [`on_event`](Self::on_event)
    /// does with one, without its tree.
    pub fn on_delta(&mut self, e: &DeltaEvent<'_>) {
        self.sequence(e.sequence_number);
        self.append_delta(&e.kind, e.output_index, e.content_index, &e.delta);
    }

    fn sequence(&mut self, n: Option<u64>) {
        if let Some(n) = n {
            self.last_sequence = Some(self.last_sequence.map_or(n, |l| l.max(n)));
        }
    }

    /// Keeps the delivered text of items in progress (for the cutoff's output).
    fn append_delta(&mut self, kind: &str, index: Option<u64>, part: Option<u64>, d: &str) {
        let Some(item) = index.and_then(|i| self.items.get_mut(&i)) else {
            return;
        };
        let append = |v: Option<&mut Value>| {
            if let Some(Value::String(s)) = v {
                s.push_str(d);
            }
        };
        match kind {
            "response.output_text.delta" | "response.refusal.delta" => {
                let key = if kind == "response.refusal.delta" {
                    "refusal"
                } else {
                    "text"
                };
                let part = part.unwrap_or(0) as usize;
                append(
                    item.get_mut("content")
                        .and_then(|c| c.get_mut(part))
                        .and_then(|p| p.get_mut(key)),
                );
            }
            "response.function_call_arguments.delta" => append(item.get_mut("arguments")),
            "response.custom_tool_call_input.delta" => append(item.get_mut("input")),
            _ => {}
        }
    }

    /// The `response.incomplete` event that ends a cut-off stream: the
    /// `response.created` object with `status: "incomplete"`,
    /// `incomplete_details.reason: "max_output_tokens"`, the delivered
    /// output items (those in progress marked incomplete), the delivered
    /// usage, and the next sequence number.
    pub fn cutoff_event(&self, input_tokens: u64, output_tokens: u64) -> Bytes {
        let mut response = self.created.clone().unwrap_or_else(|| {
            json!({"id": "resp_budgetgate_cutoff", "object": "response", "created_at": 0,
                   "model": "", "output": [], "tools": []})
        });
        let output: Vec<Value> = self
            .items
            .iter()
            .map(|(i, item)| {
                let mut item = item.clone();
                if !self.done_items.contains(i) {
                    if let Some(o) = item.as_object_mut() {
                        o.insert("status".into(), json!("incomplete"));
                    }
                }
                item
            })
            .collect();
        if let Some(r) = response.as_object_mut() {
            r.insert("status".into(), json!("incomplete"));
            r.insert(
                "incomplete_details".into(),
                json!({"reason": "max_output_tokens"}),
            );
            r.insert("output".into(), Value::Array(output));
            r.insert(
                "usage".into(),
                json!({
                    "input_tokens": input_tokens,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": output_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": input_tokens + output_tokens,
                }),
            );
        }
        let event = json!({
            "type": "response.incomplete",
            "response": response,
            "sequence_number": self.next_sequence(),
        });
        Bytes::from(format!("event: response.incomplete\ndata: {event}\n\n"))
    }

    fn next_sequence(&self) -> u64 {
        self.last_sequence.map_or(0, |n| n + 1)
    }

    /// An `error` event: the fields the API documents (`type`, `code`,
    /// `message`, `param`, `sequence_number`) and an `error` object, on
    /// which the official SDKs raise `APIError`.
    pub fn error_event(&self, message: &str, code: &str) -> Bytes {
        let event = json!({
            "type": "error",
            "code": code,
            "message": message,
            "param": null,
            "sequence_number": self.next_sequence(),
            "error": {"type": "upstream_error", "code": code, "message": message},
        });
        Bytes::from(format!("event: error\ndata: {event}\n\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(s: &mut StreamState, events: &[Value]) -> (u64, Option<UsageBreakdown>) {
        let mut n = 0;
        let mut usage = None;
        for e in events {
            let tokens = s.output_of(e, Encoding::O200kBase);
            let o = s.on_event(e, tokens);
            n += o.output_tokens;
            usage = o.usage.or(usage);
        }
        (n, usage)
    }

    #[test]
    fn counts_output_deltas_and_builds_the_cutoff_from_created() {
        let mut s = StreamState::default();
        let (n, usage) = feed(
            &mut s,
            &[
                json!({"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":7,"model":"m","status":"in_progress","output":[],"tools":[]}}),
                json!({"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","status":"in_progress","content":[]}}),
                json!({"type":"response.content_part.added","sequence_number":2,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}),
                json!({"type":"response.output_text.delta","sequence_number":3,"output_index":0,"content_index":0,"delta":" the"}),
                json!({"type":"response.output_text.delta","sequence_number":4,"output_index":0,"content_index":0,"delta":" of"}),
                json!({"type":"response.audio.delta","sequence_number":5,"delta":"AAAA"}),
            ],
        );
        assert_eq!(n, 2);
        assert_eq!(usage, None);
        let ev = s.cutoff_event(10, 2);
        let text = std::str::from_utf8(&ev).unwrap();
        assert!(text.starts_with("event: response.incomplete\ndata: "));
        let v: Value =
            serde_json::from_str(text.trim_end().split_once("data: ").unwrap().1).unwrap();
        assert_eq!(v["sequence_number"], 6);
        assert_eq!(v["response"]["id"], "resp_1");
        assert_eq!(v["response"]["created_at"], 7);
        assert_eq!(v["response"]["status"], "incomplete");
        assert_eq!(v["response"]["output"][0]["content"][0]["text"], " the of");
        assert_eq!(v["response"]["output"][0]["status"], "incomplete");
        assert_eq!(v["response"]["usage"]["total_tokens"], 12);
    }

    #[test]
    fn terminal_usage_and_unknown_deltas() {
        let mut s = StreamState::default();
        let (n, usage) = feed(
            &mut s,
            &[
                json!({"type":"response.some_new_thing.delta","delta":" the"}),
                json!({"type":"response.failed","response":{"id":"r","usage":{"input_tokens":5,"output_tokens":3}}}),
            ],
        );
        assert_eq!(n, 1);
        assert_eq!(usage.map(|u| u.total()), Some(8));
    }

    mod generated {
        use super::*;
        use crate::dialects::json_scan::generate::{object, or_other, string};
        use proptest::prelude::*;

        fn event() -> BoxedStrategy<String> {
            let index = || or_other(any::<u32>().prop_map(|n| n.to_string()).boxed());
            let kind = prop_oneof![
                3 => proptest::sample::select(OUTPUT_DELTAS.to_vec()).prop_map(|k| format!("\"{k}\"")),
                1 => string(),
            ];
            object(vec![
                ("type", or_other(kind.boxed())),
                ("delta", or_other(string().boxed())),
                ("sequence_number", index()),
                ("output_index", index()),
                ("content_index", index()),
                ("item_id", string().boxed()),
            ])
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]
            /// The reader and serde's derive agree on every generated event.
            #[test]
            fn the_reader_reads_what_serde_reads(data in event()) {
                let ours = DeltaEvent::parse(&data).map(|e| format!("{e:?}"));
                let theirs = crate::dialects::stream_fields::parse::<DeltaEvent<'_>>(&data)
                    .filter(|e| OUTPUT_DELTAS.contains(&e.kind.as_ref()))
                    .map(|e| format!("{e:?}"));
                prop_assert_eq!(ours, theirs, "{}", data);
            }
        }
    }
}
