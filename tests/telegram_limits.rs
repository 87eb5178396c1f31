//! Telegram's overall budget (issue 26): concurrent replies to more chats than one second
//! of the budget holds, against a fake Bot API that enforces Telegram's limits, never see
//! a `429` and are paced by the budget (how they take turns in it is
//! `rules::pacing`'s unit tests and the `telegram_limits` benchmark's figure); and a `429` that happens all the same (pacing
//! off, as when another process sends with the same token) is waited out with nothing
//! lost and nothing sent twice.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::json;
use support::agents::{WAIT, session, trace_id};
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, SentMessage, TelegramLimits, UserSpec};

/// The tests of this file, one at a time: a burst with pacing off beside one with pacing on
/// would take the machine from under the fake, whose clock is what judges the budget.
static ONE_BURST_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// More chats than a second of the budget (30) holds, so the overall budget binds.
const CHATS: i64 = 45;
const FIRST_USER: i64 = 700_000_001;

/// Every chat to the orchestrator: a default route.
fn any_chat() -> String {
    "\n[[routes]]\nname = \"everyone\"\nagent = \"orchestrator\"\n".to_owned()
}

/// Two Telegram messages' worth of text: each reply goes out in two parts.
fn two_parts(chat: i64) -> String {
    let part = |n: u32| format!("chat {chat} part {n} ") + &"x".repeat(3_900);
    format!("{}\n\n{}", part(1), part(2))
}

/// The parts a chat received, in the order the fake took them.
fn by_chat(sent: &[SentMessage]) -> HashMap<i64, Vec<&SentMessage>> {
    let mut chats: HashMap<i64, Vec<&SentMessage>> = HashMap::new();
    for message in sent {
        chats.entry(message.chat_id).or_default().push(message);
    }
    chats
}

/// `CHATS` users each write in their own private chat; the orchestrator answers all of
/// them at once, each answer in two parts. Returns what the fake took and the moment the
/// replies were asked for.
async fn burst(fake: &FakeTelegram, daemon: &TestDaemon) -> (Vec<SentMessage>, Instant) {
    let orchestrator = session(daemon, "orchestrator").await;
    for i in 0..CHATS {
        let user = UserSpec::new(FIRST_USER + i, &format!("user {i}"));
        fake.push_text(ChatSpec::private(FIRST_USER + i), &user, "tell me");
    }
    let pushed = orchestrator.wait_for_notifications(CHATS as usize, WAIT).await.unwrap();
    let asked = Instant::now();
    let replies = pushed.iter().map(|notification| {
        let chat: i64 = notification.meta_str("chat_id").unwrap().parse().unwrap();
        let arguments = json!({"text": two_parts(chat), "trace_id": trace_id(notification)});
        let orchestrator = &orchestrator;
        async move { orchestrator.call_tool("reply", arguments).await.unwrap() }
    });
    for (is_error, text) in join_all(replies).await {
        assert!(!is_error, "{text}");
    }
    let sent = fake.wait_for_sent(2 * CHATS as usize, WAIT).await;
    (sent, asked)
}

// The fake answers on worker threads of its own, so that the test's MCP client, busy with
// the replies, does not delay when the fake sees a send arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_many_chats_sees_no_429_and_is_paced_by_the_budget() {
    let _alone = ONE_BURST_AT_A_TIME.lock().await;
    let fake = FakeTelegram::start().await;
    fake.enforce_limits(TelegramLimits::default());
    // The daemon's pacing as it ships: 30 a second overall, and per chat.
    let daemon = TestDaemon::start(&fake.api_url(), "", &any_chat());
    let (sent, asked) = burst(&fake, &daemon).await;

    assert_eq!(fake.too_many_requests(), 0, "the enforcing fake answered a send with 429");
    let chats = by_chat(&sent);
    assert_eq!(chats.len(), CHATS as usize);
    for (chat, parts) in &chats {
        let texts: Vec<&str> = parts.iter().map(|m| &m.text[..m.text.find(" x").unwrap()]).collect();
        assert_eq!(
            texts,
            [format!("chat {chat} part 1"), format!("chat {chat} part 2")],
            "in order, once each"
        );
    }
    // The budget binds: 90 sends at 30 a second take about three seconds, not less.
    let took = sent.iter().map(|m| m.received_at).max().unwrap().duration_since(asked);
    assert!(took >= Duration::from_millis(2_800), "{took:?}: faster than the budget allows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_that_happens_all_the_same_is_waited_out_and_nothing_is_sent_twice() {
    let _alone = ONE_BURST_AT_A_TIME.lock().await;
    let fake = FakeTelegram::start().await;
    fake.enforce_limits(TelegramLimits::default());
    // No overall pacing: as when another process spends the same bot's budget.
    let config = format!("{}\n[outbound]\nglobal_per_sec = 0\n", any_chat());
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &config, &[]);
    let (sent, _) = burst(&fake, &daemon).await;

    assert!(fake.too_many_requests() > 0, "the burst never went past the enforcing fake's budget");
    for (chat, parts) in by_chat(&sent) {
        assert_eq!(parts.len(), 2, "chat {chat}: each part once");
    }
    daemon.wait_for_log("Telegram rate limit: waiting", WAIT).await;
}

