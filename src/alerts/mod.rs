//! Budget alerts (docs/LEDGER.md "Alerts"): soft thresholds (default 50 %, 80 %,
//! 100 %) of every quota and dollar budget fire a webhook once per
//! threshold per window.
//!
//! - [`thresholds`]: which thresholds a budget's state has crossed, and
//!   the firing's idempotency id (a digest of the budget, window and
//!   threshold: the same on every gateway of a fleet and after a restart,
//!   so a receiver deduplicates by it).
//! - [`webhook`]: the signed JSON delivery (HMAC-SHA-256 over the body
//!   with a secret from the environment), retried with backoff.
//! - [`watch`]: the task that reads the budgets from the store every
//!   check interval and fires what crossed.
//!
//! Per gateway, a firing is sent once; several gateways send the same
//! firing under the same id (docs/LEDGER.md, "Alerts").

pub mod thresholds;
pub mod watch;
pub mod webhook;
