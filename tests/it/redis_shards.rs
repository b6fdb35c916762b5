//! The `tenant` key layout on a Redis Cluster of three primaries: each
//! top-level tenant's tree in its own domain (slot), deployments grouped by
//! the models they serve; a reservation over both domains is two calls, the
//! tenant's first (DESIGN section 22).
//!
//! - calls per primary for 100 tenants `t000`…`t099` of equal traffic, read
//!   from the primaries' own `INFO commandstats` (printed; the tenant-domain
//!   calls asserted within ±25 % of a third);
//! - the protocol's promises: a request the tenant domain refuses never
//!   touches the deployment domain; a deployment refusal voids the tenant
//!   hold; settlement and a lost reply's void reach both holds.
//!
//! Run: `cargo test --test it redis_shards -- --nocapture`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::store_conformance::{admitted, denied, tenant_layout, Backend, H};
use crate::support::redis_server::{self, RedisCluster};
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::placement::{self, DomainMap, Layout};
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetState, BudgetStore, Costs, ExtendOutcome,
    RenewOutcome, ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement, Step,
    StoreError,
};

const SEC: u64 = 1_000_000;

fn tpm(ks: &KeySpace, scope: Scope, per_minute: u64) -> BudgetSpec {
    BudgetSpec {
        key: ks.budget(&scope, BudgetName::Tpm).into(),
        scope,
        name: BudgetName::Tpm,
        kind: BudgetKind::Bucket {
            per_minute,
            burst: per_minute,
        },
        refund_unused: true,
        shadow: false,
    }
}

fn request(
    id: &str,
    tokens: u64,
    common: Vec<BudgetSpec>,
    cands: Vec<Vec<BudgetSpec>>,
) -> ReserveRequest {
    ReserveRequest {
        id: id.into(),
        costs: Costs::tokens(tokens),
        common,
        candidates: cands,
        slot_lease_micros: 10 * SEC,
        hold_ttl_micros: 120 * SEC,
        requester: Default::default(),
        share: None,
    }
}

/// `cmdstat_evalsha` of one primary: (calls, µs).
fn evalsha_stats(node: &redis_server::RedisServer) -> (u64, u64) {
    let info = node.cli(&["info", "commandstats"]);
    let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("usec="))
}

/// The primary (0, 1, 2) serving hash tag `tag`, as the cluster says.
fn primary_of(cluster: &RedisCluster, tag: &str) -> usize {
    let key = format!("x:{{{tag}}}");
    for (i, n) in cluster.nodes.iter().enumerate() {
        // A primary answers for its own slots only (else MOVED).
        let reply = n.cli(&["get", &key]);
        if !reply.contains("MOVED") {
            return i;
        }
    }
    usize::MAX
}

