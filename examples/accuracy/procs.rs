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

    pub fn alive(&self) -> bool {
        self.child.is_some()
    }
}

/// One command to the redis-server on `port`, its reply as text.
pub async fn redis_cmd(port: u16, args: &[&str]) -> Res<String> {
    Ok(value_text(&redis_value(port, args).await?))
}

pub fn value_text(v: &redis::Value) -> String {
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

/// One command to the redis-server on `port`, its reply as a value.
pub async fn redis_value(port: u16, args: &[&str]) -> Res<redis::Value> {
    let mut con = connect(port).await?;
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(&mut con).await.map_err(|e| e.to_string())
}

/// A connection to one redis-server (a cluster node answers for its own
/// slots only).
pub async fn connect(port: u16) -> Res<redis::aio::MultiplexedConnection> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| "redis connect timeout".to_string())?
    .map_err(|e| e.to_string())
}

/// One shard of a Redis Cluster as `CLUSTER SHARDS` gives it.
#[derive(Clone, Debug, Default)]
pub struct Shard {
    /// Slot ranges, both ends included.
    pub slots: Vec<(u16, u16)>,
    /// The port of its primary (none while it has no live one).
    pub primary: Option<u16>,
    /// The ports of its replicas.
    pub replicas: Vec<u16>,
}

impl Shard {
    pub fn holds(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// A field of a `CLUSTER SHARDS` entry: a flat `[key, value, …]` array
/// (RESP2) or a map (RESP3).
fn field<'a>(v: &'a redis::Value, key: &str) -> Option<&'a redis::Value> {
    match v {
        redis::Value::Array(a) => a
            .chunks(2)
            .find(|kv| value_text(&kv[0]) == key)
            .and_then(|kv| kv.get(1)),
        redis::Value::Map(m) => m.iter().find(|(k, _)| value_text(k) == key).map(|(_, v)| v),
        _ => None,
    }
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        other => value_text(other).parse().ok(),
    }
}

/// `CLUSTER SHARDS` of the node on `port`: every shard's slots, its live
/// primary and its live replicas.
pub async fn cluster_shards(port: u16) -> Res<Vec<Shard>> {
    parse_shards(&redis_value(port, &["CLUSTER", "SHARDS"]).await?)
}

fn parse_shards(v: &redis::Value) -> Res<Vec<Shard>> {
    let redis::Value::Array(shards) = v else {
        return Err(format!("CLUSTER SHARDS: {v:?}"));
    };
    let mut out = Vec::new();
    for s in shards {
        let mut shard = Shard::default();
        if let Some(redis::Value::Array(slots)) = field(s, "slots") {
            let ends: Vec<u16> = slots
                .iter()
                .filter_map(int)
                .filter_map(|i| u16::try_from(i).ok())
                .collect();
            shard.slots = ends
                .chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| (c[0], c[1]))
                .collect();
        }
        if let Some(redis::Value::Array(nodes)) = field(s, "nodes") {
            for n in nodes {
                let port = field(n, "port")
                    .and_then(int)
                    .and_then(|p| u16::try_from(p).ok());
                let role = field(n, "role").map(value_text).unwrap_or_default();
                let health = field(n, "health").map(value_text).unwrap_or_default();
                let Some(port) = port.filter(|_| health == "online") else {
                    continue;
                };
                if role == "master" {
                    shard.primary = Some(port);
                } else {
                    shard.replicas.push(port);
                }
            }
        }
        out.push(shard);
    }
    Ok(out)
}

