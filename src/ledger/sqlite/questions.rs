//! The operator's questions (issue 23): each unresolved send asked once, with buttons, in
//! the `[operator]` route's chat. An answer reconciles the envelope exactly as
//! `switchboard ledger reconcile` does, recording who answered and when.

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::columns::{optional_timestamp, timestamp_column};
use super::in_place::{execute_cached, query_all_cached, query_row_cached, text_enum};
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{AttemptOutcome, EnvelopeState, QuestionState, StoredQuestion};
use crate::ledger::columns::question_columns;
use crate::ledger::prelude::*;

impl StoredQuestion {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            op_id: row.get("op_id")?,
            envelope_id: row.get("envelope_id")?,
            trace_id: row.get("trace_id")?,
            sent_chat_id: row.get("sent_chat_id")?,
            sent_at: timestamp_column(row, "sent_at")?,
            sent_text: row.get("sent_text")?,
            state: text_enum(row, "state")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            prompt_send: text_enum(row, "prompt_send")?,
            prompt_message_id: row.get("prompt_message_id")?,
            prompt_settled: row.get("prompt_settled")?,
            answered_by_name: row.get("answered_by_name")?,
            answered_at: optional_timestamp(row, "answered_at")?,
        })
    }
}

fn question_in(db: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<StoredQuestion>> {
    query_row_cached(
        db,
        concat!("SELECT ", question_columns!(), " FROM operator_questions WHERE id = ?"),
        [id],
        StoredQuestion::from_row,
    )
    .optional()
}

#[async_trait]
impl Questions for SqliteLedger {
    async fn record_new_questions(
        &self,
        chat_id: i64,
        thread_id: Option<i32>,
        new_id: &(dyn Fn() -> String + Send + Sync),
    ) -> LedgerResult<Vec<StoredQuestion>> {
        let at = now();
        self.write_in_place(|db| {
            let unasked = query_all_cached(
                db,
                "SELECT a.op_id, a.envelope_id, e.trace_id, a.chat_id, a.started_at, a.text \
                 FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
                 WHERE a.outcome = 'unknown' AND a.reconciled_outcome IS NULL AND e.state = 'unresolved' \
                 AND NOT EXISTS (SELECT 1 FROM operator_questions q WHERE q.op_id = a.op_id) \
                 AND NOT EXISTS (SELECT 1 FROM operator_questions q WHERE q.envelope_id = a.envelope_id \
                                 AND q.state = 'open') \
                 ORDER BY a.id",
                [],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, i64>(3)?,
                        row.get::<_, String>(4)?,
                        row.get::<_, String>(5)?,
                    ))
                },
            )?;
            let mut asked: Vec<StoredQuestion> = Vec::new();
            for (op_id, envelope_id, trace_id, sent_chat_id, sent_at, text) in unasked {
                if asked.iter().any(|question| question.envelope_id == envelope_id) {
                    continue;
                }
                let id = new_id();
                execute_cached(
                    db,
                    "INSERT INTO operator_questions (id, op_id, envelope_id, trace_id, sent_chat_id, sent_at, \
                     sent_text, asked_at, state, chat_id, thread_id, prompt_send) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'open', ?, ?, 'in_flight')",
                    rusqlite::params![
                        id,
                        op_id,
                        envelope_id,
                        trace_id,
                        sent_chat_id,
                        sent_at,
                        text,
                        at,
                        chat_id,
                        thread_id
                    ],
                )?;
                asked.extend(question_in(db, &id)?);
            }
            Ok(asked)
        })
        .await
    }

    async fn finish_question_send(&self, id: &str, outcome: &AttemptOutcome) -> LedgerResult<()> {
        let (send, message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => ("sent", Some(*message_id), None),
            AttemptOutcome::NotSent { error } => ("not_sent", None, Some(error.clone())),
            AttemptOutcome::Unknown { error } => ("unknown", None, Some(error.clone())),
        };
        self.execute_in_place(
            "UPDATE operator_questions SET prompt_send = ?, prompt_message_id = ?, prompt_error = ? WHERE id = ?",
            (send, message_id, error, id.to_owned()),
        )
        .await
        .map(drop)
    }

    async fn recover_question_sends(&self) -> LedgerResult<usize> {
        self.execute_in_place(
            "UPDATE operator_questions SET prompt_send = 'unknown', \
             prompt_error = 'the daemon stopped during the send' WHERE prompt_send = 'in_flight'",
            [],
        )
        .await
    }

    async fn question(&self, id: &str) -> LedgerResult<Option<StoredQuestion>> {
        self.read_in_place(|db| question_in(db, id)).await
    }

    async fn record_answer(
        &self,
        id: &str,
        state: QuestionState,
        by: i64,
        by_name: &str,
        at: &str,
    ) -> LedgerResult<()> {
        self.execute_in_place(
            "UPDATE operator_questions SET state = ?, answered_by = ?, answered_by_name = ?, answered_at = ? \
             WHERE id = ? AND state = 'open'",
            (state.as_str(), by, by_name.to_owned(), at.to_owned(), id.to_owned()),
        )
        .await?;
        Ok(())
    }

    async fn settle_answered_elsewhere(&self) -> LedgerResult<usize> {
        let unresolved = EnvelopeState::Unresolved.as_str();
        self.write_in_place(|db| {
            execute_cached(
                db,
                "UPDATE operator_questions SET state = 'settled' WHERE state = 'open' AND NOT EXISTS \
                 (SELECT 1 FROM envelopes e WHERE e.id = operator_questions.envelope_id AND e.state = ?)",
                [unresolved],
            )
        })
        .await
    }

    async fn take_unsent_questions(&self) -> LedgerResult<Vec<StoredQuestion>> {
        self.write_in_place(|db| {
            query_all_cached(
                db,
                concat!(
                    "UPDATE operator_questions SET prompt_send = 'in_flight', prompt_error = NULL \
                     WHERE state = 'open' AND prompt_send = 'not_sent' RETURNING ",
                    question_columns!()
                ),
                [],
                StoredQuestion::from_row,
            )
        })
        .await
    }

    async fn unsettled_questions(&self) -> LedgerResult<Vec<StoredQuestion>> {
        self.read_in_place(|db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT ",
                    question_columns!(),
                    " FROM operator_questions WHERE prompt_settled = 0 AND state <> 'open' \
                     AND prompt_send <> 'in_flight' ORDER BY asked_at"
                ),
                [],
                StoredQuestion::from_row,
            )
        })
        .await
    }

    async fn settle_question_prompt(&self, id: &str) -> LedgerResult<()> {
        self.execute_in_place("UPDATE operator_questions SET prompt_settled = 1 WHERE id = ?", [id])
            .await
            .map(drop)
    }
}
