//! The reply path's contract under interruption (issue 6): a reply's outcome never
//! depends on its caller staying connected, the agent's account and the ledger always
//! agree, one session per agent, unnamed replies only among envelopes the agent was
//! shown, and the bounds on what one reply may do.
//!
//! Each test starts the real daemon against the fake Bot API; the agent side is the real
//! `switchboard channel` plugin driven by a real MCP client, or the raw local API client
//! where a test needs to see what a plugin hides (request ids, unshown envelopes).

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::*;
use support::daemon::*;
use switchboard::agents::api::client::ClientError;
use switchboard::agents::api::wire::{ErrorCode, ReactRequest, ReplyRequest};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault};
use switchboard::ids::RequestId;
use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};

/// Telegram takes this long to answer a send that it performs: longer than the tests
/// need to interrupt the caller, shorter than `send_timeout_secs` (2 in the test config).
const SLOW_SEND: Duration = Duration::from_millis(1500);

/// Waits until a connection to the (stopped) daemon's local API holds bytes it has not
/// read: the request is in its socket. Read from `/proc/net/tcp`, so a slow plugin on a
/// loaded machine cannot make the test kill the daemon before the request arrives.
async fn wait_until_a_request_waits_in_the_socket(port: u16) {
    let local = format!(":{port:04X}");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let buffered = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, rem_address, st (01 = established), tx_queue:rx_queue
            fields.len() > 4
                && fields[1].ends_with(&local)
                && fields[3] == "01"
                && fields[4].split(':').nth(1).is_some_and(|rx| u64::from_str_radix(rx, 16).unwrap_or(0) > 0)
        });
        if buffered {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the reply request never reached the daemon's socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A message of `n` parts once split under Telegram's 4096-character limit.
fn text_of_parts(n: usize) -> String {
    (0..n).map(|i| format!("part {i} ") + &"x".repeat(3900)).collect::<Vec<_>>().join("\n\n")
}

/// Waits until the envelope is in `state`.
async fn wait_for_state(daemon: &TestDaemon, trace: &str, state: EnvelopeState) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let now = state_of(daemon, trace).await;
        if now == state {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{trace} stayed {now}, expected {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn refusal_code(error: &ClientError) -> Option<ErrorCode> {
    error.code()
}

#[tokio::test]
async fn a_reply_cancelled_mid_send_is_delivered_once_and_settles_its_envelope() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("cancel me").await;
    fake.fail_send_message(Fault::RecordThenHang(SLOW_SEND));

    // The user presses Esc while the send is on its way to Telegram.
    // Cancelled once Telegram has the message and the daemon waits for its answer.
    let on_the_wire = async {
        fake.wait_for_nth_sent(1, WAIT).await.expect("the reply reaches Telegram");
    };
    orchestrator.call_tool_and_cancel("reply", json!({"text": "on its way"}), on_the_wire).await.unwrap();
    orchestrator.wait_for_stderr("reply cancelled by the agent session", WAIT).await.unwrap();

    wait_for_state(&daemon, &trace, EnvelopeState::Acked).await;
    let attempts = attempts_of(&daemon, &trace).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptState::Sent);
    assert_eq!(fake.sent_messages().len(), 1);

    // A clean restart finds nothing in flight: the confirmed envelope stays acked.
    assert!(daemon.stop().success());
    daemon.restart();
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(!daemon.logs().contains("marked unresolved"), "{}", daemon.logs());
}

/// A reply cancelled while Telegram holds its answer is still on its way: `pending` lists
/// the conversation as waiting, and says a reply to it is on its way, so the agent does
/// not take "still waiting" for "nothing was delivered" and reply again.
#[tokio::test]
async fn pending_says_which_waiting_conversation_has_a_reply_on_its_way() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;
    fake.fail_send_message(Fault::RecordThenHang(SLOW_SEND));
    let on_the_wire = async {
        fake.wait_for_held_send(WAIT).await.expect("the reply reaches Telegram");
    };
    let first = json!({"text": "all green", "trace_id": trace});
    orchestrator.call_tool_and_cancel("reply", first, on_the_wire).await.unwrap();

    let (is_error, listed) = orchestrator.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error, "{listed}");
    let line = listed.lines().find(|line| line.contains(&trace)).unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains("on its way") && line.contains("NOT reply again"), "{listed}");

    wait_for_state(&daemon, &trace, EnvelopeState::Acked).await;
    let (_, listed) = orchestrator.call_tool("pending", json!({})).await.unwrap();
    assert!(!listed.contains(&trace), "answered, no longer waiting: {listed}");
    assert_eq!(fake.sent_messages().len(), 1, "one reply in the chat");
}

