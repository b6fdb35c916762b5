//! `GET /admin/v1/control/quarantine`: the entities of the control
//! database that this gateway does not serve because they do not merge
//! with the config file and the rest of the database (a key or child
//! whose tenant is gone, a name the file now defines too, what the
//! validator refuses), each with why.

use std::sync::Arc;

use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::json;

use super::Caller;
use crate::control::runtime::Entity;
use crate::gateway::AppState;
use crate::server::admin::json_response;

/// `GET /admin/v1/control/quarantine`. A tenant-scoped token sees the
/// entries of its subtree: keys of its tenants, tenants whose parent is
/// one of them.
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let c = match Caller::of(&st, &headers, &uri) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    let snap = c.plane.snapshot();
    let data: Vec<_> = c
        .plane
        .quarantined()
        .iter()
        .filter(|q| match &q.entity {
            Entity::Key { tenant, .. } => c.sees(&policy, tenant),
            Entity::Tenant { name } => {
                c.who.scope().is_none()
                    || snap
                        .tenants
                        .iter()
                        .find(|t| &t.spec.name == name)
                        .and_then(|t| t.spec.parent.as_deref())
                        .is_some_and(|p| c.sees(&policy, p))
            }
        })
        .cloned()
        .collect();
    json_response(
        StatusCode::OK,
        json!({ "version": snap.version, "data": data }),
    )
}
