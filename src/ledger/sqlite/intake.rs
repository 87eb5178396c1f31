//! Intake's side: a batch of envelopes and, when it was polled, the offset that confirms
//! it, committed together; and which ledger errors intake waits out instead of stopping.

use async_trait::async_trait;
use chrono::SecondsFormat;
use rusqlite::OptionalExtension;

use super::in_place::{execute_cached, query_all_cached, query_row_cached};
use super::reactions;
use super::tasks;
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{JoinedAlbum, RecordedBatch, RoutedEnvelope, RoutedReaction, StoredEnvelope, TaskEffect};
use crate::ids::{AgentName, RouteName, TraceId};
use crate::ledger::LedgerWrite;
use crate::ledger::album_rows;
use crate::ledger::columns::envelope_columns;
use crate::ledger::prelude::*;

#[async_trait]
impl Intake for SqliteLedger {
    async fn next_offset(&self, bot_id: i64) -> LedgerResult<Option<i64>> {
        self.read_in_place(|db| {
            query_row_cached(db, "SELECT next_offset FROM poller_offsets WHERE bot_id = ?", [bot_id], |row| {
                row.get(0)
            })
            .optional()
        })
        .await
    }

    async fn record_batch_with_reactions<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>> {
        let offset = Some(PollOffset { bot_id, next_offset });
        self.record_intake(offset, batch, reactions, claim_for, bot_username).await
    }

    async fn record_pushed_batch<'a>(
        &self,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>> {
        self.record_intake(None, batch, reactions, claim_for, bot_username).await
    }

    async fn raw_update(&self, trace_id: &TraceId) -> LedgerResult<Option<String>> {
        self.read_in_place(|db| {
            query_row_cached(db, "SELECT raw_update FROM envelopes WHERE trace_id = ?", [trace_id], |row| {
                row.get(0)
            })
            .optional()
        })
        .await
        .map(Option::flatten)
    }
}

/// The poller's offset that a polled batch moves: the next `getUpdates` starts there.
#[derive(Debug, Clone, Copy)]
struct PollOffset {
    bot_id: i64,
    next_offset: i64,
}

impl SqliteLedger {
    /// One intake transaction: the batch's rows, its reactions, its claims and, for a
    /// polled batch, the offset that confirms it.
    async fn record_intake<'a>(
        &self,
        offset: Option<PollOffset>,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>> {
        let recorded = self
            .write_in_place(|db| {
                let received_at = now();
                let rows = insert_batch(db, offset, batch, claim_for, bot_username, &received_at)?;
                Ok((rows, reactions::record_reactions(db, reactions, &received_at)?))
            })
            .await;
        self.writes.observe(LedgerWrite::Intake, &recorded);
        let ((new_rows, mut claimed, task_effects, joined), reactions) = recorded?;
        let inserted = batch.iter().zip(new_rows).filter_map(|(routed, new)| new.then_some(routed)).collect();
        // RETURNING gives no order guarantee.
        claimed.sort_by_key(|row| row.id);
        Ok(RecordedBatch { inserted, claimed, task_effects, reactions, joined })
    }
}

/// What [`insert_batch`] returns: which rows of the batch were new, the rows claimed for
/// `claim_for`, what the task changes ask for, and the album items the batch made work.
type IntakeRows = (Vec<bool>, Vec<StoredEnvelope>, Vec<TaskEffect>, Vec<JoinedAlbum>);

