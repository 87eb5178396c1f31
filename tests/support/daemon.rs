//! Runs the real `switchboard` binary for integration tests: writes a configuration
//! into a fresh temporary directory (its own database), starts `switchboard run` with
//! stderr captured to a file, and stops it with SIGTERM or SIGKILL.
//!
//! The daemon binds port 0 and the harness reads the address it reports, rather than
//! picking a free port and handing it over (another process could take it in between).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::postgres::TestSchema;

use switchboard::app::{reported_api_address, reported_webhook_address};
use switchboard::config::API_LISTEN_ENV;
use switchboard::fake_bot_api::TEST_TOKEN;

pub const BIN: &str = env!("CARGO_BIN_EXE_switchboard");
pub const ORCHESTRATOR_SECRET: &str = "orchestrator-secret-0123456789";
pub const WORKER_SECRET: &str = "worker-secret-9876543210";

/// Chats the default configuration routes.
pub const OWNER_CHAT: i64 = 111_222_333;
pub const OWNER_ID: i64 = 111_222_333;
pub const FORUM_CHAT: i64 = -1_001_234_567_890;
pub const OPS_TOPIC: i32 = 42;
pub const GROUP_CHAT: i64 = -4_000_111;

/// How long the daemon may take to come up on a loaded CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `api.listen` in the file: any free loopback port, which the daemon reports once bound.
const ANY_LOOPBACK_PORT: &str = "127.0.0.1:0";

/// The configuration most tests use: an owner DM and a forum to the orchestrator, one
/// forum topic and a plain group to the worker, no default route.
pub fn default_routes() -> String {
    format!(
        r#"
[[routes]]
name = "owner-dm"
chat_id = {OWNER_CHAT}
agent = "orchestrator"

[[routes]]
name = "forum"
chat_id = {FORUM_CHAT}
agent = "orchestrator"

[[routes]]
name = "ops-topic"
chat_id = {FORUM_CHAT}
thread_id = {OPS_TOPIC}
agent = "worker"

[[routes]]
name = "team-group"
chat_id = {GROUP_CHAT}
agent = "worker"
"#
    )
}

/// Where a test daemon's ledger is: a SQLite file in its directory, or a schema of the
/// test's own on the machine's PostgreSQL, which its replicas share.
#[derive(Debug, Clone)]
pub enum TestLedger {
    Sqlite(PathBuf),
    Postgres(Arc<TestSchema>),
}

impl TestLedger {
    /// The backend this test binary runs its daemons on: PostgreSQL for the binaries named
    /// `on_postgres…` (which `include!` a suite written for either), or for any binary when
    /// `SWITCHBOARD_TEST_LEDGER=postgres`; SQLite otherwise.
    pub fn for_this_test(dir: &Path) -> Self {
        if Self::is_postgres_here() {
            Self::Postgres(Arc::new(TestSchema::create()))
        } else {
            Self::Sqlite(dir.join("ledger.db"))
        }
    }

    /// Whether [`Self::for_this_test`] chooses PostgreSQL in this test binary.
    pub fn is_postgres_here() -> bool {
        env!("CARGO_CRATE_NAME").starts_with("on_postgres")
            || std::env::var("SWITCHBOARD_TEST_LEDGER").is_ok_and(|chosen| chosen == "postgres")
    }

    /// `[storage] database` for it.
    pub fn setting(&self) -> String {
        match self {
            Self::Sqlite(path) => path.display().to_string(),
            Self::Postgres(schema) => schema.url.clone(),
        }
    }

    pub fn database(&self) -> switchboard::config::Database {
        match self {
            Self::Sqlite(path) => switchboard::config::Database::Sqlite(path.clone()),
            Self::Postgres(schema) => {
                switchboard::config::Database::Postgres(switchboard::config::PostgresLedger {
                    url: schema.url.clone(),
                    replica: "the test".into(),
                    lease: switchboard::rules::leadership::Lease::new(Duration::from_secs(10)).unwrap(),
                })
            }
        }
    }
}

