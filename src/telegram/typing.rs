//! "typing…" while an answer is awaited (issue 22): while a chat has a pending message in
//! front of its agent (handed to the agent's connected session, whose plugin pushes it at
//! once, or confirmed shown), the chat is sent `sendChatAction(typing)` every few seconds
//! (Telegram shows one for about five), for at most `[outbound] typing_max_secs` per
//! message. The reply or an ack ends it: the envelope is no longer pending.
//!
//! A chat action posts nothing, so it is no attempt in the ledger and does not go through
//! the pacer: it never delays a message or counts against its budget. One that fails is
//! logged at debug and forgotten.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::bot_api::{BotApi, Exchange};
use super::outbound::telegram_thread;
use crate::agents::bridge::{Bridge, ShownWaiting};

/// How often a typing chat is told again: Telegram shows the action for about 5 s.
pub const TYPING_REFRESH: Duration = Duration::from_secs(4);

/// The loop looks again at most this often however often sessions confirm what they
/// showed: under a burst of messages it reads the ledger a few times a second, not once
/// per message.
const MIN_LOOK_INTERVAL: Duration = Duration::from_millis(200);

/// A chat, or a topic of a forum, as a chat action addresses it.
pub type TypingChat = (i64, Option<i32>);

/// When each waiting envelope was first seen shown (its typing lasts `max` from then), and
/// when each chat was last told it is typing.
#[derive(Debug, Default)]
pub struct TypingDecision {
    since: HashMap<String, Instant>,
    told: HashMap<TypingChat, Instant>,
}

impl TypingDecision {
    /// The chats that should show "typing…" at `now`, given what waits shown right now:
    /// each chat with an envelope first seen waiting less than `max` ago. Envelopes no
    /// longer waiting are forgotten.
    pub fn chats(&mut self, now: Instant, waiting: &[ShownWaiting], max: Duration) -> BTreeSet<TypingChat> {
        self.since.retain(|trace_id, _| waiting.iter().any(|w| &w.trace_id == trace_id));
        let mut chats = BTreeSet::new();
        for envelope in waiting {
            let since = *self.since.entry(envelope.trace_id.clone()).or_insert(now);
            if now.saturating_duration_since(since) < max {
                chats.insert((envelope.chat_id, envelope.thread_id));
            }
        }
        chats
    }

    /// Of the chats that should be typing at `now` ([`Self::chats`]), those to tell now:
    /// the ones not told within [`TYPING_REFRESH`]. Looking more often than that sends no
    /// more chat actions.
    pub fn due(&mut self, now: Instant, typing: &BTreeSet<TypingChat>) -> Vec<TypingChat> {
        self.told.retain(|chat, _| typing.contains(chat));
        let due: Vec<TypingChat> = typing
            .iter()
            .filter(|chat| {
                self.told.get(chat).is_none_or(|told| now.saturating_duration_since(*told) >= TYPING_REFRESH)
            })
            .copied()
            .collect();
        for chat in &due {
            self.told.insert(*chat, now);
        }
        due
    }
}

/// The loop that keeps the chats typing.
pub struct TypingIndicator {
    bridge: Bridge,
    api: BotApi,
    max: Duration,
}

impl TypingIndicator {
    pub fn new(bridge: Bridge, api: BotApi, max: Duration) -> Self {
        Self { bridge, api, max }
    }

