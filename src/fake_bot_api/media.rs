//! Inbound updates beyond plain text, as Telegram shapes them: files (a document, a voice
//! note, any message content a test writes), quotes of a user's or the bot's message,
//! forwards, `text_link` entities, and reactions (`message_reaction`); and what the poller
//! asked for with `allowed_updates`.

use std::borrow::Borrow;

use serde_json::{Value, json};

use super::server::{chat_json, unix_now};
use super::state::PendingUpdate;
use super::{BOT_FIRST_NAME, BOT_USER_ID, BOT_USERNAME, ChatSpec, FakeTelegram, PushedMessage, UserSpec};

impl FakeTelegram {
    /// Queues a message of `chat` from `from` whose content is `content` (merged into the
    /// message object: `"document": {…}`, `"entities": […]`, `"forward_origin": {…}`);
    /// returns its update id and message id.
    pub fn push_message_content(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        content: Value,
    ) -> PushedMessage {
        self.push_message_with_id("message", chat.borrow(), Some(from.borrow()), None, content)
    }

    /// Queues a document; each of its name, type and size may be left out, as Telegram may.
    pub fn push_document(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        file_name: Option<&str>,
        mime_type: Option<&str>,
        file_size: Option<u64>,
    ) -> PushedMessage {
        let id = self.shared.lock().take_file_seq();
        let mut document = json!({
            "file_id": format!("fake-document-{id}"),
            "file_unique_id": format!("fake-document-{id}-u"),
        });
        if let Some(name) = file_name {
            document["file_name"] = json!(name);
        }
        if let Some(mime) = mime_type {
            document["mime_type"] = json!(mime);
        }
        if let Some(size) = file_size {
            document["file_size"] = json!(size);
        }
        self.push_message_content(chat, from, json!({ "document": document }))
    }

    /// Queues a voice note of `duration_secs`, without a caption.
    pub fn push_voice(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        duration_secs: u32,
    ) -> PushedMessage {
        let id = self.shared.lock().take_file_seq();
        let voice = json!({
            "file_id": format!("fake-voice-{id}"),
            "file_unique_id": format!("fake-voice-{id}-u"),
            "duration": duration_secs,
            "mime_type": "audio/ogg",
            "file_size": 4_000 + u64::from(duration_secs) * 1_000,
        });
        self.push_message_content(chat, from, json!({ "voice": voice }))
    }

    /// Queues `text` quoting the message the bot sent as `sent_message_id` (which the fake
    /// must have accepted), as Telegram does: the quoted message in full, from the bot.
    pub fn push_reply_to_sent(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        sent_message_id: i32,
        text: &str,
    ) -> PushedMessage {
        let sent =
            self.sent_message(sent_message_id).expect("push_reply_to_sent: the bot sent no such message");
        let chat = chat.borrow();
        let bot = json!({"id": BOT_USER_ID, "is_bot": true, "first_name": BOT_FIRST_NAME, "username": BOT_USERNAME});
        let quoted = json!({
            "message_id": sent_message_id,
            "date": unix_now(),
            "chat": chat_json(chat.id, &chat.kind),
            "from": bot,
            "text": sent.text,
        });
        self.push_message_content(chat, from, json!({ "text": text, "reply_to_message": quoted }))
    }

    /// Queues `text` quoting a message a user sent (`quoted_id`, with `quoted_text`).
    pub fn push_reply_to_user(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        quoted_from: &UserSpec,
        quoted_id: i32,
        quoted_text: &str,
        text: &str,
    ) -> PushedMessage {
        let chat = chat.borrow();
        let quoted = json!({
            "message_id": quoted_id,
            "date": unix_now(),
            "chat": chat_json(chat.id, &chat.kind),
            "from": quoted_from.to_json(),
            "text": quoted_text,
        });
        self.push_message_content(chat, from, json!({ "text": text, "reply_to_message": quoted }))
    }

    /// Queues `text` as forwarded by `from` from a message `origin` sent at `origin_date`
    /// (Unix seconds).
    pub fn push_forwarded_text(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        origin: &UserSpec,
        origin_date: i64,
        text: &str,
    ) -> PushedMessage {
        let forward_origin = json!({"type": "user", "date": origin_date, "sender_user": origin.to_json()});
        self.push_message_content(chat, from, json!({ "text": text, "forward_origin": forward_origin }))
    }

    /// Queues `text` with one `text_link` entity per (`linked`, URL): each `linked` is the
    /// first occurrence of that text in `text`. Offsets count UTF-16 units, as Telegram's do.
    pub fn push_text_with_links(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        text: &str,
        links: &[(&str, &str)],
    ) -> PushedMessage {
        let utf16_len = |s: &str| s.encode_utf16().count();
        let entities: Vec<Value> = links
            .iter()
            .map(|(linked, url)| {
                let at = text.find(linked).expect("push_text_with_links: the linked text is in the text");
                json!({"type": "text_link", "offset": utf16_len(&text[..at]), "length": utf16_len(linked), "url": url})
            })
            .collect();
        self.push_message_content(chat, from, json!({ "text": text, "entities": entities }))
    }

    /// Queues `from`'s reaction to message `message_id` of `chat`: `emoji` is what is set
    /// now (empty: all taken back). As Telegram, the fake serves it only to a client whose
    /// last `allowed_updates` listed `message_reaction`.
    pub fn push_reaction(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        message_id: i32,
        emoji: &[&str],
    ) -> i64 {
        let chat = chat.borrow();
        let new_reaction: Vec<Value> = emoji.iter().map(|e| json!({"type": "emoji", "emoji": e})).collect();
        let id = {
            let mut state = self.shared.lock();
            let id = state.take_update_id();
            let update = json!({
                "update_id": id,
                "message_reaction": {
                    "chat": chat_json(chat.id, &chat.kind),
                    "message_id": message_id,
                    "user": from.borrow().to_json(),
                    "date": unix_now(),
                    "old_reaction": [],
                    "new_reaction": new_reaction,
                },
            });
            let mut pending = PendingUpdate::new(id, update.to_string());
            // Telegram sends reactions only to a bot that asks for them.
            pending.opt_in_kind = Some("message_reaction");
            state.push_update(pending);
            id
        };
        self.shared.changed.notify_waiters();
        id
    }

    /// The `allowed_updates` of every `getUpdates` call so far, in order; `None` for a
    /// call that gave none.
    pub fn allowed_updates_requested(&self) -> Vec<Option<Vec<String>>> {
        self.requests_for("getUpdates")
            .iter()
            .map(|params| {
                let allowed = params.get("allowed_updates")?;
                // A form or query parameter arrives as JSON text.
                let allowed = match allowed {
                    Value::String(text) => serde_json::from_str(text).ok()?,
                    other => other.clone(),
                };
                serde_json::from_value(allowed).ok()
            })
            .collect()
    }
}
