//! Money: prices and dollar amounts in exact integers (docs/MONEY.md).
//!
//! Every amount is an integer number of **micro-dollars** (µ$, 10^-6 USD);
//! a price is an integer number of µ$ **per million tokens** (so a price
//! of `"0.15"` USD per million tokens is 150,000). Config text is decimal
//! (`"0.15"`, at most six decimals) and parsed digit by digit: no float
//! ever holds a price or a budget ([`parse_usd`]).
//!
//! - [`price`]: a deployment's price table ([`PriceTable`], with optional
//!   long-context tiers) and the one cost function ([`Price::cost`]).
//! - [`hosted`]: hosted tools priced per use (a web search per call), part
//!   of a price table.
//!
//! # Rounding
//!
//! A cost is `ceil(Σ tokens_i × price_i / 10^6)` µ$, computed in `u128`
//! and rounded up **once** per reservation, per extension step and per
//! settlement (never per token class): a request is never charged less
//! than its exact price, and at most 1 µ$ more.
//!
//! # Bounds (every stored value an integer below 2^53)
//!
//! The stores keep dollar budgets as calendar quotas in µ$; Lua numbers
//! are doubles, exact for integers below 2^53 ≈ 9.007·10^15.
//!
//! - Prices are validated ≤ [`MAX_PRICE`] = 10^9 µ$ per million tokens
//!   ($1,000 per million) at config load; token counts are ≤ 10^10
//!   (`config::bounds::MAX_LIMIT`: estimates and usage are
//!   clamped there). One term `tokens × price` ≤ 10^19 and the sum of the
//!   five token classes ≤ 5·10^19 < 2^128: exact in `u128`.
//! - A single cost (reservation, extension step or settlement) is clamped
//!   to [`MAX_COST`] = 10^13 µ$ (10^10 tokens × $1,000 per million); every
//!   amount sent to a store is ≤ 10^13.
//! - Budgets are validated ≤ [`MAX_BUDGET`] = 10^13 µ$ ($10 million) per
//!   window.
//! - Spend, debt included: a store admits a debit only while `spent +
//!   amount ≤ limit` (an admitted window never passes the limit by an
//!   admission), so a window's spend exceeds its limit only by the debt of
//!   settlements (actual cost − what the hold reserved, each ≤ 10^13) of
//!   holds admitted before the window filled up. The stores clamp a quota's
//!   spend at [`MAX_SPEND`] = 2^52 ≈ 4.5·10^15 µ$ when settling debt (the
//!   excess forgiven, as a bucket's debt past its floor): then `spent ≤
//!   2^52`, `spent + amount ≤ 2^52 + 10^13 < 2^53`, and `limit − spent ≥
//!   −2^52` — every value exact, however many requests overrun at once.
//! - An extension grant: the stores grant the largest `g ≤ step` with
//!   `ceil(g × rate / 10^6) ≤ remaining`, with `step ≤ 10^6` (validated at
//!   load: `estimation.stream_extension_step`) and `rate ≤ 10^9`, without a
//!   product above 2^53: `q = floor(rem / rate)`; if `q ≥ ceil(step /
//!   10^6)` grant `step`, else `r = rem − q × rate` (< rate ≤ 10^9) and
//!   grant `min(step, q × 10^6 + floor(r × 10^6 / rate))`. With `step ≤
//!   10^6`, `ceil(step / 10^6) = 1`, so the second branch has `q = 0` and
//!   computes only `r × 10^6 < 10^15`; a debit `ceil(g × rate / 10^6)` has
//!   `g × rate ≤ 10^15`. [`price::grant`] is that formula, checked against
//!   the definition by its tests.

pub mod hosted;
pub mod price;

pub use hosted::{HostedCalls, HostedKind, HostedPrices, Per};
pub use price::{grant, CacheWrites, Price, PriceTable, TokenCounts};

// The bounds of the module docs, checked when the crate compiles.
const _: () = {
    assert!(MAX_PRICE == 1_000 * MICROS_PER_USD);
    assert!(MAX_SPEND + MAX_COST < 1 << 53);
    assert!(MAX_BUDGET <= MAX_SPEND);
    // The partial grant's largest intermediate products.
    assert!((PRICE_TOKENS - 1) * PRICE_TOKENS < 1 << 53);
    assert!((MAX_PRICE - 1) * PRICE_TOKENS < 1 << 53);
};

/// µ$ in one dollar.
pub const MICROS_PER_USD: u64 = 1_000_000;

/// Tokens a price is quoted for (a price is µ$ per million tokens).
pub const PRICE_TOKENS: u64 = 1_000_000;

