//! Each tenant's recent refusals, one record per refusal: the budget page's
//! `recent_refusals` (`/admin/v1/budgets`: that, when and by which budget a
//! tenant is being refused) and the answer of "why was this refused?"
//! (`GET /admin/v1/refusals/{request_id}`, `budgetgate explain`). One list,
//! one home: the page shows the newest [`PAGE_SHOWN`] of it.
//!
//! - Written only when a request is refused (429: rate, quota,
//!   concurrency, impossible, queue full; 503 of a tenant failing closed):
//!   an admitted request never touches it. The record holds what the
//!   decision already had — the refusing budget's state as the store, a
//!   quota lease or the deny cache answered it, which layer decided, the
//!   request's estimate and its parts, the retry time, the refusal a deny
//!   cache reused — plus the holds in flight and the units out on leases
//!   of the refusing budget ([`Refusal::in_flight`]), read only when the
//!   explain route asks for the record, one read at a time per gateway
//!   ([`RecentRefusals::reading`]): a refusal itself makes no store call
//!   beyond its decision, so refusals never load the store they wait for.
//! - Keyed by tenant and request id: a request id seen twice (a client
//!   that reuses its ids, a retried request) lists every record of it.
//! - Bounded: at most [`PER_TENANT`] records per tenant (the oldest goes),
//!   [`MAX_RECORDS`] over all tenants (the longest list gives its oldest)
//!   and [`MAX_TENANTS`] tenants (beyond that, tenants whose refusals are
//!   all older than [`KEPT_MICROS`] are forgotten first; a new tenant is
//!   not recorded while every kept one is recent); records older than
//!   [`KEPT_MICROS`] are not answered. Per gateway process, not shared by
//!   a fleet, lost at restart: a view, not a record of account (that is
//!   the ledger).
//! - Holds scope and budget names, never an end user's id (the scope
//!   carries its keyed hash).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::budget::{BudgetName, BudgetSpec, BudgetState, HeldOn, Scope};

/// Refusals kept per tenant.
pub const PER_TENANT: usize = 1_000;
/// Refusals kept over all tenants.
pub const MAX_RECORDS: usize = 65_536;
/// Tenants kept.
pub const MAX_TENANTS: usize = 4096;
/// How long refusals are kept and answered: ten minutes.
pub const KEPT_MICROS: u64 = 10 * 60 * 1_000_000;
/// The budget page's window (the same ten minutes).
pub const SHOWN_MICROS: u64 = KEPT_MICROS;
/// Refusals of a tenant the budget page lists.
pub const PAGE_SHOWN: usize = 16;

/// The request's estimate at its refusal, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EstimateParts {
    /// Input tokens (framing and margins included).
    pub input_tokens: u64,
    /// The output reserved, all choices (the output cap).
    pub output_cap_tokens: u64,
    /// Uses of priced hosted tools reserved for.
    pub tool_uses: u64,
    /// Tokens reserved in all.
    pub total_tokens: u64,
}

/// The store refusal a deny-cache refusal reused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reused {
    /// The refused reservation the cache entry was recorded from.
    pub reservation_id: String,
    /// How old that refusal was at this one, µs.
    pub age_micros: u64,
}

/// Units out on quota leases of the refusing budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeasesOut {
    /// Live leases, fleet-wide.
    pub leases: u64,
    /// Units out on them (granted − given back − reported spent).
    pub units: u64,
    /// Units this gateway holds on its lease, when it has one.
    pub here: Option<i64>,
}

