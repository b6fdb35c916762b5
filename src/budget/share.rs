//! Fleet-wide weighted shares of a contended deployment
//! (DESIGN "Fleet-wide shares").
//!
//! Each gateway's wait queue orders its own waiters; with several gateways
//! on one store, their heads race at every refill, and a tenant's share
//! would follow the number of gateways its traffic reaches. So the store
//! keeps, next to a deployment's budgets, a small *share state* of the
//! tenants that claimed it lately, and decides whose turn it is
//! fleet-wide. A reservation carries a [`ShareClaim`] (tenant, class rank,
//! weight) when the gateway has a queue; stores without a share state for
//! the deployment (the uncontended case) read one absent key and do
//! nothing else.
//!
//! # Rules (the memory store here, `lua/share.lua` line for line)
//!
//! - A share state exists once a claim was refused by one of the
//!   deployment's own budgets ("not now"); it lives while some entry was
//!   seen within [`ACTIVE_MICROS`], and its entries likewise.
//! - Entry per tenant: class rank, *lead* (the tenant's service so far in
//!   lead units: tokens × [`SHARE_SCALE`] / weight, relative to the least
//!   served active tenant), the times of its last refusal and admission,
//!   and whether it is *pending* (refused since its last admission).
//! - A claim is *deferred* (refused for share, though the budgets would
//!   admit it) while another tenant is pending with a higher class (a
//!   lower rank), or was refused within [`ACTIVE_MICROS`] (it is
//!   backlogged: its other requests still wait somewhere in the fleet)
//!   with the same class and a smaller lead: the capacity is left for the
//!   tenant that is behind. A class above defers only while it is
//!   pending, so it never idles capacity once it is served; within a class
//!   an admission does not end the backlog, else a tenant ahead would take
//!   every refill that comes between the other's admission and its next
//!   refusal.
//! - An admitted claim adds its step (tokens × [`SHARE_SCALE`] / weight) to
//!   its lead, at most [`GAP_STEPS`] steps above the least lead; a tenant
//!   new to the state starts at the least lead (no credit saved up). Then
//!   every lead is lowered by the least one, so the least is 0.
//! - Order within a tenant: a claim may carry its waiter's place
//!   ([`ClaimOrder`]); the entry keeps the tenant's *first waiter* seen
//!   refused (lowest rank, then earliest start, dated by the store's clock
//!   from the claim's wait), and defers the tenant's claims behind it
//!   alike. It lives [`ACTIVE_MICROS`] after its latest refusal, never past
//!   its deadline; its admission or its last attempt frees the place.
//! - A refusal deferred for share names the time the claim's cost refills
//!   on the deployment's first token bucket (else [`SHARE_RETRY_MICROS`]):
//!   by then the tenant behind has had its turn.
//!
//! Borrowing: a tenant that is not refused holds no one back, and one
//! that stops claiming leaves the state after [`ACTIVE_MICROS`]. A tenant
//! ahead is deferred at most [`ACTIVE_MICROS`] after the last refusal of
//! the one behind it (the tokens wait in the bucket meanwhile, lost only
//! if it fills), and by a higher class only while that class is pending.
//!
//! # Bounds (integers below 2^53, exact in Lua)
//!
//! A step is at most `MAX_LIMIT × SHARE_SCALE` = 10^13 (one request's
//! tokens ≤ 10^10, weight ≥ 1); a lead is at most `GAP_STEPS` steps above
//! the least, which is 0 after each update: ≤ 64 × 10^13 = 6.4·10^14, and
//! a lead plus a step ≤ 6.5·10^14. Times are UTC µs (< 2^53). Rounding: a
//! step floors (below one lead unit, 1/1000 token at weight 1, per request).

use std::sync::Arc;

use super::bucket::{MAX_WAIT_MS, UNITS_PER_TOKEN};
use super::{BudgetKind, BudgetSpec, ReserveRequest};
use crate::config::bounds::MAX_LIMIT;
use crate::config::ids::is_valid_id;

