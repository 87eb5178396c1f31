//! A fake Telegram Bot API server owned by integration tests and benchmarks.
//!
//! The daemon talks to it exactly as it would talk to `api.telegram.org`
//! (point teloxide at [`FakeTelegram::api_url`] with [`TEST_TOKEN`]), while the
//! test pushes inbound updates, observes outbound `sendMessage` calls and
//! injects faults.
//!
//! Behaviour mirrors the real Bot API where the daemon could notice the
//! difference:
//!
//! * method names are case-insensitive (teloxide sends `GetUpdates`);
//! * parameters are accepted as a JSON body, an urlencoded form body or a query
//!   string, with Telegram's lenient coercions ("42" is an integer);
//! * an update stays pending until a `getUpdates` call sends an `offset`
//!   greater than its id, so a client that crashes between receiving and
//!   confirming sees the update again;
//! * updates are served as JSON text, so a test can serve one that is not
//!   valid JSON or that `serde_json::Value` cannot hold
//!   ([`FakeTelegram::push_raw_update_text`]), and an id can come back with
//!   other content, as after a week without updates
//!   ([`FakeTelegram::reuse_update_id`]);
//! * long polls wake as soon as an update is pushed, and a newer `getUpdates`
//!   terminates an older one still waiting with the real 409 "Conflict";
//! * once a group has migrated ([`FakeTelegram::push_migration`]) `sendMessage`
//!   to the old id fails with `migrate_to_chat_id`;
//! * errors carry the HTTP status, `error_code`, `description` and
//!   `parameters` that teloxide uses to pick its `RequestError` variant.
//!
//! Deliberate differences: unknown methods answer 404 with a description that
//! names the method (real Telegram says just "Not Found", which teloxide
//! misreports as an invalid token); update ids and message ids come from two
//! global counters (update ids start at [`FIRST_UPDATE_ID`] so they are never
//! confused with message ids in assertions); multipart uploads are rejected.
//!
//! This file is included both from `tests/` and from `benches/` via `#[path]`,
//! so it must stay self-contained: external crates only, no `crate::` paths.

#![allow(dead_code)]

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The only token the fake accepts; anything else gets 401 "Unauthorized".
/// Its text makes any leak into logs or error messages easy to grep for.
pub const TEST_TOKEN: &str = "123456:TEST-token-that-must-never-be-logged";

/// The bot's user id, which Telegram derives from the token prefix.
pub const BOT_USER_ID: i64 = 123456;
pub const BOT_FIRST_NAME: &str = "Switchboard Test Bot";
pub const BOT_USERNAME: &str = "switchboard_test_bot";

/// Update ids start far away from message ids so a test (or daemon) that
/// mixes the two up fails loudly instead of passing by coincidence.
pub const FIRST_UPDATE_ID: i64 = 100_000;
pub const FIRST_MESSAGE_ID: i32 = 1;

/// Telegram's limit for `sendMessage` text. The fake does not parse
/// `parse_mode` markup, so it checks the raw text: stricter than Telegram for
/// formatted messages, never more lenient.
pub const MAX_MESSAGE_UTF16_LEN: usize = 4096;

/// Sender of the service message produced by [`FakeTelegram::push_migration`].
const MIGRATION_ADMIN_ID: i64 = 1_000;

const CONFLICT_DESCRIPTION: &str = "Conflict: terminated by other getUpdates request; \
                                    make sure that only one bot instance is running";

// ---------------------------------------------------------------------------
// Public test-facing types
// ---------------------------------------------------------------------------

/// What kind of chat an update comes from. Determines the `chat` object the
/// fake emits, which teloxide needs to tell private chats from groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatKind {
    Private { first_name: String },
    Group { title: String },
    Supergroup { title: String, is_forum: bool },
}

/// A chat that inbound updates are pushed into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatSpec {
    pub id: i64,
    pub kind: ChatKind,
}

impl ChatSpec {
    /// A private chat. Telegram private chat ids equal the user's id, so they
    /// are positive.
    pub fn private(id: i64) -> Self {
        assert!(id > 0, "private chat ids are positive user ids, got {id}");
        Self { id, kind: ChatKind::Private { first_name: format!("User {id}") } }
    }

    /// The private chat between the bot and `user`, named after them.
    pub fn private_with(user: &UserSpec) -> Self {
        Self { id: user.id, kind: ChatKind::Private { first_name: user.first_name.clone() } }
    }

    /// A basic group (negative id, no topics).
    pub fn group(id: i64, title: &str) -> Self {
        assert!(id < 0, "group chat ids are negative, got {id}");
        Self { id, kind: ChatKind::Group { title: title.to_owned() } }
    }

    /// A supergroup without topics.
    pub fn supergroup(id: i64, title: &str) -> Self {
        assert!(id < 0, "supergroup chat ids are negative, got {id}");
        Self { id, kind: ChatKind::Supergroup { title: title.to_owned(), is_forum: false } }
    }

    /// A supergroup with topics enabled (a "forum").
    pub fn forum(id: i64, title: &str) -> Self {
        assert!(id < 0, "forum chat ids are negative, got {id}");
        Self { id, kind: ChatKind::Supergroup { title: title.to_owned(), is_forum: true } }
    }

    fn to_json(&self) -> Value {
        chat_json(self.id, &self.kind)
    }
}

/// The human sender of an inbound message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserSpec {
    pub id: i64,
    pub first_name: String,
    pub username: Option<String>,
}

