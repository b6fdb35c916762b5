//! Time limits and the shutdown cutoff of streams whose body is not polled.
//!
//! A stream relay looks at its deadline and at the shutdown cutoff when
//! its body is polled, and the connection polls the body only when the
//! socket takes bytes: a client that stops reading (a full receive
//! window) would hold its reservation and its concurrency slot for as long
//! as it likes. Every live stream is therefore also an entry in one map;
//! a single keeper task sleeps until the earliest deadline (plus
//! [`SLACK`], so that a stream being polled cuts itself off first, exactly
//! on time), cuts off and settles every stream whose deadline passed, and
//! at the shutdown cutoff every stream left. As for the slot renewals
//! ([`super::slot_renewal`]), one task and a map beat a task or a timer
//! per stream: registering and removing an entry is a mutex-protected map
//! insert and remove, and the keeper wakes at most once per [`SLACK`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How late after its deadline the keeper cuts a stream off; the keeper's
/// wake-ups are at least this far apart.
pub const SLACK: Duration = Duration::from_millis(250);

/// Why the keeper cut a stream off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutReason {
    /// The request's time limit passed.
    Deadline,
    /// The shutdown grace period is over.
    Shutdown,
}

/// A stream the keeper can end: queues its closing frames, settles what it
/// delivered, and frees its reservation. Must do nothing if it ended already.
pub trait Cut: Send + Sync {
    fn cut(&self, why: CutReason);
}

/// The registry of live streams and its keeper task. Cheap to clone.
#[derive(Clone)]
pub struct StreamCutoffs {
    shared: Arc<Shared>,
}

struct Shared {
    state: Arc<Mutex<State>>,
    /// Wakes the keeper task when an entry is due before its planned wake-up.
    wake: Arc<Notify>,
    /// Becomes true at the shutdown cutoff.
    shutdown: watch::Receiver<bool>,
    /// The keeper task; started again on the caller's runtime if the
    /// runtime it ran on has ended.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    next_key: AtomicU64,
}

#[derive(Default)]
struct State {
    entries: foldhash::HashMap<u64, Entry>,
    /// When the keeper task will next look (None: it waits for a wake-up).
    planned: Option<Instant>,
}

struct Entry {
    deadline: Option<Instant>,
    stream: Weak<dyn Cut>,
}

/// A registration, removed when dropped (with the stream's body).
pub struct CutoffHandle {
    key: u64,
    state: Arc<Mutex<State>>,
}

impl Drop for CutoffHandle {
    fn drop(&mut self) {
        lock(&self.state).entries.remove(&self.key);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Lets an idle keeper task notice that nobody can register any more.
        self.wake.notify_one();
    }
}

