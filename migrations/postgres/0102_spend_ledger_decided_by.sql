-- Which layer admitted a ledger row's reservation (docs/LEDGER.md):
-- `store`, `lease` (this gateway's quota lease, debited from the store at
-- the grant) or `local_limiter` (a `fail_open` tenant's request while the
-- store failed: its spend never reached the store's counters, and
-- reconciliation names it). Rows written before this migration keep ''.
ALTER TABLE spend_ledger ADD COLUMN decided_by TEXT NOT NULL DEFAULT '';
