//! The poller's side: a batch of envelopes and the offset that confirms it, committed
//! together; and which ledger errors intake waits out instead of stopping.

use std::fmt;

use super::tasks::{self, TaskEffect};
use super::{RoutedEnvelope, StoredEnvelope};
use chrono::SecondsFormat;
use sqlx::{Connection, SqliteConnection};

use super::{Ledger, now};
use crate::ids::{AgentName, RouteName};

/// SQLite's primary result codes (the low byte of an extended code) that mean "not now"
/// rather than "wrong": https://www.sqlite.org/rescode.html
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_FULL: i64 = 13;

/// A ledger error that passes by itself: intake waits it out (offset not moved, nothing
/// recorded) instead of stopping the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerCongestion {
    /// Another connection holds the write lock past the busy timeout (`SQLITE_BUSY`,
    /// `SQLITE_LOCKED`), or every pooled connection is waiting for it.
    Busy,
    /// The disk (or SQLite's page limit) is full (`SQLITE_FULL`).
    DiskFull,
}

impl LedgerCongestion {
    /// Whether `error` is one intake waits out; any other ledger error is fatal.
    pub fn of(error: &sqlx::Error) -> Option<Self> {
        match error {
            sqlx::Error::Database(db) => {
                let code: i64 = db.code()?.parse().ok()?;
                match code & 0xff {
                    SQLITE_BUSY | SQLITE_LOCKED => Some(Self::Busy),
                    SQLITE_FULL => Some(Self::DiskFull),
                    _ => None,
                }
            }
            sqlx::Error::PoolTimedOut => Some(Self::Busy),
            _ => None,
        }
    }
}

impl fmt::Display for LedgerCongestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Busy => "the ledger is locked by another connection",
            Self::DiskFull => "the disk holding the ledger is full",
        })
    }
}

impl Ledger {
    pub async fn next_offset(&self, bot_id: i64) -> sqlx::Result<Option<i64>> {
        sqlx::query_scalar("SELECT next_offset FROM poller_offsets WHERE bot_id = ?")
            .bind(bot_id)
            .fetch_optional(&self.pool)
            .await
    }

    /// Stores a batch of rows and advances the offset in one transaction: either both
    /// happen or neither does, so a crash can neither lose nor duplicate an update.
    /// Returns the rows that were new: an update already stored with the same id and the
    /// same digest (a re-poll) is skipped; the same id with other content (Telegram reuses
    /// ids after a week of silence) is a new row.
    pub async fn record_batch<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
    ) -> sqlx::Result<Vec<&'a RoutedEnvelope>> {
        Ok(self.record_batch_handing_over(bot_id, next_offset, batch, &[], None).await?.inserted)
    }

    /// [`Self::record_batch`], and in the same transaction every `queued` envelope of the
    /// agents in `claim_for` (the batch's and any older ones) moves to `pending`, handed
    /// to their live sessions: those rows are returned, oldest first, for the caller to
    /// pass on. The ledger says `pending` before any session sees them, and a crash
    /// leaves them `pending`, so they are redelivered.
    pub async fn record_batch_handing_over<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> sqlx::Result<RecordedBatch<'a>> {
        let mut connection = self.pool.acquire().await?;
        let recorded =
            insert_batch(&mut connection, bot_id, next_offset, batch, claim_for, bot_username).await;
        let (new_rows, mut claimed, task_effects) = match recorded {
            Ok(stored) => stored,
            Err(e) => {
                // SQLite rolls a transaction back by itself on some errors (a full disk,
                // for one); sqlx's own ROLLBACK then fails, and the connection would go
                // back to the pool believing it is still inside a transaction, refusing
                // every later BEGIN. Close it instead: the pool opens a fresh one.
                connection.close_on_drop();
                return Err(e);
            }
        };
        let inserted = batch.iter().zip(new_rows).filter_map(|(routed, new)| new.then_some(routed)).collect();
        // RETURNING gives no order guarantee.
        claimed.sort_by_key(|row| row.id);
        Ok(RecordedBatch { inserted, claimed, task_effects })
    }

    /// The raw text of an undecodable update, by its envelope's trace id.
    pub async fn raw_update(&self, trace_id: &str) -> sqlx::Result<Option<String>> {
        sqlx::query_scalar("SELECT raw_update FROM envelopes WHERE trace_id = ?")
            .bind(trace_id)
            .fetch_optional(&self.pool)
            .await
            .map(Option::flatten)
    }
}

/// What [`Ledger::record_batch_handing_over`] committed.
#[derive(Debug)]
pub struct RecordedBatch<'a> {
    /// The rows that were new.
    pub inserted: Vec<&'a RoutedEnvelope>,
    /// The envelopes handed to live sessions, oldest first.
    pub claimed: Vec<StoredEnvelope>,
    /// What the batch's task changes ask of the switchboard now that they are recorded:
    /// the bot's acknowledgements, notices, wake-ups (DESIGN.md §11).
    pub task_effects: Vec<TaskEffect>,
}

