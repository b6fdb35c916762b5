//! What a Vertex deployment's error answer means for the attempt
//! (docs/VERTEX.md, "Errors"). Vertex answers its own failures in
//! Google's shape (`{"error":{"code","message","status"}}`: quota,
//! credentials, permissions, malformed requests) and passes the model's in
//! Anthropic's; the client always gets Anthropic's shape.
//!
//! - 429 `RESOURCE_EXHAUSTED`: the deployment cools down, another may
//!   serve the request, else 429 with `retry-after`.
//! - 401 / 403: 502 naming the deployment (the gateway's credentials, not
//!   the client's fault); the cloud's words go to the log only.
//! - 503 / 504: the deployment cools down, another may serve it, else
//!   503 / 504.
//! - other 4xx (400 `INVALID_ARGUMENT`): the status with the cloud's
//!   message, as `invalid_request_error` (or the type of that status).

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use super::context::RequestContext;
use super::forward::Forwarded;
use crate::admission::HeldReservation;
use crate::config::UpstreamPolicy;
use crate::dialects::anthropic::error::{error_body, error_type, OVERLOADED};
use crate::gateway::error::ApiError;
use crate::metrics::DeploymentMetrics;
use crate::settlement::Settling;

/// Most bytes of an error answer read (its message is what matters).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The message and status word of an error answer, in either shape.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CloudError {
    /// Google's `status` (`RESOURCE_EXHAUSTED`) or Anthropic's error `type`.
    pub status: String,
    /// The human-readable message.
    pub message: String,
}

impl CloudError {
    /// Reads `body`: Google's shape or Anthropic's; empty fields for
    /// anything else.
    pub fn parse(body: &[u8]) -> CloudError {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
            return CloudError::default();
        };
        // Google's APIs answer a list of one error on some routes.
        let v = v.get(0).unwrap_or(&v);
        let e = &v["error"];
        let text = |k: &str| e.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let status = match text("status") {
            s if s.is_empty() => text("type"),
            s => s,
        };
        CloudError {
            status,
            message: text("message"),
        }
    }
}

/// A Vertex deployment answered `resp` (an error status) before any
/// output: refund, cool down where the table says, and decide.
pub async fn upstream_failure(
    cx: &RequestContext,
    resp: reqwest::Response,
    hold: HeldReservation,
    refund: Settling,
    (upstream, metrics): (&UpstreamPolicy, &DeploymentMetrics),
    headers: HeaderMap,
) -> Forwarded {
    let status = resp.status().as_u16();
    hold.settle_now(refund).await;
    let body = read_bounded(resp).await;
    let cloud = CloudError::parse(&body);
    tracing::warn!(deployment = %upstream.name, status, cloud_status = %cloud.status, message = %cloud.message, "vertex answered with an error");
    let cool = |d: Duration| {
        cx.st.cool_down(
            &upstream.name,
            cx.st.clock.now_micros() + d.as_micros() as u64,
        );
    };
    match status {
        429 => {
            cool(upstream.cooldown);
            Forwarded::Retry(ApiError::UpstreamRateLimited {
                retry_after_secs: Some(upstream.cooldown.as_secs().max(1)),
            })
        }
        401 | 403 => {
            metrics.auth_failed();
            Forwarded::Failed(ApiError::BadGateway(format!(
                "Upstream deployment {} refused the gateway's credentials ({status}{}).",
                upstream.name,
                if cloud.status.is_empty() {
                    String::new()
                } else {
                    format!(" {}", cloud.status)
                }
            )))
        }
        503 => {
            cool(upstream.cooldown);
            Forwarded::Retry(ApiError::Unavailable(format!(
                "Upstream deployment {} is unavailable; please retry.",
                upstream.name
            )))
        }
        504 => {
            cool(upstream.cooldown);
            Forwarded::Retry(ApiError::GatewayTimeout)
        }
        OVERLOADED => Forwarded::Retry(ApiError::Overloaded),
        400..=499 => {
            let message = if cloud.message.is_empty() {
                format!("Vertex AI answered {status}.")
            } else {
                cloud.message
            };
            let mut r = Response::new(Body::from(error_body(error_type(status), &message)));
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            *r.headers_mut() = headers;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Forwarded::PassedOn(r)
        }
        _ => Forwarded::Retry(ApiError::BadGateway(format!(
            "Upstream deployment {} failed with status {status}.",
            upstream.name
        ))),
    }
}

async fn read_bounded(mut resp: reqwest::Response) -> Vec<u8> {
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        out.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - out.len())]);
        if out.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_give_status_and_message() {
        let google = br#"{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_input_tokens_per_minute_per_base_model","status":"RESOURCE_EXHAUSTED"}}"#;
        assert_eq!(
            CloudError::parse(google),
            CloudError {
                status: "RESOURCE_EXHAUSTED".into(),
                message: "Quota exceeded for aiplatform.googleapis.com/online_prediction_input_tokens_per_minute_per_base_model".into()
            }
        );
        let listed = br#"[{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}]"#;
        assert_eq!(CloudError::parse(listed).status, "INVALID_ARGUMENT");
        let anthropic =
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}}"#;
        assert_eq!(
            CloudError::parse(anthropic),
            CloudError {
                status: "invalid_request_error".into(),
                message: "max_tokens: too big".into()
            }
        );
        assert_eq!(CloudError::parse(b"<html>"), CloudError::default());
    }
}
