//! Part of prepare (docs/MONEY.md): a request under a dollar budget must
//! be priceable, or it is refused (400 `unpriceable_request`, in the
//! dialect's shape) — never admitted unmetered. Priceable means: its
//! deployment has a price (deployments without one are dropped from the
//! candidates; none left → refused), and the body asks for nothing billed
//! beside the token prices: a service tier other than the standard one,
//! a hosted or server tool (a per-use fee), audio (priced per audio
//! token). Only enforced dollar budgets refuse: under shadow ones the
//! request goes on, reported as a shadow denial, and an unpriced
//! deployment costs them 0.
//!
//! Also here: which cache writes a body asks for (Anthropic's
//! `cache_control`), priced at reservation.

use serde_json::Value;

use crate::budget::BudgetSpec;
use crate::config::ModelPolicy;
use crate::dialects::{anthropic, Dialect};
use crate::gateway::error::ApiError;
use crate::gateway::BudgetPlan;
use crate::money::CacheWrites;

/// Standard service tiers: priced by the price table. OpenAI's `auto`
/// and `default` (auto uses the project's default tier, standard unless
/// the project is configured otherwise); Anthropic's `auto` and
/// `standard_only`.
const STANDARD_TIERS: [&str; 3] = ["auto", "default", "standard_only"];

/// Checks that a request under the dollar budgets of `plan` and of its
/// end user (`end_user`) can be priced, and keeps only the `candidates`
/// (positions in `plan.upstreams`) that have a price; returns the cache
/// writes the body asks for.
pub fn check(
    dialect: Dialect,
    body: &Value,
    model: &ModelPolicy,
    plan: &BudgetPlan,
    end_user: &[BudgetSpec],
    candidates: &mut Vec<usize>,
) -> Result<CacheWrites, ApiError> {
    let dollars = |shadow: bool| {
        plan.common
            .iter()
            .chain(end_user)
            .find(|s| s.name.counts_usd() && s.shadow == shadow)
    };
    let (enforced, shadow) = (dollars(false), dollars(true));
    let Some(budget) = enforced.or(shadow) else {
        return Ok(CacheWrites::None);
    };
    let unpriced = if !candidates
        .iter()
        .any(|&i| plan.upstreams[i].price.is_some())
    {
        Some((
            "model".to_string(),
            format!("the model `{}` has no price on this gateway", model.name),
        ))
    } else {
        unpriced_feature(dialect, body, &model.hosted_prices)
    };
    match (unpriced, enforced) {
        (Some((param, what)), Some(budget)) => Err(refusal(budget, param, &what)),
        (Some((_, what)), None) => {
            let tenant = &plan.requester.tenant;
            crate::metrics::shadow_denial(tenant, &budget.scope, budget.name);
            tracing::info!(%tenant, scope = %budget.scope, budget = %budget.name, reason = %what,
                "would refuse as unpriceable (shadow mode); admitted");
            Ok(cache_writes(dialect, body))
        }
        (None, _) => {
            if enforced.is_some() {
                candidates.retain(|&i| plan.upstreams[i].price.is_some());
            }
            Ok(cache_writes(dialect, body))
        }
    }
}

fn refusal(budget: &BudgetSpec, param: String, what: &str) -> ApiError {
    ApiError::Unpriceable {
        param: Some(param),
        message: format!(
            "This request cannot be priced: {what}. It is under the dollar budget {} ({}), and requests under a dollar budget are never admitted unmetered (see the gateway's docs/MONEY.md).",
            budget.scope, budget.name
        ),
    }
}

