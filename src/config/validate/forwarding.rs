//! Which client headers a deployment may forward (`forward_client_headers`):
//! credentials never by accident. A header that carries credentials (the
//! documented list [`CREDENTIAL_HEADERS`], or any name ending in `-key`,
//! `-token` or `-secret`) is refused at load unless it is also named in
//! `forward_credential_headers`; the headers the client authenticates with
//! and the gateway's own headers ([`NEVER_FORWARDED`]) are refused in both
//! lists. Names compare case-insensitively (HTTP field names do, RFC 9110
//! section 5.1). The request path also drops any forwarded header whose
//! value holds the client's gateway key (`lifecycle::forward`).

use super::V;

/// Headers that carry credentials of some service: forwarded only when
/// named in `forward_credential_headers` too.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
    "x-amz-security-token",
    "x-auth-token",
    "x-access-token",
    "x-authorization",
    "authentication",
    "x-goog-iam-authorization-token",
    "x-ms-authorization-auxiliary",
];

/// Name endings that mark a credential header.
pub const CREDENTIAL_SUFFIXES: &[&str] = &["-key", "-token", "-secret"];

/// Never forwarded, whatever the config says: the headers a client's
/// gateway key arrives in, the gateway's own request headers (it sets
/// `x-request-id` and the upstream's key itself), and the headers that
/// frame the body the gateway rewrites (hop-by-hop ones included).
pub const NEVER_FORWARDED: &[&str] = &[
    "authorization",
    "api-key",
    "x-request-id",
    "x-reservation-id",
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
];

/// Whether `name` (lower case) carries credentials.
pub fn is_credential(name: &str) -> bool {
    CREDENTIAL_HEADERS.contains(&name) || CREDENTIAL_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// Whether `name` (lower case) is never forwarded.
pub fn is_never_forwarded(name: &str) -> bool {
    NEVER_FORWARDED.contains(&name) || name.starts_with("x-budgetgate-")
}

/// The headers by which Google attributes a request to the client that
/// made it: `User-Agent` and `X-Goog-Api-Client` (what the google-genai
/// SDKs, Gemini CLI and Antigravity's enterprise-gateway mode send).
/// Deployments of Gemini models forward them whatever
/// `forward_client_headers` says; they carry no credential.
pub const GOOGLE_ATTRIBUTION: &[&str] = &["user-agent", "x-goog-api-client"];

/// Adds [`GOOGLE_ATTRIBUTION`] to the names a deployment forwards.
pub(super) fn add_attribution(names: &mut Vec<String>) {
    for h in GOOGLE_ATTRIBUTION {
        if !names.iter().any(|n| n == h) {
            names.push((*h).to_string());
        }
    }
}

/// Validates `forward_client_headers` against `forward_credential_headers`
/// (both of the deployment at `path`); returns the lower-case names to forward.
pub(super) fn forwarded_headers(
    v: &mut V,
    path: &str,
    forward: &[String],
    credentials: &[String],
) -> Vec<String> {
    let allowed: Vec<String> = credentials.iter().map(|h| h.to_ascii_lowercase()).collect();
    let mut out = Vec::new();
    for (j, h) in forward.iter().enumerate() {
        let h = h.to_ascii_lowercase();
        let at = format!("{path}.forward_client_headers[{j}]");
        if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() {
            v.err(at, format!("{h:?} is not a header name"));
        } else if is_never_forwarded(&h) {
            v.err(
                at,
                format!("{h:?} cannot be forwarded: it carries the client's gateway key or is the gateway's own header"),
            );
        } else if is_credential(&h) && !allowed.contains(&h) {
            v.err(
                at,
                format!(
                    "{h:?} carries credentials and is never forwarded by default; to forward it anyway, \
                     name it in {path}.forward_credential_headers too"
                ),
            );
        } else if !out.contains(&h) {
            out.push(h);
        }
    }
    for (j, h) in allowed.iter().enumerate() {
        let at = format!("{path}.forward_credential_headers[{j}]");
        if is_never_forwarded(h) {
            v.err(
                at,
                format!("{h:?} cannot be forwarded: it carries the client's gateway key or is the gateway's own header"),
            );
        } else if !out.contains(h) {
            v.err(
                at,
                format!(
                    "{h:?} is not in {path}.forward_client_headers: list it there to forward it"
                ),
            );
        }
    }
    out
}
