//! Phase 5, forward (DESIGN section 1.6): send the rewritten body to the
//! chosen deployment and classify what came back. An upstream that fails
//! before any output has its reservation refunded at once (the request
//! count stays spent), and its kind's failure table
//! ([`crate::upstreams::failure`]) says whether another deployment may be
//! tried.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;

use super::admit::{Admitted, HoldBudgets};
use super::authenticate::{self, client_key};
use super::context::RequestContext;
use super::prepare::{invalid, Prepared};
use super::request_id::holds_key;
use super::rewrite::upstream_body;
// A request whose bytes never reached the upstream is voided (DESIGN section 13).
use super::settle::{refund, void};
use crate::admission::plan;
use crate::admission::HeldReservation;
use crate::budget::BudgetName;
use crate::config::{forwarding, UpstreamPolicy};
use crate::dialects::anthropic;
use crate::dialects::Dialect;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;
use crate::metrics::DeploymentMetrics;
use crate::settlement::Settling;
use crate::upstreams::failure::{self, Failure, PassOn, Refusal};
use crate::upstreams::{UpstreamError, UpstreamResponse};

// Header names built at compile time: naming a header by a string at run
// time searches the table of standard names on every use.
/// The request id an OpenAI-compatible upstream answers with.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_RESERVATION_ID: HeaderName = HeaderName::from_static("x-reservation-id");
const X_UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");
const OPENAI_PROCESSING_MS: HeaderName = HeaderName::from_static("openai-processing-ms");
const PROVIDER_REMAINING_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-tokens");
const PROVIDER_REMAINING_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-requests");

/// A successful upstream answer, to meter.
pub struct Answer {
    /// The reservation it runs under.
    pub hold: HeldReservation,
    /// The upstream's response (headers read, body not yet).
    pub response: UpstreamResponse,
    /// Headers for the client: rate limits and ids.
    pub headers: HeaderMap,
    /// The budgets the hold debited.
    pub budgets: HoldBudgets,
}

/// What one attempt on one deployment came to. (One per attempt, moved
/// once: boxing the large variant would cost an allocation per request.)
#[allow(clippy::large_enum_variant)]
pub enum Forwarded {
    /// A successful answer, to meter.
    Answer(Answer),
    /// The upstream's error answer, passed to the client as it is.
    PassedOn(Response),
    /// The deployment failed; another may be tried.
    Retry(ApiError),
    /// The deployment refused the gateway's credentials (and cools
    /// down); another may be tried, once per request.
    Denied(ApiError),
    /// The request failed for good.
    Failed(ApiError),
}

/// Sends one attempt and classifies the answer.
pub async fn forward(
    cx: &RequestContext,
    request: &Prepared,
    admitted: Admitted<'_>,
    client_headers: &HeaderMap,
) -> Forwarded {
    let Admitted {
        hold,
        admission,
        deployment,
        budgets,
    } = admitted;
    let policy = &*cx.policy;
    let upstream = policy.deployment(deployment.upstream);
    let model = policy.model_at(request.model);
    let out_body = match upstream_body(request, model, cx.dialect, upstream) {
        Ok(b) => Bytes::from(b),
        Err(_) => {
            hold.settle(void());
            return Forwarded::Failed(invalid(None, "The request body could not be re-encoded."));
        }
    };
    let extra = forwarded_client_headers(cx.dialect, upstream, client_headers);
    let name = request.upstream_model(model);
    let model_id = upstream
        .model_id(model, name)
        .unwrap_or(std::borrow::Cow::Borrowed(name));
    let request_id = cx.finish.request_id.header();
    let started = std::time::Instant::now();
    let sent = cx
        .st
        .upstream
        .send(
            upstream,
            cx.dialect,
            &model_id,
            request.stream,
            out_body,
            request_id.clone(),
            &extra,
        )
        .await;
    let resp = match sent {
        Ok(r) => {
            deployment
                .metrics
                .answered(r.status().as_str(), started.elapsed().as_secs_f64());
            r
        }
        Err(e) => {
            deployment
                .metrics
                .answered("error", started.elapsed().as_secs_f64());
            // The URL too, so an operator sees which address failed; only on
            // this failure path is it built.
            let url = crate::upstreams::endpoint_url_for_log(upstream, cx.dialect, &model_id);
            tracing::warn!(reservation_id = %hold.id(), deployment = %upstream.name, url, error = %e, "upstream request failed");
            // A refused connection never carried the request: nothing was done.
            let never_sent = matches!(e, UpstreamError::Connect(_) | UpstreamError::Credentials(_));
            hold.settle_now(if never_sent { void() } else { refund(&budgets) })
                .await;
            return Forwarded::Retry(ApiError::from(e));
        }
    };
    observe_provider_limits(
        &cx.st,
        policy,
        upstream,
        &deployment.metrics,
        resp.headers(),
    );
    let mut headers = cx
        .dialect
        .rate_limit_headers(&admission.budgets, cx.st.clock.now_micros());
    headers.insert(cx.dialect.request_id_header(), request_id);
    put(&mut headers, X_RESERVATION_ID, hold.id());
    let status = resp.status();
    if !status.is_success() {
        let deployment_at = (upstream, &deployment.metrics);
        return upstream_failure(cx, resp, hold, refund(&budgets), deployment_at, headers).await;
    }
    // The upstream names its request in its dialect's header (Anthropic: `request-id`).
    let upstream_id = if cx.dialect.is_anthropic() {
        anthropic::REQUEST_ID
    } else {
        X_REQUEST_ID
    };
    if let Some(u) = resp
        .headers()
        .get(upstream_id)
        .and_then(|v| v.to_str().ok())
    {
        put(&mut headers, X_UPSTREAM_REQUEST_ID, u);
    }
    if let Some(v) = resp.headers().get(OPENAI_PROCESSING_MS) {
        headers.insert(OPENAI_PROCESSING_MS, v.clone());
    }
    Forwarded::Answer(Answer {
        hold,
        response: resp,
        headers,
        budgets,
    })
}

