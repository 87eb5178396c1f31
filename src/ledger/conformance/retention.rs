//! Retention (DESIGN §17): a prune removes only what finished before its cut-off and
//! nothing work, an operator or an open task still needs; a dry run counts the same and
//! deletes nothing.

use chrono::{Duration, Utc};

use crate::ids::{AgentName, TraceId};
use crate::ledger::conformance::Backend;
use crate::ledger::conformance::fixtures::*;
use crate::ledger::*;

pub(crate) async fn a_prune_removes_only_what_finished_before_the_cut_off_and_a_dry_run_deletes_nothing<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    // Under an open task: answered, and still kept for the task.
    let in_task = one_pending_message(&*ledger).await;
    assert!(in_task.task_id.is_some());
    let sent = |message_id| AttemptOutcome::Sent { message_id };
    let answer = ledger.begin_attempt(&one_part_reply(in_task.id)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &sent(100), "agent:orch").await.unwrap();

    let batch = [
        routed(2, EnvelopeState::Ignored),
        routed(3, EnvelopeState::Pending),
        routed(4, EnvelopeState::Pending),
        routed(5, EnvelopeState::Pending),
        routed(6, EnvelopeState::Pending),
    ];
    ledger.record_batch(1, 7, &batch).await.unwrap();
    let mut rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    rows.sort_by_key(|row| row.id);
    let [_, ignored, answered, pending, unresolved, newest] = &rows[..] else {
        panic!("six envelopes, found {rows:?}")
    };
    assert_eq!(answered.task_id, None, "only the first message is under a task");
    for (row, message_id) in [(answered, 101), (newest, 102)] {
        let attempt = ledger.begin_attempt(&one_part_reply(row.id)).await.unwrap().unwrap();
        ledger.finish_attempt(&attempt, &sent(message_id), "agent:orch").await.unwrap();
    }
    let lost = ledger.begin_attempt(&one_part_reply(unresolved.id)).await.unwrap().unwrap();
    ledger
        .finish_attempt(&lost, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
        .await
        .unwrap();
    let state = |trace: TraceId| {
        let ledger = ledger.clone();
        async move { ledger.find(&trace).await.unwrap().map(|row| row.state) }
    };
    assert_eq!(state(unresolved.trace_id.clone()).await, Some(EnvelopeState::Unresolved));

    // Everything finished after a cut-off an hour ago.
    let early = ledger.prune(Utc::now() - Duration::hours(1), false).await.unwrap();
    assert_eq!(early.removed, Pruned::default(), "nothing finished before the cut-off");

    let cutoff = Utc::now() + Duration::seconds(1);
    let dry = ledger.prune(cutoff, true).await.unwrap();
    assert_eq!((dry.removed.envelopes, dry.removed.attempts), (2, 1), "{:?}", dry.removed);
    assert_eq!(ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap().len(), 6, "dry");
    assert_eq!(ledger.attempts_for(answered.id).await.unwrap().len(), 1, "a dry run deletes no attempt");

    let real = ledger.prune(cutoff, false).await.unwrap();
    assert_eq!(real.removed, dry.removed, "the dry run counted what the real one removes");
    assert_eq!(state(ignored.trace_id.clone()).await, None);
    assert_eq!(state(answered.trace_id.clone()).await, None);
    assert!(ledger.attempts_for(answered.id).await.unwrap().is_empty(), "its attempt went with it");
    assert_eq!(state(in_task.trace_id.clone()).await, Some(EnvelopeState::Acked), "its task is open");
    assert_eq!(state(pending.trace_id.clone()).await, Some(EnvelopeState::Pending));
    assert_eq!(state(unresolved.trace_id.clone()).await, Some(EnvelopeState::Unresolved));
    assert_eq!(ledger.attempts_for(unresolved.id).await.unwrap()[0].outcome, AttemptState::Unknown);
    assert_eq!(state(newest.trace_id.clone()).await, Some(EnvelopeState::Acked), "the newest stays");
    assert_eq!(ledger.unreconciled_attempts().await.unwrap(), 1);

    // Nothing is left that may go.
    assert_eq!(ledger.prune(cutoff, true).await.unwrap().removed, Pruned::default());
    assert_eq!(ledger.prune(cutoff, false).await.unwrap().removed, Pruned::default());
}

