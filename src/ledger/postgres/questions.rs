//! The operator's questions (issue 23) on PostgreSQL, as on SQLite (`sqlite/questions.rs`):
//! each unresolved send asked once, with buttons, in the `[operator]` route's chat. An
//! answer reconciles the envelope exactly as `switchboard ledger reconcile` does.
//!
//! **Races.** Asking is decided on what was asked before, for every envelope at once: two
//! replicas asking together must not both ask about one envelope. So
//! [`Questions::record_new_questions`] locks the questions' table against itself (`SHARE
//! ROW EXCLUSIVE`, which conflicts with itself and with row writes, not with reads) for its
//! transaction: askers run one after the other, each reading what the one before recorded,
//! as SQLite's one writer orders them. Row locks cannot do it, since what must be seen is a
//! question not yet written. An answer is the reconciliation's race (see `inspect`); the
//! other changes are conditional updates of one row.

use async_trait::async_trait;
use sqlx::Row;

use super::PgLedger;
use crate::domain::{AttemptOutcome, EnvelopeState, QuestionState, StoredQuestion};
use crate::ledger::LedgerResult;
use crate::ledger::columns::question_columns;
use crate::ledger::prelude::*;

#[async_trait]
impl Questions for PgLedger {
    async fn record_new_questions(
        &self,
        chat_id: i64,
        thread_id: Option<i32>,
        new_id: &(dyn Fn() -> String + Send + Sync),
    ) -> LedgerResult<Vec<StoredQuestion>> {
        let mut tx = self.begin().await?;
        sqlx::query("LOCK TABLE operator_questions IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
        let unasked = sqlx::query(
            "SELECT a.op_id, a.envelope_id, e.trace_id, a.chat_id, a.started_at, a.text \
             FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
             WHERE a.outcome = 'unknown' AND a.reconciled_outcome IS NULL AND e.state = 'unresolved' \
             AND NOT EXISTS (SELECT 1 FROM operator_questions q WHERE q.op_id = a.op_id) \
             AND NOT EXISTS (SELECT 1 FROM operator_questions q WHERE q.envelope_id = a.envelope_id \
                             AND q.state = 'open') \
             ORDER BY a.id",
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut asked: Vec<StoredQuestion> = Vec::new();
        for send in unasked {
            let envelope_id: i64 = send.try_get("envelope_id")?;
            // One question per envelope: its first unknown attempt.
            if asked.iter().any(|question| question.envelope_id == envelope_id) {
                continue;
            }
            let question = sqlx::query_as(concat!(
                "INSERT INTO operator_questions (id, op_id, envelope_id, trace_id, sent_chat_id, sent_at, \
                 sent_text, asked_at, state, chat_id, thread_id, prompt_send) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, now(), 'open', $8, $9, 'in_flight') RETURNING ",
                question_columns!()
            ))
            .bind(new_id())
            .bind(send.try_get::<&str, _>("op_id")?)
            .bind(envelope_id)
            .bind(send.try_get::<&str, _>("trace_id")?)
            .bind(send.try_get::<i64, _>("chat_id")?)
            .bind(send.try_get::<chrono::DateTime<chrono::Utc>, _>("started_at")?)
            .bind(send.try_get::<&str, _>("text")?)
            .bind(chat_id)
            .bind(thread_id.map(i64::from))
            .fetch_one(&mut *tx)
            .await?;
            asked.push(question);
        }
        tx.commit().await?;
        Ok(asked)
    }

    async fn finish_question_send(&self, id: &str, outcome: &AttemptOutcome) -> LedgerResult<()> {
        let (send, message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => ("sent", Some(i64::from(*message_id)), None),
            AttemptOutcome::NotSent { error } => ("not_sent", None, Some(error.as_str())),
            AttemptOutcome::Unknown { error } => ("unknown", None, Some(error.as_str())),
        };
        sqlx::query(
            "UPDATE operator_questions SET prompt_send = $1, prompt_message_id = $2, prompt_error = $3 WHERE id = $4",
        )
        .bind(send)
        .bind(message_id)
        .bind(error)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn recover_question_sends(&self) -> LedgerResult<usize> {
        let recovered = sqlx::query(
            "UPDATE operator_questions SET prompt_send = 'unknown', \
             prompt_error = 'the daemon stopped during the send' WHERE prompt_send = 'in_flight'",
        )
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(recovered as usize)
    }

    async fn question(&self, id: &str) -> LedgerResult<Option<StoredQuestion>> {
        Ok(sqlx::query_as(concat!("SELECT ", question_columns!(), " FROM operator_questions WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn record_answer(
        &self,
        id: &str,
        state: QuestionState,
        by: i64,
        by_name: &str,
        at: &str,
    ) -> LedgerResult<()> {
        sqlx::query(
            "UPDATE operator_questions SET state = $1, answered_by = $2, answered_by_name = $3, \
             answered_at = $4::timestamptz WHERE id = $5 AND state = 'open'",
        )
        .bind(state.as_str())
        .bind(by)
        .bind(by_name)
        .bind(at)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn settle_answered_elsewhere(&self) -> LedgerResult<usize> {
        let settled = sqlx::query(
            "UPDATE operator_questions SET state = 'settled' WHERE state = 'open' AND NOT EXISTS \
             (SELECT 1 FROM envelopes e WHERE e.id = operator_questions.envelope_id AND e.state = $1)",
        )
        .bind(EnvelopeState::Unresolved.as_str())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(settled as usize)
    }

    async fn take_unsent_questions(&self) -> LedgerResult<Vec<StoredQuestion>> {
        Ok(sqlx::query_as(concat!(
            "UPDATE operator_questions SET prompt_send = 'in_flight', prompt_error = NULL \
             WHERE state = 'open' AND prompt_send = 'not_sent' RETURNING ",
            question_columns!()
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn unsettled_questions(&self) -> LedgerResult<Vec<StoredQuestion>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            question_columns!(),
            " FROM operator_questions WHERE NOT prompt_settled AND state <> 'open' \
             AND prompt_send <> 'in_flight' ORDER BY asked_at"
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn settle_question_prompt(&self, id: &str) -> LedgerResult<()> {
        sqlx::query("UPDATE operator_questions SET prompt_settled = TRUE WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
