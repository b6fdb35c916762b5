//! Hot reload (DESIGN sections 2 and 8): on SIGHUP and on a change of the
//! config file, re-read and validate it; when valid, swap the active
//! [`Policy`] atomically, otherwise keep the running one and log every error.
//!
//! - Requests load the policy once (`ArcSwap::load_full`) and keep that
//!   `Arc<Policy>` to the end, so in-flight requests and streams finish
//!   under the policy they started with.
//! - Stored budget state adopts new limits on first access (lower capacity
//!   clamps, a raise grants nothing at once); nothing is rewritten here.
//! - Some settings are bound at start and cannot change at runtime:
//!   `server.listen` (the socket is bound), `server.admin_token_env` (the
//!   token is read at start), `server.end_user_key_env` (end users are
//!   named by their hash under that key), the whole `[store]` section (the store is
//!   built at start) and `[control]` (the database is opened at start). When a new file changes them, a warning says a restart
//!   is needed and the running values are kept; the rest of the file applies.
//! - The file's *directory* is watched, not the file, so editors that save
//!   by writing a temporary file and renaming it over the original, and
//!   Kubernetes ConfigMap volumes (a symlink swapped in the directory), are
//!   seen; events for other entries of the directory are dropped by name
//!   (a log file or a snapshot written there would otherwise re-read the
//!   config on every write). Events are debounced ([`DEBOUNCE`]); a file
//!   whose bytes did not change (same policy version) is not swapped again.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::Policy;

/// Quiet time after the last file event before the file is re-read.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP.
    Signal,
    /// A change in the config file's directory.
    FileChange,
    /// A change of the control database's tenants, keys or tokens.
    Control,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::Signal => "sighup",
            Trigger::FileChange => "file_change",
            Trigger::Control => "control_change",
        })
    }
}

/// What one reload attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The new policy is active.
    Applied {
        /// Version that was running.
        old_version: String,
        /// Version now running.
        new_version: String,
        /// Restart-only settings the file changed; their running values were kept.
        restart_needed: Vec<&'static str>,
    },
    /// The file has the running version's bytes; nothing was swapped.
    Unchanged {
        /// The running version.
        version: String,
    },
    /// The file is unreadable or invalid; the running policy stays.
    Rejected {
        /// The running (kept) version.
        kept_version: String,
        /// Every error, each prefixed by its path.
        errors: Vec<String>,
    },
}

/// Copies the settings that cannot change at runtime from `running` into
/// `new`, returning the names of those the new file changed.
pub fn keep_restart_only(running: &Policy, new: &mut Policy) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if new.server.listen != running.server.listen {
        changed.push("server.listen");
        new.server.listen = running.server.listen;
    }
    if new.server.admin_token_env != running.server.admin_token_env {
        changed.push("server.admin_token_env");
        new.server.admin_token_env = running.server.admin_token_env.clone();
    }
    if new.server.end_user_key_env != running.server.end_user_key_env {
        // End users are named by their hash under this key: another key
        // would give every end user fresh budgets.
        changed.push("server.end_user_key_env");
        new.server.end_user_key_env = running.server.end_user_key_env.clone();
        if running.end_user_key.is_some() {
            new.end_user_key = running.end_user_key.clone();
        }
    }
    if new.server.connections.max_connections != running.server.connections.max_connections {
        changed.push("server.max_connections");
        new.server.connections.max_connections = running.server.connections.max_connections;
    }
    if new.server.tls != running.server.tls {
        changed.push("server.tls");
        new.server.tls = running.server.tls.clone();
    }
    if new.telemetry != running.telemetry {
        // The exporter is started once per process.
        changed.push("telemetry");
        new.telemetry = running.telemetry.clone();
    }
    if new.control != running.control {
        // The database is opened (and migrated) at start.
        changed.push("control");
        new.control = running.control.clone();
    }
    // Compared through `Debug` so that every field of `[store]`, present and
    // future, counts, without requiring `PartialEq` of each.
    if format!("{:?}", new.store) != format!("{:?}", running.store) {
        changed.push("store");
        new.store = running.store.clone();
    }
    changed
}

