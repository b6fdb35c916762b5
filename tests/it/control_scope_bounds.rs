//! A tenant-scoped admin token cannot lift its own tenant's cap: on its
//! own tenant it may lower or add limits and change descriptive fields,
//! never raise or remove a limit nor change the failure policy, shadow
//! mode, end-user limits, output reservation or queue class and weight
//! (403 naming the field); below it, nothing looser than its tenant (403
//! naming the field and the tenant). The parent-limit check keeps its
//! 400. On SQLite and PostgreSQL; and again under the write's lock, on
//! the database as it is then.

use reqwest::Method;
use serde_json::{json, Value};

use super::control::{admin_token, ROOT};
use crate::support::postgres::PgServer;
use crate::support::*;
use budgetgate::control::runtime;
use budgetgate::db::Db;

fn config(mock: &str, database_url: String) -> TestConfig {
    let mut c = TestConfig::standard(mock, 50, limits().tpm(1_000_000));
    c.control.database_url = Some(database_url);
    c
}

async fn root_post(gw: &Gateway, body: Value) {
    let (s, v) = admin_call(gw, Method::POST, "/admin/v1/tenants", ROOT, Some(body)).await;
    assert_eq!(s, 201, "{v}");
}

/// `call` is answered 403 `forbidden` naming `param` (and, `naming`, the
/// token's tenant) in `error.param` and the message.
fn assert_refused(call: &str, (s, v): &(u16, Value), param: &str, naming: &str) {
    assert_eq!(
        (*s, &v["error"]["code"], &v["error"]["param"]),
        (403, &json!("forbidden"), &json!(param)),
        "{call}: {v}"
    );
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with(&format!("{param}:")) && msg.contains(&format!("{naming:?}")),
        "{call}: {msg}"
    );
}

