//! Fleet exactness (DESIGN section 3): three `budgetgate serve` processes on
//! one Redis, 200 concurrent clients, one tenant with a small TPM and RPM.
//! For every interval [t1, t2] of store time and every tenant bucket:
//! reserved + extended − refunded ≤ burst + rate × (t2 − t1), checked in
//! exact integer units from the scripts' own records (each hold keeps the
//! store's `now` and the amounts debited, extended and refunded).
//!
//! Run: `cargo test --test it redis_fleet:: -- --nocapture` (needs `redis-server`;
//! prints admitted vs bound).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::redis_server::RedisServer;
use crate::support::*;
use budgetgate::budget::bucket::UNITS_PER_TOKEN;
use budgetgate::budget::redis::HoldRecord;

const CLIENTS: usize = 200;
const GATEWAYS: usize = 3;
const RUN: Duration = Duration::from_secs(6);
const TPM: u64 = 1500;
const RPM: u64 = 60;
const MAX_TOKENS: u64 = 20;
const PREFIX: &str = "bgfleet";

fn config(upstream: &str, redis_url: &str) -> TestConfig {
    TestConfig::standard(upstream, 64, limits().tpm(TPM).rpm(RPM)).redis_fleet(redis_url, PREFIX)
}

/// Net token (or request) amounts per store time, µs → units.
type Events = BTreeMap<u64, i64>;

