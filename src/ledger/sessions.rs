//! Agent sessions, kept for the audit trail.

use super::in_place::execute_cached;
use super::{Ledger, now};
use crate::ids::AgentName;

impl Ledger {
    pub async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        redelivered: usize,
    ) -> sqlx::Result<()> {
        self.write_in_place(|db| {
            execute_cached(
                db,
                "INSERT INTO agent_sessions (id, agent, connected_at, redelivered) VALUES (?, ?, ?, ?)",
                rusqlite::params![session_id, agent.as_str(), now(), redelivered as i64],
            )
        })
        .await
        .map(drop)
    }

    pub async fn session_closed(&self, session_id: &str) -> sqlx::Result<()> {
        self.write_in_place(|db| {
            execute_cached(
                db,
                "UPDATE agent_sessions SET disconnected_at = ? WHERE id = ?",
                rusqlite::params![now(), session_id],
            )
        })
        .await
        .map(drop)
    }
}
