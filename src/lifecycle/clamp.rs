//! Affordable caps instead of refusals (`on_short_output = "clamp"`,
//! DESIGN decisions): a request the store refused for want of output room
//! is admitted once more with its output cap lowered to what the refusal
//! says fits. The refusal is the store's answer now (its `requested` and
//! `available`, or the capacity of a request that can never fit), so the
//! room needs no extra store call and is the same for every store; the
//! second reservation is the only other call, and a request is clamped at
//! most once. Requests of tenants that do not clamp never reach this.

use axum::http::HeaderValue;
use axum::response::Response;

use super::context::RequestContext;
use super::meter::Metered;
use super::prepare::Prepared;
use crate::budget::BudgetName;
use crate::config::OnShortOutput;
use crate::estimate::{fit_output, Estimate, TokenRoom};
use crate::gateway::error::ApiError;

/// The header that reports a lowered cap (per choice).
pub const CLAMPED_HEADER: &str = "x-budgetgate-output-clamped";

/// The estimate with its output cap lowered to fit the budget `refusal`
/// names, when the tenant clamps, the request was not clamped yet, and a
/// cap of at least the model's minimum fits; `None`: the refusal stands.
pub fn clamped(cx: &RequestContext, request: &Prepared, refusal: &ApiError) -> Option<Estimate> {
    let policy = &cx.policy;
    if request.clamp_retried
        || policy.tenant(request.caller.tenant).on_short_output != OnShortOutput::Clamp
    {
        return None;
    }
    let (name, requested, available) = match refusal {
        ApiError::RateLimited { denial, .. } => (denial.name, denial.requested, denial.available),
        ApiError::Impossible(i) => (
            i.name,
            i.requested,
            i64::try_from(i.capacity).unwrap_or(i64::MAX),
        ),
        _ => return None,
    };
    let e = &request.estimate;
    if e.output_tokens == 0 {
        return None;
    }
    // What the refused amount is over the budget, in its own tokens: the
    // reserved output less that is the output room left.
    let over = u64::try_from(i128::from(requested) - i128::from(available)).ok()?;
    let output_room = e.output_tokens.checked_sub(over)?;
    let room = match name {
        BudgetName::Tpm | BudgetName::TokensPerDay | BudgetName::TokensPerMonth => {
            TokenRoom::total(Some(e.input_tokens.saturating_add(output_room)))
        }
        BudgetName::OutputTpm => TokenRoom {
            total: None,
            output: Some(output_room),
        },
        // Input, requests, slots: a smaller cap frees nothing there.
        // Dollars: not clamped yet (refused as before).
        _ => return None,
    };
    let min = policy.min_output_tokens.max(cx.dialect.min_cap());
    let (per_choice, lowered) = fit_output(
        e.input_tokens,
        e.choices,
        e.output_tokens_per_choice,
        min,
        room,
    )
    .ok()?;
    if !lowered {
        return None;
    }
    Some(with_cap(e, per_choice))
}

/// `e` with the client's cap `per_choice` (reserved whole).
fn with_cap(e: &Estimate, per_choice: u64) -> Estimate {
    let output_tokens = e.choices.max(1).saturating_mul(per_choice);
    Estimate {
        output_tokens_per_choice: per_choice,
        output_tokens,
        total_tokens: e.input_tokens.saturating_add(output_tokens),
        client_max_output: Some(per_choice),
        ..e.clone()
    }
}

/// Lowers a client cap larger than the budgets' capacities (`room`, the
/// plan's: no store call) to what they hold, as the uncapped default is;
/// true when it did. A cap that cannot fit even at `min` is left for the
/// store to refuse.
pub fn to_capacity(e: &mut Estimate, room: TokenRoom, min: u64) -> bool {
    let Some(cap) = e.client_max_output else {
        return false;
    };
    match fit_output(e.input_tokens, e.choices, cap, min, room) {
        Ok((per_choice, true)) => {
            *e = with_cap(e, per_choice);
            true
        }
        _ => false,
    }
}

/// Says on the client's response that its cap was lowered.
pub fn mark(metered: Metered, request: &Prepared) -> Metered {
    if !request.clamped {
        return metered;
    }
    let cap = request.estimate.output_tokens_per_choice;
    let add = |mut r: Response| {
        r.headers_mut()
            .insert(CLAMPED_HEADER, HeaderValue::from(cap));
        r
    };
    match metered {
        Metered::Answered(r, settled) => Metered::Answered(add(r), settled),
        Metered::Streaming(r) => Metered::Streaming(add(r)),
        other => other,
    }
}
