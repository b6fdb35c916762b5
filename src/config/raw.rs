//! The TOML file as written, before validation. Numbers are read as `i64`
//! so that a negative value gets our path-qualified message instead of a
//! parser error; unknown fields are rejected. The same types serialize back
//! to TOML, so tests build configs as values instead of editing text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub estimation: RawEstimation,
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    #[serde(default)]
    pub models: Vec<RawModel>,
    #[serde(default)]
    pub tenants: Vec<RawTenant>,
    /// `[queue]`: absent, refusals are answered at once (no waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<RawQueue>,
    #[serde(default)]
    pub ledger: RawLedger,
    #[serde(default)]
    pub alerts: RawAlerts,
    #[serde(default)]
    pub control: RawControl,
    #[serde(default)]
    pub telemetry: RawTelemetry,
}

/// `[telemetry]`: request spans over OTLP/HTTP.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
    pub sample_ratio: Option<f64>,
    pub export_interval_ms: Option<i64>,
}

/// `[queue]`: the wait queues' settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    pub max_queued: Option<i64>,
    pub max_queued_bytes: Option<i64>,
    /// `[queue.classes.<class>]`.
    #[serde(default)]
    pub classes: BTreeMap<String, RawQueueClass>,
    /// `[queue.wait_on]`: budget kind → the classes that may wait for it.
    #[serde(default)]
    pub wait_on: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueueClass {
    pub max_wait_ms: Option<i64>,
    pub max_starve_ms: Option<i64>,
}

/// `[control]`: where runtime tenants, keys and admin tokens live.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawControl {
    pub database_url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    pub webhook_url: Option<String>,
    pub secret_env: Option<String>,
    pub thresholds_percent: Option<Vec<i64>>,
    pub check_interval_ms: Option<i64>,
    pub retry_for_secs: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLedger {
    pub enabled: Option<bool>,
    pub batch_interval_ms: Option<i64>,
    pub batch_rows: Option<i64>,
    pub buffer_rows: Option<i64>,
    pub retention_days: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub max_body_bytes: Option<i64>,
    pub max_request_secs: Option<i64>,
    pub slot_lease_secs: Option<i64>,
    /// Former name of `slot_lease_secs` (renamed 2026-12-04), accepted for one release.
    pub lease_secs: Option<i64>,
    pub settle_retry_secs: Option<i64>,
    pub concurrency_retry_secs: Option<i64>,
    pub admin_token_env: Option<String>,
    pub shutdown_grace_secs: Option<i64>,
    pub tls: Option<super::tls::RawTls>,
    pub end_user_key_env: Option<String>,
    pub header_read_timeout_secs: Option<i64>,
    pub write_timeout_secs: Option<i64>,
    pub max_connections: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub kind: Option<String>,
    pub url: Option<String>,
    pub timeout_ms: Option<i64>,
    pub key_prefix: Option<String>,
    pub domain: Option<String>,
    pub layout: Option<String>,
    pub fallback_share: Option<f64>,
    pub snapshot_path: Option<String>,
    pub response_record_ttl_secs: Option<i64>,
    pub max_response_records: Option<i64>,
    pub deny_cache_entries: Option<i64>,
    pub fail_open_entries: Option<i64>,
    pub lease: Option<RawLease>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLease {
    pub mode: Option<String>,
    pub min_rate: Option<i64>,
    pub ttl_ms: Option<i64>,
    pub report_interval_ms: Option<i64>,
    pub max_fraction: Option<f64>,
    pub clock_margin_ms: Option<i64>,
    pub fleet_size: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawEstimation {
    pub min_output_tokens: Option<i64>,
    pub image_part_tokens: Option<i64>,
    /// Image costs by model-name prefix: `"gpt-4o" = { low = 85, high = 1445 }`.
    pub image_tokens: Option<BTreeMap<String, RawImageTokens>>,
    pub audio_part_tokens: Option<i64>,
    pub structured_margin_percent: Option<i64>,
    pub structured_margin_tokens: Option<i64>,
    pub stream_extension_step: Option<i64>,
    /// `"bound"` (default) or `"exact"`: how a stream's output is metered.
    pub stream_counting: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawImageTokens {
    pub low: Option<i64>,
    pub high: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    #[serde(default, deserialize_with = "wide_int")]
    pub rpm: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tpm: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub rpm_burst: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tpm_burst: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub input_tpm: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub input_tpm_burst: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub output_tpm: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub output_tpm_burst: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub max_concurrent: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tokens_per_day: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tokens_per_month: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub requests_per_day: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub cache_read_weight: Option<i64>,
    pub usd_per_day: Option<RawDecimal>,
    pub usd_per_month: Option<RawDecimal>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tokens_per_5h: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tokens_per_24h: Option<i64>,
    #[serde(default, deserialize_with = "wide_int")]
    pub tokens_per_week: Option<i64>,
    pub usd_per_5h: Option<RawDecimal>,
    pub usd_per_24h: Option<RawDecimal>,
    pub usd_per_week: Option<RawDecimal>,
    /// `"rolling"` (default) or `"from_first_use"`: how the 5 h, 24 h and
    /// week quotas of these limits count.
    pub window: Option<String>,
}

/// A limit as written, brought to the nearest `i64` when it is beyond 64
/// bits (TOML hands such a literal over as an `i128`): 10^20 then gets the
/// validator's range message (`limits.tpm: must be ≤ 10000000000`), the
/// same one the admin API gives (which clamps its JSON alike), instead of
/// a parser's type error.
fn wide_int<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    struct Wide(i64);
    struct WideVisitor;
    impl serde::de::Visitor<'_> for WideVisitor {
        type Value = Wide;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an integer")
        }
        fn visit_i64<E>(self, v: i64) -> Result<Wide, E> {
            Ok(Wide(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Wide, E> {
            Ok(Wide(i64::try_from(v).unwrap_or(i64::MAX)))
        }
        fn visit_i128<E>(self, v: i128) -> Result<Wide, E> {
            Ok(Wide(v.clamp(i64::MIN as i128, i64::MAX as i128) as i64))
        }
        fn visit_u128<E>(self, v: u128) -> Result<Wide, E> {
            Ok(Wide(i64::try_from(v).unwrap_or(i64::MAX)))
        }
    }
    impl<'de> Deserialize<'de> for Wide {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(WideVisitor)
        }
    }
    Ok(Option::<Wide>::deserialize(d)?.map(|w| w.0))
}

/// A decimal amount as written: a string (`"0.15"`), or anything else,
/// which validation refuses with its path (a TOML float is binary, not
/// the decimal the operator wrote).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawDecimal {
    Text(String),
    Other(toml::Value),
}

impl From<&str> for RawDecimal {
    fn from(s: &str) -> Self {
        RawDecimal::Text(s.to_string())
    }
}

/// `hosted_tools`: a list of tool types allowed unpriced
/// (`["web_search"]`), or a table pricing each in the unit it bills
/// (`{ web_search = { per = "call", usd = "0.01" } }`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawHostedTools {
    List(Vec<String>),
    Priced(BTreeMap<String, RawHostedTool>),
}

