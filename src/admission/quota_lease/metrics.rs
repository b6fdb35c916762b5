//! The quota lease layer's metrics. Handles are registered once and kept:
//! the decision counter is touched by every reservation.
//!
//! - `budgetgate_quota_lease_decisions_total{decided_by="lease"|"store"|"split"}`:
//!   reservations decided from quota leases here, sent to the store, or
//!   split (the deployment's budgets from its leases, the rest in one
//!   store call; the `tenant` layout).
//! - `budgetgate_quota_lease_calls_total`: lease calls sent to the store
//!   (grant, top-up, report, give-back and end lines of one domain: one call).
//! - `budgetgate_quota_leases_total{event}`: granted, topped_up, returned,
//!   expired, fenced.
//! - `budgetgate_quota_leases_held`: quota leases this gateway holds now.
//! - `budgetgate_quota_lease_book_entries`: budgets the lease book keeps an
//!   entry for (leased, wanted, held by a local reservation, or asked within
//!   the last seconds; idle ones are swept every 10 s).
//! - `budgetgate_quota_lease_overflows_total`: extensions of leased
//!   reservations the leases could not pay, sent to the store as exact
//!   reservations.
//!
//! Each is also exported under its name before the "quota lease" / "slot
//! lease" split (`budgetgate_lease_…`, `budgetgate_leases_…`, see
//! [`RENAMED`]) for one release, so dashboards and alerts keep working
//! while they move (OPERATIONS.md, "Renamed in 0.x").
//!
//! Store calls per admitted request of a budget domain are
//! (store reservations + lease calls) / admissions: the lease fleet test
//! reads them from these counters and `budgetgate_decisions_total`.

use std::sync::OnceLock;

use metrics::{counter, gauge, Counter, Gauge};

use super::plan::Applied;

/// New name, the name it replaces (exported too until the next release).
pub const RENAMED: [(&str, &str); 6] = [
    (DECISIONS, "budgetgate_lease_decisions_total"),
    (CALLS, "budgetgate_lease_calls_total"),
    (LEASES, "budgetgate_leases_total"),
    (HELD, "budgetgate_leases_held"),
    (BOOK_ENTRIES, "budgetgate_lease_book_entries"),
    (OVERFLOWS, "budgetgate_lease_overflows_total"),
];
const DECISIONS: &str = "budgetgate_quota_lease_decisions_total";
const CALLS: &str = "budgetgate_quota_lease_calls_total";
const LEASES: &str = "budgetgate_quota_leases_total";
const HELD: &str = "budgetgate_quota_leases_held";
const BOOK_ENTRIES: &str = "budgetgate_quota_lease_book_entries";
const OVERFLOWS: &str = "budgetgate_quota_lease_overflows_total";

fn old(new: &str) -> &'static str {
    RENAMED
        .iter()
        .find(|(n, _)| *n == new)
        .map_or("", |(_, o)| o)
}

/// A counter under its name and its former name.
struct Both(Counter, Counter);

impl Both {
    fn of(name: &'static str, labels: &[(&'static str, &'static str)]) -> Self {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        Both(counter!(name, labels.clone()), counter!(old(name), labels))
    }

    fn increment(&self, n: u64) {
        self.0.increment(n);
        self.1.increment(n);
    }
}

fn both_gauges(name: &'static str) -> (Gauge, Gauge) {
    (gauge!(name), gauge!(old(name)))
}

struct Handles {
    lease: Both,
    store: Both,
    split: Both,
    calls: Both,
}

fn handles() -> &'static Handles {
    static H: OnceLock<Handles> = OnceLock::new();
    H.get_or_init(|| Handles {
        lease: Both::of(DECISIONS, &[("decided_by", "lease")]),
        store: Both::of(DECISIONS, &[("decided_by", "store")]),
        split: Both::of(DECISIONS, &[("decided_by", "split")]),
        calls: Both::of(CALLS, &[]),
    })
}

const EVENTS: [&str; 5] = ["granted", "topped_up", "returned", "expired", "fenced"];

/// Registers every series at zero (a scrape before the first lease sees them).
pub fn register() {
    let h = handles();
    h.lease.increment(0);
    h.store.increment(0);
    h.split.increment(0);
    h.calls.increment(0);
    for event in EVENTS {
        Both::of(LEASES, &[("event", event)]).increment(0);
    }
    held(0);
    book_entries(0);
    Both::of(OVERFLOWS, &[]).increment(0);
}

/// A reservation decided from leases (`true`) or sent to the store.
pub fn decision(local: bool) {
    let h = handles();
    if local {
        h.lease.increment(1);
    } else {
        h.store.increment(1);
    }
}

/// A reservation split between the leases and the store.
pub fn split() {
    handles().split.increment(1);
}

/// One lease call sent.
pub fn call() {
    handles().calls.increment(1);
}

/// What one call's replies changed.
pub fn applied(a: &Applied) {
    for (event, n) in [
        ("granted", a.granted),
        ("topped_up", a.topped_up),
        ("returned", a.returned),
        ("fenced", a.fenced),
        ("expired", a.expired),
    ] {
        if n > 0 {
            Both::of(LEASES, &[("event", event)]).increment(n);
        }
    }
}

/// Leases that lapsed here without a reply (the store was unreachable).
pub fn expired(n: u64) {
    Both::of(LEASES, &[("event", "expired")]).increment(n);
}

/// Leases held now.
pub fn held(n: usize) {
    let (new, old) = both_gauges(HELD);
    new.set(n as f64);
    old.set(n as f64);
}

/// Budgets the book keeps an entry for.
pub fn book_entries(n: usize) {
    let (new, old) = both_gauges(BOOK_ENTRIES);
    new.set(n as f64);
    old.set(n as f64);
}

/// One extension of a leased reservation sent to the store.
pub fn overflow() {
    Both::of(OVERFLOWS, &[]).increment(1);
}
