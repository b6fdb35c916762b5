//! "Why was this refused?": `GET
//! /admin/v1/refusals/{request_id}` and `budgetgate explain` name the
//! budget that refused a request, the layer that decided, the request's
//! estimate, and what held the budget (holds in flight, units out on
//! leases, read right after the decision); a deny-cache refusal names the
//! store refusal it reused; a tenant-scoped admin token reads its subtree
//! only. Faults guarded against: a refusal named its budget but not what
//! held it, and nothing answered for a request id at all.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::redis_server::RedisServer;
use crate::support::*;

const ROOT: &str = "explain-root-token";
const OTHER_KEY: &str = "sk-other-team";

/// gpt-4o-mini priced $0.15 / $0.60; tenant `acme` (no keys, `usd_per_day`
/// `acme_usd`) over `ml` (key [`KEY`], `ml_limits`); `other` beside them;
/// the control plane on a SQLite file in `dir` (scoped admin tokens).
fn org(mock: &str, acme_usd: &str, ml_limits: Limits, dir: &std::path::Path) -> TestConfig {
    let mut c = TestConfig::standard(mock, 16, ml_limits);
    c.tenant("t1").name = "ml".into();
    c.tenant("ml").parent = Some("acme".into());
    let m = c.model("gpt-4o-mini");
    m.price = Some(price("0.15", "0.60"));
    m.max_output_tokens = Some(200_000);
    c.tenants.push(config::RawTenant {
        name: "acme".into(),
        limits: limits().usd_per_day(acme_usd),
        ..Default::default()
    });
    c.tenants
        .push(config::tenant("other", "k-o", OTHER_KEY, limits().rpm(100)));
    c.control.database_url = Some(format!("sqlite://{}", dir.join("control.db").display()));
    c
}

