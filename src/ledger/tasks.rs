//! Tasks and revisions (DESIGN.md §11), as the ledger keeps them: which task each human
//! message belongs to, each change as the task's next revision together with what it does
//! to the task's envelopes and handoffs, and admission of outbound actions — all inside
//! the write transactions that record them, so a change and an action are serialised and
//! a correction that lands while a reply is being resolved cannot let the old reply out.
//!
//! The decisions are pure and live in `rules::revisions`; this module reads the plain data
//! they need and applies what they decide.

use std::collections::{HashMap, HashSet};

use rusqlite::OptionalExtension;
use serde_json::json;

use super::envelopes::transition_in;
use super::in_place::{execute_cached, query_all_cached, query_row_cached};
use super::{EnvelopeKind, EnvelopeState, Ledger, LedgerError, LedgerResult, RoutedEnvelope, now};
use crate::ids::{AgentName, TraceId, random_suffix};
use crate::rules::revisions::{
    self, ChangeKind, HumanUpdate, InstructionChange, Meaning, OpenTask, Refusal, TaskNow, TaskState,
};

/// A task as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTask {
    pub task_id: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub agent: String,
    pub route: String,
    pub state: TaskState,
    pub revision: i64,
    pub objective: String,
    pub predecessor: Option<String>,
    pub successor: Option<String>,
    pub instruction_revision: Option<i64>,
    pub instruction_kind: Option<String>,
    /// The trace id of the envelope that carries the current instruction.
    pub act_on: Option<String>,
    pub stop_requested_by: Option<String>,
    pub stop_requested_at: Option<String>,
    pub stopped_at: Option<String>,
    pub stop_reason: Option<String>,
    pub opened_at: String,
    pub updated_at: String,
    pub closed_at: Option<String>,
}

/// The columns of [`StoredTask`] (`t` the task, `a` the envelope to act on), and where
/// they come from.
macro_rules! task_columns {
    () => {
        "t.task_id, t.chat_id, t.thread_id, t.agent, t.route, t.state, t.revision, t.objective, \
         t.predecessor, t.successor, t.instruction_revision, t.instruction_kind, a.trace_id AS act_on, \
         t.stop_requested_by, t.stop_requested_at, t.stopped_at, t.stop_reason, t.opened_at, t.updated_at, \
         t.closed_at"
    };
}

macro_rules! task_from {
    () => {
        " FROM tasks t LEFT JOIN envelopes a ON a.id = t.act_on_envelope_id "
    };
}

macro_rules! task_select {
    () => {
        concat!("SELECT ", task_columns!(), task_from!())
    };
}

/// Whether anything of the task whose id is the SQL expression `$task` still runs: an
/// envelope queued, pending or unresolved, or an open handoff.
macro_rules! busy_of {
    ($task:literal) => {
        concat!(
            "(EXISTS (SELECT 1 FROM envelopes WHERE task_id = ",
            $task,
            " AND state IN ('queued', 'pending', 'unresolved')) \
             OR EXISTS (SELECT 1 FROM handoffs WHERE task_id = ",
            $task,
            " AND state = 'open'))"
        )
    };
}

impl StoredTask {
    /// A row of [`task_columns!`], read in place.
    fn from_row(row: &rusqlite::Row) -> rusqlite::Result<Self> {
        Ok(Self {
            task_id: row.get("task_id")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            agent: row.get("agent")?,
            route: row.get("route")?,
            state: parse_state(row, "state")?,
            revision: row.get("revision")?,
            objective: row.get("objective")?,
            predecessor: row.get("predecessor")?,
            successor: row.get("successor")?,
            instruction_revision: row.get("instruction_revision")?,
            instruction_kind: row.get("instruction_kind")?,
            act_on: row.get("act_on")?,
            stop_requested_by: row.get("stop_requested_by")?,
            stop_requested_at: row.get("stop_requested_at")?,
            stopped_at: row.get("stopped_at")?,
            stop_reason: row.get("stop_reason")?,
            opened_at: row.get("opened_at")?,
            updated_at: row.get("updated_at")?,
            closed_at: row.get("closed_at")?,
        })
    }

    pub fn state(&self) -> TaskState {
        self.state
    }

    /// What admission needs to know of it.
    fn now(&self) -> TaskNow {
        let instruction_change = match (self.instruction_kind.as_deref(), self.instruction_revision) {
            (Some(kind), Some(revision)) => Some(InstructionChange {
                kind: if kind == "new_objective" { ChangeKind::NewObjective } else { ChangeKind::Correction },
                revision: to_u32(revision),
                act_on: self.act_on.clone().unwrap_or_default(),
            }),
            _ => None,
        };
        TaskNow {
            task_id: self.task_id.clone(),
            revision: to_u32(self.revision),
            state: self.state(),
            instruction_change,
        }
    }
}

/// One revision of a task, as `switchboard ledger task` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRevision {
    pub revision: i64,
    pub kind: String,
    pub source: String,
    pub actor: String,
    pub at: String,
    pub summary: String,
    pub text: Option<String>,
    pub envelope_trace_id: Option<String>,
    pub snapshot: String,
}

impl StoredRevision {
    /// A row of [`Ledger::task`]'s revisions, read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            revision: row.get("revision")?,
            kind: row.get("kind")?,
            source: row.get("source")?,
            actor: row.get("actor")?,
            at: row.get("at")?,
            summary: row.get("summary")?,
            text: row.get("text")?,
            envelope_trace_id: row.get("envelope_trace_id")?,
            snapshot: row.get("snapshot")?,
        })
    }
}

/// What a task has done and has running, at one moment: `/status`, and each revision's
/// snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskEffects {
    /// Confirmed sends: `op_…` and the Telegram message id.
    pub confirmed: Vec<(String, i64)>,
    /// Sends whose outcome is unknown and not yet reconciled: never retried.
    pub unresolved: Vec<String>,
    /// Open handoffs: `hof_…` and the agent working on it.
    pub open_handoffs: Vec<(String, String)>,
}

