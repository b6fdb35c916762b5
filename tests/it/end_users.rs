//! Per-end-user budgets through the gateway: each end
//! user of a tenant has budgets of its own; ids come from the
//! `x-budgetgate-end-user` header, then `safety_identifier`, then `user`
//! (OpenAI bodies) or `metadata.user_id` (Anthropic bodies); disagreeing,
//! oversized and missing-but-required ids are refused with 400; ids appear
//! only as their keyed hash; per-scope state does not outlive its windows.

use std::collections::BTreeSet;

use budgetgate::budget::{BudgetName, Scope};
use serde_json::{json, Value};

use crate::support::*;

const HEADER: &str = "x-budgetgate-end-user";

/// The standard config, tenant `t1` limiting each end user to `per_user`.
fn config(mock: &str, per_user: Limits) -> TestConfig {
    end_user_key();
    let mut c = TestConfig::standard(mock, 100, limits().rpm(100_000));
    c.tenant("t1").end_user_limits = per_user;
    c
}

async fn as_user(
    gw: &(impl Endpoint + ?Sized),
    header_id: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let mut req = chat_request(gw, KEY, body);
    if let Some(id) = header_id {
        req = req.header(HEADER, id);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn with_user(field: &str, id: &str) -> Value {
    let mut b = hi(5);
    b[field] = json!(id);
    b
}

/// Fault: every end user of a tenant shared one budget, so one user's
/// traffic refused the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_end_users_of_one_tenant_have_independent_budgets() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url(), limits().rpm(2)).start().await;
    independent_budgets(&gw).await;
    let s = gw.end_user("t1", "alice");
    assert_eq!(gw.remaining(s, BudgetName::Rpm).await, 0);
    assert_eq!(
        gw.remaining(gw.end_user("t1", "bob"), BudgetName::Rpm)
            .await,
        1
    );
    // The header went nowhere upstream; the body field went as sent.
    for r in mock.state.requests() {
        assert!(r.header(HEADER).is_none(), "{:?}", r.headers);
    }
}

/// The same on a Redis Cluster: every key of the reservation (tenant, key,
/// end user, deployment) is in the budget domain's slot, or the script
/// would fail with CROSSSLOT; the refusal's scope comes back from Lua.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_user_budgets_work_on_a_redis_cluster() {
    let mock = start_mock().await;
    let cluster = redis_server::shared_cluster();
    let mut c = config(&mock.base_url(), limits().rpm(2)).redis(&cluster.url());
    c.store.domain = Some(format!("endusers{}", std::process::id()));
    c.store.timeout_ms = Some(2000);
    let gw = c.start().await;
    independent_budgets(&gw).await;
}

/// The same in the `tenant` layout: the tenant's tree (tenant, key, end
/// users) in its own domain and the deployment in its group's, each
/// request reserving in both (tenant first), refusals coming back from
/// the tenant domain's script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_user_budgets_work_in_the_tenant_layout_on_a_redis_cluster() {
    let mock = start_mock().await;
    let cluster = redis_server::shared_cluster();
    let mut c = config(&mock.base_url(), limits().rpm(2)).redis(&cluster.url());
    c.store.domain = Some(format!("endusert{}", std::process::id()));
    c.store.layout = Some("tenant".into());
    c.store.timeout_ms = Some(2000);
    // A deployment budget, so each request reserves in both domains.
    c.upstream("mock").limits = limits().rpm(1000);
    let gw = c.start().await;
    independent_budgets(&gw).await;
    // Every key of the fleet is in a tenant tree's or a deployment group's domain.
    let domain = format!("endusert{}", std::process::id());
    let mut tags = BTreeSet::new();
    for url in cluster.node_urls() {
        let mut conn = redis::Client::open(url)
            .expect("node url")
            .get_multiplexed_async_connection()
            .await
            .expect("node");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*{{{domain}.*"))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        for k in keys {
            let tag = budgetgate::budget::keys::hash_tag(&k)
                .unwrap_or("")
                .to_string();
            tags.insert(tag);
        }
    }
    assert!(tags.contains(&format!("{domain}.t.t1")), "{tags:?}");
    assert!(
        tags.iter().any(|t| t.starts_with(&format!("{domain}.d."))),
        "{tags:?}"
    );
}

