//! The control plane (docs/CONTROL.md): tenants, keys and admin tokens created at
//! runtime through the admin API, kept in a database, merged into the
//! policy every gateway of a fleet serves.
//!
//! - The database handle is [`crate::db`]'s (shared with the ledger); this
//!   module keeps the control plane's own SQL.
//! - [`runtime`]: the entities as read ([`runtime::Snapshot`]) and their
//!   merge with the config file into one policy.
//! - [`writes`]: every change, each with its audit row, the version
//!   counter and the fleet's notification.
//! - [`sync`]: propagation: PostgreSQL `LISTEN/NOTIFY`, the counter polled
//!   (SQLite; and as the backstop of a missed notification), a periodic
//!   full refresh.
//!
//! The config file stays the bootstrap and the home of static entities.
//! An entity of the database that does not merge with the file and the
//! rest (a name the file also defines, a key or child whose tenant is
//! gone, what the validator refuses) is quarantined: logged, counted,
//! listed, not served; the rest is served ([`runtime::compose`]). When the
//! database is unreachable the gateway keeps serving the last snapshot it
//! read, and changes are refused (503) until it is back.

pub mod runtime;
pub mod sync;
pub mod writes;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::config::raw::RawConfig;
use crate::config::reload::{self, ReloadOutcome, Trigger};
use crate::config::{ConfigErrors, Policy};
use crate::db::{self, Db};
use runtime::{Quarantined, Snapshot};

/// The database opened and read at start, before the gateway's state
/// exists ([`Opened::into_plane`] joins it).
pub struct Opened {
    db: Db,
    url: String,
    snapshot: Snapshot,
    file: (RawConfig, String),
    config_path: PathBuf,
    /// The policy version served at start and what it leaves out.
    quarantine: (String, Vec<Quarantined>),
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
    let composed = runtime::compose(&file.0, &file.1, &snapshot).map_err(|e| e.to_string())?;
    let quarantine = (composed.policy.version.clone(), composed.quarantined());
    log_quarantine(&quarantine.0, &quarantine.1);
    crate::metrics::control_served(snapshot.version, quarantine.1.len());
    let policy = composed.policy;
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
            quarantine,
        },
        policy,
    ))
}

/// Logs each quarantined entity at error (once per policy version: the
/// callers log a version once).
fn log_quarantine(policy_version: &str, list: &[Quarantined]) {
    for q in list {
        tracing::error!(
            entity = %q.entity,
            reason = %q.reason,
            policy_version,
            "control database entity quarantined: not served until it merges again (GET /admin/v1/control/quarantine)"
        );
    }
}

fn db_kind_name(db: &Db) -> &'static str {
    match db.kind() {
        db::DbKind::Sqlite => "sqlite",
        db::DbKind::Postgres => "postgres",
    }
}

