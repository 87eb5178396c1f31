//! `switchboard channel --agent NAME`: the MCP channel plugin an agent session starts
//! (DESIGN.md §5).
//!
//! It speaks MCP over stdio to the agent session (Claude Code) and HTTP to the daemon's
//! local API ([`crate::api::client`]). Once the session has finished its handshake, the
//! plugin opens the agent's session stream and pushes every envelope into the session as a
//! `notifications/claude/channel` notification; the `reply`, `pending` and `ack` tools
//! call the daemon back. stdout carries MCP messages only; logs go to stderr.
//!
//! The plugin outlives the daemon: while it is unreachable, or refuses this session, the
//! MCP side keeps working (tools answer with what is wrong) and the session stream is
//! retried until the daemon is back. That includes a refused secret (401): the fix may be
//! on the daemon's side (it reads the secret at start-up), so the plugin keeps checking
//! every few seconds and says on stderr and in every tool answer what is wrong, instead of
//! exiting and taking its tools and messages out of the agent session.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CustomNotification, DiscoverRequestMethod, DiscoverResult, ExperimentalCapabilities, Implementation,
    JsonObject, ProtocolVersion, ServerCapabilities, ServerConfig, ServerNotification,
};
use rmcp::service::{NotificationContext, RequestContext, ServerInitializeError};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::client::{ClientError, DaemonClient};
use crate::api::wire::{
    AckReceipt, AckRequest, DeliveredEnvelope, ErrorCode, PendingList, PendingSummary, ReplyReceipt,
    ReplyRequest, SessionEvent,
};
use crate::backoff::Backoff;
use crate::config::Settings;
use crate::ids::{AgentName, TraceId};

/// The experimental capability that makes Claude Code treat this server as a channel.
pub const CHANNEL_CAPABILITY: &str = "claude/channel";

/// The notification that carries one envelope into the agent session.
pub const CHANNEL_NOTIFICATION_METHOD: &str = "notifications/claude/channel";

/// Claude Code registers channels on the `initialize` lifecycle, which ends with this
/// revision; a client asking for anything newer is answered with it.
const MAX_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// First wait before reopening the session stream after the daemon went away; it doubles
/// up to [`MAX_RECONNECT_DELAY`], so a restarting daemon is found again within seconds.
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(500);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

/// Wait between attempts while the daemon refuses this session (another session of the
/// agent is connected, or the secret is wrong): someone has to act first, and polling
/// faster would only fight the other session.
const REFUSED_RETRY_DELAY: Duration = Duration::from_secs(5);

/// How long the session-stream task may take to stop once the agent session has ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Runs the channel plugin for `agent` until the agent session closes stdin.
///
/// Fails only when it cannot start: the agent's secret is missing, or the MCP handshake
/// fails. A daemon that is unreachable or refuses the session, even with 401 for a wrong
/// secret, is not a reason to exit: the plugin says so on stderr and in every tool answer
/// and keeps retrying (see the module documentation for why).
pub async fn run(settings: Settings, agent: AgentName) -> anyhow::Result<()> {
    let secret = settings
        .agent_secret(&agent)
        .with_context(|| format!("the channel plugin for agent '{agent}' cannot authenticate"))?;
    let secret_env = settings.agents.get(&agent).map(|a| a.token_env.clone()).unwrap_or_default();
    let daemon = DaemonClient::new(settings.api.listen, agent.clone(), secret)
        .context("cannot build the HTTP client for the daemon's local API")?;
    tracing::info!(%agent, daemon = %settings.api.listen, "channel plugin starting");

    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let plugin = ChannelPlugin::new(daemon, secret_env, shutdown.clone(), tasks.clone());
    let service = match plugin.serve(rmcp::transport::stdio()).await {
        Ok(service) => service,
        Err(ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("the agent session closed stdin before the MCP handshake; exiting");
            return Ok(());
        }
        Err(e) => return Err(e).context("MCP handshake with the agent session failed"),
    };

    let quit = service.waiting().await;
    tracing::info!("agent session ended; closing the daemon session");
    // Dropping the session stream tells the daemon this agent's slot is free again.
    shutdown.cancel();
    tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait()).await.is_err() {
        tracing::warn!("the session stream did not stop within {SHUTDOWN_GRACE:?}; exiting anyway");
    }
    quit.context("the MCP service task failed")?;
    Ok(())
}

