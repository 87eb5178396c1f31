//! Operating switchboard (DESIGN.md §12, issue 10): the demo as a user runs it, readiness
//! against the real daemon and the fake Bot API (a revoked token, a second poller, a
//! webhook, a ledger that takes no writes), `/metrics` parsed as Prometheus text with its
//! counters checked against a scenario, SIGHUP with a good and a bad file, and the systemd
//! unit checked by `systemd-analyze` where it exists.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use prometheus_parse::{LineInfo, Scrape, Value};
use serde_json::json;
use support::agents::*;
use support::daemon::*;
use switchboard::agents::api::wire::{AckRequest, ErrorCode, ReplyRequest};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, UserSpec};
use switchboard::ledger::{EnvelopeState, ListFilter};

// ---- the demo ----

#[test]
fn the_demo_runs_every_step_as_narrated_and_keeps_its_ledger_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("demo");
    // Run where a deployment's overrides are set (a Docker image sets the ledger's path):
    // the demo reads its own file alone.
    let deployed_ledger = dir.path().join("deployed.db");
    let output = Command::new(BIN)
        .args(["demo", "--keep"])
        .arg(&keep)
        .env_remove("RUST_LOG")
        .env("SWITCHBOARD__STORAGE__DATABASE", &deployed_ledger)
        .env("SWITCHBOARD__TELEGRAM__SEND_TIMEOUT_SECS", "not a number")
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the demo failed ({}):\n{stdout}\n{stderr}", output.status);
    for narrated in [
        "── 1. A message in, a reply out",
        "refused, ambiguous",
        "refused: already_delegated",
        "Budget exhausted: 4 of 4 agent turns used (4 replies).",
        "✓ exactly 4 turns were given, each ended by its reply, and the exchange is budget_exhausted",
        "kill -9 ",
        "unresolved: the send in flight at the kill is now unknown",
        "(redelivered)",
        "✓ nothing lost, nothing duplicated",
        "unreconciled attempts: 0",
    ] {
        assert!(stdout.contains(narrated), "the demo did not say {narrated:?}:\n{stdout}");
    }
    assert!(!stdout.contains('✗'), "{stdout}");
    assert!(!deployed_ledger.exists(), "the deployment's ledger was never touched");

    // What --keep leaves behind is a ledger the operator's commands read.
    let config = keep.join("switchboard.toml");
    let listed = Command::new(BIN).args(["ledger", "--config"]).arg(&config).arg("list").output().unwrap();
    let listing = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    assert!(listing.contains("Is the staging deploy healthy?") && listing.contains("acked"), "{listing}");
}

// ---- readiness ----

/// Polls `/readyz` until it answers `status` (with a reason of `code`, for a 503).
async fn wait_for_readiness(daemon: &TestDaemon, status: u16, code: Option<&str>) -> serde_json::Value {
    wait_for_readiness_at(daemon.api_addr(), status, code).await
}

