//! Tasks and revisions (DESIGN.md §11) on PostgreSQL: the reads every backend's
//! transactions share, beginning with admission.
//!
//! **Serialising a change and an action.** SQLite's one writer puts every change to a task
//! and every admission in one order. Here a transaction that changes a task takes its row
//! `FOR UPDATE`, and admission reads it `FOR SHARE`: an action admitted in a transaction
//! still open holds back a change to its task until that transaction ends, and an action
//! admitted after the change reads the task as changed. So a correction recorded while a
//! reply is being resolved can never let the old reply out, on any replica.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};

use crate::ledger::LedgerResult;
use crate::rules::revisions::task::to_u32;
use crate::rules::revisions::{self, Refusal, Task, TaskState};

/// The columns of a [`Task`] (`t` the task, `a` the envelope to act on), as SQLite's
/// `task_columns!` names them.
macro_rules! task_columns {
    () => {
        "t.task_id, t.chat_id, t.thread_id, t.agent, t.route, t.state, t.revision, t.objective, \
         t.predecessor, t.successor, t.instruction_revision, t.instruction_kind, a.trace_id AS act_on, \
         t.stop_requested_by, t.stop_requested_at, t.stopped_at, t.stop_reason, t.opened_at, t.updated_at, \
         t.closed_at"
    };
}
pub(super) use task_columns;

macro_rules! task_from {
    () => {
        " FROM tasks t LEFT JOIN envelopes a ON a.id = t.act_on_envelope_id "
    };
}
pub(super) use task_from;

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
