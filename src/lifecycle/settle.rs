//! Phase 7, settle (DESIGN section 1.8): the reservation is settled once
//! with what the answer used: the upstream's reported usage, else the
//! input estimate plus the gateway's own count of the output. Streams are
//! settled by the relay when they end.

use super::admit::HoldBudgets;
use crate::dialects::UsageBreakdown;
use crate::reservation::{amounts, HeldReservation};
use crate::reserve::{Actual, Settlement};

/// Settles `hold` (in the background) with what the answer used (every
/// count filled in), per budget of the hold; returns the tokens settled.
pub fn settle(hold: HeldReservation, budgets: &HoldBudgets, used: UsageBreakdown) -> u64 {
    let actual = used.total();
    hold.settle(Settlement {
        actual_tokens: actual,
        upstream_failed: false,
        actual: Actual::PerSpec(amounts::settled_amounts(&used, budgets.budgets())),
    });
    actual
}
