//! The lease book: what this gateway holds of each hot budget and the
//! reservations it decided from it. Synchronous and clock-free (every call
//! takes the monotonic time), so the fleet simulation drives the very code
//! the gateway runs.
//!
//! A lease is a count already debited from the shared budget: spending it
//! needs no bucket or quota arithmetic (that happened in the store, at
//! grant), only `granted − given back − spent ≥ cost` for every budget of a
//! reservation, checked for all before any is debited (all-or-nothing).
//! Extensions and settlement of what it decided: `local_hold`.

use std::sync::Arc;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::demand::Demand;
use crate::budget::quota_lease::LeaseLine;
use crate::budget::{
    Admission, BudgetKind, BudgetSpec, BudgetState, Denial, ReserveOutcome, ReserveRequest, Scope,
};

/// Which scopes never lease (`lease = "off"`), by name.
#[derive(Debug, Clone, Default)]
pub struct LeaseOff {
    /// Tenants whose own budgets (tenant, keys, models, end users) stay exact.
    pub tenants: Vec<Arc<str>>,
    /// `(tenant, key id)` pairs whose key budgets stay exact.
    pub keys: Vec<(Arc<str>, Arc<str>)>,
    /// Deployments whose upstream budgets stay exact.
    pub deployments: Vec<Arc<str>>,
}

impl LeaseOff {
    /// The `lease = "off"` switches of `[store.lease]`.
    pub fn of(p: &crate::config::store::LeasePolicy) -> Self {
        Self {
            tenants: p.off_tenants.iter().map(|t| t.as_str().into()).collect(),
            keys: p
                .off_keys
                .iter()
                .map(|(t, k)| (t.as_str().into(), k.as_str().into()))
                .collect(),
            deployments: p
                .off_deployments
                .iter()
                .map(|d| d.as_str().into())
                .collect(),
        }
    }

    /// True when budgets of `scope` may be leased.
    pub fn allows(&self, scope: &Scope) -> bool {
        let tenant_off = |t: &Arc<str>| self.tenants.iter().any(|x| x == t);
        match scope {
            Scope::Tenant(t)
            | Scope::TenantModel(t, _)
            | Scope::EndUser(t, _)
            | Scope::Run(t, _) => !tenant_off(t),
            Scope::Key(t, k) => {
                !tenant_off(t) && !self.keys.iter().any(|(xt, xk)| xt == t && xk == k)
            }
            Scope::Upstream(u) => !self.deployments.iter().any(|x| x == u),
        }
    }
}

/// Sizing and timing, in µs and units (from `LeasePolicy`).
#[derive(Debug, Clone)]
pub struct BookSettings {
    /// Requests per second from which a budget is leased.
    pub min_rate: u64,
    /// Lease lifetime without a report, µs.
    pub ttl: u64,
    /// Report interval, µs.
    pub report: u64,
    /// Largest share of a budget's capacity per lease, in millionths.
    pub max_fraction_ppm: u64,
    /// Clock-safety margin before expiry, µs.
    pub margin: u64,
    /// How long the store keeps a lease record, µs.
    pub record_ttl: u64,
    /// Gateways of the fleet (the quota rule of `fits`).
    pub fleet_size: u64,
}

/// One budget this gateway has seen.
pub(super) struct Entry {
    /// The budget as the latest reservation named it (its policy).
    pub(super) spec: BudgetSpec,
    pub(super) leasable: bool,
    pub(super) demand: Demand,
    /// What was decided from the lease, per second (the spacing of its calls).
    pub(super) admitted: Demand,
    /// Boxed: most entries never lease (an end user's budgets), and an
    /// inline lease would more than double every entry.
    pub(super) lease: Option<Box<Lease>>,
    /// Units held by local reservations of this budget (slots in use, for concurrency).
    pub(super) in_flight: u64,
    /// A reservation found the lease short: top up as soon as spacing allows.
    pub(super) urgent: bool,
    /// Demand passed `min_rate`: grant a lease at the next plan.
    pub(super) wanted: bool,
}

