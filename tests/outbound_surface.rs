//! The outbound message surface (issue 22) end to end: fake Telegram → real daemon → real
//! `switchboard channel` driven by an MCP client → `reply` with a format, `react`,
//! `edit_message` → fake Telegram; and what the daemon does around a waiting message
//! (typing, the command menu).

mod support;

use serde_json::json;
use support::agents::*;
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, UserSpec};
use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};

#[tokio::test]
async fn a_markdown_reply_arrives_as_telegram_html_and_the_receipt_names_its_message() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;

    let (is_error, text) = orchestrator
        .call_tool(
            "reply",
            json!({"trace_id": trace, "format": "markdown", "text": "**done**: `x < y` & [log](https://e.com/l)"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(sent[0].text, "<b>done</b>: <code>x &lt; y</code> &amp; <a href=\"https://e.com/l\">log</a>");
    assert!(text.contains(&sent[0].message_id.to_string()), "the receipt names the message: {text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
}

/// Markdown that renders as nothing (a link without text, a bare link definition) is
/// refused before anything is sent, rather than sent empty and refused by Telegram, and the
/// message still waits for its answer.
#[tokio::test]
async fn a_reply_that_renders_as_nothing_is_refused_before_it_is_sent() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;
    for text in ["[](https://e.com/l)", "[1]: https://e.com/l"] {
        let (is_error, answer) = orchestrator
            .call_tool("reply", json!({"trace_id": trace, "format": "markdown", "text": text}))
            .await
            .unwrap();
        assert!(is_error && answer.starts_with("bad_request"), "{text:?}: {answer}");
    }
    assert!(fake.sent_messages().is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
}

#[tokio::test]
async fn html_telegram_cannot_parse_is_sent_once_more_as_plain_text() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;

    let (is_error, text) = orchestrator
        .call_tool(
            "reply",
            json!({"trace_id": trace, "format": "html", "text": "<b>bold</b> &amp; <blink>this</blink>"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1, "one message reached the chat");
    // `<blink>` is no tag of Telegram's: text, kept as written.
    assert_eq!((sent[0].text.as_str(), sent[0].parse_mode.as_deref()), ("bold & <blink>this</blink>", None));
    let tries = fake.requests_for("sendMessage");
    assert_eq!(tries.len(), 2, "the HTML once, the plain text once: {tries:?}");
    assert_eq!(tries[0]["parse_mode"], "HTML");
    let attempts = attempts_of(&daemon, &trace).await;
    let outcomes: Vec<_> = attempts.iter().map(|a| (a.chunk_index, a.outcome)).collect();
    assert_eq!(outcomes, [(0, AttemptState::NotSent), (0, AttemptState::Sent)]);
    assert!(attempts.iter().all(|a| a.method == AttemptMethod::SendMessage));
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
}

/// A placeholder in angle brackets is what the agent wrote, not markup: when Telegram
/// refuses it as a tag, the plain text that goes instead keeps it.
#[tokio::test]
async fn text_in_angle_brackets_survives_the_plain_text_fallback() {
    let OwnerWaiting { fake, daemon: _daemon, orchestrator, trace } = owner_waiting("how do I get it?").await;

    let html = "Run <code>git clone <url></code> first";
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"trace_id": trace, "format": "html", "text": html}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].text, "Run git clone <url> first", "nothing the agent wrote is lost");
}

#[tokio::test]
async fn an_unknown_format_is_refused_and_nothing_is_sent() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"trace_id": trace, "format": "MarkdownV2", "text": "*hi*"}))
        .await
        .unwrap();
    assert!(is_error && text.contains("MarkdownV2"), "{text}");
    assert!(fake.requests_for("sendMessage").is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
}

/// The message id a reply's receipt names (its last "id N" / "ids N").
fn replied(fake_sent: &[switchboard::fake_bot_api::SentMessage], chat_id: i64) -> i32 {
    fake_sent.iter().rev().find(|sent| sent.chat_id == chat_id).expect("a message in that chat").message_id
}

