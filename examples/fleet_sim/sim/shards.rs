//! Script calls per Redis Cluster shard in the `tenant` layout (DESIGN
//! section 22): one tenant domain per top-level tenant, one deployment
//! domain per deployment group, each a hash tag on one slot
//! (`budget::placement`: CRC16 of the tag mod 16384), slots split over the
//! shards as `redis-cli --cluster create` splits them.
//!
//! A request calls each domain whose budgets the store decides: its
//! tenant's domain first, the deployment group's only once the tenant
//! admitted, and a void of the tenant hold when the deployment refuses.
//! Which budgets the store decides depends on leases:
//!
//! - [`Protocol::Design`], as DESIGN section 22 states it: a domain whose
//!   budgets are all leased gets no call (leased deployment budgets take
//!   the deployment-domain call away);
//! - [`Protocol::Today`], as the gateway decides today
//!   (`admission::quota_lease::Book::reserve`): a request whose every
//!   budget is leased is decided from leases; a leased deployment beside
//!   exact tenant budgets is split (the deployment from its lease, the
//!   tenant domain's call alone) unless its lease is short of the request;
//!   anything else goes to the store whole, one call per domain.
//!
//! Each script call is weighed in Redis work from the measured figures
//! ([`pair_cost`]) against the capacity of one primary ([`PAIRS_PER_PRIMARY`]).

use std::fmt;

use budgetgate::budget::placement::{deployment_tag, slot_of_tag, tenant_tag};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// Redis Cluster's slot count.
pub const SLOTS: usize = 16_384;

/// Redis instructions of one reserve + settle pair of the usual request
/// (8 budgets) and of a 40-budget tree, `PROFILE=redis
/// scripts/instructions.sh` and `SHAPE=deep PROFILE=redis …`, 2026-12-01
/// (docs/PERFORMANCE.md, "Cost of depth").
pub const PAIR_INSTRUCTIONS_8: f64 = 1_052_564.0;
/// See [`PAIR_INSTRUCTIONS_8`].
pub const PAIR_INSTRUCTIONS_40: f64 = 4_442_733.0;

/// Reserve + settle pairs of the usual request (8 budgets) one primary
/// serves per second: the low end of DESIGN section 2's 4,000–5,000.
pub const PAIRS_PER_PRIMARY: f64 = 4_000.0;

/// Share of a pair's Redis time that is the reserve: 133–163 µs against
/// 68–95 µs for the settlement at 16 callers (PERFORMANCE, "Cost of
/// depth"), about 0.6.
pub const RESERVE_SHARE: f64 = 0.6;

/// One lease line in pairs of the usual request: 57.3 µs per line against
/// 118.7 + 74.7 µs for a reservation and settlement of 8 budgets, measured
/// in the same minute (PERFORMANCE, "Lease calls at the store").
pub const LEASE_LINE_PAIRS: f64 = 57.3 / (118.7 + 74.7);

/// Highest load a shard may run at: half of one primary, so a primary
/// can take over a failed peer's slots (OPERATIONS, "Sizing the store").
pub const HEADROOM: f64 = 0.5;

/// Redis work of a reserve + settle pair over `budgets` budgets, in pairs
/// of the usual request: linear through the two measured points.
pub fn pair_cost(budgets: u32) -> f64 {
    let per_budget = (PAIR_INSTRUCTIONS_40 - PAIR_INSTRUCTIONS_8) / 32.0;
    let fixed = PAIR_INSTRUCTIONS_8 - 8.0 * per_budget;
    (fixed + per_budget * f64::from(budgets)) / PAIR_INSTRUCTIONS_8
}

/// The shard (0-based) holding `slot`, given each shard's last slot
/// ([`last_slots`]).
pub fn shard_in(last: &[usize], slot: u16) -> usize {
    last.partition_point(|&l| l < usize::from(slot))
        .min(last.len().saturating_sub(1))
}

