//! Tasks and their revisions (DESIGN.md §11) as an operator and the drivers see them. The
//! task itself, its states and its planning are in `rules::revisions`.

use crate::ids::{TaskId, TraceId};
use crate::ledger::LedgerError;
use crate::rules::revisions::{ChangeKind, Refusal};

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

/// What the switchboard does once a transaction that changed tasks has committed.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEffect {
    /// The bot owes a post in the conversation (recorded with the change): an
    /// acknowledgement, an answer to `/status`, or why nothing changed.
    Say(BotPost),
    /// A `pause` or `resume` notice to the agent, about its latest pending envelope of the
    /// task.
    Notice { agent: String, trace_id: TraceId, kind: ChangeKind, task_id: TaskId, revision: u32 },
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
    pub trace_id: TraceId,
    pub agent: String,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub text: String,
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
    #[error(
        "{0} is not a message a person sent you about your own task (it is a handoff, an answer, a notice or a room turn); only such a message can change a task; nothing changed"
    )]
    NotAMessage(String),
    #[error("{0}; nothing changed")]
    NotNow(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// [`DeclareError`] or the ledger failing.
#[derive(Debug, thiserror::Error)]
pub enum DeclareTaskError {
    #[error(transparent)]
    Declined(#[from] DeclareError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}
