use crate::ids::{AgentName, TaskId, TraceId};
use crate::ledger::conformance::Backend;
use crate::ledger::conformance::fixtures::*;
use crate::ledger::*;
use crate::rules::revisions::TaskState;

/// The check that counts is the one in the statement that records the attempt: a reply
/// resolved before a correction, whose first attempt is recorded after it, is refused
/// there and records nothing (DESIGN.md §11: admission at the moment of sending).
pub(crate) async fn a_correction_recorded_between_resolving_and_sending_refuses_the_attempt<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    let instruction = one_pending_message(&*ledger).await;
    let task_id = instruction.task_id.clone().expect("a human message belongs to a task");
    assert_eq!(instruction.revision, Some(1));
    let attempt = |envelope_id| NewAttempt {
        request_id: Some("req_aaaaaaaa"),
        reply_to_message_id: Some(1),
        text: "for Monday",
        ..one_part_reply(envelope_id)
    };
    // The reply was resolved to `instruction` (pending, admitted); now the user edits it.
    assert_eq!(ledger.admission(instruction.id).await.unwrap(), Ok(()));
    let mut edit = routed(2, EnvelopeState::Queued);
    edit.envelope.kind = EnvelopeKind::EditedMessage;
    edit.envelope.message_id = 1;
    edit.envelope.text = Some("for Friday".into());
    let batch = [edit];
    let recorded = ledger.record_batch_handing_over(2, 3, &batch, &[&orch], None).await.unwrap();
    assert!(
        recorded.task_effects.iter().any(
            |effect| matches!(effect, TaskEffect::Say(post) if post.text == format!("{task_id} revision 2: correction accepted"))
        ),
        "{:?}",
        recorded.task_effects
    );
    let revision = recorded.claimed.into_iter().next().expect("the revision envelope is handed over");
    assert_eq!((revision.kind, revision.revision), (EnvelopeKind::Revision, Some(2)));

    let refused = ledger.begin_attempt(&attempt(instruction.id)).await.unwrap().unwrap_err();
    assert_eq!(refused.code(), "superseded");
    assert!(refused.to_string().contains(revision.trace_id.as_str()), "{refused}");
    assert!(ledger.attempts_for(instruction.id).await.unwrap().is_empty(), "nothing recorded, nothing sent");
    assert_eq!(ledger.find(&instruction.trace_id).await.unwrap().unwrap().state, EnvelopeState::Superseded);
    // The revision envelope is admitted.
    ledger.begin_attempt(&attempt(revision.id)).await.unwrap().unwrap();

    // Audit posts (the bot's own acknowledgements) are never refused.
    let mut audit = attempt(instruction.id);
    audit.purpose = AttemptPurpose::Audit;
    audit.request_id = None;
    ledger.begin_attempt(&audit).await.unwrap().unwrap();
}

/// A pause and a cancel close admission for every envelope of the task, the current one
/// included; a resume opens it again. A task's lineage keeps every revision.
pub(crate) async fn pause_resume_and_cancel_are_revisions_that_close_and_open_admission<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    let work = one_pending_message(&*ledger).await;
    let task_id = work.task_id.clone().unwrap();
    let command = |update_id: i64, text: &str| {
        let mut row = routed(update_id, EnvelopeState::Queued);
        row.envelope.text = Some(text.into());
        row
    };
    let code = |admitted: Result<(), crate::rules::revisions::Refusal>| admitted.err().map(|r| r.code());

    ledger.record_batch(2, 3, &[command(2, "/pause")]).await.unwrap();
    assert_eq!(code(ledger.admission(work.id).await.unwrap()), Some("paused"));
    ledger.record_batch(3, 4, &[command(3, "/resume")]).await.unwrap();
    assert_eq!(code(ledger.admission(work.id).await.unwrap()), None);
    ledger.record_batch(4, 5, &[command(4, "/cancel")]).await.unwrap();
    assert_eq!(code(ledger.admission(work.id).await.unwrap()), Some("cancelled"));
    // A second /cancel asks; nothing changes.
    ledger.record_batch(5, 6, &[command(5, "/cancel")]).await.unwrap();

    let (task, revisions, _) = ledger.task(&task_id).await.unwrap().unwrap();
    assert_eq!((task.state.as_str(), task.revision), ("stop_requested", 4));
    let kinds: Vec<&str> = revisions.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["start", "pause", "resume", "cancel"]);
    // The commands were handled by the switchboard, never work for the agent.
    let pending: Vec<String> = ledger.pending(&orch).await.unwrap().into_iter().map(|e| e.content).collect();
    assert!(pending.is_empty(), "{pending:?}");
    let queued = ledger.claim_next_queued(&orch).await.unwrap().expect("the cancel envelope");
    assert_eq!(queued.kind, EnvelopeKind::Revision);
    assert!(ledger.claim_next_queued(&orch).await.unwrap().is_none(), "the second /cancel is no work");

    // Acking the cancel envelope stops the task.
    ledger
        .transition(queued.id, &[EnvelopeState::Pending], EnvelopeState::Acked, "agent:orch", None)
        .await
        .unwrap();
    assert_eq!(ledger.task(&task_id).await.unwrap().unwrap().0.state, TaskState::Stopped);
}

