-- The run a ledger row's request belonged to (`x-budgetgate-run`,
-- docs/LEDGER.md), '' when it named none. Rows written before this
-- migration keep '': adding a column with a constant default rewrites no
-- row.
ALTER TABLE spend_ledger ADD COLUMN run_id TEXT NOT NULL DEFAULT '';
