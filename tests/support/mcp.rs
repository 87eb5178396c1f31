//! A real MCP client driving `switchboard channel` as a child process, the way an agent
//! session (Claude Code) does: it performs the `initialize` handshake, lists the tools,
//! records every `notifications/claude/channel` notification, calls tools, and closes stdin
//! to end the session.
//!
//! [`ChannelClientBuilder::like_claude_code`] also starts up as Claude Code does: it
//! installs its channel handler only some time after it listed the tools, and drops every
//! channel notification that arrives before (counted in
//! [`ChannelClient::dropped_before_ready`]).
//!
//! The child is spawned here rather than through rmcp's `TokioChildProcess` for two
//! reasons: rmcp skips stdout lines that are not JSON, so only a tap on the raw stdout can
//! prove the plugin writes nothing else there ([`ChannelClient::stdout_violations`]); and
//! owning the `Child` gives [`ChannelClient::close`] the exit status.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CustomNotification, Implementation,
    ProtocolVersion, ServerCapabilities, ServerPeerInfo, Tool,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _, NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// The notification that carries an envelope into the agent session.
pub const CHANNEL_METHOD: &str = "notifications/claude/channel";

/// The experimental capability that marks the server as a channel.
pub const CHANNEL_CAPABILITY: &str = "claude/channel";

/// The kind of the notice that sums up what waited for a session when it started: kept
/// apart from the other notifications ([`ChannelClient::waiting_notices`]), so that the
/// tests number the envelopes and notices they make themselves.
pub const WAITING_KIND: &str = switchboard::agents::api::wire::WAITING_NOTICE;

/// How long the plugin may take to exit once its stdin is closed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the handshake may take on a loaded CI machine.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Lines of stderr quoted in a failure message.
const STDERR_TAIL_LINES: usize = 40;

/// One `notifications/claude/channel` notification as the agent session received it.
#[derive(Debug, Clone)]
pub struct ChannelNotification {
    /// `params.content`; empty when absent (the test then fails on it, not here).
    pub content: String,
    /// `params.meta`, exactly as sent.
    pub meta: Map<String, Value>,
    /// The whole `params` object, for assertions on its shape.
    pub params: Value,
}

impl ChannelNotification {
    /// A meta value that is a string; `None` when missing or of another type.
    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta.get(key).and_then(Value::as_str)
    }
}

/// Starts a `switchboard channel` child with an MCP client attached.
pub struct ChannelClientBuilder {
    config: PathBuf,
    agent: String,
    env: Vec<(String, String)>,
    /// Arguments after `--config` (`--inbox DIR`, …).
    args: Vec<String>,
    protocol_version: ProtocolVersion,
    lifecycle: ClientLifecycleMode,
    /// Whether the client lists the tools after the handshake, as every agent session does.
    list_tools: bool,
    /// How long after its `tools/list` the client starts taking channel notifications
    /// (`None`: from the start).
    handler_delay: Option<Duration>,
}

impl ChannelClientBuilder {
    /// Starts up as Claude Code 2.1 does: its channel handler is installed `delay` after
    /// its `tools/list` has been answered, and what comes before is dropped without a trace.
    pub fn like_claude_code(mut self, delay: Duration) -> Self {
        self.handler_delay = Some(delay);
        self
    }

    /// Leaves out the `tools/list` after the handshake: a client that only shakes hands
    /// (a health check), or one that calls a tool without listing them first.
    pub fn without_tool_list(mut self) -> Self {
        self.list_tools = false;
        self
    }

    /// Adds an environment variable for the child (it also inherits the test's own).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Adds a command-line argument for `switchboard channel`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// The protocol revision the client asks for in `initialize`. Defaults to the newest
    /// revision that still has an `initialize` handshake (2025-11-25).
    pub fn protocol_version(mut self, version: ProtocolVersion) -> Self {
        self.protocol_version = version;
        self
    }

