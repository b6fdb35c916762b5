//! When the book calls the store, and what it does with the answers:
//! grants for budgets that became hot, top-ups below the low-water mark,
//! reports every interval, give-backs when demand falls, ends when a
//! budget cools, its policy changes or its window ends. One call per
//! budget domain carries every line due in it.

use std::sync::Arc;

use super::book::{Book, Entry, Lease};
use super::metrics;
use crate::budget::keys::hash_tag;
use crate::budget::quota_lease::{LeaseLine, LeaseReply};
use crate::budget::BudgetKind;

/// One store call: lines of one budget domain.
#[derive(Debug, Clone)]
pub struct Call {
    /// The domain's hash tag (all lines share it).
    pub domain: String,
    /// The lines, one per lease.
    pub lines: Vec<LeaseLine>,
    /// Monotonic µs the call was planned (and sent) at.
    pub sent_at: u64,
}

/// What applying one call's replies changed (for metrics and the simulation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// New leases granted.
    pub granted: u64,
    /// Top-ups that added units.
    pub topped_up: u64,
    /// Leases ended by this gateway.
    pub returned: u64,
    /// Leases the store fenced (older epoch).
    pub fenced: u64,
    /// Leases found expired.
    pub expired: u64,
}

impl Book {
    /// The calls due at `now`, lines grouped by budget domain. Each line's
    /// lease is marked on the wire until [`Book::apply`] sees its reply.
    pub fn due(&mut self, now: u64) -> Vec<Call> {
        self.sweep(now);
        let utc = self.utc(now);
        let settings = self.settings.clone();
        let mut lines: Vec<LeaseLine> = Vec::new();
        let mut expired = 0;
        let keys: Vec<Arc<str>> = self.active.iter().cloned().collect();
        for key in keys {
            let spacing = match self.entries.get(&*key) {
                Some(e) => self.spacing(e, now),
                None => {
                    self.active.remove(&key);
                    continue;
                }
            };
            let target = match self.entries.get_mut(&*key) {
                Some(e) => target(e, now, settings.report, settings.max_fraction_ppm),
                None => continue,
            };
            let grants = self
                .entries
                .get(&*key)
                .is_some_and(|e| e.lease.is_none() && e.leasable && (e.wanted || orphans(e)));
            let id = if grants {
                self.next_lease_id()
            } else {
                Arc::from("")
            };
            let Some(e) = self.entries.get_mut(&*key) else {
                continue;
            };
            let orphans = orphans(e);
            let Some(l) = e.lease.as_mut() else {
                // Demand that fell again before the grant went out wants
                // nothing. Slots in use by local reservations whose lease
                // was fenced or expired are leased again whatever the
                // demand: the new lease's members count them in the store
                // (the bound until then: DESIGN section 14).
                if e.leasable
                    && (e.wanted && e.demand.quick_requests_per_sec(now) >= settings.min_rate
                        || orphans)
                {
                    e.wanted = false;
                    let line = LeaseLine {
                        spec: e.spec.clone(),
                        lease: id.clone(),
                        seq: 1,
                        epoch: 0,
                        want: target,
                        give_back: 0,
                        spent: 0,
                        end: false,
                        ttl_micros: settings.ttl,
                        record_ttl_micros: settings.record_ttl,
                    };
                    e.lease = Some(Box::new(Lease {
                        id,
                        spec: e.spec.clone(),
                        seq: 0,
                        epoch: 0,
                        granted: 0,
                        given_back: 0,
                        spent: 0,
                        deadline: 0,
                        window: None,
                        free: 0,
                        full: false,
                        closing: false,
                        in_call: Some(line.clone()),
                        on_wire: true,
                        last_call: now,
                        granted_at: now,
                        recall: false,
                        spent_at_call: 0,
                    }));
                    lines.push(line);
                } else {
                    e.wanted = false;
                    self.active.remove(&key);
                }
                continue;
            };
            if l.on_wire {
                continue;
            }
            if let Some(line) = l.in_call.clone() {
                // A call that failed: the same line again (idempotent by
                // id and seq), unless the lease ran out meanwhile.
                if l.seq > 0 && now >= l.deadline || l.seq == 0 && now >= l.last_call + settings.ttl
                {
                    e.lease = None;
                    expired += 1;
                    continue;
                }
                if now >= l.last_call + spacing {
                    l.on_wire = true;
                    l.last_call = now;
                    lines.push(line);
                }
                continue;
            }
            if now >= l.deadline {
                // Not renewed in time (the store was unreachable): the
                // store counts it as spent; nothing more is spent here.
                e.lease = None;
                expired += 1;
                continue;
            }
            let mut d = e.demand;
            // Hysteresis: a lease ends below half of `min_rate`, and not
            // in the first second of its life.
            let cold = d.requests_per_sec(now).saturating_mul(2) < settings.min_rate
                && now >= l.granted_at.saturating_add(1_000_000);
            let window_over = match (l.spec.kind, l.window) {
                (BudgetKind::Quota { window, .. }, Some(w)) => window.id(utc) != w,
                _ => false,
            };
            let outgrown = !super::book::fits(&mut e.demand, &e.spec, e.in_flight, now, &settings);
            if l.spec.kind != e.spec.kind || window_over || cold || !e.leasable || outgrown {
                l.closing = true;
            }
            let since = now.saturating_sub(l.last_call);
            let slots = matches!(l.spec.kind, BudgetKind::Concurrency { .. });
            let spent = if slots { e.in_flight } else { l.spent };
            let mut line = LeaseLine {
                spec: l.spec.clone(),
                lease: l.id.clone(),
                seq: l.seq + 1,
                epoch: l.epoch,
                want: 0,
                give_back: 0,
                spent,
                end: false,
                ttl_micros: settings.ttl,
                record_ttl_micros: settings.record_ttl,
            };
            let avail = l.available(e.in_flight);
            let recent = l.spent.saturating_sub(l.spent_at_call) as i64;
            if l.closing {
                if e.in_flight == 0 {
                    line.end = true;
                } else if avail > 0 && !slots && since >= settings.report / 8 {
                    // Its reservations still settle into it; what nobody
                    // holds goes back now, not at the end.
                    line.give_back = avail as u64;
                } else if slots && avail < 0 && l.spec.kind == e.spec.kind && since >= spacing {
                    // More slots in use than it holds (a lease granted
                    // again for the requests of a fenced one, short of
                    // free slots then): the rest, so the store counts them.
                    line.want = avail.unsigned_abs();
                } else if since < settings.report / 2 {
                    continue;
                }
            } else if (avail < (target / 2) as i64 || e.urgent) && since >= spacing {
                let cap = cap(&l.spec, settings.max_fraction_ppm);
                let want = (target as i64 - avail).max(0) as u64;
                line.want = want.min(cap.saturating_sub(avail.max(0) as u64));
                e.urgent = false;
                if line.want == 0 && since < settings.report / 2 {
                    continue;
                }
            } else if l.recall && !slots && recent == 0 && avail > 0 && since >= settings.report / 8
            {
                // Another gateway is short (the store's recall) and this
                // one spent nothing since its last call: everything goes
                // back, at the shortest spacing, not a report interval
                // later. (A lease its gateway spends is left alone: at
                // saturation every lease runs short, and trimming the
                // busy ones would only move their units to and fro.)
                // Not spent here from now on (the reply's count replaces
                // this one): a give back in flight never turns into debt.
                line.give_back = avail as u64;
                l.given_back += line.give_back;
                l.recall = false;
            } else if avail > 2 * target as i64 + 1 && since >= spacing && !slots {
                line.give_back = avail as u64 - target;
            } else if since < settings.report / 2 {
                // Renewed twice per interval: a lease lives `ttl`, so a
                // lost report or two never lets it lapse.
                continue;
            }
            l.on_wire = true;
            l.last_call = now;
            l.spent_at_call = l.spent;
            l.in_call = Some(line.clone());
            lines.push(line);
        }
        if expired > 0 {
            metrics::expired(expired);
        }
        group(lines, now)
    }

