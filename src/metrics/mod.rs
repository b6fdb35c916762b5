//! Prometheus metrics (`GET /metrics`, text exposition format) through the
//! `metrics` facade and `metrics-exporter-prometheus`. Label values are
//! bounded: tenant, deployment and model names come from the config, budget
//! and outcome names from fixed enums; raw keys, request ids and user input
//! never become labels.
//!
//! - [`settlement`]: the tenant metrics' settlement observer.

pub mod settlement;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::budget::{BudgetName, Scope};

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
            let text = h.render();
            match rendered().as_ref() {
                Some(r) => finish_render(text, r),
                None => text,
            }
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
        Scope::EndUser(..) => "end_user",
        Scope::Run(..) => "run",
    }
}

/// One admission decision. `outcome`: `admitted`, `denied`, `impossible`,
/// `deny_cache`, `fail_open`, `fail_closed`; `budget` names the refusing
/// budget (or `none`). No policy-version label: every admin write is a
/// policy version, and a label per version grew `/metrics` by a dozen
/// series per key created.
pub fn decision(tenant: &str, scope: &str, budget: &str, outcome: &'static str) {
    decision_counter(tenant, scope, budget, outcome).increment(1);
}

fn decision_counter(tenant: &str, scope: &str, budget: &str, outcome: &'static str) -> Counter {
    counter!("budgetgate_decisions_total",
        "tenant" => tenant.to_string(), "scope" => scope.to_string(), "budget" => budget.to_string(),
        "outcome" => outcome)
}

/// A shadow budget would have refused.
pub fn shadow_denial(tenant: &str, scope: &Scope, budget: BudgetName) {
    counter!("budgetgate_shadow_denials_total",
        "tenant" => tenant.to_string(), "scope" => scope_kind(scope), "budget" => budget.as_str())
    .increment(1);
}

/// The series every admitted request of one tenant records, registered once (with the request's budget plan) and
/// then updated through their handles. Looking a series up by name and
/// labels cost ~15k instructions per request across the hot path's eight
/// updates (callgrind, `scripts/instructions.sh`): each lookup clones its
/// labels into a key, hashes and compares it.
pub struct TenantMetrics {
    admitted: Counter,
    reserved: Counter,
    settled: Counter,
    refunded: Counter,
    debt: Counter,
    spend: Counter,
    estimate_ratio: Histogram,
}

impl TenantMetrics {
    /// Registers the series of `tenant` (a config name).
    pub fn new(tenant: &str) -> Self {
        let t = || tenant.to_string();
        Self {
            admitted: decision_counter(tenant, "tenant", "none", "admitted"),
            reserved: counter!("budgetgate_reserved_tokens_total", "tenant" => t()),
            settled: counter!("budgetgate_settled_tokens_total", "tenant" => t()),
            refunded: counter!("budgetgate_refunded_tokens_total", "tenant" => t()),
            debt: counter!("budgetgate_debt_tokens_total", "tenant" => t()),
            spend: counter!("budgetgate_settled_spend_micro_usd_total", "tenant" => t()),
            estimate_ratio: histogram!("budgetgate_estimate_ratio", "tenant" => t()),
        }
    }

    /// An admission (decision `admitted`) that reserved `tokens`.
    pub fn admitted(&self, tokens: u64) {
        self.admitted.increment(1);
        self.reserved.increment(tokens);
    }

    /// A settlement's cost at its deployment's prices, µ$.
    pub fn spent(&self, micros: u64) {
        self.spend.increment(micros);
    }

    /// A settlement: tokens settled, refunded, charged as debt, and the
    /// estimate error as actual / estimated.
    pub fn settled(&self, estimated: u64, actual: u64) {
        self.settled.increment(actual);
        if estimated > actual {
            self.refunded.increment(estimated - actual);
        } else if actual > estimated {
            self.debt.increment(actual - estimated);
        }
        if estimated > 0 {
            self.estimate_ratio.record(actual as f64 / estimated as f64);
        }
    }
}

/// The series one upstream deployment records on every answer, registered
/// once per budget plan (see [`TenantMetrics`] for why).
pub struct DeploymentMetrics {
    deployment: String,
    ok: Counter,
    latency: Histogram,
    remaining_tokens: Gauge,
    remaining_requests: Gauge,
}