/// What held the refusing budget, read when the record was first asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InFlight {
    /// How long after the decision it was read, µs.
    pub read_after_micros: u64,
    /// Holds in flight on the budget (absent when the store could not say).
    pub holds: Option<HeldOn>,
    /// Units out on leases (absent with leases off or unread).
    pub leases: Option<LeasesOut>,
    /// Why a part is absent.
    pub note: Option<String>,
}

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Gateway time, UTC µs.
    pub at_micros: u64,
    /// The request id the client saw.
    pub request_id: String,
    /// The reservation that was refused (what the ledger and the deny cache
    /// name), when one was asked for.
    pub reservation_id: Option<String>,
    /// The refusing scope (`tenant:acme`, `end_user:acme/<hash>`, …);
    /// none when no budget refused (fail closed, queue full).
    pub scope: Option<Scope>,
    /// The refusing budget (`tpm`, `tokens_per_day`, …).
    pub budget: Option<BudgetName>,
    /// Why, as the request's final log line says it (`rate_limited`,
    /// `quota`, `concurrency`, `impossible`, `queue_full`,
    /// `store_unavailable`).
    pub reason: &'static str,
    /// Which layer decided: `store`, `lease`, `deny_cache`,
    /// `local_limiter`, `queue`, `fail_closed`.
    pub decided_by: &'static str,
    /// The budget's limit (per minute, per window, or slots; capacity of
    /// an impossible request's budget).
    pub limit: u64,
    /// What the request asked of it, in its unit.
    pub requested: u64,
    /// What it had, in its unit (negative in debt), when known.
    pub available: Option<i64>,
    /// When the request would fit, µs (0 for concurrency and impossible).
    pub retry_after_micros: u64,
    /// The budget's state as the deciding layer answered it.
    pub state: Option<BudgetState>,
    /// The request's estimate.
    pub estimate: Option<EstimateParts>,
    /// A deny-cache refusal: the store refusal it reused.
    pub reused: Option<Reused>,
    /// The refusing budget as the reservation named it: what
    /// [`Refusal::in_flight`] is read of.
    pub spec: Option<BudgetSpec>,
    /// Holds and leases, read when the record is first asked for.
    pub in_flight: Option<InFlight>,
    /// The run the request named (`x-budgetgate-run`), if any.
    pub run: Option<std::sync::Arc<str>>,
}

impl Refusal {
    /// The record of `refusal` of request `request_id` at `now`, decided by
    /// `decided_by`; `None` for anything but a refusal.
    pub fn of(
        refusal: &ApiError,
        request_id: &str,
        decided_by: &'static str,
        now: u64,
    ) -> Option<Self> {
        let mut r = Refusal {
            at_micros: now,
            request_id: request_id.to_string(),
            reservation_id: None,
            scope: None,
            budget: None,
            reason: refusal.label(),
            decided_by,
            limit: 0,
            requested: 0,
            available: None,
            retry_after_micros: 0,
            state: None,
            estimate: None,
            reused: None,
            spec: None,
            in_flight: None,
            run: None,
        };
        match refusal {
            ApiError::RateLimited { denial, .. } => {
                r.scope = Some(denial.scope.clone());
                r.budget = Some(denial.name);
                r.limit = denial.limit;
                r.requested = denial.requested;
                r.available = Some(denial.available);
                r.retry_after_micros = denial.retry_after_micros;
                r.state = Some(denial.state.clone());
            }
            ApiError::Impossible(i) => {
                r.scope = Some(i.scope.clone());
                r.budget = Some(i.name);
                r.limit = i.capacity;
                r.requested = i.requested;
            }
            ApiError::QueueFull { retry_after_micros } => {
                r.decided_by = "queue";
                r.retry_after_micros = *retry_after_micros;
            }
            ApiError::StoreUnavailable => r.decided_by = "fail_closed",
            ApiError::RunConflict { run } => r.scope = Some(run.clone()),
            _ => return None,
        }
        Some(r)
    }

    /// True for a refusal by a budget (what the budget page lists).
    fn by_budget(&self) -> bool {
        self.budget.is_some()
    }

