//! The real `budgetgate` binary as a child process: started on a config
//! file, JSON logs captured line by line, signals sent with `kill`, killed
//! (SIGKILL) when dropped.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::http::Endpoint;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// A running gateway process.
pub struct GatewayProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub root: String,
    logs: Arc<Mutex<Vec<Value>>>,
    log_added: Arc<Notify>,
    /// The data directory of a gateway whose caller named none: the memory
    /// store's snapshot goes there, never into the user's own.
    _state_dir: Option<tempfile::TempDir>,
}

impl GatewayProcess {
    /// Starts `budgetgate --log-json serve --config PATH --listen 127.0.0.1:0`
    /// with `RUST_LOG=info` and `envs` (which may override it, e.g.
    /// `RUST_LOG=warn` for a load test), and waits for its "listening" line.
    pub async fn start(config: &Path, envs: &[(&str, &str)]) -> GatewayProcess {
        Self::start_limited(config, envs, None).await
    }

    /// [`GatewayProcess::start`] with the process's file limit
    /// (`RLIMIT_NOFILE`, soft and hard) lowered to `files`.
    pub async fn start_with_file_limit(
        config: &Path,
        envs: &[(&str, &str)],
        files: u64,
    ) -> GatewayProcess {
        Self::start_limited(config, envs, Some(files)).await
    }

    async fn start_limited(
        config: &Path,
        envs: &[(&str, &str)],
        files: Option<u64>,
    ) -> GatewayProcess {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_budgetgate"));
        if let Some(files) = files {
            let limit = libc::rlimit {
                rlim_cur: files as libc::rlim_t,
                rlim_max: files as libc::rlim_t,
            };
            // SAFETY: setrlimit is async-signal-safe; it runs in the child
            // between fork and exec and touches nothing else.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        cmd.args(["--log-json", "serve", "--config"])
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env_remove("BUDGETGATE_ADMIN_TOKEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let state_dir = if envs.iter().any(|(k, _)| *k == "STATE_DIRECTORY") {
            None
        } else {
            let d = tempfile::tempdir().expect("temp state dir");
            cmd.env("STATE_DIRECTORY", d.path());
            Some(d)
        };
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start budgetgate");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let log_added = Arc::new(Notify::new());
        let stderr = child.stderr.take().unwrap();
        {
            let logs = logs.clone();
            let log_added = log_added.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let v = serde_json::from_str::<Value>(&line)
                        .unwrap_or_else(|_| serde_json::json!({"raw": line}));
                    logs.lock().unwrap().push(v);
                    log_added.notify_waiters();
                }
            });
        }
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let root = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("gateway exited before listening");
                if let Some(a) = line.strip_prefix("budgetgate listening on ") {
                    break a.to_string();
                }
            }
        })
        .await
        .expect("gateway did not start within 30 s");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        GatewayProcess {
            child,
            root,
            logs,
            log_added,
            _state_dir: state_dir,
        }
    }

    /// Sum of the samples of `metric` whose labels include every `labels`
    /// pair, from the process's `GET /metrics`.
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        super::http::sample_sum(&super::http::scrape(self).await, metric, labels)
    }

    /// SIGKILL: no shutdown, no settlement, no lease release.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("process still running")
    }

    /// Sends `signal` (e.g. `HUP`, `TERM`) with the `kill` command.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Every log line so far (JSON objects; `fields.message` is the message).
    pub fn logs(&self) -> Vec<Value> {
        self.logs.lock().unwrap().clone()
    }

    /// Log lines whose message is `message`.
    pub fn logs_with(&self, message: &str) -> Vec<Value> {
        self.logs()
            .into_iter()
            .filter(|l| l.pointer("/fields/message").and_then(Value::as_str) == Some(message))
            .collect()
    }

    /// Waits until at least `count` lines have message `message`; returns them.
    pub async fn wait_log(&self, message: &str, count: usize) -> Vec<Value> {
        let r = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                let notified = self.log_added.notified();
                let found = self.logs_with(message);
                if found.len() >= count {
                    return found;
                }
                notified.await;
            }
        })
        .await;
        match r {
            Ok(found) => found,
            Err(_) => panic!(
                "no {count} log line(s) {message:?} within 15 s; logs:\n{}",
                self.dump_logs()
            ),
        }
    }

    /// All logs as text, for failure messages.
    pub fn dump_logs(&self) -> String {
        self.logs()
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(s) => s.expect("wait"),
            Err(_) => panic!(
                "gateway did not exit within {within:?}; logs:\n{}",
                self.dump_logs()
            ),
        }
    }
}

impl Endpoint for GatewayProcess {
    fn root_url(&self) -> String {
        self.root.clone()
    }
}