/// Lead units per token at weight 1.
pub const SHARE_SCALE: u64 = 1000;
/// An entry (and the state) lives this long after its last claim, µs; a
/// tenant refused within it is backlogged.
pub const ACTIVE_MICROS: u64 = 1_000_000;
/// A tenant is at most this many of its own steps ahead of the least
/// served one: what it took while no one else waited is forgotten beyond.
pub const GAP_STEPS: u64 = 64;
/// Retry time of a claim deferred on a deployment without a token bucket, µs.
pub const SHARE_RETRY_MICROS: u64 = 10_000;
/// Highest weight (the config's bound).
pub const MAX_WEIGHT: u64 = 1_000_000;
/// Highest waiter id (2^53 − 1).
pub const MAX_WAITER_ID: u64 = (1 << 53) - 1;

/// Who claims a share of a contended deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareClaim {
    /// Tenant id (`[A-Za-z0-9._-]`: no separator of the stored form).
    pub tenant: Arc<str>,
    /// Priority class rank: 0 interactive, 1 standard, 2 batch.
    pub rank: u8,
    /// Weight, 1 ..= [`MAX_WEIGHT`].
    pub weight: u64,
    /// The request's place among its tenant's waiters (`None`: it keeps
    /// none, and no tenant order holds it back).
    pub order: Option<ClaimOrder>,
}

/// A claim's place in its tenant's fleet-wide order: oldest waiter first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOrder {
    /// The waiter, 1 ..= [`MAX_WAITER_ID`] (gateway-made, random).
    pub id: u64,
    /// How long it has waited so far, µs (0: not yet). The store dates it
    /// by its own clock from this, so gateways' clocks never meet.
    pub waited_micros: u64,
    /// What is left of its `max_wait`, µs (0: this is its last attempt;
    /// it is deferred by no one and gives up its place).
    pub left_micros: u64,
}

impl ClaimOrder {
    /// A new waiter's id: random, below 2^53 (exact in Lua), never 0.
    pub fn new_id() -> u64 {
        (uuid::Uuid::new_v4().as_u64_pair().0 & MAX_WAITER_ID).max(1)
    }
}

impl ShareClaim {
    /// Lead units one admission of `tokens` adds.
    pub fn step(&self, tokens: u64) -> u64 {
        tokens.clamp(1, MAX_LIMIT) * SHARE_SCALE / self.weight.clamp(1, MAX_WEIGHT)
    }
}

/// The claim of `req` the stores act on: one whose tenant is a valid id
/// (no separator of the stored form) and whose rank is a class's.
pub fn claim_of(req: &ReserveRequest) -> Option<&ShareClaim> {
    req.share
        .as_ref()
        .filter(|c| is_valid_id(&c.tenant) && c.rank <= 2)
        .filter(|c| {
            c.order.is_none_or(|o| {
                (1..=MAX_WAITER_ID).contains(&o.id)
                    && o.waited_micros <= MAX_WAITER_ID
                    && o.left_micros <= MAX_WAITER_ID
            })
        })
}

/// The share key of a candidate deployment: next to its first non-shadow
/// upstream budget, `<…>:upstream:<deployment>:share` (same hash tag).
pub fn share_key(candidate: &[BudgetSpec]) -> Option<String> {
    let spec = candidate
        .iter()
        .find(|s| !s.shadow && s.scope.is_upstream())?;
    let base = spec.key.strip_suffix(spec.name.as_str())?;
    Some(format!("{base}share"))
}

/// The spec a refusal deferred for share names (the deployment's first
/// token bucket, else its first enforced budget), and its retry time for
/// `cost`.
pub fn named_spec(candidate: &[BudgetSpec]) -> Option<usize> {
    let enforced = |s: &&BudgetSpec| !s.shadow;
    candidate
        .iter()
        .position(|s| enforced(&s) && matches!(s.kind, BudgetKind::Bucket { .. }))
        .or_else(|| candidate.iter().position(|s| enforced(&s)))
}

/// Retry time of a claim of `cost` deferred on `spec`, µs.
pub fn retry_micros(spec: &BudgetSpec, cost: u64) -> u64 {
    match spec.kind {
        BudgetKind::Bucket { per_minute, .. } if per_minute > 0 => {
            let ms = (cost.min(MAX_LIMIT) * UNITS_PER_TOKEN as u64)
                .div_ceil(per_minute)
                .clamp(1, MAX_WAIT_MS as u64);
            ms * 1000
        }
        _ => SHARE_RETRY_MICROS,
    }
}

