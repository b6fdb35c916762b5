//! Retried calls after a lost reply apply exactly once (DESIGN section 3:
//! "A retried call with the same id never double-debits or double-refunds").
//!
//! The lost reply is real: `CLIENT PAUSE … WRITE` holds the script in the
//! server while the store's call times out and drops its future; the script
//! then runs, its reply goes nowhere, and the caller retries. The same
//! pause shows that a call which times out while waiting for a batch was
//! never sent, so it is never applied.
//!
//! Run: `cargo test --test it redis_retry::` (needs `redis-server`; uses Redis
//! `TIME`, not a test clock).

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveOutcome, ReserveRequest, Scope,
    SettleOutcome, Settlement, StoreError,
};

fn spec(ks: &KeySpace) -> BudgetSpec {
    let scope = Scope::Tenant("acme".into());
    BudgetSpec {
        key: ks.budget(&scope, BudgetName::Tpm).into(),
        scope,
        name: BudgetName::Tpm,
        // 1 token per minute of refill: the test's few seconds refill nothing
        // measurable, so remaining counts are exact.
        kind: BudgetKind::Bucket {
            per_minute: 1,
            burst: 1000,
        },
        refund_unused: true,
        shadow: false,
    }
}

fn request(ks: &KeySpace, id: &str, tokens: u64) -> ReserveRequest {
    ReserveRequest {
        share: None,
        id: id.into(),
        costs: budgetgate::budget::Costs::tokens(tokens),
        common: vec![spec(ks)],
        candidates: vec![vec![]],
        slot_lease_micros: 30_000_000,
        hold_ttl_micros: 600_000_000,
        requester: Default::default(),
    }
}

/// Reserves `tokens` for `id` and asserts the store admitted it.
async fn admit(store: &RedisStore, ks: &KeySpace, id: &str, tokens: u64) {
    let outcome = store.reserve(&request(ks, id, tokens)).await;
    assert!(
        matches!(outcome, Ok(ReserveOutcome::Admitted(_))),
        "reserve {id}: {outcome:?}"
    );
}

async fn remaining(store: &RedisStore, ks: &KeySpace) -> i64 {
    store.inspect(&[spec(ks)]).await.expect("inspect")[0].remaining
}

