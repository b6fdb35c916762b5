//! A deployment's prices and the one cost function.

use super::{MAX_COST, PRICE_TOKENS};

/// Prices of one model on one deployment, µ$ per million tokens, by token
/// class. Reasoning tokens are output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    /// Input not read from a cache.
    pub input: u64,
    /// Input read from the provider's cache.
    pub cached_input: u64,
    /// Input written to a cache that lives 5 minutes.
    pub cache_write_5m: u64,
    /// Input written to a cache that lives 1 hour.
    pub cache_write_1h: u64,
    /// Output, reasoning included.
    pub output: u64,
}

/// A request's tokens by price class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Input not read from a cache (nor written to one).
    pub input: u64,
    /// Input read from a cache.
    pub cached_input: u64,
    /// Input written to a 5-minute cache.
    pub cache_write_5m: u64,
    /// Input written to a 1-hour cache.
    pub cache_write_1h: u64,
    /// Output, reasoning included.
    pub output: u64,
}

impl TokenCounts {
    /// All input tokens: what a long-context tier is chosen by.
    pub fn all_input(&self) -> u64 {
        self.input
            .saturating_add(self.cached_input)
            .saturating_add(self.cache_write_5m)
            .saturating_add(self.cache_write_1h)
    }
}

/// Which cache writes a request body asks for (Anthropic `cache_control`),
/// priced at reservation as if its whole input were written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheWrites {
    /// No caching asked for: input at the input price.
    #[default]
    None,
    /// `cache_control` with the default (5-minute) TTL.
    FiveMinutes,
    /// At least one `cache_control` with `ttl: "1h"`.
    OneHour,
}

impl Price {
    /// `ceil(Σ tokens_i × price_i / 10^6)` µ$, in `u128`, at most
    /// [`MAX_COST`] (usage comes from upstream answers: any count is safe).
    pub fn cost(&self, c: &TokenCounts) -> u64 {
        let terms = [
            (c.input, self.input),
            (c.cached_input, self.cached_input),
            (c.cache_write_5m, self.cache_write_5m),
            (c.cache_write_1h, self.cache_write_1h),
            (c.output, self.output),
        ];
        let sum: u128 = terms
            .iter()
            .map(|&(t, p)| u128::from(t) * u128::from(p))
            .sum();
        let micros = sum.div_ceil(u128::from(PRICE_TOKENS));
        u64::try_from(micros).unwrap_or(u64::MAX).min(MAX_COST)
    }

    /// The price a reservation charges each input token: the input price,
    /// or the highest price a write of the asked TTL may cost (a write
    /// costs more than plain input at every provider that bills writes,
    /// and the gateway cannot tell which part of the input will be a hit).
    pub fn reserved_input(&self, cache: CacheWrites) -> u64 {
        match cache {
            CacheWrites::None => self.input,
            CacheWrites::FiveMinutes => self.input.max(self.cache_write_5m),
            CacheWrites::OneHour => self.input.max(self.cache_write_5m).max(self.cache_write_1h),
        }
    }

    /// What a reservation of `input` and `output` tokens costs, µ$.
    pub fn reservation(&self, input: u64, output: u64, cache: CacheWrites) -> u64 {
        Price {
            input: self.reserved_input(cache),
            output: self.output,
            ..Price::default()
        }
        .cost(&TokenCounts {
            input,
            output,
            ..TokenCounts::default()
        })
    }
}

/// The prices of one model on one deployment: a base price and optional
/// long-context tiers, each applying to a whole request whose input
/// (cache reads and writes included) is above its threshold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    /// The price up to the first tier.
    pub base: Price,
    /// `(above_input_tokens, price)`, thresholds strictly increasing.
    pub tiers: Vec<(u64, Price)>,
    /// Hosted tools priced per use (the model's `hosted_tools`), at every tier.
    pub hosted: super::hosted::HostedPrices,
}

impl PriceTable {
    /// A table of one price.
    pub fn flat(base: Price) -> Self {
        Self {
            base,
            tiers: Vec::new(),
            hosted: Default::default(),
        }
    }

    /// The price of a request of `input` tokens of input: the last tier
    /// whose threshold it is above, else the base price.
    pub fn at(&self, input: u64) -> &Price {
        self.tiers
            .iter()
            .rev()
            .find(|(above, _)| input > *above)
            .map_or(&self.base, |(_, p)| p)
    }

    /// What `c` costs, at the tier of its input.
    pub fn cost(&self, c: &TokenCounts) -> u64 {
        self.at(c.all_input()).cost(c)
    }

    /// What `c` and the hosted-tool `uses` cost together, µ$, at most
    /// [`MAX_COST`].
    pub fn cost_with(&self, c: &TokenCounts, uses: &super::hosted::HostedCalls) -> u64 {
        self.cost(c)
            .saturating_add(self.hosted.cost(uses))
            .min(MAX_COST)
    }
}

