//! The embedded store survives restarts: its state is
//! snapshotted every second and at shutdown, so a tenant's day quota is
//! where it was after SIGTERM and a restart, and after SIGKILL it lost at
//! most the usage of the last snapshot interval.
//!
//! Run: `cargo test --all-features --test memory_persistence`.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

const ADMIN: &str = "admin-secret-for-tests";
const DAY: i64 = 1_000_000;

fn cfg(mock: &str, snapshot: &Path) -> TestConfig {
    let mut c = TestConfig::standard(mock, 50, limits().tokens_per_day(DAY as u64));
    c.store.kind = Some("memory".into());
    c.store.snapshot_path = Some(snapshot.display().to_string());
    c
}

async fn start(cfg: &Path) -> GatewayProcess {
    GatewayProcess::start(cfg, &[("BUDGETGATE_ADMIN_TOKEN", ADMIN)]).await
}

async fn chat(root: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{root}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "max_tokens": 20,
            "messages": [{"role": "user", "content": "tell me something"}]}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The tenant's `tokens_per_day` remaining, from the admin API.
async fn day_remaining(root: &str) -> i64 {
    let v: Value = reqwest::Client::new()
        .get(format!("{root}/admin/v1/tenants/t1/budgets"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["budgets"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["budget"] == "tokens_per_day"))
        .and_then(|b| b["remaining"].as_i64())
        .unwrap_or_else(|| panic!("no tokens_per_day in {v}"))
}

/// Usage settles after the answer: waits until the quota stops moving.
async fn settled_remaining(root: &str) -> i64 {
    let mut last = day_remaining(root).await;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = day_remaining(root).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn after_sigterm_and_a_restart_the_day_quota_is_where_it_was() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("budgetgate.toml");
    let snapshot = dir.path().join("state/memory-store.json");
    cfg(&mock.base_url(), &snapshot).write_to(&path);

    let mut gw = start(&path).await;
    for _ in 0..5 {
        assert_eq!(chat(&gw.root).await, 200);
    }
    let before = settled_remaining(&gw.root).await;
    assert!(before < DAY, "the requests used some of the day quota");
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).await.success());
    assert!(snapshot.exists(), "written at shutdown");

    let gw = start(&path).await;
    assert_eq!(day_remaining(&gw.root).await, before, "kept across SIGTERM");
    // The lock file refuses a second gateway on the same snapshot.
    let other = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .expect("run budgetgate");
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "{stderr}");
    assert!(
        stderr.contains("in use by another budgetgate process"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn after_sigkill_at_most_one_snapshot_interval_is_lost() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("budgetgate.toml");
    let snapshot = dir.path().join("memory-store.json");
    cfg(&mock.base_url(), &snapshot).write_to(&path);

    let mut gw = start(&path).await;
    for _ in 0..5 {
        assert_eq!(chat(&gw.root).await, 200);
    }
    let settled = settled_remaining(&gw.root).await;
    // Longer than one interval with nothing changing: the snapshot has it all.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Usage in the last interval before the kill may be lost, no more.
    for _ in 0..3 {
        assert_eq!(chat(&gw.root).await, 200);
    }
    let last = settled_remaining(&gw.root).await;
    assert!(last < settled);
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10)).await;

    let gw = start(&path).await;
    let after = day_remaining(&gw.root).await;
    println!("day quota remaining: {settled} before the last interval, {last} at SIGKILL, {after} after the restart");
    assert!(
        (last..=settled).contains(&after),
        "restored {after}: at most the last interval's usage lost (between {last} and {settled})"
    );
}
