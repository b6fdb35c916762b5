//! The command line as a newcomer meets it: every
//! subcommand that reads a config takes `--config` and `BUDGETGATE_CONFIG`
//! (`check-config FILE` keeps working), an estimate of a body written for
//! another endpoint suggests the right `--endpoint`, logs carry no colour
//! codes when they go to a file or a pipe, a reload of an unchanged file
//! says so, and a disabled admin API's 404 names the variable that enables it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

fn budgetgate(args: &[&str], envs: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_budgetgate"));
    cmd.args(args)
        .env_remove("BUDGETGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run budgetgate");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_config(dir: &Path) -> String {
    TestConfig::standard("http://127.0.0.1:9/v1", 50, limits().tpm(1000))
        .write(dir)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn check_config_takes_the_file_as_argument_flag_or_environment() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    for (args, envs) in [
        (vec!["check-config", cfg.as_str()], vec![]),
        (vec!["check-config", "--config", cfg.as_str()], vec![]),
        (vec!["check-config", "-c", cfg.as_str()], vec![]),
        (
            vec!["check-config"],
            vec![("BUDGETGATE_CONFIG", cfg.as_str())],
        ),
    ] {
        let out = budgetgate(&args, &envs, None);
        assert!(
            out.status.success(),
            "{args:?} {envs:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains(": ok (policy version"),
            "{args:?}"
        );
    }
    // Neither: a usage error that says how to give the file.
    let out = budgetgate(&["check-config"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--config FILE"));
}

/// What docs/API.md says `check-config` prints: every validation error
/// with its path at once; a file that does not parse (here two values of
/// the wrong type) gets the parser's first error alone, with its line and
/// column.
#[test]
fn check_config_prints_every_validation_error_and_the_parsers_first() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let base = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        base.contains("tpm = 1000") && base.contains("default_max_output_tokens = 50"),
        "{base}"
    );
    std::fs::write(
        &cfg,
        base.replacen("tpm = 1000", "tpm = -1", 1).replacen(
            "upstreams = [\"mock\"]",
            "upstreams = [\"nope\"]",
            1,
        ),
    )
    .unwrap();
    let out = budgetgate(&["check-config", &cfg], &[], None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tenants[0].limits.tpm") && err.contains("models[0].upstreams[0]"),
        "both validation errors: {err}"
    );
    std::fs::write(
        &cfg,
        base.replacen("tpm = 1000", "tpm = \"x\"", 1).replacen(
            "default_max_output_tokens = 50",
            "default_max_output_tokens = \"y\"",
            1,
        ),
    )
    .unwrap();
    let out = budgetgate(&["check-config", &cfg], &[], None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("invalid type").count(), 1, "{err}");
    assert!(err.contains("line "), "{err}");
}

/// `[server] lease_secs` is renamed `slot_lease_secs`
/// (the slot lease, not a quota lease). The former key is accepted for one
/// release with a warning naming the new one; both together are an error.
#[test]
fn the_former_lease_secs_key_is_accepted_with_a_warning_naming_slot_lease_secs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let text_of = |p: &str| std::fs::read_to_string(p).unwrap();
    let base = text_of(&cfg);
    let with = |extra: &str| {
        let t = if base.contains("[server]") {
            base.replacen("[server]", &format!("[server]\n{extra}"), 1)
        } else {
            format!("[server]\n{extra}\n{base}")
        };
        std::fs::write(&cfg, t).unwrap();
        budgetgate(&["check-config", &cfg], &[], None)
    };
    let old = with("lease_secs = 7");
    assert!(old.status.success(), "{}", text(&old.stderr));
    let out = text(&old.stdout);
    assert!(
        out.contains("warning: server.lease_secs is renamed server.slot_lease_secs"),
        "{out}"
    );
    assert!(out.contains("1 warning(s)"), "{out}");
    let new = with("slot_lease_secs = 7");
    assert!(new.status.success(), "{}", text(&new.stderr));
    assert!(
        !text(&new.stdout).contains("renamed"),
        "{}",
        text(&new.stdout)
    );
    let both = with("slot_lease_secs = 7\nlease_secs = 7");
    assert_eq!(both.status.code(), Some(1));
    assert!(
        text(&both.stderr)
            .contains("server.lease_secs: is the former name of server.slot_lease_secs"),
        "{}",
        text(&both.stderr)
    );
}

#[test]
fn estimate_reads_budgetgate_config_and_suggests_the_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let env = [("BUDGETGATE_CONFIG", cfg.as_str())];
    let chat =
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
    let out = budgetgate(&["estimate"], &env, Some(chat));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("total reserved:"));
    // The encoding by its name, not a Rust type name (`O200kBase`).
    assert!(
        text(&out.stdout).contains("encoding:          o200k_base\n"),
        "{}",
        text(&out.stdout)
    );

    let embeddings = r#"{"model":"gpt-4o-mini","input":"hello"}"#;
    let out = budgetgate(&["estimate"], &env, Some(embeddings));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("'messages' is required"), "{err}");
    assert!(err.contains("--endpoint embeddings"), "{err}");
    let out = budgetgate(
        &["estimate", "--endpoint", "embeddings"],
        &env,
        Some(embeddings),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Logs written to a pipe (a file, a journal) carry no ANSI colour codes.
#[tokio::test]
async fn text_logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .args(["serve", "--config", &cfg, "--listen", "127.0.0.1:0"])
        .env("STATE_DIRECTORY", dir.path())
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 512];
        while !text(&seen).contains("listening on") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "gateway exited before listening");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("gateway did not start");
    child.start_kill().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let logs = text(&out.stderr);
    assert!(logs.contains("budgetgate listening"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "colour codes in a pipe: {logs:?}");
}

