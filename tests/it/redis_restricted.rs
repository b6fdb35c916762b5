//! Restricted Redis users. Managed services and
//! proxies restrict commands: a user denied `SCRIPT` (no `SCRIPT LOAD`) but
//! allowed `EVAL` must work; a user denied every scripting command must
//! make the gateway refuse to start, naming the permission; and readiness
//! must mean "scripts run", not "PING answers".
//!
//! Run: `cargo test --all-features --test redis_restricted` (needs `redis-server`).

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::*;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::Costs;
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveOutcome, ReserveRequest, Scope,
    SettleOutcome, Settlement, Step,
};

fn user_url(redis: &RedisServer, user: &str) -> String {
    format!("redis://{user}:pw@127.0.0.1:{}/", redis.port())
}

fn acl(redis: &RedisServer, user: &str, rules: &[&str]) {
    let mut args = vec!["acl", "setuser", user, "reset", "on", ">pw", "~*"];
    args.extend_from_slice(rules);
    assert_eq!(
        redis.cli(&args).trim(),
        "OK",
        "ACL SETUSER {user} {rules:?}"
    );
}

fn request(ks: &KeySpace, id: &str) -> ReserveRequest {
    let scope = Scope::Tenant("acme".into());
    ReserveRequest {
        share: None,
        id: id.into(),
        costs: Costs::tokens(10),
        common: vec![BudgetSpec {
            key: ks.budget(&scope, BudgetName::Tpm).into(),
            scope,
            name: BudgetName::Tpm,
            kind: BudgetKind::Bucket {
                per_minute: 1000,
                burst: 1000,
            },
            refund_unused: true,
            shadow: false,
        }],
        candidates: vec![vec![]],
        slot_lease_micros: 10_000_000,
        hold_ttl_micros: 60_000_000,
        requester: Default::default(),
    }
}

#[tokio::test]
async fn a_user_denied_the_script_command_works_through_eval() {
    let redis = RedisServer::start();
    acl(&redis, "app", &["+@all", "-script"]);
    // The restriction is real: this user cannot load a script.
    let refused = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis.port().to_string(),
            "--user",
            "app",
            "--pass",
            "pw",
        ])
        .args(["script", "load", "return 1"])
        .output()
        .expect("redis-cli");
    assert!(
        String::from_utf8_lossy(&refused.stdout).contains("NOPERM"),
        "{refused:?}"
    );

    let ks = KeySpace::new("bgacl", "d");
    let store = RedisStore::connect(&user_url(&redis, "app"), Duration::from_secs(2), ks.clone())
        .await
        .expect("a -script user connects");
    let r = store.reserve(&request(&ks, "r1")).await.expect("reserve");
    assert!(matches!(r, ReserveOutcome::Admitted(_)), "{r:?}");
    let s = store
        .settle(
            "r1",
            &Settlement {
                actual_tokens: 4,
                upstream_failed: false,
                actual: Default::default(),
            },
        )
        .await
        .expect("settle");
    assert!(
        matches!(s, SettleOutcome::Settled { refunded: 6, .. }),
        "{s:?}"
    );
    assert_eq!(
        store.extend("r1", &Step::tokens(5)).await.ok().map(|_| ()),
        Some(())
    );
    store.inspect(&[]).await.expect("ready");
    // Scripts flushed (a Redis restart, a failover): EVAL loads them again.
    assert_eq!(redis.cli(&["script", "flush"]).trim(), "OK");
    let r = store.reserve(&request(&ks, "r2")).await.expect("reserve");
    assert!(matches!(r, ReserveOutcome::Admitted(_)), "{r:?}");
}

#[tokio::test]
async fn a_user_denied_scripting_is_refused_at_start_naming_the_permission() {
    let redis = RedisServer::start();
    acl(&redis, "noscript", &["+@all", "-@scripting"]);
    let err = match RedisStore::connect(
        &user_url(&redis, "noscript"),
        Duration::from_secs(2),
        KeySpace::new("bgacl", "d"),
    )
    .await
    {
        Ok(_) => panic!("a user that may not run scripts must not be accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("@scripting"), "{err}");

    // The binary: exits with the message instead of serving 503s.
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("acl.toml");
    TestConfig::standard("http://127.0.0.1:9", 16, limits())
        .redis(&user_url(&redis, "noscript"))
        .write_to(&cfg);
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the gateway exits instead of serving")
    .expect("run budgetgate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("@scripting"), "{stderr}");
}

#[tokio::test]
async fn readiness_is_a_script_round_trip_not_a_ping() {
    let redis = RedisServer::start();
    acl(&redis, "app", &["+@all"]);
    let store = RedisStore::connect(
        &user_url(&redis, "app"),
        Duration::from_secs(2),
        KeySpace::new("bgacl", "d"),
    )
    .await
    .expect("connect");
    store.inspect(&[]).await.expect("ready while scripts run");
    // Scripting revoked while running: PING still answers, scripts do not.
    acl(&redis, "app", &["+@all", "-@scripting"]);
    let err = store
        .inspect(&[])
        .await
        .expect_err("not ready when scripts cannot run");
    assert!(err.to_string().contains("@scripting"), "{err}");
    acl(&redis, "app", &["+@all"]);
    store.inspect(&[]).await.expect("ready again");
}

/// The least-privilege user of docs/OPERATIONS.md runs every operation.
#[tokio::test]
async fn the_documented_least_privilege_user_runs_every_operation() {
    let redis = RedisServer::start();
    let doc = include_str!("../../docs/OPERATIONS.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER budgetgate "))
        .expect("the ACL line in docs/OPERATIONS.md");
    let mut args: Vec<&str> = line.split_whitespace().collect();
    // The password of the example.
    for a in args.iter_mut() {
        if *a == ">CHANGE-ME" {
            *a = ">pw";
        }
    }
    assert_eq!(redis.cli(&args).trim(), "OK", "{line}");
    let ks = KeySpace::new("budgetgate", "default");
    let store = RedisStore::connect(
        &user_url(&redis, "budgetgate"),
        Duration::from_secs(2),
        ks.clone(),
    )
    .await
    .expect("connect as the documented user");
    let mut req = request(&ks, "r1");
    let scope = Scope::Tenant("acme".into());
    req.common.push(BudgetSpec {
        key: ks.budget(&scope, BudgetName::MaxConcurrent).into(),
        scope,
        name: BudgetName::MaxConcurrent,
        kind: BudgetKind::Concurrency { max: 2 },
        refund_unused: true,
        shadow: false,
    });
    let r = store.reserve(&req).await.expect("reserve");
    assert!(matches!(r, ReserveOutcome::Admitted(_)), "{r:?}");
    store.extend("r1", &Step::tokens(5)).await.expect("extend");
    store.renew("r1").await.expect("renew");
    let s = store
        .settle(
            "r1",
            &Settlement {
                actual_tokens: 4,
                upstream_failed: false,
                actual: Default::default(),
            },
        )
        .await
        .expect("settle");
    assert!(matches!(s, SettleOutcome::Settled { .. }), "{s:?}");
    store.inspect(&req.common).await.expect("inspect");
    store.inspect(&[]).await.expect("ready");
    store.read_hold("r1").await.expect("read the hold");
}
