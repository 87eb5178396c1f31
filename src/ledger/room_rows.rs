//! What both backends store alike for a room's step, apart from the statements that store
//! it: a cascade's row as it is written back.

use crate::domain::CascadeUpdate;
use crate::ledger::{LedgerError, LedgerResult, RoomCascadeState};

/// The encoded columns of a cascade a step updates.
pub(crate) struct CascadeRow<'a> {
    pub(crate) update: &'a CascadeUpdate<'a>,
    /// Its `state` column.
    pub(crate) state: RoomCascadeState,
    /// Whether the step ends it (its `ended_at` is set).
    pub(crate) ends: bool,
    /// The whole cascade, as its `cascade` column holds it.
    pub(crate) cascade_json: String,
    /// Its outcome, once it is over.
    pub(crate) outcome_json: Option<String>,
}

impl<'a> CascadeRow<'a> {
    pub(crate) fn of(update: &'a CascadeUpdate<'a>) -> LedgerResult<Self> {
        let cascade_json = serde_json::to_string(update.cascade)
            .map_err(|e| LedgerError::encoding("a room's cascade", e))?;
        let outcome_json = match &update.outcome {
            Some((outcome, _)) => Some(
                serde_json::to_string(outcome).map_err(|e| LedgerError::encoding("a room's outcome", e))?,
            ),
            None => None,
        };
        let state = update.cascade.state();
        Ok(Self {
            update,
            state: RoomCascadeState::from(state),
            ends: state.is_over(),
            cascade_json,
            outcome_json,
        })
    }

    /// What the room was told of its outcome.
    pub(crate) fn outcome_text(&self) -> Option<&'a str> {
        self.update.outcome.as_ref().and_then(|(_, text)| text.as_deref())
    }
}
