//! The spend ledger (docs/LEDGER.md) on the default
//! control database (SQLite on disk): after 1,000 requests of every
//! dialect, streams included, with cut-offs, upstream failures (before
//! and during a stream) and settlements retried after a lost reply, the
//! ledger holds exactly one row per settled or voided reservation and its
//! µ$ sum is each budget's spent figure in the admin API. Faults guarded
//! against: a retried settlement written twice, a refund or a void
//! charged, a row missing for a stream, the request path waiting for the
//! database.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::{
    BudgetName, BudgetSpec, BudgetState, BudgetStore, ExtendOutcome, RenewOutcome, ReserveOutcome,
    ReserveRequest, Scope, SettleOutcome, Settlement, Step, StoreError,
};
use budgetgate::clock::ManualClock;
use serde_json::{json, Value};

use crate::support::config::{self, tenant};
use crate::support::*;

const TOKEN: &str = "ledger-test-admin-token";
const CUT_KEY: &str = "sk-ledger-cut";

/// The memory store, except that every `lose_every`-th settle is applied
/// and its reply then lost (a timeout): the gateway retries it under the
/// same id and the store answers `AlreadySettled`. Records the ids the
/// store applied a settle or void to.
struct LostSettleReplies {
    inner: Arc<MemoryStore>,
    lose_every: u64,
    calls: AtomicU64,
    lost: AtomicU64,
    applied: Mutex<BTreeSet<String>>,
}

#[async_trait]
impl BudgetStore for LostSettleReplies {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.inner.reserve(req).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.inner.extend(id, step).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(id).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        let o = self.inner.settle(id, s).await?;
        if matches!(o, SettleOutcome::Settled { .. }) {
            self.applied.lock().unwrap().insert(id.to_string());
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) % self.lose_every == self.lose_every - 1 {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Timeout);
        }
        Ok(o)
    }
    async fn void(&self, id: &str, ttl: u64) -> Result<SettleOutcome, StoreError> {
        let o = self.inner.void(id, ttl).await?;
        if matches!(o, SettleOutcome::Settled { .. }) {
            self.applied.lock().unwrap().insert(id.to_string());
        }
        Ok(o)
    }
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        self.inner.inspect(specs).await
    }
    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.inner.lower(spec, at_most).await
    }
}

/// The mock as `mock` (OpenAI dialects, priced) and `claude` (Messages,
/// priced); tenant `t1` with $1,000 a day, tenant `cut` whose small daily
/// quota cuts its streams off.
fn ledger_config(mock: &mock_upstream::MockUpstream) -> TestConfig {
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits().usd_per_day("1000"));
    // The mock reads its fault from the request the gateway sends.
    c.upstream("mock").forward_client_headers = vec!["x-mock-fault".into()];
    let m = c.model("gpt-4o-mini");
    m.price = Some(price("0.15", "0.60"));
    m.responses = Some(true);
    c.model("text-embedding-3-small").price = Some(price("0.02", "0"));
    c.upstreams.push(config::upstream(
        "claude",
        Kind::Anthropic,
        &mock.root_url(),
    ));
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        max_output_tokens: Some(4096),
        default_max_output_tokens: Some(16),
        price: Some(RawPrice {
            cache_write_5m: Some("3.75".into()),
            cache_write_1h: Some("6".into()),
            ..price("3", "15")
        }),
        ..config::model("claude-test", &["claude"])
    });
    // A deployment nothing listens on: its requests never reach an
    // upstream and are voided.
    c.upstreams.push(config::upstream(
        "dead",
        Kind::SelfHosted,
        "http://127.0.0.1:1/v1",
    ));
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        max_output_tokens: Some(4096),
        default_max_output_tokens: Some(16),
        price: Some(price("0.15", "0.60")),
        ..config::model("gpt-dead", &["dead"])
    });
    c.tenants.push(tenant(
        "cut",
        "kc",
        CUT_KEY,
        // Room for one stream's first reservation but not its 40 tokens of
        // output: the first stream admitted is cut off whatever the
        // interleaving of the 16 workers, every later one is refused.
        limits().tokens_per_day(40).usd_per_day("1000"),
    ));
    c.ledger.batch_interval_ms = Some(200);
    c
}

