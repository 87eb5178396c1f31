//! What a user's quote or reaction refers to, on PostgreSQL, looked up inside intake's
//! transaction as on SQLite (`sqlite/reactions.rs`, whose documentation says what these
//! mean): a quote or a reaction of the same batch finds what came before it. Intake stores
//! reactions; [`Reactions`] hands them over.
//!
//! **Races.** A reaction is handed to the agent's one session (one per agent across
//! replicas, DESIGN §16); marking it delivered is a conditional update (`state = 'owed'`),
//! so a second marking changes nothing.

use async_trait::async_trait;
use sqlx::PgConnection;

use super::PgLedger;
use super::rows::reaction_columns;
use crate::domain::{ReactionAudit, RoutedReaction, StoredReaction};
use crate::ids::{AgentName, TraceId};
use crate::ledger::prelude::*;
use crate::ledger::reaction_rows::ReactionRow;
use crate::ledger::{LedgerError, LedgerResult};

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

/// Stores the batch's reactions, inside intake's transaction; returns those newly owed
/// to an agent, in the batch's order. A re-polled reaction is skipped. However many
/// reactions a batch holds, they cost two statements: what each is on, then the rows.
pub(super) async fn record_reactions(
    tx: &mut PgConnection,
    reactions: &[RoutedReaction],
) -> LedgerResult<Vec<StoredReaction>> {
    if reactions.is_empty() {
        return Ok(Vec::new());
    }
    let answered = answered_by_bot_messages(tx, reactions).await?;
    let rows: Vec<ReactionRow<'_>> =
        reactions.iter().zip(answered).map(|(routed, answered)| ReactionRow::of(routed, answered)).collect();
    let ids = insert_reactions(tx, &rows).await?;
    Ok(rows.into_iter().zip(ids).filter_map(|(row, id)| row.owed(id?)).collect())
}

/// For each reaction, the envelope the bot's message it is on answered, and the agent it
/// answered for: the first reply attempt Telegram confirmed with that message id. One
/// reaction, the usual case, has a statement of its own (see `intake::quoted_trace_ids`).
async fn answered_by_bot_messages(
    tx: &mut PgConnection,
    reactions: &[RoutedReaction],
) -> LedgerResult<Vec<Option<(TraceId, String)>>> {
    if let [routed] = reactions {
        let r = &routed.reaction;
        let answered = sqlx::query_as(bot_answer!("e.trace_id, a.agent", "$1", "$2"))
            .bind(r.chat_id)
            .bind(i64::from(r.message_id))
            .fetch_optional(&mut *tx)
            .await?;
        return Ok(vec![answered]);
    }
    let chat_ids: Vec<i64> = reactions.iter().map(|routed| routed.reaction.chat_id).collect();
    let message_ids: Vec<i64> =
        reactions.iter().map(|routed| i64::from(routed.reaction.message_id)).collect();
    let found: Vec<(Option<TraceId>, Option<String>)> = sqlx::query_as(concat!(
        "SELECT b.trace_id, b.agent FROM UNNEST($1::bigint[], $2::bigint[]) WITH ORDINALITY \
         AS q (chat_id, message_id, position) LEFT JOIN LATERAL (",
        bot_answer!("e.trace_id, a.agent", "q.chat_id", "q.message_id"),
        ") b ON true ORDER BY q.position"
    ))
    .bind(chat_ids)
    .bind(message_ids)
    .fetch_all(&mut *tx)
    .await?;
    if found.len() != reactions.len() {
        return Err(LedgerError::other(format!(
            "{} reactions looked up, {} found",
            reactions.len(),
            found.len()
        )));
    }
    Ok(found.into_iter().map(|(trace_id, agent)| trace_id.zip(agent)).collect())
}

/// The rows in one statement, in the batch's order; returns each one's id, `None` for a
/// reaction already stored (a re-poll, a delivery repeated).
async fn insert_reactions(tx: &mut PgConnection, rows: &[ReactionRow<'_>]) -> LedgerResult<Vec<Option<i64>>> {
    let stored: Vec<(i64, i64, String)> = sqlx::query_as(
        "INSERT INTO reactions (update_id, update_digest, chat_id, message_id, user_id, \"user\", emoji, \
         reacted_at, received_at, agent, trace_id, state, note) \
         SELECT update_id, update_digest, chat_id, message_id, user_id, \"user\", emoji, reacted_at, now(), \
         agent, trace_id, state, note \
         FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], \
         $7::text[], $8::timestamptz[], $9::text[], $10::text[], $11::text[], $12::text[]) WITH ORDINALITY \
         AS r (update_id, update_digest, chat_id, message_id, user_id, \"user\", emoji, reacted_at, agent, \
         trace_id, state, note, position) \
         ORDER BY position \
         ON CONFLICT (update_id, update_digest) DO NOTHING \
         RETURNING id, update_id, update_digest",
    )
    .bind(rows.iter().map(|row| row.reaction().update_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.routed.update_digest.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.reaction().chat_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| i64::from(row.reaction().message_id)).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.reaction().user_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.reaction().user.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.emoji.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.reaction().date).collect::<Vec<_>>())
    .bind(rows.iter().map(ReactionRow::agent).collect::<Vec<_>>())
    .bind(rows.iter().map(ReactionRow::trace_id).collect::<Vec<_>>())
    .bind(rows.iter().map(ReactionRow::state).collect::<Vec<_>>())
    .bind(rows.iter().map(|row| row.note).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await?;
    // RETURNING gives no order: each id goes back to the first row of its update (a
    // second of the same update in one batch conflicts with the first, as a re-poll does).
    let mut ids = vec![None; rows.len()];
    for (id, update_id, digest) in stored {
        let first = rows
            .iter()
            .position(|row| row.reaction().update_id == update_id && row.routed.update_digest == digest);
        if let Some(first) = first {
            ids[first] = Some(id);
        }
    }
    Ok(ids)
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
