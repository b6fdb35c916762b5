//! Quota leases in the Redis store: [`LeaseStore`] as one call of
//! `lua/lease.lua` per call, every line of it in the one script (they are
//! all of one budget domain, so on one slot). Semantics in
//! `budget::quota_lease`; the memory store's `budget/memory/quota_lease.rs` is the
//! reference the differential test holds this to.

use async_trait::async_trait;

use crate::budget::keys::encode_name;
use crate::budget::quota_lease::{LeaseLine, LeaseReply, LeaseState, LeaseStore, LeasedOut};
use crate::budget::{BudgetKind, BudgetSpec, StoreError};

use super::batch::ScriptArgs;
use super::wire::{packed, protocol, window_letter, Reply};
use super::RedisStore;
use crate::budget::placement::Layout;

#[async_trait]
impl LeaseStore for RedisStore {
    async fn lease(&self, lines: &[LeaseLine]) -> Result<Vec<LeaseReply>, StoreError> {
        if self.layout == Layout::Single {
            return self.lease_one(lines).await;
        }
        let groups = super::domains::by_domain(lines.iter().map(|l| &*l.spec.key));
        if groups.len() <= 1 {
            return self.lease_one(lines).await;
        }
        // One call per domain (`tenant` layout): a script runs on one slot.
        // All at once, so a domain failing over delays no other; each
        // domain's lines are applied in its own primary whatever the others
        // answer, and a caller that must see them apart (the lease book)
        // sends one domain per call.
        let parts: Vec<Vec<LeaseLine>> = groups
            .iter()
            .map(|(_, idx)| idx.iter().map(|&i| lines[i].clone()).collect())
            .collect();
        let replies =
            futures_util::future::join_all(parts.iter().map(|part| self.lease_one(part))).await;
        let mut out: Vec<Option<LeaseReply>> = vec![None; lines.len()];
        for ((_, idx), replies) in groups.iter().zip(replies) {
            for (&i, r) in idx.iter().zip(replies?) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.ok_or_else(|| protocol("lease left a line out")))
            .collect()
    }

    async fn leased_out(&self, specs: &[BudgetSpec]) -> Result<Vec<LeasedOut>, StoreError> {
        if self.layout == Layout::Single {
            return self.leased_out_one(specs).await;
        }
        let groups = super::domains::by_domain(specs.iter().map(|s| &*s.key));
        if groups.len() <= 1 {
            return self.leased_out_one(specs).await;
        }
        let mut out: Vec<Option<LeasedOut>> = vec![None; specs.len()];
        for (_, idx) in &groups {
            let part: Vec<BudgetSpec> = idx.iter().map(|&i| specs[i].clone()).collect();
            for (&i, r) in idx.iter().zip(self.leased_out_one(&part).await?) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.ok_or_else(|| protocol("leased out left a budget out")))
            .collect()
    }
}

impl RedisStore {
    /// One lease call over lines of one domain.
    async fn lease_one(&self, lines: &[LeaseLine]) -> Result<Vec<LeaseReply>, StoreError> {
        if lines.is_empty() {
            return Ok(Vec::new());
        }
        let script = &self.scripts.lease;
        let ids: Vec<String> = lines.iter().map(|l| encode_name(&l.lease)).collect();
        let mut inv = ScriptArgs::new(script, 4 * lines.len());
        for (line, id) in lines.iter().zip(&ids) {
            let key = &*line.spec.key;
            inv.key(self.keys.lease(key, id));
            inv.key(self.keys.budget_epoch(key));
            inv.key(key);
            match line.spec.kind {
                BudgetKind::Quota { .. } => inv.key(
                    self.keys
                        .previous_layout(key)
                        .unwrap_or_else(|| key.to_string()),
                ),
                _ => inv.key(key),
            };
        }
        inv.arg(self.now_arg()).arg("L");
        inv.arg(packed(lines.iter().flat_map(|l| {
            let b = l.bounded();
            let (kind, x, y) = kind_numbers(&l.spec.kind);
            [
                kind,
                x,
                y,
                b.seq,
                b.want,
                b.give_back,
                b.spent,
                u64::from(b.end),
                b.ttl_micros,
                b.record_ttl_micros,
            ]
        })));
        for (line, id) in lines.iter().zip(&ids) {
            inv.arg(id.as_str()).arg(policy_text(&line.spec.kind));
        }
        let items = self.invoke(script, &inv).await?;
        let mut r = Reply::new(&items);
        let mut out = Vec::with_capacity(lines.len());
        for _ in lines {
            out.push(reply(&mut r)?);
        }
        crate::budget::metrics::debt_forgiven(r.i64()?);
        if r.rest() != 0 {
            return Err(protocol(format!("lease replied {items:?}")));
        }
        Ok(out)
    }

    /// One leased-out read over budgets of one domain.
    async fn leased_out_one(&self, specs: &[BudgetSpec]) -> Result<Vec<LeasedOut>, StoreError> {
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let script = &self.scripts.lease;
        let mut inv = ScriptArgs::new(script, specs.len());
        for s in specs {
            inv.key(self.keys.budget_epoch(&s.key));
        }
        inv.arg(self.now_arg()).arg("O");
        let items = self.invoke(script, &inv).await?;
        if items.len() != 3 * specs.len() {
            return Err(protocol(format!("leased out replied {items:?}")));
        }
        let mut r = Reply::new(&items);
        specs
            .iter()
            .map(|_| {
                Ok(LeasedOut {
                    epoch: r.u64()?,
                    leases: r.u64()?,
                    units: r.u64()?,
                })
            })
            .collect()
    }
}

/// One line's reply (layout in `lua/lease.lua`).
fn reply(r: &mut Reply<'_>) -> Result<LeaseReply, StoreError> {
    Ok(match r.str()? {
        "L" => LeaseReply::Live(LeaseState {
            epoch: r.u64()?,
            granted: r.u64()?,
            given_back: r.u64()?,
            granted_now: r.u64()?,
            expires_at_micros: r.u64()?,
            now_micros: r.u64()?,
            free: r.i64()?,
            window: match r.str()? {
                "-" => None,
                w => Some(
                    w.parse()
                        .map_err(|_| protocol(format!("bad lease window {w:?}")))?,
                ),
            },
            recall: r.str()? == "1",
        }),
        "E" => LeaseReply::Ended {
            given_back: r.u64()?,
            now_micros: r.u64()?,
        },
        "F" => LeaseReply::Fenced {
            epoch: r.u64()?,
            now_micros: r.u64()?,
        },
        "U" => LeaseReply::Unknown {
            now_micros: r.u64()?,
        },
        other => return Err(protocol(format!("lease line replied {other:?}"))),
    })
}

/// `kind, a, b` as `lua/lease.lua` reads them (those of `lua/reserve.lua`).
fn kind_numbers(kind: &BudgetKind) -> (u64, u64, u64) {
    match *kind {
        BudgetKind::Bucket { per_minute, burst } => (1, per_minute, burst),
        BudgetKind::Quota { limit, window } => (2, limit, super::wire::window_number(window)),
        BudgetKind::Concurrency { max } => (3, max, 0),
    }
}

/// The policy a lease line carries, as the epoch record stores it.
fn policy_text(kind: &BudgetKind) -> String {
    match *kind {
        BudgetKind::Bucket { per_minute, burst } => format!("B {per_minute} {burst}"),
        BudgetKind::Quota { limit, window } => format!("Q {limit} {}", window_letter(window)),
        BudgetKind::Concurrency { max } => format!("C {max} 0"),
    }
}
