use crate::ids::{AgentName, TraceId};
use crate::ledger::conformance::Backend;
use crate::ledger::conformance::fixtures::*;
use crate::ledger::*;

pub(crate) async fn finishing_an_attempt_settles_its_envelope_in_the_same_step<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger
        .record_batch(1, 3, &[routed(1, EnvelopeState::Pending), routed(2, EnvelopeState::Pending)])
        .await
        .unwrap();
    let rows = ledger.list(&ListFilter { limit: 2, ..Default::default() }).await.unwrap();
    let attempt = |envelope_id, chunk_index| NewAttempt {
        reply_to_message_id: Some(1),
        chunk_index,
        chunk_count: 2,
        text: "part",
        ..one_part_reply(envelope_id)
    };
    let state = |trace: TraceId| {
        let ledger = ledger.clone();
        async move { ledger.find(&trace).await.unwrap().unwrap().state }
    };

    // Two parts: the first confirmed leaves the envelope pending, the last answers it.
    let first = ledger.begin_attempt(&attempt(rows[0].id, 0)).await.unwrap().unwrap();
    ledger.finish_attempt(&first, &AttemptOutcome::Sent { message_id: 10 }, "agent:orch").await.unwrap();
    assert_eq!(state(rows[0].trace_id.clone()).await, EnvelopeState::Pending);
    let last = ledger.begin_attempt(&attempt(rows[0].id, 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&last, &AttemptOutcome::Sent { message_id: 11 }, "agent:orch").await.unwrap();
    assert_eq!(state(rows[0].trace_id.clone()).await, EnvelopeState::Acked);

    // Not sent changes nothing; unknown makes the envelope unresolved.
    let refused = ledger.begin_attempt(&attempt(rows[1].id, 0)).await.unwrap().unwrap();
    ledger
        .finish_attempt(&refused, &AttemptOutcome::NotSent { error: "400".into() }, "agent:orch")
        .await
        .unwrap();
    assert_eq!(state(rows[1].trace_id.clone()).await, EnvelopeState::Pending);
    let lost = ledger.begin_attempt(&attempt(rows[1].id, 0)).await.unwrap().unwrap();
    ledger
        .finish_attempt(&lost, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
        .await
        .unwrap();
    assert_eq!(state(rows[1].trace_id.clone()).await, EnvelopeState::Unresolved);
}

pub(crate) async fn in_flight_attempts_become_unknown_at_start_up_and_can_be_reconciled<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let attempt = NewAttempt { reply_to_message_id: Some(1), text: "hi", ..one_part_reply(e.id) };
    ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);
    assert_eq!(ledger.recover_in_flight().await.unwrap(), std::slice::from_ref(&e.trace_id));
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Unresolved);
    assert_eq!(ledger.attempts_for(e.id).await.unwrap()[0].outcome, AttemptState::Unknown);

    // Back to its agent: queued, for its session to be handed again, counted as a delivery
    // more.
    let before = ledger.find(&e.trace_id).await.unwrap().unwrap().deliveries;
    let state = ledger.reconcile(&e.trace_id, Reconciliation::NotDelivered, "not in the chat").await.unwrap();
    assert_eq!(state, EnvelopeState::Queued);
    let again = ledger.claim_next_queued(&AgentName::parse("orch").unwrap()).await.unwrap().unwrap();
    assert_eq!((again.trace_id.clone(), again.state), (e.trace_id.clone(), EnvelopeState::Pending));
    assert_eq!(again.deliveries, before + 1);
    let attempts = ledger.attempts_for(e.id).await.unwrap();
    assert_eq!(attempts[0].reconciled_outcome, Some(ReconciledOutcome::NotSent));
    assert!(attempts[0].reconciled_reason.as_deref().unwrap().contains("not in the chat"));
    assert!(matches!(
        ledger.reconcile(&e.trace_id, Reconciliation::Delivered, "again").await,
        Err(ReconcileError::NothingToReconcile { .. })
    ));
}

