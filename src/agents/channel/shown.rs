//! What this session was shown: the trace ids of the last envelopes pushed to it, by the
//! file each carries and by the chat message each is. The official plugin's tools name a
//! message by its chat and message id (`react`, `edit_message`) or a file by its id alone
//! (`download_attachment`); an agent that calls ours that way is understood through this
//! memory, and never reaches a conversation it was not shown.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::texts::Sighting;
use crate::agents::api::wire::DeliveredEnvelope;

/// Envelopes remembered; an older one must be named by its trace_id.
const SHOWN_KEPT: usize = 1024;

/// The memory, shared by the session forwarder (which notes) and the tools (which ask).
#[derive(Debug, Clone, Default)]
pub(super) struct SharedShown(Arc<Mutex<Shown>>);

impl SharedShown {
    /// Notes an envelope being pushed; whether it was pushed before (the last
    /// [`SHOWN_KEPT`] remembered).
    pub(super) fn note(&self, envelope: &DeliveredEnvelope) -> Sighting {
        self.lock().note(envelope)
    }

    pub(super) fn trace_id_of_file(&self, file_id: &str) -> Option<String> {
        self.lock().by_file.get(file_id).cloned()
    }

    pub(super) fn conversation_in(&self, chat_id: i64, message_id: Option<i64>) -> Result<String, String> {
        self.lock().conversation_in(chat_id, message_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shown> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One shown envelope, as the memory forgets it again.
#[derive(Debug)]
struct Noted {
    trace_id: String,
    file_id: Option<String>,
    message: Option<(i64, i64)>,
}

#[derive(Debug, Default)]
struct Shown {
    by_file: HashMap<String, String>,
    by_message: HashMap<(i64, i64), String>,
    /// The latest envelope of each chat: the conversation an action on a message the
    /// bot sent there (not one the session was shown) is made in.
    latest_in_chat: HashMap<i64, String>,
    order: VecDeque<Noted>,
}

impl Shown {
    fn note(&mut self, envelope: &DeliveredEnvelope) -> Sighting {
        // Shown again (redelivered): noted once, where it was first.
        if self.order.iter().any(|noted| noted.trace_id == envelope.trace_id) {
            return Sighting::Again;
        }
        let trace_id = envelope.trace_id.clone();
        let file_id = envelope.extra.get("attachment_file_id").cloned();
        if let Some(file_id) = &file_id {
            self.by_file.insert(file_id.clone(), trace_id.clone());
        }
        let message = in_a_chat(envelope).then_some((envelope.chat_id, i64::from(envelope.message_id)));
        if let Some(message) = message {
            self.by_message.insert(message, trace_id.clone());
            self.latest_in_chat.insert(message.0, trace_id.clone());
        }
        self.order.push_back(Noted { trace_id, file_id, message });
        while self.order.len() > SHOWN_KEPT {
            let Some(oldest) = self.order.pop_front() else { break };
            // Each map forgets the oldest only where a newer envelope has not taken its place.
            if let Some(file_id) = &oldest.file_id {
                forget(&mut self.by_file, file_id, &oldest.trace_id);
            }
            if let Some(message) = &oldest.message {
                forget(&mut self.by_message, message, &oldest.trace_id);
                forget(&mut self.latest_in_chat, &message.0, &oldest.trace_id);
            }
        }
        Sighting::First
    }

    /// The envelope an action named by chat (and message) is made for: the shown message
    /// itself, else the chat's latest shown envelope, whose conversation holds the bot's
    /// own messages there (the daemon checks that the message is one).
    fn conversation_in(&self, chat_id: i64, message_id: Option<i64>) -> Result<String, String> {
        if let Some(trace_id) = message_id.and_then(|message_id| self.by_message.get(&(chat_id, message_id)))
        {
            return Ok(trace_id.clone());
        }
        self.latest_in_chat.get(&chat_id).cloned().ok_or_else(|| {
            format!(
                "this session was shown no message of chat {chat_id} lately, so that chat is not one of your \
                 conversations: pass the trace_id of the <channel> tag of a message there. Nothing was sent"
            )
        })
    }
}

fn forget<K: std::hash::Hash + Eq>(map: &mut HashMap<K, String>, key: &K, trace_id: &str) {
    if map.get(key).is_some_and(|noted| noted == trace_id) {
        map.remove(key);
    }
}

/// Whether an envelope is a message of a Telegram chat (not work from another agent).
fn in_a_chat(envelope: &DeliveredEnvelope) -> bool {
    !matches!(envelope.kind.as_str(), "handoff" | "handoff_answer") && envelope.chat_type != "agent"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(trace_id: &str, chat_id: i64, message_id: i32) -> DeliveredEnvelope {
        DeliveredEnvelope {
            trace_id: trace_id.to_owned(),
            kind: "message".to_owned(),
            extra: Default::default(),
            content: "hi".to_owned(),
            chat_id,
            thread_id: None,
            chat_type: "private".to_owned(),
            chat_title: None,
            message_id,
            user: "alice".to_owned(),
            user_id: 1,
            ts: "2026-12-07T00:00:00Z".to_owned(),
            route: "dm".to_owned(),
            redelivered: false,
            edited: false,
        }
    }

    #[test]
    fn a_message_names_its_envelope_and_a_chat_its_latest() {
        let mut shown = Shown::default();
        shown.note(&envelope("env_a", 10, 1));
        shown.note(&envelope("env_b", 10, 2));
        shown.note(&envelope("env_c", 20, 1));
        assert_eq!(shown.conversation_in(10, Some(1)).as_deref(), Ok("env_a"));
        assert_eq!(shown.conversation_in(20, Some(1)).as_deref(), Ok("env_c"), "message ids are per chat");
        // A message the bot sent (never shown): the chat's latest conversation.
        assert_eq!(shown.conversation_in(10, Some(99)).as_deref(), Ok("env_b"));
        assert_eq!(shown.conversation_in(10, None).as_deref(), Ok("env_b"));
        assert!(shown.conversation_in(30, Some(1)).unwrap_err().contains("trace_id"));
    }

    #[test]
    fn an_envelope_pushed_again_is_seen_again() {
        let mut shown = Shown::default();
        assert_eq!(shown.note(&envelope("env_a", 10, 1)), Sighting::First);
        assert_eq!(shown.note(&envelope("env_b", 10, 2)), Sighting::First);
        assert_eq!(shown.note(&envelope("env_a", 10, 1)), Sighting::Again);
    }

    #[test]
    fn work_from_agents_names_no_chat() {
        let mut shown = Shown::default();
        let mut handoff = envelope("env_h", 10, 1);
        handoff.kind = "handoff".to_owned();
        shown.note(&handoff);
        assert!(shown.conversation_in(10, Some(1)).is_err());
    }

    #[test]
    fn a_shown_file_names_its_message() {
        let mut shown = Shown::default();
        let mut with_file = envelope("env_a", 10, 1);
        with_file.extra.insert("attachment_file_id".to_owned(), "f1".to_owned());
        shown.note(&with_file);
        assert_eq!(shown.by_file.get("f1").map(String::as_str), Some("env_a"));
        assert_eq!(shown.by_file.get("f2"), None);
    }

    #[test]
    fn only_the_latest_are_kept_and_a_newer_envelope_keeps_its_place() {
        let mut shown = Shown::default();
        let mut with_file = envelope("env_old", 10, 1);
        with_file.extra.insert("attachment_file_id".to_owned(), "f1".to_owned());
        shown.note(&with_file);
        // Chat 20's latest is noted second and stays the latest while chat 30 fills up.
        shown.note(&envelope("env_chat20", 20, 1));
        for n in 0..SHOWN_KEPT - 1 {
            shown.note(&envelope(&format!("env_{n}"), 30, n as i32 + 1));
        }
        assert_eq!(shown.order.len(), SHOWN_KEPT);
        assert_eq!(shown.by_file.get("f1"), None, "the oldest is forgotten");
        assert!(shown.conversation_in(10, Some(1)).is_err());
        assert_eq!(shown.conversation_in(20, None).as_deref(), Ok("env_chat20"));
        shown.note(&envelope("env_next", 30, 5_000));
        assert!(shown.conversation_in(20, None).is_err(), "forgotten in its turn");
        assert_eq!(shown.by_message.len(), SHOWN_KEPT);
        assert_eq!(shown.latest_in_chat.len(), 1);
    }
}
