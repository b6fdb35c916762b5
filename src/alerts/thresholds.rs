//! Which soft thresholds a quota or dollar budget has crossed in its
//! current window, pure (the state and `now` come in).

use sha2::{Digest, Sha256};

use crate::budget::{BudgetSpec, BudgetState, Scope, Window};

/// One threshold crossed by one budget in one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    /// The same for every gateway and restart: receivers deduplicate by it.
    pub id: String,
    /// `tenant:acme`, `key:acme/batch`, …
    pub scope: String,
    /// The tenant the scope belongs to (`None` for upstream scopes).
    pub tenant: Option<String>,
    /// `tokens_per_day`, `usd_per_month`, …
    pub budget: &'static str,
    /// Percent of the limit.
    pub threshold_percent: u64,
    /// The window's limit, in the budget's unit (tokens, requests, µ$).
    pub limit: u64,
    /// What is used of it.
    pub used: u64,
    /// Day or month.
    pub window: Window,
    /// Start and end (exclusive) of the window, UTC µs.
    pub window_start_micros: u64,
    /// End of the window.
    pub window_end_micros: u64,
}

/// The thresholds among `thresholds_percent` that `state` of `spec` has
/// reached at `now` (UTC µs); none for budgets without a window.
pub fn crossed(
    spec: &BudgetSpec,
    state: &BudgetState,
    thresholds_percent: &[u64],
    domain: &str,
    now: u64,
) -> Vec<Firing> {
    let Some(window) = state.window else {
        return Vec::new();
    };
    if state.limit == 0 || spec.shadow {
        return Vec::new();
    }
    // A bucket in debt has used more than its limit.
    let used = if state.remaining < 0 {
        state.limit.saturating_add(state.remaining.unsigned_abs())
    } else {
        state.limit.saturating_sub(state.remaining as u64)
    };
    let (id, start, end) = match window.from_first_use() {
        // Its window is the store's (it started at the first use): the
        // state's reset is its end, its id the instant it started.
        Some(len) => {
            let end = now.saturating_add(state.reset_micros);
            let start = end.saturating_sub(len);
            (start, start, end)
        }
        None => (window.id(now), window_start(window, now), window.end(now)),
    };
    let scope = spec.scope.to_string();
    thresholds_percent
        .iter()
        // used / limit ≥ t / 100, in integers (u128: no overflow).
        .filter(|&&t| used as u128 * 100 >= t as u128 * state.limit as u128)
        .map(|&t| Firing {
            id: firing_id(domain, &scope, spec.name.as_str(), id, t),
            scope: scope.clone(),
            tenant: tenant_of(&spec.scope),
            budget: spec.name.as_str(),
            threshold_percent: t,
            limit: state.limit,
            used,
            window,
            window_start_micros: start,
            window_end_micros: end,
        })
        .collect()
}

fn tenant_of(scope: &Scope) -> Option<String> {
    match scope {
        Scope::Tenant(t)
        | Scope::Key(t, _)
        | Scope::TenantModel(t, _)
        | Scope::EndUser(t, _)
        | Scope::Run(t, _) => Some(t.to_string()),
        Scope::Upstream(_) => None,
    }
}

fn window_start(w: Window, now: u64) -> u64 {
    w.start(now)
}

/// 32 hex digits of SHA-256 over the firing's identity.
pub fn firing_id(
    domain: &str,
    scope: &str,
    budget: &str,
    window_id: u64,
    threshold: u64,
) -> String {
    let mut h = Sha256::new();
    for part in [domain, scope, budget] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.update(window_id.to_be_bytes());
    h.update(threshold.to_be_bytes());
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetName;

    fn spec(name: BudgetName) -> BudgetSpec {
        crate::admission::plan::scope_budgets(
            &crate::budget::keys::KeySpace::new("bg", "default"),
            Scope::Tenant("acme".into()),
            &crate::config::Limits {
                tokens_per_day: Some(1_000),
                rpm: Some(10),
                ..Default::default()
            },
            true,
        )
        .into_iter()
        .find(|s| s.name == name)
        .unwrap()
    }

    fn state(name: BudgetName, limit: u64, remaining: i64, window: Option<Window>) -> BudgetState {
        BudgetState {
            scope: Scope::Tenant("acme".into()),
            name,
            limit,
            remaining,
            reset_micros: 0,
            window,
        }
    }

    const NOW: u64 = 20_000 * 86_400_000_000 + 5;

    #[test]
    fn thresholds_fire_from_exactly_their_share() {
        let s = spec(BudgetName::TokensPerDay);
        let at = |remaining| {
            crossed(
                &s,
                &state(
                    BudgetName::TokensPerDay,
                    1_000,
                    remaining,
                    Some(Window::Day),
                ),
                &[50, 80, 100],
                "d",
                NOW,
            )
            .iter()
            .map(|f| f.threshold_percent)
            .collect::<Vec<_>>()
        };
        assert_eq!(at(501), Vec::<u64>::new());
        assert_eq!(at(500), [50]);
        assert_eq!(at(201), [50]);
        assert_eq!(at(200), [50, 80]);
        assert_eq!(at(0), [50, 80, 100]);
        assert_eq!(at(-40), [50, 80, 100]);
    }

    #[test]
    fn the_id_is_per_budget_window_and_threshold() {
        let s = spec(BudgetName::TokensPerDay);
        let st = state(BudgetName::TokensPerDay, 1_000, 0, Some(Window::Day));
        let today = crossed(&s, &st, &[80], "d", NOW);
        let again = crossed(&s, &st, &[80], "d", NOW + 1_000);
        let tomorrow = crossed(&s, &st, &[80], "d", NOW + 86_400_000_000);
        assert_eq!(today[0].id, again[0].id);
        assert_ne!(today[0].id, tomorrow[0].id);
        assert_ne!(today[0].id, crossed(&s, &st, &[100], "d", NOW)[0].id);
        assert_eq!(today[0].window_start_micros, 20_000 * 86_400_000_000);
        assert_eq!(today[0].used, 1_000);
    }

    #[test]
    fn rate_budgets_have_no_thresholds() {
        let s = spec(BudgetName::Rpm);
        assert!(crossed(&s, &state(BudgetName::Rpm, 10, 0, None), &[50], "d", NOW).is_empty());
    }
}
