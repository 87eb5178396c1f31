//! The permission relay (DESIGN.md §15), end to end: a real daemon against the fake Bot API
//! and a real `switchboard channel` driven by the MCP test client, which sends Claude
//! Code's `notifications/claude/channel/permission_request` and watches for
//! `notifications/claude/channel/permission`.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, SentMessage, UserSpec};
use switchboard::ledger::{AttemptState, PermissionState, StoredPermission};

use support::agents::{WAIT, nth, owner, plugin_builder, session};
use support::daemon::{OWNER_CHAT, OWNER_ID, TestDaemon, default_routes, get};
use support::mcp::{ChannelClient, ChannelNotification};
use support::proxy::CuttableProxy;

const REQUEST_METHOD: &str = "notifications/claude/channel/permission_request";
const VERDICT_METHOD: &str = "notifications/claude/channel/permission";
const PERMISSION_CAPABILITY: &str = "claude/channel/permission";

/// The orchestrator's approvals go to the owner's DM, and the owner answers them.
fn relayed(timeout_secs: u64) -> String {
    format!(
        "{}\n[agents.orchestrator.permissions]\nroute = \"owner-dm\"\napprovers = [{OWNER_ID}]\ntimeout_secs = {timeout_secs}\n",
        default_routes()
    )
}

fn stranger() -> UserSpec {
    UserSpec::new(999_001, "Mallory").with_username("mallory")
}

struct Relay {
    fake: FakeTelegram,
    daemon: TestDaemon,
    plugin: ChannelClient,
}

async fn relay(timeout_secs: u64) -> Relay {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &relayed(timeout_secs), &[]);
    let plugin = session(&daemon, "orchestrator").await;
    Relay { fake, daemon, plugin }
}

/// What Claude Code sends for a tool call that needs approval.
async fn ask(plugin: &ChannelClient, request_id: &str) {
    let params = json!({
        "request_id": request_id,
        "tool_name": "Bash",
        "description": "List the files in <src> & count them",
        "input_preview": "{\"command\":\"ls -la src | wc -l\"}",
    });
    plugin.send_notification(REQUEST_METHOD, params).await.unwrap();
}

/// The prompt the bot posted: the one message with buttons.
async fn prompt(fake: &FakeTelegram) -> SentMessage {
    fake.wait_for_sent_matching(WAIT, |sent| !sent.callback_data().is_empty())
        .await
        .expect("a prompt is posted")
}

/// The button's data whose action letter is `action` (`a`, `d`, `m`).
fn button(prompt: &SentMessage, action: char) -> String {
    let data = prompt.callback_data();
    data.into_iter().find(|data| data.ends_with(&format!(":{action}"))).expect("the prompt has that button")
}

async fn request(daemon: &TestDaemon, request_id: &str) -> Option<StoredPermission> {
    let ledger = daemon.ledger().await;
    let rows = ledger.list_permissions(100).await.unwrap();
    ledger.close().await;
    rows.into_iter().find(|row| row.request_id == request_id)
}

