//! Intake that never stops (issue 6), against the real daemon and the fake Bot API: every
//! update is decoded on its own, what cannot be decoded is kept raw, service messages are
//! no work, a reused update id is not a duplicate, a busy ledger or a full disk is waited
//! out, and a token Telegram keeps refusing stops the daemon loudly.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use support::agents::session;
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, UserSpec};
use switchboard::ids::TraceId;
use switchboard::ledger::{EnvelopeState, StoredEnvelope};

const WAIT: Duration = Duration::from_secs(20);

fn owner() -> UserSpec {
    UserSpec::new(OWNER_ID, "Olga").with_username("olga")
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A message object from the owner in their DM, as JSON text, with `content` spliced in
/// verbatim (so it may hold what `serde_json::Value` cannot).
fn owner_message(message_id: i32, content: &str) -> String {
    format!(
        r#"{{"message": {{"message_id": {message_id}, "date": {now}, "chat": {{"id": {OWNER_CHAT}, "type": "private", "first_name": "Olga"}}, "from": {{"id": {OWNER_ID}, "is_bot": false, "first_name": "Olga", "username": "olga"}}, {content}}}}}"#,
        now = unix_now()
    )
}

async fn wait_for_rows(daemon: &TestDaemon, n: usize) -> Vec<StoredEnvelope> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = daemon.envelopes().await;
        if rows.len() >= n {
            return rows;
        }
        assert!(Instant::now() < deadline, "expected {n} rows, have {}:\n{}", rows.len(), daemon.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn raw_update(daemon: &TestDaemon, trace_id: &str) -> Option<String> {
    let ledger = daemon.ledger().await;
    let raw = ledger.raw_update(&TraceId::parse(trace_id).unwrap()).await.unwrap();
    ledger.close().await;
    raw
}

fn summary(rows: &[StoredEnvelope]) -> Vec<(i64, EnvelopeState)> {
    rows.iter().map(|e| (e.update_id.unwrap_or_default(), e.state)).collect()
}

/// The level of a text log line (`2026-… DEBUG target: message`).
fn level(line: &str) -> &str {
    line.split_whitespace().nth(1).unwrap_or_default()
}

/// Every log line that contains `needle` is at debug or trace.
fn only_at_debug(logs: &str, needle: &str) {
    for line in logs.lines().filter(|line| line.contains(needle)) {
        assert!(matches!(level(line), "DEBUG" | "TRACE"), "{needle:?} logged above debug:\n{line}");
    }
}

#[tokio::test]
async fn a_reaction_that_makes_teloxide_panic_is_recorded_and_intake_goes_on() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let dm = ChatSpec::private(OWNER_CHAT);
    let before = fake.push_text(&dm, owner(), "before the reaction");
    // Neither `user` nor `actor_chat`: teloxide 0.17 unwraps a None decoding it.
    let reaction = fake.push_raw_update(json!({"message_reaction": {
        "chat": {"id": FORUM_CHAT, "type": "supergroup", "title": "Ops forum", "is_forum": true},
        "message_id": 7, "date": unix_now(),
        "old_reaction": [], "new_reaction": [{"type": "emoji", "emoji": "👍"}],
    }}));
    let after = fake.push_text(&dm, owner(), "after the reaction");

    let rows = wait_for_rows(&daemon, 3).await;
    // Undecodable rather than ignored: teloxide could not read it, and switchboard does not
    // guess from raw JSON what an update would have been; the raw text keeps it all.
    assert_eq!(
        summary(&rows),
        [
            (before, EnvelopeState::Queued),
            (reaction, EnvelopeState::Undecodable),
            (after, EnvelopeState::Queued)
        ]
    );
    assert_eq!((rows[1].chat_id, rows[1].message_id, rows[1].agent.as_deref()), (FORUM_CHAT, 7, None));
    let raw = raw_update(&daemon, &rows[1].trace_id).await.expect("the raw update is kept");
    assert!(raw.contains("message_reaction") && raw.contains(&reaction.to_string()), "{raw}");
    let (ok, out, err) = daemon.ledger_cli(&["list", "--state", "undecodable"]);
    assert!(ok && out.contains(rows[1].trace_id.as_str()) && out.contains("(1 envelope(s))"), "{out}{err}");
    let (ok, out, err) = daemon.ledger_cli(&["show", &rows[1].trace_id]);
    assert!(
        ok && out.contains("raw update (as Telegram sent it):") && out.contains("\"message_reaction\""),
        "{out}{err}"
    );
    fake.wait_until_confirmed(after, WAIT).await;

    // A restart neither panics nor records the reaction again.
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", daemon.logs());
    daemon.restart();
    let next = fake.push_text(&dm, owner(), "after the restart");
    let rows = wait_for_rows(&daemon, 4).await;
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[3].update_id, Some(next));
    let logs = daemon.logs();
    // The decoder's panic is caught quietly: no panic report, no failed subsystem.
    assert!(!logs.contains("panicked at") && !logs.contains("subsystem failed"), "{logs}");
    assert!(logs.contains(&format!("update_id={reaction}")), "{logs}");
}