impl DeploymentMetrics {
    /// Registers the series of `deployment` (a config name).
    pub fn new(deployment: &str) -> Self {
        let d = || deployment.to_string();
        Self {
            deployment: d(),
            ok: upstream_counter(deployment, "200"),
            latency: histogram!("budgetgate_upstream_latency_seconds", "deployment" => d()),
            remaining_tokens: gauge!("budgetgate_provider_remaining", "deployment" => d(), "limit" => "tokens"),
            remaining_requests: gauge!("budgetgate_provider_remaining", "deployment" => d(), "limit" => "requests"),
        }
    }

    /// An upstream answer with HTTP `status` (or transport failure, status
    /// `error`) and its latency to headers (seconds).
    pub fn answered(&self, status: &str, seconds: f64) {
        if status == "200" {
            self.ok.increment(1);
        } else {
            upstream_counter(&self.deployment, status).increment(1);
        }
        self.latency.record(seconds);
    }

    /// The upstream refused the gateway's credentials (401/403: access
    /// denied, unrecognised or expired): `budgetgate_upstream_auth_failures_total`.
    pub fn auth_failed(&self) {
        counter!("budgetgate_upstream_auth_failures_total", "deployment" => self.deployment.clone())
            .increment(1);
    }

    /// The upstream's usage had `field` rejected (no count, or out of the
    /// request's bounds): settled at the gateway's own count, logged and
    /// counted in `budgetgate_upstream_usage_rejected_total`.
    pub fn usage_rejected(&self, reservation_id: &str, field: &'static str) {
        tracing::warn!(
            deployment = %self.deployment,
            reservation_id,
            field,
            "the upstream's usage was rejected (not a count, or more than the request could use); settled at the gateway's own count"
        );
        counter!("budgetgate_upstream_usage_rejected_total", "deployment" => self.deployment.clone(), "field" => field)
            .increment(1);
    }

    /// What the provider says is left of its own limits (its
    /// `x-ratelimit-remaining-tokens` and `-requests` headers).
    pub fn provider_remaining(&self, tokens: Option<u64>, requests: Option<u64>) {
        if let Some(t) = tokens {
            self.remaining_tokens.set(t as f64);
        }
        if let Some(r) = requests {
            self.remaining_requests.set(r as f64);
        }
    }
}

