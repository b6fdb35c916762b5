//! Talking to upstream deployments: URLs and auth per provider kind, one
//! pooled HTTP client, and the SSE relay that meters streams. This module
//! knows nothing of budgets: the relay meters through its own
//! [`relay::Meter`] interface, which the lifecycle implements.
//!
//! - [`transport`]: the connections to direct providers: pooled, TLS,
//!   proxies, one deadline per call.
//! - [`sse`]: splitting a byte stream into SSE frames, byte for byte.
//! - [`relay`]: metering, extension, cutoff and settlement of a stream.
//! - [`redact`]: what logs say of other endpoints the gateway calls.
//! - [`bedrock`]: Claude on Amazon Bedrock: URLs, bodies, SigV4 and its
//!   credentials, event-stream to SSE, error answers.
//! - [`vertex`]: Claude on Vertex AI: its endpoint and access tokens.
//! - [`gemini`]: Gemini models on the Gemini API and on Vertex AI.
//! - [`failure`]: what an upstream's error answer means, one table per kind.

pub mod bedrock;
pub mod failure;
pub mod gemini;
pub mod redact;
pub mod relay;
pub mod sse;
pub mod transport;
pub mod vertex;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::config::{UpstreamKind, UpstreamPolicy};
use crate::dialects::Dialect;

/// An upstream's answer: its status and headers, the body still to read
/// (reqwest's body type, which every client's answer converts to without
/// a copy).
pub type UpstreamResponse = http::Response<reqwest::Body>;

/// A failure before any response arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// TCP/TLS connect failed.
    #[error("could not connect to upstream {0}")]
    Connect(String),
    /// No answer within the upstream's timeout.
    #[error("upstream {0} timed out")]
    Timeout(String),
    /// Any other transport error.
    #[error("upstream {0} request failed")]
    Other(String),
    /// The deployment's credentials gave no access token: nothing was sent.
    #[error("no credentials for upstream {0}")]
    Credentials(String),
}

// Built at compile time, not parsed per request.
const X_REQUEST_ID: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("x-request-id");
const X_API_KEY: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("x-api-key");
const ANTHROPIC_VERSION: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("anthropic-version");
const API_KEY: reqwest::header::HeaderName = reqwest::header::HeaderName::from_static("api-key");

/// Pooled HTTP clients: per thread, one per distinct connect timeout
/// (usually one for every upstream), each keeping keep-alive connections
/// to every upstream.
#[derive(Clone)]
pub struct UpstreamClient {
    /// Parsed request URLs by their text: parsing (IDNA, percent-encoding)
    /// showed in the per-request profile; the set is small (upstreams ×
    /// endpoints × models), bounded by [`URL_CACHE_MAX`] anyway.
    urls: Arc<Mutex<HashMap<String, reqwest::Url>>>,
    /// The same for Azure's URIs (its URLs carry the deployment).
    azure_urls: Arc<Mutex<HashMap<String, transport::Endpoint>>>,
    /// Parsed URLs of endpoints that depend only on the base URL and the
    /// dialect (every upstream kind but Azure), found
    /// by comparing the base URL: no URL text is formatted and hashed per
    /// request. A handful of entries (upstreams × dialects).
    by_base: Arc<Mutex<Vec<(String, Dialect, transport::Endpoint)>>>,
    /// SigV4 credentials of Bedrock deployments.
    pub aws: Arc<bedrock::credentials::AwsCredentials>,
    /// Access tokens of `vertex` deployments.
    vertex: Arc<vertex::credentials::VertexTokens>,
}

/// Most parsed URLs kept; the cache starts over when full.
const URL_CACHE_MAX: usize = 1024;

impl Default for UpstreamClient {
    fn default() -> Self {
        Self::new()
    }
}

impl UpstreamClient {
    /// A client with pooled keep-alive connections.
    pub fn new() -> Self {
        Self {
            urls: Arc::new(Mutex::new(HashMap::new())),
            azure_urls: Arc::new(Mutex::new(HashMap::new())),
            by_base: Arc::new(Mutex::new(Vec::new())),
            aws: Arc::default(),
            vertex: Arc::default(),
        }
    }

