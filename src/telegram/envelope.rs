//! Envelopes: what a Telegram update becomes before it enters the ledger.
//!
//! [`classify`] is the pure step from a teloxide `Update` to what the poller must do with
//! it; it does no I/O, so every kind of update can be tested with plain values.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use teloxide::types::{Chat, Message, Update, UpdateKind};

use crate::ids::TraceId;
use crate::rules::routes::Channel;

/// A new message or an edit of an earlier one. Edits are recorded as envelopes of their
/// own so later revision handling can relate them to the original message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeKind {
    Message,
    EditedMessage,
}

impl EnvelopeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::EditedMessage => "edited_message",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    pub id: Option<i64>,
    pub username: Option<String>,
    pub name: String,
}

/// @username when there is one, else the name: the `user` the model sees.
pub fn sender_display(username: Option<&str>, name: &str) -> String {
    match username {
        Some(username) => format!("@{username}"),
        None => name.to_owned(),
    }
}

/// Metadata of a non-text part of a message; the file itself stays with Telegram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub kind: String,
    pub file_id: Option<String>,
    /// A short human description: size, name, duration, emoji.
    pub detail: String,
}

/// A message as switchboard records it, before routing.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub trace_id: TraceId,
    pub update_id: i64,
    pub kind: EnvelopeKind,
    pub channel: Channel,
    pub chat_type: &'static str,
    pub chat_title: Option<String>,
    pub message_id: i32,
    pub sender: Sender,
    /// The text, or the caption of media.
    pub text: Option<String>,
    pub attachments: Vec<Attachment>,
    pub sent_at: DateTime<Utc>,
}

impl Envelope {
    /// What the model reads: the text, then one line per attachment.
    pub fn content(&self) -> String {
        let mut lines: Vec<String> = self.text.iter().cloned().collect();
        lines.extend(self.attachments.iter().map(|a| format!("[{}: {}]", a.kind, a.detail)));
        if lines.is_empty() {
            lines.push("[a message without text]".to_owned());
        }
        lines.join("\n")
    }
}

/// What the poller does with one update.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Envelope(Box<Envelope>),
    /// A group became a supergroup: routes naming the old chat id must change.
    Migrated {
        update_id: i64,
        from_chat_id: i64,
        to_chat_id: i64,
    },
    /// An update kind switchboard does not route (channel posts, reactions, …).
    Ignored {
        update_id: i64,
        kind: &'static str,
    },
    /// Telegram sent something teloxide could not parse.
    Malformed {
        update_id: i64,
    },
}

/// Telegram's forum General topic has id 1; it must be addressed without a thread id.
pub const GENERAL_TOPIC_ID: i32 = 1;

pub fn classify(update: &Update) -> Inbound {
    let update_id = i64::from(update.id.0);
    let (message, kind) = match &update.kind {
        UpdateKind::Message(m) => (m, EnvelopeKind::Message),
        UpdateKind::EditedMessage(m) => (m, EnvelopeKind::EditedMessage),
        UpdateKind::Error(_) => return Inbound::Malformed { update_id },
        other => return Inbound::Ignored { update_id, kind: update_kind_name(other) },
    };
    if let Some(to) = message.migrate_to_chat_id() {
        return Inbound::Migrated { update_id, from_chat_id: message.chat.id.0, to_chat_id: to.0 };
    }
    Inbound::Envelope(Box::new(envelope_from_message(update_id, kind, message)))
}

fn envelope_from_message(update_id: i64, kind: EnvelopeKind, message: &Message) -> Envelope {
    // Only forum topics define a channel; in other supergroups a thread id marks a reply
    // chain, which must not split one chat into many routes.
    let thread_id = message.thread_id.filter(|_| message.is_topic_message).map(|thread| thread.0.0);
    let sender = match &message.from {
        Some(user) => {
            Sender { id: Some(user.id.0 as i64), username: user.username.clone(), name: user.full_name() }
        }
        None => Sender {
            id: message.sender_chat.as_ref().map(|chat| chat.id.0),
            username: message.sender_chat.as_ref().and_then(|chat| chat.username().map(str::to_owned)),
            name: message
                .sender_chat
                .as_ref()
                .and_then(chat_title)
                .unwrap_or_else(|| "unknown sender".to_owned()),
        },
    };
    Envelope {
        trace_id: TraceId::generate(),
        update_id,
        kind,
        channel: Channel { chat_id: message.chat.id.0, thread_id },
        chat_type: chat_type(&message.chat),
        chat_title: chat_title(&message.chat),
        message_id: message.id.0,
        sender,
        text: message.text().or_else(|| message.caption()).map(str::to_owned),
        attachments: attachments(message),
        sent_at: message.date,
    }
}

