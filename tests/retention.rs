//! Retention (issue 26) as an operator meets it: `switchboard ledger prune` beside a live
//! daemon, `kill -9` of a prune halfway, and `[storage] retain_days` pruning a running
//! daemon's ledger on its schedule. What exactly stays and goes is tested row by row in
//! `src/ledger/*/prune.rs` and `src/rules/retention.rs`; here, that nothing open goes and
//! that the ledger stays whole. On either backend: `tests/on_postgres.rs` runs this suite
//! again with the ledger on PostgreSQL.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, UserSpec};

const WAIT: Duration = Duration::from_secs(30);

/// How long half of [`big_ledger`]'s prune may take in a debug build on a loaded machine:
/// each batch waits for its checkpoint, so the prune goes at the pace the file takes pages.
const PRUNE_HALFWAY: Duration = Duration::from_secs(180);

/// Old enough for any cutoff the tests use (`--older-than 30d`, `retain_days = 1`).
const LONG_AGO: &str = "2020-01-01T00:00:00.000Z";

/// Envelopes of a ledger big enough that a debug build's prune takes seconds: on
/// PostgreSQL, whose batches each cross to the server several times, fewer do.
fn big_ledger() -> i64 {
    if TestLedger::is_postgres_here() { 60_000 } else { 150_000 }
}

/// The trace ids of two rows that must survive every prune here: an old queued envelope
/// (for the worker, which never connects), and an old unresolved one with its unknown
/// attempt. Beside them, open work (`env_keep_…`): a pending envelope, an open handoff, a
/// running cascade and an open task (whose work is the pending envelope), each referencing
/// old acked envelopes.
const QUEUED: &str = "env_oldqueued";
const UNRESOLVED: &str = "env_oldunresolved";

/// Writes `count` envelopes acked long ago, each with a sent attempt and two events, and
/// the rows that must stay, straight into the daemon's (migrated) ledger.
fn fill(daemon: &TestDaemon, count: i64) {
    match &daemon.ledger_at {
        TestLedger::Sqlite(path) => fill_sqlite(path, count),
        TestLedger::Postgres(schema) => fill_postgres(schema, count),
    }
}

