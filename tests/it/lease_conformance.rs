//! The store side of quota leases (`budget::quota_lease`): each test
//! runs unchanged against the memory store, the Redis store on one node and
//! on a 3-node Redis Cluster, through `store_conformance`'s harness (one
//! [`ManualClock`] per test, so every expected value is exact). What each
//! line does to its budget is here; `lease_calls` holds what spans lines
//! and calls: fencing, retries, missing records, many budgets, bounds.

use budgetgate::budget::quota_lease::{LeaseLine, LeaseReply, LeaseState, LeasedOut};
use budgetgate::budget::{BudgetSpec, SettleOutcome, Window};

use super::store_conformance::{admitted, conformance, denied, tenant, Backend, H};
use crate::support::NOON;

pub(crate) const SEC: u64 = 1_000_000;
/// Lease expiry of every line, µs.
const TTL: u64 = 60 * SEC;
/// How long every lease record is kept, µs.
pub(crate) const RECORD_TTL: u64 = 300 * SEC;

pub(crate) fn line(spec: &BudgetSpec, lease: &str, seq: u64) -> LeaseLine {
    LeaseLine {
        spec: spec.clone(),
        lease: lease.into(),
        seq,
        epoch: 0,
        want: 0,
        give_back: 0,
        spent: 0,
        end: false,
        ttl_micros: TTL,
        record_ttl_micros: RECORD_TTL,
    }
}

pub(crate) fn want(spec: &BudgetSpec, lease: &str, seq: u64, want: u64) -> LeaseLine {
    LeaseLine {
        want,
        ..line(spec, lease, seq)
    }
}

pub(crate) async fn one(h: &H, l: LeaseLine) -> LeaseReply {
    let mut r = h.leases.lease(&[l]).await.expect("lease");
    assert_eq!(r.len(), 1);
    r.remove(0)
}

pub(crate) fn live(r: LeaseReply) -> LeaseState {
    match r {
        LeaseReply::Live(s) => s,
        other => panic!("expected a live lease, got {other:?}"),
    }
}

pub(crate) async fn out(h: &H, spec: &BudgetSpec) -> LeasedOut {
    h.leases
        .leased_out(std::slice::from_ref(spec))
        .await
        .expect("leased out")
        .remove(0)
}

pub(crate) fn leased(epoch: u64, leases: u64, units: u64) -> LeasedOut {
    LeasedOut {
        epoch,
        leases,
        units,
    }
}

conformance!(
    grant_and_top_up_take_at_most_half_of_what_is_free,
    reports_are_cumulative_and_spending_beyond_the_lease_is_debt,
    give_back_never_fills_a_bucket_past_its_capacity,
    quota_give_back_goes_only_to_the_window_it_was_taken_from,
    concurrency_lease_slots_are_counted_by_exact_reservations,
    an_expired_lease_gives_nothing_back,
    a_top_up_granted_short_recalls_what_other_leases_hold,
);

/// Fault: a gateway that asks for a whole budget would strand it; a grant
/// takes at most floor(free / 2) and is debited like a reservation.
async fn grant_and_top_up_take_at_most_half_of_what_is_free(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let g = live(one(&h, want(&tpm, "g1", 1, 300)).await);
    assert_eq!(
        g,
        LeaseState {
            epoch: 1,
            granted: 300,
            given_back: 0,
            granted_now: 300,
            expires_at_micros: NOON + TTL,
            now_micros: NOON,
            free: 700,
            window: None,
            recall: false,
        }
    );
    assert_eq!(h.remaining(&tpm).await, 700, "debited as a reservation");
    let mut granted = 300;
    for (seq, expect, free) in [(2, 350, 350), (3, 175, 175), (4, 87, 88)] {
        let s = live(one(&h, want(&tpm, "g1", seq, 1000)).await);
        granted += expect;
        assert_eq!(
            (s.granted_now, s.granted, s.free),
            (expect, granted, free),
            "top-up {seq}"
        );
    }
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 912));
    let s = live(one(&h, want(&tpm, "g2", 1, 1)).await);
    assert_eq!((s.granted_now, s.free), (1, 87));
    assert_eq!(out(&h, &tpm).await, leased(1, 2, 913));
    // An exact reservation sees what the leases took.
    denied(h.reserve("r", 88, std::slice::from_ref(&tpm)).await);
    admitted(h.reserve("r2", 87, std::slice::from_ref(&tpm)).await);
    h.check_keys().await;
}

