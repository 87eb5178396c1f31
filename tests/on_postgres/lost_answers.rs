//! A COMMIT whose answer is lost (DESIGN.md §16): the server committed, the daemon's
//! connection closed before it heard so. The daemon must act on what the server did, not on
//! the error it saw: a message it took in reaches its agent once, a reply it recorded before
//! sending is sent once, and the ledger, the chat and the agent agree.
//!
//! Each daemon here reaches PostgreSQL through `support::postgres_proxy`, which loses the
//! answer to the COMMIT of the transaction the test names by one of its statements.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::agents::*;
use support::daemon::*;
use support::postgres_proxy::PostgresProxy;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};
use switchboard::ledger::{AttemptState, EnvelopeState};

const WAIT: Duration = Duration::from_secs(20);

/// A daemon whose ledger is reached through a proxy of the test's, to the server its test
/// schema is on.
async fn daemon_through_proxy(fake: &FakeTelegram) -> (TestDaemon, PostgresProxy) {
    let mut daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let direct = daemon.ledger_at.setting();
    let proxy = PostgresProxy::to(PostgresProxy::server_of(&direct));
    let config = std::fs::read_to_string(daemon.config_path()).unwrap();
    std::fs::write(daemon.config_path(), config.replace(&direct, &proxy.url_through(&direct))).unwrap();
    daemon.launch();
    (daemon, proxy)
}

#[tokio::test]
async fn a_message_whose_intake_commit_lost_its_answer_reaches_the_live_session_once() {
    let fake = FakeTelegram::start().await;
    let (daemon, proxy) = daemon_through_proxy(&fake).await;
    let orchestrator = session(&daemon, "orchestrator").await;
    // The session is live and taking envelopes: intake claims the next for it in its
    // own transaction.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "first");
    let first = nth(&orchestrator, 1).await;
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "heard", "trace_id": trace_id(&first)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    proxy.lose_next_commit_answer_after("INSERT INTO envelopes");
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "while the answer is lost");
    proxy.wait_for_a_lost_answer(WAIT).await;
    let shown = nth(&orchestrator, 2).await;
    assert_eq!(shown.content, "while the answer is lost");
    assert_eq!(shown.meta_str("redelivered"), None, "shown for the first time: {:?}", shown.meta);
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "heard too", "trace_id": trace_id(&shown)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(2, WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(orchestrator.notifications().len(), 2, "each shown once: {:?}", orchestrator.notifications());
    let rows = daemon.envelopes().await;
    assert_eq!(rows.len(), 2, "one envelope each: {rows:?}");
    assert!(rows.iter().all(|row| row.state == EnvelopeState::Acked), "{rows:?}");
}

#[tokio::test]
async fn a_reply_whose_attempt_commit_lost_its_answer_is_sent_once_and_told_so() {
    let fake = FakeTelegram::start().await;
    let (daemon, proxy) = daemon_through_proxy(&fake).await;
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "ask");
    let shown = nth(&orchestrator, 1).await;
    proxy.lose_next_commit_answer_after("INSERT INTO attempts");
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "answer", "trace_id": trace_id(&shown)}))
        .await
        .unwrap();
    assert_eq!(proxy.answers_lost(), 1, "the attempt's COMMIT lost its answer");
    assert!(!is_error, "the reply went: {text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.sent_messages().len(), 1, "sent once: {sent:?}");
    let attempts = attempts_of(&daemon, &trace_id(&shown)).await;
    let outcomes: Vec<AttemptState> = attempts.iter().map(|attempt| attempt.outcome).collect();
    assert_eq!(outcomes, [AttemptState::Sent], "one attempt, sent: {attempts:?}");
}
