//! Tasks and revisions (DESIGN.md §11) on PostgreSQL: the reads every backend's
//! transactions share, beginning with admission.
//!
//! **Serialising a change and an action.** SQLite's one writer puts every change to a task
//! and every admission in one order. Here a transaction that changes a task takes its row
//! `FOR UPDATE`, and admission reads it `FOR SHARE`: an action admitted in a transaction
//! still open holds back a change to its task until that transaction ends, and an action
//! admitted after the change reads the task as changed. So a correction recorded while a
//! reply is being resolved can never let the old reply out, on any replica.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};

use super::PgLedger;
use super::envelopes::transition_in;
use crate::domain::{
    BotPost, DeclareError, DeclareTaskError, DeclaredRevision, EnvelopeKind, EnvelopeState, RoutedEnvelope,
    StoredRevision, TaskEffect,
};
use crate::ids::{AgentName, TaskId, TraceId};
use crate::ledger::columns::{busy_of, task_columns, task_from};
use crate::ledger::prelude::*;
use crate::ledger::task_rows::{
    self, Carrier, Conversation, DeclaredAbout, admit_declaration, answer_key, belongs_to_a_task, carrier_of,
    declared_change, declared_revision, nothing_changed_is_said, plain_work, sender_of, snapshot_json,
};
use crate::ledger::{LedgerError, LedgerResult};
use crate::rules::revisions::plan::{
    self, CarrierWrite, Change, ChangeContext, ChangePlan, MessagePlan, OpenHandoff, Source, TaskWrite,
};
use crate::rules::revisions::task::to_u32;
use crate::rules::revisions::{
    self, ChangeKind, HumanUpdate, OpenTask, Refusal, Task, TaskEffects, TaskState, texts,
};

/// A [`Task`] from a row of [`task_columns!`]. A state no task has is an error, never a
/// task read as open.
impl FromRow<'_, PgRow> for Task {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Task {
            task_id: row.try_get("task_id")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: row.try_get("thread_id")?,
            agent: row.try_get("agent")?,
            route: row.try_get("route")?,
            state: task_state(row, "state")?,
            revision: row.try_get("revision")?,
            objective: row.try_get("objective")?,
            predecessor: row.try_get("predecessor")?,
            successor: row.try_get("successor")?,
            instruction_revision: row.try_get("instruction_revision")?,
            instruction_kind: row.try_get("instruction_kind")?,
            act_on: row.try_get("act_on")?,
            stop_requested_by: row.try_get("stop_requested_by")?,
            stop_requested_at: row.try_get("stop_requested_at")?,
            stopped_at: row.try_get("stopped_at")?,
            stop_reason: row.try_get("stop_reason")?,
            opened_at: row.try_get("opened_at")?,
            updated_at: row.try_get("updated_at")?,
            closed_at: row.try_get("closed_at")?,
        })
    }
}

/// Whether an outbound action made for `envelope_id` may go out now (DESIGN.md §11), read
/// inside the caller's transaction with the task's row held `FOR SHARE` until it ends (see
/// the module's documentation). An envelope of no task is always admitted.
pub(super) async fn admission_in(
    tx: &mut PgConnection,
    envelope_id: i64,
) -> LedgerResult<Result<(), Refusal>> {
    let sql = concat!(
        "SELECT e.revision AS acted_on, ",
        task_columns!(),
        task_from!(),
        "JOIN envelopes e ON e.task_id = t.task_id WHERE e.id = $1 FOR SHARE OF t"
    );
    let row = sqlx::query(sql).bind(envelope_id).fetch_optional(&mut *tx).await?;
    let Some(row) = row else {
        // An envelope of no task.
        return Ok(Ok(()));
    };
    let acted_on: i64 = row.try_get("acted_on")?;
    let task = Task::from_row(&row)?;
    Ok(revisions::admit(to_u32(acted_on), &task.now()))
}

/// A task's state column, read strictly: a name no state has is an error (logged with the
/// row's task id), never a task read as open.
pub(super) fn task_state(row: &PgRow, column: &str) -> sqlx::Result<TaskState> {
    let name: &str = row.try_get(column)?;
    TaskState::parse(name).ok_or_else(|| {
        let task_id = row.try_get::<&str, _>("task_id").unwrap_or_default();
        tracing::error!(task_id, state = %name, "a task in the ledger has a state this switchboard does not know");
        sqlx::Error::ColumnDecode { index: column.to_owned(), source: format!("unknown task state {name:?}").into() }
    })
}

/// `UPDATE tasks` that makes an `open` task with nothing left queued, pending or
/// unresolved and no open handoff `done`; the caller adds `AND` which task (`$1`). An
/// envelope whose reply's outcome is unknown keeps its task open: it is not known to be
/// done, and a correction must still reach it.
macro_rules! close_if_finished {
    () => {
        concat!(
            "UPDATE tasks SET state = 'done', closed_at = now(), updated_at = now() WHERE state = 'open' AND NOT ",
            busy_of!("tasks.task_id"),
            " "
        )
    };
}

/// The rest of a statement that begins with a `latest` CTE of tasks (`position`, `id`,
/// `task_id`, `revision`, `state`): marks those that are finished `done` and reads them as
/// marked.
macro_rules! finish_latest {
    () => {
        concat!(
            "finished AS (",
            close_if_finished!(),
            "AND id IN (SELECT id FROM latest) RETURNING id) \
             SELECT position, task_id, revision, \
             CASE WHEN id IN (SELECT id FROM finished) THEN 'done' ELSE state END AS state FROM latest"
        )
    };
}

// ---- intake ----

/// The tasks of a batch's human messages, decided before its rows are inserted so that
/// each plain message is stored with its task in the batch's one insert, as on SQLite
/// (`sqlite/tasks.rs`). A conversation whose part of the batch holds a command or an edit
/// is left to [`take_in`], message by message, after the insert (`later`).
#[derive(Debug, Default)]
pub(super) struct BatchTasks {
    /// Per row of the batch: the task and revision it is stored with.
    pub tags: Vec<Option<(TaskId, i64)>>,
    /// Tasks the batch starts: the task id and the row that starts it.
    starts: Vec<(TaskId, usize)>,
    /// Rows for [`take_in`], in order.
    later: Vec<usize>,
}

/// What a row of a batch is to its conversation's task, decided before anything is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowTask {
    /// Not a human message of a single-agent conversation: no task.
    None,
    /// Plain work: it joins the latest task of the conversation `Conversations::to_read`
    /// names at this index if that task is open or paused, else the task the first such
    /// row starts.
    Joins(usize),
    /// A command or an edit, or any message after one in its conversation: taken in by
    /// [`take_in`] after the insert.
    Later,
}

