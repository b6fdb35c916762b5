//! Amounts per budget: the one place that says what a request costs each
//! budget it touches, at reserve (from the estimate), at extend (further
//! output) and at settle (from the usage breakdown). Pure functions of the
//! specs, how each counts ([`Counting`]) and the counts.
//!
//! What each budget counts, by name:
//! - `tpm`, `tokens_per_day`, `tokens_per_month` and the rolling
//!   `tokens_per_5h`, `tokens_per_24h`, `tokens_per_week`: input + output;
//! - `input_tpm`: input only (an extension of the output never touches it);
//! - `output_tpm`: output only, reasoning included;
//! - `rpm`, `requests_per_day`, `max_concurrent`: the request (1).
//!
//! Input is every input token, cached input read weighted by the budget's
//! `cache_read_weight` (per mille, rounded up): at settle the usage says
//! what was read from the cache; at reserve the cacheable prefix (input up
//! to and including the last `cache_control` breakpoint) is assumed read,
//! and the difference settles either way (debt when the prefix missed the
//! cache). So a cacheable prefix never makes a request impossible on a
//! budget that leaves cache reads out. Output at reserve is the reserved
//! output, or the client's whole cap on budgets that reserve it whole
//! ([`Counting::whole_cap`]); those are never extended.
//!
//! Dollar budgets (`usd_per_day`, `usd_per_month`, the rolling
//! `usd_per_5h`, `usd_per_24h`, `usd_per_week`) count µ$ at the prices
//! of the deployment the hold is on (`crate::money`): the estimate at
//! reserve (input at the cache-write price when the body asks for
//! caching), the output price per extended token, the usage breakdown's
//! exact cost at settle (uncached input, cache reads, 5-minute and 1-hour
//! writes, output), rounded up once each time; always refunded to that
//! cost. Hosted tools priced per use add their price: at reserve for the
//! most uses the request may make, at settle for the uses its answer
//! reports. A dollar budget on a deployment without a price (only reachable
//! for shadow budgets: prepare refuses the rest) counts 0.
//!
//! The stores apply whatever these functions say, per spec (store contract
//! v3): budgets that count differently (input and output limits apart,
//! cached input weighted, dollars per deployment) change only these
//! functions.

use crate::budget::{BudgetName, BudgetSpec, Costs, Step, RATE_ONE};
use crate::dialects::UsageBreakdown;
use crate::estimate::Estimate;
use crate::money::{CacheWrites, HostedCalls, PriceTable, TokenCounts};

/// Per mille that counts a cached input token in full.
pub const FULL_WEIGHT: u64 = 1000;

/// How one budget counts a request beyond what its name says: fixed per
/// budget plan (scope, model, deployment kind; `admission::plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counting {
    /// Per mille of each cached input token read that the budget counts
    /// (1000: in full; 0: left out, as Anthropic's input limits do).
    pub cache_read_weight: u64,
    /// Reserves the client's whole output cap at request start, not the
    /// incremental part of a stream: an upstream's per-minute budget of a
    /// provider that counts `max_tokens` at request start.
    pub whole_cap: bool,
    /// Times each output token counts (a deployment's
    /// `output_token_weight` on its `tpm` and `output_tpm`; 1 elsewhere).
    pub output_weight: u64,
    /// Counts as AWS's Bedrock quotas do ("How tokens are counted in
    /// Amazon Bedrock"): the reservation holds every input token (cache
    /// reads included) and the output once, the weight applies only at
    /// settlement (what passes the reservation is debt), and a stream is
    /// never extended for it.
    pub burndown: bool,
}

impl Default for Counting {
    fn default() -> Self {
        Self {
            cache_read_weight: FULL_WEIGHT,
            whole_cap: false,
            output_weight: 1,
            burndown: false,
        }
    }
}

impl Counting {
    /// Times each output token counts while the request runs (reserve,
    /// extend): the burndown weight only settles.
    fn running_output_weight(self) -> u64 {
        if self.burndown {
            1
        } else {
            self.output_weight
        }
    }
}

/// Budgets in the store's order and how each counts (same order; a
/// missing entry counts as [`Counting::default`]).
#[derive(Debug, Clone, Copy)]
pub struct Budgets<'a> {
    /// The specs.
    pub specs: &'a [BudgetSpec],
    /// How each counts.
    pub counting: &'a [Counting],
}

impl<'a> Budgets<'a> {
    /// Budgets that all count the default way.
    pub fn plain(specs: &'a [BudgetSpec]) -> Self {
        Self {
            specs,
            counting: &[],
        }
    }

