//! The full path end to end: fake Telegram → real daemon → real `switchboard channel`
//! driven by a real MCP client → reply tool → daemon → fake Telegram.

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::*;
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, UserSpec};
use switchboard::ledger::{AttemptState, EnvelopeState};

#[tokio::test]
async fn one_message_in_one_reply_out_in_the_right_chat_and_topic() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let worker = session(&daemon, "worker").await;

    let forum = ChatSpec::forum(FORUM_CHAT, "Ops forum");
    fake.push_topic_text(
        &forum,
        OPS_TOPIC,
        UserSpec::new(7, "Ivan").with_username("ivan"),
        "is the deploy done?",
    );
    let pushed = worker.wait_for_notifications(1, WAIT).await.unwrap();
    let n = &pushed[0];
    assert_eq!(n.content, "is the deploy done?");
    for key in ["trace_id", "chat_id", "message_id", "user", "user_id", "ts", "route", "thread_id"] {
        assert!(n.meta_str(key).is_some(), "meta.{key} must be a string: {:?}", n.meta);
    }
    assert_eq!(n.meta_str("chat_id"), Some(FORUM_CHAT.to_string().as_str()));
    assert_eq!(n.meta_str("thread_id"), Some("42"));
    assert_eq!(n.meta_str("user"), Some("@ivan"));
    assert_eq!(n.meta_str("route"), Some("ops-topic"));
    assert!(n.meta.get("redelivered").is_none());
    assert!(n.meta.values().all(|v| v.is_string()), "meta values are strings: {:?}", n.meta);
    let trace = trace_id(n);
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);

    let (is_error, text) = worker.call_tool("reply", json!({"text": "yes, deployed"})).await.unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains(&trace), "the answer says what was answered: {text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].chat_id, FORUM_CHAT);
    assert_eq!(sent[0].message_thread_id, Some(OPS_TOPIC));
    assert_eq!(sent[0].text, "yes, deployed");
    assert_eq!(sent[0].reply_to_message_id, Some(n.meta_str("message_id").unwrap().parse().unwrap()));
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(worker.stdout_violations().is_empty(), "{:?}", worker.stdout_violations());
}

#[tokio::test]
async fn two_waiting_chats_refuse_a_reply_without_trace_id_then_each_is_answered_by_name() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "question from the DM");
    fake.push_text(
        ChatSpec::forum(FORUM_CHAT, "Ops forum"),
        UserSpec::new(7, "Ivan"),
        "question from the forum",
    );
    let pushed = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let (dm, forum) = (trace_id(&pushed[0]), trace_id(&pushed[1]));

    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "which one?"})).await.unwrap();
    assert!(is_error, "an ambiguous reply must be refused: {text}");
    for expected in [&dm, &forum] {
        assert!(text.contains(expected.as_str()), "candidate {expected} listed: {text}");
    }
    assert!(text.contains("question from the DM") && text.contains("question from the forum"), "{text}");
    assert!(fake.sent_messages().is_empty(), "a refusal sends nothing");
    assert_eq!(state_of(&daemon, &dm).await, EnvelopeState::Pending, "a refusal changes nothing");
    daemon.wait_for_log("reply refused", WAIT).await;

    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "to the forum", "trace_id": forum})).await.unwrap();
    assert!(!is_error, "{text}");
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "to the DM", "trace_id": dm})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(2, WAIT).await;
    assert_eq!((sent[0].chat_id, sent[0].text.as_str()), (FORUM_CHAT, "to the forum"));
    assert_eq!((sent[1].chat_id, sent[1].text.as_str()), (OWNER_CHAT, "to the DM"));

    // Nothing is waiting now: a reply without trace_id is refused, not sent somewhere.
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "anyone?"})).await.unwrap();
    assert!(is_error && text.contains("nothing you have been shown is waiting"), "{text}");
    // A further message in an answered thread is allowed when named and asked for with
    // `again: true`; without it, the agent is told what its earlier reply came to.
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "one more thing", "trace_id": dm})).await.unwrap();
    assert!(is_error && text.starts_with("already_answered: ") && text.contains("to the DM"), "{text}");
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "one more thing", "trace_id": dm, "again": true}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(3, WAIT).await;
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[2].chat_id, OWNER_CHAT);
}

