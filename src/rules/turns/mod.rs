//! Group rooms (DESIGN.md §10): who a room message summons, and who has the floor.
//!
//! Pure: plain data in, decisions out, no clock and no I/O. [`RoomRoster`] is built once
//! per room from the configuration; [`Cascade`] is one exchange's state, which the caller
//! stores (it is serde data) after every step and drives one step at a time:
//!
//! ```
//! use std::num::NonZeroU32;
//! use switchboard::ids::{AgentName, TraceId};
//! use switchboard::rules::turns::*;
//!
//! let agent = |name| AgentName::parse(name).unwrap();
//! let roster = RoomRoster::new(vec![
//!     RoomMember::new(agent("builder")).with_display_name("Builder"),
//!     RoomMember::new(agent("reviewer")).with_display_name("Reviewer"),
//! ])
//! .unwrap();
//! let message = HumanMessage {
//!     author: "ana".into(),
//!     text: "@builder explain the parser change".into(),
//!     trace_id: TraceId::parse("env_0000000001").unwrap(),
//! };
//! let mut cascade = Cascade::start(&roster, message, NonZeroU32::new(10).unwrap());
//!
//! let Next::Speak(turn) = cascade.next_speaker() else { unreachable!() };
//! assert_eq!((turn.speaker, turn.agent.as_str(), turn.summoned_by.name()), (1, "builder", "ana"));
//! // … send Builder a room_turn envelope with cascade.transcript_text(&roster); it answers:
//! let reply = TurnEnd::Replied {
//!     text: "done; @reviewer check the edge cases".into(),
//!     trace_id: TraceId::parse("env_0000000002").unwrap(),
//! };
//! let ended = cascade.end_turn(&roster, turn.speaker, reply).unwrap();
//! assert_eq!(ended.queued, [agent("reviewer")]);
//!
//! let Next::Speak(turn) = cascade.next_speaker() else { unreachable!() };
//! assert_eq!((turn.speaker, turn.summoned_by.name()), (2, "builder"));
//! cascade.end_turn(&roster, turn.speaker, TurnEnd::Passed).unwrap();
//! assert!(matches!(cascade.next_speaker(), Next::Over(Outcome::Completed { turns_used: 2, replies: 1 })));
//! ```

mod cascade;
mod mentions;

pub use cascade::{
    BudgetReport, Cascade, CascadeState, Evidence, HumanMessage, Line, Next, OpenQuestion, Outcome,
    Participant, Queued, StopRecord, StopRefused, StopReport, Stopping, Turn, TurnEnd, TurnEnded, TurnError,
    TurnRecord,
};
pub use mentions::{RoomMember, RoomRoster, RosterError, mention_tokens, mentions, normalise};

/// `[rooms] cascade_limit` when none is configured: agent turns per human message.
pub const DEFAULT_CASCADE_LIMIT: u32 = 10;

/// `[rooms] group_max_iters` when none (or 0, or a negative number) is configured: the
/// tool-loop budget each speaker is told. With [`DEFAULT_CASCADE_LIMIT`], one human
/// message costs at most 10 × 50 = 500 iterations.
pub const DEFAULT_GROUP_MAX_ITERS: u32 = 50;

/// `[rooms] speaker_timeout_secs` when none is configured: ten minutes is long enough for
/// a real piece of work, short enough that a stuck speaker does not hold the room all day.
pub const DEFAULT_SPEAKER_TIMEOUT_SECS: u64 = 600;

/// The `max_iters` a speaker is told for a configured `group_max_iters`: 0 or a negative
/// value selects [`DEFAULT_GROUP_MAX_ITERS`].
pub fn effective_max_iters(configured: i64) -> u32 {
    if configured <= 0 { DEFAULT_GROUP_MAX_ITERS } else { u32::try_from(configured).unwrap_or(u32::MAX) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_default_is_50_and_zero_or_negative_select_it() {
        assert_eq!(DEFAULT_GROUP_MAX_ITERS, 50);
        assert_eq!(effective_max_iters(0), 50);
        assert_eq!(effective_max_iters(-3), 50);
        assert_eq!(effective_max_iters(i64::MIN), 50);
        assert_eq!(effective_max_iters(1), 1);
        assert_eq!(effective_max_iters(80), 80);
        assert_eq!(effective_max_iters(i64::MAX), u32::MAX);
    }
}
