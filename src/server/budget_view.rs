//! Every tenant's budgets at once: the admin list endpoint
//! `GET /admin/v1/budgets` that the budget page reads, and the
//! remaining-share gauges of `/metrics`.
//!
//! - One budget renders the same everywhere ([`budget_json`]): its scope,
//!   scope kind and name, budget, kind, `unit`, limit, capacity, remaining,
//!   debt (what a budget in debt owes),
//!   reset. A reader draws any budget as `remaining / capacity unit` without
//!   knowing its kind, so a new kind (e.g. dollars) needs no page change.
//! - Tenants are listed by name, `limit` per page (default
//!   [`DEFAULT_PAGE`], at most [`MAX_PAGE`]), the next page starting after
//!   the `next_after` name of the previous one. A page costs at most
//!   ⌈its budgets / [`INSPECT_CHUNK`]⌉ store calls (one for usual pages),
//!   whatever the number of tenants; reading changes nothing.
//! - Upstream deployments come with the first page (no `after`).
//! - Each tenant comes with its `parent` (the page draws the tree), the
//!   configured limits of each of its end users (`end_user_limits`: no
//!   state, end users are too many to list) and its budget refusals of the
//!   last minutes (`recent_refusals`, [`crate::gateway::recent_refusals`]).
//! - A rolling window that counts anything comes with its `next_slide`:
//!   when its oldest units slide out and how many ([`slides_of`]).
//! - With `runs=N` (the page asks for a few), each tenant's active runs
//!   with the most tokens reserved ([`runs_json`]): one more store read per
//!   tenant, and the runs' budgets in the page's inspect calls' manner.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{OriginalUri, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::admin;
use crate::admission::plan;
use crate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, Scope, Slide, StoreError,
};
use crate::config::run::{window_name, RunLimits};
use crate::config::{Policy, TenantPolicy};
use crate::dialects::rate_limit_headers::go_duration;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;

/// Tenants per page when the request gives no `limit`.
pub const DEFAULT_PAGE: usize = 100;
/// Largest `limit` accepted.
pub const MAX_PAGE: usize = 500;
/// Budgets read per store call.
pub const INSPECT_CHUNK: usize = 512;

/// The unit a budget counts in.
pub fn unit(name: BudgetName) -> &'static str {
    match name {
        BudgetName::Rpm
        | BudgetName::RequestsPerDay
        | BudgetName::RequestsPer5h
        | BudgetName::RequestsPer24h
        | BudgetName::RequestsPerWeek => "requests",
        BudgetName::RunsPerDay => "runs",
        BudgetName::Tpm
        | BudgetName::InputTpm
        | BudgetName::OutputTpm
        | BudgetName::TokensPerDay
        | BudgetName::TokensPerMonth
        | BudgetName::TokensPer5h
        | BudgetName::TokensPer24h
        | BudgetName::TokensPerWeek => "tokens",
        BudgetName::MaxConcurrent => "slots",
        BudgetName::UsdPerDay
        | BudgetName::UsdPerMonth
        | BudgetName::UsdPer5h
        | BudgetName::UsdPer24h
        | BudgetName::UsdPerWeek => "usd_micros",
    }
}

/// The part of a scope after its kind and tenant: the key id, the model,
/// the deployment, or the tenant's own name.
fn scope_name(scope: &Scope) -> String {
    match scope {
        Scope::Tenant(t) => t.to_string(),
        Scope::Key(_, k) => k.to_string(),
        Scope::TenantModel(_, m) => m.to_string(),
        Scope::Upstream(u) => u.to_string(),
        Scope::EndUser(_, h) => h.to_string(),
        Scope::Run(_, r) => r.to_string(),
    }
}

