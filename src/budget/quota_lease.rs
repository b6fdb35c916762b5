//! Quota leases at the store (DESIGN "Leased quota"): the calls
//! with which a gateway takes a batch of a budget's capacity to spend
//! in-process, tops it up, reports what it spent and gives back the rest.
//!
//! This module is the store-side contract only; the gateway's lease layer
//! (`crate::admission::quota_lease`) decides when to call it. Both stores
//! implement [`LeaseStore`] with the same semantics, checked against each
//! other by the differential test: the Redis store in `lua/lease.lua`, the
//! memory store in `budget/memory/quota_lease.rs` (used by the fleet simulation
//! and the differential test; a gateway on the memory store never leases).
//!
//! # A lease
//!
//! A lease is an amount already debited from one budget (one key of one
//! scope), in the budget's unit: tokens or µ$ for amount budgets, requests
//! for request budgets, slots for concurrency. The store keeps one record
//! per (budget key, lease id) — the same id on two budgets names two
//! leases: the budget's policy epoch it was granted under, units
//! granted, units given back, units reported spent, the last sequence
//! number applied and what it answered, the lease's expiry, and for a
//! calendar quota the window it was taken from. Beside the records, each
//! budget has an epoch record: its policy epoch, the policy it was set
//! under and its live leases (what [`LeaseStore::leased_out`] reads); it is
//! kept as long as the longest of its lease records.
//!
//! # One call
//!
//! [`LeaseStore::lease`] applies the lines of one budget domain in one call
//! (one script on one slot), each line on its own (not all-or-nothing),
//! in order, and answers one [`LeaseReply`] per line. Every number of a line
//! is first bounded ([`LeaseLine::bounded`]); then, in this order:
//!
//! - **Idempotent by (lease id, seq).** A line whose `seq` is not above the
//!   record's last applied seq changes nothing and answers what the last
//!   applied line answered (with the store's current time, and
//!   `granted_now` 0): a call whose reply was lost is retried with the same
//!   lines and never grants or gives back twice. A line for a closed
//!   record (ended or fenced) likewise answers what closed it. A line with
//!   `seq == 1` and no record is a grant of a new lease; `seq != 1` and no
//!   record answers [`LeaseReply::Unknown`] (the record expired, or the
//!   grant never arrived); neither writes anything.
//! - **Epoch.** Each budget has a policy epoch in the store (starting at 1)
//!   and the policy it was set under (the spec's [`super::BudgetKind`]). A line
//!   that asks for units (`want > 0`) under a spec whose kind differs from
//!   the stored policy bumps the epoch and stores the new policy first (a
//!   bucket is brought to the new policy as a refused reservation's
//!   `adopt_policies` does: refilled to now at the old rate, clamped to the
//!   new burst). A line that asks for nothing (a report, a give back, an
//!   end) never bumps it: a gateway that reloaded ends its old lease with
//!   the lease's old spec, and that must not undo another gateway's bump.
//!   During a rolling reload a gateway still on the old policy that tops up
//!   bumps it back, fencing the new leases, until every gateway runs the
//!   new policy: leases are fenced, never over-spent.
//! - **Report** (`spent`): the units the gateway has spent from this lease,
//!   net (reservations, extensions and debt, less refunds; for concurrency
//!   the slots in use now). The latest line's figure stands (lines apply in
//!   seq order): a refund lowers it, and what it no longer counts is
//!   unspent, given back at the end. `spent` above what the lease holds (granted − given
//!   back) is debt: it is charged to the budget at once (a bucket may go
//!   into debt down to its floor, a quota's used count grows, in the
//!   current window, up to 2^52) and counted as granted, so `granted −
//!   given_back − spent` never goes below zero. Concurrency has no debt:
//!   `spent` only bounds what can be given back.
//! - **Fenced.** A line for a lease whose epoch is not the budget's current
//!   epoch grants nothing, gives back nothing (what the lease holds is
//!   treated as spent; a concurrency lease's slots stay until its expiry),
//!   still charges its debt (above), closes the record, and answers
//!   [`LeaseReply::Fenced`].
//! - **Expired.** A line for a lease whose expiry has passed (its record is
//!   still kept) likewise grants and gives back nothing, charges its debt,
//!   closes the record and answers [`LeaseReply::Ended`] with what earlier
//!   lines gave back: an expired lease gives nothing back (the store
//!   assumes it was spent: a bucket refills on its own; a quota stays
//!   debited; slots leave the slot set with their expiry).
//! - **Grant and top-up** (`want > 0`): adds `min(want, floor(free / 2))`
//!   units, where `free` is what the budget has now (a bucket's whole
//!   units after refill, a quota's limit − used, free slots): a nearly spent
//!   budget is never parcelled out to one gateway, and its last unit is
//!   always served by exact reservations. A grant of 0 units is not an
//!   error: the lease is live with what it had. A concurrency lease's
//!   slots are members of the budget's slot set: with `g` = granted and
//!   `b` = given back, the members `<lease id>#<n>` for `b < n ≤ g`, each
//!   with the lease's expiry as its score, so exact reservations count them.
//! - **Policy of the counts.** Debt, give backs and ends change a
//!   bucket's level at the rate and burst it is stored with (the lease's
//!   policy may be older: a reload since), never writing the lease's back;
//!   only a grant or top-up brings a bucket under the line's policy, as a
//!   reservation does.
//! - **Give back** (`give_back`): returns that many unspent units (at most
//!   granted − given back − spent) to the budget: a bucket only up to its
//!   capacity (what does not fit is dropped), a quota only to the window it
//!   was taken from, slots by removing members. [`LeaseState::given_back`]
//!   counts what left the lease; [`LeaseReply::Ended`]'s `given_back` what
//!   reached the budget (after the capacity cap, whole units).
//! - **End** (`end`): gives back everything unspent as above (a concurrency
//!   lease's slots in use stay until its expiry) and closes the record
//!   (kept until `record_ttl_micros` to answer retries).
//! - **Recall.** A live line that asks for units (`want > 0`) and is
//!   granted fewer than it asked, while another live lease of the budget
//!   holds unspent units (as its last line reported them), starts the
//!   budget's recall: it is on until now + the line's `ttl_micros` (one
//!   lease lifetime, so every live lease makes at least one line under
//!   it), or until a line's `want` is granted in full. Every live line
//!   that does not end its lease answers whether the recall is on
//!   ([`LeaseState::recall`]; a replayed line answers false). A recall
//!   changes no count: the holders give back, with ordinary lines, what
//!   they do not spend (the lease layer's rule: an idle holder, all it
//!   holds), and the store grants it to the next top-up. It lives in the
//!   epoch record.
//! - **Expiry.** Every live line that does not end the lease moves its
//!   expiry to now + `ttl_micros` (store time), for a calendar quota never
//!   past the end of the lease's window: a quota lease never outlives the
//!   window it was taken from, so nothing of it is spent or given back in
//!   another. A live record is kept until now + `record_ttl_micros`, a
//!   closed one for `record_ttl_micros` from the line that closed it.
//!
//! # Bounds (every value an integer below 2^53, exact as a Lua double)
//!
//! [`LeaseLine::bounded`] caps `seq`, `want`, `give_back` and `spent` at
//! [`MAX_COUNT`] (2^52) and both TTLs at [`MAX_LEASE_TTL_MICROS`] (10^13 µs,
//! about 116 days; `ttl_micros` at least 1, `record_ttl_micros` at least
//! `ttl_micros`). Then, with limits as validated at config load (bucket
//! bursts ≤ 10^10, quotas ≤ 10^13: `bucket`, `amounts`):
//!
//! - A grant is at most half a capacity (≤ 5·10^12 units; a bucket's
//!   5·10^9 tokens are 3·10^14 bucket units) and at most `2^52 − granted`:
//!   a lease's `granted` never passes 2^52, so `granted + grant < 2^53`;
//!   debt adds at most `spent ≤ 2^52` to it before the same cap, so the
//!   sum is at most 2^53, still exact. `given_back ≤ granted` and
//!   `spent ≤ 2^52`. (At 10^10 tokens a minute a lease would take 800 days
//!   to reach the cap; the lease layer renews leases under new ids long
//!   before.)
//! - What reaches a budget is bounded as a settlement's is: a bucket is
//!   debited or credited at most 10^10 tokens per line (6·10^14 units,
//!   `bucket::to_units`), debt is clamped at the bucket's floor; a quota's
//!   count grows by at most [`MAX_AMOUNT`](super::MAX_AMOUNT) per line and is capped at 2^52,
//!   so `count + amount < 2^53`; a give back takes at most the count.
//! - Times: `now` < 2^53 µs (year 2255) less 10^13, so expiries `now + ttl`
//!   stay below 2^53. Epochs grow by one per policy change.
//! - Concurrency members are numbered up to `granted` ≤ 2^52 (formatted
//!   exactly with `%d`); a line adds or removes at most half the slots.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use super::{BudgetSpec, StoreError, MAX_COUNT};

