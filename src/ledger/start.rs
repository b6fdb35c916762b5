//! Starting the ledger in `serve`: the spend reader over the control
//! database, the buffer the request path records into, and the writer thread with its own connection.

use std::sync::Arc;

use crate::clock::Clock;
use crate::config::ledger::LedgerSettings;
use crate::ledger::crash::RunMarker;
use crate::ledger::{sql::SqlLedger, Ledger, LedgerBuffer, LedgerSink, LedgerWriter, SpendReader};

/// A started ledger: what the wiring hands the gateway's state, and the
/// writer it flushes at shutdown.
pub struct Started {
    /// The spend queries (always: they read the control database).
    pub spend: Arc<dyn SpendReader>,
    /// The buffer the settlement observer records rows into; `None` while
    /// `[ledger] enabled = false`.
    pub ledger: Option<Arc<Ledger>>,
    /// The writer thread; `None` while `[ledger] enabled = false`.
    pub writer: Option<LedgerWriter>,
}

/// Starts the spend ledger under `settings` over the database `db` (its
/// queries always; the writer and its buffer while `[ledger] enabled`, the
/// default). The writer runs on a thread of its own with its own
/// connection: a serving thread only pushes rows into the buffer.
pub fn start(
    settings: &LedgerSettings,
    db: &crate::db::Db,
    clock: Arc<dyn Clock>,
) -> Result<Started, String> {
    let spend: Arc<dyn SpendReader> = SqlLedger::new(db.pool().clone(), db.kind());
    if !settings.enabled {
        return Ok(Started {
            spend,
            ledger: None,
            writer: None,
        });
    }
    let buffer = Arc::new(LedgerBuffer::new(settings.buffer_rows, settings.batch_rows));
    let (marker, crash) = RunMarker::begin(
        &crate::db::state_dir(),
        clock.now_micros(),
        settings.buffer_rows,
    );
    let ledger = Some(Arc::new(
        Ledger::new(buffer.clone(), clock.clone()).after_crash(crash),
    ));
    let (db, kind) = (db.clone(), db.kind());
    let open: crate::ledger::batcher::OpenSink = Box::new(move || {
        let pool = db.writer_pool().map_err(|e| e.to_string())?;
        Ok(SqlLedger::new(pool, kind) as Arc<dyn LedgerSink>)
    });
    let writer =
        LedgerWriter::spawn_thread(buffer, open, settings.clone(), clock)?.with_marker(marker);
    Ok(Started {
        spend,
        ledger,
        writer: Some(writer),
    })
}
