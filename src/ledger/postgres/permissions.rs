//! Permission requests (DESIGN.md §15) on PostgreSQL, as on SQLite
//! (`sqlite/permissions.rs`): one row per tool-use approval an agent's session relayed,
//! written before its prompt is posted.
//!
//! **Races.** The first verdict wins across replicas as it does on one: every change of
//! state is one conditional `UPDATE … WHERE state = 'pending'`. Two replicas recording a
//! verdict (or a verdict and an expiry) for one request queue on its row; the second
//! re-reads the row as the first committed it (READ COMMITTED re-checks the `WHERE` of an
//! `UPDATE` that waited on a row lock), finds it no longer pending and changes nothing. A
//! conditional update rather than `SELECT … FOR UPDATE`, because each change is one
//! statement whose guard is the whole decision.
//!
//! **Clocks.** A request's times are the asking replica's clock (`expires_at` is set from
//! it), and whether it is due, or a verdict too late, is decided on the deciding replica's
//! clock, which also times that replica's next look: never on the server's, which would mix
//! two clocks in one decision (a replica ahead of the server looked again and again at
//! requests the server said were not due). Replicas' clocks apart by Δ move an expiry by Δ.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::PgLedger;
use super::rows::text_enum;
use crate::domain::{
    AnswerRecorded, AttemptOutcome, EndedPlugins, ExpiredBecause, NewPermissionRequest, PermissionState,
    PermissionVerdict, StoredPermission,
};
use crate::ledger::columns::permission_columns;
use crate::ledger::prelude::*;
use crate::ledger::{LedgerError, LedgerResult};