impl StreamCutoffs {
    /// A registry whose streams are all cut off once `shutdown` turns true.
    pub fn new(shutdown: watch::Receiver<bool>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Arc::default(),
                wake: Arc::default(),
                shutdown,
                task: Mutex::new(None),
                next_key: AtomicU64::new(0),
            }),
        }
    }

    /// Watches `stream` until the handle is dropped: cut off at
    /// `deadline` (+ [`SLACK`]) and at the shutdown cutoff. Must be called
    /// inside a tokio runtime (the keeper task starts on first use).
    pub fn register(&self, deadline: Option<Instant>, stream: Weak<dyn Cut>) -> CutoffHandle {
        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        let wake = {
            let mut st = lock(&self.shared.state);
            st.entries.insert(key, Entry { deadline, stream });
            let at = deadline.map(|d| d + SLACK);
            match at {
                Some(at) if st.planned.is_none_or(|p| at < p) => {
                    st.planned = Some(at);
                    true
                }
                _ => false,
            }
        };
        // Past the shutdown cutoff a new stream is cut at once.
        let wake = wake || *self.shared.shutdown.borrow();
        let mut task = self.shared.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            *task = Some(tokio::spawn(run(
                Arc::downgrade(&self.shared.state),
                self.shared.wake.clone(),
                self.shared.shutdown.clone(),
            )));
        } else if wake {
            self.shared.wake.notify_one();
        }
        CutoffHandle {
            key,
            state: self.shared.state.clone(),
        }
    }

    /// Streams registered.
    pub fn live(&self) -> usize {
        lock(&self.shared.state).entries.len()
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // Entries are independent; a panic mid-update cannot corrupt another one.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The keeper task: cuts off what is due, then sleeps until the next
/// deadline (+ [`SLACK`]), a wake-up or the shutdown cutoff; ends when the
/// registry itself is gone.
async fn run(state: Weak<Mutex<State>>, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let Some(shared) = state.upgrade() else {
            return;
        };
        let now = Instant::now();
        let all = *shutdown.borrow_and_update();
        let why = if all {
            CutReason::Shutdown
        } else {
            CutReason::Deadline
        };
        let mut due = Vec::new();
        let next = {
            let mut st = lock(&shared);
            let mut next: Option<Instant> = None;
            st.entries.retain(|_, e| {
                if all || e.deadline.is_some_and(|d| d + SLACK <= now) {
                    due.push(e.stream.clone());
                    return false;
                }
                if let Some(d) = e.deadline {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
                true
            });
            let next = next.map(|d| (d + SLACK).max(now + SLACK));
            st.planned = next;
            next
        };
        drop(shared);
        // Outside the registry's lock: a cut locks its stream, whose body
        // may be dropping (and removing its entry) right now.
        for stream in due {
            if let Some(stream) = stream.upgrade() {
                stream.cut(why);
            }
        }
        let shutdown_seen = all;
        tokio::select! {
            _ = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
            _ = wake.notified() => {}
            // Once the cutoff is seen, every wake-up cuts what registered since.
            r = shutdown.changed(), if !shutdown_seen => {
                if r.is_err() {
                    // The tracker is gone: nothing more will be cut off at shutdown.
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the reason it was cut for.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<(CutReason, Instant)>>);

    impl Cut for Recorded {
        fn cut(&self, why: CutReason) {
            self.0.lock().unwrap().push((why, Instant::now()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn streams_are_cut_at_their_deadline_and_the_rest_at_shutdown() {
        let (tx, rx) = watch::channel(false);
        let cutoffs = StreamCutoffs::new(rx);
        let start = Instant::now();
        let (early, late, open, gone) = (
            Arc::new(Recorded::default()),
            Arc::new(Recorded::default()),
            Arc::new(Recorded::default()),
            Arc::new(Recorded::default()),
        );
        let weak = |s: &Arc<Recorded>| Arc::downgrade(s) as Weak<dyn Cut>;
        let _a = cutoffs.register(Some(start + Duration::from_secs(5)), weak(&late));
        let _b = cutoffs.register(Some(start + Duration::from_secs(2)), weak(&early));
        let _c = cutoffs.register(None, weak(&open));
        let d = cutoffs.register(Some(start + Duration::from_secs(1)), weak(&gone));
        drop(d);
        assert_eq!(cutoffs.live(), 3);

        tokio::time::sleep(Duration::from_secs(3)).await;
        let cut = early.0.lock().unwrap().clone();
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0].0, CutReason::Deadline);
        assert_eq!(cut[0].1 - start, Duration::from_secs(2) + SLACK);
        assert!(late.0.lock().unwrap().is_empty());
        assert!(
            gone.0.lock().unwrap().is_empty(),
            "a removed stream is never cut"
        );

        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(late.0.lock().unwrap().len(), 1);
        assert!(open.0.lock().unwrap().is_empty());
        assert_eq!(cutoffs.live(), 1);

        tx.send_replace(true);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(open.0.lock().unwrap()[0].0, CutReason::Shutdown);
        assert_eq!(cutoffs.live(), 0);
        // Registered after the cutoff: cut at the next look.
        let after = Arc::new(Recorded::default());
        let _e = cutoffs.register(None, weak(&after));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(after.0.lock().unwrap()[0].0, CutReason::Shutdown);
    }
}
