//! Envelopes: what a Telegram update becomes before it enters the ledger.
//!
//! [`read`] takes one update as raw JSON and decodes it on its own, so an update teloxide
//! cannot decode (or panics on) is kept as [`Inbound::Undecodable`] instead of taking its
//! batch or the poller down. [`classify`] is the pure step from a decoded `Update` to what
//! the poller must do with it; neither does I/O, so every kind of update can be tested with
//! plain values.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{self, UnwindSafe};
use std::sync::Once;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use teloxide::types::{Chat, ChatMigration, Message, MessageEntity, MessageKind, Update, UpdateKind};

use crate::ids::TraceId;
use crate::rules::dates;
use crate::rules::routes::Channel;
use crate::telegram::updates::RawUpdate;
use crate::telegram::{lenient, parts};

pub use crate::ledger::EnvelopeKind;

/// The kind of chat a message came from, as Telegram names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatType {
    Private,
    Group,
    Supergroup,
    Channel,
    /// Not known: a chat teloxide could not classify, or an undecodable update.
    Unknown,
    /// No chat at all: an envelope an agent made (a handoff or its answer).
    Agent,
}

impl ChatType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Private => "private",
            Self::Group => "group",
            Self::Supergroup => "supergroup",
            Self::Channel => "channel",
            Self::Unknown => "unknown",
            Self::Agent => "agent",
        }
    }

    fn of(chat: &Chat) -> Self {
        if chat.is_private() {
            Self::Private
        } else if chat.is_supergroup() {
            Self::Supergroup
        } else if chat.is_group() {
            Self::Group
        } else if chat.is_channel() {
            Self::Channel
        } else {
            Self::Unknown
        }
    }

    /// From the Bot API's `Chat.type`.
    fn from_api(name: &str) -> Self {
        match name {
            "private" => Self::Private,
            "group" => Self::Group,
            "supergroup" => Self::Supergroup,
            "channel" => Self::Channel,
            _ => Self::Unknown,
        }
    }
}

impl fmt::Display for ChatType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
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

pub use crate::telegram::parts::{Attachment, AttachmentKind, Context, Reaction};

/// A message as switchboard records it, before routing.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub trace_id: TraceId,
    pub update_id: i64,
    pub kind: EnvelopeKind,
    pub channel: Channel,
    pub chat_type: ChatType,
    pub chat_title: Option<String>,
    pub message_id: i32,
    pub sender: Sender,
    /// The text, or the caption of media, with the URLs of its links written out.
    pub text: Option<String>,
    pub attachments: Vec<Attachment>,
    /// A shared location, contact, venue or dice throw, as text.
    pub described: Option<String>,
    /// The message it quotes, where it was forwarded from.
    pub context: Context,
    pub sent_at: DateTime<Utc>,
}

impl Envelope {
    /// What the model reads: the text or caption; for a file without one, a short
    /// placeholder (`(voice message, 0:12)`); a location, contact or venue as text.
    pub fn content(&self) -> String {
        self.text
            .clone()
            .or_else(|| self.attachments.first().map(Attachment::placeholder))
            .or_else(|| self.described.clone())
            .unwrap_or_else(|| "[a message without text]".to_owned())
    }
}

/// What the poller does with one update.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// A message, to be routed.
    Envelope(Box<Envelope>),
    /// A message kept for audit that is no work for an agent: a service message or a
    /// live-location edit. `reason` says which.
    Ignored { envelope: Box<Envelope>, reason: String },
    /// A group became a supergroup: routes naming the old chat id must change. The service
    /// message itself is kept like any other ignored one.
    Migrated { envelope: Box<Envelope>, reason: String, to_chat_id: i64 },
    /// A user's reaction to a message: recorded, and a notice for the agent whose reply
    /// it is about (intake decides whether it is one).
    Reaction(Box<Reaction>),
    /// An update that is not a message (channel posts, callback queries, …): switchboard
    /// does not record these.
    NotAMessage { update_id: i64, kind: &'static str },
    /// An update that could not be decoded or converted; it is kept raw. `update_id` is
    /// `None` when not even that could be read.
    Undecodable { update_id: Option<i64>, reason: String },
}

/// Telegram's forum General topic has id 1; it must be addressed without a thread id.
pub const GENERAL_TOPIC_ID: i32 = 1;

/// Decodes one raw update and classifies it. A decoder that fails or panics, and a
/// conversion that panics, make it [`Inbound::Undecodable`]; nothing here can fail the
/// batch or the poller.
pub fn read(raw: &RawUpdate) -> Inbound {
    let update_id = raw.update_id;
    let update = match catching_panics(|| serde_json::from_str::<Update>(&raw.text)) {
        Ok(Ok(update)) => update,
        Ok(Err(e)) => {
            return Inbound::Undecodable { update_id, reason: format!("teloxide cannot read it: {e}") };
        }
        Err(panic) => {
            return Inbound::Undecodable {
                update_id,
                reason: format!("teloxide panicked reading it: {panic}"),
            };
        }
    };
    // teloxide reads a message it cannot read whole as a message with no content at all:
    // a voice note, an audio file, a video or an animation without `mime_type` (which the
    // Bot API makes optional), or a text with an entity of a kind newer than teloxide. It
    // is read again, repaired; one still unreadable is kept raw, never taken for a service
    // message, since a user wrote it.
    let update = if unreadable_content(&update) {
        let repaired = repaired_for_teloxide(&raw.text)
            .and_then(|text| catching_panics(|| serde_json::from_str::<Update>(&text)).ok()?.ok())
            .unwrap_or(update);
        if unreadable_content(&repaired) && has_content(&raw.text) {
            return Inbound::Undecodable {
                update_id,
                reason: "teloxide cannot read the content of this message (a field newer than it?)".into(),
            };
        }
        repaired
    } else {
        update
    };
    match catching_panics(|| classify(&update)) {
        Ok(inbound) => inbound,
        Err(panic) => Inbound::Undecodable {
            update_id: Some(i64::from(update.id.0)),
            reason: format!("converting it panicked: {panic}"),
        },
    }
}

