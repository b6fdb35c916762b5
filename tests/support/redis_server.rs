//! Real Redis for tests: a single `redis-server` or a 3-node Redis Cluster on
//! free loopback ports (never 6379), each in its own temp dir, with
//! persistence off.
//!
//! A watchdog shell wraps every server and kills it once the test process is
//! gone, so servers shared by a whole test binary (see [`shared`] and
//! [`shared_cluster`]) never outlive it; servers owned by a test are killed
//! on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One `redis-server` process.
pub struct RedisServer {
    port: u16,
    pid: u32,
    watchdog: Child,
    _dir: tempfile::TempDir,
}

/// A port the OS says is free now (the caller retries if it is taken by the
/// time the server binds it).
fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().expect("local addr").port();
        if port != 6379 {
            return port;
        }
    }
}

/// Runs `redis-cli -p port args…` and returns its stdout (empty on failure).
pub fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

impl RedisServer {
    /// Starts a single node.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a node with extra `--name value` arguments, retrying on a port race.
    pub fn start_with(extra: &[&str]) -> Self {
        assert!(
            Command::new("redis-server")
                .arg("--version")
                .output()
                .is_ok(),
            "redis-server is not installed (apt-get install redis-server; .ci/run installs it)"
        );
        for _ in 0..5 {
            if let Some(s) = Self::try_start(free_port(), extra) {
                return s;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts a node on `port` (e.g. to restart one that was stopped), if free.
    pub fn start_on(port: u16) -> Option<Self> {
        Self::try_start(port, &[])
    }

    fn try_start(port: u16, extra: &[&str]) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.path().to_string_lossy(),
            "--logfile",
            "redis.log",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        // The watchdog: runs the server, kills it when this test process exits.
        let script = format!(
            "redis-server {} & R=$!; while kill -0 {} 2>/dev/null && kill -0 $R 2>/dev/null; do sleep 0.2; done; kill -9 $R 2>/dev/null",
            quoted.join(" "),
            std::process::id()
        );
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh");
        let canonical = dir
            .path()
            .canonicalize()
            .unwrap_or_else(|_| dir.path().to_path_buf());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let info = cli(port, &["info", "server"]);
            if let Some(pid) = info_field(&info, "process_id").and_then(|p| p.parse().ok()) {
                // Another test's server may have won the port race: check it is ours.
                if info_field(&info, "executable").is_some()
                    && cli(port, &["config", "get", "dir"]).contains(&*canonical.to_string_lossy())
                {
                    return Some(Self {
                        port,
                        pid,
                        watchdog,
                        _dir: dir,
                    });
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut watchdog = watchdog;
        let _ = watchdog.kill();
        let _ = watchdog.wait();
        None
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Runs `redis-cli` against this node.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-9")
            .arg(self.pid.to_string())
            .status();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

/// A 3-primary Redis Cluster (no replicas).
pub struct RedisCluster {
    /// The primaries.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled nodes, joins them with
    /// `redis-cli --cluster create`, and waits for `cluster_state:ok`.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                // The cluster bus port must be free too; pick it explicitly.
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "cluster_state never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { nodes }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Plain `redis://` URLs of the primaries (for per-node SCAN and TTL checks).
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// One single-node server shared by every test of this binary (tests keep
/// apart by key prefix); it dies with the test process.
pub fn shared() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(RedisServer::start)
}

/// One 3-node cluster shared by every test of this binary (tests keep apart
/// by budget domain, i.e. hash tag and slot); it dies with the test process.
pub fn shared_cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(RedisCluster::start)
}
