//! Admin tokens and the audit trail.

use serde_json::Value;

use super::{finish, i, lock, Actor, Audit, Recheck, WriteError};
use crate::control::runtime::Role;
use crate::db::Db;

/// Stores admin token `id` (its digest only).
pub async fn create_token(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    id: &str,
    sha256: &str,
    (role, tenant): (Role, Option<&str>),
) -> Result<i64, WriteError> {
    // Its scope must still exist when it is stored: a tenant deleted
    // meanwhile and created again later would otherwise be its.
    let mut w = lock(db, check, tenant.is_some()).await?;
    w.needs_tenant = tenant.map(str::to_string);
    sqlx::query("INSERT INTO admin_tokens (id, sha256, role, tenant, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5, NULL)")
        .bind(id.to_string())
        .bind(sha256.to_string())
        .bind(role.name())
        .bind(tenant.map(str::to_string))
        .bind(i(now))
        .execute(&mut *w.tx)
        .await?;
    let audit = Audit {
        actor,
        at: now,
        action: "admin_token.create",
        subject: format!("admin_token:{id}"),
        before: None,
        after: Some(serde_json::json!({ "role": role.name(), "tenant": tenant })),
    };
    finish(db, w, audit).await
}

/// Revokes admin token `id`.
pub async fn revoke_token(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    id: &str,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, false).await?;
    let n =
        sqlx::query("UPDATE admin_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
            .bind(id.to_string())
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
        action: "admin_token.revoke",
        subject: format!("admin_token:{id}"),
        before: None,
        after: Some(serde_json::json!({ "revoked_at": now })),
    };
    finish(db, w, audit).await
}

/// One audit row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditRow {
    /// Order of the change.
    pub seq: i64,
    /// UTC µs.
    pub at: i64,
    /// `root` (the bootstrap token) or `admin_token:<id>`.
    pub actor: String,
    /// `tenant.create`, `key.revoke`, …
    pub action: String,
    /// `tenant:<name>`, `key:<tenant>/<id>`, `admin_token:<id>`.
    pub subject: String,
    /// The entity before (JSON), when it existed.
    pub before: Option<Value>,
    /// The entity after (JSON), when it still exists.
    pub after: Option<Value>,
}

/// Audit rows newest first, before `before_seq` when given, at most `limit`.
pub async fn audit(
    db: &Db,
    before_seq: Option<i64>,
    limit: i64,
) -> Result<Vec<AuditRow>, sqlx::Error> {
    use sqlx::Row;
    let rows = sqlx::query(
        "SELECT seq, at, actor, action, subject, before_value, after_value FROM audit WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
    )
    .bind(before_seq.unwrap_or(i64::MAX))
    .bind(limit)
    .fetch_all(db.pool())
    .await?;
    let value = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
    rows.into_iter()
        .map(|r| {
            Ok(AuditRow {
                seq: r.try_get("seq")?,
                at: r.try_get("at")?,
                actor: r.try_get("actor")?,
                action: r.try_get("action")?,
                subject: r.try_get("subject")?,
                before: value(r.try_get("before_value")?),
                after: value(r.try_get("after_value")?),
            })
        })
        .collect()
}
