-- The reply path's contract under interruption (issue 6).
--
-- * `attempts.request_id`: the id the channel plugin chose for the `reply` call that made
--   the attempt. A repeated request with the same id returns the first one's outcome
--   instead of sending again, and a plugin whose connection broke asks by this id what
--   became of its request. No attempt with that id means the request was never acted on.
-- * `envelopes.shown_session`: the session that confirmed it pushed the envelope into the
--   agent's context. An unnamed reply resolves only among envelopes the agent was shown in
--   its live session; a redelivery to a new session must be shown again.

ALTER TABLE attempts ADD COLUMN request_id TEXT;
CREATE INDEX attempts_by_request ON attempts (agent, request_id);

ALTER TABLE envelopes ADD COLUMN shown_session TEXT;
