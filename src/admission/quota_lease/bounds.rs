//! The bounds of quota leases for a configuration, as `check-config`
//! prints them (DESIGN section 14, "Bounds").

use super::book::LeaseOff;
use crate::admission::plan::{scope_budgets, upstream_budgets};
use crate::budget::{BudgetKind, BudgetSpec, Scope};
use crate::config::store::{LeaseMode, StoreKind};
use crate::config::Policy;

/// One line per leasable budget of the config's tenants, keys and
/// deployments, after a header with the fleet-wide rules; empty when
/// leases are off.
pub fn describe(policy: &Policy) -> Vec<String> {
    let l = &policy.store.lease;
    if l.mode != LeaseMode::Auto || !matches!(policy.store.kind, StoreKind::Redis { .. }) {
        return Vec::new();
    }
    let n = l.fleet_size;
    let mut out = vec![
        format!(
            "leases: budgets asked more than {} times a second by one gateway are leased (ttl {} ms, report every {} ms, at most {} of a budget per lease), fleet of {n} gateway(s):",
            l.min_rate,
            l.ttl.as_millis(),
            l.report_interval.as_millis(),
            l.max_fraction
        ),
        "  without faults: over-admission 0 (leases are debited before they are spent); stranded at most the leases below".into(),
        "  slots: requests still running on a concurrency lease that is fenced (its limit changed) or expires are leased again by their gateway at its next round, at most half the free slots per call; until then, and while the store is unreachable, over-admission at most the slots in use on that lease".into(),
        "  a gateway killed: what its leases held is lost until they expire (counted as spent); a failover that loses a grant: over-admission at most one lease; a partition: spending stops at the lease's expiry".into(),
    ];
    let ks = crate::admission::plan::key_space(policy);
    let off = LeaseOff::of(l);
    let mut specs: Vec<BudgetSpec> = Vec::new();
    for t in &policy.tenants {
        specs.extend(scope_budgets(
            &ks,
            Scope::Tenant(t.name.as_str().into()),
            &t.limits,
            true,
        ));
        for k in &t.keys {
            specs.extend(scope_budgets(
                &ks,
                Scope::Key(t.name.as_str().into(), k.id.as_str().into()),
                &k.limits,
                true,
            ));
        }
    }
    for u in &policy.upstreams {
        specs.extend(upstream_budgets(&ks, u));
    }
    for s in &specs {
        if !off.allows(&s.scope) {
            out.push(format!("  {} {}: exact (lease = \"off\")", s.scope, s.name));
            continue;
        }
        let lease = max_lease(s.capacity(), l.max_fraction);
        let refill = match s.kind {
            BudgetKind::Bucket { per_minute, .. } if per_minute > 0 => {
                format!(
                    ", a lost lease refills in {:.1} s",
                    lease as f64 * 60.0 / per_minute as f64
                )
            }
            BudgetKind::Quota { .. } => ", a lost quota lease stays spent for its window".into(),
            BudgetKind::Concurrency { .. } => format!(
                ", a fenced or expired lease over-admits at most {lease} slots until its requests are leased again or end"
            ),
            _ => String::new(),
        };
        out.push(format!(
            "  {} {}: one lease at most {lease}; stranded at most {} across the fleet; a lost grant over-admits at most {lease}{refill}",
            s.scope,
            s.name,
            lease.saturating_mul(n),
        ));
    }
    out
}

/// The most one lease of a budget of `capacity` may hold.
pub fn max_lease(capacity: u64, max_fraction: f64) -> u64 {
    let ppm = (max_fraction * 1e6).round().clamp(1.0, 1e6) as u128;
    ((u128::from(capacity) * ppm / 1_000_000) as u64).max(1)
}
