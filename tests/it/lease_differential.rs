//! Quota-lease calls for the differential property test
//! (`redis_differential`): random lines (grants, top-ups, reports, give
//! backs, ends, retried lines, new leases) on every budget of the case's
//! universe, and policy changes of single budgets, interleaved there with
//! reserve / extend / settle on the same budgets.

use std::collections::HashMap;

use budgetgate::budget::quota_lease::{LeaseLine, LeaseReply};
use budgetgate::budget::{BudgetKind, BudgetSpec};
use proptest::prelude::*;

/// One lease line as drawn: which lease (of a few per budget), which
/// budget, the numbers, and what kind of line.
#[derive(Debug, Clone)]
pub(crate) struct LeaseOp {
    lease: u8,
    budget: u8,
    want: u64,
    give_back: u64,
    /// Added to the lease's cumulative spent (the slots in use, modulo 3,
    /// for concurrency).
    spent: u64,
    /// 0–2 the next line, 3 the last line again (a retry after a lost
    /// reply), 4 an end, 5 a new lease under a new id, 6 a skipped seq, 7
    /// the next line under the policy of the lease's last line (a gateway
    /// that has not reloaded yet, or ends a lease of the old policy).
    mode: u8,
    /// 0: a 5 s lease kept 20 s; 1: 30 s kept 120 s.
    ttl: bool,
}

/// The lines of one lease call (1 to 5 of them).
pub(crate) fn lease_call() -> impl Strategy<Value = Vec<LeaseOp>> {
    // Mostly a few leases of the first budgets (tenant tpm, rpm, slots,
    // tokens per day), so that lines of one lease follow each other and
    // clock steps fall within its life.
    let one = (
        0u8..2,
        prop_oneof![3 => 0u8..4, 1 => any::<u8>()],
        prop_oneof![2 => Just(0u64), 1 => 0u64..50, 1 => 0u64..1500, 1 => 0u64..400_000_000],
        prop_oneof![Just(0u64), 0u64..400],
        prop_oneof![3 => Just(0u64), 2 => 0u64..5, 1 => 0u64..300, 1 => 0u64..3000],
        0u8..8,
        any::<bool>(),
    )
        .prop_map(
            |(lease, budget, want, give_back, spent, mode, ttl)| LeaseOp {
                lease,
                budget,
                want,
                give_back,
                spent,
                mode,
                ttl,
            },
        );
    prop::collection::vec(one, 1..6)
}

/// What the test has sent for one (lease, budget): the id's generation,
/// the last seq, the cumulative spent and the last line.
#[derive(Default)]
struct Sent {
    generation: u32,
    seq: u64,
    spent: u64,
    last: Option<LeaseLine>,
}

/// The gateway side of a case: the leases it holds, by (lease, budget).
#[derive(Default)]
pub(crate) struct Leases {
    sent: HashMap<(u8, usize), Sent>,
}

impl Leases {
    /// The lines of `ops` on `specs` (the case's budgets under their
    /// current policies), for case `case`.
    pub(crate) fn lines(
        &mut self,
        case: u64,
        ops: &[LeaseOp],
        specs: &[BudgetSpec],
    ) -> Vec<LeaseLine> {
        ops.iter()
            .map(|op| {
                let b = op.budget as usize % specs.len();
                let sent = self.sent.entry((op.lease, b)).or_default();
                let spec = match (&sent.last, op.mode) {
                    (Some(last), 7) => &last.spec,
                    _ => &specs[b],
                }
                .clone();
                if op.mode == 3 {
                    if let Some(last) = &sent.last {
                        // Retried as sent, under the policy of then.
                        return last.clone();
                    }
                }
                if op.mode == 5 {
                    *sent = Sent {
                        generation: sent.generation + 1,
                        ..Sent::default()
                    };
                }
                sent.seq += if op.mode == 6 { 2 } else { 1 };
                let spent = match spec.kind {
                    BudgetKind::Concurrency { .. } => op.spent % 3,
                    _ => {
                        sent.spent += op.spent;
                        sent.spent
                    }
                };
                let (ttl, kept) = if op.ttl {
                    (30_000_000, 120_000_000)
                } else {
                    (5_000_000, 20_000_000)
                };
                let line = LeaseLine {
                    spec,
                    lease: format!("c{case}-l{}g{}", op.lease, sent.generation).into(),
                    seq: sent.seq,
                    epoch: 0,
                    want: op.want,
                    give_back: op.give_back,
                    spent,
                    end: op.mode == 4,
                    ttl_micros: ttl,
                    record_ttl_micros: kept,
                };
                sent.last = Some(line.clone());
                line
            })
            .collect()
    }
}

/// Which budget a policy change flips: mostly those the leases use most.
pub(crate) fn policy_change() -> impl Strategy<Value = u8> {
    prop_oneof![3 => 0u8..4, 1 => any::<u8>()]
}

/// The other policy of a budget (a reload): a bucket's rate doubled (its
/// burst kept), a quota's limit half as large again, one slot more.
pub(crate) fn other_policy(spec: &BudgetSpec) -> BudgetSpec {
    let kind = match spec.kind {
        BudgetKind::Bucket { per_minute, burst } => BudgetKind::Bucket {
            per_minute: per_minute * 2,
            burst,
        },
        BudgetKind::Quota { limit, window } => BudgetKind::Quota {
            limit: limit * 3 / 2,
            window,
        },
        BudgetKind::Concurrency { max } => BudgetKind::Concurrency { max: max + 1 },
    };
    BudgetSpec {
        kind,
        ..spec.clone()
    }
}

/// A reply's variant for the outcome counts (`Lease/Live+` when it
/// granted, `Lease/Live(recall)` when the budget's recall was on).
pub(crate) fn label(r: &LeaseReply) -> &'static str {
    match r {
        LeaseReply::Live(s) if s.recall => "Lease/Live(recall)",
        LeaseReply::Live(s) if s.granted_now > 0 => "Lease/Live+",
        LeaseReply::Live(s) if s.given_back > 0 => "Lease/Live(gave back)",
        LeaseReply::Live(_) => "Lease/Live",
        LeaseReply::Ended { given_back: 0, .. } => "Lease/Ended",
        LeaseReply::Ended { .. } => "Lease/Ended(gave back)",
        LeaseReply::Fenced { .. } => "Lease/Fenced",
        LeaseReply::Unknown { .. } => "Lease/Unknown",
    }
}
