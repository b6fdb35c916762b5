//! Typed configuration (DESIGN section 8): the TOML file is read into
//! [`raw`] structs, then validated as a whole into a [`Policy`]. Validation
//! collects every error with its path (`tenants[2].limits.tpm: must be > 0`)
//! instead of stopping at the first. [`reload`] swaps in a new file at
//! runtime (SIGHUP, file change). `unpriced` lists what `check-config`
//! flags about prices (dollar budgets over models it cannot price),
//! `output_limit` the models without a configured output limit.

pub mod alerts;
pub mod bedrock;
pub mod betas;
pub mod bounds;
pub mod deployment_models;
pub mod end_user;
pub mod estimate;
pub mod gemini;
pub mod ids;
pub mod ledger;
pub mod model_names;
mod output_limit;
pub mod output_reservation;
pub mod placement;
pub mod queue;
pub mod raw;
pub mod reload;
pub mod run;
pub mod store;
pub mod telemetry;
pub mod tls;
mod unpriced;
mod validate;
pub mod vertex;

pub use validate::forwarding;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::money::PriceTable;
use bounds::MAX_LIMIT;
use estimate::{Encoding, EstimateSettings};
use raw::RawConfig;

/// Every problem found in a config file, each prefixed by its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigErrors(pub Vec<String>);

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerPolicy {
    /// Listen address.
    pub listen: SocketAddr,
    /// Largest accepted request body, bytes (larger → 413).
    pub max_body_bytes: usize,
    /// Longest a request may run upstream (total timeout), also the lower part of the hold TTL.
    pub max_request: Duration,
    /// Slot lease: how long a concurrency slot is held without renewal
    /// (renewed every third of it while its request runs).
    pub slot_lease: Duration,
    /// How long a failed settlement is retried; hold TTL = max_request + settle_retry.
    pub settle_retry: Duration,
    /// `retry-after` sent with a concurrency refusal.
    pub concurrency_retry: Duration,
    /// Name of the environment variable holding the admin API bearer token
    /// (read once at start; the admin API is disabled when it is unset or empty).
    pub admin_token_env: String,
    /// How long in-flight requests and streams may run after SIGTERM/ctrl-c
    /// before streams are cut off and what is left is aborted (0: at once).
    pub shutdown_grace: Duration,
    /// `[server.tls]`: serve HTTPS with these files (bound at start; the
    /// certificate itself is reloaded, see [`crate::tls`]).
    pub tls: Option<tls::TlsFiles>,
    /// Name of the environment variable holding the key of the end-user id
    /// hash (read at load; required when a tenant has end-user settings).
    pub end_user_key_env: String,
    /// Timeouts and bound of client connections.
    pub connections: ConnectionLimits,
}

/// `[server]` `header_read_timeout_secs`, `write_timeout_secs`,
/// `max_connections` ([`crate::connections`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest a client may take to send a request's headers, counted from
    /// the connection's start or from the end of its previous answer (so
    /// also how long a kept-alive connection may sit idle).
    pub header_read_timeout: Duration,
    /// Longest a write to a client may make no progress.
    pub write_timeout: Duration,
    /// Most client connections open at once (bound at start); `None`: from
    /// the process's file limit.
    pub max_connections: Option<usize>,
}