/// Waits until the request's row satisfies `done`.
async fn wait_for_request(
    daemon: &TestDaemon,
    request_id: &str,
    done: impl Fn(&StoredPermission) -> bool,
) -> StoredPermission {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(row) = request(daemon, request_id).await
            && done(&row)
        {
            return row;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "request {request_id} is {:?}\n{}",
            request(daemon, request_id).await,
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn verdicts(plugin: &ChannelClient) -> Vec<Value> {
    plugin.notifications_named(VERDICT_METHOD).into_iter().map(|n| n.params.unwrap_or(Value::Null)).collect()
}

async fn press(fake: &FakeTelegram, who: &UserSpec, prompt: &SentMessage, data: &str) -> Option<String> {
    let (_, query) = fake.push_callback_query(who, prompt, data);
    fake.wait_for_callback_answer(&query, WAIT).await.text
}

#[tokio::test]
async fn an_approvers_allow_reaches_the_asking_session_and_the_prompt_shows_who_and_when() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    assert!(plugin.capabilities().experimental.unwrap().contains_key(PERMISSION_CAPABILITY));
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    assert_eq!(prompt.chat_id, OWNER_CHAT);
    assert_eq!(prompt.parse_mode.as_deref(), Some("HTML"));
    assert!(
        prompt.text.contains("Bash") && prompt.text.contains("&lt;src&gt; &amp; count"),
        "{}",
        prompt.text
    );
    // The buttons carry the switchboard's opaque id, never the request itself. (Not "ls"
    // alone: a random id holds those two letters about once in seventy.)
    let data = prompt.callback_data();
    assert_eq!(data.len(), 3);
    for data in &data {
        assert!(data.len() <= 64 && !data.contains("abcde") && !data.contains("ls -la"), "{data}");
    }
    // The prompt reaches the chat a moment before the daemon records that it did.
    let row = wait_for_request(&daemon, "abcde", |row| row.prompt_send != AttemptState::InFlight).await;
    assert_eq!(
        (row.state, row.prompt_send, row.prompt_message_id),
        (PermissionState::Pending, AttemptState::Sent, Some(prompt.message_id))
    );

    // More shows the whole request, pretty-printed, and keeps the buttons.
    press(&fake, &owner(), &prompt, &button(&prompt, 'm')).await;
    let more = fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_some()).await;
    assert!(more.text.as_deref().unwrap().contains("\n  \"command\""), "{more:?}");

    let answer = press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    assert!(answer.is_some_and(|text| text.contains("Allowed")));
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    let edit = fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;
    let text = edit.text.unwrap();
    assert!(text.contains("Allowed") && text.contains("@olga") && text.contains("UTC"), "{text}");
    let row = wait_for_request(&daemon, "abcde", |row| row.verdict_sent_at.is_some()).await;
    assert_eq!((row.state, row.answered_by), (PermissionState::Allowed, Some(OWNER_ID)));

    let (ok, listing, _) = daemon.ledger_cli(&["permissions"]);
    assert!(ok && listing.contains(&row.id) && listing.contains("allowed"), "{listing}");
    let (_, metrics) = get(&daemon, "/metrics").await;
    // Whatever other labels the series carries (a replica's name, on PostgreSQL).
    let allowed = |line: &str| {
        line.starts_with("switchboard_permission_requests{")
            && line.contains("state=\"allowed\"")
            && line.ends_with("} 1")
    };
    assert!(metrics.lines().any(allowed), "{metrics}");
}

#[tokio::test]
async fn a_deny_reaches_the_asking_session() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "fghij").await;
    let prompt = prompt(&fake).await;
    press(&fake, &owner(), &prompt, &button(&prompt, 'd')).await;
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "fghij", "behavior": "deny"})));
    let edit = fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;
    assert!(edit.text.unwrap().contains("Denied"));
    assert_eq!(request(&daemon, "fghij").await.unwrap().state, PermissionState::Denied);
}

/// The ledger cannot record an approver's Allow (another process holds its write lock past
/// the daemon's wait for it): the approver is told to try again, the request stays pending,
/// and the same press once the ledger is free records the verdict. Before, the approver was
/// told the request was already answered or had expired, and it waited for its timeout.
#[tokio::test]
async fn a_press_the_ledger_could_not_record_asks_to_try_again_and_a_later_press_records_it() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    // On SQLite a lock taken before the press would hold up the poller's record of the
    // press as well. So More and Allow come in one batch, handled in order, and Telegram
    // holds More's edit a moment: the lock is taken meanwhile, after the batch's record and
    // before the Allow's.
    fake.fail_method("editMessageText", Fault::RecordThenHang(Duration::from_secs(1)));
    fake.push_callback_query(&owner(), &prompt, &button(&prompt, 'm'));
    let (_, allow) = fake.push_callback_query(&owner(), &prompt, &button(&prompt, 'a'));
    fake.wait_for_requests("editMessageText", 1, WAIT).await;
    let holder = daemon.hold_permissions_lock();
    let answer = fake.wait_for_callback_answer(&allow, WAIT).await.text;
    holder.release();
    assert!(answer.as_deref().is_some_and(|text| text.contains("try again")), "{answer:?}");
    let row = request(&daemon, "abcde").await.unwrap();
    assert_eq!((row.state, row.answered_by), (PermissionState::Pending, None));

    let again = press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    assert!(again.is_some_and(|text| text.contains("Allowed")));
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    assert_eq!(verdicts(&plugin).len(), 1);
}

