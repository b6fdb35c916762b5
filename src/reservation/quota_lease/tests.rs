//! The book on its own: its decisions and plans, with the store's replies
//! written by hand (the stores' side is tested in `tests/it/lease_*`, the
//! two together by the fleet simulation).

use std::sync::Arc;
use std::time::Duration;

use super::book::{Book, Decision, LeaseOff};
use super::plan::Call;
use crate::reserve::lease::{LeaseReply, LeaseState};
use crate::reserve::store_config::LeasePolicy;
use crate::reserve::{
    Actual, BudgetKind, BudgetName, BudgetSpec, Costs, ExtendOutcome, Requester, ReserveOutcome,
    ReserveRequest, Scope, SettleOutcome, Settlement, Step,
};

const S: u64 = 1_000_000;

fn spec(name: BudgetName, per_minute: u64) -> BudgetSpec {
    BudgetSpec {
        scope: Scope::Tenant("hot".into()),
        name,
        kind: BudgetKind::Bucket {
            per_minute,
            burst: per_minute,
        },
        key: format!("bg:{{d}}:v3:tenant:hot:{}", name.as_str()).into(),
        refund_unused: true,
        shadow: false,
    }
}

fn request(id: &str, tokens: u64) -> ReserveRequest {
    ReserveRequest {
        share: None,
        id: id.into(),
        costs: Costs::tokens(tokens),
        common: vec![spec(BudgetName::Rpm, 6_000), spec(BudgetName::Tpm, 600_000)],
        candidates: vec![Vec::new()],
        lease_micros: 5 * S,
        hold_ttl_micros: 60 * S,
        requester: Arc::new(Requester::default()),
    }
}

fn book() -> Book {
    let p = LeasePolicy::default();
    Book::new(
        super::settings(&p, Duration::from_millis(50)),
        LeaseOff::default(),
        "g1",
    )
}

/// The store's answer to a call: every line granted what it wants.
fn grant_all(call: &Call, now_utc: u64) -> Vec<LeaseReply> {
    call.lines
        .iter()
        .map(|l| {
            LeaseReply::Live(LeaseState {
                epoch: 1,
                granted: l.want,
                given_back: 0,
                granted_now: l.want,
                expires_at_micros: now_utc + l.ttl_micros,
                now_micros: now_utc,
                free: 1_000,
                window: None,
            })
        })
        .collect()
}

/// Drives demand past `min_rate` and answers the grant: a book with both
/// budgets leased.
fn leased_book() -> (Book, u64) {
    let mut b = book();
    let mut now = 10 * S;
    for i in 0..60 {
        assert!(matches!(
            b.reserve(&request(&format!("warm{i}"), 100), now),
            Decision::Store
        ));
        now += 1_000;
    }
    let calls = b.due(now);
    assert_eq!(calls.len(), 1, "one call for the domain");
    assert_eq!(calls[0].lines.len(), 2, "both budgets became hot");
    assert!(calls[0].lines.iter().all(|l| l.seq == 1 && l.want > 0));
    let replies = grant_all(&calls[0], 1_800_000_000_000_000);
    b.apply(&calls[0], Some(&replies), now + 500);
    (b, now + 1_000)
}

#[test]
fn a_budget_is_leased_once_demand_passes_min_rate_and_then_decided_locally() {
    let (mut b, now) = leased_book();
    assert_eq!(b.leases(), 2);
    match b.reserve(&request("r1", 100), now) {
        Decision::Local(ReserveOutcome::Admitted(a)) => {
            assert_eq!(a.budgets.len(), 2);
        }
        _ => panic!("a covered reservation is decided from the leases"),
    }
    assert!(b.holds("r1"));
}

#[test]
fn a_reservation_no_lease_covers_is_refused_whole_and_debits_nothing() {
    let (mut b, now) = leased_book();
    let before: Vec<i64> = {
        let mut v: Vec<_> = b.outstanding().map(|(s, a)| (s.name.as_str(), a)).collect();
        v.sort();
        v.into_iter().map(|(_, a)| a).collect()
    };
    // Far more tokens than the tpm lease holds; the rpm lease could pay.
    match b.reserve(&request("big", 10_000_000), now) {
        Decision::Local(ReserveOutcome::Denied(d)) => {
            assert_eq!(d.name, BudgetName::Tpm);
            assert!(d.retry_after_micros > 0);
        }
        _ => panic!("a short lease refuses locally"),
    }
    let mut after: Vec<_> = b.outstanding().map(|(s, a)| (s.name.as_str(), a)).collect();
    after.sort();
    assert_eq!(
        after.into_iter().map(|(_, a)| a).collect::<Vec<_>>(),
        before,
        "all-or-nothing"
    );
    assert!(!b.holds("big"));
}

