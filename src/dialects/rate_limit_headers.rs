//! Rate-limit headers clients see (DESIGN section 6): OpenAI's
//! `x-ratelimit-*` names (OpenAI API reference, "Rate limits" guide) for the
//! per-minute buckets, and the IETF `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers revision 11, structured-field
//! syntax) for every bucket and quota. A policy's `q` and `r` count
//! requests unless it says otherwise; token and dollar budgets say so in a
//! vendor parameter, `budgetgate-unit=tokens` or `budgetgate-unit=usd-micros`
//! (the draft's quota-unit registry has neither).

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::budget::{BudgetName, BudgetState, Scope};

/// Formats a duration the way Go's `time.Duration.String` does and OpenAI
/// writes `x-ratelimit-reset-*`: `0s`, `17ms`, `1.5s`, `6m0s`, `1h2m3s`.
/// Millisecond precision above one millisecond; below it `1ms` (rounded
/// up): Go's `µs` is not ASCII, which a header value should be, and a
/// non-zero wait must never read `0s`.
pub fn go_duration(micros: u64) -> String {
    // Written with itoa into one string sized once: this runs twice on
    // every response, and `format!` cost ~500 instructions a call.
    let mut out = String::with_capacity(16);
    let mut n = itoa::Buffer::new();
    if micros == 0 {
        out.push_str("0s");
    } else if micros < 1_000 {
        out.push_str("1ms");
    } else if micros < 1_000_000 {
        out.push_str(n.format(micros / 1000));
        fraction(&mut out, micros % 1000);
        out.push_str("ms");
    } else {
        let ms_total = micros.div_ceil(1000);
        let h = ms_total / 3_600_000;
        let m = (ms_total / 60_000) % 60;
        if h > 0 {
            out.push_str(n.format(h));
            out.push('h');
        }
        if h > 0 || m > 0 {
            out.push_str(n.format(m));
            out.push('m');
        }
        out.push_str(n.format((ms_total / 1000) % 60));
        fraction(&mut out, ms_total % 1000);
        out.push('s');
    }
    out
}

/// `.` and the thousandths `frac` (< 1000) without trailing zeros; nothing for 0.
fn fraction(out: &mut String, frac: u64) {
    if frac == 0 {
        return;
    }
    let digits = [frac / 100, (frac / 10) % 10, frac % 10];
    let len = if digits[2] != 0 {
        3
    } else if digits[1] != 0 {
        2
    } else {
        1
    };
    out.push('.');
    for d in &digits[..len] {
        out.push(char::from(b'0' + *d as u8));
    }
}

// Bits of `ietf_headers`' member set: 20 budget names per scope kind, 6 kinds.
const _: () = assert!((BudgetName::RunsPerDay as u32) < NAMES_PER_SCOPE);
const _: () = assert!(6 * NAMES_PER_SCOPE <= 128);
const NAMES_PER_SCOPE: u32 = 20;

/// The scope kind's place among [`scope_label`]'s (0..5).
fn scope_index(scope: &Scope) -> u32 {
    match scope {
        Scope::Tenant(_) => 0,
        Scope::Key(..) => 1,
        Scope::TenantModel(..) => 2,
        Scope::Upstream(_) => 3,
        Scope::EndUser(..) => 4,
        Scope::Run(..) => 5,
    }
}

fn scope_label(scope: &Scope) -> &'static str {
    match scope {
        Scope::Tenant(_) => "tenant",
        Scope::Key(..) => "key",
        Scope::TenantModel(..) => "model",
        Scope::Upstream(_) => "upstream",
        Scope::EndUser(..) => "end_user",
        Scope::Run(..) => "run",
    }
}

/// The state with the lowest remaining/limit among `states` of `name`
/// (compared exactly by cross-multiplication).
fn tightest<'a>(
    states: impl Iterator<Item = &'a BudgetState>,
    name: BudgetName,
) -> Option<&'a BudgetState> {
    states
        .filter(|s| s.name == name && s.limit > 0)
        .min_by(|a, b| {
            let l = a.remaining as i128 * b.limit as i128;
            let r = b.remaining as i128 * a.limit as i128;
            l.cmp(&r)
        })
}

