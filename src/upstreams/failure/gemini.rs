//! Gemini deployments: the Gemini API (`kind = "gemini"`) and Gemini on
//! Vertex AI (`kind = "vertex"`, `publisher = "google"`), both answering
//! in Google's shape (`{"error":{"code","message","status","details"}}`),
//! which the client of the Gemini route gets as it came (docs/GEMINI.md).
//!
//! - 429 `RESOURCE_EXHAUSTED`: the deployment (a project's rate limit, a
//!   Vertex region's shared capacity) cools down for the `RetryInfo`
//!   delay, else the `retry-after`, else its `cooldown_secs`; another may
//!   serve the request, else 429 with that wait.
//! - 400 with reason `API_KEY_INVALID` (the Gemini API's answer to a bad
//!   key), 401, 403: 502 naming the deployment (the gateway's
//!   credentials); the provider's words go to the log only.
//! - 500: another deployment may serve it; 503 and 504 cool down too.
//! - other 4xx: passed to the client as Google sent it.

use std::time::Duration;

use serde_json::Value;

use super::direct::retry;
use super::{CloudError, ErrorAnswer, Failure, PassOn, Refusal};

/// What the table reads of Google's details besides status and message.
#[derive(Debug, Default, PartialEq, Eq)]
struct Details {
    /// `ErrorInfo.reason` (`API_KEY_INVALID`).
    reason: String,
    /// `RetryInfo.retryDelay`, whole seconds rounded up.
    retry_delay_secs: Option<u64>,
}

fn details(body: &[u8]) -> Details {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Details::default();
    };
    let v = v.get(0).unwrap_or(&v);
    let list = v["error"].get("details").and_then(Value::as_array);
    let of_type = |t: &str| {
        list.and_then(|ds| {
            ds.iter()
                .find(|d| d.get("@type").and_then(Value::as_str) == Some(t))
        })
    };
    Details {
        reason: of_type("type.googleapis.com/google.rpc.ErrorInfo")
            .and_then(|i| i.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        retry_delay_secs: of_type("type.googleapis.com/google.rpc.RetryInfo")
            .and_then(|r| r.get("retryDelay"))
            .and_then(Value::as_str)
            .and_then(|d| d.strip_suffix('s'))
            .and_then(|d| d.parse::<f64>().ok())
            .filter(|d| d.is_finite() && *d >= 0.0 && *d < 1e9)
            .map(|d| d.ceil() as u64),
    }
}

pub fn classify(status: u16, a: &ErrorAnswer<'_>) -> Failure {
    let d = details(a.body);
    let credentials =
        matches!(status, 401 | 403) || (status == 400 && d.reason.starts_with("API_KEY"));
    if credentials {
        let cloud = CloudError::parse(a.body);
        return Failure::Fail(Refusal::Credentials(format!(
            "Upstream deployment {} refused the gateway's credentials ({status}{}).",
            a.deployment,
            if cloud.status.is_empty() {
                String::new()
            } else {
                format!(" {}", cloud.status)
            }
        )));
    }
    let cool = |refusal| Failure::Retry {
        refusal,
        cool: Some(a.cooldown),
    };
    match status {
        429 => {
            let wait = d
                .retry_delay_secs
                .or(a.retry_after_secs)
                .map_or(a.cooldown, Duration::from_secs);
            Failure::Retry {
                refusal: Refusal::RateLimited {
                    retry_after_secs: Some(wait.as_secs().max(1)),
                },
                cool: Some(wait),
            }
        }
        503 => cool(Refusal::Unavailable(format!(
            "Upstream deployment {} is unavailable; please retry.",
            a.deployment
        ))),
        504 => cool(Refusal::GatewayTimeout),
        400..=499 => Failure::PassOn(PassOn::AsIs),
        _ => retry(Refusal::Failed(format!(
            "Upstream deployment {} failed with status {status}.",
            a.deployment
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: &[u8]) -> ErrorAnswer<'_> {
        ErrorAnswer {
            deployment: "studio",
            cooldown: Duration::from_secs(30),
            retry_after_secs: None,
            body,
        }
    }

    #[test]
    fn a_429_cools_down_for_its_retry_info() {
        let body = br#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
        assert_eq!(
            classify(429, &answer(body)),
            Failure::Retry {
                refusal: Refusal::RateLimited {
                    retry_after_secs: Some(2)
                },
                cool: Some(Duration::from_secs(2)),
            }
        );
        // Without RetryInfo (Vertex's shared capacity): the cooldown.
        let vertex = br#"{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED"}}"#;
        assert!(matches!(
            classify(429, &answer(vertex)),
            Failure::Retry { cool: Some(c), .. } if c == Duration::from_secs(30)
        ));
    }

    #[test]
    fn a_bad_key_is_the_gateways_and_a_bad_request_the_clients() {
        let bad_key = br#"{"error":{"code":400,"message":"API key not valid.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID"}]}}"#;
        assert!(matches!(
            classify(400, &answer(bad_key)),
            Failure::Fail(Refusal::Credentials(_))
        ));
        let bad = br#"{"error":{"code":400,"message":"contents is not specified","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(classify(400, &answer(bad)), Failure::PassOn(PassOn::AsIs));
    }
}
