-- Each envelope's album (Telegram's `media_group_id`, also in its `meta`) in a column of
-- its own, indexed by chat: intake looks an album's items up when it records one, so that
-- an album whose caption mentions the bot reaches a `mention_only` route's agent whole,
-- whichever of its items came first and in whichever batch (rules::albums). Envelopes
-- recorded before this migration have none; an album's items come within seconds, so
-- none of theirs is needed. On a large ledger the column costs nothing (it has no
-- default) and the index one read of the table, writing nothing (no row has an album yet).
ALTER TABLE envelopes ADD COLUMN media_group_id TEXT;
CREATE INDEX envelopes_by_album ON envelopes (chat_id, media_group_id) WHERE media_group_id IS NOT NULL;
