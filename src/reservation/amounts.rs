//! Amounts per budget: the one place that says what a request costs each
//! budget it touches, at reserve (from the estimate), at extend (further
//! output) and at settle (from the usage breakdown). Pure functions of the
//! specs and the counts.
//!
//! The stores apply whatever these functions say, per spec (store contract
//! v3): budgets that count differently (input and output limits apart,
//! cached input weighted, dollars per deployment) change only these
//! functions.

use crate::dialects::UsageBreakdown;
use crate::reserve::{BudgetName, BudgetSpec, Costs, Step, RATE_ONE};

/// The cost of a reservation of `tokens` (input + reserved output) on the
/// specs of each candidate (`common`, then the candidate's own).
pub fn reserve_costs<'a>(
    tokens: u64,
    common: &[BudgetSpec],
    candidates: impl Iterator<Item = &'a [BudgetSpec]>,
) -> Costs {
    Costs {
        tokens,
        per_candidate: candidates
            .map(|own| {
                common
                    .iter()
                    .chain(own.iter())
                    .map(|s| s.cost(tokens))
                    .collect()
            })
            .collect(),
    }
}

/// `tokens` more output on the specs of a hold.
pub fn extension_step<'a>(tokens: u64, specs: impl Iterator<Item = &'a BudgetSpec>) -> Step {
    Step {
        tokens,
        rates: specs
            .map(|s| if s.name.counts_tokens() { RATE_ONE } else { 0 })
            .collect(),
    }
}

/// What a request that used `used` (every count filled in) charges each
/// spec of its hold.
pub fn settled_amounts<'a>(
    used: &UsageBreakdown,
    specs: impl Iterator<Item = &'a BudgetSpec>,
) -> Vec<u64> {
    specs.map(|s| settled_amount(used, s)).collect()
}

/// What `used` charges `spec`: tokens (input + output) for token budgets,
/// the request itself for request and concurrency budgets.
pub fn settled_amount(used: &UsageBreakdown, spec: &BudgetSpec) -> u64 {
    match spec.name {
        BudgetName::Tpm | BudgetName::TokensPerDay | BudgetName::TokensPerMonth => used.total(),
        BudgetName::Rpm | BudgetName::RequestsPerDay | BudgetName::MaxConcurrent => 1,
    }
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

    #[test]
    fn amounts_equal_what_one_token_number_means_today() {
        let common = [spec(BudgetName::Rpm), spec(BudgetName::Tpm)];
        let own = [
            spec(BudgetName::TokensPerDay),
            spec(BudgetName::MaxConcurrent),
        ];
        let costs = reserve_costs(120, &common, [&own[..], &[]].into_iter());
        assert_eq!(
            costs.per_candidate,
            vec![vec![1, 120, 120, 1], vec![1, 120]]
        );
        for (i, s) in common.iter().chain(own.iter()).enumerate() {
            assert_eq!(costs.of(0, i, s), Costs::tokens(120).of(0, i, s));
        }
        let step = extension_step(16, common.iter().chain(own.iter()));
        assert_eq!(step.rates, vec![0, RATE_ONE, RATE_ONE, 0]);
        let used = UsageBreakdown {
            uncached_input: Some(30),
            cached_input: 10,
            output: Some(25),
            reasoning: 5,
            ..UsageBreakdown::default()
        };
        assert_eq!(
            settled_amounts(&used, common.iter().chain(own.iter())),
            vec![1, 65, 65, 1]
        );
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
