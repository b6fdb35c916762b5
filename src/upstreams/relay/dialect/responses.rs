//! OpenAI Responses streams: named events, no choices and no `[DONE]`
//! ([`crate::dialects::responses::stream`]). Output comes in the `delta`
//! of the output delta events (read without a tree for the bound), the
//! usage in the terminal event (`response.completed`, `.incomplete`,
//! `.failed`), which ends the stream; `response.created` names the stored
//! response. A cutoff ends the stream with a `response.incomplete` of the
//! same response.

use bytes::Bytes;
use serde_json::Value;

use super::{StreamDialect, Verdict};
use crate::dialects::responses::stream::{DeltaEvent, StreamState};
use crate::upstreams::relay::delta_counts;
use crate::upstreams::relay::processor::Tally;

/// The state of one Responses stream.
#[derive(Debug, Default)]
pub struct ResponsesStream {
    events: StreamState,
}

impl ResponsesStream {
    /// An output delta read without its tree ([`DeltaEvent`]): what
    /// [`on_event`](Self::on_event) does with it, the delta kept pending
    /// unless the cap needs it counted.
    fn on_output_delta(&mut self, t: &mut Tally, e: &DeltaEvent<'_>) -> Verdict {
        let bytes = e.delta.len() as u64;
        if t.within_cap(t.output_tokens, t.pending.bytes(), bytes) {
            t.pending.push_delta(0, [e.delta.as_ref()]);
        } else {
            t.count_pending();
            let tokens = delta_counts::count(t.encoding, &e.delta);
            if t.passes_cap_overall(tokens) {
                t.over_cap = true;
                return Verdict::Drop;
            }
            t.commit(0, tokens);
        }
        self.events.on_delta(e);
        Verdict::Forward
    }

    /// One event read as a tree: counted, terminal usage kept, relayed as
    /// is, unless its output passes the enforced cap (then not relayed).
    fn on_event(&mut self, t: &mut Tally, v: &Value) -> Verdict {
        let tokens = self.events.output_of(v, t.encoding);
        if t.cap.is_some() && tokens > 0 {
            // The cap is checked on exact counts.
            t.count_pending();
        }
        if t.passes_cap_overall(tokens) {
            t.over_cap = true;
            return Verdict::Drop;
        }
        t.largest_delta = t.largest_delta.max(tokens);
        let o = self.events.on_event(v, tokens);
        t.output_tokens += o.output_tokens;
        if o.usage.is_some() {
            t.usage = o.usage;
        }
        if o.terminal {
            t.done = true;
            t.finished.insert(0);
        }
        if o.created_id {
            t.new_object = self.events.response_id().map(str::to_string);
        }
        if o.error
            || v.get("error")
                .is_some_and(|e| !e.is_null() && v.get("type").is_none())
        {
            t.errored = true;
        }
        Verdict::Forward
    }
}

impl StreamDialect for ResponsesStream {
    fn on_data(&mut self, t: &mut Tally, data: &str) -> Verdict {
        if data == "[DONE]" {
            // Not the API's ending, but some compatible servers send it.
            t.done = true;
            return Verdict::Forward;
        }
        if !t.exact {
            if let Some(e) = DeltaEvent::parse(data) {
                return self.on_output_delta(t, &e);
            }
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            tracing::debug!("dropping an SSE frame whose data is not JSON");
            return Verdict::Drop;
        };
        self.on_event(t, &v)
    }

    fn error_frame(&self, message: &str, code: &str) -> Bytes {
        self.events.error_event(message, code)
    }

    /// Never needed: the terminal event that finishes the response ends
    /// the stream.
    fn closing_frames(&mut self, _t: &mut Tally) -> Bytes {
        Bytes::new()
    }

    fn cutoff_frames(&mut self, t: &mut Tally, prompt_tokens: u64) -> Vec<Bytes> {
        vec![self.events.cutoff_event(prompt_tokens, t.output_tokens)]
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::{json, Value};

    use crate::config::estimate::Encoding;
    use crate::dialects::usage::UsageBounds;
    use crate::dialects::Dialect;
    use crate::upstreams::relay::StreamProcessor;

    fn sse(event: &str, data: Value) -> Bytes {
        Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
    }

    /// A Responses stream whose terminal usage is no count or beyond the
    /// request's bounds settles at the input estimate and the output the
    /// gateway counted.
    #[test]
    fn a_responses_stream_with_bad_usage_settles_the_gateways_count() {
        let bounds = UsageBounds::new(40, Some(100), 1, None, None);
        let mut p = StreamProcessor::new(Dialect::Responses, Encoding::O200kBase, false, 1)
            .with_usage_bounds(bounds)
            .with_exact_counting();
        p.on_frame(sse(
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "delta": "Hello there"}),
        ));
        p.on_frame(sse(
            "response.completed",
            json!({"type": "response.completed", "response": {"usage": {"input_tokens": -3, "output_tokens": 1e30}}}),
        ));
        let used = p.used(40);
        assert_eq!((used.input(), used.output), (Some(40), Some(2)));
        assert_eq!(
            (used.rejected_input, used.rejected_output),
            (Some("input_tokens"), Some("output_tokens"))
        );
    }
}