/// Limits of one scope. Every field optional; absent means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests per minute.
    pub rpm: Option<u64>,
    /// Tokens (input + output) per minute.
    pub tpm: Option<u64>,
    /// Bucket capacity for `rpm`, requests (default: `rpm`).
    pub rpm_burst: Option<u64>,
    /// Bucket capacity for `tpm`, tokens (default: `tpm`).
    pub tpm_burst: Option<u64>,
    /// Input tokens per minute (the output never touches it).
    pub input_tpm: Option<u64>,
    /// Bucket capacity for `input_tpm`, tokens (default: `input_tpm`).
    pub input_tpm_burst: Option<u64>,
    /// Output tokens per minute, reasoning included (the input never touches it).
    pub output_tpm: Option<u64>,
    /// Bucket capacity for `output_tpm`, tokens (default: `output_tpm`).
    pub output_tpm_burst: Option<u64>,
    /// Requests in flight.
    pub max_concurrent: Option<u64>,
    /// Tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Tokens per UTC month.
    pub tokens_per_month: Option<u64>,
    /// Requests per UTC day.
    pub requests_per_day: Option<u64>,
    /// How much of each cached input token read this scope's token budgets
    /// count, per mille (`None`: 1000, every token in full). Tenant, key
    /// and tenant×model scopes only: upstream budgets follow the provider.
    pub cache_read_weight: Option<u64>,
    /// Micro-dollars per UTC day (`usd_per_day`, decimal USD in the file).
    pub usd_per_day: Option<u64>,
    /// Micro-dollars per UTC month (`usd_per_month`).
    pub usd_per_month: Option<u64>,
    /// Tokens in the last 5 hours, rolling (`budget::rolling`).
    pub tokens_per_5h: Option<u64>,
    /// Tokens in the last 24 hours, rolling.
    pub tokens_per_24h: Option<u64>,
    /// Tokens in the last 7 days, rolling.
    pub tokens_per_week: Option<u64>,
    /// Micro-dollars in the last 5 hours, rolling (`usd_per_5h`).
    pub usd_per_5h: Option<u64>,
    /// Micro-dollars in the last 24 hours, rolling.
    pub usd_per_24h: Option<u64>,
    /// Micro-dollars in the last 7 days, rolling.
    pub usd_per_week: Option<u64>,
    /// `window = "from_first_use"`: the 5 h, 24 h and week quotas above
    /// count from their first use until that window's end, then start
    /// again at the next use (`Window::FirstUse5h` …), instead of rolling.
    pub from_first_use: bool,
}

impl Limits {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// True when a dollar budget is set.
    pub fn has_usd(&self) -> bool {
        self.usd_per_day.is_some()
            || self.usd_per_month.is_some()
            || self.usd_per_5h.is_some()
            || self.usd_per_24h.is_some()
            || self.usd_per_week.is_some()
    }
}

/// Provider family of an upstream deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamKind {
    /// OpenAI or any OpenAI-compatible API that counts the output cap at request time.
    Openai,
    /// Azure OpenAI deployment URLs with `api-key` auth.
    Azure,
    /// A self-hosted OpenAI-compatible server (vLLM, llama.cpp) that counts real usage.
    SelfHosted,
    /// Anthropic's Messages API: `x-api-key` auth, `anthropic-version`.
    Anthropic,
    /// Claude on Amazon Bedrock ([`bedrock`]): Messages clients only.
    Bedrock,
    /// Google Vertex AI (`[upstreams.vertex]`), OAuth access tokens:
    /// Claude (the Messages body on `rawPredict` / `streamRawPredict`), or
    /// Gemini with `publisher = "google"` (`generateContent`).
    Vertex,
    /// Google's Gemini API (AI Studio): `x-goog-api-key`, Gemini's own
    /// `generateContent`; chat completions on its OpenAI-compatible
    /// endpoint under the same base URL.
    Gemini,
}

/// The wire format a deployment's models speak: every deployment of a
/// model speaks one (checked at load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OpenAI's routes (chat, completions, embeddings, Responses).
    OpenAi,
    /// Anthropic Messages.
    Messages,
    /// Gemini's `generateContent`.
    Gemini,
}

impl UpstreamKind {
    /// Serves Anthropic Messages (and only that).
    pub fn speaks_messages(self) -> bool {
        matches!(
            self,
            UpstreamKind::Anthropic | UpstreamKind::Bedrock | UpstreamKind::Vertex
        )
    }
}

impl UpstreamPolicy {
    /// The name of the scope holding this deployment's budgets: its
    /// `project` when it names one, else its own name.
    pub fn budget_scope(&self) -> &str {
        self.project.as_deref().unwrap_or(&self.name)
    }