/// Largest price accepted, µ$ per million tokens ($1,000 per million):
/// the stores' largest extension rate (`budget::MAX_RATE`, which checks
/// that it is the same).
pub const MAX_PRICE: u64 = 1_000_000_000;

/// Largest dollar budget per window, µ$ ($10 million).
pub const MAX_BUDGET: u64 = 10_000_000 * MICROS_PER_USD;

/// Largest single cost, µ$: 10^10 tokens at $1,000 per million (the
/// stores' largest amount, `budget::MAX_AMOUNT`; config's bounds check
/// that it is 10^10 tokens at the largest price).
pub const MAX_COST: u64 = 10_000_000_000_000;

/// Highest spend a store keeps in a dollar quota window, µ$ (2^52, the
/// stores' largest quota count, `budget::MAX_COUNT`).
pub const MAX_SPEND: u64 = 1 << 52;

/// Why a decimal dollar amount was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsdError {
    /// Not digits with at most one point.
    Syntax,
    /// More than six decimals (the count).
    Decimals(usize),
    /// Above the largest amount accepted.
    Above,
}

/// Reads a decimal dollar amount (`"0.15"`, `"12"`, `"0.000001"`: digits,
/// optionally a point and at most six decimals) as µ$, at most `max` µ$.
pub fn parse_usd(text: &str, max: u64) -> Result<u64, UsdError> {
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(frac)
        || (text.contains('.') && frac.is_empty())
    {
        return Err(UsdError::Syntax);
    }
    if frac.len() > 6 {
        return Err(UsdError::Decimals(frac.len()));
    }
    let mut micros: u128 = 0;
    for b in whole.bytes() {
        micros = micros * 10 + u128::from(b - b'0');
        if micros > u128::from(max) {
            return Err(UsdError::Above);
        }
    }
    let mut frac_micros: u128 = 0;
    for i in 0..6 {
        let d = frac.as_bytes().get(i).map_or(0, |b| b - b'0');
        frac_micros = frac_micros * 10 + u128::from(d);
    }
    let total = micros * u128::from(MICROS_PER_USD) + frac_micros;
    if total > u128::from(max) {
        return Err(UsdError::Above);
    }
    Ok(total as u64)
}

/// µ$ as decimal dollars: at least two decimals, at most six, no trailing
/// zeros beyond two (`1.00`, `0.25`, `0.00015`, `-0.0025`).
pub fn format_usd(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let whole = m / MICROS_PER_USD;
    let frac = format!("{:06}", m % MICROS_PER_USD);
    let keep = frac.trim_end_matches('0').len().max(2);
    format!("{sign}{whole}.{}", &frac[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_dollars_parse_exactly() {
        let p = |s| parse_usd(s, MAX_PRICE);
        assert_eq!(p("0.15"), Ok(150_000));
        assert_eq!(p("0.075"), Ok(75_000));
        assert_eq!(p("0.1875"), Ok(187_500));
        assert_eq!(p("0.000001"), Ok(1));
        assert_eq!(p("1000"), Ok(1_000_000_000));
        assert_eq!(p("0"), Ok(0));
        assert_eq!(p("007.5"), Ok(7_500_000));
        assert_eq!(p("1000.000001"), Err(UsdError::Above));
        assert_eq!(p("99999999999999999999999"), Err(UsdError::Above));
        assert_eq!(p("0.0000001"), Err(UsdError::Decimals(7)));
        for bad in [
            "", ".5", "5.", "-1", "+1", "1e3", " 1", "1,5", "0x10", "1.2.3", "NaN",
        ] {
            assert_eq!(p(bad), Err(UsdError::Syntax), "{bad:?}");
        }
        assert_eq!(parse_usd("10000000", MAX_BUDGET), Ok(MAX_BUDGET));
        assert!(parse_usd("10000000.01", MAX_BUDGET).is_err());
    }

    #[test]
    fn dollars_print_with_two_to_six_decimals() {
        assert_eq!(format_usd(1_000_000), "1.00");
        assert_eq!(format_usd(250_000), "0.25");
        assert_eq!(format_usd(150), "0.00015");
        assert_eq!(format_usd(1), "0.000001");
        assert_eq!(format_usd(0), "0.00");
        assert_eq!(format_usd(-2_500), "-0.0025");
        assert_eq!(format_usd(MAX_BUDGET as i64), "10000000.00");
        for m in [0u64, 1, 99, 150_000, 1_234_567, MAX_BUDGET] {
            assert_eq!(parse_usd(&format_usd(m as i64), MAX_BUDGET), Ok(m));
        }
    }
}
