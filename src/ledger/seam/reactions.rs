//! Reactions to the bot's messages, owed to the agents (DESIGN §14).

use super::*;

#[async_trait]
pub trait Reactions: Send + Sync {
    /// The reactions owed to the agent, oldest first: not yet handed to a session.
    async fn owed_reactions(&self, agent: &AgentName) -> LedgerResult<Vec<StoredReaction>>;

    /// The session was given these reactions: they are no longer owed.
    async fn reactions_delivered(&self, ids: &[i64]) -> LedgerResult<()>;

    /// Every reaction recorded, oldest first: the audit trail.
    async fn reactions_recorded(&self) -> LedgerResult<Vec<ReactionAudit>>;
}
