//! A simulated Claude on Vertex AI (`kind = "vertex"`), with the two
//! token issuers a gateway's Google credentials talk to. One server:
//!
//! * `POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:streamRawPredict`
//!   (and `:rawPredict`): the project and region must be ones the mock
//!   serves, the bearer token one it issued and not expired, or a
//!   service-account JWT signed (RS256) by a key it was given, not expired
//!   and asking for the `cloud-platform` scope; the body must carry
//!   `anthropic_version: "vertex-2023-10-16"` and no `model`, and `stream`
//!   as the method says. Then the Messages answer of [`super::messages`]
//!   for the path's model, SSE or whole.
//! * `POST /v1/projects/{project}/locations/{region}/publishers/google/models/{model}:generateContent`
//!   (and `:streamGenerateContent`, `alt=sse` or the JSON array, and
//!   `:countTokens`): the same token check, then the Gemini answer of
//!   [`super::gemini`]; a throttled region answers 429 `RESOURCE_EXHAUSTED`.
//! * `POST /v1/projects/{project}/locations/{region}/endpoints/openapi/chat/completions`:
//!   Vertex's OpenAI-compatible endpoint for Gemini, the same token and
//!   region checks, then [`super::gemini::handle_openai`] (the body's
//!   model must read `google/{model}`).
//! * `POST /token`: an OAuth token endpoint (the `token_uri` of an
//!   `authorized_user` file): a known refresh token gets a fresh access
//!   token living [`VertexState::set_token_ttl`].
//! * `GET /computeMetadata/v1/instance/service-accounts/default/token`: the
//!   metadata server (`GCE_METADATA_HOST`), `Metadata-Flavor: Google`
//!   required; issues tokens the same way.
//!
//! Google's errors come in Google's shape (`{"error":{"code","message","status"}}`):
//! unknown or expired token 401 `UNAUTHENTICATED`, a wrong project or
//! region 403 `PERMISSION_DENIED`, a bad body 400 `INVALID_ARGUMENT`.
//! Faults ([`VertexFault`]), from the `x-mock-vertex` header (a gateway
//! forwards it when listed in `forward_client_headers`) or the state's:
//! `throttle` (429 `RESOURCE_EXHAUSTED`), `invalid` (400
//! `INVALID_ARGUMENT`), `denied` (403 `PERMISSION_DENIED`), `unavailable`
//! (503 `UNAVAILABLE`), `timeout` (504 `DEADLINE_EXCEEDED`), `stream_error`
//! (a stream that ends in an `error` event after one delta).
//! [`VertexState::throttle_region`] throttles one region only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use serde_json::{json, Value};

use super::{lock, MockConfig, MockState};

/// The `anthropic_version` Vertex requires in the body.
pub const VERSION: &str = "vertex-2023-10-16";
/// The scope a token must carry.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// A failure the mock Vertex answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VertexFault {
    Throttle,
    Invalid,
    Denied,
    Unavailable,
    Timeout,
    StreamError,
}

impl VertexFault {
    pub fn parse(s: &str) -> Option<VertexFault> {
        Some(match s.trim() {
            "throttle" => VertexFault::Throttle,
            "invalid" => VertexFault::Invalid,
            "denied" => VertexFault::Denied,
            "unavailable" => VertexFault::Unavailable,
            "timeout" => VertexFault::Timeout,
            "stream_error" => VertexFault::StreamError,
            _ => return None,
        })
    }
}

/// A service account whose JWTs the mock accepts.
#[derive(Clone, Debug)]
pub struct ServiceAccount {
    pub client_email: String,
    pub private_key_id: String,
    /// The RSA public key, PKCS#1 `RSAPublicKey` DER.
    pub public_key_der: Vec<u8>,
}

