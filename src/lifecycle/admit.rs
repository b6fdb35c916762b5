//! Phase 4, admit (DESIGN section 1.5): one atomic reservation across the
//! tenant's budgets and the first candidate deployment whose budgets admit
//! it. The deny cache and the failure policy are layers of the store
//! ([`crate::admission::GatewayStore`]), not branches here.

use std::sync::Arc;

use super::context::RequestContext;
use super::prepare::Prepared;
use super::route::Attempts;
use crate::admission::amounts::{self, Budgets, Counting, Demand};
use crate::admission::expected::{ExpectedTicket, Output};
use crate::admission::HeldReservation;
use crate::budget::{Admission, BudgetName, BudgetSpec, ReserveOutcome, ReserveRequest};
use crate::gateway::error::ApiError;
use crate::gateway::{BudgetPlan, PlannedDeployment};
use crate::metrics;
use crate::money::PriceTable;
use crate::settlement::{Returned, Subject, Who};

/// An admitted attempt.
pub struct Admitted<'p> {
    /// The reservation, settled on every exit path.
    pub hold: HeldReservation,
    /// What the store said (budget states for the rate-limit headers).
    pub admission: Admission,
    /// The deployment chosen.
    pub deployment: &'p PlannedDeployment,
    /// The budgets the hold debited.
    pub budgets: HoldBudgets,
}

/// The budgets a hold debited, in the store's order: the common ones this
/// attempt reserved, then the chosen deployment's; how each counts; and
/// what an extension pays per budget.
pub struct HoldBudgets {
    common: Vec<BudgetSpec>,
    common_counting: Vec<Counting>,
    plan: Arc<BudgetPlan>,
    /// Position of the chosen deployment in `plan.upstreams`.
    deployment: usize,
    /// Units per `RATE_ONE` output tokens an extension debits, per spec.
    rates: Vec<u64>,
    /// What an expected-mode reservation's settlement records.
    expected: Option<ExpectedTicket>,
}

impl HoldBudgets {
    /// The deployment the hold was admitted on.
    pub fn deployment(&self) -> crate::config::DeploymentId {
        self.plan.upstreams[self.deployment].upstream
    }

    /// The metric handles of the deployment the hold was admitted on.
    pub fn deployment_metrics(&self) -> &crate::metrics::DeploymentMetrics {
        &self.plan.upstreams[self.deployment].metrics
    }

    /// Every budget of the hold, in order: the common ones, then the
    /// deployment's, each with how it counts.
    pub fn budgets(&self) -> impl Iterator<Item = Budgets<'_>> {
        let d = &self.plan.upstreams[self.deployment];
        [
            Budgets {
                specs: &self.common,
                counting: &self.common_counting,
            },
            Budgets {
                specs: &d.budgets,
                counting: &d.counting,
            },
        ]
        .into_iter()
    }

    /// What an extension pays per budget (see [`amounts::extension_rates`]).
    pub fn rates(&self) -> &[u64] {
        &self.rates
    }

    /// Records the settled `output` of an expected-mode reservation (in
    /// its window when `answered`: neither cut off nor failed).
    pub fn expected_settled(&self, output: u64, answered: bool) {
        if let Some(t) = &self.expected {
            t.settled(output, answered);
        }
    }

    /// The prices the hold was admitted under (its plan's policy, not the
    /// one a reload brought since).
    pub fn price(&self) -> Option<&PriceTable> {
        self.plan.upstreams[self.deployment].price.as_deref()
    }
}

