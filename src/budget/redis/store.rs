//! The store: each [`BudgetStore`] operation as one script call (reserve
//! and settle through the batcher) and the decoding of its reply.

use async_trait::async_trait;

use crate::budget::{
    Actual, Admission, BudgetKind, BudgetSpec, BudgetState, BudgetStore, ExtendOutcome,
    Impossibility, RenewOutcome, ReserveOutcome, ReserveRequest, SettleOutcome, Settlement, Step,
    StoreError, WouldDeny, MAX_RATE,
};

use super::batch::{BatchOp, ScriptArgs};
use super::hold::HoldRecord;
use super::wire::{
    adm_fields, denial, live_line, packed, protocol, push_kind, spec_numbers, state, window_of,
    Reply,
};
use super::{RedisStore, Route};
use crate::budget::share;

#[async_trait]
impl BudgetStore for RedisStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        let all: Vec<&BudgetSpec> = req
            .common
            .iter()
            .chain(req.candidates.iter().flatten())
            .collect();
        let legacy = self.previous_quota_keys(all.iter().copied());
        let (share_arg, share_keys) = share_args(req);
        let mut inv = ScriptArgs::new(
            self.batcher.script_for(BatchOp::Reserve),
            1 + all.len() + legacy.len() + share_keys.len(),
        );
        inv.key(self.keys.hold(&req.id));
        for s in &all {
            inv.key(&*s.key);
        }
        for k in &legacy {
            inv.key(k);
        }
        for k in &share_keys {
            inv.key(k);
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
        let items = self.batcher.call(BatchOp::Reserve, inv).await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let now = r.u64()?;
        match tag {
            "A" => {
                let candidate = r.usize()?;
                let replayed = r.str()? == "1";
                if replayed {
                    // The first admission, described by the hold itself.
                    self.forget_hold(&req.id);
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
                    self.remember_hold(&req.id, chosen);
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

    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        let rates: Vec<u8> = if step.rates.is_empty() {
            Vec::new()
        } else {
            packed(step.rates.iter().map(|r| (*r).min(MAX_RATE)))
        };
        let (items, specs) = self
            .hold_call(
                Route::Direct(&self.scripts.extend),
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
                self.forget_hold(id);
                Ok(ExtendOutcome::Unknown)
            }
            "S" => {
                self.forget_hold(id);
                Ok(ExtendOutcome::AlreadySettled)
            }
            other => Err(protocol(format!("extend replied {other:?}"))),
        }
    }

    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        let (items, _) = self
            .hold_call(Route::Direct(&self.scripts.renew), id, &[])
            .await?;
        let mut r = Reply::new(&items);
        let tag = r.str()?;
        let _now = r.u64()?;
        match tag {
            "R" => Ok(RenewOutcome::Renewed {
                slot_lease_until_micros: r.u64()?,
            }),
            "U" => {
                self.forget_hold(id);
                Ok(RenewOutcome::Unknown)
            }
            "S" => {
                self.forget_hold(id);
                Ok(RenewOutcome::AlreadySettled)
            }
            other => Err(protocol(format!("renew replied {other:?}"))),
        }
    }

    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        if s.actual == Actual::Void {
            // Mode void of a hold; no tombstone for an id without one.
            return self.void(id, 0).await;
        }
        let actuals = match &s.actual {
            Actual::PerSpec(amounts) => packed(amounts.iter().copied()),
            _ => Vec::new(),
        };
        let args = [
            s.actual_tokens.to_string().into_bytes(),
            if s.upstream_failed { "1" } else { "0" }.into(),
            actuals,
        ];
        self.finish(id, &args).await
    }

    async fn void(&self, id: &str, hold_ttl_micros: u64) -> Result<SettleOutcome, StoreError> {
        let args = [
            b"0".to_vec(),
            b"1".to_vec(),
            b"V".to_vec(),
            hold_ttl_micros.to_string().into_bytes(),
        ];
        self.finish(id, &args).await
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

    async fn holds_on(
        &self,
        specs: &[BudgetSpec],
    ) -> Result<Vec<crate::budget::HeldOn>, StoreError> {
        self.holds_on_walk(specs).await
    }

    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        if specs.is_empty() {
            // The health check: a read-only script round trip.
            self.probe().await?;
            return Ok(Vec::new());
        }
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
        if r.rest() != 2 * specs.len() {
            return Err(protocol(format!("inspect replied {items:?}")));
        }
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            let remaining = r.i64()?;
            let reset = r.u64()?;
            out.push(state(spec, remaining, reset));
        }
        Ok(out)
    }

    /// Every round trip is bounded by this store's timeout (`bounded`).
    fn times_out_calls(&self) -> bool {
        true
    }
}

impl RedisStore {
    /// A settle call (`lua/settle.lua`, batched) with `args` after the id.
    async fn finish(&self, id: &str, args: &[Vec<u8>]) -> Result<SettleOutcome, StoreError> {
        let (items, _) = self
            .hold_call(Route::Batched(BatchOp::Settle), id, args)
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
        self.forget_hold(id);
        Ok(outcome)
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