/// Telegram takes an approver's More late, after the Allow pressed meanwhile was recorded
/// and the prompt edited to show it: the prompt ends showing the verdict, without buttons.
/// Before, the late More edit brought the buttons back onto the decided prompt.
#[tokio::test]
async fn a_more_that_lands_after_the_verdict_leaves_the_prompt_decided_without_buttons() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    // Within the daemon's send timeout (2 s here): the More edit goes through, late.
    fake.fail_method("editMessageText", Fault::WaitThenPerform(Duration::from_secs(1)));
    fake.push_callback_query(&owner(), &prompt, &button(&prompt, 'm'));
    fake.wait_for_requests("editMessageText", 1, WAIT).await;
    let answer = press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    assert!(answer.is_some_and(|text| text.contains("Allowed")));
    plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;

    // The More edit lands (with its buttons), and the prompt is edited to its end after it.
    let ended_after_more = || {
        let edits = fake.edits_of(prompt.message_id);
        let more = edits.iter().rposition(|edit| edit.reply_markup.is_some());
        more.is_some_and(|more| edits[more..].last().is_some_and(|last| last.reply_markup.is_none()))
    };
    let deadline = std::time::Instant::now() + WAIT;
    while !ended_after_more() {
        assert!(
            std::time::Instant::now() < deadline,
            "the prompt is not edited to its end after More: {:?}\n{}",
            fake.edits_of(prompt.message_id)
                .iter()
                .map(|e| (e.reply_markup.is_some(), e.text.clone()))
                .collect::<Vec<_>>(),
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = fake.edits_of(prompt.message_id).pop().unwrap();
    assert!(last.text.is_some_and(|text| text.contains("Allowed")));
}

#[tokio::test]
async fn a_press_by_anyone_but_an_approver_changes_nothing() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    let answer = press(&fake, &stranger(), &prompt, &button(&prompt, 'a')).await;
    assert!(answer.is_some_and(|text| text.contains("approver")));
    let more = press(&fake, &stranger(), &prompt, &button(&prompt, 'm')).await;
    assert!(more.is_some_and(|text| text.contains("approver")), "More is for approvers too");
    assert!(fake.edits_of(prompt.message_id).is_empty());
    let row = request(&daemon, "abcde").await.unwrap();
    assert_eq!((row.state, row.answered_by), (PermissionState::Pending, None));

    // Still the approver's to answer.
    press(&fake, &owner(), &prompt, &button(&prompt, 'd')).await;
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params.as_ref().unwrap()["behavior"], "deny");
}

#[tokio::test]
async fn forged_and_stale_callback_data_change_nothing() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    let real = button(&prompt, 'a');
    let forged = [
        "sbp:prm_AAAAAAAAAAAAAAAA:a".to_owned(), // no such request
        "garbage".to_owned(),
        real.replace(":a", ":x"),
        format!("{real}:extra"),
    ];
    for data in &forged {
        let answer = press(&fake, &owner(), &prompt, data).await;
        assert!(answer.is_some_and(|text| text.contains("nothing changed")), "{data}");
    }
    // The right data on a message in another chat is not that request's.
    let elsewhere = SentMessage { chat_id: OWNER_CHAT + 1, ..prompt.clone() };
    let answer = press(&fake, &owner(), &elsewhere, &real).await;
    assert!(answer.is_some_and(|text| text.contains("no permission request")));
    assert!(fake.edits_of(prompt.message_id).is_empty());
    assert_eq!(request(&daemon, "abcde").await.unwrap().state, PermissionState::Pending);
    assert!(verdicts(&plugin).is_empty());
}

#[tokio::test]
async fn a_second_press_changes_nothing() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    let second = press(&fake, &owner(), &prompt, &button(&prompt, 'd')).await;
    assert!(second.is_some_and(|text| text.contains("already answered")));
    // The second press is answered once its handling is over: it recorded nothing, so
    // nothing more can go to the plugin.
    let row = request(&daemon, "abcde").await.unwrap();
    assert_eq!(row.state, PermissionState::Allowed);
    assert_eq!(verdicts(&plugin), [json!({"request_id": "abcde", "behavior": "allow"})]);
}

