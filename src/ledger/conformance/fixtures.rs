//! Envelopes, attempts, reactions and permission requests the rules are checked with.

use chrono::Utc;

use crate::ids::{AgentName, RouteName, TraceId};
use crate::ledger::*;
use crate::rules::routes::Channel;
use crate::telegram::envelope::{ChatType, Envelope, EnvelopeKind, Sender};

pub(crate) fn routed(update_id: i64, state: EnvelopeState) -> RoutedEnvelope {
    RoutedEnvelope {
        envelope: Envelope {
            trace_id: TraceId::generate(),
            update_id,
            kind: EnvelopeKind::Message,
            channel: Channel { chat_id: 42, thread_id: None },
            chat_type: ChatType::Private,
            chat_title: Some("Ann".into()),
            message_id: update_id as i32,
            sender: Sender { id: Some(42), username: Some("ann".into()), name: "Ann".into() },
            text: Some(format!("message {update_id}")),
            attachments: vec![],
            described: None,
            context: Default::default(),
            sent_at: Utc::now(),
        },
        state,
        route: Some(RouteName::parse("dm").unwrap()),
        agent: Some(AgentName::parse("orch").unwrap()),
        update_digest: format!("digest of update {update_id}"),
        note: None,
        raw_update: None,
    }
}

/// A photo of album `group` in `orch`'s chat, recorded by its `mention_only` route as work
/// when `addressed` (its caption mentions the bot), else as not addressed to the bot.
pub(crate) fn album_item(update_id: i64, group: &str, addressed: bool) -> RoutedEnvelope {
    let mut row = routed(update_id, EnvelopeState::Queued);
    row.envelope.context.album = Some(group.into());
    row.envelope.text = addressed.then(|| "@the_bot which is best?".into());
    if !addressed {
        row.state = EnvelopeState::Ignored;
        row.agent = None;
        row.note = Some("not addressed to the bot (route dm is mention_only)".into());
    }
    row
}

/// `routed(update_id)`, queued, saying `text` in chat `chat_id`.
pub(crate) fn in_chat(update_id: i64, chat_id: i64, text: &str) -> RoutedEnvelope {
    let mut row = routed(update_id, EnvelopeState::Queued);
    row.envelope.channel.chat_id = chat_id;
    row.envelope.text = Some(text.into());
    row
}

pub(crate) fn reply_attempt(
    envelope_id: i64,
    request_id: &'static str,
    chunk_index: usize,
    chunk_count: usize,
) -> NewAttempt<'static> {
    NewAttempt {
        request_id: Some(request_id),
        reply_to_message_id: Some(1),
        chunk_index,
        chunk_count,
        text: "part",
        ..one_part_reply(envelope_id)
    }
}

/// `orch`'s one-part reply to envelope `envelope_id`.
pub(crate) fn one_part_reply(envelope_id: i64) -> NewAttempt<'static> {
    NewAttempt {
        envelope_id,
        agent: "orch",
        request_id: None,
        purpose: AttemptPurpose::Reply,
        method: AttemptMethod::SendMessage,
        target_message_id: None,
        chat_id: 42,
        thread_id: None,
        reply_to_message_id: None,
        chunk_index: 0,
        chunk_count: 1,
        text: "reply",
    }
}

/// A human message handed to `orch`'s session, recorded with update 1: pending, and the
/// first message of its task.
pub(crate) async fn one_pending_message(ledger: &dyn Storage) -> StoredEnvelope {
    let orch = AgentName::parse("orch").unwrap();
    let batch = [routed(1, EnvelopeState::Queued)];
    ledger.record_batch_handing_over(1, 2, &batch, &[&orch], None).await.unwrap();
    ledger.pending(&orch).await.unwrap().remove(0)
}

/// `orch`'s reaction (`set_reaction`) to message `target` of envelope `envelope_id`.
pub(crate) fn reaction(envelope_id: i64, request_id: &'static str, target: i32) -> NewAttempt<'static> {
    NewAttempt {
        request_id: Some(request_id),
        method: AttemptMethod::SetReaction,
        target_message_id: Some(target),
        text: "👍",
        ..one_part_reply(envelope_id)
    }
}

/// `routed(update_id)` quoting message `quoted` of its chat.
pub(crate) fn quoting(update_id: i64, quoted: i32) -> RoutedEnvelope {
    let mut row = routed(update_id, EnvelopeState::Queued);
    row.envelope.context.quoted = Some(crate::telegram::parts::Quoted {
        message_id: quoted,
        text: Some("quoted".into()),
        sender_id: None,
    });
    row
}

pub(crate) fn reaction_on(update_id: i64, message_id: i32, emoji: &[&str]) -> RoutedReaction {
    RoutedReaction {
        reaction: crate::telegram::envelope::Reaction {
            update_id,
            chat_id: 42,
            message_id,
            user_id: Some(42),
            user: "@ann".into(),
            emoji: emoji.iter().map(|e| (*e).to_owned()).collect(),
            date: Utc::now(),
        },
        update_digest: format!("digest of update {update_id}"),
        sender_rejected: false,
    }
}

/// `orchestrator`'s request `abcde` to run `ls`, asked by plugin process `plugin`.
pub(crate) fn permission_request<'a>(
    id: &'a str,
    plugin: &'a str,
    expires_at: &'a str,
) -> NewPermissionRequest<'a> {
    NewPermissionRequest {
        id,
        agent: "orchestrator",
        session_id: "ses_1",
        plugin_id: plugin,
        request_id: "abcde",
        tool_name: "Bash",
        description: "run ls",
        input_preview: "{\"command\":\"ls\"}",
        expires_at,
        route: "dm",
        chat_id: 42,
        thread_id: None,
    }
}
