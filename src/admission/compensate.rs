//! Lost replies (DESIGN section 13): a reservation whose reply was lost
//! (the call timed out, or the connection dropped after the call was
//! written) may or may not have been applied by the store. It is settled
//! under its own id when the request ends:
//!
//! - refused (fail-closed, or refused by the local limiter while failing
//!   open): voided — a hold is refunded in full, and where there is none a
//!   void tombstone makes the late reservation write nothing;
//! - served (fail-open): settled with its real usage; if the store has no
//!   hold (the reservation had not applied), voided as above.
//!
//! A call that provably never reached the store ([`StoreError::NotSent`])
//! is neither compensated nor counted. Pending compensations are bounded
//! ([`MAX_PENDING`]); each is retried until it lands or its hold would
//! have expired, when it is dropped and counted
//! (`budgetgate_compensations_total{outcome="dropped"}`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::{BudgetStore, SettleOutcome, Settlement, StoreError};
use crate::metrics;

/// Most compensations pending at once per gateway.
pub const MAX_PENDING: usize = 10_000;

/// First pause between attempts, doubled up to [`RETRY_MAX`].
const RETRY_START: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What a compensation does.
#[derive(Debug, Clone)]
pub enum Compensation {
    /// The request was refused: void the id.
    Void,
    /// The request was served: settle its real usage, voiding the id if
    /// the store has no hold.
    Settle(Settlement),
}

/// True when the outcome of a call that failed with `e` is unknown: the
/// call may have been applied.
pub fn outcome_unknown(e: &StoreError) -> bool {
    !matches!(e, StoreError::NotSent(_))
}

/// The pending compensations of one gateway.
#[derive(Default)]
pub struct Compensator {
    pending: AtomicUsize,
    dropped: AtomicUsize,
}

impl Compensator {
    /// Compensations not landed yet.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Compensations given up (too many pending, hold expired, gateway stopped).
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::Acquire)
    }

    /// Queues `what` for reservation `id` through `store` (on the calling
    /// runtime), retried until it lands or `hold_ttl` has passed. Counted
    /// as dropped at once when [`MAX_PENDING`] are pending.
    pub fn submit(
        self: &Arc<Self>,
        store: Arc<dyn BudgetStore>,
        id: String,
        what: Compensation,
        hold_ttl: Duration,
    ) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::AcqRel);
            metrics::compensation("dropped");
            tracing::warn!(reservation_id = %id, "lost-reply compensation dropped: too many pending");
            return;
        }
        let pending = Pending {
            of: self.clone(),
            id,
            outcome: None,
        };
        tokio::spawn(async move {
            let outcome = run(store.as_ref(), &pending.id, what, hold_ttl).await;
            pending.finish(outcome);
        });
    }
}

/// One compensation in flight. Dropped when it ends, or with its task when
/// the runtime stops first (process shutdown): then it is counted as
/// dropped, never lost silently.
struct Pending {
    of: Arc<Compensator>,
    id: String,
    outcome: Option<&'static str>,
}

impl Pending {
    fn finish(mut self, outcome: &'static str) {
        self.outcome = Some(outcome);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.of.pending.fetch_sub(1, Ordering::AcqRel);
        let outcome = self.outcome.unwrap_or("dropped");
        if outcome == "dropped" {
            self.of.dropped.fetch_add(1, Ordering::AcqRel);
        }
        metrics::compensation(outcome);
        if self.outcome.is_none() {
            tracing::warn!(reservation_id = %self.id, "lost-reply compensation dropped: the gateway stopped first");
        } else {
            tracing::info!(reservation_id = %self.id, outcome, "lost-reply compensation");
        }
    }
}

