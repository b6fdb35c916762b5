//! Split reservations through the gateway's store: a leased deployment
//! beside exact tenant budgets (`Decision::Split`). The memory store stands
//! for the store part; `tests/it/redis_shards.rs` checks the same on the
//! `tenant` layout of a Redis Cluster, where the split saves a call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::book::LeaseOff;
use super::tests::gateway_store;
use super::QuotaLeases;
use crate::admission::deny::AnsweredBy;
use crate::admission::{GatewayStore, HeldReservation, SettlementTracker};
use crate::budget::memory::MemoryStore;
use crate::budget::{
    Actual, BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, Costs, ExtendOutcome,
    RenewOutcome, Requester, ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement,
    Step, StoreError,
};
use crate::clock::ManualClock;
use crate::config::store::LeasePolicy;
use crate::settlement::{Outcome, Settling};

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

const UPSTREAM_SLOTS: &str = "bg:{d.d.up}:v3:upstream:up:max_concurrent";

/// The deployment's `max_concurrent = 100` beside its tokens.
fn with_slots(mut r: ReserveRequest) -> ReserveRequest {
    r.candidates[0].push(BudgetSpec {
        name: BudgetName::MaxConcurrent,
        kind: BudgetKind::Concurrency { max: 100 },
        key: UPSTREAM_SLOTS.into(),
        ..upstream()
    });
    r
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

/// The memory store whose settlements fail while `down` counts calls
/// left to fail: a store that stops answering.
struct Flaky {
    mem: Arc<MemoryStore>,
    down: AtomicUsize,
    /// Held by a test: reservations wait for it (a call on the wire).
    gate: tokio::sync::Mutex<()>,
}

#[async_trait]
impl BudgetStore for Flaky {
    async fn reserve(&self, r: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        let _wire = self.gate.lock().await;
        self.mem.reserve(r).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.mem.extend(id, step).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.mem.renew(id).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        let left = self.down.load(Ordering::SeqCst);
        if left > 0 {
            self.down.store(left - 1, Ordering::SeqCst);
            return Err(StoreError::NotSent("down".into()));
        }
        self.mem.settle(id, s).await
    }
    async fn void(&self, id: &str, ttl: u64) -> Result<SettleOutcome, StoreError> {
        self.mem.void(id, ttl).await
    }
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        self.mem.inspect(specs).await
    }
    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.mem.lower(spec, at_most).await
    }
}

struct Fixture {
    mem: Arc<MemoryStore>,
    leases: Arc<QuotaLeases>,
    gw: Arc<GatewayStore>,
    /// The store's settlements fail this many times more.
    flaky: Arc<Flaky>,
    clock: ManualClock,
}

impl Fixture {
    /// Tenant `acme` exact (`lease = "off"`), the deployment leased after
    /// a warm-up; splitting on or off.
    async fn new(split: bool) -> Self {
        Self::shaped(split, |r| r).await
    }

    /// [`Self::new`] with requests shaped by `shape` (the warm-up's too).
    async fn shaped(split: bool, shape: fn(ReserveRequest) -> ReserveRequest) -> Self {
        let off = LeaseOff {
            tenants: vec!["acme".into()],
            ..LeaseOff::default()
        };
        Self::of(split, shape, off).await
    }

    /// The tenant leased too.
    async fn leasing_the_tenant() -> Self {
        Self::of(true, |r| r, LeaseOff::default()).await
    }