/// One lease operation on one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLine {
    /// The budget, with its policy under the caller's config.
    pub spec: BudgetSpec,
    /// The lease id: unique per gateway and lease (gateway-made).
    pub lease: Arc<str>,
    /// 1 for the grant, one more for every later line of this lease.
    pub seq: u64,
    /// The epoch the lease was granted under (0 for a grant): the gateway's
    /// view; the store fences by the epoch in the lease's record.
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

/// Longest lease expiry and record lifetime a line may ask, µs (about 116
/// days): keeps `now + ttl` below 2^53.
pub const MAX_LEASE_TTL_MICROS: u64 = 10_000_000_000_000;

/// A line's numbers within the bounds the stores compute with (module
/// docs, "Bounds"): what both stores apply, so they agree on any input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundedLine {
    /// [`LeaseLine::seq`], at most 2^52.
    pub seq: u64,
    /// [`LeaseLine::want`], at most 2^52.
    pub want: u64,
    /// [`LeaseLine::give_back`], at most 2^52.
    pub give_back: u64,
    /// [`LeaseLine::spent`], at most 2^52.
    pub spent: u64,
    /// [`LeaseLine::end`].
    pub end: bool,
    /// [`LeaseLine::ttl_micros`], in `1 ..= MAX_LEASE_TTL_MICROS`.
    pub ttl_micros: u64,
    /// [`LeaseLine::record_ttl_micros`], in `ttl_micros ..= MAX_LEASE_TTL_MICROS`.
    pub record_ttl_micros: u64,
}

