-- `revise_task` carries the plugin's request id, as `reply` and handoffs do (issue 24's
-- caller that goes away): a call repeated after its answer was lost (a connection dropped
-- after the commit) is answered with what the first one recorded, and records nothing
-- more. The revision an agent declared keeps the request's id and the task and revision
-- its answer named (a new objective names its successor at revision 1).
ALTER TABLE task_revisions ADD COLUMN request_id TEXT;
ALTER TABLE task_revisions ADD COLUMN declared_task TEXT;
ALTER TABLE task_revisions ADD COLUMN declared_revision INTEGER;
CREATE UNIQUE INDEX task_revisions_by_request ON task_revisions (actor, request_id) WHERE request_id IS NOT NULL;
