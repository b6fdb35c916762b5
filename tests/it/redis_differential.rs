//! Differential property test: random sequences of reserve / extend / renew
//! / settle with random costs and clock steps, applied to the memory store
//! (the reference) and the Redis store on one shared [`ManualClock`], must
//! give identical outcomes and identical `inspect` values after every step.
//! Waves of reserves (and of settles) are issued concurrently, so the Redis
//! store sends them in batches (`budget::redis::batch`); the memory store applies them
//! one by one in the order they were issued, and every outcome must match.
//!
//! Quota leases join in: calls of lease lines on every budget
//! (`lease_differential`) and policy changes of single budgets (a reload:
//! both the leases and the reservations then carry the new policy), with
//! the replies and `leased_out` of every budget compared too.
//!
//! Share claims ride on most reservations: the share
//! states they make, the claims they defer and their expiry must agree
//! too (`outcomes seen` counts `Denied/held for share`).
//!
//! Runs in every `cargo test` (`PROPTEST_CASES=N` for more or fewer cases;
//! needs `redis-server`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::lease_differential::{self, LeaseOp, Leases};
use crate::support::redis_server;
use crate::support::NOON;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::quota_lease::LeaseStore;
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::share::{ClaimOrder, ShareClaim};
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveRequest, Scope, Settlement, Window,
};
use budgetgate::clock::{Clock, ManualClock};
use futures_util::future::join_all;
use proptest::prelude::*;

/// Lease of every reservation, µs (short, so random steps expire leases).
const LEASE: u64 = 5_000_000;
/// Hold lifetime, µs (short, so random steps expire holds).
const HOLD_TTL: u64 = 60_000_000;

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        id: u8,
        tokens: u64,
        common: u16,
        candidates: u8,
        /// 0: every spec costs the common token amount; else the seed of
        /// per-spec costs (common ones differing per candidate).
        shape: u8,
    },
    Extend {
        id: u8,
        tokens: u64,
        /// 0: the default rates; else the seed of a rate per spec.
        shape: u8,
    },
    Renew {
        id: u8,
    },
    /// Settle mode void (before or after the id's reserve).
    Void {
        id: u8,
    },
    Settle {
        id: u8,
        actual: u64,
        failed: bool,
        /// 0: `Actual::Tokens`; else the seed of an actual per spec.
        shape: u8,
    },
    Advance {
        micros: u64,
    },
    /// Reserves issued at once: `(id, tokens, common, candidates, shape)` each.
    ReserveWave(Vec<(u8, u64, u16, u8, u8)>),
    /// Settles issued at once: `(id, actual, failed)` each.
    SettleWave(Vec<(u8, u64, bool)>),
    /// One lease call (its lines), after the clock moved on by `micros`
    /// (steps within a lease's life: refill while units are out).
    Lease {
        micros: u64,
        ops: Vec<LeaseOp>,
    },
    /// The budget at this index (of every budget, tenant's first) flips
    /// to its other policy.
    Policy {
        spec: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, prop_oneof![0u64..50, 0u64..1600], any::<u16>(), 0u8..6, shape()).prop_map(
            |(id, tokens, common, candidates, shape)| Op::Reserve { id, tokens, common, candidates, shape }
        ),
        2 => (0u8..6, 0u64..700, shape()).prop_map(|(id, tokens, shape)| Op::Extend { id, tokens, shape }),
        1 => (0u8..6).prop_map(|id| Op::Renew { id }),
        1 => (0u8..6).prop_map(|id| Op::Void { id }),
        2 => (0u8..6, 0u64..2500, any::<bool>(), shape())
            .prop_map(|(id, actual, failed, shape)| Op::Settle { id, actual, failed, shape }),
        3 => prop_oneof![
            0u64..100_000,
            0u64..7_000_000,
            0u64..90_000_000,
            // Rolling windows' sub-buckets slide out (5 min to 1 h each).
            0u64..(6 * 3_600_000_000),
            0u64..(2 * 86_400_000_000),
        ]
        .prop_map(|micros| Op::Advance { micros }),
        2 => prop::collection::vec(
            (0u8..6, prop_oneof![0u64..50, 0u64..1600], any::<u16>(), 0u8..6, shape()),
            2..12
        )
        .prop_map(Op::ReserveWave),
        2 => prop::collection::vec((0u8..6, 0u64..2500, any::<bool>()), 2..8)
            .prop_map(Op::SettleWave),
        5 => (prop_oneof![Just(0u64), 0u64..10_000_000], lease_differential::lease_call())
            .prop_map(|(micros, ops)| Op::Lease { micros, ops }),
        1 => lease_differential::policy_change().prop_map(|spec| Op::Policy { spec }),
    ]
}