/// One budget as the admin API reports it. A dollar budget's numbers are
/// µ$ (`unit` `usd_micros`), and its `usd` object gives limit, spent and
/// remaining as decimal-dollar strings (`"1.00"`, `"0.000750"`).
pub fn budget_json(spec: &BudgetSpec, s: &BudgetState) -> Value {
    let kind = match spec.kind {
        BudgetKind::Bucket { .. } => "bucket",
        BudgetKind::Quota { .. } => "quota",
        BudgetKind::Concurrency { .. } => "concurrency",
    };
    let usd = spec.name.counts_usd().then(|| {
        use crate::money::format_usd;
        json!({
            "limit": format_usd(s.limit as i64),
            "spent": format_usd(s.limit as i64 - s.remaining),
            "remaining": format_usd(s.remaining),
        })
    });
    json!({
        "scope": spec.scope.to_string(),
        "scope_kind": crate::metrics::scope_kind(&spec.scope),
        "scope_name": scope_name(&spec.scope),
        "budget": spec.name,
        "kind": kind,
        "unit": unit(spec.name),
        "shadow": spec.shadow,
        "limit": s.limit,
        "capacity": spec.capacity(),
        "remaining": s.remaining,
        // Usage settled above what was held (expected-mode turns, estimate
        // errors): what the budget owes, in its unit.
        "debt": (-s.remaining).max(0),
        "reset_micros": s.reset_micros,
        "reset": go_duration(s.reset_micros),
        "window": s.window,
        "usd": usd,
    })
}

/// The next units to slide out of each rolling window among `specs`
/// (`None` elsewhere): one more store read per [`INSPECT_CHUNK`] rolling
/// windows, none when there are none. A failed read leaves them out (the
/// list itself was read).
pub(crate) async fn slides_of(st: &AppState, specs: &[BudgetSpec]) -> Vec<Option<Slide>> {
    let mut out = vec![None; specs.len()];
    let idx: Vec<usize> = (0..specs.len())
        .filter(
            |&i| matches!(specs[i].kind, BudgetKind::Quota { window, .. } if window.is_rolling()),
        )
        .collect();
    for chunk in idx.chunks(INSPECT_CHUNK) {
        let part: Vec<BudgetSpec> = chunk.iter().map(|&i| specs[i].clone()).collect();
        match st.store.slides(&part).await {
            Ok(s) => {
                for (&i, s) in chunk.iter().zip(s) {
                    out[i] = s;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "admin: rolling windows' slides not read");
                break;
            }
        }
    }
    out
}

/// A rolling window's next slide as the admin API reports it: when (µs
/// from the read, and as a duration) and how many units.
pub(crate) fn slide_json(s: &Slide) -> Value {
    json!({
        "in_micros": s.in_micros,
        "in": go_duration(s.in_micros),
        "units": s.units,
    })
}

/// Reads `specs` in chunks of [`INSPECT_CHUNK`].
async fn inspect_all(st: &AppState, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
    let mut out = Vec::with_capacity(specs.len());
    for chunk in specs.chunks(INSPECT_CHUNK) {
        out.extend(st.store.inspect(chunk).await?);
    }
    Ok(out)
}

/// `?limit=&after=&runs=`.
#[derive(Debug, serde::Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
    runs: Option<usize>,
}

/// Runs listed per tenant when a runs listing gives no number.
pub const DEFAULT_RUNS: usize = 10;
/// Most runs listed per tenant (all its run index keeps).
pub const MAX_RUNS: usize = crate::budget::RUN_INDEX_MAX;

/// The 400 of a runs count outside `1..=MAX_RUNS` (`0` too for `param`
/// `runs` of the list, where 0 means none).
pub fn runs_param_error(param: &str) -> Response {
    ApiError::InvalidRequest {
        message: format!("`{param}` must be a whole number within 1..={MAX_RUNS}."),
        param: Some(param.into()),
    }
    .into_response()
}

