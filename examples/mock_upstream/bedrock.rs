//! The simulated Amazon Bedrock runtime and the AWS credential
//! endpoints its SDK providers call:
//!
//! * `POST /anthropic/v1/messages`: the Anthropic Messages endpoint of
//!   `bedrock-mantle` / `bedrock-runtime` (body with `model` = the Bedrock
//!   id, header `anthropic-version`), SSE as [`super::messages`] makes it;
//! * `POST /model/{id}/invoke` and `/model/{id}/invoke-with-response-stream`:
//!   the body must carry `anthropic_version: "bedrock-2023-05-31"` and no
//!   `model`; the stream answers in AWS event-stream frames (encoded by
//!   `aws-smithy-eventstream`), each chunk's JSON base64 in `bytes`;
//! * every request must carry either a known Bedrock API key
//!   (`x-api-key`, or `Authorization: Bearer`) or a SigV4 signature the
//!   mock recomputes with `aws-sigv4` from its own copy of the secret:
//!   a bad signature, an unknown or expired key, another region or
//!   another service name are refused with 403 and AWS's exception name
//!   (`x-amzn-ErrorType`);
//! * faults ([`BedrockFault`]) answer as Bedrock does: throttling,
//!   validation, access denied, model not ready, model timeout, or an
//!   exception frame in the middle of a stream;
//! * credential endpoints: the container endpoint (`GET
//!   /mock-aws/container-credentials`, checked against
//!   `AWS_CONTAINER_AUTHORIZATION_TOKEN` when set), STS
//!   `AssumeRoleWithWebIdentity` (`POST /` form; the tokens received are
//!   recorded), and IMDSv2 (`/latest/api/token`,
//!   `/latest/meta-data/iam/security-credentials/…`). Every credential
//!   issued is accepted by the signature check until it expires.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_smithy_types::event_stream::{Header, HeaderValue as EsValue, Message};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use futures_util::StreamExt as _;
use serde_json::{json, Value};

use super::{lock, MockState};

/// The access key id every mock accepts from the start.
pub const ACCESS_KEY_ID: &str = "AKIAMOCKBEDROCK00001";
/// Its secret.
pub const SECRET_ACCESS_KEY: &str = "mock/secret/KEY/0123456789abcdefghijklmnopqr";
/// The Bedrock API key every mock accepts.
pub const API_KEY: &str = "bedrock-api-key-mock-0123456789";

/// A Bedrock failure the mock answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BedrockFault {
    /// 429 `ThrottlingException`.
    Throttling,
    /// 400 `ServiceQuotaExceededException`.
    QuotaExceeded,
    /// 400 `ValidationException`.
    Validation,
    /// 403 `AccessDeniedException`.
    AccessDenied,
    /// 429 `ModelNotReadyException` (Bedrock's own status for it).
    ModelNotReady,
    /// 408 `ModelTimeoutException`.
    ModelTimeout,
    /// A stream answered 200 whose fourth frame is a `modelStreamErrorException`.
    StreamException,
}

/// One credential the mock accepts.
#[derive(Clone, Debug)]
struct Known {
    secret: String,
    token: Option<String>,
    expires: Option<SystemTime>,
}

/// The mock's Bedrock state.
#[derive(Debug)]
pub struct BedrockState {
    region: Mutex<String>,
    api_key: Mutex<String>,
    keys: Mutex<HashMap<String, Known>>,
    fault: Mutex<Option<(BedrockFault, u64)>>,
    /// Requests that passed the signature check, by access key id.
    signed_by: Mutex<Vec<String>>,
    /// Refusals of authentication, by exception name.
    refused: Mutex<Vec<String>>,
    /// Web identity tokens STS received.
    web_identity_tokens: Mutex<Vec<String>>,
    /// Lifetime of the credentials the endpoints issue.
    issued_ttl: Mutex<Duration>,
    issued: Mutex<u64>,
}

impl Default for BedrockState {
    fn default() -> Self {
        let mut keys = HashMap::new();
        keys.insert(
            ACCESS_KEY_ID.to_string(),
            Known {
                secret: SECRET_ACCESS_KEY.into(),
                token: None,
                expires: None,
            },
        );
        BedrockState {
            region: Mutex::new("us-east-1".into()),
            api_key: Mutex::new(API_KEY.into()),
            keys: Mutex::new(keys),
            fault: Mutex::new(None),
            signed_by: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
            web_identity_tokens: Mutex::new(Vec::new()),
            issued_ttl: Mutex::new(Duration::from_secs(3600)),
            issued: Mutex::new(0),
        }
    }
}

