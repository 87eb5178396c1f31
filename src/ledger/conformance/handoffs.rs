use crate::ids::AgentName;
use crate::ledger::conformance::Backend;
use crate::ledger::*;
use crate::telegram::envelope::EnvelopeKind;

pub(crate) async fn a_handoff_ends_once_and_a_second_end_changes_nothing<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let (orch, worker) = (AgentName::parse("orch").unwrap(), AgentName::parse("worker").unwrap());
    let new = NewHandoff {
        from: &orch,
        to: &worker,
        instruction: "check staging",
        cause: None,
        depth: 1,
        followup_of: None,
        intent: None,
        request_id: "req_1",
    };
    let open = ledger.record_handoff(&new).await.unwrap().expect("no task to refuse it");
    assert_eq!(open.state, HandoffState::Open);
    let answered = HandoffEnd::Answered { text: "all green", request_id: Some("req_2") };
    let ended = ledger.end_handoff(&open, answered, "agent:worker").await.unwrap().unwrap().unwrap();
    assert_eq!((ended.state, ended.answer_request_id.as_deref()), (HandoffState::Answered, Some("req_2")));
    // The caller still holds the handoff as it was: ending it again finds it answered.
    let closed = HandoffEnd::Closed { note: Some("late") };
    assert_eq!(ledger.end_handoff(&open, closed, "agent:worker").await.unwrap().unwrap(), None);
    let everything = ledger.list(&ListFilter { limit: 100, ..Default::default() }).await.unwrap();
    let answers = everything.iter().filter(|e| e.kind == EnvelopeKind::HandoffAnswer).count();
    assert_eq!(answers, 1, "the second end queued no answer");
    let now = ledger.handoff(&open.handoff_id).await.unwrap().unwrap();
    assert_eq!((now.state, now.note), (HandoffState::Answered, None));
}

/// Hands `instruction` from `from` to `to` on behalf of `cause`, and returns the handoff
/// and its envelope, pending for `to` as if shown.
async fn hand(
    ledger: &Ledger,
    from: &AgentName,
    to: &AgentName,
    cause: Option<&StoredEnvelope>,
    request_id: &str,
) -> (StoredHandoff, StoredEnvelope) {
    let new = NewHandoff {
        from,
        to,
        instruction: "look into it",
        cause,
        depth: 1,
        followup_of: None,
        intent: None,
        request_id,
    };
    let handoff = ledger.record_handoff(&new).await.unwrap().expect("no task to refuse it");
    let envelope = shown(ledger, handoff.envelope_id).await;
    (handoff, envelope)
}

/// An envelope moved from queued to pending, as handing it to a session does.
async fn shown(ledger: &Ledger, envelope_id: i64) -> StoredEnvelope {
    assert!(
        ledger
            .transition(envelope_id, &[EnvelopeState::Queued], EnvelopeState::Pending, "test", None)
            .await
            .unwrap()
    );
    let listed = ledger.list(&ListFilter { limit: 100, ..Default::default() }).await.unwrap();
    listed.into_iter().find(|e| e.id == envelope_id).expect("the envelope is listed")
}

/// `to` answers `handoff`; the answer, pending for the delegator as if shown.
async fn answer(ledger: &Ledger, handoff: &StoredHandoff, request_id: &str) -> StoredEnvelope {
    let end = HandoffEnd::Answered { text: "done", request_id: Some(request_id) };
    let ended = ledger.end_handoff(handoff, end, "agent:test").await.unwrap().unwrap().unwrap();
    shown(ledger, ended.answer_envelope_id.expect("an answer envelope")).await
}

/// DESIGN.md §9: a reply to the cause envelope also settles the pending answers made on
/// its behalf; when the cause is a handoff, that reply is its answer. Answers made on
/// behalf of those answers belong to the same conversation and are settled with them.
pub(crate) async fn answering_a_handoff_settles_the_answers_made_on_its_behalf<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let [orch, worker, helper] = ["orch", "worker", "helper"].map(|name| AgentName::parse(name).unwrap());
    let (outer, one) = hand(&ledger, &orch, &worker, None, "req_1").await;
    let (inner, _) = hand(&ledger, &worker, &helper, Some(&one), "req_2").await;
    let back = answer(&ledger, &inner, "req_3").await;
    let (again, _) = hand(&ledger, &worker, &helper, Some(&back), "req_4").await;
    let back_again = answer(&ledger, &again, "req_5").await;
    assert_eq!(ledger.pending(&worker).await.unwrap().len(), 3, "one, back and back_again wait");

    answer(&ledger, &outer, "req_6").await;
    let pending: Vec<_> = ledger.pending(&worker).await.unwrap().into_iter().map(|e| e.trace_id).collect();
    assert!(
        pending.is_empty(),
        "answering `one` settles {} and {}: {pending:?}",
        back.trace_id,
        back_again.trace_id
    );
    let orch_pending = ledger.pending(&orch).await.unwrap();
    assert_eq!(orch_pending.len(), 1, "the orchestrator's answer is not one of them");
}
