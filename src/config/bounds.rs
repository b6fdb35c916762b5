//! The bounds configuration is validated against, owned here because
//! config checks them: the budget model's proofs (`budget::bucket`,
//! `money`) rely on every validated limit, quota and cost staying under
//! them, and the dialects clamp usage to them.

/// Largest per-minute limit, burst or single cost accepted at config load,
/// in tokens (or requests). Keeps every bucket value below 2^53 (the
/// proof is in `budget::bucket`'s module docs).
pub const MAX_LIMIT: u64 = 10_000_000_000;

/// Largest quota per window accepted at config load, whole tokens (or requests).
pub const MAX_QUOTA: u64 = 1_000_000_000_000;

/// The lowest `max_output_tokens` the Responses API accepts (a model's
/// `min_output_tokens` may not be lower).
pub const RESPONSES_MIN_CAP: u64 = 16;

// A single cost is at most the largest token count at the largest price:
// the money bounds' module docs rely on it.
const _: () = assert!(
    crate::money::MAX_COST == MAX_LIMIT * crate::money::MAX_PRICE / crate::money::PRICE_TOKENS
);
