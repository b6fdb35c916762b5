//! Differential property test: random sequences of reserve / extend / renew
//! / settle with random costs and clock steps, applied to the memory store
//! (the reference) and the Redis store on one shared [`ManualClock`], must
//! give identical outcomes and identical `inspect` values after every step.
//!
//! Run: `cargo test --features test-clock --test redis_differential`
//! (`PROPTEST_CASES=N` for more or fewer cases; needs `redis-server`).
#![cfg(feature = "test-clock")]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use budgetgate::clock::{Clock, ManualClock};
use budgetgate::reserve::keys::KeySpace;
use budgetgate::reserve::memory::MemoryStore;
use budgetgate::reserve::redis::RedisStore;
use budgetgate::reserve::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveRequest, Scope, Settlement, Window,
};
use common::redis_server;
use common::NOON;
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
        common: u8,
        candidates: u8,
    },
    Extend {
        id: u8,
        tokens: u64,
    },
    Renew {
        id: u8,
    },
    Settle {
        id: u8,
        actual: u64,
        failed: bool,
    },
    Advance {
        micros: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, prop_oneof![0u64..50, 0u64..1600], any::<u8>(), 0u8..6).prop_map(
            |(id, tokens, common, candidates)| Op::Reserve { id, tokens, common, candidates }
        ),
        2 => (0u8..6, 0u64..700).prop_map(|(id, tokens)| Op::Extend { id, tokens }),
        1 => (0u8..6).prop_map(|id| Op::Renew { id }),
        2 => (0u8..6, 0u64..2500, any::<bool>())
            .prop_map(|(id, actual, failed)| Op::Settle { id, actual, failed }),
        3 => prop_oneof![
            0u64..100_000,
            0u64..7_000_000,
            0u64..90_000_000,
            0u64..(2 * 86_400_000_000),
        ]
        .prop_map(|micros| Op::Advance { micros }),
    ]
}

/// The budgets one case plays with, under a per-case key prefix.
struct Universe {
    tenant: Vec<BudgetSpec>,
    upstreams: Vec<Vec<BudgetSpec>>,
}

fn universe(ks: &KeySpace) -> Universe {
    let spec = |scope: Scope, name: BudgetName, kind: BudgetKind, refund_unused: bool| BudgetSpec {
        key: ks.budget(&scope, name),
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
            ],
            vec![
                spec(b(), BudgetName::Tpm, bucket(3000, 2000), true),
                spec(b(), BudgetName::RequestsPerDay, day(8), true),
            ],
        ],
    }
}

fn request(u: &Universe, case: u64, id: u8, tokens: u64, common: u8, cands: u8) -> ReserveRequest {
    let common = u
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
    ReserveRequest {
        id: format!("c{case}-r{id}"),
        tokens,
        common,
        candidates,
        lease_micros: LEASE,
        hold_ttl_micros: HOLD_TTL,
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
    let name = [
        "Tpm",
        "Rpm",
        "MaxConcurrent",
        "TokensPerDay",
        "TokensPerMonth",
        "RequestsPerDay",
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
    let redis = rt.block_on(async {
        RedisStore::connect(&server.url(), Duration::from_secs(5), ks)
            .await
            .expect("connect")
            .with_test_clock(dyn_clock)
    });
    Fixture {
        rt,
        clock,
        redis: Arc::new(redis),
    }
}

fn run_case(f: &Fixture, ops: &[Op]) -> Result<(), TestCaseError> {
    let case = CASE.fetch_add(1, Ordering::SeqCst);
    f.clock.set(Window::Month.end(NOON) - 1_800_000_000);
    let memory = MemoryStore::new(Arc::new(f.clock.clone()));
    let ks = KeySpace::new(&format!("bgdiff{}c{case}", std::process::id()), "d");
    let u = universe(&ks);
    let all: Vec<BudgetSpec> = u
        .tenant
        .iter()
        .chain(u.upstreams.iter().flatten())
        .cloned()
        .collect();
    f.rt.block_on(async {
        for (step, op) in ops.iter().enumerate() {
            let ctx = format!("step {step}: {op:?}");
            match op {
                Op::Reserve {
                    id,
                    tokens,
                    common,
                    candidates,
                } => {
                    let req = request(&u, case, *id, *tokens, *common, *candidates);
                    let m = memory.reserve(&req).await.expect("memory");
                    let r = f.redis.reserve(&req).await.expect("redis reserve");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Extend { id, tokens } => {
                    let id = format!("c{case}-r{id}");
                    let m = memory.extend(&id, *tokens).await.expect("memory");
                    let r = f.redis.extend(&id, *tokens).await.expect("redis extend");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Renew { id } => {
                    let id = format!("c{case}-r{id}");
                    let m = memory.renew(&id).await.expect("memory");
                    let r = f.redis.renew(&id).await.expect("redis renew");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Settle { id, actual, failed } => {
                    let id = format!("c{case}-r{id}");
                    let s = Settlement {
                        actual_tokens: *actual,
                        upstream_failed: *failed,
                    };
                    let m = memory.settle(&id, s).await.expect("memory");
                    let r = f.redis.settle(&id, s).await.expect("redis settle");
                    seen(label(&format!("{m:?}")));
                    prop_assert_eq!(m, r, "{}", ctx);
                }
                Op::Advance { micros } => f.clock.advance(*micros),
            }
            let m = memory.inspect(&all).await.expect("memory inspect");
            let r = f.redis.inspect(&all).await.expect("redis inspect");
            prop_assert_eq!(m, r, "inspect after {}", ctx);
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
}
