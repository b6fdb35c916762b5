//! The control plane on its SQLite default: tenants and keys
//! through the admin API, one validator with the config file, names kept
//! literal, a name in both places quarantined, keys surviving a restart,
//! roles and tenant scopes, the audit trail, the OpenAPI document, and a
//! key holder's own budget.

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::*;
use budgetgate::config::reload::{ReloadOutcome, Trigger};
use budgetgate::config::Policy;

pub const ROOT: &str = "root-admin-token";

/// The standard config on the SQLite database at `db` (a file the test owns).
pub fn config(mock: &str, db: &std::path::Path) -> TestConfig {
    let mut c = TestConfig::standard(mock, 50, limits().tpm(1_000_000));
    c.control.database_url = Some(format!("sqlite://{}", db.display()));
    c
}

pub async fn post(gw: &Gateway, path: &str, body: Value) -> (u16, Value) {
    admin_call(gw, Method::POST, path, ROOT, Some(body)).await
}

/// Creates an admin token of `body` (`role`, optional `tenant`) with the
/// root token; returns the token.
pub async fn admin_token(gw: &Gateway, body: Value) -> String {
    let (s, v) = post(gw, "/admin/v1/admin_tokens", body).await;
    assert_eq!(s, 201, "{v}");
    v["token"].as_str().unwrap().to_string()
}

/// Creates key `id` of `tenant` through the API; returns its secret.
pub async fn new_key(gw: &(impl Endpoint + ?Sized), tenant: &str, id: &str) -> String {
    let (s, v) = admin_call(
        gw,
        Method::POST,
        &format!("/admin/v1/tenants/{tenant}/keys"),
        ROOT,
        Some(json!({ "id": id })),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v["secret"]
        .as_str()
        .expect("the secret is in the answer")
        .to_string()
}

#[tokio::test]
async fn a_key_created_through_the_api_answers_200_is_refused_once_revoked_and_survives_a_restart()
{
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&mock.base_url(), &dir.path().join("control.db"));
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants",
        json!({"name": "ml", "limits": {"tpm": 50000}}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["source"], "api");
    let secret = new_key(&gw, "ml", "laptop").await;
    let kept = new_key(&gw, "ml", "ci").await;
    assert!(
        secret.starts_with("sk-bg-") && secret.len() > 60,
        "{secret}"
    );
    assert_eq!(post_hi(&gw, &secret).await, 200);

    // The secret is shown once: reading the key never shows it or its digest.
    let (s, v) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/tenants/ml/keys/laptop",
        ROOT,
        None,
    )
    .await;
    assert_eq!(s, 200);
    let text = v.to_string();
    assert!(
        !text.contains(&secret) && !text.contains(&budgetgate::config::hash_key(&secret)),
        "{text}"
    );

    let (s, _) = post(&gw, "/admin/v1/tenants/ml/keys/laptop/revoke", json!({})).await;
    assert_eq!(s, 200);
    assert_eq!(post_hi(&gw, &secret).await, 401, "revoked");
    drop(gw);

    // A restart on the same file: the tenant and the live key are back.
    let gw = cfg.start().await;
    assert_eq!(post_hi(&gw, &kept).await, 200, "created before the restart");
    assert_eq!(post_hi(&gw, &secret).await, 401, "still revoked");
}

