//! The real coding agents against the shipped configs
//! (docs/AGENTS.md): Codex CLI on `config/local.toml` and Claude Code on
//! `config/local-anthropic.toml`, only the simulated upstream's address
//! changed, each CLI with its defaults (model, betas, tools, caps) and a
//! one-line prompt. Each must exit 0 with the mock's answer, after exactly
//! one metered and settled request to the gateway.
//!
//! The CLIs are pinned in `tests/agents/package-lock.json` (integrity
//! hashes) and installed by `scripts/test.sh` (`npm install
//! --include=optional`: their native binaries are optional
//! dependencies). A missing CLI fails the test with the install command;
//! the test is never skipped.
//!
//! Isolation: a temporary `CODEX_HOME` / `CLAUDE_CONFIG_DIR` and `HOME`, an
//! environment cleared of everything but what is set here (the variables
//! docs/AGENTS.md lists), and `HTTP(S)_PROXY` pointing at a closed local
//! port (bound, then dropped), with `NO_PROXY=127.0.0.1,localhost`: any
//! call off the loopback fails at once. Every call to the gateway goes
//! through a tap on the loopback ([`Tap`]) that keeps both directions'
//! bytes: the requests the CLI made, and the status and headers the
//! gateway answered each with, are compared with what the mock received.
//! Codex's other calls (GitHub and chatgpt.com: plugins, catalogues,
//! experiments) fail without harm and are listed in docs/AGENTS.md.
//!
//! Refusals and cutoffs: each CLI against a 429
//! that can never be admitted, a spent quota and a cutoff mid-stream; the
//! gateway's side is asserted (status, `x-should-retry`, attempts, the
//! stream's terminal events), the CLI's exit time, status and text are
//! printed (`--nocapture`) and recorded in docs/AGENTS.md.
//!
//! Run budgets (docs/AGENTS.md, "Per-run budgets"): each CLI sending a
//! run of one request (`ANTHROPIC_CUSTOM_HEADERS`; Codex's `http_headers`
//! and `env_http_headers`), the run's next invocation refused once, and
//! the docs' wrapper, a fresh run id per invocation, admitted.
//!
//! `AGENT_TURNS_RECORD=1` makes the say-hi tests write each CLI's request
//! body, ids stripped and paths neutralised, to
//! `tests/fixtures/agent_turns/<cli>-<version>.json`, with its entry in
//! `recorded.json` there (the benchmark's bodies, `scripts/agent_turns.sh`,
//! and `agent_bodies`' corpus).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use budgetgate::budget::{BudgetName, Scope};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::support::*;

/// How `scripts/test.sh` installs the CLIs.
const INSTALL: &str = "(cd tests/agents && npm install --include=optional)";

/// The longest one CLI run may take.
const RUN_LIMIT: Duration = Duration::from_secs(180);

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

/// The URL of a local port nothing listens on (bound, then released): a
/// proxy there refuses every connection at once.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free local port");
    let url = format!("http://{}", l.local_addr().expect("its address"));
    drop(l);
    url
}

/// Both directions of one connection through the [`Tap`].
#[derive(Default)]
struct Wire {
    up: Vec<u8>,
    down: Vec<u8>,
}

/// One request the CLI made and the gateway's answer to it; its `Debug`
/// (in failure messages) shows the start of the body sent (a CLI's
/// prompt runs to ~100 KB) and of the answer.
struct Exchange {
    /// `POST /v1/messages?beta=true`, …
    request: String,
    /// The request's headers, names lower-cased.
    sent_headers: Vec<(String, String)>,
    /// 0 when no answer came.
    status: u16,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    /// The request's body, as sent.
    sent: String,
    /// The answer's bytes after its head (chunk sizes included).
    body: String,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("request", &self.request)
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("sent", &Capped::head(&self.sent))
            .field("body", &Capped::head(&self.body))
            .finish()
    }
}

/// How much of a CLI's output or of a body a failure message shows.
const SHOWN_BYTES: usize = 2000;

/// At most [`SHOWN_BYTES`] of a text in a failure message: its start (a
/// body) or its end (a CLI's output, whose error comes last), saying how
/// much was left out.
struct Capped<'a> {
    text: &'a str,
    tail: bool,
}

impl<'a> Capped<'a> {
    fn head(text: &'a str) -> Self {
        Capped { text, tail: false }
    }

    fn tail(text: &'a str) -> Self {
        Capped { text, tail: true }
    }
}

impl std::fmt::Display for Capped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.text;
        if t.len() <= SHOWN_BYTES {
            return f.write_str(t);
        }
        let left_out = t.len() - SHOWN_BYTES;
        if self.tail {
            let mut at = left_out;
            while !t.is_char_boundary(at) {
                at += 1;
            }
            write!(f, "[{at} bytes left out]…{}", &t[at..])
        } else {
            let mut at = SHOWN_BYTES;
            while !t.is_char_boundary(at) {
                at -= 1;
            }
            write!(f, "{}…[{} bytes left out]", &t[..at], t.len() - at)
        }
    }
}

impl std::fmt::Debug for Capped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{self}\"")
    }
}

impl Exchange {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn sent_header(&self, name: &str) -> Option<&str> {
        self.sent_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The answer's body without its chunked framing (the gateway relays
    /// streams chunked; a chunk boundary may fall inside a number).
    fn answer(&self) -> String {
        if self.header("transfer-encoding") != Some("chunked") {
            return self.body.clone();
        }
        let mut out = String::new();
        let mut rest = self.body.as_str();
        while let Some((size, after)) = rest.split_once("\r\n") {
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
                break;
            };
            if n == 0 || after.len() < n || !after.is_char_boundary(n) {
                break;
            }
            out.push_str(&after[..n]);
            rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
        }
        out
    }

    /// The input tokens the upstream reported in the answer: its last
    /// `"input_tokens"` (Messages: `message_start`'s usage; Responses: the
    /// terminal event's).
    fn reported_input(&self) -> Option<u64> {
        let answer = self.answer();
        let (_, after) = answer.rsplit_once("\"input_tokens\":")?;
        let digits: String = after
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    }

    /// A model request (not a model list or a token count).
    fn is_turn(&self) -> bool {
        self.request.starts_with("POST /v1/messages ")
            || self.request.starts_with("POST /v1/messages?")
            || self.request.starts_with("POST /v1/responses")
            || self.request.starts_with("POST /v1/chat/completions ")
    }
}

/// A loopback relay in front of the gateway keeping every byte both ways:
/// what the CLI sent and what the gateway answered, as on the wire.
struct Tap {
    url: String,
    wires: Arc<Mutex<Vec<Arc<Mutex<Wire>>>>>,
    /// Admitted requests a test sent straight to the gateway, past the tap.
    past: Arc<std::sync::atomic::AtomicUsize>,
}

async fn tap_of(gw: &Gateway) -> Tap {
    let target = gw.root_url().trim_start_matches("http://").to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the tap");
    let url = format!("http://{}", listener.local_addr().expect("tap address"));
    let wires: Arc<Mutex<Vec<Arc<Mutex<Wire>>>>> = Arc::default();
    let log = wires.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let wire = Arc::new(Mutex::new(Wire::default()));
            log.lock().expect("tap log").push(wire.clone());
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pipe(cr, sw, wire.clone(), true));
            tokio::spawn(pipe(sr, cw, wire, false));
        }
    });
    Tap {
        url,
        wires,
        past: Arc::default(),
    }
}

