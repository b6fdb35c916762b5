//! Changes to the control database. Each is one transaction that first
//! locks the control tree ([`lock`]: PostgreSQL `SELECT … FOR UPDATE` on
//! the `control_version` row, SQLite `BEGIN IMMEDIATE`), so that control
//! writes of the whole fleet run one at a time; then applies the change,
//! re-reads everything in the transaction and merges it with the config
//! file again ([`finish`]): a change that would leave an entity that does
//! not merge (a key or a child whose tenant was deleted meanwhile, a
//! tenant whose children were created meanwhile, a move into a cycle) is
//! rolled back and answered [`WriteError::Conflict`], naming what changed.
//! Then it appends its audit row (who, when, what, before, after),
//! increments the version counter and, on PostgreSQL, notifies the
//! other gateways (`pg_notify` is delivered at commit, so a listener never
//! sees a change before it is readable). Values are always bound
//! parameters: a name or an alias is stored as written, never
//! interpreted. Keys are in [`keys`], admin tokens and the audit trail's
//! reading in [`tokens`].

mod keys;
mod root_bounds;
mod tokens;

pub use keys::*;
pub use root_bounds::{loosened, Loosened};
pub use tokens::*;

use std::time::Duration;

use serde_json::Value;
use sqlx::any::Any;
use sqlx::Transaction;

use super::runtime::{self, LoadError, Quarantine};
use crate::config::raw::{RawConfig, RawTenant};
use crate::db::{Db, DbKind};

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
    /// Another change committed first, and this one no longer merges
    /// (what, in the message).
    #[error("{0}")]
    Conflict(String),
    /// A tenant-scoped admin token's change reaches outside its subtree
    /// as the database is under the lock (moved out meanwhile).
    #[error("{0}")]
    Forbidden(String),
    /// A tenant-scoped admin token's change loosens what binds its own
    /// tenant, as the database is under the lock ([`loosened`]).
    #[error("{}", .0.message)]
    Loosened(Loosened),
    /// A field of the change is out of range as the database is under the
    /// lock (`param`: its path in the body).
    #[error("{message}")]
    Invalid {
        /// The field's path in the body.
        param: String,
        /// Why.
        message: String,
    },
}

impl From<LoadError> for WriteError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Db(e) => WriteError::Db(e),
            other => WriteError::Db(sqlx::Error::Protocol(other.to_string())),
        }
    }
}

/// What a write is checked against under the lock.
#[derive(Debug, Clone, Default)]
pub struct Recheck {
    /// The config file the database is merged with (this gateway's).
    pub file: RawConfig,
    /// Tests only (`ControlPlane::pause_writes_before_commit`): writes of
    /// this audit action (`"*"`: all) wait this long between their
    /// re-check and their commit, holding the lock.
    pub pause: Option<(String, Duration)>,
    /// The caller's subtree and the tenants the change touches: set for a
    /// tenant-scoped admin token, whose scope the handler checked against
    /// its gateway's last snapshot only.
    pub scope: Option<Scope>,
}

/// A tenant-scoped admin token's write, checked under the lock.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The token's tenant.
    pub root: String,
    /// Tenants the change reads or writes (a key's tenant, a tenant, its
    /// new parent): each must lie in `root`'s subtree before the change.
    pub tenants: Vec<String>,
    /// The tenant the change creates or updates: its limits may not
    /// exceed its parent's after the change, nor may it loosen what binds
    /// `root` ([`loosened`]).
    pub bounded: Option<String>,
}

/// The first limit of `child` above `parent`'s: its field, both values.
pub fn above_parent(
    child: &crate::config::Limits,
    parent: &crate::config::Limits,
) -> Option<(&'static str, u64, u64)> {
    let (c, p) = (child, parent);
    [
        ("rpm", c.rpm, p.rpm),
        ("tpm", c.tpm, p.tpm),
        ("input_tpm", c.input_tpm, p.input_tpm),
        ("output_tpm", c.output_tpm, p.output_tpm),
        ("max_concurrent", c.max_concurrent, p.max_concurrent),
        ("tokens_per_day", c.tokens_per_day, p.tokens_per_day),
        ("tokens_per_month", c.tokens_per_month, p.tokens_per_month),
        ("requests_per_day", c.requests_per_day, p.requests_per_day),
        ("usd_per_day", c.usd_per_day, p.usd_per_day),
        ("usd_per_month", c.usd_per_month, p.usd_per_month),
        ("tokens_per_5h", c.tokens_per_5h, p.tokens_per_5h),
        ("tokens_per_24h", c.tokens_per_24h, p.tokens_per_24h),
        ("tokens_per_week", c.tokens_per_week, p.tokens_per_week),
        ("usd_per_5h", c.usd_per_5h, p.usd_per_5h),
        ("usd_per_24h", c.usd_per_24h, p.usd_per_24h),
        ("usd_per_week", c.usd_per_week, p.usd_per_week),
    ]
    .into_iter()
    .find_map(|(field, c, p)| match (c, p) {
        (Some(c), Some(p)) if c > p => Some((field, c, p)),
        _ => None,
    })
}

