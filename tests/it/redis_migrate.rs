//! Switching a fleet from the `single` key layout to the `tenant` layout
//! (DESIGN section 22, OPERATIONS "Switching a fleet to the tenant
//! layout"):
//!
//! - `store migrate` copies every budget counter (configured and dynamic,
//!   shadow included; never a concurrency slot set) from the `single`
//!   layout's key to the `tenant` layout's, only where the `tenant` layout
//!   has none: a second run changes nothing; on one node and on a
//!   three-primary cluster;
//! - the reservation id says its layout: a `single` hold settles, extends,
//!   renews and voids in the `single` layout at a `tenant` store that never
//!   saw it; a `tenant` id a store did not place writes nothing anywhere;
//! - a running fleet of three gateway processes is switched by a rolling
//!   restart with streams in flight (`a_rolling_switch_…`).
//!
//! Run: `cargo test --test it redis_migrate -- --nocapture`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::redis_server::{self, RedisServer};
use crate::support::*;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::placement::{self, DomainMap, Layout};
use budgetgate::budget::redis::migrate::{migrate, Migration};
use budgetgate::budget::redis::{HoldRecord, RedisStore};
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, Costs, ExtendOutcome, RenewOutcome,
    ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement, Step, Window,
};
use budgetgate::clock::{Clock, ManualClock};

const SEC: u64 = 1_000_000;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A test's two key spaces (one prefix and domain, both layouts) and the
/// Redis URL they live on.
struct Layouts {
    url: String,
    single: KeySpace,
    tenant: KeySpace,
    clock: ManualClock,
}

impl Layouts {
    fn new(url: &str) -> Self {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("bgmig{}x{n}", std::process::id());
        let domain = format!("d{n}");
        let map = DomainMap::new(&domain, [("team", "acme")], [vec!["up1", "up2"]]);
        Layouts {
            url: url.to_string(),
            single: KeySpace::new(&prefix, &domain),
            tenant: KeySpace::new(&prefix, &domain)
                .with_layout(Layout::Tenant, Some(Arc::new(map))),
            clock: ManualClock::new(NOON),
        }
    }

    /// A store of `layout` on the test clock (a gateway of that layout).
    async fn store(&self, layout: Layout) -> RedisStore {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        RedisStore::connect(&self.url, Duration::from_secs(5), self.single.clone())
            .await
            .expect("connect")
            .with_test_clock(clock)
            .with_layout(layout)
    }

    fn ks(&self, layout: Layout) -> &KeySpace {
        match layout {
            Layout::Single => &self.single,
            Layout::Tenant => &self.tenant,
        }
    }

    async fn migrate(&self) -> Migration {
        migrate(
            &self.url,
            Duration::from_secs(5),
            &self.single,
            &self.tenant,
        )
        .await
        .expect("migrate")
    }
}

fn spec(ks: &KeySpace, scope: Scope, name: BudgetName, kind: BudgetKind) -> BudgetSpec {
    BudgetSpec {
        key: ks.budget(&scope, name).into(),
        scope,
        name,
        kind,
        refund_unused: true,
        shadow: false,
    }
}

/// The budgets a request of tenant `team` (under `acme`) on deployment
/// `up1` touches, named in `ks`: common (tenant tpm and daily tokens, key
/// rpm, end-user daily tokens, a shadow tenant×model quota, tenant
/// concurrency) and the deployment's tpm.
fn budgets(ks: &KeySpace) -> (Vec<BudgetSpec>, Vec<BudgetSpec>) {
    let team = || Arc::<str>::from("team");
    let mut shadow = spec(
        ks,
        Scope::TenantModel(team(), "gpt/4o:mini".into()),
        BudgetName::TokensPerDay,
        BudgetKind::Quota {
            limit: 500,
            window: Window::Day,
        },
    );
    shadow.key = ks.shadow_budget(&shadow.scope, shadow.name).as_str().into();
    shadow.shadow = true;
    let common = vec![
        spec(
            ks,
            Scope::Tenant(team()),
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: 6000,
                burst: 6000,
            },
        ),
        spec(
            ks,
            Scope::Tenant(team()),
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit: 10_000,
                window: Window::Day,
            },
        ),
        spec(
            ks,
            Scope::Key(team(), "k1".into()),
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: 60,
                burst: 60,
            },
        ),
        spec(
            ks,
            Scope::EndUser(team(), "0123456789abcdef0123456789abcdef".into()),
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit: 1000,
                window: Window::Day,
            },
        ),
        shadow,
        spec(
            ks,
            Scope::Tenant(team()),
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max: 4 },
        ),
    ];
    let deployment = vec![spec(
        ks,
        Scope::Upstream("up1".into()),
        BudgetName::Tpm,
        BudgetKind::Bucket {
            per_minute: 100_000,
            burst: 100_000,
        },
    )];
    (common, deployment)
}

