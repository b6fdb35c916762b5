//! `[alerts]`: the budget-alert webhook, its signing secret and thresholds.
//! Bound at start, like the admin token.

use std::time::Duration;

use super::{is_env_name, V};
use crate::config::alerts::AlertSettings;
use crate::config::raw::RawAlerts;

/// Shortest signing secret, bytes.
pub const MIN_SECRET_BYTES: usize = 16;

pub(super) fn alerts(v: &mut V, raw: &RawAlerts) -> AlertSettings {
    let d = AlertSettings::default();
    let webhook_url = match raw.webhook_url.as_deref() {
        None => None,
        Some(u) if u.starts_with("http://") || u.starts_with("https://") => Some(u.to_string()),
        Some(_) => {
            v.err("alerts.webhook_url", "must be an http:// or https:// URL");
            None
        }
    };
    let secret_env = match raw.secret_env.as_deref() {
        None => d.secret_env.clone(),
        Some(name) if is_env_name(name) => name.to_string(),
        Some(name) => {
            v.err(
                "alerts.secret_env",
                format!("not an environment variable name: {name:?}"),
            );
            d.secret_env.clone()
        }
    };
    if webhook_url.is_some()
        && std::env::var_os(&secret_env).is_none_or(|s| s.len() < MIN_SECRET_BYTES)
    {
        v.err(
            "alerts.secret_env",
            format!("environment variable {secret_env} must hold the webhook signing secret (at least {MIN_SECRET_BYTES} bytes)"),
        );
    }
    let thresholds_percent = match &raw.thresholds_percent {
        None => d.thresholds_percent.clone(),
        Some(list) => {
            let mut t: Vec<u64> = Vec::new();
            let valid = (1..=10).contains(&list.len())
                && list.iter().all(|&p| (1..=1000).contains(&p))
                && {
                    t = list.iter().map(|&p| p as u64).collect();
                    t.sort_unstable();
                    t.windows(2).all(|w| w[0] < w[1])
                };
            if !valid {
                v.err(
                    "alerts.thresholds_percent",
                    "must be 1 to 10 different percentages within 1..=1000",
                );
                d.thresholds_percent.clone()
            } else {
                t
            }
        }
    };
    AlertSettings {
        webhook_url,
        secret_env,
        thresholds_percent,
        check_interval: v
            .positive("alerts.check_interval_ms", raw.check_interval_ms, 3_600_000)
            .map_or(d.check_interval, Duration::from_millis),
        retry_for: v
            .positive("alerts.retry_for_secs", raw.retry_for_secs, 7 * 86_400)
            .map_or(d.retry_for, Duration::from_secs),
    }
}
