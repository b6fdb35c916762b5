//! The event loop of one simulated run.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Geometric, Zipf};

use super::report::{BudgetCount, RunStats};
use super::SimConfig;
use budgetgate::admission::quota_lease::{self, Book, Call, Decision, LeaseOff, Refused};
use budgetgate::budget::keys::hash_tag;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::quota_lease::{LeaseLine, LeaseReply};
use budgetgate::budget::{
    Actual, BudgetKind, BudgetName, BudgetSpec, Costs, Requester, ReserveOutcome, ReserveRequest,
    Scope, Settlement,
};
use budgetgate::clock::ManualClock;

/// UTC µs of simulated time 0 (2026-12-01).
const BASE_UTC: u64 = 1_796_083_200_000_000;
/// How long a failed call takes to fail (the gateway's store timeout).
const TIMEOUT: u64 = 50_000;
/// Hold lifetime of every simulated reservation, µs.
const HOLD_TTL: u64 = 3_000_000;

enum Event {
    SettleLocal {
        gw: usize,
        gen: u64,
        id: String,
        actual: u64,
    },
    StoreReserve {
        gw: usize,
        gen: u64,
        req: ReserveRequest,
        req_no: u64,
        actual: u64,
        duration: u64,
    },
    SettleStore {
        primary: usize,
        id: String,
        actual: u64,
    },
    Tick {
        gw: usize,
    },
    LeaseApply {
        gw: usize,
        gen: u64,
        call: Call,
    },
    LeaseReply {
        gw: usize,
        gen: u64,
        call: Call,
        replies: Option<Vec<LeaseReply>>,
    },
    Crash {
        gw: usize,
    },
    Partition {
        gw: usize,
    },
    LoseGrant,
    Sample,
}

struct Queued {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// One run: the fleet, its stores, its arrivals.
pub(super) struct Fleet<'c> {
    cfg: &'c SimConfig,
    leased: bool,
    clock: ManualClock,
    primaries: Vec<MemoryStore>,
    books: Vec<Book>,
    generation: Vec<u64>,
    partitioned_until: Vec<u64>,
    /// Tenants' budgets: `[rpm, tpm]`, and the primary of their domain.
    budgets: Vec<([BudgetSpec; 2], usize)>,
    primary_of: HashMap<String, usize>,
    requester: Arc<Requester>,
    events: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    /// Grant losses still to inject.
    lose_grants: u64,
    stats: RunStats,
}