async fn permission_in(db: &mut PgConnection, id: &str) -> LedgerResult<Option<StoredPermission>> {
    Ok(sqlx::query_as(concat!("SELECT ", permission_columns!(), " FROM permission_requests WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?)
}

#[async_trait]
impl Permissions for PgLedger {
    async fn record_permission_request(
        &self,
        new: &NewPermissionRequest<'_>,
    ) -> LedgerResult<(StoredPermission, bool)> {
        let mut tx = self.begin().await?;
        // A concurrent insert of the same request waits for this one and then inserts
        // nothing; the read after it sees the row that won.
        let inserted = sqlx::query(
            "INSERT INTO permission_requests (id, agent, session_id, plugin_id, request_id, tool_name, \
             description, input_preview, asked_at, expires_at, state, route, chat_id, thread_id, prompt_send) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $13, $9::timestamptz, 'pending', $10, $11, $12, 'in_flight') \
             ON CONFLICT (plugin_id, request_id) DO NOTHING",
        )
        .bind(new.id)
        .bind(new.agent)
        .bind(new.session_id)
        .bind(new.plugin_id)
        .bind(new.request_id)
        .bind(new.tool_name)
        .bind(new.description)
        .bind(new.input_preview)
        .bind(new.expires_at)
        .bind(new.route)
        .bind(new.chat_id)
        .bind(new.thread_id.map(i64::from))
        .bind(Utc::now())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let row = sqlx::query_as(concat!(
            "SELECT ",
            permission_columns!(),
            " FROM permission_requests WHERE plugin_id = $1 AND request_id = $2"
        ))
        .bind(new.plugin_id)
        .bind(new.request_id)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((row, inserted == 1))
    }

    async fn finish_prompt_send(&self, id: &str, outcome: &AttemptOutcome) -> LedgerResult<StoredPermission> {
        let query = match outcome {
            AttemptOutcome::Sent { message_id } => sqlx::query_as(concat!(
                "UPDATE permission_requests SET prompt_send = 'sent', prompt_message_id = $1, \
                 prompt_settled = FALSE WHERE id = $2 RETURNING ",
                permission_columns!()
            ))
            .bind(i64::from(*message_id))
            .bind(id),
            // The state and the reason are decided on the row as the update finds it, in
            // the update itself.
            AttemptOutcome::NotSent { error } => sqlx::query_as(concat!(
                "UPDATE permission_requests SET prompt_send = 'not_sent', prompt_error = $1, prompt_settled = TRUE, \
                 state = CASE state WHEN 'pending' THEN 'expired' ELSE state END, \
                 expired_because = CASE state WHEN 'pending' THEN $2 ELSE expired_because END \
                 WHERE id = $3 RETURNING ",
                permission_columns!()
            ))
            .bind(error.as_str())
            .bind(ExpiredBecause::PromptNotSent.as_str())
            .bind(id),
            AttemptOutcome::Unknown { error } => sqlx::query_as(concat!(
                "UPDATE permission_requests SET prompt_send = 'unknown', prompt_error = $1 WHERE id = $2 RETURNING ",
                permission_columns!()
            ))
            .bind(error.as_str())
            .bind(id),
        };
        query
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| LedgerError::other(format!("no permission request {id} was recorded")))
    }

    async fn recover_prompt_sends(&self) -> LedgerResult<usize> {
        let recovered = sqlx::query(
            "UPDATE permission_requests SET prompt_send = 'unknown', \
             prompt_error = 'the daemon stopped during the send' WHERE prompt_send = 'in_flight'",
        )
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(recovered as usize)
    }

    async fn permission(&self, id: &str) -> LedgerResult<Option<StoredPermission>> {
        permission_in(&mut *self.pool.acquire().await?, id).await
    }

    async fn pending_permissions_named(
        &self,
        request_id: &str,
        chat_id: i64,
    ) -> LedgerResult<Vec<StoredPermission>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            permission_columns!(),
            " FROM permission_requests WHERE request_id = $1 AND chat_id = $2 AND state = 'pending'"
        ))
        .bind(request_id)
        .bind(chat_id)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn answer_permission(
        &self,
        id: &str,
        verdict: PermissionVerdict,
        by: i64,
        by_name: &str,
    ) -> LedgerResult<AnswerRecorded> {
        let mut tx = self.begin().await?;
        let changed = sqlx::query(
            "UPDATE permission_requests SET state = $1, answered_by = $2, answered_by_name = $3, answered_at = $5 \
             WHERE id = $4 AND state = 'pending' AND expires_at > $5",
        )
        .bind(PermissionState::of(verdict).as_str())
        .bind(by)
        .bind(by_name)
        .bind(id)
        .bind(Utc::now())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let row = permission_in(&mut tx, id).await?;
        tx.commit().await?;
        Ok(match (row, changed) {
            (None, _) => AnswerRecorded::Unknown,
            (Some(row), 1) => AnswerRecorded::Recorded(row),
            (Some(row), _) => AnswerRecorded::TooLate(row),
        })
    }

    async fn expire_due_permissions(&self, now: DateTime<Utc>) -> LedgerResult<Vec<StoredPermission>> {
        Ok(sqlx::query_as(concat!(
            "UPDATE permission_requests SET state = 'expired', expired_because = $1 \
             WHERE state = 'pending' AND expires_at <= $2 RETURNING ",
            permission_columns!()
        ))
        .bind(ExpiredBecause::Timeout.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn expire_permissions_of_ended_session(
        &self,
        agent: &str,
        ended: EndedPlugins<'_>,
    ) -> LedgerResult<usize> {
        let (sql, plugin) = match ended {
            EndedPlugins::This(plugin) => (
                "UPDATE permission_requests SET state = 'expired', expired_because = $1 \
                 WHERE state = 'pending' AND agent = $2 AND plugin_id = $3",
                plugin,
            ),
            EndedPlugins::AllBut(plugin) => (
                "UPDATE permission_requests SET state = 'expired', expired_because = $1 \
                 WHERE state = 'pending' AND agent = $2 AND plugin_id <> $3",
                plugin,
            ),
        };
        let expired = sqlx::query(sql)
            .bind(ExpiredBecause::SessionEnded.as_str())
            .bind(agent)
            .bind(plugin)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(expired as usize)
    }

    async fn next_permission_expiry(&self) -> LedgerResult<Option<DateTime<Utc>>> {
        Ok(sqlx::query_scalar("SELECT MIN(expires_at) FROM permission_requests WHERE state = 'pending'")
            .fetch_one(&self.pool)
            .await?)
    }

    async fn unsettled_prompts(&self) -> LedgerResult<Vec<StoredPermission>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            permission_columns!(),
            " FROM permission_requests WHERE NOT prompt_settled AND state <> 'pending' \
             AND prompt_send <> 'in_flight' ORDER BY asked_at"
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn settle_prompt(&self, id: &str) -> LedgerResult<()> {
        sqlx::query("UPDATE permission_requests SET prompt_settled = TRUE WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn unsettle_prompt(&self, id: &str) -> LedgerResult<()> {
        sqlx::query(
            "UPDATE permission_requests SET prompt_settled = FALSE WHERE id = $1 AND state <> 'pending'",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn note_prompt_message(&self, id: &str, message_id: i32) -> LedgerResult<()> {
        // The first proof stands: a later press names the same message, or a stale one.
        sqlx::query(
            "UPDATE permission_requests SET prompt_message_id = $1, prompt_settled = FALSE \
             WHERE id = $2 AND prompt_message_id IS NULL",
        )
        .bind(i64::from(message_id))
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn undelivered_verdicts(&self, plugin: &str) -> LedgerResult<Vec<StoredPermission>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            permission_columns!(),
            " FROM permission_requests WHERE plugin_id = $1 AND verdict_handed_at IS NULL \
             AND state IN ('allowed', 'denied') ORDER BY answered_at"
        ))
        .bind(plugin)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn verdict_sent(&self, id: &str) -> LedgerResult<()> {
        sqlx::query("UPDATE permission_requests SET verdict_sent_at = now() WHERE id = $1 AND verdict_sent_at IS NULL")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn verdict_handed(&self, id: &str, plugin: &str) -> LedgerResult<bool> {
        let confirmed = sqlx::query(
            "UPDATE permission_requests SET verdict_handed_at = COALESCE(verdict_handed_at, now()) \
             WHERE id = $1 AND plugin_id = $2 AND state IN ('allowed', 'denied')",
        )
        .bind(id)
        .bind(plugin)
        .execute(&self.pool)
        .await?;
        Ok(confirmed.rows_affected() > 0)
    }

    async fn list_permissions(&self, limit: i64) -> LedgerResult<Vec<StoredPermission>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            permission_columns!(),
            " FROM permission_requests ORDER BY asked_at DESC, id LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn count_permissions_by_state(&self) -> LedgerResult<Vec<(PermissionState, i64)>> {
        let rows =
            sqlx::query("SELECT state, COUNT(*) AS n FROM permission_requests GROUP BY state ORDER BY state")
                .fetch_all(&self.pool)
                .await?;
        let counted = rows.iter().map(|row| Ok((text_enum(row, "state")?, row.try_get("n")?)));
        Ok(counted.collect::<sqlx::Result<_>>()?)
    }
}