/// [`wait_for_readiness`] at `address`.
async fn wait_for_readiness_at(
    address: std::net::SocketAddr,
    status: u16,
    code: Option<&str>,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (now, body) = readiness_at(address).await;
        let codes: Vec<&str> =
            body["reasons"].as_array().unwrap().iter().filter_map(|r| r["code"].as_str()).collect();
        if now == status && code.is_none_or(|code| codes.contains(&code)) {
            return body;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {now} {body}, expected {status} {code:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn healthcheck(daemon: &TestDaemon) -> (bool, String) {
    let output = daemon.subcommand("healthcheck").output().unwrap();
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

/// `api.health_listen` on one daemon (SQLite): the operator's routes answer there as they
/// do at the local API.
#[tokio::test]
async fn the_health_address_answers_as_the_local_api_does() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        "",
        &default_routes(),
        &[("SWITCHBOARD__API__HEALTH_LISTEN", "127.0.0.1:0")],
    );
    let health =
        switchboard::app::reported_health_address(&daemon.logs()).expect("the health address is logged");
    assert_ne!(health, daemon.api_addr());
    assert_eq!(get_at(health, "/healthz").await.0, 200);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    let ready = wait_for_readiness_at(health, 200, None).await;
    let at_the_api = readiness(&daemon).await.1;
    for key in ["ready", "reasons", "intake"] {
        assert_eq!(ready[key], at_the_api[key], "the same report at both addresses: {ready} {at_the_api}");
    }
    assert_eq!(ready["ready"], true, "{ready}");
    assert!(ready.get("replica").is_none(), "no replica on SQLite: {ready}");
    let (_, metrics) = get_at(health, "/metrics").await;
    assert!(metrics.contains("switchboard_ready 1"), "{metrics}");
    assert!(!metrics.contains("switchboard_standing_by"), "no replica on SQLite: {metrics}");

    // The sessions held here, by agent: none yet, then the one that connected, at both
    // addresses, and none again once it has gone.
    assert_eq!(ready["sessions"], json!([]), "{ready}");
    let orchestrator = session(&daemon, "orchestrator").await;
    assert_eq!(readiness_at(health).await.1["sessions"], json!(["orchestrator"]));
    assert_eq!(readiness(&daemon).await.1["sessions"], json!(["orchestrator"]));
    drop(orchestrator);
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = readiness(&daemon).await.1;
        if ready["sessions"] == json!([]) {
            break;
        }
        assert!(Instant::now() < deadline, "a session that ended is still listed: {ready}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn readiness_follows_what_telegram_answers_and_recovers_when_the_cause_is_gone() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let (status, _) = get(&daemon, "/healthz").await;
    assert_eq!(status, 200);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    let ready = wait_for_readiness(&daemon, 200, None).await;
    assert_eq!(ready["ready"], json!(true), "{ready}");
    let (ok, text) = healthcheck(&daemon);
    assert!(ok, "{text}");

    let unauthorized = r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#;
    let webhook = r#"{"ok":false,"error_code":409,"description":"Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"}"#;
    // (the reason, the answer, how many polls in a row get it, whether to run the
    // healthcheck command meanwhile). The poller backs off 0.5 s, 1 s, 2 s, 4 s between
    // refusals, then Telegram serves it again: four refusals leave 7.5 s to run a process.
    let causes = [
        ("telegram_unauthorized", Fault::Raw { status: 401, body: unauthorized.into() }, 4, true),
        ("telegram_conflict", Fault::Conflict, 3, false),
        ("telegram_webhook_active", Fault::Raw { status: 409, body: webhook.into() }, 3, false),
    ];
    for (code, fault, polls, run_healthcheck) in causes {
        for _ in 0..polls {
            fake.fail_get_updates(fault.clone());
        }
        let body = wait_for_readiness(&daemon, 503, Some(code)).await;
        assert_eq!(body["ready"], json!(false), "{body}");
        let detail = body["reasons"][0]["detail"].as_str().unwrap();
        assert!(!detail.contains(switchboard::fake_bot_api::TEST_TOKEN), "{detail}");
        if run_healthcheck {
            let (ok, text) = healthcheck(&daemon);
            assert!(!ok && text.contains(code), "healthcheck while {code}: {text}");
        }
        wait_for_readiness(&daemon, 200, None).await;
    }
    let (ok, text) = healthcheck(&daemon);
    assert!(ok, "{text}");
}

/// `healthcheck --config` asks the daemon that runs, which runs with the configuration it
/// started with: a file on disk that a reload refused (a route naming an agent nobody
/// declared) does not make that daemon unhealthy.
#[tokio::test]
async fn the_healthcheck_passes_a_running_daemon_whatever_a_refused_file_on_disk_says() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    fake.wait_for_get_updates_calls(1, WAIT).await;
    wait_for_readiness(&daemon, 200, None).await;
    let good = std::fs::read_to_string(daemon.config_path()).unwrap();
    rewrite_config(&daemon, |text| text.replace("agent = \"worker\"\n", "agent = \"ghost\"\n"));
    daemon.signal("HUP");
    daemon.wait_for_log("configuration reload refused", WAIT).await;
    let (ok, text) = healthcheck(&daemon);
    assert!(ok, "a mistake outside [api] fails no health check: {text}");

    // An [api] address it cannot read is still an error: there is nothing to ask.
    rewrite_config(&daemon, |text| text.replace("[api]\n", "[api]\nhealth_listen = \"nowhere\"\n"));
    let (ok, text) = healthcheck(&daemon);
    assert!(!ok && text.contains("api.health_listen"), "{text}");
    std::fs::write(daemon.config_path(), good).unwrap();
}

/// Makes files immutable with `chattr +i` and undoes it on drop, even when the test fails:
/// an immutable file cannot be removed with the test's directory.
struct Immutable(Vec<PathBuf>);

impl Immutable {
    /// `None` when this machine cannot (not root, or a file system without attributes).
    fn set(paths: &[PathBuf]) -> Option<Self> {
        let done = Command::new("chattr").arg("+i").args(paths).status().is_ok_and(|s| s.success());
        let guard = Self(paths.to_vec());
        done.then_some(guard)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").args(&self.0).status();
    }
}

#[tokio::test]
async fn readiness_is_503_while_the_ledger_file_takes_no_writes() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    wait_for_readiness(&daemon, 200, None).await;
    // The tests run as root, which file modes do not stop: an immutable file stops root
    // too, including writes through descriptors the daemon already holds.
    let database = daemon.database();
    let wal = PathBuf::from(format!("{}-wal", database.display()));
    let Some(immutable) = Immutable::set(&[database.clone(), wal]) else {
        eprintln!("skipped: `chattr +i` is not available here (not root, or no file attributes)");
        return;
    };
    let body = wait_for_readiness(&daemon, 503, Some("ledger_not_writable")).await;
    assert!(body["reasons"][0]["detail"].as_str().unwrap().contains("refused a write"), "{body}");
    drop(immutable);
    wait_for_readiness(&daemon, 200, None).await;
    assert!(daemon.is_running(), "{}", daemon.logs());
}

#[tokio::test]
async fn readiness_is_503_while_another_writer_holds_the_ledger() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    wait_for_readiness(&daemon, 200, None).await;
    let holder = rusqlite::Connection::open(daemon.database()).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let body = wait_for_readiness(&daemon, 503, Some("ledger_not_writable")).await;
    assert!(body["reasons"][0]["detail"].as_str().unwrap().contains("locked"), "{body}");
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    wait_for_readiness(&daemon, 200, None).await;
}