impl LeaseLine {
    /// The line's numbers as the stores apply them (module docs, "Bounds").
    pub fn bounded(&self) -> BoundedLine {
        let ttl = self.ttl_micros.clamp(1, MAX_LEASE_TTL_MICROS);
        BoundedLine {
            seq: self.seq.min(MAX_COUNT),
            want: self.want.min(MAX_COUNT),
            give_back: self.give_back.min(MAX_COUNT),
            spent: self.spent.min(MAX_COUNT),
            end: self.end,
            ttl_micros: ttl,
            record_ttl_micros: self.record_ttl_micros.clamp(ttl, MAX_LEASE_TTL_MICROS),
        }
    }
}

/// What the store answered for one [`LeaseLine`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum LeaseReply {
    /// The lease is live.
    Live(LeaseState),
    /// The lease was closed by this line's `end`, or found expired by this
    /// line (or had been closed by an earlier line: then what that one
    /// answered).
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
    /// Units granted in all: grant, top-ups and debt charged (spending
    /// beyond what the lease held, module docs).
    pub granted: u64,
    /// Units that left the lease by give backs in all (whether or not a
    /// full bucket had room for them): the lease holds `granted −
    /// given_back`.
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
    /// The calendar window the lease was taken from (quotas only):
    /// [`super::Window::id`].
    pub window: Option<u64>,
    /// The budget's recall is on (module docs, "Recall"): another gateway
    /// asked for units the store could not grant while this lease held
    /// some; the holder gives back what it does not spend. False for a
    /// replayed line.
    pub recall: bool,
}

/// What is out on leases for one budget (admin API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeasedOut {
    /// The budget's current epoch (1 if it has no epoch record: never
    /// leased, or no lease record of it is kept any more).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{BudgetKind, BudgetName, Scope};

    fn line(seq: u64, n: u64, ttl: u64, record_ttl: u64) -> LeaseLine {
        LeaseLine {
            spec: BudgetSpec {
                scope: Scope::Tenant("t".into()),
                name: BudgetName::Tpm,
                kind: BudgetKind::Bucket {
                    per_minute: 10,
                    burst: 10,
                },
                key: "k".into(),
                refund_unused: true,
                shadow: false,
            },
            lease: "l".into(),
            seq,
            epoch: 0,
            want: n,
            give_back: n,
            spent: n,
            end: false,
            ttl_micros: ttl,
            record_ttl_micros: record_ttl,
        }
    }

    /// Bad input: a gateway bug sending u64::MAX must leave every value the
    /// stores compute with below 2^53 (module docs, "Bounds").
    #[test]
    fn every_number_of_a_line_is_bounded_below_2_pow_53() {
        let b = line(u64::MAX, u64::MAX, u64::MAX, 0).bounded();
        let cap = 1u64 << 52;
        assert_eq!((b.seq, b.want, b.give_back, b.spent), (cap, cap, cap, cap));
        assert_eq!(b.ttl_micros, MAX_LEASE_TTL_MICROS);
        assert_eq!(
            b.record_ttl_micros, MAX_LEASE_TTL_MICROS,
            "a record outlives its lease"
        );
        // Sums the stores form: granted + grant, count + debt, now + ttl.
        let now_2255 = (1u64 << 53) - MAX_LEASE_TTL_MICROS;
        assert!(now_2255 + b.ttl_micros <= 1 << 53);
        assert!(cap + cap <= 1 << 53);
    }

    #[test]
    fn a_lease_lives_at_least_a_microsecond_and_its_record_as_long() {
        let b = line(1, 5, 0, 0).bounded();
        assert_eq!((b.ttl_micros, b.record_ttl_micros), (1, 1));
        let b = line(1, 5, 5_000_000, 1_000_000).bounded();
        assert_eq!((b.ttl_micros, b.record_ttl_micros), (5_000_000, 5_000_000));
        let b = line(1, 5, 5_000_000, 60_000_000).bounded();
        assert_eq!(
            (b.seq, b.want, b.record_ttl_micros),
            (1, 5, 60_000_000),
            "in range: unchanged"
        );
    }
}