    /// The token sources of `vertex` deployments.
    pub fn vertex_tokens(&self) -> &vertex::credentials::VertexTokens {
        &self.vertex
    }

    /// The pooled reqwest client (the clouds' and stored-response calls)
    /// with `upstream`'s connect timeout: see [`per_thread`].
    fn client(&self, upstream: &UpstreamPolicy) -> Result<reqwest::Client, UpstreamError> {
        thread_local! {
            static CLIENTS: PerThread<reqwest::Client> = const { RefCell::new(Vec::new()) };
        }
        per_thread(&CLIENTS, upstream, |t| build_client(t).map_err(Into::into))
    }

    /// The pooled [`transport::Transport`] (the direct providers' calls)
    /// with `upstream`'s connect timeout: see [`per_thread`].
    fn transport(&self, upstream: &UpstreamPolicy) -> Result<transport::Transport, UpstreamError> {
        thread_local! {
            static TRANSPORTS: PerThread<transport::Transport> = const { RefCell::new(Vec::new()) };
        }
        per_thread(&TRANSPORTS, upstream, transport::Transport::new)
    }

    /// The parsed URI of `dialect`'s endpoint on `upstream` (see [`endpoint_url`]).
    fn url(
        &self,
        upstream: &UpstreamPolicy,
        dialect: Dialect,
        upstream_model: &str,
    ) -> Result<transport::Endpoint, UpstreamError> {
        // Azure's URLs also carry the deployment (model) and the API version.
        if upstream.kind != UpstreamKind::Azure {
            let mut known = self.by_base.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, _, u)) = known
                .iter()
                .find(|(base, d, _)| *d == dialect && *base == upstream.base_url)
            {
                return Ok(u.clone());
            }
            let text = endpoint_url(upstream, dialect, upstream_model);
            let url = transport::Endpoint::parse(&text)
                .ok_or_else(|| UpstreamError::Other(upstream.name.clone()))?;
            if known.len() >= URL_CACHE_MAX {
                known.clear();
            }
            known.push((upstream.base_url.clone(), dialect, url.clone()));
            return Ok(url);
        }
        let text = endpoint_url(upstream, dialect, upstream_model);
        let mut urls = self.azure_urls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = urls.get(&text) {
            return Ok(u.clone());
        }
        // Config validation accepted the base URL, so this fails only for
        // a model name that cannot appear in a URL path.
        let url = transport::Endpoint::parse(&text)
            .ok_or_else(|| UpstreamError::Other(upstream.name.clone()))?;
        if urls.len() >= URL_CACHE_MAX {
            urls.clear();
        }
        urls.insert(text, url.clone());
        Ok(url)
    }

    /// Sends `body` (JSON bytes) to `dialect` of `upstream`, with the
    /// upstream's key injected and the request's id as `x-request-id`. Returns once response headers arrived.
    /// `stream`: the body asks for a stream (Vertex names it in the URL).
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        upstream: &UpstreamPolicy,
        dialect: Dialect,
        upstream_model: &str,
        stream: bool,
        body: Bytes,
        request_id: axum::http::HeaderValue,
        extra_headers: &[(String, axum::http::HeaderValue)],
    ) -> Result<UpstreamResponse, UpstreamError> {
        // Boxed: the clouds' futures (signing, credential refresh) would
        // otherwise live inline in every request's future, which the
        // serving stack moves by value (memcpy) on every kind's hot path.
        if let Some(settings) = &upstream.bedrock {
            return Box::pin(self.send_bedrock(
                upstream,
                settings,
                upstream_model,
                body,
                request_id,
                extra_headers,
            ))
            .await
            .map(Into::into);
        }
        if dialect == Dialect::Gemini || gemini::vertex_openai(upstream) {
            return Box::pin(self.send_gemini(
                upstream,
                dialect,
                upstream_model,
                stream,
                body,
                request_id,
                extra_headers,
            ))
            .await
            .map(Into::into);
        }
        if upstream.kind == UpstreamKind::Vertex {
            return Box::pin(self.send_vertex(
                upstream,
                upstream_model,
                stream,
                body,
                request_id,
                extra_headers,
            ))
            .await
            .map(Into::into);
        }
        let url = self.url(upstream, dialect, upstream_model)?;
        let other = || UpstreamError::Other(upstream.name.clone());
        // Content type, accept, request id, version, key; the client's.
        let mut req = url.post(body, 5 + extra_headers.len());
        let headers = req.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        // What reqwest sent, kept for upstreams that read it.
        headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("*/*"));
        headers.insert(X_REQUEST_ID, request_id);
        for (name, value) in extra_headers {
            let name = http::HeaderName::try_from(name.as_str()).map_err(|_| other())?;
            headers.append(name, value.clone());
        }
        if upstream.kind == UpstreamKind::Anthropic {
            // The client's version when it sent one (in `extra_headers`), else the upstream's.
            if !extra_headers.iter().any(|(n, _)| n == "anthropic-version") {
                let version = http::HeaderValue::try_from(upstream.anthropic_version.as_str())
                    .map_err(|_| other())?;
                headers.append(ANTHROPIC_VERSION, version);
            }
        }
        if let Some(key) = &upstream.api_key {
            let (name, value) = match upstream.kind {
                UpstreamKind::Azure => (API_KEY, http::HeaderValue::try_from(key.as_str())),
                UpstreamKind::Anthropic => (X_API_KEY, http::HeaderValue::try_from(key.as_str())),
                _ => (
                    http::header::AUTHORIZATION,
                    http::HeaderValue::try_from(format!("Bearer {key}")),
                ),
            };
            let mut value = value.map_err(|_| other())?;
            value.set_sensitive(true);
            headers.append(name, value);
        }
        self.transport(upstream)?
            .send(req, upstream.timeout)
            .await
            .map_err(|e| match e {
                transport::CallError::Connect => UpstreamError::Connect(upstream.name.clone()),
                transport::CallError::Timeout => UpstreamError::Timeout(upstream.name.clone()),
                transport::CallError::Other => other(),
            })
    }
}

