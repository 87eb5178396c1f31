use super::*;
use crate::ledger::prelude::*;
use crate::rules::guard::Intent;
use crate::rules::revisions::TaskState;
use chrono::Utc;

use crate::ids::{AgentName, RouteName, TraceId};
use crate::ledger::EnvelopeState;
use crate::rules::routes::Channel;
use crate::telegram::envelope::{ChatType, Envelope, EnvelopeKind, Sender};

/// A read on the ledger's own connections (the idle writer serves it), as the ledger's reads
/// run: what the writer sees and how it is set up.
async fn read<T>(
    ledger: &SqliteLedger,
    sql: &str,
    row: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> T {
    ledger.read_in_place(|db| db.query_row(sql, [], &row)).await.unwrap()
}

async fn ledger() -> (tempfile::TempDir, SqliteLedger) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = SqliteLedger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
    (dir, ledger)
}

fn routed(update_id: i64, state: EnvelopeState) -> RoutedEnvelope {
    RoutedEnvelope {
        envelope: Envelope {
            trace_id: TraceId::generate(),
            update_id,
            kind: EnvelopeKind::Message,
            channel: Channel { chat_id: 42, thread_id: None },
            chat_type: ChatType::Private,
            chat_title: Some("Ann".into()),
            message_id: update_id as i32,
            sender: Sender { id: Some(42), username: Some("ann".into()), name: "Ann".into() },
            text: Some(format!("message {update_id}")),
            attachments: vec![],
            described: None,
            context: Default::default(),
            sent_at: Utc::now(),
        },
        state,
        route: Some(RouteName::parse("dm").unwrap()),
        agent: Some(AgentName::parse("orch").unwrap()),
        update_digest: format!("digest of update {update_id}"),
        note: None,
        raw_update: None,
    }
}

#[tokio::test]
async fn the_database_uses_wal_and_the_configured_durability() {
    for (setting, expected) in [(Synchronous::Normal, 1), (Synchronous::Full, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("ledger.db"), setting).await.unwrap();
        let mode: String = read(&ledger, "PRAGMA journal_mode", |row| row.get(0)).await;
        assert_eq!(mode, "wal");
        let sync: i64 = read(&ledger, "PRAGMA synchronous", |row| row.get(0)).await;
        assert_eq!(sync, expected, "{setting:?}");
    }
}

#[tokio::test]
async fn a_batch_handed_over_is_pending_when_committed_with_the_older_queued_envelopes_first() {
    let (_dir, ledger) = ledger().await;
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

#[tokio::test]
async fn commits_reach_the_database_file_a_moment_later_without_waiting_for_a_full_wal() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&database, Synchronous::Normal).await.unwrap();
    let backstop: i64 = read(&ledger, "PRAGMA wal_autocheckpoint", |row| row.get(0)).await;
    assert_eq!(backstop, i64::from(checkpoint::BACKSTOP_PAGES));
    let size = || std::fs::metadata(&database).unwrap().len();
    // The migrations' own commits are checkpointed first.
    tokio::time::sleep(3 * checkpoint::CHECKPOINT_DELAY).await;
    let before = size();
    // Far fewer pages than the backstop: only the checkpointer moves them into the file.
    let batch: Vec<_> = (1..=300).map(|id| routed(id, EnvelopeState::Queued)).collect();
    ledger.record_batch(1, 301, &batch).await.unwrap();
    let deadline = std::time::Instant::now() + 20 * checkpoint::CHECKPOINT_DELAY;
    while size() == before {
        assert!(std::time::Instant::now() < deadline, "no checkpoint after the commit");
        tokio::time::sleep(checkpoint::CHECKPOINT_DELAY / 4).await;
    }
    ledger.close().await;
}

#[tokio::test]
async fn the_database_and_its_wal_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&database, Synchronous::Normal).await.unwrap();
    // A write makes sure SQLite has created the -wal and -shm files.
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Queued)]).await.unwrap();
    for path in files::database_files(&database) {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, files::PRIVATE_MODE, "{} has mode {mode:o}", path.display());
    }
    ledger.close().await;
}

#[tokio::test]
async fn open_existing_refuses_a_missing_database_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("mistyped.db");
    assert!(SqliteLedger::open_existing(&database, Synchronous::Normal).await.is_err());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was created");

    SqliteLedger::open(&database, Synchronous::Normal).await.unwrap().close().await;
    SqliteLedger::open_existing(&database, Synchronous::Normal).await.unwrap().close().await;
}

#[tokio::test]
async fn a_batch_and_its_offset_commit_together_and_replays_are_skipped() {
    let (_dir, ledger) = ledger().await;
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

#[tokio::test]
async fn claims_go_oldest_first_and_redelivery_counts() {
    let (_dir, ledger) = ledger().await;
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

#[tokio::test]
async fn transitions_only_from_allowed_states_and_are_audited() {
    let (_dir, ledger) = ledger().await;
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

#[tokio::test]
async fn finishing_an_attempt_settles_its_envelope_in_the_same_step() {
    let (_dir, ledger) = ledger().await;
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
    let state = |trace: String| {
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

#[tokio::test]
async fn in_flight_attempts_become_unknown_at_start_up_and_can_be_reconciled() {
    let (_dir, ledger) = ledger().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let attempt = NewAttempt { reply_to_message_id: Some(1), text: "hi", ..one_part_reply(e.id) };
    ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);
    assert_eq!(ledger.recover_in_flight().await.unwrap(), std::slice::from_ref(&e.trace_id));
    assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Unresolved);
    assert_eq!(ledger.attempts_for(e.id).await.unwrap()[0].outcome, AttemptState::Unknown);

    let state = ledger.reconcile(&e.trace_id, Reconciliation::NotDelivered, "not in the chat").await.unwrap();
    assert_eq!(state, EnvelopeState::Pending);
    let attempts = ledger.attempts_for(e.id).await.unwrap();
    assert_eq!(attempts[0].reconciled_outcome, Some(ReconciledOutcome::NotSent));
    assert!(attempts[0].reconciled_reason.as_deref().unwrap().contains("not in the chat"));
    assert!(matches!(
        ledger.reconcile(&e.trace_id, Reconciliation::Delivered, "again").await,
        Err(ReconcileError::NotUnresolved { .. })
    ));
}

fn reply_attempt(
    envelope_id: i64,
    request_id: &'static str,
    chunk_index: usize,
    chunk_count: usize,
) -> NewAttempt<'static> {
    NewAttempt {
        request_id: Some(request_id),
        reply_to_message_id: Some(1),
        chunk_index,
        chunk_count,
        text: "part",
        ..one_part_reply(envelope_id)
    }
}

#[tokio::test]
async fn an_answered_envelope_stays_answered_when_a_follow_up_is_unknown_and_reconciles_alone() {
    let (_dir, ledger) = ledger().await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
    let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
    let facts = |found: Option<FoundForReply>| found.map(|f| (f.awaiting_reconciliation, f.replied_before));
    assert_eq!(facts(ledger.find_for_reply(&e.trace_id).await.unwrap()), Some((false, false)));
    assert_eq!(ledger.find_for_reply("env_nonesuchxx").await.unwrap(), None);
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
        Err(ReconcileError::NotUnresolved { .. })
    ));
}

