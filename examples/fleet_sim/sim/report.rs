//! What a simulated run measured, and the comparison the report prints.

use std::fmt;

use super::SimConfig;

/// One tenant's admissions in one run.
#[derive(Debug, Clone, Default)]
pub struct BudgetCount {
    /// Requests admitted (what its `rpm` bucket gave).
    pub requests: u64,
    /// Tokens admitted, at their settled (actual) amount: what its `tpm`
    /// bucket gave net of refunds.
    pub tokens: u64,
    /// Units of `rpm` leases a lost grant let a gateway spend undebited.
    pub lost_rpm: u64,
    /// Units of `tpm` leases a lost grant let a gateway spend undebited.
    pub lost_tpm: u64,
}

/// Requests by number, one bit each.
#[derive(Debug, Clone, Default)]
pub struct Bits(Vec<u64>);

impl Bits {
    /// Sets bit `i`.
    pub fn set(&mut self, i: u64, v: bool) {
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        if v {
            self.0[w] |= 1 << b;
        }
    }

    /// Bits set here and not in `other`.
    pub fn minus(&self, other: &Bits) -> u64 {
        self.0
            .iter()
            .enumerate()
            .map(|(i, w)| (w & !other.0.get(i).copied().unwrap_or(0)).count_ones() as u64)
            .sum()
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Requests that arrived.
    pub requests: u64,
    /// Admitted.
    pub admitted: u64,
    /// Admitted from leases, without a store call.
    pub local: u64,
    /// Refused.
    pub refused: u64,
    /// Refused from leases, without a store call.
    pub refused_locally: u64,
    /// Store calls: reservations, settlements and lease calls.
    pub store_calls: u64,
    /// Lease calls among them.
    pub lease_calls: u64,
    /// Per tenant.
    pub budgets: Vec<BudgetCount>,
    /// Units out on leases and unspent, `[rpm, tpm]`, every 100 ms.
    pub stranded_samples: Vec<[u64; 2]>,
    /// Units held by the leases of crashed gateways when they died.
    pub crash_lost_units: u64,
    /// Faults injected.
    pub crashes: u64,
    /// Partitions injected.
    pub partitions: u64,
    /// Grants lost by a simulated failover.
    pub lost_grants: u64,
    /// Which requests were admitted.
    pub admitted_set: Bits,
}

/// One budget beside its bound.
#[derive(Debug, Clone)]
pub struct BudgetLine {
    /// Tenant index (0 is the most popular).
    pub tenant: usize,
    /// `rpm` or `tpm`.
    pub name: &'static str,
    /// The most the bucket admits over the run: burst + rate × time.
    pub bound: u64,
    /// Admitted with leases.
    pub leased: u64,
    /// Admitted with exact reservations.
    pub exact: u64,
    /// What lost grants allow above the bound (the stated fault bound).
    pub allowance: u64,
}

impl BudgetLine {
    /// Admitted beyond the bound.
    pub fn over(&self) -> u64 {
        self.leased.saturating_sub(self.bound)
    }
}

/// Both runs of one configuration, compared.
#[derive(Debug, Clone)]
pub struct Report {
    /// The configuration.
    pub cfg: SimConfig,
    /// With leases.
    pub leased: RunStats,
    /// Every reservation exact.
    pub exact: RunStats,
    /// Every budget of every tenant.
    pub budgets: Vec<BudgetLine>,
    /// Requests the exact store admitted and the leased fleet refused.
    pub false_refusals: u64,
}

impl Report {
    pub(super) fn new(cfg: &SimConfig, leased: RunStats, exact: RunStats) -> Self {
        let secs_micros = cfg.seconds * 1_000_000 + cfg.latency_micros;
        let mut budgets = Vec::new();
        let weights: Vec<f64> = (1..=cfg.tenants)
            .map(|k| (k as f64).powf(-cfg.zipf))
            .collect();
        let _ = weights;
        for (t, (l, e)) in leased.budgets.iter().zip(&exact.budgets).enumerate() {
            let (rpm, tpm) = super::fleet_limits(cfg, t);
            let bound = |per_minute: u64| {
                super::burst_of(per_minute)
                    + (u128::from(per_minute) * u128::from(secs_micros) / 60_000_000) as u64
            };
            budgets.push(BudgetLine {
                tenant: t,
                name: "rpm",
                bound: bound(rpm),
                leased: l.requests,
                exact: e.requests,
                allowance: l.lost_rpm,
            });
            budgets.push(BudgetLine {
                tenant: t,
                name: "tpm",
                bound: bound(tpm),
                leased: l.tokens,
                exact: e.tokens,
                allowance: l.lost_tpm,
            });
        }
        let false_refusals = exact.admitted_set.minus(&leased.admitted_set);
        Self {
            cfg: cfg.clone(),
            leased,
            exact,
            budgets,
            false_refusals,
        }
    }

