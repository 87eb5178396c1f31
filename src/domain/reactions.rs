//! Reactions on the bot's messages (DESIGN.md §14), owed to the agent whose reply they are on.

use chrono::{DateTime, Utc};

use crate::ids::TraceId;
use crate::telegram::parts::Reaction;

/// A reaction the poller records, with what makes a re-polled update the same one.
#[derive(Debug, Clone)]
pub struct RoutedReaction {
    pub reaction: Reaction,
    /// See `RoutedEnvelope::update_digest`.
    pub update_digest: String,
    /// Its sender may not speak to an agent in its chat (`allowed_users`): kept for audit,
    /// owed to nobody, as a message of theirs is rejected.
    pub sender_rejected: bool,
}

/// A reaction owed to (or given to) an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReaction {
    pub id: i64,
    pub agent: String,
    /// The envelope the reacted message answered.
    pub trace_id: TraceId,
    pub chat_id: i64,
    pub message_id: i64,
    pub user_id: Option<i64>,
    pub user: String,
    /// The reactions now set, space-separated.
    pub emoji: String,
    pub reacted_at: DateTime<Utc>,
}

/// A reaction as the audit trail shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReactionAudit {
    /// `owed`, `delivered` or `ignored`.
    pub state: String,
    pub agent: Option<String>,
    pub trace_id: Option<String>,
    pub emoji: String,
    /// Why it reaches nobody, when ignored.
    pub note: Option<String>,
}
