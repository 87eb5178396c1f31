use crate::ids::{AgentName, TraceId};
use crate::ledger::conformance::Backend;
use crate::ledger::conformance::fixtures::*;
use crate::ledger::*;

pub(crate) async fn a_batch_handed_over_is_pending_when_committed_with_the_older_queued_envelopes_first<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Queued)]).await.unwrap();
    let mut other = routed(2, EnvelopeState::Queued);
    other.agent = Some(AgentName::parse("worker").unwrap());
    let batch = [routed(3, EnvelopeState::Queued), other, routed(4, EnvelopeState::Queued)];
    let recorded = ledger.record_batch_handing_over(1, 5, &batch, &[&orch], None).await.unwrap();
    let (inserted, handed) = (recorded.inserted, recorded.claimed);
    assert_eq!(inserted.len(), 3);
    // Every queued envelope of the agent, the one recorded earlier first; none of another.
    let handed_updates: Vec<_> = handed.iter().map(|e| e.update_id).collect();
    assert_eq!(handed_updates, [Some(1), Some(3), Some(4)]);
    assert!(handed.iter().all(|e| e.state == EnvelopeState::Pending && e.deliveries == 1), "{handed:?}");
    // The ledger says so, and nothing is left for a claim.
    assert_eq!(ledger.pending(&orch).await.unwrap(), handed);
    assert_eq!(ledger.claim_next_queued(&orch).await.unwrap(), None);
    let worker = AgentName::parse("worker").unwrap();
    assert_eq!(ledger.claim_next_queued(&worker).await.unwrap().and_then(|e| e.update_id), Some(2));
}

pub(crate) async fn a_batch_and_its_offset_commit_together_and_replays_are_skipped<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let batch = [routed(1, EnvelopeState::Queued), routed(2, EnvelopeState::Queued)];
    assert_eq!(ledger.record_batch(7, 3, &batch).await.unwrap().len(), 2);
    assert_eq!(ledger.next_offset(7).await.unwrap(), Some(3));
    // The same updates polled again (new trace ids, same update ids) are not stored twice.
    let replay = [routed(2, EnvelopeState::Queued), routed(3, EnvelopeState::Queued)];
    let inserted = ledger.record_batch(7, 4, &replay).await.unwrap();
    assert_eq!(inserted.iter().map(|r| r.envelope.update_id).collect::<Vec<_>>(), [3]);
    let all = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.iter().map(|e| e.update_id).collect::<Vec<_>>(), [Some(1), Some(2), Some(3)]);
}

pub(crate) async fn a_pushed_batch_leaves_the_offset_alone_and_a_redelivery_is_skipped<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    ledger
        .record_batch(7, 3, &[routed(1, EnvelopeState::Queued), routed(2, EnvelopeState::Queued)])
        .await
        .unwrap();
    let pushed = [routed(5, EnvelopeState::Queued)];
    let recorded = ledger.record_pushed_batch(&pushed, &[], &[&orch], None).await.unwrap();
    assert_eq!(recorded.inserted.len(), 1);
    // Handed over with the agent's older queued envelopes, as a polled batch is.
    let handed: Vec<_> = recorded.claimed.iter().map(|e| e.update_id).collect();
    assert_eq!(handed, [Some(1), Some(2), Some(5)]);
    assert_eq!(ledger.next_offset(7).await.unwrap(), Some(3), "no offset moves for a pushed update");
    // Telegram delivers it again (its 200 was lost): same id, same digest, new trace id.
    let redelivered = [routed(5, EnvelopeState::Queued)];
    let again = ledger.record_pushed_batch(&redelivered, &[], &[], None).await.unwrap();
    assert!(again.inserted.is_empty(), "{:?}", again.inserted);
    let all = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.iter().filter(|e| e.update_id == Some(5)).count(), 1);
    assert_eq!(ledger.next_offset(8).await.unwrap(), None, "nor is one made up");
}

