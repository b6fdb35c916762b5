//! `[ledger]`: the spend ledger's batching, buffer bound and retention.
//! Bound at start, like the admin token: the writer runs once per process.

use std::time::Duration;

use super::V;
use crate::config::ledger::LedgerSettings;
use crate::config::raw::RawLedger;

pub(super) fn ledger(v: &mut V, raw: &RawLedger) -> LedgerSettings {
    let d = LedgerSettings::default();
    LedgerSettings {
        enabled: raw.enabled.unwrap_or(d.enabled),
        batch_interval: v
            .positive("ledger.batch_interval_ms", raw.batch_interval_ms, 60_000)
            .map_or(d.batch_interval, Duration::from_millis),
        batch_rows: v
            .positive("ledger.batch_rows", raw.batch_rows, 100_000)
            .map_or(d.batch_rows, |n| n as usize),
        buffer_rows: v
            .positive("ledger.buffer_rows", raw.buffer_rows, 100_000_000)
            .map_or(d.buffer_rows, |n| n as usize),
        retention: match raw.retention_days {
            // 0: kept for ever.
            Some(0) => None,
            days => v
                .positive("ledger.retention_days", days, 36_500)
                .map_or(d.retention, |n| Some(Duration::from_secs(n * 86_400))),
        },
        write_timeout: d.write_timeout,
    }
}