fn fill_sqlite(path: &Path, count: i64) {
    let mut db = rusqlite::Connection::open(path).unwrap();
    let tx = db.transaction().unwrap();
    let envelope = |tx: &rusqlite::Transaction<'_>, id: i64, trace: &str, agent: &str, state: &str| {
        tx.prepare_cached(
            "INSERT INTO envelopes (id, trace_id, kind, chat_id, chat_type, message_id, sender_name, content, \
             sent_at, received_at, route, agent, state, state_changed_at) \
             VALUES (?1, ?2, 'message', 42, 'private', ?1, 'Ann', 'old words', ?5, ?5, 'dm', ?3, ?4, ?5)",
        )
        .unwrap()
        .execute(rusqlite::params![id, trace, agent, state, LONG_AGO])
        .unwrap();
    };
    let attempt = |tx: &rusqlite::Transaction<'_>, id: i64, outcome: &str| {
        tx.prepare_cached(
            "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, started_at) \
             VALUES ('op_old' || ?1, ?1, 'orchestrator', 42, 0, 1, 'old answer', ?2, ?3)",
        )
        .unwrap()
        .execute(rusqlite::params![id, outcome, LONG_AGO])
        .unwrap();
    };
    envelope(&tx, 1, QUEUED, "worker", "queued");
    envelope(&tx, 2, UNRESOLVED, "orchestrator", "unresolved");
    attempt(&tx, 2, "unknown");
    // Open work whose envelopes are all finished and old: each keeps what it references.
    envelope(&tx, 3, "env_keep_pending", "worker", "pending");
    for id in 4..=8 {
        envelope(&tx, id, &format!("env_keep_{id}"), "worker", "acked");
    }
    tx.execute(
        "INSERT INTO handoffs (handoff_id, from_agent, to_agent, instruction, cause_envelope_id, depth, envelope_id, state, opened_at) \
         VALUES ('hof_open', 'orchestrator', 'worker', 'look into it', 4, 1, 5, 'open', ?1)",
        [LONG_AGO],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO cascades (cascade_id, route, chat_id, message_envelope_id, state, cascade, max_iters, speaker_timeout_secs, created_at, updated_at) \
         VALUES ('cas_running', 'room', 7, 6, 'running', '{}', 3, 60, ?1, ?1)",
        [LONG_AGO],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO cascade_turns (cascade_id, speaker, agent, summoned_by, envelope_id, started_at) \
         VALUES ((SELECT id FROM cascades WHERE cascade_id = 'cas_running'), 1, 'worker', 'Ann', 7, ?1)",
        [LONG_AGO],
    )
    .unwrap();
    tx.execute("UPDATE envelopes SET task_id = 'task_open' WHERE id IN (3, 8)", []).unwrap();
    tx.execute(
        "INSERT INTO tasks (task_id, chat_id, agent, route, state, revision, objective, first_envelope_id, started_by, started_source, opened_at, updated_at) \
         VALUES ('task_open', 42, 'worker', 'dm', 'open', 1, 'keep going', 8, 'Ann', 'message', ?1, ?1)",
        [LONG_AGO],
    )
    .unwrap();
    for id in 9..count + 9 {
        envelope(&tx, id, &format!("env_old{id}"), "orchestrator", "acked");
        attempt(&tx, id, "sent");
        for (from, to) in [("queued", "pending"), ("pending", "acked")] {
            tx.prepare_cached(
                "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) VALUES (?1, ?2, ?3, ?4, 'daemon')",
            )
            .unwrap()
            .execute(rusqlite::params![id, LONG_AGO, from, to])
            .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// [`fill_sqlite`]'s rows, on PostgreSQL: the same open work, and the old rows made by
/// the server in a few statements.
fn fill_postgres(schema: &support::postgres::TestSchema, count: i64) {
    let envelope_columns = "(id, trace_id, kind, chat_id, chat_type, message_id, sender_name, content, sent_at, \
                            received_at, route, agent, state, state_changed_at)";
    // An envelope's values, its id and trace id given as SQL (a number or a series' `g`).
    let envelope = |id: &str, trace: &str, agent: &str, state: &str| {
        format!(
            "{id}, {trace}, 'message', 42, 'private', {id}, 'Ann', 'old words', '{LONG_AGO}', '{LONG_AGO}', 'dm', \
             '{agent}', '{state}', '{LONG_AGO}'"
        )
    };
    let last = count + 8;
    let statements = [
        format!(
            "INSERT INTO envelopes {envelope_columns} VALUES ({}), ({}), ({})",
            envelope("1", &format!("'{QUEUED}'"), "worker", "queued"),
            envelope("2", &format!("'{UNRESOLVED}'"), "orchestrator", "unresolved"),
            envelope("3", "'env_keep_pending'", "worker", "pending"),
        ),
        format!(
            "INSERT INTO envelopes {envelope_columns} SELECT {} FROM generate_series(4, 8) AS g",
            envelope("g", "'env_keep_' || g", "worker", "acked")
        ),
        format!(
            "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, started_at) \
             VALUES ('op_old2', 2, 'orchestrator', 42, 0, 1, 'old answer', 'unknown', '{LONG_AGO}')"
        ),
        format!(
            "INSERT INTO handoffs (handoff_id, from_agent, to_agent, instruction, cause_envelope_id, depth, envelope_id, state, opened_at) \
             VALUES ('hof_open', 'orchestrator', 'worker', 'look into it', 4, 1, 5, 'open', '{LONG_AGO}')"
        ),
        format!(
            "INSERT INTO cascades (cascade_id, route, chat_id, message_envelope_id, state, cascade, max_iters, speaker_timeout_secs, created_at, updated_at) \
             VALUES ('cas_running', 'room', 7, 6, 'running', '{{}}', 3, 60, '{LONG_AGO}', '{LONG_AGO}')"
        ),
        format!(
            "INSERT INTO cascade_turns (cascade_id, speaker, agent, summoned_by, envelope_id, started_at) \
             VALUES ((SELECT id FROM cascades WHERE cascade_id = 'cas_running'), 1, 'worker', 'Ann', 7, '{LONG_AGO}')"
        ),
        "UPDATE envelopes SET task_id = 'task_open' WHERE id IN (3, 8)".to_owned(),
        format!(
            "INSERT INTO tasks (task_id, chat_id, agent, route, state, revision, objective, first_envelope_id, started_by, started_source, opened_at, updated_at) \
             VALUES ('task_open', 42, 'worker', 'dm', 'open', 1, 'keep going', 8, 'Ann', 'message', '{LONG_AGO}', '{LONG_AGO}')"
        ),
        format!(
            "INSERT INTO envelopes {envelope_columns} SELECT {} FROM generate_series(9, {last}) AS g",
            envelope("g", "'env_old' || g", "orchestrator", "acked")
        ),
        format!(
            "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, started_at) \
             SELECT 'op_old' || g, g, 'orchestrator', 42, 0, 1, 'old answer', 'sent', '{LONG_AGO}' FROM generate_series(9, {last}) AS g"
        ),
        format!(
            "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) \
             SELECT g, '{LONG_AGO}', change.from_state, change.to_state, 'daemon' \
             FROM generate_series(9, {last}) AS g, (VALUES ('queued', 'pending'), ('pending', 'acked')) AS change (from_state, to_state) \
             ORDER BY g, change.to_state DESC"
        ),
        // The ids were given: the daemon's next envelope comes after them.
        "SELECT setval(pg_get_serial_sequence('envelopes', 'id'), (SELECT max(id) FROM envelopes))::text"
            .to_owned(),
        "ANALYZE".to_owned(),
    ];
    for statement in statements {
        schema.scalar(&statement);
    }
}

/// A daemon's ledger, created and migrated, with `count` old finished envelopes in it;
/// the daemon is configured (with `env`), not started.
async fn daemon_with_old_rows(fake: &FakeTelegram, count: i64, env: &[(&str, &str)]) -> TestDaemon {
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), env);
    daemon.ledger().await.close().await;
    fill(&daemon, count);
    daemon
}

