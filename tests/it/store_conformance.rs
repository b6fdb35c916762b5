//! One conformance suite for every [`BudgetStore`]: each test below runs
//! unchanged against the memory store, the Redis store on one node, and the
//! Redis store on a 3-node Redis Cluster (DESIGN section 3). Time comes from
//! one [`ManualClock`] per test (the Redis store passes it to the scripts
//! through its hidden `with_test_clock` constructor), so nothing sleeps and
//! every expected value is exact.
//!
//! Runs in every `cargo test` (needs `redis-server` and `redis-cli` on PATH).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::share_conformance::{
    a_tenants_oldest_waiter_goes_first_fleet_wide, a_waiting_higher_class_goes_first_fleet_wide,
    a_waiting_tenant_behind_its_share_gets_the_capacity_first,
};
use crate::support::redis_server;
use crate::support::NOON;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::placement::{DomainMap, Layout};
use budgetgate::budget::quota_lease::LeaseStore;
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{
    Admission, BudgetKind, BudgetName, BudgetSpec, BudgetStore, Denial, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement,
    Slide, Window,
};
use budgetgate::clock::{Clock, ManualClock};

/// Concurrency lease of every test reservation, µs.
const LEASE: u64 = 10_000_000;
/// Hold lifetime of every test reservation, µs.
const HOLD_TTL: u64 = 120_000_000;
const SEC: u64 = 1_000_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Backend {
    Memory,
    Redis,
    Cluster,
    /// The cluster in the `tenant` layout: tenant and deployment budgets
    /// in their own domains (slots), reservations over both.
    ClusterTenant,
}

/// Every deployment the conformance suites name, in one group (as if one
/// model were served by them all), so that candidates share a domain.
const TEST_DEPLOYMENTS: &[&str] = &[
    "a",
    "b",
    "azure/east",
    "east",
    "in",
    "m",
    "openai",
    "u",
    "u/1",
    "up1",
    "up2",
    "up3",
    "up4",
    "usd",
];

/// The key space of a test in the `tenant` layout.
pub(crate) fn tenant_layout(prefix: &str, domain: &str) -> KeySpace {
    let map = DomainMap::new(
        domain,
        std::iter::empty(),
        std::iter::once(TEST_DEPLOYMENTS.to_vec()),
    );
    KeySpace::new(prefix, domain).with_layout(Layout::Tenant, Some(Arc::new(map)))
}

/// Raw access to the Redis behind a store, for checks the trait cannot make.
pub(crate) enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster {
        cluster: redis::cluster_async::ClusterConnection,
        nodes: Vec<redis::aio::MultiplexedConnection>,
    },
}

impl Raw {
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let r = match self {
            Raw::Single(c) => cmd.query_async(&mut c.clone()).await,
            Raw::Cluster { cluster, .. } => cmd.query_async(&mut cluster.clone()).await,
        };
        r.unwrap_or_else(|e| panic!("redis {cmd:?}: {e}"))
    }

    fn nodes(&self) -> Vec<redis::aio::MultiplexedConnection> {
        match self {
            Raw::Single(c) => vec![c.clone()],
            Raw::Cluster { nodes, .. } => nodes.clone(),
        }
    }
}

/// One test's store, clock and key space.
pub(crate) struct H {
    pub(crate) backend: Backend,
    pub(crate) store: Arc<dyn BudgetStore>,
    /// The same store's quota leases (`lease_conformance`).
    pub(crate) leases: Arc<dyn LeaseStore>,
    pub(crate) clock: ManualClock,
    pub(crate) ks: KeySpace,
    prefix: String,
    pub(crate) raw: Option<Raw>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

async fn node_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
}

impl H {
    pub(crate) async fn new(backend: Backend) -> H {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        // Tests share one server: each gets its own prefix, and its own
        // domain (so, on the cluster, its own hash tag and slot).
        let prefix = format!("bgt{}x{n}", std::process::id());
        let domain = format!("d{n}");
        let ks = match backend {
            Backend::ClusterTenant => tenant_layout(&prefix, &domain),
            _ => KeySpace::new(&prefix, &domain),
        };
        let clock = ManualClock::new(NOON);
        let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
        fn both<S: BudgetStore + LeaseStore>(
            s: Arc<S>,
        ) -> (Arc<dyn BudgetStore>, Arc<dyn LeaseStore>) {
            (s.clone(), s)
        }
        let ((store, leases), raw) = match backend {
            Backend::Memory => (both(Arc::new(MemoryStore::new(dyn_clock))), None),
            Backend::Redis => {
                let server = redis_server::shared();
                let store = RedisStore::connect(&server.url(), Duration::from_secs(5), ks.clone())
                    .await
                    .expect("connect RedisStore")
                    .with_test_clock(dyn_clock);
                (
                    both(Arc::new(store)),
                    Some(Raw::Single(node_conn(&server.url()).await)),
                )
            }
            Backend::Cluster | Backend::ClusterTenant => {
                let cluster = redis_server::shared_cluster();
                let layout = match backend {
                    Backend::ClusterTenant => Layout::Tenant,
                    _ => Layout::Single,
                };
                let store = RedisStore::connect(&cluster.url(), Duration::from_secs(5), ks.clone())
                    .await
                    .expect("connect RedisStore to the cluster")
                    .with_test_clock(dyn_clock)
                    .with_layout(layout);
                let client = redis::cluster::ClusterClient::new(cluster.node_urls())
                    .expect("cluster client");
                let conn = client
                    .get_async_connection()
                    .await
                    .expect("cluster connection");
                let mut nodes = Vec::new();
                for u in cluster.node_urls() {
                    nodes.push(node_conn(&u).await);
                }
                (
                    both(Arc::new(store)),
                    Some(Raw::Cluster {
                        cluster: conn,
                        nodes,
                    }),
                )
            }
        };
        H {
            backend,
            store,
            leases,
            clock,
            ks,
            prefix,
            raw,
        }
    }

    pub(crate) fn spec(&self, scope: Scope, name: BudgetName, kind: BudgetKind) -> BudgetSpec {
        BudgetSpec {
            key: self.ks.budget(&scope, name).into(),
            scope,
            name,
            kind,
            refund_unused: true,
            shadow: false,
        }
    }

    pub(crate) fn tpm(&self, scope: Scope, per_minute: u64, burst: u64) -> BudgetSpec {
        self.spec(
            scope,
            BudgetName::Tpm,
            BudgetKind::Bucket { per_minute, burst },
        )
    }

    pub(crate) fn rpm(&self, scope: Scope, per_minute: u64, burst: u64) -> BudgetSpec {
        self.spec(
            scope,
            BudgetName::Rpm,
            BudgetKind::Bucket { per_minute, burst },
        )
    }