pub(crate) async fn claims_go_oldest_first_and_redelivery_counts<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let agent = AgentName::parse("orch").unwrap();
    ledger
        .record_batch(
            1,
            4,
            &[
                routed(1, EnvelopeState::Queued),
                routed(2, EnvelopeState::Unrouted),
                routed(3, EnvelopeState::Queued),
            ],
        )
        .await
        .unwrap();
    let first = ledger.claim_next_queued(&agent).await.unwrap().unwrap();
    assert_eq!((first.update_id, first.state, first.deliveries), (Some(1), EnvelopeState::Pending, 1));
    let second = ledger.claim_next_queued(&agent).await.unwrap().unwrap();
    assert_eq!(second.update_id, Some(3));
    assert!(ledger.claim_next_queued(&agent).await.unwrap().is_none());
    let again = ledger.take_pending_for_redelivery(&agent).await.unwrap();
    assert_eq!(
        again.iter().map(|e| (e.update_id, e.deliveries)).collect::<Vec<_>>(),
        [(Some(1), 2), (Some(3), 2)]
    );
}

pub(crate) async fn transitions_only_from_allowed_states_and_are_audited<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    assert!(
        !ledger
            .transition(e.id, &[EnvelopeState::Queued], EnvelopeState::Acked, "agent:orch", None)
            .await
            .unwrap()
    );
    assert!(
        ledger
            .transition(e.id, &[EnvelopeState::Pending], EnvelopeState::Acked, "agent:orch", Some("done"))
            .await
            .unwrap()
    );
    let e = ledger.find(&e.trace_id).await.unwrap().unwrap();
    assert_eq!((e.state, e.note.as_deref()), (EnvelopeState::Acked, Some("done")));
    let events = ledger.events_for(e.id).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].from_state.as_str(), events[0].to_state.as_str()), ("pending", "acked"));
}

pub(crate) async fn a_reused_update_id_with_new_content_is_stored_and_a_re_poll_is_not<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let first = routed(5, EnvelopeState::Queued);
    assert_eq!(ledger.record_batch(1, 6, std::slice::from_ref(&first)).await.unwrap().len(), 1);
    // Telegram reuses id 5 for another update after a week of silence: a new row.
    let mut reused = routed(5, EnvelopeState::Queued);
    reused.update_digest = "digest of another update".into();
    // A re-poll of the first one (new trace id, same id and digest), twice in one batch.
    let repoll = [routed(5, EnvelopeState::Queued), reused.clone(), routed(5, EnvelopeState::Queued)];
    let inserted = ledger.record_batch(1, 6, &repoll).await.unwrap();
    assert_eq!(
        inserted.iter().map(|r| r.envelope.trace_id.as_str()).collect::<Vec<_>>(),
        [reused.envelope.trace_id.as_str()]
    );
    let all = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.iter().map(|e| e.update_id).collect::<Vec<_>>(), [Some(5), Some(5)]);
}

pub(crate) async fn quotes_find_the_user_message_or_the_answered_envelope_in_the_transaction_that_records_them<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let answered = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let sent = ledger.begin_attempt(&one_part_reply(answered.id)).await.unwrap().unwrap();
    ledger.finish_attempt(&sent, &AttemptOutcome::Sent { message_id: 500 }, "agent:orch").await.unwrap();

    // Message 3 quotes message 2 of the same batch; 4 the user's message 1; 5 the bot's
    // answer to it; 6 a message switchboard never saw.
    let batch =
        [routed(2, EnvelopeState::Queued), quoting(3, 2), quoting(4, 1), quoting(5, 500), quoting(6, 9)];
    ledger.record_batch(1, 7, &batch).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    let quoted_trace = |update_id: i64| {
        let row = rows.iter().find(|row| row.update_id == Some(update_id)).unwrap();
        row.task_meta().get("reply_to_trace_id").map(|trace| TraceId::parse(trace).unwrap())
    };
    let trace_of =
        |update_id: i64| rows.iter().find(|row| row.update_id == Some(update_id)).unwrap().trace_id.clone();
    assert_eq!(quoted_trace(3), Some(trace_of(2)));
    assert_eq!(quoted_trace(4), Some(answered.trace_id.clone()));
    assert_eq!(quoted_trace(5), Some(answered.trace_id.clone()));
    assert_eq!(quoted_trace(6), None);
    let unknown = rows.iter().find(|row| row.update_id == Some(6)).unwrap().task_meta();
    assert_eq!(unknown.get("reply_to_message_id").map(String::as_str), Some("9"));
}

