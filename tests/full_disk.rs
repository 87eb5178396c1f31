//! A ledger on a disk that fills up (issue 25, item 4): the one-page readiness probe still
//! fits, but intake cannot record a batch, nor a reply its attempt. `/readyz` must say so
//! (`ledger_full`, what, and for how long) while it lasts and be ready again once space is
//! back, `/metrics` must count the failed writes, and nothing may be lost: the messages
//! arrive, once each, afterwards, and the reply can be sent again.
//!
//! On SQLite the disk is a real one: a small tmpfs mounted for the test (root only;
//! skipped with a message elsewhere), filled with a filler file, unmounted by a drop guard.
//! On PostgreSQL (`on_postgres`) the server's disk is not the daemon's, and a test cannot
//! fill the machine's: the server answers as it does when a table cannot grow, refusing
//! new envelopes and attempts with SQLSTATE `53100` (`disk_full`), until room is made.
mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::agents::*;
use support::daemon::*;
use support::disk::{Tmpfs, fill};
use support::postgres::TestSchema;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};

/// Room for the ledger as migrations leave it, and a little more.
const TMPFS_SIZE: &str = "8m";

/// The poller's backoff between batches the ledger refused reaches 16 s after a few
/// failures (30 s at most): long enough to wait for intake to come back.
const RECOVERY: Duration = Duration::from_secs(60);

/// A disk under the ledger that fills up, and room made on it again.
enum FullDisk {
    Tmpfs { tmpfs: Tmpfs, filler: Option<PathBuf> },
    Server(Arc<TestSchema>),
}

/// What PostgreSQL says when a table cannot grow, for every new row of the tables that
/// intake and a reply's attempt add to.
const SERVER_DISK_FULL: [&str; 3] = [
    "CREATE FUNCTION refuse_as_on_a_full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ \
     BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$",
    "CREATE TRIGGER full_disk BEFORE INSERT ON envelopes FOR EACH ROW EXECUTE FUNCTION refuse_as_on_a_full_disk()",
    "CREATE TRIGGER full_disk BEFORE INSERT ON attempts FOR EACH ROW EXECUTE FUNCTION refuse_as_on_a_full_disk()",
];

impl FullDisk {
    /// Starts a daemon whose ledger is on a disk this test can fill; `None` where it cannot.
    fn start_daemon(api_url: &str) -> Option<(TestDaemon, Self)> {
        if TestLedger::is_postgres_here() {
            let daemon = TestDaemon::start(api_url, "", &default_routes());
            let TestLedger::Postgres(schema) = &daemon.ledger_at else { unreachable!("chosen above") };
            let disk = Self::Server(Arc::clone(schema));
            return Some((daemon, disk));
        }
        let Some(tmpfs) = Tmpfs::mount(TMPFS_SIZE) else {
            eprintln!(
                "skipped: cannot mount a tmpfs here (not root?); this test needs a real full file system"
            );
            return None;
        };
        let database = tmpfs.path().join("ledger.db");
        let env = [("SWITCHBOARD__STORAGE__DATABASE", database.to_str().unwrap())];
        let daemon = TestDaemon::start_with_env(api_url, "", &default_routes(), &env);
        Some((daemon, Self::Tmpfs { tmpfs, filler: None }))
    }

    fn fill(&mut self) {
        match self {
            Self::Tmpfs { tmpfs, filler } => *filler = Some(fill(tmpfs.path())),
            Self::Server(schema) => schema.execute(&SERVER_DISK_FULL),
        }
    }

    fn make_room(&mut self) {
        match self {
            Self::Tmpfs { filler, .. } => std::fs::remove_file(filler.take().expect("filled")).unwrap(),
            Self::Server(schema) => {
                schema.execute(&["DROP TRIGGER full_disk ON envelopes", "DROP TRIGGER full_disk ON attempts"])
            }
        }
    }
}

fn reason<'a>(body: &'a serde_json::Value, code: &str) -> Option<&'a serde_json::Value> {
    body["reasons"].as_array().unwrap().iter().find(|reason| reason["code"] == code)
}