#[tokio::test]
async fn a_reply_request_is_summed_up_from_its_attempts() {
    let (_dir, ledger) = ledger().await;
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

#[tokio::test]
async fn a_reused_update_id_with_new_content_is_stored_and_a_re_poll_is_not() {
    let (_dir, ledger) = ledger().await;
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

#[tokio::test]
async fn audit_rows_keep_their_note_and_raw_update_and_states_kinds_are_stored_by_name() {
    let (_dir, ledger) = ledger().await;
    let mut undecodable = routed(1, EnvelopeState::Undecodable);
    undecodable.envelope.kind = EnvelopeKind::Unknown;
    undecodable.envelope.chat_type = ChatType::Unknown;
    undecodable.note = Some("teloxide cannot read it".into());
    undecodable.raw_update = Some(r#"{"update_id":1,"message":{"text":"\ud800"}}"#.into());
    let mut ignored = routed(2, EnvelopeState::Ignored);
    ignored.note = Some("service message: pinned_message".into());
    ledger.record_batch(1, 3, &[undecodable.clone(), ignored]).await.unwrap();

    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(
        rows.iter().map(|e| e.state).collect::<Vec<_>>(),
        [EnvelopeState::Undecodable, EnvelopeState::Ignored]
    );
    assert_eq!(rows[0].kind, EnvelopeKind::Unknown);
    assert_eq!(rows[1].note.as_deref(), Some("service message: pinned_message"));
    let trace_id = undecodable.envelope.trace_id.as_str();
    assert_eq!(ledger.raw_update(trace_id).await.unwrap(), undecodable.raw_update);
    assert_eq!(ledger.raw_update(&rows[1].trace_id).await.unwrap(), None);
    // The columns hold the names `as_str` gives, which the CLI and SQL filters use.
    let stored: (String, String, String) = ledger
        .read_in_place(|db| {
            db.query_row(
                "SELECT state, kind, chat_type FROM envelopes WHERE trace_id = ?",
                [trace_id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
        })
        .await
        .unwrap();
    assert_eq!(stored, ("undecodable".into(), "unknown".into(), "unknown".into()));
    let filtered = ledger
        .list(&ListFilter { state: Some(EnvelopeState::Ignored), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(filtered.len(), 1);
}

/// A new ledger (in a directory of its own, at the path returned) as a release that had
/// only the migrations up to `version` left it, open on a connection of its own to fill.
fn ledger_migrated_to(version: i64) -> (tempfile::TempDir, std::path::PathBuf, rusqlite::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.pragma_update(None, "foreign_keys", true).unwrap();
    migrations::migrate(&db, Some(version)).unwrap();
    (dir, path, db)
}

#[tokio::test]
async fn the_intake_migration_keeps_every_row_and_reference() {
    // A ledger as the previous release left it: only the first migration applied.
    let (_dir, path, db) = ledger_migrated_to(1);
    db.execute_batch(
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, chat_type, message_id, sender_name, content, \
         sent_at, received_at, state, deliveries, state_changed_at) VALUES \
         ('env_old1', 10, 'message', 42, 'private', 1, 'Ann', 'hi', 't', 't', 'acked', 1, 't'), \
         ('env_old2', 11, 'edited_message', 42, 'private', 1, 'Ann', 'hi!', 't', 't', 'pending', 1, 't'); \
         INSERT INTO attempts (op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, started_at) \
         VALUES ('op_1', 1, 'orch', 42, 0, 1, 'hello', 'sent', 't'); \
         INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) VALUES (1, 't', 'pending', 'acked', 'daemon');",
    )
    .unwrap();
    drop(db);

    let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(
        rows.iter().map(|e| (e.id, e.trace_id.as_str(), e.kind, e.state)).collect::<Vec<_>>(),
        [
            (1, "env_old1", EnvelopeKind::Message, EnvelopeState::Acked),
            (2, "env_old2", EnvelopeKind::EditedMessage, EnvelopeState::Pending)
        ]
    );
    assert_eq!(ledger.attempts_for(1).await.unwrap().len(), 1);
    assert_eq!(ledger.events_for(1).await.unwrap().len(), 1);
    let broken: i64 = read(&ledger, "SELECT count(*) FROM pragma_foreign_key_check", |row| row.get(0)).await;
    assert_eq!(broken, 0, "no reference is broken");
    let fks: i64 = read(&ledger, "PRAGMA foreign_keys", |row| row.get(0)).await;
    assert_eq!(fks, 1, "foreign keys are on again after the rebuild");
    // References still point at `envelopes`, and new rows continue the ids.
    let schema: String =
        read(&ledger, "SELECT sql FROM sqlite_master WHERE name = 'attempts'", |row| row.get(0)).await;
    assert!(schema.contains("REFERENCES envelopes"), "{schema}");
    ledger.record_batch(1, 12, &[routed(11, EnvelopeState::Queued)]).await.unwrap();
    let newest = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap();
    assert_eq!(
        (newest[0].id, newest[0].update_id),
        (3, Some(11)),
        "an old row without a digest never blocks a new one"
    );
}

#[tokio::test]
async fn a_busy_lock_and_a_full_disk_are_congestion_and_other_errors_are_not() {
    let (dir, ledger) = ledger().await;
    let path = dir.path().join("ledger.db");
    // Another connection, as another process's is, without a busy handler.
    let other = || {
        let db = rusqlite::Connection::open(&path).unwrap();
        db.busy_timeout(std::time::Duration::ZERO).unwrap();
        db
    };

    // Another process holds the write lock: SQLITE_BUSY.
    let holder = other();
    holder.execute_batch("BEGIN EXCLUSIVE; UPDATE poller_offsets SET next_offset = 0;").unwrap();
    let busy =
        LedgerError::from(other().execute("INSERT INTO poller_offsets VALUES (1, 1, 't')", []).unwrap_err());
    assert!(matches!(busy, LedgerError::Busy { .. }), "{busy:?}");
    assert_eq!(LedgerCongestion::of(&busy), Some(LedgerCongestion::Busy), "{busy}");
    holder.execute_batch("ROLLBACK").unwrap();

    // No more room: SQLITE_FULL. `max_page_count` caps this one connection's database size.
    let cramped = other();
    let pages: i64 = cramped.query_row("PRAGMA page_count", [], |row| row.get(0)).unwrap();
    cramped.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(())).unwrap();
    let insert_session = "INSERT INTO agent_sessions (id, agent, connected_at) VALUES (?, 'orch', 't')";
    let full = LedgerError::from(cramped.execute(insert_session, ["x".repeat(64 * 1024)]).unwrap_err());
    assert!(matches!(full, LedgerError::DiskFull { .. }), "{full:?}");
    assert_eq!(LedgerCongestion::of(&full), Some(LedgerCongestion::DiskFull), "{full}");
    // Once there is room again, the same write goes through.
    cramped.query_row("PRAGMA max_page_count = 1073741823", [], |_| Ok(())).unwrap();
    cramped.execute(insert_session, ["s"]).unwrap();

    // A constraint violation is a bug, not congestion.
    let first = routed(1, EnvelopeState::Queued);
    ledger.record_batch(1, 2, std::slice::from_ref(&first)).await.unwrap();
    let mut same_trace = routed(2, EnvelopeState::Queued);
    same_trace.envelope.trace_id = first.envelope.trace_id.clone();
    let violation = ledger.record_batch(1, 3, &[same_trace]).await.unwrap_err();
    assert!(matches!(violation, LedgerError::Constraint { .. }), "{violation:?}");
    assert_eq!(LedgerCongestion::of(&violation), None, "{violation}");
    assert_eq!(LedgerCongestion::of(&LedgerError::other("a row that contradicts another")), None);

    // A file that is not a ledger at all.
    let not_a_ledger = dir.path().join("notes.txt");
    std::fs::write(&not_a_ledger, "not a database, but long enough to be read as a header: ".repeat(20))
        .unwrap();
    let corrupt = LedgerError::from(
        rusqlite::Connection::open(&not_a_ledger)
            .unwrap()
            .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get::<_, i64>(0))
            .unwrap_err(),
    );
    assert!(matches!(corrupt, LedgerError::Corrupt { .. }), "{corrupt:?}");
    assert_eq!(LedgerCongestion::of(&corrupt), None, "{corrupt}");
}

#[tokio::test]
async fn a_batch_refused_for_a_full_disk_records_nothing_and_the_next_one_goes_through() {
    let (_dir, ledger) = ledger().await;
    // A page cap on the writer's connection stands for a full disk.
    let cap = |pages: Option<i64>| {
        let ledger = ledger.clone();
        async move {
            ledger
                .write_in_place(move |db| {
                    let pages = match pages {
                        Some(pages) => pages,
                        None => db.query_row("PRAGMA page_count", [], |row| row.get(0))?,
                    };
                    db.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
                })
                .await
                .unwrap();
        }
    };
    cap(None).await;
    let mut big = routed(1, EnvelopeState::Queued);
    big.envelope.text = Some("x".repeat(256 * 1024));
    let full = ledger.record_batch(1, 2, &[big]).await.unwrap_err();
    assert_eq!(LedgerCongestion::of(&full), Some(LedgerCongestion::DiskFull), "{full}");
    assert_eq!(ledger.next_offset(1).await.unwrap(), None, "nothing recorded, the offset not moved");
    // Room again.
    cap(Some(1_073_741_823)).await;
    ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Queued)]).await.unwrap();
    assert_eq!(ledger.next_offset(1).await.unwrap(), Some(2));
}

