-- Handoffs between agents (DESIGN.md §9).
--
-- A handoff is one row here plus two envelopes: the target's `handoff` envelope (its
-- instruction, `envelope_id`) and, once answered or closed, the delegator's
-- `handoff_answer` envelope (`answer_envelope_id`). Both are ordinary envelopes, queued,
-- handed to sessions, redelivered and answered through the resolver like any other, with
-- no Telegram fields (chat 0, kind naming what they are).
--
-- `cause_envelope_id` is the turn: the delegator's envelope the handoff was made for
-- (NULL for an unprompted handoff). The guard reads it to find the turn's earlier
-- instructions, and `state = 'open'` to find the handoffs still running.
--
-- `request_id` / `answer_request_id`: the plugin's request ids, so a repeated request
-- returns the first one's outcome instead of recording a second handoff or answer.

CREATE TABLE handoffs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    handoff_id          TEXT    NOT NULL UNIQUE,                      -- hof_…
    from_agent          TEXT    NOT NULL,
    to_agent            TEXT    NOT NULL,
    instruction         TEXT    NOT NULL,
    cause_envelope_id   INTEGER REFERENCES envelopes (id),
    depth               INTEGER NOT NULL,
    followup_of         TEXT,                                         -- the earlier handoff a follow-up follows
    intent              TEXT    CHECK (intent IN ('extends', 'replaces')),
    request_id          TEXT,
    envelope_id         INTEGER NOT NULL REFERENCES envelopes (id),
    answer_envelope_id  INTEGER REFERENCES envelopes (id),
    answer_request_id   TEXT,
    state               TEXT    NOT NULL CHECK (state IN ('open', 'answered', 'closed', 'superseded')),
    opened_at           TEXT    NOT NULL,
    closed_at           TEXT,
    note                TEXT                                          -- the closing ack's note
);
CREATE UNIQUE INDEX handoffs_by_request ON handoffs (from_agent, request_id);
CREATE INDEX handoffs_by_cause ON handoffs (cause_envelope_id);
CREATE INDEX handoffs_by_state ON handoffs (from_agent, state, to_agent);
CREATE INDEX handoffs_by_envelope ON handoffs (envelope_id);
CREATE INDEX handoffs_by_answer ON handoffs (answer_envelope_id);

-- Audit copies of handoffs (`[handoffs] audit_route`) are ordinary outbound attempts that
-- answer nothing: they never settle an envelope and never need reconciling before a reply.
ALTER TABLE attempts ADD COLUMN purpose TEXT NOT NULL DEFAULT 'reply' CHECK (purpose IN ('reply', 'audit'));
