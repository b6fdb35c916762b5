//! Anthropic's rate-limit headers (Anthropic API reference, "Rate limits",
//! response headers): `anthropic-ratelimit-requests-{limit,remaining,reset}`
//! (`rpm`), `anthropic-ratelimit-tokens-*` (`tpm`) and, where the request
//! touches them, `anthropic-ratelimit-input-tokens-*` (`input_tpm`) and
//! `anthropic-ratelimit-output-tokens-*` (`output_tpm`), resets as RFC 3339 timestamps,
//! describing the gateway's own tightest budgets (tenant side first, as
//! for the OpenAI family), plus the IETF `RateLimit-Policy` / `RateLimit`
//! fields. The upstream's own `anthropic-ratelimit-*` headers are never
//! relayed: they describe the gateway's key, not the client's budgets.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::budget::{BudgetName, BudgetState};
use crate::dialects::rate_limit_headers::{ietf_headers, tightest_for_client};

const REQUESTS: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-ratelimit-requests-limit"),
    HeaderName::from_static("anthropic-ratelimit-requests-remaining"),
    HeaderName::from_static("anthropic-ratelimit-requests-reset"),
];
const TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-ratelimit-tokens-limit"),
    HeaderName::from_static("anthropic-ratelimit-tokens-remaining"),
    HeaderName::from_static("anthropic-ratelimit-tokens-reset"),
];
const INPUT_TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-ratelimit-input-tokens-limit"),
    HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining"),
    HeaderName::from_static("anthropic-ratelimit-input-tokens-reset"),
];
const OUTPUT_TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-ratelimit-output-tokens-limit"),
    HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining"),
    HeaderName::from_static("anthropic-ratelimit-output-tokens-reset"),
];

/// Headers describing `states` (values right after this request's debit)
/// at `now_micros` (Unix time).
pub fn rate_limit_headers(states: &[BudgetState], now_micros: u64) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(16);
    for (name, [l, r, t]) in [
        (BudgetName::Rpm, REQUESTS),
        (BudgetName::Tpm, TOKENS),
        (BudgetName::InputTpm, INPUT_TOKENS),
        (BudgetName::OutputTpm, OUTPUT_TOKENS),
    ] {
        if let Some(s) = tightest_for_client(states, name) {
            h.insert(l, HeaderValue::from(s.limit));
            h.insert(r, HeaderValue::from(s.remaining.clamp(0, s.limit as i64)));
            let at = now_micros
                .saturating_add(s.reset_micros)
                .div_ceil(1_000_000);
            if let Ok(v) = HeaderValue::try_from(rfc3339(at)) {
                h.insert(t, v);
            }
        }
    }
    ietf_headers(states, &mut h);
    h
}

/// `secs` since the Unix epoch as an RFC 3339 UTC timestamp
/// (`2026-12-01T09:30:00Z`), by the civil-from-days conversion of the
/// proleptic Gregorian calendar.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Scope;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_117_400), "2026-12-01T09:30:00Z");
    }

    #[test]
    fn tenant_budgets_in_anthropic_names() {
        let st = |name, limit, remaining| BudgetState {
            scope: Scope::Tenant("a".into()),
            name,
            limit,
            remaining,
            reset_micros: 2_000_000,
            window: None,
        };
        let h = rate_limit_headers(
            &[st(BudgetName::Tpm, 1000, 400), st(BudgetName::Rpm, 10, -1)],
            1_796_117_400_000_000,
        );
        assert_eq!(h["anthropic-ratelimit-tokens-limit"], "1000");
        assert_eq!(h["anthropic-ratelimit-tokens-remaining"], "400");
        assert_eq!(h["anthropic-ratelimit-requests-remaining"], "0");
        assert_eq!(
            h["anthropic-ratelimit-tokens-reset"],
            "2026-12-01T09:30:02Z"
        );
        assert!(h.contains_key("ratelimit-policy"));
        assert!(!h.contains_key("x-ratelimit-limit-tokens"));
        assert!(!h.contains_key("anthropic-ratelimit-input-tokens-limit"));
        assert!(!h.contains_key("anthropic-ratelimit-output-tokens-limit"));
    }

    #[test]
    fn input_and_output_limits_have_their_own_headers() {
        let st = |scope: Scope, name, limit, remaining| BudgetState {
            scope,
            name,
            limit,
            remaining,
            reset_micros: 1_000_000,
            window: None,
        };
        let h = rate_limit_headers(
            &[
                st(Scope::Tenant("a".into()), BudgetName::InputTpm, 5000, 4000),
                st(Scope::Upstream("u".into()), BudgetName::InputTpm, 100, 1),
                st(Scope::Upstream("u".into()), BudgetName::OutputTpm, 800, 200),
            ],
            1_796_117_400_000_000,
        );
        // Tenant side first, as for the other families.
        assert_eq!(h["anthropic-ratelimit-input-tokens-limit"], "5000");
        assert_eq!(h["anthropic-ratelimit-input-tokens-remaining"], "4000");
        assert_eq!(
            h["anthropic-ratelimit-input-tokens-reset"],
            "2026-12-01T09:30:01Z"
        );
        assert_eq!(h["anthropic-ratelimit-output-tokens-limit"], "800");
        assert_eq!(h["anthropic-ratelimit-output-tokens-remaining"], "200");
        assert!(!h.contains_key("anthropic-ratelimit-tokens-limit"));
        assert!(h["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("\"tenant-input-tpm\";q=5000;w=60"));
    }
}