/// A live lease of one budget.
pub(super) struct Lease {
    pub(super) id: Arc<str>,
    /// The budget's policy when it was granted.
    pub(super) spec: BudgetSpec,
    /// The last seq the store acknowledged (0 before the grant's reply).
    pub(super) seq: u64,
    pub(super) epoch: u64,
    pub(super) granted: u64,
    pub(super) given_back: u64,
    /// Net units spent: reservations, extensions and debt, less refunds
    /// (unused for concurrency, whose spend is `Entry::in_flight`).
    pub(super) spent: u64,
    /// Monotonic µs from which the lease is not spent.
    pub(super) deadline: u64,
    pub(super) window: Option<u64>,
    /// The store's free units after the last reply.
    pub(super) free: i64,
    /// The last line that asked for units (grant or top-up) was granted
    /// all it asked: the store was not saturated then.
    pub(super) full: bool,
    /// No new spending; ended once its reservations have settled.
    pub(super) closing: bool,
    /// The line on the wire, resent as it is after a failed call.
    pub(super) in_call: Option<LeaseLine>,
    /// A call for this lease is on the wire.
    pub(super) on_wire: bool,
    /// Monotonic µs of the last call.
    pub(super) last_call: u64,
    /// Monotonic µs the grant's reply came.
    pub(super) granted_at: u64,
    /// The store's last reply said the budget's recall is on: another
    /// gateway is short while this lease holds units.
    pub(super) recall: bool,
    /// `spent` when the last line was sent: a lease spent since is in
    /// use, and a recall leaves it alone.
    pub(super) spent_at_call: u64,
}

impl Lease {
    /// Units the lease can still give (negative after debt).
    pub(super) fn available(&self, in_flight: u64) -> i64 {
        let held = self.granted.saturating_sub(self.given_back) as i64;
        match self.spec.kind {
            BudgetKind::Concurrency { .. } => held - in_flight as i64,
            _ => held - self.spent as i64,
        }
    }

    /// True when the lease may still pay the extensions of the holds it
    /// paid for: unexpired and in its window, closing or under another
    /// policy than the budget's now (its units are debited in the store).
    pub(super) fn pays(&self, now: u64, utc: u64) -> bool {
        self.seq > 0
            && now < self.deadline
            && match (self.spec.kind, self.window) {
                (BudgetKind::Quota { window, .. }, Some(w)) => window.id(utc) == w,
                _ => true,
            }
    }

    /// True when a reservation under `spec` may spend this lease at `now`.
    pub(super) fn spendable(&self, spec: &BudgetSpec, now: u64, utc: u64) -> bool {
        !self.closing
            && self.seq > 0
            && now < self.deadline
            && self.spec.kind == spec.kind
            && match (self.spec.kind, self.window) {
                (BudgetKind::Quota { window, .. }, Some(w)) => window.id(utc) == w,
                _ => true,
            }
    }
}

/// A reservation decided from leases.
pub(super) struct LocalHold {
    pub(super) lines: Vec<LocalLine>,
    /// Tokens reserved: at admission, extensions, overflow (`local_hold`).
    pub(super) reserved_tokens: u64,
    /// The reservation's hold lifetime, µs: its overflow's.
    pub(super) hold_ttl: u64,
    /// Store reservations of extensions the leases could not pay.
    pub(super) overflow: Option<Box<super::local_hold::Overflow>>,
    /// A split reservation's ([`Decision::Split`]): its first `n` specs
    /// are held by the store under the same id.
    pub(super) store_specs: Option<usize>,
}

pub(super) struct LocalLine {
    pub(super) key: Arc<str>,
    /// The lease debited: a refund goes back only to it.
    pub(super) lease: Arc<str>,
    /// Position among the reservation's specs (what actuals are indexed by).
    pub(super) pos: usize,
    pub(super) held: u64,
    pub(super) refund_unused: bool,
    pub(super) counts_requests: bool,
    pub(super) slot: bool,
    pub(super) window: Option<u64>,
}

/// How often [`Book::sweep`] forgets idle budgets, µs of the monotonic
/// clock.
pub const SWEEP_EVERY: u64 = 10_000_000;

