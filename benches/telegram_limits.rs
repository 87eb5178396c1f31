//! At Telegram's limits (issue 26): a burst of 1,000 replies spread over 200 chats
//! (private chats, groups, forum topics), sent by the real daemon as it ships (paced per
//! chat and to the overall budget of 30 a second) to the fake Bot API enforcing Telegram's
//! limits (`FakeTelegram::enforce_limits`: at most 30 sends in any second, a short burst
//! then one a second per private chat, twenty a minute per group; a send past them gets
//! `429`). One agent session answers all 200 messages at once, each answer five Telegram
//! messages long.
//!
//! Figures, beside their goals:
//! - `429` answers: none;
//! - the overall rate achieved, as a share of the budget: at least 0.95;
//! - each chat's (and topic's) messages in order, each once;
//! - fairness: the longest a chat's first message waited for the budget once its reply
//!   reached the daemon's outbound side (read from the daemon's `pacing sends` debug lines;
//!   no line means no wait), against its fair share of the budget (200 chats at 30 a
//!   second: 6.7 s, one send of every other chat's reply before it); goal at most 1.1 times
//!   that share. Beside it, informational: when the last chat's first message arrived,
//!   counted from the moment the agent made its 200 calls (that includes the calls' way
//!   through the one session to the daemon).
//!
//! `cargo bench --bench telegram_limits` (about 40 s); `SWITCHBOARD_BENCH_QUICK=1` runs 60
//! chats in about 10 s.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::json;
use support::agents::{session, trace_id};
use support::daemon::TestDaemon;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, SentMessage, TelegramLimits, UserSpec};

const BUDGET_PER_SEC: f64 = 30.0;
const PARTS: usize = 5;
const FIRST_USER: i64 = 800_000_001;
const WAIT: Duration = Duration::from_secs(180);

/// Where each message of the burst is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Conversation {
    chat: i64,
    topic: Option<i32>,
}

/// 70% private chats, 20% groups, 10% forum topics (one in each forum: the topics of one
/// forum share its group's limit of twenty a minute, which would bind before the budget).
fn conversations(count: usize) -> Vec<Conversation> {
    let private = count * 7 / 10;
    let groups = count * 2 / 10;
    let topics = count - private - groups;
    let mut all: Vec<Conversation> =
        (0..private).map(|i| Conversation { chat: FIRST_USER + i as i64, topic: None }).collect();
    all.extend((0..groups).map(|i| Conversation { chat: -5_000_001 - i as i64, topic: None }));
    all.extend(
        (0..topics).map(|i| Conversation { chat: -1_009_000_001 - i as i64, topic: Some(10 + i as i32) }),
    );
    all
}

