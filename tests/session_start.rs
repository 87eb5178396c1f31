//! The start of an agent session as Claude Code makes it: the messages that waited for a
//! session reach a client that takes channel notifications only some time after it listed
//! the tools, and a client that connects and leaves without getting ready (the health
//! check of `claude mcp list`) takes nothing.

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::{WAIT, meta, owner, plugin_builder, session, state_of, trace_id};
use support::daemon::{OWNER_CHAT, TestDaemon, default_routes};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};
use switchboard::ledger::{EnvelopeState, ListFilter};

/// How long after its `tools/list` the client below installs its channel handler. Claude
/// Code 2.1 took up to about 80 ms in the real-client harness; twice that here.
const HANDLER_DELAY: Duration = Duration::from_millis(160);

#[tokio::test]
async fn messages_that_waited_for_a_session_reach_a_client_that_starts_like_claude_code() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let dm = ChatSpec::private(OWNER_CHAT);
    fake.push_text(&dm, owner(), "first, while nobody listened");
    let last = fake.push_text(&dm, owner(), "second, while nobody listened");
    fake.wait_until_confirmed(last, WAIT).await;

    let agent = plugin_builder(&daemon, "orchestrator")
        .like_claude_code(HANDLER_DELAY)
        .start()
        .await
        .expect("plugin starts");
    let received = agent.wait_for_notifications(2, WAIT).await.unwrap();
    assert_eq!(agent.dropped_before_ready(), 0, "nothing was pushed before the client took it");
    let contents: Vec<&str> = received.iter().map(|n| n.content.as_str()).collect();
    assert_eq!(contents, ["first, while nobody listened", "second, while nobody listened"]);
    for message in &received {
        assert_eq!(message.meta_str("redelivered"), None, "queued, not handed to an earlier session");
        let how = meta(message, "how_to_answer");
        assert!(
            how.contains(&format!("mcp__switchboard__reply with trace_id {}", trace_id(message))),
            "{how}"
        );
    }

    // Then one notice says what is still waiting, with every trace id.
    let waiting = agent.wait_for_waiting_notices(1, WAIT).await.unwrap().remove(0);
    assert_eq!(meta(&waiting, "kind"), "waiting");
    assert_eq!(meta(&waiting, "waiting"), "2");
    assert_eq!(trace_id(&waiting), trace_id(&received[0]), "about the oldest");
    for message in &received {
        assert!(waiting.content.contains(&trace_id(message)), "{}", waiting.content);
    }
    assert!(meta(&waiting, "how_to_answer").contains("mcp__switchboard__pending"));

    let first = trace_id(&received[0]);
    let (is_error, text) =
        agent.call_tool("reply", json!({"text": "got it", "trace_id": first})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await[0].text, "got it");
    assert_eq!(state_of(&daemon, &first).await, EnvelopeState::Acked);
}

#[tokio::test]
async fn a_client_that_connects_and_leaves_before_it_is_ready_takes_nothing() {
    let (_fake, daemon) = a_message_recorded_while_nobody_listens("are you there?").await;
    let ledger = daemon.ledger().await;
    let trace = ledger
        .list(&ListFilter { limit: 1, ..Default::default() })
        .await
        .unwrap()
        .pop()
        .expect("recorded")
        .trace_id;
    ledger.close().await;

    // A health check: the handshake, the tool list, and gone.
    let check = plugin_builder(&daemon, "orchestrator").start().await.expect("plugin starts");
    assert!(check.close().await.unwrap().success());
    assert!(check_took_nothing(&daemon, &trace).await);

    // The next session gets it as a first delivery, not as one an earlier session dropped.
    let agent = session(&daemon, "orchestrator").await;
    let message = agent.wait_for_notifications(1, WAIT).await.unwrap().remove(0);
    assert_eq!(trace_id(&message), trace.as_str());
    assert_eq!(message.meta_str("redelivered"), None);
}

/// A daemon with one message from the owner recorded, and no session connected.
async fn a_message_recorded_while_nobody_listens(text: &str) -> (FakeTelegram, TestDaemon) {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let update = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), text);
    fake.wait_until_confirmed(update, WAIT).await;
    (fake, daemon)
}

