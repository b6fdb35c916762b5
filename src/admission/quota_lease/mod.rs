//! Quota leases (DESIGN "Leased quota"): hot budgets spent
//! in-process from batches the shared store grants.
//!
//! A layer of the gateway's store ([`super::GatewayStore`]), like the deny
//! cache and the failure policy: a reservation whose every budget is
//! covered by a live lease of this gateway is decided here, all-or-nothing,
//! with its hold kept here; its extensions come from the leases and its
//! settlement refunds into them. A reservation naming any budget without a
//! lease goes to the store as before, one call. A budget is leased once
//! this gateway's demand on it passes `lease.min_rate` requests per second;
//! a background task ([`QuotaLeases::spawn_keeper`]) grants, tops up,
//! reports and gives back, one store call per budget domain per round, off
//! the request path.
//!
//! - [`book`]: the synchronous core (leases, local holds, decisions).
//! - [`plan`]: which store calls are due and what their replies change.
//! - [`demand`]: this gateway's rate per budget.
//!
//! # Bounds
//!
//! Without faults a lease is pre-debited: the store's budget plus what is
//! out on leases never exceeds what the budget admits, so admission is
//! never above the limit.
//!
//! Stranding (DESIGN "Leases that do not strand the limit"). Three rules
//! keep units on leases from being refused while the budget allows them:
//! a lease short of a request refuses it only when the store's last reply
//! had less free than the request needs or its last grant or top-up was
//! granted short (a saturated store: a grant takes at most half of what
//! is free, so some is always left), else an exact store reservation
//! decides, against what is not leased out; a request the store refuses
//! is decided again from this gateway's leases ([`QuotaLeases::reserve_refused`],
//! after a grant or top-up on the wire or due: a grant is debited before
//! its reply, and the requests queued for the store behind it would
//! otherwise be refused with its units here); and a top-up the store
//! grants short while another lease holds units starts a recall, on
//! which every holder that spent nothing since its previous call gives
//! back all it holds (`plan`), taken off its lease when the line is sent.
//!
//! *Proof that the bound is unchanged.* An admission is one of: (a) an
//! exact store reservation, which the store's bucket, quota and slot
//! arithmetic decides as without leases; (b) a spend of `c` units of a
//! lease of this gateway, allowed only while `granted − given_back −
//! spent ≥ c` for every budget of it, all checked before any is debited;
//! those units were debited in the store at grant. Rule two only turns
//! a store refusal (which debited nothing) into case (b); rule one only
//! chooses between (a), (b) and a refusal. A recall writes no count in
//! the store; its give back credits the store with units the lease
//! stops spending before the line leaves (its `given_back` is raised at
//! once, and the store's reply replaces it), so no unit is both given
//! back and spent, and no debt comes of it. Hence what the store has
//! debited plus what leases hold unspent never exceeds what the budget
//! admitted over any interval from a cold start (burst + rate × length
//! for a bucket), and an interval starting with leases out admits at
//! most their unspent units more, as before; a recall only lowers those.
//! What a gateway holds and does not spend is stranded (refused
//! elsewhere) until a recall's give back lands, about 5/8 of a report
//! interval: at most `max_fraction` of a budget's capacity per gateway,
//! in practice one report interval of its demand. Faults (DESIGN "Leased quota, faults"):
//! a gateway that dies loses what its leases held (the store counts it as
//! spent; a bucket refills it, a quota keeps it, slots expire with the
//! lease); a failover that loses a grant lets the gateway spend what the
//! new primary never debited, at most that lease; a partitioned gateway
//! spends only what its unexpired leases hold. Refunds of reservations
//! that outlive their lease (fenced, expired) are not returned, and their
//! debt is not charged: at most the estimate error of the reservations in
//! flight at the fence. Their extensions are paid by their lease while it
//! is unexpired, closing or not, then reserved exactly in the store
//! (`local_hold`); the slots of a fenced or expired concurrency lease are
//! leased again for its requests at the next round (`plan`).
//!
//! The book sweeps idle budgets every [`book::SWEEP_EVERY`]: its size
//! follows the budgets in use, not every end user ever seen.

pub mod book;
pub mod bounds;
pub mod demand;
mod local_hold;
pub mod metrics;
pub mod plan;
#[cfg(test)]
mod split_tests;
#[cfg(test)]
mod stranding_tests;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub use book::{Book, BookSettings, Decision, LeaseOff, Refused};
pub use local_hold::{exhausted, Extension, OverflowEnd, StoreStep};
pub use plan::{Applied, Call};