/// A follow-up whose send is unknown keeps even an answered envelope, until it is
/// reconciled: an operator may still need it.
pub(crate) async fn an_unreconciled_follow_up_keeps_its_answered_envelope_until_reconciled<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger
        .record_batch(1, 3, &[routed(1, EnvelopeState::Pending), routed(2, EnvelopeState::Pending)])
        .await
        .unwrap();
    let mut rows = ledger.list(&ListFilter { limit: 2, ..Default::default() }).await.unwrap();
    rows.sort_by_key(|row| row.id);
    let answer =
        ledger.begin_attempt(&reply_attempt(rows[0].id, "req_aaaaaaaa", 0, 1)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &AttemptOutcome::Sent { message_id: 9 }, "agent:orch").await.unwrap();
    let follow_up =
        ledger.begin_attempt(&reply_attempt(rows[0].id, "req_bbbbbbbb", 0, 1)).await.unwrap().unwrap();
    ledger
        .finish_attempt(&follow_up, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
        .await
        .unwrap();
    // The newest envelope, answered last, keeps the newest attempt and event away from rows[0].
    let last = ledger.begin_attempt(&one_part_reply(rows[1].id)).await.unwrap().unwrap();
    ledger.finish_attempt(&last, &AttemptOutcome::Sent { message_id: 10 }, "agent:orch").await.unwrap();
    assert_eq!(ledger.find(&rows[0].trace_id).await.unwrap().unwrap().state, EnvelopeState::Acked);

    let cutoff = || Utc::now() + Duration::seconds(1);
    assert_eq!(ledger.prune(cutoff(), false).await.unwrap().removed.envelopes, 0);
    assert!(ledger.find(&rows[0].trace_id).await.unwrap().is_some());

    ledger.reconcile(&rows[0].trace_id, Reconciliation::Delivered, "seen in the chat").await.unwrap();
    let pruned = ledger.prune(cutoff(), false).await.unwrap().removed;
    assert_eq!((pruned.envelopes, pruned.attempts), (1, 2));
    assert_eq!(ledger.find(&rows[0].trace_id).await.unwrap(), None);
}

/// A task whose work is all answered is done (DESIGN §11), though it is marked so only when
/// its conversation's next message comes: a one-off conversation's task, answered before
/// the cut-off, goes with its envelope and attempt.
pub(crate) async fn a_conversations_last_task_goes_once_answered_before_the_cut_off<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let one_off = one_pending_message(&*ledger).await;
    assert!(one_off.task_id.is_some());
    let answer = ledger.begin_attempt(&one_part_reply(one_off.id)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &AttemptOutcome::Sent { message_id: 100 }, "agent:orch").await.unwrap();
    // Another conversation's, answered later: the newest task, envelope and attempt stay.
    let orch = AgentName::parse("orch").unwrap();
    let later = [in_chat(2, 43, "another question")];
    ledger.record_batch_handing_over(2, 3, &later, &[&orch], None).await.unwrap();
    let newest = ledger.pending(&orch).await.unwrap().remove(0);
    assert!(newest.task_id.is_some() && newest.task_id != one_off.task_id);
    let answer = ledger.begin_attempt(&one_part_reply(newest.id)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &AttemptOutcome::Sent { message_id: 101 }, "agent:orch").await.unwrap();

    let pruned = ledger.prune(Utc::now() + Duration::seconds(1), false).await.unwrap().removed;
    assert_eq!((pruned.tasks, pruned.envelopes, pruned.attempts), (1, 1, 1), "{pruned:?}");
    assert_eq!(ledger.find(&one_off.trace_id).await.unwrap(), None);
    assert!(ledger.find(&newest.trace_id).await.unwrap().is_some(), "the newest stays");
}

