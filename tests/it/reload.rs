//! Hot reload on the real binary: a lowered
//! TPM in the file applies to the next request without a restart (in-place
//! writes, rename-on-save and SIGHUP); a broken file keeps the running
//! policy and logs every error with its path; a stream started before the
//! reload completes under the policy it started with.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::support::*;

fn cfg(mock: &str, tpm: u64) -> TestConfig {
    TestConfig::standard(mock, 50, limits().tpm(tpm))
}

/// Writes `config` the way many editors save: a temporary file renamed
/// over the original.
fn write_by_rename(path: &Path, config: &TestConfig) {
    let tmp = path.with_extension("toml.tmp");
    config.write_to(&tmp);
    std::fs::rename(&tmp, path).unwrap();
}

async fn chat(gw: &GatewayProcess, max_tokens: u64) -> reqwest::Response {
    post_chat(gw, KEY, &hi(max_tokens)).await
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
    let path = cfg(&mock.base_url(), 10_000).write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    let v0 = version(&gw.wait_log("budgetgate listening", 1).await[0]);
    gw.wait_log("watching the config file for changes", 1).await;

    let r = chat(&gw, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 10_000);

    // In place.
    cfg(&mock.base_url(), 500).write_to(&path);
    let reloaded = gw.wait_log("policy reloaded", 1).await;
    let v1 = version(&reloaded[0]);
    assert_ne!(v1, v0);
    assert_eq!(reloaded[0].pointer("/fields/old_version"), Some(&json!(v0)));
    assert_eq!(
        reloaded[0].pointer("/fields/trigger"),
        Some(&json!("file_change"))
    );
    let r = chat(&gw, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 500);
    // Lowering clamps: what was left (≈ 10 000) is now at most the new capacity.
    assert!(header_u64(&r, "x-ratelimit-remaining-tokens") < 500);

    // Rename-on-save.
    write_by_rename(&path, &cfg(&mock.base_url(), 400));
    let reloaded = gw.wait_log("policy reloaded", 2).await;
    assert_ne!(version(&reloaded[1]), v1);
    let r = chat(&gw, 20).await;
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 400);

    // A file that is rewritten with the same bytes is not reloaded again.
    cfg(&mock.base_url(), 400).write_to(&path);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(gw.logs_with("policy reloaded").len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_file_keeps_the_running_policy_and_logs_every_error() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let good = cfg(&mock.base_url(), 1000);
    let path = good.write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    let v0 = version(&gw.wait_log("budgetgate listening", 1).await[0]);
    gw.wait_log("watching the config file for changes", 1).await;

    // Two validation errors.
    let mut broken = good.clone();
    broken.tenant("t1").limits.tpm = Some(-5);
    broken.model("gpt-4o-mini").upstreams = vec!["nope".into()];
    broken.write_to(&path);
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
    let r = chat(&gw, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 1000);

    // Not even TOML.
    std::fs::write(&path, "[[tenants]\nname = ").unwrap();
    gw.wait_log("config reload rejected; the running policy stays", 2)
        .await;
    let r = chat(&gw, 20).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 1000);

    // Fixed: applies.
    cfg(&mock.base_url(), 700).write_to(&path);
    gw.wait_log("policy reloaded", 1).await;
    let r = chat(&gw, 20).await;
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 700);
    assert!(gw.logs_with("policy reloaded").len() == 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn restoring_the_good_file_after_a_rejected_reload_is_logged() {
    const VALID_AGAIN: &str = "config reload: the file is valid again after a rejected reload";
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let good = cfg(&mock.base_url(), 1000);
    let path = good.write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    let v0 = version(&gw.wait_log("budgetgate listening", 1).await[0]);
    gw.wait_log("watching the config file for changes", 1).await;

    let mut broken = good.clone();
    broken.tenant("t1").limits.tpm = Some(-5);
    broken.write_to(&path);
    gw.wait_log("config reload rejected; the running policy stays", 1)
        .await;
    assert!(gw.logs_with(VALID_AGAIN).is_empty(), "{}", gw.dump_logs());

    // The running policy's own bytes back: nothing to install, and the
    // operator still learns the file is fine again.
    good.write_to(&path);
    let line = &gw.wait_log(VALID_AGAIN, 1).await[0];
    assert_eq!(version(line), v0);
    assert_eq!(line.pointer("/fields/trigger"), Some(&json!("file_change")));
    assert!(gw.logs_with("policy reloaded").is_empty());

    // Said once: a later valid reload is an ordinary one.
    cfg(&mock.base_url(), 700).write_to(&path);
    gw.wait_log("policy reloaded", 1).await;
    assert_eq!(gw.logs_with(VALID_AGAIN).len(), 1, "{}", gw.dump_logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_started_before_the_reload_completes() {
    let mock = start_mock().await;
    mock.state.set_token_delay(Duration::from_millis(50));
    mock.state.set_output_tokens(60);
    let dir = tempfile::tempdir().unwrap();
    let path = cfg(&mock.base_url(), 10_000).write(dir.path());
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
    cfg(&mock.base_url(), 100).write_to(&path);
    gw.wait_log("policy reloaded", 1).await;
    let r = chat(&gw, 200).await;
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
        Some(&json!("completed"))
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
    let target = cfg(&mock.base_url(), 1000).write(elsewhere.path());
    let link = watched.path().join("budgetgate.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let gw = GatewayProcess::start(&link, &[]).await;
    gw.wait_log("watching the config file for changes", 1).await;

    cfg(&mock.base_url(), 300).write_to(&target);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(gw.logs_with("policy reloaded").is_empty());
    let r = chat(&gw, 20).await;
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 1000);

    gw.signal("HUP");
    let reloaded = gw.wait_log("policy reloaded", 1).await;
    assert_eq!(
        reloaded[0].pointer("/fields/trigger"),
        Some(&json!("sighup"))
    );
    let r = chat(&gw, 20).await;
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 300);

    // A restart-only change is reported and the running value kept.
    let mut moved = cfg(&mock.base_url(), 200);
    moved.server.listen = Some("127.0.0.1:1".into());
    moved.write_to(&target);
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
    let r = chat(&gw, 20).await;
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 200);
}

/// An rpm raise by reload reaches a tenant that is being refused:
/// the first refusal under the new policy brings the bucket
/// under the new rate, its retry hint is what the store does next, and the
/// next request after it is admitted (the tenant used to stay refused for
/// ~30 s: the bucket kept refilling at 2/min until a request was admitted).
#[tokio::test(flavor = "multi_thread")]
async fn an_rpm_raise_by_reload_admits_a_refused_tenant() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let rpm = |n: u64| TestConfig::standard(&mock.base_url(), 50, limits().rpm(n));
    let path = rpm(2).write(dir.path());
    let gw = GatewayProcess::start(&path, &[]).await;
    gw.wait_log("watching the config file for changes", 1).await;
    assert_eq!(chat(&gw, 5).await.status(), 200);
    assert_eq!(chat(&gw, 5).await.status(), 200);
    let r = chat(&gw, 5).await;
    assert_eq!(r.status(), 429);
    assert!(header_u64(&r, "retry-after") >= 20, "one request at 2/min");

    rpm(600).write_to(&path);
    gw.wait_log("policy reloaded", 1).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = chat(&gw, 5).await;
        statuses.push(r.status().as_u16());
        if r.status() == 200 {
            break;
        }
        let wait = header_u64(&r, "retry-after-ms");
        assert!(wait <= 100, "one request at 600/min: {wait} ms");
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
    assert!(
        statuses.len() <= 2,
        "admitted once its hint passed: {statuses:?}"
    );
}

