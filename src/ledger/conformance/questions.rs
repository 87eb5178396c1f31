//! Operator questions (DESIGN §15): one per unresolved send, answered once, and settled
//! when the envelope was reconciled another way.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::domain::AttemptState;
use crate::ids::TraceId;
use crate::ledger::conformance::Backend;
use crate::ledger::conformance::fixtures::*;
use crate::ledger::*;

/// Names questions `qst_0`, `qst_1`, … in the order they are made.
fn numbered() -> impl Fn() -> String + Send + Sync {
    let next = AtomicUsize::new(0);
    move || format!("qst_{}", next.fetch_add(1, Ordering::Relaxed))
}

/// Records `count` pending envelopes, each with a reply whose send was lost: unresolved.
async fn unresolved_envelopes(ledger: &Ledger, count: i64) -> Vec<StoredEnvelope> {
    let batch: Vec<_> = (1..=count).map(|update_id| routed(update_id, EnvelopeState::Pending)).collect();
    ledger.record_batch(1, count + 1, &batch).await.unwrap();
    let mut rows = ledger.list(&ListFilter { limit: count, ..Default::default() }).await.unwrap();
    rows.sort_by_key(|row| row.id);
    for row in &rows {
        let lost = ledger.begin_attempt(&one_part_reply(row.id)).await.unwrap().unwrap();
        ledger
            .finish_attempt(&lost, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
            .await
            .unwrap();
        assert_eq!(state_of(ledger, &row.trace_id).await, EnvelopeState::Unresolved);
    }
    rows
}

async fn state_of(ledger: &Ledger, trace: &TraceId) -> EnvelopeState {
    ledger.find(trace).await.unwrap().unwrap().state
}

pub(crate) async fn a_question_is_asked_once_per_unresolved_send_and_answered_once<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let envelopes = unresolved_envelopes(&ledger, 2).await;
    let new_id = numbered();
    let asked = ledger.record_new_questions(7, Some(3), &new_id).await.unwrap();
    let read: Vec<_> =
        asked.iter().map(|q| (q.envelope_id, q.trace_id.clone(), q.state, q.prompt_send)).collect();
    assert_eq!(
        read,
        envelopes
            .iter()
            .map(|e| (e.id, e.trace_id.clone(), QuestionState::Open, AttemptState::InFlight))
            .collect::<Vec<_>>()
    );
    assert!(asked.iter().all(|q| (q.chat_id, q.thread_id, q.sent_chat_id) == (7, Some(3), 42)));
    assert!(ledger.record_new_questions(7, Some(3), &new_id).await.unwrap().is_empty(), "asked once");
    let (first, second) = (&asked[0], &asked[1]);

    ledger.finish_question_send(&first.id, &AttemptOutcome::Sent { message_id: 100 }).await.unwrap();
    let posted = ledger.question(&first.id).await.unwrap().unwrap();
    assert_eq!((posted.prompt_send, posted.prompt_message_id), (AttemptState::Sent, Some(100)));
    assert!(ledger.unsettled_questions().await.unwrap().is_empty(), "nothing answered yet");

    // The first answer reconciles the envelope; a second one (a stale press) changes nothing.
    let answered = ledger.answer_question(first, Reconciliation::Delivered, 7, "ann").await.unwrap();
    assert_eq!(answered, QuestionAnswered::Reconciled);
    assert_eq!(state_of(&ledger, &envelopes[0].trace_id).await, EnvelopeState::Acked);
    let again = ledger.answer_question(first, Reconciliation::NotDelivered, 8, "bob").await.unwrap();
    assert_eq!(again, QuestionAnswered::TooLate);
    assert_eq!(state_of(&ledger, &envelopes[0].trace_id).await, EnvelopeState::Acked);
    let stored = ledger.question(&first.id).await.unwrap().unwrap();
    assert_eq!((stored.state, stored.answered_by_name.as_deref()), (QuestionState::Delivered, Some("ann")));
    assert!(stored.answered_at.is_some());

    // Not delivered puts the envelope back to work: queued for its agent's session.
    let answered = ledger.answer_question(second, Reconciliation::NotDelivered, 7, "ann").await.unwrap();
    assert_eq!(answered, QuestionAnswered::Reconciled);
    assert_eq!(state_of(&ledger, &envelopes[1].trace_id).await, EnvelopeState::Queued);
    assert_eq!(ledger.question(&second.id).await.unwrap().unwrap().state, QuestionState::NotDelivered);
    assert_eq!(ledger.unreconciled_attempts().await.unwrap(), 0);

    // Only a prompt whose send is classified is to be edited; once edited, it is settled.
    let unsettled = |ledger: Ledger| async move {
        ledger.unsettled_questions().await.unwrap().into_iter().map(|q| q.id).collect::<Vec<_>>()
    };
    assert_eq!(unsettled(ledger.clone()).await, [first.id.as_str()], "the second's send is in flight");
    assert_eq!(ledger.recover_question_sends().await.unwrap(), 1);
    assert_eq!(ledger.recover_question_sends().await.unwrap(), 0, "recovered once");
    assert_eq!(ledger.question(&second.id).await.unwrap().unwrap().prompt_send, AttemptState::Unknown);
    let mut both = unsettled(ledger.clone()).await;
    both.sort();
    assert_eq!(both, [first.id.as_str(), second.id.as_str()]);
    ledger.settle_question_prompt(&first.id).await.unwrap();
    assert_eq!(unsettled(ledger.clone()).await, [second.id.as_str()]);
}

