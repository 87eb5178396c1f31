-- Tasks and revisions (DESIGN.md §11).
--
-- A task is the work one conversation (chat + topic) gives one agent on a single-agent
-- route. Each change to it — a correction, a new objective, a pause, a resume, a cancel —
-- is the next revision (revision 1 being the task's start, kept in `tasks`), one row of
-- `task_revisions`, recorded in the same transaction as
-- what it does to the task's envelopes and handoffs. Nothing is deleted: the revisions
-- are the task's lineage.
--
-- `instruction_revision` / `instruction_kind` / `act_on_envelope_id`: the last change of
-- the instruction (a correction, or for a replaced task the successor's new objective),
-- and the envelope that carries it. An action made for an envelope of an older revision
-- is refused with `superseded`, naming that envelope.
--
-- What the bot says about a change (`task_7 revision 2: correction accepted`), an answer
-- to `/status`, or why nothing changed, is owed in `room_posts` (with no cascade) in the
-- transaction that records the change, and posted like a room's own posts: once, never
-- twice, across restarts.
--
-- `cancel_envelope_id`: the envelope whose ack turns `stop_requested` into `stopped`
-- (the trigger below), however the ack is made — the `ack` tool or an operator.

CREATE TABLE tasks (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id              TEXT    NOT NULL UNIQUE,                   -- task_…
    chat_id              INTEGER NOT NULL,
    thread_id            INTEGER,
    agent                TEXT    NOT NULL,
    route                TEXT    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN ('open', 'paused', 'stop_requested', 'stopped', 'done', 'replaced')),
    revision             INTEGER NOT NULL,
    objective            TEXT    NOT NULL,
    -- Revision 1 is the task itself: the message that started it, who sent it, how
    -- (`message`, or `command` / `agent` for a new objective's successor).
    first_envelope_id    INTEGER NOT NULL REFERENCES envelopes (id),
    started_by           TEXT    NOT NULL,
    started_source       TEXT    NOT NULL CHECK (started_source IN ('message', 'command', 'agent')),
    predecessor          TEXT,                                      -- the task this one replaced
    successor            TEXT,                                      -- the task that replaced this one
    instruction_revision INTEGER,
    instruction_kind     TEXT    CHECK (instruction_kind IN ('correction', 'new_objective')),
    act_on_envelope_id   INTEGER REFERENCES envelopes (id),
    cancel_envelope_id   INTEGER REFERENCES envelopes (id),
    stop_requested_by    TEXT,
    stop_requested_at    TEXT,
    stopped_at           TEXT,
    stop_reason          TEXT,
    opened_at            TEXT    NOT NULL,
    updated_at           TEXT    NOT NULL,
    closed_at            TEXT
);
-- The conversation's latest task: what a new message joins or starts after.
CREATE INDEX tasks_by_conversation ON tasks (chat_id, agent, thread_id, id);
CREATE INDEX tasks_by_cancel ON tasks (cancel_envelope_id) WHERE cancel_envelope_id IS NOT NULL;

CREATE TABLE task_revisions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id      TEXT    NOT NULL REFERENCES tasks (task_id),
    revision     INTEGER NOT NULL,
    kind         TEXT    NOT NULL CHECK (kind IN ('correction', 'new_objective', 'pause', 'resume', 'cancel', 'stopped')),
    source       TEXT    NOT NULL CHECK (source IN ('message', 'edit', 'command', 'agent', 'operator')),
    actor        TEXT    NOT NULL,                                  -- who: the user, agent:NAME, operator
    at           TEXT    NOT NULL,
    summary      TEXT    NOT NULL,
    text         TEXT,                                              -- the instruction as it stands after this revision
    message_id   INTEGER,                                           -- the Telegram message that carried it: editing it corrects the task
    envelope_id  INTEGER REFERENCES envelopes (id),                 -- the envelope that recorded it
    snapshot     TEXT    NOT NULL DEFAULT '{}',                     -- JSON: confirmed effects, unknown attempts, open handoffs at that moment
    UNIQUE (task_id, revision, kind)
);

-- What each envelope and handoff was made under; NULL for those of no task (rooms,
-- unrouted and audit rows, unprompted handoffs).
ALTER TABLE envelopes ADD COLUMN task_id TEXT;
ALTER TABLE envelopes ADD COLUMN revision INTEGER;
-- Extra `meta` for the agent, as a JSON object: a revision envelope's change, its new and
-- old text, the superseded handoffs.
ALTER TABLE envelopes ADD COLUMN meta TEXT;
CREATE INDEX envelopes_by_task ON envelopes (task_id, state) WHERE task_id IS NOT NULL;

ALTER TABLE handoffs ADD COLUMN task_id TEXT;
ALTER TABLE handoffs ADD COLUMN revision INTEGER;
-- A child's answer to a superseded handoff: kept, never delivered as an answer.
ALTER TABLE handoffs ADD COLUMN late_result TEXT;
ALTER TABLE handoffs ADD COLUMN late_at TEXT;
CREATE INDEX handoffs_by_task ON handoffs (task_id, state) WHERE task_id IS NOT NULL;

-- Stop requested is not stopped: a cancelled task is stopped when its cancel envelope is
-- acked, by whichever path acks it.
CREATE TRIGGER task_stopped_on_cancel_ack
AFTER UPDATE OF state ON envelopes
WHEN NEW.state = 'acked' AND OLD.state <> 'acked'
BEGIN
    UPDATE tasks
    SET state = 'stopped', stopped_at = NEW.state_changed_at, updated_at = NEW.state_changed_at,
        closed_at = NEW.state_changed_at, stop_reason = COALESCE(stop_reason, 'the agent acknowledged the cancel')
    WHERE cancel_envelope_id = NEW.id AND state = 'stop_requested';
END;
