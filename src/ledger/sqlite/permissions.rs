//! Permission requests (DESIGN.md §15): one row per tool-use approval an agent's session
//! relayed, written before its prompt is posted. The row says who asked (the session and
//! the plugin process), where the prompt went and what became of its send, the verdict
//! and who gave it, and whether the asking plugin has been handed the verdict. The first
//! verdict wins: every change of state is conditional on the row still being `pending`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::OptionalExtension;

use super::columns::{optional_timestamp, timestamp_column};
use super::in_place::{execute_cached, query_all_cached, query_row_cached, text_enum};
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{
    AnswerRecorded, AttemptOutcome, EndedPlugins, ExpiredBecause, NewPermissionRequest, PermissionState,
    PermissionVerdict, StoredPermission,
};
use crate::ledger::columns::permission_columns;
use crate::ledger::prelude::*;

impl StoredPermission {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            agent: row.get("agent")?,
            session_id: row.get("session_id")?,
            plugin_id: row.get("plugin_id")?,
            request_id: row.get("request_id")?,
            tool_name: row.get("tool_name")?,
            description: row.get("description")?,
            input_preview: row.get("input_preview")?,
            asked_at: timestamp_column(row, "asked_at")?,
            expires_at: timestamp_column(row, "expires_at")?,
            state: text_enum(row, "state")?,
            route: row.get("route")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            prompt_send: text_enum(row, "prompt_send")?,
            prompt_message_id: row.get("prompt_message_id")?,
            prompt_error: row.get("prompt_error")?,
            prompt_settled: row.get("prompt_settled")?,
            answered_by: row.get("answered_by")?,
            answered_by_name: row.get("answered_by_name")?,
            answered_at: optional_timestamp(row, "answered_at")?,
            expired_because: row.get("expired_because")?,
            verdict_sent_at: optional_timestamp(row, "verdict_sent_at")?,
            verdict_handed_at: optional_timestamp(row, "verdict_handed_at")?,
        })
    }
}