/// A reply cut off at an unknown part that was not its last, found delivered by the
/// operator: the part counts as sent, but the parts after it were never attempted, so the
/// envelope goes back to its agent to finish, not `acked` with the rest lost.
pub(crate) async fn a_reply_cut_off_at_an_unknown_part_found_delivered_goes_back_to_finish<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let part = |chunk_index| NewAttempt { chunk_index, chunk_count: 3, ..one_part_reply(e.id) };
    let first = ledger.begin_attempt(&part(0)).await.unwrap().unwrap();
    ledger.finish_attempt(&first, &AttemptOutcome::Sent { message_id: 10 }, "agent:orch").await.unwrap();
    let second = ledger.begin_attempt(&part(1)).await.unwrap().unwrap();
    let lost = AttemptOutcome::Unknown { error: "timeout".into() };
    ledger.finish_attempt(&second, &lost, "agent:orch").await.unwrap();
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Unresolved);

    let state =
        ledger.reconcile(&e.trace_id, Reconciliation::Delivered, "part 2 is in the chat").await.unwrap();
    assert_eq!(state, EnvelopeState::Queued, "part 3 was never sent");
    let attempts = ledger.attempts_for(e.id).await.unwrap();
    assert_eq!(attempts[1].reconciled_outcome, Some(ReconciledOutcome::Sent));
    ledger.claim_next_queued(&AgentName::parse("orch").unwrap()).await.unwrap().expect("handed again");
    let found = ledger.find_for_reply(&e.trace_id).await.unwrap().unwrap();
    assert!(!found.awaiting_reconciliation, "its agent may finish it");

    // The last part found delivered: the reply is whole.
    let third = ledger.begin_attempt(&part(2)).await.unwrap().unwrap();
    ledger.finish_attempt(&third, &lost, "agent:orch").await.unwrap();
    let state = ledger.reconcile(&e.trace_id, Reconciliation::Delivered, "all there").await.unwrap();
    assert_eq!(state, EnvelopeState::Acked);
}

/// A send whose outcome arrives after recovery settled it (a replica that took over from
/// the one making it) keeps the settled outcome: the ledger tells one story, the late
/// answer changes nothing, and the caller hears it was settled.
pub(crate) async fn an_outcome_learned_after_recovery_settled_the_attempt_changes_nothing<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let attempt = NewAttempt { reply_to_message_id: Some(1), text: "hi", ..one_part_reply(e.id) };
    let op_id = ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    assert_eq!(ledger.recover_in_flight().await.unwrap(), std::slice::from_ref(&e.trace_id));

    let late = ledger.finish_attempt(&op_id, &AttemptOutcome::Sent { message_id: 5 }, "agent:orch").await;
    assert_eq!(late.unwrap(), FinishedAttempt::AlreadySettled(AttemptState::Unknown));
    let attempts = ledger.attempts_for(e.id).await.unwrap();
    assert_eq!((attempts[0].outcome, attempts[0].telegram_message_id), (AttemptState::Unknown, None));
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Unresolved);

    // An attempt that was never recorded is still an error.
    let unknown_op = crate::ids::AttemptId::generate();
    let outcome = AttemptOutcome::Sent { message_id: 6 };
    assert!(ledger.finish_attempt(&unknown_op, &outcome, "agent:orch").await.is_err());
}