#[tokio::test]
async fn a_reaction_on_the_envelopes_own_message_is_an_attempt_that_answers_nothing() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("ship it?").await;
    let message_id: i64 = meta(&orchestrator.notifications()[0], "message_id").parse().unwrap();

    let (is_error, text) =
        orchestrator.call_tool("react", json!({"trace_id": trace, "emoji": "👍"})).await.unwrap();
    assert!(!is_error, "{text}");
    let reactions = fake.requests_for("setMessageReaction");
    assert_eq!(reactions.len(), 1);
    assert_eq!(reactions[0]["chat_id"], OWNER_CHAT);
    assert_eq!(reactions[0]["message_id"], message_id);
    assert_eq!(reactions[0]["reaction"][0]["emoji"], "👍");
    let attempts = attempts_of(&daemon, &trace).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!((attempts[0].method, attempts[0].outcome), (AttemptMethod::SetReaction, AttemptState::Sent));
    assert_eq!(attempts[0].target_message_id, Some(message_id));
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending, "a reaction is no answer");
    let (ok, shown, _) = daemon.ledger_cli(&["show", &trace]);
    assert!(ok && shown.contains(&format!("set_reaction of message {message_id}")), "{shown}");
}

#[tokio::test]
async fn a_reaction_telegram_does_not_allow_is_refused_and_nothing_is_sent() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("ship it?").await;

    for emoji in ["🦀", "thumbs up", ""] {
        let (is_error, text) =
            orchestrator.call_tool("react", json!({"trace_id": trace, "emoji": emoji})).await.unwrap();
        assert!(is_error && text.contains("👍"), "refused, naming the allowed ones: {text}");
    }
    // An envelope that is not the agent's is refused too, whatever the emoji.
    let (is_error, text) =
        orchestrator.call_tool("react", json!({"trace_id": "env_nonesuchxx", "emoji": "👍"})).await.unwrap();
    assert!(is_error && text.contains("not one of yours"), "{text}");
    assert!(fake.requests_for("setMessageReaction").is_empty());
    assert!(attempts_of(&daemon, &trace).await.is_empty());
}

#[tokio::test]
async fn a_reaction_on_a_message_of_another_chat_is_refused() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("in the DM").await;
    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), UserSpec::new(7, "Ivan"), "in the forum");
    let forum = trace_id(&orchestrator.wait_for_notifications(2, WAIT).await.unwrap()[1]);
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": forum, "text": "forum answer"})).await.unwrap();
    assert!(!is_error, "{text}");
    let in_forum = replied(&fake.wait_for_sent(1, WAIT).await, FORUM_CHAT);

    // The bot's message in the forum is no message of the DM's conversation.
    let (is_error, text) = orchestrator
        .call_tool("react", json!({"trace_id": trace, "emoji": "🎉", "message_id": in_forum}))
        .await
        .unwrap();
    assert!(is_error && text.contains(&in_forum.to_string()), "{text}");
    assert!(fake.requests_for("setMessageReaction").is_empty());
    // In its own conversation it is one.
    let (is_error, text) = orchestrator
        .call_tool("react", json!({"trace_id": forum, "emoji": "🎉", "message_id": in_forum}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.requests_for("setMessageReaction")[0]["message_id"], in_forum);
    assert!(attempts_of(&daemon, &trace).await.is_empty());
}

