//! What both backends write about tasks (DESIGN.md §11) and decide alike, apart from the
//! statements that write it: which human messages belong to a task, how a change's carrier
//! and a revision's snapshot are written, and who the lineage names.

use serde_json::json;

use crate::domain::{EnvelopeKind, EnvelopeState, RoutedEnvelope};
use crate::ids::TraceId;
use crate::rules::revisions::{self, TaskEffects};

/// A task's effects as a revision's snapshot stores them.
pub(crate) fn snapshot_json(effects: &TaskEffects) -> String {
    json!({
        "confirmed": effects.confirmed.iter().map(|(op, message)| json!({"op_id": op, "message_id": message})).collect::<Vec<_>>(),
        "unresolved": effects.unresolved,
        "open_handoffs": effects.open_handoffs.iter().map(|(id, to)| json!({"handoff_id": id, "to": to})).collect::<Vec<_>>(),
    })
    .to_string()
}

/// The envelope a change came with: turned into the task's `revision` envelope (a human
/// message or edit), or kept as it is and re-tagged (an agent's declaration about it).
#[derive(Debug, Clone)]
pub(crate) struct Carrier {
    pub(crate) id: i64,
    pub(crate) trace_id: TraceId,
    pub(crate) message_id: Option<i64>,
    pub(crate) chat_id: i64,
    pub(crate) thread_id: Option<i64>,
    pub(crate) route: String,
    pub(crate) agent: String,
    /// Whether the carrier becomes a `revision` envelope (a human's command or edit).
    pub(crate) rewrite: bool,
}

/// Whether a newly stored row is a human message of a single-agent conversation, which
/// belongs to a task.
pub(crate) fn belongs_to_a_task(routed: &RoutedEnvelope) -> bool {
    routed.state == EnvelopeState::Queued
        && routed.agent.is_some()
        && matches!(routed.envelope.kind, EnvelopeKind::Message | EnvelopeKind::EditedMessage)
}

/// A conversation: chat, topic, agent.
pub(crate) type Conversation = (i64, Option<i64>, String);

/// Whether a human message is plainly work: not an edit and not a command. Work joins the
/// conversation's open task or starts one, whatever that task's state.
pub(crate) fn plain_work(routed: &RoutedEnvelope, bot_username: Option<&str>) -> bool {
    let e = &routed.envelope;
    let text = e.text.as_deref().unwrap_or_default();
    e.kind == EnvelopeKind::Message
        && revisions::parse_command(text, bot_username.unwrap_or_default()).is_none()
}

/// The sender as the lineage names them: @username, else their name.
pub(crate) fn sender_of(routed: &RoutedEnvelope) -> String {
    let sender = &routed.envelope.sender;
    sender.username.as_ref().map_or_else(|| sender.name.clone(), |u| format!("@{u}"))
}

pub(crate) fn carrier_of(routed: &RoutedEnvelope, id: i64) -> Carrier {
    let e = &routed.envelope;
    Carrier {
        id,
        trace_id: e.trace_id.clone(),
        message_id: Some(i64::from(e.message_id)),
        chat_id: e.channel.chat_id,
        thread_id: e.channel.thread_id.map(i64::from),
        route: routed.route.as_ref().map(ToString::to_string).unwrap_or_default(),
        agent: routed.agent.as_ref().map(ToString::to_string).unwrap_or_default(),
        rewrite: true,
    }
}

/// The key of the bot's answer to a message (a `/status`, or why nothing changed).
pub(crate) fn answer_key(carrier: &Carrier) -> String {
    format!("{}/answer", carrier.trace_id)
}
