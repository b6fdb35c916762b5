//! A reservation as a value that must be settled. [`HeldReservation`] has
//! its slot lease renewed while alive (released when it is dropped),
//! records what extensions granted, settles exactly once, and its `Drop` is
//! the backstop that settles on every exit path (handler cancelled by a
//! client disconnect, panic, early return).

use std::sync::Arc;
use std::time::Duration;

use super::slot_renewal::RenewalHandle;
use super::tracker::{bounded, SettleAnswer};
use super::{AnsweredBy, GatewayStore, SettlementTracker};
use crate::budget::{
    Actual, BudgetKind, BudgetSpec, BudgetStore, ExtendOutcome, SettleOutcome, Settlement, Step,
    StoreError,
};
use crate::settlement::{Outcome, Settling, Subject};

/// A live reservation. Settle it with [`HeldReservation::settle`]; if it is
/// dropped unsettled, the whole reservation is charged (no refund) and its
/// slots are freed.
pub struct HeldReservation {
    id: String,
    store: Arc<GatewayStore>,
    /// The layer that admitted it, where it is extended, renewed and
    /// settled (the others are never asked).
    at: AnsweredBy,
    tracker: SettlementTracker,
    reserved_tokens: u64,
    /// What the hold debited each spec so far, in the store's order, when
    /// known: the drop backstop charges exactly it (µ$ lines included).
    amounts: Vec<u64>,
    settle_retry: Duration,
    /// Renewed while held; dropping it stops the renewals.
    slot_lease: Option<RenewalHandle>,
    done: bool,
    /// What the settlement is about, for its observers (never read here).
    subject: Subject,
}

impl HeldReservation {
    /// Wraps a reservation of `reserved_tokens` on `specs` admitted `at` a
    /// layer of `store` and has its slot lease renewed every
    /// `slot_lease / 3` (by the tracker's slot renewer, which also counts
    /// its slots for the fail-open limiter).
    pub fn new<'s>(
        id: String,
        (store, at): (Arc<GatewayStore>, AnsweredBy),
        specs: impl Iterator<Item = &'s BudgetSpec>,
        tracker: SettlementTracker,
        reserved_tokens: u64,
        slot_lease: Duration,
        settle_retry: Duration,
    ) -> Self {
        let renew: Arc<dyn BudgetStore> = store.renewal_store(at);
        // The fail-open limiter counts its own holds' slots.
        let slots = match at {
            AnsweredBy::LocalLimiter => Vec::new(),
            _ => specs
                .filter(|s| matches!(s.kind, BudgetKind::Concurrency { .. }))
                .map(|s| s.key.clone())
                .collect(),
        };
        let lease = tracker
            .slot_renewer()
            .register(&id, renew, slot_lease, slots);
        Self {
            id,
            store,
            at,
            tracker,
            reserved_tokens,
            amounts: Vec::new(),
            settle_retry,
            slot_lease: Some(lease),
            done: false,
            subject: Subject::default(),
        }
    }

    /// What the reservation debited each spec of the hold (the admitted
    /// candidate's row of [`crate::budget::Costs::per_candidate`]); kept
    /// up to date by [`HeldReservation::extend`].
    pub fn with_amounts(mut self, amounts: Vec<u64>) -> Self {
        self.amounts = amounts;
        self
    }

    /// What the settlement will be about: its observers read it once the
    /// store has answered.
    pub fn about(mut self, subject: Subject) -> Self {
        self.subject = subject;
        self
    }

    /// The reservation id (also the response's `x-request-id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Tokens reserved so far (initial + extensions).
    pub fn reserved_tokens(&self) -> u64 {
        self.reserved_tokens
    }

    /// Asks the store for `step` more on the budgets of the hold and
    /// records what it granted.
    pub async fn extend(&mut self, step: &Step) -> Result<ExtendOutcome, StoreError> {
        let outcome = self.store.extend_at(self.at, &self.id, step).await?;
        if let ExtendOutcome::Extended { granted, .. } = outcome {
            self.reserved_tokens += granted;
            if step.rates.len() == self.amounts.len() {
                for (a, &rate) in self.amounts.iter_mut().zip(&step.rates) {
                    *a += Step::debit(granted, rate);
                }
            } else {
                // Not known per spec any more: the backstop charges tokens.
                self.amounts.clear();
            }
        }
        Ok(outcome)
    }

    /// Resolves when the gateway's shutdown grace period ends: the holder
    /// must stop (a stream sends its cutoff frames) and settle. Cancel-safe.
    pub fn shutdown_cutoff(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.tracker.cutoff()
    }

    /// Where a stream of this reservation is cut off when its body is not
    /// polled.
    pub fn stream_cutoffs(&self) -> &crate::admission::stream_cutoffs::StreamCutoffs {
        self.tracker.stream_cutoffs()
    }

    /// Settles in the background (tracked); consumes the reservation.
    pub fn settle(mut self, s: Settling) {
        self.finish(s);
    }

    /// Settles and waits for the store's answer (used before retrying on
    /// another deployment, so the refund and the freed slot are visible to
    /// the next reservation). The settlement is the tracker's task, not
    /// this future's: a client that leaves while the store is slow drops
    /// only the wait, and the settlement still runs to completion (its
    /// exhausted retries counted, the shutdown drain waiting for it).
    /// `None` when it failed for good or was not run (no runtime).
    pub async fn settle_now(mut self, s: Settling) -> Option<SettleOutcome> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.finish_with(s, Some(tx));
        rx.await.ok().flatten()
    }

    fn finish(&mut self, s: Settling) {
        self.finish_with(s, None);
    }

    fn finish_with(&mut self, mut s: Settling, answer: Option<SettleAnswer>) {
        if self.done {
            return;
        }
        s.settlement = bounded(s.settlement);
        self.done = true;
        self.slot_lease = None;
        self.tracker.spawn_settle(
            (self.store.clone(), self.at),
            self.id.clone(),
            s,
            self.settle_retry,
            std::mem::take(&mut self.subject),
            answer,
        );
    }
}

impl Drop for HeldReservation {
    fn drop(&mut self) {
        if !self.done {
            tracing::debug!(reservation_id = %self.id, "reservation dropped unsettled; charging it in full");
            let s = Settlement {
                actual_tokens: self.reserved_tokens,
                upstream_failed: false,
                actual: if self.amounts.is_empty() {
                    Actual::Tokens
                } else {
                    Actual::PerSpec(std::mem::take(&mut self.amounts))
                },
            };
            // Drop may run outside a runtime only at process exit; then the hold expires by TTL.
            if tokio::runtime::Handle::try_current().is_ok() {
                self.finish(Settling::of(s, Outcome::Abandoned));
            }
        }
    }
}
