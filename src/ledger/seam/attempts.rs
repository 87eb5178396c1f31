//! Send attempts: each reply part, reaction and edit the daemon makes, and what became of it (DESIGN §4).

use super::*;

#[async_trait]
pub trait Attempts: Send + Sync {
    /// Records an attempt before its request is made; returns its operation id. A reply's
    /// attempt is admitted against its envelope's task in the same statement that records
    /// it (DESIGN.md §11): once a change is recorded, no part of a reply made for what it
    /// superseded, paused or cancelled goes out. A refusal records nothing.
    async fn begin_attempt(&self, attempt: &NewAttempt<'_>) -> LedgerResult<Result<AttemptId, Refusal>>;

    /// Records what an attempt came to and, in the same transaction, what that proves
    /// about its envelope: the last part of a reply confirmed sent answers it (`acked`);
    /// an unknown outcome makes a `pending` envelope `unresolved`. A crash can therefore
    /// never leave a confirmed or unknown send beside an envelope that still looks
    /// unanswered. An envelope already `acked` stays acked when a later follow-up's
    /// outcome is unknown: the envelope was answered, and the follow-up attempt is what
    /// needs reconciling.
    ///
    /// Only an attempt still in flight is finished. One that start-up recovery settled
    /// meanwhile (as `unknown`: the replica that took over from this one, on PostgreSQL)
    /// keeps that outcome whatever comes later, so the ledger never tells two stories; the
    /// caller learns it from [`FinishedAttempt::AlreadySettled`].
    async fn finish_attempt(
        &self,
        op_id: &AttemptId,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> LedgerResult<FinishedAttempt>;

    /// At start-up: attempts left `in_flight` by a daemon that died mid-send may have
    /// reached Telegram. They become `unknown` and their envelopes `unresolved`; an
    /// operator reconciles them. Returns the trace ids affected.
    async fn recover_in_flight(&self) -> LedgerResult<Vec<TraceId>> {
        let stuck = self.in_flight_attempts().await?;
        let error = "the daemon stopped while this send was in flight".to_owned();
        for (op_id, _) in &stuck {
            self.finish_attempt(op_id, &AttemptOutcome::Unknown { error: error.clone() }, "daemon").await?;
        }
        Ok(stuck.into_iter().map(|(_, trace_id)| trace_id).collect())
    }

    /// Every attempt still `in_flight`, oldest first, with its envelope's trace id.
    async fn in_flight_attempts(&self) -> LedgerResult<Vec<(AttemptId, TraceId)>>;

    /// Whether `agent` made a `reply` request with this id before: it left attempts, or it
    /// answered a handoff. One statement, so a new request (nearly every one) costs no
    /// more; [`Self::recorded_reply`] and `handoff_by_answer_request` tell what it came to.
    async fn reply_request_seen(&self, agent: &str, request_id: &str) -> LedgerResult<bool>;

    /// The attempts made for one `reply` request of `agent`, summed up with the parts it
    /// carried over from the request it resumed ([`standing_attempts`](crate::domain::standing_attempts)); `None` when no
    /// attempt carries that id (the request was never acted on).
    async fn recorded_reply(&self, agent: &str, request_id: &str) -> LedgerResult<Option<RecordedReply>>;

    /// The most recent `reply` request made for an envelope, with the attempts its outcome
    /// stands on ([`standing_attempts`](crate::domain::standing_attempts): the parts it carried from the request it resumed
    /// included): what a repeated reply with the same text may build on (parts already
    /// delivered are not sent again).
    async fn last_reply_for(&self, envelope_id: i64) -> LedgerResult<Option<(String, Vec<StoredAttempt>)>>;

    /// Of these envelopes, the ones with an attempt whose outcome is unknown and not yet
    /// reconciled: nothing more may be sent for them until an operator has looked.
    async fn awaiting_reconciliation(&self, envelope_ids: &[i64]) -> LedgerResult<Vec<i64>>;

    /// Whom a message the bot posted in `chat_id` was sent for (the agent, `switchboard`
    /// for its own posts) and how: from the confirmed attempt that posted it. `None` when
    /// the ledger knows of no such message (a reaction or an edit posts none).
    async fn bot_message(
        &self,
        chat_id: i64,
        message_id: i32,
    ) -> LedgerResult<Option<(String, AttemptMethod)>>;

    /// The last attempt of a reaction or edit request of `agent`: what a repeat of that
    /// request is answered with, instead of acting twice.
    async fn action_attempt(&self, agent: &str, request_id: &str) -> LedgerResult<Option<StoredAttempt>>;

    async fn attempts_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredAttempt>>;
}
