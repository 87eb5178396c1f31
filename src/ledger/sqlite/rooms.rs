//! Group rooms (DESIGN.md §10): each exchange (`cascades`), the turns its speakers were
//! given (`cascade_turns`) and what the switchboard says in the room (`room_posts`). See
//! `migrations/0005_rooms.sql` for what each table holds and why.
//!
//! The room driver decides; the ledger applies a decided step — the cascade's new state and
//! everything the step causes — in one transaction, and only if the facts it was decided on
//! still hold (a guard per fact). A step whose guard fails changes nothing and is decided
//! again from the new facts.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::OptionalExtension;

use super::columns::{optional_timestamp, timestamp_column};
use super::envelopes::transition_in;
use super::in_place::{
    execute_cached, optional_json, optional_text_enum, query_all_cached, query_row_cached, text_enum,
};
use super::{LedgerError, LedgerResult, SqliteLedger, now};
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
use crate::rules::turns::Cascade;

impl StoredCascade {
    /// A row of [`cascade_select!`], read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            cascade_id: row.get("cascade_id")?,
            route: row.get("route")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            message_envelope_id: row.get("message_envelope_id")?,
            message_trace_id: row.get("message_trace_id")?,
            message_id: row.get("message_id")?,
            state: text_enum(row, "state")?,
            cascade: row.get("cascade")?,
            max_iters: row.get("max_iters")?,
            speaker_timeout_secs: row.get("speaker_timeout_secs")?,
            stop_by: row.get("stop_by")?,
            stop_requested_at: optional_timestamp(row, "stop_requested_at")?,
            outcome: optional_json(row, "outcome")?,
            outcome_text: row.get("outcome_text")?,
            created_at: timestamp_column(row, "created_at")?,
            started_at: optional_timestamp(row, "started_at")?,
            ended_at: optional_timestamp(row, "ended_at")?,
            updated_at: timestamp_column(row, "updated_at")?,
            version: row.get("version")?,
        })
    }

    pub fn cascade(&self) -> Result<Cascade, serde_json::Error> {
        serde_json::from_str(&self.cascade)
    }

    pub fn thread_id(&self) -> Option<i32> {
        self.thread_id.and_then(|t| i32::try_from(t).ok())
    }
}

impl StoredTurn {
    /// A row of [`turn_select!`], read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            cascade_row: row.get("cascade_row")?,
            speaker: row.get("speaker")?,
            agent: row.get("agent")?,
            summoned_by: row.get("summoned_by")?,
            envelope_id: row.get("envelope_id")?,
            envelope_trace_id: row.get("envelope_trace_id")?,
            envelope_state: text_enum(row, "envelope_state")?,
            started_at: timestamp_column(row, "started_at")?,
            reply_text: row.get("reply_text")?,
            reply_request_id: row.get("reply_request_id")?,
            ended_at: optional_timestamp(row, "ended_at")?,
            ending: optional_text_enum(row, "ending")?,
        })
    }

    pub fn speaker(&self) -> u32 {
        u32::try_from(self.speaker).unwrap_or_default()
    }
}

impl StoredPost {
    /// A row of [`post_select!`], read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            key: row.get("key")?,
            envelope_id: row.get("envelope_id")?,
            envelope_trace_id: row.get("envelope_trace_id")?,
            route: row.get("route")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            reply_to_message_id: row.get("reply_to_message_id")?,
            text: row.get("text")?,
            made: row.get("made")?,
            created_at: timestamp_column(row, "created_at")?,
            made_at: optional_timestamp(row, "made_at")?,
        })
    }
}

/// See [`SqliteLedger::room_post_attempted`].
pub(super) const POST_ATTEMPTED: &str =
    "SELECT EXISTS (SELECT 1 FROM attempts WHERE agent = ? AND request_id = ? AND outcome <> 'not_sent')";