#[tokio::test]
async fn an_unanswered_request_expires_and_a_late_press_does_nothing() {
    // A one-second timeout: this test is about a real duration.
    let Relay { fake, daemon, plugin } = relay(1).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    let edit = fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;
    assert!(edit.text.unwrap().contains("answer at the terminal"));
    let row = request(&daemon, "abcde").await.unwrap();
    assert_eq!((row.state, row.expired_because.as_deref()), (PermissionState::Expired, Some("timeout")));
    let late = press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    assert!(late.is_some_and(|text| text.contains("expired")));
    assert_eq!(request(&daemon, "abcde").await.unwrap().state, PermissionState::Expired);
    assert!(verdicts(&plugin).is_empty());
}

#[tokio::test]
async fn the_asking_session_ending_expires_its_requests_and_a_new_session_never_gets_the_verdict() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    plugin.close().await.unwrap();
    let edit = fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;
    assert!(edit.text.unwrap().contains("Expired"));
    let row = request(&daemon, "abcde").await.unwrap();
    assert_eq!(
        (row.state, row.expired_because.as_deref()),
        (PermissionState::Expired, Some("session_ended"))
    );

    let next = session(&daemon, "orchestrator").await;
    let late = press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    assert!(late.is_some_and(|text| text.contains("nothing changed")));
    // Only an allowed or denied request has a verdict to hand over, and this one is expired
    // for good: a marker message on the same session stream, delivered after, shows the
    // stream went on without one.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "marker");
    assert_eq!(nth(&next, 1).await.content, "marker");
    assert!(verdicts(&next).is_empty());
}

/// A relay whose plugin reaches the daemon through a [`CuttableProxy`], once its request
/// `abcde` was prompted.
async fn asked_through_a_proxy() -> (Relay, CuttableProxy, SentMessage) {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &relayed(600), &[]);
    let proxy = CuttableProxy::to(daemon.api_addr()).await;
    let (address_var, _) = daemon.address_env();
    let plugin = plugin_builder(&daemon, "orchestrator")
        .env(address_var, proxy.addr.to_string())
        .start()
        .await
        .unwrap();
    plugin.wait_for_stderr("channel::forwarder: connected to the switchboard daemon", WAIT).await.unwrap();
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    (Relay { fake, daemon, plugin }, proxy, prompt)
}

/// The asking plugin's connection breaks (a network blip) and it connects again: its
/// request still waits, and the approver's answer reaches it. Before, the request expired
/// the moment the stream broke, while the agent still waited at its prompt.
#[tokio::test]
async fn a_request_outlives_its_plugins_broken_connection_and_the_answer_reaches_it() {
    let (Relay { fake, daemon, plugin }, proxy, prompt) = asked_through_a_proxy().await;

    proxy.cut();
    plugin.wait_for_stderr("connected to the switchboard daemon again", WAIT).await.unwrap();
    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    assert_eq!(request(&daemon, "abcde").await.unwrap().state, PermissionState::Allowed);
}

/// The verdict is written into the asking plugin's stream while that connection is dead
/// without a word (its bytes wait in a buffer nobody reads). The daemon's write succeeds,
/// but the verdict is owed until the plugin confirms it handed it to Claude Code: the
/// plugin's next stream carries it, and Claude Code is given it once. Before, a verdict
/// counted as handed once written, and Claude Code waited at its prompt for good while the
/// prompt in Telegram said "Allowed".
#[tokio::test]
async fn a_verdict_written_into_a_dead_connection_reaches_the_plugin_on_its_next_stream() {
    let (Relay { fake, daemon, plugin }, proxy, prompt) = asked_through_a_proxy().await;

    proxy.stall();
    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    let written = wait_for_request(&daemon, "abcde", |row| row.verdict_sent_at.is_some()).await;
    assert_eq!(written.verdict_handed_at, None, "nothing reached the plugin");
    assert!(verdicts(&plugin).is_empty());

    proxy.cut();
    plugin.wait_for_stderr("connected to the switchboard daemon again", WAIT).await.unwrap();
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    wait_for_request(&daemon, "abcde", |row| row.verdict_handed_at.is_some()).await;
    // Once confirmed, no later stream carries it again.
    proxy.cut();
    plugin.wait_for_stderr_count("connected to the switchboard daemon again", 2, WAIT).await.unwrap();
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "marker");
    nth(&plugin, 1).await;
    assert_eq!(verdicts(&plugin).len(), 1, "Claude Code was given the verdict once");
}

