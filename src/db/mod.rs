//! The shared database handle: `[control] database_url`, an SQLite file
//! under the state directory by default, PostgreSQL (`postgres://…`) for a
//! fleet. A bottom module: the control plane and the spend ledger both
//! use it, and it imports neither (each keeps its own SQL).
//!
//! [`Db`] is the handle every user of the database shares (the control
//! plane, the spend ledger): a pool of sqlx's `Any` driver, so one query
//! text serves both databases (write `$1, $2` placeholders: SQLite reads
//! them as PostgreSQL does), and the [`DbKind`] for the few statements that
//! differ (`pg_notify`).
//!
//! Migrations are embedded in the binary ([`MIGRATIONS_SQLITE`],
//! [`MIGRATIONS_POSTGRES`], one list per database, the files under
//! `migrations/`), applied at start in version order inside sqlx's
//! migration lock (several gateways starting at once apply each once).
//! Versions 0001–0099 are the control plane's, 0100 and up the ledger's.
//! A database that holds a migration this binary does not know was
//! written by a newer budgetgate: the start is refused, naming both
//! versions, rather than running old code on a newer schema.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::AnyPool;
use sqlx::SqlSafeStr;

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// `sqlite:` (a file; created when missing).
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
}

impl DbKind {
    /// The kind of `url`, `None` for any other scheme.
    pub fn of(url: &str) -> Option<DbKind> {
        if url.starts_with("sqlite:") {
            Some(DbKind::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(DbKind::Postgres)
        } else {
            None
        }
    }
}

/// One embedded migration: version, description, SQL.
pub type MigrationFile = (i64, &'static str, &'static str);

/// SQLite migrations, in version order.
pub const MIGRATIONS_SQLITE: &[MigrationFile] = &[
    (
        1,
        "control",
        include_str!("../../migrations/sqlite/0001_control.sql"),
    ),
    (
        100,
        "spend ledger",
        include_str!("../../migrations/sqlite/0100_spend_ledger.sql"),
    ),
    (
        101,
        "spend ledger request ids",
        include_str!("../../migrations/sqlite/0101_spend_ledger_request_ids.sql"),
    ),
    (
        102,
        "spend ledger deciding layer",
        include_str!("../../migrations/sqlite/0102_spend_ledger_decided_by.sql"),
    ),
    (
        103,
        "spend ledger run ids",
        include_str!("../../migrations/sqlite/0103_spend_ledger_run_id.sql"),
    ),
    (
        104,
        "spend ledger run index",
        include_str!("../../migrations/sqlite/0104_spend_ledger_run_index.sql"),
    ),
];

/// PostgreSQL migrations, in version order (the same versions as SQLite's).
pub const MIGRATIONS_POSTGRES: &[MigrationFile] = &[
    (
        1,
        "control",
        include_str!("../../migrations/postgres/0001_control.sql"),
    ),
    (
        100,
        "spend ledger",
        include_str!("../../migrations/postgres/0100_spend_ledger.sql"),
    ),
    (
        101,
        "spend ledger request ids",
        include_str!("../../migrations/postgres/0101_spend_ledger_request_ids.sql"),
    ),
    (
        102,
        "spend ledger deciding layer",
        include_str!("../../migrations/postgres/0102_spend_ledger_decided_by.sql"),
    ),
    (
        103,
        "spend ledger run ids",
        include_str!("../../migrations/postgres/0103_spend_ledger_run_id.sql"),
    ),
    (
        104,
        "spend ledger run index",
        include_str!("../../migrations/postgres/0104_spend_ledger_run_index.sql"),
    ),
];

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Not a `sqlite:` or `postgres://` URL.
    #[error("control.database_url must start with sqlite: or postgres://")]
    Scheme,
    /// The SQLite file's directory could not be created.
    #[error("cannot create {0}: {1}")]
    Directory(PathBuf, std::io::Error),
    /// Connecting failed.
    #[error("cannot open the control database: {0}")]
    Connect(sqlx::Error),
    /// The database was migrated by a newer binary.
    #[error("the control database is at schema version {found}, newer than this binary's {known}: it was written by a newer budgetgate; run that version (or newer) instead")]
    Newer {
        /// The newest version the database has applied.
        found: i64,
        /// The newest version this binary knows.
        known: i64,
    },
    /// A migration failed.
    #[error("control database migration failed: {0}")]
    Migrate(sqlx::migrate::MigrateError),
}