impl TaskEffects {
    fn to_json(&self) -> String {
        json!({
            "confirmed": self.confirmed.iter().map(|(op, message)| json!({"op_id": op, "message_id": message})).collect::<Vec<_>>(),
            "unresolved": self.unresolved,
            "open_handoffs": self.open_handoffs.iter().map(|(id, to)| json!({"handoff_id": id, "to": to})).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

/// What the switchboard does once a transaction that changed tasks has committed.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEffect {
    /// The bot owes a post in the conversation (recorded with the change): an
    /// acknowledgement, an answer to `/status`, or why nothing changed.
    Say(BotPost),
    /// A `pause` or `resume` notice to the agent, about its latest pending envelope of the
    /// task.
    Notice { agent: String, trace_id: String, kind: ChangeKind, task_id: String, revision: u32 },
    /// An envelope was queued for this agent (a child's revision envelope).
    Wake(String),
    /// A change was recorded (for the metrics).
    Recorded(ChangeKind),
}

/// A message the bot posts in a conversation on the switchboard's behalf.
#[derive(Debug, Clone, PartialEq)]
pub struct BotPost {
    /// The envelope it is about (its attempts are recorded against it, as audit).
    pub envelope_id: i64,
    pub trace_id: String,
    pub agent: String,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub text: String,
}

/// Who made a change, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Edit,
    Command,
    Agent,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Self::Edit => "edit",
            Self::Command => "command",
            Self::Agent => "agent",
        }
    }
}

/// What `revise_task` recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredRevision {
    pub task_id: String,
    pub revision: u32,
    pub kind: ChangeKind,
    /// The envelope to act on from now on (the declared message itself, unless the change
    /// closed the task's admission).
    pub act_on: String,
    /// What the agent should do next.
    pub next: String,
}

/// Why `revise_task` recorded nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeclareError {
    #[error("no pending envelope of this agent has trace id {0}; nothing changed")]
    NotPending(String),
    #[error("{0} belongs to no task (only messages of single-agent routes do); nothing changed")]
    NoTask(String),
    #[error("{0}; nothing changed")]
    NotNow(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// The envelope a change came with: turned into the task's `revision` envelope (a human
/// message or edit), or kept as it is and re-tagged (an agent's declaration about it).
#[derive(Debug, Clone)]
struct Carrier {
    id: i64,
    trace_id: String,
    message_id: Option<i64>,
    chat_id: i64,
    thread_id: Option<i64>,
    route: String,
    agent: String,
    /// Whether the carrier becomes a `revision` envelope (a human's command or edit).
    rewrite: bool,
}

/// The envelope a `revise_task` declaration is about.
#[derive(Debug)]
struct DeclaredFor {
    id: i64,
    task_id: Option<String>,
    revision: Option<i64>,
    chat_id: i64,
    thread_id: Option<i64>,
    route: Option<String>,
    text: Option<String>,
    message_id: i64,
}

/// A change to record.
#[derive(Debug, Clone)]
struct Change<'a> {
    kind: ChangeKind,
    text: Option<&'a str>,
    source: Source,
    actor: &'a str,
    summary: String,
}

// ---- intake ----

/// Whether a newly stored row is a human message of a single-agent conversation, which
/// belongs to a task.
fn belongs_to_a_task(routed: &RoutedEnvelope) -> bool {
    routed.state == EnvelopeState::Queued
        && routed.agent.is_some()
        && matches!(routed.envelope.kind, EnvelopeKind::Message | EnvelopeKind::EditedMessage)
}

/// The tasks of a batch's human messages, decided before its rows are inserted so that
/// each plain message is stored with its task in the batch's one insert: a conversation's
/// open task is read once per batch, not once per message. A conversation whose part of
/// the batch holds a command or an edit is left to [`take_in`], message by message, after
/// the insert (`later`), since each of those may change the task the next one joins.
#[derive(Debug, Default)]
pub(super) struct BatchTasks {
    /// Per row of the batch: the task and revision it is stored with.
    pub tags: Vec<Option<(String, i64)>>,
    /// Tasks the batch starts: the task id and the row that starts it.
    starts: Vec<(String, usize)>,
    /// Rows for [`take_in`], in order.
    later: Vec<usize>,
}

/// A conversation: chat, topic, agent.
type Conversation = (i64, Option<i64>, String);

/// Whether a human message is plainly work: not an edit and not a command. Work joins the
/// conversation's open task or starts one, whatever that task's state.
fn plain_work(routed: &RoutedEnvelope, bot_username: Option<&str>) -> bool {
    let e = &routed.envelope;
    let text = e.text.as_deref().unwrap_or_default();
    e.kind == EnvelopeKind::Message
        && revisions::parse_command(text, bot_username.unwrap_or_default()).is_none()
}

/// Plans [`BatchTasks`] for `batch`; reads each conversation's open task once (and marks
/// a finished one `done`).
pub(super) fn plan_batch(
    db: &rusqlite::Connection,
    batch: &[RoutedEnvelope],
    bot_username: Option<&str>,
) -> rusqlite::Result<BatchTasks> {
    let mut plan = BatchTasks { tags: vec![None; batch.len()], ..BatchTasks::default() };
    let mut current: HashMap<Conversation, (String, i64)> = HashMap::new();
    let mut one_by_one: HashSet<Conversation> = HashSet::new();
    for (index, routed) in batch.iter().enumerate() {
        let Some(agent) = routed.agent.as_ref().filter(|_| belongs_to_a_task(routed)) else { continue };
        let channel = routed.envelope.channel;
        let conversation: Conversation =
            (channel.chat_id, channel.thread_id.map(i64::from), agent.to_string());
        if one_by_one.contains(&conversation) || !plain_work(routed, bot_username) {
            one_by_one.insert(conversation);
            plan.later.push(index);
            continue;
        }
        if let Some(task) = current.get(&conversation) {
            plan.tags[index] = Some(task.clone());
            continue;
        }
        let (chat_id, thread_id, agent) = &conversation;
        let task = match latest_task(db, *chat_id, *thread_id, agent)? {
            // A message after `/cancel` is new work, not part of the task being stopped.
            Some((task_id, revision, TaskState::Open | TaskState::Paused)) => (task_id, revision),
            _ => {
                let task_id = new_task_id();
                plan.starts.push((task_id.clone(), index));
                (task_id, 1)
            }
        };
        plan.tags[index] = Some(task.clone());
        current.insert(conversation, task);
    }
    Ok(plan)
}

