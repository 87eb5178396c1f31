//! Group rooms (DESIGN.md §10) on PostgreSQL: each exchange (`cascades`), the turns its
//! speakers were given (`cascade_turns`) and what the switchboard says in the room
//! (`room_posts`), as on SQLite (`sqlite/rooms.rs`).
//!
//! The room driver decides; the ledger applies a decided step in one transaction, and only
//! if the facts it was decided on still hold. The guards are conditional `UPDATE`s (an
//! envelope still queued, a turn still open, the cascade still at the version the step was
//! decided on), which PostgreSQL re-checks against the row's newest version: of two
//! replicas applying steps decided on one version, one applies and the other changes
//! nothing and decides again. A guard that fails rolls the step back whole.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};

use super::PgLedger;
use super::envelopes::transition_in;
use super::rows::{optional_json, optional_text_enum, text_enum};
use super::transaction::LedgerTransaction;
use crate::domain::{
    AppliedStep, ClaimRefused, EnvelopeState, NewCascade, RoomStep, StoredCascade, StoredEnvelope,
    StoredPost, StoredTurn, TurnEnding, TurnOpen,
};
use crate::ids::{CascadeId, TraceId};
use crate::ledger::columns::{
    cascade_select, envelope_columns, post_select, room_reply_releasable, turn_select,
};
use crate::ledger::prelude::*;
use crate::ledger::room_rows::CascadeRow;
use crate::ledger::{LedgerError, LedgerResult};

impl FromRow<'_, PgRow> for StoredCascade {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            cascade_id: row.try_get("cascade_id")?,
            route: row.try_get("route")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: row.try_get("thread_id")?,
            message_envelope_id: row.try_get("message_envelope_id")?,
            message_trace_id: row.try_get("message_trace_id")?,
            message_id: row.try_get("message_id")?,
            state: text_enum(row, "state")?,
            cascade: row.try_get("cascade")?,
            max_iters: row.try_get("max_iters")?,
            speaker_timeout_secs: row.try_get("speaker_timeout_secs")?,
            stop_by: row.try_get("stop_by")?,
            stop_requested_at: row.try_get("stop_requested_at")?,
            outcome: optional_json(row, "outcome")?,
            outcome_text: row.try_get("outcome_text")?,
            created_at: row.try_get("created_at")?,
            started_at: row.try_get("started_at")?,
            ended_at: row.try_get("ended_at")?,
            updated_at: row.try_get("updated_at")?,
            version: row.try_get("version")?,
        })
    }
}

impl FromRow<'_, PgRow> for StoredTurn {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            cascade_row: row.try_get("cascade_row")?,
            speaker: row.try_get("speaker")?,
            agent: row.try_get("agent")?,
            summoned_by: row.try_get("summoned_by")?,
            envelope_id: row.try_get("envelope_id")?,
            envelope_trace_id: row.try_get("envelope_trace_id")?,
            envelope_state: text_enum(row, "envelope_state")?,
            started_at: row.try_get("started_at")?,
            reply_text: row.try_get("reply_text")?,
            reply_request_id: row.try_get("reply_request_id")?,
            ended_at: row.try_get("ended_at")?,
            ending: optional_text_enum(row, "ending")?,
        })
    }
}

impl FromRow<'_, PgRow> for StoredPost {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            key: row.try_get("key")?,
            envelope_id: row.try_get("envelope_id")?,
            envelope_trace_id: row.try_get("envelope_trace_id")?,
            route: row.try_get("route")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: row.try_get("thread_id")?,
            reply_to_message_id: row.try_get("reply_to_message_id")?,
            text: row.try_get("text")?,
            made: row.try_get("made")?,
            created_at: row.try_get("created_at")?,
            made_at: row.try_get("made_at")?,
        })
    }
}

/// A step whose guard failed: rolled back whole, nothing of it written.
async fn refused(tx: LedgerTransaction) -> LedgerResult<Option<AppliedStep>> {
    tx.rollback().await?;
    Ok(None)
}