pub(crate) async fn a_question_reconciled_elsewhere_is_settled_and_one_not_posted_is_taken_to_ask_again<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    let envelopes = unresolved_envelopes(&ledger, 2).await;
    let new_id = numbered();
    let asked = ledger.record_new_questions(7, None, &new_id).await.unwrap();
    assert_eq!(asked.len(), 2);

    // A prompt Telegram refused leaves its question open: no second question is made for
    // it, and it is taken once to be asked again, in flight again.
    let refused = AttemptOutcome::NotSent { error: "chat not found".into() };
    ledger.finish_question_send(&asked[1].id, &refused).await.unwrap();
    let stored = ledger.question(&asked[1].id).await.unwrap().unwrap();
    assert_eq!((stored.state, stored.prompt_send), (QuestionState::Open, AttemptState::NotSent));
    assert!(ledger.record_new_questions(7, None, &new_id).await.unwrap().is_empty());
    let again = ledger.take_unsent_questions().await.unwrap();
    assert_eq!(
        again.iter().map(|q| (q.id.as_str(), q.prompt_send)).collect::<Vec<_>>(),
        [(asked[1].id.as_str(), AttemptState::InFlight)]
    );
    assert!(ledger.take_unsent_questions().await.unwrap().is_empty(), "taken once");
    ledger.finish_question_send(&asked[1].id, &refused).await.unwrap();

    // The CLI reconciles the first envelope: its question is settled, and answers nothing.
    ledger.reconcile(&envelopes[0].trace_id, Reconciliation::NotDelivered, "checked the chat").await.unwrap();
    assert_eq!(ledger.settle_answered_elsewhere().await.unwrap(), 1);
    assert_eq!(ledger.settle_answered_elsewhere().await.unwrap(), 0, "settled once");
    assert_eq!(ledger.question(&asked[0].id).await.unwrap().unwrap().state, QuestionState::Settled);
    assert_eq!(ledger.question(&asked[1].id).await.unwrap().unwrap().state, QuestionState::Open);
    let late = ledger.answer_question(&asked[0], Reconciliation::Delivered, 7, "ann").await.unwrap();
    assert_eq!(late, QuestionAnswered::TooLate);
    assert_eq!(
        state_of(&ledger, &envelopes[0].trace_id).await,
        EnvelopeState::Queued,
        "the CLI's finding stands"
    );
    assert_eq!(ledger.question("qst_nonesuch").await.unwrap(), None);
}
