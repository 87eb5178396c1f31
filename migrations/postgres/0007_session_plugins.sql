-- The plugin process behind each agent session, so that a daemon that starts (or a
-- standby elected) keeps each agent a moment for the plugin that held it before. The same
-- column as the SQLite ledger's migration 0018.
ALTER TABLE agent_sessions ADD COLUMN plugin TEXT;
