//! Send attempts (DESIGN.md §3-§4): recorded before the request, classified after; what a
//! reply's attempts add up to; what an operator finds out about an unknown one.

use chrono::{DateTime, Utc};

use crate::domain::EnvelopeState;
use crate::ids::{AttemptId, TraceId};
use crate::ledger::LedgerError;

/// What a send attempt is about to do, recorded before the request is made.
#[derive(Debug, Clone)]
pub struct NewAttempt<'a> {
    pub envelope_id: i64,
    pub agent: &'a str,
    /// The `reply` request this attempt belongs to (chosen by the channel plugin).
    pub request_id: Option<&'a str>,
    pub purpose: AttemptPurpose,
    /// The Bot API call this attempt makes.
    pub method: AttemptMethod,
    /// `set_reaction` / `edit_message`: the Telegram message acted on.
    pub target_message_id: Option<i32>,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub reply_to_message_id: Option<i32>,
    pub chunk_index: usize,
    pub chunk_count: usize,
    pub text: &'a str,
}

/// How an attempt ended, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    Sent { message_id: i32 },
    NotSent { error: String },
    Unknown { error: String },
}

impl AttemptOutcome {
    pub fn state(&self) -> AttemptState {
        match self {
            Self::Sent { .. } => AttemptState::Sent,
            Self::NotSent { .. } => AttemptState::NotSent,
            Self::Unknown { .. } => AttemptState::Unknown,
        }
    }
}

/// Why a send is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptPurpose {
    /// A reply to an envelope: its outcome settles the envelope.
    Reply,
    /// A best-effort copy (the handoff audit route): it settles nothing and never waits
    /// for reconciliation.
    Audit,
}

impl AttemptPurpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reply => "reply",
            Self::Audit => "audit",
        }
    }
}

/// The Bot API call an attempt makes (the `method` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptMethod {
    SendMessage,
    SendPhoto,
    SendDocument,
    SendAnimation,
    SendVideo,
    SendVoice,
    SendAudio,
    /// `setMessageReaction` on `target_message_id` (the `react` tool).
    SetReaction,
    /// `editMessageText` of `target_message_id` (the `edit_message` tool).
    EditMessage,
}

impl AttemptMethod {
    pub const ALL: [Self; 9] = [
        Self::SendMessage,
        Self::SendPhoto,
        Self::SendDocument,
        Self::SendAnimation,
        Self::SendVideo,
        Self::SendVoice,
        Self::SendAudio,
        Self::SetReaction,
        Self::EditMessage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SendMessage => "send_message",
            Self::SendPhoto => "send_photo",
            Self::SendDocument => "send_document",
            Self::SendAnimation => "send_animation",
            Self::SendVideo => "send_video",
            Self::SendVoice => "send_voice",
            Self::SendAudio => "send_audio",
            Self::SetReaction => "set_reaction",
            Self::EditMessage => "edit_message",
        }
    }

    /// Whether the attempt is a part of a reply: it posts a message, and its outcome
    /// settles the envelope (the last part confirmed answers it, an unknown one makes it
    /// unresolved). A reaction or an edit is admitted like a reply (DESIGN.md §11) but
    /// answers nothing and, unknown, leaves the envelope as it was; it is not a part of
    /// any [`RecordedReply`] and does not hold a reply back for reconciliation.
    /// The SQLite backend says the same in SQL (`reply_part_method!`).
    pub fn is_reply_part(self) -> bool {
        match self {
            Self::SendMessage
            | Self::SendPhoto
            | Self::SendDocument
            | Self::SendAnimation
            | Self::SendVideo
            | Self::SendVoice
            | Self::SendAudio => true,
            Self::SetReaction | Self::EditMessage => false,
        }
    }
}

