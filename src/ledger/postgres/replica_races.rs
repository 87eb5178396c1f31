//! Two replicas on one ledger doing the same thing at the same moment: of what SQLite's one
//! writer serialises, exactly one wins here too. Each test connects two `PgLedger`s (two
//! pools, as two daemons have) to a fresh schema and races them, many rounds, on a runtime
//! with two workers so the statements really interleave.

use super::PgLedger;
use super::test_support::TestSchema;
use crate::ids::TraceId;
use crate::ledger::conformance::fixtures::{one_part_reply, routed};
use crate::ledger::prelude::*;
use crate::ledger::{
    AnswerRecorded, AttemptOutcome, EnvelopeState, ListFilter, NewPermissionRequest, PermissionState,
    PermissionVerdict, ReconcileError, ReconciledOutcome, Reconciliation, StoredEnvelope,
};

/// How many times each race is run: enough for the two transactions to overlap in some
/// rounds on a loaded machine, few enough to finish in a second or two.
const ROUNDS: usize = 20;

/// Two replicas on a fresh schema; the first leads the polling of the rules' bots, so it
/// can record batches.
async fn two_replicas() -> (TestSchema, PgLedger, PgLedger) {
    let schema = TestSchema::create().await;
    let one = PgLedger::connect(&schema.url).await.unwrap();
    super::conformance::lead_the_rules_bots(&one).await;
    let two = PgLedger::connect(&schema.url).await.unwrap();
    (schema, one, two)
}