/// Two replies to one chat at once are never interleaved there: a five-part answer (its
/// last two parts paced a second apart) and a one-part answer to the same chat, asked for
/// while the first is under way, arrive one whole after the other.
#[tokio::test]
async fn two_replies_to_one_chat_at_once_arrive_one_after_the_other() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    let owner = support::agents::owner();
    fake.push_text(ChatSpec::private(OWNER_CHAT), &owner, "the long question");
    fake.push_text(ChatSpec::private(OWNER_CHAT), &owner, "the short question");
    let pushed = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let part = |n: u32| format!("long part {n} ") + &"x".repeat(3_900);
    let long = (1..=5).map(part).collect::<Vec<_>>().join("\n\n");
    let long_reply = orchestrator.call_tool("reply", json!({"text": long, "trace_id": trace_id(&pushed[0])}));
    let short_reply = async {
        // Asked for once the long one's burst is out and its fourth part waits its turn.
        fake.wait_for_sent(3, WAIT).await;
        orchestrator
            .call_tool("reply", json!({"text": "the short answer", "trace_id": trace_id(&pushed[1])}))
            .await
    };
    let (long_reply, short_reply) = tokio::join!(long_reply, short_reply);
    for (is_error, text) in [long_reply.unwrap(), short_reply.unwrap()] {
        assert!(!is_error, "{text}");
    }
    let sent = fake.wait_for_sent(6, WAIT).await;
    let heads: Vec<String> = sent.iter().map(|m| m.text.chars().take(12).collect()).collect();
    assert_eq!(
        heads,
        ["long part 1 ", "long part 2 ", "long part 3 ", "long part 4 ", "long part 5 ", "the short an"],
        "the short answer waited for the long one"
    );
}

/// A group Telegram counts by the minute.
const GROUP: i64 = -1_000_555;
/// Replies to the group, three parts each: one send more than a minute's twenty.
const GROUP_REPLIES: i64 = 7;
/// Private chats answered beside the group, two parts each.
const BESIDE: i64 = 20;

/// Three Telegram messages' worth of text.
fn three_parts(reply: i64) -> String {
    let part = |n: u32| format!("reply {reply} part {n} ") + &"x".repeat(3_900);
    format!("{}\n\n{}\n\n{}", part(1), part(2), part(3))
}

/// A group's twenty-first send of a minute waits for its first to have left Telegram's
/// minute, counted from when the first actually went: here it goes late, because a `429`
/// (another process on the same token) halves the budget just after the sends before it
/// were scheduled at the whole of it. Takes a minute and a little more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_gets_no_more_than_twenty_in_any_minute_when_its_first_send_goes_late() {
    let _alone = ONE_BURST_AT_A_TIME.lock().await;
    let fake = FakeTelegram::start().await;
    fake.enforce_limits(TelegramLimits::default());
    let daemon = TestDaemon::start(&fake.api_url(), "", &any_chat());
    let orchestrator = session(&daemon, "orchestrator").await;
    for i in 0..BESIDE {
        let user = UserSpec::new(FIRST_USER + i, &format!("user {i}"));
        fake.push_text(ChatSpec::private(FIRST_USER + i), &user, "tell me");
    }
    for i in 0..GROUP_REPLIES {
        let user = UserSpec::new(FIRST_USER + BESIDE + i, &format!("member {i}"));
        fake.push_text(ChatSpec::group(GROUP, "Team"), &user, "status?");
    }
    let pushed = orchestrator.wait_for_notifications((BESIDE + GROUP_REPLIES) as usize, WAIT).await.unwrap();
    // The first send is answered 429, as when another process spent the budget: the fake
    // does not count it among its own refusals.
    fake.fail_send_message(Fault::TooManyRequests { retry_after: 1 });
    let mut group_replies = 0;
    // The private chats' replies first, so that the group's first part is scheduled behind
    // theirs and goes late once the budget is halved.
    let (private, group): (Vec<_>, Vec<_>) = pushed
        .iter()
        .partition(|notification| notification.meta_str("chat_id").unwrap() != GROUP.to_string());
    let replies = private.into_iter().chain(group).map(|notification| {
        let chat: i64 = notification.meta_str("chat_id").unwrap().parse().unwrap();
        let text = if chat == GROUP {
            group_replies += 1;
            three_parts(group_replies)
        } else {
            two_parts(chat)
        };
        let arguments = json!({"text": text, "trace_id": trace_id(notification)});
        let orchestrator = &orchestrator;
        async move { orchestrator.call_tool("reply", arguments).await.unwrap() }
    });
    for (is_error, text) in join_all(replies.collect::<Vec<_>>()).await {
        assert!(!is_error, "{text}");
    }
    let all = (2 * BESIDE + 3 * GROUP_REPLIES) as usize;
    let sent = fake.wait_for_sent(all, Duration::from_secs(100)).await;

    let to_group: Vec<&SentMessage> = sent.iter().filter(|m| m.chat_id == GROUP).collect();
    let first = to_group[0].received_at;
    let after_first: Vec<Duration> = to_group.iter().map(|m| m.received_at.duration_since(first)).collect();
    assert_eq!(
        fake.too_many_requests(),
        0,
        "the enforcing fake answered a send with 429; the group's: {after_first:?}"
    );
    assert_eq!(sent.len(), all);
    // Each reply whole and in order, once (the replies themselves in the order they came).
    let heads: Vec<&str> = to_group.iter().map(|m| &m.text[..m.text.find(" x").unwrap()]).collect();
    assert_eq!(heads.len(), (3 * GROUP_REPLIES) as usize);
    let mut replies: Vec<&str> = heads.iter().map(|head| &head[..head.find(" part").unwrap()]).collect();
    for (reply, parts) in replies.chunks(3).zip(heads.chunks(3)) {
        assert_eq!(parts, [1, 2, 3].map(|n| format!("{} part {n}", reply[0])), "{heads:?}");
    }
    replies.sort_unstable();
    replies.dedup();
    assert_eq!(replies.len(), GROUP_REPLIES as usize, "{heads:?}");
}
