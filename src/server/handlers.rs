//! The routes' handlers: the proxied endpoints hand the request to the
//! lifecycle ([`crate::lifecycle`]); health, metrics and unknown paths
//! are answered here (models: [`super::models`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::dialects::Dialect;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;
use crate::lifecycle;
use crate::lifecycle::context::RequestContext;
use crate::lifecycle::stored::{self, StoredOp};
use crate::metrics;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Dialect::ChatCompletions, headers, body, None).await
}

/// `POST /v1/completions` (legacy completions).
pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Dialect::Completions, headers, body, None).await
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Dialect::Embeddings, headers, body, None).await
}

/// `POST /v1/messages` (Anthropic Messages).
pub async fn messages(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    proxy(st, Dialect::Messages, headers, body, None).await
}

/// `POST /v1/messages/count_tokens`: the gateway's input estimate, no upstream call.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    crate::lifecycle::count_tokens::count_tokens(st, headers, body).await
}

/// `POST /v1/responses` (OpenAI Responses API).
pub async fn responses(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Dialect::Responses, headers, body, None).await
}

/// `POST /v1/responses/input_tokens`: the gateway's own estimate.
pub async fn responses_input_tokens(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    stored::input_tokens(st, headers, body).await
}

/// A stored-response route (`GET`/`DELETE /v1/responses/{id}`,
/// `.../cancel`, `.../input_items`; owner only). The two reads pass the
/// client's query (pagination, `stream`) upstream.
pub async fn stored_response(
    op: StoredOp,
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let query = match op {
        StoredOp::Get | StoredOp::InputItems => uri.query().map(str::to_string),
        StoredOp::Delete | StoredOp::Cancel => None,
    };
    stored::stored(st, headers, id, op, query).await
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

/// `GET /readyz`: the budget store answers. Deployments skipped
/// (credentials that could not be loaded) are named, and those cooling
/// down with why (`rate_limited`, `access_denied`).
pub async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let policy = st.policy.load_full();
    match tokio::time::timeout(policy.store.timeout * 4, st.store.inspect(&[])).await {
        Ok(Ok(_)) => {
            let mut v = json!({"status": "ready", "policy_version": policy.version});
            // Serving, without the deployments whose credentials failed to load.
            let mut skipped = st.upstream.aws.skipped();
            skipped.extend(st.upstream.vertex_tokens().skipped());
            if !skipped.is_empty() {
                skipped.sort();
                v["skipped_deployments"] = json!(skipped);
            }
            let now = st.clock.now_micros();
            let cooling: Vec<Value> = st
                .cooling(now)
                .into_iter()
                .map(|(name, c)| {
                    json!({
                        "deployment": name,
                        "reason": c.reason.name(),
                        "seconds_left": (c.until - now).div_ceil(1_000_000),
                    })
                })
                .collect();
            if !cooling.is_empty() {
                v["cooling_deployments"] = json!(cooling);
            }
            Json(v).into_response()
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
    State(st): State<Arc<AppState>>,
    method: axum::http::Method,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let e = ApiError::MethodNotAllowed(method.to_string(), uri.path().to_string());
    refuse_here(st, &headers, e, (&method, uri.path()))
}

/// Any other path: 404 in OpenAI's shape, never proxied.
pub async fn unknown_path(
    State(st): State<Arc<AppState>>,
    method: axum::http::Method,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let e = ApiError::NotFound(uri.path().to_string());
    refuse_here(st, &headers, e, (&method, uri.path()))
}

/// A refusal of a path the lifecycle does not serve, in OpenAI's shape:
/// with a request id and a final line like any other (naming the method
/// and the path itself: no route matched).
fn refuse_here(
    st: Arc<AppState>,
    headers: &HeaderMap,
    e: ApiError,
    (method, path): (&axum::http::Method, &str),
) -> Response {
    let method = match method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let cx =
        RequestContext::new(st, Dialect::ChatCompletions, headers).at(method, path.to_string());
    lifecycle::conclude(cx, Err(e))
}

pub(super) use crate::lifecycle::authenticate::bearer_token;

async fn proxy(
    st: Arc<AppState>,
    endpoint: Dialect,
    headers: HeaderMap,
    body: Body,
    path_model: Option<String>,
) -> Response {
    crate::lifecycle::handle(st, endpoint, headers, body, path_model).await
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
        Dialect::ChatCompletions,
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
    proxy(st, Dialect::Completions, headers, body, Some(deployment)).await
}

/// `POST /openai/deployments/{deployment}/embeddings` (Azure path form).
pub async fn azure_embeddings(
    State(st): State<Arc<AppState>>,
    Path(deployment): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    proxy(st, Dialect::Embeddings, headers, body, Some(deployment)).await
}
