//! Typed test configs: the gateway's own `raw` config types, built in code
//! and rendered to TOML once (no text edited by string replacement).
//!
//! [`TestConfig::standard`] is the config most tests start from: upstream
//! `mock` (self-hosted) serving `gpt-4o-mini` and `text-embedding-3-small`,
//! tenant `t1` with key [`KEY`]; tests change its fields before starting.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use budgetgate::config::hash_key;
pub use budgetgate::config::raw::{
    RawConfig, RawKey, RawLimits as Limits, RawModel, RawPrice, RawPriceTier, RawTenant,
    RawUpstream,
};

use super::KEY;

/// Kind of an upstream deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Openai,
    Azure,
    SelfHosted,
    Anthropic,
    Bedrock,
}

impl Kind {
    /// The name `kind = "…"` takes.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Openai => "openai",
            Kind::Azure => "azure",
            Kind::SelfHosted => "self_hosted",
            Kind::Anthropic => "anthropic",
            Kind::Bedrock => "bedrock",
        }
    }
}

/// Limits built field by field: `limits().tpm(1000).rpm(10)`.
pub fn limits() -> Limits {
    Limits::default()
}

/// Setters for every limit of a scope (a negative limit, for a test of
/// validation, is set on the field itself).
pub trait LimitsExt {
    fn rpm(self, n: u64) -> Self;
    fn tpm(self, n: u64) -> Self;
    fn rpm_burst(self, n: u64) -> Self;
    fn tpm_burst(self, n: u64) -> Self;
    fn input_tpm(self, n: u64) -> Self;
    fn output_tpm(self, n: u64) -> Self;
    fn input_tpm_burst(self, n: u64) -> Self;
    fn output_tpm_burst(self, n: u64) -> Self;
    fn cache_read_weight(self, per_mille: u64) -> Self;
    fn max_concurrent(self, n: u64) -> Self;
    fn tokens_per_day(self, n: u64) -> Self;
    /// A rolling quota: tokens in the last 5 hours.
    fn tokens_per_5h(self, n: u64) -> Self;
    fn tokens_per_month(self, n: u64) -> Self;
    fn requests_per_day(self, n: u64) -> Self;
    /// A dollar budget per UTC day, decimal USD (`"1.00"`).
    fn usd_per_day(self, usd: &str) -> Self;
    /// A dollar budget per UTC month, decimal USD.
    fn usd_per_month(self, usd: &str) -> Self;
}

impl LimitsExt for Limits {
    fn rpm(mut self, n: u64) -> Self {
        self.rpm = Some(n as i64);
        self
    }
    fn tpm(mut self, n: u64) -> Self {
        self.tpm = Some(n as i64);
        self
    }
    fn rpm_burst(mut self, n: u64) -> Self {
        self.rpm_burst = Some(n as i64);
        self
    }
    fn tpm_burst(mut self, n: u64) -> Self {
        self.tpm_burst = Some(n as i64);
        self
    }
    fn input_tpm(mut self, n: u64) -> Self {
        self.input_tpm = Some(n as i64);
        self
    }
    fn output_tpm(mut self, n: u64) -> Self {
        self.output_tpm = Some(n as i64);
        self
    }
    fn input_tpm_burst(mut self, n: u64) -> Self {
        self.input_tpm_burst = Some(n as i64);
        self
    }
    fn output_tpm_burst(mut self, n: u64) -> Self {
        self.output_tpm_burst = Some(n as i64);
        self
    }
    fn cache_read_weight(mut self, per_mille: u64) -> Self {
        self.cache_read_weight = Some(per_mille as i64);
        self
    }
    fn max_concurrent(mut self, n: u64) -> Self {
        self.max_concurrent = Some(n as i64);
        self
    }
    fn tokens_per_5h(mut self, n: u64) -> Self {
        self.tokens_per_5h = Some(n as i64);
        self
    }
    fn tokens_per_day(mut self, n: u64) -> Self {
        self.tokens_per_day = Some(n as i64);
        self
    }
    fn tokens_per_month(mut self, n: u64) -> Self {
        self.tokens_per_month = Some(n as i64);
        self
    }
    fn requests_per_day(mut self, n: u64) -> Self {
        self.requests_per_day = Some(n as i64);
        self
    }
    fn usd_per_day(mut self, usd: &str) -> Self {
        self.usd_per_day = Some(usd.into());
        self
    }
    fn usd_per_month(mut self, usd: &str) -> Self {
        self.usd_per_month = Some(usd.into());
        self
    }
}

/// A price in USD per million tokens: `input` and `output`, the cached
/// input and both cache writes as given (`None`: left out of the file).
pub fn price(input: &str, output: &str) -> RawPrice {
    RawPrice {
        input: Some(input.into()),
        output: Some(output.into()),
        ..RawPrice::default()
    }
}

/// An upstream deployment with no limits.
pub fn upstream(name: &str, kind: Kind, base_url: &str) -> RawUpstream {
    RawUpstream {
        name: name.into(),
        kind: Some(kind.name().into()),
        base_url: base_url.into(),
        ..RawUpstream::default()
    }
}

/// A public model served by `upstreams` in that order.
pub fn model(name: &str, upstreams: &[&str]) -> RawModel {
    RawModel {
        name: name.into(),
        upstreams: upstreams.iter().map(|u| u.to_string()).collect(),
        ..RawModel::default()
    }
}

