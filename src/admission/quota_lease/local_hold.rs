//! The reservations the book decided: their extensions from the leases
//! (the stores' own grant rule, [`Step::grant`] and [`Step::debit`]) and
//! their settlement into the lease they debited (the stores' refund rules:
//! unused amounts of refundable budgets, request counts only on a void,
//! quotas only within the lease's window).
//!
//! A stream outlives the lease state it started under: demand
//! falls and its leases close, a reload changes a limit, a lease stops
//! suiting its budget. A lease that is closing, or was granted under
//! another policy, still pays the extensions of the holds it paid for while
//! it is unexpired (its units are debited in the store already). When the
//! leases cannot pay a step, the step becomes an exact store reservation
//! (the hold's *overflow*, id `<id>.x<n>`), and later steps extend it in
//! the store: a stream with budget left is never cut off for lack of a
//! lease. Settlement charges the local lines first (up to what they hold)
//! and the overflow the rest, so refunds and debt beyond the lease are
//! exact in the store.

use std::sync::Arc;

use super::book::Book;
use crate::budget::{
    Actual, BudgetKind, BudgetSpec, BudgetState, Costs, Denial, ExtendOutcome, Impossibility,
    Requester, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement, Step, MAX_AMOUNT,
};

/// The store reservations of a local hold's extensions.
#[derive(Default)]
pub(super) struct Overflow {
    /// The admitted one, whose later steps are store extensions.
    pub(super) admitted: Option<String>,
    /// Reservations sent whose outcome is not known (no reply yet, or a
    /// failed call): voided with a tombstone at settlement, so one that
    /// landed is refunded and one still on the wire writes nothing.
    pub(super) unknown: Vec<String>,
    /// Reservations asked so far (the next id's number).
    pub(super) asked: u32,
    /// Positions (among the hold's specs) of the amount lines every
    /// overflow reserves, in its spec order.
    pub(super) pos: Vec<usize>,
    /// Tokens the admitted overflow was granted.
    pub(super) tokens: u64,
}

/// What [`Book::extend`] decided.
pub enum Extension {
    /// Decided from the leases.
    Done(ExtendOutcome),
    /// The leases cannot pay the step now (a top-up may help).
    Short,
}

/// A store call that extends a local hold ([`Book::overflow_step`]).
#[derive(Debug)]
pub enum StoreStep {
    /// Reserve the step in the store: the hold's first overflow, or one
    /// after a refusal.
    Reserve(ReserveRequest),
    /// Extend the admitted overflow `id` by `step` (rates of its specs).
    Extend {
        /// The overflow's reservation id.
        id: String,
        /// The step, its rates indexed by the overflow's specs.
        step: Step,
    },
}

/// A store call that settles an overflow ([`Book::overflow_ends`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverflowEnd {
    /// Settle the admitted overflow with its share of the usage.
    Settle(String, Settlement),
    /// Void an overflow of unknown outcome (a tombstone living `ttl` µs).
    Void(String, u64),
}

impl Book {
    /// Extends a local hold by up to `step` from its leases: the largest
    /// grant every token line's lease can pay for at its rate. A lease pays
    /// while it is unexpired and in its window, closing or not, under
    /// whatever policy it was granted (module docs).
    pub fn extend(&mut self, id: &str, step: &Step, now: u64) -> Option<Extension> {
        let hold = self.holds.get(id)?;
        let utc = self.utc(now);
        let want = step.tokens.min(MAX_AMOUNT);
        let mut grant = want;
        for line in hold.lines.iter() {
            if line.slot || line.counts_requests {
                continue;
            }
            let Some(e) = self.entries.get(&*line.key) else {
                grant = 0;
                continue;
            };
            let rate = step.rate(line.pos, &e.spec);
            if rate == 0 {
                continue;
            }
            let avail = match &e.lease {
                Some(l) if *l.id == *line.lease && l.pays(now, utc) => l.available(e.in_flight),
                _ => 0,
            };
            grant = grant.min(Step::grant(avail, rate, want));
        }
        if grant == 0 && want > 0 {
            // A live lease that is short gets an urgent top-up.
            let mut nudge = false;
            for line in hold.lines.iter() {
                if let Some(e) = self.entries.get_mut(&*line.key) {
                    if e.lease.as_ref().is_some_and(|l| !l.closing) {
                        e.urgent = true;
                        nudge = true;
                    }
                }
            }
            self.nudge |= nudge;
            return Some(Extension::Short);
        }
        let hold = self.holds.get_mut(id)?;
        for line in hold.lines.iter_mut() {
            if line.slot || line.counts_requests {
                continue;
            }
            let Some(e) = self.entries.get_mut(&*line.key) else {
                continue;
            };
            let d = Step::debit(grant, step.rate(line.pos, &e.spec));
            if d == 0 {
                continue;
            }
            if let Some(l) = e.lease.as_mut() {
                l.spent = l.spent.saturating_add(d);
            }
            e.in_flight = e.in_flight.saturating_add(d);
            line.held = line.held.saturating_add(d);
        }
        hold.reserved_tokens = hold.reserved_tokens.saturating_add(grant);
        Some(Extension::Done(ExtendOutcome::Extended {
            granted: grant,
            now_micros: utc,
        }))
    }