impl Opened {
    /// The control plane over the gateway's policy `policy` (the one
    /// requests load), running its database work on `runtime`;
    /// `installed` runs after each policy it installs (what the gateway
    /// keeps per tenant and forgets with it).
    pub fn into_plane(
        self,
        policy: Arc<ArcSwap<Policy>>,
        runtime: tokio::runtime::Handle,
        installed: impl Fn(&Policy) + Send + Sync + 'static,
    ) -> Arc<ControlPlane> {
        Arc::new(ControlPlane {
            installed: Box::new(installed),
            reload_rejected: AtomicBool::new(false),
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
            quarantine: ArcSwap::from_pointee(self.quarantine.1),
            logged: Mutex::new(self.quarantine.0),
            started: Instant::now(),
            confirmed_ms: AtomicU64::new(0),
            test_pause: Mutex::new(None),
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
    /// The entities of the served snapshot left out of the policy.
    quarantine: ArcSwap<Vec<Quarantined>>,
    /// The policy version whose quarantine was logged last.
    logged: Mutex<String>,
    /// When the plane was made (the origin of `confirmed_ms`).
    started: Instant,
    /// When a read of the database last found the served snapshot
    /// current (ms after `started`).
    confirmed_ms: AtomicU64,
    /// Tests only: see [`ControlPlane::pause_writes_before_commit`].
    test_pause: Mutex<Option<(String, Duration)>>,
    /// Runs after each policy installed.
    installed: Box<dyn Fn(&Policy) + Send + Sync>,
    /// The last file reload was rejected: the next one that is not says
    /// so (restoring the running file changes nothing else, and would log
    /// nothing at info).
    reload_rejected: AtomicBool,
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

    /// The entities of the database not served (they do not merge), by
    /// entity.
    pub fn quarantined(&self) -> Arc<Vec<Quarantined>> {
        self.quarantine.load_full()
    }

    /// How long since a read of the database last found the served
    /// snapshot current: the age of the tenants and keys served (it grows
    /// while the database cannot be read).
    pub fn snapshot_age(&self) -> Duration {
        let at = Duration::from_millis(self.confirmed_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(at)
    }

    fn confirm(&self) {
        let ms = self.started.elapsed().as_millis().min(u64::MAX as u128) as u64;
        self.confirmed_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// What this gateway's writes are re-checked against under the lock.
    pub fn recheck(&self) -> writes::Recheck {
        writes::Recheck {
            file: self.file().0,
            pause: self
                .test_pause
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            scope: None,
        }
    }

    /// For tests: this gateway's writes of audit action `action` (`"*"`:
    /// every one) wait `pause` between their re-check and their commit,
    /// holding the control tree's lock, so that a test can have another
    /// write arrive in between. Hidden: nothing in the gateway, its
    /// config or its environment calls it.
    #[doc(hidden)]
    pub fn pause_writes_before_commit(&self, pause: Option<(&str, Duration)>) {
        *self.test_pause.lock().unwrap_or_else(|e| e.into_inner()) =
            pause.map(|(a, d)| (a.to_string(), d));
    }

    /// Records what `policy_version` leaves out; logs it the first time
    /// that version is seen.
    fn note_quarantine(&self, policy_version: &str, version: i64, list: Vec<Quarantined>) {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if *logged != policy_version {
            log_quarantine(policy_version, &list);
            *logged = policy_version.to_string();
        }
        crate::metrics::control_served(version, list.len());
        self.quarantine.store(Arc::new(list));
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
            Ok(Some(snap)) => {
                let read = snap.version;
                self.serve(snap);
                if self.serves(read) {
                    self.confirm();
                }
            }
            Ok(None) => self.confirm(),
            Err(e) => tracing::debug!(error = %e, "control refresh failed"),
        }
    }

    /// Serves `snap` unless a snapshot of a later counter is served
    /// already (a slower refresh that read before a write finishing after
    /// the write's own refresh). The policy is installed before the
    /// snapshot is recorded, so a snapshot seen at version N means the
    /// policy serving N (what [`ControlPlane::serves`] relies on). What
    /// does not merge is quarantined and the rest served.
    fn serve(&self, snap: Snapshot) {
        let _one = self.installing.lock().unwrap_or_else(|e| e.into_inner());
        if snap.version < self.snapshot.load().version {
            return;
        }
        let (raw, version) = self.file();
        match runtime::compose(&raw, &version, &snap) {
            Ok(c) => {
                let list = c.quarantined();
                let policy_version = c.policy.version.clone();
                // Installs are one at a time (`installing`): the policy
                // running now is the one the new policy replaces.
                let previous = self.policy.load_full();
                if let ReloadOutcome::Applied { .. } =
                    reload::install(&self.policy, c.policy, &self.config_path, Trigger::Control)
                {
                    let policy = self.policy.load();
                    crate::metrics::policy_installed(Some(&previous), &policy);
                    crate::metrics::register_policy_series(&policy);
                    (self.installed)(&policy);
                }
                self.note_quarantine(&policy_version, snap.version, list);
                self.snapshot.store(Arc::new(snap));
            }
            Err(e) => {
                // The file itself does not validate (it did when it was
                // read), or the merge fails in a way traced to no entity
                // (quarantining everything would lock out the unrelated):
                // the running policy stays.
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
    /// current snapshot. Rejected for the file's own errors and for an
    /// error of the merge traced to no runtime entity (the running policy
    /// stays, logged at error): a runtime entity the new file leaves
    /// without its tenant or parent, whose name or secret it now defines
    /// too, is quarantined.
    pub fn reload_file(&self, trigger: Trigger) -> ReloadOutcome {
        let _one = self.installing.lock().unwrap_or_else(|e| e.into_inner());
        let snap = self.snapshot.load_full();
        let mut quarantine = None;
        // Installs are one at a time (`installing`): the policy running
        // now is the one a reload replaces.
        let previous = self.policy.load_full();
        let outcome = reload::reload_with(&self.policy, &self.config_path, trigger, |path| {
            let (raw, version) = Policy::read_raw(path)?;
            let c = runtime::compose(&raw, &version, &snap)?;
            *self.file.lock().unwrap_or_else(|e| e.into_inner()) = (raw, version);
            quarantine = Some((c.policy.version.clone(), c.quarantined()));
            Ok::<Policy, ConfigErrors>(c.policy)
        });
        if let Some((policy_version, list)) = quarantine {
            self.note_quarantine(&policy_version, snap.version, list);
        }
        if let ReloadOutcome::Applied { .. } = outcome {
            let policy = self.policy.load();
            crate::metrics::policy_installed(Some(&previous), &policy);
            (self.installed)(&policy);
        }
        let rejected = matches!(outcome, ReloadOutcome::Rejected { .. });
        if self.reload_rejected.swap(rejected, Ordering::Relaxed) && !rejected {
            tracing::info!(
                config = %self.config_path.display(),
                %trigger,
                policy_version = %self.policy.load().version,
                "config reload: the file is valid again after a rejected reload"
            );
        }
        outcome
    }
}
