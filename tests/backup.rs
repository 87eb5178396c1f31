//! `switchboard ledger backup` as an operator meets it: a copy taken while the daemon
//! receives and answers, which switchboard's own commands then read as the ledger it was;
//! and a backup that cannot be made (its name taken, its disk full) or is killed halfway
//! leaves nothing a restore could take for one. On PostgreSQL (`tests/on_postgres.rs`
//! runs this suite again) the command points at `pg_dump` and the SQLite tests have
//! nothing to copy.

mod support;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::agents::{WAIT, owner, session};
use support::daemon::*;
use support::disk::{Tmpfs, fill};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};
use switchboard::ledger::sqlite::staging_path;

/// `switchboard ledger backup target` for the daemon's ledger, run beside it without
/// blocking the test's runtime (and the fake Bot API on it).
fn backup_command(daemon: &TestDaemon, target: &Path) -> tokio::process::Command {
    let mut command = daemon.command();
    command.args(["ledger", "--config"]).arg(daemon.config_path()).arg("backup").arg(target);
    tokio::process::Command::from(command)
}

/// Runs [`backup_command`] to its end.
async fn backup_to(daemon: &TestDaemon, target: &Path) -> Output {
    backup_command(daemon, target).output().await.expect("run switchboard ledger backup")
}

/// `switchboard ledger show` run against `copy` in place of the daemon's ledger: the
/// state it reports for `trace_id`.
fn state_in_copy(daemon: &TestDaemon, copy: &Path, trace_id: &str) -> String {
    let output = daemon
        .command()
        .env("SWITCHBOARD__STORAGE__DATABASE", copy)
        .args(["ledger", "--config"])
        .arg(daemon.config_path())
        .args(["show", trace_id])
        .output()
        .expect("run switchboard ledger show");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "show {trace_id} in the copy: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let state = stdout
        .lines()
        .find_map(|line| line.strip_prefix("state:"))
        .and_then(|rest| rest.split_whitespace().next());
    state.unwrap_or_else(|| panic!("no state in: {stdout}")).to_owned()
}

#[tokio::test]
async fn a_backup_taken_while_the_daemon_works_holds_what_it_had_recorded_and_the_daemon_goes_on() {
    if TestLedger::is_postgres_here() {
        return; // pg_dump's: see the test below
    }
    let fake = Arc::new(FakeTelegram::start().await);
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    for n in 0..6 {
        fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), &format!("before the backup {n}"));
    }
    let traces: Vec<String> = orchestrator
        .wait_for_notifications(6, WAIT)
        .await
        .unwrap()
        .iter()
        .map(|n| n.meta_str("trace_id").unwrap().to_owned())
        .collect();
    for trace in &traces[..3] {
        let (is_error, text) =
            orchestrator.call_tool("reply", json!({"text": "answered", "trace_id": trace})).await.unwrap();
        assert!(!is_error, "{text}");
    }
    fake.wait_for_sent(3, WAIT).await;

    // Messages keep arriving while the copy is made.
    let pusher = {
        let fake = Arc::clone(&fake);
        std::thread::spawn(move || {
            for n in 0..40 {
                fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), &format!("during the backup {n}"));
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("switchboard-backup.db");
    let output = backup_to(&daemon, &copy).await;
    pusher.join().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(copy.exists() && !staging_path(&copy).exists(), "{stdout}");

    // The copy is the ledger as it was: what was answered is acked there, what waited
    // still waits, and switchboard's own commands read it.
    for trace in &traces[..3] {
        assert_eq!(state_in_copy(&daemon, &copy, trace), "acked", "{trace}");
    }
    for trace in &traces[3..] {
        assert_eq!(state_in_copy(&daemon, &copy, trace), "pending", "{trace}");
    }

    // The daemon went on: everything that arrived meanwhile reaches the agent, and a
    // waiting message is still answered.
    orchestrator.wait_for_notifications(46, WAIT).await.unwrap();
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "after the backup", "trace_id": traces[3]}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(4, WAIT).await;
}

