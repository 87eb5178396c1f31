//! Envelopes: one row each, in one state (DESIGN.md §2), and the audited transitions
//! between states.

use async_trait::async_trait;

use crate::ledger::prelude::*;

use crate::ledger::EnvelopeState;
use crate::telegram::envelope::{ChatType, Envelope, EnvelopeKind, sender_display};
use crate::telegram::parts::{Attachment, stored_attachments};
use rusqlite::OptionalExtension;

use super::in_place::{execute_cached, query_all_cached, query_row_cached, text_enum};
use super::{LedgerResult, SqliteLedger, now};
use crate::ids::{AgentName, RouteName, TaskId, TraceId};

/// How many characters of a message identify it in a candidate list or a listing.
const PREVIEW_CHARS: usize = 80;

/// A row the poller records: a routed message, or an audit row (an ignored message, an
/// undecodable update).
#[derive(Debug, Clone)]
pub struct RoutedEnvelope {
    pub envelope: Envelope,
    pub state: EnvelopeState,
    pub route: Option<RouteName>,
    pub agent: Option<AgentName>,
    /// The digest of the update's raw JSON (see `RawUpdate::digest`): with the update id,
    /// what makes a re-polled update the same one.
    pub update_digest: String,
    /// Why an ignored or undecodable row is no work.
    pub note: Option<String>,
    /// An undecodable update as received.
    pub raw_update: Option<String>,
}

/// An envelope as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEnvelope {
    pub id: i64,
    pub trace_id: TraceId,
    /// None for an envelope an agent made.
    pub update_id: Option<i64>,
    pub kind: EnvelopeKind,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub chat_type: ChatType,
    pub chat_title: Option<String>,
    pub message_id: i64,
    pub sender_id: Option<i64>,
    pub sender_username: Option<String>,
    pub sender_name: String,
    pub text: Option<String>,
    pub attachments: String,
    pub content: String,
    pub sent_at: String,
    pub received_at: String,
    pub route: Option<String>,
    pub agent: Option<String>,
    pub state: EnvelopeState,
    pub deliveries: i64,
    pub state_changed_at: String,
    pub note: Option<String>,
    /// The task and revision it was made under (DESIGN.md §11), if it belongs to one.
    pub task_id: Option<TaskId>,
    pub revision: Option<i64>,
    /// Extra meta for the agent, a JSON object (a revision envelope's change and texts).
    pub meta: Option<String>,
}

/// An envelope a reply names, with what its attempts say (see [`SqliteLedger::find_for_reply`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FoundForReply {
    pub envelope: StoredEnvelope,
    /// An attempt for it has an unknown outcome no operator has reconciled yet.
    pub awaiting_reconciliation: bool,
    /// A `reply` request was made for it before (its attempts carry a request id).
    pub replied_before: bool,
}

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
            sent_at: row.get("sent_at")?,
            received_at: row.get("received_at")?,
            route: row.get("route")?,
            agent: row.get("agent")?,
            state: text_enum(row, "state")?,
            deliveries: row.get("deliveries")?,
            state_changed_at: row.get("state_changed_at")?,
            note: row.get("note")?,
            task_id: row.get("task_id")?,
            revision: row.get("revision")?,
            meta: row.get("meta")?,
        })
    }

    /// Its files, as intake stored them (see `telegram::parts::Attachment`).
    pub fn attachment_list(&self) -> Vec<Attachment> {
        stored_attachments(&self.attachments)
    }

    pub fn user(&self) -> String {
        sender_display(self.sender_username.as_deref(), &self.sender_name)
    }

    pub fn thread_id(&self) -> Option<i32> {
        self.thread_id.and_then(|t| i32::try_from(t).ok())
    }

    pub fn preview(&self) -> String {
        let mut preview: String = self.content.chars().take(PREVIEW_CHARS).collect();
        if self.content.chars().count() > PREVIEW_CHARS {
            preview.push('…');
        }
        preview.replace('\n', " ")
    }

    /// `task`, `revision`, and the extra meta stored with it, as the agent sees them.
    pub fn task_meta(&self) -> std::collections::BTreeMap<String, String> {
        let mut meta = std::collections::BTreeMap::new();
        if let (Some(task), Some(revision)) = (&self.task_id, self.revision) {
            meta.insert("task".to_owned(), task.to_string());
            meta.insert("revision".to_owned(), revision.to_string());
        }
        let stored = self.meta.as_deref().and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok());
        if let Some(serde_json::Value::Object(stored)) = stored {
            for (key, value) in stored {
                let value = match value {
                    serde_json::Value::String(text) => text,
                    other => other.to_string(),
                };
                if !value.is_empty() {
                    meta.insert(key, value);
                }
            }
        }
        meta
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
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            ", EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = envelopes.id \
                 AND a.outcome IN ('unknown', 'in_flight') AND a.reconciled_outcome IS NULL \
                 AND a.purpose = 'reply' AND a.",
            reply_part_method!(),
            ") AS awaiting_reconciliation, \
             EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = envelopes.id \
                 AND a.request_id IS NOT NULL AND a.",
            reply_part_method!(),
            ") AS replied_before \
             FROM envelopes WHERE trace_id = ?"
        );
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
