//! Token-bucket arithmetic in exact integers, shared by the memory store and
//! mirrored line for line by `lua/reserve.lua` (DESIGN section 2).
//!
//! A bucket's level is kept in *units* of 1/60,000,000 token (or request):
//! one microsecond of refill at a limit of `L` per minute adds exactly `L`
//! units, so refill never drops a remainder. With limits and bursts at most
//! [`MAX_LIMIT`] the level stays within `[-capacity, capacity]`, capacity ≤
//! 3·10^15 units, and every intermediate value (including `capacity −
//! level` and `elapsed × rate`) stays below 2^53, so Lua's doubles compute
//! the same integers as Rust's `i64`.
//!
//! Rounding: refill floors (it is exact by construction), waits round up.
//! Integer division of a possibly negative level uses floor (toward −∞),
//! which is what Lua's `math.floor` does and what Rust's `div_euclid` does
//! for a positive divisor; Rust's `/` would truncate toward zero instead.

/// Units per token (or per request): 60 s × 1,000,000 µs.
pub const UNITS_PER_TOKEN: i64 = 60_000_000;

/// Largest per-minute limit, burst, quota or single cost accepted at config
/// load, in tokens (or requests). Keeps every value below 2^53 (see module docs).
pub const MAX_LIMIT: u64 = 50_000_000;

/// A bucket's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Level in units (1/60,000,000 token); negative while in debt.
    pub level: i64,
    /// Last update, UTC microseconds.
    pub last_micros: u64,
    /// Refill rate the level was computed under, tokens per minute (= units per µs).
    pub per_minute: u64,
    /// Capacity the level was computed under, tokens.
    pub burst: u64,
}

impl BucketState {
    /// A full bucket created at `now`.
    pub fn full(per_minute: u64, burst: u64, now: u64) -> Self {
        Self {
            level: capacity_units(burst),
            last_micros: now,
            per_minute,
            burst,
        }
    }

    /// Brings the bucket to `now` under the given policy: refill at the
    /// stored rate up to the stored capacity, then adopt the new policy
    /// (a lower burst clamps the level; a higher one grants nothing at once).
    /// Time never runs backwards: the bucket uses `max(now, last)`.
    pub fn advance(self, per_minute: u64, burst: u64, now: u64) -> Self {
        let t = now.max(self.last_micros);
        let level = refill(
            self.level,
            t - self.last_micros,
            self.per_minute,
            capacity_units(self.burst),
        );
        let level = level.min(capacity_units(burst));
        Self {
            level,
            last_micros: t,
            per_minute,
            burst,
        }
    }

    /// Whole tokens available now (floor; negative in debt).
    pub fn available(&self) -> i64 {
        self.level.div_euclid(UNITS_PER_TOKEN)
    }

    /// Microseconds until `cost` tokens fit (0 when they fit now).
    pub fn wait_for(&self, cost: u64) -> u64 {
        let need = cost as i64 * UNITS_PER_TOKEN - self.level;
        if need <= 0 {
            0
        } else {
            ceil_div(need, self.per_minute as i64) as u64
        }
    }

    /// Microseconds until the bucket is full again.
    pub fn until_full(&self) -> u64 {
        let need = capacity_units(self.burst) - self.level;
        if need <= 0 {
            0
        } else {
            ceil_div(need, self.per_minute as i64) as u64
        }
    }

    /// Takes `tokens` (may drive the level negative, never below −capacity).
    pub fn debit(&mut self, tokens: u64) {
        let cap = capacity_units(self.burst);
        let units = (tokens.min(i64::MAX as u64) as i64).saturating_mul(UNITS_PER_TOKEN);
        self.level = self.level.saturating_sub(units).max(-cap);
    }

    /// Returns `tokens`, never above capacity.
    pub fn credit(&mut self, tokens: u64) {
        let cap = capacity_units(self.burst);
        let units = (tokens.min(i64::MAX as u64) as i64).saturating_mul(UNITS_PER_TOKEN);
        self.level = self.level.saturating_add(units).min(cap);
    }