impl UserSpec {
    pub fn new(id: i64, first_name: &str) -> Self {
        // teloxide's `UserId` is a u64: a negative id would not fail loudly but
        // silently turn the whole update into `UpdateKind::Error`.
        assert!(id > 0, "Telegram user ids are positive, got {id}");
        Self { id, first_name: first_name.to_owned(), username: None }
    }

    pub fn with_username(mut self, username: &str) -> Self {
        self.username = Some(username.to_owned());
        self
    }

    fn to_json(&self) -> Value {
        let mut user = json!({
            "id": self.id,
            "is_bot": false,
            "first_name": self.first_name,
        });
        if let Some(username) = &self.username {
            user["username"] = json!(username);
        }
        user
    }
}

/// A `sendMessage` call that the fake accepted, i.e. that "reached the user".
#[derive(Clone, Debug, PartialEq)]
pub struct SentMessage {
    /// The id the fake assigned and returned to the client.
    pub message_id: i32,
    pub chat_id: i64,
    pub text: String,
    pub message_thread_id: Option<i32>,
    /// From `reply_parameters.message_id`, or the legacy
    /// `reply_to_message_id` parameter.
    pub reply_to_message_id: Option<i32>,
    pub parse_mode: Option<String>,
    /// The request parameters exactly as received, for anything else.
    pub raw: Value,
    /// When the fake accepted the request, so a benchmark can time the hop from a
    /// reply call to Telegram. A `std` instant rather than tokio's: it keeps counting
    /// when a test pauses tokio's clock.
    pub received_at: std::time::Instant,
}

/// A failure injected into one request of a method; see
/// [`FakeTelegram::fail_method`]. Unless stated otherwise the request has no
/// effect (nothing is recorded as sent, no offset is confirmed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `parameters.retry_after` (teloxide: `RequestError::RetryAfter`).
    TooManyRequests { retry_after: u32 },
    /// 500 "Internal Server Error". Beware: teloxide sleeps 10 seconds on any
    /// 5xx status before reporting the error.
    ServerError,
    /// 400 with this description, used verbatim. Include the "Bad Request: "
    /// prefix for teloxide to map it onto a specific `ApiError` variant.
    BadRequest(String),
    /// 403 with this description, e.g. "Forbidden: bot was blocked by the user".
    Forbidden(String),
    /// 409 "Conflict: terminated by other getUpdates request; ...".
    Conflict,
    /// 400 with `parameters.migrate_to_chat_id`
    /// (teloxide: `RequestError::MigrateToChatId`).
    MigrateTo(i64),
    /// Perform the request for real (for `sendMessage`: record the message as
    /// sent; for `getUpdates`: apply the offset), then wait this long before
    /// answering. With a delay beyond the client's timeout, the client cannot
    /// know that Telegram acted on its request.
    RecordThenHang(Duration),
    /// Wait this long without performing the request, then answer 504. Models
    /// a request lost on the way: the client should time out first.
    HangWithoutRecording(Duration),
    /// 200 with an HTML body, as from a misbehaving proxy.
    MalformedBody,
    /// No fault: the request is performed and answered normally. Queue it before another
    /// fault to make a later request fail (the second part of a split reply, say).
    Pass,
    /// Perform the request for real, then answer 500: Telegram (or a proxy in front of
    /// it) failed after the message was posted.
    RecordThenServerError,
    /// Any other response, verbatim. Sent as JSON if `body` parses as JSON.
    Raw { status: u16, body: String },
}

// ---------------------------------------------------------------------------
// The fake server
// ---------------------------------------------------------------------------

/// A running fake Bot API server. Dropping it stops the server: the listener
/// closes, waiting long polls return, and idle keep-alive connections are
/// closed so the client sees connection errors rather than a zombie server.
pub struct FakeTelegram {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Option<JoinHandle<()>>,
}

impl FakeTelegram {
    /// Binds 127.0.0.1 on a free port and serves until dropped.
    pub async fn start() -> Self {
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("fake Telegram: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake Telegram: local_addr");

        let shared = Arc::new(Shared { state: Mutex::new(State::new()), changed: Notify::new() });
        let app = Router::new().fallback(handle_request).with_state(Arc::clone(&shared));

        // Graceful shutdown closes the connections axum already accepted, so
        // a client holding a pooled keep-alive connection sees errors instead
        // of a server that outlived its test, and lets `shutdown` await the
        // server winding down.
        let signal_shared = Arc::clone(&shared);
        let shutdown_signal = async move {
            signal_shared.wait_for(None, |state| state.shut_down.then_some(())).await;
        };
        let server = tokio::spawn(async move {
            // Serving on an already-bound loopback listener only fails if the
            // runtime is going away, when there is nobody left to tell.
            let _ = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal).await;
        });