/// A batch's rows sorted by conversation, before anything is read.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Conversations {
    /// Every conversation a row's task is decided in, in the batch's order: held for the
    /// transaction before anything is read.
    pub(super) held: Vec<Conversation>,
    /// The conversations whose latest task a plain message joins, in the batch's order.
    to_read: Vec<Conversation>,
    /// Per row of the batch, one each.
    rows: Vec<RowTask>,
}

pub(super) fn conversations_of(batch: &[RoutedEnvelope], bot_username: Option<&str>) -> Conversations {
    let mut sorted = Conversations::default();
    let mut read_at: HashMap<Conversation, usize> = HashMap::new();
    let mut one_by_one: HashSet<Conversation> = HashSet::new();
    for routed in batch {
        let Some(agent) = routed.agent.as_ref().filter(|_| belongs_to_a_task(routed)) else {
            sorted.rows.push(RowTask::None);
            continue;
        };
        let channel = routed.envelope.channel;
        let conversation: Conversation =
            (channel.chat_id, channel.thread_id.map(i64::from), agent.to_string());
        if !sorted.held.contains(&conversation) {
            sorted.held.push(conversation.clone());
        }
        if one_by_one.contains(&conversation) || !plain_work(routed, bot_username) {
            one_by_one.insert(conversation);
            sorted.rows.push(RowTask::Later);
            continue;
        }
        let next = sorted.to_read.len();
        let at = *read_at.entry(conversation.clone()).or_insert(next);
        if at == next {
            sorted.to_read.push(conversation);
        }
        sorted.rows.push(RowTask::Joins(at));
    }
    sorted
}

/// Decides the batch's tasks ([`BatchTasks`]) once the caller holds every conversation of
/// the batch (`conversations.held`, see [`hold_conversations`]): reads the latest task of
/// each conversation its plain messages join (marking a finished one `done`), in one
/// statement whatever their number (a statement is a round trip).
pub(super) async fn plan_batch(
    tx: &mut PgConnection,
    conversations: Conversations,
) -> LedgerResult<BatchTasks> {
    let Conversations { to_read, rows, .. } = conversations;
    let mut plan = BatchTasks { tags: vec![None; rows.len()], ..BatchTasks::default() };
    let mut joined: Vec<Option<(TaskId, i64)>> = latest_tasks(tx, &to_read)
        .await?
        .into_iter()
        .map(|latest| match latest {
            // A message after `/cancel` is new work, not part of the task being stopped.
            Some((task_id, revision, TaskState::Open | TaskState::Paused)) => Some((task_id, revision)),
            _ => None,
        })
        .collect();
    for (index, row) in rows.into_iter().enumerate() {
        match row {
            RowTask::None => {}
            RowTask::Later => plan.later.push(index),
            RowTask::Joins(conversation) => {
                let task = joined[conversation].get_or_insert_with(|| {
                    let task_id = TaskId::generate();
                    plan.starts.push((task_id.clone(), index));
                    (task_id, 1)
                });
                plan.tags[index] = Some(task.clone());
            }
        }
    }
    Ok(plan)
}