/// An outcome recorded again after its first record's answer was lost (the connection
/// dropped during `COMMIT`) is that record: the caller hears it recorded, so a reply's next
/// part goes, and nothing changes twice.
pub(crate) async fn an_outcome_recorded_again_is_the_record_already_made<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let attempt = NewAttempt { reply_to_message_id: Some(1), text: "hi", ..one_part_reply(e.id) };
    let op_id = ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    let sent = AttemptOutcome::Sent { message_id: 5 };
    assert_eq!(ledger.finish_attempt(&op_id, &sent, "agent:orch").await.unwrap(), FinishedAttempt::Recorded);
    assert_eq!(ledger.finish_attempt(&op_id, &sent, "agent:orch").await.unwrap(), FinishedAttempt::Recorded);
    let other = AttemptOutcome::Sent { message_id: 6 };
    assert_eq!(
        ledger.finish_attempt(&op_id, &other, "agent:orch").await.unwrap(),
        FinishedAttempt::AlreadySettled(AttemptState::Sent)
    );
    let attempts = ledger.attempts_for(e.id).await.unwrap();
    assert_eq!((attempts.len(), attempts[0].telegram_message_id), (1, Some(5)));
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Acked);
}

pub(crate) async fn an_answered_envelope_stays_answered_when_a_follow_up_is_unknown_and_reconciles_alone<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let facts = |found: Option<FoundForReply>| found.map(|f| (f.awaiting_reconciliation, f.replied_before));
    assert_eq!(facts(ledger.find_for_reply(&e.trace_id).await.unwrap()), Some((false, false)));
    assert_eq!(ledger.find_for_reply(&"env_nonesuchxx".into()).await.unwrap(), None);
    let answer = ledger.begin_attempt(&reply_attempt(e.id, "req_aaaaaaaa", 0, 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &AttemptOutcome::Sent { message_id: 9 }, "agent:orch").await.unwrap();
    assert_eq!(facts(ledger.find_for_reply(&e.trace_id).await.unwrap()), Some((false, true)));
    let follow_up = ledger.begin_attempt(&reply_attempt(e.id, "req_bbbbbbbb", 0, 1)).await.unwrap().unwrap();
    ledger
        .finish_attempt(&follow_up, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
        .await
        .unwrap();

    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Acked);
    assert_eq!(ledger.awaiting_reconciliation(&[e.id]).await.unwrap(), [e.id]);
    let found = ledger.find_for_reply(&e.trace_id).await.unwrap().unwrap();
    assert_eq!((found.awaiting_reconciliation, found.replied_before), (true, true));
    assert_eq!(Some(found.envelope), ledger.find(&e.trace_id).await.unwrap());
    assert_eq!(ledger.unreconciled_attempts().await.unwrap(), 1);

    assert_eq!(
        ledger.reconcile(&e.trace_id, Reconciliation::NotDelivered, "not in the chat").await.unwrap(),
        EnvelopeState::Acked
    );
    assert!(ledger.awaiting_reconciliation(&[e.id]).await.unwrap().is_empty());
    assert_eq!(facts(ledger.find_for_reply(&e.trace_id).await.unwrap()), Some((false, true)));
    assert!(matches!(
        ledger.reconcile(&e.trace_id, Reconciliation::Delivered, "again").await,
        Err(ReconcileError::NothingToReconcile { .. })
    ));
}