async fn independent_budgets(gw: &Gateway) {
    // alice by header, by `user`, by `safety_identifier`: one end user.
    assert_eq!(as_user(gw, Some("alice"), &hi(5)).await.0, 200);
    assert_eq!(as_user(gw, None, &with_user("user", "alice")).await.0, 200);
    let (status, v) = as_user(gw, None, &with_user("safety_identifier", "alice")).await;
    assert_eq!(status, 429, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    let scope = gw.end_user("t1", "alice").to_string();
    assert!(
        message.contains(&format!("end user budget {scope} (rpm)")),
        "{message}"
    );
    assert!(!message.contains("alice"), "{message}");
    // bob has his own budget.
    assert_eq!(as_user(gw, Some("bob"), &hi(5)).await.0, 200);
    // A request without an end user is not charged to any.
    assert_eq!(as_user(gw, None, &hi(5)).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_requiring_an_end_user_refuses_a_request_without_one() {
    let mock = start_mock().await;
    let mut c = config(&mock.base_url(), limits());
    c.tenant("t1").end_user_required = Some(true);
    let gw = c.start().await;
    let (status, v) = as_user(&gw, None, &hi(5)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains(HEADER));
    // An empty id is no id.
    assert_eq!(as_user(&gw, None, &with_user("user", "")).await.0, 400);
    assert_eq!(as_user(&gw, None, &with_user("user", "u1")).await.0, 200);
    assert_eq!(mock.state.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_of_ten_thousand_characters_is_refused_naming_its_source() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url(), limits().rpm(10)).start().await;
    let long = "x".repeat(10_000);
    let (status, v) = as_user(&gw, None, &with_user("user", &long)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "user");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("10000 bytes"));
    let (status, v) = as_user(&gw, Some(&long), &hi(5)).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-budgetgate-end-user header is 10000 bytes"));
    // 256 bytes pass, 257 do not.
    assert_eq!(
        as_user(&gw, None, &with_user("safety_identifier", &"y".repeat(256)))
            .await
            .0,
        200
    );
    assert_eq!(
        as_user(&gw, None, &with_user("safety_identifier", &"y".repeat(257)))
            .await
            .0,
        400
    );
    // Two sources naming different users.
    let (status, v) = as_user(&gw, Some("a"), &with_user("user", "b")).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("name different end users"));
    assert_eq!(mock.state.request_count(), 1);
}

/// Ids holding hash-tag braces and line breaks: each is its own end user,
/// counted under its hash (no brace reaches a key: the reservation works,
/// on a Redis Cluster too, above), and no log line carries the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_with_braces_and_newlines_stay_out_of_keys_and_logs() {
    let mock = start_mock().await;
    let c = config(&mock.base_url(), limits().rpm(1));
    let dir = tempfile::tempdir().unwrap();
    let gw = GatewayProcess::start(&c.write(dir.path()), &[]).await;
    let ids = ["{tag}", "}{", "line\nbreak", "{x}\n{y}", "plain"];
    for id in ids {
        let (status, v) = as_user(&gw, None, &with_user("user", id)).await;
        assert_eq!(status, 200, "{id:?}: {v}");
        let (status, v) = as_user(&gw, None, &with_user("user", id)).await;
        assert_eq!(status, 429, "{id:?}: its own budget of 1 request: {v}");
    }
    let policy = c.policy();
    let key = policy.end_user_key.as_ref().unwrap();
    let finished = gw.wait_log("request finished", ids.len()).await;
    let refused = gw.wait_log("request refused", ids.len()).await;
    let logged: BTreeSet<String> = finished
        .iter()
        .chain(&refused)
        .map(|l| {
            l.pointer("/fields/end_user")
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect();
    let hashes: BTreeSet<String> = ids.iter().map(|id| key.hash(id.as_bytes())).collect();
    assert_eq!(logged, hashes);
    let all = gw.dump_logs();
    for id in ["{tag}", "}{", "line\\nbreak", "line\nbreak", "{x}"] {
        assert!(!all.contains(id), "{id:?} is in the logs");
    }
    let text = reqwest::get(format!("{}/metrics", gw.root_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for h in &hashes {
        assert!(!text.contains(h.as_str()), "an end user in the metrics");
    }
}

/// 10,000 distinct end users, `workers` at a time, each sending one request.
async fn ten_thousand_end_users(gw: &(impl Endpoint + ?Sized)) {
    let (users, workers) = (10_000, 16);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let url = gw.base_url();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for i in (w..users).step_by(workers) {
                let r = client
                    .post(format!("{url}/chat/completions"))
                    .bearer_auth(KEY)
                    .header(HEADER, format!("user-{i}"))
                    .json(&hi(5))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn per_user() -> Limits {
    limits()
        .rpm(10)
        .tpm(10_000)
        .tokens_per_day(100_000)
        .max_concurrent(2)
}

/// Fault: per-end-user state (bucket levels, quota counters, slot sets)
/// stayed in the memory store forever, so every new end user cost memory
/// for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_end_users_leave_no_state_behind_after_an_idle_window() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url(), per_user()).start().await;
    // One end user first: the baseline is the tenant's state and one user's.
    assert_eq!(as_user(&gw, Some("warm-up"), &hi(5)).await.0, 200);
    gw.all_settled().await;
    let baseline = gw.memory().budget_entries();
    ten_thousand_end_users(&gw).await;
    gw.all_settled().await;
    let loaded = gw.memory().budget_entries();
    assert!(
        loaded >= baseline + 10_000,
        "{loaded} entries after 10,000 end users"
    );
    // One idle window: the day ends (and every bucket refills).
    gw.clock.advance(86_400_000_000 + 60_000_000);
    assert_eq!(as_user(&gw, Some("warm-up"), &hi(5)).await.0, 200);
    gw.all_settled().await;
    assert_eq!(gw.memory().budget_entries(), baseline);
}

/// Fault: a metric series per end user, so `/metrics` grew with every new
/// end user. (A process of its own: the in-process gateways of the other
/// tests share one metrics registry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_end_users_leave_the_metrics_unchanged_in_size() {
    let mock = start_mock().await;
    let c = config(&mock.base_url(), per_user());
    let dir = tempfile::tempdir().unwrap();
    let gw = GatewayProcess::start(&c.write(dir.path()), &[("RUST_LOG", "warn")]).await;
    let series = || async {
        let text = reqwest::get(format!("{}/metrics", gw.root_url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                l.rsplit_once(' ')
                    .map_or(l, |(series, _)| series)
                    .to_string()
            })
            .collect::<BTreeSet<String>>()
    };
    // Two end users first: every series a request records exists after them.
    assert_eq!(as_user(&gw, Some("warm-up"), &hi(5)).await.0, 200);
    assert_eq!(as_user(&gw, Some("warm-up-2"), &hi(5)).await.0, 200);
    let before = series().await;
    ten_thousand_end_users(&gw).await;
    let after = series().await;
    let new: Vec<&String> = after.difference(&before).collect();
    assert!(new.is_empty(), "series added by end users: {new:?}");
    assert_eq!(after.len(), before.len());
}

/// Dollar budgets on the new scope kinds, all together:
/// each end user of `ml` may spend $0.002 a day, their organisation
/// `acme` $0.004. Every figure comes from the price arithmetic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_users_and_an_organisation_hold_dollar_budgets_of_their_own() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(1000);
    end_user_key();
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits());
    let m = c.model("gpt-4o-mini");
    m.price = Some(price("0.15", "0.60"));
    c.tenants.push(config::RawTenant {
        name: "acme-usd".into(),
        limits: limits().usd_per_day("0.004"),
        ..Default::default()
    });
    let mut ml = config::tenant("ml-usd", "k", "sk-ml-usd", limits());
    ml.parent = Some("acme-usd".into());
    ml.end_user_limits = limits().usd_per_day("0.002");
    c.tenants.push(ml);
    let gw = c.start().await;
    let body = hi(1000);
    // µ$: ceil((input × 0.15 + 1000 × 0.60) / 10^6 × 10^6).
    let cost = (chat_input_tokens(&body) * 150_000 + 1000 * 600_000).div_ceil(1_000_000);
    let per_user = 2_000 / cost;
    let send = |user: &'static str| {
        chat_request(&gw, "sk-ml-usd", &body)
            .header(HEADER, user)
            .send()
    };
    for _ in 0..per_user {
        assert_eq!(send("alice").await.unwrap().status(), 200);
    }
    let r = send("alice").await.unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    let alice = gw.end_user("ml-usd", "alice");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("end user budget {alice} (usd_per_day)")),
        "{message}"
    );
    gw.settled().await;
    assert_eq!(gw.used(alice, BudgetName::UsdPerDay).await, per_user * cost);
    // bob has his own $0.002, until the organisation's $0.004 runs out.
    let org_fits = 4_000 / cost;
    for _ in per_user..org_fits {
        assert_eq!(send("bob").await.unwrap().status(), 200);
    }
    let (status, v) = as_user_key(&gw, "sk-ml-usd", "carol", &body).await;
    assert_eq!(status, 429, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tenant:acme-usd (usd_per_day) for tenant ml-usd, child of acme-usd"));
    gw.settled().await;
    assert_eq!(
        gw.used(Scope::Tenant("acme-usd".into()), BudgetName::UsdPerDay)
            .await,
        org_fits * cost
    );
}