impl std::fmt::Display for AttemptMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What finishing an attempt came to (`Attempts::finish_attempt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedAttempt {
    /// Its outcome is recorded, with what it proves about its envelope.
    Recorded,
    /// It was no longer in flight: recovery had settled it (as `unknown`), and that stands.
    /// Nothing was changed.
    AlreadySettled(AttemptState),
}

impl FinishedAttempt {
    /// What finishing an attempt found no longer in flight came to. The very outcome being
    /// recorded (the same message, for a send) is this record, committed by an earlier try
    /// whose answer was lost (a connection dropped during `COMMIT`): it is `Recorded`, so a
    /// reply's next part still goes. Any other is what settled it first.
    pub fn found_settled(
        settled: AttemptState,
        settled_message_id: Option<i64>,
        outcome: &AttemptOutcome,
    ) -> Self {
        let ours = match outcome {
            AttemptOutcome::Sent { message_id } => {
                settled == AttemptState::Sent && settled_message_id == Some(i64::from(*message_id))
            }
            other => settled == other.state(),
        };
        if ours { Self::Recorded } else { Self::AlreadySettled(settled) }
    }
}

/// The `outcome` column of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Recorded; the request may be on its way. A daemon that dies leaves it so, and
    /// start-up turns it into `Unknown`.
    InFlight,
    Sent,
    NotSent,
    Unknown,
}

impl AttemptState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Sent => "sent",
            Self::NotSent => "not_sent",
            Self::Unknown => "unknown",
        }
    }
}

impl ReconciledOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::NotSent => "not_sent",
        }
    }
}

impl std::fmt::Display for ReconciledOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for AttemptState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What an operator found out about an attempt whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconciledOutcome {
    Sent,
    NotSent,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredAttempt {
    pub op_id: AttemptId,
    pub request_id: Option<String>,
    pub method: AttemptMethod,
    pub target_message_id: Option<i64>,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub chunk_index: i64,
    pub chunk_count: i64,
    pub text: String,
    pub outcome: AttemptState,
    pub telegram_message_id: Option<i64>,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub reconciled_outcome: Option<ReconciledOutcome>,
    pub reconciled_reason: Option<String>,
}

/// What the attempts of one `reply` request add up to, as the ledger tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedReply {
    pub envelope_id: i64,
    pub trace_id: TraceId,
    /// Parts confirmed sent, by part index, with Telegram's message id.
    pub sent: Vec<(usize, i32)>,
    pub parts: usize,
    pub verdict: ReplyVerdict,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyVerdict {
    /// Every part confirmed sent.
    Delivered,
    /// A part was provably not sent and none is unknown: the request is over.
    NotSent { error: String },
    /// A part may or may not have arrived (or is still on its way after a crash, before
    /// start-up recovery ran): the envelope needs reconciling.
    Unknown { error: String },
    /// A part is still in flight in this daemon.
    InFlight,
}

/// What the attempts of one `reply` request add up to, whichever envelope they answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTally {
    /// Parts confirmed sent, by part index, with Telegram's message id.
    pub sent: Vec<(usize, i32)>,
    pub parts: usize,
    pub verdict: ReplyVerdict,
}

impl RecordedReply {
    pub fn from_attempts(envelope_id: i64, trace_id: TraceId, attempts: &[StoredAttempt]) -> Option<Self> {
        let ReplyTally { sent, parts, verdict } = ReplyTally::of(attempts)?;
        Some(Self { envelope_id, trace_id, sent, parts, verdict })
    }
}

impl ReplyTally {
    /// Sums up the attempts of one request, oldest first (as [`standing_attempts`] gives
    /// them, its own first: the part count is the first one's). Retries of a rate-limited part
    /// are attempts of their own: a part counts as sent once any of its attempts was.
    pub fn of(attempts: &[StoredAttempt]) -> Option<Self> {
        let parts = usize::try_from(attempts.first()?.chunk_count).unwrap_or(0);
        let mut sent: Vec<(usize, i32)> = Vec::new();
        let mut verdict = None;
        let mut last_error = None;
        for attempt in attempts {
            let index = usize::try_from(attempt.chunk_index).unwrap_or(0);
            match attempt.effective_outcome() {
                AttemptState::Sent => {
                    let id = attempt.telegram_message_id.and_then(|id| i32::try_from(id).ok()).unwrap_or(0);
                    if !sent.iter().any(|(i, _)| *i == index) {
                        sent.push((index, id));
                    }
                }
                AttemptState::InFlight => verdict = Some(ReplyVerdict::InFlight),
                AttemptState::Unknown => {
                    if verdict != Some(ReplyVerdict::InFlight) {
                        verdict =
                            Some(ReplyVerdict::Unknown { error: attempt.error.clone().unwrap_or_default() });
                    }
                }
                AttemptState::NotSent => last_error = attempt.error.clone(),
            }
        }
        sent.sort_unstable();
        let verdict = verdict.unwrap_or_else(|| {
            if sent.len() == parts {
                ReplyVerdict::Delivered
            } else {
                ReplyVerdict::NotSent { error: last_error.unwrap_or_default() }
            }
        });
        Some(Self { sent, parts, verdict })
    }
}

impl StoredAttempt {
    /// Its outcome once an operator's finding is applied.
    pub fn effective_outcome(&self) -> AttemptState {
        match self.reconciled_outcome {
            Some(ReconciledOutcome::Sent) => AttemptState::Sent,
            Some(ReconciledOutcome::NotSent) => AttemptState::NotSent,
            None => self.outcome,
        }
    }
}

/// The attempts `request_id`'s outcome stands on: its own, then the confirmed ones of the
/// parts it carried over from the request before it. `history`: the reply-part attempts of
/// the request's envelope, oldest first (those of later requests are ignored).
///
/// A request that resumes a reply cut off part-way sends nothing for the parts already
/// delivered and leaves no attempt for them; its outcome still counts them, or a reply
/// delivered in full would read as cut off, and the next identical call would send its
/// first parts again. Which parts it carried follows from how a reply is delivered: in part
/// order, skipping only the parts carried, which are a prefix of the earlier request's
/// delivered parts (the one just before it on the envelope: one reply at a time goes to an
/// envelope). So the parts a request carried are the earlier request's delivered parts
/// below the first part it tried itself.
pub fn standing_attempts(history: &[StoredAttempt], request_id: &str) -> Vec<StoredAttempt> {
    let mut requests: Vec<(&str, Vec<&StoredAttempt>)> = Vec::new();
    for attempt in history {
        let Some(id) = attempt.request_id.as_deref() else { continue };
        match requests.iter_mut().find(|(seen, _)| *seen == id) {
            Some((_, attempts)) => attempts.push(attempt),
            None => requests.push((id, vec![attempt])),
        }
    }
    let mut standing: Vec<StoredAttempt> = Vec::new();
    for (id, own) in requests {
        let first_tried = own.iter().map(|attempt| attempt.chunk_index).min().unwrap_or(0);
        let mut carried: Vec<StoredAttempt> = Vec::new();
        for earlier in standing.iter().filter(|a| a.effective_outcome() == AttemptState::Sent) {
            if earlier.chunk_index < first_tried
                && !carried.iter().any(|c| c.chunk_index == earlier.chunk_index)
            {
                carried.push(earlier.clone());
            }
        }
        // Its own attempts first: [`ReplyTally::of`] reads the part count from the first.
        standing = own.into_iter().cloned().chain(carried).collect();
        if id == request_id {
            return standing;
        }
    }
    Vec::new()
}

/// What an operator found out about an unresolved reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciliation {
    /// The reply did reach the chat: the envelope is answered.
    Delivered,
    /// It did not: the envelope goes back to its agent to answer again.
    NotDelivered,
}

impl Reconciliation {
    /// What the operator's finding makes of the send's unknown attempts.
    pub fn attempts_outcome(self) -> ReconciledOutcome {
        match self {
            Self::Delivered => ReconciledOutcome::Sent,
            Self::NotDelivered => ReconciledOutcome::NotSent,
        }
    }

    /// What it makes of an unresolved envelope. One not delivered goes back to its agent:
    /// `queued`, so that its session is handed it again (marked redelivered) at its next look
    /// in the ledger, or the next session is, and the agent, told the outcome was unknown,
    /// learns it may answer. So does a reply whose unknown part was not its last
    /// (`cut_short`): it is not whole even when that part arrived, and its agent finishes it
    /// with the same text, which sends only the parts missing (the ones delivered are never
    /// sent again).
    pub fn envelope_state(self, cut_short: bool) -> EnvelopeState {
        match (self, cut_short) {
            (Self::Delivered, false) => EnvelopeState::Acked,
            (Self::Delivered, true) | (Self::NotDelivered, _) => EnvelopeState::Queued,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("no envelope has trace id {0}")]
    Unknown(String),
    /// Neither is the envelope `unresolved` nor is any of its attempts unknown and not yet
    /// reconciled.
    #[error(
        "{trace_id} is {state}, not unresolved, and no attempt of it is unknown and unreconciled: there is \
         nothing to reconcile"
    )]
    NothingToReconcile { trace_id: String, state: EnvelopeState },
    #[error(transparent)]
    Db(#[from] LedgerError),
}

/// For tests: part `index` of `count` of reply request `request`, as the ledger would give
/// it back, in chat 1 as a reply to its message 1.
#[cfg(test)]
pub(crate) fn reply_part_attempt(
    request: &str,
    index: i64,
    count: i64,
    text: &str,
    outcome: AttemptState,
    message_id: Option<i64>,
) -> StoredAttempt {
    StoredAttempt {
        op_id: format!("op_{index:0>10}").as_str().into(),
        request_id: Some(request.into()),
        method: AttemptMethod::SendMessage,
        target_message_id: None,
        chat_id: 1,
        thread_id: None,
        reply_to_message_id: Some(1),
        chunk_index: index,
        chunk_count: count,
        text: text.into(),
        outcome,
        telegram_message_id: message_id,
        error: None,
        started_at: Utc::now(),
        finished_at: None,
        reconciled_outcome: None,
        reconciled_reason: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(
        request: &str,
        index: i64,
        count: i64,
        outcome: AttemptState,
        message_id: i64,
    ) -> StoredAttempt {
        let sent_as = (outcome == AttemptState::Sent).then_some(message_id);
        reply_part_attempt(request, index, count, &format!("part {index}"), outcome, sent_as)
    }

    #[test]
    fn a_resumed_request_stands_on_the_parts_it_carried() {
        let history = [
            attempt("one", 0, 3, AttemptState::Sent, 10),
            attempt("one", 1, 3, AttemptState::NotSent, 0),
            // Resumed: part 0 carried, then its part 1 sent, part 2 refused.
            attempt("two", 1, 3, AttemptState::Sent, 11),
            attempt("two", 2, 3, AttemptState::NotSent, 0),
            // Resumed again: parts 0 and 1 carried, through the request before.
            attempt("three", 2, 3, AttemptState::Sent, 12),
            // Started over (the text changed): carries nothing.
            attempt("four", 0, 1, AttemptState::Sent, 13),
        ];
        let tally = |request| ReplyTally::of(&standing_attempts(&history, request)).unwrap();
        assert_eq!(tally("one").sent, [(0, 10)]);
        assert!(matches!(tally("one").verdict, ReplyVerdict::NotSent { .. }));
        assert_eq!(tally("two").sent, [(0, 10), (1, 11)]);
        assert!(matches!(tally("two").verdict, ReplyVerdict::NotSent { .. }));
        assert_eq!(tally("three").sent, [(0, 10), (1, 11), (2, 12)]);
        assert_eq!(tally("three").verdict, ReplyVerdict::Delivered);
        assert_eq!((tally("four").sent, tally("four").parts), (vec![(0, 13)], 1));
        assert!(standing_attempts(&history, "never").is_empty());
    }

    #[test]
    fn an_outcome_found_already_recorded_as_it_is_was_this_record_committed_before() {
        let sent = AttemptOutcome::Sent { message_id: 7 };
        assert_eq!(
            FinishedAttempt::found_settled(AttemptState::Sent, Some(7), &sent),
            FinishedAttempt::Recorded
        );
        // Recovery made it unknown while the request was out: that stands.
        assert_eq!(
            FinishedAttempt::found_settled(AttemptState::Unknown, None, &sent),
            FinishedAttempt::AlreadySettled(AttemptState::Unknown)
        );
        assert_eq!(
            FinishedAttempt::found_settled(AttemptState::Sent, Some(8), &sent),
            FinishedAttempt::AlreadySettled(AttemptState::Sent)
        );
        let refused = AttemptOutcome::NotSent { error: "400".into() };
        assert_eq!(
            FinishedAttempt::found_settled(AttemptState::NotSent, None, &refused),
            FinishedAttempt::Recorded
        );
        assert_eq!(
            FinishedAttempt::found_settled(AttemptState::Unknown, None, &refused),
            FinishedAttempt::AlreadySettled(AttemptState::Unknown)
        );
    }
}
