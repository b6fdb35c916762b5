//! Amounts per budget: the one place that says what a request costs each
//! budget it touches, at reserve (from the estimate), at extend (further
//! output) and at settle (from the usage breakdown). Pure functions of the
//! specs, how each counts ([`Counting`]) and the counts.
//!
//! What each budget counts, by name:
//! - `tpm`, `tokens_per_day`, `tokens_per_month`: input + output;
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
//! The stores apply whatever these functions say, per spec (store contract
//! v3): budgets that count differently (input and output limits apart,
//! cached input weighted, dollars per deployment) change only these
//! functions.

use crate::dialects::UsageBreakdown;
use crate::estimate::Estimate;
use crate::reserve::{BudgetName, BudgetSpec, Costs, Step, RATE_ONE};

/// Per mille that counts a cached input token in full.
pub const FULL_WEIGHT: u64 = 1000;

/// How one budget counts a request beyond what its name says: fixed per
/// budget plan (scope, model, deployment kind; `reservation::plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counting {
    /// Per mille of each cached input token read that the budget counts
    /// (1000: in full; 0: left out, as Anthropic's input limits do).
    pub cache_read_weight: u64,
    /// Reserves the client's whole output cap at request start, not the
    /// incremental part of a stream: an upstream's per-minute budget of a
    /// provider that counts `max_tokens` at request start.
    pub whole_cap: bool,
}

impl Default for Counting {
    fn default() -> Self {
        Self {
            cache_read_weight: FULL_WEIGHT,
            whole_cap: false,
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
        }
    }

    /// Input only (a body with no output).
    pub const fn input(tokens: u64) -> Self {
        Self {
            input: tokens,
            cacheable_prefix: 0,
            output: 0,
            client_cap: None,
        }
    }

    /// Input + output: `Costs::tokens` (metrics, the hold's reserved total).
    pub fn tokens(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    fn input_for(&self, c: Counting) -> u64 {
        if c.cache_read_weight >= FULL_WEIGHT {
            return self.input;
        }
        let prefix = self.cacheable_prefix.min(self.input);
        (self.input - prefix).saturating_add(weighted(prefix, c.cache_read_weight))
    }

    fn output_for(&self, c: Counting) -> u64 {
        match self.client_cap {
            Some(cap) if c.whole_cap => cap.max(self.output),
            _ => self.output,
        }
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
        BudgetName::Tpm | BudgetName::TokensPerDay | BudgetName::TokensPerMonth => {
            input.saturating_add(output)
        }
        BudgetName::InputTpm => input,
        BudgetName::OutputTpm => output,
        BudgetName::Rpm | BudgetName::RequestsPerDay | BudgetName::MaxConcurrent => 1,
    }
}

/// True for budgets that count output tokens.
fn counts_output(name: BudgetName) -> bool {
    name.counts_tokens() && name != BudgetName::InputTpm
}

/// What `demand` reserves on `spec`.
pub fn reserve_amount(demand: &Demand, spec: &BudgetSpec, c: Counting) -> u64 {
    by_name(spec.name, demand.input_for(c), demand.output_for(c))
}

/// The cost of a reservation of `demand` on the budgets of each candidate
/// (`common`, then the candidate's own).
pub fn reserve_costs<'a>(
    demand: &Demand,
    common: Budgets<'a>,
    candidates: impl Iterator<Item = Budgets<'a>>,
) -> Costs {
    Costs {
        tokens: demand.tokens(),
        per_candidate: candidates
            .map(|own| {
                common
                    .iter()
                    .chain(own.iter())
                    .map(|(s, c)| reserve_amount(demand, s, c))
                    .collect()
            })
            .collect(),
    }
}

/// Units each budget of a hold pays per [`RATE_ONE`] further output
/// tokens: [`RATE_ONE`] where the output counts and was not reserved whole,
/// 0 elsewhere (input and request budgets; budgets that hold the client's
/// whole cap already, which a stream never extends past).
pub fn extension_rates<'a>(
    demand: &Demand,
    budgets: impl Iterator<Item = Budgets<'a>>,
) -> Vec<u64> {
    budgets
        .flat_map(Budgets::iter)
        .map(|(s, c)| {
            let whole = c.whole_cap && demand.client_cap.is_some();
            if counts_output(s.name) && !whole {
                RATE_ONE
            } else {
                0
            }
        })
        .collect()
}