    pub(crate) fn per_day(&self, scope: Scope, limit: u64) -> BudgetSpec {
        self.spec(
            scope,
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit,
                window: Window::Day,
            },
        )
    }

    pub(crate) fn per_month(&self, scope: Scope, limit: u64) -> BudgetSpec {
        self.spec(
            scope,
            BudgetName::TokensPerMonth,
            BudgetKind::Quota {
                limit,
                window: Window::Month,
            },
        )
    }

    pub(crate) fn slots(&self, scope: Scope, max: u64) -> BudgetSpec {
        self.spec(
            scope,
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max },
        )
    }

    pub(crate) async fn reserve(
        &self,
        id: &str,
        tokens: u64,
        common: &[BudgetSpec],
    ) -> ReserveOutcome {
        self.reserve_c(id, tokens, common, &[]).await
    }

    pub(crate) async fn reserve_c(
        &self,
        id: &str,
        tokens: u64,
        common: &[BudgetSpec],
        candidates: &[Vec<BudgetSpec>],
    ) -> ReserveOutcome {
        let req = ReserveRequest {
            share: None,
            id: id.to_string(),
            costs: budgetgate::budget::Costs::tokens(tokens),
            common: common.to_vec(),
            candidates: candidates.to_vec(),
            slot_lease_micros: LEASE,
            hold_ttl_micros: HOLD_TTL,
            requester: Default::default(),
        };
        self.store.reserve(&req).await.expect("reserve")
    }

    /// A reservation whose specs cost `costs` (per candidate: common specs,
    /// then the candidate's own).
    async fn reserve_amounts(
        &self,
        id: &str,
        costs: Vec<Vec<u64>>,
        common: &[BudgetSpec],
        candidates: &[Vec<BudgetSpec>],
    ) -> ReserveOutcome {
        let req = ReserveRequest {
            share: None,
            id: id.to_string(),
            costs: budgetgate::budget::Costs {
                tokens: costs[0][0],
                per_candidate: costs,
            },
            common: common.to_vec(),
            candidates: candidates.to_vec(),
            slot_lease_micros: LEASE,
            hold_ttl_micros: HOLD_TTL,
            requester: Default::default(),
        };
        self.store.reserve(&req).await.expect("reserve")
    }

    pub(crate) async fn admit(&self, id: &str, tokens: u64, common: &[BudgetSpec]) -> Admission {
        admitted(self.reserve(id, tokens, common).await)
    }

    async fn extend(&self, id: &str, tokens: u64) -> ExtendOutcome {
        self.store
            .extend(id, &budgetgate::budget::Step::tokens(tokens))
            .await
            .expect("extend")
    }

    async fn renew(&self, id: &str) -> RenewOutcome {
        self.store.renew(id).await.expect("renew")
    }

    pub(crate) async fn settle(&self, id: &str, actual_tokens: u64) -> SettleOutcome {
        self.store
            .settle(
                id,
                &Settlement {
                    actual_tokens,
                    upstream_failed: false,
                    actual: budgetgate::budget::Actual::Tokens,
                },
            )
            .await
            .expect("settle")
    }

    /// Remaining units of one budget now.
    pub(crate) async fn remaining(&self, spec: &BudgetSpec) -> i64 {
        self.store
            .inspect(std::slice::from_ref(spec))
            .await
            .expect("inspect")[0]
            .remaining
    }

    /// `(remaining, reset µs)` of one budget now.
    pub(crate) async fn state(&self, spec: &BudgetSpec) -> (i64, u64) {
        let s = &self
            .store
            .inspect(std::slice::from_ref(spec))
            .await
            .expect("inspect")[0];
        (s.remaining, s.reset_micros)
    }

    /// Raw value of a key (`None` for the memory store or an absent key).
    async fn raw_get(&self, key: &str) -> Option<String> {
        match &self.raw {
            None => None,
            Some(r) => r.query(redis::cmd("GET").arg(key)).await,
        }
    }

    /// Every key of this test, on every node.
    pub(crate) async fn keys(&self) -> Vec<String> {
        let Some(raw) = &self.raw else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for mut node in raw.nodes() {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}:*", self.prefix))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut node)
                    .await
                    .expect("SCAN");
                out.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        out.sort();
        out
    }

    /// Asserts that every key this test wrote has a TTL, and (on the
    /// cluster) that they all live on one slot. Returns how many keys exist.
    pub(crate) async fn check_keys(&self) -> usize {
        let Some(raw) = &self.raw else {
            return 0;
        };
        let keys = self.keys().await;
        for k in &keys {
            let ttl: i64 = raw.query(redis::cmd("PTTL").arg(k)).await;
            assert!(
                ttl > 0,
                "{:?}: key {k} has no TTL (PTTL {ttl})",
                self.backend
            );
        }
        if self.backend == Backend::ClusterTenant {
            // Each key in a tenant tree's domain or a deployment group's.
            let domain = self.ks.base().split(['{', '}']).nth(1).unwrap_or("");
            for k in &keys {
                let tag = budgetgate::budget::keys::hash_tag(k).unwrap_or("");
                // The store's own domain holds the holds of budget-less reservations.
                assert!(
                    tag == domain
                        || tag.starts_with(&format!("{domain}.t."))
                        || tag.starts_with(&format!("{domain}.d.")),
                    "key {k} outside the tenant layout's domains"
                );
            }
            return keys.len();
        }
        if let Raw::Cluster { nodes, .. } = raw {
            let mut slots = std::collections::BTreeSet::new();
            for k in keys.iter().chain(std::iter::once(&self.ks.hold("probe"))) {
                let slot: i64 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(k)
                    .query_async(&mut nodes[0].clone())
                    .await
                    .expect("CLUSTER KEYSLOT");
                slots.insert(slot);
            }
            assert_eq!(slots.len(), 1, "keys on several slots: {keys:?}");
        }
        keys.len()
    }
}

pub(crate) fn admitted(o: ReserveOutcome) -> Admission {
    match o {
        ReserveOutcome::Admitted(a) => a,
        other => panic!("expected admission, got {other:?}"),
    }
}

pub(crate) fn denied(o: ReserveOutcome) -> Denial {
    match o {
        ReserveOutcome::Denied(d) => d,
        other => panic!("expected denial, got {other:?}"),
    }
}

fn impossible(o: ReserveOutcome) -> Impossibility {
    match o {
        ReserveOutcome::Impossible(i) => i,
        other => panic!("expected impossible, got {other:?}"),
    }
}

pub(crate) fn tenant() -> Scope {
    Scope::Tenant("acme".into())
}

fn upstream(name: &str) -> Scope {
    Scope::Upstream(name.into())
}

/// Runs each named test against the memory store, Redis and Redis Cluster
/// (`H`, `Backend` and the tests in scope where it is invoked).
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::H::new(super::Backend::Memory).await).await;
            })*
        }
        mod redis_single {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::H::new(super::Backend::Redis).await).await;
            })*
        }
        mod redis_cluster {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::H::new(super::Backend::Cluster).await).await;
            })*
        }
        mod redis_cluster_tenant_layout {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::H::new(super::Backend::ClusterTenant).await).await;
            })*
        }
    };
}

pub(crate) use conformance;

conformance!(
    admission_denial_and_exact_retry_after,
    refill_over_time_is_exact,
    debt_is_repaid_before_admitting_again,
    refund_never_exceeds_capacity,
    quotas_reset_at_the_utc_day_and_month_boundary,
    quota_refund_goes_only_to_the_debited_window,
    concurrency_leases_expire,
    renew_extends_live_leases_but_never_resurrects_expired_ones,
    extend_full_partial_and_exhausted,
    extension_is_charged_to_the_current_window,
    reserve_and_settle_are_idempotent,
    expired_hold_is_unknown,
    impossible_requests,
    candidates_fall_back_in_order,
    upstream_refusal_leaves_tenant_budgets_untouched,
    every_key_has_a_ttl_after_each_operation,
    clock_going_backwards_is_harmless,
    upstream_failure_refunds_non_refundable_budgets,
    shadow_budgets_report_but_never_block,
    lowering_follows_the_provider_and_never_raises,
    a_raised_limit_applies_to_a_refused_tenant_at_once,
    an_overrun_is_enforced_in_full,
    void_before_reserve_leaves_every_budget_unchanged,
    void_after_reserve_refunds_every_budget,
    each_budget_is_charged_its_own_amount,
    a_priced_extension_grants_what_the_rest_can_buy,
    common_budgets_are_costed_per_candidate,
    a_waiting_tenant_behind_its_share_gets_the_capacity_first,
    a_waiting_higher_class_goes_first_fleet_wide,
    a_tenants_oldest_waiter_goes_first_fleet_wide,
    holds_on_names_the_live_holds_of_each_budget,
    a_5h_window_admits_again_when_its_oldest_sub_bucket_slides_out,
    a_window_from_first_use_starts_at_the_first_use_and_resets_at_its_end,
    a_rolling_windows_next_slide_is_its_oldest_sub_bucket_still_counted,
);