// ---- metrics ----

async fn scrape(daemon: &TestDaemon) -> Scrape {
    let (status, text) = get(daemon, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    // Every line is a comment or a sample the parser reads: nothing hand-formatted slipped in.
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        assert!(!matches!(LineInfo::parse(line), LineInfo::Ignored), "not Prometheus text: {line:?}");
    }
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("Prometheus text")
}

/// A series' value: a counter's or gauge's value, a histogram's count; 0 when absent.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|sample| sample.metric == metric)
        .filter(|sample| labels.iter().all(|(key, value)| sample.labels.get(key) == Some(*value)))
        .map(|sample| match &sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => {
                buckets.iter().find(|b| b.less_than.is_infinite()).map_or(0.0, |b| b.count)
            }
            Value::Summary(_) => panic!("{metric} is a summary"),
        })
        .collect();
    assert!(matching.len() <= 1, "{metric} {labels:?} matches {} series", matching.len());
    matching.first().copied().unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_count_exactly_what_a_scenario_did() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = api_client(&daemon, "orchestrator");
    let mut stream = orchestrator.open_session().await.unwrap();
    let before = scrape(&daemon).await;
    assert_eq!(value(&before, "switchboard_sessions_connected", &[]), 1.0);
    assert_eq!(value(&before, "switchboard_ready", &[]), 1.0);
    assert!(before.docs.contains_key("switchboard_attempts_total"), "{:?}", before.docs.keys());

    // Two messages for the orchestrator and one from a chat no route names.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "Quokka one");
    fake.push_text(ChatSpec::group(GROUP_CHAT + 1, "Nobody's"), UserSpec::new(77, "Stray"), "Quokka stray");
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "Quokka two");
    let (one, two) = (next_envelope(&mut stream).await, next_envelope(&mut stream).await);
    for envelope in [&one, &two] {
        orchestrator.shown(&envelope.trace_id).await.unwrap();
    }
    // Refusals: an unnamed reply with two waiting, an ack of an envelope that is not ours.
    let ambiguous = orchestrator.reply(&ReplyRequest::new("which?", None)).await.unwrap_err();
    assert_eq!(ambiguous.code(), Some(ErrorCode::Ambiguous));
    let unknown = orchestrator.ack(&AckRequest { trace_id: "env_0000000000".into(), note: None }).await;
    assert_eq!(unknown.unwrap_err().code(), Some(ErrorCode::UnknownTraceId));
    // Attempts: the first reply meets a 429 once (an attempt not sent, a wait), then both go.
    fake.fail_send_message(Fault::TooManyRequests { retry_after: 1 });
    for envelope in [&one, &two] {
        orchestrator.reply(&ReplyRequest::new("done", Some(envelope.trace_id.clone()))).await.unwrap();
    }
    // With nothing left, an unnamed reply has nothing to answer.
    let nothing = orchestrator.reply(&ReplyRequest::new("more?", None)).await.unwrap_err();
    assert_eq!(nothing.code(), Some(ErrorCode::NothingPending));

    let after = scrape(&daemon).await;
    let moved = |metric: &str, labels: &[(&str, &str)]| {
        value(&after, metric, labels) - value(&before, metric, labels)
    };
    /// (metric, labels, how much it moved)
    type Series<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);
    let expected: &[Series<'_>] = &[
        ("switchboard_envelopes_recorded_total", &[("state", "queued")], 2.0),
        ("switchboard_envelopes_recorded_total", &[("state", "unrouted")], 1.0),
        ("switchboard_attempts_total", &[("outcome", "sent")], 2.0),
        ("switchboard_attempts_total", &[("outcome", "not_sent")], 1.0),
        ("switchboard_attempts_total", &[("outcome", "unknown")], 0.0),
        ("switchboard_refusals_total", &[("tool", "reply"), ("reason", "ambiguous")], 1.0),
        ("switchboard_refusals_total", &[("tool", "reply"), ("reason", "nothing_pending")], 1.0),
        ("switchboard_refusals_total", &[("tool", "ack"), ("reason", "unknown_trace_id")], 1.0),
        ("switchboard_rate_limit_waits_total", &[("method", "sendMessage")], 1.0),
        ("switchboard_rate_limit_wait_seconds_total", &[("method", "sendMessage")], 1.0),
        ("switchboard_bot_api_errors_total", &[("method", "sendMessage"), ("kind", "rate_limited")], 1.0),
        ("switchboard_outbound_hop_seconds", &[], 3.0),
        ("switchboard_inbound_hop_seconds", &[("kind", "message")], 2.0),
        ("switchboard_envelopes", &[("state", "acked")], 2.0),
        ("switchboard_envelopes", &[("state", "unrouted")], 1.0),
        ("switchboard_envelopes", &[("state", "pending")], 0.0),
    ];
    for (metric, labels, want) in expected {
        assert_eq!(moved(metric, labels), *want, "{metric} {labels:?}");
    }
    let total_refusals: f64 = after
        .samples
        .iter()
        .filter(|s| s.metric == "switchboard_refusals_total")
        .map(|s| if let Value::Counter(v) = s.value { v } else { 0.0 })
        .sum();
    assert_eq!(total_refusals, 3.0, "no refusal counted that the scenario did not make");
    assert_eq!(value(&after, "switchboard_unreconciled_attempts", &[]), 0.0);
    assert_eq!(value(&after, "switchboard_handoffs", &[("state", "open")]), 0.0);

    // No message content and no secret in the exposition.
    let (_, text) = get(&daemon, "/metrics").await;
    for secret in ["Quokka", "which?", ORCHESTRATOR_SECRET, switchboard::fake_bot_api::TEST_TOKEN] {
        assert!(!text.contains(secret), "/metrics shows {secret:?}");
    }
    assert_eq!(state_of(&daemon, &one.trace_id).await, EnvelopeState::Acked);
}