/// The MCP server half of the plugin.
struct ChannelPlugin {
    daemon: DaemonClient,
    /// The variable that holds the agent's secret, named in messages about a refused secret.
    secret_env: String,
    instructions: String,
    tool_router: ToolRouter<Self>,
    /// Stops the session-stream task when the agent session ends.
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Set once the session stream is started, so a repeated `initialized` starts no second one.
    stream_started: AtomicBool,
}

/// Arguments of the `reply` tool.
#[derive(Debug, Deserialize, JsonSchema)]
struct ReplyArgs {
    /// The message to send, as plain text. Long texts are split into several messages for you.
    text: String,
    /// The trace_id (env_…) of the message you are answering, from its <channel> meta.
    /// Required when more than one conversation is waiting.
    #[serde(default)]
    trace_id: Option<String>,
}

/// Arguments of the `ack` tool.
#[derive(Debug, Deserialize, JsonSchema)]
struct AckArgs {
    /// The trace_id (env_…) of the message you handled without replying.
    trace_id: String,
    /// Why no reply is needed, for the operator's record.
    #[serde(default)]
    note: Option<String>,
}

/// The tools, named in failure messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolName {
    Reply,
    Pending,
    Ack,
}

impl ToolName {
    fn as_str(self) -> &'static str {
        match self {
            Self::Reply => "reply",
            Self::Pending => "pending",
            Self::Ack => "ack",
        }
    }
}

#[tool_router]
impl ChannelPlugin {
    fn new(
        daemon: DaemonClient,
        secret_env: String,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        let instructions = instructions(daemon.agent());
        Self {
            daemon,
            secret_env,
            instructions,
            tool_router: Self::tool_router(),
            shutdown,
            tasks,
            stream_started: AtomicBool::new(false),
        }
    }

    #[tool(
        description = "Send a reply to the Telegram conversation a <channel> message came from. \
                       Name the message with trace_id whenever more than one conversation is waiting; \
                       without it the reply is refused and the waiting conversations are listed.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn reply(&self, Parameters(args): Parameters<ReplyArgs>) -> Result<String, String> {
        if args.text.trim().is_empty() {
            return Err("text is empty: there is nothing to send. Nothing was sent.".into());
        }
        let trace_id = optional_trace_id(args.trace_id.as_deref())?;
        let request = ReplyRequest { text: args.text, trace_id: trace_id.map(|id| id.to_string()) };
        match self.daemon.reply(&request).await {
            Ok(receipt) => Ok(describe_receipt(&receipt)),
            Err(error) => Err(self.tool_failure(ToolName::Reply, &error)),
        }
    }

    #[tool(
        description = "List the conversations waiting for an answer: trace_id, chat, topic, sender and the \
                       start of each message.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn pending(&self) -> Result<String, String> {
        match self.daemon.pending().await {
            Ok(list) => Ok(describe_pending(&list)),
            Err(error) => Err(self.tool_failure(ToolName::Pending, &error)),
        }
    }

    #[tool(
        description = "Mark a message as handled without replying to it (for example when it needs no answer). \
                       Nothing is sent to Telegram.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn ack(&self, Parameters(args): Parameters<AckArgs>) -> Result<String, String> {
        let trace_id = parse_trace_id(&args.trace_id)?;
        let note = args.note.filter(|note| !note.trim().is_empty());
        let noted = note.is_some();
        match self.daemon.ack(&AckRequest { trace_id: trace_id.to_string(), note }).await {
            Ok(receipt) => Ok(describe_ack(&receipt, noted)),
            Err(error) => Err(self.tool_failure(ToolName::Ack, &error)),
        }
    }
}

impl ChannelPlugin {
    /// The failure text for the model; the failure is logged for the operator too.
    fn tool_failure(&self, tool: ToolName, error: &ClientError) -> String {
        let text = describe_failure(tool, error, self.daemon.agent(), &self.secret_env);
        tracing::warn!(tool = tool.as_str(), code = ?error.code(), "tool call failed: {error}");
        text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ChannelPlugin {
    fn get_info(&self) -> ServerConfig {
        let mut experimental = ExperimentalCapabilities::new();
        experimental.insert(CHANNEL_CAPABILITY.to_owned(), JsonObject::new());
        ServerConfig::new(
            ServerCapabilities::builder().enable_experimental_with(experimental).enable_tools().build(),
        )
        .with_server_info(Implementation::new("switchboard", env!("CARGO_PKG_VERSION")))
        .with_protocol_version(MAX_PROTOCOL_VERSION)
        .with_instructions(self.instructions.clone())
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&MAX_PROTOCOL_VERSION))
    }

