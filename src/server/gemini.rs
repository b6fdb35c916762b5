//! The Gemini API's routes (under `/v1beta` and, for the model calls,
//! `/v1`, as Google serves both): `POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent` (`alt=sse`, or one JSON array without it),
//! `:countTokens`, and `GET /v1beta/models`. The model and the method are
//! read from the raw path (a model name that could reach another resource
//! is a 404 that reaches no upstream); a key sent as `?key=` is moved
//! into `x-goog-api-key` here and the query is not read again: it is
//! never logged (the final line names the route, not the URI) and never
//! forwarded (the upstream URL is the deployment's own).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;

use crate::dialects::gemini::path::{model_and_method, query_key, wants_sse, Method};
use crate::dialects::gemini::{Call, API_KEY};
use crate::dialects::Dialect;
use crate::gateway::error::ApiError;
use crate::gateway::AppState;
use crate::lifecycle;
use crate::lifecycle::context::RequestContext;

/// Moves a `?key=` into the key header (a second, different key in the
/// header is then refused as two keys are anywhere else).
fn with_query_key(mut headers: HeaderMap, uri: &axum::http::Uri) -> HeaderMap {
    if let Some(v) = query_key(uri.query()).and_then(|k| HeaderValue::from_str(&k).ok()) {
        headers.append(API_KEY, v);
    }
    headers
}

/// `POST /v1beta/models/{model}:{method}`.
pub async fn model_call(
    State(st): State<Arc<AppState>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let headers = with_query_key(headers, &uri);
    let raw = uri
        .path()
        .strip_prefix("/v1beta/models/")
        .or_else(|| uri.path().strip_prefix("/v1/models/"))
        .unwrap_or("");
    let Some((model, method)) = model_and_method(raw) else {
        // The path, never the query (it may hold the key).
        let cx =
            RequestContext::new(st, Dialect::Gemini, &headers).at("POST", "/v1beta/models/{model}");
        return lifecycle::conclude(cx, Err(ApiError::NotFound(uri.path().to_string())));
    };
    let model = model.to_string();
    match method {
        Method::CountTokens => lifecycle::gemini::count_tokens(st, headers, body, model).await,
        Method::Generate | Method::Stream => {
            let call = Call {
                stream: method == Method::Stream,
                sse: wants_sse(uri.query()),
            };
            lifecycle::handle_call(st, Dialect::Gemini, headers, body, Some(model), Some(call))
                .await
        }
    }
}

/// `GET /v1beta/models`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    lifecycle::gemini::list(st, with_query_key(headers, &uri)).await
}
