//! What waits for an answer right now, as the typing indicator asks it
//! (`telegram::typing`): the pending envelopes of a Telegram chat that are in front of
//! the agent's connected session (see `AgentSlot::in_front_of_live_session`).

use super::Bridge;
use crate::ledger::{EnvelopeKind, LedgerResult};
use crate::telegram::envelope::ChatType;

/// A pending envelope in front of the agent, in a chat whose people wait for the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownWaiting {
    pub trace_id: String,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
}

impl Bridge {
    /// The envelopes that wait for an answer in front of their agent: pending, handed to
    /// or confirmed shown by the connected session, from a Telegram chat (not a handoff, and
    /// not a room's turn, which the room driver paces). One ledger read per agent with a
    /// connected session.
    pub async fn shown_and_waiting(&self) -> LedgerResult<Vec<ShownWaiting>> {
        let mut waiting = Vec::new();
        for (agent, slot) in &self.inner.agents {
            if slot.session.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_none() {
                continue;
            }
            for envelope in self.inner.ledger.pending(agent).await? {
                let from_a_chat = match envelope.kind {
                    EnvelopeKind::Message | EnvelopeKind::EditedMessage | EnvelopeKind::Unknown => true,
                    EnvelopeKind::Revision => envelope.chat_type != ChatType::Agent,
                    EnvelopeKind::Handoff | EnvelopeKind::HandoffAnswer | EnvelopeKind::RoomTurn => false,
                };
                if from_a_chat && slot.in_front_of_live_session(&envelope.trace_id) {
                    waiting.push(ShownWaiting {
                        thread_id: envelope.thread_id(),
                        trace_id: envelope.trace_id.to_string(),
                        chat_id: envelope.chat_id,
                    });
                }
            }
        }
        Ok(waiting)
    }

    /// Returns once a session was handed envelopes or confirmed it showed some since the
    /// last call (at once when that happened meanwhile).
    pub async fn shown_changed(&self) {
        self.inner.shown_bell.notified().await;
    }
}