/// The client headers `upstream` forwards (validated at load: no
/// credential unless listed in `forward_credential_headers`, never the
/// key's own headers or the gateway's), and on the Messages route the
/// version the client speaks and the betas prepare allowed. Whatever the
/// config, a header is dropped here if it is one the gateway never
/// forwards or if its value holds the client's gateway key (a key sent
/// again as, say, `x-api-key`, or as `Bearer <key>` in any header).
fn forwarded_client_headers(
    dialect: Dialect,
    upstream: &UpstreamPolicy,
    client_headers: &HeaderMap,
) -> Vec<(String, HeaderValue)> {
    const ANTHROPIC: [HeaderName; 2] = [anthropic::VERSION, anthropic::BETA];
    let passed: &[HeaderName] = if dialect.is_anthropic() {
        &ANTHROPIC
    } else {
        &[]
    };
    if upstream.forward_client_headers.is_empty() && passed.is_empty() {
        return Vec::new();
    }
    let key_headers = dialect.key_headers();
    let key = client_key(key_headers, client_headers);
    let mut out = Vec::new();
    let mut add = |name: &str, v: &HeaderValue| {
        if key.is_some_and(|k| holds_key(v.as_bytes(), k)) {
            // The header's name only: never the value, which holds the key.
            tracing::warn!(header = %name, "a client header holding the gateway key was not forwarded");
        } else {
            out.push((name.to_string(), v.clone()));
        }
    };
    for name in passed {
        for v in client_headers.get_all(name) {
            add(name.as_str(), v);
        }
    }
    for name in &upstream.forward_client_headers {
        let carries_key = key_headers
            .iter()
            .any(|h| authenticate::name(h).as_str() == name.as_str());
        if carries_key || forwarding::is_never_forwarded(name) {
            continue;
        }
        for v in client_headers.get_all(name.as_str()) {
            add(name, v);
        }
    }
    out
}