    /// True when the bucket is full (an idle full bucket may be forgotten).
    pub fn is_full(&self) -> bool {
        self.level >= capacity_units(self.burst)
    }
}

/// Capacity of a bucket of `burst` tokens, in units.
pub fn capacity_units(burst: u64) -> i64 {
    burst as i64 * UNITS_PER_TOKEN
}

/// Level after `elapsed_micros` of refill at `rate` units/µs, capped at
/// `cap` units. The elapsed time is bounded first so the product stays exact.
pub fn refill(level: i64, elapsed_micros: u64, rate: u64, cap: i64) -> i64 {
    if level >= cap {
        return level;
    }
    let rate = rate as i64;
    let need = cap - level;
    let max_elapsed = ceil_div(need, rate);
    let elapsed = (elapsed_micros.min(max_elapsed as u64)) as i64;
    (level + elapsed * rate).min(cap)
}

/// Ceiling of `a / b` for `b > 0` (`a` may be negative).
pub fn ceil_div(a: i64, b: i64) -> i64 {
    -((-a).div_euclid(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_adds_limit_units_per_microsecond_exactly() {
        let mut b = BucketState::full(1000, 1000, 0);
        b.debit(1000);
        assert_eq!(b.available(), 0);
        // 60 ms at 1000 tokens/min refills exactly one token.
        let b = b.advance(1000, 1000, 60_000);
        assert_eq!(b.level, UNITS_PER_TOKEN);
        assert_eq!(b.available(), 1);
    }

    #[test]
    fn indebted_level_rounds_toward_negative_infinity() {
        let mut b = BucketState::full(60, 60, 0);
        b.debit(60);
        b.level -= 1; // one unit of debt
        assert_eq!(b.available(), -1, "floor, not truncation toward zero");
        assert_eq!(
            b.wait_for(0),
            1,
            "one unit at 60 units/µs takes 1 µs (ceil)"
        );
    }

    #[test]
    fn lowering_burst_clamps_and_raising_grants_nothing() {
        let b = BucketState::full(100, 100, 0);
        let lowered = b.advance(100, 40, 10);
        assert_eq!(lowered.available(), 40);
        let raised = lowered.advance(100, 500, 10);
        assert_eq!(raised.available(), 40);
    }

    #[test]
    fn clock_going_backwards_does_not_refill_or_panic() {
        let mut b = BucketState::full(100, 100, 1_000_000);
        b.debit(50);
        let b2 = b.advance(100, 100, 0);
        assert_eq!(b2.level, b.level);
        assert_eq!(b2.last_micros, 1_000_000);
    }

    #[test]
    fn huge_idle_time_does_not_overflow() {
        let mut b = BucketState::full(MAX_LIMIT, MAX_LIMIT, 0);
        b.debit(MAX_LIMIT);
        b.debit(MAX_LIMIT); // clamped at -capacity
        assert_eq!(b.level, -capacity_units(MAX_LIMIT));
        let b = b.advance(MAX_LIMIT, MAX_LIMIT, u64::MAX / 4);
        assert!(b.is_full());
        assert!((2 * capacity_units(MAX_LIMIT)) < (1i64 << 53));
    }

    #[test]
    fn absurd_token_counts_clamp_instead_of_overflowing() {
        // Usage comes from the upstream's answer; any count must be safe.
        let mut b = BucketState::full(60, 100, 0);
        b.debit(u64::MAX);
        assert_eq!(b.level, -capacity_units(100));
        b.credit(u64::MAX);
        assert_eq!(b.level, capacity_units(100));
    }

    #[test]
    fn wait_is_exact_ceiling() {
        let mut b = BucketState::full(1000, 1000, 0);
        b.debit(1000);
        // 1 token at 1000/min = 60 ms.
        assert_eq!(b.wait_for(1), 60_000);
        assert_eq!(b.until_full(), 60_000_000);
    }
}
