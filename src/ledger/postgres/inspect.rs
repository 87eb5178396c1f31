//! What `switchboard ledger` reads and the one change it makes, reconciliation, on
//! PostgreSQL, as on SQLite (`sqlite/inspect.rs`).

use async_trait::async_trait;
use sqlx::Row;

use super::PgLedger;
use super::envelopes::transition_in;
use crate::domain::{ReconcileError, Reconciliation, StoredEnvelope, StoredEvent};
use crate::ids::TraceId;
use crate::ledger::CountedByState;
use crate::ledger::columns::envelope_columns;
use crate::ledger::columns::part_cut_short;
use crate::ledger::prelude::*;
use crate::ledger::{EnvelopeState, LedgerError, LedgerResult, ListFilter};

#[async_trait]
impl Inspection for PgLedger {
    async fn list(&self, filter: &ListFilter) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes \
             WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR agent = $2) \
             AND ($3::text IS NULL OR route = $3) \
             AND (NOT $5 OR EXISTS (SELECT 1 FROM attempts WHERE attempts.envelope_id = envelopes.id \
                                    AND outcome = 'unknown' AND reconciled_outcome IS NULL)) \
             ORDER BY id DESC LIMIT $4"
        );
        let mut rows: Vec<StoredEnvelope> = sqlx::query_as(sql)
            .bind(filter.state.map(EnvelopeState::as_str))
            .bind(filter.agent.as_deref())
            .bind(filter.route.as_deref())
            .bind(filter.limit)
            .bind(filter.unreconciled)
            .fetch_all(&self.pool)
            .await?;
        rows.reverse();
        Ok(rows)
    }

    async fn count_by_state(&self) -> LedgerResult<Vec<(String, i64)>> {
        Ok(sqlx::query_as("SELECT state, COUNT(*) FROM envelopes GROUP BY state ORDER BY state")
            .fetch_all(&self.pool)
            .await?)
    }

    async fn events_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredEvent>> {
        Ok(sqlx::query_as(
            "SELECT at, from_state, to_state, actor, reason FROM envelope_events WHERE envelope_id = $1 ORDER BY id",
        )
        .bind(envelope_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// **Races.** The envelope's row is taken `FOR UPDATE` first, so two reconciliations of
    /// one envelope (two operators, or an operator and an answer in Telegram, on any
    /// replicas) run one after the other, and each decides on the state the other left: the
    /// second finds nothing to reconcile. A row lock rather than SQLite's conditional
    /// updates alone, because the answer depends on the envelope's state as well as on what
    /// the updates changed (one that stays as it is when only attempts beside its answer are
    /// settled), and that state must be the one the transaction changes, not one read
    /// before it.
    async fn reconcile(
        &self,
        trace_id: &TraceId,
        finding: Reconciliation,
        reason: &str,
    ) -> Result<EnvelopeState, ReconcileError> {
        let reason = format!("reconciled: {reason}");
        let mut tx = self.begin().await?;
        let envelope = sqlx::query("SELECT id, state FROM envelopes WHERE trace_id = $1 FOR UPDATE")
            .bind(trace_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(LedgerError::from)?;
        let Some(envelope) = envelope else {
            tx.rollback().await?;
            return Err(ReconcileError::Unknown(trace_id.to_string()));
        };
        let envelope_id: i64 = envelope.try_get("id").map_err(LedgerError::from)?;
        let state: EnvelopeState = super::rows::text_enum(&envelope, "state").map_err(LedgerError::from)?;
        // The envelope and its attempts are settled together or not at all.
        let settled: Vec<bool> = sqlx::query_scalar(concat!(
            "UPDATE attempts SET reconciled_outcome = $1, reconciled_reason = $2, reconciled_at = now() \
             WHERE envelope_id = $3 AND outcome = 'unknown' AND reconciled_outcome IS NULL \
             RETURNING ",
            part_cut_short!()
        ))
        .bind(finding.attempts_outcome().as_str())
        .bind(&reason)
        .bind(envelope_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(LedgerError::from)?;
        let to = finding.envelope_state(settled.contains(&true));
        let unresolved = [EnvelopeState::Unresolved];
        let moved = transition_in(&mut tx, envelope_id, &unresolved, to, "operator", Some(&reason)).await?;
        let reconciled = match (moved, settled.is_empty()) {
            (true, _) => to,
            // Only attempts beside the answer were unknown (a follow-up, an audit copy, a
            // reaction, an edit): the envelope stays as it is, whatever it is.
            (false, false) => state,
            // Nothing to reconcile: what the attempts' update did is rolled back, here rather
            // than when the transaction is dropped (that rollback waits for the connection's
            // next use, holding the envelope's row until then).
            (false, true) => {
                tx.rollback().await?;
                return Err(ReconcileError::NothingToReconcile { trace_id: trace_id.to_string(), state });
            }
        };
        tx.commit().await?;
        Ok(reconciled)
    }

    async fn unreconciled_attempts(&self) -> LedgerResult<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM attempts WHERE outcome = 'unknown' AND reconciled_outcome IS NULL",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    async fn count_by_state_of(&self, table: CountedByState) -> LedgerResult<Vec<(String, i64)>> {
        Ok(sqlx::query_as(table.query()).fetch_all(&self.pool).await?)
    }
}
