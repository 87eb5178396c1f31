//! A fake Telegram Bot API server: a test double that never talks to Telegram. It
//! listens on loopback and answers the daemon exactly as `api.telegram.org` would (point
//! teloxide, or `telegram.api_url`, at [`FakeTelegram::api_url`] with [`TEST_TOKEN`]), while
//! its owner pushes inbound updates, observes outbound `sendMessage` calls and injects
//! faults. The integration tests, the benchmarks and `switchboard demo` all use this one,
//! so the offset and long-poll rules they rely on are written once. It lives in the crate
//! (not under `tests/`) because the demo, which ships in the binary, needs it too.
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
//! * with a webhook set (`setWebhook`), the same pending updates are POSTed to it
//!   instead, one at a time, with the secret header, until answered 2xx, and
//!   `getUpdates` answers 409 (see `webhook`);
//! * once a group has migrated ([`FakeTelegram::push_migration`]) `sendMessage`
//!   to the old id fails with `migrate_to_chat_id`;
//! * errors carry the HTTP status, `error_code`, `description` and
//!   `parameters` that teloxide uses to pick its `RequestError` variant.
//!
//! Deliberate differences: unknown methods answer 404 with a description that
//! names the method (real Telegram says just "Not Found", which teloxide
//! misreports as an invalid token); update ids and message ids come from two
//! counters (update ids start at [`FIRST_UPDATE_ID`] so they are never
//! confused with message ids in assertions); multipart bodies are taken only by the
//! upload methods (`sendPhoto`, `sendDocument`, …), which record the file's length and
//! SHA-256 ([`FakeTelegram::uploads`]).
//!
//! **Waiting without a clock.** Everything the fake observes can be waited for:
//! a sent message ([`FakeTelegram::wait_for_sent`]), a confirmation
//! ([`FakeTelegram::wait_until_confirmed`]), a poll
//! ([`FakeTelegram::wait_for_get_updates_calls`]) and, for checks that nothing
//! (else) happened, the poller coming back for more after an update
//! ([`FakeTelegram::wait_for_poll_after`]): the daemon only asks again once it
//! has recorded the batch, so whatever intake does with that update is done.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use serde_json::{Value, json};
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

mod actions;
mod buttons;
mod files;
mod limits;
mod media;
mod server;
mod state;
mod webhook;

pub use buttons::{CallbackAnswer, EditedMessage, callback_data_of};
pub use files::Upload;
pub use limits::TelegramLimits;
pub use webhook::{Delivery, WebhookInfo};

use server::{chat_json, merge_into, route_request, unix_now};
use state::{PendingUpdate, Shared, State, with_update_id};

// ---------------------------------------------------------------------------
// What the fake's owner pushes and observes
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

/// A pushed message: the update that carries it and the message's own id, which
/// replies to it name (`reply_to_message_id`) and an edit of it repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushedMessage {
    pub update_id: i64,
    pub message_id: i32,
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
    /// know that Telegram acted on its request; with `Duration::MAX` the answer
    /// never comes (until the fake stops). A send held this way is reported by
    /// [`FakeTelegram::wait_for_held_send`].
    RecordThenHang(Duration),
    /// Wait this long without performing the request, then answer 504. Models
    /// a request lost on the way: the client should time out first.
    HangWithoutRecording(Duration),
    /// Wait this long, then perform the request and answer it normally: Telegram slow to
    /// take it, so that a request made meanwhile overtakes it.
    WaitThenPerform(Duration),
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

/// How many of the latest webhook deliveries a description shows.
const DESCRIBED_DELIVERIES: usize = 40;

impl FakeTelegram {
    /// Binds 127.0.0.1 on a free port and serves until dropped. Panics if it cannot
    /// bind, which only a test can afford.
    pub async fn start() -> Self {
        Self::try_start().await.expect("fake Telegram: bind 127.0.0.1:0")
    }

    /// Like [`FakeTelegram::start`], with the error when loopback cannot be bound.
    pub async fn try_start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;