/// The first thing `body` asks for that the price table does not price
/// (hosted tools priced per use in `hosted` are priced): `(param, what)`.
pub fn unpriced_feature(
    dialect: Dialect,
    body: &Value,
    hosted: &crate::money::HostedPrices,
) -> Option<(String, String)> {
    if let Some(tier) = body.get("service_tier").and_then(Value::as_str) {
        if !STANDARD_TIERS.contains(&tier) {
            return Some((
                "service_tier".into(),
                format!("service tier `{tier}` is billed at its own prices, which this gateway does not have"),
            ));
        }
    }
    match dialect {
        Dialect::Messages => server_tool(body, hosted)
            .or_else(|| anthropic::unmetered_beside_tools(body))
            .filter(|u| *u != anthropic::Unmetered::FileId)
            .map(|u| {
                (
                    u.param().to_string(),
                    format!("{u} are billed per use beside the tokens"),
                )
            }),
        Dialect::Responses => hosted_tool(body, hosted),
        Dialect::Gemini => crate::dialects::gemini::billed_tool(body).map(|t| {
            (
                "tools".to_string(),
                format!("`{t}` is billed per use beside the tokens"),
            )
        }),
        Dialect::ChatCompletions | Dialect::Completions | Dialect::Embeddings => chat_extras(body),
    }
}

/// A Messages server tool not priced in `hosted` (priced by its name
/// without the version date: `web_search_20250305` as `web_search`).
fn server_tool(body: &Value, hosted: &crate::money::HostedPrices) -> Option<anthropic::Unmetered> {
    use crate::money::HostedKind;
    let priced = |ty: &str| {
        HostedKind::of_tool_type(anthropic::server_tool_name(ty))
            .is_some_and(|k| hosted.get(k).is_some())
    };
    anthropic::server_tools(body)
        .any(|(_, ty)| !priced(ty))
        .then_some(anthropic::Unmetered::ServerTool)
}

/// A Responses tool the provider runs and bills per call, wherever it
/// sits (nested in `namespace` groups, in `additional_tools` items).
fn hosted_tool(body: &Value, hosted: &crate::money::HostedPrices) -> Option<(String, String)> {
    use crate::dialects::responses::tools::{class, visit, ToolClass};
    use crate::money::HostedKind;
    let body = body.as_object()?;
    let priced =
        |kind: &str| HostedKind::of_tool_type(kind).is_some_and(|k| hosted.get(k).is_some());
    let found = visit(
        body,
        |path, _, kind| match class(kind) {
            ToolClass::Client | ToolClass::Group => Ok(()),
            ToolClass::Hosted if priced(kind) => Ok(()),
            ToolClass::Hosted | ToolClass::Unknown => Err((
                format!("{path}.type"),
                format!("hosted tool `{kind}` is billed per call beside the tokens"),
            )),
        },
        |deep| (deep.path, "tool groups nested too deep".to_string()),
    );
    found.err()
}

/// Chat Completions features billed beside text tokens: web search (per
/// call), audio output and audio input (audio tokens, at audio prices).
fn chat_extras(body: &Value) -> Option<(String, String)> {
    let present = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if present("web_search_options") {
        return Some((
            "web_search_options".into(),
            "web search is billed per call beside the tokens".into(),
        ));
    }
    let audio_out = present("audio")
        || body
            .get("modalities")
            .and_then(Value::as_array)
            .is_some_and(|m| m.iter().any(|x| x == "audio"));
    if audio_out {
        return Some((
            "modalities".into(),
            "audio output is billed per audio token, at prices this gateway does not have".into(),
        ));
    }
    let messages = body.get("messages").and_then(Value::as_array)?;
    for (i, m) in messages.iter().enumerate() {
        let Some(parts) = m.get("content").and_then(Value::as_array) else {
            continue;
        };
        if parts
            .iter()
            .any(|p| p.get("type").and_then(Value::as_str) == Some("input_audio"))
        {
            return Some((
                format!("messages[{i}].content"),
                "audio input is billed per audio token, at prices this gateway does not have"
                    .into(),
            ));
        }
    }
    None
}

