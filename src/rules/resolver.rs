//! The fail-closed reply resolver (DESIGN.md §3): which envelope a reply answers.
//!
//! Pure code over plain data. The caller looks the candidates up in the ledger and hands
//! them in; the resolver never guesses and "most recent" is never a fallback. A refusal
//! changes nothing, so the agent can simply call again with a `trace_id`.
//!
//! It reads a few things of an envelope ([`Answerable`]) and hands back the one it picked,
//! whatever the caller's envelope type holds besides.

use crate::ledger::EnvelopeState;

/// What the resolver reads of an envelope.
pub trait Answerable {
    fn trace_id(&self) -> &str;
    /// The agent it was routed to (none for an unrouted message).
    fn agent(&self) -> Option<&str>;
    fn state(&self) -> EnvelopeState;
    /// The Telegram chat and message it came from (what the `<channel>` tag shows).
    fn chat_id(&self) -> i64;
    fn message_id(&self) -> i64;
}

/// Where the agent said its reply goes, beside a trace id or instead of one: the chat and
/// the message of the `<channel>` tag, as the official plugin's `reply` takes them
/// (`chat_id`, `reply_to`). Never a way to reach a chat: it only narrows the envelopes a
/// reply may answer, so a reply that names a chat never lands in another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Addressed {
    pub chat_id: Option<i64>,
    pub message_id: Option<i64>,
}

impl Addressed {
    pub fn is_given(&self) -> bool {
        self.chat_id.is_some() || self.message_id.is_some()
    }

    pub fn admits<E: Answerable>(&self, envelope: &E) -> bool {
        self.chat_id.is_none_or(|chat_id| chat_id == envelope.chat_id())
            && self.message_id.is_none_or(|message_id| message_id == envelope.message_id())
    }
}

impl std::fmt::Display for Addressed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.message_id, self.chat_id) {
            (Some(message_id), Some(chat_id)) => write!(f, "message {message_id} of chat {chat_id}"),
            (Some(message_id), None) => write!(f, "message {message_id}"),
            (None, Some(chat_id)) => write!(f, "chat {chat_id}"),
            (None, None) => f.write_str("any chat"),
        }
    }
}

/// An envelope the resolver may pick, with what the delivery side knows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<E> {
    pub envelope: E,
    pub blocked: Option<Blocked>,
}

impl<E> Candidate<E> {
    pub fn free(envelope: E) -> Self {
        Self { envelope, blocked: None }
    }
}

/// Why nothing more may be sent for an envelope right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// A reply to it is being delivered (its parts are going out, or waiting out a rate
    /// limit): a second one could interleave or duplicate it.
    ReplyInProgress,
    /// An earlier reply's outcome is unknown and no operator has reconciled it: sending
    /// more could repeat a message that did arrive.
    AwaitingReconciliation,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError<E> {
    #[error("{} conversations are waiting for a reply; name the one you answer with trace_id", candidates.len())]
    Ambiguous { candidates: Vec<E> },
    #[error("nothing you have been shown is waiting for a reply{}", not_shown_hint(*not_shown))]
    NothingPending {
        /// Pending envelopes the session has not confirmed showing yet.
        not_shown: usize,
    },
    #[error(
        "nothing you have been shown from {at} is waiting for a reply{}; chat_id and reply_to only pick among \
         your waiting messages: name the one you answer with trace_id",
        not_shown_hint(*not_shown)
    )]
    NothingPendingAt { at: Addressed, not_shown: usize },
    #[error(
        "{trace_id} is message {message_id} of chat {chat_id}, not {at}: trace_id and chat_id/reply_to name \
         different messages, so nothing was sent; give the trace_id of the message you answer"
    )]
    Elsewhere { trace_id: String, chat_id: i64, message_id: i64, at: Addressed },
    /// Says the same whether the envelope does not exist or belongs to another agent, so
    /// an agent cannot probe for other agents' trace ids.
    #[error(
        "{trace_id} is not one of yours: none of your envelopes has that trace id; call `pending` to see the ones waiting for you"
    )]
    UnknownTraceId { trace_id: String },
    #[error("envelope {trace_id} is {state} and cannot be answered{}", not_answerable_hint(*state))]
    NotAnswerable { trace_id: String, state: EnvelopeState },
    #[error("a reply to {trace_id} is being delivered right now; wait for its outcome before sending more")]
    ReplyInProgress { trace_id: String },
    #[error(
        "an earlier reply to {trace_id} may or may not have arrived; nothing more can be sent for it until an \
         operator reconciles it with `switchboard ledger reconcile`"
    )]
    AwaitingReconciliation { trace_id: String },
}

