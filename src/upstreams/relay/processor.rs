//! The metering state machine of a stream: what each frame means (usage,
//! output, finish), when to ask for more output, and the frames of a clean
//! ending. Free of I/O, so it can be tested and fuzzed on any split of a
//! recorded stream; [`super::run`] drives it.
//!
//! By default the processor meters by a bound ([`super::bound`]): the
//! common delta events are read for their output strings only (no JSON
//! tree) and kept untokenised until a decision needs their exact count.
//! [`StreamProcessor::with_exact_counting`] reads every event as a tree
//! and counts every delta as it passes, as the relay did before; the
//! differential tests hold the two to the same bytes, cutoffs and counts.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::{json, Value};

use super::super::sse::parse_frame;
use super::bound::{tokens_at_most, PendingOutput};
use super::{delta_counts, error_frame};
use crate::config::estimate::Encoding;
use crate::dialects::anthropic::stream::{self as messages, BlockDelta, MessagesStream, Seen};
use crate::dialects::chat_stream::Chunk;
use crate::dialects::responses::stream::{DeltaEvent, StreamState};
use crate::dialects::usage::UsageBounds;
use crate::dialects::{Dialect, Part, UsageBreakdown};

/// What the processor does with one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameAction {
    /// Send these bytes to the client.
    Forward(Bytes),
    /// Send nothing (stripped usage chunk, unparseable or field-only frame).
    Drop,
}

/// The metering state machine, independent of I/O so it can be tested on
/// any split of a recorded stream.
#[derive(Debug)]
pub struct StreamProcessor {
    dialect: Dialect,
    encoding: Encoding,
    client_wants_usage: bool,
    choices: u64,
    output_tokens: u64,
    usage: Option<UsageBreakdown>,
    finished: BTreeSet<u64>,
    done: bool,
    errored: bool,
    id: Option<String>,
    model: Option<String>,
    created: Option<i64>,
    /// Named-event dialects (Responses): what the events said so far.
    events: StreamState,
    /// The id of the object the stream created, once, for the meter.
    new_object: Option<String>,
    /// Prompt tokens the gateway reports when the upstream reports none.
    prompt_tokens: u64,
    /// The output cap sent upstream, per choice, when the gateway enforces it.
    cap: Option<u64>,
    /// Output counted per requested choice.
    per_choice: Vec<u64>,
    /// Largest delta counted so far (the cap's tolerance is at least one).
    largest_delta: u64,
    over_cap: bool,
    /// Messages streams: events, not choices.
    messages: Option<MessagesStream>,
    /// Every event read as a tree and every delta counted as it passes.
    exact: bool,
    /// Deltas delivered and not yet counted (never with `exact`).
    pending: PendingOutput,
    /// The most the upstream's usage may report.
    bounds: UsageBounds,
}

impl StreamProcessor {
    /// A processor for a stream of `choices` choices.
    pub fn new(
        dialect: Dialect,
        encoding: Encoding,
        client_wants_usage: bool,
        choices: u64,
    ) -> Self {
        Self {
            dialect,
            encoding,
            client_wants_usage,
            choices: choices.max(1),
            output_tokens: 0,
            usage: None,
            finished: BTreeSet::new(),
            done: false,
            errored: false,
            id: None,
            model: None,
            created: None,
            messages: (dialect == Dialect::Messages).then(|| MessagesStream::new(1000)),
            prompt_tokens: 0,
            cap: None,
            per_choice: vec![0; choices.max(1) as usize],
            largest_delta: 0,
            over_cap: false,
            events: StreamState::default(),
            new_object: None,
            exact: false,
            pending: PendingOutput::new(choices.max(1) as usize),
            bounds: UsageBounds::ANY,
        }
    }

