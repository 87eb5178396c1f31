//! Envelopes (DESIGN.md §2, §8): what an envelope is, which states it can be in, and the
//! rows the poller records and the bridge reads.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{AgentName, RouteName, TaskId, TraceId};
use crate::telegram::envelope::{ChatType, Envelope, sender_display};
use crate::telegram::parts::{Attachment, stored_attachments};

/// How many characters of a message identify it in a candidate list or a listing.
const PREVIEW_CHARS: usize = 80;

/// A row the poller records: a routed message, or an audit row (an ignored message, an
/// undecodable update).
#[derive(Debug, Clone)]
pub struct RoutedEnvelope {
    pub envelope: Envelope,
    pub state: EnvelopeState,
    /// The route that matched; on an `ignored` row only when a `mention_only` route kept
    /// the message as not addressed to the bot ([`Self::unaddressed`]).
    pub route: Option<RouteName>,
    pub agent: Option<AgentName>,
    /// The digest of the update's raw JSON (see `RawUpdate::digest`): with the update id,
    /// what makes a re-polled update the same one.
    pub update_digest: String,
    /// Why an ignored or undecodable row is no work.
    pub note: Option<String>,
    /// An undecodable update as received.
    pub raw_update: Option<String>,
}

impl RoutedEnvelope {
    /// Whether a `mention_only` route kept this message as not addressed to the bot: the
    /// one kind of `ignored` row recorded under its route. Such a row of an album joins
    /// the album once an item of it is addressed (`rules::albums`).
    pub fn unaddressed(&self) -> bool {
        self.state == EnvelopeState::Ignored && self.route.is_some()
    }

    /// The album this row is an item of, when what it says to the bot counts for its
    /// album (`rules::albums`): a new message of an album, recorded under its route as
    /// work for an agent or as not addressed to the bot.
    pub fn album(&self) -> Option<AlbumKey> {
        let e = &self.envelope;
        let media_group_id = e.context.album.clone()?;
        let route = self.route.as_ref()?;
        let counts = self.unaddressed() || (self.state == EnvelopeState::Queued && self.agent.is_some());
        (e.kind == EnvelopeKind::Message && counts).then(|| AlbumKey {
            chat_id: e.channel.chat_id,
            media_group_id,
            route: route.to_string(),
        })
    }
}

/// An album under one route: Telegram's `media_group_id`, unique to the album, in its chat.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AlbumKey {
    pub chat_id: i64,
    pub media_group_id: String,
    pub route: String,
}

/// An envelope recorded as not addressed to the bot (an item of an album, on a
/// `mention_only` route, without the caption that mentions the bot) that joined its album
/// when an item of it was recorded addressed: now `queued` for `agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedAlbum {
    pub trace_id: TraceId,
    pub agent: String,
}

/// An envelope as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEnvelope {
    pub id: i64,
    pub trace_id: TraceId,
    /// None for an envelope an agent made.
    pub update_id: Option<i64>,
    pub kind: EnvelopeKind,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub chat_type: ChatType,
    pub chat_title: Option<String>,
    pub message_id: i64,
    pub sender_id: Option<i64>,
    pub sender_username: Option<String>,
    pub sender_name: String,
    pub text: Option<String>,
    pub attachments: String,
    pub content: String,
    pub sent_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    pub route: Option<String>,
    pub agent: Option<String>,
    pub state: EnvelopeState,
    pub deliveries: i64,
    pub state_changed_at: DateTime<Utc>,
    pub note: Option<String>,
    /// The task and revision it was made under (DESIGN.md §11), if it belongs to one.
    pub task_id: Option<TaskId>,
    pub revision: Option<i64>,
    /// Extra meta for the agent, a JSON object (a revision envelope's change and texts).
    pub meta: Option<String>,
}

/// An envelope a reply names, with what its attempts say (see `Envelopes::find_for_reply`).
#[derive(Debug, Clone, PartialEq)]
pub struct FoundForReply {
    pub envelope: StoredEnvelope,
    /// An attempt for it has an unknown outcome no operator has reconciled yet.
    pub awaiting_reconciliation: bool,
    /// A `reply` request was made for it before (its attempts carry a request id).
    pub replied_before: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub at: String,
    pub from_state: String,
    pub to_state: String,
    pub actor: String,
    pub reason: Option<String>,
}

/// The ledger states of DESIGN.md §2. Stored as their snake_case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeState {
    /// Stored; its agent's session has not taken it yet.
    Queued,
    /// Handed to the agent's session, not yet answered.
    Pending,
    /// Answered (delivery confirmed) or acked explicitly.
    Acked,
    /// A reply's outcome is unknown; an operator must reconcile it.
    Unresolved,
    /// No route matched its channel.
    Unrouted,
    /// Its sender is not on the allowlist.
    Rejected,
    /// A service message (a pin, a new member, a topic event, …) or a live-location edit:
    /// kept for audit, never work for an agent. Its note says which.
    Ignored,
    /// An update that could not be decoded or converted: kept raw for audit, never work
    /// for an agent.
    Undecodable,
    /// A correction, a new objective or a cancel replaced the instruction it was made
    /// under (DESIGN.md §11): kept for audit, no longer work; the task's `revision`
    /// envelope is the one to act on.
    Superseded,
}

