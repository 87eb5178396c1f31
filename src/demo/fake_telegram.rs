//! The demo's Telegram: a small Bot API server inside the demo process, on loopback. It
//! serves what the daemon calls (`getUpdates` with Telegram's offset and long-poll rules,
//! `sendMessage`, and `getMe` for rooms) and lets the demo push messages into private chats,
//! groups and supergroups, see every message the bot sent, wait for one, and hold one send
//! on the wire (recorded, never answered) to crash the daemon mid-send.
//!
//! The test suite has a fuller fake with fault injection (`tests/support/fake_telegram.rs`);
//! this one is deliberately small, and lives in the binary so `switchboard demo` needs
//! nothing but itself.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The only token the fake accepts. The bot's id (its prefix) keys the poll offset.
pub const TOKEN: &str = "4242424242:demo-token-of-the-embedded-fake-telegram";
/// Who the bot is, for `getMe`: the id of [`TOKEN`], and a username.
const BOT_ID: i64 = 4_242_424_242;
const BOT_USERNAME: &str = "switchboard_demo_bot";

/// Update ids and message ids come from counters far apart, so the narration never
/// confuses them.
const FIRST_UPDATE_ID: i64 = 700_001;
const FIRST_MESSAGE_ID: i32 = 1;

/// Telegram holds a long poll open at most this long.
const MAX_LONG_POLL: Duration = Duration::from_secs(50);

/// A chat messages are pushed into.
#[derive(Debug, Clone)]
pub struct Chat {
    pub id: i64,
    /// Telegram's chat type: `private`, `group` or `supergroup`.
    pub kind: &'static str,
    /// A group's title; a private chat has none.
    pub title: Option<&'static str>,
}

/// A person who writes to the bot.
#[derive(Debug, Clone)]
pub struct Person {
    pub id: i64,
    pub first_name: &'static str,
    pub username: &'static str,
}

/// A message the bot sent, as Telegram recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub message_id: i32,
    pub chat_id: i64,
    pub reply_to_message_id: Option<i32>,
    pub text: String,
}

/// A pushed message: its update id and its message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    pub update_id: i64,
    pub message_id: i32,
}

#[derive(Default)]
struct State0 {
    /// Not yet confirmed by an offset: (update id, JSON text).
    updates: VecDeque<(i64, String)>,
    next_update_id: i64,
    next_message_id: i32,
    sent: Vec<Sent>,
    /// Sends still to answer before the one to hold; `None` when nothing is to be held.
    hold_after: Option<usize>,
    /// The message of the held send, once one was held.
    held: Option<i32>,
    /// Bumped by every poll: a newer poll ends an older one with 409, as Telegram does.
    poll_generation: u64,
}

struct Shared {
    state: Mutex<State0>,
    changed: Notify,
    stop: CancellationToken,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State0> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until `check` yields or `deadline` passes.
    async fn wait_for<T>(&self, deadline: Instant, mut check: impl FnMut(&State0) -> Option<T>) -> Option<T> {
        loop {
            let notified = self.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(ready) = check(&self.lock()) {
                return Some(ready);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => return None,
                () = self.stop.cancelled() => return None,
            }
        }
    }
}