use crate::budget::quota_lease::LeaseStore;
use crate::budget::{
    ExtendOutcome, RenewOutcome, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement, Step,
};
use crate::config::store::LeasePolicy;

/// How often the keeper looks for due calls, at most.
const TICK_MIN: Duration = Duration::from_millis(5);
/// ... and at least.
const TICK_MAX: Duration = Duration::from_millis(50);

/// The lease layer's state, shared by every serving thread.
pub struct QuotaLeases {
    book: Mutex<Book>,
    store: Arc<dyn LeaseStore>,
    timeout: Duration,
    base: Instant,
    wake: Notify,
    /// Notified after every lease call's replies are applied: a
    /// reservation the store refused waits here for a grant or top-up on
    /// the wire ([`Self::reserve_refused`]).
    applied: Notify,
    /// The longest a refused reservation waits for that reply: the store
    /// timeout, at most half a report interval.
    refused_wait: Mutex<Duration>,
    tick: Duration,
    /// Book lock acquisitions on behalf of a hold (its settle, extend,
    /// renew and their bookkeeping): read by tests that check a hold goes
    /// where it was admitted.
    hold_locks: AtomicU64,
}

/// What settling a lease-admitted hold found under the book's one lock.
pub enum HeldSettle {
    /// Settled here; `None` when the book does not hold it (the store does).
    Done(Option<SettleOutcome>),
    /// Its overflows must be settled in the store first (then
    /// [`QuotaLeases::settle`]).
    Overflows(Vec<OverflowEnd>),
}

