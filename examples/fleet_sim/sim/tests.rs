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

mod shards {
    use crate::sim::shards::*;
    use budgetgate::budget::placement::{self, deployment_tag, slot_of_tag, tenant_tag};

    fn sum(c: Calls) -> u32 {
        c.reserves + c.settles
    }

    #[test]
    fn calls_per_request_by_shape() {
        use Outcome::*;
        let c = |reserves, settles| Calls { reserves, settles };
        let none = Calls::default();
        // Every budget exact: two reserves and two settles when admitted.
        for p in [Protocol::Design, Protocol::Today] {
            assert_eq!(calls_of(p, false, false, Admitted), (c(1, 1), c(1, 1)));
            // A tenant refusal never reaches the deployment domain.
            assert_eq!(calls_of(p, false, false, RefusedByTenant), (c(1, 0), none));
            // A deployment refusal costs a void of the tenant hold.
            assert_eq!(
                calls_of(p, false, false, RefusedByDeployment),
                (c(1, 1), c(1, 0))
            );
            // Everything leased: decided at the gateway.
            for o in [Admitted, RefusedByTenant, RefusedByDeployment] {
                assert_eq!(calls_of(p, true, true, o), (none, none), "{p:?} {o:?}");
            }
        }
        // DESIGN section 22: leased deployment budgets take the second call away.
        let d = Protocol::Design;
        assert_eq!(calls_of(d, false, true, Admitted), (c(1, 1), none));
        assert_eq!(calls_of(d, false, true, RefusedByDeployment), (none, none));
        assert_eq!(calls_of(d, true, false, Admitted), (none, c(1, 1)));
        assert_eq!(
            calls_of(d, true, false, RefusedByDeployment),
            (none, c(1, 0))
        );
        // Today: a leased deployment beside an exact tenant is split off;
        // a leased tenant beside an exact deployment goes to the store whole,
        // and so does a request its deployment's lease is short of.
        let t = Protocol::Today;
        assert_eq!(calls_of(t, false, true, Admitted), (c(1, 1), none));
        assert_eq!(calls_of(t, false, true, RefusedByTenant), (c(1, 0), none));
        assert_eq!(calls_of(t, true, false, Admitted), (c(1, 1), c(1, 1)));
        assert_eq!(
            sum(calls_of(t, false, true, RefusedByDeployment).0)
                + sum(calls_of(t, false, true, RefusedByDeployment).1),
            3
        );
    }

    #[test]
    fn slots_and_shards_are_redis_clusters() {
        // `redis-cli CLUSTER KEYSLOT` on Redis 7.0.15, computed once.
        for (tag, slot) in [
            ("default.t.t0", 2132),
            ("default.t.t1", 6261),
            ("default.t.t42", 7765),
            ("default.t.t9999", 8372),
            ("default.d.m0", 10776),
            ("default.d.m15", 2287),
        ] {
            assert_eq!(slot_of_tag(tag), slot, "{tag}");
        }
        assert_eq!(tenant_tag("default", "t42"), "default.t.t42");
        assert_eq!(deployment_tag("default", "m15"), "default.d.m15");
        // `redis-cli --cluster create` with three primaries: 0–5460,
        // 5461–10922, 10923–16383.
        assert_eq!(last_slots(3), vec![5460, 10922, 16383]);
        assert_eq!(last_slots(1), vec![16383]);
        let three = last_slots(3);
        for (slot, shard) in [
            (0, 0),
            (5460, 0),
            (5461, 1),
            (10922, 1),
            (10923, 2),
            (16383, 2),
        ] {
            assert_eq!(shard_in(&three, slot), shard, "slot {slot}");
        }
        let thirty = last_slots(30);
        assert_eq!(thirty.len(), 30);
        assert!(thirty
            .windows(2)
            .all(|w| (546..=547).contains(&(w[1] - w[0]))));
        // The same split as the library's spread of tenant names.
        let names: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
        let (_, per) = placement::spread("default", names.iter().map(String::as_str), 3);
        let mut mine = vec![0usize; 3];
        for n in &names {
            mine[shard_in(&three, slot_of_tag(&tenant_tag("default", n)))] += 1;
        }
        assert_eq!(mine, per);
    }