fn not_shown_hint(not_shown: usize) -> String {
    match not_shown {
        0 => String::new(),
        1 => " (1 message is on its way to your session: answer it by trace_id once you see it)".to_owned(),
        n => format!(
            " ({n} messages are on their way to your session: answer them by trace_id once you see them)"
        ),
    }
}

fn not_answerable_hint(state: EnvelopeState) -> &'static str {
    match state {
        EnvelopeState::Unresolved => {
            ": an earlier reply may or may not have arrived, and an operator must reconcile it first"
        }
        EnvelopeState::Queued => ": it has not been delivered to your session yet",
        _ => "",
    }
}

fn unblocked<E: Answerable>(candidate: Candidate<E>) -> Result<E, ResolveError<E>> {
    let trace_id = candidate.envelope.trace_id().to_owned();
    match candidate.blocked {
        None => Ok(candidate.envelope),
        Some(Blocked::ReplyInProgress) => Err(ResolveError::ReplyInProgress { trace_id }),
        Some(Blocked::AwaitingReconciliation) => Err(ResolveError::AwaitingReconciliation { trace_id }),
    }
}

/// A reply that names its envelope: it must exist, be the caller's, be `pending` or
/// `acked` (a further message in an answered thread), and have nothing in flight or
/// unreconciled.
pub fn resolve_named<E: Answerable>(
    caller: &str,
    trace_id: &str,
    found: Option<Candidate<E>>,
) -> Result<E, ResolveError<E>> {
    let unknown = || ResolveError::UnknownTraceId { trace_id: trace_id.to_owned() };
    let candidate = found.ok_or_else(unknown)?;
    if candidate.envelope.agent() != Some(caller) {
        return Err(unknown());
    }
    match candidate.envelope.state() {
        EnvelopeState::Pending | EnvelopeState::Acked => unblocked(candidate),
        state => Err(ResolveError::NotAnswerable { trace_id: trace_id.to_owned(), state }),
    }
}

/// A reply that names no envelope: it answers the caller's only pending envelope that its
/// live session was shown, or is refused. `shown` are those envelopes; `not_shown` counts
/// the caller's other pending envelopes (handed over, not yet confirmed shown): an agent
/// cannot mean a message it has not read.
pub fn resolve_unnamed<E: Answerable>(
    mut shown: Vec<Candidate<E>>,
    not_shown: usize,
) -> Result<E, ResolveError<E>> {
    match shown.len() {
        0 => Err(ResolveError::NothingPending { not_shown }),
        1 => unblocked(shown.remove(0)),
        _ => Err(ResolveError::Ambiguous { candidates: shown.into_iter().map(|c| c.envelope).collect() }),
    }
}

/// A reply that also said where it goes: the envelope the resolver picked must be there.
pub fn check_addressed<E: Answerable>(at: Addressed, envelope: E) -> Result<E, ResolveError<E>> {
    if at.admits(&envelope) {
        return Ok(envelope);
    }
    Err(ResolveError::Elsewhere {
        trace_id: envelope.trace_id().to_owned(),
        chat_id: envelope.chat_id(),
        message_id: envelope.message_id(),
        at,
    })
}

