-- Retention deletes reactions done before its cut-off: `state <> 'owed' AND
-- COALESCE(delivered_at, received_at) < $1` (`ledger::columns::reaction_done_before`). No
-- index served that condition, so each of its batches scanned the table. This index holds
-- the done reactions by the time they were done (see the SQLite migration 0019).
CREATE INDEX reactions_done_at ON reactions ((COALESCE(delivered_at, received_at))) WHERE state <> 'owed';
