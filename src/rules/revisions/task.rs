//! A task as the rest of the switchboard knows it: the record the ledger keeps, and what
//! the task has done. Plain data; the ledger reads it from its rows, the planner and the
//! texts take it as it is.

use chrono::{DateTime, Utc};

use super::{ChangeKind, InstructionChange, TaskNow, TaskState};
use crate::ids::{TaskId, TraceId};

/// A task: a conversation's unit of work and where it stands (DESIGN.md §11).
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub task_id: TaskId,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub agent: String,
    pub route: String,
    pub state: TaskState,
    pub revision: i64,
    pub objective: String,
    /// The task this one replaced with a new objective, and the one that replaced it.
    pub predecessor: Option<TaskId>,
    pub successor: Option<TaskId>,
    pub instruction_revision: Option<i64>,
    pub instruction_kind: Option<String>,
    /// The trace id of the envelope that carries the current instruction.
    pub act_on: Option<TraceId>,
    pub stop_requested_by: Option<String>,
    pub stop_requested_at: Option<DateTime<Utc>>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub stop_reason: Option<String>,
    pub opened_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

impl Task {
    pub fn state(&self) -> TaskState {
        self.state
    }

    /// The revision as a counter (the ledger stores it as an integer column).
    pub fn revision(&self) -> u32 {
        to_u32(self.revision)
    }

    /// What admission needs to know of it.
    pub fn now(&self) -> TaskNow {
        let instruction_change = match (self.instruction_kind.as_deref(), self.instruction_revision) {
            (Some(kind), Some(revision)) => Some(InstructionChange {
                kind: if kind == "new_objective" { ChangeKind::NewObjective } else { ChangeKind::Correction },
                revision: to_u32(revision),
                act_on: self.act_on.as_ref().map(ToString::to_string).unwrap_or_default(),
            }),
            _ => None,
        };
        TaskNow {
            task_id: self.task_id.clone(),
            revision: self.revision(),
            state: self.state,
            instruction_change,
        }
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

/// A stored counter as a revision number; a value past `u32` (never written) saturates.
pub fn to_u32(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
impl Task {
    /// A task of revision 2 in `state`, with no instruction change and nothing stopped:
    /// for tests, which set what else they need.
    pub(crate) fn sample(state: TaskState) -> Self {
        Self {
            task_id: "task_aaaaaaaa".into(),
            chat_id: 1,
            thread_id: None,
            agent: "orchestrator".into(),
            route: "owner-dm".into(),
            state,
            revision: 2,
            objective: "write the report".into(),
            predecessor: None,
            successor: None,
            instruction_revision: None,
            instruction_kind: None,
            act_on: None,
            stop_requested_by: None,
            stop_requested_at: None,
            stopped_at: None,
            stop_reason: None,
            opened_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
            closed_at: None,
        }
    }
}
