//! Vertex AI (docs/VERTEX.md, "Errors"). Vertex answers its own failures
//! in Google's shape (`{"error":{"code","message","status"}}`: quota,
//! credentials, permissions, malformed requests) and passes the model's in
//! Anthropic's; the client always gets Anthropic's shape.
//!
//! - 429 `RESOURCE_EXHAUSTED`: the deployment cools down, another may
//!   serve the request, else 429 with `retry-after` (the cooldown).
//! - 401 / 403: 502 naming the deployment (the gateway's credentials, not
//!   the client's fault); the cloud's words go to the log only.
//! - 503 / 504: the deployment cools down, another may serve it, else
//!   503 / 504.
//! - other 4xx (400 `INVALID_ARGUMENT`): the status with the cloud's
//!   message, as `invalid_request_error` (or the type of that status).

use super::direct::retry;
use super::{CloudError, ErrorAnswer, Failure, PassOn, Refusal};
use crate::dialects::anthropic::error::{error_type, OVERLOADED};

pub fn classify(status: u16, a: &ErrorAnswer<'_>) -> Failure {
    let cool = |refusal| Failure::Retry {
        refusal,
        cool: Some(a.cooldown),
    };
    match status {
        429 => cool(Refusal::RateLimited {
            retry_after_secs: Some(a.cooldown.as_secs().max(1)),
        }),
        401 | 403 => {
            let cloud = CloudError::parse(a.body);
            Failure::Fail(Refusal::Credentials(format!(
                "Upstream deployment {} refused the gateway's credentials ({status}{}).",
                a.deployment,
                if cloud.status.is_empty() {
                    String::new()
                } else {
                    format!(" {}", cloud.status)
                }
            )))
        }
        503 => cool(Refusal::Unavailable(format!(
            "Upstream deployment {} is unavailable; please retry.",
            a.deployment
        ))),
        504 => cool(Refusal::GatewayTimeout),
        OVERLOADED => retry(Refusal::Overloaded),
        400..=499 => {
            let cloud = CloudError::parse(a.body);
            let message = if cloud.message.is_empty() {
                format!("Vertex AI answered {status}.")
            } else {
                cloud.message
            };
            Failure::PassOn(PassOn::Anthropic {
                kind: error_type(status),
                message,
            })
        }
        _ => retry(Refusal::Failed(format!(
            "Upstream deployment {} failed with status {status}.",
            a.deployment
        ))),
    }
}
