//! Envelopes on PostgreSQL: one row each, in one state (DESIGN.md §2), and the audited
//! transitions between states.
//!
//! Every move is a conditional `UPDATE … WHERE state = …`: PostgreSQL re-checks the
//! condition on the row's newest version once a concurrent writer commits, so of two
//! replicas moving one envelope from the same state only one moves it.

use async_trait::async_trait;
use sqlx::{FromRow, PgConnection, Row};

use super::{PgLedger, fenced_lease, under_lease};
use crate::domain::{FoundForReply, StoredEnvelope};
use crate::ids::{AgentName, TraceId};
use crate::ledger::columns::{envelope_columns, found_for_reply_columns};
use crate::ledger::prelude::*;
use crate::ledger::{EnvelopeState, LedgerResult};
use crate::telegram::parts::{Attachment, stored_attachments};

#[async_trait]
impl Envelopes for PgLedger {
    async fn claim_next_queued(&self, agent: &AgentName) -> LedgerResult<Option<StoredEnvelope>> {
        // The session asks again only when woken, so a queued envelope passed over here
        // waits until the next message rings. Hence no SKIP LOCKED: a row another
        // transaction holds is waited for and looked at again once it is let go (and the
        // next queued one taken if it is queued no longer). And NO KEY UPDATE, not UPDATE:
        // a row inserted elsewhere that refers to this envelope (an attempt, a task, a
        // handoff's audit copy) holds it KEY SHARE until its transaction ends, which only
        // FOR UPDATE would wait for. Only the leader serves sessions, so no other replica
        // claims beside this one; and a replica that no longer leads claims nothing (the
        // lease row, as intake's fence reads it): an envelope it took would be pending for
        // a session the new leader does not know. An election waits for a claim that
        // passed, and the new leader's sessions take it back as they open.
        let Ok((bot_id, term)) = self.leader_fence().lease_binds() else { return Ok(None) };
        let sql = concat!(
            "WITH ",
            fenced_lease!("$2"),
            " UPDATE envelopes SET state = 'pending', deliveries = deliveries + 1, state_changed_at = now() \
             WHERE id = (SELECT id FROM envelopes WHERE agent = $1 AND state = 'queued' ORDER BY id LIMIT 1 \
             FOR NO KEY UPDATE) AND ",
            under_lease!("$2", "$3"),
            " RETURNING ",
            envelope_columns!()
        );
        Ok(sqlx::query_as(sql)
            .bind(agent.as_str())
            .bind(bot_id)
            .bind(term)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn take_pending_for_redelivery(&self, agent: &AgentName) -> LedgerResult<Vec<StoredEnvelope>> {
        // Fenced as a claim is: a session opening at a replica that no longer leads is
        // handed nothing (its plugin moves on to the leader, whose session takes these back).
        let Ok((bot_id, term)) = self.leader_fence().lease_binds() else { return Ok(Vec::new()) };
        let sql = concat!(
            "WITH ",
            fenced_lease!("$2"),
            " UPDATE envelopes SET deliveries = deliveries + 1 WHERE agent = $1 AND state = 'pending' AND ",
            under_lease!("$2", "$3"),
            " RETURNING ",
            envelope_columns!()
        );
        let mut rows: Vec<StoredEnvelope> =
            sqlx::query_as(sql).bind(agent.as_str()).bind(bot_id).bind(term).fetch_all(&self.pool).await?;
        // RETURNING gives no order guarantee.
        rows.sort_by_key(|row| row.id);
        Ok(rows)
    }

    async fn pending(&self, agent: &AgentName) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes WHERE agent = $1 AND state = 'pending' ORDER BY id"
        );
        Ok(sqlx::query_as(sql).bind(agent.as_str()).fetch_all(&self.pool).await?)
    }

    async fn attachments_of(&self, trace_id: &TraceId) -> LedgerResult<Option<Vec<Attachment>>> {
        let stored: Option<String> =
            sqlx::query_scalar("SELECT attachments FROM envelopes WHERE trace_id = $1")
                .bind(trace_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(stored.as_deref().map(stored_attachments))
    }

    async fn find(&self, trace_id: &TraceId) -> LedgerResult<Option<StoredEnvelope>> {
        let sql = concat!("SELECT ", envelope_columns!(), " FROM envelopes WHERE trace_id = $1");
        Ok(sqlx::query_as(sql).bind(trace_id).fetch_optional(&self.pool).await?)
    }

    async fn find_for_reply(&self, trace_id: &TraceId) -> LedgerResult<Option<FoundForReply>> {
        let sql = concat!("SELECT ", found_for_reply_columns!(), " FROM envelopes WHERE trace_id = $1");
        let Some(row) = sqlx::query(sql).bind(trace_id).fetch_optional(&self.pool).await? else {
            return Ok(None);
        };
        Ok(Some(FoundForReply {
            envelope: StoredEnvelope::from_row(&row)?,
            awaiting_reconciliation: row.try_get("awaiting_reconciliation")?,
            replied_before: row.try_get("replied_before")?,
        }))
    }

    async fn transition(
        &self,
        envelope_id: i64,
        from: &[EnvelopeState],
        to: EnvelopeState,
        actor: &str,
        reason: Option<&str>,
    ) -> LedgerResult<bool> {
        let mut tx = self.begin().await?;
        let moved = transition_in(&mut tx, envelope_id, from, to, actor, reason).await?;
        tx.commit().await?;
        Ok(moved)
    }
}

/// The body of [`Envelopes::transition`], inside a caller's transaction.
pub(super) async fn transition_in(
    tx: &mut PgConnection,
    envelope_id: i64,
    from: &[EnvelopeState],
    to: EnvelopeState,
    actor: &str,
    reason: Option<&str>,
) -> LedgerResult<bool> {
    // Each allowed state in turn, as a guard of the update itself: where the envelope is in
    // the first one (nearly always), the move and its event cost one statement.
    for &current in from.iter().filter(|&&state| state != to) {
        let moved = sqlx::query(
            "WITH moved AS (UPDATE envelopes SET state = $1, state_changed_at = now(), note = COALESCE($2, note) \
             WHERE id = $3 AND state = $4 RETURNING id) \
             INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor, reason) \
             SELECT id, now(), $4, $1, $5, $2 FROM moved",
        )
        .bind(to.as_str())
        .bind(reason)
        .bind(envelope_id)
        .bind(current.as_str())
        .bind(actor)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 1 {
            return Ok(true);
        }
    }
    if !from.contains(&to) {
        return Ok(false);
    }
    // Already there, which the caller allows: the note is updated, no event.
    let kept = sqlx::query(
        "UPDATE envelopes SET state_changed_at = now(), note = COALESCE($1, note) WHERE id = $2 AND state = $3",
    )
    .bind(reason)
    .bind(envelope_id)
    .bind(to.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(kept == 1)
}
