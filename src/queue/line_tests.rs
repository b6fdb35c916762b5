use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::*;

fn entry(class: Class, tenant: &str, weight: u64, cost: u64, joined: Instant) -> Entry {
    Entry {
        class,
        tenant: tenant.into(),
        weight,
        cost,
        joined,
        tried: false,
        wake: Arc::new(Notify::new()),
    }
}

/// Runs the line as its waiters would at `now`: the holder of the turn
/// is admitted; returns who.
fn admit_next(line: &mut Line, now: Instant) -> Option<u64> {
    let id = line.turn?.id;
    assert!(line.begin(id, now), "the holder may start at once");
    line.admitted(id, now);
    Some(id)
}

#[test]
fn a_higher_class_goes_first_whatever_the_arrival_order() {
    let now = Instant::now();
    let mut line = Line::new(None);
    line.join(1, entry(Class::Batch, "b", 1, 10, now), None, false, now);
    line.join(2, entry(Class::Standard, "s", 1, 10, now), None, false, now);
    line.join(
        3,
        entry(Class::Interactive, "i", 1, 10, now),
        None,
        false,
        now,
    );
    assert_eq!(admit_next(&mut line, now), Some(3));
    assert_eq!(admit_next(&mut line, now), Some(2));
    assert_eq!(admit_next(&mut line, now), Some(1));
    assert!(line.is_empty());
}

#[test]
fn weights_three_to_one_share_admitted_cost_three_to_one_and_each_tenant_is_fifo() {
    let now = Instant::now();
    let mut line = Line::new(None);
    // 40 waiters each, equal cost; ids 0..40 tenant a (weight 3), 100.. tenant b (weight 1).
    for i in 0..40 {
        line.join(
            i,
            entry(Class::Standard, "a", 3, 100, now),
            None,
            false,
            now,
        );
        line.join(
            100 + i,
            entry(Class::Standard, "b", 1, 100, now),
            None,
            false,
            now,
        );
    }
    let order: Vec<u64> = (0..40).map_while(|_| admit_next(&mut line, now)).collect();
    let a: Vec<u64> = order.iter().copied().filter(|&i| i < 100).collect();
    let b = order.len() - a.len();
    assert_eq!((a.len(), b), (30, 10), "order {order:?}");
    assert!(
        a.windows(2).all(|w| w[0] < w[1]),
        "FIFO within a tenant: {a:?}"
    );
}

#[test]
fn fair_sharing_is_by_cost_not_by_request_count() {
    let now = Instant::now();
    let mut line = Line::new(None);
    // Equal weights; a asks 300 per request, b 100: b gets three turns per a's one.
    for i in 0..20 {
        line.join(
            i,
            entry(Class::Standard, "a", 1, 300, now),
            None,
            false,
            now,
        );
        line.join(
            100 + i,
            entry(Class::Standard, "b", 1, 100, now),
            None,
            false,
            now,
        );
    }
    let order: Vec<u64> = (0..16).map_while(|_| admit_next(&mut line, now)).collect();
    let a_cost: u64 = order.iter().filter(|&&i| i < 100).count() as u64 * 300;
    let b_cost: u64 = order.iter().filter(|&&i| i >= 100).count() as u64 * 100;
    assert!(
        a_cost.abs_diff(b_cost) <= 300,
        "a {a_cost} b {b_cost}: {order:?}"
    );
}

#[test]
fn a_tenant_back_from_idle_saves_up_no_credit() {
    let now = Instant::now();
    let mut line = Line::new(None);
    for i in 0..10 {
        line.join(
            i,
            entry(Class::Standard, "busy", 1, 100, now),
            None,
            false,
            now,
        );
    }
    for _ in 0..5 {
        admit_next(&mut line, now);
    }
    // "idle" arrives late with 5 waiters: it alternates with "busy", it
    // does not get its 5 turns in a row.
    for i in 0..5 {
        line.join(
            200 + i,
            entry(Class::Standard, "idle", 1, 100, now),
            None,
            false,
            now,
        );
    }
    let order: Vec<u64> = (0..6).map_while(|_| admit_next(&mut line, now)).collect();
    let idle_first_three = order[..3].iter().filter(|&&i| i >= 200).count();
    assert!(idle_first_three <= 2, "{order:?}");
}

#[test]
fn a_refused_holder_keeps_the_turn_until_the_refill_time_and_a_refund_brings_it_forward() {
    let now = Instant::now();
    let mut line = Line::new(None);
    line.join(1, entry(Class::Standard, "a", 1, 10, now), None, false, now);
    line.join(2, entry(Class::Standard, "a", 1, 10, now), None, false, now);
    assert_eq!(line.my_turn(1), MyTurn::Now);
    assert_eq!(line.my_turn(2), MyTurn::No);
    assert!(line.begin(1, now));
    assert!(!line.begin(1, now), "one attempt at a time");
    line.refused(1, Duration::from_millis(300), now);
    let at = now + Duration::from_millis(300);
    assert_eq!(line.my_turn(1), MyTurn::At(at));
    assert!(!line.begin(1, now), "not before the refill time");
    let wakes = line.capacity_returned(now);
    assert_eq!(wakes.len(), 1);
    assert_eq!(line.my_turn(1), MyTurn::Now);
}

#[test]
fn a_refund_during_an_attempt_makes_its_refusal_retry_at_once() {
    let now = Instant::now();
    let mut line = Line::new(None);
    line.join(1, entry(Class::Standard, "a", 1, 10, now), None, false, now);
    assert!(line.begin(1, now));
    line.capacity_returned(now);
    line.refused(1, Duration::from_secs(5), now);
    assert_eq!(line.my_turn(1), MyTurn::Now);
}

