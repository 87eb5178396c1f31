-- The plugin process behind each agent session (its `X-Switchboard-Plugin` name), so that a
-- daemon that starts keeps each agent a moment for the plugin that held it before the
-- restart (`agents::bridge::session`), rather than give it to whichever plugin reconnects
-- first. Sessions recorded before this migration have none. No default: costs nothing on a
-- large ledger.
ALTER TABLE agent_sessions ADD COLUMN plugin TEXT;