/// The running fake; stops when dropped.
pub struct FakeTelegram {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl FakeTelegram {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = State0 {
            next_update_id: FIRST_UPDATE_ID,
            next_message_id: FIRST_MESSAGE_ID,
            ..State0::default()
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            changed: Notify::new(),
            stop: CancellationToken::new(),
        });
        let app = Router::new().fallback(handle).with_state(Arc::clone(&shared));
        let stop = shared.stop.clone();
        tokio::spawn(async move {
            // Only fails when the runtime goes away, with the demo.
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Ok(Self { shared, addr })
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A text message from `from` in `chat`, as the next update.
    pub fn push_text(&self, chat: &Chat, from: &Person, text: &str) -> Pushed {
        self.push_message(chat, from, None, text)
    }

    /// `from` edits their message `message_id` in `chat` to `text`, as the next update.
    pub fn push_edit(&self, chat: &Chat, from: &Person, message_id: i32, text: &str) -> Pushed {
        self.push_message(chat, from, Some(message_id), text)
    }

    /// A new message, or with `edited` an edit of that earlier one.
    fn push_message(&self, chat: &Chat, from: &Person, edited: Option<i32>, text: &str) -> Pushed {
        let mut state = self.shared.lock();
        let update_id = state.next_update_id;
        state.next_update_id += 1;
        let message_id = match edited {
            Some(message_id) => message_id,
            None => {
                state.next_message_id += 1;
                state.next_message_id - 1
            }
        };
        let chat_json = match chat.title {
            Some(title) => json!({"id": chat.id, "type": chat.kind, "title": title}),
            None => json!({"id": chat.id, "type": chat.kind, "first_name": from.first_name}),
        };
        let mut message = json!({
            "message_id": message_id,
            "date": unix_now(),
            "chat": chat_json,
            "from": {"id": from.id, "is_bot": false, "first_name": from.first_name, "username": from.username},
            "text": text,
        });
        let kind = match edited {
            Some(_) => {
                // The original predates its edit.
                message["date"] = json!(unix_now() - 60);
                message["edit_date"] = json!(unix_now());
                "edited_message"
            }
            None => "message",
        };
        let update = json!({ "update_id": update_id, kind: message });
        state.updates.push_back((update_id, update.to_string()));
        drop(state);
        self.shared.changed.notify_waiters();
        Pushed { update_id, message_id }
    }

    /// Every message the bot sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.lock().sent.clone()
    }

    /// Waits until the bot sent a message `wanted` picks; the first such message.
    pub async fn wait_for_sent(&self, within: Duration, wanted: impl Fn(&Sent) -> bool) -> Option<Sent> {
        self.shared
            .wait_for(Instant::now() + within, |state| state.sent.iter().find(|m| wanted(m)).cloned())
            .await
    }

    /// Answers `answered` more sends normally, then records the next one as sent (it
    /// reaches the chat) and never answers it: the daemon cannot know it arrived.
    pub fn hold_send_after(&self, answered: usize) {
        self.shared.lock().hold_after = Some(answered);
    }

    /// Waits until a send is being held; its message id.
    pub async fn wait_for_held(&self, within: Duration) -> Option<i32> {
        self.shared.wait_for(Instant::now() + within, |state| state.held).await
    }

    /// Whether every pushed update has been confirmed by the poller's offset.
    pub fn all_confirmed(&self) -> bool {
        self.shared.lock().updates.is_empty()
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

async fn handle(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    let Some((token, method)) = uri.path().strip_prefix("/bot").and_then(|rest| rest.split_once('/')) else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    if token != TOKEN {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    let params: Value = serde_json::from_slice(&body).unwrap_or_else(|_| json!({}));
    match method.to_ascii_lowercase().as_str() {
        "getupdates" => get_updates(&shared, &params).await,
        "sendmessage" => send_message(&shared, &params).await,
        "getme" => ok(bot_me()),
        _ => error(StatusCode::NOT_FOUND, &format!("Not Found: the demo's Telegram has no method {method}")),
    }
}

async fn get_updates(shared: &Shared, params: &Value) -> Response {
    let offset = params["offset"].as_i64().unwrap_or(0);
    let limit = params["limit"].as_u64().unwrap_or(100).clamp(1, 100) as usize;
    let timeout = Duration::from_secs(params["timeout"].as_u64().unwrap_or(0)).min(MAX_LONG_POLL);
    let generation = {
        let mut state = shared.lock();
        // An offset confirms every update below it.
        state.updates.retain(|(id, _)| *id >= offset);
        state.poll_generation += 1;
        state.poll_generation
    };
    shared.changed.notify_waiters();
    enum Answer {
        Batch(Vec<String>),
        Superseded,
    }
    let answer = shared
        .wait_for(Instant::now() + timeout, |state| {
            if state.poll_generation != generation {
                return Some(Answer::Superseded);
            }
            let batch: Vec<String> = state
                .updates
                .iter()
                .filter(|(id, _)| *id >= offset)
                .take(limit)
                .map(|(_, text)| text.clone())
                .collect();
            (!batch.is_empty()).then_some(Answer::Batch(batch))
        })
        .await;
    match answer {
        Some(Answer::Batch(batch)) => {
            let body = format!("{{\"ok\":true,\"result\":[{}]}}", batch.join(","));
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        Some(Answer::Superseded) => {
            error(StatusCode::CONFLICT, "Conflict: terminated by other getUpdates request")
        }
        None => ok(json!([])),
    }
}

async fn send_message(shared: &Shared, params: &Value) -> Response {
    let (Some(chat_id), Some(text)) = (params["chat_id"].as_i64(), params["text"].as_str()) else {
        return error(StatusCode::BAD_REQUEST, "Bad Request: chat_id and text are required");
    };
    let reply_to = params["reply_parameters"]["message_id"].as_i64().and_then(|id| i32::try_from(id).ok());
    let (message, hold) = {
        let mut state = shared.lock();
        let message_id = state.next_message_id;
        state.next_message_id += 1;
        state.sent.push(Sent { message_id, chat_id, reply_to_message_id: reply_to, text: text.to_owned() });
        let hold = match state.hold_after {
            Some(0) => {
                state.hold_after = None;
                state.held = Some(message_id);
                true
            }
            Some(n) => {
                state.hold_after = Some(n - 1);
                false
            }
            None => false,
        };
        let message = json!({
            "message_id": message_id,
            "date": unix_now(),
            "chat": {"id": chat_id, "type": if chat_id > 0 { "private" } else { "group" }},
            "text": text,
        });
        (message, hold)
    };
    shared.changed.notify_waiters();
    if hold {
        // On the wire for good: the message is in the chat, its answer never comes.
        shared.stop.cancelled().await;
    }
    ok(message)
}

/// The bot, with privacy mode off: it sees every message in its groups, as rooms need.
fn bot_me() -> Value {
    json!({
        "id": BOT_ID,
        "is_bot": true,
        "first_name": "Switchboard demo",
        "username": BOT_USERNAME,
        "can_join_groups": true,
        "can_read_all_group_messages": true,
        "supports_inline_queries": false,
    })
}

fn ok(result: Value) -> Response {
    axum::Json(json!({"ok": true, "result": result})).into_response()
}

fn error(status: StatusCode, description: &str) -> Response {
    (status, axum::Json(json!({"ok": false, "error_code": status.as_u16(), "description": description})))
        .into_response()
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs() as i64)
}

/// Chats and people of the demo.
pub mod cast {
    use super::{Chat, Person};

    pub const OLGA: Person = Person { id: 111_222_333, first_name: "Olga", username: "olga" };
    pub const PRIYA: Person = Person { id: 222_333_444, first_name: "Priya", username: "priya" };
    /// Olga's direct line with the bot.
    pub const OWNER_DM: Chat = Chat { id: 111_222_333, kind: "private", title: None };
    /// A team group.
    pub const OPS_GROUP: Chat = Chat { id: -4_000_111, kind: "group", title: Some("Ops team") };
    /// A group room: Olga with the builder and the reviewer.
    pub const DEV_ROOM: Chat = Chat { id: -1_004_000_222_333, kind: "supergroup", title: Some("Dev room") };
}
