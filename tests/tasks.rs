//! Tasks and revisions (DESIGN.md §11), end to end: the real daemon, the fake Bot API
//! (which can record a send and delay its answer past `send_timeout_secs`), and a real
//! `switchboard channel` plugin per agent driven by a real MCP client (a worker agent that
//! answers after it was redirected).

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::*;
use support::daemon::*;
use support::mcp::{ChannelClient, ChannelNotification};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault};
use switchboard::ledger::{AttemptState, EnvelopeState, HandoffState};
use switchboard::rules::revisions::Task;
use switchboard::rules::revisions::TaskState;

fn owner_chat() -> ChatSpec {
    ChatSpec::private(OWNER_CHAT)
}

async fn task(daemon: &TestDaemon, task_id: &str) -> Task {
    let ledger = daemon.ledger().await;
    let (task, _, _) = ledger
        .task(&switchboard::ids::TaskId::parse(task_id).unwrap())
        .await
        .unwrap()
        .expect("the task exists");
    ledger.close().await;
    task
}

async fn reply(client: &ChannelClient, trace_id: &str, text: &str) -> (bool, String) {
    client.call_tool("reply", json!({"text": text, "trace_id": trace_id})).await.unwrap()
}

/// 1. A reply whose outcome is unknown, then the user edits the instruction: the attempt
///    stays unknown and is never retried, the task is at revision 2, `/status` lists the
///    unresolved attempt, and a reply to the old envelope is refused as superseded.
#[tokio::test]
async fn an_edit_after_an_unknown_send_supersedes_the_old_envelope_and_status_lists_the_unknown_attempt() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("Book the room for Monday").await;
    let first = nth(&orchestrator, 1).await;
    let task_id = meta(&first, "task").to_owned();
    assert!(task_id.starts_with("task_"), "{task_id}");
    assert_eq!(meta(&first, "revision"), "1");
    let message_id: i32 = meta(&first, "message_id").parse().unwrap();

    // Telegram records the reply but answers only after send_timeout_secs (2 s here).
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(4)));
    let (is_error, text) = reply(&orchestrator, &trace, "Booked for Monday").await;
    assert!(is_error && text.contains("Do not send it again"), "{text}");
    let attempts = attempts_of(&daemon, &trace).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptState::Unknown);
    let unknown_op = attempts[0].op_id.clone();

    fake.push_edited_text(owner_chat(), owner(), message_id, "Book the room for Friday");
    let revision = nth(&orchestrator, 2).await;
    assert_eq!(meta(&revision, "kind"), "revision");
    assert_eq!((meta(&revision, "task"), meta(&revision, "revision")), (task_id.as_str(), "2"));
    assert_eq!(meta(&revision, "change"), "correction");
    assert_eq!(meta(&revision, "text"), "Book the room for Friday");
    assert_eq!(meta(&revision, "old_text"), "Book the room for Monday");
    assert!(
        revision.content.contains("Friday") && revision.content.contains("Monday"),
        "{}",
        revision.content
    );
    let texts = posted(&fake, 2).await;
    assert_eq!(texts[1], format!("{task_id} revision 2: correction accepted"));
    assert_eq!(task(&daemon, &task_id).await.revision, 2);

    fake.push_text(owner_chat(), owner(), "/status");
    let texts = posted(&fake, 3).await;
    assert!(texts[2].contains(&format!("{task_id} (revision 2): open")), "{}", texts[2]);
    assert!(texts[2].contains(&format!("unresolved attempts (never retried): {unknown_op}")), "{}", texts[2]);

    let (is_error, text) = reply(&orchestrator, &trace, "Booked for Monday (again)").await;
    assert!(is_error && text.contains("superseded"), "{text}");
    assert!(text.contains(&trace_id(&revision)), "names the envelope to act on: {text}");
    let attempts = attempts_of(&daemon, &trace).await;
    assert_eq!(attempts.len(), 1, "the unknown send is never retried: {attempts:?}");
    assert_eq!(attempts[0].outcome, AttemptState::Unknown);
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Unresolved, "kept for the operator");

    // The revision envelope is the one to act on.
    let (is_error, text) = reply(&orchestrator, &trace_id(&revision), "Booked for Friday").await;
    assert!(!is_error, "{text}");
    assert_eq!(posted(&fake, 4).await[3], "Booked for Friday");
}

/// The owner's question waiting for the orchestrator, with the worker's session connected
/// beside it.
struct Delegating {
    fake: FakeTelegram,
    daemon: TestDaemon,
    orchestrator: ChannelClient,
    worker: ChannelClient,
    question: ChannelNotification,
}

