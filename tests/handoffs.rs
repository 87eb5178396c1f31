//! Handoffs between agents (DESIGN.md §9), end to end: the real daemon, the fake Bot API,
//! and a real `switchboard channel` plugin per agent driven by a real MCP client.

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::*;
use support::daemon::*;
use support::mcp::ChannelClient;
use switchboard::agents::api::client::ClientError;
use switchboard::agents::api::wire::{ErrorCode, HandoffRequest};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};
use switchboard::ids::{HandoffId, RequestId};
use switchboard::ledger::{EnvelopeState, HandoffState};

/// The orchestrator's session, the worker's, and one owner message waiting for the
/// orchestrator.
struct Team {
    fake: FakeTelegram,
    daemon: TestDaemon,
    orchestrator: ChannelClient,
    worker: ChannelClient,
    question: String,
}

async fn team(env: &[(&str, &str)]) -> Team {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(&fake.api_url(), "", &default_routes(), env);
    let orchestrator = session(&daemon, "orchestrator").await;
    let worker = session(&daemon, "worker").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "Is staging healthy?");
    let question = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    Team { fake, daemon, orchestrator, worker, question }
}

async fn handoff_state(daemon: &TestDaemon, handoff_id: &str) -> HandoffState {
    let ledger = daemon.ledger().await;
    let state =
        ledger.handoff(&HandoffId::parse(handoff_id).unwrap()).await.unwrap().expect("handoff exists").state;
    ledger.close().await;
    state
}

#[tokio::test]
async fn a_handoff_is_answered_and_one_reply_answers_the_human() {
    let Team { fake, daemon, orchestrator, worker, question } = team(&[]).await;

    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "Check staging health and report"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("delivered to its session") && text.contains(&question), "{text}");

    let handoff = nth(&worker, 1).await;
    assert_eq!(handoff.content, "Check staging health and report");
    assert_eq!(meta(&handoff, "kind"), "handoff");
    assert_eq!(meta(&handoff, "from_agent"), "orchestrator");
    assert_eq!(meta(&handoff, "depth"), "1");
    assert!(handoff.meta_str("chat_id").is_none(), "a handoff has no chat: {:?}", handoff.meta);
    let handoff_id = meta(&handoff, "handoff_id").to_owned();
    assert!(handoff_id.starts_with("hof_"));

    let (is_error, text) = worker.call_tool("reply", json!({"text": "All 12 checks green"})).await.unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("agent 'orchestrator'") && text.contains("nothing was sent to Telegram"), "{text}");
    assert!(fake.sent_messages().is_empty(), "an answer to an agent never reaches Telegram");

    let answer = nth(&orchestrator, 2).await;
    assert_eq!(answer.content, "All 12 checks green");
    assert_eq!(meta(&answer, "kind"), "handoff_answer");
    assert_eq!(meta(&answer, "from_agent"), "worker");
    assert_eq!(meta(&answer, "on_behalf_of"), question);
    assert_eq!(meta(&answer, "handoff_id"), handoff_id);
    assert_eq!(handoff_state(&daemon, &handoff_id).await, HandoffState::Answered);

    // Both the question and the answer wait: an unnamed reply is refused, listing both.
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "Yes"})).await.unwrap();
    assert!(is_error && text.contains(&question) && text.contains(&trace_id(&answer)), "{text}");

    // Naming the answer goes to its conversation, and settles both.
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "Yes, staging is healthy", "trace_id": trace_id(&answer)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].chat_id, OWNER_CHAT);
    assert_eq!(sent[0].text, "Yes, staging is healthy");
    assert_eq!(state_of(&daemon, &question).await, EnvelopeState::Acked);
    assert_eq!(state_of(&daemon, &trace_id(&answer)).await, EnvelopeState::Acked);
    assert_eq!(state_of(&daemon, meta(&handoff, "trace_id")).await, EnvelopeState::Acked);

    let (ok, out, err) = daemon.ledger_cli(&["handoffs"]);
    assert!(
        ok && out.contains(&handoff_id) && out.contains("answered") && out.contains("orchestrator → worker"),
        "{out}{err}"
    );
    let (ok, out, err) = daemon.ledger_cli(&["show", meta(&handoff, "trace_id")]);
    assert!(
        ok && out.contains(&handoff_id) && out.contains(&question) && out.contains(&trace_id(&answer)),
        "{out}{err}"
    );
}

