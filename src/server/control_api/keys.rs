//! `/admin/v1/tenants/{tenant}/keys` and `/admin/v1/keys`: keys generated
//! by the gateway (the secret is in the answer to create and rotate only;
//! the database keeps its SHA-256), with alias, owner metadata, expiry,
//! allowed models and per-key limits; rotation with an overlap during
//! which the old secret still works; revocation.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::tenants::merge_patch;
use super::{
    bad_request, body_value, conflict, not_found, paged, query, validate, write_failed, Caller,
    Page,
};
use crate::config::{hash_key, Policy};
use crate::control::runtime::{Entity, RuntimeKey, Secret, Snapshot};
use crate::control::writes;
use crate::gateway::AppState;
use crate::server::admin::json_response;

use super::key_body::{fields, new_secret, view, KeyBody, MAX_OVERLAP_SECS};

/// Validates `snap` (with the key `(tenant, id)` in it) as the config file
/// would: the key's own errors relative to the body.
fn validate_key(
    c: &Caller,
    snap: &Snapshot,
    (tenant, id): (&str, &str),
) -> Result<Policy, Response> {
    let own = Entity::Key {
        tenant: tenant.to_string(),
        id: id.to_string(),
    };
    validate(&c.plane.file(), snap, &c.plane.quarantined(), Some(&own))
}

/// `POST /admin/v1/tenants/{tenant}/keys`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    if let Err(r) = c.writer().and_then(|()| c.check_sees(&policy, &tenant)) {
        return r;
    }
    if !policy.tenants.iter().any(|t| t.name == tenant) {
        return not_found("tenant");
    }
    let b: KeyBody = match body_value(&body).and_then(|v| {
        serde_json::from_value(v)
            .map_err(|e| bad_request(None, &format!("The body is not a key: {e}")))
    }) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let f = match fields(&policy, &b) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let now = st.clock.now_micros();
    if f.expires_at.is_some_and(|e| e <= now) {
        return bad_request(Some("expires_at"), "expires_at: must be in the future");
    }
    let id = b.id.clone().unwrap_or_else(|| {
        let u = uuid::Uuid::new_v4().simple().to_string();
        format!("k-{}", &u[..12])
    });
    let secret = new_secret();
    let digest = hash_key(&secret);
    let mut snap = (*c.plane.snapshot()).clone();
    let in_file = c
        .plane
        .file()
        .0
        .tenants
        .iter()
        .any(|t| t.name == tenant && t.keys.iter().any(|k| k.id == id));
    if in_file || snap.keys.iter().any(|k| k.tenant == tenant && k.id == id) {
        return conflict(&format!("Key {id:?} of tenant {tenant:?} already exists."));
    }
    let key = RuntimeKey {
        tenant: tenant.clone(),
        id: id.clone(),
        alias: f.alias.clone(),
        owner: f.owner.clone(),
        limits: f.limits.clone(),
        allowed_models: f.allowed_models.clone(),
        expires_at: f.expires_at,
        revoked_at: None,
        created_at: now,
        secrets: vec![Secret {
            sha256: digest.clone(),
            retires_at: None,
        }],
    };
    snap.keys.push(key.clone());
    if let Err(r) = validate_key(&c, &snap, (&tenant, &id)) {
        return r;
    }
    let (db, actor, check) = (c.plane.db().clone(), c.who.actor(), c.recheck(&[&tenant]));
    let (t2, i2) = (tenant.clone(), id.clone());
    let written = c
        .plane
        .run(async move {
            writes::create_key((&db, &check), &actor, now, (&t2, &i2), &digest, &f).await
        })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, &format!("key {id:?} of tenant {tenant:?}")),
    };
    c.plane.caught_up(version).await;
    let mut v = view(&key);
    v["secret"] = json!(secret);
    json_response(StatusCode::CREATED, v)
}

/// The runtime key `(tenant, id)` the caller may see.
fn find(c: &Caller, policy: &Policy, (tenant, id): (&str, &str)) -> Result<RuntimeKey, Response> {
    c.check_sees(policy, tenant)?;
    c.plane
        .snapshot()
        .keys
        .iter()
        .find(|k| k.tenant == tenant && k.id == id)
        .cloned()
        .ok_or_else(|| not_found("key"))
}

/// `GET /admin/v1/tenants/{tenant}/keys/{key}`.
pub async fn read(
    State(st): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match find(&c, &st.policy.load_full(), (&tenant, &id)) {
        Ok(k) => json_response(StatusCode::OK, view(&k)),
        Err(r) => r,
    }
}

/// `?tenant=` (`/admin/v1/keys` only), `?alias=`, `?revoked=` of the key
/// list.
pub struct KeyFilter {
    tenant: Option<String>,
    alias: Option<String>,
    revoked: Option<bool>,
    page: Page,
}

impl KeyFilter {
    fn of(uri: &OriginalUri, known: &[&str]) -> Result<KeyFilter, Response> {
        let q = query::Params::of(uri, known)?;
        Ok(KeyFilter {
            tenant: q.text("tenant"),
            alias: q.text("alias"),
            revoked: q.boolean("revoked")?,
            page: Page::of(&q)?,
        })
    }
}

fn list_keys(c: &Caller, policy: &Policy, f: &KeyFilter) -> Value {
    let items = c
        .plane
        .snapshot()
        .keys
        .iter()
        .filter(|k| c.sees(policy, &k.tenant))
        .filter(|k| f.tenant.as_deref().is_none_or(|t| k.tenant == t))
        .filter(|k| {
            f.alias
                .as_deref()
                .is_none_or(|a| k.alias.as_deref() == Some(a))
        })
        .filter(|k| f.revoked.is_none_or(|r| r == k.revoked_at.is_some()))
        .map(|k| (format!("{}/{}", k.tenant, k.id), view(k)))
        .collect();
    paged(items, &f.page)
}