async fn close(schema: TestSchema, one: PgLedger, two: PgLedger) {
    one.close().await;
    two.close().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_answering_one_permission_request_at_once_record_one_verdict() {
    let (schema, one, two) = two_replicas().await;
    for round in 0..ROUNDS {
        let (id, request_id) = (format!("prm_{round}"), format!("req{round}"));
        let new = NewPermissionRequest {
            id: &id,
            agent: "orchestrator",
            session_id: "ses_1",
            plugin_id: "plg_a",
            request_id: &request_id,
            tool_name: "Bash",
            description: "run ls",
            input_preview: "{}",
            expires_at: "2999-01-01T00:00:00.000Z",
            route: "dm",
            chat_id: 42,
            thread_id: None,
        };
        one.record_permission_request(&new).await.unwrap();
        let (allowed, denied) = tokio::join!(
            one.answer_permission(&id, PermissionVerdict::Allow, 7, "ann"),
            two.answer_permission(&id, PermissionVerdict::Deny, 8, "bob")
        );
        let (winner, loser) = match (allowed.unwrap(), denied.unwrap()) {
            (AnswerRecorded::Recorded(won), AnswerRecorded::TooLate(lost))
            | (AnswerRecorded::TooLate(lost), AnswerRecorded::Recorded(won)) => (won, lost),
            other => panic!("round {round}: exactly one verdict is recorded, got {other:?}"),
        };
        assert_ne!(winner.state, PermissionState::Pending);
        assert_eq!(loser.state, winner.state, "round {round}: the loser reads the winner's verdict");
        let stored = two.permission(&id).await.unwrap().unwrap();
        assert_eq!((stored.state, stored.answered_by), (winner.state, winner.answered_by));
    }
    close(schema, one, two).await;
}

/// Records `count` pending envelopes through `ledger` (the polling leader), each with a reply whose send was
/// lost: unresolved.
async fn unresolved_envelopes(ledger: &PgLedger, first_update: i64, count: i64) -> Vec<StoredEnvelope> {
    let updates = first_update..first_update + count;
    let batch: Vec<_> = updates.map(|update_id| routed(update_id, EnvelopeState::Pending)).collect();
    ledger.record_batch(1, first_update + count, &batch).await.unwrap();
    let mut rows = ledger.list(&ListFilter { limit: count, ..Default::default() }).await.unwrap();
    rows.sort_by_key(|row| row.id);
    for row in &rows {
        let lost = ledger.begin_attempt(&one_part_reply(row.id)).await.unwrap().unwrap();
        let outcome = AttemptOutcome::Unknown { error: "timeout".into() };
        ledger.finish_attempt(&lost, &outcome, "agent:orch").await.unwrap();
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_asking_at_once_ask_once_about_each_unresolved_send() {
    let (schema, one, two) = two_replicas().await;
    for round in 0..ROUNDS as i64 {
        let envelopes = unresolved_envelopes(&one, 1 + 3 * round, 3).await;
        let (asked_by_one, asked_by_two) = tokio::join!(
            one.record_new_questions(7, None, &move || format!("qst_one_{}", TraceId::generate())),
            two.record_new_questions(7, None, &move || format!("qst_two_{}", TraceId::generate()))
        );
        let mut asked: Vec<i64> =
            asked_by_one.unwrap().into_iter().chain(asked_by_two.unwrap()).map(|q| q.envelope_id).collect();
        asked.sort();
        let expected: Vec<i64> = envelopes.iter().map(|e| e.id).collect();
        assert_eq!(asked, expected, "round {round}: each envelope is asked about once, by one replica");
    }
    close(schema, one, two).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_reconciling_one_envelope_at_once_settle_it_once() {
    let (schema, one, two) = two_replicas().await;
    for round in 0..ROUNDS as i64 {
        let envelope = unresolved_envelopes(&one, 1 + round, 1).await.remove(0);
        let (delivered, not_delivered) = tokio::join!(
            one.reconcile(&envelope.trace_id, Reconciliation::Delivered, "seen in the chat"),
            two.reconcile(&envelope.trace_id, Reconciliation::NotDelivered, "not in the chat")
        );
        let settled = match (delivered, not_delivered) {
            (Ok(state), Err(ReconcileError::NothingToReconcile { .. }))
            | (Err(ReconcileError::NothingToReconcile { .. }), Ok(state)) => state,
            other => panic!("round {round}: exactly one reconciliation is made, got {other:?}"),
        };
        assert_eq!(two.find(&envelope.trace_id).await.unwrap().unwrap().state, settled);
        let attempts = one.attempts_for(envelope.id).await.unwrap();
        let expected = match settled {
            EnvelopeState::Acked => ReconciledOutcome::Sent,
            _ => ReconciledOutcome::NotSent,
        };
        assert_eq!(attempts[0].reconciled_outcome, Some(expected), "round {round}: the winner's finding");
    }
    close(schema, one, two).await;
}

/// Two replicas taking in a message of one conversation at the same moment (two webhook
/// deliveries, say): the conversation gets one task, which both messages belong to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_taking_in_one_conversation_at_once_start_one_task() {
    let (schema, one, two) = two_replicas().await;
    for round in 0..ROUNDS as i64 {
        let in_chat = |update_id: i64| {
            let mut message = routed(update_id, EnvelopeState::Queued);
            message.envelope.channel.chat_id = 1_000 + round;
            message
        };
        let (first, second) = ([in_chat(2 * round + 1)], [in_chat(2 * round + 2)]);
        let (a, b) = tokio::join!(
            one.record_pushed_batch(&first, &[], &[], None),
            two.record_pushed_batch(&second, &[], &[], None)
        );
        assert_eq!((a.unwrap().inserted.len(), b.unwrap().inserted.len()), (1, 1));
        let first = one.find(&first[0].envelope.trace_id).await.unwrap().unwrap();
        let second = one.find(&second[0].envelope.trace_id).await.unwrap().unwrap();
        assert!(first.task_id.is_some(), "round {round}: a message is work of a task");
        assert_eq!(first.task_id, second.task_id, "round {round}: one conversation, one task");
    }
    close(schema, one, two).await;
}

/// Two replicas taking in two photos of one album at the same moment (two webhook
/// deliveries): the one whose caption mentions the bot, and one said to nobody. Whichever
/// commits first, the other finds it: the album reaches the agent whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_taking_in_one_album_at_once_hand_the_agent_all_of_it() {
    use crate::ledger::conformance::fixtures::album_item;
    let (schema, one, two) = two_replicas().await;
    for round in 0..ROUNDS as i64 {
        let group = format!("album-{round}");
        let (said, unsaid) =
            ([album_item(2 * round + 1, &group, true)], [album_item(2 * round + 2, &group, false)]);
        let (a, b) = tokio::join!(
            one.record_pushed_batch(&said, &[], &[], None),
            two.record_pushed_batch(&unsaid, &[], &[], None)
        );
        assert_eq!((a.unwrap().inserted.len(), b.unwrap().inserted.len()), (1, 1));
        let photo = one.find(&unsaid[0].envelope.trace_id).await.unwrap().unwrap();
        assert_eq!(
            (photo.state, photo.agent.as_deref()),
            (EnvelopeState::Queued, Some("orch")),
            "round {round}: the photo said to nobody joins its album"
        );
    }
    close(schema, one, two).await;
}