    /// Opens with `server/discover` as a 2026-07-28 client does, falling back to
    /// `initialize` when the server answers as an older one.
    pub fn discover_first(mut self) -> Self {
        self.lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28, ProtocolVersion::V_2025_11_25],
            legacy_version: None,
        };
        self
    }

    pub async fn start(self) -> anyhow::Result<ChannelClient> {
        let mut child = Command::new(BIN)
            .arg("channel")
            .arg("--agent")
            .arg(&self.agent)
            .arg("--config")
            .arg(&self.config)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {BIN}"))?;
        let stdin = child.stdin.take().context("child stdin")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stderr = child.stderr.take().context("child stderr")?;

        let (stderr_lines, _) = watch::channel(Vec::new());
        let stderr_lines = Arc::new(stderr_lines);
        tokio::spawn(collect_stderr(stderr, Arc::clone(&stderr_lines), self.agent.clone()));

        let stdout_violations = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (mcp_end, tap_end) = tokio::io::duplex(1 << 16);
        tokio::spawn(tap_stdout(stdout, tap_end, Arc::clone(&stdout_violations)));

        let (notifications, _) = watch::channel(Vec::new());
        let notifications = Arc::new(notifications);
        let (waiting, _) = watch::channel(Vec::new());
        let waiting = Arc::new(waiting);
        let taking = Arc::new(AtomicBool::new(self.handler_delay.is_none()));
        let dropped = Arc::new(AtomicUsize::new(0));
        let recorder = Recorder {
            waiting: Arc::clone(&waiting),
            taking: Arc::clone(&taking),
            dropped: Arc::clone(&dropped),
            config: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("switchboard-tests", env!("CARGO_PKG_VERSION")),
            )
            .with_protocol_version(self.protocol_version),
            channel: Arc::clone(&notifications),
            others: Arc::new(watch::Sender::new(Vec::new())),
        };
        let others = Arc::clone(&recorder.others);

        let handshake = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            recorder.serve_with_lifecycle((mcp_end, stdin), self.lifecycle),
        )
        .await;
        let client = match handshake {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => bail!("MCP handshake failed: {e}\nstderr:\n{}", tail(&stderr_lines.borrow())),
            Err(_) => bail!(
                "no MCP handshake within {HANDSHAKE_TIMEOUT:?}\nstderr:\n{}",
                tail(&stderr_lines.borrow())
            ),
        };
        if self.list_tools {
            client.list_all_tools().await.context("tools/list after the handshake")?;
        }
        if let Some(delay) = self.handler_delay {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                taking.store(true, Ordering::SeqCst);
            });
        }
        Ok(ChannelClient {
            client,
            child,
            notifications,
            waiting,
            others,
            dropped,
            stderr_lines,
            stdout_violations,
        })
    }
}

