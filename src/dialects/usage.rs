//! The usage breakdown: what an answer used, the same for every dialect
//! and for streamed and whole answers. Input is uncached input + cached
//! input read + cache writes (each reported once, never a subset added to
//! its whole); reasoning is a subset of output. A count the upstream did
//! not report is `None` and is filled by the gateway (the input estimate,
//! its own count of the output).
//!
//! Counts come from the upstream and are not trusted beyond what they can
//! be: a field that is negative, fractional, not a number or above 2^53
//! is rejected (named in `rejected_input` / `rejected_output`), and so is
//! an input or output count above the request's [`UsageBounds`]. A
//! rejected side is settled as if the upstream had not reported it (the
//! input estimate, the gateway's own count of the output), never a panic;
//! the settlement logs and counts it per deployment.

use serde_json::Value;

/// The largest count read from an upstream: 2^53, the largest integer
/// every JSON reader holds exactly. Nothing near it is a real usage.
pub const MAX_REPORTED: u64 = 1 << 53;

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
    /// The input was reported and rejected: the usage field that was no
    /// count, or `"input"` when the whole was out of bounds. Its counts
    /// are then unset (settled at the estimate).
    pub rejected_input: Option<&'static str>,
    /// The same for the output (`"output"`: out of bounds); counted by
    /// the gateway instead.
    pub rejected_output: Option<&'static str>,
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
            rejected_input: None,
            rejected_output: None,
        }
    }

    /// The same usage with the input unset because `field` was rejected.
    pub fn reject_input(self, field: &'static str) -> Self {
        Self {
            uncached_input: None,
            cached_input: 0,
            cache_writes: 0,
            cache_writes_1h: 0,
            rejected_input: Some(self.rejected_input.unwrap_or(field)),
            ..self
        }
    }

    /// The same usage with the output unset because `field` was rejected.
    pub fn reject_output(self, field: &'static str) -> Self {
        Self {
            output: None,
            reasoning: 0,
            rejected_output: Some(self.rejected_output.unwrap_or(field)),
            ..self
        }
    }

    /// The same usage with each side unset whose field `rejected` names.
    pub fn rejecting(self, rejected: Rejected) -> Self {
        let u = match rejected.input {
            Some(f) => self.reject_input(f),
            None => self,
        };
        match rejected.output {
            Some(f) => u.reject_output(f),
            None => u,
        }
    }

    /// The same usage with a side out of `bounds` rejected (`"input"`,
    /// `"output"`): an upstream cannot have used more than the request
    /// could make it use.
    pub fn bounded(self, bounds: &UsageBounds) -> Self {
        let u = match self.input() {
            Some(i) if i > bounds.input => self.reject_input("input"),
            _ => self,
        };
        match u.output {
            Some(o) if o > bounds.output => u.reject_output("output"),
            _ => u,
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

/// The most a request can have used, per side: what the settlement takes
/// from the upstream's usage (DESIGN "The upstream's usage is bounded").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageBounds {
    /// Input tokens, all of them (cache reads and writes included).
    pub input: u64,
    /// Output tokens, all choices.
    pub output: u64,
}

impl UsageBounds {
    /// Only the bound of every count.
    pub const ANY: Self = Self {
        input: MAX_REPORTED,
        output: MAX_REPORTED,
    };

    /// The bounds of a request whose input was estimated at
    /// `input_estimate`, sent with output cap `cap` (`None`: sent without
    /// one) for `choices` choices, of a model with `max_output` and
    /// `context_window` when configured. Input: 4 times the estimate or
    /// 100,000 above it (estimates of media and tool results are rough),
    /// never past the context window. Output: the cap per choice plus the
    /// stream's tolerance; without a cap, the model's largest output, else
    /// its context window.
    pub fn new(
        input_estimate: u64,
        cap: Option<u64>,
        choices: u64,
        max_output: Option<u64>,
        context_window: Option<u64>,
    ) -> Self {
        let input = input_estimate
            .saturating_mul(4)
            .max(input_estimate.saturating_add(100_000))
            .min(context_window.unwrap_or(MAX_REPORTED));
        let output = match cap.or(max_output).or(context_window) {
            Some(per_choice) => {
                // The stream relay's tolerance past a cap: 2 %.
                let all = per_choice.saturating_mul(choices.max(1));
                all.saturating_add(all.div_ceil(50))
            }
            None => MAX_REPORTED,
        };
        Self {
            input: input.min(MAX_REPORTED),
            output: output.min(MAX_REPORTED),
        }
    }
}

/// Which usage field each side rejected while it was read (the first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rejected {
    /// An input field (input, cache reads, cache writes).
    pub input: Option<&'static str>,
    /// An output field (output, reasoning).
    pub output: Option<&'static str>,
}

