//! `GET /admin/v1/reconcile?tenant=NAME&threshold=N`
//! (docs/LEDGER.md, "Reconciliation"): for each calendar quota (tokens and
//! µ$, per day and month) of a tenant's own scope — the tenant named and
//! its subtree, or every tenant the caller sees — the store's counter
//! against the ledger's sum over the window, the difference explained by
//! its known causes ([`crate::ledger::reconcile`]). `over_threshold` is
//! true when a quota's unexplained difference (either sign) passes
//! `threshold` (default 0) units; `budgetgate reconcile` exits non-zero
//! then. Reading changes nothing.
//!
//! What this gateway reads: the store's counters, holds and leases (the
//! fleet's), and its own ledger buffer, dropped rows and previous crash; a
//! fleet's other gateways' buffers are not seen (a reconciliation is run
//! after the fleet is idle for a batch interval, or read with that in mind).

// The refusal is returned as is (`Result<_, Response>`), as in the other
// admin routes: built on a rare path, boxing it would buy nothing.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::extract::{OriginalUri, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::admin::{self, json_response};
use crate::admission::{plan, AnsweredBy};
use crate::budget::{BudgetName, BudgetSpec, BudgetStore, Scope};
use crate::control::writes::in_subtree;
use crate::gateway::error::{ApiError, OwnStore};
use crate::gateway::AppState;
use crate::ledger::query::{day_of, SpendQuery};
use crate::ledger::reconcile::{crash_bound, explain, Inputs};
use crate::ledger::window;

/// The query parameters.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Params {
    tenant: Option<String>,
    threshold: Option<u64>,
}

/// The quotas reconciled: calendar quotas of tokens and dollars.
fn reconciled(name: BudgetName) -> bool {
    matches!(
        name,
        BudgetName::TokensPerDay
            | BudgetName::TokensPerMonth
            | BudgetName::UsdPerDay
            | BudgetName::UsdPerMonth
    )
}

/// The largest request tenant `tenant`'s own budgets admit in `quota`'s
/// unit (tokens or µ$): the smallest capacity among its tenant-scope
/// budgets that count a request's whole charge in that unit (every
/// request of its subtree reserves on them, and one above a capacity is
/// refused before it reserves).
fn largest_admissible(p: &crate::config::Policy, tenant: &str, quota: BudgetName) -> u64 {
    let Some(t) = p.tenants.iter().find(|t| t.name == tenant) else {
        return 0;
    };
    let own = Scope::Tenant(t.name.as_str().into());
    let whole = |n: BudgetName| match quota.counts_usd() {
        true => n.counts_usd(),
        false => matches!(
            n,
            BudgetName::Tpm | BudgetName::TokensPerDay | BudgetName::TokensPerMonth
        ),
    };
    plan::tenant_specs(p, t)
        .iter()
        .filter(|s| s.scope == own && !s.shadow && whole(s.name))
        .map(BudgetSpec::capacity)
        .min()
        .unwrap_or(0)
}

fn ledger_unavailable(message: String) -> Response {
    ApiError::OwnStoreUnavailable {
        store: OwnStore::Ledger,
        message,
    }
    .into_response()
}

