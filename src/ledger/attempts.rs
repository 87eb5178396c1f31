//! Send attempts (DESIGN.md §4): recorded before the request, classified after, and
//! settling their envelope in the same transaction.

use super::envelopes::transition_in;
use crate::ledger::EnvelopeState;
use sqlx::FromRow;

use super::{Ledger, now};
use crate::ids::TraceId;

#[derive(Debug, Clone)]
pub struct NewAttempt<'a> {
    pub envelope_id: i64,
    pub agent: &'a str,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub reply_to_message_id: Option<i32>,
    pub chunk_index: usize,
    pub chunk_count: usize,
    pub text: &'a str,
}

/// How an attempt ended, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    Sent { message_id: i32 },
    NotSent { error: String },
    Unknown { error: String },
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct StoredAttempt {
    pub op_id: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub chunk_index: i64,
    pub chunk_count: i64,
    pub text: String,
    pub outcome: String,
    pub telegram_message_id: Option<i64>,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub reconciled_outcome: Option<String>,
    pub reconciled_reason: Option<String>,
}

impl Ledger {
    /// Records an attempt before its request is made; returns its operation id.
    pub async fn begin_attempt(&self, attempt: &NewAttempt<'_>) -> sqlx::Result<String> {
        let op_id = format!("op_{}", &TraceId::generate().as_str()[4..]);
        sqlx::query(
            "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, thread_id, reply_to_message_id, \
             chunk_index, chunk_count, text, outcome, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'in_flight', ?)",
        )
        .bind(&op_id)
        .bind(attempt.envelope_id)
        .bind(attempt.agent)
        .bind(attempt.chat_id)
        .bind(attempt.thread_id)
        .bind(attempt.reply_to_message_id)
        .bind(attempt.chunk_index as i64)
        .bind(attempt.chunk_count as i64)
        .bind(attempt.text)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(op_id)
    }

    /// Records what an attempt came to and, in the same transaction, what that proves
    /// about its envelope: the last part of a reply confirmed sent answers it (`acked`);
    /// an unknown outcome makes it `unresolved`. A crash can therefore never leave a
    /// confirmed or unknown send beside an envelope that still looks unanswered.
    pub async fn finish_attempt(
        &self,
        op_id: &str,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> sqlx::Result<()> {
        let (label, message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => ("sent", Some(*message_id), None),
            AttemptOutcome::NotSent { error } => ("not_sent", None, Some(error.as_str())),
            AttemptOutcome::Unknown { error } => ("unknown", None, Some(error.as_str())),
        };
        let mut tx = self.write_transaction().await?;
        let (envelope_id, chunk_index, chunk_count): (i64, i64, i64) = sqlx::query_as(
            "UPDATE attempts SET outcome = ?, telegram_message_id = ?, error = ?, finished_at = ? WHERE op_id = ? \
             RETURNING envelope_id, chunk_index, chunk_count",
        )
        .bind(label)
        .bind(message_id)
        .bind(error)
        .bind(now())
        .bind(op_id)
        .fetch_one(&mut *tx)
        .await?;
        let answerable = [EnvelopeState::Pending, EnvelopeState::Acked];
        match outcome {
            AttemptOutcome::Sent { message_id } if chunk_index + 1 == chunk_count => {
                let reason = format!("replied ({op_id}, Telegram message {message_id})");
                transition_in(&mut tx, envelope_id, &answerable, EnvelopeState::Acked, actor, Some(&reason))
                    .await?;
            }
            AttemptOutcome::Unknown { error } => {
                let reason = format!("send outcome unknown ({op_id}): {error}");
                transition_in(
                    &mut tx,
                    envelope_id,
                    &answerable,
                    EnvelopeState::Unresolved,
                    actor,
                    Some(&reason),
                )
                .await?;
            }
            _ => {}
        }
        tx.commit().await
    }

    /// At start-up: attempts left `in_flight` by a daemon that died mid-send may have
    /// reached Telegram. They become `unknown` and their envelopes `unresolved`; an
    /// operator reconciles them. Returns the trace ids affected.
    pub async fn recover_in_flight(&self) -> sqlx::Result<Vec<String>> {
        let stuck: Vec<(String, String)> = sqlx::query_as(
            "SELECT a.op_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
             WHERE a.outcome = 'in_flight' ORDER BY a.id",
        )
        .fetch_all(&self.pool)
        .await?;
        let error = "the daemon stopped while this send was in flight".to_owned();
        for (op_id, _) in &stuck {
            self.finish_attempt(op_id, &AttemptOutcome::Unknown { error: error.clone() }, "daemon").await?;
        }
        Ok(stuck.into_iter().map(|(_, trace_id)| trace_id).collect())
    }
}