/// Whole seconds without a request after which a budget's demand reads
/// zero ([`Demand`] counts the current and the previous second): its entry
/// then says nothing a new one would not.
const IDLE_SECS: u64 = 2;

/// The book: entries by budget key and local holds by reservation id.
pub struct Book {
    pub(super) settings: BookSettings,
    pub(super) off: LeaseOff,
    pub(super) entries: HashMap<Arc<str>, Entry>,
    pub(super) holds: HashMap<String, LocalHold>,
    /// UTC µs minus monotonic µs, learned from the store's replies.
    pub(super) utc_offset: i64,
    /// Keys with a lease or wanting one: what planning looks at.
    pub(super) active: HashSet<Arc<str>>,
    /// Lease ids are `<prefix>.<n>`: the prefix is unique per gateway process.
    id_prefix: Arc<str>,
    next_id: u64,
    /// A lease is wanted or short: the keeper should plan now.
    pub nudge: bool,
    /// Monotonic µs of the last [`Book::sweep`].
    swept_at: u64,
    /// A reservation whose deployment is leased and whose common budgets
    /// are not is split ([`Decision::Split`]): set when the store keeps
    /// them in two domains (the `tenant` layout), where the split saves
    /// the deployment domain's call.
    split: bool,
}

/// What [`Book::reserve_refused`] decided of a reservation the store refused.
pub enum Refused {
    /// Admitted from this gateway's leases.
    Admitted(ReserveOutcome),
    /// A lease it needs is short (its top-up is on the wire or due within
    /// its spacing, at most half a report interval) or its grant is on
    /// the wire: ask again once a lease call's replies are applied.
    Pending,
    /// The store's refusal stands.
    Stands,
}

/// What [`Book::reserve`] decided.
pub enum Decision {
    /// Decided here, without a store call.
    Local(ReserveOutcome),
    /// The store decides (some budget is not leased, or cannot be decided here).
    Store,
    /// Split across the store and the leases ([`Book::set_split`]): the
    /// chosen deployment's budgets were admitted here from its leases (a
    /// local hold under the reservation's id, its lines at their positions
    /// in the whole request); the store decides the rest, this request of
    /// the common budgets alone. When the store does not admit it, the
    /// caller voids the local hold ([`Book::settle`] with a void).
    Split {
        /// The deployment's admission from its leases.
        local: Admission,
        /// What the store decides.
        store: ReserveRequest,
    },
}

impl Book {
    /// An empty book.
    /// `id_prefix` must be unique per gateway process (and per start of it).
    pub fn new(settings: BookSettings, off: LeaseOff, id_prefix: &str) -> Self {
        Self {
            settings,
            off,
            entries: HashMap::new(),
            holds: HashMap::new(),
            utc_offset: 0,
            active: HashSet::new(),
            id_prefix: id_prefix.into(),
            next_id: 0,
            nudge: false,
            swept_at: 0,
            split: false,
        }
    }

    /// Splits reservations whose deployment alone is leased
    /// ([`Decision::Split`]).
    pub fn set_split(&mut self, on: bool) {
        self.split = on;
    }

    /// Budgets the book keeps an entry for.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Forgets the budgets nobody needs (else an entry per end user
    /// ever seen is never freed): no lease, none wanted, nothing held by a
    /// local reservation, no request for [`IDLE_SECS`]. At most once per
    /// [`SWEEP_EVERY`], from the keeper's planning (off the request path);
    /// a budget asked again starts a new entry, as a new budget would.
    /// Returns true when it swept.
    pub fn sweep(&mut self, now: u64) -> bool {
        if now < self.swept_at.saturating_add(SWEEP_EVERY) {
            return false;
        }
        self.swept_at = now;
        // Keys a hold names with nothing in flight (a line of 0 units)
        // keep their entry too: its settlement looks the lease up there.
        let named: HashSet<&str> = self
            .holds
            .values()
            .flat_map(|h| h.lines.iter().map(|l| &*l.key))
            .collect();
        self.entries.retain(|key, e| {
            e.lease.is_some()
                || e.wanted
                || e.in_flight > 0
                || e.demand.idle_slots(now) < IDLE_SECS
                || named.contains(&**key)
        });
        let entries = &self.entries;
        self.active.retain(|key| entries.contains_key(key));
        // A burst of end users must not keep its table: give the memory
        // back once most of it is free.
        if self.entries.capacity() > 4 * self.entries.len() + 64 {
            self.entries.shrink_to_fit();
        }
        if self.active.capacity() > 4 * self.active.len() + 64 {
            self.active.shrink_to_fit();
        }
        true
    }