/// `slides` (the admin API's `next_slide`): a rolling window's oldest
/// units still counted, when they slide out and how many; none for other
/// budgets or an empty window. Read in both domains at once.
async fn a_rolling_windows_next_slide_is_its_oldest_sub_bucket_still_counted(h: H) {
    const G: u64 = 300 * SEC;
    let five = h.spec(
        tenant(),
        BudgetName::TokensPer5h,
        BudgetKind::Quota {
            limit: 1000,
            window: Window::Hours5,
        },
    );
    let day = h.per_day(tenant(), 10_000);
    let up = h.tpm(upstream("east"), 1000, 1000);
    let start = NOON - NOON % G + 7 * SEC;
    h.clock.set(start);
    let all = [five.clone(), day.clone(), up.clone()];
    let none = h.store.slides(&all).await.expect("slides");
    assert_eq!(none, vec![None, None, None]);
    h.admit("a", 300, &[five.clone(), day.clone()]).await;
    h.clock.advance(3 * G);
    h.admit("b", 200, std::slice::from_ref(&five)).await;
    let out = start - 7 * SEC + 61 * G;
    let now = h.clock.now_micros();
    let slides = h.store.slides(&all).await.expect("slides");
    assert_eq!(
        slides,
        vec![
            Some(Slide {
                in_micros: out - now,
                units: 300
            }),
            None,
            None
        ]
    );
    h.clock.set(out);
    let slides = h
        .store
        .slides(std::slice::from_ref(&five))
        .await
        .expect("slides");
    assert_eq!(
        slides,
        vec![Some(Slide {
            in_micros: 3 * G,
            units: 200
        })]
    );
}

/// A 5-hour window from first use (`window = "from_first_use"`): it starts
/// at the first admission and counts until its end, refusing at the limit
/// with the retry hint exactly that end; a refund settled after the end
/// goes nowhere, a settlement that charges nothing starts no window, and
/// the next use starts the next window, whose refunds apply.
async fn a_window_from_first_use_starts_at_the_first_use_and_resets_at_its_end(h: H) {
    const W: u64 = 5 * 3_600 * SEC;
    let spec = h.spec(
        tenant(),
        BudgetName::TokensPer5h,
        BudgetKind::Quota {
            limit: 1000,
            window: Window::FirstUse5h,
        },
    );
    let one = std::slice::from_ref(&spec);
    let start = NOON + 17 * SEC;
    h.clock.set(start);
    let a = h.admit("a", 600, one).await;
    assert_eq!(a.budgets[0].window, Some(Window::FirstUse5h));
    assert_eq!(
        (a.budgets[0].remaining, a.budgets[0].reset_micros),
        (400, W)
    );
    h.clock.set(start + W - 30 * SEC);
    let b = h.admit("b", 400, one).await;
    assert_eq!(
        (b.budgets[0].remaining, b.budgets[0].reset_micros),
        (0, 30 * SEC)
    );
    let d = denied(h.reserve("c", 100, one).await);
    assert_eq!(d.name, BudgetName::TokensPer5h);
    assert_eq!(d.retry_after_micros, 30 * SEC);
    assert_eq!(d.state.reset_micros, 30 * SEC);
    h.clock.set(start + W - 1);
    denied(h.reserve("c", 100, one).await);
    // b settles after the window ended: nothing comes back, nothing starts.
    h.clock.set(start + W + 10 * SEC);
    assert!(matches!(
        h.settle("b", 0).await,
        SettleOutcome::Settled { .. }
    ));
    assert_eq!(h.state(&spec).await, (1000, W));
    h.clock.advance(3_600 * SEC);
    assert_eq!(h.state(&spec).await, (1000, W), "no window started");
    let c = h.admit("c", 100, one).await;
    assert_eq!(
        (c.budgets[0].remaining, c.budgets[0].reset_micros),
        (900, W)
    );
    h.clock.advance(60 * SEC);
    h.settle("c", 40).await;
    assert_eq!(h.state(&spec).await, (960, W - 60 * SEC));
    h.check_keys().await;
}

/// A rolling 5-hour window (60 sub-buckets of 5 minutes, `budget::rolling`)
/// on an injected clock: refused at the limit, admitted again the instant
/// the oldest sub-bucket has slid out wholly, the retry hint exactly that
/// instant (within one sub-bucket of when an exact log would admit), and a
/// refund goes back to the sub-bucket of its reservation.
async fn a_5h_window_admits_again_when_its_oldest_sub_bucket_slides_out(h: H) {
    const G: u64 = 300 * SEC;
    const W: u64 = 5 * 3_600 * SEC;
    let spec = h.spec(
        tenant(),
        BudgetName::TokensPer5h,
        BudgetKind::Quota {
            limit: 1000,
            window: Window::Hours5,
        },
    );
    let one = std::slice::from_ref(&spec);
    // 7 s into a sub-bucket.
    let start = NOON - NOON % G + 7 * SEC;
    h.clock.set(start);
    let a = h.admit("a", 600, one).await;
    assert_eq!(a.budgets[0].window, Some(Window::Hours5));
    assert_eq!(a.budgets[0].reset_micros, 61 * G - 7 * SEC);
    h.clock.advance(3_600 * SEC);
    let b = h.admit("b", 400, one).await;
    assert_eq!(b.budgets[0].remaining, 0);
    // Empty once b's sub-bucket has slid out.
    assert_eq!(b.budgets[0].reset_micros, 61 * G - 7 * SEC);

    let now = h.clock.now_micros();
    let d = denied(h.reserve("c", 100, one).await);
    assert_eq!(d.name, BudgetName::TokensPer5h);
    assert_eq!((d.available, d.requested), (0, 100));
    // a's sub-bucket lies wholly beyond the window from start − 7 s + 61·g.
    let slides_out = start - 7 * SEC + 61 * G;
    assert_eq!(d.retry_after_micros, slides_out - now);
    assert_eq!(d.state.reset_micros, d.retry_after_micros);
    // An exact log admits once a's instant has left (start + W): the hint
    // is at most one sub-bucket later, never earlier.
    let exact = start + W - now;
    assert!(d.retry_after_micros >= exact && d.retry_after_micros - exact <= G);

    h.clock.set(slides_out - 1);
    denied(h.reserve("c", 100, one).await);
    h.clock.set(slides_out);
    assert_eq!(h.remaining(&spec).await, 600);
    // Late in that sub-bucket, c is admitted; settled in the next one, its
    // refund goes back to its own sub-bucket (the hold recorded it).
    h.clock.set(slides_out + G - 30 * SEC);
    let c = h.admit("c", 100, one).await;
    assert_eq!(c.budgets[0].remaining, 500);
    h.clock.advance(60 * SEC);
    h.settle("c", 40).await;
    assert_eq!(h.remaining(&spec).await, 560);
    // b's sub-bucket slides out next; then c's, which holds 40.
    h.clock.set(slides_out + 12 * G);
    assert_eq!(h.remaining(&spec).await, 960);
    h.clock.set(slides_out + 61 * G - 1);
    assert_eq!(h.state(&spec).await, (960, 1));
    h.clock.set(slides_out + 61 * G);
    assert_eq!(h.state(&spec).await, (1000, 0));
    h.check_keys().await;
}

/// "Why was this refused?" reads the holds in flight on a budget: the live
/// ones only, by reservation id, largest first; a settled hold is gone.
async fn holds_on_names_the_live_holds_of_each_budget(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let day = h.per_day(tenant(), 10_000);
    let other = h.tpm(upstream("east"), 1000, 1000);
    h.admit("a", 300, &[tpm.clone(), day.clone()]).await;
    h.admit("b", 200, &[tpm.clone(), day.clone()]).await;
    h.admit("c", 100, std::slice::from_ref(&tpm)).await;
    h.settle("a", 300).await;
    let held = h
        .store
        .holds_on(&[tpm.clone(), day.clone(), other.clone()])
        .await
        .expect("holds_on");
    assert_eq!((held[0].holds, held[0].units), (2, 300));
    assert_eq!(
        held[0].largest,
        vec![("b".to_string(), 200), ("c".to_string(), 100)]
    );
    assert_eq!((held[1].holds, held[1].units), (1, 200));
    assert_eq!((held[2].holds, held[2].units), (0, 0));
    assert!(held.iter().all(|h| !h.partial));
}

