//! What a store call asks of each budget, in each budget's own unit, and
//! who asks. Stores of contract v2 (today's) read the common token amount;
//! the per-spec amounts are for contract v3.

use std::sync::Arc;

use serde::Serialize;

use super::BudgetSpec;

/// What a reservation costs each budget it touches, in each budget's own
/// unit (tokens, requests; later micro-dollars).
///
/// Stores of contract v2 (today's memory and Redis stores) read only
/// `tokens`: they debit it from every token budget and 1 from every
/// request budget. `per_candidate` carries the amount of every spec, so
/// that budgets may differ (input and output limits apart, dollars priced
/// per deployment) once the stores read it (contract v3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    /// The common token amount of stores of contract v2: input + reserved output.
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

/// Units of a rate that stand for one unit per token: an extension of `g`
/// tokens debits `ceil(g × rate / RATE_ONE)` from a spec whose rate is `rate`.
pub const RATE_ONE: u64 = 1_000_000;

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
    /// `actual_tokens` on every token budget (contract v2).
    #[default]
    Tokens,
    /// The actual amount of each spec of the hold (`common`, then the
    /// chosen candidate's, in the reserve request's order, shadow specs
    /// included), in each spec's unit.
    PerSpec(Vec<u64>),
    /// Nothing was done for the request: refund every budget of the hold
    /// (tokens and request counts) and free its slots (DESIGN section 13).
    /// Stores of contract v2 refund the token budgets (as
    /// `upstream_failed` with nothing used); request counts stay spent.
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
}

/// What a store failure does to a tenant's requests (DESIGN section 7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Fall back to a local limiter.
    FailOpen,
    /// Answer 503.
    #[default]
    FailClosed,
}