    /// Runs until `shutdown`: every [`TYPING_REFRESH`] while a chat is typing, and at once
    /// when a session was handed or showed something. With no chat typing, only the
    /// latter can start one, so an idle daemon does not wake for typing at all.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut decision = TypingDecision::default();
        let mut typing: BTreeSet<TypingChat> = BTreeSet::new();
        loop {
            let (waiting, read) = match self.bridge.shown_and_waiting().await {
                Ok(waiting) => (waiting, true),
                Err(e) => {
                    tracing::debug!(error = %e, "typing: could not read what waits; trying again");
                    (Vec::new(), false)
                }
            };
            let now = Instant::now();
            let now_typing = decision.chats(now, &waiting, self.max);
            for (chat_id, thread_id) in typing.difference(&now_typing) {
                tracing::debug!(chat_id, ?thread_id, "typing stopped");
            }
            for (chat_id, thread_id) in decision.due(now, &now_typing) {
                self.show_typing(chat_id, thread_id).await;
            }
            typing = now_typing;
            let idle = read && typing.is_empty();
            let next_look = tokio::time::Instant::now() + MIN_LOOK_INTERVAL;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(TYPING_REFRESH), if !idle => {}
                () = self.bridge.shown_changed() => {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep_until(next_look) => {}
                    }
                }
            }
        }
    }

    async fn show_typing(&self, chat_id: i64, thread_id: Option<i32>) {
        let mut params = json!({ "chat_id": chat_id, "action": "typing" });
        if let Some(thread_id) = telegram_thread(thread_id) {
            params["message_thread_id"] = json!(thread_id);
        }
        match self.api.call("sendChatAction", &params).await {
            Exchange::Answered { status: 200, .. } => tracing::trace!(chat_id, ?thread_id, "typing"),
            other => tracing::debug!(chat_id, ?thread_id, answer = ?other, "sendChatAction failed; ignored"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(trace_id: &str, chat_id: i64, thread_id: Option<i32>) -> ShownWaiting {
        ShownWaiting { trace_id: trace_id.into(), chat_id, thread_id }
    }

    #[test]
    fn a_chat_types_while_a_shown_message_waits_and_stops_when_it_is_answered() {
        let mut decision = TypingDecision::default();
        let start = Instant::now();
        let max = Duration::from_secs(120);
        assert!(decision.chats(start, &[], max).is_empty(), "nothing waits: no chat types");
        let waiting = [shown("env_a", 1, None), shown("env_b", 1, None), shown("env_c", -2, Some(7))];
        let chats = decision.chats(start, &waiting, max);
        assert_eq!(chats, BTreeSet::from([(-2, Some(7)), (1, None)]), "one action per chat or topic");
        let answered = [shown("env_c", -2, Some(7))];
        assert_eq!(decision.chats(start + TYPING_REFRESH, &answered, max), BTreeSet::from([(-2, Some(7))]));
        assert!(decision.chats(start + TYPING_REFRESH * 2, &[], max).is_empty());
    }

    #[test]
    fn a_typing_chat_is_told_again_only_after_the_refresh_interval() {
        let mut decision = TypingDecision::default();
        let start = Instant::now();
        let typing = BTreeSet::from([(1, None), (2, Some(3))]);
        assert_eq!(decision.due(start, &typing), [(1, None), (2, Some(3))]);
        assert!(decision.due(start + Duration::from_millis(300), &typing).is_empty(), "told a moment ago");
        let more = BTreeSet::from([(1, None), (2, Some(3)), (4, None)]);
        assert_eq!(decision.due(start + Duration::from_secs(1), &more), [(4, None)], "a new chat at once");
        assert_eq!(decision.due(start + TYPING_REFRESH, &more), [(1, None), (2, Some(3))]);
        // A chat that stopped and starts again is told at once.
        decision.due(start + TYPING_REFRESH, &BTreeSet::new());
        assert_eq!(decision.due(start + TYPING_REFRESH, &more).len(), 3);
    }

    #[test]
    fn typing_lasts_at_most_max_per_message_and_a_new_message_starts_it_again() {
        let mut decision = TypingDecision::default();
        let start = Instant::now();
        let max = Duration::from_secs(10);
        let old = [shown("env_a", 1, None)];
        assert_eq!(decision.chats(start, &old, max).len(), 1);
        assert_eq!(decision.chats(start + Duration::from_secs(9), &old, max).len(), 1);
        assert!(
            decision.chats(start + max, &old, max).is_empty(),
            "a message waits too long: no more typing"
        );
        let newer = [shown("env_a", 1, None), shown("env_b", 1, None)];
        assert_eq!(decision.chats(start + max, &newer, max), BTreeSet::from([(1, None)]));
        // A message answered and forgotten starts afresh if it ever waits again (a
        // reconciliation that finds it not delivered).
        decision.chats(start + max, &[], max);
        assert_eq!(decision.chats(start + max * 2, &old, max).len(), 1);
    }
}