/// A request fits or waits exactly: 1000 tpm, 600 taken, 600 more must
/// wait for 200 tokens = 12 s to the microsecond.
async fn admission_denial_and_exact_retry_after(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let rpm = h.rpm(tenant(), 60, 60);
    let a = h.admit("a", 600, &[tpm.clone(), rpm.clone()]).await;
    assert_eq!(a.now_micros, NOON);
    assert_eq!(a.candidate, 0);
    assert!(!a.replayed);
    assert_eq!(a.budgets.len(), 2);
    assert_eq!(
        (a.budgets[0].name, a.budgets[0].remaining),
        (BudgetName::Tpm, 400)
    );
    assert_eq!(a.budgets[0].reset_micros, 36 * SEC);
    assert_eq!(a.budgets[0].limit, 1000);
    assert_eq!(
        (a.budgets[1].remaining, a.budgets[1].reset_micros),
        (59, SEC)
    );

    let d = denied(h.reserve("b", 600, &[tpm.clone(), rpm.clone()]).await);
    assert_eq!((d.name, d.scope.clone()), (BudgetName::Tpm, tenant()));
    assert_eq!((d.requested, d.available, d.limit), (600, 400, 1000));
    assert_eq!(d.retry_after_micros, 12 * SEC);
    assert_eq!(d.now_micros, NOON);
    assert_eq!((d.state.remaining, d.state.reset_micros), (400, 36 * SEC));

    h.clock.advance(12 * SEC - 1);
    let d = denied(h.reserve("b", 600, &[tpm.clone(), rpm.clone()]).await);
    assert_eq!(d.retry_after_micros, 1, "one unit short: 1 µs (ceiling)");
    h.clock.advance(1);
    let b = h.admit("b", 600, &[tpm.clone(), rpm.clone()]).await;
    assert_eq!(b.budgets[0].remaining, 0);
    assert_eq!(b.budgets[0].reset_micros, 60 * SEC);
    h.check_keys().await;
}

/// 1000 tokens/min refill one token per 60 ms, with no rounding drift.
async fn refill_over_time_is_exact(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    h.admit("a", 1000, std::slice::from_ref(&tpm)).await;
    assert_eq!(h.state(&tpm).await, (0, 60 * SEC));
    h.clock.advance(59_999);
    assert_eq!(h.remaining(&tpm).await, 0);
    h.clock.advance(1);
    assert_eq!(h.remaining(&tpm).await, 1);
    h.clock.advance(30 * SEC - 60_000);
    assert_eq!(h.state(&tpm).await, (500, 30 * SEC));
    h.clock.advance(90 * SEC);
    assert_eq!(h.state(&tpm).await, (1000, 0), "full, never above capacity");
    h.check_keys().await;
}

/// An underestimate settles as debt; the scope admits again only once
/// refill has repaid it. Indebted levels round toward −∞; debt is kept in
/// full (it used to stop at −capacity, forgiving the rest).
async fn debt_is_repaid_before_admitting_again(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    h.admit("a", 100, std::slice::from_ref(&tpm)).await;
    assert_eq!(
        h.settle("a", 1500).await,
        SettleOutcome::Settled {
            reserved: 100,
            refunded: 0,
            debt: 1400,
            now_micros: NOON
        }
    );
    assert_eq!(h.state(&tpm).await, (-500, 90 * SEC));
    let d = denied(h.reserve("b", 1, std::slice::from_ref(&tpm)).await);
    assert_eq!((d.available, d.retry_after_micros), (-500, 30_060_000));
    h.clock.advance(1);
    assert_eq!(
        h.remaining(&tpm).await,
        -500,
        "floor, not truncation toward zero"
    );
    h.clock.advance(30_060_000 - 1);
    h.admit("b", 1, std::slice::from_ref(&tpm)).await;

    let small = h.tpm(upstream("u"), 100, 100);
    h.admit("c", 100, std::slice::from_ref(&small)).await;
    h.settle("c", 10_000).await;
    assert_eq!(
        h.remaining(&small).await,
        -9_900,
        "debt kept in full, not clamped at −capacity"
    );
    h.check_keys().await;
}

async fn refund_never_exceeds_capacity(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    h.admit("a", 300, std::slice::from_ref(&tpm)).await;
    h.clock.advance(60 * SEC);
    assert_eq!(h.remaining(&tpm).await, 1000);
    assert_eq!(
        h.settle("a", 0).await,
        SettleOutcome::Settled {
            reserved: 300,
            refunded: 300,
            debt: 0,
            now_micros: NOON + 60 * SEC
        }
    );
    assert_eq!(h.remaining(&tpm).await, 1000);
    h.admit("b", 500, std::slice::from_ref(&tpm)).await;
    h.settle("b", 200).await;
    assert_eq!(h.remaining(&tpm).await, 800);
    h.check_keys().await;
}

async fn quotas_reset_at_the_utc_day_and_month_boundary(h: H) {
    let day = h.per_day(tenant(), 1000);
    let day_end = Window::Day.end(NOON);
    h.clock.set(day_end - 1);
    let a = h.admit("a", 800, std::slice::from_ref(&day)).await;
    assert_eq!(a.budgets[0].remaining, 200);
    assert_eq!(a.budgets[0].reset_micros, 1);
    assert_eq!(a.budgets[0].window, Some(Window::Day));
    let d = denied(h.reserve("b", 300, std::slice::from_ref(&day)).await);
    assert_eq!(d.name, BudgetName::TokensPerDay);
    assert_eq!(
        (d.available, d.requested, d.retry_after_micros),
        (200, 300, 1)
    );
    h.clock.advance(1);
    let b = h.admit("b", 300, std::slice::from_ref(&day)).await;
    assert_eq!(b.budgets[0].remaining, 700);
    assert_eq!(b.budgets[0].reset_micros, 86_400 * SEC);

    // 2026-11-30 → 2026-12-01, then December has 31 days.
    let month = h.per_month(upstream("m"), 1000);
    let month_end = Window::Month.end(NOON);
    h.clock.set(month_end - 5);
    h.admit("c", 1000, std::slice::from_ref(&month)).await;
    let d = denied(h.reserve("d", 1, std::slice::from_ref(&month)).await);
    assert_eq!(
        (d.name, d.retry_after_micros),
        (BudgetName::TokensPerMonth, 5)
    );
    h.clock.advance(5);
    let a = h.admit("d", 1, std::slice::from_ref(&month)).await;
    assert_eq!(a.budgets[0].remaining, 999);
    assert_eq!(a.budgets[0].reset_micros, 31 * 86_400 * SEC);

    let rpd = h.spec(
        tenant(),
        BudgetName::RequestsPerDay,
        BudgetKind::Quota {
            limit: 2,
            window: Window::Day,
        },
    );
    h.admit("e", 500, std::slice::from_ref(&rpd)).await;
    h.admit("f", 500, std::slice::from_ref(&rpd)).await;
    let d = denied(h.reserve("g", 500, std::slice::from_ref(&rpd)).await);
    assert_eq!((d.requested, d.available), (1, 0));
    h.check_keys().await;
}

/// A refund after the window rolled over is dropped: it belongs to a day
/// that is over, and crediting it to today would exceed today's quota.
async fn quota_refund_goes_only_to_the_debited_window(h: H) {
    let day = h.per_day(tenant(), 1000);
    h.clock.set(Window::Day.end(NOON) - 10);
    h.admit("a", 800, std::slice::from_ref(&day)).await;
    h.clock.advance(10);
    h.admit("b", 100, std::slice::from_ref(&day)).await;
    assert_eq!(h.remaining(&day).await, 900);
    assert!(matches!(
        h.settle("a", 0).await,
        SettleOutcome::Settled { .. }
    ));
    assert_eq!(
        h.remaining(&day).await,
        900,
        "yesterday's refund is dropped"
    );
    h.settle("b", 40).await;
    assert_eq!(h.remaining(&day).await, 960, "today's refund applies");
    h.check_keys().await;
}

