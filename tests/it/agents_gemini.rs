//! Gemini CLI (`@google/gemini-cli`, pinned in `tests/agents`) against
//! the shipped `config/local-gemini.toml`, only the simulated upstream's
//! address changed: `GOOGLE_GEMINI_BASE_URL` (the gateway) and
//! `GEMINI_API_KEY` (a budgetgate key), `gemini -p` non-interactive. What
//! it does with each answer (say hi, a rate refusal, a spent quota, a
//! cutoff) is printed (`--nocapture`) and recorded in docs/AGENTS.md.
//!
//! Isolation as for the other CLIs: a temporary `HOME`, an environment
//! cleared of all but what is set here, proxies at a closed local port
//! with `NO_PROXY` for the loopback (any call elsewhere fails at once).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use budgetgate::budget::{BudgetName, Scope};

use crate::support::*;

const GEMINI_KEY: &str = "sk-local-gemini";
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn gemini_cli() -> PathBuf {
    let path = repo_path("tests/agents/node_modules/.bin/gemini");
    assert!(
        path.exists(),
        "{} is missing: install the pinned coding-agent CLIs with (cd tests/agents && npm ci --include=optional)",
        path.display()
    );
    path
}

fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free local port");
    let url = format!("http://{}", l.local_addr().expect("its address"));
    drop(l);
    url
}

/// `config/local-gemini.toml` as shipped, its upstream at `mock`.
fn shipped(mock: &mock_upstream::MockUpstream) -> TestConfig {
    let mut c = TestConfig::read(&repo_path("config/local-gemini.toml"));
    c.server.listen = Some("127.0.0.1:0".into());
    for u in &mut c.upstreams {
        u.base_url = format!("{}/v1beta", mock.root_url());
        // Any set variable: the simulated upstream takes any key.
        u.api_key_env = Some("CARGO_PKG_NAME".into());
    }
    c
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

async fn gemini_say(gw: &Gateway, home: &Path, prompt: &str) -> Run {
    let proxy = closed_port();
    let work = home.join("work");
    std::fs::create_dir_all(&work).expect("the working directory");
    // The API-key method (docs/AGENTS.md): without it `-p` exits 41.
    let settings = home.join(".gemini");
    std::fs::create_dir_all(&settings).expect("~/.gemini");
    std::fs::write(
        settings.join("settings.json"),
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
    )
    .expect("settings.json");
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
        ("HOME".into(), home.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
        ("no_proxy".into(), "127.0.0.1,localhost".into()),
        ("GOOGLE_GEMINI_BASE_URL".into(), gw.root_url()),
        ("GEMINI_API_KEY".into(), GEMINI_KEY.into()),
        ("GEMINI_TELEMETRY_ENABLED".into(), "false".into()),
        ("CI".into(), "1".into()),
        ("GEMINI_CLI_TRUST_WORKSPACE".into(), "true".into()),
    ];
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((k.into(), proxy.clone()));
    }
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(gemini_cli());
    cmd.args(["-p", prompt, "--output-format", "json"])
        .current_dir(&work)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let Ok(out) = tokio::time::timeout(RUN_LIMIT, cmd.output()).await else {
        return Run {
            code: None,
            stdout: String::new(),
            stderr: format!("(killed after {RUN_LIMIT:?})"),
            took: started.elapsed(),
        };
    };
    let out = out.expect("gemini ran");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

fn report(case: &str, r: &Run, mock: &mock_upstream::MockUpstream) {
    let calls: Vec<String> = mock
        .state
        .gemini
        .requests()
        .iter()
        .map(|q| format!("{}:{}", q.model, q.method))
        .collect();
    for q in mock.state.gemini.requests() {
        println!(
            "gemini-cli {case}: {}:{} generationConfig {}",
            q.model, q.method, q.body["generationConfig"]
        );
    }
    println!(
        "gemini-cli {case}: exit {:?} after {:.1}s; upstream calls {calls:?}\nstdout: {}\nstderr (last 5 lines): {}",
        r.code,
        r.took.as_secs_f64(),
        r.stdout.trim(),
        r.stderr
            .trim()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_says_hi_through_the_shipped_config() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let gw = shipped(&mock).start().await;
    let home = tempfile::tempdir().unwrap();
    let r = gemini_say(&gw, home.path(), "say hi").await;
    report("say hi", &r, &mock);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains(mock_upstream::generated_text(3).trim()),
        "the mock's answer: {}",
        r.stdout
    );
    gw.all_settled().await;
    let used = gw
        .used(Scope::Tenant("coder".into()), BudgetName::Tpm)
        .await;
    assert!(used > 0, "metered and settled");
    assert_no_header_holds(&mock.state.requests(), GEMINI_KEY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_stops_on_a_spent_daily_quota() {
    let mock = start_mock().await;
    let mut c = shipped(&mock);
    c.tenants[0].limits.tokens_per_day = Some(1);
    let gw = c.start().await;
    let home = tempfile::tempdir().unwrap();
    let r = gemini_say(&gw, home.path(), "say hi").await;
    report("daily quota spent", &r, &mock);
    assert_ne!(r.code, Some(0), "the CLI reports the refusal");
    assert_eq!(
        mock.state.gemini.requests().len(),
        0,
        "nothing reached the upstream"
    );
}

/// The gateway's clock follows the wall clock (a refusal's `retry-after`
/// elapses while the CLI waits).
fn ticking(gw: &Gateway) {
    let clock = gw.clock.clone();
    tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = Instant::now();
            clock.advance((now - last).as_micros() as u64);
            last = now;
        }
    });
}

/// One request a second (`rpm = 60`, `rpm_burst = 1`): the CLI's calls
/// of one turn come faster, are refused with `retry-after` and a
/// `RetryInfo` of 1 s, and the CLI retries them until they are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_retries_a_rate_refusal_and_is_admitted() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let mut c = shipped(&mock);
    c.tenants[0].limits.rpm = Some(60);
    c.tenants[0].limits.rpm_burst = Some(1);
    let gw = c.start().await;
    ticking(&gw);
    let home = tempfile::tempdir().unwrap();
    let r = gemini_say(&gw, home.path(), "say hi").await;
    report("rate refusals", &r, &mock);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    gw.all_settled().await;
    let refused = gw
        .state
        .recent_refusals
        .json_of("coder", budgetgate::clock::Clock::now_micros(&gw.clock))
        .len();
    println!("gemini-cli rate refusals answered 429: {refused}");
    assert!(
        refused > 0,
        "the turn's calls came faster than one a second"
    );
}
