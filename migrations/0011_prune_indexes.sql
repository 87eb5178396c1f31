-- Indexes for retention (issue 26): `switchboard ledger prune` and `[storage] retain_days`
-- delete finished rows, and with foreign keys on, deleting a row makes SQLite look for
-- the rows that still reference it. Where the referencing column has no index, that look
-- is a scan of the whole child table for every row deleted; these are the references to
-- envelopes and cascades that had none. The prune also uses them to find what belongs
-- together (a task's revisions and posts, a cascade's posts).
--
-- Building an index reads its table once: instant for the usual ledger, whose tasks,
-- revisions and posts are a small fraction of its envelopes; no row is rewritten.

CREATE INDEX room_posts_by_envelope ON room_posts (envelope_id);
CREATE INDEX room_posts_by_cascade ON room_posts (cascade_id) WHERE cascade_id IS NOT NULL;
CREATE INDEX tasks_by_first_envelope ON tasks (first_envelope_id);
CREATE INDEX tasks_by_act_on ON tasks (act_on_envelope_id) WHERE act_on_envelope_id IS NOT NULL;
CREATE INDEX task_revisions_by_envelope ON task_revisions (envelope_id) WHERE envelope_id IS NOT NULL;
