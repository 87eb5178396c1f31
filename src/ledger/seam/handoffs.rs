//! Handoffs between agents and the delegation guard's view of them (DESIGN §9).

use super::*;

#[async_trait]
pub trait Handoffs: Send + Sync {
    /// Records an admitted handoff and queues its envelope for the target, together.
    /// A handoff made for an envelope of a task is admitted against that task first and
    /// records the task and revision it is made under (DESIGN.md §11); a refusal records
    /// nothing.
    async fn record_handoff(&self, new: &NewHandoff<'_>) -> LedgerResult<Result<StoredHandoff, Refusal>>;

    /// Ends an open handoff: its envelope is acked, and an answer envelope is queued for
    /// the delegator (the answer, or word that it was closed). Returns the handoff as it
    /// now stands; `None` when it was no longer open (nothing changed).
    async fn end_handoff(
        &self,
        handoff: &StoredHandoff,
        end: HandoffEnd<'_>,
        actor: &str,
    ) -> LedgerResult<Result<Option<StoredHandoff>, Refusal>>;

    /// A child's answer to a handoff a change superseded: kept as a late result, never
    /// delivered to the delegator as an answer (DESIGN.md §11). Returns whether one was
    /// kept (the first answer is; later ones leave it).
    async fn keep_late_result(&self, agent: &AgentName, trace_id: &TraceId, text: &str)
    -> LedgerResult<bool>;

    async fn handoff(&self, handoff_id: &HandoffId) -> LedgerResult<Option<StoredHandoff>>;

    /// The handoff an envelope carries: as its instruction or as its answer.
    async fn handoff_of_envelope(&self, envelope_id: i64) -> LedgerResult<Option<StoredHandoff>>;

    /// The handoff a request of `from` recorded, if it did.
    async fn handoff_by_request(
        &self,
        from: &AgentName,
        request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>>;

    /// The handoff a `reply` request of `agent` answered, if it did.
    async fn handoff_by_answer_request(
        &self,
        agent: &AgentName,
        request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>>;

    /// The handoffs made on behalf of one envelope: a turn's instructions, oldest first.
    async fn handoffs_for_cause(&self, cause_envelope_id: i64) -> LedgerResult<Vec<StoredHandoff>>;

    /// `from`'s handoffs still open, oldest first.
    async fn open_handoffs_from(&self, from: &AgentName) -> LedgerResult<Vec<StoredHandoff>>;

    /// For `switchboard ledger handoffs`: newest last.
    async fn list_handoffs(
        &self,
        open_only: bool,
        agent: Option<&str>,
        limit: i64,
    ) -> LedgerResult<Vec<StoredHandoff>>;
}
