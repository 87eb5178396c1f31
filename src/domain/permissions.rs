//! Permission requests (DESIGN.md §15): a tool use a session asks an approver about, open
//! until answered or expired, answered once.

use chrono::{DateTime, Utc};

use crate::domain::AttemptState;

/// A verdict an approver gave.
pub use crate::rules::permissions::Verdict as PermissionVerdict;

/// The `state` column: what a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionState {
    /// Asked, and neither answered nor expired.
    Pending,
    Allowed,
    Denied,
    /// Unanswered at its timeout, its session ended, or its prompt could not be posted:
    /// the terminal is where it gets answered.
    Expired,
}

impl PermissionState {
    pub const ALL: [Self; 4] = [Self::Pending, Self::Allowed, Self::Denied, Self::Expired];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }
}

impl std::fmt::Display for PermissionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Why a request expired (`expired_because`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiredBecause {
    /// Nobody answered within `timeout_secs`.
    Timeout,
    /// The plugin process that asked is gone.
    SessionEnded,
    /// Its prompt was provably not posted.
    PromptNotSent,
}

impl ExpiredBecause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::SessionEnded => "session_ended",
            Self::PromptNotSent => "prompt_not_sent",
        }
    }
}

/// A request to record, before anything is posted.
#[derive(Debug, Clone)]
pub struct NewPermissionRequest<'a> {
    /// The switchboard's opaque id (`prm_…`): what the prompt's buttons carry.
    pub id: &'a str,
    pub agent: &'a str,
    pub session_id: &'a str,
    pub plugin_id: &'a str,
    /// Claude Code's id of the request (five letters).
    pub request_id: &'a str,
    pub tool_name: &'a str,
    pub description: &'a str,
    pub input_preview: &'a str,
    pub expires_at: &'a str,
    pub route: &'a str,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
}

/// A request as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPermission {
    pub id: String,
    pub agent: String,
    pub session_id: String,
    pub plugin_id: String,
    pub request_id: String,
    pub tool_name: String,
    pub description: String,
    pub input_preview: String,
    pub asked_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub state: PermissionState,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    /// The prompt's `sendMessage`, classified as an attempt is (DESIGN.md §4): an
    /// `unknown` prompt is never sent again.
    pub prompt_send: AttemptState,
    pub prompt_message_id: Option<i32>,
    pub prompt_error: Option<String>,
    pub prompt_settled: bool,
    pub answered_by: Option<i64>,
    pub answered_by_name: Option<String>,
    pub answered_at: Option<DateTime<Utc>>,
    pub expired_because: Option<String>,
    /// When the verdict was first written to the asking plugin's session stream.
    pub verdict_sent_at: Option<DateTime<Utc>>,
    /// When the asking plugin confirmed it handed the verdict to Claude Code: until then
    /// the verdict is owed, and written again on each stream the plugin opens.
    pub verdict_handed_at: Option<DateTime<Utc>>,
}

impl PermissionState {
    /// The state a verdict puts a request in.
    pub fn of(verdict: PermissionVerdict) -> Self {
        match verdict {
            PermissionVerdict::Allow => Self::Allowed,
            PermissionVerdict::Deny => Self::Denied,
        }
    }
}

/// What recording a verdict came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerRecorded {
    /// This verdict is the one: the row as it is now.
    Recorded(StoredPermission),
    /// The request was no longer pending (answered first, or expired): nothing changed.
    TooLate(StoredPermission),
    /// No request has that id.
    Unknown,
}

/// Whose requests a session's end expires.
#[derive(Debug, Clone, Copy)]
pub enum EndedPlugins<'a> {
    /// This plugin process's session ended.
    This(&'a str),
    /// A session of every plugin process but this one (a new one connected for the agent).
    AllBut(&'a str),
}