fn request(id: &str, tokens: u64, ks: &KeySpace) -> ReserveRequest {
    let (common, deployment) = budgets(ks);
    ReserveRequest {
        id: id.into(),
        costs: Costs::tokens(tokens),
        common,
        candidates: vec![deployment],
        slot_lease_micros: 10 * SEC,
        hold_ttl_micros: 120 * SEC,
        requester: Default::default(),
        share: None,
    }
}

fn settlement(tokens: u64) -> Settlement {
    Settlement {
        actual_tokens: tokens,
        upstream_failed: false,
        actual: Default::default(),
    }
}

async fn admit(store: &RedisStore, req: &ReserveRequest) {
    match store.reserve(req).await.expect("reserve") {
        ReserveOutcome::Admitted(_) => {}
        other => panic!("{}: {other:?}", req.id),
    }
}

/// Every budget's remaining amount as `layout`'s store reads it.
async fn remaining(l: &Layouts, layout: Layout) -> Vec<i64> {
    let store = l.store(layout).await;
    let (mut all, deployment) = budgets(l.ks(layout));
    all.extend(deployment);
    store
        .inspect(&all)
        .await
        .expect("inspect")
        .iter()
        .map(|s| s.remaining)
        .collect()
}

/// `store migrate` copies each counter once: the `tenant` layout then reads
/// what the `single` layout read (concurrency aside: its slots stay with
/// their holds); a second run copies nothing; a counter the `tenant`
/// layout wrote first is never overwritten.
async fn migrate_copies_each_counter_once(url: &str) {
    let l = Layouts::new(url);
    let single = l.store(Layout::Single).await;
    admit(&single, &request("r1", 300, &l.single)).await;
    assert!(matches!(
        single.settle("r1", &settlement(200)).await.expect("settle"),
        SettleOutcome::Settled { .. }
    ));
    // A live hold: its concurrency slot stays in the `single` layout.
    admit(&single, &request("r2", 100, &l.single)).await;
    l.clock.advance(SEC);
    let before = remaining(&l, Layout::Single).await;
    let fresh = remaining(&l, Layout::Tenant).await;
    assert_ne!(before, fresh, "the single layout was debited");

    let first = l.migrate().await;
    println!("first run: {first}");
    // Tenant tpm, daily tokens, key rpm, end user, shadow quota, deployment tpm.
    assert_eq!(first.copied, 6, "{first:?}");
    assert_eq!(
        (first.present, first.slots, first.gone),
        (0, 1, 0),
        "{first:?}"
    );
    let after = remaining(&l, Layout::Tenant).await;
    let concurrency = 5;
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        if i == concurrency {
            assert_eq!(*a, 4, "slots are not copied");
        } else {
            assert_eq!(
                a, b,
                "budget {i}: tenant layout {after:?}, single {before:?}"
            );
        }
    }
    let second = l.migrate().await;
    assert_eq!(
        (second.copied, second.present),
        (0, first.copied),
        "{second:?}"
    );
    assert_eq!(remaining(&l, Layout::Tenant).await, after);

    // The tenant layout debits its own counters; a third run leaves them.
    let tenant = l.store(Layout::Tenant).await;
    admit(&tenant, &request("r3", 50, &l.tenant)).await;
    let debited = remaining(&l, Layout::Tenant).await;
    assert_eq!(debited[1], after[1] - 50);
    let third = l.migrate().await;
    assert_eq!(third.copied, 0);
    assert_eq!(remaining(&l, Layout::Tenant).await, debited);
}

#[tokio::test]
async fn migrate_copies_each_counter_once_on_one_node() {
    migrate_copies_each_counter_once(&redis_server::shared().url()).await;
}

#[tokio::test]
async fn migrate_copies_each_counter_once_on_a_cluster() {
    migrate_copies_each_counter_once(&redis_server::shared_cluster().url()).await;
}

