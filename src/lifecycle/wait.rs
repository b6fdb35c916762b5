//! Part of admit: a reservation refused "not now" waits in the
//! gateway's queue ([`crate::queue`]) instead of answering 429, when the
//! request may wait — the refusing budget's kind may wait for its class
//! and its `max_wait` is longer than the store's retry time. Never-fits
//! refusals (larger than a capacity, a quota that resets after
//! `max_wait`) and every other error are answered at once, as without a
//! queue. While anyone waits for one of its budgets, a newcomer joins that
//! line without a store call (it does not overtake the waiters); while no
//! one waits anywhere, this phase adds one atomic load to admit.
//!
//! A request that may wait carries a share claim (tenant, class, weight,
//! and its place in its tenant's order: how long it has waited, what is
//! left) on every reservation: the store weighs it against the waiters of
//! every gateway on a contended deployment and serves each tenant's
//! oldest first (`budget::share`), and a refusal deferred for share
//! moves the turn to another tenant's waiter. Every way out after a wait
//! notes it (`left_queue`): header, final line, metrics.
//!
//! A waiter holds no reservation: it reserves through [`admit::admit`]
//! when the line gives it the turn. When its time runs out it leaves the
//! line and reserves once more outside it, so the 429 it gets is the one it
//! would have had without the queue, with the store's latest answer (or it
//! is admitted, if capacity came at the last moment). A client that goes
//! away drops this future and with it its ticket: no reservation, no
//! upstream call, nothing charged.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName};
use tokio::time::Instant;

use super::admit::{self, Admitted};
use super::context::RequestContext;
use super::prepare::Prepared;
use super::route::Attempts;
use crate::budget::share::{ClaimOrder, ShareClaim, MAX_WAITER_ID};
use crate::budget::{BudgetName, BudgetSpec, Scope};
use crate::config::queue::{Class, QueuePolicy, WaitKind, WAITER_OVERHEAD_BYTES};
use crate::gateway::error::ApiError;
use crate::gateway::PlannedDeployment;
use crate::queue::waiter::{Ended, Ticket};
use crate::queue::{metrics, Joining};

/// The request header lowering a request's class.
pub const PRIORITY_HEADER: HeaderName = HeaderName::from_static("x-budgetgate-priority");
/// The request header lowering a request's `max_wait`, milliseconds.
pub const MAX_WAIT_HEADER: HeaderName = HeaderName::from_static("x-budgetgate-max-wait-ms");
/// The response header of a request that waited: milliseconds in the queue.
pub const QUEUED_HEADER: &str = "x-budgetgate-queued-ms";

/// How a request may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// Its class: the key's, else the tenant's, lowered by the client.
    pub class: Class,
    /// Its longest wait: the class's, lowered by the client.
    pub max_wait: Duration,
}

/// How `request` may wait, or `None` when the gateway has no queue.
pub fn asked(cx: &RequestContext, request: &Prepared, headers: &HeaderMap) -> Option<Asked> {
    let q = cx.policy.queue.as_ref()?;
    let caller = &request.caller;
    let tenant = cx.policy.tenant(caller.tenant);
    let own = cx
        .policy
        .key(caller.tenant, caller.key)
        .priority
        .unwrap_or(tenant.priority);
    let class = match headers
        .get(&PRIORITY_HEADER)
        .map(|v| v.to_str().map(Class::parse))
    {
        None => own,
        Some(Ok(Some(asked))) => own.lowered_to(asked).unwrap_or_else(|kept| {
            tracing::info!(tenant = %tenant.name, class = kept.as_str(), asked = asked.as_str(),
                "x-budgetgate-priority asks for a higher class: ignored");
            kept
        }),
        Some(_) => {
            tracing::info!(tenant = %tenant.name, class = own.as_str(), "x-budgetgate-priority is not a class: ignored");
            own
        }
    };
    let mut max_wait = q.class(class).max_wait;
    if let Some(ms) = headers
        .get(&MAX_WAIT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        max_wait = max_wait.min(Duration::from_millis(ms));
    }
    Some(Asked { class, max_wait })
}

/// Which kind of budget `scope` is for a request of `tenant`.
fn kind(scope: &Scope, tenant: &str) -> WaitKind {
    match scope {
        Scope::Upstream(_) => WaitKind::Upstream,
        Scope::Tenant(t) | Scope::TenantModel(t, _) if &**t != tenant => WaitKind::Parent,
        _ => WaitKind::Own,
    }
}

/// Every budget `request` may reserve on `candidates`.
fn budgets<'a>(
    request: &'a Prepared,
    candidates: &'a [&'a PlannedDeployment],
) -> impl Iterator<Item = &'a BudgetSpec> {
    request
        .plan
        .common
        .iter()
        .chain(request.request_budgets.iter())
        .chain(candidates.iter().flat_map(|d| d.budgets.iter()))
}

