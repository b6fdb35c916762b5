//! The control plane (issue 29): tenants, keys and admin tokens created at
//! runtime through the admin API, kept in a database, merged into the
//! policy every gateway of a fleet serves.
//!
//! - [`db`]: the database handle ([`db::Db`]), SQLite by default,
//!   PostgreSQL for a fleet; embedded migrations.
//! - [`runtime`]: the entities as read ([`runtime::Snapshot`]) and their
//!   merge with the config file into one policy.
//! - [`writes`]: every change, each with its audit row, the version
//!   counter and the fleet's notification.
//! - [`sync`]: propagation: PostgreSQL `LISTEN/NOTIFY`, the counter polled
//!   (SQLite; and as the backstop of a missed notification), a periodic
//!   full refresh.
//!
//! The config file stays the bootstrap and the home of static entities;
//! a name in both is an error at start and at reload. When the database is
//! unreachable the gateway keeps serving the last snapshot it read, and
//! changes are refused (503) until it is back.

pub mod db;
pub mod runtime;
pub mod sync;
pub mod writes;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::config::raw::RawConfig;
use crate::config::reload::{self, ReloadOutcome, Trigger};
use crate::config::{ConfigErrors, Policy};
use db::Db;
use runtime::Snapshot;

/// The database opened and read at start, before the gateway's state
/// exists ([`Opened::into_plane`] joins it).
pub struct Opened {
    db: Db,
    url: String,
    snapshot: Snapshot,
    file: (RawConfig, String),
    config_path: PathBuf,
}

/// Opens the control database of `file_policy` (the config file alone),
/// applies its migrations and reads its entities; returns the policy to
/// serve, the file merged with them. Errors name what refused the start (a
/// database newer than the binary, a name defined in both places).
pub async fn open(file_policy: &Policy, config_path: &Path) -> Result<(Opened, Policy), String> {
    let url = file_policy
        .control
        .database_url
        .clone()
        .unwrap_or_else(db::default_url);
    let db = Db::open(&url).await.map_err(|e| e.to_string())?;
    let snapshot = runtime::load(&db).await.map_err(|e| e.to_string())?;
    let file = Policy::read_raw(config_path).map_err(|e| e.to_string())?;
    let policy = runtime::compose(&file.0, &file.1, &snapshot).map_err(|e| e.to_string())?;
    tracing::info!(
        database = %db_kind_name(&db),
        version = snapshot.version,
        tenants = snapshot.tenants.len(),
        keys = snapshot.keys.len(),
        "control database opened"
    );
    Ok((
        Opened {
            db,
            url,
            snapshot,
            file,
            config_path: config_path.to_path_buf(),
        },
        policy,
    ))
}

fn db_kind_name(db: &Db) -> &'static str {
    match db.kind() {
        db::DbKind::Sqlite => "sqlite",
        db::DbKind::Postgres => "postgres",
    }
}

impl Opened {
    /// The control plane over the gateway's policy `policy` (the one
    /// requests load), running its database work on `runtime`.
    pub fn into_plane(
        self,
        policy: Arc<ArcSwap<Policy>>,
        runtime: tokio::runtime::Handle,
    ) -> Arc<ControlPlane> {
        Arc::new(ControlPlane {
            db: self.db,
            url: self.url,
            snapshot: ArcSwap::from_pointee(self.snapshot),
            file: Mutex::new(self.file),
            config_path: self.config_path,
            policy,
            changed: Notify::new(),
            installing: Mutex::new(()),
            reachable: AtomicBool::new(true),
            runtime,
        })
    }
}

/// The running control plane of one gateway.
pub struct ControlPlane {
    db: Db,
    /// The database URL (never logged: it may hold a password).
    url: String,
    /// The last snapshot read (what the policy was composed from).
    snapshot: ArcSwap<Snapshot>,
    /// The config file as last read, and its version.
    file: Mutex<(RawConfig, String)>,
    config_path: PathBuf,
    policy: Arc<ArcSwap<Policy>>,
    /// Woken by this gateway's own writes and by PostgreSQL notifications.
    changed: Notify,
    /// Held while a policy is composed and installed: refreshes read the
    /// database concurrently (the propagation task, a write's handler, a
    /// file reload), and one that read earlier must not install after one
    /// that read later, or a key just created vanishes until the next poll.
    installing: Mutex<()>,
    /// Whether the last database call succeeded.
    reachable: AtomicBool,
    /// The runtime the database pool lives on (serving thread 0's):
    /// handlers on other serving threads run their calls there.
    runtime: tokio::runtime::Handle,
}