/// Reservations on the deployments alone (no common budget refuses
/// first), mostly with share claims, many ids, short clock steps: share
/// states form, hold claims back and expire.
fn share_op() -> impl Strategy<Value = Op> {
    let reserve = || {
        (
            0u8..200,
            prop_oneof![0u64..50, 0u64..700],
            Just(0u16),
            1u8..5,
            shape(),
        )
    };
    prop_oneof![
        5 => reserve().prop_map(|(id, tokens, common, candidates, shape)| Op::Reserve {
            id, tokens, common, candidates, shape
        }),
        3 => (0u64..400_000).prop_map(|micros| Op::Advance { micros }),
        1 => Just(Op::Advance { micros: 1_100_000 }),
        2 => prop::collection::vec(reserve(), 2..12).prop_map(Op::ReserveWave),
        1 => (0u8..200, 0u64..700, any::<bool>(), shape())
            .prop_map(|(id, actual, failed, shape)| Op::Settle { id, actual, failed, shape }),
    ]
}

/// Half the calls carry amounts per spec (specs with different
/// amounts), half the common token amount.
fn shape() -> impl Strategy<Value = u8> {
    prop_oneof![Just(0u8), 1u8..=255]
}

/// Per-spec amount of `tokens` at position `i` for candidate `c` under
/// `seed`: 0, half, all, or three halves of it, or (for a quota) a large
/// µ$-like multiple, so common budgets cost differently per candidate.
fn amount(seed: u8, i: usize, c: usize, tokens: u64, spec: &BudgetSpec) -> u64 {
    if spec.name.counts_requests() {
        return 1;
    }
    let k = (seed as usize + 3 * i + 5 * c) % 5;
    match (k, spec.kind) {
        (4, BudgetKind::Quota { .. }) => tokens * 150_001,
        (4, _) | (0, _) => 0,
        (k, _) => tokens * k as u64 / 2,
    }
}

/// Rates of an extension step per position under `seed`: none, one unit
/// per token, and prices (µ$ per million tokens) that make partial grants.
fn rates(seed: u8) -> Vec<u64> {
    const CHOICES: [u64; 7] = [0, 1_000_000, 500_000, 1_500_000, 150_000, 1, 999_999_999];
    (0..16)
        .map(|i| CHOICES[(seed as usize + 2 * i) % CHOICES.len()])
        .collect()
}

/// Actuals per position under `seed`, around `actual`.
fn actuals(seed: u8, actual: u64) -> Vec<u64> {
    (0..16)
        .map(|i| match (seed as usize + i) % 4 {
            0 => actual,
            1 => actual / 3,
            2 => actual * 2,
            _ => actual * 150_001,
        })
        .collect()
}

fn step_of(tokens: u64, shape: u8) -> budgetgate::budget::Step {
    match shape {
        0 => budgetgate::budget::Step::tokens(tokens),
        seed => budgetgate::budget::Step {
            tokens,
            rates: rates(seed),
        },
    }
}

fn settlement(actual: u64, failed: bool, shape: u8) -> Settlement {
    Settlement {
        actual_tokens: actual,
        upstream_failed: failed,
        actual: match shape {
            0 => budgetgate::budget::Actual::Tokens,
            seed => budgetgate::budget::Actual::PerSpec(actuals(seed, actual)),
        },
    }
}

/// The budgets one case plays with, under a per-case key prefix.
#[derive(Clone)]
struct Universe {
    tenant: Vec<BudgetSpec>,
    upstreams: Vec<Vec<BudgetSpec>>,
}

