//! Lease lines across calls: fencing after a policy change, retries after
//! a lost reply, lines without a record, many budgets in one call, and
//! numbers beyond any budget, on the memory store, Redis and Redis Cluster
//! (`lease_conformance`'s harness).

use budgetgate::budget::quota_lease::{LeaseLine, LeaseReply, LeaseState};
use budgetgate::budget::{BudgetKind, BudgetSpec};

use super::lease_conformance::{leased, line, live, one, out, want, RECORD_TTL, SEC};
use super::store_conformance::{conformance, tenant, Backend, H};
use crate::support::NOON;

conformance!(
    a_policy_change_fences_old_leases_and_still_charges_their_debt,
    a_retried_line_after_a_lost_reply_changes_nothing,
    a_line_without_a_record_is_unknown_and_writes_nothing,
    lines_of_several_budgets_in_one_call,
    absurd_numbers_are_bounded,
    odd_lease_ids_are_leases_of_their_own,
    a_call_of_thousands_of_lines,
);

/// Fault: a lease granted under the old limit spent after a reload that
/// lowered it. The epoch fences it; its debt is still charged.
async fn a_policy_change_fences_old_leases_and_still_charges_their_debt(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let faster = BudgetSpec {
        kind: BudgetKind::Bucket {
            per_minute: 2000,
            burst: 1000,
        },
        ..tpm.clone()
    };
    assert_eq!(live(one(&h, want(&tpm, "old", 1, 400)).await).epoch, 1);
    let n = live(one(&h, want(&faster, "new", 1, 100)).await);
    assert_eq!((n.epoch, n.granted, n.free), (2, 100, 500));
    assert_eq!(out(&h, &faster).await, leased(2, 2, 500));
    let report = LeaseLine {
        spent: 450,
        want: 100,
        give_back: 10,
        ..line(&faster, "old", 2)
    };
    let f = one(&h, report.clone()).await;
    assert_eq!(
        f,
        LeaseReply::Fenced {
            epoch: 2,
            now_micros: NOON
        }
    );
    assert_eq!(
        h.remaining(&faster).await,
        450,
        "50 of debt charged, nothing granted or given back"
    );
    assert_eq!(one(&h, report).await, f, "a retry answers the fence");
    assert_eq!(
        one(
            &h,
            LeaseLine {
                end: true,
                ..line(&faster, "old", 3)
            }
        )
        .await,
        f
    );
    assert_eq!(out(&h, &faster).await, leased(2, 1, 100));
    assert_eq!(live(one(&h, line(&faster, "new", 2)).await).epoch, 2);
    // A line that asks for nothing never bumps the epoch, whatever policy
    // it carries: a reloaded gateway ending its old lease with the old spec.
    let end_old = LeaseLine {
        end: true,
        ..line(&tpm, "old2", 1)
    };
    live(one(&h, want(&faster, "old2", 1, 10)).await);
    assert!(matches!(
        one(&h, LeaseLine { seq: 2, ..end_old }).await,
        LeaseReply::Ended { given_back: 10, .. }
    ));
    assert_eq!(out(&h, &tpm).await.epoch, 2);
    // A gateway still on the old policy that asks for units bumps it back:
    // the new lease is fenced in turn (a rolling reload, module docs).
    assert_eq!(live(one(&h, want(&tpm, "older", 1, 2)).await).epoch, 3);
    assert!(matches!(
        one(&h, line(&faster, "new", 3)).await,
        LeaseReply::Fenced { epoch: 3, .. }
    ));
    h.check_keys().await;
}

/// Fault: the reply of a grant is lost and the gateway retries it; the
/// budget must be debited once.
async fn a_retried_line_after_a_lost_reply_changes_nothing(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let first = live(one(&h, want(&tpm, "r", 1, 200)).await);
    let again = live(one(&h, want(&tpm, "r", 1, 200)).await);
    assert_eq!(
        again,
        LeaseState {
            granted_now: 0,
            ..first.clone()
        }
    );
    assert_eq!(h.remaining(&tpm).await, 800);
    let second = live(one(&h, want(&tpm, "r", 2, 100)).await);
    assert_eq!((second.granted_now, second.free), (100, 700));
    h.clock.advance(SEC);
    let replay = live(one(&h, want(&tpm, "r", 2, 500)).await);
    assert_eq!(
        replay,
        LeaseState {
            granted_now: 0,
            now_micros: NOON + SEC,
            ..second.clone()
        },
        "any seq up to the last applied answers its reply"
    );
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 300));
    let both = h
        .leases
        .lease(&[
            want(&tpm, "r", 2, 100),
            LeaseLine {
                give_back: 50,
                ..line(&tpm, "r", 3)
            },
        ])
        .await
        .expect("lease");
    assert_eq!(live(both[0].clone()).granted_now, 0);
    assert_eq!(live(both[1].clone()).given_back, 50);
    assert_eq!(out(&h, &tpm).await, leased(1, 1, 250));
    h.check_keys().await;
}

