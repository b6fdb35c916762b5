//! The relay as the client's response body: every frame is read from the
//! upstream, metered and forwarded inside the body's own `poll_frame`, on
//! the task of the client's connection. Each event is one hand-off (the
//! upstream connection's to this body) instead of three (to a relay task,
//! through a channel, to the connection), and the client's back-pressure
//! reaches the upstream read directly.
//!
//! The extension and the settlement are the only steps that are not
//! plain reads: an extension is a future owning the meter while it runs;
//! the settlement is synchronous. A body dropped before its stream ended
//! (the client went away) settles in its `Drop`, after any extension in
//! flight has answered (on a task of its own), so no hold is left unsettled
//! and no granted extension is lost.
//!
//! Frames are delivered in batches: what was read while more events kept
//! arriving within a few turns of the scheduler leaves as one write (at
//! most [`BATCH_BYTES`]). An event that arrives alone waits only those
//! turns (microseconds); a burst costs one system call, not one per event.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http_body::Frame;

use super::super::sse::{FrameSplitter, MAX_FRAME_BYTES};
use super::{Ending, ExtendPlan, Extension, FrameAction, Meter, RelaySummary, StreamProcessor};
use crate::admission::stream_cutoffs::{Cut, CutReason, CutoffHandle};

type Upstream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;
type Pending<M> = Pin<Box<dyn Future<Output = (M, Extension)> + Send>>;

/// The body of a relayed stream: the upstream's frames as metered, then
/// the frames of its ending; `on_end` gets the summary once it settled.
///
/// Its state is shared with the keeper of stream cutoffs
/// ([`crate::admission::stream_cutoffs`]), which ends it at its time limit
/// or at the shutdown cutoff when the connection stopped polling it (a
/// client that stopped reading); each poll takes the state's lock,
/// uncontended but for that moment.
pub struct RelayBody<M: Meter, F: FnOnce(RelaySummary) + Send + 'static> {
    stream: Arc<Mutex<Streaming<M, F>>>,
    /// Removes the stream from the keeper when the body is dropped.
    _watched: Option<CutoffHandle>,
}

struct Streaming<M: Meter, F: FnOnce(RelaySummary) + Send + 'static> {
    relay: Option<Relay<M>>,
    /// Frames for the client, not yet handed to the connection.
    out: Batch,
    /// How many frames were held back when the body last yielded.
    yielded_at: Option<usize>,
    /// Turns yielded in a row that brought no frame.
    idle_turns: u8,
    on_end: Option<F>,
}

/// Frames read but not yet delivered: handed to the connection as one
/// write.
#[derive(Default)]
struct Batch {
    frames: Vec<Bytes>,
    bytes: usize,
}

/// A batch this large is delivered without waiting for more.
const BATCH_BYTES: usize = 16 * 1024;

/// Reads of an upstream that is always ready between two checks of the
/// deadline and the shutdown.
const CHECK_EVERY_READS: u8 = 16;

/// Turns of the scheduler a batch waits for another event before it is
/// delivered: hyper's client connection hands a body on one chunk at a
/// time, the next one two turns after the last was taken
/// (docs/PERFORMANCE.md).
const IDLE_TURNS: u8 = 2;

impl Batch {
    fn push(&mut self, frame: Bytes) {
        self.bytes += frame.len();
        self.frames.push(frame);
    }

    fn len(&self) -> usize {
        self.frames.len()
    }

    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    fn is_full(&self) -> bool {
        self.bytes >= BATCH_BYTES
    }

    /// The frames as one buffer (copied only when there are several).
    fn take(&mut self) -> Option<Bytes> {
        let bytes = std::mem::take(&mut self.bytes);
        match self.frames.len() {
            0 | 1 => self.frames.pop(),
            _ => {
                let mut joined = bytes::BytesMut::with_capacity(bytes);
                for f in self.frames.drain(..) {
                    joined.extend_from_slice(&f);
                }
                Some(joined.freeze())
            }
        }
    }
}

impl Extend<Bytes> for Batch {
    fn extend<I: IntoIterator<Item = Bytes>>(&mut self, frames: I) {
        for f in frames {
            self.push(f);
        }
    }
}