/// `orch`'s one-part reply to envelope `envelope_id`.
fn one_part_reply(envelope_id: i64) -> NewAttempt<'static> {
    NewAttempt {
        envelope_id,
        agent: "orch",
        request_id: None,
        purpose: AttemptPurpose::Reply,
        method: AttemptMethod::SendMessage,
        target_message_id: None,
        chat_id: 42,
        thread_id: None,
        reply_to_message_id: None,
        chunk_index: 0,
        chunk_count: 1,
        text: "reply",
    }
}

/// A human message handed to `orch`'s session, recorded with update 1: pending, and the
/// first message of its task.
async fn one_pending_message(ledger: &SqliteLedger) -> StoredEnvelope {
    let orch = AgentName::parse("orch").unwrap();
    let batch = [routed(1, EnvelopeState::Queued)];
    ledger.record_batch_handing_over(1, 2, &batch, &[&orch], None).await.unwrap();
    ledger.pending(&orch).await.unwrap().remove(0)
}

/// The check that counts is the one in the statement that records the attempt: a reply
/// resolved before a correction, whose first attempt is recorded after it, is refused
/// there and records nothing (DESIGN.md §11: admission at the moment of sending).
#[tokio::test]
async fn a_correction_recorded_between_resolving_and_sending_refuses_the_attempt() {
    let (_dir, ledger) = ledger().await;
    let orch = AgentName::parse("orch").unwrap();
    let instruction = one_pending_message(&ledger).await;
    let task_id = instruction.task_id.clone().expect("a human message belongs to a task");
    assert_eq!(instruction.revision, Some(1));
    let attempt = |envelope_id| NewAttempt {
        request_id: Some("req_aaaaaaaa"),
        reply_to_message_id: Some(1),
        text: "for Monday",
        ..one_part_reply(envelope_id)
    };
    // The reply was resolved to `instruction` (pending, admitted); now the user edits it.
    assert_eq!(ledger.admission(instruction.id).await.unwrap(), Ok(()));
    let mut edit = routed(2, EnvelopeState::Queued);
    edit.envelope.kind = EnvelopeKind::EditedMessage;
    edit.envelope.message_id = 1;
    edit.envelope.text = Some("for Friday".into());
    let batch = [edit];
    let recorded = ledger.record_batch_handing_over(2, 3, &batch, &[&orch], None).await.unwrap();
    assert!(
        recorded.task_effects.iter().any(
            |effect| matches!(effect, TaskEffect::Say(post) if post.text == format!("{task_id} revision 2: correction accepted"))
        ),
        "{:?}",
        recorded.task_effects
    );
    let revision = recorded.claimed.into_iter().next().expect("the revision envelope is handed over");
    assert_eq!((revision.kind, revision.revision), (EnvelopeKind::Revision, Some(2)));

    let refused = ledger.begin_attempt(&attempt(instruction.id)).await.unwrap().unwrap_err();
    assert_eq!(refused.code(), "superseded");
    assert!(refused.to_string().contains(&revision.trace_id), "{refused}");
    assert!(ledger.attempts_for(instruction.id).await.unwrap().is_empty(), "nothing recorded, nothing sent");
    assert_eq!(ledger.find(&instruction.trace_id).await.unwrap().unwrap().state, EnvelopeState::Superseded);
    // The revision envelope is admitted.
    ledger.begin_attempt(&attempt(revision.id)).await.unwrap().unwrap();

    // Audit posts (the bot's own acknowledgements) are never refused.
    let mut audit = attempt(instruction.id);
    audit.purpose = AttemptPurpose::Audit;
    audit.request_id = None;
    ledger.begin_attempt(&audit).await.unwrap().unwrap();
}

