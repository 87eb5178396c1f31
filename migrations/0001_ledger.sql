-- The ack ledger (DESIGN.md §2 and §4).
--
-- Every Telegram message that reaches switchboard is one row of `envelopes`, in arrival
-- order (`id`), with exactly one state. Every send to Telegram is one row of `attempts`,
-- written before the request goes out and classified after. `envelope_events` keeps every
-- state change with who made it and why, so reconciliations and acks stay auditable.
--
-- What comes next attaches here without reshaping these tables:
--   * handoffs between agents (`send_to_agent`, `call_agent`) become a `handoffs` table
--     keyed by an op id like `attempts.op_id`, with the envelope that caused them;
--   * task revisions become `task_revisions(task_id, revision, supersedes, …)`, and an
--     envelope that corrects or cancels running work points at the revision it created;
--   * group rooms with several agents per route turn `envelopes.agent` into a
--     `deliveries(envelope_id, agent, state)` table; until then one envelope has one agent.

CREATE TABLE envelopes (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,  -- arrival order
    trace_id          TEXT    NOT NULL UNIQUE,
    update_id         INTEGER NOT NULL UNIQUE,            -- a re-polled update is stored once
    kind              TEXT    NOT NULL CHECK (kind IN ('message', 'edited_message')),
    chat_id           INTEGER NOT NULL,
    thread_id         INTEGER,                            -- forum topic
    chat_type         TEXT    NOT NULL,
    chat_title        TEXT,
    message_id        INTEGER NOT NULL,
    sender_id         INTEGER,
    sender_username   TEXT,
    sender_name       TEXT    NOT NULL,
    text              TEXT,                               -- text or caption
    attachments       TEXT    NOT NULL DEFAULT '[]',      -- JSON array of attachment metadata
    content           TEXT    NOT NULL,                   -- what the agent reads
    sent_at           TEXT    NOT NULL,                   -- RFC 3339, UTC, from Telegram
    received_at       TEXT    NOT NULL,
    route             TEXT,                               -- NULL when unrouted
    agent             TEXT,                               -- NULL when unrouted
    state             TEXT    NOT NULL CHECK (state IN ('queued', 'pending', 'acked', 'unresolved', 'unrouted', 'rejected')),
    deliveries        INTEGER NOT NULL DEFAULT 0,         -- times handed to a session; > 1 means redelivered
    state_changed_at  TEXT    NOT NULL,
    note              TEXT                                -- the latest ack note or reconciliation reason
);

-- The hot queries: an agent's queued and pending envelopes, oldest first.
CREATE INDEX envelopes_by_agent_state ON envelopes (agent, state, id);
CREATE INDEX envelopes_by_state ON envelopes (state, id);

CREATE TABLE envelope_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    envelope_id INTEGER NOT NULL REFERENCES envelopes (id),
    at          TEXT    NOT NULL,
    from_state  TEXT    NOT NULL,
    to_state    TEXT    NOT NULL,
    actor       TEXT    NOT NULL,                         -- 'agent:NAME', 'operator', 'daemon'
    reason      TEXT
);
CREATE INDEX envelope_events_by_envelope ON envelope_events (envelope_id, id);

CREATE TABLE attempts (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    op_id                TEXT    NOT NULL UNIQUE,
    envelope_id          INTEGER NOT NULL REFERENCES envelopes (id),
    agent                TEXT    NOT NULL,
    chat_id              INTEGER NOT NULL,
    thread_id            INTEGER,
    reply_to_message_id  INTEGER,
    chunk_index          INTEGER NOT NULL,                -- 0-based part of a split reply
    chunk_count          INTEGER NOT NULL,
    text                 TEXT    NOT NULL,
    -- in_flight: recorded, request not yet classified. A daemon that dies mid-send
    -- leaves it so; start-up turns it into 'unknown' (it may have reached Telegram).
    outcome              TEXT    NOT NULL CHECK (outcome IN ('in_flight', 'sent', 'not_sent', 'unknown')),
    telegram_message_id  INTEGER,
    error                TEXT,
    started_at           TEXT    NOT NULL,
    finished_at          TEXT,
    reconciled_outcome   TEXT CHECK (reconciled_outcome IN ('sent', 'not_sent')),
    reconciled_reason    TEXT,
    reconciled_at        TEXT
);
CREATE INDEX attempts_by_envelope ON attempts (envelope_id, id);
CREATE INDEX attempts_by_outcome ON attempts (outcome);

-- The getUpdates offset, one row per bot; advanced in the same transaction that stores
-- the envelopes of the batch it confirms.
CREATE TABLE poller_offsets (
    bot_id      INTEGER PRIMARY KEY,
    next_offset INTEGER NOT NULL,
    updated_at  TEXT    NOT NULL
);

-- Agent sessions, for the audit trail (the live one-session rule is kept in memory).
CREATE TABLE agent_sessions (
    id              TEXT PRIMARY KEY,
    agent           TEXT NOT NULL,
    connected_at    TEXT NOT NULL,
    disconnected_at TEXT,
    redelivered     INTEGER NOT NULL DEFAULT 0
);