/// After the batch's insert (`ids`: each row's id, `None` where the row was already
/// stored): records the tasks its plain messages start, then takes in its commands and
/// edits one by one. When a row of the batch was already stored (a re-polled update), the
/// plan may count on rows that were not inserted: every new human row is then taken in one
/// by one instead.
pub(super) async fn record_batch_tasks(
    tx: &mut PgConnection,
    batch: &[RoutedEnvelope],
    plan: &BatchTasks,
    ids: &[Option<i64>],
    bot_username: Option<&str>,
) -> LedgerResult<Vec<TaskEffect>> {
    let mut effects = Vec::new();
    if !ids.iter().all(Option::is_some) {
        for (routed, id) in batch.iter().zip(ids) {
            let Some(id) = id.filter(|_| belongs_to_a_task(routed)) else { continue };
            sqlx::query("UPDATE envelopes SET task_id = NULL, revision = NULL WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            effects.extend(take_in(tx, routed, id, bot_username).await?);
        }
        return Ok(effects);
    }
    // Every row was inserted (the check above): each has its id.
    let ids: Vec<i64> = ids.iter().flatten().copied().collect();
    let starts: Vec<(&TaskId, Carrier, String, String)> = plan
        .starts
        .iter()
        .map(|(task_id, index)| {
            let routed = &batch[*index];
            let text = routed.envelope.text.clone().unwrap_or_else(|| routed.envelope.content());
            (task_id, carrier_of(routed, ids[*index]), text, sender_of(routed))
        })
        .collect();
    let started: Vec<NewTask<'_>> = starts
        .iter()
        .map(|(task_id, carrier, objective, actor)| NewTask {
            task_id,
            carrier,
            objective,
            predecessor: None,
            source: Source::Command,
            actor,
        })
        .collect();
    insert_tasks(tx, &started).await?;
    for index in &plan.later {
        effects.extend(take_in(tx, &batch[*index], ids[*index], bot_username).await?);
    }
    Ok(effects)
}

/// Gives a newly stored human message (row `id`) its task, or applies the change it
/// makes; inside the batch's transaction. Returns what to do once it commits.
async fn take_in(
    tx: &mut PgConnection,
    routed: &RoutedEnvelope,
    id: i64,
    bot_username: Option<&str>,
) -> LedgerResult<Vec<TaskEffect>> {
    let e = &routed.envelope;
    let Some(agent) = routed.agent.as_ref() else { return Ok(vec![]) };
    let mut carrier = carrier_of(routed, id);
    let text = e.text.clone().unwrap_or_else(|| e.content());
    let update = match e.kind {
        EnvelopeKind::EditedMessage => HumanUpdate::Edit { message_id: e.message_id, text: &text },
        _ => HumanUpdate::Message { text: &text },
    };
    let username = bot_username.unwrap_or_default();
    let mut open = open_task(tx, carrier.chat_id, carrier.thread_id, agent.as_str()).await?;
    let mut open_view = match &open {
        Some(task) => Some(view_of(tx, task, update).await?),
        None => None,
    };
    let mut effects = Vec::new();
    if !plain_work(routed, bot_username)
        && let Some(other) =
            open_task_of_another_agent(tx, carrier.chat_id, carrier.thread_id, agent.as_str()).await?
    {
        let other_view = view_of(tx, &other, update).await?;
        if revisions::for_another_agents_task(update, open_view.as_ref(), &other_view, username) {
            sqlx::query("UPDATE envelopes SET agent = $1 WHERE id = $2")
                .bind(&other.agent)
                .bind(carrier.id)
                .execute(&mut *tx)
                .await?;
            carrier.agent.clone_from(&other.agent);
            effects.push(TaskEffect::Wake(other.agent.clone()));
            (open, open_view) = (Some(other), Some(other_view));
        }
    }
    let meaning = revisions::classify(update, open_view.as_ref(), username);
    let who = sender_of(routed);
    let planned = match (plan::plan_message(meaning, open.as_ref().map(Task::state), &text, username), open) {
        (MessagePlan::Start { objective }, _) => {
            start_task(tx, &carrier, &objective, None, Source::Command, &who).await?;
            Ok(vec![])
        }
        (MessagePlan::Join, Some(task)) => {
            tag(tx, id, &task.task_id, task.revision).await?;
            Ok(vec![])
        }
        (MessagePlan::Status, Some(task)) => {
            let status = texts::describe(&task, &effects_of(tx, &task.task_id).await?);
            answer(tx, &carrier, texts::STATUS_ANSWERED, status).await
        }
        // No open task: the most recent one, so a user who asked to stop hears that it did.
        (MessagePlan::Status, None) => {
            let latest = match latest_task(tx, carrier.chat_id, carrier.thread_id, agent.as_str()).await? {
                Some((task_id, _, _)) => stored_task(tx, &task_id).await?,
                None => None,
            };
            let latest = match latest {
                Some(task) => Some((effects_of(tx, &task.task_id).await?, task)),
                None => None,
            };
            let status =
                texts::status_without_open_task(latest.as_ref().map(|(effects, task)| (task, effects)));
            answer(tx, &carrier, texts::STATUS_ANSWERED, status).await
        }
        (MessagePlan::NothingChanged { why }, _) => {
            let (text, note) = texts::nothing_changed(&why);
            if nothing_changed_is_said(routed) {
                answer(tx, &carrier, &note, text).await
            } else {
                settle_carrier(tx, &carrier, &note).await?;
                Ok(vec![])
            }
        }
        (MessagePlan::Change { kind, text: new_text }, Some(task)) => {
            let source = if e.kind == EnvelopeKind::EditedMessage { Source::Edit } else { Source::Command };
            let summary = plan::human_summary(&who, kind, source);
            let change = Change { kind, text: new_text.as_deref(), source, actor: &who, summary };
            apply_change(tx, &task, &carrier, &change).await
        }
        // The plan joins or changes only a task that is open; kept total all the same.
        (MessagePlan::Join | MessagePlan::Change { .. }, None) => {
            let (text, note) = texts::nothing_changed("there is no open task here");
            answer(tx, &carrier, &note, text).await
        }
    }?;
    effects.extend(planned);
    Ok(effects)
}

/// How classification sees a task: which messages carry its instruction matters to an
/// edit only (a new message is classified by its text).
async fn view_of(tx: &mut PgConnection, task: &Task, update: HumanUpdate<'_>) -> LedgerResult<OpenTask> {
    match update {
        HumanUpdate::Edit { .. } => open_view(tx, task).await,
        HumanUpdate::Message { .. } => Ok(OpenTask {
            task_id: task.task_id.clone(),
            revision: to_u32(task.revision),
            state: task.state(),
            instruction_messages: Vec::new(),
        }),
    }
}

/// The latest open (or paused, or stopping) task of the conversation that another agent
/// than `agent` works on: one the conversation had before a reload gave it to `agent`. A
/// finished one is marked `done` on the way, as [`latest_task`] does, and is none. The
/// task's row is held (`FOR UPDATE`), not its conversation: taking a second conversation's
/// lock here, out of the keys' order, could deadlock with a batch that holds both.
async fn open_task_of_another_agent(
    tx: &mut PgConnection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> LedgerResult<Option<Task>> {
    let latest = sqlx::query(concat!(
        "WITH latest AS MATERIALIZED (SELECT 1::bigint AS position, id, task_id, revision, state \
         FROM tasks WHERE chat_id = $1 AND thread_id IS NOT DISTINCT FROM $2 AND agent <> $3 \
         AND state IN ('open', 'paused', 'stop_requested') ORDER BY id DESC LIMIT 1), ",
        finish_latest!()
    ))
    .bind(chat_id)
    .bind(thread_id)
    .bind(agent)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = latest else { return Ok(None) };
    match task_state(&row, "state")? {
        TaskState::Open | TaskState::Paused | TaskState::StopRequested => {
            let task_id: TaskId = row.try_get("task_id")?;
            stored_task(tx, &task_id).await
        }
        _ => Ok(None),
    }
}

/// A message the bot answers instead of acting on: settled with `note`, and `text` owed
/// as the bot's post.
async fn answer(
    tx: &mut PgConnection,
    carrier: &Carrier,
    note: &str,
    text: String,
) -> LedgerResult<Vec<TaskEffect>> {
    settle_carrier(tx, carrier, note).await?;
    Ok(vec![owe_post(tx, carrier, answer_key(carrier), text).await?])
}

/// The conversation's open task, if any (a finished one is closed on the way, see
/// [`latest_task`]). A paused or cancelled task stays open until it is resumed or stopped.
async fn open_task(
    tx: &mut PgConnection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> LedgerResult<Option<Task>> {
    match latest_task(tx, chat_id, thread_id, agent).await? {
        Some((task_id, _, TaskState::Open | TaskState::Paused | TaskState::StopRequested)) => {
            stored_task(tx, &task_id).await
        }
        _ => Ok(None),
    }
}

/// The task `task_id`, its row held `FOR UPDATE` until the transaction ends: every caller
/// reads a task to change it, and admission waits for the change (see the module's
/// documentation).
async fn stored_task(tx: &mut PgConnection, task_id: &TaskId) -> LedgerResult<Option<Task>> {
    let sql = concat!("SELECT ", task_columns!(), task_from!(), "WHERE t.task_id = $1 FOR UPDATE OF t");
    Ok(sqlx::query_as(sql).bind(task_id).fetch_optional(&mut *tx).await?)
}

/// The advisory-lock keys of the conversations given as three arrays (chat ids, thread ids,
/// agents: the statement's parameters named), each once, in the keys' order (see
/// [`hold_conversations`]). A volatile function in the select list of a query over these
/// keys, as `pg_advisory_xact_lock`, is evaluated after its `ORDER BY`.
macro_rules! conversation_lock_keys {
    ($chat_ids:literal, $thread_ids:literal, $agents:literal) => {
        concat!(
            "SELECT DISTINCT hashtextextended('switchboard task ' || current_schema() || ' ' || chat_id::text \
             || ' ' || COALESCE(thread_id::text, '-') || ' ' || agent, 0) AS key \
             FROM UNNEST(",
            $chat_ids,
            "::bigint[], ",
            $thread_ids,
            "::bigint[], ",
            $agents,
            "::text[]) AS c (chat_id, thread_id, agent)"
        )
    };
}
pub(super) use conversation_lock_keys;

/// Holds the conversations' task decisions until the transaction ends: which task a
/// message joins, whether it starts one. SQLite's one writer serialises them; here two
/// replicas taking in messages of one conversation at once (webhook deliveries, an agent's
/// declaration beside a poll) would otherwise both find no open task and start two. A
/// transaction-level advisory lock per conversation, keyed by the schema and the
/// conversation ([`conversation_lock_keys!`]), all taken in one statement in the keys'
/// order, so two transactions holding several never wait for each other crosswise. A
/// polled batch takes them in its fence's statement instead (`fence_intake`).
pub(super) async fn hold_conversations(
    tx: &mut PgConnection,
    conversations: &[Conversation],
) -> LedgerResult<()> {
    if conversations.is_empty() {
        return Ok(());
    }
    let (chat_ids, thread_ids, agents) = conversation_columns(conversations);
    sqlx::query(concat!(
        "SELECT pg_advisory_xact_lock(key) FROM (",
        conversation_lock_keys!("$1", "$2", "$3"),
        ") AS keys ORDER BY key"
    ))
    .bind(chat_ids)
    .bind(thread_ids)
    .bind(agents)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Holds one conversation ([`hold_conversations`]).
async fn hold_conversation(
    tx: &mut PgConnection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> LedgerResult<()> {
    hold_conversations(tx, &[(chat_id, thread_id, agent.to_owned())]).await
}

/// Conversations column by column, as `UNNEST` takes them.
pub(super) fn conversation_columns(
    conversations: &[Conversation],
) -> (Vec<i64>, Vec<Option<i64>>, Vec<&str>) {
    let chat_ids = conversations.iter().map(|(chat_id, _, _)| *chat_id).collect();
    let thread_ids = conversations.iter().map(|(_, thread_id, _)| *thread_id).collect();
    let agents = conversations.iter().map(|(_, _, agent)| agent.as_str()).collect();
    (chat_ids, thread_ids, agents)
}

/// The conversation's latest task: its id, revision and state, once a finished `open` one
/// is marked `done`. Holds the conversation first ([`hold_conversation`]).
async fn latest_task(
    tx: &mut PgConnection,
    chat_id: i64,
    thread_id: Option<i64>,
    agent: &str,
) -> LedgerResult<Option<(TaskId, i64, TaskState)>> {
    let conversation = (chat_id, thread_id, agent.to_owned());
    hold_conversations(tx, std::slice::from_ref(&conversation)).await?;
    Ok(latest_tasks(tx, &[conversation]).await?.pop().flatten())
}

/// Each conversation's latest task (`None` where it has none), in the order given: its id,
/// revision and state, once a finished `open` one is marked `done`. The caller holds the
/// conversations ([`hold_conversations`]).
///
/// The reads and the marking are one statement, after the conversations are held in an
/// earlier one: a statement reads what was committed when it began, so the read must not
/// share the locks' statement.
///
/// One conversation, the usual case, has a statement of its own. The statement for several
/// takes arrays, which PostgreSQL's generic plan assumes hold ten elements: for one it costs
/// that plan ten times too high and plans the statement afresh at every call, which takes
/// longer than the round trip it saves.
async fn latest_tasks(
    tx: &mut PgConnection,
    conversations: &[Conversation],
) -> LedgerResult<Vec<Option<(TaskId, i64, TaskState)>>> {
    let rows = match conversations {
        [] => return Ok(Vec::new()),
        [(chat_id, thread_id, agent)] => {
            sqlx::query(concat!(
                "WITH latest AS MATERIALIZED (SELECT 1::bigint AS position, id, task_id, revision, state \
                 FROM tasks WHERE chat_id = $1 AND thread_id IS NOT DISTINCT FROM $2 AND agent = $3 \
                 ORDER BY id DESC LIMIT 1), ",
                finish_latest!()
            ))
            .bind(chat_id)
            .bind(thread_id)
            .bind(agent)
            .fetch_all(&mut *tx)
            .await?
        }
        several => {
            let (chat_ids, thread_ids, agents) = conversation_columns(several);
            sqlx::query(concat!(
                "WITH latest AS MATERIALIZED (SELECT c.position, t.id, t.task_id, t.revision, t.state \
                 FROM UNNEST($1::bigint[], $2::bigint[], $3::text[]) WITH ORDINALITY \
                 AS c (chat_id, thread_id, agent, position) \
                 CROSS JOIN LATERAL (SELECT id, task_id, revision, state FROM tasks WHERE chat_id = c.chat_id \
                 AND thread_id IS NOT DISTINCT FROM c.thread_id AND agent = c.agent ORDER BY id DESC LIMIT 1) AS t), ",
                finish_latest!()
            ))
            .bind(chat_ids)
            .bind(thread_ids)
            .bind(agents)
            .fetch_all(&mut *tx)
            .await?
        }
    };
    let mut latest = vec![None; conversations.len()];
    for row in rows {
        let position: i64 = row.try_get("position")?;
        let task_id: TaskId = row.try_get("task_id")?;
        let revision: i64 = row.try_get("revision")?;
        let slot = usize::try_from(position - 1).ok().and_then(|at| latest.get_mut(at));
        let slot = slot.ok_or_else(|| LedgerError::other(format!("a latest task at position {position}")))?;
        *slot = Some((task_id, revision, task_state(&row, "state")?));
    }
    Ok(latest)
}

async fn open_view(tx: &mut PgConnection, task: &Task) -> LedgerResult<OpenTask> {
    let messages: Vec<i64> = sqlx::query_scalar(
        "SELECT e.message_id FROM tasks t JOIN envelopes e ON e.id = t.first_envelope_id WHERE t.task_id = $1 \
         UNION SELECT message_id FROM task_revisions WHERE task_id = $1 AND message_id IS NOT NULL \
         AND kind IN ('correction', 'new_objective')",
    )
    .bind(&task.task_id)
    .fetch_all(&mut *tx)
    .await?;
    Ok(OpenTask {
        task_id: task.task_id.clone(),
        revision: to_u32(task.revision),
        state: task.state(),
        instruction_messages: messages.into_iter().filter_map(|m| i32::try_from(m).ok()).collect(),
    })
}

/// Starts a task with `carrier` as its first envelope (revision 1).
async fn start_task(
    tx: &mut PgConnection,
    carrier: &Carrier,
    objective: &str,
    predecessor: Option<&TaskId>,
    source: Source,
    actor: &str,
) -> LedgerResult<TaskId> {
    let task_id = TaskId::generate();
    insert_task(tx, &task_id, carrier, objective, predecessor, source, actor).await?;
    tag(tx, carrier.id, &task_id, 1).await?;
    Ok(task_id)
}

/// The task's row, which is also its revision 1 (who started it, how, with which
/// envelope); tagging that envelope is the caller's.
async fn insert_task(
    tx: &mut PgConnection,
    task_id: &TaskId,
    carrier: &Carrier,
    objective: &str,
    predecessor: Option<&TaskId>,
    source: Source,
    actor: &str,
) -> LedgerResult<()> {
    insert_tasks(tx, &[NewTask { task_id, carrier, objective, predecessor, source, actor }]).await
}

/// A task's row as [`insert_task`] writes it.
struct NewTask<'a> {
    task_id: &'a TaskId,
    carrier: &'a Carrier,
    objective: &'a str,
    predecessor: Option<&'a TaskId>,
    source: Source,
    actor: &'a str,
}

/// Inserts `tasks` in one statement (a statement is a round trip), in their order: a
/// task's id orders it among its conversation's, the latest being the last inserted.
async fn insert_tasks(tx: &mut PgConnection, tasks: &[NewTask<'_>]) -> LedgerResult<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let task_ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    let chat_ids: Vec<i64> = tasks.iter().map(|t| t.carrier.chat_id).collect();
    let thread_ids: Vec<Option<i64>> = tasks.iter().map(|t| t.carrier.thread_id).collect();
    let agents: Vec<&str> = tasks.iter().map(|t| t.carrier.agent.as_str()).collect();
    let routes: Vec<&str> = tasks.iter().map(|t| t.carrier.route.as_str()).collect();
    let objectives: Vec<&str> = tasks.iter().map(|t| t.objective).collect();
    let first_envelope_ids: Vec<i64> = tasks.iter().map(|t| t.carrier.id).collect();
    let actors: Vec<&str> = tasks.iter().map(|t| t.actor).collect();
    // A task with no predecessor was started by a message, whatever carried it.
    let sources: Vec<&str> =
        tasks.iter().map(|t| if t.predecessor.is_some() { t.source.as_str() } else { "message" }).collect();
    let predecessors: Vec<Option<&str>> = tasks.iter().map(|t| t.predecessor.map(TaskId::as_str)).collect();
    sqlx::query(
        "INSERT INTO tasks (task_id, chat_id, thread_id, agent, route, state, revision, objective, first_envelope_id, \
         started_by, started_source, predecessor, opened_at, updated_at) \
         SELECT task_id, chat_id, thread_id, agent, route, 'open', 1, objective, first_envelope_id, started_by, \
         started_source, predecessor, now(), now() \
         FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[], \
         $8::text[], $9::text[], $10::text[]) WITH ORDINALITY \
         AS t (task_id, chat_id, thread_id, agent, route, objective, first_envelope_id, started_by, started_source, \
         predecessor, position) \
         ORDER BY position",
    )
    .bind(task_ids)
    .bind(chat_ids)
    .bind(thread_ids)
    .bind(agents)
    .bind(routes)
    .bind(objectives)
    .bind(first_envelope_ids)
    .bind(actors)
    .bind(sources)
    .bind(predecessors)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Records the task and revision an envelope was made under.
pub(super) async fn tag(
    tx: &mut PgConnection,
    envelope_id: i64,
    task_id: &TaskId,
    revision: i64,
) -> LedgerResult<()> {
    sqlx::query("UPDATE envelopes SET task_id = $1, revision = $2 WHERE id = $3")
        .bind(task_id)
        .bind(revision)
        .bind(envelope_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The carrier of a change, in one statement: the task and revision it now belongs to, the
/// change's meta merged into what intake stored (a quote, a forward), and — for a human's
/// command or edit (`content`) — its new life as the `revision` envelope the agent acts on.
async fn carry_change(
    tx: &mut PgConnection,
    carrier: &Carrier,
    task_id: &TaskId,
    revision: i64,
    meta: &serde_json::Value,
    content: Option<&str>,
) -> LedgerResult<()> {
    sqlx::query(
        "UPDATE envelopes SET task_id = $1, revision = $2, \
         meta = (COALESCE(meta, '{}')::jsonb || $3::jsonb)::text, \
         kind = CASE WHEN $4::text IS NULL THEN kind ELSE 'revision' END, content = COALESCE($4, content) \
         WHERE id = $5",
    )
    .bind(task_id)
    .bind(revision)
    .bind(meta.to_string())
    .bind(content)
    .bind(carrier.id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The change as the task's revision `revision`, with what the task had done before it.
async fn record_revision(
    tx: &mut PgConnection,
    task_id: &TaskId,
    revision: i64,
    change: &Change<'_>,
    carrier: &Carrier,
    snapshot: &TaskEffects,
) -> LedgerResult<()> {
    sqlx::query(
        "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, text, message_id, \
         envelope_id, snapshot) VALUES ($1, $2, $3, $4, $5, now(), $6, $7, $8, $9, $10)",
    )
    .bind(task_id)
    .bind(revision)
    .bind(change.kind.as_str())
    .bind(change.source.as_str())
    .bind(change.actor)
    .bind(&change.summary)
    .bind(change.text)
    .bind(carrier.message_id)
    .bind(carrier.id)
    .bind(snapshot_json(snapshot))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A handled command or edit: acked by the switchboard, never work for the agent.
async fn settle_carrier(tx: &mut PgConnection, carrier: &Carrier, note: &str) -> LedgerResult<()> {
    transition_in(
        tx,
        carrier.id,
        &[EnvelopeState::Queued, EnvelopeState::Pending],
        EnvelopeState::Acked,
        "switchboard",
        Some(note),
    )
    .await?;
    Ok(())
}

/// What the bot says about a change or a question, owed in the same transaction: a post
/// in `room_posts` (no cascade), which the room driver makes once and never twice.
async fn owe_post(
    tx: &mut PgConnection,
    carrier: &Carrier,
    key: String,
    text: String,
) -> LedgerResult<TaskEffect> {
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
    sqlx::query(
        "INSERT INTO room_posts (key, cascade_id, envelope_id, route, chat_id, thread_id, reply_to_message_id, text, \
         state, created_at) VALUES ($1, NULL, $2, $3, $4, $5, $6, $7, 'owed', now())",
    )
    .bind(key)
    .bind(post.envelope_id)
    .bind(&post.route)
    .bind(post.chat_id)
    .bind(post.thread_id)
    .bind(post.reply_to_message_id)
    .bind(&post.text)
    .execute(&mut *tx)
    .await?;
    Ok(TaskEffect::Say(post))
}

// ---- changes ----

/// Records `change` as the task's next revision and makes the writes its plan decides
/// (`rules::revisions::plan`), in the caller's transaction.
async fn apply_change(
    tx: &mut PgConnection,
    task: &Task,
    carrier: &Carrier,
    change: &Change<'_>,
) -> LedgerResult<Vec<TaskEffect>> {
    let task_id = &task.task_id;
    let kind = change.kind;
    let snapshot = effects_of(tx, task_id).await?;
    let old_instruction =
        last_instruction(tx, task_id, carrier.message_id.filter(|_| carrier.rewrite)).await?;
    let (handoff_rows, open_handoffs) =
        if plan::retires(kind) { open_handoffs(tx, task_id).await? } else { (Vec::new(), Vec::new()) };
    let pending_by_agent = match kind {
        ChangeKind::Pause | ChangeKind::Resume => pending_by_agent(tx, task_id, carrier.id).await?,
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
        supersede(tx, task_id, &plan, &handoff_rows, carrier, reason, &mut effects).await?;
    }
    record_revision(tx, task_id, revision, change, carrier, &snapshot).await?;
    write_task(tx, task_id, revision, &plan.task, carrier, change).await?;
    match &plan.carrier {
        CarrierWrite::Carry { task_id, revision, meta, content } => {
            carry_change(tx, carrier, task_id, i64::from(*revision), meta, content.as_deref()).await?;
        }
        CarrierWrite::Settle { note } => settle_carrier(tx, carrier, note).await?,
    }
    effects.extend(task_rows::notices(&plan, task, kind));
    let key = format!("{task_id}/r{revision}");
    effects.push(owe_post(tx, carrier, key, plan.acknowledgement).await?);
    Ok(effects)
}

/// The task's own row after a change ([`TaskWrite`]); a new objective also starts its
/// successor with the carrier as its first envelope.
async fn write_task(
    tx: &mut PgConnection,
    task_id: &TaskId,
    revision: i64,
    write: &TaskWrite,
    carrier: &Carrier,
    change: &Change<'_>,
) -> LedgerResult<()> {
    let statement = match write {
        TaskWrite::Corrected => sqlx::query(
            "UPDATE tasks SET revision = $1, instruction_revision = $1, instruction_kind = 'correction', \
             act_on_envelope_id = $2, updated_at = now() WHERE task_id = $3",
        )
        .bind(revision)
        .bind(carrier.id)
        .bind(task_id),
        TaskWrite::Replaced { successor, objective } => {
            insert_task(tx, successor, carrier, objective, Some(task_id), change.source, change.actor)
                .await?;
            sqlx::query(
                "UPDATE tasks SET state = 'replaced', revision = $1, successor = $2, instruction_revision = $1, \
                 instruction_kind = 'new_objective', act_on_envelope_id = $3, updated_at = now(), closed_at = now() \
                 WHERE task_id = $4",
            )
            .bind(revision)
            .bind(successor)
            .bind(carrier.id)
            .bind(task_id)
        }
        TaskWrite::State(state) => {
            sqlx::query("UPDATE tasks SET state = $1, revision = $2, updated_at = now() WHERE task_id = $3")
                .bind(state.as_str())
                .bind(revision)
                .bind(task_id)
        }
        TaskWrite::StopRequested => sqlx::query(
            "UPDATE tasks SET state = 'stop_requested', revision = $1, cancel_envelope_id = $2, \
             stop_requested_by = $3, stop_requested_at = now(), updated_at = now() WHERE task_id = $4",
        )
        .bind(revision)
        .bind(carrier.id)
        .bind(change.actor)
        .bind(task_id),
    };
    statement.execute(&mut *tx).await?;
    Ok(())
}

/// The instruction as it stood: the text of `message_id`'s latest correction (an edit of
/// it), or the task's latest correction, else its objective.
async fn last_instruction(
    tx: &mut PgConnection,
    task_id: &TaskId,
    message_id: Option<i64>,
) -> LedgerResult<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE((SELECT text FROM task_revisions WHERE task_id = $1 AND text IS NOT NULL \
         AND kind = 'correction' AND ($2::bigint IS NULL OR message_id = $2) ORDER BY id DESC LIMIT 1), \
         (SELECT objective FROM tasks WHERE task_id = $1))",
    )
    .bind(task_id)
    .bind(message_id)
    .fetch_one(&mut *tx)
    .await?)
}

/// A handoff's row and its instruction envelope's.
type HandoffRow = (i64, i64);

/// The task's open handoffs, oldest first: their rows, and what the planner sees of each,
/// in the same order. Held `FOR UPDATE`: the change retires them.
async fn open_handoffs(
    tx: &mut PgConnection,
    task_id: &TaskId,
) -> LedgerResult<(Vec<HandoffRow>, Vec<OpenHandoff>)> {
    let rows = sqlx::query(
        "SELECT id, envelope_id, handoff_id, from_agent, to_agent FROM handoffs WHERE task_id = $1 \
         AND state = 'open' ORDER BY id FOR UPDATE",
    )
    .bind(task_id)
    .fetch_all(&mut *tx)
    .await?;
    let mut handoffs = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for row in rows {
        handoffs.0.push((row.try_get("id")?, row.try_get("envelope_id")?));
        handoffs.1.push(OpenHandoff {
            handoff_id: row.try_get("handoff_id")?,
            from_agent: row.try_get("from_agent")?,
            to_agent: row.try_get("to_agent")?,
        });
    }
    Ok(handoffs)
}

/// What a change that retires older work writes: the task's queued and pending envelopes
/// made under earlier revisions become `superseded` (the carrier excepted), and so do the
/// retired handoffs and their instructions, whose agents are each queued the `revision`
/// envelope the plan wrote for them.
async fn supersede(
    tx: &mut PgConnection,
    task_id: &TaskId,
    plan: &ChangePlan,
    handoff_rows: &[HandoffRow],
    carrier: &Carrier,
    reason: &str,
    effects: &mut Vec<TaskEffect>,
) -> LedgerResult<()> {
    let revision = i64::from(plan.revision);
    let stale: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM envelopes WHERE task_id = $1 AND revision < $2 AND state IN ('queued', 'pending') \
         AND id <> $3 ORDER BY id",
    )
    .bind(task_id)
    .bind(revision)
    .bind(carrier.id)
    .fetch_all(&mut *tx)
    .await?;
    let from = [EnvelopeState::Queued, EnvelopeState::Pending];
    for id in stale {
        transition_in(tx, id, &from, EnvelopeState::Superseded, "switchboard", Some(reason)).await?;
    }
    // The plan retires every open handoff it was given, in their order.
    for (retired, (id, instruction)) in plan.retired_handoffs.iter().zip(handoff_rows) {
        sqlx::query("UPDATE handoffs SET state = 'superseded', closed_at = now(), note = $1 WHERE id = $2")
            .bind(reason)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        transition_in(tx, *instruction, &from, EnvelopeState::Superseded, "switchboard", Some(reason))
            .await?;
        sqlx::query(
            "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
             sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, \
             agent, state, state_changed_at, task_id, revision, meta) \
             VALUES ($1, NULL, 'revision', 0, NULL, 'agent', NULL, 0, NULL, NULL, 'switchboard', NULL, '[]', $2, \
             now(), now(), $3, $4, 'queued', now(), $5, $6, $7)",
        )
        .bind(TraceId::generate())
        .bind(&retired.notice)
        .bind(&carrier.route)
        .bind(&retired.to_agent)
        .bind(task_id)
        .bind(revision)
        .bind(retired.meta.to_string())
        .execute(&mut *tx)
        .await?;
        effects.push(TaskEffect::Wake(retired.to_agent.clone()));
    }
    Ok(())
}

async fn pending_by_agent(
    tx: &mut PgConnection,
    task_id: &TaskId,
    except: i64,
) -> LedgerResult<Vec<(String, TraceId)>> {
    Ok(sqlx::query_as(task_rows::PENDING_BY_AGENT).bind(task_id).bind(except).fetch_all(&mut *tx).await?)
}

/// Confirmed sends, unresolved attempts and open handoffs of a task.
async fn effects_of(tx: &mut PgConnection, task_id: &TaskId) -> LedgerResult<TaskEffects> {
    let confirmed = sqlx::query_as(
        "SELECT a.op_id, a.telegram_message_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
         WHERE e.task_id = $1 AND a.purpose = 'reply' AND a.outcome = 'sent' ORDER BY a.id",
    )
    .bind(task_id)
    .fetch_all(&mut *tx)
    .await?;
    let unresolved = sqlx::query_scalar(
        "SELECT a.op_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
         WHERE e.task_id = $1 AND a.purpose = 'reply' AND a.outcome IN ('unknown', 'in_flight') \
         AND a.reconciled_outcome IS NULL ORDER BY a.id",
    )
    .bind(task_id)
    .fetch_all(&mut *tx)
    .await?;
    let open_handoffs = sqlx::query_as(
        "SELECT handoff_id, to_agent FROM handoffs WHERE task_id = $1 AND state = 'open' ORDER BY id",
    )
    .bind(task_id)
    .fetch_all(&mut *tx)
    .await?;
    Ok(TaskEffects { confirmed, unresolved, open_handoffs })
}

/// The envelope a `revise_task` declaration is about.
#[derive(Debug, FromRow)]
struct DeclaredFor {
    id: i64,
    kind: String,
    task_id: Option<TaskId>,
    revision: Option<i64>,
    chat_id: i64,
    thread_id: Option<i64>,
    route: Option<String>,
    text: Option<String>,
    message_id: i64,
}

impl FromRow<'_, PgRow> for StoredRevision {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            revision: row.try_get("revision")?,
            kind: row.try_get("kind")?,
            source: row.try_get("source")?,
            actor: row.try_get("actor")?,
            // As SQLite stores it, so both backends list a revision alike.
            at: crate::clock::text(row.try_get("at")?),
            summary: row.try_get("summary")?,
            text: row.try_get("text")?,
            envelope_trace_id: row.try_get("envelope_trace_id")?,
            snapshot: row.try_get("snapshot")?,
        })
    }
}

#[async_trait]
impl Tasks for PgLedger {
    async fn admission(&self, envelope_id: i64) -> LedgerResult<Result<(), Refusal>> {
        let mut tx = self.begin().await?;
        let admitted = admission_in(&mut tx, envelope_id).await?;
        tx.commit().await?;
        Ok(admitted)
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
        let mut tx = self.begin().await?;
        // A repeat of a request is answered as the first was. (The bridge decides one
        // agent's actions one at a time: a repeat finds the first committed.)
        if let Some(request_id) = request_id {
            let before: Option<(String, Option<String>, Option<i64>)> =
                sqlx::query_as(task_rows::REVISION_BY_REQUEST)
                    .bind(&actor)
                    .bind(request_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(LedgerError::from)?;
            if let Some((kind, Some(task), Some(revision))) = before {
                tx.rollback().await?;
                return Ok((task_rows::repeated_revision(&kind, trace_id, task, revision), Vec::new()));
            }
        }
        // The envelope is held until the transaction ends: it is the change's carrier.
        let row: Option<DeclaredFor> = sqlx::query_as(
            "SELECT id, kind, task_id, revision, chat_id, thread_id, route, text, message_id FROM envelopes \
             WHERE trace_id = $1 AND agent = $2 AND state = 'pending' FOR UPDATE",
        )
        .bind(trace_id)
        .bind(agent.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(LedgerError::from)?;
        // A declaration refused ends the transaction with nothing written in it.
        let Some(DeclaredFor {
            id,
            kind: envelope_kind,
            task_id,
            revision,
            chat_id,
            thread_id,
            route,
            text,
            message_id,
        }) = row
        else {
            tx.rollback().await?;
            return Err(DeclareError::NotPending(trace_id.to_string()).into());
        };
        let (Some(task_id), Some(revision)) = (task_id, revision) else {
            tx.rollback().await?;
            return Err(DeclareError::NoTask(trace_id.to_string()).into());
        };
        hold_conversation(&mut tx, chat_id, thread_id, agent.as_str()).await?;
        // A task is written with the envelope that starts it: one missing is an error.
        let task = stored_task(&mut tx, &task_id).await?.ok_or_else(|| {
            LedgerError::other(format!("{trace_id} names task {task_id}, which is not stored"))
        })?;
        if let Err(refused) = admit_declaration(
            kind,
            &DeclaredAbout { trace_id, kind: &envelope_kind, agent: agent.as_str(), revision },
            &task,
        ) {
            tx.rollback().await?;
            return Err(refused.into());
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
        let effects = apply_change(&mut tx, &task, &carrier, &change).await?;
        let now_task: String = sqlx::query_scalar("SELECT task_id FROM envelopes WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(LedgerError::from)?;
        let declared = declared_revision(kind, trace_id, now_task, &task);
        if let Some(request_id) = request_id {
            sqlx::query(task_rows::KEEP_REVISION_REQUEST)
                .bind(request_id)
                .bind(&declared.task_id)
                .bind(i64::from(declared.revision))
                .bind(&actor)
                .execute(&mut *tx)
                .await
                .map_err(LedgerError::from)?;
        }
        tx.commit().await?;
        Ok((declared, effects))
    }

    async fn task_state(&self, task_id: &TaskId) -> LedgerResult<Option<TaskState>> {
        let row = sqlx::query("SELECT task_id, state FROM tasks WHERE task_id = $1")
            .bind(task_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| task_state(&row, "state")).transpose()?)
    }

    async fn task(&self, task_id: &TaskId) -> LedgerResult<Option<(Task, Vec<StoredRevision>, TaskEffects)>> {
        let mut tx = self.begin().await?;
        // A task that has finished says so, as it would to the next message.
        sqlx::query(concat!(close_if_finished!(), "AND task_id = $1"))
            .bind(task_id)
            .execute(&mut *tx)
            .await?;
        let sql = concat!("SELECT ", task_columns!(), task_from!(), "WHERE t.task_id = $1");
        let Some(task) = sqlx::query_as::<_, Task>(sql).bind(task_id).fetch_optional(&mut *tx).await? else {
            tx.commit().await?;
            return Ok(None);
        };
        // Revision 1 is the task itself; the changes follow.
        let revisions = sqlx::query_as(
            "SELECT 1::bigint AS revision, 'start' AS kind, t.started_source AS source, t.started_by AS actor, \
             t.opened_at AS at, CASE WHEN t.predecessor IS NULL THEN t.started_by || ' started it' \
             ELSE t.started_by || ' replaced ' || t.predecessor || ' with a new objective' END AS summary, \
             t.objective AS text, e.trace_id AS envelope_trace_id, '{}' AS snapshot, 0::bigint AS position \
             FROM tasks t JOIN envelopes e ON e.id = t.first_envelope_id WHERE t.task_id = $1 \
             UNION ALL \
             SELECT r.revision, r.kind, r.source, r.actor, r.at, r.summary, r.text, e.trace_id, r.snapshot, \
             r.id FROM task_revisions r LEFT JOIN envelopes e ON e.id = r.envelope_id WHERE r.task_id = $1 \
             ORDER BY position",
        )
        .bind(task_id)
        .fetch_all(&mut *tx)
        .await?;
        let effects = effects_of(&mut tx, task_id).await?;
        tx.commit().await?;
        Ok(Some((task, revisions, effects)))
    }

    async fn mark_task_stopped(&self, task_id: &TaskId, reason: &str) -> Result<(), DeclareTaskError> {
        let mut tx = self.begin().await?;
        // A refusal ends the transaction with nothing written in it.
        let Some(task) = stored_task(&mut tx, task_id).await? else {
            tx.rollback().await?;
            return Err(DeclareError::NotNow(format!("no task has id {task_id}")).into());
        };
        if task.state() != TaskState::StopRequested {
            tx.rollback().await?;
            return Err(DeclareError::NotNow(format!(
                "{task_id} is {}, not stop_requested: only a cancelled task can be marked stopped",
                task.state
            ))
            .into());
        }
        sqlx::query(
            "UPDATE tasks SET state = 'stopped', stopped_at = now(), stop_reason = $1, updated_at = now(), \
             closed_at = now() WHERE task_id = $2",
        )
        .bind(reason)
        .bind(task_id)
        .execute(&mut *tx)
        .await
        .map_err(LedgerError::from)?;
        let effects = effects_of(&mut tx, task_id).await?;
        sqlx::query(
            "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, snapshot) \
             VALUES ($1, $2, 'stopped', 'operator', 'operator', now(), $3, $4)",
        )
        .bind(task_id)
        .bind(task.revision)
        .bind(format!("an operator confirmed it stopped: {reason}"))
        .bind(snapshot_json(&effects))
        .execute(&mut *tx)
        .await
        .map_err(LedgerError::from)?;
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::conformance::fixtures::{in_chat, routed};

    #[test]
    fn a_batch_is_sorted_by_conversation_before_anything_is_read() {
        let mut edit = in_chat(7, 9, "fixed");
        edit.envelope.kind = EnvelopeKind::EditedMessage;
        let batch = [
            routed(1, EnvelopeState::Ignored),
            in_chat(2, 7, "work"),
            in_chat(3, 8, "work"),
            in_chat(4, 7, "/pause"),
            in_chat(5, 7, "more"),
            in_chat(6, 8, "more"),
            edit,
        ];
        let sorted = conversations_of(&batch, None);
        let conversation = |chat_id: i64| (chat_id, None, "orch".to_owned());
        assert_eq!(
            sorted.held,
            [conversation(7), conversation(8), conversation(9)],
            "every conversation, once"
        );
        assert_eq!(sorted.to_read, [conversation(7), conversation(8)], "those a plain message joins");
        use RowTask::{Joins, Later};
        assert_eq!(
            sorted.rows,
            // After the command, chat 7's messages are taken one by one; chat 8's are not.
            [RowTask::None, Joins(0), Joins(1), Later, Later, Joins(1), Later]
        );
    }

    #[test]
    fn a_batch_of_no_human_messages_holds_nothing() {
        let sorted =
            conversations_of(&[routed(1, EnvelopeState::Unrouted), routed(2, EnvelopeState::Ignored)], None);
        assert_eq!(sorted, Conversations { rows: vec![RowTask::None, RowTask::None], ..Default::default() });
    }
}