/// The shared handle to the control database. Cheap to clone (a pool).
#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    kind: DbKind,
    /// The URL as connected (SQLite's with `mode=rwc`).
    url: String,
    /// Held by this process's control writes from before their
    /// transaction begins to its end: they queue here instead of in the
    /// database (SQLite's busy handler waits by sleeping, 1 to 100 ms a
    /// time; a queued PostgreSQL writer would hold a pooled connection).
    writers: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// The gateway's state directory, where the default database and the
/// memory store's snapshot live: the directory systemd gives the service
/// (`StateDirectory=`, as `$STATE_DIRECTORY`), else
/// `$XDG_STATE_HOME/budgetgate`, else `~/.local/state/budgetgate`, else
/// `/var/lib/budgetgate`. Never the config directory, which may be a
/// read-only mount.
pub fn state_dir() -> PathBuf {
    if let Some(d) = non_empty_env("STATE_DIRECTORY") {
        // systemd may pass several, colon-separated: the first is ours.
        PathBuf::from(d.split(':').next().unwrap_or(&d))
    } else if let Some(d) = non_empty_env("XDG_STATE_HOME") {
        Path::new(&d).join("budgetgate")
    } else if let Some(h) = non_empty_env("HOME") {
        Path::new(&h).join(".local/state/budgetgate")
    } else {
        PathBuf::from("/var/lib/budgetgate")
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The default database: `control.db` in the state directory
/// ([`state_dir`]), beside the memory store's snapshot.
pub fn default_url() -> String {
    format!("sqlite://{}", state_dir().join("control.db").display())
}

impl Db {
    /// Opens the database at `url` and applies the migrations this binary
    /// embeds; refused when the database is newer than the binary.
    pub async fn open(url: &str) -> Result<Db, DbError> {
        let kind = DbKind::of(url).ok_or(DbError::Scheme)?;
        sqlx::any::install_default_drivers();
        let url = match kind {
            DbKind::Sqlite => sqlite_url(url)?,
            DbKind::Postgres => url.to_string(),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(match kind {
                // One writer at a time in SQLite anyway; a few readers.
                DbKind::Sqlite => 4,
                DbKind::Postgres => 8,
            })
            .acquire_timeout(Duration::from_secs(5))
            .connect(&url)
            .await
            .map_err(DbError::Connect)?;
        let db = Db {
            pool,
            kind,
            url,
            writers: Default::default(),
        };
        db.migrate().await?;
        Ok(db)
    }

    /// A pool of one connection to the same database, for the ledger's
    /// writer on its own thread: its batches then never wait for a
    /// connection the control plane holds, and (PostgreSQL) its socket is
    /// driven by the writer's runtime, not by a serving thread's. An
    /// in-memory SQLite database exists once per connection: the shared
    /// pool is returned for it. Lazy: it connects on its first write, so
    /// a database down at that moment is a failed batch (kept in the
    /// buffer, tried again), not a ledger that never starts. Call it on
    /// the runtime that will use it.
    pub fn writer_pool(&self) -> Result<AnyPool, DbError> {
        if self.kind == DbKind::Sqlite && self.url.contains(":memory:") {
            return Ok(self.pool.clone());
        }
        AnyPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&self.url)
            .map_err(DbError::Connect)
    }

    /// The pool (sqlx `Any`: placeholders `$1, $2, …`).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A transaction that will write. On SQLite it takes the write lock at
    /// `BEGIN IMMEDIATE`: a deferred transaction that reads first and then
    /// writes fails at once with `SQLITE_BUSY` (no busy wait is possible
    /// for a reader's upgrade) when another connection (the ledger's
    /// writer, another admin call) wrote in between.
    pub async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.kind {
            DbKind::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            DbKind::Postgres => self.pool.begin().await,
        }
    }

    /// Waits for this process's turn to write (see `writers`); the turn
    /// lasts as long as the guard.
    pub async fn write_turn(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.writers.clone().lock_owned().await
    }

    /// Which database this is.
    pub fn kind(&self) -> DbKind {
        self.kind
    }

    /// The migrations of this database kind.
    fn migrations(&self) -> &'static [MigrationFile] {
        match self.kind {
            DbKind::Sqlite => MIGRATIONS_SQLITE,
            DbKind::Postgres => MIGRATIONS_POSTGRES,
        }
    }

    async fn migrate(&self) -> Result<(), DbError> {
        let files = self.migrations();
        let known = files.iter().map(|m| m.0).max().unwrap_or(0);
        // Before sqlx's own check (which names only the missing version):
        // the operator needs to know the database is ahead of the binary.
        if let Some(found) = self.applied_version().await {
            if found > known {
                return Err(DbError::Newer { found, known });
            }
        }
        let migrations = files
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    no_transaction(sql),
                )
            })
            .collect();
        let migrator = Migrator::with_migrations(migrations);
        migrator.run(&self.pool).await.map_err(DbError::Migrate)
    }

    /// The newest migration applied, `None` on a database never migrated.
    pub async fn applied_version(&self) -> Option<i64> {
        sqlx::query_scalar::<_, i64>(
            "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await
        .ok()
        .flatten()
    }
}

