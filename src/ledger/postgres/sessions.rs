//! Agent sessions as the ledger records them, on PostgreSQL.

use async_trait::async_trait;

use super::PgLedger;
use crate::ids::AgentName;
use crate::ledger::LedgerResult;
use crate::ledger::prelude::*;

#[async_trait]
impl Sessions for PgLedger {
    async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        plugin: Option<&str>,
        redelivered: usize,
    ) -> LedgerResult<()> {
        sqlx::query(
            "INSERT INTO agent_sessions (id, agent, plugin, connected_at, redelivered) \
             VALUES ($1, $2, $3, now(), $4)",
        )
        .bind(session_id)
        .bind(agent.as_str())
        .bind(plugin)
        .bind(i64::try_from(redelivered).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn session_closed(&self, session_id: &str) -> LedgerResult<()> {
        sqlx::query("UPDATE agent_sessions SET disconnected_at = now() WHERE id = $1")
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn session_left(&self, session_id: &str) -> LedgerResult<()> {
        sqlx::query("UPDATE agent_sessions SET plugin = NULL WHERE id = $1")
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn last_session_plugins(&self) -> LedgerResult<Vec<(String, String)>> {
        let newest: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT DISTINCT ON (agent) agent, plugin FROM agent_sessions ORDER BY agent, connected_at DESC, id DESC",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(newest.into_iter().filter_map(|(agent, plugin)| Some((agent, plugin?))).collect())
    }
}
