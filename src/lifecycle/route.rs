//! Phase 3, route (DESIGN section 1.3): the deployments this attempt may
//! use, in preference order: the model's deployments that can serve the
//! request, minus those already tried, those without credentials and
//! those cooling down (after an upstream 429, or a refusal of the
//! gateway's credentials), ordered by spare capacity when the model asks
//! for it.

use super::context::RequestContext;
use super::prepare::Prepared;
use crate::budget::{BudgetName, BudgetSpec};
use crate::config::{DeploymentId, Routing, UpstreamKind};
use crate::gateway::error::{retry_after_secs, ApiError};
use crate::gateway::{CoolingReason, PlannedDeployment};

/// Most deployments one request is tried on (first attempt included).
const MAX_ATTEMPTS: usize = 3;

/// The attempts made so far.
#[derive(Default)]
pub struct Attempts {
    tried: Vec<DeploymentId>,
    last_error: Option<ApiError>,
    /// A deployment refused the gateway's credentials.
    denied: bool,
}

impl Attempts {
    /// How many attempts were made.
    pub fn count(&self) -> usize {
        self.tried.len()
    }

    /// Records an attempt on `deployment`.
    pub fn tried(&mut self, deployment: DeploymentId) {
        self.tried.push(deployment);
    }

    /// Records that the last attempt failed before any output with `e`.
    pub fn failed(&mut self, e: ApiError) {
        self.last_error = Some(e);
    }

    /// Records that the last attempt's deployment refused the gateway's
    /// credentials (`e`); false when one already did in this request: a
    /// refusal is retried on the next deployment once per request.
    pub fn denied(&mut self, e: ApiError) -> Result<(), ApiError> {
        if std::mem::replace(&mut self.denied, true) {
            return Err(e);
        }
        self.last_error = Some(e);
        Ok(())
    }
}

/// The deployments of this attempt, best first; an error when none is left.
pub async fn route<'p>(
    cx: &RequestContext,
    request: &'p Prepared,
    attempts: &mut Attempts,
) -> Result<Vec<&'p PlannedDeployment>, ApiError> {
    if attempts.count() >= MAX_ATTEMPTS.min(request.candidates.len()) {
        return Err(attempts.last_error.take().unwrap_or_else(|| {
            ApiError::BadGateway("No upstream deployment could serve the request.".into())
        }));
    }
    let now = cx.st.clock.now_micros();
    let mut cooling_until: Option<u64> = None;
    // Deployments without usable credentials: not loaded (skipped at
    // start or reload) or refused by the provider (cooling down).
    let mut unusable: Vec<&str> = Vec::new();
    let mut candidates: Vec<&PlannedDeployment> = request
        .candidates
        .iter()
        .map(|&i| &request.plan.upstreams[i])
        .filter(|d| !attempts.tried.contains(&d.upstream))
        .filter(|d| {
            let u = cx.policy.deployment(d.upstream);
            let skipped = match u.kind {
                UpstreamKind::Vertex => cx.st.upstream.vertex_tokens().is_skipped(u),
                UpstreamKind::Bedrock => cx.st.upstream.aws.is_skipped(u),
                _ => false,
            };
            if skipped {
                unusable.push(&u.name);
                return false;
            }
            match cx.st.cooldown(&u.name, now) {
                Some(c) if c.reason == CoolingReason::AccessDenied => {
                    unusable.push(&u.name);
                    false
                }
                Some(c) => {
                    cooling_until = Some(cooling_until.map_or(c.until, |m| m.min(c.until)));
                    false
                }
                None => true,
            }
        })
        .collect();
    if candidates.is_empty() {
        if let Some(e) = attempts.last_error.take() {
            return Err(e);
        }
        if !unusable.is_empty() && cooling_until.is_none() {
            // Waiting would not help: never a rate limit.
            return Err(ApiError::BadGateway(format!(
                "No deployment of this model has usable credentials: {} (see /readyz).",
                unusable.join(", ")
            )));
        }
        let wait = cooling_until.map_or(1_000_000, |u| u.saturating_sub(now));
        return Err(ApiError::UpstreamRateLimited {
            retry_after_secs: Some(retry_after_secs(wait)),
        });
    }
    let model = cx.policy.model_at(request.model);
    if model.routing == Routing::LeastUtilised && candidates.len() > 1 {
        order_by_spare_capacity(cx, &mut candidates).await;
    }
    Ok(candidates)
}

/// Sorts candidates by the spare share (remaining/limit) of their tightest
/// token bucket, most spare first; deployments without one come first. A
/// failed read keeps the configured order.
async fn order_by_spare_capacity(cx: &RequestContext, candidates: &mut [&PlannedDeployment]) {
    let specs: Vec<BudgetSpec> = candidates
        .iter()
        .flat_map(|d| {
            d.budgets
                .iter()
                .filter(|b| b.name == BudgetName::Tpm)
                .cloned()
        })
        .collect();
    let Ok(Ok(states)) = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        cx.st.store.inspect(&specs),
    )
    .await
    else {
        return;
    };
    // Spare share as a fraction in parts per million, per candidate (1e6 = unlimited).
    let share = |d: &PlannedDeployment| -> i64 {
        d.budgets
            .iter()
            .filter(|b| b.name == BudgetName::Tpm)
            .filter_map(|b| {
                states
                    .iter()
                    .find(|s| s.scope == b.scope && s.name == b.name)
            })
            .map(|s| s.remaining.max(0) * 1_000_000 / s.limit.max(1) as i64)
            .min()
            .unwrap_or(1_000_000)
    };
    candidates.sort_by_key(|c| std::cmp::Reverse(share(c)));
}