/// The official plugin's reply takes `chat_id` (and `reply_to`); a model used to it names
/// the chat instead of the trace id. Alice and Bob wrote, Bob was answered by name: a reply
/// naming Bob's chat must not become the answer to Alice, the only one still waiting.
#[tokio::test]
async fn a_reply_that_names_a_chat_never_answers_a_message_of_another() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "from Alice");
    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), UserSpec::new(7, "Bob"), "from Bob");
    let pushed = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let (alice, bob) = (trace_id(&pushed[0]), trace_id(&pushed[1]));
    let bob_message = pushed[1].meta_str("message_id").unwrap().to_owned();
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "first answer", "trace_id": bob})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;

    let bob_chat = FORUM_CHAT.to_string();
    for named in
        [json!({"chat_id": bob_chat}), json!({"chat_id": FORUM_CHAT}), json!({"reply_to": bob_message})]
    {
        let mut args = json!({"text": "more for Bob"});
        args.as_object_mut().unwrap().extend(named.as_object().unwrap().clone());
        let (is_error, text) = orchestrator.call_tool("reply", args).await.unwrap();
        assert!(is_error && text.starts_with("nothing_pending"), "{named}: {text}");
    }
    // A trace id and a chat that contradict each other: refused, nothing sent.
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "for whom?", "trace_id": alice, "chat_id": bob_chat}))
        .await
        .unwrap();
    assert!(is_error && text.starts_with("bad_request"), "{text}");
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "x", "chat_id": "the forum"})).await.unwrap();
    assert!(is_error && text.starts_with("bad_request") && text.contains("chat_id"), "{text}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.sent_messages().len(), 1, "nothing more was sent: {:?}", fake.sent_messages());
    assert_eq!(state_of(&daemon, &alice).await, EnvelopeState::Pending, "Alice still waits");

    // Naming Alice's chat answers Alice.
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "for Alice", "chat_id": OWNER_CHAT.to_string()}))
        .await
        .unwrap();
    assert!(!is_error && text.contains(&alice), "{text}");
    let sent = fake.wait_for_sent(2, WAIT).await;
    assert_eq!((sent[1].chat_id, sent[1].text.as_str()), (OWNER_CHAT, "for Alice"));
}

/// A progress message answers its conversation, so the result goes with `again: true`. Sent
/// unnamed, while another chat's message has been shown meanwhile, it would have gone to
/// that chat, the only one still waiting: Alice's result in Bob's room. It is refused, and
/// named it goes to Alice.
#[tokio::test]
async fn a_further_message_must_name_its_conversation_and_never_lands_in_another_chat() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "from Alice");
    let alice = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "working on it", "trace_id": alice})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;
    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), UserSpec::new(7, "Bob"), "from Bob");
    orchestrator.wait_for_notifications(2, WAIT).await.unwrap();

    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "Alice's result", "again": true})).await.unwrap();
    assert!(is_error && text.contains("trace_id") && text.contains("nothing was sent"), "{text}");
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "Alice's result", "again": true, "trace_id": alice}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(2, WAIT).await;
    assert_eq!((sent[1].chat_id, sent[1].text.as_str()), (OWNER_CHAT, "Alice's result"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fake.sent_messages().iter().all(|sent| sent.chat_id != FORUM_CHAT), "nothing went to Bob's chat");
}

