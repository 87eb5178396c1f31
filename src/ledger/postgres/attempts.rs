//! Send attempts (DESIGN.md §4) on PostgreSQL: recorded before the request, admitted
//! against their envelope's task in the transaction that records them, classified after,
//! settling their envelope in the transaction that classifies them — as on SQLite
//! (`sqlite/attempts.rs`).
//!
//! **Races between replicas.** Every send is claimed by one replica (DESIGN §16), so an
//! attempt's row is written by the replica that made it; what replicas share is the
//! envelope and its task. Admission holds the task's row `FOR SHARE` until the attempt is
//! recorded (`tasks::admission_in`), so a change of the task waits for it or is seen by it.
//! The envelope moves by conditional updates (`envelopes::transition_in`, `UPDATE … WHERE
//! state = …`): of two replicas settling one envelope at once, the second waits on the row,
//! re-reads it as the first committed it (READ COMMITTED re-checks the `WHERE` of an
//! `UPDATE` that waited on a row lock) and no longer finds the state it moves from. A
//! conditional update rather than `SELECT … FOR UPDATE` first, because it costs one
//! statement where the envelope is as expected, which is nearly always, on the path of
//! every reply.

use async_trait::async_trait;
use sqlx::{FromRow, Row};

use super::envelopes::transition_in;
use super::handoffs::settle_answers_for;
use super::rows::{attempt_columns, text_enum};
use super::tasks::admission_in;
use super::transaction::transaction_columns;
use super::{PgLedger, fenced_lease, no_longer_leads, under_lease};
use crate::domain::{
    AttemptMethod, AttemptOutcome, AttemptPurpose, EnvelopeState, FinishedAttempt, NewAttempt, RecordedReply,
    StoredAttempt, standing_attempts,
};
use crate::ids::{AttemptId, TraceId};
use crate::ledger::columns::reply_part_method;
use crate::ledger::prelude::*;
use crate::ledger::{LedgerError, LedgerResult, LedgerWrite};
use crate::rules::leadership::Term;
use crate::rules::revisions::Refusal;

#[async_trait]
impl Attempts for PgLedger {
    async fn begin_attempt(&self, attempt: &NewAttempt<'_>) -> LedgerResult<Result<AttemptId, Refusal>> {
        let decided = self.record_admitted_attempt(attempt).await;
        self.writes.observe(LedgerWrite::Attempt, &decided);
        decided
    }

