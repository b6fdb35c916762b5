//! The request path as named phases (DESIGN section 1), one module each:
//!
//! 1. [`authenticate`]: the client's key → tenant and key.
//! 2. [`prepare`]: read, parse, validate, estimate; the budget plan and
//!    the end user ([`end_user`]).
//! 3. [`route`]: the deployments this attempt may use, best first.
//! 4. [`admit`]: one atomic reservation → a held reservation.
//! 5. [`forward`]: the rewritten body ([`rewrite`]) upstream; failures
//!    classified (retry on another deployment, pass on, fail).
//! 6. [`meter`]: usage of a whole answer (what [`whole_answer`] reads of
//!    it); streams go to the relay.
//! 7. [`settle`]: the reservation settled with what was used.
//! 8. [`finish`]: the final log line and request metrics, exactly once on
//!    every path, client disconnect included.
//!
//! [`wait`] (part of admit) lets a refused request wait in the queue for
//! capacity. [`pricing`] (part of prepare) refuses a request a dollar budget
//! cannot price; [`hosted_tools`] (part of prepare) says which provider-side
//! tools a model allows, the calls a body may make and the count sent upstream; [`clamp`] (part of admit) lowers a client's output cap to
//! what fits for tenants with `on_short_output = "clamp"`. [`refusal`] gives a refusal the rate-limit headers of every budget the
//! request touches. [`context`] holds what the phases share, among it the
//! [`request_id`] named on arrival. The lifecycle knows budgets
//! only through [`crate::admission`] and upstreams only through
//! [`crate::upstreams`].

pub mod admit;
pub mod authenticate;
pub mod body_object;
pub mod clamp;
pub mod context;
pub mod count_tokens;
pub mod decode;
pub mod end_user;
pub mod finish;
pub mod forward;
pub mod gemini;
pub mod hosted_tools;
pub mod meter;
pub mod owner;
pub mod prepare;
pub mod pricing;
pub mod refusal;
pub mod request_id;
pub mod rewrite;
pub mod route;
pub mod run;
pub mod settle;
pub mod stored;
pub mod wait;
pub mod whole_answer;

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;

use context::RequestContext;
use finish::Outcome;
use forward::Forwarded;
use meter::Metered;

use crate::dialects::Dialect;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;

/// One proxied request, phase by phase.
pub async fn handle(
    st: Arc<AppState>,
    dialect: Dialect,
    headers: HeaderMap,
    body: Body,
    path_model: Option<String>,
) -> Response {
    handle_call(st, dialect, headers, body, path_model, None).await
}

/// [`handle`] for a dialect whose path names the method: `call` says
/// whether the answer streams and how it is framed (Gemini).
pub async fn handle_call(
    st: Arc<AppState>,
    dialect: Dialect,
    headers: HeaderMap,
    body: Body,
    path_model: Option<String>,
    call: Option<crate::dialects::gemini::Call>,
) -> Response {
    let path = finish::route_of(dialect, path_model.is_some());
    let mut cx = RequestContext::new(st, dialect, &headers).at("POST", path);
    cx.call = call;
    let metered = async {
        let caller = authenticate::authenticate(&mut cx, &headers)?;
        let mut request = prepare::prepare(&mut cx, caller, &headers, body, path_model).await?;
        let mut attempts = route::Attempts::default();
        let asked = wait::asked(&cx, &request, &headers);
        loop {
            let deployments = route::route(&cx, &request, &mut attempts).await?;
            let admitted = match wait::admit(&mut cx, &request, deployments, &mut attempts, asked)
                .await
            {
                Ok(a) => a,
                Err(e) => match clamp::clamped(&cx, &request, &e) {
                    Some(estimate) => {
                        tracing::info!(tenant = %request.plan.requester.tenant, cap = estimate.output_tokens_per_choice, "output cap clamped to fit the budgets");
                        cx.finish.estimated = estimate.total_tokens;
                        request.estimate = estimate;
                        request.clamped = true;
                        request.clamp_retried = true;
                        continue;
                    }
                    None => return Err(e),
                },
            };
            match forward::forward(&cx, &request, admitted, &headers).await {
                // Metering settles (streams: in the relay, which finishes them).
                Forwarded::Answer(answer) => {
                    let metered = meter::meter(&mut cx, &request, answer).await;
                    return Ok(clamp::mark(metered, &request));
                }
                Forwarded::PassedOn(response) => return Ok(Metered::PassedOn(response)),
                Forwarded::Retry(e) => attempts.failed(e),
                Forwarded::Denied(e) => attempts.denied(e)?,
                Forwarded::Failed(e) => return Err(e),
            }
        }
    };
    let metered: Result<Metered, ApiError> = metered.await;
    let refusal_headers = match &metered {
        Err(e) => refusal::headers(&cx, e).await,
        Ok(_) => None,
    };
    let mut response = finish(cx, metered);
    if let Some(h) = refusal_headers {
        response.headers_mut().extend(h);
    }
    response
}

/// The last phase: the client's response, and the final line for every
/// outcome that did not leave with a stream.
fn finish(mut cx: RequestContext, metered: Result<Metered, ApiError>) -> Response {
    let queued_ms = cx.finish.queued_ms;
    let mut response = finish_inner(&mut cx, metered);
    if let Some(ms) = queued_ms {
        response
            .headers_mut()
            .insert(wait::QUEUED_HEADER, axum::http::HeaderValue::from(ms));
    }
    response
}

fn finish_inner(cx: &mut RequestContext, metered: Result<Metered, ApiError>) -> Response {
    let record = cx.finish.hand_off();
    let dialect = cx.dialect;
    let requester = cx.requester();
    match metered {
        Ok(Metered::Answered(response, settled)) => {
            record.write(Outcome::Answered { settled });
            response
        }
        // The relay's body holds the stream's record; this one is empty.
        Ok(Metered::Streaming(response)) => response,
        Ok(Metered::PassedOn(response)) => {
            record.write(Outcome::UpstreamFailed {
                status: response.status().as_u16(),
                error: "upstream_status",
            });
            response
        }
        Ok(Metered::Failed(e)) | Err(e) => {
            write_failure(cx, record, &e);
            cx.with_request_id(e.respond_for(dialect, requester.as_deref()))
        }
    }
}

/// The end of a route that makes no model call (token counts, stored
/// responses, models, unknown paths): its final line (an error status from
/// the upstream, or an upstream failure, as such) and its request id.
pub fn conclude(mut cx: RequestContext, result: Result<Response, ApiError>) -> Response {
    let record = cx.finish.hand_off();
    let response = match result {
        Ok(response) => {
            let status = response.status();
            if status.is_success() {
                record.write(Outcome::Answered { settled: 0 });
            } else {
                record.write(Outcome::UpstreamFailed {
                    status: status.as_u16(),
                    error: "upstream_status",
                });
            }
            response
        }
        Err(e) => {
            write_failure(&cx, record, &e);
            e.respond_for(cx.dialect, cx.requester().as_deref())
        }
    };
    cx.with_request_id(response)
}

/// The final line of a request that ended in `e`: an upstream failure as
/// such, anything else as a refusal (kept for the budget page too).
fn write_failure(cx: &RequestContext, record: finish::Finish, e: &ApiError) {
    if e.is_upstream_failure() {
        record.write(Outcome::UpstreamFailed {
            status: e.status().as_u16(),
            error: e.label(),
        });
    } else {
        refusal::note(cx, record.tenant, e);
        record.write(Outcome::Refused(e));
    }
}