/// A reply that names no envelope but a place: answered as [`resolve_unnamed`] answers,
/// among the envelopes of that place only.
pub fn resolve_unnamed_at<E: Answerable>(
    at: Addressed,
    shown: Vec<Candidate<E>>,
    not_shown: &[E],
) -> Result<E, ResolveError<E>> {
    let shown: Vec<_> = shown.into_iter().filter(|candidate| at.admits(&candidate.envelope)).collect();
    let not_shown = not_shown.iter().filter(|envelope| at.admits(*envelope)).count();
    match resolve_unnamed(shown, not_shown) {
        Err(ResolveError::NothingPending { not_shown }) if at.is_given() => {
            Err(ResolveError::NothingPendingAt { at, not_shown })
        }
        resolved => resolved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The little an envelope is to the resolver.
    #[derive(Debug, Clone, PartialEq)]
    struct Envelope {
        trace_id: String,
        agent: Option<String>,
        state: EnvelopeState,
        chat_id: i64,
        message_id: i64,
    }

    impl Answerable for Envelope {
        fn trace_id(&self) -> &str {
            &self.trace_id
        }
        fn agent(&self) -> Option<&str> {
            self.agent.as_deref()
        }
        fn state(&self) -> EnvelopeState {
            self.state
        }
        fn chat_id(&self) -> i64 {
            self.chat_id
        }
        fn message_id(&self) -> i64 {
            self.message_id
        }
    }

    fn envelope(trace_id: &str, agent: Option<&str>, state: EnvelopeState) -> Envelope {
        Envelope { trace_id: trace_id.into(), agent: agent.map(Into::into), state, chat_id: 1, message_id: 1 }
    }

    fn message_of(trace_id: &str, chat_id: i64, message_id: i64) -> Envelope {
        Envelope { chat_id, message_id, ..envelope(trace_id, Some("orch"), EnvelopeState::Pending) }
    }

    /// Alice (chat 10) and Bob (chat 20) wrote; Bob was answered by trace id. A reply that
    /// names Bob's chat, as the official plugin's reply does, is not Alice's answer.
    #[test]
    fn a_reply_that_names_a_chat_answers_only_a_message_of_that_chat() {
        let alice = message_of("env_alice", 10, 5);
        let bob_chat = Addressed { chat_id: Some(20), message_id: None };
        let refused = resolve_unnamed_at(bob_chat, vec![Candidate::free(alice.clone())], &[]);
        assert_eq!(refused, Err(ResolveError::NothingPendingAt { at: bob_chat, not_shown: 0 }));
        assert!(refused.unwrap_err().to_string().contains("trace_id"));

        let bob = message_of("env_bob", 20, 7);
        let both = vec![Candidate::free(alice.clone()), Candidate::free(bob.clone())];
        assert_eq!(resolve_unnamed_at(bob_chat, both.clone(), &[]), Ok(bob.clone()));
        let alices_message = Addressed { chat_id: None, message_id: Some(5) };
        assert_eq!(resolve_unnamed_at(alices_message, both.clone(), &[]), Ok(alice.clone()));
        assert!(matches!(
            resolve_unnamed_at(Addressed::default(), both, &[]),
            Err(ResolveError::Ambiguous { .. })
        ));
        // Only the place's messages on their way count in the hint.
        let refusal = resolve_unnamed_at(bob_chat, vec![], &[alice.clone(), bob.clone()]).unwrap_err();
        assert_eq!(refusal, ResolveError::NothingPendingAt { at: bob_chat, not_shown: 1 });

        assert_eq!(check_addressed(bob_chat, bob.clone()), Ok(bob));
        assert_eq!(check_addressed(Addressed::default(), alice.clone()), Ok(alice.clone()));
        assert!(matches!(
            check_addressed(bob_chat, alice),
            Err(ResolveError::Elsewhere { chat_id: 10, message_id: 5, .. })
        ));
    }

    fn free(envelope: Envelope) -> Option<Candidate<Envelope>> {
        Some(Candidate::free(envelope))
    }

    #[test]
    fn exactly_one_pending_resolves_to_it() {
        let only = envelope("env_a", Some("orch"), EnvelopeState::Pending);
        assert_eq!(resolve_unnamed(vec![Candidate::free(only.clone())], 0), Ok(only.clone()));
        // Others not shown yet do not make it ambiguous: the agent cannot mean them.
        assert_eq!(resolve_unnamed(vec![Candidate::free(only.clone())], 3), Ok(only));
    }

    #[test]
    fn zero_pending_is_refused() {
        assert_eq!(
            resolve_unnamed::<Envelope>(vec![], 0),
            Err(ResolveError::NothingPending { not_shown: 0 })
        );
        let refusal = resolve_unnamed::<Envelope>(vec![], 2).unwrap_err();
        assert_eq!(refusal, ResolveError::NothingPending { not_shown: 2 });
        assert!(refusal.to_string().contains("2 messages are on their way"), "{refusal}");
    }

    #[test]
    fn an_envelope_with_a_reply_in_flight_or_unreconciled_is_refused() {
        let mine = envelope("env_m", Some("orch"), EnvelopeState::Pending);
        for (blocked, expected) in [
            (Blocked::ReplyInProgress, ResolveError::ReplyInProgress { trace_id: "env_m".into() }),
            (
                Blocked::AwaitingReconciliation,
                ResolveError::AwaitingReconciliation { trace_id: "env_m".into() },
            ),
        ] {
            let candidate = Candidate { envelope: mine.clone(), blocked: Some(blocked) };
            assert_eq!(resolve_named("orch", "env_m", Some(candidate.clone())), Err(expected.clone()));
            assert_eq!(resolve_unnamed(vec![candidate], 0), Err(expected));
        }
        let answered = envelope("env_m", Some("orch"), EnvelopeState::Acked);
        let follow_up_unknown =
            Candidate { envelope: answered, blocked: Some(Blocked::AwaitingReconciliation) };
        assert!(matches!(
            resolve_named("orch", "env_m", Some(follow_up_unknown)),
            Err(ResolveError::AwaitingReconciliation { .. })
        ));
    }

    #[test]
    fn two_or_more_pending_are_refused_listing_every_candidate() {
        for n in 2..6 {
            let pending: Vec<_> =
                (0..n).map(|i| envelope(&format!("env_{i}"), Some("orch"), EnvelopeState::Pending)).collect();
            match resolve_unnamed(pending.iter().cloned().map(Candidate::free).collect(), 0) {
                Err(ResolveError::Ambiguous { candidates }) => assert_eq!(candidates, pending),
                other => panic!("{n} pending must be ambiguous, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_named_envelope_must_exist() {
        assert_eq!(
            resolve_named::<Envelope>("orch", "env_x", None),
            Err(ResolveError::UnknownTraceId { trace_id: "env_x".into() })
        );
    }

    #[test]
    fn a_named_envelope_must_be_the_callers_and_is_refused_exactly_like_an_unknown_one() {
        let unknown = resolve_named("orch", "env_t", None);
        for owner in [Some("worker"), None] {
            let theirs = envelope("env_t", owner, EnvelopeState::Pending);
            assert_eq!(resolve_named("orch", "env_t", free(theirs)), unknown);
        }
    }

    #[test]
    fn a_named_envelope_is_answerable_only_when_pending_or_acked() {
        for state in EnvelopeState::ALL {
            let mine = envelope("env_m", Some("orch"), state);
            let result = resolve_named("orch", "env_m", free(mine.clone()));
            match state {
                EnvelopeState::Pending | EnvelopeState::Acked => assert_eq!(result, Ok(mine)),
                _ => assert_eq!(result, Err(ResolveError::NotAnswerable { trace_id: "env_m".into(), state })),
            }
        }
    }

    #[test]
    fn ownership_is_checked_before_state_so_nothing_leaks_about_other_agents() {
        let theirs = envelope("env_t", Some("worker"), EnvelopeState::Unresolved);
        assert!(matches!(
            resolve_named("orch", "env_t", free(theirs)),
            Err(ResolveError::UnknownTraceId { .. })
        ));
    }

    #[test]
    fn refusal_messages_tell_the_agent_what_to_do() {
        let ambiguous = ResolveError::Ambiguous {
            candidates: vec![
                envelope("env_a", Some("o"), EnvelopeState::Pending),
                envelope("env_b", Some("o"), EnvelopeState::Pending),
            ],
        };
        assert!(ambiguous.to_string().contains("trace_id"));
        let unresolved: ResolveError<Envelope> =
            ResolveError::NotAnswerable { trace_id: "env_u".into(), state: EnvelopeState::Unresolved };
        assert!(unresolved.to_string().contains("reconcile"));
    }
}