fn chat_type(chat: &Chat) -> &'static str {
    if chat.is_private() {
        "private"
    } else if chat.is_supergroup() {
        "supergroup"
    } else if chat.is_group() {
        "group"
    } else if chat.is_channel() {
        "channel"
    } else {
        "unknown"
    }
}

fn chat_title(chat: &Chat) -> Option<String> {
    chat.title().map(str::to_owned).or_else(|| chat.first_name().map(str::to_owned))
}

fn attachments(message: &Message) -> Vec<Attachment> {
    let mut found = Vec::new();
    let mut push = |kind: &str, file_id: Option<String>, detail: String| {
        found.push(Attachment { kind: kind.to_owned(), file_id, detail });
    };
    if let Some(sizes) = message.photo() {
        // Telegram lists sizes smallest first; the largest is the photo itself.
        if let Some(largest) = sizes.last() {
            push("photo", Some(largest.file.id.to_string()), format!("{}x{}", largest.width, largest.height));
        }
    }
    if let Some(doc) = message.document() {
        let name = doc.file_name.clone().unwrap_or_else(|| "unnamed".into());
        let mime = doc.mime_type.as_ref().map(|m| format!(", {m}")).unwrap_or_default();
        push("document", Some(doc.file.id.to_string()), format!("{name}{mime}"));
    }
    if let Some(audio) = message.audio() {
        push("audio", Some(audio.file.id.to_string()), format!("{}s", audio.duration.seconds()));
    }
    if let Some(video) = message.video() {
        push("video", Some(video.file.id.to_string()), format!("{}s", video.duration.seconds()));
    }
    if let Some(voice) = message.voice() {
        push("voice", Some(voice.file.id.to_string()), format!("{}s", voice.duration.seconds()));
    }
    if let Some(animation) = message.animation() {
        push("animation", Some(animation.file.id.to_string()), format!("{}s", animation.duration.seconds()));
    }
    if let Some(sticker) = message.sticker() {
        push("sticker", Some(sticker.file.id.to_string()), sticker.emoji.clone().unwrap_or_default());
    }
    if let Some(location) = message.location() {
        push("location", None, format!("{}, {}", location.latitude, location.longitude));
    }
    if let Some(contact) = message.contact() {
        push("contact", None, contact.first_name.clone());
    }
    found
}