/// The user presses Esc while the reply is on its way; Telegram takes it. The agent never
/// saw the outcome and retries: it is told what the first reply came to, nothing more is
/// posted, and that stays so across a `kill -9` of the daemon; only `again: true` posts a
/// further message.
#[tokio::test]
async fn a_reply_retried_after_its_call_was_cancelled_is_told_what_the_first_came_to() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("what happened?").await;
    fake.fail_send_message(Fault::RecordThenHang(SLOW_SEND));
    let on_the_wire = async {
        fake.wait_for_nth_sent(1, WAIT).await.expect("the reply reaches Telegram");
    };
    let first = json!({"text": "interrupted answer", "trace_id": trace});
    orchestrator.call_tool_and_cancel("reply", first, on_the_wire).await.unwrap();
    orchestrator.wait_for_stderr("reply cancelled by the agent session", WAIT).await.unwrap();
    wait_for_state(&daemon, &trace, EnvelopeState::Acked).await;
    let delivered_as = fake.sent_messages()[0].message_id;

    let retry = json!({"text": "second try", "trace_id": trace});
    let (is_error, text) = orchestrator.call_tool("reply", retry.clone()).await.unwrap();
    assert!(is_error && text.starts_with("already_answered: "), "{text}");
    assert!(
        text.contains(&format!("message {delivered_as}")) && text.contains("interrupted answer"),
        "{text}"
    );
    assert!(text.contains("again: true"), "says how to add a message: {text}");
    assert_eq!(fake.sent_messages().len(), 1, "nothing new was posted");

    // The daemon dies between the send and the next retry: the ledger still knows.
    daemon.kill9();
    daemon.restart();
    let deadline = std::time::Instant::now() + WAIT;
    let text = loop {
        let (is_error, text) = orchestrator.call_tool("reply", retry.clone()).await.unwrap();
        assert!(std::time::Instant::now() < deadline, "the plugin never got back to the daemon: {text}");
        // Until the plugin's session is back, the call says so and does nothing.
        if !text.contains("session") && !text.contains("not reachable") {
            assert!(is_error, "{text}");
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(text.starts_with("already_answered: ") && text.contains("interrupted answer"), "{text}");
    assert_eq!(fake.sent_messages().len(), 1, "nothing new was posted after the restart");

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "second try", "trace_id": trace, "again": true}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let texts: Vec<String> = fake.wait_for_sent(2, WAIT).await.into_iter().map(|m| m.text).collect();
    assert_eq!(texts, ["interrupted answer", "second try"]);
}

#[tokio::test]
async fn a_plugin_killed_mid_send_leaves_one_answer_and_nothing_to_redeliver() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("are you there?").await;
    fake.fail_send_message(Fault::RecordThenHang(SLOW_SEND));

    let pid = orchestrator.pid().expect("plugin pid");
    let call = tokio::spawn(async move {
        let _ = orchestrator.call_tool("reply", json!({"text": "yes"})).await;
        orchestrator
    });
    // Killed once Telegram has the message and the daemon waits for its answer.
    fake.wait_for_nth_sent(1, WAIT).await.expect("the reply reaches Telegram");
    assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let _ = call.await;

    wait_for_state(&daemon, &trace, EnvelopeState::Acked).await;
    assert_eq!(fake.sent_messages().len(), 1);

    // The next session of the agent gets nothing again, and an unnamed reply has nothing
    // to answer: the first answer is the only one.
    let next = session(&daemon, "orchestrator").await;
    let (is_error, text) = next.call_tool("reply", json!({"text": "yes again"})).await.unwrap();
    assert!(is_error && text.contains("nothing you have been shown"), "{text}");
    // Named, the retry of the new session is told what the first reply came to.
    let (is_error, text) =
        next.call_tool("reply", json!({"text": "yes again", "trace_id": trace})).await.unwrap();
    assert!(is_error && text.starts_with("already_answered: ") && text.contains("\"yes\""), "{text}");
    assert_eq!(fake.sent_messages().len(), 1, "no second answer");
    // A redelivery would come first, when the session opened: the first thing this
    // session is handed is a message sent after all that.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "still there?");
    let first = nth(&next, 1).await;
    assert_eq!(first.content, "still there?", "{:?}", next.notifications());
}