/// Copies `from` to `to`, keeping the bytes (before writing them on, so a
/// byte the CLI read is always kept).
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, wire: Arc<Mutex<Wire>>, up: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut w = wire.lock().expect("wire");
            if up {
                w.up.extend_from_slice(&buf[..n]);
            } else {
                w.down.extend_from_slice(&buf[..n]);
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Where each message head starting with one of `starts` begins, its
/// first line ending in `line_end` then CRLF (a body is JSON or SSE text,
/// whose strings hold no raw CRLF; the next head may follow a body with
/// no line break).
fn heads(bytes: &[u8], starts: &[&str], line_end: impl Fn(&[u8]) -> bool) -> Vec<usize> {
    (0..bytes.len())
        .filter(|&i| starts.iter().any(|s| bytes[i..].starts_with(s.as_bytes())))
        .filter(|&i| {
            let line = &bytes[i..];
            line.windows(2)
                .position(|x| x == b"\r\n")
                .is_some_and(|end| line_end(&line[..end]))
        })
        .collect()
}

/// `name: value` lines as (lower-cased name, value).
fn header_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

impl Tap {
    /// Every request through the tap, in order of connection, each with
    /// the gateway's answer.
    fn exchanges(&self) -> Vec<Exchange> {
        let mut out = Vec::new();
        for wire in self.wires.lock().expect("tap log").iter() {
            let w = wire.lock().expect("wire");
            let requests = heads(
                &w.up,
                &["GET /", "POST /", "PUT /", "DELETE /", "HEAD /"],
                |l| l.ends_with(b" HTTP/1.1"),
            );
            let answers = heads(&w.down, &["HTTP/1.1 "], |l| {
                l.len() > 12 && l[9..12].iter().all(u8::is_ascii_digit)
            });
            for (n, &at) in requests.iter().enumerate() {
                let line_end = w.up[at..]
                    .windows(2)
                    .position(|x| x == b"\r\n")
                    .map_or(w.up.len(), |p| at + p);
                let request = String::from_utf8_lossy(&w.up[at..line_end]).into_owned();
                let next = requests.get(n + 1).copied().unwrap_or(w.up.len());
                let whole = String::from_utf8_lossy(&w.up[at..next]).into_owned();
                let (sent_head, sent) = whole
                    .split_once("\r\n\r\n")
                    .map_or((whole.as_str(), ""), |(h, b)| (h, b));
                let sent_headers = header_lines(sent_head.split("\r\n").skip(1));
                let sent = sent.to_string();
                let (status, headers, body) = match answers.get(n) {
                    None => (0, Vec::new(), String::new()),
                    Some(&a) => {
                        let end = answers.get(n + 1).copied().unwrap_or(w.down.len());
                        let text = String::from_utf8_lossy(&w.down[a..end]).into_owned();
                        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
                        let mut lines = head.split("\r\n");
                        let status = lines
                            .next()
                            .and_then(|l| l.split(' ').nth(1))
                            .and_then(|c| c.parse().ok())
                            .unwrap_or(0);
                        (status, header_lines(lines), body.to_string())
                    }
                };
                out.push(Exchange {
                    request,
                    sent_headers,
                    sent,
                    status,
                    headers,
                    body,
                });
            }
        }
        out
    }

    /// The model requests ([`Exchange::is_turn`]), after checking that the
    /// gateway answered every request the CLI made and that each turn it
    /// admitted (2xx) reached the mock and nothing else did.
    fn turns(&self, mock: &mock_upstream::MockUpstream) -> Vec<Exchange> {
        let all = self.exchanges();
        for e in &all {
            assert_ne!(e.status, 0, "the gateway never answered {}", e.request);
        }
        let turns: Vec<Exchange> = all.into_iter().filter(Exchange::is_turn).collect();
        let admitted = turns.iter().filter(|e| e.status < 300).count();
        assert_eq!(
            mock.state.requests().len(),
            admitted + self.past.load(std::sync::atomic::Ordering::SeqCst),
            "every turn the gateway admitted reached the mock, and nothing else: {turns:#?}"
        );
        turns
    }
}

/// The environment every CLI runs with (and nothing else of the test's).
fn base_env(home: &Path) -> Vec<(String, String)> {
    let proxy = closed_port();
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
        env.push((k.to_string(), proxy.clone()));
    }
    env
}

/// How one CLI run ended.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    /// The last line the CLI printed (its error, on a refusal).
    fn last_line(&self) -> &str {
        let out = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        out.trim().lines().last().unwrap_or("")
    }
}

/// Runs `program args` in `dir` with `env` only, stdin closed, for at
/// most [`RUN_LIMIT`].
async fn run(program: &Path, args: &[&str], dir: &Path, env: &[(String, String)]) -> Run {
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
    let Ok(out) = tokio::time::timeout(RUN_LIMIT, cmd.output()).await else {
        // Killed on drop; the caller's checks say what the gateway saw.
        return Run {
            code: None,
            stdout: String::new(),
            stderr: format!("(killed after {RUN_LIMIT:?})"),
            took: started.elapsed(),
        };
    };
    let out = out.unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// `config/<file>` as shipped, its upstream pointed at `mock` (Anthropic
/// upstreams take the base URL without `/v1`) and its listener at a free
/// port.
pub(crate) fn shipped(file: &str, mock: &mock_upstream::MockUpstream) -> TestConfig {
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

/// Where one CLI runs: a temporary home (and config dir in it), a working
/// directory, and its environment, pointed at the gateway through `tap`.
struct Setup {
    home: tempfile::TempDir,
    work: PathBuf,
    env: Vec<(String, String)>,
}

fn setup() -> Setup {
    let home = tempfile::tempdir().expect("a temporary home");
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).expect("the working directory");
    let env = base_env(home.path());
    Setup { home, work, env }
}

/// Codex with docs/AGENTS.md's block, pointed at `tap`; `model` left at
/// the CLI's default.
fn codex_setup(tap: &Tap) -> Setup {
    let mut s = setup();
    let codex_home = s.home.path().join("codex-home");
    std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model_provider = \"budgetgate\"\n\n[model_providers.budgetgate]\nname = \"budgetgate\"\nbase_url = \"{}/v1\"\nenv_key = \"BUDGETGATE_API_KEY\"\nwire_api = \"responses\"\n",
            tap.url
        ),
    )
    .expect("config.toml");
    s.env
        .push(("CODEX_HOME".into(), codex_home.display().to_string()));
    s.env
        .push(("BUDGETGATE_API_KEY".into(), "sk-local-demo".into()));
    s
}

/// Claude Code with docs/AGENTS.md's environment, pointed at `tap`.
fn claude_setup(tap: &Tap) -> Setup {
    let mut s = setup();
    let config_dir = s.home.path().join("claude-config");
    std::fs::create_dir_all(&config_dir).expect("CLAUDE_CONFIG_DIR");
    s.env
        .push(("CLAUDE_CONFIG_DIR".into(), config_dir.display().to_string()));
    s.env.push(("ANTHROPIC_BASE_URL".into(), tap.url.clone()));
    s.env
        .push(("ANTHROPIC_API_KEY".into(), "sk-local-claude".into()));
    s
}

async fn codex_say_hi(s: &Setup) -> Run {
    run(
        &cli("codex"),
        &["exec", "--skip-git-repo-check", "say hi"],
        &s.work,
        &s.env,
    )
    .await
}

async fn claude_say_hi(s: &Setup) -> Run {
    run(&cli("claude"), &["-p", "say hi"], &s.work, &s.env).await
}

/// One of the two pinned CLIs, with its shipped config and demo tenant.
#[derive(Clone, Copy)]
enum Agent {
    Codex,
    Claude,
}

