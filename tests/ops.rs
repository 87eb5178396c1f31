//! Running the daemon as an operator would, and getting it slightly wrong: a second daemon
//! on the same ledger, `switchboard ledger` beside the daemon, a mistyped ledger path,
//! two agents sharing a secret, a local API open to the network. And the ledger's files
//! stay readable by their owner only.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::json;
use support::daemon::*;
use support::mcp::ChannelClient;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, UserSpec};
use switchboard::ledger::sqlite::LedgerLock;
use switchboard::ledger::{EnvelopeState, files};

const WAIT: Duration = Duration::from_secs(20);

/// A second daemon stops at the lock in milliseconds; this only bounds a test that
/// would otherwise hang if it did not.
const SECOND_DAEMON_LIMIT: Duration = Duration::from_secs(30);

fn owner() -> UserSpec {
    UserSpec::new(OWNER_ID, "Olga").with_username("olga")
}

async fn orchestrator(daemon: &TestDaemon) -> ChannelClient {
    let (address_var, address) = daemon.address_env();
    ChannelClient::start(
        daemon.config_path(),
        "orchestrator",
        &[("SB_TEST_ORCHESTRATOR_SECRET", ORCHESTRATOR_SECRET), (address_var, &address)],
    )
    .await
    .expect("channel plugin starts")
}

/// Runs `command` to its end (it must end by itself); (output, stderr).
async fn finish(command: std::process::Command) -> (Output, String) {
    let output = tokio::time::timeout(SECOND_DAEMON_LIMIT, tokio::process::Command::from(command).output())
        .await
        .expect("the command ends by itself")
        .expect("the command runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// (outcome of every attempt, state, number of history events) of one envelope.
async fn ledger_story(daemon: &TestDaemon, trace_id: &str) -> (Vec<String>, EnvelopeState, usize) {
    let ledger = daemon.ledger().await;
    let envelope = ledger
        .find(&switchboard::ids::TraceId::parse(trace_id).unwrap())
        .await
        .unwrap()
        .expect("envelope exists");
    let outcomes =
        ledger.attempts_for(envelope.id).await.unwrap().into_iter().map(|a| a.outcome.to_string()).collect();
    let events = ledger.events_for(envelope.id).await.unwrap().len();
    ledger.close().await;
    (outcomes, envelope.state, events)
}

#[tokio::test]
async fn a_second_daemon_on_the_same_ledger_exits_naming_the_lock_and_leaves_the_first_ones_send_alone() {
    let fake = FakeTelegram::start().await;
    // The send is held by Telegram for longer than a second daemon's start takes on a loaded
    // machine, well inside the send timeout, so it is still in flight while the second
    // daemon starts and then confirmed.
    let mut daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        "",
        &default_routes(),
        &[("SWITCHBOARD__TELEGRAM__SEND_TIMEOUT_SECS", "30")],
    );
    let orchestrator = orchestrator(&daemon).await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "answer me once");
    let delivered = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let trace = delivered[0].meta_str("trace_id").unwrap().to_owned();
    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(12)));

    let first_pid = daemon.pid().unwrap();
    let reply = orchestrator.call_tool("reply", json!({"text": "the one answer", "trace_id": trace}));
    let second_daemon = async {
        fake.wait_for_sent(1, WAIT).await;
        let before = ledger_story(&daemon, &trace).await;
        assert_eq!(before.0, ["in_flight"], "the reply is in flight");
        assert_eq!(before.1, EnvelopeState::Pending);

        let (output, stderr) = finish(daemon.subcommand("run")).await;
        assert!(!output.status.success(), "a second daemon must not run:\n{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one error line:\n{stderr}");
        let lock = LedgerLock::path_for(&daemon.database());
        assert!(lines[0].contains(&lock.display().to_string()), "names the lock file: {stderr}");
        assert!(lines[0].contains(&format!("pid {first_pid}")), "names the holder: {stderr}");

        let after = ledger_story(&daemon, &trace).await;
        assert_eq!(after, before, "the second daemon touched nothing: the attempt is still in flight");
    };
    let ((is_error, text), ()) = tokio::join!(async { reply.await.unwrap() }, second_daemon);

    assert!(!is_error, "the first daemon settles its own send: {text}");
    let (outcomes, state, _) = ledger_story(&daemon, &trace).await;
    assert_eq!(outcomes, ["sent"]);
    assert_eq!(state, EnvelopeState::Acked);
    assert_eq!(fake.sent_messages().len(), 1);
    assert!(!daemon.logs().contains("marked unresolved"), "{}", daemon.logs());
    assert!(daemon.stop().success(), "{}", daemon.logs());
}