/// The cache writes an Anthropic body asks for: any `cache_control` (on a
/// block, a tool, the system prompt or the whole request), 1 hour if one
/// of them says `ttl: "1h"`. Other dialects bill no writes.
pub fn cache_writes(dialect: Dialect, body: &Value) -> CacheWrites {
    fn walk(v: &Value, found: &mut CacheWrites) {
        match v {
            Value::Object(o) => {
                if let Some(c) = o.get("cache_control").filter(|c| !c.is_null()) {
                    let one_hour = c.get("ttl").and_then(Value::as_str) == Some("1h");
                    *found = if one_hour {
                        CacheWrites::OneHour
                    } else if *found == CacheWrites::None {
                        CacheWrites::FiveMinutes
                    } else {
                        *found
                    };
                }
                o.values().for_each(|x| walk(x, found));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, found)),
            _ => {}
        }
    }
    let mut found = CacheWrites::None;
    if dialect.is_anthropic() {
        walk(body, &mut found);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn standard_tiers_and_plain_bodies_are_priced() {
        for body in [
            json!({"messages": []}),
            json!({"messages": [], "service_tier": "auto"}),
            json!({"messages": [], "service_tier": "default"}),
            json!({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}),
        ] {
            assert_eq!(
                unpriced_feature(Dialect::ChatCompletions, &body, &Default::default()),
                None,
                "{body}"
            );
        }
        let tier = json!({"input": "hi", "service_tier": "flex"});
        assert_eq!(
            unpriced_feature(Dialect::Responses, &tier, &Default::default())
                .unwrap()
                .0,
            "service_tier"
        );
        let prio = json!({"messages": [], "service_tier": "priority"});
        assert_eq!(
            unpriced_feature(Dialect::Messages, &prio, &Default::default())
                .unwrap()
                .0,
            "service_tier"
        );
        let standard = json!({"messages": [], "service_tier": "standard_only"});
        assert_eq!(
            unpriced_feature(Dialect::Messages, &standard, &Default::default()),
            None
        );
    }

    #[test]
    fn per_use_fees_are_not_priced() {
        let web = json!({"input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]});
        assert_eq!(
            unpriced_feature(Dialect::Responses, &web, &Default::default())
                .unwrap()
                .0,
            "tools[1].type"
        );
        let server = json!({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert_eq!(
            unpriced_feature(Dialect::Messages, &server, &Default::default())
                .unwrap()
                .0,
            "tools"
        );
        let client =
            json!({"messages": [], "tools": [{"name": "get_weather", "input_schema": {}}]});
        assert_eq!(
            unpriced_feature(Dialect::Messages, &client, &Default::default()),
            None
        );
        let search = json!({"messages": [], "web_search_options": {}});
        assert_eq!(
            unpriced_feature(Dialect::ChatCompletions, &search, &Default::default())
                .unwrap()
                .0,
            "web_search_options"
        );
        let audio = json!({"messages": [], "modalities": ["text", "audio"]});
        assert_eq!(
            unpriced_feature(Dialect::ChatCompletions, &audio, &Default::default())
                .unwrap()
                .0,
            "modalities"
        );
        let heard = json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]});
        assert_eq!(
            unpriced_feature(Dialect::ChatCompletions, &heard, &Default::default())
                .unwrap()
                .0,
            "messages[0].content"
        );
    }

    #[test]
    fn cache_control_asks_for_writes_of_its_ttl() {
        let none = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(cache_writes(Dialect::Messages, &none), CacheWrites::None);
        let five = json!({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}], "messages": []});
        assert_eq!(
            cache_writes(Dialect::Messages, &five),
            CacheWrites::FiveMinutes
        );
        let hour = json!({"cache_control": {"type": "ephemeral"}, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]});
        assert_eq!(cache_writes(Dialect::Messages, &hour), CacheWrites::OneHour);
        // OpenAI bills no cache writes.
        assert_eq!(
            cache_writes(Dialect::ChatCompletions, &five),
            CacheWrites::None
        );
    }
}
