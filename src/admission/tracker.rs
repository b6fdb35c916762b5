//! Settlements as tracked work. Settlements run as tasks off the
//! response's critical path, retried with the same reservation id
//! (idempotent) for a bounded time, and drained at shutdown. The tracker
//! also carries the shutdown *cutoff*: at the end of the grace period every
//! stream still relaying is told to cut off cleanly.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::slot_renewal::SlotRenewer;
use super::stream_cutoffs::StreamCutoffs;
use super::{AnsweredBy, GatewayStore};

use crate::budget::{BudgetStore, SettleOutcome, Settlement};
use crate::config::bounds::MAX_LIMIT;
use crate::settlement::{Observers, Settled, Settling, Subject};

/// Where a settlement's outcome goes when its caller waits for it
/// ([`super::HeldReservation::settle_now`]): `None` when it failed for good.
pub(super) type SettleAnswer = tokio::sync::oneshot::Sender<Option<SettleOutcome>>;

/// Counts settlement tasks in flight so tests and shutdown can wait for them.
#[derive(Clone, Default)]
pub struct SettlementTracker {
    inner: Arc<TrackerInner>,
}

struct TrackerInner {
    pending: AtomicUsize,
    idle: Notify,
    settled: AtomicU64,
    failed: AtomicU64,
    /// Becomes true at the shutdown deadline.
    cutoff: watch::Sender<bool>,
    /// Renews the leases of live reservations.
    slot_renewer: SlotRenewer,
    /// Cuts off streams whose body is not polled (a client that stopped reading).
    stream_cutoffs: StreamCutoffs,
    /// Told of every settlement the store answered.
    observers: Observers,
}

impl Default for TrackerInner {
    fn default() -> Self {
        let cutoff = watch::Sender::new(false);
        Self {
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
            settled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            stream_cutoffs: StreamCutoffs::new(cutoff.subscribe()),
            cutoff,
            slot_renewer: SlotRenewer::default(),
            observers: Observers::default(),
        }
    }
}

impl SettlementTracker {
    /// A tracker telling `observers` of every settlement.
    pub fn new(observers: Observers) -> Self {
        Self {
            inner: Arc::new(TrackerInner {
                observers,
                ..TrackerInner::default()
            }),
        }
    }

    /// Settlements queued or running.
    pub fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::SeqCst)
    }

    /// Settlements applied since start (including `AlreadySettled` answers).
    pub fn settled(&self) -> u64 {
        self.inner.settled.load(Ordering::SeqCst)
    }

    /// Settlements given up after the retry window.
    pub fn failed(&self) -> u64 {
        self.inner.failed.load(Ordering::SeqCst)
    }

    /// Tells every stream still relaying, and every request still waiting
    /// for its upstream, to end now (the shutdown grace period is over).
    pub fn begin_cutoff(&self) {
        self.inner.cutoff.send_replace(true);
    }

    /// Resolves once [`SettlementTracker::begin_cutoff`] is called (at once
    /// if it was). Cancel-safe.
    pub fn cutoff(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.cutoff.subscribe();
        async move {
            let _ = rx.wait_for(|cut| *cut).await;
        }
    }

    /// Waits until no settlement is pending.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.pending() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Where streams are cut off when their body is not polled.
    pub fn stream_cutoffs(&self) -> &StreamCutoffs {
        &self.inner.stream_cutoffs
    }

    /// The slot renewer of the reservations this tracker settles.
    pub(super) fn slot_renewer(&self) -> &SlotRenewer {
        &self.inner.slot_renewer
    }

    pub(super) fn spawn_settle(
        &self,
        (store, at): (Arc<GatewayStore>, AnsweredBy),
        id: String,
        s: Settling,
        retry_for: Duration,
        subject: Subject,
        answer: Option<SettleAnswer>,
    ) {
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        let inner = self.inner.clone();
        let mut settle = Box::pin(async move {
            let outcome = settle_in_gateway(&store, at, &id, &s.settlement, retry_for).await;
            // Observers hear of a settlement the store never confirmed too:
            // the ledger says so rather than nothing.
            inner.observers.settled(&Settled {
                id: &id,
                made: &s,
                applied: outcome.as_ref(),
                subject: &subject,
            });
            match outcome {
                Some(o) => {
                    inner.settled.fetch_add(1, Ordering::SeqCst);
                    match &o {
                        SettleOutcome::Settled {
                            reserved,
                            refunded,
                            debt,
                            ..
                        } => {
                            tracing::debug!(reservation_id = %id, reserved, refunded, debt, "settled")
                        }
                        SettleOutcome::AlreadySettled => {
                            tracing::debug!(reservation_id = %id, "settled already")
                        }
                        SettleOutcome::Unknown => {
                            tracing::debug!(reservation_id = %id, "settle: no such hold (expired)")
                        }
                        SettleOutcome::Voided => {
                            tracing::debug!(reservation_id = %id, "settle: voided")
                        }
                    }
                }
                None => {
                    inner.failed.fetch_add(1, Ordering::SeqCst);
                    tracing::error!(reservation_id = %id, actual_tokens = s.settlement.actual_tokens, "settlement failed after retries");
                }
            }
            // The waiter may be gone (its client left): the settlement is
            // done all the same.
            if let Some(answer) = answer {
                let _ = answer.send(outcome);
            }
            if inner.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                inner.idle.notify_waiters();
            }
        });
        // A store that answers without I/O (the memory store) settles in
        // this first poll, which saves a task and a cross-thread wake-up per
        // request; otherwise the request is already on its way to the store
        // and a task waits for the answer. (A future may be polled again
        // with another waker; only the last one is woken.)
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        if settle.as_mut().poll(&mut cx).is_pending() {
            tokio::spawn(settle);
        }
    }
}

