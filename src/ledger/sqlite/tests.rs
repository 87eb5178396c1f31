use super::*;
use crate::domain::{AttemptMethod, NewAttempt, NewHandoff};
use crate::ids::AgentName;
use crate::ledger::columns::reply_part_method;
use crate::ledger::conformance::fixtures::*;
use crate::ledger::prelude::*;
use crate::ledger::{EnvelopeState, LedgerCongestion, ListFilter};
use crate::rules::guard::Intent;
use crate::telegram::envelope::{ChatType, EnvelopeKind};

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
async fn commits_reach_the_database_file_a_moment_later_without_waiting_for_a_full_wal() {
    // The daemon's ledger, and `switchboard ledger`'s (whose prune would otherwise run
    // SQLite's checkpoint inside one batch's commit in every thousand pages).
    for existing in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        let ledger = SqliteLedger::open(&database, Synchronous::Normal).await.unwrap();
        let ledger = if existing {
            ledger.close().await;
            SqliteLedger::open_existing(&database, Synchronous::Normal).await.unwrap()
        } else {
            ledger
        };
        let backstop: i64 = read(&ledger, "PRAGMA wal_autocheckpoint", |row| row.get(0)).await;
        assert_eq!(backstop, i64::from(checkpoint::BACKSTOP_PAGES), "existing: {existing}");
        let size = || std::fs::metadata(&database).unwrap().len();
        // The migrations' own commits are copied back first.
        tokio::time::sleep(checkpoint::COPY_BACK_INTERVAL + 3 * checkpoint::CHECKPOINT_DELAY).await;
        let before = size();
        // Far fewer pages than the backstop: only the checkpointer moves them into the file,
        // with no commit after them to ask for it.
        let batch: Vec<_> = (1..=300).map(|id| routed(id, EnvelopeState::Queued)).collect();
        ledger.record_batch(1, 301, &batch).await.unwrap();
        let deadline =
            std::time::Instant::now() + checkpoint::COPY_BACK_INTERVAL + 20 * checkpoint::CHECKPOINT_DELAY;
        while size() == before {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint after the commit (existing: {existing})"
            );
            tokio::time::sleep(checkpoint::CHECKPOINT_DELAY / 4).await;
        }
        ledger.close().await;
    }
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
async fn a_folder_at_the_ledgers_path_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for opened in [
        SqliteLedger::open(dir.path(), Synchronous::Normal).await,
        SqliteLedger::open_existing(dir.path(), Synchronous::Normal).await,
    ] {
        let Err(error) = opened else { panic!("a folder opened as a ledger") };
        assert!(matches!(error, OpenError::NotAFile { .. }), "{error:?}");
        assert!(error.to_string().contains("folder"), "{error}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was made in it");
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
    let trace_id = &undecodable.envelope.trace_id;
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
         ('env_old1xxxxxx', 10, 'message', 42, 'private', 1, 'Ann', 'hi', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', 'acked', 1, '2026-01-01T00:00:00.000Z'), \
         ('env_old2xxxxxx', 11, 'edited_message', 42, 'private', 1, 'Ann', 'hi!', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', 'pending', 1, '2026-01-01T00:00:00.000Z'); \
         INSERT INTO attempts (op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, started_at) \
         VALUES ('op_1xxxxxxxxx', 1, 'orch', 42, 0, 1, 'hello', 'sent', '2026-01-01T00:00:00.000Z'); \
         INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) VALUES (1, '2026-01-01T00:00:00.000Z', 'pending', 'acked', 'daemon');",
    )
    .unwrap();
    drop(db);

    let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
    let rows = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(
        rows.iter().map(|e| (e.id, e.trace_id.as_str(), e.kind, e.state)).collect::<Vec<_>>(),
        [
            (1, "env_old1xxxxxx", EnvelopeKind::Message, EnvelopeState::Acked),
            (2, "env_old2xxxxxx", EnvelopeKind::EditedMessage, EnvelopeState::Pending)
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
    let busy = LedgerError::from(
        other()
            .execute("INSERT INTO poller_offsets VALUES (1, 1, '2026-01-01T00:00:00.000Z')", [])
            .unwrap_err(),
    );
    assert!(matches!(busy, LedgerError::Busy { .. }), "{busy:?}");
    assert_eq!(LedgerCongestion::of(&busy), Some(LedgerCongestion::Busy), "{busy}");
    holder.execute_batch("ROLLBACK").unwrap();

    // No more room: SQLITE_FULL. `max_page_count` caps this one connection's database size.
    let cramped = other();
    let pages: i64 = cramped.query_row("PRAGMA page_count", [], |row| row.get(0)).unwrap();
    cramped.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(())).unwrap();
    let insert_session =
        "INSERT INTO agent_sessions (id, agent, connected_at) VALUES (?, 'orch', '2026-01-01T00:00:00.000Z')";
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
         received_at, state, state_changed_at) VALUES (?1, ?2, 1, 'private', 1, 'Ann', 'hi', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', ?3, '2026-01-01T00:00:00.000Z')",
        "UPDATE envelopes SET state = ?1 WHERE id = ?2",
        "UPDATE attempts SET outcome = ?1 WHERE id = ?2",
    ] {
        assert!(!plan(statement).iter().any(|op| op == "OpenEphemeral"), "{statement}");
    }
    // The constraints still hold, and the schema is sound.
    let insert = |trace_id: &str, kind: &str, state: &str| {
        db.execute(
            "INSERT INTO envelopes (trace_id, kind, chat_id, chat_type, message_id, sender_name, content, sent_at, \
             received_at, state, state_changed_at) VALUES (?1, ?2, 1, 'private', 1, 'Ann', 'hi', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', ?3, '2026-01-01T00:00:00.000Z')",
            [trace_id, kind, state],
        )
    };
    insert("env_okxxxxxxxx", "message", "queued").unwrap();
    for (trace_id, kind, state) in
        [("env_kindxxxxxx", "telegram", "queued"), ("env_statexxxxx", "message", "lost")]
    {
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
         ('env_old1xxxxxx', 10, 'message', 42, 'private', 1, 'Ann', 'hi', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', 'acked', 1, '2026-01-01T00:00:00.000Z'), \
         ('env_old2xxxxxx', 11, 'message', 42, 'private', 2, 'Ann', 'hi!', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', 'acked', 1, '2026-01-01T00:00:00.000Z')",
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
    assert_eq!(&ids[..2], [(1, "env_old1xxxxxx".to_owned()), (2, "env_old2xxxxxx".to_owned())]);
    let attempt_envelope: i64 =
        db.query_row("SELECT envelope_id FROM attempts", [], |row| row.get(0)).unwrap();
    assert_eq!(attempt_envelope, 3);
    let check: String = db.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
    assert_eq!(check, "ok");
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
         ('env_sqlx1xxxxx', 10, 'message', 42, 'private', 1, 'Ann', 'hi', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', 'acked', 1, '2026-01-01T00:00:00.000Z'), \
         ('env_sqlx2xxxxx', 11, 'message', 42, 'private', 2, 'Ann', 'still there?', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z', 'queued', 0, '2026-01-01T00:00:00.000Z'); \
         INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES (7, 12, '2026-01-01T00:00:00.000Z');",
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
        [("env_sqlx1xxxxx", EnvelopeState::Acked), ("env_sqlx2xxxxx", EnvelopeState::Queued)]
    );
    assert_eq!(ledger.next_offset(7).await.unwrap(), Some(12));
    // The ledger works on: the queued envelope is claimed, and a new batch goes after it.
    let orch = AgentName::parse("orch").unwrap();
    ledger
        .execute_in_place("UPDATE envelopes SET agent = 'orch' WHERE trace_id = 'env_sqlx2xxxxx'", [])
        .await
        .unwrap();
    assert_eq!(
        ledger.claim_next_queued(&orch).await.unwrap().map(|e| e.trace_id),
        Some("env_sqlx2xxxxx".into())
    );
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

