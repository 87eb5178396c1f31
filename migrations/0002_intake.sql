-- no-transaction
-- (sqlx: this script manages its own transaction; see below.)
--
-- Intake that never stops (issue 6).
--
--   * Two new states, both kept for audit and never work for an agent:
--       'ignored'      a service message (pin, new member, topic event, …) or a live-location
--                      edit; `note` says which;
--       'undecodable'  an update that could not be decoded or converted; `raw_update` keeps
--                      it as Telegram sent it.
--   * A new kind, 'unknown', for undecodable updates, whose kind could not be read; and the
--     kinds of envelopes agents make (handoffs and their answers, room turns, revisions),
--     which have no update: `update_id` may be NULL.
--   * Deduplication moves from `update_id` alone to (`update_id`, `update_digest`): Telegram
--     may reuse update ids after a week without updates, and a new message under an old id
--     must be stored, while a re-poll of the very same update is still stored once.
--     Rows stored before this migration have no digest (NULL never conflicts); they were
--     all confirmed with their batch, so Telegram does not send them again.
--
-- SQLite cannot change a CHECK constraint or drop a UNIQUE column constraint in place, so
-- the table is rebuilt (https://www.sqlite.org/lang_altertable.html#otheralter): new table,
-- copy, drop, rename, indexes. Dropping `envelopes` while `attempts` and `envelope_events`
-- reference it needs foreign keys off, which SQLite only allows outside a transaction:
-- hence `no-transaction` above and the explicit transaction here. The copy keeps every id,
-- so every reference still holds. Should the process die after COMMIT but before sqlx
-- records this migration, running it again rebuilds the table once more, losing nothing.

PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

DROP TABLE IF EXISTS envelopes_rebuilt;

CREATE TABLE envelopes_rebuilt (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,  -- arrival order
    trace_id          TEXT    NOT NULL UNIQUE,
    update_id         INTEGER,                            -- unique together with update_digest; NULL for envelopes agents make
    update_digest     TEXT,                               -- SHA-256 of the update's canonical JSON; NULL before 0002
    -- Telegram's kinds, and those agents and the switchboard make (DESIGN.md §8), so later
    -- kinds need no rebuild of this table.
    kind              TEXT    NOT NULL CHECK (kind IN ('message', 'edited_message', 'unknown', 'handoff', 'handoff_answer', 'room_turn', 'revision')),
    chat_id           INTEGER NOT NULL,                   -- 0 when an undecodable update named none
    thread_id         INTEGER,                            -- forum topic
    chat_type         TEXT    NOT NULL,
    chat_title        TEXT,
    message_id        INTEGER NOT NULL,                   -- 0 when an undecodable update named none
    sender_id         INTEGER,
    sender_username   TEXT,
    sender_name       TEXT    NOT NULL,
    text              TEXT,                               -- text or caption
    attachments       TEXT    NOT NULL DEFAULT '[]',      -- JSON array of attachment metadata
    content           TEXT    NOT NULL,                   -- what the agent reads
    sent_at           TEXT    NOT NULL,                   -- RFC 3339, UTC, from Telegram
    received_at       TEXT    NOT NULL,
    route             TEXT,                               -- NULL when unrouted, ignored or undecodable
    agent             TEXT,                               -- NULL when unrouted, ignored or undecodable
    -- 'superseded' (DESIGN.md §11: an envelope of a task revision a correction replaced) is
    -- admitted now so that tasks need no rebuild of this table.
    state             TEXT    NOT NULL CHECK (state IN ('queued', 'pending', 'acked', 'unresolved', 'unrouted', 'rejected', 'ignored', 'undecodable', 'superseded')),
    deliveries        INTEGER NOT NULL DEFAULT 0,         -- times handed to a session; > 1 means redelivered
    state_changed_at  TEXT    NOT NULL,
    note              TEXT,                               -- the latest ack note or reconciliation reason; why ignored or undecodable
    raw_update        TEXT                                -- undecodable only: the update as received (lossy UTF-8)
);

INSERT INTO envelopes_rebuilt (
    id, trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id,
    sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at,
    route, agent, state, deliveries, state_changed_at, note
)
SELECT
    id, trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id,
    sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at,
    route, agent, state, deliveries, state_changed_at, note
FROM envelopes;

DROP TABLE envelopes;
ALTER TABLE envelopes_rebuilt RENAME TO envelopes;

-- A re-polled update (same id, same content) is stored once; a reused id with new content
-- is a new row.
CREATE UNIQUE INDEX envelopes_by_update ON envelopes (update_id, update_digest);
-- The hot queries: an agent's queued and pending envelopes, oldest first.
CREATE INDEX envelopes_by_agent_state ON envelopes (agent, state, id);
CREATE INDEX envelopes_by_state ON envelopes (state, id);

COMMIT;

PRAGMA foreign_keys = ON;