/// Waits (up to 5 s) until `ready` holds. A paused Redis resumes late by up
/// to one `serverCron` tick (100 ms at the default `hz 10`) plus whatever the
/// machine's load adds, so tests wait for the effect instead of sleeping a
/// fixed time past the pause.
async fn wait_until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !ready().await {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the reservation `id` has a hold in Redis (reads are not paused).
fn hold_exists(server: &RedisServer, ks: &KeySpace, id: &str) -> bool {
    server.cli(&["exists", &ks.hold(id)]).trim() == "1"
}

/// A fresh `redis-server`, a key space with `prefix`, and a store on it
/// whose calls time out after `timeout`.
async fn start(prefix: &str, timeout: Duration) -> (RedisServer, KeySpace, RedisStore) {
    let server = RedisServer::start();
    let ks = KeySpace::new(prefix, "d");
    let store = connect(&server, &ks, timeout).await;
    (server, ks, store)
}

/// A store on `server` whose calls time out after `timeout`.
async fn connect(server: &RedisServer, ks: &KeySpace, timeout: Duration) -> RedisStore {
    RedisStore::connect(&server.url(), timeout, ks.clone())
        .await
        .expect("connect")
}

/// Pauses writes (scripts count as writes) on `server` for `ms`.
fn pause_writes(server: &RedisServer, ms: u64) {
    let out = server.cli(&["client", "pause", &ms.to_string(), "write"]);
    assert!(out.contains("OK"), "CLIENT PAUSE failed: {out}");
}

#[tokio::test]
async fn settle_twice_and_after_a_lost_reply_refunds_exactly_once() {
    let (server, ks, store) = start("bgretry", Duration::from_secs(5)).await;
    // Same Redis, a timeout short enough to lose replies on purpose.
    let hasty = connect(&server, &ks, Duration::from_millis(150)).await;

    let s = Settlement {
        actual_tokens: 100,
        upstream_failed: false,
        actual: budgetgate::budget::Actual::Tokens,
    };

    // Plain retry: the second settle changes nothing.
    admit(&store, &ks, "a", 400).await;
    assert_eq!(remaining(&store, &ks).await, 600);
    assert!(matches!(
        store.settle("a", &s).await,
        Ok(SettleOutcome::Settled { refunded: 300, .. })
    ));
    assert_eq!(
        store.settle("a", &s).await.ok(),
        Some(SettleOutcome::AlreadySettled)
    );
    assert_eq!(remaining(&store, &ks).await, 900);

    // Lost reply: the settle is applied but its caller sees a timeout.
    admit(&store, &ks, "b", 400).await;
    assert_eq!(remaining(&store, &ks).await, 500);
    pause_writes(&server, 500);
    let lost = hasty.settle("b", &s).await;
    assert!(matches!(lost, Err(StoreError::Timeout)), "got {lost:?}");
    wait_until("the lost settle was applied", || async {
        remaining(&store, &ks).await == 800
    })
    .await;
    // The caller retries (from this process or another): nothing more happens.
    assert_eq!(
        hasty.settle("b", &s).await.ok(),
        Some(SettleOutcome::AlreadySettled)
    );
    assert_eq!(
        store.settle("b", &s).await.ok(),
        Some(SettleOutcome::AlreadySettled)
    );
    assert_eq!(remaining(&store, &ks).await, 800, "refunded exactly once");
}

#[tokio::test]
async fn reserve_after_a_lost_reply_debits_once() {
    let (server, ks, store) = start("bgretry", Duration::from_secs(5)).await;
    let hasty = connect(&server, &ks, Duration::from_millis(150)).await;
    // Load the script first: a lost *first* call would come back NOSCRIPT
    // after the pause and apply nothing, which is safe but not this test.
    admit(&hasty, &ks, "warm", 0).await;
    pause_writes(&server, 500);
    let lost = hasty.reserve(&request(&ks, "r", 300)).await;
    assert!(matches!(lost, Err(StoreError::Timeout)), "got {lost:?}");
    // The retry must come after the lost call ran: once the pause ends,
    // Redis serves the two connections' queued calls in no promised order.
    wait_until("the lost reserve was applied", || async {
        hold_exists(&server, &ks, "r")
    })
    .await;
    match store.reserve(&request(&ks, "r", 300)).await {
        Ok(ReserveOutcome::Admitted(a)) => assert!(a.replayed, "the retry replays"),
        other => panic!("expected a replayed admission, got {other:?}"),
    }
    assert_eq!(remaining(&store, &ks).await, 700, "debited exactly once");
    // The process that lost the reply settles by id without knowing the keys.
    assert!(matches!(
        hasty
            .settle(
                "r",
                &Settlement {
                    actual_tokens: 0,
                    upstream_failed: false,
                    actual: budgetgate::budget::Actual::Tokens,
                }
            )
            .await,
        Ok(SettleOutcome::Settled { refunded: 300, .. })
    ));
    assert_eq!(remaining(&store, &ks).await, 1000);
}

#[tokio::test]
async fn scripts_flushed_from_redis_are_loaded_again_and_apply_once() {
    let (server, ks, store) = start("bgflush", Duration::from_secs(5)).await;
    admit(&store, &ks, "a", 100).await;
    // As after a Redis restart or failover: the script cache is empty.
    assert!(server.cli(&["script", "flush"]).contains("OK"));
    admit(&store, &ks, "b", 100).await;
    server.cli(&["script", "flush"]);
    let s = Settlement {
        actual_tokens: 40,
        upstream_failed: false,
        actual: budgetgate::budget::Actual::Tokens,
    };
    assert!(matches!(
        store.settle("b", &s).await,
        Ok(SettleOutcome::Settled { refunded: 60, .. })
    ));
    server.cli(&["script", "flush"]);
    assert_eq!(remaining(&store, &ks).await, 1000 - 100 - 40);
}

/// Calls that arrive while two batches are on the wire wait for the next
/// batch; one whose deadline passes while it waits is failed without being
/// sent. So of calls that all time out, only those that were on the wire
/// can have been applied once Redis runs them; the others never are.
#[tokio::test]
async fn calls_that_time_out_waiting_for_a_batch_are_never_applied() {
    let (server, ks, hasty) = start("bgqueue", Duration::from_millis(300)).await;
    // Load the scripts and create the bucket first.
    admit(&hasty, &ks, "warm", 1).await;
    let before = hasty.batch_counts();

    pause_writes(&server, 1500);
    let reqs: Vec<ReserveRequest> = (0..5).map(|i| request(&ks, &format!("q{i}"), 10)).collect();
    let results = futures_util::future::join_all(reqs.iter().map(|r| hasty.reserve(r))).await;
    for (i, r) in results.iter().enumerate() {
        assert!(
            matches!(r, Err(StoreError::Timeout) | Err(StoreError::NotSent(_))),
            "q{i}: {r:?}"
        );
    }
    // The calls that never left say so (they need no compensation).
    let unsent = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::NotSent(_))))
        .count();
    assert_eq!(unsent, 3, "{results:?}");
    let after = hasty.batch_counts();
    assert_eq!(
        (after.batches - before.batches, after.items - before.items),
        (2, 2),
        "two calls went at once, the other three waited and expired unsent"
    );

    // Once the pause ends, the two sent scripts run; wait for them (reads
    // are not paused), then check which reservations exist.
    wait_until("the two sent reservations ran", || async {
        hold_exists(&server, &ks, "q0") && hold_exists(&server, &ks, "q1")
    })
    .await;
    for id in ["q2", "q3", "q4"] {
        assert!(!hold_exists(&server, &ks, id), "{id} was applied");
    }
    let store = connect(&server, &ks, Duration::from_secs(5)).await;
    assert_eq!(remaining(&store, &ks).await, 1000 - 1 - 2 * 10);
}

