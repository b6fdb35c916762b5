//! The lease layer's metrics. Handles are registered once and kept: the
//! decision counter is touched by every reservation.
//!
//! - `budgetgate_lease_decisions_total{decided_by="lease"|"store"}`:
//!   reservations decided from leases here, or sent to the store.
//! - `budgetgate_lease_calls_total`: lease calls sent to the store (grant,
//!   top-up, report, give-back and end lines of one domain: one call).
//! - `budgetgate_leases_total{event}`: granted, topped_up, returned,
//!   expired, fenced.
//! - `budgetgate_leases_held`: leases this gateway holds now.
//! - `budgetgate_lease_book_entries`: budgets the lease book keeps an entry
//!   for (leased, wanted, held by a local reservation, or asked within
//!   the last seconds; idle ones are swept every 10 s).
//! - `budgetgate_lease_overflows_total`: extensions of leased reservations
//!   the leases could not pay, sent to the store as exact reservations.
//!
//! Store calls per admitted request of a budget domain are
//! (store reservations + lease calls) / admissions: the test of issue 30
//! reads them from these counters and `budgetgate_decisions_total`.

use std::sync::OnceLock;

use metrics::{counter, gauge, Counter};

use super::plan::Applied;

struct Handles {
    lease: Counter,
    store: Counter,
    calls: Counter,
}

fn handles() -> &'static Handles {
    static H: OnceLock<Handles> = OnceLock::new();
    H.get_or_init(|| Handles {
        lease: counter!("budgetgate_lease_decisions_total", "decided_by" => "lease"),
        store: counter!("budgetgate_lease_decisions_total", "decided_by" => "store"),
        calls: counter!("budgetgate_lease_calls_total"),
    })
}

/// Registers every series at zero (a scrape before the first lease sees them).
pub fn register() {
    let h = handles();
    h.lease.increment(0);
    h.store.increment(0);
    h.calls.increment(0);
    for event in ["granted", "topped_up", "returned", "expired", "fenced"] {
        counter!("budgetgate_leases_total", "event" => event).increment(0);
    }
    gauge!("budgetgate_leases_held").set(0.0);
    gauge!("budgetgate_lease_book_entries").set(0.0);
    counter!("budgetgate_lease_overflows_total").increment(0);
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
            counter!("budgetgate_leases_total", "event" => event).increment(n);
        }
    }
}

/// Leases that lapsed here without a reply (the store was unreachable).
pub fn expired(n: u64) {
    counter!("budgetgate_leases_total", "event" => "expired").increment(n);
}

/// Leases held now.
pub fn held(n: usize) {
    gauge!("budgetgate_leases_held").set(n as f64);
}

/// Budgets the book keeps an entry for.
pub fn book_entries(n: usize) {
    gauge!("budgetgate_lease_book_entries").set(n as f64);
}

/// One extension of a leased reservation sent to the store.
pub fn overflow() {
    counter!("budgetgate_lease_overflows_total").increment(1);
}