/// 100 tenants of equal traffic, deployment budgets leased (so each
/// request is one tenant-domain reserve and one settle), then the same
/// with 6 deployment groups kept exact (two domains a request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_domains_spread_script_calls_over_three_primaries() {
    let cluster = RedisCluster::start();
    let domain = "default";
    let groups: Vec<Vec<String>> = (0..6)
        .map(|g| vec![format!("dep{g}a"), format!("dep{g}b")])
        .collect();
    let map = DomainMap::new(
        domain,
        std::iter::empty(),
        groups
            .iter()
            .map(|g| g.iter().map(String::as_str).collect()),
    );
    let ks = KeySpace::new("bgshards", domain).with_layout(Layout::Tenant, Some(Arc::new(map)));
    let store = Arc::new(
        RedisStore::connect(
            &cluster.url(),
            Duration::from_secs(5),
            KeySpace::new("bgshards", domain),
        )
        .await
        .expect("connect to the cluster")
        .with_layout(Layout::Tenant),
    );
    let tenants: Vec<String> = (0..100).map(|i| format!("t{i:03}")).collect();
    let per_tenant = 20;
    let tenant_primary: Vec<usize> = tenants
        .iter()
        .map(|t| primary_of(&cluster, &placement::tenant_tag(domain, t)))
        .collect();
    let group_primary: Vec<usize> = groups
        .iter()
        .map(|g| primary_of(&cluster, &placement::deployment_tag(domain, &g[0])))
        .collect();
    println!(
        "tenant domains per primary: {:?}",
        count(&tenant_primary, 3)
    );
    println!(
        "deployment groups per primary: {:?}",
        count(&group_primary, 3)
    );

    for exact in [false, true] {
        for n in &cluster.nodes {
            n.cli(&["config", "resetstat"]);
        }
        let runs = tenants.iter().enumerate().map(|(i, t)| {
            let store = store.clone();
            let ks = ks.clone();
            let g = &groups[i % groups.len()];
            async move {
                let common = vec![tpm(&ks, Scope::Tenant(t.as_str().into()), 1_000_000)];
                let cands: Vec<Vec<BudgetSpec>> = if exact {
                    g.iter()
                        .map(|d| vec![tpm(&ks, Scope::Upstream(d.as_str().into()), 10_000_000)])
                        .collect()
                } else {
                    // Leased deployment budgets: the store sees none.
                    vec![Vec::new()]
                };
                for r in 0..per_tenant {
                    let id = format!("{t}-{exact}-{r}");
                    let req = request(&id, 10, common.clone(), cands.clone());
                    match store.reserve(&req).await.expect("reserve") {
                        ReserveOutcome::Admitted(_) => {}
                        other => panic!("{id}: {other:?}"),
                    }
                    let settlement = Settlement {
                        actual_tokens: 10,
                        upstream_failed: false,
                        actual: Default::default(),
                    };
                    assert!(matches!(
                        store.settle(&id, &settlement).await.expect("settle"),
                        SettleOutcome::Settled { .. }
                    ));
                }
            }
        });
        join_all(runs).await;
        let stats: Vec<(u64, u64)> = cluster.nodes.iter().map(evalsha_stats).collect();
        // What this test sent to each primary's tenant and deployment domains.
        let mut tenant_calls = vec![0u64; 3];
        let mut deployment_calls = vec![0u64; 3];
        for (i, &p) in tenant_primary.iter().enumerate() {
            tenant_calls[p] += 2 * per_tenant;
            if exact {
                deployment_calls[group_primary[i % groups.len()]] += 2 * per_tenant;
            }
        }
        let label = if exact {
            "exact, 6 deployment groups"
        } else {
            "deployment budgets leased"
        };
        println!(
            "{label}: EVALSHA calls per primary {:?}, script µs per primary {:?}",
            stats.iter().map(|s| s.0).collect::<Vec<_>>(),
            stats.iter().map(|s| s.1).collect::<Vec<_>>()
        );
        println!("{label}: tenant-domain calls sent per primary {tenant_calls:?}, deployment-domain calls {deployment_calls:?}");
        if !exact {
            // Every script call of this phase is of a tenant domain.
            let total: u64 = stats.iter().map(|s| s.0).sum();
            let third = total as f64 / 3.0;
            for (i, (calls, _)) in stats.iter().enumerate() {
                let off = (*calls as f64 - third).abs() / third;
                assert!(
                    off <= 0.25,
                    "primary {i}: {calls} of {total} tenant-domain calls ({:.0} % off a third)",
                    off * 100.0
                );
            }
        }
    }
}

fn count(of: &[usize], n: usize) -> Vec<usize> {
    let mut out = vec![0; n];
    for &i in of {
        if let Some(c) = out.get_mut(i) {
            *c += 1;
        }
    }
    out
}