/// The one number `sql` (a `SELECT COUNT(*) …`) reads from the daemon's ledger.
fn count(daemon: &TestDaemon, sql: &str) -> i64 {
    match &daemon.ledger_at {
        TestLedger::Sqlite(path) => {
            rusqlite::Connection::open(path).unwrap().query_row(sql, [], |r| r.get(0)).unwrap()
        }
        TestLedger::Postgres(schema) => {
            schema.scalar(&format!("SELECT ({sql})::text")).expect("a count").parse().unwrap()
        }
    }
}

/// The ledger opens (and migrates) as a daemon's would, SQLite finds it whole, no row
/// references one that is gone, and each envelope left has its attempt and events:
/// a batch went whole or not at all.
async fn assert_consistent(daemon: &TestDaemon) {
    daemon.ledger().await.close().await;
    // PostgreSQL checks every reference as it is written; SQLite's file is checked here.
    if let TestLedger::Sqlite(path) = &daemon.ledger_at {
        let db = rusqlite::Connection::open(path).unwrap();
        let integrity: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(integrity, "ok");
        let dangling = count(daemon, "SELECT COUNT(*) FROM pragma_foreign_key_check");
        assert_eq!(dangling, 0, "rows reference rows that are gone");
    }
    let old = "FROM envelopes WHERE trace_id LIKE 'env_old%' AND trace_id NOT IN ('env_oldqueued', 'env_oldunresolved')";
    let envelopes = count(daemon, &format!("SELECT COUNT(*) {old}"));
    let attempts =
        count(daemon, &format!("SELECT COUNT(*) FROM attempts WHERE envelope_id IN (SELECT id {old})"));
    let events = count(
        daemon,
        &format!("SELECT COUNT(*) FROM envelope_events WHERE envelope_id IN (SELECT id {old})"),
    );
    assert_eq!((attempts, events), (envelopes, 2 * envelopes), "an envelope lost part of its story");
    for trace in [QUEUED, UNRESOLVED] {
        let kept = count(daemon, &format!("SELECT COUNT(*) FROM envelopes WHERE trace_id = '{trace}'"));
        assert_eq!(kept, 1, "{trace} is open and must stay");
    }
    assert_eq!(
        count(daemon, "SELECT COUNT(*) FROM attempts WHERE outcome = 'unknown'"),
        1,
        "the unknown attempt stays"
    );
    let open_work = [
        "SELECT COUNT(*) FROM envelopes WHERE trace_id LIKE 'env_keep%'",
        "SELECT COUNT(*) FROM handoffs WHERE handoff_id = 'hof_open'",
        "SELECT COUNT(*) FROM cascades WHERE cascade_id = 'cas_running'",
        "SELECT COUNT(*) FROM cascade_turns",
        "SELECT COUNT(*) FROM tasks WHERE task_id = 'task_open'",
    ];
    let kept: Vec<i64> = open_work.iter().map(|sql| count(daemon, sql)).collect();
    assert_eq!(kept, [6, 1, 1, 1, 1], "open work and everything it references stay");
}

