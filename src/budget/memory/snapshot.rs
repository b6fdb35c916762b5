//! The embedded store's persistence: its state written to one file every
//! [`INTERVAL`] and at shutdown, read back at start, so a restart keeps
//! quotas, bucket levels (debt included) and live leases.
//!
//! - What is kept: quota counters, bucket states and concurrency leases. A
//!   live hold's debits are in those counters and levels, and its slot in
//!   the leases: restored, it is charged in full (the process that would
//!   have settled it is gone) and its slot frees when its lease expires,
//!   exactly as after a gateway crash with Redis. Settled holds (tombstones)
//!   are not kept: they only answer retries of the process that made them.
//! - What a crash can lose: what changed since the last write, at most one
//!   interval of usage (SIGKILL, power loss). A graceful shutdown (SIGTERM)
//!   writes after the last settlement and loses nothing.
//! - Atomic: written to a temporary file beside the target, fsynced, renamed
//!   over it, then the directory fsynced; a reader sees the old file or the
//!   new one, never a torn one.
//! - One process per file: a lock file (`<path>.lock`, `flock`) held for the
//!   process's life refuses a second gateway on the same path, which would
//!   otherwise overwrite the first one's state every second.
//! - A failed write is logged and counted
//!   (`budgetgate_store_snapshot_failures_total`); the store keeps serving.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::state::{Inner, QuotaState};
use crate::budget::bucket::BucketState;

/// How often the state is written.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Format version of the file.
const FORMAT: u32 = 1;

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Snapshot {
    format: u32,
    /// Store time of the snapshot, UTC µs.
    taken_micros: u64,
    /// `(key, level units, last µs, per_minute, burst)`.
    buckets: Vec<(String, i64, u64, u64, u64)>,
    /// `(key, window id, used)`.
    quotas: Vec<(String, u64, u64)>,
    /// `(key, [(reservation id, lease end µs)])`.
    slots: Vec<(String, Vec<(String, u64)>)>,
    /// `(key, window, [(sub-bucket id, amount)])` of rolling quotas
    /// (absent from files written before they existed).
    #[serde(default)]
    rolling: Vec<RollingEntry>,
}

/// `(key, window, [(sub-bucket id, amount)])` of one rolling quota.
type RollingEntry = (String, crate::budget::Window, Vec<(u64, u64)>);

impl Snapshot {
    fn of(inner: &Inner, now: u64) -> Self {
        Snapshot {
            format: FORMAT,
            taken_micros: now,
            buckets: inner
                .buckets
                .iter()
                .map(|(k, b)| (k.clone(), b.level, b.last_micros, b.per_minute, b.burst))
                .collect(),
            quotas: inner
                .quotas
                .iter()
                .map(|(k, q)| (k.clone(), q.window, q.used))
                .collect(),
            slots: inner
                .slots
                .iter()
                .map(|(k, set)| {
                    let live = set
                        .iter()
                        .filter(|(_, lease)| **lease > now)
                        .map(|(id, lease)| (id.clone(), *lease))
                        .collect();
                    (k.clone(), live)
                })
                .filter(|(_, live): &(String, Vec<(String, u64)>)| !live.is_empty())
                .collect(),
            rolling: inner
                .rolling
                .iter()
                .map(|(k, (w, r))| (k.clone(), *w, r.parts()))
                .collect(),
        }
    }

    fn restore(self, inner: &mut Inner) {
        for (key, level, last_micros, per_minute, burst) in self.buckets {
            let b = BucketState {
                level,
                last_micros,
                per_minute,
                burst,
            };
            inner.buckets.insert(key, b);
        }
        // The file does not say whether a counter is daily, monthly or
        // counts from a first use (at most a week): it is kept at least to
        // the end of the snapshot's month and a week past the snapshot
        // (never swept while its window may still be current).
        let end = crate::budget::Window::Month
            .end(self.taken_micros)
            .max(self.taken_micros + crate::budget::Window::Week.seconds() * 1_000_000);
        for (key, window, used) in self.quotas {
            inner.quotas.insert(key, QuotaState { window, used, end });
        }
        for (key, window, subs) in self.rolling {
            let r = crate::budget::rolling::Rolling::from_parts(subs);
            inner.rolling.insert(key, (window, r));
        }
        for (key, leases) in self.slots {
            inner.slots.insert(key, leases.into_iter().collect());
        }
    }
}

/// Where the snapshot goes when `store.snapshot_path` is not set:
/// `memory-store.json` in the gateway's state directory
/// ([`crate::db::state_dir`]).
pub fn default_path() -> PathBuf {
    crate::db::state_dir().join("memory-store.json")
}

/// Writes the store's state to its file every [`INTERVAL`] on a thread of
/// its own, and once more when asked ([`Snapshotter::write_now`]).
pub struct Snapshotter {
    path: PathBuf,
    /// Held open for the process's life: the `flock` is released with it.
    _lock: File,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn crate::clock::Clock>,
    /// One write at a time (the thread's and a final one may meet).
    writing: Mutex<()>,
}