/// `budgetgate serve` on `cfg` with `envs` until it listens; its log (stderr).
async fn serve_log(cfg: &str, state_dir: &Path, envs: &[(&str, &str)]) -> String {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"));
    cmd.args(["serve", "--config", cfg, "--listen", "127.0.0.1:0"])
        .env("STATE_DIRECTORY", state_dir)
        .env("RUST_LOG", "info")
        .env_remove("BUDGETGATE_LOG_JSON")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 512];
        while !text(&seen).contains("listening on") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "gateway exited before listening");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("gateway did not start");
    child.start_kill().unwrap();
    let out = child.wait_with_output().await.unwrap();
    text(&out.stderr)
}

/// Fault guarded against: `BUDGETGATE_LOG_JSON=1`, as OPERATIONS.md and
/// the shipped systemd unit write it, made every command exit 2 (only
/// `true`/`false` were accepted).
#[tokio::test]
async fn budgetgate_log_json_takes_1_0_true_and_false() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    for v in ["1", "0", "true", "false"] {
        let out = budgetgate(&["check-config", &cfg], &[("BUDGETGATE_LOG_JSON", v)], None);
        assert!(
            out.status.success(),
            "BUDGETGATE_LOG_JSON={v}: {}",
            text(&out.stderr)
        );
    }
    let out = budgetgate(
        &["check-config", &cfg],
        &[("BUDGETGATE_LOG_JSON", "maybe")],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "a value that is neither is refused"
    );
    for (v, json) in [("1", true), ("true", true), ("0", false), ("false", false)] {
        let log = serve_log(&cfg, dir.path(), &[("BUDGETGATE_LOG_JSON", v)]).await;
        let line = log
            .lines()
            .find(|l| l.contains("budgetgate listening"))
            .unwrap_or_else(|| panic!("BUDGETGATE_LOG_JSON={v}: no listening line in {log}"));
        assert_eq!(
            serde_json::from_str::<Value>(line).is_ok(),
            json,
            "BUDGETGATE_LOG_JSON={v}: {line}"
        );
    }
}