#[async_trait]
impl Rooms for SqliteLedger {
    async fn room_inbox(&self) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes WHERE state = 'queued' AND agent IS NULL AND route IS NOT NULL ORDER BY id"
        );
        self.read_in_place(|db| query_all_cached(db, sql, [], StoredEnvelope::from_row)).await
    }

    async fn record_cascade(&self, new: &NewCascade<'_>, note: &str) -> LedgerResult<Option<CascadeId>> {
        let cascade_id = CascadeId::generate();
        let json =
            serde_json::to_string(new.cascade).map_err(|e| LedgerError::encoding("a room's cascade", e))?;
        let note = note.replace("{cascade}", &cascade_id);
        self.write_in_place_if(|db| {
            let message = new.message;
            if !transition_in(db, message.id, &[EnvelopeState::Queued], EnvelopeState::Acked, "daemon", Some(&note))?
            {
                return Ok(None);
            }
            execute_cached(
                db,
                "INSERT INTO cascades (cascade_id, route, chat_id, thread_id, message_envelope_id, state, cascade, \
                 max_iters, speaker_timeout_secs, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'waiting', ?6, ?7, ?8, ?9, ?9)",
                rusqlite::params![
                    cascade_id,
                    message.route.as_deref().unwrap_or_default(),
                    message.chat_id,
                    message.thread_id,
                    message.id,
                    json,
                    i64::from(new.max_iters),
                    i64::try_from(new.speaker_timeout_secs).unwrap_or(i64::MAX),
                    now(),
                ],
            )?;
            Ok(Some(cascade_id))
        })
        .await
    }

    async fn apply_room_step(
        &self,
        step: &RoomStep<'_>,
        now: DateTime<Utc>,
    ) -> LedgerResult<Option<AppliedStep>> {
        let cascade_row = step.cascade.as_ref().map(CascadeRow::of).transpose()?;
        let at = crate::clock::text(now);
        // Every `return Ok(None)` below rolls back what the step wrote before it.
        self.write_in_place_if(|db| {
            let mut applied = AppliedStep::default();
            if let Some((envelope, note)) = &step.settle {
                let settled = [EnvelopeState::Queued];
                if !transition_in(db, envelope.id, &settled, EnvelopeState::Acked, "daemon", Some(note))? {
                    return Ok(None);
                }
            }
            if let Some(close) = &step.close {
                // A pass or a timeout needs the turn to have no reply; any end needs it open.
                let ended = execute_cached(
                    db,
                    "UPDATE cascade_turns SET ended_at = ?, ending = ? \
                     WHERE id = ? AND ended_at IS NULL AND (? OR reply_text IS NULL)",
                    rusqlite::params![
                        at,
                        close.ending.stored(),
                        close.turn.id,
                        close.ending == TurnEnding::Replied
                    ],
                )?;
                if ended == 0 {
                    return Ok(None);
                }
                if let Some(reason) = close.timed_out {
                    let open = [EnvelopeState::Pending, EnvelopeState::Queued];
                    let turn = close.turn.envelope_id;
                    if !transition_in(db, turn, &open, EnvelopeState::Acked, "daemon", Some(reason))? {
                        return Ok(None);
                    }
                }
            }
            if let Some(row) = &cascade_row {
                let update = row.update;
                let updated = execute_cached(
                    db,
                    "UPDATE cascades SET state = ?1, cascade = ?2, updated_at = ?3, version = version + 1, \
                     started_at = COALESCE(started_at, ?4), \
                     stop_by = COALESCE(?5, stop_by), \
                     stop_requested_at = CASE WHEN ?5 IS NULL THEN stop_requested_at ELSE ?4 END, \
                     outcome = COALESCE(?6, outcome), outcome_text = COALESCE(?7, outcome_text), \
                     ended_at = CASE WHEN ?8 THEN ?4 ELSE ended_at END \
                     WHERE id = ?9 AND version = ?10",
                    rusqlite::params![
                        row.state.as_str(),
                        row.cascade_json,
                        at,
                        at,
                        update.stop_by,
                        row.outcome_json,
                        row.outcome_text(),
                        row.ends,
                        update.id,
                        update.decided_on,
                    ],
                )?;
                if updated == 0 {
                    return Ok(None);
                }
            }
            if let Some(open) = &step.open {
                let Some(cascade_row) = step.cascade.as_ref().map(|c| c.id) else {
                    return Err(rusqlite::Error::QueryReturnedNoRows);
                };
                applied.opened = Some(insert_turn(db, cascade_row, open, &at)?);
            }
            for post in &step.posts {
                let e = post.answers;
                execute_cached(
                    db,
                    "INSERT INTO room_posts (key, cascade_id, envelope_id, route, chat_id, thread_id, \
                     reply_to_message_id, text, state, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'owed', ?) ON CONFLICT (key) DO NOTHING",
                    rusqlite::params![
                        post.key,
                        step.cascade.as_ref().map(|c| c.id),
                        e.id,
                        e.route.as_deref().unwrap_or_default(),
                        e.chat_id,
                        e.thread_id,
                        e.message_id,
                        post.text,
                        at,
                    ],
                )?;
            }
            Ok(Some(applied))
        })
        .await
    }

    async fn active_cascade(&self, route: &str) -> LedgerResult<Option<StoredCascade>> {
        let sql = concat!(
            cascade_select!(),
            "WHERE c.route = ? AND c.state IN ('running', 'stop_requested') ORDER BY c.id LIMIT 1"
        );
        self.read_in_place(|db| query_row_cached(db, sql, [route], StoredCascade::from_row).optional()).await
    }

    async fn next_waiting_cascade(&self, route: &str) -> LedgerResult<Option<StoredCascade>> {
        let sql =
            concat!(cascade_select!(), "WHERE c.route = ? AND c.state = 'waiting' ORDER BY c.id LIMIT 1");
        self.read_in_place(|db| query_row_cached(db, sql, [route], StoredCascade::from_row).optional()).await
    }

    async fn waiting_cascades(&self, route: &str) -> LedgerResult<i64> {
        let sql = "SELECT COUNT(*) FROM cascades WHERE route = ? AND state = 'waiting'";
        self.read_in_place(|db| query_row_cached(db, sql, [route], |row| row.get(0))).await
    }

    async fn busy_rooms(&self) -> LedgerResult<Vec<String>> {
        let sql = "SELECT DISTINCT route FROM cascades WHERE state IN ('waiting', 'running', 'stop_requested') \
                   ORDER BY route";
        self.read_in_place(|db| query_all_cached(db, sql, [], |row| row.get(0))).await
    }

    async fn cascade(&self, cascade_id: &CascadeId) -> LedgerResult<Option<StoredCascade>> {
        let sql = concat!(cascade_select!(), "WHERE c.cascade_id = ?");
        self.read_in_place(|db| query_row_cached(db, sql, [cascade_id], StoredCascade::from_row).optional())
            .await
    }

    async fn cascade_of_message(&self, envelope_id: i64) -> LedgerResult<Option<StoredCascade>> {
        let sql = concat!(cascade_select!(), "WHERE c.message_envelope_id = ?");
        self.read_in_place(|db| query_row_cached(db, sql, [envelope_id], StoredCascade::from_row).optional())
            .await
    }

    async fn list_cascades(&self, route: Option<&str>, limit: i64) -> LedgerResult<Vec<StoredCascade>> {
        let sql =
            concat!(cascade_select!(), "WHERE (?1 IS NULL OR c.route = ?1) ORDER BY c.id DESC LIMIT ?2");
        let mut rows: Vec<StoredCascade> = self
            .read_in_place(|db| {
                query_all_cached(db, sql, rusqlite::params![route, limit], StoredCascade::from_row)
            })
            .await?;
        rows.reverse();
        Ok(rows)
    }

    async fn turns_of(&self, cascade_row: i64) -> LedgerResult<Vec<StoredTurn>> {
        let sql = concat!(turn_select!(), "WHERE t.cascade_id = ? ORDER BY t.speaker");
        self.read_in_place(|db| query_all_cached(db, sql, [cascade_row], StoredTurn::from_row)).await
    }

    async fn turn_of_envelope(&self, envelope_id: i64) -> LedgerResult<Option<(StoredTurn, StoredCascade)>> {
        self.read_in_place(|db| {
            let sql = concat!(turn_select!(), "WHERE t.envelope_id = ?");
            let Some(turn) = query_row_cached(db, sql, [envelope_id], StoredTurn::from_row).optional()?
            else {
                return Ok(None);
            };
            let sql = concat!(cascade_select!(), "WHERE c.id = ?");
            let cascade = query_row_cached(db, sql, [turn.cascade_row], StoredCascade::from_row)?;
            Ok(Some((turn, cascade)))
        })
        .await
    }

    async fn claim_room_reply(
        &self,
        envelope_id: i64,
        text: &str,
        request_id: &str,
    ) -> LedgerResult<Result<StoredTurn, ClaimRefused>> {
        self.write_in_place(|db| {
            let sql = concat!(turn_select!(), "WHERE t.envelope_id = ?");
            let Some(turn) = query_row_cached(db, sql, [envelope_id], StoredTurn::from_row).optional()?
            else {
                return Ok(Err(ClaimRefused::NoTurn));
            };
            if let Some(ending) = turn.ending {
                return Ok(Err(ClaimRefused::Ended(ending)));
            }
            if turn.envelope_state != EnvelopeState::Pending {
                return Ok(Err(ClaimRefused::NotPending(turn.envelope_state)));
            }
            match &turn.reply_text {
                // A reply cut off after part of it was posted, resumed with the same words.
                Some(claimed) if claimed == text => return Ok(Ok(turn)),
                Some(_) => {
                    return Ok(Err(ClaimRefused::AlreadyReplied { request_id: turn.reply_request_id }));
                }
                None => {}
            }
            execute_cached(
                db,
                "UPDATE cascade_turns SET reply_text = ?, reply_request_id = ? WHERE id = ?",
                rusqlite::params![text, request_id, turn.id],
            )?;
            Ok(Ok(StoredTurn {
                reply_text: Some(text.to_owned()),
                reply_request_id: Some(request_id.to_owned()),
                ..turn
            }))
        })
        .await
    }

    async fn release_room_reply(&self, turn_id: i64) -> LedgerResult<bool> {
        let released = self
            .execute_in_place(
                concat!(
                    "UPDATE cascade_turns SET reply_text = NULL, reply_request_id = NULL WHERE id = ? AND ",
                    room_reply_releasable!()
                ),
                (turn_id,),
            )
            .await?;
        Ok(released == 1)
    }

    async fn owed_room_posts(&self) -> LedgerResult<Vec<StoredPost>> {
        let sql = concat!(post_select!(), "WHERE p.state = 'owed' ORDER BY p.id");
        self.read_in_place(|db| query_all_cached(db, sql, [], StoredPost::from_row)).await
    }

    async fn posts_of(&self, cascade_row: i64) -> LedgerResult<Vec<StoredPost>> {
        let sql = concat!(post_select!(), "WHERE p.cascade_id = ? ORDER BY p.id");
        self.read_in_place(|db| query_all_cached(db, sql, [cascade_row], StoredPost::from_row)).await
    }

    async fn room_post_attempted(&self, poster: &str, key: &str) -> LedgerResult<bool> {
        self.read_in_place(|db| query_row_cached(db, POST_ATTEMPTED, [poster, key], |row| row.get(0))).await
    }

    async fn mark_room_post_made(&self, post_id: i64) -> LedgerResult<()> {
        self.execute_in_place(
            "UPDATE room_posts SET state = 'made', made_at = ? WHERE id = ? AND state = 'owed'",
            (now(), post_id),
        )
        .await
        .map(drop)
    }
}

