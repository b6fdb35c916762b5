//! The last budget refusals of each tenant, for the budget page
//! (`recent_refusals` of `/admin/v1/budgets`): a person looking at a tenant
//! sees that, when and by which budget it is being refused.
//!
//! - Written only when a request is refused by a budget (429: rate,
//!   quota, concurrency, impossible): an admitted request never touches it.
//! - Bounded: at most [`PER_TENANT`] refusals per tenant (the oldest goes)
//!   and [`MAX_TENANTS`] tenants (beyond that, tenants whose refusals are
//!   all older than [`SHOWN_MICROS`] are forgotten first; a new tenant is
//!   not recorded while every kept one is recent). Per gateway process,
//!   not shared by a fleet, lost at restart: it is a view, not a record.
//! - Holds scope and budget names, never an end user's id (the scope
//!   carries its keyed hash).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::error::ApiError;

/// Refusals kept per tenant.
pub const PER_TENANT: usize = 16;
/// Tenants kept.
pub const MAX_TENANTS: usize = 4096;
/// How far back refusals are shown: the last ten minutes.
pub const SHOWN_MICROS: u64 = 10 * 60 * 1_000_000;

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    /// Gateway time, UTC µs.
    at_micros: u64,
    /// The refusing scope (`tenant:acme`, `end_user:acme/<hash>`, …).
    scope: String,
    /// The refusing budget (`tpm`, `tokens_per_day`, …).
    budget: &'static str,
    /// Why, as the request's final log line says it (`rate_limited`,
    /// `quota`, `concurrency`, `impossible`).
    reason: &'static str,
}

/// The rings of every tenant refused lately.
#[derive(Debug, Default)]
pub struct RecentRefusals {
    tenants: Mutex<HashMap<String, VecDeque<Refusal>>>,
}

impl RecentRefusals {
    /// Records `refusal` of a request of `tenant` at `now` (UTC µs), if it
    /// is a budget refusal; anything else is ignored.
    pub fn record(&self, tenant: &str, refusal: &ApiError, now: u64) {
        let (scope, budget) = match refusal {
            ApiError::RateLimited { denial, .. } => (denial.scope.to_string(), denial.name),
            ApiError::Impossible(i) => (i.scope.to_string(), i.name),
            _ => return,
        };
        let entry = Refusal {
            at_micros: now,
            scope,
            budget: budget.as_str(),
            reason: refusal.label(),
        };
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        if !tenants.contains_key(tenant) && tenants.len() >= MAX_TENANTS {
            let cutoff = now.saturating_sub(SHOWN_MICROS);
            tenants.retain(|_, ring| ring.back().is_some_and(|r| r.at_micros >= cutoff));
            if tenants.len() >= MAX_TENANTS {
                return;
            }
        }
        let ring = tenants.entry(tenant.to_string()).or_default();
        if ring.len() == PER_TENANT {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    /// The refusals of `tenant` in the last [`SHOWN_MICROS`] before `now`,
    /// newest first, as JSON: `at_micros`, `age_micros`, `scope`, `budget`,
    /// `reason`.
    pub fn json_of(&self, tenant: &str, now: u64) -> Vec<Value> {
        let tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ring) = tenants.get(tenant) else {
            return Vec::new();
        };
        let cutoff = now.saturating_sub(SHOWN_MICROS);
        ring.iter()
            .rev()
            .take_while(|r| r.at_micros >= cutoff)
            .map(|r| {
                json!({
                    "at_micros": r.at_micros,
                    "age_micros": now.saturating_sub(r.at_micros),
                    "scope": r.scope,
                    "budget": r.budget,
                    "reason": r.reason,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{BudgetName, Impossibility, Scope};

    fn impossible(tenant: &str) -> ApiError {
        ApiError::Impossible(Box::new(Impossibility {
            scope: Scope::Tenant(tenant.into()),
            name: BudgetName::Tpm,
            capacity: 10,
            requested: 20,
        }))
    }

    #[test]
    fn rings_are_bounded_recent_and_only_for_budget_refusals() {
        let r = RecentRefusals::default();
        r.record("a", &ApiError::StoreUnavailable, 1);
        assert!(r.json_of("a", 1).is_empty(), "not a budget refusal");
        for i in 0..(PER_TENANT as u64 + 5) {
            r.record("a", &impossible("a"), 1_000 + i);
        }
        let now = 1_000 + PER_TENANT as u64 + 5;
        let shown = r.json_of("a", now);
        assert_eq!(shown.len(), PER_TENANT);
        assert_eq!(shown[0]["at_micros"], now - 1, "newest first");
        assert_eq!(shown[0]["budget"], "tpm");
        assert_eq!(shown[0]["reason"], "impossible");
        assert_eq!(shown[0]["scope"], "tenant:a");
        assert!(
            r.json_of("a", now + SHOWN_MICROS + 100).is_empty(),
            "too old"
        );
        assert!(r.json_of("b", now).is_empty());
    }

    #[test]
    fn tenants_are_bounded_old_ones_forgotten_first() {
        let r = RecentRefusals::default();
        for i in 0..MAX_TENANTS {
            r.record(&format!("t{i}"), &impossible("x"), 1);
        }
        // All recent: a new tenant is not kept.
        r.record("late", &impossible("x"), 2);
        assert!(r.json_of("late", 2).is_empty());
        // Once they are old, they make room.
        let later = 10 + SHOWN_MICROS;
        r.record("late", &impossible("x"), later);
        assert_eq!(r.json_of("late", later).len(), 1);
        assert_eq!(r.tenants.lock().unwrap().len(), 1);
    }
}