/// A pause and a cancel close admission for every envelope of the task, the current one
/// included; a resume opens it again. A task's lineage keeps every revision.
#[tokio::test]
async fn pause_resume_and_cancel_are_revisions_that_close_and_open_admission() {
    let (_dir, ledger) = ledger().await;
    let orch = AgentName::parse("orch").unwrap();
    let work = one_pending_message(&ledger).await;
    let task_id = work.task_id.clone().unwrap();
    let command = |update_id: i64, text: &str| {
        let mut row = routed(update_id, EnvelopeState::Queued);
        row.envelope.text = Some(text.into());
        row
    };
    let code = |admitted: Result<(), crate::rules::revisions::Refusal>| admitted.err().map(|r| r.code());

    ledger.record_batch(2, 3, &[command(2, "/pause")]).await.unwrap();
    assert_eq!(code(ledger.admission(work.id).await.unwrap()), Some("paused"));
    ledger.record_batch(3, 4, &[command(3, "/resume")]).await.unwrap();
    assert_eq!(code(ledger.admission(work.id).await.unwrap()), None);
    ledger.record_batch(4, 5, &[command(4, "/cancel")]).await.unwrap();
    assert_eq!(code(ledger.admission(work.id).await.unwrap()), Some("cancelled"));
    // A second /cancel asks; nothing changes.
    ledger.record_batch(5, 6, &[command(5, "/cancel")]).await.unwrap();

    let (task, revisions, _) = ledger.task(&task_id).await.unwrap().unwrap();
    assert_eq!((task.state.as_str(), task.revision), ("stop_requested", 4));
    let kinds: Vec<&str> = revisions.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["start", "pause", "resume", "cancel"]);
    // The commands were handled by the switchboard, never work for the agent.
    let pending: Vec<String> = ledger.pending(&orch).await.unwrap().into_iter().map(|e| e.content).collect();
    assert!(pending.is_empty(), "{pending:?}");
    let queued = ledger.claim_next_queued(&orch).await.unwrap().expect("the cancel envelope");
    assert_eq!(queued.kind, EnvelopeKind::Revision);
    assert!(ledger.claim_next_queued(&orch).await.unwrap().is_none(), "the second /cancel is no work");

    // Acking the cancel envelope stops the task.
    ledger
        .transition(queued.id, &[EnvelopeState::Pending], EnvelopeState::Acked, "agent:orch", None)
        .await
        .unwrap();
    assert_eq!(ledger.task(&task_id).await.unwrap().unwrap().0.state, TaskState::Stopped);
}

/// A task state this switchboard does not know (a row written around the CHECK, or by a
/// newer version) is an error, never a task read as open.
#[tokio::test]
async fn an_unknown_task_state_is_an_error_not_an_open_task() {
    let (dir, ledger) = ledger().await;
    let envelope = one_pending_message(&ledger).await;
    let task_id = envelope.task_id.clone().unwrap();
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    db.execute_batch("PRAGMA ignore_check_constraints = ON").unwrap();
    db.execute("UPDATE tasks SET state = 'archived' WHERE task_id = ?1", [&task_id]).unwrap();
    drop(db);
    let read = ledger.task(&task_id).await;
    assert!(read.is_err(), "read as {read:?}");
    assert!(format!("{:?}", read.unwrap_err()).contains("archived"));
}

