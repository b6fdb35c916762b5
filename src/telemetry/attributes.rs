//! The attributes of a request span: GenAI semantic-convention names
//! (<https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/>)
//! for what the conventions name, `budgetgate.*` for the rest.

use opentelemetry::KeyValue;

use crate::config::UpstreamKind;
use crate::settlement::{dialect_name, Figures, Who};

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
        UpstreamKind::Bedrock => "aws.bedrock",
        UpstreamKind::SelfHosted => "self_hosted",
        UpstreamKind::Vertex => "gcp.vertex_ai",
        UpstreamKind::Gemini => "gcp.gemini",
    }
}

fn int(name: &'static str, v: u64) -> KeyValue {
    KeyValue::new(name, v.min(i64::MAX as u64) as i64)
}

/// Every attribute of the span of reservation `id` of `who`, charged `f`.
pub(super) fn of(id: &str, who: &Who, f: &Figures) -> Vec<KeyValue> {
    // The conventions count cached input inside the input tokens and
    // break it out beside them; the ledger keeps them apart.
    let used = &f.usage;
    let (cached_read, cache_write) = (used.cached_input, used.cache_writes);
    let input = used.uncached_input.unwrap_or(0) + cached_read + cache_write;
    let dialect = dialect_name(who.dialect);
    let scope = &who.scope;
    let mut a = vec![
        KeyValue::new("gen_ai.operation.name", operation_name(dialect)),
        KeyValue::new("gen_ai.provider.name", who.provider),
        KeyValue::new("gen_ai.system", who.provider),
        KeyValue::new("gen_ai.request.model", scope.model.to_string()),
        KeyValue::new("gen_ai.response.model", scope.upstream_model.to_string()),
        int("gen_ai.usage.input_tokens", input),
        int("gen_ai.usage.output_tokens", used.output.unwrap_or(0)),
        int("gen_ai.usage.cache_read.input_tokens", cached_read),
        int("gen_ai.usage.cache_creation.input_tokens", cache_write),
        int("budgetgate.cost_usd_micros", f.cost_micros),
        int("budgetgate.charged_tokens", f.charged_tokens),
        int("budgetgate.reasoning_tokens", used.reasoning),
        KeyValue::new("budgetgate.tenant", scope.tenant.to_string()),
        KeyValue::new("budgetgate.key", scope.key_id.to_string()),
        KeyValue::new("budgetgate.outcome", f.outcome.as_str()),
        KeyValue::new("budgetgate.deployment", who.deployment.to_string()),
        KeyValue::new("budgetgate.dialect", dialect),
        KeyValue::new("budgetgate.reservation_id", id.to_string()),
        KeyValue::new("budgetgate.price_version", scope.price_version.to_string()),
    ];
    if let Some(eu) = &who.end_user {
        a.push(KeyValue::new("budgetgate.end_user", eu.to_string()));
    }
    a
}