        Self { shared, addr, server: Some(server) }
    }

    /// Base URL for teloxide's `Bot::set_api_url`; teloxide appends
    /// `/bot<token>/<Method>`.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits (briefly) for it to wind down. Dropping
    /// does the same without waiting.
    pub async fn shutdown(mut self) {
        self.shared.begin_shutdown();
        if let Some(server) = self.server.take() {
            // Handlers return promptly once shut down, so this only times out
            // if something is badly wrong; don't hang the test on it.
            let abort = server.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), server).await.is_err() {
                abort.abort();
            }
        }
    }

    // -- inbound updates ----------------------------------------------------

    /// Queues a text message; returns its update id.
    pub fn push_text(&self, chat: impl Borrow<ChatSpec>, from: impl Borrow<UserSpec>, text: &str) -> i64 {
        self.push_message("message", chat.borrow(), Some(from.borrow()), None, json!({ "text": text }))
    }

    /// Queues a text message in forum topic `thread_id`; returns its update id.
    pub fn push_topic_text(
        &self,
        chat: impl Borrow<ChatSpec>,
        thread_id: i32,
        from: impl Borrow<UserSpec>,
        text: &str,
    ) -> i64 {
        self.push_message(
            "message",
            chat.borrow(),
            Some(from.borrow()),
            None,
            json!({
                "text": text,
                "message_thread_id": thread_id,
                "is_topic_message": true,
            }),
        )
    }

    /// Queues a photo message, optionally captioned; returns its update id.
    pub fn push_photo_with_caption(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        caption: Option<&str>,
    ) -> i64 {
        let id = self.shared.lock().take_file_seq();
        // Telegram sends several sizes of every photo, smallest first.
        let mut content = json!({
            "photo": [
                {
                    "file_id": format!("fake-photo-{id}-small"),
                    "file_unique_id": format!("fake-photo-{id}-s"),
                    "width": 90, "height": 90, "file_size": 1_000,
                },
                {
                    "file_id": format!("fake-photo-{id}-large"),
                    "file_unique_id": format!("fake-photo-{id}-l"),
                    "width": 800, "height": 800, "file_size": 60_000,
                },
            ],
        });
        if let Some(caption) = caption {
            content["caption"] = json!(caption);
        }
        self.push_message("message", chat.borrow(), Some(from.borrow()), None, content)
    }

    /// Queues an `edited_message` update for an existing `message_id`;
    /// returns its update id.
    pub fn push_edited_text(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        message_id: i32,
        text: &str,
    ) -> i64 {
        let now = unix_now();
        self.push_message(
            "edited_message",
            chat.borrow(),
            Some(from.borrow()),
            Some(message_id),
            // The original message must predate its edit.
            json!({ "text": text, "date": now - 60, "edit_date": now }),
        )
    }

    /// Queues the service message Telegram sends in a group that was upgraded
    /// to supergroup `new_chat_id`; returns its update id. From then on,
    /// `sendMessage` to the old id fails with `migrate_to_chat_id`, and
    /// replies to `new_chat_id` come from a supergroup with the same title.
    pub fn push_migration(&self, old_chat: impl Borrow<ChatSpec>, new_chat_id: i64) -> i64 {
        let old_chat = old_chat.borrow();
        let title = match &old_chat.kind {
            ChatKind::Group { title } | ChatKind::Supergroup { title, .. } => title.clone(),
            ChatKind::Private { .. } => panic!("push_migration: private chats cannot migrate"),
        };
        {
            let mut state = self.shared.lock();
            state.migrated.insert(old_chat.id, new_chat_id);
            state.chats.insert(new_chat_id, ChatKind::Supergroup { title, is_forum: false });
        }
        let admin = UserSpec::new(MIGRATION_ADMIN_ID, "Group Admin");
        self.push_message(
            "message",
            old_chat,
            Some(&admin),
            None,
            json!({ "migrate_to_chat_id": new_chat_id }),
        )
    }

    /// Queues an arbitrary update, e.g. a malformed one; the fake sets its
    /// `update_id` (overwriting any present) and returns it.
    pub fn push_raw_update(&self, mut update: Value) -> i64 {
        let object = update.as_object_mut().expect("push_raw_update: an update must be a JSON object");
        let id = {
            let mut state = self.shared.lock();
            let id = state.take_update_id();
            object.insert("update_id".to_owned(), json!(id));
            state.updates.push_back(PendingUpdate::new(id, update.to_string()));
            id
        };
        self.shared.changed.notify_waiters();
        id
    }

    /// Queues an update given as JSON text and serves it verbatim, including
    /// text that is not valid JSON or that `serde_json::Value` cannot hold,
    /// such as a lone UTF-16 surrogate escape (`"\ud800"`). `text` is the
    /// update without its `update_id`: an object, after whose opening `{` the
    /// fake writes `"update_id":<id>,`. Returns the id.
    pub fn push_raw_update_text(&self, text: &str) -> i64 {
        let id = {
            let mut state = self.shared.lock();
            let id = state.take_update_id();
            state.updates.push_back(PendingUpdate::new(id, with_update_id(id, text)));
            id
        };
        self.shared.changed.notify_waiters();
        id
    }

    /// Queues `text` (as for [`FakeTelegram::push_raw_update_text`]) under an
    /// id that was used before. Telegram picks update ids afresh after a week
    /// without updates, so an id can come back with other content; the fake
    /// serves this update even though its id was confirmed earlier, and
    /// forgets it at the first offset above its id sent after serving it.
    pub fn reuse_update_id(&self, update_id: i64, text: &str) {
        {
            let mut state = self.shared.lock();
            let mut update = PendingUpdate::new(update_id, with_update_id(update_id, text));
            update.reused = true;
            state.updates.push_back(update);
        }
        self.shared.changed.notify_waiters();
    }

    fn push_message(
        &self,
        update_kind: &str,
        chat: &ChatSpec,
        from: Option<&UserSpec>,
        message_id: Option<i32>,
        content: Value,
    ) -> i64 {
        let id = {
            let mut state = self.shared.lock();
            // Replies into this chat must describe it the way updates did.
            state.chats.insert(chat.id, chat.kind.clone());
            let message_id = message_id.unwrap_or_else(|| state.take_message_id());
            let mut message = json!({
                "message_id": message_id,
                "date": unix_now(),
                "chat": chat.to_json(),
            });
            if let Some(from) = from {
                message["from"] = from.to_json();
            }
            merge_into(&mut message, content);

            let id = state.take_update_id();
            let update = json!({ "update_id": id, update_kind: message });
            state.updates.push_back(PendingUpdate::new(id, update.to_string()));
            id
        };
        self.shared.changed.notify_waiters();
        id
    }

    // -- outbound observations ----------------------------------------------

    /// Every `sendMessage` the fake accepted, in order.
    pub fn sent_messages(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// The accepted `sendMessage` that was given `message_id`, found without
    /// copying every other one (a benchmark looks up thousands in a row).
    pub fn sent_message(&self, message_id: i32) -> Option<SentMessage> {
        self.shared.lock().sent.iter().rev().find(|sent| sent.message_id == message_id).cloned()
    }

    /// Waits until at least `n` (≥ 1) messages have been accepted and returns the
    /// `n`th, without copying the others (a benchmark waits for thousands in a
    /// row). `None` if `within` elapses first.
    pub async fn wait_for_nth_sent(&self, n: usize, within: Duration) -> Option<SentMessage> {
        assert!(n >= 1, "messages are counted from 1");
        let deadline = Instant::now() + within;
        self.shared.wait_for(Some(deadline), |state| state.sent.get(n - 1).cloned()).await
    }

    /// Waits until at least `n` messages have been accepted and returns all of
    /// them. Panics with the fake's observations if `within` elapses first.
    pub async fn wait_for_sent(&self, n: usize, within: Duration) -> Vec<SentMessage> {
        let deadline = Instant::now() + within;
        let sent = self
            .shared
            .wait_for(Some(deadline), |state| (state.sent.len() >= n).then(|| state.sent.clone()))
            .await;
        match sent {
            Some(sent) => sent,
            None => panic!(
                "fake Telegram: timed out after {within:?} waiting for {n} sent message(s)\n{}",
                self.describe()
            ),
        }
    }

    /// Number of `getUpdates` requests received, including faulted ones.
    pub fn get_updates_calls(&self) -> usize {
        self.shared.lock().get_updates_calls
    }

    /// Waits until at least `n` `getUpdates` requests have arrived, e.g. to
    /// know the daemon is polling. Panics if `within` elapses first.
    pub async fn wait_for_get_updates_calls(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        let reached =
            self.shared.wait_for(Some(deadline), |state| (state.get_updates_calls >= n).then_some(())).await;
        if reached.is_none() {
            panic!(
                "fake Telegram: timed out after {within:?} waiting for {n} getUpdates call(s)\n{}",
                self.describe()
            );
        }
    }

    /// The highest `offset` any `getUpdates` call has sent: every update with
    /// a smaller id is confirmed. `None` until the first call with an offset.
    pub fn last_confirmed_offset(&self) -> Option<i64> {
        self.shared.lock().confirmed_offset
    }

    /// Updates pushed but not yet confirmed by an offset.
    pub fn pending_update_count(&self) -> usize {
        self.shared.lock().updates.len()
    }

    /// Waits until `update_id` is confirmed (some `getUpdates` sent an offset
    /// greater than it). Panics if `within` elapses first.
    pub async fn wait_until_confirmed(&self, update_id: i64, within: Duration) {
        let deadline = Instant::now() + within;
        let confirmed = self
            .shared
            .wait_for(Some(deadline), |state| {
                state.confirmed_offset.is_some_and(|offset| offset > update_id).then_some(())
            })
            .await;
        if confirmed.is_none() {
            panic!(
                "fake Telegram: timed out after {within:?} waiting for update {update_id} \
                 to be confirmed\n{}",
                self.describe()
            );
        }
    }

    /// Every request received with the right token, in arrival order, as
    /// (lowercased method name, parameters). Parameters come from the JSON
    /// body, form body or query string; form and query values are strings.
    pub fn requests_seen(&self) -> Vec<(String, Value)> {
        self.shared.lock().requests.clone()
    }

    /// The parameters of every request to `method` (case-insensitive).
    pub fn requests_for(&self, method: &str) -> Vec<Value> {
        let method = method.to_ascii_lowercase();
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|(seen, _)| *seen == method)
            .map(|(_, params)| params.clone())
            .collect()
    }

    /// Requests rejected for a wrong or missing token.
    pub fn unauthorized_requests(&self) -> usize {
        self.shared.lock().unauthorized_requests
    }

    // -- fault injection ----------------------------------------------------

    /// Makes the next not-yet-faulted `getUpdates` request fail with `fault`.
    pub fn fail_get_updates(&self, fault: Fault) {
        self.fail_method("getUpdates", fault);
    }

    /// Makes the next not-yet-faulted `sendMessage` request fail with `fault`.
    pub fn fail_send_message(&self, fault: Fault) {
        self.fail_method("sendMessage", fault);
    }

    /// Queues `fault` for `method` (case-insensitive). Each request of that
    /// method consumes one queued fault, first in first out.
    pub fn fail_method(&self, method: &str, fault: Fault) {
        // Fail here, in the test, rather than later inside a server task.
        if let Fault::Raw { status, .. } = &fault {
            assert!(StatusCode::from_u16(*status).is_ok(), "Fault::Raw: {status} is not an HTTP status");
        }
        self.shared.lock().faults.entry(method.to_ascii_lowercase()).or_default().push_back(fault);
    }

    /// Faults queued for `method` that no request has consumed yet.
    pub fn pending_fault_count(&self, method: &str) -> usize {
        self.shared.lock().faults.get(&method.to_ascii_lowercase()).map_or(0, VecDeque::len)
    }

    /// A summary of what the fake has seen, for panic messages.
    fn describe(&self) -> String {
        let state = self.shared.lock();
        let mut out = String::new();
        let _ = writeln!(out, "sent messages ({}):", state.sent.len());
        for sent in &state.sent {
            let _ = writeln!(
                out,
                "  #{} chat={} thread={:?} reply_to={:?} text={:?}",
                sent.message_id, sent.chat_id, sent.message_thread_id, sent.reply_to_message_id, sent.text
            );
        }
        let _ = writeln!(
            out,
            "getUpdates calls: {}, confirmed offset: {:?}, pending update ids: {:?}",
            state.get_updates_calls,
            state.confirmed_offset,
            state.updates.iter().map(|u| u.id).collect::<Vec<_>>()
        );
        let mut per_method: Vec<(&str, usize)> = Vec::new();
        for (method, _) in &state.requests {
            match per_method.iter_mut().find(|(seen, _)| *seen == method) {
                Some((_, count)) => *count += 1,
                None => per_method.push((method.as_str(), 1)),
            }
        }
        let _ = writeln!(
            out,
            "requests per method: {per_method:?}; unauthorized: {}",
            state.unauthorized_requests
        );
        let queued: Vec<_> = state.faults.iter().filter(|(_, faults)| !faults.is_empty()).collect();
        let _ = write!(out, "unconsumed faults: {queued:?}");
        out
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.shared.begin_shutdown();
        if let Some(server) = self.server.take() {
            // Stops accepting at once; already accepted connections are
            // closed by the graceful-shutdown signal sent above.
            server.abort();
        }
    }
}