/// Queues a room_turn envelope for the speaker (in the room's chat and topic, answering the
/// human message) and records its turn. Returns the envelope's row id and trace id.
fn insert_turn(
    db: &rusqlite::Connection,
    cascade_row: i64,
    open: &TurnOpen<'_>,
    at: &str,
) -> rusqlite::Result<(i64, String)> {
    let trace_id = TraceId::generate().to_string();
    let m = open.message;
    let envelope_id: i64 = query_row_cached(
        db,
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, state_changed_at) \
         VALUES (?1, NULL, 'room_turn', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, '[]', ?10, ?11, ?11, ?12, ?13, \
         'queued', ?11) RETURNING id",
        rusqlite::params![
            trace_id,
            m.chat_id,
            m.thread_id,
            m.chat_type.as_str(),
            m.chat_title,
            m.message_id,
            m.sender_id,
            m.sender_username,
            m.sender_name,
            open.content,
            at,
            m.route,
            open.agent.as_str(),
        ],
        |row| row.get(0),
    )?;
    execute_cached(
        db,
        "INSERT INTO cascade_turns (cascade_id, speaker, agent, summoned_by, envelope_id, started_at) \
         VALUES (?, ?, ?, ?, ?, ?)",
        rusqlite::params![
            cascade_row,
            i64::from(open.speaker),
            open.agent.as_str(),
            open.summoned_by,
            envelope_id,
            at
        ],
    )?;
    Ok((envelope_id, trace_id))
}

