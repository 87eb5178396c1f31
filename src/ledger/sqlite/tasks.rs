//! Tasks and revisions (DESIGN.md §11), as the ledger keeps them: which task each human
//! message belongs to, each change as the task's next revision together with what it does
//! to the task's envelopes and handoffs, and admission of outbound actions — all inside
//! the write transactions that record them, so a change and an action are serialised and
//! a correction that lands while a reply is being resolved cannot let the old reply out.
//!
//! The decisions are pure and live in `rules::revisions` (what a change writes: its
//! `plan`; what is said about it: its `texts`); this module reads the plain data they
//! need and makes the writes they decide.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::columns::{optional_timestamp, timestamp_column};
use super::envelopes::transition_in;
use super::in_place::{execute_cached, query_all_cached, query_row_cached};
use super::{LedgerResult, SqliteLedger, now};
use crate::domain::{
    BotPost, DeclareError, DeclareTaskError, DeclaredRevision, EnvelopeKind, EnvelopeState, RoutedEnvelope,
    StoredRevision, TaskEffect,
};
use crate::ids::{AgentName, TaskId, TraceId};
use crate::ledger::columns::{busy_of, task_columns, task_from};
use crate::ledger::prelude::*;
use crate::ledger::task_rows::{
    self, Carrier, Conversation, Declared, DeclaredAbout, admit_declaration, answer_key, belongs_to_a_task,
    carrier_of, declared_change, declared_revision, nothing_changed_is_said, plain_work, sender_of,
    snapshot_json,
};
use crate::rules::revisions::plan::{
    self, CarrierWrite, Change, ChangeContext, ChangePlan, MessagePlan, OpenHandoff, Source, TaskWrite,
};
use crate::rules::revisions::task::to_u32;
use crate::rules::revisions::{
    self, ChangeKind, HumanUpdate, OpenTask, Refusal, Task, TaskEffects, TaskState, texts,
};

macro_rules! task_select {
    () => {
        concat!("SELECT ", task_columns!(), task_from!())
    };
}

/// A [`Task`] from a row of [`task_columns!`], read in place.
fn task_from_row(row: &rusqlite::Row) -> rusqlite::Result<Task> {
    Ok(Task {
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
        stop_requested_at: optional_timestamp(row, "stop_requested_at")?,
        stopped_at: optional_timestamp(row, "stopped_at")?,
        stop_reason: row.get("stop_reason")?,
        opened_at: timestamp_column(row, "opened_at")?,
        updated_at: timestamp_column(row, "updated_at")?,
        closed_at: optional_timestamp(row, "closed_at")?,
    })
}

