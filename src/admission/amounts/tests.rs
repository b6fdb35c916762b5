//! Tests of the amounts per budget: tokens, requests, input and output
//! limits, cache-read weights, whole caps, and dollars at a deployment's
//! prices.

use super::*;
use crate::budget::{BudgetKind, Scope};

fn spec(name: BudgetName) -> BudgetSpec {
    BudgetSpec {
        scope: Scope::Tenant("t".into()),
        name,
        kind: BudgetKind::Concurrency { max: 1 },
        key: "".into(),
        refund_unused: true,
        shadow: false,
    }
}

const LEFT_OUT: Counting = Counting {
    cache_read_weight: 0,
    whole_cap: false,
    output_weight: 1,
    burndown: false,
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
        [(Budgets::plain(&own), None), (Budgets::plain(&[]), None)].into_iter(),
    );
    assert_eq!(costs.tokens, 120);
    assert_eq!(
        costs.per_candidate,
        vec![vec![1, 120, 120, 1], vec![1, 120]]
    );
    let rates = extension_rates(
        &demand,
        [Budgets::plain(&common), Budgets::plain(&own)].into_iter(),
        None,
    );
    assert_eq!(rates, vec![0, RATE_ONE, RATE_ONE, 0]);
    let used = UsageBreakdown {
        uncached_input: Some(30),
        cached_input: 10,
        output: Some(25),
        reasoning: 5,
        hosted: Default::default(),
        ..UsageBreakdown::default()
    };
    let all = [Budgets::plain(&common), Budgets::plain(&own)];
    assert_eq!(
        settled_amounts(&used, all.into_iter(), None),
        vec![1, 65, 65, 1]
    );
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
        std::iter::once((Budgets::plain(&[]), None)),
    );
    assert_eq!(costs.per_candidate, vec![vec![300, 40, 340]]);
    // Extensions debit output only.
    let rates = extension_rates(&demand, std::iter::once(Budgets::plain(&specs)), None);
    assert_eq!(rates, vec![0, RATE_ONE, RATE_ONE]);
    // Reasoning is a subset of the output, never added again.
    let used = UsageBreakdown {
        uncached_input: Some(280),
        output: Some(90),
        reasoning: 60,
        hosted: Default::default(),
        ..UsageBreakdown::default()
    };
    assert_eq!(
        settled_amounts(&used, std::iter::once(Budgets::plain(&specs)), None),
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
        settled_amounts(&anthropic, std::iter::once(everything), None),
        vec![12_057, 12_007, 50]
    );
    // Anthropic's input limits leave cache reads out.
    let reads_out = [LEFT_OUT; 3];
    let provider = Budgets {
        specs: &specs,
        counting: &reads_out,
    };
    assert_eq!(
        settled_amounts(&anthropic, std::iter::once(provider), None),
        vec![2_057, 2_007, 50]
    );
    // A weight of 250 ‰ counts a quarter of each read, rounded up.
    let quarter = Counting {
        cache_read_weight: 250,
        whole_cap: false,
        output_weight: 1,
        burndown: false,
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
        cache_writes: CacheWrites::None,
        hosted: Default::default(),
    };
    let full = reserve_costs(
        &demand,
        Budgets::plain(&specs),
        std::iter::once((Budgets::plain(&[]), None)),
    );
    assert_eq!(full.per_candidate, vec![vec![12_500, 12_000]]);
    let reads_out = [LEFT_OUT; 2];
    let provider = Budgets {
        specs: &specs,
        counting: &reads_out,
    };
    let costs = reserve_costs(
        &demand,
        Budgets::plain(&[]),
        std::iter::once((provider, None)),
    );
    assert_eq!(costs.per_candidate, vec![vec![1_500, 1_000]]);
    let tenth = Counting {
        cache_read_weight: 100,
        whole_cap: false,
        output_weight: 1,
        burndown: false,
    };
    assert_eq!(reserve_amount(&demand, &specs[1], tenth, None), 2_100);
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
        output_weight: 1,
        burndown: false,
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
    let costs = reserve_costs(
        &incremental,
        Budgets::plain(&[]),
        std::iter::once((upstream, None)),
    );
    assert_eq!(costs.per_candidate, vec![vec![32_000, 32_010, 266]]);
    assert_eq!(
        extension_rates(&incremental, std::iter::once(upstream), None),
        vec![0, 0, RATE_ONE]
    );
    // No client cap: the stream extends up to the model's maximum on every budget.
    let uncapped = Demand {
        client_cap: None,
        ..incremental
    };
    let costs = reserve_costs(
        &uncapped,
        Budgets::plain(&[]),
        std::iter::once((upstream, None)),
    );
    assert_eq!(costs.per_candidate, vec![vec![256, 266, 266]]);
    assert_eq!(
        extension_rates(&uncapped, std::iter::once(upstream), None),
        vec![RATE_ONE; 3]
    );
}

fn usd() -> BudgetSpec {
    BudgetSpec {
        kind: BudgetKind::Quota {
            limit: 1_000_000,
            window: crate::budget::Window::Day,
        },
        ..spec(BudgetName::UsdPerDay)
    }
}

