//! Group rooms (DESIGN.md §10), end to end: the real daemon, the fake Bot API, and a real
//! `switchboard channel` plugin per agent driven by a real MCP client.

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::{WAIT, meta, nth, owner, posted, trace_id};
use support::daemon::*;
use support::mcp::{ChannelClient, ChannelNotification};
use switchboard::fake_bot_api::{BOT_USERNAME, ChatSpec, FakeTelegram, Fault, SentMessage};
use switchboard::ids::{CascadeId, TraceId};
use switchboard::ledger::{EnvelopeState, RoomCascadeState, StoredCascade};
use switchboard::rules::turns::Outcome;

const ROOM_CHAT: i64 = -1_009_876_543_210;
const OPS_CHAT: i64 = -1_005_555_000_111;

/// The agents of the rooms: name, secret variable, secret.
const BUILDER: (&str, &str, &str) = ("builder", "SB_TEST_BUILDER_SECRET", "builder-secret-0123456789");
const REVIEWER: (&str, &str, &str) = ("reviewer", "SB_TEST_REVIEWER_SECRET", "reviewer-secret-0123456789");
const CRITIC: (&str, &str, &str) = ("critic", "SB_TEST_CRITIC_SECRET", "critic-secret-0123456789");

/// Two rooms: `dev-room` (builder, reviewer; `dev_room_keys` adds its own limits) and
/// `ops-room` (critic). Group pacing is off so posts are not spaced seconds apart.
fn rooms_config(dev_room_keys: &str) -> String {
    format!(
        r#"
[outbound]
group_chat_interval_ms = 0

[agents.builder]
token_env = "{builder_env}"
display_name = "Builder"
aliases = ["bob"]

[agents.reviewer]
token_env = "{reviewer_env}"
display_name = "Reviewer"

[agents.critic]
token_env = "{critic_env}"
display_name = "Critic"

[[routes]]
name = "dev-room"
chat_id = {ROOM_CHAT}
agents = ["builder", "reviewer"]
{dev_room_keys}

[[routes]]
name = "ops-room"
chat_id = {OPS_CHAT}
agents = ["critic"]
"#,
        builder_env = BUILDER.1,
        reviewer_env = REVIEWER.1,
        critic_env = CRITIC.1,
    )
}

fn start_daemon(fake: &FakeTelegram, dev_room_keys: &str) -> TestDaemon {
    let secrets = [(BUILDER.1, BUILDER.2), (REVIEWER.1, REVIEWER.2), (CRITIC.1, CRITIC.2)];
    TestDaemon::start_with_config(&fake.api_url(), &rooms_config(dev_room_keys), &secrets)
}

async fn agent(daemon: &TestDaemon, (name, var, secret): (&str, &str, &str)) -> ChannelClient {
    let (address_var, address) = daemon.address_env();
    ChannelClient::start_connected(
        daemon.config_path(),
        name,
        &[(var, secret), (address_var, &address)],
        WAIT,
    )
    .await
    .expect("the channel plugin starts and its session connects")
}

/// The daemon, the fake, and the sessions of the dev room's two agents.
struct Room {
    fake: FakeTelegram,
    daemon: TestDaemon,
    builder: ChannelClient,
    reviewer: ChannelClient,
}

async fn room(dev_room_keys: &str) -> Room {
    let fake = FakeTelegram::start().await;
    let daemon = start_daemon(&fake, dev_room_keys);
    let builder = agent(&daemon, BUILDER).await;
    let reviewer = agent(&daemon, REVIEWER).await;
    Room { fake, daemon, builder, reviewer }
}

fn dev_room() -> ChatSpec {
    ChatSpec::supergroup(ROOM_CHAT, "Dev room")
}

/// The owner writes in the dev room.
fn say(fake: &FakeTelegram, text: &str) {
    fake.push_text(dev_room(), owner(), text);
}

async fn reply(client: &ChannelClient, turn: &ChannelNotification, text: &str) -> (bool, String) {
    client.call_tool("reply", json!({"text": text, "trace_id": trace_id(turn)})).await.unwrap()
}

