//! `kind = "bedrock"`: Claude on Amazon Bedrock (docs/BEDROCK.md), for Messages
//! clients. Two APIs, chosen per deployment ([`crate::config::bedrock`]):
//!
//! - the Anthropic Messages endpoint (`{base}/anthropic/v1/messages` on
//!   `bedrock-mantle` or `bedrock-runtime`): the body as for Anthropic
//!   with `model` = the Bedrock model id, SSE back, relayed as is;
//! - InvokeModel (`{base}/model/{id}/invoke`) and
//!   InvokeModelWithResponseStream (`…/invoke-with-response-stream`): the
//!   body without `model` and `stream`, with `anthropic_version` and the
//!   client's betas as `anthropic_beta`; the event-stream answer is turned
//!   into Anthropic SSE here ([`event_stream`]), so metering, cutoff and
//!   settlement are those of `kind = "anthropic"`.
//!
//! Requests are signed with SigV4 ([`sigv4`], credentials from
//! [`credentials`]) or carry a Bedrock API key. Error answers are
//! rewritten into Anthropic's error shape with the status the gateway
//! acts on ([`super::failure::bedrock::normalized_error`]): throttling 429, validation 400, bad
//! credentials 403, model not ready 503, model timeout 504.

pub mod credentials;
pub mod event_stream;
pub mod sigv4;

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use serde_json::{json, Map, Value};

use super::failure::bedrock::normalized_error;
use super::{classify_send_error, path_segment, UpstreamClient, UpstreamError};
use crate::clock::Clock as _;
use crate::config::bedrock::{BedrockApi, BedrockAuth, BedrockSettings, INVOKE_ANTHROPIC_VERSION};
use crate::config::UpstreamPolicy;

/// `anthropic-version` of the Messages endpoint when the client sends none.
const MESSAGES_VERSION: &str = "2023-06-01";

/// The event-stream media type InvokeModelWithResponseStream answers in.
const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";

/// The URL of a request to model `model_id` on deployment `upstream`.
pub fn url(upstream: &UpstreamPolicy, s: &BedrockSettings, model_id: &str, stream: bool) -> String {
    match s.api {
        BedrockApi::Messages => format!("{}/anthropic/v1/messages", upstream.base_url),
        BedrockApi::Invoke => format!(
            "{}/model/{}/{}",
            upstream.base_url,
            path_segment(model_id),
            if stream {
                "invoke-with-response-stream"
            } else {
                "invoke"
            }
        ),
    }
}

/// The InvokeModel body of a Messages body: without `model` and `stream`,
/// with `anthropic_version` and (when the client sent betas) `anthropic_beta`.
/// Returns it and whether the client asked for a stream.
pub fn invoke_body(body: &[u8], betas: &[String]) -> Result<(Vec<u8>, bool), serde_json::Error> {
    let mut m: Map<String, Value> = serde_json::from_slice(body)?;
    m.remove("model");
    let stream = m
        .remove("stream")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    m.insert(
        "anthropic_version".into(),
        Value::String(INVOKE_ANTHROPIC_VERSION.into()),
    );
    if !betas.is_empty() {
        m.insert("anthropic_beta".into(), json!(betas));
    }
    Ok((serde_json::to_vec(&m)?, stream))
}