#[tokio::test]
async fn an_expired_key_and_a_rotated_secret_after_its_overlap_are_refused() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let now = NOON / 1_000_000;
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants/t1/keys",
        json!({"id": "temp", "expires_at": now + 60, "allowed_models": ["gpt-4o-mini"]}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let temp = v["secret"].as_str().unwrap().to_string();
    assert_eq!(post_hi(&gw, &temp).await, 200);
    let emb = json!({"model": "text-embedding-3-small", "input": "hi"});
    let r = reqwest::Client::new()
        .post(format!("{}/embeddings", gw.base_url()))
        .bearer_auth(&temp)
        .json(&emb)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "a model the key is not allowed");
    gw.clock.advance(60_000_000);
    assert_eq!(post_hi(&gw, &temp).await, 401, "expired");

    let old = new_key(&gw, "t1", "svc").await;
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants/t1/keys/svc/rotate",
        json!({"overlap_secs": 30}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let new = v["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(post_hi(&gw, &old).await, 200, "inside the overlap");
    assert_eq!(post_hi(&gw, &new).await, 200);
    gw.clock.advance(30_000_000);
    assert_eq!(post_hi(&gw, &old).await, 401, "after the overlap");
    assert_eq!(post_hi(&gw, &new).await, 200);
}

/// What the config file says about `tenants[1]` when its tpm is `tpm`,
/// without the path's `tenants[1].` prefix.
fn file_message(mock: &str, tpm: i64) -> String {
    file_message_written(mock, &tpm.to_string())
}

/// The file's message for a tenant whose `tpm` is written as `tpm`.
fn file_message_written(mock: &str, tpm: &str) -> String {
    let mut c = TestConfig::standard(mock, 50, limits());
    let mut t = config::tenant("ml", "k", "sk-other", limits());
    t.limits.tpm = Some(123_454_321);
    c.tenants.push(t);
    let text = c.render().replace("123454321", tpm);
    let e = Policy::from_toml(&text).expect_err("refused");
    e.0[0]
        .strip_prefix("tenants[1].")
        .expect("the tenant's path")
        .to_string()
}

#[tokio::test]
async fn a_bad_value_gets_the_config_files_message_with_the_fields_path() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants",
        json!({"name": "ml", "limits": {"tpm": -5}}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "limits.tpm");
    assert_eq!(v["error"]["message"], file_message(&mock.base_url(), -5));

    // 10^20 fits neither the file's integers nor JSON's: both clamp it and
    // give the validator's range message, the same text.
    let body = r#"{"name": "ml", "limits": {"tpm": 100000000000000000000}}"#;
    let r = reqwest::Client::new()
        .post(format!("{}/admin/v1/tenants", gw.root_url()))
        .bearer_auth(ROOT)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        file_message_written(&mock.base_url(), "100000000000000000000")
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("limits.tpm: must be ≤"),
        "{v}"
    );

    // A key's limits go through the same validator.
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants/t1/keys",
        json!({"limits": {"tpm_burst": 10}}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["message"], "limits.tpm_burst: needs tpm");
    let (s, _) = admin_call(&gw, Method::GET, "/admin/v1/tenants/ml", ROOT, None).await;
    assert_eq!(s, 404, "nothing was written");
}