/// Relays `upstream`, metering and extending through `hold`; settles it
/// when the stream ends (or the body is dropped) and then calls `on_end`.
pub fn relay_body<M: Meter, F: FnOnce(RelaySummary) + Send + 'static>(
    upstream: crate::upstreams::UpstreamResponse,
    proc: StreamProcessor,
    hold: M,
    plan: ExtendPlan,
    on_end: F,
) -> RelayBody<M, F> {
    let shutdown = Box::pin(hold.shutdown());
    let deadline = plan.deadline;
    let cutoffs = hold.stream_cutoffs().cloned();
    let stream = Arc::new(Mutex::new(Streaming {
        relay: Some(Relay {
            upstream: Some(Box::pin(http_body_util::BodyDataStream::new(
                upstream.into_body(),
            ))),
            splitter: FrameSplitter::new(),
            proc,
            deadline: plan
                .deadline
                .map(|at| Box::pin(tokio::time::sleep_until(at))),
            plan,
            hold: Some(hold),
            extending: None,
            extensions_work: true,
            shutdown,
            reads_unchecked: 0,
        }),
        out: Batch::default(),
        yielded_at: None,
        idle_turns: 0,
        on_end: Some(on_end),
    }));
    let watched = cutoffs.map(|c| {
        let weak: Weak<dyn Cut> = Arc::downgrade(&stream) as Weak<dyn Cut>;
        c.register(deadline, weak)
    });
    RelayBody {
        stream,
        _watched: watched,
    }
}

struct Relay<M: Meter> {
    /// `None` once the stream ended (dropping it aborts the upstream call).
    upstream: Option<Upstream>,
    splitter: FrameSplitter,
    proc: StreamProcessor,
    plan: ExtendPlan,
    /// `None` while an extension owns it.
    hold: Option<M>,
    extending: Option<Pending<M>>,
    extensions_work: bool,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Upstream reads since the deadline and the shutdown were checked.
    reads_unchecked: u8,
}

impl<M: Meter> Relay<M> {
    /// Reads and meters until `out` is full (`Ready(None)`), the stream
    /// ends (`Ready(Some)`, its last frames in `out`), or nothing can be
    /// read now (`Pending`, with or without frames in `out`). `yielded`:
    /// the body is back from a turn it gave up itself, the deadline's and
    /// the shutdown's wake-ups were registered before it.
    fn advance(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Batch,
        yielded: bool,
    ) -> Poll<Option<Ending>> {
        loop {
            if let Some(extension) = &mut self.extending {
                let (hold, answer) = ready!(extension.as_mut().poll(cx));
                self.extending = None;
                self.hold = Some(hold);
                match answer {
                    Extension::Granted(granted) => self.plan.reserved_output += granted,
                    Extension::Exhausted(why) => {
                        tracing::info!(reservation_id = %self.id(), reason = %why, "budget exhausted mid-stream; cutting off");
                        return Poll::Ready(Some(self.cut_off(out, Ending::CutOff)));
                    }
                    Extension::Failed(e) => {
                        // The upstream cap still bounds the output; the limiter must not become the outage.
                        tracing::warn!(reservation_id = %self.id(), error = %e, "extension failed; continuing under the upstream cap");
                        self.extensions_work = false;
                    }
                }
                self.extend_if_due();
                continue;
            }
            if out.is_full() {
                return Poll::Ready(None);
            }
            if let Some(frame) = self.splitter.next_frame() {
                if let Some(ending) = self.on_frame(frame, out) {
                    return Poll::Ready(Some(ending));
                }
                continue;
            }
            let Some(upstream) = &mut self.upstream else {
                return Poll::Ready(Some(Ending::UpstreamError));
            };
            if self.splitter.frame_too_large() {
                tracing::warn!(reservation_id = %self.id(), max_bytes = MAX_FRAME_BYTES,
                    "upstream event larger than the frame cap; ending the stream");
                out.push(self.proc.error_frame(
                    "The upstream sent an event larger than the gateway accepts; the stream was cut short.",
                    "upstream_stream_truncated",
                ));
                return Poll::Ready(Some(Ending::UpstreamError));
            }
            let read = upstream.as_mut().poll_next(cx);
            // Time is up, or the shutdown grace period is over: both end
            // cleanly, as when the budget runs out. Checked whenever the
            // relay would wait for the upstream (so their wake-ups are
            // registered; not again on the turns it gives up itself to
            // batch frames), and every few reads of an upstream that
            // never makes it wait.
            self.reads_unchecked += 1;
            if (read.is_pending() && !yielded) || self.reads_unchecked >= CHECK_EVERY_READS {
                self.reads_unchecked = 0;
                if let Some(ending) = self.time_is_up(cx) {
                    return Poll::Ready(Some(self.cut_off(out, ending)));
                }
            }
            match ready!(read) {
                Some(Ok(chunk)) => self.splitter.feed_bytes(chunk),
                // The upstream call's own timeout (at most the request's
                // time limit) ended the body: a time limit, not an upstream fault.
                Some(Err(e)) if e.is_timeout() => {
                    tracing::info!(reservation_id = %self.id(), "upstream call reached its timeout; cutting off");
                    return Poll::Ready(Some(self.cut_off(out, Ending::TimeLimit)));
                }
                Some(Err(e)) => {
                    tracing::warn!(reservation_id = %self.id(), error = %e, "upstream stream failed");
                    out.push(self.proc.error_frame(
                        "The upstream connection failed mid-stream.",
                        "upstream_stream_error",
                    ));
                    return Poll::Ready(Some(Ending::UpstreamError));
                }
                None => return Poll::Ready(Some(self.upstream_closed(out))),
            }
        }
    }