/// The refusal of a limit above the parent's, at `path` of the body.
pub fn above_parent_message(path: &str, (c, p): (u64, u64), parent: &str) -> String {
    format!(
        "{path}: {c} is above the {p} of parent tenant {parent:?}; a tenant-scoped admin token cannot raise a tenant's limits above its parent's"
    )
}

/// Whether `name` is `root` or one of its descendants under `policy`.
pub fn in_subtree(policy: &crate::config::Policy, name: &str, root: &str) -> bool {
    let Some(t) = policy.tenants.iter().find(|t| t.name == name) else {
        return false;
    };
    t.name == root || t.ancestors.iter().any(|&a| policy.tenants[a].name == root)
}

/// A write's transaction with the control tree locked.
pub(super) struct Locked<'c> {
    pub(super) tx: Transaction<'static, Any>,
    /// This process's turn (dropped after the transaction ends).
    _turn: tokio::sync::OwnedMutexGuard<()>,
    check: &'c Recheck,
    /// The database before the change, read under the lock; `None`: the
    /// change depends on nothing else (a revocation, a rotation), and is
    /// not re-checked.
    before: Option<runtime::Snapshot>,
    /// What `before` composes to, for a tenant-scoped token's change.
    scoped_before: Option<crate::config::Policy>,
    /// A tenant that must be served after the change (an admin token's
    /// scope).
    pub(super) needs_tenant: Option<String>,
}

/// Begins a write: the transaction, the control tree locked for it (every
/// other control write of the fleet waits until it ends), and, when
/// `recheck`, what does not merge before the change.
pub(super) async fn lock<'c>(
    db: &Db,
    check: &'c Recheck,
    recheck: bool,
) -> Result<Locked<'c>, WriteError> {
    let turn = db.write_turn().await;
    // SQLite: `BEGIN IMMEDIATE` takes the database's write lock.
    let mut tx = db.begin_write().await?;
    if db.kind() == DbKind::Postgres {
        sqlx::query_scalar::<_, i64>("SELECT version FROM control_version WHERE id = 1 FOR UPDATE")
            .fetch_one(&mut *tx)
            .await?;
    }
    // A scoped token's change is always checked: a revocation too may
    // name a key whose tenant left the token's subtree meanwhile.
    let before = match recheck || check.scope.is_some() {
        true => Some(runtime::load_in(&mut tx).await?),
        false => None,
    };
    let mut scoped_before = None;
    if let (Some(scope), Some(before)) = (&check.scope, &before) {
        let policy = runtime::compose(&check.file, "recheck", before)
            .map_err(|e| WriteError::Conflict(e.0.join("; ")))?
            .policy;
        let policy = scoped_before.insert(policy);
        // The handler's refusal, word for word: the same request sent
        // after this gateway catches up gets the same answer.
        if let Some(t) = scope
            .tenants
            .iter()
            .find(|t| !in_subtree(policy, t, &scope.root))
        {
            return Err(WriteError::Forbidden(format!(
                "This admin token cannot see or change tenant {t:?}: it is limited to tenant {:?} and its subtree.",
                scope.root
            )));
        }
    }
    Ok(Locked {
        tx,
        _turn: turn,
        check,
        before,
        scoped_before,
        needs_tenant: None,
    })
}

/// What does not merge of `snap`.
fn quarantine_of(snap: &runtime::Snapshot, check: &Recheck) -> Result<Quarantine, WriteError> {
    runtime::compose(&check.file, "recheck", snap)
        .map(|c| c.quarantine)
        .map_err(|e| WriteError::Conflict(e.0.join("; ")))
}

pub(super) fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