/// The whole matrix on the gateway `gw` (its database fresh).
async fn scoped_tokens_loosen_nothing(gw: &Gateway) {
    gw.state.set_admin_token(Some(ROOT));
    // The operator's tenants: `acme` fail-closed, expected-mode output
    // reservation with a small exposure, a weight; `beta` on the defaults
    // (whole-cap reservation).
    root_post(
        gw,
        json!({
            "name": "acme",
            "limits": {"tpm": 100_000, "tokens_per_day": 1_000_000},
            "model_limits": {"gpt-4o-mini": {"tpm": 50_000}},
            "end_user_limits": {"rpm": 10},
            "on_store_error": "fail_closed",
            "output_reservation": "expected",
            "max_exposure": 5_000,
            "expected_quantile": 0.9,
            "priority": "standard",
            "weight": 2
        }),
    )
    .await;
    root_post(
        gw,
        json!({"name": "acme-kid", "parent": "acme", "on_store_error": "fail_closed"}),
    )
    .await;
    root_post(gw, json!({"name": "beta", "on_store_error": "fail_closed"})).await;
    let acme = admin_token(gw, json!({"role": "admin", "tenant": "acme"})).await;
    let beta = admin_token(gw, json!({"role": "admin", "tenant": "beta"})).await;
    let (_, before) = admin_call(gw, Method::GET, "/admin/v1/tenants/acme", ROOT, None).await;

    // Its own tenant.
    for (patch, param) in [
        (json!({"limits": {"tpm": 999_999_999}}), "limits.tpm"),
        (
            json!({"limits": null, "on_store_error": "fail_open"}),
            "limits.tpm",
        ),
        (
            json!({"limits": {"tokens_per_day": null}}),
            "limits.tokens_per_day",
        ),
        (
            json!({"limits": {"tpm_burst": 500_000}}),
            "limits.tpm_burst",
        ),
        (
            json!({"model_limits": {"gpt-4o-mini": {"tpm": 60_000}}}),
            "model_limits.gpt-4o-mini.tpm",
        ),
        (
            json!({"model_limits": null}),
            "model_limits.gpt-4o-mini.tpm",
        ),
        (json!({"on_store_error": "fail_open"}), "on_store_error"),
        (json!({"shadow": true}), "shadow"),
        (json!({"end_user_limits": {"rpm": 1000}}), "end_user_limits"),
        (json!({"end_user_limits": null}), "end_user_limits"),
        (json!({"output_reservation": "cap"}), "output_reservation"),
        (json!({"max_exposure": 100_000_000}), "max_exposure"),
        (json!({"expected_quantile": 0.5}), "expected_quantile"),
        (json!({"priority": "interactive"}), "priority"),
        (json!({"weight": 100}), "weight"),
    ] {
        let call = format!("PATCH acme {patch}");
        let r = admin_call(
            gw,
            Method::PATCH,
            "/admin/v1/tenants/acme",
            &acme,
            Some(patch),
        )
        .await;
        assert_refused(&call, &r, param, "acme");
    }
    let (_, after) = admin_call(gw, Method::GET, "/admin/v1/tenants/acme", ROOT, None).await;
    assert_eq!(before, after, "nothing of acme was changed");
    // Lowered and added limits, descriptive fields: its own to change.
    for patch in [
        json!({"limits": {"tpm": 80_000, "rpm": 100}}),
        json!({"model_limits": {"gpt-4o-mini": {"tpm": 40_000}}}),
        json!({"shadow_limits": {"tpm": 10}, "on_short_output": "clamp"}),
        json!({"on_store_error": "fail_closed", "weight": 2}),
    ] {
        let (s, v) = admin_call(
            gw,
            Method::PATCH,
            "/admin/v1/tenants/acme",
            &acme,
            Some(patch.clone()),
        )
        .await;
        assert_eq!(s, 200, "PATCH acme {patch}: {v}");
    }

    // Below it: created, and an existing child changed.
    let kid = |extra: Value| {
        let mut body =
            json!({"name": "acme-new", "parent": "acme", "on_store_error": "fail_closed"});
        let b = body.as_object_mut().unwrap();
        for (k, v) in extra.as_object().unwrap() {
            match v.is_null() {
                true => b.remove(k),
                false => b.insert(k.clone(), v.clone()),
            };
        }
        body
    };
    for (method, path, token, body, param, root) in [
        (
            Method::POST,
            "/admin/v1/tenants",
            &acme,
            kid(json!({"on_store_error": "fail_open"})),
            "on_store_error",
            "acme",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            &acme,
            kid(json!({"on_store_error": null})),
            "on_store_error",
            "acme",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            &acme,
            kid(json!({"shadow": true})),
            "shadow",
            "acme",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            &acme,
            kid(json!({"max_exposure": 100_000_000})),
            "max_exposure",
            "acme",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            &acme,
            kid(json!({"expected_quantile": 0.5})),
            "expected_quantile",
            "acme",
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/acme-kid",
            &acme,
            json!({"on_store_error": "fail_open"}),
            "on_store_error",
            "acme",
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/acme-kid",
            &acme,
            json!({"shadow": true}),
            "shadow",
            "acme",
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/acme-kid",
            &acme,
            json!({"max_exposure": 5_001}),
            "max_exposure",
            "acme",
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/acme-kid",
            &acme,
            json!({"max_exposure": "1%"}),
            "max_exposure",
            "acme",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            &beta,
            json!({"name": "beta-kid", "parent": "beta", "on_store_error": "fail_closed", "output_reservation": "expected"}),
            "output_reservation",
            "beta",
        ),
        (
            Method::POST,
            "/admin/v1/tenants",
            &beta,
            json!({"name": "beta-kid", "parent": "beta", "on_store_error": "fail_closed", "shadow": true}),
            "shadow",
            "beta",
        ),
    ] {
        let call = format!("{method} {path} {body}");
        let r = admin_call(gw, method, path, token, Some(body)).await;
        assert_refused(&call, &r, param, root);
    }
    for name in ["acme-new", "beta-kid"] {
        let (s, _) = admin_call(
            gw,
            Method::GET,
            &format!("/admin/v1/tenants/{name}"),
            ROOT,
            None,
        )
        .await;
        assert_eq!(s, 404, "{name} was not created");
    }
    // What is as tight as the root, or tighter, is allowed.
    for (method, path, body) in [
        (
            Method::POST,
            "/admin/v1/tenants",
            kid(json!({"max_exposure": 4_000, "expected_quantile": 0.95})),
        ),
        (
            Method::PATCH,
            "/admin/v1/tenants/acme-kid",
            json!({"output_reservation": "cap", "priority": "interactive"}),
        ),
    ] {
        let (s, v) = admin_call(gw, method.clone(), path, &acme, Some(body)).await;
        assert!(s == 200 || s == 201, "{method} {path}: {v}");
    }
    // The parent-limit check keeps its 400.
    let (s, v) = admin_call(
        gw,
        Method::PATCH,
        "/admin/v1/tenants/acme-kid",
        &acme,
        Some(json!({"limits": {"tpm": 200_000}})),
    )
    .await;
    assert_eq!(
        (s, &v["error"]["param"]),
        (400, &json!("limits.tpm")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("parent tenant \"acme\""),
        "{v}"
    );
    // The operator's token is bound by none of it.
    let (s, v) = admin_call(
        gw,
        Method::PATCH,
        "/admin/v1/tenants/acme",
        ROOT,
        Some(json!({"limits": {"tpm": 999_999}, "on_store_error": "fail_open"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn a_scoped_token_cannot_loosen_its_own_tenant_nor_set_a_child_looser_on_sqlite() {
    end_user_key();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("control.db").display());
    let gw = config(&mock.base_url(), url).start().await;
    scoped_tokens_loosen_nothing(&gw).await;
}

#[tokio::test]
async fn a_scoped_token_cannot_loosen_its_own_tenant_nor_set_a_child_looser_on_postgres() {
    end_user_key();
    let pg = PgServer::start();
    let mock = start_mock().await;
    let gw = config(&mock.base_url(), pg.url()).start().await;
    scoped_tokens_loosen_nothing(&gw).await;
}

/// A change computed from a stale snapshot writes the whole tenant: the
/// check under the lock sees the limit the operator lowered meanwhile.
#[tokio::test]
async fn a_scoped_tokens_change_from_a_stale_snapshot_cannot_write_back_a_lowered_limit() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.db");
    let url = format!("sqlite://{}", path.display());
    let gw = config(&mock.base_url(), url.clone()).start().await;
    gw.state.set_admin_token(Some(ROOT));
    root_post(&gw, json!({"name": "team", "limits": {"tpm": 100_000}})).await;
    let token = admin_token(&gw, json!({"role": "admin", "tenant": "team"})).await;
    // The operator lowers `team` on another gateway; this one has not read
    // it yet (the counter is left alone).
    let db = Db::open(&url).await.unwrap();
    sqlx::query(
        "UPDATE tenants SET spec = '{\"name\":\"team\",\"limits\":{\"tpm\":1000}}' WHERE name = 'team'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let r = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/team",
        &token,
        Some(json!({"on_short_output": "clamp"})),
    )
    .await;
    assert_refused("PATCH team from a stale snapshot", &r, "limits.tpm", "team");
    let snap = runtime::load(&db).await.unwrap();
    let team = &snap.tenants.iter().find(|t| t.spec.name == "team").unwrap();
    assert_eq!(team.spec.limits.tpm, Some(1000), "the lowered limit stays");
    db.pool().close().await;
}
