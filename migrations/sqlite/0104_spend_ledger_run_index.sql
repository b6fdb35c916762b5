-- The rows of one run (`GET /admin/v1/spend/rows?run_id=`). SQLite has one
-- writer, the ledger's own: built in the migration's transaction.
CREATE INDEX IF NOT EXISTS spend_ledger_run ON spend_ledger (run_id, at_micros);