/// The files whose `mime_type` teloxide needs present (`null` will do).
const FILES_NEEDING_A_MIME_TYPE: [&str; 4] = ["voice", "audio", "video", "animation"];

/// Whether teloxide read a message with nothing in it.
fn unreadable_content(update: &Update) -> bool {
    matches!(&update.kind, UpdateKind::Message(m) | UpdateKind::EditedMessage(m) if matches!(m.kind, MessageKind::Empty {}))
}

/// The message object of a raw update (`message` or `edited_message`).
fn message_of(update: &mut serde_json::Value) -> Option<&mut serde_json::Value> {
    let key = ["message", "edited_message"]
        .into_iter()
        .find(|key| update.get(key).is_some_and(serde_json::Value::is_object))?;
    update.get_mut(key)
}

/// Whether the raw update's message has words a user wrote.
fn has_content(text: &str) -> bool {
    let Ok(mut update) = serde_json::from_str::<serde_json::Value>(text) else { return false };
    message_of(&mut update).is_some_and(|message| message.get("text").or(message.get("caption")).is_some())
}

/// The update with what teloxide stumbles on repaired: `"mime_type": null` in each of its
/// message's files that has none, and the entities teloxide cannot read (a kind newer
/// than it) left out, wherever in the message they are. `None` when there is nothing to
/// repair (nothing to read again).
fn repaired_for_teloxide(text: &str) -> Option<String> {
    let mut update: serde_json::Value = serde_json::from_str(text).ok()?;
    let message = message_of(&mut update)?;
    let mut repaired = false;
    for key in FILES_NEEDING_A_MIME_TYPE {
        if let Some(file) = message.get_mut(key).and_then(serde_json::Value::as_object_mut)
            && !file.get("mime_type").is_some_and(serde_json::Value::is_string)
        {
            file.insert("mime_type".to_owned(), serde_json::Value::Null);
            repaired = true;
        }
    }
    repaired |= drop_unreadable_entities(message, 0);
    repaired.then(|| update.to_string())
}

/// Leaves out of every `entities` and `caption_entities` list in `value` (a message, and
/// the quote or reply it holds) the entities teloxide cannot read. True when one was.
fn drop_unreadable_entities(value: &mut serde_json::Value, depth: usize) -> bool {
    // A message holds a reply, which holds a quote: a few levels at most.
    const DEEPEST: usize = 4;
    let Some(object) = value.as_object_mut().filter(|_| depth <= DEEPEST) else { return false };
    let mut dropped = false;
    for (key, member) in object.iter_mut() {
        match member {
            serde_json::Value::Array(entities) if key == "entities" || key == "caption_entities" => {
                let before = entities.len();
                entities.retain(|entity| serde_json::from_value::<MessageEntity>(entity.clone()).is_ok());
                dropped |= entities.len() != before;
            }
            serde_json::Value::Object(_) => dropped |= drop_unreadable_entities(member, depth + 1),
            _ => {}
        }
    }
    dropped
}

pub fn classify(update: &Update) -> Inbound {
    let update_id = i64::from(update.id.0);
    let (message, kind) = match &update.kind {
        UpdateKind::Message(m) => (m, EnvelopeKind::Message),
        UpdateKind::EditedMessage(m) => (m, EnvelopeKind::EditedMessage),
        UpdateKind::MessageReaction(updated) => {
            return Inbound::Reaction(Box::new(crate::telegram::parts::reaction(update_id, updated)));
        }
        UpdateKind::Error(_) => {
            return Inbound::Undecodable {
                update_id: Some(update_id),
                reason: "teloxide cannot read it: a malformed update, or a kind it does not know".into(),
            };
        }
        other => return Inbound::NotAMessage { update_id, kind: update_kind_name(other) },
    };
    let envelope = Box::new(envelope_from_message(update_id, kind, message));
    if let Some(to) = message.migrate_to_chat_id() {
        return Inbound::Migrated {
            envelope,
            reason: "service message: migrate_to_chat_id".into(),
            to_chat_id: to.0,
        };
    }
    if let Some(service) = service_kind(message) {
        return Inbound::Ignored { envelope, reason: format!("service message: {service}") };
    }
    // A linked channel's post, copied into its discussion group by Telegram itself (its
    // sender is Telegram, 777000): nobody wrote it to the bot, and an agent that answered
    // every post would comment under each.
    if message.is_automatic_forward() {
        return Inbound::Ignored {
            envelope,
            reason: "a post of the linked channel, forwarded by Telegram".into(),
        };
    }
    // Another bot's message: Telegram lets one through when either bot turns on bot-to-bot
    // communication, and answering it would have two bots answer each other without end.
    // (An anonymous admin writes as the group, `sender_chat`, from Telegram's placeholder bot.)
    if message.sender_chat.is_none() && message.from.as_ref().is_some_and(|from| from.is_bot) {
        return Inbound::Ignored { envelope, reason: "a message from another bot".into() };
    }
    // Telegram reports every move of a live location as an edit of its message.
    if kind == EnvelopeKind::EditedMessage && message.location().is_some() {
        return Inbound::Ignored { envelope, reason: "live location update".into() };
    }
    Inbound::Envelope(envelope)
}

