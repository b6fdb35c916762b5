//! Phase 7, settle (DESIGN section 1.8): the reservation is settled once
//! with what the answer used: the upstream's reported usage, else the
//! input estimate plus the gateway's own count of the output. Streams are
//! settled by the relay when they end. Dollar budgets are charged the
//! usage's exact cost at the prices the hold was admitted under.

use super::admit::HoldBudgets;
use crate::admission::{amounts, HeldReservation};
use crate::budget::{Actual, Settlement};
use crate::dialects::UsageBreakdown;
use crate::settlement::{Outcome, Settling};

/// Settles `hold` (in the background) with what the answer used (every
/// count filled in), per budget of the hold, the request having ended as
/// `outcome`; returns the tokens settled.
pub fn settle(
    hold: HeldReservation,
    budgets: &HoldBudgets,
    used: UsageBreakdown,
    outcome: Outcome,
) -> u64 {
    for field in [used.rejected_input, used.rejected_output]
        .into_iter()
        .flatten()
    {
        budgets
            .deployment_metrics()
            .usage_rejected(hold.id(), field);
    }
    let actual = used.total();
    budgets.expected_settled(
        used.output.unwrap_or(0),
        matches!(outcome, Outcome::Answered),
    );
    let cost = amounts::settled_cost(&used, budgets.price());
    let settlement = Settlement {
        actual_tokens: actual,
        upstream_failed: false,
        actual: Actual::PerSpec(amounts::settled_amounts(
            &used,
            budgets.budgets(),
            budgets.price(),
        )),
    };
    hold.settle(Settling::of(settlement, outcome).used(used, cost));
    actual
}

/// The settlement of work the upstream never did: every token and dollar
/// of the hold goes back, even to budgets that keep unused output (the
/// request count stays spent).
pub fn refund(budgets: &HoldBudgets) -> Settling {
    let settlement = Settlement {
        actual_tokens: 0,
        upstream_failed: true,
        actual: Actual::PerSpec(amounts::nothing_used(budgets.budgets())),
    };
    Settling::of(settlement, Outcome::UpstreamFailed)
}

/// The settlement of a request that never reached the upstream: the hold
/// is voided (nothing charged, the request count included).
pub fn void() -> Settling {
    let settlement = Settlement {
        actual_tokens: 0,
        upstream_failed: true,
        actual: Actual::Void,
    };
    Settling::of(settlement, Outcome::Voided)
}
