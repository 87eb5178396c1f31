//! What a human message or a recorded change does to a task, decided without the ledger
//! (DESIGN.md §11). The ledger reads what a [`ChangeContext`] asks for inside the
//! transaction that records the change, and makes the writes of the [`ChangePlan`] this
//! returns: the decision is here, the statements are there.

use serde_json::{Value, json};

use super::task::Task;
use super::texts::{self, RevisionChange};
use super::{ChangeKind, Command, Meaning, TaskState, parse_command};
use crate::ids::{TaskId, TraceId};

/// Who made a change, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Edit,
    Command,
    Agent,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Edit => "edit",
            Self::Command => "command",
            Self::Agent => "agent",
        }
    }
}

/// A change to record: what it is and who made it.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    pub kind: ChangeKind,
    /// The new instruction or objective (a correction's, a new objective's).
    pub text: Option<&'a str>,
    pub source: Source,
    pub actor: &'a str,
    pub summary: String,
}

// ---- a human message ----

/// What a human message of a single-agent conversation does, once classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessagePlan {
    /// Work for the open task: the message joins it.
    Join,
    /// Work that starts a new task with this objective.
    Start { objective: String },
    /// `/status`: answered with the open task, or the most recent one when none is open.
    Status,
    /// Changes nothing: the bot says why and the message is settled.
    NothingChanged { why: String },
    /// A change to the open task, recorded as its next revision.
    Change { kind: ChangeKind, text: Option<String> },
}

/// What `text` (`meaning`, as [`super::classify`] read it) does, given the state of the
/// conversation's open task.
pub fn plan_message(
    meaning: Meaning,
    open: Option<TaskState>,
    text: &str,
    bot_username: &str,
) -> MessagePlan {
    match (meaning, open) {
        // A message after `/cancel` is new work, not part of the task being stopped.
        (Meaning::Work, Some(TaskState::StopRequested) | None) => {
            let objective = match parse_command(text, bot_username) {
                // `/new <text>` with nothing open: the text is the objective.
                Some(Command::New(objective)) if open.is_none() => objective,
                _ => text.to_owned(),
            };
            MessagePlan::Start { objective }
        }
        (Meaning::Work, Some(_)) => MessagePlan::Join,
        (Meaning::Status, _) => MessagePlan::Status,
        (Meaning::Ask(why), _) => MessagePlan::NothingChanged { why },
        // `classify` asks when nothing is open; kept total all the same.
        (Meaning::Change { .. }, None) => {
            MessagePlan::NothingChanged { why: "there is no open task here".into() }
        }
        (Meaning::Change { kind, text }, Some(_)) => MessagePlan::Change { kind, text },
    }
}

/// How the lineage names the actor of a human's change.
pub fn human_summary(who: &str, kind: ChangeKind, source: Source) -> String {
    match (kind, source) {
        (ChangeKind::Correction, _) => format!("{who} edited the instruction"),
        (_, _) => format!("{who} sent /{}", command_name(kind)),
    }
}

fn command_name(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::NewObjective => "new",
        ChangeKind::Pause => "pause",
        ChangeKind::Resume => "resume",
        ChangeKind::Cancel => "cancel",
        ChangeKind::Correction => "correction",
    }
}

// ---- a change ----

/// Whether a change of `kind` retires what was made under older revisions: a change of
/// the instruction, or a cancel. Only then does the planner need the open handoffs.
pub fn retires(kind: ChangeKind) -> bool {
    kind.supersedes() || kind == ChangeKind::Cancel
}

/// An open handoff of the task, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenHandoff {
    pub handoff_id: String,
    pub from_agent: String,
    pub to_agent: String,
}