/// A long handoff (a log, a diff) reaches the worker whole. A session stream's line past the
/// plugin's bound ended the stream, and the envelope was pushed again at each reconnect,
/// holding back everything after it.
#[tokio::test]
async fn a_handoff_of_more_than_a_megabyte_reaches_the_worker_whole() {
    // The daemon and the fake are bound so that they live to the end of the test.
    let Team { orchestrator, worker, daemon: _daemon, fake: _fake, .. } = team(&[]).await;
    let long: String = (0..40_000).map(|line| format!("log line {line:05} of a long report\n")).collect();
    assert!(long.len() > 1024 * 1024, "{}", long.len());

    let (is_error, text) =
        orchestrator.call_tool("send_to_agent", json!({"agent": "worker", "text": long})).await.unwrap();
    assert!(!is_error, "{text}");
    let handoff = nth(&worker, 1).await;
    assert!(
        handoff.content.trim_end() == long.trim_end(),
        "whole: {} of {} bytes",
        handoff.content.len(),
        long.len()
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(worker.notifications().len(), 1, "pushed once: the stream was not opened again");
}

#[tokio::test]
async fn call_agent_returns_the_answer_or_says_it_will_come_later() {
    let Team { fake: _fake, daemon, orchestrator, worker, question } = team(&[]).await;
    let orchestrator = std::sync::Arc::new(orchestrator);

    let calling = {
        let orchestrator = std::sync::Arc::clone(&orchestrator);
        tokio::spawn(async move {
            orchestrator.call_tool("call_agent", json!({"agent": "worker", "text": "How many checks?"})).await
        })
    };
    let handoff = nth(&worker, 1).await;
    let (is_error, text) = worker.call_tool("reply", json!({"text": "Twelve"})).await.unwrap();
    assert!(!is_error, "{text}");
    let (is_error, text) = calling.await.unwrap().unwrap();
    assert!(!is_error, "{text}");
    assert!(
        text.contains("'worker' answered:") && text.contains("Twelve") && text.contains(&question),
        "{text}"
    );
    // The answer was the call's result, not a notification (the next notification is the
    // late answer below), and it is handled.
    assert_eq!(orchestrator.notifications().len(), 1, "{:?}", orchestrator.notifications());
    let answered = daemon
        .ledger()
        .await
        .handoff(&HandoffId::parse(meta(&handoff, "handoff_id")).unwrap())
        .await
        .unwrap()
        .unwrap();
    let answer_trace = answered.answer_trace_id.expect("an answer envelope");
    assert_eq!(state_of(&daemon, &answer_trace).await, EnvelopeState::Acked);

    // A call that times out says the answer will come later, and it does, as an envelope.
    let (is_error, text) = orchestrator
        .call_tool(
            "call_agent",
            json!({"agent": "worker", "text": "And the disk usage?", "timeout_secs": 1, "followup": true, "intent": "extends"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("has not answered within 1s") && text.contains("arrive later"), "{text}");
    let second = nth(&worker, 2).await;
    assert_eq!(meta(&second, "followup_of"), meta(&handoff, "handoff_id"));
    assert_eq!(meta(&second, "intent"), "extends");
    worker.call_tool("reply", json!({"text": "40%", "trace_id": trace_id(&second)})).await.unwrap();
    let late = nth(&orchestrator, 2).await;
    assert_eq!(
        (late.content.as_str(), meta(&late, "kind")),
        ("40%", "handoff_answer"),
        "not \"Twelve\" again"
    );

    let (is_error, text) = orchestrator
        .call_tool("call_agent", json!({"agent": "worker", "text": "x", "timeout_secs": 601}))
        .await
        .unwrap();
    assert!(is_error && text.contains("at most") || text.contains("between 1 and 600"), "{text}");
}

/// A worker's `call_agent` back to the orchestrator that waits on it returns at once
/// instead of both waiting on each other until the shorter timeout: the worker is told to
/// answer the orchestrator's handoff first, and that answer ends the orchestrator's wait.
#[tokio::test]
async fn a_call_back_to_an_agent_that_waits_on_the_caller_does_not_wait() {
    let Team { fake: _fake, daemon: _daemon, orchestrator, worker, question: _ } = team(&[]).await;
    let orchestrator = std::sync::Arc::new(orchestrator);
    let calling = {
        let orchestrator = std::sync::Arc::clone(&orchestrator);
        tokio::spawn(async move {
            orchestrator
                .call_tool(
                    "call_agent",
                    json!({"agent": "worker", "text": "Which branch is live?", "timeout_secs": 600}),
                )
                .await
        })
    };
    let handoff = nth(&worker, 1).await;
    let asked_back = worker.call_tool(
        "call_agent",
        json!({"agent": "orchestrator", "text": "Staging or production?", "trace_id": trace_id(&handoff),
               "timeout_secs": 600}),
    );
    let (is_error, text) = tokio::time::timeout(Duration::from_secs(20), asked_back)
        .await
        .expect("the call back returned without waiting")
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("may be waiting on your answer") && text.contains("handoff_answer"), "{text}");
    let (is_error, text) =
        worker.call_tool("reply", json!({"text": "main", "trace_id": trace_id(&handoff)})).await.unwrap();
    assert!(!is_error, "{text}");
    let (is_error, text) =
        tokio::time::timeout(Duration::from_secs(20), calling).await.unwrap().unwrap().unwrap();
    assert!(!is_error && text.contains("'worker' answered:") && text.contains("main"), "{text}");
}

#[tokio::test]
async fn the_first_instruction_stands_and_a_follow_up_passes() {
    let Team { fake: _fake, daemon, orchestrator, worker, question } = team(&[]).await;
    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "schedule it, do NOT publish"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let first = nth(&worker, 1).await;

    // The other tool, another spelling of the name: still the same target, same turn.
    let (is_error, text) = orchestrator
        .call_tool("call_agent", json!({"agent": " Worker ", "text": "publish it NOW", "timeout_secs": 1}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("already_delegated") && text.contains("do NOT publish"), "{text}");
    daemon.wait_for_log("handoff refused", WAIT).await;
    // The refusal quotes the instruction to the model; the logs keep it at debug (DESIGN
    // §12: never a message body above debug).
    for (process, logs) in [("daemon", daemon.logs()), ("plugin", orchestrator.stderr())] {
        let above_debug: Vec<&str> = logs
            .lines()
            .filter(|line| line.contains("do NOT publish"))
            .filter(|line| !line.contains(" DEBUG ") && !line.contains(" TRACE "))
            .collect();
        assert!(above_debug.is_empty(), "the {process} logged the instruction above debug: {above_debug:?}");
    }

    // A string is not a boolean; a follow-up needs an intent.
    for arguments in [
        json!({"agent": "worker", "text": "publish it NOW", "followup": "true", "intent": "replaces"}),
        json!({"agent": "worker", "text": "publish it NOW", "followup": true}),
    ] {
        let (is_error, text) = orchestrator.call_tool("send_to_agent", arguments.clone()).await.unwrap();
        assert!(is_error, "{arguments}: {text}");
    }
    // Nothing refused reached the worker: its next notification is the follow-up below.
    assert_eq!(worker.notifications().len(), 1, "nothing refused reached the worker");

    let (is_error, text) = orchestrator
        .call_tool(
            "send_to_agent",
            json!({"agent": "worker", "text": "publish it NOW", "followup": true, "intent": "replaces"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let follow_up = nth(&worker, 2).await;
    assert_eq!(meta(&follow_up, "followup_of"), meta(&first, "handoff_id"));
    assert_eq!(meta(&follow_up, "intent"), "replaces");

    // A later turn starts fresh for the guard, but the first handoff is still open.
    let owner_chat = ChatSpec::private(OWNER_CHAT);
    let fake2 = _fake;
    fake2.push_text(&owner_chat, owner(), "And production?");
    let next_turn = trace_id(&nth(&orchestrator, 2).await);
    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "check prod", "trace_id": next_turn}))
        .await
        .unwrap();
    // It names the latest open instruction to that agent: the follow-up, which now stands.
    assert!(is_error && text.contains("already_running"), "{text}");
    assert!(text.contains(meta(&follow_up, "handoff_id")) && text.contains("publish it NOW"), "{text}");
    assert_ne!(next_turn, question);
}

/// The user presses Esc while `call_agent` waits for the answer: the handoff was recorded
/// and handed over all the same. The agent's retry is told the handoff it already made,
/// and nothing more is handed over, also after a `kill -9` of the daemon.
#[tokio::test]
async fn a_call_agent_cancelled_after_it_was_recorded_names_its_handoff_on_retry() {
    let Team { fake: _fake, mut daemon, orchestrator, worker, question } = team(&[]).await;
    let call = json!({"agent": "worker", "text": "Check the disks", "timeout_secs": 60});
    let handed_over = async {
        worker.wait_for_notifications(1, WAIT).await.unwrap();
    };
    orchestrator.call_tool_and_cancel("call_agent", call.clone(), handed_over).await.unwrap();
    let handoff_id = meta(&nth(&worker, 1).await, "handoff_id").to_owned();

    let (is_error, text) = orchestrator.call_tool("call_agent", call.clone()).await.unwrap();
    assert!(is_error && text.starts_with("already_delegated: "), "{text}");
    assert!(text.contains(&handoff_id) && text.contains("recorded"), "names the handoff it made: {text}");
    assert!(text.contains("Check the disks"), "{text}");
    let (ok, out, err) = daemon.ledger_cli(&["handoffs"]);
    assert!(ok && out.matches("hof_").count() == 1, "one handoff: {out}{err}");

    // The daemon dies before the next retry: the ledger still names the handoff.
    daemon.kill9();
    daemon.restart();
    let deadline = std::time::Instant::now() + WAIT;
    let text = loop {
        let (is_error, text) = orchestrator.call_tool("call_agent", call.clone()).await.unwrap();
        assert!(is_error, "{text}");
        // Until the plugin's session is back, the call says so and hands nothing over.
        if text.starts_with("already_delegated: ") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "the plugin never got back to the daemon: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(text.contains(&handoff_id), "{text}");
    let (ok, out, err) = daemon.ledger_cli(&["handoffs"]);
    assert!(ok && out.matches("hof_").count() == 1, "still one handoff: {out}{err}");

    // Its answer still comes back, as an envelope for the conversation (after the question
    // and the handoff were redelivered to the sessions that outlived the daemon).
    let handoff = nth(&worker, 2).await;
    assert_eq!((meta(&handoff, "handoff_id"), meta(&handoff, "redelivered")), (handoff_id.as_str(), "true"));
    let (is_error, text) = worker
        .call_tool("reply", json!({"text": "Disks at 40%", "trace_id": trace_id(&handoff)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let delivered = orchestrator.wait_for_notifications(3, WAIT).await.unwrap();
    let answer = delivered.iter().find(|n| meta(n, "kind") == "handoff_answer").expect("the answer");
    assert_eq!(answer.content, "Disks at 40%");
    assert_eq!(meta(answer, "on_behalf_of"), question);
}

#[tokio::test]
async fn refusals_before_the_guard_record_nothing() {
    let Team { fake: _fake, daemon, orchestrator, worker, question: _ } = team(&[]).await;
    for (arguments, code) in [
        (json!({"agent": "ORCHESTRATOR", "text": "me"}), "is you"),
        (json!({"agent": "ghost", "text": "boo"}), "orchestrator, worker"),
        (json!({"agent": "worker", "text": "  "}), "empty"),
    ] {
        let (is_error, text) = orchestrator.call_tool("send_to_agent", arguments.clone()).await.unwrap();
        assert!(is_error && text.contains(code), "{arguments}: {text}");
    }
    let (ok, out, _) = daemon.ledger_cli(&["handoffs"]);
    assert!(ok && out.contains("no handoffs"), "{out}");
    // The corrected call goes through.
    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "now really"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(nth(&worker, 1).await.content, "now really");
}

/// The team with a third agent, `helper`, and `[handoffs] max_depth` at `max_depth`.
struct Chain {
    fake: FakeTelegram,
    daemon: TestDaemon,
    orchestrator: ChannelClient,
    worker: ChannelClient,
    helper: ChannelClient,
}

async fn chain(max_depth: &str) -> Chain {
    let helper_secret = "helper-secret-5555555555";
    let env = [
        ("SWITCHBOARD__AGENTS__HELPER__TOKEN_ENV", "SB_TEST_HELPER_SECRET"),
        ("SB_TEST_HELPER_SECRET", helper_secret),
        ("SWITCHBOARD__HANDOFFS__MAX_DEPTH", max_depth),
    ];
    let Team { fake, daemon, orchestrator, worker, question: _ } = team(&env).await;
    let (address_var, address) = daemon.address_env();
    let mut helper_env = env.to_vec();
    helper_env.push((address_var, &address));
    let helper =
        ChannelClient::start_connected(daemon.config_path(), "helper", &helper_env, WAIT).await.unwrap();
    Chain { fake, daemon, orchestrator, worker, helper }
}

/// `from` hands `text` to `to` on behalf of `cause`; the handoff must be admitted.
async fn hand(from: &ChannelClient, to: &str, text: &str, cause: &str) {
    let (is_error, text) =
        from.call_tool("send_to_agent", json!({"agent": to, "text": text, "trace_id": cause})).await.unwrap();
    assert!(!is_error, "{text}");
}

/// No message went to a chat that is not one (an agent's envelope has chat 0).
fn nothing_sent_to_chat_zero(fake: &FakeTelegram) {
    let to_zero: Vec<_> = fake
        .requests_for("sendMessage")
        .into_iter()
        .filter(|params| params["chat_id"].to_string().trim_matches('"') == "0")
        .collect();
    assert!(to_zero.is_empty(), "sent to chat 0: {to_zero:?}");
}

#[tokio::test]
async fn a_chain_of_handoffs_stops_at_the_depth_limit() {
    let Chain { fake, daemon, orchestrator, worker, helper } = chain("2").await;

    orchestrator.call_tool("send_to_agent", json!({"agent": "worker", "text": "level one"})).await.unwrap();
    let one = nth(&worker, 1).await;
    hand(&worker, "helper", "level two", &trace_id(&one)).await;
    let two = nth(&helper, 1).await;
    assert_eq!(meta(&two, "depth"), "2");
    let (is_error, text) = helper
        .call_tool(
            "send_to_agent",
            json!({"agent": "orchestrator", "text": "level three", "trace_id": trace_id(&two)}),
        )
        .await
        .unwrap();
    assert!(is_error && text.contains("handoffs.max_depth (2)"), "{text}");
    // The helper answers instead; the chain unwinds.
    helper.call_tool("reply", json!({"text": "done at two", "trace_id": trace_id(&two)})).await.unwrap();
    let back = nth(&worker, 2).await;
    assert_eq!((meta(&back, "kind"), back.content.as_str()), ("handoff_answer", "done at two"));
    assert_eq!(meta(&back, "on_behalf_of"), trace_id(&one));

    // The worker's reply to that answer goes to the conversation it was made for: the
    // orchestrator's handoff, which it answers (DESIGN.md §9), not a Telegram chat.
    let (is_error, text) =
        worker.call_tool("reply", json!({"text": "done at one", "trace_id": trace_id(&back)})).await.unwrap();
    assert!(!is_error, "{text}");
    let answer = nth(&orchestrator, 2).await;
    assert_eq!((meta(&answer, "kind"), answer.content.as_str()), ("handoff_answer", "done at one"));
    assert_eq!(meta(&answer, "handoff_id"), meta(&one, "handoff_id"));
    assert_eq!(handoff_state(&daemon, meta(&one, "handoff_id")).await, HandoffState::Answered);
    nothing_sent_to_chat_zero(&fake);
}

/// A reply to an answer whose handoff was made on behalf of an earlier answer goes where
/// that earlier answer's conversation is: here, the orchestrator's handoff.
#[tokio::test]
async fn a_reply_to_an_answer_made_for_an_answer_reaches_the_first_delegator() {
    let Chain { fake, daemon, orchestrator, worker, helper } = chain("3").await;

    orchestrator.call_tool("send_to_agent", json!({"agent": "worker", "text": "level one"})).await.unwrap();
    let one = nth(&worker, 1).await;
    hand(&worker, "helper", "first look", &trace_id(&one)).await;
    helper
        .call_tool("reply", json!({"text": "looked", "trace_id": trace_id(&nth(&helper, 1).await)}))
        .await
        .unwrap();
    let first_answer = nth(&worker, 2).await;
    hand(&worker, "helper", "second look", &trace_id(&first_answer)).await;
    helper
        .call_tool("reply", json!({"text": "looked again", "trace_id": trace_id(&nth(&helper, 2).await)}))
        .await
        .unwrap();
    let second_answer = nth(&worker, 3).await;
    assert_eq!(meta(&second_answer, "on_behalf_of"), trace_id(&first_answer));

    let (is_error, text) = worker
        .call_tool("reply", json!({"text": "all looked at", "trace_id": trace_id(&second_answer)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let answer = nth(&orchestrator, 2).await;
    assert_eq!((meta(&answer, "kind"), answer.content.as_str()), ("handoff_answer", "all looked at"));
    assert_eq!(handoff_state(&daemon, meta(&one, "handoff_id")).await, HandoffState::Answered);
    nothing_sent_to_chat_zero(&fake);
}

/// DESIGN.md §9: a reply to the cause envelope also settles the answers made on its
/// behalf. In a chain the cause is a handoff, and the reply to it is its answer.
#[tokio::test]
async fn answering_a_handoff_settles_the_answers_made_on_its_behalf() {
    let Chain { fake, daemon, orchestrator, worker, helper } = chain("3").await;

    orchestrator.call_tool("send_to_agent", json!({"agent": "worker", "text": "level one"})).await.unwrap();
    let one = nth(&worker, 1).await;
    hand(&worker, "helper", "level two", &trace_id(&one)).await;
    helper
        .call_tool("reply", json!({"text": "done at two", "trace_id": trace_id(&nth(&helper, 1).await)}))
        .await
        .unwrap();
    let back = nth(&worker, 2).await;
    assert_eq!(meta(&back, "on_behalf_of"), trace_id(&one));

    let (is_error, text) =
        worker.call_tool("reply", json!({"text": "done at one", "trace_id": trace_id(&one)})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(nth(&orchestrator, 2).await.content, "done at one");
    assert_eq!(state_of(&daemon, &trace_id(&back)).await, EnvelopeState::Acked, "the answer is settled");
    // Nothing waits: an unnamed reply has nothing to answer.
    let (is_error, text) = worker.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error && !text.contains(&trace_id(&back)), "{text}");
    nothing_sent_to_chat_zero(&fake);
}

/// DESIGN.md §9: only zero pending envelopes make an unprompted handoff. One handed over
/// but not yet confirmed shown (after a reconnect, a retry) is the turn the handoff
/// belongs to: it is refused, like an unnamed reply, instead of skipping the depth limit.
#[tokio::test]
async fn a_handoff_while_an_envelope_is_on_its_way_is_refused_not_unprompted() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        "",
        &default_routes(),
        &[("SWITCHBOARD__HANDOFFS__MAX_DEPTH", "1")],
    );
    let orchestrator = session(&daemon, "orchestrator").await;
    let worker = api_client(&daemon, "worker");
    let mut stream = worker.open_session().await.unwrap();
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "Is staging healthy?");
    nth(&orchestrator, 1).await;
    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "check it"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    // Handed to the worker's session, which has not said it showed it.
    let handoff = next_envelope(&mut stream).await;

    let request = HandoffRequest {
        to: "orchestrator".into(),
        text: "and you check production".into(),
        trace_id: None,
        followup: None,
        intent: None,
        request_id: RequestId::generate().to_string(),
    };
    let refused = worker.handoff(&request).await;
    let Err(ClientError::Refused { error, .. }) = &refused else {
        panic!("a handoff while {} is on its way must be refused: {refused:?}", handoff.trace_id);
    };
    assert_eq!(error.code, ErrorCode::NothingPending, "{}", error.message);
    let (ok, out, err) = daemon.ledger_cli(&["handoffs"]);
    assert!(ok && out.matches("hof_").count() == 1, "nothing recorded: {out}{err}");

    // Once shown, it is the cause, and the depth limit applies.
    worker.shown(&handoff.trace_id).await.unwrap();
    let request = HandoffRequest { request_id: RequestId::generate().to_string(), ..request };
    let refused = worker.handoff(&request).await;
    let Err(ClientError::Refused { error, .. }) = &refused else {
        panic!("beyond the depth limit: {refused:?}");
    };
    assert_eq!(error.code, ErrorCode::DepthLimit, "{}", error.message);
}

/// An answer sits as deep as the turn it answers, also when that turn is another answer:
/// two answers in a row do not start the chain over, so it still stops at the limit.
#[tokio::test]
async fn answers_in_a_row_keep_the_depth_of_the_chain() {
    let Chain { fake: _fake, daemon: _daemon, orchestrator, worker, helper } = chain("2").await;

    orchestrator.call_tool("send_to_agent", json!({"agent": "worker", "text": "level one"})).await.unwrap();
    let one = nth(&worker, 1).await;
    hand(&worker, "helper", "first look", &trace_id(&one)).await;
    let two = nth(&helper, 1).await;
    assert_eq!(meta(&two, "depth"), "2");
    helper.call_tool("reply", json!({"text": "looked", "trace_id": trace_id(&two)})).await.unwrap();
    let first_answer = nth(&worker, 2).await;
    hand(&worker, "helper", "second look", &trace_id(&first_answer)).await;
    let three = nth(&helper, 2).await;
    assert_eq!(meta(&three, "depth"), "2", "an answer at depth 1 hands on at depth 2");
    helper.call_tool("reply", json!({"text": "looked again", "trace_id": trace_id(&three)})).await.unwrap();
    let second_answer = nth(&worker, 3).await;
    hand(&worker, "helper", "third look", &trace_id(&second_answer)).await;
    let four = nth(&helper, 3).await;
    assert_eq!(meta(&four, "depth"), "2", "the second answer in a row is still at depth 1");

    let (is_error, text) = helper
        .call_tool(
            "send_to_agent",
            json!({"agent": "orchestrator", "text": "level three", "trace_id": trace_id(&four)}),
        )
        .await
        .unwrap();
    assert!(is_error && text.contains("depth_limit"), "{text}");
}

#[tokio::test]
async fn a_handoff_waits_for_a_target_that_connects_later_and_survives_kill_9() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "Ask the worker");
    let question = trace_id(&nth(&orchestrator, 1).await);

    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "when you are back"}))
        .await
        .unwrap();
    assert!(!is_error && text.contains("queued until it connects"), "{text}");

    daemon.kill9();
    daemon.restart();
    let worker = session(&daemon, "worker").await;
    let handoff = nth(&worker, 1).await;
    assert_eq!(handoff.content, "when you are back");

    // The delegator goes away; its answer waits for it, across another kill -9.
    assert!(orchestrator.close().await.unwrap().success());
    worker.call_tool("reply", json!({"text": "back and done"})).await.unwrap();
    daemon.kill9();
    daemon.restart();
    assert_eq!(handoff_state(&daemon, meta(&handoff, "handoff_id")).await, HandoffState::Answered);
    let orchestrator = session(&daemon, "orchestrator").await;
    let pushed = orchestrator.wait_for_notifications(2, Duration::from_secs(40)).await.unwrap();
    let answer = pushed.iter().find(|n| meta(n, "kind") == "handoff_answer").expect("the answer arrives");
    assert_eq!(answer.content, "back and done");
    assert_eq!(meta(answer, "on_behalf_of"), question);
}

#[tokio::test]
async fn closing_a_handoff_tells_the_delegator_and_the_audit_route_reads_along() {
    let Team { fake, daemon: _daemon, orchestrator, worker, question: _ } =
        team(&[("SWITCHBOARD__HANDOFFS__AUDIT_ROUTE", "team-group")]).await;
    let (is_error, text) = orchestrator
        .call_tool("send_to_agent", json!({"agent": "worker", "text": "tidy the logs"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let handoff = nth(&worker, 1).await;
    let (is_error, text) = worker
        .call_tool("ack", json!({"trace_id": trace_id(&handoff), "note": "nothing to tidy"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let closed = nth(&orchestrator, 2).await;
    assert_eq!(meta(&closed, "kind"), "handoff_answer");
    assert_eq!(meta(&closed, "closed"), "true");
    assert!(
        closed.content.contains("without an answer") && closed.content.contains("nothing to tidy"),
        "{}",
        closed.content
    );

    let copies = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(copies[0].chat_id, GROUP_CHAT);
    assert_eq!(copies[0].text, "orchestrator → worker: tidy the logs");
    assert!(copies.iter().all(|m| m.chat_id == GROUP_CHAT), "audit copies go to the audit route only");
}
