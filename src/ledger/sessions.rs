//! Agent sessions, kept for the audit trail.

use super::{Ledger, now};
use crate::ids::AgentName;

impl Ledger {
    pub async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        redelivered: usize,
    ) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO agent_sessions (id, agent, connected_at, redelivered) VALUES (?, ?, ?, ?)")
            .bind(session_id)
            .bind(agent.as_str())
            .bind(now())
            .bind(redelivered as i64)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    pub async fn session_closed(&self, session_id: &str) -> sqlx::Result<()> {
        sqlx::query("UPDATE agent_sessions SET disconnected_at = ? WHERE id = ?")
            .bind(now())
            .bind(session_id)
            .execute(&self.pool)
            .await
            .map(drop)
    }
}
