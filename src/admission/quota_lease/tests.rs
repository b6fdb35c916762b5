//! The book on its own: its decisions and plans, with the store's replies
//! written by hand (the stores' side is tested in `tests/it/lease_*`, the
//! two together by the fleet simulation).

use std::sync::Arc;
use std::time::Duration;

use super::book::{Book, Decision, LeaseOff};
use super::local_hold::{Extension, StoreStep};
use super::plan::Call;
use crate::budget::quota_lease::{LeaseReply, LeaseState};
use crate::budget::{
    Actual, BudgetKind, BudgetName, BudgetSpec, Costs, ExtendOutcome, Requester, ReserveOutcome,
    ReserveRequest, Scope, SettleOutcome, Settlement, Step,
};
use crate::config::store::LeasePolicy;

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
        slot_lease_micros: 5 * S,
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
                recall: false,
            })
        })
        .collect()
}

/// The tokens an extension decided from the leases granted.
fn extended(e: Option<Extension>) -> u64 {
    match e {
        Some(Extension::Done(ExtendOutcome::Extended { granted, .. })) => granted,
        Some(Extension::Done(o)) => panic!("{o:?}"),
        Some(Extension::Short) => panic!("the leases are short"),
        None => panic!("not a local hold"),
    }
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
    assert_eq!(extended(b.extend("s", &Step::tokens(50), now)), 50);
    let left = (tpm - 150) as u64;
    assert_eq!(
        extended(b.extend("s", &Step::tokens(left + 10), now)),
        left,
        "the largest amount the lease pays"
    );
    assert!(matches!(
        b.extend("s", &Step::tokens(1), now),
        Some(Extension::Short)
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
        share: share.then(|| crate::budget::share::ShareClaim {
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

/// The store's answer to a call that grants nothing new: each lease keeps
/// what it was granted, less the line's give back.
fn keep_all(b: &Book, call: &Call, now_utc: u64) -> Vec<LeaseReply> {
    call.lines
        .iter()
        .map(|line| {
            let (granted, given_back) = b
                .entries
                .get(&*line.spec.key)
                .and_then(|e| e.lease.as_ref())
                .map_or((0, 0), |l| (l.granted, l.given_back));
            LeaseReply::Live(LeaseState {
                epoch: 1,
                granted,
                given_back: given_back + line.give_back,
                granted_now: 0,
                expires_at_micros: now_utc + line.ttl_micros,
                now_micros: now_utc,
                free: 1_000,
                window: None,
                recall: false,
            })
        })
        .collect()
}

/// An end user's tpm budget: one key per end user.
fn end_user_request(id: &str, user: u64) -> ReserveRequest {
    let mut s = spec(BudgetName::Tpm, 60_000);
    s.scope = Scope::EndUser("hot".into(), format!("{user:032x}").into());
    s.key = format!("bg:{{d}}:v3:end_user:hot:{user:032x}:tpm").into();
    ReserveRequest {
        common: vec![s],
        ..request(id, 10)
    }
}

/// Fault: the book kept an entry for every budget key
/// it ever saw, so 100,000 end users cost ≈188 MB, never freed. An idle
/// sweep interval later only what has a lease, a hold or recent demand is
/// kept; then nothing.
#[test]
fn idle_budgets_are_swept_and_leased_held_or_asked_ones_kept() {
    let (mut b, now) = leased_book();
    assert!(matches!(
        b.reserve(&request("held", 100), now),
        Decision::Local(ReserveOutcome::Admitted(_))
    ));
    for user in 0..200_000 {
        assert!(matches!(
            b.reserve(&end_user_request(&format!("u{user}"), user), now),
            Decision::Store
        ));
    }
    assert_eq!(b.entries(), 200_002);
    // One end user keeps asking; the others go away.
    let later = now + super::book::SWEEP_EVERY;
    b.reserve(&end_user_request("again", 7), later - S / 2);
    b.due(later);
    assert_eq!(
        b.entries(),
        3,
        "the two budgets of the hold (their leases) and the end user asked"
    );
    // The hold settles and everybody stops asking: nothing is kept once
    // the leases are gone.
    let s = Settlement {
        actual_tokens: 100,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    assert!(b.settle("held", &s, later).is_some());
    let mut t = later;
    for _ in 0..3 {
        t += super::book::SWEEP_EVERY;
        let calls = b.due(t);
        for call in calls {
            let ended: Vec<LeaseReply> = call
                .lines
                .iter()
                .map(|_| LeaseReply::Ended {
                    given_back: 0,
                    now_micros: 0,
                })
                .collect();
            b.apply(&call, Some(&ended), t);
        }
    }
    assert_eq!(b.leases(), 0);
    assert_eq!(b.entries(), 0);
}

/// `budgetgate_quota_lease_book_entries` as the gateway's keeper sets it, read
/// from the exposition (paused tokio time is the injected clock).
#[tokio::test(start_paused = true)]
async fn the_book_entries_gauge_follows_the_sweep() {
    use crate::budget::memory::MemoryStore;
    let gauge = || {
        let text = crate::metrics::render();
        text.lines()
            .find_map(|l| l.strip_prefix("budgetgate_quota_lease_book_entries "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("gauge exported")
    };
    crate::metrics::install();
    let store = Arc::new(MemoryStore::new(Arc::new(crate::clock::ManualClock::new(
        1_800_000_000_000_000,
    ))));
    let leases = super::QuotaLeases::new(
        &LeasePolicy::default(),
        LeaseOff::default(),
        store,
        Duration::from_millis(50),
        "g1",
    );
    for user in 0..200_000 {
        assert!(matches!(
            leases.reserve(&end_user_request(&format!("u{user}"), user)),
            Decision::Store
        ));
    }
    leases.round().await;
    assert_eq!(gauge(), 200_000.0);
    tokio::time::advance(Duration::from_micros(super::book::SWEEP_EVERY)).await;
    leases.round().await;
    assert_eq!(gauge(), 0.0, "an idle sweep interval later");
}

/// A hold on both leases of `leased_book`, and the tpm lease's key.
fn stream(b: &mut Book, now: u64) {
    assert!(matches!(
        b.reserve(&request("stream", 100), now),
        Decision::Local(ReserveOutcome::Admitted(_))
    ));
}

/// Fault: a 300-token leased stream was cut off at 208
/// tokens when the tenant's other traffic stopped: demand fell, the lease
/// closed, and a closing lease paid no extension though it held the units.
/// Once it has given them back, the step is reserved exactly in the store.
#[test]
fn a_closing_lease_pays_its_streams_then_the_store_does() {
    let (mut b, now) = leased_book();
    stream(&mut b, now);
    let quiet = now + 2 * S;
    let calls = b.due(quiet);
    let tpm = calls
        .iter()
        .flat_map(|c| &c.lines)
        .find(|l| l.spec.name == BudgetName::Tpm)
        .expect("tpm line");
    assert!(tpm.give_back > 0 && !tpm.end, "closing: {tpm:?}");
    assert_eq!(extended(b.extend("stream", &Step::tokens(50), quiet)), 50);
    for call in &calls {
        let replies = keep_all(&b, call, 1_800_000_000_000_000);
        b.apply(call, Some(&replies), quiet + 500);
    }
    assert!(matches!(
        b.extend("stream", &Step::tokens(50), quiet + S / 10),
        Some(Extension::Short)
    ));
    match b.overflow_step("stream", &Step::tokens(50)) {
        Some(StoreStep::Reserve(r)) => {
            assert_eq!(r.id, "stream.x1");
            assert_eq!(r.common.len(), 1, "the token budget only");
            assert_eq!(r.common[0].name, BudgetName::Tpm);
            assert_eq!(r.costs.of(0, 0, &r.common[0]), 50);
        }
        o => panic!("{o:?}"),
    }
}

/// Fault: a reload lowering the limit a stream's lease
/// was granted under (tpm 1,000,000 → 900,000) cut it off at 112 tokens:
/// the lease, no longer under the budget's policy, paid nothing.
#[test]
fn a_lease_under_the_old_policy_pays_its_streams() {
    let (mut b, now) = leased_book();
    stream(&mut b, now);
    let mut lowered = request("n", 100);
    lowered.common[1] = spec(BudgetName::Tpm, 540_000);
    assert!(matches!(b.reserve(&lowered, now), Decision::Store));
    assert_eq!(extended(b.extend("stream", &Step::tokens(50), now)), 50);
}

/// A stream paying two token budgets (the tenant's and its key's): a
/// reload lowering the key's limit must not cut it off either.
#[test]
fn a_reload_of_another_limit_of_the_stream_leaves_it_paid() {
    let key_tpm = |per_minute| BudgetSpec {
        scope: Scope::Key("hot".into(), "k".into()),
        key: "bg:{d}:v3:key:hot:k:tpm".into(),
        ..spec(BudgetName::Tpm, per_minute)
    };
    let two = |id: &str, per_minute| {
        let mut r = request(id, 100);
        r.common.push(key_tpm(per_minute));
        r
    };
    let mut b = book();
    let mut now = 10 * S;
    for i in 0..60 {
        b.reserve(&two(&format!("w{i}"), 600_000), now);
        now += 1_000;
    }
    let calls = b.due(now);
    let replies = grant_all(&calls[0], 1_800_000_000_000_000);
    b.apply(&calls[0], Some(&replies), now + 500);
    assert_eq!(b.leases(), 3);
    assert!(matches!(
        b.reserve(&two("stream", 600_000), now + 1_000),
        Decision::Local(ReserveOutcome::Admitted(_))
    ));
    assert!(matches!(
        b.reserve(&two("n", 300_000), now + 2_000),
        Decision::Store
    ));
    assert_eq!(
        extended(b.extend("stream", &Step::tokens(50), now + 3_000)),
        50
    );
}

/// A lease that stops suiting its budget (one report interval of demand
/// no longer fits `max_fraction`) closes; its streams are still paid.
#[test]
fn an_outgrown_lease_pays_its_streams() {
    let (mut b, now) = leased_book();
    stream(&mut b, now);
    for i in 0..4 {
        // Far beyond the lease: refused here, but demand all the same.
        b.reserve(&request(&format!("big{i}"), 100_000), now + 1_000);
    }
    let calls = b.due(now + S / 4);
    assert!(
        calls
            .iter()
            .flat_map(|c| &c.lines)
            .any(|l| l.spec.name == BudgetName::Tpm && l.give_back > 0),
        "outgrown: closing, its free units going back"
    );
    assert_eq!(
        extended(b.extend("stream", &Step::tokens(50), now + S / 4 + 1_000)),
        50
    );
}

/// Fault: once a leased stream's closing lease had
/// given its units back, the stream was cut off with budget left. Its step
/// is now an exact store reservation, and the settlement charges that
/// reservation what the stream used beyond the lease (refunding the rest
/// in the store).
#[tokio::test(start_paused = true)]
async fn a_step_no_lease_pays_is_reserved_and_settled_in_the_store() {
    use crate::admission::deny::AnsweredBy;

    use crate::budget::memory::MemoryStore;
    use crate::budget::BudgetStore;
    use crate::clock::ManualClock;

    let clock = ManualClock::new(1_800_000_000_000_000);
    let mem = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let leases = Arc::new(super::QuotaLeases::new(
        &LeasePolicy::default(),
        LeaseOff::default(),
        mem.clone(),
        Duration::from_millis(50),
        "g1",
    ));
    let inner: Arc<dyn BudgetStore> = mem.clone();
    let gw = gateway_store(inner, &clock, &leases);
    let used = |tokens| Settlement {
        actual_tokens: tokens,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    for i in 0..60 {
        let r = request(&format!("w{i}"), 100);
        gw.reserve(&r).await.expect("reserve");
        gw.settle(&r.id, &used(100)).await.expect("settle");
    }
    leases.round().await;
    assert_eq!(leases.leases(), 2);
    let (o, by) = gw
        .reserve_answered(&request("stream", 100))
        .await
        .expect("reserve");
    assert!(matches!(o, ReserveOutcome::Admitted(_)));
    assert!(matches!(by, AnsweredBy::Lease));
    // The tenant's other traffic stops: the leases close and give back
    // what no stream holds.
    tokio::time::advance(Duration::from_secs(2)).await;
    clock.advance(2 * S);
    leases.round().await;
    assert_eq!(leases.leased_units("bg:{d}:v3:tenant:hot:tpm"), Some(0));
    let tpm = spec(BudgetName::Tpm, 600_000);
    let remaining = || mem.inspect_sync(std::slice::from_ref(&tpm))[0].remaining;
    let before = remaining();
    match gw
        .extend("stream", &Step::tokens(50))
        .await
        .expect("extend")
    {
        ExtendOutcome::Extended { granted, .. } => assert_eq!(granted, 50),
        o => panic!("cut off: {o:?}"),
    }
    let reserved = remaining();
    assert_eq!(before - reserved, 50, "reserved in the store");
    // 120 used: 100 the lease paid, 20 of the store's 50.
    match gw.settle("stream", &used(120)).await.expect("settle") {
        SettleOutcome::Settled {
            reserved,
            refunded,
            debt,
            ..
        } => assert_eq!((reserved, refunded, debt), (150, 30, 0)),
        o => panic!("{o:?}"),
    }
    assert_eq!(remaining() - reserved, 30, "refunded in the store");
    assert_eq!(mem.live_holds(), 0, "the store's reservation settled");
}

/// Fault: a fenced concurrency lease forgot its slot
/// members while its requests ran on (90 upstream requests in flight under
/// `max_concurrent = 88`). The gateway leases the slots again for them, so
/// the store counts them once the old members expire.
#[test]
fn slots_of_a_fenced_concurrency_lease_are_leased_again_for_its_requests() {
    use crate::budget::memory::MemoryStore;
    use crate::clock::ManualClock;

    const T0: u64 = 1_800_000_000_000_000;
    let slots = |max| BudgetSpec {
        key: "bg:{d}:v3:tenant:hot:max_concurrent".into(),
        kind: BudgetKind::Concurrency { max },
        ..spec(BudgetName::MaxConcurrent, 0)
    };
    let req = |id: &str, max| ReserveRequest {
        common: vec![slots(max)],
        slot_lease_micros: 600 * S,
        hold_ttl_micros: 600 * S,
        ..request(id, 1)
    };
    let clock = ManualClock::new(T0);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let p = LeasePolicy {
        min_rate: 1,
        ..LeasePolicy::default()
    };
    let mut a = Book::new(
        super::settings(&p, Duration::from_millis(50)),
        LeaseOff::default(),
        "a",
    );
    // The book's monotonic clock is the store's minus T0.
    let round = |a: &mut Book, t: u64| {
        clock.set(T0 + t);
        for call in a.due(t) {
            let replies = store.lease_sync(&call.lines);
            a.apply(&call, Some(&replies), t);
        }
    };
    // Gateway A leases the slots under max 100 and runs 20 long requests.
    let mut t = 10 * S;
    let mut running = 0;
    let mut n = 0;
    while running < 20 && t < 30 * S {
        n += 1;
        if let Decision::Local(ReserveOutcome::Admitted(_)) =
            a.reserve(&req(&format!("r{n}"), 100), t)
        {
            running += 1;
            continue;
        }
        t += 130_000;
        round(&mut a, t);
    }
    assert_eq!(running, 20);
    // A reload to 88 slots: gateway B's first lease under it bumps the
    // budget's epoch; A sees the new policy too (its lease closes).
    let b_lease = crate::budget::quota_lease::LeaseLine {
        spec: slots(88),
        lease: "b.1".into(),
        seq: 1,
        epoch: 0,
        want: 2,
        give_back: 0,
        spent: 0,
        end: false,
        ttl_micros: 600 * S,
        record_ttl_micros: 600 * S,
    };
    let b_granted = match &store.lease_sync(&[b_lease])[0] {
        LeaseReply::Live(st) => st.granted,
        o => panic!("{o:?}"),
    };
    assert!(matches!(a.reserve(&req("new", 88), t), Decision::Store));
    // A's next report is fenced; its requests run on for a minute.
    let end = t + 60 * S;
    let mut fenced = false;
    while t < end {
        t += 100_000;
        let before = a.leases();
        round(&mut a, t);
        fenced |= before > a.leases();
    }
    assert!(fenced, "A's lease was fenced");
    // Gateway B takes every slot the store still has.
    let mut b_running = 0;
    while let ReserveOutcome::Admitted(_) = store.reserve_sync(&req(&format!("b{b_running}"), 88)) {
        b_running += 1;
    }
    let fleet = running + b_running + b_granted;
    assert!(
        fleet <= 88,
        "{running} on A, {b_running} exact and {b_granted} leased on B: {fleet} in flight"
    );
}

/// A hold is extended, renewed and settled where it
/// was admitted. Over 1,000 store-admitted requests with leases on, no
/// hold takes the book's lock (deciding a reservation still does: the book
/// counts the demand); a leased hold takes it exactly once per settle,
/// extend and renew.
#[tokio::test(start_paused = true)]
async fn a_hold_goes_where_it_was_admitted_and_takes_the_book_lock_only_if_leased() {
    use crate::admission::deny::AnsweredBy;
    use crate::admission::{HeldReservation, SettlementTracker};

    use crate::budget::memory::MemoryStore;
    use crate::budget::BudgetStore;
    use crate::clock::ManualClock;
    use crate::settlement::{Outcome, Settling};

    let clock = ManualClock::new(1_800_000_000_000_000);
    let mem = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let leases = Arc::new(super::QuotaLeases::new(
        &LeasePolicy::default(),
        LeaseOff::default(),
        mem.clone(),
        Duration::from_millis(50),
        "g1",
    ));
    let inner: Arc<dyn BudgetStore> = mem.clone();
    let gw = Arc::new(gateway_store(inner, &clock, &leases));
    let tracker = SettlementTracker::default();
    let hold = |id: &str, at| {
        HeldReservation::new(
            id.to_string(),
            (gw.clone(), at),
            std::iter::empty(),
            tracker.clone(),
            100,
            Duration::from_secs(5),
            Duration::from_secs(1),
        )
    };
    let used = |tokens| {
        Settling::of(
            Settlement {
                actual_tokens: tokens,
                upstream_failed: false,
                actual: Actual::Tokens,
            },
            Outcome::Answered,
        )
    };
    // No round is run: the budgets are hot, but no lease is granted yet.
    for i in 0..1_000 {
        let r = request(&format!("s{i}"), 100);
        let (o, by) = gw.reserve_answered(&r).await.expect("reserve");
        assert!(matches!(o, ReserveOutcome::Admitted(_)));
        assert_eq!(by, AnsweredBy::Store);
        let mut h = hold(&r.id, by);
        if i % 10 == 0 {
            h.extend(&Step::tokens(10)).await.expect("extend");
        }
        h.settle(used(100));
    }
    tracker.wait_idle().await;
    assert_eq!(tracker.settled(), 1_000);
    assert_eq!(
        leases.hold_locks(),
        0,
        "a store-admitted hold asked the book"
    );

    leases.round().await;
    assert_eq!(leases.leases(), 2);
    let r = request("leased", 100);
    let (o, by) = gw.reserve_answered(&r).await.expect("reserve");
    assert!(matches!(o, ReserveOutcome::Admitted(_)));
    assert_eq!(by, AnsweredBy::Lease);
    let mut h = hold(&r.id, by);
    let before = leases.hold_locks();
    h.extend(&Step::tokens(10)).await.expect("extend");
    assert_eq!(leases.hold_locks() - before, 1, "one lock per extend");
    let before = leases.hold_locks();
    gw.renewal_store(by).renew(&r.id).await.expect("renew");
    assert_eq!(leases.hold_locks() - before, 1, "one lock per renew");
    let before = leases.hold_locks();
    h.settle(used(100));
    tracker.wait_idle().await;
    assert_eq!(leases.hold_locks() - before, 1, "one lock per settle");
    assert_eq!(tracker.settled(), 1_001);
}

/// A lease store whose calls take 10 ms, except those of domain `{dead}`
/// (a primary failing over), which never answer; it notes when each call
/// started.
struct OneDomainDown {
    mem: Arc<crate::budget::memory::MemoryStore>,
    started: std::sync::Mutex<Vec<tokio::time::Instant>>,
}

#[async_trait::async_trait]
impl crate::budget::quota_lease::LeaseStore for OneDomainDown {
    async fn lease(
        &self,
        lines: &[crate::budget::quota_lease::LeaseLine],
    ) -> Result<Vec<LeaseReply>, crate::budget::StoreError> {
        self.started
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        if lines.iter().any(|l| l.spec.key.contains("{dead}")) {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.mem.lease(lines).await
    }
    async fn leased_out(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<Vec<crate::budget::quota_lease::LeasedOut>, crate::budget::StoreError> {
        self.mem.leased_out(specs).await
    }
}

/// `request` of tenant `tenant` whose budgets lie in domain `tag`.
fn request_in(id: &str, tenant: &str, tag: &str) -> ReserveRequest {
    let mut r = request(id, 100);
    for s in &mut r.common {
        s.scope = Scope::Tenant(tenant.into());
        s.key = format!("bg:{{{tag}}}:v3:tenant:{tenant}:{}", s.name.as_str()).into();
    }
    r
}

/// A lease round over three domains, one of whose primary never answers:
/// every domain's call goes out at once, and the others' grants are
/// applied while the dead domain's call still waits out its timeout.
#[tokio::test(start_paused = true)]
async fn a_lease_round_fails_apart_by_domain() {
    use crate::budget::memory::MemoryStore;
    use crate::budget::BudgetStore;
    use crate::clock::ManualClock;

    let clock = ManualClock::new(1_800_000_000_000_000);
    let mem = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let store = Arc::new(OneDomainDown {
        mem: mem.clone(),
        started: std::sync::Mutex::new(Vec::new()),
    });
    let leases = Arc::new(super::QuotaLeases::new(
        &LeasePolicy::default(),
        LeaseOff::default(),
        store.clone(),
        Duration::from_secs(5),
        "g1",
    ));
    let inner: Arc<dyn BudgetStore> = mem.clone();
    let gw = gateway_store(inner, &clock, &leases);
    let used = Settlement {
        actual_tokens: 100,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    for (tenant, tag) in [("a", "dead"), ("b", "live1"), ("c", "live2")] {
        for i in 0..60 {
            let r = request_in(&format!("{tenant}{i}"), tenant, tag);
            gw.reserve(&r).await.expect("reserve");
            gw.settle(&r.id, &used).await.expect("settle");
        }
    }
    let round = tokio::spawn({
        let leases = leases.clone();
        async move { leases.round().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!round.is_finished(), "the dead domain's call still waits");
    let started = store.started.lock().unwrap().clone();
    assert_eq!(started.len(), 3, "one call per domain");
    assert!(
        started.iter().all(|&t| t == started[0]),
        "every domain's call went out at once: {started:?}"
    );
    for tenant_tag in ["b:{live1}", "c:{live2}"] {
        let (tenant, tag) = tenant_tag.split_once(':').unwrap();
        let key = format!("bg:{tag}:v3:tenant:{tenant}:tpm");
        assert!(
            leases.leased_units(&key).is_some_and(|u| u > 0),
            "{key} leased while {{dead}} waits"
        );
    }
    assert_eq!(leases.leases(), 4, "rpm and tpm of the two live tenants");
    round.await.expect("round");
    assert_eq!(leases.leases(), 4, "the dead domain's lines failed alone");
}

/// The keeper goes on planning while a dead domain's lease call waits
/// out its timeout: a tenant of another domain that becomes hot meanwhile
/// gets its lease within a few ticks, not after the timeout.
#[tokio::test(start_paused = true)]
async fn the_keeper_serves_other_domains_while_a_call_waits_on_a_dead_one() {
    use crate::budget::memory::MemoryStore;
    use crate::budget::BudgetStore;
    use crate::clock::ManualClock;

    let clock = ManualClock::new(1_800_000_000_000_000);
    let mem = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let store = Arc::new(OneDomainDown {
        mem: mem.clone(),
        started: std::sync::Mutex::new(Vec::new()),
    });
    let leases = Arc::new(super::QuotaLeases::new(
        &LeasePolicy::default(),
        LeaseOff::default(),
        store.clone(),
        Duration::from_secs(5),
        "g1",
    ));
    let inner: Arc<dyn BudgetStore> = mem.clone();
    let gw = gateway_store(inner, &clock, &leases);
    let used = Settlement {
        actual_tokens: 100,
        upstream_failed: false,
        actual: Actual::Tokens,
    };
    let keeper = leases.spawn_keeper();
    for i in 0..60 {
        let r = request_in(&format!("a{i}"), "a", "dead");
        gw.reserve(&r).await.expect("reserve");
        gw.settle(&r.id, &used).await.expect("settle");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.started.lock().unwrap().len(), 1, "the dead call sent");
    for i in 0..60 {
        let r = request_in(&format!("b{i}"), "b", "live1");
        gw.reserve(&r).await.expect("reserve");
        gw.settle(&r.id, &used).await.expect("settle");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        leases
            .leased_units("bg:{live1}:v3:tenant:b:tpm")
            .is_some_and(|u| u > 0),
        "leased while the dead domain's call waits"
    );
    keeper.abort();
}

/// The gateway's store over `inner` with `leases`: a deny cache, and a
/// local limiter of its own for a failing store, both on `clock`.
pub(super) fn gateway_store(
    inner: Arc<dyn crate::budget::BudgetStore>,
    clock: &crate::clock::ManualClock,
    leases: &Arc<super::QuotaLeases>,
) -> crate::admission::GatewayStore {
    use crate::admission::deny::DenyCachedStore;
    use crate::budget::deny_cache::DenyCache;
    use crate::budget::memory::MemoryStore;
    crate::admission::GatewayStore::new(
        DenyCachedStore::new(
            inner,
            Arc::new(DenyCache::with_capacity(16)),
            Arc::new(clock.clone()),
        ),
        Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
        1.0,
    )
    .with_leases(leases.clone())
}
