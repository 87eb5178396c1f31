//! Inline keyboards in the fake: the buttons a `sendMessage` carried, a press on one
//! (a `callback_query` update), `answerCallbackQuery`, and `editMessageText` /
//! `editMessageReplyMarkup` of a message the bot sent.

use std::time::Duration;

use axum::response::Response;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::server::{bad_request, bot_user_json, chat_json, int_param, ok, str_param, unix_now};
use super::state::{PendingUpdate, Shared};
use super::{FakeTelegram, SentMessage, UserSpec};

/// An `answerCallbackQuery` the fake received.
#[derive(Clone, Debug, PartialEq)]
pub struct CallbackAnswer {
    pub callback_query_id: String,
    /// What the presser was shown; `None` when the answer said nothing.
    pub text: Option<String>,
}

/// An edit of a message the bot sent, as accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct EditedMessage {
    pub chat_id: i64,
    pub message_id: i32,
    /// `editMessageText`, or `editMessageReplyMarkup`.
    pub method: String,
    /// The new text (`None` for a markup-only edit).
    pub text: Option<String>,
    /// The inline keyboard the message has after the edit; `None`: no buttons left.
    pub reply_markup: Option<Value>,
}

impl SentMessage {
    /// The `reply_markup` the message was sent with (an inline keyboard), if any.
    pub fn reply_markup(&self) -> Option<Value> {
        markup_param(self.raw.as_object()?)
    }

    /// Every `callback_data` of the message's inline keyboard, row by row.
    pub fn callback_data(&self) -> Vec<String> {
        callback_data_of(self.reply_markup().as_ref())
    }
}

