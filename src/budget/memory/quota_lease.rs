//! Quota leases in the memory store: [`LeaseStore`] with the semantics of
//! `budget::quota_lease` (module docs there), the reference `lua/lease.lua` is
//! checked against by the differential test. A lease debits and credits
//! its budget through the same bucket, quota-window and slot-set code as a
//! reservation (`state`), under the store's one lock.
//!
//! Per budget key, [`BudgetLeases`] is the epoch record (policy epoch,
//! policy, how long it is kept) holding the budget's lease records; the
//! sweep that drops expired holds drops expired records and epoch records.
//! They are not in the snapshot (`snapshot`): a gateway on the memory store
//! never leases; the fleet simulation and the tests keep their stores in
//! memory only.

use std::sync::Arc;

use async_trait::async_trait;
use foldhash::HashMap;

use super::state::{store_at, Inner};
use super::MemoryStore;
use crate::budget::bucket::capacity_units;
use crate::budget::bucket::UNITS_PER_TOKEN;
use crate::budget::quota_lease::{
    BoundedLine, LeaseLine, LeaseReply, LeaseState, LeaseStore, LeasedOut,
};
use crate::budget::{BudgetKind, BudgetSpec, StoreError, MAX_AMOUNT, MAX_COUNT};

/// The epoch record of one budget and its lease records.
pub(super) struct BudgetLeases {
    epoch: u64,
    kind: BudgetKind,
    /// Kept until then (the latest `until` of its records), UTC µs.
    until: u64,
    /// A recall is on until then, UTC µs (0: none; `budget::quota_lease`,
    /// "Recall").
    recall_until: u64,
    records: HashMap<Arc<str>, Record>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Live,
    Ended,
    Fenced,
}

/// One lease's record (`lua/lease.lua` packs the same fields).
#[derive(Debug, Clone, Copy)]
struct Record {
    status: Status,
    epoch: u64,
    granted: u64,
    given_back: u64,
    /// Of `given_back`, what reached the budget (after a bucket's cap).
    returned: u64,
    spent: u64,
    seq: u64,
    expires_at: u64,
    /// Kept until then, UTC µs.
    until: u64,
    window: Option<u64>,
    /// `free` of the last live reply; the epoch that fenced a fenced one.
    free: i64,
    fenced_by: u64,
}

impl Record {
    /// What the line that made the record what it is answered, now
    /// (`recall`: whether this line found a recall on; a replay did not).
    fn reply(&self, now: u64, granted_now: u64, recall: bool) -> LeaseReply {
        match self.status {
            Status::Live => LeaseReply::Live(LeaseState {
                epoch: self.epoch,
                granted: self.granted,
                given_back: self.given_back,
                granted_now,
                expires_at_micros: self.expires_at,
                now_micros: now,
                free: self.free,
                window: self.window,
                recall,
            }),
            Status::Ended => LeaseReply::Ended {
                given_back: self.returned,
                now_micros: now,
            },
            Status::Fenced => LeaseReply::Fenced {
                epoch: self.fenced_by,
                now_micros: now,
            },
        }
    }

    /// Units the lease holds unspent.
    fn unspent(&self) -> u64 {
        (self.granted - self.given_back).saturating_sub(self.spent)
    }
}

/// Drops expired lease records and epoch records (from `Inner::tick`).
pub(super) fn sweep(leases: &mut HashMap<String, BudgetLeases>, now: u64) {
    leases.retain(|_, b| {
        b.records.retain(|_, r| r.until > now);
        b.until > now
    });
}

impl MemoryStore {
    /// Synchronous core of [`LeaseStore::lease`] (the fleet simulation
    /// calls it directly, with its own clock).
    pub fn lease_sync(&self, lines: &[LeaseLine]) -> Vec<LeaseReply> {
        let now = self.clock.now_micros();
        let mut inner = self.lock();
        inner.tick(now);
        lines.iter().map(|l| apply(&mut inner, l, now)).collect()
    }