fn universe(ks: &KeySpace) -> Universe {
    let spec = |scope: Scope, name: BudgetName, kind: BudgetKind, refund_unused: bool| BudgetSpec {
        key: ks.budget(&scope, name).into(),
        scope,
        name,
        kind,
        refund_unused,
        shadow: false,
    };
    let t = || Scope::Tenant("acme".into());
    let m = || Scope::TenantModel("acme".into(), "gpt/4o".into());
    let a = || Scope::Upstream("a".into());
    let b = || Scope::Upstream("b".into());
    let bucket = |per_minute, burst| BudgetKind::Bucket { per_minute, burst };
    let day = |limit| BudgetKind::Quota {
        limit,
        window: Window::Day,
    };
    Universe {
        tenant: vec![
            spec(t(), BudgetName::Tpm, bucket(1000, 1200), true),
            spec(t(), BudgetName::Rpm, bucket(20, 5), true),
            spec(
                t(),
                BudgetName::MaxConcurrent,
                BudgetKind::Concurrency { max: 3 },
                true,
            ),
            spec(t(), BudgetName::TokensPerDay, day(2500), true),
            spec(
                t(),
                BudgetName::TokensPerMonth,
                BudgetKind::Quota {
                    limit: 7_000,
                    window: Window::Month,
                },
                true,
            ),
            spec(m(), BudgetName::Tpm, bucket(777, 900), true),
            spec(m(), BudgetName::RequestsPerDay, day(12), true),
            // A quota counting large amounts (as µ$ would).
            spec(m(), BudgetName::TokensPerDay, day(400_000_000), true),
            // Rolling windows (`budget::rolling`): tokens over 5 hours on
            // the tenant, large amounts over a week on the tenant×model.
            spec(
                t(),
                BudgetName::TokensPer5h,
                BudgetKind::Quota {
                    limit: 3_000,
                    window: Window::Hours5,
                },
                true,
            ),
            spec(
                m(),
                BudgetName::UsdPerWeek,
                BudgetKind::Quota {
                    limit: 500_000_000,
                    window: Window::Week,
                },
                true,
            ),
            // A window from first use (`window = "from_first_use"`).
            spec(
                m(),
                BudgetName::TokensPer5h,
                BudgetKind::Quota {
                    limit: 2_000,
                    window: Window::FirstUse5h,
                },
                true,
            ),
        ],
        upstreams: vec![
            vec![
                spec(a(), BudgetName::Tpm, bucket(600, 600), false),
                spec(
                    a(),
                    BudgetName::MaxConcurrent,
                    BudgetKind::Concurrency { max: 2 },
                    false,
                ),
                // Input and output limits apart, each with its
                // own amount under a per-spec shape.
                spec(a(), BudgetName::InputTpm, bucket(500, 700), false),
                spec(a(), BudgetName::OutputTpm, bucket(300, 300), false),
            ],
            vec![
                spec(b(), BudgetName::Tpm, bucket(3000, 2000), true),
                spec(b(), BudgetName::RequestsPerDay, day(8), true),
                spec(b(), BudgetName::OutputTpm, bucket(900, 1100), true),
                // A rolling window on a deployment that keeps unused output.
                spec(
                    b(),
                    BudgetName::TokensPer24h,
                    BudgetKind::Quota {
                        limit: 5_000,
                        window: Window::Hours24,
                    },
                    false,
                ),
            ],
        ],
    }
}

impl Universe {
    /// Every budget, tenant's first.
    fn all(&self) -> Vec<BudgetSpec> {
        self.tenant
            .iter()
            .chain(self.upstreams.iter().flatten())
            .cloned()
            .collect()
    }

    /// The universe with the budgets flagged in `flipped` (indexes into
    /// [`Self::all`]) under their other policy.
    fn with_policies(&self, flipped: &[bool]) -> Universe {
        let mut i = 0;
        let mut pick = |s: &BudgetSpec| {
            let flip = flipped.get(i).copied().unwrap_or(false);
            i += 1;
            if flip {
                lease_differential::other_policy(s)
            } else {
                s.clone()
            }
        };
        let tenant = self.tenant.iter().map(&mut pick).collect();
        let upstreams = self
            .upstreams
            .iter()
            .map(|c| c.iter().map(&mut pick).collect())
            .collect();
        Universe { tenant, upstreams }
    }
}