/// Every `callback_data` of an inline keyboard.
pub fn callback_data_of(markup: Option<&Value>) -> Vec<String> {
    markup
        .and_then(|markup| markup.get("inline_keyboard"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|button| button.get("callback_data").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// `reply_markup` as a JSON object, whether it came as one or as JSON text (form bodies).
fn markup_param(params: &Map<String, Value>) -> Option<Value> {
    match params.get("reply_markup")? {
        Value::String(text) => serde_json::from_str(text).ok(),
        Value::Null => None,
        other => Some(other.clone()),
    }
}

/// `answerCallbackQuery`.
pub(super) fn answer_callback_query(shared: &Shared, params: &Map<String, Value>) -> Response {
    let Some(callback_query_id) = str_param(params, "callback_query_id") else {
        return bad_request("Bad Request: query id is empty");
    };
    let text = str_param(params, "text").filter(|text| !text.is_empty());
    shared.lock().callback_answers.push(CallbackAnswer { callback_query_id, text });
    shared.changed.notify_waiters();
    ok(json!(true))
}

/// `editMessageText` and `editMessageReplyMarkup` of a message the bot sent. Like
/// Telegram, an edit that changes nothing is refused ("message is not modified").
pub(super) fn edit_message(shared: &Shared, method: &str, params: &Map<String, Value>) -> Response {
    let chat_id = match int_param(params, "chat_id") {
        Ok(Some(chat_id)) => chat_id,
        _ => return bad_request("Bad Request: chat_id is empty"),
    };
    let message_id = match int_param(params, "message_id") {
        Ok(Some(id)) => id as i32,
        _ => return bad_request("Bad Request: message_id is empty"),
    };
    let text_edit = method == "editmessagetext";
    let new_text = if text_edit {
        match str_param(params, "text").filter(|text| !text.is_empty()) {
            Some(text) => Some(text),
            None => return bad_request("Bad Request: message text is empty"),
        }
    } else {
        None
    };
    let new_markup = markup_param(params);
    let mut state = shared.lock();
    let Some(sent) = state.sent.iter().find(|sent| sent.chat_id == chat_id && sent.message_id == message_id)
    else {
        return bad_request("Bad Request: message to edit not found");
    };
    let (current_text, current_markup) = state
        .edits
        .iter()
        .rev()
        .find(|edit| edit.chat_id == chat_id && edit.message_id == message_id)
        .map(|edit| {
            let text = edit.text.clone().unwrap_or_else(|| sent.text.clone());
            (text, edit.reply_markup.clone())
        })
        .unwrap_or_else(|| (sent.text.clone(), sent.reply_markup()));
    let text = new_text.clone().unwrap_or(current_text.clone());
    if text == current_text && new_markup == current_markup {
        return bad_request(
            "Bad Request: message is not modified: specified new message content and reply markup are exactly the \
             same as a current content and reply markup of the message",
        );
    }
    let kind = state.chat_kind(chat_id);
    state.edits.push(EditedMessage {
        chat_id,
        message_id,
        method: if text_edit { "editMessageText" } else { "editMessageReplyMarkup" }.to_owned(),
        text: new_text,
        reply_markup: new_markup.clone(),
    });
    drop(state);
    shared.changed.notify_waiters();
    let mut message = json!({
        "message_id": message_id,
        "date": unix_now(),
        "edit_date": unix_now(),
        "chat": chat_json(chat_id, &kind),
        "from": bot_user_json(),
        "text": text,
    });
    if let Some(markup) = new_markup {
        message["reply_markup"] = markup;
    }
    ok(message)
}

impl FakeTelegram {
    /// Queues a press by `from` on a button with `data` under the bot's message `message`
    /// (a `callback_query` update). Returns the update id and the query's id, which the
    /// bot's `answerCallbackQuery` names.
    pub fn push_callback_query(&self, from: &UserSpec, message: &SentMessage, data: &str) -> (i64, String) {
        let pushed = {
            let mut state = self.shared.lock();
            let update_id = state.take_update_id();
            let query_id = format!("cbq{update_id}");
            let kind = state.chat_kind(message.chat_id);
            let mut shown = json!({
                "message_id": message.message_id,
                "date": unix_now(),
                "chat": chat_json(message.chat_id, &kind),
                "from": bot_user_json(),
                "text": message.text,
            });
            if let Some(thread_id) = message.message_thread_id {
                shown["message_thread_id"] = json!(thread_id);
            }
            let update = json!({
                "update_id": update_id,
                "callback_query": {
                    "id": query_id,
                    "from": from.to_json(),
                    "chat_instance": format!("ci{}", message.chat_id),
                    "data": data,
                    "message": shown,
                },
            });
            state.push_update(PendingUpdate::new(update_id, update.to_string()));
            (update_id, query_id)
        };
        self.shared.changed.notify_waiters();
        pushed
    }

    /// Every `answerCallbackQuery` received, in order.
    pub fn callback_answers(&self) -> Vec<CallbackAnswer> {
        self.shared.lock().callback_answers.clone()
    }

    /// Waits for the answer to the callback query `query_id`. Panics if `within` passes.
    pub async fn wait_for_callback_answer(&self, query_id: &str, within: Duration) -> CallbackAnswer {
        let deadline = Instant::now() + within;
        let found = self
            .shared
            .wait_for(Some(deadline), |state| {
                state.callback_answers.iter().find(|answer| answer.callback_query_id == query_id).cloned()
            })
            .await;
        found.unwrap_or_else(|| panic!("no answerCallbackQuery for {query_id} within {within:?}"))
    }

    /// Every accepted edit of the bot's message `message_id`, in order.
    pub fn edits_of(&self, message_id: i32) -> Vec<EditedMessage> {
        self.shared.lock().edits.iter().filter(|edit| edit.message_id == message_id).cloned().collect()
    }

    /// Waits until an accepted edit of `message_id` satisfies `done`, and returns it.
    /// Panics if `within` passes.
    pub async fn wait_for_edit(
        &self,
        message_id: i32,
        within: Duration,
        mut done: impl FnMut(&EditedMessage) -> bool,
    ) -> EditedMessage {
        let deadline = Instant::now() + within;
        let found = self
            .shared
            .wait_for(Some(deadline), |state| {
                state.edits.iter().rev().find(|edit| edit.message_id == message_id && done(edit)).cloned()
            })
            .await;
        found.unwrap_or_else(|| {
            panic!(
                "no matching edit of message {message_id} within {within:?}; edits: {:#?}",
                self.edits_of(message_id)
            )
        })
    }
}

/// Answers a method this module implements; `None` for any other.
pub(super) fn answer(shared: &Shared, method: &str, params: &Map<String, Value>) -> Option<Response> {
    Some(match method {
        "answercallbackquery" => answer_callback_query(shared, params),
        "editmessagetext" | "editmessagereplymarkup" => edit_message(shared, method, params),
        _ => return None,
    })
}