/// Fault: an estimate that was low makes a gateway spend more than its
/// lease holds; the store charges the excess at the next report.
async fn reports_are_cumulative_and_spending_beyond_the_lease_is_debt(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    live(one(&h, want(&tpm, "d", 1, 400)).await);
    let report = |seq, spent| LeaseLine {
        spent,
        ..line(&tpm, "d", seq)
    };
    let s = live(one(&h, report(2, 100)).await);
    assert_eq!((s.granted, s.free), (400, 600));
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 300));
    let s = live(one(&h, report(3, 50)).await);
    assert_eq!(
        (s.granted, s.free),
        (400, 600),
        "a refund lowers what the lease has spent"
    );
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 350));
    let s = live(one(&h, report(4, 550)).await);
    assert_eq!(
        (s.granted, s.free),
        (550, 450),
        "150 of debt charged, counted as granted"
    );
    assert_eq!(h.remaining(&tpm).await, 450);
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 0));
    let s = live(
        one(
            &h,
            LeaseLine {
                want: 100,
                ..report(5, 550)
            },
        )
        .await,
    );
    assert_eq!((s.granted_now, s.granted, s.free), (100, 650, 350));
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 100));
    h.check_keys().await;
}

/// Fault: a bucket that refilled while its units were out on a lease must
/// not hold more than its capacity when they come back.
async fn give_back_never_fills_a_bucket_past_its_capacity(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    live(one(&h, want(&tpm, "c", 1, 500)).await);
    assert_eq!(h.remaining(&tpm).await, 500);
    h.clock.advance(15 * SEC);
    assert_eq!(h.remaining(&tpm).await, 750, "15 s of refill");
    let s = live(
        one(
            &h,
            LeaseLine {
                give_back: 100,
                ..line(&tpm, "c", 2)
            },
        )
        .await,
    );
    assert_eq!((s.granted, s.given_back, s.free), (500, 100, 850));
    h.clock.advance(6 * SEC);
    assert_eq!(h.remaining(&tpm).await, 950);
    // 400 unspent come back; only 50 fit.
    let end = LeaseLine {
        end: true,
        ..line(&tpm, "c", 3)
    };
    let e = one(&h, end.clone()).await;
    assert_eq!(
        e,
        LeaseReply::Ended {
            given_back: 150,
            now_micros: NOON + 21 * SEC
        }
    );
    assert_eq!(h.state(&tpm).await, (1000, 0), "full, never above");
    // Closed: a retry and any later line answer the end again.
    assert_eq!(one(&h, end).await, e);
    assert_eq!(one(&h, want(&tpm, "c", 4, 10)).await, e);
    assert_eq!(h.remaining(&tpm).await, 1000);
    assert_eq!(out(&h, &tpm).await, leased(1, 0, 0));
    h.check_keys().await;
}

/// Fault: units taken from yesterday's quota must not be returned to
/// today's. A quota lease never outlives its window.
async fn quota_give_back_goes_only_to_the_window_it_was_taken_from(h: H) {
    let start = Window::Day.end(NOON) - 30 * SEC;
    h.clock.set(start);
    let day = h.per_day(tenant(), 1000);
    let g = live(one(&h, want(&day, "q", 1, 800)).await);
    assert_eq!(g.granted, 500, "half of the 1000 free");
    assert_eq!(g.window, Some(Window::Day.id(start)));
    assert_eq!(
        g.expires_at_micros,
        Window::Day.end(start),
        "capped at the window's end"
    );
    let s = live(
        one(
            &h,
            LeaseLine {
                give_back: 100,
                ..line(&day, "q", 2)
            },
        )
        .await,
    );
    assert_eq!((s.given_back, s.free), (100, 600));
    assert_eq!(h.remaining(&day).await, 600);
    h.clock.advance(30 * SEC);
    assert_eq!(h.remaining(&day).await, 1000, "a new window");
    admitted(h.reserve("today", 200, std::slice::from_ref(&day)).await);
    let e = one(
        &h,
        LeaseLine {
            end: true,
            ..line(&day, "q", 3)
        },
    )
    .await;
    assert_eq!(
        e,
        LeaseReply::Ended {
            given_back: 100,
            now_micros: start + 30 * SEC
        },
        "nothing more comes back"
    );
    assert_eq!(h.remaining(&day).await, 800, "today's count untouched");
    assert_eq!(out(&h, &day).await, leased(1, 0, 0));
    h.check_keys().await;
}