/// A batch waits for the latest deadline of its calls, not the earliest: a
/// call about to expire must not time out the fresh calls sent beside it
/// (they would fail although Redis applies them a moment later).
#[tokio::test]
async fn a_call_near_its_deadline_does_not_time_out_the_fresh_calls_in_its_batch() {
    let (server, ks, store) = start("bgdeadline", Duration::from_millis(1500)).await;
    admit(&store, &ks, "warm", 1).await;

    // t = 0: Redis holds scripts for 1.9 s; two calls go on the wire and
    // time out at 1.5 s. Call a queues at 0.1 s (deadline 1.6 s), call b at
    // 0.7 s (deadline 2.2 s); both go together at 1.5 s, and Redis answers
    // them at ~1.9 s: after a's deadline, before b's. The margins are wide
    // because a pause ends up to one `serverCron` tick late and a loaded CI
    // machine adds more; b must still queue well before the wire calls
    // give up, or it would go in a batch of its own.
    pause_writes(&server, 1900);
    let wire_reqs = [request(&ks, "w0", 10), request(&ks, "w1", 10)];
    let on_wire = futures_util::future::join_all(wire_reqs.iter().map(|r| store.reserve(r)));
    let a = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.reserve(&request(&ks, "a", 10)).await
    };
    let b = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        store.reserve(&request(&ks, "b", 10)).await
    };
    let (wire, a, b) = tokio::join!(on_wire, a, b);
    for r in &wire {
        assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
    }
    assert!(
        matches!(b, Ok(ReserveOutcome::Admitted(_))),
        "fresh call: {b:?}"
    );
    assert!(
        matches!(a, Ok(ReserveOutcome::Admitted(_))),
        "late answer, still an answer: {a:?}"
    );
}