/// Largest `sum(events in [t1, t2]) − (burst + rate × (t2 − t1))` over every
/// interval, in units (≤ 0 means the contract held), and the whole-run totals.
/// Buckets refill in whole milliseconds (`L` units per ms at `L`/min), and a
/// millisecond accrued before `t1` may be credited after it: the refill in
/// `[t1, t2]` is at most `L × (floor((t2 − t1) / 1 ms) + 1)` units.
fn worst_excess(events: &Events, per_minute: u64, burst: u64) -> i128 {
    let pts: Vec<(u64, i64)> = events.iter().map(|(t, a)| (*t, *a)).collect();
    let mut worst = i128::MIN;
    for i in 0..pts.len() {
        let mut sum: i128 = 0;
        for j in i..pts.len() {
            sum += pts[j].1 as i128;
            let ms = (pts[j].0 - pts[i].0) / 1000 + 1;
            let bound = burst as i128 * UNITS_PER_TOKEN as i128 + per_minute as i128 * ms as i128;
            worst = worst.max(sum - bound);
        }
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_never_over_admit() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = config(&mock.base_url(), &redis.url()).write(dir.path());
    let mut gateways = Vec::new();
    for _ in 0..GATEWAYS {
        gateways.push(GatewayProcess::start(&cfg, &[("RUST_LOG", "warn")]).await);
    }
    let bases: Arc<Vec<String>> = Arc::new(gateways.iter().map(|g| g.base_url()).collect());

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .expect("client");
    let ok_ids = Arc::new(Mutex::new(Vec::<String>::new()));
    let (n429, nother) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let deadline = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (http, bases, ok_ids) = (http.clone(), bases.clone(), ok_ids.clone());
        let (n429, nother) = (n429.clone(), nother.clone());
        tasks.push(tokio::spawn(async move {
            let mut seed = c as u64 * 2_654_435_761 + 1;
            let mut n = 0usize;
            while Instant::now() < deadline {
                let base = &bases[(c + n) % bases.len()];
                n += 1;
                let body = serde_json::json!({
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": format!("hello from client {c}")}],
                    "max_tokens": MAX_TOKENS,
                });
                let resp = http
                    .post(format!("{base}/chat/completions"))
                    .bearer_auth(KEY)
                    .json(&body)
                    .send()
                    .await;
                let Ok(resp) = resp else {
                    nother.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                match resp.status().as_u16() {
                    200 => {
                        let id = resp
                            .headers()
                            .get("x-request-id")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let _ = resp.bytes().await;
                        ok_ids.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                    }
                    429 => {
                        n429.fetch_add(1, Ordering::Relaxed);
                        let _ = resp.bytes().await;
                    }
                    s => {
                        eprintln!("client {c}: status {s}: {:?}", resp.text().await);
                        nother.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Jittered back-off, so 200 clients keep knocking without a lockstep herd.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                tokio::time::sleep(Duration::from_millis(20 + seed % 180)).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    // Settlements run after each response; give them a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Read every hold the fleet wrote.
    let mut conn = redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}:*:hold:*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let mut tpm_events = Events::new();
    let mut rpm_events = Events::new();
    let mut admitted_ids = HashSet::new();
    let (mut tokens_reserved, mut tokens_refunded, mut unsettled) = (0i64, 0i64, 0usize);
    let (mut first, mut last) = (u64::MAX, 0u64);
    for k in &keys {
        let raw: String = redis::cmd("GET")
            .arg(k)
            .query_async(&mut conn)
            .await
            .expect("GET");
        let h = HoldRecord::parse(&raw).expect("hold");
        admitted_ids.insert(h.id.clone());
        first = first.min(h.admitted_micros);
        last = last.max(h.admitted_micros);
        // Every request debits the tenant's TPM (its reserved tokens) and
        // RPM (1). A settled hold is a tombstone without budget lines, so
        // the debits come from its header: tokens reserved (initial plus
        // extensions), extensions with their store times, and the settle's
        // time, refund and debt (tenant budgets refund unused tokens).
        let u = UNITS_PER_TOKEN;
        let extended: u64 = h.extensions.iter().map(|&(_, g)| g).sum();
        let initial = h.reserved_tokens - extended;
        *tpm_events.entry(h.admitted_micros).or_default() += initial as i64 * u;
        *rpm_events.entry(h.admitted_micros).or_default() += u;
        tokens_reserved += initial as i64;
        for &(t, g) in &h.extensions {
            *tpm_events.entry(t).or_default() += g as i64 * u;
            tokens_reserved += g as i64;
        }
        match h.settlement {
            Some(s) => {
                *tpm_events.entry(s.now_micros).or_default() +=
                    (s.debt as i64 - s.refunded as i64) * u;
                tokens_refunded += s.refunded as i64;
            }
            None => unsettled += 1,
        }
    }
    let ok_ids = ok_ids.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (n429, nother) = (n429.load(Ordering::Relaxed), nother.load(Ordering::Relaxed));
    let elapsed = last.saturating_sub(first);
    let tpm_bound = TPM as u128 * elapsed as u128 / 60_000_000 + TPM as u128;
    let rpm_bound = RPM as u128 * elapsed as u128 / 60_000_000 + RPM as u128;
    println!(
        "fleet: {GATEWAYS} gateways, {CLIENTS} clients, {:.1} s of store time: \
         {} admitted (HTTP 200: {}), {n429} refused (429), {nother} other",
        elapsed as f64 / 1e6,
        admitted_ids.len(),
        ok_ids.len()
    );
    println!(
        "  tpm: reserved {tokens_reserved} − refunded {tokens_refunded} = {} tokens vs bound \
         burst + rate × elapsed = {tpm_bound}; rpm: {} requests vs bound {rpm_bound}",
        tokens_reserved - tokens_refunded,
        rpm_events.values().sum::<i64>() / UNITS_PER_TOKEN
    );
    let tpm_worst = worst_excess(&tpm_events, TPM, TPM);
    let rpm_worst = worst_excess(&rpm_events, RPM, RPM);
    println!(
        "  worst interval slack: tpm {:.3} tokens, rpm {:.3} requests (≥ 0 = within the contract)",
        -(tpm_worst as f64) / UNITS_PER_TOKEN as f64,
        -(rpm_worst as f64) / UNITS_PER_TOKEN as f64
    );

    assert_eq!(nother, 0, "every answer is 200 or 429");
    assert!(tokens_reserved > 0, "the holds were read");
    assert_eq!(
        rpm_events.values().sum::<i64>() / UNITS_PER_TOKEN,
        admitted_ids.len() as i64,
        "one RPM debit per admission"
    );
    assert!(n429 > 0, "the limit was actually reached");
    assert_eq!(unsettled, 0, "every admission was settled");
    for id in &ok_ids {
        assert!(admitted_ids.contains(id), "HTTP 200 {id} has no hold");
    }
    assert_eq!(ok_ids.len(), admitted_ids.len(), "one hold per admission");
    assert!(tpm_worst <= 0, "TPM over-admitted by {tpm_worst} units");
    assert!(rpm_worst <= 0, "RPM over-admitted by {rpm_worst} units");

    // The exactness above held with reserve and settle calls sent in
    // batches: at this concurrency several calls share a batch.
    let (mut batches, mut calls) = (0.0, 0.0);
    for g in &gateways {
        batches += g.metric("budgetgate_redis_batches_total", &[]).await;
        calls += g.metric("budgetgate_redis_batch_calls_total", &[]).await;
    }
    println!(
        "  Redis batches: {batches} carrying {calls} reserve and settle calls ({:.1} per batch)",
        calls / batches
    );
    assert!(batches > 0.0 && calls > batches, "calls went in batches");
    drop(gateways);
}