impl UpstreamClient {
    /// Sends a bodiless request on a stored response (`rest` after
    /// `responses`, e.g. `/resp_1/cancel`, query included) to `upstream`.
    pub async fn send_stored(
        &self,
        upstream: &UpstreamPolicy,
        method: reqwest::Method,
        rest: &str,
        request_id: axum::http::HeaderValue,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let url = reqwest::Url::parse(&responses_url(upstream, rest))
            .map_err(|_| UpstreamError::Other(upstream.name.clone()))?;
        let mut req = self
            .client(upstream)?
            .request(method, url)
            .timeout(upstream.timeout)
            .header(X_REQUEST_ID, request_id);
        if let Some(key) = &upstream.api_key {
            req = match upstream.kind {
                UpstreamKind::Azure => req.header("api-key", key),
                _ => req.bearer_auth(key),
            };
        }
        req.send()
            .await
            .map(Into::into)
            .map_err(|e| classify_send_error(&upstream.name, &e))
    }
}

/// A thread's pooled clients of one kind, by connect timeout.
type PerThread<T> = RefCell<Vec<(Duration, T)>>;

/// The client in `cache` with `upstream`'s connect timeout, built on
/// first use (usually one for every upstream). Each thread has its own
/// clients (and so its own connections): a request served by a
/// thread-per-core runtime then never hands its upstream I/O to another
/// thread's connection task. A client that cannot be built (its CA
/// certificates unreadable: out of file descriptors) fails this request,
/// nothing sent, and is tried again on the next.
fn per_thread<T: Clone + 'static>(
    cache: &'static std::thread::LocalKey<PerThread<T>>,
    upstream: &UpstreamPolicy,
    build: impl FnOnce(Duration) -> Result<T, Box<dyn std::error::Error + Send + Sync>>,
) -> Result<T, UpstreamError> {
    let connect_timeout = upstream.connect_timeout;
    cache.with_borrow_mut(|cs| {
        if let Some((_, c)) = cs.iter().find(|(t, _)| *t == connect_timeout) {
            return Ok(c.clone());
        }
        let c = build(connect_timeout).map_err(|e| {
            tracing::error!(deployment = %upstream.name, error = %e, "cannot build the upstream HTTP client; request failed, nothing sent");
            UpstreamError::Other(upstream.name.clone())
        })?;
        cs.push((connect_timeout, c.clone()));
        Ok(c)
    })
}