/// `SqliteLedger::begin_attempt` decides admission in SQL, in the statement that records the
/// attempt; `rules::revisions::admit` explains a refusal. They must agree on every task.
#[tokio::test]
async fn the_admission_in_sql_agrees_with_admit() {
    let (_dir, ledger) = ledger().await;
    let envelope = one_pending_message(&ledger).await;
    let task_id = envelope.task_id.clone().unwrap();
    let mut checked = 0;
    for state in ["open", "paused", "stop_requested", "stopped", "done", "replaced"] {
        for instruction in [None, Some(1), Some(2), Some(3)] {
            for revision in 1..=3 {
                let updated = ledger
                    .write_in_place(|db| {
                        let tasks = db.execute(
                            "UPDATE tasks SET state = ?, revision = 3, instruction_revision = ?, instruction_kind = ?, \
                             act_on_envelope_id = ? WHERE task_id = ?",
                            rusqlite::params![state, instruction, instruction.map(|_| "correction"), envelope.id, task_id],
                        )?;
                        db.execute("UPDATE envelopes SET revision = ? WHERE id = ?", [revision, envelope.id])?;
                        Ok(tasks)
                    })
                    .await
                    .unwrap();
                assert_eq!(updated, 1);
                let explained = ledger.admission(envelope.id).await.unwrap();
                let recorded = ledger.begin_attempt(&one_part_reply(envelope.id)).await.unwrap();
                assert_eq!(
                    recorded.is_ok(),
                    explained.is_ok(),
                    "{state}, instruction {instruction:?}, envelope revision {revision}: {recorded:?} vs {explained:?}"
                );
                if let Err(refusal) = recorded {
                    assert_eq!(Err(refusal), explained);
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 72);
}

/// A batch's plain messages are stored with their tasks in its one insert: one task per
/// conversation, its first revision pointing at the message that started it.
#[tokio::test]
async fn a_batch_starts_one_task_per_conversation_at_the_message_that_started_it() {
    let (_dir, ledger) = ledger().await;
    let in_chat = |update_id: i64, chat_id: i64| {
        let mut row = routed(update_id, EnvelopeState::Queued);
        row.envelope.channel.chat_id = chat_id;
        row
    };
    // An audit row first, so the human rows do not start at the batch's first id.
    let batch =
        [routed(1, EnvelopeState::Ignored), in_chat(2, 7), in_chat(3, 8), in_chat(4, 7), in_chat(5, 9)];
    ledger.record_batch(1, 6, &batch).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(rows[0].task_id, None, "an audit row belongs to no task");
    assert_eq!(rows[1].task_id, rows[3].task_id, "one conversation, one task");
    assert_ne!(rows[1].task_id, rows[2].task_id);
    assert_ne!(rows[2].task_id, rows[4].task_id);
    for starter in [&rows[1], &rows[2], &rows[4]] {
        let (task, revisions, _) = ledger.task(starter.task_id.as_deref().unwrap()).await.unwrap().unwrap();
        assert_eq!(task.chat_id, starter.chat_id);
        assert_eq!(revisions.len(), 1);
        assert_eq!(revisions[0].kind, "start");
        assert_eq!(revisions[0].envelope_trace_id.as_deref(), Some(starter.trace_id.as_str()));
        assert_eq!(revisions[0].text.as_deref(), starter.text.as_deref());
    }
}

/// What the user and the agent do, in the model-based test below.
#[derive(Debug, Clone)]
enum Doing {
    /// A plain message.
    Message,
    /// An edit of the `n`th message sent so far (modulo their number).
    Edit(usize),
    Pause,
    Resume,
    Cancel,
    New,
    /// A reply attempt for the `n`th envelope the agent was given (modulo their number).
    Reply(usize),
}

fn doing() -> impl proptest::strategy::Strategy<Value = Doing> {
    use proptest::prelude::*;
    prop_oneof![
        3 => Just(Doing::Message),
        2 => any::<usize>().prop_map(Doing::Edit),
        1 => Just(Doing::Pause),
        1 => Just(Doing::Resume),
        1 => Just(Doing::Cancel),
        1 => Just(Doing::New),
        4 => any::<usize>().prop_map(Doing::Reply),
    ]
}

/// The model's task: its revision, the revision of its last instruction change, its
/// state, and the messages whose edit corrects it.
#[derive(Debug, Clone)]
struct ModelTask {
    revision: i64,
    instruction: i64,
    state: &'static str,
    instruction_messages: Vec<i32>,
}

impl ModelTask {
    /// A task the message `message_id` starts: revision 1, its first instruction.
    fn started_by(message_id: i32) -> Self {
        Self { revision: 1, instruction: 0, state: "open", instruction_messages: vec![message_id] }
    }
}

/// Runs `steps` through the real ledger (intake's transaction, the attempt's statement)
/// and through a model written from DESIGN.md §11 alone, and checks that every reply
/// attempt is admitted exactly when the model says it may go out: never for an envelope
/// of a superseded revision, of a paused, cancelled or replaced task.
async fn ledger_agrees_with_the_model(steps: Vec<Doing>) {
    let (_dir, ledger) = ledger().await;
    let mut tasks: Vec<ModelTask> = Vec::new();
    let mut messages: Vec<i32> = Vec::new();
    // The envelopes handed to the agent: trace id, model task, revision made under.
    let mut given: Vec<(String, usize, i64)> = Vec::new();
    let mut update_id = 0;
    for step in steps {
        let current = tasks.len().checked_sub(1);
        let open = current.filter(|&t| matches!(tasks[t].state, "open" | "paused" | "stop_requested"));
        let text = match &step {
            Doing::Pause => "/pause".to_owned(),
            Doing::Resume => "/resume".to_owned(),
            Doing::Cancel => "/cancel".to_owned(),
            Doing::New => format!("/new objective {update_id}"),
            _ => format!("message {update_id}"),
        };
        if let Doing::Reply(n) = step {
            if given.is_empty() {
                continue;
            }
            let (trace_id, task, revision) = given[n % given.len()].clone();
            let model = &tasks[task];
            let may_go = !matches!(model.state, "paused" | "stop_requested" | "replaced")
                && revision >= model.instruction;
            let envelope = ledger.find(&trace_id).await.unwrap().unwrap();
            let admitted = ledger.begin_attempt(&one_part_reply(envelope.id)).await.unwrap();
            assert_eq!(
                admitted.is_ok(),
                may_go,
                "{trace_id} of {model:?} made under revision {revision}: {admitted:?}"
            );
            continue;
        }
        update_id += 1;
        let message_id = i32::try_from(update_id).unwrap();
        let mut row = routed(update_id, EnvelopeState::Queued);
        row.envelope.text = Some(text);
        let carried = match step {
            Doing::Edit(n) => {
                if messages.is_empty() {
                    update_id -= 1;
                    continue;
                }
                let edited = messages[n % messages.len()];
                row.envelope.kind = EnvelopeKind::EditedMessage;
                row.envelope.message_id = edited;
                match open {
                    Some(t) if tasks[t].instruction_messages.contains(&edited) => {
                        let task = &mut tasks[t];
                        task.revision += 1;
                        task.instruction = task.revision;
                        task.instruction_messages.push(edited);
                        Some((t, task.revision))
                    }
                    _ => None,
                }
            }
            Doing::Message => {
                messages.push(message_id);
                match open.filter(|&t| tasks[t].state != "stop_requested") {
                    Some(t) => Some((t, tasks[t].revision)),
                    None => {
                        tasks.push(ModelTask::started_by(message_id));
                        Some((tasks.len() - 1, 1))
                    }
                }
            }
            Doing::Pause | Doing::Resume => {
                messages.push(message_id);
                let (from, to) =
                    if matches!(step, Doing::Pause) { ("open", "paused") } else { ("paused", "open") };
                if let Some(t) = open.filter(|&t| tasks[t].state == from) {
                    tasks[t].revision += 1;
                    tasks[t].state = to;
                }
                None
            }
            Doing::Cancel => {
                messages.push(message_id);
                match open.filter(|&t| matches!(tasks[t].state, "open" | "paused")) {
                    Some(t) => {
                        tasks[t].revision += 1;
                        tasks[t].state = "stop_requested";
                        Some((t, tasks[t].revision))
                    }
                    None => None,
                }
            }
            Doing::New => {
                messages.push(message_id);
                if let Some(t) = open {
                    tasks[t].revision += 1;
                    tasks[t].instruction = tasks[t].revision;
                    tasks[t].state = "replaced";
                }
                tasks.push(ModelTask::started_by(message_id));
                Some((tasks.len() - 1, 1))
            }
            Doing::Reply(_) => unreachable!("handled above"),
        };
        ledger.record_batch(1, update_id + 1, &[row.clone()]).await.unwrap();
        if let Some((task, revision)) = carried {
            given.push((row.envelope.trace_id.to_string(), task, revision));
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// DESIGN.md §11's property, end to end through the ledger: for any interleaving of
    /// messages, changes and reply attempts, no attempt for an envelope of revision r is
    /// admitted once a later revision changed the instruction (or paused, cancelled or
    /// replaced the task), and every other attempt is.
    #[test]
    fn no_superseded_reply_is_ever_recorded(steps in proptest::collection::vec(doing(), 1..30)) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(ledger_agrees_with_the_model(steps));
    }
}

/// Migration 0008: a CHECK that lists more than two values builds a temporary B-tree each
/// time it runs (for every row written); the ledger's say the same with comparisons.
#[tokio::test]
async fn no_check_builds_a_temporary_tree() {
    let (dir, ledger) = ledger().await;
    ledger.close().await;
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let tables: Vec<(String, String)> = db
        .prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND sql IS NOT NULL")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(tables.iter().any(|(name, _)| name == "envelopes"));
    for (name, sql) in &tables {
        for (at, _) in sql.match_indices(" IN (") {
            let list = &sql[at..at + sql[at..].find(')').unwrap()];
            assert!(list.matches(',').count() < 2, "table {name} lists more than two values: {list}");
        }
    }
    let plan = |statement: &str| -> Vec<String> {
        let mut explain = db.prepare(&format!("EXPLAIN {statement}")).unwrap();
        let nulls = vec![rusqlite::types::Null; explain.parameter_count()];
        explain
            .query_map(rusqlite::params_from_iter(nulls), |row| row.get::<_, String>(1))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    for statement in [
        "INSERT INTO envelopes (trace_id, kind, chat_id, chat_type, message_id, sender_name, content, sent_at, \
         received_at, state, state_changed_at) VALUES (?1, ?2, 1, 'private', 1, 'Ann', 'hi', 't', 't', ?3, 't')",
        "UPDATE envelopes SET state = ?1 WHERE id = ?2",
        "UPDATE attempts SET outcome = ?1 WHERE id = ?2",
    ] {
        assert!(!plan(statement).iter().any(|op| op == "OpenEphemeral"), "{statement}");
    }
    // The constraints still hold, and the schema is sound.
    let insert = |trace_id: &str, kind: &str, state: &str| {
        db.execute(
            "INSERT INTO envelopes (trace_id, kind, chat_id, chat_type, message_id, sender_name, content, sent_at, \
             received_at, state, state_changed_at) VALUES (?1, ?2, 1, 'private', 1, 'Ann', 'hi', 't', 't', ?3, 't')",
            [trace_id, kind, state],
        )
    };
    insert("env_ok", "message", "queued").unwrap();
    for (trace_id, kind, state) in [("env_kind", "telegram", "queued"), ("env_state", "message", "lost")] {
        let error = insert(trace_id, kind, state).unwrap_err();
        assert!(error.to_string().contains("CHECK constraint failed"), "{error}");
    }
    let check: String = db.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
    assert_eq!(check, "ok");
}

#[tokio::test]
async fn ids_are_not_reused_without_autoincrement() {
    // A ledger as the previous release left it, numbering with AUTOINCREMENT, holding rows.
    let (_dir, path, db) = ledger_migrated_to(8);
    db.execute(
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, chat_type, message_id, sender_name, content, \
         sent_at, received_at, state, deliveries, state_changed_at) VALUES \
         ('env_old1', 10, 'message', 42, 'private', 1, 'Ann', 'hi', 't', 't', 'acked', 1, 't'), \
         ('env_old2', 11, 'message', 42, 'private', 2, 'Ann', 'hi!', 't', 't', 'acked', 1, 't')",
        [],
    )
    .unwrap();
    let sequence: i64 = db
        .query_row("SELECT seq FROM sqlite_sequence WHERE name = 'envelopes'", [], |row| row.get(0))
        .unwrap();
    assert_eq!(sequence, 2, "the old schema keeps its sequence");
    drop(db);

    let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
    ledger.record_batch(1, 13, &[routed(12, EnvelopeState::Queued)]).await.unwrap();
    ledger.begin_attempt(&one_part_reply(3)).await.unwrap().expect("the attempt is admitted");
    ledger.close().await;

    let db = rusqlite::Connection::open(&path).unwrap();
    let numbered_by_sequence: Vec<String> = db
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND sql LIKE '%AUTOINCREMENT%'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(numbered_by_sequence, Vec::<String>::new());
    // Nothing keeps a sequence any more: a row stored costs no second write.
    let sequences: i64 = db.query_row("SELECT count(*) FROM sqlite_sequence", [], |row| row.get(0)).unwrap();
    assert_eq!(sequences, 0);
    // The new rows continue the ids, in arrival order, and the references hold.
    let ids: Vec<(i64, String)> = db
        .prepare("SELECT id, trace_id FROM envelopes ORDER BY id")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(ids.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(&ids[..2], [(1, "env_old1".to_owned()), (2, "env_old2".to_owned())]);
    let attempt_envelope: i64 =
        db.query_row("SELECT envelope_id FROM attempts", [], |row| row.get(0)).unwrap();
    assert_eq!(attempt_envelope, 3);
    let check: String = db.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
    assert_eq!(check, "ok");
}

#[tokio::test]
async fn a_handoff_ends_once_and_a_second_end_changes_nothing() {
    let (_dir, ledger) = ledger().await;
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
    let answer_envelopes: i64 =
        read(&ledger, "SELECT count(*) FROM envelopes WHERE kind = 'handoff_answer'", |row| row.get(0)).await;
    assert_eq!(answer_envelopes, 1, "the second end queued no answer");
    let now = ledger.handoff(&open.handoff_id).await.unwrap().unwrap();
    assert_eq!((now.state, now.note), (HandoffState::Answered, None));
}

/// A follow-up's intent is read as what it says, and one this switchboard does not know
/// (a row written by a newer version) is an error naming it, not a handoff without one.
#[tokio::test]
async fn a_handoffs_intent_is_read_strictly() {
    let (dir, ledger) = ledger().await;
    let (orch, worker) = (AgentName::parse("orch").unwrap(), AgentName::parse("worker").unwrap());
    let first = NewHandoff {
        from: &orch,
        to: &worker,
        instruction: "check staging",
        cause: None,
        depth: 1,
        followup_of: None,
        intent: None,
        request_id: "req_1",
    };
    let recorded = ledger.record_handoff(&first).await.unwrap().expect("no task to refuse it");
    let second = NewHandoff {
        instruction: "check production instead",
        followup_of: Some(&recorded.handoff_id),
        intent: Some(Intent::Replaces),
        request_id: "req_2",
        ..first
    };
    let second = ledger.record_handoff(&second).await.unwrap().expect("no task to refuse it");
    let read_back = ledger.handoff(&second.handoff_id).await.unwrap().unwrap();
    assert_eq!(read_back.intent, Some(Intent::Replaces));

    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    db.execute_batch("PRAGMA ignore_check_constraints = ON").unwrap();
    db.execute("UPDATE handoffs SET intent = 'amends' WHERE handoff_id = ?1", [&second.handoff_id]).unwrap();
    drop(db);
    let read = ledger.handoff(&second.handoff_id).await;
    assert!(read.is_err(), "read as {read:?}");
    assert!(format!("{:?}", read.unwrap_err()).contains("amends"));
}

/// The migrations the last release that migrated with sqlx shipped.
const MIGRATED_BY_SQLX: usize = 9;

/// A ledger as the releases that migrated with sqlx left it: their migrations applied, and
/// each recorded in `_sqlx_migrations` the way sqlx's migrator recorded it (the table's own
/// DDL, the description from the file's name, the SHA-384 of the file, the time taken).
/// Built here by hand, from the files, so that it does not depend on the runner it tests.
fn ledger_made_by_sqlx(dir: &std::path::Path) -> std::path::PathBuf {
    use sha2::{Digest, Sha384};

    let path = dir.join("ledger.db");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.pragma_update(None, "journal_mode", "WAL").unwrap();
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);",
    )
    .unwrap();
    let files = [
        (1, "0001_ledger.sql", "ledger"),
        (2, "0002_intake.sql", "intake"),
        (3, "0003_replies.sql", "replies"),
        (4, "0004_handoffs.sql", "handoffs"),
        (5, "0005_rooms.sql", "rooms"),
        (6, "0006_tasks.sql", "tasks"),
        (7, "0007_shown_in_memory.sql", "shown in memory"),
        (8, "0008_checks_without_in_lists.sql", "checks without in lists"),
        (9, "0009_ids_without_autoincrement.sql", "ids without autoincrement"),
    ];
    for (version, file, description) in files {
        let sql = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(file),
        )
        .unwrap();
        let own_transaction = sql.starts_with("-- no-transaction");
        if !own_transaction {
            db.execute_batch("BEGIN").unwrap();
        }
        db.execute_batch(&sql).unwrap();
        db.execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (?1, ?2, TRUE, ?3, -1)",
            rusqlite::params![version, description, Sha384::digest(sql.as_bytes()).to_vec()],
        )
        .unwrap();
        if !own_transaction {
            db.execute_batch("COMMIT").unwrap();
        }
        db.execute("UPDATE _sqlx_migrations SET execution_time = 1234567 WHERE version = ?1", [version])
            .unwrap();
    }
    // Rows a daemon of that release stored, and its offset.
    db.execute_batch(
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, chat_type, message_id, sender_name, content, \
         sent_at, received_at, state, deliveries, state_changed_at) VALUES \
         ('env_sqlx1', 10, 'message', 42, 'private', 1, 'Ann', 'hi', 't', 't', 'acked', 1, 't'), \
         ('env_sqlx2', 11, 'message', 42, 'private', 2, 'Ann', 'still there?', 't', 't', 'queued', 0, 't'); \
         INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES (7, 12, 't');",
    )
    .unwrap();
    path
}