#[tokio::test]
async fn a_tenant_scoped_token_reads_the_budgets_and_spend_of_its_subtree_only() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for (name, parent) in [("acme", None), ("ml", Some("acme")), ("other", None)] {
        let (s, v) = post(
            &gw,
            "/admin/v1/tenants",
            json!({"name": name, "parent": parent, "limits": {"tpm": 5_000}}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    let scoped = admin_token(&gw, json!({"role": "read", "tenant": "acme"})).await;

    // The budget page's list: its subtree, no shared deployments.
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/budgets", &scoped, None).await;
    assert_eq!(s, 200, "{v}");
    let mut names: Vec<&str> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["acme", "ml"], "{v}");
    assert_eq!(v["upstreams"], json!([]), "{v}");
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/budgets", ROOT, None).await;
    assert_eq!(s, 200);
    assert!(
        v["tenants"].as_array().unwrap().len() > 3,
        "the root sees all"
    );
    assert!(!v["upstreams"].as_array().unwrap().is_empty());

    for (path, want) in [
        ("/admin/v1/tenants/ml/budgets", 200),
        ("/admin/v1/tenants/acme/budgets", 200),
        ("/admin/v1/tenants/other/budgets", 403),
        ("/admin/v1/tenants/nobody/budgets", 403),
        ("/admin/v1/policy", 403),
        ("/admin/v1/spend?tenant=other", 403),
        ("/admin/v1/spend/rows?tenant=other", 403),
    ] {
        let (s, v) = admin_call(&gw, Method::GET, path, &scoped, None).await;
        assert_eq!(s, want, "{path}: {v}");
    }
    let upstream = gw.state.policy.load().upstreams[0].name.clone();
    let (s, v) = admin_call(
        &gw,
        Method::GET,
        &format!("/admin/v1/upstreams/{upstream}/budgets"),
        &scoped,
        None,
    )
    .await;
    assert_eq!(s, 403, "{v}");
    // Spend without `tenant` is its own subtree's; within it, allowed.
    for path in [
        "/admin/v1/spend",
        "/admin/v1/spend?tenant=ml",
        "/admin/v1/spend/rows",
    ] {
        let (s, v) = admin_call(&gw, Method::GET, path, &scoped, None).await;
        assert!(s != 401 && s != 403, "{path}: {s} {v}");
    }
    let (s, _) = admin_call(&gw, Method::GET, "/admin/v1/budgets", "not-a-token", None).await;
    assert_eq!(s, 401);

    // A token scoped to a tenant ends with it: the name, reused, is not its.
    let (s, v) = post(&gw, "/admin/v1/tenants", json!({"name": "solo"})).await;
    assert_eq!(s, 201, "{v}");
    let solo = admin_token(&gw, json!({"role": "admin", "tenant": "solo"})).await;
    let (s, _) = admin_call(&gw, Method::GET, "/admin/v1/budgets", &solo, None).await;
    assert_eq!(s, 200);
    let (s, v) = admin_call(&gw, Method::DELETE, "/admin/v1/tenants/solo", ROOT, None).await;
    assert!(s == 200 || s == 204, "{s} {v}");
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants",
        json!({"name": "solo", "parent": "acme"}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    for path in [
        "/admin/v1/budgets",
        "/admin/v1/tenants/solo",
        "/admin/v1/spend",
    ] {
        let (s, v) = admin_call(&gw, Method::GET, path, &solo, None).await;
        assert_eq!(s, 401, "{path}: {v}");
    }
}

#[tokio::test]
async fn names_with_quotes_semicolons_unicode_and_10000_characters_are_refused_or_stored_literally()
{
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let long = "a".repeat(10_000);
    for name in [
        "o'brien",
        "x\"; DROP TABLE tenants; --",
        "ünïcødé",
        long.as_str(),
    ] {
        let (s, v) = post(&gw, "/admin/v1/tenants", json!({ "name": name })).await;
        assert_eq!(s, 400, "{name:.40}: {v}");
        assert_eq!(v["error"]["param"], "name");
        assert_eq!(
            v["error"]["message"],
            "name: must match [A-Za-z0-9._-]{1,64}"
        );
    }
    let (s, v) = post(&gw, "/admin/v1/tenants/t1/keys", json!({"id": "o'k; --"})).await;
    assert_eq!((s, v["error"]["param"].clone()), (400, json!("id")), "{v}");
    let alias = "Ana's \"laptop\"; DROP TABLE api_keys; -- ✓ 日本";
    let owner = json!({"team": "ml'; --", "email": "ana@example.com"});
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants/t1/keys",
        json!({"id": "a", "alias": alias, "owner": owner}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/tenants/t1/keys/a", ROOT, None).await;
    assert_eq!(s, 200);
    assert_eq!(v["alias"], alias, "stored as written");
    assert_eq!(v["owner"], owner);
    let (s, v) = post(
        &gw,
        "/admin/v1/tenants/t1/keys",
        json!({"id": "b", "alias": long}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["param"].clone()),
        (400, json!("alias")),
        "{v}"
    );
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/keys?alias=x", ROOT, None).await;
    assert_eq!(s, 200, "the tables are intact: {v}");
}

#[tokio::test]
async fn a_name_the_file_also_defines_is_quarantined_at_reload_and_at_start_and_the_files_is_served(
) {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let gw = config(&mock.base_url(), &db).start().await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, _) = post(&gw, "/admin/v1/tenants", json!({"name": "ml"})).await;
    assert_eq!(s, 201);
    let (s, v) = post(&gw, "/admin/v1/tenants", json!({"name": "t1"})).await;
    assert_eq!(s, 409, "t1 is the file's: {v}");
    let api_key = new_key(&gw, "ml", "api").await;

    // The file now defines `ml` too: the reload applies, the file's `ml`
    // is served, the database's is quarantined; the API key of `ml`
    // belongs to the tenant of that name, now the file's.
    let mut both = config(&mock.base_url(), &db);
    both.tenants
        .push(config::tenant("ml", "k", "sk-ml", limits()));
    both.write_to(&gw.config_path);
    let control = gw.state.control.get().expect("control plane").clone();
    let outcome = control.reload_file(Trigger::Signal);
    assert!(
        matches!(outcome, ReloadOutcome::Applied { .. }),
        "{outcome:?}"
    );
    let q = control.quarantined();
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(
        q[0].reason.contains("tenant \"ml\" is defined both"),
        "{q:?}"
    );
    assert_eq!(post_hi(&gw, "sk-ml").await, 200, "the file's key");
    assert_eq!(post_hi(&gw, &api_key).await, 200, "the API key of ml");
    let (_, v) = admin_call(&gw, Method::GET, "/admin/v1/tenants/ml", ROOT, None).await;
    assert_eq!(v["source"], "file", "{v}");

    // At start: the same file and database start, with the same quarantine.
    let path = dir.path().join("both.toml");
    both.write_to(&path);
    let (_, policy) = budgetgate::control::open(&Policy::load(&path).unwrap(), &path)
        .await
        .expect("starts with a name in both places");
    assert_eq!(policy.tenants.iter().filter(|t| t.name == "ml").count(), 1);
}

#[tokio::test]
async fn a_key_moved_into_the_file_under_a_later_tenant_leaves_every_other_runtime_key_serving() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&mock.base_url(), &dir.path().join("c.db"));
    cfg.tenants
        .push(config::tenant("t2", "k2", "sk-t2", limits()));
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let moved = new_key(&gw, "t1", "moved").await;
    let other = new_key(&gw, "t1", "other").await;
    let (s, v) = post(&gw, "/admin/v1/tenants", json!({"name": "rt"})).await;
    assert_eq!(s, 201, "{v}");
    let rt = new_key(&gw, "rt", "rk").await;

    // The operator pins the API key `moved` of `t1` in the file, under
    // the later tenant `t2`: the validator meets the database's key
    // first and reports the secret on the file's key.
    cfg.tenant("t2").keys.push(config::key("pinned", &moved));
    cfg.write_to(&gw.config_path);
    let control = gw.state.control.get().expect("control plane").clone();
    let outcome = control.reload_file(Trigger::Signal);
    assert!(
        matches!(outcome, ReloadOutcome::Applied { .. }),
        "{outcome:?}"
    );
    let q = control.quarantined();
    assert_eq!(q.len(), 1, "only the database's side of it: {q:?}");
    assert_eq!(q[0].entity.to_string(), "key \"moved\" of tenant \"t1\"");
    assert!(q[0].reason.contains("configured twice"), "{q:?}");
    for (what, key) in [
        ("the pinned key, now the file's", &moved),
        ("an unrelated API key of the same file tenant", &other),
        ("an API key of an API tenant", &rt),
        ("a file key", &"sk-t2".to_string()),
    ] {
        assert_eq!(post_hi(&gw, key).await, 200, "{what}");
    }
}

