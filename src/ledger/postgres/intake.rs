//! Intake on PostgreSQL: each batch of updates with what SQLite's intake stores around it
//! (`sqlite/intake.rs`): the rows, each with its task (`tasks`) and its quote's trace id,
//! the batch's commands and edits taken in, its reactions, the hand-over of queued
//! envelopes to live sessions and, for a polled batch, the offset that confirms it, in one
//! transaction.
//!
//! **Fencing.** Exactly one replica polls a bot (`leadership`). A polled batch is written
//! only under the term this replica was elected for ([`PgLedger::lead_polling`]): the
//! transaction is fenced by it (see the parent module), so a deposed leader's late batch
//! fails and changes nothing, and the offset never moves back. A replica that leads no
//! term for the bot records no polled batch at all. A pushed batch (a webhook delivery)
//! is not fenced: every replica takes deliveries, and deduplication on (`update_id`,
//! `update_digest`) keeps a delivery repeated on two replicas one envelope.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Timelike, Utc};
use sqlx::{PgConnection, Row};

use super::{CurrentTerm, FencedError, LeaderFence, PgLedger, fence_intake, reactions, tasks};
use crate::domain::{
    AlbumKey, JoinedAlbum, RecordedBatch, RoutedReaction, StoredEnvelope, StoredReaction, TaskEffect,
};
use crate::ids::{AgentName, RouteName, TraceId};
use crate::ledger::album_rows;
use crate::ledger::columns::envelope_columns;
use crate::ledger::prelude::*;
use crate::ledger::{LedgerError, LedgerResult, LedgerWrite, RoutedEnvelope};
use crate::rules::leadership::Term;

/// What an intake batch is fenced by, and for a polled batch the offset it moves.
#[derive(Debug, Clone, Copy)]
pub(super) struct FencedUnder {
    pub term: Term,
    pub bot_id: i64,
    pub next_offset: Option<i64>,
}

/// One intake transaction's result, before it is matched to the caller's batch.
struct Recorded {
    /// Per row of the batch: its id when it was new, `None` when already stored.
    ids: Vec<Option<i64>>,
    claimed: Vec<StoredEnvelope>,
    task_effects: Vec<TaskEffect>,
    reactions: Vec<StoredReaction>,
    joined: Vec<JoinedAlbum>,
}

impl PgLedger {
    /// This replica was elected to poll `bot_id` for `term`: its polled batches for the
    /// bot, the webhook deliveries it takes in and its send attempts are written under that
    /// term from now on.
    pub fn lead_polling(&self, bot_id: i64, term: Term) {
        self.polling_terms().insert(bot_id, term);
        *self.leader_fence() = LeaderFence::Leading { bot_id, term };
    }

    /// This replica's `term` for `bot_id` is over (it stepped down or was deposed): it
    /// records no polled batch for the bot until it is elected again, no webhook delivery
    /// and no send attempt. A newer term held meanwhile is left alone.
    pub fn stop_leading_polling(&self, bot_id: i64, term: Term) {
        let mut terms = self.polling_terms();
        if terms.get(&bot_id) == Some(&term) {
            terms.remove(&bot_id);
        }
        let mut leading = self.leader_fence();
        if *leading == (LeaderFence::Leading { bot_id, term }) {
            *leading = LeaderFence::Over { bot_id, term };
        }
    }