async fn delegating() -> Delegating {
    delegating_with(&[]).await
}

async fn delegating_with(env: &[(&str, &str)]) -> Delegating {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(&fake.api_url(), "", &default_routes(), env);
    let orchestrator = session(&daemon, "orchestrator").await;
    let worker = session(&daemon, "worker").await;
    fake.push_text(owner_chat(), owner(), "Draft the release notes for 1.4");
    let question = nth(&orchestrator, 1).await;
    Delegating { fake, daemon, orchestrator, worker, question }
}

impl Delegating {
    /// The orchestrator hands `text` to the worker for `trace_id`: the answer to the call.
    async fn hand_over(&self, text: &str, trace_id: String) -> (bool, String) {
        let arguments = json!({"agent": "worker", "text": text, "trace_id": trace_id});
        self.orchestrator.call_tool("send_to_agent", arguments).await.unwrap()
    }

    /// The question handed to the worker: the handoff as the worker was given it.
    async fn hand_the_question_over(&self) -> ChannelNotification {
        let (is_error, text) = self.hand_over("List the changes in 1.4", trace_id(&self.question)).await;
        assert!(!is_error, "{text}");
        nth(&self.worker, 1).await
    }
}

/// 2. The orchestrator hands work to a worker, the user corrects the task, the worker then
///    answers the old handoff: refused, kept as a late result, never an answer to the
///    orchestrator; its follow-up under revision 2 reaches the worker.
#[tokio::test]
async fn a_childs_answer_to_a_superseded_handoff_is_a_late_result_and_the_follow_up_reaches_it() {
    let delegating = delegating().await;
    let handoff = delegating.hand_the_question_over().await;
    let Delegating { fake, daemon, orchestrator, worker, question } = delegating;
    let task_id = meta(&question, "task").to_owned();
    let handoff_id = meta(&handoff, "handoff_id").to_owned();
    assert_eq!((meta(&handoff, "task"), meta(&handoff, "revision")), (task_id.as_str(), "1"));

    let message_id: i32 = meta(&question, "message_id").parse().unwrap();
    fake.push_edited_text(owner_chat(), owner(), message_id, "Draft the release notes for 1.5");
    let revision = nth(&orchestrator, 2).await;
    assert_eq!(meta(&revision, "change"), "correction");
    assert_eq!(meta(&revision, "superseded_handoffs"), handoff_id);
    let told = nth(&worker, 2).await;
    assert_eq!(meta(&told, "kind"), "revision");
    assert_eq!(meta(&told, "handoff_id"), handoff_id);
    assert!(told.content.contains("no longer stands"), "{}", told.content);

    let (is_error, text) = reply(&worker, &trace_id(&handoff), "1.4: three fixes").await;
    assert!(is_error && text.contains("superseded") && text.contains("late result"), "{text}");
    assert!(
        !text.contains(&trace_id(&revision)),
        "the delegator's envelope is not the child's to act on: {text}"
    );
    let ledger = daemon.ledger().await;
    let stored =
        ledger.handoff(&switchboard::ids::HandoffId::parse(&handoff_id).unwrap()).await.unwrap().unwrap();
    assert_eq!(stored.state, HandoffState::Superseded);
    assert_eq!(stored.answer_envelope_id, None, "never an answer");
    let late: Option<String> = match &daemon.ledger_at {
        TestLedger::Sqlite(path) => rusqlite::Connection::open(path)
            .unwrap()
            .query_row("SELECT late_result FROM handoffs WHERE handoff_id = ?", [&handoff_id], |row| {
                row.get(0)
            })
            .unwrap(),
        TestLedger::Postgres(schema) => {
            schema.scalar(&format!("SELECT late_result FROM handoffs WHERE handoff_id = '{handoff_id}'"))
        }
    };
    ledger.close().await;
    assert_eq!(late.as_deref(), Some("1.4: three fixes"));
    let (ok, out, err) = daemon.ledger_cli(&["handoffs"]);
    assert!(
        ok && out.contains("superseded")
            && out.contains("late result (never delivered): \"1.4: three fixes\""),
        "{out}{err}"
    );
    // Whether the late result reached the orchestrator shows below: the answer to the
    // follow-up, delivered after it, is the only handoff answer it gets.
    // The worker's word about the old handoff has no reply; it is acked.
    let (is_error, text) = reply(&worker, &trace_id(&told), "ok").await;
    assert!(is_error && text.contains("Ack it"), "{text}");
    let (is_error, text) = worker.call_tool("ack", json!({"trace_id": trace_id(&told)})).await.unwrap();
    assert!(!is_error, "{text}");

    let (is_error, text) = orchestrator
        .call_tool(
            "send_to_agent",
            json!({"agent": "worker", "text": "List the changes in 1.5", "trace_id": trace_id(&revision),
                   "followup": true, "intent": "replaces"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let follow_up = nth(&worker, 3).await;
    assert_eq!(follow_up.content, "List the changes in 1.5");
    assert_eq!((meta(&follow_up, "task"), meta(&follow_up, "revision")), (task_id.as_str(), "2"));
    let (is_error, text) = reply(&worker, &trace_id(&follow_up), "1.5: two features").await;
    assert!(!is_error, "{text}");
    let answer = nth(&orchestrator, 3).await;
    assert_eq!((meta(&answer, "kind"), answer.content.as_str()), ("handoff_answer", "1.5: two features"));
    let answers: Vec<String> = orchestrator
        .notifications()
        .into_iter()
        .filter(|n| meta(n, "kind") == "handoff_answer")
        .map(|n| n.content)
        .collect();
    assert_eq!(answers, ["1.5: two features"], "the late result is never delivered");
}

/// The child's word that its handoff no longer stands sits where that handoff sat in the
/// chain: a handoff made on its behalf is one level deeper, not a fresh start.
#[tokio::test]
async fn a_childs_word_that_its_handoff_no_longer_stands_keeps_the_handoffs_depth() {
    let delegating = delegating_with(&[("SWITCHBOARD__HANDOFFS__MAX_DEPTH", "1")]).await;
    let handoff = delegating.hand_the_question_over().await;
    assert_eq!(meta(&handoff, "depth"), "1");
    let Delegating { fake, daemon: _daemon, orchestrator, worker, question } = delegating;
    let message_id: i32 = meta(&question, "message_id").parse().unwrap();
    fake.push_edited_text(owner_chat(), owner(), message_id, "Draft the release notes for 1.5");
    nth(&orchestrator, 2).await;
    let told = nth(&worker, 2).await;
    assert_eq!(meta(&told, "kind"), "revision");

    let (is_error, text) = worker
        .call_tool(
            "send_to_agent",
            json!({"agent": "orchestrator", "text": "which version?", "trace_id": trace_id(&told)}),
        )
        .await
        .unwrap();
    assert!(is_error && text.contains("depth_limit"), "{text}");
}

/// A worker's handoff carries the delegator's task, but only a message a person sent the
/// task's own agent can change it: the worker's `revise_task` on its handoff is refused and
/// changes nothing, so the person's question still waits for the orchestrator's answer.
#[tokio::test]
async fn a_worker_cannot_revise_the_task_its_handoff_carries() {
    let delegating = delegating().await;
    let handoff = delegating.hand_the_question_over().await;
    let Delegating { fake, daemon, orchestrator, worker, question } = delegating;
    let task_id = meta(&question, "task").to_owned();
    assert_eq!(meta(&handoff, "task"), task_id);

    for kind in ["correction", "cancel", "new_objective", "pause"] {
        let (is_error, text) = worker
            .call_tool("revise_task", json!({"trace_id": trace_id(&handoff), "kind": kind}))
            .await
            .unwrap();
        assert!(
            is_error && text.contains("no_revision") && text.contains("nothing changed"),
            "{kind}: {text}"
        );
    }
    assert_eq!(task(&daemon, &task_id).await.revision, 1, "the task is unchanged");
    assert_eq!(state_of(&daemon, &trace_id(&question)).await, EnvelopeState::Pending);
    assert_eq!(state_of(&daemon, &trace_id(&handoff)).await, EnvelopeState::Pending);
    let (is_error, text) = reply(&worker, &trace_id(&handoff), "1.4: three fixes").await;
    assert!(!is_error, "{text}");
    let answer = nth(&orchestrator, 2).await;
    assert_eq!(meta(&answer, "kind"), "handoff_answer");
    let (is_error, text) = reply(&orchestrator, &trace_id(&question), "Notes for 1.4: three fixes").await;
    assert!(!is_error, "the person's question is still answerable: {text}");
    assert_eq!(posted(&fake, 1).await, ["Notes for 1.4: three fixes"], "no change was acknowledged first");
}

/// 3. `/pause`, then a reply: refused as paused, nothing sent; `/resume`, then the reply
///    goes out.
#[tokio::test]
async fn a_paused_task_sends_nothing_until_it_is_resumed() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("Summarise the incident").await;
    let task_id = meta(&nth(&orchestrator, 1).await, "task").to_owned();

    fake.push_text(owner_chat(), owner(), "/pause");
    let notice = nth(&orchestrator, 2).await;
    assert_eq!(meta(&notice, "kind"), "pause");
    assert_eq!(meta(&notice, "trace_id"), trace, "a notice about the task's pending envelope");
    assert_eq!(
        posted(&fake, 1).await[0],
        format!("{task_id} revision 2: paused; nothing of it is sent until /resume")
    );

    let (is_error, text) = reply(&orchestrator, &trace, "The incident was…").await;
    assert!(is_error && text.contains("paused"), "{text}");
    assert!(attempts_of(&daemon, &trace).await.is_empty(), "the refused reply was never attempted");
    // And never is: the chat's next messages (below) are the resume notice, then the reply.
    assert_eq!(fake.sent_messages().len(), 1, "only the acknowledgement");

    // A session that missed the notice learns it from the redelivered envelope.
    assert!(orchestrator.close().await.unwrap().success());
    let orchestrator = session(&daemon, "orchestrator").await;
    let again = nth(&orchestrator, 1).await;
    assert_eq!((trace_id(&again).as_str(), meta(&again, "task_state")), (trace.as_str(), "paused"));

    fake.push_text(owner_chat(), owner(), "/resume");
    assert_eq!(meta(&nth(&orchestrator, 2).await, "kind"), "resume");
    assert_eq!(posted(&fake, 2).await[1], format!("{task_id} revision 3: resumed"));
    let (is_error, text) = reply(&orchestrator, &trace, "The incident was a full disk").await;
    assert!(!is_error, "{text}");
    assert_eq!(posted(&fake, 3).await[2], "The incident was a full disk");
}

/// After the agent declares that its message corrects its task, the handoffs it made for the
/// old instruction no longer stand: handing the corrected one over again is not refused as
/// "already delegated".
#[tokio::test]
async fn a_correction_lets_the_agent_hand_the_new_instruction_over_again() {
    let delegating = delegating().await;
    delegating.hand_the_question_over().await;
    let first = trace_id(&delegating.question);
    // The agent reads its message again and declares it a correction of what it handed over.
    let (is_error, text) = delegating
        .orchestrator
        .call_tool("revise_task", json!({"trace_id": first, "kind": "correction"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let (is_error, text) = delegating.hand_over("List the changes in 1.4, fixes included", first).await;
    assert!(!is_error, "the superseded handoff does not stand in the way: {text}");
}

/// A `call_agent` waiting on a handoff that the user's correction retires returns at once,
/// saying the handoff no longer stands and naming the change to act on, instead of waiting
/// out its timeout for an answer that will never be delivered.
#[tokio::test]
async fn a_call_agent_whose_handoff_a_correction_retires_returns_at_once() {
    let Delegating { fake, daemon: _daemon, orchestrator, worker, question } = delegating().await;
    let message_id: i32 = meta(&question, "message_id").parse().unwrap();
    let call = orchestrator.call_tool(
        "call_agent",
        json!({"agent": "worker", "text": "List the changes in 1.4", "trace_id": trace_id(&question),
               "timeout_secs": 600}),
    );
    let correct = async {
        let handoff = nth(&worker, 1).await;
        fake.push_edited_text(owner_chat(), owner(), message_id, "Draft the release notes for 1.5");
        handoff
    };
    let (called, handoff) =
        tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(call, correct) })
            .await
            .expect("the call returned long before its timeout");
    let (is_error, text) = called.unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("no longer stands") && text.contains(meta(&handoff, "handoff_id")), "{text}");
    let revision = nth(&orchestrator, 2).await;
    assert_eq!(meta(&revision, "change"), "correction");
    assert!(text.contains(&trace_id(&revision)), "the call names the change to act on: {text}");
    let (is_error, text) = reply(&orchestrator, &trace_id(&revision), "Notes for 1.5").await;
    assert!(!is_error, "{text}");
}

/// A pause reaches everyone working on the task: the task's own agent hears about its own
/// envelope (not the worker's newer handoff), and the worker, whose answer the pause
/// refuses, hears of the pause and of the resume, after which its answer goes through.
#[tokio::test]
async fn a_pause_and_a_resume_are_told_to_the_worker_of_an_open_handoff_too() {
    let delegating = delegating().await;
    let handoff = delegating.hand_the_question_over().await;
    let Delegating { fake, daemon: _daemon, orchestrator, worker, question } = delegating;

    fake.push_text(owner_chat(), owner(), "/pause");
    let paused = nth(&orchestrator, 2).await;
    assert_eq!((meta(&paused, "kind"), trace_id(&paused)), ("pause", trace_id(&question)));
    let told = nth(&worker, 2).await;
    assert_eq!((meta(&told, "kind"), trace_id(&told)), ("pause", trace_id(&handoff)));
    let (is_error, text) = reply(&worker, &trace_id(&handoff), "1.4: three fixes").await;
    assert!(is_error && text.contains("paused"), "{text}");

    fake.push_text(owner_chat(), owner(), "/resume");
    let resumed = nth(&orchestrator, 3).await;
    assert_eq!((meta(&resumed, "kind"), trace_id(&resumed)), ("resume", trace_id(&question)));
    let told = nth(&worker, 3).await;
    assert_eq!((meta(&told, "kind"), trace_id(&told)), ("resume", trace_id(&handoff)));
    assert!(told.content.contains(&trace_id(&handoff)), "{}", told.content);
    let (is_error, text) = reply(&worker, &trace_id(&handoff), "1.4: three fixes").await;
    assert!(!is_error, "{text}");
    let answer = nth(&orchestrator, 4).await;
    assert_eq!((meta(&answer, "kind"), answer.content.as_str()), ("handoff_answer", "1.4: three fixes"));
}

/// After a reload gives the chat to another agent, the task the old agent still works on
/// is the chat's to stop: `/cancel` reaches that task and its agent (before, it found no
/// task of the new agent and answered that nothing changed, and the old task ran on).
#[tokio::test]
async fn a_cancel_after_a_reload_gave_the_chat_to_another_agent_stops_the_old_agents_task() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("Migrate the database").await;
    let task_id = meta(&nth(&orchestrator, 1).await, "task").to_owned();
    let worker = plugin(&daemon, "worker").await;
    daemon.reload_replacing(
        &format!("chat_id = {OWNER_CHAT}\nagent = \"orchestrator\""),
        &format!("chat_id = {OWNER_CHAT}\nagent = \"worker\""),
    );
    daemon.wait_for_log("route 'owner-dm' changed", WAIT).await;

    fake.push_text(owner_chat(), owner(), "/cancel");
    let cancel = nth(&orchestrator, 2).await;
    assert_eq!((meta(&cancel, "kind"), meta(&cancel, "change")), ("revision", "cancel"));
    assert_eq!(meta(&cancel, "task"), task_id);
    let acknowledged = posted(&fake, 1).await.remove(0);
    assert!(acknowledged.contains(&task_id) && acknowledged.contains("stop requested"), "{acknowledged}");
    assert_eq!(task(&daemon, &task_id).await.state, TaskState::StopRequested);
    let (is_error, text) = reply(&orchestrator, &trace, "Migrating now").await;
    assert!(is_error && text.contains("cancelled"), "{text}");
    let (is_error, text) =
        orchestrator.call_tool("ack", json!({"trace_id": trace_id(&cancel)})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(task(&daemon, &task_id).await.state, TaskState::Stopped);

    // The chat's next work is the new agent's, in a task of its own; the cancel never was.
    fake.push_text(owner_chat(), owner(), "Now the backups");
    let work = nth(&worker, 1).await;
    assert_eq!(work.content, "Now the backups");
    assert_ne!(meta(&work, "task"), task_id);
    assert_eq!(worker.notifications().len(), 1, "{:?}", worker.notifications());
}

/// In a group, an edit that changes no task is settled without a word: people there fix
/// typos in messages no task took, and the bot answering each was noise in the chat. (In a
/// private chat the bot still says that the edit changed nothing.)
#[tokio::test]
async fn an_edit_in_a_group_that_changes_no_task_is_settled_without_a_word() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let worker = plugin(&daemon, "worker").await;
    let (team, mia) =
        (ChatSpec::group(GROUP_CHAT, "Team"), switchboard::fake_bot_api::UserSpec::new(201, "Mia"));
    fake.push_text(&team, &mia, "Deploy the thing");
    nth(&worker, 1).await;
    fake.push_edited_text(&team, &mia, 999, "a typo fixed in some old message");
    fake.push_text(&team, &mia, "marker");
    assert_eq!(nth(&worker, 2).await.content, "marker", "the edit reached no agent");
    // The edit was settled, and a post about it, had one been owed in the same commit, was
    // made by the time none is owed any more.
    let ledger = daemon.ledger().await;
    let settled =
        ledger.list(&switchboard::ledger::ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    let edit =
        settled.iter().find(|e| e.text.as_deref() == Some("a typo fixed in some old message")).unwrap();
    assert!(edit.note.as_deref().is_some_and(|note| note.contains("no open task")), "{:?}", edit.note);
    for _ in 0..100 {
        if ledger.owed_room_posts().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ledger.close().await;
    assert!(fake.sent_messages().is_empty(), "nothing was said in the group: {:?}", fake.sent_messages());
}

/// 4. `/cancel`: admission closes, the task is `stop_requested` until the agent acks the
///    cancel envelope, then `stopped`; an operator can confirm a stop the agent cannot.
#[tokio::test]
async fn a_cancelled_task_is_stop_requested_until_its_agent_acks_the_cancel() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("Migrate the database").await;
    let first = nth(&orchestrator, 1).await;
    let task_id = meta(&first, "task").to_owned();

    fake.push_text(owner_chat(), owner(), "/cancel");
    let cancel = nth(&orchestrator, 2).await;
    assert_eq!((meta(&cancel, "kind"), meta(&cancel, "change")), ("revision", "cancel"));
    assert!(posted(&fake, 1).await[0].contains("stop requested"));
    assert_eq!(task(&daemon, &task_id).await.state, TaskState::StopRequested);
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Superseded);

    let (is_error, text) = reply(&orchestrator, &trace, "Migrating now").await;
    assert!(is_error && text.contains("cancelled"), "{text}");
    let (is_error, text) = reply(&orchestrator, &trace_id(&cancel), "OK, stopping").await;
    assert!(is_error && text.contains("cancelled"), "{text}");

    fake.push_text(owner_chat(), owner(), "/status");
    let status = posted(&fake, 2).await.remove(1);
    assert!(status.contains("stop_requested") && status.contains("not stopped yet"), "{status}");

    // An edit of the instruction while the task stops corrects nothing: the cancel stands,
    // and its envelope stays the agent's to ack.
    let message_id: i32 = meta(&first, "message_id").parse().unwrap();
    fake.push_edited_text(owner_chat(), owner(), message_id, "Migrate the database tomorrow");
    let refused = posted(&fake, 3).await.remove(2);
    assert!(refused.starts_with("Nothing changed") && refused.contains("cancelled"), "{refused}");
    assert_eq!(task(&daemon, &task_id).await.revision, 2);

    let (is_error, text) =
        orchestrator.call_tool("ack", json!({"trace_id": trace_id(&cancel)})).await.unwrap();
    assert!(!is_error, "{text}");
    let stopped = task(&daemon, &task_id).await;
    assert_eq!(stopped.state, TaskState::Stopped);
    assert!(stopped.stopped_at.is_some());
    assert_eq!(fake.sent_messages().len(), 3, "nothing of the task was sent");

    // With no task open, /status tells the user that the stop they asked for happened:
    // the task, that it stopped, who confirmed it and when, and what it had done.
    fake.push_text(owner_chat(), owner(), "/status");
    let status = posted(&fake, 4).await.remove(3);
    assert!(!status.starts_with("Nothing changed"), "a question is not a refused change: {status}");
    assert!(status.contains(&format!("{task_id} (revision 2): stopped")), "{status}");
    assert!(status.contains("confirmed by agent 'orchestrator'"), "{status}");
    assert!(status.contains(&switchboard::clock::text(stopped.stopped_at.unwrap())), "says when: {status}");
    assert!(status.contains("confirmed sends: none") && status.contains("unresolved attempts"), "{status}");

    // An agent that cannot ack: the operator confirms the stop.
    fake.push_text(owner_chat(), owner(), "Migrate the other database");
    let second = nth(&orchestrator, 3).await;
    let second_task = meta(&second, "task").to_owned();
    assert_ne!(second_task, task_id, "a stopped task never restarts");
    fake.push_text(owner_chat(), owner(), "/cancel");
    nth(&orchestrator, 4).await;
    let (ok, out, err) = daemon.ledger_cli(&["task", &task_id, "--stopped", "--reason", "again"]);
    assert!(!ok && err.contains("not stop_requested"), "{out}{err}");
    let (ok, out, err) =
        daemon.ledger_cli(&["task", &second_task, "--stopped", "--reason", "the agent crashed"]);
    assert!(ok && out.contains("stopped") && out.contains("the agent crashed"), "{out}{err}");
    assert_eq!(task(&daemon, &second_task).await.state, TaskState::Stopped);
    // Posted so far: the two cancels' acknowledgements, the refused edit and the two
    // answers to /status.
    assert!(posted(&fake, 5).await[4].contains("stop requested"));
    fake.push_text(owner_chat(), owner(), "/status");
    let status = posted(&fake, 6).await.remove(5);
    assert!(status.contains(&second_task) && status.contains("stopped"), "the most recent task: {status}");
    assert!(status.contains("an operator") && status.contains("the agent crashed"), "{status}");
}

/// 4b. `/status` after a task is done describes it, with what it sent; in a conversation
///     that never had a task it says so, and neither is a refused change.
#[tokio::test]
async fn status_with_no_open_task_describes_the_most_recent_one() {
    let OwnerWaiting { fake, daemon: _daemon, orchestrator, trace } = owner_waiting("What time is it?").await;
    let task_id = meta(&nth(&orchestrator, 1).await, "task").to_owned();
    let (is_error, text) = reply(&orchestrator, &trace, "Noon").await;
    assert!(!is_error, "{text}");
    let answer = fake.wait_for_nth_sent(1, WAIT).await.expect("the answer");

    fake.push_text(owner_chat(), owner(), "/status");
    let status = posted(&fake, 2).await.remove(1);
    assert!(!status.starts_with("Nothing changed"), "{status}");
    assert!(status.contains(&format!("{task_id} (revision 1): done")), "{status}");
    assert!(status.contains(&format!("(message {})", answer.message_id)), "the completed send: {status}");

    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Forum"), owner(), "/status");
    let status = posted(&fake, 3).await.remove(2);
    assert!(status.starts_with("No task here yet"), "{status}");
    assert!(orchestrator.notifications().len() == 1, "a question reaches no agent");
}

/// The bot's own answer to a command (here `/status`) that Telegram did not take is not
/// dropped: it stays owed and is posted once Telegram takes it. (A refusal that passes
/// stands in for Telegram out of reach, which the fake cannot be; a long 429 holds the
/// chat instead, and the post waits it out.)
#[tokio::test]
async fn a_bot_post_telegram_refused_is_posted_again_once_it_is_taken() {
    let OwnerWaiting { fake, daemon, orchestrator: _orchestrator, trace: _ } =
        owner_waiting("What time is it?").await;
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot can't initiate conversation".into()));
    fake.push_text(owner_chat(), owner(), "/status");
    daemon.wait_for_log("room post not sent; trying again", WAIT).await;
    let status = posted(&fake, 1).await.remove(0);
    assert!(status.contains("revision 1"), "the /status answer, once: {status}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.sent_messages().len(), 1, "posted once");
}

/// A bot post Telegram refuses in one conversation (a user who blocked the bot) is tried
/// again without holding back the posts of the route's other conversations: only posts to
/// the same chat and topic wait for each other.
#[tokio::test]
async fn a_post_tried_again_in_one_topic_holds_back_no_other_topics_post() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let forum = ChatSpec::forum(FORUM_CHAT, "Forum");
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot was blocked by the user".into()));
    fake.push_topic_text(&forum, 11, owner(), "/status");
    daemon.wait_for_log("room post not sent; trying again", WAIT).await;
    fake.push_topic_text(&forum, 12, owner(), "/status");
    let sent = fake.wait_for_sent(2, WAIT).await;
    let topics: Vec<Option<i32>> = sent.iter().map(|message| message.message_thread_id).collect();
    assert_eq!(topics, [Some(12), Some(11)], "topic 12's answer did not wait for topic 11's retry");
}

/// 5. `/new <text>` while a task is open: a successor task, the lineage visible both ways,
///    the old envelopes no longer answerable.
#[tokio::test]
async fn new_replaces_the_open_task_with_a_successor_and_the_old_envelopes_are_not_answerable() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } =
        owner_waiting("Write the quarterly report").await;
    let old_task = meta(&nth(&orchestrator, 1).await, "task").to_owned();

    fake.push_text(owner_chat(), owner(), "/new write the hiring plan instead");
    let revision = nth(&orchestrator, 2).await;
    assert_eq!((meta(&revision, "kind"), meta(&revision, "change")), ("revision", "new_objective"));
    assert_eq!(meta(&revision, "predecessor"), old_task);
    assert_eq!(meta(&revision, "revision"), "1");
    let new_task = meta(&revision, "task").to_owned();
    assert_ne!(new_task, old_task);
    assert!(posted(&fake, 1).await[0].contains(&format!("it continues as {new_task}")));

    let (is_error, text) = reply(&orchestrator, &trace, "Here is the quarterly report").await;
    assert!(is_error && text.contains("superseded") && text.contains(&trace_id(&revision)), "{text}");

    let (ok, out, err) = daemon.ledger_cli(&["show", &trace]);
    assert!(
        ok && out.contains(&format!("task:        {old_task} revision 1")) && out.contains("superseded"),
        "{out}{err}"
    );
    let (ok, out, err) = daemon.ledger_cli(&["task", &old_task]);
    assert!(
        ok && out.contains("replaced") && out.contains(&format!("replaced by: {new_task}")),
        "{out}{err}"
    );
    assert!(out.contains("new_objective") && out.contains("start"), "{out}");
    let (ok, out, err) = daemon.ledger_cli(&["task", &new_task]);
    assert!(
        ok && out.contains(&format!("replaces: {old_task}")) && out.contains("hiring plan"),
        "{out}{err}"
    );

    let (is_error, text) = reply(&orchestrator, &trace_id(&revision), "Here is the hiring plan").await;
    assert!(!is_error, "{text}");
    assert_eq!(posted(&fake, 2).await[1], "Here is the hiring plan");
}

