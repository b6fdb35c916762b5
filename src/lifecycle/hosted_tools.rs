//! Provider-side tools in a request (DESIGN, MONEY.md "Hosted tools"):
//! which a model allows, the calls a body may make and reserves for
//! (Responses hosted tools, Messages server tools), and the count each
//! sends upstream, lowered to the model's maximum and never raised.

use serde_json::Value;

use super::owner;
use super::prepare::invalid;
use crate::config::ModelPolicy;
use crate::dialects::anthropic;
use crate::gateway::error::ApiError;

/// The uses of priced hosted tools a Responses body may make, and the
/// `max_tool_calls` that bounds them upstream: the model's maximum, or the
/// client's value when lower (never raised). Per-call and per-image tools
/// reserve that many uses; a per-session tool one session. `(empty,
/// None)` when the body uses no priced hosted tool.
pub(super) fn hosted_demand(
    model: &ModelPolicy,
    body: &Value,
) -> (crate::money::HostedCalls, Option<u64>) {
    use crate::dialects::responses::tools::visit;
    use crate::money::{HostedCalls, HostedKind, Per};
    let mut uses = HostedCalls::default();
    if model.hosted_prices.is_empty() {
        return (uses, None);
    }
    let Some(obj) = body.as_object() else {
        return (uses, None);
    };
    let mut kinds: Vec<HostedKind> = Vec::new();
    let _ = visit(
        obj,
        |_, _, kind| {
            if let Some(k) = HostedKind::of_tool_type(kind) {
                if model.hosted_prices.get(k).is_some() && !kinds.contains(&k) {
                    kinds.push(k);
                }
            }
            Ok::<(), ()>(())
        },
        |_| (),
    );
    if kinds.is_empty() {
        return (uses, None);
    }
    let calls = lowered(body.get("max_tool_calls"), model);
    let n = u32::try_from(calls).unwrap_or(u32::MAX);
    for k in kinds {
        uses.add(
            k,
            if k.unit() == Per::Session {
                n.min(1)
            } else {
                n
            },
        );
    }
    (uses, Some(calls))
}

/// Refuses a Messages server tool `model` does not allow in
/// `hosted_tools` (by its name without the version date, or its whole
/// type), naming its path and quoting the line that would allow it.
pub(super) fn server_tools_allowed(model: &ModelPolicy, body: &Value) -> Result<(), ApiError> {
    let listed = |t: &str| model.hosted_tools.iter().any(|h| h == t);
    let refused = anthropic::server_tools(body)
        .find(|(_, ty)| !listed(ty) && !listed(anthropic::server_tool_name(ty)));
    let Some((i, ty)) = refused else {
        return Ok(());
    };
    let param = format!("tools[{i}].type");
    Err(invalid(
        Some(&param),
        format!(
            "`{param}`: server tools are not enabled for model `{}` on this gateway: `{ty}` runs on the provider's side, billed beside the token usage the gateway meters. An operator allows it with this line in the model's entry: {}",
            model.name,
            owner::allowing_line(model, anthropic::server_tool_name(ty))
        ),
    ))
}

/// The most calls a Messages server tool `tool` may make: its `max_uses`
/// lowered to the model's maximum (never raised), the maximum when absent.
pub fn server_tool_max_uses(model: &ModelPolicy, tool: &Value) -> u64 {
    lowered(tool.get("max_uses"), model)
}

/// A client's count of provider-side calls (`max_tool_calls`, `max_uses`)
/// lowered to the model's maximum, never raised; the maximum when absent.
fn lowered(client: Option<&Value>, model: &ModelPolicy) -> u64 {
    match client.and_then(Value::as_u64) {
        Some(n) => n.min(model.max_tool_calls),
        None => model.max_tool_calls,
    }
}

/// The kind of a Messages server tool `type` when `model` prices it.
pub fn priced_server_tool(model: &ModelPolicy, ty: &str) -> Option<crate::money::HostedKind> {
    crate::money::HostedKind::of_tool_type(anthropic::server_tool_name(ty))
        .filter(|&k| model.hosted_prices.get(k).is_some())
}

/// The calls of priced server tools a Messages body may make, each tool
/// its [`server_tool_max_uses`], and their sum (`None` when the body uses
/// no priced server tool).
pub(super) fn server_tool_demand(
    model: &ModelPolicy,
    body: &Value,
) -> (crate::money::HostedCalls, Option<u64>) {
    let mut uses = crate::money::HostedCalls::default();
    if model.hosted_prices.is_empty() {
        return (uses, None);
    }
    let mut total: Option<u64> = None;
    for (i, ty) in anthropic::server_tools(body) {
        let Some(kind) = priced_server_tool(model, ty) else {
            continue;
        };
        let n = server_tool_max_uses(model, &body["tools"][i]);
        uses.add(kind, u32::try_from(n).unwrap_or(u32::MAX));
        total = Some(total.unwrap_or(0).saturating_add(n));
    }
    (uses, total)
}
