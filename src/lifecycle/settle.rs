//! Phase 7, settle (DESIGN section 1.8): the reservation is settled once
//! with what the answer used: the upstream's reported usage, else the
//! input estimate plus the gateway's own count of the output. Streams are
//! settled by the relay when they end. Dollar budgets are charged the
//! usage's exact cost at the prices the hold was admitted under.

use super::admit::HoldBudgets;
use crate::admission::{amounts, HeldReservation};
use crate::budget::{Actual, Settlement};
use crate::dialects::UsageBreakdown;
use crate::ledger::SpendOutcome;

/// Settles `hold` (in the background) with what the answer used (every
/// count filled in), per budget of the hold, the request having ended as
/// `outcome` (for the ledger); returns the tokens settled.
pub fn settle(
    mut hold: HeldReservation,
    budgets: &HoldBudgets,
    used: UsageBreakdown,
    outcome: SpendOutcome,
) -> u64 {
    let actual = used.total();
    budgets.expected_settled(
        used.output.unwrap_or(0),
        matches!(outcome, SpendOutcome::Answered),
    );
    let cost = amounts::settled_cost(&used, budgets.price());
    if let Some(cost) = cost {
        hold.record_spend(cost);
    }
    if let Some(draft) = hold.ledger_draft() {
        draft.settled(used, cost, outcome);
    }
    hold.settle(Settlement {
        actual_tokens: actual,
        upstream_failed: false,
        actual: Actual::PerSpec(amounts::settled_amounts(
            &used,
            budgets.budgets(),
            budgets.price(),
        )),
    });
    actual
}

/// The settlement of work the upstream never did: every token and dollar
/// of the hold goes back, even to budgets that keep unused output (the
/// request count stays spent).
pub fn refund(budgets: &HoldBudgets) -> Settlement {
    Settlement {
        actual_tokens: 0,
        upstream_failed: true,
        actual: Actual::PerSpec(amounts::nothing_used(budgets.budgets())),
    }
}
