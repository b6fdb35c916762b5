//! The providers' own APIs (OpenAI, Azure OpenAI, self-hosted
//! OpenAI-compatible servers, Anthropic): their error answers are already
//! in the shape the client speaks, so a client's mistake goes to it as it
//! came. 429 and 5xx (Anthropic's 529 `overloaded_error` included) may be
//! served by another deployment; a 429 cools the deployment down for the
//! upstream's `retry-after` (else its cooldown); 401 / 403 is the
//! gateway's key, not the client's fault: 502, no retry.

use std::time::Duration;

use super::{ErrorAnswer, Failure, PassOn, Refusal};
use crate::dialects::anthropic::error::OVERLOADED;

pub fn classify(status: u16, a: &ErrorAnswer<'_>) -> Failure {
    match status {
        429 => Failure::Retry {
            refusal: Refusal::RateLimited {
                retry_after_secs: a.retry_after_secs,
            },
            cool: Some(retry_after_or_cooldown(a)),
        },
        401 | 403 => Failure::Fail(credentials(a)),
        400..=499 => Failure::PassOn(PassOn::AsIs),
        503 => retry(Refusal::Unavailable(
            "The upstream is unavailable; please retry.".into(),
        )),
        // Like 503: another deployment may serve it.
        OVERLOADED => retry(Refusal::Overloaded),
        504 => retry(Refusal::GatewayTimeout),
        _ => retry(Refusal::Failed(format!(
            "The upstream failed with status {status}."
        ))),
    }
}

/// Another deployment may serve it; this one does not cool down.
pub(super) fn retry(refusal: Refusal) -> Failure {
    Failure::Retry {
        refusal,
        cool: None,
    }
}

/// How long a deployment that answered 429 (or, a cloud, 503 / 504) is
/// kept away.
pub(super) fn retry_after_or_cooldown(a: &ErrorAnswer<'_>) -> Duration {
    a.retry_after_secs.map_or(a.cooldown, Duration::from_secs)
}

/// Named so an operator knows which deployment's credentials to fix; the
/// credential itself never appears.
pub(super) fn credentials(a: &ErrorAnswer<'_>) -> Refusal {
    Refusal::Credentials(format!(
        "Deployment {} rejected the gateway's credentials.",
        a.deployment
    ))
}
