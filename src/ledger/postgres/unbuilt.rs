//! The concerns of the storage seam this backend does not implement yet: each method
//! fails with [`unbuilt`], naming itself, and changes nothing. A concern leaves this file
//! for one of its own (`intake.rs`, `attempts.rs`, …) when it is built and the
//! conformance suite's rules for it pass on PostgreSQL (`tests.rs`). Until this file is
//! gone, `[storage] database` does not accept a PostgreSQL URL (`config/validate.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::PgLedger;
use crate::ids::{AgentName, AttemptId, TraceId};
use crate::ledger::seam::*;
use crate::ledger::*;
use crate::rules::revisions::Refusal;

/// The error of a seam method this backend does not implement yet.
fn unbuilt(method: &str) -> LedgerError {
    LedgerError::other(format!("`{method}` is not built on PostgreSQL yet"))
}

#[async_trait]
impl Attempts for PgLedger {
    async fn begin_attempt(&self, _attempt: &NewAttempt<'_>) -> LedgerResult<Result<AttemptId, Refusal>> {
        Err(unbuilt("Attempts::begin_attempt"))
    }

    async fn finish_attempt(
        &self,
        _op_id: &AttemptId,
        _outcome: &AttemptOutcome,
        _actor: &str,
    ) -> LedgerResult<()> {
        Err(unbuilt("Attempts::finish_attempt"))
    }

    async fn recover_in_flight(&self) -> LedgerResult<Vec<TraceId>> {
        Err(unbuilt("Attempts::recover_in_flight"))
    }

    async fn reply_request_seen(&self, _agent: &str, _request_id: &str) -> LedgerResult<bool> {
        Err(unbuilt("Attempts::reply_request_seen"))
    }

    async fn recorded_reply(&self, _agent: &str, _request_id: &str) -> LedgerResult<Option<RecordedReply>> {
        Err(unbuilt("Attempts::recorded_reply"))
    }

    async fn last_reply_for(&self, _envelope_id: i64) -> LedgerResult<Option<(String, Vec<StoredAttempt>)>> {
        Err(unbuilt("Attempts::last_reply_for"))
    }

    async fn awaiting_reconciliation(&self, _envelope_ids: &[i64]) -> LedgerResult<Vec<i64>> {
        Err(unbuilt("Attempts::awaiting_reconciliation"))
    }

    async fn bot_message(
        &self,
        _chat_id: i64,
        _message_id: i32,
    ) -> LedgerResult<Option<(String, AttemptMethod)>> {
        Err(unbuilt("Attempts::bot_message"))
    }

    async fn action_attempt(&self, _agent: &str, _request_id: &str) -> LedgerResult<Option<StoredAttempt>> {
        Err(unbuilt("Attempts::action_attempt"))
    }

    async fn attempts_for(&self, _envelope_id: i64) -> LedgerResult<Vec<StoredAttempt>> {
        Err(unbuilt("Attempts::attempts_for"))
    }
}

#[async_trait]
impl Inspection for PgLedger {
    async fn list(&self, _filter: &ListFilter) -> LedgerResult<Vec<StoredEnvelope>> {
        Err(unbuilt("Inspection::list"))
    }

    async fn count_by_state(&self) -> LedgerResult<Vec<(String, i64)>> {
        Err(unbuilt("Inspection::count_by_state"))
    }

    async fn events_for(&self, _envelope_id: i64) -> LedgerResult<Vec<StoredEvent>> {
        Err(unbuilt("Inspection::events_for"))
    }

    async fn reconcile(
        &self,
        _trace_id: &TraceId,
        _finding: Reconciliation,
        _reason: &str,
    ) -> Result<EnvelopeState, ReconcileError> {
        Err(unbuilt("Inspection::reconcile").into())
    }

    async fn unreconciled_attempts(&self) -> LedgerResult<i64> {
        Err(unbuilt("Inspection::unreconciled_attempts"))
    }

    async fn count_handoffs_by_state(&self) -> LedgerResult<Vec<(String, i64)>> {
        Err(unbuilt("Inspection::count_handoffs_by_state"))
    }
}

#[async_trait]
impl Permissions for PgLedger {
    async fn record_permission_request(
        &self,
        _new: &NewPermissionRequest<'_>,
    ) -> LedgerResult<(StoredPermission, bool)> {
        Err(unbuilt("Permissions::record_permission_request"))
    }

    async fn finish_prompt_send(
        &self,
        _id: &str,
        _outcome: &AttemptOutcome,
    ) -> LedgerResult<StoredPermission> {
        Err(unbuilt("Permissions::finish_prompt_send"))
    }

    async fn recover_prompt_sends(&self) -> LedgerResult<usize> {
        Err(unbuilt("Permissions::recover_prompt_sends"))
    }

