-- Permission requests (DESIGN.md §15, issue 23): each tool-use approval an agent's session
-- relays is one row, written before its prompt is posted, so a restart loses no request,
-- posts no prompt twice and still knows which plugin asked.
--
-- `id` is the switchboard's own opaque id, the only thing a prompt's buttons carry
-- (`callback_data`); `request_id` is Claude Code's five letters, unique per plugin process
-- (`plugin_id`), which is where the verdict must go.
--
-- The prompt's send cannot be a row of `attempts` (those belong to an envelope and settle
-- it), so it is recorded here with the same discipline: `prompt_send` is `in_flight` before
-- the call, then `sent`, `not_sent` or `unknown`, and an unknown send is never repeated.
-- `prompt_settled` says the prompt shows the request's final state (or has nothing to show
-- it on). `verdict_sent_at` says the verdict was written to the asking plugin's session.
--
-- A new table: instant on any ledger. The CHECKs compare with OR rather than an IN list
-- (see CONTRIBUTING.md, adding a migration).

CREATE TABLE permission_requests (
    id                TEXT    NOT NULL PRIMARY KEY,
    agent             TEXT    NOT NULL,
    session_id        TEXT    NOT NULL,
    plugin_id         TEXT    NOT NULL,
    request_id        TEXT    NOT NULL,
    tool_name         TEXT    NOT NULL,
    description       TEXT    NOT NULL,
    input_preview     TEXT    NOT NULL,
    asked_at          TEXT    NOT NULL,
    expires_at        TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state = 'pending' OR state = 'allowed' OR state = 'denied' OR state = 'expired'),
    route             TEXT    NOT NULL,
    chat_id           INTEGER NOT NULL,
    thread_id         INTEGER,
    prompt_send       TEXT    NOT NULL CHECK (prompt_send = 'in_flight' OR prompt_send = 'sent' OR prompt_send = 'not_sent' OR prompt_send = 'unknown'),
    prompt_message_id INTEGER,
    prompt_error      TEXT,
    prompt_settled    INTEGER NOT NULL DEFAULT 0,
    answered_by       INTEGER,
    answered_by_name  TEXT,
    answered_at       TEXT,
    expired_because   TEXT,
    verdict_sent_at   TEXT,
    UNIQUE (plugin_id, request_id)
);

-- What start-up and the expiry timer look for: the pending requests, by expiry.
CREATE INDEX permission_requests_pending ON permission_requests (expires_at) WHERE state = 'pending';
-- Finished requests whose prompt still shows buttons, and verdicts not yet handed over.
CREATE INDEX permission_requests_unsettled ON permission_requests (id) WHERE prompt_settled = 0 AND state <> 'pending';
CREATE INDEX permission_requests_undelivered ON permission_requests (plugin_id)
    WHERE verdict_sent_at IS NULL AND (state = 'allowed' OR state = 'denied');

-- The operator's questions (issue 23): each unresolved send (an attempt whose outcome is
-- unknown, of an envelope still `unresolved`) is asked once in `[operator] route`'s chat,
-- with Delivered / Not delivered buttons. `op_id` is the attempt asked about, so nothing is
-- asked twice, across restarts too. The prompt's send follows the same discipline as a
-- permission prompt's. `state`: `open` until an operator answers (`delivered`,
-- `not_delivered`) or the envelope was settled otherwise (`settled`, by the CLI).
CREATE TABLE operator_questions (
    id                TEXT    NOT NULL PRIMARY KEY,
    op_id             TEXT    NOT NULL UNIQUE,
    envelope_id       INTEGER NOT NULL,
    trace_id          TEXT    NOT NULL,
    sent_chat_id      INTEGER NOT NULL,
    sent_at           TEXT    NOT NULL,
    sent_text         TEXT    NOT NULL,
    asked_at          TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state = 'open' OR state = 'delivered' OR state = 'not_delivered' OR state = 'settled'),
    chat_id           INTEGER NOT NULL,
    thread_id         INTEGER,
    prompt_send       TEXT    NOT NULL CHECK (prompt_send = 'in_flight' OR prompt_send = 'sent' OR prompt_send = 'not_sent' OR prompt_send = 'unknown'),
    prompt_message_id INTEGER,
    prompt_error      TEXT,
    prompt_settled    INTEGER NOT NULL DEFAULT 0,
    answered_by       INTEGER,
    answered_by_name  TEXT,
    answered_at       TEXT
);
CREATE INDEX operator_questions_open ON operator_questions (envelope_id) WHERE state = 'open';