fn upstream_counter(deployment: &str, status: &str) -> Counter {
    counter!("budgetgate_upstream_requests_total", "deployment" => deployment.to_string(), "status" => status.to_string())
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

/// The fail-open limiter forgot the state of its least recently used
/// budget (`store.fail_open_entries`): that budget starts full again.
pub fn fail_open_eviction() {
    counter!("budgetgate_fail_open_evictions_total").increment(1);
}

/// A stream ended: `completed`, `cut_off`, `time_limit`, `over_cap`, `client_gone`, `upstream_error`.
pub fn stream_ended(deployment: &str, ending: &'static str) {
    counter!("budgetgate_streams_ended_total", "deployment" => deployment.to_string(), "ending" => ending)
        .increment(1);
}

/// An answer of `deployment` whose output passed the cap the gateway sent:
/// `stream_cut_off` (cut off at cap + tolerance) or `answer_debt` (a whole
/// answer, settled as debt).
pub fn output_over_cap(deployment: &str, response: &'static str) {
    counter!("budgetgate_output_over_cap_total", "deployment" => deployment.to_string(), "response" => response)
        .increment(1);
}

/// Streams currently relayed.
pub fn active_streams(delta: f64) {
    gauge!("budgetgate_active_streams").increment(delta);
}

/// Client connections open.
pub fn connections_open(delta: f64) {
    gauge!("budgetgate_connections_open").increment(delta);
}

/// The bound on client connections (`server.max_connections`).
pub fn connections_max(max: usize) {
    gauge!("budgetgate_connections_max").set(max as f64);
}

/// A client connection the gateway closed: `header_timeout`,
/// `write_timeout`, or `evicted` (closed without a request, to make room).
pub fn connection_closed(reason: &'static str) {
    counter!("budgetgate_connections_closed_total", "reason" => reason).increment(1);
}

/// A failed accept other than a client's (out of file descriptors…).
pub fn accept_error() {
    counter!("budgetgate_accept_errors_total").increment(1);
}

/// What [`render`] writes beside the recorder's series: the one
/// `budgetgate_policy_info` series, and the tenants whose series it leaves
/// out. The recorder can neither relabel a series nor forget one, so both
/// are done at render time.
#[derive(Default)]
struct Rendered {
    /// The active policy version (empty before the first policy).
    version: String,
    /// Per tenant name ever served, how many installed policies hold it
    /// (one gateway per process: 1 or 0; tests run several, and a name one
    /// of them drops stays shown while another serves it). At 0 its series
    /// are left out.
    tenants: HashMap<String, usize>,
}

static RENDERED: Mutex<Option<Rendered>> = Mutex::new(None);

fn rendered() -> std::sync::MutexGuard<'static, Option<Rendered>> {
    RENDERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `policy` is served from now on, after `previous` (`None` at start).
/// `budgetgate_policy_info{version}` is one series whose label changes
/// (a series per version, never removed, grew by one per admin write);
/// tenants of `previous` that `policy` no longer has leave `/metrics`.
pub fn policy_installed(previous: Option<&crate::config::Policy>, policy: &crate::config::Policy) {
    let mut guard = rendered();
    let r = guard.get_or_insert_with(Rendered::default);
    r.version.clone_from(&policy.version);
    for t in &policy.tenants {
        *r.tenants.entry(t.name.clone()).or_default() += 1;
    }
    for t in previous.iter().flat_map(|p| &p.tenants) {
        if let Some(n) = r.tenants.get_mut(&t.name) {
            *n = n.saturating_sub(1);
        }
    }
}

/// `text` (the recorder's exposition) without the samples of deleted
/// tenants (a `tenant` label naming one; tenant names need no escaping:
/// `[A-Za-z0-9._-]`), then the `budgetgate_policy_info` series.
fn finish_render(mut text: String, r: &Rendered) -> String {
    let deleted = |t: &str| r.tenants.get(t) == Some(&0);
    if r.tenants.values().any(|&n| n == 0) {
        let mut kept = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            if !line.starts_with('#') && tenant_label(line).is_some_and(deleted) {
                continue;
            }
            kept.push_str(line);
        }
        text = kept;
    }
    if !r.version.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("# TYPE budgetgate_policy_info gauge\nbudgetgate_policy_info{version=\"");
        // Versions are hex digests and counters (`3f9c1a2b7d40.12`).
        text.extend(
            r.version
                .chars()
                .filter(|c| *c != '"' && *c != '\\' && *c != '\n'),
        );
        text.push_str("\"} 1\n");
    }
    text
}

/// The value of the `tenant` label of one sample line, if it has one.
fn tenant_label(line: &str) -> Option<&str> {
    let labels = &line[line.find('{')? + 1..];
    let at = if labels.starts_with("tenant=\"") {
        0
    } else {
        labels.find(",tenant=\"")? + 1
    };
    let value = &labels[at + "tenant=\"".len()..];
    Some(&value[..value.find('"')?])
}

/// A settlement the store failed is retried (same reservation id, so
/// applying it twice changes nothing).
pub fn settlement_retry() {
    counter!("budgetgate_settlement_retries_total").increment(1);
}

/// A settlement given up after `server.settle_retry_secs` of retries: its
/// refund is lost and its slots free themselves when their leases expire.
pub fn settlement_failed() {
    counter!("budgetgate_settlements_failed_total").increment(1);
}

/// Share (0 to 1) of a tenant-side budget left: for a scope kind with
/// several scopes (a tenant's keys, its models) the smallest of them.
pub fn budget_remaining_share(
    tenant: &str,
    scope_kind: &'static str,
    budget: BudgetName,
    share: f64,
) {
    gauge!("budgetgate_budget_remaining_ratio",
        "tenant" => tenant.to_string(), "scope" => scope_kind, "budget" => budget.as_str())
    .set(share);
}

