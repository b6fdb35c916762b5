//! What a store call asks of each budget, in each budget's own unit, and
//! who asks (store contract v3: amounts per spec).
//!
//! # Bounds (every stored value an integer below 2^53, exact in Lua)
//!
//! - Token buckets: a single amount ≤ [`crate::config::bounds::MAX_LIMIT`]
//!   (10^10 tokens), bounds in `bucket`.
//! - Quotas: limits and a single amount ≤ [`MAX_AMOUNT`] (10^13); a count is
//!   admitted up to its limit and capped at [`MAX_COUNT`] (2^52) when debt
//!   is added, so count + one amount < 2^52 + 10^13 < 2^53.
//! - Extension rates ≤ [`MAX_RATE`] (10^9 units per [`RATE_ONE`] tokens) and
//!   a step ≤ 10^10 tokens: the stores grant `g = min(step, floor(avail ×
//!   RATE_ONE / rate))` and debit `ceil(g × rate / RATE_ONE)`, which Rust
//!   computes in `u128` and Lua without forming either product (q =
//!   floor(avail / rate); q·RATE_ONE ≥ step grants the step, else q ≤ 10^4
//!   and the rest r < rate keeps r·RATE_ONE < 10^15; the debit splits g =
//!   gh·RATE_ONE + gl with gh·rate ≤ 10^13 and gl·rate < 10^15).

use std::sync::Arc;

use super::BudgetSpec;
use crate::config::OnStoreError;

/// What a reservation costs each budget it touches, in each budget's own
/// unit (tokens, requests, micro-dollars): `per_candidate` carries the
/// amount of every spec, so budgets may differ (input and output limits
/// apart, dollars priced per deployment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    /// The request's tokens, input + reserved output: what the hold reports
    /// as reserved, and every spec's amount when `per_candidate` is empty.
    pub tokens: u64,
    /// Per candidate, the amount of each spec debited when it is chosen:
    /// `common` in order, then the candidate's own specs. A common spec may
    /// cost differently per candidate (a price that depends on the
    /// deployment). Empty: every spec costs [`BudgetSpec::cost`] of `tokens`.
    pub per_candidate: Vec<Vec<u64>>,
}

impl Costs {
    /// Every spec costs [`BudgetSpec::cost`] of `tokens`.
    pub const fn tokens(tokens: u64) -> Self {
        Self {
            tokens,
            per_candidate: Vec::new(),
        }
    }

    /// The cost of `spec`, at `index` among the specs candidate `candidate`
    /// debits (`common`, then its own).
    pub fn of(&self, candidate: usize, index: usize, spec: &BudgetSpec) -> u64 {
        self.per_candidate
            .get(candidate)
            .and_then(|row| row.get(index))
            .copied()
            .unwrap_or_else(|| spec.cost(self.tokens))
    }
}

/// Largest single amount, and largest quota limit, in a budget's own unit
/// (10^13: $10^7 in µ$, or 10^10 tokens × $1,000 per million). Token
/// buckets keep the tighter [`crate::config::bounds::MAX_LIMIT`] and token
/// quotas [`crate::config::bounds::MAX_QUOTA`]. A quota's count stays below
/// 2^53 ≈ 9·10^15: it is admitted only up to its limit (≤ 10^13), and each
/// settlement adds at most one amount (≤ 10^13) of debt beyond what it
/// reserved; stores cap a count at [`MAX_COUNT`] (2^52) when settling
/// debt, so it stays exact however many requests overrun at once.
pub const MAX_AMOUNT: u64 = 10_000_000_000_000;

/// The highest count a quota keeps (2^52), in its unit; debt beyond it is
/// forgiven, like a bucket's below its floor.
pub const MAX_COUNT: u64 = 1 << 52;

/// Largest extension rate: $1,000 per million tokens in µ$ (10^9).
pub const MAX_RATE: u64 = 1_000_000_000;

/// Units of a rate that stand for one unit per token: an extension of `g`
/// tokens debits `ceil(g × rate / RATE_ONE)` from a spec whose rate is `rate`.
pub const RATE_ONE: u64 = 1_000_000;

// Money's bounds are the stores' bounds: a dollar cost, price or spend
// the money module allows is one every store keeps exactly.
const _: () = {
    assert!(MAX_RATE == crate::money::MAX_PRICE);
    assert!(MAX_AMOUNT == crate::money::MAX_COST);
    assert!(MAX_COUNT == crate::money::MAX_SPEND);
};

/// What an extension asks of each budget of a hold.
///
/// A store grants `g` tokens (`1 ..= tokens`, the largest every budget can
/// pay for) and debits each spec `ceil(g × rate / RATE_ONE)` in its own unit:
/// rate [`RATE_ONE`] for a budget that counts every output token, 0 for one
/// the output does not touch (request and input budgets), the price in µ$
/// per million tokens for a dollar budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// Further output tokens wanted.
    pub tokens: u64,
    /// The rate of each spec of the hold (`common`, then the chosen
    /// candidate's, in the reserve request's order), units per
    /// [`RATE_ONE`] tokens. Empty: [`RATE_ONE`] for token budgets, 0 for
    /// request budgets.
    pub rates: Vec<u64>,
}

impl Step {
    /// `tokens` more output on every token budget.
    pub const fn tokens(tokens: u64) -> Self {
        Self {
            tokens,
            rates: Vec::new(),
        }
    }

    /// What a grant of `g` tokens debits at `rate`: `ceil(g × rate / RATE_ONE)`.
    pub fn debit(g: u64, rate: u64) -> u64 {
        (u128::from(g) * u128::from(rate)).div_ceil(u128::from(RATE_ONE)) as u64
    }

    /// The largest grant ≤ `want` whose [`Step::debit`] at `rate` fits
    /// `available` whole units.
    pub fn grant(available: i64, rate: u64, want: u64) -> u64 {
        if available <= 0 {
            return 0;
        }
        if rate == 0 {
            return want;
        }
        let fits = u128::from(available as u64) * u128::from(RATE_ONE) / u128::from(rate);
        fits.min(u128::from(want)) as u64
    }

    /// The rate of `spec`, at `index` among the hold's specs.
    pub fn rate(&self, index: usize, spec: &BudgetSpec) -> u64 {
        self.rates
            .get(index)
            .copied()
            .unwrap_or(if spec.name.counts_tokens() {
                RATE_ONE
            } else {
                0
            })
    }
}

/// What a settlement charges, beyond the common token amount.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Actual {
    /// `actual_tokens` on every amount budget: only right when every amount
    /// budget of the hold counts tokens alike (store tests). The gateway
    /// always settles [`Actual::PerSpec`] or [`Actual::Void`].
    #[default]
    Tokens,
    /// The actual amount of each spec of the hold (`common`, then the
    /// chosen candidate's, in the reserve request's order, shadow specs
    /// included), in each spec's unit.
    PerSpec(Vec<u64>),
    /// Nothing was done for the request: refund every budget of the hold
    /// (amounts and request counts) and free its slots (DESIGN section 13).
    Void,
}

/// Who asks for a reservation: the labels of the decision metrics and what
/// a store outage does to the request. Built once per budget plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    /// Tenant name.
    pub tenant: Arc<str>,
    /// Version of the policy the request runs under.
    pub policy_version: Arc<str>,
    /// What a store failure does to the request.
    pub on_store_error: OnStoreError,
    /// The run the request belongs to, whose record the stores set or
    /// compare in the reservation (`None`: no run; the plan's requester).
    pub run: Option<super::RunRecord>,
}
