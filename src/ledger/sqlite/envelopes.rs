//! Envelopes: one row each, in one state (DESIGN.md §2), and the audited transitions
//! between states.

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::columns::timestamp_column;
use super::in_place::{execute_cached, query_all_cached, query_row_cached, text_enum};
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{FoundForReply, StoredEnvelope};
use crate::ids::{AgentName, TraceId};
use crate::ledger::EnvelopeState;
use crate::ledger::columns::{envelope_columns, found_for_reply_columns};
use crate::ledger::prelude::*;
use crate::telegram::parts::{Attachment, stored_attachments};

impl StoredEnvelope {
    /// A row of [`envelope_columns!`] read in place (see `in_place`).
    pub(super) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            trace_id: row.get("trace_id")?,
            update_id: row.get("update_id")?,
            kind: text_enum(row, "kind")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            chat_type: text_enum(row, "chat_type")?,
            chat_title: row.get("chat_title")?,
            message_id: row.get("message_id")?,
            sender_id: row.get("sender_id")?,
            sender_username: row.get("sender_username")?,
            sender_name: row.get("sender_name")?,
            text: row.get("text")?,
            attachments: row.get("attachments")?,
            content: row.get("content")?,
            sent_at: timestamp_column(row, "sent_at")?,
            received_at: timestamp_column(row, "received_at")?,
            route: row.get("route")?,
            agent: row.get("agent")?,
            state: text_enum(row, "state")?,
            deliveries: row.get("deliveries")?,
            state_changed_at: timestamp_column(row, "state_changed_at")?,
            note: row.get("note")?,
            task_id: row.get("task_id")?,
            revision: row.get("revision")?,
            meta: row.get("meta")?,
        })
    }
}

#[async_trait]
impl Envelopes for SqliteLedger {
    async fn claim_next_queued(&self, agent: &AgentName) -> LedgerResult<Option<StoredEnvelope>> {
        let sql = concat!(
            "UPDATE envelopes SET state = 'pending', deliveries = deliveries + 1, state_changed_at = ? \
             WHERE id = (SELECT id FROM envelopes WHERE agent = ? AND state = 'queued' ORDER BY id LIMIT 1) \
             RETURNING ",
            envelope_columns!(),
            ""
        );
        self.write_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![now(), agent.as_str()], StoredEnvelope::from_row)
                .optional()
        })
        .await
    }

    async fn take_pending_for_redelivery(&self, agent: &AgentName) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "UPDATE envelopes SET deliveries = deliveries + 1 WHERE agent = ? AND state = 'pending' \
             RETURNING ",
            envelope_columns!(),
            ""
        );
        let mut rows: Vec<StoredEnvelope> = self
            .write_in_place(|db| query_all_cached(db, sql, [agent.as_str()], StoredEnvelope::from_row))
            .await?;
        // RETURNING gives no order guarantee.
        rows.sort_by_key(|row| row.id);
        Ok(rows)
    }

    async fn pending(&self, agent: &AgentName) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes WHERE agent = ? AND state = 'pending' ORDER BY id"
        );
        self.read_in_place(|db| query_all_cached(db, sql, [agent.as_str()], StoredEnvelope::from_row)).await
    }

    async fn attachments_of(&self, trace_id: &TraceId) -> LedgerResult<Option<Vec<Attachment>>> {
        self.read_in_place(|db| {
            query_row_cached(db, "SELECT attachments FROM envelopes WHERE trace_id = ?", [trace_id], |row| {
                row.get::<_, String>(0)
            })
            .optional()
        })
        .await
        .map(|stored| stored.as_deref().map(stored_attachments))
    }

    async fn find(&self, trace_id: &TraceId) -> LedgerResult<Option<StoredEnvelope>> {
        let sql = concat!("SELECT ", envelope_columns!(), " FROM envelopes WHERE trace_id = ?");
        self.read_in_place(|db| query_row_cached(db, sql, [trace_id], StoredEnvelope::from_row).optional())
            .await
    }

    async fn find_for_reply(&self, trace_id: &TraceId) -> LedgerResult<Option<FoundForReply>> {
        let sql = concat!("SELECT ", found_for_reply_columns!(), " FROM envelopes WHERE trace_id = ?");
        self.read_in_place(|db| {
            query_row_cached(db, sql, [trace_id], |row| {
                Ok(FoundForReply {
                    envelope: StoredEnvelope::from_row(row)?,
                    awaiting_reconciliation: row.get("awaiting_reconciliation")?,
                    replied_before: row.get("replied_before")?,
                })
            })
            .optional()
        })
        .await
    }

    // ---- state transitions ----

    async fn transition(
        &self,
        envelope_id: i64,
        from: &[EnvelopeState],
        to: EnvelopeState,
        actor: &str,
        reason: Option<&str>,
    ) -> LedgerResult<bool> {
        self.write_in_place(|db| transition_in(db, envelope_id, from, to, actor, reason)).await
    }
}

/// The body of [`SqliteLedger::transition`], inside a caller's write transaction, run in place
/// (see `in_place`).
pub(super) fn transition_in(
    db: &rusqlite::Connection,
    envelope_id: i64,
    from: &[EnvelopeState],
    to: EnvelopeState,
    actor: &str,
    reason: Option<&str>,
) -> rusqlite::Result<bool> {
    let at = now();
    // Each allowed state in turn, as a guard of the update itself: where the envelope is in
    // the first one (nearly always), the move costs one statement and its event another,
    // with no read before them — this runs on the path of every reply.
    for &current in from.iter().filter(|&&state| state != to) {
        let moved = execute_cached(
            db,
            "UPDATE envelopes SET state = ?, state_changed_at = ?, note = COALESCE(?, note) \
             WHERE id = ? AND state = ?",
            rusqlite::params![to.as_str(), at, reason, envelope_id, current.as_str()],
        )?;
        if moved == 1 {
            execute_cached(
                db,
                "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor, reason) \
                 VALUES (?, ?, ?, ?, ?, ?)",
                rusqlite::params![envelope_id, at, current.as_str(), to.as_str(), actor, reason],
            )?;
            return Ok(true);
        }
    }
    if !from.contains(&to) {
        return Ok(false);
    }
    // Already there, which the caller allows: the note is updated, no event.
    let kept = execute_cached(
        db,
        "UPDATE envelopes SET state_changed_at = ?, note = COALESCE(?, note) WHERE id = ? AND state = ?",
        rusqlite::params![at, reason, envelope_id, to.as_str()],
    )?;
    Ok(kept == 1)
}