/// The value of the failure counter for intake on a full disk, from `/metrics`.
async fn intake_failures_on_a_full_disk(daemon: &TestDaemon) -> f64 {
    let (status, text) = get(daemon, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find(|line| {
            line.starts_with("switchboard_ledger_write_failures_total{")
                && line.contains("write=\"intake\"")
                && line.contains("reason=\"disk_full\"")
        })
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no intake disk_full counter in /metrics:\n{text}"))
}

#[tokio::test]
async fn a_full_disk_makes_the_daemon_not_ready_until_space_is_back_and_loses_nothing() {
    let fake = FakeTelegram::start().await;
    let Some((daemon, mut disk)) = FullDisk::start_daemon(&fake.api_url()) else { return };
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "before the disk filled up");
    let first = trace_id(&nth(&orchestrator, 1).await);
    assert_eq!(readiness(&daemon).await.0, 200);
    assert_eq!(intake_failures_on_a_full_disk(&daemon).await, 0.0);

    disk.fill();
    // Batches of messages until intake cannot record one: on SQLite the WAL has room for a
    // few before it must grow.
    let text = "x".repeat(3000);
    let mut pushed = 0;
    let deadline = Instant::now() + RECOVERY;
    let full = loop {
        for _ in 0..20 {
            pushed += 1;
            fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), &format!("message {pushed} {text}"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, body) = readiness(&daemon).await;
        // A SQLite checkpoint may fail first (the database file cannot grow); intake is
        // what this waits for.
        let full = reason(&body, "ledger_full").and_then(|r| r["detail"].as_str()).unwrap_or_default();
        if status == 503 && full.contains("incoming messages") {
            break body;
        }
        assert!(Instant::now() < deadline, "never not ready after {pushed} messages: {status} {body}");
    };
    let detail = reason(&full, "ledger_full").unwrap()["detail"].as_str().unwrap();
    assert!(
        detail.contains("incoming messages") && detail.contains("s;"),
        "what, and for how long: {detail}"
    );
    daemon.wait_for_log("the disk holding the ledger is full", WAIT).await;
    assert!(intake_failures_on_a_full_disk(&daemon).await >= 1.0);
    assert!(fake.pending_update_count() > 0, "Telegram keeps what was not recorded");

    // A reply cannot record its attempt either: nothing is sent, and readiness says so.
    let reply = serde_json::json!({"text": "noted", "trace_id": first});
    let (is_error, text) = orchestrator.call_tool("reply", reply.clone()).await.unwrap();
    assert!(is_error && text.starts_with("not_sent: ") && text.contains("you may reply again"), "{text}");
    let (status, body) = readiness(&daemon).await;
    let full = reason(&body, "ledger_full").and_then(|r| r["detail"].as_str()).unwrap_or_default();
    assert!(status == 503 && full.contains("send attempts"), "{body}");
    assert!(fake.sent_messages().is_empty(), "nothing was sent that could not be recorded");

    disk.make_room();
    let deadline = Instant::now() + RECOVERY;
    loop {
        let (status, body) = readiness(&daemon).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still not ready with space back: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Nothing lost, nothing twice: every message reached the agent, once.
    let delivered = orchestrator.wait_for_notifications(pushed + 1, RECOVERY).await.unwrap();
    let mut numbers: Vec<usize> = delivered
        .iter()
        .skip(1)
        .map(|n| n.content.split(' ').nth(1).and_then(|n| n.parse().ok()).expect("message N …"))
        .collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=pushed).collect::<Vec<_>>(), "each message once");
    // And the reply that could not be recorded goes out now.
    let (is_error, text) = orchestrator.call_tool("reply", reply).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await[0].text, "noted");
    assert_eq!(readiness(&daemon).await.0, 200);
    drop(orchestrator);
    drop(daemon);
}

/// A daemon on PostgreSQL whose earlier session was shown one envelope and has ended (and
/// the daemon has noticed): what the two tests below open a session against. `None`, with
/// a word, elsewhere: a test cannot choose which of SQLite's writes a full disk refuses.
struct ShownToAnEndedSession {
    fake: FakeTelegram,
    daemon: TestDaemon,
    schema: Arc<TestSchema>,
    shown: String,
}

