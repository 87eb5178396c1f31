//! The fail-closed reply resolver (DESIGN.md §3): which envelope a reply answers.
//!
//! Pure code over plain data. The caller looks the candidates up in the ledger and hands
//! them in; the resolver never guesses and "most recent" is never a fallback. A refusal
//! changes nothing, so the agent can simply call again with a `trace_id`.

use crate::ledger::EnvelopeState;
use crate::ledger::StoredEnvelope;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    #[error("{} conversations are waiting for a reply; name the one you answer with trace_id", candidates.len())]
    Ambiguous { candidates: Vec<StoredEnvelope> },
    #[error("nothing is waiting for a reply from you")]
    NothingPending,
    #[error("no envelope has trace id {trace_id}")]
    UnknownTraceId { trace_id: String },
    /// Deliberately says no more than "unknown" would about whose it is: an agent learns
    /// nothing about other agents' conversations.
    #[error("envelope {trace_id} is not one of yours")]
    NotYours { trace_id: String },
    #[error("envelope {trace_id} is {state} and cannot be answered{}", not_answerable_hint(*state))]
    NotAnswerable { trace_id: String, state: EnvelopeState },
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

/// A reply that names its envelope: it must exist, be the caller's, and be `pending` or
/// `acked` (a further message in an answered thread).
pub fn resolve_named(
    caller: &str,
    trace_id: &str,
    found: Option<StoredEnvelope>,
) -> Result<StoredEnvelope, ResolveError> {
    let envelope = found.ok_or_else(|| ResolveError::UnknownTraceId { trace_id: trace_id.to_owned() })?;
    if envelope.agent.as_deref() != Some(caller) {
        return Err(ResolveError::NotYours { trace_id: trace_id.to_owned() });
    }
    match envelope.state {
        EnvelopeState::Pending | EnvelopeState::Acked => Ok(envelope),
        state => Err(ResolveError::NotAnswerable { trace_id: trace_id.to_owned(), state }),
    }
}

/// A reply that names no envelope: it answers the caller's only pending envelope, or is
/// refused. `pending` must be the caller's pending envelopes.
pub fn resolve_unnamed(mut pending: Vec<StoredEnvelope>) -> Result<StoredEnvelope, ResolveError> {
    match pending.len() {
        0 => Err(ResolveError::NothingPending),
        1 => Ok(pending.remove(0)),
        _ => Err(ResolveError::Ambiguous { candidates: pending }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(trace_id: &str, agent: Option<&str>, state: EnvelopeState) -> StoredEnvelope {
        StoredEnvelope {
            id: 1,
            trace_id: trace_id.into(),
            update_id: 1,
            kind: crate::telegram::envelope::EnvelopeKind::Message,
            chat_id: 42,
            thread_id: None,
            chat_type: crate::telegram::envelope::ChatType::Private,
            chat_title: None,
            message_id: 1,
            sender_id: Some(42),
            sender_username: None,
            sender_name: "Ann".into(),
            text: Some("hi".into()),
            attachments: "[]".into(),
            content: "hi".into(),
            sent_at: "2026-01-01T00:00:00Z".into(),
            received_at: "2026-01-01T00:00:00Z".into(),
            route: agent.map(|_| "dm".into()),
            agent: agent.map(Into::into),
            state,
            deliveries: 1,
            state_changed_at: "2026-01-01T00:00:00Z".into(),
            note: None,
        }
    }

    #[test]
    fn exactly_one_pending_resolves_to_it() {
        let only = envelope("env_a", Some("orch"), EnvelopeState::Pending);
        assert_eq!(resolve_unnamed(vec![only.clone()]), Ok(only));
    }

    #[test]
    fn zero_pending_is_refused() {
        assert_eq!(resolve_unnamed(vec![]), Err(ResolveError::NothingPending));
    }

    #[test]
    fn two_or_more_pending_are_refused_listing_every_candidate() {
        for n in 2..6 {
            let pending: Vec<_> =
                (0..n).map(|i| envelope(&format!("env_{i}"), Some("orch"), EnvelopeState::Pending)).collect();
            match resolve_unnamed(pending.clone()) {
                Err(ResolveError::Ambiguous { candidates }) => assert_eq!(candidates, pending),
                other => panic!("{n} pending must be ambiguous, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_named_envelope_must_exist() {
        assert_eq!(
            resolve_named("orch", "env_x", None),
            Err(ResolveError::UnknownTraceId { trace_id: "env_x".into() })
        );
    }

    #[test]
    fn a_named_envelope_must_be_the_callers() {
        for owner in [Some("worker"), None] {
            let theirs = envelope("env_t", owner, EnvelopeState::Pending);
            assert_eq!(
                resolve_named("orch", "env_t", Some(theirs)),
                Err(ResolveError::NotYours { trace_id: "env_t".into() })
            );
        }
    }

    #[test]
    fn a_named_envelope_is_answerable_only_when_pending_or_acked() {
        for state in EnvelopeState::ALL {
            let mine = envelope("env_m", Some("orch"), state);
            let result = resolve_named("orch", "env_m", Some(mine.clone()));
            match state {
                EnvelopeState::Pending | EnvelopeState::Acked => assert_eq!(result, Ok(mine)),
                _ => assert_eq!(result, Err(ResolveError::NotAnswerable { trace_id: "env_m".into(), state })),
            }
        }
    }

    #[test]
    fn ownership_is_checked_before_state_so_nothing_leaks_about_other_agents() {
        let theirs = envelope("env_t", Some("worker"), EnvelopeState::Unresolved);
        assert!(matches!(resolve_named("orch", "env_t", Some(theirs)), Err(ResolveError::NotYours { .. })));
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
        let unresolved =
            ResolveError::NotAnswerable { trace_id: "env_u".into(), state: EnvelopeState::Unresolved };
        assert!(unresolved.to_string().contains("reconcile"));
    }
}