impl Default for RawHostedTools {
    fn default() -> Self {
        RawHostedTools::List(Vec::new())
    }
}

impl From<Vec<String>> for RawHostedTools {
    fn from(v: Vec<String>) -> Self {
        RawHostedTools::List(v)
    }
}

/// One priced hosted tool: its unit and its price per unit, USD.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHostedTool {
    pub per: String,
    pub usd: RawDecimal,
}

/// `price = { input = "0.15", … }`: USD per million tokens.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    pub input: Option<RawDecimal>,
    pub cached_input: Option<RawDecimal>,
    pub cache_write_5m: Option<RawDecimal>,
    pub cache_write_1h: Option<RawDecimal>,
    pub output: Option<RawDecimal>,
}

/// One long-context tier: the price of a request whose input is above
/// `above_input_tokens`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPriceTier {
    pub above_input_tokens: Option<i64>,
    pub input: Option<RawDecimal>,
    pub cached_input: Option<RawDecimal>,
    pub cache_write_5m: Option<RawDecimal>,
    pub cache_write_1h: Option<RawDecimal>,
    pub output: Option<RawDecimal>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: String,
    pub kind: Option<String>,
    /// Empty: the default of the kind (`vertex`: the region's host).
    #[serde(default)]
    pub base_url: String,
    pub api_key_env: Option<String>,
    pub api_version: Option<String>,
    pub anthropic_version: Option<String>,
    #[serde(default)]
    pub limits: RawLimits,
    pub refund_unused: Option<bool>,
    pub max_tokens_only: Option<bool>,
    pub supports_n: Option<bool>,
    pub timeout_secs: Option<i64>,
    pub connect_timeout_secs: Option<i64>,
    pub cooldown_secs: Option<i64>,
    pub learn_from_headers: Option<bool>,
    #[serde(default)]
    pub forward_client_headers: Vec<String>,
    #[serde(default)]
    pub forward_credential_headers: Vec<String>,
    pub price: Option<RawPrice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub price_tiers: Vec<RawPriceTier>,
    pub lease: Option<String>,
    /// Public model name (or pattern entry name) → this deployment's id for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<BTreeMap<String, String>>,
    /// The deployment's `tpm`/`output_tpm` count each output token this many times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_token_weight: Option<i64>,
    /// `[upstreams.bedrock]` of `kind = "bedrock"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bedrock: Option<super::bedrock::RawBedrock>,
    /// `[upstreams.vertex]` of `kind = "vertex"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex: Option<super::vertex::RawVertex>,
    /// The provider project whose quota the deployment's budgets are:
    /// deployments naming one project share one set of budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub name: String,
    #[serde(default)]
    pub upstreams: Vec<String>,
    pub upstream_model: Option<String>,
    pub encoding: Option<String>,
    pub default_max_output_tokens: Option<i64>,
    pub max_output_tokens: Option<i64>,
    /// Prompt plus output the model holds, tokens (an uncapped request's
    /// output is bounded by what the prompt leaves of it).
    pub context_window: Option<i64>,
    /// A pattern entry's concrete names, listed by `GET /v1/models`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    pub reasoning: Option<bool>,
    pub routing: Option<String>,
    pub responses: Option<bool>,
    #[serde(default)]
    pub hosted_tools: RawHostedTools,
    pub max_tool_calls: Option<i64>,
    pub hosted_call_input_tokens: Option<i64>,
    pub allow_background: Option<bool>,
    pub token_ratio: Option<i64>,
    pub client_cap_reservation: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anthropic_betas: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anthropic_betas_deny: Vec<String>,
    pub allow_server_tools: Option<bool>,
    pub allow_file_ids: Option<bool>,
    pub anthropic_cache_reads_count: Option<bool>,
    pub price: Option<RawPrice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub price_tiers: Vec<RawPriceTier>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    pub name: String,
    pub parent: Option<String>,
    #[serde(default)]
    pub keys: Vec<RawKey>,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub model_limits: BTreeMap<String, RawLimits>,
    pub on_store_error: Option<String>,
    pub on_short_output: Option<String>,
    pub shadow: Option<bool>,
    #[serde(default)]
    pub shadow_limits: RawLimits,
    pub allow_unrecorded_previous_response: Option<bool>,
    pub unrecorded_previous_response_tokens: Option<i64>,
    #[serde(default)]
    pub allowed_provider_objects: Vec<String>,
    pub allow_file_ids: Option<bool>,
    #[serde(default)]
    pub end_user_limits: RawLimits,
    pub end_user_required: Option<bool>,
    /// The ceiling of a run's limits (the `x-budgetgate-run-limits` grammar).
    pub run_limits_max: Option<String>,
    /// The limits of a run that states none (the same grammar).
    pub run_limits_default: Option<String>,
    pub run_required: Option<bool>,
    pub runs_per_day: Option<i64>,
    /// How long a run's record lives after its last request (`"24h"`).
    pub run_ttl: Option<String>,
    /// `"off"`: this tenant's budgets are never leased (`"auto"` the default).
    pub lease: Option<String>,
    pub priority: Option<String>,
    pub weight: Option<i64>,
    /// `"cap"` (the default) or `"expected"` (expected-output reservation).
    pub output_reservation: Option<String>,
    pub expected_quantile: Option<f64>,
    pub max_exposure: Option<super::output_reservation::RawMaxExposure>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    pub id: String,
    pub sha256: String,
    #[serde(default)]
    pub limits: RawLimits,
    pub lease: Option<String>,
    pub priority: Option<String>,
    pub weight: Option<i64>,
    /// Overrides the tenant's `run_required` for this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_required: Option<bool>,
    /// Overrides the tenant's `runs_per_day` for this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_per_day: Option<i64>,
    /// `"cap"` or `"expected"`; unset: the tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_reservation: Option<String>,
    /// What a key created through the admin API adds (never read from the
    /// file: the control database holds it).
    #[serde(skip)]
    pub terms: KeyTerms,
}

/// The terms of a runtime key beyond id, digest and limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyTerms {
    /// UTC µs after which the key is refused (401).
    pub expires_at: Option<u64>,
    /// Public model names the key may use; `None`: every model.
    pub allowed_models: Option<Vec<String>>,
    /// Secrets replaced by a rotation, still accepted until their UTC µs.
    pub retiring: Vec<(String, u64)>,
}