    /// The wire format of this deployment's models: a Vertex deployment
    /// speaks Gemini when its publisher is Google.
    pub fn family(&self) -> Family {
        if self.kind == UpstreamKind::Gemini
            || self
                .vertex
                .as_deref()
                .is_some_and(|v| v.publisher == vertex::Publisher::Google)
        {
            Family::Gemini
        } else if self.kind.speaks_messages() {
            Family::Messages
        } else {
            Family::OpenAi
        }
    }
}

/// `[[upstreams]]`: one deployment.
#[derive(Debug, Clone)]
pub struct UpstreamPolicy {
    /// Deployment name (scope `upstream:<name>`).
    pub name: String,
    /// Provider family.
    pub kind: UpstreamKind,
    /// Base URL ending before `/chat/completions`, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Upstream API key, read from the environment at load; never logged.
    pub api_key: Option<String>,
    /// Azure `api-version` query value.
    pub api_version: Option<String>,
    /// `anthropic-version` sent when the client sends none (kind `anthropic`).
    pub anthropic_version: String,
    /// The provider's quota as budgets.
    pub limits: Limits,
    /// Whether unused reserved output goes back to this upstream's budgets.
    pub refund_unused: bool,
    /// Send the output cap as `max_tokens` instead of `max_completion_tokens`.
    pub max_tokens_only: bool,
    /// Whether `n > 1` is accepted.
    pub supports_n: bool,
    /// Total request timeout, body included: `timeout_secs`, at most
    /// `server.max_request_secs`.
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// How long this deployment gets no traffic after it answers 429 without `retry-after`.
    pub cooldown: Duration,
    /// Lower this deployment's RPM/TPM buckets to the provider's
    /// `x-ratelimit-remaining-requests` / `-tokens` when those are lower.
    pub learn_from_headers: bool,
    /// Client request headers forwarded to this upstream (lower-case names;
    /// e.g. `openai-organization`). Credentials are never forwarded.
    pub forward_client_headers: Vec<String>,
    /// `price`: this deployment's prices, replacing those of every model
    /// it serves (docs/MONEY.md).
    pub price: Option<Arc<PriceTable>>,
    /// `models`: this deployment's id of each public model
    /// ([`deployment_models`]); `None`: the model's usual upstream name.
    pub models: Option<deployment_models::DeploymentModels>,
    /// `output_token_weight`: each output token counts this many times on
    /// this deployment's `tpm` and `output_tpm` (reserved from the cap,
    /// settled from the actual output); 1 unless the provider burns its
    /// quota faster for output (Bedrock: 5 for Claude 4 models).
    pub output_token_weight: u64,
    /// `kind = "bedrock"`: API, region, authentication.
    pub bedrock: Option<bedrock::BedrockSettings>,
    /// `api_key_env` as written (named by `check-config`, never the key).
    pub api_key_env: Option<String>,
    /// `[upstreams.vertex]` (kind `vertex` only).
    pub vertex: Option<Arc<vertex::VertexSettings>>,
    /// `project`: the provider project whose quota this deployment's
    /// budgets are (scope `upstream:<project>`, shared by every deployment
    /// naming it: two API keys of one Gemini API project have one quota);
    /// `None`: the deployment's own (`upstream:<name>`).
    pub project: Option<String>,
}