    pub(super) fn leader_fence(&self) -> std::sync::MutexGuard<'_, LeaderFence> {
        self.leading.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn polling_terms(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Term>> {
        self.polling_terms.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Intake's write fenced by an explicit `term`: the batch and the offset that confirms
    /// it, with no hand-over and no reactions. Returns, for each row of `batch`, whether it
    /// was new.
    pub async fn record_updates(
        &self,
        term: Term,
        bot_id: i64,
        next_offset: i64,
        batch: &[RoutedEnvelope],
    ) -> Result<Vec<bool>, FencedError> {
        let polled = FencedUnder { term, bot_id, next_offset: Some(next_offset) };
        let recorded = self.record_intake(Some(polled), batch, &[], &[], None).await?;
        Ok(recorded.ids.iter().map(Option::is_some).collect())
    }

    /// A polled batch under the term this replica leads the bot for.
    async fn record_polled<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>> {
        let Some(term) = self.polling_terms().get(&bot_id).copied() else {
            return Err(LedgerError::other(format!(
                "this replica does not lead polling for bot {bot_id}: a polled batch is recorded only by the \
                 elected leader"
            )));
        };
        let polled = FencedUnder { term, bot_id, next_offset: Some(next_offset) };
        let recorded = self.record_intake(Some(polled), batch, reactions, claim_for, bot_username).await;
        self.deposed_if_fenced(bot_id, recorded).map(|recorded| recorded.matched_to(batch))
    }

    /// A fenced batch's result: a refusal by the fence ends this replica's term for
    /// `bot_id` here too.
    fn deposed_if_fenced(
        &self,
        bot_id: i64,
        recorded: Result<Recorded, FencedError>,
    ) -> LedgerResult<Recorded> {
        match recorded {
            Ok(recorded) => Ok(recorded),
            Err(FencedError::Deposed { term, current }) => {
                self.stop_leading_polling(bot_id, term);
                Err(LedgerError::other(format!(
                    "deposed: this replica's {term} for bot {bot_id} is over ({}); the batch was not recorded",
                    describe(current)
                )))
            }
            Err(FencedError::Ledger(error)) => Err(error),
        }
    }

    /// One intake transaction; fenced when `fenced` names a term.
    async fn record_intake(
        &self,
        fenced: Option<FencedUnder>,
        batch: &[RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> Result<Recorded, FencedError> {
        let outcome = self.intake_transaction(fenced, batch, reactions, claim_for, bot_username).await;
        self.writes.observe(LedgerWrite::Intake, &outcome);
        outcome?
    }

    async fn intake_transaction(
        &self,
        fenced: Option<FencedUnder>,
        batch: &[RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<Result<Recorded, FencedError>> {
        // The batch's conversations, sorted before the transaction begins; they are held
        // before their tasks are read.
        let conversations = tasks::conversations_of(batch, bot_username);
        let mut tx = self.begin().await?;
        // The fence moves a polled batch's offset and holds the conversations in the same
        // statement (two round trips saved); in this transaction, so the offset still moves
        // only with the batch.
        if let Some(FencedUnder { term, bot_id, next_offset }) = fenced {
            match fence_intake(&mut tx, term, bot_id, next_offset, &conversations.held).await {
                Ok(()) => {}
                Err(FencedError::Ledger(error)) => return Err(error),
                // Nothing was written: the transaction ends with nothing in it.
                Err(deposed) => {
                    tx.rollback().await?;
                    return Ok(Err(deposed));
                }
            }
        } else {
            tasks::hold_conversations(&mut tx, &conversations.held).await?;
        }
        // Plain messages are stored with their task (DESIGN.md §11), read once per conversation.
        let plan = tasks::plan_batch(&mut tx, conversations).await?;
        let quotes = quoted_trace_ids(&mut tx, batch).await?;
        let ids = insert_rows(&mut tx, batch, &plan.tags, &quotes).await?;
        // The tasks the batch starts, then its commands and edits in arrival order, in this
        // transaction: a change and the messages around it are serialised.
        let task_effects = tasks::record_batch_tasks(&mut tx, batch, &plan, &ids, bot_username).await?;
        // Items of albums said to the bot by an item of this batch, or said to it before:
        // before the claims, which hand them over with the rest.
        let new_rows: Vec<bool> = ids.iter().map(Option::is_some).collect();
        let joined = join_albums(&mut tx, &album_rows::albums_of(batch, &new_rows)).await?;
        let mut claimed: Vec<StoredEnvelope> = if claim_for.is_empty() {
            Vec::new()
        } else {
            let agents: Vec<&str> = claim_for.iter().map(|agent| agent.as_str()).collect();
            let sql = concat!(
                "UPDATE envelopes SET state = 'pending', deliveries = deliveries + 1, state_changed_at = now() \
                 WHERE agent = ANY($1) AND state = 'queued' RETURNING ",
                envelope_columns!()
            );
            sqlx::query_as(sql).bind(agents).fetch_all(&mut *tx).await?
        };
        // RETURNING gives no order guarantee.
        claimed.sort_by_key(|row| row.id);
        let reactions = reactions::record_reactions(&mut tx, reactions).await?;
        tx.commit().await?;
        Ok(Ok(Recorded { ids, claimed, task_effects, reactions, joined }))
    }
}

impl Recorded {
    fn matched_to(self, batch: &[RoutedEnvelope]) -> RecordedBatch<'_> {
        let inserted = batch.iter().zip(&self.ids).filter_map(|(routed, id)| id.map(|_| routed)).collect();
        RecordedBatch {
            inserted,
            claimed: self.claimed,
            task_effects: self.task_effects,
            reactions: self.reactions,
            joined: self.joined,
        }
    }
}

/// Joins to their albums the rows recorded as not addressed to the bot that an item of
/// their album addressed to it takes along (`ledger::album_rows`), in this batch or
/// recorded before it: queued for that item's agent, with its task. The albums are held
/// first, each by a transaction-level advisory lock taken in one statement in the keys'
/// order, after the conversations the batch holds: two transactions recording items of one
/// album at once (webhook deliveries) would otherwise each miss the other's, and the item
/// said to nobody would stay so.
async fn join_albums(tx: &mut PgConnection, albums: &[AlbumKey]) -> LedgerResult<Vec<JoinedAlbum>> {
    if albums.is_empty() {
        return Ok(Vec::new());
    }
    let chat_ids: Vec<i64> = albums.iter().map(|album| album.chat_id).collect();
    let groups: Vec<&str> = albums.iter().map(|album| album.media_group_id.as_str()).collect();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(key) FROM (SELECT DISTINCT hashtextextended('switchboard album ' \
         || current_schema() || ' ' || chat_id::text || ' ' || media_group_id, 0) AS key \
         FROM UNNEST($1::bigint[], $2::text[]) AS a (chat_id, media_group_id)) AS keys ORDER BY key",
    )
    .bind(&chat_ids)
    .bind(&groups)
    .execute(&mut *tx)
    .await?;
    let mut joined = Vec::new();
    for album in albums {
        let rows: Vec<StoredEnvelope> = sqlx::query_as(concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes WHERE chat_id = $1 AND media_group_id = $2 AND route = $3 AND kind = 'message' \
             ORDER BY id"
        ))
        .bind(album.chat_id)
        .bind(&album.media_group_id)
        .bind(&album.route)
        .fetch_all(&mut *tx)
        .await?;
        let note = album_rows::joined_note(album);
        for join in album_rows::joins(&rows) {
            let moved = sqlx::query(
                "WITH moved AS (UPDATE envelopes SET state = 'queued', agent = $1, task_id = $2, revision = $3, \
                 note = $4, state_changed_at = now() WHERE id = $5 AND state = 'ignored' RETURNING id) \
                 INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor, reason) \
                 SELECT id, now(), 'ignored', 'queued', 'daemon', $4 FROM moved",
            )
            .bind(join.agent())
            .bind(&join.with.task_id)
            .bind(join.with.revision)
            .bind(&note)
            .bind(join.row.id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if moved == 1 {
                joined.push(JoinedAlbum {
                    trace_id: join.row.trace_id.clone(),
                    agent: join.agent().to_owned(),
                });
            }
        }
    }
    Ok(joined)
}

fn describe(current: CurrentTerm) -> String {
    match current {
        CurrentTerm::None => "nobody leads it".to_owned(),
        CurrentTerm::Term(term) => format!("the bot is at {term}"),
    }
}

/// What each row's quote stands for, looked up in this transaction: the user's message as
/// first recorded — in the ledger, else earlier in this batch — else the envelope the
/// bot's quoted message answered. SQLite finds the same by looking each row's quote up
/// after the rows before it are inserted; here the batch is one insert, so an earlier row
/// of the batch is found in the batch. Every quote of the batch is looked up in one
/// statement (a statement is a round trip): in a group where the bot sees only what
/// answers it, nearly every message quotes.
async fn quoted_trace_ids(
    tx: &mut PgConnection,
    batch: &[RoutedEnvelope],
) -> LedgerResult<Vec<Option<TraceId>>> {
    let quoting: Vec<(usize, i64, i64)> = batch
        .iter()
        .enumerate()
        .filter_map(|(index, routed)| {
            let e = &routed.envelope;
            Some((index, e.channel.chat_id, i64::from(e.context.quoted.as_ref()?.message_id)))
        })
        .collect();
    let mut quotes = vec![None; batch.len()];
    if quoting.is_empty() {
        return Ok(quotes);
    }
    // One quote, the usual case, has a statement of its own: the generic plan of the
    // statement for several assumes arrays of ten, so PostgreSQL would plan it afresh at
    // every call (see `tasks::latest_tasks`), which costs a single quote more than the
    // round trip saved.
    let found: Vec<(Option<TraceId>, Option<TraceId>)> = match quoting.as_slice() {
        [(_, chat_id, message_id)] => {
            sqlx::query_as(concat!(
                "SELECT (",
                reactions::user_message!("$1", "$2"),
                ") AS user_message, (",
                reactions::bot_answer!("e.trace_id", "$1", "$2"),
                ") AS answered"
            ))
            .bind(chat_id)
            .bind(message_id)
            .fetch_all(&mut *tx)
            .await?
        }
        several => {
            let chat_ids: Vec<i64> = several.iter().map(|(_, chat_id, _)| *chat_id).collect();
            let message_ids: Vec<i64> = several.iter().map(|(_, _, message_id)| *message_id).collect();
            sqlx::query_as(concat!(
                "SELECT (",
                reactions::user_message!("q.chat_id", "q.message_id"),
                ") AS user_message, (",
                reactions::bot_answer!("e.trace_id", "q.chat_id", "q.message_id"),
                ") AS answered FROM UNNEST($1::bigint[], $2::bigint[]) WITH ORDINALITY \
                 AS q (chat_id, message_id, position) ORDER BY q.position"
            ))
            .bind(chat_ids)
            .bind(message_ids)
            .fetch_all(&mut *tx)
            .await?
        }
    };
    if found.len() != quoting.len() {
        return Err(LedgerError::other(format!("{} quotes looked up, {} found", quoting.len(), found.len())));
    }
    for ((index, chat_id, message_id), (user_message, answered)) in quoting.into_iter().zip(found) {
        quotes[index] =
            user_message.or_else(|| earlier_in_batch(&batch[..index], chat_id, message_id)).or(answered);
    }
    Ok(quotes)
}

/// The first row of `earlier` that records the user's message `message_id` in `chat_id`.
fn earlier_in_batch(earlier: &[RoutedEnvelope], chat_id: i64, message_id: i64) -> Option<TraceId> {
    earlier
        .iter()
        .find(|routed| {
            let e = &routed.envelope;
            e.channel.chat_id == chat_id
                && i64::from(e.message_id) == message_id
                && routed.state != crate::ledger::EnvelopeState::Undecodable
        })
        .map(|routed| routed.envelope.trace_id.clone())
}

/// The batch's rows in one statement (a statement is a round trip here), deduplicated on
/// (`update_id`, `update_digest`) as on SQLite. Returns each row's id, `None` for a row
/// already stored (a re-poll, a delivery repeated).
async fn insert_rows(
    tx: &mut PgConnection,
    batch: &[RoutedEnvelope],
    tags: &[Option<(crate::ids::TaskId, i64)>],
    quotes: &[Option<TraceId>],
) -> LedgerResult<Vec<Option<i64>>> {
    let rows = EnvelopeColumns::of(batch, tags, quotes);
    let stored = sqlx::query(
        "INSERT INTO envelopes (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, \
         chat_title, message_id, sender_id, sender_username, sender_name, text, attachments, content, \
         sent_at, received_at, route, agent, state, state_changed_at, note, raw_update, task_id, revision, meta, \
         media_group_id) \
         SELECT trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, chat_title, \
         message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, now(), \
         route, agent, state, now(), note, raw_update, task_id, revision, meta, media_group_id \
         FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], \
         $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[], $13::text[], \
         $14::text[], $15::text[], $16::timestamptz[], $17::text[], $18::text[], $19::text[], $20::text[], \
         $21::text[], $22::text[], $23::bigint[], $24::text[], $25::text[]) WITH ORDINALITY \
         AS batch (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, chat_title, \
         message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, route, \
         agent, state, note, raw_update, task_id, revision, meta, media_group_id, position) \
         ORDER BY position \
         ON CONFLICT (update_id, update_digest) DO NOTHING \
         RETURNING id, trace_id",
    )
    .bind(rows.trace_id)
    .bind(rows.update_id)
    .bind(rows.update_digest)
    .bind(rows.kind)
    .bind(rows.chat_id)
    .bind(rows.thread_id)
    .bind(rows.chat_type)
    .bind(rows.chat_title)
    .bind(rows.message_id)
    .bind(rows.sender_id)
    .bind(rows.sender_username)
    .bind(rows.sender_name)
    .bind(rows.text)
    .bind(rows.attachments)
    .bind(rows.content)
    .bind(rows.sent_at)
    .bind(rows.route)
    .bind(rows.agent)
    .bind(rows.state)
    .bind(rows.note)
    .bind(rows.raw_update)
    .bind(rows.task_id)
    .bind(rows.revision)
    .bind(rows.meta)
    .bind(rows.media_group_id)
    .fetch_all(&mut *tx)
    .await?;
    // Trace ids are the batch's own and unique: they say which rows were new.
    let mut ids: HashMap<String, i64> = HashMap::with_capacity(stored.len());
    for row in stored {
        ids.insert(row.try_get("trace_id")?, row.try_get("id")?);
    }
    Ok(batch.iter().map(|routed| ids.get(routed.envelope.trace_id.as_str()).copied()).collect())
}

/// A batch of envelopes column by column, as `UNNEST` takes it (and the tests' raw insert,
/// the floor intake is measured against).
#[derive(Default)]
pub(super) struct EnvelopeColumns {
    pub(super) trace_id: Vec<String>,
    pub(super) update_id: Vec<i64>,
    pub(super) update_digest: Vec<String>,
    pub(super) kind: Vec<&'static str>,
    pub(super) chat_id: Vec<i64>,
    pub(super) thread_id: Vec<Option<i64>>,
    pub(super) chat_type: Vec<&'static str>,
    pub(super) chat_title: Vec<Option<String>>,
    pub(super) message_id: Vec<i64>,
    pub(super) sender_id: Vec<Option<i64>>,
    pub(super) sender_username: Vec<Option<String>>,
    pub(super) sender_name: Vec<String>,
    pub(super) text: Vec<Option<String>>,
    pub(super) attachments: Vec<String>,
    pub(super) content: Vec<String>,
    pub(super) sent_at: Vec<DateTime<Utc>>,
    pub(super) route: Vec<Option<String>>,
    pub(super) agent: Vec<Option<String>>,
    pub(super) state: Vec<&'static str>,
    pub(super) note: Vec<Option<String>>,
    pub(super) raw_update: Vec<Option<String>>,
    pub(super) task_id: Vec<Option<String>>,
    pub(super) revision: Vec<Option<i64>>,
    pub(super) meta: Vec<Option<String>>,
    pub(super) media_group_id: Vec<Option<String>>,
}

impl EnvelopeColumns {
    /// The columns SQLite's intake writes (`ledger/sqlite/intake.rs`), from the same values.
    pub(super) fn of(
        batch: &[RoutedEnvelope],
        tags: &[Option<(crate::ids::TaskId, i64)>],
        quotes: &[Option<TraceId>],
    ) -> Self {
        let mut columns = Self::default();
        for ((routed, tag), quote) in batch.iter().zip(tags).zip(quotes) {
            let e = &routed.envelope;
            columns.trace_id.push(e.trace_id.as_str().to_owned());
            columns.update_id.push(e.update_id);
            columns.update_digest.push(routed.update_digest.clone());
            columns.kind.push(e.kind.as_str());
            columns.chat_id.push(e.channel.chat_id);
            columns.thread_id.push(e.channel.thread_id.map(i64::from));
            columns.chat_type.push(e.chat_type.as_str());
            columns.chat_title.push(e.chat_title.clone());
            columns.message_id.push(i64::from(e.message_id));
            columns.sender_id.push(e.sender.id);
            columns.sender_username.push(e.sender.username.clone());
            columns.sender_name.push(e.sender.name.clone());
            columns.text.push(e.text.clone());
            columns.attachments.push(serde_json::to_string(&e.attachments).unwrap_or_else(|_| "[]".into()));
            columns.content.push(e.content());
            // Telegram's times are whole seconds, as SQLite stores them.
            columns.sent_at.push(e.sent_at.with_nanosecond(0).unwrap_or(e.sent_at));
            columns.route.push(routed.route.as_ref().map(RouteName::as_str).map(str::to_owned));
            columns.agent.push(routed.agent.as_ref().map(AgentName::as_str).map(str::to_owned));
            columns.state.push(routed.state.as_str());
            columns.note.push(routed.note.clone());
            columns.raw_update.push(routed.raw_update.clone());
            columns.task_id.push(tag.as_ref().map(|(task_id, _)| task_id.as_str().to_owned()));
            columns.revision.push(tag.as_ref().map(|(_, revision)| *revision));
            let meta = e.context.meta(quote.as_ref().map(TraceId::as_str));
            columns.meta.push(meta.map(|meta| serde_json::Value::Object(meta).to_string()));
            columns.media_group_id.push(e.context.album.clone());
        }
        columns
    }
}

#[async_trait]
impl Intake for PgLedger {
    async fn next_offset(&self, bot_id: i64) -> LedgerResult<Option<i64>> {
        Ok(sqlx::query_scalar("SELECT next_offset FROM poller_offsets WHERE bot_id = $1")
            .bind(bot_id)
            .fetch_optional(&self.pool)
            .await?)
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
        self.record_polled(bot_id, next_offset, batch, reactions, claim_for, bot_username).await
    }

    async fn record_pushed_batch<'a>(
        &self,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>> {
        // A webhook delivery the leader takes in (its own, or one a standby relayed) is
        // fenced by its term, with no offset to move: a leader deposed and not yet aware of
        // it answers Telegram with an error, and the retry reaches the new leader.
        let lease = self.leader_fence().lease_to_check()?;
        let fenced = lease.map(|(bot_id, term)| FencedUnder { term, bot_id, next_offset: None });
        let recorded = self.record_intake(fenced, batch, reactions, claim_for, bot_username).await;
        match fenced {
            Some(FencedUnder { bot_id, .. }) => self.deposed_if_fenced(bot_id, recorded),
            // Unfenced, only the ledger can fail it (Busy and DiskFull kept as such).
            None => recorded.map_err(|error| match error {
                FencedError::Ledger(error) => error,
                deposed @ FencedError::Deposed { .. } => LedgerError::other(deposed.to_string()),
            }),
        }
        .map(|recorded| recorded.matched_to(batch))
    }

    async fn raw_update(&self, trace_id: &TraceId) -> LedgerResult<Option<String>> {
        let raw: Option<Option<String>> =
            sqlx::query_scalar("SELECT raw_update FROM envelopes WHERE trace_id = $1")
                .bind(trace_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(raw.flatten())
    }
}
