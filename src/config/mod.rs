//! Typed configuration (DESIGN section 8): the TOML file is read into
//! [`raw`] structs, then validated as a whole into a [`Policy`]. Validation
//! collects every error with its path (`tenants[2].limits.tpm: must be > 0`)
//! instead of stopping at the first. [`reload`] swaps in a new file at
//! runtime (SIGHUP, file change).

pub mod raw;
pub mod reload;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::estimate::{Encoding, EstimateSettings};
use crate::reserve::bucket::{MAX_LIMIT, MAX_QUOTA};
use crate::reserve::keys::{is_valid_id, is_valid_prefix};
use raw::{RawConfig, RawLimits};

/// Every problem found in a config file, each prefixed by its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigErrors(pub Vec<String>);

/// Which store holds budget state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// In-process, exact within one gateway.
    Memory,
    /// Redis or Redis Cluster at `url`.
    Redis {
        /// `redis://host:port/db` or `redis+cluster://h1:p1,h2:p2`.
        url: String,
    },
}

/// `[store]`.
#[derive(Debug, Clone)]
pub struct StorePolicy {
    /// Memory or Redis.
    pub kind: StoreKind,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Prefix of every stored key (no `{`/`}`).
    pub key_prefix: String,
    /// Budget domain: the hash tag shared by every key (DESIGN section 3).
    pub domain: String,
    /// Share of every budget (0 < share ≤ 1) one gateway may use on its own
    /// while the store is down, for `fail_open` tenants (e.g. 1/N for N gateways).
    pub fallback_share: f64,
    /// Where the memory store keeps its state across restarts (`None`: the
    /// default data directory, `reserve::memory::snapshot::default_path`).
    pub snapshot_path: Option<std::path::PathBuf>,
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerPolicy {
    /// Listen address.
    pub listen: SocketAddr,
    /// Largest accepted request body, bytes (larger → 413).
    pub max_body_bytes: usize,
    /// Longest a request may run upstream (total timeout), also the lower part of the hold TTL.
    pub max_request: Duration,
    /// Concurrency lease; renewed every lease/3 while a request runs.
    pub lease: Duration,
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
    pub tls: Option<crate::tls::TlsFiles>,
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
    /// Requests in flight.
    pub max_concurrent: Option<u64>,
    /// Tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Tokens per UTC month.
    pub tokens_per_month: Option<u64>,
    /// Requests per UTC day.
    pub requests_per_day: Option<u64>,
}

impl Limits {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
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
}

/// `[[models]]`: a public model name.
#[derive(Debug, Clone)]
pub struct ModelPolicy {
    /// Public name clients send.
    pub name: String,
    /// Indexes into [`Policy::upstreams`], in preference order.
    pub upstreams: Vec<usize>,
    /// Model name sent upstream.
    pub upstream_model: String,
    /// Tokenizer.
    pub encoding: Encoding,
    /// Output reserved when the client gives no cap, tokens per choice.
    pub default_max_output_tokens: u64,
    /// Largest output the model produces, tokens per choice.
    pub max_output_tokens: u64,
    /// Spends tokens that produce no deltas: streams are never extended.
    pub reasoning: bool,
    /// Order in which deployments are tried.
    pub routing: Routing,
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

pub use crate::reserve::OnStoreError;

/// One API key of a tenant.
#[derive(Debug, Clone)]
pub struct KeyPolicy {
    /// Key id (scope `key:<tenant>/<id>`).
    pub id: String,
    /// Lower-case hex SHA-256 of the key.
    pub sha256: String,
    /// Limits of this key alone.
    pub limits: Limits,
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
    /// Shadow mode: every limit of this tenant is evaluated and reported, never enforced.
    pub shadow: bool,
    /// Extra tenant-wide limits evaluated in shadow (e.g. a lower TPM being trialled).
    pub shadow_limits: Limits,
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
    /// Estimation knobs.
    pub estimation: EstimateSettings,
    /// Smallest output reservation per choice when the default is lowered to fit, tokens.
    pub min_output_tokens: u64,
    /// Streaming extension step, tokens.
    pub stream_extension_step: u64,
    /// Upstream deployments.
    pub upstreams: Vec<UpstreamPolicy>,
    /// Models in file order.
    pub models: Vec<ModelPolicy>,
    /// Tenants in file order.
    pub tenants: Vec<TenantPolicy>,
    model_index: HashMap<String, usize>,
    /// Keys by their SHA-256 digest (raw bytes: hashing the request's key
    /// is then not followed by hex-encoding it into a new string).
    key_index: HashMap<[u8; 32], (usize, usize)>,
}

impl Policy {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Policy, ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors(vec![format!("{}: {e}", path.display())]))?;
        Policy::from_toml(&text)
    }

