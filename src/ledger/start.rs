//! Starting the ledger in `serve`: the spend reader over the control
//! database, the buffer the request path records into, and the writer thread with its own connection.

use std::sync::Arc;

use crate::clock::Clock;

/// Starts the spend ledger of `state` over the control database `db`
/// (its queries always; the writer and its buffer while `[ledger]
/// enabled`, the default).
/// The writer runs on a thread of its own with its own connection: a
/// serving thread only pushes rows into the buffer. Returns it for the
/// shutdown flush.
pub fn start(
    state: &crate::server::AppState,
    db: &crate::db::Db,
    clock: Arc<dyn Clock>,
) -> Result<Option<crate::ledger::LedgerWriter>, String> {
    use crate::ledger::{sql::SqlLedger, Ledger, LedgerBuffer, LedgerSink, LedgerWriter};
    let settings = state.policy.load().ledger.clone();
    let _ = state
        .spend
        .set(SqlLedger::new(db.pool().clone(), db.kind()));
    let buffer = settings
        .enabled
        .then(|| Arc::new(LedgerBuffer::new(settings.buffer_rows, settings.batch_rows)));
    let Some(buffer) = buffer else {
        return Ok(None);
    };
    let _ = state
        .ledger
        .set(Arc::new(Ledger::new(buffer.clone(), clock.clone())));
    let (db, kind) = (db.clone(), db.kind());
    let open: crate::ledger::batcher::OpenSink = Box::new(move || {
        let pool = db.writer_pool().map_err(|e| e.to_string())?;
        Ok(SqlLedger::new(pool, kind) as Arc<dyn LedgerSink>)
    });
    LedgerWriter::spawn_thread(buffer, open, settings, clock).map(Some)
}