#[tokio::test]
async fn an_answer_after_the_daemon_was_killed_still_reaches_the_plugin_that_asked() {
    let Relay { fake, mut daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    daemon.kill9();
    daemon.restart();
    plugin.wait_for_stderr("connected to the switchboard daemon again", WAIT).await.unwrap();
    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    // The prompt was posted once, before the kill.
    let prompts: Vec<_> =
        fake.sent_messages().into_iter().filter(|m| !m.callback_data().is_empty()).collect();
    assert_eq!(prompts.len(), 1);
    assert_eq!(request(&daemon, "abcde").await.unwrap().state, PermissionState::Allowed);
}

#[tokio::test]
async fn a_prompt_that_cannot_be_posted_expires_its_request_and_the_plugin_is_told() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot was blocked by the user".into()));
    ask(&plugin, "abcde").await;
    let row = wait_for_request(&daemon, "abcde", |row| row.prompt_send != AttemptState::InFlight).await;
    assert_eq!((row.state, row.prompt_send), (PermissionState::Expired, AttemptState::NotSent));
    assert!(row.prompt_error.as_deref().unwrap().contains("blocked"));
    plugin.wait_for_stderr("could not post the permission prompt", WAIT).await.unwrap();
    // The plugin and its tools carry on; the terminal is where this one is answered.
    let (is_error, _) = plugin.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error);
    assert!(fake.sent_messages().is_empty());
}

/// The daemon's ledger is locked past its wait when the plugin relays a request, so the
/// daemon fails it (500, "try again in a moment"): the plugin asks again, and the prompt is
/// posted once the lock is gone, once. Before, the plugin gave up at the first failure and
/// only the terminal asked.
#[tokio::test]
async fn a_request_the_daemon_failed_to_record_is_relayed_again_and_prompted_once() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    let holder = daemon.hold_permissions_lock();
    ask(&plugin, "abcde").await;
    // The daemon waits 10 s for the lock, then tells the plugin its ledger failed.
    let failed = |line: &str| line.contains("abcde") && line.contains("locked by another connection");
    support::daemon::eventually(Duration::from_secs(30), "the daemon fails the request", || {
        plugin.stderr().lines().any(failed)
    })
    .await;
    assert!(fake.sent_messages().is_empty());
    holder.release();

    let prompt = prompt(&fake).await;
    assert!(prompt.text.contains("Bash"), "{}", prompt.text);
    let row = wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    assert_eq!((row.state, row.prompt_message_id), (PermissionState::Pending, Some(prompt.message_id)));
    plugin.wait_for_stderr("permission request relayed", WAIT).await.unwrap();
    let prompts = fake.sent_messages().into_iter().filter(|m| !m.callback_data().is_empty()).count();
    assert_eq!(prompts, 1, "asked again, prompted once");
    let ledger = daemon.ledger().await;
    let rows = ledger.list_permissions(100).await.unwrap();
    ledger.close().await;
    assert_eq!(rows.iter().filter(|row| row.request_id == "abcde").count(), 1, "recorded once");

    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
}

#[tokio::test]
async fn a_text_answer_is_a_verdict_and_words_shaped_like_one_are_a_message() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    prompt(&fake).await;
    // "yes merge" has the shape of an answer (a word, then five letters) but names no
    // request waiting here: it is the agent's message, as any other. Before, it was kept as
    // an answer that changed nothing, and reached nobody.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "yes merge");
    assert_eq!(nth(&plugin, 1).await.content, "yes merge");
    assert_eq!(request(&daemon, "abcde").await.unwrap().state, PermissionState::Pending);

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "YES abcde");
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "marker");
    // Delivered in order: had the answer been work for the agent, it came before this.
    assert_eq!(nth(&plugin, 2).await.content, "marker");
    assert_eq!(plugin.notifications().len(), 2, "the answer did not reach the agent as a message");
    assert_eq!(request(&daemon, "abcde").await.unwrap().answered_by, Some(OWNER_ID));
}

