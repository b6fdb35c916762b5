//! `POST /v1/messages/count_tokens` (Anthropic API reference, "Count
//! tokens in a message"): answered from the gateway's own estimator, never
//! sent upstream. The count is the estimate a Messages request with this
//! body would reserve for its input: an upper-bound estimate (the model's
//! `token_ratio`, images and PDFs at their published maxima), not
//! Anthropic's exact count. It is charged to the caller's request budgets
//! only (RPM, requests per day): no token is spent.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::{json, Value};

use super::authenticate::{self, Caller};
use super::context::RequestContext;
use super::decode::read_body;
use super::prepare::invalid;
use crate::budget::{Actual, BudgetName, ReserveOutcome, Scope, Settlement};
use crate::config::ModelId;
use crate::dialects::Dialect;
use crate::estimate::messages;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;

/// Answers one count request.
pub async fn count_tokens(st: Arc<AppState>, headers: HeaderMap, body: Body) -> Response {
    let mut cx = RequestContext::new(st, Dialect::Messages, &headers)
        .at("POST", "/v1/messages/count_tokens");
    let answer = count(&mut cx, &headers, body).await;
    super::conclude(cx, answer)
}

async fn count(
    cx: &mut RequestContext,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = authenticate::authenticate(cx, headers)?;
    let policy = cx.policy.clone();
    let bytes = read_body(body, policy.server.max_body_bytes, headers).await?;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(invalid(None, "The request body must be a JSON object."));
    };
    let name = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(invalid(Some("model"), "model: Field required")),
    };
    let key = policy.key(caller.tenant, caller.key);
    let model_id = policy
        .model_id(&name)
        .filter(|_| key.allows(&name))
        .ok_or_else(|| super::prepare::not_found(&policy, key, Dialect::Messages, &name))?;
    let model = policy.model_at(model_id);
    if !model.messages {
        return Err(ApiError::ModelElsewhere {
            model: name,
            messages: false,
        });
    }
    // The same betas as on /v1/messages (Claude Code sends its set here too).
    super::prepare::check_betas(model, &super::prepare::anthropic_betas(headers)?)?;
    let input = messages::input_tokens(&body, model.encoding, model.token_ratio).map_err(|e| {
        // Input estimation never compares with a capacity: only `Invalid` comes back.
        let tenant = policy.tenant(caller.tenant).name.as_str();
        ApiError::from_estimate(e, |_| (Scope::Tenant(tenant.into()), BudgetName::Tpm))
    })?;
    charge_request_once(
        cx,
        &caller,
        model_id,
        json!({ "input_tokens": input }),
        "application/json",
    )
    .await
}

/// Charges a count request once to the caller's request budgets (RPM,
/// requests per day; no token is spent) and answers `answer` with the
/// dialect's rate-limit headers. Shared by every dialect's count route.
pub(super) async fn charge_request_once(
    cx: &mut RequestContext,
    caller: &Caller,
    model_id: ModelId,
    answer: Value,
    content_type: &'static str,
) -> Result<Response, ApiError> {
    let policy = cx.policy.clone();
    let dialect = cx.dialect;
    let plan = cx
        .st
        .budget_plan(&policy, caller.tenant, caller.key, model_id);
    let reserve = super::admit::request_count_reservation(cx, &plan, |s| {
        matches!(s.name, BudgetName::Rpm | BudgetName::RequestsPerDay)
    });
    let id = reserve.id.clone();
    cx.finish.reservation_id = Some(id.clone());
    let now = cx.st.clock.now_micros();
    let admission = match cx.st.store.reserve(&reserve).await? {
        ReserveOutcome::Admitted(a) => a,
        ReserveOutcome::Denied(denial) => {
            return Err(ApiError::RateLimited {
                headers: dialect.rate_limit_headers(std::slice::from_ref(&denial.state), now),
                denial: Box::new(denial),
                concurrency_hint_micros: policy.server.concurrency_retry.as_micros() as u64,
            })
        }
        ReserveOutcome::Impossible(i) => return Err(ApiError::Impossible(Box::new(i))),
        ReserveOutcome::Voided => {
            tracing::warn!(reservation_id = %id, "count reservation not admitted: its id was voided");
            return Err(ApiError::StoreUnavailable);
        }
        // These reservations name no run.
        ReserveOutcome::RunConflict(run) => return Err(ApiError::RunConflict { run }),
    };
    let done = Settlement {
        actual_tokens: 0,
        upstream_failed: false,
        actual: Actual::PerSpec(vec![1; reserve.common.len()]),
    };
    cx.st.store.settle(&id, &done).await?;
    let mut r = Response::new(Body::from(answer.to_string()));
    *r.headers_mut() = dialect.rate_limit_headers(&admission.budgets, now);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(r)
}