fn request(
    u: &Universe,
    case: u64,
    (id, tokens, common, cands, shape): (u8, u64, u16, u8, u8),
) -> ReserveRequest {
    let common: Vec<BudgetSpec> = u
        .tenant
        .iter()
        .enumerate()
        .filter(|(i, _)| common & (1 << i) != 0)
        .map(|(_, s)| s.clone())
        .collect();
    let (a, b) = (u.upstreams[0].clone(), u.upstreams[1].clone());
    let candidates = match cands {
        0 => vec![],
        1 => vec![a],
        2 => vec![b],
        3 => vec![a, b],
        4 => vec![b, a],
        _ => vec![vec![]],
    };
    let mut costs = budgetgate::budget::Costs::tokens(tokens);
    if shape != 0 {
        costs.per_candidate = (0..candidates.len().max(1))
            .map(|c| {
                let own = candidates.get(c).map_or(&[][..], Vec::as_slice);
                common
                    .iter()
                    .chain(own)
                    .enumerate()
                    .map(|(i, s)| amount(shape, i, c, tokens, s))
                    .collect()
            })
            .collect();
    }
    // A share claim on most reservations: three
    // tenants, every class, weights 1 to 4, so share states form, hold
    // claims back and expire as the clock moves; most with a place in
    // their tenant's order (five waiters met again and again, of every
    // age, some on their last attempt), so first waiters are recorded,
    // hold others back, are kept, replaced, given up and expire.
    let order = (id % 6 != 5).then(|| ClaimOrder {
        id: 1 + u64::from(id % 5),
        waited_micros: u64::from(shape) * 150_000 + u64::from(id % 3) * 40_000,
        left_micros: if id % 7 == 0 {
            0
        } else {
            100_000 + u64::from(id) * 10_000
        },
    });
    let share = (id % 4 != 3).then(|| ShareClaim {
        tenant: format!("t{}", id % 3).into(),
        rank: ((u16::from(id) / 2 + u16::from(shape)) % 3) as u8,
        weight: 1 + u64::from(shape % 4),
        order,
    });
    ReserveRequest {
        share,
        id: format!("c{case}-r{id}"),
        costs,
        common,
        candidates,
        slot_lease_micros: LEASE,
        hold_ttl_micros: HOLD_TTL,
        requester: Default::default(),
    }
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// How often each outcome occurred, printed at the end so a run shows it
/// reached the interesting states (denials, replays, partial extensions…).
static SEEN: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn seen(label: impl Into<String>) {
    let mut m = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    *m.entry(label.into()).or_default() += 1;
}

/// Outcome variant name with its budget, e.g. `Denied/TokensPerDay`.
fn label(debug: &str) -> String {
    let head: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    if debug.contains("held_for_share: true") {
        return format!("{head}/held for share");
    }
    let name = [
        "Tpm",
        "InputTpm",
        "OutputTpm",
        "Rpm",
        "MaxConcurrent",
        "TokensPerDay",
        "TokensPerMonth",
        "RequestsPerDay",
        "TokensPer5h",
        "TokensPer24h",
        "UsdPerWeek",
    ]
    .iter()
    .find(|n| debug.contains(&format!("name: {n}")));
    match name {
        Some(n) if head != "Admitted" => format!("{head}/{n}"),
        _ if debug.contains("replayed: true") => "Admitted/replayed".into(),
        _ if debug.contains("granted: 0") => "Extended/0".into(),
        _ => head,
    }
}

struct Fixture {
    rt: tokio::runtime::Runtime,
    clock: ManualClock,
    redis: Arc<RedisStore>,
    raw: redis::aio::MultiplexedConnection,
}

fn fixture() -> Fixture {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Near both a day and a month boundary, so big steps cross them.
    let clock = ManualClock::new(Window::Month.end(NOON) - 1_800_000_000);
    let server = redis_server::shared();
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let ks = KeySpace::new(&format!("bgdiff{}", std::process::id()), "d");
    let (redis, raw) = rt.block_on(async {
        let store = RedisStore::connect(&server.url(), Duration::from_secs(5), ks)
            .await
            .expect("connect")
            .with_test_clock(dyn_clock);
        let raw = redis::Client::open(server.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        (store, raw)
    });
    Fixture {
        rt,
        clock,
        redis: Arc::new(redis),
        raw,
    }
}

/// Fails unless every key of case `case` has a TTL (batches defer the
/// writes and the slot-set TTLs to their end: none may be lost).
async fn every_key_expires(f: &Fixture, case: u64) -> Result<(), TestCaseError> {
    let mut raw = f.raw.clone();
    let pattern = format!("bgdiff{}c{case}:*", std::process::id());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut raw)
        .await
        .expect("KEYS");
    for k in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut raw)
            .await
            .expect("PTTL");
        prop_assert!(ttl > 0, "{} has no TTL ({})", k, ttl);
    }
    Ok(())
}

