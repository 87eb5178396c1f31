//! Reactions as notices (DESIGN.md §8): a user's reaction to a message the bot sent for an
//! agent reaches that agent's session as a `reaction` notice about the envelope the message
//! answered. Intake stores it `owed` (`ledger::reactions`), so one that arrives while no
//! session is connected, or before a crash, is given to the next session; the session
//! gives it once it has written it to the stream, and only then is it `delivered`. It is no
//! envelope: nothing to answer, never pending, never a reply's candidate.

use std::collections::BTreeMap;

use tokio::sync::mpsc;

use super::Bridge;
use crate::agents::api::wire::{DeliveredNotice, REACTION_NOTICE, SessionEvent};
use crate::ids::AgentName;
use crate::ledger::{LedgerResult, StoredReaction};

/// A stored reaction as its notice.
pub(super) fn reaction_notice(reaction: &StoredReaction) -> DeliveredNotice {
    let extra = BTreeMap::from([
        ("reaction".to_owned(), reaction.emoji.clone()),
        ("user".to_owned(), reaction.user.clone()),
        ("user_id".to_owned(), reaction.user_id.unwrap_or_default().to_string()),
        ("chat_id".to_owned(), reaction.chat_id.to_string()),
        ("message_id".to_owned(), reaction.message_id.to_string()),
    ]);
    DeliveredNotice {
        trace_id: reaction.trace_id.to_string(),
        kind: REACTION_NOTICE.to_owned(),
        content: format!(
            "{} reacted {} to your reply (message {}) to {}. Not a new message: nothing to answer.",
            reaction.user, reaction.emoji, reaction.message_id, reaction.trace_id
        ),
        ts: reaction.reacted_at.clone(),
        extra,
    }
}

impl Bridge {
    /// Writes every reaction owed to `agent` to its session, oldest first, and records
    /// those written as delivered. False when the session is gone: what was not written
    /// stays owed for the next one. A crash between the write and the record gives a
    /// notice twice rather than never.
    pub(super) async fn give_owed_reactions(
        &self,
        agent: &AgentName,
        tx: &mpsc::Sender<SessionEvent>,
    ) -> LedgerResult<bool> {
        let ledger = &self.inner.ledger;
        let owed = ledger.owed_reactions(agent).await?;
        let mut given = Vec::with_capacity(owed.len());
        let mut session_alive = true;
        for reaction in &owed {
            if tx.send(SessionEvent::Notice(reaction_notice(reaction))).await.is_err() {
                session_alive = false;
                break;
            }
            given.push(reaction.id);
        }
        ledger.reactions_delivered(&given).await?;
        Ok(session_alive)
    }
}