impl Agent {
    fn name(self) -> &'static str {
        match self {
            Agent::Codex => "codex",
            Agent::Claude => "claude",
        }
    }

    /// The shipped config the CLI is documented with, and its tenant.
    fn shipped(self, mock: &mock_upstream::MockUpstream) -> (TestConfig, &'static str) {
        match self {
            Agent::Codex => (shipped("local.toml", mock), "demo"),
            Agent::Claude => (shipped("local-anthropic.toml", mock), "coder"),
        }
    }

    fn setup(self, tap: &Tap) -> Setup {
        match self {
            Agent::Codex => codex_setup(tap),
            Agent::Claude => claude_setup(tap),
        }
    }

    async fn say_hi(self, s: &Setup) -> Run {
        match self {
            Agent::Codex => codex_say_hi(s).await,
            Agent::Claude => claude_say_hi(s).await,
        }
    }

    /// A gateway on the agent's shipped config, its tenant's limits
    /// changed by `limits`, the mock answering 12 tokens; its clock moves
    /// with the wall clock when `ticking`.
    async fn gateway(
        self,
        limits: impl FnOnce(Limits) -> Limits,
        tick: bool,
    ) -> (mock_upstream::MockUpstream, Gateway, Tap, Setup) {
        let mock = start_mock().await;
        mock.state.set_output_tokens(12);
        let (mut c, tenant) = self.shipped(&mock);
        with_limits(&mut c, tenant, limits);
        let gw = c.start().await;
        if tick {
            ticking(&gw);
        }
        let tap = tap_of(&gw).await;
        let s = self.setup(&tap);
        (mock, gw, tap, s)
    }

    /// A turn larger than the tenant's `tpm` can ever hold, then a second
    /// turn on a spent `tokens_per_day` (one turn's reservation, as the
    /// first refusal named it, plus 1,000: less than a turn settles at):
    /// one attempt each.
    async fn refused_once(self, too_large_tpm: u64, quota_error: &str) {
        let (mock, _gw, tap, s) = self.gateway(|l| l.tpm(too_large_tpm), false).await;
        let r = self.say_hi(&s).await;
        let turns = tap.turns(&mock);
        report("too-large", self.name(), &r, &turns);
        refused_once(&turns, 0, "can never be admitted");
        let requested: u64 = turns[0]
            .body
            .split("requested ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the refusal names the tokens requested: {turns:#?}"));

        let day = requested + 1_000;
        let (mock, gw, tap, s) = self.gateway(|l| l.tokens_per_day(day), false).await;
        let first = self.say_hi(&s).await;
        assert_eq!(first.code, Some(0), "{}", Capped::tail(&first.stderr));
        gw.all_settled().await;
        let r = self.say_hi(&s).await;
        let turns = tap.turns(&mock);
        report("quota", self.name(), &r, &turns);
        refused_once(&turns, 1, quota_error);
    }

    /// A turn meets `rpm` with no burst left, waits out `retry-after` and
    /// is admitted.
    async fn retried_after_a_rate_refusal(self) {
        // The turn must meet an empty bucket, however long the CLI takes to
        // start (over a second for either on a loaded machine, long enough
        // for a one-second refill: seen [200, 200], no refusal): the test
        // keeps the bucket empty until the CLI's turn arrives.
        let (mock, gw, tap, s) = self.gateway(|l| l.rpm(60).rpm_burst(1), true).await;
        let (key, path, body) = match self {
            Agent::Codex => (
                "sk-local-demo",
                "chat/completions",
                serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}),
            ),
            Agent::Claude => (
                "sk-local-claude",
                "messages",
                serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}),
            ),
        };
        let spender = tokio::spawn(spend_rpm_until_a_turn(
            format!("{}/v1/{path}", gw.root_url()),
            key,
            body,
            tap.wires.clone(),
            tap.past.clone(),
        ));
        let r = self.say_hi(&s).await;
        spender.await.expect("the spender");
        let turns = tap.turns(&mock);
        report("rate", self.name(), &r, &turns);
        retried_after_a_rate_refusal(&turns, &r);
    }
}

