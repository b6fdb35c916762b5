//! The metering state machine of a stream: the output counted, the cap
//! enforced, the usage kept, when to ask for more output. Free of I/O, so
//! it can be tested and fuzzed on any split of a recorded stream;
//! [`super::run`] drives it.
//!
//! What a frame means (its deltas, its usage, whether it ends the stream)
//! and the frames of a clean ending are the dialect's
//! ([`super::dialect`]): the processor hands each frame's data to its
//! dialect's stream, which reports into the [`Tally`] kept here.
//!
//! By default the processor meters by a bound ([`super::bound`]): the
//! common delta events are read for their output strings only (no JSON
//! tree) and kept untokenised until a decision needs their exact count.
//! [`StreamProcessor::with_exact_counting`] reads every event as a tree
//! and counts every delta as it passes, as the relay did before; the
//! differential tests hold the two to the same bytes, cutoffs and counts.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::super::sse::parse_frame;
use super::bound::{tokens_at_most, PendingOutput};
use super::dialect::{DialectStream, StreamDialect, Verdict};
use crate::config::estimate::Encoding;
use crate::dialects::usage::UsageBounds;
use crate::dialects::{Dialect, UsageBreakdown};

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
    tally: Tally,
    stream: DialectStream,
    /// The most the upstream's usage may report.
    bounds: UsageBounds,
}

/// What every stream counts, whatever its dialect: the output delivered
/// (exact, and pending for the bound), per requested choice; the enforced
/// cap; the upstream's usage; how far the stream got. A dialect's stream
/// reports each frame into it.
#[derive(Debug)]
pub(crate) struct Tally {
    pub encoding: Encoding,
    /// Every event read as a tree and every delta counted as it passes.
    pub exact: bool,
    pub client_wants_usage: bool,
    /// Choices requested (at least one).
    pub choices: u64,
    /// Prompt tokens the gateway reports when the upstream reports none.
    pub prompt_tokens: u64,
    /// The output cap sent upstream, per choice, when the gateway enforces it.
    pub cap: Option<u64>,
    /// Output counted exactly, summed over choices.
    pub output_tokens: u64,
    /// Output counted per requested choice.
    pub per_choice: Vec<u64>,
    /// Largest delta counted so far (the cap's tolerance is at least one).
    pub largest_delta: u64,
    /// Deltas delivered and not yet counted (never with `exact`).
    pub pending: PendingOutput,
    /// Requested choices the upstream finished.
    pub finished: BTreeSet<u64>,
    /// The upstream's last usage, if any.
    pub usage: Option<UsageBreakdown>,
    pub done: bool,
    pub errored: bool,
    /// A choice passed the cap plus its tolerance; its frame was not relayed.
    pub over_cap: bool,
    /// The id of the object the stream created, once, for the meter.
    pub new_object: Option<String>,
}

impl Tally {
    fn new(encoding: Encoding, client_wants_usage: bool, choices: u64) -> Self {
        Self {
            encoding,
            exact: false,
            client_wants_usage,
            choices,
            prompt_tokens: 0,
            cap: None,
            output_tokens: 0,
            per_choice: vec![0; choices as usize],
            largest_delta: 0,
            pending: PendingOutput::new(choices as usize),
            finished: BTreeSet::new(),
            usage: None,
            done: false,
            errored: false,
            over_cap: false,
            new_object: None,
        }
    }

