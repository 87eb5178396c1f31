//! What a user's quote or reaction refers to, and reactions themselves.
//!
//! A Telegram message is named by its chat and message id. Such a message is a user's
//! message switchboard recorded (an envelope of that chat), or a message the bot sent
//! answering an envelope (an attempt of that chat that Telegram confirmed with that id).
//! Intake looks both up in the transaction that records a batch, so a quote or a reaction
//! of the same batch finds what came before it, and what it finds is stored with it.
//!
//! A reaction on a message the bot sent for an agent is a notice for that agent about the
//! answered envelope: stored `owed`, handed to the agent's session as it connects or while
//! it is connected, then `delivered`. It is never an envelope, so it never waits for an
//! answer, is never listed by `pending` and is never a reply's candidate.

use async_trait::async_trait;
use chrono::SecondsFormat;
use rusqlite::OptionalExtension;

use super::columns::timestamp_column;
use super::in_place::{execute_cached, query_all_cached, query_row_cached};
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{ReactionAudit, RoutedReaction, StoredReaction};
use crate::ids::{AgentName, TraceId};
use crate::ledger::prelude::*;
use crate::ledger::reaction_rows::ReactionRow;

impl StoredReaction {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            agent: row.get("agent")?,
            trace_id: row.get("trace_id")?,
            chat_id: row.get("chat_id")?,
            message_id: row.get("message_id")?,
            user_id: row.get("user_id")?,
            user: row.get("user")?,
            emoji: row.get("emoji")?,
            reacted_at: timestamp_column(row, "reacted_at")?,
        })
    }
}

const REACTION_COLUMNS: &str = "id, agent, trace_id, chat_id, message_id, user_id, user, emoji, reacted_at";

/// The envelope a message the bot sent in `chat_id` answered, and the agent it answered
/// for: the first reply attempt Telegram confirmed with that message id.
pub(super) fn answered_by_bot_message(
    db: &rusqlite::Connection,
    chat_id: i64,
    message_id: i64,
) -> rusqlite::Result<Option<(TraceId, String)>> {
    query_row_cached(
        db,
        "SELECT e.trace_id, a.agent FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
         WHERE a.chat_id = ? AND a.telegram_message_id = ? AND a.purpose = 'reply' ORDER BY a.id LIMIT 1",
        rusqlite::params![chat_id, message_id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
}

/// The trace id of what a quoted message stands for: the user's message as first
/// recorded (not a later edit of it), else the envelope the bot's message answered.
pub(super) fn quoted_trace_id(
    db: &rusqlite::Connection,
    chat_id: i64,
    message_id: i64,
) -> rusqlite::Result<Option<TraceId>> {
    let recorded = query_row_cached(
        db,
        "SELECT trace_id FROM envelopes WHERE chat_id = ? AND message_id = ? AND update_id IS NOT NULL \
         AND state <> 'undecodable' ORDER BY id LIMIT 1",
        rusqlite::params![chat_id, message_id],
        |row| row.get(0),
    )
    .optional()?;
    match recorded {
        Some(trace_id) => Ok(Some(trace_id)),
        None => Ok(answered_by_bot_message(db, chat_id, message_id)?.map(|(trace_id, _)| trace_id)),
    }
}

/// Stores the batch's reactions, inside intake's transaction; returns those newly owed
/// to an agent. A re-polled reaction is skipped.
pub(super) fn record_reactions(
    db: &rusqlite::Connection,
    reactions: &[RoutedReaction],
    received_at: &str,
) -> rusqlite::Result<Vec<StoredReaction>> {
    let mut owed = Vec::new();
    for routed in reactions {
        let r = &routed.reaction;
        let answered = answered_by_bot_message(db, r.chat_id, i64::from(r.message_id))?;
        let row = ReactionRow::of(routed, answered);
        let stored = query_row_cached(
            db,
            "INSERT INTO reactions (update_id, update_digest, chat_id, message_id, user_id, user, emoji, \
             reacted_at, received_at, agent, trace_id, state, note) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (update_id, update_digest) DO NOTHING RETURNING id",
            rusqlite::params![
                r.update_id,
                routed.update_digest,
                r.chat_id,
                r.message_id,
                r.user_id,
                r.user,
                row.emoji,
                r.date.to_rfc3339_opts(SecondsFormat::Secs, true),
                received_at,
                row.agent(),
                row.trace_id(),
                row.state(),
                row.note,
            ],
            |stored| stored.get::<_, i64>(0),
        )
        .optional()?;
        owed.extend(stored.and_then(|id| row.owed(id)));
    }
    Ok(owed)
}

#[async_trait]
impl Reactions for SqliteLedger {
    async fn owed_reactions(&self, agent: &AgentName) -> LedgerResult<Vec<StoredReaction>> {
        let sql = format!(
            "SELECT {REACTION_COLUMNS} FROM reactions WHERE agent = ? AND state = 'owed' ORDER BY id"
        );
        self.read_in_place(|db| query_all_cached(db, &sql, [agent.as_str()], StoredReaction::from_row)).await
    }

    async fn reactions_delivered(&self, ids: &[i64]) -> LedgerResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.write_in_place(|db| {
            let at = now();
            for id in ids {
                execute_cached(
                    db,
                    "UPDATE reactions SET state = 'delivered', delivered_at = ? WHERE id = ? AND state = 'owed'",
                    rusqlite::params![at, id],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn reactions_recorded(&self) -> LedgerResult<Vec<ReactionAudit>> {
        self.read_in_place(|db| {
            query_all_cached(
                db,
                "SELECT state, agent, trace_id, emoji, note FROM reactions ORDER BY id",
                [],
                |row| {
                    Ok(ReactionAudit {
                        state: row.get("state")?,
                        agent: row.get("agent")?,
                        trace_id: row.get("trace_id")?,
                        emoji: row.get("emoji")?,
                        note: row.get("note")?,
                    })
                },
            )
        })
        .await
    }
}
