//! How the daemon presents the envelopes it keeps to an agent: the wire's views of a
//! stored envelope. The ledger stores rows; what of them an agent sees, and in which
//! shape, is decided here, on the API's side.

use crate::agents::api::wire::{DeliveredEnvelope, PendingSummary};
use crate::ledger::StoredEnvelope;
use crate::telegram::envelope::EnvelopeKind;
use crate::telegram::parts::attachment_meta;

/// An envelope in a list of those waiting for an answer (`pending`, a refusal's candidates).
pub fn summary(envelope: &StoredEnvelope) -> PendingSummary {
    PendingSummary {
        trace_id: envelope.trace_id.to_string(),
        chat_id: envelope.chat_id,
        thread_id: envelope.thread_id(),
        chat_title: envelope.chat_title.clone(),
        user: envelope.user(),
        route: envelope.route.clone().unwrap_or_default(),
        ts: crate::clock::text(envelope.sent_at),
        preview: envelope.preview(),
        replying: false,
    }
}

/// An envelope as its agent's session receives it.
pub fn delivered(envelope: &StoredEnvelope, redelivered: bool) -> DeliveredEnvelope {
    DeliveredEnvelope {
        trace_id: envelope.trace_id.to_string(),
        kind: envelope.kind.meta_kind().to_owned(),
        extra: {
            let mut extra = envelope.task_meta();
            extra.extend(attachment_meta(&envelope.attachment_list()));
            extra
        },
        content: envelope.content.clone(),
        chat_id: envelope.chat_id,
        thread_id: envelope.thread_id(),
        chat_type: envelope.chat_type.to_string(),
        chat_title: envelope.chat_title.clone(),
        message_id: i32::try_from(envelope.message_id).unwrap_or_default(),
        user: envelope.user(),
        user_id: envelope.sender_id.unwrap_or_default(),
        ts: crate::clock::text(envelope.sent_at),
        route: envelope.route.clone().unwrap_or_default(),
        redelivered,
        edited: envelope.kind == EnvelopeKind::EditedMessage,
    }
}