/// An MCP client connected to a running `switchboard channel`.
pub struct ChannelClient {
    client: RunningService<RoleClient, Recorder>,
    child: Child,
    notifications: Arc<watch::Sender<Vec<ChannelNotification>>>,
    /// `waiting` notices (see [`WAITING_KIND`]).
    waiting: Arc<watch::Sender<Vec<ChannelNotification>>>,
    /// Custom notifications with any other method.
    others: Arc<watch::Sender<Vec<CustomNotification>>>,
    /// Channel notifications that came before the client took them (see
    /// [`ChannelClientBuilder::like_claude_code`]).
    dropped: Arc<AtomicUsize>,
    stderr_lines: Arc<watch::Sender<Vec<String>>>,
    /// Lines on the child's stdout that are not JSON-RPC messages.
    stdout_violations: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ChannelClient {
    pub fn builder(config: impl AsRef<Path>, agent: &str) -> ChannelClientBuilder {
        ChannelClientBuilder {
            config: config.as_ref().to_path_buf(),
            agent: agent.to_owned(),
            env: Vec::new(),
            args: Vec::new(),
            protocol_version: ProtocolVersion::LATEST_WITH_INITIALIZE,
            lifecycle: ClientLifecycleMode::Initialize,
            list_tools: true,
            handler_delay: None,
        }
    }

    /// Starts the plugin for `agent` with the given extra environment variables.
    pub async fn start(config: impl AsRef<Path>, agent: &str, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut builder = Self::builder(config, agent);
        for (key, value) in env {
            builder = builder.env(*key, *value);
        }
        builder.start().await
    }

    /// What the server answered to `initialize`, with the negotiated protocol version.
    pub fn server_info(&self) -> Arc<ServerPeerInfo> {
        self.client.peer_info().expect("peer info is set by the handshake")
    }

    pub fn protocol_version(&self) -> ProtocolVersion {
        self.server_info().protocol_version.clone()
    }

    pub fn capabilities(&self) -> ServerCapabilities {
        self.server_info().capabilities.clone()
    }

    pub fn instructions(&self) -> String {
        self.server_info().instructions.clone().unwrap_or_default()
    }

    /// The value of the experimental `claude/channel` capability, when declared.
    pub fn channel_capability(&self) -> Option<Map<String, Value>> {
        self.capabilities().experimental?.get(CHANNEL_CAPABILITY).cloned()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Every channel notification received so far, in order.
    pub fn notifications(&self) -> Vec<ChannelNotification> {
        self.notifications.borrow().clone()
    }

    /// Waits until at least `n` channel notifications have arrived and returns all of them.
    pub async fn wait_for_notifications(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<ChannelNotification>> {
        self.wait_for_n(&self.notifications, n, timeout, "channel notifications").await
    }

    /// Waits until at least `n` `waiting` notices have arrived and returns all of them.
    pub async fn wait_for_waiting_notices(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<ChannelNotification>> {
        self.wait_for_n(&self.waiting, n, timeout, "waiting notices").await
    }

    async fn wait_for_n(
        &self,
        received: &watch::Sender<Vec<ChannelNotification>>,
        n: usize,
        timeout: Duration,
        what: &str,
    ) -> anyhow::Result<Vec<ChannelNotification>> {
        let mut receiver = received.subscribe();
        match tokio::time::timeout(timeout, receiver.wait_for(|received| received.len() >= n)).await {
            Ok(Ok(received)) => Ok(received.clone()),
            _ => bail!(
                "expected {n} {what} within {timeout:?}, have {}: {:#?}\nstderr:\n{}",
                received.borrow().len(),
                received.borrow(),
                self.stderr_tail()
            ),
        }
    }

    /// The `waiting` notices received so far.
    pub fn waiting_notices(&self) -> Vec<ChannelNotification> {
        self.waiting.borrow().clone()
    }

    /// How many channel notifications arrived before the client took them, and were lost.
    pub fn dropped_before_ready(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }

    /// Custom notifications other than channel messages.
    pub fn other_notifications(&self) -> Vec<CustomNotification> {
        self.others.borrow().clone()
    }

    /// The custom notifications with `method` received so far.
    pub fn notifications_named(&self, method: &str) -> Vec<CustomNotification> {
        self.others.borrow().iter().filter(|n| n.method == method).cloned().collect()
    }

    /// Waits until at least `n` custom notifications with `method` have arrived, and
    /// returns them.
    pub async fn wait_for_named(
        &self,
        method: &str,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<CustomNotification>> {
        let mut receiver = self.others.subscribe();
        let enough = |all: &Vec<CustomNotification>| all.iter().filter(|x| x.method == method).count() >= n;
        match tokio::time::timeout(timeout, receiver.wait_for(enough)).await {
            Ok(Ok(_)) => Ok(self.notifications_named(method)),
            _ => bail!(
                "expected {n} {method} notifications within {timeout:?}, have {:#?}\nstderr:\n{}",
                self.notifications_named(method),
                self.stderr_tail()
            ),
        }
    }

    /// Sends the server a custom notification, as Claude Code sends
    /// `notifications/claude/channel/permission_request`.
    pub async fn send_notification(&self, method: &str, params: Value) -> anyhow::Result<()> {
        let notification = CustomNotification::new(method.to_owned(), Some(params));
        self.client
            .send_notification(rmcp::model::ClientNotification::CustomNotification(notification))
            .await
            .with_context(|| format!("sending {method}"))
    }

    pub async fn list_tools(&self) -> anyhow::Result<Vec<Tool>> {
        Ok(self.client.list_all_tools().await?)
    }

    /// Calls a tool and returns `(is_error, text)`, the text being every text block joined
    /// by newlines. A JSON-RPC error (unknown tool, bad arguments) is an `Err`.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> anyhow::Result<(bool, String)> {
        let Value::Object(arguments) = arguments else { bail!("tool arguments must be a JSON object") };
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let result = self
            .client
            .call_tool(params)
            .await
            .with_context(|| format!("tools/call {name} failed\nstderr:\n{}", self.stderr_tail()))?;
        let text = result
            .content
            .iter()
            .filter_map(|block| block.as_text().map(|text| text.text.as_str()))
            .collect::<Vec<_>>()
            .join("\n");
        Ok((result.is_error.unwrap_or(false), text))
    }

    /// Calls a tool and cancels the call once `when` completes (`notifications/cancelled`),
    /// the way an agent session does when its user presses Esc. The call's answer, if any, is
    /// discarded, as a client that cancelled ignores it.
    pub async fn call_tool_and_cancel(
        &self,
        name: &str,
        arguments: Value,
        when: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Value::Object(arguments) = arguments else { bail!("tool arguments must be a JSON object") };
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params));
        let handle = self
            .client
            .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
            .await?;
        when.await;
        handle.cancel(Some("the user pressed Esc".into())).await?;
        Ok(())
    }

    /// Everything the plugin wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr_lines.borrow().join("\n")
    }

    fn stderr_tail(&self) -> String {
        tail(&self.stderr_lines.borrow())
    }

    /// Waits until a stderr line contains `needle`.
    pub async fn wait_for_stderr(&self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        let mut receiver = self.stderr_lines.subscribe();
        let found = tokio::time::timeout(
            timeout,
            receiver.wait_for(|lines| lines.iter().any(|line| line.contains(needle))),
        )
        .await;
        match found {
            Ok(Ok(lines)) => Ok(lines.iter().find(|line| line.contains(needle)).cloned().unwrap_or_default()),
            _ => bail!(
                "no stderr line contains {needle:?} within {timeout:?}\nstderr:\n{}",
                self.stderr_tail()
            ),
        }
    }

    /// Waits until `count` stderr lines contain `needle`.
    pub async fn wait_for_stderr_count(
        &self,
        needle: &str,
        count: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let mut receiver = self.stderr_lines.subscribe();
        let matching = |lines: &Vec<String>| lines.iter().filter(|line| line.contains(needle)).count();
        let found = tokio::time::timeout(timeout, receiver.wait_for(|lines| matching(lines) >= count)).await;
        match found {
            Ok(Ok(_)) => Ok(()),
            _ => bail!(
                "fewer than {count} stderr lines contain {needle:?} within {timeout:?}\nstderr:\n{}",
                self.stderr_tail()
            ),
        }
    }

    /// [`Self::start`], returning once the plugin's session is connected to the daemon. The
    /// plugin answers MCP before that, and a daemon that does not know the session yet
    /// queues what it hands over instead of delivering it.
    pub async fn start_connected(
        config: impl AsRef<Path>,
        agent: &str,
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let plugin = Self::start(config, agent, env).await?;
        // What the forwarder logs once the daemon accepted its session.
        plugin.wait_for_stderr("channel::forwarder: connected to the switchboard daemon", timeout).await?;
        Ok(plugin)
    }

    /// Lines the plugin wrote to stdout that are not JSON-RPC 2.0 messages; must stay empty.
    pub fn stdout_violations(&self) -> Vec<String> {
        self.stdout_violations.lock().unwrap().clone()
    }

    /// Ends the agent session the way Claude Code does, by closing the plugin's stdin,
    /// and returns the plugin's exit status. Kills it if it does not exit in time.
    /// Ends the plugin as Claude Code's MCP SDK does when its stdin closing is not enough:
    /// SIGTERM (here with stdin still open, so that the signal alone is what ends it).
    pub async fn terminate(self) -> anyhow::Result<ExitStatus> {
        let Self { client, mut child, stderr_lines, .. } = self;
        let pid = child.id().context("the plugin has exited already")?;
        let sent = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
        anyhow::ensure!(sent.success(), "kill -TERM {pid} failed");
        let exited = tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await;
        drop(client);
        match exited {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = child.kill().await;
                bail!(
                    "the plugin did not exit within {EXIT_TIMEOUT:?} of SIGTERM\nstderr:\n{}",
                    tail(&stderr_lines.borrow())
                )
            }
        }
    }