    async fn finish_attempt(
        &self,
        op_id: &AttemptId,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> LedgerResult<FinishedAttempt> {
        let finished = self.classify_attempt(op_id, outcome, actor).await;
        self.writes.observe(LedgerWrite::Attempt, &finished);
        finished
    }

    async fn in_flight_attempts(&self) -> LedgerResult<Vec<(AttemptId, TraceId)>> {
        Ok(sqlx::query_as(
            "SELECT a.op_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
             WHERE a.outcome = 'in_flight' ORDER BY a.id",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn reply_request_seen(&self, agent: &str, request_id: &str) -> LedgerResult<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM attempts WHERE agent = $1 AND request_id = $2) \
             OR EXISTS (SELECT 1 FROM handoffs WHERE to_agent = $1 AND answer_request_id = $2)",
        )
        .bind(agent)
        .bind(request_id)
        .fetch_one(&self.pool)
        .await?)
    }

    async fn recorded_reply(&self, agent: &str, request_id: &str) -> LedgerResult<Option<RecordedReply>> {
        // The envelope with every reply request made for it, in one statement: one snapshot
        // for both. The earlier requests count: the parts a resumed request carried.
        let sql = concat!(
            "SELECT a.envelope_id, e.trace_id, ",
            attempt_columns!(),
            " FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
             WHERE a.envelope_id = (SELECT r.envelope_id FROM attempts r WHERE r.agent = $1 AND r.request_id = $2 \
               AND r.",
            reply_part_method!(),
            " LIMIT 1) AND a.request_id IS NOT NULL AND a.",
            reply_part_method!(),
            " ORDER BY a.id"
        );
        let rows = sqlx::query(sql).bind(agent).bind(request_id).fetch_all(&self.pool).await?;
        let Some(first) = rows.first() else { return Ok(None) };
        let envelope_id: i64 = first.try_get("envelope_id")?;
        let trace_id: TraceId = first.try_get("trace_id")?;
        let history = rows.iter().map(StoredAttempt::from_row).collect::<sqlx::Result<Vec<_>>>()?;
        Ok(RecordedReply::from_attempts(envelope_id, trace_id, &standing_attempts(&history, request_id)))
    }

    async fn last_reply_for(&self, envelope_id: i64) -> LedgerResult<Option<(String, Vec<StoredAttempt>)>> {
        // Every reply request made for the envelope, in one statement: the latest one's
        // outcome counts the parts it carried from the one before.
        let sql = concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts a WHERE a.envelope_id = $1 AND a.request_id IS NOT NULL AND a.",
            reply_part_method!(),
            " ORDER BY a.id"
        );
        let history: Vec<StoredAttempt> = sqlx::query_as(sql).bind(envelope_id).fetch_all(&self.pool).await?;
        let Some(request_id) = history.last().and_then(|attempt| attempt.request_id.clone()) else {
            return Ok(None);
        };
        let standing = standing_attempts(&history, &request_id);
        Ok(Some((request_id, standing)))
    }

    async fn awaiting_reconciliation(&self, envelope_ids: &[i64]) -> LedgerResult<Vec<i64>> {
        if envelope_ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar(concat!(
            "SELECT DISTINCT a.envelope_id FROM attempts a WHERE a.outcome IN ('unknown', 'in_flight') \
             AND a.reconciled_outcome IS NULL AND a.purpose = 'reply' AND a.",
            reply_part_method!(),
            " AND a.envelope_id = ANY($1)"
        ))
        .bind(envelope_ids)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn bot_message(
        &self,
        chat_id: i64,
        message_id: i32,
    ) -> LedgerResult<Option<(String, AttemptMethod)>> {
        let sql = concat!(
            "SELECT a.agent, a.method FROM attempts a WHERE a.chat_id = $1 AND a.telegram_message_id = $2 \
             AND a.outcome = 'sent' AND a.",
            reply_part_method!(),
            " ORDER BY a.id DESC LIMIT 1"
        );
        let row =
            sqlx::query(sql).bind(chat_id).bind(i64::from(message_id)).fetch_optional(&self.pool).await?;
        Ok(row
            .map(|row| Ok::<_, sqlx::Error>((row.try_get("agent")?, text_enum(&row, "method")?)))
            .transpose()?)
    }

    async fn action_attempt(&self, agent: &str, request_id: &str) -> LedgerResult<Option<StoredAttempt>> {
        let sql = concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts a WHERE a.agent = $1 AND a.request_id = $2 AND NOT a.",
            reply_part_method!(),
            " ORDER BY a.id DESC LIMIT 1"
        );
        Ok(sqlx::query_as(sql).bind(agent).bind(request_id).fetch_optional(&self.pool).await?)
    }

    async fn attempts_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredAttempt>> {
        let sql =
            concat!("SELECT ", attempt_columns!(), " FROM attempts a WHERE a.envelope_id = $1 ORDER BY a.id");
        Ok(sqlx::query_as(sql).bind(envelope_id).fetch_all(&self.pool).await?)
    }
}

impl PgLedger {
    /// [`Attempts::begin_attempt`]: admission and the record in one transaction. An audit
    /// copy is recorded whatever its envelope's task says, as on SQLite; a refusal records
    /// nothing.
    async fn record_admitted_attempt(
        &self,
        attempt: &NewAttempt<'_>,
    ) -> LedgerResult<Result<AttemptId, Refusal>> {
        let (bot_id, term) = self.leader_fence().lease_binds()?;
        let mut tx = self.begin().await?;
        if attempt.purpose != AttemptPurpose::Audit
            && let Err(refusal) = admission_in(&mut tx, attempt.envelope_id).await?
        {
            // Ended here rather than when dropped: a dropped transaction's rollback waits
            // for the connection's next use, holding the task's row until then.
            tx.rollback().await?;
            return Ok(Err(refusal));
        }
        let op_id = AttemptId::generate();
        // Fenced as a polled batch is (`fence_intake`): recorded only while the lease names
        // this replica's term, and an election waits for this transaction, so a new
        // leader's recovery finds the attempt and makes it `unknown` should it still be in
        // flight.
        let recorded = sqlx::query(concat!(
            "WITH ",
            fenced_lease!("$14"),
            " INSERT INTO attempts (op_id, envelope_id, agent, request_id, purpose, chat_id, thread_id, \
             reply_to_message_id, chunk_index, chunk_count, text, outcome, started_at, method, target_message_id) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'in_flight', now(), $12, $13 \
             WHERE ",
            under_lease!("$14", "$15"),
            " RETURNING ",
            transaction_columns!(),
        ))
        .bind(&op_id)
        .bind(attempt.envelope_id)
        .bind(attempt.agent)
        .bind(attempt.request_id)
        .bind(attempt.purpose.as_str())
        .bind(attempt.chat_id)
        .bind(attempt.thread_id.map(i64::from))
        .bind(attempt.reply_to_message_id.map(i64::from))
        .bind(attempt.chunk_index as i64)
        .bind(attempt.chunk_count as i64)
        .bind(attempt.text)
        .bind(attempt.method.as_str())
        .bind(attempt.target_message_id.map(i64::from))
        .bind(bot_id)
        .bind(term)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(recorded) = recorded else {
            tx.rollback().await?;
            let (Some(bot_id), Some(term)) = (bot_id, term) else {
                return Err(LedgerError::other("an unfenced attempt was not recorded"));
            };
            // Refused by the fence: this replica's term is over here too.
            let term = Term::new(term);
            self.stop_leading_polling(bot_id, term);
            return Err(no_longer_leads(bot_id, term));
        };
        tx.note(&recorded)?;
        tx.commit().await?;
        Ok(Ok(op_id))
    }