/// The explain answer for `id` with `token`, once its holds and leases are
/// read (they are filled in a moment after the decision).
async fn explained(gw: &(impl Endpoint + ?Sized), id: &str, token: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (s, v) = admin_call(
            gw,
            reqwest::Method::GET,
            &format!("/admin/v1/refusals/{id}"),
            token,
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        if !v["refusals"][0]["in_flight"].is_null() || Instant::now() > until {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn request_id(r: &reqwest::Response) -> String {
    must_header(r, "x-request-id")
}

/// A refusal by the parent's dollar budget while a sibling request holds
/// most of it names `usd_per_day` of `tenant:acme` and the hold in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_dollar_refusal_names_the_parent_budget_and_the_hold_that_held_it() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    // $0.001 a day; a request of 1,000 output tokens reserves ~$0.0006.
    let gw = org(&mock.base_url(), "0.001", limits().rpm(100), dir.path())
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    mock.state.hold();
    let first = {
        let gw_url = gw.base_url();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{gw_url}/chat/completions"))
                .bearer_auth(KEY)
                .json(&hi(1000))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    while mock.state.held_count() < 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(mock.state.held_count(), 1, "the first request is in flight");
    let r = post_chat(&gw, KEY, &hi(1000)).await;
    assert_eq!(r.status(), 429);
    let id = request_id(&r);
    let v = explained(&gw, &id, ROOT).await;
    mock.state.release();
    assert_eq!(first.await.unwrap().unwrap(), 200);
    let r0 = &v["refusals"][0];
    assert_eq!(v["refusals"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(r0["tenant"], "ml", "{v}");
    assert_eq!(r0["scope"], "tenant:acme", "{v}");
    assert_eq!(r0["budget"], "usd_per_day", "{v}");
    assert_eq!(r0["decided_by"], "store", "{v}");
    assert_eq!(r0["estimate"]["output_cap_tokens"], 1000, "{v}");
    let requested = r0["requested"].as_u64().unwrap();
    assert!(requested >= 600, "{v}");
    // One hold in flight held what the refused request lacked.
    let holds = &r0["in_flight"]["holds"];
    assert_eq!(holds["holds"], 1, "{v}");
    let held = holds["units"].as_u64().unwrap();
    assert!(held >= 600, "the sibling's reservation: {v}");
    assert_eq!(
        r0["available"].as_i64().unwrap() + held as i64,
        1000,
        "what was held and what was left make the day's dollar: {v}"
    );
    assert!(r0["explanation"]
        .as_str()
        .unwrap()
        .contains("1 holds in flight"));
}

/// A refusal by the child's rpm names `rpm` of `tenant:ml`, with its retry
/// time and estimate; the next request, refused by the deny cache without
/// a store call, names the refusal it reused; the budget page links both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_rpm_refusal_is_named_and_a_deny_cache_refusal_names_the_one_it_reused() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = org(&mock.base_url(), "100", limits().rpm(1), dir.path())
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    assert_eq!(post_hi(&gw, KEY).await, 200);
    let by_store = send_hi(&gw, KEY).await;
    assert_eq!(by_store.status(), 429);
    let store_id = request_id(&by_store);
    let by_cache = send_hi(&gw, KEY).await;
    assert_eq!(by_cache.status(), 429);
    let cache_id = request_id(&by_cache);

    let v = explained(&gw, &store_id, ROOT).await;
    let r = &v["refusals"][0];
    assert_eq!(r["scope"], "tenant:ml", "{v}");
    assert_eq!(r["budget"], "rpm", "{v}");
    assert_eq!(r["reason"], "rate_limited", "{v}");
    assert_eq!(r["decided_by"], "store", "{v}");
    assert_eq!(r["requested"], 1, "{v}");
    assert!(r["retry_after_micros"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(r["estimate"]["output_cap_tokens"], 5, "{v}");
    assert!(r["estimate"]["input_tokens"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(r["state"]["limit"], 1, "{v}");
    let store_reservation = r["reservation_id"].as_str().unwrap().to_string();

    let (s, v) = admin_call(
        &gw,
        reqwest::Method::GET,
        &format!("/admin/v1/refusals/{cache_id}"),
        ROOT,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let r = &v["refusals"][0];
    assert_eq!(r["decided_by"], "deny_cache", "{v}");
    assert_eq!(r["budget"], "rpm", "{v}");
    assert_eq!(r["reused"]["reservation_id"], store_reservation, "{v}");
    assert_eq!(r["reused"]["request_id"], store_id.as_str(), "{v}");
    assert!(r["reused"]["age_micros"].is_u64(), "{v}");

    // The budget page links each recent refusal to its explanation.
    let (s, page) = admin_call(&gw, reqwest::Method::GET, "/admin/v1/budgets", ROOT, None).await;
    assert_eq!(s, 200);
    let ml = page["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ml")
        .unwrap();
    let links: Vec<&str> = ml["recent_refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["explain"].as_str().unwrap())
        .collect();
    assert_eq!(
        links,
        vec![
            format!("/admin/v1/refusals/{cache_id}"),
            format!("/admin/v1/refusals/{store_id}"),
        ]
    );
}

/// A token scoped to `acme` reads its child's refusal; one scoped to
/// `other` gets 404 for it, the answer to an id refused nowhere (a 403
/// would tell it another tenant's request ids). The CLI prints the same
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_reads_its_subtree_only_and_the_cli_explains() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = org(&mock.base_url(), "100", limits().rpm(1), dir.path())
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let token = |tenant: &'static str| {
        let gw = &gw;
        async move {
            let (s, v) = admin_call(
                gw,
                reqwest::Method::POST,
                "/admin/v1/admin_tokens",
                ROOT,
                Some(json!({"role": "read", "tenant": tenant})),
            )
            .await;
            assert_eq!(s, 201, "{v}");
            v["token"].as_str().unwrap().to_string()
        }
    };
    let (acme, other) = (token("acme").await, token("other").await);
    assert_eq!(post_hi(&gw, KEY).await, 200);
    let refused = send_hi(&gw, KEY).await;
    assert_eq!(refused.status(), 429);
    let id = request_id(&refused);
    let path = format!("/admin/v1/refusals/{id}");
    let get = |t: String| {
        let (gw, path) = (&gw, path.clone());
        async move { admin_call(gw, reqwest::Method::GET, &path, &t, None).await }
    };
    let (s, v) = get(acme).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["refusals"][0]["budget"], "rpm");
    let (s, v) = get(other.clone()).await;
    assert_eq!(s, 404, "{v}");
    assert!(!v.to_string().contains("\"rpm\""), "nothing leaks: {v}");
    for token in [ROOT.to_string(), other.clone()] {
        let (s, unknown) = admin_call(
            &gw,
            reqwest::Method::GET,
            "/admin/v1/refusals/never-refused",
            &token,
            None,
        )
        .await;
        assert_eq!(s, 404);
        assert_eq!(
            unknown.to_string().replace("never-refused", &id),
            v.to_string(),
            "another tenant's id and an unknown one are answered alike"
        );
    }

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["explain", "--url", &gw.root_url(), &id])
        .env("BUDGETGATE_ADMIN_TOKEN", ROOT)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["refusals"][0]["scope"], "tenant:ml");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["explain", "--url", &gw.root_url(), &id])
        .env("BUDGETGATE_ADMIN_TOKEN", &other)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404"),
        "{out:?}"
    );
}

const WEB_KEY: &str = "sk-web-team";

/// A deny-cache refusal of `ml` that reused the store's refusal of its
/// sibling `web` (their parent's rpm) names that refusal to a token that
/// sees `web` (the root's, one scoped to `acme`), and to one scoped to `ml`
/// only its age: neither its reservation nor its request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_refusal_of_another_tenant_is_named_only_to_a_token_that_sees_it() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = org(&mock.base_url(), "100", limits().rpm(100), dir.path());
    c.tenant("acme").limits = limits().rpm(1);
    let mut web = config::tenant("web", "k-w", WEB_KEY, limits().rpm(100));
    web.parent = Some("acme".into());
    c.tenants.push(web);
    let gw = c.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let mut tokens = Vec::new();
    for tenant in ["acme", "ml"] {
        let (s, v) = admin_call(
            &gw,
            reqwest::Method::POST,
            "/admin/v1/admin_tokens",
            ROOT,
            Some(json!({"role": "read", "tenant": tenant})),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        tokens.push(v["token"].as_str().unwrap().to_string());
    }
    let (acme, ml) = (tokens[0].clone(), tokens[1].clone());
    assert_eq!(post_hi(&gw, WEB_KEY).await, 200);
    let by_store = send_hi(&gw, WEB_KEY).await;
    assert_eq!(by_store.status(), 429);
    let store_id = request_id(&by_store);
    let by_cache = send_hi(&gw, KEY).await;
    assert_eq!(by_cache.status(), 429);
    let cache_id = request_id(&by_cache);
    let get = |id: String, token: String| {
        let gw = &gw;
        async move {
            let path = format!("/admin/v1/refusals/{id}");
            admin_call(gw, reqwest::Method::GET, &path, &token, None).await
        }
    };

    let (s, v) = get(store_id.clone(), ROOT.into()).await;
    assert_eq!(s, 200, "{v}");
    let reservation = v["refusals"][0]["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    for token in [ROOT.to_string(), acme] {
        let (s, v) = get(cache_id.clone(), token).await;
        assert_eq!(s, 200, "{v}");
        let r = &v["refusals"][0];
        assert_eq!(r["decided_by"], "deny_cache", "{v}");
        assert_eq!(r["scope"], "tenant:acme", "{v}");
        assert_eq!(r["reused"]["tenant"], "web", "{v}");
        assert_eq!(r["reused"]["request_id"], store_id.as_str(), "{v}");
        assert_eq!(r["reused"]["reservation_id"], reservation.as_str(), "{v}");
        assert!(
            r["explanation"].as_str().unwrap().contains(&reservation),
            "{v}"
        );
    }
    let (s, v) = get(cache_id.clone(), ml.clone()).await;
    assert_eq!(s, 200, "its own refusal: {v}");
    let r = &v["refusals"][0];
    assert_eq!(r["decided_by"], "deny_cache", "{v}");
    assert!(r["reused"]["age_micros"].is_u64(), "{v}");
    let text = v.to_string();
    assert!(
        !text.contains(&reservation) && !text.contains(&store_id) && !text.contains("web"),
        "the sibling's refusal is not named: {v}"
    );
    let (s, _) = get(store_id, ml).await;
    assert_eq!(s, 404, "the sibling's refusal itself");
}

const LEASE_ADMIN: &str = "explain-lease-admin";
const DEPLOYMENT_TPM: u64 = 60_000;
const DEPLOYMENT_BURST: u64 = 100_000;

/// Two gateways on one Redis: the first, driven hot, takes quota leases of
/// the deployment's `tpm`; a request to the second that needs more than the
/// store has left is refused by the deployment's `tpm`, and its
/// explanation names the units out on leases, far more than its holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_tpm_refusal_names_the_leases_out_that_held_it() {
    let redis = RedisServer::start();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits().rpm(1_000_000))
        .redis_fleet(&redis.url(), "bgexplain");
    c.upstreams[0].limits = limits().tpm(DEPLOYMENT_TPM).tpm_burst(DEPLOYMENT_BURST);
    c.tenants.push(config::tenant(
        "other",
        "k-o",
        OTHER_KEY,
        limits().rpm(1_000_000),
    ));
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        min_rate: Some(5),
        max_fraction: Some(1.0),
        report_interval_ms: Some(1000),
        ..Default::default()
    });
    c.model("gpt-4o-mini").max_output_tokens = Some(200_000);
    c.server.admin_token_env = Some("EXPLAIN_ADMIN".into());
    let cfg = c.write(dir.path());
    let env = [("EXPLAIN_ADMIN", LEASE_ADMIN)];
    let hot = GatewayProcess::start(&cfg, &env).await;
    let cold = GatewayProcess::start(&cfg, &env).await;
    // The first gateway's demand: 4 clients, a request each ~20 ms, each
    // reserving ~30 tokens: hot at once, its leases sized to a second of
    // it (a few thousand tokens); the deployment refills a third of that,
    // so its bucket never returns to full while a lease is out.
    let until = Instant::now() + Duration::from_secs(6);
    let drive = {
        let base = hot.base_url();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let (http, base) = (http.clone(), base.clone());
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < until {
                        let _ = http
                            .post(format!("{base}/chat/completions"))
                            .bearer_auth(KEY)
                            .json(&hi(20))
                            .send()
                            .await;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        })
    };
    // Until a lease of the deployment's tpm is out, then a request larger
    // than what the store can keep beside it (its capacity less the lease)
    // but within the capacity.
    let mut refused = None;
    let mut tried = 0;
    while refused.is_none() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (_, page) = admin_call(
            &cold,
            reqwest::Method::GET,
            "/admin/v1/budgets",
            LEASE_ADMIN,
            None,
        )
        .await;
        let leased = page["upstreams"][0]["budgets"]
            .as_array()
            .and_then(|b| b.iter().find(|b| b["budget"] == "tpm"))
            .and_then(|b| b["leased"]["units"].as_u64())
            .unwrap_or(0);
        if leased < 100 {
            continue;
        }
        tried += 1;
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", cold.base_url()))
            .bearer_auth(OTHER_KEY)
            .json(&hi(DEPLOYMENT_BURST - leased / 2))
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            refused = Some(must_header(&r, "x-request-id"));
        }
    }
    let id = refused.unwrap_or_else(|| panic!("no refusal in {tried} tries"));
    let v = explained(&cold, &id, LEASE_ADMIN).await;
    drive.await.unwrap();
    println!("explained: {v}");
    let r = &v["refusals"][0];
    assert_eq!(r["tenant"], "other", "{v}");
    assert_eq!(r["scope"], "upstream:mock", "{v}");
    assert_eq!(r["budget"], "tpm", "{v}");
    assert_eq!(r["decided_by"], "store", "{v}");
    let f = &r["in_flight"];
    let leased = f["leases"]["units"].as_u64().unwrap_or(0);
    let held = f["holds"]["units"].as_u64().unwrap_or(u64::MAX);
    assert!(f["leases"]["leases"].as_u64().unwrap() >= 1, "{v}");
    assert!(
        leased > held,
        "mostly held by leases out ({leased} leased, {held} in holds): {v}"
    );
    assert!(f["said"].as_str().unwrap().starts_with("read "), "{v}");
    // The cold gateway holds no lease of it: the units are the other's.
    assert!(f["leases"]["here"].is_null(), "{v}");
}