    /// The most the upstream's usage may report: a side above them is
    /// settled at the gateway's count.
    pub fn with_usage_bounds(mut self, bounds: UsageBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Reads every event as a JSON tree and counts every delta as it
    /// passes: the relay before issue 40, kept as the reference the
    /// bound-first processor is tested against.
    pub fn with_exact_counting(mut self) -> Self {
        self.exact = true;
        self
    }

    /// The id of an object the stream created since the last call.
    pub fn take_created(&mut self) -> Option<String> {
        self.new_object.take()
    }

    /// The error event this dialect's clients raise on.
    pub fn error_frame(&self, message: &str, code: &str) -> Bytes {
        if self.messages.is_some() {
            // Anthropic's `error` event: the SDKs raise an APIStatusError on it.
            crate::dialects::anthropic::error::error_event("api_error", message)
        } else if self.dialect.named_events() {
            self.events.error_event(message, code)
        } else {
            error_frame(message, code)
        }
    }

    /// Sets the prompt tokens reported by the gateway's own usage chunk
    /// (when the upstream sends none) and the per-choice output cap to
    /// enforce (`None`: the upstream is trusted to honour the cap it got).
    pub fn with_limits(mut self, prompt_tokens: u64, cap: Option<u64>) -> Self {
        self.prompt_tokens = prompt_tokens;
        self.cap = cap;
        self
    }

    /// True once a choice's output passed the enforced cap plus its
    /// tolerance; the frame that passed it was not relayed.
    pub fn is_over_cap(&self) -> bool {
        self.over_cap
    }

    /// The cap's tolerance: our tokenizer is not the model's, so a choice
    /// may run `max(2 % of the cap, one delta)` past it before it is cut.
    pub fn cap_tolerance(cap: u64, largest_delta: u64) -> u64 {
        cap.div_ceil(50).max(largest_delta)
    }

    /// Counts text at `ratio` per mille (Messages; see
    /// [`crate::dialects::anthropic`]).
    pub fn with_token_ratio(mut self, ratio: u64) -> Self {
        if let Some(m) = &mut self.messages {
            *m = MessagesStream::new(ratio);
        }
        self
    }

    /// Output tokens counted from deltas so far, summed over choices
    /// (the pending deltas are counted now).
    pub fn output_tokens(&mut self) -> u64 {
        self.count_pending();
        match &self.messages {
            Some(m) => m.counted(),
            None => self.output_tokens,
        }
    }

    /// The most [`output_tokens`](Self::output_tokens) can be, without
    /// counting the pending deltas.
    pub fn output_at_most(&self) -> u64 {
        let pending = tokens_at_most(self.encoding, self.pending.bytes());
        match &self.messages {
            Some(m) => m.counted_at_most(pending),
            None => self.output_tokens.saturating_add(pending),
        }
    }

    /// True when the output delivered so far is at least `tokens`: decided
    /// by the bound while it is below, else by counting the pending deltas.
    pub fn output_reaches(&mut self, tokens: u64) -> bool {
        self.output_at_most() >= tokens && self.output_tokens() >= tokens
    }

    /// The output counted so far when nothing is pending; `None` when the
    /// stream was settled without counting its deltas.
    pub fn counted_output(&self) -> Option<u64> {
        self.pending.is_empty().then(|| match &self.messages {
            Some(m) => m.counted(),
            None => self.output_tokens,
        })
    }

    /// Counts the pending deltas exactly, each on its own, in the order
    /// they were delivered, as if each had been counted as it passed.
    fn count_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.count(self.encoding, |choice, tokens| match &mut self.messages {
            Some(m) => m.add_raw(tokens),
            None => self.commit(choice, tokens),
        });
        self.pending = pending;
    }

    /// Adds one delta's exact count to its choice.
    fn commit(&mut self, choice: u64, tokens: u64) {
        self.output_tokens += tokens;
        self.largest_delta = self.largest_delta.max(tokens);
        if let Some(n) = usize::try_from(choice)
            .ok()
            .and_then(|i| self.per_choice.get_mut(i))
        {
            *n += tokens;
        }
    }

    /// The upstream's last usage, if any.
    pub fn usage(&self) -> Option<UsageBreakdown> {
        self.usage
    }

    /// What the stream used: the upstream's usage (which comes after the
    /// last delta, so everything it counts was relayed) within its bounds,
    /// with what it did not report (or reported out of bounds) filled from
    /// the input estimate and the output counted.
    pub fn used(&mut self, input_estimate: u64) -> UsageBreakdown {
        if self
            .messages
            .as_ref()
            .is_some_and(MessagesStream::needs_count)
        {
            self.count_pending();
        }
        let reported = match &self.messages {
            Some(m) => m.used(),
            None => self.usage.unwrap_or_default(),
        }
        .bounded(&self.bounds);
        if reported.output.is_none() {
            self.count_pending();
        }
        let counted = match &self.messages {
            Some(m) => m.counted(),
            None => self.output_tokens,
        };
        reported.filled(input_estimate, || counted)
    }

    /// True once `data: [DONE]` passed.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// True once an error event passed.
    pub fn is_errored(&self) -> bool {
        self.errored
    }

    /// True when every choice has a `finish_reason`.
    pub fn all_finished(&self) -> bool {
        match &self.messages {
            Some(m) => m.stopped(),
            None => self.finished.len() as u64 >= self.choices,
        }
    }