    /// Applies the replies of `call` (`None`: the call failed; its lines
    /// are resent as they are).
    pub fn apply(&mut self, call: &Call, replies: Option<&[LeaseReply]>, now: u64) -> Applied {
        let mut applied = Applied::default();
        let margin = self.settings.margin;
        for (i, line) in call.lines.iter().enumerate() {
            let Some(e) = self.entries.get_mut(&*line.spec.key) else {
                continue;
            };
            let Some(l) = e.lease.as_mut().filter(|l| l.id == line.lease) else {
                continue;
            };
            l.on_wire = false;
            let Some(reply) = replies.and_then(|r| r.get(i)) else {
                continue;
            };
            l.in_call = None;
            match reply {
                LeaseReply::Live(st) => {
                    if l.seq == 0 {
                        applied.granted += 1;
                        l.granted_at = now;
                    } else if st.granted_now > 0 {
                        applied.topped_up += 1;
                    }
                    l.seq = line.seq;
                    l.epoch = st.epoch;
                    l.granted = st.granted;
                    l.given_back = st.given_back;
                    l.window = st.window;
                    l.free = st.free;
                    if line.want > 0 {
                        l.full = st.granted_now >= line.want;
                    }
                    l.recall = st.recall;
                    let life = st.expires_at_micros.saturating_sub(st.now_micros);
                    l.deadline = call.sent_at.saturating_add(life).saturating_sub(margin);
                    // The store's clock read somewhere between send and
                    // receipt: the midpoint is the best guess of the offset.
                    let mid = call.sent_at + now.saturating_sub(call.sent_at) / 2;
                    self.utc_offset = st.now_micros as i64 - mid as i64;
                }
                LeaseReply::Ended { .. } => {
                    e.lease = None;
                    applied.returned += 1;
                }
                LeaseReply::Fenced { .. } => {
                    e.lease = None;
                    applied.fenced += 1;
                }
                LeaseReply::Unknown { .. } => {
                    e.lease = None;
                    applied.expired += 1;
                }
            }
        }
        applied
    }