// ---------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------

struct Shared {
    state: Mutex<State>,
    /// Notified (all waiters) after every change a waiter could care about:
    /// pushed updates, confirmations, sent messages, new polls, shutdown.
    changed: Notify,
}

struct PendingUpdate {
    id: i64,
    /// The update's JSON text, served verbatim.
    text: String,
    /// Pushed by [`FakeTelegram::reuse_update_id`]: served whatever was
    /// confirmed before, until confirmed after it was served.
    reused: bool,
    served: bool,
}

impl PendingUpdate {
    fn new(id: i64, text: String) -> Self {
        Self { id, text, reused: false, served: false }
    }

    /// Whether a `getUpdates` with this offset serves this update.
    fn is_served_from(&self, offset: i64) -> bool {
        self.id >= offset || (self.reused && !self.served)
    }
}

/// `text` (an update object without its id) with `"update_id":id` first.
fn with_update_id(id: i64, text: &str) -> String {
    let rest = text.trim_start().strip_prefix('{').expect("an update must be a JSON object");
    let separator = if rest.trim_start().starts_with('}') { "" } else { "," };
    format!("{{\"update_id\":{id}{separator}{rest}")
}

struct State {
    /// Unconfirmed updates, ascending by id (apart from reused ids).
    updates: VecDeque<PendingUpdate>,
    next_update_id: i64,
    next_message_id: i32,
    /// Makes every fake file id unique, as Telegram's are.
    next_file_seq: u64,
    confirmed_offset: Option<i64>,
    /// How replies describe each chat; learned from pushed updates.
    chats: HashMap<i64, ChatKind>,
    /// Old group id -> supergroup id.
    migrated: HashMap<i64, i64>,
    sent: Vec<SentMessage>,
    faults: HashMap<String, VecDeque<Fault>>,
    requests: Vec<(String, Value)>,
    unauthorized_requests: usize,
    get_updates_calls: usize,
    /// Bumped by every getUpdates; a waiting long poll that sees it change
    /// has been superseded and must answer 409 like Telegram does.
    poll_generation: u64,
    shut_down: bool,
}

