//! Gemini deployments: the Gemini API (`kind = "gemini"`: the key in
//! `x-goog-api-key`, models under `{base}/models/`) and Gemini on Vertex
//! AI (`kind = "vertex"` with `publisher = "google"`: an OAuth access
//! token, models under the project and region). Both take the client's
//! `generateContent` body as it is; a stream is always asked for as SSE
//! (`alt=sse`), which the relay meters (the JSON-array framing a client
//! may want is made on the way out). The client's query (its `?key=`)
//! never reaches here: the URL is built from the deployment alone.
//!
//! Chat completions for a Gemini model go to each surface's
//! OpenAI-compatible endpoint: the Gemini API's `{base}/openai/chat/completions`
//! (the key as a bearer token, sent by the OpenAI-compatible path of
//! [`super::UpstreamClient::send`]) and Vertex's
//! `{base}/v1/projects/{p}/locations/{r}/endpoints/openapi/chat/completions`
//! (the access token, sent from here; the model in the body as
//! `google/{model}`, the lifecycle's rewrite).

use bytes::Bytes;

use super::{classify_send_error, UpstreamClient, UpstreamError, URL_CACHE_MAX, X_REQUEST_ID};
use crate::config::{Family, UpstreamKind, UpstreamPolicy};
use crate::dialects::Dialect;

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

/// Whether a request of an OpenAI dialect to `upstream` goes to Vertex's
/// OpenAI-compatible endpoint (a Vertex deployment of Gemini models).
pub fn vertex_openai(upstream: &UpstreamPolicy) -> bool {
    upstream.kind == UpstreamKind::Vertex && upstream.family() == Family::Gemini
}

/// Vertex's OpenAI-compatible chat completions endpoint of the
/// deployment's project and region ("Using OpenAI libraries with Vertex
/// AI": the `openapi` endpoint; the model is named in the body).
pub fn vertex_openai_url(upstream: &UpstreamPolicy) -> String {
    let (project, region) = upstream
        .vertex
        .as_deref()
        .map_or(("", ""), |v| (v.project.as_str(), v.region.as_str()));
    format!(
        "{}/v1/projects/{project}/locations/{region}/endpoints/openapi/chat/completions",
        upstream.base_url
    )
}

/// The model as Vertex's OpenAI-compatible endpoint names it: its
/// publisher first (`google/gemini-2.5-flash`), unless the id has one.
pub fn vertex_openai_model(upstream_model: &str) -> std::borrow::Cow<'_, str> {
    if upstream_model.contains('/') {
        std::borrow::Cow::Borrowed(upstream_model)
    } else {
        std::borrow::Cow::Owned(format!("google/{upstream_model}"))
    }
}

impl UpstreamClient {
    /// [`UpstreamClient::send`] of a body to a Gemini deployment: a
    /// `generateContent` body (`dialect` Gemini) to the model's URL, or a
    /// chat completions body to Vertex's OpenAI-compatible endpoint; with
    /// the key (Gemini API) or an access token (Vertex; none, no request:
    /// [`UpstreamError::Credentials`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn send_gemini(
        &self,
        upstream: &UpstreamPolicy,
        dialect: Dialect,
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
        let url = if dialect == Dialect::Gemini {
            self.gemini_url(upstream, model_url(upstream, upstream_model, Some(stream)))?
        } else {
            self.gemini_url(upstream, vertex_openai_url(upstream))?
        };
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

    /// The parsed URL `text` (cached by its text).
    fn gemini_url(
        &self,
        upstream: &UpstreamPolicy,
        text: String,
    ) -> Result<reqwest::Url, UpstreamError> {
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
        assert!(!vertex_openai(&p.upstreams[0]));
        assert!(vertex_openai(&p.upstreams[1]));
        assert_eq!(
            vertex_openai_url(&p.upstreams[1]),
            "https://us-east5-aiplatform.googleapis.com/v1/projects/acme-prod/locations/us-east5/endpoints/openapi/chat/completions"
        );
        assert_eq!(
            crate::upstreams::endpoint_url(
                &p.upstreams[0],
                Dialect::ChatCompletions,
                "gemini-2.5-flash"
            ),
            "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"
        );
        assert_eq!(
            vertex_openai_model("gemini-2.5-flash"),
            "google/gemini-2.5-flash"
        );
        assert_eq!(
            vertex_openai_model("google/gemini-2.5-flash"),
            "google/gemini-2.5-flash"
        );
    }
}