    pub(super) fn next_lease_id(&mut self) -> Arc<str> {
        self.next_id += 1;
        format!("{}.{}", self.id_prefix, self.next_id).into()
    }

    /// New settings and switches (a reload): budgets switched off stop
    /// leasing (their leases end at the next plan).
    pub fn set_policy(&mut self, settings: BookSettings, off: LeaseOff) {
        for e in self.entries.values_mut() {
            e.leasable = off.allows(&e.spec.scope);
        }
        self.settings = settings;
        self.off = off;
    }

    /// Takes back the demand `r` counted: the store failed to decide it.
    pub fn uncount(&mut self, r: &ReserveRequest, now: u64) {
        let Some(cand) = r.candidates.first() else {
            return;
        };
        for (pos, spec) in r.common.iter().chain(cand.iter()).enumerate() {
            if let Some(e) = self.entries.get_mut(&*spec.key) {
                e.demand.uncount(r.costs.of(0, pos, spec), now);
            }
        }
    }

    /// UTC µs at monotonic `now`, as the store's clock reads it.
    pub fn utc(&self, now: u64) -> u64 {
        (now as i64).saturating_add(self.utc_offset).max(0) as u64
    }

    /// True when `id` was decided here and is not settled.
    pub fn holds(&self, id: &str) -> bool {
        !self.holds.is_empty() && self.holds.contains_key(id)
    }

    /// Counts the request's demand on each of its budgets and decides it
    /// here when every budget of the first candidate is leased.
    pub fn reserve(&mut self, r: &ReserveRequest, now: u64) -> Decision {
        // A run's record is set or compared by the store alone: no lease
        // can decide whether the run started with these limits.
        if r.requester.run.is_some() {
            return Decision::Store;
        }
        let utc = self.utc(now);
        let Some(cand) = r.candidates.first() else {
            return Decision::Store;
        };
        let mut covered = true;
        let mut leased = true;
        let mut roomy = false;
        // A deployment's lease is short: a share claim then goes to the
        // store, which weighs it against the fleet's (`budget::share`).
        let mut upstream_short = false;
        // The budget that falls shortest (for the refusal).
        let mut short: Option<(usize, i64)> = None;
        // Every budget of the candidate is leased with room for the request.
        let mut deployment_covered = true;
        let n_common = r.common.len();
        let min_rate = self.settings.min_rate;
        for (pos, spec) in r.common.iter().chain(cand.iter()).enumerate() {
            let cost = r.costs.of(0, pos, spec);
            let e = entry(&mut self.entries, &self.off, spec);
            e.demand.count(cost, now);
            if e.lease.is_none()
                && e.leasable
                && !e.wanted
                && e.demand.quick_requests_per_sec(now) >= min_rate
                && fits(&mut e.demand, spec, e.in_flight, now, &self.settings)
            {
                e.wanted = true;
                self.active.insert(spec.key.clone());
                self.nudge = true;
            }
            if spec.shadow {
                leased = false;
                deployment_covered &= pos < n_common;
                continue;
            }
            match &e.lease {
                Some(l) if l.spendable(spec, now, utc) => {
                    let avail = l.available(e.in_flight);
                    let need = if matches!(spec.kind, BudgetKind::Concurrency { .. }) {
                        1
                    } else {
                        cost as i64
                    };
                    if avail < need {
                        covered = false;
                        deployment_covered &= pos < n_common;
                        upstream_short |= spec.scope.is_upstream();
                        e.urgent = true;
                        self.nudge = true;
                        // The store had room for it at the last reply:
                        // the store decides, exactly, against what is not
                        // leased out; a lease drained between two top-ups
                        // must not refuse what the budget can give. Only a
                        // store short of this request at its last reply
                        // (saturated) lets the lease refuse without a call.
                        // A saturated store still has free units (a grant
                        // takes at most half of them), so `free` alone sends
                        // nearly every short request there; a top-up granted
                        // short is the sign of saturation.
                        if l.full && l.free >= need {
                            roomy = true;
                        }
                        if short.is_none_or(|(_, a)| avail - need < a) {
                            short = Some((pos, avail - need));
                        }
                    }
                }
                _ => {
                    leased = false;
                    covered = false;
                    deployment_covered &= pos < n_common;
                }
            }
        }
        let share = upstream_short && r.share.is_some();
        if !leased || (!covered && (roomy || share || r.candidates.len() > 1)) {
            if self.split && deployment_covered && r.candidates.len() == 1 && !cand.is_empty() {
                return self.split_off(r, cand, now, utc);
            }
            return Decision::Store;
        }
        if !covered {
            // The shortest lease refuses (the store decides if none was found).
            let refusal = short.and_then(|(pos, _)| {
                let spec = r.common.iter().chain(cand.iter()).nth(pos)?;
                self.denial(spec, r.costs.of(0, pos, spec), now)
            });
            return match refusal {
                Some(d) => Decision::Local(ReserveOutcome::Denied(d)),
                None => Decision::Store,
            };
        }
        Decision::Local(self.admit(r, cand, 0, now, utc))
    }

