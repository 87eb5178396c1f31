//! Agent sessions as the ledger records them.

use super::*;

#[async_trait]
pub trait Sessions: Send + Sync {
    async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        redelivered: usize,
    ) -> LedgerResult<()>;

    async fn session_closed(&self, session_id: &str) -> LedgerResult<()>;
}
