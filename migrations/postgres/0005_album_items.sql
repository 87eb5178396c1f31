-- Each envelope's album (Telegram's `media_group_id`, also in its `meta`) in a column of
-- its own, indexed by chat, for intake to look an album's items up when it records one
-- (rules::albums). The same column and index as the SQLite ledger's migration 0016. The
-- index is built in one read of the table, which holds intake's writes meanwhile.
ALTER TABLE envelopes ADD COLUMN media_group_id TEXT;
CREATE INDEX envelopes_by_album ON envelopes (chat_id, media_group_id) WHERE media_group_id IS NOT NULL;