pub(super) fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Ends a write: re-checks it (everything read again in the transaction,
/// merged with the file: nothing that merged before it may stop merging),
/// then the audit row, the counter, the notification, the commit. A
/// change that fails the re-check is rolled back.
pub(super) async fn finish(db: &Db, w: Locked<'_>, audit: Audit<'_>) -> Result<i64, WriteError> {
    let Locked {
        mut tx,
        _turn,
        check,
        before,
        scoped_before,
        needs_tenant,
    } = w;
    if let Some(before) = before {
        let snap = runtime::load_in(&mut tx).await?;
        let after = runtime::compose(&check.file, "recheck", &snap)
            .map_err(|e| WriteError::Conflict(e.0.join("; ")))?;
        // Composed only when needed: most changes leave nothing out.
        let was_out = match after.quarantine.is_empty() {
            true => Quarantine::new(),
            false => quarantine_of(&before, check)?,
        };
        let mut changed: Vec<String> = after
            .quarantine
            .iter()
            .filter(|(e, _)| !was_out.contains_key(*e))
            .map(|(e, why)| runtime::describe(e, why))
            .collect();
        if let Some(t) = needs_tenant {
            if !after.policy.tenants.iter().any(|x| x.name == t) {
                changed.push(format!("tenant {t:?} is not defined"));
            }
        }
        // A parent's limit lowered meanwhile: the handler's 400, as a
        // retry would get.
        let bounded = check.scope.as_ref().and_then(|s| s.bounded.as_deref());
        let p = &after.policy;
        if let Some(t) = bounded.and_then(|n| p.tenants.iter().find(|t| t.name == n)) {
            if let Some(parent) = t.parent.map(|i| &p.tenants[i]) {
                if let Some((field, c, v)) = above_parent(&t.limits, &parent.limits) {
                    let param = format!("limits.{field}");
                    let message = above_parent_message(&param, (c, v), &parent.name);
                    return Err(WriteError::Invalid { param, message });
                }
            }
        }
        // The handler's 403 again, on the database as it is now: a change
        // computed from a stale snapshot writes the whole tenant back.
        if let (Some(scope), Some(name), Some(prior)) = (&check.scope, bounded, &scoped_before) {
            if let Some(l) = loosened(&scope.root, name, (&before, prior), (&snap, p)) {
                return Err(WriteError::Loosened(l));
            }
        }
        if !changed.is_empty() {
            return Err(WriteError::Conflict(format!(
                "The control database changed since this gateway last read it, and this change no longer fits: {}. Nothing was changed; read again and retry.",
                changed.join("; ")
            )));
        }
    }
    if let Some((action, pause)) = &check.pause {
        if action == "*" || action == audit.action {
            tokio::time::sleep(*pause).await;
        }
    }
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
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    t: &RawTenant,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, true).await?;
    let exists: Option<String> = sqlx::query_scalar("SELECT name FROM tenants WHERE name = $1")
        .bind(t.name.clone())
        .fetch_optional(&mut *w.tx)
        .await?;
    if exists.is_some() {
        return Err(WriteError::Exists);
    }
    sqlx::query("INSERT INTO tenants (name, spec, created_at, updated_at) VALUES ($1, $2, $3, $3)")
        .bind(t.name.clone())
        .bind(tenant_spec(t))
        .bind(i(now))
        .execute(&mut *w.tx)
        .await?;
    let audit = Audit {
        actor,
        at: now,
        action: "tenant.create",
        subject: format!("tenant:{}", t.name),
        before: None,
        after: Some(tenant_value(t)),
    };
    finish(db, w, audit).await
}

/// Replaces tenant `t` (found by its name) with `t`.
pub async fn update_tenant(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    before: &RawTenant,
    t: &RawTenant,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, true).await?;
    let n = sqlx::query("UPDATE tenants SET spec = $2, updated_at = $3 WHERE name = $1")
        .bind(t.name.clone())
        .bind(tenant_spec(t))
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
        action: "tenant.update",
        subject: format!("tenant:{}", t.name),
        before: Some(tenant_value(before)),
        after: Some(tenant_value(t)),
    };
    finish(db, w, audit).await
}

/// Deletes tenant `before` and its keys.
pub async fn delete_tenant(
    (db, check): (&Db, &Recheck),
    actor: &Actor,
    now: u64,
    before: &RawTenant,
) -> Result<i64, WriteError> {
    let mut w = lock(db, check, true).await?;
    let n = sqlx::query("DELETE FROM tenants WHERE name = $1")
        .bind(before.name.clone())
        .execute(&mut *w.tx)
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
            .execute(&mut *w.tx)
            .await?;
    }
    // Admin tokens scoped to it end with it: a tenant created later under
    // the same name, anywhere in the tree, is not theirs.
    sqlx::query("UPDATE admin_tokens SET revoked_at = $2 WHERE tenant = $1 AND revoked_at IS NULL")
        .bind(before.name.clone())
        .bind(i(now))
        .execute(&mut *w.tx)
        .await?;
    let audit = Audit {
        actor,
        at: now,
        action: "tenant.delete",
        subject: format!("tenant:{}", before.name),
        before: Some(tenant_value(before)),
        after: None,
    };
    finish(db, w, audit).await
}