/// Fault: a line of a lease whose record expired (or whose grant never
/// arrived) must not create a lease out of nothing.
async fn a_line_without_a_record_is_unknown_and_writes_nothing(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let u = one(&h, want(&tpm, "nope", 2, 100)).await;
    assert_eq!(u, LeaseReply::Unknown { now_micros: NOON });
    assert_eq!(h.remaining(&tpm).await, 1000);
    assert_eq!(out(&h, &tpm).await, leased(1, 0, 0));
    assert_eq!(h.check_keys().await, 0, "nothing written");
    live(one(&h, want(&tpm, "x", 1, 100)).await);
    h.clock.advance(RECORD_TTL);
    assert_eq!(
        one(&h, want(&tpm, "x", 2, 100)).await,
        LeaseReply::Unknown {
            now_micros: NOON + RECORD_TTL
        }
    );
    assert_eq!(out(&h, &tpm).await, leased(1, 0, 0));
    h.check_keys().await;
}

/// One call carries the lines of many budgets (one budget domain); each
/// applies on its own, in order.
async fn lines_of_several_budgets_in_one_call(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let rpm = h.rpm(tenant(), 60, 10);
    let month = h.per_month(tenant(), 7000);
    let slots = h.slots(tenant(), 3);
    let r = h
        .leases
        .lease(&[
            want(&tpm, "m", 1, 100),
            want(&rpm, "m", 1, 100),
            want(&month, "m", 1, 10_000),
            want(&slots, "m", 1, 3),
            want(&tpm, "m", 2, 1000),
            want(&tpm, "other", 5, 1),
        ])
        .await
        .expect("lease");
    let g: Vec<(u64, i64)> = r[..5]
        .iter()
        .map(|x| {
            let s = live(x.clone());
            (s.granted_now, s.free)
        })
        .collect();
    assert_eq!(g, [(100, 900), (5, 5), (3500, 3500), (1, 2), (450, 450)]);
    assert_eq!(r[5], LeaseReply::Unknown { now_micros: NOON });
    let outs = h
        .leases
        .leased_out(&[tpm.clone(), rpm, month, slots])
        .await
        .expect("leased out");
    let units: Vec<u64> = outs.iter().map(|o| o.units).collect();
    assert_eq!(units, [550, 5, 3500, 1]);
    let n = h.check_keys().await;
    if h.backend != Backend::Memory {
        // 4 budgets, their 4 epoch records and 4 lease records.
        assert_eq!(n, 12);
    }
}

/// Bad input: numbers far beyond any budget are bounded, never overflow.
async fn absurd_numbers_are_bounded(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let l = LeaseLine {
        want: u64::MAX,
        ttl_micros: u64::MAX,
        record_ttl_micros: 0,
        ..line(&tpm, "huge", 1)
    };
    let s = live(one(&h, l).await);
    assert_eq!(s.granted, 500);
    assert_eq!(s.expires_at_micros, NOON + 10_000_000_000_000);
    let s = live(
        one(
            &h,
            LeaseLine {
                spent: u64::MAX,
                give_back: u64::MAX,
                seq: u64::MAX,
                ..line(&tpm, "huge", 2)
            },
        )
        .await,
    );
    assert_eq!(s.granted, 1 << 52, "capped at 2^52");
    // Debt reaches the bucket as a settlement's would: at most 10^10 tokens.
    assert_eq!(s.free, 500 - 10_000_000_000);
    assert_eq!(s.given_back, 0, "nothing unspent to give back");
    h.check_keys().await;
}

/// Bad input: lease ids are gateway-made, but an empty one, or one with
/// spaces, separators, `#` or what looks like an escape, must still name
/// a lease of its own (records, slot-set members, the epoch record's list).
async fn odd_lease_ids_are_leases_of_their_own(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let slots = h.slots(tenant(), 8);
    let ids = ["", "a b;c\n", "x#1", "x", "a%20b", "a b"];
    for (i, id) in ids.iter().enumerate() {
        let g = live(one(&h, want(&tpm, id, 1, 2)).await);
        assert_eq!(g.granted_now, 2, "{id:?}");
        assert_eq!(out(&h, &tpm).await.leases, i as u64 + 1, "{id:?}");
    }
    assert_eq!(out(&h, &tpm).await.units, 12);
    for id in ["x#1", "x"] {
        assert_eq!(live(one(&h, want(&slots, id, 1, 2)).await).granted_now, 2);
    }
    assert_eq!(h.remaining(&slots).await, 4);
    let e = one(
        &h,
        LeaseLine {
            end: true,
            ..line(&slots, "x", 2)
        },
    )
    .await;
    assert!(
        matches!(e, LeaseReply::Ended { given_back: 2, .. }),
        "{e:?}"
    );
    assert_eq!(h.remaining(&slots).await, 6, "only x's members left");
    assert_eq!(out(&h, &slots).await, leased(1, 1, 2));
    h.check_keys().await;
}

/// A gateway leasing every budget of a busy domain sends one call with a
/// line per lease: thousands of lines must fit one script call (Lua's
/// limit of ~8,000 results per `unpack` is below 4 keys × 2,500 lines).
async fn a_call_of_thousands_of_lines(h: H) {
    let tpm = h.tpm(tenant(), 1_000_000, 1_000_000);
    let lines: Vec<LeaseLine> = (0..2500)
        .map(|i| want(&tpm, &format!("gw-{i}"), 1, 10))
        .collect();
    let replies = h.leases.lease(&lines).await.expect("lease");
    assert_eq!(replies.len(), 2500);
    assert!(replies
        .iter()
        .all(|r| matches!(r, LeaseReply::Live(s) if s.granted_now == 10)));
    assert_eq!(h.remaining(&tpm).await, 1_000_000 - 25_000);
    assert_eq!(out(&h, &tpm).await, leased(1, 2500, 25_000));
    h.check_keys().await;
}