impl State {
    fn new() -> Self {
        Self {
            updates: VecDeque::new(),
            next_update_id: FIRST_UPDATE_ID,
            next_message_id: FIRST_MESSAGE_ID,
            next_file_seq: 1,
            confirmed_offset: None,
            chats: HashMap::new(),
            migrated: HashMap::new(),
            sent: Vec::new(),
            faults: HashMap::new(),
            requests: Vec::new(),
            unauthorized_requests: 0,
            get_updates_calls: 0,
            poll_generation: 0,
            shut_down: false,
        }
    }

    fn take_update_id(&mut self) -> i64 {
        let id = self.next_update_id;
        self.next_update_id += 1;
        id
    }

    fn take_file_seq(&mut self) -> u64 {
        let seq = self.next_file_seq;
        self.next_file_seq += 1;
        seq
    }

    fn take_message_id(&mut self) -> i32 {
        let id = self.next_message_id;
        self.next_message_id += 1;
        id
    }

    /// Applies getUpdates' `offset` semantics: a positive offset confirms
    /// (forgets) every update below it; a negative one keeps only the last
    /// `-offset` updates.
    fn apply_offset(&mut self, offset: i64) {
        let watermark = if offset > 0 {
            offset
        } else if offset < 0 {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            let skip = self.updates.len().saturating_sub(keep);
            self.updates.get(skip).map_or(self.next_update_id, |update| update.id)
        } else {
            return;
        };
        self.updates.retain(|update| update.is_served_from(watermark));
        // Confirmation is permanent: a later, lower offset cannot resurrect
        // forgotten updates, so the watermark only moves up.
        self.confirmed_offset = Some(self.confirmed_offset.map_or(watermark, |c| c.max(watermark)));
    }

    fn chat_kind(&self, chat_id: i64) -> ChatKind {
        self.chats.get(&chat_id).cloned().unwrap_or_else(|| {
            if chat_id > 0 {
                ChatKind::Private { first_name: format!("User {chat_id}") }
            } else {
                ChatKind::Supergroup { title: format!("Chat {chat_id}"), is_forum: false }
            }
        })
    }
}

