//! A 503 caused by one of the gateway's own stores says so: `type:
//! "server_error"` and a code naming the store (`budget_store_unavailable`,
//! `ledger_unavailable`, `control_database_unavailable`). Fault guarded
//! against: the budget page's store failure and the ledger's answered
//! `upstream_error` (blaming the provider), the control database's
//! `invalid_request_error` (blaming the caller); clients retry neither
//! the same way as a gateway fault.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::StoreError;
use budgetgate::clock::{Clock, ManualClock};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::Connection;

use crate::support::store_spy::{Call, Hooks, Spy};
use crate::support::*;

const ROOT: &str = "store-errors-root-token";

#[derive(Default)]
struct Down(AtomicBool);

#[async_trait]
impl Hooks for Down {
    async fn before(&self, call: Call) -> Result<u64, StoreError> {
        if call == Call::Inspect && self.0.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        Ok(0)
    }
}

fn assert_server_error(status: u16, v: &Value, code: &str) {
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_routes_answer_a_store_outage_with_budget_store_unavailable() {
    let mock = start_mock().await;
    let clock = ManualClock::new(NOON);
    let c: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = Arc::new(Spy {
        inner: Arc::new(MemoryStore::new(c)),
        hooks: Down::default(),
    });
    let gw = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10_000))
        .start_with(clock, store.clone())
        .await;
    gw.state.set_admin_token(Some(ROOT));
    store.0.store(true, Ordering::SeqCst);
    for path in ["/admin/v1/budgets", "/admin/v1/tenants/t1/budgets"] {
        let (s, v) = admin_call(&gw, Method::GET, path, ROOT, None).await;
        assert_server_error(s, &v, "budget_store_unavailable");
    }
    let r = reqwest::Client::new()
        .get(format!("{}/budget", gw.base_url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    assert_server_error(s, &r.json().await.unwrap(), "budget_store_unavailable");
}

/// Drops `table` of the SQLite database at `db` behind the gateway's back.
async fn drop_table(db: &std::path::Path, table: &'static str) {
    let mut conn = sqlx::sqlite::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the test's database");
    // The table is one of this file's literals.
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&mut conn)
        .await
        .expect("drop the table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_ledger_or_control_database_answers_503_naming_it() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tpm(10_000));
    cfg.control.database_url = Some(format!("sqlite://{}", db.display()));
    let gw = cfg.start().await;
    gw.state.set_admin_token(Some(ROOT));
    let (s, v) = admin_call(&gw, Method::GET, "/admin/v1/spend", ROOT, None).await;
    assert_eq!(s, 200, "{v}");

    drop_table(&db, "spend_ledger").await;
    for path in ["/admin/v1/spend", "/admin/v1/spend/rows"] {
        let (s, v) = admin_call(&gw, Method::GET, path, ROOT, None).await;
        assert_server_error(s, &v, "ledger_unavailable");
    }

    drop_table(&db, "audit").await;
    let (s, v) = admin_call(
        &gw,
        Method::POST,
        "/admin/v1/tenants",
        ROOT,
        Some(json!({"name": "late"})),
    )
    .await;
    assert_server_error(s, &v, "control_database_unavailable");
}