/// A permission request goes once answered or expired, its prompt showing so and its
/// verdict (if any) handed by the asking plugin; an operator's question once answered
/// and its prompt showing so. Anything still owed keeps its row.
pub(crate) async fn a_finished_permission_request_or_question_goes_and_one_still_owing_anything_stays<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    const LATER: &str = "2999-01-01T00:00:00.000Z";
    const PAST: &str = "2000-01-01T00:00:00.000Z";
    for (id, expires_at) in [
        ("prm_done", LATER),
        ("prm_verdict_owed", LATER),
        ("prm_prompt_unsettled", LATER),
        ("prm_pending", LATER),
        ("prm_expired", PAST),
    ] {
        ledger.record_permission_request(&permission_request(id, id, expires_at)).await.unwrap();
        ledger.finish_prompt_send(id, &AttemptOutcome::Sent { message_id: 1 }).await.unwrap();
    }
    for id in ["prm_done", "prm_verdict_owed", "prm_prompt_unsettled"] {
        ledger.answer_permission(id, PermissionVerdict::Allow, 7, "ann").await.unwrap();
    }
    assert_eq!(ledger.expire_due_permissions(Utc::now()).await.unwrap().len(), 1);
    for id in ["prm_done", "prm_verdict_owed", "prm_expired"] {
        ledger.settle_prompt(id).await.unwrap();
    }
    for id in ["prm_done", "prm_prompt_unsettled"] {
        ledger.verdict_sent(id).await.unwrap();
        assert!(ledger.verdict_handed(id, id).await.unwrap());
    }

    let batch: Vec<_> = (1..=4).map(|update_id| routed(update_id, EnvelopeState::Pending)).collect();
    ledger.record_batch(1, 5, &batch).await.unwrap();
    let mut rows = ledger.list(&ListFilter { limit: 4, ..Default::default() }).await.unwrap();
    rows.sort_by_key(|row| row.id);
    for row in &rows[..3] {
        let lost = ledger.begin_attempt(&one_part_reply(row.id)).await.unwrap().unwrap();
        ledger
            .finish_attempt(&lost, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
            .await
            .unwrap();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let new_id = move || format!("qst_{}", next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut asked = ledger.record_new_questions(7, None, &new_id).await.unwrap();
    asked.sort_by_key(|question| question.envelope_id);
    let [settled, unsettled, open] = &asked[..] else { panic!("three questions, asked {asked:?}") };
    for question in [settled, unsettled] {
        ledger.finish_question_send(&question.id, &AttemptOutcome::Sent { message_id: 2 }).await.unwrap();
        ledger.answer_question(question, Reconciliation::Delivered, 7, "ann").await.unwrap();
    }
    ledger.settle_question_prompt(&settled.id).await.unwrap();

    let cutoff = Utc::now() + Duration::seconds(1);
    assert_eq!(
        ledger.prune(Utc::now() - Duration::hours(1), false).await.unwrap().removed,
        Pruned::default()
    );
    let dry = ledger.prune(cutoff, true).await.unwrap().removed;
    assert_eq!((dry.permission_requests, dry.operator_questions), (2, 1), "{dry:?}");
    let pruned = ledger.prune(cutoff, false).await.unwrap().removed;
    assert_eq!((pruned.permission_requests, pruned.operator_questions), (2, 1), "{pruned:?}");
    let mut kept: Vec<String> =
        ledger.list_permissions(10).await.unwrap().into_iter().map(|request| request.id).collect();
    kept.sort();
    assert_eq!(kept, ["prm_pending", "prm_prompt_unsettled", "prm_verdict_owed"]);
    assert_eq!(ledger.question(&settled.id).await.unwrap(), None);
    assert!(ledger.question(&unsettled.id).await.unwrap().is_some(), "its prompt is still to be edited");
    assert!(ledger.question(&open.id).await.unwrap().is_some(), "unanswered");
}

/// A verdict is owed to its plugin until the plugin confirms it handed it to Claude Code,
/// not merely once it was written to a stream: one written to a stream already dead is
/// written again when that plugin comes back, however long it stays away. Such a request
/// stays past the cut-off; one whose verdict was handed goes.
pub(crate) async fn a_verdict_written_but_not_handed_stays_until_its_plugin_confirms_it<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    for id in ["prm_handed", "prm_owed"] {
        ledger
            .record_permission_request(&permission_request(id, id, "2999-01-01T00:00:00.000Z"))
            .await
            .unwrap();
        ledger.finish_prompt_send(id, &AttemptOutcome::Sent { message_id: 1 }).await.unwrap();
        ledger.answer_permission(id, PermissionVerdict::Allow, 7, "ann").await.unwrap();
        ledger.settle_prompt(id).await.unwrap();
        ledger.verdict_sent(id).await.unwrap();
    }
    assert!(ledger.verdict_handed("prm_handed", "prm_handed").await.unwrap());
    // A newer row elsewhere, so neither request is kept as its table's newest.
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();

    let cutoff = Utc::now() + Duration::seconds(1);
    let dry = ledger.prune(cutoff, true).await.unwrap().removed;
    let pruned = ledger.prune(cutoff, false).await.unwrap().removed;
    assert_eq!((dry.permission_requests, pruned.permission_requests), (1, 1), "{pruned:?}");
    let kept: Vec<String> =
        ledger.list_permissions(10).await.unwrap().into_iter().map(|request| request.id).collect();
    assert_eq!(kept, ["prm_owed"], "the verdict not handed is kept");
    let owed = ledger.undelivered_verdicts("prm_owed").await.unwrap();
    assert_eq!(owed.len(), 1, "and still written again when its plugin comes back");
}

/// A reaction (or an edit) on a message answered before the cut-off is fresh history: the
/// envelope it was made on stays for a full period from it.
pub(crate) async fn a_reaction_on_an_old_answered_message_keeps_it_for_a_full_period<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let batch = [routed(1, EnvelopeState::Pending), routed(2, EnvelopeState::Pending)];
    ledger.record_batch(1, 3, &batch).await.unwrap();
    let mut rows = ledger.list(&ListFilter { limit: 2, ..Default::default() }).await.unwrap();
    rows.sort_by_key(|row| row.id);
    let sent = |message_id| AttemptOutcome::Sent { message_id };
    let answer = ledger.begin_attempt(&one_part_reply(rows[0].id)).await.unwrap().unwrap();
    ledger.finish_attempt(&answer, &sent(100), "agent:orch").await.unwrap();
    // The cut-off falls between the answer and the reaction: the ledger's clock is read in
    // milliseconds, so the two are a few apart.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let cutoff = Utc::now();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let reacted = ledger.begin_attempt(&reaction(rows[0].id, "req_react1", 100)).await.unwrap().unwrap();
    ledger.finish_attempt(&reacted, &sent(100), "agent:orch").await.unwrap();
    // The newest attempt is elsewhere.
    let last = ledger.begin_attempt(&one_part_reply(rows[1].id)).await.unwrap().unwrap();
    ledger.finish_attempt(&last, &sent(101), "agent:orch").await.unwrap();

    assert_eq!(ledger.prune(cutoff, false).await.unwrap().removed, Pruned::default());
    assert_eq!(ledger.attempts_for(rows[0].id).await.unwrap().len(), 2, "the answer and the reaction");
}