#[tokio::test]
async fn no_agent_can_answer_or_ack_another_agents_envelope() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    let worker = session(&daemon, "worker").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "for the orchestrator only");
    let trace = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);

    let (is_error, text) =
        worker.call_tool("reply", json!({"text": "hijack", "trace_id": trace})).await.unwrap();
    assert!(is_error && text.contains("not one of yours"), "{text}");
    let (is_error, text) = worker.call_tool("ack", json!({"trace_id": trace})).await.unwrap();
    assert!(is_error && text.contains("not one of yours"), "{text}");
    let (is_error, text) = worker.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error && !text.contains(&trace), "{text}");
    let (is_error, text) =
        worker.call_tool("reply", json!({"text": "x", "trace_id": "env_zzzzzzzzzz"})).await.unwrap();
    assert!(is_error && text.contains("env_zzzzzzzzzz"), "{text}");
    assert!(fake.sent_messages().is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);

    let (is_error, text) = orchestrator.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error && text.contains(&trace), "{text}");
    let (is_error, text) = orchestrator
        .call_tool("ack", json!({"trace_id": trace, "note": "seen, no answer needed"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(fake.sent_messages().is_empty(), "an ack sends nothing");
}

#[tokio::test]
async fn a_second_session_for_the_same_agent_is_refused() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let first = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "hello");
    first.wait_for_notifications(1, WAIT).await.unwrap();
    let second = plugin(&daemon, "orchestrator").await;
    second.wait_for_stderr("already connected", WAIT).await.unwrap();
    daemon.wait_for_log("refused a second session", WAIT).await;
    assert!(second.notifications().is_empty());
}

#[tokio::test]
async fn a_session_that_ends_leaves_its_envelopes_pending_for_the_next_one() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let first = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "unanswered");
    let trace = trace_id(&first.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    assert!(first.close().await.unwrap().success());
    daemon.wait_for_log("agent session disconnected", WAIT).await;
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending, "a disconnect proves nothing");

    let second = session(&daemon, "orchestrator").await;
    let again = second.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(trace_id(&again[0]), trace);
    assert_eq!(again[0].meta_str("redelivered"), Some("true"));
}

#[tokio::test]
async fn queued_envelopes_arrive_in_order_when_the_session_connects() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let dm = ChatSpec::private(OWNER_CHAT);
    let update_ids: Vec<i64> = (0..5).map(|i| fake.push_text(&dm, owner(), &format!("queued {i}"))).collect();
    fake.wait_until_confirmed(update_ids[4], WAIT).await;
    let orchestrator = session(&daemon, "orchestrator").await;
    let pushed = orchestrator.wait_for_notifications(5, WAIT).await.unwrap();
    let contents: Vec<_> = pushed.iter().map(|n| n.content.as_str()).collect();
    assert_eq!(contents, ["queued 0", "queued 1", "queued 2", "queued 3", "queued 4"]);
}

#[tokio::test]
async fn after_a_daemon_restart_a_pending_envelope_is_redelivered_and_answered_once() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("survive a restart").await;

    daemon.kill9();
    daemon.restart();
    let again = orchestrator.wait_for_notifications(2, Duration::from_secs(40)).await.unwrap();
    assert_eq!(trace_id(&again[1]), trace);
    assert_eq!(again[1].meta_str("redelivered"), Some("true"));
    // The same session already has it: the second copy says so, so that the model does not
    // start the work a second time; the first did not.
    assert_eq!(again[0].meta_str("shown_before"), None);
    assert_eq!(again[1].meta_str("shown_before"), Some("true"), "{:?}", again[1].meta);
    let how = again[1].meta_str("how_to_answer").unwrap();
    assert!(how.contains(&trace), "it still names what to answer: {how}");
    assert_ne!(Some(how), again[0].meta_str("how_to_answer"), "it tells the model more than the first copy");

    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "answered once"})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;
    // Acked is final and the ledger holds one attempt: nothing will send it again.
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert_eq!(attempts_of(&daemon, &trace).await.len(), 1, "one attempt");
    assert_eq!(fake.sent_messages().len(), 1, "no duplicate message");
}