    async fn permission(&self, _id: &str) -> LedgerResult<Option<StoredPermission>> {
        Err(unbuilt("Permissions::permission"))
    }

    async fn pending_permissions_named(
        &self,
        _request_id: &str,
        _chat_id: i64,
    ) -> LedgerResult<Vec<StoredPermission>> {
        Err(unbuilt("Permissions::pending_permissions_named"))
    }

    async fn answer_permission(
        &self,
        _id: &str,
        _verdict: PermissionVerdict,
        _by: i64,
        _by_name: &str,
    ) -> LedgerResult<AnswerRecorded> {
        Err(unbuilt("Permissions::answer_permission"))
    }

    async fn expire_due_permissions(&self) -> LedgerResult<Vec<StoredPermission>> {
        Err(unbuilt("Permissions::expire_due_permissions"))
    }

    async fn expire_permissions_of_ended_session(
        &self,
        _agent: &str,
        _ended: EndedPlugins<'_>,
    ) -> LedgerResult<usize> {
        Err(unbuilt("Permissions::expire_permissions_of_ended_session"))
    }

    async fn next_permission_expiry(&self) -> LedgerResult<Option<DateTime<Utc>>> {
        Err(unbuilt("Permissions::next_permission_expiry"))
    }

    async fn unsettled_prompts(&self) -> LedgerResult<Vec<StoredPermission>> {
        Err(unbuilt("Permissions::unsettled_prompts"))
    }

    async fn settle_prompt(&self, _id: &str) -> LedgerResult<()> {
        Err(unbuilt("Permissions::settle_prompt"))
    }

    async fn note_prompt_message(&self, _id: &str, _message_id: i32) -> LedgerResult<()> {
        Err(unbuilt("Permissions::note_prompt_message"))
    }

    async fn undelivered_verdicts(&self, _plugin: &str) -> LedgerResult<Vec<StoredPermission>> {
        Err(unbuilt("Permissions::undelivered_verdicts"))
    }

    async fn verdict_sent(&self, _id: &str) -> LedgerResult<()> {
        Err(unbuilt("Permissions::verdict_sent"))
    }

    async fn list_permissions(&self, _limit: i64) -> LedgerResult<Vec<StoredPermission>> {
        Err(unbuilt("Permissions::list_permissions"))
    }

    async fn count_permissions_by_state(&self) -> LedgerResult<Vec<(PermissionState, i64)>> {
        Err(unbuilt("Permissions::count_permissions_by_state"))
    }
}

#[async_trait]
impl Questions for PgLedger {
    async fn record_new_questions(
        &self,
        _chat_id: i64,
        _thread_id: Option<i32>,
        _new_id: &(dyn Fn() -> String + Send + Sync),
    ) -> LedgerResult<Vec<StoredQuestion>> {
        Err(unbuilt("Questions::record_new_questions"))
    }

    async fn finish_question_send(&self, _id: &str, _outcome: &AttemptOutcome) -> LedgerResult<()> {
        Err(unbuilt("Questions::finish_question_send"))
    }

    async fn recover_question_sends(&self) -> LedgerResult<usize> {
        Err(unbuilt("Questions::recover_question_sends"))
    }

    async fn question(&self, _id: &str) -> LedgerResult<Option<StoredQuestion>> {
        Err(unbuilt("Questions::question"))
    }

    async fn answer_question(
        &self,
        _question: &StoredQuestion,
        _finding: Reconciliation,
        _by: i64,
        _by_name: &str,
    ) -> LedgerResult<QuestionAnswered> {
        Err(unbuilt("Questions::answer_question"))
    }

    async fn settle_answered_elsewhere(&self) -> LedgerResult<usize> {
        Err(unbuilt("Questions::settle_answered_elsewhere"))
    }

    async fn unsettled_questions(&self) -> LedgerResult<Vec<StoredQuestion>> {
        Err(unbuilt("Questions::unsettled_questions"))
    }

    async fn settle_question_prompt(&self, _id: &str) -> LedgerResult<()> {
        Err(unbuilt("Questions::settle_question_prompt"))
    }
}

#[async_trait]
impl Reactions for PgLedger {
    async fn owed_reactions(&self, _agent: &AgentName) -> LedgerResult<Vec<StoredReaction>> {
        Err(unbuilt("Reactions::owed_reactions"))
    }

    async fn reactions_delivered(&self, _ids: &[i64]) -> LedgerResult<()> {
        Err(unbuilt("Reactions::reactions_delivered"))
    }

    async fn reactions_recorded(&self) -> LedgerResult<Vec<ReactionAudit>> {
        Err(unbuilt("Reactions::reactions_recorded"))
    }
}