    /// `server/discover` opens the 2026-07-28 lifecycle, which has no `initialize` and so
    /// no `initialized` to start the session stream on. Answering as a server that predates
    /// it makes a client fall back to `initialize`.
    async fn discover(&self, _context: RequestContext<RoleServer>) -> Result<DiscoverResult, ErrorData> {
        Err(ErrorData::method_not_found::<DiscoverRequestMethod>())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if self.stream_started.swap(true, Ordering::SeqCst) {
            tracing::debug!("repeated initialized notification ignored");
            return;
        }
        let forwarder = SessionForwarder {
            daemon: self.daemon.clone(),
            secret_env: self.secret_env.clone(),
            peer: context.peer,
        };
        self.tasks.spawn(forwarder.run(self.shutdown.clone()));
    }
}

/// Feeds the daemon's session stream into the agent session, reconnecting until shutdown.
struct SessionForwarder {
    daemon: DaemonClient,
    secret_env: String,
    peer: Peer<RoleServer>,
}

/// Why one connection of the session stream ended.
#[derive(Debug)]
enum SessionEnd {
    /// The daemon closed the stream (it is stopping, or it let this session go).
    Closed,
    /// Opening or reading the stream failed.
    Failed(ClientError),
    /// The agent session no longer takes notifications: it is ending.
    AgentGone,
}