/// Reserves the request's estimate against its budgets and the first
/// admitting candidate.
pub async fn admit<'p>(
    cx: &mut RequestContext,
    request: &Prepared,
    candidates: Vec<&'p PlannedDeployment>,
    attempts: &mut Attempts,
) -> Result<Admitted<'p>, ApiError> {
    let policy = &*cx.policy;
    let plan = &request.plan;
    // The plan's budgets, then the end user's. A retry on another
    // deployment is the same client request: its request count is already spent.
    let first = attempts.count() == 0;
    let (common, common_counting): (Vec<BudgetSpec>, Vec<Counting>) = plan
        .common
        .iter()
        .zip(plan.common_counting.iter())
        .chain(
            request
                .request_budgets
                .iter()
                .zip(request.request_counting.iter()),
        )
        .filter(|(s, _)| {
            first
                || s.name.counts_tokens()
                || s.name.counts_usd()
                || s.name == BudgetName::MaxConcurrent
        })
        .map(|(s, c)| (s.clone(), *c))
        .unzip();
    let id = cx.finish.request_id.reservation_id(first);
    let model = policy.model_at(request.model);
    let e = &plan.expected;
    let choices = request.estimate.choices.max(1);
    let mut demand = Demand {
        cache_writes: request.cache,
        hosted: request.hosted,
        ..Demand::of(&request.estimate)
    };
    // Output not metered as it streams: an uncapped answer may run to its
    // bound, which the tenant's budgets hold unless the exposure lowers it.
    let unmetered = !request.stream || request.never_extend;
    let uncapped = request.uncapped_bound(model).filter(|_| unmetered);
    let bound = uncapped.map(|b| b.per_choice);
    // What an uncapped request reserves, per choice: what
    // `output_reservation` says (the default output, lowered to the room;
    // or the expected output), never above the bound.
    let reserved = bound.map(|b| {
        let estimated = request.estimate.output_tokens_per_choice;
        let r = match e.expected_mode() && !request.estimate.lowered_default {
            true => e.expected_per_choice(b),
            false => estimated,
        };
        r.min(b)
    });
    if let Some(b) = bound {
        demand.output = b.saturating_mul(choices);
    }
    let common_budgets = Budgets {
        specs: &common,
        counting: &common_counting,
    };
    let cost_of = |demand: &Demand| {
        amounts::reserve_costs(
            demand,
            common_budgets,
            candidates.iter().map(|d| {
                let budgets = Budgets {
                    specs: &d.budgets,
                    counting: &d.counting,
                };
                (budgets, d.price.as_deref())
            }),
        )
    };
    let mut costs = cost_of(&demand);
    let output = Output {
        cap: demand.output,
        choices: request.estimate.choices,
    };
    let (exposure, expected) = match reserved {
        Some(r) => {
            // The tenant's rows at the bound, lowered to the reservation
            // within `max_exposure`; the deployments' at the reservation
            // when no cap is sent (what a provider counts at request start).
            if uncapped.is_some_and(|b| !b.sent) {
                let at_reservation = cost_of(&Demand {
                    output: r.saturating_mul(choices),
                    ..demand
                });
                for (row, low) in costs
                    .per_candidate
                    .iter_mut()
                    .zip(&at_reservation.per_candidate)
                {
                    for (a, l) in row.iter_mut().zip(low).skip(common.len()) {
                        *a = *l;
                    }
                }
            }
            let (guard, ticket) = e.lower_to(output, r, common_budgets, &mut costs);
            (Some(guard), Some(ticket))
        }
        // Opt-in only: in "cap" mode a capped request looks nothing up.
        None if unmetered && e.expected_mode() => {
            let (guard, ticket) = e.lower(output, common_budgets, &mut costs);
            (Some(guard), Some(ticket))
        }
        None => (None, None),
    };
    // A run's record travels with the request's requester: allocated only
    // for requests of a run.
    let requester = match &request.run {
        None => plan.requester.clone(),
        Some((_, record)) => Arc::new(crate::budget::Requester {
            run: Some(record.clone()),
            ..(*plan.requester).clone()
        }),
    };
    let reserve = ReserveRequest {
        share: cx.share.clone(),
        id: id.clone(),
        costs,
        common,
        candidates: candidates.iter().map(|d| d.budgets.clone()).collect(),
        slot_lease_micros: policy.server.slot_lease.as_micros() as u64,
        hold_ttl_micros: (policy.server.max_request + policy.server.settle_retry).as_micros()
            as u64,
        requester,
    };
    let (outcome, answered_by) = cx.st.store.reserve_answered(&reserve).await?;
    cx.answered_by = Some(answered_by);
    cx.finish.decided_by = answered_by.label();
    let admission = match outcome {
        ReserveOutcome::Admitted(a) => a,
        ReserveOutcome::Denied(denial) => {
            cx.refused = Some(super::refusal::Asked::of(
                &reserve,
                &demand,
                &request.estimate,
                &denial.scope,
                denial.name,
            ));
            tracing::info!(tenant = %plan.requester.tenant, end_user = request.end_user.as_deref().unwrap_or(""), scope = %denial.scope, budget = %denial.name, retry_after_us = denial.retry_after_micros, held_for_share = denial.held_for_share, policy_version = %policy.version, "denied");
            return Err(ApiError::RateLimited {
                headers: cx.dialect.rate_limit_headers(
                    std::slice::from_ref(&denial.state),
                    cx.st.clock.now_micros(),
                ),
                denial: Box::new(denial),
                concurrency_hint_micros: policy.server.concurrency_retry.as_micros() as u64,
            });
        }
        ReserveOutcome::Impossible(i) => {
            cx.refused = Some(super::refusal::Asked::of(
                &reserve,
                &demand,
                &request.estimate,
                &i.scope,
                i.name,
            ));
            return Err(ApiError::Impossible(Box::new(i)));
        }
        // A fresh id is never voided; answered as the store failure it stands for.
        ReserveOutcome::Voided => {
            return Err(crate::budget::StoreError::Unavailable("reservation voided".into()).into())
        }
        ReserveOutcome::RunConflict(run) => {
            tracing::info!(tenant = %plan.requester.tenant, scope = %run, policy_version = %policy.version, "run conflict");
            return Err(ApiError::RunConflict { run });
        }
    };
    let deployment = candidates[admission.candidate];
    attempts.tried(deployment.upstream);
    plan.tenant_metrics.admitted(reserve.costs.tokens);
    for w in &admission.would_deny {
        metrics::shadow_denial(&plan.requester.tenant, &w.scope, w.name);
        tracing::info!(reservation_id = %id, tenant = %plan.requester.tenant, scope = %w.scope, budget = %w.name,
            policy_version = %policy.version, "would deny (shadow mode); admitted");
    }
    cx.finish.deployment = Some(deployment.upstream);
    cx.finish.reservation_id = Some(id.clone());
    let hold = HeldReservation::new(
        id,
        (cx.st.store.clone(), answered_by),
        reserve.common.iter().chain(deployment.budgets.iter()),
        cx.st.settlements.clone(),
        reserve.costs.tokens,
        policy.server.slot_lease,
        policy.server.settle_retry,
    )
    .with_amounts(
        reserve
            .costs
            .per_candidate
            .get(admission.candidate)
            .cloned()
            .unwrap_or_default(),
    );
    let deployment_index = plan
        .upstreams
        .iter()
        .position(|d| d.upstream == deployment.upstream)
        .unwrap_or(0);
    // Who and what are drafted only while a row or a span will be made of them.
    let spans = cx.st.spans.get().is_some();
    let who = (spans || cx.st.ledger.get().is_some()).then(|| {
        let usd_index = reserve
            .common
            .iter()
            .chain(deployment.budgets.iter())
            .position(|s| s.name.counts_usd());
        let who = Who::new(
            plan.ledger.clone(),
            deployment_index,
            cx.dialect,
            request.end_user.clone(),
            usd_index,
        )
        .admitted_at(match spans {
            // A span's start; without telemetry the clock is not read.
            true => cx.st.clock.now_micros(),
            false => 0,
        })
        // `tried` above counted this attempt.
        .of_request(cx.finish.request_id.header(), attempts.count() as u32)
        .of_run(request.run.as_ref().map(|(id, _)| id.clone()))
        .decided_by(answered_by.label());
        Box::new(who)
    });
    let hold = hold.about(Subject {
        tenant: Some(plan.tenant_metrics.clone()),
        release: Some(if request.request_budgets.is_empty() {
            plan.deny_release.clone()
        } else {
            Arc::new(plan.deny_release.with(&request.request_budgets))
        }),
        returned: policy
            .queue
            .is_some()
            .then(|| capacity_returned(plan.clone(), admission.candidate, &candidates)),
        who,
        until_settled: exposure.map(|g| Box::new(g) as Box<dyn std::any::Any + Send + Sync>),
    });
    let rates = amounts::extension_rates(
        &demand,
        [
            Budgets {
                specs: &reserve.common,
                counting: &common_counting,
            },
            Budgets {
                specs: &deployment.budgets,
                counting: &deployment.counting,
            },
        ]
        .into_iter(),
        deployment.price.as_deref(),
    );
    let budgets = HoldBudgets {
        deployment: deployment_index,
        plan: plan.clone(),
        common: reserve.common,
        common_counting,
        rates,
        expected,
    };
    Ok(Admitted {
        hold,
        admission,
        deployment,
        budgets,
    })
}