impl<'c> Fleet<'c> {
    pub(super) fn new(cfg: &'c SimConfig, leased: bool) -> Self {
        let clock = ManualClock::new(BASE_UTC);
        let primaries = (0..cfg.primaries.max(1))
            .map(|_| MemoryStore::new(Arc::new(clock.clone())))
            .collect();
        let mut budgets = Vec::with_capacity(cfg.tenants);
        let mut primary_of = HashMap::new();
        for i in 0..cfg.tenants {
            let (rpm, tpm) = super::fleet_limits(cfg, i);
            let domain = format!("t{i}");
            let primary = i % cfg.primaries.max(1);
            primary_of.insert(domain.clone(), primary);
            let spec = |name: BudgetName, per_minute: u64| BudgetSpec {
                scope: Scope::Tenant(domain.as_str().into()),
                name,
                kind: BudgetKind::Bucket {
                    per_minute,
                    burst: super::burst_of(per_minute),
                },
                key: format!("sim:{{{domain}}}:{}", name.as_str()).into(),
                refund_unused: true,
                shadow: false,
            };
            budgets.push((
                [spec(BudgetName::Rpm, rpm), spec(BudgetName::Tpm, tpm)],
                primary,
            ));
        }
        let books = (0..cfg.gateways)
            .map(|g| {
                Book::new(
                    quota_lease::settings(&cfg.lease, std::time::Duration::from_micros(TIMEOUT)),
                    LeaseOff::default(),
                    &format!("g{g}"),
                )
            })
            .collect();
        let mut fleet = Self {
            cfg,
            leased,
            clock,
            primaries,
            books,
            generation: vec![0; cfg.gateways],
            partitioned_until: vec![0; cfg.gateways],
            budgets,
            primary_of,
            requester: Arc::new(Requester::default()),
            events: BinaryHeap::new(),
            seq: 0,
            lose_grants: 0,
            stats: RunStats::default(),
        };
        fleet.stats.budgets = vec![BudgetCount::default(); cfg.tenants];
        fleet.schedule_faults();
        fleet
    }

    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse(Queued {
            at,
            seq: self.seq,
            event,
        }));
    }

    fn schedule_faults(&mut self) {
        let end = self.cfg.seconds * 1_000_000;
        let mut t = 0;
        while t < end {
            self.push(t, Event::Sample);
            t += 100_000;
        }
        if !self.leased {
            return;
        }
        let tick = quota_lease_tick(&self.cfg.lease);
        for gw in 0..self.cfg.gateways {
            // Ticks start spread over one period, as gateways start apart.
            self.push(
                tick * gw as u64 / self.cfg.gateways.max(1) as u64,
                Event::Tick { gw },
            );
        }
        let f = &self.cfg.faults;
        let spread = |n: usize, i: usize| end * (i as u64 + 1) / (n as u64 + 1);
        for i in 0..f.crashes {
            self.push(
                spread(f.crashes, i),
                Event::Crash {
                    gw: i % self.cfg.gateways,
                },
            );
        }
        for i in 0..f.partitions {
            self.push(
                spread(f.partitions, i),
                Event::Partition {
                    gw: (i + 1) % self.cfg.gateways,
                },
            );
        }
        for i in 0..f.lost_grants {
            self.push(spread(f.lost_grants, i), Event::LoseGrant);
        }
    }

    /// Runs to the end; `exact_admitted` (the exact run's outcome per
    /// request) lets the leased run count its false refusals.
    pub(super) fn run(mut self) -> RunStats {
        let cfg = self.cfg;
        let end = cfg.seconds * 1_000_000;
        let mut arrivals = SmallRng::seed_from_u64(cfg.seed);
        let zipf = Zipf::new(cfg.tenants as f64, cfg.zipf).expect("valid zipf");
        let gap = Exp::new(cfg.rate as f64 / cfg.burst.max(1.0) / 1e6).expect("positive rate");
        let burst = Geometric::new(1.0 / cfg.burst.max(1.0)).expect("valid burst");
        let mut next_arrival = 0.0f64;
        let mut req_no = 0u64;
        loop {
            let due_event = self.events.peek().map(|Reverse(q)| q.at);
            let arrival_at = next_arrival as u64;
            if arrival_at < end && due_event.is_none_or(|t| arrival_at <= t) {
                let tenant = (zipf.sample(&mut arrivals) as usize).clamp(1, cfg.tenants) - 1;
                let k = burst.sample(&mut arrivals) + 1;
                for _ in 0..k {
                    let gw = arrivals.random_range(0..cfg.gateways);
                    let estimate = arrivals.random_range(200..1_000u64);
                    let actual = estimate * arrivals.random_range(30..=100u64) / 100;
                    let duration = arrivals.random_range(100_000..1_500_000u64);
                    self.arrive(arrival_at, gw, tenant, req_no, estimate, actual, duration);
                    req_no += 1;
                }
                next_arrival += gap.sample(&mut arrivals);
                continue;
            }
            let Some(Reverse(q)) = self.events.pop() else {
                break;
            };
            if q.at >= end + 2_000_000 {
                break;
            }
            self.handle(q.at, q.event);
        }
        self.stats.requests = req_no;
        self.stats
    }

    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &mut self,
        now: u64,
        gw: usize,
        tenant: usize,
        req_no: u64,
        estimate: u64,
        actual: u64,
        duration: u64,
    ) {
        let ([rpm, tpm], primary) = &self.budgets[tenant];
        let req = ReserveRequest {
            share: None,
            id: format!("{gw}.{}.{req_no}", self.generation[gw]),
            costs: Costs::tokens(estimate),
            common: vec![rpm.clone(), tpm.clone()],
            candidates: vec![Vec::new()],
            slot_lease_micros: 5_000_000,
            // Longer than any simulated request (1.5 s) plus its calls; the
            // settled holds' tombstones live as long, so a gateway's 30 s
            // would keep tens of millions of them in the big fleet.
            hold_ttl_micros: HOLD_TTL,
            requester: self.requester.clone(),
        };
        if self.leased {
            match self.books[gw].reserve(&req, now) {
                Decision::Local(ReserveOutcome::Admitted(_)) => {
                    self.admitted(tenant, req_no, actual, true);
                    let gen = self.generation[gw];
                    self.push(
                        now + duration,
                        Event::SettleLocal {
                            gw,
                            gen,
                            id: req.id,
                            actual,
                        },
                    );
                    return;
                }
                Decision::Local(_) => {
                    self.refused(req_no, true);
                    return;
                }
                // The simulated books keep tenant and deployment budgets
                // together (`set_split` is never on): no split comes.
                Decision::Store | Decision::Split { .. } => {}
            }
        }
        if self.partitioned_until[gw] > now {
            // fail_closed: the store is unreachable from this gateway.
            self.refused(req_no, false);
            return;
        }
        let _ = primary;
        let gen = self.generation[gw];
        self.push(
            now + self.cfg.latency_micros,
            Event::StoreReserve {
                gw,
                gen,
                req,
                req_no,
                actual,
                duration,
            },
        );
    }

    fn admitted(&mut self, tenant: usize, req_no: u64, actual: u64, local: bool) {
        let b = &mut self.stats.budgets[tenant];
        b.requests += 1;
        b.tokens += actual;
        if local {
            self.stats.local += 1;
        }
        self.stats.admitted += 1;
        self.stats.admitted_set.set(req_no, true);
    }

    fn refused(&mut self, req_no: u64, local: bool) {
        self.stats.refused += 1;
        if local {
            self.stats.refused_locally += 1;
        }
        let _ = req_no;
    }

    fn handle(&mut self, now: u64, event: Event) {
        self.clock.set(BASE_UTC + now);
        match event {
            Event::SettleLocal {
                gw,
                gen,
                id,
                actual,
            } => {
                if self.generation[gw] == gen {
                    let s = settlement(actual);
                    self.books[gw].settle(&id, &s, now);
                }
            }
            Event::StoreReserve {
                gw,
                gen,
                req,
                req_no,
                actual,
                duration,
            } => {
                let tenant = self.tenant_of(&req);
                let primary = self.budgets[tenant].1;
                self.stats.store_calls += 1;
                match self.primaries[primary].reserve_sync(&req) {
                    ReserveOutcome::Admitted(_) => {
                        self.admitted(tenant, req_no, actual, false);
                        self.push(
                            now + duration,
                            Event::SettleStore {
                                primary,
                                id: req.id,
                                actual,
                            },
                        );
                    }
                    // As the gateway: a store refusal is decided again
                    // from its leases (without the wait for a call on the
                    // wire the gateway allows).
                    _ if self.leased && self.generation[gw] == gen => {
                        match self.books[gw].reserve_refused(&req, now) {
                            Refused::Admitted(ReserveOutcome::Admitted(_)) => {
                                self.admitted(tenant, req_no, actual, true);
                                self.push(
                                    now + duration,
                                    Event::SettleLocal {
                                        gw,
                                        gen,
                                        id: req.id,
                                        actual,
                                    },
                                );
                            }
                            _ => self.refused(req_no, false),
                        }
                    }
                    _ => self.refused(req_no, false),
                }
            }
            Event::SettleStore {
                primary,
                id,
                actual,
            } => {
                self.stats.store_calls += 1;
                self.primaries[primary].settle_sync(&id, &settlement(actual));
            }
            Event::Tick { gw } => {
                let calls = self.books[gw].due(now);
                let gen = self.generation[gw];
                for call in calls {
                    if self.partitioned_until[gw] > now {
                        self.push(
                            now + TIMEOUT,
                            Event::LeaseReply {
                                gw,
                                gen,
                                call,
                                replies: None,
                            },
                        );
                    } else {
                        self.push(
                            now + self.cfg.latency_micros,
                            Event::LeaseApply { gw, gen, call },
                        );
                    }
                }
                self.push(now + quota_lease_tick(&self.cfg.lease), Event::Tick { gw });
            }
            Event::LeaseApply { gw, gen, call } => {
                let primary = self.primary_of.get(&call.domain).copied().unwrap_or(0);
                self.stats.store_calls += 1;
                self.stats.lease_calls += 1;
                let replies = self.primaries[primary].lease_sync(&call.lines);
                if self.lose_grants > 0 {
                    self.lose_grant(primary, &call.lines, &replies);
                }
                self.push(
                    now + self.cfg.latency_micros,
                    Event::LeaseReply {
                        gw,
                        gen,
                        call,
                        replies: Some(replies),
                    },
                );
            }
            Event::LeaseReply {
                gw,
                gen,
                call,
                replies,
            } => {
                if self.generation[gw] == gen {
                    self.books[gw].apply(&call, replies.as_deref(), now);
                }
            }
            Event::Crash { gw } => {
                self.generation[gw] += 1;
                let lost: i64 = self.books[gw].outstanding().map(|(_, a)| a.max(0)).sum();
                self.stats.crash_lost_units += lost.max(0) as u64;
                let settings = quota_lease::settings(
                    &self.cfg.lease,
                    std::time::Duration::from_micros(TIMEOUT),
                );
                self.books[gw] = Book::new(
                    settings,
                    LeaseOff::default(),
                    &format!("g{gw}r{}", self.generation[gw]),
                );
                self.stats.crashes += 1;
            }
            Event::Partition { gw } => {
                self.partitioned_until[gw] = now + self.cfg.faults.partition_micros;
                self.stats.partitions += 1;
            }
            Event::LoseGrant => self.lose_grants += 1,
            Event::Sample => {
                if self.cfg.progress && now.is_multiple_of(10_000_000) && now > 0 {
                    eprintln!(
                        "{} run: {} simulated s, {} admitted",
                        if self.leased { "leased" } else { "exact" },
                        now / 1_000_000,
                        self.stats.admitted
                    );
                }
                let mut stranded = [0u64; 2];
                for book in &self.books {
                    for (spec, avail) in book.outstanding() {
                        let i = usize::from(spec.name == BudgetName::Tpm);
                        stranded[i] += avail.max(0) as u64;
                    }
                }
                self.stats.stranded_samples.push(stranded);
            }
        }
    }

    /// A failover that loses what the primary just granted: the grant's
    /// lease is given back in the store behind the gateway's back (and its
    /// record closed), so the gateway spends what nobody debited.
    fn lose_grant(&mut self, primary: usize, lines: &[LeaseLine], replies: &[LeaseReply]) {
        for (line, reply) in lines.iter().zip(replies) {
            let LeaseReply::Live(st) = reply else {
                continue;
            };
            if st.granted_now == 0 {
                continue;
            }
            let undo = LeaseLine {
                seq: line.seq + 1,
                epoch: st.epoch,
                want: 0,
                give_back: 0,
                spent: 0,
                end: true,
                ..line.clone()
            };
            self.primaries[primary].lease_sync(&[undo]);
            let tenant = self.tenant_of_key(&line.spec.key);
            let units = st.granted.saturating_sub(st.given_back);
            let b = &mut self.stats.budgets[tenant];
            if line.spec.name == BudgetName::Tpm {
                b.lost_tpm += units;
            } else {
                b.lost_rpm += units;
            }
            self.lose_grants -= 1;
            self.stats.lost_grants += 1;
            return;
        }
    }

    fn tenant_of(&self, req: &ReserveRequest) -> usize {
        self.tenant_of_key(&req.common[0].key)
    }

    fn tenant_of_key(&self, key: &str) -> usize {
        hash_tag(key)
            .and_then(|d| d.strip_prefix('t'))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

fn settlement(actual: u64) -> Settlement {
    Settlement {
        actual_tokens: actual,
        upstream_failed: false,
        actual: Actual::Tokens,
    }
}

fn quota_lease_tick(p: &budgetgate::config::store::LeasePolicy) -> u64 {
    (p.report_interval.as_micros() as u64 / 40).clamp(5_000, 50_000)
}
