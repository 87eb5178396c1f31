//! The operator's reads and reconciliation (`switchboard ledger`, the gauges).

use super::*;

#[async_trait]
pub trait Inspection: Send + Sync {
    async fn list(&self, filter: &ListFilter) -> LedgerResult<Vec<StoredEnvelope>>;

    async fn count_by_state(&self) -> LedgerResult<Vec<(String, i64)>>;

    async fn events_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredEvent>>;

    /// Settles an envelope's unknown attempts with what the operator found out; the reason
    /// is kept on the envelope, its attempts and its event history. An `unresolved`
    /// envelope becomes `acked` (delivered) or `queued` again (not delivered, so its
    /// agent may answer again). An envelope in any other state keeps it, and only its
    /// unknown attempts are settled: an `acked` one whose later follow-up was unknown, or
    /// one whose audit copy, reaction or edit was (on a `superseded` envelope as well),
    /// since nothing else ever settles them. Refused when there is neither.
    async fn reconcile(
        &self,
        trace_id: &TraceId,
        finding: Reconciliation,
        reason: &str,
    ) -> Result<EnvelopeState, ReconcileError>;

    /// Attempts whose outcome is unknown and that no operator has reconciled yet,
    /// with their envelope's trace id: `ledger stats` counts them, since an `acked`
    /// envelope can carry one (a follow-up whose outcome is unknown).
    async fn unreconciled_attempts(&self) -> LedgerResult<i64>;

    /// `table`'s rows by state, for `/metrics`.
    async fn count_by_state_of(&self, table: CountedByState) -> LedgerResult<Vec<(String, i64)>>;
}

/// The tables whose rows `/metrics` counts by their `state` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedByState {
    Handoffs,
    /// Room exchanges.
    Cascades,
}

impl CountedByState {
    /// The statement that counts, the same on both backends.
    pub fn query(self) -> &'static str {
        match self {
            Self::Handoffs => "SELECT state, COUNT(*) FROM handoffs GROUP BY state ORDER BY state",
            Self::Cascades => "SELECT state, COUNT(*) FROM cascades GROUP BY state ORDER BY state",
        }
    }
}

/// Filters of `switchboard ledger list`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<EnvelopeState>,
    pub agent: Option<String>,
    pub route: Option<String>,
    /// Only envelopes holding an attempt whose outcome is unknown and that no operator
    /// has reconciled yet (what `switchboard_unreconciled_attempts` counts).
    pub unreconciled: bool,
    pub limit: i64,
}
