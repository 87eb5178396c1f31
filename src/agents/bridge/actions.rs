//! The tools that act on a message rather than post one (issue 22): `react` and
//! `edit_message`. Both act in the conversation of one of the caller's envelopes, are
//! checked before anything is sent (the emoji, the message, the format), and are made as
//! attempts admitted against the envelope's task (DESIGN.md §11). Neither answers the
//! envelope.

use futures::FutureExt;

use super::{Bridge, RunningAction, ToolError};
use crate::agents::api::wire::{EditRequest, MessageActionReceipt, ReactRequest};
use crate::ids::{AgentName, RequestId, TraceId};
use crate::ledger::{
    AttemptMethod, AttemptState, EnvelopeKind, ReconciledOutcome, StoredAttempt, StoredEnvelope,
};
use crate::rules::resolver::ResolveError;
use crate::telegram::envelope::ChatType;
use crate::telegram::format::ReplyFormat;
use crate::telegram::outbound::{MessageAction, MessageActionTarget, Observed, TELEGRAM_TEXT_LIMIT};
use crate::telegram::reactions::allowed_reaction;

impl Bridge {
    /// `react`: a reaction on the envelope's message, or on a message the bot sent in its
    /// chat.
    pub async fn react(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: ReactRequest,
    ) -> Result<MessageActionReceipt, ToolError> {
        self.live_session(agent, token)?;
        let request_id = RequestId::parse(&request.request_id).map_err(ToolError::Invalid)?;
        let trace_id = TraceId::parse(&request.trace_id).map_err(ToolError::Invalid)?;
        let emoji = allowed_reaction(&request.emoji).map_err(ToolError::Invalid)?;
        let decide = async {
            let envelope =
                self.conversation_for_action(agent, &trace_id, request.chat_id, "react to").await?;
            let message_id = match request.message_id {
                None => message_id_of(envelope.message_id)?,
                Some(id) if id == envelope.message_id => message_id_of(id)?,
                Some(id) => {
                    let id = message_id_of(id)?;
                    if self.inner.ledger.bot_message(envelope.chat_id, id).await?.is_none() {
                        return Err(ToolError::Invalid(format!(
                            "message {id} is neither the message of {trace_id} nor one the bot sent in its chat \
                             ({}); you can react only in the conversation of your envelope. Nothing was sent",
                            envelope.chat_id
                        )));
                    }
                    id
                }
            };
            Ok((envelope, MessageAction::React { message_id, emoji }))
        };
        self.act_once(agent, request_id, &trace_id, decide).await
    }

    /// `edit_message`: new text for a message the bot sent for this agent in the
    /// envelope's chat.
    pub async fn edit_message(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: EditRequest,
    ) -> Result<MessageActionReceipt, ToolError> {
        self.live_session(agent, token)?;
        let request_id = RequestId::parse(&request.request_id).map_err(ToolError::Invalid)?;
        let trace_id = TraceId::parse(&request.trace_id).map_err(ToolError::Invalid)?;
        if request.text.trim().is_empty() {
            return Err(ToolError::Invalid("the new text is empty; nothing was edited".into()));
        }
        let format = ReplyFormat::parse(request.format.as_deref()).map_err(ToolError::Invalid)?;
        let (mut parts, html) = format.parts(&request.text, TELEGRAM_TEXT_LIMIT);
        if parts.len() > 1 {
            return Err(ToolError::Invalid(format!(
                "the new text needs {} Telegram messages and an edit replaces one; shorten it, or send the rest \
                 with reply. Nothing was edited",
                parts.len()
            )));
        }
        let message_id = message_id_of(request.message_id)?;
        let decide = async {
            let envelope =
                self.conversation_for_action(agent, &trace_id, request.chat_id, "edit a message of").await?;
            let sent_by = self.inner.ledger.bot_message(envelope.chat_id, message_id).await?;
            let refusal = match sent_by {
                Some((sender, AttemptMethod::SendMessage)) if sender == agent.as_str() => None,
                Some((sender, AttemptMethod::SendMessage)) => {
                    Some(format!("message {message_id} was not sent for you (it was sent for '{sender}')"))
                }
                Some((_, method)) => Some(format!("message {message_id} is not a text message ({method})")),
                None => Some(format!(
                    "the bot sent no message {message_id} in the chat of {trace_id} ({}) that the switchboard knows \
                     of",
                    envelope.chat_id
                )),
            };
            if let Some(why) = refusal {
                tracing::warn!(%agent, %trace_id, message_id, "edit refused: {why}");
                return Err(ToolError::Invalid(format!(
                    "{why}; you can edit only the messages you sent in the conversation of your envelope. Nothing \
                     was edited"
                )));
            }
            Ok((envelope, MessageAction::Edit { message_id, text: parts.remove(0), html }))
        };
        self.act_once(agent, request_id, &trace_id, decide).await
    }

