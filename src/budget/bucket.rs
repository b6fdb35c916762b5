//! Token-bucket arithmetic in exact integers, shared by the memory store and
//! mirrored line for line by `lua/lib.lua` (DESIGN section 2).
//!
//! # Units and refill
//!
//! A bucket's level is kept in *units* of 1/60,000 token (or request), and
//! refills in whole milliseconds: one millisecond at a limit of `L` per
//! minute adds exactly `L` units, so refill never drops a remainder. The
//! stored `last` advances by the milliseconds credited, not to `now`: the
//! sub-millisecond rest carries over to the next access, so a bucket touched
//! many times per millisecond still refills at exactly its rate (over any
//! interval, at most one millisecond's refill, `L` units, more than `L ×
//! elapsed`: what was accrued before the interval began).
//!
//! # Bounds (every value an integer below 2^53, exact as a Lua double)
//!
//! Validated at config load: limits, bursts and a single cost ≤
//! [`MAX_LIMIT`] = 10^10 tokens; quotas ≤ [`MAX_QUOTA`](crate::config::bounds::MAX_QUOTA) = 10^12 whole tokens
//! (quotas never use bucket units). Both bounds live in
//! [`crate::config::bounds`], where validation checks them. Let `U` = 60,000, `C` = burst × U ≤
//! 6·10^14 (capacity) and `F` = 2^52 ≈ 4.5·10^15 ([`DEBT_FLOOR`] is −F).
//!
//! - Level: `−F ≤ level ≤ C`. A debit or debt below −F is clamped there and
//!   the excess counted as forgiven ([`BucketState::debit`] returns it): with
//!   a single cost ≤ 6·10^14 units the floor is 7.5·10^10 tokens below zero,
//!   far below any one request.
//! - Before clamping: `level − cost × U ≥ −F − 6·10^14 > −5.1·10^15`, and
//!   `level + refund ≤ C + 6·10^14 ≤ 1.2·10^15`.
//! - Refill: `need = C − level ≤ C + F ≤ 5.1·10^15`; the credited
//!   milliseconds are capped at `ceil(need / L)` first, so `ms × L ≤ need +
//!   L ≤ 5.1·10^15 + 10^10`. Elapsed time in µs: `now` ≤ 2^53 µs (year
//!   2255), and differences of times are smaller.
//! - Waits: computed in milliseconds (`ceil(need / L)` ≤ 5.1·10^15), capped
//!   at [`MAX_WAIT_MS`] = 10^11 (3 years) *before* the conversion to
//!   microseconds (≤ 10^14).
//! - All of these are below 2^53 ≈ 9.007·10^15.
//!
//! # Rounding
//!
//! Refill floors (it is exact by construction), waits round up. Integer
//! division of a possibly negative level uses floor (toward −∞), which is
//! what Lua's `math.floor` does and what Rust's `div_euclid` does for a
//! positive divisor; Rust's `/` would truncate toward zero instead.

/// Units per token (or per request): one millisecond at `L`/min adds `L` units.
pub const UNITS_PER_TOKEN: i64 = 60_000;

use crate::config::bounds::MAX_LIMIT;

/// Lowest level a bucket keeps, units (−2^52, about −7.5·10^10 tokens).
pub const DEBT_FLOOR: i64 = -(1 << 52);

/// Longest wait computed, milliseconds (about three years).
pub const MAX_WAIT_MS: i64 = 100_000_000_000;

/// Microseconds per millisecond, the refill step.
const MS: u64 = 1000;

/// A bucket's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Level in units (1/60,000 token); negative while in debt.
    pub level: i64,
    /// Refilled up to this time, UTC microseconds (advanced by whole
    /// milliseconds credited; never later than the last access).
    pub last_micros: u64,
    /// Refill rate the level was computed under, tokens per minute (= units per ms).
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
        let (level, last_micros) = refill(
            self.level,
            self.last_micros,
            t,
            self.per_minute,
            capacity_units(self.burst),
        );
        Self {
            level: level.min(capacity_units(burst)),
            last_micros,
            per_minute,
            burst,
        }
    }

    /// Whole tokens available now (floor; negative in debt).
    pub fn available(&self) -> i64 {
        self.level.div_euclid(UNITS_PER_TOKEN)
    }

    /// Microseconds from `now` until `cost` tokens fit (0 when they fit now).
    /// Call on a bucket advanced to `now`.
    pub fn wait_for(&self, cost: u64, now: u64) -> u64 {
        self.wait_units(to_units(cost) - self.level, now)
    }

    /// Microseconds from `now` until the bucket is full again.
    pub fn until_full(&self, now: u64) -> u64 {
        self.wait_units(capacity_units(self.burst) - self.level, now)
    }

    fn wait_units(&self, need: i64, now: u64) -> u64 {
        refill_wait(need, self.per_minute, now, self.last_micros)
    }

    /// Takes `tokens`; the level may go negative (debt), never below
    /// [`DEBT_FLOOR`]. Returns the units that passed the floor (forgiven).
    pub fn debit(&mut self, tokens: u64) -> i64 {
        let after = self.level - to_units(tokens);
        self.level = after.max(DEBT_FLOOR);
        DEBT_FLOOR - after.min(DEBT_FLOOR)
    }

    /// Returns `tokens`, never above capacity.
    pub fn credit(&mut self, tokens: u64) {
        let cap = capacity_units(self.burst);
        self.level = (self.level + to_units(tokens)).min(cap);
    }

    /// True when the bucket is full (an idle full bucket may be forgotten).
    pub fn is_full(&self) -> bool {
        self.level >= capacity_units(self.burst)
    }
}