#[tokio::test]
async fn a_reload_of_an_unchanged_file_logs_that_it_was_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let gw = GatewayProcess::start(Path::new(&cfg), &[]).await;
    gw.signal("HUP");
    let lines = gw
        .wait_log("config reload: file unchanged; the running policy stays", 1)
        .await;
    assert_eq!(lines[0]["level"], "INFO");
    assert_eq!(lines[0]["fields"]["trigger"], "sighup");
}

#[tokio::test]
async fn a_disabled_admin_api_answers_404_naming_the_variable_that_enables_it() {
    let mock = start_mock().await;
    let gw = TestConfig::standard(&mock.base_url(), 50, limits().tpm(1000))
        .start()
        .await;
    for path in ["/admin/v1/policy", "/admin/v1/tenants/t1/budgets"] {
        let r = reqwest::get(format!("{}{path}", gw.root_url()))
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("BUDGETGATE_ADMIN_TOKEN"), "{msg}");
        assert!(msg.contains("admin API is disabled"), "{msg}");
        assert_eq!(v["error"]["code"], "not_found");
    }
}

/// `estimate` prints the reservation's dollar cost on each deployment
/// beside its tokens, computed from the prices as `ceil(Σ tokens × price /
/// 10^6)` µ$; `check-config` warns (and succeeds) about a dollar budget over
/// a model it cannot price.
#[test]
fn estimate_prints_dollars_and_check_config_flags_unpriced_models() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard("http://127.0.0.1:9/v1", 50, limits().usd_per_day("1"));
    c.model("gpt-4o-mini").price = Some(price("0.15", "0.60"));
    let cfg = c.write(dir.path()).to_string_lossy().into_owned();
    let body = serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 1000});
    let out = budgetgate(&["estimate", "-c", &cfg], &[], Some(&body.to_string()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let input = chat_input_tokens(&body);
    let micros = (input * 150_000 + 1000 * 600_000).div_ceil(1_000_000);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "cost reserved:     ${} on mock ({micros} µ$)",
            budgetgate::money::format_usd(micros as i64)
        )),
        "{stdout}"
    );
    let out = budgetgate(&["check-config", &cfg], &[], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("warning: tenants[0] (t1) has a dollar budget and model \"text-embedding-3-small\" has no price"),
        "{stdout}"
    );
    assert!(stdout.contains("1 warning(s)"), "{stdout}");
}