/// The transaction of [`SqliteLedger::record_batch_handing_over`], run in place; returns which
/// rows of the batch were new, the rows claimed for `claim_for`, what the task changes ask
/// for, and the album items it joined.
fn insert_batch(
    db: &rusqlite::Connection,
    offset: Option<PollOffset>,
    batch: &[RoutedEnvelope],
    claim_for: &[&AgentName],
    bot_username: Option<&str>,
    received_at: &str,
) -> rusqlite::Result<IntakeRows> {
    // Plain messages are stored with their task (DESIGN.md §11), read once per conversation.
    let tasks = tasks::plan_batch(db, batch, bot_username)?;
    // One statement, prepared once and run per row: in place, a row costs microseconds.
    let mut insert = db.prepare_cached(
        "INSERT INTO envelopes (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, \
         chat_title, message_id, sender_id, sender_username, sender_name, text, attachments, content, \
         sent_at, received_at, route, agent, state, state_changed_at, note, raw_update, task_id, revision, meta, \
         media_group_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?17, \
         ?21, ?22, ?23, ?24, ?25, ?26) \
         ON CONFLICT (update_id, update_digest) DO NOTHING",
    )?;
    let mut new_rows = Vec::with_capacity(batch.len());
    let mut first_id = None;
    for (routed, task) in batch.iter().zip(&tasks.tags) {
        let e = &routed.envelope;
        let attachments = serde_json::to_string(&e.attachments).unwrap_or_else(|_| "[]".into());
        // What a quote stands for is looked up now, in this transaction: a quote of a
        // message earlier in the batch finds it, and the answer is stored with the row.
        let reply_to_trace_id = match &e.context.quoted {
            Some(quoted) => reactions::quoted_trace_id(db, e.channel.chat_id, i64::from(quoted.message_id))?,
            None => None,
        };
        let meta = e
            .context
            .meta(reply_to_trace_id.as_deref())
            .map(|meta| serde_json::Value::Object(meta).to_string());
        let stored = insert.execute(rusqlite::params![
            e.trace_id.as_str(),
            e.update_id,
            routed.update_digest,
            e.kind.as_str(),
            e.channel.chat_id,
            e.channel.thread_id,
            e.chat_type.as_str(),
            e.chat_title,
            e.message_id,
            e.sender.id,
            e.sender.username,
            e.sender.name,
            e.text,
            attachments,
            e.content(),
            e.sent_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            received_at,
            routed.route.as_ref().map(RouteName::as_str),
            routed.agent.as_ref().map(AgentName::as_str),
            routed.state.as_str(),
            routed.note,
            routed.raw_update,
            task.as_ref().map(|(task_id, _)| task_id),
            task.as_ref().map(|(_, revision)| revision),
            meta,
            e.context.album,
        ])? == 1;
        // A re-polled update is already stored (the conflict): skipped.
        if stored && first_id.is_none() {
            first_id = Some(db.last_insert_rowid());
        }
        new_rows.push(stored);
    }
    drop(insert);
    // The tasks the batch starts, then its commands and edits in arrival order, in this
    // transaction: a change and the messages around it are serialised.
    let task_effects =
        tasks::record_batch_tasks(db, batch, &tasks, &new_rows, first_id.unwrap_or_default(), bot_username)?;
    // Items of albums said to the bot by an item of this batch, or said to it before: before
    // the claims, which hand them over with the rest.
    let joined = join_albums(db, batch, &new_rows, received_at)?;
    if let Some(PollOffset { bot_id, next_offset }) = offset {
        execute_cached(
            db,
            "INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES (?, ?, ?) \
             ON CONFLICT (bot_id) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at",
            rusqlite::params![bot_id, next_offset, received_at],
        )?;
    }
    let mut claim = db.prepare_cached(concat!(
        "UPDATE envelopes SET state = 'pending', deliveries = deliveries + 1, state_changed_at = ? \
         WHERE agent = ? AND state = 'queued' RETURNING ",
        envelope_columns!()
    ))?;
    let mut claimed = Vec::new();
    for agent in claim_for {
        for row in
            claim.query_map(rusqlite::params![received_at, agent.as_str()], StoredEnvelope::from_row)?
        {
            claimed.push(row?);
        }
    }
    Ok((new_rows, claimed, task_effects, joined))
}

/// Joins to their albums the rows recorded as not addressed to the bot that an item of
/// their album addressed to it takes along (`ledger::album_rows`), in this batch or
/// recorded before it: queued for that item's agent, with its task.
fn join_albums(
    db: &rusqlite::Connection,
    batch: &[RoutedEnvelope],
    new_rows: &[bool],
    at: &str,
) -> rusqlite::Result<Vec<JoinedAlbum>> {
    let mut joined = Vec::new();
    for album in album_rows::albums_of(batch, new_rows) {
        let rows = query_all_cached(
            db,
            concat!(
                "SELECT ",
                envelope_columns!(),
                " FROM envelopes WHERE chat_id = ? AND media_group_id = ? AND route = ? AND kind = 'message' \
                 ORDER BY id"
            ),
            rusqlite::params![album.chat_id, album.media_group_id, album.route],
            StoredEnvelope::from_row,
        )?;
        let note = album_rows::joined_note(&album);
        for join in album_rows::joins(&rows) {
            let moved = execute_cached(
                db,
                "UPDATE envelopes SET state = 'queued', agent = ?, task_id = ?, revision = ?, note = ?, \
                 state_changed_at = ? WHERE id = ? AND state = 'ignored'",
                rusqlite::params![join.agent(), join.with.task_id, join.with.revision, note, at, join.row.id],
            )?;
            if moved == 1 {
                execute_cached(
                    db,
                    "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor, reason) \
                     VALUES (?, ?, 'ignored', 'queued', 'daemon', ?)",
                    rusqlite::params![join.row.id, at, note],
                )?;
                joined.push(JoinedAlbum {
                    trace_id: join.row.trace_id.clone(),
                    agent: join.agent().to_owned(),
                });
            }
        }
    }
    Ok(joined)
}
