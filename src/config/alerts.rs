//! `[alerts]`, validated: where budget alerts go and when they fire.

use std::time::Duration;

/// `[alerts]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSettings {
    /// Where firings are POSTed; `None`: alerts are off.
    pub webhook_url: Option<String>,
    /// The environment variable holding the signing secret.
    pub secret_env: String,
    /// Thresholds, percent of the limit, ascending.
    pub thresholds_percent: Vec<u64>,
    /// How often budgets are read from the store.
    pub check_interval: Duration,
    /// How long one firing's delivery is retried.
    pub retry_for: Duration,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            webhook_url: None,
            secret_env: "BUDGETGATE_ALERT_SECRET".into(),
            thresholds_percent: vec![50, 80, 100],
            check_interval: Duration::from_secs(10),
            retry_for: Duration::from_secs(3_600),
        }
    }
}
