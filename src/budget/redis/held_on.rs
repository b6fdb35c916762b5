//! The live holds on given budgets ([`BudgetStore::holds_on`]): a walk of
//! the domain's hold records (`SCAN` of `<base>:hold:*`, then `MGET` in
//! chunks), never a counter kept by the scripts, so admissions pay
//! nothing for it. Every key of a domain shares one hash tag, so on a
//! cluster the walk goes to the one primary holding that slot.
//!
//! [`BudgetStore::holds_on`]: crate::budget::BudgetStore::holds_on

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;

use super::conn::{map_err, Conn};
use super::hold::HoldRecord;
use super::RedisStore;
use crate::budget::{BudgetSpec, HeldOn, ListedRun, Scope, StoreError, HELD_ON_SCAN_MAX};
use crate::clock::{Clock, SystemClock};

/// Keys asked per `SCAN` step and per `MGET`.
const STEP: usize = 500;

impl RedisStore {
    /// See [`crate::budget::BudgetStore::holds_on`].
    /// Walks the holds of the domain tagged `tag` (`None`: the store's own).
    pub(super) async fn holds_on_walk(
        &self,
        tag: Option<&str>,
        specs: &[BudgetSpec],
    ) -> Result<Vec<HeldOn>, StoreError> {
        let mut out = vec![HeldOn::default(); specs.len()];
        if specs.is_empty() {
            return Ok(out);
        }
        let prefix = self.hold_key(tag, "");
        let pattern = format!("{}*", glob_escape(&prefix));
        let mut cursor: u64 = 0;
        let mut seen = 0usize;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(STEP);
            let (next, keys): (u64, Vec<String>) = self.query_at(&prefix, scan).await?;
            for chunk in keys.chunks(STEP) {
                let mut mget = redis::cmd("MGET");
                for k in chunk {
                    mget.arg(k);
                }
                let values: Vec<Option<String>> = self.query_at(&prefix, mget).await?;
                for (key, raw) in chunk.iter().zip(values) {
                    let Some(raw) = raw else { continue };
                    let Ok(hold) = HoldRecord::parse(&raw) else {
                        tracing::debug!(key = %key, "a hold record could not be read");
                        continue;
                    };
                    if hold.settlement.is_some() || hold.voided {
                        continue;
                    }
                    for line in &hold.lines {
                        if let Some(i) = specs.iter().position(|s| s.key == line.spec.key) {
                            out[i].add(&hold.id, line.held);
                        }
                    }
                }
            }
            seen += keys.len();
            cursor = next;
            if cursor == 0 {
                break;
            }
            if seen >= HELD_ON_SCAN_MAX {
                out.iter_mut().for_each(|h| h.partial = true);
                break;
            }
        }
        Ok(out)
    }

    /// Runs `cmd` on the node holding `key`'s slot (the one node on a
    /// single-node store), bounded by the store timeout.
    async fn query_at<T: redis::FromRedisValue>(
        &self,
        key: &str,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        let fut = async {
            let v: Value = match &self.conn {
                Conn::Single(_) => {
                    let mut c = self.conn.clone();
                    cmd.query_async(&mut c).await?
                }
                Conn::Cluster(c) => {
                    let mut c = c.clone();
                    let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                    c.route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?
                }
            };
            Ok::<T, redis::RedisError>(redis::from_redis_value(v)?)
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

impl RedisStore {
    /// See [`crate::budget::BudgetStore::runs_of`]: the tenant's run index
    /// (at most `RUN_INDEX_MAX` runs, most first) and its runs' records,
    /// two commands on the tenant's domain.
    pub(super) async fn runs_of_read(
        &self,
        ks: &crate::budget::keys::KeySpace,
        tenant: &str,
        n: usize,
    ) -> Result<Vec<ListedRun>, StoreError> {
        let index = ks.run_index(tenant);
        let mut range = redis::cmd("ZREVRANGE");
        range.arg(&index).arg(0).arg(-1).arg("WITHSCORES");
        let listed: Vec<(String, f64)> = self.query_at(&index, range).await?;
        if listed.is_empty() || n == 0 {
            return Ok(Vec::new());
        }
        let mut mget = redis::cmd("MGET");
        for (id, _) in &listed {
            mget.arg(ks.run_record(&Scope::Run(tenant.into(), id.as_str().into())));
        }
        let records: Vec<Option<String>> = self.query_at(&index, mget).await?;
        // The script reads each record's expiry against its `now`: so does
        // this read (the test clock when set).
        let now = match &self.clock {
            Some(c) => c.now_micros(),
            None => SystemClock.now_micros(),
        };
        Ok(listed
            .into_iter()
            .zip(records)
            .filter_map(|((id, spent), record)| {
                let (exp, limits) = record?
                    .split_once(' ')
                    .map(|(e, l)| (e.to_string(), l.to_string()))?;
                (exp.parse::<u64>().ok()? > now).then(|| ListedRun {
                    id: id.into(),
                    spent: spent.max(0.0) as u64,
                    limits: limits.into(),
                })
            })
            .take(n)
            .collect())
    }
}

/// `s` with Redis glob's special characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn glob_specials_are_escaped() {
        assert_eq!(super::glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(super::glob_escape("{bg:d}:hold:"), "{bg:d}:hold:");
    }
}