    fn iter(self) -> impl Iterator<Item = (&'a BudgetSpec, Counting)> {
        let counting = self.counting;
        self.specs
            .iter()
            .enumerate()
            .map(move |(i, s)| (s, counting.get(i).copied().unwrap_or_default()))
    }
}

/// What a request asks at reserve, in tokens (from its estimate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Every input token.
    pub input: u64,
    /// Of `input`, the cacheable prefix (0 where the body has no breakpoint).
    pub cacheable_prefix: u64,
    /// Output reserved now (all choices).
    pub output: u64,
    /// The client's whole output cap (all choices), when it gave one.
    pub client_cap: Option<u64>,
    /// Cache writes the body asks for: dollar budgets reserve its input
    /// at the write price.
    pub cache_writes: CacheWrites,
    /// Uses of priced hosted tools the request may make: dollar budgets
    /// reserve their price (`crate::money::hosted`).
    pub hosted: HostedCalls,
}

impl Demand {
    /// The demand of a request estimated as `e`.
    pub fn of(e: &Estimate) -> Self {
        Self {
            input: e.input_tokens,
            cacheable_prefix: e.cacheable_prefix_tokens.min(e.input_tokens),
            output: e.output_tokens,
            client_cap: e
                .client_max_output
                .map(|c| c.saturating_mul(e.choices.max(1))),
            cache_writes: CacheWrites::None,
            hosted: HostedCalls::EMPTY,
        }
    }

    /// Input only (a body with no output).
    pub const fn input(tokens: u64) -> Self {
        Self {
            input: tokens,
            cacheable_prefix: 0,
            output: 0,
            client_cap: None,
            cache_writes: CacheWrites::None,
            hosted: HostedCalls::EMPTY,
        }
    }

    /// Input + output: `Costs::tokens` (metrics, the hold's reserved total).
    pub fn tokens(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    fn input_for(&self, c: Counting) -> u64 {
        if c.cache_read_weight >= FULL_WEIGHT || c.burndown {
            return self.input;
        }
        let prefix = self.cacheable_prefix.min(self.input);
        (self.input - prefix).saturating_add(weighted(prefix, c.cache_read_weight))
    }

    fn output_for(&self, c: Counting) -> u64 {
        let output = match self.client_cap {
            Some(cap) if c.whole_cap => cap.max(self.output),
            _ => self.output,
        };
        output.saturating_mul(c.running_output_weight())
    }
}

/// `ceil(tokens × weight / 1000)`.
fn weighted(tokens: u64, weight: u64) -> u64 {
    let w = (tokens as u128 * weight as u128).div_ceil(FULL_WEIGHT as u128);
    u64::try_from(w).unwrap_or(u64::MAX)
}

/// What one budget counts of `input` and `output` tokens.
fn by_name(name: BudgetName, input: u64, output: u64) -> u64 {
    match name {
        BudgetName::Tpm
        | BudgetName::TokensPerDay
        | BudgetName::TokensPerMonth
        | BudgetName::TokensPer5h
        | BudgetName::TokensPer24h
        | BudgetName::TokensPerWeek => input.saturating_add(output),
        BudgetName::InputTpm => input,
        BudgetName::OutputTpm => output,
        BudgetName::Rpm
        | BudgetName::RequestsPerDay
        | BudgetName::MaxConcurrent
        | BudgetName::RequestsPer5h
        | BudgetName::RequestsPer24h
        | BudgetName::RequestsPerWeek
        | BudgetName::RunsPerDay => 1,
        // Priced, not counted: see `reserve_amount`, `settled_amounts`.
        BudgetName::UsdPerDay
        | BudgetName::UsdPerMonth
        | BudgetName::UsdPer5h
        | BudgetName::UsdPer24h
        | BudgetName::UsdPerWeek => 0,
    }
}

/// True for budgets that count output tokens.
fn counts_output(name: BudgetName) -> bool {
    name.counts_tokens() && name != BudgetName::InputTpm
}

/// What `demand` reserves on `spec` of a deployment priced `price`.
pub fn reserve_amount(
    demand: &Demand,
    spec: &BudgetSpec,
    c: Counting,
    price: Option<&PriceTable>,
) -> u64 {
    if spec.name.counts_usd() {
        return price.map_or(0, |p| {
            p.at(demand.input)
                .reservation(demand.input, demand.output, demand.cache_writes)
                .saturating_add(p.hosted.cost(&demand.hosted))
                .min(crate::money::MAX_COST)
        });
    }
    by_name(spec.name, demand.input_for(c), demand.output_for(c))
}

/// The cost of a reservation of `demand` on the budgets of each candidate
/// (`common`, then the candidate's own), each priced at the candidate's
/// prices.
pub fn reserve_costs<'a>(
    demand: &Demand,
    common: Budgets<'a>,
    candidates: impl Iterator<Item = (Budgets<'a>, Option<&'a PriceTable>)>,
) -> Costs {
    Costs {
        tokens: demand.tokens(),
        per_candidate: candidates
            .map(|(own, price)| {
                common
                    .iter()
                    .chain(own.iter())
                    .map(|(s, c)| reserve_amount(demand, s, c, price))
                    .collect()
            })
            .collect(),
    }
}

