//! Agent sessions as the ledger records them.

use super::*;

#[async_trait]
pub trait Sessions: Send + Sync {
    /// Records a session that opened, with the plugin process behind it if it named itself.
    async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        plugin: Option<&str>,
        redelivered: usize,
    ) -> LedgerResult<()>;

    async fn session_closed(&self, session_id: &str) -> LedgerResult<()>;

    /// The session's plugin said it is leaving: a daemon that starts keeps the agent for
    /// nobody on its account (its plugin is forgotten).
    async fn session_left(&self, session_id: &str) -> LedgerResult<()>;

    /// Each agent's newest recorded session's plugin, `(agent, plugin)`, for the agents
    /// whose newest session named one: whom a daemon that starts keeps each agent for.
    async fn last_session_plugins(&self) -> LedgerResult<Vec<(String, String)>>;
}
