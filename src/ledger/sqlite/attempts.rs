//! Send attempts (DESIGN.md §4): recorded before the request, classified after, and
//! settling their envelope in the same transaction.

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::columns::{optional_timestamp, timestamp_column};
use super::envelopes::transition_in;
use super::in_place::{execute_cached, optional_text_enum, query_all_cached, query_row_cached, text_enum};
use super::{LedgerError, LedgerResult, SqliteLedger, now};
use crate::domain::{
    AttemptMethod, AttemptOutcome, AttemptPurpose, FinishedAttempt, NewAttempt, RecordedReply, StoredAttempt,
    standing_attempts,
};
use crate::ids::{AttemptId, TraceId};
use crate::ledger::columns::reply_part_method;
use crate::ledger::prelude::*;
use crate::ledger::{EnvelopeState, LedgerWrite};
use crate::rules::revisions::Refusal;

impl StoredAttempt {
    /// A row of [`attempt_columns!`], read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            op_id: row.get("op_id")?,
            request_id: row.get("request_id")?,
            method: text_enum(row, "method")?,
            target_message_id: row.get("target_message_id")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            reply_to_message_id: row.get("reply_to_message_id")?,
            chunk_index: row.get("chunk_index")?,
            chunk_count: row.get("chunk_count")?,
            text: row.get("text")?,
            outcome: text_enum(row, "outcome")?,
            telegram_message_id: row.get("telegram_message_id")?,
            error: row.get("error")?,
            started_at: timestamp_column(row, "started_at")?,
            finished_at: optional_timestamp(row, "finished_at")?,
            reconciled_outcome: optional_text_enum(row, "reconciled_outcome")?,
            reconciled_reason: row.get("reconciled_reason")?,
        })
    }
}

/// The columns of [`StoredAttempt`].
macro_rules! attempt_columns {
    () => {
        "op_id, request_id, method, target_message_id, chat_id, thread_id, reply_to_message_id, chunk_index, chunk_count, text, outcome, \
         telegram_message_id, error, started_at, finished_at, reconciled_outcome, reconciled_reason"
    };
}

#[async_trait]
impl Attempts for SqliteLedger {
    async fn begin_attempt(&self, attempt: &NewAttempt<'_>) -> LedgerResult<Result<AttemptId, Refusal>> {
        let op_id = AttemptId::generate();
        let sql = concat!(
            "INSERT INTO attempts (op_id, envelope_id, agent, request_id, purpose, chat_id, thread_id, \
             reply_to_message_id, chunk_index, chunk_count, text, outcome, started_at, method, target_message_id) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'in_flight', ?12, ?13, ?14 \
             WHERE ?5 = 'audit' OR NOT EXISTS (",
            refused_for_envelope!(),
            ")"
        );
        let decided = self.write_in_place(|db| {
            let recorded = execute_cached(
                db,
                sql,
                rusqlite::params![
                    op_id,
                    attempt.envelope_id,
                    attempt.agent,
                    attempt.request_id,
                    attempt.purpose.as_str(),
                    attempt.chat_id,
                    attempt.thread_id,
                    attempt.reply_to_message_id,
                    attempt.chunk_index as i64,
                    attempt.chunk_count as i64,
                    attempt.text,
                    now(),
                    attempt.method.as_str(),
                    attempt.target_message_id,
                ],
            )?;
            if recorded == 1 {
                return Ok(Some(Ok(op_id.clone())));
            }
            // Refused: `admit` explains why, in the same transaction. The two rules are kept
            // in step by a test; should they disagree (`None`), nothing is sent.
            Ok(super::tasks::admission_in(db, attempt.envelope_id)?.err().map(Err))
        });
        let decided = decided.await;
        self.writes.observe(LedgerWrite::Attempt, &decided);
        decided?.ok_or_else(|| {
            LedgerError::other(format!(
                "the admission of a reply to envelope {} disagrees with itself; nothing was sent",
                attempt.envelope_id
            ))
        })
    }

    async fn finish_attempt(
        &self,
        op_id: &AttemptId,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> LedgerResult<FinishedAttempt> {
        let (message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => (Some(*message_id), None),
            AttemptOutcome::NotSent { error } | AttemptOutcome::Unknown { error } => {
                (None, Some(error.as_str()))
            }
        };
        let state = outcome.state();
        let finished = self.write_in_place(|db| {
            let sql = "UPDATE attempts SET outcome = ?, telegram_message_id = ?, error = ?, finished_at = ? \
                       WHERE op_id = ? AND outcome = 'in_flight' \
                       RETURNING envelope_id, chunk_index, chunk_count, purpose, method";
            let finished: Option<(i64, i64, i64, String, AttemptMethod)> = query_row_cached(
                db,
                sql,
                rusqlite::params![state.as_str(), message_id, error, now(), op_id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, text_enum(row, "method")?)),
            )
            .optional()?;
            let Some((envelope_id, chunk_index, chunk_count, purpose, method)) = finished else {
                // No such attempt is the caller's mistake, as before this guard.
                let (settled, settled_message_id) = query_row_cached(
                    db,
                    "SELECT outcome, telegram_message_id FROM attempts WHERE op_id = ?",
                    [op_id],
                    |row| Ok((text_enum(row, "outcome")?, row.get(1)?)),
                )?;
                return Ok(FinishedAttempt::found_settled(settled, settled_message_id, outcome));
            };
            // An audit copy, a reaction or an edit answers nothing: only its own row changes.
            if purpose == AttemptPurpose::Audit.as_str() || !method.is_reply_part() {
                return Ok(FinishedAttempt::Recorded);
            }
            let answerable = [EnvelopeState::Pending, EnvelopeState::Acked];
            match outcome {
                AttemptOutcome::Sent { message_id } if chunk_index + 1 == chunk_count => {
                    let reason = format!("replied ({op_id}, Telegram message {message_id})");
                    transition_in(db, envelope_id, &answerable, EnvelopeState::Acked, actor, Some(&reason))?;
                    // The answers of handoffs made for this conversation are answered too.
                    let reason = format!("answered with the reply {op_id} to its conversation");
                    super::handoffs::settle_answers_for(db, envelope_id, actor, &reason)?;
                }
                AttemptOutcome::Unknown { error } => {
                    let reason = format!("send outcome unknown ({op_id}): {error}");
                    transition_in(
                        db,
                        envelope_id,
                        &[EnvelopeState::Pending],
                        EnvelopeState::Unresolved,
                        actor,
                        Some(&reason),
                    )?;
                }
                _ => {}
            }
            Ok(FinishedAttempt::Recorded)
        })
        .await;
        self.writes.observe(LedgerWrite::Attempt, &finished);
        finished
    }

