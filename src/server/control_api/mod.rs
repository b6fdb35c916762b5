//! The control API under `/admin/v1/` (the control plane): tenants, keys, admin
//! tokens and the audit trail, documented in `docs/openapi.json` (served
//! at `/admin/v1/openapi.json`) and docs/CONTROL.md.
//!
//! - [`tenants`], [`keys`], [`tokens`] (admin tokens and the audit
//!   trail), [`quarantine`] (what the control database holds but this
//!   gateway does not serve), [`own_budget`] (`GET /v1/budget` for a key
//!   holder).
//! - Who: the bootstrap token (the environment variable of
//!   `server.admin_token_env`) is the root; tokens of the database have a
//!   role (`read`, `admin`) and optionally a tenant whose subtree is all
//!   they see and change (403 elsewhere).
//! - Validation is the config file's ([`crate::control::runtime`]): a
//!   candidate entity is merged into the running file and snapshot and
//!   validated whole; its own errors come back with their paths relative
//!   to the body (400), errors it causes elsewhere (a child left without
//!   its parent) as they are (409).
//! - A change is written, then this gateway refreshes before answering
//!   (a client reads its own write here); the fleet follows within a
//!   second ([`crate::control::sync`]).

// The handlers' helpers return the refusal itself (`Result<_, Response>`,
// 128 bytes): built once on a rare path and answered as is, boxing it
// would buy nothing.
#![allow(clippy::result_large_err)]

mod key_body;
pub mod keys;
pub mod own_budget;
pub mod quarantine;
mod query;
pub mod tenants;
pub mod tokens;

use std::sync::Arc;

use axum::extract::OriginalUri;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::admin::{error_response, json_response};
use crate::config::raw::RawConfig;
use crate::config::{Limits, Policy};
use crate::control::runtime::{self, Entity, Quarantined, Snapshot};
use crate::control::writes::WriteError;
use crate::control::ControlPlane;
use crate::gateway::AppState;

/// The document served at `/admin/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// The control API's routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/admin/v1/openapi.json", get(openapi))
        .route(
            "/admin/v1/tenants",
            get(tenants::list).post(tenants::create),
        )
        .route(
            "/admin/v1/tenants/{tenant}",
            get(tenants::read)
                .patch(tenants::update)
                .delete(tenants::delete),
        )
        .route(
            "/admin/v1/tenants/{tenant}/keys",
            get(keys::list_of_tenant).post(keys::create),
        )
        .route(
            "/admin/v1/tenants/{tenant}/keys/{key}",
            get(keys::read).patch(keys::update),
        )
        .route(
            "/admin/v1/tenants/{tenant}/keys/{key}/rotate",
            post(keys::rotate),
        )
        .route(
            "/admin/v1/tenants/{tenant}/keys/{key}/revoke",
            post(keys::revoke),
        )
        .route("/admin/v1/keys", get(keys::list))
        .route(
            "/admin/v1/admin_tokens",
            get(tokens::list).post(tokens::create),
        )
        .route("/admin/v1/admin_tokens/{id}/revoke", post(tokens::revoke))
        .route("/admin/v1/audit", get(tokens::audit))
        .route("/admin/v1/control/quarantine", get(quarantine::list))
        .route("/v1/budget", get(own_budget::read))
}

async fn openapi(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = Caller::of(&st, &headers, &uri) {
        return r;
    }
    let doc: Value = serde_json::from_str(OPENAPI).unwrap_or(Value::Null);
    json_response(StatusCode::OK, doc)
}

pub use super::admin::Principal;

/// An authenticated request to the control API.
pub struct Caller {
    /// The control plane.
    pub plane: Arc<ControlPlane>,
    /// Who.
    pub who: Principal,
}

impl Caller {
    /// The caller of a request, or the refusal to send: 404 while the
    /// admin API or the control plane is off, 401 without a known token
    /// ([`Principal::of`]).
    pub fn of(st: &AppState, headers: &HeaderMap, uri: &OriginalUri) -> Result<Caller, Response> {
        let Some(plane) = st.control.get().cloned() else {
            return Err(super::admin::disabled(st, uri));
        };
        let who = Principal::of(st, headers, uri)?;
        Ok(Caller { plane, who })
    }

