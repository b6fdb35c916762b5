//! Quota leases at the store (issue 30, DESIGN "Leased quota"): the calls
//! with which a gateway takes a batch of a budget's capacity to spend
//! in-process, tops it up, reports what it spent and gives back the rest.
//!
//! This module is the store-side contract only; the gateway's lease layer
//! (`crate::reservation::quota_lease`) decides when to call it. Both stores
//! implement [`LeaseStore`] with the same semantics, checked against each
//! other by the differential test: the Redis store in `lua/lease.lua`, the
//! memory store in `reserve/memory/lease.rs` (used by the fleet simulation
//! and the differential test; a gateway on the memory store never leases).
//!
//! # A lease
//!
//! A lease is an amount already debited from one budget (one key of one
//! scope), in the budget's unit: tokens or µ$ for amount budgets, requests
//! for request budgets, slots for concurrency. The store keeps one record
//! per lease id: the budget's policy epoch it was granted under, units
//! granted, units given back, units reported spent, the last sequence
//! number applied and what it answered, the lease's expiry, and for a
//! calendar quota the window it was taken from.
//!
//! # One call
//!
//! [`LeaseStore::lease`] applies the lines of one budget domain in one call
//! (one script on one slot), each line on its own (not all-or-nothing),
//! in order, and answers one [`LeaseReply`] per line.
//!
//! - **Idempotent by (lease id, seq).** A line whose `seq` is not above the
//!   record's last applied seq changes nothing and answers what that call
//!   answered (with the store's current time): a call whose reply was lost is
//!   retried with the same lines and never grants or gives back twice. A
//!   line with `seq == 1` and no record is a grant of a new lease; `seq > 1`
//!   and no record answers [`LeaseReply::Unknown`] (the record expired).
//! - **Epoch.** Each budget has a policy epoch in the store (starting at 1)
//!   and the policy it was set under (the spec's [`super::BudgetKind`]). A line
//!   whose spec's kind differs from the stored policy bumps the epoch and
//!   stores the new policy first (a bucket is brought to the new policy as
//!   a reservation would: refilled to now at the old rate, clamped to the
//!   new burst). A line for an existing lease whose epoch is below the
//!   budget's current epoch is **fenced**: it grants nothing, gives back
//!   nothing (what the lease holds is treated as spent), still charges the
//!   debt of `spent` above granted, closes the record, and answers
//!   [`LeaseReply::Fenced`].
//! - **Grant and top-up** (`want > 0`): adds `min(want, floor(free / 2))`
//!   units, where `free` is what the budget has now (a bucket's whole
//!   units, a quota's limit − used, free slots): a nearly spent budget is
//!   never parcelled out to one gateway, and its last units are always
//!   served by exact reservations. A grant of 0 units is not an error: the
//!   lease is live with what it had. A concurrency lease's slots are members
//!   of the budget's slot set (`<lease id>#<n>`) whose lease ends with the
//!   quota lease, so exact reservations count them.
//! - **Report** (`spent`): the cumulative units the gateway spent from this
//!   lease (reservations, extensions and debt, less refunds; for
//!   concurrency the slots in use now). Never decreases for amount and
//!   request budgets; a line with a lower `spent` than recorded keeps the
//!   recorded one. `spent` above what was granted is debt: it is charged to
//!   the budget (a bucket may go into debt, a quota's used count grows).
//! - **Give back** (`give_back`): returns that many unspent units (at most
//!   granted − given back − spent) to the budget: a bucket only up to its
//!   capacity (what does not fit is dropped), a quota only to the window it
//!   was taken from (nothing once that window has ended), slots by removing
//!   members.
//! - **End** (`end`): gives back everything unspent as above, charges any
//!   debt, and closes the record (kept until `record_ttl_micros` to answer
//!   retries).
//! - **Expiry.** Every line that is not `end` and not fenced moves the
//!   lease's expiry to now + `ttl_micros` (store time). A lease that
//!   expires without an `end` gives nothing back: the store assumes it was
//!   spent (a bucket refills on its own; a quota stays debited; slots leave
//!   the slot set with their expiry).

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use super::{BudgetSpec, StoreError};

/// One lease operation on one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLine {
    /// The budget, with its policy under the caller's config.
    pub spec: BudgetSpec,
    /// The lease id: unique per gateway and lease (gateway-made).
    pub lease: Arc<str>,
    /// 1 for the grant, one more for every later line of this lease.
    pub seq: u64,
    /// The epoch the lease was granted under (0 for a grant).
    pub epoch: u64,
    /// Units to add to the lease now.
    pub want: u64,
    /// Units to give back now (not with `end`).
    pub give_back: u64,
    /// Units spent from the lease so far (see the module docs).
    pub spent: u64,
    /// Give back everything unspent and close the lease.
    pub end: bool,
    /// The lease's expiry from now, µs (store time).
    pub ttl_micros: u64,
    /// How long the store keeps the lease record, µs (at least `ttl_micros`).
    pub record_ttl_micros: u64,
}

/// What the store answered for one [`LeaseLine`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum LeaseReply {
    /// The lease is live.
    Live(LeaseState),
    /// The lease was closed by this line's `end` (or had been closed by an
    /// earlier one: then what that one answered).
    Ended {
        /// Units given back to the budget in all (after the capacity cap).
        given_back: u64,
        /// Store time, UTC µs.
        now_micros: u64,
    },
    /// The lease's epoch is older than the budget's: nothing granted or
    /// given back; the gateway drops the lease.
    Fenced {
        /// The budget's current epoch.
        epoch: u64,
        /// Store time, UTC µs.
        now_micros: u64,
    },
    /// No record of this lease (expired, or a later seq of a lease whose
    /// grant never arrived): nothing changed.
    Unknown {
        /// Store time, UTC µs.
        now_micros: u64,
    },
}

/// A live lease as the store sees it after one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseState {
    /// The budget's epoch the lease belongs to.
    pub epoch: u64,
    /// Units granted in all, grant and top-ups.
    pub granted: u64,
    /// Units given back in all.
    pub given_back: u64,
    /// Units granted by this line (0 for a replay).
    pub granted_now: u64,
    /// When the lease ends, store time, UTC µs.
    pub expires_at_micros: u64,
    /// Store time of this call, UTC µs.
    pub now_micros: u64,
    /// What the budget has left for others after this line (whole units;
    /// negative in debt): what sizing and refusal hints read.
    pub free: i64,
    /// The calendar window the lease was taken from (quotas only).
    pub window: Option<u64>,
}

/// What is out on leases for one budget (admin API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeasedOut {
    /// The budget's current epoch (1 if it never had a lease).
    pub epoch: u64,
    /// Live leases of the budget.
    pub leases: u64,
    /// Units out on live leases: granted − given back − reported spent.
    pub units: u64,
}

/// The store calls of quota leases (module docs).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Applies `lines` (all of one budget domain) in one call, each on
    /// its own, in order; one reply per line.
    async fn lease(&self, lines: &[LeaseLine]) -> Result<Vec<LeaseReply>, StoreError>;
    /// What is out on leases, per spec.
    async fn leased_out(&self, specs: &[BudgetSpec]) -> Result<Vec<LeasedOut>, StoreError>;
}