/// A budget's name in a `RateLimit` policy key (hyphens, as in `tenant-tpm`).
fn key_name(name: BudgetName) -> &'static str {
    match name {
        BudgetName::Rpm => "rpm",
        BudgetName::Tpm => "tpm",
        BudgetName::InputTpm => "input-tpm",
        BudgetName::OutputTpm => "output-tpm",
        BudgetName::MaxConcurrent => "max-concurrent",
        BudgetName::TokensPerDay => "tokens-per-day",
        BudgetName::TokensPerMonth => "tokens-per-month",
        BudgetName::RequestsPerDay => "requests-per-day",
        BudgetName::UsdPerDay => "usd-per-day",
        BudgetName::UsdPerMonth => "usd-per-month",
        BudgetName::TokensPer5h => "tokens-per-5h",
        BudgetName::TokensPer24h => "tokens-per-24h",
        BudgetName::TokensPerWeek => "tokens-per-week",
        BudgetName::UsdPer5h => "usd-per-5h",
        BudgetName::UsdPer24h => "usd-per-24h",
        BudgetName::UsdPerWeek => "usd-per-week",
        BudgetName::RequestsPer5h => "requests-per-5h",
        BudgetName::RequestsPer24h => "requests-per-24h",
        BudgetName::RequestsPerWeek => "requests-per-week",
        BudgetName::RunsPerDay => "runs-per-day",
    }
}

/// The unit of a policy's `q` and `r` when it is not requests: a vendor
/// parameter, since the draft's quota-unit registry has no token or dollar
/// unit and a policy without `qu` counts requests.
fn vendor_unit(name: BudgetName) -> Option<&'static str> {
    if name.counts_tokens() {
        Some(";budgetgate-unit=tokens")
    } else if name.counts_usd() {
        Some(";budgetgate-unit=usd-micros")
    } else {
        None
    }
}

// Names built at compile time: `HeaderName::from_static` at run time
// searches the table of standard names first (~2k instructions per
// response for the eight names here, callgrind).
const LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
const REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");
const RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Appends the IETF key and parameter of one budget to a `RateLimit-Policy`
/// / `RateLimit` member: `"scope-name";q=limit;w=window` or
/// `"scope-name";r=remaining;t=reset-seconds`.
fn member(out: &mut String, scope: &str, name: &str, params: [(&str, u64); 2]) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    out.push('"');
    out.push_str(scope);
    out.push('-');
    out.push_str(name);
    out.push('"');
    let mut n = itoa::Buffer::new();
    for (k, v) in params {
        out.push(';');
        out.push_str(k);
        out.push('=');
        out.push_str(n.format(v));
    }
}

/// Headers describing the budgets one decision touched. `states` are the
/// values right after this request's debit (before its settle). Tenant-side
/// scopes are preferred when reporting; upstream budgets are reported only
/// when no tenant-side budget of that kind exists. (On every response:
/// numbers rendered with `itoa` and strings moved into their header values,
/// not formatted and copied: ~14k instructions per response before, callgrind.)
pub fn rate_limit_headers(states: &[BudgetState]) -> HeaderMap {
    // Sized for these headers and the few the handlers add: growing a
    // header map reallocates its tables, measured as the largest source of
    // allocator slow paths on the request path.
    let mut h = HeaderMap::with_capacity(16);
    for (name, [l, r, t]) in [
        (
            BudgetName::Rpm,
            [LIMIT_REQUESTS, REMAINING_REQUESTS, RESET_REQUESTS],
        ),
        (
            BudgetName::Tpm,
            [LIMIT_TOKENS, REMAINING_TOKENS, RESET_TOKENS],
        ),
    ] {
        if let Some(s) = tightest_for_client(states, name) {
            let remaining = s.remaining.clamp(0, s.limit as i64);
            h.insert(l, HeaderValue::from(s.limit));
            h.insert(r, HeaderValue::from(remaining));
            if let Ok(v) = HeaderValue::try_from(go_duration(s.reset_micros)) {
                h.insert(t, v);
            }
        }
    }
    ietf_headers(states, &mut h);
    h
}

/// The budget of kind `name` a client's headers report: the tightest
/// tenant-side one, else the tightest upstream one.
pub fn tightest_for_client(states: &[BudgetState], name: BudgetName) -> Option<&BudgetState> {
    tightest(states.iter().filter(|s| !s.scope.is_upstream()), name)
        .or_else(|| tightest(states.iter(), name))
}

