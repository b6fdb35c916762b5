//! The attributes of a request span: GenAI semantic-convention names
//! (<https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/>)
//! for what the conventions name, `budgetgate.*` for the rest.

use opentelemetry::KeyValue;

use super::SpanFacts;
use crate::config::UpstreamKind;
use crate::ledger::SpendRow;

/// `gen_ai.operation.name` of a ledger dialect: the conventions' well-known
/// values (`chat`, `text_completion`, `embeddings`).
pub fn operation_name(dialect: &str) -> &'static str {
    match dialect {
        "completions" => "text_completion",
        "embeddings" => "embeddings",
        _ => "chat",
    }
}

/// `gen_ai.provider.name` of a deployment kind: the conventions'
/// well-known values where one fits; a self-hosted OpenAI-compatible
/// server has none, and is named for what it is.
pub fn provider_name(kind: UpstreamKind) -> &'static str {
    match kind {
        UpstreamKind::Openai => "openai",
        UpstreamKind::Azure => "azure.ai.openai",
        UpstreamKind::Anthropic => "anthropic",
        UpstreamKind::SelfHosted => "self_hosted",
    }
}

fn int(name: &'static str, v: u64) -> KeyValue {
    KeyValue::new(name, v.min(i64::MAX as u64) as i64)
}

/// Every attribute of the span of `row`.
pub(super) fn of(row: &SpendRow, facts: &SpanFacts<'_>) -> Vec<KeyValue> {
    // The conventions count cached input inside the input tokens and
    // break it out beside them; the ledger keeps them apart.
    let input = row.input_tokens + row.cached_read_tokens + row.cache_write_tokens;
    let mut a = vec![
        KeyValue::new("gen_ai.operation.name", operation_name(row.dialect)),
        KeyValue::new("gen_ai.provider.name", facts.provider),
        KeyValue::new("gen_ai.system", facts.provider),
        KeyValue::new("gen_ai.request.model", row.model.to_string()),
        KeyValue::new("gen_ai.response.model", facts.upstream_model.to_string()),
        int("gen_ai.usage.input_tokens", input),
        int("gen_ai.usage.output_tokens", row.output_tokens),
        int(
            "gen_ai.usage.cache_read.input_tokens",
            row.cached_read_tokens,
        ),
        int(
            "gen_ai.usage.cache_creation.input_tokens",
            row.cache_write_tokens,
        ),
        int("budgetgate.cost_usd_micros", row.cost_micros),
        int("budgetgate.charged_tokens", row.charged_tokens),
        int("budgetgate.reasoning_tokens", row.reasoning_tokens),
        KeyValue::new("budgetgate.tenant", row.tenant.to_string()),
        KeyValue::new("budgetgate.key", row.key_id.to_string()),
        KeyValue::new("budgetgate.outcome", row.outcome.as_str()),
        KeyValue::new("budgetgate.deployment", row.deployment.to_string()),
        KeyValue::new("budgetgate.dialect", row.dialect),
        KeyValue::new("budgetgate.reservation_id", row.reservation_id.clone()),
        KeyValue::new("budgetgate.price_version", row.price_version.to_string()),
    ];
    if let Some(eu) = &row.end_user {
        a.push(KeyValue::new("budgetgate.end_user", eu.to_string()));
    }
    a
}