        let shared = Arc::new(Shared { state: Mutex::new(State::new()), changed: Notify::new() });
        // Uploads are as large as Telegram takes (50 MB); every other body keeps its own
        // limit (`route_request`).
        let app = Router::new()
            .fallback(route_request)
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(Arc::clone(&shared));

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
        // Idle until a webhook is set and a test says where its requests go.
        tokio::spawn(webhook::deliver(Arc::clone(&shared)));

        Ok(Self { shared, addr, server: Some(server) })
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
        self.push_text_message(chat, from, text).update_id
    }

    /// Queues a text message; returns its update id and its message id.
    pub fn push_text_message(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        text: &str,
    ) -> PushedMessage {
        self.push_message_with_id(
            "message",
            chat.borrow(),
            Some(from.borrow()),
            None,
            json!({ "text": text }),
        )
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
            state.push_update(PendingUpdate::new(id, update.to_string()));
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
            state.push_update(PendingUpdate::new(id, with_update_id(id, text)));
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
            state.push_update(update);
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
        self.push_message_with_id(update_kind, chat, from, message_id, content).update_id
    }

    fn push_message_with_id(
        &self,
        update_kind: &str,
        chat: &ChatSpec,
        from: Option<&UserSpec>,
        message_id: Option<i32>,
        content: Value,
    ) -> PushedMessage {
        let pushed = {
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

            let update_id = state.take_update_id();
            let update = json!({ "update_id": update_id, update_kind: message });
            state.push_update(PendingUpdate::new(update_id, update.to_string()));
            PushedMessage { update_id, message_id }
        };
        self.shared.changed.notify_waiters();
        pushed
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

    /// Waits until the bot has sent a message `wanted` picks, and returns the first
    /// such message. `None` if `within` elapses first.
    pub async fn wait_for_sent_matching(
        &self,
        within: Duration,
        wanted: impl Fn(&SentMessage) -> bool,
    ) -> Option<SentMessage> {
        let deadline = Instant::now() + within;
        self.shared
            .wait_for(Some(deadline), |state| state.sent.iter().find(|sent| wanted(sent)).cloned())
            .await
    }

    /// Waits until a `sendMessage` under [`Fault::RecordThenHang`] is being held: the
    /// message is recorded as sent (it is in the chat) and its answer not given yet.
    /// Returns the first such message; `None` if `within` elapses first.
    pub async fn wait_for_held_send(&self, within: Duration) -> Option<SentMessage> {
        let deadline = Instant::now() + within;
        self.shared
            .wait_for(Some(deadline), |state| {
                let held = *state.held_sends.first()?;
                state.sent.iter().find(|sent| sent.message_id == held).cloned()
            })
            .await
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

    /// Waits until the poller has come back for more after it was served `update_id`:
    /// a `getUpdates` arrived after the one whose answer carried the update (as last
    /// pushed: a reused id counts from its reuse). The daemon records a batch, and its
    /// offset, before it asks again, so from then on whatever intake does with that
    /// update is in the ledger: the settle point for checks that intake did nothing
    /// (more) with it. Panics if `within` elapses first.
    pub async fn wait_for_poll_after(&self, update_id: i64, within: Duration) {
        let deadline = Instant::now() + within;
        let came_back = self
            .shared
            .wait_for(Some(deadline), |state| {
                let served_by = *state.served_by_call.get(&update_id)?;
                (state.get_updates_calls > served_by).then_some(())
            })
            .await;
        if came_back.is_none() {
            panic!(
                "fake Telegram: timed out after {within:?} waiting for a getUpdates after the one \
                 that served update {update_id}\n{}",
                self.describe()
            );
        }
    }

    /// Waits until a `getUpdates` answer has carried `update_id` (as last pushed): the
    /// daemon holds it from then on, and is recording it or waiting to. Panics if
    /// `within` elapses first.
    pub async fn wait_until_served(&self, update_id: i64, within: Duration) {
        let deadline = Instant::now() + within;
        let served = self
            .shared
            .wait_for(Some(deadline), |state| state.served_by_call.contains_key(&update_id).then_some(()))
            .await;
        if served.is_none() {
            panic!(
                "fake Telegram: timed out after {within:?} waiting for a getUpdates to serve update {update_id}\n{}",
                self.describe()
            );
        }
    }

    /// Waits until a `getUpdates` is holding its long poll open, waiting for an update
    /// (so one pushed now wakes it rather than being there when it looks). Panics if
    /// `within` elapses first.
    pub async fn wait_for_waiting_long_poll(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let waiting =
            self.shared.wait_for(Some(deadline), |state| (state.long_polls_waiting > 0).then_some(())).await;
        if waiting.is_none() {
            panic!("fake Telegram: no long poll waited within {within:?}\n{}", self.describe());
        }
    }

    /// Waits until `n` requests to `method` (case-insensitive) have arrived, answered or
    /// not: a request held by a fault has arrived. Panics if `within` elapses first.
    pub async fn wait_for_requests(&self, method: &str, n: usize, within: Duration) {
        let method = method.to_ascii_lowercase();
        let deadline = Instant::now() + within;
        let arrived = self
            .shared
            .wait_for(Some(deadline), |state| {
                (state.requests.iter().filter(|(seen, _)| *seen == method).count() >= n).then_some(())
            })
            .await;
        if arrived.is_none() {
            panic!(
                "fake Telegram: timed out after {within:?} waiting for {n} {method} request(s)\n{}",
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

    /// Waits until `update_id` is confirmed: some `getUpdates` sent an offset greater than
    /// it, or a delivery of it to the webhook was answered 2xx. Panics if `within` elapses
    /// first.
    pub async fn wait_until_confirmed(&self, update_id: i64, within: Duration) {
        let deadline = Instant::now() + within;
        let confirmed = self
            .shared
            .wait_for(Some(deadline), |state| {
                // Polled and confirmed by a later offset, or delivered to the webhook (in
                // order, so everything before it was too).
                let polled = state.confirmed_offset.is_some_and(|offset| offset > update_id);
                (polled || state.webhook.delivered.contains_key(&update_id)).then_some(())
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

    /// Sets what `getMe` says of the bot's privacy mode. It is on by default, as for a
    /// new bot; a bot whose group rooms see every message has it off.
    pub fn set_privacy_mode(&self, on: bool) {
        self.shared.lock().privacy_mode = on;
    }

    /// From now on, answers a `sendMessage` past Telegram's sending limits with `429` and
    /// the `retry_after` that would let it through, and posts nothing ([`TelegramLimits`]).
    pub fn enforce_limits(&self, limits: TelegramLimits) {
        self.shared.lock().limits = Some(limits::LimitsState::new(limits));
    }

    /// Sends answered `429` for going past the limits [`FakeTelegram::enforce_limits`] set.
    pub fn too_many_requests(&self) -> usize {
        self.shared.lock().too_many_requests
    }

    /// Requests rejected for a wrong or missing token.
    pub fn unauthorized_requests(&self) -> usize {
        self.shared.lock().unauthorized_requests
    }

    // -- the webhook ----------------------------------------------------------

    /// Where requests to the webhook's URL go, as a load balancer in front of the daemon
    /// would forward them: `addr`'s plain HTTP, with the URL's path. Until this is called
    /// (and a webhook is set) nothing is delivered; after a restart on another port, call
    /// it again.
    pub fn route_webhook_to(&self, addr: SocketAddr) {
        self.route_webhook_to_each(&[addr]);
    }

    /// Like [`FakeTelegram::route_webhook_to`], to several backends in turn, as a load
    /// balancer in front of replicas does: each delivery goes to the next, and a delivery
    /// that failed is retried at the next.
    pub fn route_webhook_to_each(&self, addrs: &[SocketAddr]) {
        self.shared.lock().webhook.targets = addrs.iter().map(|addr| format!("http://{addr}")).collect();
        self.shared.changed.notify_waiters();
    }

    /// The webhook `setWebhook` set, if one is.
    pub fn webhook(&self) -> Option<WebhookInfo> {
        self.shared.lock().webhook.set.clone()
    }

    /// Waits until a webhook is set; returns it. Panics if `within` elapses first.
    pub async fn wait_for_webhook(&self, within: Duration) -> WebhookInfo {
        let deadline = Instant::now() + within;
        let set = self.shared.wait_for(Some(deadline), |state| state.webhook.set.clone()).await;
        set.unwrap_or_else(|| panic!("fake Telegram: no webhook set within {within:?}\n{}", self.describe()))
    }

    /// Every delivery of `update_id` to the webhook so far, in order.
    pub fn deliveries_of(&self, update_id: i64) -> Vec<Delivery> {
        let state = self.shared.lock();
        state.webhook.deliveries.iter().filter(|(id, _)| *id == update_id).map(|(_, d)| *d).collect()
    }

    /// Waits until the webhook has answered a delivery of `update_id` with a 2xx (the
    /// `n`th such answer, for an update delivered again): Telegram forgets it then. Panics
    /// if `within` elapses first.
    pub async fn wait_until_delivered(&self, update_id: i64, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        let delivered = self
            .shared
            .wait_for(Some(deadline), |state| {
                let count = state
                    .webhook
                    .deliveries
                    .iter()
                    .filter(|(id, d)| *id == update_id && d.succeeded())
                    .count();
                (count >= n).then_some(())
            })
            .await;
        if delivered.is_none() {
            panic!(
                "fake Telegram: update {update_id} was not delivered to the webhook {n} time(s) within {within:?}: {:?}\n{}",
                self.deliveries_of(update_id),
                self.describe()
            );
        }
    }

    /// Waits until `update_id` has been delivered at least `n` times, whatever the
    /// answers; returns what became of each. Panics if `within` elapses first.
    pub async fn wait_for_deliveries(&self, update_id: i64, n: usize, within: Duration) -> Vec<Delivery> {
        let deadline = Instant::now() + within;
        let deliveries = self
            .shared
            .wait_for(Some(deadline), |state| {
                let of: Vec<Delivery> = state
                    .webhook
                    .deliveries
                    .iter()
                    .filter(|(id, _)| *id == update_id)
                    .map(|(_, d)| *d)
                    .collect();
                (of.len() >= n).then_some(of)
            })
            .await;
        deliveries.unwrap_or_else(|| {
            panic!(
                "fake Telegram: update {update_id} was not delivered {n} time(s) within {within:?}\n{}",
                self.describe()
            )
        })
    }

    /// Throws away the answer to the next delivery, as when the connection breaks after
    /// the webhook took the update: Telegram does not know it arrived, and delivers it
    /// again. The load balancer takes its backend out with that connection: nothing more
    /// is delivered until [`FakeTelegram::route_webhook_to`] routes the webhook again (to
    /// the daemon restarted, say).
    pub fn lose_next_webhook_answer(&self) {
        self.shared.lock().webhook.answers_to_lose += 1;
    }

    /// Delivers `update_id` once more after its delivery, with the same content, as
    /// Telegram does when it did not see an answer. Panics if the fake never had it.
    pub fn deliver_again(&self, update_id: i64) {
        {
            let mut state = self.shared.lock();
            let text = state
                .webhook
                .delivered
                .get(&update_id)
                .cloned()
                .or_else(|| state.updates.iter().find(|u| u.id == update_id).map(|u| u.text.clone()))
                .unwrap_or_else(|| panic!("deliver_again: no update {update_id} was pushed"));
            state.push_update(PendingUpdate::new(update_id, text));
        }
        self.shared.changed.notify_waiters();
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
        // The latest deliveries only: a chaos test makes thousands.
        let deliveries = &state.webhook.deliveries;
        let in_flight =
            state.webhook.in_flight.as_ref().map(|(update_id, url, since)| {
                format!("update {update_id} to {url} for {:?}", since.elapsed())
            });
        let _ = writeln!(
            out,
            "webhook: {:?} routed to {:?}; {} deliveries, the last: {:?}; in flight: {}",
            state.webhook.set,
            state.webhook.targets,
            deliveries.len(),
            &deliveries[deliveries.len().saturating_sub(DESCRIBED_DELIVERIES)..],
            in_flight.as_deref().unwrap_or("none"),
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
