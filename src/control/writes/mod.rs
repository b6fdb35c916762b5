//! Changes to the control database. Each is one transaction that applies
//! the change, appends its audit row (who, when, what, before, after),
//! increments the version counter and, on PostgreSQL, notifies the
//! other gateways (`pg_notify` is delivered at commit, so a listener never
//! sees a change before it is readable). Values are always bound
//! parameters: a name or an alias is stored as written, never
//! interpreted. Keys are in [`keys`], admin tokens and the audit trail's
//! reading in [`tokens`].

mod keys;
mod tokens;

pub use keys::*;
pub use tokens::*;

use serde_json::Value;
use sqlx::any::Any;
use sqlx::Transaction;

use super::db::{Db, DbKind};
use crate::config::raw::RawTenant;

/// The PostgreSQL channel changes are announced on.
pub const CHANNEL: &str = "budgetgate_control";

/// Who made a change, as the audit trail names them.
#[derive(Debug, Clone)]
pub struct Actor(pub String);

/// The audit entry of a change.
pub(super) struct Audit<'a> {
    pub(super) actor: &'a Actor,
    pub(super) at: u64,
    pub(super) action: &'a str,
    pub(super) subject: String,
    pub(super) before: Option<Value>,
    pub(super) after: Option<Value>,
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The database did not answer or refused (unreachable, read-only, …).
    #[error("control database: {0}")]
    Db(#[from] sqlx::Error),
    /// The entity does not exist.
    #[error("not found")]
    NotFound,
    /// An entity of that name exists.
    #[error("already exists")]
    Exists,
}

pub(super) fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

pub(super) fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

pub(super) async fn finish(
    db: &Db,
    mut tx: Transaction<'_, Any>,
    audit: Audit<'_>,
) -> Result<i64, WriteError> {
    sqlx::query(
        "INSERT INTO audit (at, actor, action, subject, before_value, after_value) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(i(audit.at))
    .bind(audit.actor.0.clone())
    .bind(audit.action.to_string())
    .bind(audit.subject)
    .bind(audit.before.map(|v| v.to_string()))
    .bind(audit.after.map(|v| v.to_string()))
    .execute(&mut *tx)
    .await?;
    let version: i64 = sqlx::query_scalar(
        "UPDATE control_version SET version = version + 1 WHERE id = 1 RETURNING version",
    )
    .fetch_one(&mut *tx)
    .await?;
    if db.kind() == DbKind::Postgres {
        // Wrapped: the Any driver has no type for pg_notify's `void`.
        sqlx::query_scalar::<_, i32>("SELECT 1 FROM (SELECT pg_notify($1, $2)) AS sent")
            .bind(CHANNEL)
            .bind(version.to_string())
            .fetch_one(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(version)
}

/// The stored form of a tenant: the config file's fields, no keys.
fn tenant_spec(t: &RawTenant) -> String {
    let mut t = t.clone();
    t.keys.clear();
    json(&t)
}

fn tenant_value(t: &RawTenant) -> Value {
    serde_json::from_str(&tenant_spec(t)).unwrap_or(Value::Null)
}

/// Creates tenant `t`; returns the new version.
pub async fn create_tenant(
    db: &Db,
    actor: &Actor,
    now: u64,
    t: &RawTenant,
) -> Result<i64, WriteError> {
    let mut tx = db.begin_write().await?;
    let exists: Option<String> = sqlx::query_scalar("SELECT name FROM tenants WHERE name = $1")
        .bind(t.name.clone())
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_some() {
        return Err(WriteError::Exists);
    }
    sqlx::query("INSERT INTO tenants (name, spec, created_at, updated_at) VALUES ($1, $2, $3, $3)")
        .bind(t.name.clone())
        .bind(tenant_spec(t))
        .bind(i(now))
        .execute(&mut *tx)
        .await?;
    let audit = Audit {
        actor,
        at: now,
        action: "tenant.create",
        subject: format!("tenant:{}", t.name),
        before: None,
        after: Some(tenant_value(t)),
    };
    finish(db, tx, audit).await
}

/// Replaces tenant `t` (found by its name) with `t`.
pub async fn update_tenant(
    db: &Db,
    actor: &Actor,
    now: u64,
    before: &RawTenant,
    t: &RawTenant,
) -> Result<i64, WriteError> {
    let mut tx = db.begin_write().await?;
    let n = sqlx::query("UPDATE tenants SET spec = $2, updated_at = $3 WHERE name = $1")
        .bind(t.name.clone())
        .bind(tenant_spec(t))
        .bind(i(now))
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if n == 0 {
        return Err(WriteError::NotFound);
    }
    let audit = Audit {
        actor,
        at: now,
        action: "tenant.update",
        subject: format!("tenant:{}", t.name),
        before: Some(tenant_value(before)),
        after: Some(tenant_value(t)),
    };
    finish(db, tx, audit).await
}

/// Deletes tenant `before` and its keys.
pub async fn delete_tenant(
    db: &Db,
    actor: &Actor,
    now: u64,
    before: &RawTenant,
) -> Result<i64, WriteError> {
    let mut tx = db.begin_write().await?;
    let n = sqlx::query("DELETE FROM tenants WHERE name = $1")
        .bind(before.name.clone())
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if n == 0 {
        return Err(WriteError::NotFound);
    }
    for table in [
        "DELETE FROM api_keys WHERE tenant = $1",
        "DELETE FROM key_secrets WHERE tenant = $1",
    ] {
        sqlx::query(table)
            .bind(before.name.clone())
            .execute(&mut *tx)
            .await?;
    }
    // Admin tokens scoped to it end with it: a tenant created later under
    // the same name, anywhere in the tree, is not theirs.
    sqlx::query("UPDATE admin_tokens SET revoked_at = $2 WHERE tenant = $1 AND revoked_at IS NULL")
        .bind(before.name.clone())
        .bind(i(now))
        .execute(&mut *tx)
        .await?;
    let audit = Audit {
        actor,
        at: now,
        action: "tenant.delete",
        subject: format!("tenant:{}", before.name),
        before: Some(tenant_value(before)),
        after: None,
    };
    finish(db, tx, audit).await
}
