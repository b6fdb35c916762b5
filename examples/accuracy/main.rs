//! The enforcement-accuracy benchmark (docs/ACCURACY.md): real gateway
//! processes, redis-servers and the mock upstream, driven through bursts and
//! faults; what the upstream counted (never the gateway) against the bounds
//! of DESIGN sections 2, 5 and 14 and `max_exposure`.
//!
//! `scripts/accuracy.sh` builds and runs it (docs/ACCURACY.md: the
//! scenarios, the bounds, the figures). Directly:
//!
//! ```text
//! cargo run --release --example accuracy            # every variant
//! QUICK=1 cargo run --example accuracy              # one variant each, one round (CI)
//! ROUNDS=1 cargo run --release --example accuracy   # every variant once (default: 3 rounds)
//! SCENARIOS=burst,reload cargo run --example accuracy
//! PEER_URL=http://127.0.0.1:4000/v1 PEER_KEY=… [PEER_CONFIG_HOOK=cmd] …
//! ```
//!
//! Exit status: 0 when every scenario is valid and within its bounds, 1
//! otherwise. Timings are printed, never asserted.

mod client;
mod config;
mod procs;
mod proxy;
mod report;
mod scenarios;

use std::path::PathBuf;
use std::time::Instant;

use procs::{Bins, Gateway, Res};

/// What every scenario gets.
pub struct Ctx {
    pub bins: Bins,
    pub quick: bool,
}

/// Gateways sharing one config file.
pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub gws: Vec<Gateway>,
    pub last: Vec<procs::Health>,
}

impl Fleet {
    pub async fn start(ctx: &Ctx, setup: &config::Setup, n: usize) -> Res<Fleet> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = setup.write(dir.path())?;
        let mut gws = Vec::new();
        for _ in 0..n {
            gws.push(Gateway::start(&ctx.bins, &path).await?);
        }
        Ok(Fleet {
            dir,
            path,
            last: vec![procs::Health::default(); n],
            gws,
        })
    }

    /// `host:port` of every live gateway.
    pub fn addrs(&self) -> Vec<String> {
        self.gws
            .iter()
            .filter(|g| g.alive())
            .map(Gateway::addr)
            .collect()
    }

    pub async fn health(&mut self) -> procs::Health {
        procs::fleet_health(&self.gws, &mut self.last).await
    }

    /// The fleet's health, and for a run with degraded decisions the last
    /// log lines of each gateway (why), into the row.
    pub async fn report(&mut self, row: &mut report::Row) {
        row.health = self.health().await;
        if row.health.degraded > 0 && !row.degraded_intended {
            for (i, g) in self.gws.iter().enumerate() {
                for l in g.log_tail(2) {
                    row.notes.push(format!("gateway {i} log: {l}"));
                }
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let quick = std::env::var("QUICK").is_ok_and(|v| v == "1");
    let only: Option<Vec<String>> = std::env::var("SCENARIOS")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let bins = match Bins::locate() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("accuracy: {e}");
            std::process::exit(2);
        }
    };
    let ctx = Ctx { bins, quick };
    let t0 = Instant::now();
    println!(
        "accuracy benchmark: {} run, binaries {}",
        if quick { "QUICK" } else { "full" },
        ctx.bins.gateway.display()
    );
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 });
    let mut rows = Vec::new();
    for round in 1..=rounds {
        for (name, _) in scenarios::ALL {
            if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
                continue;
            }
            let t = Instant::now();
            let mut got = scenarios::run(name, &ctx).await;
            println!(
                "round {round}/{rounds}, scenario {name}: {} variant(s) in {:.1} s",
                got.len(),
                t.elapsed().as_secs_f64()
            );
            if rounds > 1 {
                for r in &mut got {
                    r.variant = format!("{} (round {round})", r.variant);
                }
            }
            rows.extend(got);
        }
    }
    if let Ok(url) = std::env::var("PEER_URL") {
        scenarios::burst::peer(&ctx, &url).await;
    }
    println!();
    report::print(&rows);
    println!();
    let ok = rows.iter().all(|r| r.valid() && r.held());
    println!(
        "accuracy: {} rows, {} in {:.1} s",
        rows.len(),
        if ok {
            "every scenario valid and within its bounds"
        } else {
            "SOME SCENARIO INVALID OR A BOUND BROKEN"
        },
        t0.elapsed().as_secs_f64()
    );
    std::process::exit(if ok { 0 } else { 1 });
}
