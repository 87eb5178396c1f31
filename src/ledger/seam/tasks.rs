//! Tasks, their revisions and admission (DESIGN §11).

use super::*;

#[async_trait]
pub trait Tasks: Send + Sync {
    /// [`admission_in`] on its own, for a tool's early answer; the check that counts is
    /// made again in the transaction that records the action.
    async fn admission(&self, envelope_id: i64) -> LedgerResult<Result<(), Refusal>>;

    /// `revise_task`: the agent declares that its pending envelope `trace_id` changes its
    /// task. Recorded like a command, in one transaction. A `request_id` the agent declared
    /// a revision with before is answered with what that one recorded, and no effects:
    /// nothing is recorded twice.
    async fn declare_revision(
        &self,
        agent: &AgentName,
        trace_id: &TraceId,
        kind: ChangeKind,
        summary: &str,
        request_id: Option<&str>,
    ) -> Result<(DeclaredRevision, Vec<TaskEffect>), DeclareTaskError>;

    /// A task's state as stored (`open`, `paused`, `stop_requested`, …).
    async fn task_state(&self, task_id: &TaskId) -> LedgerResult<Option<TaskState>>;

    /// A task and its revisions, oldest first.
    async fn task(&self, task_id: &TaskId) -> LedgerResult<Option<(Task, Vec<StoredRevision>, TaskEffects)>>;

    /// `switchboard ledger task ID --stopped --reason …`: an operator confirms that a
    /// cancelled task has stopped. Only a task whose stop was requested can be.
    async fn mark_task_stopped(&self, task_id: &TaskId, reason: &str) -> Result<(), DeclareTaskError>;
}