/// `tokens` more output at `rates` (from [`extension_rates`]).
pub fn extension_step(tokens: u64, rates: &[u64]) -> Step {
    Step {
        tokens,
        rates: rates.to_vec(),
    }
}

/// What a request that used `used` (every count filled in) charges each
/// budget of its hold.
pub fn settled_amounts<'a>(
    used: &UsageBreakdown,
    budgets: impl Iterator<Item = Budgets<'a>>,
) -> Vec<u64> {
    budgets
        .flat_map(Budgets::iter)
        .map(|(s, c)| settled_amount(used, s, c))
        .collect()
}

/// What `used` charges `spec`: uncached input and cache writes in full,
/// cache reads at the budget's weight, output (reasoning included).
pub fn settled_amount(used: &UsageBreakdown, spec: &BudgetSpec, c: Counting) -> u64 {
    let input = used
        .uncached_input
        .unwrap_or(0)
        .saturating_add(used.cache_writes)
        .saturating_add(weighted(used.cached_input, c.cache_read_weight));
    by_name(spec.name, input, used.output.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::{BudgetKind, Scope};

    fn spec(name: BudgetName) -> BudgetSpec {
        BudgetSpec {
            scope: Scope::Tenant("t".into()),
            name,
            kind: BudgetKind::Concurrency { max: 1 },
            key: String::new(),
            refund_unused: true,
            shadow: false,
        }
    }

    const LEFT_OUT: Counting = Counting {
        cache_read_weight: 0,
        whole_cap: false,
    };

    #[test]
    fn default_counting_equals_what_one_token_number_meant() {
        let common = [spec(BudgetName::Rpm), spec(BudgetName::Tpm)];
        let own = [
            spec(BudgetName::TokensPerDay),
            spec(BudgetName::MaxConcurrent),
        ];
        let demand = Demand {
            input: 100,
            output: 20,
            ..Demand::default()
        };
        let costs = reserve_costs(
            &demand,
            Budgets::plain(&common),
            [Budgets::plain(&own), Budgets::plain(&[])].into_iter(),
        );
        assert_eq!(costs.tokens, 120);
        assert_eq!(
            costs.per_candidate,
            vec![vec![1, 120, 120, 1], vec![1, 120]]
        );
        let rates = extension_rates(
            &demand,
            [Budgets::plain(&common), Budgets::plain(&own)].into_iter(),
        );
        assert_eq!(rates, vec![0, RATE_ONE, RATE_ONE, 0]);
        let used = UsageBreakdown {
            uncached_input: Some(30),
            cached_input: 10,
            output: Some(25),
            reasoning: 5,
            ..UsageBreakdown::default()
        };
        let all = [Budgets::plain(&common), Budgets::plain(&own)];
        assert_eq!(settled_amounts(&used, all.into_iter()), vec![1, 65, 65, 1]);
    }

    #[test]
    fn input_and_output_limits_count_their_own_part() {
        let specs = [
            spec(BudgetName::InputTpm),
            spec(BudgetName::OutputTpm),
            spec(BudgetName::Tpm),
        ];
        let demand = Demand {
            input: 300,
            output: 40,
            ..Demand::default()
        };
        let costs = reserve_costs(
            &demand,
            Budgets::plain(&specs),
            std::iter::once(Budgets::plain(&[])),
        );
        assert_eq!(costs.per_candidate, vec![vec![300, 40, 340]]);
        // Extensions debit output only.
        let rates = extension_rates(&demand, std::iter::once(Budgets::plain(&specs)));
        assert_eq!(rates, vec![0, RATE_ONE, RATE_ONE]);
        // Reasoning is a subset of the output, never added again.
        let used = UsageBreakdown {
            uncached_input: Some(280),
            output: Some(90),
            reasoning: 60,
            ..UsageBreakdown::default()
        };
        assert_eq!(
            settled_amounts(&used, std::iter::once(Budgets::plain(&specs))),
            vec![280, 90, 370]
        );
    }

    #[test]
    fn cache_tokens_settle_as_each_budget_counts_them() {
        let specs = [
            spec(BudgetName::Tpm),
            spec(BudgetName::InputTpm),
            spec(BudgetName::OutputTpm),
        ];
        // Anthropic: cache reads and writes are beside input_tokens; the
        // 5m/1h split is a breakdown of the writes, never added.
        let anthropic = crate::dialects::anthropic::usage_from_value(&serde_json::json!({
            "input_tokens": 7, "cache_read_input_tokens": 10000,
            "cache_creation_input_tokens": 2000, "output_tokens": 50,
            "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 0}
        }));
        let everything = Budgets::plain(&specs);
        assert_eq!(
            settled_amounts(&anthropic, std::iter::once(everything)),
            vec![12_057, 12_007, 50]
        );
        // Anthropic's input limits leave cache reads out.
        let reads_out = [LEFT_OUT; 3];
        let provider = Budgets {
            specs: &specs,
            counting: &reads_out,
        };
        assert_eq!(
            settled_amounts(&anthropic, std::iter::once(provider)),
            vec![2_057, 2_007, 50]
        );
        // A weight of 250 ‰ counts a quarter of each read, rounded up.
        let quarter = Counting {
            cache_read_weight: 250,
            whole_cap: false,
        };
        assert_eq!(settled_amount(&anthropic, &specs[0], quarter), 4_557);
        // OpenAI: cached_tokens is inside prompt_tokens, never added again.
        let openai = crate::dialects::openai::usage_from_value(&serde_json::json!({
            "prompt_tokens": 10339, "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 10318}
        }));
        assert_eq!(
            settled_amount(&openai, &specs[0], Counting::default()),
            10_359
        );
        assert_eq!(settled_amount(&openai, &specs[0], LEFT_OUT), 41);
    }

    #[test]
    fn a_cacheable_prefix_is_reserved_at_the_budget_weight() {
        let specs = [spec(BudgetName::Tpm), spec(BudgetName::InputTpm)];
        let demand = Demand {
            input: 12_000,
            cacheable_prefix: 11_000,
            output: 500,
            client_cap: Some(500),
        };
        let full = reserve_costs(
            &demand,
            Budgets::plain(&specs),
            std::iter::once(Budgets::plain(&[])),
        );
        assert_eq!(full.per_candidate, vec![vec![12_500, 12_000]]);
        let reads_out = [LEFT_OUT; 2];
        let provider = Budgets {
            specs: &specs,
            counting: &reads_out,
        };
        let costs = reserve_costs(&demand, Budgets::plain(&[]), std::iter::once(provider));
        assert_eq!(costs.per_candidate, vec![vec![1_500, 1_000]]);
        let tenth = Counting {
            cache_read_weight: 100,
            whole_cap: false,
        };
        assert_eq!(reserve_amount(&demand, &specs[1], tenth), 2_100);
    }

    #[test]
    fn whole_cap_budgets_reserve_the_client_cap_and_are_not_extended() {
        let specs = [
            spec(BudgetName::OutputTpm),
            spec(BudgetName::Tpm),
            spec(BudgetName::TokensPerDay),
        ];
        let whole = Counting {
            cache_read_weight: FULL_WEIGHT,
            whole_cap: true,
        };
        let counting = [whole, whole, Counting::default()];
        let upstream = Budgets {
            specs: &specs,
            counting: &counting,
        };
        // A stream reserving 256 of a client cap of 32,000.
        let incremental = Demand {
            input: 10,
            output: 256,
            client_cap: Some(32_000),
            ..Demand::default()
        };
        let costs = reserve_costs(&incremental, Budgets::plain(&[]), std::iter::once(upstream));
        assert_eq!(costs.per_candidate, vec![vec![32_000, 32_010, 266]]);
        assert_eq!(
            extension_rates(&incremental, std::iter::once(upstream)),
            vec![0, 0, RATE_ONE]
        );
        // No client cap: the stream extends up to the model's maximum on every budget.
        let uncapped = Demand {
            client_cap: None,
            ..incremental
        };
        let costs = reserve_costs(&uncapped, Budgets::plain(&[]), std::iter::once(upstream));
        assert_eq!(costs.per_candidate, vec![vec![256, 266, 266]]);
        assert_eq!(
            extension_rates(&uncapped, std::iter::once(upstream)),
            vec![RATE_ONE; 3]
        );
    }
}