impl QuotaLeases {
    /// Leases under `policy` through `store`, each call ending after
    /// `timeout`. `gateway_id` makes lease ids unique per process.
    pub fn new(
        policy: &LeasePolicy,
        off: LeaseOff,
        store: Arc<dyn LeaseStore>,
        timeout: Duration,
        gateway_id: &str,
    ) -> Self {
        Self {
            book: Mutex::new(Book::new(settings(policy, timeout), off, gateway_id)),
            store,
            timeout,
            base: Instant::now(),
            wake: Notify::new(),
            applied: Notify::new(),
            refused_wait: Mutex::new(refused_wait(policy, timeout)),
            tick: (policy.report_interval / 40).clamp(TICK_MIN, TICK_MAX),
            hold_locks: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Self::lock`] on behalf of a hold, counted.
    fn lock_for_hold(&self) -> MutexGuard<'_, Book> {
        // Relaxed: a tally read by tests, ordering nothing.
        self.hold_locks.fetch_add(1, Ordering::Relaxed);
        self.lock()
    }

    /// Book lock acquisitions on behalf of holds so far (tests).
    #[doc(hidden)]
    pub fn hold_locks(&self) -> u64 {
        self.hold_locks.load(Ordering::Relaxed)
    }

    /// Decides `r` from leases ([`Decision::Local`]), splits it between
    /// the leases and the store ([`Decision::Split`]), or leaves it to the
    /// store.
    pub fn reserve(&self, r: &ReserveRequest) -> Decision {
        let now = self.now();
        let (decision, nudge) = {
            let mut book = self.lock();
            let d = book.reserve(r, now);
            (d, std::mem::take(&mut book.nudge))
        };
        if nudge {
            self.wake.notify_one();
        }
        match &decision {
            Decision::Local(_) => metrics::decision(true),
            Decision::Store => metrics::decision(false),
            Decision::Split { .. } => metrics::split(),
        }
        decision
    }

    /// Splits reservations whose deployment alone is leased, as a store
    /// that keeps tenants and deployments in two domains wants.
    pub fn set_split(&self, on: bool) {
        self.lock().set_split(on);
    }

    /// The specs of split reservation `id` the store holds (its first
    /// `n`), or `None` when `id` is not split.
    pub fn split_at(&self, id: &str) -> Option<usize> {
        self.lock_for_hold().split_at(id)
    }

    /// Voids the local hold of `id` (a split reservation the store did not
    /// admit): its units go back to the leases.
    pub fn void_local(&self, id: &str) {
        let now = self.now();
        self.lock_for_hold().settle(
            id,
            &Settlement {
                actual_tokens: 0,
                upstream_failed: true,
                actual: crate::budget::Actual::Void,
            },
            now,
        );
    }

    /// The store (or its deny cache) refused `r`, which [`Self::reserve`]
    /// sent there: decided from this gateway's leases when they cover it
    /// now, or after the reply of a grant or top-up of its budgets (on the
    /// wire, or sent at its spacing: it waits for the lease calls' replies
    /// at most the store timeout and half a report interval); `None` when
    /// the refusal stands. The units this
    /// gateway holds are debited in the store already: the store's refusal
    /// could not count them, and its own requests must not leave them
    /// stranded. Only the refusal path runs this.
    pub async fn reserve_refused(&self, r: &ReserveRequest) -> Option<ReserveOutcome> {
        let wait = *self.refused_wait.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + wait;
        loop {
            let applied = self.applied.notified();
            tokio::pin!(applied);
            applied.as_mut().enable();
            let (refused, nudge) = {
                let mut book = self.lock();
                let d = book.reserve_refused(r, self.now());
                (d, std::mem::take(&mut book.nudge))
            };
            if nudge {
                self.wake.notify_one();
            }
            match refused {
                Refused::Admitted(o) => {
                    metrics::decision(true);
                    return Some(o);
                }
                Refused::Stands => return None,
                Refused::Pending => {
                    if tokio::time::timeout_at(deadline, applied).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// The store failed to decide `r`: its demand is taken back.
    pub fn store_failed(&self, r: &ReserveRequest) {
        let now = self.now();
        self.lock().uncount(r, now);
    }

    /// True when `id` is a reservation decided here.
    pub fn holds(&self, id: &str) -> bool {
        self.lock_for_hold().holds(id)
    }

    /// Extends a local hold from its leases; when they are short, asks the
    /// store for a top-up first (off the request path for reservations,
    /// on it for a stream that would otherwise be cut off); when they are
    /// still short, answers the store call that extends it exactly
    /// (`local_hold`: a stream with budget left is not cut off).
    pub async fn extend(&self, id: &str, step: &Step) -> Option<Result<ExtendOutcome, StoreStep>> {
        if let Extension::Done(o) = self.lock_for_hold().extend(id, step, self.now())? {
            return Some(Ok(o));
        }
        self.round().await;
        let mut book = self.lock_for_hold();
        match book.extend(id, step, self.now())? {
            Extension::Done(o) => Some(Ok(o)),
            Extension::Short => book.overflow_step(id, step).map(Err),
        }
    }

    /// The answer to an overflow reservation of `id` ([`StoreStep::Reserve`]):
    /// `Some(true)` admitted, `Some(false)` refused, `None` unknown.
    pub fn overflow_reserved(&self, id: &str, ov_id: &str, admitted: Option<bool>, tokens: u64) {
        self.lock_for_hold()
            .overflow_reserved(id, ov_id, admitted, tokens);
    }

    /// `granted` tokens more on `id`'s overflow ([`StoreStep::Extend`]).
    pub fn overflow_extended(&self, id: &str, granted: u64) {
        self.lock_for_hold().overflow_extended(id, granted);
    }

    /// The store calls that settle `id`'s overflows, before [`Self::settle`].
    pub fn overflow_ends(&self, id: &str, s: &Settlement) -> Vec<OverflowEnd> {
        self.lock_for_hold().overflow_ends(id, s)
    }

    /// Settles (or voids) a local hold.
    pub fn settle(&self, id: &str, s: &Settlement) -> Option<SettleOutcome> {
        let now = self.now();
        self.lock_for_hold().settle(id, s, now)
    }

    /// Settles (or voids) a local hold under one lock of the book, unless
    /// it has overflows to settle in the store first.
    pub fn settle_held(&self, id: &str, s: &Settlement) -> HeldSettle {
        let now = self.now();
        let mut book = self.lock_for_hold();
        let ends = book.overflow_ends(id, s);
        if ends.is_empty() {
            HeldSettle::Done(book.settle(id, s, now))
        } else {
            HeldSettle::Overflows(ends)
        }
    }

    /// A local hold's slots live as long as its leases: nothing to renew
    /// (`None` when the book does not hold `id`, or holds it split: the
    /// store's hold has the slots).
    pub fn renew(&self, id: &str) -> Option<RenewOutcome> {
        let book = self.lock_for_hold();
        let ttl = book.settings.ttl;
        (book.holds(id) && book.split_at(id).is_none()).then(|| RenewOutcome::Renewed {
            slot_lease_until_micros: book.utc(self.now()).saturating_add(ttl),
        })
    }

    /// Applies a reloaded `[store.lease]`.
    pub fn set_policy(&self, policy: &LeasePolicy) {
        *self.refused_wait.lock().unwrap_or_else(|e| e.into_inner()) =
            refused_wait(policy, self.timeout);
        self.lock()
            .set_policy(settings(policy, self.timeout), LeaseOff::of(policy));
    }

    /// Leases held now.
    pub fn leases(&self) -> usize {
        self.lock().leases()
    }

    /// Units this gateway holds on a lease of budget `key`.
    pub fn leased_units(&self, key: &str) -> Option<i64> {
        self.lock().leased_units(key)
    }

    /// What is out on leases for each of `specs`, fleet-wide (the store's
    /// view, as of the last reports).
    pub async fn leased_out(
        &self,
        specs: &[crate::budget::BudgetSpec],
    ) -> Result<Vec<crate::budget::quota_lease::LeasedOut>, crate::budget::StoreError> {
        match tokio::time::timeout(self.timeout, self.store.leased_out(specs)).await {
            Ok(r) => r,
            Err(_) => Err(crate::budget::StoreError::Timeout),
        }
    }

    /// One planning round: sends every due call and applies the replies.
    pub async fn round(&self) {
        let (calls, entries) = {
            let mut book = self.lock();
            (book.due(self.now()), book.entries())
        };
        metrics::book_entries(entries);
        self.send(calls).await;
    }

    /// Sends `calls` (one per budget domain) all at once and applies each
    /// call's replies as they come: a domain whose primary is failing over
    /// fails (or times out) its own lines alone, and delays no other
    /// domain's grants and reports.
    async fn send(&self, calls: Vec<Call>) {
        let mut pending: futures_util::stream::FuturesUnordered<_> = calls
            .into_iter()
            .map(|call| async move {
                metrics::call();
                let sent = tokio::time::timeout(self.timeout, self.store.lease(&call.lines)).await;
                (call, sent)
            })
            .collect();
        while let Some((call, sent)) = futures_util::StreamExt::next(&mut pending).await {
            let replies = match sent {
                Ok(Ok(r)) if r.len() == call.lines.len() => Some(r),
                Ok(Ok(r)) => {
                    tracing::warn!(
                        lines = call.lines.len(),
                        replies = r.len(),
                        "lease call: reply count differs; resending"
                    );
                    None
                }
                Ok(Err(e)) => {
                    tracing::warn!(domain = %call.domain, error = %e, "lease call failed; resending");
                    None
                }
                Err(_) => {
                    tracing::warn!(domain = %call.domain, "lease call timed out; resending");
                    None
                }
            };
            let applied = self.lock().apply(&call, replies.as_deref(), self.now());
            self.applied.notify_waiters();
            metrics::applied(&applied);
        }
        metrics::held(self.leases());
    }

    /// Wakes the keeper (a budget became hot, a lease ran short).
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Runs the keeper on the current runtime until the handle is aborted.
    pub fn spawn_keeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(me.tick) => {}
                    _ = me.wake.notified() => {}
                }
                // Each round on its own: a round waits for its slowest
                // call (a domain failing over: up to the timeout), and the
                // next rounds must meanwhile serve the other domains. A
                // line on the wire is not planned again until its reply.
                let round = me.clone();
                tokio::spawn(async move { round.round().await });
            }
        })
    }

    /// Gives back every lease (shutdown, after the last settlement).
    pub async fn end_all(&self) {
        let calls = self.lock().end_all(self.now());
        self.send(calls).await;
    }
}

/// How long a refused reservation waits for a lease call's reply.
fn refused_wait(policy: &LeasePolicy, timeout: Duration) -> Duration {
    timeout.min(policy.report_interval / 2)
}

/// The book's settings from `[store.lease]`.
pub fn settings(policy: &LeasePolicy, timeout: Duration) -> BookSettings {
    let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
    BookSettings {
        min_rate: policy.min_rate,
        ttl: us(policy.ttl),
        report: us(policy.report_interval),
        max_fraction_ppm: (policy.max_fraction * 1e6).round().clamp(1.0, 1e6) as u64,
        margin: us(policy.clock_margin),
        // Long enough to answer a retried call and the final end of a
        // lease whose reservations were still settling.
        record_ttl: us(policy.ttl) * 4 + us(timeout) * 2,
        fleet_size: policy.fleet_size,
    }
}
