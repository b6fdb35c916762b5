//! The real coding agents against the shipped configs (issue 37, point 7;
//! docs/AGENTS.md): Codex CLI on `config/local.toml` and Claude Code on
//! `config/local-anthropic.toml`, only the simulated upstream's address
//! changed, each CLI with its defaults (model, betas, tools, caps) and a
//! one-line prompt. Each must exit 0 with the mock's answer, after exactly
//! one metered and settled request to the gateway.
//!
//! The CLIs are pinned in `tests/agents/package-lock.json` (integrity
//! hashes) and installed by `scripts/test.sh` (`npm ci
//! --include=optional`: their native binaries are optional
//! dependencies). A missing CLI fails the test with the install command;
//! the test is never skipped.
//!
//! Isolation: a temporary `CODEX_HOME` / `CLAUDE_CONFIG_DIR` and `HOME`, an
//! environment cleared of everything but what is set here (the variables
//! docs/AGENTS.md lists), and `HTTP(S)_PROXY` pointing at a local port that
//! records and drops every connection, with `NO_PROXY=127.0.0.1,localhost`:
//! any call off the loopback fails at once and is seen. None may go to a
//! model API (every model request went to the gateway); the others (Codex
//! asks GitHub and chatgpt.com for plugins, catalogues and experiments)
//! fail without harm and are listed in docs/AGENTS.md.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use budgetgate::budget::{BudgetName, Scope};
use tokio::io::AsyncReadExt;

use crate::support::*;

/// How `scripts/test.sh` installs the CLIs.
const INSTALL: &str = "(cd tests/agents && npm ci --include=optional)";

/// The pinned CLI `name` (`codex`, `claude`); fails with the install
/// command when it is missing.
fn cli(name: &str) -> PathBuf {
    let path = repo_path("tests/agents/node_modules/.bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: install the pinned coding-agent CLIs with {INSTALL}",
        path.display()
    );
    path
}

/// A local port standing in for an HTTP(S) proxy: every connection is
/// recorded (its first line: `CONNECT host:443 …` or `GET http://…`) and
/// dropped.
struct Proxy {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn proxy() -> Proxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let n = tokio::time::timeout(Duration::from_millis(500), sock.read(&mut buf))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(0);
                let first = String::from_utf8_lossy(&buf[..n]);
                let line = first.lines().next().unwrap_or("(nothing sent)").to_string();
                log.lock().unwrap().push(line);
            });
        }
    });
    Proxy { url, seen }
}

/// Hosts of model APIs: a call to one bypassed the gateway.
const MODEL_APIS: &[&str] = &["api.openai.com", "api.anthropic.com", "openai.azure.com"];

/// Fails when a connection the proxy saw went to a model API.
fn no_model_call_bypassed_the_gateway(proxy: &Proxy) -> Vec<String> {
    let seen = proxy.seen.lock().unwrap().clone();
    for line in &seen {
        assert!(
            !MODEL_APIS.iter().any(|h| line.contains(h)),
            "a model request went around the gateway: {line}"
        );
    }
    seen
}

/// The environment every CLI runs with (and nothing else of the test's).
fn base_env(home: &Path, proxy: &Proxy) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PATH", std::env::var("PATH").unwrap_or_default()),
        ("HOME", home.display().to_string()),
        ("LANG", "C.UTF-8".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("NO_PROXY", "127.0.0.1,localhost".into()),
        ("no_proxy", "127.0.0.1,localhost".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
    ] {
        env.push((k.to_string(), proxy.url.clone()));
    }
    env
}

/// Runs `program args` in `dir` with `env` only, stdin closed, for at
/// most 60 s: (exit code, stdout, stderr, how long it ran).
async fn run(
    program: &Path,
    args: &[&str],
    dir: &Path,
    env: &[(String, String)],
) -> (Option<i32>, String, String, Duration) {
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} ran over 60 s", program.display()))
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

/// `config/<file>` as shipped, its upstream pointed at `mock` (Anthropic
/// upstreams take the base URL without `/v1`) and its listener at a free
/// port.
fn shipped(file: &str, mock: &mock_upstream::MockUpstream) -> TestConfig {
    let mut c = TestConfig::read(&repo_path(&format!("config/{file}")));
    c.server.listen = Some("127.0.0.1:0".into());
    for u in &mut c.upstreams {
        u.base_url = if u.kind.as_deref() == Some("anthropic") {
            mock.root_url()
        } else {
            mock.base_url()
        };
    }
    c
}

