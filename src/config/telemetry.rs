//! `[telemetry]`, validated: where request spans go, and the traces URL
//! an endpoint names (validation checks it, the exporter sends to it).

use std::time::Duration;

/// `[telemetry]` as validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// The OTLP/HTTP traces URL (`…/v1/traces`); `None`: no spans.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans' resource.
    pub service_name: String,
    /// The share of requests exported, 0 to 1 (by trace id).
    pub sample_ratio: f64,
    /// How often a batch of spans is sent.
    pub export_interval: Duration,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "budgetgate".into(),
            sample_ratio: 1.0,
            export_interval: Duration::from_secs(1),
        }
    }
}

/// The OTLP path of traces, appended to an endpoint given without it.
pub const TRACES_PATH: &str = "/v1/traces";

/// The traces URL of `endpoint` (the collector's base URL, or the full
/// traces URL).
pub fn traces_url(endpoint: &str) -> String {
    let e = endpoint.trim_end_matches('/');
    if e.ends_with(TRACES_PATH) {
        e.to_string()
    } else {
        format!("{e}{TRACES_PATH}")
    }
}
