//! The fleet simulation of quota leases from the command line.
//!
//! `cargo run --release --example fleet_sim -- --big` runs the issue's
//! fleet (50 gateways, 40 primaries, 10^6 requests per second for 60 s);
//! `--faults` adds gateway crashes, lost grants and partitions. Output:
//! docs/PERFORMANCE.md, "Fleet simulation". `--shards` prints instead the
//! script calls per Redis Cluster shard of a fleet of 10^6 requests per
//! second in the `tenant` layout (tenant and deployment domains) and the
//! shards it needs (docs/PERFORMANCE.md, "Store shards in the tenant
//! layout"; `cargo run --example fleet_sim -- --shards`).
//!
//! The simulation ([`sim`]) is this example's, not the library's: it
//! drives the production lease book (`budgetgate::admission::quota_lease`)
//! and memory stores through their public API. Its tests run in a plain
//! `cargo test` (`test = true` in Cargo.toml); alone:
//! `cargo test --example fleet_sim -- --nocapture`.

mod sim;

use clap::Parser;
use sim::{run, Faults, SimConfig};

#[derive(Parser)]
struct Args {
    /// The fleet instead of the test suite's small one.
    #[arg(long)]
    big: bool,
    /// Inject crashes, lost grants and partitions.
    #[arg(long)]
    faults: bool,
    /// Print the script calls per store shard in the `tenant` layout.
    #[arg(long)]
    shards: bool,
    /// With `--shards`: `[store.lease] min_rate` (requests per second per
    /// gateway from which a budget is leased; default 50).
    #[arg(long)]
    min_rate: Option<u64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override the simulated seconds.
    #[arg(long)]
    seconds: Option<u64>,
    /// Override the fleet-wide request rate.
    #[arg(long)]
    rate: Option<u64>,
}

fn main() {
    let a = Args::parse();
    if a.shards {
        let mut cfg = sim::shards::ShardConfig::big(a.seed);
        if let Some(r) = a.rate {
            cfg.rate = r;
        }
        if let Some(m) = a.min_rate {
            cfg.min_rate = m;
        }
        print!("{}", sim::shards::ShardReport::new(&cfg));
        return;
    }
    let mut cfg = if a.big {
        SimConfig::big(a.seed)
    } else {
        SimConfig::small(a.seed)
    };
    if let Some(s) = a.seconds {
        cfg.seconds = s;
    }
    if let Some(r) = a.rate {
        cfg.rate = r;
    }
    cfg.progress = true;
    if a.faults {
        cfg.faults = Faults {
            crashes: cfg.gateways.div_ceil(10),
            lost_grants: 5,
            partitions: cfg.gateways.div_ceil(10),
            partition_micros: 5_000_000,
        };
    }
    let started = std::time::Instant::now();
    let report = run(&cfg);
    print!("{report}");
    println!(
        "over-admitted beyond the stated bound: {}",
        report.over_admitted().len()
    );
    println!("(simulated in {:.1} s)", started.elapsed().as_secs_f64());
}