/// What the ledger read for a change, in the transaction that records it.
#[derive(Debug, Clone)]
pub struct ChangeContext<'a> {
    pub task: &'a Task,
    pub change: &'a Change<'a>,
    /// Whether the envelope the change came with becomes the task's `revision` envelope
    /// (a human's command or edit) or stays as it is (an agent's declaration about it).
    pub rewrite: bool,
    /// The instruction as it stood before the change.
    pub old_instruction: Option<&'a str>,
    /// The task's open handoffs (read only when the change [`retires`] them).
    pub open_handoffs: &'a [OpenHandoff],
    /// Each agent's latest pending envelope of the task other than the carrier, by agent:
    /// the task's own agent's, and each child's (a handoff carries its delegator's task). A
    /// pause's or resume's notice goes to each of them, about it: a child's answer is
    /// refused while the task is paused, and the child must hear when it may answer again.
    pub pending_by_agent: &'a [(String, TraceId)],
    /// The id a new objective's successor gets (ids are minted by the ledger).
    pub successor_id: &'a TaskId,
}

/// The writes a change makes, in the transaction that records it as revision `revision`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangePlan {
    pub revision: u32,
    /// When the change retires older work: the task's queued and pending envelopes of
    /// earlier revisions (the carrier excepted) become `superseded`, noted with this.
    pub supersede: Option<String>,
    /// Open handoffs that no longer stand, each with the envelope its agent is sent: when
    /// the change [`retires`] work, one for each of the context's `open_handoffs`, in order.
    pub retired_handoffs: Vec<RetiredHandoff>,
    pub task: TaskWrite,
    pub carrier: CarrierWrite,
    /// The agents a pause or resume notice goes to, each with the pending envelope it is
    /// about.
    pub notices: Vec<(String, TraceId)>,
    /// What the bot answers in the conversation.
    pub acknowledgement: String,
}

/// A handoff the change retires.
#[derive(Debug, Clone, PartialEq)]
pub struct RetiredHandoff {
    pub handoff_id: String,
    pub to_agent: String,
    /// The content of the `revision` envelope queued for `to_agent`.
    pub notice: String,
    pub meta: Value,
}

/// What becomes of the task's own row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskWrite {
    /// The carrier holds the instruction now.
    Corrected,
    /// A successor task takes over, with the carrier as its first envelope.
    Replaced { successor: TaskId, objective: String },
    /// Paused, or running again.
    State(TaskState),
    /// The change's actor asked it to stop; it is stopped once the agent acks the carrier.
    StopRequested,
}

/// What becomes of the envelope the change came with.
#[derive(Debug, Clone, PartialEq)]
pub enum CarrierWrite {
    /// Tagged with the task and revision it now belongs to and the change's meta; a
    /// human's command or edit (`content`) becomes the `revision` envelope the agent acts on.
    Carry { task_id: TaskId, revision: u32, meta: Value, content: Option<String> },
    /// Settled by the switchboard: never work for the agent.
    Settle { note: String },
}

