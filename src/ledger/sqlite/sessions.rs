//! Agent sessions, kept for the audit trail.

use async_trait::async_trait;

use crate::ledger::prelude::*;

use super::in_place::query_all_cached;
use super::{LedgerResult, SqliteLedger, now};
use crate::ids::AgentName;

#[async_trait]
impl Sessions for SqliteLedger {
    async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        plugin: Option<&str>,
        redelivered: usize,
    ) -> LedgerResult<()> {
        self.execute_in_place(
            "INSERT INTO agent_sessions (id, agent, plugin, connected_at, redelivered) VALUES (?, ?, ?, ?, ?)",
            (session_id, agent.as_str(), plugin, now(), redelivered as i64),
        )
        .await
        .map(drop)
    }

    async fn session_closed(&self, session_id: &str) -> LedgerResult<()> {
        self.execute_in_place(
            "UPDATE agent_sessions SET disconnected_at = ? WHERE id = ?",
            (now(), session_id),
        )
        .await
        .map(drop)
    }

    async fn session_left(&self, session_id: &str) -> LedgerResult<()> {
        self.execute_in_place("UPDATE agent_sessions SET plugin = NULL WHERE id = ?", [session_id])
            .await
            .map(drop)
    }

    async fn last_session_plugins(&self) -> LedgerResult<Vec<(String, String)>> {
        // Newest by when it connected, then by insertion (rowid) for two in one millisecond.
        self.read_in_place(|db| {
            query_all_cached(
                db,
                "SELECT agent, plugin FROM agent_sessions AS newest \
                 WHERE plugin IS NOT NULL AND rowid = (SELECT rowid FROM agent_sessions AS any_of_agent \
                     WHERE any_of_agent.agent = newest.agent ORDER BY connected_at DESC, rowid DESC LIMIT 1)",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
        })
        .await
    }
}