#[tokio::test]
async fn a_send_that_hangs_after_telegram_recorded_it_becomes_unresolved_and_is_not_retried() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("will this arrive?").await;

    // send_timeout_secs is 2 in the test configuration.
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(10)));
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "maybe"})).await.unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("unresolved") && text.contains("Do not send it again"), "{text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Unresolved);
    // Unresolved waits for an operator, and its one attempt is unknown: nothing retries it.
    let attempts = attempts_of(&daemon, &trace).await;
    assert_eq!(attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(), [AttemptState::Unknown]);
    assert_eq!(fake.requests_for("sendMessage").len(), 1, "asked once");
    assert_eq!(fake.sent_messages().len(), 1, "Telegram got it once, and it was not sent again");

    // Unresolved envelopes cannot be answered until an operator reconciles them.
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "again", "trace_id": trace})).await.unwrap();
    assert!(is_error && text.contains("reconcile"), "{text}");
    assert_eq!(fake.sent_messages().len(), 1);

    let (ok, out, err) = daemon.ledger_cli(&["list", "--state", "unresolved"]);
    assert!(ok && out.contains(&trace), "{out}{err}");
    let (ok, out, err) = daemon.ledger_cli(&["show", &trace]);
    assert!(ok && out.contains("unknown"), "{out}{err}");
    let (ok, out, err) =
        daemon.ledger_cli(&["reconcile", &trace, "--delivered", "--reason", "seen in the chat by the owner"]);
    assert!(ok && out.contains("acked"), "{out}{err}");
    let (_, out, _) = daemon.ledger_cli(&["show", &trace]);
    assert!(out.contains("seen in the chat by the owner"), "the reason is kept: {out}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
}

#[tokio::test]
async fn a_rate_limited_reply_is_delivered_after_the_wait() {
    let OwnerWaiting { fake, daemon, orchestrator, trace: _ } = owner_waiting("busy bot").await;
    fake.fail_send_message(Fault::TooManyRequests { retry_after: 1 });
    let started = std::time::Instant::now();
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "after the wait"})).await.unwrap();
    assert!(!is_error, "{text}");
    assert!(started.elapsed() >= Duration::from_secs(1), "retry_after was waited out");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, "after the wait");
    daemon.wait_for_log("rate limit: waiting", WAIT).await;
}

#[tokio::test]
async fn a_long_reply_is_split_under_telegrams_limit() {
    let OwnerWaiting { fake, daemon: _daemon, orchestrator, trace: _ } =
        owner_waiting("tell me everything").await;
    let paragraph = "A sentence that goes on for a while. ".repeat(20);
    let long = vec![paragraph; 12].join("\n\n");
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": long})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.sent_messages();
    assert!(sent.len() >= 3, "{} chunks", sent.len());
    for message in &sent {
        assert!(message.text.encode_utf16().count() <= 4096);
        assert_eq!(message.chat_id, OWNER_CHAT);
    }
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    assert_eq!(squash(&sent.iter().map(|m| m.text.as_str()).collect::<String>()), squash(&long));
}

/// A reply holding U+0000 (which PostgreSQL refuses in text, and no chat shows) is sent
/// and recorded like any other, the character replaced, on either backend; the daemon goes
/// on.
#[tokio::test]
async fn a_reply_holding_a_nul_character_is_sent_and_recorded_and_the_daemon_goes_on() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("hi").await;
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "a\u{0}b"})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    let said = &sent[0].text;
    assert!(said.starts_with('a') && said.ends_with('b') && !said.contains('\0'), "{said:?}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(daemon.is_running(), "{}", daemon.logs());
}

