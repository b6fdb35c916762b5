//! Figures, not assertions: reserve+settle pairs per second through
//! [`RedisStore`] at 1, 16 and 64 concurrent callers, beside
//! `redis-benchmark`'s EVALSHA rate for a trivial script at the same
//! concurrency on the same server, and Redis memory per idle tenant.
//!
//! Run: `cargo test --release --test it redis_bench:: -- --ignored --nocapture`
//! (needs `redis-server` and `redis-benchmark`). The cost of depth:
//! `redis_bench::cost_of_depth` compares that request with one of a
//! tenant four levels deep with an end user (40 budgets).
//! `redis_bench::lease_call_cost` prints the Redis time of a quota-lease
//! call carrying one line per budget of that request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::redis_server::RedisServer;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::quota_lease::{LeaseLine, LeaseReply, LeaseStore};
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveOutcome, ReserveRequest, Scope,
    Settlement, Window,
};

/// Common and candidate budgets of one request of `tenant`.
type Shape = fn(&KeySpace, &str) -> (Vec<BudgetSpec>, Vec<BudgetSpec>);

/// The budgets of a typical request: tenant rpm/tpm/slots/day quota,
/// tenant×model tpm, upstream rpm/tpm/slots. Limits high enough never to refuse.
fn budgets(ks: &KeySpace, tenant: &str) -> (Vec<BudgetSpec>, Vec<BudgetSpec>) {
    let spec = |scope: Scope, name: BudgetName, kind: BudgetKind| BudgetSpec {
        key: ks.budget(&scope, name).into(),
        scope,
        name,
        kind,
        refund_unused: true,
        shadow: false,
    };
    let t = || Scope::Tenant(tenant.into());
    let big = BudgetKind::Bucket {
        per_minute: 50_000_000,
        burst: 50_000_000,
    };
    let common = vec![
        spec(t(), BudgetName::Rpm, big),
        spec(t(), BudgetName::Tpm, big),
        spec(
            t(),
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max: 1_000_000 },
        ),
        spec(
            t(),
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit: 50_000_000,
                window: Window::Day,
            },
        ),
        spec(
            Scope::TenantModel(tenant.into(), "gpt-4o-mini".into()),
            BudgetName::Tpm,
            big,
        ),
    ];
    let up = || Scope::Upstream("openai-east".into());
    let upstream = vec![
        spec(up(), BudgetName::Rpm, big),
        spec(up(), BudgetName::Tpm, big),
        spec(
            up(),
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max: 1_000_000 },
        ),
    ];
    (common, upstream)
}