/// After the batch's insert (whose rows have the ids `first_id`, `first_id + 1`, … when
/// every row was new): records the tasks its plain messages start, then takes in its
/// commands and edits one by one. When a row of the batch was already stored (a
/// re-polled update), the plan may count on rows that were not inserted: every new human
/// row is then taken in one by one instead.
pub(super) fn record_batch_tasks(
    db: &rusqlite::Connection,
    batch: &[RoutedEnvelope],
    plan: &BatchTasks,
    new_rows: &[bool],
    first_id: i64,
    bot_username: Option<&str>,
) -> rusqlite::Result<Vec<TaskEffect>> {
    let mut effects = Vec::new();
    if !new_rows.iter().all(|new| *new) {
        for (routed, _) in
            batch.iter().zip(new_rows).filter(|(routed, new)| **new && belongs_to_a_task(routed))
        {
            execute_cached(
                db,
                "UPDATE envelopes SET task_id = NULL, revision = NULL WHERE trace_id = ?",
                rusqlite::params![routed.envelope.trace_id.as_str()],
            )?;
            effects.extend(take_in(db, routed, bot_username)?);
        }
        return Ok(effects);
    }
    for (task_id, index) in &plan.starts {
        let routed = &batch[*index];
        // Every row was new, so the batch's rows have consecutive ids from `first_id`.
        let id = first_id + i64::try_from(*index).unwrap_or(i64::MAX);
        let text = routed.envelope.text.clone().unwrap_or_else(|| routed.envelope.content());
        let carrier = carrier_of(routed, id);
        insert_task(db, task_id, &carrier, &text, None, Source::Command, &sender_of(routed))?;
    }
    for index in &plan.later {
        effects.extend(take_in(db, &batch[*index], bot_username)?);
    }
    Ok(effects)
}

fn new_task_id() -> String {
    format!("task_{}", random_suffix(8))
}

/// The sender as the lineage names them: @username, else their name.
fn sender_of(routed: &RoutedEnvelope) -> String {
    let sender = &routed.envelope.sender;
    sender.username.as_ref().map_or_else(|| sender.name.clone(), |u| format!("@{u}"))
}

fn carrier_of(routed: &RoutedEnvelope, id: i64) -> Carrier {
    let e = &routed.envelope;
    Carrier {
        id,
        trace_id: e.trace_id.to_string(),
        message_id: Some(i64::from(e.message_id)),
        chat_id: e.channel.chat_id,
        thread_id: e.channel.thread_id.map(i64::from),
        route: routed.route.as_ref().map(ToString::to_string).unwrap_or_default(),
        agent: routed.agent.as_ref().map(ToString::to_string).unwrap_or_default(),
        rewrite: true,
    }
}