/// One metered, settled request for `tenant`: one request counted, every
/// reservation settled, and tokens charged below what was reserved (the
/// settlement refunded the unused part of the cap).
async fn one_settled_request(gw: &Gateway, tenant: &str, reserved_at_least: u64) -> u64 {
    gw.all_settled().await;
    let t = || Scope::Tenant(tenant.into());
    assert_eq!(gw.used(t(), BudgetName::Rpm).await, 1, "one request");
    let used = gw.used(t(), BudgetName::Tpm).await;
    assert!(
        used > 0 && used < reserved_at_least,
        "settled at the answer's usage, not the reservation: {used}"
    );
    used
}

/// Fault: Codex CLI 0.171.0 failed every turn through the gateway as
/// shipped (400 on its `namespace` tool groups; its default model unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_says_hi_through_the_shipped_config() {
    let codex = cli("codex");
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let gw = shipped("local.toml", &mock).start().await;
    let proxy = proxy().await;
    let home = tempfile::tempdir().unwrap();
    let codex_home = home.path().join("codex-home");
    let work = home.path().join("work");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    // docs/AGENTS.md's block, pointed at this gateway; `model` left at the
    // CLI's default.
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model_provider = \"budgetgate\"\n\n[model_providers.budgetgate]\nname = \"budgetgate\"\nbase_url = \"{}/v1\"\nenv_key = \"BUDGETGATE_API_KEY\"\nwire_api = \"responses\"\n",
            gw.root_url()
        ),
    )
    .unwrap();
    let mut env = base_env(home.path(), &proxy);
    env.push(("CODEX_HOME".into(), codex_home.display().to_string()));
    env.push(("BUDGETGATE_API_KEY".into(), "sk-local-demo".into()));
    let (code, stdout, stderr, took) = run(
        &codex,
        &["exec", "--skip-git-repo-check", "say hi"],
        &work,
        &env,
    )
    .await;
    assert_eq!(code, Some(0), "codex exec failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(mock_upstream::generated_text(12).trim()),
        "the mock's answer: {stdout}"
    );
    let sent = mock.state.requests();
    assert_eq!(sent.len(), 1, "one turn, one request upstream");
    assert_eq!(sent[0].path, "/v1/responses");
    let model = sent[0].body["model"].as_str().unwrap_or_default();
    assert!(
        model.starts_with("gpt-6"),
        "the CLI's default model, as it named it: {model}"
    );
    // Codex sends no cap: the gateway sent the pattern entry's.
    assert_eq!(sent[0].body["max_output_tokens"], 16000);
    one_settled_request(&gw, "demo", 16000).await;
    let off = no_model_call_bypassed_the_gateway(&proxy);
    eprintln!("codex exec took {took:?}; refused off the loopback: {off:?}");
}

/// Fault: Claude Code 2.1.197 failed as shipped: its default model
/// `claude-opus-4-8` got 404, and any model 400 on its betas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_print_says_hi_through_the_shipped_config() {
    let claude = cli("claude");
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let gw = shipped("local-anthropic.toml", &mock).start().await;
    let proxy = proxy().await;
    let home = tempfile::tempdir().unwrap();
    let config_dir = home.path().join("claude-config");
    let work = home.path().join("work");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let mut env = base_env(home.path(), &proxy);
    env.push(("CLAUDE_CONFIG_DIR".into(), config_dir.display().to_string()));
    env.push(("ANTHROPIC_BASE_URL".into(), gw.root_url()));
    env.push(("ANTHROPIC_API_KEY".into(), "sk-local-claude".into()));
    let (code, stdout, stderr, took) = run(&claude, &["-p", "say hi"], &work, &env).await;
    assert_eq!(code, Some(0), "claude -p failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(mock_upstream::generated_text(12).trim()),
        "the mock's answer: {stdout}"
    );
    let sent = mock.state.requests();
    assert_eq!(sent.len(), 1, "one turn, one request upstream");
    assert_eq!(sent[0].path, "/v1/messages");
    assert_eq!(
        sent[0].body["model"], "claude-opus-4-8",
        "its default model"
    );
    let betas = sent[0].header("anthropic-beta").unwrap_or_default();
    assert!(betas.contains("claude-code-20250219"), "{betas}");
    let max_tokens = sent[0].body["max_tokens"].as_u64().unwrap_or(0);
    one_settled_request(&gw, "coder", max_tokens).await;
    let off = no_model_call_bypassed_the_gateway(&proxy);
    eprintln!("claude -p took {took:?}; refused off the loopback: {off:?}");
}
