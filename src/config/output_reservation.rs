//! `output_reservation`, `expected_quantile`, `max_exposure`: how much
//! of a request's output cap its tenant and key budgets reserve when the
//! output is not metered as it streams, and how much of an uncapped
//! request's possible output may go unreserved (both modes). The
//! settings only; the admission layer (`crate::admission::expected`,
//! `crate::admission::exposure`) applies them.

use serde::{Deserialize, Serialize};

/// Quantile of the settled outputs an expected-mode request reserves, per
/// mille, when the tenant sets none (p90).
pub const DEFAULT_QUANTILE_PERMILLE: u32 = 900;

/// `max_exposure` when unset: this share of each budget's capacity, percent.
pub const DEFAULT_EXPOSURE_PERCENT: u64 = 10;

/// What a tenant or key reserves of an output cap it does not meter as it streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputReservation {
    /// The whole cap of a request that gives one (the default); a request
    /// without a cap reserves the model's default output, the rest of the
    /// model's maximum within `max_exposure`.
    Cap(MaxExposure),
    /// The expected output, within a per-budget exposure.
    Expected(ExpectedSettings),
}

impl Default for OutputReservation {
    fn default() -> Self {
        Self::Cap(ExpectedSettings::default().max_exposure)
    }
}

impl OutputReservation {
    /// The expected-mode settings, when that mode is chosen.
    pub fn expected(&self) -> Option<ExpectedSettings> {
        match self {
            Self::Cap(_) => None,
            Self::Expected(s) => Some(*s),
        }
    }

    /// `max_exposure` (either mode: uncapped requests take exposure in both).
    pub fn max_exposure(&self) -> MaxExposure {
        match self {
            Self::Cap(m) => *m,
            Self::Expected(s) => s.max_exposure,
        }
    }
}

/// The settings of `output_reservation = "expected"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedSettings {
    /// `expected_quantile`, per mille (integer arithmetic from here on).
    pub quantile_permille: u32,
    /// `max_exposure` of each budget the mode lowers.
    pub max_exposure: MaxExposure,
}

impl Default for ExpectedSettings {
    fn default() -> Self {
        Self {
            quantile_permille: DEFAULT_QUANTILE_PERMILLE,
            max_exposure: MaxExposure::Percent(DEFAULT_EXPOSURE_PERCENT),
        }
    }
}

/// The most a budget may be over-admitted by expected-mode requests in
/// flight: the sum of (cap − reserved output) over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxExposure {
    /// Tokens, whatever the budget's size (`max_exposure = 200000`).
    Tokens(u64),
    /// Percent of each budget's capacity (`max_exposure = "10%"`).
    Percent(u64),
}

impl MaxExposure {
    /// The bound on a budget of `capacity` tokens.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Self::Tokens(t) => t,
            Self::Percent(p) => {
                u64::try_from(capacity as u128 * p as u128 / 100).unwrap_or(u64::MAX)
            }
        }
    }

    /// As configured (`check-config`).
    pub fn describe(self) -> String {
        match self {
            Self::Tokens(t) => format!("{t} tokens"),
            Self::Percent(p) => format!("{p}% of each budget's capacity"),
        }
    }
}

/// `max_exposure` as written: tokens or `"N%"`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawMaxExposure {
    /// Tokens.
    Tokens(i64),
    /// `"N%"`.
    Text(String),
}

/// `output_reservation` as written: `Some(true)` for `"expected"`,
/// `Some(false)` for `"cap"`, `None` otherwise.
pub fn parse_mode(s: &str) -> Option<bool> {
    match s {
        "expected" => Some(true),
        "cap" => Some(false),
        _ => None,
    }
}

/// `expected_quantile` as written (a fraction in (0, 1]), per mille.
pub fn parse_quantile(q: f64) -> Option<u32> {
    // Rounded to the nearest per mille, at least 1.
    (q.is_finite() && q > 0.0 && q <= 1.0).then(|| ((q * 1000.0).round() as u32).clamp(1, 1000))
}

/// `max_exposure` as written.
pub fn parse_exposure(raw: &RawMaxExposure) -> Option<MaxExposure> {
    match raw {
        RawMaxExposure::Tokens(t) => u64::try_from(*t).ok().map(MaxExposure::Tokens),
        RawMaxExposure::Text(s) => s
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u64>().ok())
            .filter(|&p| p <= 100)
            .map(MaxExposure::Percent),
    }
}

impl std::fmt::Display for RawMaxExposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tokens(t) => write!(f, "{t}"),
            Self::Text(s) => write!(f, "{s:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bound() {
        assert_eq!(parse_mode("expected"), Some(true));
        assert_eq!(parse_mode("p90"), None);
        assert_eq!(parse_quantile(0.9), Some(900));
        assert_eq!(parse_quantile(0.0), None);
        assert_eq!(parse_quantile(1.5), None);
        assert_eq!(
            parse_exposure(&RawMaxExposure::Text("10%".into())),
            Some(MaxExposure::Percent(10))
        );
        assert_eq!(parse_exposure(&RawMaxExposure::Text("ten".into())), None);
        assert_eq!(parse_exposure(&RawMaxExposure::Tokens(-1)), None);
        assert_eq!(MaxExposure::Percent(10).of(2_000_000), 200_000);
        assert_eq!(MaxExposure::Tokens(5).of(2_000_000), 5);
    }
}
