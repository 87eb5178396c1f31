-- What an attempt asks of Telegram (issue 22). Until now every attempt was a
-- `sendMessage`; replies with files, reactions (`react`) and edits (`edit_message`) are
-- outbound calls a user sees too, so each is an attempt, recorded before the request and
-- classified after (DESIGN.md §4). `method` names the Bot API call; the `send_*` methods
-- are parts of a reply and settle their envelope as before, while `set_reaction` and
-- `edit_message` are admitted like a reply (§11) but settle nothing.
-- `target_message_id` is the Telegram message a reaction or an edit acts on.
--
-- Two added columns with constant defaults: SQLite writes no row for them, so this is
-- instant on a large ledger. The CHECK is written with OR, not an IN list
-- (`no_check_builds_a_temporary_tree`); existing rows take the default, `send_message`,
-- which is what they were.

ALTER TABLE attempts ADD COLUMN method TEXT NOT NULL DEFAULT 'send_message'
  CHECK (method = 'send_message' OR method = 'send_photo' OR method = 'send_document'
         OR method = 'send_animation' OR method = 'send_video' OR method = 'send_voice'
         OR method = 'send_audio' OR method = 'set_reaction' OR method = 'edit_message');
ALTER TABLE attempts ADD COLUMN target_message_id INTEGER; -- set_reaction / edit_message: the Telegram message acted on
