//! Agent sessions, kept for the audit trail.

use async_trait::async_trait;

use crate::ledger::prelude::*;

use super::{LedgerResult, SqliteLedger, now};
use crate::ids::AgentName;

#[async_trait]
impl Sessions for SqliteLedger {
    async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        redelivered: usize,
    ) -> LedgerResult<()> {
        self.execute_in_place(
            "INSERT INTO agent_sessions (id, agent, connected_at, redelivered) VALUES (?, ?, ?, ?)",
            (session_id, agent.as_str(), now(), redelivered as i64),
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
}
