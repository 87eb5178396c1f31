//! The concerns of the storage seam this backend does not implement yet: each method
//! fails with [`unbuilt`], naming itself, and changes nothing. A concern leaves this file
//! for one of its own (`intake.rs`, `attempts.rs`, …) when it is built and the
//! conformance suite's rules for it pass on PostgreSQL (`tests.rs`). Until this file is
//! gone, `[storage] database` does not accept a PostgreSQL URL (`config/validate.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::PgLedger;
use crate::ids::{AgentName, AttemptId, CascadeId, HandoffId, TraceId};
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
impl Handoffs for PgLedger {
    async fn record_handoff(&self, _new: &NewHandoff<'_>) -> LedgerResult<Result<StoredHandoff, Refusal>> {
        Err(unbuilt("Handoffs::record_handoff"))
    }

    async fn end_handoff(
        &self,
        _handoff: &StoredHandoff,
        _end: HandoffEnd<'_>,
        _actor: &str,
    ) -> LedgerResult<Result<Option<StoredHandoff>, Refusal>> {
        Err(unbuilt("Handoffs::end_handoff"))
    }

    async fn keep_late_result(
        &self,
        _agent: &AgentName,
        _trace_id: &TraceId,
        _text: &str,
    ) -> LedgerResult<bool> {
        Err(unbuilt("Handoffs::keep_late_result"))
    }

    async fn handoff(&self, _handoff_id: &HandoffId) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff"))
    }

    async fn handoff_of_envelope(&self, _envelope_id: i64) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff_of_envelope"))
    }

    async fn handoff_by_request(
        &self,
        _from: &AgentName,
        _request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff_by_request"))
    }

    async fn handoff_by_answer_request(
        &self,
        _agent: &AgentName,
        _request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff_by_answer_request"))
    }

    async fn handoffs_for_cause(&self, _cause_envelope_id: i64) -> LedgerResult<Vec<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoffs_for_cause"))
    }

    async fn open_handoffs_from(&self, _from: &AgentName) -> LedgerResult<Vec<StoredHandoff>> {
        Err(unbuilt("Handoffs::open_handoffs_from"))
    }

    async fn list_handoffs(
        &self,
        _open_only: bool,
        _agent: Option<&str>,
        _limit: i64,
    ) -> LedgerResult<Vec<StoredHandoff>> {
        Err(unbuilt("Handoffs::list_handoffs"))
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
impl Retention for PgLedger {
    async fn prune(&self, _finished_before: DateTime<Utc>, _dry_run: bool) -> LedgerResult<PruneReport> {
        Err(unbuilt("Retention::prune"))
    }

    async fn pages(&self) -> LedgerResult<Pages> {
        Err(unbuilt("Retention::pages"))
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

#[async_trait]
impl Rooms for PgLedger {
    async fn room_inbox(&self) -> LedgerResult<Vec<StoredEnvelope>> {
        Err(unbuilt("Rooms::room_inbox"))
    }

    async fn record_cascade(&self, _new: &NewCascade<'_>, _note: &str) -> LedgerResult<Option<CascadeId>> {
        Err(unbuilt("Rooms::record_cascade"))
    }

    async fn apply_room_step(&self, _step: &RoomStep<'_>) -> LedgerResult<Option<AppliedStep>> {
        Err(unbuilt("Rooms::apply_room_step"))
    }

    async fn active_cascade(&self, _route: &str) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::active_cascade"))
    }

    async fn next_waiting_cascade(&self, _route: &str) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::next_waiting_cascade"))
    }

    async fn waiting_cascades(&self, _route: &str) -> LedgerResult<i64> {
        Err(unbuilt("Rooms::waiting_cascades"))
    }

    async fn busy_rooms(&self) -> LedgerResult<Vec<String>> {
        Err(unbuilt("Rooms::busy_rooms"))
    }

    async fn cascade(&self, _cascade_id: &CascadeId) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::cascade"))
    }

    async fn cascade_of_message(&self, _envelope_id: i64) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::cascade_of_message"))
    }

    async fn list_cascades(&self, _route: Option<&str>, _limit: i64) -> LedgerResult<Vec<StoredCascade>> {
        Err(unbuilt("Rooms::list_cascades"))
    }

    async fn turns_of(&self, _cascade_row: i64) -> LedgerResult<Vec<StoredTurn>> {
        Err(unbuilt("Rooms::turns_of"))
    }

    async fn turn_of_envelope(&self, _envelope_id: i64) -> LedgerResult<Option<(StoredTurn, StoredCascade)>> {
        Err(unbuilt("Rooms::turn_of_envelope"))
    }

    async fn claim_room_reply(
        &self,
        _envelope_id: i64,
        _text: &str,
        _request_id: &str,
    ) -> LedgerResult<Result<StoredTurn, ClaimRefused>> {
        Err(unbuilt("Rooms::claim_room_reply"))
    }

    async fn release_room_reply(&self, _turn_id: i64) -> LedgerResult<bool> {
        Err(unbuilt("Rooms::release_room_reply"))
    }

    async fn owed_room_posts(&self) -> LedgerResult<Vec<StoredPost>> {
        Err(unbuilt("Rooms::owed_room_posts"))
    }

    async fn posts_of(&self, _cascade_row: i64) -> LedgerResult<Vec<StoredPost>> {
        Err(unbuilt("Rooms::posts_of"))
    }

    async fn room_post_attempted(&self, _poster: &str, _key: &str) -> LedgerResult<bool> {
        Err(unbuilt("Rooms::room_post_attempted"))
    }

    async fn mark_room_post_made(&self, _post_id: i64) -> LedgerResult<()> {
        Err(unbuilt("Rooms::mark_room_post_made"))
    }
}