/// A batch's plain messages are stored with their tasks in its one insert: one task per
/// conversation, its first revision pointing at the message that started it.
pub(crate) async fn a_batch_starts_one_task_per_conversation_at_the_message_that_started_it<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    // An audit row first, so the human rows do not start at the batch's first id.
    let batch = [
        routed(1, EnvelopeState::Ignored),
        in_chat(2, 7, "one"),
        in_chat(3, 8, "two"),
        in_chat(4, 7, "three"),
        in_chat(5, 9, "four"),
    ];
    ledger.record_batch(1, 6, &batch).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(rows[0].task_id, None, "an audit row belongs to no task");
    assert_eq!(rows[1].task_id, rows[3].task_id, "one conversation, one task");
    assert_ne!(rows[1].task_id, rows[2].task_id);
    assert_ne!(rows[2].task_id, rows[4].task_id);
    for starter in [&rows[1], &rows[2], &rows[4]] {
        let (task, revisions, _) = ledger.task(starter.task_id.as_ref().unwrap()).await.unwrap().unwrap();
        assert_eq!(task.chat_id, starter.chat_id);
        assert_eq!(revisions.len(), 1);
        assert_eq!(revisions[0].kind, "start");
        assert_eq!(revisions[0].envelope_trace_id.as_deref(), Some(starter.trace_id.as_str()));
        assert_eq!(revisions[0].text.as_deref(), starter.text.as_deref());
    }
}

/// A batch spread over several conversations takes each one's task as a batch of its own
/// would: a message joins its conversation's open task; where the last task is finished it
/// is marked `done` and the message starts a new one, as it does where the last task was
/// asked to stop; a conversation with a command in the batch takes its messages one by one,
/// and the other conversations are not held back by it.
pub(crate) async fn a_batch_over_several_conversations_joins_or_starts_each_ones_task<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    // Three conversations' first messages, handed to the agent: chat 7's task stays open,
    // chat 8's is answered (so finished), chat 9's is asked to stop.
    let firsts = [in_chat(1, 7, "work"), in_chat(2, 8, "work"), in_chat(3, 9, "work")];
    ledger.record_batch_handing_over(1, 4, &firsts, &[&orch], None).await.unwrap();
    let answered = ledger.find(&firsts[1].envelope.trace_id).await.unwrap().unwrap();
    let sent = ledger
        .begin_attempt(&NewAttempt { chat_id: 8, ..one_part_reply(answered.id) })
        .await
        .unwrap()
        .unwrap();
    ledger.finish_attempt(&sent, &AttemptOutcome::Sent { message_id: 500 }, "agent:orch").await.unwrap();
    ledger.record_batch(1, 5, &[in_chat(4, 9, "/cancel")]).await.unwrap();
    let (open, finished, stopping) = (
        task_of(&ledger, &firsts[0]).await,
        task_of(&ledger, &firsts[1]).await,
        task_of(&ledger, &firsts[2]).await,
    );

    let batch = [
        in_chat(5, 7, "more"),
        in_chat(6, 8, "next"),
        in_chat(7, 9, "again"),
        in_chat(8, 10, "new here"),
        in_chat(9, 11, "/status"),
        in_chat(10, 7, "and more"),
        in_chat(11, 11, "after the status"),
    ];
    ledger.record_batch(1, 12, &batch).await.unwrap();
    assert_eq!(task_of(&ledger, &batch[0]).await, open, "joins the open task");
    assert_eq!(task_of(&ledger, &batch[5]).await, open, "and so does the conversation's next message");
    let after_finished = task_of(&ledger, &batch[1]).await;
    assert_ne!(after_finished, finished, "a finished task is not joined");
    assert_eq!(ledger.task_state(&finished).await.unwrap(), Some(TaskState::Done));
    let after_stopping = task_of(&ledger, &batch[2]).await;
    assert_ne!(after_stopping, stopping, "a message after /cancel is new work");
    assert_eq!(ledger.task_state(&stopping).await.unwrap(), Some(TaskState::StopRequested));
    let started = [
        after_finished,
        after_stopping,
        task_of(&ledger, &batch[3]).await,
        task_of(&ledger, &batch[6]).await,
    ];
    for (task_id, starter) in started.iter().zip([&batch[1], &batch[2], &batch[3], &batch[6]]) {
        let (task, revisions, _) = ledger.task(task_id).await.unwrap().unwrap();
        assert_eq!((task.chat_id, task.state), (starter.envelope.channel.chat_id, TaskState::Open));
        assert_eq!(revisions[0].kind, "start");
        assert_eq!(revisions[0].envelope_trace_id.as_deref(), Some(starter.envelope.trace_id.as_str()));
    }
    let distinct: std::collections::HashSet<_> = started.iter().chain([&open]).collect();
    assert_eq!(distinct.len(), 5, "one task per conversation: {started:?}");
}

