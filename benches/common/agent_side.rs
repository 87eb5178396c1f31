//! The serving side's processes, for the benchmarks that run the real binaries
//! (`hot_path`, `scale`): a child whose CPU time, wake-ups and memory are read from
//! `/proc`, and an agent session made of a real `switchboard channel` child and a real
//! rmcp MCP client that answers every channel notification with `reply`, as an agent does.
//! Included with `#[path]` by the benchmarks that use it, so the others do not carry it.

// Each benchmark that includes this file uses its own part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CustomNotification, Implementation,
    ProtocolVersion,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value, json};
use switchboard::agents::api::wire::WAITING_NOTICE;
use switchboard::config::API_LISTEN_ENV;
use tokio::sync::mpsc;

use crate::common::{PROCESS_POLL_INTERVAL, START_TIMEOUT, STEP_TIMEOUT};

const LOG_TAIL_LINES: usize = 40;

/// The notification that carries an envelope into the agent session (DESIGN.md §5).
const CHANNEL_METHOD: &str = "notifications/claude/channel";

/// Each live thread of a process, by id: its CPU nanoseconds (`schedstat`) and its
/// context switches, voluntary and not (`status`): its wake-ups.
pub fn thread_counters(pid: u32) -> std::collections::HashMap<String, (u64, u64)> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Default::default() };
    threads
        .filter_map(Result::ok)
        .filter_map(|thread| {
            let tid = thread.file_name().to_string_lossy().into_owned();
            let cpu = std::fs::read_to_string(thread.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()?;
            let status = std::fs::read_to_string(thread.path().join("status")).ok()?;
            let switches = status
                .lines()
                .filter_map(|line| {
                    let value = line
                        .strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))?;
                    value.trim().parse::<u64>().ok()
                })
                .sum();
            Some((tid, (cpu, switches)))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A child process whose CPU time and memory are read from /proc. Dropping it kills it.
pub struct Process {
    pub name: &'static str,
    child: Option<Spawned>,
    log: Option<PathBuf>,
}

/// A child process started through std or tokio.
pub enum Spawned {
    Std(std::process::Child),
    Tokio(tokio::process::Child),
}

impl Spawned {
    pub fn from_tokio(child: tokio::process::Child) -> Self {
        Self::Tokio(child)
    }

    pub fn id(&self) -> u32 {
        match self {
            Self::Std(child) => child.id(),
            Self::Tokio(child) => child.id().expect("a running child has a pid"),
        }
    }

    pub fn exited(&mut self) -> bool {
        match self {
            Self::Std(child) => child.try_wait().is_ok_and(|status| status.is_some()),
            Self::Tokio(child) => child.try_wait().is_ok_and(|status| status.is_some()),
        }
    }

    pub fn kill(&mut self) {
        match self {
            Self::Std(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Self::Tokio(child) => {
                let _ = child.start_kill();
            }
        }
    }
}

impl Process {
    pub fn new(name: &'static str, child: impl Into<Spawned>, log: Option<PathBuf>) -> Self {
        Self { name, child: Some(child.into()), log }
    }

    pub fn exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(Spawned::exited)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the process is running").id()
    }

    /// utime + stime of the whole process (every thread), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let pid = self.pid();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
        // The command name may hold spaces: the fields that follow it come after its ')'.
        let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
        // Fields 14 and 15 of stat(5); the first field after ')' is field 3.
        let ticks: u64 =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        ticks as f64 / clock_ticks_per_second()
    }

    /// [`threads_cpu_seconds`] of this process.
    pub fn cpu_seconds_fine(&self) -> f64 {
        threads_cpu_seconds(self.pid())
    }

    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The part of the resident set that is the process's own memory (`RssAnon`), in KiB:
    /// the rest is mostly its executable's code, shared with every process of the same
    /// binary and given back under memory pressure without a write.
    pub fn anon_rss_kib(&self) -> u64 {
        self.status_kib("RssAnon:")
    }

    /// The peak resident set size so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    /// A `kB` line of `/proc/<pid>/status`.
    fn status_kib(&self, key: &str) -> u64 {
        let pid = self.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} line in /proc/{pid}/status"))
    }

    /// For a `switchboard run` child writing its log to `log`: waits until it reports
    /// where its local API listens (port 0 in the configuration), and returns that.
    pub async fn wait_until_listening(&mut self, log: &Path) -> SocketAddr {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(addr) = switchboard::app::reported_api_address(&text) {
                return addr;
            }
            if self.exited() {
                self.fail("the daemon exited during start-up");
            }
            if Instant::now() > deadline {
                self.fail(&format!("the daemon did not listen within {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(PROCESS_POLL_INTERVAL).await;
        }
    }

    /// SIGTERM, then waits for the graceful exit the daemon promises.
    pub fn stop(&mut self) {
        let Some(Spawned::Std(mut child)) = self.child.take() else {
            panic!("{} is not a std child", self.name);
        };
        let pid = child.id().to_string();
        let signalled = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
        assert!(signalled.success(), "kill -TERM {pid} failed");
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            match child.try_wait().expect("waiting for the process") {
                Some(status) if status.success() => return,
                Some(status) => {
                    panic!("{} exited with {status} after SIGTERM\n{}", self.name, self.log_tail())
                }
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    panic!(
                        "{} did not stop within {STEP_TIMEOUT:?} of SIGTERM\n{}",
                        self.name,
                        self.log_tail()
                    );
                }
                None => std::thread::sleep(PROCESS_POLL_INTERVAL),
            }
        }
    }

    pub fn fail(&self, problem: &str) -> ! {
        panic!("{problem}\n--- {} log (last {LOG_TAIL_LINES} lines) ---\n{}", self.name, self.log_tail())
    }

    pub fn log_tail(&self) -> String {
        let Some(log) = &self.log else { return "(no log)".into() };
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

impl From<std::process::Child> for Spawned {
    fn from(child: std::process::Child) -> Self {
        Self::Std(child)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }
}

/// CPU seconds of a process's live threads, from `/proc/<pid>/task/*/schedstat`
/// (nanoseconds, where `stat` counts clock ticks of 10 ms): for figures too small for
/// ticks, over a span in which no thread of the process ends.
pub fn threads_cpu_seconds(pid: u32) -> f64 {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("listing /proc/{pid}/task: {e}"));
    let nanos: u64 = threads
        .filter_map(Result::ok)
        .filter_map(|thread| std::fs::read_to_string(thread.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 / 1e9
}

pub fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let output = Command::new("getconf").arg("CLK_TCK").output().expect("running getconf CLK_TCK");
        String::from_utf8_lossy(&output.stdout).trim().parse().expect("CLK_TCK is a number")
    })
}