/// Keeps a tenant's `rpm` bucket empty with small requests sent straight
/// to the gateway at `url` (past the tap, counted in `past` when admitted)
/// until a model request reaches the tap.
async fn spend_rpm_until_a_turn(
    url: String,
    key: &'static str,
    body: Value,
    wires: Arc<Mutex<Vec<Arc<Mutex<Wire>>>>>,
    past: Arc<std::sync::atomic::AtomicUsize>,
) {
    let client = reqwest::Client::new();
    let turn_seen = || {
        wires.lock().expect("tap log").iter().any(|w| {
            let up = &w.lock().expect("wire").up;
            up.windows(15)
                .any(|x| x == b"POST /v1/messag" || x == b"POST /v1/respon")
        })
    };
    while !turn_seen() {
        let sent = client.post(&url).bearer_auth(key).json(&body).send().await;
        if sent.is_ok_and(|r| r.status().is_success()) {
            past.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints what the CLI did in `case` (docs/AGENTS.md's table).
fn report(case: &str, agent: &str, r: &Run, turns: &[Exchange]) {
    let statuses: Vec<u16> = turns.iter().map(|t| t.status).collect();
    eprintln!(
        "agents_cli {case} {agent}: exit {:?} after {:.1} s; turns answered {statuses:?}; last line: {}",
        r.code,
        r.took.as_secs_f64(),
        r.last_line()
    );
}

/// Keys whose values identify a run, not the turn's shape.
const RUN_IDS: &[&str] = &[
    "user_id",
    "session_id",
    "prompt_cache_key",
    "client_metadata",
    "conversation_id",
    "installation_id",
];

/// The version of the pinned npm package `package` (`tests/agents`).
fn pinned_version(package: &str) -> String {
    let path = repo_path(&format!("tests/agents/node_modules/{package}/package.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; install with {INSTALL}", path.display()));
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    v["version"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no version", path.display()))
        .to_string()
}

/// One manifest entry is written at a time (the say-hi tests run side by side).
static MANIFEST: Mutex<()> = Mutex::new(());

/// With `AGENT_TURNS_RECORD` set, writes the body the CLI (npm `package`)
/// sent in `turn` to `tests/fixtures/agent_turns/<name>-<version>.json`:
/// run ids removed, the temporary home replaced by `/home/user` (also in
/// Claude Code's project-directory form, `/` and `.` as `-`); and its entry
/// in `recorded.json` beside it: the CLI and version, the day, the shipped
/// config it ran on and the input tokens the upstream reported with it.
fn record(name: &str, package: &str, config: &str, turn: &Exchange, home: &Path) {
    if std::env::var_os("AGENT_TURNS_RECORD").is_none() {
        return;
    }
    /// An item id such as `at_01a241fa-1b15-…` (not a schema's `id` property).
    fn is_run_id(v: &Value) -> bool {
        v.as_str().is_some_and(|s| {
            s.split_once('_').is_some_and(|(p, rest)| {
                p.len() <= 8
                    && rest.len() >= 20
                    && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
            })
        })
    }
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|k, v| !(RUN_IDS.contains(&k.as_str()) || (k == "id" && is_run_id(v))));
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let home = home.display().to_string();
    let text = turn
        .sent
        .replace(&home, "/home/user")
        .replace(&home.replace(['/', '.'], "-"), "-home-user");
    let mut v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{name}: the body sent is not plain JSON ({e})"));
    strip(&mut v);
    let version = pinned_version(package);
    let file = format!("{name}-{version}.json");
    let dir = repo_path("tests/fixtures/agent_turns");
    let pretty = serde_json::to_string_pretty(&v).expect("JSON");
    std::fs::write(dir.join(&file), pretty + "\n").expect("write the recorded body");
    let reported = turn
        .reported_input()
        .unwrap_or_else(|| panic!("{name}: no input_tokens in the answer: {turn:#?}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let day = budgetgate::dialects::anthropic::headers::rfc3339(now)[..10].to_string();
    let _one = MANIFEST.lock().unwrap_or_else(|e| e.into_inner());
    let manifest = dir.join("recorded.json");
    let mut entries: serde_json::Map<String, Value> = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    entries.insert(
        file.clone(),
        serde_json::json!({
            "cli": package,
            "version": version,
            "recorded": day,
            "config": format!("config/{config}"),
            "request": turn.request.trim_end_matches(" HTTP/1.1"),
            "input_tokens_reported": reported,
        }),
    );
    let pretty = serde_json::to_string_pretty(&entries).expect("JSON");
    std::fs::write(&manifest, pretty + "\n").expect("write recorded.json");
    eprintln!("recorded {file} (input reported: {reported})");
}

/// Fault: Codex CLI 0.171.0 failed every turn through the gateway as
/// shipped (400 on its `namespace` tool groups; its default model unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_says_hi_through_the_shipped_config() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let gw = shipped("local.toml", &mock).start().await;
    let tap = tap_of(&gw).await;
    let s = codex_setup(&tap);
    let r = codex_say_hi(&s).await;
    assert_eq!(
        r.code,
        Some(0),
        "codex exec failed:\n{}\n{}",
        Capped::tail(&r.stdout),
        Capped::tail(&r.stderr)
    );
    assert!(
        r.stdout.contains(mock_upstream::generated_text(12).trim()),
        "the mock's answer: {}",
        Capped::tail(&r.stdout)
    );
    let turns = tap.turns(&mock);
    assert_eq!(turns.len(), 1, "one turn, one request: {turns:#?}");
    let sent = mock.state.requests();
    assert_eq!(sent[0].path, "/v1/responses");
    let model = sent[0].body["model"].as_str().unwrap_or_default();
    assert!(
        model.starts_with("gpt-6"),
        "the CLI's default model, as it named it: {model}"
    );
    // Codex sends no cap: the turn goes upstream uncapped (the Responses
    // API allows it), its answer bounded by the entry's max_output_tokens.
    assert_eq!(
        sent[0].body.get("max_output_tokens"),
        None,
        "an uncapped turn is forwarded uncapped"
    );
    one_settled_request(&gw, "demo", 16000).await;
    record(
        "codex",
        "@openai/codex",
        "local.toml",
        &turns[0],
        s.home.path(),
    );
    report("say-hi", "codex", &r, &turns);
}

/// Fault: Claude Code 2.1.197 failed as shipped: its default model
/// `claude-opus-4-8` got 404, and any model 400 on its betas; 2.1.332
/// (default `claude-opus-5-5`, `max_tokens: 128000`) got 400 on the
/// `claude-*` entry's `max_output_tokens = 64000`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_print_says_hi_through_the_shipped_config() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let gw = shipped("local-anthropic.toml", &mock).start().await;
    let tap = tap_of(&gw).await;
    let s = claude_setup(&tap);
    let r = claude_say_hi(&s).await;
    assert_eq!(
        r.code,
        Some(0),
        "claude -p failed:\n{}\n{}",
        Capped::tail(&r.stdout),
        Capped::tail(&r.stderr)
    );
    assert!(
        r.stdout.contains(mock_upstream::generated_text(12).trim()),
        "the mock's answer: {}",
        Capped::tail(&r.stdout)
    );
    let turns = tap.turns(&mock);
    assert_eq!(turns.len(), 1, "one turn, one request: {turns:#?}");
    let sent = mock.state.requests();
    assert_eq!(sent[0].path, "/v1/messages");
    assert_eq!(
        sent[0].body["model"], "claude-opus-5-5",
        "its default model"
    );
    let betas = sent[0].header("anthropic-beta").unwrap_or_default();
    assert!(betas.contains("claude-code-20250219"), "{betas}");
    let max_tokens = sent[0].body["max_tokens"].as_u64().unwrap_or(0);
    one_settled_request(&gw, "coder", max_tokens).await;
    record(
        "claude_code",
        "@anthropic-ai/claude-code",
        "local-anthropic.toml",
        &turns[0],
        s.home.path(),
    );
    report("say-hi", "claude", &r, &turns);
}

/// Claude Code's gateway model discovery (docs/AGENTS.md, "Model
/// discovery"), on the shipped config: without
/// `CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY` it never lists models; with
/// it set to 1 it sends `GET /v1/models?limit=1000` with its key as
/// `x-api-key` and `anthropic-version`, which the gateway answers in
/// Anthropic's shape with the concrete names of the `claude-*` entry, and
/// Claude Code keeps them (its `cache/gateway-models.json`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_model_discovery_is_answered_in_anthropics_shape() {
    for enabled in [false, true] {
        let mock = start_mock().await;
        mock.state.set_output_tokens(12);
        let gw = shipped("local-anthropic.toml", &mock).start().await;
        let tap = tap_of(&gw).await;
        let mut s = claude_setup(&tap);
        if enabled {
            s.env.push((
                "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY".into(),
                "1".into(),
            ));
        }
        let r = claude_say_hi(&s).await;
        assert_eq!(
            r.code,
            Some(0),
            "discovery {enabled}: {}",
            Capped::tail(&r.stderr)
        );
        let all = tap.exchanges();
        let lists: Vec<&Exchange> = all
            .iter()
            .filter(|e| e.request.starts_with("GET /v1/models"))
            .collect();
        let requests: Vec<&str> = all.iter().map(|e| e.request.as_str()).collect();
        eprintln!("agents_cli discovery {enabled}: {requests:?}");
        if !enabled {
            assert!(lists.is_empty(), "no discovery unless asked: {lists:#?}");
            continue;
        }
        assert_eq!(lists.len(), 1, "{requests:?}");
        let list = lists[0];
        eprintln!(
            "agents_cli discovery request: {} {:?}",
            list.request, list.sent_headers
        );
        assert_eq!(list.request, "GET /v1/models?limit=1000 HTTP/1.1");
        assert_eq!(list.sent_header("x-api-key"), Some("sk-local-claude"));
        assert_eq!(list.sent_header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(list.status, 200, "{list:#?}");
        let v: Value = serde_json::from_str(&list.answer()).expect("a JSON list");
        let ids: Vec<&str> = v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|m| {
                assert_eq!(m["type"], "model", "{m}");
                m["id"].as_str().expect("id")
            })
            .collect();
        assert_eq!(
            ids,
            [
                "claude-sonnet-4-5",
                "claude-opus-5-5",
                "claude-opus-4-8",
                "claude-haiku-4-5"
            ],
            "the shipped entries' concrete names, no pattern: {v}"
        );
        assert_eq!(v["has_more"], false);
        let cached = s
            .home
            .path()
            .join("claude-config/cache/gateway-models.json");
        let cached = std::fs::read_to_string(&cached)
            .unwrap_or_else(|e| panic!("{}: {e}", cached.display()));
        assert!(cached.contains("claude-opus-5-5"), "{cached}");
    }
}

/// Claude Code naming the person with
/// `ANTHROPIC_CUSTOM_HEADERS`, two sessions (each with its own
/// `metadata.user_id`), under `end_user_limits`: one end user, `alice`,
/// charged with both; the sessions' ids with nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_sessions_naming_alice_charge_one_end_user() {
    end_user_key();
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let mut c = shipped("local-anthropic.toml", &mock);
    c.tenant("coder").end_user_limits = limits().rpm(100);
    let gw = c.start().await;
    let tap = tap_of(&gw).await;
    let mut s = claude_setup(&tap);
    s.env.push((
        "ANTHROPIC_CUSTOM_HEADERS".into(),
        "x-budgetgate-end-user: alice".into(),
    ));
    for session in 1..=2 {
        let r = claude_say_hi(&s).await;
        assert_eq!(
            r.code,
            Some(0),
            "session {session}:\n{}\n{}",
            Capped::tail(&r.stdout),
            Capped::tail(&r.stderr)
        );
    }
    let turns = tap.turns(&mock);
    assert_eq!(turns.len(), 2, "one turn per session: {turns:#?}");
    gw.all_settled().await;
    let tenant = gw
        .used(Scope::Tenant("coder".into()), BudgetName::Rpm)
        .await;
    let alice = gw
        .used(gw.end_user("coder", "alice"), BudgetName::Rpm)
        .await;
    assert_eq!((tenant, alice), (2, 2), "both sessions charged to alice");
    let sessions: Vec<String> = mock
        .state
        .requests()
        .iter()
        .map(|r| {
            r.body["metadata"]["user_id"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_ne!(sessions[0], sessions[1], "two sessions, two user_ids");
    for id in &sessions {
        assert!(!id.is_empty(), "Claude Code sent its metadata.user_id");
        assert_eq!(
            gw.used(gw.end_user("coder", id), BudgetName::Rpm).await,
            0,
            "a session is not an end user: {id}"
        );
    }
}

/// Moves the gateway's clock (frozen at noon in tests) with the wall
/// clock, so that buckets refill while a CLI waits out a `retry-after`.
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

/// `config`'s tenant `name` with its limits changed by `f`.
fn with_limits(c: &mut TestConfig, name: &str, f: impl FnOnce(Limits) -> Limits) {
    let t = c.tenant(name);
    t.limits = f(std::mem::take(&mut t.limits));
}

/// A refusal the CLI must not retry: 429, `x-should-retry: false`, one
/// attempt (the last of `turns`, after `before` admitted turns).
fn refused_once(turns: &[Exchange], before: usize, error: &str) {
    assert_eq!(turns.len(), before + 1, "one attempt: {turns:#?}");
    let last = &turns[before];
    assert_eq!(last.status, 429, "{last:#?}");
    assert_eq!(last.header("x-should-retry"), Some("false"), "{last:#?}");
    assert!(last.body.contains(error), "{last:#?}");
}

/// Codex on a 429 that can never be admitted (a turn larger than the
/// tenant's `tpm`) and on a spent quota: one attempt each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_refusals_get_one_attempt() {
    Agent::Codex
        .refused_once(10_000, "insufficient_quota")
        .await;
}

/// Claude Code on a 429 that can never be admitted and on a spent quota:
/// one attempt each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_refusals_get_one_attempt() {
    Agent::Claude.refused_once(50_000, "tokens_per_day").await;
}

/// Turns Claude Code's thinking off (a thinking stream is never extended,
/// so never cut off): `MAX_THINKING_TOKENS=0` up to 2.1.197,
/// `CLAUDE_CODE_DISABLE_THINKING=1` from 2.1.332 on, which ignores the
/// former.
fn no_thinking(s: &mut Setup) {
    s.env.push(("MAX_THINKING_TOKENS".into(), "0".into()));
    s.env
        .push(("CLAUDE_CODE_DISABLE_THINKING".into(), "1".into()));
}

/// Codex cut off mid-stream (a non-reasoning entry, so the stream is
/// extended, and an `output_tpm` that refuses the extension): the stream
/// ends with `response.incomplete`; one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_cutoff_ends_with_response_incomplete() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(2_000);
    let mut c = shipped("local.toml", &mock);
    let m = c.model("gpt-6*");
    m.reasoning = Some(false);
    m.default_max_output_tokens = Some(256);
    with_limits(&mut c, "demo", |l| l.output_tpm(600));
    let gw = c.start().await;
    let tap = tap_of(&gw).await;
    let r = codex_say_hi(&codex_setup(&tap)).await;
    let turns = tap.turns(&mock);
    report("cutoff", "codex", &r, &turns);
    assert_eq!(turns.len(), 1, "one attempt: {turns:#?}");
    assert_eq!(turns[0].status, 200);
    assert!(
        turns[0].body.contains("response.incomplete"),
        "{}",
        turns[0].body
    );
}

/// Claude Code cut off mid-stream (no thinking, so the stream is extended;
/// `output_tpm` refuses the extension): the stream ends with
/// `message_delta` (`stop_reason: "max_tokens"`) and `message_stop`, and
/// the connection closes. Claude Code reads that as its output limit and
/// asks for the rest, three times (each refused with 429 and
/// `retry-after` until `output_tpm` refills, then cut off again): with a
/// bucket refilling 1,000 tokens a second, as here, it exits in seconds;
/// at `output_tpm = 6000` each wait is ~40 s (docs/AGENTS.md). A faster
/// refill (10,000 a second) outran the simulated stream on a loaded
/// machine: 2.1.332's 20,000 tokens came whole, never cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_cutoff_ends_with_message_stop() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20_000);
    let mut c = shipped("local-anthropic.toml", &mock);
    with_limits(&mut c, "coder", |l| {
        l.output_tpm(60_000).output_tpm_burst(6_000)
    });
    let gw = c.start().await;
    ticking(&gw);
    let tap = tap_of(&gw).await;
    let mut s = claude_setup(&tap);
    no_thinking(&mut s);
    let r = claude_say_hi(&s).await;
    let turns = tap.turns(&mock);
    report("cutoff", "claude", &r, &turns);
    assert!(!turns.is_empty());
    for t in &turns {
        match t.status {
            200 => {
                assert!(
                    t.body.contains(r#""stop_reason":"max_tokens""#)
                        && t.body.contains("event: message_stop"),
                    "a cutoff's terminal events: {}",
                    t.body
                );
            }
            429 => assert!(t.header("retry-after").is_some(), "{t:#?}"),
            other => panic!("{other}: {t:#?}"),
        }
    }
    let streams = turns.iter().filter(|t| t.status == 200).count();
    assert!(
        streams <= 4,
        "the first turn and at most three resumes: {turns:#?}"
    );
}

/// A rate refusal is one the CLI may retry: 429 with `retry-after` (and no
/// `x-should-retry: false`); `rpm` refills one request a second, so the
/// CLI's retry after it is admitted and the turn ends well.
fn retried_after_a_rate_refusal(turns: &[Exchange], r: &Run) {
    let first_refusal = turns
        .iter()
        .position(|t| t.status == 429)
        .unwrap_or_else(|| panic!("a rate refusal: {turns:#?}"));
    let refusal = &turns[first_refusal];
    assert!(refusal.header("retry-after").is_some(), "{refusal:#?}");
    assert_ne!(
        refusal.header("x-should-retry"),
        Some("false"),
        "{refusal:#?}"
    );
    assert!(
        turns[first_refusal..].iter().any(|t| t.status == 200),
        "the retry after retry-after is admitted: {turns:#?}"
    );
    assert_eq!(r.code, Some(0), "{}", Capped::tail(&r.stderr));
}

/// Both CLIs on a rate refusal: a turn meets `rpm`
/// with no burst left, waits out `retry-after` and is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_refusals_are_retried_after_retry_after_and_admitted() {
    Agent::Codex.retried_after_a_rate_refusal().await;
    Agent::Claude.retried_after_a_rate_refusal().await;
}

/// The shipped Claude Code config with its deployment moved to Claude on
/// Bedrock, on the mock's Bedrock `api` (`invoke`: InvokeModel
/// with event-stream answers; `messages`: the Anthropic Messages endpoint
/// of bedrock-mantle / bedrock-runtime), keyed by a Bedrock API key; every
/// Claude name maps to `us.anthropic.<name>-v1:0`.
fn shipped_on_bedrock(mock: &mock_upstream::MockUpstream, api: &str) -> TestConfig {
    mock.state.bedrock.set_api_key(env!("CARGO_PKG_NAME"));
    let mut c = shipped("local-anthropic.toml", mock);
    for u in &mut c.upstreams {
        u.kind = Some("bedrock".into());
        u.anthropic_version = None;
        u.api_key_env = Some("CARGO_PKG_NAME".into());
        u.models = Some(
            [
                (
                    "claude-*".to_string(),
                    "us.anthropic.{model}-v1:0".to_string(),
                ),
                (
                    "claude-sonnet-4-5".to_string(),
                    "us.anthropic.claude-sonnet-4-5-v1:0".to_string(),
                ),
            ]
            .into(),
        );
        u.bedrock = Some(budgetgate::config::bedrock::RawBedrock {
            region: Some("us-east-1".into()),
            api: Some(api.into()),
            ..Default::default()
        });
    }
    c
}

/// Claude Code through `ANTHROPIC_BASE_URL` at a gateway whose deployment
/// is Claude on Bedrock, each endpoint: `claude -p "say hi"` exits 0 with
/// the mock's answer after one metered, settled turn, sent as Bedrock asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_print_says_hi_through_bedrock_on_each_endpoint() {
    for api in ["invoke", "messages"] {
        let mock = start_mock().await;
        mock.state.set_output_tokens(12);
        let gw = shipped_on_bedrock(&mock, api).start().await;
        let tap = tap_of(&gw).await;
        let s = claude_setup(&tap);
        let r = claude_say_hi(&s).await;
        assert_eq!(
            r.code,
            Some(0),
            "{api}: claude -p failed:\n{}\n{}",
            Capped::tail(&r.stdout),
            Capped::tail(&r.stderr)
        );
        assert!(
            r.stdout.contains(mock_upstream::generated_text(12).trim()),
            "{api}: the mock's answer: {}",
            Capped::tail(&r.stdout)
        );
        let turns = tap.turns(&mock);
        assert_eq!(turns.len(), 1, "{api}: one turn: {turns:#?}");
        let sent = &mock.state.requests()[0];
        match api {
            "invoke" => {
                assert_eq!(
                    sent.path,
                    "/model/us.anthropic.claude-opus-5-5-v1%3A0/invoke-with-response-stream"
                );
                assert_eq!(sent.body["anthropic_version"], "bedrock-2023-05-31");
                let betas = sent.body["anthropic_beta"].to_string();
                assert!(betas.contains("claude-code-20250219"), "{betas}");
            }
            _ => {
                assert_eq!(sent.path, "/anthropic/v1/messages");
                assert_eq!(sent.body["model"], "us.anthropic.claude-opus-5-5-v1:0");
            }
        }
        let max_tokens = sent.body["max_tokens"].as_u64().unwrap_or(0);
        one_settled_request(&gw, "coder", max_tokens).await;
        report(&format!("say-hi-bedrock-{api}"), "claude", &r, &turns);
    }
}