    /// The ending a passed deadline or the shutdown's cutoff brings.
    fn time_is_up(&mut self, cx: &mut Context<'_>) -> Option<Ending> {
        if let Some(deadline) = &mut self.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                tracing::info!(reservation_id = %self.id(), "stream reached the request's time limit; cutting off");
                return Some(Ending::TimeLimit);
            }
        }
        if self.shutdown.as_mut().poll(cx).is_ready() {
            tracing::info!(reservation_id = %self.id(), "gateway shutting down; cutting the stream off");
            return Some(Ending::CutOff);
        }
        None
    }

    /// One complete frame: forwarded as the processor says; the ending it
    /// brings, if any; an extension started when output reached the
    /// reservation.
    fn on_frame(&mut self, frame: Bytes, out: &mut Batch) -> Option<Ending> {
        if let FrameAction::Forward(b) = self.proc.on_frame(frame) {
            out.push(b);
        }
        if let Some(id) = self.proc.take_created() {
            if let Some(hold) = &mut self.hold {
                hold.created(&id);
            }
        }
        if self.proc.is_done() {
            return Some(Ending::Completed);
        }
        if self.proc.is_over_cap() {
            tracing::info!(reservation_id = %self.id(), "output passed the cap sent upstream; cutting off");
            return Some(self.cut_off(out, Ending::OverCap));
        }
        self.extend_if_due();
        None
    }

    /// Starts an extension when the output delivered reached what is
    /// reserved and more may come (no extension once every choice has
    /// finished).
    fn extend_if_due(&mut self) {
        let Some(step) = self.plan.step else { return };
        let plan = &self.plan;
        if !(self.extensions_work
            && !self.proc.all_finished()
            && plan.reserved_output < plan.max_output
            && self.proc.output_reaches(plan.reserved_output))
        {
            return;
        }
        let Some(mut hold) = self.hold.take() else {
            return;
        };
        let want = step.min(plan.max_output - plan.reserved_output);
        self.extending = Some(Box::pin(async move {
            let answer = hold.extend(want).await;
            (hold, answer)
        }));
    }

    /// The upstream's body ended: the last frame (completed if its blank
    /// line is missing), then how the stream stands.
    fn upstream_closed(&mut self, out: &mut Batch) -> Ending {
        if let Some(last) = self.splitter.finish() {
            if let FrameAction::Forward(b) = self.proc.on_frame(last) {
                out.push(b);
            }
        }
        if self.proc.is_done() {
            return Ending::Completed;
        }
        if self.proc.is_errored() {
            return Ending::UpstreamError;
        }
        if self.proc.all_finished() {
            out.push(self.proc.closing_frames());
            return Ending::Completed;
        }
        out.push(self.proc.error_frame(
            "The upstream closed the stream before it finished.",
            "upstream_stream_truncated",
        ));
        Ending::UpstreamError
    }

    /// The frames of a clean ending, queued; returns `ending`.
    fn cut_off(&mut self, out: &mut Batch, ending: Ending) -> Ending {
        out.extend(self.proc.cutoff_frames(self.plan.input_tokens));
        ending
    }

    fn id(&self) -> &str {
        self.hold.as_ref().map_or("", |h| h.id())
    }

    /// Settles what was delivered, the stream having ended as `ending`,
    /// and reports the summary to `on_end`.
    fn settle<F: FnOnce(RelaySummary)>(mut self, ending: Ending, on_end: Option<F>) {
        self.upstream = None;
        let used = self.proc.used(self.plan.input_tokens);
        let counted_output = self.proc.counted_output();
        let settled_tokens = self.hold.take().map_or(0, |h| h.settle(used, ending));
        if let Some(on_end) = on_end {
            on_end(RelaySummary {
                ending,
                settled_tokens,
                counted_output,
            });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic mid-poll leaves at worst a stream cut short; its hold expires.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<M: Meter, F: FnOnce(RelaySummary) + Send + 'static> Streaming<M, F> {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let Some(relay) = &mut self.relay else {
            return Poll::Ready(self.out.take());
        };
        match relay.advance(cx, &mut self.out, self.yielded_at.is_some()) {
            Poll::Ready(Some(ending)) => {
                // Settled before its last frames reach the client.
                if let Some(relay) = self.relay.take() {
                    relay.settle(ending, self.on_end.take());
                }
            }
            Poll::Ready(None) => {}
            Poll::Pending if self.out.is_empty() => return Poll::Pending,
            // Waiting for an extension: what was read goes now.
            Poll::Pending if relay.extending.is_some() => {}
            Poll::Pending => {
                // The upstream's connection hands its events on one by
                // one, each after turns of the scheduler: while they
                // bring more, the frames wait, so events that arrived
                // together leave in one write, not one write each.
                if self.yielded_at.is_some_and(|n| n == self.out.len()) {
                    self.idle_turns += 1;
                } else {
                    self.idle_turns = 0;
                }
                if self.idle_turns < IDLE_TURNS {
                    self.yielded_at = Some(self.out.len());
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
        self.yielded_at = None;
        self.idle_turns = 0;
        Poll::Ready(self.out.take())
    }

    /// Ends the stream before the upstream did: its closing frames queued
    /// (unless the client is gone), what was delivered settled. An
    /// extension in flight may have been granted: its answer goes into the
    /// meter before the settlement, which then refunds it.
    fn end_early(&mut self, ending: Ending) {
        let Some(mut relay) = self.relay.take() else {
            return;
        };
        if ending != Ending::ClientGone {
            relay.cut_off(&mut self.out, ending);
        }
        let on_end = self.on_end.take();
        let Some(extension) = relay.extending.take() else {
            relay.settle(ending, on_end);
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let (hold, _) = extension.await;
                    relay.hold = Some(hold);
                    relay.settle(ending, on_end);
                });
            }
            // Only at process exit: the hold expires by its TTL.
            Err(_) => tracing::debug!("stream body ended outside the runtime"),
        }
    }
}