/// `[[models]]`: a public model name, or a pattern of names
/// ([`model_names`]).
#[derive(Debug, Clone)]
pub struct ModelPolicy {
    /// Public name clients send, or the pattern (`claude-*`, `*`) that
    /// names this entry's budgets, limits, prices and metric labels.
    pub name: String,
    /// The name is a pattern: upstream gets the name the client sent,
    /// unless `upstream_model` is configured.
    pub pattern: bool,
    /// `upstream_model` was configured (every matching name goes up as it).
    pub renamed: bool,
    /// Indexes into [`Policy::upstreams`], in preference order.
    pub upstreams: Vec<usize>,
    /// Model name sent upstream.
    pub upstream_model: String,
    /// Tokenizer.
    pub encoding: Encoding,
    /// What an image part costs, by `detail` (`[estimation]` image knobs).
    pub image: estimate::ImageCost,
    /// Output reserved when the client gives no cap, tokens per choice.
    pub default_max_output_tokens: u64,
    /// Largest output the model produces, tokens per choice, when the
    /// operator configured it. `None`: the gateway invents no limit; a
    /// client's cap goes upstream as sent (the provider answers for its
    /// own model) and an uncapped stream is sent its reservation.
    pub max_output_tokens: Option<u64>,
    /// `context_window`: prompt plus output the model holds, tokens, when
    /// configured; an uncapped request's output is at most what its input
    /// estimate leaves of it, and it bounds the usage an upstream may report.
    pub context_window: Option<u64>,
    /// A pattern entry's concrete names (`models`): what `GET /v1/models`
    /// lists for it (never the pattern itself). Empty for exact entries.
    pub listed: Vec<String>,
    /// Spends tokens that produce no deltas: streams are never extended.
    pub reasoning: bool,
    /// Order in which deployments are tried.
    pub routing: Routing,
    /// Served on `/v1/responses` (every deployment's kind can serve it).
    pub responses: bool,
    /// Hosted Responses tools (by `type`) this model may use, priced or not.
    pub hosted_tools: Vec<String>,
    /// The priced ones (`hosted_tools` as a table), µ$ per unit; also in
    /// every price table of the model ([`ModelPolicy::price_on`]).
    pub hosted_prices: crate::money::HostedPrices,
    /// Most uses of hosted tools one request may make (`max_tool_calls`):
    /// sent upstream as `max_tool_calls`, a client's value lowered to it.
    pub max_tool_calls: u64,
    /// Input tokens reserved per use of a priced hosted tool
    /// (`hosted_call_input_tokens`: what a search puts in the context).
    pub hosted_call_input_tokens: u64,
    /// `background: true` allowed (charged the whole reservation, never refunded).
    pub allow_background: bool,
    /// Its deployments speak Anthropic Messages (all of them or none:
    /// checked at load); it answers on `/v1/messages` only.
    pub messages: bool,
    /// Its deployments speak Gemini (`kind = "gemini"`, or Vertex with
    /// `publisher = "google"`; all or none): it answers on
    /// `/v1beta/models/{model}:generateContent` (and on chat completions
    /// where every deployment is `kind = "gemini"`).
    pub gemini: bool,
    /// Messages only: the model's tokens per 1000 tiktoken tokens of text.
    pub token_ratio: u64,
    /// How a stream with the client's own output cap is reserved.
    pub client_cap_reservation: CapReservation,
    /// Messages only: which `anthropic-beta` values go upstream (an allow
    /// list, or every beta but a deny list: `dialects::anthropic::betas`).
    pub anthropic_betas: betas::BetaPolicy,
    /// Messages only: server tools, MCP servers and containers are allowed
    /// (work the provider does and bills outside the token usage).
    pub allow_server_tools: bool,
    /// Messages only: `file_id` sources are allowed (with the tenant's consent).
    pub allow_file_ids: bool,
    /// Messages only: Anthropic counts cache reads toward this model's
    /// input limits (older models; current ones leave them out), so the
    /// `tpm` / `input_tpm` of its deployments count them in full.
    pub anthropic_cache_reads_count: bool,
    /// `price`: what a request costs (docs/MONEY.md), unless its
    /// deployment has a price of its own.
    pub price: Option<Arc<PriceTable>>,
}

/// How a stream's client-given output cap is reserved (DESIGN section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapReservation {
    /// Reserve `min(client cap, default_max_output_tokens)` and extend in
    /// steps up to the client's cap as output arrives.
    Incremental,
    /// Reserve the client's whole cap up front.
    Full,
}

/// How a model's deployments are ordered for each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// In the configured order: later deployments take overflow.
    Priority,
    /// Most spare token-bucket capacity (remaining/limit) first; costs one
    /// extra store read per request.
    LeastUtilised,
}

pub use ids::{DeploymentId, KeyId, ModelId, TenantId};
pub use store::{OnStoreError, StoreKind, StorePolicy};

