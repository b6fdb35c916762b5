//! Amounts per budget: the one place that says what a request costs each
//! budget it touches, at reserve (from the estimate), at extend (further
//! output) and at settle (from the usage breakdown). Pure functions of the
//! specs, the counts and the deployment's prices.
//!
//! Token budgets count input + output tokens; request budgets count the
//! request; dollar budgets count µ$ at the prices of the deployment the
//! hold is on (`crate::money`): the estimate at reserve (input at the
//! cache-write price when the body asks for caching), the output price per
//! extended token, the usage breakdown's exact cost at settle, rounded up
//! once each time. A dollar budget on a deployment without a price (only
//! reachable for shadow budgets: prepare refuses the rest) counts 0.
//!
//! The stores apply whatever these functions say, per spec (store contract
//! v3): budgets that count differently change only these functions.

use crate::dialects::UsageBreakdown;
use crate::money::{CacheWrites, Price, PriceTable, TokenCounts};
use crate::reserve::{BudgetName, BudgetSpec, Costs, Step, RATE_ONE};

/// What a request is estimated to use: what its reservation prices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimated {
    /// Input tokens.
    pub input: u64,
    /// Reserved output tokens (every choice).
    pub output: u64,
    /// Cache writes the body asks for.
    pub cache: CacheWrites,
}

impl Estimated {
    /// Input + output tokens: what a token budget reserves.
    pub fn tokens(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// The cost of a reservation of `est` on the specs of each candidate
/// (`common`, then the candidate's own), priced at the candidate's prices.
pub fn reserve_costs<'a>(
    est: &Estimated,
    common: &[BudgetSpec],
    candidates: impl Iterator<Item = (&'a [BudgetSpec], Option<&'a PriceTable>)>,
) -> Costs {
    Costs {
        tokens: est.tokens(),
        per_candidate: candidates
            .map(|(own, price)| {
                common
                    .iter()
                    .chain(own.iter())
                    .map(|s| reserve_amount(est, s, price))
                    .collect()
            })
            .collect(),
    }
}

/// What reserving `est` costs `spec` on a deployment priced `price`.
pub fn reserve_amount(est: &Estimated, spec: &BudgetSpec, price: Option<&PriceTable>) -> u64 {
    if spec.name.counts_usd() {
        price.map_or(0, |p| {
            p.at(est.input)
                .reservation(est.input, est.output, est.cache)
        })
    } else {
        spec.cost(est.tokens())
    }
}

/// `tokens` more output on the specs of a hold whose deployment's output
/// is priced `price` (the tier its reservation was priced at).
pub fn extension_step<'a>(
    tokens: u64,
    specs: impl Iterator<Item = &'a BudgetSpec>,
    price: Option<&Price>,
) -> Step {
    Step {
        tokens,
        rates: specs
            .map(|s| {
                if s.name.counts_tokens() {
                    RATE_ONE
                } else if s.name.counts_usd() {
                    // µ$ per million tokens: the store debits ceil(g × rate / 10^6).
                    price.map_or(0, |p| p.output)
                } else {
                    0
                }
            })
            .collect(),
    }
}

/// What a request that used `used` (every count filled in) charges each
/// spec of its hold, on a deployment priced `price`.
pub fn settled_amounts<'a>(
    used: &UsageBreakdown,
    specs: impl Iterator<Item = &'a BudgetSpec>,
    price: Option<&PriceTable>,
) -> Vec<u64> {
    let cost = settled_cost(used, price).unwrap_or(0);
    specs
        .map(|s| {
            if s.name.counts_usd() {
                cost
            } else {
                settled_amount(used, s)
            }
        })
        .collect()
}

/// What `used` charges `spec` of a budget that is not priced: tokens
/// (input + output) for token budgets, the request itself for request and
/// concurrency budgets (dollar budgets: [`settled_amounts`]).
pub fn settled_amount(used: &UsageBreakdown, spec: &BudgetSpec) -> u64 {
    match spec.name {
        BudgetName::Tpm | BudgetName::TokensPerDay | BudgetName::TokensPerMonth => used.total(),
        BudgetName::Rpm | BudgetName::RequestsPerDay | BudgetName::MaxConcurrent => 1,
        BudgetName::UsdPerDay | BudgetName::UsdPerMonth => 0,
    }
}

