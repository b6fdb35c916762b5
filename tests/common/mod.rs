//! Shared harness for integration tests: the simulated upstream and the
//! gateway in-process (frozen clock), and a runner for the official
//! `openai` Python SDK scripts under `tests/python/`.
#![allow(dead_code)]

#[path = "../../examples/mock_upstream.rs"]
pub mod mock_upstream;
pub mod redis_server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use budgetgate::clock::{Clock, ManualClock};
use budgetgate::config::{hash_key, Policy};
use budgetgate::reserve::memory::MemoryStore;
use budgetgate::reserve::BudgetStore;
use budgetgate::server::AppState;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The API key every test tenant uses.
pub const KEY: &str = "sk-test-budgetgate";

/// 2026-11-30T12:00:00Z in UTC microseconds: mid-day, far from a quota boundary.
pub const NOON: u64 = 1_796_040_000_000_000;

/// A gateway running in this process.
pub struct Gateway {
    pub addr: std::net::SocketAddr,
    pub state: Arc<AppState>,
    pub clock: ManualClock,
    pub store: Arc<MemoryStore>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Gateway {
    /// `http://127.0.0.1:PORT/v1`
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT`
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The gateway's Prometheus exposition text (`GET /metrics`).
    pub async fn metrics_text(&self) -> String {
        reqwest::get(format!("{}/metrics", self.root_url()))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body")
    }

    /// Waits until every settlement task has finished.
    pub async fn settled(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.state.settlements.wait_idle())
            .await
            .expect("settlements did not finish within 10 s");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// The `keys = [...]` line of a tenant using the test key.
pub fn key_line() -> String {
    format!("keys = [{{ id = \"k1\", sha256 = \"{}\" }}]", hash_key(KEY))
}

/// A config with one upstream at `upstream_base`, one model `gpt-4o-mini`
/// (default output `default_out`), and tenant `t1` with `tenant_limits`
/// (TOML inline table body, e.g. `tpm = 1000, rpm = 1000`). `extra` is
/// appended verbatim inside the tenant (e.g. `model_limits = ...`) or after it.
pub fn config(upstream_base: &str, default_out: u64, tenant_limits: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
[estimation]
stream_extension_step = 256
[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "{upstream_base}"
[[models]]
name = "gpt-4o-mini"
upstreams = ["mock"]
encoding = "o200k_base"
default_max_output_tokens = {default_out}
max_output_tokens = 4096
[[models]]
name = "text-embedding-3-small"
upstreams = ["mock"]
encoding = "cl100k_base"
[[tenants]]
name = "t1"
{key}
limits = {{ {tenant_limits} }}
{extra}
"#,
        key = key_line()
    )
}

/// Starts a gateway for `config_toml` on a frozen clock at [`NOON`].
pub async fn start_gateway(config_toml: &str) -> Gateway {
    start_gateway_at(config_toml, ManualClock::new(NOON)).await
}

/// Starts a gateway for `config_toml` reading time from `clock`.
pub async fn start_gateway_at(config_toml: &str, clock: ManualClock) -> Gateway {
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = Arc::new(MemoryStore::new(dyn_clock));
    let mut gw = start_gateway_with(config_toml, clock, store.clone()).await;
    gw.store = store;
    gw
}

/// Starts a gateway for `config_toml` over `store`, reading time from `clock`.
/// The returned `store` field is a fresh, unused memory store (tests of a
/// custom store read it directly).
pub async fn start_gateway_with(
    config_toml: &str,
    clock: ManualClock,
    store: Arc<dyn BudgetStore>,
) -> Gateway {
    let policy =
        Policy::from_toml(config_toml).unwrap_or_else(|e| panic!("test config invalid: {e}"));
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let state = AppState::new(policy, store, dyn_clock.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let st = state.clone();
    tokio::spawn(async move {
        let _ = budgetgate::app::serve(listener, st, async {
            let _ = rx.await;
        })
        .await;
    });
    Gateway {
        addr,
        state,
        clock,
        store: Arc::new(MemoryStore::new(dyn_clock)),
        shutdown: Some(tx),
    }
}

/// The gateway's input-token estimate of a `gpt-4o-mini` (o200k_base) chat body.
pub fn chat_input_tokens(body: &serde_json::Value) -> u64 {
    use budgetgate::dialects::Dialect;
    use budgetgate::estimate::{estimate, Encoding, EstimateSettings, ModelEstimation};
    let me = ModelEstimation {
        encoding: Encoding::O200kBase,
        default_max_output_tokens: 16,
        max_output_tokens: 4096,
        min_output_tokens: 16,
    };
    estimate(
        Dialect::ChatCompletions,
        body,
        &me,
        &EstimateSettings::default(),
        None,
    )
    .expect("estimate")
    .input_tokens
}

/// Starts the simulated upstream with default settings.
pub async fn start_mock() -> mock_upstream::MockUpstream {
    mock_upstream::start(mock_upstream::MockConfig::default())
        .await
        .expect("mock upstream")
}

/// The Python interpreter with the pinned `openai` SDK: `$BUDGETGATE_PYTHON`,
/// else `.venv/bin/python` (created by `scripts/test.sh`).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("BUDGETGATE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with the openai SDK: run scripts/test.sh (it creates .venv) or set BUDGETGATE_PYTHON"
    );
    venv
}

/// Output of a Python SDK script.
pub struct PyResult {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl PyResult {
    /// The last non-empty stdout line as JSON.
    pub fn json(&self) -> serde_json::Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| panic!("python printed nothing; stderr:\n{}", self.stderr));
        serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "python output is not JSON ({e}): {line}\nstderr:\n{}",
                self.stderr
            )
        })
    }
}

/// Runs `tests/python/<script>` with `BASE_URL`, `API_KEY` and `args`;
/// fails the test if the script fails.
pub async fn run_python(script: &str, base_url: &str, args: &[&str]) -> PyResult {
    let r = run_python_any(script, base_url, args).await;
    assert!(
        r.status.success(),
        "{script} failed:\nstdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
    r
}

/// Runs `tests/python/<script>` and returns whatever happened.
pub async fn run_python_any(script: &str, base_url: &str, args: &[&str]) -> PyResult {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = tokio::process::Command::new(python())
        .arg(&path)
        .args(args)
        .env("BASE_URL", base_url)
        .env("API_KEY", KEY)
        .output()
        .await
        .expect("run python");
    PyResult {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Sum of the samples of `metric` whose labels include every `labels` pair.
pub fn sample_sum(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}