    /// Synchronous core of [`LeaseStore::leased_out`].
    pub fn leased_out_sync(&self, specs: &[BudgetSpec]) -> Vec<LeasedOut> {
        let now = self.clock.now_micros();
        let inner = self.lock();
        specs
            .iter()
            .map(|spec| {
                let Some(book) = inner.leases.get(&*spec.key).filter(|b| b.until > now) else {
                    return LeasedOut {
                        epoch: 1,
                        leases: 0,
                        units: 0,
                    };
                };
                let live = book
                    .records
                    .values()
                    .filter(|r| r.status == Status::Live && r.expires_at > now && r.until > now);
                let (leases, units) = live.fold((0, 0), |(n, u), r| (n + 1, u + r.unspent()));
                LeasedOut {
                    epoch: book.epoch,
                    leases,
                    units,
                }
            })
            .collect()
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn lease(&self, lines: &[LeaseLine]) -> Result<Vec<LeaseReply>, StoreError> {
        Ok(self.lease_sync(lines))
    }

    async fn leased_out(&self, specs: &[BudgetSpec]) -> Result<Vec<LeasedOut>, StoreError> {
        Ok(self.leased_out_sync(specs))
    }
}

/// Applies one line (order of the steps: `budget::quota_lease` module docs).
fn apply(inner: &mut Inner, line: &LeaseLine, now: u64) -> LeaseReply {
    let spec = &line.spec;
    let l = line.bounded();
    let prior = inner
        .leases
        .get(&*spec.key)
        .filter(|b| b.until > now)
        .and_then(|b| b.records.get(&line.lease))
        .filter(|r| r.until > now)
        .copied();
    match prior {
        Some(r) if l.seq <= r.seq || r.status != Status::Live => return r.reply(now, 0, false),
        None if l.seq != 1 => return LeaseReply::Unknown { now_micros: now },
        _ => {}
    }
    let epoch = current_epoch(inner, spec, l.want > 0, now);
    let window = match spec.kind {
        BudgetKind::Quota { window, .. } if window.is_rolling() => Some(window.id(now)),
        BudgetKind::Quota { window, .. } => Some(inner.quota_at(&spec.key, window, now).window),
        _ => None,
    };
    let mut r = prior.unwrap_or(Record {
        status: Status::Live,
        epoch,
        granted: 0,
        given_back: 0,
        returned: 0,
        spent: 0,
        seq: l.seq,
        expires_at: 0,
        until: 0,
        window,
        free: 0,
        fenced_by: 0,
    });
    r.seq = l.seq;
    report(inner, spec, &mut r, l.spent, now);
    let mut granted_now = 0;
    let mut recall = false;
    if r.epoch != epoch {
        r.status = Status::Fenced;
        r.fenced_by = epoch;
    } else if prior.is_some() && r.expires_at <= now {
        r.status = Status::Ended;
    } else {
        granted_now = live_line(inner, spec, &line.lease, &mut r, &l, now);
        if r.status == Status::Live {
            recall = recall_after(inner, spec, &line.lease, &l, granted_now, now);
        }
    }
    // Bounded: at least the lease's ttl, so a live record outlives its lease.
    r.until = now + l.record_ttl_micros;
    if let Some(book) = inner.leases.get_mut(&*spec.key) {
        book.until = book.until.max(r.until);
        match book.records.get_mut(&line.lease) {
            Some(slot) => *slot = r,
            None => {
                book.records.insert(line.lease.clone(), r);
            }
        }
    }
    r.reply(now, granted_now, recall)
}

/// Starts or ends the budget's recall after a live line that asked for
/// units (`budget::quota_lease`, "Recall"); answers whether one is on.
fn recall_after(
    inner: &mut Inner,
    spec: &BudgetSpec,
    lease: &str,
    l: &BoundedLine,
    granted: u64,
    now: u64,
) -> bool {
    let Some(book) = inner.leases.get_mut(&*spec.key) else {
        return false;
    };
    if l.want > 0 && granted < l.want {
        // Other live leases hold units, as their last lines reported them.
        let held = book.records.iter().any(|(id, r)| {
            id.as_ref() != lease
                && r.status == Status::Live
                && r.expires_at > now
                && r.until > now
                && r.unspent() > 0
        });
        if held {
            book.recall_until = book.recall_until.max(now + l.ttl_micros);
        }
    } else if l.want > 0 {
        book.recall_until = 0;
    }
    book.recall_until > now
}

/// The budget's epoch now: a new epoch record (epoch 1) when it has none,
/// the next epoch when a line that asks for units (`asks`) carries a
/// policy other than the stored one.
fn current_epoch(inner: &mut Inner, spec: &BudgetSpec, asks: bool, now: u64) -> u64 {
    let live = inner.leases.get(&*spec.key).is_some_and(|b| b.until > now);
    if !live {
        let book = BudgetLeases {
            epoch: 1,
            kind: spec.kind,
            until: now,
            recall_until: 0,
            records: HashMap::default(),
        };
        store_at(&mut inner.leases, &spec.key, book);
        return 1;
    }
    let Some(book) = inner.leases.get_mut(&*spec.key) else {
        return 1;
    };
    if book.kind == spec.kind || !asks {
        return book.epoch;
    }
    book.epoch += 1;
    book.kind = spec.kind;
    let epoch = book.epoch;
    // As a refused reservation's adopt_policies: refilled to now at the
    // stored rate, the new policy from now on.
    if let BudgetKind::Bucket { per_minute, burst } = spec.kind {
        if let Some(b) = inner.buckets.get_mut(&*spec.key) {
            if (b.per_minute, b.burst) != (per_minute, burst) {
                *b = b.advance(per_minute, burst, now);
            }
        }
    }
    epoch
}

/// Records the line's `spent` and charges what it exceeds the lease by.
fn report(inner: &mut Inner, spec: &BudgetSpec, r: &mut Record, spent: u64, now: u64) {
    if let BudgetKind::Concurrency { .. } = spec.kind {
        r.spent = spent;
        return;
    }
    // The latest report stands: refunds lower it (lines apply in seq order).
    r.spent = spent;
    let held = r.granted - r.given_back;
    if r.spent <= held {
        return;
    }
    let debt = r.spent - held;
    match spec.kind {
        BudgetKind::Bucket { per_minute, burst } => {
            // At the stored policy: the lease's may be older.
            let mut b = inner.stored_bucket(&spec.key, per_minute, burst, now);
            crate::budget::metrics::debt_forgiven(b.debit(debt));
            store_at(&mut inner.buckets, &spec.key, b);
        }
        BudgetKind::Quota { window, .. } if window.is_rolling() => {
            // Debt goes to the sub-bucket of now (capped as a debit is).
            inner
                .rolling_mut(&spec.key, window, now)
                .debit(window, now, debt.min(MAX_AMOUNT));
        }
        BudgetKind::Quota { window, .. } => {
            let mut q = inner.quota_at(&spec.key, window, now);
            q.used = (q.used + debt.min(MAX_AMOUNT)).min(MAX_COUNT);
            store_at(&mut inner.quotas, &spec.key, q);
        }
        BudgetKind::Concurrency { .. } => {}
    }
    r.granted = (r.granted + debt).min(MAX_COUNT);
}

/// A line on a live lease: top-up, give back, then end or a new expiry.
/// Returns the units granted now.
fn live_line(
    inner: &mut Inner,
    spec: &BudgetSpec,
    lease: &str,
    r: &mut Record,
    l: &BoundedLine,
    now: u64,
) -> u64 {
    let mut expires_at = now + l.ttl_micros;
    if let BudgetKind::Quota { window, .. } = spec.kind {
        expires_at = expires_at.min(window.end(now));
    }
    let mut granted = 0;
    if l.want > 0 {
        let free = inner.available(spec, now).max(0) as u64;
        granted = l.want.min(free / 2).min(MAX_COUNT - r.granted);
        if granted > 0 {
            inner.debit(spec, granted, now, lease);
            r.granted += granted;
        }
    }
    let back = if l.end {
        r.unspent()
    } else {
        l.give_back.min(r.unspent())
    };
    let first_kept = r.given_back + back;
    if back > 0 {
        r.returned += give_back(inner, spec, lease, r, back, now);
        r.given_back += back;
    }
    if l.end {
        r.status = Status::Ended;
        return granted;
    }
    r.expires_at = expires_at;
    if let BudgetKind::Concurrency { .. } = spec.kind {
        // Every member the lease holds, new ones included, lives as long
        // as the lease now does.
        if !inner.slots.contains_key(&*spec.key) {
            inner.slots.insert(spec.key.to_string(), HashMap::default());
        }
        let Some(set) = inner.slots.get_mut(&*spec.key) else {
            return granted;
        };
        for n in first_kept + 1..=r.granted {
            set.insert(member(lease, n), expires_at);
        }
    }
    r.free = inner.available(spec, now);
    granted
}

/// Returns `units` unspent units of the lease to the budget; answers what
/// reached it (whole units).
fn give_back(
    inner: &mut Inner,
    spec: &BudgetSpec,
    lease: &str,
    r: &Record,
    units: u64,
    now: u64,
) -> u64 {
    match spec.kind {
        BudgetKind::Bucket { per_minute, burst } => {
            // At the stored policy: the lease's may be older.
            let mut b = inner.stored_bucket(&spec.key, per_minute, burst, now);
            let room = (capacity_units(b.burst) - b.level).div_euclid(UNITS_PER_TOKEN);
            b.credit(units);
            store_at(&mut inner.buckets, &spec.key, b);
            units.min(room.max(0) as u64)
        }
        BudgetKind::Quota { window, .. } if window.is_rolling() => {
            // A lease lives within the sub-bucket it was granted in
            // (`Window::end`): its units go back there, and only there.
            let w = window.id(now);
            if r.window != Some(w) {
                return 0;
            }
            inner.rolling_mut(&spec.key, window, now).credit(w, units)
        }
        BudgetKind::Quota { window, .. } => {
            let mut q = inner.quota_at(&spec.key, window, now);
            if r.window != Some(q.window) {
                return 0;
            }
            let back = units.min(q.used);
            q.used -= back;
            store_at(&mut inner.quotas, &spec.key, q);
            back
        }
        BudgetKind::Concurrency { .. } => {
            if let Some(set) = inner.slots.get_mut(&*spec.key) {
                for n in r.given_back + 1..=r.given_back + units {
                    set.remove(&member(lease, n));
                }
            }
            units
        }
    }
}

/// Slot-set member `n` of a concurrency lease.
fn member(lease: &str, n: u64) -> String {
    format!("{lease}#{n}")
}