    /// Counts the pending deltas exactly into their choices, each on its
    /// own, in the order they were delivered, as if each had been counted
    /// as it passed.
    pub fn count_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.count(self.encoding, |choice, tokens| self.commit(choice, tokens));
        self.pending = pending;
    }

    /// Adds one delta's exact count to its choice.
    #[inline]
    pub fn commit(&mut self, choice: u64, tokens: u64) {
        self.output_tokens += tokens;
        self.largest_delta = self.largest_delta.max(tokens);
        if let Some(n) = usize::try_from(choice)
            .ok()
            .and_then(|i| self.per_choice.get_mut(i))
        {
            *n += tokens;
        }
    }

    /// True for a choice the client asked for: indexes out of range must
    /// not make a truncated stream look complete.
    #[inline]
    pub fn requested(&self, choice: u64) -> bool {
        usize::try_from(choice).is_ok_and(|i| i < self.per_choice.len())
    }

    /// True when `bytes` more output on top of `so_far` (exact) and
    /// `pending` bytes cannot pass the cap plus its smallest tolerance.
    #[inline]
    pub fn within_cap(&self, so_far: u64, pending: u64, bytes: u64) -> bool {
        let Some(cap) = self.cap else { return true };
        let at_most = tokens_at_most(self.encoding, pending.saturating_add(bytes));
        so_far.saturating_add(at_most) <= cap.saturating_add(StreamProcessor::cap_tolerance(cap, 0))
    }

    /// True when a choice of a frame (index, tokens, finishes) passes the
    /// enforced cap plus its tolerance: the frame is not relayed.
    pub fn passes_cap(&self, counted: &[(u64, u64, bool)]) -> bool {
        let Some(cap) = self.cap else { return false };
        counted.iter().any(|&(idx, tokens, finishes)| {
            let Some(&so_far) = self.per_choice.get(idx as usize) else {
                return false;
            };
            let tolerance = StreamProcessor::cap_tolerance(cap, self.largest_delta.max(tokens));
            // A choice the upstream ends itself is not cut.
            !finishes && so_far.saturating_add(tokens) > cap.saturating_add(tolerance)
        })
    }

    /// True when `tokens` more output of a stream of one answer (no
    /// choices) pass the enforced cap plus its tolerance.
    #[inline]
    pub fn passes_cap_overall(&self, tokens: u64) -> bool {
        let Some(cap) = self.cap else { return false };
        let tolerance = StreamProcessor::cap_tolerance(cap, self.largest_delta.max(tokens));
        tokens > 0 && self.output_tokens.saturating_add(tokens) > cap.saturating_add(tolerance)
    }
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
            tally: Tally::new(encoding, client_wants_usage, choices.max(1)),
            stream: DialectStream::new(dialect),
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
    /// passes: the relay before the bound, kept as the reference the
    /// bound-first processor is tested against.
    pub fn with_exact_counting(mut self) -> Self {
        self.tally.exact = true;
        self
    }

    /// The id of an object the stream created since the last call.
    pub fn take_created(&mut self) -> Option<String> {
        self.tally.new_object.take()
    }

    /// The error event this dialect's clients raise on.
    pub fn error_frame(&self, message: &str, code: &str) -> Bytes {
        self.stream.error_frame(message, code)
    }

    /// Sets the prompt tokens reported by the gateway's own usage chunk
    /// (when the upstream sends none) and the per-choice output cap to
    /// enforce (`None`: the upstream is trusted to honour the cap it got).
    pub fn with_limits(mut self, prompt_tokens: u64, cap: Option<u64>) -> Self {
        self.tally.prompt_tokens = prompt_tokens;
        self.tally.cap = cap;
        self
    }

    /// True once a choice's output passed the enforced cap plus its
    /// tolerance; the frame that passed it was not relayed.
    pub fn is_over_cap(&self) -> bool {
        self.tally.over_cap
    }

    /// The cap's tolerance: our tokenizer is not the model's, so a choice
    /// may run `max(2 % of the cap, one delta)` past it before it is cut.
    pub fn cap_tolerance(cap: u64, largest_delta: u64) -> u64 {
        cap.div_ceil(50).max(largest_delta)
    }

    /// Counts text at `ratio` per mille, for the dialects whose models
    /// count differently from tiktoken (Messages; see
    /// [`crate::dialects::anthropic`]).
    pub fn with_token_ratio(mut self, ratio: u64) -> Self {
        self.stream.set_token_ratio(ratio);
        self
    }

    /// Output tokens counted from deltas so far, summed over choices
    /// (the pending deltas are counted now).
    pub fn output_tokens(&mut self) -> u64 {
        self.count_pending();
        self.stream.counted(&self.tally)
    }

    /// The most [`output_tokens`](Self::output_tokens) can be, without
    /// counting the pending deltas.
    pub fn output_at_most(&self) -> u64 {
        let pending = tokens_at_most(self.tally.encoding, self.tally.pending.bytes());
        self.stream.counted_at_most(&self.tally, pending)
    }

    /// True when the output delivered so far is at least `tokens`: decided
    /// by the bound while it is below, else by counting the pending deltas.
    pub fn output_reaches(&mut self, tokens: u64) -> bool {
        self.output_at_most() >= tokens && self.output_tokens() >= tokens
    }

    /// The output counted so far when nothing is pending; `None` when the
    /// stream was settled without counting its deltas.
    pub fn counted_output(&self) -> Option<u64> {
        (self.tally.pending.is_empty()).then(|| self.stream.counted(&self.tally))
    }

    /// Counts the pending deltas exactly, where the dialect keeps its count.
    fn count_pending(&mut self) {
        if !self.tally.pending.is_empty() {
            self.stream.count_pending(&mut self.tally);
        }
    }

    /// The upstream's last usage, if any.
    pub fn usage(&self) -> Option<UsageBreakdown> {
        self.tally.usage
    }

    /// What the stream used: the upstream's usage (which comes after the
    /// last delta, so everything it counts was relayed) within its bounds,
    /// with what it did not report (or reported out of bounds) filled from
    /// the input estimate and the output counted.
    pub fn used(&mut self, input_estimate: u64) -> UsageBreakdown {
        if self.stream.reads_count(&self.tally) {
            self.count_pending();
        }
        let reported = self.stream.reported(&self.tally).bounded(&self.bounds);
        if reported.output.is_none() {
            self.count_pending();
        }
        let counted = self.stream.counted(&self.tally);
        reported.filled(input_estimate, || counted)
    }

    /// True once the stream's terminal event passed.
    pub fn is_done(&self) -> bool {
        self.tally.done
    }

    /// True once an error event passed.
    pub fn is_errored(&self) -> bool {
        self.tally.errored
    }

    /// True when every choice has finished (no more output can come).
    pub fn all_finished(&self) -> bool {
        self.stream.all_finished(&self.tally)
    }

    /// Processes one complete frame (with its terminating blank line).
    pub fn on_frame(&mut self, raw: Bytes) -> FrameAction {
        let verdict = {
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
            self.stream.on_data(&mut self.tally, data.trim())
        };
        match verdict {
            Verdict::Forward => FrameAction::Forward(raw),
            Verdict::Drop => FrameAction::Drop,
            Verdict::ForwardAfter(first) => FrameAction::Forward([first, raw].concat().into()),
        }
    }

    /// The frames that end a stream every choice of which finished but
    /// whose upstream closed without its terminal event.
    pub fn closing_frames(&mut self) -> Bytes {
        self.stream.closing_frames(&mut self.tally)
    }

    /// Frames ending a stream that was cut off, as the dialect's own
    /// streams end at their output limit, with the delivered counts.
    pub fn cutoff_frames(&mut self, prompt_tokens: u64) -> Vec<Bytes> {
        self.count_pending();
        self.stream.cutoff_frames(&mut self.tally, prompt_tokens)
    }
}
