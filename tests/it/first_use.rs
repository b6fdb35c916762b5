//! What a new user tripped on. Faults guarded against:
//! a tenant's `created_at` / `updated_at` came in Unix microseconds where
//! a key's (and CONTROL.md's) are seconds; docs/openapi.json said the unit
//! of no timestamp the API answers with.

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::*;

const ROOT: &str = "first-use-root-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_timestamps_are_unix_seconds_like_a_keys() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10_000));
    cfg.control.database_url = Some(format!("sqlite://{}", dir.path().join("c.db").display()));
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let noon_secs = NOON / 1_000_000;
    let (s, created) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "first-use"})),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    assert_eq!(created["created_at"], noon_secs, "{created}");
    assert_eq!(created["updated_at"], noon_secs, "{created}");
    gw.clock.advance(90_000_000);
    let (s, patched) = admin_call(
        &gw,
        Method::PATCH,
        "/admin/v1/tenants/first-use",
        ROOT,
        Some(json!({"limits": {"tpm": 2000}})),
    )
    .await;
    assert_eq!(s, 200, "{patched}");
    assert_eq!(patched["created_at"], noon_secs);
    assert_eq!(patched["updated_at"], noon_secs + 90, "{patched}");
    let (s, key) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants/first-use/keys",
        ROOT,
        Some(json!({"id": "k"})),
    )
    .await;
    assert_eq!(s, 201, "{key}");
    assert_eq!(
        key["created_at"],
        noon_secs + 90,
        "the same unit as a key's"
    );
    let (_, listed) = admin_call(&gw, Method::GET, "/admin/v1/tenants", ROOT, None).await;
    let row = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "first-use")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(row["created_at"], noon_secs, "{listed}");
}

/// Every timestamp or duration property of docs/openapi.json's schemas
/// names its unit, and the tenant's and key's say Unix seconds.
#[test]
fn the_openapi_document_names_each_timestamps_unit() {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_path("docs/openapi.json")).unwrap())
            .unwrap();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut timestamps = 0;
    for (schema, s) in schemas {
        let Some(props) = s["properties"].as_object() else {
            continue;
        };
        for (name, p) in props {
            let timed = name == "at"
                || name.ends_with("_at")
                || name.ends_with("_until")
                || name.ends_with("_micros");
            if !timed {
                continue;
            }
            timestamps += 1;
            let said = p["description"].as_str().unwrap_or("");
            assert!(
                ["Unix seconds", "microseconds"]
                    .iter()
                    .any(|u| said.contains(u)),
                "{schema}.{name} does not name its unit: {p}"
            );
        }
    }
    assert!(timestamps >= 8, "{timestamps} timestamps");
    for (schema, field) in [
        ("TenantView", "created_at"),
        ("TenantView", "updated_at"),
        ("KeyView", "created_at"),
        ("KeyView", "revoked_at"),
        ("KeyCreate", "expires_at"),
    ] {
        let said = schemas[schema]["properties"][field]["description"]
            .as_str()
            .unwrap_or_else(|| panic!("{schema}.{field} is not described"));
        assert!(said.starts_with("Unix seconds"), "{schema}.{field}: {said}");
    }
}