/// An attempt beside an envelope's answer (the ack reaction, an audit copy, an edit) can
/// end unknown on an envelope that is not `unresolved` and never will be: one superseded by
/// a correction, one still pending. Nothing but an operator settles it, so `ledger list
/// --unreconciled` finds its envelope and `ledger reconcile` settles it there, leaving the
/// envelope's state alone (an audit copy found delivered answers nothing).
pub(crate) async fn an_unknown_attempt_beside_the_answer_is_found_and_settled_in_any_state<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let batch = [
        routed(1, EnvelopeState::Pending),
        routed(2, EnvelopeState::Pending),
        routed(3, EnvelopeState::Pending),
    ];
    ledger.record_batch(1, 4, &batch).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 3, ..Default::default() }).await.unwrap();
    let (corrected, copied, quiet) = (&rows[0], &rows[1], &rows[2]);
    let lost = AttemptOutcome::Unknown { error: "timeout".into() };
    let ack_reaction =
        ledger.begin_attempt(&reaction(corrected.id, "req_ackreact", 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&ack_reaction, &lost, "agent:orch").await.unwrap();
    let superseded = [EnvelopeState::Pending];
    assert!(
        ledger
            .transition(corrected.id, &superseded, EnvelopeState::Superseded, "agent:orch", None)
            .await
            .unwrap()
    );
    let audit_copy = NewAttempt { purpose: AttemptPurpose::Audit, ..one_part_reply(copied.id) };
    let audit_copy = ledger.begin_attempt(&audit_copy).await.unwrap().unwrap();
    ledger.finish_attempt(&audit_copy, &lost, "agent:orch").await.unwrap();
    assert_eq!(ledger.find(&copied.trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);
    assert_eq!(ledger.unreconciled_attempts().await.unwrap(), 2);

    let unreconciled = |state: Option<EnvelopeState>| {
        let ledger = ledger.clone();
        async move {
            let filter = ListFilter { state, unreconciled: true, limit: 10, ..Default::default() };
            ledger.list(&filter).await.unwrap().into_iter().map(|e| e.trace_id).collect::<Vec<_>>()
        }
    };
    assert_eq!(unreconciled(None).await, [corrected.trace_id.clone(), copied.trace_id.clone()]);
    assert_eq!(
        unreconciled(Some(EnvelopeState::Superseded)).await,
        std::slice::from_ref(&corrected.trace_id)
    );
    assert!(!unreconciled(None).await.contains(&quiet.trace_id), "nothing of it is unknown");

    let state =
        ledger.reconcile(&corrected.trace_id, Reconciliation::NotDelivered, "no 👀 on it").await.unwrap();
    assert_eq!(state, EnvelopeState::Superseded);
    let attempts = ledger.attempts_for(corrected.id).await.unwrap();
    assert_eq!(attempts[0].reconciled_outcome, Some(ReconciledOutcome::NotSent));
    assert!(attempts[0].reconciled_reason.as_deref().unwrap().contains("no 👀 on it"));
    let state =
        ledger.reconcile(&copied.trace_id, Reconciliation::Delivered, "the copy is there").await.unwrap();
    assert_eq!(state, EnvelopeState::Pending, "an audit copy answers nothing");
    assert_eq!(ledger.find(&copied.trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);

    assert_eq!(ledger.unreconciled_attempts().await.unwrap(), 0);
    assert!(unreconciled(None).await.is_empty());
    for envelope in [corrected, quiet] {
        assert!(matches!(
            ledger.reconcile(&envelope.trace_id, Reconciliation::Delivered, "again").await,
            Err(ReconcileError::NothingToReconcile { .. })
        ));
    }
}

pub(crate) async fn a_reply_request_is_summed_up_from_its_attempts<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    assert_eq!(ledger.recorded_reply("orch", "req_cccccccc").await.unwrap(), None);
    assert!(!ledger.reply_request_seen("orch", "req_cccccccc").await.unwrap());

    // Part 1 sent; part 2 rate-limited once, then refused.
    let first = ledger.begin_attempt(&reply_attempt(e.id, "req_cccccccc", 0, 2)).await.unwrap().unwrap();
    ledger.finish_attempt(&first, &AttemptOutcome::Sent { message_id: 5 }, "agent:orch").await.unwrap();
    let in_flight = ledger.begin_attempt(&reply_attempt(e.id, "req_cccccccc", 1, 2)).await.unwrap().unwrap();
    let recorded = ledger.recorded_reply("orch", "req_cccccccc").await.unwrap().unwrap();
    assert_eq!(recorded.verdict, ReplyVerdict::InFlight);
    ledger
        .finish_attempt(&in_flight, &AttemptOutcome::NotSent { error: "400".into() }, "agent:orch")
        .await
        .unwrap();

    let recorded = ledger.recorded_reply("orch", "req_cccccccc").await.unwrap().unwrap();
    assert_eq!((recorded.trace_id.as_str(), recorded.parts), (e.trace_id.as_str(), 2));
    assert_eq!(recorded.sent, [(0, 5)]);
    assert_eq!(recorded.verdict, ReplyVerdict::NotSent { error: "400".into() });
    assert!(ledger.reply_request_seen("orch", "req_cccccccc").await.unwrap());
    // Another agent cannot read it.
    assert_eq!(ledger.recorded_reply("worker", "req_cccccccc").await.unwrap(), None);
    assert!(!ledger.reply_request_seen("worker", "req_cccccccc").await.unwrap());
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);
}