/// Another session holding the ledger's write lock, as an operator's `sqlite3` or `psql`
/// left in a transaction would: the daemon's writes wait, then fail as busy.
pub enum HeldLedger {
    Sqlite(rusqlite::Connection),
    Postgres(super::postgres::WriteLock, Arc<TestSchema>),
}

impl HeldLedger {
    /// How many envelopes hold `update_id`, read beside the lock.
    pub fn envelopes_of_update(&self, update_id: i64) -> i64 {
        match self {
            Self::Sqlite(holder) => holder
                .query_row("SELECT count(*) FROM envelopes WHERE update_id = ?", [update_id], |row| {
                    row.get(0)
                })
                .unwrap(),
            Self::Postgres(_, schema) => schema
                .scalar(&format!("SELECT count(*)::text FROM envelopes WHERE update_id = {update_id}"))
                .and_then(|n| n.parse().ok())
                .unwrap(),
        }
    }

    pub fn release(self) {
        match self {
            Self::Sqlite(holder) => holder.execute_batch("ROLLBACK").unwrap(),
            Self::Postgres(lock, _) => lock.release(),
        }
    }
}

pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    /// Where its ledger is.
    pub ledger_at: TestLedger,
    pub config_path: PathBuf,
    /// Where the local API listens, as the first start reported it; restarts keep it, as
    /// a configured daemon would, so a running plugin finds the daemon again.
    api_addr: Option<SocketAddr>,
    /// Where the webhook listener (`telegram.webhook`) of the current start listens, if the
    /// configuration has one: on port 0, so each start reports its own.
    webhook_addr: Option<SocketAddr>,
    child: Option<Child>,
    /// Each start appends to its own numbered log file, so restarts keep earlier logs.
    starts: usize,
    /// Extra environment for the daemon process (e.g. `SWITCHBOARD__…` overrides).
    env: Vec<(String, String)>,
    /// A program (and its arguments) that runs the daemon's command line, e.g. in a
    /// namespace of its own; empty to run the binary directly.
    launcher: Vec<String>,
}

impl TestDaemon {
    /// Writes the configuration (with `extra_telegram` lines added to `[telegram]` and
    /// `routes` as the routes) and starts the daemon.
    pub fn start(api_url: &str, extra_telegram: &str, routes: &str) -> Self {
        Self::start_with_env(api_url, extra_telegram, routes, &[])
    }

    /// Like [`TestDaemon::start`], with extra environment variables for the daemon.
    pub fn start_with_env(api_url: &str, extra_telegram: &str, routes: &str, env: &[(&str, &str)]) -> Self {
        let mut daemon = Self::configure(api_url, extra_telegram, routes, env);
        daemon.spawn();
        daemon
    }

    /// Starts a daemon whose configuration ends with `config`: any tables the usual file
    /// does not already have (more agents, `[rooms]`, `[outbound]`, routes). The usual
    /// orchestrator and worker agents stay declared; no route is added besides `config`'s.
    pub fn start_with_config(api_url: &str, config: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with_env(api_url, "", config, env)
    }

    /// Like [`TestDaemon::start_with_env`], with the daemon started by `launcher`, which is
    /// given the binary and its arguments to run (`launcher… BIN run --config FILE`).
    pub fn start_launched(
        launcher: &[&str],
        api_url: &str,
        extra_telegram: &str,
        routes: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let mut daemon = Self::configure(api_url, extra_telegram, routes, env);
        daemon.launcher = launcher.iter().map(|arg| arg.to_string()).collect();
        daemon.spawn();
        daemon
    }

    /// Writes the configuration like [`TestDaemon::start_with_env`] but starts nothing:
    /// for tests of what happens before the first start. [`TestDaemon::launch`] starts it.
    pub fn configure(api_url: &str, extra_telegram: &str, routes: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger_at = TestLedger::for_this_test(dir.path());
        let config = format!(
            r#"
[telegram]
token_env = "SB_TEST_BOT_TOKEN"
api_url = "{api_url}"
poll_timeout_secs = 1
send_timeout_secs = 2
{extra_telegram}

[storage]
database = "{db}"

[api]
listen = "{ANY_LOOPBACK_PORT}"

[log]
filter = "info,switchboard=debug"

[agents.orchestrator]
token_env = "SB_TEST_ORCHESTRATOR_SECRET"

[agents.worker]
token_env = "SB_TEST_WORKER_SECRET"
{routes}
"#,
            db = ledger_at.setting(),
        );
        let config_path = dir.path().join("switchboard.toml");
        std::fs::write(&config_path, config).expect("write config");
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self {
            dir,
            ledger_at,
            config_path,
            api_addr: None,
            webhook_addr: None,
            child: None,
            starts: 0,
            env,
            launcher: Vec::new(),
        }
    }