/// Calls of `command` Redis counted since its stats were reset.
fn redis_calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.cli(&["info", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

/// Refusals read nothing of the store beyond their decision: 40 refusals
/// by a concurrency limit, in a database of 200,000 unrelated keys, make
/// no `SCAN` (each used to start a walk of every key of the database);
/// asking why one was refused reads what held the budget then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_make_no_scan_and_the_explain_route_still_names_the_hold() {
    let redis = RedisServer::start();
    let unrelated = redis.cli(&[
        "eval",
        "for i = 1, 200000 do redis.call('set', 'unrelated:' .. i, 'x') end return redis.call('dbsize')",
        "0",
    ]);
    assert_eq!(unrelated.trim(), "200000");
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(
        &mock.base_url(),
        16,
        limits().max_concurrent(1).rpm(1_000_000),
    )
    .redis_fleet(&redis.url(), "bgexplainscan");
    c.store.lease = Some(budgetgate::config::raw::RawLease {
        mode: Some("off".into()),
        ..Default::default()
    });
    c.server.admin_token_env = Some("EXPLAIN_ADMIN".into());
    let gw = GatewayProcess::start(&c.write(dir.path()), &[("EXPLAIN_ADMIN", ROOT)]).await;
    mock.state.hold();
    let first = {
        let base = gw.base_url();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/chat/completions"))
                .bearer_auth(KEY)
                .json(&hi(10))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    while mock.state.held_count() < 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        mock.state.held_count(),
        1,
        "the first request holds the slot"
    );
    redis.cli(&["config", "resetstat"]);
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..40 {
        let r = http
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(KEY)
            .json(&hi(10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        ids.push(request_id(&r));
    }
    // A walk started by a refusal would run now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (scans, decisions) = (redis_calls(&redis, "scan"), redis_calls(&redis, "evalsha"));
    println!("40 refusals: {scans} SCAN, {decisions} EVALSHA calls");
    assert_eq!(scans, 0, "no refusal walks the store's keys");
    let v = explained(&gw, &ids[39], ROOT).await;
    mock.state.release();
    assert_eq!(first.await.unwrap().unwrap(), 200);
    println!("explained: {v}");
    let r0 = &v["refusals"][0];
    assert_eq!(r0["budget"], "max_concurrent", "{v}");
    assert_eq!(r0["in_flight"]["holds"]["holds"], 1, "{v}");
    assert!(
        r0["explanation"]
            .as_str()
            .unwrap()
            .contains("1 holds in flight"),
        "{v}"
    );
    assert!(redis_calls(&redis, "scan") > 0, "read when asked");
    // Kept with the record: asking again reads nothing more.
    let scans = redis_calls(&redis, "scan");
    let again = explained(&gw, &ids[39], ROOT).await;
    assert_eq!(again["refusals"][0]["in_flight"], r0["in_flight"]);
    assert_eq!(redis_calls(&redis, "scan"), scans);
}