/// The task `row` was stored with.
async fn task_of(ledger: &Ledger, row: &RoutedEnvelope) -> TaskId {
    ledger.find(&row.envelope.trace_id).await.unwrap().unwrap().task_id.expect("a task")
}

/// What the user and the agent do, in the model-based test below.
#[derive(Debug, Clone)]
enum Doing {
    /// A plain message.
    Message,
    /// An edit of the `n`th message sent so far (modulo their number).
    Edit(usize),
    Pause,
    Resume,
    Cancel,
    New,
    /// A reply attempt for the `n`th envelope the agent was given (modulo their number).
    Reply(usize),
}

fn doing() -> impl proptest::strategy::Strategy<Value = Doing> {
    use proptest::prelude::*;
    prop_oneof![
        3 => Just(Doing::Message),
        2 => any::<usize>().prop_map(Doing::Edit),
        1 => Just(Doing::Pause),
        1 => Just(Doing::Resume),
        1 => Just(Doing::Cancel),
        1 => Just(Doing::New),
        4 => any::<usize>().prop_map(Doing::Reply),
    ]
}

/// The model's task: its revision, the revision of its last instruction change, its
/// state, and the messages whose edit corrects it.
#[derive(Debug, Clone)]
struct ModelTask {
    revision: i64,
    instruction: i64,
    state: &'static str,
    instruction_messages: Vec<i32>,
}

impl ModelTask {
    /// A task the message `message_id` starts: revision 1, its first instruction.
    fn started_by(message_id: i32) -> Self {
        Self { revision: 1, instruction: 0, state: "open", instruction_messages: vec![message_id] }
    }
}

/// Runs `steps` through the real ledger (intake's transaction, the attempt's statement)
/// and through a model written from DESIGN.md §11 alone, and checks that every reply
/// attempt is admitted exactly when the model says it may go out: never for an envelope
/// of a superseded revision, of a paused, cancelled or replaced task.
async fn ledger_agrees_with_the_model<B: Backend>(steps: Vec<Doing>) {
    let (_keep, ledger) = B::fresh().await;
    let mut tasks: Vec<ModelTask> = Vec::new();
    let mut messages: Vec<i32> = Vec::new();
    // The envelopes handed to the agent: trace id, model task, revision made under.
    let mut given: Vec<(TraceId, usize, i64)> = Vec::new();
    let mut update_id = 0;
    for step in steps {
        let current = tasks.len().checked_sub(1);
        let open = current.filter(|&t| matches!(tasks[t].state, "open" | "paused" | "stop_requested"));
        let text = match &step {
            Doing::Pause => "/pause".to_owned(),
            Doing::Resume => "/resume".to_owned(),
            Doing::Cancel => "/cancel".to_owned(),
            Doing::New => format!("/new objective {update_id}"),
            _ => format!("message {update_id}"),
        };
        if let Doing::Reply(n) = step {
            if given.is_empty() {
                continue;
            }
            let (trace_id, task, revision) = given[n % given.len()].clone();
            let model = &tasks[task];
            let may_go = !matches!(model.state, "paused" | "stop_requested" | "replaced")
                && revision >= model.instruction;
            let envelope = ledger.find(&trace_id).await.unwrap().unwrap();
            let admitted = ledger.begin_attempt(&one_part_reply(envelope.id)).await.unwrap();
            assert_eq!(
                admitted.is_ok(),
                may_go,
                "{trace_id} of {model:?} made under revision {revision}: {admitted:?}"
            );
            continue;
        }
        update_id += 1;
        let message_id = i32::try_from(update_id).unwrap();
        let mut row = routed(update_id, EnvelopeState::Queued);
        row.envelope.text = Some(text);
        let carried = match step {
            Doing::Edit(n) => {
                if messages.is_empty() {
                    update_id -= 1;
                    continue;
                }
                let edited = messages[n % messages.len()];
                row.envelope.kind = EnvelopeKind::EditedMessage;
                row.envelope.message_id = edited;
                // An edit of a task being cancelled would undo the cancel: it changes nothing.
                match open.filter(|&t| tasks[t].state != "stop_requested") {
                    Some(t) if tasks[t].instruction_messages.contains(&edited) => {
                        let task = &mut tasks[t];
                        task.revision += 1;
                        task.instruction = task.revision;
                        task.instruction_messages.push(edited);
                        Some((t, task.revision))
                    }
                    _ => None,
                }
            }
            Doing::Message => {
                messages.push(message_id);
                match open.filter(|&t| tasks[t].state != "stop_requested") {
                    Some(t) => Some((t, tasks[t].revision)),
                    None => {
                        tasks.push(ModelTask::started_by(message_id));
                        Some((tasks.len() - 1, 1))
                    }
                }
            }
            Doing::Pause | Doing::Resume => {
                messages.push(message_id);
                let (from, to) =
                    if matches!(step, Doing::Pause) { ("open", "paused") } else { ("paused", "open") };
                if let Some(t) = open.filter(|&t| tasks[t].state == from) {
                    tasks[t].revision += 1;
                    tasks[t].state = to;
                }
                None
            }
            Doing::Cancel => {
                messages.push(message_id);
                match open.filter(|&t| matches!(tasks[t].state, "open" | "paused")) {
                    Some(t) => {
                        tasks[t].revision += 1;
                        tasks[t].state = "stop_requested";
                        Some((t, tasks[t].revision))
                    }
                    None => None,
                }
            }
            Doing::New => {
                messages.push(message_id);
                if let Some(t) = open {
                    tasks[t].revision += 1;
                    tasks[t].instruction = tasks[t].revision;
                    tasks[t].state = "replaced";
                }
                tasks.push(ModelTask::started_by(message_id));
                Some((tasks.len() - 1, 1))
            }
            Doing::Reply(_) => unreachable!("handled above"),
        };
        ledger.record_batch(1, update_id + 1, &[row.clone()]).await.unwrap();
        if let Some((task, revision)) = carried {
            given.push((row.envelope.trace_id.clone(), task, revision));
        }
    }
}