#[tokio::test]
async fn undecodable_updates_are_kept_raw_beside_their_batch_and_no_text_is_logged_above_debug() {
    let fake = FakeTelegram::start().await;
    let dm = ChatSpec::private(OWNER_CHAT);
    // One batch: the daemon starts after everything is queued.
    let good = fake.push_text(&dm, owner(), "good message one");
    let surrogate =
        fake.push_raw_update_text(&owner_message(900, r#""text": "secret surrogate text \ud800""#));
    let broken = fake.push_raw_update_text(&owner_message(901, r#""text": "secret broken text \q""#));
    let also_good = fake.push_text(&dm, owner(), "good message two");
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());

    let rows = wait_for_rows(&daemon, 4).await;
    assert_eq!(
        summary(&rows),
        [
            (good, EnvelopeState::Queued),
            (surrogate, EnvelopeState::Undecodable),
            (broken, EnvelopeState::Undecodable),
            (also_good, EnvelopeState::Queued),
        ]
    );
    assert_eq!((rows[1].chat_id, rows[1].message_id), (OWNER_CHAT, 900), "what can be read is kept");
    let raw = raw_update(&daemon, &rows[1].trace_id).await.expect("raw text");
    assert!(raw.contains(r#""secret surrogate text \ud800""#), "{raw}");
    let raw = raw_update(&daemon, &rows[2].trace_id).await.expect("raw text");
    assert!(raw.contains(r#""secret broken text \q""#), "{raw}");
    fake.wait_until_confirmed(also_good, WAIT).await;

    daemon.wait_for_log(&format!("update_id={broken}"), WAIT).await;
    let logs = daemon.logs();
    for id in [surrogate, broken] {
        let warned = logs.lines().any(|l| level(l) == "WARN" && l.contains(&format!("update_id={id}")));
        assert!(warned, "the warn line names update {id}:\n{logs}");
    }
    // The test's log filter includes switchboard's debug output, so the texts do reach the
    // log, at debug only.
    assert!(logs.lines().any(|l| level(l) == "DEBUG" && l.contains("secret surrogate text")), "{logs}");
    for text in ["secret surrogate text", "secret broken text", "good message"] {
        only_at_debug(&logs, text);
    }
}

#[tokio::test]
async fn service_messages_and_live_location_edits_are_ignored_and_never_handed_to_an_agent() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    let now = unix_now();
    let forum = json!({"id": FORUM_CHAT, "type": "supergroup", "title": "Ops forum", "is_forum": true});
    let dm = json!({"id": OWNER_CHAT, "type": "private", "first_name": "Olga"});
    let olga = json!({"id": OWNER_ID, "is_bot": false, "first_name": "Olga"});
    let ivan = json!({"id": 7, "is_bot": false, "first_name": "Ivan"});
    let location = json!({"latitude": 52.52, "longitude": 13.40, "live_period": 900});

    let joined = fake.push_raw_update(json!({"message": {
        "message_id": 50, "date": now, "chat": forum, "from": ivan, "new_chat_members": [ivan]}}));
    let pinned = fake.push_raw_update(json!({"message": {
        "message_id": 51, "date": now, "chat": dm, "from": olga,
        "pinned_message": {"message_id": 49, "date": now, "chat": dm, "text": "remember this"}}}));
    let shared = fake.push_raw_update(json!({"message": {
        "message_id": 52, "date": now, "chat": dm, "from": olga, "location": location}}));
    let moved = fake.push_raw_update(json!({"edited_message": {
        "message_id": 52, "date": now, "edit_date": now + 30, "chat": dm, "from": olga, "location": location}}));
    let text = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "where are you?");

    // The agent gets the two messages that are work, and nothing else.
    let delivered = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    assert!(delivered[0].content.starts_with("📍 location "), "{}", delivered[0].content);
    assert_eq!(delivered[1].content, "where are you?");
    let rows = wait_for_rows(&daemon, 5).await;
    assert_eq!(
        summary(&rows),
        [
            (joined, EnvelopeState::Ignored),
            (pinned, EnvelopeState::Ignored),
            (shared, EnvelopeState::Pending),
            (moved, EnvelopeState::Ignored),
            (text, EnvelopeState::Pending),
        ]
    );
    let notes: Vec<_> = rows.iter().map(|e| e.note.as_deref()).collect();
    assert_eq!(
        notes,
        [
            Some("service message: new_chat_members"),
            Some("service message: pinned_message"),
            None,
            Some("live location update"),
            None
        ]
    );
    // Ignored is final, and none was ever handed to a session: no notification can follow.
    for ignored in rows.iter().filter(|e| e.state == EnvelopeState::Ignored) {
        assert_eq!((ignored.route.as_deref(), ignored.agent.as_deref(), ignored.deliveries), (None, None, 0));
    }
    assert_eq!(orchestrator.notifications().len(), 2);
    orchestrator.close().await.unwrap();
}

/// A text holding U+0000 (which PostgreSQL refuses in text, and which no chat shows) is
/// recorded and handed to the agent like any other, the character replaced, on either
/// backend; the message after it too. It never stops the daemon.
#[tokio::test]
async fn a_message_holding_a_nul_character_is_recorded_and_handed_over_and_intake_goes_on() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    let dm = ChatSpec::private(OWNER_CHAT);
    let nul = fake.push_text(&dm, owner(), "a\u{0}b");
    let after = fake.push_text(&dm, owner(), "after the nul");

    let delivered = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    let first = &delivered[0].content;
    assert!(first.starts_with('a') && first.ends_with('b') && !first.contains('\0'), "{first:?}");
    assert_eq!(delivered[1].content, "after the nul");
    let rows = wait_for_rows(&daemon, 2).await;
    assert_eq!(summary(&rows), [(nul, EnvelopeState::Pending), (after, EnvelopeState::Pending)]);
    assert!(rows[0].text.as_deref().is_some_and(|text| !text.contains('\0')), "{:?}", rows[0].text);
    fake.wait_until_confirmed(after, WAIT).await;
    assert!(daemon.is_running(), "{}", daemon.logs());
    orchestrator.close().await.unwrap();
}

/// A second before PostgreSQL's earliest time (4714-11-24 BC), which teloxide reads.
const BEFORE_POSTGRES: i64 = -210_866_803_201;
/// 10000-01-01T00:00:00Z: the first second past SQLite's four-digit years, which teloxide
/// reads too.
const PAST_YEAR_9999: i64 = 253_402_300_800;

/// Messages dated out of the years both ledgers hold (Telegram's `date` is any integer on
/// the wire; PostgreSQL refuses a time before 4714 BC, SQLite's text cannot be read back
/// past the year 9999), one of them undecodable, are recorded with their date clamped
/// into those years and handed to the agent like any other, on either backend; the
/// message after them too. None stops the daemon.
#[tokio::test]
async fn messages_dated_out_of_every_ledgers_years_are_recorded_and_handed_over_and_intake_goes_on() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    let dm = ChatSpec::private(OWNER_CHAT);
    let early =
        fake.push_message_content(&dm, owner(), json!({"text": "too early", "date": BEFORE_POSTGRES}));
    let late = fake.push_message_content(&dm, owner(), json!({"text": "too late", "date": PAST_YEAR_9999}));
    // Undecodable (a lone surrogate): its date is read leniently.
    let undecodable = fake.push_raw_update_text(&format!(
        r#"{{"message": {{"message_id": 902, "date": {BEFORE_POSTGRES}, "chat": {{"id": {OWNER_CHAT}, "type": "private", "first_name": "Olga"}}, "text": "\ud800"}}}}"#
    ));
    let after = fake.push_text(&dm, owner(), "after them");

    let delivered = orchestrator
        .wait_for_notifications(3, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.logs()));
    let shown: Vec<(&str, Option<&str>)> =
        delivered.iter().map(|n| (n.content.as_str(), n.meta_str("ts"))).collect();
    assert_eq!(shown[0], ("too early", Some("0000-01-01T00:00:00.000Z")));
    assert_eq!(shown[1], ("too late", Some("9999-12-31T23:59:59.000Z")));
    assert_eq!(shown[2].0, "after them");
    let rows = wait_for_rows(&daemon, 4).await;
    assert_eq!(
        summary(&rows),
        [
            (early.update_id, EnvelopeState::Pending),
            (late.update_id, EnvelopeState::Pending),
            (undecodable, EnvelopeState::Undecodable),
            (after, EnvelopeState::Pending),
        ]
    );
    assert_eq!(rows[2].sent_at, rows[0].sent_at, "the undecodable one is clamped alike");
    fake.wait_until_confirmed(after, WAIT).await;
    assert!(daemon.is_running(), "{}", daemon.logs());
    orchestrator.close().await.unwrap();
}

#[tokio::test]
async fn a_reused_update_id_with_new_content_is_stored_and_a_re_poll_is_not() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let first = owner_message(60, r#""text": "first under this id""#);
    let second = owner_message(61, r#""text": "second under this id""#);
    let id = fake.push_raw_update_text(&first);
    wait_for_rows(&daemon, 1).await;
    fake.wait_until_confirmed(id, WAIT).await;

    // After a week of silence Telegram may start again from an id it used before.
    fake.reuse_update_id(id, &second);
    let rows = wait_for_rows(&daemon, 2).await;
    let contents: Vec<_> = rows.iter().map(|e| (e.update_id, e.content.as_str(), e.state)).collect();
    assert_eq!(
        contents,
        [
            (Some(id), "first under this id", EnvelopeState::Queued),
            (Some(id), "second under this id", EnvelopeState::Queued)
        ]
    );

    // The very same updates served again are re-polls: stored once already.
    fake.reuse_update_id(id, &first);
    fake.reuse_update_id(id, &second);
    let marker = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "marker");
    let rows = wait_for_rows(&daemon, 3).await;
    // The poller came back after the batch with the marker, which the re-polls preceded:
    // all of them are recorded (or not) by now.
    fake.wait_for_poll_after(marker, WAIT).await;
    let rows_after = daemon.envelopes().await;
    assert_eq!(summary(&rows_after), summary(&rows));
    assert_eq!(
        rows_after.iter().map(|e| e.update_id).collect::<Vec<_>>(),
        [Some(id), Some(id), Some(marker)]
    );
    assert_eq!(fake.pending_update_count(), 0);
}

#[tokio::test]
async fn a_ledger_locked_past_the_busy_timeout_is_waited_out() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let dm = ChatSpec::private(OWNER_CHAT);
    fake.push_text(&dm, owner(), "before the lock");
    wait_for_rows(&daemon, 1).await;

    // Another process takes the write lock and keeps it past the daemon's 10 s busy
    // timeout (e.g. an operator's sqlite3 or psql shell left in a transaction).
    let holder = daemon.hold_write_lock();
    let during = fake.push_text(&dm, owner(), "while the ledger is locked");
    // Intake waits for the lock between tries, not in SQLite's busy handler on the
    // daemon's one runtime thread: the daemon answers meanwhile. It holds the update once
    // Telegram served it, and from then on tries to record it.
    fake.wait_until_served(during, WAIT).await;
    let asked = Instant::now();
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap();
    let health = client.get(format!("http://{}/healthz", daemon.api_addr())).send().await;
    assert!(
        health.as_ref().is_ok_and(|r| r.status().is_success()) && asked.elapsed() < Duration::from_secs(2),
        "/healthz while intake waits for the lock: {health:?} after {:?}",
        asked.elapsed()
    );
    assert!(
        !daemon.logs().contains("the ledger is locked"),
        "still within the busy timeout:\n{}",
        daemon.logs()
    );
    daemon.wait_for_log("the ledger is locked by another connection", Duration::from_secs(30)).await;
    assert!(daemon.is_running(), "a busy ledger is no reason to stop:\n{}", daemon.logs());
    let line = daemon.logs().lines().find(|l| l.contains("the ledger is locked")).unwrap().to_owned();
    assert_eq!(level(&line), "ERROR", "{line}");
    assert!(fake.pending_update_count() > 0, "the offset did not move");

    holder.release();
    let rows = wait_for_rows(&daemon, 2).await;
    assert_eq!(rows[1].update_id, Some(during));
    assert!(daemon.is_running());
}

/// `launcher` runs the daemon in a mount namespace of its own, on a 4 MB tmpfs at `disk`.
fn tmpfs_launcher(disk: &Path) -> Vec<String> {
    let script = r#"mount -t tmpfs -o size=4m switchboard-test "$0" && exec "$@""#;
    ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]
        .iter()
        .map(|arg| arg.to_string())
        .chain(std::iter::once(disk.display().to_string()))
        .collect()
}

