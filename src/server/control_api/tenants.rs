//! `/admin/v1/tenants`: create, read, list (paged, filtered), update (JSON
//! merge patch, RFC 7386) and delete runtime tenants. Tenants of the
//! config file are listed and read too (`"source": "file"`) but changed
//! only in the file.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::{
    bad_request, body_value, conflict, forbidden, forbidden_at, not_found, paged, query, validate,
    within_parent, write_failed, Caller, Page,
};
use crate::config::raw::RawTenant;
use crate::config::Policy;
use crate::control::runtime::{Entity, RuntimeTenant, Snapshot};
use crate::control::writes;
use crate::gateway::AppState;
use crate::server::admin::json_response;

/// `?parent=`, `?prefix=`, `?source=` (`file`, `api`) of the tenant list.
struct Filter {
    parent: Option<String>,
    prefix: Option<String>,
    source: Option<String>,
    page: Page,
}

impl Filter {
    fn of(uri: &OriginalUri) -> Result<Filter, Response> {
        let q = query::Params::of(uri, &["parent", "prefix", "source", "limit", "after"])?;
        Ok(Filter {
            parent: q.text("parent"),
            prefix: q.text("prefix"),
            source: q.one_of("source", &["file", "api"])?,
            page: Page::of(&q)?,
        })
    }
}

/// A tenant as the API shows it: its fields as the config file writes
/// them (no key digests), where it is defined, its key ids.
fn view(
    policy: &Policy,
    snap: &Snapshot,
    file: &crate::config::raw::RawConfig,
    name: &str,
) -> Option<Value> {
    let t = policy.tenants.iter().find(|t| t.name == name)?;
    let keys: Vec<&str> = t.keys.iter().map(|k| k.id.as_str()).collect();
    // The file's first: a runtime tenant of the same name is quarantined.
    let (mut v, source) = match file.tenants.iter().find(|r| r.name == name) {
        Some(raw) => {
            let mut raw = raw.clone();
            raw.keys.clear();
            (serde_json::to_value(&raw).unwrap_or(Value::Null), "file")
        }
        None => {
            let r = snap.tenants.iter().find(|r| r.spec.name == name)?;
            let mut v = serde_json::to_value(&r.spec).unwrap_or(Value::Null);
            // Unix seconds, as a key's timestamps (stored in µs).
            v["created_at"] = json!(r.created_at / 1_000_000);
            v["updated_at"] = json!(r.updated_at / 1_000_000);
            (v, "api")
        }
    };
    v["source"] = json!(source);
    v["keys"] = json!(keys);
    super::strip_nulls(&mut v);
    Some(v)
}

/// `GET /admin/v1/tenants`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let f = match Filter::of(&uri) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    let snap = c.plane.snapshot();
    let (file, _) = c.plane.file();
    let items = policy
        .tenants
        .iter()
        .filter(|t| c.sees(&policy, &t.name))
        .filter(|t| f.prefix.as_deref().is_none_or(|p| t.name.starts_with(p)))
        .filter(|t| {
            f.parent
                .as_deref()
                .is_none_or(|p| t.parent.is_some_and(|i| policy.tenants[i].name == p))
        })
        .filter_map(|t| Some((t.name.clone(), view(&policy, &snap, &file, &t.name)?)))
        .filter(|(_, v)| f.source.as_deref().is_none_or(|s| v["source"] == s))
        .collect();
    json_response(StatusCode::OK, paged(items, &f.page))
}

/// `GET /admin/v1/tenants/{tenant}`.
pub async fn read(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    if let Err(r) = c.check_sees(&policy, &name) {
        return r;
    }
    match view(&policy, &c.plane.snapshot(), &c.plane.file().0, &name) {
        Some(v) => json_response(StatusCode::OK, v),
        None => not_found("tenant"),
    }
}

/// A tenant body: the config file's tenant fields, without `keys`.
fn parse_tenant(v: Value) -> Result<RawTenant, Response> {
    if v.get("keys").is_some_and(|k| k != &json!([])) {
        return Err(bad_request(
            Some("keys"),
            "keys: keys are created through POST /admin/v1/tenants/{tenant}/keys",
        ));
    }
    serde_json::from_value(v)
        .map_err(|e| bad_request(None, &format!("The body is not a tenant: {e}")))
}