    async fn of(split: bool, shape: fn(ReserveRequest) -> ReserveRequest, off: LeaseOff) -> Self {
        let clock = ManualClock::new(1_800_000_000_000_000);
        let mem = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let tenant_leased = off.tenants.is_empty();
        let leases = Arc::new(QuotaLeases::new(
            &LeasePolicy::default(),
            off,
            mem.clone(),
            Duration::from_millis(50),
            "g1",
        ));
        leases.set_split(split);
        let flaky = Arc::new(Flaky {
            mem: mem.clone(),
            down: AtomicUsize::new(0),
            gate: tokio::sync::Mutex::new(()),
        });
        let inner: Arc<dyn BudgetStore> = flaky.clone();
        let gw = Arc::new(gateway_store(inner, &clock, &leases));
        let f = Fixture {
            mem,
            leases,
            gw,
            flaky,
            clock,
        };
        for i in 0..60 {
            let r = shape(request(&format!("w{i}"), 100, 6_000_000));
            let (_, by) = f.gw.reserve_answered(&r).await.expect("reserve");
            assert_eq!(by, AnsweredBy::Store, "nothing is leased yet");
            f.gw.settle(&r.id, &used(vec![100, 100, 0], 100))
                .await
                .expect("settle");
        }
        f.leases.round().await;
        assert_eq!(
            f.leases.leases(),
            shape(request("x", 1, 1)).candidates[0].len() + usize::from(tenant_leased),
            "the deployment is leased (and the tenant when it may be)"
        );
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

/// Fault: a split settled while the store was down kept its local hold
/// for good once the settlement's retries ran out (the store part was
/// settled first, and its failure left the local one to a retry that never
/// came): the lease's units stayed in flight, a deployment slot taken for
/// good, the book's hold never freed. The local hold needs no store call:
/// it is settled first, and the store's hold is left to the retry (or to
/// its expiry, charged whole, as any hold whose settlement failed).
#[tokio::test(start_paused = true)]
async fn a_split_settled_while_the_store_is_down_frees_its_local_hold() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (tenant_before, lease_before) = (f.remaining(&t), f.leased());
    let r = request("r", 300, 6_000_000);
    let (_, by) = f.gw.reserve_answered(&r).await.expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    let tracker = SettlementTracker::default();
    let hold = HeldReservation::new(
        r.id.clone(),
        (f.gw.clone(), by),
        r.common.iter().chain(r.candidates[0].iter()),
        tracker,
        300,
        Duration::from_secs(5),
        Duration::from_secs(1),
    );
    f.flaky.down.store(usize::MAX, Ordering::SeqCst);
    let o = hold
        .settle_now(Settling::of(used(vec![100, 100], 100), Outcome::Answered))
        .await;
    assert_eq!(o, None, "the store never answered");
    assert!(!f.leases.holds("r"), "the local hold is settled");
    assert_eq!(
        f.leased(),
        lease_before - 100,
        "the deployment's lease charged what was used"
    );
    assert_eq!(f.mem.live_holds(), 1, "the store's hold is left");
    // The store is back: a later retry settles what is left there.
    f.flaky.down.store(0, Ordering::SeqCst);
    let o =
        f.gw.settle_at(AnsweredBy::Split, "r", &used(vec![100, 100], 100))
            .await
            .expect("settle");
    assert!(matches!(o, SettleOutcome::Settled { .. }), "{o:?}");
    assert_eq!(f.remaining(&t), tenant_before - 100);
    assert_eq!(f.mem.live_holds(), 0);
    assert_eq!(f.leased(), lease_before - 100);
}

/// A settlement the store fails once is retried whole: each part settled
/// once, exactly.
#[tokio::test(start_paused = true)]
async fn a_split_settlement_retried_after_a_store_failure_is_exact() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (tenant_before, lease_before) = (f.remaining(&t), f.leased());
    let (_, by) =
        f.gw.reserve_answered(&request("r", 300, 6_000_000))
            .await
            .expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    f.flaky.down.store(1, Ordering::SeqCst);
    let s = used(vec![100, 120], 100);
    assert!(f.gw.settle_at(by, "r", &s).await.is_err());
    let o = f.gw.settle_at(by, "r", &s).await.expect("retried");
    assert!(matches!(o, SettleOutcome::Settled { .. }), "{o:?}");
    assert_eq!(
        f.gw.settle_at(by, "r", &s).await.expect("again"),
        SettleOutcome::AlreadySettled
    );
    assert_eq!(f.remaining(&t), tenant_before - 100);
    assert_eq!(f.leased(), lease_before - 120);
    assert_eq!(f.mem.live_holds(), 0);
    assert!(!f.leases.holds("r"));
}