    /// Processes one complete frame (with its terminating blank line).
    pub fn on_frame(&mut self, raw: Bytes) -> FrameAction {
        let frame = parse_frame(&raw);
        if frame.comment_only {
            // Comments (keep-alives) are forwarded; empty frames are noise.
            return if raw.iter().all(|b| *b == b'\n' || *b == b'\r') {
                FrameAction::Drop
            } else {
                FrameAction::Forward(raw)
            };
        }
        let Some(data) = frame.data else {
            // `id:`/`retry:`/`event:`-only frames carry nothing the SDKs can use.
            return FrameAction::Drop;
        };
        let trimmed = data.trim();
        if let Some(m) = &mut self.messages {
            // Every Messages event is relayed as it came (`event:` line included).
            if !self.exact {
                if let Some(d) = BlockDelta::parse(trimmed) {
                    self.pending.push_delta(0, [d.output()]);
                    return FrameAction::Forward(raw);
                }
            }
            match serde_json::from_str::<Value>(trimmed) {
                Ok(v) => match m.on_event(&v, self.encoding) {
                    Seen::Stop => self.done = true,
                    Seen::Error => self.errored = true,
                    Seen::Event => {}
                },
                Err(_) => tracing::debug!("relaying a Messages event whose data is not JSON"),
            }
            return FrameAction::Forward(raw);
        }
        if trimmed == "[DONE]" {
            self.done = true;
            return FrameAction::Forward(match self.gateway_usage_frame() {
                Some(usage) => [usage, raw].concat().into(),
                None => raw,
            });
        }
        if !self.exact {
            if self.dialect.named_events() {
                if let Some(e) = DeltaEvent::parse(trimmed) {
                    return self.on_output_delta(raw.clone(), &e);
                }
            } else if self.dialect == Dialect::ChatCompletions {
                if let Some(chunk) = Chunk::parse(trimmed) {
                    return self.on_chunk(raw.clone(), chunk);
                }
            }
        }
        let Ok(v) = serde_json::from_str::<Value>(trimmed) else {
            tracing::debug!("dropping an SSE frame whose data is not JSON");
            return FrameAction::Drop;
        };
        if self.dialect.named_events() {
            return self.on_event(raw, &v);
        }
        if v.get("error").is_some_and(|e| !e.is_null()) {
            self.errored = true;
            return FrameAction::Forward(raw);
        }
        // Azure's content-filter chunks carry `"id":""`, `"model":""`,
        // `"created":0`: take the first real values for the cutoff chunk.
        let text = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        if self.id.is_none() {
            self.id = text("id");
        }
        if self.model.is_none() {
            self.model = text("model");
        }
        if self.created.is_none() {
            self.created = v.get("created").and_then(Value::as_i64).filter(|c| *c > 0);
        }
        let mut usage_only = false;
        if let Some(u) = self.dialect.usage_from_event(&v) {
            self.usage = Some(u);
            usage_only = v
                .get("choices")
                .and_then(Value::as_array)
                .is_none_or(|c| c.is_empty());
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            if self.cap.is_some() {
                // The cap is checked on exact counts.
                self.count_pending();
            }
            // Counted first, committed only if no choice passes the cap.
            let mut counted = Vec::with_capacity(choices.len());
            for c in choices {
                let tokens = self.dialect.count_output(c, Part::Delta, self.encoding);
                let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                let finishes = c.get("finish_reason").is_some_and(|f| !f.is_null());
                counted.push((idx, tokens, finishes));
            }
            if self.passes_cap(&counted) {
                self.over_cap = true;
                return FrameAction::Drop;
            }
            for (idx, tokens, finishes) in counted {
                self.output_tokens += tokens;
                self.largest_delta = self.largest_delta.max(tokens);
                // Only a requested choice counts: indexes out of range
                // must not make a truncated stream look complete.
                if let Some(n) = self.per_choice.get_mut(idx as usize) {
                    *n += tokens;
                    if finishes {
                        self.finished.insert(idx);
                    }
                }
            }
        }
        if usage_only && !self.client_wants_usage {
            return FrameAction::Drop;
        }
        FrameAction::Forward(raw)
    }