#[test]
fn a_better_arrival_takes_the_turn_and_tries_at_once() {
    let now = Instant::now();
    let mut line = Line::new(None);
    line.join(1, entry(Class::Batch, "b", 1, 10, now), None, false, now);
    assert!(line.begin(1, now));
    line.refused(1, Duration::from_secs(1), now);
    let wakes = line.join(
        2,
        entry(Class::Interactive, "i", 1, 10, now),
        None,
        false,
        now,
    );
    assert_eq!(wakes.len(), 2, "the old holder and the new one are woken");
    assert_eq!(line.my_turn(2), MyTurn::Now);
    assert_eq!(line.my_turn(1), MyTurn::No);
}

#[test]
fn a_starving_batch_waiter_gets_one_turn_per_max_starve() {
    let t0 = Instant::now();
    let starve = Duration::from_secs(10);
    let mut line = Line::new(Some(starve));
    line.join(1, entry(Class::Batch, "b", 1, 10, t0), None, false, t0);
    line.join(2, entry(Class::Batch, "b", 1, 10, t0), None, false, t0);
    let mut id = 10;
    let mut next_interactive = |line: &mut Line, now| {
        id += 1;
        line.join(
            id,
            entry(Class::Interactive, "i", 1, 10, now),
            None,
            false,
            now,
        );
    };
    next_interactive(&mut line, t0);
    assert_eq!(admit_next(&mut line, t0), Some(11));
    // 11 s later, interactive traffic still waiting: batch 1 gets a turn.
    let t1 = t0 + Duration::from_secs(11);
    next_interactive(&mut line, t1);
    line.leave(12, false, t1);
    next_interactive(&mut line, t1);
    assert_eq!(admit_next(&mut line, t1), Some(1));
    // Not batch 2 right after: one starvation turn per max_starve.
    assert_eq!(admit_next(&mut line, t1), Some(13));
    let t2 = t1 + starve;
    next_interactive(&mut line, t2);
    assert_eq!(admit_next(&mut line, t2), Some(2));
}

#[test]
fn a_tenant_deferred_for_share_lets_another_tenant_try_at_once_and_tries_again_after() {
    let now = Instant::now();
    let mut line = Line::new(None);
    // "heavy" (weight 3) has the smaller tags: its waiter holds the turn.
    line.join(
        1,
        entry(Class::Standard, "heavy", 3, 30, now),
        None,
        false,
        now,
    );
    line.join(
        2,
        entry(Class::Standard, "heavy", 3, 30, now),
        None,
        false,
        now,
    );
    line.join(
        3,
        entry(Class::Standard, "light", 1, 30, now),
        None,
        false,
        now,
    );
    assert!(line.begin(1, now));
    line.refused(1, Duration::from_millis(500), now);
    assert!(line.begin(1, now + Duration::from_millis(500)));
    let held = Duration::from_millis(30);
    line.defer_for_share(1, held, now);
    assert_eq!(
        line.my_turn(3),
        MyTurn::Now,
        "light tries at once, refill or not"
    );
    assert!(line.begin(3, now));
    line.admitted(3, now);
    assert_eq!(
        line.my_turn(1),
        MyTurn::At(now + held),
        "heavy again after its hold"
    );
    // A held tenant's newcomer does not take the turn from the others.
    line.join(
        4,
        entry(Class::Standard, "light", 1, 30, now),
        None,
        false,
        now,
    );
    line.join(
        5,
        entry(Class::Standard, "heavy", 3, 1, now),
        Some(held),
        true,
        now,
    );
    assert_eq!(line.my_turn(4), MyTurn::Now);
}

#[test]
fn with_every_tenant_deferred_the_one_released_first_gets_the_turn() {
    let now = Instant::now();
    let mut line = Line::new(None);
    // "heavy" has the smaller tags, so it would come first by tag.
    line.join(
        1,
        entry(Class::Standard, "heavy", 3, 30, now),
        None,
        false,
        now,
    );
    line.join(
        2,
        entry(Class::Standard, "light", 1, 30, now),
        None,
        false,
        now,
    );
    assert!(line.begin(1, now));
    line.defer_for_share(1, Duration::from_millis(200), now);
    assert!(line.begin(2, now), "light tries at once");
    line.defer_for_share(2, Duration::from_millis(50), now);
    assert_eq!(
        line.my_turn(2),
        MyTurn::At(now + Duration::from_millis(50)),
        "light's hold ends first: its turn comes then, not after heavy's"
    );
    assert_eq!(line.my_turn(1), MyTurn::No);
}

#[test]
fn the_line_retry_time_is_what_is_left_of_its_latest_refusal() {
    let now = Instant::now();
    let mut line = Line::new(None);
    assert_eq!(line.retry_after(now), None);
    line.join(
        1,
        entry(Class::Standard, "a", 1, 30, now),
        Some(Duration::from_millis(700)),
        false,
        now,
    );
    assert_eq!(
        line.retry_after(now + Duration::from_millis(200)),
        Some(Duration::from_millis(500))
    );
    assert!(line.begin(1, now + Duration::from_millis(700)));
    line.refused(
        1,
        Duration::from_millis(300),
        now + Duration::from_millis(700),
    );
    assert_eq!(
        line.retry_after(now + Duration::from_millis(700)),
        Some(Duration::from_millis(300))
    );
    // Its time has come (the head tries now): the wait it last named.
    assert_eq!(
        line.retry_after(now + Duration::from_secs(5)),
        Some(Duration::from_millis(300))
    );
}