/// The dev room's exchanges, oldest first, once there are `n` (within a few seconds).
async fn dev_room_exchanges(daemon: &TestDaemon, n: usize) -> Vec<StoredCascade> {
    let ledger = daemon.ledger().await;
    let mut all = Vec::new();
    for _ in 0..100 {
        all = ledger.list_cascades(Some("dev-room"), 10).await.unwrap();
        if all.len() == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ledger.close().await;
    assert_eq!(all.len(), n, "the dev room's messages are recorded as exchanges at once");
    all
}

async fn cascade(daemon: &TestDaemon, cascade_id: &str) -> StoredCascade {
    let ledger = daemon.ledger().await;
    let cascade =
        ledger.cascade(&CascadeId::parse(cascade_id).unwrap()).await.unwrap().expect("the cascade exists");
    ledger.close().await;
    cascade
}

/// The agents an exchange has given the floor to, in turn order. A turn is in the ledger
/// before its agent hears of it, so for an exchange that has ended (or still waits) this
/// is every turn it will ever give: the settle point for "nobody else speaks".
async fn turns_given(daemon: &TestDaemon, cascade_id: &str) -> Vec<String> {
    let stored = cascade(daemon, cascade_id).await;
    let ledger = daemon.ledger().await;
    let turns = ledger.turns_of(stored.id).await.unwrap();
    ledger.close().await;
    turns.into_iter().map(|turn| turn.agent.to_string()).collect()
}

/// Room posts the ledger still owes. The room driver posts only what is owed, so with
/// none owed nothing more will be posted.
async fn owed_posts(daemon: &TestDaemon) -> usize {
    let ledger = daemon.ledger().await;
    let owed = ledger.owed_room_posts().await.unwrap().len();
    ledger.close().await;
    owed
}

async fn wait_for_state(daemon: &TestDaemon, cascade_id: &str, state: RoomCascadeState) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let now = cascade(daemon, cascade_id).await.state;
        if now == state {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{cascade_id} is {now}, not {state}:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn state_of(daemon: &TestDaemon, trace_id: &str) -> (EnvelopeState, Option<String>) {
    let ledger = daemon.ledger().await;
    let envelope = ledger.find(&TraceId::parse(trace_id).unwrap()).await.unwrap().expect("envelope exists");
    ledger.close().await;
    (envelope.state, envelope.agent)
}

fn in_room(sent: &SentMessage) -> bool {
    sent.chat_id == ROOM_CHAT
}

#[tokio::test]
async fn two_speakers_take_turns_and_an_unmentioned_message_goes_to_the_first_agent() {
    let Room { fake, daemon, builder, reviewer } = room("").await;

    say(&fake, "@builder explain the parser change");
    let turn = nth(&builder, 1).await;
    assert_eq!(meta(&turn, "kind"), "room_turn");
    assert_eq!(turn.content, "@olga: @builder explain the parser change");
    assert_eq!(meta(&turn, "speaker"), "1");
    assert_eq!(meta(&turn, "cascade_limit"), "10");
    assert_eq!(meta(&turn, "max_iters"), "50");
    assert_eq!(meta(&turn, "summoned_by"), "@olga");
    assert_eq!(meta(&turn, "route"), "dev-room");
    assert_eq!(meta(&turn, "chat_id"), ROOM_CHAT.to_string());
    let cascade_id = meta(&turn, "cascade_id").to_owned();
    assert!(cascade_id.starts_with("cas_"), "{cascade_id}");

    let (is_error, text) = reply(&builder, &turn, "done; @reviewer check the edge cases").await;
    assert!(!is_error, "{text}");
    assert!(text.contains("Posted to room dev-room as Builder") && text.contains("turn"), "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "Builder: done; @reviewer check the edge cases");
    assert!(in_room(&sent[0]));
    let stored = cascade(&daemon, &cascade_id).await;
    assert_eq!(sent[0].reply_to_message_id, Some(stored.message_id as i32), "threaded to the human message");

    // One reply per turn: a second one is refused and nothing is posted.
    let (is_error, text) = reply(&builder, &turn, "and one more thing").await;
    assert!(is_error && text.contains("already ended") && text.contains("One reply per turn"), "{text}");

    let second = nth(&reviewer, 1).await;
    assert_eq!(meta(&second, "kind"), "room_turn");
    assert_eq!(meta(&second, "speaker"), "2");
    assert_eq!(meta(&second, "summoned_by"), "builder");
    assert_eq!(meta(&second, "cascade_id"), cascade_id);
    assert_eq!(
        second.content,
        "@olga: @builder explain the parser change\n\nBuilder: done; @reviewer check the edge cases"
    );
    // Written in markdown, posted in it, behind the speaker's name.
    let (is_error, text) = reviewer
        .call_tool(
            "reply",
            json!({"text": "Edge cases **covered**.", "format": "markdown", "trace_id": trace_id(&second)}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(2, WAIT).await;
    assert_eq!(
        (sent[1].text.as_str(), sent[1].parse_mode.as_deref()),
        ("Reviewer: Edge cases <b>covered</b>.", Some("HTML"))
    );
    wait_for_state(&daemon, &cascade_id, RoomCascadeState::Completed).await;
    assert_eq!(fake.sent_messages().len(), 2, "a completed exchange posts nothing of its own");

    // The human message is the room's: acked by the switchboard, no agent's pending work.
    assert_eq!(state_of(&daemon, &stored.message_trace_id).await, (EnvelopeState::Acked, None));
    assert_eq!(state_of(&daemon, &trace_id(&turn)).await.0, EnvelopeState::Acked);

    // Without a mention the first agent of the room answers; an ack passes, posting nothing.
    say(&fake, "what is next?");
    let third = nth(&builder, 2).await;
    assert_eq!((meta(&third, "speaker"), meta(&third, "summoned_by")), ("1", "@olga"));
    assert_eq!(third.content, "@olga: what is next?", "a new exchange starts from its own message");
    let next_id = meta(&third, "cascade_id").to_owned();
    assert_ne!(next_id, cascade_id);
    let (is_error, text) = builder
        .call_tool("ack", json!({"trace_id": trace_id(&third), "note": "nothing to add"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    wait_for_state(&daemon, &next_id, RoomCascadeState::Completed).await;
    assert_eq!(turns_given(&daemon, &next_id).await, ["builder"], "nobody was mentioned: nobody else speaks");
    assert_eq!(owed_posts(&daemon).await, 0, "a pass owes the room nothing");
    assert_eq!(fake.sent_messages().len(), 2, "a pass posts nothing");
    assert_eq!(reviewer.notifications().len(), 1, "nobody was mentioned: nobody else speaks");

    let (ok, out, err) = daemon.ledger_cli(&["cascades", "--room", "dev-room"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&cascade_id) && out.contains("completed") && out.contains("builder → reviewer"),
        "{out}"
    );
    assert!(out.contains(&next_id) && out.contains("0 replies"), "{out}");
    let (ok, out, err) = daemon.ledger_cli(&["show", &cascade_id]);
    assert!(ok, "{err}");
    assert!(
        out.contains("1. builder") && out.contains("summoned by @olga") && out.contains("replied"),
        "{out}"
    );
    assert!(out.contains("2. reviewer") && out.contains("summoned by builder"), "{out}");
    let (ok, out, _) = daemon.ledger_cli(&["show", &next_id]);
    assert!(ok && out.contains("passed"), "{out}");
}

#[tokio::test]
async fn the_ceiling_ends_a_ping_pong_with_a_budget_exhausted_post_made_once() {
    let Room { fake, mut daemon, builder, reviewer } = room("cascade_limit = 3").await;

    say(&fake, "@builder @reviewer settle this between you");
    let first = nth(&builder, 1).await;
    let cascade_id = meta(&first, "cascade_id").to_owned();
    assert_eq!(meta(&first, "cascade_limit"), "3");
    assert!(!reply(&builder, &first, "@reviewer your call").await.0);
    let second = nth(&reviewer, 1).await;
    assert!(!reply(&reviewer, &second, "@builder no, yours").await.0);
    let third = nth(&builder, 2).await;
    assert_eq!(meta(&third, "speaker"), "3");
    assert!(!reply(&builder, &third, "@reviewer definitely yours").await.0);

    let texts = posted(&fake, 4).await;
    let report = &texts[3];
    assert!(report.starts_with("Budget exhausted: 3 of 3 agent turns used (3 replies)."), "{report}");
    assert!(
        report.contains("Open question, from Builder") && report.contains("definitely yours"),
        "{report}"
    );
    assert!(report.contains("asked for Reviewer, who did not get the floor"), "{report}");
    for turn in [&first, &second, &third] {
        assert!(report.contains(&trace_id(turn)), "evidence cites {}: {report}", trace_id(turn));
    }
    assert!(report.ends_with("Over to you, @olga."), "{report}");
    wait_for_state(&daemon, &cascade_id, RoomCascadeState::BudgetExhausted).await;
    let stored = cascade(&daemon, &cascade_id).await;
    assert_eq!(stored.outcome_text.as_deref(), Some(report.as_str()), "the ledger records what was posted");
    let Some(Outcome::BudgetExhausted(recorded)) = &stored.outcome else {
        panic!("the ledger should record a budget exhausted: {:?}", stored.outcome)
    };
    assert_eq!((recorded.turns_used, recorded.next_owner.as_str()), (3, "@olga"), "{recorded:?}");
    assert_eq!(turns_given(&daemon, &cascade_id).await.len(), 3, "no fourth turn");
    assert_eq!(reviewer.notifications().len(), 1, "no fourth turn");
    // An operator can alert on it: exchanges by state, every state a series.
    let (_, metrics) = get(&daemon, "/metrics").await;
    // (On PostgreSQL every series also names its replica.)
    let cascades = |state: &str, value: &str| {
        metrics.lines().any(|line| {
            line.starts_with("switchboard_cascades{")
                && line.contains(&format!("state=\"{state}\""))
                && line.ends_with(&format!("}} {value}"))
        })
    };
    assert!(cascades("budget_exhausted", "1") && cascades("running", "0"), "{metrics}");

    // The outcome post is recorded as made (once Telegram has answered, a moment after the
    // fake saw it): a restart does not post it again.
    let deadline = std::time::Instant::now() + WAIT;
    while owed_posts(&daemon).await > 0 {
        assert!(std::time::Instant::now() < deadline, "the outcome post was never recorded as made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    daemon.kill9();
    daemon.restart();
    // What the restarted driver posts is what the ledger owes: nothing.
    assert_eq!(owed_posts(&daemon).await, 0);
    assert_eq!(fake.sent_messages().len(), 4, "{:#?}", fake.sent_messages());
    let (ok, out, _) = daemon.ledger_cli(&["show", &cascade_id]);
    assert!(ok && out.contains("Budget exhausted") && out.contains("/outcome made"), "{out}");
}

/// A `/stop` ends the running exchange only; a message sent before it that waits for an
/// exchange of its own starts next, and the stop's post says so instead of promising quiet.
#[tokio::test]
async fn a_stop_says_that_an_earlier_message_waits_for_its_own_exchange() {
    let Room { fake, daemon: _daemon, builder, reviewer: _reviewer } = room("").await;
    say(&fake, "@builder draft the release notes");
    let turn = nth(&builder, 1).await;
    say(&fake, "@builder and the changelog");
    say(&fake, "/stop");
    let stopping = posted(&fake, 1).await.remove(0);
    assert!(
        stopping.starts_with("Stopping:")
            && stopping.contains("One earlier message waits for its own exchange"),
        "{stopping}"
    );
    let (is_error, text) = builder.call_tool("ack", json!({"trace_id": trace_id(&turn)})).await.unwrap();
    assert!(!is_error, "{text}");
    // What the post said: the waiting message's exchange starts next.
    let next = builder
        .wait_for_notifications(3, WAIT)
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.content.contains("and the changelog") && meta(n, "kind") == "room_turn");
    assert!(next.is_some(), "{:?}", builder.notifications());
}

#[tokio::test]
async fn stop_during_the_first_speaker_lets_it_finish_and_nobody_else_start() {
    let Room { fake, daemon, builder, reviewer } = room("").await;

    say(&fake, "@builder @reviewer review the release");
    let turn = nth(&builder, 1).await;
    let cascade_id = meta(&turn, "cascade_id").to_owned();

    // A command for another bot is none of ours.
    say(&fake, "/stop@some_other_bot");
    say(&fake, &format!("/stop@{BOT_USERNAME}"));
    let stopping = posted(&fake, 1).await;
    assert_eq!(
        stopping[0],
        "Stopping: @olga asked to stop. Builder may finish its turn; nobody else will speak in this exchange \
         (still queued: Reviewer)."
    );
    wait_for_state(&daemon, &cascade_id, RoomCascadeState::StopRequested).await;
    let notice = nth(&builder, 2).await;
    assert_eq!(meta(&notice, "kind"), "stop");
    assert_eq!(meta(&notice, "trace_id"), trace_id(&turn), "a notice about the turn envelope");
    assert_eq!(meta(&notice, "cascade_id"), cascade_id);
    assert!(notice.content.contains("/stop"), "{}", notice.content);

    // A second /stop says so.
    say(&fake, "/stop");
    let texts = posted(&fake, 2).await;
    assert!(
        texts[1].contains("already asked to stop") && texts[1].contains("finishing its turn"),
        "{}",
        texts[1]
    );

    // The speaker may still finish; its mentions queue nobody.
    let (is_error, text) = reply(&builder, &turn, "Last words: @reviewer please look at the tag").await;
    assert!(!is_error, "{text}");
    let texts = posted(&fake, 4).await;
    assert_eq!(texts[2], "Builder: Last words: @reviewer please look at the tag");
    assert_eq!(texts[3], "Stopped by @olga after 1 reply; still queued: Reviewer.");
    wait_for_state(&daemon, &cascade_id, RoomCascadeState::Stopped).await;
    assert_eq!(turns_given(&daemon, &cascade_id).await, ["builder"], "nobody starts after a stop");
    assert!(
        reviewer.notifications().is_empty(),
        "nobody starts after a stop: {:?}",
        reviewer.notifications()
    );

    // With nothing running, /stop says that too.
    say(&fake, "/cancel");
    assert!(posted(&fake, 5).await[4].starts_with("Nothing is running in this room"));
    assert_eq!(fake.sent_messages().len(), 5, "the command for another bot got no answer");

    let stored = cascade(&daemon, &cascade_id).await;
    assert_eq!(stored.stop_by.as_deref(), Some("@olga"));
    let (ok, out, _) = daemon.ledger_cli(&["show", &cascade_id]);
    assert!(
        ok && out.contains("stop:        by @olga") && out.contains("still queued then: reviewer"),
        "{out}"
    );
}

#[tokio::test]
async fn a_second_message_waits_for_the_running_exchange() {
    let Room { fake, daemon, builder, reviewer } = room("").await;

    say(&fake, "@builder first question");
    let first = nth(&builder, 1).await;
    say(&fake, "@reviewer second question");
    // Recorded at once, waiting: the reviewer does not get the floor meanwhile.
    let waiting = dev_room_exchanges(&daemon, 2).await.remove(1);
    assert_eq!(waiting.state, RoomCascadeState::Waiting);
    assert_eq!(state_of(&daemon, &waiting.message_trace_id).await, (EnvelopeState::Acked, None));
    // A waiting exchange gives the floor only once the running one has ended.
    assert!(turns_given(&daemon, &waiting.cascade_id).await.is_empty(), "exchanges never interleave");
    assert!(reviewer.notifications().is_empty(), "exchanges never interleave");

    assert!(!reply(&builder, &first, "Answer to the first.").await.0);
    let turn = nth(&reviewer, 1).await;
    assert_eq!(waiting.cascade_id, meta(&turn, "cascade_id"));
    assert_eq!(turn.content, "@olga: @reviewer second question");
    assert_eq!(meta(&turn, "speaker"), "1");
    wait_for_state(&daemon, meta(&first, "cascade_id"), RoomCascadeState::Completed).await;
    assert!(!reply(&reviewer, &turn, "Answer to the second.").await.0);
    let texts = posted(&fake, 2).await;
    assert_eq!(texts, ["Builder: Answer to the first.", "Reviewer: Answer to the second."]);
    wait_for_state(&daemon, &waiting.cascade_id, RoomCascadeState::Completed).await;
}

/// A reload that makes the room a plain route (renamed as well) lets the exchanges the room
/// accepted run to their end with its last settings: the running one and the one waiting
/// behind it are both answered in the room. Before, both waited for good. The chat's next
/// message is the new route's.
#[tokio::test]
async fn exchanges_of_a_room_a_reload_takes_away_run_to_their_end() {
    let Room { fake, daemon, builder, reviewer } = room("").await;
    say(&fake, "@builder first question");
    let first = nth(&builder, 1).await;
    say(&fake, "@reviewer second question");
    dev_room_exchanges(&daemon, 2).await;

    daemon.reload_replacing(
        &format!("name = \"dev-room\"\nchat_id = {ROOM_CHAT}\nagents = [\"builder\", \"reviewer\"]"),
        &format!("name = \"dev-direct\"\nchat_id = {ROOM_CHAT}\nagent = \"builder\""),
    );
    daemon.wait_for_log("route 'dev-direct' added", WAIT).await;

    assert!(!reply(&builder, &first, "Answer to the first.").await.0);
    let turn = nth(&reviewer, 1).await;
    assert_eq!(turn.content, "@olga: @reviewer second question");
    assert!(!reply(&reviewer, &turn, "Answer to the second.").await.0);
    assert_eq!(posted(&fake, 2).await, ["Builder: Answer to the first.", "Reviewer: Answer to the second."]);
    wait_for_state(&daemon, meta(&first, "cascade_id"), RoomCascadeState::Completed).await;
    wait_for_state(&daemon, meta(&turn, "cascade_id"), RoomCascadeState::Completed).await;
    assert!(
        !daemon.logs().contains("no room in the configuration the daemon started with"),
        "{}",
        daemon.logs()
    );

    say(&fake, "and now?");
    let direct = nth(&builder, 2).await;
    assert_eq!((meta(&direct, "kind"), meta(&direct, "route")), ("message", "dev-direct"));
}

/// A restart whose configuration no longer makes the route a room cannot answer as the room
/// would (its roster is not in the ledger), so it stops the room's exchanges, as a `/stop`
/// would: the speaker holding the floor may finish its turn (and did), nobody else starts,
/// the message waiting behind is told it gets no exchange, and nothing stays open. Before,
/// both exchanges stayed open for good, the turn and the queue with them.
#[tokio::test]
async fn exchanges_of_a_room_gone_at_a_restart_are_stopped_and_hold_nothing() {
    let Room { fake, mut daemon, builder, reviewer } = room("").await;
    say(&fake, "@builder @reviewer first question");
    let first = nth(&builder, 1).await;
    let first_id = meta(&first, "cascade_id").to_owned();
    say(&fake, "@reviewer second question");
    let second_id = dev_room_exchanges(&daemon, 2).await[1].cascade_id.to_string();

    daemon.stop();
    let config = std::fs::read_to_string(daemon.config_path()).unwrap();
    let room_route =
        format!("name = \"dev-room\"\nchat_id = {ROOM_CHAT}\nagents = [\"builder\", \"reviewer\"]");
    assert!(config.contains(&room_route), "{config}");
    let direct = format!("name = \"dev-direct\"\nchat_id = {ROOM_CHAT}\nagent = \"builder\"");
    std::fs::write(daemon.config_path(), config.replacen(&room_route, &direct, 1)).unwrap();
    daemon.restart();

    wait_for_state(&daemon, &first_id, RoomCascadeState::StopRequested).await;
    wait_for_state(&daemon, &second_id, RoomCascadeState::Stopped).await;
    let texts = posted(&fake, 2).await;
    assert_eq!(
        texts,
        [
            "This chat is no room any more: builder may finish its turn; nobody else will speak in this \
             exchange (still queued: reviewer).",
            "This chat is no room any more: this message gets no exchange (it asked for reviewer).",
        ]
    );
    // The session is back (its turn redelivered, or the notice about it), and finishes.
    builder.wait_for_notifications(2, WAIT).await.unwrap();
    assert!(!reply(&builder, &first, "Answer to the first. @reviewer over to you").await.0);
    let texts = posted(&fake, 4).await;
    assert_eq!(texts[2], "builder: Answer to the first. @reviewer over to you");
    assert_eq!(
        texts[3],
        "Stopped by the switchboard (this chat is no room any more) after 1 reply; still queued: reviewer."
    );
    wait_for_state(&daemon, &first_id, RoomCascadeState::Stopped).await;
    assert_eq!(turns_given(&daemon, &first_id).await, ["builder"], "nobody starts after the stop");
    assert_eq!(turns_given(&daemon, &second_id).await, Vec::<String>::new());
    assert!(reviewer.notifications().is_empty(), "{:?}", reviewer.notifications());
    assert_eq!(owed_posts(&daemon).await, 0);
    let ledger = daemon.ledger().await;
    assert!(ledger.busy_rooms().await.unwrap().is_empty(), "no exchange holds the route");
    ledger.close().await;
    assert_eq!(state_of(&daemon, &trace_id(&first)).await.0, EnvelopeState::Acked);
    let logs = daemon.latest_logs();
    assert!(
        logs.contains("route 'dev-room' is no room in the configuration the daemon started with"),
        "{logs}"
    );

    // The chat's next message is the plain route's, and nothing of the room is in its way.
    say(&fake, "and now?");
    let deadline = std::time::Instant::now() + WAIT;
    let next = loop {
        let message = builder.notifications().into_iter().find(|n| n.meta_str("kind") == Some("message"));
        if let Some(message) = message {
            break message;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}\n{}", builder.notifications(), daemon.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((meta(&next, "route"), next.content.as_str()), ("dev-direct", "and now?"));
}

#[tokio::test]
async fn a_silent_speaker_loses_the_floor_and_the_exchange_goes_on() {
    let Room { fake, daemon, builder, reviewer } = room("speaker_timeout_secs = 2").await;

    // Before the turn starts, however long its delivery then takes.
    let asked = std::time::Instant::now();
    say(&fake, "@bob @reviewer thoughts?");
    let silent = nth(&builder, 1).await;
    assert_eq!(meta(&silent, "summoned_by"), "@olga", "@bob is an alias of builder");
    let texts = posted(&fake, 1).await;
    assert_eq!(texts[0], "Builder did not answer within 2s and lost the floor.");
    assert!(asked.elapsed() >= Duration::from_millis(1900), "not before its time: {:?}", asked.elapsed());
    let turn = nth(&reviewer, 1).await;
    assert_eq!(meta(&turn, "speaker"), "2");
    assert_eq!(meta(&turn, "summoned_by"), "@olga");

    // The floor is gone: the late reply is refused and posts nothing.
    assert_eq!(state_of(&daemon, &trace_id(&silent)).await.0, EnvelopeState::Acked);
    let (is_error, text) = reply(&builder, &silent, "sorry, I was away").await;
    assert!(is_error && text.contains("timed out"), "{text}");

    assert!(!reply(&reviewer, &turn, "Looks fine.").await.0);
    assert_eq!(posted(&fake, 2).await[1], "Reviewer: Looks fine.");
    wait_for_state(&daemon, meta(&turn, "cascade_id"), RoomCascadeState::Completed).await;
    let (ok, out, _) = daemon.ledger_cli(&["show", meta(&turn, "cascade_id")]);
    assert!(ok && out.contains("1. builder") && out.contains("timed out"), "{out}");
}

#[tokio::test]
async fn kill_9_mid_exchange_resumes_from_the_ledger_and_posts_nothing_twice() {
    let Room { fake, mut daemon, builder, reviewer } = room("").await;

    say(&fake, "@builder start the migration");
    let first = nth(&builder, 1).await;
    let cascade_id = meta(&first, "cascade_id").to_owned();
    assert!(!reply(&builder, &first, "Step one done. @reviewer continue").await.0);
    let second = nth(&reviewer, 1).await;
    assert_eq!(meta(&second, "speaker"), "2");
    let started_before = {
        let ledger = daemon.ledger().await;
        let turns = ledger.turns_of(cascade(&daemon, &cascade_id).await.id).await.unwrap();
        ledger.close().await;
        turns[1].started_at
    };

    daemon.kill9();
    daemon.restart();

    // The reviewer's plugin reconnects and its turn is redelivered, the exchange intact.
    let redelivered = nth(&reviewer, 2).await;
    assert_eq!(trace_id(&redelivered), trace_id(&second));
    assert_eq!(meta(&redelivered, "redelivered"), "true");
    assert_eq!(meta(&redelivered, "speaker"), "2");
    assert_eq!(redelivered.content, second.content);
    let ledger = daemon.ledger().await;
    let turns = ledger.turns_of(cascade(&daemon, &cascade_id).await.id).await.unwrap();
    ledger.close().await;
    assert_eq!(turns[1].started_at, started_before, "the turn's timer counts from its stored start");

    assert!(!reply(&reviewer, &redelivered, "Step two done. @builder finish it").await.0);
    let third = nth(&builder, 2).await;
    assert_eq!(meta(&third, "speaker"), "3");
    assert!(third.content.contains("Step two done"), "{}", third.content);
    assert!(!reply(&builder, &third, "Finished.").await.0);
    wait_for_state(&daemon, &cascade_id, RoomCascadeState::Completed).await;
    let texts = posted(&fake, 3).await;
    assert_eq!(
        texts,
        [
            "Builder: Step one done. @reviewer continue",
            "Reviewer: Step two done. @builder finish it",
            "Builder: Finished.",
        ]
    );
    assert_eq!(owed_posts(&daemon).await, 0, "nothing is owed, so nothing more is posted");
    assert_eq!(fake.sent_messages().len(), 3, "nothing posted twice");
    let stored = cascade(&daemon, &cascade_id).await;
    assert_eq!(stored.cascade().unwrap().turns_used(), 3);
}

#[tokio::test]
async fn a_stop_in_one_room_leaves_the_other_running() {
    let Room { fake, daemon, builder, reviewer: _reviewer } = room("").await;
    let critic = agent(&daemon, CRITIC).await;
    let ops_room = ChatSpec::supergroup(OPS_CHAT, "Ops room");

    say(&fake, "@builder long task");
    let dev_turn = nth(&builder, 1).await;
    fake.push_text(ops_room.clone(), owner(), "status please");
    let ops_turn = nth(&critic, 1).await;
    assert_eq!(meta(&ops_turn, "route"), "ops-room");

    fake.push_text(ops_room.clone(), owner(), "/stop");
    let stopping = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(stopping[0].chat_id, OPS_CHAT);
    assert!(
        stopping[0].text.starts_with("Stopping: @olga asked to stop. Critic may finish"),
        "{}",
        stopping[0].text
    );
    wait_for_state(&daemon, meta(&ops_turn, "cascade_id"), RoomCascadeState::StopRequested).await;
    assert_eq!(
        cascade(&daemon, meta(&dev_turn, "cascade_id")).await.state,
        RoomCascadeState::Running,
        "the dev room runs on"
    );

    assert!(!reply(&builder, &dev_turn, "Task done.").await.0);
    assert!(!critic.call_tool("ack", json!({"trace_id": trace_id(&ops_turn)})).await.unwrap().0);
    wait_for_state(&daemon, meta(&dev_turn, "cascade_id"), RoomCascadeState::Completed).await;
    wait_for_state(&daemon, meta(&ops_turn, "cascade_id"), RoomCascadeState::Stopped).await;
    let sent = fake.wait_for_sent(3, WAIT).await;
    let dev: Vec<&str> = sent.iter().filter(|m| in_room(m)).map(|m| m.text.as_str()).collect();
    let ops: Vec<&str> = sent.iter().filter(|m| m.chat_id == OPS_CHAT).map(|m| m.text.as_str()).collect();
    assert_eq!(dev, ["Builder: Task done."]);
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert_eq!(ops[1], "Stopped by @olga after 0 replies; nobody was waiting.");
}

#[tokio::test]
async fn a_refused_post_gives_the_turn_back_and_an_unknown_one_ends_it_without_a_retry() {
    let Room { fake, daemon, builder, reviewer } = room("").await;

    say(&fake, "@builder @reviewer go");
    let turn = nth(&builder, 1).await;

    // Telegram provably refused it: nothing was posted, the speaker keeps the floor.
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot is not a member of the supergroup chat".into()));
    let (is_error, text) = reply(&builder, &turn, "first try").await;
    // Not a member is a refusal that lasts: the speaker is told to pass (ack), not to retry.
    assert!(is_error && text.contains("did not take the reply") && text.contains("call ack"), "{text}");
    assert_eq!(
        turns_given(&daemon, meta(&turn, "cascade_id")).await,
        ["builder"],
        "the turn stays with the builder"
    );
    assert!(reviewer.notifications().is_empty(), "the turn stays with the builder");
    let (is_error, text) = reply(&builder, &turn, "second try").await;
    assert!(!is_error, "{text}");
    let second = nth(&reviewer, 1).await;
    assert!(second.content.ends_with("Builder: second try") && !second.content.contains("first try"));

    // The outcome is unknown: the words may be out, the turn is over, nothing is resent.
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(5)));
    let (is_error, text) = reply(&reviewer, &second, "@builder over to you").await;
    assert!(is_error && text.contains("Do NOT send"), "{text}");
    assert_eq!(state_of(&daemon, &trace_id(&second)).await.0, EnvelopeState::Unresolved);
    let third = nth(&builder, 2).await;
    assert_eq!(meta(&third, "speaker"), "3");
    assert!(third.content.ends_with("Reviewer: @builder over to you"), "{}", third.content);
    assert!(!builder.call_tool("ack", json!({"trace_id": trace_id(&third)})).await.unwrap().0);
    wait_for_state(&daemon, meta(&turn, "cascade_id"), RoomCascadeState::Completed).await;
    let texts: Vec<String> = fake.sent_messages().into_iter().map(|m| m.text).collect();
    assert_eq!(texts, ["Builder: second try", "Reviewer: @builder over to you"], "each once");
}

/// A reply cut off after its first part was posted keeps its turn: the room saw part of
/// it, so the speaker may resume those words, not say others in the same turn.
#[tokio::test]
async fn a_reply_cut_off_part_way_may_be_resumed_but_not_replaced() {
    let Room { fake, daemon, builder, reviewer } = room("").await;
    say(&fake, "@builder @reviewer go");
    let turn = nth(&builder, 1).await;
    let long = "word ".repeat(1_200);
    fake.fail_send_message(Fault::Pass);
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot is not a member of the supergroup chat".into()));
    let (is_error, text) = reply(&builder, &turn, &long).await;
    assert!(is_error, "the second part was refused: {text}");
    assert_eq!(fake.sent_messages().len(), 1, "the first part is in the room");
    let (is_error, text) = reply(&builder, &turn, "something else instead").await;
    assert!(is_error, "a second reply in one turn is refused: {text}");
    assert_eq!(fake.sent_messages().len(), 1, "nothing more was posted");
    assert!(reviewer.notifications().is_empty(), "the turn stays with the builder");
    let (is_error, text) = reply(&builder, &turn, &long).await;
    assert!(!is_error, "the same words resume the reply: {text}");
    let next = nth(&reviewer, 1).await;
    assert_eq!(meta(&next, "speaker"), "2");
    let texts: Vec<String> = fake.sent_messages().into_iter().map(|m| m.text).collect();
    assert_eq!(texts.len(), 2, "each part once: {texts:?}");
    assert!(texts[0].starts_with("Builder: word") && !texts.iter().any(|t| t.contains("something else")));
    assert_eq!(state_of(&daemon, &trace_id(&turn)).await.0, EnvelopeState::Acked);
}

/// A reply cut off part-way that its speaker never resumes stands as its reply when its
/// time runs out: the floor passes on, as after a whole reply.
#[tokio::test]
async fn a_reply_cut_off_part_way_and_left_stands_when_its_time_runs_out() {
    let Room { fake, daemon, builder, reviewer } = room("speaker_timeout_secs = 3").await;
    say(&fake, "@builder @reviewer go");
    let turn = nth(&builder, 1).await;
    fake.fail_send_message(Fault::Pass);
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot is not a member of the supergroup chat".into()));
    let (is_error, _) = reply(&builder, &turn, &"word ".repeat(1_200)).await;
    assert!(is_error);
    let next = nth(&reviewer, 1).await;
    assert_eq!(meta(&next, "speaker"), "2");
    assert!(next.content.contains("Builder: word"), "the transcript has what was said: {}", next.content);
    assert_eq!(state_of(&daemon, &trace_id(&turn)).await.0, EnvelopeState::Acked);
    let texts: Vec<String> = fake.sent_messages().into_iter().map(|m| m.text).collect();
    assert!(!texts.iter().any(|t| t.contains("did not answer")), "it answered, in part: {texts:?}");
}

#[tokio::test]
async fn a_restart_keeps_the_speakers_clock() {
    let Room { fake, mut daemon, builder, reviewer } = room("speaker_timeout_secs = 4").await;

    say(&fake, "@builder @reviewer quick one");
    let turn = nth(&builder, 1).await;
    daemon.kill9();
    // A real wait, and the point of the test: the daemon is down for part of the turn's
    // time, which must still count.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    daemon.restart();
    // Measured from when the daemon is up again, however long its start took.
    let restarted = std::time::Instant::now();

    // The turn started before the crash: its time runs out 4 s after that, not 4 s after
    // the restart.
    let texts = posted(&fake, 1).await;
    assert_eq!(texts[0], "Builder did not answer within 4s and lost the floor.");
    assert!(restarted.elapsed() < Duration::from_millis(3500), "{:?} after the restart", restarted.elapsed());
    let next = nth(&reviewer, 1).await;
    assert_eq!(meta(&next, "speaker"), "2");
    assert_eq!(state_of(&daemon, &trace_id(&turn)).await.0, EnvelopeState::Acked);
}

#[tokio::test]
async fn a_speaker_may_consult_another_agent_and_still_answers_the_room_once() {
    let Room { fake, daemon, builder, reviewer: _reviewer } = room("").await;
    let worker = support::agents::session(&daemon, "worker").await;

    say(&fake, "@builder is staging healthy?");
    let turn = nth(&builder, 1).await;
    let (is_error, text) = builder
        .call_tool(
            "send_to_agent",
            json!({"agent": "worker", "text": "check staging", "trace_id": trace_id(&turn)}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let handoff = nth(&worker, 1).await;
    let (is_error, text) = worker
        .call_tool("reply", json!({"text": "all green", "trace_id": trace_id(&handoff)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let answer = nth(&builder, 2).await;
    assert_eq!(meta(&answer, "kind"), "handoff_answer");
    assert_eq!(meta(&answer, "on_behalf_of"), trace_id(&turn));

    // Replying to the answer answers the room: under the speaker's name, as its one reply.
    let (is_error, text) = builder
        .call_tool("reply", json!({"text": "Staging is healthy.", "trace_id": trace_id(&answer)}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(posted(&fake, 1).await[0], "Builder: Staging is healthy.");
    wait_for_state(&daemon, meta(&turn, "cascade_id"), RoomCascadeState::Completed).await;
    assert_eq!(state_of(&daemon, &trace_id(&answer)).await.0, EnvelopeState::Acked);
    let (is_error, text) = reply(&builder, &turn, "also this").await;
    assert!(is_error && text.contains("already ended"), "{text}");
    assert_eq!(fake.sent_messages().len(), 1);
}

#[tokio::test]
async fn a_damaged_exchange_stalls_only_its_own_room() {
    let Room { fake, daemon, builder, reviewer: _reviewer } = room("").await;
    let critic = agent(&daemon, CRITIC).await;

    say(&fake, "@builder something long");
    let turn = nth(&builder, 1).await;
    // The stored state is damaged (a botched hand edit, a bad disk).
    let damage = format!(
        "UPDATE cascades SET cascade = '{{not json' WHERE cascade_id = '{}'",
        meta(&turn, "cascade_id")
    );
    match &daemon.ledger_at {
        TestLedger::Sqlite(path) => {
            assert_eq!(rusqlite::Connection::open(path).unwrap().execute(&damage, []).unwrap(), 1);
        }
        TestLedger::Postgres(schema) => schema.execute(&[&damage]),
    }

    say(&fake, "/stop");
    let texts = posted(&fake, 1).await;
    assert!(
        texts[0].contains("cannot be read") && texts[0].contains(meta(&turn, "cascade_id")),
        "{}",
        texts[0]
    );

    // Another room is not held up by it.
    fake.push_text(ChatSpec::supergroup(OPS_CHAT, "Ops room"), owner(), "status please");
    let ops_turn = nth(&critic, 1).await;
    assert!(!reply(&critic, &ops_turn, "All quiet.").await.0);
    wait_for_state(&daemon, meta(&ops_turn, "cascade_id"), RoomCascadeState::Completed).await;
    assert!(fake.sent_messages().iter().any(|m| m.text == "Critic: All quiet."));
    daemon.wait_for_log("a stored exchange cannot be read", WAIT).await;
}
