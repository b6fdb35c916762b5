//! Split reservations through the gateway's store: a leased deployment
//! beside exact tenant budgets (`Decision::Split`). The memory store stands
//! for the store part; `tests/it/redis_shards.rs` checks the same on the
//! `tenant` layout of a Redis Cluster, where the split saves a call.

use std::sync::Arc;
use std::time::Duration;

use super::book::LeaseOff;
use super::QuotaLeases;
use crate::admission::deny::{AnsweredBy, DenyCachedStore};
use crate::admission::GatewayStore;
use crate::budget::deny_cache::DenyCache;
use crate::budget::memory::MemoryStore;
use crate::budget::{
    Actual, BudgetKind, BudgetName, BudgetSpec, BudgetStore, Costs, ExtendOutcome, Requester,
    ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement, Step,
};
use crate::clock::ManualClock;
use crate::config::store::LeasePolicy;

const S: u64 = 1_000_000;
const TENANT_TPM: &str = "bg:{d.t.acme}:v3:tenant:acme:tpm";
const UPSTREAM_TPM: &str = "bg:{d.d.up}:v3:upstream:up:tpm";

fn tpm(scope: Scope, key: &str, per_minute: u64) -> BudgetSpec {
    BudgetSpec {
        scope,
        name: BudgetName::Tpm,
        kind: BudgetKind::Bucket {
            per_minute,
            burst: per_minute,
        },
        key: key.into(),
        refund_unused: true,
        shadow: false,
    }
}

fn tenant(per_minute: u64) -> BudgetSpec {
    tpm(Scope::Tenant("acme".into()), TENANT_TPM, per_minute)
}

fn upstream() -> BudgetSpec {
    tpm(Scope::Upstream("up".into()), UPSTREAM_TPM, 600_000)
}

fn request(id: &str, tokens: u64, tenant_tpm: u64) -> ReserveRequest {
    ReserveRequest {
        share: None,
        id: id.into(),
        costs: Costs::tokens(tokens),
        common: vec![tenant(tenant_tpm)],
        candidates: vec![vec![upstream()]],
        slot_lease_micros: 5 * S,
        hold_ttl_micros: 60 * S,
        requester: Arc::new(Requester::default()),
    }
}

fn used(per_spec: Vec<u64>, tokens: u64) -> Settlement {
    Settlement {
        actual_tokens: tokens,
        upstream_failed: false,
        actual: Actual::PerSpec(per_spec),
    }
}

struct Fixture {
    mem: Arc<MemoryStore>,
    leases: Arc<QuotaLeases>,
    gw: GatewayStore,
}

impl Fixture {
    /// Tenant `acme` exact (`lease = "off"`), the deployment leased after
    /// a warm-up; splitting on or off.
    async fn new(split: bool) -> Self {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let mem = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let off = LeaseOff {
            tenants: vec!["acme".into()],
            ..LeaseOff::default()
        };
        let leases = Arc::new(QuotaLeases::new(
            &LeasePolicy::default(),
            off,
            mem.clone(),
            Duration::from_millis(50),
            "g1",
        ));
        leases.set_split(split);
        let inner: Arc<dyn BudgetStore> = mem.clone();
        let gw = GatewayStore::new(
            DenyCachedStore::new(
                inner,
                Arc::new(DenyCache::with_capacity(16)),
                Arc::new(clock.clone()),
            ),
            Arc::new(MemoryStore::new(Arc::new(clock))),
            1.0,
        )
        .with_leases(leases.clone());
        let f = Fixture { mem, leases, gw };
        for i in 0..60 {
            let r = request(&format!("w{i}"), 100, 6_000_000);
            let (_, by) = f.gw.reserve_answered(&r).await.expect("reserve");
            assert_eq!(by, AnsweredBy::Store, "nothing is leased yet");
            f.gw.settle(&r.id, &used(vec![100, 100], 100))
                .await
                .expect("settle");
        }
        f.leases.round().await;
        assert_eq!(f.leases.leases(), 1, "the deployment alone is leased");
        f
    }

    fn remaining(&self, spec: &BudgetSpec) -> i64 {
        self.mem.inspect_sync(std::slice::from_ref(spec))[0].remaining
    }

    fn leased(&self) -> i64 {
        self.leases.leased_units(UPSTREAM_TPM).expect("a lease")
    }
}

