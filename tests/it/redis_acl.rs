//! The Redis permissions documented in docs/OPERATIONS.md are enough
//! ("Redis permissions"): the gateway runs
//! against a Redis user created with exactly the documented `ACL SETUSER`
//! line — reservations, settlements, a stream with its extensions, the
//! admin list, readiness — and Redis logs no permission denial.

use std::path::Path;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::support::redis_server::RedisServer;
use crate::support::*;

const PASSWORD: &str = "acl-test-password";
const ADMIN: &str = "acl-admin-token";

/// The `ACL SETUSER` line of docs/OPERATIONS.md, with the test's password.
fn documented_acl() -> Vec<String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/OPERATIONS.md"))
            .unwrap();
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER budgetgate "))
        .expect("docs/OPERATIONS.md has an ACL SETUSER line");
    line.replace("CHANGE-ME", PASSWORD)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_as_the_documented_redis_user() {
    let redis = RedisServer::start();
    let acl = documented_acl();
    let args: Vec<&str> = acl.iter().map(String::as_str).collect();
    assert_eq!(redis.cli(&args).trim(), "OK", "ACL SETUSER failed: {acl:?}");
    redis.cli(&["ACL", "LOG", "RESET"]);

    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gw.toml");
    let mut config = TestConfig::standard(
        &mock.base_url(),
        30,
        limits()
            .rpm(100)
            .tpm(100_000)
            .max_concurrent(4)
            .tokens_per_day(1_000_000),
    )
    .redis(&format!(
        "redis://budgetgate:{PASSWORD}@127.0.0.1:{}/0",
        redis.port()
    ));
    config.store.timeout_ms = Some(1000);
    config.write_to(&cfg);
    let gw = GatewayProcess::start(&cfg, &[("BUDGETGATE_ADMIN_TOKEN", ADMIN)]).await;
    let client = reqwest::Client::new();
    let chat = |stream: bool, max_tokens: Option<u64>| {
        let mut body = json!({"model": "gpt-4o-mini", "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]});
        if let Some(m) = max_tokens {
            body["max_tokens"] = json!(m);
        }
        client
            .post(format!("{}/v1/chat/completions", gw.root))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    for _ in 0..3 {
        let r = chat(false, Some(10)).await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    // An uncapped stream: its reservation is extended as output arrives.
    let r = chat(true, None).await.unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = body.next().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&text).contains("data: [DONE]"));

    let ready = client
        .get(format!("{}/readyz", gw.root))
        .send()
        .await
        .unwrap();
    assert_eq!(
        ready.status(),
        200,
        "ACL LOG: {}\nlogs:\n{}",
        redis.cli(&["ACL", "LOG"]),
        gw.dump_logs()
    );
    let list: Value = admin_get(&gw, "/admin/v1/budgets", Some(ADMIN))
        .await
        .json()
        .await
        .unwrap();
    let day = list["tenants"][0]["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["budget"] == "tokens_per_day")
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    assert!(day["remaining"].as_i64().unwrap() < 1_000_000, "{day}");

    // Settlements are applied by then (the stream ended, responses are sent).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let denials = redis.cli(&["ACL", "LOG"]);
    assert!(
        denials.trim().is_empty(),
        "Redis denied commands: {denials}"
    );
    assert!(
        gw.logs_with("budget store call failed; pausing store calls")
            .is_empty(),
        "{}",
        gw.dump_logs()
    );
    assert!(
        gw.logs_with("settle failed, retrying").is_empty(),
        "{}",
        gw.dump_logs()
    );
}