/// [`admit::admit`], waiting in the queue as [`asked`] allows.
pub async fn admit<'p>(
    cx: &mut RequestContext,
    request: &Prepared,
    candidates: Vec<&'p PlannedDeployment>,
    attempts: &mut Attempts,
    asked: Option<Asked>,
) -> Result<Admitted<'p>, ApiError> {
    let snapshot = cx.policy.clone();
    let (Some(asked), Some(policy)) = (asked, snapshot.queue.as_ref()) else {
        return admit::admit(cx, request, candidates, attempts).await;
    };
    let queue = cx.st.queue.clone();
    let tenant: &str = &request.plan.requester.tenant;
    let weight = cx
        .policy
        .key(request.caller.tenant, request.caller.key)
        .weight
        .unwrap_or(cx.policy.tenant(request.caller.tenant).weight);
    // The store weighs this tenant's claim on a contended deployment
    // against the other gateways' waiters (`budget::share`).
    cx.share = Some(ShareClaim {
        tenant: request.plan.requester.tenant.clone(),
        rank: asked.class.index() as u8,
        weight,
        order: Some(ClaimOrder {
            id: ClaimOrder::new_id(),
            waited_micros: 0,
            left_micros: micros(asked.max_wait).max(1),
        }),
    });
    let joining = |spec: &BudgetSpec, refused: Option<Duration>, held_for_share| Joining {
        class: asked.class,
        tenant: request.plan.requester.tenant.clone(),
        weight,
        cost: spec.cost(request.estimate.total_tokens),
        bytes: request.raw.len() + WAITER_OVERHEAD_BYTES,
        refused,
        held_for_share,
    };
    let may_wait = |spec: &BudgetSpec, policy: &QueuePolicy| {
        !spec.shadow && policy.may_wait(kind(&spec.scope, tenant), asked.class)
    };
    let mut ticket: Option<Ticket> = None;
    let mut deadline = None;
    // When it first joined a line (it may move to another), and whether
    // the store refused it since.
    let mut since: Option<Instant> = None;
    let mut refused_once = false;
    if queue.is_busy() && !queue.is_closed() {
        let busy = {
            // With several candidates, a busy deployment is no reason to
            // wait: the store picks the first that admits.
            let alone = candidates.len() == 1;
            let keys: Vec<&BudgetSpec> = budgets(request, &candidates)
                .filter(|s| may_wait(s, policy) && (alone || !s.scope.is_upstream()))
                .collect();
            queue
                .busy_line(keys.iter().map(|s| &s.key))
                .and_then(|k| keys.iter().find(|s| &s.key == k).copied())
        };
        if let Some(spec) = busy {
            // Joined without a store call: the Retry-After of a full queue
            // is the line's own retry time.
            let retry = queue.line_retry(&spec.key);
            ticket = Some(join(
                cx,
                spec.key.clone(),
                joining(spec, None, false),
                policy,
                retry,
                None,
            )?);
            deadline = Some(Instant::now() + asked.max_wait);
            since = Some(Instant::now());
        }
    }
    loop {
        if let (Some(t), Some(until)) = (&ticket, deadline) {
            if let Err(ended) = t.turn(until).await {
                drop(ticket.take());
                return match ended {
                    Ended::Closed => {
                        note_wait(cx, since);
                        Err(ApiError::ShuttingDown)
                    }
                    Ended::Deadline => {
                        // The last attempt, outside the line: it gives up
                        // its tenant's place in the store's order too.
                        place(cx, since, Some(until), true);
                        let result = admit::admit(cx, request, candidates, attempts).await;
                        left_queue(cx, tenant, asked.class, since, &result, true);
                        result
                    }
                };
            }
        }
        place(cx, since, deadline, false);
        let result = admit::admit(cx, request, candidates.clone(), attempts).await;
        let (denial, hint) = match &result {
            Ok(_) => {
                if let Some(t) = ticket.take() {
                    t.admitted();
                }
                left_queue(cx, tenant, asked.class, since, &result, false);
                return result;
            }
            Err(ApiError::RateLimited {
                denial,
                concurrency_hint_micros,
                ..
            }) => (denial, *concurrency_hint_micros),
            Err(_) => {
                left_queue(cx, tenant, asked.class, since, &result, false);
                return result;
            }
        };
        let wait = if denial.name == BudgetName::MaxConcurrent {
            hint
        } else {
            denial.retry_after_micros
        };
        let wait = Duration::from_micros(wait);
        let spec = budgets(request, &candidates)
            .find(|s| s.scope == denial.scope && s.name == denial.name && may_wait(s, policy));
        let same_line = spec.is_some_and(|s| ticket.as_ref().is_some_and(|t| *t.key() == s.key));
        let first = !std::mem::replace(&mut refused_once, true);
        let held = denial.held_for_share;
        let refused_in_line = |t: &Ticket| {
            if held {
                t.defer_for_share(wait);
            } else {
                t.refused(wait);
            }
        };
        if same_line && !first {
            if let Some(t) = &ticket {
                refused_in_line(t);
            }
            continue;
        }
        // A first refusal, or by a new line: it must be able to fit within
        // what is left of the wait (else it never fits: answered now).
        let until = deadline.unwrap_or_else(|| Instant::now() + asked.max_wait);
        let left = until.saturating_duration_since(Instant::now());
        let (Some(spec), false) = (spec, queue.is_closed()) else {
            left_queue(cx, tenant, asked.class, since, &result, false);
            return result;
        };
        if wait >= left {
            // Its time runs out before the refusing budget would fit it.
            left_queue(cx, tenant, asked.class, since, &result, true);
            return result;
        }
        if same_line {
            if let Some(t) = &ticket {
                refused_in_line(t);
            }
            continue;
        }
        if let Some(t) = ticket.take() {
            t.leave(true);
        }
        match join(
            cx,
            spec.key.clone(),
            joining(spec, Some(wait), held),
            policy,
            Some(wait),
            since,
        ) {
            Ok(t) => ticket = Some(t),
            Err(full) => return Err(full),
        }
        deadline = Some(until);
        since.get_or_insert_with(Instant::now);
    }
}