/// 6. `kill -9` between a change and the agent's next action: the revision survives, and
///    admission still refuses the superseded action.
#[tokio::test]
async fn a_correction_survives_kill_9_and_still_refuses_the_superseded_reply() {
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("Order 10 chairs").await;
    let first = nth(&orchestrator, 1).await;
    let task_id = meta(&first, "task").to_owned();
    let message_id: i32 = meta(&first, "message_id").parse().unwrap();
    fake.push_edited_text(owner_chat(), owner(), message_id, "Order 12 chairs");
    let revision = nth(&orchestrator, 2).await;
    assert_eq!(meta(&revision, "revision"), "2");
    assert_eq!(posted(&fake, 1).await, [format!("{task_id} revision 2: correction accepted")]);

    daemon.kill9();
    daemon.restart();
    let again = orchestrator.wait_for_notifications(3, Duration::from_secs(40)).await.unwrap();
    assert_eq!(trace_id(&again[2]), trace_id(&revision), "the revision envelope is redelivered");
    assert_eq!(task(&daemon, &task_id).await.revision, 2);
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Superseded);

    let (is_error, text) = reply(&orchestrator, &trace, "Ordered 10 chairs").await;
    assert!(is_error && text.contains("superseded"), "{text}");
    let (is_error, text) = reply(&orchestrator, &trace_id(&revision), "Ordered 12 chairs").await;
    assert!(!is_error, "{text}");
    let texts = posted(&fake, 2).await;
    assert_eq!(texts, [format!("{task_id} revision 2: correction accepted"), "Ordered 12 chairs".to_owned()]);
    // One chat's messages go out in order: an acknowledgement posted again after the
    // restart would have come before the reply.
    assert_eq!(
        fake.sent_messages().len(),
        2,
        "the acknowledgement is posted once, not again after the restart"
    );
}

