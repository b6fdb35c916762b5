//! A limit lowered while holds and leases taken under the old one are out:
//! their settlement, extensions and lease lines apply
//! their counts at the rate and burst the bucket is stored with, never
//! writing the old policy back, so the next exact reservation refills at
//! the new rate. Each test runs on the memory store, Redis and Redis
//! Cluster (`store_conformance`'s harness, one manual clock per test).

use budgetgate::budget::quota_lease::{LeaseLine, LeaseReply};
use budgetgate::budget::{ExtendOutcome, SettleOutcome, Step};

use super::lease_conformance::{line, live, one, want, SEC};
use super::store_conformance::{admitted, conformance, denied, tenant, Backend, H};

conformance!(
    a_hold_settled_after_a_rate_cut_keeps_the_new_rate,
    a_hold_extended_after_a_rate_cut_keeps_the_new_rate,
    lease_lines_after_a_rate_cut_keep_the_new_rate,
);

/// Fault: a hold admitted under 60,000 tpm and settled after a reload cut
/// the limit to 6,000 wrote 60,000 back into the bucket, and the next
/// reservations refilled at it (13–14k tokens admitted in 20 s where 8k
/// fit).
async fn a_hold_settled_after_a_rate_cut_keeps_the_new_rate(h: H) {
    let old = h.tpm(tenant(), 60_000, 60_000);
    let new = h.tpm(tenant(), 6_000, 6_000);
    h.admit("old", 1_000, std::slice::from_ref(&old)).await;
    // The first reservation under the new policy clamps to its burst.
    h.admit("new", 6_000, std::slice::from_ref(&new)).await;
    assert_eq!(h.remaining(&new).await, 0);
    let s = h.settle("old", 1_000).await;
    assert!(
        matches!(s, SettleOutcome::Settled { refunded: 0, .. }),
        "{s:?}"
    );
    h.clock.advance(10 * SEC);
    assert_eq!(h.remaining(&new).await, 1_000, "10 s at 6,000 a minute");
    denied(h.reserve("over", 1_001, std::slice::from_ref(&new)).await);
    admitted(h.reserve("fits", 1_000, std::slice::from_ref(&new)).await);
    h.check_keys().await;
}

/// Fault: an extension of a hold taken under the old policy counted with
/// the old rate (its retry hint) and wrote it back into the bucket.
async fn a_hold_extended_after_a_rate_cut_keeps_the_new_rate(h: H) {
    let old = h.tpm(tenant(), 60_000, 60_000);
    let new = h.tpm(tenant(), 6_000, 6_000);
    h.admit("old", 1_000, std::slice::from_ref(&old)).await;
    h.admit("new", 6_000, std::slice::from_ref(&new)).await;
    let step = |tokens| Step::tokens(tokens);
    match h.store.extend("old", &step(100)).await.expect("extend") {
        ExtendOutcome::Exhausted(d) => {
            assert_eq!(d.available, 0);
            assert_eq!(d.retry_after_micros, 10_000, "1 token at 6,000 a minute");
            assert_eq!(d.limit, 60_000, "the limit the hold was taken under");
        }
        o => panic!("{o:?}"),
    }
    h.clock.advance(SEC);
    let e = h.store.extend("old", &step(500)).await.expect("extend");
    assert!(
        matches!(e, ExtendOutcome::Extended { granted: 100, .. }),
        "1 s at 6,000 a minute: {e:?}"
    );
    assert_eq!(h.remaining(&new).await, 0);
    h.clock.advance(10 * SEC);
    assert_eq!(h.remaining(&new).await, 1_000, "10 s at 6,000 a minute");
    denied(h.reserve("over", 1_001, std::slice::from_ref(&new)).await);
    admitted(h.reserve("fits", 1_000, std::slice::from_ref(&new)).await);
    h.check_keys().await;
}

/// Fault: the give back, report (debt) and end lines of a lease granted
/// under the old policy wrote it back into the bucket.
async fn lease_lines_after_a_rate_cut_keep_the_new_rate(h: H) {
    let old = h.tpm(tenant(), 60_000, 60_000);
    let new = h.tpm(tenant(), 6_000, 6_000);
    let g = live(one(&h, want(&old, "l", 1, 10_000)).await);
    assert_eq!(g.granted, 10_000);
    h.admit("new", 6_000, std::slice::from_ref(&new)).await;
    assert_eq!(h.remaining(&new).await, 0);
    // Give back 1,000 of what the lease holds unspent.
    live(
        one(
            &h,
            LeaseLine {
                spent: 4_000,
                give_back: 1_000,
                ..line(&old, "l", 2)
            },
        )
        .await,
    );
    assert_eq!(h.remaining(&new).await, 1_000);
    h.clock.advance(5 * SEC);
    assert_eq!(h.remaining(&new).await, 1_500, "5 s at 6,000 a minute");
    // Spent 500 beyond what it holds: debt.
    live(
        one(
            &h,
            LeaseLine {
                spent: 9_500,
                ..line(&old, "l", 3)
            },
        )
        .await,
    );
    assert_eq!(h.remaining(&new).await, 1_000);
    h.clock.advance(5 * SEC);
    assert_eq!(h.remaining(&new).await, 1_500, "5 s at 6,000 a minute");
    // A refund lowered the spend: the end gives back 500.
    let e = one(
        &h,
        LeaseLine {
            spent: 9_000,
            end: true,
            ..line(&old, "l", 4)
        },
    )
    .await;
    assert!(
        matches!(
            e,
            LeaseReply::Ended {
                given_back: 1_500,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(h.remaining(&new).await, 2_000);
    h.clock.advance(5 * SEC);
    assert_eq!(h.remaining(&new).await, 2_500, "5 s at 6,000 a minute");
    denied(h.reserve("over", 2_501, std::slice::from_ref(&new)).await);
    admitted(h.reserve("fits", 2_500, std::slice::from_ref(&new)).await);
    h.check_keys().await;
}