/// The exact cost of `used` at `price`, µ$ (`None` without a price).
pub fn settled_cost(used: &UsageBreakdown, price: Option<&PriceTable>) -> Option<u64> {
    price.map(|p| p.cost(&token_counts(used)))
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

/// A settlement that charges nothing but the request count: what work the
/// upstream never did costs each spec of the hold (tokens and µ$ all go
/// back; the request count stays spent).
pub fn nothing_used<'a>(specs: impl Iterator<Item = &'a BudgetSpec>) -> Vec<u64> {
    settled_amounts(&UsageBreakdown::from_counts(0, 0), specs, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reserve::{BudgetKind, Scope, Window};

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

    fn usd() -> BudgetSpec {
        BudgetSpec {
            kind: BudgetKind::Quota {
                limit: 1_000_000,
                window: Window::Day,
            },
            ..spec(BudgetName::UsdPerDay)
        }
    }

    /// gpt-4o-mini: $0.15 in, $0.075 cached, $0.60 out per million.
    fn mini() -> PriceTable {
        PriceTable::flat(Price {
            input: 150_000,
            cached_input: 75_000,
            cache_write_5m: 150_000,
            cache_write_1h: 150_000,
            output: 600_000,
        })
    }

    /// Claude Sonnet 4.5's prices per million: $3, $0.30, $3.75, $6, $15.
    fn sonnet() -> PriceTable {
        PriceTable::flat(Price {
            input: 3_000_000,
            cached_input: 300_000,
            cache_write_5m: 3_750_000,
            cache_write_1h: 6_000_000,
            output: 15_000_000,
        })
    }

    #[test]
    fn token_and_request_amounts_are_unchanged() {
        let common = [spec(BudgetName::Rpm), spec(BudgetName::Tpm)];
        let own = [
            spec(BudgetName::TokensPerDay),
            spec(BudgetName::MaxConcurrent),
        ];
        let est = Estimated {
            input: 100,
            output: 20,
            cache: CacheWrites::None,
        };
        let costs = reserve_costs(
            &est,
            &common,
            [(&own[..], None), (&[][..], None)].into_iter(),
        );
        assert_eq!(
            costs.per_candidate,
            vec![vec![1, 120, 120, 1], vec![1, 120]]
        );
        for (i, s) in common.iter().chain(own.iter()).enumerate() {
            assert_eq!(costs.of(0, i, s), Costs::tokens(120).of(0, i, s));
        }
        let step = extension_step(16, common.iter().chain(own.iter()), None);
        assert_eq!(step.rates, vec![0, RATE_ONE, RATE_ONE, 0]);
        let used = UsageBreakdown {
            uncached_input: Some(30),
            cached_input: 10,
            output: Some(25),
            reasoning: 5,
            ..UsageBreakdown::default()
        };
        assert_eq!(
            settled_amounts(&used, common.iter().chain(own.iter()), None),
            vec![1, 65, 65, 1]
        );
    }

    #[test]
    fn dollar_budgets_cost_each_candidate_its_own_prices() {
        let common = [spec(BudgetName::Tpm), usd()];
        let est = Estimated {
            input: 1000,
            output: 500,
            cache: CacheWrites::None,
        };
        let (m, s) = (mini(), sonnet());
        let costs = reserve_costs(
            &est,
            &common,
            [(&[][..], Some(&m)), (&[][..], Some(&s)), (&[][..], None)].into_iter(),
        );
        // 1000 × 0.15 + 500 × 0.60 = 450 µ$; 1000 × 3 + 500 × 15 = 10,500 µ$.
        assert_eq!(
            costs.per_candidate,
            vec![vec![1500, 450], vec![1500, 10_500], vec![1500, 0]]
        );
        // Caching asked: the input at the write price of its TTL.
        let cached = Estimated {
            cache: CacheWrites::OneHour,
            ..est
        };
        assert_eq!(reserve_amount(&cached, &usd(), Some(&s)), 6000 + 7500);
        let step = extension_step(256, common.iter(), Some(s.at(1000)));
        assert_eq!(step.rates, vec![RATE_ONE, 15_000_000]);
    }

    #[test]
    fn settlement_prices_every_usage_class_at_its_own_price() {
        // Anthropic: 7 uncached, 10,000 read, 2,000 written (500 for 1 h), 50 out.
        let used = crate::dialects::anthropic::usage_from_value(&serde_json::json!({
            "input_tokens": 7, "cache_read_input_tokens": 10000,
            "cache_creation_input_tokens": 2000, "output_tokens": 50,
            "cache_creation": {"ephemeral_5m_input_tokens": 1500, "ephemeral_1h_input_tokens": 500}
        }));
        let want = (7 * 3_000_000u64
            + 10_000 * 300_000
            + 1500 * 3_750_000
            + 500 * 6_000_000
            + 50 * 15_000_000)
            .div_ceil(1_000_000);
        assert_eq!(want, 12_396); // $0.012396
        let specs = [spec(BudgetName::Tpm), usd()];
        assert_eq!(
            settled_amounts(&used, specs.iter(), Some(&sonnet())),
            vec![12_057, want]
        );
        // OpenAI: cached_tokens inside prompt_tokens, reasoning inside completion.
        let used = crate::dialects::openai::usage_from_value(&serde_json::json!({
            "prompt_tokens": 10339, "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 10318},
            "completion_tokens_details": {"reasoning_tokens": 12}
        }));
        let want = (21 * 150_000u64 + 10_318 * 75_000 + 20 * 600_000).div_ceil(1_000_000);
        assert_eq!(settled_cost(&used, Some(&mini())), Some(want));
        assert_eq!(nothing_used(specs.iter()), vec![0, 0]);
    }

    #[test]
    fn cache_tokens_settle_as_each_provider_counts_them() {
        let tpm = spec(BudgetName::Tpm);
        // OpenAI: cached_tokens is inside prompt_tokens, never added again.
        let openai = crate::dialects::openai::usage_from_value(&serde_json::json!({
            "prompt_tokens": 10339, "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 10318}
        }));
        assert_eq!(settled_amount(&openai, &tpm), 10_359);
        // Anthropic: cache reads and writes are beside input_tokens; the
        // 5m/1h split is a breakdown of the writes, never added.
        let anthropic = crate::dialects::anthropic::usage_from_value(&serde_json::json!({
            "input_tokens": 7, "cache_read_input_tokens": 10000,
            "cache_creation_input_tokens": 2000, "output_tokens": 50,
            "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 0}
        }));
        assert_eq!(settled_amount(&anthropic, &tpm), 12_057);
    }
}
