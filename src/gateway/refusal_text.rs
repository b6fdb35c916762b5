//! The words of a budget refusal (part of the error map, [`super::error`]):
//! which budget of which scope refused, its limit, what was used and what
//! the request asked for — in requests, tokens, or dollars for dollar
//! budgets (`$0.25`, their µ$ shown as decimal dollars) — and when to retry.
//! `of` follows the refusing scope: ` for tenant ml, child of acme` when
//! the request's tenant is nested (the scope may be an ancestor's), else
//! empty. A quota's refusal (`insufficient_quota`) starts "Quota
//! exceeded", a rate's "Rate limit reached": clients tell the two apart by
//! the words too.

use super::error::is_quota;
use crate::budget::{BudgetName, Denial, Impossibility, Scope};

fn scope_kind(scope: &Scope) -> &'static str {
    match scope {
        Scope::Tenant(_) => "tenant",
        Scope::Key(..) => "key",
        Scope::TenantModel(..) => "tenant×model",
        Scope::Upstream(_) => "upstream",
        Scope::EndUser(..) => "end user",
        Scope::Run(..) => "run",
    }
}

fn unit(name: BudgetName) -> &'static str {
    match name {
        BudgetName::RunsPerDay => "runs",
        name if name.counts_requests() && name != BudgetName::MaxConcurrent => "requests",
        BudgetName::MaxConcurrent => "requests in flight",
        name if name.counts_usd() => "micro-dollars",
        _ => "tokens",
    }
}

/// An amount of budget `name` as a person reads it: `$0.25` for dollar
/// budgets, `1200 tokens` / `3 requests` otherwise.
fn amount(name: BudgetName, n: i64) -> String {
    if name.counts_usd() {
        format!("${}", crate::money::format_usd(n))
    } else {
        format!("{n} {}", unit(name))
    }
}

/// A wait written for people: `1.5s`, `250ms`, `6m0s` (same as the headers).
fn human(micros: u64) -> String {
    crate::dialects::rate_limit_headers::go_duration(micros)
}

/// The message of a refusal by `d` that may succeed in `wait` µs.
pub fn rate_limited(d: &Denial, wait: u64, of: &str) -> String {
    if d.name == BudgetName::MaxConcurrent {
        return format!(
            "Concurrency limit reached for {} {} ({}){of}: limit {} requests in flight. Please retry in {}.",
            scope_kind(&d.scope),
            d.scope,
            d.name,
            d.limit,
            human(wait)
        );
    }
    if d.name.counts_usd() {
        // The spend may pass the limit (the debt of settled requests).
        return format!(
            "Quota exceeded for {} budget {} ({}){of}: dollar budget exhausted, limit {}, spent {}, this request needs {}. {} in {}.",
            scope_kind(&d.scope),
            d.scope,
            d.name,
            amount(d.name, d.limit as i64),
            amount(d.name, d.limit as i64 - d.available),
            amount(d.name, d.requested as i64),
            if rolls(d) {
                "Enough slides out of the rolling window"
            } else {
                "The budget resets"
            },
            human(wait)
        );
    }
    format!(
        "{} for {} budget {} ({}){of}: limit {}, used {}, requested {} {}. {}",
        if is_quota(d.name) {
            "Quota exceeded"
        } else {
            "Rate limit reached"
        },
        scope_kind(&d.scope),
        d.scope,
        d.name,
        d.limit,
        (d.limit as i64 - d.available).max(0),
        d.requested,
        unit(d.name),
        if rolls(d) {
            format!(
                "Enough slides out of the rolling window in {}.",
                human(wait)
            )
        } else if is_quota(d.name) {
            format!("The quota resets in {}.", human(wait))
        } else {
            format!("Please try again in {}.", human(wait))
        }
    )
}

/// The message of a request larger than a budget's capacity.
pub fn impossible(i: &Impossibility, of: &str) -> String {
    format!(
        "{} for {} budget {} ({}){of}: capacity {}, requested {}. This request can never be admitted; reduce the prompt or max_tokens.",
        if is_quota(i.name) {
            "Quota exceeded: request too large"
        } else {
            "Request too large"
        },
        scope_kind(&i.scope),
        i.scope,
        i.name,
        amount(i.name, i.capacity as i64),
        amount(i.name, i.requested as i64)
    )
}

/// True when the refusing budget is a rolling window (a window from first
/// use resets at its end, as a calendar one does).
fn rolls(d: &Denial) -> bool {
    d.state.window.is_some_and(|w| w.is_rolling())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetState;

    fn denial(name: BudgetName) -> Denial {
        let scope = Scope::Tenant("acme".into());
        Denial {
            scope: scope.clone(),
            name,
            limit: 1000,
            requested: 50,
            available: 10,
            retry_after_micros: 2_000_000,
            now_micros: 0,
            state: BudgetState {
                scope,
                name,
                limit: 1000,
                remaining: 10,
                reset_micros: 2_000_000,
                window: None,
            },
            held_for_share: false,
        }
    }

    /// Fault guarded against: an `insufficient_quota` refusal read "Rate
    /// limit reached", so a client matching the words retried a quota that
    /// resets hours later.
    #[test]
    fn quota_refusals_start_quota_exceeded_and_rate_refusals_rate_limit_reached() {
        for name in [
            BudgetName::TokensPerDay,
            BudgetName::TokensPerMonth,
            BudgetName::RequestsPerDay,
            BudgetName::UsdPerDay,
            BudgetName::UsdPerMonth,
        ] {
            let m = rate_limited(&denial(name), 2_000_000, "");
            assert!(
                m.starts_with("Quota exceeded for tenant budget tenant:acme"),
                "{m}"
            );
            let i = Impossibility {
                scope: Scope::Tenant("acme".into()),
                name,
                capacity: 1000,
                requested: 5000,
            };
            let m = impossible(&i, "");
            assert!(m.starts_with("Quota exceeded"), "{m}");
        }
        for name in [BudgetName::Rpm, BudgetName::Tpm, BudgetName::OutputTpm] {
            let m = rate_limited(&denial(name), 2_000_000, "");
            assert!(m.starts_with("Rate limit reached"), "{m}");
        }
    }
}