/// What `_sqlx_migrations` holds, row for row.
fn applied_migrations(path: &std::path::Path) -> Vec<(i64, String, String, bool, Vec<u8>, i64)> {
    let db = rusqlite::Connection::open(path).unwrap();
    db.prepare(
        "SELECT version, description, installed_on, success, checksum, execution_time FROM _sqlx_migrations \
         ORDER BY version",
    )
    .unwrap()
    .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?)))
    .unwrap()
    .collect::<rusqlite::Result<_>>()
    .unwrap()
}

#[tokio::test]
async fn a_ledger_migrated_by_sqlx_opens_with_its_data_and_no_migration_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_made_by_sqlx(dir.path());
    let before = applied_migrations(&path);
    assert_eq!(before.len(), MIGRATED_BY_SQLX);

    // A migration run again would fail (its tables exist) or change the record.
    let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(
        rows.iter().map(|e| (e.trace_id.as_str(), e.state)).collect::<Vec<_>>(),
        [("env_sqlx1", EnvelopeState::Acked), ("env_sqlx2", EnvelopeState::Queued)]
    );
    assert_eq!(ledger.next_offset(7).await.unwrap(), Some(12));
    // The ledger works on: the queued envelope is claimed, and a new batch goes after it.
    let orch = AgentName::parse("orch").unwrap();
    ledger
        .execute_in_place("UPDATE envelopes SET agent = 'orch' WHERE trace_id = 'env_sqlx2'", [])
        .await
        .unwrap();
    assert_eq!(ledger.claim_next_queued(&orch).await.unwrap().map(|e| e.trace_id), Some("env_sqlx2".into()));
    ledger.record_batch(7, 13, &[routed(12, EnvelopeState::Queued)]).await.unwrap();
    ledger.close().await;
    drop(ledger);
    let after = applied_migrations(&path);
    assert_eq!(after[..MIGRATED_BY_SQLX], before, "the record of migrations is as sqlx left it");
    let added: Vec<i64> = after[MIGRATED_BY_SQLX..].iter().map(|m| m.0).collect();
    let newer: Vec<i64> = migrations::MIGRATIONS[MIGRATED_BY_SQLX..].iter().map(|m| m.version).collect();
    assert_eq!(added, newer, "only the migrations since are applied, once");

    // And it opens again, as often as it is opened, with nothing run again.
    let again = SqliteLedger::open_existing(&path, Synchronous::Normal).await.unwrap();
    assert_eq!(again.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap().len(), 3);
    again.close().await;
    drop(again);
    assert_eq!(applied_migrations(&path), after);
}

