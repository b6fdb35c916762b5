//! Google's error shape (Google Cloud APIs, "Errors": the JSON mapping of
//! `google.rpc.Status`): `{"error":{"code":429,"message":…,"status":"RESOURCE_EXHAUSTED","details":[…]}}`.
//! A refusal carries the details Google's clients act on: `RetryInfo`
//! (`retryDelay: "Ns"`) and a `QuotaFailure` whose `quotaId` says whether
//! the limit is per minute or per day — Gemini CLI retries the first and
//! stops on the second (its `classifyGoogleError`: a `quotaId` holding
//! `PerDay` is terminal, a `RetryInfo` of at most 300 s is retried).

use axum::http::StatusCode;
use serde_json::{json, Value};

/// The canonical status word of an HTTP status (`google.rpc.Code`'s HTTP
/// mapping).
pub fn status_word(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 411 | 413 | 415 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        502 | 503 | 529 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

/// The error body for `status` with `message` and `details`.
pub fn error_body(status: StatusCode, message: &str, details: &[Value]) -> String {
    let mut error = json!({
        "code": status.as_u16(),
        "message": message,
        "status": status_word(status),
    });
    if !details.is_empty() {
        error["details"] = Value::Array(details.to_vec());
    }
    json!({ "error": error }).to_string()
}

/// How long a refused request should wait, for `RetryInfo`.
pub fn retry_info(retry_after_secs: u64) -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": format!("{}s", retry_after_secs.max(1)),
    })
}

/// Which limit refused, for `QuotaFailure`: `quota_id` names the budget
/// and its window (`TokensPerMinute`, `TokensPerDay`…), `subject` the
/// scope (`tenant:acme`).
pub fn quota_failure(quota_id: &str, subject: &str, description: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{
            "subject": subject,
            "description": description,
            "quotaId": quota_id,
        }],
    })
}

/// Why, for `ErrorInfo` (`reason` upper snake case, domain the gateway's).
pub fn error_info(reason: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "budgetgate",
    })
}

/// An SSE event carrying Google's error body: the google-genai SDKs raise
/// an `APIError` on a chunk holding `error`.
pub fn error_event(status: StatusCode, message: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!(
        "data: {}\r\n\r\n",
        error_body(status, message, &[])
    ))
}

/// The `quotaId` of a budget: its kind and window in Google's words, so
/// a client reading `QuotaFailure` tells a per-minute limit (wait and
/// retry) from a per-day or per-month one (stop).
pub fn quota_id(name: crate::budget::BudgetName) -> &'static str {
    use crate::budget::BudgetName;
    match name {
        BudgetName::Rpm => "RequestsPerMinute",
        BudgetName::Tpm => "TokensPerMinute",
        BudgetName::InputTpm => "InputTokensPerMinute",
        BudgetName::OutputTpm => "OutputTokensPerMinute",
        BudgetName::MaxConcurrent => "ConcurrentRequests",
        BudgetName::TokensPerDay => "TokensPerDay",
        BudgetName::TokensPerMonth => "TokensPerMonth",
        BudgetName::RequestsPerDay => "RequestsPerDay",
        BudgetName::UsdPerDay => "DollarsPerDay",
        BudgetName::UsdPerMonth => "DollarsPerMonth",
        BudgetName::TokensPer5h => "TokensPerRolling5Hours",
        BudgetName::TokensPer24h => "TokensPerRolling24Hours",
        BudgetName::TokensPerWeek => "TokensPerRollingWeek",
        BudgetName::UsdPer5h => "DollarsPerRolling5Hours",
        BudgetName::UsdPer24h => "DollarsPerRolling24Hours",
        BudgetName::UsdPerWeek => "DollarsPerRollingWeek",
        BudgetName::RequestsPer5h => "RequestsPerRolling5Hours",
        BudgetName::RequestsPer24h => "RequestsPerRolling24Hours",
        BudgetName::RequestsPerWeek => "RequestsPerRollingWeek",
        BudgetName::RunsPerDay => "RunsPerDay",
    }
}

/// A refusal's message, kept on the response until its details are known
/// ([`with_details`]).
#[derive(Debug, Clone)]
pub struct Pending(pub String);

/// A response in Google's shape for `status` and `message`; its body is
/// written again by [`with_details`] when the refusal has details.
pub fn shaped(status: StatusCode, message: &str) -> axum::response::Response {
    let mut r =
        axum::response::Response::new(axum::body::Body::from(error_body(status, message, &[])));
    *r.status_mut() = status;
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    r.extensions_mut().insert(Pending(message.to_string()));
    r
}

/// `resp` (from [`shaped`]) with `details`, and a `RetryInfo` for its
/// `retry-after` when it is a 429 or a 503.
pub fn with_details(
    mut resp: axum::response::Response,
    mut details: Vec<Value>,
) -> axum::response::Response {
    let Some(Pending(message)) = resp.extensions_mut().remove::<Pending>() else {
        return resp;
    };
    let status = resp.status();
    let retry = resp
        .headers()
        .get(axum::http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(secs) = retry.filter(|_| matches!(status.as_u16(), 429 | 503)) {
        details.push(retry_info(secs));
    }
    if !details.is_empty() {
        *resp.body_mut() = axum::body::Body::from(error_body(status, &message, &details));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refusal_carries_retry_info_from_its_retry_after() {
        let mut r = shaped(StatusCode::TOO_MANY_REQUESTS, "slow down");
        r.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("7"));
        let r = with_details(r, vec![quota_failure("TokensPerMinute", "tenant:a", "x")]);
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16)
            .await
            .unwrap_or_default();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_eq!(v["error"]["code"], 429);
        assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(v["error"]["message"], "slow down");
        assert_eq!(
            v["error"]["details"][0]["violations"][0]["quotaId"],
            "TokensPerMinute"
        );
        assert_eq!(
            v["error"]["details"][1]["@type"],
            "type.googleapis.com/google.rpc.RetryInfo"
        );
        assert_eq!(v["error"]["details"][1]["retryDelay"], "7s");
    }
}
