//! A limit lowered by reload in the middle of a burst, three gateways on
//! one Redis, leases on: rpm 1200 → 120 and tpm 120,000 → 12,000, the
//! config file rewritten (by rename) while waves of requests run; each
//! gateway's reload is seen on its `budgetgate_policy_info` version.
//!
//! Bounds (DESIGN section 2, "Policy changes"; section 14, "Bounds" and
//! "Fencing"): the whole run keeps the old contract (the new limits are
//! lower); from `t_r`, the moment the last gateway runs the new policy,
//! what is admitted keeps the new contract — the first access under the
//! new policy clamps the bucket to the new burst — plus, as for any
//! interval that starts with leases out, their unspent units (at most
//! `max_fraction` of the old capacity per gateway); section 14 states the
//! new rate only "within one report interval plus ttl". The figure beyond
//! the new contract alone is printed. The "after" figures count the requests sent after
//! `t_r` (the mock counts them under a label of their own: each was
//! decided after `t_r`), their window from `t_r` to the last answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::client::{merged, waves};
use super::super::config::{Lease, Setup, Store, Tenant, LEASE_MAX_FRACTION, STORE_TIMEOUT_MS};
use super::super::procs::{Gateway, Mock, Redis};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chats, contract, cross_check, relabel, statuses};

const OLD_RPM: u64 = 1200;
const NEW_RPM: u64 = 120;
const OLD_TPM: u64 = 120_000;
const NEW_TPM: u64 = 12_000;
const MAX_TOKENS: u64 = 50;
const WAVE: usize = 100;
const TENANT: &str = "reload";
/// The upstream's label of the requests sent after `t_r`.
const AFTER: &str = "reload-after";

fn limits(rpm: u64, tpm: u64) -> String {
    format!("{{ rpm = {rpm}, tpm = {tpm} }}")
}

async fn version(g: &Gateway) -> Option<String> {
    let text = g.metrics().await.ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("budgetgate_policy_info{"))?;
    let v = line.split("version=\"").nth(1)?;
    Some(v.split('"').next()?.to_string())
}

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    let redis = Redis::start(&[]).await?;
    let mut setup = Setup::new(
        Store::Redis {
            url: redis.url(),
            prefix: "acc".into(),
            lease: Lease::On,
            fleet: 3,
            timeout_ms: STORE_TIMEOUT_MS,
        },
        &mock.base_url(),
    );
    setup
        .tenants
        .push(Tenant::new(TENANT, &limits(OLD_RPM, OLD_TPM)));
    let mut fleet = Fleet::start(ctx, &setup, 3).await?;
    let mut before = Vec::new();
    for g in &fleet.gws {
        before.push(version(g).await.ok_or("no policy version")?);
    }
    let run = Duration::from_secs(if ctx.quick { 3 } else { 5 });
    let addrs = fleet.addrs();
    // Bursts sent after t_r are counted upstream under AFTER: each of their
    // admissions was decided under the new policy.
    let reloaded = Arc::new(AtomicBool::new(false));
    let flag = reloaded.clone();
    let load = tokio::spawn(async move {
        waves(
            run,
            Duration::from_millis(100),
            |_| {
                let reqs = chats(&addrs, TENANT, WAVE, MAX_TOKENS, false);
                if flag.load(Ordering::SeqCst) {
                    relabel(reqs, AFTER)
                } else {
                    reqs
                }
            },
            Duration::from_secs(60),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    setup.tenants[0].limits = limits(NEW_RPM, NEW_TPM);
    let written = Instant::now();
    setup.write(fleet.dir.path())?;
    let mut seen = vec![None; fleet.gws.len()];
    while seen.iter().any(Option::is_none) {
        if written.elapsed() > Duration::from_secs(10) {
            return Err("a gateway never reloaded".into());
        }
        for (i, g) in fleet.gws.iter().enumerate() {
            if seen[i].is_none() && version(g).await.is_some_and(|v| v != before[i]) {
                seen[i] = Some(written.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t_r = Instant::now();
    reloaded.store(true, Ordering::SeqCst);
    let bursts = load.await.map_err(|e| e.to_string())?;
    let b = merged(&bursts);
    let mut c = mock.counters().await?;
    let after = c.tenant(AFTER);
    let t = c.tenant(TENANT).plus(&after);
    c.tenants.remove(AFTER);
    c.tenants.insert(TENANT.into(), t);
    let end = b
        .started
        .map(|s| s + Duration::from_secs_f64(b.window_ms / 1e3))
        .unwrap_or(t_r);
    let after_ms = end.saturating_duration_since(t_r).as_secs_f64() * 1e3;
    // Section 14: an interval that starts with leases out may admit their
    // unspent units beyond its contract (leases granted under the old
    // policy, at most max_fraction of its capacity per gateway).
    let lease_req = 3.0 * LEASE_MAX_FRACTION * OLD_RPM as f64;
    let lease_tok = 3.0 * LEASE_MAX_FRACTION * OLD_TPM as f64;
    let new_req = contract(NEW_RPM, NEW_RPM, after_ms);
    let new_tok = contract(NEW_TPM, NEW_TPM, after_ms);
    let mut row = Row::new(
        "reload",
        "rpm 1200→120, tpm 120k→12k, 3 gateways, Redis, leases on".into(),
        Check::new(
            "requests sent after t_r",
            after.requests,
            new_req + lease_req,
            "req",
        ),
        Check::new(
            "spent, sent after t_r",
            after.spent(),
            new_tok + lease_tok,
            "tok",
        ),
    );
    row.extra.push(Check::new(
        "reserved, sent after t_r",
        after.reserved(),
        new_tok + lease_tok,
        "tok",
    ));
    row.extra.push(Check::new(
        "requests, whole run",
        t.requests,
        contract(OLD_RPM, OLD_RPM, b.window_ms),
        "req",
    ));
    row.notes.push(format!(
        "beyond the new contract alone (without the lease term): {:+.0} requests, {:+.0} tokens",
        after.requests as f64 - new_req.floor(),
        after.spent() as f64 - new_tok.floor()
    ));
    row.bound = format!(
        "sent after t_r: rpm {NEW_RPM} + 2/s × D' + 3 × {LEASE_MAX_FRACTION} × {OLD_RPM} (units out on old-policy leases at t_r, DESIGN §14 Bounds), tpm {NEW_TPM} + 200/s × D' + 3 × {LEASE_MAX_FRACTION} × {OLD_TPM} (D' = {after_ms:.0} ms; §2 policy changes; §14: the new rate within one report interval + ttl); whole run: rpm {OLD_RPM} + 20/s × D (D = {:.0} ms)",
        b.window_ms
    );
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    cross_check(&mut row, &b, &c, TENANT, true);
    row.notes.push(format!(
        "reload seen by the gateways {} ms after the write; t_r − write = {:.0} ms",
        seen.iter()
            .map(|s| format!("{:.0}", s.unwrap_or_default().as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join("/"),
        (t_r - written).as_secs_f64() * 1e3
    ));
    if b.other() + b.failed() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other() + b.failed()));
    }
    Ok(vec![row])
}