/// Reactions done before the cut-off go, all but the newest (an id the ledger could hand
/// out again otherwise); the search for them holds the writer like any batch, and is
/// counted so, though nothing else was due.
pub(crate) async fn done_reactions_go_but_the_newest_and_their_search_is_a_batch<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    // On no message the bot sent: kept for audit only.
    let reactions = [reaction_on(1, 1, &["👍"]), reaction_on(2, 1, &["🔥"]), reaction_on(3, 1, &[])];
    ledger.record_batch_with_reactions(1, 4, &[], &reactions, &[], None).await.unwrap();
    let stored = |ledger: Ledger| async move {
        ledger.reactions_recorded().await.unwrap().into_iter().map(|r| r.emoji).collect::<Vec<_>>()
    };
    assert_eq!(stored(ledger.clone()).await, ["👍", "🔥", ""]);

    let cutoff = Utc::now() + Duration::seconds(1);
    assert_eq!(ledger.prune(cutoff, true).await.unwrap().removed.reactions, 2, "the dry run counts the same");
    let report = ledger.prune(cutoff, false).await.unwrap();
    assert_eq!(report.removed, Pruned { reactions: 2, ..Pruned::default() });
    assert_eq!(stored(ledger.clone()).await, [""], "the newest stays");
    assert!(!report.batch_holds.is_empty(), "the reactions' batch held the writer: {report:?}");
    assert!(report.longest_batch >= *report.batch_holds.iter().max().unwrap());

    let again = ledger.prune(cutoff, false).await.unwrap();
    assert_eq!(again.removed, Pruned::default());
    assert!(!again.batch_holds.is_empty(), "a search that finds nothing held the writer too");
}
