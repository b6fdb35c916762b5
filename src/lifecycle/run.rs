//! Part of phase 2, prepare: which run a request belongs to and the run's
//! budgets (docs/API.md "Runs", DESIGN "Run budgets").
//!
//! A caller names a run with `x-budgetgate-run: <id>` (1 to 128 bytes of
//! `[A-Za-z0-9._:-]`) and may set its limits with
//! `x-budgetgate-run-limits` (`config::run`'s grammar). The run's limits
//! are the header's fields, else the tenant's `run_limits_default`, each
//! at most `run_limits_max`. Its budgets (`run:<tenant>/<id>`, rolling
//! quotas of its window) are reserved with the request's others, in the
//! same store call, together with the run's record: the limits it started
//! with and its end user, set when absent and compared otherwise
//! (`budget::RunRecord`), so a run keeps its limits for its life. Neither
//! header goes upstream (`x-budgetgate-*`, `config::forwarding`); the id
//! is never a metric label.
//!
//! A request without the run headers costs one pass over its header
//! names here and nothing else.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::prepare::invalid;
use crate::admission::amounts::Counting;
use crate::admission::plan;
use crate::budget::keys::KeySpace;
use crate::budget::{BudgetKind, BudgetName, BudgetSpec, RunRecord, Scope, Window};
use crate::config::run::{self as settings, RunLimits, MAX_RUN_ID_BYTES};
use crate::config::{KeyPolicy, TenantPolicy};
use crate::gateway::error::ApiError;

/// The header naming the run.
pub const HEADER: HeaderName = HeaderName::from_static("x-budgetgate-run");

/// The header setting the run's limits.
pub const LIMITS_HEADER: HeaderName = HeaderName::from_static("x-budgetgate-run-limits");

/// What a request's run headers say, checked.
#[derive(Debug, Clone)]
pub struct RunHeaders {
    /// The run id.
    pub id: Arc<str>,
    /// The limits it asks for (`None`: no limits header).
    pub limits: Option<RunLimits>,
}

/// The run a request names ([`HEADER`], at most once, valid) and the
/// limits it asks ([`LIMITS_HEADER`], parsed); `None` without a run
/// header. Refuses (400 naming the header) a malformed id or limits, a
/// limits header without a run, and no run where the key or tenant
/// requires one.
pub fn headers(
    tenant: &TenantPolicy,
    key: &KeyPolicy,
    headers: &HeaderMap,
) -> Result<Option<RunHeaders>, ApiError> {
    // Most requests name no run: one pass over the few names a request
    // carries costs less than the two hashed look-ups that would find
    // neither header (both names start with `HEADER`'s).
    let named = headers
        .keys()
        .any(|n| n.as_str().starts_with(HEADER.as_str()));
    let id = match named {
        true => once(headers, &HEADER)?,
        false => None,
    };
    let Some(id) = id else {
        if named && once(headers, &LIMITS_HEADER)?.is_some() {
            return Err(invalid(
                None,
                format!(
                    "The {} header sets a run's limits: send it with the {} header naming the run.",
                    LIMITS_HEADER.as_str(),
                    HEADER.as_str()
                ),
            ));
        }
        if tenant.run_required(key) {
            return Err(invalid(
                None,
                format!(
                    "This API key requires a run: name it in the {} header.",
                    HEADER.as_str()
                ),
            ));
        }
        return Ok(None);
    };
    let id = id
        .to_str()
        .ok()
        .filter(|s| settings::is_valid_run_id(s.as_bytes()))
        .ok_or_else(|| {
            invalid(
                None,
                format!(
                    "The {} header must be 1 to {MAX_RUN_ID_BYTES} bytes of A-Z, a-z, 0-9, `.`, `_`, `:` and `-`.",
                    HEADER.as_str()
                ),
            )
        })?;
    let limits = match once(headers, &LIMITS_HEADER)? {
        None => None,
        Some(v) => {
            let text = v.to_str().map_err(|_| {
                invalid(
                    None,
                    format!(
                        "The {} header is not readable text.",
                        LIMITS_HEADER.as_str()
                    ),
                )
            })?;
            Some(settings::parse(text).map_err(|e| {
                invalid(
                    None,
                    format!(
                        "The {} header: {e}. It reads `tokens=<n>, usd=<dollars>, requests=<n>, window=5h|24h|7d`, every field optional.",
                        LIMITS_HEADER.as_str()
                    ),
                )
            })?)
        }
    };
    Ok(Some(RunHeaders {
        id: id.into(),
        limits,
    }))
}

/// The one non-empty value of `name` (an empty one counts as absent);
/// refuses it sent twice.
fn once<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(invalid(
            None,
            format!("Send the {} header once.", name.as_str()),
        ));
    }
    Ok(first.filter(|v| !v.is_empty()))
}

/// A request's run, ready to reserve.
#[derive(Debug, Clone)]
pub struct Run {
    /// The run id.
    pub id: Arc<str>,
    /// What the reservation sets or compares.
    pub record: RunRecord,
    /// The run's budgets.
    pub budgets: Vec<BudgetSpec>,
    /// How each of `budgets` counts.
    pub counting: Vec<Counting>,
}