/// The active runs of each of `tenants` with the most tokens reserved, at
/// most `n` each, most first: `{id, spent, limits, budgets}` with the
/// limits its record holds (`spent`: tokens reserved by its admitted
/// requests, [`crate::budget::ListedRun`]) and its budgets as
/// [`budget_json`] renders them. One index read per tenant, then the
/// runs' budgets in calls of [`INSPECT_CHUNK`].
pub async fn runs_json(
    st: &AppState,
    policy: &Policy,
    tenants: &[&TenantPolicy],
    n: usize,
) -> Result<Vec<Vec<Value>>, StoreError> {
    let ks = AppState::key_space(policy);
    let mut listed = Vec::with_capacity(tenants.len());
    let mut specs = Vec::new();
    for t in tenants {
        let runs = st.store.runs_of(&ks, &t.name, n).await?;
        let mut of_tenant = Vec::with_capacity(runs.len());
        for r in runs {
            // A word this build cannot read lists the run without limits.
            let limits = RunLimits::from_word(&r.limits).unwrap_or_default();
            let scope = Scope::Run(t.name.as_str().into(), r.id.clone());
            let from = specs.len();
            specs.extend(plan::run_plan(&ks, t, &scope, &limits).0);
            of_tenant.push((r, limits, from..specs.len()));
        }
        listed.push(of_tenant);
    }
    let states = inspect_all(st, &specs).await?;
    Ok(listed
        .into_iter()
        .map(|runs| {
            runs.into_iter()
                .map(|(r, l, range)| {
                    json!({
                        "id": r.id,
                        "spent": r.spent,
                        "limits": {
                            "tokens": l.tokens,
                            "usd": l.usd_micros.map(|u| crate::money::format_usd(u as i64)),
                            "requests": l.requests,
                            "window": window_name(l.window()),
                        },
                        "budgets": range
                            .map(|i| budget_json(&specs[i], &states[i]))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .collect())
}

/// Tenants of `policy` that `keep` admits, sorted by name, the page after `after`.
fn page<'p>(
    policy: &'p Policy,
    after: Option<&str>,
    limit: usize,
    keep: impl Fn(&TenantPolicy) -> bool,
) -> (Vec<&'p TenantPolicy>, bool) {
    let mut tenants: Vec<&TenantPolicy> = policy.tenants.iter().filter(|t| keep(t)).collect();
    tenants.sort_by(|a, b| a.name.cmp(&b.name));
    let start = after.map_or(0, |a| tenants.partition_point(|t| t.name.as_str() <= a));
    let rest = &tenants[start..];
    let more = rest.len() > limit;
    (rest.iter().take(limit).copied().collect(), more)
}

/// `GET /admin/v1/budgets?limit=N&after=NAME`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    // A tenant-scoped token reads its subtree, without the shared deployments.
    let reader = match admin::Principal::of(&st, &headers, &uri) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Ok(Query(q)) = query else {
        return ApiError::InvalidRequest {
            message: "`limit` must be a whole number and `after` a tenant name.".into(),
            param: Some("limit".into()),
        }
        .into_response();
    };
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return ApiError::InvalidRequest {
            message: format!("`limit` must be within 1..={MAX_PAGE}."),
            param: Some("limit".into()),
        }
        .into_response();
    }
    let runs = q.runs.unwrap_or(0);
    if runs > MAX_RUNS {
        return runs_param_error("runs");
    }
    let p = st.policy.load_full();
    let ks = AppState::key_space(&p);
    let (tenants, more) = page(&p, q.after.as_deref(), limit, |t| reader.sees(&p, &t.name));
    let mut specs = Vec::new();
    let mut tenant_ranges = Vec::with_capacity(tenants.len());
    for t in &tenants {
        let from = specs.len();
        specs.extend(plan::tenant_specs(&p, t));
        tenant_ranges.push(from..specs.len());
    }
    let first_page = q.after.is_none();
    let mut upstream_ranges = Vec::new();
    if first_page && reader.scope().is_none() {
        for u in &p.upstreams {
            let from = specs.len();
            specs.extend(plan::upstream_budgets(&ks, u));
            upstream_ranges.push(from..specs.len());
        }
    }
    let states = match inspect_all(&st, &specs).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "admin: budget store inspect failed");
            return ApiError::StoreUnavailable.into_response();
        }
    };
    let slides = slides_of(&st, &specs).await;
    // What is out on quota leases, fleet-wide and here (leases on only).
    let leased = match st.store.leases() {
        Some(l) => match l.leased_out(&specs).await {
            Ok(out) => Some((l.clone(), out)),
            Err(e) => {
                tracing::debug!(error = %e, "admin: leased amounts not read");
                None
            }
        },
        None => None,
    };
    let render = |r: &std::ops::Range<usize>| -> Vec<Value> {
        r.clone()
            .map(|i| {
                let mut b = budget_json(&specs[i], &states[i]);
                if let Some(s) = &slides[i] {
                    b["next_slide"] = slide_json(s);
                }
                if let Some((l, out)) = &leased {
                    if let Some(o) = out.get(i) {
                        b["leased"] = json!({
                            "units": o.units,
                            "leases": o.leases,
                            "epoch": o.epoch,
                            "here": l.leased_units(&specs[i].key),
                        });
                    }
                }
                b
            })
            .collect()
    };
    // Runs are listed on request only: they cost a read per tenant.
    let mut runs_of = match runs {
        0 => None,
        n => match runs_json(&st, &p, &tenants, n).await {
            Ok(r) => Some(r.into_iter()),
            Err(e) => {
                tracing::debug!(error = %e, "admin: runs not listed");
                None
            }
        },
    };
    let now = st.clock.now_micros();
    let tenants_json: Vec<Value> = tenants
        .iter()
        .zip(&tenant_ranges)
        .map(|(t, r)| {
            let mut v = json!({
                "name": t.name,
                "parent": t.parent.map(|i| p.tenants[i].name.as_str()),
                "keys": t.keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
                "shadow": t.shadow,
                "budgets": render(r),
                "end_user_limits": end_user_limits_json(&ks, t),
                "recent_refusals": st.recent_refusals.json_of(&t.name, now),
            });
            if runs > 0 {
                v["runs"] = match runs_of.as_mut().and_then(Iterator::next) {
                    Some(r) => Value::Array(r),
                    None => Value::Null,
                };
            }
            v
        })
        .collect();
    let mut body = json!({
        "policy_version": p.version,
        "tenants": tenants_json,
        "next_after": if more { tenants.last().map(|t| t.name.as_str()) } else { None },
    });
    if first_page {
        let depth = st.queue.depth();
        body["queue"] = json!({
            "enabled": p.queue.is_some(),
            "depth": crate::config::queue::Class::ALL
                .iter()
                .map(|c| (c.as_str().to_string(), json!(depth[c.index()])))
                .collect::<serde_json::Map<String, Value>>(),
        });
        body["upstreams"] = p
            .upstreams
            .iter()
            .zip(&upstream_ranges)
            .map(|(u, r)| json!({"name": u.name, "kind": u.kind, "budgets": render(r)}))
            .collect();
    }
    admin::json_response(StatusCode::OK, body)
}

