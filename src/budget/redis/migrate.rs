//! `budgetgate store migrate`: copies each budget's counter state from the
//! `single` layout's key to the `tenant` layout's (DESIGN section 22,
//! OPERATIONS "Switching a fleet to the tenant layout").
//!
//! Budgets are found by scanning the `single` domain (every key of that
//! layout is in it, so every budget with a counter is found: the
//! configured ones and the dynamic ones, end users and tenants of the
//! control API alike); the `tenant` layout's key of each is named by the
//! config's placement ([`crate::config::Policy::tenant_placement`]).
//!
//! One copy is two atomic steps, because the two keys lie in different
//! slots of a cluster (no script or transaction may span them): a script
//! on the source reads its type, value and TTL at once; `SET … PX … NX` on
//! the destination writes them only when it has no value yet. A
//! destination that exists (copied by an earlier run, or written by a
//! `tenant` gateway first) is left as it is, so a second run changes
//! nothing. Between the two steps, gateways of the `single` layout may
//! still debit the source: those debits are not copied (the bound the
//! docs state). Concurrency slot sets are not copied: each slot belongs to
//! a live hold, which frees it in the layout it was made in.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use redis::Value;

use super::conn::{map_err, Conn};
use crate::budget::keys::KeySpace;
use crate::budget::{BudgetName, Scope, StoreError};

/// Keys asked for per `SCAN` step.
const SCAN_COUNT: usize = 1000;

/// One `SCAN` step, run as a script on the source domain's slot so that
/// it reaches the primary that holds it, on one node as on a cluster.
const SCAN_STEP: &str = "return redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])";

/// The source's type, and for a string its value and TTL (ms), read at once.
const READ: &str = "local t = redis.call('TYPE', KEYS[1])['ok'] \
    if t ~= 'string' then return {t} end \
    return {t, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";

/// What one run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Budget keys found in the `single` domain.
    pub found: u64,
    /// Copied to the `tenant` layout.
    pub copied: u64,
    /// Left as they were: the destination had a value already.
    pub present: u64,
    /// Concurrency slot sets, never copied.
    pub slots: u64,
    /// Gone (expired) between the scan and the copy.
    pub gone: u64,
    /// Budgets whose two layouts name one key (nothing to copy).
    pub same: u64,
}

impl std::fmt::Display for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} budget counters found in the single layout: {} copied to the tenant layout, \
             {} already there (left as they are), {} concurrency slot sets not copied, \
             {} expired before the copy, {} in the same key in both layouts",
            self.found, self.copied, self.present, self.slots, self.gone, self.same
        )
    }
}

/// Copies every budget counter of `single` (a key space of the `single`
/// layout) to the key `tenant` (the same prefix and domain in the `tenant`
/// layout) names, on the Redis at `url`; each call bounded by `timeout`.
pub async fn migrate(
    url: &str,
    timeout: Duration,
    single: &KeySpace,
    tenant: &KeySpace,
) -> Result<Migration, StoreError> {
    let mut conn = Conn::open(url, timeout).await?;
    let mut out = Migration::default();
    let base = single.base();
    let anchor = format!("{base}:migrate");
    let pattern = format!("{}:*", glob_escape(base));
    let mut cursor = "0".to_string();
    loop {
        let (next, keys): (String, Vec<String>) = bounded(
            timeout,
            redis::cmd("EVAL")
                .arg(SCAN_STEP)
                .arg(1)
                .arg(&anchor)
                .arg(&cursor)
                .arg(&pattern)
                .arg(SCAN_COUNT)
                .query_async(&mut conn),
        )
        .await?;
        for key in keys {
            let Some(rest) = key.strip_prefix(base).and_then(|r| r.strip_prefix(':')) else {
                continue;
            };
            let Some((scope, name, shadow)) = budget_of(rest) else {
                continue;
            };
            let name_in = |ks: &KeySpace| {
                if shadow {
                    ks.shadow_budget(&scope, name)
                } else {
                    ks.budget(&scope, name)
                }
            };
            // Only a key the key space names back exactly is a budget.
            if name_in(single) != key {
                continue;
            }
            out.found += 1;
            let dest = name_in(tenant);
            if dest == key {
                out.same += 1;
                continue;
            }
            copy(&mut conn, timeout, &key, &dest, &mut out).await?;
        }
        if next == "0" {
            return Ok(out);
        }
        cursor = next;
    }
}

