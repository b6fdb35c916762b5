//! The `tenant` layout in the Redis store (DESIGN section 22): a
//! reservation whose budgets lie in two domains (a tenant tree and a
//! deployment group, `budget::placement`) is two script calls, each with
//! its own hold in its own domain under the same reservation id.
//!
//! Protocol: the tenant domain first; the deployment domain only once the
//! tenant domain admitted; the tenant hold voided when the deployment
//! domain refuses. Settlement, extension and renewal go to each domain in
//! the same order, idempotent by reservation id as in one domain. The store
//! remembers which domains each of its reservations went to
//! ([`Placements`]): a gateway settles the holds it made.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::keys::hash_tag;
use crate::budget::{BudgetSpec, Costs, ReserveRequest};

/// Placements kept before expired ones are dropped.
const PRUNE_AT: usize = 100_000;
/// Placements kept at most (all live): past this the oldest are forgotten
/// and their holds end by their TTL instead of their settlement.
const KEEP_MAX: usize = 1_000_000;

/// One hold of a reservation: its domain and the specs of the reservation
/// (in request order: common, then the chosen candidate's) it holds.
#[derive(Debug, Clone)]
pub(super) struct Part {
    /// Hash tag of the domain.
    pub tag: Arc<str>,
    /// Index of its first spec among the reservation's.
    pub from: usize,
    /// One past its last spec (`None`: to the end).
    pub to: Option<usize>,
}

impl Part {
    /// The part of `per_spec` (rates, actual amounts) this hold takes.
    pub fn slice<'a>(&self, per_spec: &'a [u64]) -> &'a [u64] {
        if per_spec.is_empty() {
            return per_spec;
        }
        let from = self.from.min(per_spec.len());
        let to = self
            .to
            .unwrap_or(per_spec.len())
            .clamp(from, per_spec.len());
        &per_spec[from..to]
    }
}

/// Reservation id → its holds and until when they are remembered.
type PlacementMap = HashMap<String, (Arc<[Part]>, Instant)>;

/// Reservation id → the holds it made outside the store's own domain.
#[derive(Default)]
pub(super) struct Placements {
    map: Mutex<PlacementMap>,
}

impl Placements {
    /// The holds of `id`, if this store placed them.
    pub fn get(&self, id: &str) -> Option<Arc<[Part]>> {
        self.lock().get(id).map(|(p, _)| p.clone())
    }

    /// Remembers `parts` for `id` while its hold may live (`ttl`).
    pub fn put(&self, id: &str, parts: Vec<Part>, ttl: Duration) {
        let now = Instant::now();
        let mut map = self.lock();
        if map.len() >= PRUNE_AT {
            map.retain(|_, (_, until)| *until > now);
            if map.len() >= KEEP_MAX {
                map.clear();
            }
        }
        // A settle retried past the hold's life still finds its domains.
        let until = now + ttl + Duration::from_secs(60);
        map.insert(id.to_string(), (parts.into(), until));
    }

    /// Forgets `id` (settled, voided, or never held).
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PlacementMap> {
        // A cache of where holds went: a panic mid-insert loses one entry at most.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The indexes of `keys` by the domain (hash tag) each lies in, domains in
/// order of first appearance: one call per domain for reads and leases.
pub(super) fn by_domain<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<(&'a str, Vec<usize>)> {
    let mut out: Vec<(&'a str, Vec<usize>)> = Vec::new();
    for (i, k) in keys.enumerate() {
        let t = hash_tag(k).unwrap_or("");
        match out.iter_mut().find(|(seen, _)| *seen == t) {
            Some((_, idx)) => idx.push(i),
            None => out.push((t, vec![i])),
        }
    }
    out
}

/// Where a reservation's budgets lie.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Split<'a> {
    /// In one domain (tagged), or no budget at all (`None`).
    One(Option<&'a str>),
    /// Common budgets in the first, candidates' in the second.
    Two(&'a str, &'a str),
    /// The common budgets, or the candidates', span several domains: the
    /// placement rule never does this.
    Many,
}

/// The one tag of `specs`' keys (`Ok(None)`: no spec; `Err`: several).
fn one_tag<'a>(specs: impl Iterator<Item = &'a BudgetSpec>) -> Result<Option<&'a str>, ()> {
    let mut tag = None;
    for s in specs {
        let t = hash_tag(&s.key).unwrap_or("");
        match tag {
            None => tag = Some(t),
            Some(seen) if seen != t => return Err(()),
            Some(_) => {}
        }
    }
    Ok(tag)
}

/// Where `req`'s budgets lie.
pub(super) fn split(req: &ReserveRequest) -> Split<'_> {
    // A run's record (and its key's start counter) lie with the tenant's
    // budgets: the tenant domain's script sets or compares it.
    let run = req.requester.run.as_ref();
    let (Ok(c), Ok(d)) = (
        one_tag(req.common.iter().chain(run.and_then(|r| r.starts.as_ref()))),
        one_tag(req.candidates.iter().flatten()),
    ) else {
        return Split::Many;
    };
    let c = match (c, run) {
        (None, Some(r)) => Some(hash_tag(&r.key).unwrap_or("")),
        (c, _) => c,
    };
    match (c, d) {
        (Some(t), Some(u)) if t != u => Split::Two(t, u),
        (c, d) => Split::One(c.or(d)),
    }
}