    /// The store call that extends `id` by `step` when its leases cannot:
    /// a store extension of its admitted overflow, else a reservation of
    /// the step on every amount budget of the hold under its current
    /// policy. Records the reservation as of unknown outcome until
    /// [`Book::overflow_reserved`] hears its answer.
    pub fn overflow_step(&mut self, id: &str, step: &Step) -> Option<StoreStep> {
        let hold = self.holds.get_mut(id)?;
        let want = step.tokens.min(MAX_AMOUNT);
        let ov = hold.overflow.get_or_insert_with(Default::default);
        if ov.pos.is_empty() {
            ov.pos = hold
                .lines
                .iter()
                .filter(|l| !l.slot && !l.counts_requests)
                .map(|l| l.pos)
                .collect();
        }
        let mut specs: Vec<BudgetSpec> = Vec::with_capacity(ov.pos.len());
        let mut rates: Vec<u64> = Vec::with_capacity(ov.pos.len());
        for &pos in &ov.pos {
            let line = hold.lines.iter().find(|l| l.pos == pos)?;
            let e = self.entries.get(&*line.key)?;
            rates.push(step.rate(pos, &e.spec));
            specs.push(e.spec.clone());
        }
        if let Some(admitted) = &ov.admitted {
            return Some(StoreStep::Extend {
                id: admitted.clone(),
                step: Step {
                    tokens: want,
                    rates,
                },
            });
        }
        ov.asked += 1;
        let ov_id = format!("{id}.x{}", ov.asked);
        ov.unknown.push(ov_id.clone());
        let costs: Vec<u64> = rates.iter().map(|&r| Step::debit(want, r)).collect();
        Some(StoreStep::Reserve(ReserveRequest {
            id: ov_id,
            costs: Costs {
                tokens: want,
                per_candidate: vec![costs],
            },
            common: specs,
            candidates: vec![Vec::new()],
            slot_lease_micros: hold.hold_ttl,
            hold_ttl_micros: hold.hold_ttl,
            requester: Arc::new(Requester::default()),
            share: None,
        }))
    }

    /// The answer to an overflow reservation `ov_id` of `id` for `tokens`:
    /// `Some(true)` admitted, `Some(false)` refused (nothing written),
    /// `None` unknown (the store call failed).
    pub fn overflow_reserved(
        &mut self,
        id: &str,
        ov_id: &str,
        admitted: Option<bool>,
        tokens: u64,
    ) {
        let Some(ov) = self.holds.get_mut(id).and_then(|h| h.overflow.as_mut()) else {
            return;
        };
        if admitted.is_none() {
            return;
        }
        ov.unknown.retain(|x| x != ov_id);
        if admitted == Some(true) {
            ov.admitted = Some(ov_id.to_string());
            self.overflow_extended(id, tokens);
        }
    }

    /// `granted` tokens more on `id`'s overflow (a store extension).
    pub fn overflow_extended(&mut self, id: &str, granted: u64) {
        if let Some(h) = self.holds.get_mut(id) {
            h.reserved_tokens = h.reserved_tokens.saturating_add(granted);
            if let Some(ov) = h.overflow.as_mut() {
                ov.tokens = ov.tokens.saturating_add(granted);
            }
        }
    }