/// One model request that passed authentication.
#[derive(Clone, Debug)]
pub struct VertexRequest {
    pub project: String,
    pub region: String,
    pub model: String,
    /// `streamRawPredict` or `rawPredict`.
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl VertexRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the mock knows and saw.
pub struct VertexState {
    /// The Messages simulation (output length, scenarios).
    pub messages: Arc<MockState>,
    /// (project, region) pairs served.
    served: Mutex<Vec<(String, String)>>,
    throttled: Mutex<Vec<String>>,
    fault: Mutex<Option<VertexFault>>,
    token_ttl: Mutex<Duration>,
    /// Access tokens issued, with their expiry.
    issued: Mutex<HashMap<String, Instant>>,
    /// Refresh tokens the token endpoint accepts.
    refresh_tokens: Mutex<Vec<String>>,
    accounts: Mutex<Vec<ServiceAccount>>,
    /// Every bearer value presented to the model routes, accepted or not.
    pub bearers: Mutex<Vec<String>>,
    requests: Mutex<Vec<VertexRequest>>,
    /// Token requests answered, by issuer (`token_endpoint`, `metadata`).
    token_requests: Mutex<Vec<&'static str>>,
    /// When each token was issued and when it expires, in order.
    issue_log: Mutex<Vec<(Instant, Instant)>>,
    refused: AtomicUsize,
}

impl VertexState {
    /// Serves (`project`, `region`).
    pub fn serve(&self, project: &str, region: &str) {
        lock(&self.served).push((project.into(), region.into()));
    }
    /// Throttles every request to `region` (429 `RESOURCE_EXHAUSTED`).
    pub fn throttle_region(&self, region: &str) {
        lock(&self.throttled).push(region.into());
    }
    pub fn set_fault(&self, f: Option<VertexFault>) {
        *lock(&self.fault) = f;
    }
    /// How long tokens issued from now on live.
    pub fn set_token_ttl(&self, ttl: Duration) {
        *lock(&self.token_ttl) = ttl;
    }
    pub fn add_refresh_token(&self, t: &str) {
        lock(&self.refresh_tokens).push(t.into());
    }
    pub fn add_service_account(&self, a: ServiceAccount) {
        lock(&self.accounts).push(a);
    }
    /// Model requests that passed authentication, in order.
    pub fn requests(&self) -> Vec<VertexRequest> {
        lock(&self.requests).clone()
    }
    /// Issuers of the tokens handed out, in order.
    pub fn token_requests(&self) -> Vec<&'static str> {
        lock(&self.token_requests).clone()
    }
    /// (issued, expires) of every token issued, in order.
    pub fn issue_times(&self) -> Vec<(Instant, Instant)> {
        lock(&self.issue_log).clone()
    }
    /// Model requests refused for their token.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
    /// Every access token issued so far.
    pub fn issued_tokens(&self) -> Vec<String> {
        lock(&self.issued).keys().cloned().collect()
    }

    fn issue(&self, issuer: &'static str) -> (String, u64) {
        let ttl = *lock(&self.token_ttl);
        let token = format!("ya29.mock-{}", uuid::Uuid::new_v4().simple());
        let now = Instant::now();
        lock(&self.issued).insert(token.clone(), now + ttl);
        lock(&self.issue_log).push((now, now + ttl));
        lock(&self.token_requests).push(issuer);
        (token, ttl.as_secs())
    }
}

/// A running mock Vertex.
pub struct VertexMock {
    pub addr: SocketAddr,
    pub state: Arc<VertexState>,
    server: tokio::task::AbortHandle,
}