/// A reaction is admitted like a reply (DESIGN.md §11): a paused task refuses it, and a
/// refusal records nothing.
pub(crate) async fn a_paused_task_refuses_a_reaction<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let e = one_pending_message(&*ledger).await;
    let mut pause = routed(2, EnvelopeState::Queued);
    pause.envelope.text = Some("/pause".into());
    ledger.record_batch(2, 3, &[pause]).await.unwrap();
    let refused = ledger.begin_attempt(&reaction(e.id, "req_react001", 1)).await.unwrap().unwrap_err();
    assert_eq!(refused.code(), "paused");
    assert!(ledger.attempts_for(e.id).await.unwrap().is_empty());
}

/// `revise_task` asked again with the same request id (its answer lost after the commit)
/// is answered as the first was and records nothing more; another request id is a change
/// of its own.
pub(crate) async fn a_declaration_repeated_with_its_request_id_is_recorded_once<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    let work = one_pending_message(&*ledger).await;
    let task_id = work.task_id.clone().unwrap();
    let declare = |request_id: &'static str| {
        let ledger = ledger.clone();
        let (orch, trace_id) = (orch.clone(), work.trace_id.clone());
        async move {
            ledger
                .declare_revision(
                    &orch,
                    &trace_id,
                    crate::rules::revisions::ChangeKind::Correction,
                    "the real ask",
                    Some(request_id),
                )
                .await
                .unwrap()
        }
    };
    let (first, effects) = declare("req_revise0001").await;
    assert!(!effects.is_empty());
    let (again, effects) = declare("req_revise0001").await;
    assert_eq!(again, first, "answered as the first was");
    assert!(effects.is_empty(), "nothing carried out twice");
    let (_, revisions, _) = ledger.task(&task_id).await.unwrap().unwrap();
    assert_eq!(revisions.iter().filter(|r| r.kind == "correction").count(), 1, "{revisions:?}");

    let (other, _) = declare("req_revise0002").await;
    assert_eq!(other.revision, first.revision + 1);
}

/// DESIGN.md §11's property, end to end through the ledger: for any interleaving of
/// messages, changes and reply attempts, no attempt for an envelope of revision r is
/// admitted once a later revision changed the instruction (or paused, cancelled or
/// replaced the task), and every other attempt is. Each case runs on a fresh ledger.
pub(crate) fn no_superseded_reply_is_ever_recorded<B: Backend>() {
    use proptest::test_runner::{Config, TestRunner};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut runner = TestRunner::new(Config { cases: 48, source_file: Some(file!()), ..Config::default() });
    runner
        .run(&proptest::collection::vec(doing(), 1..30), |steps| {
            runtime.block_on(ledger_agrees_with_the_model::<B>(steps));
            Ok(())
        })
        .unwrap();
}
