//! Bad configuration stops start-up with one clear message naming the file, the key and
//! the problem, and a non-zero exit status; `check` prints the routes table.

mod support;

use std::path::Path;
use std::process::Output;

use support::daemon::BIN;

const GOOD: &str = r#"
[telegram]
token_env = "SB_CFG_TOKEN"
api_url = "http://127.0.0.1:9"

[storage]
database = "DB_PATH"

[api]
listen = "127.0.0.1:0"

[agents.orchestrator]
token_env = "SB_CFG_ORCH"

[agents.worker]
token_env = "SB_CFG_WORKER"

[[routes]]
name = "owner-dm"
chat_id = 123456789
agent = "orchestrator"

[[routes]]
name = "ops-topic"
chat_id = -1001234567890
thread_id = 42
agent = "worker"

[[routes]]
name = "fallback"
agent = "orchestrator"
"#;

fn config_text(dir: &Path) -> String {
    GOOD.replace("DB_PATH", &dir.join("db.sqlite").display().to_string())
}

fn switchboard(dir: &Path, command: &str, config: &str, env: &[(&str, &str)]) -> (Output, String) {
    let path = dir.join("switchboard.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg(command)
        .arg("--config")
        .arg(&path)
        .env("SB_CFG_TOKEN", "123:abc-def-ghi")
        .env("SB_CFG_ORCH", "orchestrator-secret")
        .env("SB_CFG_WORKER", "worker-secret-xyz");
    for (key, value) in env {
        cmd.env(key, value);
    }
    let output = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

/// `run` with a bad configuration must fail before doing anything, naming file and key.
fn refused(config: &str, env: &[(&str, &str)], key: &str, words: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (output, stderr) = switchboard(dir.path(), "run", config, env);
    assert!(!output.status.success(), "a bad configuration must not start:\n{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("switchboard:"))
        .unwrap_or_else(|| panic!("no error line:\n{stderr}"));
    assert!(line.contains("switchboard.toml"), "the message names the file: {line}");
    assert!(line.contains(key), "the message names the key {key}: {line}");
    for word in words {
        assert!(line.contains(word), "the message says {word:?}: {line}");
    }
    assert!(!dir.path().join("db.sqlite").exists(), "nothing was created");
}

#[test]
fn check_prints_the_routes_table_most_specific_first() {
    let dir = tempfile::tempdir().unwrap();
    let (output, stderr) = switchboard(dir.path(), "check", &config_text(dir.path()), &[]);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("configuration is valid"), "{stdout}");
    let table: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("ROUTE")).collect();
    assert!(
        table[1].starts_with("ops-topic") && table[1].contains("42") && table[1].contains("worker"),
        "{stdout}"
    );
    assert!(table[2].starts_with("owner-dm") && table[2].contains("123456789"), "{stdout}");
    assert!(table[3].starts_with("fallback") && table[3].contains("default"), "{stdout}");
}

/// The variables config/switchboard.example.toml names, each with a secret.
const EXAMPLE_SECRETS: [(&str, &str); 5] = [
    ("TELOXIDE_TOKEN", "123:abc"),
    ("SWITCHBOARD_ORCHESTRATOR_SECRET", "s1-long-enough"),
    ("SWITCHBOARD_WORKER_SECRET", "s2-long-enough"),
    ("SWITCHBOARD_BUILDER_SECRET", "s3-long-enough"),
    ("SWITCHBOARD_REVIEWER_SECRET", "s4-long-enough"),
];

#[test]
fn the_example_configuration_checks() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/switchboard.example.toml");
    let output = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(&example)
        .envs(EXAMPLE_SECRETS)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "the example is one to copy: {stderr}");
    // The example's room, with its members in room order and what one message can cost.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let room = stdout.lines().find(|l| l.starts_with("dev-room")).unwrap_or_default();
    assert!(room.contains("room: builder, reviewer"), "{stdout}");
    assert!(
        stdout.contains("room dev-room (chat -1009876543210): cascade_limit 6, max_iters 50"),
        "{stdout}"
    );
    assert!(stdout.contains("6 × 50 = 300 tool iterations"), "{stdout}");
    assert!(
        stdout.contains("1. builder") && stdout.contains("shown as \"Builder\"") && stdout.contains("@bob"),
        "{stdout}"
    );
    assert!(stdout.contains("2. reviewer"), "{stdout}");
}

/// The Docker recipe in docs/operating.md, with the image's own settings: the example
/// configuration under exactly those overrides is one the daemon starts with.
#[test]
fn the_docker_recipe_checks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let operating = std::fs::read_to_string(root.join("docs/operating.md")).unwrap();
    let recipe = operating.split("docker run").nth(1).and_then(|rest| rest.split("```").next()).unwrap();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let overrides: Vec<(&str, &str)> = recipe
        .split_whitespace()
        .chain(dockerfile.lines().filter_map(|line| line.strip_prefix("ENV ")))
        .filter_map(|word| word.split_once('='))
        .filter(|(name, _)| name.starts_with("SWITCHBOARD__"))
        .collect();
    assert!(overrides.iter().any(|(name, _)| *name == "SWITCHBOARD__API__LISTEN"), "{recipe}");
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(root.join("config/switchboard.example.toml"))
        .envs(overrides.iter().map(|(name, value)| {
            let value = value.replace("/var/lib/switchboard", &dir.path().display().to_string());
            (name.to_string(), value)
        }))
        .envs(EXAMPLE_SECRETS)
        .output()
        .unwrap();
    assert!(output.status.success(), "{overrides:?}: {}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn malformed_toml_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let broken = config_text(dir.path()).replace("name = \"ops-topic\"", "name = \"ops-topic");
    refused(&broken, &[], "(syntax)", &["line 24, column 18"]);
}