/// True for a migration that must run outside a transaction (PostgreSQL's
/// `CREATE INDEX CONCURRENTLY`): its first line is `-- no-transaction`,
/// the marker sqlx's file source reads.
fn no_transaction(sql: &str) -> bool {
    sql.starts_with("-- no-transaction")
}

/// `sqlite:PATH` or `sqlite://PATH` with `mode=rwc` (create when missing)
/// and the file's directory created.
fn sqlite_url(url: &str) -> Result<String, DbError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path != ":memory:" && !path.is_empty() {
        if let Some(dir) = Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|e| DbError::Directory(dir.to_path_buf(), e))?;
        }
    }
    let mode = if query.contains("mode=") {
        String::new()
    } else if query.is_empty() {
        "?mode=rwc".into()
    } else {
        "&mode=rwc".into()
    };
    let sep = if query.is_empty() { "" } else { "?" };
    Ok(format!("sqlite://{path}{sep}{query}{mode}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_scheme() {
        assert_eq!(DbKind::of("sqlite:///tmp/x.db"), Some(DbKind::Sqlite));
        assert_eq!(DbKind::of("sqlite:x.db"), Some(DbKind::Sqlite));
        assert_eq!(DbKind::of("postgres://u@h/db"), Some(DbKind::Postgres));
        assert_eq!(DbKind::of("postgresql://u@h/db"), Some(DbKind::Postgres));
        assert_eq!(DbKind::of("mysql://u@h/db"), None);
    }

    #[test]
    fn sqlite_urls_create_the_file() {
        assert_eq!(sqlite_url("sqlite:x.db").unwrap(), "sqlite://x.db?mode=rwc");
        assert_eq!(
            sqlite_url("sqlite://x.db?cache=shared").unwrap(),
            "sqlite://x.db?cache=shared&mode=rwc"
        );
        assert_eq!(
            sqlite_url("sqlite://x.db?mode=ro").unwrap(),
            "sqlite://x.db?mode=ro"
        );
    }

    /// Fault: the run index, built with `CREATE INDEX CONCURRENTLY`, ran
    /// in the migration's transaction, which PostgreSQL refuses.
    #[test]
    fn only_the_concurrent_index_runs_outside_a_transaction() {
        let outside: Vec<i64> = MIGRATIONS_POSTGRES
            .iter()
            .filter(|m| no_transaction(m.2))
            .map(|m| m.0)
            .collect();
        assert_eq!(outside, vec![104]);
        let index = MIGRATIONS_POSTGRES[MIGRATIONS_POSTGRES.len() - 1].2;
        let statements: Vec<&str> = index
            .lines()
            .filter(|l| !l.starts_with("--") && !l.trim().is_empty())
            .collect();
        assert_eq!(statements.len(), 1, "one statement: {statements:?}");
        assert!(statements[0].starts_with("CREATE INDEX CONCURRENTLY"));
        assert!(MIGRATIONS_SQLITE.iter().all(|m| !no_transaction(m.2)));
        let versions = |m: &[MigrationFile]| m.iter().map(|m| m.0).collect::<Vec<_>>();
        assert_eq!(versions(MIGRATIONS_SQLITE), versions(MIGRATIONS_POSTGRES));
    }

    #[tokio::test]
    async fn a_database_newer_than_the_binary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("c.db").display());
        let db = Db::open(&url).await.expect("first open migrates");
        assert_eq!(
            db.applied_version().await,
            Some(104),
            "control and ledger migrations"
        );
        drop(db);
        let db = Db::open(&url).await.expect("a second open is a no-op");
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (999, 'future', TRUE, X'00', 0)",
        )
        .execute(db.pool())
        .await
        .unwrap();
        db.pool().close().await;
        let e = Db::open(&url).await.expect_err("newer schema");
        assert!(
            matches!(
                e,
                DbError::Newer {
                    found: 999,
                    known: 104
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("newer budgetgate"), "{e}");
    }
}