impl BedrockState {
    /// The region signatures must be scoped to.
    pub fn set_region(&self, region: &str) {
        *lock(&self.region) = region.to_string();
    }

    /// The Bedrock API key accepted (default [`API_KEY`]).
    pub fn set_api_key(&self, key: &str) {
        *lock(&self.api_key) = key.to_string();
    }

    /// Accepts `id` (with `secret` and session `token`) until `expires`.
    pub fn add_key(
        &self,
        id: &str,
        secret: &str,
        token: Option<&str>,
        expires: Option<SystemTime>,
    ) {
        lock(&self.keys).insert(
            id.to_string(),
            Known {
                secret: secret.to_string(),
                token: token.map(str::to_string),
                expires,
            },
        );
    }

    /// The next `times` Bedrock requests fail with `fault` (`u64::MAX`: all).
    pub fn set_fault(&self, fault: BedrockFault, times: u64) {
        *lock(&self.fault) = Some((fault, times));
    }

    /// No more faults.
    pub fn clear_fault(&self) {
        *lock(&self.fault) = None;
    }

    /// Access key ids of the requests whose signature verified, in order.
    pub fn signed_by(&self) -> Vec<String> {
        lock(&self.signed_by).clone()
    }

    /// Exception names of the authentication refusals, in order.
    pub fn refused(&self) -> Vec<String> {
        lock(&self.refused).clone()
    }

    /// Web identity tokens STS received, in order.
    pub fn web_identity_tokens(&self) -> Vec<String> {
        lock(&self.web_identity_tokens).clone()
    }

    /// Lifetime of the credentials the credential endpoints issue next.
    pub fn set_issued_ttl(&self, ttl: Duration) {
        *lock(&self.issued_ttl) = ttl;
    }

    fn take_fault(&self) -> Option<BedrockFault> {
        let mut f = lock(&self.fault);
        let (fault, times) = (*f)?;
        if times == 0 {
            *f = None;
            return None;
        }
        if times != u64::MAX {
            *f = Some((fault, times - 1));
        }
        Some(fault)
    }

    /// New temporary credentials, accepted from now until they expire.
    fn issue(&self, source: &str) -> (String, String, String, SystemTime) {
        let n = {
            let mut i = lock(&self.issued);
            *i += 1;
            *i
        };
        let id = format!("ASIAMOCK{}{n:08}", source.to_ascii_uppercase());
        let secret = format!("mock-secret-{source}-{n}-{}", uuid::Uuid::new_v4().simple());
        let token = format!(
            "mock-session-token-{source}-{n}-{}",
            uuid::Uuid::new_v4().simple()
        );
        let expires = SystemTime::now() + *lock(&self.issued_ttl);
        lock(&self.keys).insert(
            id.clone(),
            Known {
                secret: secret.clone(),
                token: Some(token.clone()),
                expires: Some(expires),
            },
        );
        (id, secret, token, expires)
    }
}

fn aws_error(status: u16, exception: &str, message: &str) -> Response {
    let mut r = Response::new(Body::from(json!({ "message": message }).to_string()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{exception}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    )) {
        h.insert("x-amzn-errortype", v);
    }
    r
}

fn fault_response(f: BedrockFault) -> Option<Response> {
    Some(match f {
        BedrockFault::Throttling => aws_error(
            429,
            "ThrottlingException",
            "Too many tokens, please wait before trying again.",
        ),
        BedrockFault::QuotaExceeded => aws_error(
            400,
            "ServiceQuotaExceededException",
            "Your request exceeded the tokens-per-minute quota of this model.",
        ),
        BedrockFault::Validation => aws_error(
            400,
            "ValidationException",
            "messages.0.content: mock validation failure from Bedrock",
        ),
        BedrockFault::AccessDenied => aws_error(
            403,
            "AccessDeniedException",
            "You don't have access to the model with the specified model ID.",
        ),
        BedrockFault::ModelNotReady => aws_error(
            429,
            "ModelNotReadyException",
            "Model is not ready to serve inference requests.",
        ),
        BedrockFault::ModelTimeout => aws_error(
            408,
            "ModelTimeoutException",
            "The model took too long to answer.",
        ),
        BedrockFault::StreamException => return None,
    })
}

