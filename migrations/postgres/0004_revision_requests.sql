-- `revise_task` carries the plugin's request id, as `reply` and handoffs do: a call
-- repeated after its answer was lost (a connection dropped after the commit) is answered
-- with what the first one recorded, and records nothing more. The same columns as the
-- SQLite ledger's migration 0015.
ALTER TABLE task_revisions ADD COLUMN request_id TEXT;
ALTER TABLE task_revisions ADD COLUMN declared_task TEXT;
ALTER TABLE task_revisions ADD COLUMN declared_revision BIGINT;
CREATE UNIQUE INDEX task_revisions_by_request ON task_revisions (actor, request_id) WHERE request_id IS NOT NULL;
