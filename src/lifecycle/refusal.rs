//! The rate-limit headers of a refusal (DESIGN section 6): both families
//! (`x-ratelimit-*-requests` and `-tokens`, and the IETF `RateLimit-Policy`
//! / `RateLimit` fields) for the budgets the request touches, on every
//! refusal — rate, quota, concurrency, impossible, upstream budgets — as a
//! provider's own 429 carries them (on the Messages route, in Anthropic's
//! `anthropic-ratelimit-*` family, on every refusal after authentication).
//!
//! The refusing budget is described by the refusal itself; the others are
//! read from the store (one `inspect` call, bounded by the store timeout;
//! on a failure only the refusing budget is described). A refusal answered
//! by the local deny cache makes no store call — that is its point — so it
//! describes only the refusing budget's family and omits the other; so does
//! a refusal of the local limiter while the store is down. A refusal of a
//! quota lease is a refusal like the store's (the budget is hot, not the
//! store down): the other budgets are read as for any other.
//!
//! And the refusal's record ([`note`], "why was this refused?",
//! [`crate::gateway::recent_refusals`]): what the decision had, and the
//! refusing budget, whose holds and leases [`read_in_flight`] reads only
//! when the record is asked for.

use axum::http::HeaderMap;

use super::context::RequestContext;
use crate::admission::amounts::Demand;
use crate::admission::AnsweredBy;
use crate::budget::{BudgetName, BudgetSpec, BudgetState, BudgetStore, ReserveRequest, Scope};
use crate::estimate::Estimate;
use crate::gateway::error::ApiError;
use crate::gateway::recent_refusals::{EstimateParts, InFlight, LeasesOut, Refusal, Reused};

/// What a refused reservation asked: kept in the request's context only
/// once the store (or a layer) refused it, for the refusal's record.
pub struct Asked {
    /// The reservation's id.
    pub reservation_id: String,
    /// The estimate, by part.
    pub estimate: EstimateParts,
    /// The refusing budget, when the reservation named it.
    pub spec: Option<BudgetSpec>,
}

impl Asked {
    /// What `reserve` (of `demand`, estimated as `estimate`) asked, refused
    /// by budget `name` of `scope`.
    pub fn of(
        reserve: &ReserveRequest,
        demand: &Demand,
        estimate: &Estimate,
        scope: &Scope,
        name: BudgetName,
    ) -> Box<Self> {
        let spec = reserve
            .common
            .iter()
            .chain(reserve.candidates.iter().flatten())
            .find(|s| s.scope == *scope && s.name == name)
            .cloned();
        Box::new(Asked {
            reservation_id: reserve.id.clone(),
            estimate: EstimateParts {
                input_tokens: demand.input,
                output_cap_tokens: demand.output,
                tool_uses: demand.hosted.uses(),
                total_tokens: estimate.total_tokens,
            },
            spec,
        })
    }
}

/// Keeps the record of `refusal` of a request of `tenant`
/// ([`crate::gateway::recent_refusals`]), with the refusing budget: what
/// held it (holds in flight, units out on leases) is read when the explain
/// route asks, never here (a walk of the store's holds per refusal loaded
/// the store exactly while it refused). Called only on refusals, so
/// admitted requests never pay for it.
pub fn note(cx: &RequestContext, tenant: Option<crate::config::TenantId>, refusal: &ApiError) {
    let Some(t) = tenant else { return };
    let now = cx.st.clock.now_micros();
    let decided_by = match (refusal, cx.answered_by) {
        (ApiError::RateLimited { .. }, Some(a)) => a.label(),
        _ => "store",
    };
    let request_id = cx.finish.request_id.as_str();
    let Some(mut record) = Refusal::of(refusal, request_id, decided_by, now) else {
        return;
    };
    let tenant = cx.policy.tenant(t).name.clone();
    let by_budget = matches!(
        refusal,
        ApiError::RateLimited { .. } | ApiError::Impossible(_)
    );
    let asked = cx.refused.as_deref().filter(|_| by_budget);
    if let Some(a) = asked {
        record.reservation_id = Some(a.reservation_id.clone());
        record.estimate = Some(a.estimate);
    }
    let spec = asked.and_then(|a| a.spec.clone());
    if let (Some(AnsweredBy::DenyCache), Some(spec)) = (cx.answered_by, &spec) {
        if let Some((by, t0)) = cx.st.store.deny_cache().origin(&spec.key) {
            record.reused = Some(Reused {
                reservation_id: by,
                age_micros: now.saturating_sub(t0),
            });
        }
    }
    record.spec = spec;
    record.run = cx.finish.run.clone();
    cx.st.recent_refusals.keep(&tenant, record);
}