impl VertexMock {
    /// `http://127.0.0.1:PORT`: a deployment's `base_url`, the
    /// `token_uri`'s root and `GCE_METADATA_HOST` (without the scheme).
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for VertexMock {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Starts the mock on a free loopback port, serving (`project`, `region`).
pub async fn start(project: &str, region: &str) -> std::io::Result<VertexMock> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(VertexState {
        messages: Arc::new(MockState::new(&MockConfig::default())),
        served: Mutex::new(vec![(project.into(), region.into())]),
        throttled: Mutex::default(),
        fault: Mutex::default(),
        token_ttl: Mutex::new(Duration::from_secs(3600)),
        issued: Mutex::default(),
        refresh_tokens: Mutex::default(),
        accounts: Mutex::default(),
        bearers: Mutex::default(),
        requests: Mutex::default(),
        token_requests: Mutex::default(),
        issue_log: Mutex::default(),
        refused: AtomicUsize::new(0),
    });
    let app = Router::new().fallback(handle).with_state(state.clone());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(VertexMock {
        addr,
        state,
        server: task.abort_handle(),
    })
}

/// Google's error shape.
pub fn google_error(status: StatusCode, word: &str, message: &str) -> Response {
    let body = json!({"error": {"code": status.as_u16(), "message": message, "status": word}});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn json_response(v: Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn handle(
    State(st): State<Arc<VertexState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path();
    if path == "/token" && method == Method::POST {
        return token_endpoint(&st, &body);
    }
    if path.starts_with("/computeMetadata/v1/") {
        return metadata(&st, path, &headers);
    }
    if method == Method::POST && path.starts_with("/v1/projects/") {
        return predict(&st, path, uri.query(), &headers, &body).await;
    }
    google_error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        "no such route (mock vertex)",
    )
}

/// `POST /token`: a refresh-token grant (JSON or form), as Google's OAuth
/// token endpoint answers it.
fn token_endpoint(st: &VertexState, body: &[u8]) -> Response {
    let fields: HashMap<String, String> = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.as_object().cloned())
        .map(|o| {
            o.into_iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k, s.to_string())))
                .collect()
        })
        .unwrap_or_else(|| {
            String::from_utf8_lossy(body)
                .split('&')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
    let known = fields
        .get("refresh_token")
        .is_some_and(|t| lock(&st.refresh_tokens).contains(t));
    if fields.get("grant_type").map(String::as_str) != Some("refresh_token") || !known {
        let mut r =
            json_response(json!({"error": "invalid_grant", "error_description": "Bad Request"}));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    }
    let (token, ttl) = st.issue("token_endpoint");
    json_response(
        json!({"access_token": token, "expires_in": ttl, "token_type": "Bearer", "scope": SCOPE}),
    )
}

/// The metadata server's routes the credentials read.
fn metadata(st: &VertexState, path: &str, headers: &HeaderMap) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        let mut r = Response::new(Body::from("Missing Metadata-Flavor:Google header."));
        *r.status_mut() = StatusCode::FORBIDDEN;
        return r;
    }
    let mut r = match path.trim_end_matches('/') {
        "/computeMetadata/v1/instance/service-accounts/default/token" => {
            let (token, ttl) = st.issue("metadata");
            json_response(json!({"access_token": token, "expires_in": ttl, "token_type": "Bearer"}))
        }
        "/computeMetadata/v1/instance/service-accounts/default/email" => {
            Response::new(Body::from("gateway@acme-prod.iam.gserviceaccount.com"))
        }
        "/computeMetadata/v1/project/project-id" => {
            Response::new(Body::from(lock(&st.served)[0].0.clone()))
        }
        "/computeMetadata/v1/universe/universe-domain" => {
            Response::new(Body::from("googleapis.com"))
        }
        _ => {
            let mut r = Response::new(Body::from("not found"));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    };
    r.headers_mut()
        .insert("metadata-flavor", HeaderValue::from_static("Google"));
    r
}

/// Whether `bearer` is a token the mock issued and that is still valid,
/// or a valid service-account JWT.
fn token_ok(st: &VertexState, bearer: &str) -> bool {
    if let Some(exp) = lock(&st.issued).get(bearer) {
        return *exp > Instant::now();
    }
    jwt_ok(st, bearer)
}

