//! Budget domains across a Redis Cluster (`store.layout = "tenant"`, DESIGN
//! section 22): three primaries with one replica each
//! (`cluster-node-timeout` 2,000 ms), three gateways, nine tenants chosen by
//! their slot so that each primary holds three tenant domains (printed:
//! `CLUSTER KEYSLOT` of each tenant's tag against `CLUSTER SHARDS`), one
//! deployment `mock` with budgets of its own (its group's domain on one
//! primary).
//!
//! - **Round 1**, leases on and off: one burst over every tenant's and the
//!   deployment's limits across the three gateways. Bound (section 2, per
//!   domain, each exact): per tenant, requests ≤ rpm + rpm/60 × D and
//!   reserved tokens ≤ tpm + tpm/60 × D; the fleet (the deployment) the
//!   same with the deployment's limits. Cold start, so no lease term
//!   (section 14: a lease is debited before it is spent).
//! - **Round 2**, leases off with a 1 s store timeout, shorter than the
//!   failover (the full run also with the 5 s timeout, leases off and
//!   on, each on a cluster of its own; leases on add one lease per gateway to
//!   the killed primary's tenants' bound, section 14's lost grant): open-loop
//!   load (each request a task of its own, so that one waiting on the dead
//!   primary delays no other), every
//!   tenant saturated; then the primary of three tenant domains (not the
//!   deployment group's) is killed with SIGKILL and its replica promoted
//!   by the cluster itself (automatic failover after the node timeout;
//!   `CLUSTER FAILOVER TAKEOVER` on the replica only if that did not come
//!   within 15 s, noted). Measured per tenant: answers other than 200/429
//!   (fail_closed 503s, store errors) and degraded decisions (the gateways'
//!   `/metrics`, by tenant): the tenants elsewhere must have none, and
//!   stay within the exact contract; the tenants on the killed primary may,
//!   and their time from the kill to their first admission again is
//!   printed. Their bound: contract + rate × lag (section 22, "Fences per
//!   domain": the promoted replica lacks the writes of the last
//!   replication lag; `lag` sampled on that very shard during the load),
//!   and the admitted-minus-contract (the over-admission the lost writes
//!   caused, negative when the outage left units unused) is printed.
//!
//! The cluster runs `cluster-require-full-coverage no`: with the default
//! (yes) every node refuses every query while any slot has no live primary
//! (between the primary's FAIL flag and its replica's promotion), and a
//! failover of one shard stops every domain.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use budgetgate::budget::placement::{deployment_tag, tenant_tag};

use super::super::client::{burst, one, Outcome, Timed};
use super::super::config::{Lease, Setup, Store, Tenant, LEASE_MAX_FRACTION, STORE_TIMEOUT_MS};
use super::super::procs::{connect, info_field, metric_sum, redis_cmd, Cluster, Mock, Shard};
use super::super::report::{Check, Row};
use super::super::{Ctx, Fleet};
use super::{chat, contract, statuses};

/// `store.domain`'s default: the first word of every tag.
const DOMAIN: &str = "default";
const NODE_TIMEOUT_MS: u64 = 2000;
const PER_PRIMARY: usize = 3;
const GATEWAYS: usize = 3;
const MAX_TOKENS: u64 = 50;
/// The deployment's name, also its budget scope and so its group's name.
const DEPLOYMENT: &str = "mock";

/// Round 1: each tenant's limits (the tpm binds first: ~24 requests of
/// ~61 tokens), the deployment's (its rpm binds: 150 of the tenants' 216).
const R1_RPM: u64 = 30;
const R1_TPM: u64 = 1_500;
const R1_DEP_RPM: u64 = 150;
const R1_DEP_TPM: u64 = 12_000;
const R1_PER_TENANT: usize = 45;

