//! Real PostgreSQL for tests: Debian's server binaries
//! (`/usr/lib/postgresql/*/bin`), a cluster made by `initdb` in the test's
//! temp dir, `pg_ctl` on a free loopback port, trust authentication for
//! user `budgetgate` on 127.0.0.1 only, fsync off. Stopped (immediate) on
//! drop; a watchdog shell stops it too once the test process is gone.
//!
//! `initdb` refuses to run as root: as root, the cluster's directory is
//! given to the `postgres` user and every server command runs as it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One PostgreSQL server.
pub struct PgServer {
    port: u16,
    bin: PathBuf,
    data: PathBuf,
    watchdog: Option<Child>,
    _dir: tempfile::TempDir,
}

fn bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `program args…`, as the `postgres` user when this process is root.
fn as_server_user(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

impl PgServer {
    /// Makes a cluster and starts it (installing Debian's `postgresql`
    /// through `scripts/install-test-deps.sh` when `initdb` is missing).
    pub fn start() -> PgServer {
        let bin = bin_dir().unwrap_or_else(|| {
            let status = Command::new(super::repo_path("scripts/install-test-deps.sh"))
                .arg("postgres")
                .status()
                .expect("run scripts/install-test-deps.sh");
            assert!(status.success(), "installing postgresql failed");
            bin_dir().expect("initdb is still missing after installing postgresql")
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown of the cluster directory to postgres");
        }
        let out = as_server_user(
            &bin.join("initdb"),
            &[
                "-D",
                &data.to_string_lossy(),
                "-U",
                "budgetgate",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )
        .output()
        .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut s = PgServer {
            port: 0,
            bin,
            data,
            watchdog: None,
            _dir: dir,
        };
        for _ in 0..5 {
            s.port = free_port();
            if s.try_start() {
                return s;
            }
        }
        panic!("postgres did not start on any of 5 free ports");
    }

    fn pg_ctl(&self, args: &[&str]) -> bool {
        let data = self.data.to_string_lossy().into_owned();
        let mut all = vec!["-D", &data];
        all.extend_from_slice(args);
        as_server_user(&self.bin.join("pg_ctl"), &all)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn try_start(&mut self) -> bool {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c full_page_writes=off",
            self.port,
            self.data.display()
        );
        let log = self.data.join("server.log");
        if !self.pg_ctl(&[
            "-o",
            &options,
            "-l",
            &log.to_string_lossy(),
            "-w",
            "-t",
            "30",
            "start",
        ]) {
            return false;
        }
        if self.watchdog.is_none() {
            let stop = format!(
                "{} {} -D '{}' stop -m immediate",
                if is_root() {
                    "runuser -u postgres --"
                } else {
                    ""
                },
                self.bin.join("pg_ctl").display(),
                self.data.display()
            );
            let script = format!(
                "while kill -0 {} 2>/dev/null; do sleep 0.5; done; {stop}",
                std::process::id()
            );
            self.watchdog = Command::new("sh")
                .arg("-c")
                .arg(script)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// `postgres://budgetgate@127.0.0.1:PORT/postgres`
    pub fn url(&self) -> String {
        format!("postgres://budgetgate@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server at once (connections cut), keeping its data.
    pub fn stop(&self) {
        assert!(
            self.pg_ctl(&["stop", "-m", "immediate", "-w"]),
            "pg_ctl stop"
        );
    }

    /// Starts the stopped server again on its port.
    pub fn restart(&mut self) {
        assert!(self.try_start(), "postgres did not start again");
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}