/// The budgets of a request four tenants deep with an end user (40):
/// six on each level of `org` > `dept` > `team` > `tenant` (rpm, tpm,
/// slots, day and month token quotas, day request quota), three on the
/// key, rpm and tpm of the model on two levels, six on the end user, and
/// the deployment's three.
fn deep_budgets(ks: &KeySpace, tenant: &str) -> (Vec<BudgetSpec>, Vec<BudgetSpec>) {
    let spec = |scope: Scope, name: BudgetName| {
        let kind = match name {
            BudgetName::MaxConcurrent => BudgetKind::Concurrency { max: 1_000_000 },
            BudgetName::TokensPerDay | BudgetName::RequestsPerDay => BudgetKind::Quota {
                limit: 50_000_000_000,
                window: Window::Day,
            },
            BudgetName::TokensPerMonth => BudgetKind::Quota {
                limit: 500_000_000_000,
                window: Window::Month,
            },
            _ => BudgetKind::Bucket {
                per_minute: 50_000_000,
                burst: 50_000_000,
            },
        };
        BudgetSpec {
            key: ks.budget(&scope, name).into(),
            scope,
            name,
            kind,
            refund_unused: true,
            shadow: false,
        }
    };
    use BudgetName::*;
    let six = [
        Rpm,
        Tpm,
        MaxConcurrent,
        TokensPerDay,
        TokensPerMonth,
        RequestsPerDay,
    ];
    let mut common = Vec::new();
    let levels = [
        tenant.to_string(),
        format!("{tenant}-team"),
        format!("{tenant}-dept"),
        format!("{tenant}-org"),
    ];
    for (i, level) in levels.iter().enumerate() {
        let t = || Scope::Tenant(level.as_str().into());
        common.extend(six.iter().map(|&n| spec(t(), n)));
        if i == 0 {
            let key = || Scope::Key(level.as_str().into(), "k".into());
            common.extend([Rpm, Tpm, TokensPerDay].map(|n| spec(key(), n)));
        }
        if i == 0 || i == 3 {
            let m = || Scope::TenantModel(level.as_str().into(), "gpt-4o-mini".into());
            common.extend([Rpm, Tpm].map(|n| spec(m(), n)));
        }
    }
    let user = || Scope::EndUser(tenant.into(), "5f0c7a3e9b2d4c1a8e6f0b3d2c1a9e8f".into());
    common.extend(six.iter().map(|&n| spec(user(), n)));
    let up = || Scope::Upstream("openai-east".into());
    let upstream = [Rpm, Tpm, MaxConcurrent].map(|n| spec(up(), n)).to_vec();
    assert_eq!(common.len() + upstream.len(), 40);
    (common, upstream)
}

/// A 1,000-token reservation `id` on the tenant's and one upstream's budgets.
fn bench_request(id: String, common: &[BudgetSpec], upstream: &[BudgetSpec]) -> ReserveRequest {
    ReserveRequest {
        share: None,
        id,
        costs: budgetgate::budget::Costs::tokens(1000),
        common: common.to_vec(),
        candidates: vec![upstream.to_vec()],
        slot_lease_micros: 30_000_000,
        hold_ttl_micros: 60_000_000,
        requester: Default::default(),
    }
}

async fn pairs_per_second(
    store: Arc<RedisStore>,
    ks: &KeySpace,
    shape: Shape,
    callers: usize,
    total: usize,
) -> f64 {
    let per = total / callers;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let store = store.clone();
        let (common, upstream) = shape(ks, &format!("tenant{}", c % 8));
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                let req = bench_request(format!("b{callers}-{c}-{i}"), &common, &upstream);
                match store.reserve(&req).await {
                    Ok(ReserveOutcome::Admitted(_)) => {}
                    other => panic!("benchmark reservation refused: {other:?}"),
                }
                let s = Settlement {
                    actual_tokens: 700,
                    upstream_failed: false,
                    actual: budgetgate::budget::Actual::Tokens,
                };
                store.settle(&req.id, &s).await.expect("settle");
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    (per * callers) as f64 / start.elapsed().as_secs_f64()
}