    /// [`Decision::Split`] of `r`, whose candidate `cand` its leases cover:
    /// the candidate's budgets admitted here, the common ones left to the
    /// store. The local hold comes first: it costs no round trip, and a
    /// store refusal gives its units straight back to this gateway's
    /// leases (a refused request holds them for one store call).
    fn split_off(
        &mut self,
        r: &ReserveRequest,
        cand: &[BudgetSpec],
        now: u64,
        utc: u64,
    ) -> Decision {
        let n = r.common.len();
        let ReserveOutcome::Admitted(local) = self.admit(r, cand, n, now, utc) else {
            return Decision::Store;
        };
        let costs = if r.costs.per_candidate.is_empty() {
            crate::budget::Costs::tokens(r.costs.tokens)
        } else {
            crate::budget::Costs {
                tokens: r.costs.tokens,
                per_candidate: vec![r
                    .common
                    .iter()
                    .enumerate()
                    .map(|(i, spec)| r.costs.of(0, i, spec))
                    .collect()],
            }
        };
        Decision::Split {
            local,
            store: ReserveRequest {
                id: r.id.clone(),
                costs,
                common: r.common.clone(),
                candidates: vec![Vec::new()],
                slot_lease_micros: r.slot_lease_micros,
                hold_ttl_micros: r.hold_ttl_micros,
                requester: r.requester.clone(),
                // A share claim weighs a contended deployment's budgets:
                // the leases decided those.
                share: None,
            },
        }
    }

    /// The budgets the local hold of a split reservation `id` leaves to
    /// the store: the first `n` of the request's specs, or `None` when `id`
    /// is not held here or holds every budget.
    pub fn split_at(&self, id: &str) -> Option<usize> {
        self.holds.get(id).and_then(|h| h.store_specs)
    }

    /// `r` was refused by the store (or its deny cache) after
    /// [`Self::reserve`] sent it there: decides it from this gateway's
    /// leases when they now cover every budget of its first candidate (a
    /// grant or top-up may have landed while it waited; its units are
    /// debited in the store already, so the store's refusal did not count
    /// them). Its demand was counted by `reserve`; nothing is refused here.
    pub fn reserve_refused(&mut self, r: &ReserveRequest, now: u64) -> Refused {
        if r.requester.run.is_some() {
            return Refused::Stands;
        }
        let utc = self.utc(now);
        let Some(cand) = r.candidates.first() else {
            return Refused::Stands;
        };
        let mut pending = false;
        for (pos, spec) in r.common.iter().chain(cand.iter()).enumerate() {
            if spec.shadow {
                return Refused::Stands;
            }
            let Some(e) = self.entries.get(&*spec.key) else {
                return Refused::Stands;
            };
            match &e.lease {
                Some(l) if l.spendable(spec, now, utc) => {
                    let need = if matches!(spec.kind, BudgetKind::Concurrency { .. }) {
                        1
                    } else {
                        r.costs.of(0, pos, spec) as i64
                    };
                    if l.available(e.in_flight) < need {
                        // Its top-up (on the wire, or sent at its spacing:
                        // within half a report interval) may cover it.
                        pending = true;
                        if let Some(e) = self.entries.get_mut(&*spec.key) {
                            e.urgent = true;
                        }
                        self.nudge = true;
                    }
                }
                // A grant on the wire.
                Some(l) if l.seq == 0 && l.on_wire => pending = true,
                _ => return Refused::Stands,
            }
        }
        if pending {
            Refused::Pending
        } else {
            Refused::Admitted(self.admit(r, cand, 0, now, utc))
        }
    }

