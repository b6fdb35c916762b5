//! What a key body may set and the checks the config file cannot make
//! (its keys have no alias, owner, allowed models or expiry); how a key
//! is shown; a fresh secret.

use axum::response::Response;
use serde_json::{json, Value};

use super::bad_request;
use crate::config::raw::RawLimits;
use crate::config::Policy;
use crate::control::runtime::RuntimeKey;
use crate::control::writes::KeyFields;

/// Longest alias, bytes (stored as written up to this).
pub const MAX_ALIAS_BYTES: usize = 1024;

/// Largest owner metadata, bytes of JSON.
pub const MAX_OWNER_BYTES: usize = 16 * 1024;

/// Longest rotation overlap: 30 days.
pub const MAX_OVERLAP_SECS: u64 = 30 * 86_400;

/// What a key body may set (create; the result of a merge patch).
#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyBody {
    pub(super) id: Option<String>,
    pub(super) alias: Option<String>,
    pub(super) owner: Option<Value>,
    #[serde(default)]
    pub(super) limits: RawLimits,
    pub(super) allowed_models: Option<Vec<String>>,
    /// Unix seconds.
    pub(super) expires_at: Option<i64>,
}

/// A fresh secret: 244 random bits (two v4 UUIDs), prefixed so that
/// secret scanners and people recognise it.
pub(super) fn new_secret() -> String {
    format!(
        "sk-bg-{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

pub(super) fn view(k: &RuntimeKey) -> Value {
    let mut v = json!({
        "tenant": k.tenant,
        "id": k.id,
        "alias": k.alias,
        "owner": k.owner,
        "limits": k.limits,
        "allowed_models": k.allowed_models,
        "expires_at": k.expires_at.map(|t| t / 1_000_000),
        "revoked_at": k.revoked_at.map(|t| t / 1_000_000),
        "created_at": k.created_at / 1_000_000,
        "retiring_secrets_until": k.secrets.iter().filter_map(|s| s.retires_at.map(|t| t / 1_000_000)).collect::<Vec<_>>(),
        "source": "api",
    });
    super::strip_nulls(&mut v);
    v
}

/// The checks the config file cannot make (its keys have none of these).
pub(super) fn fields(policy: &Policy, b: &KeyBody) -> Result<KeyFields, Response> {
    if let Some(a) = &b.alias {
        if a.len() > MAX_ALIAS_BYTES {
            return Err(bad_request(
                Some("alias"),
                &format!(
                    "alias: at most {MAX_ALIAS_BYTES} bytes (this one: {})",
                    a.len()
                ),
            ));
        }
    }
    let owner = b.owner.clone().unwrap_or_else(|| json!({}));
    if !owner.is_object() {
        return Err(bad_request(Some("owner"), "owner: must be a JSON object"));
    }
    if owner.to_string().len() > MAX_OWNER_BYTES {
        return Err(bad_request(
            Some("owner"),
            &format!("owner: at most {MAX_OWNER_BYTES} bytes of JSON"),
        ));
    }
    if let Some(models) = &b.allowed_models {
        // The syntax of `[[models]]` names, matched on the name sent
        // (config::model_names): an exact name must be served.
        for (i, m) in models.iter().enumerate() {
            let path = format!("allowed_models[{i}]");
            match crate::config::model_names::NamePattern::parse(m) {
                Err(why) => return Err(bad_request(Some(&path), &format!("{path}: {m:?}: {why}"))),
                Ok(p) if !p.is_pattern() && policy.model(m).is_none() => {
                    return Err(bad_request(
                        Some(&path),
                        &format!("{path}: unknown model {m:?}"),
                    ));
                }
                Ok(_) => {}
            }
        }
    }
    let expires_at = match b.expires_at {
        None => None,
        // Up to the year 9999.
        Some(s) if (1..=253_402_300_799).contains(&s) => Some(s as u64 * 1_000_000),
        Some(_) => {
            return Err(bad_request(
                Some("expires_at"),
                "expires_at: must be a Unix time in seconds, 1 to 253402300799",
            ))
        }
    };
    Ok(KeyFields {
        alias: b.alias.clone(),
        owner,
        limits: b.limits.clone(),
        allowed_models: b.allowed_models.clone(),
        expires_at,
    })
}