/// The budgets a settlement of a hold on `plan` and `candidates[chosen]`
/// returns capacity to, for the wait queue (a line waiting for one of them
/// tries again). Built only when the gateway has a queue.
fn capacity_returned(
    plan: Arc<BudgetPlan>,
    chosen: usize,
    candidates: &[&PlannedDeployment],
) -> Arc<dyn Returned> {
    let deployment = candidates
        .get(chosen)
        .and_then(|d| plan.upstreams.iter().position(|p| p.upstream == d.upstream));
    Arc::new(CapacityOf { plan, deployment })
}

/// A hold's plan and its deployment's position in it.
struct CapacityOf {
    plan: Arc<BudgetPlan>,
    deployment: Option<usize>,
}

impl Returned for CapacityOf {
    fn each(&self, refunded: u64, key: &mut dyn FnMut(&str)) {
        let plan = &self.plan;
        let upstream = self
            .deployment
            .map(|d| &plan.upstreams[d].budgets[..])
            .unwrap_or(&[]);
        // A settlement frees the slots; it returns tokens (and dollars) only
        // when it refunded some: other lines would try in vain.
        let returned = |s: &&BudgetSpec| {
            s.name == BudgetName::MaxConcurrent
                || (refunded > 0 && (s.name.counts_tokens() || s.name.counts_usd()))
        };
        for s in plan.common.iter().chain(upstream).filter(returned) {
            key(&s.key);
        }
    }
}

/// A reservation of `plan`'s common budgets that `keep` selects, each
/// charged one request and no tokens: for routes that call no model
/// (`count_tokens`, the stored-response routes).
pub fn request_count_reservation(
    cx: &RequestContext,
    plan: &crate::gateway::BudgetPlan,
    keep: impl Fn(&BudgetSpec) -> bool,
) -> ReserveRequest {
    let policy = &*cx.policy;
    let common: Vec<BudgetSpec> = plan.common.iter().filter(|s| keep(s)).cloned().collect();
    ReserveRequest {
        share: None,
        id: cx.finish.request_id.reservation_id(true),
        costs: amounts::reserve_costs(
            &Demand::default(),
            Budgets::plain(&common),
            std::iter::once((Budgets::plain(&[]), None)),
        ),
        common,
        candidates: vec![Vec::new()],
        slot_lease_micros: policy.server.slot_lease.as_micros() as u64,
        hold_ttl_micros: (policy.server.max_request + policy.server.settle_retry).as_micros()
            as u64,
        requester: plan.requester.clone(),
    }
}
