//! Group rooms (DESIGN.md §10): cascades, their turns, the posts they owe, and the steps
//! that move them, each applied once against the version it was decided on.

use chrono::{DateTime, Utc};

use crate::domain::{EnvelopeState, StoredEnvelope};
use crate::ids::{AgentName, CascadeId, TraceId};
use crate::rules::turns::{Cascade, CascadeState, Outcome};

/// The `state` column of a cascade: `waiting` behind the room's running exchange, then the
/// states of [`CascadeState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoomCascadeState {
    Waiting,
    Running,
    StopRequested,
    Stopped,
    Completed,
    BudgetExhausted,
}

impl RoomCascadeState {
    pub const ALL: [Self; 6] = [
        Self::Waiting,
        Self::Running,
        Self::StopRequested,
        Self::Stopped,
        Self::Completed,
        Self::BudgetExhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::StopRequested => "stop_requested",
            Self::Stopped => "stopped",
            Self::Completed => "completed",
            Self::BudgetExhausted => "budget_exhausted",
        }
    }

    /// Still to run, or running: the room is busy until it is over.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Waiting | Self::Running | Self::StopRequested)
    }
}

impl From<CascadeState> for RoomCascadeState {
    fn from(state: CascadeState) -> Self {
        match state {
            CascadeState::Running => Self::Running,
            CascadeState::StopRequested => Self::StopRequested,
            CascadeState::Stopped => Self::Stopped,
            CascadeState::Completed => Self::Completed,
            CascadeState::BudgetExhausted => Self::BudgetExhausted,
        }
    }
}

impl std::fmt::Display for RoomCascadeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// How a turn ended (the `ending` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnEnding {
    Replied,
    Passed,
    TimedOut,
}

impl TurnEnding {
    /// In words, for people and models.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replied => "replied",
            Self::Passed => "passed",
            Self::TimedOut => "timed out",
        }
    }

    /// As the `ending` column holds it.
    pub(crate) fn stored(self) -> &'static str {
        match self {
            Self::Replied => "replied",
            Self::Passed => "passed",
            Self::TimedOut => "timed_out",
        }
    }
}

/// A cascade as stored, with its human message's trace id and Telegram message id.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCascade {
    pub id: i64,
    pub cascade_id: CascadeId,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub message_envelope_id: i64,
    pub message_trace_id: TraceId,
    pub message_id: i64,
    pub state: RoomCascadeState,
    /// The serialised [`Cascade`]; [`StoredCascade::cascade`] reads it.
    pub cascade: String,
    pub max_iters: i64,
    pub speaker_timeout_secs: i64,
    pub stop_by: Option<String>,
    pub stop_requested_at: Option<DateTime<Utc>>,
    /// How it ended, once it has; read strictly (an outcome this switchboard cannot read is
    /// an error, not an exchange still running).
    pub outcome: Option<Outcome>,
    pub outcome_text: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// Counts the steps applied to it: a step decided on one version applies only while
    /// the cascade still holds it (see [`CascadeUpdate::decided_on`]).
    pub version: i64,
}

/// A turn as stored, with its room_turn envelope's trace id and state.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTurn {
    pub id: i64,
    /// The cascade's row id.
    pub cascade_row: i64,
    pub speaker: i64,
    pub agent: String,
    pub summoned_by: String,
    pub envelope_id: i64,
    pub envelope_trace_id: TraceId,
    pub envelope_state: EnvelopeState,
    pub started_at: DateTime<Utc>,
    pub reply_text: Option<String>,
    pub reply_request_id: Option<String>,
    pub ended_at: Option<DateTime<Utc>>,
    pub ending: Option<TurnEnding>,
}

/// Something the switchboard says in a room.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPost {
    pub id: i64,
    pub key: String,
    pub envelope_id: i64,
    pub envelope_trace_id: TraceId,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub text: String,
    pub made: bool,
    pub created_at: DateTime<Utc>,
    pub made_at: Option<DateTime<Utc>>,
}

/// A human message made into a cascade: it waits until the room is free.
#[derive(Debug, Clone)]
pub struct NewCascade<'a> {
    pub message: &'a StoredEnvelope,
    pub cascade: &'a Cascade,
    pub max_iters: u32,
    pub speaker_timeout_secs: u64,
}

/// The cascade row after a step.
#[derive(Debug, Clone)]
pub struct CascadeUpdate<'a> {
    pub id: i64,
    /// The version of the cascade the step was decided on: another step applied in
    /// between fails this one.
    pub decided_on: i64,
    pub cascade: &'a Cascade,
    /// A `/stop` this step recorded: who sent it.
    pub stop_by: Option<&'a str>,
    /// Set once the cascade is over: the outcome and what the room was told.
    pub outcome: Option<(Outcome, Option<String>)>,
}

/// A turn this step ends.
#[derive(Debug, Clone)]
pub struct TurnClose<'a> {
    pub turn: &'a StoredTurn,
    pub ending: TurnEnding,
    /// For a timeout: the reason its still-open room_turn envelope is acked by the daemon.
    pub timed_out: Option<&'a str>,
}

/// A speaker this step gives the floor to: a room_turn envelope queued for it.
#[derive(Debug, Clone)]
pub struct TurnOpen<'a> {
    pub speaker: u32,
    pub agent: &'a AgentName,
    pub summoned_by: &'a str,
    /// The human message the exchange answers (chat, topic, sender, message id).
    pub message: &'a StoredEnvelope,
    /// The exchange so far: the envelope's content.
    pub content: &'a str,
}

/// Something the switchboard will say in the room, recorded with the step that causes it.
#[derive(Debug, Clone)]
pub struct NewPost<'a> {
    /// Unique: the request id of its attempts, so it is never posted twice.
    pub key: String,
    /// The envelope it answers (the human message, or a `/stop`): its chat and message.
    pub answers: &'a StoredEnvelope,
    pub text: String,
}

/// One decided step of a room, applied together or not at all.
#[derive(Debug, Clone, Default)]
pub struct RoomStep<'a> {
    pub cascade: Option<CascadeUpdate<'a>>,
    pub close: Option<TurnClose<'a>>,
    pub open: Option<TurnOpen<'a>>,
    pub posts: Vec<NewPost<'a>>,
    /// An inbox envelope (a human message or command in the room) this step handled:
    /// it leaves `queued` for `acked`, with this note.
    pub settle: Option<(&'a StoredEnvelope, String)>,
}

/// What an applied step made.
#[derive(Debug, Clone, Default)]
pub struct AppliedStep {
    /// The room_turn envelope of the speaker given the floor: (row id, trace id).
    pub opened: Option<(i64, String)>,
}

/// Why a reply could not claim its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimRefused {
    /// The envelope is no room_turn envelope of any turn.
    NoTurn,
    /// The turn already ended.
    Ended(TurnEnding),
    /// A reply was already claimed for this turn (by this request id).
    AlreadyReplied { request_id: Option<String> },
    /// The turn envelope is not pending (acked: the turn is ending).
    NotPending(EnvelopeState),
}