/// A Redis Cluster of three primaries with one replica each on free
/// loopback ports (`redis-cli --cluster create … --cluster-replicas 1`).
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub async fn start(node_timeout_ms: u64) -> Res<Cluster> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            // The cluster bus port must be free too: picked, not port + 10000.
            let bus = free_port()?.to_string();
            let timeout = node_timeout_ms.to_string();
            nodes.push(
                Redis::start(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &timeout,
                    "--cluster-port",
                    &bus,
                    // One shard without a live primary leaves the others
                    // serving (the default, yes, stops every slot then).
                    "--cluster-require-full-coverage",
                    "no",
                    // A replica's first sync at once, not after 5 s.
                    "--repl-diskless-sync-delay",
                    "0",
                ])
                .await?,
            );
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        let cluster = Cluster { nodes };
        // Ready: every node sees the cluster ok, three shards each with a
        // primary and a replica whose link to it is up (synced).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if cluster.ready().await {
                return Ok(cluster);
            }
            if Instant::now() > deadline {
                return Err(
                    "the cluster was not ready (state ok, replicas synced) within 30 s".into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn ready(&self) -> bool {
        for n in &self.nodes {
            let ok = n
                .cmd(&["CLUSTER", "INFO"])
                .await
                .is_ok_and(|i| info_field(&i, "cluster_state").as_deref() == Some("ok"));
            if !ok {
                return false;
            }
        }
        let Ok(shards) = cluster_shards(self.nodes[0].port).await else {
            return false;
        };
        if shards.len() != 3
            || shards
                .iter()
                .any(|s| s.primary.is_none() || s.replicas.len() != 1)
        {
            return false;
        }
        for s in &shards {
            let up = redis_cmd(s.replicas[0], &["INFO", "replication"])
                .await
                .is_ok_and(|i| info_field(&i, "master_link_status").as_deref() == Some("up"));
            if !up {
                return false;
            }
        }
        true
    }

    /// `redis+cluster://` over every node.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The shards as a live node sees them.
    pub async fn shards(&self) -> Res<Vec<Shard>> {
        let mut last = String::from("no live node");
        for n in self.nodes.iter().filter(|n| n.alive()) {
            match cluster_shards(n.port).await {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of a live node).
    pub async fn keyslot(&self, key: &str) -> Res<u16> {
        let n = self
            .nodes
            .iter()
            .find(|n| n.alive())
            .ok_or("no live node")?;
        n.cmd(&["CLUSTER", "KEYSLOT", key])
            .await?
            .parse()
            .map_err(|e| format!("CLUSTER KEYSLOT {key}: {e}"))
    }

    pub fn node_mut(&mut self, port: u16) -> Option<&mut Redis> {
        self.nodes.iter_mut().find(|n| n.port == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(port: i64, role: &str, health: &str) -> Value {
        Value::Array(vec![
            text("id"),
            text("abc"),
            text("port"),
            Value::Int(port),
            text("role"),
            text(role),
            text("health"),
            text(health),
        ])
    }

    #[test]
    fn cluster_shards_give_each_shard_its_slots_live_primary_and_replicas() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                text("slots"),
                Value::Array(vec![Value::Int(0), Value::Int(5460)]),
                text("nodes"),
                Value::Array(vec![
                    node(7000, "master", "online"),
                    node(7003, "replica", "online"),
                ]),
            ]),
            // A failed-over shard: the dead primary listed as failed.
            Value::Array(vec![
                text("slots"),
                Value::Array(vec![
                    Value::Int(5461),
                    Value::Int(6000),
                    Value::Int(7000),
                    Value::Int(10922),
                ]),
                text("nodes"),
                Value::Array(vec![
                    node(7001, "master", "failed"),
                    node(7004, "master", "online"),
                ]),
            ]),
        ]);
        let shards = parse_shards(&reply).expect("parsed");
        assert_eq!(shards.len(), 2);
        assert_eq!(shards[0].slots, vec![(0, 5460)]);
        assert_eq!(
            (shards[0].primary, shards[0].replicas.clone()),
            (Some(7000), vec![7003])
        );
        assert_eq!(shards[1].primary, Some(7004));
        assert!(shards[1].replicas.is_empty());
        assert!(shards[1].holds(5461) && shards[1].holds(10922) && !shards[1].holds(6500));
        assert!(!shards[0].holds(5461));
        assert!(parse_shards(&Value::Nil).is_err());
    }
}