/// Whether this machine lets an unprivileged process mount a tmpfs in a namespace of its
/// own (user namespaces may be disabled, e.g. in some CI containers).
fn private_tmpfs_available() -> bool {
    let probe = tempfile::tempdir().unwrap();
    let mut launcher = tmpfs_launcher(probe.path());
    launcher.push("true".into());
    Command::new(&launcher[0]).args(&launcher[1..]).status().is_ok_and(|status| status.success())
}

#[tokio::test]
async fn a_full_disk_is_waited_out() {
    if !private_tmpfs_available() {
        eprintln!(
            "skipped: cannot mount a private tmpfs (unshare --user --mount); ledger::tests covers SQLITE_FULL"
        );
        return;
    }
    let fake = FakeTelegram::start().await;
    let disk = tempfile::tempdir().unwrap();
    let database = disk.path().join("ledger.db");
    let launcher = tmpfs_launcher(disk.path());
    let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
    let mut daemon = TestDaemon::start_launched(
        &launcher,
        &fake.api_url(),
        "",
        &default_routes(),
        &[("SWITCHBOARD__STORAGE__DATABASE", &database.display().to_string())],
    );
    // The tmpfs exists only in the daemon's namespace; /proc/PID/root is the way in for
    // plain files. (SQLite resolves that link to a path in this namespace, so the ledger
    // itself is watched through the daemon's log and the offsets it confirms.)
    let pid = daemon.pid().expect("running");
    let filler = PathBuf::from(format!("/proc/{pid}/root{}", disk.path().join("filler").display()));
    let recorded = |update_id: i64| format!("envelope recorded update_id={update_id} ");
    let dm = ChatSpec::private(OWNER_CHAT);
    let before = fake.push_text(&dm, owner(), "before the disk filled up");
    daemon.wait_for_log(&recorded(before), WAIT).await;

    fill(&filler);
    // The WAL keeps the room it already has, so the first messages may still be recorded:
    // push until intake cannot record one.
    // Intake's line: the checkpointer, which may find the disk full first, says so at warn.
    let full = "the disk holding the ledger is full (recording a batch)";
    let text = "x".repeat(3000);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut during = Vec::new();
    while !daemon.logs().contains(full) {
        assert!(Instant::now() < deadline, "intake never found the disk full:\n{}", daemon.logs());
        during.push(fake.push_text(&dm, owner(), &format!("while the disk is full {text}")));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(daemon.is_running(), "a full disk is no reason to stop:\n{}", daemon.logs());
    let line = daemon.logs().lines().find(|l| l.contains(full)).unwrap().to_owned();
    assert_eq!(level(&line), "ERROR", "{line}");
    let last = *during.last().unwrap();
    assert!(!daemon.logs().contains(&recorded(last)));
    assert!(fake.pending_update_count() > 0, "the offset did not move");

    std::fs::remove_file(&filler).unwrap();
    daemon.wait_for_log(&recorded(last), Duration::from_secs(40)).await;
    fake.wait_until_confirmed(last, WAIT).await;
    assert!(daemon.is_running());
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", daemon.logs());
    for update_id in std::iter::once(before).chain(during) {
        assert_eq!(daemon.logs().matches(&recorded(update_id)).count(), 1, "each message once");
    }
}

/// Writes `path` until the file system says it is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write_all(&chunk).and_then(|()| file.sync_all()) {
            Ok(()) => continue,
            Err(e) if e.raw_os_error() == Some(28) => return, // ENOSPC
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
}

#[tokio::test]
async fn a_token_refused_for_too_long_stops_the_daemon_with_an_error() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        "",
        &default_routes(),
        &[
            ("SB_TEST_BOT_TOKEN", "123456:a-revoked-token-for-this-test"),
            ("SWITCHBOARD__TELEGRAM__UNAUTHORIZED_EXIT_SECS", "2"),
        ],
    );
    let status = daemon.wait_for_exit(Duration::from_secs(30)).await;
    let logs = daemon.logs();
    assert!(!status.success(), "a refused token is a failure: {status}\n{logs}");
    let refusals: Vec<_> = logs.lines().filter(|l| l.contains("Telegram refuses the bot token")).collect();
    assert!(refusals.len() >= 2, "every retry is an error:\n{logs}");
    assert!(refusals.iter().all(|l| level(l) == "ERROR"), "{logs}");
    let last = logs.lines().rfind(|l| l.contains("has refused the bot token for 2 s")).expect("a final line");
    assert_eq!(level(last), "ERROR", "{last}");
    assert!(fake.unauthorized_requests() >= 2);
}