async fn concurrency_leases_expire(h: H) {
    let slots = h.slots(tenant(), 2);
    let a = h.admit("a", 1, std::slice::from_ref(&slots)).await;
    assert!(
        a.budgets.is_empty(),
        "concurrency is not reported in budgets"
    );
    h.admit("b", 1, std::slice::from_ref(&slots)).await;
    let d = denied(h.reserve("c", 1, std::slice::from_ref(&slots)).await);
    assert_eq!(d.name, BudgetName::MaxConcurrent);
    assert_eq!((d.available, d.requested, d.retry_after_micros), (0, 1, 0));
    assert_eq!(h.remaining(&slots).await, 0);
    h.clock.advance(LEASE - 1);
    denied(h.reserve("c", 1, std::slice::from_ref(&slots)).await);
    h.clock.advance(1);
    assert_eq!(h.remaining(&slots).await, 2, "leases end at lease_until");
    h.admit("c", 1, std::slice::from_ref(&slots)).await;
    assert_eq!(h.remaining(&slots).await, 1);
    h.settle("c", 1).await;
    assert_eq!(h.remaining(&slots).await, 2);
    h.check_keys().await;
}

async fn renew_extends_live_leases_but_never_resurrects_expired_ones(h: H) {
    let slots = h.slots(tenant(), 1);
    h.admit("a", 1, std::slice::from_ref(&slots)).await;
    h.clock.advance(6 * SEC);
    assert_eq!(
        h.renew("a").await,
        RenewOutcome::Renewed {
            slot_lease_until_micros: NOON + 16 * SEC
        }
    );
    h.clock.advance(6 * SEC);
    denied(h.reserve("b", 1, std::slice::from_ref(&slots)).await);
    h.clock.advance(4 * SEC);
    h.admit("b", 1, std::slice::from_ref(&slots)).await;
    // a's hold lives on, its lease does not: renewing it must not take a slot back.
    assert!(matches!(h.renew("a").await, RenewOutcome::Renewed { .. }));
    assert_eq!(h.remaining(&slots).await, 0);
    h.settle("b", 1).await;
    assert_eq!(h.remaining(&slots).await, 1, "a holds no slot");
    assert_eq!(h.renew("b").await, RenewOutcome::AlreadySettled);
    assert_eq!(h.renew("nope").await, RenewOutcome::Unknown);
    h.check_keys().await;
}

async fn extend_full_partial_and_exhausted(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let day = h.per_day(tenant(), 10_000);
    let rpm = h.rpm(tenant(), 10, 10);
    let both = [tpm.clone(), day.clone(), rpm.clone()];
    h.admit("a", 500, &both).await;
    assert_eq!(
        h.extend("a", 300).await,
        ExtendOutcome::Extended {
            granted: 300,
            now_micros: NOON
        }
    );
    assert_eq!(h.remaining(&tpm).await, 200);
    assert_eq!(h.remaining(&day).await, 9_200);
    assert_eq!(
        h.remaining(&rpm).await,
        9,
        "extensions never charge requests"
    );
    assert_eq!(
        h.extend("a", 300).await,
        ExtendOutcome::Extended {
            granted: 200,
            now_micros: NOON
        },
        "partial: the largest amount every budget admits"
    );
    let ExtendOutcome::Exhausted(d) = h.extend("a", 10).await else {
        panic!("expected exhaustion");
    };
    assert_eq!((d.name, d.requested, d.available), (BudgetName::Tpm, 10, 0));
    assert_eq!(d.retry_after_micros, 60_000, "one token at 1000/min");
    assert_eq!((d.state.remaining, d.state.reset_micros), (0, 60 * SEC));
    assert_eq!(
        h.settle("a", 1000).await,
        SettleOutcome::Settled {
            reserved: 1000,
            refunded: 0,
            debt: 0,
            now_micros: NOON
        }
    );
    assert_eq!(h.extend("a", 1).await, ExtendOutcome::AlreadySettled);
    assert_eq!(h.extend("nope", 1).await, ExtendOutcome::Unknown);
    h.check_keys().await;
}

async fn extension_is_charged_to_the_current_window(h: H) {
    let day = h.per_day(tenant(), 1000);
    h.clock.set(Window::Day.end(NOON) - 10);
    h.admit("b", 100, std::slice::from_ref(&day)).await;
    h.clock.advance(10);
    assert!(matches!(
        h.extend("b", 50).await,
        ExtendOutcome::Extended { granted: 50, .. }
    ));
    assert_eq!(h.remaining(&day).await, 950);
    let s = h.settle("b", 0).await;
    assert!(matches!(
        s,
        SettleOutcome::Settled {
            reserved: 150,
            refunded: 150,
            ..
        }
    ));
    assert_eq!(
        h.remaining(&day).await,
        1000,
        "only today's 50 come back today"
    );
    h.check_keys().await;
}

async fn reserve_and_settle_are_idempotent(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let first = h.admit("a", 100, std::slice::from_ref(&tpm)).await;
    h.clock.advance(SEC);
    let again = h.admit("a", 100, std::slice::from_ref(&tpm)).await;
    assert!(again.replayed);
    assert_eq!(
        Admission {
            replayed: false,
            ..again
        },
        first,
        "a replay answers the first admission"
    );
    // Debited once: 900 + one second of refill (16.67 → 16 tokens).
    assert_eq!(h.remaining(&tpm).await, 916);
    assert!(matches!(
        h.settle("a", 50).await,
        SettleOutcome::Settled { refunded: 50, .. }
    ));
    assert_eq!(h.settle("a", 50).await, SettleOutcome::AlreadySettled);
    assert_eq!(h.settle("a", 0).await, SettleOutcome::AlreadySettled);
    assert_eq!(h.remaining(&tpm).await, 966, "refunded exactly once");
    let late = admitted(h.reserve("a", 100, std::slice::from_ref(&tpm)).await);
    assert!(late.replayed);
    assert!(
        late.budgets.is_empty(),
        "a settled hold (kept as long as the hold) keeps no budget states"
    );
    assert_eq!(h.remaining(&tpm).await, 966);
    assert_eq!(h.settle("nope", 1).await, SettleOutcome::Unknown);
    h.check_keys().await;
}

async fn expired_hold_is_unknown(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    h.admit("h", 10, std::slice::from_ref(&tpm)).await;
    h.clock.advance(HOLD_TTL);
    assert_eq!(h.settle("h", 0).await, SettleOutcome::Unknown);
    assert_eq!(h.extend("h", 5).await, ExtendOutcome::Unknown);
    assert_eq!(h.renew("h").await, RenewOutcome::Unknown);
    let again = h.admit("h", 10, std::slice::from_ref(&tpm)).await;
    assert!(!again.replayed, "an expired id is a new reservation");
    assert_eq!(again.now_micros, NOON + HOLD_TTL);
    h.check_keys().await;
}

async fn impossible_requests(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    let rpm = h.rpm(tenant(), 1, 1);
    let i = impossible(h.reserve("a", 1001, std::slice::from_ref(&tpm)).await);
    assert_eq!(
        i,
        Impossibility {
            scope: tenant(),
            name: BudgetName::Tpm,
            capacity: 1000,
            requested: 1001
        }
    );
    h.admit("x", 1, std::slice::from_ref(&rpm)).await;
    // rpm refuses (retry later) but tpm never fits: impossible wins.
    let i = impossible(h.reserve("b", 1001, &[rpm.clone(), tpm.clone()]).await);
    assert_eq!(i.name, BudgetName::Tpm);
    let day = h.per_day(upstream("u"), 500);
    let i = impossible(h.reserve("c", 600, std::slice::from_ref(&day)).await);
    assert_eq!(
        (i.name, i.capacity, i.requested),
        (BudgetName::TokensPerDay, 500, 600)
    );
    assert_eq!(h.remaining(&tpm).await, 1000);
    assert_eq!(
        h.raw_get(&tpm.key).await,
        None,
        "an impossible request writes nothing"
    );
    assert_eq!(h.raw_get(&h.ks.hold("a")).await, None);
    assert_eq!(h.settle("a", 0).await, SettleOutcome::Unknown);
    h.check_keys().await;
}