/// The last slot of each of `shards` shards, as `redis-cli --cluster
/// create` assigns slot ranges: shard `i` ends at `round(i·16384/n +
/// 16384/n − 1)`, the last at 16383.
pub fn last_slots(shards: usize) -> Vec<usize> {
    let n = shards.max(1);
    let per = SLOTS as f64 / n as f64;
    (0..n)
        .map(|i| {
            if i + 1 == n {
                SLOTS - 1
            } else {
                (i as f64 * per + per - 1.0).round() as usize
            }
        })
        .collect()
}

/// Whether the deployment budgets are leased (hot deployments) or exact
/// (`lease = "off"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployments {
    /// Every deployment budget leased.
    Leased,
    /// Every deployment budget exact.
    Exact,
}

/// Which budgets of a request reach the store (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// DESIGN section 22: a domain whose budgets are all leased gets no call.
    Design,
    /// Today's gateway: no call when all are leased, the tenant domain's
    /// alone when the deployment's lease covers the request, else both.
    Today,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted, later settled.
    Admitted,
    /// Refused by a tenant budget.
    RefusedByTenant,
    /// Refused by a deployment budget.
    RefusedByDeployment,
}

/// Script calls one request makes in one domain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    /// Reserve calls.
    pub reserves: u32,
    /// Settle and void calls.
    pub settles: u32,
}

/// The script calls of one request in its tenant domain and its
/// deployment domain, given which budgets are leased and how it ended.
/// The deny cache is left out (it only takes tenant refusals away).
pub fn calls_of(
    protocol: Protocol,
    tenant_leased: bool,
    deployments_leased: bool,
    outcome: Outcome,
) -> (Calls, Calls) {
    let (tenant_exact, deployment_exact) = match protocol {
        Protocol::Design => (!tenant_leased, !deployments_leased),
        Protocol::Today if tenant_leased && deployments_leased => (false, false),
        // A split: a lease short of the request (the deployment refuses)
        // sends it to the store whole.
        Protocol::Today if deployments_leased && outcome != Outcome::RefusedByDeployment => {
            (true, false)
        }
        Protocol::Today => (true, true),
    };
    let mut t = Calls::default();
    let mut d = Calls::default();
    // Leased budgets decide from the gateway's leases before any call:
    // a refusal there costs nothing.
    let refused_locally = match outcome {
        Outcome::RefusedByTenant => !tenant_exact,
        Outcome::RefusedByDeployment => !deployment_exact,
        Outcome::Admitted => false,
    };
    if refused_locally {
        return (t, d);
    }
    if tenant_exact {
        t.reserves += 1;
        if outcome == Outcome::RefusedByTenant {
            return (t, d);
        }
    }
    if deployment_exact {
        d.reserves += 1;
        if outcome == Outcome::RefusedByDeployment {
            // The tenant hold is voided at once (DESIGN section 22).
            t.settles += u32::from(tenant_exact);
            return (t, d);
        }
    }
    if outcome == Outcome::Admitted {
        t.settles += u32::from(tenant_exact);
        d.settles += u32::from(deployment_exact);
    }
    (t, d)
}

/// The fleet whose store load is modelled.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Seed of the sampled requests.
    pub seed: u64,
    /// Requests per second, the whole fleet.
    pub rate: u64,
    /// Requests sampled (spread over one second of traffic at `rate`).
    pub samples: u64,
    /// Gateways (each tenant's traffic spread evenly over them).
    pub gateways: u64,
    /// Top-level tenants (one tenant domain each).
    pub tenants: usize,
    /// Zipf exponent of tenant popularity.
    pub zipf: f64,
    /// Deployment groups (one per model: deployments that serve a model).
    pub groups: usize,
    /// Zipf exponent of model popularity.
    pub group_zipf: f64,
    /// Requests per second one deployment serves (a group holds as many
    /// as its traffic needs).
    pub deployment_rate: u64,
    /// Budgets of a request in its tenant domain (rpm, tpm, slots, day
    /// and month quotas).
    pub tenant_budgets: u32,
    /// Budgets of a request in its deployment domain (rpm, tpm, slots).
    pub deployment_budgets: u32,
    /// Share of requests a tenant budget refuses.
    pub tenant_refusals: f64,
    /// Share of the tenant-admitted requests a deployment budget refuses.
    pub deployment_refusals: f64,
    /// `[store.lease] min_rate`: a budget is leased from this many
    /// requests per second at each gateway.
    pub min_rate: u64,
    /// Lease lines per leased budget per gateway per second (about two
    /// per report interval of 1 s).
    pub lease_lines: f64,
    /// Lease calls per leased domain per gateway per second (lines of one
    /// domain go in one call).
    pub lease_calls: f64,
    /// Shard counts printed.
    pub shard_counts: Vec<usize>,
}