/// Microseconds of Redis time per reservation and per settlement (`INFO
/// commandstats` `usec` of EVALSHA over the calls made, each phase measured
/// alone from `COST_CALLERS` callers, 16 by default; the store sends them
/// in batches), the Redis
/// commands one reserve+settle pair runs (the `calls` of every `INFO
/// commandstats` line, which counts commands run by scripts too), and the
/// mean number of calls per batch.
async fn script_cost(
    store: &Arc<RedisStore>,
    server: &RedisServer,
    ks: &KeySpace,
    shape: Shape,
) -> (usize, f64, f64, f64, f64) {
    let callers: usize = std::env::var("COST_CALLERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    const PER: usize = 250;
    let field = |info: &str, prefix: &str, name: &str| -> f64 {
        info.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split([',', ':']).find_map(|kv| kv.strip_prefix(name)))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    let reqs: Vec<Vec<ReserveRequest>> = (0..callers)
        .map(|c| {
            let (common, upstream) = shape(ks, &format!("tenant{}", c % 8));
            (0..PER)
                .map(|i| bench_request(format!("cost-{c}-{i}"), &common, &upstream))
                .collect()
        })
        .collect();
    let ids: Vec<Vec<String>> = reqs
        .iter()
        .map(|r| r.iter().map(|r| r.id.clone()).collect())
        .collect();
    let n = (callers * PER) as f64;
    let before = store.batch_counts();
    server.cli(&["config", "resetstat"]);
    in_parallel(store, reqs, |store, req| async move {
        assert!(matches!(
            store.reserve(&req).await,
            Ok(ReserveOutcome::Admitted(_))
        ));
    })
    .await;
    let stats = server.cli(&["info", "commandstats"]);
    let reserve = field(&stats, "cmdstat_evalsha", "usec=") / n;
    let mut commands = all_calls(&stats);
    server.cli(&["config", "resetstat"]);
    in_parallel(store, ids, |store, id| async move {
        let s = Settlement {
            actual_tokens: 700,
            upstream_failed: false,
            actual: budgetgate::budget::Actual::Tokens,
        };
        store.settle(&id, &s).await.expect("settle");
    })
    .await;
    let stats = server.cli(&["info", "commandstats"]);
    let settle = field(&stats, "cmdstat_evalsha", "usec=") / n;
    commands += all_calls(&stats);
    let after = store.batch_counts();
    let per_batch = (after.items - before.items) as f64 / (after.batches - before.batches) as f64;
    (callers, reserve, settle, commands / n, per_batch)
}

/// One task per batch, each running `op` on its items in order; returns
/// when every task is done.
async fn in_parallel<T, F, Fut>(store: &Arc<RedisStore>, batches: Vec<Vec<T>>, op: F)
where
    T: Send + 'static,
    F: Fn(Arc<RedisStore>, T) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let tasks: Vec<_> = batches
        .into_iter()
        .map(|batch| {
            let store = store.clone();
            tokio::spawn(async move {
                for item in batch {
                    op(store.clone(), item).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("caller");
    }
}

/// Sum of `calls=` over the `cmdstat_*` lines of `INFO commandstats`.
fn all_calls(stats: &str) -> f64 {
    stats
        .lines()
        .filter(|l| {
            l.starts_with("cmdstat_")
                && !l.starts_with("cmdstat_info")
                && !l.starts_with("cmdstat_config")
        })
        .filter_map(|l| l.split([',', ':']).find_map(|kv| kv.strip_prefix("calls=")))
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// `redis-benchmark -c callers EVALSHA <sha of "return 1"> 0`, requests/s.
fn redis_benchmark_evalsha(server: &RedisServer, callers: usize) -> Option<f64> {
    let sha = server
        .cli(&["script", "load", "return 1"])
        .trim()
        .to_string();
    let out = std::process::Command::new("redis-benchmark")
        .args(["-p", &server.port().to_string(), "-n", "100000", "-c"])
        .arg(callers.to_string())
        .args(["-q", "evalsha", &sha, "0"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "evalsha …: 71428.57 requests per second, p50=…" (after \r progress lines)
    let line = text
        .rsplit('\r')
        .next()?
        .lines()
        .find(|l| l.contains("requests per second"))?;
    let before = line.split(" requests per second").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures; run with --ignored --nocapture, preferably --release"]
async fn redis_store_throughput_and_memory() {
    let server = RedisServer::start();
    let ks = KeySpace::new("bgbench", "default");
    let store = Arc::new(
        RedisStore::connect(&server.url(), Duration::from_secs(5), ks.clone())
            .await
            .expect("connect"),
    );
    // Warm up: load scripts, create keys.
    pairs_per_second(store.clone(), &ks, budgets, 1, 200).await;
    println!(
        "reserve+settle pairs/s (8 budgets per request) vs redis-benchmark EVALSHA \"return 1\":"
    );
    for callers in [1usize, 16, 64] {
        let before = store.batch_counts();
        let pairs = pairs_per_second(
            store.clone(),
            &ks,
            budgets,
            callers,
            4_000.max(callers * 100),
        )
        .await;
        let after = store.batch_counts();
        let trivial = redis_benchmark_evalsha(&server, callers);
        println!(
            "  {callers:>2} callers: {pairs:>8.0} pairs/s ({:>8.0} calls/s, {:.1} calls per batch) | redis-benchmark EVALSHA: {}",
            pairs * 2.0,
            (after.items - before.items) as f64 / (after.batches - before.batches) as f64,
            trivial.map_or("n/a".into(), |r| format!("{r:.0} calls/s"))
        );
    }

    let (callers, reserve_us, settle_us, calls_per_pair, per_batch) =
        script_cost(&store, &server, &ks, budgets).await;
    println!(
        "Redis time (INFO commandstats, {callers} callers, {per_batch:.1} calls per batch): \
         {reserve_us:.1} µs per reservation, {settle_us:.1} µs per settlement; \
         {calls_per_pair:.1} commands per reserve+settle pair \
         (redis.call inside the scripts, EVALSHA included)"
    );

    // Memory of one idle tenant: its budget keys after one reservation settled.
    let mut conn = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let (common, upstream) = budgets(&ks, "idle");
    let req = ReserveRequest {
        share: None,
        id: "idle-1".into(),
        costs: budgetgate::budget::Costs::tokens(1000),
        common: common.clone(),
        candidates: vec![upstream],
        slot_lease_micros: 30_000_000,
        hold_ttl_micros: 60_000_000,
        requester: Default::default(),
    };
    store.reserve(&req).await.expect("reserve");
    store
        .settle(
            "idle-1",
            &Settlement {
                actual_tokens: 700,
                upstream_failed: false,
                actual: budgetgate::budget::Actual::Tokens,
            },
        )
        .await
        .expect("settle");
    let mut tenant_bytes = 0i64;
    let mut tenant_keys = 0;
    for spec in &common {
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&*spec.key)
            .query_async(&mut conn)
            .await
            .expect("MEMORY USAGE");
        if let Some(b) = bytes {
            tenant_bytes += b;
            tenant_keys += 1;
        }
    }
    let hold: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(ks.hold("idle-1"))
        .query_async(&mut conn)
        .await
        .expect("MEMORY USAGE");
    println!(
        "memory per idle tenant: {tenant_bytes} bytes in {tenant_keys} keys \
         (rpm, tpm, day quota, tenant×model tpm; an empty slot set is deleted); \
         a settled hold: {} bytes until its TTL",
        hold.unwrap_or(0)
    );
}

/// The cost of depth: the typical request above (8 budgets)
/// against one four tenants deep with an end user (40), on one server:
/// pairs per second at 1 and 16 callers, Redis time per reservation and
/// per settlement, commands per pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures; run with --ignored --nocapture, preferably --release"]
async fn cost_of_depth() {
    let server = RedisServer::start();
    let shapes: [(&str, Shape, usize); 2] = [
        ("8 budgets", budgets, 8),
        ("40 budgets (depth 4 + end user)", deep_budgets, 40),
    ];
    for (name, shape, n) in shapes {
        // A key space per shape: the same reservation ids would replay.
        let ks = KeySpace::new(&format!("bgdepth{n}"), "default");
        let store = Arc::new(
            RedisStore::connect(&server.url(), Duration::from_secs(5), ks.clone())
                .await
                .expect("connect"),
        );
        pairs_per_second(store.clone(), &ks, shape, 1, 200).await;
        let one = pairs_per_second(store.clone(), &ks, shape, 1, 2_000).await;
        let sixteen = pairs_per_second(store.clone(), &ks, shape, 16, 4_000).await;
        let (callers, reserve_us, settle_us, commands, per_batch) =
            script_cost(&store, &server, &ks, shape).await;
        println!(
            "{name}: {one:.0} pairs/s at 1 caller, {sixteen:.0} at 16; Redis time ({callers} callers, \
             {per_batch:.1} calls per batch): {reserve_us:.1} µs per reservation \
             ({:.2} µs per budget), {settle_us:.1} µs per settlement; {commands:.1} commands per pair",
            reserve_us / n as f64
        );
    }
}

/// Redis time of quota-lease calls: one call with a line per
/// budget of the typical request (8 budgets, one budget domain), as a
/// gateway's background top-up sends it; the steady state is reports
/// with small top-ups (slots: reports only). Prints µs of Redis time per
/// call and per line, and calls per second from one caller, for a
/// concurrency lease of 16 slots and of 1,000 (every line re-scores each
/// slot's member with the new expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures; run with --ignored --nocapture, preferably --release"]
async fn lease_call_cost() {
    let server = RedisServer::start();
    let ks = KeySpace::new("bglease", "default");
    let store = RedisStore::connect(&server.url(), Duration::from_secs(5), ks.clone())
        .await
        .expect("connect");
    for slots_held in [16, 1000] {
        lease_calls(&server, &store, &ks, slots_held).await;
    }
}

async fn lease_calls(server: &RedisServer, store: &RedisStore, ks: &KeySpace, slots_held: u64) {
    let (common, upstream) = budgets(ks, &format!("hot{slots_held}"));
    let specs: Vec<BudgetSpec> = common.into_iter().chain(upstream).collect();
    let line = |spec: &BudgetSpec, seq: u64| {
        let slots = matches!(spec.kind, BudgetKind::Concurrency { .. });
        let want = match (seq, slots) {
            (1, true) => 2 * slots_held,
            (1, false) => 1000,
            (_, true) => 0,
            _ => 10,
        };
        LeaseLine {
            spec: spec.clone(),
            lease: "gw1-lease".into(),
            seq,
            epoch: 0,
            want,
            give_back: 0,
            spent: if slots { 2 } else { 5 * seq },
            end: false,
            ttl_micros: 5_000_000,
            record_ttl_micros: 60_000_000,
        }
    };
    let grant: Vec<LeaseLine> = specs.iter().map(|s| line(s, 1)).collect();
    for r in store.lease(&grant).await.expect("grant") {
        assert!(matches!(r, LeaseReply::Live(_)), "{r:?}");
    }
    const CALLS: u64 = 2_000;
    server.cli(&["config", "resetstat"]);
    let start = Instant::now();
    for seq in 2..CALLS + 2 {
        let lines: Vec<LeaseLine> = specs.iter().map(|s| line(s, seq)).collect();
        store.lease(&lines).await.expect("lease");
    }
    let rate = CALLS as f64 / start.elapsed().as_secs_f64();
    let stats = server.cli(&["info", "commandstats"]);
    let usec = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha"))
        .and_then(|l| l.split([',', ':']).find_map(|kv| kv.strip_prefix("usec=")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN)
        / CALLS as f64;
    let commands = all_calls(&stats) / CALLS as f64;
    println!(
        "lease call of {} lines (one per budget of the typical request; up to {slots_held} \
         slots on each of its 2 concurrency leases): {usec:.1} µs of Redis time per call \
         ({:.1} µs per line), {commands:.1} commands per call, {rate:.0} calls/s from one caller",
        specs.len(),
        usec / specs.len() as f64
    );
}

/// A request with a quota on its tenant, key and end user (each with rpm,
/// tpm and slots too) and the deployment's three budgets: the quotas
/// `window` long (`TokensPerDay` or `TokensPerWeek` by the window).
fn quota_budgets(
    ks: &KeySpace,
    tenant: &str,
    window: Window,
) -> (Vec<BudgetSpec>, Vec<BudgetSpec>) {
    let quota = if window.is_rolling() {
        BudgetName::TokensPerWeek
    } else {
        BudgetName::TokensPerDay
    };
    let spec = |scope: Scope, name: BudgetName| {
        let kind = match name {
            BudgetName::MaxConcurrent => BudgetKind::Concurrency { max: 1_000_000 },
            BudgetName::TokensPerDay | BudgetName::TokensPerWeek => BudgetKind::Quota {
                limit: 500_000_000_000,
                window,
            },
            _ => BudgetKind::Bucket {
                per_minute: 50_000_000,
                burst: 50_000_000,
            },
        };
        BudgetSpec {
            key: ks.budget(&scope, name).into(),
            scope,
            name,
            kind,
            refund_unused: true,
            shadow: false,
        }
    };
    use BudgetName::*;
    let scopes = [
        Scope::Tenant(tenant.into()),
        Scope::Key(tenant.into(), "k".into()),
        Scope::EndUser(tenant.into(), "5f0c7a3e9b2d4c1a8e6f0b3d2c1a9e8f".into()),
    ];
    let common = scopes
        .iter()
        .flat_map(|s| [Rpm, Tpm, MaxConcurrent, quota].map(|n| spec(s.clone(), n)))
        .collect();
    let up = || Scope::Upstream("openai-east".into());
    let upstream = [Rpm, Tpm, MaxConcurrent].map(|n| spec(up(), n)).to_vec();
    (common, upstream)
}

fn calendar_shape(ks: &KeySpace, tenant: &str) -> (Vec<BudgetSpec>, Vec<BudgetSpec>) {
    quota_budgets(ks, tenant, Window::Day)
}

fn weekly_shape(ks: &KeySpace, tenant: &str) -> (Vec<BudgetSpec>, Vec<BudgetSpec>) {
    quota_budgets(ks, tenant, Window::Week)
}

/// Redis time of a request whose tenant, key and end user have a rolling
/// weekly quota, against the same request with calendar day quotas (15
/// budgets each): µs of Redis time per reservation and per settlement, on
/// a fresh window (one sub-bucket) and on a full one (a request in each of
/// the week's 168 hourly sub-buckets before, the largest value the
/// scripts read and rewrite: 8 + 16 × 169 bytes per budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures; run with --ignored --nocapture, preferably --release"]
async fn weekly_window_cost() {
    use budgetgate::clock::{Clock, ManualClock};
    let server = RedisServer::start();
    let clock = ManualClock::new(crate::support::NOON);
    let shapes: [(&str, Shape, u64); 3] = [
        ("calendar day quotas", calendar_shape, 0),
        ("weekly rolling quotas, fresh window", weekly_shape, 0),
        ("weekly rolling quotas, 168 sub-buckets", weekly_shape, 168),
    ];
    for (i, (name, shape, fill)) in shapes.into_iter().enumerate() {
        let ks = KeySpace::new(&format!("bgweek{i}"), "default");
        let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let store = Arc::new(
            RedisStore::connect(&server.url(), Duration::from_secs(5), ks.clone())
                .await
                .expect("connect")
                .with_test_clock(dyn_clock),
        );
        clock.set(crate::support::NOON + i as u64 * 30 * 86_400_000_000);
        for h in 0..fill {
            for t in 0..8 {
                let (common, upstream) = shape(&ks, &format!("tenant{t}"));
                let r = bench_request(format!("fill-{h}-{t}"), &common, &upstream);
                assert!(matches!(
                    store.reserve(&r).await,
                    Ok(ReserveOutcome::Admitted(_))
                ));
            }
            clock.advance(3_600_000_000);
        }
        let (callers, reserve_us, settle_us, commands, per_batch) =
            script_cost(&store, &server, &ks, shape).await;
        println!(
            "{name}: Redis time ({callers} callers, {per_batch:.1} calls per batch): \
             {reserve_us:.1} µs per reservation, {settle_us:.1} µs per settlement; \
             {commands:.1} commands per pair"
        );
    }
}
