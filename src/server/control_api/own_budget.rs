//! `GET /v1/budget`: a key holder reads its own budgets with its own key,
//! no admin token: the budgets its requests reserve on (its key, its
//! tenant, the tenant × model limits, every ancestor's), each with what is
//! left and when it resets, in tokens and dollars. Other keys of the
//! tenant are not shown.
//!
//! The read costs a store call and is not metered: each key's answer is
//! kept for at most [`MAX_AGE_MICROS`] ([`Answers`]), so a client polling
//! in a loop costs the store at most one read a second per key. The
//! answer says how old it is (`age_micros`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::admission::plan::scope_budgets;
use crate::budget::Scope;
use crate::dialects::Dialect;
use crate::server::admin::{ancestor_specs, budgets_body, json_response};
use crate::server::AppState;

/// The oldest answer served from [`Answers`], µs.
pub const MAX_AGE_MICROS: u64 = 1_000_000;

/// One key's last answer.
struct Answer {
    /// UTC µs of its store read.
    at: u64,
    /// The policy it was read under: a reload's new limits show at once.
    policy_version: String,
    body: Value,
}

/// The last answer per (tenant, key id), at most one entry per key of the
/// policy: past that (keys deleted since), entries older than
/// [`MAX_AGE_MICROS`] go, and if none is, all do.
#[derive(Default)]
pub struct Answers {
    by_key: Mutex<HashMap<(String, String), Answer>>,
}

impl Answers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Answer>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer of `key` read under `version` at most [`MAX_AGE_MICROS`]
    /// before `now`, with its age.
    fn fresh(&self, key: &(String, String), version: &str, now: u64) -> Option<(Value, u64)> {
        let answers = self.lock();
        let a = answers.get(key)?;
        let age = now.checked_sub(a.at)?;
        (age <= MAX_AGE_MICROS && a.policy_version == version).then(|| (a.body.clone(), age))
    }

    fn keep(&self, key: (String, String), answer: Answer, keys_in_policy: usize) {
        let mut answers = self.lock();
        if !answers.contains_key(&key) && answers.len() >= keys_in_policy.max(1) {
            let now = answer.at;
            answers.retain(|_, a| now.saturating_sub(a.at) <= MAX_AGE_MICROS);
            if answers.len() >= keys_in_policy.max(1) {
                answers.clear();
            }
        }
        answers.insert(key, answer);
    }

    /// Answers kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No answer kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

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
    let cache_key = (tenant.name.clone(), key.id.clone());
    if let Some((body, age)) = st.own_budgets.fresh(&cache_key, &policy.version, now) {
        return with_age(body, age);
    }
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
    let body = match budgets_body(&st, &policy, ("tenant", name), specs, ancestors).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
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
