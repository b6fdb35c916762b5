//! The usage breakdown: what an answer used, the same for every dialect
//! and for streamed and whole answers. Input is uncached input + cached
//! input read + cache writes (each reported once, never a subset added to
//! its whole); reasoning is a subset of output. A count the upstream did
//! not report is `None` and is filled by the gateway (the input estimate,
//! its own count of the output).
//!
//! Counts come from the upstream: a field that is negative, fractional,
//! not a number or above the largest single cost is clamped (negative to
//! 0, a fraction up to the next integer, a non-number to "not reported",
//! a huge count to the bound), never a panic, and counted in
//! `budgetgate_usage_clamped_total{field}`.

use serde_json::Value;

use crate::config::bounds::MAX_LIMIT;

/// What an answer used, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageBreakdown {
    /// Input tokens not read from a cache; `None` when not reported.
    pub uncached_input: Option<u64>,
    /// Input tokens read from the provider's cache.
    pub cached_input: u64,
    /// Input tokens written to the provider's cache.
    pub cache_writes: u64,
    /// The part of `cache_writes` written to a 1-hour cache (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`; the rest lives 5
    /// minutes, the default TTL). Only prices read it.
    pub cache_writes_1h: u64,
    /// Output tokens (reasoning included); `None` when not reported.
    pub output: Option<u64>,
    /// Reasoning tokens, a subset of `output`.
    pub reasoning: u64,
    /// Uses of hosted tools priced per use, as the answer reports them
    /// (Responses output items such as `web_search_call`).
    pub hosted: crate::money::HostedCalls,
}

impl UsageBreakdown {
    /// OpenAI-style counts: `prompt` input (none cached), `completion` output.
    pub const fn from_counts(prompt: u64, completion: u64) -> Self {
        Self {
            uncached_input: Some(prompt),
            cached_input: 0,
            cache_writes: 0,
            cache_writes_1h: 0,
            output: Some(completion),
            reasoning: 0,
            hosted: crate::money::HostedCalls::EMPTY,
        }
    }

    /// All input tokens, when the upstream reported input.
    pub fn input(&self) -> Option<u64> {
        self.uncached_input.map(|u| {
            u.saturating_add(self.cached_input)
                .saturating_add(self.cache_writes)
        })
    }

    /// The same usage with what was not reported filled in: input from
    /// `input_estimate`, output from `counted_output`.
    pub fn filled(self, input_estimate: u64, counted_output: impl FnOnce() -> u64) -> Self {
        Self {
            uncached_input: Some(self.uncached_input.unwrap_or(input_estimate)),
            output: Some(self.output.unwrap_or_else(counted_output)),
            ..self
        }
    }

    /// Input + output tokens (missing counts as 0).
    pub fn total(&self) -> u64 {
        self.input()
            .unwrap_or(0)
            .saturating_add(self.output.unwrap_or(0))
    }
}

/// A usage count from the upstream, clamped (see the module docs).
pub fn clamp_count(v: Option<&Value>, field: &'static str) -> Option<u64> {
    let n = match v? {
        Value::Number(n) => n,
        Value::Null => return None,
        _ => {
            clamped(field);
            return None;
        }
    };
    if let Some(u) = n.as_u64() {
        if u > MAX_LIMIT {
            clamped(field);
            return Some(MAX_LIMIT);
        }
        return Some(u);
    }
    clamped(field);
    if n.as_i64().is_some() {
        return Some(0);
    }
    let f = n.as_f64().unwrap_or(0.0);
    Some(if f <= 0.0 || f.is_nan() {
        0
    } else {
        (f.ceil() as u64).min(MAX_LIMIT)
    })
}

fn clamped(field: &'static str) {
    ::metrics::counter!("budgetgate_usage_clamped_total", "field" => field).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bad_counts_are_clamped_without_panic() {
        let c = |v: Value| clamp_count(Some(&v), "prompt_tokens");
        assert_eq!(c(json!(12)), Some(12));
        assert_eq!(c(json!(-3)), Some(0));
        assert_eq!(c(json!(2.5)), Some(3));
        assert_eq!(c(json!(-2.5)), Some(0));
        assert_eq!(c(json!("12")), None);
        assert_eq!(c(json!(null)), None);
        assert_eq!(c(json!(u64::MAX)), Some(MAX_LIMIT));
        assert_eq!(c(json!(1e300)), Some(MAX_LIMIT));
        assert_eq!(clamp_count(None, "x"), None);
    }

    #[test]
    fn subsets_are_never_added_twice() {
        let u = super::super::openai::usage_from_value(&json!({
            "prompt_tokens": 100, "completion_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 60},
            "completion_tokens_details": {"reasoning_tokens": 30}
        }));
        assert_eq!(u.uncached_input, Some(40));
        assert_eq!(u.cached_input, 60);
        assert_eq!(u.input(), Some(100));
        assert_eq!(u.reasoning, 30);
        assert_eq!(u.total(), 140);
    }

    #[test]
    fn missing_input_is_filled_from_the_estimate_not_zero() {
        let u = super::super::openai::usage_from_value(&json!({"completion_tokens": 7}));
        assert_eq!(u.input(), None);
        assert_eq!(u.filled(50, || 99).total(), 57);
    }
}