/// Costs priced per candidate (a dollar budget's row): the store part is
/// sent the common specs' amounts, the lease spends the candidate's, each
/// settled by its own actuals.
#[tokio::test(start_paused = true)]
async fn a_split_priced_per_candidate_charges_each_part_its_own_amounts() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (tenant_before, lease_before) = (f.remaining(&t), f.leased());
    let mut r = request("priced", 300, 6_000_000);
    r.costs.per_candidate = vec![vec![70, 200]];
    let (o, by) = f.gw.reserve_answered(&r).await.expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    assert!(matches!(o, ReserveOutcome::Admitted(_)), "{o:?}");
    assert_eq!(f.remaining(&t), tenant_before - 70, "the common row");
    assert_eq!(f.leased(), lease_before - 200, "the candidate's amount");
    let o =
        f.gw.settle_at(by, "priced", &used(vec![30, 150], 150))
            .await
            .expect("settle");
    assert!(matches!(o, SettleOutcome::Settled { .. }), "{o:?}");
    assert_eq!(f.remaining(&t), tenant_before - 30);
    assert_eq!(f.leased(), lease_before - 150);
    assert_eq!(f.mem.live_holds(), 0);
    assert!(!f.leases.holds("priced"));
}

/// An extension its closed lease cannot pay is reserved exactly in the
/// store (the local hold's overflow) and the tenant hold extended by what
/// it granted; settlement ends the overflow, the tenant hold and the local
/// hold, each refunding what it did not use.
#[tokio::test(start_paused = true)]
async fn a_split_extended_past_its_lease_settles_its_overflow_in_the_store() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (_, by) =
        f.gw.reserve_answered(&request("stream", 100, 6_000_000))
            .await
            .expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    // The deployment's other traffic stops: its lease closes and gives
    // back what no stream holds.
    tokio::time::advance(Duration::from_secs(2)).await;
    f.clock.advance(2 * S);
    f.leases.round().await;
    assert_eq!(f.leased(), 0);
    // Refilled to its burst since: the 100 reserved are not counted.
    let tenant_full = f.remaining(&t);
    let up_before = f.remaining(&upstream());
    match f
        .gw
        .extend_at(by, "stream", &Step::tokens(50))
        .await
        .expect("extend")
    {
        ExtendOutcome::Extended { granted, .. } => assert_eq!(granted, 50),
        o => panic!("cut off: {o:?}"),
    }
    assert_eq!(up_before - f.remaining(&upstream()), 50, "the overflow");
    assert_eq!(f.remaining(&t), tenant_full - 50);
    assert_eq!(f.mem.live_holds(), 2, "the tenant hold and the overflow");
    // 120 used: the deployment's 100 from the lease, 20 of the overflow.
    let o =
        f.gw.settle_at(by, "stream", &used(vec![120, 120], 120))
            .await
            .expect("settle");
    match o {
        SettleOutcome::Settled {
            reserved,
            refunded,
            debt,
            ..
        } => assert_eq!((reserved, refunded, debt), (150, 30, 0)),
        o => panic!("{o:?}"),
    }
    assert_eq!(up_before - f.remaining(&upstream()), 20);
    assert_eq!(f.remaining(&t), tenant_full - 20);
    assert_eq!(f.mem.live_holds(), 0);
    assert!(!f.leases.holds("stream"));
}