fn old_envelopes(daemon: &TestDaemon) -> i64 {
    count(daemon, "SELECT COUNT(*) FROM envelopes WHERE trace_id LIKE 'env_old%'")
}

/// The count a prune's report gives `table` (a line `  TABLE   COUNT`).
fn removed(report: &str, table: &str) -> Option<i64> {
    report.lines().find_map(|line| match line.split_whitespace().collect::<Vec<_>>()[..] {
        [name, count] if name == table => count.parse().ok(),
        _ => None,
    })
}

fn prune_command(daemon: &TestDaemon, args: &[&str]) -> tokio::process::Command {
    let mut command = daemon.command();
    command.arg("ledger").arg("--config").arg(daemon.config_path()).arg("prune").args(args);
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    tokio::process::Command::from(command)
}

#[tokio::test]
async fn a_live_daemon_answers_while_ledger_prune_runs_and_nothing_open_goes() {
    let fake = FakeTelegram::start().await;
    let big_ledger = big_ledger();
    let mut daemon = daemon_with_old_rows(&fake, big_ledger, &[]).await;

    // A dry run counts and deletes nothing.
    let (ok, dry, stderr) = daemon.ledger_cli(&["prune", "--older-than", "30d", "--dry-run"]);
    assert!(ok, "{stderr}");
    assert_eq!(removed(&dry, "envelopes"), Some(big_ledger - 1), "all but the newest:\n{dry}");
    assert_eq!(old_envelopes(&daemon), big_ledger + 2);

    daemon.launch();
    let orchestrator = support::agents::session(&daemon, "orchestrator").await;
    let mut prune = prune_command(&daemon, &["--older-than", "30d"]).spawn().unwrap();
    // Under way: some old rows are gone already, and most are still there.
    let started = Instant::now();
    while old_envelopes(&daemon) == big_ledger + 2 {
        assert!(started.elapsed() < WAIT, "the prune did not begin");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    fake.push_text(ChatSpec::private(OWNER_CHAT), UserSpec::new(OWNER_ID, "Olga"), "still there?");
    let delivered = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let trace = delivered[0].meta_str("trace_id").unwrap().to_owned();
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "yes, still here", "trace_id": trace})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;
    assert!(prune.try_wait().unwrap().is_none(), "the reply went out while the prune was still running");

    let output = prune.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    // The message's rows are the newest now, so the last old envelope goes too.
    assert_eq!(removed(&stdout, "envelopes"), Some(big_ledger), "{stdout}");
    assert!(stdout.contains("not shrink"), "the report says what becomes of the space: {stdout}");
    // The queued and the unresolved one stay; the new message too.
    assert_eq!(old_envelopes(&daemon), 2);
    assert_eq!(
        daemon
            .ledger()
            .await
            .find(&switchboard::ids::TraceId::parse(&trace).unwrap())
            .await
            .unwrap()
            .map(|e| e.state.to_string()),
        Some("acked".into())
    );
    assert!(daemon.stop().success(), "{}", daemon.logs());
    assert_consistent(&daemon).await;
}

