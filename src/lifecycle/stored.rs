//! The Responses routes that produce no model output, composed from the
//! same phases: `GET`/`DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`, `GET /v1/responses/{id}/input_items`
//! (proxied to the recorded deployment, for the owner only) and
//! `POST /v1/responses/input_tokens` (answered by the gateway's own
//! estimator, no upstream call). They charge the tenant's request budgets
//! (requests per minute and per day, concurrency), never its token budgets.
//!
//! An id that is not `[A-Za-z0-9_-]{1,128}`, unknown, or another tenant's
//! is a 404 without an upstream call (and, for a bad id, without a
//! lookup). A `DELETE` by the owner also deletes the record.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;

use super::authenticate::{authenticate, Caller};
use super::context::RequestContext;
use super::prepare;
use super::settle::void;
use crate::admission::amounts::{self, Budgets};
use crate::admission::HeldReservation;
use crate::budget::{Actual, Admission, BudgetSpec, ReserveOutcome, Settlement};
use crate::dialects::rate_limit_headers::rate_limit_headers;
use crate::dialects::responses::valid_id;
use crate::dialects::Dialect;
use crate::gateway::error::ApiError;
use crate::gateway::{AppState, BudgetPlan};
use crate::settlement::{Outcome, Settling, Subject};
use crate::upstreams::UpstreamError;

/// An operation on a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredOp {
    /// `GET /v1/responses/{id}`.
    Get,
    /// `DELETE /v1/responses/{id}`.
    Delete,
    /// `POST /v1/responses/{id}/cancel`.
    Cancel,
    /// `GET /v1/responses/{id}/input_items`.
    InputItems,
}

impl StoredOp {
    /// The client's method and the route (a refusal's line names them).
    fn route(self) -> (&'static str, &'static str) {
        match self {
            StoredOp::Get => ("GET", "/v1/responses/{id}"),
            StoredOp::Delete => ("DELETE", "/v1/responses/{id}"),
            StoredOp::Cancel => ("POST", "/v1/responses/{id}/cancel"),
            StoredOp::InputItems => ("GET", "/v1/responses/{id}/input_items"),
        }
    }

    fn method(self) -> reqwest::Method {
        match self {
            StoredOp::Get | StoredOp::InputItems => reqwest::Method::GET,
            StoredOp::Delete => reqwest::Method::DELETE,
            StoredOp::Cancel => reqwest::Method::POST,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            StoredOp::Cancel => "/cancel",
            StoredOp::InputItems => "/input_items",
            _ => "",
        }
    }
}

/// Serves `op` on response `id` (`query`: the client's query string, passed on).
pub async fn stored(
    st: Arc<AppState>,
    headers: HeaderMap,
    id: String,
    op: StoredOp,
    query: Option<String>,
) -> Response {
    let (method, route) = op.route();
    let mut cx = RequestContext::new(st, Dialect::Responses, &headers).at(method, route);
    let result = stored_inner(&mut cx, &headers, &id, op, query).await;
    super::conclude(cx, result)
}

async fn stored_inner(
    cx: &mut RequestContext,
    headers: &HeaderMap,
    id: &str,
    op: StoredOp,
    query: Option<String>,
) -> Result<Response, ApiError> {
    let caller = authenticate(cx, headers)?;
    let not_found = || ApiError::ResponseNotFound(id.to_string(), None);
    if !valid_id(id) {
        return Err(not_found());
    }
    let policy = cx.policy.clone();
    let tenant = policy.tenant(caller.tenant);
    let record = match cx.st.records.get(id).await? {
        Some(r) if r.tenant == tenant.name => r,
        _ => return Err(not_found()),
    };
    let model = policy.model_id(&record.model).ok_or_else(not_found)?;
    let plan = cx.st.budget_plan(&policy, caller.tenant, caller.key, model);
    let deployment = plan
        .upstreams
        .iter()
        .find(|d| policy.deployment(d.upstream).name == record.deployment)
        .map(|d| d.upstream)
        .ok_or_else(not_found)?;
    cx.finish.model = Some(model);
    cx.finish.deployment = Some(deployment);
    let (hold, specs, admission) = charge_requests(cx, &plan).await?;
    let upstream = policy.deployment(deployment);
    let mut rest = format!("/{id}{}", op.suffix());
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        rest.push('?');
        rest.push_str(&q);
    }
    let sent = cx
        .st
        .upstream
        .send_stored(upstream, op.method(), &rest, cx.finish.request_id.header())
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let never_sent = matches!(e, UpstreamError::Connect(_));
            hold.settle(if never_sent {
                void()
            } else {
                requests_only(&specs)
            });
            return Err(ApiError::from(e));
        }
    };
    hold.settle(requests_only(&specs));
    let status = resp.status();
    if op == StoredOp::Delete && status.is_success() {
        cx.st.records.delete(id).await?;
    }
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/json"));
    // Passed on as it arrives (a GET with `stream=true` replays events).
    let mut out = Response::new(Body::from_stream(
        http_body_util::BodyDataStream::new(resp.into_body()).map_err(std::io::Error::other),
    ));
    *out.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    *out.headers_mut() = rate_limit_headers(&admission.budgets);
    out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    Ok(out)
}