impl SessionForwarder {
    async fn run(self, shutdown: CancellationToken) {
        let mut reconnect = Reconnect::default();
        // The last problem logged, so a daemon that stays down is reported once, not every 5s.
        let mut reported: Option<String> = None;
        loop {
            let end = tokio::select! {
                () = shutdown.cancelled() => return,
                end = self.stream_once(&mut reconnect, &mut reported) => end,
            };
            let delay = match &end {
                SessionEnd::AgentGone => {
                    tracing::debug!(
                        "the agent session stopped taking notifications; stopping the session stream"
                    );
                    return;
                }
                SessionEnd::Closed => {
                    tracing::info!(daemon = %self.daemon.address(), "the daemon closed the session stream; reconnecting");
                    reconnect.after_failure(None)
                }
                SessionEnd::Failed(error) => {
                    let problem =
                        session_problem(error, self.daemon.agent(), &self.secret_env, self.daemon.address());
                    if reported.as_deref() == Some(problem.text.as_str()) {
                        tracing::debug!("{}", problem.text);
                    } else {
                        match problem.severity {
                            Severity::Warn => tracing::warn!("{}", problem.text),
                            Severity::Error => tracing::error!("{}", problem.text),
                        }
                        reported = Some(problem.text);
                    }
                    reconnect.after_failure(Some(error))
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One connection: open the stream, push envelopes until it ends.
    async fn stream_once(&self, reconnect: &mut Reconnect, reported: &mut Option<String>) -> SessionEnd {
        let mut session = match self.daemon.open_session().await {
            Ok(session) => session,
            Err(error) => return SessionEnd::Failed(error),
        };
        reconnect.connected();
        if reported.take().is_some() {
            tracing::info!(daemon = %self.daemon.address(), session_id = %session.session_id, "connected to the switchboard daemon again");
        } else {
            tracing::info!(daemon = %self.daemon.address(), session_id = %session.session_id, "connected to the switchboard daemon");
        }
        loop {
            match session.next_event().await {
                Ok(Some(SessionEvent::Envelope(envelope))) => {
                    let notification =
                        ServerNotification::CustomNotification(channel_notification(&envelope));
                    if self.peer.send_notification(notification).await.is_err() {
                        return SessionEnd::AgentGone;
                    }
                    tracing::debug!(trace_id = %envelope.trace_id, redelivered = envelope.redelivered, "envelope pushed into the agent session");
                }
                Ok(Some(SessionEvent::Heartbeat)) => {}
                Ok(Some(SessionEvent::Hello { .. })) => {
                    tracing::warn!("the daemon said hello twice on one session stream; ignoring it");
                }
                Ok(None) => return SessionEnd::Closed,
                // One bad line does not spoil the stream; its envelope stays pending in the
                // ledger and is listed by `pending`.
                Err(error @ ClientError::Protocol { .. }) => {
                    tracing::warn!("skipping a session line: {error}")
                }
                Err(error) => return SessionEnd::Failed(error),
            }
        }
    }
}

/// Delays between attempts to open the session stream.
#[derive(Debug)]
struct Reconnect {
    backoff: Backoff,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self { backoff: Backoff::new(FIRST_RECONNECT_DELAY, MAX_RECONNECT_DELAY) }
    }
}

impl Reconnect {
    fn connected(&mut self) {
        self.backoff.reset();
    }

    /// The wait before the next attempt. A refusal waits [`REFUSED_RETRY_DELAY`]; anything
    /// else backs off from [`FIRST_RECONNECT_DELAY`] to [`MAX_RECONNECT_DELAY`].
    fn after_failure(&mut self, error: Option<&ClientError>) -> Duration {
        if error.is_some_and(|e| matches!(e, ClientError::Refused { .. })) {
            return REFUSED_RETRY_DELAY;
        }
        self.backoff.next_delay()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Severity {
    Warn,
    Error,
}

/// A session-stream failure as the operator reads it on stderr.
#[derive(Debug, PartialEq, Eq)]
struct SessionProblem {
    severity: Severity,
    text: String,
}

fn session_problem(
    error: &ClientError,
    agent: &AgentName,
    secret_env: &str,
    address: std::net::SocketAddr,
) -> SessionProblem {
    let retry_secs = REFUSED_RETRY_DELAY.as_secs();
    let (severity, text) = match error {
        ClientError::Refused { error: refusal, .. } => match refusal.code {
            ErrorCode::SessionConflict => (
                Severity::Error,
                format!(
                    "another session for agent '{agent}' is already connected to the switchboard daemon at \
                     {address}; this one gets no messages until that one ends (checking again every {retry_secs}s)"
                ),
            ),
            ErrorCode::Unauthorized => (
                Severity::Error,
                format!(
                    "the switchboard daemon at {address} refused the secret of agent '{agent}' (from ${secret_env}): \
                     {}; `switchboard run` and `switchboard channel` need the same value (retrying every {retry_secs}s)",
                    refusal.message
                ),
            ),
            _ => (
                Severity::Warn,
                format!(
                    "the switchboard daemon at {address} refused the session stream: {} (retrying every {retry_secs}s)",
                    refusal.message
                ),
            ),
        },
        ClientError::Unreachable { .. } => (Severity::Warn, format!("{error}; retrying until it is")),
        ClientError::NoAnswer { .. } | ClientError::Protocol { .. } => {
            (Severity::Warn, format!("lost the session stream: {error}; reconnecting"))
        }
    };
    SessionProblem { severity, text }
}

// ---- pure conversions and texts ----

/// The instructions the agent session shows the model.
fn instructions(agent: &AgentName) -> String {
    format!(
        "Telegram conversations reach you through switchboard (you are its agent '{agent}').\n\
         \n\
         - Each incoming message arrives as a <channel> notification. Its meta says where it came from: \
         trace_id (env_…, identifies this message), chat_id, chat_type, chat_title, thread_id (forum topic), \
         message_id, user, user_id, ts, route; redelivered=\"true\" marks a message an earlier session \
         received but never answered, edited=\"true\" an edit of an earlier message.\n\
         - Answer with the `reply` tool. It goes back to the chat and topic of the message, threaded to it. \
         When more than one conversation is waiting, name the one you answer with trace_id (always safe to \
         pass); without it the reply is refused and the waiting conversations are listed.\n\
         - `pending` lists the conversations still waiting for an answer.\n\
         - `ack` marks a message handled without replying (when it needs no answer); add a short note.\n\
         - A failed tool says what to do next. If a reply's delivery is reported as unresolved or unknown, \
         do NOT send it again, not even reworded: it may already have been delivered, and an operator \
         reconciles it."
    )
}

/// The `meta` of a channel notification: a flat map of string values under identifier
/// keys, which Claude Code shows as attributes of the `<channel>` tag.
fn channel_meta(envelope: &DeliveredEnvelope) -> BTreeMap<&'static str, String> {
    let mut meta = BTreeMap::from([
        ("trace_id", envelope.trace_id.clone()),
        ("chat_id", envelope.chat_id.to_string()),
        ("chat_type", envelope.chat_type.clone()),
        ("message_id", envelope.message_id.to_string()),
        ("user", envelope.user.clone()),
        ("user_id", envelope.user_id.to_string()),
        ("ts", envelope.ts.clone()),
        ("route", envelope.route.clone()),
    ]);
    if let Some(thread_id) = envelope.thread_id {
        meta.insert("thread_id", thread_id.to_string());
    }
    if let Some(title) = envelope.chat_title.as_ref().filter(|title| !title.is_empty()) {
        meta.insert("chat_title", title.clone());
    }
    if envelope.redelivered {
        meta.insert("redelivered", "true".to_owned());
    }
    if envelope.edited {
        meta.insert("edited", "true".to_owned());
    }
    meta
}

fn channel_notification(envelope: &DeliveredEnvelope) -> CustomNotification {
    let params = json!({ "content": envelope.content, "meta": channel_meta(envelope) });
    CustomNotification::new(CHANNEL_NOTIFICATION_METHOD, Some(params))
}

fn parse_trace_id(raw: &str) -> Result<TraceId, String> {
    TraceId::parse(raw).map_err(|problem| {
        format!("{problem}. Call `pending` to see the trace ids of the waiting conversations. Nothing was changed.")
    })
}

/// A blank trace id counts as none: the daemon then picks the only waiting conversation
/// or refuses, it never guesses.
fn optional_trace_id(raw: Option<&str>) -> Result<Option<TraceId>, String> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(raw) => parse_trace_id(raw).map(Some),
    }
}

/// "chat -1001234 "Ops", topic 42"
fn describe_place(chat_id: i64, chat_title: Option<&str>, thread_id: Option<i32>) -> String {
    let mut place = format!("chat {chat_id}");
    if let Some(title) = chat_title.filter(|title| !title.is_empty()) {
        let _ = write!(place, " \"{title}\"");
    }
    if let Some(thread_id) = thread_id {
        let _ = write!(place, ", topic {thread_id}");
    }
    place
}

fn describe_receipt(receipt: &ReplyReceipt) -> String {
    let place = describe_place(receipt.chat_id, None, receipt.thread_id);
    let ids = receipt.message_ids.iter().map(i32::to_string).collect::<Vec<_>>().join(", ");
    let messages = match receipt.message_ids.len() {
        1 => format!("Telegram message id {ids}"),
        n => format!("{n} messages, Telegram message ids {ids}"),
    };
    format!(
        "Reply delivered to {place} (route {}), answering {}: {messages}.",
        receipt.route, receipt.trace_id
    )
}

fn describe_ack(receipt: &AckReceipt, noted: bool) -> String {
    let note = if noted { " Your note was recorded." } else { "" };
    format!(
        "{} is marked as handled without a reply (state: {}); nothing was sent to Telegram.{note}",
        receipt.trace_id, receipt.state
    )
}

/// One line per waiting conversation: everything needed to pick it and answer it.
fn describe_candidate(candidate: &PendingSummary) -> String {
    let place = describe_place(candidate.chat_id, candidate.chat_title.as_deref(), candidate.thread_id);
    format!(
        "- trace_id {}: {place}, from {}, at {} (route {}): \"{}\"",
        candidate.trace_id, candidate.user, candidate.ts, candidate.route, candidate.preview
    )
}

fn describe_candidates(candidates: &[PendingSummary]) -> String {
    candidates.iter().map(describe_candidate).collect::<Vec<_>>().join("\n")
}

fn describe_pending(list: &PendingList) -> String {
    match list.pending.len() {
        0 => "No conversation is waiting for an answer.".to_owned(),
        n => {
            let waiting =
                if n == 1 { "1 conversation is".to_owned() } else { format!("{n} conversations are") };
            format!(
                "{waiting} waiting for an answer:\n{}\n\nAnswer one with `reply` (trace_id set to it), or mark it \
                 handled with `ack`.",
                describe_candidates(&list.pending)
            )
        }
    }
}

/// What a failed tool call tells the model: what happened, and what to do about it.
fn describe_failure(tool: ToolName, error: &ClientError, agent: &AgentName, secret_env: &str) -> String {
    let name = tool.as_str();
    match error {
        ClientError::Unreachable { .. } => match tool {
            ToolName::Reply => format!("{error} Nothing was sent; call reply again once the daemon is back."),
            ToolName::Ack => format!("{error} Nothing was changed; call ack again once the daemon is back."),
            ToolName::Pending => format!("{error} Try again once the daemon is back."),
        },
        ClientError::NoAnswer { .. } => match tool {
            ToolName::Reply => format!(
                "{error}. The reply may or may not have been delivered: do NOT send it again. Tell the operator; \
                 `switchboard ledger` shows what happened."
            ),
            ToolName::Ack => format!(
                "{error}. The ack may or may not have been recorded: call `pending` once the daemon answers and ack \
                 again only if the message is still listed."
            ),
            ToolName::Pending => format!("{error}. Try again in a moment."),
        },
        ClientError::Protocol { .. } => {
            let outcome = match tool {
                ToolName::Reply => " Whether the reply was delivered is unknown: do NOT send it again.",
                ToolName::Ack | ToolName::Pending => "",
            };
            format!("{error}. The plugin and the daemon may be different versions of switchboard.{outcome}")
        }
        ClientError::Refused { error: refusal, .. } => {
            let message = &refusal.message;
            match refusal.code {
                ErrorCode::Ambiguous => format!(
                    "{name} was refused: {message}\n\nWaiting conversations:\n{}\n\nNothing was sent: call reply \
                     again with trace_id set to one of these.",
                    describe_candidates(&refusal.candidates)
                ),
                ErrorCode::Unresolved => format!(
                    "{name} failed: {message}\n\nDo NOT send this reply again, not even reworded: it may already \
                     have been delivered. The message stays unresolved until an operator reconciles it with \
                     `switchboard ledger`."
                ),
                ErrorCode::Unauthorized => format!(
                    "{name} was refused: {message}\n\nThe daemon did not accept this plugin's secret for agent \
                     '{agent}'. The operator must give the variable {secret_env} the same value for `switchboard \
                     channel` as for `switchboard run`. Nothing was changed."
                ),
                _ => format!("{name} was refused: {message}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::*;
    use crate::api::wire::ApiError;

    fn envelope() -> DeliveredEnvelope {
        DeliveredEnvelope {
            trace_id: "env_abcdefghij".into(),
            content: "hello there".into(),
            chat_id: -1001234567890,
            thread_id: None,
            chat_type: "supergroup".into(),
            chat_title: None,
            message_id: 77,
            user: "@ann".into(),
            user_id: 42,
            ts: "2025-01-02T03:04:05Z".into(),
            route: "ops".into(),
            redelivered: false,
            edited: false,
        }
    }

    fn candidate(trace_id: &str, thread_id: Option<i32>, preview: &str) -> PendingSummary {
        PendingSummary {
            trace_id: trace_id.into(),
            chat_id: -100777,
            thread_id,
            chat_title: Some("Ops".into()),
            user: "@bob".into(),
            route: "ops-topic".into(),
            ts: "2025-01-02T03:04:05Z".into(),
            preview: preview.into(),
        }
    }

    fn agent() -> AgentName {
        AgentName::parse("worker").unwrap()
    }

    fn refused(code: ErrorCode, message: &str, candidates: Vec<PendingSummary>) -> ClientError {
        ClientError::Refused {
            status: StatusCode::CONFLICT,
            error: ApiError { code, message: message.into(), candidates },
        }
    }

    fn unreachable() -> ClientError {
        ClientError::Unreachable {
            address: "127.0.0.1:7797".parse().unwrap(),
            detail: "Connection refused (os error 111)".into(),
        }
    }

    #[test]
    fn meta_has_the_required_keys_as_strings() {
        let meta = channel_meta(&envelope());
        let expected = BTreeMap::from([
            ("trace_id", "env_abcdefghij".to_owned()),
            ("chat_id", "-1001234567890".to_owned()),
            ("chat_type", "supergroup".to_owned()),
            ("message_id", "77".to_owned()),
            ("user", "@ann".to_owned()),
            ("user_id", "42".to_owned()),
            ("ts", "2025-01-02T03:04:05Z".to_owned()),
            ("route", "ops".to_owned()),
        ]);
        assert_eq!(meta, expected);
    }

    #[test]
    fn meta_adds_optional_keys_only_when_they_apply() {
        let envelope = DeliveredEnvelope {
            thread_id: Some(42),
            chat_title: Some("Ops room".into()),
            redelivered: true,
            edited: true,
            ..envelope()
        };
        let meta = channel_meta(&envelope);
        assert_eq!(meta["thread_id"], "42");
        assert_eq!(meta["chat_title"], "Ops room");
        assert_eq!(meta["redelivered"], "true");
        assert_eq!(meta["edited"], "true");

        let untitled = DeliveredEnvelope { chat_title: Some(String::new()), ..envelope };
        assert!(!channel_meta(&untitled).contains_key("chat_title"));
    }

    #[test]
    fn meta_keys_are_identifiers() {
        let envelope = DeliveredEnvelope {
            thread_id: Some(1),
            chat_title: Some("t".into()),
            redelivered: true,
            edited: true,
            ..envelope()
        };
        for key in channel_meta(&envelope).keys() {
            let mut chars = key.chars();
            let first = chars.next().unwrap();
            assert!(first.is_ascii_lowercase(), "{key}");
            assert!(chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{key}");
        }
    }

    #[test]
    fn notification_carries_content_and_flat_string_meta() {
        let notification = channel_notification(&DeliveredEnvelope { thread_id: Some(9), ..envelope() });
        assert_eq!(notification.method, "notifications/claude/channel");
        let params = notification.params.unwrap();
        assert_eq!(params["content"], "hello there");
        let meta = params["meta"].as_object().unwrap();
        assert!(meta.values().all(serde_json::Value::is_string));
        assert_eq!(meta["thread_id"], "9");
        assert_eq!(params.as_object().unwrap().len(), 2, "only content and meta: {params}");
    }

    #[test]
    fn trace_ids_are_checked_before_asking_the_daemon() {
        assert_eq!(optional_trace_id(None), Ok(None));
        assert_eq!(optional_trace_id(Some("  ")), Ok(None));
        assert_eq!(optional_trace_id(Some(" env_abcdefghij\n")).unwrap().unwrap().as_str(), "env_abcdefghij");
        let error = optional_trace_id(Some("latest")).unwrap_err();
        assert!(error.contains("'latest' is not a trace id"), "{error}");
        assert!(error.contains("`pending`"), "{error}");
    }

    #[test]
    fn receipt_says_what_was_sent_where() {
        let receipt = ReplyReceipt {
            trace_id: "env_abcdefghij".into(),
            chat_id: -100777,
            thread_id: Some(42),
            route: "ops-topic".into(),
            message_ids: vec![501, 502],
        };
        assert_eq!(
            describe_receipt(&receipt),
            "Reply delivered to chat -100777, topic 42 (route ops-topic), answering env_abcdefghij: \
             2 messages, Telegram message ids 501, 502."
        );
        let single = ReplyReceipt { thread_id: None, message_ids: vec![9], ..receipt };
        assert_eq!(
            describe_receipt(&single),
            "Reply delivered to chat -100777 (route ops-topic), answering env_abcdefghij: Telegram message id 9."
        );
    }

    #[test]
    fn pending_lists_every_conversation() {
        assert_eq!(
            describe_pending(&PendingList { pending: vec![] }),
            "No conversation is waiting for an answer."
        );
        let text = describe_pending(&PendingList {
            pending: vec![
                candidate("env_aaaaaaaaaa", Some(42), "first"),
                candidate("env_bbbbbbbbbb", None, "second"),
            ],
        });
        assert!(text.starts_with("2 conversations are waiting for an answer:\n"), "{text}");
        assert!(
            text.contains(
                "- trace_id env_aaaaaaaaaa: chat -100777 \"Ops\", topic 42, from @bob, at 2025-01-02T03:04:05Z \
                 (route ops-topic): \"first\""
            ),
            "{text}"
        );
        assert!(text.contains("- trace_id env_bbbbbbbbbb: chat -100777 \"Ops\", from @bob"), "{text}");
    }

    #[test]
    fn ambiguous_reply_lists_every_candidate_and_asks_for_a_trace_id() {
        let error = refused(
            ErrorCode::Ambiguous,
            "2 conversations are waiting",
            vec![candidate("env_aaaaaaaaaa", Some(42), "first"), candidate("env_bbbbbbbbbb", None, "second")],
        );
        let text = describe_failure(ToolName::Reply, &error, &agent(), "WORKER_SECRET");
        assert!(text.starts_with("reply was refused: 2 conversations are waiting"), "{text}");
        assert!(
            text.contains("trace_id env_aaaaaaaaaa: chat -100777 \"Ops\", topic 42, from @bob"),
            "{text}"
        );
        assert!(text.contains("\"first\""), "{text}");
        assert!(text.contains("trace_id env_bbbbbbbbbb"), "{text}");
        assert!(text.contains("\"second\""), "{text}");
        assert!(text.contains("Nothing was sent"), "{text}");
        assert!(text.ends_with("call reply again with trace_id set to one of these."), "{text}");
    }

    #[test]
    fn unresolved_reply_forbids_a_retry() {
        let error = refused(ErrorCode::Unresolved, "the send timed out", vec![]);
        let text = describe_failure(ToolName::Reply, &error, &agent(), "WORKER_SECRET");
        assert!(text.contains("the send timed out"), "{text}");
        assert!(text.contains("Do NOT send this reply again"), "{text}");
    }

    #[test]
    fn unreachable_daemon_is_named_with_its_address() {
        let text = describe_failure(ToolName::Pending, &unreachable(), &agent(), "WORKER_SECRET");
        assert!(
            text.starts_with("switchboard daemon at 127.0.0.1:7797 is not reachable: Connection refused"),
            "{text}"
        );
        assert!(text.contains("is `switchboard run` running?"), "{text}");
        let reply = describe_failure(ToolName::Reply, &unreachable(), &agent(), "WORKER_SECRET");
        assert!(reply.contains("Nothing was sent"), "{reply}");
    }

    #[test]
    fn lost_answer_to_a_reply_is_not_retried() {
        let error = ClientError::NoAnswer {
            address: "127.0.0.1:7797".parse().unwrap(),
            detail: "connection reset".into(),
        };
        let text = describe_failure(ToolName::Reply, &error, &agent(), "WORKER_SECRET");
        assert!(text.contains("may or may not have been delivered: do NOT send it again"), "{text}");
    }

    #[test]
    fn refused_secret_names_the_variable() {
        let error = refused(ErrorCode::Unauthorized, "bad credentials", vec![]);
        let text = describe_failure(ToolName::Ack, &error, &agent(), "WORKER_SECRET");
        assert!(text.contains("bad credentials"), "{text}");
        assert!(text.contains("WORKER_SECRET"), "{text}");
        assert!(text.contains("'worker'"), "{text}");
    }

    #[test]
    fn other_refusals_pass_the_daemons_message_on() {
        let error = refused(ErrorCode::NotYours, "env_abcdefghij belongs to another agent", vec![]);
        assert_eq!(
            describe_failure(ToolName::Reply, &error, &agent(), "S"),
            "reply was refused: env_abcdefghij belongs to another agent"
        );
    }

    #[test]
    fn reconnect_backs_off_to_a_cap_and_resets_on_success() {
        let mut reconnect = Reconnect::default();
        let delays: Vec<_> = (0..6).map(|_| reconnect.after_failure(Some(&unreachable()))).collect();
        let millis: Vec<_> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [500, 1000, 2000, 4000, 5000, 5000]);
        reconnect.connected();
        assert_eq!(reconnect.after_failure(None), FIRST_RECONNECT_DELAY);
    }

    #[test]
    fn refusals_retry_slowly() {
        let mut reconnect = Reconnect::default();
        let conflict = refused(ErrorCode::SessionConflict, "taken", vec![]);
        assert_eq!(reconnect.after_failure(Some(&conflict)), REFUSED_RETRY_DELAY);
        assert_eq!(reconnect.after_failure(Some(&conflict)), REFUSED_RETRY_DELAY);
    }

    #[test]
    fn session_problems_say_what_is_wrong() {
        let address = "127.0.0.1:7797".parse().unwrap();
        let conflict =
            session_problem(&refused(ErrorCode::SessionConflict, "taken", vec![]), &agent(), "S", address);
        assert_eq!(conflict.severity, Severity::Error);
        assert!(
            conflict.text.starts_with("another session for agent 'worker' is already connected"),
            "{conflict:?}"
        );

        let secret = session_problem(
            &refused(ErrorCode::Unauthorized, "no", vec![]),
            &agent(),
            "WORKER_SECRET",
            address,
        );
        assert_eq!(secret.severity, Severity::Error);
        assert!(
            secret.text.contains("refused the secret of agent 'worker' (from $WORKER_SECRET)"),
            "{secret:?}"
        );

        let down = session_problem(&unreachable(), &agent(), "S", address);
        assert_eq!(down.severity, Severity::Warn);
        assert!(down.text.contains("127.0.0.1:7797 is not reachable"), "{down:?}");
    }

    #[test]
    fn instructions_explain_the_protocol() {
        let text = instructions(&agent());
        for needle in
            ["<channel>", "trace_id", "`reply`", "`pending`", "`ack`", "do NOT send it again", "'worker'"]
        {
            assert!(text.contains(needle), "instructions lack {needle}: {text}");
        }
    }
}
