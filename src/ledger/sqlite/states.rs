//! The ledger's vocabulary: the states an envelope can be in (DESIGN.md §2).

use std::fmt;

use serde::{Deserialize, Serialize};

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
