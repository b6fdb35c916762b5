//! The store: each [`BudgetStore`] operation as one script call (reserve
//! and settle through the batcher) and the decoding of its reply.

use async_trait::async_trait;

use crate::budget::{
    Actual, Admission, BudgetKind, BudgetSpec, BudgetState, BudgetStore, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement, Slide,
    Step, StoreError, WouldDeny, MAX_RATE,
};

use std::time::Duration;

use super::batch::{BatchOp, ScriptArgs};
use super::domains::{self, Part, Split};
use super::hold::HoldRecord;
use super::wire::{
    adm_fields, denial, live_line, packed, protocol, push_kind, spec_numbers, state, window_of,
    Reply,
};
use super::{RedisStore, Route};
use crate::budget::keys::hash_tag;
use crate::budget::placement::{self, Layout};
use crate::budget::share;

/// Where the holds of a reservation are ([`RedisStore::holds_of`]).
enum Holds {
    /// One hold in the store's own domain (the `single` layout's).
    Own,
    /// The holds this store placed (`tenant` layout).
    Placed(std::sync::Arc<[Part]>),
    /// A `tenant` id this store did not place: its domains are unknown.
    Elsewhere,
}

impl RedisStore {
    /// A reservation in the domains its budgets lie in: the store's own
    /// (`single` layout), one other, or a tenant and a deployment domain
    /// (`domains`).
    async fn reserve_placed(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        if self.layout == Layout::Single {
            return self.reserve_in(None, req).await;
        }
        let ttl = Duration::from_micros(req.hold_ttl_micros);
        let split = match domains::split(req) {
            // No budget: the hold goes to the store's own domain, placed
            // like any other so that a `tenant` id finds it.
            Split::One(None) => Split::One(hash_tag(self.keys.base())),
            other => other,
        };
        match split {
            Split::One(None) => self.reserve_in(None, req).await,
            Split::One(Some(tag)) => {
                // A placement known from before (a retry, a voided id)
                // stays: its holds are where it says.
                let prior = self.placed.get(&req.id);
                if prior.is_none() {
                    self.placed.put(&req.id, vec![part(tag, 0, None)], ttl);
                }
                let out = self.reserve_in(Some(tag), req).await;
                if prior.is_none()
                    && matches!(&out, Ok(o) if !matches!(o, ReserveOutcome::Admitted(_)))
                {
                    self.placed.forget(&req.id);
                }
                out
            }
            Split::Two(tenant, deployment) => self.reserve_across(req, tenant, deployment).await,
            Split::Many => Err(protocol(format!(
                "reservation {} spans more than a tenant and a deployment domain",
                req.id
            ))),
        }
    }

    /// A reservation over a tenant domain and a deployment domain (DESIGN
    /// section 22): the tenant's first; the deployment's only once the
    /// tenant's admitted; the tenant hold voided when the deployment's
    /// refuses.
    async fn reserve_across(
        &self,
        req: &ReserveRequest,
        tenant: &str,
        deployment: &str,
    ) -> Result<ReserveOutcome, StoreError> {
        let ttl = Duration::from_micros(req.hold_ttl_micros);
        let n = req.common.len();
        let prior = self.placed.get(&req.id);
        // Remembered before each call: a lost reply is compensated by a
        // void of the id, which must reach every hold that may exist.
        if prior.is_none() {
            self.placed
                .put(&req.id, vec![part(tenant, 0, Some(n))], ttl);
        }
        let first = match self
            .reserve_in(Some(tenant), &domains::tenant_request(req))
            .await?
        {
            ReserveOutcome::Admitted(a) => a,
            refused => {
                if prior.is_none() {
                    self.placed.forget(&req.id);
                }
                return Ok(refused);
            }
        };
        // A replay of a reservation that held the tenant domain alone
        // stays one: the deployment domain has nothing of it to replay.
        if first.replayed && prior.as_ref().is_some_and(|p| p.len() == 1) {
            return Ok(ReserveOutcome::Admitted(first));
        }
        // A replay keeps the placement of the reservation it replays (its
        // specs, hence where its amounts per spec split, are the hold's).
        if !(first.replayed && prior.is_some()) {
            let both = vec![part(tenant, 0, Some(n)), part(deployment, n, None)];
            self.placed.put(&req.id, both, ttl);
        }
        let (offered, index) = domains::deployment_request(req, first.candidate);
        let second = match self.reserve_in(Some(deployment), &offered).await {
            Ok(o) => o,
            // The tenant hold stands whatever happened to this call: the
            // caller's lost-reply compensation voids the id in both domains.
            Err(StoreError::NotSent(why)) => {
                return Err(StoreError::Unavailable(format!(
                    "deployment domain, after the tenant domain admitted: {why}"
                )))
            }
            Err(e) => return Err(e),
        };
        match second {
            ReserveOutcome::Admitted(a) => {
                let candidate = index.get(a.candidate).copied().unwrap_or(a.candidate);
                Ok(ReserveOutcome::Admitted(domains::joined(
                    first, a, candidate,
                )))
            }
            refused => {
                // Refunded in full at once, and the tombstone removed: the
                // id was refused, as one domain would have left it (a retry
                // of it is a new reservation). If a call fails, the error
                // reaches the caller, whose compensation voids the id.
                self.placed
                    .put(&req.id, vec![part(tenant, 0, Some(n))], ttl);
                self.void_in(Some(tenant), &req.id, 0).await?;
                let key = self.hold_key(Some(tenant), &req.id);
                let mut conn = self.conn.clone();
                self.bounded(redis::cmd("DEL").arg(&key).query_async::<i64>(&mut conn))
                    .await?;
                self.placed.forget(&req.id);
                Ok(refused)
            }
        }
    }

