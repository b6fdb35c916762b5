//! The budget page in a real headless browser: Debian's Chromium
//! (`/usr/bin/chromium`, installed with apt-get by
//! `scripts/install-test-deps.sh` when missing; no browser is ever
//! downloaded), driven over WebDriver by Debian's `chromedriver`.
//!
//! Without the token the page shows the prompt and no data; with it, the
//! demo tenant's bars; a bar moves after traffic; a model name written as
//! HTML shows as text and runs nothing; the token is in `sessionStorage`,
//! not in the URL; reached over plain HTTP by a name that is not loopback,
//! it warns. `BUDGETGATE_SCREENSHOT=PATH` saves a screenshot.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::config::model;
use crate::support::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub(crate) const TOKEN: &str = "browser-test-admin-token";
/// A model name that would run script if the page inserted names as HTML.
const HOSTILE_MODEL: &str = "<img src=x onerror=\"document.title='pwned'\">";

pub(crate) fn ensure_browser() {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-test-deps.sh");
    let status = std::process::Command::new(script)
        .arg("chromium")
        .status()
        .expect("run scripts/install-test-deps.sh");
    assert!(status.success(), "installing Debian's chromium failed");
}

/// `config/local.toml` (the README's demo) in front of the test's upstream,
/// with a model whose name is HTML.
fn demo_config(dir: &Path, upstream: &str) -> std::path::PathBuf {
    let mut config = local_config(upstream);
    config.models.push(model(HOSTILE_MODEL, &["mock"]));
    config
        .tenant("demo")
        .model_limits
        .insert(HOSTILE_MODEL.into(), limits().rpm(5));
    config.write(dir)
}

/// `config/local.toml` (the README's demo) in front of the test's upstream.
pub(crate) fn local_config(upstream: &str) -> TestConfig {
    let mut config =
        TestConfig::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/local.toml"));
    let mock = config.upstream("mock");
    assert_eq!(mock.base_url, "http://127.0.0.1:9000/v1");
    mock.base_url = upstream.into();
    config
}

/// A W3C WebDriver session on chromedriver.
pub(crate) struct Browser {
    driver: tokio::process::Child,
    http: reqwest::Client,
    base: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub(crate) async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::new();
        let root = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http.get(format!("{root}/status")).send().await {
                let v: Value = r.json().await.unwrap_or_default();
                if v["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1280,1000",
                    // A name that is not loopback, resolved to 127.0.0.1 by the browser
                    // itself: the plain-HTTP warning without leaving loopback.
                    "--host-resolver-rules=MAP budget.test 127.0.0.1",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let v: Value = http
            .post(format!("{root}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {v}"));
        Browser {
            base: format!("{root}/session/{id}"),
            driver,
            http,
            _profile: profile,
        }
    }

    pub(crate) async fn cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if !body.is_null() {
            req = req.json(&body);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        assert!(v["value"].get("error").is_none(), "WebDriver {path}: {v}");
        v["value"].clone()
    }

    pub(crate) async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    pub(crate) async fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Polls `script` until it returns something other than null/false.
    pub(crate) async fn wait_for(&self, what: &str, script: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let v = self.js(script).await;
            if !(v.is_null() || v == false) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within 15 s; page text: {}",
                self.js("return document.body.innerText").await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn element(&self, css: &str) -> String {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{e}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    pub(crate) async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{e}/click"),
            json!({}),
        )
        .await;
    }

    pub(crate) async fn screenshot(&self, path: &Path) {
        use base64_png::decode;
        let v = self
            .cmd(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        std::fs::write(path, decode(v.as_str().unwrap())).unwrap();
    }

    pub(crate) async fn quit(mut self) {
        let _ = self.http.delete(&self.base).send().await;
        let _ = self.driver.kill().await;
    }
}

/// Base64 (RFC 4648) decoding of WebDriver's screenshot, without a crate.
mod base64_png {
    pub fn decode(text: &str) -> Vec<u8> {
        let value = |c: u8| -> Option<u32> {
            Some(match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return None,
            } as u32)
        };
        let digits: Vec<u32> = text.bytes().filter_map(value).collect();
        let mut out = Vec::with_capacity(digits.len() * 3 / 4);
        for chunk in digits.chunks(4) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, d)| acc | d << (18 - 6 * i));
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
        }
        out
    }
}