#[tokio::test]
async fn a_fresh_ledger_records_its_migrations_as_sqlx_did() {
    let dir = tempfile::tempdir().unwrap();
    let sqlx_dir = dir.path().join("sqlx");
    std::fs::create_dir_all(&sqlx_dir).unwrap();
    let made_by_sqlx = ledger_made_by_sqlx(&sqlx_dir);
    let fresh = dir.path().join("fresh.db");
    SqliteLedger::open(&fresh, Synchronous::Normal).await.unwrap().close().await;
    // Same versions, descriptions, success and checksums: a release that migrates with
    // sqlx opens this ledger as its own.
    let record = |path| {
        applied_migrations(path)
            .into_iter()
            .map(|(v, d, _at, ok, sum, _took)| (v, d, ok, sum))
            .collect::<Vec<_>>()
    };
    assert_eq!(record(&fresh)[..MIGRATED_BY_SQLX], record(&made_by_sqlx));
    assert_eq!(record(&fresh).len(), migrations::MIGRATIONS.len());
    assert!(applied_migrations(&fresh).iter().all(|m| m.5 >= 0), "each took a measured time");
}

#[tokio::test]
async fn a_ledger_with_a_migration_this_release_does_not_know_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_made_by_sqlx(dir.path());
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99, 'from the future', TRUE, x'00', 1)",
        [],
    )
    .unwrap();
    drop(db);
    let Err(OpenError::Migrate { source, .. }) = SqliteLedger::open(&path, Synchronous::Normal).await else {
        panic!("a ledger a newer release migrated is refused");
    };
    assert!(matches!(source, MigrationError::Unknown { version: 99 }), "{source:?}");
    assert!(source.to_string().contains("newer release"), "{source}");
}