    /// Where the holds of `id` are. The id says its layout
    /// ([`placement::layout_of_reservation`]): a `single` id's hold is in
    /// the store's own domain, whichever layout this store reserves in (a
    /// hold made before a switch settles where it was made); a `tenant`
    /// id's holds are where this store placed them. A `single` store looks
    /// nothing up.
    fn holds_of(&self, id: &str) -> Holds {
        if self.layout == Layout::Single {
            return Holds::Own;
        }
        // Placed here first: ids not made by a gateway (tools, tests) read
        // as `single` but are placed by their budgets' keys.
        if let Some(parts) = self.placed.get(id) {
            return Holds::Placed(parts);
        }
        match placement::layout_of_reservation(id) {
            Layout::Single => Holds::Own,
            // Placed by another gateway, or by this one before it
            // restarted: its domains are not known here. Nothing is
            // written anywhere (not even a void's tombstone in the wrong
            // layout); the holds end by their TTL.
            Layout::Tenant => Holds::Elsewhere,
        }
    }

    /// The number of domain `tag` ([`BudgetStore::domain_of_reservation`]):
    /// `0` for the store's own, else a hash of the tag (FNV-1a: the same in
    /// every process, no allocation), never `0`.
    fn domain_number(&self, tag: &str) -> u64 {
        if hash_tag(self.keys.base()) == Some(tag) {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in tag.as_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h.max(1)
    }

    /// One reserve call in the domain tagged `tag` (`None`: the store's own).
    async fn reserve_in(
        &self,
        tag: Option<&str>,
        req: &ReserveRequest,
    ) -> Result<ReserveOutcome, StoreError> {
        let hold_key = self.hold_key(tag, &req.id);
        let batcher = self.batcher_of(tag);
        let all: Vec<&BudgetSpec> = req
            .common
            .iter()
            .chain(req.candidates.iter().flatten())
            .collect();
        let legacy = self.previous_quota_keys(all.iter().copied());
        let (share_arg, share_keys) = share_args(req);
        let run = req.requester.run.as_ref();
        let run_keys = run.map_or(0, |r| 3 + usize::from(r.starts.is_some()));
        let run_expiry = run.map(|r| run_index_expiry(&r.index));
        let mut inv = ScriptArgs::new(
            batcher.script_for(BatchOp::Reserve),
            1 + all.len() + legacy.len() + share_keys.len() + run_keys,
        );
        inv.key(&hold_key);
        for s in &all {
            inv.key(&*s.key);
        }
        for k in &legacy {
            inv.key(k);
        }
        for k in &share_keys {
            inv.key(k);
        }
        if let (Some(r), Some(expiry)) = (run, &run_expiry) {
            inv.key(&*r.key);
            inv.key(&*r.index);
            inv.key(expiry);
            if let Some(starts) = &r.starts {
                inv.key(&*starts.key);
            }
        }
        inv.arg(self.now_arg())
            .arg(&req.id)
            .arg(req.costs.tokens)
            .arg(req.slot_lease_micros)
            .arg(req.hold_ttl_micros)
            .arg(req.common.len())
            .arg(req.candidates.len());
        for c in &req.candidates {
            inv.arg(c.len());
        }
        let costs = spec_costs(req);
        inv.arg(spec_numbers(&all, &costs).as_slice());
        for (s, cost) in all.iter().zip(&costs) {
            inv.arg(live_line(s)).arg(adm_fields(s, *cost).as_slice());
        }
        inv.arg(common_costs(req).as_slice());
        inv.arg(share_arg.as_str());
        match run {
            None => inv.arg(""),
            Some(r) => inv.arg(format!(
                "{} {} {} {}",
                r.ttl_micros,
                r.starts.as_ref().map_or(0, BudgetSpec::limit),
                r.limits,
                run_id(&r.scope)
            )),
        };
        let items = batcher.call(BatchOp::Reserve, inv).await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        match tag {
            "A" => {
                let candidate = r.usize()?;
                let replayed = r.str()? == "1";
                if replayed {
                    // The first admission, described by the hold itself.
                    self.forget_hold(&hold_key);
                    let hold = HoldRecord::parse(r.str()?)?;
                    let budgets = hold
                        .lines
                        .iter()
                        .filter_map(|l| {
                            let (remaining, reset_micros) = l.admitted?;
                            Some(BudgetState {
                                scope: l.spec.scope.clone(),
                                name: l.spec.name,
                                limit: l.spec.limit(),
                                remaining,
                                reset_micros,
                                window: window_of(&l.spec.kind),
                            })
                        })
                        .collect();
                    return Ok(ReserveOutcome::Admitted(Admission {
                        now_micros: now,
                        candidate,
                        budgets,
                        replayed,
                        would_deny: hold.would_deny,
                    }));
                }
                let n_would_deny = r.usize()?;
                let mut would_deny = Vec::with_capacity(n_would_deny);
                let mut denied_idx = Vec::with_capacity(n_would_deny);
                for _ in 0..n_would_deny {
                    let idx = r.usize()?;
                    let spec = all
                        .get(idx)
                        .ok_or_else(|| protocol("would-deny names no budget"))?;
                    denied_idx.push(idx);
                    would_deny.push(WouldDeny {
                        scope: spec.scope.clone(),
                        name: spec.name,
                    });
                }
                let budgets = {
                    // Spec indexes into `all` of the common specs and the chosen candidate's.
                    let cand_start = req.common.len()
                        + req
                            .candidates
                            .iter()
                            .take(candidate)
                            .map(Vec::len)
                            .sum::<usize>();
                    let cand_len = req.candidates.get(candidate).map_or(0, Vec::len);
                    let chosen: Vec<BudgetSpec> = (0..req.common.len())
                        .chain(cand_start..cand_start + cand_len)
                        .filter(|i| !denied_idx.contains(i))
                        .filter_map(|i| all.get(i).map(|s| (*s).clone()))
                        .collect();
                    let metered: Vec<&BudgetSpec> = chosen
                        .iter()
                        .filter(|s| !matches!(s.kind, BudgetKind::Concurrency { .. }))
                        .collect();
                    if r.rest() != 2 * metered.len() {
                        return Err(protocol(format!(
                            "admission of {} has {} values for {} budgets",
                            req.id,
                            r.rest(),
                            metered.len()
                        )));
                    }
                    let mut budgets = Vec::with_capacity(metered.len());
                    for spec in metered {
                        let remaining = r.i64()?;
                        let reset = r.u64()?;
                        budgets.push(state(spec, remaining, reset));
                    }
                    self.remember_hold(hold_key, chosen);
                    budgets
                };
                Ok(ReserveOutcome::Admitted(Admission {
                    now_micros: now,
                    candidate,
                    budgets,
                    replayed,
                    would_deny,
                }))
            }
            "D" | "S" => {
                let idx = r.usize()?;
                let spec = all
                    .get(idx)
                    .ok_or_else(|| protocol("denial names no budget"))?;
                let mut d = denial(&mut r, spec, cost_at(&costs, idx), now)?;
                d.held_for_share = tag == "S";
                Ok(ReserveOutcome::Denied(d))
            }
            "V" => Ok(ReserveOutcome::Voided),
            "R" => match run {
                Some(r) => Ok(ReserveOutcome::RunConflict(r.scope.clone())),
                None => Err(protocol("a run conflict of a reservation without a run")),
            },
            "N" => match run.and_then(|r| r.starts.as_ref()) {
                Some(starts) => Ok(ReserveOutcome::Denied(denial(&mut r, starts, 1, now)?)),
                None => Err(protocol("a run start refused without a runs-per-day")),
            },
            "I" => {
                let idx = r.usize()?;
                let spec = all
                    .get(idx)
                    .ok_or_else(|| protocol("impossibility names no budget"))?;
                Ok(ReserveOutcome::Impossible(Impossibility {
                    scope: spec.scope.clone(),
                    name: spec.name,
                    capacity: spec.capacity(),
                    requested: cost_at(&costs, idx),
                }))
            }
            other => Err(protocol(format!("reserve replied {other:?}"))),
        }
    }
}

#[async_trait]
impl BudgetStore for RedisStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.reserve_placed(req).await
    }

    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        let parts = match self.holds_of(id) {
            Holds::Own => return self.extend_in(None, id, step).await,
            Holds::Elsewhere => return Ok(ExtendOutcome::Unknown),
            Holds::Placed(parts) => parts,
        };
        // Each hold in turn, the next asked only what the one before
        // granted: a smaller grant there leaves the earlier hold's surplus
        // reserved until settlement refunds it (never over-admitting).
        let mut out = ExtendOutcome::Unknown;
        let mut want = step.tokens;
        for p in parts.iter() {
            let part_step = Step {
                tokens: want,
                rates: p.slice(&step.rates).to_vec(),
            };
            out = self.extend_in(Some(&p.tag), id, &part_step).await?;
            match domains::granted(&out) {
                Some(g) => want = g,
                None => return Ok(out),
            }
        }
        Ok(out)
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        let parts = match self.holds_of(id) {
            Holds::Own => return self.renew_in(None, id).await,
            Holds::Elsewhere => return Ok(RenewOutcome::Unknown),
            Holds::Placed(parts) => parts,
        };
        let mut outcomes = Vec::with_capacity(parts.len());
        for p in parts.iter() {
            outcomes.push(self.renew_in(Some(&p.tag), id).await?);
        }
        Ok(domains::renewed(&outcomes))
    }

    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        if s.actual == Actual::Void {
            // Mode void of a hold; no tombstone for an id without one.
            return self.void(id, 0).await;
        }
        let parts = match self.holds_of(id) {
            Holds::Own => return self.settle_in(None, id, s).await,
            Holds::Elsewhere => return Ok(SettleOutcome::Unknown),
            Holds::Placed(parts) => parts,
        };
        let mut outcomes = Vec::with_capacity(parts.len());
        for p in parts.iter() {
            let part = Settlement {
                actual_tokens: s.actual_tokens,
                upstream_failed: s.upstream_failed,
                actual: match &s.actual {
                    Actual::PerSpec(a) => Actual::PerSpec(p.slice(a).to_vec()),
                    other => other.clone(),
                },
            };
            outcomes.push(self.settle_in(Some(&p.tag), id, &part).await?);
        }
        // The placement stays until the hold would have expired: a retried
        // reserve of the id replays from both domains.
        Ok(domains::settled(&outcomes, Some(s.actual_tokens)))
    }

    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        let parts = match self.holds_of(id) {
            Holds::Own => return self.void_in(None, id, hold_ttl_micros).await,
            Holds::Elsewhere => return Ok(SettleOutcome::Unknown),
            Holds::Placed(parts) => parts,
        };
        let mut outcomes = Vec::with_capacity(parts.len());
        for p in parts.iter() {
            outcomes.push(self.void_in(Some(&p.tag), id, hold_ttl_micros).await?);
        }
        Ok(domains::settled(&outcomes, None))
    }

    fn domain_of_reservation(&self, req: &ReserveRequest) -> u64 {
        if self.layout == Layout::Single {
            return 0;
        }
        // The tenant domain is asked first: a call held up there holds
        // only that domain's turn.
        match domains::split(req) {
            Split::One(Some(tag)) | Split::Two(tag, _) => self.domain_number(tag),
            Split::One(None) | Split::Many => 0,
        }
    }

    fn domain_of_hold(&self, id: &str) -> u64 {
        match self.holds_of(id) {
            Holds::Placed(parts) => parts.first().map_or(0, |p| self.domain_number(&p.tag)),
            // The own domain's hold; or no call at all.
            Holds::Own | Holds::Elsewhere => 0,
        }
    }

    fn domain_of_budget(&self, spec: &BudgetSpec) -> u64 {
        if self.layout == Layout::Single {
            return 0;
        }
        hash_tag(&spec.key).map_or(0, |tag| self.domain_number(tag))
    }

    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        let BudgetKind::Bucket { per_minute, burst } = spec.kind else {
            let states = self.inspect(std::slice::from_ref(spec)).await?;
            return Ok(states.first().map_or(0, |s| s.remaining));
        };
        let mut inv = ScriptArgs::new(&self.scripts.lower, 1);
        inv.key(&*spec.key)
            .arg(self.now_arg())
            .arg(per_minute)
            .arg(burst)
            .arg(at_most);
        let items = self.invoke(&self.scripts.lower, &inv).await?;
        let mut r = Reply::new(&items);
        let _now = r.u64()?;
        r.i64()
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        if specs.is_empty() {
            // The health check: a read-only script round trip.
            self.probe().await?;
            return Ok(Vec::new());
        }
        Ok(self.inspect_all(specs).await?.0)
    }

    async fn slides(&self, specs: &[BudgetSpec]) -> Result<Vec<Option<Slide>>, StoreError> {
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.inspect_all(specs).await?.1)
    }

    async fn runs_of(
        &self,
        ks: &crate::budget::keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Result<Vec<crate::budget::ListedRun>, StoreError> {
        self.runs_of_read(ks, tenant, n).await
    }

    async fn holds_on(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<Vec<crate::budget::HeldOn>, StoreError> {
        if self.layout == Layout::Single {
            return self.holds_on_walk(None, specs).await;
        }
        let mut out = vec![crate::budget::HeldOn::default(); specs.len()];
        for (tag, idx) in domains::by_domain(specs.iter().map(|s| &*s.key)) {
            let part: Vec<BudgetSpec> = idx.iter().map(|&i| specs[i].clone()).collect();
            for (&i, h) in idx.iter().zip(self.holds_on_walk(Some(tag), &part).await?) {
                out[i] = h;
            }
        }
        Ok(out)
    }
}

impl RedisStore {
    /// The states and rolling windows' slides of `specs` (not empty): one
    /// inspect call per domain (a script runs on one slot), in order.
    async fn inspect_all(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<(Vec<BudgetState>, Vec<Option<Slide>>), StoreError> {
        let groups = if self.layout == Layout::Single {
            Vec::new()
        } else {
            domains::by_domain(specs.iter().map(|s| &*s.key))
        };
        if groups.len() <= 1 {
            return self.inspect_one(specs).await;
        }
        let mut states: Vec<Option<BudgetState>> = vec![None; specs.len()];
        let mut slides = vec![None; specs.len()];
        for (_, idx) in &groups {
            let part: Vec<BudgetSpec> = idx.iter().map(|&i| specs[i].clone()).collect();
            let (st, sl) = self.inspect_one(&part).await?;
            for ((&i, st), sl) in idx.iter().zip(st).zip(sl) {
                states[i] = Some(st);
                slides[i] = sl;
            }
        }
        let states = states
            .into_iter()
            .map(|s| s.ok_or_else(|| protocol("inspect left a budget out")))
            .collect::<Result<_, _>>()?;
        Ok((states, slides))
    }

    /// One inspect call over budgets of one domain.
    async fn inspect_one(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<(Vec<BudgetState>, Vec<Option<Slide>>), StoreError> {
        let legacy = self.previous_quota_keys(specs.iter());
        let mut inv = ScriptArgs::new(&self.scripts.inspect, specs.len() + legacy.len());
        for s in specs {
            inv.key(&*s.key);
        }
        for k in &legacy {
            inv.key(k);
        }
        inv.arg(self.now_arg());
        for s in specs {
            push_kind(&mut inv, &s.kind);
        }
        let items = self.invoke(&self.scripts.inspect, &inv).await?;
        let mut r = Reply::new(&items);
        let _now = r.u64()?;
        let rolling = |s: &BudgetSpec| matches!(s.kind, BudgetKind::Quota { window, .. } if window.is_rolling());
        let windows = specs.iter().filter(|s| rolling(s)).count();
        if r.rest() != 2 * specs.len() + 2 * windows {
            return Err(protocol(format!("inspect replied {items:?}")));
        }
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            let remaining = r.i64()?;
            let reset = r.u64()?;
            out.push(state(spec, remaining, reset));
        }
        let mut slides = Vec::with_capacity(specs.len());
        for spec in specs {
            slides.push(if rolling(spec) {
                let (in_micros, units) = (r.u64()?, r.u64()?);
                (units > 0).then_some(Slide { in_micros, units })
            } else {
                None
            });
        }
        Ok((out, slides))
    }
}

impl RedisStore {
    /// An extension of the hold of `id` in the domain tagged `tag`.
    async fn extend_in(
        &self,
        tag: Option<&str>,
        id: &str,
        step: &Step,
    ) -> Result<ExtendOutcome, StoreError> {
        let hold_key = self.hold_key(tag, id);
        let rates: Vec<u8> = if step.rates.is_empty() {
            Vec::new()
        } else {
            packed(step.rates.iter().map(|r| (*r).min(MAX_RATE)))
        };
        let (items, specs) = self
            .hold_call(
                Route::Direct(&self.scripts.extend),
                &hold_key,
                tag,
                id,
                &[step.tokens.to_string().into_bytes(), rates],
            )
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        match tag {
            "E" => Ok(ExtendOutcome::Extended {
                granted: r.u64()?,
                now_micros: now,
            }),
            "X" => {
                let spec = specs
                    .get(r.usize()?)
                    .ok_or_else(|| protocol("exhaustion names no budget"))?;
                Ok(ExtendOutcome::Exhausted(denial(
                    &mut r,
                    spec,
                    step.tokens,
                    now,
                )?))
            }
            "U" => {
                self.forget_hold(&hold_key);
                Ok(ExtendOutcome::Unknown)
            }
            "S" => {
                self.forget_hold(&hold_key);
                Ok(ExtendOutcome::AlreadySettled)
            }
            other => Err(protocol(format!("extend replied {other:?}"))),
        }
    }

    /// A renewal of the hold of `id` in the domain tagged `tag`.
    async fn renew_in(&self, tag: Option<&str>, id: &str) -> Result<RenewOutcome, StoreError> {
        let hold_key = self.hold_key(tag, id);
        let (items, _) = self
            .hold_call(Route::Direct(&self.scripts.renew), &hold_key, tag, id, &[])
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let _now = r.u64()?;
        match tag {
            "R" => Ok(RenewOutcome::Renewed {
                slot_lease_until_micros: r.u64()?,
            }),
            "U" => {
                self.forget_hold(&hold_key);
                Ok(RenewOutcome::Unknown)
            }
            "S" => {
                self.forget_hold(&hold_key);
                Ok(RenewOutcome::AlreadySettled)
            }
            other => Err(protocol(format!("renew replied {other:?}"))),
        }
    }

    /// A settlement of the hold of `id` in the domain tagged `tag`.
    async fn settle_in(
        &self,
        tag: Option<&str>,
        id: &str,
        s: &Settlement,
    ) -> Result<SettleOutcome, StoreError> {
        let actuals = match &s.actual {
            Actual::PerSpec(amounts) => packed(amounts.iter().copied()),
            _ => Vec::new(),
        };
        let args = [
            s.actual_tokens.to_string().into_bytes(),
            if s.upstream_failed { "1" } else { "0" }.into(),
            actuals,
        ];
        self.finish(tag, id, &args).await
    }

    /// A void of `id` in the domain tagged `tag`.
    async fn void_in(
        &self,
        tag: Option<&str>,
        id: &str,
        hold_ttl_micros: u64,
    ) -> Result<SettleOutcome, StoreError> {
        let args = [
            b"0".to_vec(),
            b"1".to_vec(),
            b"V".to_vec(),
            hold_ttl_micros.to_string().into_bytes(),
        ];
        self.finish(tag, id, &args).await
    }

    /// A settle call (`lua/settle.lua`, batched) with `args` after the id,
    /// on the hold of `id` in the domain tagged `tag`.
    async fn finish(
        &self,
        tag: Option<&str>,
        id: &str,
        args: &[Vec<u8>],
    ) -> Result<SettleOutcome, StoreError> {
        let hold_key = self.hold_key(tag, id);
        let (items, _) = self
            .hold_call(Route::Batched(BatchOp::Settle), &hold_key, tag, id, args)
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        let outcome = match tag {
            "T" => {
                let outcome = SettleOutcome::Settled {
                    reserved: r.u64()?,
                    refunded: r.u64()?,
                    debt: r.u64()?,
                    now_micros: now,
                };
                crate::budget::metrics::debt_forgiven(r.i64()?);
                outcome
            }
            "U" => SettleOutcome::Unknown,
            "S" => SettleOutcome::AlreadySettled,
            "V" => SettleOutcome::Voided,
            other => return Err(protocol(format!("settle replied {other:?}"))),
        };
        self.forget_hold(&hold_key);
        Ok(outcome)
    }
}

/// A hold in the domain tagged `tag` of the specs `from..to`.
fn part(tag: &str, from: usize, to: Option<usize>) -> Part {
    Part {
        tag: tag.into(),
        from,
        to,
    }
}

/// Each spec's cost, in the order the script numbers them (common specs,
/// then every candidate's): a common spec as the first candidate costs it.
fn spec_costs(req: &ReserveRequest) -> Vec<u64> {
    let n = req.common.len();
    let mut out: Vec<u64> = req
        .common
        .iter()
        .enumerate()
        .map(|(i, s)| req.costs.of(0, i, s))
        .collect();
    for (c, own) in req.candidates.iter().enumerate() {
        out.extend(
            own.iter()
                .enumerate()
                .map(|(j, s)| req.costs.of(c, n + j, s)),
        );
    }
    out
}

/// `lua/reserve.lua`'s last argument: empty when every candidate costs the
/// common specs alike (the usual case), else each common spec's cost for
/// each candidate.
fn common_costs(req: &ReserveRequest) -> Vec<u8> {
    let n = req.common.len();
    let cost = |c: usize, i: usize| req.costs.of(c, i, &req.common[i]);
    let alike = (1..req.candidates.len()).all(|c| (0..n).all(|i| cost(c, i) == cost(0, i)));
    if alike {
        return Vec::new();
    }
    packed((0..req.candidates.len()).flat_map(|c| (0..n).map(move |i| cost(c, i))))
}

/// `lua/reserve.lua`'s share argument (empty without a claim: tenant, rank,
/// step, order (id, 0 for none; waited µs; left µs), then the 1-based
/// candidates that have a share key) and those keys.
fn share_args(req: &ReserveRequest) -> (String, Vec<String>) {
    let Some(claim) = share::claim_of(req) else {
        return (String::new(), Vec::new());
    };
    let o = claim.order.unwrap_or(share::ClaimOrder {
        id: 0,
        waited_micros: 0,
        left_micros: 0,
    });
    let mut arg = format!(
        "{} {} {} {} {} {}",
        claim.tenant,
        claim.rank,
        claim.step(req.costs.tokens),
        o.id,
        o.waited_micros,
        o.left_micros
    );
    let mut keys = Vec::new();
    for (c, cand) in req.candidates.iter().enumerate() {
        if let Some(k) = share::share_key(cand) {
            arg.push_str(&format!(" {}", c + 1));
            keys.push(k);
        }
    }
    if keys.is_empty() {
        return (String::new(), keys);
    }
    (arg, keys)
}

fn cost_at(costs: &[u64], idx: usize) -> u64 {
    costs.get(idx).copied().unwrap_or(0)
}

/// The companion of run index `index` holding each run's record expiry
/// (lua/reserve.lua), in the index's domain.
pub(super) fn run_index_expiry(index: &str) -> String {
    format!("{index}:expiry")
}

/// The id of run scope `scope` (the script's index member).
fn run_id(scope: &crate::budget::Scope) -> &str {
    match scope {
        crate::budget::Scope::Run(_, id) => id,
        // A record is only ever built for a run scope.
        _ => "",
    }
}