#[tokio::test]
async fn kill_9_of_a_prune_halfway_leaves_a_whole_ledger_that_a_second_prune_finishes() {
    let fake = FakeTelegram::start().await;
    let big_ledger = big_ledger();
    let daemon = daemon_with_old_rows(&fake, big_ledger, &[]).await;
    let mut prune = prune_command(&daemon, &["--older-than", "30d"]).spawn().unwrap();
    let started = Instant::now();
    loop {
        let left = old_envelopes(&daemon);
        if left <= big_ledger / 2 {
            break;
        }
        assert!(started.elapsed() < PRUNE_HALFWAY, "the prune did not get halfway ({left} left)");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    prune.kill().await.unwrap();
    let left = old_envelopes(&daemon);
    assert!(left > 3, "killed before it finished ({left} left)");
    assert_consistent(&daemon).await;

    let (ok, stdout, stderr) = daemon.ledger_cli(&["prune", "--older-than", "30d"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("removed:"), "{stdout}");
    assert_eq!(old_envelopes(&daemon), 3);
    assert_consistent(&daemon).await;
}

#[tokio::test]
async fn ledger_prune_refuses_a_duration_it_cannot_read_zero_under_an_hour_or_a_bare_m() {
    let fake = FakeTelegram::start().await;
    let daemon = daemon_with_old_rows(&fake, 10, &[]).await;
    for (duration, says) in [
        ("90", "like 90d, 12h or 90min"),
        ("2w", "like 90d, 12h or 90min"),
        ("0d", "zero"),
        ("30min", "under an hour"),
        ("3m", "months"),
    ] {
        let (ok, _, stderr) = daemon.ledger_cli(&["prune", "--older-than", duration]);
        assert!(!ok && stderr.contains(says), "{duration}: {stderr}");
    }
    assert_eq!(old_envelopes(&daemon), 12, "a refused prune deletes nothing");
}

#[tokio::test]
async fn retain_days_prunes_a_running_daemons_old_finished_rows_on_its_schedule() {
    let fake = FakeTelegram::start().await;
    let schedule =
        [("SWITCHBOARD__STORAGE__RETAIN_DAYS", "1"), ("SWITCHBOARD__STORAGE__RETENTION_INTERVAL_SECS", "1")];
    let mut daemon = daemon_with_old_rows(&fake, 1_000, &schedule).await;
    let (ok, check, stderr) = {
        let output = daemon.subcommand("check").output().unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    assert!(ok, "{stderr}");
    assert!(check.contains("retention:    prunes what finished more than 1 day(s) ago"), "{check}");

    daemon.launch();
    let started = Instant::now();
    while old_envelopes(&daemon) > 3 {
        assert!(started.elapsed() < WAIT, "no scheduled prune:\n{}", daemon.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The rows are gone once the last batch commits; the prune's report is logged after
    // it has also pruned the sessions and read the file's pages.
    daemon
        .wait_for_log("scheduled prune removed envelopes 999, attempts 999, envelope_events 1998", WAIT)
        .await;
    assert!(daemon.stop().success(), "{}", daemon.logs());
    assert_consistent(&daemon).await;
}