// ---------------------------------------------------------------------------
// The agent side: a real plugin process and a real MCP client
// ---------------------------------------------------------------------------

/// When the client saw a notification, and when its `reply` call left and came back.
pub struct AgentTiming {
    pub notified: Instant,
    pub called: Instant,
    pub returned: Instant,
}

/// A `switchboard channel` child and the MCP client that answers every notification.
pub struct AgentSession {
    pub plugin: Process,
    pub client: RunningService<RoleClient, Answerer>,
    timings: Vec<AgentTiming>,
    timings_rx: mpsc::UnboundedReceiver<AgentTiming>,
}

/// Records channel notifications as they arrive; a task of its own answers them, so the
/// client's read loop never waits for a tool call.
pub struct Answerer {
    notifications: mpsc::UnboundedSender<(Instant, String)>,
}

impl ClientHandler for Answerer {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("switchboard-hot-path-bench", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        let notified = Instant::now();
        if notification.method != CHANNEL_METHOD {
            return;
        }
        let meta = |key: &str| {
            notification.params.as_ref().and_then(|params| params.pointer(&format!("/meta/{key}")).cloned())
        };
        // The notice that follows envelopes a session found waiting names one of them: it
        // is not one more message to answer.
        if meta("kind").as_ref().and_then(Value::as_str) == Some(WAITING_NOTICE) {
            return;
        }
        let trace_id = meta("trace_id").as_ref().and_then(Value::as_str).unwrap_or_default().to_owned();
        let _ = self.notifications.send((notified, trace_id));
    }
}