impl EnvelopeState {
    pub const ALL: [EnvelopeState; 9] = [
        Self::Queued,
        Self::Pending,
        Self::Acked,
        Self::Unresolved,
        Self::Unrouted,
        Self::Rejected,
        Self::Ignored,
        Self::Undecodable,
        Self::Superseded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Pending => "pending",
            Self::Acked => "acked",
            Self::Unresolved => "unresolved",
            Self::Unrouted => "unrouted",
            Self::Rejected => "rejected",
            Self::Ignored => "ignored",
            Self::Undecodable => "undecodable",
            Self::Superseded => "superseded",
        }
    }
}

impl fmt::Display for EnvelopeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl EnvelopeState {
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|state| state.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|state| state.as_str()).collect();
            format!("unknown state '{s}' (one of: {})", known.join(", "))
        })
    }
}

/// For clap (`ledger list --state`).
impl std::str::FromStr for EnvelopeState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// For code that reads the state column as text.
impl TryFrom<String> for EnvelopeState {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

/// What an envelope is (DESIGN.md §8): a Telegram message (new or edited), or something
/// an agent or the switchboard made. `meta.kind` shows it, with an edit shown as a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeKind {
    Message,
    /// An edit of an earlier message, recorded as an envelope of its own.
    EditedMessage,
    /// An undecodable update: what it was could not be read.
    Unknown,
    /// Another agent's instruction (§9).
    Handoff,
    /// The answer to a handoff this agent made (§9).
    HandoffAnswer,
    /// A group room giving this agent the floor (§10): its content is the exchange so far.
    RoomTurn,
    /// A change to the task the agent works on (§11): a correction, a new objective, a
    /// cancel; for a child, word that its handoff no longer stands.
    Revision,
}

impl EnvelopeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::EditedMessage => "edited_message",
            Self::Unknown => "unknown",
            Self::Handoff => "handoff",
            Self::HandoffAnswer => "handoff_answer",
            Self::RoomTurn => "room_turn",
            Self::Revision => "revision",
        }
    }

    /// The kind the agent sees: an edit is a message (marked `edited`).
    pub fn meta_kind(self) -> &'static str {
        match self {
            Self::EditedMessage => Self::Message.as_str(),
            other => other.as_str(),
        }
    }

    /// Whether it came from Telegram (and has a chat, a sender and a message id).
    pub fn is_telegram(self) -> bool {
        matches!(self, Self::Message | Self::EditedMessage | Self::Unknown)
    }
}

impl fmt::Display for EnvelopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl StoredEnvelope {
    /// Its files, as intake stored them (see `telegram::parts::Attachment`).
    pub fn attachment_list(&self) -> Vec<Attachment> {
        stored_attachments(&self.attachments)
    }

    pub fn user(&self) -> String {
        sender_display(self.sender_username.as_deref(), &self.sender_name)
    }

    pub fn thread_id(&self) -> Option<i32> {
        self.thread_id.and_then(|t| i32::try_from(t).ok())
    }

    pub fn preview(&self) -> String {
        let mut preview: String = self.content.chars().take(PREVIEW_CHARS).collect();
        if self.content.chars().count() > PREVIEW_CHARS {
            preview.push('…');
        }
        preview.replace('\n', " ")
    }

    /// `task`, `revision`, and the extra meta stored with it, as the agent sees them.
    pub fn task_meta(&self) -> std::collections::BTreeMap<String, String> {
        let mut meta = std::collections::BTreeMap::new();
        if let (Some(task), Some(revision)) = (&self.task_id, self.revision) {
            meta.insert("task".to_owned(), task.to_string());
            meta.insert("revision".to_owned(), revision.to_string());
        }
        let stored = self.meta.as_deref().and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok());
        if let Some(serde_json::Value::Object(stored)) = stored {
            for (key, value) in stored {
                let value = match value {
                    serde_json::Value::String(text) => text,
                    other => other.to_string(),
                };
                if !value.is_empty() {
                    meta.insert(key, value);
                }
            }
        }
        meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_text() {
        for state in EnvelopeState::ALL {
            assert_eq!(EnvelopeState::parse(state.as_str()), Ok(state));
        }
        assert!(EnvelopeState::parse("done").is_err());
        assert!(EnvelopeState::parse("done").unwrap_err().contains("ignored, undecodable"));
    }
}
