//! Reading a request body (part of phase 2, prepare): within
//! `server.max_body_bytes` and a read timeout, decoded when it comes with a
//! `Content-Encoding` (gzip, deflate, br, zstd) by tower-http's request
//! decompression. The size cap applies to the *decoded* bytes, read as a
//! stream, so a small bomb is never inflated past the cap (413). An
//! encoding tower-http does not decode (its empty 415) and stacked
//! encodings answer 415 in the dialect's error body. What is estimated and
//! forwarded is the decoded body; `Content-Encoding` never goes upstream.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use tower::ServiceExt;
use tower_http::decompression::{DecompressionBody, RequestDecompression};

use super::prepare::invalid;
use crate::gateway::error::ApiError;

/// Longest a client may take to send its request body.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The request body, decoded, at most `limit` bytes.
pub async fn read_body(body: Body, limit: usize, headers: &HeaderMap) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    // A client that stops sending its body must not hold a connection forever.
    let read = async {
        match encoding(headers)? {
            None => read_limited(body, limit).await,
            Some(coding) => decode(body, coding, limit).await,
        }
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read)
        .await
        .unwrap_or(Err(ApiError::RequestTimeout))
}

/// The one content coding of the body, lower case; `None` for none or
/// `identity`. Codings are case-insensitive (RFC 9110 section 8.4.1);
/// more than one (a list, or several header lines) is refused.
fn encoding(headers: &HeaderMap) -> Result<Option<HeaderValue>, ApiError> {
    let mut values = headers.get_all(header::CONTENT_ENCODING).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let text = first.to_str().unwrap_or("").trim().to_ascii_lowercase();
    if values.next().is_some() || text.contains(',') {
        return Err(ApiError::UnsupportedEncoding(
            "Stacked content encodings are not supported.".into(),
        ));
    }
    if text.is_empty() || text == "identity" {
        return Ok(None);
    }
    HeaderValue::from_str(&text).map(Some).map_err(|_| {
        ApiError::UnsupportedEncoding("The Content-Encoding header is not readable.".into())
    })
}

/// Decodes `body` of `coding` through tower-http's request decompression.
async fn decode(body: Body, coding: HeaderValue, limit: usize) -> Result<Bytes, ApiError> {
    let name = coding.to_str().unwrap_or("").to_string();
    let mut req = Request::new(body);
    req.headers_mut().insert(header::CONTENT_ENCODING, coding);
    let decoded: Arc<Mutex<Option<Result<Bytes, ApiError>>>> = Arc::default();
    let slot = decoded.clone();
    let read = tower::service_fn(move |req: Request<DecompressionBody<Body>>| {
        let slot = slot.clone();
        async move {
            let bytes = read_limited(Body::new(req.into_body()), limit).await;
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }
    });
    let Ok(resp) = RequestDecompression::new(read).oneshot(req).await;
    if resp.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return Err(ApiError::UnsupportedEncoding(format!(
            "Content-Encoding {name:?} is not supported."
        )));
    }
    let result = decoded.lock().unwrap_or_else(|e| e.into_inner()).take();
    match result {
        Some(Err(ApiError::InvalidRequest { .. })) => Err(invalid(
            None,
            format!("The request body could not be decoded as {name}."),
        )),
        Some(r) => r,
        None => Err(invalid(None, "The request body could not be read.")),
    }
}

/// Reads `body` whole, refusing more than `limit` bytes.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if is_length_limit(&e) {
            ApiError::BodyTooLarge { limit }
        } else {
            invalid(None, "The request body could not be read.")
        }
    })
}

/// Whether a body read stopped at its length limit (http-body-util's
/// `LengthLimitError`, "length limit exceeded", in the error's source chain).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.to_string().contains("length limit") {
            return true;
        }
        source = s.source();
    }
    false
}