    /// What this caller's write is checked against under the lock: for a
    /// tenant-scoped token, that `tenants` still lie in its subtree (the
    /// checks above read this gateway's last snapshot only).
    pub fn recheck(&self, tenants: &[&str]) -> crate::control::writes::Recheck {
        let mut check = self.plane.recheck();
        check.scope = self.who.scope().map(|root| crate::control::writes::Scope {
            root: root.to_string(),
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            bounded: None,
        });
        check
    }

    /// 403 unless the caller may change things.
    pub fn writer(&self) -> Result<(), Response> {
        if self.who.may_write() {
            Ok(())
        } else {
            Err(forbidden(
                "This admin token has the read role: it cannot change anything.",
            ))
        }
    }

    /// 403 unless the caller has no tenant scope.
    pub fn unscoped(&self) -> Result<(), Response> {
        self.who.unscoped()
    }

    /// Whether tenant `name` (of `policy`) is in the caller's subtree.
    pub fn sees(&self, policy: &Policy, name: &str) -> bool {
        self.who.sees(policy, name)
    }

    /// 403 unless tenant `name` is in the caller's subtree.
    pub fn check_sees(&self, policy: &Policy, name: &str) -> Result<(), Response> {
        self.who.check_sees(policy, name)
    }
}

pub use crate::control::writes::in_subtree;

pub use super::admin::forbidden;

/// 400 with `param` (the field's path in the body).
pub fn bad_request(param: Option<&str>, message: &str) -> Response {
    let mut r = crate::gateway::error::body(
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        param,
        Some("invalid_value"),
    );
    r.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    r
}

/// 403 `forbidden` naming the field (`param`) a tenant-scoped token may
/// not set so.
pub fn forbidden_at(l: &crate::control::writes::Loosened) -> Response {
    let mut r = crate::gateway::error::body(
        StatusCode::FORBIDDEN,
        &l.message,
        "invalid_request_error",
        Some(&l.param),
        Some("forbidden"),
    );
    r.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    r
}

/// 409 `conflict`.
pub fn conflict(message: &str) -> Response {
    error_response(StatusCode::CONFLICT, message, Some("conflict"))
}

/// 404 `not_found`.
pub fn not_found(what: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        &format!("No such {what}."),
        Some("not_found"),
    )
}

/// The answer to a failed write.
pub fn write_failed(e: &WriteError, what: &str) -> Response {
    match e {
        WriteError::NotFound => not_found(what),
        WriteError::Exists => conflict(&format!("{what} already exists.")),
        WriteError::Conflict(why) => conflict(why),
        WriteError::Forbidden(why) => forbidden(why),
        WriteError::Loosened(l) => forbidden_at(l),
        WriteError::Invalid { param, message } => bad_request(Some(param), message),
        WriteError::Db(err) => {
            tracing::warn!(error = %err, "control API: the database refused a change");
            unavailable()
        }
    }
}

/// 503: the control database cannot take changes now (`server_error`, as
/// every failure of the gateway's own stores).
pub fn unavailable() -> Response {
    let mut r = crate::gateway::error::ApiError::OwnStoreUnavailable {
        store: crate::gateway::error::OwnStore::ControlDatabase,
        message: "The control database is unavailable: changes are refused until it is back (requests are served with the last known tenants and keys).".into(),
    }
    .respond(crate::dialects::Dialect::ChatCompletions);
    r.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    r
}

/// The JSON body of a request, with integers beyond 64 bits brought to the
/// nearest 64-bit one: a limit of 10^20 then gets the validator's range
/// message, as in the config file, instead of a parser's.
pub fn body_value(bytes: &[u8]) -> Result<Value, Response> {
    let mut v: Value = serde_json::from_slice(bytes)
        .map_err(|e| bad_request(None, &format!("The body is not JSON: {e}")))?;
    clamp_numbers(&mut v);
    Ok(v)
}

fn clamp_numbers(v: &mut Value) {
    match v {
        Value::Number(n) if n.as_i64().is_none() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 {
                *v = json!(if f > 0.0 { i64::MAX } else { i64::MIN });
            }
        }
        Value::Array(a) => a.iter_mut().for_each(clamp_numbers),
        Value::Object(o) => o.values_mut().for_each(clamp_numbers),
        _ => {}
    }
}