/// A self-signed service-account JWT (Google's AIP-4111): RS256 by a key
/// the mock knows (`kid`), `iss` = `sub` = its account, unexpired, with
/// the `cloud-platform` scope.
fn jwt_ok(st: &VertexState, jwt: &str) -> bool {
    let mut parts = jwt.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(hj), Some(cj), Some(sig)) = (b64url(h), b64url(c), b64url(s)) else {
        return false;
    };
    let (Ok(header), Ok(claims)) = (
        serde_json::from_slice::<Value>(&hj),
        serde_json::from_slice::<Value>(&cj),
    ) else {
        return false;
    };
    if header["alg"] != "RS256" {
        return false;
    }
    let accounts = lock(&st.accounts);
    let Some(account) = accounts.iter().find(|a| {
        header["kid"].as_str() == Some(a.private_key_id.as_str())
            && claims["iss"].as_str() == Some(a.client_email.as_str())
    }) else {
        return false;
    };
    let key = aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
        &account.public_key_der,
    );
    if key.verify(format!("{h}.{c}").as_bytes(), &sig).is_err() {
        return false;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    claims["sub"] == claims["iss"]
        && claims["exp"].as_u64().is_some_and(|e| e > now)
        && claims["iat"].as_u64().is_some_and(|i| i <= now + 60)
        && claims["scope"]
            .as_str()
            .is_some_and(|s| s.split(' ').any(|x| x == SCOPE))
}

/// Base64url without padding.
fn b64url(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let take = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    Some(out)
}

async fn predict(
    st: &VertexState,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    lock(&st.bearers).push(bearer.clone());
    if !token_ok(st, &bearer) {
        st.refused.fetch_add(1, Ordering::SeqCst);
        return google_error(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
        );
    }
    // projects/{p}/locations/{r}/publishers/anthropic/models/{m}:{method}
    let rest = path.trim_start_matches("/v1/projects/");
    let parts: Vec<&str> = rest.split('/').collect();
    if let [p, "locations", r, "endpoints", "openapi", "chat", "completions"] = parts.as_slice() {
        return openai_chat(st, (p, r), headers, body).await;
    }
    let (project, region, publisher, model_method) = match parts.as_slice() {
        [p, "locations", r, "publishers", publisher @ ("anthropic" | "google"), "models", m] => {
            (*p, *r, *publisher, *m)
        }
        _ => return google_error(StatusCode::NOT_FOUND, "NOT_FOUND", "unknown resource"),
    };
    let Some((model, method)) = model_method.rsplit_once(':') else {
        return google_error(StatusCode::NOT_FOUND, "NOT_FOUND", "no method");
    };
    let model = percent_decode(model);
    if !lock(&st.served)
        .iter()
        .any(|(p, r)| p == project && r == region)
    {
        return google_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            &format!("Permission 'aiplatform.endpoints.predict' denied on resource '//aiplatform.googleapis.com/projects/{project}/locations/{region}/publishers/{publisher}/models/{model}' (or it may not exist)."),
        );
    }
    if publisher == "google" {
        return gemini(st, (project, region), &model, method, query, headers, body).await;
    }
    let streamed = match method {
        "streamRawPredict" => true,
        "rawPredict" => false,
        _ => return google_error(StatusCode::NOT_FOUND, "NOT_FOUND", "unknown method"),
    };
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "Invalid JSON payload received.",
        );
    };
    if body.get("model").is_some() {
        return google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "model: Extra inputs are not permitted",
        );
    }
    if body["anthropic_version"] != VERSION {
        return google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "anthropic_version: Input should be 'vertex-2023-10-16'",
        );
    }
    if body["stream"].as_bool().unwrap_or(false) != streamed {
        return google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "stream does not match the method",
        );
    }
    lock(&st.requests).push(VertexRequest {
        project: project.into(),
        region: region.into(),
        model: model.clone(),
        method: method.into(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.clone(),
    });
    let fault = headers
        .get("x-mock-vertex")
        .and_then(|v| v.to_str().ok())
        .and_then(VertexFault::parse)
        .or(*lock(&st.fault))
        .or_else(|| {
            lock(&st.throttled)
                .iter()
                .any(|r| r == region)
                .then_some(VertexFault::Throttle)
        });
    match fault {
        Some(VertexFault::Throttle) => google_error(
            StatusCode::TOO_MANY_REQUESTS,
            "RESOURCE_EXHAUSTED",
            &format!("Quota exceeded for aiplatform.googleapis.com/online_prediction_input_tokens_per_minute_per_base_model with base model: anthropic-{model}. Please submit a quota increase request."),
        ),
        Some(VertexFault::Invalid) => google_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "messages.0.content: Input should be a valid list (mock)",
        ),
        Some(VertexFault::Denied) => google_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "Permission 'aiplatform.endpoints.predict' denied (mock)",
        ),
        Some(VertexFault::Unavailable) => google_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "The service is currently unavailable.",
        ),
        Some(VertexFault::Timeout) => google_error(
            StatusCode::GATEWAY_TIMEOUT,
            "DEADLINE_EXCEEDED",
            "Deadline exceeded.",
        ),
        Some(VertexFault::StreamError) if streamed => stream_error(&model),
        _ => {
            st.messages.wait_hold().await;
            super::messages::messages(&st.messages, headers, model, body).await
        }
    }
}

