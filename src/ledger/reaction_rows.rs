//! What both backends decide alike about a reaction, apart from the statements that store
//! it: whether it is owed to an agent or ignored, and why; what its row holds; what a
//! session is handed once it is stored.

use crate::domain::{RoutedReaction, StoredReaction};
use crate::ids::TraceId;
use crate::telegram::envelope::Reaction;

/// A reaction as its row stores it, decided from what the bot's message it is on answered.
pub(crate) struct ReactionRow<'a> {
    pub(crate) routed: &'a RoutedReaction,
    /// The emoji set now, space-separated; empty when the user took theirs back.
    pub(crate) emoji: String,
    /// The envelope the reaction is about and the agent it is owed to; `None` when
    /// `note` says why it reaches nobody.
    pub(crate) owed_to: Option<(TraceId, String)>,
    pub(crate) note: Option<&'static str>,
}

impl<'a> ReactionRow<'a> {
    /// `answered`: the envelope the reacted-to message answered and the agent it answered
    /// for, when it is a message the bot sent for an agent.
    pub(crate) fn of(routed: &'a RoutedReaction, answered: Option<(TraceId, String)>) -> Self {
        let reaction = &routed.reaction;
        let note = if routed.sender_rejected {
            Some("reaction by a sender who may not speak to an agent in this chat (allowed_users)")
        } else if reaction.emoji.is_empty() {
            Some("reaction removed: none is set now")
        } else if answered.is_none() {
            Some("reaction on a message the bot did not send for an agent")
        } else {
            None
        };
        let owed_to = if note.is_none() { answered } else { None };
        Self { routed, emoji: reaction.emoji.join(" "), owed_to, note }
    }

    pub(crate) fn reaction(&self) -> &'a Reaction {
        &self.routed.reaction
    }

    pub(crate) fn state(&self) -> &'static str {
        if self.note.is_some() { "ignored" } else { "owed" }
    }

    pub(crate) fn agent(&self) -> Option<&str> {
        self.owed_to.as_ref().map(|(_, agent)| agent.as_str())
    }

    pub(crate) fn trace_id(&self) -> Option<&str> {
        self.owed_to.as_ref().map(|(trace_id, _)| trace_id.as_str())
    }

    /// What the agent's session is handed, once the row is stored as `id`; `None` for a
    /// reaction owed to nobody.
    pub(crate) fn owed(self, id: i64) -> Option<StoredReaction> {
        let (trace_id, agent) = self.owed_to?;
        let r = &self.routed.reaction;
        Some(StoredReaction {
            id,
            agent,
            trace_id,
            chat_id: r.chat_id,
            message_id: i64::from(r.message_id),
            user_id: r.user_id,
            user: r.user.clone(),
            emoji: self.emoji,
            reacted_at: r.date,
        })
    }
}
