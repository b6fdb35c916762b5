//! Lease renewal for every live reservation from one background task.
//!
//! A reservation's concurrency slots are slot leases (DESIGN section 2): they
//! expire unless renewed, so a crashed gateway frees them. Renewing from a
//! task per request cost a task spawn, a timer and a cross-thread wake-up
//! on every request, although most requests end long before their first
//! renewal is due (callgrind profile). Instead each live reservation is an
//! entry in one map; a single keeper task sleeps until the earliest entry
//! is due (at `slot_lease / 3` after admission or after its last renewal),
//! renews what is due, and sleeps again. Registering and removing an entry
//! is a mutex-protected map insert and remove.
//!
//! The map is also the gateway's list of its own requests in flight: each
//! entry names the concurrency budgets its reservation takes a slot of in
//! the store ([`SlotRenewer::slots_taken`]), which the fail-open limiter
//! counts when the store stops answering ([`super::fail_open`]).

use foldhash::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::budget::BudgetStore;

/// Shortest renewal period, whatever the slot lease (protects the store from a
/// misconfigured tiny slot lease).
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// Renews the slot leases of registered reservations. Cheap to clone.
#[derive(Clone, Default)]
pub struct SlotRenewer {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Arc<Mutex<State>>,
    /// Wakes the keeper task when an entry is due before its planned wake-up.
    wake: Arc<Notify>,
    /// The keeper task; started again on the caller's runtime if the
    /// runtime it ran on has ended (a serving thread that stopped first).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    next_handle: AtomicU64,
}

#[derive(Default)]
struct State {
    /// By handle number (foldhash: a SipHash of the number on every
    /// register and drop cost more than the map itself).
    entries: HashMap<u64, Entry>,
    /// When the keeper task will next look (None: it waits for a wake-up).
    planned: Option<Instant>,
}

struct Entry {
    id: String,
    store: Arc<dyn BudgetStore>,
    every: Duration,
    due: Instant,
    /// The concurrency budgets whose slot the reservation takes in the
    /// store (none for one of the fail-open limiter, which counts its own).
    slots: Vec<Arc<str>>,
}

/// A registration: renewals stop when it is dropped (with the reservation
/// that holds it), so no exit path can leave a slot lease renewed forever.
pub struct RenewalHandle {
    key: u64,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for RenewalHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RenewalHandle").field(&self.key).finish()
    }
}

impl Drop for RenewalHandle {
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

impl SlotRenewer {
    /// Renews reservation `id` in `store` every `slot_lease / 3` (at least every
    /// 10 ms) until the handle is dropped; `slots`: the concurrency budgets
    /// whose slot it takes in the store. Must be called inside a tokio
    /// runtime (the keeper task starts on first use).
    pub fn register(
        &self,
        id: &str,
        store: Arc<dyn BudgetStore>,
        slot_lease: Duration,
        slots: Vec<Arc<str>>,
    ) -> RenewalHandle {
        let every = (slot_lease / 3).max(MIN_PERIOD);
        let due = Instant::now() + every;
        let handle = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        let wake = {
            let mut st = lock(&self.shared.state);
            st.entries.insert(
                handle,
                Entry {
                    id: id.to_string(),
                    store,
                    every,
                    due,
                    slots,
                },
            );
            if st.planned.is_none_or(|p| due < p) {
                st.planned = Some(due);
                true
            } else {
                false
            }
        };
        let mut task = self.shared.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            *task = Some(tokio::spawn(run(
                Arc::downgrade(&self.shared.state),
                self.shared.wake.clone(),
            )));
        } else if wake {
            self.shared.wake.notify_one();
        }
        RenewalHandle {
            key: handle,
            state: self.shared.state.clone(),
        }
    }

    /// Reservations currently renewed.
    pub fn live(&self) -> usize {
        lock(&self.shared.state).entries.len()
    }