/// Round 2: a small burst and a fast refill, so that a saturated tenant is
/// admitted about every 100 ms (its first admission after the failover is
/// then seen within that); the deployment's limits stay above the
/// tenants' sum and are checked, not binding.
const R2_RPM: u64 = 600;
const R2_RPM_BURST: u64 = 20;
const R2_TPM: u64 = 60_000;
const R2_TPM_BURST: u64 = 2_000;
const R2_DEP_RPM: u64 = 6_000;
const R2_DEP_RPM_BURST: u64 = 300;
const R2_DEP_TPM: u64 = 600_000;
const R2_DEP_TPM_BURST: u64 = 30_000;
/// One request per tenant per gateway every tick (270 requests a second).
const TICK: Duration = Duration::from_millis(100);
const KILL_AT: Duration = Duration::from_millis(2500);
/// Load after the promotion, to see every tenant admitted again.
const AFTER_PROMOTION: Duration = Duration::from_secs(3);
/// How long the cluster is given to promote the replica by itself.
const AUTOMATIC_WITHIN: Duration = Duration::from_secs(15);
const ANSWER_LIMIT: Duration = Duration::from_secs(60);
/// A store timeout shorter than the failover: the tenants on the killed
/// primary are refused (503, `fail_closed`) instead of waiting it out.
const SHORT_TIMEOUT_MS: u64 = 1000;

/// Which tenant lives on which shard.
struct Placement {
    /// The shards, ordered by their first slot ("primary 0, 1, 2").
    shards: Vec<Shard>,
    /// Each tenant and the index of its shard.
    tenants: Vec<(String, usize)>,
    /// The deployment group's shard.
    deployment: usize,
    /// What to print (and note in the rows).
    lines: Vec<String>,
}

impl Placement {
    fn on(&self, shard: usize) -> Vec<&str> {
        self.tenants
            .iter()
            .filter(|(_, s)| *s == shard)
            .map(|(t, _)| t.as_str())
            .collect()
    }
}

async fn place(cluster: &Cluster) -> Result<Placement, String> {
    let mut shards = cluster.shards().await?;
    shards.sort_by_key(|s| s.slots.first().map(|r| r.0));
    let shard_of = |slot: u16| shards.iter().position(|s| s.holds(slot));
    let dep_tag = deployment_tag(DOMAIN, DEPLOYMENT);
    let dep_slot = cluster.keyslot(&format!("{{{dep_tag}}}")).await?;
    let deployment = shard_of(dep_slot).ok_or(format!("no shard holds slot {dep_slot}"))?;
    let mut tenants = Vec::new();
    let mut slots = BTreeMap::new();
    let mut count = vec![0usize; shards.len()];
    for i in 0..200 {
        if count.iter().all(|&c| c >= PER_PRIMARY) {
            break;
        }
        let name = format!("t{i:02}");
        let slot = cluster
            .keyslot(&format!("{{{}}}", tenant_tag(DOMAIN, &name)))
            .await?;
        let Some(s) = shard_of(slot) else {
            return Err(format!("no shard holds slot {slot}"));
        };
        if count[s] < PER_PRIMARY {
            count[s] += 1;
            slots.insert(name.clone(), slot);
            tenants.push((name, s));
        }
    }
    if count.len() != 3 || count.iter().any(|&c| c < PER_PRIMARY) {
        return Err(format!(
            "the tenants do not cover three primaries: {count:?} per shard"
        ));
    }
    let mut lines = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        let on: Vec<String> = tenants
            .iter()
            .filter(|(_, x)| *x == i)
            .map(|(t, _)| format!("{t} (slot {})", slots[t]))
            .collect();
        lines.push(format!(
            "primary {i} :{} (slots {}; replica :{}): tenants {}{}",
            s.primary.unwrap_or(0),
            s.slots
                .iter()
                .map(|(a, b)| format!("{a}–{b}"))
                .collect::<Vec<_>>()
                .join(", "),
            s.replicas.first().copied().unwrap_or(0),
            on.join(", "),
            if i == deployment {
                format!("; deployment group {{{dep_tag}}} (slot {dep_slot})")
            } else {
                String::new()
            }
        ));
    }
    Ok(Placement {
        shards,
        tenants,
        deployment,
        lines,
    })
}