impl ControlPlane {
    /// The database handle.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The last snapshot read.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The config file as last read (values and version).
    pub fn file(&self) -> (RawConfig, String) {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the database answered the last call.
    pub fn reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    fn mark(&self, ok: bool) {
        let was = self.reachable.swap(ok, Ordering::Relaxed);
        if was && !ok {
            tracing::warn!("control database unreachable: serving the last known tenants and keys; admin changes answer 503");
        } else if !was && ok {
            tracing::info!("control database reachable again");
        }
    }

    /// Runs `fut` (database work) on the control plane's runtime and waits
    /// for it from whichever runtime calls.
    pub async fn run<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, writes::WriteError>> + Send + 'static,
    ) -> Result<T, writes::WriteError> {
        let r = match self.runtime.spawn(fut).await {
            Ok(r) => r,
            Err(e) => Err(writes::WriteError::Db(sqlx::Error::Protocol(format!(
                "control task ended: {e}"
            )))),
        };
        self.mark(!matches!(r, Err(writes::WriteError::Db(_))));
        r
    }

    /// Asks the propagation task to read the database now (after a write).
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// Reads the database and, when its counter moved (or `force`),
    /// serves the file merged with the new snapshot. A snapshot that does
    /// not merge (a name the file also defines) is logged and not served.
    pub async fn refresh(&self, force: bool) {
        let db = self.db.clone();
        let current = self.snapshot.load().version;
        let read = self
            .run(async move {
                let v = runtime::version(&db).await?;
                if v == current && !force {
                    return Ok(None);
                }
                runtime::load(&db).await.map(Some).map_err(|e| match e {
                    runtime::LoadError::Db(e) => writes::WriteError::Db(e),
                    other => writes::WriteError::Db(sqlx::Error::Protocol(other.to_string())),
                })
            })
            .await;
        match read {
            Ok(Some(snap)) => self.serve(snap),
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "control refresh failed"),
        }
    }

    /// Serves `snap` unless a snapshot of a later counter is served
    /// already (a slower refresh that read before a write finishing after
    /// the write's own refresh). The policy is installed before the
    /// snapshot is recorded, so a snapshot seen at version N means the
    /// policy serving N (what [`ControlPlane::serves`] relies on).
    fn serve(&self, snap: Snapshot) {
        let _one = self.installing.lock().unwrap_or_else(|e| e.into_inner());
        if snap.version < self.snapshot.load().version {
            return;
        }
        let (raw, version) = self.file();
        match runtime::compose(&raw, &version, &snap) {
            Ok(p) => {
                if let ReloadOutcome::Applied { .. } =
                    reload::install(&self.policy, p, &self.config_path, Trigger::Control)
                {
                    crate::metrics::register_policy_series(&self.policy.load());
                }
                self.snapshot.store(Arc::new(snap));
            }
            Err(e) => {
                for error in &e.0 {
                    tracing::error!(%error, version = snap.version, "control database change not served");
                }
            }
        }
    }

    /// Whether this gateway serves counter `version` (or a later one).
    pub fn serves(&self, version: i64) -> bool {
        self.snapshot.load().version >= version
    }

    /// After this gateway's own write (which left the counter at
    /// `version`): refreshes until the policy serves it, so that the
    /// write's answer is never ahead of the gateway that gave it (a key
    /// just created answers 200 here at once). Bounded: a database that
    /// stops answering, or a change that does not merge, leaves it to the
    /// propagation task.
    pub async fn caught_up(&self, version: i64) {
        for _ in 0..3 {
            if self.serves(version) {
                return;
            }
            self.refresh(false).await;
        }
        if !self.serves(version) {
            tracing::warn!(
                version,
                "control change written but not yet served here; the next refresh will"
            );
        }
    }

    /// The config file reload (SIGHUP, file change), merged with the
    /// current snapshot: a file that now defines a runtime name is
    /// rejected, naming it.
    pub fn reload_file(&self, trigger: Trigger) -> ReloadOutcome {
        let _one = self.installing.lock().unwrap_or_else(|e| e.into_inner());
        let snap = self.snapshot.load_full();
        reload::reload_with(&self.policy, &self.config_path, trigger, |path| {
            let (raw, version) = Policy::read_raw(path)?;
            let p = runtime::compose(&raw, &version, &snap)?;
            *self.file.lock().unwrap_or_else(|e| e.into_inner()) = (raw, version);
            Ok::<Policy, ConfigErrors>(p)
        })
    }
}
