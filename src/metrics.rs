//! Prometheus metrics (`GET /metrics`, text exposition format) through the
//! `metrics` facade and `metrics-exporter-prometheus`. Label values are
//! bounded: tenant, deployment and model names come from the config, budget
//! and outcome names from fixed enums; raw keys, request ids and user input
//! never become labels.

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::reserve::{BudgetName, Scope};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the global recorder once per process; later calls reuse it.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .set_buckets(&[
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ])
                .ok()?
                .install_recorder()
                .ok()
        })
        .as_ref()
}

/// Drains histogram samples into their buckets every `period` until the
/// returned task is aborted. The exporter keeps raw samples until upkeep
/// runs, so without this a gateway that is never scraped grows by every
/// histogram sample it records (a few dozen bytes per request).
pub fn spawn_upkeep(period: std::time::Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(h) = install() {
                h.run_upkeep();
            }
        }
    })
}

/// The current exposition text (empty if no recorder could be installed).
pub fn render() -> String {
    match install() {
        Some(h) => {
            h.run_upkeep();
            h.render()
        }
        None => String::new(),
    }
}

/// Kind of a scope, as a label.
pub fn scope_kind(scope: &Scope) -> &'static str {
    match scope {
        Scope::Tenant(_) => "tenant",
        Scope::Key(..) => "key",
        Scope::TenantModel(..) => "tenant_model",
        Scope::Upstream(_) => "upstream",
    }
}

/// One admission decision. `outcome`: `admitted`, `denied`, `impossible`,
/// `deny_cache`, `fail_open`, `fail_closed`; `budget` names the refusing
/// budget (or `none`).
pub fn decision(
    tenant: &str,
    scope: &str,
    budget: &str,
    outcome: &'static str,
    policy_version: &str,
) {
    counter!("budgetgate_decisions_total",
        "tenant" => tenant.to_string(), "scope" => scope.to_string(), "budget" => budget.to_string(),
        "outcome" => outcome, "policy_version" => policy_version.to_string())
    .increment(1);
}

/// A shadow budget would have refused.
pub fn shadow_denial(tenant: &str, scope: &Scope, budget: BudgetName) {
    counter!("budgetgate_shadow_denials_total",
        "tenant" => tenant.to_string(), "scope" => scope_kind(scope), "budget" => budget.as_str())
    .increment(1);
}

/// Tokens reserved at admission (tokens).
pub fn reserved(tenant: &str, tokens: u64) {
    counter!("budgetgate_reserved_tokens_total", "tenant" => tenant.to_string()).increment(tokens);
}

/// A settlement: tokens settled, refunded, charged as debt, and the
/// estimate error as actual / estimated.
pub fn settled(tenant: &str, estimated: u64, actual: u64) {
    let t = tenant.to_string();
    counter!("budgetgate_settled_tokens_total", "tenant" => t.clone()).increment(actual);
    if estimated > actual {
        counter!("budgetgate_refunded_tokens_total", "tenant" => t.clone())
            .increment(estimated - actual);
    } else if actual > estimated {
        counter!("budgetgate_debt_tokens_total", "tenant" => t.clone())
            .increment(actual - estimated);
    }
    if estimated > 0 {
        histogram!("budgetgate_estimate_ratio", "tenant" => t)
            .record(actual as f64 / estimated as f64);
    }
}

/// A store call's latency (seconds) and whether it failed.
pub fn store_call(op: &'static str, seconds: f64, ok: bool) {
    histogram!("budgetgate_store_call_seconds", "op" => op).record(seconds);
    if !ok {
        counter!("budgetgate_store_errors_total", "op" => op).increment(1);
    }
}

/// One batch of `calls` reserve and settle calls sent to Redis (calls
/// that arrive while earlier batches are on the wire go together; calls per
/// batch = `budgetgate_redis_batch_calls_total / budgetgate_redis_batches_total`).
pub fn redis_batch(calls: usize) {
    counter!("budgetgate_redis_batches_total").increment(1);
    counter!("budgetgate_redis_batch_calls_total").increment(calls as u64);
}

/// A decision taken without the store (`fail_open` or `fail_closed`).
pub fn degraded(tenant: &str, mode: &'static str) {
    counter!("budgetgate_degraded_decisions_total", "tenant" => tenant.to_string(), "mode" => mode)
        .increment(1);
}

/// A refusal answered from the local deny cache, without a store call.
pub fn deny_cache_hit(tenant: &str, budget: BudgetName) {
    counter!("budgetgate_deny_cache_hits_total", "tenant" => tenant.to_string(), "budget" => budget.as_str())
        .increment(1);
}

/// A stream ended: `completed`, `cut_off`, `client_gone`, `upstream_error`.
pub fn stream_ended(deployment: &str, ending: &'static str) {
    counter!("budgetgate_streams_ended_total", "deployment" => deployment.to_string(), "ending" => ending)
        .increment(1);
}

/// Streams currently relayed.
pub fn active_streams(delta: f64) {
    gauge!("budgetgate_active_streams").increment(delta);
}

/// An upstream answer (or transport failure, status `error`) and its latency to headers (seconds).
pub fn upstream(deployment: &str, status: &str, seconds: f64) {
    counter!("budgetgate_upstream_requests_total", "deployment" => deployment.to_string(), "status" => status.to_string())
        .increment(1);
    histogram!("budgetgate_upstream_latency_seconds", "deployment" => deployment.to_string())
        .record(seconds);
}

/// What a provider says is left of its own limit (`tokens` or `requests`).
pub fn provider_remaining(deployment: &str, what: &'static str, value: u64) {
    gauge!("budgetgate_provider_remaining", "deployment" => deployment.to_string(), "limit" => what).set(value as f64);
}

/// The active policy version (value 1 on the current version's series).
pub fn policy_version(previous: Option<&str>, version: &str) {
    if let Some(p) = previous {
        gauge!("budgetgate_policy_info", "version" => p.to_string()).set(0.0);
    }
    gauge!("budgetgate_policy_info", "version" => version.to_string()).set(1.0);
}