/// The official plugin's `react` and `edit_message` name a message by chat_id and
/// message_id, as strings, with no trace_id: taken the same way, within the conversations
/// this session was shown, and never reaching another chat.
#[tokio::test]
async fn a_message_named_by_chat_and_message_id_as_the_official_plugin_does_is_acted_on() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("in the DM").await;
    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), UserSpec::new(7, "Ivan"), "in the forum");
    let shown = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let (dm_message, forum) = (meta(&shown[0], "message_id"), trace_id(&shown[1]));

    let (is_error, text) = orchestrator
        .call_tool(
            "react",
            json!({"chat_id": OWNER_CHAT.to_string(), "message_id": dm_message, "emoji": "👍"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let reactions = fake.requests_for("setMessageReaction");
    assert_eq!(reactions[0]["chat_id"], OWNER_CHAT);
    assert_eq!(reactions[0]["message_id"].to_string(), dm_message);
    assert_eq!(attempts_of(&daemon, &trace).await.len(), 1, "made for the DM's envelope");

    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": forum, "text": "working on it"})).await.unwrap();
    assert!(!is_error, "{text}");
    let in_forum = replied(&fake.wait_for_sent(1, WAIT).await, FORUM_CHAT);
    let (is_error, text) = orchestrator
        .call_tool(
            "edit_message",
            json!({"chat_id": FORUM_CHAT.to_string(), "message_id": in_forum.to_string(), "text": "done"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.sent_message(in_forum).unwrap().text, "done");

    // Never another chat: the forum's message named in the DM, a chat this session was
    // never shown, and a trace_id of one chat with the chat_id of another.
    for refused in [
        json!({"chat_id": OWNER_CHAT, "message_id": in_forum, "emoji": "🎉"}),
        json!({"chat_id": 42_424_242, "message_id": 1, "emoji": "🎉"}),
        json!({"trace_id": trace, "chat_id": FORUM_CHAT, "emoji": "🎉"}),
        json!({"emoji": "🎉"}),
    ] {
        let (is_error, text) = orchestrator.call_tool("react", refused.clone()).await.unwrap();
        assert!(is_error && text.to_lowercase().contains("nothing was sent"), "{refused}: {text}");
    }
    assert_eq!(fake.requests_for("setMessageReaction").len(), 1, "nothing more was sent");
    let (is_error, text) = orchestrator
        .call_tool("edit_message", json!({"chat_id": OWNER_CHAT, "message_id": in_forum, "text": "x"}))
        .await
        .unwrap();
    assert!(is_error, "the forum's message is not in the DM: {text}");
    assert_eq!(fake.sent_message(in_forum).unwrap().text, "done");
}

#[tokio::test]
async fn the_bots_own_reply_can_be_edited_for_progress() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("build it").await;
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"trace_id": trace, "text": "working on it… step 1 of 2"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let progress = replied(&fake.wait_for_sent(1, WAIT).await, OWNER_CHAT);
    assert!(text.contains(&progress.to_string()), "the receipt names the message to edit: {text}");

    let (is_error, text) = orchestrator
        .call_tool(
            "edit_message",
            // The official plugin's schema gives message_id as a string: taken as well.
            json!({"trace_id": trace, "message_id": progress.to_string(), "text": "working on it… **step 2** of 2", "format": "markdown"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let edited = fake.sent_message(progress).unwrap();
    assert_eq!(
        (edited.text.as_str(), edited.parse_mode.as_deref()),
        ("working on it… <b>step 2</b> of 2", Some("HTML"))
    );
    assert_eq!(fake.sent_messages().len(), 1, "an edit posts nothing new");
    let (is_error, text) = orchestrator
        .call_tool("edit_message", json!({"trace_id": trace, "message_id": "the progress one", "text": "x"}))
        .await
        .unwrap();
    assert!(is_error && text.starts_with("bad_request") && text.contains("message_id"), "{text}");
    let attempts = attempts_of(&daemon, &trace).await;
    let methods: Vec<_> = attempts.iter().map(|a| (a.method, a.outcome, a.target_message_id)).collect();
    assert_eq!(
        methods,
        [
            (AttemptMethod::SendMessage, AttemptState::Sent, None),
            (AttemptMethod::EditMessage, AttemptState::Sent, Some(i64::from(progress)))
        ]
    );
}

#[tokio::test]
async fn a_message_the_bot_did_not_send_for_this_agent_cannot_be_edited() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    let worker = session(&daemon, "worker").await;
    let forum = ChatSpec::forum(FORUM_CHAT, "Ops forum");
    // The worker answers in its topic of the forum; the orchestrator has the forum's other messages.
    fake.push_topic_text(&forum, OPS_TOPIC, UserSpec::new(7, "Ivan"), "for the worker");
    let for_worker = trace_id(&worker.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    let (is_error, text) =
        worker.call_tool("reply", json!({"trace_id": for_worker, "text": "worker's answer"})).await.unwrap();
    assert!(!is_error, "{text}");
    let workers_message = replied(&fake.wait_for_sent(1, WAIT).await, FORUM_CHAT);
    fake.push_text(&forum, UserSpec::new(7, "Ivan"), "for the orchestrator");
    let notified = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let for_orchestrator = trace_id(&notified[0]);
    let users_message: i64 = meta(&notified[0], "message_id").parse().unwrap();

    for (message_id, why) in [(i64::from(workers_message), "worker"), (users_message, "no message")] {
        let (is_error, text) = orchestrator
            .call_tool(
                "edit_message",
                json!({"trace_id": for_orchestrator, "message_id": message_id, "text": "mine now"}),
            )
            .await
            .unwrap();
        assert!(is_error && text.contains(why) && text.contains(&message_id.to_string()), "{text}");
    }
    assert!(fake.requests_for("editMessageText").is_empty());
    assert_eq!(fake.sent_message(workers_message).unwrap().text, "worker's answer");
    assert!(attempts_of(&daemon, &for_orchestrator).await.is_empty());
}

#[tokio::test]
async fn a_cancelled_task_refuses_reactions_and_edits() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("long job").await;
    // A second message keeps the task open once the first is answered.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "and one more thing");
    orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": trace, "text": "started"})).await.unwrap();
    assert!(!is_error, "{text}");
    let progress = replied(&fake.wait_for_sent(1, WAIT).await, OWNER_CHAT);
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "/cancel");
    // The cancel reaches the agent as a revision envelope.
    let cancel = orchestrator.wait_for_notifications(3, WAIT).await.unwrap().remove(2);
    assert_eq!(cancel.meta_str("change"), Some("cancel"), "{:?}", cancel.meta);
    let requests_before = fake.requests_seen().len();

    let (is_error, text) =
        orchestrator.call_tool("react", json!({"trace_id": trace, "emoji": "👍"})).await.unwrap();
    assert!(is_error && text.starts_with("cancelled"), "{text}");
    let (is_error, text) = orchestrator
        .call_tool(
            "edit_message",
            json!({"trace_id": trace, "message_id": progress, "text": "done after all"}),
        )
        .await
        .unwrap();
    assert!(is_error && text.starts_with("cancelled"), "{text}");
    let after: Vec<String> = fake.requests_seen()[requests_before..].iter().map(|(m, _)| m.clone()).collect();
    assert!(!after.iter().any(|m| m == "setmessagereaction" || m == "editmessagetext"), "{after:?}");
    assert_eq!(attempts_of(&daemon, &trace).await.len(), 1, "only the reply");
}

/// The sendChatAction calls made to `chat_id` so far.
fn typing_in(fake: &FakeTelegram, chat_id: i64) -> usize {
    fake.requests_for("sendChatAction").iter().filter(|params| params["chat_id"] == chat_id).count()
}

#[tokio::test]
async fn a_chat_shows_typing_while_its_shown_message_waits_and_stops_after_the_reply() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("think hard").await;
    // Handed to the session (and pushed into it), the chat types before any tool call.
    fake.wait_for_requests("sendChatAction", 1, WAIT).await;
    let action = &fake.requests_for("sendChatAction")[0];
    assert_eq!((action["chat_id"].as_i64(), action["action"].as_str()), (Some(OWNER_CHAT), Some("typing")));
    assert_eq!(fake.sent_messages().len(), 0, "a chat action posts nothing");
    assert!(attempts_of(&daemon, &trace).await.is_empty(), "and is no attempt");

    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": trace, "text": "done"})).await.unwrap();
    assert!(!is_error, "{text}");
    daemon.wait_for_log(&format!("typing stopped chat_id={OWNER_CHAT}"), WAIT).await;
    let typed = typing_in(&fake, OWNER_CHAT);
    // The loop goes on for other chats, and the answered one is no longer among them. The
    // forum's second action comes from a round that began after the first one's ended:
    // anything that round sent to the answered chat would have arrived by then.
    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), UserSpec::new(7, "Ivan"), "and here?");
    orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    eventually(WAIT, "the forum shows typing", || typing_in(&fake, FORUM_CHAT) >= 2).await;
    assert_eq!(typing_in(&fake, OWNER_CHAT), typed, "no typing in the answered chat");
}

/// A `429` answered to a chat action holds the chat for every send, as a send's own does:
/// the reply that follows waits out Telegram's `retry_after` instead of drawing another.
#[tokio::test]
async fn a_429_on_typing_holds_the_chat_for_the_reply() {
    let fake = FakeTelegram::start().await;
    fake.fail_method("sendChatAction", Fault::TooManyRequests { retry_after: 3 });
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "think hard");
    let shown = nth(&orchestrator, 1).await;
    fake.wait_for_requests("sendChatAction", 1, WAIT).await;
    let refused_at = std::time::Instant::now();
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": trace_id(&shown), "text": "done"})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    let waited = sent[0].received_at.duration_since(refused_at);
    assert!(waited >= std::time::Duration::from_millis(2_500), "sent {waited:?} after the 429 asked for 3 s");
}