/// An edit on its way to Telegram when the daemon is killed. Whether Telegram made it, only
/// Telegram knows: the restarted daemon records it `unknown` before it serves anyone, the
/// plugin asks again about the same request and tells the agent so, and nothing makes the
/// edit a second time. The agent's account, the chat and the ledger agree.
#[tokio::test]
async fn an_edit_on_the_wire_when_the_daemon_dies_is_unknown_and_never_made_again() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("build it").await;
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": trace, "text": "step 1 of 2"})).await.unwrap();
    assert!(!is_error, "{text}");
    let progress = fake.wait_for_sent(1, WAIT).await[0].message_id;
    fake.fail_method("editMessageText", Fault::RecordThenHang(Duration::MAX));

    let edit = json!({"trace_id": trace, "message_id": progress, "text": "step 2 of 2"});
    let call = tokio::spawn(async move {
        let outcome = orchestrator.call_tool("edit_message", edit).await;
        (orchestrator, outcome)
    });
    // Killed once Telegram has made the edit and the daemon waits for its answer.
    eventually(WAIT, "the edit reaching Telegram", || {
        fake.sent_message(progress).unwrap().text == "step 2 of 2"
    })
    .await;
    daemon.kill9();
    daemon.restart();

    let (orchestrator, outcome) = call.await.unwrap();
    let (is_error, text) = outcome.unwrap();
    assert!(is_error && text.starts_with("unresolved: "), "the agent is told it may have been made: {text}");
    let attempts = attempts_of(&daemon, &trace).await;
    let outcomes: Vec<_> = attempts.iter().map(|a| (a.method, a.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            (AttemptMethod::SendMessage, AttemptState::Sent),
            (AttemptMethod::EditMessage, AttemptState::Unknown)
        ]
    );
    // The same edit asked for anew is a new request: made once more, and known this time.
    let (is_error, text) = orchestrator
        .call_tool(
            "edit_message",
            json!({"trace_id": trace, "message_id": progress, "text": "step 2 of 2, done"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.requests_for("editMessageText").len(), 2, "the interrupted edit was not made again");
    assert_eq!(fake.sent_message(progress).unwrap().text, "step 2 of 2, done");
}

#[tokio::test]
async fn a_request_lost_in_a_dead_daemons_socket_is_reported_as_not_sent() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("hello?").await;

    // The plugin's confirmation that it showed the message lands first (every tool call
    // waits for the confirmations on their way), so the request that waits in the socket
    // below is the reply.
    let (is_error, listed) = orchestrator.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error && listed.contains(&trace), "{listed}");
    // The daemon freezes; the reply request reaches its socket but is never read.
    daemon.signal("STOP");
    let call = tokio::spawn(async move {
        let outcome = orchestrator.call_tool("reply", json!({"text": "hi", "trace_id": trace.clone()})).await;
        (orchestrator, outcome)
    });
    wait_until_a_request_waits_in_the_socket(daemon.api_addr().port()).await;
    daemon.kill9();
    daemon.restart();

    let (orchestrator, outcome) = call.await.unwrap();
    let (is_error, text) = outcome.unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("nothing was sent") && text.contains("You may call reply again"), "{text}");
    let trace = trace_id(&orchestrator.notifications()[0]);
    // The ledger tells the same story: no attempt, the envelope still waits.
    assert!(attempts_of(&daemon, &trace).await.is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
    assert!(fake.sent_messages().is_empty());

    // So replying again is right, and goes out once.
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "hi", "trace_id": trace})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await.len(), 1);
}