/// Validates the file merged with `snap` (the served snapshot with one
/// change, to `own`): `Ok` with the policy, or the answer: 400 with the
/// errors of `own` (paths relative to the body), 409 for errors
/// elsewhere. The entities quarantined now (`quarantined`) are left out,
/// `own` excepted: a change is not refused for what was broken before
/// it.
pub fn validate(
    file: &(RawConfig, String),
    snap: &Snapshot,
    quarantined: &[Quarantined],
    own: Option<&Entity>,
) -> Result<Policy, Response> {
    let mut snap = snap.clone();
    let out = |e: Entity| quarantined.iter().any(|q| q.entity == e) && Some(&e) != own;
    snap.tenants.retain(|t| {
        !out(Entity::Tenant {
            name: t.spec.name.clone(),
        })
    });
    snap.keys.retain(|k| {
        !out(Entity::Key {
            tenant: k.tenant.clone(),
            id: k.id.clone(),
        })
    });
    if let Some(Entity::Tenant { name }) = own {
        let parent = snap
            .tenants
            .iter()
            .find(|t| &t.spec.name == name)
            .and_then(|t| t.spec.parent.clone());
        if let Some(p) = parent {
            let known = file.0.tenants.iter().any(|t| t.name == p)
                || snap.tenants.iter().any(|t| t.spec.name == p);
            if !known {
                return Err(bad_request(
                    Some("parent"),
                    &format!("parent: unknown tenant {p:?} ({name} → {p})"),
                ));
            }
        }
    }
    let (raw, at) = match runtime::merge(&file.0, &snap) {
        Ok(m) => m,
        Err(e) => return Err(conflict(&e.0.join("; "))),
    };
    let prefix = match own {
        Some(Entity::Tenant { name }) => at.tenants.get(name).map(|i| format!("tenants[{i}]")),
        Some(Entity::Key { tenant, id }) => at
            .keys
            .get(&(tenant.clone(), id.clone()))
            .map(|(t, k)| format!("tenants[{t}].keys[{k}]")),
        None => None,
    }
    .unwrap_or_else(|| "-".into());
    let errors = match Policy::from_raw(raw, file.1.clone()) {
        Ok(p) => return Ok(p),
        Err(e) => e.0,
    };
    let rel = runtime::relative(&errors, &prefix);
    let own: Vec<&(Option<String>, String)> = rel.iter().filter(|(p, _)| p.is_some()).collect();
    if let Some((param, _)) = own.first() {
        let text: Vec<&str> = own.iter().map(|(_, m)| m.as_str()).collect();
        return Err(bad_request(param.as_deref(), &text.join("; ")));
    }
    let text: Vec<&str> = rel.iter().map(|(_, m)| m.as_str()).collect();
    Err(conflict(&text.join("; ")))
}

/// 400 naming the parent when `child` sets a limit above `parent`'s.
pub fn within_parent(
    child: &Limits,
    parent: &Limits,
    parent_name: &str,
    at: &str,
) -> Result<(), Response> {
    use crate::control::writes::{above_parent, above_parent_message};
    match above_parent(child, parent) {
        Some((field, c, p)) => {
            let path = format!("{at}.{field}");
            let message = above_parent_message(&path, (c, p), parent_name);
            Err(bad_request(Some(&path), &message))
        }
        None => Ok(()),
    }
}

/// `?limit=` (1..=1000, default 100) and `?after=` of a list.
#[derive(Debug, Clone)]
pub struct Page {
    /// Most items in one answer.
    pub limit: Option<usize>,
    /// The last item of the previous page (its name or id).
    pub after: Option<String>,
}

impl Page {
    /// `?limit=` and `?after=` of `q` (400 naming a bad one).
    pub(crate) fn of(q: &query::Params) -> Result<Page, Response> {
        Ok(Page {
            limit: q.number("limit", 1..=1000)?.map(|n| n as usize),
            after: q.text("after"),
        })
    }

    /// At most this many.
    pub fn size(&self) -> usize {
        self.limit.unwrap_or(100).clamp(1, 1000)
    }
}

/// A page of `items` (sorted by `key`): those after the cursor, at most
/// the page size, and the cursor of the next page.
pub fn paged(items: Vec<(String, Value)>, page: &Page) -> Value {
    let mut items = items;
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let start = match &page.after {
        Some(after) => items.partition_point(|(k, _)| k <= after),
        None => 0,
    };
    let rest = &items[start..];
    let take = rest.len().min(page.size());
    let next = (rest.len() > take).then(|| rest[take - 1].0.clone());
    json!({
        "data": rest[..take].iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
        "next": next,
    })
}

/// `v` without its `null` members (at every depth): what is not set is
/// not shown.
pub fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.retain(|_, x| !x.is_null());
            o.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}
