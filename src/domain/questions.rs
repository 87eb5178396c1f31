//! Questions an agent asks in a chat, open until delivered and answered once.

use chrono::{DateTime, Utc};

use crate::domain::{AttemptState, Reconciliation};
use crate::ids::TraceId;

/// The `state` column of a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuestionState {
    Open,
    Delivered,
    NotDelivered,
    /// The envelope was settled another way (`switchboard ledger reconcile`).
    Settled,
}

impl QuestionState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Delivered => "delivered",
            Self::NotDelivered => "not_delivered",
            Self::Settled => "settled",
        }
    }

    /// A question an operator answered with `finding`.
    pub fn answered(finding: Reconciliation) -> Self {
        match finding {
            Reconciliation::Delivered => Self::Delivered,
            Reconciliation::NotDelivered => Self::NotDelivered,
        }
    }
}

/// A question as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredQuestion {
    pub id: String,
    pub op_id: String,
    pub envelope_id: i64,
    pub trace_id: TraceId,
    pub sent_chat_id: i64,
    pub sent_at: DateTime<Utc>,
    pub sent_text: String,
    pub state: QuestionState,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub prompt_send: AttemptState,
    pub prompt_message_id: Option<i32>,
    pub prompt_settled: bool,
    pub answered_by_name: Option<String>,
    pub answered_at: Option<DateTime<Utc>>,
}

/// What an operator's answer came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuestionAnswered {
    /// The envelope is reconciled, and the question records who answered.
    Reconciled,
    /// The envelope was no longer unresolved (answered first, or settled another way).
    TooLate,
}