/// The conformance suite (`crate::ledger::conformance`) on SQLite: each rule on a fresh
/// ledger file in a directory of its own.
mod conformance {
    use async_trait::async_trait;

    use crate::config::Synchronous;
    use crate::ledger::conformance::Backend;
    use crate::ledger::{Ledger, SqliteLedger};

    struct Sqlite;

    #[async_trait]
    impl Backend for Sqlite {
        type Keep = tempfile::TempDir;

        async fn fresh() -> (tempfile::TempDir, Ledger) {
            let dir = tempfile::tempdir().unwrap();
            let ledger =
                SqliteLedger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
            (dir, std::sync::Arc::new(ledger))
        }
    }

    crate::ledger::conformance::suite!(Sqlite);
}

/// `switchboard ledger` of a newer release beside a running daemon of an earlier one: it
/// must not migrate the daemon's ledger under it (the daemon would run on a schema it does
/// not know, and refuse its next start or a rollback). With no daemon running, it
/// migrates as the daemon would.
#[tokio::test]
async fn the_ledger_command_migrates_only_a_ledger_no_daemon_holds() {
    let latest = migrations::MIGRATIONS.last().unwrap().version;
    let (_dir, path, db) = ledger_migrated_to(latest - 1);
    drop(db);
    let applied = |path: &std::path::Path| -> i64 {
        let db = rusqlite::Connection::open(path).unwrap();
        db.query_row("SELECT max(version) FROM _sqlx_migrations", [], |row| row.get(0)).unwrap()
    };

    let daemon = LedgerLock::acquire(&path).unwrap();
    let Err(refused) = SqliteLedger::open_existing(&path, Synchronous::Normal).await else {
        panic!("migrated under a daemon")
    };
    assert!(
        matches!(refused, OpenError::Migrate { source: MigrationError::Behind { version, .. }, .. } if version == latest),
        "{refused:?}"
    );
    assert_eq!(applied(&path), latest - 1, "the daemon's ledger was left as it was");

    drop(daemon);
    SqliteLedger::open_existing(&path, Synchronous::Normal).await.unwrap().close().await;
    assert_eq!(applied(&path), latest);
}