fn permission_in(db: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<StoredPermission>> {
    query_row_cached(
        db,
        concat!("SELECT ", permission_columns!(), " FROM permission_requests WHERE id = ?"),
        [id],
        StoredPermission::from_row,
    )
    .optional()
}

#[async_trait]
impl Permissions for SqliteLedger {
    async fn record_permission_request(
        &self,
        new: &NewPermissionRequest<'_>,
    ) -> LedgerResult<(StoredPermission, bool)> {
        self.write_in_place(|db| {
            let inserted = execute_cached(
                db,
                "INSERT INTO permission_requests (id, agent, session_id, plugin_id, request_id, tool_name, \
                 description, input_preview, asked_at, expires_at, state, route, chat_id, thread_id, prompt_send) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'pending', ?11, ?12, ?13, 'in_flight') \
                 ON CONFLICT (plugin_id, request_id) DO NOTHING",
                rusqlite::params![
                    new.id,
                    new.agent,
                    new.session_id,
                    new.plugin_id,
                    new.request_id,
                    new.tool_name,
                    new.description,
                    new.input_preview,
                    now(),
                    new.expires_at,
                    new.route,
                    new.chat_id,
                    new.thread_id,
                ],
            )?;
            let row = query_row_cached(
                db,
                concat!(
                    "SELECT ",
                    permission_columns!(),
                    " FROM permission_requests WHERE plugin_id = ? AND request_id = ?"
                ),
                [new.plugin_id, new.request_id],
                StoredPermission::from_row,
            )?;
            Ok((row, inserted == 1))
        })
        .await
    }

    async fn finish_prompt_send(&self, id: &str, outcome: &AttemptOutcome) -> LedgerResult<StoredPermission> {
        self.write_in_place(|db| {
            match outcome {
                AttemptOutcome::Sent { message_id } => execute_cached(
                    db,
                    "UPDATE permission_requests SET prompt_send = 'sent', prompt_message_id = ?, prompt_settled = 0 WHERE id = ?",
                    rusqlite::params![message_id, id],
                )?,
                AttemptOutcome::NotSent { error } => execute_cached(
                    db,
                    "UPDATE permission_requests SET prompt_send = 'not_sent', prompt_error = ?1, prompt_settled = 1, \
                     state = CASE state WHEN 'pending' THEN 'expired' ELSE state END, \
                     expired_because = CASE state WHEN 'pending' THEN ?2 ELSE expired_because END \
                     WHERE id = ?3",
                    rusqlite::params![error, ExpiredBecause::PromptNotSent.as_str(), id],
                )?,
                AttemptOutcome::Unknown { error } => execute_cached(
                    db,
                    "UPDATE permission_requests SET prompt_send = 'unknown', prompt_error = ? WHERE id = ?",
                    rusqlite::params![error, id],
                )?,
            };
            permission_in(db, id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)
        })
        .await
    }

    async fn recover_prompt_sends(&self) -> LedgerResult<usize> {
        self.execute_in_place(
            "UPDATE permission_requests SET prompt_send = 'unknown', \
             prompt_error = 'the daemon stopped during the send' WHERE prompt_send = 'in_flight'",
            [],
        )
        .await
    }

    async fn permission(&self, id: &str) -> LedgerResult<Option<StoredPermission>> {
        self.read_in_place(|db| permission_in(db, id)).await
    }

    async fn pending_permissions_named(
        &self,
        request_id: &str,
        chat_id: i64,
    ) -> LedgerResult<Vec<StoredPermission>> {
        let request_id = request_id.to_owned();
        self.read_in_place(move |db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT ",
                    permission_columns!(),
                    " FROM permission_requests WHERE request_id = ? AND chat_id = ? AND state = 'pending'"
                ),
                rusqlite::params![request_id, chat_id],
                StoredPermission::from_row,
            )
        })
        .await
    }

    async fn answer_permission(
        &self,
        id: &str,
        verdict: PermissionVerdict,
        by: i64,
        by_name: &str,
    ) -> LedgerResult<AnswerRecorded> {
        let at = now();
        self.write_in_place(|db| {
            let changed = execute_cached(
                db,
                "UPDATE permission_requests SET state = ?1, answered_by = ?2, answered_by_name = ?3, answered_at = ?4 \
                 WHERE id = ?5 AND state = 'pending' AND expires_at > ?4",
                rusqlite::params![PermissionState::of(verdict).as_str(), by, by_name, at, id],
            )?;
            Ok(match (permission_in(db, id)?, changed) {
                (None, _) => AnswerRecorded::Unknown,
                (Some(row), 1) => AnswerRecorded::Recorded(row),
                (Some(row), _) => AnswerRecorded::TooLate(row),
            })
        })
        .await
    }

    async fn expire_due_permissions(&self, now: DateTime<Utc>) -> LedgerResult<Vec<StoredPermission>> {
        let at = crate::clock::text(now);
        self.write_in_place(|db| {
            query_all_cached(
                db,
                concat!(
                    "UPDATE permission_requests SET state = 'expired', expired_because = ?1 \
                     WHERE state = 'pending' AND expires_at <= ?2 RETURNING ",
                    permission_columns!()
                ),
                rusqlite::params![ExpiredBecause::Timeout.as_str(), at],
                StoredPermission::from_row,
            )
        })
        .await
    }

    async fn expire_permissions_of_ended_session(
        &self,
        agent: &str,
        ended: EndedPlugins<'_>,
    ) -> LedgerResult<usize> {
        let because = ExpiredBecause::SessionEnded.as_str();
        let (sql, plugin) = match ended {
            EndedPlugins::This(plugin) => (
                "UPDATE permission_requests SET state = 'expired', expired_because = ?1 \
                 WHERE state = 'pending' AND agent = ?2 AND plugin_id = ?3",
                plugin,
            ),
            EndedPlugins::AllBut(plugin) => (
                "UPDATE permission_requests SET state = 'expired', expired_because = ?1 \
                 WHERE state = 'pending' AND agent = ?2 AND plugin_id <> ?3",
                plugin,
            ),
        };
        self.write_in_place(|db| execute_cached(db, sql, rusqlite::params![because, agent, plugin])).await
    }

    async fn next_permission_expiry(&self) -> LedgerResult<Option<DateTime<Utc>>> {
        self.read_in_place(|db| {
            query_row_cached(
                db,
                "SELECT MIN(expires_at) AS next_expiry FROM permission_requests WHERE state = 'pending'",
                [],
                |row| optional_timestamp(row, "next_expiry"),
            )
        })
        .await
    }

    async fn unsettled_prompts(&self) -> LedgerResult<Vec<StoredPermission>> {
        self.read_in_place(|db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT ",
                    permission_columns!(),
                    " FROM permission_requests WHERE prompt_settled = 0 AND state <> 'pending' \
                     AND prompt_send <> 'in_flight' ORDER BY asked_at"
                ),
                [],
                StoredPermission::from_row,
            )
        })
        .await
    }

    async fn settle_prompt(&self, id: &str) -> LedgerResult<()> {
        self.execute_in_place("UPDATE permission_requests SET prompt_settled = 1 WHERE id = ?", [id])
            .await
            .map(drop)
    }

    async fn unsettle_prompt(&self, id: &str) -> LedgerResult<()> {
        self.execute_in_place(
            "UPDATE permission_requests SET prompt_settled = 0 WHERE id = ? AND state <> 'pending'",
            [id],
        )
        .await
        .map(drop)
    }

    async fn note_prompt_message(&self, id: &str, message_id: i32) -> LedgerResult<()> {
        self.execute_in_place(
            "UPDATE permission_requests SET prompt_message_id = ?, prompt_settled = 0 \
             WHERE id = ? AND prompt_message_id IS NULL",
            (message_id, id.to_owned()),
        )
        .await
        .map(drop)
    }

    async fn undelivered_verdicts(&self, plugin: &str) -> LedgerResult<Vec<StoredPermission>> {
        let plugin = plugin.to_owned();
        self.read_in_place(move |db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT ",
                    permission_columns!(),
                    " FROM permission_requests WHERE plugin_id = ? AND verdict_handed_at IS NULL \
                     AND (state = 'allowed' OR state = 'denied') ORDER BY answered_at"
                ),
                [plugin.as_str()],
                StoredPermission::from_row,
            )
        })
        .await
    }

    async fn verdict_sent(&self, id: &str) -> LedgerResult<()> {
        self.execute_in_place(
            "UPDATE permission_requests SET verdict_sent_at = ? WHERE id = ? AND verdict_sent_at IS NULL",
            (now(), id),
        )
        .await
        .map(drop)
    }

    async fn verdict_handed(&self, id: &str, plugin: &str) -> LedgerResult<bool> {
        self.execute_in_place(
            "UPDATE permission_requests SET verdict_handed_at = COALESCE(verdict_handed_at, ?) \
             WHERE id = ? AND plugin_id = ? AND (state = 'allowed' OR state = 'denied')",
            (now(), id, plugin),
        )
        .await
        .map(|changed| changed > 0)
    }

    async fn list_permissions(&self, limit: i64) -> LedgerResult<Vec<StoredPermission>> {
        self.read_off_thread(move |db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT ",
                    permission_columns!(),
                    " FROM permission_requests ORDER BY asked_at DESC, id LIMIT ?"
                ),
                [limit],
                StoredPermission::from_row,
            )
        })
        .await
    }

    async fn count_permissions_by_state(&self) -> LedgerResult<Vec<(PermissionState, i64)>> {
        self.read_off_thread(|db| {
            let mut statement =
                db.prepare_cached("SELECT state, COUNT(*) AS n FROM permission_requests GROUP BY state")?;
            let rows = statement.query_map([], |row| Ok((text_enum(row, "state")?, row.get("n")?)))?;
            rows.collect()
        })
        .await
    }
}