/// The tenant-scope rules of a change to `t` (`before`: its current form):
/// a scoped token keeps its own tenant's parent and gives others a
/// parent inside its subtree.
fn scope_allows(
    c: &Caller,
    policy: &Policy,
    t: &RawTenant,
    before: Option<&RawTenant>,
) -> Result<(), Response> {
    let Some(root) = c.who.scope() else {
        return Ok(());
    };
    if t.name == root {
        if before.map(|b| &b.parent) != Some(&t.parent) {
            return Err(forbidden(
                "A tenant-scoped admin token cannot move its own tenant.",
            ));
        }
        return Ok(());
    }
    match &t.parent {
        Some(p) if c.sees(policy, p) => Ok(()),
        _ => Err(forbidden(&format!(
            "This admin token is limited to tenant {root:?}: a tenant it creates or moves needs a parent in that subtree."
        ))),
    }
}

/// What a scoped token's change to `t` (`exists`: an update) must find
/// in its subtree under the lock: `t`'s parent, what [`scope_allows`]
/// checked, and `t` itself when it exists; only `t` when it is the
/// token's own tenant (whose parent, unchanged, lies outside).
fn touched<'t>(c: &Caller, t: &'t RawTenant, exists: bool) -> Vec<&'t str> {
    if c.who.scope() == Some(t.name.as_str()) {
        return vec![&t.name];
    }
    let own = exists.then_some(t.name.as_str());
    own.into_iter().chain(t.parent.as_deref()).collect()
}

/// For a scoped token: no limit of `name` above its parent's in `candidate`.
fn parent_bound(c: &Caller, candidate: &Policy, name: &str) -> Result<(), Response> {
    if c.who.scope().is_none() {
        return Ok(());
    }
    let Some(t) = candidate.tenants.iter().find(|t| t.name == name) else {
        return Ok(());
    };
    let Some(p) = t.parent.map(|i| &candidate.tenants[i]) else {
        return Ok(());
    };
    within_parent(&t.limits, &p.limits, &p.name, "limits")
}

/// For a scoped token: the change to `name` (`after`, against the served
/// `before`) loosens nothing that binds its own tenant.
fn root_bound(
    c: &Caller,
    name: &str,
    before: (&Snapshot, &Policy),
    after: (&Snapshot, &Policy),
) -> Result<(), Response> {
    let Some(root) = c.who.scope() else {
        return Ok(());
    };
    match writes::loosened(root, name, before, after) {
        Some(l) => Err(forbidden_at(&l)),
        None => Ok(()),
    }
}

/// `POST /admin/v1/tenants`.
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
    let t = match c
        .writer()
        .and_then(|()| body_value(&body))
        .and_then(parse_tenant)
    {
        Ok(t) => t,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    if let Err(r) = scope_allows(&c, &policy, &t, None) {
        return r;
    }
    let now = st.clock.now_micros();
    let file = c.plane.file();
    let mut snap = (*c.plane.snapshot()).clone();
    if snap.tenants.iter().any(|r| r.spec.name == t.name) {
        return conflict(&format!("Tenant {:?} already exists.", t.name));
    }
    if file.0.tenants.iter().any(|r| r.name == t.name) {
        return conflict(&format!(
            "Tenant {:?} is defined in the config file.",
            t.name
        ));
    }
    snap.tenants.push(RuntimeTenant {
        spec: t.clone(),
        created_at: now,
        updated_at: now,
    });
    let own = Entity::Tenant {
        name: t.name.clone(),
    };
    let candidate = match validate(&file, &snap, &c.plane.quarantined(), Some(&own)) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if let Err(r) = parent_bound(&c, &candidate, &t.name).and_then(|()| {
        root_bound(
            &c,
            &t.name,
            (&c.plane.snapshot(), &policy),
            (&snap, &candidate),
        )
    }) {
        return r;
    }
    let (db, actor, spec) = (c.plane.db().clone(), c.who.actor(), t.clone());
    let mut check = c.recheck(&touched(&c, &t, false));
    if let Some(s) = check.scope.as_mut() {
        s.bounded = Some(t.name.clone());
    }
    let written = c
        .plane
        .run(async move { writes::create_tenant((&db, &check), &actor, now, &spec).await })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, &format!("tenant {:?}", t.name)),
    };
    answer_after_write(&st, &c, version, &t.name, StatusCode::CREATED).await
}

