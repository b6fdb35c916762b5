//! Validation of `[store.lease]` and the `lease = "off"` switches of
//! tenants, keys and deployments.

use std::time::Duration;

use super::V;
use crate::config::raw::RawConfig;
use crate::config::store::{LeaseMode, LeasePolicy, StoreKind};

fn mode(v: &mut V, path: &str, value: Option<&str>) -> Option<LeaseMode> {
    match value? {
        "auto" => Some(LeaseMode::Auto),
        "off" => Some(LeaseMode::Off),
        other => {
            v.err(path, format!("must be \"auto\" or \"off\", not {other:?}"));
            None
        }
    }
}

/// `[store.lease]` for a store of `kind`: leases are the Redis store's
/// (`auto` by default there); the memory store is exact in one process
/// and refuses any lease setting.
pub(super) fn lease(v: &mut V, raw: &RawConfig, kind: &StoreKind) -> LeasePolicy {
    let mut p = LeasePolicy::default();
    let memory = matches!(kind, StoreKind::Memory);
    if let Some(l) = &raw.store.lease {
        if memory {
            v.err(
                "store.lease",
                "leases need store.kind = \"redis\" (the memory store is exact within one gateway)",
            );
        }
        p.mode = mode(v, "store.lease.mode", l.mode.as_deref()).unwrap_or(LeaseMode::Auto);
        if let Some(n) = v.positive("store.lease.min_rate", l.min_rate, 1_000_000_000) {
            p.min_rate = n;
        }
        let ms = |v: &mut V, path: &str, x: Option<i64>, max: u64| {
            v.positive(path, x, max).map(Duration::from_millis)
        };
        if let Some(d) = ms(v, "store.lease.ttl_ms", l.ttl_ms, 3_600_000) {
            p.ttl = d;
        }
        if let Some(d) = ms(
            v,
            "store.lease.report_interval_ms",
            l.report_interval_ms,
            3_600_000,
        ) {
            p.report_interval = d;
        }
        match l.clock_margin_ms {
            None => {}
            Some(x) if (0..=60_000).contains(&x) => {
                p.clock_margin = Duration::from_millis(x as u64)
            }
            Some(_) => v.err("store.lease.clock_margin_ms", "must be within 0..=60000"),
        }
        match l.max_fraction {
            None => {}
            Some(f) if f > 0.0 && f <= 1.0 => p.max_fraction = f,
            Some(_) => v.err("store.lease.max_fraction", "must be within (0, 1]"),
        }
        if let Some(n) = v.positive("store.lease.fleet_size", l.fleet_size, 100_000) {
            p.fleet_size = n;
        }
        if p.ttl < p.report_interval {
            v.err(
                "store.lease.ttl_ms",
                format!(
                    "must be at least store.lease.report_interval_ms ({} ms): a lease must outlive the interval it is renewed in",
                    p.report_interval.as_millis()
                ),
            );
        }
        if p.clock_margin * 2 >= p.ttl {
            v.err(
                "store.lease.clock_margin_ms",
                "must be below half of store.lease.ttl_ms",
            );
        }
    } else if memory {
        p.mode = LeaseMode::Off;
    }
    for (i, t) in raw.tenants.iter().enumerate() {
        if mode(v, &format!("tenants[{i}].lease"), t.lease.as_deref()) == Some(LeaseMode::Off) {
            p.off_tenants.push(t.name.clone());
        }
        for (j, k) in t.keys.iter().enumerate() {
            let path = format!("tenants[{i}].keys[{j}].lease");
            if mode(v, &path, k.lease.as_deref()) == Some(LeaseMode::Off) {
                p.off_keys.push((t.name.clone(), k.id.clone()));
            }
        }
    }
    for (i, u) in raw.upstreams.iter().enumerate() {
        if mode(v, &format!("upstreams[{i}].lease"), u.lease.as_deref()) == Some(LeaseMode::Off) {
            p.off_deployments.push(u.name.clone());
        }
    }
    p
}