#[tokio::test]
async fn a_5xx_from_telegram_is_unknown_and_never_sent_again() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("important").await;
    // Telegram posts the message, then something in front of it answers 500.
    fake.fail_send_message(Fault::RecordThenServerError);
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "done"})).await.unwrap();
    assert!(is_error && text.contains("Do not send it again") && text.contains("HTTP 500"), "{text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Unresolved);

    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "done", "trace_id": trace})).await.unwrap();
    assert!(is_error && text.contains("reconcile"), "{text}");
    assert_eq!(fake.sent_messages().len(), 1, "the one Telegram posted, and no other");
}

#[tokio::test]
async fn a_reply_cut_off_part_way_resumes_without_resending_the_delivered_parts() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("the long story").await;
    let text = text_of_parts(3);
    fake.fail_send_message(Fault::Pass);
    fake.fail_send_message(Fault::BadRequest("Bad Request: message thread not found".into()));

    let (is_error, answer) =
        orchestrator.call_tool("reply", json!({"text": text, "trace_id": trace})).await.unwrap();
    assert!(is_error, "{answer}");
    assert!(answer.contains("part(s) 1 of 3") && answer.contains("same text"), "{answer}");
    assert_eq!(fake.sent_messages().len(), 1);
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);

    let (is_error, answer) =
        orchestrator.call_tool("reply", json!({"text": text, "trace_id": trace})).await.unwrap();
    assert!(!is_error, "{answer}");
    assert!(answer.contains("3 messages"), "the receipt names every part: {answer}");
    let sent = fake.wait_for_sent(3, WAIT).await;
    let starts: Vec<&str> = sent.iter().map(|m| &m.text[..6]).collect();
    assert_eq!(starts, ["part 0", "part 1", "part 2"], "each part exactly once, in order");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);

    // The reply is whole: the same call once more (a retry after a cancelled call) posts
    // nothing, and says what the reply came to.
    let (is_error, answer) =
        orchestrator.call_tool("reply", json!({"text": text, "trace_id": trace})).await.unwrap();
    assert!(is_error && answer.starts_with("already_answered: "), "{answer}");
    assert!(answer.contains("was delivered"), "{answer}");
    assert_eq!(fake.sent_messages().len(), 3, "no part posted twice");
}

/// What became of the request that finished a reply cut off part-way: delivered, with
/// every part's message, the ones the earlier request posted included.
#[tokio::test]
async fn the_request_that_finished_a_cut_off_reply_reads_as_delivered() {
    let RawOwnerWaiting { fake, daemon: _daemon, client, stream: _stream, envelope } =
        raw_owner_waiting("the long story").await;
    let text = text_of_parts(3);
    fake.fail_send_message(Fault::Pass);
    fake.fail_send_message(Fault::BadRequest("Bad Request: message thread not found".into()));
    let cut_off = ReplyRequest::new(&text, Some(envelope.trace_id.clone()));
    client.reply(&cut_off).await.unwrap_err();

    let finishing = ReplyRequest::new(&text, Some(envelope.trace_id.clone()));
    let receipt = client.reply(&finishing).await.unwrap();
    assert_eq!(receipt.message_ids.len(), 3, "{receipt:?}");
    assert_eq!(client.reply_outcome(&finishing.request_id).await.unwrap(), receipt);

    let once_more = ReplyRequest::new(&text, Some(envelope.trace_id.clone()));
    let refused = client.reply(&once_more).await.unwrap_err();
    assert_eq!(refusal_code(&refused), Some(ErrorCode::AlreadyAnswered), "{refused}");
    assert_eq!(fake.sent_messages().len(), 3);
}