/// The Bot API field that makes `message` a service message, or `None` for ordinary
/// content (text, media, a dice throw). A `match` without a wildcard: a new kind in a
/// teloxide upgrade must be decided here.
fn service_kind(message: &Message) -> Option<&'static str> {
    use MessageKind as K;
    let name = match &message.kind {
        K::Common(_) => {
            return match message.chat_migration() {
                Some(ChatMigration::From { .. }) => Some("migrate_from_chat_id"),
                Some(ChatMigration::To { .. }) => Some("migrate_to_chat_id"),
                None => None,
            };
        }
        K::Dice(_) => return None,
        K::NewChatMembers(_) => "new_chat_members",
        K::LeftChatMember(_) => "left_chat_member",
        K::NewChatTitle(_) => "new_chat_title",
        K::NewChatPhoto(_) => "new_chat_photo",
        K::DeleteChatPhoto(_) => "delete_chat_photo",
        K::GroupChatCreated(_) => "group_chat_created",
        K::SupergroupChatCreated(_) => "supergroup_chat_created",
        K::ChannelChatCreated(_) => "channel_chat_created",
        K::MessageAutoDeleteTimerChanged(_) => "message_auto_delete_timer_changed",
        K::Pinned(_) => "pinned_message",
        K::ChatShared(_) => "chat_shared",
        K::UsersShared(_) => "users_shared",
        K::Invoice(_) => "invoice",
        K::SuccessfulPayment(_) => "successful_payment",
        K::RefundedPayment(_) => "refunded_payment",
        K::ConnectedWebsite(_) => "connected_website",
        K::WriteAccessAllowed(_) => "write_access_allowed",
        K::PassportData(_) => "passport_data",
        K::ProximityAlertTriggered(_) => "proximity_alert_triggered",
        K::ChatBoostAdded(_) => "boost_added",
        K::ChatBackground(_) => "chat_background_set",
        K::ChecklistTasksDone(_) => "checklist_tasks_done",
        K::ChecklistTasksAdded(_) => "checklist_tasks_added",
        K::DirectMessagePriceChanged(_) => "direct_message_price_changed",
        K::ForumTopicCreated(_) => "forum_topic_created",
        K::ForumTopicEdited(_) => "forum_topic_edited",
        K::ForumTopicClosed(_) => "forum_topic_closed",
        K::ForumTopicReopened(_) => "forum_topic_reopened",
        K::GeneralForumTopicHidden(_) => "general_forum_topic_hidden",
        K::GeneralForumTopicUnhidden(_) => "general_forum_topic_unhidden",
        K::Giveaway(_) => "giveaway",
        K::GiveawayCompleted(_) => "giveaway_completed",
        K::GiveawayCreated(_) => "giveaway_created",
        K::GiveawayWinners(_) => "giveaway_winners",
        K::PaidMessagePriceChanged(_) => "paid_message_price_changed",
        K::GiftInfo(_) => "gift",
        K::UniqueGiftInfo(_) => "unique_gift",
        K::VideoChatScheduled(_) => "video_chat_scheduled",
        K::VideoChatStarted(_) => "video_chat_started",
        K::VideoChatEnded(_) => "video_chat_ended",
        K::VideoChatParticipantsInvited(_) => "video_chat_participants_invited",
        K::WebAppData(_) => "web_app_data",
        K::Empty {} => "an empty message",
    };
    Some(name)
}

/// The audit row of an update that could not be decoded: whatever can still be read of it
/// leniently (its kind, chat, message id, sender and date), the rest left blank. Its raw
/// text is stored beside it.
pub fn undecodable_envelope(raw: &RawUpdate, update_id: Option<i64>) -> Envelope {
    let members = lenient::members(&raw.text).unwrap_or_default();
    // The member that is not `update_id` names the kind of update and holds its object.
    let body = members.iter().find(|(key, _)| *key != "update_id").map(|(_, value)| *value);
    let field = |key: &str| body.and_then(|body| lenient::member(body, key));
    let chat = field("chat");
    let chat_member = |key: &str| chat.and_then(|chat| lenient::member(chat, key));
    let sender_id = field("from").or_else(|| field("user")).and_then(|user| lenient::member(user, "id"));
    Envelope {
        trace_id: TraceId::generate(),
        update_id: update_id.unwrap_or_default(),
        kind: EnvelopeKind::Unknown,
        channel: Channel {
            chat_id: chat_member("id").and_then(lenient::integer).unwrap_or_default(),
            thread_id: None,
        },
        chat_type: chat_member("type")
            .and_then(lenient::plain_string)
            .map_or(ChatType::Unknown, ChatType::from_api),
        chat_title: None,
        message_id: field("message_id")
            .and_then(lenient::integer)
            .and_then(|id| i32::try_from(id).ok())
            .unwrap_or_default(),
        sender: Sender {
            id: sender_id.and_then(lenient::integer),
            username: None,
            name: "unknown sender".into(),
        },
        text: None,
        attachments: Vec::new(),
        described: None,
        context: Context::default(),
        sent_at: field("date").and_then(lenient::integer).map_or_else(Utc::now, dates::from_unix),
    }
}

thread_local! {
    /// Set while [`catching_panics`] runs on this thread.
    static EXPECTING_PANIC: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, turning a panic into its message. Such a panic is a decoder's bug on odd input
/// that the caller reports with the update id, so the process's panic hook (which would
/// print it to stderr) is kept quiet for it; every other panic is reported as before.
/// (With `panic = "abort"` nothing could be caught; the profiles keep unwinding.)
fn catching_panics<T>(f: impl FnOnce() -> T + UnwindSafe) -> Result<T, String> {
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !EXPECTING_PANIC.with(Cell::get) {
                previous(info);
            }
        }));
    });
    EXPECTING_PANIC.with(|expecting| expecting.set(true));
    let result = panic::catch_unwind(f);
    EXPECTING_PANIC.with(|expecting| expecting.set(false));
    result.map_err(|payload| panic_message(payload.as_ref()))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

