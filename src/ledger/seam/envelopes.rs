//! Envelopes after intake: delivery to sessions, lookups and state transitions (DESIGN §2).

use super::*;

#[async_trait]
pub trait Envelopes: Send + Sync {
    /// Moves the agent's oldest `queued` envelope to `pending` and returns it.
    async fn claim_next_queued(&self, agent: &AgentName) -> LedgerResult<Option<StoredEnvelope>>;

    /// The agent's `pending` envelopes, oldest first, counted as delivered once more: a new
    /// session gets them again, marked as redelivered.
    async fn take_pending_for_redelivery(&self, agent: &AgentName) -> LedgerResult<Vec<StoredEnvelope>>;

    async fn pending(&self, agent: &AgentName) -> LedgerResult<Vec<StoredEnvelope>>;

    /// The files of the envelope `trace_id` (kind, file id, size, type, name), in the
    /// message's order; `None` when there is no such envelope.
    async fn attachments_of(&self, trace_id: &TraceId) -> LedgerResult<Option<Vec<Attachment>>>;

    async fn find(&self, trace_id: &TraceId) -> LedgerResult<Option<StoredEnvelope>>;

    /// [`Self::find`] for a reply that names its envelope, with what the envelope's
    /// attempts say about it, in one statement instead of three on the reply's path: the
    /// answers of `awaiting_reconciliation` and whether `last_reply_for` has anything.
    async fn find_for_reply(&self, trace_id: &TraceId) -> LedgerResult<Option<FoundForReply>>;

    // ---- state transitions ----

    /// Moves an envelope to `to` if it is in one of `from`, recording who did it and why.
    /// Returns false (and changes nothing) when the envelope was not in an allowed state.
    async fn transition(
        &self,
        envelope_id: i64,
        from: &[EnvelopeState],
        to: EnvelopeState,
        actor: &str,
        reason: Option<&str>,
    ) -> LedgerResult<bool>;
}
