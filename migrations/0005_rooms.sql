-- Group rooms (DESIGN.md §10).
--
-- A human message in a room route is an envelope like any other, but it is the room's, not
-- an agent's: `agent` is NULL. It is stored `queued` by the poller (in the batch that
-- confirms its update) and taken at once by the room driver, which in one transaction
-- records its cascade (or applies its `/stop`) and moves it to `acked` with a note naming
-- the cascade. So it never shows up as any agent's pending work, and the work it causes is
-- carried by the cascade's `room_turn` envelopes, one per speaker, each queued, pending and
-- answered like any envelope.
--
-- `cascades`: one row per human message: `waiting` while another exchange runs in the room
-- (exchanges never interleave), then the states of rules::turns::CascadeState. `cascade`
-- is the serialised rules::turns::Cascade (queue, turns, transcript, stop), rewritten in
-- the same transaction as every step and what the step causes (the next room_turn
-- envelope, a timed-out turn's ack, an outcome post), so `kill -9` at any point resumes
-- from a state that agrees with everything else in the ledger.
--
-- `cascade_turns`: one row per speaker given the floor, with its room_turn envelope and
-- when its turn started (timers restart from it). `reply_text` is the one reply of the
-- turn, claimed before it is posted: a second reply is refused while the first is on its
-- way, and the transcript never depends on reading the posted text back.
--
-- `room_posts`: what the switchboard itself says in a room (a "budget exhausted" or stop
-- report, a timed-out speaker, an answer to `/stop`), recorded with the step that causes
-- it and then posted as an ordinary outbound attempt whose request id is the post's `key`.
-- A post whose attempt exists is never posted again, so a restart cannot post it twice.

CREATE TABLE cascades (
    id                    INTEGER PRIMARY KEY AUTOINCREMENT,          -- arrival order
    cascade_id            TEXT    NOT NULL UNIQUE,                    -- cas_…
    route                 TEXT    NOT NULL,                           -- the room
    chat_id               INTEGER NOT NULL,
    thread_id             INTEGER,
    message_envelope_id   INTEGER NOT NULL UNIQUE REFERENCES envelopes (id),  -- the human message
    state                 TEXT    NOT NULL CHECK (state IN ('waiting', 'running', 'stop_requested', 'stopped', 'completed', 'budget_exhausted')),
    cascade               TEXT    NOT NULL,                           -- rules::turns::Cascade as JSON
    max_iters             INTEGER NOT NULL,                           -- what each speaker is told
    speaker_timeout_secs  INTEGER NOT NULL,
    stop_by               TEXT,
    stop_requested_at     TEXT,
    outcome               TEXT,                                       -- rules::turns::Outcome as JSON, once over
    outcome_text          TEXT,                                       -- what the room was told, if anything
    created_at            TEXT    NOT NULL,
    started_at            TEXT,
    ended_at              TEXT,
    updated_at            TEXT    NOT NULL
);
CREATE INDEX cascades_by_room ON cascades (route, state, id);
CREATE INDEX cascades_by_state ON cascades (state, id);

CREATE TABLE cascade_turns (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    cascade_id        INTEGER NOT NULL REFERENCES cascades (id),
    speaker           INTEGER NOT NULL,                               -- 1, 2, …
    agent             TEXT    NOT NULL,
    summoned_by       TEXT    NOT NULL,
    envelope_id       INTEGER NOT NULL UNIQUE REFERENCES envelopes (id),  -- its room_turn envelope
    started_at        TEXT    NOT NULL,
    reply_text        TEXT,                                           -- the turn's one reply, once claimed
    reply_request_id  TEXT,
    ended_at          TEXT,
    ending            TEXT    CHECK (ending IN ('replied', 'passed', 'timed_out')),
    UNIQUE (cascade_id, speaker)
);
CREATE INDEX cascade_turns_open ON cascade_turns (ended_at);

CREATE TABLE room_posts (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    key                  TEXT    NOT NULL UNIQUE,                     -- e.g. cas_…/outcome; the attempts' request_id
    cascade_id           INTEGER REFERENCES cascades (id),
    envelope_id          INTEGER NOT NULL REFERENCES envelopes (id),  -- the human message (or /stop) it answers
    route                TEXT    NOT NULL,
    chat_id              INTEGER NOT NULL,
    thread_id            INTEGER,
    reply_to_message_id  INTEGER,
    text                 TEXT    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN ('owed', 'made')),
    created_at           TEXT    NOT NULL,
    made_at              TEXT
);
CREATE INDEX room_posts_owed ON room_posts (state, id);