impl StoredRevision {
    /// A row of [`SqliteLedger::task`]'s revisions, read in place.
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

/// The envelope a `revise_task` declaration is about.
#[derive(Debug)]
struct DeclaredFor {
    id: i64,
    kind: String,
    task_id: Option<String>,
    revision: Option<i64>,
    chat_id: i64,
    thread_id: Option<i64>,
    route: Option<String>,
    text: Option<String>,
    message_id: i64,
}

// ---- intake ----

/// The tasks of a batch's human messages, decided before its rows are inserted so that
/// each plain message is stored with its task in the batch's one insert: a conversation's
/// open task is read once per batch, not once per message. A conversation whose part of
/// the batch holds a command or an edit is left to [`take_in`], message by message, after
/// the insert (`later`), since each of those may change the task the next one joins.
#[derive(Debug, Default)]
pub(super) struct BatchTasks {
    /// Per row of the batch: the task and revision it is stored with.
    pub tags: Vec<Option<(TaskId, i64)>>,
    /// Tasks the batch starts: the task id and the row that starts it.
    starts: Vec<(TaskId, usize)>,
    /// Rows for [`take_in`], in order.
    later: Vec<usize>,
}

/// Plans [`BatchTasks`] for `batch`; reads each conversation's open task once (and marks
/// a finished one `done`).
pub(super) fn plan_batch(
    db: &rusqlite::Connection,
    batch: &[RoutedEnvelope],
    bot_username: Option<&str>,
) -> rusqlite::Result<BatchTasks> {
    let mut plan = BatchTasks { tags: vec![None; batch.len()], ..BatchTasks::default() };
    let mut current: HashMap<Conversation, (TaskId, i64)> = HashMap::new();
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
                let task_id = TaskId::generate();
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
    let mut carrier = carrier_of(routed, id);
    let text = e.text.clone().unwrap_or_else(|| e.content());
    let update = match e.kind {
        EnvelopeKind::EditedMessage => HumanUpdate::Edit { message_id: e.message_id, text: &text },
        _ => HumanUpdate::Message { text: &text },
    };
    let username = bot_username.unwrap_or_default();
    let mut open = open_task(db, carrier.chat_id, carrier.thread_id, agent.as_str())?;
    let mut open_view = match &open {
        Some(task) => Some(view_of(db, task, update)?),
        None => None,
    };
    let mut effects = Vec::new();
    if !plain_work(routed, bot_username)
        && let Some(other) =
            open_task_of_another_agent(db, carrier.chat_id, carrier.thread_id, agent.as_str())?
    {
        let other_view = view_of(db, &other, update)?;
        if revisions::for_another_agents_task(update, open_view.as_ref(), &other_view, username) {
            execute_cached(
                db,
                "UPDATE envelopes SET agent = ? WHERE id = ?",
                rusqlite::params![other.agent, carrier.id],
            )?;
            carrier.agent.clone_from(&other.agent);
            effects.push(TaskEffect::Wake(other.agent.clone()));
            (open, open_view) = (Some(other), Some(other_view));
        }
    }
    let meaning = revisions::classify(update, open_view.as_ref(), username);
    let who = sender_of(routed);
    let planned = match (plan::plan_message(meaning, open.as_ref().map(Task::state), &text, username), open) {
        (MessagePlan::Start { objective }, _) => {
            start_task(db, &carrier, &objective, None, Source::Command, &who)?;
            Ok(vec![])
        }
        (MessagePlan::Join, Some(task)) => {
            tag(db, id, &task.task_id, task.revision)?;
            Ok(vec![])
        }
        (MessagePlan::Status, Some(task)) => {
            let status = texts::describe(&task, &effects_of(db, &task.task_id)?);
            answer(db, &carrier, texts::STATUS_ANSWERED, status)
        }
        // No open task: the most recent one, so a user who asked to stop hears that it did.
        (MessagePlan::Status, None) => {
            let latest = match latest_task(db, carrier.chat_id, carrier.thread_id, agent.as_str())? {
                Some((task_id, _, _)) => stored_task(db, &task_id)?,
                None => None,
            };
            let latest = match latest {
                Some(task) => Some((effects_of(db, &task.task_id)?, task)),
                None => None,
            };
            let status =
                texts::status_without_open_task(latest.as_ref().map(|(effects, task)| (task, effects)));
            answer(db, &carrier, texts::STATUS_ANSWERED, status)
        }
        (MessagePlan::NothingChanged { why }, _) => {
            let (text, note) = texts::nothing_changed(&why);
            if nothing_changed_is_said(routed) {
                answer(db, &carrier, &note, text)
            } else {
                settle_carrier(db, &carrier, &note)?;
                Ok(vec![])
            }
        }
        (MessagePlan::Change { kind, text: new_text }, Some(task)) => {
            let source = if e.kind == EnvelopeKind::EditedMessage { Source::Edit } else { Source::Command };
            let summary = plan::human_summary(&who, kind, source);
            let change = Change { kind, text: new_text.as_deref(), source, actor: &who, summary };
            apply_change(db, &task, &carrier, &change)
        }
        // The plan joins or changes only a task that is open; kept total all the same.
        (MessagePlan::Join | MessagePlan::Change { .. }, None) => {
            let (text, note) = texts::nothing_changed("there is no open task here");
            answer(db, &carrier, &note, text)
        }
    }?;
    effects.extend(planned);
    Ok(effects)
}

/// How classification sees a task: which messages carry its instruction matters to an
/// edit only (a new message is classified by its text).
fn view_of(db: &rusqlite::Connection, task: &Task, update: HumanUpdate<'_>) -> rusqlite::Result<OpenTask> {
    match update {
        HumanUpdate::Edit { .. } => open_view(db, task),
        HumanUpdate::Message { .. } => Ok(OpenTask {
            task_id: task.task_id.clone(),
            revision: to_u32(task.revision),
            state: task.state(),
            instruction_messages: Vec::new(),
        }),
    }
}

/// A message the bot answers instead of acting on: settled with `note`, and `text` owed
/// as the bot's post.
fn answer(
    db: &rusqlite::Connection,
    carrier: &Carrier,
    note: &str,
    text: String,
) -> rusqlite::Result<Vec<TaskEffect>> {
    settle_carrier(db, carrier, note)?;
    Ok(vec![owe_post(db, carrier, answer_key(carrier), text)?])
}

/// The conversation's open task, if any (a finished one is closed on the way, see
/// [`latest_task`]). A paused or cancelled task stays open until it is resumed or stopped.
fn open_task(
    db: &rusqlite::Connection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> rusqlite::Result<Option<Task>> {
    match latest_task(db, chat_id, thread_id, agent)? {
        Some((task_id, _, TaskState::Open | TaskState::Paused | TaskState::StopRequested)) => {
            stored_task(db, &task_id)
        }
        _ => Ok(None),
    }
}

/// The task `task_id`, read in place.
fn stored_task(db: &rusqlite::Connection, task_id: &str) -> rusqlite::Result<Option<Task>> {
    let sql = concat!(task_select!(), "WHERE t.task_id = ?");
    query_row_cached(db, sql, rusqlite::params![task_id], task_from_row).optional()
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
) -> rusqlite::Result<Option<(TaskId, i64, TaskState)>> {
    let latest: Option<(i64, TaskId, i64, TaskState)> = query_row_cached(
        db,
        "SELECT id, task_id, revision, state FROM tasks WHERE chat_id = ?1 AND agent = ?2 AND thread_id IS ?3 \
         ORDER BY id DESC LIMIT 1",
        rusqlite::params![chat_id, agent, thread_id],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, parse_state(row, "state")?)),
    )
    .optional()?;
    let Some((id, task_id, revision, mut state)) = latest else { return Ok(None) };
    if closed_as_finished(db, id, state)? {
        state = TaskState::Done;
    }
    Ok(Some((task_id, revision, state)))
}

