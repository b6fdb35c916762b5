//! Hot reload on the real binary (issue 6, acceptance "Reload"): a lowered
//! TPM in the file applies to the next request without a restart (in-place
//! writes, rename-on-save and SIGHUP); a broken file keeps the running
//! policy and logs every error with its path; a stream started before the
//! reload completes under the policy it started with.

mod common;
#[path = "support/process.rs"]
mod process;

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use common::{config, start_mock, KEY};
use process::GatewayProcess;

fn cfg(mock: &str, tpm: u64) -> String {
    config(mock, 50, &format!("tpm = {tpm}"), "")
}

/// Writes `text` by truncating and rewriting the file in place.
fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Writes `text` the way many editors save: a temporary file renamed over the original.
fn write_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn chat(root: &str, max_tokens: u64) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{root}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> u64 {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn config_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("budgetgate.toml");
    write_in_place(&p, text);
    p
}

fn version(line: &Value) -> String {
    line.pointer("/fields/policy_version")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no policy_version in {line}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn lowering_tpm_in_the_file_applies_to_the_next_request() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(dir.path(), &cfg(&mock.base_url(), 10_000));
    let gw = GatewayProcess::start(&path, &[]).await;
    let v0 = version(&gw.wait_log("budgetgate listening", 1).await[0]);
    gw.wait_log("watching the config file for changes", 1).await;

    let r = chat(&gw.root, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 10_000);

    // In place.
    write_in_place(&path, &cfg(&mock.base_url(), 500));
    let reloaded = gw.wait_log("policy reloaded", 1).await;
    let v1 = version(&reloaded[0]);
    assert_ne!(v1, v0);
    assert_eq!(reloaded[0].pointer("/fields/old_version"), Some(&json!(v0)));
    assert_eq!(
        reloaded[0].pointer("/fields/trigger"),
        Some(&json!("file_change"))
    );
    let r = chat(&gw.root, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 500);
    // Lowering clamps: what was left (≈ 10 000) is now at most the new capacity.
    assert!(header(&r, "x-ratelimit-remaining-tokens") < 500);

    // Rename-on-save.
    write_by_rename(&path, &cfg(&mock.base_url(), 400));
    let reloaded = gw.wait_log("policy reloaded", 2).await;
    assert_ne!(version(&reloaded[1]), v1);
    let r = chat(&gw.root, 20).await;
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 400);

    // A file that is rewritten with the same bytes is not reloaded again.
    write_in_place(&path, &cfg(&mock.base_url(), 400));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(gw.logs_with("policy reloaded").len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_file_keeps_the_running_policy_and_logs_every_error() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let good = cfg(&mock.base_url(), 1000);
    let path = config_file(dir.path(), &good);
    let gw = GatewayProcess::start(&path, &[]).await;
    let v0 = version(&gw.wait_log("budgetgate listening", 1).await[0]);
    gw.wait_log("watching the config file for changes", 1).await;

    // Two validation errors.
    let broken = good.replace("tpm = 1000", "tpm = -5").replace(
        "upstreams = [\"mock\"]\nencoding = \"o200k_base\"",
        "upstreams = [\"nope\"]\nencoding = \"o200k_base\"",
    );
    write_in_place(&path, &broken);
    let rejected = gw
        .wait_log("config reload rejected; the running policy stays", 1)
        .await;
    assert_eq!(rejected[0].pointer("/fields/errors"), Some(&json!(2)));
    assert_eq!(version(&rejected[0]), v0);
    let errors: Vec<String> = gw
        .logs_with("config reload: invalid")
        .iter()
        .map(|l| {
            l.pointer("/fields/error")
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e == "tenants[0].limits.tpm: must be > 0"),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e == "models[0].upstreams[0]: unknown upstream \"nope\""),
        "{errors:?}"
    );
    let r = chat(&gw.root, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 1000);

    // Not even TOML.
    write_in_place(&path, "[[tenants]\nname = ");
    gw.wait_log("config reload rejected; the running policy stays", 2)
        .await;
    let r = chat(&gw.root, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 1000);

    // Fixed: applies.
    write_in_place(&path, &cfg(&mock.base_url(), 700));
    gw.wait_log("policy reloaded", 1).await;
    let r = chat(&gw.root, 20).await;
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 700);
    assert!(gw.logs_with("policy reloaded").len() == 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_started_before_the_reload_completes() {
    let mock = start_mock().await;
    mock.state.set_token_delay(Duration::from_millis(50));
    mock.state.set_output_tokens(60);
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(dir.path(), &cfg(&mock.base_url(), 10_000));
    let gw = GatewayProcess::start(&path, &[]).await;
    gw.wait_log("watching the config file for changes", 1).await;

    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root))
        .bearer_auth(KEY)
        .json(
            &json!({"model": "gpt-4o-mini", "max_tokens": 200, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let first = body.next().await.expect("a first chunk").unwrap();
    text.push_str(&String::from_utf8_lossy(&first));

    // The stream reserved ~210 tokens; the new policy's capacity is 100.
    write_in_place(&path, &cfg(&mock.base_url(), 100));
    gw.wait_log("policy reloaded", 1).await;
    let r = chat(&gw.root, 200).await;
    assert_eq!(r.status(), 429, "the new policy applies to new requests");

    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"stop\""), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!(
        text.matches("\"content\":").count() as u64,
        // role chunk + 60 tokens (the role chunk carries an empty content).
        61,
        "every token arrived"
    );
    let finished = gw.wait_log("stream finished", 1).await;
    assert_eq!(
        finished[0].pointer("/fields/ending"),
        Some(&json!("Completed"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_a_file_the_watcher_cannot_see() {
    let mock = start_mock().await;
    // The config path is a symlink in one directory to a file in another:
    // editing the target makes no event in the watched directory, so only
    // SIGHUP reloads it.
    let watched = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = config_file(elsewhere.path(), &cfg(&mock.base_url(), 1000));
    let link = watched.path().join("budgetgate.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let gw = GatewayProcess::start(&link, &[]).await;
    gw.wait_log("watching the config file for changes", 1).await;

    write_in_place(&target, &cfg(&mock.base_url(), 300));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(gw.logs_with("policy reloaded").is_empty());
    let r = chat(&gw.root, 20).await;
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 1000);

    gw.signal("HUP");
    let reloaded = gw.wait_log("policy reloaded", 1).await;
    assert_eq!(
        reloaded[0].pointer("/fields/trigger"),
        Some(&json!("sighup"))
    );
    let r = chat(&gw.root, 20).await;
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 300);

    // A restart-only change is reported and the running value kept.
    write_in_place(
        &target,
        &cfg(&mock.base_url(), 200).replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\""),
    );
    gw.signal("HUP");
    gw.wait_log("policy reloaded", 2).await;
    let warned = gw.logs_with(
        "config reload: this setting changed but takes effect only after a restart; keeping the running value",
    );
    assert_eq!(warned.len(), 1, "{}", gw.dump_logs());
    assert_eq!(
        warned[0].pointer("/fields/setting"),
        Some(&json!("server.listen"))
    );
    let r = chat(&gw.root, 20).await;
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), 200);
}

/// An rpm raise by reload reaches a tenant that is being refused (issue 16,
/// finding 3): the first refusal under the new policy brings the bucket
/// under the new rate, its retry hint is what the store does next, and the
/// next request after it is admitted (the tenant used to stay refused for
/// ~30 s: the bucket kept refilling at 2/min until a request was admitted).
#[tokio::test(flavor = "multi_thread")]
async fn an_rpm_raise_by_reload_admits_a_refused_tenant() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let rpm = |n: u64| config(&mock.base_url(), 50, &format!("rpm = {n}"), "");
    let path = config_file(dir.path(), &rpm(2));
    let gw = GatewayProcess::start(&path, &[]).await;
    gw.wait_log("watching the config file for changes", 1).await;
    assert_eq!(chat(&gw.root, 5).await.status(), 200);
    assert_eq!(chat(&gw.root, 5).await.status(), 200);
    let r = chat(&gw.root, 5).await;
    assert_eq!(r.status(), 429);
    assert!(header(&r, "retry-after") >= 20, "one request at 2/min");

    write_in_place(&path, &rpm(600));
    gw.wait_log("policy reloaded", 1).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = chat(&gw.root, 5).await;
        statuses.push(r.status().as_u16());
        if r.status() == 200 {
            break;
        }
        let wait = header(&r, "retry-after-ms");
        assert!(wait <= 100, "one request at 600/min: {wait} ms");
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
    assert!(
        statuses.len() <= 2,
        "admitted once its hint passed: {statuses:?}"
    );
}