impl Shared {
    /// Tests run handlers on other threads and may panic while holding the
    /// lock; the state stays usable for the remaining assertions.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn begin_shutdown(&self) {
        self.lock().shut_down = true;
        self.changed.notify_waiters();
    }

    /// Re-evaluates `check` after every state change until it yields a value
    /// or `deadline` passes (`None`). The lock is never held across an await.
    async fn wait_for<T>(
        &self,
        deadline: Option<Instant>,
        mut check: impl FnMut(&State) -> Option<T>,
    ) -> Option<T> {
        loop {
            // Register interest before checking, so a change that lands
            // between the check and the await still wakes us.
            let notified = self.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();

            let ready = check(&self.lock());
            if ready.is_some() {
                return ready;
            }
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return None;
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Sleeps for `duration`, cut short by shutdown.
    async fn hang(&self, duration: Duration) {
        let deadline = Instant::now() + duration;
        self.wait_for(Some(deadline), |state| state.shut_down.then_some(())).await;
    }
}

// ---------------------------------------------------------------------------
// HTTP handling
// ---------------------------------------------------------------------------

/// Single entry point: the Bot API's URL scheme (`/bot<token>/<method>`, any
/// HTTP verb, case-insensitive method) is easier to parse by hand than to
/// express as axum routes, and this way every rejection is Telegram-shaped.
async fn handle_request(
    AxumState(shared): AxumState<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((token, method)) = split_path(uri.path()) else {
        return api_error(StatusCode::NOT_FOUND, "Not Found", None);
    };
    if token != TEST_TOKEN {
        shared.lock().unauthorized_requests += 1;
        return api_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
    }
    let method = method.to_ascii_lowercase();

    let params = match parse_params(&uri, &headers, &body) {
        Ok(params) => params,
        Err(description) => return api_error(StatusCode::BAD_REQUEST, &description, None),
    };

    let fault = {
        let mut state = shared.lock();
        state.requests.push((method.clone(), Value::Object(params.clone())));
        if method == "getupdates" {
            state.get_updates_calls += 1;
        }
        state.faults.get_mut(&method).and_then(VecDeque::pop_front)
    };
    shared.changed.notify_waiters();

    match fault {
        None => dispatch(&shared, &method, &params).await,
        Some(Fault::RecordThenHang(delay)) => {
            let response = dispatch(&shared, &method, &params).await;
            shared.hang(delay).await;
            response
        }
        Some(Fault::Pass) => dispatch(&shared, &method, &params).await,
        Some(Fault::RecordThenServerError) => {
            let _performed = dispatch(&shared, &method, &params).await;
            api_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error", None)
        }
        Some(fault) => {
            // A faulted getUpdates still reached Telegram, so it terminates
            // any long poll that is waiting, as a real one would.
            if method == "getupdates" {
                shared.lock().poll_generation += 1;
                shared.changed.notify_waiters();
            }
            fault_response(&shared, fault).await
        }
    }
}

async fn dispatch(shared: &Shared, method: &str, params: &Map<String, Value>) -> Response {
    match method {
        "getupdates" => get_updates(shared, params).await,
        "sendmessage" => send_message(shared, params),
        "getme" => ok(bot_me_json()),
        "getwebhookinfo" => {
            let pending = shared.lock().updates.len();
            ok(json!({
                "url": "",
                "has_custom_certificate": false,
                "pending_update_count": pending,
            }))
        }
        "getmycommands" => ok(json!([])),
        "deletewebhook" | "close" | "logout" | "sendchataction" | "setmycommands" | "deletemycommands" => {
            ok(json!(true))
        }
        _ => api_error(
            StatusCode::NOT_FOUND,
            &format!("Not Found: method {method:?} is not implemented by the fake Telegram server"),
            None,
        ),
    }
}

async fn fault_response(shared: &Shared, fault: Fault) -> Response {
    match fault {
        Fault::TooManyRequests { retry_after } => api_error(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("Too Many Requests: retry after {retry_after}"),
            Some(json!({ "retry_after": retry_after })),
        ),
        Fault::ServerError => api_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error", None),
        Fault::BadRequest(description) => api_error(StatusCode::BAD_REQUEST, &description, None),
        Fault::Forbidden(description) => api_error(StatusCode::FORBIDDEN, &description, None),
        Fault::Conflict => api_error(StatusCode::CONFLICT, CONFLICT_DESCRIPTION, None),
        Fault::MigrateTo(chat_id) => migrate_error(chat_id),
        Fault::HangWithoutRecording(delay) => {
            shared.hang(delay).await;
            api_error(StatusCode::GATEWAY_TIMEOUT, "Gateway Timeout", None)
        }
        Fault::MalformedBody => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body>this is not the Bot API</body></html>",
        )
            .into_response(),
        Fault::Raw { status, body } => {
            let status = StatusCode::from_u16(status).expect("validated by fail_method");
            let content_type =
                if serde_json::from_str::<Value>(&body).is_ok() { "application/json" } else { "text/plain" };
            (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        // Handled by the caller, which has to perform the request first.
        Fault::RecordThenHang(_) | Fault::Pass | Fault::RecordThenServerError => {
            unreachable!("faults that perform the request are handled by handle_request")
        }
    }
}

struct GetUpdatesParams {
    offset: i64,
    limit: usize,
    timeout: Duration,
}

impl GetUpdatesParams {
    fn parse(params: &Map<String, Value>) -> Result<Self, String> {
        Ok(Self {
            offset: int_param(params, "offset")?.unwrap_or(0),
            // Telegram clamps rather than rejects out-of-range limits.
            limit: int_param(params, "limit")?.unwrap_or(100).clamp(1, 100) as usize,
            timeout: Duration::from_secs(int_param(params, "timeout")?.unwrap_or(0).max(0).unsigned_abs()),
        })
    }
}

async fn get_updates(shared: &Shared, params: &Map<String, Value>) -> Response {
    let GetUpdatesParams { offset, limit, timeout } = match GetUpdatesParams::parse(params) {
        Ok(parsed) => parsed,
        Err(description) => return bad_request(&description),
    };

    let generation = {
        let mut state = shared.lock();
        state.apply_offset(offset);
        state.poll_generation += 1;
        state.poll_generation
    };
    // Wakes confirmation waiters and any long poll this one supersedes.
    shared.changed.notify_waiters();

    enum Outcome {
        Updates(Vec<(i64, String)>),
        Superseded,
        Empty,
    }
    let deadline = Instant::now() + timeout;
    let outcome = shared
        .wait_for(Some(deadline), |state| {
            if state.shut_down {
                return Some(Outcome::Empty);
            }
            if state.poll_generation != generation {
                return Some(Outcome::Superseded);
            }
            let batch: Vec<(i64, String)> = state
                .updates
                .iter()
                // Only matters if the client jumped ahead of existing ids.
                .filter(|update| update.is_served_from(offset))
                .take(limit)
                .map(|update| (update.id, update.text.clone()))
                .collect();
            (!batch.is_empty()).then_some(Outcome::Updates(batch))
        })
        .await
        .unwrap_or(Outcome::Empty);

    match outcome {
        Outcome::Updates(batch) => {
            let mut state = shared.lock();
            // A set: a benchmark keeps tens of thousands of updates pending.
            let served: HashSet<i64> = batch.iter().map(|(id, _)| *id).collect();
            for update in state.updates.iter_mut().filter(|update| served.contains(&update.id)) {
                update.served = true;
            }
            let texts: Vec<String> = batch.into_iter().map(|(_, text)| text).collect();
            ok_raw(&texts.join(","))
        }
        Outcome::Empty => ok(json!([])),
        Outcome::Superseded => api_error(StatusCode::CONFLICT, CONFLICT_DESCRIPTION, None),
    }
}

struct SendMessageParams {
    chat_id: i64,
    text: String,
    message_thread_id: Option<i32>,
    reply_to_message_id: Option<i32>,
    parse_mode: Option<String>,
}

impl SendMessageParams {
    fn parse(params: &Map<String, Value>) -> Result<Self, String> {
        let chat_id = match int_param(params, "chat_id") {
            Ok(Some(chat_id)) => chat_id,
            Ok(None) => return Err("Bad Request: chat_id is empty".to_owned()),
            // "@channelusername" recipients: the fake knows no usernames.
            Err(_) => return Err("Bad Request: chat not found".to_owned()),
        };
        let text = str_param(params, "text").unwrap_or_default();
        if text.is_empty() {
            return Err("Bad Request: message text is empty".to_owned());
        }
        if text.encode_utf16().count() > MAX_MESSAGE_UTF16_LEN {
            return Err("Bad Request: message is too long".to_owned());
        }
        Ok(Self {
            chat_id,
            text,
            message_thread_id: int_param(params, "message_thread_id")?.map(|id| id as i32),
            reply_to_message_id: reply_target(params)?,
            parse_mode: str_param(params, "parse_mode"),
        })
    }
}

fn send_message(shared: &Shared, params: &Map<String, Value>) -> Response {
    let SendMessageParams { chat_id, text, message_thread_id, reply_to_message_id, parse_mode } =
        match SendMessageParams::parse(params) {
            Ok(parsed) => parsed,
            Err(description) => return bad_request(&description),
        };

    let message = {
        let mut state = shared.lock();
        if let Some(&new_chat_id) = state.migrated.get(&chat_id) {
            return migrate_error(new_chat_id);
        }
        let message_id = state.take_message_id();
        let kind = state.chat_kind(chat_id);
        let mut message = json!({
            "message_id": message_id,
            "date": unix_now(),
            "chat": chat_json(chat_id, &kind),
            "from": bot_user_json(),
            "text": text,
        });
        if let Some(thread_id) = message_thread_id {
            message["message_thread_id"] = json!(thread_id);
            if matches!(kind, ChatKind::Supergroup { is_forum: true, .. }) {
                message["is_topic_message"] = json!(true);
            }
        }
        state.sent.push(SentMessage {
            message_id,
            chat_id,
            text,
            message_thread_id,
            reply_to_message_id,
            parse_mode,
            raw: Value::Object(params.clone()),
            received_at: std::time::Instant::now(),
        });
        message
    };
    shared.changed.notify_waiters();
    ok(message)
}

/// The replied-to message id, from `reply_parameters` (current API, what
/// teloxide 0.17 sends) or `reply_to_message_id` (deprecated but accepted).
fn reply_target(params: &Map<String, Value>) -> Result<Option<i32>, String> {
    if let Some(reply) = obj_param(params, "reply_parameters")? {
        return match int_param(&reply, "message_id")? {
            Some(id) => Ok(Some(id as i32)),
            None => Err("Bad Request: can't parse reply parameters JSON object".to_owned()),
        };
    }
    Ok(int_param(params, "reply_to_message_id")?.map(|id| id as i32))
}

// ---------------------------------------------------------------------------
// Request parsing
// ---------------------------------------------------------------------------

/// Splits `/bot<token>/<method>` into its parts, percent-decoding the token
/// (clients may escape the `:` in it).
fn split_path(path: &str) -> Option<(String, &str)> {
    let mut segments = path.strip_prefix('/')?.split('/');
    let token = segments.next()?.strip_prefix("bot")?;
    let method = segments.next()?;
    if method.is_empty() || segments.next().is_some() {
        return None;
    }
    Some((percent_decode(token)?, method))
}

fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = input.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Merges query-string and body parameters, as Telegram does. Form and query
/// values stay strings; the typed accessors below coerce them.
fn parse_params(uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Result<Map<String, Value>, String> {
    let mut params = Map::new();
    if let Some(query) = uri.query() {
        params.extend(parse_urlencoded(query));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(params);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value: &HeaderValue| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|value| value.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match content_type.as_str() {
        "application/x-www-form-urlencoded" => {
            let body =
                std::str::from_utf8(body).map_err(|_| "Bad Request: form body is not UTF-8".to_owned())?;
            params.extend(parse_urlencoded(body));
        }
        "multipart/form-data" => {
            return Err("Bad Request: multipart/form-data (file uploads) is not supported \
                        by the fake Telegram server"
                .to_owned());
        }
        // JSON, or a client that did not say: try JSON.
        _ => match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(object)) => params.extend(object),
            _ => return Err("Bad Request: request body is not a JSON object".to_owned()),
        },
    }
    Ok(params)
}

fn parse_urlencoded(input: &str) -> Vec<(String, Value)> {
    // reqwest re-exports `url`, whose query parser implements
    // application/x-www-form-urlencoded decoding ('+', percent escapes).
    let mut url = reqwest::Url::parse("http://fake.invalid/").expect("static URL");
    url.set_query(Some(input));
    url.query_pairs().map(|(key, value)| (key.into_owned(), Value::String(value.into_owned()))).collect()
}

// Parameter accessors fail with the description of the 400 to answer.

/// An integer parameter given as a JSON number or a numeric string.
fn int_param(params: &Map<String, Value>, name: &str) -> Result<Option<i64>, String> {
    let invalid = || format!("Bad Request: invalid {name} specified");
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => number.as_i64().map(Some).ok_or_else(invalid),
        Some(Value::String(text)) => text.trim().parse().map(Some).map_err(|_| invalid()),
        Some(_) => Err(invalid()),
    }
}

/// A string parameter; scalars are stringified as Telegram would.
fn str_param(params: &Map<String, Value>, name: &str) -> Option<String> {
    match params.get(name)? {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// An object parameter, given inline (JSON body) or JSON-encoded in a string
/// (form or query).
fn obj_param(params: &Map<String, Value>, name: &str) -> Result<Option<Map<String, Value>>, String> {
    let invalid = || format!("Bad Request: can't parse {name} JSON object");
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object.clone())),
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(Value::Object(object)) => Ok(Some(object)),
            _ => Err(invalid()),
        },
        Some(_) => Err(invalid()),
    }
}