/// A deployment's slots leased: a split takes one here, a refusal of the
/// tenant gives it back at once, a settlement frees it; the renewals go to
/// the tenant hold in the store.
#[tokio::test(start_paused = true)]
async fn a_split_holds_the_deployments_slot_on_its_lease() {
    let f = Fixture::shaped(true, with_slots).await;
    let slots = || f.leases.leased_units(UPSTREAM_SLOTS).expect("a slot lease");
    let free = slots();
    let (_, by) =
        f.gw.reserve_answered(&with_slots(request("a", 300, 500)))
            .await
            .expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    assert_eq!(slots(), free - 1);
    assert_eq!(
        f.gw.renewal_store(by).renew("a").await.expect("renew"),
        f.mem.renew_sync("a"),
        "the tenant hold is renewed"
    );
    assert!(matches!(
        f.gw.renewal_store(by).renew("a").await.expect("renew"),
        RenewOutcome::Renewed { .. }
    ));
    let (o, _) =
        f.gw.reserve_answered(&with_slots(request("b", 300, 500)))
            .await
            .expect("reserve");
    assert!(matches!(o, ReserveOutcome::Denied(_)), "{o:?}");
    assert_eq!(slots(), free - 1, "the refused one's slot is back");
    let o =
        f.gw.settle_at(by, "a", &used(vec![100, 100, 0], 100))
            .await
            .expect("settle");
    assert!(matches!(o, SettleOutcome::Settled { .. }), "{o:?}");
    assert_eq!(slots(), free);
    assert_eq!(f.mem.live_holds(), 0);
    assert!(!f.leases.holds("a") && !f.leases.holds("b"));
}

/// Fault: a split the store refused kept the refusal although this
/// gateway's leases came to cover the whole request (a leased tenant
/// budget short of it while the store had room sends it to the store; the
/// units of a top-up on the wire are debited there first): stranding rule
/// two (DESIGN "Leases that do not strand the limit") decides a refused
/// request again from the leases, and the split skipped it.
#[tokio::test(start_paused = true)]
async fn a_split_the_store_refuses_is_decided_again_from_the_leases() {
    let f = Fixture::leasing_the_tenant().await;
    let t = tenant(6_000_000);
    let short = f.leases.leased_units(TENANT_TPM).expect("a tenant lease") as u64 + 1;
    // A top-up is due by the time the store refuses.
    tokio::time::advance(Duration::from_millis(600)).await;
    f.clock.advance(600_000);
    // The store's room is held elsewhere (by a top-up on the wire, here
    // by another reservation) while this request is decided.
    let elsewhere = ReserveRequest {
        costs: Costs::tokens(f.remaining(&t) as u64),
        candidates: Vec::new(),
        ..request("elsewhere", 0, 6_000_000)
    };
    assert!(matches!(
        f.mem.reserve_sync(&elsewhere),
        ReserveOutcome::Admitted(_)
    ));
    let (mem, leases) = (f.mem.clone(), f.leases.clone());
    let landed = tokio::spawn(async move {
        mem.void("elsewhere", 60 * S).await.expect("void");
        leases.round().await;
    });
    let mut r = request("r", short, 6_000_000);
    r.costs.per_candidate = vec![vec![short, 1]];
    let (o, by) = f.gw.reserve_answered(&r).await.expect("reserve");
    assert!(matches!(o, ReserveOutcome::Admitted(_)), "{o:?}");
    assert_eq!(by, AnsweredBy::Lease, "decided again from the leases");
    landed.await.expect("round");
    assert!(f.leases.holds("r"));
    assert_eq!(f.leases.split_at("r"), None, "held whole here");
}

/// A split voided while its store part is on the wire: the local hold is
/// given back at once, the store's tombstone keeps the late call from
/// applying, and the reservation answers voided with nothing held.
#[tokio::test(start_paused = true)]
async fn a_split_voided_while_its_store_call_is_on_the_wire_holds_nothing() {
    let f = Fixture::new(true).await;
    let t = tenant(6_000_000);
    let (tenant_before, lease_before) = (f.remaining(&t), f.leased());
    let wire = f.flaky.gate.lock().await;
    let gw = f.gw.clone();
    let call =
        tokio::spawn(async move { gw.reserve_answered(&request("v", 300, 6_000_000)).await });
    while !f.leases.holds("v") {
        tokio::task::yield_now().await;
    }
    assert_eq!(f.leased(), lease_before - 300, "the local hold first");
    let o = BudgetStore::void(&*f.gw, "v", 60 * S).await.expect("void");
    assert!(matches!(o, SettleOutcome::Settled { .. }), "{o:?}");
    assert_eq!(f.leased(), lease_before);
    drop(wire);
    let (o, by) = call.await.expect("task").expect("reserve");
    assert_eq!(o, ReserveOutcome::Voided);
    assert_ne!(by, AnsweredBy::Split);
    assert_eq!(f.leased(), lease_before);
    assert_eq!(f.remaining(&t), tenant_before);
    assert_eq!(f.mem.live_holds(), 0);
    assert!(!f.leases.holds("v"));
}

