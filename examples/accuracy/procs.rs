//! The processes a scenario runs: gateways (`budgetgate serve`), the mock
//! upstream (`examples/mock_upstream`), redis-servers on free loopback
//! ports. Each is killed when its handle drops.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

pub type Res<T> = Result<T, String>;

/// Where the binaries are: `BUDGETGATE_BIN_DIR`, else the profile directory
/// this example was built into (`target/<profile>/examples/accuracy`).
#[derive(Clone, Debug)]
pub struct Bins {
    pub gateway: PathBuf,
    pub mock: PathBuf,
}

impl Bins {
    pub fn locate() -> Res<Bins> {
        let dir = match std::env::var_os("BUDGETGATE_BIN_DIR") {
            Some(d) => PathBuf::from(d),
            None => std::env::current_exe()
                .map_err(|e| format!("current exe: {e}"))?
                .parent()
                .and_then(Path::parent)
                .ok_or("no profile directory above the example")?
                .to_path_buf(),
        };
        let bins = Bins {
            gateway: dir.join("budgetgate"),
            mock: dir.join("examples").join("mock_upstream"),
        };
        for p in [&bins.gateway, &bins.mock] {
            if !p.exists() {
                return Err(format!(
                    "{} missing: cargo build --bins --examples",
                    p.display()
                ));
            }
        }
        Ok(bins)
    }
}

/// A free loopback port (bound, then released).
pub fn free_port() -> Res<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Reads lines of `child`'s stdout until one starts with `prefix`; the rest
/// of the output is drained in the background.
async fn wait_line(child: &mut Child, prefix: &str, what: &str) -> Res<String> {
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(rest.trim().to_string());
            }
        }
        None
    })
    .await
    .map_err(|_| format!("{what} did not start within 30 s"))?
    .ok_or(format!("{what} exited before listening"))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(found)
}

/// One request's totals as the mock counted them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub requests: u64,
    pub input_tokens: u64,
    pub cap_tokens: u64,
    pub output_tokens: u64,
    pub streams: u64,
    pub streams_cut: u64,
}

impl Tally {
    fn from_json(v: &Value) -> Tally {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        Tally {
            requests: n("requests"),
            input_tokens: n("input_tokens"),
            cap_tokens: n("cap_tokens"),
            output_tokens: n("output_tokens"),
            streams: n("streams"),
            streams_cut: n("streams_cut"),
        }
    }

    /// What the upstream was asked to do at most: input plus each cap.
    pub fn reserved(&self) -> u64 {
        self.input_tokens + self.cap_tokens
    }

    /// What the upstream reports as spent: input plus output.
    pub fn spent(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    pub fn plus(&self, o: &Tally) -> Tally {
        Tally {
            requests: self.requests + o.requests,
            input_tokens: self.input_tokens + o.input_tokens,
            cap_tokens: self.cap_tokens + o.cap_tokens,
            output_tokens: self.output_tokens + o.output_tokens,
            streams: self.streams + o.streams,
            streams_cut: self.streams_cut + o.streams_cut,
        }
    }
}

/// The mock's counters (`GET /_counters`).
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub tenants: BTreeMap<String, Tally>,
    pub deployments: BTreeMap<String, Tally>,
}

impl Counters {
    pub fn tenant(&self, t: &str) -> Tally {
        self.tenants.get(t).copied().unwrap_or_default()
    }
}

/// The mock upstream, a process of its own.
pub struct Mock {
    _child: Child,
    pub addr: String,
}

impl Mock {
    /// Starts `mock_upstream --listen 127.0.0.1:0` with `args`.
    pub async fn start(bins: &Bins, args: &[&str]) -> Res<Mock> {
        let mut child = Command::new(&bins.mock)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start mock: {e}"))?;
        let url = wait_line(&mut child, "mock_upstream listening on ", "mock").await?;
        let addr = url.trim_start_matches("http://").to_string();
        Ok(Mock {
            _child: child,
            addr,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn counters(&self) -> Res<Counters> {
        let v: Value = reqwest::get(format!("http://{}/_counters", self.addr))
            .await
            .map_err(|e| format!("counters: {e}"))?
            .json()
            .await
            .map_err(|e| format!("counters: {e}"))?;
        let map = |k: &str| -> BTreeMap<String, Tally> {
            v.get(k)
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, t)| (k.clone(), Tally::from_json(t)))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Counters {
            tenants: map("tenants"),
            deployments: map("deployments"),
        })
    }
}

/// The deployment key every gateway presents upstream (the mock's
/// per-deployment counters are keyed by it).
pub const DEPLOYMENT_KEY_ENV: &str = "ACCURACY_DEPLOYMENT_KEY";

/// One `budgetgate serve` process.
pub struct Gateway {
    child: Option<Child>,
    pub root: String,
    _state: tempfile::TempDir,
}

impl Gateway {
    /// Starts `budgetgate serve --config PATH --listen 127.0.0.1:0`
    /// (`RUST_LOG=warn`, its own state directory, logs in it).
    pub async fn start(bins: &Bins, config: &Path) -> Res<Gateway> {
        let state = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(state.path().join("gateway.log")).map_err(|e| e.to_string())?;
        let mut child = Command::new(&bins.gateway)
            .args(["--log-json", "serve", "--config"])
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .env("STATE_DIRECTORY", state.path())
            .env(DEPLOYMENT_KEY_ENV, "mock")
            .env_remove("BUDGETGATE_ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start gateway: {e}"))?;
        let root = wait_line(&mut child, "budgetgate listening on ", "gateway").await?;
        Ok(Gateway {
            child: Some(child),
            root,
            _state: state,
        })
    }