#[async_trait]
impl Rooms for PgLedger {
    async fn room_inbox(&self) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes WHERE state = 'queued' AND agent IS NULL AND route IS NOT NULL ORDER BY id"
        );
        Ok(sqlx::query_as(sql).fetch_all(&self.pool).await?)
    }

    async fn record_cascade(&self, new: &NewCascade<'_>, note: &str) -> LedgerResult<Option<CascadeId>> {
        let cascade_id = CascadeId::generate();
        let json =
            serde_json::to_string(new.cascade).map_err(|e| LedgerError::encoding("a room's cascade", e))?;
        let note = note.replace("{cascade}", &cascade_id);
        let message = new.message;
        let mut tx = self.begin().await?;
        if !transition_in(
            &mut tx,
            message.id,
            &[EnvelopeState::Queued],
            EnvelopeState::Acked,
            "daemon",
            Some(&note),
        )
        .await?
        {
            tx.rollback().await?;
            return Ok(None);
        }
        sqlx::query(
            "INSERT INTO cascades (cascade_id, route, chat_id, thread_id, message_envelope_id, state, cascade, \
             max_iters, speaker_timeout_secs, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 'waiting', $6, $7, $8, now(), now())",
        )
        .bind(&cascade_id)
        .bind(message.route.as_deref().unwrap_or_default())
        .bind(message.chat_id)
        .bind(message.thread_id)
        .bind(message.id)
        .bind(json)
        .bind(i64::from(new.max_iters))
        .bind(i64::try_from(new.speaker_timeout_secs).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(cascade_id))
    }

    async fn apply_room_step(
        &self,
        step: &RoomStep<'_>,
        now: DateTime<Utc>,
    ) -> LedgerResult<Option<AppliedStep>> {
        let cascade_row = step.cascade.as_ref().map(CascadeRow::of).transpose()?;
        let mut tx = self.begin().await?;
        let mut applied = AppliedStep::default();
        if let Some((envelope, note)) = &step.settle {
            let settled = [EnvelopeState::Queued];
            if !transition_in(&mut tx, envelope.id, &settled, EnvelopeState::Acked, "daemon", Some(note))
                .await?
            {
                return refused(tx).await;
            }
        }
        if let Some(close) = &step.close {
            // A pass or a timeout needs the turn to have no reply; any end needs it open.
            let ended = sqlx::query(
                "UPDATE cascade_turns SET ended_at = $4, ending = $1 \
                 WHERE id = $2 AND ended_at IS NULL AND ($3 OR reply_text IS NULL)",
            )
            .bind(close.ending.stored())
            .bind(close.turn.id)
            .bind(close.ending == TurnEnding::Replied)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if ended == 0 {
                return refused(tx).await;
            }
            if let Some(reason) = close.timed_out {
                let open = [EnvelopeState::Pending, EnvelopeState::Queued];
                let turn = close.turn.envelope_id;
                if !transition_in(&mut tx, turn, &open, EnvelopeState::Acked, "daemon", Some(reason)).await? {
                    return refused(tx).await;
                }
            }
        }
        if let Some(row) = &cascade_row {
            let update = row.update;
            let updated = sqlx::query(
                "UPDATE cascades SET state = $1, cascade = $2, updated_at = $9, version = version + 1, \
                 started_at = COALESCE(started_at, $9), \
                 stop_by = COALESCE($3, stop_by), \
                 stop_requested_at = CASE WHEN $3::text IS NULL THEN stop_requested_at ELSE $9 END, \
                 outcome = COALESCE($4, outcome), outcome_text = COALESCE($5, outcome_text), \
                 ended_at = CASE WHEN $6 THEN $9 ELSE ended_at END \
                 WHERE id = $7 AND version = $8",
            )
            .bind(row.state.as_str())
            .bind(&row.cascade_json)
            .bind(update.stop_by)
            .bind(&row.outcome_json)
            .bind(row.outcome_text())
            .bind(row.ends)
            .bind(update.id)
            .bind(update.decided_on)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if updated == 0 {
                return refused(tx).await;
            }
        }
        if let Some(open) = &step.open {
            let Some(cascade_row) = step.cascade.as_ref().map(|c| c.id) else {
                tx.rollback().await?;
                return Err(LedgerError::other("a room step opens a turn without naming its cascade"));
            };
            applied.opened = Some(insert_turn(&mut tx, cascade_row, open, now).await?);
        }
        for post in &step.posts {
            let e = post.answers;
            sqlx::query(
                "INSERT INTO room_posts (key, cascade_id, envelope_id, route, chat_id, thread_id, \
                 reply_to_message_id, text, state, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'owed', $9) ON CONFLICT (key) DO NOTHING",
            )
            .bind(&post.key)
            .bind(step.cascade.as_ref().map(|c| c.id))
            .bind(e.id)
            .bind(e.route.as_deref().unwrap_or_default())
            .bind(e.chat_id)
            .bind(e.thread_id)
            .bind(e.message_id)
            .bind(&post.text)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(Some(applied))
    }

    async fn active_cascade(&self, route: &str) -> LedgerResult<Option<StoredCascade>> {
        let sql = concat!(
            cascade_select!(),
            "WHERE c.route = $1 AND c.state IN ('running', 'stop_requested') ORDER BY c.id LIMIT 1"
        );
        Ok(sqlx::query_as(sql).bind(route).fetch_optional(&self.pool).await?)
    }

    async fn next_waiting_cascade(&self, route: &str) -> LedgerResult<Option<StoredCascade>> {
        let sql =
            concat!(cascade_select!(), "WHERE c.route = $1 AND c.state = 'waiting' ORDER BY c.id LIMIT 1");
        Ok(sqlx::query_as(sql).bind(route).fetch_optional(&self.pool).await?)
    }

    async fn waiting_cascades(&self, route: &str) -> LedgerResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM cascades WHERE route = $1 AND state = 'waiting'")
            .bind(route)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn busy_rooms(&self) -> LedgerResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT route FROM cascades WHERE state IN ('waiting', 'running', 'stop_requested') \
             ORDER BY route",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn cascade(&self, cascade_id: &CascadeId) -> LedgerResult<Option<StoredCascade>> {
        let sql = concat!(cascade_select!(), "WHERE c.cascade_id = $1");
        Ok(sqlx::query_as(sql).bind(cascade_id).fetch_optional(&self.pool).await?)
    }

    async fn cascade_of_message(&self, envelope_id: i64) -> LedgerResult<Option<StoredCascade>> {
        let sql = concat!(cascade_select!(), "WHERE c.message_envelope_id = $1");
        Ok(sqlx::query_as(sql).bind(envelope_id).fetch_optional(&self.pool).await?)
    }

    async fn list_cascades(&self, route: Option<&str>, limit: i64) -> LedgerResult<Vec<StoredCascade>> {
        let sql = concat!(
            cascade_select!(),
            "WHERE ($1::text IS NULL OR c.route = $1) ORDER BY c.id DESC LIMIT $2"
        );
        let mut rows: Vec<StoredCascade> =
            sqlx::query_as(sql).bind(route).bind(limit).fetch_all(&self.pool).await?;
        rows.reverse();
        Ok(rows)
    }

    async fn turns_of(&self, cascade_row: i64) -> LedgerResult<Vec<StoredTurn>> {
        let sql = concat!(turn_select!(), "WHERE t.cascade_id = $1 ORDER BY t.speaker");
        Ok(sqlx::query_as(sql).bind(cascade_row).fetch_all(&self.pool).await?)
    }

    async fn turn_of_envelope(&self, envelope_id: i64) -> LedgerResult<Option<(StoredTurn, StoredCascade)>> {
        let sql = concat!(turn_select!(), "WHERE t.envelope_id = $1");
        let Some(turn) =
            sqlx::query_as::<_, StoredTurn>(sql).bind(envelope_id).fetch_optional(&self.pool).await?
        else {
            return Ok(None);
        };
        let sql = concat!(cascade_select!(), "WHERE c.id = $1");
        let cascade = sqlx::query_as(sql).bind(turn.cascade_row).fetch_one(&self.pool).await?;
        Ok(Some((turn, cascade)))
    }

    async fn claim_room_reply(
        &self,
        envelope_id: i64,
        text: &str,
        request_id: &str,
    ) -> LedgerResult<Result<StoredTurn, ClaimRefused>> {
        let mut tx = self.begin().await?;
        // The turn is held until the claim is written: of two replies claiming it at once,
        // the second reads it claimed.
        let sql = concat!(turn_select!(), "WHERE t.envelope_id = $1 FOR UPDATE OF t");
        let turn: Option<StoredTurn> = sqlx::query_as(sql).bind(envelope_id).fetch_optional(&mut *tx).await?;
        let refusal = match &turn {
            None => Some(ClaimRefused::NoTurn),
            Some(turn) if turn.ending.is_some() => turn.ending.map(ClaimRefused::Ended),
            Some(turn) if turn.envelope_state != EnvelopeState::Pending => {
                Some(ClaimRefused::NotPending(turn.envelope_state))
            }
            // A reply cut off after part of it was posted, resumed with the same words.
            Some(turn) if turn.reply_text.as_deref() == Some(text) => {
                let turn = turn.clone();
                tx.rollback().await?;
                return Ok(Ok(turn));
            }
            Some(turn) if turn.reply_text.is_some() => {
                Some(ClaimRefused::AlreadyReplied { request_id: turn.reply_request_id.clone() })
            }
            Some(_) => None,
        };
        let (Some(turn), None) = (turn, refusal.clone()) else {
            tx.rollback().await?;
            return Ok(Err(refusal.unwrap_or(ClaimRefused::NoTurn)));
        };
        sqlx::query("UPDATE cascade_turns SET reply_text = $1, reply_request_id = $2 WHERE id = $3")
            .bind(text)
            .bind(request_id)
            .bind(turn.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Ok(StoredTurn {
            reply_text: Some(text.to_owned()),
            reply_request_id: Some(request_id.to_owned()),
            ..turn
        }))
    }

    async fn release_room_reply(&self, turn_id: i64) -> LedgerResult<bool> {
        let released = sqlx::query(concat!(
            "UPDATE cascade_turns SET reply_text = NULL, reply_request_id = NULL WHERE id = $1 AND ",
            room_reply_releasable!()
        ))
        .bind(turn_id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(released == 1)
    }

    async fn owed_room_posts(&self) -> LedgerResult<Vec<StoredPost>> {
        let sql = concat!(post_select!(), "WHERE p.state = 'owed' ORDER BY p.id");
        Ok(sqlx::query_as(sql).fetch_all(&self.pool).await?)
    }

    async fn posts_of(&self, cascade_row: i64) -> LedgerResult<Vec<StoredPost>> {
        let sql = concat!(post_select!(), "WHERE p.cascade_id = $1 ORDER BY p.id");
        Ok(sqlx::query_as(sql).bind(cascade_row).fetch_all(&self.pool).await?)
    }

    async fn room_post_attempted(&self, poster: &str, key: &str) -> LedgerResult<bool> {
        Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM attempts WHERE agent = $1 AND request_id = $2 AND outcome <> 'not_sent')")
            .bind(poster)
            .bind(key)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn mark_room_post_made(&self, post_id: i64) -> LedgerResult<()> {
        sqlx::query("UPDATE room_posts SET state = 'made', made_at = now() WHERE id = $1 AND state = 'owed'")
            .bind(post_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Queues a room_turn envelope for the speaker (in the room's chat and topic, answering the
/// human message) and records its turn. Returns the envelope's row id and trace id.
async fn insert_turn(
    tx: &mut PgConnection,
    cascade_row: i64,
    open: &TurnOpen<'_>,
    now: DateTime<Utc>,
) -> LedgerResult<(i64, String)> {
    let trace_id = TraceId::generate();
    let m = open.message;
    let envelope_id: i64 = sqlx::query_scalar(
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, state_changed_at) \
         VALUES ($1, NULL, 'room_turn', $2, $3, $4, $5, $6, $7, $8, $9, NULL, '[]', $10, $13, $13, $11, $12, \
         'queued', $13) RETURNING id",
    )
    .bind(&trace_id)
    .bind(m.chat_id)
    .bind(m.thread_id)
    .bind(m.chat_type.as_str())
    .bind(&m.chat_title)
    .bind(m.message_id)
    .bind(m.sender_id)
    .bind(&m.sender_username)
    .bind(&m.sender_name)
    .bind(open.content)
    .bind(&m.route)
    .bind(open.agent.as_str())
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO cascade_turns (cascade_id, speaker, agent, summoned_by, envelope_id, started_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(cascade_row)
    .bind(i64::from(open.speaker))
    .bind(open.agent.as_str())
    .bind(open.summoned_by)
    .bind(envelope_id)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok((envelope_id, trace_id.to_string()))
}
