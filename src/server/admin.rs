//! The operator API under `/admin/v1/`: the active
//! policy version and, for a tenant or an upstream deployment, the current
//! limit, capacity, remaining and reset of every budget (a nested tenant's
//! with its ancestors', which its requests reserve on too).
//!
//! - Enabled only when the environment variable named by
//!   `server.admin_token_env` (default `BUDGETGATE_ADMIN_TOKEN`) is set and
//!   non-empty at start; otherwise every admin path answers 404, as if it
//!   did not exist.
//! - `Authorization: Bearer <token>`; the SHA-256 of the presented token is
//!   compared with the configured token's in constant time. Anything else
//!   gets 401 in OpenAI's error shape.
//! - Nothing here reveals API keys or their digests: tenants are listed
//!   with their key *ids* (the names of `key:` scopes) only.
//! - Reading budgets never changes them ([`BudgetStore::inspect`]).
//!
//! [`BudgetStore::inspect`]: crate::budget::BudgetStore::inspect

// The refusal is returned as is (`Result<_, Response>`, 128 bytes), as in
// the control API: built on a rare path, boxing it would buy nothing.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::budget_view;
use crate::admission::plan;
use crate::budget::BudgetSpec;
use crate::config::Policy;
use crate::control::runtime::Role;
use crate::control::writes::{in_subtree, Actor};
use crate::gateway::error::ApiError;
use crate::gateway::AppState;

/// True when `presented`'s SHA-256 equals `expected`, comparing every byte
/// whatever the first difference (constant time over equal-length digests).
pub fn token_matches(expected: &[u8; 32], presented: &str) -> bool {
    let got = Sha256::digest(presented.as_bytes());
    let diff = expected
        .iter()
        .zip(got.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0
}

pub(crate) fn json_response(status: StatusCode, v: Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An admin API refusal: an OpenAI error body, never cached.
pub(crate) fn error_response(status: StatusCode, message: &str, code: Option<&str>) -> Response {
    let mut r = crate::gateway::error::body(status, message, "invalid_request_error", None, code);
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

pub(crate) fn unauthorized() -> Response {
    let mut r = error_response(
        StatusCode::UNAUTHORIZED,
        "The admin API needs `Authorization: Bearer <admin token>`.",
        Some("invalid_admin_token"),
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"budgetgate-admin\""),
    );
    r
}

fn not_found(what: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        &format!("No such {what}."),
        Some("not_found"),
    )
}

/// The 404 of an admin URL while the admin API is disabled: the message
/// says which environment variable enables it.
pub(crate) fn disabled(st: &AppState, uri: &OriginalUri) -> Response {
    let var = st.policy.load().server.admin_token_env.clone();
    json_response(
        StatusCode::NOT_FOUND,
        json!({"error": {
            "message": format!(
                "Unknown request URL: {}. The admin API is disabled: set the environment variable {var} (named by server.admin_token_env) to a secret token and restart the gateway to enable it.",
                uri.path()
            ),
            "type": "invalid_request_error",
            "param": null,
            "code": "not_found"
        }}),
    )
}

/// Who presents an admin token: the bootstrap token (the environment
/// variable of `server.admin_token_env`) or a token of the control
/// database, with its role and the subtree it is limited to. The one admin
/// authentication: the admin pages, the budget and spend pages and the
/// control API ([`super::control_api::Caller`]) all look a token up here
/// and refuse with the same texts.
#[derive(Debug, Clone)]
pub enum Principal {
    /// The bootstrap token.
    Root,
    /// A token of the database.
    Token {
        /// Its id.
        id: String,
        /// Its role.
        role: Role,
        /// The subtree it is limited to.
        tenant: Option<String>,
    },
}

impl Principal {
    /// The principal of a request, or the refusal to send: 404 while the
    /// admin API is disabled, 401 without a known token. The bootstrap
    /// token's digest is compared first, then the control database's
    /// tokens (none without a control plane).
    pub fn of(st: &AppState, headers: &HeaderMap, uri: &OriginalUri) -> Result<Self, Response> {
        let Some(root) = st.admin_token_digest() else {
            return Err(disabled(st, uri));
        };
        let token = super::handlers::bearer_token(headers).ok_or_else(unauthorized)?;
        if token_matches(&root, token) {
            return Ok(Principal::Root);
        }
        let found = st.control.get().and_then(|c| {
            c.snapshot()
                .tokens
                .iter()
                .find(|t| token_matches(&t.sha256, token))
                .map(|t| Principal::Token {
                    id: t.id.clone(),
                    role: t.role,
                    tenant: t.tenant.clone(),
                })
        });
        found.ok_or_else(unauthorized)
    }

    /// How the audit trail names the caller.
    pub fn actor(&self) -> Actor {
        match self {
            Principal::Root => Actor("root".into()),
            Principal::Token { id, .. } => Actor(format!("admin_token:{id}")),
        }
    }

    /// The subtree the caller is limited to.
    pub fn scope(&self) -> Option<&str> {
        match self {
            Principal::Token { tenant, .. } => tenant.as_deref(),
            Principal::Root => None,
        }
    }

    /// Whether the caller may change things (the root, the admin role).
    pub fn may_write(&self) -> bool {
        matches!(
            self,
            Principal::Root
                | Principal::Token {
                    role: Role::Admin,
                    ..
                }
        )
    }

    /// Whether tenant `name` (of `policy`) is in the caller's subtree.
    pub fn sees(&self, policy: &Policy, name: &str) -> bool {
        match self.scope() {
            None => true,
            Some(root) => in_subtree(policy, name, root),
        }
    }

    /// 403 unless tenant `name` is in the caller's subtree (a tenant the
    /// caller cannot see gets the same answer whether it exists or not).
    pub fn check_sees(&self, policy: &Policy, name: &str) -> Result<(), Response> {
        if self.sees(policy, name) {
            Ok(())
        } else {
            Err(forbidden(&format!(
                "This admin token cannot see or change tenant {name:?}: it is limited to tenant {:?} and its subtree.",
                self.scope().unwrap_or("")
            )))
        }
    }

    /// 403 unless the caller has no tenant scope.
    pub fn unscoped(&self) -> Result<(), Response> {
        self.unscoped_because("")
    }

    /// 403 for a tenant-scoped token on a page that covers every tenant
    /// or the shared deployments.
    pub fn check_whole(&self) -> Result<(), Response> {
        self.unscoped_because(": this page covers every tenant or the shared deployments")
    }

    fn unscoped_because(&self, why: &str) -> Result<(), Response> {
        match self.scope() {
            None => Ok(()),
            Some(t) => Err(forbidden(&format!(
                "This admin token is limited to tenant {t:?} and its subtree{why}."
            ))),
        }
    }
}

/// 403 `forbidden`.
pub fn forbidden(message: &str) -> Response {
    error_response(StatusCode::FORBIDDEN, message, Some("forbidden"))
}

/// Checks the admin token for a page that covers every tenant: `Some`
/// holds the refusal to send (404 when the admin API is disabled, 401
/// without a valid token, 403 for a tenant-scoped token).
pub(crate) fn refuse(st: &AppState, headers: &HeaderMap, uri: &OriginalUri) -> Option<Response> {
    Principal::of(st, headers, uri)
        .and_then(|r| r.check_whole())
        .err()
}

/// `GET /admin/v1/policy`: the active policy's version and the names of its
/// tenants (with key ids), models and upstream deployments.
pub async fn policy(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = refuse(&st, &headers, &uri) {
        return r;
    }
    let p = st.policy.load_full();
    let tenants: Vec<Value> = p
        .tenants
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "parent": t.parent.map(|i| p.tenants[i].name.as_str()),
                "keys": t.keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
                "models_limited": t.model_limits.keys().collect::<Vec<_>>(),
                "on_store_error": t.on_store_error,
            })
        })
        .collect();
    let models: Vec<Value> = p
        .models
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "upstreams": m.upstreams.iter().map(|&i| p.upstreams[i].name.as_str()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let upstreams: Vec<Value> = p
        .upstreams
        .iter()
        .map(|u| json!({"name": u.name, "kind": u.kind}))
        .collect();
    json_response(
        StatusCode::OK,
        json!({
            "version": p.version,
            "tenants": tenants,
            "models": models,
            "upstreams": upstreams,
        }),
    )
}