/// Request `i` of the mix: its path, key, body and extra header.
fn request(
    i: usize,
) -> (
    &'static str,
    &'static str,
    Value,
    Option<(&'static str, &'static str)>,
) {
    let chat = |stream: bool| json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("hello {i}")}], "max_tokens": 12, "stream": stream});
    let messages = |stream: bool| json!({"model": "claude-test", "max_tokens": 12, "stream": stream, "messages": [{"role": "user", "content": format!("hi {i}")}]});
    match i % 12 {
        0 => ("chat/completions", KEY, chat(false), None),
        1 => ("chat/completions", KEY, chat(true), None),
        2 => (
            "completions",
            KEY,
            json!({"model": "gpt-4o-mini", "prompt": format!("say {i}"), "max_tokens": 10}),
            None,
        ),
        3 => (
            "embeddings",
            KEY,
            json!({"model": "text-embedding-3-small", "input": format!("embed {i}")}),
            None,
        ),
        4 => (
            "responses",
            KEY,
            json!({"model": "gpt-4o-mini", "input": format!("respond {i}"), "max_output_tokens": 16}),
            None,
        ),
        5 => (
            "responses",
            KEY,
            json!({"model": "gpt-4o-mini", "input": format!("stream {i}"), "max_output_tokens": 16, "stream": true}),
            None,
        ),
        6 => ("messages", KEY, messages(false), None),
        7 => ("messages", KEY, messages(true), None),
        // Upstream failures: before any output (refunded) and mid-stream.
        8 => (
            "chat/completions",
            KEY,
            chat(false),
            Some(("x-mock-fault", "server_error")),
        ),
        9 => (
            "chat/completions",
            KEY,
            chat(true),
            Some(("x-mock-fault", "drop_mid_stream")),
        ),
        // Uncapped streams of a tenant with a small quota: cut off, then refused.
        10 => (
            "chat/completions",
            CUT_KEY,
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "an endless story"}], "stream": true}),
            None,
        ),
        // Never sent: voided (every budget refunded).
        _ if i % 24 == 11 => (
            "chat/completions",
            KEY,
            json!({"model": "gpt-dead", "messages": [{"role": "user", "content": "lost"}], "max_tokens": 12}),
            None,
        ),
        _ => ("chat/completions", KEY, chat(true), None),
    }
}

