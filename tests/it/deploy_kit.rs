//! The observability kit under `deploy/`:
//! every Grafana dashboard expression is also a recording rule in a file
//! generated from the dashboard; the alert rules and that file pass
//! `promtool check rules` (Debian's `prometheus` package, installed when
//! missing) and the alerts pass their `promtool test rules` cases; every
//! metric name the kit reads appears in `/metrics` of a freshly started
//! gateway, before any traffic.
//!
//! Regenerate the recording rules after editing the dashboard:
//! `BUDGETGATE_REGENERATE=1 cargo test --test it deploy_kit::`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::config::{upstream, RawUpstream};
use crate::support::*;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

const DASHBOARD: &str = "grafana/budgetgate.json";
const ALERTS: &str = "prometheus/alerts.yml";
const RECORDING: &str = "prometheus/dashboard-recording-rules.yml";

/// (panel title, refId, expression) of every dashboard query.
fn dashboard_queries() -> Vec<(String, String, String)> {
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy(DASHBOARD)).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap().to_string(),
                t["refId"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// A dashboard expression as plain PromQL: Grafana's variables replaced by
/// what they mean with everything selected.
fn promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("\"$tenant\"", "\".*\"")
}

/// `Share of each tenant budget left` → `share_of_each_tenant_budget_left`.
fn slug(title: &str) -> String {
    let mut s = String::new();
    for c in title.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('_') {
            s.push('_');
        }
    }
    s.trim_matches('_').to_string()
}

fn recording_rules() -> String {
    let mut y = String::from(
        "# Generated from deploy/grafana/budgetgate.json by tests/it/deploy_kit.rs; do not edit.\n\
         # Regenerate: BUDGETGATE_REGENERATE=1 cargo test --test it deploy_kit::\n\
         # Every dashboard expression as a recording rule (Grafana variables at \"all\",\n\
         # $__rate_interval as 5m), checked with `promtool check rules`.\n\
         groups:\n  - name: budgetgate-dashboard\n    interval: 30s\n    rules:\n",
    );
    for (title, ref_id, expr) in dashboard_queries() {
        y.push_str(&format!(
            "      - record: budgetgate:dashboard:{}:{}\n        expr: |-\n          {}\n",
            slug(&title),
            ref_id.to_ascii_lowercase(),
            promql(&expr)
        ));
    }
    y
}

#[test]
fn the_recording_rules_file_is_generated_from_the_dashboard() {
    let want = recording_rules();
    let path = deploy(RECORDING);
    if std::env::var_os("BUDGETGATE_REGENERATE").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what the dashboard generates; run BUDGETGATE_REGENERATE=1 cargo test --test it deploy_kit::",
        path.display()
    );
    // One rule per dashboard query, names unique.
    let names: BTreeSet<&str> = have
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .collect();
    assert_eq!(names.len(), dashboard_queries().len());
}

fn promtool() -> &'static str {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-test-deps.sh");
        let status = std::process::Command::new(script)
            .arg("promtool")
            .status()
            .expect("run scripts/install-test-deps.sh");
        assert!(
            status.success(),
            "installing promtool (Debian package prometheus) failed"
        );
    }
    "promtool"
}

