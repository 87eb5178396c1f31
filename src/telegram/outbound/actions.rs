//! Reactions and edits (issue 22): `setMessageReaction` and `editMessageText` on a
//! message of an envelope's conversation. Each is an attempt like a reply's part (DESIGN.md
//! §4), admitted against the envelope's task in the statement that records it (§11), with
//! its method and the message it acts on; it settles nothing about the envelope.

use serde_json::json;

use super::{Call, MAX_REPLY_WAIT, NotMade, Observed, Outbound, Turn, classify, classify_as};
use crate::ledger::{AttemptMethod, AttemptPurpose, NewAttempt};
use crate::rules::revisions::Refusal;
use crate::telegram::format;

/// The conversation an action is made in, and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageActionTarget {
    pub envelope_id: i64,
    pub trace_id: String,
    pub agent: String,
    pub chat_id: i64,
    /// The tool request it belongs to (`req_…`): a repeat of it is answered from the ledger.
    pub request_id: String,
}

/// What is done to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageAction {
    /// One of [`crate::telegram::reactions::ALLOWED_REACTIONS`].
    React { message_id: i32, emoji: &'static str },
    /// The new text, already within one message; HTML when `html`.
    Edit { message_id: i32, text: String, html: bool },
}

impl MessageAction {
    fn method(&self) -> AttemptMethod {
        match self {
            Self::React { .. } => AttemptMethod::SetReaction,
            Self::Edit { .. } => AttemptMethod::EditMessage,
        }
    }

    fn message_id(&self) -> i32 {
        match self {
            Self::React { message_id, .. } | Self::Edit { message_id, .. } => *message_id,
        }
    }
}

impl Outbound {
    /// Makes the action as one attempt (an edit Telegram cannot parse as HTML: two, the
    /// second as plain text). Each paced to the chat like a send, within one reply's wait;
    /// a rate limit is reported, not waited out.
    /// Refused when the envelope's task no longer admits it; then nothing was attempted.
    pub async fn act(
        &self,
        target: &MessageActionTarget,
        action: &MessageAction,
    ) -> Result<Observed, Refusal> {
        let mut budget = MAX_REPLY_WAIT;
        let turn = match self.take_turn(target.chat_id, &mut budget).await {
            Ok(turn) => turn,
            Err(not_made) => return Ok(not_made.observed()),
        };
        let observed = self.act_once(target, action, AttemptPurpose::Reply, turn).await?;
        if let Observed::NotSent { retry_after: Some(wait), .. } = &observed {
            // Held for the next send to the chat too, as a reply's 429 holds it.
            self.pacer().rate_limited(target.chat_id, *wait, std::time::Instant::now());
        }
        match (&observed, action) {
            (
                Observed::NotSent { error, retry_after: None, .. },
                MessageAction::Edit { message_id, text, html: true },
            ) if format::is_unparsable_entities(error) => {
                tracing::warn!(trace_id = %target.trace_id, %error, "Telegram could not parse the edit's HTML: editing once more with plain text");
                let plain = MessageAction::Edit {
                    message_id: *message_id,
                    text: format::html_to_plain(text),
                    html: false,
                };
                // A request of its own, so it takes its own turn in the chat's pace, as a
                // reply's part sent again as plain text does.
                let turn = match self.take_turn(target.chat_id, &mut budget).await {
                    Ok(turn) => turn,
                    Err(not_made) => return Ok(not_made.observed()),
                };
                self.act_once(target, &plain, AttemptPurpose::Reply, turn).await
            }
            _ => Ok(observed),
        }
    }

    /// `[outbound] ack_reaction`: `emoji` on the envelope's message, once per envelope
    /// whatever its redeliveries: the attempt, keyed by `target.request_id`, records that
    /// it was made (whatever it came to), and a recorded one is never made again. An
    /// acknowledgement, not an answer: recorded as an audit attempt, which settles nothing
    /// and needs no admission. Best effort, and kept out of the chat's pacing (it keeps to
    /// the overall budget), so that it never delays the answer it acknowledges.
    pub async fn ack_reaction(&self, target: &MessageActionTarget, message_id: i32, emoji: &'static str) {
        match self.ledger.action_attempt(&target.agent, &target.request_id).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                tracing::debug!(trace_id = %target.trace_id, "ack reaction already made for this envelope");
                return;
            }
            Err(e) => {
                tracing::debug!(trace_id = %target.trace_id, error = %e, "ack reaction skipped: the ledger could not say whether it was made");
                return;
            }
        }
        if self.holds(target.chat_id) {
            tracing::debug!(trace_id = %target.trace_id, "ack reaction skipped: a 429 holds the chat");
            return;
        }
        let action = MessageAction::React { message_id, emoji };
        let mut budget = MAX_REPLY_WAIT;
        let turn = match self.clearance(None, &mut budget).await {
            Ok(turn) => turn,
            Err(not_made) => {
                tracing::debug!(trace_id = %target.trace_id, reason = %NotMade::reason(not_made), "ack reaction not set");
                return;
            }
        };
        let made = self.act_once(target, &action, AttemptPurpose::Audit, turn).await;
        if let Ok(Observed::NotSent { retry_after: Some(wait), .. }) = &made {
            // Held for the chat's next send too, as a reply's 429 holds it.
            self.pacer().rate_limited(target.chat_id, *wait, std::time::Instant::now());
        }
        match made {
            Ok(Observed::Sent { .. }) => {
                tracing::debug!(trace_id = %target.trace_id, emoji, "ack reaction set")
            }
            // It may be on the message, or not: an attempt only an operator can settle, and
            // `switchboard_unreconciled_attempts` counts it until one does.
            Ok(Observed::Unknown { error }) => tracing::warn!(
                trace_id = %target.trace_id,
                %error,
                "ack reaction's outcome is unknown: look at the message and settle it with `switchboard ledger reconcile`"
            ),
            outcome => tracing::debug!(trace_id = %target.trace_id, ?outcome, "ack reaction not set"),
        }
    }

    async fn act_once(
        &self,
        target: &MessageActionTarget,
        action: &MessageAction,
        purpose: AttemptPurpose,
        turn: Turn<'_>,
    ) -> Result<Observed, Refusal> {
        let message_id = action.message_id();
        let (api_method, text, params) = match action {
            MessageAction::React { emoji, .. } => (
                "setMessageReaction",
                *emoji,
                json!({
                    "chat_id": target.chat_id,
                    "message_id": message_id,
                    "reaction": [{"type": "emoji", "emoji": emoji}],
                }),
            ),
            MessageAction::Edit { text, html, .. } => {
                let mut params = json!({ "chat_id": target.chat_id, "message_id": message_id, "text": text });
                if *html {
                    params["parse_mode"] = json!("HTML");
                }
                ("editMessageText", text.as_str(), params)
            }
        };
        let attempt = NewAttempt {
            envelope_id: target.envelope_id,
            agent: &target.agent,
            request_id: Some(&target.request_id),
            purpose,
            method: action.method(),
            target_message_id: Some(message_id),
            chat_id: target.chat_id,
            thread_id: None,
            reply_to_message_id: None,
            chunk_index: 0,
            chunk_count: 1,
            text,
        };
        let read = move |exchange: &_| match action {
            // `true` on success: the message acted on is the one named.
            MessageAction::React { .. } => classify_as(exchange, |_done: bool| message_id),
            MessageAction::Edit { .. } => classify(exchange),
        };
        self.attempt_call(
            &attempt,
            &target.trace_id,
            Call { method: api_method, params: &params, read: &read, file: None },
            turn,
        )
        .await
    }
}