async fn candidates_fall_back_in_order(h: H) {
    let common = [h.tpm(tenant(), 10_000, 10_000)];
    let up1 = vec![h.tpm(upstream("up1"), 1000, 1000)];
    let up2 = vec![h.tpm(upstream("up2"), 1000, 1000)];
    let cands = [up1.clone(), up2.clone()];
    let a = admitted(h.reserve_c("a", 800, &common, &cands).await);
    assert_eq!(a.candidate, 0);
    h.clock.advance(6 * SEC);
    let b = admitted(h.reserve_c("b", 800, &common, &cands).await);
    assert_eq!(b.candidate, 1, "up1 has 300, up2 admits");
    assert_eq!(b.budgets.len(), 2);
    assert_eq!(b.budgets[1].scope, upstream("up2"));
    assert_eq!(b.budgets[1].remaining, 200);
    // Both refuse: the shortest wait is reported (up1: 500 tokens = 30 s; up2: 600 = 36 s).
    let d = denied(h.reserve_c("c", 800, &common, &cands).await);
    assert_eq!(
        (d.scope.clone(), d.retry_after_micros),
        (upstream("up1"), 30 * SEC)
    );
    // Too big for up1 ever, fits up3.
    let up3 = vec![h.tpm(upstream("up3"), 5000, 5000)];
    let e = admitted(
        h.reserve_c("e", 1500, &common, &[up1.clone(), up3.clone()])
            .await,
    );
    assert_eq!(e.candidate, 1);
    let i = impossible(
        h.reserve_c("f", 1500, &common, &[up1.clone(), up2.clone()])
            .await,
    );
    assert_eq!(i.scope, upstream("up1"));
    // A denial beats an impossible candidate.
    let up4 = vec![h.tpm(upstream("up4"), 500, 500)];
    let d = denied(
        h.reserve_c("g", 900, &common, &[up4.clone(), up2.clone()])
            .await,
    );
    assert_eq!(
        (d.scope.clone(), d.retry_after_micros),
        (upstream("up2"), 42 * SEC)
    );
    // A common refusal is reported without trying candidates.
    let d = denied(h.reserve_c("h", 8000, &common, &cands).await);
    assert_eq!(d.scope, tenant());
    // No candidates: the common budgets alone decide.
    let n = admitted(h.reserve_c("n", 10, &common, &[]).await);
    assert_eq!((n.candidate, n.budgets.len()), (0, 1));
    // Settle refunds the chosen candidate only.
    h.settle("b", 0).await;
    assert_eq!(h.remaining(&up2[0]).await, 1000);
    h.check_keys().await;
}

/// All or nothing: when only the upstream refuses, no tenant budget, quota,
/// slot or hold is written (read back from Redis itself).
async fn upstream_refusal_leaves_tenant_budgets_untouched(h: H) {
    let model = Scope::TenantModel("acme".into(), "meta/llama-3".into());
    let key = Scope::Key("acme".into(), "batch".into());
    let common = vec![
        h.tpm(tenant(), 10_000, 10_000),
        h.rpm(tenant(), 100, 100),
        h.slots(tenant(), 5),
        h.per_day(tenant(), 100_000),
        h.tpm(model, 10_000, 10_000),
        h.rpm(key, 100, 100),
    ];
    let up = vec![
        h.tpm(upstream("azure/east"), 100, 100),
        h.slots(upstream("azure/east"), 9),
    ];
    h.admit("drain", 100, &[]).await;
    admitted(h.reserve_c("u", 100, &[], std::slice::from_ref(&up)).await);
    let d = denied(
        h.reserve_c("x", 50, &common, std::slice::from_ref(&up))
            .await,
    );
    assert_eq!(
        (d.scope.clone(), d.name),
        (upstream("azure/east"), BudgetName::Tpm)
    );
    let states = h.store.inspect(&common).await.expect("inspect");
    let remaining: Vec<i64> = states.iter().map(|s| s.remaining).collect();
    assert_eq!(remaining, vec![10_000, 100, 5, 100_000, 10_000, 100]);
    // The tenant layout reserves the tenant domain first and voids it when
    // the deployment domain refuses: its keys exist, every budget restored
    // (checked above); the rest of this check is of one domain's storage.
    if h.raw.is_some() && h.backend != Backend::ClusterTenant {
        for spec in &common {
            assert_eq!(h.raw_get(&spec.key).await, None, "{} was written", spec.key);
        }
        assert_eq!(h.raw_get(&h.ks.hold("x")).await, None);
        let keys = h.keys().await;
        assert_eq!(
            keys.len(),
            4,
            "only u's upstream keys and the holds: {keys:?}"
        );
    }
    h.check_keys().await;
}

async fn every_key_has_a_ttl_after_each_operation(h: H) {
    let common = vec![
        h.tpm(tenant(), 1000, 1000),
        h.rpm(tenant(), 60, 60),
        h.slots(tenant(), 3),
        h.per_day(tenant(), 100_000),
        h.per_month(tenant(), 1_000_000),
    ];
    let cand = vec![vec![
        h.tpm(upstream("u/1"), 1000, 1000),
        h.slots(upstream("u/1"), 2),
    ]];
    admitted(h.reserve_c("a", 200, &common, &cand).await);
    let n = h.check_keys().await;
    if h.backend == Backend::ClusterTenant {
        assert_eq!(n, 9, "7 budgets + a hold in each of the two domains");
    } else if h.raw.is_some() {
        assert_eq!(n, 8, "7 budgets + 1 hold");
    }
    h.clock.advance(SEC);
    h.extend("a", 100).await;
    h.check_keys().await;
    h.renew("a").await;
    h.check_keys().await;
    denied(h.reserve_c("b", 900, &common, &cand).await);
    h.check_keys().await;
    h.settle("a", 250).await;
    h.check_keys().await;
    h.settle("a", 250).await;
    h.check_keys().await;
    // Nothing lingers forever: the longest TTL is bounded by the hold's life
    // and the month window (+ margin), never unbounded.
    if let Some(raw) = &h.raw {
        for k in h.keys().await {
            let ttl: i64 = raw.query(redis::cmd("PTTL").arg(&k)).await;
            assert!(ttl <= 32 * 86_400_000, "{k}: TTL {ttl} ms");
        }
    }
}

async fn clock_going_backwards_is_harmless(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    h.admit("a", 600, std::slice::from_ref(&tpm)).await;
    h.clock.set(NOON - 30 * SEC);
    assert_eq!(h.remaining(&tpm).await, 400, "no refill, no panic");
    denied(h.reserve("b", 600, std::slice::from_ref(&tpm)).await);
    h.clock.set(NOON + 12 * SEC);
    h.admit("b", 600, std::slice::from_ref(&tpm)).await;
    h.check_keys().await;
}

