//! The fail-closed reply resolver (DESIGN.md §3): which envelope a reply answers.
//!
//! Pure code over plain data. The caller looks the candidates up in the ledger and hands
//! them in; the resolver never guesses and "most recent" is never a fallback. A refusal
//! changes nothing, so the agent can simply call again with a `trace_id`.
//!
//! It reads three things of an envelope ([`Answerable`]) and hands back the one it picked,
//! whatever the caller's envelope type holds besides.

use crate::ledger::EnvelopeState;

/// What the resolver reads of an envelope.
pub trait Answerable {
    fn trace_id(&self) -> &str;
    /// The agent it was routed to (none for an unrouted message).
    fn agent(&self) -> Option<&str>;
    fn state(&self) -> EnvelopeState;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The little an envelope is to the resolver.
    #[derive(Debug, Clone, PartialEq)]
    struct Envelope {
        trace_id: String,
        agent: Option<String>,
        state: EnvelopeState,
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
    }

    fn envelope(trace_id: &str, agent: Option<&str>, state: EnvelopeState) -> Envelope {
        Envelope { trace_id: trace_id.into(), agent: agent.map(Into::into), state }
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