#[tokio::test]
async fn a_follow_up_whose_outcome_is_unknown_leaves_the_answer_acked() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "all good"})).await.unwrap();
    assert!(!is_error, "{text}");

    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(5)));
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "one more thing", "trace_id": trace, "again": true}))
        .await
        .unwrap();
    assert!(is_error && text.contains("stays answered"), "{text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);

    // Nothing more goes to that envelope until the follow-up is reconciled.
    let another = json!({"text": "and another", "trace_id": trace, "again": true});
    let (is_error, text) = orchestrator.call_tool("reply", another.clone()).await.unwrap();
    assert!(is_error && text.contains("reconcile"), "{text}");
    let (ok, out, err) = daemon.ledger_cli(&["stats"]);
    assert!(ok && out.contains("unreconciled attempts: 1"), "{out}{err}");
    assert!(out.contains("list --unreconciled"), "stats says where to look: {out}");
    // The operator finds which envelope holds it, though it is acked, not unresolved.
    let (ok, out, err) = daemon.ledger_cli(&["list", "--unreconciled"]);
    assert!(ok && out.contains(&trace) && out.contains("(1 envelope(s))"), "{out}{err}");
    let (ok, out, err) =
        daemon.ledger_cli(&["reconcile", &trace, "--delivered", "--reason", "it is in the chat"]);
    assert!(ok && out.contains("acked"), "{out}{err}");
    let (ok, out, err) = daemon.ledger_cli(&["list", "--unreconciled"]);
    assert!(ok && out.contains("(0 envelope(s))"), "{out}{err}");
    let (is_error, text) = orchestrator.call_tool("reply", another).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(3, WAIT).await.len(), 3);
}

#[tokio::test]
async fn a_second_session_with_the_same_secret_acts_on_nothing() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let first = session(&daemon, "orchestrator").await;
    let second = plugin(&daemon, "orchestrator").await;
    second.wait_for_stderr("already connected", WAIT).await.unwrap();
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "for the first session");
    let trace = trace_id(&first.wait_for_notifications(1, WAIT).await.unwrap()[0]);

    for (tool, arguments) in [
        ("pending", json!({})),
        ("reply", json!({"text": "hijack", "trace_id": trace})),
        ("reply", json!({"text": "hijack"})),
        ("ack", json!({"trace_id": trace})),
    ] {
        let (is_error, text) = second.call_tool(tool, arguments).await.unwrap();
        assert!(is_error && text.contains("not the connected session"), "{tool}: {text}");
    }
    assert!(fake.sent_messages().is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
    let (is_error, text) = first.call_tool("reply", json!({"text": "mine"})).await.unwrap();
    assert!(!is_error, "{text}");
}

#[tokio::test]
async fn an_unnamed_reply_resolves_only_among_envelopes_the_session_was_shown() {
    let RawOwnerWaiting { fake, daemon: _daemon, client, mut stream, envelope } =
        raw_owner_waiting("not read yet").await;

    // A blank trace id is not "no trace id": it is refused.
    let blank = ReplyRequest { trace_id: Some(String::new()), ..ReplyRequest::new("blank", None) };
    assert_eq!(refusal_code(&client.reply(&blank).await.unwrap_err()), Some(ErrorCode::BadRequest));

    // Only what was handed to this session can be confirmed.
    assert!(!client.shown("env_0000000000").await.unwrap().marked);
    // Handed to the session, but the plugin never confirmed the agent saw it.
    let refused = client.reply(&ReplyRequest::new("blind answer", None)).await.unwrap_err();
    assert_eq!(refusal_code(&refused), Some(ErrorCode::NothingPending), "{refused}");
    assert!(refused.to_string().contains("1 message is on its way"), "{refused}");
    assert!(fake.sent_messages().is_empty());
    // Named, it may be answered at once.
    let named = client.reply(&ReplyRequest::new("named answer", Some(envelope.trace_id.clone()))).await;
    assert!(named.is_ok(), "{named:?}");

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "read this one");
    let second = next_envelope(&mut stream).await;
    assert!(client.shown(&second.trace_id).await.unwrap().marked);
    let receipt = client.reply(&ReplyRequest::new("seen answer", None)).await.unwrap();
    assert_eq!(receipt.trace_id, second.trace_id);
}

