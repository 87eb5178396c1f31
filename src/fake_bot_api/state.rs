//! What the fake knows, behind one lock, and waiting for it to change.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::limits::LimitsState;
use super::{ChatKind, FIRST_MESSAGE_ID, FIRST_UPDATE_ID, Fault, SentMessage};

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Notified (all waiters) after every change a waiter could care about:
    /// pushed updates, confirmations, sent messages, new polls, shutdown.
    pub(super) changed: Notify,
}

pub(super) struct PendingUpdate {
    pub(super) id: i64,
    /// The update's JSON text, served verbatim.
    pub(super) text: String,
    /// Pushed by [`super::FakeTelegram::reuse_update_id`]: served whatever was
    /// confirmed before, until confirmed after it was served.
    pub(super) reused: bool,
    pub(super) served: bool,
    /// The kind of an update Telegram sends only to a bot that lists it in
    /// `allowed_updates` (`message_reaction`); `None` for the kinds it sends by default.
    pub(super) opt_in_kind: Option<&'static str>,
}

impl PendingUpdate {
    pub(super) fn new(id: i64, text: String) -> Self {
        Self { id, text, reused: false, served: false, opt_in_kind: None }
    }

    /// Whether a bot whose last `allowed_updates` was `allowed` is sent this update. Only
    /// the opt-in kinds are held back: the fake serves every other kind whatever the list
    /// says (a client that leaves one out is not told of it, which no test needs).
    pub(super) fn is_allowed(&self, allowed: Option<&[String]>) -> bool {
        match self.opt_in_kind {
            None => true,
            Some(kind) => allowed.is_some_and(|allowed| allowed.iter().any(|asked| asked == kind)),
        }
    }

    /// Whether a `getUpdates` with this offset serves this update.
    pub(super) fn is_served_from(&self, offset: i64) -> bool {
        self.id >= offset || (self.reused && !self.served)
    }
}

/// `text` (an update object without its id) with `"update_id":id` first.
pub(super) fn with_update_id(id: i64, text: &str) -> String {
    let rest = text.trim_start().strip_prefix('{').expect("an update must be a JSON object");
    let separator = if rest.trim_start().starts_with('}') { "" } else { "," };
    format!("{{\"update_id\":{id}{separator}{rest}")
}

pub(super) struct State {
    /// The `allowed_updates` of the last `getUpdates` that gave one: Telegram keeps it
    /// until a call gives another.
    pub(super) allowed_updates: Option<Vec<String>>,
    /// Unconfirmed updates, ascending by id (apart from reused ids).
    pub(super) updates: VecDeque<PendingUpdate>,
    pub(super) next_update_id: i64,
    pub(super) next_message_id: i32,
    /// Makes every fake file id unique, as Telegram's are.
    pub(super) next_file_seq: u64,
    pub(super) confirmed_offset: Option<i64>,
    /// How replies describe each chat; learned from pushed updates.
    pub(super) chats: HashMap<i64, ChatKind>,
    /// Old group id -> supergroup id.
    pub(super) migrated: HashMap<i64, i64>,
    pub(super) sent: Vec<SentMessage>,
    pub(super) faults: HashMap<String, VecDeque<Fault>>,
    pub(super) requests: Vec<(String, Value)>,
    pub(super) unauthorized_requests: usize,
    pub(super) get_updates_calls: usize,
    /// Bumped by every getUpdates; a waiting long poll that sees it change
    /// has been superseded and must answer 409 like Telegram does.
    pub(super) poll_generation: u64,
    pub(super) shut_down: bool,
    /// Update id -> the number (counted by `get_updates_calls`) of the `getUpdates`
    /// that last served it, since it was last pushed.
    pub(super) served_by_call: HashMap<i64, usize>,
    /// Message ids of sends whose answer is held back ([`Fault::RecordThenHang`]).
    pub(super) held_sends: Vec<i32>,
    /// What `getMe` says: on, the bot sees only commands and replies in groups.
    pub(super) privacy_mode: bool,
    /// `getUpdates` calls holding their long poll open right now.
    pub(super) long_polls_waiting: usize,
    /// Telegram's sending limits, when a test has the fake enforce them.
    pub(super) limits: Option<LimitsState>,
    /// Sends answered `429` for going past them.
    pub(super) too_many_requests: usize,
    /// `answerCallbackQuery` calls, in order.
    pub(super) callback_answers: Vec<super::CallbackAnswer>,
    /// Accepted edits of sent messages, in order.
    pub(super) edits: Vec<super::EditedMessage>,
    /// Files to serve, downloads and uploads (`files`).
    pub(super) files: super::files::FilesState,
    /// The webhook, where its deliveries go, and what became of them (`webhook`).
    pub(super) webhook: super::webhook::WebhookState,
}

impl State {
    pub(super) fn new() -> Self {
        Self {
            allowed_updates: None,
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
            served_by_call: HashMap::new(),
            held_sends: Vec::new(),
            privacy_mode: true,
            long_polls_waiting: 0,
            limits: None,
            too_many_requests: 0,
            callback_answers: Vec::new(),
            edits: Vec::new(),
            files: Default::default(),
            webhook: Default::default(),
        }
    }

    /// Queues `update`; it has not been served since this push.
    pub(super) fn push_update(&mut self, update: PendingUpdate) {
        self.served_by_call.remove(&update.id);
        self.updates.push_back(update);
    }

    pub(super) fn take_update_id(&mut self) -> i64 {
        let id = self.next_update_id;
        self.next_update_id += 1;
        id
    }

    pub(super) fn take_file_seq(&mut self) -> u64 {
        let seq = self.next_file_seq;
        self.next_file_seq += 1;
        seq
    }

    pub(super) fn take_message_id(&mut self) -> i32 {
        let id = self.next_message_id;
        self.next_message_id += 1;
        id
    }

    /// Applies getUpdates' `offset` semantics: a positive offset confirms
    /// (forgets) every update below it; a negative one keeps only the last
    /// `-offset` updates.
    pub(super) fn apply_offset(&mut self, offset: i64) {
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

    pub(super) fn chat_kind(&self, chat_id: i64) -> ChatKind {
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
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn begin_shutdown(&self) {
        self.lock().shut_down = true;
        self.changed.notify_waiters();
    }

    /// Re-evaluates `check` after every state change until it yields a value
    /// or `deadline` passes (`None`). The lock is never held across an await.
    pub(super) async fn wait_for<T>(
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

    /// Sleeps for `duration` (for ever if it reaches past any representable instant),
    /// cut short by shutdown.
    pub(super) async fn hang(&self, duration: Duration) {
        let deadline = Instant::now().checked_add(duration);
        self.wait_for(deadline, |state| state.shut_down.then_some(())).await;
    }
}