/// The writes of `context.change`, recorded as the task's next revision.
pub fn plan_change(context: &ChangeContext<'_>) -> ChangePlan {
    let ChangeContext {
        task,
        change,
        rewrite,
        old_instruction,
        open_handoffs,
        pending_by_agent,
        successor_id,
    } = *context;
    let task_id = task.task_id.as_str();
    let revision = task.revision() + 1;
    let kind = change.kind;
    let retired_handoffs: Vec<RetiredHandoff> = if retires(kind) {
        open_handoffs
            .iter()
            .map(|handoff| RetiredHandoff {
                handoff_id: handoff.handoff_id.clone(),
                to_agent: handoff.to_agent.clone(),
                notice: texts::handoff_retired(&handoff.handoff_id, &handoff.from_agent, task_id, revision, kind),
                meta: json!({ "change": kind.as_str(), "handoff_id": handoff.handoff_id, "superseded": "true" }),
            })
            .collect()
    } else {
        Vec::new()
    };
    let retired: Vec<String> = retired_handoffs.iter().map(|h| h.handoff_id.clone()).collect();
    let handoff_list = retired.join(", ");
    let content = |task_id: &str, revision: u32, what: RevisionChange<'_>| {
        rewrite.then(|| texts::revision_envelope(task_id, revision, &what, &retired))
    };
    let (task_write, carrier) = match kind {
        ChangeKind::Correction => {
            let new = change.text.unwrap_or_default();
            let meta = json!({
                "change": "correction",
                "text": new,
                "old_text": old_instruction.unwrap_or_default(),
                "superseded_handoffs": handoff_list,
            });
            let content =
                content(task_id, revision, RevisionChange::Correction { new, old: old_instruction });
            (
                TaskWrite::Corrected,
                CarrierWrite::Carry { task_id: task.task_id.clone(), revision, meta, content },
            )
        }
        ChangeKind::NewObjective => {
            let objective = change.text.unwrap_or_default();
            let meta = json!({
                "change": "new_objective",
                "text": objective,
                "predecessor": task_id,
                "superseded_handoffs": handoff_list,
            });
            let content =
                content(successor_id, 1, RevisionChange::NewObjective { objective, replacing: task_id });
            (
                TaskWrite::Replaced { successor: successor_id.clone(), objective: objective.to_owned() },
                CarrierWrite::Carry { task_id: successor_id.clone(), revision: 1, meta, content },
            )
        }
        ChangeKind::Pause | ChangeKind::Resume => {
            let state = if kind == ChangeKind::Pause { TaskState::Paused } else { TaskState::Open };
            (
                TaskWrite::State(state),
                CarrierWrite::Settle { note: texts::settled_change(task_id, revision, kind) },
            )
        }
        ChangeKind::Cancel => {
            let meta = json!({ "change": "cancel", "superseded_handoffs": handoff_list });
            let content = content(task_id, revision, RevisionChange::Cancel { by: change.actor });
            (
                TaskWrite::StopRequested,
                CarrierWrite::Carry { task_id: task.task_id.clone(), revision, meta, content },
            )
        }
    };
    let notices = match kind {
        ChangeKind::Pause | ChangeKind::Resume => pending_by_agent.to_vec(),
        _ => Vec::new(),
    };
    ChangePlan {
        revision,
        supersede: retires(kind).then(|| texts::superseded_by(task_id, revision, kind)),
        retired_handoffs,
        task: task_write,
        carrier,
        notices,
        acknowledgement: texts::acknowledgement(task_id, revision, kind, successor_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: TaskState) -> Task {
        Task::sample(state)
    }

    fn change(kind: ChangeKind, text: Option<&'static str>) -> Change<'static> {
        Change { kind, text, source: Source::Command, actor: "@ana", summary: String::new() }
    }

    fn handoff() -> OpenHandoff {
        OpenHandoff {
            handoff_id: "hof_1".into(),
            from_agent: "orchestrator".into(),
            to_agent: "researcher".into(),
        }
    }

    fn plan(task: &Task, change: &Change<'_>, rewrite: bool, handoffs: &[OpenHandoff]) -> ChangePlan {
        plan_change(&ChangeContext {
            task,
            change,
            rewrite,
            old_instruction: Some("write the report"),
            open_handoffs: handoffs,
            pending_by_agent: &[
                ("orchestrator".into(), "env_pendingaaa".into()),
                ("researcher".into(), "env_handoffaaa".into()),
            ],
            successor_id: &"task_bbbbbbbb".into(),
        })
    }

    #[test]
    fn a_correction_supersedes_older_work_and_the_human_edit_carries_the_new_instruction() {
        let task = task(TaskState::Open);
        let correction = change(ChangeKind::Correction, Some("write the summary"));
        let plan = plan(&task, &correction, true, &[handoff()]);
        assert_eq!(plan.revision, 3);
        assert!(plan.supersede.as_deref().is_some_and(|why| why.contains("task_aaaaaaaa revision 3")));
        assert_eq!(plan.task, TaskWrite::Corrected);
        assert_eq!(plan.retired_handoffs.len(), 1);
        assert_eq!(plan.retired_handoffs[0].to_agent, "researcher");
        assert!(
            plan.retired_handoffs[0].notice.contains("hof_1")
                && plan.retired_handoffs[0].notice.contains("Ack")
        );
        let CarrierWrite::Carry { task_id, revision, meta, content } = &plan.carrier else {
            panic!("{plan:?}")
        };
        assert_eq!((task_id.as_str(), *revision), ("task_aaaaaaaa", 3));
        assert_eq!(meta["old_text"], "write the report");
        assert_eq!(meta["superseded_handoffs"], "hof_1");
        let content = content.as_deref().unwrap();
        assert!(content.contains("write the summary") && content.contains("write the report"), "{content}");
        assert!(content.contains("hof_1"), "the agent hears which handoffs no longer stand: {content}");
        assert_eq!(plan.notices, []);
    }

    #[test]
    fn an_agents_declaration_keeps_its_envelope_as_it_is() {
        let task = task(TaskState::Open);
        let plan = plan(&task, &change(ChangeKind::Correction, Some("x")), false, &[]);
        let CarrierWrite::Carry { content, .. } = plan.carrier else { panic!() };
        assert_eq!(content, None);
    }

    #[test]
    fn a_new_objective_moves_the_carrier_to_the_successor_at_revision_one() {
        let task = task(TaskState::Open);
        let plan = plan(&task, &change(ChangeKind::NewObjective, Some("do this instead")), true, &[]);
        assert_eq!(
            plan.task,
            TaskWrite::Replaced { successor: "task_bbbbbbbb".into(), objective: "do this instead".into() }
        );
        let CarrierWrite::Carry { task_id, revision, meta, .. } = &plan.carrier else { panic!() };
        assert_eq!((task_id.as_str(), *revision), ("task_bbbbbbbb", 1));
        assert_eq!(meta["predecessor"], "task_aaaaaaaa");
        assert!(plan.acknowledgement.contains("task_bbbbbbbb"), "{}", plan.acknowledgement);
    }

    #[test]
    fn a_pause_or_resume_is_settled_and_noticed_without_retiring_anything() {
        for (kind, state) in [(ChangeKind::Pause, TaskState::Paused), (ChangeKind::Resume, TaskState::Open)] {
            let task = task(TaskState::Open);
            let plan = plan(&task, &change(kind, None), true, &[handoff()]);
            assert_eq!(plan.task, TaskWrite::State(state));
            assert!(matches!(plan.carrier, CarrierWrite::Settle { .. }), "{plan:?}");
            assert_eq!(plan.supersede, None);
            assert!(plan.retired_handoffs.is_empty(), "a pause leaves handoffs standing");
            let told: Vec<(&str, &str)> =
                plan.notices.iter().map(|(agent, about)| (agent.as_str(), about.as_str())).collect();
            assert_eq!(
                told,
                [("orchestrator", "env_pendingaaa"), ("researcher", "env_handoffaaa")],
                "the task's agent and the child working for it"
            );
        }
    }

    #[test]
    fn a_cancel_retires_open_work_and_asks_the_agent_to_ack() {
        let task = task(TaskState::Paused);
        let plan = plan(&task, &change(ChangeKind::Cancel, None), true, &[handoff()]);
        assert_eq!(plan.task, TaskWrite::StopRequested);
        assert!(plan.supersede.is_some());
        assert_eq!(plan.retired_handoffs.len(), 1);
        let CarrierWrite::Carry { content, .. } = &plan.carrier else { panic!() };
        let content = content.as_deref().unwrap();
        assert!(content.contains("@ana") && content.contains("ack"), "{content}");
    }

    #[test]
    fn work_after_a_cancel_starts_a_new_task_and_new_with_nothing_open_takes_its_text() {
        let plan = |open, text: &str| plan_message(Meaning::Work, open, text, "bot");
        assert_eq!(plan(Some(TaskState::Open), "more"), MessagePlan::Join);
        assert_eq!(plan(Some(TaskState::Paused), "more"), MessagePlan::Join);
        assert_eq!(
            plan(Some(TaskState::StopRequested), "more"),
            MessagePlan::Start { objective: "more".into() }
        );
        assert_eq!(plan(None, "/new the thing"), MessagePlan::Start { objective: "the thing".into() });
        assert_eq!(plan(None, "hello"), MessagePlan::Start { objective: "hello".into() });
        let change = Meaning::Change { kind: ChangeKind::Pause, text: None };
        assert!(matches!(plan_message(change, None, "/pause", "bot"), MessagePlan::NothingChanged { .. }));
    }
}