/// A request count of the deployment's on its lease: a settlement keeps
/// it, a void gives it back.
#[tokio::test(start_paused = true)]
async fn a_splits_request_count_comes_back_only_with_a_void() {
    fn with_rpm(mut r: ReserveRequest) -> ReserveRequest {
        r.candidates[0].push(BudgetSpec {
            name: BudgetName::Rpm,
            kind: BudgetKind::Bucket {
                per_minute: 60_000,
                burst: 60_000,
            },
            key: UPSTREAM_RPM.into(),
            ..upstream()
        });
        r
    }
    const UPSTREAM_RPM: &str = "bg:{d.d.up}:v3:upstream:up:rpm";
    let f = Fixture::shaped(true, with_rpm).await;
    let rpm = || f.leases.leased_units(UPSTREAM_RPM).expect("an rpm lease");
    let before = rpm();
    for (id, s, left) in [
        ("kept", used(vec![100, 100, 0], 100), before - 1),
        (
            "voided",
            Settlement {
                actual_tokens: 0,
                upstream_failed: true,
                actual: Actual::Void,
            },
            before - 1,
        ),
    ] {
        let (_, by) =
            f.gw.reserve_answered(&with_rpm(request(id, 100, 6_000_000)))
                .await
                .expect("reserve");
        assert_eq!(by, AnsweredBy::Split);
        f.gw.settle_at(by, id, &s).await.expect("settle");
        assert_eq!(rpm(), left, "{id}");
    }
    assert_eq!(f.mem.live_holds(), 0);
}

/// A shadow common budget goes to the store with the tenant's part: its
/// would-be refusal comes back with the joined admission.
#[tokio::test(start_paused = true)]
async fn a_splits_shadow_tenant_budget_reports_its_would_be_refusal() {
    let f = Fixture::new(true).await;
    let shadow = |id: &str| {
        let mut r = request(id, 300, 500);
        r.common[0].shadow = true;
        r
    };
    for (id, would_deny) in [("first", 0), ("second", 1)] {
        let (o, by) = f.gw.reserve_answered(&shadow(id)).await.expect("reserve");
        assert_eq!(by, AnsweredBy::Split);
        let ReserveOutcome::Admitted(a) = o else {
            panic!("{o:?}")
        };
        assert_eq!(a.would_deny.len(), would_deny, "{id}");
    }
}

/// The tenant is asked first: when it grants less than the step, the
/// deployment's lease pays only what the tenant granted (a deployment
/// budget that refunds nothing unused is never charged a surplus).
#[tokio::test(start_paused = true)]
async fn a_split_extension_the_tenant_grants_short_extends_the_deployment_as_much() {
    let f = Fixture::new(true).await;
    let (_, by) =
        f.gw.reserve_answered(&request("short", 300, 320))
            .await
            .expect("reserve");
    assert_eq!(by, AnsweredBy::Split);
    let lease_before = f.leased();
    match f
        .gw
        .extend_at(AnsweredBy::Split, "short", &Step::tokens(50))
        .await
        .expect("extend")
    {
        ExtendOutcome::Extended { granted, .. } => assert_eq!(granted, 20),
        o => panic!("{o:?}"),
    }
    assert_eq!(
        f.leased(),
        lease_before - 20,
        "the lease paid what the tenant granted"
    );
}
