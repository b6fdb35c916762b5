//! The one harness of the integration tests.
//!
//! - [`config`]: typed configs ([`TestConfig`]), rendered to TOML once.
//! - [`gateway`]: a gateway in this process ([`Gateway`]), started through
//!   the binary's own `app::run` on a frozen clock; budgets' remaining values.
//! - [`process`]: the real binary as a child process ([`GatewayProcess`]).
//! - [`http`]: requests, headers, SSE parsing, metrics, shared by both.
//! - [`python`]: the official `openai` SDK scripts under `tests/python/`.
//! - [`redis_server`]: real `redis-server`s and Redis Clusters.
//! - [`postgres`]: a real PostgreSQL server per test (the control database).
//! - [`mock_upstream`]: the simulated upstream, the very file the README
//!   runs as `examples/mock_upstream.rs`.
#![allow(dead_code, unused_imports)]

pub mod config;
pub mod gateway;
pub mod http;
#[path = "../../examples/mock_upstream.rs"]
pub mod mock_upstream;
pub mod postgres;
pub mod process;
pub mod python;
pub mod redis_server;
pub mod store_spy;

pub use config::{limits, price, Kind, Limits, LimitsExt, RawPrice, RawPriceTier, TestConfig};
pub use gateway::{end_user_key, Gateway};
pub use http::*;
pub use process::GatewayProcess;
pub use python::{deltas, run_python, run_python_any, sdk_stream};

/// The API key of tenant `t1` in [`TestConfig::standard`].
pub const KEY: &str = "sk-test-budgetgate";

/// 2026-11-30T12:00:00Z in UTC microseconds: mid-day, far from a quota boundary.
pub const NOON: u64 = 1_796_040_000_000_000;

/// `rel` inside the repository (`""`: its root).
pub fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The gateway's input-token estimate of a `gpt-4o-mini` (o200k_base) chat body.
pub fn chat_input_tokens(body: &serde_json::Value) -> u64 {
    use budgetgate::config::estimate::{Encoding, EstimateSettings};
    use budgetgate::dialects::Dialect;
    use budgetgate::estimate::{estimate, ModelEstimation};
    let me = ModelEstimation {
        encoding: Encoding::O200kBase,
        default_max_output_tokens: 16,
        max_output_tokens: Some(4096),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: EstimateSettings::default().image_cost("gpt-4o-mini", "gpt-4o-mini"),
    };
    estimate(
        Dialect::ChatCompletions,
        body,
        &me,
        &EstimateSettings::default(),
        budgetgate::estimate::TokenRoom::default(),
    )
    .expect("estimate")
    .input_tokens
}

/// Input tokens of a chat `messages` array by OpenAI's published rule (3 per
/// message, 1 per `name`, 3 to prime the answer), each string counted by
/// `count`: the reference both the estimator and the simulated upstream
/// are checked against.
pub fn rule_count(messages: &serde_json::Value, count: impl Fn(&str) -> u64) -> u64 {
    let mut n = 3;
    for m in messages.as_array().expect("messages is an array") {
        n += 3;
        for (k, v) in m.as_object().expect("a message is an object") {
            n += count(v.as_str().expect("string fields only"));
            if k == "name" {
                n += 1;
            }
        }
    }
    n
}

/// Starts the simulated upstream with default settings.
pub async fn start_mock() -> mock_upstream::MockUpstream {
    mock_upstream::start(mock_upstream::MockConfig::default())
        .await
        .expect("mock upstream")
}

/// Fails unless no header of any request `log` recorded at the upstream
/// holds `key` (a client's gateway key, whole or inside a longer value).
pub fn assert_no_header_holds(log: &[mock_upstream::RecordedRequest], key: &str) {
    for r in log {
        for (name, value) in &r.headers {
            assert!(
                !value.contains(key),
                "{} {}: header {name} carries the client's gateway key",
                r.method,
                r.path
            );
        }
    }
}
