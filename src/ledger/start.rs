//! Starting the ledger in `serve`: the spend reader over the control
//! database, the buffer and the request spans the request path records
//! into, and the writer thread with its own connection.

use std::sync::Arc;

use crate::clock::Clock;
use crate::ledger::{
    sql::SqlLedger, Ledger, LedgerBuffer, LedgerSettings, LedgerSink, LedgerWriter, SpendReader,
};

/// A started ledger: what the wiring hands the gateway's state, and the
/// writer it flushes at shutdown.
pub struct Started {
    /// The spend queries (always: they read the control database).
    pub spend: Arc<dyn SpendReader>,
    /// The buffer and spans the request path records into; `None` with
    /// the ledger off and telemetry off.
    pub ledger: Option<Arc<Ledger>>,
    /// The writer thread; `None` while `[ledger] enabled = false`.
    pub writer: Option<LedgerWriter>,
}

/// Starts the spend ledger under `settings` over the control database
/// `db` (its queries always; the writer and its buffer while `[ledger]
/// enabled`, the default) with the request spans `spans` (telemetry on).
/// The writer runs on a thread of its own with its own connection: a
/// serving thread only pushes rows into the buffer.
pub fn start(
    settings: &LedgerSettings,
    db: &crate::control::db::Db,
    clock: Arc<dyn Clock>,
    spans: Option<Arc<crate::telemetry::Spans>>,
) -> Result<Started, String> {
    let spend: Arc<dyn SpendReader> = SqlLedger::new(db.pool().clone(), db.kind());
    let buffer = settings
        .enabled
        .then(|| Arc::new(LedgerBuffer::new(settings.buffer_rows, settings.batch_rows)));
    let ledger = (buffer.is_some() || spans.is_some())
        .then(|| Arc::new(Ledger::with(buffer.clone(), spans, clock.clone())));
    let Some(buffer) = buffer else {
        return Ok(Started {
            spend,
            ledger,
            writer: None,
        });
    };
    let (db, kind) = (db.clone(), db.kind());
    let open: crate::ledger::batcher::OpenSink = Box::new(move || {
        let pool = db.writer_pool().map_err(|e| e.to_string())?;
        Ok(SqlLedger::new(pool, kind) as Arc<dyn LedgerSink>)
    });
    let writer = LedgerWriter::spawn_thread(buffer, open, settings.clone(), clock)?;
    Ok(Started {
        spend,
        ledger,
        writer: Some(writer),
    })
}
