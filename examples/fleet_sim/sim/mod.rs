//! A deterministic, seeded simulation of a gateway fleet spending quota
//! leases (DESIGN "Leased quota"): the lease book every gateway runs
//! ([`budgetgate::admission::quota_lease::Book`]), memory stores as the store
//! primaries (their reservation and lease code is the Redis scripts'
//! reference, checked against them by the differential test), one
//! simulated clock and a per-call latency.
//!
//! Tenants are picked by Zipf popularity, arrivals come in bursts, each
//! request names its tenant's `rpm` and `tpm` buckets (one budget domain
//! per tenant, on one of the primaries) and settles below its estimate
//! after a random duration. The same arrivals run twice: with leases and
//! with every reservation exact (one store call each), so the report
//! compares refusals with an exact store. Faults (gateway crashes, grants
//! a failover loses, partitions) run with leases only.
//!
//! - [`run`]: one configuration, both runs, a [`Report`].
//! - `fleet`: the event loop of one run.
//! - `report`: what is measured and how it prints.
//! - [`shards`]: script calls per Redis Cluster shard in the `tenant`
//!   layout, tenant and deployment domains, at a fleet's request rate (a
//!   model of the calls, not an event loop).

mod fleet;
mod report;
pub mod shards;
#[cfg(test)]
mod tests;

pub use report::Report;

use budgetgate::config::store::LeasePolicy;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Gateways of the fleet.
    pub gateways: usize,
    /// Store primaries (tenants' domains are spread over them).
    pub primaries: usize,
    /// Tenants.
    pub tenants: usize,
    /// Zipf exponent of tenant popularity.
    pub zipf: f64,
    /// Requests per second, the whole fleet.
    pub rate: u64,
    /// Simulated seconds.
    pub seconds: u64,
    /// Mean requests per burst (1: Poisson arrivals).
    pub burst: f64,
    /// One-way latency of a store call, µs.
    pub latency_micros: u64,
    /// Share of tenants whose limits are below their demand (contended).
    pub contended: f64,
    /// Faults to inject (leased run only).
    pub faults: Faults,
    /// The lease settings every gateway runs.
    pub lease: LeasePolicy,
    /// Print each run's progress on stderr every simulated 10 s.
    pub progress: bool,
}

/// Faults injected into the leased run.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Gateways killed (their leases and local reservations lost) and
    /// restarted at once with an empty book, at evenly spread times.
    pub crashes: usize,
    /// Grant replies the store forgets right after answering (a failover
    /// that lost the write): the gateway spends what nobody debited.
    pub lost_grants: usize,
    /// Gateways cut off from every primary for `partition_micros`.
    pub partitions: usize,
    /// Length of one partition, µs.
    pub partition_micros: u64,
}

impl SimConfig {
    /// The configuration the test suite runs (seconds in a debug build).
    pub fn small(seed: u64) -> Self {
        Self {
            seed,
            gateways: 3,
            primaries: 2,
            tenants: 40,
            zipf: 1.1,
            rate: 4_000,
            seconds: 8,
            burst: 4.0,
            latency_micros: 300,
            contended: 0.5,
            faults: Faults::default(),
            lease: LeasePolicy::default(),
            progress: false,
        }
    }

    /// The fleet: 50 gateways, 40 primaries, 10^6 requests per
    /// second for 60 s.
    pub fn big(seed: u64) -> Self {
        Self {
            seed,
            gateways: 50,
            primaries: 40,
            tenants: 5_000,
            zipf: 1.1,
            rate: 1_000_000,
            seconds: 60,
            burst: 8.0,
            latency_micros: 250,
            contended: 0.5,
            faults: Faults::default(),
            lease: LeasePolicy::default(),
            progress: false,
        }
    }
}

/// Tenant `t`'s `(rpm, tpm)`: a contended tenant gets 0.6 of its expected
/// demand, the others twice it (at least 60 requests a minute).
pub(crate) fn fleet_limits(cfg: &SimConfig, t: usize) -> (u64, u64) {
    use rand::{Rng, SeedableRng};
    let total: f64 = (1..=cfg.tenants).map(|k| (k as f64).powf(-cfg.zipf)).sum();
    let share = ((t + 1) as f64).powf(-cfg.zipf) / total;
    let rps = cfg.rate as f64 * share;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(
        cfg.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let factor = if rng.random_bool(cfg.contended.clamp(0.0, 1.0)) {
        0.6
    } else {
        2.0
    };
    let rpm = ((rps * 60.0 * factor).ceil() as u64).max(60);
    (rpm, rpm * 500)
}

/// A simulated bucket's capacity: five seconds of refill, so that a run of
/// a few seconds is contended (a full minute's burst would never be).
pub(crate) fn burst_of(per_minute: u64) -> u64 {
    (per_minute / 12).max(1)
}

/// Runs `cfg` with leases and with exact reservations; compares them.
pub fn run(cfg: &SimConfig) -> Report {
    // The two runs share nothing but the configuration: one thread each.
    let (leased, exact) = std::thread::scope(|s| {
        let leased = s.spawn(|| fleet::Fleet::new(cfg, true).run());
        let exact = fleet::Fleet::new(cfg, false).run();
        (leased.join(), exact)
    });
    let leased = leased.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    Report::new(cfg, leased, exact)
}