fn update_kind_name(kind: &UpdateKind) -> &'static str {
    match kind {
        UpdateKind::ChannelPost(_) => "channel_post",
        UpdateKind::EditedChannelPost(_) => "edited_channel_post",
        UpdateKind::CallbackQuery(_) => "callback_query",
        UpdateKind::InlineQuery(_) => "inline_query",
        UpdateKind::MyChatMember(_) => "my_chat_member",
        UpdateKind::ChatMember(_) => "chat_member",
        UpdateKind::MessageReaction(_) => "message_reaction",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Parses from text, as teloxide does with Telegram's answer: teloxide's `Update`
    /// visitor wants borrowed keys, which `serde_json::from_value` cannot give.
    fn update(value: serde_json::Value) -> Update {
        serde_json::from_str(&value.to_string()).expect("test update must deserialize")
    }

    fn private_chat() -> serde_json::Value {
        json!({"id": 42, "type": "private", "first_name": "Ann"})
    }

    fn from() -> serde_json::Value {
        json!({"id": 42, "is_bot": false, "first_name": "Ann", "last_name": "Lee", "username": "ann"})
    }

    fn envelope(inbound: Inbound) -> Envelope {
        match inbound {
            Inbound::Envelope(e) => *e,
            other => panic!("expected an envelope, got {other:?}"),
        }
    }

    #[test]
    fn text_message_in_a_private_chat() {
        let e = envelope(classify(&update(json!({
            "update_id": 7,
            "message": {"message_id": 3, "date": 1_700_000_000, "chat": private_chat(), "from": from(), "text": "hello"}
        }))));
        assert_eq!(e.update_id, 7);
        assert_eq!(e.kind, EnvelopeKind::Message);
        assert_eq!(e.channel, Channel { chat_id: 42, thread_id: None });
        assert_eq!(e.chat_type, "private");
        assert_eq!(e.message_id, 3);
        assert_eq!(sender_display(e.sender.username.as_deref(), &e.sender.name), "@ann");
        assert_eq!(e.sender.name, "Ann Lee");
        assert_eq!(e.content(), "hello");
        assert_eq!(e.sent_at.timestamp(), 1_700_000_000);
    }

    #[test]
    fn forum_topic_messages_carry_their_thread() {
        let chat = json!({"id": -100123, "type": "supergroup", "title": "Ops", "is_forum": true});
        let e = envelope(classify(&update(json!({
            "update_id": 8,
            "message": {"message_id": 9, "message_thread_id": 42, "is_topic_message": true, "date": 1_700_000_000,
                        "chat": chat, "from": from(), "text": "deploy?"}
        }))));
        assert_eq!(e.channel, Channel { chat_id: -100123, thread_id: Some(42) });
        assert_eq!(e.chat_type, "supergroup");
        assert_eq!(e.chat_title.as_deref(), Some("Ops"));
    }

    #[test]
    fn reply_threads_outside_forums_do_not_split_the_channel() {
        let chat = json!({"id": -100123, "type": "supergroup", "title": "Chat"});
        let e = envelope(classify(&update(json!({
            "update_id": 8,
            "message": {"message_id": 9, "message_thread_id": 5, "date": 1_700_000_000,
                        "chat": chat, "from": from(), "text": "re"}
        }))));
        assert_eq!(e.channel.thread_id, None);
    }

    #[test]
    fn photo_with_caption_keeps_both() {
        let e = envelope(classify(&update(json!({
            "update_id": 9,
            "message": {"message_id": 4, "date": 1_700_000_000, "chat": private_chat(), "from": from(),
                        "caption": "look",
                        "photo": [{"file_id": "small", "file_unique_id": "s", "width": 90, "height": 60},
                                  {"file_id": "big", "file_unique_id": "b", "width": 1280, "height": 853}]}
        }))));
        assert_eq!(e.text.as_deref(), Some("look"));
        assert_eq!(e.attachments[0].file_id.as_deref(), Some("big"));
        assert_eq!(e.content(), "look\n[photo: 1280x853]");
    }

    #[test]
    fn a_message_without_text_is_still_an_envelope() {
        let e = envelope(classify(&update(json!({
            "update_id": 10,
            "message": {"message_id": 5, "date": 1_700_000_000, "chat": private_chat(), "from": from(),
                        "location": {"latitude": 1.5, "longitude": 2.5}}
        }))));
        assert_eq!(e.text, None);
        assert_eq!(e.content(), "[location: 1.5, 2.5]");
    }

    #[test]
    fn edits_are_envelopes_of_their_own_kind() {
        let e = envelope(classify(&update(json!({
            "update_id": 11,
            "edited_message": {"message_id": 3, "date": 1_700_000_000, "edit_date": 1_700_000_100,
                               "chat": private_chat(), "from": from(), "text": "hello again"}
        }))));
        assert_eq!(e.kind, EnvelopeKind::EditedMessage);
        assert_eq!(e.message_id, 3);
    }

    #[test]
    fn migration_is_reported_not_enveloped() {
        let chat = json!({"id": -555, "type": "group", "title": "Old"});
        let inbound = classify(&update(json!({
            "update_id": 12,
            "message": {"message_id": 6, "date": 1_700_000_000, "chat": chat, "from": from(),
                        "migrate_to_chat_id": -1_000_000_000_555i64}
        })));
        assert_eq!(
            inbound,
            Inbound::Migrated { update_id: 12, from_chat_id: -555, to_chat_id: -1_000_000_000_555 }
        );
    }

    #[test]
    fn malformed_and_foreign_updates_are_named() {
        let malformed = update(json!({"update_id": 13, "message": {"nonsense": true}}));
        assert_eq!(classify(&malformed), Inbound::Malformed { update_id: 13 });
        let post = update(json!({"update_id": 14, "channel_post": {"message_id": 1, "date": 1_700_000_000,
            "chat": {"id": -100, "type": "channel", "title": "News"}, "text": "hi"}}));
        assert_eq!(classify(&post), Inbound::Ignored { update_id: 14, kind: "channel_post" });
    }
}