pub async fn run(ctx: &Ctx) -> Result<Vec<Row>, String> {
    let (cluster, placement) = start_cluster().await?;
    let mut rows = Vec::new();
    let r1: &[Lease] = if ctx.quick {
        &[Lease::On]
    } else {
        &[Lease::On, Lease::Off]
    };
    for &lease in r1 {
        rows.push(round1(ctx, &cluster, &placement, lease).await?);
    }
    // The failover kills a primary: last on this cluster, and each
    // further failover on a cluster of its own.
    // The quick run's failover: a timeout shorter than the failover, the
    // one that keeps the other tenants serving (ACCURACY.md, "Shards": with
    // 5 s the calls waiting on the dead shard hold the gateway's store
    // turns, and the other tenants were refused in 2 runs of 14).
    rows.push(round2(ctx, cluster, &placement, Lease::Off, SHORT_TIMEOUT_MS).await?);
    if !ctx.quick {
        for (lease, timeout_ms) in [
            (Lease::Off, STORE_TIMEOUT_MS),
            (Lease::On, STORE_TIMEOUT_MS),
        ] {
            let (cluster, placement) = start_cluster().await?;
            rows.push(round2(ctx, cluster, &placement, lease, timeout_ms).await?);
        }
    }
    Ok(rows)
}

async fn start_cluster() -> Result<(Cluster, Placement), String> {
    let cluster = Cluster::start(NODE_TIMEOUT_MS).await?;
    let placement = place(&cluster).await?;
    for l in &placement.lines {
        println!("shards: {l}");
    }
    Ok((cluster, placement))
}

fn store(cluster: &Cluster, prefix: &str, lease: Lease, timeout_ms: u64) -> Store {
    Store::Redis {
        url: cluster.url(),
        prefix: prefix.into(),
        lease,
        fleet: GATEWAYS,
        timeout_ms,
    }
}

fn tenant_setup(
    cluster: &Cluster,
    mock: &Mock,
    placement: &Placement,
    prefix: &str,
    (lease, timeout_ms): (Lease, u64),
    tenant_limits: &str,
    deployment_limits: &str,
) -> Setup {
    let mut setup = Setup::new(store(cluster, prefix, lease, timeout_ms), &mock.base_url());
    setup.store_lines.push("layout = \"tenant\"".into());
    setup.upstream_limits = Some(deployment_limits.into());
    for (t, _) in &placement.tenants {
        setup.tenants.push(Tenant::new(t, tenant_limits));
    }
    setup
}