/// What holds budget `spec` now, for a decision at `decided` (UTC µs):
/// its holds in flight (one walk of the store's holds) and the units out
/// on its quota leases.
pub async fn read_in_flight(
    st: &crate::gateway::AppState,
    spec: &BudgetSpec,
    decided: u64,
    timeout: std::time::Duration,
) -> InFlight {
    let specs = std::slice::from_ref(spec);
    let mut notes = Vec::new();
    let holds = match tokio::time::timeout(timeout, st.store.holds_on(specs)).await {
        Ok(Ok(mut h)) => h.pop(),
        Ok(Err(e)) => {
            notes.push(format!("holds not read: {e}"));
            None
        }
        Err(_) => {
            notes.push("holds not read: the store timed out".to_string());
            None
        }
    };
    let leases = match st.store.leases() {
        None => None,
        Some(l) => match l.leased_out(specs).await {
            Ok(mut out) => out.pop().map(|o| LeasesOut {
                leases: o.leases,
                units: o.units,
                here: l.leased_units(&spec.key),
            }),
            Err(e) => {
                notes.push(format!("leases not read: {e}"));
                None
            }
        },
    };
    InFlight {
        read_after_micros: st.clock.now_micros().saturating_sub(decided),
        holds,
        leases,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    }
}

/// The headers to put on `refusal`, or `None` when it is not a budget refusal.
pub async fn headers(cx: &RequestContext, refusal: &ApiError) -> Option<HeaderMap> {
    let refusing: Option<&BudgetState> = match refusal {
        ApiError::RateLimited { denial, .. } => Some(&denial.state),
        ApiError::Impossible(_) => None,
        // Anthropic's API describes its limits on every response: so does
        // this route, on any refusal once the caller's budgets are known.
        _ if cx.dialect.is_anthropic() && cx.plan.is_some() => None,
        _ => return None,
    };
    let mut states: Vec<BudgetState> = refusing.into_iter().cloned().collect();
    // Only the store knows the other budgets: not read after a deny-cache
    // refusal (no store call is its point) nor while the store is down
    // (a refusal of the local limiter of a `fail_open` tenant). A lease's
    // refusal reads them, as the store's does.
    let store_answered = match refusal {
        ApiError::RateLimited { .. } => {
            matches!(cx.answered_by, Some(AnsweredBy::Store | AnsweredBy::Lease))
        }
        _ => true,
    };
    if let (Some(plan), true) = (&cx.plan, store_answered) {
        let specs: Vec<BudgetSpec> = plan
            .common
            .iter()
            .chain(plan.upstreams.iter().flat_map(|d| d.budgets.iter()))
            .filter(|s| !refusing.is_some_and(|r| r.scope == s.scope && r.name == s.name))
            .cloned()
            .collect();
        let read = tokio::time::timeout(cx.policy.store.timeout, cx.st.store.inspect(&specs));
        match read.await {
            Ok(Ok(more)) => states.extend(more),
            Ok(Err(e)) => tracing::debug!(error = %e, "could not read the budgets of a refusal"),
            Err(_) => tracing::debug!("reading the budgets of a refusal timed out"),
        }
    }
    (!states.is_empty()).then(|| {
        cx.dialect
            .rate_limit_headers(&states, cx.st.clock.now_micros())
    })
}
