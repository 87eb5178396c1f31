//! Tasks and revisions (DESIGN.md §11), the pure part: what a human message or an agent's
//! declaration means for the running task, and whether an outbound action made for an
//! envelope of a task may still go out. The ledger applies both inside one transaction
//! with the task's revision counter, so a change that lands while an action is being
//! resolved cannot let the superseded action through. What a change writes is planned in
//! `plan`, and every text about a task is in `texts`.

use std::fmt;

use crate::ids::TaskId;
use crate::rules::commands::{CommandWord, command_word};

pub mod plan;
pub mod task;
pub mod texts;

pub use task::{Task, TaskEffects};

/// A command a human can give in a single-agent conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/new <text>`: a new objective replacing the task.
    New(String),
    Pause,
    Resume,
    Cancel,
    /// `/status`: no revision, only an answer.
    Status,
}

/// The kinds of change a revision records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    Correction,
    NewObjective,
    Pause,
    Resume,
    Cancel,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Correction => "correction",
            Self::NewObjective => "new_objective",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Cancel => "cancel",
        }
    }

    /// A correction and a new objective change the instruction: the task's envelopes made
    /// under earlier revisions become `superseded`. Pause, resume and cancel change the
    /// task's state, not its instruction.
    pub fn supersedes(self) -> bool {
        matches!(self, Self::Correction | Self::NewObjective)
    }

    /// What `revise_task` accepts as `kind`.
    pub fn parse_declared(raw: &str) -> Option<Self> {
        match raw.trim() {
            "correction" => Some(Self::Correction),
            "new_objective" => Some(Self::NewObjective),
            "pause" => Some(Self::Pause),
            "cancel" => Some(Self::Cancel),
            _ => None,
        }
    }
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    Open,
    Paused,
    /// `/cancel` was given; the agent has not acknowledged it yet.
    StopRequested,
    Stopped,
    /// Nothing of it is queued, pending or handed off any more.
    Done,
    /// A new objective replaced it; its successor carries on.
    Replaced,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Paused => "paused",
            Self::StopRequested => "stop_requested",
            Self::Stopped => "stopped",
            Self::Done => "done",
            Self::Replaced => "replaced",
        }
    }

    /// The state a stored name stands for; `None` for a name no state has (a row written
    /// by something else, or a newer version): read strictly, never as a default.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Open, Self::Paused, Self::StopRequested, Self::Stopped, Self::Done, Self::Replaced]
            .into_iter()
            .find(|state| state.as_str() == name)
    }

    /// Whether new messages of the conversation join it (rather than start a new task).
    pub fn is_open(self) -> bool {
        matches!(self, Self::Open | Self::Paused | Self::StopRequested)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Reads a command, `/name` or `/name@botname`, at the start of a message.
pub fn parse_command(text: &str, bot_username: &str) -> Option<Command> {
    let CommandWord { name, addressee, argument } = command_word(text)?;
    match addressee {
        // Without the bot's username (Telegram did not say), any `@name` counts as ours.
        Some(bot) if bot_username.is_empty() || bot.eq_ignore_ascii_case(bot_username) => {}
        // Addressed to another bot in the group: not ours.
        Some(_) => return None,
        None => {}
    }
    match name.to_ascii_lowercase().as_str() {
        "new" => Some(Command::New(argument.to_owned())),
        "pause" => Some(Command::Pause),
        "resume" => Some(Command::Resume),
        "cancel" => Some(Command::Cancel),
        "status" => Some(Command::Status),
        _ => None,
    }
}

/// The conversation's open task, as far as classification needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTask {
    pub task_id: TaskId,
    pub revision: u32,
    pub state: TaskState,
    /// Telegram ids of the messages that started the task or one of its revisions: an
    /// edit of one of them is a correction.
    pub instruction_messages: Vec<i32>,
}

/// What a human update is, for the task of its conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meaning {
    /// Work: joins the open task, or starts a new one.
    Work,
    /// A change to the open task, recorded as its next revision.
    Change { kind: ChangeKind, text: Option<String> },
    /// `/status`: answered, nothing recorded. A question, never a refused change: with no
    /// open task it is answered with the most recent one.
    Status,
    /// The intent cannot be determined safely: the bot says so and asks; nothing changes.
    Ask(String),
}

