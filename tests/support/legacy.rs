//! Adapters for test files not yet moved to [`super::TestConfig`]: TOML
//! text in, the one harness underneath. Shrinks to nothing as files move.

use std::sync::Arc;

use budgetgate::clock::ManualClock;
use budgetgate::config::hash_key;
use budgetgate::reserve::BudgetStore;

use super::{Gateway, TestConfig, KEY, NOON};

/// The `keys = [...]` line of a tenant using the test key.
pub fn key_line() -> String {
    format!("keys = [{{ id = \"k1\", sha256 = \"{}\" }}]", hash_key(KEY))
}

/// The standard config as text, with `tenant_limits` (inline table body)
/// and `extra` appended after the tenant.
pub fn config(upstream_base: &str, default_out: u64, tenant_limits: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
[estimation]
stream_extension_step = 256
[[upstreams]]
name = "mock"
kind = "self_hosted"
base_url = "{upstream_base}"
[[models]]
name = "gpt-4o-mini"
upstreams = ["mock"]
encoding = "o200k_base"
default_max_output_tokens = {default_out}
max_output_tokens = 4096
[[models]]
name = "text-embedding-3-small"
upstreams = ["mock"]
encoding = "cl100k_base"
[[tenants]]
name = "t1"
{key}
limits = {{ {tenant_limits} }}
{extra}
"#,
        key = key_line()
    )
}

fn parse(config_toml: &str) -> TestConfig {
    TestConfig(toml::from_str(config_toml).unwrap_or_else(|e| panic!("test config: {e}")))
}

/// Starts a gateway for `config_toml` on a frozen clock at [`NOON`].
pub async fn start_gateway(config_toml: &str) -> Gateway {
    parse(config_toml).start_at(ManualClock::new(NOON)).await
}

/// Starts a gateway for `config_toml` reading time from `clock`.
pub async fn start_gateway_at(config_toml: &str, clock: ManualClock) -> Gateway {
    parse(config_toml).start_at(clock).await
}

/// Starts a gateway for `config_toml` over `store`, reading time from `clock`.
pub async fn start_gateway_with(
    config_toml: &str,
    clock: ManualClock,
    store: Arc<dyn BudgetStore>,
) -> Gateway {
    parse(config_toml).start_with(clock, store).await
}
