//! One budget's line of waiters: who gets the next turn at the store.
//!
//! Order: strict priority between classes, except that
//! a `batch` waiter older than `max_starve` gets one turn per `max_starve`
//! ahead of the others (the starvation guard); within a class, weighted
//! fair sharing between tenants by estimated cost with *virtual finish
//! times* (self-clocked fair queueing): a waiter of tenant `t` with cost
//! `c` and weight `w` gets the tag `F = max(V, F_last(t)) + c / w`, where
//! `V` is the tag of the class's last admitted waiter and `F_last(t)` the
//! tag of `t`'s previous waiter; the smallest tag goes first. A tenant's
//! tags grow by its cost over its weight, so under contention admitted
//! cost follows the weights; FIFO within a tenant follows from its tags
//! increasing; a tenant that was idle starts at `V` (no credit is saved
//! up). Chosen over deficit round robin because the pick is a stable
//! function of the waiters (a refused head stays the head until someone
//! better arrives) and needs no quantum tuned to request sizes.
//!
//! One waiter at a time holds the line's *turn*: it alone retries its
//! reservation, at once (it was never tried, or capacity came back) or at
//! the time the store's latest refusal named. A refusal that held the
//! waiter's tenant back for its fleet-wide share (`budget::share`: the
//! budget has capacity, owed to a tenant behind it) holds that tenant
//! until the retry time and gives the turn to the best waiter of another
//! tenant at once, so a line led by a tenant ahead still serves the others. Nothing here reads a clock
//! or does I/O: every event carries `now`, and the caller wakes the
//! waiters returned.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::queue::Class;

/// Tags are in cost × [`TAG_SCALE`] / weight, so small weights' remainders
/// are kept (u128: no sum of costs overflows).
const TAG_SCALE: u128 = 1_000_000;

/// A waiter as the line knows it.
pub struct Entry {
    /// Its class after the client's lowering.
    pub class: Class,
    /// Who it is for (fair sharing is between tenants).
    pub tenant: Arc<str>,
    /// Its weight (≥ 1).
    pub weight: u64,
    /// Estimated cost on this budget (tokens; 1 for request counts).
    pub cost: u64,
    /// When it joined this line.
    pub joined: Instant,
    /// It reserved at least once while in this line (or was refused by
    /// this budget just before joining).
    pub tried: bool,
    /// Woken when its turn changes.
    pub wake: Arc<Notify>,
}

struct Waiting {
    entry: Entry,
    tag: u128,
}

/// The waiter holding the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Turn {
    id: u64,
    /// `None`: now.
    at: Option<Instant>,
    /// Its reservation is in flight.
    running: bool,
    /// Granted by the starvation guard (not taken away by a better arrival).
    starved: bool,
}

/// What a waiter may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MyTurn {
    /// Not its turn: wait to be woken.
    No,
    /// Reserve now.
    Now,
    /// Its turn comes at this time.
    At(Instant),
}

/// The waiters to wake after an event (outside the lock).
pub type Wakes = Vec<Arc<Notify>>;

/// One budget's line.
pub struct Line {
    waiting: HashMap<u64, Waiting>,
    by_tag: [BTreeSet<(u128, u64)>; 3],
    /// `batch` waiters by age, for the starvation guard.
    batch_by_age: BTreeSet<(Instant, u64)>,
    /// Per class, the tag of the last admitted waiter.
    virtual_time: [u128; 3],
    /// Per (class, tenant): the last tag given and how many wait.
    tenants: HashMap<(Class, Arc<str>), (u128, usize)>,
    turn: Option<Turn>,
    /// When the store's latest refusal said the head would fit.
    retry_at: Option<Instant>,
    /// The wait the latest refusal in this line named.
    last_wait: Option<Duration>,
    /// Capacity came back while a turn's reservation was in flight.
    returned_while_running: bool,
    /// No starvation turn before this.
    next_starve: Option<Instant>,
    max_starve: Option<Duration>,
    /// Tenants the store deferred for their fleet-wide share, until when:
    /// their waiters let the others' try first meanwhile.
    held: HashMap<Arc<str>, Instant>,
}

impl Line {
    /// An empty line whose `batch` waiters get a turn after `max_starve`.
    pub fn new(max_starve: Option<Duration>) -> Self {
        Line {
            waiting: HashMap::new(),
            by_tag: Default::default(),
            batch_by_age: BTreeSet::new(),
            virtual_time: [0; 3],
            tenants: HashMap::new(),
            turn: None,
            retry_at: None,
            last_wait: None,
            returned_while_running: false,
            next_starve: None,
            max_starve,
            held: HashMap::new(),
        }
    }

