//! The reservations the book decided: their extensions from the leases
//! (the stores' own grant rule, [`Step::grant`] and [`Step::debit`]) and
//! their settlement into the lease they debited (the stores' refund rules:
//! unused amounts of refundable budgets, request counts only on a void,
//! quotas only within the lease's window).

use super::book::Book;
use crate::reserve::{
    Actual, BudgetKind, BudgetState, Denial, ExtendOutcome, SettleOutcome, Settlement, Step,
    MAX_AMOUNT,
};

impl Book {
    /// Extends a local hold by up to `step` from its leases: the largest
    /// grant every token line can pay for at its rate.
    pub fn extend(&mut self, id: &str, step: &Step, now: u64) -> Option<ExtendOutcome> {
        let hold = self.holds.get(id)?;
        let utc = self.utc(now);
        let want = step.tokens.min(MAX_AMOUNT);
        let mut grant = want;
        let mut tightest: Option<(usize, i64)> = None;
        for (i, line) in hold.lines.iter().enumerate() {
            if line.slot || line.counts_requests {
                continue;
            }
            let e = &self.entries[&*line.key];
            let rate = step.rate(line.pos, &e.spec);
            if rate == 0 {
                continue;
            }
            let avail = match &e.lease {
                Some(l) if *l.id == *line.lease && l.spendable(&e.spec, now, utc) => {
                    l.available(e.in_flight)
                }
                _ => 0,
            };
            let g = Step::grant(avail, rate, want);
            if g < grant || tightest.is_none() && g == grant {
                tightest = Some((i, avail));
            }
            grant = grant.min(g);
        }
        if grant == 0 && want > 0 {
            let (i, _) = tightest.expect("a zero grant has a limiting line");
            let e = &self.entries[&*hold.lines[i].key];
            let spec = e.spec.clone();
            let d = match &e.lease {
                Some(_) => self.denial(
                    &spec,
                    Step::debit(1, step.rate(hold.lines[i].pos, &spec)),
                    now,
                ),
                None => Denial {
                    held_for_share: false,
                    scope: spec.scope.clone(),
                    name: spec.name,
                    limit: spec.limit(),
                    requested: want,
                    available: 0,
                    retry_after_micros: self.settings.report,
                    now_micros: utc,
                    state: BudgetState {
                        scope: spec.scope.clone(),
                        name: spec.name,
                        limit: spec.limit(),
                        remaining: 0,
                        reset_micros: 0,
                        window: None,
                    },
                },
            };
            if let Some(e) = self.entries.get_mut(&*hold.lines[i].key) {
                e.urgent = true;
            }
            return Some(ExtendOutcome::Exhausted(d));
        }
        let hold = self.holds.get_mut(id).expect("hold looked up above");
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
        Some(ExtendOutcome::Extended {
            granted: grant,
            now_micros: utc,
        })
    }

    /// Settles a local hold (a void when `s.actual` is [`Actual::Void`]).
    pub fn settle(&mut self, id: &str, s: &Settlement, now: u64) -> Option<SettleOutcome> {
        let hold = self.holds.remove(id)?;
        let utc = self.utc(now);
        let void = matches!(s.actual, Actual::Void);
        let actual = s.actual_tokens;
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
            let used = match &s.actual {
                Actual::Void => 0,
                Actual::PerSpec(a) => a.get(line.pos).copied().unwrap_or(0),
                Actual::Tokens => actual,
            };
            // Request counts come back only with a void.
            if line.counts_requests && !void {
                continue;
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