#[tokio::test]
async fn after_the_first_daemon_stops_or_dies_the_next_one_takes_the_lock() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    assert!(daemon.stop().success());
    daemon.restart();
    daemon.kill9();
    // The kernel released the lock of the killed process: no stale lock to clean up.
    daemon.restart();
    assert!(daemon.stop().success(), "{}", daemon.logs());
}

#[tokio::test]
async fn ledger_commands_work_while_the_daemon_runs() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = orchestrator(&daemon).await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "seen by the operator");
    let trace = orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]
        .meta_str("trace_id")
        .unwrap()
        .to_owned();

    for args in [&["list"][..], &["stats"], &["show", &trace]] {
        let (ok, out, err) = daemon.ledger_cli(args);
        assert!(ok, "ledger {args:?} while the daemon runs:\n{out}{err}");
        assert!(out.contains("pending"), "ledger {args:?}: {out}");
    }
    let (ok, out, err) = daemon.ledger_cli(&["list"]);
    assert!(ok && out.contains(&trace), "{out}{err}");

    // A blank reason is refused like a missing one, and nothing changes.
    let (ok, out, err) = daemon.ledger_cli(&["reconcile", &trace, "--delivered", "--reason", "  "]);
    assert!(!ok && err.contains("reason"), "{out}{err}");

    // --config may follow the ledger command too.
    let mut after = daemon.command();
    after.args(["ledger", "list", "--state", "pending", "--config"]).arg(daemon.config_path());
    let output = after.output().unwrap();
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && listed.contains(&trace),
        "{listed}{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // A report that cannot be written (a full disk) is one line and a failure, not a panic.
    let mut full = daemon.command();
    full.args(["ledger", "--config"]).arg(daemon.config_path()).arg("list");
    full.stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap());
    let output = full.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("could not write the output") && !stderr.contains("panicked"), "{stderr}");

    // And the daemon goes on: the envelope is still answerable.
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "still here"})).await.unwrap();
    assert!(!is_error, "{text}");
}

/// A listing filtered by a misspelled agent, route or room would print nothing, which reads
/// as "none": it is refused, naming what the configuration declares. A name the ledger
/// still holds rows of (a route renamed since) is history, and answered.
#[tokio::test]
async fn a_listing_by_a_name_nobody_knows_is_refused_and_one_only_in_history_is_answered() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "for the record");
    eventually(WAIT, "the message recorded", || {
        daemon.ledger_cli(&["list", "--route", "owner-dm"]).1.contains("owner-dm")
    })
    .await;

    for args in [
        &["list", "--agent", "orchestratr"][..],
        &["list", "--route", "owner_dm"],
        &["handoffs", "--agent", "wroker"],
    ] {
        let (ok, out, err) = daemon.ledger_cli(args);
        assert!(!ok, "ledger {args:?} is refused: {out}{err}");
        assert!(err.contains(args[2]) && err.contains("declared"), "names it and what is declared: {err}");
    }
    let (_, _, err) = daemon.ledger_cli(&["list", "--agent", "orchestratr"]);
    assert!(err.contains("orchestrator, worker"), "{err}");
    let (ok, out, err) = daemon.ledger_cli(&["cascades", "--room", "lobby"]);
    assert!(!ok && err.contains("lobby"), "no room is declared: {out}{err}");
    // Declared names with nothing (yet) to show are an empty answer.
    for args in [&["list", "--agent", "worker"][..], &["handoffs", "--agent", "worker"]] {
        let (ok, out, err) = daemon.ledger_cli(args);
        assert!(ok, "ledger {args:?}: {out}{err}");
    }

    // The route renamed: its old name is in the ledger's history only, and still answered.
    let config = std::fs::read_to_string(daemon.config_path()).unwrap();
    std::fs::write(daemon.config_path(), config.replace("name = \"owner-dm\"", "name = \"owner-direct\""))
        .unwrap();
    let (ok, out, err) = daemon.ledger_cli(&["list", "--route", "owner-dm"]);
    assert!(ok && out.contains("owner-dm"), "{out}{err}");
    let (ok, out, err) = daemon.ledger_cli(&["list", "--route", "owner-dm", "--state", "acked"]);
    assert!(ok && out.contains("(0 envelope(s))"), "{out}{err}");
    std::fs::write(daemon.config_path(), config).unwrap();
}