/// Copies `from` to `to` unless `to` has a value; counts the outcome.
async fn copy(
    conn: &mut Conn,
    timeout: Duration,
    from: &str,
    to: &str,
    out: &mut Migration,
) -> Result<(), StoreError> {
    let read: Vec<Value> = bounded(
        timeout,
        redis::cmd("EVAL")
            .arg(READ)
            .arg(1)
            .arg(from)
            .query_async(conn),
    )
    .await?;
    let kind = read.first().and_then(text).unwrap_or_default();
    let (value, ttl_ms) = match (kind.as_str(), read.get(1), read.get(2)) {
        ("string", Some(Value::BulkString(v)), Some(Value::Int(ttl))) => (v.clone(), *ttl),
        ("zset", ..) => {
            out.slots += 1;
            return Ok(());
        }
        ("none", ..) => {
            out.gone += 1;
            return Ok(());
        }
        (other, ..) => {
            return Err(StoreError::Unavailable(format!(
                "{from}: a budget key of type {other:?}"
            )))
        }
    };
    let mut set = redis::cmd("SET");
    set.arg(to).arg(value);
    // Every budget key has a TTL; a key without one (-1) is copied as it is.
    if ttl_ms > 0 {
        set.arg("PX").arg(ttl_ms);
    }
    set.arg("NX");
    let written: Option<String> = bounded(timeout, set.query_async(conn)).await?;
    if written.is_some() {
        out.copied += 1;
    } else {
        out.present += 1;
    }
    Ok(())
}

/// A reply item as text (status or bulk string).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// `s` with the glob characters of `SCAN … MATCH` escaped (a key prefix
/// may hold them).
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

/// The budget a key of the `single` layout names, from what follows its
/// key space's base (`tenant:acme:tpm`, `upstream:azure%2Fgpt:tpm:shadow`):
/// its scope, name, and whether it is the shadow budget. Holds, lease and
/// epoch records and share keys name none.
fn budget_of(rest: &str) -> Option<(Scope, BudgetName, bool)> {
    let mut parts: Vec<&str> = rest.split(':').collect();
    let shadow = parts.last() == Some(&"shadow");
    if shadow {
        parts.pop();
    }
    let dec = |s: &str| -> Option<std::sync::Arc<str>> {
        percent_decode_str(s).decode_utf8().ok().map(|c| c.into())
    };
    let (scope, name) = match parts.as_slice() {
        ["tenant", t, n] => (Scope::Tenant((*t).into()), n),
        ["key", t, k, n] => (Scope::Key((*t).into(), (*k).into()), n),
        ["tenant_model", t, m, n] => (Scope::TenantModel((*t).into(), dec(m)?), n),
        ["upstream", u, n] => (Scope::Upstream(dec(u)?), n),
        ["end_user", t, h, n] => (Scope::EndUser((*t).into(), dec(h)?), n),
        _ => return None,
    };
    Some((scope, BudgetName::parse(name)?, shadow))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::placement::{DomainMap, Layout};
    use std::sync::Arc;

    #[test]
    fn every_budget_key_names_its_budget_back() {
        let single = KeySpace::new("bg", "d");
        let map = DomainMap::new("d", [("team", "acme")], [vec!["a/1", "b"]]);
        let tenant = KeySpace::new("bg", "d").with_layout(Layout::Tenant, Some(Arc::new(map)));
        let scopes = [
            Scope::Tenant("team".into()),
            Scope::Key("team".into(), "k.1".into()),
            Scope::TenantModel("team".into(), "meta/llama:3".into()),
            Scope::Upstream("a/1".into()),
            Scope::EndUser("team".into(), "0f1e".into()),
        ];
        for scope in scopes {
            for name in [
                BudgetName::Tpm,
                BudgetName::TokensPerDay,
                BudgetName::MaxConcurrent,
            ] {
                for shadow in [false, true] {
                    let key = if shadow {
                        single.shadow_budget(&scope, name)
                    } else {
                        single.budget(&scope, name)
                    };
                    let rest = &key[single.base().len() + 1..];
                    assert_eq!(
                        budget_of(rest),
                        Some((scope.clone(), name, shadow)),
                        "{key}"
                    );
                }
            }
        }
        assert_eq!(
            tenant.budget(&Scope::Upstream("a/1".into()), BudgetName::Tpm),
            "bg:{d.d.a%2F1}:v3:upstream:a%2F1:tpm"
        );
        for other in [
            "hold:0192",
            "tenant:acme:tpm:lease:gw-1",
            "tenant:acme:tpm:epoch",
            "upstream:a:share",
            "tenant:acme:nonsense",
        ] {
            assert_eq!(budget_of(other), None, "{other}");
        }
    }

    #[test]
    fn glob_characters_of_a_prefix_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\:{d}"), "a\\*b\\?\\[c\\]\\\\:{d}");
    }
}