/// A request that finished a reply cut off part-way left attempts only for the parts it
/// sent; its outcome counts the parts it carried from the request before it, so the reply
/// reads as delivered, by it and as the envelope's last reply.
pub(crate) async fn a_resumed_request_counts_the_parts_it_carried<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let e = one_pending_message(&*ledger).await;
    let sent = |message_id| AttemptOutcome::Sent { message_id };
    // Three parts: the first sent, the second refused.
    let first = ledger.begin_attempt(&reply_attempt(e.id, "req_cutoff01", 0, 3)).await.unwrap().unwrap();
    ledger.finish_attempt(&first, &sent(5), "agent:orch").await.unwrap();
    let refused = ledger.begin_attempt(&reply_attempt(e.id, "req_cutoff01", 1, 3)).await.unwrap().unwrap();
    let not_sent = AttemptOutcome::NotSent { error: "400".into() };
    ledger.finish_attempt(&refused, &not_sent, "agent:orch").await.unwrap();
    // The same text again: the second and third parts.
    for (index, message_id) in [(1, 6), (2, 7)] {
        let op = ledger.begin_attempt(&reply_attempt(e.id, "req_resumed1", index, 3)).await.unwrap().unwrap();
        ledger.finish_attempt(&op, &sent(message_id), "agent:orch").await.unwrap();
    }

    let resumed = ledger.recorded_reply("orch", "req_resumed1").await.unwrap().unwrap();
    assert_eq!(resumed.verdict, ReplyVerdict::Delivered);
    assert_eq!(resumed.sent, [(0, 5), (1, 6), (2, 7)]);
    let (request_id, attempts) = ledger.last_reply_for(e.id).await.unwrap().unwrap();
    assert_eq!(request_id, "req_resumed1");
    let tally = ReplyTally::of(&attempts).unwrap();
    assert_eq!((tally.verdict, tally.sent.len()), (ReplyVerdict::Delivered, 3));
    // The earlier request still reads as what it was.
    let cut_off = ledger.recorded_reply("orch", "req_cutoff01").await.unwrap().unwrap();
    assert_eq!(cut_off.sent, [(0, 5)]);
    assert!(matches!(cut_off.verdict, ReplyVerdict::NotSent { .. }), "{cut_off:?}");
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Acked);
}