/// The agent declares a correction with `revise_task`; an edit of a message no open task
/// started asks and changes nothing.
#[tokio::test]
async fn an_agent_declares_a_correction_and_an_unclear_edit_changes_nothing() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("Plan the offsite in May").await;
    let task_id = meta(&nth(&orchestrator, 1).await, "task").to_owned();
    fake.push_text(owner_chat(), owner(), "actually, make it June");
    let correction = nth(&orchestrator, 2).await;
    assert_eq!(meta(&correction, "task"), task_id, "a plain message joins the open task");

    let (is_error, text) = orchestrator
        .call_tool(
            "revise_task",
            json!({"trace_id": trace_id(&correction), "kind": "correction", "summary": "June, not May"}),
        )
        .await
        .unwrap();
    assert!(!is_error && text.contains("revision 2") && text.contains(&trace_id(&correction)), "{text}");
    assert_eq!(posted(&fake, 1).await[0], format!("{task_id} revision 2: correction accepted"));
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Superseded);
    let (is_error, text) = reply(&orchestrator, &trace, "Planned for May").await;
    assert!(is_error && text.contains("superseded"), "{text}");
    let (is_error, text) = reply(&orchestrator, &trace_id(&correction), "Planned for June").await;
    assert!(!is_error, "{text}");

    let (is_error, text) = orchestrator
        .call_tool("revise_task", json!({"trace_id": trace_id(&correction), "kind": "sideways"}))
        .await
        .unwrap();
    assert!(is_error && text.contains("kind must be one of"), "{text}");

    // The task is done; an edit of its message is no change anyone can be sure of.
    let message_id: i32 = meta(&correction, "message_id").parse().unwrap();
    fake.push_edited_text(owner_chat(), owner(), message_id, "actually, make it July");
    let texts = posted(&fake, 3).await;
    assert!(texts[2].starts_with("Nothing changed:"), "{}", texts[2]);
    // A message after the edit reaches the orchestrator next: had the edit been handed
    // over, it would have come first.
    fake.push_text(owner_chat(), owner(), "and book a bus");
    let next = nth(&orchestrator, 3).await;
    assert_eq!(next.content, "and book a bus", "the edit was handed to nobody");
    assert_eq!(orchestrator.notifications().len(), 3, "{:?}", orchestrator.notifications());
}