/// A request its tenant refuses costs one call: no key, hold or script
/// call in the deployment domain.
#[tokio::test]
async fn a_request_the_tenant_domain_refuses_never_touches_the_deployment_domain() {
    let h = H::new(Backend::ClusterTenant).await;
    let t = h.tpm(Scope::Tenant("acme".into()), 100, 100);
    let up = h.tpm(Scope::Upstream("up1".into()), 10_000, 10_000);
    admitted(h.reserve_c("r0", 80, std::slice::from_ref(&t), &[]).await);
    let d = denied(
        h.reserve_c("r1", 50, std::slice::from_ref(&t), &[vec![up.clone()]])
            .await,
    );
    assert_eq!(d.scope, Scope::Tenant("acme".into()));
    let keys = h.keys().await;
    assert!(
        keys.iter().all(|k| !k.contains(".d.")),
        "the deployment domain was written: {keys:?}"
    );
    assert!(matches!(
        h.store.void("r0", 0).await.expect("void"),
        SettleOutcome::Settled { .. }
    ));
    assert_eq!(h.remaining(&t).await, 100);
    // Admitted on both, then settled on both (one placement, two holds).
    let a = admitted(
        h.reserve_c("r2", 50, std::slice::from_ref(&t), &[vec![up.clone()]])
            .await,
    );
    assert_eq!(a.budgets.len(), 2);
    assert_eq!(h.remaining(&t).await, 50);
    assert_eq!(h.remaining(&up).await, 9_950);
    assert!(matches!(
        h.settle("r2", 20).await,
        SettleOutcome::Settled { .. }
    ));
    assert_eq!(h.remaining(&t).await, 80);
    assert_eq!(h.remaining(&up).await, 9_980);
    assert_eq!(h.settle("r2", 20).await, SettleOutcome::AlreadySettled);
    let keys = h.keys().await;
    let holds: BTreeMap<bool, usize> =
        keys.iter()
            .filter(|k| k.contains(":hold:"))
            .fold(BTreeMap::new(), |mut m, k| {
                *m.entry(k.contains(".d.")).or_default() += 1;
                m
            });
    assert_eq!(holds.get(&false), Some(&2), "r0 and r2: {keys:?}");
    assert_eq!(holds.get(&true), Some(&1), "{keys:?}");
    h.check_keys().await;
}

/// The deployment domain refuses: the tenant hold is voided at once (every
/// tenant budget as before), the refusal names the deployment, and the id
/// is free again, as one domain would have left it.
#[tokio::test]
async fn a_deployment_refusal_voids_the_tenant_hold() {
    let h = H::new(Backend::ClusterTenant).await;
    let t = h.tpm(Scope::Tenant("acme".into()), 1000, 1000);
    let up = h.tpm(Scope::Upstream("up1".into()), 100, 100);
    admitted(
        h.reserve_c("r0", 80, std::slice::from_ref(&t), &[vec![up.clone()]])
            .await,
    );
    let d = denied(
        h.reserve_c("r", 50, std::slice::from_ref(&t), &[vec![up.clone()]])
            .await,
    );
    assert_eq!(d.scope, Scope::Upstream("up1".into()));
    assert_eq!(
        h.remaining(&t).await,
        920,
        "the refused request's tenant hold is voided"
    );
    assert!(matches!(
        h.store.void("r0", 0).await.expect("void"),
        SettleOutcome::Settled { .. }
    ));
    assert_eq!((h.remaining(&t).await, h.remaining(&up).await), (1000, 100));
    let a = admitted(
        h.reserve_c("r", 50, std::slice::from_ref(&t), &[vec![up.clone()]])
            .await,
    );
    assert!(!a.replayed);
    assert_eq!((h.remaining(&t).await, h.remaining(&up).await), (950, 50));
    // A lost reply's compensation (a void of the id) reaches both holds.
    assert!(matches!(
        h.store.void("r", 120 * SEC).await.expect("void"),
        SettleOutcome::Settled { .. }
    ));
    assert_eq!((h.remaining(&t).await, h.remaining(&up).await), (1000, 100));
    h.check_keys().await;
}