/// Runs one compensation to its end; returns its metric label.
async fn run(
    store: &dyn BudgetStore,
    id: &str,
    what: Compensation,
    hold_ttl: Duration,
) -> &'static str {
    let until = Instant::now() + hold_ttl;
    let ttl_micros = hold_ttl.as_micros() as u64;
    let mut pause = RETRY_START;
    let mut what = what;
    loop {
        let result = match &what {
            Compensation::Void => store.void(id, ttl_micros).await,
            Compensation::Settle(s) => store.settle(id, s).await,
        };
        match (&what, result) {
            // Served, but the store has no hold: the reservation had not
            // applied; a void tombstone keeps it from applying late.
            (Compensation::Settle(_), Ok(SettleOutcome::Unknown)) => {
                what = Compensation::Void;
                continue;
            }
            (Compensation::Settle(_), Ok(_)) => return "settled",
            (Compensation::Void, Ok(SettleOutcome::Voided)) => return "voided_ahead",
            (Compensation::Void, Ok(_)) => return "voided",
            (_, Err(e)) => {
                if Instant::now() + pause >= until {
                    tracing::warn!(reservation_id = %id, error = %e, "lost-reply compensation dropped: its hold has expired");
                    return "dropped";
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::memory::MemoryStore;
    use crate::budget::{
        BudgetKind, BudgetName, BudgetSpec, ReserveOutcome, ReserveRequest, Scope,
    };
    use crate::clock::ManualClock;

    fn request(id: &str) -> ReserveRequest {
        let scope = Scope::Tenant("t".into());
        ReserveRequest {
            share: None,
            id: id.into(),
            costs: crate::budget::Costs::tokens(100),
            common: vec![BudgetSpec {
                key: "k".into(),
                scope,
                name: BudgetName::Tpm,
                kind: BudgetKind::Bucket {
                    per_minute: 1000,
                    burst: 1000,
                },
                refund_unused: true,
                shadow: false,
            }],
            candidates: vec![vec![]],
            slot_lease_micros: 1_000_000,
            hold_ttl_micros: 60_000_000,
            requester: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_served_request_whose_reserve_never_applied_is_voided_ahead() {
        let store = Arc::new(MemoryStore::new(Arc::new(ManualClock::new(1_000))));
        let c = Arc::new(Compensator::default());
        let s = Settlement {
            actual_tokens: 40,
            upstream_failed: false,
            actual: Default::default(),
        };
        c.submit(
            store.clone(),
            "lost".into(),
            Compensation::Settle(s.clone()),
            Duration::from_secs(60),
        );
        while c.pending() > 0 {
            tokio::task::yield_now().await;
        }
        // The late reservation writes nothing.
        assert_eq!(store.reserve_sync(&request("lost")), ReserveOutcome::Voided);
        // Applied before the compensation: settled with the real usage.
        assert!(matches!(
            store.reserve_sync(&request("early")),
            ReserveOutcome::Admitted(_)
        ));
        c.submit(
            store.clone(),
            "early".into(),
            Compensation::Settle(s),
            Duration::from_secs(60),
        );
        while c.pending() > 0 {
            tokio::task::yield_now().await;
        }
        let left = store.inspect_sync(&request("x").common)[0].remaining;
        assert_eq!(left, 960, "charged the real usage, once");
    }

    /// A store that never answers in time.
    struct Down;

    #[async_trait::async_trait]
    impl BudgetStore for Down {
        async fn reserve(&self, _: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn extend(
            &self,
            _: &str,
            _: &crate::budget::Step,
        ) -> Result<crate::budget::ExtendOutcome, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn renew(&self, _: &str) -> Result<crate::budget::RenewOutcome, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn settle(&self, _: &str, _: &Settlement) -> Result<SettleOutcome, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn void(&self, _: &str, _: u64) -> Result<SettleOutcome, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn inspect(
            &self,
            _: &[BudgetSpec],
        ) -> Result<Vec<crate::budget::BudgetState>, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn lower(&self, _: &BudgetSpec, _: u64) -> Result<i64, StoreError> {
            Err(StoreError::Timeout)
        }
    }

    #[test]
    fn a_compensation_cut_off_by_shutdown_is_counted_as_dropped() {
        let c = Arc::new(Compensator::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            c.submit(
                Arc::new(Down),
                "r".into(),
                Compensation::Void,
                Duration::from_secs(60),
            );
            // Let it try once and go to sleep before its next attempt.
            tokio::time::sleep(Duration::from_millis(20)).await;
        });
        assert_eq!((c.pending(), c.dropped()), (1, 0), "still retrying");
        drop(rt);
        assert_eq!(
            (c.pending(), c.dropped()),
            (0, 1),
            "counted when the gateway stops"
        );
    }
}