#[test]
fn settlement_refunds_into_the_lease_and_request_counts_stay_spent() {
    let (mut b, now) = leased_book();
    let avail = |b: &Book, n: &str| {
        b.outstanding()
            .find(|(s, _)| s.name.as_str() == n)
            .map(|(_, a)| a)
            .expect("leased")
    };
    let (rpm0, tpm0) = (avail(&b, "rpm"), avail(&b, "tpm"));
    assert!(matches!(
        b.reserve(&request("r", 500), now),
        Decision::Local(ReserveOutcome::Admitted(_))
    ));
    assert_eq!((avail(&b, "rpm"), avail(&b, "tpm")), (rpm0 - 1, tpm0 - 500));
    let s = Settlement {
        actual_tokens: 120,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    match b.settle("r", &s, now + S) {
        Some(SettleOutcome::Settled {
            reserved,
            refunded,
            debt,
            ..
        }) => assert_eq!((reserved, refunded, debt), (500, 380, 0)),
        o => panic!("{o:?}"),
    }
    assert_eq!((avail(&b, "rpm"), avail(&b, "tpm")), (rpm0 - 1, tpm0 - 120));
    assert!(b.settle("r", &s, now + S).is_none(), "settled once");
}

#[test]
fn a_void_gives_back_every_unit_and_debt_is_charged_to_the_lease() {
    let (mut b, now) = leased_book();
    let avail = |b: &Book, n: &str| {
        b.outstanding()
            .find(|(s, _)| s.name.as_str() == n)
            .map(|(_, a)| a)
            .expect("leased")
    };
    let (rpm0, tpm0) = (avail(&b, "rpm"), avail(&b, "tpm"));
    b.reserve(&request("v", 300), now);
    let void = Settlement {
        actual_tokens: 0,
        upstream_failed: true,
        actual: Actual::Void,
    };
    b.settle("v", &void, now);
    assert_eq!((avail(&b, "rpm"), avail(&b, "tpm")), (rpm0, tpm0));
    b.reserve(&request("d", 300), now);
    let over = Settlement {
        actual_tokens: 450,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    match b.settle("d", &over, now) {
        Some(SettleOutcome::Settled { debt, .. }) => assert_eq!(debt, 150),
        o => panic!("{o:?}"),
    }
    assert_eq!(avail(&b, "tpm"), tpm0 - 450);
}

#[test]
fn extensions_come_from_the_lease_and_stop_at_what_it_holds() {
    let (mut b, now) = leased_book();
    let tpm = b
        .outstanding()
        .find(|(s, _)| s.name == BudgetName::Tpm)
        .map(|(_, a)| a)
        .expect("leased");
    b.reserve(&request("s", 100), now);
    match b.extend("s", &Step::tokens(50), now) {
        Some(ExtendOutcome::Extended { granted, .. }) => assert_eq!(granted, 50),
        o => panic!("{o:?}"),
    }
    let left = (tpm - 150) as u64;
    match b.extend("s", &Step::tokens(left + 10), now) {
        Some(ExtendOutcome::Extended { granted, .. }) => {
            assert_eq!(granted, left, "the largest amount the lease pays")
        }
        o => panic!("{o:?}"),
    }
    assert!(matches!(
        b.extend("s", &Step::tokens(1), now),
        Some(ExtendOutcome::Exhausted(_))
    ));
    assert!(
        b.extend("unknown", &Step::tokens(1), now).is_none(),
        "not a local hold"
    );
}

#[test]
fn an_expired_lease_is_not_spent_and_a_fenced_one_is_dropped() {
    let (mut b, now) = leased_book();
    // Past the lease's expiry minus the clock margin, with no renewal.
    let late = now + 5 * S;
    assert!(matches!(
        b.reserve(&request("late", 10), late),
        Decision::Store
    ));
    let (mut b2, now2) = leased_book();
    let calls = b2.due(now2 + S);
    let call = calls
        .into_iter()
        .next()
        .expect("reports due after an interval");
    let fenced: Vec<LeaseReply> = call
        .lines
        .iter()
        .map(|_| LeaseReply::Fenced {
            epoch: 2,
            now_micros: 0,
        })
        .collect();
    let applied = b2.apply(&call, Some(&fenced), now2 + S + 500);
    assert_eq!(applied.fenced, 2);
    assert_eq!(b2.leases(), 0);
    let _ = b.leases();
}

#[test]
fn a_failed_call_is_resent_with_the_same_lines() {
    let mut b = book();
    let mut now = 10 * S;
    for i in 0..60 {
        b.reserve(&request(&format!("w{i}"), 100), now);
        now += 1_000;
    }
    let first = b.due(now);
    b.apply(&first[0], None, now + 50_000);
    let again = b.due(now + S);
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].lines, first[0].lines,
        "same lease ids, same seq: idempotent"
    );
}