/// A usage count from the upstream: `None` when absent or null; `None`,
/// with `field` kept in `rejected` (the first only), when it is no count:
/// negative, fractional, not a number, above [`MAX_REPORTED`].
pub fn read_count(
    v: Option<&Value>,
    field: &'static str,
    rejected: &mut Option<&'static str>,
) -> Option<u64> {
    let n = match v? {
        Value::Number(n) => n,
        Value::Null => return None,
        _ => {
            rejected.get_or_insert(field);
            return None;
        }
    };
    let whole = n.as_u64().or_else(|| {
        // `1e3` and `12.0` are whole numbers a JSON writer may send.
        let f = n.as_f64()?;
        (f >= 0.0 && f.fract() == 0.0 && f <= MAX_REPORTED as f64).then_some(f as u64)
    });
    match whole {
        Some(u) if u <= MAX_REPORTED => Some(u),
        _ => {
            rejected.get_or_insert(field);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_that_are_no_count_are_rejected_without_panic() {
        let c = |v: Value| {
            let mut rejected = None;
            let n = read_count(Some(&v), "prompt_tokens", &mut rejected);
            (n, rejected)
        };
        let bad = (None, Some("prompt_tokens"));
        assert_eq!(c(json!(12)), (Some(12), None));
        assert_eq!(c(json!(12.0)), (Some(12), None));
        assert_eq!(c(json!(MAX_REPORTED)), (Some(MAX_REPORTED), None));
        assert_eq!(c(json!(null)), (None, None));
        assert_eq!(c(json!(-3)), bad);
        assert_eq!(c(json!(2.5)), bad);
        assert_eq!(c(json!(-2.5)), bad);
        assert_eq!(c(json!("12")), bad);
        assert_eq!(c(json!(MAX_REPORTED + 1)), bad);
        assert_eq!(c(json!(u64::MAX)), bad);
        assert_eq!(c(json!(1e300)), bad);
        assert_eq!(read_count(None, "x", &mut None), None);
    }

    #[test]
    fn a_rejected_field_unsets_its_side_only() {
        let u = super::super::openai::usage_from_value(&json!({
            "prompt_tokens": -5, "completion_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 3}
        }));
        assert_eq!(u.input(), None);
        assert_eq!(
            (u.cached_input, u.rejected_input),
            (0, Some("prompt_tokens"))
        );
        assert_eq!((u.output, u.rejected_output), (Some(40), None));
        let u = super::super::openai::usage_from_value(&json!({
            "prompt_tokens": 100, "completion_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 1.5}
        }));
        assert_eq!((u.input(), u.rejected_input), (None, Some("cached_tokens")));
        assert_eq!(u.filled(50, || 9).total(), 90);
    }

    #[test]
    fn counts_out_of_the_requests_bounds_are_rejected() {
        let b = UsageBounds::new(1000, Some(100), 2, None, None);
        assert_eq!(
            b,
            UsageBounds {
                input: 101_000,
                output: 204
            }
        );
        let b = UsageBounds::new(40_000, None, 1, None, Some(128_000));
        assert_eq!(
            b,
            UsageBounds {
                input: 128_000,
                output: 130_560
            }
        );
        assert_eq!(
            UsageBounds::new(10, None, 1, None, None).output,
            MAX_REPORTED
        );
        let ok = UsageBreakdown::from_counts(101_000, 204).bounded(&UsageBounds::new(
            1000,
            Some(100),
            2,
            None,
            None,
        ));
        assert_eq!((ok.rejected_input, ok.rejected_output), (None, None));
        let bad = UsageBreakdown::from_counts(101_001, 205).bounded(&b_of(1000, 100, 2));
        assert_eq!((bad.input(), bad.output), (None, None));
        assert_eq!(
            (bad.rejected_input, bad.rejected_output),
            (Some("input"), Some("output"))
        );
        assert_eq!(bad.filled(1000, || 7).total(), 1007);
    }

    fn b_of(input: u64, cap: u64, choices: u64) -> UsageBounds {
        UsageBounds::new(input, Some(cap), choices, None, None)
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