/// A hold made by a `single` gateway settles in the `single` layout at a
/// `tenant` gateway that never saw it (a settle retried after a restart,
/// a lost reply's void); a `tenant` id a store did not place is answered
/// unknown and writes nothing, not even a tombstone in the wrong layout.
#[tokio::test]
async fn the_reservation_id_says_where_its_holds_are() {
    let l = Layouts::new(&redis_server::shared_cluster().url());
    let old = l.store(Layout::Single).await;
    let id = uuid::Uuid::now_v7().hyphenated().to_string();
    assert_eq!(placement::layout_of_reservation(&id), Layout::Single);
    admit(&old, &request(&id, 300, &l.single)).await;
    let tokens_per_day = 1;
    assert_eq!(remaining(&l, Layout::Single).await[tokens_per_day], 9_700);

    let new = l.store(Layout::Tenant).await;
    let step = Step {
        tokens: 100,
        rates: Vec::new(),
    };
    assert!(matches!(
        new.extend(&id, &step).await.expect("extend"),
        ExtendOutcome::Extended { granted: 100, .. }
    ));
    assert!(matches!(
        new.renew(&id).await.expect("renew"),
        RenewOutcome::Renewed { .. }
    ));
    assert!(matches!(
        new.settle(&id, &settlement(250)).await.expect("settle"),
        SettleOutcome::Settled {
            reserved: 400,
            refunded: 150,
            ..
        }
    ));
    assert_eq!(remaining(&l, Layout::Single).await[tokens_per_day], 9_750);
    let hold = old.read_hold(&id).await.expect("read").expect("a hold");
    assert!(hold.settlement.is_some(), "settled where it was made");

    // A `tenant` id placed by one store, voided by another (restarted).
    let placed_by = l.store(Layout::Tenant).await;
    let bytes = placement::mark_reservation(*uuid::Uuid::now_v7().as_bytes(), Layout::Tenant);
    let marked = uuid::Uuid::from_bytes(bytes).hyphenated().to_string();
    admit(&placed_by, &request(&marked, 100, &l.tenant)).await;
    let restarted = l.store(Layout::Tenant).await;
    assert_eq!(
        restarted.void(&marked, 120 * SEC).await.expect("void"),
        SettleOutcome::Unknown
    );
    assert_eq!(
        restarted.read_hold(&marked).await.expect("read"),
        None,
        "no tombstone in the single layout"
    );
    // The store that placed it settles it in its domains.
    assert!(matches!(
        placed_by
            .settle(&marked, &settlement(80))
            .await
            .expect("settle"),
        SettleOutcome::Settled { .. }
    ));
    let tag = placement::tenant_tag(&hash_domain(&l.single), "acme");
    let hold = placed_by
        .read_hold_in(&tag, &marked)
        .await
        .expect("read")
        .expect("a tenant hold");
    assert!(hold.settlement.is_some());
}

/// The domain of a `single` key space (its one hash tag).
fn hash_domain(ks: &KeySpace) -> String {
    budgetgate::budget::keys::hash_tag(ks.base())
        .unwrap_or_default()
        .to_string()
}

// ---------------------------------------------------------------------
// A running fleet switched by a rolling restart.
// ---------------------------------------------------------------------

const PREFIX: &str = "bgswitch";
const GATEWAYS: usize = 3;
/// The tenant's daily token quota: small enough that the run exhausts it.
const DAILY: u64 = 4_000;
const MAX_TOKENS: u64 = 60;
/// Between two streamed tokens (every answer is `MAX_TOKENS` long).
const TOKEN_DELAY: Duration = Duration::from_millis(40);

fn fleet_config(upstream: &str, redis: &str, layout: &str) -> TestConfig {
    let mut c = TestConfig::standard(
        upstream,
        MAX_TOKENS,
        limits().tokens_per_day(DAILY).max_concurrent(64),
    )
    .redis_fleet(redis, PREFIX);
    c.store.domain = Some("fleet".into());
    c.store.layout = Some(layout.into());
    c.server.shutdown_grace_secs = Some(60);
    c
}

/// What the clients saw.
#[derive(Default)]
struct Seen {
    /// Request ids of streams answered 200 and read to `[DONE]`.
    completed: Mutex<Vec<String>>,
    /// Streams answered 200 that broke off or ended without `[DONE]`.
    broken: AtomicU64,
    refused: AtomicU64,
    /// Any other answer, or no answer.
    failed: AtomicU64,
}