#[test]
fn a_policy_change_closes_the_lease_and_ends_it_once_its_holds_settle() {
    let (mut b, now) = leased_book();
    b.reserve(&request("h", 100), now);
    // A reload halves the rpm: requests now name the new policy.
    let mut r = request("n", 100);
    r.common[0] = spec(BudgetName::Rpm, 3_000);
    assert!(
        matches!(b.reserve(&r, now), Decision::Store),
        "the old lease is not spent under the new policy"
    );
    let calls = b.due(now + S);
    let rpm_line = calls
        .iter()
        .flat_map(|c| &c.lines)
        .find(|l| l.spec.name == BudgetName::Rpm)
        .expect("rpm line");
    assert!(!rpm_line.end, "a hold is still out");
    assert_eq!(
        rpm_line.spec.kind,
        BudgetKind::Bucket {
            per_minute: 6_000,
            burst: 6_000
        },
        "under the policy it was granted under"
    );
    let replies = grant_all(&calls[0], 1_800_000_000_000_000);
    b.apply(&calls[0], Some(&replies), now + S + 500);
    let s = Settlement {
        actual_tokens: 100,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    b.settle("h", &s, now + S + 600);
    let calls = b.due(now + 3 * S);
    let rpm_line = calls
        .iter()
        .flat_map(|c| &c.lines)
        .find(|l| l.spec.name == BudgetName::Rpm)
        .expect("rpm line");
    assert!(rpm_line.end, "ended once its reservations settled");
}

/// A reservation on one leased deployment budget, with a share claim or not.
fn upstream_request(id: &str, tokens: u64, share: bool) -> ReserveRequest {
    let mut up = spec(BudgetName::Tpm, 600_000);
    up.scope = Scope::Upstream("hot".into());
    up.key = "bg:{d}:v3:upstream:hot:tpm".into();
    ReserveRequest {
        common: Vec::new(),
        candidates: vec![vec![up]],
        share: share.then(|| crate::reserve::share::ShareClaim {
            tenant: "t".into(),
            rank: 1,
            weight: 1,
            order: None,
        }),
        ..request(id, tokens)
    }
}

#[test]
fn a_share_claim_a_deployment_lease_cannot_pay_goes_to_the_store() {
    let mut b = book();
    let mut now = 10 * S;
    for i in 0..60 {
        b.reserve(&upstream_request(&format!("warm{i}"), 100, false), now);
        now += 1_000;
    }
    let calls = b.due(now);
    assert_eq!(calls.len(), 1);
    let replies = grant_all(&calls[0], 1_800_000_000_000_000);
    b.apply(&calls[0], Some(&replies), now + 500);
    now += 1_000;
    assert!(
        matches!(
            b.reserve(&upstream_request("small", 100, true), now),
            Decision::Local(ReserveOutcome::Admitted(_))
        ),
        "a lease that pays decides a claim here: no store call added"
    );
    assert!(matches!(
        b.reserve(&upstream_request("big", 10_000_000, false), now),
        Decision::Local(ReserveOutcome::Denied(_))
    ));
    // The store weighs the claim against the fleet's waiters: a local
    // refusal would leave the deployment's share state blind to it.
    assert!(matches!(
        b.reserve(&upstream_request("big2", 10_000_000, true), now),
        Decision::Store
    ));
}
