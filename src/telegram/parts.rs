//! The parts of a Telegram message beyond its plain text, read into the shapes an
//! envelope keeps: its attachments (the files stay with Telegram; their ids, sizes, types
//! and names are kept so the agent can ask for them), the message it quotes, where it was
//! forwarded from, a shared location, contact or venue as readable text, and its text with
//! the URLs of `text_link` entities written out. Pure: a `Message` in, plain values out.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use teloxide::types::{
    Chat, Message, MessageEntityKind, MessageEntityRef, MessageOrigin, MessageReactionUpdated, ReactionType,
};

/// How many characters of a quoted message an envelope carries (`reply_to_text`).
pub const QUOTE_CHARS: usize = 200;

/// The kinds of file a Telegram message carries, as the Bot API names their fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentKind {
    Photo,
    Document,
    Voice,
    Audio,
    Video,
    VideoNote,
    Animation,
    Sticker,
}

impl AttachmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Photo => "photo",
            Self::Document => "document",
            Self::Voice => "voice",
            Self::Audio => "audio",
            Self::Video => "video",
            Self::VideoNote => "video_note",
            Self::Animation => "animation",
            Self::Sticker => "sticker",
        }
    }
}

/// A file of a message; the bytes stay with Telegram until someone fetches them by
/// `file_id`. Stored as JSON in the envelope's `attachments` column. Every field but the
/// kind and the id is optional: Telegram leaves sizes, types and names out at will.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub kind: AttachmentKind,
    /// For a photo, the id of its largest size.
    pub file_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Of a voice note, an audio file, a video, a video note or an animation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_secs: Option<u32>,
    /// A sticker's emoji.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emoji: Option<String>,
}

impl Attachment {
    fn new(kind: AttachmentKind, file_id: &impl ToString, size: u32) -> Self {
        Self {
            kind,
            file_id: file_id.to_string(),
            // teloxide reads a missing `file_size` as u32::MAX.
            size: (size != u32::MAX).then_some(u64::from(size)),
            mime: None,
            name: None,
            duration_secs: None,
            emoji: None,
        }
    }

    fn with_mime(mut self, mime: Option<&impl ToString>) -> Self {
        self.mime = mime.map(ToString::to_string);
        self
    }

    fn with_name(mut self, name: Option<&String>) -> Self {
        self.name = name.filter(|name| !name.is_empty()).cloned();
        self
    }

    fn with_duration(mut self, secs: u32) -> Self {
        self.duration_secs = Some(secs);
        self
    }

    /// What the model reads for a message that has this file and no caption:
    /// `(voice message, 0:12)`, `(document report.pdf)`, `(sticker 😀)`.
    pub fn placeholder(&self) -> String {
        // `(what)`, or `(what, 1:03)` with a duration.
        let timed = |what: &str| match self.duration_secs {
            Some(secs) => format!("({what}, {})", clock(secs)),
            None => format!("({what})"),
        };
        // `(what)`, or `(what label)` with a name or an emoji.
        let labelled = |what: &str, label: Option<&String>| match label {
            Some(label) => format!("({what} {label})"),
            None => format!("({what})"),
        };
        match self.kind {
            AttachmentKind::Photo => "(photo)".to_owned(),
            AttachmentKind::Document => labelled("document", self.name.as_ref()),
            AttachmentKind::Voice => timed("voice message"),
            AttachmentKind::Audio => match &self.name {
                Some(name) => timed(&format!("audio {name}")),
                None => timed("audio"),
            },
            AttachmentKind::Video => timed("video"),
            AttachmentKind::VideoNote => timed("video message"),
            AttachmentKind::Animation => "(animation)".to_owned(),
            AttachmentKind::Sticker => labelled("sticker", self.emoji.as_ref()),
        }
    }
}

/// `m:ss`, or `h:mm:ss` from an hour on.
fn clock(secs: u32) -> String {
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    if hours > 0 { format!("{hours}:{minutes:02}:{seconds:02}") } else { format!("{minutes}:{seconds:02}") }
}