/// A cutoff on a Bedrock (InvokeModel) deployment ends Claude Code's
/// stream with `message_delta` (`stop_reason: "max_tokens"`) and
/// `message_stop`, as on an Anthropic one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_cutoff_on_bedrock_ends_with_message_stop() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20_000);
    let mut c = shipped_on_bedrock(&mock, "invoke");
    // Refilling 1000 tokens a second, slower than the mock streams through
    // the event-stream decoder (about 2000 a second here), so the stream
    // outruns the bucket and is cut off.
    with_limits(&mut c, "coder", |l| {
        l.output_tpm(60_000).output_tpm_burst(6_000)
    });
    let gw = c.start().await;
    ticking(&gw);
    let tap = tap_of(&gw).await;
    let mut s = claude_setup(&tap);
    no_thinking(&mut s);
    let r = claude_say_hi(&s).await;
    let turns = tap.turns(&mock);
    report("cutoff-bedrock", "claude", &r, &turns);
    assert!(turns.iter().any(|t| t.status == 200));
    for t in turns.iter().filter(|t| t.status == 200) {
        assert!(
            t.body.contains(r#""stop_reason":"max_tokens""#)
                && t.body.contains("event: message_stop"),
            "a cutoff's terminal events: {}",
            t.body
        );
    }
}