/// `tokens` in units; amounts above [`MAX_LIMIT`] count as `MAX_LIMIT`
/// (usage comes from upstream answers: any count must be safe).
pub fn to_units(tokens: u64) -> i64 {
    tokens.min(MAX_LIMIT) as i64 * UNITS_PER_TOKEN
}

/// Capacity of a bucket of `burst` tokens, in units.
pub fn capacity_units(burst: u64) -> i64 {
    to_units(burst)
}

/// Refills `level` from `last` to `t` (µs, `t ≥ last`) at `rate` units per
/// millisecond up to `cap`: returns the new level and the new `last`, which
/// advances by the whole milliseconds credited (to `t` once full).
pub fn refill(level: i64, last: u64, t: u64, rate: u64, cap: i64) -> (i64, u64) {
    if level >= cap {
        return (level, t);
    }
    let rate = rate as i64;
    let elapsed_ms = ((t - last) / MS) as i64;
    let max_ms = ceil_div(cap - level, rate);
    if elapsed_ms >= max_ms {
        return (cap, t);
    }
    (level + elapsed_ms * rate, last + elapsed_ms as u64 * MS)
}

/// Microseconds from `now` until `need` more units have refilled at `rate`
/// units/ms, for a bucket refilled up to `last` (0 when `need ≤ 0`). Whole
/// milliseconds, capped at [`MAX_WAIT_MS`] before the conversion; the part
/// of the current millisecond already elapsed since `last` counts.
pub fn refill_wait(need: i64, rate: u64, now: u64, last: u64) -> u64 {
    if need <= 0 {
        return 0;
    }
    let ms = ceil_div(need, rate as i64).min(MAX_WAIT_MS) as u64;
    let elapsed = now.saturating_sub(last);
    (ms * MS).saturating_sub(elapsed).max(1)
}

/// Ceiling of `a / b` for `b > 0` (`a` may be negative).
pub fn ceil_div(a: i64, b: i64) -> i64 {
    -((-a).div_euclid(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_millisecond_at_l_per_minute_adds_exactly_l_units() {
        let mut b = BucketState::full(1000, 1000, 0);
        b.debit(1000);
        assert_eq!(b.available(), 0);
        let b1 = b.advance(1000, 1000, 1_000);
        assert_eq!(b1.level, 1000, "1 ms at 1000/min");
        // 60 ms at 1000 tokens/min refills exactly one token.
        let b = b.advance(1000, 1000, 60_000);
        assert_eq!(b.level, UNITS_PER_TOKEN);
        assert_eq!(b.available(), 1);
    }

    #[test]
    fn sub_millisecond_remainders_carry_over() {
        // Touched every 200 µs for one second: exactly L/60 tokens.
        let mut b = BucketState::full(60_000, 60_000, 0);
        b.debit(60_000);
        let start = b.level;
        for i in 1..=5000u64 {
            b = b.advance(60_000, 60_000, i * 200);
        }
        assert_eq!(b.level - start, 1000 * UNITS_PER_TOKEN, "60000/60 tokens");
        assert_eq!(b.last_micros, 1_000_000);
    }

    #[test]
    fn indebted_level_rounds_toward_negative_infinity() {
        let mut b = BucketState::full(60, 60, 0);
        b.debit(60);
        b.level -= 1; // one unit of debt
        assert_eq!(b.available(), -1, "floor, not truncation toward zero");
        assert_eq!(
            b.wait_for(0, 0),
            1000,
            "one unit at 60 units/ms takes 1 ms (ceil)"
        );
        assert_eq!(
            b.wait_for(0, 999),
            1,
            "the part of the ms already passed counts"
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
    fn the_extremes_stay_exact_below_2_pow_53() {
        let max = MAX_LIMIT;
        let mut b = BucketState::full(max, max, 0);
        assert_eq!(b.debit(max), 0);
        assert_eq!(b.available(), 0);
        // Debt down to the floor, the rest forgiven and reported.
        let mut forgiven = 0;
        for _ in 0..10 {
            forgiven += b.debit(max);
        }
        assert_eq!(b.level, DEBT_FLOOR);
        assert_eq!(forgiven, 10 * to_units(max) + DEBT_FLOOR);
        // Idle for a year: full, never above capacity.
        let year = 365 * 86_400_000_000u64;
        let full = b.advance(max, max, year);
        assert!(full.is_full());
        assert_eq!(full.level, capacity_units(max));
        // The longest wait is capped before it reaches microseconds.
        let slow = BucketState {
            level: DEBT_FLOOR,
            last_micros: 0,
            per_minute: 1,
            burst: max,
        };
        assert_eq!(slow.until_full(0), MAX_WAIT_MS as u64 * 1000);
        assert!(((capacity_units(max) - DEBT_FLOOR) as u64) < 1 << 53);
    }

    #[test]
    fn absurd_token_counts_clamp_instead_of_overflowing() {
        // Usage comes from the upstream's answer; any count must be safe.
        let mut b = BucketState::full(60, 100, 0);
        b.debit(u64::MAX);
        assert_eq!(b.level, capacity_units(100) - to_units(MAX_LIMIT));
        b.credit(u64::MAX);
        assert_eq!(b.level, capacity_units(100));
    }

    #[test]
    fn wait_is_exact_ceiling() {
        let mut b = BucketState::full(1000, 1000, 0);
        b.debit(1000);
        // 1 token at 1000/min = 60 ms.
        assert_eq!(b.wait_for(1, 0), 60_000);
        assert_eq!(b.until_full(0), 60_000_000);
    }
}