#[tokio::test]
async fn an_agent_without_permissions_does_not_declare_the_capability() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &relayed(600), &[]);
    let worker = plugin_builder(&daemon, "worker").start().await.unwrap();
    let experimental = worker.capabilities().experimental.unwrap_or_default();
    assert!(experimental.contains_key("claude/channel"));
    assert!(!experimental.contains_key(PERMISSION_CAPABILITY));
}

#[tokio::test]
async fn check_prints_the_relay_and_refuses_an_unknown_route_naming_the_key() {
    let fake = FakeTelegram::start().await;
    let good = TestDaemon::configure(&fake.api_url(), "", &relayed(90), &[]);
    let output = good.subcommand("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let line = stdout.lines().find(|line| line.starts_with("permissions:")).expect("the relay is printed");
    assert!(
        line.contains("orchestrator") && line.contains("owner-dm") && line.contains(&OWNER_ID.to_string())
    );
    assert!(line.contains("90s"), "{line}");

    let bad = relayed(90).replace("route = \"owner-dm\"", "route = \"nowhere\"");
    let bad = TestDaemon::configure(&fake.api_url(), "", &bad, &[]);
    let output = bad.subcommand("check").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("agents.orchestrator.permissions.route") && stderr.contains("nowhere"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_verdict_for_a_plugin_that_is_gone_never_reaches_the_next_session() {
    let Relay { fake, mut daemon, plugin } = relay(600).await;
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    wait_for_request(&daemon, "abcde", |row| row.prompt_send == AttemptState::Sent).await;
    // The asking plugin dies while the daemon is down, so nothing expires its request, and
    // the approver answers before any other session connects.
    daemon.kill9();
    plugin.close().await.unwrap();
    daemon.restart();
    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    let row = request(&daemon, "abcde").await.unwrap();
    assert_eq!((row.state, row.verdict_sent_at), (PermissionState::Allowed, None));

    let next = session(&daemon, "orchestrator").await;
    // A session is handed its plugin's verdicts before any envelope: the marker coming
    // first shows this one was handed none.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "marker");
    assert_eq!(nth(&next, 1).await.content, "marker");
    assert!(verdicts(&next).is_empty());
    assert_eq!(request(&daemon, "abcde").await.unwrap().verdict_sent_at, None);
}

#[tokio::test]
async fn a_prompt_whose_send_timed_out_is_never_sent_again_and_stays_answerable() {
    let Relay { fake, daemon, plugin } = relay(600).await;
    // Telegram posts the prompt but its answer comes after the daemon's send timeout.
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(30)));
    ask(&plugin, "abcde").await;
    let prompt = prompt(&fake).await;
    let row = wait_for_request(&daemon, "abcde", |row| row.prompt_send != AttemptState::InFlight).await;
    assert_eq!(
        (row.state, row.prompt_send, row.prompt_message_id),
        (PermissionState::Pending, AttemptState::Unknown, None)
    );
    // Asking again (the plugin retrying) records and posts nothing more.
    ask(&plugin, "abcde").await;
    daemon.wait_for_log("asked again: not posted again", WAIT).await;

    press(&fake, &owner(), &prompt, &button(&prompt, 'a')).await;
    let verdict = plugin.wait_for_named(VERDICT_METHOD, 1, WAIT).await.unwrap();
    assert_eq!(verdict[0].params, Some(json!({"request_id": "abcde", "behavior": "allow"})));
    // The press showed where the prompt is: it is edited to its outcome like any other.
    let edit = fake.wait_for_edit(prompt.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;
    assert!(edit.text.unwrap().contains("Allowed"));
    let prompts = fake.sent_messages().into_iter().filter(|m| !m.callback_data().is_empty()).count();
    assert_eq!(prompts, 1, "an unknown send is never repeated");
}

/// The orchestrator's route, plus `[operator]`: unresolved sends are asked about in the
/// forum, and the owner answers.
fn with_operator() -> String {
    format!("{}\n[operator]\nroute = \"forum\"\noperators = [{OWNER_ID}]\n", default_routes())
}

#[tokio::test]
async fn an_operator_answers_an_unresolved_send_from_telegram_once() {
    use support::daemon::FORUM_CHAT;
    use switchboard::ledger::EnvelopeState;
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start_with_config(&fake.api_url(), &with_operator(), &[]);
    let plugin = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "are you there?");
    let trace = support::agents::trace_id(&nth(&plugin, 1).await);
    // Telegram takes the reply and never answers: its outcome is unknown.
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(60)));
    let (is_error, _) =
        plugin.call_tool("reply", json!({"text": "yes, here", "trace_id": trace})).await.unwrap();
    assert!(is_error);
    assert_eq!(support::agents::state_of(&daemon, &trace).await, EnvelopeState::Unresolved);

    let question = fake
        .wait_for_sent_matching(WAIT, |sent| sent.chat_id == FORUM_CHAT && !sent.callback_data().is_empty())
        .await
        .expect("the operators are asked");
    assert!(question.text.contains(&trace) && question.text.contains("yes, here"), "{}", question.text);
    let not_delivered = question.callback_data().into_iter().find(|d| d.ends_with(":n")).unwrap();

    let refused = press(&fake, &stranger(), &question, &not_delivered).await;
    assert!(refused.is_some_and(|text| text.contains("operator")));
    assert_eq!(support::agents::state_of(&daemon, &trace).await, EnvelopeState::Unresolved);

    // The question survives a crash, and is not asked again.
    daemon.kill9();
    daemon.restart();
    // The agent's session is back before the answer, so what it is handed after comes of
    // the answer, not of the reconnection.
    plugin.wait_for_stderr("connected to the switchboard daemon again", WAIT).await.unwrap();
    let answered = press(&fake, &owner(), &question, &not_delivered).await;
    assert_eq!(answered.as_deref(), Some("Recorded."));
    // Not delivered: the envelope goes back to the agent, as after the CLI's `reconcile
    // --not-delivered`: queued, and handed to its session again at once, marked
    // redelivered, so the agent told "unknown" learns it may answer.
    let redelivered = |n: &ChannelNotification| {
        n.meta_str("trace_id") == Some(trace.as_str()) && n.meta_str("redelivered") == Some("true")
    };
    support::daemon::eventually(WAIT, "the envelope is handed to the agent again", || {
        plugin.notifications().iter().any(redelivered)
    })
    .await;
    assert_eq!(support::agents::state_of(&daemon, &trace).await, EnvelopeState::Pending);
    let edit = fake.wait_for_edit(question.message_id, WAIT, |edit| edit.reply_markup.is_none()).await;
    let text = edit.text.unwrap();
    assert!(text.contains("Not delivered"), "{text}");
    // The keeper is one loop, and each of its rounds looks for sends to ask about before
    // it edits: the round that made this edit, and the one at start-up before it, asked
    // nothing more.
    let questions = fake.sent_messages().into_iter().filter(|m| m.chat_id == FORUM_CHAT).count();
    assert_eq!(questions, 1);
    let again = press(&fake, &owner(), &question, &not_delivered).await;
    assert!(again.is_some_and(|text| text.contains("already answered")));
    let (_, shown, _) = daemon.ledger_cli(&["show", &trace]);
    assert!(shown.contains("answered in Telegram by @olga"), "{shown}");
}

/// Telegram did not take the operators' question (a rate limit, Telegram out of reach):
/// it is asked again once Telegram takes it, where it stayed unasked for good.
#[tokio::test]
async fn a_question_telegram_did_not_take_is_asked_again() {
    use support::daemon::FORUM_CHAT;
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_config(&fake.api_url(), &with_operator(), &[]);
    let plugin = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "are you there?");
    let trace = support::agents::trace_id(&nth(&plugin, 1).await);
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(60)));
    fake.fail_send_message(Fault::TooManyRequests { retry_after: 1 });
    let (is_error, _) =
        plugin.call_tool("reply", json!({"text": "yes, here", "trace_id": trace})).await.unwrap();
    assert!(is_error);
    daemon.wait_for_log("asking again later", WAIT).await;
    let question = fake
        .wait_for_sent_matching(WAIT, |sent| sent.chat_id == FORUM_CHAT && !sent.callback_data().is_empty())
        .await
        .expect("the operators are asked once Telegram takes it");
    assert!(question.text.contains(&trace), "{}", question.text);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let questions = fake.sent_messages().into_iter().filter(|m| m.chat_id == FORUM_CHAT).count();
    assert_eq!(questions, 1, "asked once it went through, not again");
}