impl<M: Meter, F: FnOnce(RelaySummary) + Send + 'static> Cut for Mutex<Streaming<M, F>> {
    /// The connection has not polled the body since the time limit or the
    /// shutdown cutoff passed: the client is not reading.
    fn cut(&self, why: CutReason) {
        let mut stream = lock(self);
        let Some(relay) = &stream.relay else { return };
        let id = relay.id().to_owned();
        let ending = match why {
            CutReason::Deadline => {
                tracing::info!(reservation_id = %id, "stream reached the request's time limit while its client was not reading; cutting off");
                Ending::TimeLimit
            }
            CutReason::Shutdown => {
                tracing::info!(reservation_id = %id, "gateway shutting down while the stream's client was not reading; cutting off");
                Ending::CutOff
            }
        };
        stream.end_early(ending);
    }
}

impl<M: Meter, F: FnOnce(RelaySummary) + Send + 'static> http_body::Body for RelayBody<M, F> {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        lock(&self.stream)
            .poll_frame(cx)
            .map(|b| b.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        let stream = lock(&self.stream);
        stream.relay.is_none() && stream.out.is_empty()
    }
}

impl<M: Meter, F: FnOnce(RelaySummary) + Send + 'static> Drop for RelayBody<M, F> {
    /// The client went away before the stream ended.
    fn drop(&mut self) {
        lock(&self.stream).end_early(Ending::ClientGone);
    }
}

#[cfg(test)]
mod tests;