    /// Ends every lease now (shutdown): lines for all leases not on the
    /// wire, whatever their reservations (settled by then).
    pub fn end_all(&mut self, now: u64) -> Vec<Call> {
        let mut lines = Vec::new();
        for e in self.entries.values_mut() {
            let Some(l) = e.lease.as_mut() else { continue };
            if l.seq == 0 {
                continue;
            }
            l.closing = true;
            let slots = matches!(l.spec.kind, BudgetKind::Concurrency { .. });
            let line = LeaseLine {
                spec: l.spec.clone(),
                lease: l.id.clone(),
                seq: l.in_call.as_ref().map_or(l.seq + 1, |c| c.seq + 1),
                epoch: l.epoch,
                want: 0,
                give_back: 0,
                spent: if slots { e.in_flight } else { l.spent },
                end: true,
                ttl_micros: self.settings.ttl,
                record_ttl_micros: self.settings.record_ttl,
            };
            l.on_wire = true;
            l.in_call = Some(line.clone());
            lines.push(line);
        }
        group(lines, now)
    }

    /// Every live lease's budget and what it can still give (the units
    /// stranded here if nobody asks).
    pub fn outstanding(&self) -> impl Iterator<Item = (&crate::budget::BudgetSpec, i64)> {
        self.entries.values().filter_map(|e| {
            let l = e.lease.as_ref().filter(|l| l.seq > 0)?;
            Some((&l.spec, l.available(e.in_flight)))
        })
    }

    /// Leases held now (every leased budget is `active`: counted without
    /// visiting the entries of budgets that never leased).
    pub fn leases(&self) -> usize {
        self.active
            .iter()
            .filter_map(|k| self.entries.get(k))
            .filter(|e| e.lease.as_ref().is_some_and(|l| l.seq > 0))
            .count()
    }

    /// Units out on this gateway's leases for `key` (admin view), if leased.
    pub fn leased_units(&self, key: &str) -> Option<i64> {
        let e = self.entries.get(key)?;
        let l = e.lease.as_ref().filter(|l| l.seq > 0)?;
        Some(l.available(e.in_flight))
    }
}

/// True when local reservations hold slots of a concurrency budget that
/// has no lease any more (fenced, expired): slots the store does not count.
fn orphans(e: &Entry) -> bool {
    e.lease.is_none() && e.in_flight > 0 && matches!(e.spec.kind, BudgetKind::Concurrency { .. })
}

/// Units one lease aims to hold: about one report interval of this
/// gateway's demand, at least two requests' worth, at most the cap.
fn target(e: &mut Entry, now: u64, report: u64, max_fraction_ppm: u64) -> u64 {
    let cap = cap(&e.spec, max_fraction_ppm);
    if matches!(e.spec.kind, BudgetKind::Concurrency { .. }) {
        return (e.in_flight + e.in_flight / 2 + 2).min(cap);
    }
    let units = e.demand.units_per_sec(now);
    let requests = e.demand.requests_per_sec(now).max(1);
    // Two intervals: a lease spaced by up to half an interval between
    // top-ups never drains before the next one at a steady rate.
    let per_period = (u128::from(units) * u128::from(report) * 2 / 1_000_000) as u64;
    per_period.max(2 * units.div_ceil(requests)).min(cap)
}

/// The most one lease may hold: `max_fraction` of the budget's capacity.
fn cap(spec: &crate::budget::BudgetSpec, max_fraction_ppm: u64) -> u64 {
    let c = (u128::from(spec.capacity()) * u128::from(max_fraction_ppm) / 1_000_000) as u64;
    c.max(1)
}

fn group(lines: Vec<LeaseLine>, now: u64) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    for line in lines {
        let domain = hash_tag(&line.spec.key).unwrap_or("").to_string();
        match calls.iter_mut().find(|c| c.domain == domain) {
            Some(c) => c.lines.push(line),
            None => calls.push(Call {
                domain,
                lines: vec![line],
                sent_at: now,
            }),
        }
    }
    calls
}