/// Adds the IETF `RateLimit-Policy` / `RateLimit` fields of every
/// tenant-side budget in `states` (every dialect sends them). One member
/// per scope kind and budget: a nested tenant's levels (and an end user's)
/// share a name, and the first of them is kept — the request's own level
/// after an admission (states in plan order), the refusing budget after a
/// refusal (it comes first).
pub fn ietf_headers(states: &[BudgetState], h: &mut HeaderMap) {
    // Sized for the usual few members: a tenant's rpm, tpm and daily
    // tokens already pass 128 bytes of policies, and growing the string
    // on every response cost about 500 instructions.
    let mut policies = String::with_capacity(256);
    let mut values = String::with_capacity(256);
    // Which (scope kind, budget) members are written: one bit each.
    let mut named: u128 = 0;
    for s in states.iter().filter(|s| !s.scope.is_upstream()) {
        let w = match (s.name, s.window) {
            (name, _) if name == BudgetName::Rpm || name.is_token_rate() => 60,
            (_, Some(w)) => w.seconds(),
            _ => continue,
        };
        let (scope, name) = (scope_label(&s.scope), key_name(s.name));
        let bit = 1u128 << (scope_index(&s.scope) * NAMES_PER_SCOPE + s.name as u32);
        if named & bit != 0 {
            continue;
        }
        named |= bit;
        member(&mut policies, scope, name, [("q", s.limit), ("w", w)]);
        policies.push_str(vendor_unit(s.name).unwrap_or(""));
        let remaining = s.remaining.clamp(0, s.limit as i64) as u64;
        let reset = s.reset_micros.div_ceil(1_000_000);
        member(&mut values, scope, name, [("r", remaining), ("t", reset)]);
    }
    if !policies.is_empty() {
        if let (Ok(p), Ok(v)) = (
            HeaderValue::try_from(policies),
            HeaderValue::try_from(values),
        ) {
            h.insert(RATELIMIT_POLICY, p);
            h.insert(RATELIMIT, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_match_openai_examples() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(250_000), "250ms");
        assert_eq!(go_duration(1_000_000), "1s");
        assert_eq!(go_duration(1_500_000), "1.5s");
        assert_eq!(go_duration(360_000_000), "6m0s");
        assert_eq!(go_duration(8_640_000), "8.64s");
        assert_eq!(go_duration(3_723_000_000), "1h2m3s");
        // Below a millisecond: `1ms`, ASCII, never `0s` for a non-zero wait
        // (Go's `µs` is not ASCII, so not a header value).
        for us in [1, 17, 999] {
            assert_eq!(go_duration(us), "1ms");
        }
        assert_eq!(go_duration(1_250), "1.25ms");
        assert_eq!(go_duration(1_001), "1.001ms");
        assert_eq!(go_duration(60_000_000), "1m0s");
        assert_eq!(go_duration(3_600_000_000), "1h0m0s");
        assert_eq!(go_duration(3_600_500_000), "1h0m0.5s");
        assert_eq!(go_duration(999_999), "999.999ms");
        assert_eq!(go_duration(1_000_001), "1.001s");
    }

    fn st(scope: Scope, name: BudgetName, limit: u64, remaining: i64) -> BudgetState {
        BudgetState {
            scope,
            name,
            limit,
            remaining,
            reset_micros: 1_000_000,
            window: None,
        }
    }

    #[test]
    fn picks_lowest_ratio_and_clamps() {
        let states = vec![
            st(Scope::Tenant("a".into()), BudgetName::Tpm, 1000, 500),
            st(Scope::Key("a".into(), "k".into()), BudgetName::Tpm, 100, 40),
            st(Scope::Tenant("a".into()), BudgetName::Rpm, 10, -3),
        ];
        let h = rate_limit_headers(&states);
        assert_eq!(h["x-ratelimit-limit-tokens"], "100");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "40");
        assert_eq!(h["x-ratelimit-remaining-requests"], "0");
        assert_eq!(h["x-ratelimit-reset-tokens"], "1s");
        assert!(h["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("\"tenant-tpm\";q=1000;w=60;budgetgate-unit=tokens"));
    }

    /// Fault: a nested tenant's levels each wrote a `"tenant-tpm"` member,
    /// so a reader of the list took whichever came last (the organisation's).
    #[test]
    fn one_ietf_member_per_scope_kind_and_budget_the_first_kept() {
        let states = vec![
            st(Scope::Tenant("ml".into()), BudgetName::Tpm, 1000, 500),
            st(Scope::Tenant("acme".into()), BudgetName::Tpm, 9000, 100),
            st(Scope::Tenant("acme".into()), BudgetName::Rpm, 10, 3),
        ];
        let mut h = HeaderMap::new();
        ietf_headers(&states, &mut h);
        let p = h["ratelimit-policy"].to_str().unwrap();
        assert_eq!(p.matches("\"tenant-tpm\"").count(), 1, "{p}");
        assert!(p.contains("\"tenant-tpm\";q=1000;"), "{p}");
        assert!(p.contains("\"tenant-rpm\";q=10;"), "{p}");
        assert_eq!(
            h["ratelimit"]
                .to_str()
                .unwrap()
                .matches("tenant-tpm")
                .count(),
            1
        );
    }
}
