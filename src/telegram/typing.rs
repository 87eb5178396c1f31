//! "typing…" while an answer is awaited (issue 22): while a chat has a pending message in
//! front of its agent (handed to the agent's connected session, whose plugin pushes it at
//! once, or confirmed shown), the chat is sent `sendChatAction(typing)` every few seconds
//! (Telegram shows one for about five), for at most `[outbound] typing_max_secs` per
//! message. The reply or an ack ends it: the envelope is no longer pending. So does an
//! answer to a later message of the same chat: the agent has moved past this one.
//!
//! A chat action posts nothing, so it is no attempt in the ledger and does not go through
//! the pacer: it never delays a message or counts against its budget. One that fails is
//! logged at debug and forgotten, except a `429`: that holds the chat for every send, as a
//! send's own does, and no chat action goes to a held chat.

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

/// What the typing loop remembers of each waiting envelope, and when each chat was last
/// told it is typing.
#[derive(Debug, Default)]
pub struct TypingDecision {
    seen: HashMap<String, Seen>,
    /// Numbers envelopes in the order they were first seen waiting.
    next_order: u64,
    told: HashMap<TypingChat, Instant>,
}

/// A waiting envelope as the typing loop first saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    chat: TypingChat,
    /// Its typing lasts `max` from then.
    since: Instant,
    /// Its place in the order envelopes were first seen (within one look, the ledger's).
    order: u64,
    /// A message after it in its chat was answered: the agent has moved past it, and the
    /// chat does not type for it any more (it still waits, and is redelivered as ever).
    passed_over: bool,
}

impl TypingDecision {
    /// The chats that should show "typing…" at `now`, given what waits shown right now
    /// (oldest first): each chat with an envelope first seen waiting less than `max` ago
    /// and not passed over. An envelope no longer waiting is forgotten, and the envelopes
    /// of its chat seen before it are passed over: a burst of messages answered by one
    /// reply to the last does not leave the chat typing for the first.
    pub fn chats(&mut self, now: Instant, waiting: &[ShownWaiting], max: Duration) -> BTreeSet<TypingChat> {
        let is_waiting = |trace_id: &String| waiting.iter().any(|w| &w.trace_id == trace_id);
        let answered: Vec<Seen> =
            self.seen.iter().filter(|(trace_id, _)| !is_waiting(trace_id)).map(|(_, seen)| *seen).collect();
        self.seen.retain(|trace_id, _| is_waiting(trace_id));
        for gone in answered {
            for seen in self.seen.values_mut() {
                if seen.chat == gone.chat && seen.order < gone.order {
                    seen.passed_over = true;
                }
            }
        }
        let mut chats = BTreeSet::new();
        for envelope in waiting {
            let chat = (envelope.chat_id, envelope.thread_id);
            let seen = *self.seen.entry(envelope.trace_id.clone()).or_insert_with(|| {
                self.next_order += 1;
                Seen { chat, since: now, order: self.next_order, passed_over: false }
            });
            if !seen.passed_over && now.saturating_duration_since(seen.since) < max {
                chats.insert(chat);
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
        let outbound = self.bridge.outbound();
        if outbound.holds(chat_id) {
            tracing::trace!(chat_id, ?thread_id, "no typing: a 429 holds the chat");
            return;
        }
        let exchange = self.api.call("sendChatAction", &params).await;
        outbound.heard(chat_id, &exchange);
        match exchange {
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
    fn a_message_after_which_the_agent_answered_a_later_one_stops_typing() {
        let mut decision = TypingDecision::default();
        let start = Instant::now();
        let max = Duration::from_secs(120);
        let burst = [shown("env_hi", 1, None), shown("env_question", 1, None), shown("env_other", 2, None)];
        assert_eq!(decision.chats(start, &burst, max).len(), 2);
        // The question is answered; "hi" still waits, unanswered, but the agent moved past it.
        let left = [shown("env_hi", 1, None), shown("env_other", 2, None)];
        assert_eq!(decision.chats(start + TYPING_REFRESH, &left, max), BTreeSet::from([(2, None)]));
        // A new message in that chat types again.
        let more = [shown("env_hi", 1, None), shown("env_other", 2, None), shown("env_next", 1, None)];
        assert_eq!(
            decision.chats(start + TYPING_REFRESH * 2, &more, max),
            BTreeSet::from([(1, None), (2, None)])
        );

        // Answering the older of two leaves the newer typing.
        let mut decision = TypingDecision::default();
        let two = [shown("env_a", 5, Some(1)), shown("env_b", 5, Some(1))];
        decision.chats(start, &two, max);
        let newer = [shown("env_b", 5, Some(1))];
        assert_eq!(decision.chats(start + TYPING_REFRESH, &newer, max), BTreeSet::from([(5, Some(1))]));
        // And another topic of the same chat is another chat.
        let topics = [shown("env_b", 5, Some(1)), shown("env_c", 5, Some(2))];
        decision.chats(start + TYPING_REFRESH, &topics, max);
        let other_topic_answered = [shown("env_b", 5, Some(1))];
        assert_eq!(decision.chats(start + TYPING_REFRESH * 2, &other_topic_answered, max).len(), 1);
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
