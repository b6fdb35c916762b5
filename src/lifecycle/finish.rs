//! The last phase: one log line and the request metrics, written exactly
//! once for every outcome (pingora's "logging" phase). A [`Finish`] is
//! created when the request arrives and travels with it (into the stream
//! relay's response body for streams); if it is dropped before it was written, the
//! request was abandoned (the client went away while it waited), and the
//! drop writes the line.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use super::request_id::RequestId;
use crate::config::{DeploymentId, ModelId, Policy, TenantId};
use crate::gateway::error::ApiError;
use crate::metrics;
use crate::upstreams::relay::{Ending, RelaySummary};

/// How a request ended.
pub enum Outcome<'a> {
    /// Refused before any upstream work (authentication, validation, budgets).
    Refused(&'a ApiError),
    /// Answered by the upstream (not streamed); `settled` tokens.
    Answered {
        /// Tokens settled.
        settled: u64,
    },
    /// The upstream failed or refused; the client got `status`.
    UpstreamFailed {
        /// Status the client got.
        status: u16,
        /// Low-cardinality error label.
        error: &'static str,
    },
    /// A stream ended.
    Streamed(&'a RelaySummary),
}

/// What the final log line says about a request, gathered as it passes
/// the phases.
pub struct Finish {
    policy: Arc<Policy>,
    /// When the request arrived.
    pub started: Instant,
    /// The id the client sees in the dialect's request-id header.
    pub request_id: RequestId,
    /// Set by authentication.
    pub tenant: Option<TenantId>,
    /// Set by preparation.
    pub model: Option<ModelId>,
    /// The deployment of the last attempt.
    pub deployment: Option<DeploymentId>,
    /// The reservation of the last attempt.
    pub reservation_id: Option<String>,
    /// Tokens reserved at admission.
    pub estimated: u64,
    /// The end user, as the keyed hash of its id (never the id).
    pub end_user: Option<Arc<str>>,
    /// The run (`x-budgetgate-run`), if the request named one.
    pub run: Option<Arc<str>>,
    /// Which layer decided the reservation: `store`, `lease` (this
    /// gateway's quota leases), `deny_cache`, `local_limiter`; "" before.
    pub decided_by: &'static str,
    /// Milliseconds it waited in the queue, when it waited.
    pub queued_ms: Option<u64>,
    /// The ledger's name of the dialect (a refusal's span).
    pub dialect_name: &'static str,
    /// The exporter of request spans, while telemetry is on (a refusal's
    /// span is written here; an admitted request's at its settlement).
    pub spans: Option<Arc<crate::telemetry::Spans>>,
    /// The request's method and route (`/v1/responses/{id}`; the path
    /// itself only where no route matched), named by a refusal's line:
    /// an admitted request's model and deployment say what it was.
    pub route: (&'static str, Cow<'static, str>),
    written: bool,
}

impl Finish {
    /// A request that arrived now under `policy`.
    pub fn new(policy: Arc<Policy>, request_id: RequestId) -> Self {
        Self {
            policy,
            started: Instant::now(),
            request_id,
            tenant: None,
            model: None,
            deployment: None,
            reservation_id: None,
            estimated: 0,
            end_user: None,
            run: None,
            decided_by: "",
            queued_ms: None,
            dialect_name: "",
            spans: None,
            route: ("", Cow::Borrowed("")),
            written: false,
        }
    }

    /// The id the client sees in the dialect's request-id header.
    pub fn request_id(&self) -> &str {
        self.request_id.as_str()
    }

    /// Moves the record out (to the task or phase that will end the
    /// request), leaving one that writes nothing (its request id stays, for
    /// the response).
    pub fn hand_off(&mut self) -> Finish {
        let out = Finish {
            policy: self.policy.clone(),
            started: self.started,
            request_id: self.request_id.clone(),
            tenant: self.tenant,
            model: self.model,
            deployment: self.deployment,
            reservation_id: self.reservation_id.take(),
            estimated: self.estimated,
            end_user: self.end_user.take(),
            run: self.run.clone(),
            decided_by: self.decided_by,
            queued_ms: self.queued_ms,
            dialect_name: self.dialect_name,
            spans: self.spans.clone(),
            route: std::mem::take(&mut self.route),
            written: self.written,
        };
        self.written = true;
        out
    }

    /// Writes the final line and metrics of `outcome`.
    pub fn write(mut self, outcome: Outcome<'_>) {
        self.written = true;
        self.log(outcome);
    }

    fn log(&self, outcome: Outcome<'_>) {
        let latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let request_id = self.request_id();
        let p = &*self.policy;
        let tenant = self.tenant.map_or("", |t| p.tenant(t).name.as_str());
        let model = self.model.map_or("", |m| p.model_at(m).name.as_str());
        let deployment = self
            .deployment
            .map_or("", |d| p.deployment(d).name.as_str());
        let reservation_id = self.reservation_id.as_deref().unwrap_or("");
        let estimated = self.estimated;
        let end_user = self.end_user.as_deref().unwrap_or("");
        let run = self.run.as_deref().unwrap_or("");
        let decided_by = self.decided_by;
        let queued_ms = self.queued_ms.unwrap_or(0);
        match outcome {
            Outcome::Refused(e) => {
                if let Some(spans) = &self.spans {
                    spans.refused(&crate::telemetry::Refusal {
                        request_id,
                        tenant,
                        model,
                        dialect: self.dialect_name,
                        status: e.status().as_u16(),
                        error: e.label(),
                        took: self.started.elapsed(),
                    });
                }
                tracing::info!(
                    request_id,
                    method = self.route.0,
                    path = &*self.route.1,
                    tenant,
                    end_user,
                    run,
                    decided_by,
                    outcome = "refused",
                    decision = "refused",
                    status = e.status().as_u16(),
                    error = e.label(),
                    queued_ms,
                    latency_ms,
                    "request refused"
                )
            }
            Outcome::Answered { settled } => tracing::info!(
                request_id,
                reservation_id,
                tenant,
                end_user,
                run,
                decided_by,
                model,
                deployment,
                estimated,
                settled,
                outcome = "answered",
                decision = "admitted",
                queued_ms,
                latency_ms,
                "request finished"
            ),
            Outcome::UpstreamFailed { status, error } => tracing::info!(
                request_id,
                reservation_id,
                tenant,
                end_user,
                run,
                decided_by,
                model,
                deployment,
                estimated,
                outcome = "upstream_failed",
                decision = "admitted",
                status,
                error,
                queued_ms,
                latency_ms,
                "request finished"
            ),
            Outcome::Streamed(summary) => {
                let (label, outcome) = ending_labels(summary.ending);
                metrics::stream_ended(deployment, label);
                if summary.ending == Ending::OverCap {
                    metrics::output_over_cap(deployment, "stream_cut_off");
                }
                tracing::info!(
                    request_id,
                    reservation_id,
                    tenant,
                    end_user,
                    run,
                    decided_by,
                    model,
                    deployment,
                    estimated,
                    settled = summary.settled_tokens,
                    ending = summary.ending.name(),
                    outcome,
                    decision = "admitted",
                    queued_ms,
                    latency_ms,
                    "stream finished"
                )
            }
        }
    }
}

/// The route of a proxied request of `dialect`, on the Azure path form
/// (`/openai/deployments/{deployment}/…`) when `azure`.
pub fn route_of(dialect: crate::dialects::Dialect, azure: bool) -> &'static str {
    use crate::dialects::Dialect;
    match (dialect, azure) {
        (Dialect::ChatCompletions, false) => "/v1/chat/completions",
        (Dialect::ChatCompletions, true) => "/openai/deployments/{deployment}/chat/completions",
        (Dialect::Completions, false) => "/v1/completions",
        (Dialect::Completions, true) => "/openai/deployments/{deployment}/completions",
        (Dialect::Embeddings, false) => "/v1/embeddings",
        (Dialect::Embeddings, true) => "/openai/deployments/{deployment}/embeddings",
        (Dialect::Responses, _) => "/v1/responses",
        (Dialect::Messages, _) => "/v1/messages",
        (Dialect::Gemini, _) => crate::dialects::gemini::PATH,
    }
}

/// Metric label and request outcome of a stream ending.
fn ending_labels(e: Ending) -> (&'static str, &'static str) {
    let outcome = match e {
        Ending::Completed => "streamed",
        Ending::CutOff | Ending::TimeLimit | Ending::OverCap => "cut_off",
        Ending::ClientGone => "client_gone",
        Ending::UpstreamError => "upstream_failed",
    };
    (e.name(), outcome)
}

impl Drop for Finish {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        self.written = true;
        let latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let p = &*self.policy;
        tracing::info!(
            request_id = self.request_id(),
            reservation_id = self.reservation_id.as_deref().unwrap_or(""),
            tenant = self.tenant.map_or("", |t| p.tenant(t).name.as_str()),
            deployment = self
                .deployment
                .map_or("", |d| p.deployment(d).name.as_str()),
            outcome = "client_gone",
            decided_by = self.decided_by,
            queued_ms = self.queued_ms.unwrap_or(0),
            latency_ms,
            "request abandoned by the client"
        );
    }
}
