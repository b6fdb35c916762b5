//! The error shape of the Messages dialect (Anthropic API reference,
//! "Errors"): `{"type":"error","error":{"type":…,"message":…}}`, with the
//! error `type` given by the HTTP status. An error mid-stream is an SSE
//! `error` event with the same body; the SDKs raise on it.

use axum::http::StatusCode;
use serde_json::json;

/// Anthropic's overloaded status (not in the IANA registry).
pub const OVERLOADED: u16 = 529;

/// The error `type` Anthropic's API uses for `status`.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        OVERLOADED => "overloaded_error",
        _ => "api_error",
    }
}

/// The JSON text of an error body.
pub fn error_body(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

/// The status an error answers with on this route: `Unavailable` caused
/// by overloaded upstreams answers 529 as Anthropic does.
pub fn status(status: StatusCode, overloaded: bool) -> StatusCode {
    if overloaded {
        StatusCode::from_u16(OVERLOADED).unwrap_or(status)
    } else {
        status
    }
}

/// An SSE `error` event.
pub fn error_event(kind: &str, message: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!(
        "event: error\ndata: {}\n\n",
        error_body(kind, message)
    ))
}