/// `GET /admin/v1/keys` (cursor: `tenant/id`).
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let known = ["tenant", "alias", "revoked", "limit", "after"];
    let c = Caller::of(&st, &headers, &uri);
    match c.and_then(|c| Ok((c, KeyFilter::of(&uri, &known)?))) {
        Ok((c, f)) => json_response(StatusCode::OK, list_keys(&c, &st.policy.load_full(), &f)),
        Err(r) => r,
    }
}

/// `GET /admin/v1/tenants/{tenant}/keys`.
pub async fn list_of_tenant(
    State(st): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut f = match KeyFilter::of(&uri, &["alias", "revoked", "limit", "after"]) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    if let Err(r) = c.check_sees(&policy, &tenant) {
        return r;
    }
    f.tenant = Some(tenant);
    json_response(StatusCode::OK, list_keys(&c, &policy, &f))
}

/// `PATCH /admin/v1/tenants/{tenant}/keys/{key}`: alias, owner, limits,
/// allowed models, expiry (a JSON merge patch).
pub async fn update(
    State(st): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    uri: OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    let before = match c.writer().and_then(|()| find(&c, &policy, (&tenant, &id))) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let patch = match body_value(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let old = KeyBody {
        id: Some(id.clone()),
        alias: before.alias.clone(),
        owner: Some(before.owner.clone()),
        limits: before.limits.clone(),
        allowed_models: before.allowed_models.clone(),
        expires_at: before.expires_at.map(|t| (t / 1_000_000) as i64),
    };
    let mut v = serde_json::to_value(&old).unwrap_or(Value::Null);
    merge_patch(&mut v, patch);
    let b: KeyBody = match serde_json::from_value(v) {
        Ok(b) => b,
        Err(e) => return bad_request(None, &format!("The body is not a key: {e}")),
    };
    if b.id.as_deref() != Some(id.as_str()) {
        return bad_request(Some("id"), "id: a key cannot be renamed");
    }
    let (f, old_f) = match (fields(&policy, &b), fields(&policy, &old)) {
        (Ok(f), Ok(o)) => (f, o),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let mut snap = (*c.plane.snapshot()).clone();
    if let Some(k) = snap
        .keys
        .iter_mut()
        .find(|k| k.tenant == tenant && k.id == id)
    {
        k.limits = f.limits.clone();
        k.allowed_models = f.allowed_models.clone();
        k.expires_at = f.expires_at;
    }
    if let Err(r) = validate_key(&c, &snap, (&tenant, &id)) {
        return r;
    }
    let now = st.clock.now_micros();
    let (db, actor, check) = (c.plane.db().clone(), c.who.actor(), c.recheck(&[&tenant]));
    let (t2, i2) = (tenant.clone(), id.clone());
    let written =
        c.plane
            .run(async move {
                writes::update_key((&db, &check), &actor, now, (&t2, &i2), &old_f, &f).await
            })
            .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, "key"),
    };
    c.plane.caught_up(version).await;
    match find(&c, &st.policy.load_full(), (&tenant, &id)) {
        Ok(k) => json_response(StatusCode::OK, view(&k)),
        Err(r) => r,
    }
}

/// `{"overlap_secs": N}` of a rotation (default 3600).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Rotation {
    overlap_secs: Option<u64>,
}

/// `POST /admin/v1/tenants/{tenant}/keys/{key}/rotate`: a new secret; the
/// old one keeps working for `overlap_secs`.
pub async fn rotate(
    State(st): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    uri: OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    if let Err(r) = c.writer().and_then(|()| find(&c, &policy, (&tenant, &id))) {
        return r;
    }
    let r: Rotation = if body.is_empty() {
        Rotation::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return bad_request(None, &format!("The body is not a rotation: {e}")),
        }
    };
    let overlap = r.overlap_secs.unwrap_or(3600);
    if overlap > MAX_OVERLAP_SECS {
        return bad_request(
            Some("overlap_secs"),
            &format!("overlap_secs: at most {MAX_OVERLAP_SECS}"),
        );
    }
    let secret = new_secret();
    let digest = hash_key(&secret);
    let now = st.clock.now_micros();
    let (db, actor, check) = (c.plane.db().clone(), c.who.actor(), c.recheck(&[&tenant]));
    let (t2, i2) = (tenant.clone(), id.clone());
    let written = c
        .plane
        .run(async move {
            writes::rotate_key(
                (&db, &check),
                &actor,
                now,
                (&t2, &i2),
                &digest,
                overlap * 1_000_000,
            )
            .await
        })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, "key"),
    };
    c.plane.caught_up(version).await;
    match find(&c, &st.policy.load_full(), (&tenant, &id)) {
        Ok(k) => {
            let mut v = view(&k);
            v["secret"] = json!(secret);
            json_response(StatusCode::OK, v)
        }
        Err(r) => r,
    }
}

/// `POST /admin/v1/tenants/{tenant}/keys/{key}/revoke`.
pub async fn revoke(
    State(st): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    if let Err(r) = c.writer().and_then(|()| find(&c, &policy, (&tenant, &id))) {
        return r;
    }
    let now = st.clock.now_micros();
    let (db, actor, check) = (c.plane.db().clone(), c.who.actor(), c.recheck(&[&tenant]));
    let (t2, i2) = (tenant.clone(), id.clone());
    let written = c
        .plane
        .run(async move { writes::revoke_key((&db, &check), &actor, now, (&t2, &i2)).await })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, "key (or it is already revoked)"),
    };
    c.plane.caught_up(version).await;
    match find(&c, &st.policy.load_full(), (&tenant, &id)) {
        Ok(k) => json_response(StatusCode::OK, view(&k)),
        Err(r) => r,
    }
}