/// A human message or edit, as classification sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HumanUpdate<'a> {
    Message { text: &'a str },
    Edit { message_id: i32, text: &'a str },
}

/// Whether a human update, which the open task of the route's agent (`own`) does not take,
/// is for the conversation's task of another agent instead: a command about the task
/// (not `/new`, which starts work for the route's agent) with no task of its own, or an
/// edit of a message the task of the route's agent was not started or corrected by. After a
/// reload gives a chat to another agent, the task the old one is still working on remains
/// the chat's to pause, cancel, ask about and correct (`other` is that task's view).
pub fn for_another_agents_task(
    update: HumanUpdate<'_>,
    own: Option<&OpenTask>,
    other: &OpenTask,
    bot_username: &str,
) -> bool {
    match update {
        HumanUpdate::Edit { message_id, .. } => {
            own.is_none_or(|task| !task.instruction_messages.contains(&message_id))
                && other.instruction_messages.contains(&message_id)
        }
        HumanUpdate::Message { text } => {
            own.is_none()
                && matches!(
                    parse_command(text, bot_username),
                    Some(Command::Pause | Command::Resume | Command::Cancel | Command::Status)
                )
        }
    }
}

/// Classifies a human update of a single-agent conversation.
pub fn classify(update: HumanUpdate<'_>, open: Option<&OpenTask>, bot_username: &str) -> Meaning {
    let text = match update {
        HumanUpdate::Edit { message_id, text } => {
            return match open {
                // Being cancelled: a correction would supersede the cancel the agent must
                // ack for the task to stop, and leave it stopping for good.
                Some(task)
                    if task.state == TaskState::StopRequested
                        && task.instruction_messages.contains(&message_id) =>
                {
                    Meaning::Ask(format!(
                        "{} is being cancelled, so an edit cannot correct it; send what you want now as a \
                         new message once it has stopped (or /new <what to do instead>)",
                        task.task_id
                    ))
                }
                Some(task) if task.instruction_messages.contains(&message_id) => {
                    Meaning::Change { kind: ChangeKind::Correction, text: Some(text.to_owned()) }
                }
                _ => Meaning::Ask(
                    "that edit is of a message no open task started, so it changes nothing; send the \
                     correction as a new message"
                        .into(),
                ),
            };
        }
        HumanUpdate::Message { text } => text,
    };
    let Some(command) = parse_command(text, bot_username) else { return Meaning::Work };
    let Some(task) = open else {
        return match command {
            Command::Status => Meaning::Status,
            // `/new` with no open task is simply work.
            Command::New(objective) if !objective.is_empty() => Meaning::Work,
            _ => Meaning::Ask("there is no open task here to change; nothing changed".into()),
        };
    };
    match (command, task.state) {
        (Command::Status, _) => Meaning::Status,
        (Command::New(objective), _) if objective.is_empty() => {
            Meaning::Ask("/new needs the new objective after it: /new <what to do instead>".into())
        }
        (Command::New(objective), _) => {
            Meaning::Change { kind: ChangeKind::NewObjective, text: Some(objective) }
        }
        (Command::Pause, TaskState::Open) => Meaning::Change { kind: ChangeKind::Pause, text: None },
        (Command::Pause, state) => {
            Meaning::Ask(format!("{} is {state}, not running: nothing to pause", task.task_id))
        }
        (Command::Resume, TaskState::Paused) => Meaning::Change { kind: ChangeKind::Resume, text: None },
        (Command::Resume, state) => {
            Meaning::Ask(format!("{} is {state}, not paused: nothing to resume", task.task_id))
        }
        (Command::Cancel, TaskState::Open | TaskState::Paused) => {
            Meaning::Change { kind: ChangeKind::Cancel, text: None }
        }
        (Command::Cancel, state) => Meaning::Ask(format!("{} is already {state}", task.task_id)),
    }
}

/// The task an outbound action acts for, at the moment it would go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNow {
    pub task_id: TaskId,
    pub revision: u32,
    pub state: TaskState,
    /// The last change of the instruction (a correction or a new objective), if any.
    pub instruction_change: Option<InstructionChange>,
}

/// A revision that changed the task's instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstructionChange {
    pub kind: ChangeKind,
    pub revision: u32,
    /// The envelope that carries the current instruction: the one to act on.
    pub act_on: String,
}