#[tokio::test]
async fn the_ledger_its_wal_files_and_its_lock_are_private_and_loose_ones_are_tightened() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let update = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "written to the WAL");
    fake.wait_until_confirmed(update, WAIT).await;
    let database = daemon.database();
    let all = files::database_files(&database);
    for path in all.iter().chain([&LedgerLock::path_for(&database)]) {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }

    // An older version, or a restored backup, left them readable by everyone.
    daemon.kill9();
    for path in &all {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (output, stderr) = finish(daemon.subcommand("check")).await;
    assert!(output.status.success(), "{stderr}");
    for path in &all {
        assert!(
            stderr.contains(&format!(
                "warning: {}: storage.database: {} has mode 0644",
                daemon.config_path().display(),
                path.display()
            )),
            "check reports {}:\n{stderr}",
            path.display()
        );
        assert_eq!(mode(path), 0o644, "check changes nothing");
    }

    daemon.restart();
    for path in &all {
        assert_eq!(mode(path), 0o600, "{} tightened at start-up", path.display());
    }
    daemon.wait_for_log(&format!("ledger file {} had mode 0644", database.display()), WAIT).await;
    let (output, stderr) = finish(daemon.subcommand("check")).await;
    assert!(output.status.success() && !stderr.contains("warning"), "{stderr}");
}

#[tokio::test]
async fn ledger_commands_refuse_a_database_that_does_not_exist_and_create_nothing() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let listing =
        || std::fs::read_dir(daemon.dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>();
    let before = listing();

    let database = daemon.database().display().to_string();
    for args in [
        &["list"][..],
        &["stats"],
        &["show", "env_abcdefghij"],
        &["reconcile", "env_abcdefghij", "--delivered", "--reason", "x"],
    ] {
        let (ok, out, err) = daemon.ledger_cli(args);
        assert!(!ok, "ledger {args:?} on a missing database must fail:\n{out}{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one error line: {err}");
        assert!(lines[0].contains("storage.database") && lines[0].contains(&database), "{err}");
        assert!(lines[0].contains("does not exist"), "{err}");
    }
    // A relative path is relative to the working directory, and the message says which.
    let (output, stderr) = finish({
        let mut command = daemon.command();
        command
            .current_dir(daemon.dir.path())
            .env("SWITCHBOARD__STORAGE__DATABASE", "ledgr.db")
            .args(["ledger", "--config"])
            .arg(daemon.config_path())
            .arg("list");
        command
    })
    .await;
    assert!(!output.status.success());
    assert!(
        stderr.contains("ledgr.db") && stderr.contains(&daemon.dir.path().display().to_string()),
        "{stderr}"
    );
    assert_eq!(listing(), before, "nothing was created");

    // The daemon itself still creates a new ledger, and then the commands work.
    daemon.launch();
    let (ok, out, err) = daemon.ledger_cli(&["list"]);
    assert!(ok, "{out}{err}");
}

/// A ledger path in a folder that does not exist (a typo, a volume not mounted): `check`
/// warns, and `run` refuses in one line naming the key and the folder, creating nothing.
#[tokio::test]
async fn a_ledger_in_a_folder_that_does_not_exist_is_named_by_check_and_run() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let folder = daemon.dir.path().join("not-mounted");
    let database = folder.join("ledger.db");
    for subcommand in ["check", "run"] {
        let mut command = daemon.subcommand(subcommand);
        command.env("SWITCHBOARD__STORAGE__DATABASE", &database);
        let (output, stderr) = finish(command).await;
        assert_eq!(output.status.success(), subcommand == "check", "{subcommand}: {stderr}");
        let line = stderr.lines().find(|line| line.contains("storage.database")).unwrap_or_default();
        assert!(
            line.contains(&folder.display().to_string()) && line.contains("does not exist"),
            "{subcommand}: {stderr}"
        );
    }
    assert!(!folder.exists(), "nothing was created");
}