/// Share (0 to 1) of an upstream deployment's budget left.
pub fn upstream_budget_remaining_share(deployment: &str, budget: BudgetName, share: f64) {
    gauge!("budgetgate_upstream_budget_remaining_ratio",
        "deployment" => deployment.to_string(), "budget" => budget.as_str())
    .set(share);
}

/// Every store operation, as the `op` label of the store series.
const STORE_OPS: [&str; 6] = ["reserve", "settle", "extend", "renew", "inspect", "lower"];

/// Every way a stream ends, as the `ending` label.
const STREAM_ENDINGS: [&str; 4] = ["completed", "cut_off", "client_gone", "upstream_error"];

/// Registers at zero the series the observability kit (`deploy/`) reads,
/// for every tenant and deployment of `policy`, so that dashboards and
/// alerts (`increase(...) > 0`, absence) see them before the first event.
/// Registering an existing series changes nothing.
pub fn register_policy_series(policy: &crate::config::Policy) {
    // Series that only the ledger writes: at zero from the start, so a
    // scrape's series do not change with traffic.
    for outcome in ["written", "duplicate", "dropped"] {
        counter!("budgetgate_ledger_rows_total", "outcome" => outcome).increment(0);
    }
    gauge!("budgetgate_ledger_buffered_rows").increment(0.0);
    for t in &policy.tenants {
        let tn = || t.name.clone();
        decision_counter(&t.name, "tenant", "none", "admitted").increment(0);
        for c in [
            "budgetgate_reserved_tokens_total",
            "budgetgate_settled_tokens_total",
            "budgetgate_refunded_tokens_total",
            "budgetgate_debt_tokens_total",
            "budgetgate_settled_spend_micro_usd_total",
        ] {
            counter!(c, "tenant" => tn()).increment(0);
        }
        let _ = histogram!("budgetgate_estimate_ratio", "tenant" => tn());
        for mode in ["fail_open", "fail_closed"] {
            counter!("budgetgate_degraded_decisions_total", "tenant" => tn(), "mode" => mode)
                .increment(0);
        }
    }
    for u in &policy.upstreams {
        upstream_counter(&u.name, "200").increment(0);
        counter!("budgetgate_upstream_auth_failures_total", "deployment" => u.name.clone())
            .increment(0);
        let _ = histogram!("budgetgate_upstream_latency_seconds", "deployment" => u.name.clone());
        for ending in STREAM_ENDINGS {
            counter!("budgetgate_streams_ended_total", "deployment" => u.name.clone(), "ending" => ending)
                .increment(0);
        }
    }
    for op in STORE_OPS {
        let _ = crate::budget::metrics::store_call_histogram(op);
        counter!("budgetgate_store_errors_total", "op" => op).increment(0);
    }
    gauge!("budgetgate_active_streams").increment(0.0);
    counter!("budgetgate_settlement_retries_total").increment(0);
    counter!("budgetgate_settlements_failed_total").increment(0);
    counter!("budgetgate_deny_cache_evictions_total").increment(0);
    counter!("budgetgate_fail_open_evictions_total").increment(0);
    // Written a second after start by a memory store that persists: at
    // zero before, so a scrape's series do not change with time alone.
    counter!("budgetgate_store_snapshots_total").increment(0);
    counter!("budgetgate_store_snapshot_failures_total").increment(0);
}

/// A lost-reply compensation ended: `settled`, `voided`, `voided_ahead`
/// (a void tombstone written before the late reservation), or `dropped`.
pub fn compensation(outcome: &'static str) {
    counter!("budgetgate_compensations_total", "outcome" => outcome).increment(1);
}

/// The upstream's input count over the gateway's input estimate of one
/// answer, per public model (`budgetgate_input_settled_per_estimated`): how
/// an operator calibrates a Messages model's `token_ratio` (docs/API.md).
/// (An answer without an upstream input count, filled from the estimate, observes 1.)
pub fn input_calibration(model: &str, estimated: u64, used: &crate::dialects::UsageBreakdown) {
    if let (Some(input), true) = (used.input(), estimated > 0) {
        calibration_series(model).record(input as f64 / estimated as f64);
    }
}