/// `s` with its usage bounded by the largest single cost (tokens): the
/// usage comes from the upstream's answer, and an absurd count must not
/// overflow the budget arithmetic (whose integers stay below 2^53).
pub(super) fn bounded(s: Settlement) -> Settlement {
    Settlement {
        actual_tokens: s.actual_tokens.min(MAX_LIMIT),
        ..s
    }
}

/// Settles in `store`, retrying store errors with a growing back-off for
/// up to `retry_for`.
pub async fn settle_with_retry<S: BudgetStore + ?Sized>(
    store: &S,
    id: &str,
    s: Settlement,
    retry_for: Duration,
) -> Option<SettleOutcome> {
    retry(id, retry_for, || store.settle(id, &s)).await
}

/// [`settle_with_retry`] at the layer of the gateway's store that
/// admitted the reservation, called directly (no boxed future per layer).
async fn settle_in_gateway(
    store: &GatewayStore,
    at: AnsweredBy,
    id: &str,
    s: &Settlement,
    retry_for: Duration,
) -> Option<SettleOutcome> {
    retry(id, retry_for, || store.settle_at(at, id, s)).await
}

/// Calls `settle` until it succeeds, with a growing back-off, for up to `retry_for`.
async fn retry<F, Fut>(id: &str, retry_for: Duration, mut settle: F) -> Option<SettleOutcome>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<SettleOutcome, crate::budget::StoreError>>,
{
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut backoff = Duration::from_millis(20);
    loop {
        match settle().await {
            Ok(o) => return Some(o),
            Err(e) => {
                tracing::warn!(reservation_id = %id, error = %e, "settle failed, retrying");
                if tokio::time::Instant::now() + backoff > deadline {
                    crate::metrics::settlement_failed();
                    return None;
                }
                tokio::time::sleep(backoff).await;
                crate::metrics::settlement_retry();
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_usage_is_bounded_by_the_largest_single_cost() {
        let s = bounded(Settlement {
            actual_tokens: u64::MAX,
            upstream_failed: true,
            actual: crate::budget::Actual::Tokens,
        });
        assert_eq!(s.actual_tokens, MAX_LIMIT);
        assert!(s.upstream_failed);
        let small = Settlement {
            actual_tokens: 17,
            upstream_failed: false,
            actual: crate::budget::Actual::Tokens,
        };
        assert_eq!(bounded(small).actual_tokens, 17);
    }
}