/// The common budgets' cost row of candidate `c`.
fn common_row(req: &ReserveRequest, c: usize) -> Vec<u64> {
    (0..req.common.len())
        .map(|i| req.costs.of(c, i, &req.common[i]))
        .collect()
}

/// True when every candidate costs the common budgets alike (the usual
/// case: no dollar budget priced per deployment).
fn alike(req: &ReserveRequest) -> bool {
    req.costs.per_candidate.is_empty()
        || (1..req.candidates.len()).all(|c| common_row(req, c) == common_row(req, 0))
}

/// The tenant domain's request: the common budgets alone. When the
/// candidates cost them differently (a dollar budget priced per
/// deployment), one empty candidate per candidate, each with its cost
/// row: the script admits the first whose costs fit (its index is the
/// admission's `candidate`, passed to [`deployment_request`]).
pub(super) fn tenant_request(req: &ReserveRequest) -> ReserveRequest {
    let (costs, candidates) = if alike(req) {
        let costs = match req.costs.per_candidate.first() {
            None => Costs::tokens(req.costs.tokens),
            Some(_) => Costs {
                tokens: req.costs.tokens,
                per_candidate: vec![common_row(req, 0)],
            },
        };
        (costs, vec![Vec::new()])
    } else {
        let rows = (0..req.candidates.len())
            .map(|c| common_row(req, c))
            .collect();
        (
            Costs {
                tokens: req.costs.tokens,
                per_candidate: rows,
            },
            vec![Vec::new(); req.candidates.len()],
        )
    };
    ReserveRequest {
        id: req.id.clone(),
        costs,
        common: req.common.clone(),
        candidates,
        slot_lease_micros: req.slot_lease_micros,
        hold_ttl_micros: req.hold_ttl_micros,
        requester: req.requester.clone(),
        share: None,
    }
}