/// The channel plugin confirms what it showed the agent with the agent's next call (the
/// `x-switchboard-shown` header), not with a request of its own per envelope.
#[tokio::test]
async fn envelopes_noted_as_shown_are_confirmed_by_the_next_call_and_only_by_it() {
    let RawOwnerWaiting { fake, daemon, client, mut stream, envelope: first } =
        raw_owner_waiting("first").await;

    // Noted, not yet sent: nothing is confirmed until a call carries it.
    client.note_shown("env_0000000000");
    client.note_shown(&first.trace_id);
    let receipt = client.reply(&ReplyRequest::new("to the first", None)).await.unwrap();
    assert_eq!(receipt.trace_id, first.trace_id);

    // The next envelope is not noted: an unnamed reply cannot take it.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "second");
    let second = next_envelope(&mut stream).await;
    let refused = client.reply(&ReplyRequest::new("blind", None)).await.unwrap_err();
    assert_eq!(refusal_code(&refused), Some(ErrorCode::NothingPending), "{refused}");
    // Once noted, any call confirms it, a refused one included.
    client.note_shown(&second.trace_id);
    let refused =
        client.reply(&ReplyRequest { trace_id: Some(String::new()), ..ReplyRequest::new("x", None) }).await;
    assert_eq!(refusal_code(&refused.unwrap_err()), Some(ErrorCode::BadRequest));
    let receipt = client.reply(&ReplyRequest::new("to the second", None)).await.unwrap();
    assert_eq!(receipt.trace_id, second.trace_id);
    assert_eq!(fake.sent_messages().len(), 2);

    // A malformed header is refused, naming the header, and marks nothing.
    let secret = ORCHESTRATOR_SECRET;
    let url = format!("http://{}/v1/agents/orchestrator/pending", daemon.api_addr());
    let answer = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(url)
        .bearer_auth(secret)
        .header("x-switchboard-shown", format!("{},not-a-trace-id", second.trace_id))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    assert!(answer.text().await.unwrap().contains("x-switchboard-shown"));
}

#[tokio::test]
async fn a_repeated_request_returns_the_first_outcome_and_sends_once() {
    let RawOwnerWaiting { fake, daemon: _daemon, client, stream: _stream, envelope } =
        raw_owner_waiting("once please").await;

    let request = ReplyRequest::new("only once", Some(envelope.trace_id.clone()));
    let (first, second) = tokio::join!(client.reply(&request), client.reply(&request));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first, second);
    assert_eq!(client.reply(&request).await.unwrap(), first);
    assert_eq!(client.reply_outcome(&request.request_id).await.unwrap(), first);
    assert_eq!(fake.sent_messages().len(), 1);

    let never = client.reply_outcome("req_neverseenbefore").await.unwrap_err();
    assert_eq!(refusal_code(&never), Some(ErrorCode::UnknownRequest), "{never}");
    assert!(never.to_string().contains("nothing was sent"), "{never}");
}

/// A reaction asked for again with the same request id while the first is still on its way
/// to Telegram (the plugin does so when its connection broke during the call): the second
/// request waits for the first and is told what it came to. Telegram gets one request, and
/// the agent is not told "unknown" about a reaction that was made.
#[tokio::test]
async fn a_reaction_asked_again_while_the_first_is_on_its_way_is_made_once_and_both_learn_it_was() {
    let RawOwnerWaiting { fake, daemon, client, stream: _stream, envelope } =
        raw_owner_waiting("react to me").await;
    fake.fail_method("setMessageReaction", Fault::RecordThenHang(SLOW_SEND));

    let request = ReactRequest {
        trace_id: envelope.trace_id.clone(),
        emoji: "👍".into(),
        message_id: None,
        chat_id: None,
        request_id: RequestId::generate().to_string(),
    };
    let again = async {
        eventually(WAIT, "the reaction reaching Telegram", || {
            !fake.requests_for("setMessageReaction").is_empty()
        })
        .await;
        client.react(&request).await
    };
    let (first, again) = tokio::join!(client.react(&request), again);
    let first = first.expect("the reaction was made");
    assert_eq!(again.expect("told what the first came to"), first);
    assert_eq!(fake.requests_for("setMessageReaction").len(), 1, "made once");
    let attempts = attempts_of(&daemon, &envelope.trace_id).await;
    let outcomes: Vec<_> = attempts.iter().map(|a| (a.method, a.outcome)).collect();
    assert_eq!(outcomes, [(AttemptMethod::SetReaction, AttemptState::Sent)]);
    // Once it is over, the ledger answers a repeat.
    assert_eq!(client.react(&request).await.unwrap(), first);
    assert_eq!(fake.requests_for("setMessageReaction").len(), 1);
}