/// Answers a Bedrock or credential-endpoint request; `None` for other paths.
pub async fn handle(
    st: &MockState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    raw: &Bytes,
    parsed: Option<Value>,
) -> Option<Response> {
    let path = uri.path();
    let b = &st.bedrock;
    if let Some(r) = credential_endpoint(b, method, path, headers, raw) {
        return Some(r);
    }
    let invoke = path.strip_prefix("/model/").and_then(|rest| {
        let (id, op) = rest.rsplit_once('/')?;
        let stream = match op {
            "invoke" => false,
            "invoke-with-response-stream" => true,
            _ => return None,
        };
        Some((percent_decode(id), stream))
    });
    let messages_api = path == "/anthropic/v1/messages";
    if invoke.is_none() && !messages_api {
        return None;
    }
    if method != Method::POST {
        return Some(aws_error(405, "ValidationException", "POST only"));
    }
    if let Err(r) = authenticate(b, headers, uri, raw) {
        return Some(*r);
    }
    let fault = b.take_fault();
    if let Some(r) = fault.and_then(fault_response) {
        return Some(r);
    }
    let Some(Value::Object(mut body)) = parsed else {
        return Some(aws_error(
            400,
            "ValidationException",
            "Malformed input request.",
        ));
    };
    match invoke {
        Some((id, stream)) => {
            if body.contains_key("model") {
                return Some(aws_error(
                    400,
                    "ValidationException",
                    "Malformed input request: extraneous key [model] is not permitted",
                ));
            }
            if body.get("anthropic_version").and_then(Value::as_str) != Some("bedrock-2023-05-31") {
                return Some(aws_error(
                    400,
                    "ValidationException",
                    "Malformed input request: anthropic_version must be bedrock-2023-05-31",
                ));
            }
            body.remove("anthropic_version");
            body.insert("stream".into(), Value::Bool(stream));
            let answer = super::messages::messages(st, headers, id, Value::Object(body)).await;
            if !stream || !answer.status().is_success() {
                return Some(answer);
            }
            Some(event_stream(
                answer,
                fault == Some(BedrockFault::StreamException),
            ))
        }
        None => {
            if headers.get("anthropic-version").is_none() {
                return Some(super::messages::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "anthropic-version: header is required",
                ));
            }
            let Some(model) = body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string)
            else {
                return Some(super::messages::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "model: Field required",
                ));
            };
            Some(super::messages::messages(st, headers, model, Value::Object(body)).await)
        }
    }
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