/// Whether the task (row `id`, in `state`) is `open` with nothing left to do, and so was
/// just marked `done`.
fn closed_as_finished(db: &rusqlite::Connection, id: i64, state: TaskState) -> rusqlite::Result<bool> {
    Ok(state == TaskState::Open
        && execute_cached(db, concat!(close_if_finished!(), "AND id = ?2"), rusqlite::params![now(), id])?
            == 1)
}

/// The latest open (or paused, or stopping) task of the conversation that another agent
/// than `agent` works on: one the conversation had before a reload gave it to `agent`. A
/// finished one is marked `done` on the way, as [`latest_task`] does, and is none.
fn open_task_of_another_agent(
    db: &rusqlite::Connection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> rusqlite::Result<Option<Task>> {
    let latest: Option<(i64, TaskId, TaskState)> = query_row_cached(
        db,
        "SELECT id, task_id, state FROM tasks WHERE chat_id = ?1 AND agent <> ?2 AND thread_id IS ?3 \
         AND state IN ('open', 'paused', 'stop_requested') ORDER BY id DESC LIMIT 1",
        rusqlite::params![chat_id, agent, thread_id],
        |row| Ok((row.get(0)?, row.get(1)?, parse_state(row, "state")?)),
    )
    .optional()?;
    let Some((id, task_id, state)) = latest else { return Ok(None) };
    if closed_as_finished(db, id, state)? {
        return Ok(None);
    }
    stored_task(db, &task_id)
}

fn open_view(db: &rusqlite::Connection, task: &Task) -> rusqlite::Result<OpenTask> {
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
) -> rusqlite::Result<TaskId> {
    let task_id = TaskId::generate();
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
    content: Option<&str>,
) -> rusqlite::Result<()> {
    execute_cached(
        db,
        // Merged into what intake stored (a quote, a forward), which the change keeps.
        "UPDATE envelopes SET task_id = ?1, revision = ?2, meta = json_patch(COALESCE(meta, '{}'), ?3), \
         kind = CASE WHEN ?4 IS NULL THEN kind ELSE 'revision' END, content = COALESCE(?4, content) \
         WHERE id = ?5",
        rusqlite::params![task_id, revision, meta.to_string(), content, carrier.id],
    )?;
    Ok(())
}

/// The change as the task's revision `revision`, with what the task had done before it.
fn record_revision(
    db: &rusqlite::Connection,
    task_id: &str,
    revision: i64,
    change: &Change<'_>,
    carrier: &Carrier,
    snapshot: &TaskEffects,
) -> rusqlite::Result<()> {
    execute_cached(
        db,
        "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, text, message_id, \
         envelope_id, snapshot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rusqlite::params![
            task_id,
            revision,
            change.kind.as_str(),
            change.source.as_str(),
            change.actor,
            now(),
            change.summary,
            change.text,
            carrier.message_id,
            carrier.id,
            snapshot_json(snapshot),
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

// ---- changes ----

/// Records `change` as the task's next revision and makes the writes its plan decides
/// (`rules::revisions::plan`), in the caller's transaction.
fn apply_change(
    db: &rusqlite::Connection,
    task: &Task,
    carrier: &Carrier,
    change: &Change<'_>,
) -> rusqlite::Result<Vec<TaskEffect>> {
    let task_id = task.task_id.as_str();
    let kind = change.kind;
    let snapshot = effects_of(db, task_id)?;
    let old_instruction = last_instruction(db, task_id, carrier.message_id.filter(|_| carrier.rewrite))?;
    let (handoff_rows, open_handoffs) =
        if plan::retires(kind) { open_handoffs(db, task_id)? } else { (Vec::new(), Vec::new()) };
    let pending_by_agent = match kind {
        ChangeKind::Pause | ChangeKind::Resume => pending_by_agent(db, task_id, carrier.id)?,
        _ => Vec::new(),
    };
    let successor_id = TaskId::generate();
    let plan = plan::plan_change(&ChangeContext {
        task,
        change,
        rewrite: carrier.rewrite,
        old_instruction: old_instruction.as_deref(),
        open_handoffs: &open_handoffs,
        pending_by_agent: &pending_by_agent,
        successor_id: &successor_id,
    });
    let mut effects = vec![TaskEffect::Recorded(kind)];
    let revision = i64::from(plan.revision);
    if let Some(reason) = &plan.supersede {
        supersede(db, task_id, &plan, &handoff_rows, carrier, reason, &mut effects)?;
    }
    record_revision(db, task_id, revision, change, carrier, &snapshot)?;
    write_task(db, task_id, revision, &plan.task, carrier, change)?;
    match &plan.carrier {
        CarrierWrite::Carry { task_id, revision, meta, content } => {
            carry_change(db, carrier, task_id, i64::from(*revision), meta, content.as_deref())?;
        }
        CarrierWrite::Settle { note } => settle_carrier(db, carrier, note)?,
    }
    effects.extend(task_rows::notices(&plan, task, kind));
    let key = format!("{task_id}/r{revision}");
    effects.push(owe_post(db, carrier, key, plan.acknowledgement)?);
    Ok(effects)
}

/// The task's own row after a change ([`TaskWrite`]); a new objective also starts its
/// successor with the carrier as its first envelope.
fn write_task(
    db: &rusqlite::Connection,
    task_id: &str,
    revision: i64,
    write: &TaskWrite,
    carrier: &Carrier,
    change: &Change<'_>,
) -> rusqlite::Result<()> {
    let at = now();
    match write {
        TaskWrite::Corrected => execute_cached(
            db,
            "UPDATE tasks SET revision = ?, instruction_revision = ?, instruction_kind = 'correction', \
             act_on_envelope_id = ?, updated_at = ? WHERE task_id = ?",
            rusqlite::params![revision, revision, carrier.id, at, task_id],
        ),
        TaskWrite::Replaced { successor, objective } => {
            insert_task(db, successor, carrier, objective, Some(task_id), change.source, change.actor)?;
            execute_cached(
                db,
                "UPDATE tasks SET state = 'replaced', revision = ?, successor = ?, instruction_revision = ?, \
                 instruction_kind = 'new_objective', act_on_envelope_id = ?, updated_at = ?, closed_at = ? \
                 WHERE task_id = ?",
                rusqlite::params![revision, successor, revision, carrier.id, at, at, task_id],
            )
        }
        TaskWrite::State(state) => execute_cached(
            db,
            "UPDATE tasks SET state = ?, revision = ?, updated_at = ? WHERE task_id = ?",
            rusqlite::params![state.as_str(), revision, at, task_id],
        ),
        TaskWrite::StopRequested => execute_cached(
            db,
            "UPDATE tasks SET state = 'stop_requested', revision = ?, cancel_envelope_id = ?, \
             stop_requested_by = ?, stop_requested_at = ?, updated_at = ? WHERE task_id = ?",
            rusqlite::params![revision, carrier.id, change.actor, at, at, task_id],
        ),
    }?;
    Ok(())
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

/// A handoff's row and its instruction envelope's.
type HandoffRow = (i64, i64);

/// The task's open handoffs, oldest first: their rows, and what the planner sees of each,
/// in the same order.
fn open_handoffs(
    db: &rusqlite::Connection,
    task_id: &str,
) -> rusqlite::Result<(Vec<HandoffRow>, Vec<OpenHandoff>)> {
    let handoffs = query_all_cached(
        db,
        "SELECT id, envelope_id, handoff_id, from_agent, to_agent FROM handoffs WHERE task_id = ? \
         AND state = 'open' ORDER BY id",
        rusqlite::params![task_id],
        |row| {
            let handoff =
                OpenHandoff { handoff_id: row.get(2)?, from_agent: row.get(3)?, to_agent: row.get(4)? };
            Ok(((row.get(0)?, row.get(1)?), handoff))
        },
    )?;
    Ok(handoffs.into_iter().unzip())
}

/// What a change that retires older work writes: the task's queued and pending envelopes
/// made under earlier revisions become `superseded` (the carrier excepted), and so do the
/// retired handoffs and their instructions, whose agents are each queued the `revision`
/// envelope the plan wrote for them.
fn supersede(
    db: &rusqlite::Connection,
    task_id: &str,
    plan: &ChangePlan,
    handoff_rows: &[HandoffRow],
    carrier: &Carrier,
    reason: &str,
    effects: &mut Vec<TaskEffect>,
) -> rusqlite::Result<()> {
    let revision = i64::from(plan.revision);
    let stale: Vec<i64> = query_all_cached(
        db,
        "SELECT id FROM envelopes WHERE task_id = ? AND revision < ? AND state IN ('queued', 'pending') \
         AND id <> ?",
        rusqlite::params![task_id, revision, carrier.id],
        |row| row.get(0),
    )?;
    let from = [EnvelopeState::Queued, EnvelopeState::Pending];
    for id in stale {
        transition_in(db, id, &from, EnvelopeState::Superseded, "switchboard", Some(reason))?;
    }
    let at = now();
    // The plan retires every open handoff it was given, in their order.
    for (retired, (id, instruction)) in plan.retired_handoffs.iter().zip(handoff_rows) {
        execute_cached(
            db,
            "UPDATE handoffs SET state = 'superseded', closed_at = ?, note = ? WHERE id = ?",
            rusqlite::params![at, reason, id],
        )?;
        transition_in(db, *instruction, &from, EnvelopeState::Superseded, "switchboard", Some(reason))?;
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
                retired.notice,
                at,
                at,
                carrier.route,
                retired.to_agent,
                at,
                task_id,
                revision,
                retired.meta.to_string()
            ],
        )?;
        effects.push(TaskEffect::Wake(retired.to_agent.clone()));
    }
    Ok(())
}

fn pending_by_agent(
    db: &rusqlite::Connection,
    task_id: &str,
    except: i64,
) -> rusqlite::Result<Vec<(String, TraceId)>> {
    query_all_cached(db, task_rows::PENDING_BY_AGENT, rusqlite::params![task_id, except], |row| {
        Ok((row.get(0)?, row.get(1)?))
    })
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
        Ok(ActedFor { acted_on: row.get("acted_on")?, task: task_from_row(row)? })
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
    task: Task,
}

#[async_trait]
impl Tasks for SqliteLedger {
    async fn admission(&self, envelope_id: i64) -> LedgerResult<Result<(), Refusal>> {
        self.read_in_place(|db| admission_in(db, envelope_id)).await
    }

    async fn declare_revision(
        &self,
        agent: &AgentName,
        trace_id: &TraceId,
        kind: ChangeKind,
        summary: &str,
        request_id: Option<&str>,
    ) -> Result<(DeclaredRevision, Vec<TaskEffect>), DeclareTaskError> {
        let actor = format!("agent:{agent}");
        // A declaration refused commits the transaction with nothing written in it.
        let recorded = self
            .write_in_place(|db| {
                if let Some(request_id) = request_id {
                    let before = query_row_cached(
                        db,
                        task_rows::REVISION_BY_REQUEST,
                        rusqlite::params![actor, request_id],
                        |row| {
                            Ok((
                                row.get::<_, String>(0)?,
                                row.get::<_, Option<String>>(1)?,
                                row.get::<_, Option<i64>>(2)?,
                            ))
                        },
                    )
                    .optional()?;
                    if let Some((kind, Some(task), Some(revision))) = before {
                        return Ok(Ok(Declared::Before(task_rows::repeated_revision(&kind, trace_id, task, revision))));
                    }
                }
                let row = query_row_cached(
                    db,
                    "SELECT id, kind, task_id, revision, chat_id, thread_id, route, text, message_id FROM envelopes \
                     WHERE trace_id = ? AND agent = ? AND state = 'pending'",
                    rusqlite::params![trace_id, agent.as_str()],
                    |row| {
                        Ok(DeclaredFor {
                            id: row.get("id")?,
                            kind: row.get("kind")?,
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
                let Some(DeclaredFor { id, kind: envelope_kind, task_id, revision, chat_id, thread_id, route, text, message_id }) = row
                else {
                    return Ok(Err(DeclareError::NotPending(trace_id.to_string())));
                };
                let (Some(task_id), Some(revision)) = (task_id, revision) else {
                    return Ok(Err(DeclareError::NoTask(trace_id.to_string())));
                };
                // A task is written with the envelope that starts it: one missing is an error.
                let task = stored_task(db, &task_id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                if let Err(refused) = admit_declaration(
                    kind,
                    &DeclaredAbout { trace_id, kind: &envelope_kind, agent: agent.as_str(), revision },
                    &task,
                ) {
                    return Ok(Err(refused));
                }
                let carrier = Carrier {
                    id,
                    trace_id: trace_id.clone(),
                    message_id: Some(message_id),
                    chat_id,
                    thread_id,
                    route: route.unwrap_or_default(),
                    agent: agent.to_string(),
                    rewrite: false,
                };
                let change = declared_change(kind, text.as_deref(), &actor, summary);
                let effects = apply_change(db, &task, &carrier, &change)?;
                let now_task: String = query_row_cached(
                    db,
                    "SELECT task_id FROM envelopes WHERE id = ?",
                    rusqlite::params![id],
                    |row| row.get(0),
                )?;
                let declared = declared_revision(kind, trace_id, now_task, &task);
                if let Some(request_id) = request_id {
                    execute_cached(
                        db,
                        task_rows::KEEP_REVISION_REQUEST,
                        rusqlite::params![request_id, declared.task_id, declared.revision, actor],
                    )?;
                }
                Ok(Ok(Declared::Now(declared, effects)))
            })
            .await?;
        match recorded? {
            Declared::Now(declared, effects) => Ok((declared, effects)),
            Declared::Before(declared) => Ok((declared, Vec::new())),
        }
    }

    async fn task_state(&self, task_id: &TaskId) -> LedgerResult<Option<TaskState>> {
        self.read_in_place(|db| {
            query_row_cached(db, "SELECT task_id, state FROM tasks WHERE task_id = ?", [task_id], |row| {
                parse_state(row, "state")
            })
            .optional()
        })
        .await
    }

    async fn task(&self, task_id: &TaskId) -> LedgerResult<Option<(Task, Vec<StoredRevision>, TaskEffects)>> {
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

    async fn mark_task_stopped(&self, task_id: &TaskId, reason: &str) -> Result<(), DeclareTaskError> {
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
                        snapshot_json(&effects),
                    ],
                )?;
                Ok(Ok(()))
            })
            .await?;
        Ok(marked?)
    }
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