/// `switchboard ledger` reads a ledger only: another program's SQLite database at
/// `storage.database`, or an empty file, is refused in one line and left as it was (its
/// bytes, its mode, its journal).
#[tokio::test]
async fn ledger_commands_refuse_a_file_that_is_not_a_ledger_and_leave_it_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let database = daemon.database();
    let other = rusqlite::Connection::open(&database).unwrap();
    other
        .execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users (name) VALUES ('ada');")
        .unwrap();
    drop(other);
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o644)).unwrap();
    let foreign = std::fs::read(&database).unwrap();

    for args in [&["list"][..], &["stats"], &["show", "env_abcdefghij"]] {
        let (ok, out, err) = daemon.ledger_cli(args);
        assert!(!ok, "ledger {args:?} on another program's database must fail:\n{out}{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one error line: {err}");
        assert!(lines[0].contains("not a switchboard ledger"), "{err}");
        assert!(lines[0].contains(&database.display().to_string()), "{err}");
    }
    // Nor does the daemon make it a ledger.
    let (output, stderr) = finish(daemon.subcommand("run")).await;
    assert!(!output.status.success(), "run on another program's database must fail:\n{stderr}");
    assert!(
        stderr.contains("not a switchboard ledger") && stderr.contains(&database.display().to_string()),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&database).unwrap(), foreign, "not a byte of it changed");
    let mode = std::fs::metadata(&database).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "nor its mode");

    std::fs::write(&database, b"").unwrap();
    let (ok, out, err) = daemon.ledger_cli(&["stats"]);
    assert!(!ok && err.contains("not a switchboard ledger"), "an empty file is no ledger:\n{out}{err}");
    assert_eq!(std::fs::metadata(&database).unwrap().len(), 0, "and stays empty");
}

/// Runs `check` and `run` on `daemon`'s configuration with `env`; both must fail with
/// one line naming both agents' keys and never the secret.
async fn refused_for_a_shared_secret(daemon: &TestDaemon, env: &[(&str, &str)], also: &str) {
    for subcommand in ["check", "run"] {
        let mut command = daemon.subcommand(subcommand);
        command.envs(env.iter().copied());
        let (output, stderr) = finish(command).await;
        assert!(!output.status.success(), "{subcommand} must refuse a shared secret:\n{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{subcommand}: one error line:\n{stderr}");
        for expected in ["switchboard.toml", "agents.orchestrator.token_env", "agents.worker.token_env", also]
        {
            assert!(lines[0].contains(expected), "{subcommand}: the line says {expected:?}: {stderr}");
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            !stderr.contains(ORCHESTRATOR_SECRET) && !stdout.contains(ORCHESTRATOR_SECRET),
            "never the value"
        );
    }
    assert!(!daemon.database().exists(), "a refused configuration touches no ledger");
}

#[tokio::test]
async fn two_agents_with_the_same_secret_are_a_configuration_error() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    // Two variables that hold the same value.
    refused_for_a_shared_secret(&daemon, &[("SB_TEST_WORKER_SECRET", ORCHESTRATOR_SECRET)], "same secret")
        .await;

    // Two agents that name the same variable.
    let config = std::fs::read_to_string(daemon.config_path()).unwrap();
    let shared = config
        .replace("token_env = \"SB_TEST_WORKER_SECRET\"", "token_env = \"SB_TEST_ORCHESTRATOR_SECRET\"");
    assert_ne!(config, shared);
    std::fs::write(daemon.config_path(), shared).unwrap();
    refused_for_a_shared_secret(&daemon, &[], "SB_TEST_ORCHESTRATOR_SECRET").await;
}

#[tokio::test]
async fn a_local_api_open_to_the_network_without_tls_is_refused_unless_called_private() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let (output, stderr) = finish(daemon.subcommand("check")).await;
    assert!(output.status.success() && !stderr.contains("warning"), "loopback is quiet:\n{stderr}");

    let open = "0.0.0.0:0".to_owned();
    let daemon = daemon.with_env("SWITCHBOARD__API__LISTEN", &open);
    for command in ["check", "run"] {
        let (output, stderr) = finish(daemon.subcommand(command)).await;
        assert!(!output.status.success(), "{command}: no TLS beyond loopback:\n{stderr}");
        assert!(
            stderr.contains("api.listen") && stderr.contains("api.tls"),
            "{command} says how to fix it:\n{stderr}"
        );
    }

    // On a private network (a container's bridge), the operator's word makes it a warning.
    let mut daemon = daemon.with_env("SWITCHBOARD__API__PLAINTEXT_BEYOND_LOOPBACK", "true");
    let (output, stderr) = finish(daemon.subcommand("check")).await;
    assert!(output.status.success(), "a warning, not an error:\n{stderr}");
    let warning = format!("api.listen: {open} is not a loopback address");
    let expected = format!("warning: {}: {warning}", daemon.config_path().display());
    assert!(stderr.contains(&expected) && stderr.contains("no TLS"), "{stderr}");

    daemon.launch();
    daemon.wait_for_log(&warning, WAIT).await;
    let logs = daemon.logs();
    let line = logs.lines().find(|l| l.contains(&warning)).unwrap();
    assert!(line.contains("WARN"), "logged at warn: {line}");
}