    /// How many live reservations take a slot of each of `keys` in the
    /// store. One pass over the live reservations: asked only while the
    /// store fails, never on an admission's path.
    pub fn slots_taken(&self, keys: &[&str]) -> Vec<u64> {
        let mut taken = vec![0; keys.len()];
        for e in lock(&self.shared.state).entries.values() {
            for slot in &e.slots {
                if let Some(i) = keys.iter().position(|k| **k == **slot) {
                    taken[i] += 1;
                }
            }
        }
        taken
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // Entries are independent; a panic mid-update cannot corrupt another one.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The keeper task: renews what is due, then sleeps until the next due
/// entry or a wake-up; ends when the keeper itself is gone.
async fn run(state: Weak<Mutex<State>>, wake: Arc<Notify>) {
    loop {
        let Some(shared) = state.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut st = lock(&shared);
            let mut next: Option<Instant> = None;
            for e in st.entries.values_mut() {
                if e.due <= now {
                    due.push((e.id.clone(), e.store.clone()));
                    e.due = now + e.every;
                }
                next = Some(next.map_or(e.due, |n| n.min(e.due)));
            }
            st.planned = next;
            next
        };
        drop(shared);
        let mut renewals: FuturesUnordered<_> = due
            .into_iter()
            .map(|(id, store)| async move {
                if let Err(e) = store.renew(&id).await {
                    tracing::warn!(reservation_id = %id, error = %e, "slot lease renewal failed");
                }
            })
            .collect();
        while renewals.next().await.is_some() {}
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::memory::MemoryStore;
    use crate::budget::{
        BudgetSpec, BudgetState, ExtendOutcome, RenewOutcome, ReserveOutcome, ReserveRequest,
        SettleOutcome, Settlement, Step, StoreError,
    };
    use crate::clock::ManualClock;
    use std::sync::atomic::AtomicUsize;

    /// Counts renewals; everything else is a memory store.
    struct Counting {
        inner: MemoryStore,
        renewals: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl BudgetStore for Counting {
        async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
            self.inner.reserve(r).await
        }
        async fn extend(&self, id: &str, t: &Step) -> Result<ExtendOutcome, StoreError> {
            self.inner.extend(id, t).await
        }
        async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
            self.renewals.fetch_add(1, Ordering::SeqCst);
            self.inner.renew(id).await
        }
        async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
            self.inner.settle(id, s).await
        }
        async fn void(&self, id: &str, ttl: u64) -> Result<SettleOutcome, StoreError> {
            self.inner.void(id, ttl).await
        }
        async fn inspect(&self, s: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
            self.inner.inspect(s).await
        }
        async fn lower(&self, s: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
            self.inner.lower(s, at_most).await
        }
    }

    fn counting() -> Arc<Counting> {
        Arc::new(Counting {
            inner: MemoryStore::new(Arc::new(ManualClock::new(0))),
            renewals: AtomicUsize::new(0),
        })
    }

    // Paused tokio time: the keeper's sleeps advance instantly and exactly.
    #[tokio::test(start_paused = true)]
    async fn renews_every_third_of_the_slot_lease_until_released() {
        let keeper = SlotRenewer::default();
        let store = counting();
        let h = keeper.register("r1", store.clone(), Duration::from_secs(3), Vec::new());
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert_eq!(store.renewals.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(store.renewals.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(store.renewals.load(Ordering::SeqCst), 3);
        drop(h);
        assert_eq!(keeper.live(), 0);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(store.renewals.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_slot_lease_registered_later_wakes_the_keeper_early() {
        let keeper = SlotRenewer::default();
        let slow = counting();
        let fast = counting();
        let _a = keeper.register("slow", slow.clone(), Duration::from_secs(60), Vec::new());
        tokio::time::sleep(Duration::from_millis(10)).await;
        let _b = keeper.register("fast", fast.clone(), Duration::from_millis(300), Vec::new());
        tokio::time::sleep(Duration::from_millis(105)).await;
        assert_eq!(fast.renewals.load(Ordering::SeqCst), 1);
        assert_eq!(slow.renewals.load(Ordering::SeqCst), 0);
        assert_eq!(keeper.live(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_task_ends_with_its_keeper() {
        let keeper = SlotRenewer::default();
        let store = counting();
        let h = keeper.register("r", store, Duration::from_secs(3), Vec::new());
        tokio::task::yield_now().await;
        let wake = keeper.shared.wake.clone();
        assert_eq!(Arc::strong_count(&wake), 3, "keeper, task and this test");
        drop(h);
        drop(keeper);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(Arc::strong_count(&wake), 1, "the keeper task ended");
    }
}