/// A plugin that dies (here `kill -9`: nothing said goodbye) closes its connection, and
/// the daemon notices at once: its session ends and the gauge says so, long before a
/// heartbeat could have found out.
#[tokio::test]
async fn a_killed_plugin_ends_its_session_at_once_and_the_gauge_follows() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let agent = session(&daemon, "orchestrator").await;
    assert_eq!(value(&scrape(&daemon).await, "switchboard_sessions_connected", &[]), 1.0);
    let pid = agent.pid().expect("the plugin runs");
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let heartbeat = Duration::from_secs(switchboard::agents::api::wire::HEARTBEAT_INTERVAL_SECS);
    daemon.wait_for_log("agent session disconnected", heartbeat / 2).await;
    assert_eq!(value(&scrape(&daemon).await, "switchboard_sessions_connected", &[]), 0.0);
}

// ---- reload ----

fn rewrite_config(daemon: &TestDaemon, edit: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(daemon.config_path()).unwrap();
    std::fs::write(daemon.config_path(), edit(text)).unwrap();
}

#[tokio::test]
async fn sighup_applies_a_good_file_and_keeps_the_running_configuration_on_a_bad_one() {
    const NEW_CHAT: i64 = -4_000_222;
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    // A SIGHUP as soon as the daemon answers is a reload, never the signal's default end.
    daemon.signal("HUP");
    daemon.wait_for_log("nothing that applies in place changed", WAIT).await;
    assert!(daemon.is_running(), "{}", daemon.logs());
    let chat = ChatSpec::group(NEW_CHAT, "Late team");
    let user = UserSpec::new(88, "Lena");
    fake.push_text(&chat, &user, "before the reload");
    daemon.wait_for_log("no route matches this chat", WAIT).await;

    // A good file: a route for the new chat, and a new listen address (which cannot change
    // under a running daemon).
    rewrite_config(&daemon, |text| {
        text.replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"")
            + &format!("\n[[routes]]\nname = \"late-team\"\nchat_id = {NEW_CHAT}\nagent = \"worker\"\n")
    });
    daemon.signal("HUP");
    daemon.wait_for_log("route 'late-team' added: chat -4000222 → worker", WAIT).await;
    let logs = daemon.logs();
    assert!(logs.contains("configuration reloaded: route 'late-team' added"), "{logs}");
    assert!(logs.contains("api.listen") && logs.contains("needs a restart"), "{logs}");
    fake.push_text(&chat, &user, "after the reload");

    let ledger = daemon.ledger().await;
    let routed = async {
        loop {
            let rows = ledger.list(&ListFilter { limit: 100, ..ListFilter::default() }).await.unwrap();
            let late: Vec<_> = rows.into_iter().filter(|e| e.chat_id == NEW_CHAT).collect();
            if late.len() == 2 {
                return late;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let late = tokio::time::timeout(WAIT, routed).await.expect("both messages recorded");
    assert_eq!(late[0].state, EnvelopeState::Unrouted);
    assert_eq!((late[1].state, late[1].route.as_deref()), (EnvelopeState::Queued, Some("late-team")));
    // Still on the old address: the API answers where it did.
    assert_eq!(get(&daemon, "/healthz").await.0, 200);

    // A bad file: refused with the usual one-line error; the running routes stay.
    let good = std::fs::read_to_string(daemon.config_path()).unwrap();
    rewrite_config(&daemon, |text| text.replace("agent = \"worker\"\n", "agent = \"ghost\"\n"));
    daemon.signal("HUP");
    daemon.wait_for_log("configuration reload refused", WAIT).await;
    let logs = daemon.logs();
    let refusal = logs.lines().find(|line| line.contains("configuration reload refused")).unwrap();
    assert!(
        refusal.contains("unknown agent 'ghost'") && refusal.contains("the running configuration stays"),
        "{refusal}"
    );
    fake.push_text(&chat, &user, "after the bad file");
    let kept = async {
        loop {
            let rows = ledger.list(&ListFilter { limit: 100, ..ListFilter::default() }).await.unwrap();
            if let Some(row) = rows.iter().find(|e| e.content == "after the bad file") {
                return row.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let row = tokio::time::timeout(WAIT, kept).await.expect("recorded");
    assert_eq!(row.route.as_deref(), Some("late-team"), "the good file's routes still apply");
    ledger.close().await;
    std::fs::write(daemon.config_path(), good).unwrap();
}

/// A file `switchboard check` would refuse is refused by a reload too, even though it
/// loads: here a new agent whose secret variable the daemon's environment does not hold.
/// Applied, it would have been what the next restart fails on; refused, nothing of it
/// applies (not even its new route), the running routes keep working, and the error says
/// that a variable set since the start needs a restart.
#[tokio::test]
async fn sighup_refuses_a_file_whose_secrets_the_daemon_cannot_read_as_a_restart_would() {
    const NEW_CHAT: i64 = -4_000_333;
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let good = std::fs::read_to_string(daemon.config_path()).unwrap();
    rewrite_config(&daemon, |text| {
        text + &format!(
            "\n[[routes]]\nname = \"late-team\"\nchat_id = {NEW_CHAT}\nagent = \"worker\"\n\
             \n[agents.scout]\ntoken_env = \"SB_TEST_SCOUT_SECRET_NEVER_SET\"\n"
        )
    });
    daemon.signal("HUP");
    daemon.wait_for_log("configuration reload refused", WAIT).await;
    let logs = daemon.logs();
    let refusal = logs.lines().find(|line| line.contains("configuration reload refused")).unwrap();
    assert!(refusal.contains("SB_TEST_SCOUT_SECRET_NEVER_SET"), "names the variable: {refusal}");
    assert!(refusal.contains("restart"), "says a restart with it set is needed: {refusal}");
    assert!(refusal.contains("the running configuration stays"), "{refusal}");
    assert!(!logs.contains("configuration reloaded"), "{logs}");
    let metrics = scrape(&daemon).await;
    assert_eq!(value(&metrics, "switchboard_config_reloads_total", &[("result", "refused")]), 1.0);
    assert_eq!(value(&metrics, "switchboard_config_reloads_total", &[("result", "applied")]), 0.0);

    // Nothing of the file applies; the routes the daemon runs with still do.
    fake.push_text(ChatSpec::group(NEW_CHAT, "Late team"), UserSpec::new(88, "Lena"), "for the late team");
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "for the orchestrator");
    let ledger = daemon.ledger().await;
    let both = async {
        loop {
            let rows = ledger.list(&ListFilter { limit: 100, ..ListFilter::default() }).await.unwrap();
            if rows.len() == 2 {
                return rows;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let rows = tokio::time::timeout(WAIT, both).await.expect("both messages recorded");
    let late = rows.iter().find(|e| e.chat_id == NEW_CHAT).unwrap();
    assert_eq!(late.state, EnvelopeState::Unrouted, "the refused file's route was not applied");
    let owners = rows.iter().find(|e| e.chat_id == OWNER_CHAT).unwrap();
    assert_eq!(owners.route.as_deref(), Some("owner-dm"));
    ledger.close().await;
    std::fs::write(daemon.config_path(), good).unwrap();
}

// ---- packaging ----

fn repository_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(repository_file("contrib/systemd/switchboard.service")).unwrap();
    for hardening in [
        "DynamicUser=yes",
        "StateDirectory=switchboard",
        "Restart=on-failure",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "EnvironmentFile=",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(unit.contains(hardening), "the unit lacks {hardening}");
    }
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("skipped: systemd-analyze is not installed here; the unit's keys were checked above");
        return;
    }
    // Verified as installed, with this build's binary where the unit expects its own.
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("switchboard.service");
    std::fs::write(&installed, unit.replace("/usr/local/bin/switchboard", BIN)).unwrap();
    let output = Command::new("systemd-analyze").arg("verify").arg(&installed).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let about_the_unit: Vec<&str> =
        stderr.lines().filter(|line| line.contains("switchboard.service")).collect();
    assert!(output.status.success() && about_the_unit.is_empty(), "systemd-analyze verify:\n{stderr}");
}

#[test]
fn the_docker_image_checks_readiness_with_the_binary_itself() {
    let dockerfile = std::fs::read_to_string(repository_file("Dockerfile")).unwrap();
    let check = dockerfile.lines().find(|line| line.starts_with("HEALTHCHECK")).expect("a HEALTHCHECK");
    let next =
        dockerfile.lines().skip_while(|line| !line.starts_with("HEALTHCHECK")).nth(1).unwrap_or_default();
    assert!((check.to_owned() + next).contains("switchboard\", \"healthcheck\""), "{check}\n{next}");
}
