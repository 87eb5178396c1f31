-- The CHECK constraints that list more than two values are restated as comparisons joined
-- by OR, with the same meaning (issue 11). SQLite evaluates `x IN ('a', 'b', 'c')` by
-- building a temporary B-tree of the list, and a CHECK is evaluated for every row written:
-- every envelope stored and every state it moves to opened and closed two such trees
-- (8% of intake's time, 3–4% of the daemon's CPU one message at a time). Comparisons
-- need none.
--
-- Only the text of the constraints changes, not a row or a page of the tables, so this is
-- SQLite's documented edit of the schema in place
-- (https://www.sqlite.org/lang_altertable.html#otheralter) rather than a rebuild of the
-- tables: the old and the new constraint accept the same values (NULL included), and the
-- rows already stored satisfy both. A connection that read the schema before this keeps
-- the old text until it reconnects, which checks the same thing. `tests.rs`
-- (`no_check_builds_a_temporary_tree`) keeps later migrations from bringing the lists back.

PRAGMA writable_schema = ON;

UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (outcome IN (''in_flight'', ''sent'', ''not_sent'', ''unknown''))',
    'CHECK (outcome = ''in_flight'' OR outcome = ''sent'' OR outcome = ''not_sent'' OR outcome = ''unknown'')')
WHERE type = 'table' AND name = 'attempts';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (ending IN (''replied'', ''passed'', ''timed_out''))',
    'CHECK (ending = ''replied'' OR ending = ''passed'' OR ending = ''timed_out'')')
WHERE type = 'table' AND name = 'cascade_turns';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''waiting'', ''running'', ''stop_requested'', ''stopped'', ''completed'', ''budget_exhausted''))',
    'CHECK (state = ''waiting'' OR state = ''running'' OR state = ''stop_requested'' OR state = ''stopped'' OR state = ''completed'' OR state = ''budget_exhausted'')')
WHERE type = 'table' AND name = 'cascades';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (kind IN (''message'', ''edited_message'', ''unknown'', ''handoff'', ''handoff_answer'', ''room_turn'', ''revision''))',
    'CHECK (kind = ''message'' OR kind = ''edited_message'' OR kind = ''unknown'' OR kind = ''handoff'' OR kind = ''handoff_answer'' OR kind = ''room_turn'' OR kind = ''revision'')')
WHERE type = 'table' AND name = 'envelopes';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''queued'', ''pending'', ''acked'', ''unresolved'', ''unrouted'', ''rejected'', ''ignored'', ''undecodable'', ''superseded''))',
    'CHECK (state = ''queued'' OR state = ''pending'' OR state = ''acked'' OR state = ''unresolved'' OR state = ''unrouted'' OR state = ''rejected'' OR state = ''ignored'' OR state = ''undecodable'' OR state = ''superseded'')')
WHERE type = 'table' AND name = 'envelopes';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''open'', ''answered'', ''closed'', ''superseded''))',
    'CHECK (state = ''open'' OR state = ''answered'' OR state = ''closed'' OR state = ''superseded'')')
WHERE type = 'table' AND name = 'handoffs';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (kind IN (''correction'', ''new_objective'', ''pause'', ''resume'', ''cancel'', ''stopped''))',
    'CHECK (kind = ''correction'' OR kind = ''new_objective'' OR kind = ''pause'' OR kind = ''resume'' OR kind = ''cancel'' OR kind = ''stopped'')')
WHERE type = 'table' AND name = 'task_revisions';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (source IN (''message'', ''edit'', ''command'', ''agent'', ''operator''))',
    'CHECK (source = ''message'' OR source = ''edit'' OR source = ''command'' OR source = ''agent'' OR source = ''operator'')')
WHERE type = 'table' AND name = 'task_revisions';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''open'', ''paused'', ''stop_requested'', ''stopped'', ''done'', ''replaced''))',
    'CHECK (state = ''open'' OR state = ''paused'' OR state = ''stop_requested'' OR state = ''stopped'' OR state = ''done'' OR state = ''replaced'')')
WHERE type = 'table' AND name = 'tasks';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (started_source IN (''message'', ''command'', ''agent''))',
    'CHECK (started_source = ''message'' OR started_source = ''command'' OR started_source = ''agent'')')
WHERE type = 'table' AND name = 'tasks';

PRAGMA writable_schema = RESET;