/// What a plugin process is started with: the agent it serves and where its daemon is.
pub struct PluginSpec<'a> {
    /// The `switchboard` binary; `channel` is its subcommand.
    pub bin: &'a Path,
    pub config: &'a Path,
    pub agent: &'a str,
    /// The agent's secret, in the variable its `token_env` names.
    pub secret_env: &'a str,
    pub secret: &'a str,
    /// The daemon's local API, as it reported it (the file leaves the port to the daemon).
    pub api_addr: SocketAddr,
    pub log: &'a Path,
    /// What the agent answers to every message.
    pub answer: &'a str,
}

impl AgentSession {
    pub async fn start(spec: &PluginSpec<'_>) -> Self {
        let mut child = tokio::process::Command::new(spec.bin)
            .args(["channel", "--agent", spec.agent, "--config"])
            .arg(spec.config)
            .env(spec.secret_env, spec.secret)
            .env(API_LISTEN_ENV, spec.api_addr.to_string())
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(spec.log).expect("creating the plugin's log"))
            .kill_on_drop(true)
            .spawn()
            .expect("starting switchboard channel");
        let stdin = child.stdin.take().expect("the plugin's stdin");
        let stdout = child.stdout.take().expect("the plugin's stdout");
        let (notifications, mut incoming) = mpsc::unbounded_channel();
        let client = tokio::time::timeout(START_TIMEOUT, Answerer { notifications }.serve((stdout, stdin)))
            .await
            .expect("the MCP handshake within the start timeout")
            .expect("the MCP handshake");
        // As an agent session does: the plugin opens its session once the tools are listed.
        client.list_all_tools().await.expect("tools/list");

        // Answers each notification by name, one after the other, as an agent would.
        let peer = client.peer().clone();
        let answer = spec.answer.to_owned();
        let (timings_tx, timings_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some((notified, trace_id)) = incoming.recv().await {
                let mut arguments = serde_json::Map::new();
                arguments.insert("text".into(), json!(answer));
                arguments.insert("trace_id".into(), json!(trace_id));
                let called = Instant::now();
                let result =
                    peer.call_tool(CallToolRequestParams::new("reply").with_arguments(arguments)).await;
                let returned = Instant::now();
                match result {
                    Ok(result) if !result.is_error.unwrap_or(false) => {}
                    // Reported by the missing timing (and the missing reply at the fake).
                    failed => {
                        eprintln!("the reply to {trace_id} failed: {failed:?}");
                        break;
                    }
                }
                if timings_tx.send(AgentTiming { notified, called, returned }).is_err() {
                    break;
                }
            }
        });
        let plugin = Process::new("plugin", Spawned::from_tokio(child), Some(spec.log.to_path_buf()));
        Self { plugin, client, timings: Vec::new(), timings_rx }
    }

    /// Waits for the timings of the first `count` answered notifications.
    pub async fn collect_timings(&mut self, count: usize) -> Vec<AgentTiming> {
        while self.timings.len() < count {
            match tokio::time::timeout(STEP_TIMEOUT, self.timings_rx.recv()).await {
                Ok(Some(timing)) => self.timings.push(timing),
                _ => self.plugin.fail("the agent did not answer every notification"),
            }
        }
        std::mem::take(&mut self.timings)
    }

    /// Ends the agent session as Claude Code does, by closing the plugin's stdin, and
    /// gives the plugin a moment to exit by itself.
    pub async fn close(self) {
        let Self { mut plugin, client, .. } = self;
        let _ = client.cancel().await;
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !plugin.exited() && Instant::now() < deadline {
            tokio::time::sleep(PROCESS_POLL_INTERVAL).await;
        }
    }
}