/// `end-user-hash TENANT ID` prints the hash a refusal of that end user
/// names (in its message and its log line), read with the key from the
/// configured variable; the id may come on stdin; a tenant whose tree has no
/// end-user settings, an unknown tenant and a missing key are errors.
#[tokio::test]
async fn end_user_hash_prints_what_a_refusal_of_that_end_user_shows() {
    const SECRET: &str = "cli-test-end-user-secret-0123";
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(&mock.base_url(), 50, limits().tpm(100_000));
    c.server.end_user_key_env = Some("CLI_TEST_END_USER_KEY".into());
    c.tenant("t1").end_user_limits = limits().rpm(1);
    c.tenants.push(crate::support::config::tenant(
        "plain",
        "k2",
        "sk-plain",
        limits().tpm(1000),
    ));
    let cfg = c.write(dir.path());
    let env = [("CLI_TEST_END_USER_KEY", SECRET)];
    let gw = GatewayProcess::start(&cfg, &env).await;
    let send = || {
        reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.root))
            .bearer_auth(KEY)
            .header("x-budgetgate-end-user", "alice@example.com")
            .json(&serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap().to_string();
    let line = gw.wait_log("request refused", 1).await;
    let logged = line[0]["fields"]["end_user"].as_str().unwrap().to_string();

    let cfg = cfg.to_string_lossy().into_owned();
    let out = budgetgate(
        &["end-user-hash", "-c", &cfg, "t1", "alice@example.com"],
        &env,
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let hash = text(&out.stdout).trim().to_string();
    assert_eq!(hash.len(), 32, "{hash}");
    assert_eq!(logged, hash);
    assert!(
        message.contains(&format!("end_user:t1/{hash}")),
        "{message}"
    );
    let out = budgetgate(
        &["end-user-hash", "-c", &cfg, "t1"],
        &env,
        Some("alice@example.com\n"),
    );
    assert_eq!(text(&out.stdout).trim(), hash);

    for (args, envs, says) in [
        (vec!["plain", "alice"], &env[..], "no end-user settings"),
        (
            vec!["nobody", "alice"],
            &env[..],
            "unknown tenant \"nobody\"",
        ),
        (vec!["t1", "alice"], &[][..], "CLI_TEST_END_USER_KEY"),
    ] {
        let mut a = vec!["end-user-hash", "-c", &cfg];
        a.extend(args);
        let out = budgetgate(&a, envs, None);
        assert_eq!(out.status.code(), Some(1), "{a:?}");
        assert!(text(&out.stdout).is_empty(), "{a:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{a:?}: {}",
            text(&out.stderr)
        );
    }
}

/// Every shipped config passes `check-config` as a user runs it (upstream
/// keys and the end-user secret in the environment), and each documented
/// feature has a local example: an Anthropic upstream in base-URL form,
/// dollar budgets with prices, nested tenants, end users.
#[test]
fn every_shipped_config_passes_check_config_and_each_feature_has_an_example() {
    let mut configs: Vec<std::path::PathBuf> = std::fs::read_dir(repo_path("config"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    configs.sort();
    // The compose fleet's config (deploy/compose.yaml) too.
    configs.push(repo_path("deploy/fleet.toml"));
    let env = [
        ("OPENAI_API_KEY", "sk-check"),
        ("ANTHROPIC_API_KEY", "sk-check"),
        ("GEMINI_UPSTREAM_KEY", "sk-check"),
        ("BUDGETGATE_END_USER_KEY", "a-secret-of-at-least-16-bytes"),
    ];
    let mut texts = Vec::new();
    for path in &configs {
        let p = path.to_string_lossy();
        let out = budgetgate(&["check-config", &p], &env, None);
        assert!(out.status.success(), "{p}: {}", text(&out.stderr));
        texts.push((p.into_owned(), std::fs::read_to_string(path).unwrap()));
    }
    let local = |needle: &str| {
        texts
            .iter()
            .any(|(p, t)| p.contains("/local") && t.lines().any(|l| l.starts_with(needle)))
    };
    for (feature, needle) in [
        ("an Anthropic upstream", "kind = \"anthropic\""),
        (
            "an Anthropic base URL without /v1",
            "base_url = \"http://127.0.0.1:9000\"",
        ),
        ("prices", "price = {"),
        ("dollar budgets", "limits = { rpm = 600, usd_per_day"),
        ("nested tenants", "parent = "),
        ("end users", "end_user_limits = "),
        ("the end-user key variable", "end_user_key_env = "),
    ] {
        assert!(
            local(needle),
            "no local example config has {feature} ({needle})"
        );
    }
}

/// The values the shipped systemd unit and container image give
/// `BUDGETGATE_LOG_JSON` start the gateway with JSON logs (the unit's `1`
/// once made it exit at start: "invalid value '1' for '--log-json'").
#[tokio::test]
async fn the_shipped_log_json_setting_starts_the_gateway_with_json_logs() {
    let setting = |file: &str, prefix: &str| -> String {
        let text = std::fs::read_to_string(repo_path(file)).expect(file);
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("{file}: no `{prefix}` line"))
            .trim_end_matches(" \\")
            .to_string()
    };
    let unit = setting(
        "deploy/systemd/budgetgate.service",
        "Environment=BUDGETGATE_LOG_JSON=",
    );
    let image = setting("Containerfile", "BUDGETGATE_LOG_JSON=");
    for value in [unit.as_str(), image.as_str(), "yes", "true"] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(dir.path());
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
            .args(["serve", "--config", &cfg, "--listen", "127.0.0.1:0"])
            .env("STATE_DIRECTORY", dir.path())
            .env("RUST_LOG", "info")
            .env("BUDGETGATE_LOG_JSON", value)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut seen = Vec::new();
        let started = tokio::time::timeout(Duration::from_secs(30), async {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 512];
            while !text(&seen).contains("listening on") {
                let n = stdout.read(&mut buf).await.unwrap();
                if n == 0 {
                    return false;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            true
        })
        .await
        .expect("gateway did not start");
        child.start_kill().unwrap();
        let out = child.wait_with_output().await.unwrap();
        let logs = text(&out.stderr);
        assert!(started, "BUDGETGATE_LOG_JSON={value}: exited: {logs}");
        let first = logs.lines().next().unwrap_or_default();
        assert!(
            first.starts_with('{') && first.contains("\"level\""),
            "BUDGETGATE_LOG_JSON={value}: not JSON: {logs}"
        );
    }
}

/// deploy/fleet.toml shows every production setting, most commented out:
/// uncommented (all but `[server.tls]`, whose files do not exist here, and
/// `parent`, which names a tenant the file does not have), they still pass
/// `check-config`, so the file a fleet is configured from does not rot.
#[test]
fn the_fleet_configs_commented_settings_are_valid_when_uncommented() {
    let file = std::fs::read_to_string(repo_path("deploy/fleet.toml")).unwrap();
    let is_setting = |rest: &str| {
        let header = rest.split("  #").next().unwrap_or("").trim_end();
        if header.starts_with('[') {
            return header.ends_with(']') && !header.contains(' ');
        }
        rest.split_once(" = ").is_some_and(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.\"-".contains(c))
        })
    };
    let mut out = String::new();
    let mut uncommented = 0;
    let mut in_tls = false;
    for line in file.lines() {
        let line = match line.strip_prefix("# ") {
            Some(rest) if is_setting(rest) => {
                uncommented += 1;
                rest
            }
            _ => line,
        };
        if line.starts_with('[') {
            in_tls = line.starts_with("[server.tls]");
        }
        if in_tls || line.starts_with("parent = ") {
            continue;
        }
        out.push_str(&line.replace(
            "<printf %s KEY | budgetgate hash-key>",
            "4ff444b1a79536cc47732956cf5bc6256abf64bc1b8adff6843fac08bbb6be9f",
        ));
        out.push('\n');
    }
    assert!(uncommented > 80, "only {uncommented} settings uncommented");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet-uncommented.toml");
    std::fs::write(&path, &out).unwrap();
    let p = path.to_string_lossy();
    let env = [
        ("OPENAI_API_KEY", "sk-check"),
        ("ANTHROPIC_API_KEY", "sk-check"),
        ("BUDGETGATE_END_USER_KEY", "a-secret-of-at-least-16-bytes"),
        ("BUDGETGATE_ALERT_SECRET", "a-secret-of-at-least-16-bytes"),
    ];
    let out_cmd = budgetgate(&["check-config", &p], &env, None);
    assert!(out_cmd.status.success(), "{}\n{out}", text(&out_cmd.stderr));
    let said = text(&out_cmd.stdout);
    assert!(said.contains("2 upstreams, 2 models, 1 tenants"), "{said}");
}

