-- A room's cascade gets a version of its own (issue 21): a step applies only where the
-- cascade still holds the version the step was decided on, and writes the next one.
-- `updated_at` served as that version until now, which needed a step within the same
-- millisecond as the last to write a made-up later time; it is a time again.
--
-- ALTER TABLE ADD COLUMN with a constant default is SQLite's documented way to add a
-- column (https://www.sqlite.org/lang_altertable.html#altertabaddcol): instant for any
-- size of ledger, no row rewritten. A cascade running while the daemon upgrades starts at
-- version 0; the running daemon is the only writer of cascades, and it is stopped first.

ALTER TABLE cascades ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