/// Whether the envelope is still queued and was never handed to a session.
async fn check_took_nothing(daemon: &TestDaemon, trace: &str) -> bool {
    let ledger = daemon.ledger().await;
    let envelope = ledger
        .find(&switchboard::ids::TraceId::parse(trace).unwrap())
        .await
        .unwrap()
        .expect("envelope exists");
    ledger.close().await;
    envelope.state == EnvelopeState::Queued && envelope.deliveries == 0
}

#[tokio::test]
async fn a_client_that_never_lists_the_tools_gets_its_session_with_its_first_tool_call() {
    let (_fake, daemon) = a_message_recorded_while_nobody_listens("anyone?").await;

    let agent =
        plugin_builder(&daemon, "orchestrator").without_tool_list().start().await.expect("plugin starts");
    let (is_error, text) = agent.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error, "the call found a live session: {text}");
    let message = agent.wait_for_notifications(1, WAIT).await.unwrap().remove(0);
    assert_eq!(message.content, "anyone?");
}

#[tokio::test]
async fn a_client_that_never_lists_the_tools_gets_its_messages_all_the_same() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let agent =
        plugin_builder(&daemon, "orchestrator").without_tool_list().start().await.expect("plugin starts");
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "only notifications, please");
    let message = agent.wait_for_notifications(1, WAIT).await.unwrap().remove(0);
    assert_eq!(message.content, "only notifications, please");
}

/// A session that opens while another process holds the ledger past its busy timeout (an
/// operator's `sqlite3` or `psql` left in a transaction) cannot take back what waited for
/// it. It is handed nothing: the daemon ends the stream and the plugin opens it again.
/// Once the lock is gone the agent gets each envelope once, the one an earlier session
/// was shown marked as redelivered, and the ledger counts each delivery once.
#[tokio::test]
async fn a_session_opened_while_the_ledger_is_locked_gets_what_waited_once_the_lock_is_gone() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let dm = ChatSpec::private(OWNER_CHAT);
    let earlier = session(&daemon, "orchestrator").await;
    fake.push_text(&dm, owner(), "shown to the earlier session");
    let shown = trace_id(&earlier.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    assert!(earlier.close().await.unwrap().success());
    // The plugin's exit is not the daemon's notice of it: until then, a new envelope would
    // go to the closing stream and count as a delivery.
    daemon.wait_for_log("agent session disconnected", WAIT).await;
    let queued = fake.push_text(&dm, owner(), "sent while no session was open");
    fake.wait_until_confirmed(queued, WAIT).await;

    let holder = daemon.hold_write_lock();
    let agent = plugin_builder(&daemon, "orchestrator").start().await.expect("plugin starts");
    // The daemon's wait for the lock (10 s) runs out and the session's opening fails.
    daemon.wait_for_log("agent session failed", Duration::from_secs(40)).await;
    assert!(agent.notifications().is_empty(), "nothing handed over while the ledger could not say so");
    holder.release();

    let received = agent.wait_for_notifications(2, Duration::from_secs(40)).await.unwrap();
    let contents: Vec<&str> = received.iter().map(|n| n.content.as_str()).collect();
    assert_eq!(contents, ["shown to the earlier session", "sent while no session was open"]);
    assert_eq!(trace_id(&received[0]), shown);
    assert_eq!(received[0].meta_str("redelivered"), Some("true"));
    assert_eq!(received[1].meta_str("redelivered"), None);
    // Nothing more comes: neither failed opening handed anything over.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(agent.notifications().len(), 2);
    let ledger = daemon.ledger().await;
    let deliveries: Vec<(String, EnvelopeState, i64)> = ledger
        .list(&ListFilter { limit: 10, ..Default::default() })
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.text.unwrap_or_default(), e.state, e.deliveries))
        .collect();
    ledger.close().await;
    assert_eq!(
        deliveries,
        [
            ("shown to the earlier session".to_owned(), EnvelopeState::Pending, 2),
            ("sent while no session was open".to_owned(), EnvelopeState::Pending, 1),
        ],
        "each delivery counted once"
    );
}