/// An answer of `PARTS` Telegram messages, each saying whose part it is.
fn answer(conversation: &Conversation) -> String {
    (1..=PARTS)
        .map(|n| format!("{} {:?} part {n} ", conversation.chat, conversation.topic) + &"x".repeat(3_900))
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn part_number(message: &SentMessage) -> usize {
    let words: Vec<&str> = message.text.split(' ').collect();
    let at = words.iter().position(|w| *w == "part").expect("a part's text names it");
    words[at + 1].parse().expect("its number")
}

/// The longest a reply's first part waited for pacing: each reply's first `pacing sends`
/// line (a part sent at once logs none, and its later parts' lines come after it).
fn longest_first_wait(logs: &str) -> Duration {
    let mut first: HashMap<&str, u64> = HashMap::new();
    for line in logs.lines().filter(|line| line.contains("pacing sends to Telegram's limits")) {
        let field = |name: &str| line.split(name).nth(1).and_then(|rest| rest.split(' ').next());
        if let (Some(trace), Some(wait)) =
            (field("trace_id="), field("wait_ms=").and_then(|w| w.parse().ok()))
        {
            first.entry(trace).or_insert(wait);
        }
    }
    Duration::from_millis(first.values().copied().max().unwrap_or(0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var_os("SWITCHBOARD_BENCH_QUICK").is_some();
    let count = if quick { 60 } else { 200 };
    let fake = FakeTelegram::start().await;
    fake.enforce_limits(TelegramLimits::default());
    let routes = "\n[[routes]]\nname = \"everyone\"\nagent = \"orchestrator\"\n";
    let daemon = TestDaemon::start(&fake.api_url(), "", routes);
    let orchestrator = session(&daemon, "orchestrator").await;

    let all = conversations(count);
    for (i, conversation) in all.iter().enumerate() {
        let user = UserSpec::new(FIRST_USER + 10_000 + i as i64, &format!("user {i}"));
        let chat = match conversation {
            Conversation { chat, topic: None } if *chat > 0 => ChatSpec::private(*chat),
            Conversation { chat, topic: None } => ChatSpec::group(*chat, "a group"),
            Conversation { chat, topic: Some(_) } => ChatSpec::forum(*chat, "a forum"),
        };
        let user = if conversation.chat > 0 { UserSpec::new(conversation.chat, "a user") } else { user };
        match conversation.topic {
            Some(topic) => fake.push_topic_text(&chat, topic, &user, "the morning report, please"),
            None => fake.push_text(&chat, &user, "the morning report, please"),
        };
    }
    let pushed =
        orchestrator.wait_for_notifications(count, WAIT).await.expect("every message reaches the agent");
    let by_trace: HashMap<String, Conversation> = pushed
        .iter()
        .map(|n| {
            let chat = n.meta_str("chat_id").and_then(|c| c.parse().ok()).expect("chat_id");
            let topic = n.meta_str("thread_id").and_then(|t| t.parse().ok());
            (trace_id(n), Conversation { chat, topic })
        })
        .collect();

    let asked = Instant::now();
    let replies = by_trace.iter().map(|(trace, conversation)| {
        let arguments = json!({"text": answer(conversation), "trace_id": trace});
        let orchestrator = &orchestrator;
        async move { orchestrator.call_tool("reply", arguments).await }
    });
    let refused = join_all(replies).await.into_iter().filter(|r| !matches!(r, Ok((false, _)))).count();
    let sent = fake.wait_for_sent(count * PARTS, WAIT).await;
    let took = asked.elapsed();

    // Order and completeness, per conversation (a topic is its own thread of parts).
    let mut parts: HashMap<Conversation, Vec<(usize, Instant)>> = HashMap::new();
    for message in &sent {
        let conversation = Conversation { chat: message.chat_id, topic: message.message_thread_id };
        parts.entry(conversation).or_default().push((part_number(message), message.received_at));
    }
    let in_order = parts.len() == count
        && parts
            .values()
            .all(|p| p.iter().map(|(n, _)| *n).collect::<Vec<_>>() == (1..=PARTS).collect::<Vec<_>>());
    let first = sent.iter().map(|m| m.received_at).min().expect("something was sent");
    let last = sent.iter().map(|m| m.received_at).max().expect("something was sent");
    let rate = (sent.len() - 1) as f64 / last.duration_since(first).as_secs_f64();
    let last_first = parts.values().map(|p| p[0].1).max().expect("a first part").duration_since(asked);
    let fair_share = count as f64 / BUDGET_PER_SEC;
    let first_wait = longest_first_wait(&daemon.logs());

    println!("telegram_limits: {count} chats, {} replies of {PARTS} parts, {took:.1?} in all", count);
    println!("  429 answers:              {:>8}   goal 0", fake.too_many_requests());
    println!("  replies refused:          {refused:>8}   goal 0");
    println!(
        "  overall rate / budget:    {:>8.3}   goal ≥ 0.95 ({rate:.2} a second of {BUDGET_PER_SEC})",
        rate / BUDGET_PER_SEC
    );
    println!("  in order, each once:      {:>8}   goal yes", if in_order { "yes" } else { "NO" });
    println!(
        "  first-part wait / fair:   {:>8.3}   goal ≤ 1.1 (the longest wait {:.2} s; a chat's fair share {fair_share:.2} s)",
        first_wait.as_secs_f64() / fair_share,
        first_wait.as_secs_f64()
    );
    println!(
        "  last first answer:        {:>7.2}s   (after the agent's calls; informational)",
        last_first.as_secs_f64()
    );
    drop(orchestrator);
    drop(daemon);
}