    /// One named event (Responses): counted, terminal usage kept, relayed
    /// as is, unless its output passes the enforced cap (then not relayed).
    fn on_event(&mut self, raw: Bytes, v: &Value) -> FrameAction {
        let tokens = self.events.output_of(v, self.encoding);
        if self.cap.is_some() && tokens > 0 {
            // The cap is checked on exact counts.
            self.count_pending();
        }
        if let Some(cap) = self.cap {
            let tolerance = Self::cap_tolerance(cap, self.largest_delta.max(tokens));
            if tokens > 0
                && self.output_tokens.saturating_add(tokens) > cap.saturating_add(tolerance)
            {
                self.over_cap = true;
                return FrameAction::Drop;
            }
        }
        self.largest_delta = self.largest_delta.max(tokens);
        let o = self.events.on_event(v, tokens);
        self.output_tokens += o.output_tokens;
        if o.usage.is_some() {
            self.usage = o.usage;
        }
        if o.terminal {
            self.done = true;
            self.finished.insert(0);
        }
        if o.created_id {
            self.new_object = self.events.response_id().map(str::to_string);
        }
        if o.error
            || v.get("error")
                .is_some_and(|e| !e.is_null() && v.get("type").is_none())
        {
            self.errored = true;
        }
        FrameAction::Forward(raw)
    }

    /// True when `bytes` more output on top of `so_far` (exact) and
    /// `pending` bytes cannot pass the cap plus its smallest tolerance.
    fn within_cap(&self, so_far: u64, pending: u64, bytes: u64) -> bool {
        let Some(cap) = self.cap else { return true };
        let at_most = tokens_at_most(self.encoding, pending.saturating_add(bytes));
        so_far.saturating_add(at_most) <= cap.saturating_add(Self::cap_tolerance(cap, 0))
    }

    /// A chat chunk read without its tree ([`Chunk`]): what the tree path
    /// of [`on_frame`](Self::on_frame) does with it, its deltas kept
    /// pending unless the cap needs them counted.
    fn on_chunk(&mut self, raw: Bytes, chunk: Chunk<'_>) -> FrameAction {
        if chunk.error.is_some() {
            self.errored = true;
            return FrameAction::Forward(raw);
        }
        let text =
            |s: Option<std::borrow::Cow<'_, str>>| s.filter(|s| !s.is_empty()).map(String::from);
        if self.id.is_none() {
            self.id = text(chunk.id);
        }
        if self.model.is_none() {
            self.model = text(chunk.model);
        }
        if self.created.is_none() {
            self.created = chunk.created.filter(|c| *c > 0);
        }
        let mut usage_only = false;
        let usage = chunk
            .usage
            .and_then(|u| serde_json::from_str::<Value>(u.get()).ok())
            .filter(Value::is_object);
        if let Some(u) = usage {
            self.usage = Some(crate::dialects::openai::usage_from_value(&u));
            usage_only = chunk.choices.as_ref().is_none_or(|c| c.is_empty());
        }
        if let Some(choices) = &chunk.choices {
            let deltas = choices.iter().map(|c| {
                let c = &c.0;
                let strings = c.delta.as_ref().map(|d| &d.0);
                (c.index.unwrap_or(0), strings, c.finish_reason.is_some())
            });
            let safe = deltas.clone().all(|(idx, d, finishes)| {
                let bytes = d.map_or(0, |d| d.output_strings().map(|s| s.len() as u64).sum());
                finishes
                    || !usize::try_from(idx).is_ok_and(|i| i < self.per_choice.len())
                    || self.within_cap(
                        self.per_choice[idx as usize],
                        self.pending.choice_bytes(idx),
                        bytes,
                    )
            });
            if safe {
                for (idx, d, finishes) in deltas {
                    if let Some(d) = d {
                        self.pending.push_delta(idx, d.output_strings());
                    }
                    if finishes && usize::try_from(idx).is_ok_and(|i| i < self.per_choice.len()) {
                        self.finished.insert(idx);
                    }
                }
            } else {
                // Near the cap: counted exactly, as the tree path counts.
                self.count_pending();
                let counted: Vec<(u64, u64, bool)> = deltas
                    .map(|(idx, d, finishes)| {
                        let tokens = d.map_or(0, |d| {
                            d.output_strings()
                                .map(|s| delta_counts::count(self.encoding, s))
                                .sum()
                        });
                        (idx, tokens, finishes)
                    })
                    .collect();
                if self.passes_cap(&counted) {
                    self.over_cap = true;
                    return FrameAction::Drop;
                }
                for (idx, tokens, finishes) in counted {
                    self.commit(idx, tokens);
                    if finishes && usize::try_from(idx).is_ok_and(|i| i < self.per_choice.len()) {
                        self.finished.insert(idx);
                    }
                }
            }
        }
        if usage_only && !self.client_wants_usage {
            return FrameAction::Drop;
        }
        FrameAction::Forward(raw)
    }