impl ShardConfig {
    /// 10^6 requests per second from 50 gateways, 10,000 tenants of Zipf
    /// 1.1 popularity, 16 models of Zipf 1.0 popularity.
    pub fn big(seed: u64) -> Self {
        Self {
            seed,
            rate: 1_000_000,
            samples: 1_000_000,
            gateways: 50,
            tenants: 10_000,
            zipf: 1.1,
            groups: 16,
            group_zipf: 1.0,
            deployment_rate: 5_000,
            tenant_budgets: 5,
            deployment_budgets: 3,
            tenant_refusals: 0.10,
            deployment_refusals: 0.01,
            min_rate: 50,
            lease_lines: 2.0,
            lease_calls: 2.0,
            shard_counts: vec![1, 3, 10, 30],
        }
    }

    /// Each tenant's share of the requests (Zipf), most popular first.
    pub fn tenant_shares(&self) -> Vec<f64> {
        zipf_shares(self.tenants, self.zipf)
    }

    /// Group `g`'s share of the requests (Zipf).
    pub fn group_share(&self, g: usize) -> f64 {
        zipf_shares(self.groups, self.group_zipf)
            .get(g)
            .copied()
            .unwrap_or(0.0)
    }

    /// Which tenants' budgets are leased: each gateway sees the tenant at
    /// `min_rate` or more (the `auto` rule).
    pub fn tenants_leased(&self) -> Vec<bool> {
        self.tenant_shares()
            .iter()
            .map(|s| self.rate as f64 * s / self.gateways as f64 >= self.min_rate as f64)
            .collect()
    }

    /// Deployments of group `g`.
    pub fn deployments(&self, g: usize) -> u64 {
        ((self.rate as f64 * self.group_share(g)) / self.deployment_rate.max(1) as f64)
            .ceil()
            .max(1.0) as u64
    }
}

fn zipf_shares(n: usize, s: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

/// Load of one domain, per second.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    /// Script calls.
    pub calls: f64,
    /// Redis work, in pairs of the usual request.
    pub pairs: f64,
}

impl Load {
    fn add(&mut self, o: Load) {
        self.calls += o.calls;
        self.pairs += o.pairs;
    }
}