/// One API key of a tenant.
#[derive(Debug, Clone)]
pub struct KeyPolicy {
    /// Key id (scope `key:<tenant>/<id>`).
    pub id: String,
    /// Lower-case hex SHA-256 of the key.
    pub sha256: String,
    /// Limits of this key alone.
    pub limits: Limits,
    /// `priority` of requests with this key (`None`: the tenant's).
    pub priority: Option<crate::config::queue::Class>,
    /// `weight` of requests with this key (`None`: the tenant's).
    pub weight: Option<u64>,
    /// UTC µs from which the key is refused (keys of the admin API).
    pub expires_at: Option<u64>,
    /// The model names the key may send, exact or patterns
    /// ([`model_names`], matched on the name sent); `None`: every model.
    pub allowed_models: Option<Vec<model_names::NamePattern>>,
    /// `output_reservation` of requests with this key (`None`: the tenant's).
    pub output_reservation: Option<output_reservation::OutputReservation>,
    /// `run_required` of this key (`None`: the tenant's).
    pub run_required: Option<bool>,
    /// `runs_per_day` of this key (`None`: the tenant's).
    pub runs_per_day: Option<u64>,
}

impl KeyPolicy {
    /// Whether the key may send model name `sent`.
    pub fn allows(&self, sent: &str) -> bool {
        self.allowed_models
            .as_ref()
            .is_none_or(|ms| ms.iter().any(|m| m.matches(sent)))
    }
}

/// Where a key digest points: tenant, key and the UTC µs from which this
/// secret is refused (the key's expiry, or a rotated secret's end).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef {
    pub(crate) tenant: usize,
    pub(crate) key: usize,
    pub(crate) not_after: u64,
}

/// `[control]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPolicy {
    /// `sqlite://…` or `postgres://…`; `None`: SQLite under the state
    /// directory ([`crate::db::default_url`]).
    pub database_url: Option<String>,
}

/// What happens to a request whose output cap does not fit its budgets
/// (`on_short_output`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnShortOutput {
    /// Refused (429, or 400 when it can never fit).
    #[default]
    Refuse,
    /// Admitted with the cap lowered to what fits, down to the model's minimum.
    Clamp,
}

/// `[[tenants]]`.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    /// Tenant name (scope `tenant:<name>`).
    pub name: String,
    /// API keys.
    pub keys: Vec<KeyPolicy>,
    /// Tenant-wide limits.
    pub limits: Limits,
    /// Per public model limits (scope `tenant_model:<t>/<model>`).
    pub model_limits: BTreeMap<String, Limits>,
    /// Failure policy.
    pub on_store_error: OnStoreError,
    /// What a client output cap that does not fit the budgets gets:
    /// its own, its nearest ancestor's, else a refusal.
    pub on_short_output: OnShortOutput,
    /// Shadow mode: every limit of this tenant is evaluated and reported, never enforced.
    pub shadow: bool,
    /// Extra tenant-wide limits evaluated in shadow (e.g. a lower TPM being trialled).
    pub shadow_limits: Limits,
    /// Forward `previous_response_id`s the gateway has no record of (single-tenant migrations).
    pub allow_unrecorded_previous_response: bool,
    /// Tokens charged for the context of an unrecorded previous response.
    pub unrecorded_previous_response_tokens: u64,
    /// Provider object ids (files, vector stores, containers, prompts) this tenant may name.
    pub allowed_provider_objects: Vec<String>,
    /// Messages: the tenant may refer to uploaded files by `file_id`
    /// (the model must allow it too).
    pub allow_file_ids: bool,
    /// The tenant's parent, index into [`Policy::tenants`].
    pub parent: Option<usize>,
    /// Every ancestor, nearest first (at most 3: a tree is at most 4 deep).
    pub ancestors: Vec<usize>,
    /// Limits of each distinct end user of this tenant (scope
    /// `end_user:<tenant>/<id hash>`); empty: none.
    pub end_user_limits: Limits,
    /// A request must name its end user (400 without one): this tenant's
    /// `end_user_required` or an ancestor's.
    pub end_user_required: bool,
    /// A level of this tenant's tree (itself or an ancestor) has end-user
    /// limits or requires an id: requests' end-user ids are then read,
    /// checked and hashed. Otherwise they are not looked at.
    pub reads_end_user: bool,
    /// Priority class of its requests (`priority`): its own, its nearest
    /// ancestor's, else `standard`.
    pub priority: crate::config::queue::Class,
    /// Fair-share weight within a class (`weight`): its own, its nearest
    /// ancestor's, else 1.
    pub weight: u64,
    /// `output_reservation` (with `expected_quantile`, `max_exposure`):
    /// its own, its nearest ancestor's, else the whole cap.
    pub output_reservation: output_reservation::OutputReservation,
    /// Runs (`run_limits_max`, `run_limits_default`, `run_required`,
    /// `runs_per_day`, `run_ttl`): each its own, else its nearest
    /// ancestor's; `run_required` on any level applies to its subtree.
    pub runs: run::RunSettings,
}