    /// Parses and validates config text.
    pub fn from_toml(text: &str) -> Result<Policy, ConfigErrors> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigErrors(vec![e.to_string()]))?;
        let digest = Sha256::digest(text.as_bytes());
        validate(raw, hex::encode(&digest[..6]))
    }

    /// A model by public name.
    pub fn model(&self, name: &str) -> Option<&ModelPolicy> {
        self.model_index.get(name).map(|&i| &self.models[i])
    }

    /// Authenticates a presented API key: `(tenant, key)` when its SHA-256 matches.
    pub fn authenticate(&self, presented_key: &str) -> Option<(&TenantPolicy, &KeyPolicy)> {
        let digest: [u8; 32] = Sha256::digest(presented_key.as_bytes()).into();
        self.key_index
            .get(&digest)
            .map(|&(t, k)| (&self.tenants[t], &self.tenants[t].keys[k]))
    }
}

/// Lower-case hex SHA-256 of an API key, as written in `keys[].sha256`.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// `[A-Za-z_][A-Za-z0-9_]*`: a portable environment variable name.
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

struct V {
    errors: Vec<String>,
}

impl V {
    fn err(&mut self, path: impl std::fmt::Display, msg: impl std::fmt::Display) {
        self.errors.push(format!("{path}: {msg}"));
    }

    fn positive(&mut self, path: &str, v: Option<i64>, max: u64) -> Option<u64> {
        match v {
            None => None,
            Some(x) if x <= 0 => {
                self.err(path, "must be > 0");
                None
            }
            Some(x) if x as u64 > max => {
                self.err(path, format!("must be ≤ {max}"));
                None
            }
            Some(x) => Some(x as u64),
        }
    }

    fn secs(&mut self, path: &str, v: Option<i64>, default: u64) -> Duration {
        Duration::from_secs(self.positive(path, v, 86_400 * 31).unwrap_or(default))
    }

    fn limits(&mut self, path: &str, l: &RawLimits) -> Limits {
        let p = |f: &str| format!("{path}.{f}");
        let out = Limits {
            rpm: self.positive(&p("rpm"), l.rpm, MAX_LIMIT),
            tpm: self.positive(&p("tpm"), l.tpm, MAX_LIMIT),
            rpm_burst: self.positive(&p("rpm_burst"), l.rpm_burst, MAX_LIMIT),
            tpm_burst: self.positive(&p("tpm_burst"), l.tpm_burst, MAX_LIMIT),
            max_concurrent: self.positive(&p("max_concurrent"), l.max_concurrent, 1_000_000),
            tokens_per_day: self.positive(&p("tokens_per_day"), l.tokens_per_day, MAX_QUOTA),
            tokens_per_month: self.positive(&p("tokens_per_month"), l.tokens_per_month, MAX_QUOTA),
            requests_per_day: self.positive(&p("requests_per_day"), l.requests_per_day, MAX_QUOTA),
        };
        if out.rpm_burst.is_some() && l.rpm.is_none() {
            self.err(p("rpm_burst"), "needs rpm");
        }
        if out.tpm_burst.is_some() && l.tpm.is_none() {
            self.err(p("tpm_burst"), "needs tpm");
        }
        out
    }
}