    #[test]
    fn a_pair_costs_what_the_measured_points_say() {
        assert!((pair_cost(8) - 1.0).abs() < 1e-9);
        assert!((pair_cost(40) - PAIR_INSTRUCTIONS_40 / PAIR_INSTRUCTIONS_8).abs() < 1e-9);
        // Two domains cost more than one: a call's fixed cost twice.
        assert!(pair_cost(5) + pair_cost(3) > pair_cost(8));
    }

    fn small() -> ShardConfig {
        let mut cfg = ShardConfig::big(5);
        cfg.samples = 100_000;
        cfg
    }

    #[test]
    fn shard_loads_add_up_and_spread() {
        let cfg = small();
        let d = domain_loads(&cfg, Protocol::Design, Deployments::Exact);
        let total: f64 = d.domains.iter().map(|x| x.1.calls).sum();
        let one = row(&d, 1);
        assert!((one.max_calls - total).abs() < 1e-6 * total);
        assert!((one.hottest_share - 1.0).abs() < 1e-9);
        for n in [3, 10, 30] {
            let r = row(&d, n);
            assert_eq!(r.shards, n);
            assert!((r.mean_calls * n as f64 - total).abs() < 1e-6 * total);
            assert!(r.max_calls >= r.mean_calls);
            assert!(r.hottest_share < one.hottest_share);
        }
        // Exact deployment budgets at 10^6 requests per second: the hottest
        // group is one slot, above a primary's headroom alone.
        let need = shards_needed(&d, 4_096);
        assert_eq!(need.alone.first().map(|a| a.0), Some("deployment"));
        assert!(need.alone.iter().all(|a| a.1 > HEADROOM));
        // The rest fits some shard count, and one fewer does not.
        let rest = within_headroom(&d);
        assert_eq!(rest.domains.len(), d.domains.len() - need.alone.len());
        let prefix = slot_prefix(&rest);
        for n in [1, 3, 10, 30, 100, 1000] {
            assert!((max_load(&prefix, n) - row(&rest, n).max_load).abs() < 1e-9);
        }
        let n = need.shards.expect("within the search");
        assert!(row(&rest, n).max_load <= HEADROOM);
        assert!(n == 1 || row(&rest, n - 1).max_load > HEADROOM);
        // Leased deployments (DESIGN section 22): the cold tenants' calls
        // spread over the shards; the deployment domains carry lease lines.
        let l = domain_loads(&cfg, Protocol::Design, Deployments::Leased);
        assert!(row(&l, 30).max_load < row(&d, 30).max_load);
        // Today's gateway calls the deployment domain only for the cold
        // tenants' requests its deployment's lease refuses.
        let t = domain_loads(&cfg, Protocol::Today, Deployments::Leased);
        let calls = |d: &DomainLoads, kind: &str| -> f64 {
            d.domains
                .iter()
                .filter(|x| x.2 == kind)
                .map(|x| x.1.calls)
                .sum()
        };
        let exact = domain_loads(&cfg, Protocol::Today, Deployments::Exact);
        assert!(calls(&t, "deployment") > calls(&l, "deployment"));
        assert!(2.0 * calls(&t, "deployment") < calls(&exact, "deployment"));
    }

    #[test]
    fn the_same_seed_gives_the_same_shard_table() {
        let cfg = small();
        let a = ShardReport::new(&cfg).to_string();
        assert_eq!(a, ShardReport::new(&cfg).to_string());
        let mut other = cfg.clone();
        other.seed = 6;
        assert_ne!(a, ShardReport::new(&other).to_string());
    }
}
