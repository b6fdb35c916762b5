//! Relaying a streamed completion (DESIGN section 5): frames are forwarded
//! byte for byte as they arrive, metered as they pass, the reservation is
//! extended as output grows, and the stream is cut off cleanly when no
//! budget is left. The relay task owns the reservation, through the
//! narrow [`Meter`] interface defined here (the relay knows nothing of
//! budgets), and settles it on every exit path: completion, cutoff,
//! upstream error, client disconnect. What a frame means (usage, output,
//! cutoff frames) is the dialect's.

use std::future::Future;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::sse::FrameSplitter;
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

pub mod bound;
mod delta_counts;
#[cfg(test)]
mod differential;
mod processor;
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

/// Relays `upstream` to `tx`, metering and extending; settles `hold` before
/// returning.
pub async fn run<M: Meter>(
    upstream: reqwest::Response,
    mut proc: StreamProcessor,
    mut hold: M,
    mut plan: ExtendPlan,
    tx: mpsc::Sender<Bytes>,
) -> RelaySummary {
    let mut splitter = FrameSplitter::new();
    let mut body = upstream.bytes_stream();
    let mut extensions_work = true;
    let deadline = async {
        match plan.deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    // Made once per stream, not once per upstream read.
    let client_gone = tx.closed();
    let shutdown = hold.shutdown();
    tokio::pin!(deadline, client_gone, shutdown);
    let ending = 'relay: loop {
        let next = tokio::select! {
            biased;
            _ = &mut client_gone => break 'relay Ending::ClientGone,
            // Time is up: the same clean ending as when the budget runs out.
            _ = &mut deadline => {
                tracing::info!(reservation_id = %hold.id(), "stream reached the request's time limit; cutting off");
                send_all(&tx, proc.cutoff_frames(plan.input_tokens)).await;
                break 'relay Ending::TimeLimit;
            }
            // Shutdown grace period over: end cleanly, as when the budget runs out.
            _ = &mut shutdown => {
                tracing::info!(reservation_id = %hold.id(), "gateway shutting down; cutting the stream off");
                send_all(&tx, proc.cutoff_frames(plan.input_tokens)).await;
                break 'relay Ending::CutOff;
            }
            next = body.next() => next,
        };
        let chunk = match next {
            Some(Ok(chunk)) => chunk,
            // The upstream call's own timeout (at most the request's time
            // limit) ended the body: a time limit, not an upstream fault.
            Some(Err(e)) if e.is_timeout() => {
                tracing::info!(reservation_id = %hold.id(), "upstream call reached its timeout; cutting off");
                send_all(&tx, proc.cutoff_frames(plan.input_tokens)).await;
                break Ending::TimeLimit;
            }
            Some(Err(e)) => {
                tracing::warn!(reservation_id = %hold.id(), error = %e, "upstream stream failed");
                let _ = tx
                    .send(proc.error_frame(
                        "The upstream connection failed mid-stream.",
                        "upstream_stream_error",
                    ))
                    .await;
                break Ending::UpstreamError;
            }
            None => {
                if let Some(last) = splitter.finish() {
                    // The last frame (completed if its blank line is missing).
                    if let FrameAction::Forward(b) = proc.on_frame(last) {
                        if tx.send(b).await.is_err() {
                            break Ending::ClientGone;
                        }
                    }
                }
                if proc.is_done() {
                    break Ending::Completed;
                }
                if proc.is_errored() {
                    break Ending::UpstreamError;
                }
                if proc.all_finished() {
                    let _ = tx.send(proc.closing_frames()).await;
                    break Ending::Completed;
                }
                let _ = tx
                    .send(proc.error_frame(
                        "The upstream closed the stream before it finished.",
                        "upstream_stream_truncated",
                    ))
                    .await;
                break Ending::UpstreamError;
            }
        };
        splitter.feed(&chunk);
        while let Some(frame) = splitter.next_frame() {
            if let FrameAction::Forward(b) = proc.on_frame(frame) {
                if tx.send(b).await.is_err() {
                    break 'relay Ending::ClientGone;
                }
            }
            if let Some(id) = proc.take_created() {
                hold.created(&id);
            }
            if proc.is_done() {
                break 'relay Ending::Completed;
            }
            if proc.is_over_cap() {
                tracing::info!(reservation_id = %hold.id(), "output passed the cap sent upstream; cutting off");
                send_all(&tx, proc.cutoff_frames(plan.input_tokens)).await;
                break 'relay Ending::OverCap;
            }
            let Some(step) = plan.step else { continue };
            // Once every choice has finished no more output can come: no extension.
            while extensions_work
                && !proc.all_finished()
                && proc.output_reaches(plan.reserved_output)
                && plan.reserved_output < plan.max_output
            {
                let want = step.min(plan.max_output - plan.reserved_output);
                match hold.extend(want).await {
                    Extension::Granted(granted) => plan.reserved_output += granted,
                    Extension::Exhausted(why) => {
                        tracing::info!(reservation_id = %hold.id(), reason = %why, "budget exhausted mid-stream; cutting off");
                        send_all(&tx, proc.cutoff_frames(plan.input_tokens)).await;
                        break 'relay Ending::CutOff;
                    }
                    Extension::Failed(e) => {
                        // The upstream cap still bounds the output; the limiter must not become the outage.
                        tracing::warn!(reservation_id = %hold.id(), error = %e, "extension failed; continuing under the upstream cap");
                        extensions_work = false;
                    }
                }
            }
        }
    };
    drop(body); // aborts the upstream request if it is still running

    let used = proc.used(plan.input_tokens);
    let counted_output = proc.counted_output();
    let settled_tokens = hold.settle(used, ending);
    RelaySummary {
        ending,
        settled_tokens,
        counted_output,
    }
}

/// Sends `frames` in order until the client is gone.
async fn send_all(tx: &mpsc::Sender<Bytes>, frames: Vec<Bytes>) {
    for f in frames {
        if tx.send(f).await.is_err() {
            return;
        }
    }
}