/// One tenant's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareEntry {
    /// Tenant id.
    pub tenant: Arc<str>,
    /// Class rank of its latest claim.
    pub rank: u8,
    /// Lead units above the least served active tenant.
    pub lead: u64,
    /// Last refusal, UTC µs (0: none).
    pub waited: u64,
    /// Last admission, UTC µs (0: none).
    pub admitted: u64,
    /// Refused since its last admission.
    pub pending: bool,
    /// Its first waiter in order of service that the store has seen
    /// refused: no other claim of the tenant behind it is admitted first.
    pub first: Option<FirstWaiter>,
}

/// A tenant's first waiter (lowest rank, then oldest) seen refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstWaiter {
    /// Its class rank.
    pub rank: u8,
    /// When it began waiting, UTC µs (store clock).
    pub since: u64,
    /// Its id ([`ClaimOrder::id`]).
    pub id: u64,
    /// It holds its place until then, UTC µs: [`ACTIVE_MICROS`] after its
    /// latest refusal, never past its deadline (a waiter gone away frees
    /// its tenant's order by then).
    pub until: u64,
}

impl ShareEntry {
    fn seen(&self) -> u64 {
        self.waited.max(self.admitted)
    }

    fn first_at(&self, now: u64) -> Option<FirstWaiter> {
        self.first.filter(|f| f.until > now)
    }
}

/// A deployment's share state: its entries in order of arrival.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareState {
    /// The tenants seen within [`ACTIVE_MICROS`].
    pub entries: Vec<ShareEntry>,
}

impl ShareState {
    /// Drops the entries not seen within [`ACTIVE_MICROS`] of `now`.
    pub fn live(&mut self, now: u64) {
        self.entries.retain(|e| e.seen() + ACTIVE_MICROS > now);
        for e in &mut self.entries {
            e.first = e.first_at(now);
        }
    }