/// The meta keys that describe a message's files (docs/agents.md): the first file's kind,
/// id, size, type and name, and `attachment_count` when there are several.
pub fn attachment_meta(attachments: &[Attachment]) -> BTreeMap<String, String> {
    let mut meta = BTreeMap::new();
    let Some(first) = attachments.first() else { return meta };
    meta.insert("attachment_kind".to_owned(), first.kind.as_str().to_owned());
    meta.insert("attachment_file_id".to_owned(), first.file_id.clone());
    if let Some(size) = first.size {
        meta.insert("attachment_size".to_owned(), size.to_string());
    }
    if let Some(mime) = &first.mime {
        meta.insert("attachment_mime".to_owned(), mime.clone());
    }
    if let Some(name) = &first.name {
        meta.insert("attachment_name".to_owned(), name.clone());
    }
    if attachments.len() > 1 {
        meta.insert("attachment_count".to_owned(), attachments.len().to_string());
    }
    meta
}

/// Reads the `attachments` column leniently: an element this release cannot read (a row
/// stored before files had their own fields, a location kept as an attachment) is left
/// out rather than failing the read.
pub fn stored_attachments(json: &str) -> Vec<Attachment> {
    // Most messages have none: no parse on the path of every delivery.
    if json == "[]" {
        return Vec::new();
    }
    let Ok(elements) = serde_json::from_str::<Vec<serde_json::Value>>(json) else { return Vec::new() };
    elements.into_iter().filter_map(|element| serde_json::from_value(element).ok()).collect()
}

/// Every file of `message`. Telegram lists a photo's sizes smallest first; the largest is
/// the photo itself.
pub fn attachments(message: &Message) -> Vec<Attachment> {
    use AttachmentKind as K;
    let mut found = Vec::new();
    if let Some(largest) = message.photo().and_then(<[_]>::last) {
        found.push(Attachment::new(K::Photo, &largest.file.id, largest.file.size));
    }
    if let Some(doc) = message.document() {
        let attachment = Attachment::new(K::Document, &doc.file.id, doc.file.size);
        found.push(attachment.with_mime(doc.mime_type.as_ref()).with_name(doc.file_name.as_ref()));
    }
    if let Some(audio) = message.audio() {
        let name = audio.file_name.as_ref().or(audio.title.as_ref());
        let attachment = Attachment::new(K::Audio, &audio.file.id, audio.file.size);
        found.push(
            attachment
                .with_mime(audio.mime_type.as_ref())
                .with_name(name)
                .with_duration(audio.duration.seconds()),
        );
    }
    if let Some(video) = message.video() {
        let attachment = Attachment::new(K::Video, &video.file.id, video.file.size);
        found.push(
            attachment
                .with_mime(video.mime_type.as_ref())
                .with_name(video.file_name.as_ref())
                .with_duration(video.duration.seconds()),
        );
    }
    if let Some(note) = message.video_note() {
        found.push(
            Attachment::new(K::VideoNote, &note.file.id, note.file.size)
                .with_duration(note.duration.seconds()),
        );
    }
    if let Some(voice) = message.voice() {
        let attachment = Attachment::new(K::Voice, &voice.file.id, voice.file.size);
        found.push(attachment.with_mime(voice.mime_type.as_ref()).with_duration(voice.duration.seconds()));
    }
    if let Some(animation) = message.animation() {
        let attachment = Attachment::new(K::Animation, &animation.file.id, animation.file.size);
        found.push(
            attachment
                .with_mime(animation.mime_type.as_ref())
                .with_name(animation.file_name.as_ref())
                .with_duration(animation.duration.seconds()),
        );
    }
    if let Some(sticker) = message.sticker() {
        let mut attachment = Attachment::new(K::Sticker, &sticker.file.id, sticker.file.size);
        attachment.emoji = sticker.emoji.clone();
        found.push(attachment);
    }
    found
}

/// A shared location, contact, venue or dice throw as the model reads it; `None` for
/// anything else.
pub fn described(message: &Message) -> Option<String> {
    if let Some(venue) = message.venue() {
        let location = &venue.location;
        return Some(format!(
            "📍 venue {}, {} ({}, {})",
            venue.title, venue.address, location.latitude, location.longitude
        ));
    }
    if let Some(location) = message.location() {
        return Some(format!("📍 location {}, {}", location.latitude, location.longitude));
    }
    if let Some(contact) = message.contact() {
        let name = match &contact.last_name {
            Some(last) => format!("{} {last}", contact.first_name),
            None => contact.first_name.clone(),
        };
        return Some(format!("contact: {name} {}", contact.phone_number));
    }
    if let Some(poll) = message.poll() {
        let options: Vec<&str> = poll.options.iter().map(|option| option.text.as_str()).collect();
        return Some(format!("📊 poll: {} (options: {})", poll.question, options.join(" / ")));
    }
    message.dice().map(|dice| {
        // The Bot API names a dice by its emoji.
        let emoji = serde_json::to_value(dice.emoji).ok();
        format!("{} dice: {}", emoji.as_ref().and_then(|e| e.as_str()).unwrap_or("🎲"), dice.value)
    })
}