    /// One of the caller's envelopes with a Telegram conversation, in the chat the caller
    /// named if it named one, whose task still admits what is done for it (a superseded
    /// envelope is refused by its task, naming the one to act on; the attempt itself is
    /// admitted again when it is recorded).
    async fn conversation_for_action(
        &self,
        agent: &AgentName,
        trace_id: &TraceId,
        said_chat: Option<i64>,
        what: &str,
    ) -> Result<StoredEnvelope, ToolError> {
        let found = self.inner.ledger.find(trace_id).await?;
        let Some(envelope) = found.filter(|envelope| envelope.agent.as_deref() == Some(agent.as_str()))
        else {
            return Err(ToolError::Refused(ResolveError::UnknownTraceId { trace_id: trace_id.to_string() }));
        };
        let no_chat = match envelope.kind {
            EnvelopeKind::Handoff | EnvelopeKind::HandoffAnswer => true,
            EnvelopeKind::Revision => envelope.chat_type == ChatType::Agent,
            EnvelopeKind::Message
            | EnvelopeKind::EditedMessage
            | EnvelopeKind::Unknown
            | EnvelopeKind::RoomTurn => false,
        };
        if no_chat {
            return Err(ToolError::Invalid(format!(
                "{trace_id} came from another agent, not from a Telegram chat: there is no message to {what} it. \
                 Nothing was sent"
            )));
        }
        if let Some(chat_id) = said_chat.filter(|&chat_id| chat_id != envelope.chat_id) {
            return Err(ToolError::Invalid(format!(
                "{trace_id} is a message of chat {}, not of chat {chat_id}: nothing was sent. Pass the chat_id and \
                 trace_id of one <channel> tag",
                envelope.chat_id
            )));
        }
        self.refuse_if_task_moved_on(agent, Some(&envelope)).await?;
        Ok(envelope)
    }

    /// Makes the action `decide` settles on, once per request id: a request whose id is
    /// being acted on awaits that action's outcome, and one whose id was acted on before is
    /// told what it came to. Neither decides or acts again. The plugin asks again with the
    /// same id when its connection broke during a call, while the first may still be on
    /// its way to Telegram.
    async fn act_once(
        &self,
        agent: &AgentName,
        request_id: RequestId,
        trace_id: &TraceId,
        decide: impl Future<Output = Result<(StoredEnvelope, MessageAction), ToolError>>,
    ) -> Result<MessageActionReceipt, ToolError> {
        let slot = self.slot(agent);
        let running = {
            // Finding no earlier request and registering this one are one step for the agent.
            let _decide = slot.decisions.lock().await;
            let running = slot.running().actions.get(request_id.as_str()).cloned();
            match running {
                Some(running) => running,
                None => match self.inner.ledger.action_attempt(agent.as_str(), request_id.as_str()).await? {
                    Some(attempt) => return recorded_action(trace_id.as_str(), &attempt),
                    None => {
                        let (envelope, action) = decide.await?;
                        self.start_action(agent, &envelope, request_id, action)
                    }
                },
            }
        };
        running.await
    }