/// The deployment domain's request: the candidates (with their costs and
/// the share claim) that the tenant domain's reservation covers: with
/// common costs alike, all of them; else those from `reserved` (the
/// candidate the tenant domain admitted at) on whose common costs are no
/// higher than its, so the tenant hold always covers the candidate chosen
/// (settlement charges the actual). Returns the request and each of its
/// candidates' index in `req`.
pub(super) fn deployment_request(
    req: &ReserveRequest,
    reserved: usize,
) -> (ReserveRequest, Vec<usize>) {
    let n = req.common.len();
    let chosen: Vec<usize> = if alike(req) {
        (0..req.candidates.len()).collect()
    } else {
        let held = common_row(req, reserved);
        (reserved..req.candidates.len())
            .filter(|&c| common_row(req, c).iter().zip(&held).all(|(a, b)| a <= b))
            .collect()
    };
    let per_candidate = if req.costs.per_candidate.is_empty() {
        Vec::new()
    } else {
        chosen
            .iter()
            .map(|&c| {
                let cand = &req.candidates[c];
                (0..cand.len())
                    .map(|j| req.costs.of(c, n + j, &cand[j]))
                    .collect()
            })
            .collect()
    };
    let r = ReserveRequest {
        id: req.id.clone(),
        costs: Costs {
            tokens: req.costs.tokens,
            per_candidate,
        },
        common: Vec::new(),
        candidates: chosen.iter().map(|&c| req.candidates[c].clone()).collect(),
        slot_lease_micros: req.slot_lease_micros,
        hold_ttl_micros: req.hold_ttl_micros,
        // The run's record was set or compared in the tenant domain.
        requester: match &req.requester.run {
            None => req.requester.clone(),
            Some(_) => std::sync::Arc::new(crate::budget::Requester {
                run: None,
                ..(*req.requester).clone()
            }),
        },
        share: req.share.clone(),
    };
    (r, chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::keys::KeySpace;
    use crate::budget::placement::{DomainMap, Layout};
    use crate::budget::{BudgetKind, BudgetName, Scope};

    fn spec(ks: &KeySpace, scope: Scope) -> BudgetSpec {
        BudgetSpec {
            key: ks.budget(&scope, BudgetName::Tpm).into(),
            scope,
            name: BudgetName::Tpm,
            kind: BudgetKind::Bucket {
                per_minute: 10,
                burst: 10,
            },
            refund_unused: true,
            shadow: false,
        }
    }

    fn request(common: Vec<BudgetSpec>, candidates: Vec<Vec<BudgetSpec>>) -> ReserveRequest {
        ReserveRequest {
            id: "r".into(),
            costs: Costs::tokens(1),
            common,
            candidates,
            slot_lease_micros: 0,
            hold_ttl_micros: 1,
            requester: Default::default(),
            share: None,
        }
    }

    #[test]
    fn a_request_splits_at_the_tenant_and_deployment_domains() {
        let map = DomainMap::new("d", [("team", "acme")], [vec!["a", "b"]]);
        let ks = KeySpace::new("bg", "d").with_layout(Layout::Tenant, Some(Arc::new(map)));
        let t = spec(&ks, Scope::Tenant("team".into()));
        let a = spec(&ks, Scope::Upstream("a".into()));
        let b = spec(&ks, Scope::Upstream("b".into()));
        let r = request(vec![t.clone()], vec![vec![a.clone()], vec![b.clone()]]);
        assert_eq!(split(&r), Split::Two("d.t.acme", "d.d.a"));
        assert_eq!(
            split(&request(vec![t.clone()], vec![vec![]])),
            Split::One(Some("d.t.acme"))
        );
        assert_eq!(split(&request(vec![], vec![vec![]])), Split::One(None));
        let other = spec(&ks, Scope::Upstream("z".into()));
        assert_eq!(
            split(&request(vec![t], vec![vec![a], vec![other]])),
            Split::Many
        );
        let single = KeySpace::new("bg", "d");
        let r = request(
            vec![spec(&single, Scope::Tenant("team".into()))],
            vec![vec![spec(&single, Scope::Upstream("a".into()))]],
        );
        assert_eq!(split(&r), Split::One(Some("d")));
    }

    #[test]
    fn common_costs_priced_per_candidate_narrow_the_deployments_offered() {
        let ks = KeySpace::new("bg", "d");
        let t = spec(&ks, Scope::Tenant("t".into()));
        let a = spec(&ks, Scope::Upstream("a".into()));
        let mut r = request(vec![t], vec![vec![a.clone()], vec![a.clone()], vec![a]]);
        r.costs.per_candidate = vec![vec![5, 7], vec![9, 8], vec![4, 6]];
        let tr = tenant_request(&r);
        assert_eq!(tr.costs.per_candidate, vec![vec![5], vec![9], vec![4]]);
        assert_eq!(tr.candidates.len(), 3);
        // Admitted at candidate 0's cost (5): candidates 0 and 2 are covered.
        let (d, map) = deployment_request(&r, 0);
        assert_eq!(map, vec![0, 2]);
        assert_eq!(d.costs.per_candidate, vec![vec![7], vec![6]]);
        // Alike costs: one empty candidate, every deployment offered.
        r.costs.per_candidate = vec![vec![5, 7], vec![5, 8], vec![5, 6]];
        assert_eq!(tenant_request(&r).candidates.len(), 1);
        assert_eq!(deployment_request(&r, 0).1, vec![0, 1, 2]);
    }

    #[test]
    fn a_part_slices_its_specs() {
        let p = Part {
            tag: "x".into(),
            from: 2,
            to: None,
        };
        assert_eq!(p.slice(&[1, 2, 3]), &[3]);
        assert_eq!(p.slice(&[]), &[] as &[u64]);
    }
}