fn run_promtool(args: &[&str]) -> String {
    let out = std::process::Command::new(promtool())
        .args(args)
        .current_dir(deploy("prometheus"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn promtool_accepts_the_alerts_and_the_recording_rules_and_the_alert_tests_pass() {
    let alerts = run_promtool(&["check", "rules", "alerts.yml"]);
    assert!(alerts.contains("SUCCESS: 9 rules found"), "{alerts}");
    let recording = run_promtool(&["check", "rules", "dashboard-recording-rules.yml"]);
    assert!(
        recording.contains(&format!(
            "SUCCESS: {} rules found",
            dashboard_queries().len()
        )),
        "{recording}"
    );
    let tests = run_promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(tests.contains("SUCCESS"), "{tests}");
}

/// Metric names (`budgetgate_…`) in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("budgetgate_") {
        let start = i + pos;
        let before_ok = start == 0
            || !(bytes[start - 1].is_ascii_alphanumeric()
                || bytes[start - 1] == b'_'
                || bytes[start - 1] == b':');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if before_ok {
            out.insert(text[start..end].to_string());
        }
        i = end;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_kit_reads_is_exported_by_a_freshly_started_gateway() {
    let mut used = BTreeSet::new();
    for (_, _, expr) in dashboard_queries() {
        used.extend(metric_names(&expr));
    }
    let alerts = std::fs::read_to_string(deploy(ALERTS)).unwrap();
    used.extend(metric_names(&alerts));
    for must in [
        "budgetgate_budget_remaining_ratio",
        "budgetgate_settlement_retries_total",
        "budgetgate_degraded_decisions_total",
        "budgetgate_store_errors_total",
    ] {
        assert!(used.contains(must), "the kit does not read {must}");
    }

    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = TestConfig::standard(
        &mock.base_url(),
        50,
        limits()
            .rpm(100)
            .tpm(10000)
            .max_concurrent(4)
            .tokens_per_day(100000),
    );
    config
        .tenant("t1")
        .model_limits
        .insert("gpt-4o-mini".into(), limits().tpm(5000));
    config.upstreams.push(RawUpstream {
        limits: limits().rpm(60).tpm(5000),
        ..upstream("limited", Kind::Openai, &mock.base_url())
    });
    let cfg = config.write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[]).await;
    let text = reqwest::get(format!("{}/metrics", gw.root))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "used by deploy/ but not in /metrics of a fresh gateway: {missing:?}\n{text}"
    );
    // The remaining-share gauges are set at start: full budgets.
    assert!(
        text.contains("budgetgate_budget_remaining_ratio{tenant=\"t1\",scope=\"tenant\",budget=\"tokens_per_day\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "budgetgate_upstream_budget_remaining_ratio{deployment=\"limited\",budget=\"tpm\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("budgetgate_budget_remaining_ratio{tenant=\"t1\",scope=\"tenant_model\",budget=\"tpm\"} 1"),
        "{text}"
    );
}

/// `scripts/install-test-deps.sh promtool` with a stand-in `apt-get` (and
/// no promtool on its PATH): while the package installs, a policy-rc.d
/// forbids starting services (Debian's `prometheus` package would start a
/// server on port 9090), and whatever policy-rc.d was there before is back
/// afterwards (or none, if there was none).
#[test]
fn installing_promtool_starts_no_prometheus_server() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    // Only the tools the script uses, so that the machine's promtool is not found.
    for tool in [
        "bash", "id", "flock", "mktemp", "cp", "mv", "rm", "chmod", "tee", "cat", "pgrep",
    ] {
        let path = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} not found"));
        std::os::unix::fs::symlink(path, bin.join(tool)).unwrap();
    }
    let policy = dir.path().join("policy-rc.d");
    let seen = dir.path().join("seen");
    // What a maintainer script's deb-systemd-invoke would ask: may it start?
    let apt = format!(
        "#!/bin/sh\n[ \"$1\" = install ] || exit 0\nif [ -x '{p}' ]; then '{p}' prometheus start; echo \"policy $?\" >> '{s}'; else echo 'no policy' >> '{s}'; fi\n",
        p = policy.display(),
        s = seen.display()
    );
    for (name, script) in [
        ("apt-get", apt.as_str()),
        ("systemctl", "#!/bin/sh\nexit 0\n"),
    ] {
        std::fs::write(bin.join(name), script).unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = || {
        let out = std::process::Command::new(bin.join("bash"))
            .arg(repo_path("scripts/install-test-deps.sh"))
            .arg("promtool")
            .env("PATH", &bin)
            .env("POLICY_RC_D", &policy)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A policy-rc.d that allows everything was there: it is replaced while
    // the package installs, then restored.
    let allow = "#!/bin/sh\nexit 0\n";
    std::fs::write(&policy, allow).unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o755)).unwrap();
    run();
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "policy 101\n");
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), allow);
    // None was there: none is left.
    std::fs::remove_file(&policy).unwrap();
    std::fs::remove_file(&seen).unwrap();
    run();
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "policy 101\n");
    assert!(!policy.exists(), "the script's policy-rc.d was left behind");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("saved"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
