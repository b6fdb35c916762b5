//! The error body of the OpenAI dialects (`{"error":{"message","type",
//! "param","code"}}`, OpenAI API reference, "Error codes"): one builder
//! for HTTP responses, the admin API and SSE error events.

use serde_json::json;

/// The JSON text of an OpenAI error body.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> String {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}}).to_string()
}

/// An SSE event carrying an OpenAI error body; the official SDKs raise on it.
pub fn error_event(message: &str, kind: &str, code: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!(
        "data: {}\n\n",
        error_body(message, kind, None, Some(code))
    ))
}
