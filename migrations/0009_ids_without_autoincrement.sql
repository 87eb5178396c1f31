-- The tables number their rows as SQLite does by default (one more than the largest id)
-- rather than with AUTOINCREMENT (issue 11). AUTOINCREMENT keeps each table's largest id
-- in `sqlite_sequence`, which every INSERT reads and writes back: an extra lookup and
-- update per row stored, and an extra page in nearly every commit on the path of a
-- message (intake, an attempt begun, an outcome recorded).
--
-- The two differ only once the row holding the largest id is deleted: AUTOINCREMENT never
-- hands that id out again, the default may. The ledger deletes no rows (it records states,
-- and its history is what `switchboard ledger` shows), so ids stay unique and in arrival
-- order. Whatever deletes rows later (a retention command) must keep each table's newest
-- row, or ids referenced elsewhere (attempts, events, handoffs) could be handed out again;
-- `tests.rs` (`ids_are_not_reused_without_autoincrement`) says so too.
--
-- Only the text of the tables' definitions changes, not a row or a page of them, so this
-- is SQLite's documented edit of the schema in place
-- (https://www.sqlite.org/lang_altertable.html#otheralter), instant for any size of
-- ledger. A connection that read the schema before this keeps AUTOINCREMENT until it
-- reconnects; it then numbers from the larger of the stored sequence and the largest id,
-- which is the largest id, since nothing is deleted: both kinds of connection agree.
-- `sqlite_sequence` itself stays (SQLite does not let it be dropped), emptied.

PRAGMA writable_schema = ON;

UPDATE sqlite_schema
SET sql = replace(sql, 'INTEGER PRIMARY KEY AUTOINCREMENT', 'INTEGER PRIMARY KEY')
WHERE type = 'table' AND sql LIKE '%INTEGER PRIMARY KEY AUTOINCREMENT%';

PRAGMA writable_schema = RESET;

DELETE FROM sqlite_sequence;