/// `POST /v1/responses/input_tokens`: the estimate of a Responses body
/// (its recorded context included), without an upstream call, charged to
/// the request budgets only: answered past a token budget's capacity too.
pub async fn input_tokens(st: Arc<AppState>, headers: HeaderMap, body: Body) -> Response {
    let mut cx = RequestContext::new(st, Dialect::Responses, &headers)
        .at("POST", "/v1/responses/input_tokens");
    let result = async {
        let caller: Caller = authenticate(&mut cx, &headers)?;
        // The count whatever the token budgets' capacity: a body larger
        // than a budget is what a client counts before trimming it.
        let prepared = prepare::prepare_as(
            &mut cx,
            caller,
            &headers,
            body,
            None,
            prepare::Purpose::Count,
        )
        .await?;
        let (hold, specs, admission) = charge_requests(&mut cx, &prepared.plan).await?;
        hold.settle(requests_only(&specs));
        let body = serde_json::json!({
            "object": "response.input_tokens",
            "input_tokens": prepared.estimate.input_tokens,
        });
        let mut r = (StatusCode::OK, axum::Json(body)).into_response();
        r.headers_mut()
            .extend(rate_limit_headers(&admission.budgets));
        Ok::<Response, ApiError>(r)
    }
    .await;
    super::conclude(cx, result)
}

/// Reserves one request on the tenant's request budgets (no token budget,
/// no deployment budget): the hold, its specs and the store's answer.
async fn charge_requests(
    cx: &mut RequestContext,
    plan: &Arc<BudgetPlan>,
) -> Result<(HeldReservation, Vec<BudgetSpec>, Admission), ApiError> {
    let policy = cx.policy.clone();
    let reserve = super::admit::request_count_reservation(cx, plan, |s| s.name.counts_requests());
    let id = reserve.id.clone();
    let (outcome, answered_by) = cx.st.store.reserve_answered(&reserve).await?;
    let admission = match outcome {
        ReserveOutcome::Admitted(a) => a,
        ReserveOutcome::Denied(denial) => {
            return Err(ApiError::RateLimited {
                headers: rate_limit_headers(std::slice::from_ref(&denial.state)),
                denial: Box::new(denial),
                concurrency_hint_micros: policy.server.concurrency_retry.as_micros() as u64,
            })
        }
        ReserveOutcome::Impossible(i) => return Err(ApiError::Impossible(Box::new(i))),
        // A fresh id is never voided; answered as the store failure it stands for.
        ReserveOutcome::Voided => {
            return Err(crate::budget::StoreError::Unavailable("reservation voided".into()).into())
        }
        // These reservations name no run.
        ReserveOutcome::RunConflict(run) => return Err(ApiError::RunConflict { run }),
    };
    cx.finish.reservation_id = Some(id.clone());
    let hold = HeldReservation::new(
        id,
        (cx.st.store.clone(), answered_by),
        reserve.common.iter(),
        cx.st.settlements.clone(),
        0,
        policy.server.slot_lease,
        policy.server.settle_retry,
    )
    .about(Subject {
        tenant: Some(plan.tenant_metrics.clone()),
        ..Subject::default()
    });
    Ok((hold, reserve.common, admission))
}

/// The request counted, no tokens.
fn requests_only(specs: &[BudgetSpec]) -> Settling {
    let settlement = Settlement {
        actual_tokens: 0,
        upstream_failed: false,
        actual: Actual::PerSpec(amounts::nothing_used(std::iter::once(Budgets::plain(
            specs,
        )))),
    };
    Settling::of(settlement, Outcome::Answered)
}
