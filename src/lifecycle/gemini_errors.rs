//! What a Gemini deployment's error answer (the Gemini API's or Vertex
//! Gemini's, both in Google's shape) means for the attempt; the client of
//! the Gemini route gets Google's shape too.
//!
//! - 429 `RESOURCE_EXHAUSTED`: the deployment (a Vertex region, an API
//!   project) cools down for the `RetryInfo` delay, else its
//!   `cooldown_secs`; another deployment may serve the request, else 429
//!   with `retry-after`.
//! - 400 with reason `API_KEY_INVALID`, 401, 403: the gateway's
//!   credentials: 502 naming the deployment, the provider's words in the
//!   log only.
//! - 500, 503, 504: the deployment cools down (503, 504) and another may
//!   serve it.
//! - other 4xx: passed to the client as Google sent it (the client's own
//!   mistake, in its own dialect's shape).

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::context::RequestContext;
use super::forward::Forwarded;
use crate::admission::HeldReservation;
use crate::config::UpstreamPolicy;
use crate::gateway::error::ApiError;
use crate::metrics::DeploymentMetrics;
use crate::settlement::Settling;

/// Most bytes of an error answer read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What the gateway reads of Google's error body.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GoogleError {
    /// `status` (`RESOURCE_EXHAUSTED`).
    pub status: String,
    /// `message`.
    pub message: String,
    /// `ErrorInfo.reason` (`API_KEY_INVALID`).
    pub reason: String,
    /// `RetryInfo.retryDelay`, whole seconds rounded up.
    pub retry_delay_secs: Option<u64>,
}

impl GoogleError {
    /// Reads `body` (an object, or Google's list of one).
    pub fn parse(body: &[u8]) -> GoogleError {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return GoogleError::default();
        };
        let v = v.get(0).unwrap_or(&v);
        let e = &v["error"];
        let text = |x: &Value, k: &str| x.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let details = e.get("details").and_then(Value::as_array);
        let of_type = |t: &str| {
            details.and_then(|ds| {
                ds.iter()
                    .find(|d| d.get("@type").and_then(Value::as_str) == Some(t))
            })
        };
        let retry_delay_secs = of_type("type.googleapis.com/google.rpc.RetryInfo")
            .and_then(|r| r.get("retryDelay"))
            .and_then(Value::as_str)
            .and_then(|d| d.strip_suffix('s'))
            .and_then(|d| d.parse::<f64>().ok())
            .filter(|d| d.is_finite() && *d >= 0.0 && *d < 1e9)
            .map(|d| d.ceil() as u64);
        GoogleError {
            status: text(e, "status"),
            message: text(e, "message"),
            reason: of_type("type.googleapis.com/google.rpc.ErrorInfo")
                .map(|i| text(i, "reason"))
                .unwrap_or_default(),
            retry_delay_secs,
        }
    }
}

/// A Gemini deployment answered `resp` (an error status) before any
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
    let retry_after = resp
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    hold.settle_now(refund).await;
    let body = read_bounded(resp).await;
    let google = GoogleError::parse(&body);
    tracing::warn!(deployment = %upstream.name, status, google_status = %google.status, reason = %google.reason, message = %google.message, "gemini deployment answered with an error");
    let cool = |d: Duration| {
        cx.st.cool_down(
            &upstream.name,
            cx.st.clock.now_micros() + d.as_micros() as u64,
        );
    };
    let credentials = matches!(status, 401 | 403)
        || (status == 400 && google.reason.starts_with("API_KEY"));
    if credentials {
        metrics.auth_failed();
        return Forwarded::Failed(ApiError::BadGateway(format!(
            "Upstream deployment {} refused the gateway's credentials ({status}{}).",
            upstream.name,
            if google.status.is_empty() {
                String::new()
            } else {
                format!(" {}", google.status)
            }
        )));
    }
    match status {
        429 => {
            let wait = google
                .retry_delay_secs
                .or(retry_after)
                .map_or(upstream.cooldown, Duration::from_secs);
            cool(wait);
            Forwarded::Retry(ApiError::UpstreamRateLimited {
                retry_after_secs: Some(wait.as_secs().max(1)),
            })
        }
        503 | 504 => {
            cool(upstream.cooldown);
            Forwarded::Retry(if status == 503 {
                ApiError::Unavailable(format!(
                    "Upstream deployment {} is unavailable; please retry.",
                    upstream.name
                ))
            } else {
                ApiError::GatewayTimeout
            })
        }
        400..=499 => {
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            *r.headers_mut() = headers;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json; charset=UTF-8"),
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
    fn retry_info_and_the_reason_are_read() {
        let body = br#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"},{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED"}]}}"#;
        let e = GoogleError::parse(body);
        assert_eq!(e.status, "RESOURCE_EXHAUSTED");
        assert_eq!(e.retry_delay_secs, Some(2));
        assert_eq!(e.reason, "RATE_LIMIT_EXCEEDED");
        let listed = br#"[{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}]"#;
        assert_eq!(GoogleError::parse(listed).status, "INVALID_ARGUMENT");
        assert_eq!(GoogleError::parse(b"<html>"), GoogleError::default());
    }
}
