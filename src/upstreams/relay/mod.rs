//! Relaying a streamed completion (DESIGN section 5): frames are forwarded
//! byte for byte as they arrive, metered as they pass, the reservation is
//! extended as output grows, and the stream is cut off cleanly when no
//! budget is left. The relay is the client's response body
//! ([`RelayBody`]); it owns the reservation, through the narrow [`Meter`]
//! interface defined here (the relay knows nothing of budgets), and
//! settles it on every exit path: completion, cutoff, upstream error,
//! client disconnect (the body dropped). What a frame means (usage, output,
//! cutoff frames) is the dialect's.

use std::future::Future;

use bytes::Bytes;

use crate::dialects::UsageBreakdown;

/// What the relay needs of the reservation it meters.
pub trait Meter: Send + 'static {
    /// The reservation id, for logs.
    fn id(&self) -> &str;
    /// Asks for `tokens` more output.
    fn extend(&mut self, tokens: u64) -> impl Future<Output = Extension> + Send;
    /// Resolves when the gateway's shutdown grace period ends. Cancel-safe;
    /// owns what it waits on, so one future serves a whole stream (not
    /// one subscription per upstream read).
    fn shutdown(&self) -> impl Future<Output = ()> + Send + 'static;
    /// Settles what the stream used, the stream having ended as `ending`;
    /// returns the tokens settled.
    fn settle(self, used: UsageBreakdown, ending: Ending) -> u64;
    /// The stream created a provider-side object with this id (a stored
    /// response, at `response.created`).
    fn created(&mut self, _id: &str) {}
    /// Where the stream is cut off at its time limit and at the shutdown
    /// cutoff when its body is not polled; `None`: only when it is.
    fn stream_cutoffs(&self) -> Option<&crate::admission::stream_cutoffs::StreamCutoffs> {
        None
    }
}

/// The answer to [`Meter::extend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extension {
    /// This many tokens (≥ 1) were granted.
    Granted(u64),
    /// Nothing is left (why, for the log): cut off.
    Exhausted(String),
    /// The budget store failed: go on under the upstream's cap, stop extending.
    Failed(String),
}

mod body;
pub mod bound;
mod delta_counts;
mod dialect;
#[cfg(test)]
mod differential;
mod processor;
pub use body::{relay_body, RelayBody};
pub use processor::{FrameAction, StreamProcessor};

/// An SSE error event in OpenAI's error shape; the official SDKs raise on it.
pub fn error_frame(message: &str, code: &str) -> Bytes {
    crate::dialects::error::error_event(message, "upstream_error", code)
}

/// How a stream ended, for logs and settlement; logged by its
/// [`Ending::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `[DONE]` passed (or was appended because every choice finished).
    Completed,
    /// The budget ran out (or the gateway shut down); cut off cleanly.
    CutOff,
    /// The request reached its time limit (`server.max_request_secs`, or
    /// the deployment's lower timeout); cut off cleanly.
    TimeLimit,
    /// A choice passed the output cap sent upstream (plus tolerance); cut off cleanly.
    OverCap,
    /// The client went away.
    ClientGone,
    /// The upstream failed or closed early; an error event was sent.
    UpstreamError,
}

impl Ending {
    /// The name logs and metrics use: `completed`, `cut_off`, `time_limit`,
    /// `over_cap`, `client_gone`, `upstream_error`.
    pub fn name(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::CutOff => "cut_off",
            Ending::TimeLimit => "time_limit",
            Ending::OverCap => "over_cap",
            Ending::ClientGone => "client_gone",
            Ending::UpstreamError => "upstream_error",
        }
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Extension policy of one stream.
#[derive(Debug, Clone, Copy)]
pub struct ExtendPlan {
    /// Output tokens reserved so far, all choices.
    pub reserved_output: u64,
    /// Extension step, tokens; `None` when output is bounded by the client's
    /// own cap or the model is a reasoning model.
    pub step: Option<u64>,
    /// Largest output the upstream may produce, all choices.
    pub max_output: u64,
    /// Tokens charged for the prompt when no upstream usage arrives.
    pub input_tokens: u64,
    /// When the request's time is up: the stream is cut off cleanly there.
    pub deadline: Option<tokio::time::Instant>,
}

/// What the relay reports when it ends.
#[derive(Debug, Clone, Copy)]
pub struct RelaySummary {
    /// How it ended.
    pub ending: Ending,
    /// Tokens settled.
    pub settled_tokens: u64,
    /// Output tokens counted from deltas, when the stream needed them
    /// counted; `None` when it was settled (by the upstream's usage)
    /// without counting its last deltas.
    pub counted_output: Option<u64>,
}