// ---------------------------------------------------------------------------
// Responses and JSON shapes
// ---------------------------------------------------------------------------

fn ok(result: Value) -> Response {
    Json(json!({ "ok": true, "result": result })).into_response()
}

/// A successful response whose `result` is the JSON text `result`, verbatim.
fn ok_raw(result: &str) -> Response {
    let body = format!("{{\"ok\":true,\"result\":[{result}]}}");
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A Telegram-shaped error. teloxide ignores the status and `error_code` and
/// decides by `parameters` first, then by matching `description` text.
fn api_error(status: StatusCode, description: &str, parameters: Option<Value>) -> Response {
    let mut body = json!({
        "ok": false,
        "error_code": status.as_u16(),
        "description": description,
    });
    if let Some(parameters) = parameters {
        body["parameters"] = parameters;
    }
    (status, Json(body)).into_response()
}

fn bad_request(description: &str) -> Response {
    api_error(StatusCode::BAD_REQUEST, description, None)
}

fn migrate_error(new_chat_id: i64) -> Response {
    api_error(
        StatusCode::BAD_REQUEST,
        "Bad Request: group chat was upgraded to a supergroup chat",
        Some(json!({ "migrate_to_chat_id": new_chat_id })),
    )
}

fn chat_json(id: i64, kind: &ChatKind) -> Value {
    match kind {
        ChatKind::Private { first_name } => {
            json!({ "id": id, "type": "private", "first_name": first_name })
        }
        ChatKind::Group { title } => json!({ "id": id, "type": "group", "title": title }),
        ChatKind::Supergroup { title, is_forum } => {
            let mut chat = json!({ "id": id, "type": "supergroup", "title": title });
            if *is_forum {
                chat["is_forum"] = json!(true);
            }
            chat
        }
    }
}

fn bot_user_json() -> Value {
    json!({
        "id": BOT_USER_ID,
        "is_bot": true,
        "first_name": BOT_FIRST_NAME,
        "username": BOT_USERNAME,
    })
}

fn bot_me_json() -> Value {
    let mut me = bot_user_json();
    merge_into(
        &mut me,
        json!({
            "can_join_groups": true,
            "can_read_all_group_messages": false,
            "supports_inline_queries": false,
            "can_connect_to_business": false,
            // Not optional for teloxide's `Me`: without it getMe fails to parse.
            "has_main_web_app": false,
        }),
    );
    me
}

/// Copies `extra`'s fields into `target`, overwriting; both must be objects.
fn merge_into(target: &mut Value, extra: Value) {
    if let (Value::Object(target), Value::Object(extra)) = (target, extra) {
        target.extend(extra);
    }
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs() as i64)
}