/// The watcher reacts only to the config file. With a
/// log file written every 300 ms (slower than the debounce, so that each
/// write would end one) and the memory store's snapshot (written
/// every second) in the config's directory, 5 s of idle re-read nothing —
/// not even a debug "unchanged" line, which the old watcher logged at info
/// after every write — and an edit of the config still applies within the
/// debounce.
#[tokio::test(flavor = "multi_thread")]
async fn other_files_in_the_config_directory_do_not_reload() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("memory-store.json");
    let with_snapshot = |tpm| {
        let mut c = cfg(&mock.base_url(), tpm);
        c.store.snapshot_path = Some(snapshot.display().to_string());
        c
    };
    let path = with_snapshot(1000).write(dir.path());
    let gw = GatewayProcess::start(&path, &[("RUST_LOG", "info,budgetgate=debug")]).await;
    gw.wait_log("watching the config file for changes", 1).await;
    assert_eq!(chat(&gw, 20).await.status(), 200);

    let log = dir.path().join("gateway.log");
    let writer = tokio::spawn(async move {
        use std::io::Write;
        let mut f = std::fs::File::create(&log).unwrap();
        loop {
            writeln!(f, "{{\"message\":\"a log line\"}}").unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    writer.abort();
    // Past the debounce of the last write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        snapshot.exists(),
        "the snapshot was written in the directory"
    );
    let reread = |gw: &GatewayProcess| {
        gw.logs_with("config reload: file unchanged; the running policy stays")
            .len()
            + gw.logs_with("policy reloaded").len()
    };
    assert_eq!(reread(&gw), 0, "{}", gw.dump_logs());

    let edited = std::time::Instant::now();
    with_snapshot(600).write_to(&path);
    gw.wait_log("policy reloaded", 1).await;
    assert!(
        edited.elapsed() < Duration::from_secs(2),
        "reloaded after {:?}",
        edited.elapsed()
    );
    assert_eq!(
        header_u64(&chat(&gw, 20).await, "x-ratelimit-limit-tokens"),
        600
    );
    assert_eq!(reread(&gw), 1, "{}", gw.dump_logs());
}