/// The text or caption, with each `text_link` entity's URL written after its text —
/// `the docs (https://…)` — since the model sees no formatting. The rest stays as it is.
pub fn text_with_links(message: &Message) -> Option<String> {
    let (text, entities) = match message.text() {
        Some(text) => (text, message.parse_entities()),
        None => (message.caption()?, message.parse_caption_entities()),
    };
    Some(write_links(text, entities.unwrap_or_default()))
}

fn write_links(text: &str, entities: Vec<MessageEntityRef<'_>>) -> String {
    let mut links: Vec<(usize, &str)> = entities
        .iter()
        .filter_map(|entity| match entity.kind() {
            // A link whose text is its URL says it already.
            MessageEntityKind::TextLink { url } if entity.text() != url.as_str() => {
                Some((entity.end(), url.as_str()))
            }
            _ => None,
        })
        .collect();
    if links.is_empty() {
        return text.to_owned();
    }
    links.sort_by_key(|(end, _)| *end);
    let mut written =
        String::with_capacity(text.len() + links.iter().map(|(_, url)| url.len() + 3).sum::<usize>());
    let mut from = 0;
    for (end, url) in links {
        // teloxide gives byte ranges on char boundaries; a range that is not is left alone.
        let Some(piece) = text.get(from..end) else { continue };
        written.push_str(piece);
        written.push_str(&format!(" ({url})"));
        from = end;
    }
    written.push_str(text.get(from..).unwrap_or_default());
    written
}

/// The message another one quotes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Quoted {
    pub message_id: i32,
    /// Telegram's partial quote when the user chose one, else the start of the quoted
    /// message's text or caption (or what it shows instead, a placeholder); at most
    /// [`QUOTE_CHARS`] characters.
    pub text: Option<String>,
    /// Who sent it, when Telegram says (the bot, for a reply to one of its messages).
    pub sender_id: Option<i64>,
}

/// The message `message` replies to, if it quotes one. In a forum topic every message
/// "replies" to the topic's first message; that is the topic, not a quote.
pub fn quoted(message: &Message) -> Option<Quoted> {
    let replied = message.reply_to_message()?;
    let topic_root = message.thread_id.filter(|_| message.is_topic_message).map(|thread| thread.0.0);
    if topic_root == Some(replied.id.0) {
        return None;
    }
    let text = match message.quote() {
        Some(quote) if !quote.text.is_empty() => Some(quote.text.clone()),
        _ => readable(replied),
    };
    Some(Quoted {
        message_id: replied.id.0,
        text: text.map(|text| text.chars().take(QUOTE_CHARS).collect()),
        sender_id: replied.from.as_ref().and_then(|user| i64::try_from(user.id.0).ok()),
    })
}

/// What the model would read of a message: its text, else its first file's placeholder,
/// else its location, contact or venue.
pub fn readable(message: &Message) -> Option<String> {
    text_with_links(message)
        .or_else(|| attachments(message).first().map(Attachment::placeholder))
        .or_else(|| described(message))
}

/// Where a forwarded message came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// The origin's @username or name, or its chat's title.
    pub from: String,
    pub date: DateTime<Utc>,
}

pub fn forwarded(message: &Message) -> Option<Forwarded> {
    let origin = message.forward_origin()?;
    let chat_name = |chat: &Chat| {
        chat.title()
            .map(str::to_owned)
            .or_else(|| chat.username().map(|username| format!("@{username}")))
            .unwrap_or_else(|| chat.id.to_string())
    };
    let from = match origin {
        MessageOrigin::User { sender_user, .. } => {
            super::envelope::sender_display(sender_user.username.as_deref(), &sender_user.full_name())
        }
        MessageOrigin::HiddenUser { sender_user_name, .. } => sender_user_name.clone(),
        MessageOrigin::Chat { sender_chat, .. } => chat_name(sender_chat),
        MessageOrigin::Channel { chat, .. } => chat_name(chat),
    };
    Some(Forwarded { from, date: origin.date() })
}