/// Why an action may not go out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "superseded: {task_id} is at revision {current} ({change} since this envelope's revision {acted_on}); \
         nothing was sent. Act on {act_on} instead"
    )]
    Superseded { task_id: TaskId, acted_on: u32, current: u32, change: ChangeKind, act_on: String },
    #[error("paused: {task_id} is paused; nothing was sent. Wait for the resume notice")]
    Paused { task_id: TaskId },
    #[error("cancelled: {task_id} was cancelled ({state}); nothing was sent. Ack the cancel envelope")]
    Cancelled { task_id: TaskId, state: TaskState },
}

impl Refusal {
    /// The task that refused.
    pub fn task_id(&self) -> &TaskId {
        match self {
            Self::Superseded { task_id, .. } | Self::Paused { task_id } | Self::Cancelled { task_id, .. } => {
                task_id
            }
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::Superseded { .. } => "superseded",
            Self::Paused { .. } => "paused",
            Self::Cancelled { .. } => "cancelled",
        }
    }
}

/// Whether an action made for an envelope of `revision` may go out now.
pub fn admit(revision: u32, task: &TaskNow) -> Result<(), Refusal> {
    let task_id = || task.task_id.clone();
    match task.state {
        TaskState::StopRequested | TaskState::Stopped => {
            return Err(Refusal::Cancelled { task_id: task_id(), state: task.state });
        }
        TaskState::Paused => return Err(Refusal::Paused { task_id: task_id() }),
        TaskState::Open | TaskState::Done | TaskState::Replaced => {}
    }
    let superseded = |change: &InstructionChange| Refusal::Superseded {
        task_id: task_id(),
        acted_on: revision,
        current: task.revision,
        change: change.kind,
        act_on: change.act_on.clone(),
    };
    match &task.instruction_change {
        // Only a change of the instruction makes older envelopes stale; a pause and its
        // resume leave them standing.
        Some(change) if revision < change.revision => Err(superseded(change)),
        Some(change) if task.state == TaskState::Replaced => Err(superseded(change)),
        None if task.state == TaskState::Replaced => Err(Refusal::Superseded {
            task_id: task_id(),
            acted_on: revision,
            current: task.revision,
            change: ChangeKind::NewObjective,
            act_on: String::new(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_task_state_is_read_back_from_its_name_and_an_unknown_name_is_none() {
        for state in [
            TaskState::Open,
            TaskState::Paused,
            TaskState::StopRequested,
            TaskState::Stopped,
            TaskState::Done,
            TaskState::Replaced,
        ] {
            assert_eq!(TaskState::parse(state.as_str()), Some(state));
        }
        assert_eq!(TaskState::parse("archived"), None);
        assert_eq!(TaskState::parse("Open"), None);
    }

    const BOT: &str = "switchboard_bot";

    fn open(state: TaskState) -> OpenTask {
        OpenTask { task_id: "task_77777777".into(), revision: 2, state, instruction_messages: vec![10, 14] }
    }

    #[test]
    fn commands_are_read_with_or_without_the_bot_name() {
        assert_eq!(parse_command("/pause", BOT), Some(Command::Pause));
        assert_eq!(parse_command("  /PAUSE@switchboard_bot", BOT), Some(Command::Pause));
        assert_eq!(parse_command("/pause@other_bot", BOT), None);
        assert_eq!(
            parse_command("/new  do this instead ", BOT),
            Some(Command::New("do this instead".into()))
        );
        assert_eq!(parse_command("/status", BOT), Some(Command::Status));
        assert_eq!(parse_command("please /pause", BOT), None);
        assert_eq!(parse_command("/pausex", BOT), None);
    }

    #[test]
    fn a_command_or_an_edit_the_routes_agent_has_no_task_for_reaches_another_agents_task() {
        let other = open(TaskState::Open);
        let own = OpenTask { instruction_messages: vec![30], ..open(TaskState::Open) };
        let message = |text| HumanUpdate::Message { text };
        for command in ["/cancel", "/pause", "/resume", "/status"] {
            assert!(for_another_agents_task(message(command), None, &other, BOT), "{command}");
            assert!(
                !for_another_agents_task(message(command), Some(&own), &other, BOT),
                "{command}: own first"
            );
        }
        for work in ["/new do this instead", "hello", "/pause@other_bot"] {
            assert!(!for_another_agents_task(message(work), None, &other, BOT), "{work}");
        }
        let edit = |message_id| HumanUpdate::Edit { message_id, text: "Friday" };
        assert!(for_another_agents_task(edit(14), None, &other, BOT));
        assert!(for_another_agents_task(edit(14), Some(&own), &other, BOT));
        assert!(
            !for_another_agents_task(edit(30), Some(&own), &other, BOT),
            "the route's agent's instruction"
        );
        assert!(!for_another_agents_task(edit(99), None, &other, BOT), "an instruction of neither");
    }

    #[test]
    fn an_edit_of_an_instruction_message_is_a_correction() {
        let meaning = classify(
            HumanUpdate::Edit { message_id: 14, text: "Friday, not Monday" },
            Some(&open(TaskState::Open)),
            BOT,
        );
        assert_eq!(
            meaning,
            Meaning::Change { kind: ChangeKind::Correction, text: Some("Friday, not Monday".into()) }
        );
    }

    #[test]
    fn an_edit_of_a_task_being_cancelled_changes_nothing() {
        let edit = HumanUpdate::Edit { message_id: 14, text: "Friday, not Monday" };
        let meaning = classify(edit, Some(&open(TaskState::StopRequested)), BOT);
        assert!(matches!(&meaning, Meaning::Ask(why) if why.contains("cancelled")), "{meaning:?}");
        // A paused task is still corrected.
        let meaning = classify(edit, Some(&open(TaskState::Paused)), BOT);
        assert!(matches!(meaning, Meaning::Change { kind: ChangeKind::Correction, .. }), "{meaning:?}");
    }

    #[test]
    fn an_edit_of_anything_else_asks_and_changes_nothing() {
        for task in [None, Some(open(TaskState::Open))] {
            let meaning = classify(HumanUpdate::Edit { message_id: 99, text: "x" }, task.as_ref(), BOT);
            assert!(matches!(meaning, Meaning::Ask(_)), "{meaning:?}");
        }
    }

    #[test]
    fn commands_change_the_open_task_when_they_make_sense() {
        let running = open(TaskState::Open);
        let paused = open(TaskState::Paused);
        let cases = [
            ("/pause", &running, Some(ChangeKind::Pause)),
            ("/pause", &paused, None),
            ("/resume", &paused, Some(ChangeKind::Resume)),
            ("/resume", &running, None),
            ("/cancel", &running, Some(ChangeKind::Cancel)),
            ("/cancel", &paused, Some(ChangeKind::Cancel)),
            ("/new write the other report", &running, Some(ChangeKind::NewObjective)),
            ("/new", &running, None),
        ];
        for (text, task, expected) in cases {
            let meaning = classify(HumanUpdate::Message { text }, Some(task), BOT);
            match expected {
                Some(kind) => assert!(
                    matches!(meaning, Meaning::Change { kind: k, .. } if k == kind),
                    "{text}: {meaning:?}"
                ),
                None => assert!(matches!(meaning, Meaning::Ask(_)), "{text}: {meaning:?}"),
            }
        }
        let stopping = open(TaskState::StopRequested);
        assert!(matches!(
            classify(HumanUpdate::Message { text: "/cancel" }, Some(&stopping), BOT),
            Meaning::Ask(_)
        ));
        assert_eq!(classify(HumanUpdate::Message { text: "/status" }, Some(&running), BOT), Meaning::Status);
    }

    #[test]
    fn with_no_open_task_commands_ask_and_plain_text_is_work() {
        for text in ["/pause", "/resume", "/cancel", "/new"] {
            assert!(matches!(classify(HumanUpdate::Message { text }, None, BOT), Meaning::Ask(_)), "{text}");
        }
        // A question is answered (with the most recent task), not refused as a change.
        assert_eq!(classify(HumanUpdate::Message { text: "/status" }, None, BOT), Meaning::Status);
        assert_eq!(classify(HumanUpdate::Message { text: "hello" }, None, BOT), Meaning::Work);
        assert_eq!(classify(HumanUpdate::Message { text: "/new a fresh task" }, None, BOT), Meaning::Work);
        assert_eq!(
            classify(HumanUpdate::Message { text: "more detail" }, Some(&open(TaskState::Open)), BOT),
            Meaning::Work
        );
    }

    fn now(revision: u32, state: TaskState, change: Option<(ChangeKind, u32)>) -> TaskNow {
        TaskNow {
            task_id: "task_77777777".into(),
            revision,
            state,
            instruction_change: change.map(|(kind, revision)| InstructionChange {
                kind,
                revision,
                act_on: "env_revision02".into(),
            }),
        }
    }

    #[test]
    fn an_action_for_a_superseded_revision_is_refused_naming_what_to_act_on() {
        let refusal = admit(1, &now(2, TaskState::Open, Some((ChangeKind::Correction, 2)))).unwrap_err();
        assert_eq!(refusal.code(), "superseded");
        let text = refusal.to_string();
        assert!(
            text.contains("revision 2") && text.contains("correction") && text.contains("env_revision02"),
            "{text}"
        );
        assert_eq!(admit(2, &now(2, TaskState::Open, Some((ChangeKind::Correction, 2)))), Ok(()));
        // A pause and a resume after the correction leave its envelope current.
        assert_eq!(admit(2, &now(4, TaskState::Open, Some((ChangeKind::Correction, 2)))), Ok(()));
    }

    #[test]
    fn pause_and_cancel_refuse_every_action_and_resume_lets_them_through() {
        assert_eq!(admit(2, &now(2, TaskState::Paused, None)).unwrap_err().code(), "paused");
        for state in [TaskState::StopRequested, TaskState::Stopped] {
            assert_eq!(admit(2, &now(2, state, None)).unwrap_err().code(), "cancelled");
        }
        // A pause and a resume are revisions that change no instruction.
        assert_eq!(admit(1, &now(3, TaskState::Open, None)), Ok(()));
    }

    #[test]
    fn a_replaced_task_admits_nothing() {
        assert_eq!(admit(2, &now(2, TaskState::Replaced, None)).unwrap_err().code(), "superseded");
    }

    #[derive(Debug, Clone)]
    enum Step {
        Change(ChangeKind),
        /// An action made under the revision current `lag` changes ago.
        Act {
            lag: u32,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            prop_oneof![
                Just(ChangeKind::Correction),
                Just(ChangeKind::Pause),
                Just(ChangeKind::Resume),
                Just(ChangeKind::Cancel),
            ]
            .prop_map(Step::Change),
            (0u32..3).prop_map(|lag| Step::Act { lag }),
        ]
    }

    proptest! {
        /// For any interleaving of changes and actions, no action made under revision r is
        /// admitted once a later revision changed the instruction, and every admitted
        /// action's revision is the current instruction's.
        #[test]
        fn no_superseded_action_is_ever_admitted(steps in proptest::collection::vec(step(), 1..60)) {
            let mut task = now(1, TaskState::Open, None);
            // The revision at which the instruction last changed.
            let mut instruction_revision = 1;
            for step in steps {
                match step {
                    Step::Change(kind) => {
                        let open = OpenTask { task_id: task.task_id.clone(), revision: task.revision, state: task.state, instruction_messages: vec![] };
                        let command = match kind {
                            ChangeKind::Pause => "/pause",
                            ChangeKind::Resume => "/resume",
                            ChangeKind::Cancel => "/cancel",
                            _ => "",
                        };
                        let accepted = if kind == ChangeKind::Correction {
                            task.state.is_open()
                        } else {
                            matches!(classify(HumanUpdate::Message { text: command }, Some(&open), BOT), Meaning::Change { .. })
                        };
                        if !accepted {
                            continue;
                        }
                        task.revision += 1;
                        match kind {
                            ChangeKind::Pause => task.state = TaskState::Paused,
                            ChangeKind::Resume => task.state = TaskState::Open,
                            ChangeKind::Cancel => task.state = TaskState::StopRequested,
                            _ => {}
                        }
                        if kind.supersedes() {
                            instruction_revision = task.revision;
                            task.instruction_change = Some(InstructionChange {
                                kind,
                                revision: task.revision,
                                act_on: format!("env_rev{}", task.revision),
                            });
                        }
                    }
                    Step::Act { lag } => {
                        let made_under = task.revision.saturating_sub(lag).max(1);
                        let admitted = admit(made_under, &task).is_ok();
                        if admitted {
                            prop_assert!(made_under >= instruction_revision, "revision {made_under} admitted after the instruction changed at {instruction_revision}");
                            prop_assert_eq!(task.state, TaskState::Open);
                        }
                        // And nothing current is refused while the task runs.
                        if task.state == TaskState::Open && made_under >= instruction_revision {
                            prop_assert!(admitted, "revision {made_under} refused though current");
                        }
                    }
                }
            }
        }
    }
}