    pub async fn close(self) -> anyhow::Result<ExitStatus> {
        let Self { client, mut child, stderr_lines, .. } = self;
        // Cancelling the client closes its transport, and with it the child's stdin.
        let _ = client.cancel().await;
        match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = child.kill().await;
                bail!(
                    "the plugin did not exit within {EXIT_TIMEOUT:?} of its stdin closing\nstderr:\n{}",
                    tail(&stderr_lines.borrow())
                )
            }
        }
    }
}

/// The client side of the MCP session: records what the server pushes.
struct Recorder {
    config: ClientConfig,
    waiting: Arc<watch::Sender<Vec<ChannelNotification>>>,
    /// False until the client's channel handler is installed.
    taking: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
    channel: Arc<watch::Sender<Vec<ChannelNotification>>>,
    others: Arc<watch::Sender<Vec<CustomNotification>>>,
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        if notification.method != CHANNEL_METHOD {
            self.others.send_modify(|all| all.push(notification));
            return;
        }
        if !self.taking.load(Ordering::SeqCst) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let params = notification.params.unwrap_or(Value::Null);
        let received = ChannelNotification {
            content: params.get("content").and_then(Value::as_str).unwrap_or_default().to_owned(),
            meta: params.get("meta").and_then(Value::as_object).cloned().unwrap_or_default(),
            params,
        };
        if received.meta_str("kind") == Some(WAITING_KIND) {
            self.waiting.send_modify(|all| all.push(received));
        } else {
            self.channel.send_modify(|all| all.push(received));
        }
    }
}

/// Copies the child's stdout to the MCP client line by line, noting every line that is
/// not a JSON-RPC 2.0 message.
async fn tap_stdout(
    stdout: tokio::process::ChildStdout,
    mut to_client: tokio::io::DuplexStream,
    violations: Arc<std::sync::Mutex<Vec<String>>>,
) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        if !text.trim().is_empty() && !is_json_rpc(text.trim()) {
            violations.lock().unwrap().push(text.trim_end().to_owned());
        }
        if to_client.write_all(&line).await.is_err() {
            break;
        }
    }
    // Dropping the duplex end tells the client the server is gone.
}

fn is_json_rpc(line: &str) -> bool {
    serde_json::from_str::<Value>(line)
        .is_ok_and(|message| message.get("jsonrpc").and_then(Value::as_str) == Some("2.0"))
}

/// Keeps the child's stderr for assertions and echoes it into the test's output.
async fn collect_stderr(
    stderr: tokio::process::ChildStderr,
    lines: Arc<watch::Sender<Vec<String>>>,
    agent: String,
) {
    let mut reader = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        eprintln!("[channel {agent}] {line}");
        lines.send_modify(|all| all.push(line));
    }
}

fn tail(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
}