/// What an envelope knows of the messages around it: the one it quotes, where it was
/// forwarded from. Meta for the agent (`reply_to_*`, `forward_*`); the trace id of the
/// quoted envelope is looked up when the envelope is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Context {
    pub quoted: Option<Quoted>,
    pub forwarded: Option<Forwarded>,
    /// The album it belongs to: Telegram sends each photo or file of an album as a message
    /// of its own, with the same `media_group_id`.
    pub album: Option<String>,
}

impl Context {
    pub fn of(message: &Message) -> Self {
        Self {
            quoted: quoted(message),
            forwarded: forwarded(message),
            album: message.media_group_id().map(|group| group.0.clone()),
        }
    }

    /// The meta keys of this context, with the quoted envelope's trace id when intake
    /// found one; `None` when there is nothing to say.
    pub fn meta(
        &self,
        reply_to_trace_id: Option<&str>,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        let mut meta = serde_json::Map::new();
        if let Some(quoted) = &self.quoted {
            meta.insert("reply_to_message_id".into(), quoted.message_id.to_string().into());
            if let Some(text) = &quoted.text {
                meta.insert("reply_to_text".into(), text.clone().into());
            }
            if let Some(trace_id) = reply_to_trace_id {
                meta.insert("reply_to_trace_id".into(), trace_id.into());
            }
        }
        if let Some(forwarded) = &self.forwarded {
            meta.insert("forward_from".into(), forwarded.from.clone().into());
            meta.insert(
                "forward_date".into(),
                forwarded.date.to_rfc3339_opts(SecondsFormat::Secs, true).into(),
            );
        }
        if let Some(album) = &self.album {
            meta.insert("media_group_id".into(), album.clone().into());
        }
        (!meta.is_empty()).then_some(meta)
    }
}

/// A user's reaction to a message (`message_reaction`), as intake reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaction {
    pub update_id: i64,
    pub chat_id: i64,
    pub message_id: i32,
    pub user_id: Option<i64>,
    /// @username, else the name; an anonymous admin's chat title.
    pub user: String,
    /// The reactions now set, each an emoji (a custom emoji as `custom:<id>`, a paid one as
    /// ⭐), in Telegram's order. Empty when the user took all theirs back.
    pub emoji: Vec<String>,
    pub date: DateTime<Utc>,
}

pub fn reaction(update_id: i64, updated: &MessageReactionUpdated) -> Reaction {
    let (user_id, user) = match (updated.user(), updated.chat()) {
        (Some(user), _) => (
            Some(user.id.0 as i64),
            super::envelope::sender_display(user.username.as_deref(), &user.full_name()),
        ),
        (None, Some(chat)) => (Some(chat.id.0), chat.title().unwrap_or("an anonymous admin").to_owned()),
        (None, None) => (None, "unknown".to_owned()),
    };
    let emoji = updated
        .new_reaction
        .iter()
        .map(|reaction| match reaction {
            ReactionType::Emoji { emoji } => emoji.clone(),
            ReactionType::CustomEmoji { custom_emoji_id } => {
                format!("custom:{custom_emoji_id}")
            }
            ReactionType::Paid => "⭐".to_owned(),
        })
        .collect();
    Reaction {
        update_id,
        chat_id: updated.chat.id.0,
        message_id: updated.message_id.0,
        user_id,
        user,
        emoji,
        date: crate::rules::dates::within_ledger(updated.date),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_clock() {
        assert_eq!(clock(12), "0:12");
        assert_eq!(clock(63), "1:03");
        assert_eq!(clock(3_723), "1:02:03");
    }

    #[test]
    fn stored_attachments_skip_what_this_release_cannot_read() {
        let stored = r#"[{"kind":"location","file_id":null,"detail":"1, 2"},
                         {"kind":"photo","file_id":"p","detail":"800x600"}]"#;
        let read = stored_attachments(stored);
        assert_eq!(read.len(), 1);
        assert_eq!(
            (read[0].kind, read[0].file_id.as_str(), read[0].size),
            (AttachmentKind::Photo, "p", None)
        );
        assert!(stored_attachments("not json").is_empty());
    }
}
