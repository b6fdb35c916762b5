//! `[telemetry]`: request spans over OTLP/HTTP. Bound at start: the
//! exporter runs once per process.

use std::time::Duration;

use super::V;
use crate::config::raw::RawTelemetry;
use crate::config::telemetry::{traces_url, TelemetrySettings};

/// Longest `service.name` accepted, bytes.
const MAX_SERVICE_NAME: usize = 255;

pub(super) fn telemetry(v: &mut V, raw: &RawTelemetry) -> TelemetrySettings {
    let d = TelemetrySettings::default();
    let otlp_endpoint = match raw.otlp_endpoint.as_deref() {
        None => None,
        Some(u) if endpoint_ok(u) => Some(u.to_string()),
        Some(_) => {
            v.err(
                "telemetry.otlp_endpoint",
                "must be an http:// or https:// URL of an OTLP/HTTP receiver (e.g. http://127.0.0.1:4318)",
            );
            None
        }
    };
    let service_name = match raw.service_name.as_deref() {
        None => d.service_name.clone(),
        Some(n)
            if !n.trim().is_empty()
                && n.len() <= MAX_SERVICE_NAME
                && !n.chars().any(char::is_control) =>
        {
            n.to_string()
        }
        Some(_) => {
            v.err(
                "telemetry.service_name",
                format!("must be 1 to {MAX_SERVICE_NAME} bytes of printable text"),
            );
            d.service_name.clone()
        }
    };
    let sample_ratio = match raw.sample_ratio {
        None => d.sample_ratio,
        Some(r) if r.is_finite() && (0.0..=1.0).contains(&r) => r,
        Some(_) => {
            v.err(
                "telemetry.sample_ratio",
                "must be within 0 and 1 (1: every request)",
            );
            d.sample_ratio
        }
    };
    let export_interval = v
        .positive(
            "telemetry.export_interval_ms",
            raw.export_interval_ms,
            60_000,
        )
        .map_or(d.export_interval, Duration::from_millis);
    TelemetrySettings {
        otlp_endpoint,
        service_name,
        sample_ratio,
        export_interval,
    }
}

/// An http(s) URL with a host, parsed as the exporter will.
fn endpoint_ok(u: &str) -> bool {
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"));
    let Some(rest) = rest else { return false };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    !host.is_empty()
        && !u.chars().any(|c| c.is_whitespace() || c.is_control())
        && traces_url(u).parse::<axum::http::Uri>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: RawTelemetry) -> (TelemetrySettings, Vec<String>) {
        let mut v = V { errors: Vec::new() };
        let t = telemetry(&mut v, &raw);
        (t, v.errors)
    }

    #[test]
    fn off_by_default() {
        let (t, errors) = check(RawTelemetry::default());
        assert!(errors.is_empty());
        assert_eq!(t, TelemetrySettings::default());
        assert!(t.otlp_endpoint.is_none());
    }

    #[test]
    fn bad_values_name_their_field() {
        let (_, errors) = check(RawTelemetry {
            otlp_endpoint: Some("127.0.0.1:4318".into()),
            service_name: Some("".into()),
            sample_ratio: Some(1.5),
            export_interval_ms: Some(0),
        });
        let fields: Vec<&str> = errors
            .iter()
            .map(|e| e.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            fields,
            [
                "telemetry.otlp_endpoint",
                "telemetry.service_name",
                "telemetry.sample_ratio",
                "telemetry.export_interval_ms"
            ],
            "{errors:?}"
        );
        let (_, errors) = check(RawTelemetry {
            sample_ratio: Some(f64::NAN),
            otlp_endpoint: Some("http:///v1/traces".into()),
            ..RawTelemetry::default()
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn an_endpoint_gets_the_traces_path_once() {
        let (t, errors) = check(RawTelemetry {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            sample_ratio: Some(0.25),
            ..RawTelemetry::default()
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(t.sample_ratio, 0.25);
        let e = t.otlp_endpoint.unwrap();
        assert_eq!(traces_url(&e), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(
            traces_url("https://otel.example/v1/traces/"),
            "https://otel.example/v1/traces"
        );
    }
}