    /// Admits the specs of `r` (common, then `cand`) from position `from`
    /// on from their leases (checked by the caller under the same lock);
    /// the ones before it are the store's (`from` > 0: a split).
    fn admit(
        &mut self,
        r: &ReserveRequest,
        cand: &[BudgetSpec],
        from: usize,
        now: u64,
        utc: u64,
    ) -> ReserveOutcome {
        let mut lines = Vec::with_capacity(r.common.len() + cand.len() - from.min(r.common.len()));
        let mut budgets = Vec::with_capacity(lines.capacity());
        for (pos, spec) in r.common.iter().chain(cand.iter()).enumerate().skip(from) {
            let cost = r.costs.of(0, pos, spec);
            // Made and checked by `reserve` under the same lock.
            let Some(e) = self.entries.get_mut(&*spec.key) else {
                continue;
            };
            let Some(l) = e.lease.as_mut() else {
                continue;
            };
            let slot = matches!(spec.kind, BudgetKind::Concurrency { .. });
            e.admitted.count(cost, now);
            let held = if slot {
                e.in_flight += 1;
                0
            } else {
                l.spent = l.spent.saturating_add(cost);
                e.in_flight = e.in_flight.saturating_add(cost);
                budgets.push(state(spec, l, e.in_flight, utc));
                cost
            };
            lines.push(LocalLine {
                key: spec.key.clone(),
                lease: l.id.clone(),
                pos,
                held,
                refund_unused: spec.refund_unused,
                counts_requests: spec.name.counts_requests(),
                slot,
                window: l.window,
            });
        }
        self.holds.insert(
            r.id.clone(),
            LocalHold {
                lines,
                reserved_tokens: r.costs.tokens,
                hold_ttl: r.hold_ttl_micros,
                overflow: None,
                store_specs: (from > 0).then_some(from),
            },
        );
        ReserveOutcome::Admitted(Admission {
            now_micros: utc,
            candidate: 0,
            budgets,
            replayed: false,
            would_deny: Vec::new(),
        })
    }

    /// A refusal of `spec` for `cost`: the lease is short and a top-up is
    /// due. The retry hint is what the budget's refill (or window) needs
    /// for the shortfall, at least the time to the next top-up.
    pub(super) fn denial(&self, spec: &BudgetSpec, cost: u64, now: u64) -> Option<Denial> {
        let utc = self.utc(now);
        let e = self.entries.get(&*spec.key)?;
        let l = e.lease.as_ref()?;
        let avail = l.available(e.in_flight);
        let short = (cost as i64 - avail).max(1) as u64;
        let next = l
            .last_call
            .saturating_add(self.spacing(e, now))
            .saturating_sub(now);
        let retry = match spec.kind {
            BudgetKind::Bucket { per_minute, .. } if per_minute > 0 => {
                let refill = (u128::from(short) * 60_000_000).div_ceil(u128::from(per_minute));
                (refill.min(u128::from(u64::MAX)) as u64).max(next)
            }
            BudgetKind::Quota { window, .. } if l.free < short as i64 => {
                window.end(utc).saturating_sub(utc)
            }
            _ => next,
        };
        Some(Denial {
            held_for_share: false,
            scope: spec.scope.clone(),
            name: spec.name,
            limit: spec.limit(),
            requested: cost,
            available: avail,
            retry_after_micros: retry,
            now_micros: utc,
            state: state(spec, l, e.in_flight, utc),
        })
    }

