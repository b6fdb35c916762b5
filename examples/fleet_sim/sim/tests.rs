//! The small configuration, with and without faults (the big one is a
//! documented command: docs/PERFORMANCE.md, "Fleet simulation").

use super::{run, Faults, SimConfig};

#[test]
fn without_faults_no_budget_is_admitted_above_its_bound() {
    let r = run(&SimConfig::small(7));
    println!("{r}");
    assert!(r.leased.requests > 20_000, "{} requests", r.leased.requests);
    assert!(
        r.leased.local > r.leased.admitted / 2,
        "hot budgets are decided from leases: {} of {}",
        r.leased.local,
        r.leased.admitted
    );
    assert!(
        r.over_admitted().is_empty(),
        "over-admitted: {:?}",
        r.over_admitted()
    );
    let (leased, exact) = r.calls_per_admission();
    assert!(
        leased < exact / 2.0,
        "store calls per admission: leased {leased}, exact {exact}"
    );
}

#[test]
fn with_faults_over_admission_stays_within_the_lost_grants() {
    let mut cfg = SimConfig::small(11);
    cfg.faults = Faults {
        crashes: 2,
        lost_grants: 3,
        partitions: 2,
        partition_micros: 2_000_000,
    };
    let r = run(&cfg);
    println!("{r}");
    assert_eq!(r.leased.crashes, 2);
    assert_eq!(r.leased.lost_grants, 3, "every lost grant was injected");
    assert!(
        r.over_admitted().is_empty(),
        "beyond the stated bound: {:?}",
        r.over_admitted()
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let mut cfg = SimConfig::small(3);
    cfg.seconds = 3;
    let (a, b) = (run(&cfg), run(&cfg));
    assert_eq!(
        (a.leased.admitted, a.leased.store_calls, a.false_refusals),
        (b.leased.admitted, b.leased.store_calls, b.false_refusals)
    );
}