/// `config/local-anthropic.toml` with its deployment a `vertex`
/// one of the mock Vertex (service-account key file), the mock answering
/// `output_tokens`; the tenant's limits changed by `limits`.
async fn claude_on_vertex(
    output_tokens: u64,
    limits: impl FnOnce(Limits) -> Limits,
) -> (
    crate::support::mock_upstream::vertex::VertexMock,
    Gateway,
    Tap,
    Setup,
    tempfile::TempDir,
) {
    let m = crate::vertex::start_vertex().await;
    m.state.messages.set_output_tokens(output_tokens);
    let dir = tempfile::tempdir().expect("a directory for the key");
    let key = crate::vertex::key_file(dir.path(), &m);
    let mut c = TestConfig::read(&repo_path("config/local-anthropic.toml"));
    c.server.listen = Some("127.0.0.1:0".into());
    for u in &mut c.upstreams {
        let limits = std::mem::take(&mut u.limits);
        *u = budgetgate::config::raw::RawUpstream {
            limits,
            ..crate::vertex::deployment(&u.name, &m, crate::vertex::EAST, Some(&key))
        };
    }
    with_limits(&mut c, "coder", limits);
    let gw = c.start().await;
    let tap = tap_of(&gw).await;
    let s = Agent::Claude.setup(&tap);
    (m, gw, tap, s, dir)
}

/// `claude -p "say hi"` through a `vertex`
/// deployment exits 0 with the mock's answer; its turn went to
/// `streamRawPredict` of the region with the CLI's model in the path, and
/// was metered and settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_print_says_hi_through_a_vertex_deployment() {
    let (m, gw, tap, s, _dir) = claude_on_vertex(12, |l| l).await;
    let r = Agent::Claude.say_hi(&s).await;
    assert_eq!(
        r.code,
        Some(0),
        "claude -p failed:\n{}\n{}",
        Capped::tail(&r.stdout),
        Capped::tail(&r.stderr)
    );
    assert!(
        r.stdout.contains(mock_upstream::generated_text(12).trim()),
        "the mock's answer: {}",
        Capped::tail(&r.stdout)
    );
    let turns: Vec<Exchange> = tap
        .exchanges()
        .into_iter()
        .filter(Exchange::is_turn)
        .collect();
    assert_eq!(turns.len(), 1, "one turn: {turns:#?}");
    let sent = m.state.requests();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!(sent[0].method, "streamRawPredict");
    assert_eq!(
        sent[0].model, "claude-opus-5-5",
        "its default model, in the path"
    );
    assert_eq!(sent[0].region, crate::vertex::EAST);
    assert!(sent[0].body.get("model").is_none());
    assert_eq!(m.state.refused(), 0);
    let betas = sent[0].header("anthropic-beta").unwrap_or_default();
    assert!(betas.contains("claude-code-20250219"), "{betas}");
    let max_tokens = sent[0].body["max_tokens"].as_u64().unwrap_or(0);
    one_settled_request(&gw, "coder", max_tokens).await;
    report("say-hi", "claude (vertex)", &r, &turns);
}

/// A cutoff on a `vertex` deployment ends Claude
/// Code's stream with Messages' terminal events (`message_delta` with
/// `stop_reason: "max_tokens"`, then `message_stop`), as on `anthropic`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_cutoff_on_a_vertex_deployment_ends_with_message_stop() {
    let (_m, gw, tap, mut s, _dir) =
        claude_on_vertex(20_000, |l| l.output_tpm(60_000).output_tpm_burst(6_000)).await;
    ticking(&gw);
    no_thinking(&mut s);
    let r = Agent::Claude.say_hi(&s).await;
    let turns: Vec<Exchange> = tap
        .exchanges()
        .into_iter()
        .filter(Exchange::is_turn)
        .collect();
    report("cutoff", "claude (vertex)", &r, &turns);
    assert!(turns.iter().any(|t| t.status == 200), "{turns:#?}");
    for t in &turns {
        match t.status {
            200 => assert!(
                t.body.contains(r#""stop_reason":"max_tokens""#)
                    && t.body.contains("event: message_stop"),
                "a cutoff's terminal events: {}",
                t.body
            ),
            429 => assert!(t.header("retry-after").is_some(), "{t:#?}"),
            other => panic!("{other}: {t:#?}"),
        }
    }
}

/// OpenCode's two provider kinds, each on the shipped config of its
/// dialect: an OpenAI-compatible provider (`@ai-sdk/openai-compatible`,
/// Chat Completions) on `config/local.toml`, an Anthropic one
/// (`@ai-sdk/anthropic`, Messages) on `config/local-anthropic.toml`.
#[derive(Clone, Copy, Debug)]
enum OpenCode {
    OpenAi,
    Anthropic,
}

impl OpenCode {
    /// The shipped config, its tenant, and the model and its output limit
    /// as docs/AGENTS.md's `opencode.json` names them.
    fn shipped(self, mock: &mock_upstream::MockUpstream) -> (TestConfig, &'static str) {
        match self {
            OpenCode::OpenAi => (shipped("local.toml", mock), "demo"),
            OpenCode::Anthropic => (shipped("local-anthropic.toml", mock), "coder"),
        }
    }

