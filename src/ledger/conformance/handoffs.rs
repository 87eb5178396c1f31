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
