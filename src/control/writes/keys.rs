//! Changes to keys: create, update, rotate, revoke.

use serde_json::Value;
use sqlx::any::Any;
use sqlx::Transaction;

use super::{finish, i, json, lock, Actor, Audit, Recheck, WriteError};
use crate::config::raw::RawLimits;
use crate::db::Db;

/// The fields of a key a caller sets.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KeyFields {
    /// A name for people.
    pub alias: Option<String>,
    /// Owner metadata (JSON object).
    pub owner: Value,
    /// Limits, as the config file writes them.
    pub limits: RawLimits,
    /// Public model names; `None`: all.
    pub allowed_models: Option<Vec<String>>,
    /// UTC µs.
    pub expires_at: Option<u64>,
}

/// Creates key `id` of `tenant` with the secret whose digest is `sha256`.
pub async fn create_key(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    (tenant, id): (&str, &str),
    sha256: &str,
    f: &KeyFields,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, true).await?;
    let exists: Option<String> =
        sqlx::query_scalar("SELECT id FROM api_keys WHERE tenant = $1 AND id = $2")
            .bind(tenant.to_string())
            .bind(id.to_string())
            .fetch_optional(&mut *w.tx)
            .await?;
    if exists.is_some() {
        return Err(WriteError::Exists);
    }
    sqlx::query(
        "INSERT INTO api_keys (tenant, id, alias, owner, limits, allowed_models, expires_at, revoked_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, $8, $8)",
    )
    .bind(tenant.to_string())
    .bind(id.to_string())
    .bind(f.alias.clone())
    .bind(json(&f.owner))
    .bind(json(&f.limits))
    .bind(json(&f.allowed_models))
    .bind(f.expires_at.map(i))
    .bind(i(now))
    .execute(&mut *w.tx)
    .await?;
    insert_secret(&mut w.tx, (tenant, id), sha256, now).await?;
    let audit = Audit {
        actor,
        at: now,
        action: "key.create",
        subject: format!("key:{tenant}/{id}"),
        before: None,
        after: Some(serde_json::to_value(f).unwrap_or(Value::Null)),
    };
    finish(db, w, audit).await
}

async fn insert_secret(
    tx: &mut Transaction<'_, Any>,
    (tenant, id): (&str, &str),
    sha256: &str,
    now: u64,
) -> Result<(), WriteError> {
    sqlx::query("INSERT INTO key_secrets (sha256, tenant, key_id, created_at, retires_at) VALUES ($1, $2, $3, $4, NULL)")
        .bind(sha256.to_string())
        .bind(tenant.to_string())
        .bind(id.to_string())
        .bind(i(now))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Replaces the settable fields of key `id` of `tenant`.
pub async fn update_key(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    (tenant, id): (&str, &str),
    before: &KeyFields,
    f: &KeyFields,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, true).await?;
    let n = sqlx::query(
        "UPDATE api_keys SET alias = $3, owner = $4, limits = $5, allowed_models = $6, expires_at = $7, updated_at = $8 WHERE tenant = $1 AND id = $2",
    )
    .bind(tenant.to_string())
    .bind(id.to_string())
    .bind(f.alias.clone())
    .bind(json(&f.owner))
    .bind(json(&f.limits))
    .bind(json(&f.allowed_models))
    .bind(f.expires_at.map(i))
    .bind(i(now))
    .execute(&mut *w.tx)
    .await?
    .rows_affected();
    if n == 0 {
        return Err(WriteError::NotFound);
    }
    let audit = Audit {
        actor,
        at: now,
        action: "key.update",
        subject: format!("key:{tenant}/{id}"),
        before: serde_json::to_value(before).ok(),
        after: serde_json::to_value(f).ok(),
    };
    finish(db, w, audit).await
}

/// Gives key `id` of `tenant` the secret `sha256`; its current secrets
/// stay valid until `now + overlap` (µs). Secrets already past their end
/// are deleted.
pub async fn rotate_key(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    (tenant, id): (&str, &str),
    sha256: &str,
    overlap_micros: u64,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, false).await?;
    let live: Option<String> = sqlx::query_scalar(
        "SELECT id FROM api_keys WHERE tenant = $1 AND id = $2 AND revoked_at IS NULL",
    )
    .bind(tenant.to_string())
    .bind(id.to_string())
    .fetch_optional(&mut *w.tx)
    .await?;
    if live.is_none() {
        return Err(WriteError::NotFound);
    }
    let until = now.saturating_add(overlap_micros);
    sqlx::query("DELETE FROM key_secrets WHERE tenant = $1 AND key_id = $2 AND retires_at IS NOT NULL AND retires_at <= $3")
        .bind(tenant.to_string())
        .bind(id.to_string())
        .bind(i(now))
        .execute(&mut *w.tx)
        .await?;
    sqlx::query("UPDATE key_secrets SET retires_at = $3 WHERE tenant = $1 AND key_id = $2 AND retires_at IS NULL")
        .bind(tenant.to_string())
        .bind(id.to_string())
        .bind(i(until))
        .execute(&mut *w.tx)
        .await?;
    insert_secret(&mut w.tx, (tenant, id), sha256, now).await?;
    let audit = Audit {
        actor,
        at: now,
        action: "key.rotate",
        subject: format!("key:{tenant}/{id}"),
        before: None,
        after: Some(serde_json::json!({ "previous_secret_valid_until": until })),
    };
    finish(db, w, audit).await
}

/// Revokes key `id` of `tenant` (it stays listed, refused everywhere).
pub async fn revoke_key(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    (tenant, id): (&str, &str),
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, false).await?;
    let n = sqlx::query(
        "UPDATE api_keys SET revoked_at = $3, updated_at = $3 WHERE tenant = $1 AND id = $2 AND revoked_at IS NULL",
    )
    .bind(tenant.to_string())
    .bind(id.to_string())
    .bind(i(now))
    .execute(&mut *w.tx)
    .await?
    .rows_affected();
    if n == 0 {
        return Err(WriteError::NotFound);
    }
    sqlx::query("DELETE FROM key_secrets WHERE tenant = $1 AND key_id = $2")
        .bind(tenant.to_string())
        .bind(id.to_string())
        .execute(&mut *w.tx)
        .await?;
    let audit = Audit {
        actor,
        at: now,
        action: "key.revoke",
        subject: format!("key:{tenant}/{id}"),
        before: None,
        after: Some(serde_json::json!({ "revoked_at": now })),
    };
    finish(db, w, audit).await
}
