-- Which session confirmed it showed an envelope to its agent is kept with the live
-- session, in memory (see `agents/bridge/session.rs`): it means nothing to any other
-- session, so it has nothing to survive, and writing it cost a transaction on every
-- message's path (issue 11).

ALTER TABLE envelopes DROP COLUMN shown_session;