/// Refreshes this gateway from the database, then shows tenant `name`.
async fn answer_after_write(
    st: &AppState,
    c: &Caller,
    version: i64,
    name: &str,
    status: StatusCode,
) -> Response {
    c.plane.caught_up(version).await;
    let policy = st.policy.load_full();
    let v = view(&policy, &c.plane.snapshot(), &c.plane.file().0, name)
        .unwrap_or(json!({ "name": name }));
    json_response(status, v)
}

/// The runtime tenant `name`, or the answer (404; 409 for a file tenant).
fn runtime_tenant(c: &Caller, policy: &Policy, name: &str) -> Result<(usize, RawTenant), Response> {
    c.check_sees(policy, name)?;
    let snap = c.plane.snapshot();
    match snap.tenants.iter().position(|r| r.spec.name == name) {
        Some(i) => Ok((i, snap.tenants[i].spec.clone())),
        None if policy.tenants.iter().any(|t| t.name == name) => Err(conflict(&format!(
            "Tenant {name:?} is defined in the config file; change it there."
        ))),
        None => Err(not_found("tenant")),
    }
}

/// RFC 7386: `patch`'s members replace `target`'s, `null` removes one.
pub fn merge_patch(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge_patch(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other,
    }
}

/// `PATCH /admin/v1/tenants/{tenant}`.
pub async fn update(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    let (pos, before) = match c.writer().and_then(|()| runtime_tenant(&c, &policy, &name)) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let patch = match body_value(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if patch.get("name").is_some_and(|n| n != &json!(name)) {
        return bad_request(
            Some("name"),
            "name: a tenant cannot be renamed (create another one)",
        );
    }
    let mut v = serde_json::to_value(&before).unwrap_or(Value::Null);
    merge_patch(&mut v, patch);
    let t = match parse_tenant(v) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if let Err(r) = scope_allows(&c, &policy, &t, Some(&before)) {
        return r;
    }
    let now = st.clock.now_micros();
    let file = c.plane.file();
    let mut snap = (*c.plane.snapshot()).clone();
    snap.tenants[pos].spec = t.clone();
    snap.tenants[pos].updated_at = now;
    let own = Entity::Tenant { name: name.clone() };
    let candidate = match validate(&file, &snap, &c.plane.quarantined(), Some(&own)) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if let Err(r) = parent_bound(&c, &candidate, &t.name).and_then(|()| {
        root_bound(
            &c,
            &t.name,
            (&c.plane.snapshot(), &policy),
            (&snap, &candidate),
        )
    }) {
        return r;
    }
    let (db, actor, spec) = (c.plane.db().clone(), c.who.actor(), t.clone());
    let mut check = c.recheck(&touched(&c, &t, true));
    if let Some(s) = check.scope.as_mut() {
        s.bounded = Some(t.name.clone());
    }
    let written = c
        .plane
        .run(async move { writes::update_tenant((&db, &check), &actor, now, &before, &spec).await })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, &format!("tenant {name:?}")),
    };
    answer_after_write(&st, &c, version, &name, StatusCode::OK).await
}

/// `DELETE /admin/v1/tenants/{tenant}`: the tenant and its keys; refused
/// (409) while a tenant names it as parent.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    let (pos, before) = match c.writer().and_then(|()| runtime_tenant(&c, &policy, &name)) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if c.who.scope() == Some(name.as_str()) {
        return forbidden("A tenant-scoped admin token cannot delete its own tenant.");
    }
    let file = c.plane.file();
    let mut snap = (*c.plane.snapshot()).clone();
    snap.tenants.remove(pos);
    snap.keys.retain(|k| k.tenant != name);
    if let Err(r) = validate(&file, &snap, &c.plane.quarantined(), None) {
        return r;
    }
    let now = st.clock.now_micros();
    let (db, actor, check) = (c.plane.db().clone(), c.who.actor(), c.recheck(&[&name]));
    let written = c
        .plane
        .run(async move { writes::delete_tenant((&db, &check), &actor, now, &before).await })
        .await;
    let version = match written {
        Ok(v) => v,
        Err(e) => return write_failed(&e, &format!("tenant {name:?}")),
    };
    c.plane.caught_up(version).await;
    json_response(StatusCode::OK, json!({ "deleted": name }))
}
