//! Phase 7, settle (DESIGN section 1.8): the reservation is settled once
//! with what the answer used: the upstream's reported usage, else the
//! input estimate plus the gateway's own count of the output. Streams are
//! settled by the relay when they end.

use crate::reservation::HeldReservation;
use crate::reserve::Settlement;

/// What an answer used, as far as known.
pub struct Usage<F: FnOnce() -> u64> {
    /// `prompt + completion` tokens as the upstream reported them.
    pub reported: Option<u64>,
    /// Counts the output when the upstream reported nothing.
    pub counted_output: F,
}

/// Settles `hold` (in the background) and returns the tokens settled.
pub fn settle<F: FnOnce() -> u64>(
    hold: HeldReservation,
    input_estimate: u64,
    usage: Usage<F>,
) -> u64 {
    let actual = usage
        .reported
        .unwrap_or_else(|| input_estimate + (usage.counted_output)());
    hold.settle(Settlement {
        actual_tokens: actual,
        upstream_failed: false,
    });
    actual
}