#[tokio::test]
async fn the_ledger_a_killed_daemon_left_backs_up_whole() {
    if TestLedger::is_postgres_here() {
        return;
    }
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let mut updates = Vec::new();
    for n in 0..5 {
        updates.push(fake.push_text(
            ChatSpec::private(OWNER_CHAT),
            owner(),
            &format!("before the crash {n}"),
        ));
    }
    for update in &updates {
        fake.wait_until_confirmed(*update, WAIT).await;
    }
    // Its last commits are still in the WAL, which nobody has recovered yet.
    daemon.kill9();
    let wal = switchboard::ledger::sqlite::wal_path(&daemon.database());
    assert!(std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0), "the killed daemon left no WAL");

    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("after-the-crash.db");
    let output = backup_to(&daemon, &copy).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("backed up 5 envelope"), "{stdout}");
}

#[tokio::test]
async fn a_backup_that_cannot_be_made_leaves_no_file_that_looks_like_one() {
    if TestLedger::is_postgres_here() {
        return;
    }
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let update = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "recorded");
    fake.wait_until_confirmed(update, WAIT).await;

    // The name is taken: yesterday's backup stays as it was.
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken.db");
    std::fs::write(&taken, b"yesterday's backup").unwrap();
    let output = backup_to(&daemon, &taken).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("already exists"), "{output:?}");
    assert_eq!(std::fs::read(&taken).unwrap(), b"yesterday's backup");

    // The disk fills up halfway: an error that says so, and neither the copy nor its
    // staging file is left.
    let Some(tmpfs) = Tmpfs::mount("1m") else {
        eprintln!("skipped the full disk: cannot mount a tmpfs here (not root?)");
        return;
    };
    fill(tmpfs.path());
    let copy = tmpfs.path().join("copy.db");
    let output = backup_to(&daemon, &copy).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("full"), "{stderr}");
    assert!(!copy.exists() && !staging_path(&copy).exists(), "{stderr}");
}

#[tokio::test]
async fn on_postgresql_the_command_points_at_pg_dump() {
    if !TestLedger::is_postgres_here() {
        return;
    }
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    let output = backup_to(&daemon, &copy).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("pg_dump"), "{output:?}");
    assert!(!copy.exists());
}

/// Envelopes of [`kill_9_of_a_backup_halfway_leaves_no_backup_and_the_next_one_is_whole`]'s
/// ledger, each with this much text: about 150 MB, which takes a debug build's backup
/// long enough to be killed halfway.
const BIG_LEDGER: i64 = 36_000;
const BIG_TEXT: usize = 4_000;

#[tokio::test]
async fn kill_9_of_a_backup_halfway_leaves_no_backup_and_the_next_one_is_whole() {
    if TestLedger::is_postgres_here() {
        return;
    }
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    daemon.ledger().await.close().await;
    {
        let mut db = rusqlite::Connection::open(daemon.database()).unwrap();
        let tx = db.transaction().unwrap();
        let text = "x".repeat(BIG_TEXT);
        for id in 1..=BIG_LEDGER {
            tx.prepare_cached(
                "INSERT INTO envelopes (id, trace_id, kind, chat_id, chat_type, message_id, sender_name, content, \
                 sent_at, received_at, route, agent, state, state_changed_at) \
                 VALUES (?1, printf('env_%010d', ?1), 'message', 42, 'private', ?1, 'Ann', ?2, ?3, ?3, 'dm', \
                 'orchestrator', 'acked', ?3)",
            )
            .unwrap()
            .execute(rusqlite::params![id, text, "2026-01-01T00:00:00.000Z"])
            .unwrap();
        }
        tx.commit().unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    let staging = staging_path(&copy);
    let mut backup = backup_command(&daemon, &copy).spawn().unwrap();
    // Halfway: the staging file has grown, and the backup has not finished.
    let grown = |path: &Path| std::fs::metadata(path).is_ok_and(|m| m.len() > 16 * 1024 * 1024);
    let started = std::time::Instant::now();
    while !grown(&staging) {
        assert!(backup.try_wait().unwrap().is_none(), "the backup ended before it could be killed halfway");
        assert!(started.elapsed() < Duration::from_secs(60), "the backup never wrote 16 MB");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    backup.kill().await.unwrap();
    assert!(!copy.exists(), "a backup killed halfway left a file under the backup's name");

    // The next backup replaces what was left, and is whole.
    let output = backup_to(&daemon, &copy).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("{BIG_LEDGER} envelope")), "{stdout}");
    assert!(!staging.exists());
    assert_eq!(state_in_copy(&daemon, &copy, &format!("env_{BIG_LEDGER:010}")), "acked");
}