/// `GET /admin/v1/reconcile`.
pub async fn reconcile(
    State(st): State<Arc<AppState>>,
    params: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let caller = match admin::Principal::of(&st, &headers, &uri) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Ok(Query(q)) = params else {
        return ApiError::InvalidRequest {
            message: "`tenant` must be a tenant name and `threshold` a whole number.".into(),
            param: Some("threshold".into()),
        }
        .into_response();
    };
    let p = st.policy.load_full();
    if let Some(t) = &q.tenant {
        if let Err(r) = caller.check_sees(&p, t) {
            return r;
        }
    }
    let Some(reader) = st.spend.get() else {
        return ledger_unavailable("The spend ledger has no database on this gateway.".into());
    };
    let now = st.clock.now_micros();
    let mut specs: Vec<(String, BudgetSpec)> = Vec::new();
    for t in p.tenants.iter().filter(|t| caller.sees(&p, &t.name)) {
        if q.tenant
            .as_ref()
            .is_some_and(|root| !in_subtree(&p, &t.name, root))
        {
            continue;
        }
        let own = Scope::Tenant(t.name.as_str().into());
        specs.extend(
            plan::tenant_specs(&p, t)
                .into_iter()
                .filter(|s| s.scope == own && reconciled(s.name) && !s.shadow)
                .map(|s| (t.name.clone(), s)),
        );
    }
    let only: Vec<BudgetSpec> = specs.iter().map(|(_, s)| s.clone()).collect();
    let states = match st.store.inspect(&only).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "reconcile: budget store inspect failed");
            return ApiError::StoreUnavailable.into_response();
        }
    };
    let mut notes: Vec<String> = Vec::new();
    let holds = match st.store.holds_on(&only).await {
        Ok(h) => Some(h),
        Err(e) => {
            notes.push(format!("holds in flight not read: {e}"));
            None
        }
    };
    let leases = match st.store.leases() {
        None => None,
        Some(l) => match l.leased_out(&only).await {
            Ok(out) => Some(out),
            Err(e) => {
                notes.push(format!("leases not read: {e}"));
                None
            }
        },
    };
    let ledger = st.ledger.get();
    let crash = ledger.and_then(|l| l.previous_crash());
    let lifetime = (p.server.max_request + p.server.settle_retry).as_micros() as u64;
    let caller_scope = caller.scope().map(str::to_string);
    let mut quotas = Vec::with_capacity(specs.len());
    let mut over = false;
    let mut unexplained_total: u64 = 0;
    for (i, (tenant, spec)) in specs.iter().enumerate() {
        let Some((mut from, to)) = window::window_of(spec.name, now) else {
            continue;
        };
        if let crate::budget::BudgetKind::Quota { window, .. } = spec.kind {
            if let Some(len) = window.from_first_use() {
                // The store's window began at its first use: its end (the
                // state's reset) less its length, not the last `len`.
                from = now
                    .saturating_add(states[i].reset_micros)
                    .saturating_sub(len);
            }
        }
        let sum = |range: (u64, u64)| {
            window::spend_of(&**reader, &spec.scope, range, caller_scope.clone())
        };
        let fail_open = window::spend_decided_by(
            &**reader,
            &spec.scope,
            (from, to),
            caller_scope.clone(),
            Some(AnsweredBy::LocalLimiter.label()),
        );
        let (in_window, early, fail_open) = match (
            sum((from, to)).await,
            sum((from, (from + lifetime).min(to))).await,
            fail_open.await,
        ) {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                return ledger_unavailable(format!(
                    "The spend ledger's database did not answer: {e}"
                ))
            }
        };
        let extent_q = SpendQuery {
            group_by: Vec::new(),
            period: None,
            from_micros: from,
            to_micros: to,
            within: Some(tenant.clone()),
            scope: caller_scope.clone(),
            top: None,
            request_id: None,
            run_id: None,
            decided_by: None,
        };
        let extent = match reader.extent(&extent_q).await {
            Ok(x) => x,
            Err(e) => {
                return ledger_unavailable(format!(
                    "The spend ledger's database did not answer: {e}"
                ))
            }
        };
        let unit = |t: &crate::ledger::query::SpendTotals| window::in_unit(spec.name, t);
        let largest = if spec.name.counts_usd() {
            extent.max_cost_micros
        } else {
            extent.max_charged_tokens
        };
        let state = &states[i];
        let store_used = state.limit as i64 - state.remaining;
        let ledger_sum = unit(&in_window);
        let inputs = Inputs {
            store: store_used,
            ledger: ledger_sum,
            holds: holds.as_ref().map(|h| h[i].units),
            leases: leases.as_ref().map(|l| l[i].units),
            buffered: ledger
                .and_then(|l| l.buffer())
                .map_or(0, |b| unit(&b.waiting_of(tenant, from, to))),
            dropped: ledger.and_then(|l| l.buffer()).map_or(0, |b| {
                unit(&b.dropped_of(tenant, day_of(from)..day_of(to.saturating_sub(1)) + 1))
            }),
            retention: p
                .ledger
                .retention
                .is_some_and(|r| from < now.saturating_sub(r.as_micros() as u64)),
            crash: crash
                .filter(|c| c.started_micros < to && c.found_micros > from)
                .map(|c| {
                    crash_bound(
                        c.buffer_rows,
                        largest,
                        largest_admissible(&p, tenant, spec.name),
                    )
                }),
            boundary: unit(&early),
            fail_open: unit(&fail_open),
            store_reset: store_used <= 0 && extent.rows > 0,
        };
        let e = explain(&inputs);
        let magnitude = e.unexplained.unsigned_abs();
        unexplained_total = unexplained_total.saturating_add(magnitude);
        let threshold = q.threshold.unwrap_or(0);
        over |= magnitude > threshold;
        quotas.push(json!({
            "tenant": tenant,
            "scope": spec.scope.to_string(),
            "budget": spec.name,
            "unit": super::budget_view::unit(spec.name),
            "window": {"from_micros": from, "to_micros": to},
            "store": store_used,
            "ledger": ledger_sum,
            "ledger_rows": in_window.requests,
            "difference": e.difference,
            "causes": e.causes,
            "unexplained": e.unexplained,
            "over_threshold": magnitude > threshold,
        }));
    }
    if st.ledger.get().is_none() {
        notes.push(
            "the ledger does not record on this gateway: no buffer or dropped rows to read".into(),
        );
    }
    let body: Value = json!({
        "at_micros": now,
        "tenant": q.tenant,
        "threshold": q.threshold.unwrap_or(0),
        "quotas": quotas,
        "unexplained_total": unexplained_total,
        "over_threshold": over,
        "previous_crash": crash,
        "notes": notes,
    });
    json_response(StatusCode::OK, body)
}