    /// `host:port` of the listener.
    pub fn addr(&self) -> String {
        self.root.trim_start_matches("http://").to_string()
    }

    pub async fn metrics(&self) -> Res<String> {
        reqwest::get(format!("{}/metrics", self.root))
            .await
            .map_err(|e| format!("metrics: {e}"))?
            .text()
            .await
            .map_err(|e| format!("metrics: {e}"))
    }

    /// SIGKILL: no shutdown, no settlement, no lease given back.
    pub async fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// The last `n` lines of the gateway's log (warnings and errors).
    pub fn log_tail(&self, n: usize) -> Vec<String> {
        let text =
            std::fs::read_to_string(self._state.path().join("gateway.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.chars().take(300).collect())
            .collect()
    }

    pub fn alive(&self) -> bool {
        self.child.is_some()
    }
}

/// Sum of the samples of `name` whose labels contain every `labels` pair.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// What the gateways' `/metrics` say about degraded decisions and the
/// store (summed over the fleet; a killed gateway reads as its last scrape).
#[derive(Clone, Copy, Debug, Default)]
pub struct Health {
    pub degraded: u64,
    pub store_errors: u64,
    pub lease_decisions: u64,
    pub deny_cache_hits: u64,
}

impl Health {
    pub fn of(text: &str) -> Health {
        Health {
            degraded: metric_sum(text, "budgetgate_degraded_decisions_total", &[]) as u64,
            store_errors: metric_sum(text, "budgetgate_store_errors_total", &[]) as u64,
            lease_decisions: metric_sum(
                text,
                "budgetgate_quota_lease_decisions_total",
                &[("decided_by", "lease")],
            ) as u64,
            deny_cache_hits: metric_sum(text, "budgetgate_deny_cache_hits_total", &[]) as u64,
        }
    }

    pub fn add(&mut self, o: Health) {
        self.degraded += o.degraded;
        self.store_errors += o.store_errors;
        self.lease_decisions += o.lease_decisions;
        self.deny_cache_hits += o.deny_cache_hits;
    }
}

/// Scrapes every live gateway; `last` keeps a killed gateway's last figures.
pub async fn fleet_health(gws: &[Gateway], last: &mut [Health]) -> Health {
    let mut sum = Health::default();
    for (i, g) in gws.iter().enumerate() {
        if g.alive() {
            if let Ok(t) = g.metrics().await {
                last[i] = Health::of(&t);
            }
        }
        sum.add(last[i]);
    }
    sum
}

/// A redis-server on a free loopback port, no persistence.
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    pub async fn start(extra: &[&str]) -> Res<Redis> {
        for _ in 0..5 {
            let port = free_port()?;
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("redis-server: {e}"))?;
            let mut r = Redis {
                child: Some(child),
                port,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if r.cmd(&["PING"]).await.is_ok_and(|s| s == "PONG") {
                    return Ok(r);
                }
                if let Some(c) = r.child.as_mut() {
                    if let Ok(Some(_)) = c.try_wait() {
                        break; // lost a port race: try another
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Err("redis-server did not start".into())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// One command, its reply as text.
    pub async fn cmd(&self, args: &[&str]) -> Res<String> {
        redis_cmd(self.port, args).await
    }

    pub async fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}

/// One command to the redis-server on `port`, its reply as text.
pub async fn redis_cmd(port: u16, args: &[&str]) -> Res<String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let mut con = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| "redis connect timeout".to_string())?
    .map_err(|e| e.to_string())?;
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    let v: redis::Value = c.query_async(&mut con).await.map_err(|e| e.to_string())?;
    Ok(value_text(&v))
}

fn value_text(v: &redis::Value) -> String {
    match v {
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::Int(i) => i.to_string(),
        redis::Value::Okay => "OK".into(),
        redis::Value::Nil => String::new(),
        redis::Value::VerbatimString { text, .. } => text.clone(),
        redis::Value::Array(a) => a.iter().map(value_text).collect::<Vec<_>>().join("\n"),
        other => format!("{other:?}"),
    }
}

/// A field of an INFO reply.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}