fn classify_send_error(name: &str, e: &reqwest::Error) -> UpstreamError {
    let name = name.to_string();
    if e.is_connect() {
        UpstreamError::Connect(name)
    } else if e.is_timeout() {
        UpstreamError::Timeout(name)
    } else {
        UpstreamError::Other(name)
    }
}

fn build_client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        // A gateway relays the upstream's answer; following a redirect
        // would resend the prompt (and key) elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// Characters of a path segment left as they are (letters, digits, `.`,
/// `_`, `-`); everything else is percent-encoded (RFC 3986 section 3.3).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'_')
    .remove(b'-');

/// `name` as one URL path segment.
fn path_segment(name: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(name, SEGMENT)
}

/// Full URL for a request: `<base>/<path>` for OpenAI-compatible upstreams
/// (and `<base>/v1/messages` for Anthropic's),
/// `<base>/openai/deployments/<deployment>/<path>?api-version=<v>` for Azure
/// (Azure OpenAI REST reference).
pub fn endpoint_url(upstream: &UpstreamPolicy, dialect: Dialect, upstream_model: &str) -> String {
    if let Some(s) = &upstream.bedrock {
        return bedrock::url(upstream, s, upstream_model, true);
    }
    let path = dialect.path();
    if dialect == Dialect::Responses {
        return responses_url(upstream, "");
    }
    if dialect == Dialect::Gemini {
        return gemini::model_url(upstream, upstream_model, None);
    }
    match upstream.kind {
        // Gemini on Vertex: its OpenAI-compatible endpoint.
        UpstreamKind::Vertex if gemini::vertex_openai(upstream) => {
            gemini::vertex_openai_url(upstream)
        }
        UpstreamKind::Vertex => vertex::model_url(upstream, upstream_model, None),
        // Gemini's OpenAI-compatible endpoint ("OpenAI compatibility":
        // `{base}/openai/chat/completions`, the key as a bearer token).
        UpstreamKind::Gemini => format!("{}/openai/{}", upstream.base_url, path),
        UpstreamKind::Azure => format!(
            "{}/openai/deployments/{}/{}?api-version={}",
            upstream.base_url,
            path_segment(upstream_model),
            path,
            upstream.api_version.as_deref().unwrap_or("2024-10-21")
        ),
        _ => format!("{}/{}", upstream.base_url, path),
    }
}

/// [`endpoint_url`] as logs may show it: without user info or query (a
/// base URL may carry credentials there).
pub fn endpoint_url_for_log(
    upstream: &UpstreamPolicy,
    dialect: Dialect,
    upstream_model: &str,
) -> String {
    let text = endpoint_url(upstream, dialect, upstream_model);
    match reqwest::Url::parse(&text) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        // Unparsable: show only the deployment (the caller names it).
        Err(_) => String::new(),
    }
}

/// URL of the Responses API on `upstream`, with `rest` (e.g. `/resp_1`,
/// `/resp_1/cancel`) after `responses`: `<base>/responses<rest>` for
/// OpenAI-compatible upstreams, `<base>/openai/responses<rest>?api-version=<v>`
/// for Azure (the model is in the body, not the path).
pub fn responses_url(upstream: &UpstreamPolicy, rest: &str) -> String {
    match upstream.kind {
        UpstreamKind::Azure => {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            format!(
                "{}/openai/responses{path}?api-version={}{}{query}",
                upstream.base_url,
                upstream
                    .api_version
                    .as_deref()
                    .unwrap_or("2025-03-01-preview"),
                if query.is_empty() { "" } else { "&" },
            )
        }
        _ => format!("{}/responses{rest}", upstream.base_url),
    }
}
