//! Validation of prices (`price`, `price_tiers` on models and upstreams)
//! and dollar budgets (`usd_per_day`, `usd_per_month`): decimal strings
//! parsed exactly into µ$ (`crate::money`), with their paths.

use std::sync::Arc;

use super::V;
use crate::config::bounds::MAX_LIMIT;
use crate::config::raw::{RawDecimal, RawPrice, RawPriceTier};
use crate::money::{format_usd, parse_usd, Price, PriceTable, UsdError, MAX_BUDGET, MAX_PRICE};

impl V {
    /// A decimal amount at `path`, in µ$ (at most `max`).
    fn decimal(&mut self, path: &str, d: &RawDecimal, max: u64) -> Option<u64> {
        let text = match d {
            RawDecimal::Text(t) => t,
            RawDecimal::Other(v) => {
                self.err(
                    path,
                    format!("write it as a decimal string, e.g. \"0.15\", not {v} (a TOML number is binary, not the decimal written)"),
                );
                return None;
            }
        };
        match parse_usd(text, max) {
            Ok(m) => return Some(m),
            Err(UsdError::Syntax) => self.err(
                path,
                format!("must be a decimal number of dollars, e.g. \"0.15\" (digits, at most 6 decimals), not {text:?}"),
            ),
            Err(UsdError::Decimals(n)) => self.err(
                path,
                format!("has {n} decimals; at most 6 (one micro-dollar) are exact"),
            ),
            Err(UsdError::Above) => self.err(path, format!("must be ≤ {}", format_usd(max as i64))),
        }
        None
    }

    /// The price of one use of a hosted tool at `path`, in µ$ (≤ $1,000).
    pub(super) fn hosted_price(&mut self, path: &str, d: &RawDecimal) -> Option<u64> {
        self.decimal(path, d, MAX_PRICE)
    }

    /// A dollar budget at `path`, in µ$: > 0 and ≤ $10,000,000.
    pub(super) fn usd_budget(&mut self, path: &str, d: Option<&RawDecimal>) -> Option<u64> {
        let m = self.decimal(path, d?, MAX_BUDGET)?;
        if m == 0 {
            self.err(path, "must be > 0");
            return None;
        }
        Some(m)
    }

    /// One price at `path`: `input` and `output` required; `cached_input`
    /// defaults to `input` (a provider that gives no discount); the cache
    /// writes to `input` (OpenAI bills writes as input), except on models
    /// served by `anthropic` deployments (`writes_required`), which bill
    /// them apart and must say how much.
    fn price(
        &mut self,
        path: &str,
        fields: [Option<&RawDecimal>; 5],
        writes_required: bool,
    ) -> Option<Price> {
        let [input, cached, w5m, w1h, output] = fields;
        // `Some(None)`: absent and optional (defaults to `input` below).
        let field = |v: &mut V, name: &str, d: Option<&RawDecimal>, required: bool| match d {
            Some(d) => v.decimal(&format!("{path}.{name}"), d, MAX_PRICE).map(Some),
            None if !required => Some(None),
            None if name.starts_with("cache_write") => {
                v.err(
                    format!("{path}.{name}"),
                    "required on models served by kind = \"anthropic\" (Anthropic bills cache writes apart from input)",
                );
                None
            }
            None => {
                v.err(
                    format!("{path}.{name}"),
                    "required (USD per million tokens, e.g. \"0.15\")",
                );
                None
            }
        };
        let input = field(self, "input", input, true);
        let cached = field(self, "cached_input", cached, false);
        let w5m = field(self, "cache_write_5m", w5m, writes_required);
        let w1h = field(self, "cache_write_1h", w1h, writes_required);
        let output = field(self, "output", output, true);
        let (Some(Some(input)), Some(cached), Some(w5m), Some(w1h), Some(Some(output))) =
            (input, cached, w5m, w1h, output)
        else {
            return None;
        };
        let or_input = |p: Option<u64>| p.unwrap_or(input);
        Some(Price {
            input,
            cached_input: or_input(cached),
            cache_write_5m: or_input(w5m),
            cache_write_1h: or_input(w1h),
            output,
        })
    }

    /// The price table of a model or upstream at `path` (`price` and
    /// `price_tiers`); `None` when it has no price.
    pub(super) fn price_table(
        &mut self,
        path: &str,
        price: Option<&RawPrice>,
        tiers: &[RawPriceTier],
        writes_required: bool,
    ) -> Option<Arc<PriceTable>> {
        let Some(p) = price else {
            if !tiers.is_empty() {
                self.err(format!("{path}.price_tiers"), "needs price");
            }
            return None;
        };
        let base = self.price(
            &format!("{path}.price"),
            [
                p.input.as_ref(),
                p.cached_input.as_ref(),
                p.cache_write_5m.as_ref(),
                p.cache_write_1h.as_ref(),
                p.output.as_ref(),
            ],
            writes_required,
        );
        let mut out = Vec::new();
        let mut last = 0;
        for (i, t) in tiers.iter().enumerate() {
            let tp = format!("{path}.price_tiers[{i}]");
            let above = match t.above_input_tokens {
                None => {
                    self.err(format!("{tp}.above_input_tokens"), "required");
                    None
                }
                Some(a) => self.positive(&format!("{tp}.above_input_tokens"), Some(a), MAX_LIMIT),
            };
            if let Some(a) = above {
                if a <= last {
                    self.err(
                        format!("{tp}.above_input_tokens"),
                        format!("must be above the previous tier's ({last})"),
                    );
                }
                last = last.max(a);
            }
            let price = self.price(
                &tp,
                [
                    t.input.as_ref(),
                    t.cached_input.as_ref(),
                    t.cache_write_5m.as_ref(),
                    t.cache_write_1h.as_ref(),
                    t.output.as_ref(),
                ],
                writes_required,
            );
            if let (Some(a), Some(p)) = (above, price) {
                out.push((a, p));
            }
        }
        Some(Arc::new(PriceTable {
            base: base?,
            tiers: out,
            hosted: Default::default(),
        }))
    }
}