/// The budgets each end user of `t` has (its `end_user_limits`), as
/// configured: `budget`, `kind`, `unit`, `limit`, `capacity`.
fn end_user_limits_json(ks: &crate::budget::keys::KeySpace, t: &TenantPolicy) -> Vec<Value> {
    if t.end_user_limits.is_empty() {
        return Vec::new();
    }
    let scope = Scope::EndUser(t.name.as_str().into(), "*".into());
    plan::scope_budgets(ks, scope, &t.end_user_limits, true)
        .iter()
        .map(|s| {
            json!({
                "budget": s.name,
                "unit": unit(s.name),
                "limit": s.limit(),
                "capacity": s.capacity(),
            })
        })
        .collect()
}

/// Share of a budget left, within [0, 1] (a bucket in debt counts as empty).
fn share(spec: &BudgetSpec, s: &BudgetState) -> f64 {
    let capacity = spec.capacity().max(1) as f64;
    (s.remaining as f64 / capacity).clamp(0.0, 1.0)
}

/// Sets the remaining-share gauges of every budget of `policy` from the
/// store: per tenant, scope kind and budget the smallest share among the
/// tenant's scopes of that kind (its keys, its models), per deployment and
/// budget its own. Never per end user. Store calls as for a list page.
pub async fn refresh_gauges(st: &AppState) -> Result<(), StoreError> {
    let p = st.policy.load_full();
    let ks = AppState::key_space(&p);
    let mut specs = Vec::new();
    for t in &p.tenants {
        specs.extend(plan::tenant_specs(&p, t));
    }
    for u in &p.upstreams {
        specs.extend(plan::upstream_budgets(&ks, u));
    }
    let specs: Vec<BudgetSpec> = specs.into_iter().filter(|s| !s.shadow).collect();
    let states = inspect_all(st, &specs).await?;
    let mut tenant_min: HashMap<(&str, &'static str, BudgetName), f64> = HashMap::new();
    for (spec, s) in specs.iter().zip(&states) {
        let v = share(spec, s);
        match &spec.scope {
            Scope::Upstream(u) => crate::metrics::upstream_budget_remaining_share(u, spec.name, v),
            // Never per end user or run (and none is in the policy's lists).
            Scope::EndUser(..) | Scope::Run(..) => {}
            Scope::Tenant(t) | Scope::Key(t, _) | Scope::TenantModel(t, _) => {
                let e = tenant_min
                    .entry((
                        t.as_ref(),
                        crate::metrics::scope_kind(&spec.scope),
                        spec.name,
                    ))
                    .or_insert(1.0);
                *e = e.min(v);
            }
        }
    }
    for ((tenant, kind, name), v) in tenant_min {
        crate::metrics::budget_remaining_share(tenant, kind, name, v);
    }
    Ok(())
}

/// Refreshes the gauges every `period` until the task is aborted.
pub fn spawn_gauges(st: Arc<AppState>, period: std::time::Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = refresh_gauges(&st).await {
                tracing::debug!(error = %e, "budget gauges not refreshed: the store did not answer");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(names: &[&str]) -> Policy {
        let mut text = String::from(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\n[[models]]\nname = \"m\"\nupstreams = [\"u\"]\n",
        );
        for n in names {
            text.push_str(&format!(
                "[[tenants]]\nname = \"{n}\"\nlimits = {{ tpm = 1000 }}\n"
            ));
        }
        Policy::from_toml(&text).unwrap()
    }

    #[test]
    fn pages_follow_names_and_end() {
        let p = policy(&["c", "a", "d", "b", "e"]);
        let names = |v: Vec<&TenantPolicy>| v.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        let (first, more) = page(&p, None, 2, |_| true);
        assert_eq!(
            (names(first), more),
            (vec!["a".to_string(), "b".into()], true)
        );
        let (second, more) = page(&p, Some("b"), 2, |_| true);
        assert_eq!(
            (names(second), more),
            (vec!["c".to_string(), "d".into()], true)
        );
        let (last, more) = page(&p, Some("d"), 2, |_| true);
        assert_eq!((names(last), more), (vec!["e".to_string()], false));
        // A cursor naming a tenant removed meanwhile still continues after it.
        let (after_gone, _) = page(&p, Some("bb"), 10, |_| true);
        assert_eq!(names(after_gone), vec!["c", "d", "e"]);
        let (exact, more) = page(&p, None, 5, |_| true);
        assert_eq!((exact.len(), more), (5, false));
    }

    #[test]
    fn units_cover_every_budget() {
        assert_eq!(unit(BudgetName::Tpm), "tokens");
        assert_eq!(unit(BudgetName::Rpm), "requests");
        assert_eq!(unit(BudgetName::MaxConcurrent), "slots");
        assert_eq!(unit(BudgetName::TokensPerMonth), "tokens");
        assert_eq!(unit(BudgetName::RequestsPerDay), "requests");
        assert_eq!(unit(BudgetName::UsdPerMonth), "usd_micros");
    }
}