#[test]
fn unknown_agent_in_a_route() {
    let dir = tempfile::tempdir().unwrap();
    let bad = config_text(dir.path()).replace("agent = \"worker\"", "agent = \"ghost\"");
    refused(&bad, &[], "routes[1].agent", &["unknown agent 'ghost'", "orchestrator, worker"]);
}

#[test]
fn two_routes_for_the_same_channel() {
    let dir = tempfile::tempdir().unwrap();
    let bad =
        config_text(dir.path()) + "\n[[routes]]\nname = \"again\"\nchat_id = 123456789\nagent = \"worker\"\n";
    refused(&bad, &[], "routes[3]", &["'owner-dm'", "'again'", "same channel"]);
}

#[test]
fn a_second_default_route() {
    let dir = tempfile::tempdir().unwrap();
    let bad = config_text(dir.path()) + "\n[[routes]]\nname = \"fallback2\"\nagent = \"worker\"\n";
    refused(&bad, &[], "routes[3]", &["'fallback'", "'fallback2'"]);
}

#[test]
fn a_route_without_an_agent() {
    let dir = tempfile::tempdir().unwrap();
    let bad = config_text(dir.path())
        .replace("name = \"fallback\"\nagent = \"orchestrator\"", "name = \"fallback\"");
    refused(&bad, &[], "routes[2].agent", &["names no agent"]);
}

#[test]
fn a_missing_secret_variable() {
    let dir = tempfile::tempdir().unwrap();
    let bad = config_text(dir.path()).replace("SB_CFG_WORKER", "SB_CFG_SURELY_UNSET_VARIABLE");
    refused(&bad, &[], "agents.worker.token_env", &["SB_CFG_SURELY_UNSET_VARIABLE is not set"]);
}

/// A value that is no bot token (the bot's @name, a truncated paste) is refused by `check`
/// as by `run`, naming the key, and not said to be valid first.
#[test]
fn a_value_that_is_no_bot_token() {
    let dir = tempfile::tempdir().unwrap();
    for token in ["not-a-token", "my_bot", "123456:", ":secret", "123456:two words"] {
        refused(
            &config_text(dir.path()),
            &[("SB_CFG_TOKEN", token)],
            "telegram.token_env",
            &["SB_CFG_TOKEN"],
        );
        let (output, stderr) =
            switchboard(dir.path(), "check", &config_text(dir.path()), &[("SB_CFG_TOKEN", token)]);
        assert!(!output.status.success(), "{token}: {stderr}");
        assert!(stderr.contains("telegram.token_env"), "{token}: {stderr}");
        assert!(!String::from_utf8_lossy(&output.stdout).contains("valid"), "{token}");
        assert!(!stderr.contains("two words") && !stderr.contains("not-a-token"), "not echoed: {stderr}");
    }
}

#[test]
fn a_bad_api_url() {
    let dir = tempfile::tempdir().unwrap();
    let bad = config_text(dir.path()).replace("http://127.0.0.1:9", "telegram.org");
    refused(&bad, &[], "telegram.api_url", &["not a URL"]);
}

#[test]
fn environment_overrides_are_applied_and_validated() {
    let dir = tempfile::tempdir().unwrap();
    refused(
        &config_text(dir.path()),
        &[("SWITCHBOARD__TELEGRAM__API_URL", "ftp://nowhere")],
        "telegram.api_url",
        &["http or https"],
    );
    let (output, stderr) = switchboard(
        dir.path(),
        "check",
        &config_text(dir.path()),
        &[("SWITCHBOARD__TELEGRAM__API_URL", "http://10.9.8.7:8081")],
    );
    assert!(output.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("http://10.9.8.7:8081"));
}

#[test]
fn an_unknown_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = config_text(dir.path()).replace("[api]", "[api]\nlisten_port = 1");
    refused(&bad, &[], "api", &["listen_port"]);
}

#[test]
fn the_allowlist_can_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (output, stderr) = switchboard(
        dir.path(),
        "check",
        &config_text(dir.path()),
        &[("SWITCHBOARD__TELEGRAM__ALLOWED_USERS", "111,222")],
    );
    assert!(output.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("only [111, 222]"));
}

/// The default `storage.replica` is the host's name and the pid, even where
/// /proc/sys/kernel/hostname is hidden, as the shipped systemd unit's `ProcSubset=pid`
/// hides it. Here a mount namespace of the test's own hides it (`unshare -m`), where this
/// machine allows one; elsewhere the test says so and checks nothing.
#[test]
fn the_default_replica_name_is_the_hosts_even_where_proc_sys_is_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("switchboard.toml");
    let config = GOOD.replace("\"DB_PATH\"", "\"postgres://postgres@127.0.0.1:5432/test\"");
    std::fs::write(&path, config).unwrap();
    let hide = "mount -t tmpfs none /proc/sys && test ! -e /proc/sys/kernel/hostname";
    let can_hide = std::process::Command::new("unshare").args(["-m", "sh", "-c", hide]).output();
    if !can_hide.as_ref().is_ok_and(|output| output.status.success()) {
        eprintln!("skipped: this machine cannot hide /proc/sys in a mount namespace: {can_hide:?}");
        return;
    }
    let output = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", &format!("{hide} && exec \"$0\" check --config \"$1\""), BIN])
        .arg(&path)
        .env("SB_CFG_TOKEN", "123:abc-def-ghi")
        .env("SB_CFG_ORCH", "orchestrator-secret")
        .env("SB_CFG_WORKER", "worker-secret-xyz")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let replica = stdout.lines().find(|line| line.starts_with("replica:")).expect("check names the replica");
    assert!(replica.contains(&format!(" {host}-")), "the host's name, not a fallback: {replica}");
}