    /// The record as the explain route answers it, at `now`.
    pub fn json(&self, now: u64) -> Value {
        json!({
            "at_micros": self.at_micros,
            "age_micros": now.saturating_sub(self.at_micros),
            "request_id": self.request_id,
            "reservation_id": self.reservation_id,
            "run": self.run,
            "scope": self.scope.as_ref().map(|s| s.to_string()),
            "budget": self.budget,
            "reason": self.reason,
            "decided_by": self.decided_by,
            "limit": self.limit,
            "requested": self.requested,
            "available": self.available,
            "retry_after_micros": self.retry_after_micros,
            "state": self.state.as_ref().map(|s| json!({
                "limit": s.limit,
                "remaining": s.remaining,
                "reset_micros": s.reset_micros,
                "window": s.window,
            })),
            "estimate": self.estimate,
            "reused": self.reused,
            "in_flight": self.in_flight.as_ref().map(|f| {
                let mut v = json!(f);
                v["read_after_ms"] = json!(f.read_after_micros / 1000);
                v["said"] = json!(format!("read {} ms after the decision, when first asked", f.read_after_micros / 1000));
                v
            }),
        })
    }
}

#[derive(Debug, Default)]
struct Tenant {
    ring: VecDeque<Refusal>,
}

#[derive(Debug, Default)]
struct Inner {
    tenants: HashMap<String, Tenant>,
    records: usize,
}

/// The records of every tenant refused lately.
#[derive(Debug, Default)]
pub struct RecentRefusals {
    inner: Mutex<Inner>,
    /// Held while holds and leases are read for a record: one read at a
    /// time per gateway, however many ask.
    reads: tokio::sync::Mutex<()>,
}