/// Reads and validates `path`; when valid, swaps it into `current` (keeping
/// the restart-only settings) and logs the new version; when not, keeps the
/// running policy and logs every error on its own line.
pub fn reload(current: &ArcSwap<Policy>, path: &Path, trigger: Trigger) -> ReloadOutcome {
    reload_with(current, path, trigger, Policy::load)
}

/// [`reload`] with the policy built by `load` (the file merged with the
/// control database's entities, [`crate::control`]).
pub fn reload_with(
    current: &ArcSwap<Policy>,
    path: &Path,
    trigger: Trigger,
    load: impl FnOnce(&Path) -> Result<Policy, super::ConfigErrors>,
) -> ReloadOutcome {
    let running = current.load_full();
    let new = match load(path) {
        Ok(p) => p,
        Err(e) => {
            for error in &e.0 {
                tracing::error!(config = %path.display(), %trigger, %error, "config reload: invalid");
            }
            tracing::error!(
                config = %path.display(),
                %trigger,
                errors = e.0.len(),
                policy_version = %running.version,
                "config reload rejected; the running policy stays"
            );
            return ReloadOutcome::Rejected {
                kept_version: running.version.clone(),
                errors: e.0,
            };
        }
    };
    install(current, new, path, trigger)
}

/// Swaps `new` in unless it has the running version, keeping the
/// restart-only settings: the one way a policy changes at runtime, for a
/// file reload and a control-database change alike. What follows an
/// applied policy (its metrics series) is the caller's: config imports no
/// feature.
pub fn install(
    current: &ArcSwap<Policy>,
    mut new: Policy,
    path: &Path,
    trigger: Trigger,
) -> ReloadOutcome {
    let running = current.load_full();
    if new.version == running.version {
        // A file event with nothing new is routine (a touch, a copy of the
        // same bytes): debug. A SIGHUP is an operator's question and gets
        // its answer at info; it cannot repeat by itself.
        if trigger == Trigger::Signal {
            tracing::info!(config = %path.display(), %trigger, policy_version = %running.version, "config reload: file unchanged; the running policy stays");
        } else {
            tracing::debug!(config = %path.display(), %trigger, policy_version = %running.version, "config reload: file unchanged; the running policy stays");
        }
        return ReloadOutcome::Unchanged {
            version: running.version.clone(),
        };
    }
    let restart_needed = keep_restart_only(&running, &mut new);
    for setting in &restart_needed {
        tracing::warn!(
            config = %path.display(),
            setting,
            "config reload: this setting changed but takes effect only after a restart; keeping the running value"
        );
    }
    let new_version = new.version.clone();
    for note in &new.renamed_keys {
        tracing::warn!(config = %path.display(), "{note}");
    }
    current.store(Arc::new(new));
    tracing::info!(
        config = %path.display(),
        %trigger,
        old_version = %running.version,
        policy_version = %new_version,
        "policy reloaded"
    );
    ReloadOutcome::Applied {
        old_version: running.version.clone(),
        new_version,
        restart_needed,
    }
}

/// True for events that may mean new file content (not our own reads).
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// The directory to watch for `path` (`.` for a bare file name).
fn watch_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The entry names whose events may change what `path` reads: its own name
/// and, when it is a symlink with a relative target, the target's first
/// entry in the same directory (a Kubernetes ConfigMap swaps its `..data`
/// link and never touches the file's own name).
fn watched_names(path: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = path.file_name().map(OsString::from).into_iter().collect();
    if let Ok(target) = std::fs::read_link(path) {
        if target.is_relative() {
            if let Some(Component::Normal(first)) = target.components().next() {
                names.push(first.to_os_string());
            }
        }
    }
    names
}