/// A reaction or an edit is an attempt of its own: its method and target are kept, and
/// whatever it comes to, the envelope is neither answered nor held for reconciliation,
/// and a reply made after it is still the envelope's first.
pub(crate) async fn reactions_and_edits_settle_nothing_and_are_no_part_of_a_reply<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let e = one_pending_message(&*ledger).await;
    let confirmed = ledger.begin_attempt(&reaction(e.id, "req_react001", 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&confirmed, &AttemptOutcome::Sent { message_id: 1 }, "agent:orch").await.unwrap();
    assert_eq!(
        ledger.find(&e.trace_id).await.unwrap().unwrap().state,
        EnvelopeState::Pending,
        "not answered"
    );
    let edit = NewAttempt {
        request_id: Some("req_edit0001"),
        method: AttemptMethod::EditMessage,
        target_message_id: Some(77),
        ..one_part_reply(e.id)
    };
    let lost = ledger.begin_attempt(&edit).await.unwrap().unwrap();
    ledger
        .finish_attempt(&lost, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
        .await
        .unwrap();
    assert_eq!(
        ledger.find(&e.trace_id).await.unwrap().unwrap().state,
        EnvelopeState::Pending,
        "not unresolved"
    );

    assert!(ledger.awaiting_reconciliation(&[e.id]).await.unwrap().is_empty());
    let found = ledger.find_for_reply(&e.trace_id).await.unwrap().unwrap();
    assert_eq!((found.awaiting_reconciliation, found.replied_before), (false, false));
    assert_eq!(ledger.recorded_reply("orch", "req_react001").await.unwrap(), None);
    assert_eq!(ledger.last_reply_for(e.id).await.unwrap(), None);
    let attempts = ledger.attempts_for(e.id).await.unwrap();
    let read: Vec<_> = attempts.iter().map(|a| (a.method, a.target_message_id, a.outcome)).collect();
    assert_eq!(
        read,
        [
            (AttemptMethod::SetReaction, Some(1), AttemptState::Sent),
            (AttemptMethod::EditMessage, Some(77), AttemptState::Unknown)
        ]
    );

    // The reply that follows answers the envelope as ever.
    let answer = ledger.begin_attempt(&reply_attempt(e.id, "req_answer01", 0, 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &AttemptOutcome::Sent { message_id: 9 }, "agent:orch").await.unwrap();
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Acked);
    let reply = ledger.recorded_reply("orch", "req_answer01").await.unwrap().unwrap();
    assert_eq!((reply.parts, reply.sent, reply.verdict), (1, vec![(0, 9)], ReplyVerdict::Delivered));
}

/// The messages the bot posted are known by chat and id, with whom they were sent for;
/// a reaction or an edit posts none. A reaction request is found again by its id.
pub(crate) async fn the_bots_messages_are_known_by_their_confirmed_sends<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let e = one_pending_message(&*ledger).await;
    let reply = ledger.begin_attempt(&reply_attempt(e.id, "req_answer01", 0, 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&reply, &AttemptOutcome::Sent { message_id: 9 }, "agent:orch").await.unwrap();
    let react = ledger.begin_attempt(&reaction(e.id, "req_react001", 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&react, &AttemptOutcome::Sent { message_id: 1 }, "agent:orch").await.unwrap();

    assert_eq!(
        ledger.bot_message(42, 9).await.unwrap(),
        Some(("orch".to_owned(), AttemptMethod::SendMessage))
    );
    assert_eq!(ledger.bot_message(43, 9).await.unwrap(), None, "another chat");
    assert_eq!(ledger.bot_message(42, 1).await.unwrap(), None, "the user's message, reacted to");
    let found = ledger.action_attempt("orch", "req_react001").await.unwrap().unwrap();
    assert_eq!(
        (found.method, found.outcome, found.target_message_id),
        (AttemptMethod::SetReaction, AttemptState::Sent, Some(1))
    );
    assert_eq!(ledger.action_attempt("orch", "req_answer01").await.unwrap(), None, "a reply is no action");
    assert_eq!(ledger.action_attempt("helper", "req_react001").await.unwrap(), None, "another agent's");
}

pub(crate) async fn reactions_are_owed_to_the_agent_whose_reply_they_are_on_and_stored_once<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let answered = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let sent = ledger.begin_attempt(&one_part_reply(answered.id)).await.unwrap().unwrap();
    ledger.finish_attempt(&sent, &AttemptOutcome::Sent { message_id: 500 }, "agent:orch").await.unwrap();

    let reactions = [reaction_on(2, 500, &["👍"]), reaction_on(3, 1, &["👍"]), reaction_on(4, 500, &[])];
    let recorded = ledger.record_batch_with_reactions(1, 5, &[], &reactions, &[], None).await.unwrap();
    assert_eq!(
        recorded.reactions.iter().map(|r| r.trace_id.as_str()).collect::<Vec<_>>(),
        [answered.trace_id.as_str()]
    );
    // A re-poll of the same updates stores nothing again and owes nothing more.
    let again = ledger.record_batch_with_reactions(1, 5, &[], &reactions, &[], None).await.unwrap();
    assert!(again.reactions.is_empty());
    let states: Vec<String> =
        ledger.reactions_recorded().await.unwrap().into_iter().map(|r| r.state).collect();
    assert_eq!(states, ["owed", "ignored", "ignored"]);

    // Owed until a session was given it; never an envelope, never pending.
    let owed = ledger.owed_reactions(&orch).await.unwrap();
    assert_eq!((owed.len(), owed[0].emoji.as_str()), (1, "👍"));
    assert_eq!(ledger.pending(&orch).await.unwrap().len(), 0, "the answered envelope is acked, nothing else");
    ledger.reactions_delivered(&[owed[0].id]).await.unwrap();
    assert!(ledger.owed_reactions(&orch).await.unwrap().is_empty());
}

/// A batch's reactions are stored in its order, whatever their number: alone, a reaction
/// is owed as in a batch of several, and in a batch each finds what it is on, is owed or
/// ignored for itself, and one repeated in the batch is stored once.
pub(crate) async fn a_batch_of_reactions_is_stored_in_order_and_each_owed_for_itself<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    ledger
        .record_batch(1, 3, &[routed(1, EnvelopeState::Pending), routed(2, EnvelopeState::Pending)])
        .await
        .unwrap();
    let mut answered = ledger.list(&ListFilter { limit: 2, ..Default::default() }).await.unwrap();
    answered.sort_by_key(|e| e.id);
    for (envelope, bot_message) in answered.iter().zip([500, 501]) {
        let sent = ledger.begin_attempt(&one_part_reply(envelope.id)).await.unwrap().unwrap();
        ledger
            .finish_attempt(&sent, &AttemptOutcome::Sent { message_id: bot_message }, "agent:orch")
            .await
            .unwrap();
    }
    let (on_500, on_501) = (answered[0].trace_id.as_str(), answered[1].trace_id.as_str());

    let alone = ledger
        .record_batch_with_reactions(1, 11, &[], &[reaction_on(10, 500, &["👍"])], &[], None)
        .await
        .unwrap();
    assert_eq!(alone.reactions.iter().map(|r| r.trace_id.as_str()).collect::<Vec<_>>(), [on_500]);

    let batch = [
        reaction_on(11, 501, &["🔥"]),
        reaction_on(12, 999, &["👍"]),
        reaction_on(13, 500, &[]),
        reaction_on(11, 501, &["🔥"]),
        reaction_on(14, 500, &["👎"]),
    ];
    let recorded = ledger.record_batch_with_reactions(1, 15, &[], &batch, &[], None).await.unwrap();
    let owed: Vec<(&str, &str)> =
        recorded.reactions.iter().map(|r| (r.trace_id.as_str(), r.emoji.as_str())).collect();
    assert_eq!(owed, [(on_501, "🔥"), (on_500, "👎")], "owed in the batch's order, the repeated one once");
    let states: Vec<String> =
        ledger.reactions_recorded().await.unwrap().into_iter().map(|r| r.state).collect();
    assert_eq!(states, ["owed", "owed", "ignored", "ignored", "owed"], "one row an update, in arrival order");

    let owed_now = ledger.owed_reactions(&orch).await.unwrap();
    assert_eq!(owed_now.iter().map(|r| r.emoji.as_str()).collect::<Vec<_>>(), ["👍", "🔥", "👎"]);
    assert!(owed_now.windows(2).all(|pair| pair[0].id < pair[1].id), "ids in arrival order");
    let returned: Vec<i64> = alone.reactions.iter().chain(&recorded.reactions).map(|r| r.id).collect();
    assert_eq!(
        returned,
        owed_now.iter().map(|r| r.id).collect::<Vec<_>>(),
        "each handed over with its own row's id"
    );
}
