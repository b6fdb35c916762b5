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

use axum::http::HeaderMap;

use super::context::RequestContext;
use crate::admission::AnsweredBy;
use crate::budget::{BudgetSpec, BudgetState};
use crate::gateway::error::ApiError;

/// Keeps `refusal` of a request of `tenant` for the budget page's recent
/// refusals ([`crate::gateway::recent_refusals`]); called only on refusals,
/// so admitted requests never pay for it.
pub fn note(cx: &RequestContext, tenant: Option<crate::config::TenantId>, refusal: &ApiError) {
    if let Some(t) = tenant {
        cx.st
            .recent_refusals
            .record(&cx.policy.tenant(t).name, refusal, cx.st.clock.now_micros());
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