#[tokio::test(start_paused = true)]
async fn a_leased_deployment_beside_an_exact_tenant_is_split() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (tenant_before, store_up_before, lease_before) =
        (f.remaining(&t), f.remaining(&upstream()), f.leased());
    let r = request("r", 300, 6_000_000);
    let (o, by) = f.gw.reserve_answered(&r).await.expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    let ReserveOutcome::Admitted(a) = o else {
        panic!("{o:?}")
    };
    let scopes: Vec<&Scope> = a.budgets.iter().map(|b| &b.scope).collect();
    assert_eq!(
        scopes,
        [&Scope::Tenant("acme".into()), &Scope::Upstream("up".into())],
        "both budgets' states, the tenant's first"
    );
    assert_eq!(
        f.remaining(&t),
        tenant_before - 300,
        "the tenant in the store"
    );
    assert_eq!(
        f.remaining(&upstream()),
        store_up_before,
        "the deployment's store count untouched: the lease pays"
    );
    assert_eq!(f.leased(), lease_before - 300);
    assert_eq!(f.mem.live_holds(), 1, "the store holds the tenant part");
    // An extension reaches both parts.
    match f
        .gw
        .extend_at(AnsweredBy::Split, "r", &Step::tokens(50))
        .await
        .expect("extend")
    {
        ExtendOutcome::Extended { granted, .. } => assert_eq!(granted, 50),
        o => panic!("{o:?}"),
    }
    assert_eq!(f.remaining(&t), tenant_before - 350);
    assert_eq!(f.leased(), lease_before - 350);
    // Settled: each part refunds what its budget did not use.
    match f
        .gw
        .settle_at(AnsweredBy::Split, "r", &used(vec![120, 120], 120))
        .await
        .expect("settle")
    {
        SettleOutcome::Settled {
            reserved,
            refunded,
            debt,
            ..
        } => assert_eq!((reserved, refunded, debt), (350, 230, 0)),
        o => panic!("{o:?}"),
    }
    assert_eq!(f.remaining(&t), tenant_before - 120);
    assert_eq!(f.leased(), lease_before - 120);
    assert_eq!(f.mem.live_holds(), 0);
    assert_eq!(
        f.gw.settle_at(AnsweredBy::Split, "r", &used(vec![120, 120], 120))
            .await
            .expect("settle again"),
        SettleOutcome::AlreadySettled,
        "a retried settlement changes nothing"
    );
    assert_eq!(f.leased(), lease_before - 120);
}

#[tokio::test(start_paused = true)]
async fn a_split_the_tenant_refuses_gives_the_deployment_back_to_the_lease() {
    let f = Fixture::new(true).await;
    // A tenant budget of 500 a minute: after a first request of 300, a
    // second is refused by it.
    let (_, by) =
        f.gw.reserve_answered(&request("first", 300, 500))
            .await
            .expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    let lease_before = f.leased();
    let (o, by) =
        f.gw.reserve_answered(&request("second", 300, 500))
            .await
            .expect("reserve");
    let ReserveOutcome::Denied(d) = o else {
        panic!("{o:?}")
    };
    assert_eq!(
        d.scope,
        Scope::Tenant("acme".into()),
        "the tenant's refusal"
    );
    assert_ne!(by, AnsweredBy::Split);
    assert_eq!(f.leased(), lease_before, "the local hold was voided");
    assert!(!f.leases.holds("second"));
    assert!(f.leases.holds("first"));
    assert_eq!(f.mem.live_holds(), 1, "the first request's tenant hold");
}

#[tokio::test(start_paused = true)]
async fn a_split_voided_reaches_both_parts() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (tenant_before, lease_before) = (f.remaining(&t), f.leased());
    let (_, by) =
        f.gw.reserve_answered(&request("v", 300, 6_000_000))
            .await
            .expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    let o = f.gw.void("v", 60 * S).await.expect("void");
    assert!(matches!(o, SettleOutcome::Settled { .. }), "{o:?}");
    assert_eq!(f.remaining(&t), tenant_before);
    assert_eq!(f.leased(), lease_before);
    assert_eq!(f.mem.live_holds(), 0);
    assert!(!f.leases.holds("v"));
}

#[tokio::test(start_paused = true)]
async fn without_splitting_the_store_decides_the_whole_reservation() {
    let f = Fixture::new(false).await;
    let lease_before = f.leased();
    let (o, by) =
        f.gw.reserve_answered(&request("whole", 300, 6_000_000))
            .await
            .expect("reserve");
    assert!(matches!(o, ReserveOutcome::Admitted(_)));
    assert_eq!(by, AnsweredBy::Store);
    assert_eq!(f.leased(), lease_before, "the lease is not spent");
}