    /// docs/AGENTS.md's `opencode.json`, pointed at `tap`, and an
    /// environment turning off OpenCode's own calls (model catalogue,
    /// updates, LSP downloads, default plugins).
    fn setup(self, tap: &Tap) -> Setup {
        let mut s = setup();
        let (npm, model, key, output) = match self {
            OpenCode::OpenAi => (
                "@ai-sdk/openai-compatible",
                "gpt-4o-mini",
                "sk-local-demo",
                16384,
            ),
            OpenCode::Anthropic => (
                "@ai-sdk/anthropic",
                "claude-sonnet-4-5",
                "sk-local-claude",
                64000,
            ),
        };
        let config = serde_json::json!({
            "$schema": "https://opencode.ai/config.json",
            "model": format!("budgetgate/{model}"),
            "autoupdate": false,
            "share": "disabled",
            "provider": {"budgetgate": {
                "npm": npm,
                "name": "budgetgate",
                "options": {"baseURL": format!("{}/v1", tap.url), "apiKey": key},
                "models": {model: {"name": model, "limit": {"context": 200000, "output": output}}},
            }},
        });
        let path = s.home.path().join("opencode.json");
        std::fs::write(&path, config.to_string()).expect("opencode.json");
        let home = s.home.path().display().to_string();
        for (k, v) in [
            ("OPENCODE_CONFIG", path.display().to_string()),
            ("XDG_CONFIG_HOME", format!("{home}/.config")),
            ("XDG_DATA_HOME", format!("{home}/.local/share")),
            ("XDG_CACHE_HOME", format!("{home}/.cache")),
            ("XDG_STATE_HOME", format!("{home}/.local/state")),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
            ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".into()),
        ] {
            s.env.push((k.into(), v));
        }
        s
    }

    async fn say_hi(s: &Setup) -> Run {
        run(&cli("opencode"), &["run", "say hi"], &s.work, &s.env).await
    }

    /// A gateway on the shipped config, the tenant's limits changed by
    /// `limits`, the mock answering `output_tokens`. With `incremental`,
    /// an OpenAI model's stream reserves its default output first and is
    /// extended up to OpenCode's cap (by default it reserves the cap whole,
    /// and is refused up front rather than cut off).
    async fn gateway(
        self,
        output_tokens: u64,
        limits: impl FnOnce(Limits) -> Limits,
        incremental: bool,
    ) -> (mock_upstream::MockUpstream, Gateway, Tap, Setup) {
        let mock = start_mock().await;
        mock.state.set_output_tokens(output_tokens);
        let (mut c, tenant) = self.shipped(&mock);
        with_limits(&mut c, tenant, limits);
        if incremental {
            c.model("gpt-4o-mini").client_cap_reservation = Some("incremental".into());
        }
        let gw = c.start().await;
        let tap = tap_of(&gw).await;
        let s = self.setup(&tap);
        (mock, gw, tap, s)
    }

    /// Say hi, a request larger than the tenant's `tpm` can ever hold, and
    /// a cutoff mid-stream, on this provider kind.
    async fn cases(self) {
        let name = format!("opencode ({self:?})");
        let (mock, gw, tap, s) = self.gateway(12, |l| l, false).await;
        let r = Self::say_hi(&s).await;
        let turns = tap.turns(&mock);
        report("say-hi", &name, &r, &turns);
        assert_eq!(r.code, Some(0), "{name}:\n{}\n{}", r.stdout, r.stderr);
        assert!(
            r.stdout.contains(mock_upstream::generated_text(12).trim()),
            "{name}: the mock's answer: {}",
            r.stdout
        );
        assert!(
            !turns.is_empty() && turns.iter().all(|t| t.status == 200),
            "{name}: {turns:#?}"
        );
        gw.all_settled().await;

        // Every request (its title request too) larger than `tpm` can ever
        // hold. OpenCode retries a 429 despite `x-should-retry: false`
        // (docs/AGENTS.md): the number of attempts is printed, not asserted.
        let (mock, _gw, tap, s) = self.gateway(12, |l| l.tpm(100), false).await;
        let r = Self::say_hi(&s).await;
        let turns = tap.turns(&mock);
        report("too-large", &name, &r, &turns);
        assert_ne!(r.code, Some(0), "{name}: {}", r.stdout);
        assert!(!turns.is_empty(), "{name}: no request");
        for t in &turns {
            assert_eq!(t.status, 429, "{name}: {t:#?}");
            assert_eq!(t.header("x-should-retry"), Some("false"), "{t:#?}");
            assert!(t.body.contains("can never be admitted"), "{t:#?}");
        }

        // The first reservation (the entry's default output) fits; the
        // extensions outrun a refill of 1,000 tokens a second.
        let (mock, gw, tap, s) = self
            .gateway(
                20_000,
                |l| l.output_tpm(60_000).output_tpm_burst(6_000),
                matches!(self, OpenCode::OpenAi),
            )
            .await;
        ticking(&gw);
        let r = Self::say_hi(&s).await;
        let turns = tap.turns(&mock);
        report("cutoff", &name, &r, &turns);
        assert!(
            turns.iter().any(|t| t.status == 200
                && (t.body.contains(r#""stop_reason":"max_tokens""#)
                    && t.body.contains("event: message_stop")
                    || t.body.contains(r#""finish_reason":"length""#)
                        && t.body.contains("data: [DONE]"))),
            "{name}: a stream cut off with its terminal events: {turns:#?}"
        );
    }
}

/// OpenCode with an OpenAI-compatible provider on `config/local.toml`:
/// says hi, is refused once, is cut off (docs/AGENTS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_openai_compatible_provider_through_the_shipped_config() {
    OpenCode::OpenAi.cases().await;
}

/// OpenCode with its Anthropic provider on `config/local-anthropic.toml`:
/// says hi, is refused once, is cut off (docs/AGENTS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_anthropic_provider_through_the_shipped_config() {
    OpenCode::Anthropic.cases().await;
}

/// The run limits the per-run tests give each run: one request, so the
/// first invocation of a run spends it.
const RUN_LIMITS: &str = "requests=1, window=24h";

/// docs/AGENTS.md's wrappers ("Per-run budgets"): each invocation a fresh
/// run id, `/proc/sys/kernel/random/uuid` (`uuidgen` where installed).
const CLAUDE_RUN_WRAPPER: &str = r#"#!/usr/bin/env bash
# claude-run: each invocation of Claude Code is one run of its own
run=$(cat /proc/sys/kernel/random/uuid)
export ANTHROPIC_CUSTOM_HEADERS="x-budgetgate-run: $run
x-budgetgate-run-limits: ${BUDGETGATE_RUN_LIMITS:-tokens=400000, window=24h}"
exec claude "$@"
"#;

const CODEX_RUN_WRAPPER: &str = r#"#!/usr/bin/env bash
# codex-run: each invocation of Codex is one run of its own
BUDGETGATE_RUN=$(cat /proc/sys/kernel/random/uuid)
export BUDGETGATE_RUN
exec codex "$@"
"#;

/// `name=value` in the CLI's environment, replacing an earlier value.
fn set_env(s: &mut Setup, name: &str, value: &str) {
    s.env.retain(|(k, _)| k != name);
    s.env.push((name.into(), value.into()));
}

/// The requests run `id` of `tenant` (its limits [`RUN_LIMITS`]) holds
/// in its window, read from the store.
async fn run_requests(gw: &Gateway, tenant: &str, id: &str) -> u64 {
    let policy = gw.state.policy.load_full();
    let ks = budgetgate::gateway::AppState::key_space(&policy);
    let t = policy
        .tenants
        .iter()
        .find(|t| t.name == tenant)
        .unwrap_or_else(|| panic!("no tenant {tenant}"));
    let asked = budgetgate::config::run::parse(RUN_LIMITS).expect("the run's limits");
    let limits =
        budgetgate::config::run::RunLimits::resolve(Some(&asked), &t.runs.default, &t.runs.max)
            .expect("within the ceiling");
    let scope = Scope::Run(tenant.into(), id.into());
    let specs: Vec<_> = budgetgate::admission::plan::run_plan(&ks, t, &scope, &limits)
        .0
        .into_iter()
        .filter(|s| s.name == BudgetName::RequestsPer24h)
        .collect();
    assert_eq!(specs.len(), 1, "{scope} has one requests_per_24h budget");
    let state = gw
        .store
        .inspect(&specs)
        .await
        .expect("inspect")
        .pop()
        .expect("one state");
    (state.limit as i64 - state.remaining) as u64
}

