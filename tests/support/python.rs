//! The official `openai` Python SDK (pinned in `tests/python/requirements.txt`)
//! running the scripts under `tests/python/` against a gateway.

use std::path::PathBuf;

use serde_json::Value;

use super::http::Endpoint;
use super::KEY;

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

/// Streams with the SDK (`stream_collect.py`, `kwargs` a JSON object of
/// `chat.completions.create` arguments) and returns its report.
pub async fn sdk_stream(gw: &(impl Endpoint + ?Sized), kwargs: &Value) -> Value {
    run_python("stream_collect.py", &gw.base_url(), &[&kwargs.to_string()])
        .await
        .json()
}

/// The content deltas the SDK saw for `choice` in a [`sdk_stream`] report.
pub fn deltas(report: &Value, choice: &str) -> u64 {
    report["deltas"][choice].as_u64().unwrap_or(0)
}