    /// True when a choice of a chunk (index, tokens, finishes) passes the
    /// enforced cap plus its tolerance: the chunk is not relayed.
    fn passes_cap(&self, counted: &[(u64, u64, bool)]) -> bool {
        let Some(cap) = self.cap else { return false };
        counted.iter().any(|&(idx, tokens, finishes)| {
            let Some(&so_far) = self.per_choice.get(idx as usize) else {
                return false;
            };
            let tolerance = Self::cap_tolerance(cap, self.largest_delta.max(tokens));
            // A choice the upstream ends itself is not cut.
            !finishes && so_far.saturating_add(tokens) > cap.saturating_add(tolerance)
        })
    }

    /// A Responses output delta read without its tree ([`DeltaEvent`]):
    /// what [`on_event`](Self::on_event) does with it, the delta kept
    /// pending unless the cap needs it counted.
    fn on_output_delta(&mut self, raw: Bytes, e: &DeltaEvent<'_>) -> FrameAction {
        let bytes = e.delta.len() as u64;
        if self.within_cap(self.output_tokens, self.pending.bytes(), bytes) {
            self.pending.push_delta(0, [e.delta.as_ref()]);
        } else {
            self.count_pending();
            let tokens = delta_counts::count(self.encoding, &e.delta);
            if let Some(cap) = self.cap {
                let tolerance = Self::cap_tolerance(cap, self.largest_delta.max(tokens));
                if tokens > 0
                    && self.output_tokens.saturating_add(tokens) > cap.saturating_add(tolerance)
                {
                    self.over_cap = true;
                    return FrameAction::Drop;
                }
            }
            self.commit(0, tokens);
        }
        self.events.on_delta(e);
        FrameAction::Forward(raw)
    }

    fn chunk_frame(v: &Value) -> Bytes {
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The dialect's usage chunk with the gateway's own count: the prompt
    /// estimate and the output counted from the deltas.
    fn usage_chunk(&self, prompt_tokens: u64) -> Bytes {
        let id = self.id.as_deref().unwrap_or("chatcmpl-budgetgate");
        Self::chunk_frame(&json!({
            "id": id,
            "object": self.dialect.chunk_object(),
            "created": self.created.unwrap_or(0),
            "model": self.model.as_deref().unwrap_or_default(),
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": self.output_tokens,
                "total_tokens": prompt_tokens + self.output_tokens
            }
        }))
    }

    /// The usage chunk a client that asked for usage gets before `[DONE]`
    /// when the upstream sent none (some self-hosted servers ignore
    /// `stream_options.include_usage`): the gateway's count.
    pub fn gateway_usage_frame(&mut self) -> Option<Bytes> {
        if !(self.client_wants_usage && self.usage.is_none()) {
            return None;
        }
        self.count_pending();
        Some(self.usage_chunk(self.prompt_tokens))
    }

    /// The frames that end a stream every choice of which finished but
    /// whose upstream closed without `[DONE]` (Messages: `message_stop`).
    pub fn closing_frames(&mut self) -> Bytes {
        if self.messages.is_some() {
            return messages::completion_frame();
        }
        let done = Bytes::from_static(b"data: [DONE]\n\n");
        match self.gateway_usage_frame() {
            Some(usage) => [usage, done].concat().into(),
            None => done,
        }
    }

    /// Frames ending a stream that was cut off: a final chunk with
    /// `finish_reason: "length"` for every unfinished choice, the usage chunk
    /// when the client asked for usage (delivered counts), then `[DONE]`.
    pub fn cutoff_frames(&mut self, prompt_tokens: u64) -> Vec<Bytes> {
        self.count_pending();
        if let Some(m) = &self.messages {
            return m.cutoff_frames();
        }
        if self.dialect.named_events() {
            return vec![self.events.cutoff_event(prompt_tokens, self.output_tokens)];
        }
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| "chatcmpl-budgetgate".into());
        let model = self.model.clone().unwrap_or_default();
        let created = self.created.unwrap_or(0);
        let object = self.dialect.chunk_object();
        let mut out = Vec::new();
        for i in 0..self.choices {
            if self.finished.contains(&i) {
                continue;
            }
            let choice = self.dialect.cutoff_choice(i);
            out.push(Self::chunk_frame(&json!({
                "id": id, "object": object, "created": created, "model": model,
                "choices": [choice]
            })));
        }
        if self.client_wants_usage {
            out.push(self.usage_chunk(prompt_tokens));
        }
        out.push(Bytes::from_static(b"data: [DONE]\n\n"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The same on a Responses stream's terminal usage.
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
