//! `GET /v1/budget`: a key holder reads its own budgets with its own key,
//! no admin token: the budgets its requests reserve on (its key, its
//! tenant, the tenant × model limits, every ancestor's), each with what is
//! left and when it resets, in tokens and dollars. Other keys of the
//! tenant are not shown. With `x-budgetgate-run` (and optionally
//! `x-budgetgate-run-limits`), the run's budgets too, under the limits the
//! request states (that answer is never kept: it is per run).
//!
//! The read costs a store call and is not metered: each key's answer is
//! kept for at most a second
//! ([`crate::gateway::own_budgets`]), so a client polling
//! in a loop costs the store at most one read a second per key. The
//! answer says how old it is (`age_micros`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::admission::plan::ancestor_specs;
use crate::admission::plan::scope_budgets;
use crate::budget::Scope;
use crate::dialects::Dialect;
use crate::gateway::own_budgets::Answer;
use crate::gateway::AppState;
use crate::server::admin::{budgets_body, json_response};

fn with_age(mut body: Value, age_micros: u64) -> Response {
    body["age_micros"] = json!(age_micros);
    json_response(StatusCode::OK, body)
}

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
    // A run's budgets, under the limits the request states (the limits
    // header, else the tenant's default): per run, so never kept.
    let run = match headers.contains_key(crate::lifecycle::run::HEADER) {
        false => None,
        true => {
            let planned = crate::lifecycle::run::headers(tenant, key, &headers).and_then(|asked| {
                asked
                    .map(|a| crate::lifecycle::run::plan(&ks, tenant, key, a, None))
                    .transpose()
            });
            match planned {
                Ok(r) => r,
                Err(e) => return e.respond(dialect),
            }
        }
    };
    let cache_key = (tenant.name.clone(), key.id.clone());
    if run.is_none() {
        if let Some((body, age)) = st.own_budgets.fresh(&cache_key, &policy.version, now) {
            return with_age(body, age);
        }
    }
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
    let is_run = run.is_some();
    if let Some(run) = run {
        specs.extend(run.budgets);
    }
    let ancestors = ancestor_specs(&policy, tenant);
    let body = match budgets_body(&st, &policy, ("tenant", name), specs, ancestors).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    if is_run {
        return with_age(body, 0);
    }
    let keys_in_policy = policy.tenants.iter().map(|t| t.keys.len()).sum();
    st.own_budgets.keep(
        cache_key,
        Answer {
            at: now,
            policy_version: policy.version.clone(),
            body: body.clone(),
        },
        keys_in_policy,
    );
    with_age(body, 0)
}
