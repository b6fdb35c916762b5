//! Phase 7, settle (DESIGN section 1.8): the reservation is settled once
//! with what the answer used: the upstream's reported usage, else the
//! input estimate plus the gateway's own count of the output. Streams are
//! settled by the relay when they end.

use crate::dialects::UsageBreakdown;
use crate::reservation::HeldReservation;
use crate::reserve::Settlement;

/// Settles `hold` (in the background) with what the answer used (every
/// count filled in); returns the tokens settled.
pub fn settle(hold: HeldReservation, used: UsageBreakdown) -> u64 {
    let actual = used.total();
    hold.settle(Settlement {
        actual_tokens: actual,
        upstream_failed: false,
    });
    actual
}