/// A tenant with one key (`id`, the digest of `secret`) and `limits`.
pub fn tenant(name: &str, key_id: &str, secret: &str, limits: Limits) -> RawTenant {
    RawTenant {
        name: name.into(),
        keys: vec![key(key_id, secret)],
        limits,
        ..RawTenant::default()
    }
}

/// A key of a tenant: `id` and the SHA-256 of `secret`.
pub fn key(id: &str, secret: &str) -> RawKey {
    RawKey {
        id: id.into(),
        sha256: hash_key(secret),
        limits: Limits::default(),
        ..RawKey::default()
    }
}

/// A whole config, built in code; rendered once by [`TestConfig::render`].
#[derive(Debug, Clone, Default)]
pub struct TestConfig(pub RawConfig);

impl Deref for TestConfig {
    type Target = RawConfig;
    fn deref(&self) -> &RawConfig {
        &self.0
    }
}

impl DerefMut for TestConfig {
    fn deref_mut(&mut self) -> &mut RawConfig {
        &mut self.0
    }
}

impl TestConfig {
    /// Nothing configured but a loopback listener on a free port.
    pub fn new() -> Self {
        let mut c = TestConfig::default();
        c.server.listen = Some("127.0.0.1:0".into());
        c
    }

    /// Upstream `mock` (self-hosted, at `upstream_base`) serving
    /// `gpt-4o-mini` (o200k_base, default output `default_out`, at most
    /// 4096) and `text-embedding-3-small` (cl100k_base); tenant `t1` with
    /// key `k1` = [`KEY`] and `tenant_limits`; stream extension step 256.
    pub fn standard(upstream_base: &str, default_out: u64, tenant_limits: Limits) -> Self {
        let mut c = TestConfig::new();
        c.estimation.stream_extension_step = Some(256);
        c.upstreams
            .push(upstream("mock", Kind::SelfHosted, upstream_base));
        c.models.push(RawModel {
            encoding: Some("o200k_base".into()),
            default_max_output_tokens: Some(default_out as i64),
            max_output_tokens: Some(4096),
            ..model("gpt-4o-mini", &["mock"])
        });
        c.models.push(RawModel {
            encoding: Some("cl100k_base".into()),
            ..model("text-embedding-3-small", &["mock"])
        });
        c.tenants.push(tenant("t1", "k1", KEY, tenant_limits));
        c
    }

    /// The Redis store at `url` (`redis://…` or `redis+cluster://…`).
    pub fn redis(mut self, url: &str) -> Self {
        self.store.kind = Some("redis".into());
        self.store.url = Some(url.into());
        self
    }

    /// [`TestConfig::redis`] as a fleet of gateways shares it: keys under
    /// `key_prefix`, a 2 s store timeout, every tenant fail-closed (a
    /// gateway that cannot reach the store refuses instead of guessing).
    pub fn redis_fleet(self, url: &str, key_prefix: &str) -> Self {
        let mut c = self.redis(url);
        c.store.timeout_ms = Some(2000);
        c.store.key_prefix = Some(key_prefix.into());
        for t in &mut c.0.tenants {
            t.on_store_error = Some("fail_closed".into());
        }
        c
    }

    /// Adds a tenant.
    pub fn with_tenant(mut self, t: RawTenant) -> Self {
        self.tenants.push(t);
        self
    }

    /// The tenant named `name`.
    pub fn tenant(&mut self, name: &str) -> &mut RawTenant {
        self.0
            .tenants
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tenant {name:?} in the test config"))
    }

    /// The model named `name`.
    pub fn model(&mut self, name: &str) -> &mut RawModel {
        self.0
            .models
            .iter_mut()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no model {name:?} in the test config"))
    }

    /// The upstream named `name`.
    pub fn upstream(&mut self, name: &str) -> &mut RawUpstream {
        self.0
            .upstreams
            .iter_mut()
            .find(|u| u.name == name)
            .unwrap_or_else(|| panic!("no upstream {name:?} in the test config"))
    }

    /// Renames upstream `from` to `to` everywhere it is named.
    pub fn rename_upstream(&mut self, from: &str, to: &str) {
        self.upstream(from).name = to.into();
        for m in &mut self.0.models {
            for u in &mut m.upstreams {
                if u == from {
                    *u = to.into();
                }
            }
        }
    }

    /// The config as TOML text.
    pub fn render(&self) -> String {
        toml::to_string(&self.0).expect("a test config renders as TOML")
    }

    /// The validated policy of this config.
    pub fn policy(&self) -> budgetgate::config::Policy {
        budgetgate::config::Policy::from_toml(&self.render())
            .unwrap_or_else(|e| panic!("test config invalid: {e}\n{}", self.render()))
    }

    /// Writes the config to `dir/budgetgate.toml`; returns the path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("budgetgate.toml");
        self.write_to(&path);
        path
    }

    /// Writes the config to `path` in place (truncate and rewrite).
    pub fn write_to(&self, path: &Path) {
        std::fs::write(path, self.render()).expect("write the test config");
    }

    /// Reads a shipped config (e.g. `config/local.toml`) into a test config.
    pub fn read(path: &Path) -> Self {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        TestConfig(toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }
}