impl RecentRefusals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A view: a panic mid-update cannot make it wrong, only short.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `refusal` of a request of `tenant` at `now` (UTC µs) with no
    /// more than the refusal itself says; anything but a refusal is ignored.
    pub fn record(&self, tenant: &str, refusal: &ApiError, now: u64) {
        if let Some(r) = Refusal::of(refusal, "", "store", now) {
            self.keep(tenant, r);
        }
    }

    /// Keeps `r`, a refusal of a request of `tenant`.
    pub fn keep(&self, tenant: &str, r: Refusal) {
        let now = r.at_micros;
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.tenants.contains_key(tenant) && inner.tenants.len() >= MAX_TENANTS {
            let cutoff = now.saturating_sub(KEPT_MICROS);
            inner
                .tenants
                .retain(|_, t| t.ring.back().is_some_and(|r| r.at_micros >= cutoff));
            inner.records = inner.tenants.values().map(|t| t.ring.len()).sum();
            if inner.tenants.len() >= MAX_TENANTS {
                return;
            }
        }
        if inner.records >= MAX_RECORDS {
            // Rare (a fleet of refused tenants): the longest list gives way.
            let longest = inner
                .tenants
                .iter_mut()
                .max_by_key(|(_, t)| t.ring.len())
                .map(|(_, t)| t);
            if let Some(t) = longest {
                if t.ring.pop_front().is_some() {
                    inner.records -= 1;
                }
            }
        }
        let t = inner.tenants.entry(tenant.to_string()).or_default();
        let mut added = 1;
        if t.ring.len() >= PER_TENANT {
            t.ring.pop_front();
            added = 0;
        }
        t.ring.push_back(r);
        inner.records += added;
    }

    /// The turn to read holds and leases for a record: one read at a time
    /// per gateway (a reader that finds the record filled meanwhile uses
    /// that read, see [`Self::in_flight_of`]).
    pub async fn reading(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reads.lock().await
    }

    /// What held the budget of `tenant`'s refusal of `request_id` at
    /// `at_micros`, when it has been read.
    pub fn in_flight_of(&self, tenant: &str, request_id: &str, at_micros: u64) -> Option<InFlight> {
        let inner = self.lock();
        inner.tenants.get(tenant).and_then(|t| {
            t.ring
                .iter()
                .rev()
                .find(|r| r.at_micros == at_micros && r.request_id == request_id)
                .and_then(|r| r.in_flight.clone())
        })
    }

    /// Fills in what held the budget of `tenant`'s refusal of `request_id`
    /// at `at_micros`.
    pub fn fill_in_flight(&self, tenant: &str, request_id: &str, at_micros: u64, f: InFlight) {
        let mut inner = self.lock();
        let Some(t) = inner.tenants.get_mut(tenant) else {
            return;
        };
        if let Some(r) = t
            .ring
            .iter_mut()
            .rev()
            .find(|r| r.at_micros == at_micros && r.request_id == request_id)
        {
            r.in_flight = Some(f);
        }
    }

    /// Every kept record of `request_id` of the last [`KEPT_MICROS`] before
    /// `now`, as `(tenant, record)`, oldest first, among the tenants `sees`
    /// admits (the others' are not told apart from none).
    pub fn find(
        &self,
        request_id: &str,
        now: u64,
        sees: impl Fn(&str) -> bool,
    ) -> Vec<(String, Refusal)> {
        let cutoff = now.saturating_sub(KEPT_MICROS);
        let inner = self.lock();
        let mut found = Vec::new();
        for (name, t) in inner.tenants.iter().filter(|(name, _)| sees(name)) {
            let of = t
                .ring
                .iter()
                .filter(|r| r.at_micros >= cutoff && r.request_id == request_id);
            found.extend(of.map(|r| (name.clone(), r.clone())));
        }
        found.sort_by_key(|(_, r)| r.at_micros);
        found
    }

    /// The tenant and request id of the kept refusal of reservation
    /// `reservation_id`, whichever tenant's it was (a deny-cache refusal
    /// reuses the store's refusal of a budget, which another tenant's
    /// request may have met).
    pub fn origin_of(&self, reservation_id: &str) -> Option<(String, String)> {
        let inner = self.lock();
        inner.tenants.iter().find_map(|(name, t)| {
            t.ring
                .iter()
                .rev()
                .find(|r| r.reservation_id.as_deref() == Some(reservation_id))
                .map(|r| (name.clone(), r.request_id.clone()))
        })
    }

    /// The budget refusals of `tenant` in the last [`SHOWN_MICROS`] before
    /// `now`, newest first, at most [`PAGE_SHOWN`], as JSON: `at_micros`,
    /// `age_micros`, `scope`, `budget`, `reason`, `request_id`, `explain`
    /// (the route that explains it).
    pub fn json_of(&self, tenant: &str, now: u64) -> Vec<Value> {
        let inner = self.lock();
        let Some(t) = inner.tenants.get(tenant) else {
            return Vec::new();
        };
        let cutoff = now.saturating_sub(SHOWN_MICROS);
        t.ring
            .iter()
            .rev()
            .take_while(|r| r.at_micros >= cutoff)
            .filter(|r| r.by_budget())
            .take(PAGE_SHOWN)
            .map(|r| {
                json!({
                    "at_micros": r.at_micros,
                    "age_micros": now.saturating_sub(r.at_micros),
                    "scope": r.scope.as_ref().map(|s| s.to_string()),
                    "budget": r.budget,
                    "reason": r.reason,
                    "request_id": r.request_id,
                    "explain": (!r.request_id.is_empty()).then(|| explain_path(&r.request_id)),
                })
            })
            .collect()
    }
}

