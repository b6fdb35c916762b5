//! Part of phase 2, prepare: which end user a request is for, when its
//! tenant's tree has end-user settings (docs/SCOPES.md).
//!
//! Sources, read in this order: the `x-budgetgate-end-user` header, then
//! the dialect's body fields ([`Dialect::end_user_fields`]: OpenAI's
//! `safety_identifier`, then `user`; Anthropic's `metadata.user_id`). Every
//! source present must name the same id: two that disagree are refused
//! (which one to charge is not the gateway's to guess), except that the
//! header wins over `metadata.user_id`: the header is the
//! gateway's own field, set by whoever deploys the client, while
//! `metadata.user_id` is a provider field each client fills its own way
//! (Claude Code puts a new session id in it every session), so a person
//! named by the header is charged and the field still goes upstream as
//! sent. An id over
//! [`MAX_ID_BYTES`] (named by its source), a body field that is not a
//! string, and a request without an id when the tree requires one. An
//! empty value counts as absent. The id itself goes no further than this
//! module: what the rest of the gateway sees is its keyed hash
//! ([`crate::config::end_user::EndUserKey`]). The header is never
//! forwarded (`x-budgetgate-*`, `config::forwarding`); the body fields go
//! upstream as the client sent them.
//!
//! A tenant without end-user settings anywhere in its tree is not looked
//! at: its requests' ids are neither read nor checked.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::prepare::invalid;
use crate::config::{Policy, TenantPolicy};
use crate::dialects::Dialect;
use crate::gateway::error::ApiError;

/// The header naming the end user.
pub const HEADER: HeaderName = HeaderName::from_static("x-budgetgate-end-user");

/// Longest end-user id accepted, bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Anthropic's `metadata.user_id`, which the header overrides.
const METADATA_USER_ID: &[&str] = &["metadata", "user_id"];

/// Where an id was read.
#[derive(Debug, Clone, Copy)]
enum Source {
    Header,
    Field(&'static [&'static str]),
}

impl Source {
    fn describe(self) -> String {
        match self {
            Source::Header => format!("the {} header", HEADER.as_str()),
            Source::Field(path) => format!("`{}`", path.join(".")),
        }
    }

    fn param(self) -> Option<String> {
        match self {
            Source::Header => None,
            Source::Field(path) => Some(path.join(".")),
        }
    }
}

/// The [`HEADER`] of a request whose tenant's tree has end-user settings
/// (sent at most once); `None` for other tenants, whose ids are not read.
pub fn header(tenant: &TenantPolicy, headers: &HeaderMap) -> Result<Option<HeaderValue>, ApiError> {
    if !tenant.reads_end_user {
        return Ok(None);
    }
    let mut values = headers.get_all(&HEADER).iter();
    let first = values.next().cloned();
    if values.next().is_some() {
        return Err(invalid(
            None,
            format!("Send the {} header once.", HEADER.as_str()),
        ));
    }
    Ok(first)
}

/// The keyed hash of the end user a request names in `header` (from
/// [`header`]) and `body`, if the tenant's tree has end-user settings and
/// the request names one.
pub fn end_user(
    policy: &Policy,
    tenant: &TenantPolicy,
    dialect: Dialect,
    header: Option<&HeaderValue>,
    body: &Map<String, Value>,
) -> Result<Option<Arc<str>>, ApiError> {
    if !tenant.reads_end_user {
        return Ok(None);
    }
    let Some(id) = id_of(dialect, header, body)? else {
        if tenant.end_user_required {
            return Err(invalid(
                None,
                format!(
                    "This API key's tenant requires an end-user id: send it in the {} header{}.",
                    HEADER.as_str(),
                    fields_hint(dialect)
                ),
            ));
        }
        return Ok(None);
    };
    let key = policy.end_user_key.as_ref().ok_or_else(|| {
        // Checked at load: a tree with end-user settings has a key.
        ApiError::OwnStoreUnavailable {
            store: crate::gateway::error::OwnStore::EndUserBudgets,
            message: "End-user budgets are not available; please retry.".into(),
        }
    })?;
    Ok(Some(key.hash(id).into()))
}

/// The one id the request names (bytes as sent), checked.
fn id_of<'a>(
    dialect: Dialect,
    header: Option<&'a HeaderValue>,
    body: &'a Map<String, Value>,
) -> Result<Option<&'a [u8]>, ApiError> {
    let mut found: Option<(&[u8], Source)> = None;
    if let Some(v) = header {
        take(&mut found, v.as_bytes(), Source::Header)?;
    }
    let named_by_header = found.is_some();
    for path in dialect.end_user_fields() {
        if named_by_header && *path == METADATA_USER_ID {
            continue;
        }
        let source = Source::Field(path);
        match field(body, path) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => take(&mut found, s.as_bytes(), source)?,
            Some(_) => {
                return Err(invalid(
                    source.param().as_deref(),
                    format!("{} must be a string.", source.describe()),
                ))
            }
        }
    }
    Ok(found.map(|(id, _)| id))
}