/// gpt-4o-mini: $0.15 in, $0.075 cached, $0.60 out per million.
fn mini() -> PriceTable {
    PriceTable::flat(crate::money::Price {
        input: 150_000,
        cached_input: 75_000,
        cache_write_5m: 150_000,
        cache_write_1h: 150_000,
        output: 600_000,
    })
}

/// Claude Sonnet 4.5's prices per million: $3, $0.30, $3.75, $6, $15.
fn sonnet() -> PriceTable {
    PriceTable::flat(crate::money::Price {
        input: 3_000_000,
        cached_input: 300_000,
        cache_write_5m: 3_750_000,
        cache_write_1h: 6_000_000,
        output: 15_000_000,
    })
}

#[test]
fn dollar_budgets_cost_each_candidate_its_own_prices() {
    let common = [spec(BudgetName::Tpm), usd()];
    let demand = Demand {
        input: 1000,
        output: 500,
        ..Demand::default()
    };
    let (m, s) = (mini(), sonnet());
    let costs = reserve_costs(
        &demand,
        Budgets::plain(&common),
        [
            (Budgets::plain(&[]), Some(&m)),
            (Budgets::plain(&[]), Some(&s)),
            (Budgets::plain(&[]), None),
        ]
        .into_iter(),
    );
    // 1000 × 0.15 + 500 × 0.60 = 450 µ$; 1000 × 3 + 500 × 15 = 10,500 µ$.
    assert_eq!(
        costs.per_candidate,
        vec![vec![1500, 450], vec![1500, 10_500], vec![1500, 0]]
    );
    // Caching asked: the input at the write price of its TTL.
    let cached = Demand {
        cache_writes: CacheWrites::OneHour,
        ..demand
    };
    assert_eq!(
        reserve_amount(&cached, &usd(), Counting::default(), Some(&s)),
        6000 + 7500
    );
    let rates = extension_rates(&demand, std::iter::once(Budgets::plain(&common)), Some(&s));
    assert_eq!(rates, vec![RATE_ONE, 15_000_000]);
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
    let all = || std::iter::once(Budgets::plain(&specs));
    assert_eq!(
        settled_amounts(&used, all(), Some(&sonnet())),
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
    assert_eq!(nothing_used(all()), vec![0, 0]);
}

/// A deployment that burns its quota five times faster for output
/// (Bedrock's Claude 4 burndown) reserves input + 5 × cap on its `tpm`
/// and settles input + 5 × actual output; its extension rate is 5 per token.
#[test]
fn an_output_weight_multiplies_the_output_a_budget_counts() {
    let five = Counting {
        cache_read_weight: FULL_WEIGHT,
        whole_cap: true,
        output_weight: 5,
        burndown: false,
    };
    let demand = Demand {
        input: 100,
        cacheable_prefix: 0,
        output: 40,
        client_cap: Some(1000),
        cache_writes: CacheWrites::None,
        hosted: HostedCalls::EMPTY,
    };
    assert_eq!(
        reserve_amount(&demand, &spec(BudgetName::Tpm), five, None),
        5_100
    );
    assert_eq!(
        reserve_amount(&demand, &spec(BudgetName::InputTpm), five, None),
        100
    );
    let used = UsageBreakdown::from_counts(100, 30);
    assert_eq!(settled_amount(&used, &spec(BudgetName::Tpm), five), 250);
    let streamed = Counting {
        whole_cap: false,
        ..five
    };
    let rates = extension_rates(
        &Demand {
            client_cap: None,
            ..demand
        },
        std::iter::once(Budgets {
            specs: &[spec(BudgetName::Tpm)],
            counting: &[streamed],
        }),
        None,
    );
    assert_eq!(rates, vec![5 * RATE_ONE]);
}

/// A `bedrock` deployment's `tpm` counts as AWS's quota does: input with
/// its cache tokens + `max_tokens` reserved (the weight left out, so
/// Claude Code's 64,000 cap fits a 200,000 tpm quota), uncached input +
/// cache writes + 5 × output settled (cache reads left out), never
/// extended.
#[test]
fn a_burndown_budget_reserves_the_cap_once_and_settles_the_weighted_output() {
    let bedrock = Counting {
        cache_read_weight: 0,
        whole_cap: true,
        output_weight: 5,
        burndown: true,
    };
    let demand = Demand {
        input: 30_000,
        cacheable_prefix: 25_000,
        output: 4_096,
        client_cap: Some(64_000),
        cache_writes: CacheWrites::None,
        hosted: HostedCalls::EMPTY,
    };
    let tpm = spec(BudgetName::Tpm);
    assert_eq!(reserve_amount(&demand, &tpm, bedrock, None), 94_000);
    assert_eq!(
        reserve_amount(&demand, &spec(BudgetName::OutputTpm), bedrock, None),
        64_000
    );
    let used = crate::dialects::anthropic::usage_from_value(&serde_json::json!({
        "input_tokens": 5_000, "cache_read_input_tokens": 20_000,
        "cache_creation_input_tokens": 3_000, "output_tokens": 900
    }));
    assert_eq!(
        settled_amount(&used, &tpm, bedrock),
        5_000 + 3_000 + 5 * 900
    );
    let rates = extension_rates(
        &demand,
        std::iter::once(Budgets {
            specs: &[tpm],
            counting: &[bedrock],
        }),
        None,
    );
    assert_eq!(rates, vec![0], "never extended");
}