/// An album's items recorded as not addressed to the bot join it once an item of it is
/// addressed (`rules::albums`), in a later batch or an earlier one: queued for that item's
/// agent under its task, with the move audited, reported, and handed over with the batch.
/// Nothing else moves: another album, another chat, another route, an item sent too far
/// apart, a row ignored for another reason.
pub(crate) async fn album_items_said_to_nobody_join_their_album_once_an_item_is_addressed<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    let state_of = |rows: &[StoredEnvelope], update_id: i64| {
        let row = rows.iter().find(|e| e.update_id == Some(update_id)).expect("recorded");
        (row.state, row.agent.clone(), row.task_id.clone(), row.revision)
    };
    // A linked channel's post copied into the group: ignored, under no route.
    let mut copied_post = album_item(3, "g1", false);
    copied_post.route = None;
    let early = [album_item(1, "g1", false), album_item(2, "g2", false), copied_post];
    let recorded = ledger.record_batch_handing_over(1, 4, &early, &[&orch], None).await.unwrap();
    assert!(recorded.joined.is_empty() && recorded.claimed.is_empty(), "{recorded:?}");

    // The caption comes in a pushed batch of its own (a webhook delivery).
    let caption = [album_item(4, "g1", true)];
    let recorded = ledger.record_pushed_batch(&caption, &[], &[&orch], None).await.unwrap();
    assert_eq!(
        recorded.joined,
        [JoinedAlbum { trace_id: early[0].envelope.trace_id.clone(), agent: "orch".into() }]
    );
    let handed: Vec<_> = recorded.claimed.iter().map(|e| e.update_id).collect();
    assert_eq!(handed, [Some(1), Some(4)], "handed over with the caption, oldest first");
    let rows = ledger.list(&ListFilter { limit: 20, ..Default::default() }).await.unwrap();
    let (_, _, task, revision) = state_of(&rows, 4);
    assert!(task.is_some(), "the caption's message is work under a task");
    assert_eq!(state_of(&rows, 1), (EnvelopeState::Pending, Some("orch".into()), task.clone(), revision));
    assert_eq!(state_of(&rows, 2), (EnvelopeState::Ignored, None, None, None), "another album");
    assert_eq!(state_of(&rows, 3), (EnvelopeState::Ignored, None, None, None), "ignored for another reason");
    let joined_id = rows.iter().find(|e| e.update_id == Some(1)).unwrap().id;
    let events = ledger.events_for(joined_id).await.unwrap();
    let moved: Vec<_> =
        events.iter().map(|e| (e.from_state.as_str(), e.to_state.as_str(), e.actor.as_str())).collect();
    assert_eq!(moved, [("ignored", "queued", "daemon")], "{events:?}");
    assert!(events[0].reason.as_deref().unwrap_or_default().contains("g1"), "{events:?}");

    // Items after the caption, in a later polled batch: the one of the album joins it at
    // once; one sent an hour before, in another chat or under another route does not.
    let mut long_before = album_item(6, "g1", false);
    long_before.envelope.sent_at -= chrono::TimeDelta::hours(1);
    let mut other_chat = album_item(7, "g1", false);
    other_chat.envelope.channel.chat_id = 43;
    let mut other_route = album_item(8, "g1", false);
    other_route.route = Some(crate::ids::RouteName::parse("elsewhere").unwrap());
    let late = [album_item(5, "g1", false), long_before, other_chat, other_route];
    let recorded = ledger.record_batch(1, 9, &late).await.unwrap();
    assert_eq!(recorded.len(), 4);
    let rows = ledger.list(&ListFilter { limit: 20, ..Default::default() }).await.unwrap();
    assert_eq!(state_of(&rows, 5), (EnvelopeState::Queued, Some("orch".into()), task, revision));
    for update_id in [6, 7, 8] {
        assert_eq!(state_of(&rows, update_id).0, EnvelopeState::Ignored, "update {update_id}");
    }
    // A re-poll of the batch stores nothing and moves nothing again.
    let again = ledger.record_batch_handing_over(1, 9, &late, &[], None).await.unwrap();
    assert!(again.inserted.is_empty() && again.joined.is_empty(), "{again:?}");
}
