//! `GET /v1/budget`: a key holder reads its own budgets with its own key,
//! no admin token: the budgets its requests reserve on (its key, its
//! tenant, the tenant × model limits, every ancestor's), each with what is
//! left and when it resets, in tokens and dollars. Other keys of the
//! tenant are not shown.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use crate::dialects::Dialect;
use crate::reservation::plan::scope_budgets;
use crate::reserve::Scope;
use crate::server::admin::{ancestor_specs, budgets_with_ancestors};
use crate::server::AppState;

/// `GET /v1/budget`.
pub async fn read(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let dialect = Dialect::ChatCompletions;
    let policy = st.policy.load_full();
    let now = st.clock.now_micros();
    let caller =
        match crate::lifecycle::authenticate::caller(&policy, now, dialect.key_headers(), &headers)
        {
            Ok(c) => c,
            Err(e) => return e.respond(dialect),
        };
    let tenant = policy.tenant(caller.tenant);
    let key = policy.key(caller.tenant, caller.key);
    let ks = AppState::key_space(&policy);
    let name = tenant.name.as_str();
    let mut specs = scope_budgets(
        &ks,
        Scope::Key(name.into(), key.id.as_str().into()),
        &key.limits,
        true,
    );
    specs.extend(scope_budgets(
        &ks,
        Scope::Tenant(name.into()),
        &tenant.limits,
        true,
    ));
    for (model, limits) in &tenant.model_limits {
        specs.extend(scope_budgets(
            &ks,
            Scope::TenantModel(name.into(), model.as_str().into()),
            limits,
            true,
        ));
    }
    let ancestors = ancestor_specs(&policy, tenant);
    budgets_with_ancestors(&st, &policy, ("tenant", name), specs, ancestors).await
}