/// Reads `specs` from the store and renders them.
async fn budgets_response(
    st: &AppState,
    policy: &Policy,
    subject: (&str, &str),
    specs: Vec<BudgetSpec>,
) -> Response {
    budgets_with_ancestors(st, policy, subject, specs, Vec::new()).await
}

/// Reads `specs` and each ancestor's from the store (one call) and renders
/// them: the subject's budgets, then `ancestors` (name, budgets) when given.
pub(crate) async fn budgets_with_ancestors(
    st: &AppState,
    policy: &Policy,
    subject: (&str, &str),
    specs: Vec<BudgetSpec>,
    ancestors: Vec<(&str, Vec<BudgetSpec>)>,
) -> Response {
    match budgets_body(st, policy, subject, specs, ancestors).await {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(r) => r,
    }
}

/// The body of [`budgets_with_ancestors`], or its error response.
pub(crate) async fn budgets_body(
    st: &AppState,
    policy: &Policy,
    subject: (&str, &str),
    mut specs: Vec<BudgetSpec>,
    ancestors: Vec<(&str, Vec<BudgetSpec>)>,
) -> Result<Value, Response> {
    let own = specs.len();
    let mut ranges = Vec::with_capacity(ancestors.len());
    for (name, a) in ancestors {
        ranges.push((name, specs.len()..specs.len() + a.len()));
        specs.extend(a);
    }
    let states = match st.store.inspect(&specs).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "admin: budget store inspect failed");
            return Err(ApiError::StoreUnavailable.into_response());
        }
    };
    let slides = super::budget_view::slides_of(st, &specs).await;
    let render = |r: std::ops::Range<usize>| -> Vec<Value> {
        r.map(|i| {
            let mut b = super::budget_view::budget_json(&specs[i], &states[i]);
            if let Some(s) = &slides[i] {
                b["next_slide"] = super::budget_view::slide_json(s);
            }
            b
        })
        .collect()
    };
    let mut body = json!({
        "policy_version": policy.version,
        subject.0: subject.1,
        "budgets": render(0..own),
    });
    if subject.0 == "tenant" {
        body["ancestors"] = ranges
            .into_iter()
            .map(|(name, r)| json!({"tenant": name, "budgets": render(r)}))
            .collect();
    }
    Ok(body)
}