/// One stream, read to its end.
async fn stream_once(http: &reqwest::Client, base: &str, seen: &Seen) {
    let body = serde_json::json!({
        "model": "gpt-4o-mini",
        "stream": true,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": MAX_TOKENS,
    });
    let sent = http
        .post(format!("{base}/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{base}: no answer: {e}");
            seen.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    match resp.status().as_u16() {
        200 => {
            let id = header(&resp, "x-request-id").unwrap_or_default();
            match resp.bytes().await {
                Ok(b) if sse_data(&b).last().map(String::as_str) == Some("[DONE]") => {
                    let chunks = sse_chunks(&b);
                    let finish = chunks
                        .iter()
                        .rev()
                        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
                        .unwrap_or_default()
                        .to_string();
                    if finish == "length" && content_chunks(&chunks) as u64 == MAX_TOKENS {
                        seen.completed.lock().expect("lock").push(id);
                    } else {
                        eprintln!("{base}: stream {id} ended {finish:?}");
                        seen.broken.fetch_add(1, Ordering::Relaxed);
                    }
                }
                other => {
                    eprintln!("{base}: stream {id} broke: {:?}", other.map(|b| b.len()));
                    seen.broken.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        429 => {
            let _ = resp.bytes().await;
            seen.refused.fetch_add(1, Ordering::Relaxed);
        }
        s => {
            eprintln!("{base}: status {s}: {:?}", resp.text().await);
            seen.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Every key of the fleet.
async fn fleet_keys(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{PREFIX}:*"))
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// The tenant's daily token counter in a key space, `0` when absent.
async fn used_today(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    let raw: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET");
    // A quota is two little-endian doubles: window id, used.
    raw.and_then(|v| v.get(8..16).map(|b| b.to_vec()))
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, |b| f64::from_le_bytes(b) as u64)
}

/// Three gateways of the `single` layout serve long streams; `store
/// migrate` runs; each gateway is replaced in turn by one of the `tenant`
/// layout (the new one started, then the old one stopped, its streams
/// left to finish) while streams keep starting on every live gateway.
/// Every admitted stream completes, every hold of both layouts is settled
/// and every concurrency slot is back, and the tokens the upstream served
/// stay within the daily quota plus what the `single` layout admitted
/// after the migrate (the stated bound: at most one more quota).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_switch_to_the_tenant_layout_with_streams_in_flight() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    mock.state.set_token_delay(TOKEN_DELAY);
    let dir = tempfile::tempdir().expect("temp dir");
    let single_cfg = dir.path().join("single.toml");
    let tenant_cfg = dir.path().join("tenant.toml");
    fleet_config(&mock.base_url(), &redis.url(), "single").write_to(&single_cfg);
    fleet_config(&mock.base_url(), &redis.url(), "tenant").write_to(&tenant_cfg);
    let policy = fleet_config(&mock.base_url(), &redis.url(), "tenant").policy();
    let single_ks = KeySpace::new(PREFIX, "fleet");
    let tenant_ks = single_ks
        .clone()
        .with_layout(Layout::Tenant, Some(policy.tenant_placement()));
    let daily = |ks: &KeySpace| ks.budget(&Scope::Tenant("t1".into()), BudgetName::TokensPerDay);
    let (single_key, tenant_key) = (daily(&single_ks), daily(&tenant_ks));
    assert_ne!(single_key, tenant_key);
    let mut conn = redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");

    let mut old = Vec::new();
    for _ in 0..GATEWAYS {
        old.push(GatewayProcess::start(&single_cfg, &[("RUST_LOG", "warn")]).await);
    }
    let live: Arc<Mutex<Vec<String>>> =
        Arc::new(Mutex::new(old.iter().map(|g| g.base_url()).collect()));
    let seen = Arc::new(Seen::default());
    let http = reqwest::Client::new();
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // A new stream every 150 ms, on the live gateways in turn: each runs
    // 60 × 40 ms ≈ 2.4 s, so about 16 are in flight at any time.
    let driver = {
        let (live, seen, http, running) =
            (live.clone(), seen.clone(), http.clone(), running.clone());
        tokio::spawn(async move {
            let mut streams = Vec::new();
            let mut n = 0usize;
            while running.load(Ordering::SeqCst) {
                let base = {
                    let l = live.lock().expect("lock");
                    l[n % l.len()].clone()
                };
                n += 1;
                let (seen, http) = (seen.clone(), http.clone());
                streams.push(tokio::spawn(async move {
                    stream_once(&http, &base, &seen).await
                }));
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            for s in streams {
                s.await.expect("stream task");
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["store", "migrate", "--config"])
        .arg(&tenant_cfg)
        .output()
        .await
        .expect("run store migrate");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "store migrate failed: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", said.trim());
    assert!(said.contains(" copied"), "{said}");
    // What the tenant layout starts from: the single layout's count at the copy.
    let copied = used_today(&mut conn, &tenant_key).await;
    assert!(copied > 0, "streams had been admitted before the migrate");

    let mut new = Vec::new();
    for g in old.drain(..) {
        let fresh = GatewayProcess::start(&tenant_cfg, &[("RUST_LOG", "warn")]).await;
        {
            let mut l = live.lock().expect("lock");
            l.retain(|b| *b != g.base_url());
            l.push(fresh.base_url());
        }
        new.push(fresh);
        // No new request reaches the old gateway after this; those it
        // serves finish during its shutdown.
        tokio::time::sleep(Duration::from_millis(300)).await;
        g.signal("TERM");
        let mut g = g;
        assert!(g.wait_exit(Duration::from_secs(60)).await.success());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let single_after = used_today(&mut conn, &single_key).await;
    // The tenant layout alone now: run on until its quota refuses.
    tokio::time::sleep(Duration::from_secs(4)).await;
    running.store(false, Ordering::SeqCst);
    driver.await.expect("driver");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let completed = seen.completed.lock().expect("lock").clone();
    let (broken, refused, failed) = (
        seen.broken.load(Ordering::Relaxed),
        seen.refused.load(Ordering::Relaxed),
        seen.failed.load(Ordering::Relaxed),
    );
    let marked: BTreeMap<&str, usize> = completed.iter().fold(BTreeMap::new(), |mut m, id| {
        *m.entry(placement::layout_of_reservation(id).as_str())
            .or_default() += 1;
        m
    });
    // What the upstream served, as the mock counts it (prompt + output).
    let bpe = mock_upstream::bpe_for("gpt-4o-mini");
    let served: u64 = mock
        .state
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| mock_upstream::chat_prompt_tokens(bpe, &r.body) + MAX_TOKENS)
        .sum();
    let tenant_final = used_today(&mut conn, &tenant_key).await;
    let after_migrate = single_after - copied;
    println!(
        "streams: {} completed ({marked:?} by the layout their id says), {refused} refused, {broken} broken, {failed} failed",
        completed.len()
    );
    println!(
        "daily quota {DAILY}: served {served} tokens; single layout counted {single_after} \
         ({copied} when copied, {after_migrate} after), tenant layout {tenant_final}; \
         bound quota + single-layout admissions after the copy = {}",
        DAILY + after_migrate
    );

    assert_eq!((broken, failed), (0, 0), "every admitted stream completes");
    assert!(
        marked.contains_key("single") && marked.contains_key("tenant"),
        "both layouts served: {marked:?}"
    );
    assert!(refused > 0, "the quota was reached");
    // Every hold of both layouts settled; no slot left taken.
    let keys = fleet_keys(&mut conn).await;
    let (mut single_holds, mut tenant_holds) = (0, 0);
    for k in keys.iter().filter(|k| k.contains(":hold:")) {
        let raw: String = redis::cmd("GET")
            .arg(k)
            .query_async(&mut conn)
            .await
            .expect("GET");
        let h = HoldRecord::parse(&raw).expect("hold");
        assert!(h.settlement.is_some(), "{k} is not settled");
        match placement::layout_of_reservation(&h.id) {
            Layout::Single => {
                assert!(k.starts_with(single_ks.base()), "{k}");
                single_holds += 1;
            }
            Layout::Tenant => {
                assert!(!k.starts_with(single_ks.base()), "{k}");
                tenant_holds += 1;
            }
        }
    }
    assert_eq!(
        single_holds + tenant_holds,
        completed.len(),
        "one hold per admitted stream"
    );
    for k in keys.iter().filter(|k| k.ends_with(":max_concurrent")) {
        let taken: u64 = redis::cmd("ZCARD")
            .arg(k)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        assert_eq!(taken, 0, "{k}: slots still taken");
    }
    // Counters agree with the upstream: each layout counted what it admitted.
    assert_eq!(
        served,
        single_after + tenant_final - copied,
        "the upstream served what the two layouts counted"
    );
    assert!(tenant_final <= DAILY, "the tenant layout kept its quota");
    assert!(
        served <= DAILY + after_migrate,
        "served {served} beyond the quota {DAILY} + {after_migrate} admitted by the single layout after the copy"
    );
    assert!(
        after_migrate <= DAILY,
        "the bound is at most one more quota"
    );
    drop(new);
}