#[tokio::test]
async fn a_ledger_with_a_failed_or_edited_migration_is_refused() {
    for (change, expected) in [
        ("UPDATE _sqlx_migrations SET success = FALSE WHERE version = 9", "recorded as failed"),
        ("UPDATE _sqlx_migrations SET checksum = x'00' WHERE version = 3", "must never be edited"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = ledger_made_by_sqlx(dir.path());
        rusqlite::Connection::open(&path).unwrap().execute(change, []).unwrap();
        let Err(OpenError::Migrate { source, .. }) = SqliteLedger::open(&path, Synchronous::Normal).await
        else {
            panic!("{change}: the ledger is refused");
        };
        match source {
            MigrationError::Dirty { version: 9 } | MigrationError::Changed { version: 3, .. } => {}
            ref other => panic!("{change}: {other:?}"),
        }
        assert!(source.to_string().contains(expected), "{source}");
    }
}

/// `orch`'s reaction (`set_reaction`) to message `target` of envelope `envelope_id`.
fn reaction(envelope_id: i64, request_id: &'static str, target: i32) -> NewAttempt<'static> {
    NewAttempt {
        request_id: Some(request_id),
        method: AttemptMethod::SetReaction,
        target_message_id: Some(target),
        text: "👍",
        ..one_part_reply(envelope_id)
    }
}

/// A reaction or an edit is an attempt of its own: its method and target are kept, and
/// whatever it comes to, the envelope is neither answered nor held for reconciliation,
/// and a reply made after it is still the envelope's first.
#[tokio::test]
async fn reactions_and_edits_settle_nothing_and_are_no_part_of_a_reply() {
    let (_dir, ledger) = ledger().await;
    let e = one_pending_message(&ledger).await;
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

/// A reaction is admitted like a reply (DESIGN.md §11): a paused task refuses it, and a
/// refusal records nothing.
#[tokio::test]
async fn a_paused_task_refuses_a_reaction() {
    let (_dir, ledger) = ledger().await;
    let e = one_pending_message(&ledger).await;
    let mut pause = routed(2, EnvelopeState::Queued);
    pause.envelope.text = Some("/pause".into());
    ledger.record_batch(2, 3, &[pause]).await.unwrap();
    let refused = ledger.begin_attempt(&reaction(e.id, "req_react001", 1)).await.unwrap().unwrap_err();
    assert_eq!(refused.code(), "paused");
    assert!(ledger.attempts_for(e.id).await.unwrap().is_empty());
}

/// `reply_part_method!` (the SQL) and `AttemptMethod::is_reply_part` agree on every method,
/// and every method the CHECK allows reads back as itself.
#[tokio::test]
async fn reply_part_method_agrees_with_is_reply_part() {
    let (_dir, ledger) = ledger().await;
    let e = one_pending_message(&ledger).await;
    for method in AttemptMethod::ALL {
        let attempt = NewAttempt { method, ..one_part_reply(e.id) };
        ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    }
    let sql =
        concat!("SELECT method, ", reply_part_method!(), " FROM attempts WHERE envelope_id = ? ORDER BY id");
    let in_sql: Vec<(String, bool)> = ledger
        .read_in_place(move |db| {
            super::in_place::query_all_cached(db, sql, [e.id], |row| Ok((row.get(0)?, row.get(1)?)))
        })
        .await
        .unwrap();
    let in_rust: Vec<(String, bool)> =
        AttemptMethod::ALL.iter().map(|m| (m.as_str().to_owned(), m.is_reply_part())).collect();
    assert_eq!(in_sql, in_rust);
    let read: Vec<AttemptMethod> =
        ledger.attempts_for(e.id).await.unwrap().iter().map(|a| a.method).collect();
    assert_eq!(read, AttemptMethod::ALL);
}

/// The messages the bot posted are known by chat and id, with whom they were sent for;
/// a reaction or an edit posts none. A reaction request is found again by its id.
#[tokio::test]
async fn the_bots_messages_are_known_by_their_confirmed_sends() {
    let (_dir, ledger) = ledger().await;
    let e = one_pending_message(&ledger).await;
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

/// A method this switchboard does not know is an error when read, never a send.
#[tokio::test]
async fn an_unknown_attempt_method_is_an_error() {
    let (dir, ledger) = ledger().await;
    let e = one_pending_message(&ledger).await;
    ledger.begin_attempt(&one_part_reply(e.id)).await.unwrap().unwrap();
    let db = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    assert!(db.execute("UPDATE attempts SET method = 'send_sticker'", []).is_err(), "the CHECK refuses it");
    db.execute_batch("PRAGMA ignore_check_constraints = ON").unwrap();
    db.execute("UPDATE attempts SET method = 'send_sticker'", []).unwrap();
    drop(db);
    let read = ledger.attempts_for(e.id).await;
    assert!(format!("{read:?}").contains("send_sticker"), "{read:?}");
}

/// `routed(update_id)` quoting message `quoted` of its chat.
fn quoting(update_id: i64, quoted: i32) -> RoutedEnvelope {
    let mut row = routed(update_id, EnvelopeState::Queued);
    row.envelope.context.quoted =
        Some(crate::telegram::parts::Quoted { message_id: quoted, text: Some("quoted".into()) });
    row
}

fn reaction_on(update_id: i64, message_id: i32, emoji: &[&str]) -> RoutedReaction {
    RoutedReaction {
        reaction: crate::telegram::envelope::Reaction {
            update_id,
            chat_id: 42,
            message_id,
            user_id: Some(42),
            user: "@ann".into(),
            emoji: emoji.iter().map(|e| (*e).to_owned()).collect(),
            date: Utc::now(),
        },
        update_digest: format!("digest of update {update_id}"),
    }
}

#[tokio::test]
async fn quotes_find_the_user_message_or_the_answered_envelope_in_the_transaction_that_records_them() {
    let (_dir, ledger) = ledger().await;
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
        row.task_meta().get("reply_to_trace_id").cloned()
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

#[tokio::test]
async fn reactions_are_owed_to_the_agent_whose_reply_they_are_on_and_stored_once() {
    let (_dir, ledger) = ledger().await;
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