impl Snapshotter {
    /// Takes the lock of `path`, restores its state into `inner` (an
    /// absent file is an empty store) and starts the writer thread.
    pub(super) fn start(
        path: &Path,
        inner: Arc<Mutex<Inner>>,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Result<Arc<Self>, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!("store.snapshot_path: cannot create {}: {e}", dir.display())
            })?;
        }
        let lock = lock(path)?;
        match std::fs::read(path) {
            Ok(bytes) => {
                let snap: Snapshot = serde_json::from_slice(&bytes).map_err(|e| {
                    format!(
                        "store.snapshot_path {}: unreadable snapshot ({e}); move it away to start empty",
                        path.display()
                    )
                })?;
                if snap.format != FORMAT {
                    return Err(format!(
                        "store.snapshot_path {}: snapshot format {} (this version reads {FORMAT})",
                        path.display(),
                        snap.format
                    ));
                }
                let (buckets, quotas) = (snap.buckets.len(), snap.quotas.len());
                snap.restore(&mut inner.lock().unwrap_or_else(|e| e.into_inner()));
                tracing::info!(path = %path.display(), buckets, quotas, "memory store restored from its snapshot");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), "no memory store snapshot yet: starting empty");
            }
            Err(e) => {
                return Err(format!(
                    "store.snapshot_path {}: cannot read: {e}",
                    path.display()
                ))
            }
        }
        let s = Arc::new(Self {
            path: path.to_path_buf(),
            _lock: lock,
            stop: Arc::new((Mutex::new(false), Condvar::new())),
            thread: Mutex::new(None),
            inner,
            clock,
            writing: Mutex::new(()),
        });
        let worker = s.clone();
        let handle = std::thread::Builder::new()
            .name("budgetgate-snapshot".into())
            .spawn(move || worker.run())
            .map_err(|e| format!("cannot start the snapshot thread: {e}"))?;
        *s.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(s)
    }

    fn run(&self) {
        let (stopped, wake) = &*self.stop;
        let mut stop = stopped.lock().unwrap_or_else(|e| e.into_inner());
        while !*stop {
            let (s, _) = wake
                .wait_timeout(stop, INTERVAL)
                .unwrap_or_else(|e| e.into_inner());
            stop = s;
            if *stop {
                break;
            }
            drop(stop);
            self.write_now();
            stop = stopped.lock().unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Writes the state now (logged and counted when it fails).
    pub fn write_now(&self) -> bool {
        let _one = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock.now_micros();
        let snap = {
            let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            Snapshot::of(&inner, now)
        };
        match write_atomically(&self.path, &snap) {
            Ok(()) => {
                crate::budget::metrics::store_snapshot(true);
                true
            }
            Err(e) => {
                crate::budget::metrics::store_snapshot(false);
                tracing::warn!(path = %self.path.display(), error = %e, "memory store snapshot failed; the store keeps serving, a restart would lose what changed since the last snapshot");
                false
            }
        }
    }

    /// Stops the thread and writes a last time (at shutdown, after the
    /// last settlement).
    pub fn finish(&self) -> bool {
        {
            let (stopped, wake) = &*self.stop;
            *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
            wake.notify_all();
        }
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        let ok = self.write_now();
        if ok {
            tracing::info!(path = %self.path.display(), "memory store snapshot written at shutdown");
        }
        ok
    }
}

/// Takes `<path>.lock` exclusively, or says which process has it.
fn lock(path: &Path) -> Result<File, String> {
    use std::os::fd::AsRawFd;
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| {
            format!(
                "store.snapshot_path: cannot open {}: {e}",
                lock_path.display()
            )
        })?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(format!(
            "store.snapshot_path {} is in use by another budgetgate process (lock {} held): \
             give each gateway its own snapshot_path",
            path.display(),
            lock_path.display()
        ));
    }
    Ok(file)
}

/// Temporary file beside `path`, fsync, rename over `path`, fsync the directory.
fn write_atomically(path: &Path, snap: &Snapshot) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(snap).map_err(std::io::Error::other)?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn state_round_trips_and_a_second_process_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/memory-store.json");
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(ManualClock::new(1_000));
        let inner = Arc::new(Mutex::new(Inner::default()));
        {
            let mut i = inner.lock().unwrap();
            i.buckets.insert("b".into(), BucketState::full(60, 60, 0));
            i.quotas.insert(
                "q".into(),
                QuotaState {
                    window: 7,
                    used: 126_000,
                    end: 0,
                },
            );
            i.slots.insert(
                "s".into(),
                [("live".to_string(), 5_000), ("gone".to_string(), 10)]
                    .into_iter()
                    .collect(),
            );
        }
        let s = Snapshotter::start(&path, inner, clock.clone()).unwrap();
        let err = Snapshotter::start(&path, Arc::default(), clock.clone())
            .err()
            .expect("second process refused");
        assert!(
            err.contains("in use by another budgetgate process"),
            "{err}"
        );
        assert!(s.finish());
        drop(s);

        let restored = Arc::new(Mutex::new(Inner::default()));
        let _s = Snapshotter::start(&path, restored.clone(), clock).unwrap();
        let i = restored.lock().unwrap();
        assert_eq!(i.quotas["q"].used, 126_000);
        assert_eq!(i.buckets["b"], BucketState::full(60, 60, 0));
        assert_eq!(i.slots["s"].len(), 1, "expired leases are not kept");
    }

    #[test]
    fn an_unwritable_path_fails_the_write_and_keeps_serving() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory-store.json");
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(ManualClock::new(1_000));
        let s = Snapshotter::start(&path, Arc::default(), clock).unwrap();
        // A directory where the temporary file should go: the write fails.
        std::fs::create_dir(dir.path().join("memory-store.json.tmp")).unwrap();
        assert!(!s.write_now());
        std::fs::remove_dir(dir.path().join("memory-store.json.tmp")).unwrap();
        assert!(s.write_now());
    }
}
