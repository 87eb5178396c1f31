//! Handoffs (DESIGN.md §9): one agent's instruction to another, open until answered once.

use chrono::{DateTime, Utc};

use crate::domain::StoredEnvelope;
use crate::ids::{AgentName, HandoffId, TaskId, TraceId};
use crate::rules::guard::Intent;

/// The `state` column of a handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoffState {
    /// Waiting for the target's answer.
    Open,
    Answered,
    /// The target acked it without an answer.
    Closed,
    /// A change to the task made it obsolete (DESIGN.md §11).
    Superseded,
}

impl HandoffState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Answered => "answered",
            Self::Closed => "closed",
            Self::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for HandoffState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A handoff as stored, with the trace ids of its envelopes.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredHandoff {
    pub id: i64,
    pub handoff_id: HandoffId,
    pub from_agent: String,
    pub to_agent: String,
    pub instruction: String,
    pub cause_envelope_id: Option<i64>,
    /// The cause's trace id, when there is a cause.
    pub cause_trace_id: Option<TraceId>,
    pub depth: i64,
    pub followup_of: Option<HandoffId>,
    pub intent: Option<Intent>,
    pub request_id: Option<String>,
    pub envelope_id: i64,
    /// The target's `handoff` envelope.
    pub envelope_trace_id: TraceId,
    pub answer_envelope_id: Option<i64>,
    pub answer_trace_id: Option<TraceId>,
    pub answer_request_id: Option<String>,
    pub state: HandoffState,
    pub opened_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub note: Option<String>,
    /// The task the handoff was made for (DESIGN.md §11), if any.
    pub task_id: Option<TaskId>,
    /// The child's answer after a change superseded the handoff: kept, never delivered.
    pub late_result: Option<String>,
}

/// A handoff the guard admitted, to record.
#[derive(Debug, Clone)]
pub struct NewHandoff<'a> {
    pub from: &'a AgentName,
    pub to: &'a AgentName,
    pub instruction: &'a str,
    pub cause: Option<&'a StoredEnvelope>,
    pub depth: u32,
    pub followup_of: Option<&'a HandoffId>,
    pub intent: Option<Intent>,
    pub request_id: &'a str,
}

/// How a handoff ends.
#[derive(Debug, Clone, Copy)]
pub enum HandoffEnd<'a> {
    /// The target replied: the text goes to the delegator.
    Answered { text: &'a str, request_id: Option<&'a str> },
    /// The target acked it without an answer.
    Closed { note: Option<&'a str> },
}

/// What a ledger records when a handoff ends, whichever backend records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffEnding<'a> {
    pub state: HandoffState,
    /// The delegator's `handoff_answer` envelope: the answer, or word that none came.
    pub answer: String,
    /// Why the target's `handoff` envelope was acked, in its history.
    pub reason: String,
    pub note: Option<&'a str>,
    /// The target's reply request that answered it, if it did.
    pub request_id: Option<&'a str>,
}

impl<'a> HandoffEnd<'a> {
    /// What ending `handoff` this way records.
    pub fn recorded_as(self, handoff: &StoredHandoff) -> HandoffEnding<'a> {
        match self {
            Self::Answered { text, request_id } => HandoffEnding {
                state: HandoffState::Answered,
                answer: text.to_owned(),
                reason: format!("answered ({})", handoff.handoff_id),
                note: None,
                request_id,
            },
            Self::Closed { note } => {
                let said = note.map_or_else(String::new, |note| format!(": {note}"));
                HandoffEnding {
                    state: HandoffState::Closed,
                    answer: format!(
                        "'{}' closed handoff {} without an answer{said}",
                        handoff.to_agent, handoff.handoff_id
                    ),
                    reason: format!("closed without an answer ({}){said}", handoff.handoff_id),
                    note,
                    request_id: None,
                }
            }
        }
    }
}