    /// [`Attempts::finish_attempt`]: the attempt's outcome and what it proves about its
    /// envelope, in one transaction.
    async fn classify_attempt(
        &self,
        op_id: &AttemptId,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> LedgerResult<FinishedAttempt> {
        let (message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => (Some(i64::from(*message_id)), None),
            AttemptOutcome::NotSent { error } | AttemptOutcome::Unknown { error } => {
                (None, Some(error.as_str()))
            }
        };
        let mut tx = self.begin().await?;
        let finished = sqlx::query(concat!(
            "UPDATE attempts SET outcome = $1, telegram_message_id = $2, error = $3, finished_at = now() \
             WHERE op_id = $4 AND outcome = 'in_flight' \
             RETURNING envelope_id, chunk_index, chunk_count, purpose, method, ",
            transaction_columns!()
        ))
        .bind(outcome.state().as_str())
        .bind(message_id)
        .bind(error)
        .bind(op_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(finished) = finished else {
            tx.rollback().await?;
            let settled = sqlx::query("SELECT outcome, telegram_message_id FROM attempts WHERE op_id = $1")
                .bind(op_id)
                .fetch_optional(&self.pool)
                .await?;
            return match settled {
                Some(row) => Ok(FinishedAttempt::found_settled(
                    text_enum(&row, "outcome")?,
                    row.try_get("telegram_message_id")?,
                    outcome,
                )),
                None => Err(LedgerError::other(format!("no attempt {op_id} was recorded to finish"))),
            };
        };
        tx.note(&finished)?;
        let envelope_id: i64 = finished.try_get("envelope_id")?;
        let chunk_index: i64 = finished.try_get("chunk_index")?;
        let chunk_count: i64 = finished.try_get("chunk_count")?;
        let purpose: String = finished.try_get("purpose")?;
        let method: AttemptMethod = text_enum(&finished, "method")?;
        // An audit copy, a reaction or an edit answers nothing: only its own row changes.
        if purpose != AttemptPurpose::Audit.as_str() && method.is_reply_part() {
            match outcome {
                AttemptOutcome::Sent { message_id } if chunk_index + 1 == chunk_count => {
                    let answerable = [EnvelopeState::Pending, EnvelopeState::Acked];
                    let reason = format!("replied ({op_id}, Telegram message {message_id})");
                    transition_in(
                        &mut tx,
                        envelope_id,
                        &answerable,
                        EnvelopeState::Acked,
                        actor,
                        Some(&reason),
                    )
                    .await?;
                    // The answers of handoffs made for this conversation are answered too.
                    let reason = format!("answered with the reply {op_id} to its conversation");
                    settle_answers_for(&mut tx, envelope_id, actor, &reason).await?;
                }
                AttemptOutcome::Unknown { error } => {
                    let reason = format!("send outcome unknown ({op_id}): {error}");
                    let pending = [EnvelopeState::Pending];
                    transition_in(
                        &mut tx,
                        envelope_id,
                        &pending,
                        EnvelopeState::Unresolved,
                        actor,
                        Some(&reason),
                    )
                    .await?;
                }
                _ => {}
            }
        }
        tx.commit().await?;
        Ok(FinishedAttempt::Recorded)
    }
}