    /// Waiters in the line.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// No one waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Adds waiter `id`; `refused`: this budget refused it just now and
    /// named this wait (the line's turn then waits for it too), or held its
    /// tenant back for share (`held_for_share`: only its tenant waits).
    pub fn join(
        &mut self,
        id: u64,
        entry: Entry,
        refused: Option<Duration>,
        held_for_share: bool,
        now: Instant,
    ) -> Wakes {
        let c = entry.class.index();
        let key = (entry.class, entry.tenant.clone());
        let last = self.tenants.get(&key).map_or(0, |t| t.0);
        let start = self.virtual_time[c].max(last);
        let tag =
            start + u128::from(entry.cost.max(1)) * TAG_SCALE / u128::from(entry.weight.max(1));
        let slot = self.tenants.entry(key).or_insert((0, 0));
        *slot = (tag, slot.1 + 1);
        self.by_tag[c].insert((tag, id));
        if entry.class == Class::Batch {
            self.batch_by_age.insert((entry.joined, id));
        }
        if refused.is_some() {
            self.last_wait = refused;
        }
        match refused {
            Some(wait) if held_for_share => {
                self.held.insert(entry.tenant.clone(), now + wait);
            }
            Some(wait) => self.retry_at = Some(now + wait),
            None => {}
        }
        self.waiting.insert(id, Waiting { entry, tag });
        self.reschedule(now)
    }

    /// How long until the line's head may fit (a `queue_full` answer's
    /// Retry-After): what is left of the latest refusal's retry time, else
    /// (the head tries now) the wait that refusal named.
    pub fn retry_after(&self, now: Instant) -> Option<Duration> {
        match self.retry_at {
            Some(at) if at > now => Some(at - now),
            _ => self.last_wait,
        }
    }

    /// What waiter `id` may do at `now`.
    pub fn my_turn(&self, id: u64) -> MyTurn {
        match self.turn {
            Some(t) if t.id == id && !t.running => match t.at {
                None => MyTurn::Now,
                Some(at) => MyTurn::At(at),
            },
            _ => MyTurn::No,
        }
    }

    /// Waiter `id` starts its reservation: true if it holds the turn and
    /// the turn's time has come.
    pub fn begin(&mut self, id: u64, now: Instant) -> bool {
        match &mut self.turn {
            Some(t) if t.id == id && !t.running && t.at.is_none_or(|at| at <= now) => {
                t.running = true;
                self.returned_while_running = false;
                true
            }
            _ => false,
        }
    }

    /// Waiter `id` was admitted: it leaves, and the next waiter tries at
    /// once (capacity may be left over).
    pub fn admitted(&mut self, id: u64, now: Instant) -> Wakes {
        if let Some(w) = self.remove(id) {
            let c = w.entry.class.index();
            self.virtual_time[c] = self.virtual_time[c].max(w.tag);
        }
        self.retry_at = None;
        self.reschedule(now)
    }

    /// This line's budget refused waiter `id`, and would fit its cost
    /// after `retry_after`.
    pub fn refused(&mut self, id: u64, retry_after: Duration, now: Instant) -> Wakes {
        if self.turn.is_some_and(|t| t.id == id) {
            self.turn = None;
        }
        if let Some(w) = self.waiting.get_mut(&id) {
            w.entry.tried = true;
        }
        self.last_wait = Some(retry_after);
        self.retry_at = Some(if self.returned_while_running {
            now
        } else {
            now + retry_after
        });
        self.returned_while_running = false;
        self.reschedule(now)
    }

    /// The store held waiter `id`'s tenant back for its fleet-wide share
    /// for `retry_after` (the budget has capacity, for a tenant behind it):
    /// the best waiter of another tenant tries now.
    pub fn defer_for_share(&mut self, id: u64, retry_after: Duration, now: Instant) -> Wakes {
        if self.turn.is_some_and(|t| t.id == id) {
            self.turn = None;
        }
        if let Some(w) = self.waiting.get_mut(&id) {
            w.entry.tried = true;
            self.held.insert(w.entry.tenant.clone(), now + retry_after);
        }
        self.last_wait = Some(retry_after);
        self.retry_at = None;
        self.returned_while_running = false;
        self.reschedule(now)
    }

    /// Waiter `id` leaves (admitted elsewhere, refused by another budget,
    /// timed out, gone). `fits_here`: this line's budget admitted it just
    /// now (another budget refused), so the next waiter tries at once.
    pub fn leave(&mut self, id: u64, fits_here: bool, now: Instant) -> Wakes {
        self.remove(id);
        if fits_here {
            self.retry_at = None;
        }
        self.reschedule(now)
    }