async fn ledger_rows(gw: &Gateway) -> Vec<Value> {
    let r = admin_get(gw, "/admin/v1/spend/rows", Some(TOKEN)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["data"].as_array().unwrap().clone()
}

/// Waits until the gateway's ledger buffer is written.
async fn ledger_written(gw: &Gateway) {
    gw.settled().await;
    let ledger = gw
        .state
        .ledger
        .get()
        .expect("the ledger is on by default")
        .clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while ledger.buffer().map_or(0, |b| b.held()) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ledger was not written within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_row_per_settled_or_voided_reservation_and_the_cost_is_each_budgets_spent_figure() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    let clock = ManualClock::new(NOON);
    let store = Arc::new(LostSettleReplies {
        inner: Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
        lose_every: 9,
        calls: AtomicU64::new(0),
        lost: AtomicU64::new(0),
        applied: Mutex::default(),
    });
    let gw = ledger_config(&mock).start_with(clock, store.clone()).await;
    gw.state.set_admin_token(Some(TOKEN));

    const REQUESTS: usize = 1_000;
    let client = reqwest::Client::new();
    let statuses: Arc<Mutex<BTreeMap<u16, usize>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..16 {
        let (client, base, statuses, next) = (
            client.clone(),
            gw.base_url(),
            statuses.clone(),
            next.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                if i >= REQUESTS {
                    return;
                }
                let (path, key, body, header) = request(i);
                let mut req = client
                    .post(format!("{base}/{path}"))
                    .bearer_auth(key)
                    .header("anthropic-version", "2023-06-01")
                    .json(&body);
                if let Some((k, v)) = header {
                    req = req.header(k, v);
                }
                let r = req.send().await.expect("gateway");
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                *statuses.lock().unwrap().entry(status).or_default() += 1;
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    ledger_written(&gw).await;

    let rows = ledger_rows(&gw).await;
    let ids: BTreeSet<String> = rows
        .iter()
        .map(|r| r["reservation_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), rows.len(), "a reservation written twice");
    let applied = store.applied.lock().unwrap().clone();
    assert!(
        store.lost.load(Ordering::SeqCst) >= 50,
        "settle replies were lost"
    );
    assert_eq!(
        ids,
        applied,
        "one row per reservation the store settled or voided (statuses {:?})",
        statuses.lock().unwrap()
    );
    let outcomes: BTreeSet<&str> = rows
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    let mut by_outcome: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *by_outcome
            .entry(r["outcome"].as_str().unwrap())
            .or_default() += 1;
    }
    println!(
        "ledger: {REQUESTS} requests (statuses {:?}), {} rows {by_outcome:?}, {} settle replies lost and retried",
        statuses.lock().unwrap(),
        rows.len(),
        store.lost.load(Ordering::SeqCst)
    );
    for o in ["answered", "cut_off", "upstream_failed", "voided"] {
        assert!(outcomes.contains(o), "no {o} row: {outcomes:?}");
    }
    let dialects: BTreeSet<&str> = rows
        .iter()
        .map(|r| r["dialect"].as_str().unwrap())
        .collect();
    assert_eq!(
        dialects,
        ["chat", "completions", "embeddings", "messages", "responses"]
            .into_iter()
            .collect()
    );
    for r in rows.iter().filter(|r| {
        (r["outcome"] == "upstream_failed" && r["output_tokens"] == 0) || r["outcome"] == "voided"
    }) {
        assert_eq!(r["cost_micros"], 0, "a refund is not spend: {r}");
    }

    // Each dollar budget's spent figure is the sum of its rows' cost.
    for t in ["t1", "cut"] {
        let sum: u64 = rows
            .iter()
            .filter(|r| r["tenant"] == t)
            .map(|r| r["cost_micros"].as_u64().unwrap())
            .sum();
        assert!(sum > 0, "{t} spent something");
        assert_eq!(
            gw.used(Scope::Tenant(t.into()), BudgetName::UsdPerDay)
                .await,
            sum,
            "{t}"
        );
        let spent = admin_get(&gw, "/admin/v1/budgets?limit=10", Some(TOKEN)).await;
        let v: Value = spent.json().await.unwrap();
        let tenant = v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == t)
            .unwrap()
            .clone();
        let usd = tenant["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["budget"] == "usd_per_day" && b["scope"] == format!("tenant:{t}"))
            .unwrap()["usd"]["spent"]
            .clone();
        assert_eq!(
            usd,
            budgetgate::money::format_usd(sum as i64),
            "{t}: the admin API's spent"
        );
    }

    // The query routes add up to the rows.
    let r = admin_get(
        &gw,
        "/admin/v1/spend?group_by=tenant,dialect&period=month",
        Some(TOKEN),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    let total: u64 = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["cost_micros"].as_u64().unwrap())
        .sum();
    let requests: u64 = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(requests as usize, rows.len());
    assert_eq!(
        total,
        rows.iter()
            .map(|r| r["cost_micros"].as_u64().unwrap())
            .sum::<u64>()
    );
    let csv = admin_get(&gw, "/admin/v1/spend/rows?format=csv", Some(TOKEN))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        csv.lines().count(),
        rows.len() + 1,
        "a header line and one line per row"
    );
}

/// The memory store, with every settle made slow (it waits `delay`, then
/// applies) and, when `lose_replies`, its reply lost after it applied.
struct SlowSettles {
    inner: Arc<MemoryStore>,
    delay: Duration,
    lose_replies: bool,
    started: AtomicU64,
    applied: AtomicU64,
}

impl SlowSettles {
    fn new(clock: &ManualClock, delay: Duration, lose_replies: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
            delay,
            lose_replies,
            started: AtomicU64::new(0),
            applied: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl BudgetStore for SlowSettles {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.inner.reserve(req).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.inner.extend(id, step).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(id).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let o = self.inner.settle(id, s).await?;
        self.applied.fetch_add(1, Ordering::SeqCst);
        if self.lose_replies {
            return Err(StoreError::Timeout);
        }
        Ok(o)
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

/// Fault guarded against: the refund of an upstream 500 was awaited in the
/// request's own future, so a client that left during a slow settle
/// cancelled it: tokens stayed charged, the concurrency slot taken until
/// its lease expired, no ledger row, no failure counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_a_slow_settle_after_an_upstream_500_still_gets_the_refund_the_free_slot_and_one_row(
) {
    let mock = start_mock().await;
    mock.state
        .set_fault(Some(crate::support::mock_upstream::Fault::ServerError));
    let clock = ManualClock::new(NOON);
    let store = SlowSettles::new(&clock, Duration::from_millis(1_500), false);
    let mut c = TestConfig::standard(
        &mock.base_url(),
        16,
        limits().max_concurrent(1).tokens_per_day(100_000),
    );
    c.ledger.batch_interval_ms = Some(100);
    // A slow store, not one that stopped answering: no call times out.
    c.store.timeout_ms = Some(5_000);
    let gw = c.start_with(clock, store.clone()).await;
    gw.state.set_admin_token(Some(TOKEN));

    // The client leaves (its connection closed) once the settle began.
    let request = tokio::spawn(chat_request(&gw, KEY, &hi(16)).send());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.started.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no settle began");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    request.abort();
    assert!(
        request.await.is_err_and(|e| e.is_cancelled()),
        "left before the answer"
    );
    // Long enough for the settle to land, were it still running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.applied.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.settled().await;
    assert_eq!(
        store.applied.load(Ordering::SeqCst),
        1,
        "the settlement ran to completion"
    );
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        0,
        "the failed attempt is refunded"
    );
    assert_eq!(
        gw.t1(BudgetName::MaxConcurrent).await,
        1,
        "its concurrency slot is free"
    );
    assert_eq!(gw.state.settlements.failed(), 0);
    ledger_written(&gw).await;
    let rows = ledger_rows(&gw).await;
    assert_eq!(rows.len(), 1, "exactly one row: {rows:?}");
    assert_eq!(rows[0]["outcome"], "upstream_failed", "{}", rows[0]);
    assert_eq!(rows[0]["charged_tokens"], 0, "{}", rows[0]);
    assert_eq!(rows[0]["attempt"], 1, "{}", rows[0]);
}

/// Fault guarded against: a settlement whose every reply was lost (the first
/// one applied) left no ledger row; it is written with outcome `unknown`
/// and the figures the settlement charges, and counted as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_the_store_never_confirmed_is_a_row_with_outcome_unknown() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(7);
    let clock = ManualClock::new(NOON);
    let store = SlowSettles::new(&clock, Duration::ZERO, true);
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits().tokens_per_day(100_000));
    c.ledger.batch_interval_ms = Some(100);
    c.server.settle_retry_secs = Some(1);
    let gw = c.start_with(clock, store.clone()).await;
    gw.state.set_admin_token(Some(TOKEN));

    let r = chat_request(&gw, KEY, &hi(16))
        .header("x-request-id", "lost-reply-1")
        .send()
        .await
        .expect("gateway");
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    gw.settled().await;
    assert_eq!(gw.state.settlements.failed(), 1, "counted as failed");
    assert!(store.applied.load(Ordering::SeqCst) >= 2, "retried");
    ledger_written(&gw).await;
    let rows = ledger_rows(&gw).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["outcome"], "unknown", "{row}");
    assert_eq!(row["request_id"], "lost-reply-1", "{row}");
    assert_eq!(row["output_tokens"], 7, "{row}");
    assert_eq!(
        row["charged_tokens"].as_u64().unwrap(),
        gw.t1_used(BudgetName::TokensPerDay).await,
        "the row's figures are what the settlement charged (it applied): {row}"
    );
}

/// Each row names the request id the client saw and
/// its attempt; `GET /admin/v1/spend/rows?request_id=` finds every
/// attempt of a request, and a tenant-scoped token only its subtree's rows
/// (a client id is not unique across tenants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_name_the_request_and_attempt_and_a_request_id_is_looked_up_in_the_callers_scope() {
    const ML_KEY: &str = "sk-ledger-ml";
    let mock = start_mock().await;
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits().tokens_per_day(100_000));
    c.ledger.batch_interval_ms = Some(100);
    c.tenants.push(config::RawTenant {
        name: "acme".into(),
        ..Default::default()
    });
    let mut ml = tenant("ml", "k-ml", ML_KEY, limits().tokens_per_day(100_000));
    ml.parent = Some("acme".into());
    c.tenants.push(ml);
    // A model whose first deployment never answers: a request on it is
    // voided there and retried on the mock, a second reservation.
    c.upstreams.push(config::upstream(
        "dead",
        Kind::SelfHosted,
        "http://127.0.0.1:1/v1",
    ));
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        max_output_tokens: Some(4096),
        default_max_output_tokens: Some(16),
        ..config::model("gpt-retried", &["dead", "mock"])
    });
    let gw = c.start().await;
    gw.state.set_admin_token(Some(TOKEN));

    let send = |key: &'static str, model: &'static str, id: Option<&'static str>| {
        let mut req = chat_request(
            &gw,
            key,
            &json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        );
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        async move {
            let r = req.send().await.expect("gateway");
            assert_eq!(r.status(), 200);
            let seen = must_header(&r, "x-request-id");
            let _ = r.bytes().await;
            seen
        }
    };
    assert_eq!(
        send(ML_KEY, "gpt-retried", Some("shared-7")).await,
        "shared-7"
    );
    assert_eq!(send(KEY, "gpt-4o-mini", Some("shared-7")).await, "shared-7");
    let generated = send(KEY, "gpt-4o-mini", None).await;
    ledger_written(&gw).await;

    let rows_of = |token: String, query: String| {
        let gw = &gw;
        async move {
            let (s, v) = admin_call(
                gw,
                reqwest::Method::GET,
                &format!("/admin/v1/spend/rows?{query}"),
                &token,
                None,
            )
            .await;
            assert_eq!(s, 200, "{query}: {v}");
            let mut rows = v["data"].as_array().unwrap().clone();
            rows.sort_by_key(|r| (r["tenant"].to_string(), r["attempt"].as_u64()));
            rows
        }
    };
    let summary = |rows: &[Value]| {
        rows.iter()
            .map(|r| {
                (
                    r["tenant"].as_str().unwrap().to_string(),
                    r["attempt"].as_u64().unwrap(),
                    r["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let row = |t: &str, attempt: u64, outcome: &str| (t.to_string(), attempt, outcome.to_string());

    let all = rows_of(TOKEN.into(), "request_id=shared-7".into()).await;
    assert_eq!(
        summary(&all),
        [
            row("ml", 1, "voided"),
            row("ml", 2, "answered"),
            row("t1", 1, "answered")
        ]
    );
    let ids: BTreeSet<&str> = all
        .iter()
        .map(|r| r["reservation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "each reservation its own id: {all:?}");
    assert!(
        !ids.contains("shared-7"),
        "a client id never names a reservation"
    );
    assert!(all.iter().all(|r| r["request_id"] == "shared-7"));

    // The gateway's own id is the first reservation's.
    let mine = rows_of(TOKEN.into(), format!("request_id={generated}")).await;
    assert_eq!(summary(&mine), [row("t1", 1, "answered")]);
    assert_eq!(mine[0]["reservation_id"], generated.as_str());

    let token = |tenant: &str| {
        let gw = &gw;
        let body = json!({"role": "read", "tenant": tenant});
        async move {
            let (s, v) = admin_call(
                gw,
                reqwest::Method::POST,
                "/admin/v1/admin_tokens",
                TOKEN,
                Some(body),
            )
            .await;
            assert_eq!(s, 201, "{v}");
            v["token"].as_str().unwrap().to_string()
        }
    };
    let acme = token("acme").await;
    assert_eq!(
        summary(&rows_of(acme.clone(), "request_id=shared-7".into()).await),
        [row("ml", 1, "voided"), row("ml", 2, "answered")],
        "acme's token sees its subtree's request only"
    );
    assert_eq!(
        summary(&rows_of(token("t1").await, "request_id=shared-7".into()).await),
        [row("t1", 1, "answered")]
    );
    assert!(
        rows_of(acme.clone(), format!("request_id={generated}"))
            .await
            .is_empty(),
        "another tenant's request is not found"
    );
    let (s, _) = admin_call(
        &gw,
        reqwest::Method::GET,
        "/admin/v1/spend/rows?request_id=shared-7&tenant=t1",
        &acme,
        None,
    )
    .await;
    assert_eq!(s, 403, "naming a tenant outside the subtree");

    let csv = admin_get(
        &gw,
        "/admin/v1/spend/rows?request_id=shared-7&format=csv",
        Some(TOKEN),
    )
    .await
    .text()
    .await
    .unwrap();
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("reservation_id,request_id,attempt,"),
        "{csv}"
    );
    assert_eq!(lines.count(), 3, "{csv}");
}
