//! Phase 1, authenticate (DESIGN section 1.1): the client's key, from
//! `Authorization: Bearer` or Azure's `api-key`, maps to a tenant and key.
//! A request carrying two different keys is refused: which one would be
//! charged is not the client's to leave open.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

use super::context::RequestContext;
use crate::config::{KeyId, Policy, TenantId};
use crate::dialects::KeyHeader;
use crate::gateway::error::ApiError;

/// The authenticated caller: tenant and key of the request's policy.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// The tenant.
    pub tenant: TenantId,
    /// The key.
    pub key: KeyId,
}

/// Authenticates the request and records the tenant for the final line.
pub fn authenticate(cx: &mut RequestContext, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let now = cx.st.clock.now_micros();
    let caller = caller(&cx.policy, now, cx.dialect.key_headers(), headers)?;
    cx.finish.tenant = Some(caller.tenant);
    Ok(caller)
}

/// The caller that `headers` (the dialect's `key_headers`) name under
/// `policy` at `now` (UTC µs: an expired key is refused).
pub fn caller(
    policy: &Policy,
    now: u64,
    key_headers: &[KeyHeader],
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let key = presented_key(key_headers, headers)?.ok_or_else(|| {
        // A credential header that is present but unreadable is a wrong key, not a missing one.
        if key_headers.iter().any(|h| headers.contains_key(name(h))) {
            ApiError::InvalidKey
        } else {
            ApiError::MissingKey
        }
    })?;
    let (tenant, key) = policy.find_key(key, now).ok_or(ApiError::InvalidKey)?;
    Ok(Caller { tenant, key })
}

/// The credentials of an `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    bearer(headers, &header::AUTHORIZATION)
}

/// The credentials of a `<name>: Bearer <token>` header. The scheme is
/// case-insensitive and followed by spaces or tabs (RFC 9110 section 11.1
/// and 11.6.2; RFC 6750 section 2.1).
fn bearer<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    bearer_credentials(headers.get(name)?)
}

/// The token of one `Bearer <token>` header value.
fn bearer_credentials(v: &HeaderValue) -> Option<&str> {
    let v = v.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once([' ', '\t'])?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The client's gateway key, if the request presents one in `key_headers`
/// (for the forward phase, which never sends it upstream).
pub fn client_key<'h>(key_headers: &[KeyHeader], headers: &'h HeaderMap) -> Option<&'h str> {
    presented_key(key_headers, headers).ok().flatten()
}

/// The name of a key header.
pub fn name(h: &KeyHeader) -> &HeaderName {
    match h {
        KeyHeader::Bearer(n) | KeyHeader::Plain(n) => n,
    }
}

/// The key `h` presents in `headers`, if any (its first value).
pub fn presented<'h>(h: &KeyHeader, headers: &'h HeaderMap) -> Option<&'h str> {
    headers.get(name(h)).and_then(|v| key_in(h, v))
}

/// The key one value of header `h` carries.
fn key_in<'h>(h: &KeyHeader, v: &'h HeaderValue) -> Option<&'h str> {
    match h {
        KeyHeader::Bearer(_) => bearer_credentials(v),
        KeyHeader::Plain(_) => v.to_str().ok().map(str::trim).filter(|k| !k.is_empty()),
    }
}

/// The one key the request presents; two different keys are refused,
/// whether in two headers or in two values of one header (the first
/// value was admitted while a proxy or upstream may read the last).
fn presented_key<'h>(
    key_headers: &[KeyHeader],
    headers: &'h HeaderMap,
) -> Result<Option<&'h str>, ApiError> {
    let mut found: Option<&str> = None;
    for h in key_headers {
        for key in headers.get_all(name(h)).iter().filter_map(|v| key_in(h, v)) {
            match found {
                Some(a) if a != key => return Err(ApiError::InvalidKey),
                Some(_) => {}
                None => found = Some(key),
            }
        }
    }
    Ok(found)
}