    /// Budgets admitted beyond their bound by more than lost grants allow.
    pub fn over_admitted(&self) -> Vec<&BudgetLine> {
        self.budgets
            .iter()
            .filter(|b| b.over() > b.allowance)
            .collect()
    }

    /// The budget furthest above its bound (with its allowance).
    pub fn worst_over(&self) -> Option<&BudgetLine> {
        self.budgets
            .iter()
            .filter(|b| b.over() > 0)
            .max_by_key(|b| b.over())
    }

    /// Store calls per admitted request, with leases and exact.
    pub fn calls_per_admission(&self) -> (f64, f64) {
        let r = |s: &RunStats| s.store_calls as f64 / s.admitted.max(1) as f64;
        (r(&self.leased), r(&self.exact))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.cfg;
        let (l, e) = (&self.leased, &self.exact);
        writeln!(f, "fleet simulation: seed {}, {} gateways, {} primaries, {} tenants (zipf {}), {} req/s for {} s, bursts of {} on average, {} µs one way", c.seed, c.gateways, c.primaries, c.tenants, c.zipf, c.rate, c.seconds, c.burst, c.latency_micros)?;
        writeln!(
            f,
            "lease: min_rate {}/s, ttl {} ms, report {} ms, max_fraction {}",
            c.lease.min_rate,
            c.lease.ttl.as_millis(),
            c.lease.report_interval.as_millis(),
            c.lease.max_fraction
        )?;
        writeln!(
            f,
            "requests {}: admitted leased {} (from leases {:.1} %), exact {}",
            l.requests,
            l.admitted,
            100.0 * l.local as f64 / l.admitted.max(1) as f64,
            e.admitted
        )?;
        writeln!(
            f,
            "false refusals (exact admitted, leased refused): {} ({:.3} % of requests)",
            self.false_refusals,
            100.0 * self.false_refusals as f64 / l.requests.max(1) as f64
        )?;
        let (cl, ce) = self.calls_per_admission();
        writeln!(
            f,
            "store calls per admitted request: leased {cl:.4} ({} lease calls), exact {ce:.4}",
            l.lease_calls
        )?;
        let n = l.stranded_samples.len().max(1) as f64;
        let mean = |i: usize| l.stranded_samples.iter().map(|s| s[i]).sum::<u64>() as f64 / n;
        let max = |i: usize| l.stranded_samples.iter().map(|s| s[i]).max().unwrap_or(0);
        let cap = |name: &str| {
            self.budgets
                .iter()
                .filter(|b| b.name == name)
                .map(|b| b.bound)
                .sum::<u64>()
                .max(1)
        };
        writeln!(f, "stranded on leases: rpm mean {:.0} max {} requests, tpm mean {:.0} max {} tokens (of {} and {} over the run)", mean(0), max(0), mean(1), max(1), cap("rpm"), cap("tpm"))?;
        let over: Vec<_> = self.budgets.iter().filter(|b| b.over() > 0).collect();
        writeln!(
            f,
            "budgets admitted above their bound: {} of {} (exact run: {})",
            over.len(),
            self.budgets.len(),
            self.budgets.iter().filter(|b| b.exact > b.bound).count()
        )?;
        if l.crashes + l.partitions + l.lost_grants > 0 {
            writeln!(f, "faults: {} gateway crashes ({} units held by their leases lost), {} partitions of {} ms, {} lost grants", l.crashes, l.crash_lost_units, l.partitions, c.faults.partition_micros / 1000, l.lost_grants)?;
            match self.worst_over() {
                Some(w) => writeln!(f, "worst over-admission: tenant {} {} +{} above {} (stated bound: the lost grants' leases, {})", w.tenant, w.name, w.over(), w.bound, w.allowance)?,
                None => writeln!(f, "worst over-admission: none (stated bound: the lost grants' leases)")?,
            }
        }
        writeln!(f, "top tenants (admitted leased / exact / bound):")?;
        for b in self.budgets.iter().take(10) {
            writeln!(
                f,
                "  tenant {:>4} {}: {} / {} / {}",
                b.tenant, b.name, b.leased, b.exact, b.bound
            )?;
        }
        Ok(())
    }
}