fn envelope_from_message(update_id: i64, kind: EnvelopeKind, message: &Message) -> Envelope {
    // Only forum topics define a channel; in other supergroups a thread id marks a reply
    // chain, which must not split one chat into many routes.
    let thread_id = message.thread_id.filter(|_| message.is_topic_message).map(|thread| thread.0.0);
    // A message sent on behalf of a chat (an anonymous admin: the group itself; "send as"
    // a channel) names that chat in `sender_chat`, and in `from` a placeholder user that
    // Telegram gives every such message (@GroupAnonymousBot): the chat is who spoke.
    let sender = match (&message.sender_chat, &message.from) {
        (Some(chat), _) => Sender {
            id: Some(chat.id.0),
            username: chat.username().map(str::to_owned),
            name: chat_title(chat).unwrap_or_else(|| "unknown sender".to_owned()),
        },
        (None, Some(user)) => {
            Sender { id: Some(user.id.0 as i64), username: user.username.clone(), name: user.full_name() }
        }
        (None, None) => Sender { id: None, username: None, name: "unknown sender".to_owned() },
    };
    Envelope {
        trace_id: TraceId::generate(),
        update_id,
        kind,
        channel: Channel { chat_id: message.chat.id.0, thread_id },
        chat_type: ChatType::of(&message.chat),
        chat_title: chat_title(&message.chat),
        message_id: message.id.0,
        sender,
        text: parts::text_with_links(message),
        attachments: parts::attachments(message),
        described: parts::described(message),
        context: Context::of(message),
        sent_at: dates::within_ledger(message.date),
    }
}

