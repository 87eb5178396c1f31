//! What a user's quote or reaction refers to, on PostgreSQL, looked up inside intake's
//! transaction as on SQLite (`sqlite/reactions.rs`, whose documentation says what these
//! mean): a quote or a reaction of the same batch finds what came before it. Intake stores
//! reactions; [`Reactions`] hands them over.
//!
//! **Races.** A reaction is handed to the agent's one session (one per agent across
//! replicas, DESIGN §16); marking it delivered is a conditional update (`state = 'owed'`),
//! so a second marking changes nothing.

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::PgLedger;
use super::rows::reaction_columns;
use crate::domain::{ReactionAudit, RoutedReaction, StoredReaction};
use crate::ids::{AgentName, TraceId};
use crate::ledger::LedgerResult;
use crate::ledger::prelude::*;
use crate::telegram::envelope::Reaction;

/// A query of `$columns` of the first reply attempt `a` (with its envelope `e`) that
/// Telegram confirmed as the bot's message `$message` in `$chat` (SQL expressions): what
/// that message answered.
macro_rules! bot_answer {
    ($columns:literal, $chat:literal, $message:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM attempts a JOIN envelopes e ON e.id = a.envelope_id WHERE a.chat_id = ",
            $chat,
            " AND a.telegram_message_id = ",
            $message,
            " AND a.purpose = 'reply' ORDER BY a.id LIMIT 1"
        )
    };
}
pub(super) use bot_answer;

/// A query of the trace id of the user's message `$message` in `$chat` (SQL expressions)
/// as first recorded (not a later edit of it).
macro_rules! user_message {
    ($chat:literal, $message:literal) => {
        concat!(
            "SELECT trace_id FROM envelopes WHERE chat_id = ",
            $chat,
            " AND message_id = ",
            $message,
            " AND update_id IS NOT NULL AND state <> 'undecodable' ORDER BY id LIMIT 1"
        )
    };
}
pub(super) use user_message;

/// The envelope a message the bot sent in `chat_id` answered, and the agent it answered
/// for: the first reply attempt Telegram confirmed with that message id.
pub(super) async fn answered_by_bot_message(
    tx: &mut PgConnection,
    chat_id: i64,
    message_id: i64,
) -> LedgerResult<Option<(TraceId, String)>> {
    Ok(sqlx::query_as(bot_answer!("e.trace_id, a.agent", "$1", "$2"))
        .bind(chat_id)
        .bind(message_id)
        .fetch_optional(&mut *tx)
        .await?)
}

/// Why a reaction reaches no agent, or `None` when it is addressed to one.
fn ignored_because(reaction: &Reaction, answered: Option<&(TraceId, String)>) -> Option<&'static str> {
    if reaction.emoji.is_empty() {
        Some("reaction removed: none is set now")
    } else if answered.is_none() {
        Some("reaction on a message the bot did not send for an agent")
    } else {
        None
    }
}

/// Stores the batch's reactions, inside intake's transaction; returns those newly owed
/// to an agent. A re-polled reaction is skipped.
pub(super) async fn record_reactions(
    tx: &mut PgConnection,
    reactions: &[RoutedReaction],
) -> LedgerResult<Vec<StoredReaction>> {
    let mut owed = Vec::new();
    for routed in reactions {
        let r = &routed.reaction;
        let emoji = r.emoji.join(" ");
        let answered = answered_by_bot_message(tx, r.chat_id, i64::from(r.message_id)).await?;
        let note = ignored_because(r, answered.as_ref());
        let (agent, trace_id) = match (note, answered) {
            (None, Some((trace_id, agent))) => (Some(agent), Some(trace_id)),
            _ => (None, None),
        };
        let stored = sqlx::query(
            "INSERT INTO reactions (update_id, update_digest, chat_id, message_id, user_id, \"user\", emoji, \
             reacted_at, received_at, agent, trace_id, state, note) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $9, $10, $11, $12) \
             ON CONFLICT (update_id, update_digest) DO NOTHING RETURNING id",
        )
        .bind(r.update_id)
        .bind(&routed.update_digest)
        .bind(r.chat_id)
        .bind(i64::from(r.message_id))
        .bind(r.user_id)
        .bind(&r.user)
        .bind(&emoji)
        .bind(r.date)
        .bind(&agent)
        .bind(&trace_id)
        .bind(if note.is_some() { "ignored" } else { "owed" })
        .bind(note)
        .fetch_optional(&mut *tx)
        .await?;
        if let (Some(row), Some(agent), Some(trace_id)) = (stored, agent, trace_id) {
            owed.push(StoredReaction {
                id: row.try_get("id")?,
                agent,
                trace_id,
                chat_id: r.chat_id,
                message_id: i64::from(r.message_id),
                user_id: r.user_id,
                user: r.user.clone(),
                emoji,
                reacted_at: r.date,
            });
        }
    }
    Ok(owed)
}

#[async_trait]
impl Reactions for PgLedger {
    async fn owed_reactions(&self, agent: &AgentName) -> LedgerResult<Vec<StoredReaction>> {
        let sql = concat!(
            "SELECT ",
            reaction_columns!(),
            " FROM reactions WHERE agent = $1 AND state = 'owed' ORDER BY id"
        );
        Ok(sqlx::query_as(sql).bind(agent.as_str()).fetch_all(&self.pool).await?)
    }

    async fn reactions_delivered(&self, ids: &[i64]) -> LedgerResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        // One statement for them all: it is one transaction, as SQLite's loop is.
        sqlx::query("UPDATE reactions SET state = 'delivered', delivered_at = now() WHERE id = ANY($1) AND state = 'owed'")
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn reactions_recorded(&self) -> LedgerResult<Vec<ReactionAudit>> {
        Ok(sqlx::query_as("SELECT state, agent, trace_id, emoji, note FROM reactions ORDER BY id")
            .fetch_all(&self.pool)
            .await?)
    }
}