/// Most bytes of an error answer read (a client's mistake passed on is
/// small; a longer body is cut).
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// An upstream answered with an error status before any output: refund,
/// and act on what its kind's table ([`failure::classify`]) says: cool
/// the deployment down, try another, fail, or pass the answer on.
async fn upstream_failure(
    cx: &RequestContext,
    resp: UpstreamResponse,
    hold: HeldReservation,
    refund: Settling,
    (upstream, metrics): (&UpstreamPolicy, &DeploymentMetrics),
    headers: HeaderMap,
) -> Forwarded {
    let status = resp.status().as_u16();
    let reservation_id = hold.id().to_string();
    hold.settle_now(refund).await;
    let retry_after = resp
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = read_bounded(resp).await;
    let cloud = failure::CloudError::parse(&body);
    tracing::warn!(reservation_id, deployment = %upstream.name, status, cloud_status = %cloud.status, upstream_message = %cloud.message, "upstream answered with an error");
    let answer = failure::ErrorAnswer {
        deployment: &upstream.name,
        cooldown: upstream.cooldown,
        retry_after_secs: retry_after,
        body: &body,
    };
    let now = cx.st.clock.now_micros();
    // Gemini deployments answer in Google's shape, which the Gemini
    // route passes on as it came (a Vertex deployment's Claude answers
    // are Anthropic's).
    let classified = if cx.dialect.is_gemini() {
        failure::gemini::classify(status, &answer)
    } else {
        failure::classify(upstream.kind, status, &answer)
    };
    match classified {
        Failure::Retry { refusal, cool } => {
            if let Some(d) = cool {
                cx.st.cool_down(&upstream.name, now + d.as_micros() as u64);
            }
            Forwarded::Retry(api_error(refusal, metrics))
        }
        Failure::Denied { refusal, cool } => {
            cx.st.cool_down_for(
                &upstream.name,
                now + cool.as_micros() as u64,
                crate::gateway::CoolingReason::AccessDenied,
            );
            Forwarded::Denied(api_error(refusal, metrics))
        }
        Failure::Fail(refusal) => Forwarded::Failed(api_error(refusal, metrics)),
        Failure::PassOn(pass) => {
            let (body, content_type) = match pass {
                PassOn::AsIs => (Body::from(body), content_type),
                PassOn::Anthropic { kind, message } => (
                    Body::from(anthropic::error::error_body(kind, &message)),
                    None,
                ),
            };
            let mut r = Response::new(body);
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            *r.headers_mut() = headers;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                content_type.unwrap_or(HeaderValue::from_static("application/json")),
            );
            Forwarded::PassedOn(r)
        }
    }
}

/// The gateway's answer for a refusal (a refusal of the gateway's
/// credentials counted for the deployment).
fn api_error(refusal: Refusal, metrics: &DeploymentMetrics) -> ApiError {
    match refusal {
        Refusal::RateLimited { retry_after_secs } => {
            ApiError::UpstreamRateLimited { retry_after_secs }
        }
        Refusal::Credentials(message) => {
            metrics.auth_failed();
            ApiError::BadGateway(message)
        }
        Refusal::Unavailable(message) => ApiError::Unavailable(message),
        Refusal::Overloaded => ApiError::Overloaded,
        Refusal::GatewayTimeout => ApiError::GatewayTimeout,
        Refusal::Failed(message) => ApiError::BadGateway(message),
    }
}

async fn read_bounded(resp: UpstreamResponse) -> Vec<u8> {
    use http_body_util::BodyExt;
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        out.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - out.len())]);
        if out.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    out
}

/// Records what the provider says is left of its own limits (DESIGN: learn
/// from the provider). Values are logged; they never reach the client.
fn observe_provider_limits(
    st: &std::sync::Arc<AppState>,
    policy: &crate::config::Policy,
    upstream: &UpstreamPolicy,
    deployment_metrics: &DeploymentMetrics,
    headers: &reqwest::header::HeaderMap,
) {
    let read = |name: HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let tokens = read(PROVIDER_REMAINING_TOKENS);
    let requests = read(PROVIDER_REMAINING_REQUESTS);
    deployment_metrics.provider_remaining(tokens, requests);
    if upstream.learn_from_headers && (tokens.is_some() || requests.is_some()) {
        // Off the response path: the provider knows of spending this gateway
        // cannot see (other gateways' clients, other tools on the same key).
        let specs = plan::upstream_budgets(&AppState::key_space(policy), upstream);
        let store = st.store.clone();
        tokio::spawn(async move {
            for spec in specs {
                let seen = match spec.name {
                    BudgetName::Tpm => tokens,
                    BudgetName::Rpm => requests,
                    _ => None,
                };
                if let Some(v) = seen {
                    if let Err(e) = store.lower(&spec, v).await {
                        tracing::warn!(scope = %spec.scope, budget = %spec.name, error = %e, "could not follow the provider's limit");
                    }
                }
            }
        });
    }
    if tokens.is_some() || requests.is_some() {
        tracing::debug!(deployment = %upstream.name, remaining_tokens = tokens, remaining_requests = requests, "provider rate-limit headers");
    }
}

fn put(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}