    /// The local API's address, as the daemon reported it.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr.expect("the daemon has not started: its address is the one it reports once it listens")
    }

    /// Where this start's webhook listener listens, as the daemon reported it.
    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook_addr.expect("the daemon reported no webhook listener: is telegram.webhook configured?")
    }

    /// The environment a `switchboard channel` for this daemon needs besides its secret:
    /// the address, which the file leaves to the daemon (port 0).
    pub fn address_env(&self) -> (&'static str, String) {
        (API_LISTEN_ENV, self.api_addr().to_string())
    }

    /// Starts a daemon made with [`TestDaemon::configure`] and waits until it listens.
    pub fn launch(&mut self) {
        self.spawn();
    }

    /// Adds an environment variable for every later start and [`TestDaemon::subcommand`].
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The running daemon's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `switchboard SUBCOMMAND --config FILE` with this daemon's secrets and extra
    /// environment, not yet run: e.g. a second `run` beside this one, or `check`.
    pub fn subcommand(&self, subcommand: &str) -> Command {
        let mut command = self.command();
        command
            .arg(subcommand)
            .arg("--config")
            .arg(&self.config_path)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null());
        command
    }

    /// Takes the ledger's write lock in a session of the test's own (see [`HeldLedger`]).
    pub fn hold_write_lock(&self) -> HeldLedger {
        match &self.ledger_at {
            TestLedger::Sqlite(path) => {
                let holder = rusqlite::Connection::open(path).unwrap();
                holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
                HeldLedger::Sqlite(holder)
            }
            TestLedger::Postgres(schema) => {
                HeldLedger::Postgres(schema.lock_against_writes(), Arc::clone(schema))
            }
        }
    }

    /// Holds the permission requests' table against writes, in a session of the test's own
    /// (see [`HeldLedger`]): on SQLite the whole file's write lock, as
    /// [`TestDaemon::hold_write_lock`]; on PostgreSQL that table alone.
    pub fn hold_permissions_lock(&self) -> HeldLedger {
        match &self.ledger_at {
            TestLedger::Sqlite(_) => self.hold_write_lock(),
            TestLedger::Postgres(schema) => HeldLedger::Postgres(
                schema.lock_tables_against_writes("permission_requests"),
                Arc::clone(schema),
            ),
        }
    }

    /// The SQLite ledger's file, for tests of what happens to the file itself.
    pub fn database(&self) -> PathBuf {
        match &self.ledger_at {
            TestLedger::Sqlite(path) => path.clone(),
            TestLedger::Postgres(_) => {
                panic!("this test reads the SQLite ledger's file; its daemon is on PostgreSQL")
            }
        }
    }

    /// Where the daemon stages replies' files: beside a SQLite ledger's file, or beside the
    /// configuration for a daemon on PostgreSQL.
    pub fn uploads_dir(&self) -> PathBuf {
        match &self.ledger_at {
            TestLedger::Sqlite(path) => switchboard::agents::bridge::Staging::dir_beside(path),
            TestLedger::Postgres(_) => self.config_path.with_extension("uploads"),
        }
    }

    /// Another replica of this daemon: the same configuration (so the same ledger) in a
    /// directory of its own, not started. For a ledger on PostgreSQL. It listens where this
    /// one does, as replicas on one machine would: only the leader binds, so a plugin finds
    /// whichever leads at the address it knows.
    pub fn replica(&self) -> Self {
        self.replica_with_env(self.env.clone())
    }

    /// Like [`TestDaemon::replica`], on a local API port of its own: for a leader that keeps
    /// its port while it is paused.
    pub fn replica_on_own_port(&self) -> Self {
        self.replica_with_env(self.env.iter().filter(|(key, _)| key != API_LISTEN_ENV).cloned().collect())
    }

    fn replica_with_env(&self, env: Vec<(String, String)>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config_path = dir.path().join("switchboard.toml");
        std::fs::copy(&self.config_path, &config_path).expect("copy config");
        Self {
            dir,
            ledger_at: self.ledger_at.clone(),
            config_path,
            api_addr: None,
            webhook_addr: None,
            child: None,
            starts: 0,
            env,
            launcher: self.launcher.clone(),
        }
    }

    /// Starts the daemon without waiting for it to listen: a replica that stands by does
    /// not, until it is elected. [`TestDaemon::wait_until_serving`] waits for that.
    pub fn launch_standby(&mut self) {
        self.start_process();
    }

    /// Waits (up to `within`) until this start listens, and takes the address it reports.
    pub fn wait_until_serving(&mut self, within: Duration) {
        self.wait_until_listening_within(within);
    }

    /// A command for the binary with this daemon's secrets in its environment.
    pub fn command(&self) -> Command {
        self.command_for(Command::new(BIN))
    }

    fn command_for(&self, mut command: Command) -> Command {
        command
            .env("SB_TEST_BOT_TOKEN", TEST_TOKEN)
            .env("SB_TEST_ORCHESTRATOR_SECRET", ORCHESTRATOR_SECRET)
            .env("SB_TEST_WORKER_SECRET", WORKER_SECRET)
            .env_remove("RUST_LOG");
        command
    }

    fn log_path(&self, start: usize) -> PathBuf {
        self.dir.path().join(format!("daemon-{start}.log"))
    }

    fn spawn(&mut self) {
        self.start_process();
        self.wait_until_listening();
    }

    fn start_process(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        self.starts += 1;
        let log = std::fs::File::create(self.log_path(self.starts)).expect("log file");
        let program = match self.launcher.split_first() {
            Some((launcher, args)) => {
                let mut command = Command::new(launcher);
                command.args(args).arg(BIN);
                command
            }
            None => Command::new(BIN),
        };
        let child = self
            .command_for(program)
            .args(["run", "--config"])
            .arg(&self.config_path)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn switchboard run");
        self.child = Some(child);
    }

    /// Waits for this start's log to report the address the local API listens on.
    fn wait_until_listening(&mut self) {
        self.wait_until_listening_within(START_TIMEOUT);
    }

    fn wait_until_listening_within(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let log = self.log_path(self.starts);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = reported_api_address(&text) {
                // Logged before the running line, when there is a listener.
                self.webhook_addr = reported_webhook_address(&text);
                if self.api_addr.is_none() {
                    // Later starts, plugins and subcommands use the address the first one got.
                    self.env.push((API_LISTEN_ENV.to_owned(), addr.to_string()));
                }
                self.api_addr = Some(addr);
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("switchboard exited during start-up ({status}):\n{}", self.logs());
            }
            assert!(Instant::now() < deadline, "switchboard did not start listening:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log of the latest start alone.
    pub fn latest_logs(&self) -> String {
        std::fs::read_to_string(self.log_path(self.starts)).unwrap_or_default()
    }

    /// Every log line of every start so far.
    pub fn logs(&self) -> String {
        (1..=self.starts).map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default()).collect()
    }

    pub async fn wait_for_log(&self, needle: &str, within: Duration) {
        wait_for_text(needle, within, || self.logs()).await;
    }

    /// Like [`TestDaemon::wait_for_log`], in the latest start's log alone: for what this
    /// start must say, when an earlier one said it too.
    pub async fn wait_for_latest_log(&self, needle: &str, within: Duration) {
        wait_for_text(needle, within, || self.latest_logs()).await;
    }

    /// SIGTERM, then wait for a graceful exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon not running");
        let status =
            Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill -TERM");
        assert!(status.success());
        wait_with_timeout(&mut child, START_TIMEOUT)
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("daemon not running");
        child.kill().expect("kill -9");
        child.wait().expect("reap");
    }

    /// Sends a signal (`"STOP"`, `"CONT"`, `"HUP"`, …) to the running daemon.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("daemon not running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Edits the configuration file, `from` (which it must hold) becoming `to`, and tells
    /// the running daemon to reload it (SIGHUP).
    pub fn reload_replacing(&self, from: &str, to: &str) {
        let config = std::fs::read_to_string(self.config_path()).unwrap();
        assert!(config.contains(from), "the configuration holds {from:?}:\n{config}");
        std::fs::write(self.config_path(), config.replacen(from, to, 1)).unwrap();
        self.signal("HUP");
    }

    pub fn restart(&mut self) {
        self.spawn();
    }

    /// Whether the daemon process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().expect("try_wait").is_none())
    }

    /// Waits for the daemon to exit by itself; panics with the logs if it does not within
    /// `within`. Async, so a fake server on the test's runtime keeps answering meanwhile.
    pub async fn wait_for_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) =
                self.child.as_mut().expect("daemon not running").try_wait().expect("try_wait")
            {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "switchboard did not exit within {within:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs `switchboard ledger ARGS…` against this daemon's database; (success, stdout, stderr).
    pub fn ledger_cli(&self, args: &[&str]) -> (bool, String, String) {
        let output = self
            .command()
            .arg("ledger")
            .arg("--config")
            .arg(&self.config_path)
            .args(args)
            .output()
            .expect("run switchboard ledger");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Opens the ledger database read-side for assertions.
    pub async fn ledger(&self) -> switchboard::ledger::Ledger {
        switchboard::ledger::open(&self.ledger_at.database(), switchboard::config::Synchronous::Normal)
            .await
            .expect("open ledger")
    }

    /// Every envelope the ledger holds, oldest first.
    pub async fn envelopes(&self) -> Vec<switchboard::ledger::StoredEnvelope> {
        let ledger = self.ledger().await;
        let filter = switchboard::ledger::ListFilter { limit: 100_000, ..Default::default() };
        let rows = ledger.list(&filter).await.unwrap();
        ledger.close().await;
        rows
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A test that failed shows what the daemon was doing: a failure seen once under
        // load must be explainable from its CI log alone.
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            let tail = &lines[lines.len().saturating_sub(FAILED_TEST_LOG_LINES)..];
            eprintln!("the daemon's last {} log lines (of {}):", tail.len(), lines.len());
            for line in tail {
                eprintln!("  {line}");
            }
        }
    }
}