impl TenantPolicy {
    /// Whether a request with `key` must name a run: the key's
    /// `run_required`, else the tenant's.
    pub fn run_required(&self, key: &KeyPolicy) -> bool {
        key.run_required.unwrap_or(self.runs.required)
    }

    /// The runs `key` may start per UTC day: the key's `runs_per_day`,
    /// else the tenant's.
    pub fn runs_per_day(&self, key: &KeyPolicy) -> Option<u64> {
        key.runs_per_day.or(self.runs.runs_per_day)
    }

    /// The output reservation of a request with `key`: the key's, else the tenant's.
    pub fn output_reservation(&self, key: &KeyPolicy) -> output_reservation::OutputReservation {
        key.output_reservation.unwrap_or(self.output_reservation)
    }
}

/// A whole validated configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Short digest of the file's bytes, tagging every decision.
    pub version: String,
    /// `[server]`.
    pub server: ServerPolicy,
    /// `[store]`.
    pub store: StorePolicy,
    /// The `tenant` layout's tenant trees and deployment groups
    /// (`budget::placement`), from this policy's tenants and models; `None`
    /// in the `single` layout.
    pub placement: Option<std::sync::Arc<placement::DomainMap>>,
    /// Estimation knobs.
    pub estimation: EstimateSettings,
    /// Smallest output reservation per choice when the default is lowered to fit, tokens.
    pub min_output_tokens: u64,
    /// Streaming extension step, tokens.
    pub stream_extension_step: u64,
    /// `estimation.stream_counting`: how streams are metered.
    pub stream_counting: estimate::StreamCounting,
    /// Upstream deployments.
    pub upstreams: Vec<UpstreamPolicy>,
    /// Models in file order.
    pub models: Vec<ModelPolicy>,
    /// Tenants in file order.
    pub tenants: Vec<TenantPolicy>,
    /// The key end-user ids are hashed with (`server.end_user_key_env`);
    /// `None` when no tenant has end-user settings and the variable is unset.
    pub end_user_key: Option<std::sync::Arc<end_user::EndUserKey>>,
    /// `[queue]`: requests may wait instead of being refused (`None`: off).
    pub queue: Option<crate::config::queue::QueuePolicy>,
    /// `[ledger]` (bound at start).
    pub ledger: ledger::LedgerSettings,
    /// `[alerts]` (bound at start).
    pub alerts: alerts::AlertSettings,
    /// Keys written under a former name, one line each naming the new key:
    /// accepted for one release, printed by `check-config` and logged at
    /// start and reload.
    pub renamed_keys: Vec<String>,
    /// `[telemetry]`: request spans over OTLP (bound at start).
    pub telemetry: telemetry::TelemetrySettings,
    model_index: model_names::ModelIndex,
    /// `[control]`.
    pub control: ControlPolicy,
    /// Keys by their SHA-256 digest (raw bytes: hashing the request's key
    /// is then not followed by hex-encoding it into a new string), in a
    /// foldhash map: SipHash of the 32 bytes cost about 200 instructions
    /// on every request, and a digest gives an attacker no collisions to
    /// aim.
    key_index: foldhash::HashMap<[u8; 32], KeyRef>,
}

