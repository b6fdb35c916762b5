//! Gemini deployments: the Gemini API (`kind = "gemini"`: the key in
//! `x-goog-api-key`, models under `{base}/models/`) and Gemini on Vertex
//! AI (`kind = "vertex"` with `publisher = "google"`: an OAuth access
//! token, models under the project and region). Both take the client's
//! `generateContent` body as it is; a stream is always asked for as SSE
//! (`alt=sse`), which the relay meters (the JSON-array framing a client
//! may want is made on the way out). The client's query (its `?key=`)
//! never reaches here: the URL is built from the deployment alone.

use bytes::Bytes;

use super::{classify_send_error, UpstreamClient, UpstreamError, URL_CACHE_MAX, X_REQUEST_ID};
use crate::config::{UpstreamKind, UpstreamPolicy};

/// The Gemini API's key header.
const X_GOOG_API_KEY: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("x-goog-api-key");

/// Characters of the model segment left as they are (Vertex's model ids
/// may carry a version after `@`).
const MODEL_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'_')
    .remove(b'-')
    .remove(b'@');

/// The model's URL on `upstream`: `{base}/models/{model}` (Gemini API) or
/// `{base}/v1/projects/{p}/locations/{r}/publishers/google/models/{model}`
/// (Vertex), then `:streamGenerateContent?alt=sse` for a stream,
/// `:generateContent` otherwise (`None`: neither, for logs).
pub fn model_url(upstream: &UpstreamPolicy, upstream_model: &str, stream: Option<bool>) -> String {
    let model = percent_encoding::utf8_percent_encode(upstream_model, MODEL_SEGMENT);
    let verb = match stream {
        Some(true) => ":streamGenerateContent?alt=sse",
        Some(false) => ":generateContent",
        None => "",
    };
    match upstream.vertex.as_deref() {
        Some(v) if upstream.kind == UpstreamKind::Vertex => format!(
            "{}/v1/projects/{}/locations/{}/publishers/google/models/{model}{verb}",
            upstream.base_url, v.project, v.region
        ),
        _ => format!("{}/models/{model}{verb}", upstream.base_url),
    }
}

impl UpstreamClient {
    /// [`UpstreamClient::send`] of a `generateContent` body to a Gemini
    /// deployment: the key (Gemini API) or an access token (Vertex; none,
    /// no request: [`UpstreamError::Credentials`]), then the body.
    pub(super) async fn send_gemini(
        &self,
        upstream: &UpstreamPolicy,
        upstream_model: &str,
        stream: bool,
        body: Bytes,
        request_id: axum::http::HeaderValue,
        extra_headers: &[(String, axum::http::HeaderValue)],
    ) -> Result<reqwest::Response, UpstreamError> {
        let token = if upstream.kind == UpstreamKind::Vertex {
            match self.vertex.authorization(upstream).await {
                Some(t) => Some(t),
                None => return Err(UpstreamError::Credentials(upstream.name.clone())),
            }
        } else {
            None
        };
        let url = self.gemini_url(upstream, upstream_model, stream)?;
        let mut req = self
            .client(upstream)?
            .post(url)
            .timeout(upstream.timeout)
            .header(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/json"),
            )
            .header(X_REQUEST_ID, request_id)
            .body(body);
        for (name, value) in extra_headers {
            req = req.header(name.as_str(), value.as_bytes());
        }
        req = match (token, &upstream.api_key) {
            (Some(t), _) => req.header(reqwest::header::AUTHORIZATION, t),
            (None, Some(key)) => req.header(X_GOOG_API_KEY, key),
            (None, None) => req,
        };
        req.send()
            .await
            .map_err(|e| classify_send_error(&upstream.name, &e))
    }

    fn gemini_url(
        &self,
        upstream: &UpstreamPolicy,
        upstream_model: &str,
        stream: bool,
    ) -> Result<reqwest::Url, UpstreamError> {
        let text = model_url(upstream, upstream_model, Some(stream));
        let mut urls = self.urls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = urls.get(&text) {
            return Ok(u.clone());
        }
        let url =
            reqwest::Url::parse(&text).map_err(|_| UpstreamError::Other(upstream.name.clone()))?;
        if urls.len() >= URL_CACHE_MAX {
            urls.clear();
        }
        urls.insert(text, url.clone());
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_both_surfaces() {
        let toml = r#"
[[upstreams]]
name = "studio"
kind = "gemini"
api_key_env = "PATH"
[[upstreams]]
name = "east"
kind = "vertex"
vertex = { project = "acme-prod", region = "us-east5", publisher = "google" }
[[models]]
name = "gemini-2.5-flash"
upstreams = ["studio", "east"]
"#;
        let p = match crate::config::Policy::from_toml(toml) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            model_url(&p.upstreams[0], "gemini-2.5-flash", Some(true)),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            model_url(&p.upstreams[1], "gemini-2.5-flash", Some(false)),
            "https://us-east5-aiplatform.googleapis.com/v1/projects/acme-prod/locations/us-east5/publishers/google/models/gemini-2.5-flash:generateContent"
        );
        assert!(p.models[0].gemini);
    }
}