/// Gives a newly stored human message its task, or applies the change it makes; inside the
/// batch's transaction. Returns what to do once it commits.
fn take_in(
    db: &rusqlite::Connection,
    routed: &RoutedEnvelope,
    bot_username: Option<&str>,
) -> rusqlite::Result<Vec<TaskEffect>> {
    let e = &routed.envelope;
    let Some(agent) = routed.agent.as_ref() else { return Ok(vec![]) };
    let id: i64 = query_row_cached(
        db,
        "SELECT id FROM envelopes WHERE trace_id = ?",
        rusqlite::params![e.trace_id.as_str()],
        |row| row.get(0),
    )?;
    let carrier = carrier_of(routed, id);
    let open = open_task(db, carrier.chat_id, carrier.thread_id, agent.as_str())?;
    let text = e.text.clone().unwrap_or_else(|| e.content());
    let update = match e.kind {
        EnvelopeKind::EditedMessage => HumanUpdate::Edit { message_id: e.message_id, text: &text },
        _ => HumanUpdate::Message { text: &text },
    };
    // Which messages carry the instruction matters to an edit only: a new message is
    // classified by its text.
    let open_view = match (&open, update) {
        (Some(task), HumanUpdate::Edit { .. }) => Some(open_view(db, task)?),
        (Some(task), HumanUpdate::Message { .. }) => Some(OpenTask {
            task_id: task.task_id.clone(),
            revision: to_u32(task.revision),
            state: task.state(),
            instruction_messages: Vec::new(),
        }),
        (None, _) => None,
    };
    let username = bot_username.unwrap_or_default();
    let meaning = revisions::classify(update, open_view.as_ref(), username);
    let who = sender_of(routed);
    match (meaning, open) {
        // A message after `/cancel` is new work, not part of the task being stopped.
        (Meaning::Work, Some(task)) if task.state() == TaskState::StopRequested => {
            start_task(db, &carrier, &text, None, Source::Command, &who)?;
            Ok(vec![])
        }
        (Meaning::Work, Some(task)) => {
            tag(db, id, &task.task_id, task.revision)?;
            Ok(vec![])
        }
        (Meaning::Work, None) => {
            let objective = match revisions::parse_command(&text, username) {
                // `/new <text>` with nothing open: the text is the objective.
                Some(revisions::Command::New(objective)) => objective,
                _ => text.clone(),
            };
            start_task(db, &carrier, &objective, None, Source::Command, &who)?;
            Ok(vec![])
        }
        (Meaning::Status, Some(task)) => {
            let status = status_text(db, &task)?;
            settle_carrier(db, &carrier, "switchboard: /status answered")?;
            Ok(vec![owe_post(db, &carrier, answer_key(&carrier), status)?])
        }
        // No open task: the most recent one, so a user who asked to stop hears that it did.
        (Meaning::Status, None) => {
            let latest = match latest_task(db, carrier.chat_id, carrier.thread_id, agent.as_str())? {
                Some((task_id, _, _)) => stored_task(db, &task_id)?,
                None => None,
            };
            let status = match latest {
                Some(task) => {
                    format!("No task is open here. The most recent one:\n{}", status_text(db, &task)?)
                }
                None => {
                    "No task here yet: nothing has been asked in this conversation; a message starts one."
                        .to_owned()
                }
            };
            settle_carrier(db, &carrier, "switchboard: /status answered")?;
            Ok(vec![owe_post(db, &carrier, answer_key(&carrier), status)?])
        }
        (Meaning::Ask(why), _) => {
            settle_carrier(db, &carrier, &format!("switchboard: nothing changed ({why})"))?;
            Ok(vec![owe_post(db, &carrier, answer_key(&carrier), format!("Nothing changed: {why}."))?])
        }
        (Meaning::Change { .. }, None) => {
            // `classify` asks when nothing is open; kept total all the same.
            settle_carrier(db, &carrier, "switchboard: nothing changed (no open task)")?;
            let text = "Nothing changed: there is no open task here.".to_owned();
            Ok(vec![owe_post(db, &carrier, answer_key(&carrier), text)?])
        }
        (Meaning::Change { kind, text: new_text }, Some(task)) => {
            let source = if e.kind == EnvelopeKind::EditedMessage { Source::Edit } else { Source::Command };
            let summary = match (kind, source) {
                (ChangeKind::Correction, _) => format!("{who} edited the instruction"),
                (_, _) => format!("{who} sent /{}", command_name(kind)),
            };
            let change = Change { kind, text: new_text.as_deref(), source, actor: &who, summary };
            apply_change(db, &task, &carrier, &change)
        }
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

/// The conversation's open task, if any (a finished one is closed on the way, see
/// [`latest_task`]). A paused or cancelled task stays open until it is resumed or stopped.
fn open_task(
    db: &rusqlite::Connection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> rusqlite::Result<Option<StoredTask>> {
    match latest_task(db, chat_id, thread_id, agent)? {
        Some((task_id, _, TaskState::Open | TaskState::Paused | TaskState::StopRequested)) => {
            stored_task(db, &task_id)
        }
        _ => Ok(None),
    }
}

/// The task `task_id`, read in place.
fn stored_task(db: &rusqlite::Connection, task_id: &str) -> rusqlite::Result<Option<StoredTask>> {
    let sql = concat!(task_select!(), "WHERE t.task_id = ?");
    query_row_cached(db, sql, rusqlite::params![task_id], StoredTask::from_row).optional()
}

/// `UPDATE tasks` that makes an `open` task with nothing left queued, pending or
/// unresolved and no open handoff `done` (`?1`: now); the caller adds `AND` which task.
/// An envelope whose reply's outcome is unknown (`unresolved`) keeps its task open: it is
/// not known to be done, and a correction must still reach it. A task that is not
/// finished is not written at all.
macro_rules! close_if_finished {
    () => {
        concat!(
            "UPDATE tasks SET state = 'done', closed_at = ?1, updated_at = ?1 WHERE state = 'open' AND NOT ",
            busy_of!("tasks.task_id"),
            " "
        )
    };
}

/// The conversation's latest task: its id, revision and state, once a finished `open` one
/// is marked `done`. This runs for every conversation a batch brings: a read, and a write
/// only when the task has just finished.
fn latest_task(
    db: &rusqlite::Connection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> rusqlite::Result<Option<(String, i64, TaskState)>> {
    let latest: Option<(i64, String, i64, TaskState)> = query_row_cached(
        db,
        "SELECT id, task_id, revision, state FROM tasks WHERE chat_id = ?1 AND agent = ?2 AND thread_id IS ?3 \
         ORDER BY id DESC LIMIT 1",
        rusqlite::params![chat_id, agent, thread_id],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, parse_state(row, "state")?)),
    )
    .optional()?;
    let Some((id, task_id, revision, mut state)) = latest else { return Ok(None) };
    if state == TaskState::Open
        && execute_cached(db, concat!(close_if_finished!(), "AND id = ?2"), rusqlite::params![now(), id])?
            == 1
    {
        state = TaskState::Done;
    }
    Ok(Some((task_id, revision, state)))
}

fn open_view(db: &rusqlite::Connection, task: &StoredTask) -> rusqlite::Result<OpenTask> {
    let messages: Vec<i64> = query_all_cached(
        db,
        "SELECT e.message_id FROM tasks t JOIN envelopes e ON e.id = t.first_envelope_id WHERE t.task_id = ?1 \
         UNION SELECT message_id FROM task_revisions WHERE task_id = ?1 AND message_id IS NOT NULL \
         AND kind IN ('correction', 'new_objective')",
        rusqlite::params![task.task_id],
        |row| row.get(0),
    )?;
    Ok(OpenTask {
        task_id: task.task_id.clone(),
        revision: to_u32(task.revision),
        state: task.state(),
        instruction_messages: messages.into_iter().filter_map(|m| i32::try_from(m).ok()).collect(),
    })
}

/// Starts a task with `carrier` as its first envelope (revision 1).
fn start_task(
    db: &rusqlite::Connection,
    carrier: &Carrier,
    objective: &str,
    predecessor: Option<&str>,
    source: Source,
    actor: &str,
) -> rusqlite::Result<String> {
    let task_id = new_task_id();
    insert_task(db, &task_id, carrier, objective, predecessor, source, actor)?;
    tag(db, carrier.id, &task_id, 1)?;
    Ok(task_id)
}

/// The task's row, which is also its revision 1 (who started it, how, with which
/// envelope); tagging that envelope is the caller's.
fn insert_task(
    db: &rusqlite::Connection,
    task_id: &str,
    carrier: &Carrier,
    objective: &str,
    predecessor: Option<&str>,
    source: Source,
    actor: &str,
) -> rusqlite::Result<()> {
    let at = now();
    let source = if predecessor.is_some() { source.as_str() } else { "message" };
    execute_cached(
        db,
        "INSERT INTO tasks (task_id, chat_id, thread_id, agent, route, state, revision, objective, first_envelope_id, \
         started_by, started_source, predecessor, opened_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, 'open', 1, ?, ?, ?, ?, ?, ?, ?)",
        rusqlite::params![
            task_id,
            carrier.chat_id,
            carrier.thread_id,
            carrier.agent,
            carrier.route,
            objective,
            carrier.id,
            actor,
            source,
            predecessor,
            at,
            at,
        ],
    )?;
    Ok(())
}

/// Records the task and revision an envelope was made under.
pub(super) fn tag(
    db: &rusqlite::Connection,
    envelope_id: i64,
    task_id: &str,
    revision: i64,
) -> rusqlite::Result<()> {
    execute_cached(
        db,
        "UPDATE envelopes SET task_id = ?, revision = ? WHERE id = ?",
        rusqlite::params![task_id, revision, envelope_id],
    )?;
    Ok(())
}

/// The carrier of a change, in one statement: the task and revision it now belongs to, the
/// change's meta, and — for a human's command or edit (`content`) — its new life as the
/// `revision` envelope the agent acts on.
fn carry_change(
    db: &rusqlite::Connection,
    carrier: &Carrier,
    task_id: &str,
    revision: i64,
    meta: &serde_json::Value,
    content: Option<String>,
) -> rusqlite::Result<()> {
    execute_cached(
        db,
        "UPDATE envelopes SET task_id = ?1, revision = ?2, meta = ?3, \
         kind = CASE WHEN ?4 IS NULL THEN kind ELSE 'revision' END, content = COALESCE(?4, content) \
         WHERE id = ?5",
        rusqlite::params![task_id, revision, meta.to_string(), content, carrier.id],
    )?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn record_revision(
    db: &rusqlite::Connection,
    task_id: &str,
    revision: i64,
    kind: &str,
    source: &str,
    actor: &str,
    summary: &str,
    text: Option<&str>,
    carrier: &Carrier,
    effects: &TaskEffects,
) -> rusqlite::Result<()> {
    execute_cached(
        db,
        "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, text, message_id, \
         envelope_id, snapshot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rusqlite::params![
            task_id,
            revision,
            kind,
            source,
            actor,
            now(),
            summary,
            text,
            carrier.message_id,
            carrier.id,
            effects.to_json(),
        ],
    )?;
    Ok(())
}

/// A handled command or edit: acked by the switchboard, never work for the agent.
fn settle_carrier(db: &rusqlite::Connection, carrier: &Carrier, note: &str) -> rusqlite::Result<()> {
    transition_in(
        db,
        carrier.id,
        &[EnvelopeState::Queued, EnvelopeState::Pending],
        EnvelopeState::Acked,
        "switchboard",
        Some(note),
    )?;
    Ok(())
}

/// What the bot says about a change or a question, owed in the same transaction: a post
/// in `room_posts` (no cascade), which the room driver makes once and never twice, across
/// restarts, like a room's own posts. `key` names it among the switchboard's posts.
fn owe_post(
    db: &rusqlite::Connection,
    carrier: &Carrier,
    key: String,
    text: String,
) -> rusqlite::Result<TaskEffect> {
    let post = BotPost {
        envelope_id: carrier.id,
        trace_id: carrier.trace_id.clone(),
        agent: carrier.agent.clone(),
        route: carrier.route.clone(),
        chat_id: carrier.chat_id,
        thread_id: carrier.thread_id,
        reply_to_message_id: carrier.message_id.filter(|_| carrier.rewrite),
        text,
    };
    execute_cached(
        db,
        "INSERT INTO room_posts (key, cascade_id, envelope_id, route, chat_id, thread_id, reply_to_message_id, text, \
         state, created_at) VALUES (?, NULL, ?, ?, ?, ?, ?, ?, 'owed', ?)",
        rusqlite::params![
            key,
            post.envelope_id,
            post.route,
            post.chat_id,
            post.thread_id,
            post.reply_to_message_id,
            post.text,
            now(),
        ],
    )?;
    Ok(TaskEffect::Say(post))
}

/// The key of the bot's answer to a message (a `/status`, or why nothing changed).
fn answer_key(carrier: &Carrier) -> String {
    format!("{}/answer", carrier.trace_id)
}

// ---- changes ----

/// Records `change` as the task's next revision and does what it means to the task's
/// envelopes and handoffs, in the caller's transaction.
fn apply_change(
    db: &rusqlite::Connection,
    task: &StoredTask,
    carrier: &Carrier,
    change: &Change<'_>,
) -> rusqlite::Result<Vec<TaskEffect>> {
    let revision = task.revision + 1;
    let at = now();
    let snapshot = effects_of(db, &task.task_id)?;
    let mut effects = vec![TaskEffect::Recorded(change.kind)];
    let kind = change.kind;
    let old_text = last_instruction(db, &task.task_id, carrier.message_id.filter(|_| carrier.rewrite))?;
    // A change of instruction or a cancel retires what was made under older revisions.
    let superseded_handoffs = if kind.supersedes() || kind == ChangeKind::Cancel {
        supersede(db, task, revision, carrier, kind, &mut effects)?
    } else {
        Vec::new()
    };
    let handoff_list = superseded_handoffs.join(", ");
    record_revision(
        db,
        &task.task_id,
        revision,
        kind.as_str(),
        change.source.as_str(),
        change.actor,
        &change.summary,
        change.text,
        carrier,
        &snapshot,
    )?;
    let task_id = &task.task_id;
    let ack = match kind {
        ChangeKind::Correction => {
            let new_text = change.text.unwrap_or_default();
            execute_cached(
                db,
                "UPDATE tasks SET revision = ?, instruction_revision = ?, instruction_kind = 'correction', \
                 act_on_envelope_id = ?, updated_at = ? WHERE task_id = ?",
                rusqlite::params![revision, revision, carrier.id, at, task_id],
            )?;
            let meta = json!({
                "change": "correction",
                "text": new_text,
                "old_text": old_text.clone().unwrap_or_default(),
                "superseded_handoffs": handoff_list,
            });
            let content = carrier.rewrite.then(|| {
                revision_content(
                    task_id,
                    revision,
                    &format!(
                        "correction. The instruction is now:\n{new_text}\n\nIt was:\n{}",
                        old_text.as_deref().unwrap_or("(unknown)")
                    ),
                    &superseded_handoffs,
                    "Act on this envelope: replies to the task's older envelopes are refused (superseded).",
                )
            });
            carry_change(db, carrier, task_id, revision, &meta, content)?;
            format!("{task_id} revision {revision}: correction accepted")
        }
        ChangeKind::NewObjective => {
            let objective = change.text.unwrap_or_default();
            let successor = new_task_id();
            insert_task(db, &successor, carrier, objective, Some(task_id), change.source, change.actor)?;
            execute_cached(
                db,
                "UPDATE tasks SET state = 'replaced', revision = ?, successor = ?, instruction_revision = ?, \
                 instruction_kind = 'new_objective', act_on_envelope_id = ?, updated_at = ?, closed_at = ? \
                 WHERE task_id = ?",
                rusqlite::params![revision, successor, revision, carrier.id, at, at, task_id],
            )?;
            let meta = json!({
                "change": "new_objective",
                "text": objective,
                "predecessor": task_id,
                "superseded_handoffs": handoff_list,
            });
            let content = carrier.rewrite.then(|| {
                revision_content(
                    &successor,
                    1,
                    &format!("new objective, replacing {task_id}:\n{objective}"),
                    &superseded_handoffs,
                    &format!("Work on this now; everything of {task_id} is refused (superseded)."),
                )
            });
            carry_change(db, carrier, &successor, 1, &meta, content)?;
            format!("{task_id} revision {revision}: new objective accepted; it continues as {successor}")
        }
        ChangeKind::Pause | ChangeKind::Resume => {
            let state = if kind == ChangeKind::Pause { "paused" } else { "open" };
            execute_cached(
                db,
                "UPDATE tasks SET state = ?, revision = ?, updated_at = ? WHERE task_id = ?",
                rusqlite::params![state, revision, at, task_id],
            )?;
            settle_carrier(db, carrier, &format!("switchboard: {task_id} revision {revision} ({kind})"))?;
            if let Some(about) = latest_pending(db, task_id, carrier.id)? {
                effects.push(TaskEffect::Notice {
                    agent: task.agent.clone(),
                    trace_id: about,
                    kind,
                    task_id: task_id.clone(),
                    revision: to_u32(revision),
                });
            }
            if kind == ChangeKind::Pause {
                format!("{task_id} revision {revision}: paused; nothing of it is sent until /resume")
            } else {
                format!("{task_id} revision {revision}: resumed")
            }
        }
        ChangeKind::Cancel => {
            execute_cached(
                db,
                "UPDATE tasks SET state = 'stop_requested', revision = ?, cancel_envelope_id = ?, \
                 stop_requested_by = ?, stop_requested_at = ?, updated_at = ? WHERE task_id = ?",
                rusqlite::params![revision, carrier.id, change.actor, at, at, task_id],
            )?;
            let meta = json!({ "change": "cancel", "superseded_handoffs": handoff_list });
            let content = carrier.rewrite.then(|| {
                revision_content(
                    task_id,
                    revision,
                    &format!("cancelled by {}.", change.actor),
                    &superseded_handoffs,
                    "Stop working on it, then ack this envelope: the task counts as stopped only once you do. \
                     Nothing more of it is sent.",
                )
            });
            carry_change(db, carrier, task_id, revision, &meta, content)?;
            format!(
                "{task_id} revision {revision}: cancel accepted; stop requested (it is stopped once the agent confirms)"
            )
        }
    };
    let key = format!("{}/r{revision}", task.task_id);
    effects.push(owe_post(db, carrier, key, ack)?);
    Ok(effects)
}

fn revision_content(task_id: &str, revision: i64, what: &str, handoffs: &[String], then: &str) -> String {
    let mut content = format!("{task_id} revision {revision}: {what}");
    if !handoffs.is_empty() {
        content.push_str(&format!(
            "\n\nHandoffs made for the old instruction no longer stand (their answers are refused): {}. \
             Send a follow-up (followup: true, intent: \"replaces\") if the new instruction still needs them.",
            handoffs.join(", ")
        ));
    }
    content.push_str("\n\n");
    content.push_str(then);
    content
}

/// The instruction as it stood: the text of `message_id`'s latest correction (an edit of
/// it), or the task's latest correction, else its objective.
fn last_instruction(
    db: &rusqlite::Connection,
    task_id: &str,
    message_id: Option<i64>,
) -> rusqlite::Result<Option<String>> {
    query_row_cached(
        db,
        "SELECT COALESCE((SELECT text FROM task_revisions WHERE task_id = ?1 AND text IS NOT NULL \
         AND kind = 'correction' AND (?2 IS NULL OR message_id = ?2) ORDER BY id DESC LIMIT 1), \
         (SELECT objective FROM tasks WHERE task_id = ?1))",
        rusqlite::params![task_id, message_id],
        |row| row.get::<_, Option<String>>(0),
    )
    .optional()
    .map(Option::flatten)
}

/// The task's queued and pending envelopes made under revisions before `revision` become
/// `superseded` (the carrier excepted), and so do its open handoffs, whose children are
/// sent a `revision` envelope each. Returns the superseded handoffs' ids.
fn supersede(
    db: &rusqlite::Connection,
    task: &StoredTask,
    revision: i64,
    carrier: &Carrier,
    kind: ChangeKind,
    effects: &mut Vec<TaskEffect>,
) -> rusqlite::Result<Vec<String>> {
    let task_id = &task.task_id;
    let stale: Vec<i64> = query_all_cached(
        db,
        "SELECT id FROM envelopes WHERE task_id = ? AND revision < ? AND state IN ('queued', 'pending') \
         AND id <> ?",
        rusqlite::params![task_id, revision, carrier.id],
        |row| row.get(0),
    )?;
    let reason = format!("{task_id} revision {revision} ({kind}) superseded it");
    for id in stale {
        let from = [EnvelopeState::Queued, EnvelopeState::Pending];
        transition_in(db, id, &from, EnvelopeState::Superseded, "switchboard", Some(&reason))?;
    }
    let handoffs: Vec<(i64, String, String, String, i64)> = query_all_cached(
        db,
        "SELECT id, handoff_id, to_agent, from_agent, envelope_id FROM handoffs WHERE task_id = ? \
         AND state = 'open' AND revision < ? ORDER BY id",
        rusqlite::params![task_id, revision],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
    )?;
    let at = now();
    let mut superseded = Vec::new();
    for (id, handoff_id, to_agent, from_agent, instruction) in handoffs {
        execute_cached(
            db,
            "UPDATE handoffs SET state = 'superseded', closed_at = ?, note = ? WHERE id = ?",
            rusqlite::params![at, reason, id],
        )?;
        let from = [EnvelopeState::Queued, EnvelopeState::Pending];
        transition_in(db, instruction, &from, EnvelopeState::Superseded, "switchboard", Some(&reason))?;
        let content = format!(
            "{handoff_id} from '{from_agent}' no longer stands: {task_id} changed ({kind}, revision {revision}). \
             Stop working on it; an answer to it would be refused and kept only as a late result. \
             Ack this envelope; it has no reply."
        );
        let meta = json!({ "change": kind.as_str(), "handoff_id": handoff_id, "superseded": "true" });
        let trace_id = TraceId::generate().to_string();
        execute_cached(
            db,
            "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
             sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, \
             agent, state, state_changed_at, task_id, revision, meta) \
             VALUES (?, NULL, 'revision', 0, NULL, 'agent', NULL, 0, NULL, NULL, 'switchboard', NULL, '[]', ?, ?, ?, \
             ?, ?, 'queued', ?, ?, ?, ?)",
            rusqlite::params![
                trace_id,
                content,
                at,
                at,
                carrier.route,
                to_agent,
                at,
                task_id,
                revision,
                meta.to_string()
            ],
        )?;
        effects.push(TaskEffect::Wake(to_agent));
        superseded.push(handoff_id);
    }
    Ok(superseded)
}

fn latest_pending(db: &rusqlite::Connection, task_id: &str, except: i64) -> rusqlite::Result<Option<String>> {
    query_row_cached(
        db,
        "SELECT trace_id FROM envelopes WHERE task_id = ? AND state = 'pending' AND id <> ? ORDER BY id DESC LIMIT 1",
        rusqlite::params![task_id, except],
        |row| row.get(0),
    )
    .optional()
}

/// Confirmed sends, unresolved attempts and open handoffs of a task.
fn effects_of(db: &rusqlite::Connection, task_id: &str) -> rusqlite::Result<TaskEffects> {
    let confirmed = query_all_cached(
        db,
        "SELECT a.op_id, a.telegram_message_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
         WHERE e.task_id = ? AND a.purpose = 'reply' AND a.outcome = 'sent' ORDER BY a.id",
        [task_id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    let unresolved = query_all_cached(
        db,
        "SELECT a.op_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
         WHERE e.task_id = ? AND a.purpose = 'reply' AND a.outcome IN ('unknown', 'in_flight') \
         AND a.reconciled_outcome IS NULL ORDER BY a.id",
        [task_id],
        |row| row.get(0),
    )?;
    let open_handoffs = query_all_cached(
        db,
        "SELECT handoff_id, to_agent FROM handoffs WHERE task_id = ? AND state = 'open' ORDER BY id",
        [task_id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok(TaskEffects { confirmed, unresolved, open_handoffs })
}

/// The stop reason the `task_stopped_on_cancel_ack` trigger (migration 0006) records when
/// the agent acks the cancel envelope; an operator's stop carries the operator's reason.
const AGENT_CONFIRMED_STOP: &str = "the agent acknowledged the cancel";

/// What `/status` answers.
fn status_text(db: &rusqlite::Connection, task: &StoredTask) -> rusqlite::Result<String> {
    let effects = effects_of(db, &task.task_id)?;
    Ok(describe(task, &effects))
}

/// A task in a few lines: where it stands and what it has done.
pub fn describe(task: &StoredTask, effects: &TaskEffects) -> String {
    let mut lines = vec![format!("{} (revision {}): {}", task.task_id, task.revision, task.state)];
    lines.push(format!("objective: {}", one_line(&task.objective)));
    match task.state() {
        TaskState::StopRequested => lines.push(format!(
            "stop requested by {} at {}: not stopped yet (the agent has not confirmed)",
            task.stop_requested_by.as_deref().unwrap_or("?"),
            task.stop_requested_at.as_deref().unwrap_or("?")
        )),
        TaskState::Stopped => {
            let reason = task.stop_reason.as_deref().unwrap_or_default();
            let by = if reason == AGENT_CONFIRMED_STOP {
                format!("agent '{}', which acknowledged the cancel", task.agent)
            } else {
                format!("an operator (switchboard ledger task --stopped): {reason}")
            };
            lines.push(format!(
                "stop requested by {} at {}; stopped at {}, confirmed by {by}",
                task.stop_requested_by.as_deref().unwrap_or("?"),
                task.stop_requested_at.as_deref().unwrap_or("?"),
                task.stopped_at.as_deref().unwrap_or("?"),
            ));
        }
        TaskState::Done => lines.push(format!(
            "done at {}: every message of it was answered or handled, and no handoff of it is open",
            task.closed_at.as_deref().unwrap_or("?")
        )),
        TaskState::Replaced => {
            lines
                .push(format!("replaced at {} by a new objective", task.closed_at.as_deref().unwrap_or("?")));
        }
        TaskState::Open | TaskState::Paused => {}
    }
    let confirmed: Vec<String> =
        effects.confirmed.iter().map(|(op, m)| format!("{op} (message {m})")).collect();
    lines.push(format!("confirmed sends: {}", list_or_none(&confirmed)));
    lines.push(format!("unresolved attempts (never retried): {}", list_or_none(&effects.unresolved)));
    let handoffs: Vec<String> =
        effects.open_handoffs.iter().map(|(id, to)| format!("{id} to {to}")).collect();
    lines.push(format!("open handoffs: {}", list_or_none(&handoffs)));
    if let Some(predecessor) = &task.predecessor {
        lines.push(format!("replaces: {predecessor}"));
    }
    if let Some(successor) = &task.successor {
        lines.push(format!("replaced by: {successor}"));
    }
    lines.join("\n")
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none".to_owned() } else { items.join(", ") }
}

fn one_line(text: &str) -> String {
    let line: String = text.chars().take(120).collect::<String>().replace('\n', " ");
    if text.chars().count() > 120 { format!("{line}…") } else { line }
}

// ---- admission ----

/// Whether an outbound action made for `envelope_id` may go out now (DESIGN.md §11), read
/// inside the caller's transaction, so it is decided in the same serialised order as the
/// changes. An envelope of no task is always admitted.
pub(super) fn admission_in(
    db: &rusqlite::Connection,
    envelope_id: i64,
) -> rusqlite::Result<Result<(), Refusal>> {
    let sql = concat!(
        "SELECT e.revision AS acted_on, ",
        task_columns!(),
        task_from!(),
        "JOIN envelopes e ON e.task_id = t.task_id WHERE e.id = ?"
    );
    let row: Option<ActedFor> = query_row_cached(db, sql, rusqlite::params![envelope_id], |row| {
        Ok(ActedFor { acted_on: row.get("acted_on")?, task: StoredTask::from_row(row)? })
    })
    .optional()?;
    Ok(match row {
        Some(ActedFor { acted_on, task }) => revisions::admit(to_u32(acted_on), &task.now()),
        // An envelope of no task.
        None => Ok(()),
    })
}

/// An envelope's revision with its task.
#[derive(Debug)]
struct ActedFor {
    acted_on: i64,
    task: StoredTask,
}

impl Ledger {
    /// [`admission_in`] on its own, for a tool's early answer; the check that counts is
    /// made again in the transaction that records the action.
    pub async fn admission(&self, envelope_id: i64) -> LedgerResult<Result<(), Refusal>> {
        self.read_in_place(|db| admission_in(db, envelope_id)).await
    }

    /// `revise_task`: the agent declares that its pending envelope `trace_id` changes its
    /// task. Recorded like a command, in one transaction.
    pub async fn declare_revision(
        &self,
        agent: &AgentName,
        trace_id: &str,
        kind: ChangeKind,
        summary: &str,
    ) -> Result<(DeclaredRevision, Vec<TaskEffect>), DeclareTaskError> {
        // A declaration refused commits the transaction with nothing written in it.
        let recorded = self
            .write_in_place(|db| {
                let row = query_row_cached(
                    db,
                    "SELECT id, task_id, revision, chat_id, thread_id, route, text, message_id FROM envelopes \
                     WHERE trace_id = ? AND agent = ? AND state = 'pending'",
                    rusqlite::params![trace_id, agent.as_str()],
                    |row| {
                        Ok(DeclaredFor {
                            id: row.get("id")?,
                            task_id: row.get("task_id")?,
                            revision: row.get("revision")?,
                            chat_id: row.get("chat_id")?,
                            thread_id: row.get("thread_id")?,
                            route: row.get("route")?,
                            text: row.get("text")?,
                            message_id: row.get("message_id")?,
                        })
                    },
                )
                .optional()?;
                let Some(DeclaredFor { id, task_id, revision, chat_id, thread_id, route, text, message_id }) = row
                else {
                    return Ok(Err(DeclareError::NotPending(trace_id.to_owned())));
                };
                let (Some(task_id), Some(revision)) = (task_id, revision) else {
                    return Ok(Err(DeclareError::NoTask(trace_id.to_owned())));
                };
                // A task is written with the envelope that starts it: one missing is an error.
                let task = stored_task(db, &task_id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                // The declaration is itself an action for that envelope: a superseded or
                // cancelled one cannot change the task.
                match (kind, revisions::admit(to_u32(revision), &task.now())) {
                    (_, Ok(())) => {}
                    (ChangeKind::Cancel, Err(Refusal::Paused { .. })) => {}
                    (_, Err(refusal)) => return Ok(Err(DeclareError::Refused(refusal))),
                }
                if kind == ChangeKind::Pause && task.state() != TaskState::Open {
                    return Ok(Err(DeclareError::NotNow(format!("{task_id} is {}", task.state))));
                }
                let carrier = Carrier {
                    id,
                    trace_id: trace_id.to_owned(),
                    message_id: Some(message_id),
                    chat_id,
                    thread_id,
                    route: route.unwrap_or_default(),
                    agent: agent.to_string(),
                    rewrite: false,
                };
                let actor = format!("agent:{agent}");
                let change = Change {
                    kind,
                    text: text.as_deref(),
                    source: Source::Agent,
                    actor: &actor,
                    summary: if summary.trim().is_empty() {
                        format!("{actor} declared a {kind}")
                    } else {
                        summary.to_owned()
                    },
                };
                let effects = apply_change(db, &task, &carrier, &change)?;
                let now_task: String = query_row_cached(
                    db,
                    "SELECT task_id FROM envelopes WHERE id = ?",
                    rusqlite::params![id],
                    |row| row.get(0),
                )?;
                Ok(Ok((task, effects, now_task)))
            })
            .await?;
        let (task, effects, now_task) = recorded?;
        let next = match kind {
            ChangeKind::Correction => format!("act on {trace_id}: it carries the corrected instruction"),
            ChangeKind::NewObjective => format!("act on {trace_id}: it starts {now_task}"),
            ChangeKind::Pause => {
                "the task is paused: nothing of it is sent until the user resumes it".to_owned()
            }
            ChangeKind::Resume => "the task runs again".to_owned(),
            ChangeKind::Cancel => {
                format!("stop working on the task, then ack {trace_id}: it is stopped once you do")
            }
        };
        // A new objective starts the successor at revision 1; any other change is the
        // task's next revision.
        let revision = if kind == ChangeKind::NewObjective { 1 } else { to_u32(task.revision + 1) };
        let declared =
            DeclaredRevision { task_id: now_task, revision, kind, act_on: trace_id.to_owned(), next };
        Ok((declared, effects))
    }

    /// A task's state as stored (`open`, `paused`, `stop_requested`, …).
    pub async fn task_state(&self, task_id: &str) -> LedgerResult<Option<String>> {
        self.read_in_place(|db| {
            query_row_cached(db, "SELECT state FROM tasks WHERE task_id = ?", [task_id], |row| row.get(0))
                .optional()
        })
        .await
    }

    /// A task and its revisions, oldest first.
    pub async fn task(
        &self,
        task_id: &str,
    ) -> LedgerResult<Option<(StoredTask, Vec<StoredRevision>, TaskEffects)>> {
        // A task that has finished says so, as it would to the next message.
        self.execute_in_place(concat!(close_if_finished!(), "AND task_id = ?2"), (now(), task_id)).await?;
        self.read_in_place(|db| {
            let Some(task) = stored_task(db, task_id)? else {
                return Ok(None);
            };
            // Revision 1 is the task itself; the changes follow.
            let revisions = query_all_cached(
                db,
                "SELECT 1 AS revision, 'start' AS kind, t.started_source AS source, t.started_by AS actor, \
                 t.opened_at AS at, CASE WHEN t.predecessor IS NULL THEN t.started_by || ' started it' \
                 ELSE t.started_by || ' replaced ' || t.predecessor || ' with a new objective' END AS summary, \
                 t.objective AS text, e.trace_id AS envelope_trace_id, '{}' AS snapshot, 0 AS position \
                 FROM tasks t JOIN envelopes e ON e.id = t.first_envelope_id WHERE t.task_id = ?1 \
                 UNION ALL \
                 SELECT r.revision, r.kind, r.source, r.actor, r.at, r.summary, r.text, e.trace_id, r.snapshot, \
                 r.id FROM task_revisions r LEFT JOIN envelopes e ON e.id = r.envelope_id WHERE r.task_id = ?1 \
                 ORDER BY position",
                [task_id],
                StoredRevision::from_row,
            )?;
            Ok(Some((task, revisions, effects_of(db, task_id)?)))
        })
        .await
    }

    /// `switchboard ledger task ID --stopped --reason …`: an operator confirms that a
    /// cancelled task has stopped. Only a task whose stop was requested can be.
    pub async fn mark_task_stopped(&self, task_id: &str, reason: &str) -> Result<(), DeclareTaskError> {
        // A refusal commits the transaction with nothing written in it.
        let marked = self
            .write_in_place(|db| {
                let Some(task) = stored_task(db, task_id)? else {
                    return Ok(Err(DeclareError::NotNow(format!("no task has id {task_id}"))));
                };
                if task.state() != TaskState::StopRequested {
                    return Ok(Err(DeclareError::NotNow(format!(
                        "{task_id} is {}, not stop_requested: only a cancelled task can be marked stopped",
                        task.state
                    ))));
                }
                let at = now();
                execute_cached(
                    db,
                    "UPDATE tasks SET state = 'stopped', stopped_at = ?, stop_reason = ?, updated_at = ?, closed_at = ? \
                     WHERE task_id = ?",
                    rusqlite::params![at, reason, at, at, task_id],
                )?;
                let effects = effects_of(db, task_id)?;
                execute_cached(
                    db,
                    "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, snapshot) \
                     VALUES (?, ?, 'stopped', 'operator', 'operator', ?, ?, ?)",
                    rusqlite::params![
                        task_id,
                        task.revision,
                        at,
                        format!("an operator confirmed it stopped: {reason}"),
                        effects.to_json(),
                    ],
                )?;
                Ok(Ok(()))
            })
            .await?;
        Ok(marked?)
    }
}

/// [`DeclareError`] or the ledger failing.
#[derive(Debug, thiserror::Error)]
pub enum DeclareTaskError {
    #[error(transparent)]
    Declined(#[from] DeclareError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A task's state column, read strictly: a name no state has is an error (logged with the
/// row's task id), never a task read as open.
fn parse_state(row: &rusqlite::Row<'_>, column: &str) -> rusqlite::Result<TaskState> {
    let name: String = row.get(column)?;
    TaskState::parse(&name).ok_or_else(|| {
        let task_id = row.get::<_, String>("task_id").unwrap_or_default();
        tracing::error!(task_id, state = %name, "a task in the ledger has a state this switchboard does not know");
        rusqlite::Error::FromSqlConversionFailure(
            row.as_ref().column_index(column).unwrap_or_default(),
            rusqlite::types::Type::Text,
            format!("unknown task state {name:?}").into(),
        )
    })
}

fn to_u32(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