/// The largest `g ≤ step` with `ceil(g × rate / 10^6) ≤ remaining`: what a
/// store grants an extension of `step` tokens from a budget with
/// `remaining` units left at `rate` units per million tokens, computed
/// without a product above 2^53 for `step ≤ 10^6`, `rate ≤ 10^9` and
/// `remaining < 2^53` (module docs of [`crate::money`]): what
/// `lua/extend.lua` computes in doubles; [`crate::budget::Step::grant`]
/// is the same in `u128`. Rate 0: the whole step.
pub fn grant(step: u64, rate: u64, remaining: i64) -> u64 {
    if remaining <= 0 {
        return 0;
    }
    if rate == 0 {
        return step;
    }
    let rem = remaining as u64;
    let q = rem / rate;
    if q >= step.div_ceil(PRICE_TOKENS) {
        return step;
    }
    let r = rem - q * rate;
    step.min(q * PRICE_TOKENS + r * PRICE_TOKENS / rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt4o_mini() -> Price {
        Price {
            input: 150_000,
            cached_input: 75_000,
            cache_write_5m: 150_000,
            cache_write_1h: 150_000,
            output: 600_000,
        }
    }

    #[test]
    fn costs_round_up_once() {
        let p = gpt4o_mini();
        // 1000 in × $0.15 + 100 out × $0.60 per million = 150 + 60 µ$.
        let c = TokenCounts {
            input: 1000,
            output: 100,
            ..TokenCounts::default()
        };
        assert_eq!(p.cost(&c), 210);
        // 0.15 + 0.60 = 0.75 µ$ → 1; rounding each class up would give 2.
        let c = TokenCounts {
            input: 1,
            output: 1,
            ..TokenCounts::default()
        };
        assert_eq!(p.cost(&c), 1);
        let c = TokenCounts {
            input: 1_000_000,
            cached_input: 1_000_000,
            output: 1_000_000,
            ..TokenCounts::default()
        };
        assert_eq!(p.cost(&c), 825_000);
    }

    #[test]
    fn extreme_counts_and_prices_stay_exact_and_bounded() {
        let max = Price {
            input: super::super::MAX_PRICE,
            cached_input: super::super::MAX_PRICE,
            cache_write_5m: super::super::MAX_PRICE,
            cache_write_1h: super::super::MAX_PRICE,
            output: super::super::MAX_PRICE,
        };
        let limit = crate::config::bounds::MAX_LIMIT;
        let one = TokenCounts {
            output: limit,
            ..TokenCounts::default()
        };
        assert_eq!(max.cost(&one), MAX_COST);
        let all = TokenCounts {
            input: u64::MAX,
            cached_input: u64::MAX,
            cache_write_5m: u64::MAX,
            cache_write_1h: u64::MAX,
            output: u64::MAX,
        };
        assert_eq!(max.cost(&all), MAX_COST);
        assert_eq!(Price::default().cost(&all), 0);
    }

    #[test]
    fn reservations_price_input_at_the_write_price_when_caching_is_asked() {
        let p = Price {
            input: 3_000_000,
            cached_input: 300_000,
            cache_write_5m: 3_750_000,
            cache_write_1h: 6_000_000,
            output: 15_000_000,
        };
        assert_eq!(p.reservation(1000, 100, CacheWrites::None), 4_500);
        assert_eq!(p.reservation(1000, 100, CacheWrites::FiveMinutes), 5_250);
        assert_eq!(p.reservation(1000, 100, CacheWrites::OneHour), 7_500);
    }

    #[test]
    fn tiers_apply_above_their_threshold_to_the_whole_request() {
        let base = gpt4o_mini();
        let long = Price {
            input: 300_000,
            output: 1_200_000,
            ..base
        };
        let t = PriceTable {
            base,
            tiers: vec![(200_000, long)],
            hosted: Default::default(),
        };
        assert_eq!(t.at(200_000), &base);
        assert_eq!(t.at(200_001), &long);
        let c = TokenCounts {
            input: 100_000,
            cached_input: 100_001,
            output: 1000,
            ..TokenCounts::default()
        };
        assert_eq!(
            t.cost(&c),
            (100_000 * 300_000u64 + 100_001 * 75_000 + 1000 * 1_200_000).div_ceil(1_000_000)
        );
    }

    /// The largest g by the definition, for small numbers (a budget with
    /// nothing left grants nothing, whatever the rate).
    fn grant_by_definition(step: u64, rate: u64, remaining: i64) -> u64 {
        if remaining <= 0 {
            return 0;
        }
        (0..=step)
            .rev()
            .find(|&g| ((g * rate).div_ceil(PRICE_TOKENS) as i64) <= remaining)
            .unwrap_or(0)
    }

    #[test]
    fn the_partial_grant_is_the_largest_payable() {
        for rate in [
            0,
            1,
            7,
            999_999,
            1_000_000,
            1_000_001,
            600_000,
            150_000,
            1_000_000_000,
        ] {
            for step in [1, 2, 16, 256, 1000] {
                for remaining in [-5i64, 0, 1, 2, 3, 100, 599, 600, 601, 999_999, 1_000_000] {
                    let g = grant(step, rate, remaining);
                    let case = format!("step {step} rate {rate} remaining {remaining}");
                    assert_eq!(g, grant_by_definition(step, rate, remaining), "{case}");
                    // The stores' grant (u128 in Rust, this formula in Lua).
                    assert_eq!(
                        g,
                        crate::budget::Step::grant(remaining, rate, step),
                        "{case}"
                    );
                }
            }
        }
        // The extremes: a full step at the largest rate, near the largest spend.
        let (step, rate) = (PRICE_TOKENS, super::super::MAX_PRICE);
        assert_eq!(grant(step, rate, (super::super::MAX_SPEND) as i64), step);
        // 10^9 µ$ per million tokens = 1000 µ$ per token: 1,234,567 µ$ pays 1234 tokens.
        assert_eq!(grant(step, rate, 1_234_567), 1234);
    }
}