#[test]
fn the_test_key_space_places_tenants_and_deployments_apart() {
    let ks = tenant_layout("bg", "d");
    let t = ks.budget(&Scope::Tenant("acme".into()), BudgetName::Tpm);
    let u = ks.budget(&Scope::Upstream("up1".into()), BudgetName::Tpm);
    assert_eq!(t, "bg:{d.t.acme}:v3:tenant:acme:tpm");
    assert_eq!(u, "bg:{d.d.a}:v3:upstream:up1:tpm");
}

/// The domain of each call, by which the gateway's store guard keys its
/// turns and breaker (`budget::guarded`): a reservation's is its tenant
/// domain's (asked first), its hold calls wait where it did, and the
/// `single` layout has one domain.
#[tokio::test]
async fn calls_wait_in_the_domain_they_go_to_first() {
    let h = H::new(Backend::ClusterTenant).await;
    let a = h.tpm(Scope::Tenant("acme".into()), 1000, 1000);
    let b = h.tpm(Scope::Tenant("beta".into()), 1000, 1000);
    let up = h.tpm(Scope::Upstream("up1".into()), 10_000, 10_000);
    let ra = request("ra", 10, vec![a.clone()], vec![vec![up.clone()]]);
    let rb = request("rb", 10, vec![b.clone()], vec![vec![up.clone()]]);
    let (da, db) = (
        h.store.domain_of_reservation(&ra),
        h.store.domain_of_reservation(&rb),
    );
    assert!(da != 0 && db != 0 && da != db, "{da} {db}");
    assert_eq!(h.store.domain_of_budget(&a), da);
    assert_ne!(h.store.domain_of_budget(&up), da);
    let deployment_only = request("ru", 10, Vec::new(), vec![vec![up.clone()]]);
    assert_eq!(
        h.store.domain_of_reservation(&deployment_only),
        h.store.domain_of_budget(&up)
    );
    admitted(h.store.reserve(&ra).await.expect("reserve"));
    assert_eq!(h.store.domain_of_hold("ra"), da);
    assert_eq!(h.store.domain_of_hold("unplaced"), 0, "a `single` id");

    let s = H::new(Backend::Cluster).await;
    let a = s.tpm(Scope::Tenant("acme".into()), 1000, 1000);
    let up = s.tpm(Scope::Upstream("up1".into()), 10_000, 10_000);
    let ra = request("ra", 10, vec![a.clone()], vec![vec![up.clone()]]);
    assert_eq!(s.store.domain_of_reservation(&ra), 0);
    assert_eq!(s.store.domain_of_budget(&up), 0);
    admitted(s.store.reserve(&ra).await.expect("reserve"));
    assert_eq!(s.store.domain_of_hold("ra"), 0);
}

/// The store beneath the gateway's layers, counting the reservations that
/// reach it and those that name a deployment's budgets (a second call in
/// the `tenant` layout).
struct Counting {
    inner: Arc<dyn BudgetStore>,
    reserves: std::sync::atomic::AtomicU64,
    with_deployment: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl BudgetStore for Counting {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.reserves.fetch_add(1, Relaxed);
        if req.candidates.iter().any(|c| !c.is_empty()) {
            self.with_deployment.fetch_add(1, Relaxed);
        }
        self.inner.reserve(req).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.inner.extend(id, step).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(id).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        self.inner.settle(id, s).await
    }
    async fn void(&self, id: &str, ttl: u64) -> Result<SettleOutcome, StoreError> {
        self.inner.void(id, ttl).await
    }
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        self.inner.inspect(specs).await
    }
    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.inner.lower(spec, at_most).await
    }
}