#[tokio::test]
async fn a_changed_limit_is_a_policy_change_for_the_stores() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, _) = post(
        &gw,
        "/admin/v1/tenants",
        json!({"name": "ml", "limits": {"rpm": 2}}),
    )
    .await;
    assert_eq!(s, 201);
    let key = new_key(&gw, "ml", "k").await;
    let v0 = gw.state.policy.load().version.clone();
    assert_eq!(post_hi(&gw, &key).await, 200);
    assert_eq!(post_hi(&gw, &key).await, 200);
    assert_eq!(post_hi(&gw, &key).await, 429, "rpm 2 (frozen clock)");
    let (s, v) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/ml",
        ROOT,
        Some(json!({"limits": {"rpm": 1}})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["limits"]["rpm"], 1);
    let p = gw.state.policy.load_full();
    assert_ne!(p.version, v0, "a new policy version tags decisions");
    let ml = p.tenants.iter().find(|t| t.name == "ml").unwrap();
    assert_eq!(ml.limits.rpm, Some(1));
    assert_eq!(post_hi(&gw, &key).await, 429, "lowering grants nothing");
}

#[tokio::test]
async fn a_tenant_scoped_token_cannot_read_or_change_another_tenant_nor_exceed_its_parent() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for (name, parent, tpm) in [
        ("acme", None, 10_000),
        ("ml", Some("acme"), 5_000),
        ("other", None, 7_000),
    ] {
        let (s, v) = post(
            &gw,
            "/admin/v1/tenants",
            json!({"name": name, "parent": parent, "limits": {"tpm": tpm}}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    let scoped = admin_token(&gw, json!({"role": "admin", "tenant": "ml"})).await;
    let reader = admin_token(&gw, json!({"role": "read"})).await;

    for (m, path, body) in [
        (Method::GET, "/admin/v1/tenants/other", None),
        (Method::GET, "/admin/v1/tenants/acme", None),
        (
            Method::PATCH,
            "/admin/v1/tenants/other",
            Some(json!({"limits": {"tpm": 1}})),
        ),
        (
            Method::POST,
            "/admin/v1/tenants/other/keys",
            Some(json!({})),
        ),
        (Method::GET, "/admin/v1/tenants/other/keys", None),
        (Method::DELETE, "/admin/v1/tenants/other", None),
        (
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({"name": "x", "parent": "other"})),
        ),
        (Method::GET, "/admin/v1/audit", None),
        (
            Method::POST,
            "/admin/v1/admin_tokens",
            Some(json!({"role": "admin"})),
        ),
    ] {
        let (s, v) = admin_call(&gw, m.clone(), path, &scoped, body).await;
        assert_eq!(s, 403, "{m} {path}: {v}");
    }
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/tenants", &scoped, None).await;
    assert_eq!(s, 200);
    let names: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ml"], "only its subtree");

    let (s, v) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/ml",
        &scoped,
        Some(json!({"limits": {"tpm": 20_000}})),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("parent tenant \"acme\""), "{msg}");
    assert_eq!(v["error"]["param"], "limits.tpm");
    let (s, v) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/ml",
        &scoped,
        Some(json!({"limits": {"tpm": 9_000}})),
    )
    .await;
    assert_eq!(
        (s, &v["error"]["param"]),
        (403, &json!("limits.tpm")),
        "within the parent, but its own tenant's limit raised: {v}"
    );
    let (s, v) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/ml",
        &scoped,
        Some(json!({"limits": {"tpm": 4_000}})),
    )
    .await;
    assert_eq!(s, 200, "lowered: {v}");
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        &scoped,
        Some(json!({"name": "ml-a", "parent": "ml", "limits": {"tpm": 9_500}})),
    )
    .await;
    assert_eq!(s, 400, "a child above its parent ml: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("parent tenant \"ml\""),
        "{v}"
    );
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants/ml/keys",
        &scoped,
        Some(json!({"id": "own"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");

    let (s, _) = admin_call(&gw, Method::GET, "/admin/v1/tenants/other", &reader, None).await;
    assert_eq!(s, 200, "an unscoped reader reads");
    let (s, _) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/other",
        &reader,
        Some(json!({"shadow": true})),
    )
    .await;
    assert_eq!(s, 403, "but changes nothing");

    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/audit?limit=100", ROOT, None).await;
    assert_eq!(s, 200);
    let rows = v["data"].as_array().unwrap();
    let update = rows
        .iter()
        .find(|r| r["action"] == "tenant.update" && r["subject"] == "tenant:ml")
        .expect("the update is audited");
    assert!(
        update["actor"]
            .as_str()
            .unwrap()
            .starts_with("admin_token:"),
        "{update}"
    );
    assert_eq!(update["before"]["limits"]["tpm"], 5_000);
    assert_eq!(update["after"]["limits"]["tpm"], 4_000);
    assert!(rows
        .iter()
        .any(|r| r["action"] == "admin_token.create" && r["actor"] == "root"));
}

#[tokio::test]
async fn a_key_holder_reads_its_own_budget_with_its_own_key() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&mock.base_url(), &dir.path().join("c.db"));
    cfg.tenant("t1").limits = limits().tpm(1000).usd_per_day("5.00");
    cfg.model("gpt-4o-mini").price = Some(price("0.15", "0.60"));
    cfg.tenant("t1")
        .keys
        .push(config::key("k2", "sk-second-key"));
    let gw = cfg.start().await;
    assert_eq!(post_hi(&gw, KEY).await, 200);
    gw.settled().await;
    let r = reqwest::Client::new()
        .get(format!("{}/budget", gw.base_url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let budgets = v["budgets"].as_array().unwrap();
    let tpm = budgets
        .iter()
        .find(|b| b["scope"] == "tenant:t1" && b["budget"] == "tpm")
        .expect("tpm");
    assert!(tpm["remaining"].as_i64().unwrap() < 1000, "{tpm}");
    assert!(tpm["reset"].is_string());
    let usd = budgets
        .iter()
        .find(|b| b["budget"] == "usd_per_day")
        .expect("dollars");
    assert_eq!(usd["usd"]["limit"], "5.00");
    assert!(
        !v.to_string().contains("k2"),
        "another key's budgets are not shown: {v}"
    );
    let r = reqwest::Client::new()
        .get(format!("{}/budget", gw.base_url()))
        .bearer_auth("sk-wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// `(method, path)` of every `.route(…)` under `/admin/v1` in the server's
/// sources, methods read from the handler chain on the same statement.
fn routes_in_source() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for file in ["src/server/mod.rs", "src/server/control_api/mod.rs"] {
        let text = std::fs::read_to_string(repo_path(file)).unwrap();
        for stmt in text.split(".route(").skip(1) {
            let Some(path) = stmt.split('"').nth(1) else {
                continue;
            };
            if !path.starts_with("/admin/v1") && path != "/v1/budget" {
                continue;
            }
            let chain: String = stmt.split("\n        .route").next().unwrap().to_string();
            for m in ["get", "post", "patch", "delete", "put"] {
                if chain.contains(&format!("{m}(")) {
                    out.push((m.to_string(), path.to_string()));
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn every_admin_route_is_in_the_openapi_document() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, doc) = admin_call(&gw, Method::GET, "/admin/v1/openapi.json", ROOT, None).await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let routes = routes_in_source();
    assert!(routes.len() >= 20, "{routes:?}");
    for (m, path) in &routes {
        assert!(
            doc["paths"][path][m].is_object(),
            "{m} {path} is not in docs/openapi.json"
        );
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert_eq!(
        documented,
        routes.len(),
        "the document lists a route the server does not have"
    );
}

/// Runs `budgetgate ARGS` against `gw` with the root token; stdout, or
/// the failure's stderr.
fn cli(gw: &Gateway, args: &[&str]) -> Result<Value, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(args)
        .env("BUDGETGATE_URL", gw.root_url())
        .env("BUDGETGATE_ADMIN_TOKEN", ROOT)
        .output()
        .expect("run budgetgate");
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).expect("the CLI prints JSON"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_lists_and_revokes_keys_and_tenants_through_the_api() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    let t = cli(
        &gw,
        &[
            "tenants",
            "create",
            r#"{"name": "ml", "limits": {"tpm": 50000}}"#,
        ],
    )
    .unwrap();
    assert_eq!(t["name"], "ml");
    let k = cli(
        &gw,
        &[
            "keys",
            "create",
            "--tenant",
            "ml",
            "--id",
            "ci",
            "--alias",
            "CI job",
            "--model",
            "gpt-4o-mini",
        ],
    )
    .unwrap();
    let secret = k["secret"].as_str().unwrap().to_string();
    assert_eq!(post_hi(&gw, &secret).await, 200);
    let list = cli(&gw, &["keys", "list", "--tenant", "ml"]).unwrap();
    assert_eq!(list["data"][0]["alias"], "CI job");
    assert!(!list.to_string().contains(&secret));
    cli(&gw, &["keys", "revoke", "--tenant", "ml", "ci"]).unwrap();
    assert_eq!(post_hi(&gw, &secret).await, 401);
    let e = cli(
        &gw,
        &[
            "tenants",
            "create",
            r#"{"name": "bad", "limits": {"tpm": 0}}"#,
        ],
    )
    .unwrap_err();
    assert!(e.contains("limits.tpm: must be > 0"), "{e}");
    let tok = cli(
        &gw,
        &["admin-tokens", "create", "--role", "read", "--tenant", "ml"],
    )
    .unwrap();
    assert_eq!(tok["role"], "read");
    let listed = cli(&gw, &["tenants", "list"]).unwrap();
    assert!(listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "ml"));
}

#[tokio::test]
async fn tenants_are_listed_by_name_paged_and_filtered() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for (name, parent) in [
        ("acme", None),
        ("acme-ml", Some("acme")),
        ("acme-web", Some("acme")),
        ("zeta", None),
    ] {
        let (s, v) = post(
            &gw,
            "/admin/v1/tenants",
            json!({"name": name, "parent": parent}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    let names = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, p1) = admin_call(&gw, Method::GET, "/admin/v1/tenants?limit=2", ROOT, None).await;
    assert_eq!(names(&p1), ["acme", "acme-ml"]);
    assert_eq!(p1["next"], "acme-ml");
    let (_, p2) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/tenants?limit=2&after=acme-ml",
        ROOT,
        None,
    )
    .await;
    assert_eq!(names(&p2), ["acme-web", "t1"]);
    let (_, p3) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/tenants?limit=2&after=t1",
        ROOT,
        None,
    )
    .await;
    assert_eq!(names(&p3), ["zeta"]);
    assert!(p3["next"].is_null());
    let (_, kids) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/tenants?parent=acme",
        ROOT,
        None,
    )
    .await;
    assert_eq!(names(&kids), ["acme-ml", "acme-web"]);
    let (_, file) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/tenants?source=file",
        ROOT,
        None,
    )
    .await;
    assert_eq!(names(&file), ["t1"]);
    let (s, v) = admin_call(&gw, Method::DELETE, "/admin/v1/tenants/acme", ROOT, None).await;
    assert_eq!(s, 409, "its children name it: {v}");
    let (s, _) = admin_call(&gw, Method::DELETE, "/admin/v1/tenants/zeta", ROOT, None).await;
    assert_eq!(s, 200);
    let (s, _) = admin_call(&gw, Method::GET, "/admin/v1/tenants/zeta", ROOT, None).await;
    assert_eq!(s, 404);
}

/// A bad query parameter of a control API route is a 400 in the error
/// shape of every other refusal, naming it; before, axum's extractor
/// answered plain text, and `?source=xyz` or the token list's `?limit=abc`
/// were ignored.
#[tokio::test]
async fn bad_query_parameters_are_refused_400_naming_them() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = config(&mock.base_url(), &dir.path().join("c.db"))
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for (path, param) in [
        ("/admin/v1/tenants?limit=abc", "limit"),
        ("/admin/v1/tenants?source=xyz", "source"),
        ("/admin/v1/tenants?limit=0", "limit"),
        ("/admin/v1/keys?revoked=maybe", "revoked"),
        ("/admin/v1/keys?limit=5&limit=6", "limit"),
        ("/admin/v1/keys?limt=5", "limt"),
        ("/admin/v1/tenants/t1/keys?limit=abc", "limit"),
        ("/admin/v1/audit?before=x", "before"),
        ("/admin/v1/audit?limit=abc", "limit"),
        ("/admin/v1/admin_tokens?limit=abc", "limit"),
    ] {
        let r = reqwest::Client::new()
            .get(format!("{}{path}", gw.root_url()))
            .bearer_auth(ROOT)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert_eq!(
            must_header(&r, "content-type"),
            "application/json",
            "{path}"
        );
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        assert_eq!(v["error"]["param"], param, "{path}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("`{param}`")), "{path}: {msg}");
    }
    // Good values still answer, the token list now paged like the others.
    for id in ["a", "b"] {
        let (s, v) = post(
            &gw,
            "/admin/v1/admin_tokens",
            json!({"id": id, "role": "read"}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    let (s, v) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/admin_tokens?limit=1",
        ROOT,
        None,
    )
    .await;
    assert_eq!(
        (s, &v["data"][0]["id"], &v["next"]),
        (200, &json!("a"), &json!("a")),
        "{v}"
    );
    let (s, v) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/tenants?source=file&limit=1000",
        ROOT,
        None,
    )
    .await;
    assert_eq!((s, &v["data"][0]["name"]), (200, &json!("t1")), "{v}");
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/keys?revoked=false", ROOT, None).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = admin_call(
        &gw,
        Method::GET,
        "/admin/v1/audit?before=100&limit=5",
        ROOT,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
}