#[cfg(test)]
mod tests {
    use crate::rules::turns::Outcome;

    use super::*;
    use crate::config::Synchronous;
    use crate::ledger::conformance::rooms::{recorded, room_message};

    async fn ledger() -> (tempfile::TempDir, SqliteLedger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
        (dir, ledger)
    }

    /// An exchange's outcome is read back as the outcome it was; one this switchboard
    /// cannot read (written by a newer version) is an error naming it, not an exchange
    /// without an outcome, which would look as if it were still running.
    #[tokio::test]
    async fn a_cascades_outcome_is_read_strictly() {
        let (dir, ledger) = ledger().await;
        let message = room_message(&ledger, 1, "@builder build it").await;
        let stored = recorded(&ledger, &message).await;
        let outcome = Outcome::Completed { turns_used: 2, replies: 1 };
        let json = serde_json::to_string(&outcome).unwrap();
        let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
        db.execute("UPDATE cascades SET outcome = ?1 WHERE id = ?2", rusqlite::params![json, stored.id])
            .unwrap();
        assert_eq!(ledger.cascade(&stored.cascade_id).await.unwrap().unwrap().outcome, Some(outcome));

        db.execute("UPDATE cascades SET outcome = '{\"abandoned\":{}}' WHERE id = ?1", [stored.id]).unwrap();
        let read = ledger.cascade(&stored.cascade_id).await;
        assert!(format!("{read:?}").contains("abandoned"), "read as {read:?}");
        assert!(read.is_err());
    }

    /// Whether a post was attempted is answered from the attempts' request index, not a scan.
    #[tokio::test]
    async fn the_attempted_post_lookup_uses_the_request_index() {
        let (_dir, ledger) = ledger().await;
        let plan: String = ledger
            .read_in_place(|db| {
                let explain = format!("EXPLAIN QUERY PLAN {POST_ATTEMPTED}");
                let steps: Vec<String> = db
                    .prepare(&explain)?
                    .query_map(["switchboard", "k"], |row| row.get(3))?
                    .collect::<Result<_, _>>()?;
                Ok(steps.join("; "))
            })
            .await
            .unwrap();
        // Not covering: the rows found are read for their outcome (one not_sent is no
        // attempt that counts), a few per post.
        assert!(plan.contains("USING INDEX attempts_by_request (agent=? AND request_id=?)"), "{plan}");
        assert!(!plan.contains("SCAN attempts"), "{plan}");
    }
}