#[tokio::test]
async fn a_refused_send_leaves_the_envelope_pending() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("hi").await;
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot was blocked by the user".into()));
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "hello?"})).await.unwrap();
    assert!(is_error && text.contains("did not take the reply"), "{text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
    // Blocked is blocked until the user says otherwise: no invitation to try again, but to
    // mark the message handled, which the agent can.
    assert!(!text.contains("may reply again") && text.contains("call ack"), "{text}");
    let (is_error, text) = orchestrator.call_tool("ack", json!({"trace_id": trace})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(fake.sent_messages().is_empty());
}

#[tokio::test]
async fn sigterm_with_a_connected_session_stops_promptly_and_keeps_the_envelope_pending() {
    let OwnerWaiting { fake: _fake, mut daemon, orchestrator, trace } =
        owner_waiting("pending at shutdown").await;
    let started = std::time::Instant::now();
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", daemon.logs());
    assert!(started.elapsed() < Duration::from_secs(5), "open session streams must not hold up a stop");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
    orchestrator.wait_for_stderr("not reachable", WAIT).await.unwrap();
}

/// A graceful stop waits for a send in flight; a second signal does not: the daemon exits
/// at once, and the send it cut off is unknown at the next start, never sent again.
#[tokio::test]
async fn a_second_stop_signal_ends_a_stop_that_waits_on_telegram() {
    let fake = FakeTelegram::start().await;
    let slow = [("SWITCHBOARD__TELEGRAM__SEND_TIMEOUT_SECS", "60")];
    let mut daemon = TestDaemon::start_with_env(&fake.api_url(), "", &default_routes(), &slow);
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "still there?");
    let trace = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    fake.fail_send_message(Fault::HangWithoutRecording(Duration::from_secs(120)));
    let reply = orchestrator.call_tool("reply", json!({"text": "yes", "trace_id": trace}));
    let stop = async {
        fake.wait_for_requests("sendMessage", 1, WAIT).await;
        daemon.signal("TERM");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(daemon.is_running(), "the graceful stop waits for the send in flight");
        let second = std::time::Instant::now();
        let status = daemon.stop();
        (status, second.elapsed())
    };
    // The reply's call is left behind: its plugin keeps asking a daemon that is gone.
    let (status, after_second) = tokio::select! {
        stopped = stop => stopped,
        answered = reply => panic!("the reply ended before the daemon stopped: {answered:?}"),
    };
    assert!(after_second < Duration::from_secs(5), "{after_second:?}\n{}", daemon.logs());
    assert!(!status.success(), "{status}");
    daemon.wait_for_log("a second stop signal", WAIT).await;

    daemon.restart();
    let deadline = std::time::Instant::now() + WAIT;
    while state_of(&daemon, &trace).await != EnvelopeState::Unresolved {
        assert!(std::time::Instant::now() < deadline, "the cut-off send is unknown after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fake.sent_messages().len(), 0, "not sent again");
}

#[tokio::test]
async fn a_reply_into_a_migrated_group_says_which_route_to_change() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let worker = session(&daemon, "worker").await;
    fake.push_text(ChatSpec::group(GROUP_CHAT, "Team"), UserSpec::new(8, "Mia"), "before the upgrade");
    let trace = trace_id(&worker.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    fake.fail_send_message(Fault::MigrateTo(-1_009_999_000_222));
    let (is_error, text) = worker.call_tool("reply", json!({"text": "hello?"})).await.unwrap();
    assert!(is_error && text.contains("-1009999000222"), "{text}");
    daemon.wait_for_log("change chat_id of route 'team-group' to -1009999000222", WAIT).await;
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
}

#[tokio::test]
async fn a_rate_limit_longer_than_the_reply_may_wait_is_reported_as_not_sent() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("busy bot").await;
    fake.fail_send_message(Fault::TooManyRequests { retry_after: 3600 });
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "later"})).await.unwrap();
    assert!(is_error && text.contains("rate limited by Telegram for 3600s"), "{text}");
    assert!(fake.sent_messages().is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending, "not sent: the agent may try again");
    // The chat is held for the hour Telegram asked: a second reply is not sent into
    // another 429, and says how long the hold lasts.
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "later still"})).await.unwrap();
    assert!(is_error && text.contains("rate limited by Telegram for") && text.contains("s more"), "{text}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.requests_for("sendMessage").len(), 1, "only the first reply reached Telegram");
    // A reaction in the held chat is held back too, not slept through for an hour.
    let react = orchestrator.call_tool("react", json!({"trace_id": trace, "emoji": "👀"}));
    let (is_error, text) =
        tokio::time::timeout(Duration::from_secs(5), react).await.expect("answered at once").unwrap();
    assert!(is_error && text.contains("rate limited by Telegram for"), "{text}");
    assert!(fake.requests_for("setMessageReaction").is_empty());
}
