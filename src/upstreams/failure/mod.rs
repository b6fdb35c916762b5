//! What an upstream's error answer before any output means for the
//! attempt: one table per upstream kind, one entry, [`classify`]. The
//! tables are pure (status and body in, [`Failure`] out); the lifecycle
//! acts on the answer: refunds the reservation, cools the deployment
//! down, tries another or answers the client.
//!
//! - [`direct`]: OpenAI, Azure OpenAI, self-hosted servers, Anthropic.
//! - [`bedrock`]: Amazon Bedrock's exceptions, and its statuses.
//! - [`vertex`]: Vertex AI, whose own errors are in Google's shape.
//! - [`gemini`]: the Gemini API and Gemini on Vertex AI (Google's shape,
//!   passed on as it came).
//!
//! A kind is added as a file here and an arm in [`classify`].

use std::time::Duration;

use crate::config::UpstreamKind;

pub mod bedrock;
mod direct;
pub mod gemini;
mod vertex;

/// What the table reads of one error answer besides its status.
#[derive(Debug, Clone, Copy)]
pub struct ErrorAnswer<'a> {
    /// The deployment's name, for the client's message.
    pub deployment: &'a str,
    /// The deployment's cooldown after a refusal.
    pub cooldown: Duration,
    /// The upstream's `retry-after`, in seconds.
    pub retry_after_secs: Option<u64>,
    /// The answer's body (bounded).
    pub body: &'a [u8],
}

/// What an error answer means for the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Another deployment may serve the request; `refusal` if none is
    /// left; this one cools down for `cool` first.
    Retry {
        refusal: Refusal,
        cool: Option<Duration>,
    },
    /// The deployment refused the gateway's credentials for this region
    /// or role, not for the model: it is kept away for `cool` (its reason
    /// shown as access denied) and another may be tried, once per request.
    Denied { refusal: Refusal, cool: Duration },
    /// The request fails with `refusal`; no other deployment is tried.
    Fail(Refusal),
    /// The client's own mistake (a 4xx): the answer goes to it.
    PassOn(PassOn),
}

/// How an answer is passed to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassOn {
    /// Its status and body as they came.
    AsIs,
    /// Its status, with Anthropic's error body of this type and message
    /// (an upstream that answers its own errors in another shape).
    Anthropic { kind: &'static str, message: String },
}

/// What the client is answered when the request fails for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 429, with the seconds to wait when known.
    RateLimited { retry_after_secs: Option<u64> },
    /// 502: the upstream refused the gateway's credentials (not the
    /// client's fault); the message names the deployment.
    Credentials(String),
    /// 503 with this message.
    Unavailable(String),
    /// 503 (529 on the Messages route): the upstream is overloaded.
    Overloaded,
    /// 504.
    GatewayTimeout,
    /// 502 with this message.
    Failed(String),
}

/// The table of `kind` applied to an error answer of `status`.
pub fn classify(kind: UpstreamKind, status: u16, answer: &ErrorAnswer<'_>) -> Failure {
    match kind {
        UpstreamKind::Openai
        | UpstreamKind::Azure
        | UpstreamKind::SelfHosted
        | UpstreamKind::Anthropic => direct::classify(status, answer),
        UpstreamKind::Bedrock => bedrock::classify(status, answer),
        UpstreamKind::Vertex => vertex::classify(status, answer),
        UpstreamKind::Gemini => gemini::classify(status, answer),
    }
}

/// The message and status word of an error answer, for the log: Google's
/// shape (`{"error":{"code","message","status"}}`, alone or in a list of
/// one), Anthropic's and OpenAI's (`{"error":{"type","message"}}`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CloudError {
    /// Google's `status` (`RESOURCE_EXHAUSTED`) or the error's `type`.
    pub status: String,
    /// The human-readable message.
    pub message: String,
}

impl CloudError {
    /// Reads `body`; empty fields for anything else.
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

    fn answer(body: &[u8]) -> ErrorAnswer<'_> {
        ErrorAnswer {
            deployment: "d1",
            cooldown: Duration::from_secs(30),
            retry_after_secs: Some(7),
            body,
        }
    }

    /// The same statuses mean what each kind's table says: a throttle
    /// cools every kind down (for the upstream's `retry-after` where it
    /// sends one, else the deployment's cooldown), a cloud that is not
    /// ready cools Bedrock and Vertex down but not a provider's API,
    /// refused credentials fail the request on a provider's API and move
    /// Bedrock on to another region, and a client's mistake is passed on
    /// (Vertex's in Anthropic's shape).
    #[test]
    fn each_kind_reads_its_own_table() {
        let cooldown = Duration::from_secs(30);
        let a =
            answer(br#"{"error":{"code":400,"message":"bad field","status":"INVALID_ARGUMENT"}}"#);
        let kinds = [
            UpstreamKind::Openai,
            UpstreamKind::Anthropic,
            UpstreamKind::Bedrock,
            UpstreamKind::Vertex,
        ];
        for kind in kinds {
            let throttled = classify(kind, 429, &a);
            let Failure::Retry {
                refusal: Refusal::RateLimited { .. },
                cool: Some(cool),
            } = throttled
            else {
                panic!("{kind:?}: {throttled:?}");
            };
            let want = if kind == UpstreamKind::Vertex {
                cooldown
            } else {
                Duration::from_secs(7)
            };
            assert_eq!(cool, want, "{kind:?}");
            let unwell = classify(kind, 503, &a);
            let cooled = matches!(unwell, Failure::Retry { cool: Some(_), .. });
            let cloud = matches!(kind, UpstreamKind::Bedrock | UpstreamKind::Vertex);
            assert_eq!(cooled, cloud, "{kind:?}: {unwell:?}");
            let denied = classify(kind, 403, &a);
            match kind {
                UpstreamKind::Bedrock => assert!(
                    matches!(denied, Failure::Denied { cool, .. } if cool == cooldown),
                    "{denied:?}"
                ),
                _ => assert!(
                    matches!(denied, Failure::Fail(Refusal::Credentials(ref m)) if m.contains("d1")),
                    "{kind:?}: {denied:?}"
                ),
            }
            let mistake = classify(kind, 400, &a);
            let want = if kind == UpstreamKind::Vertex {
                PassOn::Anthropic {
                    kind: "invalid_request_error",
                    message: "bad field".into(),
                }
            } else {
                PassOn::AsIs
            };
            assert_eq!(mistake, Failure::PassOn(want), "{kind:?}");
            assert!(
                matches!(
                    classify(kind, 529, &a),
                    Failure::Retry {
                        refusal: Refusal::Overloaded,
                        ..
                    }
                ),
                "{kind:?}"
            );
            assert!(
                matches!(
                    classify(kind, 500, &a),
                    Failure::Retry {
                        refusal: Refusal::Failed(_),
                        ..
                    }
                ),
                "{kind:?}"
            );
        }
    }
}