/// Records `id` from `source` unless empty; refuses one too long or one
/// that disagrees with an earlier source.
fn take<'a>(
    found: &mut Option<(&'a [u8], Source)>,
    id: &'a [u8],
    source: Source,
) -> Result<(), ApiError> {
    if id.is_empty() {
        return Ok(());
    }
    if id.len() > MAX_ID_BYTES {
        return Err(invalid(
            source.param().as_deref(),
            format!(
                "The end-user id in {} is {} bytes long; at most {MAX_ID_BYTES} are accepted.",
                source.describe(),
                id.len()
            ),
        ));
    }
    match found {
        Some((earlier, first)) if *earlier != id => Err(invalid(
            source.param().as_deref(),
            format!(
                "{} and {} name different end users; send one, or the same id in both.",
                first.describe(),
                source.describe()
            ),
        )),
        Some(_) => Ok(()),
        None => {
            *found = Some((id, source));
            Ok(())
        }
    }
}

/// The member at `path` of `body`.
fn field<'a>(body: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter()
        .try_fold(body.get(*first)?, |v, member| v.as_object()?.get(*member))
}

/// ` or the body's …` naming the dialect's fields.
fn fields_hint(dialect: Dialect) -> String {
    let names: Vec<String> = dialect
        .end_user_fields()
        .iter()
        .map(|p| format!("`{}`", p.join(".")))
        .collect();
    format!(" or the body's {}", names.join(" or "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn headers(id: Option<&str>) -> Option<HeaderValue> {
        id.map(|id| id.parse().unwrap())
    }

    fn message(e: ApiError) -> String {
        match e {
            ApiError::InvalidRequest { message, param } => format!("{param:?}: {message}"),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn sources_in_order_and_agreeing() {
        let chat = Dialect::ChatCompletions;
        let b = body(json!({"user": "u1", "safety_identifier": "u1"}));
        assert_eq!(
            id_of(chat, headers(Some("u1")).as_ref(), &b).unwrap(),
            Some(&b"u1"[..])
        );
        let b = body(json!({"user": "u2"}));
        assert_eq!(id_of(chat, None, &b).unwrap(), Some(&b"u2"[..]));
        let b = body(json!({"user": "", "metadata": {"user_id": "x"}}));
        assert_eq!(id_of(chat, None, &b).unwrap(), None);
        let b = body(json!({"metadata": {"user_id": "a"}, "user": "ignored"}));
        assert_eq!(id_of(Dialect::Messages, None, &b).unwrap(), Some(&b"a"[..]));
    }

    /// Fault: naming the person with the header while Claude Code put its
    /// session id in `metadata.user_id` got a 400 on every request.
    #[test]
    fn the_header_wins_over_metadata_user_id_only() {
        let session = body(json!({"metadata": {"user_id": "{\"session_id\":\"7b3e\"}"}}));
        assert_eq!(
            id_of(Dialect::Messages, headers(Some("alice")).as_ref(), &session).unwrap(),
            Some(&b"alice"[..])
        );
        // An empty header is absent: the field names the end user.
        assert_eq!(
            id_of(Dialect::Messages, headers(Some("")).as_ref(), &session).unwrap(),
            Some(&br#"{"session_id":"7b3e"}"#[..])
        );
        // OpenAI's fields still have to agree with the header.
        let chat = body(json!({"user": "bob"}));
        assert!(id_of(
            Dialect::ChatCompletions,
            headers(Some("alice")).as_ref(),
            &chat
        )
        .is_err());
        let chat = body(json!({"safety_identifier": "bob"}));
        assert!(id_of(Dialect::Responses, headers(Some("alice")).as_ref(), &chat).is_err());
    }

    #[test]
    fn refusals_name_their_source() {
        let chat = Dialect::ChatCompletions;
        let e = id_of(
            chat,
            headers(Some("a")).as_ref(),
            &body(json!({"user": "b"})),
        )
        .unwrap_err();
        let m = message(e);
        assert!(m.contains("x-budgetgate-end-user header and `user`"), "{m}");
        let long = "x".repeat(10_000);
        let e = id_of(chat, None, &body(json!({"safety_identifier": long}))).unwrap_err();
        let m = message(e);
        assert!(
            m.starts_with("Some(\"safety_identifier\")") && m.contains("10000 bytes"),
            "{m}"
        );
        let e = id_of(chat, None, &body(json!({"user": 7}))).unwrap_err();
        assert!(message(e).contains("`user` must be a string"));
        let e = id_of(
            Dialect::Messages,
            None,
            &body(json!({"metadata": {"user_id": "x".repeat(257)}})),
        )
        .unwrap_err();
        assert!(message(e).contains("`metadata.user_id` is 257 bytes"));
        assert!(fields_hint(chat).contains("`safety_identifier` or `user`"));
    }
}