async fn shown_to_an_ended_session() -> Option<ShownToAnEndedSession> {
    if !TestLedger::is_postgres_here() {
        eprintln!("skipped: runs on PostgreSQL, where the test decides which writes the server refuses");
        return None;
    }
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let TestLedger::Postgres(schema) = &daemon.ledger_at else { unreachable!("PostgreSQL, above") };
    let schema = Arc::clone(schema);
    let earlier = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "shown to the earlier session");
    let shown = trace_id(&nth(&earlier, 1).await);
    assert!(earlier.close().await.unwrap().success());
    daemon.wait_for_log("agent session disconnected", WAIT).await;
    Some(ShownToAnEndedSession { fake, daemon, schema, shown })
}

/// A server that can take no new row, and a session that opens meanwhile (PostgreSQL only:
/// a test cannot choose which of SQLite's writes a full disk refuses). Updating envelopes
/// still works, but the session's audit row cannot be added. Once the ledger has counted
/// the envelopes as delivered to the session, the session gets them: it is not ended for
/// an audit row, so the agent is not starved while the disk is full, and each opening
/// counts a delivery that happened.
#[tokio::test]
async fn a_session_opened_while_no_row_can_be_added_is_served_and_counted_once() {
    let Some(ShownToAnEndedSession { fake, daemon, schema, shown }) = shown_to_an_ended_session().await
    else {
        return;
    };

    schema.execute(&[
        SERVER_DISK_FULL[0],
        "CREATE TRIGGER full_disk BEFORE INSERT ON agent_sessions FOR EACH ROW EXECUTE FUNCTION \
         refuse_as_on_a_full_disk()",
    ]);
    let agent = plugin_builder(&daemon, "orchestrator").start().await.expect("plugin starts");
    let received = agent.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(trace_id(&received[0]), shown);
    assert_eq!(received[0].meta_str("redelivered"), Some("true"));
    daemon.wait_for_log("the session's opening could not be recorded", WAIT).await;
    // Served, not ended and opened again: one more delivery, counted once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.notifications().len(), 1);
    let ledger = daemon.ledger().await;
    let envelope = ledger.find(&switchboard::ids::TraceId::parse(&shown).unwrap()).await.unwrap().unwrap();
    ledger.close().await;
    assert_eq!(envelope.deliveries, 2, "the earlier session's, and this one's");

    // The session works: the reply goes out.
    let (is_error, text) =
        agent.call_tool("reply", serde_json::json!({"text": "noted", "trace_id": shown})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await[0].text, "noted");
}

/// A server that can change no envelope (an update writes a new version of its row, which
/// a full disk can refuse as it refuses a new row), and a session that opens meanwhile
/// (PostgreSQL only, as above). Taking back what an earlier session was shown fails as one
/// statement, so the opening ends before it hands or counts anything, however often the
/// plugin opens again. Once room is made the agent gets the envelope once, and the ledger
/// counts the earlier session's delivery and this one's, none for the failed openings.
#[tokio::test]
async fn a_session_opened_while_no_envelope_can_be_changed_gets_it_once_room_is_made() {
    let Some(ShownToAnEndedSession { fake: _fake, daemon, schema, shown }) =
        shown_to_an_ended_session().await
    else {
        return;
    };

    schema.execute(&[
        SERVER_DISK_FULL[0],
        "CREATE TRIGGER full_disk BEFORE UPDATE ON envelopes FOR EACH ROW EXECUTE FUNCTION \
         refuse_as_on_a_full_disk()",
    ]);
    let agent = plugin_builder(&daemon, "orchestrator").start().await.expect("plugin starts");
    daemon.wait_for_log("agent session failed", WAIT).await;
    // Let the plugin open again a few times against the full disk.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(agent.notifications().is_empty(), "nothing handed over while the ledger could not say so");
    schema.execute(&["DROP TRIGGER full_disk ON envelopes"]);

    let received = agent.wait_for_notifications(1, RECOVERY).await.unwrap();
    assert_eq!(trace_id(&received[0]), shown);
    assert_eq!(received[0].meta_str("redelivered"), Some("true"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(agent.notifications().len(), 1, "handed over once");
    let ledger = daemon.ledger().await;
    let envelope = ledger.find(&switchboard::ids::TraceId::parse(&shown).unwrap()).await.unwrap().unwrap();
    ledger.close().await;
    assert_eq!(envelope.deliveries, 2, "the earlier session's, and this one's");
}
