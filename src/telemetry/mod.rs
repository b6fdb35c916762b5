//! Request spans over OTLP (docs/OPERATIONS.md): each
//! settled or voided reservation becomes one span, exported over
//! OTLP/HTTP (protobuf) to `[telemetry] otlp_endpoint`, so that a platform
//! team sees the gateway in the traces it already has. Off by default.
//!
//! The span is built from the settlement event when the store has
//! answered the settlement ([`settlement::RequestSpans`], an observer of
//! it like the spend ledger), from the same figures as the ledger's row:
//! tokens in and out, the µ$ cost, the tenant, how the request ended. A refused request
//! (no reservation) gets a span of its refusal with its log line
//! ([`Spans::refused`]). When telemetry is off nothing is built: one
//! branch on an `Option` at the capture and at arrival.
//!
//! Attribute names follow the OpenTelemetry GenAI semantic conventions
//! (<https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/>,
//! now kept in the semantic-conventions-genai repository):
//! `gen_ai.operation.name`, `gen_ai.provider.name` (and the attribute it
//! replaced, `gen_ai.system`, which many backends still read),
//! `gen_ai.request.model`, `gen_ai.response.model`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`; the
//! gateway's own facts are under `budgetgate.*`. Spans are exported in
//! batches by the SDK's processor on a thread of its own, never on a
//! serving thread.

mod attributes;
pub mod settlement;

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanKind, Status, Tracer as _, TracerProvider as _,
};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

use crate::config::telemetry::{traces_url, TelemetrySettings};
use crate::settlement::{dialect_name, Outcome, Settled, Who};
pub use attributes::{operation_name, provider_name};

/// A refused request, as its span tells it.
#[derive(Debug, Clone, Copy)]
pub struct Refusal<'a> {
    /// The id the client saw.
    pub request_id: &'a str,
    /// The tenant, when authentication got that far ("" otherwise).
    pub tenant: &'a str,
    /// The public model, when the body was read that far ("" otherwise).
    pub model: &'a str,
    /// The ledger's name of the dialect.
    pub dialect: &'static str,
    /// The HTTP status answered.
    pub status: u16,
    /// The refusal's label (as in the request log).
    pub error: &'static str,
    /// From arrival to the answer.
    pub took: Duration,
}

/// The exporter of request spans.
pub struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Spans {
    /// Starts the exporter `settings` configure; `None` when telemetry is
    /// off. Must be called within a Tokio runtime or not: the exporter's
    /// client and batch thread are its own.
    pub fn start(settings: &TelemetrySettings) -> Result<Option<Spans>, String> {
        let Some(endpoint) = &settings.otlp_endpoint else {
            return Ok(None);
        };
        use opentelemetry_otlp::WithExportConfig;
        // Logged without user, password, path or query.
        let redacted = crate::upstreams::redact::endpoint(endpoint);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(traces_url(endpoint))
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                // The exporter's error may quote the endpoint, password included.
                let said = e
                    .to_string()
                    .replace(&traces_url(endpoint), &redacted)
                    .replace(endpoint.as_str(), &redacted);
                format!("telemetry: the OTLP exporter did not start: {said}")
            })?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(settings.export_interval)
            .with_max_queue_size(8_192)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::TraceIdRatioBased(settings.sample_ratio))
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("budgetgate");
        tracing::info!(endpoint = %redacted, sample_ratio = settings.sample_ratio, "request spans exported over OTLP/HTTP");
        Ok(Some(Spans { provider, tracer }))
    }

    /// Exports the span of the settlement `e` of the reservation `who`
    /// describes, ended at `at_micros`.
    pub fn export(&self, e: &Settled<'_>, who: &Who, at_micros: u64) {
        let f = e.figures();
        let operation = operation_name(dialect_name(who.dialect));
        let start = at(who.admitted_micros.min(at_micros).max(1));
        let builder = SpanBuilder::from_name(format!("{operation} {}", who.scope.model))
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attributes::of(e.id, who, &f));
        let mut span = self.tracer.build_with_context(builder, &Context::new());
        match f.outcome {
            Outcome::UpstreamFailed => span.set_status(Status::error("upstream failed")),
            Outcome::Voided => span.set_status(Status::error("never reached the upstream")),
            _ => {}
        }
        span.end_with_timestamp(at(at_micros));
    }

    /// Exports the span of a refused request (no reservation, no cost).
    pub fn refused(&self, r: &Refusal<'_>) {
        use opentelemetry::KeyValue;
        let end = SystemTime::now();
        let operation = operation_name(r.dialect);
        let name = match r.model {
            "" => operation.to_string(),
            m => format!("{operation} {m}"),
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("budgetgate.outcome", "refused"),
            KeyValue::new("budgetgate.error", r.error),
            KeyValue::new("http.response.status_code", i64::from(r.status)),
            KeyValue::new("budgetgate.request_id", r.request_id.to_string()),
        ];
        if !r.model.is_empty() {
            attributes.push(KeyValue::new("gen_ai.request.model", r.model.to_string()));
        }
        if !r.tenant.is_empty() {
            attributes.push(KeyValue::new("budgetgate.tenant", r.tenant.to_string()));
        }
        let builder = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Server)
            .with_start_time(end.checked_sub(r.took).unwrap_or(end))
            .with_attributes(attributes);
        let mut span = self.tracer.build_with_context(builder, &Context::new());
        span.set_status(Status::error(r.error));
        span.end_with_timestamp(end);
    }

    /// Sends what is queued and stops the exporter (blocking: call it off
    /// the serving threads).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "telemetry: spans not all exported at shutdown");
        }
    }
}

fn at(micros: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(micros)
}
