//! Anthropic Messages streams (and Bedrock's and Vertex's, translated to
//! the same named events): every event is relayed as it came, `event:`
//! line included; `content_block_delta`s carry the output, `message_start`
//! and `message_delta` the usage, `message_stop` ends the stream. The
//! output is counted in tiktoken tokens and scaled once to the model's
//! (`token_ratio`), so this stream keeps its own count
//! ([`MessagesStream`]) rather than the tally's. The gateway does not
//! enforce a cap on Messages: Anthropic's upstreams honour `max_tokens`.

use bytes::Bytes;
use serde_json::Value;

use super::{StreamDialect, Verdict};
use crate::dialects::anthropic::stream::{completion_frame, BlockDelta, MessagesStream, Seen};
use crate::dialects::UsageBreakdown;
use crate::upstreams::relay::processor::Tally;

/// The state of one Messages stream.
#[derive(Debug)]
pub struct MessagesEvents {
    m: MessagesStream,
}

impl Default for MessagesEvents {
    fn default() -> Self {
        Self {
            m: MessagesStream::new(1000),
        }
    }
}

impl StreamDialect for MessagesEvents {
    fn on_data(&mut self, t: &mut Tally, data: &str) -> Verdict {
        if !t.exact {
            if let Some(d) = BlockDelta::parse(data) {
                t.pending.push_delta(0, [d.output()]);
                return Verdict::Forward;
            }
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => match self.m.on_event(&v, t.encoding) {
                Seen::Stop => t.done = true,
                Seen::Error => t.errored = true,
                Seen::Event => {}
            },
            Err(_) => tracing::debug!("relaying a Messages event whose data is not JSON"),
        }
        Verdict::Forward
    }

    fn count_pending(&mut self, t: &mut Tally) {
        let mut pending = std::mem::take(&mut t.pending);
        pending.count(t.encoding, |_, tokens| self.m.add_raw(tokens));
        t.pending = pending;
    }

    fn counted(&self, _t: &Tally) -> u64 {
        self.m.counted()
    }

    fn counted_at_most(&self, _t: &Tally, pending_at_most: u64) -> u64 {
        self.m.counted_at_most(pending_at_most)
    }

    fn set_token_ratio(&mut self, ratio: u64) {
        self.m = MessagesStream::new(ratio);
    }

    fn reads_count(&self, _t: &Tally) -> bool {
        self.m.needs_count()
    }

    fn reported(&self, _t: &Tally) -> UsageBreakdown {
        self.m.used()
    }

    fn all_finished(&self, _t: &Tally) -> bool {
        self.m.stopped()
    }

    fn error_frame(&self, message: &str, _code: &str) -> Bytes {
        // Anthropic's `error` event: the SDKs raise an APIStatusError on it.
        crate::dialects::anthropic::error::error_event("api_error", message)
    }

    fn closing_frames(&mut self, _t: &mut Tally) -> Bytes {
        completion_frame()
    }

    fn cutoff_frames(&mut self, _t: &mut Tally, _prompt_tokens: u64) -> Vec<Bytes> {
        self.m.cutoff_frames()
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

    /// A Messages stream whose usage is no count (negative input, 2^64 −
    /// 1 output) or beyond the request's bounds settles at the input
    /// estimate and the output the gateway counted.
    #[test]
    fn a_messages_stream_with_bad_usage_settles_the_gateways_count() {
        let bounds = UsageBounds::new(40, Some(100), 1, None, None);
        for (input, output) in [
            (json!(-5), json!(18446744073709551615u64)),
            (json!(2.5), json!(-1)),
            (json!(200_000), json!(500)),
        ] {
            let mut p = StreamProcessor::new(Dialect::Messages, Encoding::O200kBase, false, 1)
                .with_usage_bounds(bounds);
            let frames = [
                sse(
                    "message_start",
                    json!({"type": "message_start", "message": {"usage": {"input_tokens": input, "output_tokens": 1}}}),
                ),
                sse(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                sse(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello there"}}),
                ),
                sse(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                sse(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}}),
                ),
                sse("message_stop", json!({"type": "message_stop"})),
            ];
            for f in frames {
                p.on_frame(f);
            }
            let used = p.used(40);
            assert_eq!(
                (used.input(), used.output),
                (Some(40), Some(2)),
                "{input} {output}"
            );
            assert!(used.rejected_input.is_some() && used.rejected_output.is_some());
        }
    }
}
