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
        redelivered: usize,
    ) -> LedgerResult<()> {
        sqlx::query(
            "INSERT INTO agent_sessions (id, agent, connected_at, redelivered) VALUES ($1, $2, now(), $3)",
        )
        .bind(session_id)
        .bind(agent.as_str())
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
}