/// Every domain's load under one protocol and deployment mode.
#[derive(Debug, Clone)]
pub struct DomainLoads {
    /// Which budgets reach the store.
    pub protocol: Protocol,
    /// Deployment budgets leased or exact.
    pub deployments: Deployments,
    /// `(slot, load)` of each tenant domain, then each deployment domain.
    pub domains: Vec<(u16, Load, &'static str)>,
}

/// The sampled requests' load on every domain, per second.
pub fn domain_loads(
    cfg: &ShardConfig,
    protocol: Protocol,
    deployments: Deployments,
) -> DomainLoads {
    let dep_leased = deployments == Deployments::Leased;
    let mut tenant_sum = vec![(0u64, 0u64); cfg.tenants];
    let mut group_sum = vec![(0u64, 0u64); cfg.groups];
    let leased = cfg.tenants_leased();
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let tz = Zipf::new(cfg.tenants as f64, cfg.zipf).expect("valid zipf");
    let gz = Zipf::new(cfg.groups as f64, cfg.group_zipf).expect("valid zipf");
    for _ in 0..cfg.samples {
        let t = (tz.sample(&mut rng) as usize).clamp(1, cfg.tenants) - 1;
        let g = (gz.sample(&mut rng) as usize).clamp(1, cfg.groups) - 1;
        let outcome = if rng.random_bool(cfg.tenant_refusals) {
            Outcome::RefusedByTenant
        } else if rng.random_bool(cfg.deployment_refusals) {
            Outcome::RefusedByDeployment
        } else {
            Outcome::Admitted
        };
        let (tc, dc) = calls_of(protocol, leased[t], dep_leased, outcome);
        tenant_sum[t].0 += u64::from(tc.reserves);
        tenant_sum[t].1 += u64::from(tc.settles);
        group_sum[g].0 += u64::from(dc.reserves);
        group_sum[g].1 += u64::from(dc.settles);
    }
    // The samples are one second of traffic at `rate`.
    let scale = cfg.rate as f64 / cfg.samples.max(1) as f64;
    let per_second = |(reserves, settles): (u64, u64), budgets: u32| {
        let pair = pair_cost(budgets);
        let (r, s) = (reserves as f64 * scale, settles as f64 * scale);
        Load {
            calls: r + s,
            pairs: r * pair * RESERVE_SHARE + s * pair * (1.0 - RESERVE_SHARE),
        }
    };
    let lease = |budgets: u64| Load {
        calls: cfg.lease_calls * cfg.gateways as f64,
        pairs: cfg.lease_lines * cfg.gateways as f64 * budgets as f64 * LEASE_LINE_PAIRS,
    };
    let mut domains = Vec::with_capacity(cfg.tenants + cfg.groups);
    for (t, &sum) in tenant_sum.iter().enumerate() {
        let mut load = per_second(sum, cfg.tenant_budgets);
        if leased[t] {
            load.add(lease(u64::from(cfg.tenant_budgets)));
        }
        let slot = slot_of_tag(&tenant_tag("default", &format!("t{t}")));
        domains.push((slot, load, "tenant"));
    }
    for (g, &sum) in group_sum.iter().enumerate() {
        let mut load = per_second(sum, cfg.deployment_budgets);
        if dep_leased {
            load.add(lease(
                cfg.deployments(g) * u64::from(cfg.deployment_budgets),
            ));
        }
        let slot = slot_of_tag(&deployment_tag("default", &format!("m{g}")));
        domains.push((slot, load, "deployment"));
    }
    DomainLoads {
        protocol,
        deployments,
        domains,
    }
}

/// The load of every shard of a cluster of `shards` shards.
pub fn shard_loads(d: &DomainLoads, shards: usize) -> Vec<Load> {
    let last = last_slots(shards);
    let mut out = vec![Load::default(); last.len()];
    for (slot, load, _) in &d.domains {
        out[shard_in(&last, *slot)].add(*load);
    }
    out
}

/// One row of the table: a shard count's calls and load.
#[derive(Debug, Clone)]
pub struct ShardRow {
    /// Shards.
    pub shards: usize,
    /// Script calls per second on the busiest shard.
    pub max_calls: f64,
    /// Mean script calls per second per shard.
    pub mean_calls: f64,
    /// The busiest shard's share of every script call.
    pub hottest_share: f64,
    /// The busiest shard's load, in primaries (1.0: one primary's capacity).
    pub max_load: f64,
    /// Mean load per shard, in primaries.
    pub mean_load: f64,
}

/// The row for `shards` shards.
pub fn row(d: &DomainLoads, shards: usize) -> ShardRow {
    let loads = shard_loads(d, shards);
    let n = loads.len() as f64;
    let total_calls: f64 = loads.iter().map(|l| l.calls).sum();
    let max = loads.iter().copied().fold(
        Load::default(),
        |m, l| if l.calls > m.calls { l } else { m },
    );
    let max_load = loads.iter().map(|l| l.pairs).fold(0.0, f64::max);
    ShardRow {
        shards: loads.len(),
        max_calls: max.calls,
        mean_calls: total_calls / n,
        hottest_share: if total_calls > 0.0 {
            max.calls / total_calls
        } else {
            0.0
        },
        max_load: max_load / PAIRS_PER_PRIMARY,
        mean_load: loads.iter().map(|l| l.pairs).sum::<f64>() / n / PAIRS_PER_PRIMARY,
    }
}

/// What the fleet needs: the fewest shards whose every shard stays within
/// [`HEADROOM`] once the domains that alone exceed it are set apart (no
/// shard count helps those: lease their budgets).
#[derive(Debug, Clone, PartialEq)]
pub struct Needed {
    /// Shards for every other domain (`None`: more than the limit searched).
    pub shards: Option<usize>,
    /// The domains above the headroom alone: kind and load in primaries.
    pub alone: Vec<(&'static str, f64)>,
}

/// `d` without the domains that alone exceed [`HEADROOM`].
pub fn within_headroom(d: &DomainLoads) -> DomainLoads {
    DomainLoads {
        domains: d
            .domains
            .iter()
            .filter(|x| x.1.pairs / PAIRS_PER_PRIMARY <= HEADROOM)
            .copied()
            .collect(),
        ..*d
    }
}

/// The fewest shards the fleet needs, searched up to `limit`.
pub fn shards_needed(d: &DomainLoads, limit: usize) -> Needed {
    let mut alone: Vec<(&'static str, f64)> = d
        .domains
        .iter()
        .map(|x| (x.2, x.1.pairs / PAIRS_PER_PRIMARY))
        .filter(|x| x.1 > HEADROOM)
        .collect();
    alone.sort_by(|a, b| b.1.total_cmp(&a.1));
    let rest = within_headroom(d);
    let total: f64 = rest.domains.iter().map(|x| x.1.pairs).sum();
    // No fewer than the mean needs.
    let from = ((total / PAIRS_PER_PRIMARY / HEADROOM).ceil() as usize).max(1);
    let prefix = slot_prefix(&rest);
    let shards = (from..=limit.min(SLOTS)).find(|&n| max_load(&prefix, n) <= HEADROOM);
    Needed { shards, alone }
}

/// Redis work on slots `0..i`, for every `i` (shards hold contiguous slot
/// ranges: a shard's load is a difference of two of these).
pub fn slot_prefix(d: &DomainLoads) -> Vec<f64> {
    let mut per_slot = vec![0.0f64; SLOTS];
    for (slot, load, _) in &d.domains {
        per_slot[usize::from(*slot)] += load.pairs;
    }
    let mut prefix = Vec::with_capacity(SLOTS + 1);
    let mut sum = 0.0;
    prefix.push(sum);
    for p in per_slot {
        sum += p;
        prefix.push(sum);
    }
    prefix
}

/// The busiest shard's load (in primaries) among `shards` shards, from
/// [`slot_prefix`].
pub fn max_load(prefix: &[f64], shards: usize) -> f64 {
    let mut first = 0;
    let mut max = 0.0f64;
    for last in last_slots(shards) {
        max = max.max(prefix[last + 1] - prefix[first]);
        first = last + 1;
    }
    max / PAIRS_PER_PRIMARY
}

/// The table for every protocol and deployment mode.
pub struct ShardReport {
    /// The fleet.
    pub cfg: ShardConfig,
    /// Per (protocol, deployments): the domains' loads.
    pub loads: Vec<DomainLoads>,
}

impl ShardReport {
    /// Samples `cfg`'s requests under both protocols and both modes.
    pub fn new(cfg: &ShardConfig) -> Self {
        let mut loads = Vec::new();
        for protocol in [Protocol::Design, Protocol::Today] {
            for deployments in [Deployments::Leased, Deployments::Exact] {
                loads.push(domain_loads(cfg, protocol, deployments));
            }
        }
        Self {
            cfg: cfg.clone(),
            loads,
        }
    }
}

impl fmt::Display for ShardReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.cfg;
        let shares = c.tenant_shares();
        let leased_flags = c.tenants_leased();
        let leased = leased_flags.iter().filter(|&&l| l).count();
        let leased_share: f64 = shares
            .iter()
            .zip(&leased_flags)
            .filter(|(_, &l)| l)
            .map(|(s, _)| s)
            .sum();
        writeln!(f, "store shards in the tenant layout: seed {}, {} req/s ({} sampled), {} gateways, {} tenants (zipf {}: the first has {:.1} % of requests), {} deployment groups (zipf {}: the first has {:.1} %, {} deployments of {} req/s)", c.seed, c.rate, c.samples, c.gateways, c.tenants, c.zipf, 100.0 * shares[0], c.groups, c.group_zipf, 100.0 * c.group_share(0), c.deployments(0), c.deployment_rate)?;
        writeln!(f, "budgets per request: {} in the tenant domain, {} in the deployment domain; refused: {:.0} % by a tenant budget, {:.0} % of the rest by a deployment budget; deny cache left out", c.tenant_budgets, c.deployment_budgets, 100.0 * c.tenant_refusals, 100.0 * c.deployment_refusals)?;
        writeln!(f, "tenant budgets leased from {} req/s per gateway: {} tenants, {:.1} % of requests; lease lines {} per budget per gateway per second, {} lease calls per domain per gateway per second", c.min_rate, leased, 100.0 * leased_share, c.lease_lines, c.lease_calls)?;
        writeln!(f, "one primary: {} pairs/s of the usual 8-budget request (DESIGN section 2); a pair of b budgets costs (205,020 + 105,943·b) / 1,052,564 of it (PROFILE=redis instructions, 8 and 40 budgets); reserve {:.0} %, settle {:.0} % of a pair; a lease line {:.3} pairs; headroom: every shard at most {:.0} % of a primary", PAIRS_PER_PRIMARY, 100.0 * RESERVE_SHARE, 100.0 * (1.0 - RESERVE_SHARE), LEASE_LINE_PAIRS, 100.0 * HEADROOM)?;
        for d in &self.loads {
            let proto = match d.protocol {
                Protocol::Design => "as DESIGN section 22 (a domain whose budgets are all leased gets no call)",
                Protocol::Today => "as the gateway decides today (a leased deployment beside exact tenant budgets split off; a request refused by its deployment's lease goes to the store whole)",
            };
            let mode = match d.deployments {
                Deployments::Leased => "leased",
                Deployments::Exact => "exact",
            };
            writeln!(f, "deployment budgets {mode}, {proto}:")?;
            writeln!(f, "  shards | script calls/s per shard, max | mean | hottest shard's share | load of the busiest shard | mean load (primaries)")?;
            for &n in &c.shard_counts {
                let r = row(d, n);
                writeln!(
                    f,
                    "  {:>6} | {:>12.0} | {:>10.0} | {:>6.1} % | {:>8.2} | {:>8.2}",
                    r.shards,
                    r.max_calls,
                    r.mean_calls,
                    100.0 * r.hottest_share,
                    r.max_load,
                    r.mean_load
                )?;
            }
            let need = shards_needed(d, 4_096);
            let alone = if need.alone.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = need
                    .alone
                    .iter()
                    .take(5)
                    .map(|(kind, load)| format!("{kind} {load:.2}"))
                    .collect();
                format!(
                    ", besides {} domain(s) that alone exceed it (no shard count helps: lease or split them), in primaries: {}{}",
                    need.alone.len(),
                    list.join(", "),
                    if need.alone.len() > 5 { ", …" } else { "" }
                )
            };
            match need.shards {
                Some(n) => writeln!(
                    f,
                    "  shards needed (every shard at most {:.0} % of a primary): {n}{alone}",
                    100.0 * HEADROOM
                )?,
                None => writeln!(f, "  shards needed: more than 4096{alone}")?,
            }
        }
        Ok(())
    }
}