impl Policy {
    /// The `tenant` layout's placement of this policy's budgets, whichever
    /// layout the policy runs in: where `store migrate` copies counters to.
    pub fn tenant_placement(&self) -> std::sync::Arc<placement::DomainMap> {
        self.placement.clone().unwrap_or_else(|| {
            std::sync::Arc::new(validate::domain_map(
                &self.store.domain,
                &self.tenants,
                &self.upstreams,
                &self.models,
            ))
        })
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Policy, ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors(vec![format!("{}: {e}", path.display())]))?;
        Policy::from_toml(&text)
    }

    /// Parses and validates config text.
    pub fn from_toml(text: &str) -> Result<Policy, ConfigErrors> {
        let (raw, version) = Policy::parse(text)?;
        validate::validate(raw, version)
    }

    /// Reads a config file without validating it: the file as written and
    /// its version (a short digest of its bytes).
    pub fn read_raw(path: &Path) -> Result<(RawConfig, String), ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors(vec![format!("{}: {e}", path.display())]))?;
        Policy::parse(&text)
    }

    fn parse(text: &str) -> Result<(RawConfig, String), ConfigErrors> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigErrors(vec![e.to_string()]))?;
        let digest = Sha256::digest(text.as_bytes());
        Ok((raw, hex::encode(&digest[..6])))
    }

    /// Validates a config given as values (the file merged with the
    /// control database's entities) under `version`: the one validator of
    /// the file and the admin API.
    pub fn from_raw(raw: RawConfig, version: String) -> Result<Policy, ConfigErrors> {
        validate::validate(raw, version)
    }

    /// The model serving the name a client sent: the entry named exactly
    /// so, else the pattern entry with the longest matching prefix.
    pub fn model(&self, name: &str) -> Option<&ModelPolicy> {
        self.model_index.resolve(name).map(|i| &self.models[i])
    }

    /// How a refusal names the request's tenant when it has ancestors
    /// (whose budgets may be the refusing ones): `tenant ml, child of acme`
    /// (`…, child of team, child of acme` deeper down); `None` for a root.
    pub fn requester_of(&self, tenant: &TenantPolicy) -> Option<String> {
        if tenant.ancestors.is_empty() {
            return None;
        }
        let mut out = format!("tenant {}", tenant.name);
        for &a in &tenant.ancestors {
            out.push_str(", child of ");
            out.push_str(&self.tenants[a].name);
        }
        Some(out)
    }

    /// `tenant` and then each of its ancestors, nearest first: the levels
    /// whose budgets a request of `tenant` reserves.
    pub fn lineage<'p>(
        &'p self,
        tenant: &'p TenantPolicy,
    ) -> impl Iterator<Item = &'p TenantPolicy> {
        std::iter::once(tenant).chain(tenant.ancestors.iter().map(|&i| &self.tenants[i]))
    }
}

impl ModelPolicy {
    /// This model's prices on deployment `upstream`: the deployment's own,
    /// else the model's; `None` when neither is priced.
    pub fn price_on(&self, upstream: &UpstreamPolicy) -> Option<Arc<PriceTable>> {
        match &upstream.price {
            // A deployment's token prices with this model's hosted tools.
            Some(p) if !self.hosted_prices.is_empty() => Some(Arc::new(PriceTable {
                hosted: self.hosted_prices,
                ..PriceTable::clone(p)
            })),
            Some(p) => Some(p.clone()),
            None => self.price.clone(),
        }
    }

    /// The largest client cap accepted: an exact entry's
    /// `max_output_tokens` (the provider's documented maximum for that
    /// model). A pattern entry stands for models not yet released, whose
    /// maximum nobody documented: it refuses no cap, the provider refuses
    /// what it must.
    pub fn refused_above(&self) -> Option<u64> {
        self.max_output_tokens.filter(|_| !self.pattern)
    }
}

/// Lower-case hex SHA-256 of an API key, as written in `keys[].sha256`.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}