fn run_case(f: &Fixture, ops: &[Op]) -> Result<(), TestCaseError> {
    let case = CASE.fetch_add(1, Ordering::SeqCst);
    f.clock.set(Window::Month.end(NOON) - 1_800_000_000);
    let memory = MemoryStore::new(Arc::new(f.clock.clone()));
    let ks = KeySpace::new(&format!("bgdiff{}c{case}", std::process::id()), "d");
    let base = universe(&ks);
    let mut flipped = vec![false; base.all().len()];
    let mut u = base.clone();
    let mut all = u.all();
    let mut leases = Leases::default();
    // Ids whose hold specs the Redis store surely has cached (admitted, not
    // replayed, not touched since): their settles are queued in the order
    // issued, with no read first, so a settle wave of them is in order.
    let mut cached: std::collections::BTreeSet<u8> = Default::default();
    f.rt.block_on(async {
        for (step, op) in ops.iter().enumerate() {
            let ctx = format!("step {step}: {op:?}");
            match op {
                Op::ReserveWave(wave) => {
                    let reqs: Vec<ReserveRequest> =
                        wave.iter().map(|&w| request(&u, case, w)).collect();
                    let before = f.redis.batch_counts();
                    let redis = join_all(reqs.iter().map(|r| f.redis.reserve(r))).await;
                    let after = f.redis.batch_counts();
                    // The first two go at once; the rest wait and go together.
                    prop_assert!(
                        after.batches - before.batches <= 3,
                        "{} reserves in {} batches",
                        reqs.len(),
                        after.batches - before.batches
                    );
                    for (j, (req, r)) in reqs.iter().zip(redis).enumerate() {
                        let id = wave[j].0;
                        let m = memory.reserve(req).await.expect("memory");
                        let r = r.expect("redis reserve");
                        seen(format!("wave {}", label(&format!("{m:?}"))));
                        let once = wave.iter().filter(|w| w.0 == id).count() == 1;
                        match &m {
                            budgetgate::budget::ReserveOutcome::Admitted(a)
                                if once && !a.replayed =>
                            {
                                cached.insert(id);
                            }
                            _ => {
                                cached.remove(&id);
                            }
                        }
                        prop_assert_eq!(m, r, "{} item {}", ctx, j);
                    }
                    every_key_expires(f, case).await?;
                }
                Op::SettleWave(wave) => {
                    let mut ids = Vec::new();
                    let mut items = Vec::new();
                    for &(id, actual, failed) in wave {
                        if cached.remove(&id) {
                            ids.push(format!("c{case}-r{id}"));
                            items.push(settlement(actual, failed, id % 2));
                        }
                    }
                    let redis =
                        join_all(ids.iter().zip(&items).map(|(id, s)| f.redis.settle(id, s))).await;
                    for (j, ((id, s), r)) in ids.iter().zip(&items).zip(redis).enumerate() {
                        let m = memory.settle(id, s).await.expect("memory");
                        seen(format!("wave {}", label(&format!("{m:?}"))));
                        prop_assert_eq!(m, r.expect("redis settle"), "{} item {}", ctx, j);
                    }
                    every_key_expires(f, case).await?;
                }
                Op::Reserve {
                    id,
                    tokens,
                    common,
                    candidates,
                    shape,
                } => {
                    let req = request(&u, case, (*id, *tokens, *common, *candidates, *shape));
                    let m = memory.reserve(&req).await.expect("memory");
                    let r = f.redis.reserve(&req).await.expect("redis reserve");
                    seen(label(&format!("{m:?}")));
                    match &m {
                        budgetgate::budget::ReserveOutcome::Admitted(a) if !a.replayed => {
                            cached.insert(*id);
                        }
                        _ => {
                            cached.remove(id);
                        }
                    }
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Extend { id, tokens, shape } => {
                    cached.remove(id);
                    let id = format!("c{case}-r{id}");
                    let step = step_of(*tokens, *shape);
                    let m = memory.extend(&id, &step).await.expect("memory");
                    let r = f.redis.extend(&id, &step).await.expect("redis extend");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Renew { id } => {
                    cached.remove(id);
                    let id = format!("c{case}-r{id}");
                    let m = memory.renew(&id).await.expect("memory");
                    let r = f.redis.renew(&id).await.expect("redis renew");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Void { id } => {
                    cached.remove(id);
                    let id = format!("c{case}-r{id}");
                    let m = memory.void(&id, HOLD_TTL).await.expect("memory");
                    let r = f.redis.void(&id, HOLD_TTL).await.expect("redis void");
                    seen(format!("Void/{}", label(&format!("{m:?}"))));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Settle {
                    id,
                    actual,
                    failed,
                    shape,
                } => {
                    cached.remove(id);
                    let id = format!("c{case}-r{id}");
                    let s = settlement(*actual, *failed, *shape);
                    let m = memory.settle(&id, &s).await.expect("memory");
                    let r = f.redis.settle(&id, &s).await.expect("redis settle");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Advance { micros } => f.clock.advance(*micros),
                Op::Lease { micros, ops } => {
                    f.clock.advance(*micros);
                    let lines = leases.lines(case, ops, &all);
                    let m = memory.lease(&lines).await.expect("memory lease");
                    let r = f.redis.lease(&lines).await.expect("redis lease");
                    for x in &m {
                        seen(lease_differential::label(x));
                    }
                    prop_assert_eq!(m, r, "{}", ctx);
                    every_key_expires(f, case).await?;
                }
                Op::Policy { spec } => {
                    let i = *spec as usize % flipped.len();
                    flipped[i] = !flipped[i];
                    u = base.with_policies(&flipped);
                    all = u.all();
                }
            }
            let m = memory.inspect(&all).await.expect("memory inspect");
            let r = f.redis.inspect(&all).await.expect("redis inspect");
            prop_assert_eq!(m, r, "inspect after {}", ctx);
            let m = memory.leased_out(&all).await.expect("memory leased out");
            let r = f.redis.leased_out(&all).await.expect("redis leased out");
            prop_assert_eq!(m, r, "leased out after {}", ctx);
        }
        Ok(())
    })
}

#[test]
fn redis_store_matches_the_memory_store() {
    let f = fixture();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..60), |ops| {
        run_case(&f, &ops)
    });
    eprintln!(
        "outcomes seen: {:?}",
        SEEN.lock().unwrap_or_else(|e| e.into_inner())
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    // The recall (a top-up granted short while another lease holds
    // units) must be among the states compared.
    let recalls = SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get("Lease/Live(recall)")
        .copied()
        .unwrap_or(0);
    assert!(
        cases < 64 || recalls > 0,
        "no lease line met a recall in {cases} cases"
    );
}

/// Share claims where they bite: the deployments'
/// budgets decide, the same claims made in the same order must be held
/// back, admitted and expire alike in both stores.
#[test]
fn share_claims_agree_between_the_stores() {
    let f = fixture();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&prop::collection::vec(share_op(), 1..80), |ops| {
        run_case(&f, &ops)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let held: u64 = SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(k, _)| k.contains("held for share"))
        .map(|(_, n)| n)
        .sum();
    eprintln!("claims deferred for share: {held}");
    assert!(
        held > 0,
        "no claim was deferred: the cases never reach a share state"
    );
}

/// The extremes of the exact range: `tpm = tpm_burst
/// = 10^10`, a single request of 10^10 tokens, debt down to the floor, a
/// bucket idle for a year, `tokens_per_month = 10^12` with debt, and a
/// bucket touched every 200 µs for one second of store time. Both stores
/// run the same calls; every outcome and budget state must be equal, and
/// equal to the figures the arithmetic gives.
#[test]
fn both_stores_agree_exactly_at_the_extremes_of_the_range() {
    use budgetgate::budget::{ReserveOutcome, SettleOutcome};
    const MAX: u64 = 10_000_000_000;
    const QUOTA: u64 = 1_000_000_000_000;
    const YEAR: u64 = 365 * 86_400_000_000;
    let f = fixture();
    let start = Window::Month.end(NOON) - 20 * 86_400_000_000;
    f.clock.set(start);
    let memory = MemoryStore::new(Arc::new(f.clock.clone()));
    let ks = KeySpace::new(&format!("bgdiffx{}", std::process::id()), "d");
    let spec = |name: BudgetName, kind: BudgetKind| BudgetSpec {
        key: ks.budget(&Scope::Tenant("big".into()), name).into(),
        scope: Scope::Tenant("big".into()),
        name,
        kind,
        refund_unused: true,
        shadow: false,
    };
    let tpm = spec(
        BudgetName::Tpm,
        BudgetKind::Bucket {
            per_minute: MAX,
            burst: MAX,
        },
    );
    let month = spec(
        BudgetName::TokensPerMonth,
        BudgetKind::Quota {
            limit: QUOTA,
            window: Window::Month,
        },
    );
    let both = vec![tpm.clone(), month.clone()];
    let req = |id: &str, tokens: u64, specs: &[BudgetSpec]| ReserveRequest {
        share: None,
        id: id.into(),
        costs: budgetgate::budget::Costs::tokens(tokens),
        common: specs.to_vec(),
        candidates: vec![vec![]],
        slot_lease_micros: LEASE,
        hold_ttl_micros: HOLD_TTL,
        requester: Default::default(),
    };
    let used = |actual_tokens| budgetgate::budget::Settlement {
        actual_tokens,
        upstream_failed: false,
        actual: Default::default(),
    };
    f.rt.block_on(async {
        macro_rules! same {
            ($call:ident($($arg:expr),*)) => {{
                let m = memory.$call($($arg),*).await.expect("memory");
                let r = f.redis.$call($($arg),*).await.expect("redis");
                assert_eq!(m, r, "{}", stringify!($call($($arg),*)));
                m
            }};
        }
        let states = |specs: &[BudgetSpec]| {
            let specs = specs.to_vec();
            let redis = f.redis.clone();
            let memory = &memory;
            async move {
                let m = memory.inspect(&specs).await.expect("memory");
                let r = redis.inspect(&specs).await.expect("redis");
                assert_eq!(m, r, "inspect");
                m.iter()
                    .map(|s| (s.remaining, s.reset_micros))
                    .collect::<Vec<_>>()
            }
        };
        let window_left = Window::Month.end(start) - start;

        // A single request of 10^10 tokens fits a full 10^10 bucket exactly.
        let a = same!(reserve(&req("x1", MAX, &both)));
        assert!(matches!(a, ReserveOutcome::Admitted(_)), "{a:?}");
        assert_eq!(
            states(&both).await,
            vec![(0, 60_000_000), ((QUOTA - MAX) as i64, window_left)]
        );
        // Usage beyond any single cost counts as that bound: no debt here.
        let s = same!(settle("x1", &used(u64::MAX)));
        assert!(matches!(s, SettleOutcome::Settled { debt: 0, .. }), "{s:?}");

        // Nine holds of 0 tokens, each settled at 10^10: 9·10^10 tokens of
        // debt, past the bucket's floor (−2^52 units ≈ −7.5·10^10 tokens);
        // the month quota keeps all of it.
        for i in 0..9 {
            let a = same!(reserve(&req(&format!("d{i}"), 0, &both)));
            assert!(matches!(a, ReserveOutcome::Admitted(_)), "{a:?}");
        }
        for i in 0..9 {
            let s = same!(settle(&format!("d{i}"), &used(MAX)));
            assert!(
                matches!(s, SettleOutcome::Settled { debt, .. } if debt == MAX),
                "{s:?}"
            );
        }
        let floor = (-(1i64 << 52)).div_euclid(60_000);
        let got = states(&both).await;
        assert_eq!(got[0].0, floor, "debt kept down to the floor");
        assert_eq!(
            got[1].0,
            (QUOTA - 10 * MAX) as i64,
            "the quota keeps all of it"
        );
        // The wait from the floor is exact and in range: (2^52 + 60,000)
        // units at 10^10 units/ms = 450,360 ms.
        let d = same!(reserve(&req("after", 1, &both)));
        match d {
            ReserveOutcome::Denied(d) => assert_eq!(d.retry_after_micros, 450_360_000),
            other => panic!("{other:?}"),
        }

        // Idle for a year: full again, exactly at capacity.
        f.clock.advance(YEAR);
        assert_eq!(states(std::slice::from_ref(&tpm)).await[0], (MAX as i64, 0));

        // Drained, then touched every 200 µs for 1 s of store time: refill
        // carries the sub-millisecond rests, gaining exactly L/60 tokens.
        let l = 60_000;
        let small = spec(
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: l,
                burst: l,
            },
        );
        let small = BudgetSpec {
            key: format!("{}:small", small.key).into(),
            ..small
        };
        let a = same!(reserve(&req("drain", l, std::slice::from_ref(&small))));
        assert!(matches!(a, ReserveOutcome::Admitted(_)), "{a:?}");
        for i in 0..5000 {
            f.clock.advance(200);
            same!(reserve(&req(
                &format!("z{i}"),
                0,
                std::slice::from_ref(&small)
            )));
        }
        assert_eq!(
            states(std::slice::from_ref(&small)).await[0].0,
            (l / 60) as i64
        );
    });
}