/// Most models whose calibration series are kept registered; past it the
/// handles are dropped and registered again (the series themselves stay).
const CALIBRATION_MODELS_MAX: usize = 1024;

/// The calibration histogram of `model`, registered on its first use: a
/// lookup by name and label through the recorder (the label cloned into a
/// key, hashed, compared) cost ~1.2k instructions on every answer.
/// Model names come from the configuration, so the map stays small.
fn calibration_series(model: &str) -> Histogram {
    static SERIES: OnceLock<std::sync::Mutex<foldhash::HashMap<String, Histogram>>> =
        OnceLock::new();
    let mut series = SERIES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(h) = series.get(model) {
        return h.clone();
    }
    if series.len() >= CALIBRATION_MODELS_MAX {
        series.clear();
    }
    let h = histogram!("budgetgate_input_settled_per_estimated", "model" => model.to_string());
    series.insert(model.to_string(), h.clone());
    h
}

/// Ledger rows by what became of them (`budgetgate_ledger_rows_total`):
/// `written`, `duplicate` (the reservation had its row already), `dropped`
/// (the buffer was full).
pub fn ledger_rows(outcome: &'static str, n: u64) {
    if n > 0 {
        counter!("budgetgate_ledger_rows_total", "outcome" => outcome).increment(n);
    }
}

/// Ledger rows waiting in the buffer or being written (`budgetgate_ledger_buffered_rows`).
pub fn ledger_buffered(rows: usize) {
    gauge!("budgetgate_ledger_buffered_rows").set(rows as f64);
}

/// A ledger batch the database did not take (`budgetgate_ledger_write_failures_total`).
pub fn ledger_write_failed() {
    counter!("budgetgate_ledger_write_failures_total").increment(1);
}

/// A budget alert fired (`budgetgate_alerts_fired_total{budget, threshold}`):
/// once per threshold, budget and window on each gateway.
pub fn alert_fired(budget: &'static str, threshold_percent: u64) {
    counter!("budgetgate_alerts_fired_total", "budget" => budget, "threshold" => threshold_percent.to_string())
        .increment(1);
}

/// What became of one webhook attempt (`budgetgate_alert_deliveries_total{outcome}`):
/// `delivered`, `retried`, `given_up`, `dropped` (the queue was full).
pub fn alert_delivery(outcome: &'static str) {
    counter!("budgetgate_alert_deliveries_total", "outcome" => outcome).increment(1);
}

/// The control database as this gateway serves it: the version counter
/// of the snapshot served, and how many of its entities are quarantined
/// (not served: they do not merge, docs/CONTROL.md).
pub fn control_served(version: i64, quarantined: usize) {
    gauge!("budgetgate_control_version").set(version as f64);
    gauge!("budgetgate_control_quarantined").set(quarantined as f64);
}

/// Seconds since a read of the control database last found the served
/// snapshot current.
pub fn control_snapshot_age(seconds: f64) {
    gauge!("budgetgate_control_snapshot_age_seconds").set(seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_tenants_lines_are_left_out_and_policy_info_is_one_line() {
        let text = "# TYPE budgetgate_decisions_total counter\n\
            budgetgate_decisions_total{tenant=\"gone\",scope=\"tenant\"} 3\n\
            budgetgate_decisions_total{tenant=\"kept\",scope=\"tenant\"} 4\n\
            budgetgate_budget_remaining_ratio{scope=\"key\",tenant=\"gone\"} 0.5\n\
            budgetgate_other{model=\"a,tenant=\\\"gone\"} 1\n"
            .to_string();
        let r = Rendered {
            version: "abc.7".into(),
            tenants: [("gone".to_string(), 0), ("kept".to_string(), 1)].into(),
        };
        let out = finish_render(text, &r);
        assert_eq!(
            out,
            "# TYPE budgetgate_decisions_total counter\n\
            budgetgate_decisions_total{tenant=\"kept\",scope=\"tenant\"} 4\n\
            budgetgate_other{model=\"a,tenant=\\\"gone\"} 1\n\
            # TYPE budgetgate_policy_info gauge\n\
            budgetgate_policy_info{version=\"abc.7\"} 1\n"
        );
    }
}
