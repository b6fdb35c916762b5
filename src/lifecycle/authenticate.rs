//! Phase 1, authenticate (DESIGN section 1.1): the client's key, from
//! `Authorization: Bearer` or Azure's `api-key`, maps to a tenant and key.
//! A request carrying two different keys is refused: which one would be
//! charged is not the client's to leave open.

use axum::http::{header, HeaderMap, HeaderName};

use super::context::RequestContext;
use crate::config::{KeyId, Policy, TenantId};
use crate::server::error::ApiError;

const API_KEY: HeaderName = HeaderName::from_static("api-key");

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
    let caller = caller(&cx.policy, headers)?;
    cx.finish.tenant = Some(caller.tenant);
    Ok(caller)
}

/// The caller a request's headers name under `policy`.
pub fn caller(policy: &Policy, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let key = presented_key(headers)?.ok_or_else(|| {
        // A credential header that is present but unreadable is a wrong key, not a missing one.
        if headers.contains_key(header::AUTHORIZATION) || headers.contains_key(API_KEY) {
            ApiError::InvalidKey
        } else {
            ApiError::MissingKey
        }
    })?;
    let (tenant, key) = policy.find_key(key).ok_or(ApiError::InvalidKey)?;
    Ok(Caller { tenant, key })
}

/// The credentials of an `Authorization: Bearer <token>` header. The
/// scheme is case-insensitive and followed by spaces or tabs (RFC 9110
/// section 11.1 and 11.6.2; RFC 6750 section 2.1).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once([' ', '\t'])?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The one key the request presents; two different keys are refused.
fn presented_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let api_key = headers
        .get(API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty());
    match (bearer_token(headers), api_key) {
        (Some(a), Some(b)) if a != b => Err(ApiError::InvalidKey),
        (Some(k), _) | (None, Some(k)) => Ok(Some(k)),
        (None, None) => Ok(None),
    }
}
