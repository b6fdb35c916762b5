//! The share states of contended deployments (`budget::share`, the same
//! rules as `lua/share.lua`): checked when a candidate's budgets admit a
//! claim, updated after the decision.

use super::state::{Check, Inner};
use crate::budget::share::{self, ShareState};
use crate::budget::{Denial, ReserveRequest};

impl Inner {
    /// Candidate `c`'s own budgets (its specs at `n` onwards) after
    /// `before`, the common budgets' check, then its share when all admit;
    /// `contended` gets `c` when its budgets or its share refused.
    pub(super) fn check_candidate(
        &self,
        req: &ReserveRequest,
        (c, n): (usize, usize),
        before: Check,
        contended: &mut Vec<usize>,
        now: u64,
    ) -> Check {
        if let Check::Impossible(i) = before {
            return Check::Impossible(i);
        }
        let own = self.check_all(&req.candidates[c], req, (c, n), None, now);
        let own = match own {
            Check::Ok if matches!(before, Check::Ok) => self.share_check(req, c, now),
            own => own,
        };
        if matches!(own, Check::Denied(_)) {
            contended.push(c);
        }
        worse(before, own)
    }

    /// The live share state of candidate `c` of `req`, when it claims one.
    fn share_of(&self, req: &ReserveRequest, c: usize, now: u64) -> Option<(String, ShareState)> {
        // No deployment contended anywhere (the usual case): nothing to
        // look up, and no key text to build for it.
        if self.shares.is_empty() {
            return None;
        }
        share::claim_of(req)?;
        let key = share::share_key(&req.candidates[c])?;
        let mut st = self.shares.get(&key)?.clone();
        st.live(now);
        (!st.is_empty()).then_some((key, st))
    }

    /// `Check::Ok`, or the refusal of a claim deferred for share on
    /// candidate `c` (whose budgets all admit it).
    pub(super) fn share_check(&self, req: &ReserveRequest, c: usize, now: u64) -> Check {
        let (Some(claim), Some((_, st))) = (share::claim_of(req), self.share_of(req, c, now))
        else {
            return Check::Ok;
        };
        if !st.holds_back(claim, now) {
            return Check::Ok;
        }
        let cand = &req.candidates[c];
        let Some(i) = share::named_spec(cand) else {
            return Check::Ok;
        };
        let spec = &cand[i];
        let cost = req.costs.of(c, req.common.len() + i, spec);
        Check::Denied(Denial {
            held_for_share: true,
            scope: spec.scope.clone(),
            name: spec.name,
            limit: spec.limit(),
            requested: cost,
            available: self.available(spec, now),
            retry_after_micros: share::retry_micros(spec, cost),
            now_micros: now,
            state: self.state_of(spec, now),
        })
    }

    /// The claim of `req` was refused; `contended`: the candidates whose
    /// own budgets refused it or that held it back.
    pub(super) fn share_refused(&mut self, req: &ReserveRequest, contended: &[usize], now: u64) {
        let Some(claim) = share::claim_of(req) else {
            return;
        };
        for &c in contended {
            let Some(key) = share::share_key(&req.candidates[c]) else {
                continue;
            };
            let st = self.shares.entry(key).or_default();
            st.live(now);
            st.refused(claim, now);
        }
    }

    /// The claim of `req` was admitted on candidate `c`: counted where the
    /// deployment has a share state (none is made for an admission).
    pub(super) fn share_admitted(&mut self, req: &ReserveRequest, c: usize, now: u64) {
        let Some(claim) = share::claim_of(req) else {
            return;
        };
        let Some((key, mut st)) = self.share_of(req, c, now) else {
            return;
        };
        st.admitted(claim, claim.step(req.costs.tokens), now);
        self.shares.insert(key, st);
    }
}

/// Both checks of one candidate together (the common budgets' first, then
/// its own): an impossible one wins, else the longer wait, the common
/// budgets' among equals (`lua/reserve.lua`'s order).
fn worse(before: Check, own: Check) -> Check {
    match (before, own) {
        (Check::Impossible(i), _) | (_, Check::Impossible(i)) => Check::Impossible(i),
        (Check::Denied(d), Check::Denied(e)) => {
            if e.retry_after_micros > d.retry_after_micros {
                Check::Denied(e)
            } else {
                Check::Denied(d)
            }
        }
        (Check::Denied(d), Check::Ok) | (Check::Ok, Check::Denied(d)) => Check::Denied(d),
        (Check::Ok, Check::Ok) => Check::Ok,
    }
}