    /// The store calls that settle `id`'s overflows under `s` (none for a
    /// hold without one), to make before [`Book::settle`]: the local lines
    /// are charged first, up to what they hold, the admitted overflow the
    /// rest (its refund or debt is then exact in the store).
    pub fn overflow_ends(&self, id: &str, s: &Settlement) -> Vec<OverflowEnd> {
        let Some(hold) = self.holds.get(id) else {
            return Vec::new();
        };
        let Some(ov) = &hold.overflow else {
            return Vec::new();
        };
        let mut ends: Vec<OverflowEnd> = ov
            .unknown
            .iter()
            .map(|x| OverflowEnd::Void(x.clone(), hold.hold_ttl))
            .collect();
        if let Some(admitted) = &ov.admitted {
            let end = match &s.actual {
                Actual::Void => OverflowEnd::Void(admitted.clone(), hold.hold_ttl),
                actual => {
                    let used: Vec<u64> = ov
                        .pos
                        .iter()
                        .map(|&pos| {
                            let local = hold
                                .lines
                                .iter()
                                .find(|l| l.pos == pos)
                                .map_or(0, |l| l.held);
                            let used = match actual {
                                Actual::PerSpec(a) => a.get(pos).copied().unwrap_or(0),
                                _ => s.actual_tokens,
                            };
                            used.saturating_sub(local)
                        })
                        .collect();
                    OverflowEnd::Settle(
                        admitted.clone(),
                        Settlement {
                            actual_tokens: s
                                .actual_tokens
                                .saturating_sub(hold.reserved_tokens.saturating_sub(ov.tokens)),
                            upstream_failed: s.upstream_failed,
                            actual: Actual::PerSpec(used),
                        },
                    )
                }
            };
            ends.push(end);
        }
        ends
    }

    /// Settles a local hold (a void when `s.actual` is [`Actual::Void`]);
    /// its overflows are settled by the caller first ([`Book::overflow_ends`]).
    pub fn settle(&mut self, id: &str, s: &Settlement, now: u64) -> Option<SettleOutcome> {
        let hold = self.holds.remove(id)?;
        let utc = self.utc(now);
        let void = matches!(s.actual, Actual::Void);
        let actual = s.actual_tokens;
        // The admitted overflow pays what its lines use beyond the local hold.
        let overflowed = hold.overflow.as_ref().is_some_and(|o| o.admitted.is_some());
        let mut refunded_any = false;
        for line in &hold.lines {
            let Some(e) = self.entries.get_mut(&*line.key) else {
                continue;
            };
            if line.slot {
                e.in_flight = e.in_flight.saturating_sub(1);
                continue;
            }
            e.in_flight = e.in_flight.saturating_sub(line.held);
            let mut used = match &s.actual {
                Actual::Void => 0,
                Actual::PerSpec(a) => a.get(line.pos).copied().unwrap_or(0),
                Actual::Tokens => actual,
            };
            // Request counts come back only with a void.
            if line.counts_requests && !void {
                continue;
            }
            if overflowed && !line.counts_requests {
                // The overflow's settlement charges the rest, and refunds
                // what neither used.
                refunded_any |= line.refund_unused || s.upstream_failed;
                used = used.min(line.held);
            }
            let Some(l) = e.lease.as_mut().filter(|l| *l.id == *line.lease) else {
                // The lease this line spent has ended: its refund is not
                // returned (the store counted the lease as given) and its
                // debt is not charged (module docs, "Faults").
                continue;
            };
            let in_window = match (line.window, l.spec.kind) {
                (Some(w), BudgetKind::Quota { window, .. }) => window.id(utc) == w,
                _ => true,
            };
            let refundable = line.refund_unused || s.upstream_failed || void;
            if used < line.held && refundable && in_window {
                l.spent = l.spent.saturating_sub(line.held - used);
                refunded_any = true;
            } else if used > line.held {
                l.spent = l.spent.saturating_add((used - line.held).min(MAX_AMOUNT));
            }
        }
        let reserved = hold.reserved_tokens;
        Some(SettleOutcome::Settled {
            reserved,
            refunded: if void {
                reserved
            } else if refunded_any {
                reserved.saturating_sub(actual)
            } else {
                0
            },
            debt: if void {
                0
            } else {
                actual.saturating_sub(reserved)
            },
            now_micros: utc,
        })
    }
}

/// An overflow reservation's refusal as an extension's: the budget that
/// cannot give the step.
pub fn exhausted(o: &ReserveOutcome, now_micros: u64) -> Option<Denial> {
    match o {
        ReserveOutcome::Denied(d) => Some(d.clone()),
        ReserveOutcome::Impossible(Impossibility {
            scope,
            name,
            capacity,
            requested,
        }) => Some(Denial {
            held_for_share: false,
            scope: scope.clone(),
            name: *name,
            limit: *capacity,
            requested: *requested,
            available: 0,
            retry_after_micros: 0,
            now_micros,
            state: BudgetState {
                scope: scope.clone(),
                name: *name,
                limit: *capacity,
                remaining: 0,
                reset_micros: 0,
                window: None,
            },
        }),
        _ => None,
    }
}
