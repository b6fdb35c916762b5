//! Stored responses belong to one tenant (DESIGN section 11; the
//! Responses dialect). Every tenant reaches the provider through the
//! gateway's one key, so the gateway keeps its own owner record of each
//! response id it sees ([`crate::budget::records`]) and lets only the
//! owner continue it (`previous_response_id`), only on the deployment that
//! holds it:
//!
//! - [`check_body`] (prepare): what the body refers to, refused when it
//!   cannot be metered or isolated ([`crate::dialects::responses::refuse`]).
//! - [`resolve_previous`] (prepare, a store read of its own before the
//!   reserve): an owned id adds its recorded context to the estimate and
//!   pins the request to the recorded deployment (whose refusal is a 429,
//!   never another deployment, which lacks the state); an unknown id or
//!   another tenant's is a 404 without an upstream call, unless the tenant
//!   forwards unrecorded ids (`allow_unrecorded_previous_response`), then
//!   estimated with `unrecorded_previous_response_tokens` and counted in
//!   `budgetgate_unrecorded_previous_response_total`.
//! - [`OwnerWriter`] (meter): the record written when the response id is
//!   first seen (`response.created`, or the whole body) and again with its
//!   context size (input + output tokens) at settlement.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::authenticate::Caller;
use super::context::RequestContext;
use super::prepare::{invalid, Prepared};
use crate::budget::records::{Records, ResponseRecord};
use crate::config::{DeploymentId, ModelPolicy, Policy};
use crate::dialects::responses::refuse::{self, References, Refusal, Rules};
use crate::dialects::responses::valid_id;
use crate::dialects::Dialect;
use crate::gateway::error::ApiError;

/// What a Responses body refers to, or why it is refused.
pub fn check_body(
    policy: &Policy,
    caller: Caller,
    model: &ModelPolicy,
    body: &Map<String, Value>,
) -> Result<References, ApiError> {
    if !model.responses {
        return Err(invalid(
            Some("model"),
            format!(
                "The model `{}` is not served on /v1/responses by this gateway.",
                model.name
            ),
        ));
    }
    let tenant = policy.tenant(caller.tenant);
    let rules = Rules {
        allowed_objects: &tenant.allowed_provider_objects,
        hosted_tools: &model.hosted_tools,
        allow_background: model.allow_background,
        model: &model.name,
        allowing_line: &|kind| allowing_line(model, kind),
    };
    refuse::check(body, &rules).map_err(|r| match r {
        Refusal::Invalid { param, message } => invalid(Some(&param), message),
        Refusal::UnknownResponse(id) => {
            ApiError::ResponseNotFound(id, Some("previous_response_id"))
        }
    })
}

/// The `hosted_tools` line of `model`'s entry that would allow tool
/// `kind` too: priced in the unit it bills when the gateway can count its
/// uses (beside the model's other priced tools), else the list form.
pub fn allowing_line(model: &ModelPolicy, kind: &str) -> String {
    use crate::money::{format_usd, HostedKind};
    let priced = |k: HostedKind| model.hosted_prices.get(k).map(|m| (k, m));
    match HostedKind::of_tool_type(kind) {
        Some(k) => {
            let mut entries: Vec<String> = HostedKind::ALL
                .into_iter()
                .filter_map(priced)
                .filter(|(p, _)| *p != k)
                .map(|(p, m)| {
                    format!(
                        "{} = {{ per = \"{}\", usd = \"{}\" }}",
                        p.name(),
                        p.unit().name(),
                        format_usd(m as i64)
                    )
                })
                .collect();
            entries.push(format!(
                "{kind} = {{ per = \"{}\", usd = \"…\" }}",
                k.unit().name()
            ));
            format!("hosted_tools = {{ {} }}", entries.join(", "))
        }
        None => {
            let mut names: Vec<String> = model
                .hosted_tools
                .iter()
                .map(|n| format!("{n:?}"))
                .collect();
            names.push(format!("{kind:?}"));
            format!("hosted_tools = [{}]", names.join(", "))
        }
    }
}

/// Looks up `previous_response_id` (see the module docs) and adjusts the
/// estimate and the candidates.
pub async fn resolve_previous(cx: &RequestContext, p: &mut Prepared) -> Result<(), ApiError> {
    let Some(id) = p.references.previous_response_id.clone() else {
        return Ok(());
    };
    let policy = &*cx.policy;
    let tenant = policy.tenant(p.caller.tenant);
    let record = cx.st.records.get(&id).await?;
    let context = match record {
        Some(r) if r.tenant == tenant.name => {
            let at =
                p.candidates.iter().copied().find(|&i| {
                    policy.deployment(p.plan.upstreams[i].upstream).name == r.deployment
                });
            let Some(at) = at else {
                return Err(invalid(
                    Some("previous_response_id"),
                    format!(
                        "The response '{id}' is held by a deployment that does not serve model `{}`; continue it with model `{}`.",
                        policy.model_at(p.model).name,
                        r.model
                    ),
                ));
            };
            p.candidates = vec![at];
            r.context_tokens
        }
        None if tenant.allow_unrecorded_previous_response => {
            ::metrics::counter!("budgetgate_unrecorded_previous_response_total", "tenant" => tenant.name.clone())
                .increment(1);
            tenant.unrecorded_previous_response_tokens
        }
        _ => return Err(ApiError::ResponseNotFound(id, Some("previous_response_id"))),
    };
    let e = &mut p.estimate;
    e.input_tokens = e.input_tokens.saturating_add(context);
    e.total_tokens = e.total_tokens.saturating_add(context);
    Ok(())
}

/// Writes the owner record of the response a request created.
pub struct OwnerWriter {
    records: Arc<Records>,
    record: ResponseRecord,
}

impl OwnerWriter {
    /// The writer for `request` served by `deployment` (Responses only).
    pub fn new(cx: &RequestContext, request: &Prepared, deployment: DeploymentId) -> Option<Self> {
        if cx.dialect != Dialect::Responses {
            return None;
        }
        let policy = &*cx.policy;
        Some(Self {
            records: cx.st.records.clone(),
            record: ResponseRecord {
                tenant: policy.tenant(request.caller.tenant).name.clone(),
                model: policy.model_at(request.model).name.clone(),
                deployment: policy.deployment(deployment).name.clone(),
                context_tokens: 0,
            },
        })
    }

    /// Records `id` with `context_tokens`. In memory at once (so that the
    /// owner can fetch a response while it streams); in Redis in the
    /// background, a failure logged.
    pub fn write(&self, id: &str, context_tokens: u64) {
        if !valid_id(id) {
            tracing::warn!("the upstream named a response with an id the gateway does not accept; not recorded");
            return;
        }
        let record = ResponseRecord {
            context_tokens,
            ..self.record.clone()
        };
        match &*self.records {
            Records::Memory(m) => m.put(id, record),
            Records::Redis(_) => {
                let records = self.records.clone();
                let id = id.to_string();
                tokio::spawn(async move {
                    if let Err(e) = records.put(&id, &record).await {
                        tracing::warn!(response_id = %id, error = %e, "owner record not written");
                    }
                });
            }
        }
    }
}
