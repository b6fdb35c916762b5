//! Amazon Bedrock: its exceptions (named by `x-amzn-ErrorType` or the
//! body's `__type`) as the status the gateway acts on and Anthropic's error
//! type ([`normalized_error`]; the answer is rewritten so before the table
//! reads it: throttling 429, validation 400, bad credentials 403, model
//! not ready 503, model timeout 504), the same for an exception that ends
//! a stream ([`anthropic_error_type`]), and what those statuses mean.
//!
//! As for the providers' APIs, but a cloud model that is not ready or
//! timed out (503 / 504) is as unusable for a while as a throttled one:
//! the deployment cools down. Refused credentials (an IAM policy or an
//! expired role) deny this region, not the model: the deployment is kept
//! away (its reason in /readyz) while another serves.

use serde_json::Value;

use super::direct::{self, credentials, retry_after_or_cooldown};
use super::{ErrorAnswer, Failure};

pub fn classify(status: u16, a: &ErrorAnswer<'_>) -> Failure {
    match (status, direct::classify(status, a)) {
        (401 | 403, _) => Failure::Denied {
            refusal: credentials(a),
            cool: a.cooldown,
        },
        (503 | 504, Failure::Retry { refusal, .. }) => Failure::Retry {
            refusal,
            cool: Some(retry_after_or_cooldown(a)),
        },
        (_, f) => f,
    }
}

/// A Bedrock error answer (`status`, its headers and body) as the status
/// the gateway acts on, Anthropic's error type and the cloud's message.
/// The exception is named by `x-amzn-ErrorType` or the body's `__type`.
pub fn normalized_error(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
) -> (u16, &'static str, String) {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let name = headers
        .get("x-amzn-errortype")
        .and_then(|h| h.to_str().ok())
        .map(|h| h.split(':').next().unwrap_or(h).to_string())
        .or_else(|| {
            v.get("__type")
                .and_then(Value::as_str)
                .map(|t| t.rsplit('#').next().unwrap_or(t).to_string())
        })
        .unwrap_or_default()
        .to_ascii_lowercase();
    let message = v
        .get("message")
        .or_else(|| v.get("Message"))
        .or_else(|| v.pointer("/error/message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("Bedrock answered with status {status}."));
    let is = |p: &str| name.starts_with(p);
    let auth = [
        "accessdenied",
        "unrecognizedclient",
        "expiredtoken",
        "invalidsignature",
        "incompletesignature",
        "missingauthenticationtoken",
        "invalidclienttokenid",
    ];
    if is("throttling") || is("servicequotaexceeded") || is("toomanyrequests") {
        (429, "rate_limit_error", message)
    } else if is("validation") {
        (400, "invalid_request_error", message)
    } else if auth.iter().any(|a| is(a)) {
        (403, "permission_error", message)
    } else if is("modelnotready") || is("serviceunavailable") {
        (503, "overloaded_error", message)
    } else if is("modeltimeout") {
        (504, "timeout_error", message)
    } else if is("resourcenotfound") {
        (404, "not_found_error", message)
    } else {
        match status {
            429 => (429, "rate_limit_error", message),
            401 | 403 => (403, "permission_error", message),
            408 => (504, "timeout_error", message),
            400 => (400, "invalid_request_error", message),
            503 => (503, "overloaded_error", message),
            s => (s, "api_error", message),
        }
    }
}

/// The Anthropic error type closest to a Bedrock exception (either
/// spelling: `throttlingException`, `ThrottlingException`).
pub fn anthropic_error_type(exception: &str) -> &'static str {
    let e = exception.to_ascii_lowercase();
    if e.starts_with("throttling") || e.starts_with("servicequotaexceeded") {
        "rate_limit_error"
    } else if e.starts_with("validation") {
        "invalid_request_error"
    } else if e.starts_with("serviceunavailable") || e.starts_with("modelnotready") {
        "overloaded_error"
    } else if e.starts_with("accessdenied") {
        "permission_error"
    } else {
        "api_error"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exceptions_map_to_the_status_the_gateway_acts_on() {
        let mut h = reqwest::header::HeaderMap::new();
        let body = br#"{"message":"Too many requests"}"#;
        h.insert(
            "x-amzn-errortype",
            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"
                .parse()
                .unwrap(),
        );
        assert_eq!(normalized_error(429, &h, body).0, 429);
        let h = reqwest::header::HeaderMap::new();
        for (ty, status, want) in [
            ("ValidationException", 400, 400),
            ("ServiceQuotaExceededException", 400, 429),
            ("AccessDeniedException", 403, 403),
            ("UnrecognizedClientException", 403, 403),
            ("ExpiredTokenException", 403, 403),
            ("ModelNotReadyException", 429, 503),
            ("ModelTimeoutException", 408, 504),
        ] {
            let body = format!(r#"{{"__type":"com.amazon#{ty}","message":"m of {ty}"}}"#);
            let (s, _, m) = normalized_error(status, &h, body.as_bytes());
            assert_eq!(
                (s, m.as_str()),
                (want, format!("m of {ty}").as_str()),
                "{ty}"
            );
        }
    }
}
