//! `[ledger]`, validated: what the spend ledger's writer runs with.

use std::time::Duration;

/// `[ledger]` as the writer uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSettings {
    /// Whether settlements are recorded at all.
    pub enabled: bool,
    /// Longest a row waits in the buffer while the sink is up: the crash
    /// loss bound.
    pub batch_interval: Duration,
    /// Most rows per write.
    pub batch_rows: usize,
    /// Most rows buffered (waiting or being written); past it rows are dropped.
    pub buffer_rows: usize,
    /// Rows older than this are deleted; `None` keeps them.
    pub retention: Option<Duration>,
    /// Longest one write or one prune batch may take before it is given
    /// up ([`WRITE_TIMEOUT`]; not configurable, shorter in tests).
    pub write_timeout: Duration,
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            batch_interval: Duration::from_secs(1),
            batch_rows: 500,
            buffer_rows: 100_000,
            retention: Some(Duration::from_secs(400 * 86_400)),
            write_timeout: WRITE_TIMEOUT,
        }
    }
}

/// Longest one batch's write may take before it is given up (the batch
/// goes back to the buffer and is tried again): a connection that went
/// half-open mid-statement would otherwise stop the ledger for good. A
/// write given up after the database applied it is harmless: the retry's
/// rows are already there (primary key).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
