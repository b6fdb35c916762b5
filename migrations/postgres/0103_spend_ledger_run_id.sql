-- The run a ledger row's request belonged to (`x-budgetgate-run`,
-- docs/LEDGER.md), '' when it named none. Rows written before this
-- migration keep '': adding a column with a constant default rewrites no
-- row (PostgreSQL 11 and later), so the migration is instant on a large
-- ledger. Its index is the next migration's, built without a transaction.
ALTER TABLE spend_ledger ADD COLUMN run_id TEXT NOT NULL DEFAULT '';