impl Agent {
    fn tenant(self) -> &'static str {
        match self {
            Agent::Codex => "demo",
            Agent::Claude => "coder",
        }
    }

    /// The CLI set up to send every turn with run `id` and [`RUN_LIMITS`]:
    /// Claude Code's `ANTHROPIC_CUSTOM_HEADERS` (one `Name: value` a line);
    /// Codex's provider block, the limits a static `http_headers` value and
    /// the id read from `BUDGETGATE_RUN` (`env_http_headers`).
    fn set_run(self, s: &mut Setup, id: &str) {
        match self {
            Agent::Claude => set_env(
                s,
                "ANTHROPIC_CUSTOM_HEADERS",
                &format!("x-budgetgate-run: {id}\nx-budgetgate-run-limits: {RUN_LIMITS}"),
            ),
            Agent::Codex => {
                let config = s.home.path().join("codex-home/config.toml");
                let text = std::fs::read_to_string(&config).expect("config.toml");
                if !text.contains("env_http_headers") {
                    // The provider block is the file's last table: these
                    // lines belong to it.
                    let block = format!(
                        "http_headers = {{ \"x-budgetgate-run-limits\" = \"{RUN_LIMITS}\" }}\nenv_http_headers = {{ \"x-budgetgate-run\" = \"BUDGETGATE_RUN\" }}\n"
                    );
                    std::fs::write(&config, text + &block).expect("config.toml");
                }
                set_env(s, "BUDGETGATE_RUN", id);
            }
        }
    }

    /// The wrapper of docs/AGENTS.md, written beside the CLI's home, and
    /// the environment it runs in (the pinned CLI first on `PATH`).
    fn wrapper(self, s: &mut Setup) -> PathBuf {
        let (name, text) = match self {
            Agent::Claude => ("claude-run", CLAUDE_RUN_WRAPPER),
            Agent::Codex => ("codex-run", CODEX_RUN_WRAPPER),
        };
        let path = s.home.path().join(name);
        std::fs::write(&path, text).expect("the wrapper");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .expect("the wrapper made executable");
        }
        let bin = cli(self.name());
        let dir = bin
            .parent()
            .expect("the CLIs' directory")
            .display()
            .to_string();
        let path_var = s
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or(String::new(), |(_, v)| v.clone());
        set_env(s, "PATH", &format!("{dir}:{path_var}"));
        if matches!(self, Agent::Claude) {
            set_env(s, "BUDGETGATE_RUN_LIMITS", RUN_LIMITS);
        }
        path
    }

    /// A run of one request: its first invocation is admitted, the next
    /// invocation of the same run is refused once (429 of the dialect's
    /// quota `error_type`, `x-should-retry: false`, naming the run; no
    /// upstream request) and the CLI exits with `shown` in what it prints;
    /// an invocation through the wrapper, a fresh run id, is admitted.
    async fn run_budget_spent(self, error_type: &str, shown: &str) {
        let tenant = self.tenant();
        let (mock, gw, tap, mut s) = self.gateway(|l| l, false).await;

        self.set_run(&mut s, "job-1");
        let first = self.say_hi(&s).await;
        assert_eq!(
            first.code,
            Some(0),
            "the run's first invocation:\n{}\n{}",
            Capped::tail(&first.stdout),
            Capped::tail(&first.stderr)
        );
        let turns = tap.turns(&mock);
        assert_eq!(turns.len(), 1, "one turn: {turns:#?}");
        assert_eq!(turns[0].status, 200, "{:#?}", turns[0]);
        assert_eq!(turns[0].sent_header("x-budgetgate-run"), Some("job-1"));
        assert_eq!(
            turns[0].sent_header("x-budgetgate-run-limits"),
            Some(RUN_LIMITS)
        );
        gw.all_settled().await;
        assert_eq!(
            run_requests(&gw, tenant, "job-1").await,
            1,
            "the run's one request"
        );
        report("run-first", self.name(), &first, &turns);

        let spent = self.say_hi(&s).await;
        let turns = tap.turns(&mock);
        report("run-spent", self.name(), &spent, &turns);
        refused_once(&turns, 1, &format!("run:{tenant}/job-1"));
        let refused = &turns[1];
        assert!(
            refused.body.contains(error_type) && refused.body.contains("requests_per_24h"),
            "{refused:#?}"
        );
        assert_eq!(mock.state.requests().len(), 1, "nothing went upstream");
        assert_ne!(spent.code, Some(0), "the CLI fails the invocation");
        let printed = format!("{}\n{}", spent.stdout, spent.stderr);
        assert!(
            printed.contains(shown),
            "the CLI shows {shown:?}:\n{}\n{}",
            Capped::tail(&spent.stdout),
            Capped::tail(&spent.stderr)
        );
        gw.all_settled().await;
        assert_eq!(
            run_requests(&gw, tenant, "job-1").await,
            1,
            "the refusal charged nothing"
        );

        // A wrapper exporting a fresh run id per invocation: each
        // invocation a run of its own, admitted while job-1 stays spent.
        let wrapper = self.wrapper(&mut s);
        let args: &[&str] = match self {
            Agent::Codex => &["exec", "--skip-git-repo-check", "say hi"],
            Agent::Claude => &["-p", "say hi"],
        };
        let mut ids = Vec::new();
        for n in 1..=2 {
            let r = run(&wrapper, args, &s.work, &s.env).await;
            assert_eq!(
                r.code,
                Some(0),
                "invocation {n} through the wrapper:\n{}\n{}",
                Capped::tail(&r.stdout),
                Capped::tail(&r.stderr)
            );
            let turns = tap.turns(&mock);
            report("run-fresh", self.name(), &r, &turns);
            assert_eq!(turns.len(), 2 + n, "one turn more: {turns:#?}");
            let last = &turns[1 + n];
            assert_eq!(last.status, 200, "{last:#?}");
            let id = last
                .sent_header("x-budgetgate-run")
                .unwrap_or_else(|| panic!("the wrapper's run id: {last:#?}"))
                .to_string();
            assert!(
                uuid::Uuid::parse_str(&id).is_ok(),
                "a fresh UUID per invocation: {id}"
            );
            gw.all_settled().await;
            assert_eq!(
                run_requests(&gw, tenant, &id).await,
                1,
                "run {id}: its one request"
            );
            ids.push(id);
        }
        assert_ne!(ids[0], ids[1], "each invocation its own run");
        assert_eq!(mock.state.requests().len(), 3);
        assert_eq!(run_requests(&gw, tenant, "job-1").await, 1);
    }
}

/// Claude Code with a run of one request in `ANTHROPIC_CUSTOM_HEADERS`:
/// the run's second invocation is refused once, naming the run, and
/// Claude Code prints the gateway's message and exits 1; a fresh run id
/// per invocation (the wrapper) is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_run_budget_spent_is_refused_once() {
    Agent::Claude
        .run_budget_spent(
            "rate_limit_error",
            "Quota exceeded for run budget run:coder/job-1",
        )
        .await;
}

/// Codex with a run of one request in its provider block
/// (`http_headers`, `env_http_headers`): the run's second invocation is
/// refused once and Codex exits 1; a fresh run id per invocation (the
/// wrapper) is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_run_budget_spent_is_refused_once() {
    Agent::Codex
        .run_budget_spent("insufficient_quota", "Quota exceeded")
        .await;
}
