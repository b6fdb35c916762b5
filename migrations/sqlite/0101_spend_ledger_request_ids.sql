-- The request a ledger row belongs to (docs/LEDGER.md): `request_id` is
-- the id the client saw (`x-request-id`, `request-id` on Messages; the
-- client's own when it sent one, so not unique across tenants) and
-- `attempt` which reservation of that request the row is (1, then one more
-- per retry on another deployment). `reservation_id` stays the primary key.
-- Rows written before this migration keep '' and 0: adding a column with a
-- constant default rewrites no row, so the migration is instant on a large
-- ledger.
ALTER TABLE spend_ledger ADD COLUMN request_id TEXT NOT NULL DEFAULT '';
ALTER TABLE spend_ledger ADD COLUMN attempt BIGINT NOT NULL DEFAULT 0;
CREATE INDEX spend_ledger_request ON spend_ledger (request_id, attempt);
