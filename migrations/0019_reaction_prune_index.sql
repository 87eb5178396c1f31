-- Retention (issue 26) deletes reactions done before its cut-off: `state <> 'owed' AND
-- COALESCE(delivered_at, received_at) < ?` (`ledger::columns::reaction_done_before`). No
-- index served that condition, so each of its batches scanned every reaction, the recent
-- ones included, while holding the writer, every hour on a schedule even when nothing was
-- due. This index holds the done reactions by the time they were done: a prune searches
-- the old ones alone. The planner uses it only for a condition written the same.
--
-- Building it reads the reactions once (a few thousand rows on a busy bot's ledger).
CREATE INDEX reactions_done_at ON reactions (COALESCE(delivered_at, received_at)) WHERE state <> 'owed';