/// A Gemini model on Vertex (`publishers/google`): the region's throttle
/// and the state's faults as for Claude, then the Gemini simulation
/// ([`super::gemini`]) for the path's model and method.
async fn gemini(
    st: &VertexState,
    (project, region): (&str, &str),
    model: &str,
    method: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    lock(&st.requests).push(VertexRequest {
        project: project.into(),
        region: region.into(),
        model: model.into(),
        method: method.into(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: serde_json::from_slice(body).unwrap_or(Value::Null),
    });
    let throttled = lock(&st.throttled).iter().any(|r| r == region);
    let fault = headers
        .get("x-mock-vertex")
        .and_then(|v| v.to_str().ok())
        .and_then(VertexFault::parse)
        .or(*lock(&st.fault))
        .or(throttled.then_some(VertexFault::Throttle));
    match fault {
        Some(VertexFault::Throttle) => google_error(
            StatusCode::TOO_MANY_REQUESTS,
            "RESOURCE_EXHAUSTED",
            "Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.",
        ),
        Some(VertexFault::Denied) => google_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "Permission 'aiplatform.endpoints.predict' denied (mock)",
        ),
        Some(VertexFault::Unavailable) => google_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "The service is currently unavailable.",
        ),
        _ => {
            st.messages.wait_hold().await;
            super::gemini::handle_vertex(&st.messages, model, method, query, headers, body).await
        }
    }
}

/// Gemini on Vertex's OpenAI-compatible endpoint: the project and region
/// served, the region's throttle as for the model routes, then the
/// chat completion of [`super::gemini::handle_openai`].
async fn openai_chat(
    st: &VertexState,
    (project, region): (&str, &str),
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if !lock(&st.served)
        .iter()
        .any(|(p, r)| p == project && r == region)
    {
        return google_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            &format!("Permission 'aiplatform.endpoints.predict' denied on resource '//aiplatform.googleapis.com/projects/{project}/locations/{region}/endpoints/openapi' (or it may not exist)."),
        );
    }
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    lock(&st.requests).push(VertexRequest {
        project: project.into(),
        region: region.into(),
        model: parsed
            .as_ref()
            .and_then(|b| b["model"].as_str())
            .unwrap_or_default()
            .into(),
        method: "chat/completions".into(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: parsed.clone().unwrap_or(Value::Null),
    });
    if lock(&st.throttled).iter().any(|r| r == region) {
        return google_error(
            StatusCode::TOO_MANY_REQUESTS,
            "RESOURCE_EXHAUSTED",
            "Resource exhausted. Please try again later.",
        );
    }
    st.messages.wait_hold().await;
    super::gemini::handle_openai(
        &st.messages,
        "vertex_openai",
        &Method::POST,
        headers,
        parsed,
    )
    .await
}

/// A stream that fails after one delta, as Vertex relays the model's
/// `overloaded_error` mid-stream.
fn stream_error(model: &str) -> Response {
    let start = json!({"type": "message_start", "message": {"id": "msg_vertex_err", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}});
    let text = format!(
        "event: message_start\ndata: {start}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\" the\"}}}}\n\n\
         event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}}}\n\n"
    );
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
