//! `/admin/v1/admin_tokens` (created and revoked by the root token only:
//! a role is never granted by a token that holds a lesser one) and
//! `/admin/v1/audit` (every change: who, when, what, before, after).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::json;

use super::{
    bad_request, forbidden, not_found, paged, query, unavailable, write_failed, Caller, Page,
    Principal,
};
use crate::config::hash_key;
use crate::config::ids::is_valid_id;
use crate::control::runtime::Role;
use crate::control::writes;
use crate::gateway::AppState;
use crate::server::admin::json_response;

fn root_only(c: &Caller) -> Result<(), Response> {
    match c.who {
        Principal::Root => Ok(()),
        _ => Err(forbidden(
            "Admin tokens are created and revoked with the bootstrap (root) token only.",
        )),
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenBody {
    id: Option<String>,
    role: String,
    tenant: Option<String>,
}

/// `POST /admin/v1/admin_tokens`: `{"role": "read"|"admin", "tenant"?}`;
/// the token is in this answer only.
pub async fn create(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = root_only(&c) {
        return r;
    }
    let b: TokenBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(None, &format!("The body is not an admin token: {e}")),
    };
    let Some(role) = Role::parse(&b.role) else {
        return bad_request(
            Some("role"),
            &format!("role: must be \"read\" or \"admin\", not {:?}", b.role),
        );
    };
    let policy = st.policy.load_full();
    if let Some(t) = &b.tenant {
        if !policy.tenants.iter().any(|x| &x.name == t) {
            return bad_request(Some("tenant"), &format!("tenant: unknown tenant {t:?}"));
        }
    }
    let id = b.id.unwrap_or_else(|| {
        let u = uuid::Uuid::new_v4().simple().to_string();
        format!("at-{}", &u[..12])
    });
    if !is_valid_id(&id) {
        return bad_request(Some("id"), "id: must match [A-Za-z0-9._-]{1,64}");
    }
    let token = format!(
        "bgadm-{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let digest = hash_key(&token);
    let now = st.clock.now_micros();
    let (db, actor, i2, tenant) = (
        c.plane.db().clone(),
        c.who.actor(),
        id.clone(),
        b.tenant.clone(),
    );
    let check = c.plane.recheck();
    let written = c
        .plane
        .run(async move {
            writes::create_token(
                (&db, &check),
                &actor,
                now,
                &i2,
                &digest,
                (role, tenant.as_deref()),
            )
            .await
        })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, &format!("admin token {id:?}")),
    };
    c.plane.caught_up(version).await;
    json_response(
        StatusCode::CREATED,
        json!({ "id": id, "role": role.name(), "tenant": b.tenant, "token": token }),
    )
}

/// `GET /admin/v1/admin_tokens`: ids, roles and scopes (never digests),
/// by id, paged (`?limit=`, `?after=`).
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = c.unscoped() {
        return r;
    }
    let page = match query::Params::of(&uri, &["limit", "after"]).and_then(|q| Page::of(&q)) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let data: Vec<_> = c
        .plane
        .snapshot()
        .tokens
        .iter()
        .map(|t| {
            let v = json!({ "id": t.id, "role": t.role.name(), "tenant": t.tenant });
            (t.id.clone(), v)
        })
        .collect();
    json_response(StatusCode::OK, paged(data, &page))
}

/// `POST /admin/v1/admin_tokens/{id}/revoke`.
pub async fn revoke(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = root_only(&c) {
        return r;
    }
    let now = st.clock.now_micros();
    let (db, actor, i2) = (c.plane.db().clone(), c.who.actor(), id.clone());
    let check = c.plane.recheck();
    let written = c
        .plane
        .run(async move { writes::revoke_token((&db, &check), &actor, now, &i2).await })
        .await;
    match written {
        Ok(version) => {
            c.plane.caught_up(version).await;
            json_response(StatusCode::OK, json!({ "revoked": id }))
        }
        Err(writes::WriteError::NotFound) => not_found("admin token"),
        Err(e) => write_failed(&e, "admin token"),
    }
}

/// `GET /admin/v1/audit`: newest first; unscoped tokens only.
pub async fn audit(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = c.unscoped() {
        return r;
    }
    // `?limit=` (1..=1000, default 100), `?before=` (a `seq`).
    let q = query::Params::of(&uri, &["limit", "before"]);
    let (limit, before) = match q.and_then(|q| {
        let limit = q.number("limit", 1..=1000)?.unwrap_or(100);
        Ok((limit as i64, q.number("before", 0..=i64::MAX as u64)?))
    }) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let before = before.map(|b| b as i64);
    let db = c.plane.db().clone();
    let rows = c
        .plane
        .run(async move { Ok(writes::audit(&db, before, limit).await?) })
        .await;
    match rows {
        Ok(rows) => {
            let next = (rows.len() as i64 == limit)
                .then(|| rows.last().map(|r| r.seq))
                .flatten();
            json_response(StatusCode::OK, json!({ "data": rows, "next_before": next }))
        }
        Err(_) => unavailable(),
    }
}
