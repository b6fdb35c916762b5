//! The request lifecycle (DESIGN section 1): authenticate, parse and
//! validate, route, estimate, reserve, forward, meter, settle.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::headers::rate_limit_headers;
use super::{AppState, BudgetPlan, PlannedDeployment};
use crate::config::{ModelPolicy, Policy, Routing, UpstreamPolicy};
use crate::estimate::{self, Endpoint, Estimate, EstimateError, ModelEstimation};
use crate::metrics;
use crate::metrics::DeploymentMetrics;
use crate::reservation::HeldReservation;
use crate::reserve::{
    plan, Admission, BudgetName, BudgetSpec, Impossibility, ReserveOutcome, ReserveRequest, Scope,
    Settlement,
};
use crate::upstreams::relay::{self, ExtendPlan, StreamProcessor};

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Endpoint::ChatCompletions, headers, body, None).await
}

/// `POST /v1/completions` (legacy completions).
pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Endpoint::Completions, headers, body, None).await
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Endpoint::Embeddings, headers, body, None).await
}

/// `GET /v1/models`: the configured public models, OpenAI list shape.
pub async fn list_models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let policy = st.policy.load_full();
    if let Err(e) = authenticate(&policy, &headers) {
        return e.into_response();
    }
    let data: Vec<Value> = policy.models.iter().map(model_object).collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{model}`.
pub async fn get_model(
    State(st): State<Arc<AppState>>,
    Path(model): Path<String>,
    headers: HeaderMap,
) -> Response {
    let policy = st.policy.load_full();
    if let Err(e) = authenticate(&policy, &headers) {
        return e.into_response();
    }
    match policy.model(&model) {
        Some(m) => Json(model_object(m)).into_response(),
        None => ApiError::ModelNotFound(model).into_response(),
    }
}

fn model_object(m: &ModelPolicy) -> Value {
    json!({"id": m.name, "object": "model", "created": 0, "owned_by": "budgetgate"})
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn metrics() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(),
    )
        .into_response()
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: the budget store answers.
pub async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let policy = st.policy.load_full();
    match tokio::time::timeout(policy.store.timeout * 4, st.store.inspect(&[])).await {
        Ok(Ok(_)) => {
            Json(json!({"status": "ready", "policy_version": policy.version})).into_response()
        }
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "store unavailable"})),
        )
            .into_response(),
    }
}

/// A known path with the wrong method: 405 in OpenAI's shape.
pub async fn method_not_allowed(
    method: axum::http::Method,
    OriginalUri(uri): OriginalUri,
) -> Response {
    super::error::body(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("{method} is not supported on {}.", uri.path()),
        "invalid_request_error",
        None,
        Some("method_not_allowed"),
    )
}

/// Any other path: 404 in OpenAI's shape, never proxied.
pub async fn unknown_path(OriginalUri(uri): OriginalUri) -> Response {
    ApiError::NotFound(uri.path().to_string()).into_response()
}

/// The credentials of an `Authorization: Bearer <token>` header. The
/// scheme is case-insensitive and followed by spaces or tabs (RFC 9110
/// section 11.1 and 11.6.2; RFC 6750 section 2.1).
pub(super) fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once([' ', '\t'])?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(k) = bearer_token(headers) {
        return Some(k);
    }
    headers
        .get(API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

fn authenticate<'p>(
    policy: &'p Policy,
    headers: &HeaderMap,
) -> Result<
    (
        &'p crate::config::TenantPolicy,
        &'p crate::config::KeyPolicy,
    ),
    ApiError,
> {
    let key = presented_key(headers).ok_or_else(|| {
        // A credential header that is present but unreadable is a wrong key, not a missing one.
        if headers.contains_key(header::AUTHORIZATION) || headers.contains_key(API_KEY) {
            ApiError::InvalidKey
        } else {
            ApiError::MissingKey
        }
    })?;
    policy.authenticate(key).ok_or(ApiError::InvalidKey)
}

async fn proxy(
    st: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
    path_model: Option<String>,
) -> Response {
    let started = std::time::Instant::now();
    match proxy_inner(st, endpoint, headers, body, path_model).await {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(
                decision = "refused",
                status = e.status().as_u16(),
                error = e.label(),
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                "request refused"
            );
            e.into_response()
        }
    }
}

/// `POST /openai/deployments/{deployment}/chat/completions` (Azure path form; `{deployment}` is the model).
pub async fn azure_chat_completions(
    State(st): State<Arc<AppState>>,
    Path(deployment): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(
        st,
        Endpoint::ChatCompletions,
        headers,
        body,
        Some(deployment),
    )
    .await
}

/// `POST /openai/deployments/{deployment}/completions` (Azure path form).
pub async fn azure_completions(
    State(st): State<Arc<AppState>>,
    Path(deployment): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Endpoint::Completions, headers, body, Some(deployment)).await
}

/// `POST /openai/deployments/{deployment}/embeddings` (Azure path form).
pub async fn azure_embeddings(
    State(st): State<Arc<AppState>>,
    Path(deployment): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Endpoint::Embeddings, headers, body, Some(deployment)).await
}

fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
    ApiError::InvalidRequest {
        param: param.map(str::to_string),
        message: message.into(),
    }
}

/// The body after validation and estimation, ready to reserve.
struct Prepared {
    /// When the body had been read and parsing began (for the request log line).
    started: std::time::Instant,
    /// The client's body as received (forwarded with only the gateway's fields rewritten).
    raw: Bytes,
    model: ModelPolicy,
    estimate: Estimate,
    stream: bool,
    client_wants_usage: bool,
    /// Budgets of this tenant, key and model.
    plan: Arc<BudgetPlan>,
    /// Positions in `plan.upstreams` of the deployments that can serve the request.
    candidates: Vec<usize>,
}

async fn read_body(body: Body, limit: usize, headers: &HeaderMap) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    // A client that stops sending its body must not hold a connection forever.
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, limit));
    let Ok(read) = read.await else {
        return Err(ApiError::RequestTimeout);
    };
    read.map_err(|e| {
        if e.to_string().contains("length limit") {
            ApiError::BodyTooLarge { limit }
        } else {
            invalid(None, "The request body could not be read.")
        }
    })
}

fn prepare(
    st: &AppState,
    policy: &Arc<Policy>,
    endpoint: Endpoint,
    tenant: &crate::config::TenantPolicy,
    key: &crate::config::KeyPolicy,
    bytes: &Bytes,
    path_model: Option<String>,
) -> Result<Prepared, ApiError> {
    let started = std::time::Instant::now();
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        invalid(
            None,
            format!("We could not parse the JSON body of your request ({e}). The OpenAI API expects a JSON payload."),
        )
    })?;
    let Value::Object(mut body) = value else {
        return Err(invalid(None, "The request body must be a JSON object."));
    };
    if let Some(m) = path_model {
        // Azure path form: the deployment in the URL names the model.
        body.insert("model".into(), Value::String(m));
    }
    let model_name = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(invalid(Some("model"), "`model` must be a string.")),
        None => {
            return Err(invalid(
                Some("model"),
                "You must provide a model parameter.",
            ))
        }
    };
    let Some(model_ref) = policy.model(&model_name) else {
        return Err(ApiError::ModelNotFound(model_name));
    };
    let model = model_ref.clone();
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid(Some("stream"), "`stream` must be a boolean.")),
    };
    if stream && endpoint == Endpoint::Embeddings {
        return Err(invalid(Some("stream"), "Embeddings cannot be streamed."));
    }
    let client_wants_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let n = body.get("n").and_then(Value::as_u64).unwrap_or(1);
    let plan = st.budget_plan(policy, tenant, key, model_ref);
    let candidates: Vec<usize> = plan
        .upstreams
        .iter()
        .enumerate()
        .filter(|(_, d)| n <= 1 || policy.upstreams[d.upstream].supports_n)
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return Err(invalid(
            Some("n"),
            format!(
                "`n` > 1 is not supported by any deployment of model `{}`.",
                model.name
            ),
        ));
    }
    let common = &plan.common;
    let cand_specs: Vec<&[BudgetSpec]> = candidates
        .iter()
        .map(|&i| plan.upstreams[i].budgets.as_slice())
        .collect();
    let tightest = plan::tightest_token_capacity(common, &cand_specs);
    let me = ModelEstimation {
        encoding: model.encoding,
        default_max_output_tokens: model.default_max_output_tokens,
        max_output_tokens: model.max_output_tokens,
        min_output_tokens: policy.min_output_tokens,
    };
    let body_value = Value::Object(body);
    let estimate =
        match estimate::estimate(endpoint, &body_value, &me, &policy.estimation, tightest) {
            Ok(e) => e,
            Err(EstimateError::Invalid { param, message }) => {
                return Err(ApiError::InvalidRequest { param, message })
            }
            Err(EstimateError::Impossible { needed, capacity }) => {
                let spec = common
                    .iter()
                    .chain(cand_specs.iter().copied().flatten())
                    .filter(|s| s.name.counts_tokens() && s.capacity() == capacity)
                    .min_by_key(|s| s.capacity());
                let (scope, name) = match spec {
                    Some(s) => (s.scope.clone(), s.name),
                    None => (
                        Scope::Tenant(tenant.name.as_str().into()),
                        crate::reserve::BudgetName::Tpm,
                    ),
                };
                return Err(ApiError::Impossible(Box::new(Impossibility {
                    scope,
                    name,
                    capacity,
                    requested: needed,
                })));
            }
        };
    let Value::Object(body) = body_value else {
        unreachable!("constructed as an object above")
    };
    drop(body);
    Ok(Prepared {
        started,
        raw: bytes.clone(),
        model,
        estimate,
        stream,
        client_wants_usage,
        plan,
        candidates,
    })
}

/// The body to send to `upstream`: model name, output cap (DESIGN
/// section 1.6), and usage reporting for streams. Everything else passes
/// through untouched.
fn upstream_body(
    p: &Prepared,
    endpoint: Endpoint,
    upstream: &UpstreamPolicy,
) -> Result<Vec<u8>, serde_json::Error> {
    // Top-level fields as raw JSON slices, in the client's order: values
    // are copied byte for byte, never re-serialised (a 400 KB prompt costs
    // a scan, not a rebuild).
    let RawMembers(top) = serde_json::from_slice(&p.raw)?;
    let mut set: Vec<(&str, String)> =
        vec![("model", serde_json::to_string(&p.model.upstream_model)?)];
    let mut removed: Vec<&str> = Vec::new();
    if endpoint != Endpoint::Embeddings {
        let cap_field = if endpoint == Endpoint::Completions || upstream.max_tokens_only {
            "max_tokens"
        } else {
            "max_completion_tokens"
        };
        let cap = match p.estimate.client_max_output {
            Some(client) => client,
            None if p.stream && !p.model.reasoning => p.model.max_output_tokens,
            None => p.estimate.output_tokens_per_choice,
        };
        if cap_field == "max_tokens" {
            removed.push("max_completion_tokens");
        }
        if p.estimate.client_max_output.is_none() || cap_field == "max_tokens" {
            set.push((cap_field, cap.to_string()));
        }
        if p.stream {
            let mut opts: Map<String, Value> = top
                .iter()
                .rfind(|(k, _)| k == "stream_options")
                .and_then(|(_, r)| serde_json::from_str(r.get()).ok())
                .unwrap_or_default();
            opts.insert("include_usage".into(), Value::Bool(true));
            set.push(("stream_options", serde_json::to_string(&opts)?));
        }
    }
    let mut out = Vec::with_capacity(p.raw.len() + 128);
    out.push(b'{');
    let mut first = true;
    let mut field = |out: &mut Vec<u8>, key: &str, value: &str| -> Result<(), serde_json::Error> {
        if !first {
            out.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut *out, key)?;
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        Ok(())
    };
    for (k, v) in &top {
        if removed.contains(&k.as_ref()) || set.iter().any(|(s, _)| s == k) {
            continue;
        }
        field(&mut out, k, v.get())?;
    }
    for (k, v) in &set {
        field(&mut out, k, v)?;
    }
    out.push(b'}');
    Ok(out)
}

/// A JSON object's members in document order, each value as its raw
/// slice of the input. Names are borrowed unless they hold escapes. (A
/// `BTreeMap<String, &RawValue>` allocated a string and a tree node per
/// member and sorted the forwarded fields.)
struct RawMembers<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// An object member's name, borrowed from the input when it can be
/// (serde's `borrow` on a `Cow<str>` copies only a name with escapes).
#[derive(serde::Deserialize)]
struct MemberName<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for RawMembers<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawMembers<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(16);
                while let Some((MemberName(k), v)) = map.next_entry::<MemberName, &RawValue>()? {
                    members.push((k, v));
                }
                Ok(RawMembers(members))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// A client-supplied `x-request-id`, if it is short printable ASCII.
fn client_request_id(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(X_REQUEST_ID)?.to_str().ok()?.trim();
    (!v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| v.to_string())
}

/// Longest a client may take to send its request body.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Most deployments one request is tried on (first attempt included).
const MAX_ATTEMPTS: usize = 3;

/// What became of one attempt on one deployment.
enum Attempt {
    /// The answer for the client.
    Done(Response),
    /// The deployment failed before any output; another may be tried.
    Retry(ApiError),
}

async fn proxy_inner(
    st: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
    path_model: Option<String>,
) -> Result<Response, ApiError> {
    let policy = st.policy.load_full();
    let (tenant, key) = authenticate(&policy, &headers)?;
    let bytes = read_body(body, policy.server.max_body_bytes, &headers).await?;
    // Large bodies are parsed and counted on the low-priority estimation
    // threads, so that the serving thread's other connections go on
    // meanwhile (issue 7); small ones right here, without the hand-off.
    let prepared = if bytes.len() <= estimate::OFF_IO_THREAD_BYTES {
        prepare(&st, &policy, endpoint, tenant, key, &bytes, path_model)?
    } else {
        let ti = policy.tenants.iter().position(|x| std::ptr::eq(x, tenant));
        let ki = tenant.keys.iter().position(|x| std::ptr::eq(x, key));
        let (Some(ti), Some(ki)) = (ti, ki) else {
            return Err(ApiError::InvalidKey);
        };
        let len = bytes.len();
        let (st, policy, bytes) = (st.clone(), policy.clone(), bytes.clone());
        let job = move || {
            let tenant = &policy.tenants[ti];
            prepare(
                &st,
                &policy,
                endpoint,
                tenant,
                &tenant.keys[ki],
                &bytes,
                path_model,
            )
        };
        estimate::off_io_threads(len, job).await.ok_or_else(|| {
            ApiError::Unavailable("The request could not be estimated; please retry.".into())
        })??
    };
    let client_id = client_request_id(&headers);

    let mut tried: Vec<usize> = Vec::new();
    let mut last_error = None;
    for attempt in 0..MAX_ATTEMPTS.min(prepared.candidates.len()) {
        let now = st.clock.now_micros();
        let mut cooling_until = None;
        let mut candidates: Vec<&PlannedDeployment> = prepared
            .candidates
            .iter()
            .map(|&i| &prepared.plan.upstreams[i])
            .filter(|d| !tried.contains(&d.upstream))
            .filter(
                |d| match st.cooldown_until(&policy.upstreams[d.upstream].name, now) {
                    Some(until) => {
                        cooling_until = Some(cooling_until.map_or(until, |c: u64| c.min(until)));
                        false
                    }
                    None => true,
                },
            )
            .collect();
        if candidates.is_empty() {
            if let Some(e) = last_error {
                return Err(e);
            }
            let wait = cooling_until.map_or(1_000_000, |u| u.saturating_sub(now));
            return Err(ApiError::UpstreamRateLimited {
                retry_after_secs: Some(super::error::retry_after_secs(wait)),
            });
        }
        if prepared.model.routing == Routing::LeastUtilised && candidates.len() > 1 {
            order_by_spare_capacity(&st, &mut candidates).await;
        }
        // A retry on another deployment is the same client request: its request count is already spent.
        let common: Vec<BudgetSpec> = if attempt == 0 {
            prepared.plan.common.clone()
        } else {
            prepared
                .plan
                .common
                .iter()
                .filter(|s| s.name.counts_tokens() || s.name == BudgetName::MaxConcurrent)
                .cloned()
                .collect()
        };
        let id = uuid::Uuid::now_v7().to_string();
        let request = ReserveRequest {
            id: id.clone(),
            tokens: prepared.estimate.total_tokens,
            common,
            candidates: candidates.iter().map(|d| d.budgets.clone()).collect(),
            lease_micros: policy.server.lease.as_micros() as u64,
            hold_ttl_micros: (policy.server.max_request + policy.server.settle_retry).as_micros()
                as u64,
            requester: prepared.plan.requester.clone(),
        };
        let concurrency_hint = policy.server.concurrency_retry.as_micros() as u64;
        let outcome = st.store.reserve(&request).await?;
        let admission = match outcome {
            ReserveOutcome::Admitted(a) => a,
            ReserveOutcome::Denied(denial) => {
                tracing::info!(tenant = %tenant.name, scope = %denial.scope, budget = %denial.name, retry_after_us = denial.retry_after_micros, policy_version = %policy.version, "denied");
                let headers = rate_limit_headers(std::slice::from_ref(&denial.state));
                return Err(ApiError::RateLimited {
                    denial: Box::new(denial),
                    headers,
                    concurrency_hint_micros: concurrency_hint,
                });
            }
            ReserveOutcome::Impossible(i) => {
                return Err(ApiError::Impossible(Box::new(i)));
            }
        };
        let deployment = candidates[admission.candidate];
        let upstream_idx = deployment.upstream;
        tried.push(upstream_idx);
        let tenant_metrics = &prepared.plan.tenant_metrics;
        tenant_metrics.admitted(request.tokens);
        for w in &admission.would_deny {
            metrics::shadow_denial(&tenant.name, &w.scope, w.name);
            tracing::info!(reservation_id = %id, tenant = %tenant.name, scope = %w.scope, budget = %w.name,
                policy_version = %policy.version, "would deny (shadow mode); admitted");
        }
        let hold = HeldReservation::new(
            id.clone(),
            st.store.clone(),
            st.settlements.clone(),
            prepared.estimate.total_tokens,
            policy.server.lease,
            policy.server.settle_retry,
        )
        .with_metrics(tenant_metrics.clone())
        .with_deny_release(prepared.plan.deny_release.clone());
        let upstream = &policy.upstreams[upstream_idx];
        match forward(
            &st,
            &policy,
            &prepared,
            endpoint,
            upstream,
            &deployment.metrics,
            hold,
            &admission,
            &headers,
            client_id.as_deref(),
            tenant,
        )
        .await
        {
            Attempt::Done(r) => return Ok(r),
            Attempt::Retry(e) => {
                tracing::warn!(reservation_id = %id, deployment = %upstream.name, error = e.label(), attempt, "deployment failed before any output; trying the next one");
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| {
        ApiError::BadGateway("No upstream deployment could serve the request.".into())
    }))
}

/// Sorts candidates by the spare share (remaining/limit) of their tightest
/// token bucket, most spare first; deployments without one come first. A
/// failed read keeps the configured order.
async fn order_by_spare_capacity(st: &Arc<AppState>, candidates: &mut [&PlannedDeployment]) {
    let specs: Vec<BudgetSpec> = candidates
        .iter()
        .flat_map(|d| {
            d.budgets
                .iter()
                .filter(|b| b.name == BudgetName::Tpm)
                .cloned()
        })
        .collect();
    let Ok(Ok(states)) = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        st.store.inspect(&specs),
    )
    .await
    else {
        return;
    };
    // Spare share as a fraction in parts per million, per candidate (1e6 = unlimited).
    let share = |d: &PlannedDeployment| -> i64 {
        d.budgets
            .iter()
            .filter(|b| b.name == BudgetName::Tpm)
            .filter_map(|b| {
                states
                    .iter()
                    .find(|s| s.scope == b.scope && s.name == b.name)
            })
            .map(|s| s.remaining.max(0) * 1_000_000 / s.limit.max(1) as i64)
            .min()
            .unwrap_or(1_000_000)
    };
    candidates.sort_by_key(|c| std::cmp::Reverse(share(c)));
}

/// Sends one attempt to `upstream` and turns its answer into a client
/// response, or into [`Attempt::Retry`] when the deployment failed before
/// producing anything (its reservation is then refunded before returning).
#[allow(clippy::too_many_arguments)]
async fn forward(
    st: &Arc<AppState>,
    policy: &Policy,
    prepared: &Prepared,
    endpoint: Endpoint,
    upstream: &UpstreamPolicy,
    deployment_metrics: &DeploymentMetrics,
    hold: HeldReservation,
    admission: &Admission,
    client_headers: &HeaderMap,
    client_id: Option<&str>,
    tenant: &crate::config::TenantPolicy,
) -> Attempt {
    let id = hold.id().to_string();
    let out_body = match upstream_body(prepared, endpoint, upstream) {
        Ok(b) => Bytes::from(b),
        Err(_) => {
            hold.settle(Settlement {
                actual_tokens: 0,
                upstream_failed: true,
            });
            return Attempt::Done(
                invalid(None, "The request body could not be re-encoded.").into_response(),
            );
        }
    };
    let mut extra = Vec::new();
    for name in &upstream.forward_client_headers {
        if let Some(v) = client_headers.get(name.as_str()) {
            extra.push((name.clone(), v.clone()));
        }
    }
    let started = std::time::Instant::now();
    let sent = st
        .upstream
        .send(
            upstream,
            endpoint,
            &prepared.model.upstream_model,
            out_body,
            client_id.unwrap_or(&id),
            &extra,
        )
        .await;
    let resp = match sent {
        Ok(r) => {
            deployment_metrics.answered(r.status().as_str(), started.elapsed().as_secs_f64());
            r
        }
        Err(e) => {
            deployment_metrics.answered("error", started.elapsed().as_secs_f64());
            hold.settle_now(Settlement {
                actual_tokens: 0,
                upstream_failed: true,
            })
            .await;
            tracing::warn!(reservation_id = %id, deployment = %upstream.name, error = %e, "upstream request failed");
            return Attempt::Retry(ApiError::from(e));
        }
    };
    let status = resp.status();
    observe_provider_limits(st, policy, upstream, deployment_metrics, resp.headers());
    if !status.is_success() {
        return upstream_failure(st, resp, hold, admission, upstream, client_id).await;
    }

    let mut out_headers = rate_limit_headers(&admission.budgets);
    put(&mut out_headers, X_REQUEST_ID, client_id.unwrap_or(&id));
    put(&mut out_headers, X_RESERVATION_ID, &id);
    if let Some(u) = resp
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
    {
        put(&mut out_headers, X_UPSTREAM_REQUEST_ID, u);
    }
    if let Some(v) = resp.headers().get(OPENAI_PROCESSING_MS) {
        out_headers.insert(OPENAI_PROCESSING_MS, v.clone());
    }

    if prepared.stream {
        let choices = prepared.estimate.choices.max(1);
        let proc = StreamProcessor::new(
            endpoint,
            prepared.model.encoding,
            prepared.client_wants_usage,
            choices,
        );
        let extend_step =
            if prepared.estimate.client_max_output.is_some() || prepared.model.reasoning {
                None
            } else {
                Some(policy.stream_extension_step)
            };
        let plan = ExtendPlan {
            reserved_output: prepared.estimate.output_tokens,
            step: extend_step,
            max_output: prepared.model.max_output_tokens * choices,
            input_tokens: prepared.estimate.input_tokens,
        };
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let tenant_name = tenant.name.clone();
        let model_name = prepared.model.name.clone();
        let deployment = upstream.name.clone();
        let estimated = prepared.estimate.total_tokens;
        let started = prepared.started;
        tokio::spawn(async move {
            metrics::active_streams(1.0);
            let summary = relay::run(resp, proc, hold, plan, tx).await;
            metrics::active_streams(-1.0);
            metrics::stream_ended(
                &deployment,
                match summary.ending {
                    relay::Ending::Completed => "completed",
                    relay::Ending::CutOff => "cut_off",
                    relay::Ending::ClientGone => "client_gone",
                    relay::Ending::UpstreamError => "upstream_error",
                },
            );
            tracing::info!(reservation_id = %id, tenant = %tenant_name, model = %model_name, deployment = %deployment,
                estimated, settled = summary.settled_tokens, ending = ?summary.ending, decision = "admitted",
                latency_ms = started.elapsed().as_secs_f64() * 1000.0, "stream finished");
        });
        let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<Bytes, std::io::Error>(b), rx))
        }));
        let mut response = Response::new(body);
        *response.headers_mut() = out_headers;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Attempt::Done(response);
    }

    // Non-streaming: read the whole answer, settle from its usage.
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            hold.settle(Settlement {
                actual_tokens: 0,
                upstream_failed: true,
            });
            tracing::warn!(reservation_id = %id, error = %e, "upstream body failed");
            return Attempt::Done(
                ApiError::BadGateway("The upstream response was interrupted.".into())
                    .into_response(),
            );
        }
    };
    // Only `usage` is read out of the answer; the rest is checked to be
    // JSON and passed on untouched (the whole tree is built only when the
    // upstream sent no usage and the output must be counted here).
    let usage = match serde_json::from_slice::<Answer>(&body) {
        Ok(a) if body.trim_ascii_start().starts_with(b"{") => a.usage,
        _ => {
            hold.settle(Settlement {
                actual_tokens: 0,
                upstream_failed: true,
            });
            return Attempt::Done(
                ApiError::BadGateway("The upstream returned a response that is not JSON.".into())
                    .into_response(),
            );
        }
    };
    let actual = usage
        .and_then(|u| usage_tokens(u.get(), endpoint))
        .unwrap_or_else(|| {
            let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            prepared.estimate.input_tokens + count_output(&parsed, endpoint, &prepared.model)
        });
    hold.settle(Settlement {
        actual_tokens: actual,
        upstream_failed: false,
    });
    tracing::info!(reservation_id = %id, tenant = %tenant.name, model = %prepared.model.name, deployment = %upstream.name,
        estimated = prepared.estimate.total_tokens, settled = actual, decision = "admitted",
        latency_ms = prepared.started.elapsed().as_secs_f64() * 1000.0, "request finished");
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = out_headers;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    Attempt::Done(response)
}

/// Records what the provider says is left of its own limits (DESIGN: learn
/// from the provider). Values are logged; they never reach the client.
fn observe_provider_limits(
    st: &Arc<AppState>,
    policy: &Policy,
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
        tracing::debug!(deployment = %upstream.name, remaining_tokens = ?tokens, remaining_requests = ?requests, "provider rate-limit headers");
    }
}

// Header names built at compile time: naming a header by a string at run
// time searches the table of standard names on every use.
const API_KEY: HeaderName = HeaderName::from_static("api-key");
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_RESERVATION_ID: HeaderName = HeaderName::from_static("x-reservation-id");
const X_UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");
const OPENAI_PROCESSING_MS: HeaderName = HeaderName::from_static("openai-processing-ms");
const PROVIDER_REMAINING_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-tokens");
const PROVIDER_REMAINING_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-requests");

fn put(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

/// The part of a non-streamed answer the gateway reads (OpenAI API
/// reference: `usage` of chat completions, completions and embeddings).
#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

/// `prompt_tokens + completion_tokens` from an upstream `usage` object
/// (raw JSON); `None` when it is not an object with a `prompt_tokens` count.
fn usage_tokens(raw: &str, endpoint: Endpoint) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Usage {
        prompt_tokens: Option<Value>,
        completion_tokens: Option<Value>,
        total_tokens: Option<Value>,
    }
    if !raw.starts_with('{') {
        return None;
    }
    let u: Usage = serde_json::from_str(raw).ok()?;
    let prompt = u.prompt_tokens.as_ref().and_then(Value::as_u64);
    let completion = u
        .completion_tokens
        .as_ref()
        .and_then(Value::as_u64)
        .unwrap_or(0);
    match endpoint {
        Endpoint::Embeddings => prompt.or_else(|| u.total_tokens.as_ref().and_then(Value::as_u64)),
        _ => prompt.map(|p| p.saturating_add(completion)),
    }
}

/// The gateway's own count of a non-streamed answer's output, when the upstream sent no usage.
fn count_output(v: &Value, endpoint: Endpoint, model: &ModelPolicy) -> u64 {
    let Some(choices) = v.get("choices").and_then(Value::as_array) else {
        return 0;
    };
    let enc = model.encoding;
    let count = |x: Option<&Value>| x.and_then(Value::as_str).map(|s| enc.count(s)).unwrap_or(0);
    choices
        .iter()
        .map(|c| match endpoint {
            Endpoint::Completions => count(c.get("text")),
            _ => {
                let m = c.get("message");
                let mut n = count(m.and_then(|m| m.get("content")))
                    + count(m.and_then(|m| m.get("refusal")));
                if let Some(calls) = m
                    .and_then(|m| m.get("tool_calls"))
                    .and_then(Value::as_array)
                {
                    for call in calls {
                        let f = call.get("function");
                        n += count(f.and_then(|f| f.get("arguments")))
                            + count(f.and_then(|f| f.get("name")));
                    }
                }
                n
            }
        })
        .sum()
}

/// An upstream answered with an error status before any output: refund the
/// tokens (the request count stays spent). 429 and 5xx may be retried on
/// another deployment; other 4xx answers go to the client (401/403 as 502:
/// that is the gateway's key, not the client's fault).
async fn upstream_failure(
    st: &Arc<AppState>,
    resp: reqwest::Response,
    hold: HeldReservation,
    admission: &Admission,
    upstream: &UpstreamPolicy,
    client_id: Option<&str>,
) -> Attempt {
    let status = resp.status();
    let id = hold.id().to_string();
    hold.settle_now(Settlement {
        actual_tokens: 0,
        upstream_failed: true,
    })
    .await;
    tracing::warn!(reservation_id = %id, deployment = %upstream.name, status = status.as_u16(), "upstream answered with an error");
    match status.as_u16() {
        429 => {
            let retry = resp
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let cool = retry.map_or(upstream.cooldown, std::time::Duration::from_secs);
            st.cool_down(
                &upstream.name,
                st.clock.now_micros() + cool.as_micros() as u64,
            );
            Attempt::Retry(ApiError::UpstreamRateLimited {
                retry_after_secs: retry,
            })
        }
        401 | 403 => Attempt::Done(
            ApiError::BadGateway("The upstream rejected the gateway's credentials.".into())
                .into_response(),
        ),
        400..=499 => {
            let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
            let body = resp.bytes().await.unwrap_or_default();
            let mut r = Response::new(Body::from(body));
            *r.status_mut() =
                StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_REQUEST);
            r.headers_mut()
                .extend(rate_limit_headers(&admission.budgets));
            put(r.headers_mut(), X_REQUEST_ID, client_id.unwrap_or(&id));
            put(r.headers_mut(), X_RESERVATION_ID, &id);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                content_type.unwrap_or(HeaderValue::from_static("application/json")),
            );
            Attempt::Done(r)
        }
        503 => Attempt::Retry(ApiError::Unavailable(
            "The upstream is unavailable; please retry.".into(),
        )),
        _ => Attempt::Retry(ApiError::BadGateway(format!(
            "The upstream failed with status {}.",
            status.as_u16()
        ))),
    }
}