/// An API key or a SigV4 signature that verifies; else AWS's 403.
fn authenticate(
    b: &BedrockState,
    headers: &HeaderMap,
    uri: &Uri,
    body: &[u8],
) -> Result<(), Box<Response>> {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let refuse = |exception: &str, message: &str| {
        lock(&b.refused).push(exception.to_string());
        Box::new(aws_error(403, exception, message))
    };
    if let Some(k) = h("x-api-key") {
        return if k == *lock(&b.api_key) {
            Ok(())
        } else {
            Err(refuse(
                "UnrecognizedClientException",
                "The API key is invalid.",
            ))
        };
    }
    let Some(auth) = h("authorization") else {
        return Err(refuse(
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ));
    };
    if let Some(k) = auth.strip_prefix("Bearer ") {
        return if k == *lock(&b.api_key) {
            Ok(())
        } else {
            Err(refuse(
                "UnrecognizedClientException",
                "The API key is invalid.",
            ))
        };
    }
    let Some(parts) = auth.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return Err(refuse(
            "IncompleteSignatureException",
            "Unknown authorization scheme.",
        ));
    };
    let field = |name: &str| {
        parts
            .split(',')
            .map(str::trim)
            .find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    let (Some(credential), Some(signed_headers), Some(signature)) = (
        field("Credential"),
        field("SignedHeaders"),
        field("Signature"),
    ) else {
        return Err(refuse(
            "IncompleteSignatureException",
            "Authorization header is incomplete.",
        ));
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [key_id, date, region, service, terminal] = scope[..] else {
        return Err(refuse(
            "IncompleteSignatureException",
            "Credential is malformed.",
        ));
    };
    let want_region = lock(&b.region).clone();
    if region != want_region {
        return Err(refuse(
            "InvalidSignatureException",
            &format!("Credential should be scoped to a valid region, not '{region}'."),
        ));
    }
    if service != "bedrock" || terminal != "aws4_request" {
        return Err(refuse(
            "InvalidSignatureException",
            &format!("Credential should be scoped to correct service: 'bedrock', not '{service}'."),
        ));
    }
    let Some(known) = lock(&b.keys).get(key_id).cloned() else {
        return Err(refuse(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    };
    if known.expires.is_some_and(|e| e <= SystemTime::now()) {
        return Err(refuse(
            "ExpiredTokenException",
            "The security token included in the request is expired",
        ));
    }
    if known.token.as_deref() != h("x-amz-security-token") {
        return Err(refuse(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    }
    let Some(time) = h("x-amz-date").and_then(parse_amz_date) else {
        return Err(refuse(
            "IncompleteSignatureException",
            "x-amz-date is missing or malformed.",
        ));
    };
    if h("x-amz-date").map(|d| &d[..8.min(d.len())]) != Some(date) {
        return Err(refuse(
            "InvalidSignatureException",
            "Date in Credential scope does not match x-amz-date.",
        ));
    }
    let skipped = ["x-amz-date", "x-amz-security-token"];
    let mut signed: Vec<(&str, &str)> = Vec::new();
    for name in signed_headers.split(';') {
        if skipped.contains(&name) {
            continue;
        }
        match h(name) {
            Some(v) => signed.push((name, v)),
            None => {
                return Err(refuse(
                    "InvalidSignatureException",
                    &format!("Signed header {name} is missing."),
                ))
            }
        }
    }
    let host = h("host").unwrap_or("localhost");
    let url = format!(
        "http://{host}{}{}",
        uri.path(),
        uri.query().map(|q| format!("?{q}")).unwrap_or_default()
    );
    let creds = Credentials::new(key_id, known.secret, known.token, None, "mock");
    let identity: aws_smithy_runtime_api::client::identity::Identity = creds.into();
    let params: aws_sigv4::http_request::SigningParams<'_> =
        aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&want_region)
            .name("bedrock")
            .time(time)
            .settings(aws_sigv4::http_request::SigningSettings::default())
            .build()
            .map_err(|_| refuse("InvalidSignatureException", "cannot verify"))?
            .into();
    let signable = aws_sigv4::http_request::SignableRequest::new(
        "POST",
        url,
        signed.into_iter(),
        aws_sigv4::http_request::SignableBody::Bytes(body),
    )
    .map_err(|_| refuse("InvalidSignatureException", "cannot verify"))?;
    let out = aws_sigv4::http_request::sign(signable, &params)
        .map_err(|_| refuse("InvalidSignatureException", "cannot verify"))?;
    if out.signature() != signature {
        return Err(refuse(
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        ));
    }
    lock(&b.signed_by).push(key_id.to_string());
    Ok(())
}

/// `20261130T120000Z` as a time.
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    if s.len() != 16 || &s[8..9] != "T" || !s.ends_with('Z') {
        return None;
    }
    let n = |a: usize, b: usize| s.get(a..b)?.parse::<i64>().ok();
    let (y, m, d) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (hh, mm, ss) = (n(9, 11)?, n(11, 13)?, n(13, 15)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + hh * 3600 + mm * 60 + ss;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// The SSE answer of [`super::messages::messages`] as event-stream
/// frames; with `exception`, a `modelStreamErrorException` frame after
/// three chunks ends it.
fn event_stream(answer: Response, exception: bool) -> Response {
    let mut sse = answer.into_body().into_data_stream();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        let mut buf = String::new();
        let mut sent = 0;
        while let Some(Ok(piece)) = sse.next().await {
            buf.push_str(&String::from_utf8_lossy(&piece));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let data: String = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect::<Vec<_>>()
                    .join("\n");
                if data.is_empty() {
                    continue;
                }
                if exception && sent == 3 {
                    let m = Message::new(
                        json!({"message": "The model stream failed (mock)."}).to_string(),
                    )
                    .add_header(Header::new(
                        ":message-type",
                        EsValue::String("exception".into()),
                    ))
                    .add_header(Header::new(
                        ":exception-type",
                        EsValue::String("modelStreamErrorException".into()),
                    ))
                    .add_header(Header::new(
                        ":content-type",
                        EsValue::String("application/json".into()),
                    ));
                    let _ = tx.send(Ok(frame(&m))).await;
                    return;
                }
                let payload = json!({"bytes": aws_smithy_types::base64::encode(data.as_bytes()), "p": "abcd"});
                let m = Message::new(payload.to_string())
                    .add_header(Header::new(
                        ":message-type",
                        EsValue::String("event".into()),
                    ))
                    .add_header(Header::new(":event-type", EsValue::String("chunk".into())))
                    .add_header(Header::new(
                        ":content-type",
                        EsValue::String("application/json".into()),
                    ));
                if tx.send(Ok(frame(&m))).await.is_err() {
                    return;
                }
                sent += 1;
            }
        }
    });
    let body =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut r = Response::new(Body::from_stream(body.boxed()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.amazon.eventstream"),
    );
    r.headers_mut().insert(
        "x-amzn-requestid",
        HeaderValue::from_static("mock-bedrock-request"),
    );
    r
}

fn frame(m: &Message) -> Bytes {
    let mut out = Vec::new();
    let _ = aws_smithy_eventstream::frame::write_message_to(m, &mut out);
    Bytes::from(out)
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The container, STS and IMDS endpoints of the SDK's providers.
fn credential_endpoint(
    b: &BedrockState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    raw: &Bytes,
) -> Option<Response> {
    let json_creds = |source: &str| {
        let (id, secret, token, expires) = b.issue(source);
        json!({
            "Code": "Success", "Type": "AWS-HMAC",
            "AccessKeyId": id, "SecretAccessKey": secret, "Token": token,
            "Expiration": rfc3339(expires), "LastUpdated": rfc3339(SystemTime::now()),
            "RoleArn": "arn:aws:iam::123456789012:role/mock"
        })
    };
    let ok = |v: String, ct: &'static str| {
        let mut r = Response::new(Body::from(v));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        r
    };
    if path == "/mock-aws/container-credentials" && method == Method::GET {
        if let Ok(want) = std::env::var("MOCK_CONTAINER_AUTHORIZATION_TOKEN") {
            if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
                return Some(aws_error(403, "AccessDenied", "bad container token"));
            }
        }
        return Some(ok(json_creds("container").to_string(), "application/json"));
    }
    if path == "/latest/api/token" && method == Method::PUT {
        let mut r = ok("mock-imds-session-token".into(), "text/plain");
        let ttl = headers
            .get("x-aws-ec2-metadata-token-ttl-seconds")
            .cloned()
            .unwrap_or(HeaderValue::from_static("21600"));
        r.headers_mut()
            .insert("x-aws-ec2-metadata-token-ttl-seconds", ttl);
        return Some(r);
    }
    if let Some(role) = path.strip_prefix("/latest/meta-data/iam/security-credentials") {
        if headers.get("x-aws-ec2-metadata-token").is_none() {
            return Some(aws_error(401, "Unauthorized", "IMDSv2 token required"));
        }
        let role = role.trim_matches('/');
        if role.is_empty() {
            return Some(ok("mock-role".into(), "text/plain"));
        }
        return Some(ok(json_creds("imds").to_string(), "text/plain"));
    }
    let form = String::from_utf8_lossy(raw);
    if method == Method::POST && form.contains("Action=AssumeRoleWithWebIdentity") {
        let token = form
            .split('&')
            .find_map(|p| p.strip_prefix("WebIdentityToken="))
            .unwrap_or("")
            .to_string();
        lock(&b.web_identity_tokens).push(token);
        let (id, secret, session, expires) = b.issue("sts");
        let xml = format!(
            "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{id}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{session}</SessionToken><Expiration>{}</Expiration></Credentials><AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/mock/s</Arn><AssumedRoleId>AROAMOCK:s</AssumedRoleId></AssumedRoleUser></AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>mock</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>",
            rfc3339(expires)
        );
        return Some(ok(xml, "text/xml"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        let t = parse_amz_date("20261130T120000Z").unwrap();
        assert_eq!(rfc3339(t), "2026-11-30T12:00:00Z");
        assert_eq!(
            percent_decode("us.anthropic.x-v1%3A0"),
            "us.anthropic.x-v1:0"
        );
    }
}