/// True when `ev` is about one of `names`. Names, not whole paths, are
/// compared: backends spell the watched directory differently (absolute,
/// canonical), the entry name is what every backend reports as is. An event
/// without paths (the backend lost events and asks for a rescan) counts.
fn concerns(ev: &notify::Event, names: &[OsString]) -> bool {
    ev.paths.is_empty()
        || ev
            .paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| names.iter().any(|w| w == n)))
}

/// Calls `apply` on every SIGHUP and, debounced, on every change of one of
/// `files` (watched through their directories, so that rename-on-save is
/// seen; events for other entries in those directories — a log file, the
/// memory store's snapshot — are ignored without reading anything). `what`
/// names the files in the logs ("the config file", "the TLS certificate
/// and key"). The SIGHUP handler and the
/// watcher are installed when this is called, not when the returned future
/// first runs: a SIGHUP that arrives between start-up and the task's first
/// poll would otherwise meet the default action and end the process. The
/// future runs until its task is aborted. When a directory cannot be
/// watched, logs a warning and keeps serving SIGHUP alone.
pub fn watch(
    files: Vec<PathBuf>,
    what: &'static str,
    apply: impl Fn(Trigger) + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let path = files.first().cloned().unwrap_or_default();
    let names: Vec<OsString> = files.iter().flat_map(|f| watched_names(f)).collect();
    let mut dirs: Vec<PathBuf> = files.iter().map(|f| watch_dir(f)).collect();
    dirs.dedup();
    let dir = dirs.first().cloned().unwrap_or_default();
    let watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) if is_change(&ev.kind) && concerns(&ev, &names) => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "error watching {what}"),
        })
        .and_then(|mut w| {
            for d in &dirs {
                w.watch(d, RecursiveMode::NonRecursive)?;
            }
            Ok(w)
        });
    let watcher = match watcher {
        Ok(w) => {
            tracing::info!(file = %path.display(), dir = %dir.display(), "watching {what} for changes");
            Some(w)
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), dir = %dir.display(), error = %e, "cannot watch {what}; reload with SIGHUP");
            None
        }
    };
    let mut hup = hangup();
    let mut files_open = watcher.is_some();
    async move {
        // Owned by the task so that the watcher lives as long as it runs.
        let _watcher = watcher;
        loop {
            tokio::select! {
                _ = hup.recv() => apply(Trigger::Signal),
                ev = rx.recv(), if files_open => {
                    if ev.is_none() {
                        files_open = false;
                        continue;
                    }
                    // Debounce: wait for DEBOUNCE of quiet.
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                    apply(Trigger::FileChange);
                }
            }
        }
    }
}