#[tokio::test]
async fn typing_off_sends_no_chat_action_and_the_command_menu_is_registered() {
    let fake = FakeTelegram::start().await;
    let config = format!("[outbound]\ntyping = false\n{}", default_routes());
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &config, &[]);
    daemon.wait_for_log("typing indicator off", WAIT).await;
    fake.wait_for_requests("setMyCommands", 1, WAIT).await;
    let registered = &fake.requests_for("setMyCommands")[0]["commands"];
    let commands: Vec<&str> =
        registered.as_array().unwrap().iter().map(|c| c["command"].as_str().unwrap()).collect();
    assert_eq!(commands, ["status", "stop", "cancel", "pause", "resume", "new"]);
    assert!(registered.as_array().unwrap().iter().all(|c| !c["description"].as_str().unwrap().is_empty()));

    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "quietly");
    let trace = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    orchestrator.call_tool("pending", json!({})).await.unwrap();
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": trace, "text": "ok"})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;
    assert!(fake.requests_for("sendChatAction").is_empty());
}

#[tokio::test]
async fn the_ack_reaction_is_set_once_per_message_across_redeliveries() {
    let fake = FakeTelegram::start().await;
    let config = format!("[outbound]\nack_reaction = \"👀\"\n{}", default_routes());
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &config, &[]);
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "seen?");
    let first = orchestrator.wait_for_notifications(1, WAIT).await.unwrap().remove(0);
    let trace = trace_id(&first);
    fake.wait_for_requests("setMessageReaction", 1, WAIT).await;
    let reaction = &fake.requests_for("setMessageReaction")[0];
    assert_eq!(reaction["chat_id"], OWNER_CHAT);
    assert_eq!(reaction["message_id"], meta(&first, "message_id").parse::<i64>().unwrap());
    assert_eq!(reaction["reaction"][0]["emoji"], "👀");

    // The next session gets the unanswered message again, and no second reaction.
    orchestrator.close().await.unwrap();
    let again = session(&daemon, "orchestrator").await;
    let redelivered = again.wait_for_notifications(1, WAIT).await.unwrap().remove(0);
    assert_eq!((trace_id(&redelivered), redelivered.meta_str("redelivered")), (trace.clone(), Some("true")));
    daemon.wait_for_log("ack reaction already made", WAIT).await;
    assert_eq!(fake.requests_for("setMessageReaction").len(), 1);
    // It acknowledged the message; it did not answer it.
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
    let attempts = attempts_of(&daemon, &trace).await;
    assert_eq!(attempts.iter().map(|a| a.method).collect::<Vec<_>>(), [AttemptMethod::SetReaction]);
}

#[tokio::test]
async fn typing_ends_after_typing_max_secs_and_failing_chat_actions_or_menus_are_no_error() {
    let fake = FakeTelegram::start().await;
    fake.fail_method("setMyCommands", Fault::ServerError);
    fake.fail_method("sendChatAction", Fault::Forbidden("Forbidden: bot was kicked".into()));
    let config = format!("[outbound]\ntyping_max_secs = 1\n{}", default_routes());
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &config, &[]);
    daemon.wait_for_log("could not register the bot's commands", WAIT).await;
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "take your time");
    let trace = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    daemon.wait_for_log("sendChatAction failed; ignored", WAIT).await;
    // Past typing_max_secs the chat stops typing, and the message still waits.
    daemon.wait_for_log(&format!("typing stopped chat_id={OWNER_CHAT}"), WAIT).await;
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
    let typed = typing_in(&fake, OWNER_CHAT);
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"trace_id": trace, "text": "done"})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;
    assert_eq!(typing_in(&fake, OWNER_CHAT), typed, "no typing after typing_max_secs");
}