/// Fault: a pattern entry's reach was invisible: the operator could not
/// see which entry a name resolves to, what goes upstream, nor that one
/// price covers every name a pattern matches.
#[test]
fn check_config_and_estimate_show_how_a_name_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard("http://127.0.0.1:9/v1", 50, limits().usd_per_day("1"));
    c.model("gpt-4o-mini").price = Some(price("0.15", "0.60"));
    c.models.push(config::RawModel {
        price: Some(price("1.25", "10")),
        max_output_tokens: Some(4096),
        ..config::model("gpt-5*", &["mock"])
    });
    let cfg = c.write(dir.path()).to_string_lossy().into_owned();
    let out = budgetgate(&["check-config", &cfg], &[], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("models[2] \"gpt-5*\": a pattern: serves names starting with \"gpt-5\" that no exact entry or longer pattern serves, sent upstream as the client named them"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("model \"gpt-5*\" is a pattern: its one price covers every name it matches"),
        "{stdout}"
    );
    let body =
        r#"{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
    let out = budgetgate(&["estimate", "-c", &cfg], &[], Some(body));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "model:             gpt-5.5-codex → entry \"gpt-5*\" (sent upstream as gpt-5.5-codex)"
        ),
        "{stdout}"
    );
    let out = budgetgate(
        &["estimate", "-c", &cfg, "--model", "llama"],
        &[],
        Some(body),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "unknown model \"llama\" (models: gpt-4o-mini, text-embedding-3-small, gpt-5*)"
        ),
        "{}",
        text(&out.stderr)
    );
}

