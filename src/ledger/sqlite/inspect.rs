//! What `switchboard ledger` reads and the one change it makes: reconciliation.

use async_trait::async_trait;

use super::envelopes::transition_in;
use super::in_place::{query_all_cached, query_row_cached, text_enum};
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{ReconcileError, Reconciliation, StoredEnvelope, StoredEvent};
use crate::ids::TraceId;
use crate::ledger::CountedByState;
use crate::ledger::columns::envelope_columns;
use crate::ledger::columns::part_cut_short;
use crate::ledger::prelude::*;
use crate::ledger::{EnvelopeState, ListFilter};

#[async_trait]
impl Inspection for SqliteLedger {
    async fn list(&self, filter: &ListFilter) -> LedgerResult<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes \
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR agent = ?2) AND (?3 IS NULL OR route = ?3) \
             AND (NOT ?5 OR EXISTS (SELECT 1 FROM attempts WHERE attempts.envelope_id = envelopes.id \
                                    AND outcome = 'unknown' AND reconciled_outcome IS NULL)) \
             ORDER BY id DESC LIMIT ?4"
        );
        let filter = filter.clone();
        let mut rows = self
            .read_off_thread(move |db| {
                let state = filter.state.map(EnvelopeState::as_str);
                let params =
                    rusqlite::params![state, filter.agent, filter.route, filter.limit, filter.unreconciled];
                query_all_cached(db, sql, params, StoredEnvelope::from_row)
            })
            .await?;
        rows.reverse();
        Ok(rows)
    }

    async fn count_by_state(&self) -> LedgerResult<Vec<(String, i64)>> {
        self.read_off_thread(|db| {
            query_all_cached(
                db,
                "SELECT state, COUNT(*) FROM envelopes GROUP BY state ORDER BY state",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
        })
        .await
    }

    async fn events_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredEvent>> {
        self.read_in_place(|db| {
            query_all_cached(
                db,
                "SELECT at, from_state, to_state, actor, reason FROM envelope_events WHERE envelope_id = ? ORDER BY id",
                [envelope_id],
                |row| {
                    Ok(StoredEvent {
                        at: row.get("at")?,
                        from_state: row.get("from_state")?,
                        to_state: row.get("to_state")?,
                        actor: row.get("actor")?,
                        reason: row.get("reason")?,
                    })
                },
            )
        })
        .await
    }

    async fn reconcile(
        &self,
        trace_id: &TraceId,
        finding: Reconciliation,
        reason: &str,
    ) -> Result<EnvelopeState, ReconcileError> {
        let envelope =
            self.find(trace_id).await?.ok_or_else(|| ReconcileError::Unknown(trace_id.to_string()))?;
        let reason = format!("reconciled: {reason}");
        // The envelope and its attempts are settled together or not at all.
        let reconciled = self
            .write_in_place_if(|db| {
                let settled: Vec<bool> = query_all_cached(
                    db,
                    concat!(
                        "UPDATE attempts SET reconciled_outcome = ?, reconciled_reason = ?, reconciled_at = ? \
                         WHERE envelope_id = ? AND outcome = 'unknown' AND reconciled_outcome IS NULL \
                         RETURNING ",
                        part_cut_short!()
                    ),
                    rusqlite::params![finding.attempts_outcome().as_str(), reason, now(), envelope.id],
                    |row| row.get(0),
                )?;
                let to = finding.envelope_state(settled.contains(&true));
                let unresolved = [EnvelopeState::Unresolved];
                if transition_in(db, envelope.id, &unresolved, to, "operator", Some(&reason))? {
                    return Ok(Some(to));
                }
                if settled.is_empty() {
                    // Nothing to reconcile.
                    return Ok(None);
                }
                // Only attempts beside the answer were unknown (a follow-up, an audit copy, a
                // reaction, an edit): the envelope stays as it is, whatever it is.
                let state = query_row_cached(db, "SELECT state FROM envelopes WHERE id = ?", [envelope.id], |row| {
                    text_enum(row, "state")
                })?;
                Ok(Some(state))
            })
            .await?;
        reconciled.ok_or_else(|| ReconcileError::NothingToReconcile {
            trace_id: trace_id.to_string(),
            state: envelope.state,
        })
    }

    async fn unreconciled_attempts(&self) -> LedgerResult<i64> {
        self.read_off_thread(|db| {
            query_row_cached(
                db,
                "SELECT COUNT(*) FROM attempts WHERE outcome = 'unknown' AND reconciled_outcome IS NULL",
                [],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn count_by_state_of(&self, table: CountedByState) -> LedgerResult<Vec<(String, i64)>> {
        self.read_off_thread(move |db| {
            query_all_cached(db, table.query(), [], |row| Ok((row.get(0)?, row.get(1)?)))
        })
        .await
    }
}