/// The transaction of [`Ledger::record_batch_handing_over`]; returns which rows of the
/// batch were new, the rows claimed for `claim_for`, and what the task changes ask for.
async fn insert_batch(
    connection: &mut SqliteConnection,
    bot_id: i64,
    next_offset: i64,
    batch: &[RoutedEnvelope],
    claim_for: &[&AgentName],
    bot_username: Option<&str>,
) -> sqlx::Result<(Vec<bool>, Vec<StoredEnvelope>, Vec<TaskEffect>)> {
    // The write lock up front, as `Ledger::write_transaction` takes it.
    let mut tx = connection.begin_with("BEGIN IMMEDIATE").await?;
    let received_at = now();
    // One multi-row statement per batch: each statement is a round trip to sqlx's SQLite
    // worker thread, and those hand-offs, not SQLite, bound inbound throughput.
    let mut stored_trace_ids = Vec::new();
    let mut first_id = 0;
    // Plain messages are stored with their task (DESIGN.md §11), read once per conversation.
    let tasks = tasks::plan_batch(&mut tx, batch, bot_username).await?;
    if !batch.is_empty() {
        let mut insert = sqlx::QueryBuilder::new(
            "INSERT INTO envelopes (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, \
             chat_title, message_id, sender_id, sender_username, sender_name, text, attachments, content, \
             sent_at, received_at, route, agent, state, state_changed_at, note, raw_update, task_id, revision) ",
        );
        insert.push_values(batch.iter().zip(&tasks.tags), |mut row, (routed, task)| {
            let e = &routed.envelope;
            let attachments = serde_json::to_string(&e.attachments).unwrap_or_else(|_| "[]".into());
            row.push_bind(e.trace_id.as_str())
                .push_bind(e.update_id)
                .push_bind(routed.update_digest.as_str())
                .push_bind(e.kind)
                .push_bind(e.channel.chat_id)
                .push_bind(e.channel.thread_id)
                .push_bind(e.chat_type)
                .push_bind(e.chat_title.as_deref())
                .push_bind(e.message_id)
                .push_bind(e.sender.id)
                .push_bind(e.sender.username.as_deref())
                .push_bind(e.sender.name.as_str())
                .push_bind(e.text.as_deref())
                .push_bind(attachments)
                .push_bind(e.content())
                .push_bind(e.sent_at.to_rfc3339_opts(SecondsFormat::Secs, true))
                .push_bind(received_at.as_str())
                .push_bind(routed.route.as_ref().map(RouteName::as_str))
                .push_bind(routed.agent.as_ref().map(AgentName::as_str))
                .push_bind(routed.state)
                .push_bind(received_at.as_str())
                .push_bind(routed.note.as_deref())
                .push_bind(routed.raw_update.as_deref())
                .push_bind(task.as_ref().map(|(task_id, _)| task_id.clone()))
                .push_bind(task.as_ref().map(|(_, revision)| *revision));
        });
        // A re-polled update is already stored: skip it.
        insert.push(" ON CONFLICT (update_id, update_digest) DO NOTHING");
        let inserted = insert.build().execute(&mut *tx).await?;
        let stored = inserted.rows_affected();
        // One statement inserts its rows with consecutive ids.
        first_id = inserted.last_insert_rowid() - i64::try_from(batch.len()).unwrap_or(i64::MAX) + 1;
        stored_trace_ids = if usize::try_from(stored) == Ok(batch.len()) {
            // Every row is new (nearly always): no need to hand each trace id back from
            // SQLite's thread, as `RETURNING` would.
            batch.iter().map(|routed| routed.envelope.trace_id.to_string()).collect()
        } else {
            // A re-poll: the new rows are those whose fresh trace ids were stored.
            let mut query = sqlx::QueryBuilder::new("SELECT trace_id FROM envelopes WHERE trace_id IN (");
            let mut ids = query.separated(", ");
            for routed in batch {
                ids.push_bind(routed.envelope.trace_id.as_str());
            }
            query.push(")");
            query.build_query_scalar::<String>().fetch_all(&mut *tx).await?
        };
    }
    // The tasks the batch starts, then its commands and edits in arrival order, in this
    // transaction: a change and the messages around it are serialised.
    let new_rows: Vec<bool> = batch
        .iter()
        .map(|routed| stored_trace_ids.iter().any(|stored| stored == routed.envelope.trace_id.as_str()))
        .collect();
    let task_effects =
        tasks::record_batch_tasks(&mut tx, batch, &tasks, &new_rows, first_id, bot_username).await?;
    sqlx::query(
        "INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES (?, ?, ?) \
         ON CONFLICT (bot_id) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at",
    )
    .bind(bot_id)
    .bind(next_offset)
    .bind(&received_at)
    .execute(&mut *tx)
    .await?;
    let mut claimed = Vec::new();
    for agent in claim_for {
        let sql = concat!(
            "UPDATE envelopes SET state = 'pending', deliveries = deliveries + 1, state_changed_at = ? \
             WHERE agent = ? AND state = 'queued' RETURNING ",
            envelope_columns!()
        );
        let rows: Vec<StoredEnvelope> =
            sqlx::query_as(sql).bind(&received_at).bind(agent.as_str()).fetch_all(&mut *tx).await?;
        claimed.extend(rows);
    }
    tx.commit().await?;
    Ok((new_rows, claimed, task_effects))
}