/// `budgetgate ARGS…` with `envs` only among its own variables (the
/// caller's `BUDGETGATE_URL` and `BUDGETGATE_ADMIN_TOKEN` removed).
async fn admin_command(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"));
    cmd.args(args)
        .env_remove("BUDGETGATE_URL")
        .env_remove("BUDGETGATE_ADMIN_TOKEN")
        .envs(envs.iter().copied());
    cmd.output().await.expect("run budgetgate")
}

/// The admin commands as a newcomer meets them: without a token they name
/// the variable that gives one (clap named only `--token`); a gateway that
/// does not answer is named as such with the variable that points
/// elsewhere (reqwest's "error sending request for url (…%2D…)" before).
#[tokio::test]
async fn admin_commands_name_the_token_variable_and_a_gateway_that_does_not_answer() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let commands: [&[&str]; 5] = [
        &["explain", "req-1-2"],
        &["keys", "list"],
        &["admin-tokens", "list"],
        &["spend"],
        &["reconcile"],
    ];
    for args in commands {
        let out = admin_command(args, &[("BUDGETGATE_URL", &closed)]).await;
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("BUDGETGATE_ADMIN_TOKEN"), "{args:?}: {err}");

        let out = admin_command(
            args,
            &[("BUDGETGATE_URL", &closed), ("BUDGETGATE_ADMIN_TOKEN", "t")],
        )
        .await;
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains(&format!("no gateway answers at {closed}"))
                && err.contains("BUDGETGATE_URL")
                && !err.contains("%2D")
                && !err.contains("error sending request"),
            "{args:?}: {err}"
        );
    }
}

/// Every admin command prints JSON indented (`spend` and `reconcile`
/// printed one line); a created key's and admin token's secret is said to
/// be shown once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_print_indented_json_and_say_a_secret_is_shown_once() {
    const TOKEN: &str = "cli-admin-token";
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestConfig::standard(&mock.base_url(), 50, limits().tokens_per_day(100_000));
    c.control.database_url = Some(format!(
        "sqlite://{}",
        dir.path().join("control.db").display()
    ));
    let gw = c.start().await;
    gw.state.set_admin_token(Some(TOKEN));
    let url = gw.root_url();
    let envs = [
        ("BUDGETGATE_URL", url.as_str()),
        ("BUDGETGATE_ADMIN_TOKEN", TOKEN),
    ];
    let commands: [(&[&str], Option<&str>); 6] = [
        (&["spend"], None),
        (&["reconcile"], None),
        (&["tenants", "list"], None),
        (
            &["keys", "create", "--tenant", "t1"],
            Some("\"secret\" above is shown this once"),
        ),
        (
            &["admin-tokens", "create", "--role", "read"],
            Some("\"token\" above is shown this once"),
        ),
        (&["keys", "list"], None),
    ];
    for (args, note) in commands {
        let out = admin_command(args, &envs).await;
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{args:?}: {stderr}");
        let v: Value = serde_json::from_str(&stdout).expect("JSON");
        assert_eq!(
            stdout.trim_end(),
            serde_json::to_string_pretty(&v).unwrap(),
            "{args:?}"
        );
        assert!(stdout.lines().count() > 1, "{args:?}: {stdout}");
        match note {
            Some(n) => assert!(stderr.contains(n), "{args:?}: {stderr}"),
            None => assert!(!stderr.contains("shown this once"), "{args:?}: {stderr}"),
        }
    }
}
