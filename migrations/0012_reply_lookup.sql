-- Quotes and reactions (issue 22): what a user's message or reaction refers to.
--
-- A message that quotes another names the quoted message by its chat and Telegram
-- message id. Intake looks it up in the transaction that records the message: among the
-- envelopes of that chat (a user message switchboard recorded), and among the attempts
-- that sent the bot's messages there (an answer to an envelope). A reaction names the
-- message it is on the same way and is looked up among the attempts. These are the
-- indexes of those lookups; without them each is a scan of its table.
--
-- `reactions` keeps every reaction update: one addressed to an agent (on a message the
-- bot sent answering one of its envelopes) is `owed` until its session was given it as a
-- notice, then `delivered`; any other (on a message the bot did not send for an agent, or
-- the removal of all reactions) is `ignored`, kept for audit. A re-polled update is stored
-- once (`update_id`, `update_digest`), as an envelope is. `trace_id` names the answered
-- envelope as text, not as a reference: retention deletes finished envelopes on its own
-- schedule, and a reaction's audit row must not hold one back.

CREATE INDEX envelopes_by_message ON envelopes (chat_id, message_id) WHERE update_id IS NOT NULL;
CREATE INDEX attempts_by_telegram_message ON attempts (chat_id, telegram_message_id)
    WHERE telegram_message_id IS NOT NULL;

CREATE TABLE reactions (
    id            INTEGER PRIMARY KEY,
    update_id     INTEGER NOT NULL,
    update_digest TEXT    NOT NULL,
    chat_id       INTEGER NOT NULL,
    message_id    INTEGER NOT NULL,
    user_id       INTEGER,
    user          TEXT    NOT NULL,                   -- @username, else the name
    emoji         TEXT    NOT NULL,                   -- the reactions now set, space-separated; '' when all were removed
    reacted_at    TEXT    NOT NULL,                   -- RFC 3339, UTC, from Telegram
    received_at   TEXT    NOT NULL,
    agent         TEXT,                               -- NULL when ignored
    trace_id      TEXT,                               -- the envelope the reacted message answered; NULL when ignored
    state         TEXT    NOT NULL CHECK (state = 'owed' OR state = 'delivered' OR state = 'ignored'),
    note          TEXT,                               -- why ignored
    delivered_at  TEXT
);
CREATE UNIQUE INDEX reactions_by_update ON reactions (update_id, update_digest);
CREATE INDEX reactions_owed ON reactions (agent, id) WHERE state = 'owed';