/// Verdicts written before migration 17 count as handed (their plugins may run the code
/// that never confirms); a verdict never written stays owed.
#[tokio::test]
async fn the_handed_verdicts_migration_counts_written_verdicts_as_handed() {
    let (_dir, path, db) = ledger_migrated_to(16);
    let row = |id: &str, request_id: &str, sent: &str| {
        format!(
            "INSERT INTO permission_requests (id, agent, session_id, plugin_id, request_id, tool_name, description, \
             input_preview, asked_at, expires_at, state, route, chat_id, prompt_send, prompt_settled, answered_at, \
             verdict_sent_at) VALUES ('{id}', 'orch', 'ses_1', 'plg_a', '{request_id}', 'Bash', 'ls', '{{}}', \
             '2026-01-01T00:00:00.000Z', '2026-01-02T00:00:00.000Z', 'allowed', 'dm', 42, 'sent', 1, \
             '2026-01-01T00:00:01.000Z', {sent});"
        )
    };
    db.execute_batch(
        &(row("prm_written", "abcde", "'2026-01-01T00:00:02.000Z'") + &row("prm_owed", "fghij", "NULL")),
    )
    .unwrap();
    drop(db);

    let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
    let owed = ledger.undelivered_verdicts("plg_a").await.unwrap();
    assert_eq!(owed.iter().map(|row| row.id.as_str()).collect::<Vec<_>>(), ["prm_owed"]);
    let written = ledger.permission("prm_written").await.unwrap().unwrap();
    assert_eq!(written.verdict_handed_at, written.verdict_sent_at);
    assert!(written.verdict_handed_at.is_some());
}