#[tokio::test]
async fn a_reply_above_the_part_limit_is_refused_and_sends_nothing() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        "",
        &default_routes(),
        &[("SWITCHBOARD__OUTBOUND__MAX_REPLY_PARTS", "2")],
    );
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "tell me everything");
    let trace = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);

    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": text_of_parts(3)})).await.unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("3 Telegram messages") && text.contains("at most 2"), "{text}");
    let megabyte = "word ".repeat(200_000);
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": megabyte})).await.unwrap();
    assert!(is_error && text.contains("outbound.max_reply_parts"), "{text}");
    assert!(fake.sent_messages().is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
}

#[tokio::test]
async fn sends_to_one_chat_are_paced_instead_of_bursting() {
    let OwnerWaiting { fake, daemon: _daemon, orchestrator, trace: _ } = owner_waiting("a lot to say").await;
    let asked = std::time::Instant::now();
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": text_of_parts(5)})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(5, WAIT).await;
    // A burst of three, then one a second in a private chat: part k goes out no sooner
    // than k - 2 seconds after the first was reserved, which was after `asked`. Measured
    // from there, not between parts: a part the loaded machine sent late lets the next
    // follow sooner, and the bucket allows that.
    for (later, part) in sent.iter().enumerate().skip(3) {
        let after = part.received_at.duration_since(asked);
        let floor = Duration::from_secs(later as u64 - 2);
        assert!(after >= floor, "part {later} went out {after:?} after the reply, before {floor:?}");
    }
}

#[tokio::test]
async fn an_ack_is_not_held_up_by_another_replys_rate_limit_wait() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "first");
    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), owner(), "second");
    let pushed = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let (first, second) = (trace_id(&pushed[0]), trace_id(&pushed[1]));

    // Long enough that the ack, on a loaded machine, comes back well inside the wait.
    fake.fail_send_message(Fault::TooManyRequests { retry_after: 8 });
    let orchestrator = std::sync::Arc::new(orchestrator);
    let replying = {
        let orchestrator = std::sync::Arc::clone(&orchestrator);
        let first = first.clone();
        tokio::spawn(async move {
            orchestrator.call_tool("reply", json!({"text": "later", "trace_id": first})).await
        })
    };
    daemon.wait_for_log("rate limit: waiting", WAIT).await;
    let (is_error, text) = orchestrator.call_tool("ack", json!({"trace_id": second})).await.unwrap();
    assert!(!is_error, "{text}");
    assert!(!replying.is_finished(), "the ack came back while the reply still waited out the rate limit");
    assert_eq!(state_of(&daemon, &second).await, EnvelopeState::Acked);
    let (is_error, text) = replying.await.unwrap().unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(state_of(&daemon, &first).await, EnvelopeState::Acked);
}

#[tokio::test]
async fn candidate_lists_are_capped_and_say_how_many_wait() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let client = api_client(&daemon, "orchestrator");
    let mut stream = client.open_session().await.unwrap();
    for i in 0..25 {
        fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), &format!("message {i}"));
    }
    for _ in 0..25 {
        let envelope = next_envelope(&mut stream).await;
        client.shown(&envelope.trace_id).await.unwrap();
    }
    let Err(ClientError::Refused { error, .. }) = client.reply(&ReplyRequest::new("which?", None)).await
    else {
        panic!("an ambiguous reply must be refused");
    };
    assert_eq!(error.code, ErrorCode::Ambiguous);
    assert_eq!((error.candidates.len(), error.candidates_total), (20, 25));
    let pending = client.pending().await.unwrap();
    assert_eq!((pending.pending.len(), pending.total), (20, 25));
    assert!(fake.sent_messages().is_empty());
}
