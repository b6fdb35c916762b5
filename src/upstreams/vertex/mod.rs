//! `kind = "vertex"`: Claude on Google Vertex AI (docs/VERTEX.md). The
//! Messages body (model out, `anthropic_version` in: the lifecycle's
//! rewrite) goes to `rawPredict`, or `streamRawPredict` for a stream,
//! under the project and region of the deployment, with an OAuth access
//! token ([`credentials`]). What comes back is Anthropic's own answer and
//! SSE, relayed as for `kind = "anthropic"`.
//!
//! - [`credentials`]: each deployment's token source, loaded at start.
//! - [`source`]: which credentials a deployment would use (`check-config`).

pub mod credentials;
pub mod source;

use bytes::Bytes;

use super::{classify_send_error, UpstreamClient, UpstreamError, URL_CACHE_MAX, X_REQUEST_ID};
use crate::config::UpstreamPolicy;

/// Characters of the model segment left as they are: a path segment's
/// letters, digits, `.`, `_`, `-`, and `@` (Vertex's model ids carry
/// their version after it: `claude-opus-4-1@20250805`; RFC 3986 allows it
/// in a path segment).
const MODEL_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'_')
    .remove(b'-')
    .remove(b'@');

/// The model id in the path of `upstream`'s endpoint for a request whose
/// model goes upstream as `upstream_model`: already the deployment's own id
/// (`UpstreamPolicy::model_id`, its `models` map, chosen by the forward
/// phase for every kind).
pub fn path_model<'a>(_upstream: &UpstreamPolicy, upstream_model: &'a str) -> &'a str {
    upstream_model
}

/// `{base}/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}`,
/// then `:streamRawPredict` for a stream and `:rawPredict` otherwise
/// (`method` false: neither, for logs that do not know).
pub fn model_url(upstream: &UpstreamPolicy, upstream_model: &str, method: Option<bool>) -> String {
    let (project, region) = upstream
        .vertex
        .as_deref()
        .map_or(("", ""), |v| (v.project.as_str(), v.region.as_str()));
    let model =
        percent_encoding::utf8_percent_encode(path_model(upstream, upstream_model), MODEL_SEGMENT);
    let verb = match method {
        Some(true) => ":streamRawPredict",
        Some(false) => ":rawPredict",
        None => "",
    };
    format!(
        "{}/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}{verb}",
        upstream.base_url
    )
}

impl UpstreamClient {
    /// [`UpstreamClient::send`] to a Vertex deployment: the access token
    /// first (no token, no request: [`UpstreamError::Credentials`]), then
    /// the body to the model's endpoint. The client's `anthropic-version`
    /// stays behind (Vertex takes the version in the body); its betas go
    /// as the `anthropic-beta` header.
    pub(super) async fn send_vertex(
        &self,
        upstream: &UpstreamPolicy,
        upstream_model: &str,
        stream: bool,
        body: Bytes,
        request_id: axum::http::HeaderValue,
        extra_headers: &[(String, axum::http::HeaderValue)],
    ) -> Result<reqwest::Response, UpstreamError> {
        let Some(token) = self.vertex.authorization(upstream).await else {
            return Err(UpstreamError::Credentials(upstream.name.clone()));
        };
        let url = self.vertex_url(upstream, upstream_model, stream)?;
        let mut req = self
            .client(upstream)?
            .post(url)
            .timeout(upstream.timeout)
            .header(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/json"),
            )
            .header(X_REQUEST_ID, request_id)
            .header(reqwest::header::AUTHORIZATION, token)
            .body(body);
        for (name, value) in extra_headers {
            if name != "anthropic-version" {
                req = req.header(name.as_str(), value.as_bytes());
            }
        }
        req.send()
            .await
            .map_err(|e| classify_send_error(&upstream.name, &e))
    }

    /// The parsed URL of the model's endpoint (cached by its text).
    fn vertex_url(
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
    use crate::config::vertex::{VertexCredentials, VertexSettings};

    #[test]
    fn the_model_url_names_project_region_model_and_method() {
        let toml = r#"
[[upstreams]]
name = "east"
kind = "vertex"
vertex = { project = "acme-prod", region = "us-east5" }
[[models]]
name = "claude-opus-4-1@20250805"
upstreams = ["east"]
"#;
        let p = crate::config::Policy::from_toml(toml).expect("valid");
        let u = &p.upstreams[0];
        assert_eq!(
            u.vertex.as_deref(),
            Some(&VertexSettings {
                project: "acme-prod".into(),
                region: "us-east5".into(),
                credentials: VertexCredentials::Adc,
                publisher: crate::config::vertex::Publisher::Anthropic,
            })
        );
        assert_eq!(
            model_url(u, "claude-opus-4-1@20250805", Some(true)),
            "https://us-east5-aiplatform.googleapis.com/v1/projects/acme-prod/locations/us-east5/publishers/anthropic/models/claude-opus-4-1@20250805:streamRawPredict"
        );
        assert_eq!(
            model_url(u, "a b/c", Some(false)),
            "https://us-east5-aiplatform.googleapis.com/v1/projects/acme-prod/locations/us-east5/publishers/anthropic/models/a%20b%2Fc:rawPredict"
        );
    }
}