/// A leased deployment beside a tenant whose budgets stay exact (`lease =
/// "off"`, or too cold to lease) takes the deployment domain's call away:
/// once the deployment is leased, every reservation reaches the store with
/// the tenant's budgets alone (one call, in the tenant domain); the
/// deployment's units come from the lease, and every budget stays exact
/// (what the store counts plus what the lease holds is what was used).
#[tokio::test]
async fn a_leased_deployment_takes_the_second_call_away() {
    use budgetgate::admission::deny::DenyCachedStore;
    use budgetgate::admission::quota_lease::{LeaseOff, QuotaLeases};
    use budgetgate::admission::{AnsweredBy, GatewayStore};
    use budgetgate::budget::deny_cache::DenyCache;
    use budgetgate::budget::memory::MemoryStore;
    use budgetgate::budget::Actual;
    use budgetgate::config::store::LeasePolicy;
    use std::sync::atomic::Ordering::Relaxed;

    let h = H::new(Backend::ClusterTenant).await;
    let t = h.tpm(Scope::Tenant("acme".into()), 1_000_000, 1_000_000);
    let up = h.tpm(Scope::Upstream("up1".into()), 1_000_000, 1_000_000);
    let counting = Arc::new(Counting {
        inner: h.store.clone(),
        reserves: Default::default(),
        with_deployment: Default::default(),
    });
    let policy = LeasePolicy {
        min_rate: 1,
        ..LeasePolicy::default()
    };
    let leases = Arc::new(QuotaLeases::new(
        &policy,
        LeaseOff {
            tenants: vec!["acme".into()],
            ..LeaseOff::default()
        },
        h.leases.clone(),
        Duration::from_secs(5),
        "split",
    ));
    leases.set_split(true);
    let clock = Arc::new(h.clock.clone());
    let inner: Arc<dyn BudgetStore> = counting.clone();
    let gw = GatewayStore::new(
        DenyCachedStore::new(inner, Arc::new(DenyCache::with_capacity(16)), clock.clone()),
        Arc::new(MemoryStore::new(clock)),
        1.0,
    )
    .with_leases(leases.clone());
    let used = |tokens: u64| Settlement {
        actual_tokens: tokens,
        upstream_failed: false,
        actual: Actual::PerSpec(vec![tokens, tokens]),
    };
    let mut spent = 0;
    for i in 0..10 {
        let r = request(
            &format!("w{i}"),
            100,
            vec![t.clone()],
            vec![vec![up.clone()]],
        );
        admitted(gw.reserve(&r).await.expect("reserve"));
        gw.settle(&r.id, &used(60)).await.expect("settle");
        spent += 60;
    }
    assert_eq!(counting.with_deployment.load(Relaxed), 10, "two calls each");
    leases.round().await;
    assert_eq!(leases.leases(), 1, "the deployment alone is leased");
    let key = up.key.to_string();
    let (reserves, deployment) = (
        counting.reserves.load(Relaxed),
        counting.with_deployment.load(Relaxed),
    );
    for i in 0..20 {
        let r = request(
            &format!("s{i}"),
            100,
            vec![t.clone()],
            vec![vec![up.clone()]],
        );
        let (o, by) = gw.reserve_answered(&r).await.expect("reserve");
        admitted(o);
        assert_eq!(by, AnsweredBy::Split);
        gw.settle_at(by, &r.id, &used(40)).await.expect("settle");
        spent += 40;
    }
    assert_eq!(
        counting.with_deployment.load(Relaxed) - deployment,
        0,
        "no reservation reached the deployment domain"
    );
    assert_eq!(
        counting.reserves.load(Relaxed) - reserves,
        20,
        "one store call each"
    );
    let lease_holds = leases.leased_units(&key).expect("a lease");
    assert_eq!(h.remaining(&t).await, 1_000_000 - spent);
    assert_eq!(
        h.remaining(&up).await + lease_holds,
        1_000_000 - spent,
        "the deployment: the store's count plus the lease's unspent units"
    );
    let keys = h.keys().await;
    let deployment_holds: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains(".d.") && k.contains(":hold:s"))
        .collect();
    assert!(
        deployment_holds.is_empty(),
        "split reservations hold nothing in the deployment domain: {deployment_holds:?}"
    );
}