    /// A settlement returned capacity to this line's budget: the turn's
    /// holder tries now instead of at the refill time.
    pub fn capacity_returned(&mut self, now: Instant) -> Wakes {
        self.retry_at = None;
        match &mut self.turn {
            Some(t) if t.running => {
                self.returned_while_running = true;
                Vec::new()
            }
            Some(t) => {
                t.at = None;
                let id = t.id;
                self.wake(id)
            }
            None => self.reschedule(now),
        }
    }

    fn remove(&mut self, id: u64) -> Option<Waiting> {
        let w = self.waiting.remove(&id)?;
        let class = w.entry.class;
        self.by_tag[class.index()].remove(&(w.tag, id));
        if class == Class::Batch {
            self.batch_by_age.remove(&(w.entry.joined, id));
        }
        let key = (class, w.entry.tenant.clone());
        if let Some(slot) = self.tenants.get_mut(&key) {
            slot.1 -= 1;
            if slot.1 == 0 {
                self.tenants.remove(&key);
            }
        }
        if self.turn.is_some_and(|t| t.id == id) {
            self.turn = None;
        }
        Some(w)
    }

    /// The waiter that should hold the turn at `now`, and whether the
    /// starvation guard chose it.
    fn pick(&self, now: Instant) -> Option<(u64, bool)> {
        if let (Some(&(joined, id)), Some(starve)) = (self.batch_by_age.first(), self.max_starve) {
            let due = self.next_starve.is_none_or(|n| now >= n);
            let higher_waiting = self.by_tag[..Class::Batch.index()]
                .iter()
                .any(|s| !s.is_empty());
            if due && higher_waiting && now.saturating_duration_since(joined) >= starve {
                return Some((id, true));
            }
        }
        let held = |id: &u64| {
            self.waiting
                .get(id)
                .and_then(|w| self.held.get(&w.entry.tenant))
                .is_some_and(|until| *until > now)
        };
        // The best waiter of a tenant not deferred; else, in the highest
        // class waiting, the one whose tenant's hold ends first (its turn
        // comes then: a tenant released sooner is not kept waiting behind
        // one held longer).
        self.by_tag
            .iter()
            .find_map(|s| s.iter().find(|(_, id)| !held(id)))
            .or_else(|| {
                let s = self.by_tag.iter().find(|s| !s.is_empty())?;
                s.iter()
                    .min_by_key(|&&(tag, id)| (self.held_until(id, now), tag))
            })
            .map(|&(_, id)| (id, false))
    }

    /// Until when waiter `id`'s tenant is deferred, if it is at `now`.
    fn held_until(&self, id: u64, now: Instant) -> Option<Instant> {
        let w = self.waiting.get(&id)?;
        self.held.get(&w.entry.tenant).copied().filter(|u| *u > now)
    }

    /// Gives the turn to the best waiter if it does not hold it.
    fn reschedule(&mut self, now: Instant) -> Wakes {
        if let Some(t) = self.turn {
            if t.running || t.starved {
                return Vec::new();
            }
        }
        let Some((best, starved)) = self.pick(now) else {
            self.turn = None;
            return Vec::new();
        };
        let mut wakes = Vec::new();
        if starved {
            self.next_starve = self.max_starve.map(|s| now + s);
        }
        if let Some(t) = &mut self.turn {
            if t.id == best {
                t.starved = starved;
                return wakes;
            }
            let old = t.id;
            wakes.extend(self.wake(old));
        }
        let tried = self.waiting.get(&best).is_some_and(|w| w.entry.tried);
        let at = match self.retry_at {
            Some(r) if tried && r > now => Some(r),
            _ => None,
        };
        let at = match (at, self.held_until(best, now)) {
            (Some(a), Some(h)) => Some(a.max(h)),
            (a, h) => a.or(h),
        };
        self.held.retain(|_, until| *until > now);
        self.turn = Some(Turn {
            id: best,
            at,
            running: false,
            starved,
        });
        wakes.extend(self.wake(best));
        wakes
    }

    fn wake(&self, id: u64) -> Wakes {
        self.waiting
            .get(&id)
            .map(|w| vec![w.entry.wake.clone()])
            .unwrap_or_default()
    }

    /// Waiters per class.
    pub fn depth(&self) -> [usize; 3] {
        [0, 1, 2].map(|c| self.by_tag[c].len())
    }
}

#[cfg(test)]
#[path = "line_tests.rs"]
mod tests;
