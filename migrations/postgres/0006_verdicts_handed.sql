-- A permission verdict is owed to the asking plugin until the plugin confirms it handed it
-- to Claude Code (`verdict_handed_at`), not merely until the daemon wrote it to the
-- plugin's session stream (`verdict_sent_at`, kept: it is what retention looks at). A
-- stream that breaks right after the write lost the verdict, and Claude Code waited at its
-- prompt for good; now the verdict is written again when that plugin opens its next stream.
-- Verdicts written before this migration count as handed (see the SQLite migration 0017).
ALTER TABLE permission_requests ADD COLUMN verdict_handed_at TIMESTAMPTZ;
UPDATE permission_requests SET verdict_handed_at = verdict_sent_at WHERE verdict_sent_at IS NOT NULL;
DROP INDEX permission_requests_undelivered;
CREATE INDEX permission_requests_unhanded ON permission_requests (plugin_id)
    WHERE verdict_handed_at IS NULL AND state IN ('allowed', 'denied');
