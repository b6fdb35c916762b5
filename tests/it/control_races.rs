//! Concurrent admin writes against the control tree:
//! deleting a tenant while a key, a child and a move land under it, on
//! two gateways sharing PostgreSQL and on one gateway with SQLite, with
//! and without a pause between one side's re-check and its commit. No
//! orphan may be left; a key revoked afterwards is refused on every
//! gateway within a second; the gateways restart. And an entity that no
//! longer merges (a file reload removed its tenant) is quarantined and
//! listed, the reload applied, the rest served.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use super::control::{admin_token, new_key, ROOT};
use crate::support::postgres::PgServer;
use crate::support::*;
use budgetgate::config::reload::{ReloadOutcome, Trigger};
use budgetgate::control::runtime;
use budgetgate::control::ControlPlane;
use budgetgate::db::Db;

/// Rounds of concurrent delete / create-key / create-child / move.
const ROUNDS: usize = 200;

fn plane(gw: &Gateway) -> std::sync::Arc<ControlPlane> {
    gw.state.control.get().expect("control plane").clone()
}

/// Waits until `gw` serves counter `version` (the other gateway's write).
async fn serves(gw: &Gateway, version: i64) {
    let p = plane(gw);
    let since = Instant::now();
    while !p.serves(version) {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{} never served version {version}",
            gw.addr
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

thread_local! {
    /// One client per worker thread (a test's runtime's threads end with
    /// it): a client made per call reads the system's root certificates
    /// each time, most of this suite's CPU.
    static CLIENT: reqwest::Client = reqwest::Client::new();
}

/// [`admin_call`] with the root token, on this thread's client.
async fn call(gw: &Gateway, m: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = CLIENT
        .with(|c| c.clone())
        .request(m, format!("{}{path}", gw.root_url()))
        .bearer_auth(ROOT)
        .timeout(Duration::from_secs(10));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    let text = r.text().await.expect("admin body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `f`, started `lag` from now.
async fn after<T>(lag: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::sleep(lag).await;
    f.await
}

/// Every runtime key's tenant and every runtime tenant's parent is a
/// tenant of the file (`file`) or of the database: the orphans, named.
async fn orphans(db: &Db, file: &[&str]) -> Vec<String> {
    let snap = runtime::load(db).await.expect("read the control database");
    let names: HashSet<&str> = snap
        .tenants
        .iter()
        .map(|t| t.spec.name.as_str())
        .chain(file.iter().copied())
        .collect();
    let mut out = Vec::new();
    for t in &snap.tenants {
        if let Some(p) = t.spec.parent.as_deref().filter(|p| !names.contains(p)) {
            out.push(format!("tenant {} under missing {p}", t.spec.name));
        }
    }
    for k in snap
        .keys
        .iter()
        .filter(|k| !names.contains(k.tenant.as_str()))
    {
        out.push(format!("key {} under missing {}", k.id, k.tenant));
    }
    out
}

/// Runs [`ROUNDS`] rounds on `a` and `b` (the same gateway, or two on one
/// database at `url`): each round creates tenant `r{n}` (every other one
/// a child of the file's `t1`) on `a`, then at once deletes it on `a`,
/// creates a key under it on `b`, a child under it on `a`, and moves
/// `mover` under it on `b`. Returns how many rounds each write won.
async fn race(a: &Gateway, b: &Gateway, url: &str) -> [usize; 4] {
    let mut won = [0usize; 4];
    let db = Db::open(url).await.expect("open the control database");
    let (s, v) = call(
        a,
        Method::POST,
        "/admin/v1/tenants",
        Some(json!({"name": "mover"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    for n in 0..ROUNDS {
        let r = format!("r{n}");
        let body = match n % 2 {
            0 => json!({ "name": r }),
            _ => json!({ "name": r, "parent": "t1" }),
        };
        let (s, v) = call(a, Method::POST, "/admin/v1/tenants", Some(body)).await;
        assert_eq!(s, 201, "{v}");
        serves(b, plane(a).snapshot().version).await;
        let (this, keys) = (
            format!("/admin/v1/tenants/{r}"),
            format!("/admin/v1/tenants/{r}/keys"),
        );
        // Each write starts 0 to 3 ms late, round by round, so that each
        // lands before, during and after the others.
        let lag =
            |i: u64| Duration::from_micros((n as u64 * 4 + i).wrapping_mul(2_654_435_761) % 3000);
        let (del, key, child, mv) = tokio::join!(
            after(lag(0), call(a, Method::DELETE, &this, None)),
            after(
                lag(1),
                call(b, Method::POST, &keys, Some(json!({"id": "k"})))
            ),
            after(
                lag(2),
                call(
                    a,
                    Method::POST,
                    "/admin/v1/tenants",
                    Some(json!({"name": format!("c{n}"), "parent": r})),
                )
            ),
            after(
                lag(3),
                call(
                    b,
                    Method::PATCH,
                    "/admin/v1/tenants/mover",
                    Some(json!({ "parent": r })),
                )
            ),
        );
        for (i, ((s, v), ok)) in [(del, 200), (key, 201), (child, 201), (mv, 200)]
            .into_iter()
            .enumerate()
        {
            // A tenant already gone when the call is checked: 404 for its
            // key, 400 `parent` for a child or a move under it.
            let gone = s == 404 || (s == 400 && i >= 2 && v["error"]["param"] == "parent");
            assert!(s == ok || s == 409 || gone, "round {n}, write {i}: {s} {v}");
            if s == ok {
                won[i] += 1;
            }
            if s == 409 {
                assert_eq!(v["error"]["code"], "conflict", "{v}");
            }
        }
        let left = orphans(&db, &["t1"]).await;
        assert!(left.is_empty(), "round {n}: orphans {left:?}");
        // Back to a small tree: the child and the tenant go (the mover
        // moves on to the next round's tenant, leaving this one).
        let (s, v) = call(
            a,
            Method::PATCH,
            "/admin/v1/tenants/mover",
            Some(json!({"parent": null})),
        )
        .await;
        assert_eq!(s, 200, "round {n}: {v}");
        for t in [format!("c{n}"), r] {
            let (s, v) = call(a, Method::DELETE, &format!("/admin/v1/tenants/{t}"), None).await;
            assert!(s == 200 || s == 404, "round {n}, delete {t}: {s} {v}");
        }
    }
    db.pool().close().await;
    won
}

/// After the rounds: the quarantine is empty on every gateway; a key of
/// the file's tenant created through the API works on both; a key
/// revoked now is refused on both within a second.
async fn after_race(a: &Gateway, b: &Gateway, revoked: &str) {
    for gw in [a, b] {
        plane(gw).refresh(true).await;
        let (s, v) = call(gw, Method::GET, "/admin/v1/control/quarantine", None).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["data"], json!([]), "nothing quarantined: {v}");
    }
    let file_key = new_key(a, "t1", "after").await;
    serves(b, plane(a).snapshot().version).await;
    for gw in [a, b] {
        assert_eq!(post_hi(gw, &file_key).await, 200, "a file tenant's API key");
    }
    let (s, v) = call(
        b,
        Method::POST,
        "/admin/v1/tenants/t1/keys/held/revoke",
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let at = Instant::now();
    for gw in [a, b] {
        loop {
            if post_hi(gw, revoked).await == 401 {
                break;
            }
            assert!(
                at.elapsed() < Duration::from_secs(1),
                "{}: the revoked key still works after {:?}",
                gw.addr,
                at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "revoked key refused on {} after {:?}",
            gw.addr,
            at.elapsed()
        );
    }
}

fn pg_config(mock: &str, pg: &PgServer) -> TestConfig {
    let mut c = TestConfig::standard(mock, 50, limits().tpm(10_000_000));
    c.control.database_url = Some(pg.url());
    c
}

async fn two_gateways_on_postgres(pause: Option<Duration>) {
    let pg = PgServer::start();
    let mock = start_mock().await;
    let cfg = pg_config(&mock.base_url(), &pg);
    let (a, b) = (cfg.start().await, cfg.start().await);
    for gw in [&a, &b] {
        gw.state.set_admin_token(Some(ROOT));
    }
    if let Some(p) = pause {
        // Every write of `a` holds its lock a while after its re-check.
        plane(&a).pause_writes_before_commit(Some(("*", p)));
    }
    let held = new_key(&a, "t1", "held").await;
    let started = Instant::now();
    let won = race(&a, &b, &pg.url()).await;
    println!(
        "{ROUNDS} rounds on two gateways (PostgreSQL, pause {pause:?}) in {:?}; won: delete {}, key {}, child {}, move {}",
        started.elapsed(),
        won[0],
        won[1],
        won[2],
        won[3]
    );
    after_race(&a, &b, &held).await;
    drop((a, b));
    let (a, b) = (cfg.start().await, cfg.start().await);
    for gw in [&a, &b] {
        assert_eq!(
            post_hi(gw, &held).await,
            401,
            "still revoked after a restart"
        );
        assert_eq!(post_hi(gw, KEY).await, 200, "the file's key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_keys_children_and_moves_on_two_gateways_on_postgres_leave_no_orphan() {
    two_gateways_on_postgres(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_keys_children_and_moves_on_postgres_with_a_pause_before_commit_leave_no_orphan(
) {
    two_gateways_on_postgres(Some(Duration::from_millis(5))).await;
}

async fn one_gateway_on_sqlite(pause: Option<Duration>) {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let url = format!("sqlite://{}", db.display());
    let cfg = super::control::config(&mock.base_url(), &db);
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    if let Some(p) = pause {
        // The deletes hold the lock a while after their re-check.
        plane(&gw).pause_writes_before_commit(Some(("tenant.delete", p)));
    }
    let held = new_key(&gw, "t1", "held").await;
    let started = Instant::now();
    let won = race(&gw, &gw, &url).await;
    println!(
        "{ROUNDS} rounds on one gateway (SQLite, pause {pause:?}) in {:?}; won: delete {}, key {}, child {}, move {}",
        started.elapsed(),
        won[0],
        won[1],
        won[2],
        won[3]
    );
    after_race(&gw, &gw, &held).await;
    drop(gw);
    let gw = cfg.start().await;
    assert_eq!(
        post_hi(&gw, &held).await,
        401,
        "still revoked after a restart"
    );
    assert_eq!(post_hi(&gw, KEY).await, 200, "the file's key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_keys_children_and_moves_on_one_gateway_on_sqlite_leave_no_orphan() {
    one_gateway_on_sqlite(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_keys_children_and_moves_on_sqlite_with_a_pause_before_commit_leave_no_orphan(
) {
    one_gateway_on_sqlite(Some(Duration::from_millis(5))).await;
}

/// The quarantine as `GET /admin/v1/control/quarantine` lists it:
/// `kind name-or-tenant/id`.
async fn quarantine(gw: &Gateway) -> Vec<String> {
    let (s, v) = call(gw, Method::GET, "/admin/v1/control/quarantine", None).await;
    assert_eq!(s, 200, "{v}");
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| match q["kind"].as_str().unwrap() {
            "tenant" => format!("tenant {}", q["name"].as_str().unwrap()),
            _ => format!(
                "key {}/{}",
                q["tenant"].as_str().unwrap(),
                q["id"].as_str().unwrap()
            ),
        })
        .collect()
}

#[tokio::test]
async fn a_reload_removing_a_file_tenant_with_api_keys_applies_and_quarantines_what_hung_from_it() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let mut with_team = super::control::config(&mock.base_url(), &db);
    with_team
        .tenants
        .push(config::tenant("team", "file-key", "sk-team-file", limits()));
    let gw = with_team.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let team_key = new_key(&gw, "team", "api").await;
    let (s, v) = call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        Some(json!({"name": "team-ml", "parent": "team"})),
    )
    .await;
    assert_eq!(s, 201, "a child of a file tenant: {v}");
    let child_key = new_key(&gw, "team-ml", "api").await;
    let t1_key = new_key(&gw, "t1", "api").await;
    for k in [&team_key, &child_key, &t1_key] {
        assert_eq!(post_hi(&gw, k).await, 200);
    }
    assert!(quarantine(&gw).await.is_empty());

    // The file loses `team`: the reload applies; what hung from it is
    // quarantined, listed and refused; the rest is served.
    let without = super::control::config(&mock.base_url(), &db);
    without.write_to(&gw.config_path);
    let p = plane(&gw);
    let outcome = p.reload_file(Trigger::Signal);
    assert!(
        matches!(outcome, ReloadOutcome::Applied { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        quarantine(&gw).await,
        ["tenant team-ml", "key team/api", "key team-ml/api"],
    );
    let (_, v) = call(&gw, Method::GET, "/admin/v1/control/quarantine", None).await;
    let reasons = v.to_string();
    assert!(
        reasons.contains("its tenant \\\"team\\\" is not defined"),
        "{reasons}"
    );
    assert!(
        reasons.contains("its parent \\\"team\\\" is not defined"),
        "{reasons}"
    );
    assert_eq!(post_hi(&gw, &team_key).await, 401);
    assert_eq!(post_hi(&gw, &child_key).await, 401);
    assert_eq!(post_hi(&gw, &t1_key).await, 200, "the rest is served");
    assert_eq!(post_hi(&gw, KEY).await, 200);
    let metrics = reqwest::get(format!("{}/metrics", gw.root_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "budgetgate_control_quarantined",
        "budgetgate_control_version",
        "budgetgate_control_snapshot_age_seconds",
    ] {
        assert!(metrics.contains(series), "{series} is not exported");
    }

    // Writes go on with the quarantine in place (it does not freeze the
    // tree), and a key revoked now is refused.
    let (s, v) = call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        Some(json!({"name": "other"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let other = new_key(&gw, "other", "k").await;
    assert_eq!(post_hi(&gw, &other).await, 200);
    let (s, _) = call(
        &gw,
        Method::POST,
        "/admin/v1/tenants/t1/keys/api/revoke",
        None,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(post_hi(&gw, &t1_key).await, 401);

    // A restart with that file starts, quarantine and all.
    drop(gw);
    let gw = without.start().await;
    gw.state.set_admin_token(Some(ROOT));
    assert_eq!(quarantine(&gw).await.len(), 3);
    assert_eq!(post_hi(&gw, &other).await, 200);
    assert_eq!(post_hi(&gw, &team_key).await, 401);

    // `team` back in the file: everything merges again and is served.
    with_team.write_to(&gw.config_path);
    let outcome = plane(&gw).reload_file(Trigger::Signal);
    assert!(
        matches!(outcome, ReloadOutcome::Applied { .. }),
        "{outcome:?}"
    );
    assert!(quarantine(&gw).await.is_empty());
    for k in [&team_key, &child_key, &other] {
        assert_eq!(post_hi(&gw, k).await, 200);
    }
}

#[tokio::test]
async fn an_orphan_already_in_the_database_is_quarantined_and_the_rest_is_served_revoked_and_restarted(
) {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.db");
    let cfg = super::control::config(&mock.base_url(), &path);
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    for name in ["gone", "kept"] {
        let (s, v) = call(
            &gw,
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({ "name": name })),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    let orphan = new_key(&gw, "gone", "k").await;
    let kept = new_key(&gw, "kept", "k").await;
    // What an unserialised delete left behind before: the tenant's row
    // gone, its key still there.
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("DELETE FROM tenants WHERE name = 'gone'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE control_version SET version = version + 1")
        .execute(db.pool())
        .await
        .unwrap();
    db.pool().close().await;
    plane(&gw).refresh(true).await;
    assert_eq!(quarantine(&gw).await, ["key gone/k"]);
    assert_eq!(post_hi(&gw, &orphan).await, 401, "not served");
    assert_eq!(post_hi(&gw, &kept).await, 200, "the rest is");

    // Later changes are served: a new key works, a revoked one is refused.
    let late = new_key(&gw, "kept", "late").await;
    assert_eq!(post_hi(&gw, &late).await, 200);
    let (s, v) = call(
        &gw,
        Method::POST,
        "/admin/v1/tenants/kept/keys/k/revoke",
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(post_hi(&gw, &kept).await, 401, "revoked");

    // A restart starts, with the same quarantine.
    drop(gw);
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    assert_eq!(quarantine(&gw).await, ["key gone/k"]);
    assert_eq!(post_hi(&gw, &late).await, 200);
    assert_eq!(post_hi(&gw, &kept).await, 401);
}

#[tokio::test]
async fn a_write_that_no_longer_fits_the_database_is_refused_409_naming_what_changed() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.db");
    let gw = super::control::config(&mock.base_url(), &path)
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for name in ["x", "y", "m"] {
        let (s, v) = call(
            &gw,
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({ "name": name })),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    // Changes this gateway has not read yet (the counter is left alone):
    // `x` deleted, a child of `y` created.
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("DELETE FROM tenants WHERE name = 'x'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tenants (name, spec, created_at, updated_at) VALUES ('y-new', '{\"name\":\"y-new\",\"parent\":\"y\"}', 0, 0)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    db.pool().close().await;
    let version = plane(&gw).snapshot().version;

    let (s, v) = call(
        &gw,
        Method::POST,
        "/admin/v1/tenants/x/keys",
        Some(json!({"id": "k"})),
    )
    .await;
    assert_eq!((s, &v["error"]["code"]), (409, &json!("conflict")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("its tenant \"x\" is not defined"), "{msg}");
    let (s, v) = call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        Some(json!({"name": "x-kid", "parent": "x"})),
    )
    .await;
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("its parent \"x\" is not defined"),
        "{v}"
    );
    // `y` looks childless here, but has a child now.
    let (s, v) = call(&gw, Method::DELETE, "/admin/v1/tenants/y", None).await;
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tenant \"y-new\""),
        "{v}"
    );
    let (s, v) = call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/m",
        Some(json!({"parent": "x"})),
    )
    .await;
    assert_eq!(s, 409, "a move under it: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tenant \"m\": its parent \"x\" is not defined"),
        "{v}"
    );
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let snap = runtime::load(&db).await.unwrap();
    assert_eq!(snap.version, version, "nothing was written");
    assert!(snap.keys.is_empty());
    assert_eq!(orphans(&db, &["t1"]).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_scoped_tokens_write_under_a_tenant_moved_out_of_its_subtree_meanwhile_is_refused_403() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.db");
    let gw = super::control::config(&mock.base_url(), &path)
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for body in [
        json!({"name": "team"}),
        json!({"name": "a", "parent": "team"}),
        json!({"name": "b", "parent": "a"}),
        json!({"name": "m", "parent": "team"}),
    ] {
        let (s, v) = call(&gw, Method::POST, "/admin/v1/tenants", Some(body)).await;
        assert_eq!(s, 201, "{v}");
    }
    new_key(&gw, "a", "k").await;
    let token = admin_token(&gw, json!({"role": "admin", "tenant": "team"})).await;
    // Another gateway's move this gateway has not read yet (the counter is
    // left alone): `a`, and `b` under it, leave `team`'s subtree.
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("UPDATE tenants SET spec = '{\"name\":\"a\"}' WHERE name = 'a'")
        .execute(db.pool())
        .await
        .unwrap();
    db.pool().close().await;
    let version = plane(&gw).snapshot().version;
    let scoped = |m: Method, path: &'static str, body: Option<Value>| {
        let (gw, token) = (&gw, token.clone());
        async move { admin_call(gw, m, path, &token, body).await }
    };

    let refused = [
        (
            Method::POST,
            "/admin/v1/tenants/a/keys",
            Some(json!({"id": "k2"})),
            "a",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({"name": "a-kid", "parent": "a"})),
            "a",
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/m",
            Some(json!({"parent": "a"})),
            "a",
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/b",
            Some(json!({"limits": {"rpm": 5}})),
            "b",
        ),
        (Method::DELETE, "/admin/v1/tenants/b", None, "b"),
        (
            Method::PATCH,
            "/admin/v1/tenants/a/keys/k",
            Some(json!({"alias": "x"})),
            "a",
        ),
        (
            Method::POST,
            "/admin/v1/tenants/a/keys/k/rotate",
            Some(json!({})),
            "a",
        ),
        (Method::POST, "/admin/v1/tenants/a/keys/k/revoke", None, "a"),
    ];
    for (m, path, body, tenant) in refused {
        let (s, v) = scoped(m.clone(), path, body).await;
        assert_eq!(
            (s, &v["error"]["code"]),
            (403, &json!("forbidden")),
            "{m} {path}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("cannot see or change tenant \"{tenant}\"")),
            "{m} {path}: {msg}"
        );
    }
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let snap = runtime::load(&db).await.unwrap();
    assert_eq!(snap.version, version, "nothing was written");
    assert_eq!(snap.keys.len(), 1);
    assert!(snap.keys[0].revoked_at.is_none());
    assert_eq!(snap.tenants.len(), 4);
    db.pool().close().await;

    // What still lies in the subtree is written as before, the token's
    // own tenant included.
    let (s, v) = scoped(
        Method::POST,
        "/admin/v1/tenants",
        Some(json!({"name": "m-kid", "parent": "m"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = scoped(
        Method::PATCH,
        "/admin/v1/tenants/team",
        Some(json!({"limits": {"rpm": 1000}})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn a_scoped_tokens_limit_above_a_parent_limit_lowered_meanwhile_is_refused_400() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.db");
    let gw = super::control::config(&mock.base_url(), &path)
        .start()
        .await;
    gw.state.set_admin_token(Some(ROOT));
    for body in [
        json!({"name": "team", "limits": {"rpm": 100}}),
        json!({"name": "a", "parent": "team"}),
    ] {
        let (s, v) = call(&gw, Method::POST, "/admin/v1/tenants", Some(body)).await;
        assert_eq!(s, 201, "{v}");
    }
    let token = admin_token(&gw, json!({"role": "admin", "tenant": "team"})).await;
    // The root lowers `team`'s rpm on another gateway; this one has not
    // read it yet (the counter is left alone).
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE tenants SET spec = '{\"name\":\"team\",\"limits\":{\"rpm\":10}}' WHERE name = 'team'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    db.pool().close().await;
    let version = plane(&gw).snapshot().version;

    for (m, path, body) in [
        (
            Method::PATCH,
            "/admin/v1/tenants/a",
            json!({"limits": {"rpm": 50}}),
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            json!({"name": "a2", "parent": "team", "limits": {"rpm": 50}}),
        ),
    ] {
        let (s, v) = admin_call(&gw, m.clone(), path, &token, Some(body)).await;
        assert_eq!(
            (s, &v["error"]["param"]),
            (400, &json!("limits.rpm")),
            "{m} {path}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("50 is above the 10 of parent tenant \"team\""),
            "{msg}"
        );
    }
    let db = Db::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let snap = runtime::load(&db).await.unwrap();
    assert_eq!(snap.version, version, "nothing was written");
    db.pool().close().await;
    let (s, v) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/a",
        &token,
        Some(json!({"limits": {"rpm": 10}})),
    )
    .await;
    assert_eq!(s, 200, "within the lowered limit: {v}");
}