    /// True when no entry is left.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn least(&self) -> u64 {
        self.entries.iter().map(|e| e.lead).min().unwrap_or(0)
    }

    fn lead_of(&self, tenant: &str) -> u64 {
        self.entries
            .iter()
            .find(|e| &*e.tenant == tenant)
            .map_or_else(|| self.least(), |e| e.lead)
    }

    /// True when `claim` must leave the capacity at `now` to a pending
    /// tenant of a higher class, a backlogged one of its class behind it,
    /// or a waiter of its own tenant ahead of it.
    pub fn holds_back(&self, claim: &ShareClaim, now: u64) -> bool {
        let lead = self.lead_of(&claim.tenant);
        self.entries.iter().any(|e| {
            if *e.tenant == *claim.tenant {
                return Self::behind_first(e, claim, now);
            }
            (e.rank < claim.rank && e.pending)
                || (e.rank == claim.rank
                    && e.waited > 0
                    && e.waited + ACTIVE_MICROS > now
                    && e.lead < lead)
        })
    }

    /// `claim` comes after its tenant's first waiter (`e`'s): a lower rank,
    /// or the same and an earlier start. A last attempt never waits.
    fn behind_first(e: &ShareEntry, claim: &ShareClaim, now: u64) -> bool {
        let (Some(o), Some(f)) = (claim.order, e.first_at(now)) else {
            return false;
        };
        o.left_micros > 0
            && f.id != o.id
            && (f.rank, f.since) < (claim.rank, now.saturating_sub(o.waited_micros))
    }

    fn entry(&mut self, claim: &ShareClaim) -> &mut ShareEntry {
        let at = match self.entries.iter().position(|e| e.tenant == claim.tenant) {
            Some(i) => i,
            None => {
                let lead = self.least();
                self.entries.push(ShareEntry {
                    tenant: claim.tenant.clone(),
                    rank: claim.rank,
                    lead,
                    waited: 0,
                    admitted: 0,
                    pending: false,
                    first: None,
                });
                self.entries.len() - 1
            }
        };
        &mut self.entries[at]
    }

    /// `claim` was admitted for `step` lead units at `now`.
    pub fn admitted(&mut self, claim: &ShareClaim, step: u64, now: u64) {
        let least = self.least();
        let e = self.entry(claim);
        e.lead = (e.lead + step).min(least + GAP_STEPS * step);
        e.rank = claim.rank;
        e.admitted = now;
        e.pending = false;
        let first = e.first_at(now);
        e.first = first.filter(|f| claim.order.is_none_or(|o| o.id != f.id));
        self.normalize();
    }

    /// `claim` was refused at `now` (by the deployment's budgets or for
    /// share): its waiter becomes its tenant's first if it comes before
    /// the first known (or keeps that place a while longer if it is it).
    pub fn refused(&mut self, claim: &ShareClaim, now: u64) {
        let e = self.entry(claim);
        e.rank = claim.rank;
        e.waited = now;
        e.pending = true;
        let first = e.first_at(now);
        e.first = match claim.order {
            None => first,
            // A last attempt gives its place up.
            Some(o) if o.left_micros == 0 => first.filter(|f| f.id != o.id),
            Some(o) => {
                let until = now + ACTIVE_MICROS.min(o.left_micros);
                let since = now.saturating_sub(o.waited_micros);
                match first {
                    Some(f) if f.id == o.id => Some(FirstWaiter { until, ..f }),
                    Some(f) if (f.rank, f.since) <= (claim.rank, since) => Some(f),
                    _ => Some(FirstWaiter {
                        rank: claim.rank,
                        since,
                        id: o.id,
                        until,
                    }),
                }
            }
        };
        self.normalize();
    }

    fn normalize(&mut self) {
        let least = self.least();
        for e in &mut self.entries {
            e.lead -= least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(t: &str, rank: u8, weight: u64) -> ShareClaim {
        ShareClaim {
            tenant: t.into(),
            rank,
            weight,
            order: None,
        }
    }

    #[test]
    fn a_tenant_ahead_is_deferred_while_one_behind_is_backlogged_and_released_after() {
        let (h, l) = (claim("heavy", 1, 3), claim("light", 1, 1));
        let mut s = ShareState::default();
        s.refused(&l, 10);
        s.admitted(&h, h.step(30), 20);
        assert_eq!(s.lead_of("heavy"), 10_000);
        assert!(s.holds_back(&h, 20), "light waits and is behind");
        assert!(!s.holds_back(&l, 20));
        s.admitted(&l, l.step(30), 30);
        // Light is 30,000 ahead of heavy's 10,000: it holds no one back, and
        // heavy, behind, was never refused.
        assert_eq!((s.lead_of("heavy"), s.lead_of("light")), (0, 20_000));
        assert!(!s.holds_back(&h, 30) && !s.holds_back(&l, 30));
        s.refused(&h, 40);
        assert!(s.holds_back(&l, 40));
        s.admitted(&h, h.step(30), 50);
        assert!(
            s.holds_back(&l, 50),
            "an admission does not end heavy's backlog: light is still ahead"
        );
        assert!(
            !s.holds_back(&l, 40 + ACTIVE_MICROS),
            "a second after its last refusal it does"
        );
        s.live(50 + ACTIVE_MICROS);
        assert!(
            s.is_empty(),
            "entries leave a second after their last claim"
        );
    }

    fn waiter(t: &str, id: u64, waited: u64, left: u64) -> ShareClaim {
        ShareClaim {
            order: Some(ClaimOrder {
                id,
                waited_micros: waited,
                left_micros: left,
            }),
            ..claim(t, 1, 1)
        }
    }

    #[test]
    fn a_tenants_older_waiter_refused_once_goes_before_its_younger_ones_fleet_wide() {
        let mut s = ShareState::default();
        let now = 10_000_000;
        // Waiter 1 has waited 3 s (it joined at 7 s), waiter 2 1 s.
        let (old, young) = (
            waiter("t", 1, 3_000_000, 5_000_000),
            waiter("t", 2, 1_000_000, 9_000_000),
        );
        assert!(!s.holds_back(&young, now), "no order known yet");
        s.refused(&old, now);
        assert!(s.holds_back(&young, now + 10), "the older one goes first");
        assert!(!s.holds_back(&waiter("t", 1, 3_000_010, 5_000_000), now + 10));
        assert!(
            !s.holds_back(&waiter("u", 3, 0, 9_000_000), now + 10),
            "other tenants are not in its order"
        );
        // The younger one refused does not take the older one's place,
        // and a still older one does.
        s.refused(&young, now + 20);
        assert_eq!(s.entries[0].first.map(|f| f.id), Some(1));
        s.refused(&waiter("t", 4, 5_000_000, 1_000_000), now + 30);
        assert_eq!(s.entries[0].first.map(|f| f.id), Some(4));
        // Waiter 4 admitted: its place is free; the next refused takes it.
        s.admitted(&waiter("t", 4, 5_000_100, 900_000), 1, now + 100);
        assert_eq!(s.entries[0].first, None);
        assert!(!s.holds_back(&young, now + 110));
    }

    #[test]
    fn a_first_waiter_gone_frees_its_tenants_order_at_its_deadline_or_last_attempt() {
        let mut s = ShareState::default();
        let now = 10_000_000;
        let young = waiter("t", 2, 0, 9_000_000);
        // 200 ms left of its wait: it holds its place no longer.
        s.refused(&waiter("t", 1, 3_000_000, 200_000), now);
        assert!(s.holds_back(&young, now + 199_999));
        assert!(!s.holds_back(&young, now + 200_000));
        // A second after its latest refusal at most.
        s.refused(&waiter("t", 1, 3_000_000, 5_000_000), now);
        assert!(s.holds_back(&young, now + ACTIVE_MICROS - 1));
        assert!(!s.holds_back(&young, now + ACTIVE_MICROS));
        // Its last attempt (nothing left) is deferred by no one and gives
        // its place up.
        s.refused(&waiter("t", 1, 3_000_000, 5_000_000), now);
        let last = waiter("t", 1, 8_000_000, 0);
        assert!(!s.holds_back(&waiter("t", 5, 9_000_000, 0), now + 1));
        s.refused(&last, now + 1);
        assert_eq!(s.entries[0].first, None);
        assert!(!s.holds_back(&young, now + 2));
    }

    #[test]
    fn a_waiter_of_a_higher_class_is_not_held_behind_an_older_one_of_a_lower_class() {
        let mut s = ShareState::default();
        let now = 10_000_000;
        let batch = ShareClaim {
            rank: 2,
            ..waiter("t", 1, 5_000_000, 5_000_000)
        };
        s.refused(&batch, now);
        let chat = ShareClaim {
            rank: 0,
            ..waiter("t", 2, 0, 5_000_000)
        };
        assert!(!s.holds_back(&chat, now + 1));
        s.refused(&chat, now + 2);
        assert_eq!(s.entries[0].first.map(|f| f.id), Some(2));
        assert!(
            s.holds_back(&batch, now + 3),
            "the lower class waits for it"
        );
    }

    #[test]
    fn a_higher_class_pending_holds_back_a_lower_one_until_admitted() {
        let (chat, jobs) = (claim("chat", 0, 1), claim("jobs", 2, 1));
        let mut s = ShareState::default();
        s.refused(&chat, 1);
        assert!(s.holds_back(&jobs, 1));
        s.admitted(&chat, chat.step(200), 2);
        assert!(
            !s.holds_back(&jobs, 2),
            "no idle capacity once it is served"
        );
    }

    #[test]
    fn a_lead_gained_while_no_one_waited_is_bounded() {
        let (h, l) = (claim("h", 1, 1), claim("l", 1, 1));
        let mut s = ShareState::default();
        s.refused(&l, 1);
        s.admitted(&l, 1, 2);
        for t in 0..1000 {
            s.admitted(&h, h.step(10), 3 + t);
        }
        assert_eq!(s.lead_of("h"), GAP_STEPS * h.step(10));
    }

    #[test]
    fn the_share_key_sits_next_to_the_deployment_budgets() {
        let ks = crate::budget::keys::KeySpace::new("bg", "d");
        let scope = crate::budget::Scope::Upstream("a/b".into());
        let spec = BudgetSpec {
            key: ks.budget(&scope, crate::budget::BudgetName::Tpm).into(),
            scope,
            name: crate::budget::BudgetName::Tpm,
            kind: BudgetKind::Bucket {
                per_minute: 60_000,
                burst: 1000,
            },
            refund_unused: true,
            shadow: false,
        };
        let key = share_key(std::slice::from_ref(&spec)).expect("an upstream spec");
        assert_eq!(key, "bg:{d}:v3:upstream:a%2Fb:share");
        assert_eq!(retry_micros(&spec, 40), 40_000);
    }
}