/// Fault: slots held by a lease that exact reservations did not count
/// would let a budget exceed its concurrency limit.
async fn concurrency_lease_slots_are_counted_by_exact_reservations(h: H) {
    let slots = h.slots(tenant(), 5);
    let s = live(one(&h, want(&slots, "s", 1, 5)).await);
    assert_eq!((s.granted, s.free), (2, 3));
    assert_eq!(out(&h, &slots).await, leased(1, 1, 2));
    for id in ["a", "b", "c"] {
        admitted(h.reserve(id, 1, std::slice::from_ref(&slots)).await);
    }
    denied(h.reserve("d", 1, std::slice::from_ref(&slots)).await);
    let s = live(
        one(
            &h,
            LeaseLine {
                give_back: 1,
                spent: 1,
                ..line(&slots, "s", 2)
            },
        )
        .await,
    );
    assert_eq!((s.granted, s.given_back, s.free), (2, 1, 1));
    if let Some(raw) = &h.raw {
        let members: Vec<(String, u64)> = raw
            .query(
                redis::cmd("ZRANGE")
                    .arg(&*slots.key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .await;
        assert!(
            members.contains(&("s#2".to_string(), NOON + TTL)),
            "{members:?}"
        );
        assert!(!members.iter().any(|(m, _)| m == "s#1"), "{members:?}");
    }
    admitted(h.reserve("d", 1, std::slice::from_ref(&slots)).await);
    assert_eq!(h.remaining(&slots).await, 0);
    // Ended with its one slot in use: that slot stays until the expiry.
    let e = one(
        &h,
        LeaseLine {
            end: true,
            spent: 1,
            ..line(&slots, "s", 3)
        },
    )
    .await;
    assert!(
        matches!(e, LeaseReply::Ended { given_back: 1, .. }),
        "{e:?}"
    );
    for id in ["a", "b", "c", "d"] {
        assert!(matches!(
            h.settle(id, 1).await,
            SettleOutcome::Settled { .. }
        ));
    }
    assert_eq!(h.remaining(&slots).await, 4);
    h.clock.advance(TTL);
    assert_eq!(
        h.remaining(&slots).await,
        5,
        "the slot left with the expiry"
    );
    h.check_keys().await;
}

/// Fault: a gateway killed with a lease. Its record expires; the store
/// assumes it was spent and gives nothing back.
async fn an_expired_lease_gives_nothing_back(h: H) {
    let slow = h.tpm(tenant(), 60, 1000);
    let day = h.per_day(tenant(), 1000);
    live(one(&h, want(&slow, "x", 1, 1000)).await);
    live(one(&h, want(&day, "x", 1, 1000)).await);
    assert_eq!(h.remaining(&slow).await, 500);
    assert_eq!(h.remaining(&day).await, 500);
    h.clock.advance(TTL);
    assert_eq!(out(&h, &slow).await, leased(1, 0, 0));
    for spec in [&slow, &day] {
        let e = one(
            &h,
            LeaseLine {
                give_back: 500,
                ..line(spec, "x", 2)
            },
        )
        .await;
        assert_eq!(
            e,
            LeaseReply::Ended {
                given_back: 0,
                now_micros: NOON + TTL
            }
        );
    }
    assert_eq!(h.remaining(&slow).await, 560, "refill only");
    assert_eq!(h.remaining(&day).await, 500, "still debited");
    h.check_keys().await;
}

/// Fault guarded against: a gateway short of units while another
/// gateway's lease holds some it does not spend (the stranded limit). A
/// top-up granted short starts the budget's recall while another live
/// lease holds units; every live line hears it, a replay does not, and a
/// top-up granted in full ends it. It changes no count, and a lease
/// holding nothing starts none.
async fn a_top_up_granted_short_recalls_what_other_leases_hold(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    // Gateway a holds 500, gateway b 250; the store keeps 250.
    let a = live(one(&h, want(&tpm, "a", 1, 500)).await);
    let b = live(one(&h, want(&tpm, "b", 1, 500)).await);
    assert_eq!((a.granted_now, b.granted_now, b.free), (500, 250, 250));
    assert!(!a.recall, "a grant in full starts nothing");
    assert!(b.recall, "b was granted short while a holds 500");
    let before = h.state(&tpm).await;
    // a's renewal hears it; a replay of it does not.
    let renew = line(&tpm, "a", 2);
    let heard = live(one(&h, renew.clone()).await);
    assert!(heard.recall);
    assert!(!live(one(&h, renew).await).recall, "a replay");
    assert_eq!(h.state(&tpm).await, before, "a recall changes no count");
    // a gives back what it does not spend; b's next top-up gets half of it.
    let back = live(
        one(
            &h,
            LeaseLine {
                give_back: 400,
                spent: 100,
                ..line(&tpm, "a", 3)
            },
        )
        .await,
    );
    assert_eq!((back.given_back, back.free), (400, 650));
    let topped = live(one(&h, want(&tpm, "b", 2, 300)).await);
    assert_eq!(topped.granted_now, 300);
    assert!(!topped.recall, "a top-up granted in full ends the recall");
    assert!(!live(one(&h, line(&tpm, "a", 4)).await).recall);
    // Short again, but the other lease holds nothing: no recall.
    let a_spent = live(
        one(
            &h,
            LeaseLine {
                spent: 100,
                ..line(&tpm, "a", 5)
            },
        )
        .await,
    );
    assert_eq!(
        a_spent.granted - a_spent.given_back,
        100,
        "a holds nothing unspent"
    );
    let short = live(one(&h, want(&tpm, "b", 3, 5000)).await);
    assert!(short.granted_now < 5000);
    assert!(!short.recall, "nobody else holds units");
    assert_eq!(
        out(&h, &tpm).await,
        leased(1, 2, short.granted - short.given_back),
        "the recall is no lease"
    );
    h.check_keys().await;
}