/// `?runs=N` of a tenant's budgets, `?limit=N` of its runs.
#[derive(Debug, serde::Deserialize)]
pub struct RunsQuery {
    runs: Option<usize>,
    limit: Option<usize>,
}

/// The runs count `v` asks (`None`: [`budget_view::DEFAULT_RUNS`]), or
/// the 400 naming `param`.
fn runs_count(v: Option<usize>, param: &str) -> Result<usize, Response> {
    match v.unwrap_or(budget_view::DEFAULT_RUNS) {
        n @ 1..=budget_view::MAX_RUNS => Ok(n),
        _ => Err(budget_view::runs_param_error(param)),
    }
}

/// What both tenant routes with a run count check first: the caller sees
/// `tenant`, the count (`param`: `runs` or `limit`) is valid, the tenant
/// exists. Gives the policy, the tenant's index and the count.
fn tenant_runs_request(
    st: &AppState,
    tenant: &str,
    query: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
    uri: &OriginalUri,
    headers: &HeaderMap,
    param: &'static str,
) -> Result<(Arc<Policy>, usize, usize), Response> {
    let reader = Principal::of(st, headers, uri)?;
    let n = match query {
        Ok(Query(q)) => runs_count(if param == "runs" { q.runs } else { q.limit }, param)?,
        Err(_) => return Err(budget_view::runs_param_error(param)),
    };
    let p = st.policy.load_full();
    reader.check_sees(&p, tenant)?;
    let Some(i) = p.tenants.iter().position(|t| t.name == tenant) else {
        return Err(not_found("tenant"));
    };
    Ok((p, i, n))
}

/// `GET /admin/v1/tenants/{tenant}/budgets?runs=N`: with the tenant's
/// `runs` (at most N, default 10, most tokens reserved first).
pub async fn tenant_budgets(
    State(st): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    query: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let (p, i, n) = match tenant_runs_request(&st, &tenant, query, &uri, &headers, "runs") {
        Ok(x) => x,
        Err(r) => return r,
    };
    let t = &p.tenants[i];
    let specs = plan::tenant_specs(&p, t);
    let ancestors = plan::ancestor_specs(&p, t);
    let mut body = match budgets_body(&st, &p, ("tenant", &t.name), specs, ancestors).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    body["runs"] = match budget_view::runs_json(&st, &p, &[t], n).await {
        Ok(mut r) => Value::Array(r.pop().unwrap_or_default()),
        Err(e) => {
            // The budgets stand without their runs (a store that cannot list them).
            tracing::debug!(error = %e, "admin: runs not listed");
            Value::Null
        }
    };
    json_response(StatusCode::OK, body)
}

/// `GET /admin/v1/tenants/{tenant}/runs?limit=N`: the tenant's active runs
/// (at most N, default 10), most tokens reserved first.
pub async fn tenant_runs(
    State(st): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    query: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let (p, i, n) = match tenant_runs_request(&st, &tenant, query, &uri, &headers, "limit") {
        Ok(x) => x,
        Err(r) => return r,
    };
    let t = &p.tenants[i];
    match budget_view::runs_json(&st, &p, &[t], n).await {
        Ok(mut r) => json_response(
            StatusCode::OK,
            json!({"tenant": t.name, "runs": r.pop().unwrap_or_default()}),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "admin: runs not listed");
            ApiError::StoreUnavailable.into_response()
        }
    }
}

/// `GET /admin/v1/upstreams/{upstream}/budgets` (percent-encode a `/` in the name).
pub async fn upstream_budgets(
    State(st): State<Arc<AppState>>,
    Path(upstream): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = refuse(&st, &headers, &uri) {
        return r;
    }
    let p = st.policy.load_full();
    let Some(u) = p.upstreams.iter().find(|u| u.name == upstream) else {
        return not_found("upstream");
    };
    let specs = plan::upstream_budgets(&AppState::key_space(&p), u);
    budgets_response(&st, &p, ("upstream", &u.name), specs).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_compare() {
        let d: [u8; 32] = Sha256::digest(b"secret").into();
        assert!(token_matches(&d, "secret"));
        assert!(!token_matches(&d, "secreT"));
        assert!(!token_matches(&d, ""));
        assert!(!token_matches(&d, "secret "));
    }
}