/// Upstream budgets that count the output cap (refund_unused = false) keep
/// unused tokens, unless the upstream never accepted the work.
async fn upstream_failure_refunds_non_refundable_budgets(h: H) {
    let mut up = h.tpm(upstream("openai"), 1000, 1000);
    up.refund_unused = false;
    let t = h.tpm(tenant(), 1000, 1000);
    let common = [t.clone()];
    admitted(h.reserve_c("a", 400, &common, &[vec![up.clone()]]).await);
    h.settle("a", 100).await;
    assert_eq!((h.remaining(&t).await, h.remaining(&up).await), (900, 600));
    admitted(h.reserve_c("b", 400, &common, &[vec![up.clone()]]).await);
    let s = h
        .store
        .settle(
            "b",
            &Settlement {
                actual_tokens: 0,
                upstream_failed: true,
                actual: budgetgate::budget::Actual::Tokens,
            },
        )
        .await
        .expect("settle");
    assert!(matches!(s, SettleOutcome::Settled { refunded: 400, .. }));
    assert_eq!((h.remaining(&t).await, h.remaining(&up).await), (900, 600));
    h.check_keys().await;
}

/// A shadow budget is debited while it admits; once it would refuse, the
/// request is still admitted, the refusal reported, and nothing debited
/// from it; a replay reports the same would-deny.
async fn shadow_budgets_report_but_never_block(h: H) {
    let real = h.tpm(tenant(), 1000, 1000);
    let mut shadow = h.tpm(tenant(), 100, 100);
    shadow.key = h.ks.shadow_budget(&shadow.scope, shadow.name).into();
    shadow.shadow = true;
    let specs = vec![real.clone(), shadow.clone()];
    let a = h.admit("s1", 80, &specs).await;
    assert!(a.would_deny.is_empty());
    assert_eq!(
        h.remaining(&shadow).await,
        20,
        "an admitting shadow budget is debited"
    );
    let b = h.admit("s2", 80, &specs).await;
    assert_eq!(b.would_deny.len(), 1, "{b:?}");
    assert_eq!(b.would_deny[0].name, BudgetName::Tpm);
    assert_eq!(
        h.remaining(&shadow).await,
        20,
        "a refusing shadow budget is not debited"
    );
    assert_eq!(
        h.remaining(&real).await,
        840,
        "the real budget is enforced and debited"
    );
    let replay = admitted(h.reserve("s2", 80, &specs).await);
    assert!(replay.replayed);
    assert_eq!(replay.would_deny, b.would_deny);
    // Settling the request that skipped the shadow budget leaves it alone.
    h.settle("s2", 50).await;
    assert_eq!(h.remaining(&shadow).await, 20);
    assert_eq!(h.remaining(&real).await, 870);
}

/// Following a provider's view lowers a bucket and never raises it.
async fn lowering_follows_the_provider_and_never_raises(h: H) {
    let tpm = h.tpm(upstream("a"), 1000, 1000);
    assert_eq!(h.store.lower(&tpm, 300).await.unwrap(), 300);
    assert_eq!(h.remaining(&tpm).await, 300);
    assert_eq!(h.store.lower(&tpm, 800).await.unwrap(), 300, "never raised");
    h.clock.advance(6_000_000); // 100 tokens of refill at 1000/min
    assert_eq!(
        h.remaining(&tpm).await,
        400,
        "refill continues from the lowered level"
    );
}

/// A reload raising rpm 2 → 600 reaches a tenant that is being refused: the
/// refusal brings the bucket under the new rate, so the retry hint (100 ms
/// for one request at 600/min) is exactly what happens next. (The bucket
/// used to keep refilling at 2/min until some request was admitted: 30 s.)
async fn a_raised_limit_applies_to_a_refused_tenant_at_once(h: H) {
    let slow = h.rpm(tenant(), 2, 2);
    h.admit("a", 1, std::slice::from_ref(&slow)).await;
    h.admit("b", 1, std::slice::from_ref(&slow)).await;
    let d = denied(h.reserve("c", 1, std::slice::from_ref(&slow)).await);
    assert_eq!(d.retry_after_micros, 30 * SEC);
    let fast = h.rpm(tenant(), 600, 600);
    let d = denied(h.reserve("c", 1, std::slice::from_ref(&fast)).await);
    assert_eq!(d.retry_after_micros, 100_000, "one request at 600/min");
    h.clock.advance(99_999);
    let d = denied(h.reserve("c", 1, std::slice::from_ref(&fast)).await);
    assert_eq!(
        d.retry_after_micros, 1,
        "the hint is what the store does next"
    );
    h.clock.advance(1);
    h.admit("c", 1, std::slice::from_ref(&fast)).await;
    h.check_keys().await;
}

/// Fault guarded against: a 6,022-token overrun on tpm 1,000 keeps the tenant
/// out for the 6 minutes its debt takes to refill (it was enforced as 995
/// tokens, two minutes, while the debt metric said 5,995).
async fn an_overrun_is_enforced_in_full(h: H) {
    let tpm = h.tpm(tenant(), 1000, 1000);
    h.admit("a", 1000, std::slice::from_ref(&tpm)).await;
    let s = h.settle("a", 7022).await;
    assert!(
        matches!(s, SettleOutcome::Settled { debt: 6022, .. }),
        "{s:?}"
    );
    assert_eq!(h.remaining(&tpm).await, -6022);
    let d = denied(h.reserve("b", 1, std::slice::from_ref(&tpm)).await);
    // 6,023 tokens at 1,000/min: 361.38 s, in whole milliseconds.
    assert_eq!(d.retry_after_micros, 361_380_000);
    h.clock.advance(361_380_000 - 1);
    denied(h.reserve("b", 1, std::slice::from_ref(&tpm)).await);
    h.clock.advance(1);
    h.admit("b", 1, std::slice::from_ref(&tpm)).await;
    h.check_keys().await;
}

/// Every kind of budget a request touches: token bucket and quota, request
/// bucket and quota, slots.
fn all_kinds(h: &H) -> Vec<BudgetSpec> {
    let mut rpm = h.rpm(tenant(), 60, 60);
    rpm.refund_unused = false;
    vec![
        h.tpm(tenant(), 1000, 1000),
        rpm,
        h.per_day(tenant(), 5000),
        h.spec(
            tenant(),
            BudgetName::RequestsPerDay,
            BudgetKind::Quota {
                limit: 10,
                window: Window::Day,
            },
        ),
        h.slots(tenant(), 2),
    ]
}

async fn remaining_all(h: &H, specs: &[BudgetSpec]) -> Vec<i64> {
    h.store
        .inspect(specs)
        .await
        .expect("inspect")
        .iter()
        .map(|s| s.remaining)
        .collect()
}

/// A void that overtakes its reservation (the reply was
/// lost and compensated) leaves a void tombstone; the late reserve writes
/// nothing and answers `Voided`, never a replayed admission.
async fn void_before_reserve_leaves_every_budget_unchanged(h: H) {
    let specs = all_kinds(&h);
    let before = remaining_all(&h, &specs).await;
    if h.backend == Backend::ClusterTenant {
        // The tenant layout finds a reservation's domains by what this
        // store placed (a compensation always follows its reserve): a void
        // of an id it never placed lands in its own domain, where no
        // reservation of budgets goes, so the late reserve is admitted.
        let v = h.store.void("late", HOLD_TTL).await.expect("void");
        assert_eq!(v, SettleOutcome::Voided);
        h.admit("late", 100, &specs).await;
        // Placed, a void reaches the hold: the id then stays voided.
        let v = h.store.void("late", HOLD_TTL).await.expect("void");
        assert!(matches!(v, SettleOutcome::Settled { .. }), "{v:?}");
        assert_eq!(remaining_all(&h, &specs).await, before, "all given back");
        assert_eq!(h.reserve("late", 100, &specs).await, ReserveOutcome::Voided);
        h.check_keys().await;
        return;
    }
    let v = h.store.void("late", HOLD_TTL).await.expect("void");
    assert_eq!(v, SettleOutcome::Voided);
    assert_eq!(h.reserve("late", 100, &specs).await, ReserveOutcome::Voided);
    assert_eq!(remaining_all(&h, &specs).await, before, "nothing written");
    assert_eq!(h.settle("late", 100).await, SettleOutcome::AlreadySettled);
    let again = h.store.void("late", HOLD_TTL).await.expect("void");
    assert_eq!(again, SettleOutcome::AlreadySettled);
    assert_eq!(h.extend("late", 5).await, ExtendOutcome::AlreadySettled);
    h.check_keys().await;
    // The tombstone lives as long as the hold would have, then the id is free.
    h.clock.advance(HOLD_TTL);
    h.admit("late", 100, &specs).await;
}

