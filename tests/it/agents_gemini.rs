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
    gemini_run(gw, home, prompt, &[], serde_json::json!({})).await
}

/// `gemini -p prompt` with `args` after it and `settings` merged (at the
/// top level) into `~/.gemini/settings.json`; killed after [`RUN_LIMIT`]
/// (`code` then `None`), so a run can never hang the test.
async fn gemini_run(
    gw: &Gateway,
    home: &Path,
    prompt: &str,
    args: &[&str],
    settings: serde_json::Value,
) -> Run {
    let proxy = closed_port();
    let work = home.join("work");
    std::fs::create_dir_all(&work).expect("the working directory");
    // The API-key method (docs/AGENTS.md): without it `-p` exits 41.
    let dir = home.join(".gemini");
    std::fs::create_dir_all(&dir).expect("~/.gemini");
    let mut all = serde_json::json!({"security": {"auth": {"selectedType": "gemini-api-key"}}});
    if let (Some(all), Some(more)) = (all.as_object_mut(), settings.as_object()) {
        all.extend(more.clone());
    }
    std::fs::write(dir.join("settings.json"), all.to_string()).expect("settings.json");
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
        .args(args)
        .current_dir(&work)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: `gemini` relaunches node as a child
        // (for a larger heap), which killing `gemini` alone leaves
        // running, holding the pipes.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("gemini started");
    let group = child.id();
    // Read while it runs, so what it printed is kept if it must be killed.
    let read = |pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
        tokio::spawn(async move {
            let mut text = Vec::new();
            if let Some(mut p) = pipe {
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut p, &mut text).await;
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let code = match tokio::time::timeout(RUN_LIMIT, child.wait()).await {
        Ok(status) => status.expect("gemini ran").code(),
        Err(_) => {
            if let Some(pgid) = group {
                // The whole group, the relaunched node included.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pgid}")])
                    .status();
            }
            let _ = child.kill().await;
            None
        }
    };
    let drained = Duration::from_secs(10);
    let stdout = tokio::time::timeout(drained, stdout).await;
    let stderr = tokio::time::timeout(drained, stderr).await;
    let stdout = stdout.ok().and_then(Result::ok).unwrap_or_default();
    let mut stderr = stderr.ok().and_then(Result::ok).unwrap_or_default();
    if code.is_none() {
        stderr.push_str(&format!("\n(killed after {RUN_LIMIT:?})"));
    }
    Run {
        code,
        stdout,
        stderr,
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

/// Gemini CLI cut off mid-answer by an output budget. 0.61.0 asks with
/// thinking on and no cap (`thinkingLevel: HIGH` on 3.x models,
/// `thinkingBudget: 8192` on 2.5): a thinking stream is never extended,
/// so no budget cuts it (its reservation is its whole bound, lowered to
/// the room and sent as `maxOutputTokens`). Its `modelConfigs` settings
/// change what it sends: an override on its `chat-base` alias (every
/// turn's) with `thinkingBudget: 0`, on a 2.5 model (`-m`, whose alias
/// states a budget and no level), makes the turn a stream without
/// thinking; the entry is not flagged `reasoning` here, so the stream is
/// extended as it flows and cut off when `output_tpm` refuses an
/// extension. The CLI reads the `MAX_TOKENS` ending as an answer at its
/// limit and exits 0; the gateway counts the stream as cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_is_cut_off_mid_answer_and_exits_cleanly() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20_000);
    let mut c = shipped(&mock);
    c.models[0].reasoning = Some(false);
    c.tenants[0].limits.output_tpm = Some(2_000);
    let gw = c.start().await;
    let home = tempfile::tempdir().unwrap();
    // No thinking on every turn; and no loop detection, which reads the
    // simulated answer's repeated words as a loop and sends the turn
    // again with a feedback message (each refused: the budget is spent).
    let no_thinking = serde_json::json!({
        "modelConfigs": {"customOverrides": [
            {"match": {"model": "chat-base"},
             "modelConfig": {"generateContentConfig": {"thinkingConfig": {"thinkingBudget": 0}}}}
        ]},
        "model": {"disableLoopDetection": true}
    });
    let r = gemini_run(
        &gw,
        home.path(),
        "say hi",
        &["-m", "gemini-2.5-flash"],
        no_thinking,
    )
    .await;
    report("cutoff", &r, &mock);
    let refusals = gw
        .state
        .recent_refusals
        .json_of("coder", budgetgate::clock::Clock::now_micros(&gw.clock));
    println!("gemini-cli cutoff: {} refusals", refusals.len());
    let ended = scrape(&gw).await;
    for ending in [
        "completed",
        "cut_off",
        "over_cap",
        "client_gone",
        "upstream_error",
    ] {
        println!(
            "gemini-cli cutoff: streams ended {ending}: {}",
            sample_sum(
                &ended,
                "budgetgate_streams_ended_total",
                &[("ending", ending)]
            )
        );
    }
    assert!(r.code.is_some(), "the CLI ended by itself: {}", r.stderr);
    let turns: Vec<_> = mock
        .state
        .gemini
        .requests()
        .into_iter()
        .filter(|q| q.method == "streamGenerateContent")
        .collect();
    assert!(!turns.is_empty(), "a streamed turn reached the upstream");
    for q in &turns {
        assert_eq!(
            q.body["generationConfig"]["thinkingConfig"]["thinkingBudget"], 0,
            "the override reached the request: {}",
            q.body["generationConfig"]
        );
    }
    gw.all_settled().await;
    let cut = sample_sum(
        &scrape(&gw).await,
        "budgetgate_streams_ended_total",
        &[("ending", "cut_off")],
    );
    assert!(cut >= 1.0, "the gateway cut a stream off: {cut}");
    let output = gw
        .used(Scope::Tenant("coder".into()), BudgetName::OutputTpm)
        .await;
    assert!(
        output <= 2_000 + 64,
        "within the budget (and one step): {output}"
    );
    assert_eq!(r.code, Some(0), "no client error: {}", r.stderr);
}