    /// Starts making the action as a task the daemon waits for, so a caller that goes away
    /// cannot cut it between its attempt and its outcome; the returned future only
    /// observes it. Registered as running before the task can finish, so a repeated
    /// request always finds it (running, or recorded in the ledger).
    fn start_action(
        &self,
        agent: &AgentName,
        envelope: &StoredEnvelope,
        request_id: RequestId,
        action: MessageAction,
    ) -> RunningAction {
        let target = MessageActionTarget {
            envelope_id: envelope.id,
            trace_id: envelope.trace_id.to_string(),
            agent: agent.to_string(),
            chat_id: envelope.chat_id,
            request_id: request_id.to_string(),
        };
        let mut running = self.slot(agent).running();
        let done =
            ActionDone { bridge: self.clone(), agent: agent.clone(), request_id: target.request_id.clone() };
        let outbound = self.inner.outbound.clone();
        let action_now = action.clone();
        let task = self.inner.tasks.spawn(async move {
            let _done = done;
            let observed = match outbound.act(&target, &action).await {
                Ok(observed) => observed,
                Err(failure) => return Err(ToolError::from(failure)),
            };
            tracing::info!(agent = %target.agent, trace_id = %target.trace_id, ?action, ?observed, "message action");
            action_outcome(&target.trace_id, target.chat_id, &action, observed)
        });
        let (trace_id, chat_id) = (envelope.trace_id.to_string(), envelope.chat_id);
        let observed: RunningAction = async move {
            task.await.unwrap_or_else(|failure| {
                let error = format!("the task making it failed: {failure}");
                action_outcome(&trace_id, chat_id, &action_now, Observed::Unknown { error })
            })
        }
        .boxed()
        .shared();
        running.actions.insert(request_id.to_string(), observed.clone());
        observed
    }
}

/// Takes a finished action off the running ones, however its task ends.
struct ActionDone {
    bridge: Bridge,
    agent: AgentName,
    request_id: String,
}

impl Drop for ActionDone {
    fn drop(&mut self) {
        self.bridge.slot(&self.agent).running().actions.remove(&self.request_id);
    }
}

/// A Telegram message id as the Bot API takes it.
fn message_id_of(id: i64) -> Result<i32, ToolError> {
    i32::try_from(id)
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ToolError::Invalid(format!("{id} is not a Telegram message id; nothing was sent")))
}

fn describe(action: &MessageAction) -> String {
    match action {
        MessageAction::React { message_id, emoji } => format!("the reaction {emoji} on message {message_id}"),
        MessageAction::Edit { message_id, .. } => format!("the edit of message {message_id}"),
    }
}

/// What the agent is told of an action's outcome.
fn action_outcome(
    trace_id: &str,
    chat_id: i64,
    action: &MessageAction,
    observed: Observed,
) -> Result<MessageActionReceipt, ToolError> {
    match (observed, action) {
        (Observed::Sent { .. }, MessageAction::React { message_id, emoji }) => Ok(MessageActionReceipt {
            trace_id: trace_id.to_owned(),
            chat_id,
            message_id: *message_id,
            action: "reaction".into(),
            emoji: Some((*emoji).to_owned()),
        }),
        (Observed::Sent { .. }, MessageAction::Edit { message_id, .. }) => Ok(MessageActionReceipt {
            trace_id: trace_id.to_owned(),
            chat_id,
            message_id: *message_id,
            action: "edit".into(),
            emoji: None,
        }),
        (Observed::NotSent { error, .. }, _) => {
            // The message already reads as asked: the same edit again can never succeed.
            let advice = if error.contains("message is not modified") {
                "the message already shows this text: there is nothing to change"
            } else {
                "you may try again"
            };
            Err(ToolError::ActionNotSent(format!(
                "Telegram did not take {} ({trace_id}): {error}. Nothing changed in the chat; {advice}",
                describe(action)
            )))
        }
        (Observed::Unknown { error }, _) => Err(ToolError::ActionUnknown(format!(
            "{} ({trace_id}) may or may not have taken effect ({error}); it is recorded for an operator. Do not \
             repeat it",
            describe(action)
        ))),
    }
}