/// How much of a daemon's log a failed test prints.
const FAILED_TEST_LOG_LINES: usize = 120;

fn wait_with_timeout(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("switchboard did not exit within {within:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `read` (a log) contains `needle`; panics with what it read if `within` passes.
async fn wait_for_text(needle: &str, within: Duration, read: impl Fn() -> String) {
    let deadline = Instant::now() + within;
    while !read().contains(needle) {
        assert!(Instant::now() < deadline, "no log line contains {needle:?}:\n{}", read());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A GET on the daemon's local API, without credentials (the health and metrics routes):
/// the status and the body.
pub async fn get(daemon: &TestDaemon, path: &str) -> (u16, String) {
    get_at(daemon.api_addr(), path).await
}

/// `GET path` over plain HTTP at `address`: the status and the body.
pub async fn get_at(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    let client = reqwest::Client::builder().no_proxy().timeout(START_TIMEOUT).build().unwrap();
    let response = client.get(format!("http://{address}{path}")).send().await.expect(path);
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// `GET /readyz`: the status and the body as JSON.
pub async fn readiness(daemon: &TestDaemon) -> (u16, serde_json::Value) {
    readiness_at(daemon.api_addr()).await
}

/// `GET /readyz` at `address`.
pub async fn readiness_at(address: std::net::SocketAddr) -> (u16, serde_json::Value) {
    let (status, body) = get_at(address, "/readyz").await;
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("/readyz is not JSON ({e}): {body}")))
}

/// Polls `check` until it holds or `within` passes.
pub async fn eventually<F: FnMut() -> bool>(within: Duration, what: &str, mut check: F) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