    async fn in_flight_attempts(&self) -> LedgerResult<Vec<(AttemptId, TraceId)>> {
        self.read_off_thread(|db| {
            query_all_cached(
                db,
                "SELECT a.op_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
                 WHERE a.outcome = 'in_flight' ORDER BY a.id",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
        })
        .await
    }

    async fn reply_request_seen(&self, agent: &str, request_id: &str) -> LedgerResult<bool> {
        self.read_in_place(|db| {
            query_row_cached(
                db,
                "SELECT EXISTS (SELECT 1 FROM attempts WHERE agent = ?1 AND request_id = ?2) \
                 OR EXISTS (SELECT 1 FROM handoffs WHERE to_agent = ?1 AND answer_request_id = ?2)",
                [agent, request_id],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn recorded_reply(&self, agent: &str, request_id: &str) -> LedgerResult<Option<RecordedReply>> {
        self.read_in_place(|db| {
            let envelope: Option<(i64, TraceId)> = query_row_cached(
                db,
                concat!(
                    "SELECT a.envelope_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
                     WHERE a.agent = ? AND a.request_id = ? AND a.",
                    reply_part_method!(),
                    " LIMIT 1"
                ),
                [agent, request_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
            let Some((envelope_id, trace_id)) = envelope else { return Ok(None) };
            // The envelope's earlier requests too: the parts a resumed request carried count.
            let history = reply_history(db, envelope_id)?;
            Ok(RecordedReply::from_attempts(envelope_id, trace_id, &standing_attempts(&history, request_id)))
        })
        .await
    }

    async fn last_reply_for(&self, envelope_id: i64) -> LedgerResult<Option<(String, Vec<StoredAttempt>)>> {
        self.read_in_place(|db| {
            let history = reply_history(db, envelope_id)?;
            let Some(request_id) = history.last().and_then(|attempt| attempt.request_id.clone()) else {
                return Ok(None);
            };
            let standing = standing_attempts(&history, &request_id);
            Ok(Some((request_id, standing)))
        })
        .await
    }

    async fn awaiting_reconciliation(&self, envelope_ids: &[i64]) -> LedgerResult<Vec<i64>> {
        if envelope_ids.is_empty() {
            return Ok(Vec::new());
        }
        // The ids as a JSON array, so the statement stays one text, prepared once.
        let ids = serde_json::to_string(envelope_ids).unwrap_or_else(|_| "[]".into());
        self.read_in_place(|db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT DISTINCT envelope_id FROM attempts WHERE outcome IN ('unknown', 'in_flight') \
                     AND reconciled_outcome IS NULL AND purpose = 'reply' AND ",
                    reply_part_method!(),
                    " AND envelope_id IN (SELECT value FROM json_each(?))"
                ),
                [&ids],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn bot_message(
        &self,
        chat_id: i64,
        message_id: i32,
    ) -> LedgerResult<Option<(String, AttemptMethod)>> {
        let sql = concat!(
            "SELECT agent, method FROM attempts WHERE chat_id = ? AND telegram_message_id = ? AND outcome = 'sent' \
             AND ",
            reply_part_method!(),
            " ORDER BY id DESC LIMIT 1"
        );
        self.read_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![chat_id, message_id], |row| {
                Ok((row.get(0)?, text_enum(row, "method")?))
            })
            .optional()
        })
        .await
    }

    async fn action_attempt(&self, agent: &str, request_id: &str) -> LedgerResult<Option<StoredAttempt>> {
        let sql = concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts WHERE agent = ? AND request_id = ? AND NOT ",
            reply_part_method!(),
            " ORDER BY id DESC LIMIT 1"
        );
        self.read_in_place(|db| {
            query_row_cached(db, sql, [agent, request_id], StoredAttempt::from_row).optional()
        })
        .await
    }

    async fn attempts_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredAttempt>> {
        let sql = concat!("SELECT ", attempt_columns!(), " FROM attempts WHERE envelope_id = ? ORDER BY id");
        self.read_in_place(|db| query_all_cached(db, sql, [envelope_id], StoredAttempt::from_row)).await
    }
}

/// The reply-part attempts of every `reply` request made for an envelope, oldest first.
fn reply_history(db: &rusqlite::Connection, envelope_id: i64) -> rusqlite::Result<Vec<StoredAttempt>> {
    query_all_cached(
        db,
        concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts WHERE envelope_id = ? AND request_id IS NOT NULL AND ",
            reply_part_method!(),
            " ORDER BY id"
        ),
        [envelope_id],
        StoredAttempt::from_row,
    )
}
