//! Wait queues: when a reservation is refused "not now" and the
//! request may wait, it waits in this gateway's queue instead of getting a
//! 429, and is admitted the moment a retry of its reservation succeeds.
//!
//! - The priority classes, budget kinds and `[queue]` settings are
//!   [`crate::config::queue`]'s (config owns every settings type).
//! - [`line`]: one budget's line of waiters and who gets the next turn
//!   (strict priority, starvation guard, weighted fair sharing by
//!   estimated cost, FIFO within a tenant). Pure: no clock, no I/O.
//! - [`waiter`]: a request's place in a line ([`waiter::Ticket`]): waits for
//!   its turn, its deadline or the shutdown; leaving is by drop.
//! - [`metrics`]: depth, waits, admissions after waiting, timeouts, refusals.
//! - [`settlement`]: the settlement observer that wakes the lines of the
//!   budgets a settlement returned capacity to.
//!
//! The queue sits above the store: it never holds a reservation and never
//! calls the store itself; a waiter whose turn comes reserves through the
//! same admit phase as any request. Turns come from the store's answers (a
//! refusal's retry time) and from settlements that return capacity to a
//! waited-for budget ([`Queue::capacity_returned`]), never from polling.

pub mod line;
pub mod metrics;
pub mod settlement;
pub mod waiter;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::config::queue::{Class, QueuePolicy};
use line::{Entry, Line, Wakes};

/// Why a request could not join the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `max_queued` requests wait already.
    Length,
    /// Their bytes would pass `max_queued_bytes`.
    Bytes,
}

/// This gateway's waiting requests, one line per waited-for budget (by its
/// store key). Shared by every serving thread.
pub struct Queue {
    inner: Mutex<Inner>,
    /// Waiters in all lines: the request path looks at nothing else while
    /// it is zero.
    waiting: AtomicUsize,
    next_id: AtomicU64,
    closed: watch::Sender<bool>,
}

#[derive(Default)]
struct Inner {
    lines: HashMap<Arc<str>, Line>,
    bytes: usize,
    depth: [usize; 3],
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            inner: Mutex::default(),
            waiting: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            closed: watch::Sender::new(false),
        }
    }
}

/// What a request brings to a line.
pub struct Joining {
    /// Its class.
    pub class: Class,
    /// Its tenant.
    pub tenant: Arc<str>,
    /// Its weight.
    pub weight: u64,
    /// Its estimated cost on the line's budget.
    pub cost: u64,
    /// Bytes it keeps while waiting (body and overhead).
    pub bytes: usize,
    /// This line's budget refused it just now with this wait.
    pub refused: Option<std::time::Duration>,
    /// That refusal held its tenant back for share (`budget::share`).
    pub held_for_share: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when someone waits in any line (one atomic load).
    pub fn is_busy(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Requests waiting, per class.
    pub fn depth(&self) -> [usize; 3] {
        self.lock().depth
    }

    /// When the line of `key` expects its budget to fit its head (the
    /// latest refusal's retry time), if it has one.
    pub fn line_retry(&self, key: &str) -> Option<std::time::Duration> {
        let now = Instant::now();
        self.lock().lines.get(key).and_then(|l| l.retry_after(now))
    }

    /// The first of `keys` whose line has waiters.
    pub fn busy_line<'k>(
        &self,
        mut keys: impl Iterator<Item = &'k Arc<str>>,
    ) -> Option<&'k Arc<str>> {
        let inner = self.lock();
        keys.find(|k| inner.lines.get(&***k).is_some_and(|l| !l.is_empty()))
    }

    /// Adds a waiter to the line of `key`, within `policy`'s bounds.
    pub fn join(
        self: &Arc<Self>,
        key: Arc<str>,
        j: Joining,
        policy: &QueuePolicy,
    ) -> Result<waiter::Ticket, Full> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let now = Instant::now();
        let wakes = {
            let mut inner = self.lock();
            let total: usize = inner.depth.iter().sum();
            if total >= policy.max_queued {
                return Err(Full::Length);
            }
            if inner.bytes + j.bytes > policy.max_queued_bytes {
                return Err(Full::Bytes);
            }
            inner.bytes += j.bytes;
            inner.depth[j.class.index()] += 1;
            let starve = policy.class(Class::Batch).max_starve;
            let line = inner
                .lines
                .entry(key.clone())
                .or_insert_with(|| Line::new(starve));
            line.join(
                id,
                Entry {
                    class: j.class,
                    tenant: j.tenant,
                    weight: j.weight,
                    cost: j.cost,
                    joined: now,
                    tried: j.refused.is_some(),
                    wake: wake.clone(),
                },
                j.refused,
                j.held_for_share,
                now,
            )
        };
        self.waiting.fetch_add(1, Ordering::Relaxed);
        metrics::depth(j.class, 1.0);
        notify(wakes);
        Ok(waiter::Ticket::new(
            self.clone(),
            key,
            id,
            j.class,
            j.bytes,
            wake,
        ))
    }

    /// Runs `f` on the line of `key` and wakes whom it returns.
    fn on_line(&self, key: &str, f: impl FnOnce(&mut Line) -> Wakes) {
        let wakes = {
            let mut inner = self.lock();
            match inner.lines.get_mut(key) {
                Some(line) => f(line),
                None => Vec::new(),
            }
        };
        notify(wakes);
    }

    /// A waiter leaves its line for good (admitted, refused, gone).
    fn remove(
        &self,
        key: &str,
        class: Class,
        bytes: usize,
        f: impl FnOnce(&mut Line, Instant) -> Wakes,
    ) {
        let wakes = {
            let mut inner = self.lock();
            inner.bytes = inner.bytes.saturating_sub(bytes);
            inner.depth[class.index()] = inner.depth[class.index()].saturating_sub(1);
            let wakes = match inner.lines.get_mut(key) {
                Some(line) => {
                    let wakes = f(line, Instant::now());
                    if line.is_empty() {
                        inner.lines.remove(key);
                    }
                    wakes
                }
                None => Vec::new(),
            };
            wakes
        };
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        metrics::depth(class, -1.0);
        notify(wakes);
    }

    /// A settlement returned capacity to the budgets stored under `keys`:
    /// the lines waiting for them try again now. Free while no one waits.
    pub fn capacity_returned<'k>(&self, keys: impl Iterator<Item = &'k str>) {
        self.capacity_returned_each(|key| keys.for_each(key));
    }

    /// [`Queue::capacity_returned`] with the keys given one by one by
    /// `keys` to the function it is called with.
    pub fn capacity_returned_each(&self, keys: impl FnOnce(&mut dyn FnMut(&str))) {
        if !self.is_busy() {
            return;
        }
        let now = Instant::now();
        let mut wakes: Wakes = Vec::new();
        {
            let mut inner = self.lock();
            keys(&mut |k| {
                if let Some(line) = inner.lines.get_mut(k) {
                    wakes.extend(line.capacity_returned(now));
                }
            });
        }
        notify(wakes);
    }

    /// Shutdown: every waiter is answered 503 (and no one joins any more).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// True once [`Queue::close`] was called.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

fn notify(wakes: Wakes) {
    for w in wakes {
        w.notify_one();
    }
}