/// One burst over every tenant's and the deployment's limits.
async fn round1(
    ctx: &Ctx,
    cluster: &Cluster,
    placement: &Placement,
    lease: Lease,
) -> Result<Row, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    let prefix = format!("acc1{}", if lease == Lease::On { "on" } else { "off" });
    let setup = tenant_setup(
        cluster,
        &mock,
        placement,
        &prefix,
        (lease, STORE_TIMEOUT_MS),
        &format!("{{ rpm = {R1_RPM}, tpm = {R1_TPM} }}"),
        &format!("{{ rpm = {R1_DEP_RPM}, tpm = {R1_DEP_TPM} }}"),
    );
    let mut fleet = Fleet::start(ctx, &setup, GATEWAYS).await?;
    let addrs = fleet.addrs();
    // Tenants interleaved, each tenant's requests over every gateway.
    let mut reqs = Vec::new();
    let mut owner = Vec::new();
    for i in 0..R1_PER_TENANT {
        for (k, (t, _)) in placement.tenants.iter().enumerate() {
            reqs.push(chat(&addrs[(i + k) % addrs.len()], t, i, MAX_TOKENS, false));
            owner.push(k);
        }
    }
    let b = burst(&reqs, Duration::from_secs(120)).await;
    let c = mock.counters().await?;
    let d = b.window_ms;
    let mut row = Row::new(
        "shards",
        format!(
            "burst, 9 tenants on 3 primaries, 3 gateways, {}",
            lease.name()
        ),
        Check::new(
            "requests, fleet (deployment)",
            dep_total(&c).requests,
            contract(R1_DEP_RPM, R1_DEP_RPM, d),
            "req",
        ),
        Check::new(
            "reserved, fleet (deployment)",
            dep_total(&c).reserved(),
            contract(R1_DEP_TPM, R1_DEP_TPM, d),
            "tok",
        ),
    );
    let busiest = busiest(&c, placement.tenants.iter().map(|(t, _)| t.as_str()));
    row.extra.push(Check::new(
        "requests, busiest tenant",
        busiest.requests,
        contract(R1_RPM, R1_RPM, d),
        "req",
    ));
    row.extra.push(Check::new(
        "reserved, busiest tenant",
        busiest.reserved,
        contract(R1_TPM, R1_TPM, d),
        "tok",
    ));
    row.extra.push(Check::new(
        "spent, busiest tenant",
        busiest.spent,
        contract(R1_TPM, R1_TPM, d),
        "tok",
    ));
    row.bound = format!(
        "each domain exact (DESIGN §22): per tenant rpm {R1_RPM} + {:.1}/s × D, tpm {R1_TPM} + {}/s × D; the deployment rpm {R1_DEP_RPM} + {:.1}/s × D, tpm {R1_DEP_TPM} + {}/s × D (§2); cold start, no lease term (§14); D = {d:.0} ms",
        R1_RPM as f64 / 60.0,
        R1_TPM / 60,
        R1_DEP_RPM as f64 / 60.0,
        R1_DEP_TPM / 60
    );
    fleet.report(&mut row).await;
    row.set_burst(&b);
    row.notes.push(statuses(&b));
    row.notes.extend(placement.lines.iter().cloned());
    let mut per = Vec::new();
    for (k, (t, s)) in placement.tenants.iter().enumerate() {
        let answered = b
            .outcomes
            .iter()
            .zip(&owner)
            .filter(|(o, &w)| w == k && matches!(o, Outcome::Status { code: 200, .. }))
            .count() as u64;
        let refused = b
            .outcomes
            .iter()
            .zip(&owner)
            .filter(|(o, &w)| w == k && matches!(o, Outcome::Status { code: 429, .. }))
            .count();
        let u = c.tenant(t);
        per.push(format!("{t}@{s}: {} req/{} tok", u.requests, u.reserved()));
        if u.requests != answered {
            row.invalid.push(format!(
                "{t}: the upstream counted {} requests, the client {answered} answers",
                u.requests
            ));
        }
        if refused == 0 {
            row.invalid.push(format!(
                "{t}: nothing refused: its limits were never reached"
            ));
        }
    }
    row.notes.push(format!(
        "admitted per tenant (tenant@primary, upstream's count): {}",
        per.join(", ")
    ));
    if b.other() + b.failed() > 0 {
        row.invalid
            .push(format!("{} unexpected answers", b.other() + b.failed()));
    }
    tenants_match_deployment(&mut row, &c);
    Ok(row)
}

fn dep_total(c: &super::super::procs::Counters) -> super::super::procs::Tally {
    c.deployments
        .values()
        .fold(Default::default(), |a, t| a.plus(t))
}

fn tenants_match_deployment(row: &mut Row, c: &super::super::procs::Counters) {
    let all: u64 = c.tenants.values().map(|t| t.requests).sum();
    let dep = dep_total(c).requests;
    if all != dep {
        row.invalid.push(format!(
            "tenants' requests {all} ≠ deployments' {dep} upstream"
        ));
    }
}

/// The largest figures over `tenants` (each its own maximum).
#[derive(Default)]
struct Busiest {
    requests: u64,
    reserved: u64,
    spent: u64,
}

fn busiest<'a>(
    c: &super::super::procs::Counters,
    tenants: impl Iterator<Item = &'a str>,
) -> Busiest {
    let mut b = Busiest::default();
    for t in tenants {
        let u = c.tenant(t);
        b.requests = b.requests.max(u.requests);
        b.reserved = b.reserved.max(u.reserved());
        b.spent = b.spent.max(u.spent());
    }
    b
}

fn decided(o: Outcome) -> bool {
    matches!(
        o,
        Outcome::Status {
            code: 200 | 429,
            ..
        }
    )
}

fn admitted(o: Outcome) -> bool {
    matches!(o, Outcome::Status { code: 200, .. })
}