    /// Time between two calls for one lease: about 40 local admissions'
    /// worth at its rate, within an eighth and a half of the report
    /// interval (so a saturated budget costs the store at most one call per
    /// 40 admissions, and an idle one two reports per interval).
    pub(super) fn spacing(&self, e: &Entry, now: u64) -> u64 {
        let mut d = e.admitted;
        let rps = d.requests_per_sec(now).max(1);
        (40_000_000 / rps).clamp(self.settings.report / 8, self.settings.report / 2)
    }
}

/// A leased budget's state for the rate-limit headers: what the lease has
/// left plus what the store had at the last reply.
fn state(spec: &BudgetSpec, l: &Lease, in_flight: u64, utc: u64) -> BudgetState {
    let remaining = l.available(in_flight).saturating_add(l.free.max(0));
    let (reset_micros, window) = match spec.kind {
        BudgetKind::Bucket { per_minute, burst } if per_minute > 0 => {
            let missing = (burst as i64 - remaining).max(0) as u128;
            (
                (missing * 60_000_000).div_ceil(u128::from(per_minute)) as u64,
                None,
            )
        }
        BudgetKind::Quota { window, .. } => (window.end(utc).saturating_sub(utc), Some(window)),
        _ => (0, None),
    };
    BudgetState {
        scope: spec.scope.clone(),
        name: spec.name,
        limit: spec.limit(),
        remaining,
        reset_micros,
        window,
    }
}

/// A quota whose window starts at its first use is never leased: which
/// window is in force is known only to the store (`Window::current`), so a
/// gateway could not tell when a lease's window ended.
fn from_first_use(spec: &BudgetSpec) -> bool {
    matches!(spec.kind, BudgetKind::Quota { window, .. } if window.from_first_use().is_some())
}

fn entry<'a>(
    entries: &'a mut HashMap<Arc<str>, Entry>,
    off: &LeaseOff,
    spec: &BudgetSpec,
) -> &'a mut Entry {
    let e = entries.entry(spec.key.clone()).or_insert_with(|| Entry {
        spec: spec.clone(),
        leasable: off.allows(&spec.scope) && !from_first_use(spec),
        demand: Demand::default(),
        admitted: Demand::default(),
        lease: None,
        in_flight: 0,
        urgent: false,
        wanted: false,
    });
    if e.spec.kind != spec.kind {
        e.spec = spec.clone();
        e.leasable = off.allows(&spec.scope) && !from_first_use(spec);
    }
    e
}

/// Seconds of this gateway's demand (times the fleet size) a calendar
/// quota must hold to be leased.
const QUOTA_LASTS_SECS: u128 = 60;

/// True when a budget suits a lease at this gateway's demand. A bucket:
/// one report interval of the demand fits in one lease (`max_fraction` of
/// its capacity). A calendar quota: what it holds would last at least
/// [`QUOTA_LASTS_SECS`] at the fleet's demand (this gateway's times
/// `fleet_size`): a quota does not refill, so near its end it must be
/// exact, and a quota spent in seconds is near its end from the start.
/// Slots: this gateway's concurrency is at most a quarter of them. A
/// budget small beside its demand stays exact: a handful of requests
/// decides it anyway, and leases would strand most of it.
pub(super) fn fits(
    demand: &mut Demand,
    spec: &BudgetSpec,
    in_flight: u64,
    now: u64,
    s: &BookSettings,
) -> bool {
    let units = u128::from(demand.quick_units_per_sec(now));
    let capacity = u128::from(spec.capacity());
    match spec.kind {
        BudgetKind::Concurrency { max } => in_flight.saturating_mul(4) <= max,
        BudgetKind::Quota { .. } => {
            units * QUOTA_LASTS_SECS * u128::from(s.fleet_size.max(1)) <= capacity
        }
        BudgetKind::Bucket { .. } => {
            units * u128::from(s.report) / 1_000_000
                <= capacity * u128::from(s.max_fraction_ppm) / 1_000_000
        }
    }
}