/// Units each budget of a hold pays per [`RATE_ONE`] further output
/// tokens: [`RATE_ONE`] where the output counts and was not reserved whole,
/// the output price (µ$ per million tokens, of the tier the reservation
/// was priced at) on dollar budgets of a hold priced `price`, 0 elsewhere
/// (input and request budgets; budgets that hold the client's whole cap
/// already, which a stream never extends past).
pub fn extension_rates<'a>(
    demand: &Demand,
    budgets: impl Iterator<Item = Budgets<'a>>,
    price: Option<&PriceTable>,
) -> Vec<u64> {
    let output_price = price.map_or(0, |p| p.at(demand.input).output);
    let mut rates = Vec::with_capacity(PER_HOLD);
    rates.extend(budgets.flat_map(Budgets::iter).map(|(s, c)| {
        let whole = c.whole_cap && demand.client_cap.is_some();
        if s.name.counts_usd() {
            output_price
        } else if counts_output(s.name) && !whole {
            RATE_ONE.saturating_mul(c.running_output_weight())
        } else {
            0
        }
    }));
    rates
}

/// Room for the lines of a usual hold: a flattened iterator reports no
/// length, so a vector collected from it grew twice on every request.
const PER_HOLD: usize = 16;

/// `tokens` more output at `rates` (from [`extension_rates`]).
pub fn extension_step(tokens: u64, rates: &[u64]) -> Step {
    Step {
        tokens,
        rates: rates.to_vec(),
    }
}

/// What a request that used `used` (every count filled in) charges each
/// budget of its hold, on a deployment priced `price`.
pub fn settled_amounts<'a>(
    used: &UsageBreakdown,
    budgets: impl Iterator<Item = Budgets<'a>>,
    price: Option<&PriceTable>,
) -> Vec<u64> {
    let cost = settled_cost(used, price).unwrap_or(0);
    let mut amounts = Vec::with_capacity(PER_HOLD);
    amounts.extend(budgets.flat_map(Budgets::iter).map(|(s, c)| {
        if s.name.counts_usd() {
            cost
        } else {
            settled_amount(used, s, c)
        }
    }));
    amounts
}

/// What work the upstream never did charges each budget of a hold: every
/// token and µ$ goes back; the request counts stay spent.
pub fn nothing_used<'a>(budgets: impl Iterator<Item = Budgets<'a>>) -> Vec<u64> {
    settled_amounts(&UsageBreakdown::from_counts(0, 0), budgets, None)
}

/// The exact cost of `used` at `price`, µ$ (`None` without a price): its
/// tokens and the hosted-tool uses it reports.
pub fn settled_cost(used: &UsageBreakdown, price: Option<&PriceTable>) -> Option<u64> {
    price.map(|p| p.cost_with(&token_counts(used), &used.hosted))
}

/// A usage breakdown by price class: uncached input, cache reads, 5-minute
/// and 1-hour cache writes, output (reasoning is part of it).
pub fn token_counts(used: &UsageBreakdown) -> TokenCounts {
    let one_hour = used.cache_writes_1h.min(used.cache_writes);
    TokenCounts {
        input: used.uncached_input.unwrap_or(0),
        cached_input: used.cached_input,
        cache_write_5m: used.cache_writes - one_hour,
        cache_write_1h: one_hour,
        output: used.output.unwrap_or(0),
    }
}

/// What `used` charges `spec`: uncached input and cache writes in full,
/// cache reads at the budget's weight, output (reasoning included).
pub fn settled_amount(used: &UsageBreakdown, spec: &BudgetSpec, c: Counting) -> u64 {
    let input = used
        .uncached_input
        .unwrap_or(0)
        .saturating_add(used.cache_writes)
        .saturating_add(weighted(used.cached_input, c.cache_read_weight));
    by_name(
        spec.name,
        input,
        used.output.unwrap_or(0).saturating_mul(c.output_weight),
    )
}

#[cfg(test)]
mod tests;