fn validate(raw: RawConfig, version: String) -> Result<Policy, ConfigErrors> {
    let mut v = V { errors: Vec::new() };

    let listen_text = raw
        .server
        .listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            v.err(
                "server.listen",
                format!("not a socket address: {listen_text:?}"),
            );
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }
    };
    let server = ServerPolicy {
        listen,
        max_body_bytes: v
            .positive(
                "server.max_body_bytes",
                raw.server.max_body_bytes,
                256 << 20,
            )
            .unwrap_or(4 << 20) as usize,
        max_request: v.secs("server.max_request_secs", raw.server.max_request_secs, 600),
        lease: v.secs("server.lease_secs", raw.server.lease_secs, 30),
        settle_retry: v.secs(
            "server.settle_retry_secs",
            raw.server.settle_retry_secs,
            300,
        ),
        concurrency_retry: v.secs(
            "server.concurrency_retry_secs",
            raw.server.concurrency_retry_secs,
            1,
        ),
        admin_token_env: match raw.server.admin_token_env.as_deref() {
            None => "BUDGETGATE_ADMIN_TOKEN".into(),
            Some(name) if is_env_name(name) => name.to_string(),
            Some(name) => {
                v.err(
                    "server.admin_token_env",
                    format!("not an environment variable name: {name:?}"),
                );
                "BUDGETGATE_ADMIN_TOKEN".into()
            }
        },
        shutdown_grace: match raw.server.shutdown_grace_secs {
            None => Duration::from_secs(30),
            Some(s) if (0..=3600).contains(&s) => Duration::from_secs(s as u64),
            Some(_) => {
                v.err("server.shutdown_grace_secs", "must be within 0..=3600");
                Duration::from_secs(30)
            }
        },
        tls: crate::tls::TlsFiles::validate(raw.server.tls.as_ref(), |p, m| v.err(p, m)),
    };

    let kind = match raw.store.kind.as_deref().unwrap_or("memory") {
        "memory" => StoreKind::Memory,
        "redis" => match &raw.store.url {
            Some(url) => StoreKind::Redis { url: url.clone() },
            None => {
                v.err("store.url", "required when store.kind = \"redis\"");
                StoreKind::Memory
            }
        },
        other => {
            v.err(
                "store.kind",
                format!("must be \"memory\" or \"redis\", not {other:?}"),
            );
            StoreKind::Memory
        }
    };
    let key_prefix = raw
        .store
        .key_prefix
        .clone()
        .unwrap_or_else(|| "budgetgate".into());
    if !is_valid_prefix(&key_prefix) {
        v.err(
            "store.key_prefix",
            "must be 1-64 printable characters without '{', '}' or spaces",
        );
    }
    let domain = raw.store.domain.clone().unwrap_or_else(|| "default".into());
    if !is_valid_id(&domain) {
        v.err("store.domain", "must match [A-Za-z0-9._-]{1,64}");
    }
    let store = StorePolicy {
        kind,
        timeout: Duration::from_millis(
            v.positive("store.timeout_ms", raw.store.timeout_ms, 60_000)
                .unwrap_or(50),
        ),
        key_prefix,
        domain,
        fallback_share: match raw.store.fallback_share {
            None => 1.0,
            Some(f) if f > 0.0 && f <= 1.0 => f,
            Some(_) => {
                v.err("store.fallback_share", "must be within (0, 1]");
                1.0
            }
        },
        snapshot_path: match raw.store.snapshot_path.as_deref() {
            None => None,
            Some("") => {
                v.err("store.snapshot_path", "must not be empty");
                None
            }
            Some(p) => Some(p.into()),
        },
    };

    let e = &raw.estimation;
    let defaults = EstimateSettings::default();
    let estimation = EstimateSettings {
        image_part_tokens: v
            .positive(
                "estimation.image_part_tokens",
                e.image_part_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(defaults.image_part_tokens),
        audio_part_tokens: v
            .positive(
                "estimation.audio_part_tokens",
                e.audio_part_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(defaults.audio_part_tokens),
        structured_margin_percent: match e.structured_margin_percent {
            Some(p) if !(0..=1000).contains(&p) => {
                v.err(
                    "estimation.structured_margin_percent",
                    "must be within 0..=1000",
                );
                defaults.structured_margin_percent
            }
            Some(p) => p as u64,
            None => defaults.structured_margin_percent,
        },
        structured_margin_tokens: match e.structured_margin_tokens {
            Some(p) if !(0..=1_000_000).contains(&p) => {
                v.err(
                    "estimation.structured_margin_tokens",
                    "must be within 0..=1000000",
                );
                defaults.structured_margin_tokens
            }
            Some(p) => p as u64,
            None => defaults.structured_margin_tokens,
        },
    };
    let min_output_tokens = v
        .positive(
            "estimation.min_output_tokens",
            e.min_output_tokens,
            MAX_LIMIT,
        )
        .unwrap_or(16);
    let stream_extension_step = v
        .positive(
            "estimation.stream_extension_step",
            e.stream_extension_step,
            MAX_LIMIT,
        )
        .unwrap_or(256);

    let mut upstreams = Vec::new();
    let mut upstream_index = HashMap::new();
    for (i, u) in raw.upstreams.iter().enumerate() {
        let path = format!("upstreams[{i}]");
        if !is_valid_id(&u.name) && u.name.is_empty() {
            v.err(format!("{path}.name"), "must not be empty");
        }
        if upstream_index.insert(u.name.clone(), i).is_some() {
            v.err(
                format!("{path}.name"),
                format!("duplicate upstream {:?}", u.name),
            );
        }
        let kind = match u.kind.as_deref().unwrap_or("openai") {
            "openai" => UpstreamKind::Openai,
            "azure" => UpstreamKind::Azure,
            "self_hosted" => UpstreamKind::SelfHosted,
            other => {
                v.err(
                    format!("{path}.kind"),
                    format!("must be \"openai\", \"azure\" or \"self_hosted\", not {other:?}"),
                );
                UpstreamKind::Openai
            }
        };
        match reqwest::Url::parse(&u.base_url) {
            Ok(url) if url.scheme() == "http" || url.scheme() == "https" => {}
            _ => v.err(
                format!("{path}.base_url"),
                format!("not an http(s) URL: {:?}", u.base_url),
            ),
        }
        let api_key = match &u.api_key_env {
            Some(var) => match std::env::var(var) {
                Ok(k) if !k.is_empty() => Some(k),
                _ => {
                    v.err(
                        format!("{path}.api_key_env"),
                        format!("environment variable {var} is not set"),
                    );
                    None
                }
            },
            None => None,
        };
        if kind == UpstreamKind::Azure && u.api_version.is_none() {
            v.err(
                format!("{path}.api_version"),
                "required for kind = \"azure\"",
            );
        }
        let mut forward_client_headers = Vec::new();
        for (j, h) in u.forward_client_headers.iter().enumerate() {
            let h = h.to_ascii_lowercase();
            if matches!(
                h.as_str(),
                "authorization" | "api-key" | "cookie" | "host" | "content-length"
            ) || axum::http::HeaderName::from_bytes(h.as_bytes()).is_err()
            {
                v.err(
                    format!("{path}.forward_client_headers[{j}]"),
                    format!("{h:?} cannot be forwarded"),
                );
            } else {
                forward_client_headers.push(h);
            }
        }
        let limits = v.limits(&format!("{path}.limits"), &u.limits);
        for (field, set) in [
            ("tokens_per_day", limits.tokens_per_day),
            ("tokens_per_month", limits.tokens_per_month),
            ("requests_per_day", limits.requests_per_day),
        ] {
            if set.is_some() {
                v.err(
                    format!("{path}.limits.{field}"),
                    "quotas apply to tenants, not upstreams",
                );
            }
        }
        upstreams.push(UpstreamPolicy {
            name: u.name.clone(),
            kind,
            base_url: u.base_url.trim_end_matches('/').to_string(),
            api_key,
            api_version: u.api_version.clone(),
            limits,
            refund_unused: u.refund_unused.unwrap_or(kind == UpstreamKind::SelfHosted),
            max_tokens_only: u.max_tokens_only.unwrap_or(false),
            supports_n: u.supports_n.unwrap_or(true),
            // A request runs at most `max_request` (its hold lives that
            // long plus `settle_retry`): an upstream may not take longer.
            timeout: v
                .secs(&format!("{path}.timeout_secs"), u.timeout_secs, 600)
                .min(server.max_request),
            connect_timeout: v.secs(
                &format!("{path}.connect_timeout_secs"),
                u.connect_timeout_secs,
                10,
            ),
            cooldown: v.secs(&format!("{path}.cooldown_secs"), u.cooldown_secs, 5),
            learn_from_headers: u.learn_from_headers.unwrap_or(false),
            forward_client_headers,
        });
    }

    let mut models = Vec::new();
    let mut model_index = HashMap::new();
    for (i, m) in raw.models.iter().enumerate() {
        let path = format!("models[{i}]");
        if m.name.is_empty() {
            v.err(format!("{path}.name"), "must not be empty");
        }
        if model_index.insert(m.name.clone(), i).is_some() {
            v.err(
                format!("{path}.name"),
                format!("duplicate model {:?}", m.name),
            );
        }
        if m.upstreams.is_empty() {
            v.err(
                format!("{path}.upstreams"),
                "must list at least one upstream",
            );
        }
        let mut ups = Vec::new();
        for (j, name) in m.upstreams.iter().enumerate() {
            match upstream_index.get(name) {
                Some(&idx) => ups.push(idx),
                None => v.err(
                    format!("{path}.upstreams[{j}]"),
                    format!("unknown upstream {name:?}"),
                ),
            }
        }
        let encoding = match &m.encoding {
            Some(e) => Encoding::parse(e).unwrap_or_else(|| {
                v.err(
                    format!("{path}.encoding"),
                    format!("must be \"o200k_base\" or \"cl100k_base\", not {e:?}"),
                );
                Encoding::O200kBase
            }),
            None => Encoding::for_model(&m.name).unwrap_or(Encoding::O200kBase),
        };
        let default_out = v
            .positive(
                &format!("{path}.default_max_output_tokens"),
                m.default_max_output_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(1024);
        let max_out = v
            .positive(
                &format!("{path}.max_output_tokens"),
                m.max_output_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(default_out.max(16_384));
        if default_out > max_out {
            v.err(
                format!("{path}.default_max_output_tokens"),
                format!("must be ≤ max_output_tokens ({max_out})"),
            );
        }
        let routing = match m.routing.as_deref().unwrap_or("priority") {
            "priority" => Routing::Priority,
            "least_utilised" | "least_utilized" => Routing::LeastUtilised,
            other => {
                v.err(
                    format!("{path}.routing"),
                    format!("must be \"priority\" or \"least_utilised\", not {other:?}"),
                );
                Routing::Priority
            }
        };
        models.push(ModelPolicy {
            name: m.name.clone(),
            upstreams: ups,
            upstream_model: m.upstream_model.clone().unwrap_or_else(|| m.name.clone()),
            encoding,
            default_max_output_tokens: default_out,
            max_output_tokens: max_out,
            reasoning: m.reasoning.unwrap_or(false),
            routing,
        });
    }

    let mut tenants = Vec::new();
    let mut tenant_names = HashMap::new();
    let mut key_index = HashMap::new();
    for (i, t) in raw.tenants.iter().enumerate() {
        let path = format!("tenants[{i}]");
        if !is_valid_id(&t.name) {
            v.err(format!("{path}.name"), "must match [A-Za-z0-9._-]{1,64}");
        }
        if tenant_names.insert(t.name.clone(), i).is_some() {
            v.err(
                format!("{path}.name"),
                format!("duplicate tenant {:?}", t.name),
            );
        }
        let mut keys = Vec::new();
        let mut key_ids = HashMap::new();
        for (j, k) in t.keys.iter().enumerate() {
            let kp = format!("{path}.keys[{j}]");
            if !is_valid_id(&k.id) {
                v.err(format!("{kp}.id"), "must match [A-Za-z0-9._-]{1,64}");
            }
            if key_ids.insert(k.id.clone(), j).is_some() {
                v.err(format!("{kp}.id"), format!("duplicate key id {:?}", k.id));
            }
            let digest = k.sha256.to_ascii_lowercase();
            let mut raw = [0u8; 32];
            if hex::decode_to_slice(&digest, &mut raw).is_err() {
                v.err(
                    format!("{kp}.sha256"),
                    "must be 64 hex digits (run `budgetgate hash-key`)",
                );
            } else if key_index.insert(raw, (i, j)).is_some() {
                v.err(format!("{kp}.sha256"), "the same key is configured twice");
            }
            keys.push(KeyPolicy {
                id: k.id.clone(),
                sha256: digest,
                limits: v.limits(&format!("{kp}.limits"), &k.limits),
            });
        }
        let mut model_limits = BTreeMap::new();
        for (model, l) in &t.model_limits {
            let mp = format!("{path}.model_limits.{model}");
            if !model_index.contains_key(model) {
                v.err(&mp, format!("unknown model {model:?}"));
            }
            model_limits.insert(model.clone(), v.limits(&mp, l));
        }
        let on_store_error = match t.on_store_error.as_deref().unwrap_or("fail_open") {
            "fail_open" => OnStoreError::FailOpen,
            "fail_closed" => OnStoreError::FailClosed,
            other => {
                v.err(
                    format!("{path}.on_store_error"),
                    format!("must be \"fail_open\" or \"fail_closed\", not {other:?}"),
                );
                OnStoreError::FailOpen
            }
        };
        tenants.push(TenantPolicy {
            name: t.name.clone(),
            keys,
            limits: v.limits(&format!("{path}.limits"), &t.limits),
            model_limits,
            on_store_error,
            shadow: t.shadow.unwrap_or(false),
            shadow_limits: v.limits(&format!("{path}.shadow_limits"), &t.shadow_limits),
        });
    }

    if !v.errors.is_empty() {
        return Err(ConfigErrors(v.errors));
    }
    Ok(Policy {
        version,
        server,
        store,
        estimation,
        min_output_tokens,
        stream_extension_step,
        upstreams,
        models,
        tenants,
        model_index,
        key_index,
    })
}
