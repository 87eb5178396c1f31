//! Operator questions asked in a route's chat (DESIGN §15).

use super::*;

#[async_trait]
pub trait Questions: Inspection + Send + Sync {
    /// Records a question for every unresolved send not asked about yet (one per
    /// envelope: its first unknown attempt), to be posted in `chat_id`. `new_id` names
    /// each. Returns the questions recorded, their prompts' sends `in_flight`.
    async fn record_new_questions(
        &self,
        chat_id: i64,
        thread_id: Option<i32>,
        new_id: &(dyn Fn() -> String + Send + Sync),
    ) -> LedgerResult<Vec<StoredQuestion>>;

    /// Records what a question's prompt send came to. A question whose prompt was not
    /// posted stays open and is not asked again: `switchboard ledger reconcile` settles
    /// its send.
    async fn finish_question_send(&self, id: &str, outcome: &AttemptOutcome) -> LedgerResult<()>;

    /// Start-up: a question whose prompt was being sent may have been posted: `unknown`,
    /// never sent again.
    async fn recover_question_sends(&self) -> LedgerResult<usize>;

    async fn question(&self, id: &str) -> LedgerResult<Option<StoredQuestion>>;

    /// An operator's answer: reconciles the envelope as `switchboard ledger reconcile`
    /// does (which refuses an envelope no longer unresolved: the first answer wins), then
    /// records who answered on the question.
    async fn answer_question(
        &self,
        question: &StoredQuestion,
        finding: Reconciliation,
        by: i64,
        by_name: &str,
    ) -> LedgerResult<QuestionAnswered> {
        let at = crate::clock::now_text();
        let reason = format!("answered in Telegram by {by_name} ({by}) at {at}");
        match self.reconcile(&question.trace_id, finding, &reason).await {
            Ok(_) => {}
            Err(ReconcileError::NothingToReconcile { .. } | ReconcileError::Unknown(_)) => {
                return Ok(QuestionAnswered::TooLate);
            }
            Err(ReconcileError::Db(e)) => return Err(e),
        }
        // A second transaction, after the reconciliation: should it be cut short,
        // `settle_answered_elsewhere` settles the question.
        self.record_answer(&question.id, QuestionState::answered(finding), by, by_name, &at).await?;
        Ok(QuestionAnswered::Reconciled)
    }

    /// Records on an open question who answered it, when, and what they found
    /// ([`Self::answer_question`]'s second step).
    async fn record_answer(
        &self,
        id: &str,
        state: QuestionState,
        by: i64,
        by_name: &str,
        at: &str,
    ) -> LedgerResult<()>;

    /// Open questions whose envelope is no longer unresolved are settled: reconciled with
    /// the CLI, or by an answer whose own record (a second transaction, after the
    /// reconciliation) was cut short.
    async fn settle_answered_elsewhere(&self) -> LedgerResult<usize>;

    /// Answered questions whose prompt does not show it yet.
    async fn unsettled_questions(&self) -> LedgerResult<Vec<StoredQuestion>>;

    /// Open questions whose prompt Telegram provably did not take (`not_sent`: out of
    /// reach, refused), taken to be asked again: each is `in_flight` once more, in the same
    /// statement, so two keepers never post one twice.
    async fn take_unsent_questions(&self) -> LedgerResult<Vec<StoredQuestion>>;

    async fn settle_question_prompt(&self, id: &str) -> LedgerResult<()>;
}