/// Settle mode void refunds every token and request budget of the hold,
/// refundable or not (the rpm here is not), extensions included, and frees
/// its slot; a reserve of the id afterwards answers `Voided`.
async fn void_after_reserve_refunds_every_budget(h: H) {
    let specs = all_kinds(&h);
    let before = remaining_all(&h, &specs).await;
    h.admit("a", 100, &specs).await;
    assert!(matches!(
        h.extend("a", 50).await,
        ExtendOutcome::Extended { granted: 50, .. }
    ));
    assert_eq!(
        remaining_all(&h, &specs).await,
        vec![850, 59, 4850, 9, 1],
        "debited"
    );
    let v = h.store.void("a", HOLD_TTL).await.expect("void");
    assert_eq!(
        v,
        SettleOutcome::Settled {
            reserved: 150,
            refunded: 150,
            debt: 0,
            now_micros: NOON
        }
    );
    assert_eq!(remaining_all(&h, &specs).await, before, "all given back");
    assert_eq!(h.reserve("a", 100, &specs).await, ReserveOutcome::Voided);
    assert_eq!(h.settle("a", 10).await, SettleOutcome::AlreadySettled);
    h.check_keys().await;
}

/// Amounts per budget. A token bucket, an input-only
/// bucket, a quota in µ$ and a request bucket are each debited their own
/// cost at reserve, their own rate at extend and their own actual at settle.
async fn each_budget_is_charged_its_own_amount(h: H) {
    const BIG: u64 = 10_000_000_000_000;
    let tpm = h.tpm(tenant(), 1000, 1000);
    let input = h.tpm(upstream("in"), 1000, 1000);
    let usd = h.per_day(upstream("usd"), BIG);
    let rpm = h.rpm(tenant(), 60, 60);
    let specs = [tpm.clone(), input.clone(), usd.clone(), rpm.clone()];
    if h.backend == Backend::ClusterTenant {
        // Common budgets of a tenant and of deployments: the placement
        // rule never builds this; the tenant layout refuses it whole.
        let req = ReserveRequest {
            share: None,
            id: "a".into(),
            costs: budgetgate::budget::Costs::tokens(100),
            common: specs.to_vec(),
            candidates: vec![Vec::new()],
            slot_lease_micros: LEASE,
            hold_ttl_micros: HOLD_TTL,
            requester: Default::default(),
        };
        let e = h.store.reserve(&req).await;
        assert!(
            matches!(e, Err(budgetgate::budget::StoreError::Protocol(_))),
            "{e:?}"
        );
        assert_eq!(h.check_keys().await, 0, "nothing written");
        return;
    }
    let a = admitted(
        h.reserve_amounts("a", vec![vec![100, 60, 5_000_000, 1]], &specs, &[])
            .await,
    );
    assert!(!a.replayed);
    assert_eq!(
        remaining_all(&h, &specs).await,
        vec![900, 940, (BIG - 5_000_000) as i64, 59]
    );
    // 50 more output tokens: one per token on tpm, none on the input
    // bucket, $0.60 per million (ceil(50 × 0.6) = 30 µ$) on the quota.
    let step = budgetgate::budget::Step {
        tokens: 50,
        rates: vec![1_000_000, 0, 600_000, 0],
    };
    let e = h.store.extend("a", &step).await.expect("extend");
    assert!(
        matches!(e, ExtendOutcome::Extended { granted: 50, .. }),
        "{e:?}"
    );
    assert_eq!(
        remaining_all(&h, &specs).await,
        vec![850, 940, (BIG - 5_000_030) as i64, 59]
    );
    let s = h
        .store
        .settle(
            "a",
            &Settlement {
                actual_tokens: 120,
                upstream_failed: false,
                actual: budgetgate::budget::Actual::PerSpec(vec![120, 70, 4_000_000, 1]),
            },
        )
        .await
        .expect("settle");
    assert_eq!(
        s,
        SettleOutcome::Settled {
            reserved: 150,
            refunded: 30,
            debt: 0,
            now_micros: NOON
        }
    );
    // tpm: 150 held, 120 used → 30 back; input: 60 held, 70 used → 10 of
    // debt; µ$: 5,000,030 held, 4,000,000 used; rpm: a request stays spent.
    assert_eq!(
        remaining_all(&h, &specs).await,
        vec![880, 930, (BIG - 4_000_000) as i64, 59]
    );
    h.check_keys().await;
}

/// A partial grant at a price: with 123,457 µ$ left at $0.60 per million
/// tokens, an extension of 10^6 tokens grants floor(123,457 / 0.6) =
/// 205,761 tokens costing ceil(205,761 × 0.6) = 123,457 µ$; then nothing.
async fn a_priced_extension_grants_what_the_rest_can_buy(h: H) {
    const BIG: u64 = 10_000_000_000_000;
    let tpm = h.tpm(tenant(), 10_000_000_000, 10_000_000_000);
    let usd = h.per_month(tenant(), BIG);
    let specs = [tpm.clone(), usd.clone()];
    admitted(
        h.reserve_amounts("a", vec![vec![10, BIG - 123_457]], &specs, &[])
            .await,
    );
    let step = budgetgate::budget::Step {
        tokens: 1_000_000,
        rates: vec![1_000_000, 600_000],
    };
    let e = h.store.extend("a", &step).await.expect("extend");
    assert!(
        matches!(
            e,
            ExtendOutcome::Extended {
                granted: 205_761,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(remaining_all(&h, &specs).await, vec![9_999_794_229, 0]);
    match h.store.extend("a", &step).await.expect("extend") {
        ExtendOutcome::Exhausted(d) => {
            assert_eq!((d.name, d.available), (BudgetName::TokensPerMonth, 0));
        }
        other => panic!("{other:?}"),
    }
    // A price above a dollar per token: 1 µ$ left cannot buy one token.
    let usd2 = h.per_day(tenant(), 2_000_000);
    admitted(
        h.reserve_amounts("b", vec![vec![1_999_999]], std::slice::from_ref(&usd2), &[])
            .await,
    );
    let dear = budgetgate::budget::Step {
        tokens: 3,
        rates: vec![1_000_000_000],
    };
    assert!(matches!(
        h.store.extend("b", &dear).await.expect("extend"),
        ExtendOutcome::Exhausted(_)
    ));
    h.check_keys().await;
}

/// A common budget priced per deployment: the first candidate would cost
/// 1,200 of a common quota with 1,000 left, the second 800, so the second
/// is chosen and 800 debited.
async fn common_budgets_are_costed_per_candidate(h: H) {
    let usd = h.per_day(tenant(), 1000);
    let a_tpm = h.tpm(upstream("a"), 1000, 1000);
    let b_tpm = h.tpm(upstream("b"), 1000, 1000);
    let cands = [vec![a_tpm.clone()], vec![b_tpm.clone()]];
    let adm = admitted(
        h.reserve_amounts(
            "r",
            vec![vec![1200, 10], vec![800, 10]],
            std::slice::from_ref(&usd),
            &cands,
        )
        .await,
    );
    assert_eq!(adm.candidate, 1);
    assert_eq!(
        remaining_all(&h, &[usd.clone(), a_tpm.clone(), b_tpm.clone()]).await,
        vec![200, 1000, 990]
    );
    // Now neither fits: the refusal names the common budget.
    let d = denied(
        h.reserve_amounts(
            "s",
            vec![vec![1200, 10], vec![800, 10]],
            std::slice::from_ref(&usd),
            &cands,
        )
        .await,
    );
    assert_eq!((d.name, d.available), (BudgetName::TokensPerDay, 200));
    h.check_keys().await;
}