/// The beta names of the `anthropic-beta` headers among `headers`.
fn betas(headers: &[(String, axum::http::HeaderValue)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(n, _)| n == "anthropic-beta")
        .filter_map(|(_, v)| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect()
}

impl UpstreamClient {
    /// Sends a Messages request to Bedrock deployment `upstream` as model
    /// `model_id` (see the module docs). Returns once headers arrived; the
    /// body of a streamed InvokeModel answer is already SSE.
    pub(super) async fn send_bedrock(
        &self,
        upstream: &UpstreamPolicy,
        settings: &BedrockSettings,
        model_id: &str,
        body: Bytes,
        request_id: axum::http::HeaderValue,
        extra_headers: &[(String, axum::http::HeaderValue)],
    ) -> Result<reqwest::Response, UpstreamError> {
        let invoke = settings.api == BedrockApi::Invoke;
        let (body, stream) = if invoke {
            let (b, stream) = invoke_body(&body, &betas(extra_headers))
                .map_err(|_| UpstreamError::Other(upstream.name.clone()))?;
            (Bytes::from(b), stream)
        } else {
            (body, false)
        };
        let url = url(upstream, settings, model_id, stream);
        let accept = if stream {
            EVENT_STREAM
        } else {
            "application/json"
        };
        let version = extra_headers
            .iter()
            .find(|(n, _)| n == "anthropic-version")
            .and_then(|(_, v)| v.to_str().ok())
            .unwrap_or(MESSAGES_VERSION)
            .to_string();
        let mut signed: Vec<(&str, &str)> =
            vec![("content-type", "application/json"), ("accept", accept)];
        if !invoke {
            signed.push(("anthropic-version", version.as_str()));
        }
        let mut auth: Vec<(&'static str, String)> = Vec::new();
        match &settings.auth {
            BedrockAuth::ApiKey => {
                let key = upstream.api_key.clone().unwrap_or_default();
                match settings.api {
                    BedrockApi::Messages => auth.push(("x-api-key", key)),
                    BedrockApi::Invoke => auth.push(("authorization", format!("Bearer {key}"))),
                }
            }
            BedrockAuth::SigV4 { .. } => {
                let credentials = match self.aws.get(&upstream.name, settings).await {
                    Ok(c) => c,
                    Err(why) => {
                        // Nothing was sent: the next deployment may serve it.
                        tracing::warn!(deployment = %upstream.name, error = %why, "AWS credentials could not be loaded");
                        return Err(UpstreamError::Credentials(upstream.name.clone()));
                    }
                };
                let now = std::time::UNIX_EPOCH
                    + Duration::from_micros(crate::clock::SystemClock.now_micros());
                auth = sigv4::sign_request(
                    "POST",
                    &url,
                    &signed,
                    &body,
                    &credentials,
                    &settings.region,
                    &settings.signing_name,
                    now,
                )
                .map_err(|_| UpstreamError::Other(upstream.name.clone()))?;
            }
        }
        let mut req = self
            .client(upstream)?
            .post(url.as_str())
            .timeout(upstream.timeout)
            .header("x-request-id", request_id)
            .body(body);
        for (n, v) in &signed {
            req = req.header(*n, *v);
        }
        for (n, v) in &auth {
            req = req.header(*n, v.as_str());
        }
        if !invoke {
            for (n, v) in extra_headers
                .iter()
                .filter(|(n, _)| n != "anthropic-version")
            {
                req = req.header(n.as_str(), v.as_bytes());
            }
        } else {
            // Betas went into the body; the version is the body's.
            for (n, v) in extra_headers
                .iter()
                .filter(|(n, _)| n != "anthropic-version" && n != "anthropic-beta")
            {
                req = req.header(n.as_str(), v.as_bytes());
            }
        }
        let resp = req
            .send()
            .await
            .map_err(|e| classify_send_error(&upstream.name, &e))?;
        let status = resp.status();
        if !status.is_success() {
            let headers = resp.headers().clone();
            let body = resp.bytes().await.unwrap_or_default();
            let (status, kind, message) = normalized_error(status.as_u16(), &headers, &body);
            let mut r = local_error(status, kind, &message);
            if status == 429 {
                let secs = upstream.cooldown.as_secs().max(1).to_string();
                if let Ok(v) = axum::http::HeaderValue::from_str(&secs) {
                    r = with_header(r, "retry-after", v);
                }
            }
            return Ok(r);
        }
        if !stream {
            return Ok(resp);
        }
        let mut out = axum::http::Response::builder()
            .status(200)
            .header("content-type", "text/event-stream");
        for name in ["x-amzn-requestid", "x-request-id"] {
            if let Some(v) = resp.headers().get(name) {
                out = out.header(name, v.clone());
            }
        }
        let frames = resp.bytes_stream().map(|r| r.map_err(read_error));
        let sse = event_stream::to_sse(Box::pin(frames));
        out.body(reqwest::Body::wrap_stream(sse))
            .map(reqwest::Response::from)
            .map_err(|_| UpstreamError::Other(upstream.name.clone()))
    }
}

/// A read error of an event-stream body, its kind kept: reqwest's
/// `is_timeout` finds `TimedOut` in the chain of the relay's error.
fn read_error(e: reqwest::Error) -> std::io::Error {
    let kind = if e.is_timeout() {
        std::io::ErrorKind::TimedOut
    } else {
        std::io::ErrorKind::Other
    };
    std::io::Error::new(kind, e)
}

fn with_header(
    r: reqwest::Response,
    name: &'static str,
    v: axum::http::HeaderValue,
) -> reqwest::Response {
    let mut r = r;
    r.headers_mut().insert(name, v);
    r
}

/// An answer made here, as if from the upstream: status and Anthropic's
/// error body.
fn local_error(status: u16, kind: &str, message: &str) -> reqwest::Response {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}}).to_string();
    let r = axum::http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(reqwest::Body::from(body))
        .unwrap_or_else(|_| axum::http::Response::new(reqwest::Body::from("")));
    reqwest::Response::from(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invoke_body_drops_model_and_stream_and_names_version_and_betas() {
        let (b, stream) = invoke_body(
            br#"{"model":"m","stream":true,"max_tokens":5,"messages":[]}"#,
            &["a-2025".into(), "b-2026".into()],
        )
        .unwrap();
        assert!(stream);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v.get("model"), None);
        assert_eq!(v.get("stream"), None);
        assert_eq!(v["anthropic_version"], "bedrock-2023-05-31");
        assert_eq!(v["anthropic_beta"], json!(["a-2025", "b-2026"]));
        assert_eq!(v["max_tokens"], 5);
    }

    #[test]
    fn the_model_id_is_one_percent_encoded_path_segment() {
        let p = crate::config::Policy::from_toml(
            r#"
[[upstreams]]
name = "br"
kind = "bedrock"
base_url = "https://bedrock-runtime.us-east-1.amazonaws.com/"
bedrock = { region = "us-east-1" }
"#,
        )
        .unwrap();
        let up = &p.upstreams[0];
        let s = up.bedrock.as_ref().unwrap();
        assert_eq!(
            url(up, s, "us.anthropic.claude-opus-4-8-v1:0", true),
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/us.anthropic.claude-opus-4-8-v1%3A0/invoke-with-response-stream"
        );
        assert!(url(up, s, "m", false).ends_with("/model/m/invoke"));
        let messages = BedrockSettings {
            api: BedrockApi::Messages,
            ..s.clone()
        };
        assert_eq!(
            url(up, &messages, "m", true),
            "https://bedrock-runtime.us-east-1.amazonaws.com/anthropic/v1/messages"
        );
    }
}
