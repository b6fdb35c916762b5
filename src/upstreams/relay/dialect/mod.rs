//! One stream type per dialect behind [`StreamDialect`]: each knows its
//! frames (which carry output, usage, the end, an error), how its output
//! strings are read without a JSON tree for the bound, and the frames that
//! end it cleanly (cutoff, a missing terminal event, an error). The
//! processor ([`super::processor`]) keeps what every dialect shares: the
//! metering, the bound-first counting, the cap, extension and cutoff.
//!
//! Dispatch is static: [`DialectStream`] is an enum of the stream types,
//! matched once per call, so the hot path pays no virtual call and each
//! dialect's code is inlined into its arm. A dialect is added as a file
//! here and an arm in [`DialectStream`]; no other dialect's file changes.

use bytes::Bytes;

use super::processor::Tally;
use crate::dialects::{Dialect, UsageBreakdown};

mod chat;
mod gemini;
mod messages;
mod responses;

/// What the processor does with the frame whose data a dialect read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Relay the frame as it came.
    Forward,
    /// Relay nothing (a usage chunk the client did not ask for, a frame
    /// that is not JSON, the frame that passed the cap).
    Drop,
    /// Relay these bytes, then the frame (the gateway's usage chunk
    /// before `[DONE]`).
    ForwardAfter(Bytes),
}

/// A dialect's stream: reads each frame's data into the [`Tally`] and
/// builds the dialect's own ending frames.
pub trait StreamDialect {
    /// One frame's data (trimmed; never a comment): its output delivered
    /// (pending, or counted where the cap needs it), usage, end or error
    /// reported to `t`.
    fn on_data(&mut self, t: &mut Tally, data: &str) -> Verdict;

    /// Counts the pending deltas where this dialect keeps its count.
    fn count_pending(&mut self, t: &mut Tally) {
        t.count_pending();
    }

    /// Output counted so far, in the model's tokens (pending not included).
    fn counted(&self, t: &Tally) -> u64 {
        t.output_tokens
    }

    /// The most [`counted`](Self::counted) can be once `pending_at_most`
    /// more tiktoken tokens are counted.
    fn counted_at_most(&self, t: &Tally, pending_at_most: u64) -> u64 {
        t.output_tokens.saturating_add(pending_at_most)
    }

    /// Counts text at `ratio` per mille (the dialects whose models do not
    /// count in tiktoken's tokens).
    fn set_token_ratio(&mut self, _ratio: u64) {}

    /// True when the settlement reads the gateway's count whatever the
    /// upstream reported (the pending deltas are counted first).
    fn reads_count(&self, _t: &Tally) -> bool {
        false
    }

    /// The usage the upstream reported, before its bounds are applied.
    fn reported(&self, t: &Tally) -> UsageBreakdown {
        t.usage.unwrap_or_default()
    }

    /// True when no more output can come.
    fn all_finished(&self, t: &Tally) -> bool {
        t.finished.len() as u64 >= t.choices
    }

    /// The error event this dialect's clients raise on.
    fn error_frame(&self, message: &str, code: &str) -> Bytes;

    /// The frames that end a stream every choice of which finished but
    /// whose upstream closed without its terminal event.
    fn closing_frames(&mut self, t: &mut Tally) -> Bytes;

    /// The frames that end a stream cut off by the gateway, as the
    /// dialect's streams end at their output limit (nothing is pending).
    fn cutoff_frames(&mut self, t: &mut Tally, prompt_tokens: u64) -> Vec<Bytes>;
}

/// The stream of each dialect that streams.
#[derive(Debug)]
pub enum DialectStream {
    Chat(chat::ChatStream),
    Responses(responses::ResponsesStream),
    Messages(messages::MessagesEvents),
    Gemini(gemini::GeminiStream),
}

impl DialectStream {
    /// The stream type of `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Responses => Self::Responses(responses::ResponsesStream::default()),
            Dialect::Messages => Self::Messages(messages::MessagesEvents::default()),
            Dialect::Gemini => Self::Gemini(gemini::GeminiStream::default()),
            // Chat and legacy completions: chunks of choices (embeddings
            // never stream).
            Dialect::ChatCompletions | Dialect::Completions | Dialect::Embeddings => {
                Self::Chat(chat::ChatStream::new(dialect))
            }
        }
    }
}

/// Calls the same method on whichever stream it is.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            DialectStream::Chat($s) => $call,
            DialectStream::Responses($s) => $call,
            DialectStream::Messages($s) => $call,
            DialectStream::Gemini($s) => $call,
        }
    };
}

impl StreamDialect for DialectStream {
    #[inline]
    fn on_data(&mut self, t: &mut Tally, data: &str) -> Verdict {
        each!(self, s => s.on_data(t, data))
    }

    #[inline]
    fn count_pending(&mut self, t: &mut Tally) {
        each!(self, s => s.count_pending(t))
    }

    #[inline]
    fn counted(&self, t: &Tally) -> u64 {
        each!(self, s => s.counted(t))
    }

    #[inline]
    fn counted_at_most(&self, t: &Tally, pending_at_most: u64) -> u64 {
        each!(self, s => s.counted_at_most(t, pending_at_most))
    }

    fn set_token_ratio(&mut self, ratio: u64) {
        each!(self, s => s.set_token_ratio(ratio))
    }

    fn reads_count(&self, t: &Tally) -> bool {
        each!(self, s => s.reads_count(t))
    }

    fn reported(&self, t: &Tally) -> UsageBreakdown {
        each!(self, s => s.reported(t))
    }

    #[inline]
    fn all_finished(&self, t: &Tally) -> bool {
        each!(self, s => s.all_finished(t))
    }

    fn error_frame(&self, message: &str, code: &str) -> Bytes {
        each!(self, s => s.error_frame(message, code))
    }

    fn closing_frames(&mut self, t: &mut Tally) -> Bytes {
        each!(self, s => s.closing_frames(t))
    }

    fn cutoff_frames(&mut self, t: &mut Tally, prompt_tokens: u64) -> Vec<Bytes> {
        each!(self, s => s.cutoff_frames(t, prompt_tokens))
    }
}
