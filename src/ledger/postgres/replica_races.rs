//! Two replicas on one ledger doing the same thing at the same moment: of what SQLite's one
//! writer serialises, exactly one wins here too. Each test connects two `PgLedger`s (two
//! pools, as two daemons have) to a fresh schema and races them, many rounds, on a runtime
//! with two workers so the statements really interleave.

use super::PgLedger;
use super::test_support::TestSchema;
use crate::ledger::prelude::*;
use crate::ledger::{AnswerRecorded, NewPermissionRequest, PermissionState, PermissionVerdict};

/// How many times each race is run: enough for the two transactions to overlap in some
/// rounds on a loaded machine, few enough to finish in a second or two.
const ROUNDS: usize = 20;

/// Two replicas on a fresh schema.
async fn two_replicas() -> (TestSchema, PgLedger, PgLedger) {
    let schema = TestSchema::create().await;
    let one = PgLedger::connect(&schema.url).await.unwrap();
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