const DEMO_DAY_QUOTA: &str = r#"return (() => {
  const row = document.querySelector('.tenant[data-name="demo"] .budget[data-scope="tenant:demo"][data-budget="tokens_per_day"]');
  return row ? Number(row.dataset.remaining) : null;
})()"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_page_shows_the_demo_tenant_and_moves_after_traffic() {
    ensure_browser();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = demo_config(dir.path(), &mock.base_url());
    let gw = GatewayProcess::start(&cfg, &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    let browser = Browser::start().await;
    let page = format!("{}/admin/ui", gw.root);

    // Without the token: the prompt, no data.
    browser.goto(&page).await;
    browser
        .wait_for(
            "the token prompt",
            "return !document.getElementById('token-form').hidden",
        )
        .await;
    let data = browser
        .js("return [document.getElementById('view').hidden, document.querySelectorAll('.budget').length, document.body.innerText.includes('demo')]")
        .await;
    assert_eq!(data, json!([true, 0, false]), "data shown without a token");
    // A wrong token is refused and the prompt comes back with a message.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#token-submit").await;
    browser
        .wait_for(
            "the refusal message",
            "return !document.getElementById('token-error').hidden && document.getElementById('token-error').textContent",
        )
        .await;
    assert_eq!(
        browser
            .js("return document.querySelectorAll('.budget').length")
            .await,
        0
    );

    // With the token: the demo tenant's bars.
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-submit").await;
    let before = browser
        .wait_for("the demo tenant's day quota", DEMO_DAY_QUOTA)
        .await;
    let before = before.as_i64().unwrap();
    assert_eq!(before, 5_000_000);
    let bars = browser
        .js("return Array.from(document.querySelectorAll('.tenant[data-name=\"demo\"] .budget')).map(r => r.dataset.budget + '@' + r.dataset.scope)")
        .await;
    for expected in [
        "rpm@tenant:demo",
        "tpm@tenant:demo",
        "max_concurrent@tenant:demo",
        "tokens_per_day@tenant:demo",
    ] {
        assert!(
            bars.as_array().unwrap().contains(&json!(expected)),
            "{expected} not in {bars}"
        );
    }
    let upstream_bars = browser
        .js("return document.querySelectorAll('.upstream[data-name=\"mock\"] .budget .fill').length")
        .await;
    assert_eq!(upstream_bars, 3);
    let state = browser
        .js("return [location.href, sessionStorage.getItem('budgetgate.adminToken'), document.getElementById('plain-http').hidden]")
        .await;
    assert_eq!(state[0], json!(page), "the token must never be in the URL");
    assert_eq!(state[1], TOKEN);
    assert_eq!(state[2], true, "no plain-HTTP warning on loopback");

    // Names are text, never HTML: the hostile model name shows literally.
    let hostile = browser
        .js("return [document.title, document.querySelectorAll('main img').length, document.body.innerText.includes('onerror=')]")
        .await;
    assert_eq!(hostile[0], "budgetgate · budgets");
    assert_eq!(hostile[1], 0);
    assert_eq!(hostile[2], true, "the model name is shown as text");

    // Traffic: the day quota's bar moves on the next refresh (≤ 5 s).
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root))
        .bearer_auth("sk-local-demo")
        .json(&json!({"model": "gpt-4o-mini", "max_tokens": 20,
            "messages": [{"role": "user", "content": "Hello!"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let moved = browser
        .wait_for(
            "the day quota bar to move",
            &format!("return (() => {{ const v = {}; return v !== null && v < {before} ? v : null; }})()", DEMO_DAY_QUOTA.trim_start_matches("return ")),
        )
        .await;
    assert!(moved.as_i64().unwrap() < before);
    let width = browser
        .js("return document.querySelector('.tenant[data-name=\"demo\"] .budget[data-scope=\"tenant:demo\"][data-budget=\"tokens_per_day\"] .fill').style.width")
        .await;
    assert!(width.as_str().unwrap().ends_with('%'), "{width}");

    if let Ok(path) = std::env::var("BUDGETGATE_SCREENSHOT") {
        browser.screenshot(Path::new(&path)).await;
    }

    // "Forget token" brings the prompt back and drops the data.
    browser.click("#forget").await;
    let after = browser
        .js("return [document.getElementById('token-form').hidden, document.querySelectorAll('.budget').length, sessionStorage.getItem('budgetgate.adminToken')]")
        .await;
    assert_eq!(after, json!([false, 0, null]));

    // Reached by a name that is not loopback over plain HTTP: the warning.
    let port = gw.root.rsplit(':').next().unwrap();
    browser
        .goto(&format!("http://budget.test:{port}/admin/ui"))
        .await;
    let warned = browser
        .wait_for(
            "the plain-HTTP warning",
            "return !document.getElementById('plain-http').hidden && document.getElementById('plain-http').textContent",
        )
        .await;
    assert!(warned.as_str().unwrap().contains("unencrypted"), "{warned}");
    browser.quit().await;
}

/// Nested tenants and end users on the page: a child's card inside its
/// parent's, the limits each end user of a tenant has (not "no limits
/// configured"), and a tenant's recent budget refusals (which budget of
/// which scope, why), so a person sees that a tenant is being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_page_shows_the_tenant_tree_end_user_limits_and_refusals() {
    ensure_browser();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(&mock.base_url());
    config.tenants.push(crate::support::config::tenant(
        "org",
        "org-key",
        "sk-org",
        limits().tpm(100_000),
    ));
    let mut team = crate::support::config::tenant("team", "team-key", "sk-team", limits());
    team.parent = Some("org".into());
    team.end_user_limits = limits().rpm(1);
    config.tenants.push(team);
    let cfg = config.write(dir.path());
    let gw = GatewayProcess::start(
        &cfg,
        &[
            ("BUDGETGATE_ADMIN_TOKEN", TOKEN),
            ("BUDGETGATE_END_USER_KEY", "browser-test-end-user-key"),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let r = client
            .post(format!("{}/v1/chat/completions", gw.root))
            .bearer_auth("sk-team")
            .header("x-budgetgate-end-user", "alice")
            .json(&json!({"model": "gpt-4o-mini", "max_tokens": 5,
                "messages": [{"role": "user", "content": "Hello!"}]}))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 429]);

    let browser = Browser::start().await;
    browser.goto(&format!("{}/admin/ui", gw.root)).await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-submit").await;
    browser
        .wait_for(
            "the team tenant",
            "return document.querySelector('.tenant[data-name=\"team\"]') !== null",
        )
        .await;
    // The tree: team is drawn inside org's card, not beside it.
    let tree = browser
        .js(r#"return [
            document.querySelectorAll('#tenants > .tenant[data-name="org"] > .children > .tenant[data-name="team"]').length,
            document.querySelectorAll('#tenants > .tenant[data-name="team"]').length,
            document.querySelectorAll('#tenants > .tenant[data-name="demo"]').length]"#)
        .await;
    assert_eq!(tree, json!([1, 0, 1]), "team under org; demo a root");
    // End-user limits where the tenant has them.
    let team = browser
        .js(r#"return (() => {
            const t = document.querySelector('.tenant[data-name="team"]');
            const limits = Array.from(t.querySelectorAll(':scope > .end-users .limit')).map(l => l.dataset.budget + '=' + l.dataset.limit);
            const empty = t.querySelector(':scope > .empty');
            const refusals = Array.from(t.querySelectorAll(':scope > .refusals .refusal')).map(r => [r.dataset.budget, r.dataset.scope, r.dataset.reason, r.textContent]);
            return [limits, empty ? empty.textContent : null, refusals];
        })()"#)
        .await;
    assert_eq!(team[0], json!(["rpm=1"]), "{team}");
    assert_eq!(
        team[1],
        Value::Null,
        "no 'no limits configured' beside end-user limits"
    );
    let refusals = team[2].as_array().unwrap();
    assert_eq!(refusals.len(), 1, "{team}");
    assert_eq!(refusals[0][0], "rpm");
    assert!(
        refusals[0][1]
            .as_str()
            .unwrap()
            .starts_with("end_user:team/"),
        "{team}"
    );
    assert_eq!(refusals[0][2], "rate_limited");
    assert!(
        refusals[0][3].as_str().unwrap().contains("rate limit"),
        "{team}"
    );
    // Tenants without refusals show none.
    let others = browser
        .js("return document.querySelectorAll('.tenant[data-name=\"org\"] > .refusals, .tenant[data-name=\"demo\"] > .refusals').length")
        .await;
    assert_eq!(others, 0);
    browser.quit().await;
}

/// A tenant's active runs on the page: one row per run, most tokens
/// first, with the remaining of each of its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_page_shows_a_tenants_runs() {
    ensure_browser();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = local_config(&mock.base_url()).write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    let client = reqwest::Client::new();
    for (run, limits, max_tokens) in [
        ("job-small", "tokens=900", 5),
        ("job-large", "tokens=5000", 50),
    ] {
        let r = client
            .post(format!("{}/v1/chat/completions", gw.root))
            .bearer_auth("sk-local-demo")
            .header("x-budgetgate-run", run)
            .header("x-budgetgate-run-limits", limits)
            .json(&json!({"model": "gpt-4o-mini", "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "Hello!"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{run}");
    }
    let browser = Browser::start().await;
    browser.goto(&format!("{}/admin/ui", gw.root)).await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-submit").await;
    let rows = browser
        .wait_for(
            "the demo tenant's runs",
            r#"return (() => {
                const rows = Array.from(document.querySelectorAll('.tenant[data-name="demo"] > .runs .run'));
                if (rows.length < 2) return null;
                return rows.map(r => [r.dataset.run, Array.from(r.querySelectorAll('.limit')).map(l => [l.dataset.budget, Number(l.dataset.remaining), l.textContent])]);
            })()"#,
        )
        .await;
    assert_eq!(rows[0][0], "job-large", "{rows}");
    assert_eq!(rows[1][0], "job-small", "{rows}");
    let large = &rows[0][1][0];
    assert_eq!(large[0], "tokens_per_24h", "{rows}");
    let left = large[1].as_i64().unwrap();
    assert!(left > 0 && left < 5000, "{rows}");
    assert!(
        large[2].as_str().unwrap().ends_with("/ 5,000 tokens left"),
        "{rows}"
    );
    browser.quit().await;
}

/// The wait queue's depth by class on the page: a request
/// waiting for the deployment's tokens shows as one `standard` waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_page_shows_the_wait_queue_depth() {
    ensure_browser();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(&mock.base_url());
    // 100 tokens of burst refilled at 5 per second: two small requests
    // empty it and a third waits about 9 s.
    config.upstream("mock").limits = limits().tpm(300).tpm_burst(100);
    config.queue = Some(budgetgate::config::raw::RawQueue {
        classes: [(
            "standard".to_string(),
            budgetgate::config::raw::RawQueueClass {
                max_wait_ms: Some(30_000),
                max_starve_ms: None,
            },
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    });
    let cfg = config.write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    let send = {
        let url = format!("{}/v1/chat/completions", gw.root);
        move || {
            let url = url.clone();
            async move {
                reqwest::Client::new()
                    .post(url)
                    .bearer_auth("sk-local-demo")
                    .json(&json!({"model": "gpt-4o-mini", "max_tokens": 40,
                        "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            }
        }
    };
    for _ in 0..2 {
        assert_eq!(send().await.unwrap(), 200);
    }
    let waiter = tokio::spawn(send());
    let browser = Browser::start().await;
    browser.goto(&format!("{}/admin/ui", gw.root)).await;
    browser
        .wait_for(
            "the token prompt",
            "return !document.getElementById('token-form').hidden",
        )
        .await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-submit").await;
    let shown = browser
        .wait_for(
            "one standard waiter",
            "return (() => { const v = document.querySelector('.queue-depth[data-class=\"standard\"] .value'); return v && v.textContent === '1 waiting' ? v.textContent : null; })()",
        )
        .await;
    assert_eq!(shown, json!("1 waiting"));
    let batch = browser
        .js("return document.querySelector('.queue-depth[data-class=\"batch\"] .value').textContent")
        .await;
    assert_eq!(batch, json!("0 waiting"));
    browser.quit().await;
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        200,
        "the waiter is admitted at the refill"
    );
}

/// Writes `docs/budget-page.png` (the screenshot in docs/API.md) from the
/// README's demo config after some traffic:
/// `cargo test --test it budget_page_browser:: -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/budget-page.png; run by hand"]
async fn screenshot_for_the_docs() {
    ensure_browser();
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = local_config(&mock.base_url()).write(dir.path());
    let gw = GatewayProcess::start(&cfg, &[("BUDGETGATE_ADMIN_TOKEN", TOKEN)]).await;
    let client = reqwest::Client::new();
    for (key, n, max_tokens) in [("sk-local-demo", 6, 4000), ("sk-local-trial", 4, 600)] {
        for _ in 0..n {
            let _ = client
                .post(format!("{}/v1/chat/completions", gw.root))
                .bearer_auth(key)
                .json(&json!({"model": "gpt-4o-mini", "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": "Write a long story."}]}))
                .send()
                .await
                .unwrap();
        }
    }
    let browser = Browser::start().await;
    browser.goto(&format!("{}/admin/ui", gw.root)).await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#token-submit").await;
    browser.wait_for("the demo tenant", DEMO_DAY_QUOTA).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/budget-page.png");
    browser.screenshot(&out).await;
    browser.quit().await;
}
