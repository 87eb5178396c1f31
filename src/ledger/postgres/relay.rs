//! Webhook deliveries a standby took, kept for the leader (`migrations/postgres/0003`).
//!
//! A standby commits the update before it answers Telegram, so a crash after the commit
//! only makes Telegram deliver it again, and a second delivery is the same row. The leader
//! takes rows in through its own intake, whose deduplication makes taking a row twice
//! (a leader that died between its intake and the delete) one envelope, then deletes them.

use sqlx::Row as _;
use sqlx::postgres::PgListener;

use super::PgLedger;
use crate::ledger::{LedgerError, LedgerResult};

/// What a standby NOTIFYs once a relayed update is committed, and the leader LISTENs for.
pub const RELAYED_CHANNEL: &str = "switchboard_relayed_updates";

/// An update a standby relayed, oldest update first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayedUpdate {
    pub update_id: i64,
    pub raw: String,
}

impl PgLedger {
    /// Commits a delivery for the leader to take in; false when it was relayed before.
    pub async fn relay_update(
        &self,
        bot_id: i64,
        update_id: i64,
        raw: &str,
        replica: &str,
    ) -> LedgerResult<bool> {
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO relayed_updates (bot_id, update_id, raw, relayed_by) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (bot_id, update_id) DO NOTHING",
        )
        .bind(bot_id)
        .bind(update_id)
        .bind(raw)
        .bind(replica)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        // Delivered when the transaction commits, and only then.
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(RELAYED_CHANNEL)
            .bind(bot_id.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(inserted)
    }

    /// Up to `limit` relayed updates for `bot_id`, in update order.
    pub async fn relayed_updates(&self, bot_id: i64, limit: i64) -> LedgerResult<Vec<RelayedUpdate>> {
        let rows = sqlx::query(
            "SELECT update_id, raw FROM relayed_updates WHERE bot_id = $1 ORDER BY update_id LIMIT $2",
        )
        .bind(bot_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok(RelayedUpdate { update_id: row.try_get("update_id")?, raw: row.try_get("raw")? }))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(LedgerError::from)
    }

    /// Deletes relayed updates the leader has taken in.
    pub async fn forget_relayed(&self, bot_id: i64, update_ids: &[i64]) -> LedgerResult<()> {
        sqlx::query("DELETE FROM relayed_updates WHERE bot_id = $1 AND update_id = ANY($2)")
            .bind(bot_id)
            .bind(update_ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A connection of its own that hears each relayed update's commit. It reconnects by
    /// itself after a lost connection; what was committed meanwhile is found by asking.
    pub async fn listen_for_relayed(&self) -> LedgerResult<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(RELAYED_CHANNEL).await?;
        Ok(listener)
    }
}