fn chat_title(chat: &Chat) -> Option<String> {
    chat.title().map(str::to_owned).or_else(|| chat.first_name().map(str::to_owned))
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
        assert_eq!(e.chat_type, ChatType::Private);
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
        assert_eq!(e.chat_type, ChatType::Supergroup);
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
        assert_eq!(e.attachments.len(), 1);
        assert_eq!(
            (e.attachments[0].kind, e.attachments[0].file_id.as_str()),
            (AttachmentKind::Photo, "big")
        );
        // The caption is the content; the photo is described in meta.
        assert_eq!(e.content(), "look");
    }

    #[test]
    fn a_message_without_text_is_still_an_envelope() {
        let e = envelope(classify(&update(json!({
            "update_id": 10,
            "message": {"message_id": 5, "date": 1_700_000_000, "chat": private_chat(), "from": from(),
                        "location": {"latitude": 1.5, "longitude": 2.5}}
        }))));
        assert_eq!(e.text, None);
        assert!(e.attachments.is_empty());
        assert_eq!(e.content(), "📍 location 1.5, 2.5");
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
    fn migration_is_reported_and_kept_as_a_service_message() {
        let chat = json!({"id": -555, "type": "group", "title": "Old"});
        let inbound = classify(&update(json!({
            "update_id": 12,
            "message": {"message_id": 6, "date": 1_700_000_000, "chat": chat, "from": from(),
                        "migrate_to_chat_id": -1_000_000_000_555i64}
        })));
        let Inbound::Migrated { envelope, reason, to_chat_id } = inbound else { panic!("{inbound:?}") };
        assert_eq!((envelope.channel.chat_id, to_chat_id), (-555, -1_000_000_000_555));
        assert_eq!(reason, "service message: migrate_to_chat_id");
        let arrived = classify(&update(json!({
            "update_id": 13,
            "message": {"message_id": 1, "date": 1_700_000_000, "from": from(),
                        "chat": {"id": -1_000_000_000_555i64, "type": "supergroup", "title": "New"},
                        "migrate_from_chat_id": -555}
        })));
        assert_eq!(ignored_reason(arrived), "service message: migrate_from_chat_id");
    }

    fn ignored_reason(inbound: Inbound) -> String {
        match inbound {
            Inbound::Ignored { reason, .. } => reason,
            other => panic!("expected an ignored message, got {other:?}"),
        }
    }

    #[test]
    fn service_messages_are_ignored_with_their_reason() {
        let chat = json!({"id": -100123, "type": "supergroup", "title": "Ops", "is_forum": true});
        let message = |extra: serde_json::Value| {
            let mut message = json!({"message_id": 20, "date": 1_700_000_000, "chat": chat, "from": from()});
            message.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            update(json!({"update_id": 30, "message": message}))
        };
        let cases = [
            (json!({"new_chat_members": [from()]}), "new_chat_members"),
            (json!({"left_chat_member": from()}), "left_chat_member"),
            (json!({"new_chat_title": "Renamed"}), "new_chat_title"),
            (
                json!({"pinned_message": {"message_id": 3, "date": 1_700_000_000, "chat": chat, "text": "pin me"}}),
                "pinned_message",
            ),
            (
                json!({"forum_topic_created": {"name": "Deploys", "icon_color": 7322096}}),
                "forum_topic_created",
            ),
            (json!({"forum_topic_closed": {}}), "forum_topic_closed"),
        ];
        for (extra, name) in cases {
            let inbound = classify(&message(extra));
            assert_eq!(ignored_reason(inbound), format!("service message: {name}"));
        }
        // Ordinary content stays work, a dice throw included.
        assert!(matches!(classify(&message(json!({"text": "hi"}))), Inbound::Envelope(_)));
        let dice = envelope(classify(&message(json!({"dice": {"emoji": "🎲", "value": 4}}))));
        assert_eq!(dice.content(), "🎲 dice: 4");
        let options = json!([{"text": "SQLite", "voter_count": 0}, {"text": "PostgreSQL", "voter_count": 0}]);
        let poll = json!({"id": "5", "question": "Which DB?", "options": options, "total_voter_count": 0,
                          "is_closed": false, "is_anonymous": true, "type": "regular",
                          "allows_multiple_answers": false});
        let forwarded_poll = envelope(classify(&message(json!({"poll": poll}))));
        assert_eq!(forwarded_poll.content(), "📊 poll: Which DB? (options: SQLite / PostgreSQL)");
    }

    #[test]
    fn another_bots_message_is_no_work() {
        let group = json!({"id": -100321, "type": "supergroup", "title": "Ops"});
        let other_bot =
            json!({"id": 5_000_111, "is_bot": true, "first_name": "Helper", "username": "helper_bot"});
        let inbound = classify(&update(json!({
            "update_id": 47,
            "message": {"message_id": 14, "date": 1_700_000_000, "chat": group, "from": other_bot,
                        "text": "@switchboard_bot here is my answer"}
        })));
        assert_eq!(ignored_reason(inbound), "a message from another bot");
    }

    #[test]
    fn an_anonymous_admin_speaks_as_the_group_not_as_telegrams_placeholder() {
        let group = json!({"id": -100321, "type": "supergroup", "title": "Ops"});
        let placeholder = json!({"id": 1_087_968_824, "is_bot": true, "first_name": "Group", "username": "GroupAnonymousBot"});
        let anonymous = envelope(classify(&update(json!({
            "update_id": 44,
            "message": {"message_id": 11, "date": 1_700_000_000, "chat": group, "from": placeholder,
                        "sender_chat": group, "text": "/cancel"}
        }))));
        assert_eq!(anonymous.sender.id, Some(-100_321), "the group's own id: allowed_users can name it");
        assert_eq!(anonymous.sender.name, "Ops");
        assert_ne!(anonymous.sender.username.as_deref(), Some("GroupAnonymousBot"));
        let person = envelope(classify(&update(json!({
            "update_id": 45,
            "message": {"message_id": 12, "date": 1_700_000_000, "chat": group, "from": from(), "text": "hi"}
        }))));
        assert_eq!(person.sender.id, from()["id"].as_i64());
    }

    #[test]
    fn each_photo_of_an_album_names_its_album() {
        let photo = json!([{"file_id": "p1", "file_unique_id": "u1", "width": 90, "height": 90}]);
        let first = envelope(classify(&update(json!({
            "update_id": 46,
            "message": {"message_id": 13, "date": 1_700_000_000, "chat": private_chat(), "from": from(),
                        "media_group_id": "13579", "photo": photo, "caption": "which is best?"}
        }))));
        let meta = first.context.meta(None).expect("an album says so");
        assert_eq!(meta.get("media_group_id").and_then(|id| id.as_str()), Some("13579"));
        let alone = envelope(classify(&update(json!({
            "update_id": 47,
            "message": {"message_id": 14, "date": 1_700_000_000, "chat": private_chat(), "from": from(), "photo": photo}
        }))));
        assert_eq!(alone.context.album, None);
    }

    #[test]
    fn a_linked_channels_post_copied_into_its_group_is_no_work() {
        let group = json!({"id": -100777, "type": "supergroup", "title": "Channel chat"});
        let telegram = json!({"id": 777000, "is_bot": false, "first_name": "Telegram"});
        let channel = json!({"id": -100888, "type": "channel", "title": "News"});
        let copied = classify(&update(json!({
            "update_id": 42,
            "message": {"message_id": 9, "date": 1_700_000_000, "chat": group, "from": telegram,
                        "sender_chat": channel, "is_automatic_forward": true, "text": "Release 2.0 is out"}
        })));
        assert!(ignored_reason(copied).contains("linked channel"));
        // A comment under it, by a person, is work.
        let comment = classify(&update(json!({
            "update_id": 43,
            "message": {"message_id": 10, "date": 1_700_000_000, "chat": group, "from": from(), "text": "nice"}
        })));
        assert!(matches!(comment, Inbound::Envelope(_)));
    }

    #[test]
    fn live_location_edits_are_ignored_but_a_shared_location_is_work() {
        let location = json!({"latitude": 1.5, "longitude": 2.5, "live_period": 900});
        let edit = classify(&update(json!({
            "update_id": 40,
            "edited_message": {"message_id": 5, "date": 1_700_000_000, "edit_date": 1_700_000_060,
                               "chat": private_chat(), "from": from(), "location": location}
        })));
        assert_eq!(ignored_reason(edit), "live location update");
        let shared = classify(&update(json!({
            "update_id": 41,
            "message": {"message_id": 5, "date": 1_700_000_000, "chat": private_chat(), "from": from(), "location": location}
        })));
        assert!(matches!(shared, Inbound::Envelope(_)));
    }

    #[test]
    fn foreign_updates_are_named_and_not_recorded() {
        let post = update(json!({"update_id": 14, "channel_post": {"message_id": 1, "date": 1_700_000_000,
            "chat": {"id": -100, "type": "channel", "title": "News"}, "text": "hi"}}));
        assert_eq!(classify(&post), Inbound::NotAMessage { update_id: 14, kind: "channel_post" });
    }

    fn undecodable_reason(inbound: Inbound) -> (Option<i64>, String) {
        match inbound {
            Inbound::Undecodable { update_id, reason } => (update_id, reason),
            other => panic!("expected an undecodable update, got {other:?}"),
        }
    }

    #[test]
    fn an_update_teloxide_cannot_read_is_undecodable() {
        let malformed = RawUpdate::new(r#"{"update_id": 13, "message": {"nonsense": true}}"#);
        let (update_id, reason) = undecodable_reason(read(&malformed));
        assert_eq!(update_id, Some(13));
        assert!(reason.contains("teloxide cannot read it"), "{reason}");
    }

    /// An entity of a kind newer than teloxide (the Bot API's `date_time`) made teloxide
    /// read the whole message as empty, which was then ignored as a service message: the
    /// user's words never reached the agent.
    #[test]
    fn a_message_with_an_entity_teloxide_does_not_know_is_read_without_it() {
        let newer = r#"{"type": "date_time", "offset": 8, "length": 5, "unix_time": 1700000000, "date_time_format": "t"}"#;
        let raw = RawUpdate::new(&format!(
            r#"{{"update_id": 18, "message": {{"message_id": 9, "date": 1700000000, "from": {{"id": 42, "is_bot": false, "first_name": "Ann"}}, "chat": {{"id": 42, "type": "private", "first_name": "Ann"}}, "text": "meet at 10:00 @ann_bot", "entities": [{newer}, {{"type": "mention", "offset": 14, "length": 8}}], "quote": {{"text": "at 10:00", "position": 0, "entities": [{newer}]}}}}}}"#
        ));
        let e = envelope(read(&raw));
        assert_eq!(e.text.as_deref(), Some("meet at 10:00 @ann_bot"));
        let caption = RawUpdate::new(&format!(
            r#"{{"update_id": 19, "message": {{"message_id": 10, "date": 1700000000, "from": {{"id": 42, "is_bot": false, "first_name": "Ann"}}, "chat": {{"id": 42, "type": "private", "first_name": "Ann"}}, "photo": [{{"file_id": "p", "file_unique_id": "u", "width": 9, "height": 9}}], "caption": "at 10:00", "caption_entities": [{newer}]}}}}"#
        ));
        assert_eq!(envelope(read(&caption)).text.as_deref(), Some("at 10:00"));
        // What no repair makes readable is kept raw and reported, never taken for a
        // service message.
        let broken = RawUpdate::new(
            r#"{"update_id": 20, "message": {"message_id": 11, "date": 1700000000, "from": {"id": 42, "is_bot": false, "first_name": "Ann"}, "chat": {"id": 42, "type": "private", "first_name": "Ann"}, "text": "hello", "entities": "bold"}}"#,
        );
        let (update_id, reason) = undecodable_reason(read(&broken));
        assert_eq!(update_id, Some(20));
        assert!(reason.contains("content"), "{reason}");
    }

    #[test]
    fn a_lone_surrogate_makes_only_its_own_update_undecodable() {
        let raw = RawUpdate::new(
            r#"{"update_id": 15, "message": {"message_id": 9, "date": 1700000000, "from": {"id": 42, "is_bot": false, "first_name": "Ann"}, "chat": {"id": 42, "type": "private", "first_name": "Ann"}, "text": "\ud800"}}"#,
        );
        let (update_id, reason) = undecodable_reason(read(&raw));
        assert_eq!(update_id, Some(15));
        assert!(reason.contains("teloxide cannot read it") && reason.contains("hex escape"), "{reason}");
        // The audit row still names what can be read.
        let e = undecodable_envelope(&raw, update_id);
        assert_eq!(
            (e.update_id, e.kind, e.channel.chat_id, e.chat_type),
            (15, EnvelopeKind::Unknown, 42, ChatType::Private)
        );
        assert_eq!((e.message_id, e.sender.id, e.sent_at.timestamp()), (9, Some(42), 1_700_000_000));
        assert_eq!(e.text, None);
    }

    #[test]
    fn a_reaction_without_an_actor_panics_teloxide_and_becomes_undecodable() {
        let raw = RawUpdate::new(
            r#"{"update_id": 16, "message_reaction": {"chat": {"id": -100, "type": "supergroup", "title": "Ops"}, "message_id": 3, "date": 1700000000, "old_reaction": [], "new_reaction": [{"type": "emoji", "emoji": "👍"}]}}"#,
        );
        let (update_id, reason) = undecodable_reason(read(&raw));
        assert_eq!(update_id, Some(16));
        assert!(reason.contains("panicked"), "{reason}");
        let e = undecodable_envelope(&raw, update_id);
        assert_eq!((e.channel.chat_id, e.message_id, e.chat_type), (-100, 3, ChatType::Supergroup));
    }

    #[test]
    fn an_update_that_is_not_even_json_keeps_what_can_be_read() {
        let raw = RawUpdate::new(
            "{\"update_id\": 17, \"message\": {\"chat\": {\"id\": 5}, \"text\": \"bad \\q\"}}",
        );
        assert_eq!(raw.update_id, Some(17));
        let (update_id, _) = undecodable_reason(read(&raw));
        assert_eq!(undecodable_envelope(&raw, update_id).channel.chat_id, 5);
        let nothing = RawUpdate::new("[not an update");
        let (update_id, _) = undecodable_reason(read(&nothing));
        assert_eq!(update_id, None);
        assert_eq!(undecodable_envelope(&nothing, None).update_id, 0);
    }

    /// A message with `extra`, read from its raw text as the poller reads it.
    fn message(extra: serde_json::Value) -> Envelope {
        let mut message =
            json!({"message_id": 50, "date": 1_700_000_000, "chat": private_chat(), "from": from()});
        message.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        envelope(read(&RawUpdate::new(&json!({"update_id": 60, "message": message}).to_string())))
    }

    fn file(id: &str, size: Option<u64>) -> serde_json::Value {
        let mut file = json!({"file_id": id, "file_unique_id": format!("u-{id}")});
        if let Some(size) = size {
            file["file_size"] = json!(size);
        }
        file
    }

    fn with(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
        base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        base
    }

    fn meta_of(e: &Envelope) -> std::collections::BTreeMap<String, String> {
        crate::telegram::parts::attachment_meta(&e.attachments)
    }

    #[test]
    fn a_photo_is_its_largest_size_with_a_placeholder_when_uncaptioned() {
        let e = message(json!({"photo": [
            with(file("small", Some(1_000)), json!({"width": 90, "height": 60})),
            with(file("big", Some(60_000)), json!({"width": 1280, "height": 853})),
        ]}));
        assert_eq!(e.content(), "(photo)");
        let meta = meta_of(&e);
        assert_eq!(meta["attachment_kind"], "photo");
        assert_eq!(meta["attachment_file_id"], "big");
        assert_eq!(meta["attachment_size"], "60000");
        assert!(!meta.contains_key("attachment_count") && !meta.contains_key("attachment_mime"));
    }

    #[test]
    fn every_kind_of_file_is_described_with_its_placeholder() {
        let cases = [
            (
                json!({"document": with(file("d", Some(2_048)), json!({"file_name": "report.pdf", "mime_type": "application/pdf"}))}),
                "document",
                "(document report.pdf)",
            ),
            (
                json!({"voice": with(file("v", Some(9_000)), json!({"duration": 12, "mime_type": "audio/ogg"}))}),
                "voice",
                "(voice message, 0:12)",
            ),
            (
                json!({"audio": with(file("a", None), json!({"duration": 200, "file_name": "song.mp3", "mime_type": "audio/mpeg"}))}),
                "audio",
                "(audio song.mp3, 3:20)",
            ),
            (
                json!({"video": with(file("vi", None), json!({"duration": 63, "width": 640, "height": 480}))}),
                "video",
                "(video, 1:03)",
            ),
            (
                json!({"video_note": with(file("n", None), json!({"duration": 5, "length": 240}))}),
                "video_note",
                "(video message, 0:05)",
            ),
            (
                json!({"animation": with(file("g", None), json!({"duration": 2, "width": 200, "height": 200, "file_name": "cat.mp4", "mime_type": "video/mp4"})),
                       "document": with(file("g", None), json!({"file_name": "cat.mp4"}))}),
                "animation",
                "(animation)",
            ),
            (
                json!({"sticker": with(file("s", None), json!({"type": "regular", "width": 512, "height": 512, "is_animated": false, "is_video": false, "emoji": "😀"}))}),
                "sticker",
                "(sticker 😀)",
            ),
        ];
        for (content, kind, placeholder) in cases {
            let e = message(content);
            assert_eq!(e.content(), placeholder, "{kind}");
            assert_eq!(meta_of(&e)["attachment_kind"], kind);
        }
        let document = message(
            json!({"document": with(file("d", Some(2_048)), json!({"file_name": "report.pdf", "mime_type": "application/pdf"}))}),
        );
        let meta = meta_of(&document);
        assert_eq!((meta["attachment_file_id"].as_str(), meta["attachment_size"].as_str()), ("d", "2048"));
        assert_eq!(
            (meta["attachment_mime"].as_str(), meta["attachment_name"].as_str()),
            ("application/pdf", "report.pdf")
        );
    }

    #[test]
    fn a_caption_is_the_content_of_a_file() {
        let e = message(
            json!({"caption": "the contract", "document": with(file("d", None), json!({"file_name": "c.pdf"}))}),
        );
        assert_eq!(e.content(), "the contract");
        assert_eq!(meta_of(&e)["attachment_name"], "c.pdf");
    }

    #[test]
    fn a_file_without_size_type_or_name_is_still_an_envelope() {
        let e = message(json!({"document": file("bare", None)}));
        assert_eq!(e.content(), "(document)");
        let meta = meta_of(&e);
        assert_eq!(
            meta.keys().map(String::as_str).collect::<Vec<_>>(),
            ["attachment_file_id", "attachment_kind"]
        );
        let voice = message(json!({"voice": with(file("v", None), json!({"duration": 0}))}));
        assert_eq!(voice.content(), "(voice message, 0:00)");
    }

    #[test]
    fn attachments_are_stored_and_read_back_as_the_same_list() {
        let e = message(
            json!({"document": with(file("d", Some(5)), json!({"file_name": "a.txt", "mime_type": "text/plain"}))}),
        );
        let stored = serde_json::to_string(&e.attachments).unwrap();
        assert_eq!(crate::telegram::parts::stored_attachments(&stored), e.attachments);
    }

    #[test]
    fn contacts_and_venues_read_as_text() {
        let contact = message(
            json!({"contact": {"phone_number": "+4930123", "first_name": "Ann", "last_name": "Lee"}}),
        );
        assert_eq!(contact.content(), "contact: Ann Lee +4930123");
        let venue = message(json!({"venue": {"location": {"latitude": 52.52, "longitude": 13.4},
                                             "title": "Brandenburger Tor", "address": "Pariser Platz"},
                                  "location": {"latitude": 52.52, "longitude": 13.4}}));
        let content = venue.content();
        assert!(content.contains("Brandenburger Tor") && content.contains("Pariser Platz"), "{content}");
        assert!(venue.attachments.is_empty());
    }

    #[test]
    fn a_reply_carries_the_quoted_message_and_prefers_the_partial_quote() {
        let quoted = json!({"message_id": 7, "date": 1_699_999_000, "chat": private_chat(), "from": from(),
                            "text": "x".repeat(300)});
        let e = message(json!({"text": "how long?", "reply_to_message": quoted}));
        let q = e.context.quoted.as_ref().expect("a quote");
        assert_eq!(q.message_id, 7);
        assert_eq!(q.text.as_ref().map(|t| t.chars().count()), Some(crate::telegram::parts::QUOTE_CHARS));
        let meta = e.context.meta(Some("env_x")).unwrap();
        assert_eq!(meta["reply_to_message_id"], "7");
        assert_eq!(meta["reply_to_trace_id"], "env_x");

        let partial = message(json!({"text": "this?", "reply_to_message": quoted,
                                     "quote": {"text": "xxx", "position": 0}}));
        assert_eq!(partial.context.quoted.unwrap().text.as_deref(), Some("xxx"));

        let photo = json!({"message_id": 8, "date": 1_699_999_000, "chat": private_chat(), "from": from(),
                           "caption": "the chart", "photo": [with(file("p", None), json!({"width": 1, "height": 1}))]});
        let of_caption = message(json!({"text": "why?", "reply_to_message": photo}));
        assert_eq!(of_caption.context.quoted.unwrap().text.as_deref(), Some("the chart"));
        assert_eq!(message(json!({"text": "plain"})).context.meta(None), None);
    }

    #[test]
    fn a_forum_topic_root_is_no_quote() {
        let chat = json!({"id": -100123, "type": "supergroup", "title": "Ops", "is_forum": true});
        let root = json!({"message_id": 42, "date": 1_699_999_000, "chat": chat, "from": from(),
                          "forum_topic_created": {"name": "Deploys", "icon_color": 7322096}});
        let e = envelope(classify(&update(json!({"update_id": 61, "message": {
            "message_id": 51, "message_thread_id": 42, "is_topic_message": true, "date": 1_700_000_000,
            "chat": chat, "from": from(), "text": "deploy?", "reply_to_message": root}}))));
        assert_eq!(e.context.quoted, None);
    }

    #[test]
    fn a_forward_names_its_origin() {
        let e = message(json!({"text": "fyi", "forward_origin": {"type": "user", "date": 1_690_000_000,
            "sender_user": {"id": 7, "is_bot": false, "first_name": "Bob", "username": "bob"}}}));
        let meta = e.context.meta(None).unwrap();
        assert_eq!(meta["forward_from"], "@bob");
        assert_eq!(meta["forward_date"], "2023-07-22T04:26:40Z");
        let hidden =
            message(json!({"text": "x", "forward_origin": {"type": "hidden_user", "date": 1_690_000_000,
            "sender_user_name": "Someone"}}));
        assert_eq!(hidden.context.forwarded.unwrap().from, "Someone");
        let channel =
            message(json!({"text": "x", "forward_origin": {"type": "channel", "date": 1_690_000_000,
            "chat": {"id": -1001, "type": "channel", "title": "News"}, "message_id": 3}}));
        assert_eq!(channel.context.forwarded.unwrap().from, "News");
    }

    #[test]
    fn text_link_urls_survive_in_the_content() {
        let e = message(json!({"text": "read the docs, then ✅ the guide now",
            "entities": [{"type": "text_link", "offset": 9, "length": 4, "url": "https://example.com/docs"},
                         {"type": "bold", "offset": 0, "length": 4},
                         {"type": "text_link", "offset": 26, "length": 5, "url": "https://example.com/guide"}]}));
        assert_eq!(
            e.content(),
            "read the docs (https://example.com/docs), then ✅ the guide (https://example.com/guide) now"
        );
        let caption = message(json!({"caption": "see here", "caption_entities": [
            {"type": "text_link", "offset": 4, "length": 4, "url": "https://example.com/"}],
            "document": file("d", None)}));
        assert_eq!(caption.content(), "see here (https://example.com/)");
    }

    #[test]
    fn a_reaction_is_read_with_who_set_what() {
        let inbound = classify(&update(json!({"update_id": 70, "message_reaction": {
            "chat": private_chat(), "message_id": 9, "date": 1_700_000_000, "user": from(),
            "old_reaction": [], "new_reaction": [{"type": "emoji", "emoji": "👍"}, {"type": "emoji", "emoji": "🔥"}]}})));
        let Inbound::Reaction(reaction) = inbound else { panic!("{inbound:?}") };
        assert_eq!((reaction.update_id, reaction.chat_id, reaction.message_id), (70, 42, 9));
        assert_eq!((reaction.user_id, reaction.user.as_str()), (Some(42), "@ann"));
        assert_eq!(reaction.emoji, ["👍", "🔥"]);
        let removed = classify(&update(json!({"update_id": 71, "message_reaction": {
            "chat": private_chat(), "message_id": 9, "date": 1_700_000_000, "user": from(),
            "old_reaction": [{"type": "emoji", "emoji": "👍"}], "new_reaction": []}})));
        let Inbound::Reaction(removed) = removed else { panic!("{removed:?}") };
        assert!(removed.emoji.is_empty());
    }

    #[test]
    fn a_message_or_a_reaction_dated_out_of_the_ledgers_years_is_clamped_into_them() {
        use crate::rules::dates::from_unix;
        let early = message(json!({"text": "x", "date": -210_866_803_201_i64}));
        assert_eq!(early.sent_at, from_unix(i64::MIN));
        let inbound = classify(&update(json!({"update_id": 73, "message_reaction": {
            "chat": private_chat(), "message_id": 9, "date": 253_402_300_800_i64, "user": from(),
            "old_reaction": [], "new_reaction": []}})));
        let Inbound::Reaction(reaction) = inbound else { panic!("{inbound:?}") };
        assert_eq!(reaction.date, from_unix(i64::MAX));
    }

    #[test]
    fn a_callback_query_passes_by_as_an_update_that_is_not_a_message() {
        let query = update(json!({"update_id": 72, "callback_query": {"id": "q1", "from": from(),
            "chat_instance": "ci", "data": "allow"}}));
        assert_eq!(classify(&query), Inbound::NotAMessage { update_id: 72, kind: "callback_query" });
    }

    #[test]
    fn kinds_and_chat_types_are_named_as_telegram_names_them() {
        assert_eq!(EnvelopeKind::EditedMessage.to_string(), "edited_message");
        assert_eq!(ChatType::Supergroup.to_string(), "supergroup");
        for name in ["private", "group", "supergroup", "channel"] {
            assert_eq!(ChatType::from_api(name).as_str(), name);
        }
    }
}