/// Sets the share claim's order for the next attempt: how long the
/// request has waited and what is left of its `max_wait` (0 on its
/// `last` attempt).
fn place(cx: &mut RequestContext, since: Option<Instant>, until: Option<Instant>, last: bool) {
    let Some(o) = cx.share.as_mut().and_then(|c| c.order.as_mut()) else {
        return;
    };
    let now = Instant::now();
    o.waited_micros = since.map_or(0, |s| micros(now.saturating_duration_since(s)));
    if last {
        o.left_micros = 0;
    } else if let Some(u) = until {
        o.left_micros = micros(u.saturating_duration_since(now)).max(1);
    }
}

/// `d` in µs, within what a claim's order may carry (`claim_of`).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).map_or(MAX_WAITER_ID, |m| m.min(MAX_WAITER_ID))
}

/// A request that waited (`since`: when it first joined a line) leaves
/// the queue with `result`: the wait goes on its response and final line
/// whatever the answer; an admission and a refusal because its time ran
/// out (`timed_out`) are counted.
fn left_queue<T>(
    cx: &mut RequestContext,
    tenant: &str,
    class: Class,
    since: Option<Instant>,
    result: &Result<T, ApiError>,
    timed_out: bool,
) {
    let Some(since) = since else {
        return;
    };
    let waited = since.elapsed();
    note_wait(cx, Some(since));
    match result {
        Ok(_) => metrics::admitted(class, waited.as_secs_f64()),
        Err(ApiError::RateLimited { .. }) if timed_out => {
            metrics::timed_out(class, waited.as_secs_f64());
            tracing::info!(
                tenant,
                class = class.as_str(),
                waited_ms = waited.as_millis() as u64,
                "queue wait timed out"
            );
        }
        Err(_) => {}
    }
}

/// Joins the line of `key`, or the 429 `queue_full` retrying after
/// `retry` (the refusal's, else the line's retry time; else 1 s). A
/// request that waited already (`since`) has its wait noted.
fn join(
    cx: &mut RequestContext,
    key: std::sync::Arc<str>,
    j: Joining,
    policy: &QueuePolicy,
    retry: Option<Duration>,
    since: Option<Instant>,
) -> Result<Ticket, ApiError> {
    let class = j.class;
    let joined = cx.st.queue.join(key, j, policy);
    joined.map_err(|why| {
        metrics::full(class);
        tracing::info!(class = class.as_str(), full = ?why, "wait queue full");
        note_wait(cx, since);
        ApiError::QueueFull {
            retry_after_micros: retry.map_or(1_000_000, micros).max(1),
        }
    })
}

/// The request's wait so far goes on its response and final line (added
/// to an earlier one: a clamped retry may wait again).
fn note_wait(cx: &mut RequestContext, since: Option<Instant>) {
    if let Some(since) = since {
        let ms = since.elapsed().as_millis() as u64;
        cx.finish.queued_ms = Some(cx.finish.queued_ms.unwrap_or(0) + ms);
    }
}