/// A recorded reaction or edit attempt, as the outcome of a repeated request.
fn recorded_action(trace_id: &str, attempt: &StoredAttempt) -> Result<MessageActionReceipt, ToolError> {
    let message_id = attempt.target_message_id.and_then(|id| i32::try_from(id).ok()).unwrap_or_default();
    let action = match attempt.method {
        AttemptMethod::SetReaction => {
            MessageAction::React { message_id, emoji: allowed_reaction(&attempt.text).unwrap_or("👍") }
        }
        _ => MessageAction::Edit { message_id, text: attempt.text.clone(), html: false },
    };
    let effective = match attempt.reconciled_outcome {
        Some(ReconciledOutcome::Sent) => AttemptState::Sent,
        Some(ReconciledOutcome::NotSent) => AttemptState::NotSent,
        None => attempt.outcome,
    };
    let error = attempt.error.clone().unwrap_or_default();
    let observed = match effective {
        AttemptState::Sent => Observed::Sent { message_id },
        AttemptState::NotSent => Observed::NotSent { error, retry_after: None, migrated_to: None },
        AttemptState::Unknown | AttemptState::InFlight => Observed::Unknown { error },
    };
    action_outcome(trace_id, attempt.chat_id, &action, observed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(method: AttemptMethod, outcome: AttemptState, text: &str) -> StoredAttempt {
        StoredAttempt {
            op_id: "op_xxxxxxxxxx".into(),
            request_id: Some("req_abcdefgh".into()),
            method,
            target_message_id: Some(77),
            chat_id: 42,
            thread_id: None,
            reply_to_message_id: None,
            chunk_index: 0,
            chunk_count: 1,
            text: text.into(),
            outcome,
            telegram_message_id: Some(77),
            error: Some("Bad Request: message to react not found".into()),
            started_at: chrono::Utc::now(),
            finished_at: None,
            reconciled_outcome: None,
            reconciled_reason: None,
        }
    }

    #[test]
    fn a_repeated_request_is_answered_with_what_the_first_came_to() {
        let done = recorded_action("env_x", &recorded(AttemptMethod::SetReaction, AttemptState::Sent, "👀"))
            .unwrap();
        assert_eq!(
            (done.message_id, done.action.as_str(), done.emoji.as_deref()),
            (77, "reaction", Some("👀"))
        );
        let edited =
            recorded_action("env_x", &recorded(AttemptMethod::EditMessage, AttemptState::Sent, "v2"))
                .unwrap();
        assert_eq!((edited.action.as_str(), edited.emoji), ("edit", None));
        let refused =
            recorded_action("env_x", &recorded(AttemptMethod::SetReaction, AttemptState::NotSent, "👀"));
        assert!(
            matches!(&refused, Err(ToolError::ActionNotSent(text)) if text.contains("not found")),
            "{refused:?}"
        );
        for unknown in [AttemptState::Unknown, AttemptState::InFlight] {
            let unknown = recorded_action("env_x", &recorded(AttemptMethod::EditMessage, unknown, "v2"));
            assert!(
                matches!(&unknown, Err(ToolError::ActionUnknown(text)) if text.contains("Do not")),
                "{unknown:?}"
            );
        }
        let mut reconciled = recorded(AttemptMethod::SetReaction, AttemptState::Unknown, "👀");
        reconciled.reconciled_outcome = Some(ReconciledOutcome::Sent);
        assert!(recorded_action("env_x", &reconciled).is_ok());
    }

    #[test]
    fn message_ids_are_positive_and_fit_telegrams() {
        assert_eq!(message_id_of(5).unwrap(), 5);
        for bad in [0, -3, i64::from(i32::MAX) + 1] {
            assert!(matches!(message_id_of(bad), Err(ToolError::Invalid(_))), "{bad}");
        }
    }
}