async fn as_user_key(gw: &Gateway, key: &str, user: &str, body: &Value) -> (u16, Value) {
    let r = chat_request(gw, key, body)
        .header(HEADER, user)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Fault: Claude Code puts a new session id in `metadata.user_id` every
/// session, so under `end_user_limits` each session was a new end user,
/// and naming the person with `x-budgetgate-end-user` (through
/// `ANTHROPIC_CUSTOM_HEADERS`) was refused as a disagreement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_names_the_person_across_claude_code_sessions() {
    end_user_key();
    let mock = start_mock().await;
    let mut c = TestConfig::new();
    c.upstreams.push(config::upstream(
        "claude",
        Kind::Anthropic,
        &mock.root_url(),
    ));
    c.models.push(config::RawModel {
        max_output_tokens: Some(64000),
        ..config::model("claude-*", &["claude"])
    });
    let mut t = config::tenant("t1", "k1", KEY, limits().rpm(1000).tpm(1_000_000));
    t.end_user_limits = limits().rpm(10);
    c.tenants.push(t);
    let gw = c.start().await;
    for session in ["7b3e16a4-0f5c", "91aa02c1-55de"] {
        let user_id =
            format!(r#"{{"device_id":"4a0d","account_uuid":"","session_id":"{session}"}}"#);
        let r = reqwest::Client::new()
            .post(format!("{}/messages", gw.base_url()))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .header(HEADER, "alice")
            .json(&json!({"model": "claude-opus-4-8", "max_tokens": 32,
                "metadata": {"user_id": user_id},
                "messages": [{"role": "user", "content": "say hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    gw.all_settled().await;
    let alice = gw.end_user("t1", "alice");
    assert_eq!(
        gw.remaining(alice, BudgetName::Rpm).await,
        8,
        "both charged to alice"
    );
    // `metadata.user_id` went upstream as the client sent it; the header did not.
    for (r, session) in mock
        .state
        .requests()
        .iter()
        .zip(["7b3e16a4-0f5c", "91aa02c1-55de"])
    {
        assert!(r.body["metadata"]["user_id"]
            .as_str()
            .unwrap()
            .contains(session));
        assert!(r.header(HEADER).is_none());
    }
}