/// The admin route that explains the refusal of `request_id`.
pub fn explain_path(request_id: &str) -> String {
    // RFC 3986's unreserved characters stay as they are (a UUID reads as one).
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    format!(
        "/admin/v1/refusals/{}",
        percent_encoding::utf8_percent_encode(request_id, ESCAPED)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Impossibility;

    fn impossible(tenant: &str) -> ApiError {
        ApiError::Impossible(Box::new(Impossibility {
            scope: Scope::Tenant(tenant.into()),
            name: BudgetName::Tpm,
            capacity: 10,
            requested: 20,
        }))
    }

    fn refusal(id: &str, at: u64) -> Refusal {
        Refusal::of(&impossible("a"), id, "store", at).unwrap()
    }

    #[test]
    fn the_page_shows_the_newest_budget_refusals_recent_only() {
        let r = RecentRefusals::default();
        r.record("a", &ApiError::BadGateway("x".into()), 1);
        assert!(r.json_of("a", 1).is_empty(), "not a refusal");
        for i in 0..(PAGE_SHOWN as u64 + 5) {
            r.record("a", &impossible("a"), 1_000 + i);
        }
        let now = 1_000 + PAGE_SHOWN as u64 + 5;
        let shown = r.json_of("a", now);
        assert_eq!(shown.len(), PAGE_SHOWN);
        assert_eq!(shown[0]["at_micros"], now - 1, "newest first");
        assert_eq!(shown[0]["budget"], "tpm");
        assert_eq!(shown[0]["reason"], "impossible");
        assert_eq!(shown[0]["scope"], "tenant:a");
        assert!(
            r.json_of("a", now + SHOWN_MICROS + 100).is_empty(),
            "too old"
        );
        assert!(r.json_of("b", now).is_empty());
        // A fail-closed refusal is kept for explain, not listed by budget.
        r.keep(
            "a",
            Refusal::of(&ApiError::StoreUnavailable, "fc", "store", now).unwrap(),
        );
        assert_eq!(r.json_of("a", now)[0]["budget"], "tpm");
        assert_eq!(r.find("fc", now, |_| true)[0].1.decided_by, "fail_closed");
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
        assert_eq!(r.lock().tenants.len(), 1);
        assert_eq!(r.lock().records, 1);
    }

    #[test]
    fn records_are_bounded_per_tenant_and_overall() {
        let r = RecentRefusals::default();
        for i in 0..(PER_TENANT as u64 + 10) {
            r.keep("a", refusal(&format!("id{i}"), 100 + i));
        }
        assert_eq!(r.lock().tenants["a"].ring.len(), PER_TENANT);
        assert!(r.find("id0", 200, |_| true).is_empty(), "the oldest went");
        assert_eq!(r.find("id10", 200, |_| true).len(), 1);
        let tenants = MAX_RECORDS / PER_TENANT + 2;
        for t in 0..tenants {
            for i in 0..PER_TENANT as u64 {
                r.keep(&format!("t{t}"), refusal("x", 1_000 + i));
            }
        }
        assert!(r.lock().records <= MAX_RECORDS);
        let counted: usize = r.lock().tenants.values().map(|t| t.ring.len()).sum();
        assert_eq!(counted, r.lock().records);
    }

    #[test]
    fn a_request_id_seen_twice_lists_both_and_hidden_tenants_are_not_told() {
        let r = RecentRefusals::default();
        r.keep("a", refusal("same", 10));
        r.keep("a", refusal("same", 20));
        r.keep("b", refusal("same", 15));
        let mine = r.find("same", 30, |t| t == "a");
        assert_eq!(
            mine.iter().map(|(_, r)| r.at_micros).collect::<Vec<_>>(),
            vec![10, 20]
        );
        assert!(r.find("same", 30, |t| t == "c").is_empty());
        assert_eq!(r.find("same", 30, |_| true).len(), 3);
        assert!(r.find("same", 30 + KEPT_MICROS, |_| true).is_empty());
    }

    #[test]
    fn a_reused_refusal_is_traced_to_its_tenant() {
        let r = RecentRefusals::default();
        let mut origin = refusal("first", 10);
        origin.reservation_id = Some("res-1".into());
        r.keep("b", origin);
        r.keep("a", refusal("second", 20));
        assert_eq!(r.origin_of("res-1"), Some(("b".into(), "first".into())));
        assert_eq!(r.origin_of("res-2"), None);
    }

    #[test]
    fn in_flight_reads_are_filled_in() {
        let r = RecentRefusals::default();
        r.keep("a", refusal("q", 10));
        assert_eq!(r.in_flight_of("a", "q", 10), None);
        let f = InFlight {
            read_after_micros: 2_000,
            holds: Some(HeldOn::default()),
            leases: None,
            note: None,
        };
        r.fill_in_flight("a", "q", 10, f.clone());
        assert_eq!(r.in_flight_of("a", "q", 10), Some(f.clone()));
        let found = r.find("q", 20, |_| true);
        assert_eq!(found[0].1.in_flight, Some(f));
        assert_eq!(
            found[0].1.json(20)["in_flight"]["said"],
            "read 2 ms after the decision, when first asked"
        );
    }
}