/// The run `asked` names, for `tenant`'s `key` and the request's end user
/// (its keyed hash): its effective limits (400 naming `run_limits_max`
/// when a field is above it), budgets and record.
pub fn plan(
    ks: &KeySpace,
    tenant: &TenantPolicy,
    key: &KeyPolicy,
    asked: RunHeaders,
    end_user: Option<&str>,
) -> Result<Run, ApiError> {
    let runs = &tenant.runs;
    let limits =
        RunLimits::resolve(asked.limits.as_ref(), &runs.default, &runs.max).map_err(|field| {
            invalid(
                None,
                format!(
                    "The {} header's `{field}` is above this tenant's run_limits_max ({}).",
                    LIMITS_HEADER.as_str(),
                    runs.max.describe()
                ),
            )
        })?;
    let scope = Scope::Run(tenant.name.as_str().into(), asked.id.clone());
    let (budgets, counting) = plan::run_plan(ks, tenant, &scope, &limits);
    let starts = tenant.runs_per_day(key).map(|per_day| {
        let scope = Scope::Key(tenant.name.as_str().into(), key.id.as_str().into());
        BudgetSpec {
            key: ks.budget(&scope, BudgetName::RunsPerDay).into(),
            scope,
            name: BudgetName::RunsPerDay,
            kind: BudgetKind::Quota {
                limit: per_day,
                window: Window::Day,
            },
            refund_unused: false,
            shadow: false,
        }
    });
    let record = RunRecord {
        key: ks.run_record(&scope).into(),
        index: ks.run_index(&tenant.name).into(),
        scope,
        limits: format!("{},e={}", limits.word(), end_user.unwrap_or("-")).into(),
        // `run_ttl` after the run's last admission. Its counters expire on
        // their own, once their window has slid past what they counted.
        ttl_micros: runs.ttl.as_micros() as u64,
        starts,
    };
    Ok(Run {
        id: asked.id,
        record,
        budgets,
        counting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;

    const CONFIG: &str = r#"
[[upstreams]]
name = "u"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[[models]]
name = "m"
upstreams = ["u"]

[[tenants]]
name = "t"
keys = [{ id = "k", sha256 = "0000000000000000000000000000000000000000000000000000000000000000" },
        { id = "free", sha256 = "1111111111111111111111111111111111111111111111111111111111111111", run_required = false, runs_per_day = 3 }]
run_limits_max = "tokens=1000, usd=5"
run_limits_default = "tokens=100, window=5h"
run_required = true
runs_per_day = 10
run_ttl = "2h"
"#;

    fn hm(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn says(e: ApiError) -> String {
        match e {
            ApiError::InvalidRequest { message, .. } => message,
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn headers_are_checked_and_named() {
        let p = Policy::from_toml(CONFIG).unwrap();
        let t = &p.tenants[0];
        let (k, free) = (&t.keys[0], &t.keys[1]);
        assert!(says(headers(t, k, &hm(&[])).unwrap_err()).contains("requires a run"));
        assert!(headers(t, free, &hm(&[])).unwrap().is_none());
        let e = headers(t, free, &hm(&[("x-budgetgate-run-limits", "tokens=1")])).unwrap_err();
        assert!(says(e).contains("x-budgetgate-run header naming"));
        for bad in ["a b", "{x}", &"x".repeat(129)] {
            let e = headers(t, k, &hm(&[("x-budgetgate-run", bad)])).unwrap_err();
            assert!(says(e).contains("x-budgetgate-run header must be"), "{bad}");
        }
        let e = headers(
            t,
            k,
            &hm(&[("x-budgetgate-run", "a"), ("x-budgetgate-run", "b")]),
        )
        .unwrap_err();
        assert!(says(e).contains("once"));
        let e = headers(
            t,
            k,
            &hm(&[
                ("x-budgetgate-run", "r1"),
                ("x-budgetgate-run-limits", "tokens=1, bogus=2"),
            ]),
        )
        .unwrap_err();
        let m = says(e);
        assert!(
            m.contains("x-budgetgate-run-limits header: unknown field `bogus`"),
            "{m}"
        );
        let ok = headers(
            t,
            k,
            &hm(&[
                ("x-budgetgate-run", "job:1"),
                ("x-budgetgate-run-limits", "tokens=500"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(&*ok.id, "job:1");
        assert_eq!(ok.limits.unwrap().tokens, Some(500));
    }

    #[test]
    fn a_run_gets_its_budgets_record_and_start_counter() {
        let p = Policy::from_toml(CONFIG).unwrap();
        let t = &p.tenants[0];
        let ks = KeySpace::new("bg", "d");
        let asked = |limits: Option<&str>| RunHeaders {
            id: "r1".into(),
            limits: limits.map(|l| settings::parse(l).unwrap()),
        };
        let run = plan(&ks, t, &t.keys[0], asked(None), None).unwrap();
        let got: Vec<(BudgetName, u64)> =
            run.budgets.iter().map(|s| (s.name, s.capacity())).collect();
        assert_eq!(
            got,
            vec![
                (BudgetName::TokensPer5h, 100),
                (BudgetName::UsdPer5h, 5_000_000)
            ]
        );
        assert_eq!(run.record.scope.to_string(), "run:t/r1");
        assert_eq!(&*run.record.limits, "t=100,u=5000000,r=-,w=5h,e=-");
        assert_eq!(run.record.ttl_micros, 2 * 3_600_000_000, "run_ttl");
        assert_eq!(run.record.starts.as_ref().unwrap().limit(), 10);
        let free = plan(&ks, t, &t.keys[1], asked(Some("tokens=1000")), Some("ab")).unwrap();
        assert_eq!(free.record.starts.as_ref().unwrap().limit(), 3);
        assert_eq!(&*free.record.limits, "t=1000,u=5000000,r=-,w=5h,e=ab");
        let e = plan(&ks, t, &t.keys[0], asked(Some("tokens=1001")), None).unwrap_err();
        assert!(says(e).contains("`tokens` is above this tenant's run_limits_max"));
    }
}
