//! What every command that calls a running gateway's admin API shares:
//! the admin token given (or how to give one), a path segment or query
//! value percent-encoded, the message for a gateway that does not
//! answer, and an answer as printed. At the bottom of the house (it
//! imports no module of the crate): the admin commands
//! ([`crate::admin_cli`]) and the ledger's (`spend`, `reconcile`) use it.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

/// The admin token given, or the message that says how to give one
/// (clap's own would name only `--token`, not the variable).
pub fn token(given: &Option<String>) -> Result<&str, String> {
    given.as_deref().filter(|t| !t.is_empty()).ok_or_else(|| {
        "no admin token: set BUDGETGATE_ADMIN_TOKEN (the gateway's bootstrap token, or one made by `budgetgate admin-tokens create`) or pass --token".to_string()
    })
}

/// What a failed call to `url` (on the gateway at `base`) prints: a
/// gateway that does not answer is named as such, with the variable that
/// points the command elsewhere.
pub fn unreachable(base: &str, url: &str, e: &reqwest::Error) -> String {
    if e.is_connect() {
        // The innermost cause ("Connection refused"), not reqwest's
        // "error sending request for url (…)".
        let mut cause: &dyn std::error::Error = e;
        while let Some(next) = cause.source() {
            cause = next;
        }
        return format!(
            "no gateway answers at {} ({cause}); set BUDGETGATE_URL or pass --url",
            base.trim_end_matches('/')
        );
    }
    format!("{url}: {e}")
}

/// `body` as printed: JSON indented, anything else (CSV) as it came.
pub fn printable(body: &str) -> String {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_else(|_| body.to_string()),
        Err(_) => body.trim_end().to_string(),
    }
}

/// Kept as written in a path segment or query value: RFC 3986's
/// unreserved characters (a request id's `-` stays `-`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` percent-encoded for a path segment or a query value.
pub fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}