/// SIGHUP as a stream of notifications (never fires off Unix).
struct Hangup {
    #[cfg(unix)]
    sig: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(s) = self.sig.as_mut() {
            if s.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

fn hangup() -> Hangup {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(sig) => Hangup { sig: Some(sig) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP");
                Hangup { sig: None }
            }
        }
    }
    #[cfg(not(unix))]
    Hangup {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[server]
listen = "127.0.0.1:8080"
[[upstreams]]
name = "u"
kind = "self_hosted"
base_url = "http://127.0.0.1:9/v1"
[[models]]
name = "m"
upstreams = ["u"]
[[tenants]]
name = "t"
limits = { tpm = 1000 }
"#;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("budgetgate.toml");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn applies_valid_rejects_invalid_and_skips_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), BASE);
        let current = ArcSwap::from_pointee(Policy::load(&path).unwrap());
        let v0 = current.load().version.clone();
        assert_eq!(
            reload(&current, &path, Trigger::Signal),
            ReloadOutcome::Unchanged {
                version: v0.clone()
            }
        );

        write(dir.path(), &BASE.replace("tpm = 1000", "tpm = 500"));
        let ReloadOutcome::Applied {
            old_version,
            new_version,
            restart_needed,
        } = reload(&current, &path, Trigger::FileChange)
        else {
            panic!("not applied")
        };
        assert_eq!(old_version, v0);
        assert_ne!(new_version, v0);
        assert!(restart_needed.is_empty());
        assert_eq!(current.load().tenants[0].limits.tpm, Some(500));

        write(
            dir.path(),
            &BASE
                .replace("tpm = 1000", "tpm = -1")
                .replace("upstreams = [\"u\"]", "upstreams = [\"nope\"]"),
        );
        let ReloadOutcome::Rejected {
            kept_version,
            errors,
        } = reload(&current, &path, Trigger::Signal)
        else {
            panic!("not rejected")
        };
        assert_eq!(kept_version, new_version);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors
            .iter()
            .any(|e| e.starts_with("tenants[0].limits.tpm:")));
        assert!(errors
            .iter()
            .any(|e| e.starts_with("models[0].upstreams[0]:")));
        assert_eq!(current.load().version, new_version);
    }

    #[test]
    fn restart_only_settings_keep_their_running_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), BASE);
        let current = ArcSwap::from_pointee(Policy::load(&path).unwrap());
        write(
            dir.path(),
            &BASE
                .replace("127.0.0.1:8080", "127.0.0.1:9090")
                .replace("tpm = 1000", "tpm = 10")
                .replace(
                    "[server]",
                    "[store]\nkey_prefix = \"other\"\n[server]\nadmin_token_env = \"X_TOKEN\"",
                ),
        );
        let ReloadOutcome::Applied { restart_needed, .. } =
            reload(&current, &path, Trigger::Signal)
        else {
            panic!("not applied")
        };
        assert_eq!(
            restart_needed,
            vec!["server.listen", "server.admin_token_env", "store"]
        );
        let p = current.load();
        assert_eq!(p.server.listen.port(), 8080);
        assert_eq!(p.server.admin_token_env, "BUDGETGATE_ADMIN_TOKEN");
        assert_eq!(p.store.key_prefix, "budgetgate");
        assert_eq!(p.tenants[0].limits.tpm, Some(10));
    }

    fn event(paths: &[&str]) -> notify::Event {
        let mut ev = notify::Event::new(EventKind::Any);
        for p in paths {
            ev = ev.add_path(PathBuf::from(p));
        }
        ev
    }

    #[test]
    fn only_events_for_the_watched_names_count() {
        let names = watched_names(Path::new("/etc/bg/budgetgate.toml"));
        assert!(concerns(&event(&["/etc/bg/budgetgate.toml"]), &names));
        // Rename-on-save: the temporary file renamed over the config.
        assert!(concerns(
            &event(&["/etc/bg/budgetgate.toml.tmp", "/etc/bg/budgetgate.toml"]),
            &names
        ));
        assert!(!concerns(&event(&["/etc/bg/budgetgate.toml.tmp"]), &names));
        assert!(!concerns(&event(&["/etc/bg/gateway.log"]), &names));
        assert!(!concerns(&event(&["/etc/bg/memory-store.json"]), &names));
        // A rescan request names nothing and may hide a change.
        assert!(concerns(&event(&[]), &names));
    }

    #[test]
    fn a_configmap_link_swap_counts() {
        // The layout of a Kubernetes ConfigMap volume.
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("..2024_01");
        std::fs::create_dir(&v1).unwrap();
        write(&v1, BASE);
        std::os::unix::fs::symlink("..2024_01", dir.path().join("..data")).unwrap();
        let path = dir.path().join("budgetgate.toml");
        std::os::unix::fs::symlink("..data/budgetgate.toml", &path).unwrap();
        let names = watched_names(&path);
        let d = dir.path().display();
        assert!(concerns(&event(&[&format!("{d}/..data")]), &names));
        assert!(!concerns(&event(&[&format!("{d}/..2024_02")]), &names));
    }

    #[test]
    fn watch_dir_of_bare_name_is_cwd() {
        assert_eq!(watch_dir(Path::new("a.toml")), PathBuf::from("."));
        assert_eq!(watch_dir(Path::new("/etc/a.toml")), PathBuf::from("/etc"));
    }
}