/// A primary killed mid-load, its replica promoted by the cluster.
async fn round2(
    ctx: &Ctx,
    mut cluster: Cluster,
    placement: &Placement,
    lease: Lease,
    timeout_ms: u64,
) -> Result<Row, String> {
    let mock = Mock::start(&ctx.bins, &["--output-tokens", &MAX_TOKENS.to_string()]).await?;
    // The victim: a shard holding tenant domains but not the deployment
    // group's (whose failover every tenant of the model would see).
    let victim = (0..placement.shards.len())
        .find(|&s| s != placement.deployment && !placement.on(s).is_empty())
        .ok_or("no primary holds tenant domains without the deployment group")?;
    let shard = &placement.shards[victim];
    let (Some(primary), Some(&replica)) = (shard.primary, shard.replicas.first()) else {
        return Err(format!("primary {victim} has no primary or no replica"));
    };
    let hit: Vec<String> = placement.on(victim).iter().map(|t| t.to_string()).collect();
    let spared: Vec<String> = placement
        .tenants
        .iter()
        .filter(|(_, s)| *s != victim)
        .map(|(t, _)| t.clone())
        .collect();
    let setup = tenant_setup(
        &cluster,
        &mock,
        placement,
        "acc2",
        (lease, timeout_ms),
        &format!("{{ rpm = {R2_RPM}, rpm_burst = {R2_RPM_BURST}, tpm = {R2_TPM}, tpm_burst = {R2_TPM_BURST} }}"),
        &format!("{{ rpm = {R2_DEP_RPM}, rpm_burst = {R2_DEP_RPM_BURST}, tpm = {R2_DEP_TPM}, tpm_burst = {R2_DEP_TPM_BURST} }}"),
    );
    let mut fleet = Fleet::start(ctx, &setup, GATEWAYS).await?;
    let addrs = fleet.addrs();
    let tenants: Vec<String> = placement.tenants.iter().map(|(t, _)| t.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let tenants = tenants.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for (k, t) in tenants.iter().enumerate() {
                    for a in &addrs {
                        let r = chat(a, t, i, MAX_TOKENS, false);
                        sent.push((k, tokio::spawn(async move { one(&r, ANSWER_LIMIT).await })));
                    }
                }
                i += 1;
            }
            let mut out = Vec::with_capacity(sent.len());
            for (k, h) in sent {
                if let Ok(t) = h.await {
                    out.push((k, t));
                }
            }
            out
        })
    };
    let t0 = Instant::now();
    let lag_key = format!("accuracy:lag:{{{}}}", tenant_tag(DOMAIN, &hit[0]));
    let lags = sample_lag(
        primary,
        replica,
        &lag_key,
        t0 + KILL_AT - Duration::from_millis(100),
    )
    .await;
    if let Some(rest) = (t0 + KILL_AT).checked_duration_since(Instant::now()) {
        tokio::time::sleep(rest).await;
    }
    let p_off = repl_offset(primary, "master_repl_offset").await;
    let node = cluster
        .node_mut(primary)
        .ok_or(format!("no node on :{primary}"))?;
    node.sigkill().await;
    let killed = Instant::now();
    let r_off = repl_offset(replica, "slave_repl_offset").await;
    let mut takeover = false;
    let mut promoted = wait_promoted(replica, killed + AUTOMATIC_WITHIN).await;
    if promoted.is_none() {
        takeover = true;
        let _ = redis_cmd(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]).await;
        promoted = wait_promoted(replica, Instant::now() + Duration::from_secs(5)).await;
    }
    if let Some(p) = promoted {
        let until = p + AFTER_PROMOTION;
        if let Some(rest) = until.checked_duration_since(Instant::now()) {
            tokio::time::sleep(rest).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let answers = load.await.map_err(|e| e.to_string())?;
    let c = mock.counters().await?;
    let started = answers.iter().map(|(_, t)| t.sent).min().unwrap_or(t0);
    let ended = answers.iter().map(|(_, t)| t.answered).max().unwrap_or(t0);
    let d = (ended - started).as_secs_f64() * 1e3;
    let lag_ms = lags.iter().copied().fold(0.0, f64::max);
    let mut sorted = lags.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let lag_req = R2_RPM as f64 * lag_ms / 60_000.0;
    let lag_tok = R2_TPM as f64 * lag_ms / 60_000.0;
    let exact_req = contract(R2_RPM_BURST, R2_RPM, d);
    // A grant written in the lag and lost: one lease per gateway undebited
    // (DESIGN section 14); the run starts cold, so elsewhere no lease term.
    let (lease_req, lease_tok) = if lease == Lease::On {
        let f = GATEWAYS as f64 * LEASE_MAX_FRACTION;
        (f * R2_RPM_BURST as f64, f * R2_TPM_BURST as f64)
    } else {
        (0.0, 0.0)
    };
    let exact_tok = contract(R2_TPM_BURST, R2_TPM, d);
    let hit_b = busiest(&c, hit.iter().map(String::as_str));
    let spared_b = busiest(&c, spared.iter().map(String::as_str));
    let mut row = Row::new(
        "shards",
        format!(
            "failover of 1 of 3 primaries mid-load, 3 gateways, {}, store timeout {timeout_ms} ms",
            lease.name()
        ),
        Check::new(
            "requests, busiest tenant on the killed primary",
            hit_b.requests,
            exact_req + lag_req + lease_req,
            "req",
        ),
        Check::new(
            "requests, busiest tenant elsewhere",
            spared_b.requests,
            exact_req,
            "req",
        ),
    );
    row.extra.push(Check::new(
        "reserved, busiest tenant on the killed primary",
        hit_b.reserved,
        exact_tok + lag_tok + lease_tok,
        "tok",
    ));
    row.extra.push(Check::new(
        "reserved, busiest tenant elsewhere",
        spared_b.reserved,
        exact_tok,
        "tok",
    ));
    let dep = dep_total(&c);
    row.extra.push(Check::new(
        "requests, deployment",
        dep.requests,
        contract(R2_DEP_RPM_BURST, R2_DEP_RPM, d),
        "req",
    ));
    row.extra.push(Check::new(
        "reserved, deployment",
        dep.reserved(),
        contract(R2_DEP_TPM_BURST, R2_DEP_TPM, d),
        "tok",
    ));
    // The tenants elsewhere keep serving: every answer a decision, no
    // degraded decision.
    let mut per: BTreeMap<usize, Vec<Timed>> = BTreeMap::new();
    for (k, t) in &answers {
        per.entry(*k).or_default().push(*t);
    }
    for v in per.values_mut() {
        v.sort_by_key(|t| t.sent);
    }
    let mut texts = Vec::new();
    for g in &fleet.gws {
        if let Ok(t) = g.metrics().await {
            texts.push(t);
        }
    }
    let degraded = |t: &str| -> u64 {
        texts
            .iter()
            .map(|x| metric_sum(x, "budgetgate_degraded_decisions_total", &[("tenant", t)]) as u64)
            .sum()
    };
    let errors = |k: usize| -> usize {
        per.get(&k)
            .map_or(0, |v| v.iter().filter(|t| !decided(t.outcome)).count())
    };
    let index = |t: &str| tenants.iter().position(|x| x == t).unwrap_or(usize::MAX);
    let spared_errors: usize = spared.iter().map(|t| errors(index(t))).sum();
    let spared_degraded: u64 = spared.iter().map(|t| degraded(t)).sum();
    row.extra.push(Check::new(
        "answers not 200/429, tenants elsewhere",
        spared_errors as u64,
        0.0,
        "req",
    ));
    row.extra.push(Check::new(
        "degraded decisions, tenants elsewhere",
        spared_degraded,
        0.0,
        "",
    ));
    row.bound = format!(
        "tenants elsewhere exact: rpm {R2_RPM_BURST} + {}/s × D, tpm {R2_TPM_BURST} + {}/s × D (§2), no error; tenants on the killed primary: + rate × lag ({lag_ms:.3} ms: {lag_req:.3} req, {lag_tok:.1} tok; §22 Fences per domain: the writes not yet replicated){}; the deployment (another primary) exact; D = {d:.0} ms",
        R2_RPM / 60,
        R2_TPM / 60,
        if lease == Lease::On {
            format!(" + {GATEWAYS} leases × {LEASE_MAX_FRACTION} × the burst ({lease_req:.0} req, {lease_tok:.0} tok; §14, a lost grant)")
        } else {
            String::new()
        }
    );
    row.degraded_intended = true;
    fleet.report(&mut row).await;
    row.spread_ms = 0.0;
    row.window_ms = d;
    let all: Vec<Outcome> = answers.iter().map(|(_, t)| t.outcome).collect();
    let merged = super::super::client::Burst {
        outcomes: all,
        ..Default::default()
    };
    row.notes.push(statuses(&merged));
    row.notes.push(format!(
        "killed primary {victim} (:{primary}, tenants {}); its replica :{replica} {} {} after the SIGKILL (node timeout {NODE_TIMEOUT_MS} ms)",
        hit.join(", "),
        if takeover {
            "promoted by CLUSTER FAILOVER TAKEOVER (the automatic failover had not come within 15 s)"
        } else {
            "promoted by the cluster's automatic failover"
        },
        promoted.map_or("never".into(), |p| format!("{:.0} ms", (p - killed).as_secs_f64() * 1e3))
    ));
    row.notes.push(format!(
        "replication lag on that shard over {} samples: median {median:.3} ms, max {lag_ms:.3} ms; the primary's offset just before its SIGKILL {p_off}, the replica's after it {r_off} ({:+} bytes)",
        lags.len(),
        r_off - p_off
    ));
    let mut outage_max: f64 = 0.0;
    for t in &hit {
        let k = index(t);
        let v = per.get(&k).cloned().unwrap_or_default();
        let after: Vec<&Timed> = v.iter().filter(|x| x.sent >= killed).collect();
        let first_ok = after
            .iter()
            .filter(|x| admitted(x.outcome))
            .map(|x| x.answered)
            .min();
        let errs: Vec<&&Timed> = after.iter().filter(|x| !decided(x.outcome)).collect();
        let last_err = errs.iter().map(|x| x.answered).max();
        let slowest = after
            .iter()
            .map(|x| (x.answered - x.sent).as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        let u = c.tenant(t);
        let over = u.requests as f64 - exact_req;
        let ms = |i: Option<Instant>| {
            i.map_or("never".to_string(), |i| {
                format!("{:.0} ms", (i - killed).as_secs_f64() * 1e3)
            })
        };
        if let Some(f) = first_ok {
            outage_max = outage_max.max((f - killed).as_secs_f64() * 1e3);
        } else {
            row.invalid.push(format!(
                "{t} (on the killed primary) was never admitted again"
            ));
        }
        let saturated = v
            .iter()
            .any(|x| x.answered < killed && matches!(x.outcome, Outcome::Status { code: 429, .. }));
        if !saturated {
            row.invalid.push(format!(
                "{t} was not refused before the kill: not saturated, the lost writes' bound is not at stake"
            ));
        }
        row.notes.push(format!(
            "{t} (killed primary): first admission after the kill {}, {} answers not 200/429 (last {}), {} degraded decisions, slowest answer {slowest:.0} ms; admitted {} req ({:+.1} against the contract without the lag term: the over-admission, negative when the outage left units unused), {} tok reserved",
            ms(first_ok),
            errs.len(),
            ms(last_err),
            degraded(t),
            u.requests,
            over,
            u.reserved()
        ));
    }
    let mut spared_notes = Vec::new();
    for t in &spared {
        let k = index(t);
        let v = per.get(&k).cloned().unwrap_or_default();
        let slowest = v
            .iter()
            .filter(|x| x.sent >= killed)
            .map(|x| (x.answered - x.sent).as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        let u = c.tenant(t);
        spared_notes.push(format!(
            "{t}: {} req, {} not 200/429, slowest {slowest:.0} ms",
            u.requests,
            errors(k)
        ));
        if !v.iter().any(|x| x.sent >= killed && admitted(x.outcome)) {
            row.invalid
                .push(format!("{t} was not admitted after the kill"));
        }
    }
    row.notes.push(format!(
        "tenants elsewhere (after the kill): {}",
        spared_notes.join("; ")
    ));
    if spared_errors > 0 || spared_degraded > 0 {
        // Why: the gateways' last warnings.
        for (i, g) in fleet.gws.iter().enumerate() {
            for l in g.log_tail(3) {
                row.notes.push(format!("gateway {i} log: {l}"));
            }
        }
    }
    row.notes.push(format!(
        "kill to the first admission again, slowest tenant of the killed primary: {outage_max:.0} ms (node timeout {NODE_TIMEOUT_MS} ms + the failover election + the client's topology refresh)"
    ));
    if promoted.is_none() {
        row.invalid
            .push("the failover did not happen: the replica was never promoted".into());
    }
    let hit_errors: usize = hit.iter().map(|t| errors(index(t))).sum();
    let spared_failed = answers
        .iter()
        .filter(|(k, t)| spared.iter().any(|s| index(s) == *k) && t.outcome == Outcome::Failed)
        .count();
    if spared_failed > 0 {
        row.notes.push(format!(
            "{spared_failed} requests of tenants elsewhere without an answer"
        ));
    }
    row.notes.push(format!(
        "{hit_errors} answers not 200/429 for the tenants on the killed primary"
    ));
    // Upstream counts against the client's answers: a request counted
    // upstream whose answer was lost is possible only for a failed one.
    for (k, t) in tenants.iter().enumerate() {
        let ok =
            per.get(&k)
                .map_or(0, |v| v.iter().filter(|x| admitted(x.outcome)).count()) as u64;
        let u = c.tenant(t).requests;
        if u < ok {
            row.invalid.push(format!(
                "{t}: the upstream counted {u} requests, the client {ok} answers"
            ));
        }
    }
    tenants_match_deployment(&mut row, &c);
    Ok(row)
}

async fn repl_offset(port: u16, field: &str) -> i64 {
    redis_cmd(port, &["INFO", "replication"])
        .await
        .ok()
        .and_then(|i| info_field(&i, field))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// When the node on `port` answers `ROLE` as a primary, polled until `until`.
async fn wait_promoted(port: u16, until: Instant) -> Option<Instant> {
    while Instant::now() < until {
        if redis_cmd(port, &["ROLE"])
            .await
            .is_ok_and(|r| r.lines().next() == Some("master"))
        {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Replication lag samples (ms) until `until`: `key` (in a slot of the
/// shard) written to the primary, the time until its replica answers it
/// (`READONLY`: a replica answers reads of its primary's slots).
async fn sample_lag(primary: u16, replica: u16, key: &str, until: Instant) -> Vec<f64> {
    let mut out = Vec::new();
    let (Ok(mut p), Ok(mut r)) = (connect(primary).await, connect(replica).await) else {
        return out;
    };
    let ro: redis::RedisResult<()> = redis::cmd("READONLY").query_async(&mut r).await;
    if ro.is_err() {
        return out;
    }
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let set: redis::RedisResult<()> =
            redis::cmd("SET").arg(key).arg(n).query_async(&mut p).await;
        if set.is_err() {
            break;
        }
        let written = Instant::now();
        loop {
            let got: redis::RedisResult<Option<u64>> =
                redis::cmd("GET").arg(key).query_async(&mut r).await;
            if got.is_ok_and(|v| v == Some(n)) {
                out.push(written.elapsed().as_secs_f64() * 1e3);
                break;
            }
            if written.elapsed() > Duration::from_secs(2) {
                out.push(2000.0);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_admission_or_a_budget_refusal_is_a_decision() {
        assert!(decided(Outcome::Status {
            code: 200,
            cut: false
        }));
        assert!(decided(Outcome::Status {
            code: 429,
            cut: false
        }));
        assert!(!decided(Outcome::Status {
            code: 503,
            cut: false
        }));
        assert!(!decided(Outcome::Failed));
        assert!(admitted(Outcome::Status {
            code: 200,
            cut: true
        }));
        assert!(!admitted(Outcome::Status {
            code: 429,
            cut: false
        }));
    }
}
