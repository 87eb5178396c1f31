//! `switchboard channel --agent NAME`: the MCP channel plugin an agent session starts
//! (DESIGN.md §5).
//!
//! It speaks MCP over stdio to the agent session (Claude Code) and HTTP to the daemon's
//! local API ([`crate::agents::api::client`]). Once the agent session is ready to take them
//! (it finished its handshake and listed the tools, see [`startup`]), the plugin opens the
//! agent's session stream and pushes every envelope into the session as a
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CustomNotification, DiscoverRequestMethod,
    DiscoverResult, ExperimentalCapabilities, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ResultType, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext, ServerInitializeError};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::api::client::{ClientError, DaemonClient, DaemonTls};
use crate::agents::api::wire::{
    AckRequest, AttachmentQuery, EditRequest, ErrorCode, HandoffReceipt, HandoffRequest,
    MessageActionReceipt, ReactRequest, ReplyRequest, RevisionRequest,
};
use crate::config::Settings;
use crate::ids::{AgentName, RequestId, TraceId};
use crate::telegram::format::ReplyFormat;
use crate::telegram::reactions::allowed_reaction;

mod calls;
mod downloads;
mod forwarder;
pub mod inbox;
mod outgoing;
mod permissions;
mod shown;
mod startup;
mod stdio;
mod surrogates;
mod texts;

use forwarder::SessionForwarder;
use startup::{ClientEvent, Startup};
use texts::{
    ToolName, ToolNames, bad_argument, describe_ack, describe_action_receipt, describe_call_answer,
    describe_call_not_waited, describe_call_retired, describe_call_timeout, describe_failure,
    describe_handoff_receipt, describe_pending, describe_receipt, describe_recovered_receipt,
    describe_revision, instructions, never_acted_on, optional_telegram_id, optional_trace_id,
    outcome_not_known_yet, parse_trace_id, upload_failed,
};

/// The experimental capability that makes Claude Code treat this server as a channel.
pub const CHANNEL_CAPABILITY: &str = "claude/channel";

/// The notification that carries one envelope into the agent session.
pub const CHANNEL_NOTIFICATION_METHOD: &str = "notifications/claude/channel";

/// Claude Code registers channels on the `initialize` lifecycle, which ends with this
/// revision; a client asking for anything newer is answered with it.
const MAX_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// The MCP server name the guide registers the plugin under (`claude mcp add switchboard
/// …`); `--server-name` tells the plugin another one.
pub const DEFAULT_SERVER_NAME: &str = "switchboard";

/// A server name as `--server-name` takes it: what Claude Code accepts in a tool's name.
pub fn parse_server_name(raw: &str) -> Result<String, String> {
    let valid = !raw.is_empty() && raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "--server-name {raw:?} is not a server name: use the name the agent session knows this server by \
             (letters, digits, '_' and '-'), as in `claude mcp add NAME`"
        ))
    }
}

/// How long the session-stream task may take to stop once the agent session has ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A tool call made while the session stream is (re)connecting waits this long for it:
/// calls are bound to the live session, and a restarting daemon is back within seconds.
const SESSION_WAIT: Duration = Duration::from_secs(3);

/// After the connection broke during a `reply`, how long the plugin keeps asking the
/// daemon what became of it before telling the agent the outcome is not known yet.
const OUTCOME_RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// `call_agent` waits this long for the answer unless told otherwise, and at most
/// [`MAX_CALL_TIMEOUT_SECS`] (DESIGN.md §9).
const DEFAULT_CALL_TIMEOUT_SECS: u64 = 120;
const MAX_CALL_TIMEOUT_SECS: u64 = 600;

/// Pause between two questions about a reply's outcome while the daemon is away.
const OUTCOME_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Runs the channel plugin for `agent` until the agent session closes stdin.
///
/// Fails only when it cannot start: the agent's secret is missing, or the MCP handshake
/// fails. A daemon that is unreachable or refuses the session, even with 401 for a wrong
/// secret, is not a reason to exit: the plugin says so on stderr and in every tool answer
/// and keeps retrying (see the module documentation for why).
pub async fn run(
    settings: Settings,
    agent: AgentName,
    server_name: String,
    inbox: inbox::Inbox,
) -> anyhow::Result<()> {
    let secret = settings
        .agent_secret(&agent)
        .with_context(|| format!("the channel plugin for agent '{agent}' cannot authenticate"))?;
    let secret_env = settings.agents.get(&agent).map(|a| a.token_env.clone()).unwrap_or_default();
    let daemons = settings.api.daemon_urls();
    let tls = DaemonTls::from_settings(&settings.api)?;
    let named: Vec<String> = daemons.iter().map(ToString::to_string).collect();
    // Its forwarder reopens the session stream while a call waits for it.
    let daemon = DaemonClient::for_daemons(daemons, tls, agent.clone(), secret)
        .context("cannot build the HTTP client for the daemon's local API")?
        .retrying_after_a_stale_session(crate::agents::api::client::NEXT_SESSION_WAIT);
    tracing::info!(%agent, daemon = named.join(","), inbox = %inbox.dir().display(), "channel plugin starting");
    let media = Media {
        inbox: Arc::new(inbox),
        eager_photo_max_bytes: settings.media.eager_photo_max_bytes,
        kept_back: Arc::new(outgoing::KeptBack::of(&settings)),
    };

    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let tools = ToolNames::new(&server_name);
    // Only an agent whose approvals have somewhere to go offers to relay them (DESIGN.md §15).
    let relays_permissions = settings.agents.get(&agent).is_some_and(|agent| agent.permissions.is_some());
    let leaving = daemon.clone();
    let mut plugin = ChannelPlugin::new(daemon, secret_env, tools, media, shutdown.clone(), tasks.clone());
    plugin.relays_permissions = relays_permissions;
    let service = match plugin.serve(stdio::transport()).await {
        Ok(service) => service,
        Err(ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("the agent session closed stdin before the MCP handshake; exiting");
            return Ok(());
        }
        Err(e) => return Err(e).context("MCP handshake with the agent session failed"),
    };

    // Claude Code ends a stdio server by closing its stdin and, a moment later, sending it
    // SIGTERM (the MCP SDK's way): either is its agent session ending, and the daemon is
    // told so below. Without the signal handled here, SIGTERM ended the process before it
    // said so, and the daemon kept the agent for a plugin that was gone (a restarted Claude
    // Code then waited for it).
    let terminated = termination_signal()?;
    let quit = tokio::select! {
        quit = service.waiting() => Some(quit),
        () = terminated => None,
    };
    tracing::info!("agent session ended; closing the daemon session");
    // Said before the stream drops, so the daemon frees the agent rather than keep it for
    // this plugin's reconnection; a daemon that does not hear it keeps it a few seconds.
    match tokio::time::timeout(SHUTDOWN_GRACE, leaving.end_session()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!("could not tell the daemon this plugin is leaving: {error}"),
        Err(_) => tracing::debug!("the daemon did not answer that this plugin is leaving"),
    }
    // Dropping the session stream tells the daemon this agent's slot is free again.
    shutdown.cancel();
    tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait()).await.is_err() {
        tracing::warn!("the session stream did not stop within {SHUTDOWN_GRACE:?}; exiting anyway");
    }
    if let Some(quit) = quit {
        quit.context("the MCP service task failed")?;
    }
    Ok(())
}

/// Resolves at SIGTERM or SIGINT, listened for from the moment it is called.
fn termination_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// The MCP server half of the plugin.
struct ChannelPlugin {
    daemon: DaemonClient,
    /// The variable that holds the agent's secret, named in messages about a refused secret.
    secret_env: String,
    instructions: String,
    tool_router: ToolRouter<Self>,
    /// Opens the session stream once the agent session is ready for it.
    stream: StreamStarter,
    /// Set while the daemon refuses this plugin's session stream (another session is
    /// connected, or the secret is wrong): tool calls then need not wait for a session.
    stream_refused: Arc<AtomicBool>,
    /// `call_agent` calls waiting for their answer; shared with the session forwarder.
    calls: calls::WaitingCalls,
    /// Whether the agent has `[agents.NAME.permissions]`: then the plugin declares
    /// `claude/channel/permission` and relays Claude Code's approvals ([`permissions`]).
    relays_permissions: bool,
    /// Relays of permission requests run here, so the session's end waits for them briefly.
    tasks: TaskTracker,
    /// Where attachments land; shared with the session forwarder.
    media: Media,
    /// The envelopes this session was shown, for tools that name a message the way the
    /// official plugin's do; noted by the session forwarder.
    shown: shown::SharedShown,
}

/// The plugin's side of files (DESIGN.md §14): its inbox, and how large a photo it fetches
/// before pushing the envelope.
#[derive(Debug, Clone)]
pub(crate) struct Media {
    inbox: Arc<inbox::Inbox>,
    /// `[media] eager_photo_max_bytes`; 0 is off.
    eager_photo_max_bytes: u64,
    /// Files a reply never sends (switchboard's configuration and ledger).
    kept_back: Arc<outgoing::KeptBack>,
}

/// Arguments of `download_attachment`.
#[derive(Debug, Deserialize, JsonSchema)]
struct DownloadArgs {
    /// The trace_id (env_…) of the message that carries the file. May be left out when
    /// file_id is given: the message you were shown with that file is used.
    #[serde(default)]
    trace_id: Option<String>,
    /// The attachment_file_id from the message's meta; the message's first attachment when omitted.
    #[serde(default)]
    file_id: Option<String>,
}

/// Arguments of the `reply` tool.
#[derive(Debug, Deserialize, JsonSchema)]
struct ReplyArgs {
    /// The message to send, written as `format` says (plain text by default). Long texts are
    /// split into several messages for you.
    text: String,
    /// The trace_id (env_…) of the message you are answering, from its <channel> meta.
    /// Required when more than one conversation is waiting.
    #[serde(default)]
    trace_id: Option<String>,
    /// true (a JSON boolean) to post a further message to a conversation you already
    /// answered, named by trace_id (refused without it). Without again, a reply to an answered message posts nothing and says what your
    /// earlier reply came to (after a cancelled or timed-out call, it may have gone out).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    again: Option<serde_json::Value>,
    /// How text is written: "text" (the default, sent as it is), "markdown" (bold, italics,
    /// code, links, quotes, lists) or "html" (Telegram's HTML: b, i, u, s, code, pre, a,
    /// blockquote, tg-spoiler).
    #[serde(default)]
    format: Option<String>,
    /// Files to send after the text (at most 10): absolute paths on this machine, each at
    /// most 50 MB. Images (.jpg .jpeg .png .webp) go as photos (as documents over 10 MB),
    /// .gif as an animation, .mp4 .mov as a video, .ogg .oga .opus as a voice note, .mp3
    /// .m4a .flac .wav as audio, anything else as a document. One file that is missing,
    /// unreadable or too large refuses the whole reply before anything is sent.
    #[serde(default)]
    files: Option<Vec<String>>,
    /// Optional: the chat_id of the <channel> tag of the message you answer. It never sends
    /// anywhere by itself: it only makes sure the reply answers a message of that chat
    /// (refused otherwise). trace_id is what names the message.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    chat_id: Option<serde_json::Value>,
    /// Optional: the message_id of the <channel> tag of the message you answer; like
    /// chat_id, it only makes sure the reply answers that message.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    reply_to: Option<serde_json::Value>,
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

/// Arguments of `react`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ReactArgs {
    /// The trace_id (env_…) of the message whose conversation you react in. May be left
    /// out when chat_id and message_id name the message.
    #[serde(default)]
    trace_id: Option<String>,
    /// One of Telegram's reaction emoji, e.g. "👍", "👀", "🎉", "🔥", "🙏", "👌", "🤔".
    emoji: String,
    /// The chat_id of the <channel> tag: with message_id, it names the message without
    /// trace_id; with trace_id, it must be that message's chat.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    chat_id: Option<serde_json::Value>,
    /// The message to react to when it is not the envelope's own: a message of a <channel>
    /// tag, or one the bot sent in that chat (the ids your replies' answers name). A number,
    /// or its digits as a string.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    message_id: Option<serde_json::Value>,
}

/// Arguments of `edit_message`.
#[derive(Debug, Deserialize, JsonSchema)]
struct EditArgs {
    /// The trace_id (env_…) of the message whose conversation the edited message is in.
    /// May be left out when chat_id is given.
    #[serde(default)]
    trace_id: Option<String>,
    /// The chat_id of the <channel> tag: it names the chat without trace_id; with trace_id,
    /// it must be that message's chat.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    chat_id: Option<serde_json::Value>,
    /// The id of a message you sent there (from your reply's answer). A number, or its
    /// digits as a string.
    #[schemars(with = "String")]
    message_id: serde_json::Value,
    /// The new text, at most one Telegram message.
    text: String,
    /// "text" (default), "markdown" or "html", as for reply.
    #[serde(default)]
    format: Option<String>,
}

/// Arguments of `revise_task`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ReviseArgs {
    /// The trace_id (env_…) of the message that changes the task.
    trace_id: String,
    /// "correction", "new_objective", "pause" or "cancel".
    kind: String,
    /// What changed, in a few words (shown in the task's lineage).
    #[serde(default)]
    summary: Option<String>,
}

/// Arguments of `send_to_agent`.
#[derive(Debug, Deserialize, JsonSchema)]
struct SendArgs {
    /// The agent to hand the work to.
    agent: String,
    /// The instruction, as you would write it to a colleague.
    text: String,
    /// The trace_id (env_…) of the message this work is for. Required when more than one
    /// conversation is waiting.
    #[serde(default)]
    trace_id: Option<String>,
    /// true (a JSON boolean) when this changes an instruction you already gave that agent.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    followup: Option<serde_json::Value>,
    /// With followup: "extends" (adds to the earlier instruction) or "replaces" (supersedes it).
    #[serde(default)]
    intent: Option<String>,
}

/// Arguments of `call_agent`.
#[derive(Debug, Deserialize, JsonSchema)]
struct CallArgs {
    #[serde(flatten)]
    handoff: SendArgs,
    /// How long to wait for the answer, in seconds (default 120, at most 600).
    #[serde(default)]
    timeout_secs: Option<u64>,
}

impl SendArgs {
    fn request(self) -> Result<HandoffRequest, String> {
        let trace_id = optional_trace_id(self.trace_id.as_deref())?;
        Ok(HandoffRequest {
            to: self.agent,
            text: self.text,
            trace_id: trace_id.map(|id| id.to_string()),
            followup: self.followup,
            intent: self.intent,
            request_id: RequestId::generate().to_string(),
        })
    }
}

/// The tools, named in failure messages.
#[tool_router]
impl ChannelPlugin {
    fn new(
        daemon: DaemonClient,
        secret_env: String,
        tools: ToolNames,
        media: Media,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        let instructions = instructions(daemon.agent(), &tools);
        let stream_refused = Arc::<AtomicBool>::default();
        let calls = calls::WaitingCalls::default();
        let shown = shown::SharedShown::default();
        let stream = StreamStarter {
            startup: Arc::default(),
            daemon: daemon.clone(),
            secret_env: secret_env.clone(),
            tools,
            refused: Arc::clone(&stream_refused),
            calls: calls.clone(),
            media: media.clone(),
            shown: shown.clone(),
            shutdown,
            tasks: tasks.clone(),
        };
        Self {
            daemon,
            secret_env,
            instructions,
            tool_router: Self::tool_router(),
            stream,
            stream_refused,
            calls,
            relays_permissions: false,
            tasks,
            media,
            shown,
        }
    }

    #[tool(
        description = "Save an attachment of a message (a document, voice note, video, photo…) on this machine and \
                       answer with its absolute path. Pass the message's trace_id and, when it has several \
                       attachments, the attachment_file_id from its meta. Telegram serves files up to 20 MB.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn download_attachment(
        &self,
        Parameters(args): Parameters<DownloadArgs>,
    ) -> Result<String, String> {
        let file_id = args.file_id.filter(|id| !id.trim().is_empty());
        let trace_id = match (args.trace_id.as_deref(), &file_id) {
            (Some(trace_id), _) => parse_trace_id(trace_id)?,
            (None, Some(file_id)) => match self.shown.trace_id_of_file(file_id) {
                Some(trace_id) => parse_trace_id(&trace_id)?,
                None => {
                    return Err(bad_argument(
                        "trace_id is missing and no message this session was shown carries that file_id: pass \
                         the trace_id of the message with the file. Nothing was downloaded.",
                    ));
                }
            },
            (None, None) => {
                return Err(bad_argument(
                    "name the file: the trace_id of its message (and its file_id for another than the first). \
                     Nothing was downloaded.",
                ));
            }
        };
        self.wait_for_session().await;
        let query = AttachmentQuery { file_id, max_bytes: None };
        match downloads::download_into(&self.daemon, &self.media.inbox, trace_id.as_str(), &query).await {
            Ok(saved) => Ok(downloads::describe_saved(&saved)),
            Err(downloads::DownloadFailure::Daemon(error)) => {
                Err(self.tool_failure(ToolName::DownloadAttachment, &error))
            }
            Err(error) => {
                tracing::warn!(trace_id = %trace_id, "download_attachment failed: {error}");
                Err(error.to_string())
            }
        }
    }

    #[tool(
        description = "Send a reply to the Telegram conversation a <channel> message came from. \
                       Name the message with trace_id whenever more than one conversation is waiting; \
                       without it the reply is refused and the waiting conversations are listed. \
                       A message already answered gets a further message only with its trace_id and again: true; \
                       without it nothing is posted and you are told what your earlier reply came to.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn reply(
        &self,
        Parameters(args): Parameters<ReplyArgs>,
        cancelled: CancellationToken,
    ) -> Result<String, String> {
        if args.text.trim().is_empty() {
            return Err(bad_argument("text is empty: there is nothing to send. Nothing was sent."));
        }
        let trace_id = optional_trace_id(args.trace_id.as_deref())?;
        // Refused here, before anything is asked of the daemon (which checks it too).
        ReplyFormat::parse(args.format.as_deref()).map_err(bad_argument)?;
        let files = outgoing::check_files(args.files.as_deref().unwrap_or_default(), &self.media.kept_back)
            .map_err(bad_argument)?;
        let request = ReplyRequest {
            again: args.again,
            format: args.format,
            chat_id: optional_telegram_id("chat_id", args.chat_id.as_ref())?,
            reply_to: optional_telegram_id("reply_to", args.reply_to.as_ref())?,
            ..ReplyRequest::new(args.text, trace_id.map(|id| id.to_string()))
        };
        tokio::select! {
            outcome = self.upload_and_reply(request.clone(), &files) => outcome,
            // The agent session gave up on the call (the user pressed Esc). Stop waiting: a
            // reply the daemon started delivering is delivered or recorded on its own; one
            // cancelled before that (its files still uploading, its decision not made) was
            // never sent, and its conversation still waits.
            () = cancelled.cancelled() => {
                tracing::info!(request_id = %request.request_id, "reply cancelled by the agent session; a delivery the daemon started settles on its own");
                Err(format!(
                    "The reply call was cancelled ({}). If the daemon had started delivering it, it still \
                     settles it; if not, nothing was sent. `pending` shows which: a conversation listed with no \
                     reply on its way still waits.",
                    request.request_id
                ))
            }
        }
    }

    #[tool(
        description = "Set a reaction (one of Telegram's reaction emoji) on the message of an envelope, or with \
                       message_id on a message the bot sent in its chat. It answers nothing: reply or ack as usual.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn react(&self, Parameters(args): Parameters<ReactArgs>) -> Result<String, String> {
        let chat_id = optional_telegram_id("chat_id", args.chat_id.as_ref())?;
        let message_id = optional_telegram_id("message_id", args.message_id.as_ref())?;
        let trace_id = self.conversation_acted_in(args.trace_id.as_deref(), chat_id, message_id)?;
        // Refused here, before anything is asked of the daemon (which checks it too).
        allowed_reaction(&args.emoji).map_err(bad_argument)?;
        let request = ReactRequest {
            trace_id: trace_id.to_string(),
            emoji: args.emoji,
            message_id,
            chat_id,
            request_id: RequestId::generate().to_string(),
        };
        self.wait_for_session().await;
        match self.daemon.react(&request).await {
            Ok(receipt) => Ok(describe_action_receipt(&receipt)),
            Err(error @ (ClientError::NoAnswer { .. } | ClientError::Protocol { .. })) => {
                self.recover_action(ToolName::React, &error, || self.daemon.react(&request)).await
            }
            Err(error) => Err(self.tool_failure(ToolName::React, &error)),
        }
    }

    #[tool(
        description = "Replace the text of a message you sent (message_id, from your reply's answer) in the \
                       conversation of trace_id. Use it for progress; send the result with reply, since an edit \
                       does not notify the user. format as for reply.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn edit_message(&self, Parameters(args): Parameters<EditArgs>) -> Result<String, String> {
        let chat_id = optional_telegram_id("chat_id", args.chat_id.as_ref())?;
        let trace_id = self.conversation_acted_in(args.trace_id.as_deref(), chat_id, None)?;
        if args.text.trim().is_empty() {
            return Err(bad_argument(
                "text is empty: there is nothing to edit the message to. Nothing was edited.",
            ));
        }
        ReplyFormat::parse(args.format.as_deref()).map_err(bad_argument)?;
        let message_id = optional_telegram_id("message_id", Some(&args.message_id))?.ok_or_else(|| {
            bad_argument("message_id is required: the id of a message you sent there. Nothing was edited.")
        })?;
        let request = EditRequest {
            trace_id: trace_id.to_string(),
            message_id,
            text: args.text,
            format: args.format,
            chat_id,
            request_id: RequestId::generate().to_string(),
        };
        self.wait_for_session().await;
        match self.daemon.edit_message(&request).await {
            Ok(receipt) => Ok(describe_action_receipt(&receipt)),
            Err(error @ (ClientError::NoAnswer { .. } | ClientError::Protocol { .. })) => {
                self.recover_action(ToolName::EditMessage, &error, || self.daemon.edit_message(&request))
                    .await
            }
            Err(error) => Err(self.tool_failure(ToolName::EditMessage, &error)),
        }
    }

    #[tool(
        description = "List the conversations waiting for an answer: trace_id, chat, topic, sender and the \
                       start of each message.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn pending(&self) -> Result<String, String> {
        self.wait_for_session().await;
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
        self.wait_for_session().await;
        match self.daemon.ack(&AckRequest { trace_id: trace_id.to_string(), note }).await {
            Ok(receipt) => Ok(describe_ack(&receipt, noted)),
            Err(error) => Err(self.tool_failure(ToolName::Ack, &error)),
        }
    }

    #[tool(
        description = "Declare that a message you received changes the task it belongs to: kind \"correction\" \
                       (it corrects the instruction: act on this message from now on), \"new_objective\" (it \
                       replaces the task with a new one), \"pause\" or \"cancel\". Recorded and acknowledged \
                       in the chat like the user's own /pause, /cancel or /new.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn revise_task(&self, Parameters(args): Parameters<ReviseArgs>) -> Result<String, String> {
        let trace_id = parse_trace_id(&args.trace_id)?;
        self.wait_for_session().await;
        let request = RevisionRequest {
            trace_id: trace_id.to_string(),
            kind: args.kind,
            summary: args.summary,
            request_id: Some(RequestId::generate().to_string()),
        };
        match self.daemon.revise_task(&request).await {
            Ok(receipt) => Ok(describe_revision(&receipt)),
            // The change may have been recorded: asked again with the same request id, the
            // daemon answers with what it recorded, and records nothing twice.
            Err(broken @ (ClientError::NoAnswer { .. } | ClientError::Protocol { .. })) => {
                tracing::warn!("the connection broke during revise_task ({broken}); asking again");
                match self.once_the_daemon_answers(|| self.daemon.revise_task(&request)).await {
                    Some(Ok(receipt)) => Ok(describe_revision(&receipt)),
                    Some(Err(error)) => Err(self.tool_failure(ToolName::ReviseTask, &error)),
                    None => Err(self.tool_failure(ToolName::ReviseTask, &broken)),
                }
            }
            Err(error) => Err(self.tool_failure(ToolName::ReviseTask, &error)),
        }
    }

    #[tool(
        description = "Hand an instruction to another agent and return at once. Its answer arrives later as a \
                       handoff_answer message. The first instruction to an agent in one turn stands: to change \
                       it, call again with followup: true and intent \"extends\" or \"replaces\".",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn send_to_agent(&self, Parameters(args): Parameters<SendArgs>) -> Result<String, String> {
        let request = args.request()?;
        let receipt = self.hand_over(ToolName::SendToAgent, &request).await?;
        Ok(describe_handoff_receipt(&receipt))
    }

    #[tool(
        description = "Hand an instruction to another agent and wait for its answer (timeout_secs, default 120, \
                       at most 600). On timeout the answer arrives later as a handoff_answer message. If the \
                       user changes the task meanwhile (a correction, /new, /cancel), the call returns at once \
                       and names the change to act on. The same guard as send_to_agent applies.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn call_agent(
        &self,
        Parameters(args): Parameters<CallArgs>,
        cancelled: CancellationToken,
    ) -> Result<String, String> {
        let timeout_secs = args.timeout_secs.unwrap_or(DEFAULT_CALL_TIMEOUT_SECS);
        if !(1..=MAX_CALL_TIMEOUT_SECS).contains(&timeout_secs) {
            return Err(bad_argument(format!(
                "timeout_secs must be between 1 and {MAX_CALL_TIMEOUT_SECS}, not {timeout_secs}; nothing was handed over."
            )));
        }
        let request = args.handoff.request()?;
        self.wait_for_session().await;
        let registration = self.calls.begin().await;
        let receipt = match self.daemon.handoff(&request).await {
            Ok(receipt) => receipt,
            Err(error @ (ClientError::NoAnswer { .. } | ClientError::Protocol { .. })) => {
                drop(registration);
                tracing::warn!(request_id = %request.request_id, "the connection broke during a handoff ({error}); asking again");
                let receipt = self.recover_handoff(ToolName::CallAgent, &request).await?;
                // The answer may already be on its way as a notification: do not wait for it.
                return Ok(describe_handoff_receipt(&receipt));
            }
            Err(error) => return Err(self.tool_failure(ToolName::CallAgent, &error)),
        };
        if receipt.target_awaits_caller {
            // Not registered: the answer comes as a handoff_answer envelope.
            drop(registration);
            return Ok(describe_call_not_waited(&receipt));
        }
        let answer = registration.register(&receipt.handoff_id);
        let waited = Duration::from_secs(timeout_secs);
        let mut answer = std::pin::pin!(answer);
        let outcome = tokio::select! {
            answer = &mut answer => answer.ok(),
            () = tokio::time::sleep(waited) => None,
            () = cancelled.cancelled() => None,
        };
        // A call the agent session gave up on has no result anyone reads (the client drops
        // it): an answer it took at that very moment must stay pending, for `pending` and
        // the next session, not be acked as returned.
        let gave_up = cancelled.is_cancelled();
        let answer = match outcome {
            Some(answer) => answer,
            // Still registered: nothing was handed over, and the answer will arrive as an
            // envelope. Otherwise the forwarder just handed it over: take it.
            None if self.calls.give_up(&receipt.handoff_id).await => {
                return Ok(describe_call_timeout(&receipt, waited));
            }
            None => match answer.await {
                Ok(answer) => answer,
                Err(_) => return Ok(describe_call_timeout(&receipt, waited)),
            },
        };
        if answer.kind != "handoff_answer" {
            // The task changed and retired the handoff: the change, pushed as a message
            // too, is what the agent acts on now (not acked: it is the agent's to answer).
            return Ok(describe_call_retired(&receipt, &answer));
        }
        if gave_up {
            tracing::info!(trace_id = %answer.trace_id, "call_agent was cancelled as its answer came: the answer stays pending");
            return Ok(describe_call_answer(&receipt, &answer));
        }
        // Returned as this call's result: the answer envelope is handled.
        let ack = AckRequest {
            trace_id: answer.trace_id.clone(),
            note: Some(format!("returned to call_agent ({})", receipt.handoff_id)),
        };
        if let Err(error) = self.daemon.ack(&ack).await {
            tracing::warn!(trace_id = %answer.trace_id, "could not ack an answer returned to call_agent ({error}); it stays pending");
        }
        Ok(describe_call_answer(&receipt, &answer))
    }
}

impl ChannelPlugin {
    /// Hands an instruction over; after a broken connection, asks again with the same
    /// request id, which the daemon answers with the handoff it recorded (if it did).
    async fn hand_over(&self, tool: ToolName, request: &HandoffRequest) -> Result<HandoffReceipt, String> {
        self.wait_for_session().await;
        match self.daemon.handoff(request).await {
            Ok(receipt) => Ok(receipt),
            Err(error @ (ClientError::NoAnswer { .. } | ClientError::Protocol { .. })) => {
                tracing::warn!(request_id = %request.request_id, "the connection broke during a handoff ({error}); asking again");
                self.recover_handoff(tool, request).await
            }
            Err(error) => Err(self.tool_failure(tool, &error)),
        }
    }

    async fn recover_handoff(
        &self,
        tool: ToolName,
        request: &HandoffRequest,
    ) -> Result<HandoffReceipt, String> {
        match self.once_the_daemon_answers(|| self.daemon.handoff(request)).await {
            Some(Ok(receipt)) => Ok(receipt),
            Some(Err(refusal)) => Err(self.tool_failure(tool, &refusal)),
            None => {
                let error = ClientError::NoAnswer {
                    address: self.daemon.address(),
                    detail: format!("no answer for {}s", OUTCOME_RECOVERY_LIMIT.as_secs()),
                };
                Err(self.tool_failure(tool, &error))
            }
        }
    }

    /// Asks the daemon again (through `ask`) until it answers, within
    /// [`OUTCOME_RECOVERY_LIMIT`]: waits for the session stream to reconnect, and asks again
    /// under the new session while the old one is being replaced. `Some` holds the
    /// daemon's answer (a success or a refusal); `None` means it did not answer in time.
    async fn once_the_daemon_answers<T, F>(&self, ask: impl Fn() -> F) -> Option<Result<T, ClientError>>
    where
        F: Future<Output = Result<T, ClientError>>,
    {
        let deadline = tokio::time::Instant::now() + OUTCOME_RECOVERY_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            self.daemon.wait_for_session(left).await;
            match ask().await {
                Err(ClientError::Refused { error, .. }) if error.code == ErrorCode::SessionConflict => {}
                answer @ (Ok(_) | Err(ClientError::Refused { .. })) => return Some(answer),
                Err(_) => {}
            }
            tokio::time::sleep(OUTCOME_RETRY_DELAY.min(left)).await;
        }
    }

    /// The envelope a reaction or an edit is made for: the one its trace_id names, else
    /// the one of the chat (and message) it names as the official plugin's tools do,
    /// among those this session was shown.
    fn conversation_acted_in(
        &self,
        trace_id: Option<&str>,
        chat_id: Option<i64>,
        message_id: Option<i64>,
    ) -> Result<TraceId, String> {
        match (optional_trace_id(trace_id)?, chat_id) {
            (Some(trace_id), _) => Ok(trace_id),
            (None, Some(chat_id)) => {
                let trace_id = self.shown.conversation_in(chat_id, message_id).map_err(bad_argument)?;
                parse_trace_id(&trace_id)
            }
            (None, None) => Err(bad_argument(
                "name the message: the trace_id of its <channel> tag, or its chat_id and message_id. Nothing was sent.",
            )),
        }
    }

    /// After a broken connection during a reaction or an edit, asks again with the same
    /// request id: the daemon answers a repeat with what the first request came to, and
    /// never acts twice.
    async fn recover_action<F>(
        &self,
        tool: ToolName,
        broken: &ClientError,
        ask: impl Fn() -> F,
    ) -> Result<String, String>
    where
        F: Future<Output = Result<MessageActionReceipt, ClientError>>,
    {
        tracing::warn!(tool = tool.as_str(), "the connection broke during a call ({broken}); asking again");
        match self.once_the_daemon_answers(ask).await {
            Some(Ok(receipt)) => Ok(describe_action_receipt(&receipt)),
            Some(Err(error)) => Err(self.tool_failure(tool, &error)),
            None => Err(self.tool_failure(tool, broken)),
        }
    }

    /// Streams the reply's files to the daemon, then sends the reply naming them. A file
    /// that does not reach the daemon refuses the reply: nothing was sent.
    async fn upload_and_reply(
        &self,
        mut request: ReplyRequest,
        files: &[outgoing::OutgoingFile],
    ) -> Result<String, String> {
        if !files.is_empty() {
            self.wait_for_session().await;
            request.files = outgoing::upload_all(&self.daemon, files).await.map_err(|error| match error {
                ClientError::Refused { .. } => {
                    format!("{} Nothing was sent.", self.tool_failure(ToolName::Reply, &error))
                }
                // The reply itself was never asked for: whatever became of the upload,
                // nothing reached the chat.
                error => {
                    tracing::warn!(request_id = %request.request_id, "uploading a reply's files failed: {error}");
                    upload_failed(&error)
                }
            })?;
        }
        self.send_reply(&request).await
    }

    async fn send_reply(&self, request: &ReplyRequest) -> Result<String, String> {
        self.wait_for_session().await;
        match self.daemon.reply(request).await {
            Ok(receipt) => Ok(describe_receipt(&receipt)),
            // The request may have reached the daemon: ask it what it did, never guess.
            Err(error @ (ClientError::NoAnswer { .. } | ClientError::Protocol { .. })) => {
                tracing::warn!(request_id = %request.request_id, "the connection broke during a reply ({error}); asking the daemon what became of it");
                self.recover_reply_outcome(request).await
            }
            Err(error) => Err(self.tool_failure(ToolName::Reply, &error)),
        }
    }

    /// Tool calls are bound to the live session: one made while the stream (re)connects
    /// waits a moment for it, unless the daemon is refusing the stream outright.
    async fn wait_for_session(&self) {
        if !self.stream_refused.load(Ordering::SeqCst) {
            self.daemon.wait_for_session(SESSION_WAIT).await;
        }
    }

    /// Asks the daemon (once it answers again) what became of a reply whose answer was
    /// lost, and tells the agent exactly that: delivered, not sent (so it may reply
    /// again), or unknown (unresolved in the ledger, for an operator to reconcile).
    async fn recover_reply_outcome(&self, request: &ReplyRequest) -> Result<String, String> {
        match self.once_the_daemon_answers(|| self.daemon.reply_outcome(&request.request_id)).await {
            Some(Ok(receipt)) => Ok(describe_recovered_receipt(&receipt)),
            Some(Err(ClientError::Refused { error, .. })) if error.code == ErrorCode::UnknownRequest => {
                Err(never_acted_on(&request.request_id))
            }
            Some(Err(error)) => Err(format!(
                "The connection to the daemon broke during the reply; the daemon says what became of it:\n{}",
                self.tool_failure(ToolName::Reply, &error)
            )),
            None => {
                tracing::error!(request_id = %request.request_id, "the daemon did not answer about a reply's outcome");
                Err(outcome_not_known_yet(&request.request_id, OUTCOME_RECOVERY_LIMIT))
            }
        }
    }

    /// The failure text for the model; the failure is logged for the operator too. A
    /// daemon's refusal is logged by its code: its message, written for the model, may
    /// quote an instruction or an earlier reply, which are message bodies (debug only).
    fn tool_failure(&self, tool: ToolName, error: &ClientError) -> String {
        let text = describe_failure(tool, error, self.daemon.agent(), &self.secret_env);
        match error.code() {
            Some(code) => {
                tracing::warn!(tool = tool.as_str(), ?code, "tool call refused by the daemon");
                tracing::debug!(tool = tool.as_str(), ?code, "tool call refused: {error}");
            }
            None => tracing::warn!(tool = tool.as_str(), "tool call failed: {error}"),
        }
        text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ChannelPlugin {
    fn get_info(&self) -> ServerConfig {
        let mut experimental = ExperimentalCapabilities::new();
        experimental.insert(CHANNEL_CAPABILITY.to_owned(), JsonObject::new());
        if self.relays_permissions {
            experimental.insert(permissions::PERMISSION_CAPABILITY.to_owned(), JsonObject::new());
        }
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
    /// no `initialized` to start the session stream on. Claude Code's discover probe names
    /// 2026-07-28, which is beyond [`MAX_PROTOCOL_VERSION`]: rmcp answers it with -32022
    /// "Unsupported protocol version" before this is reached, and that answer makes the
    /// client fall back to `initialize` at 2025-11-25. A discover that names a revision
    /// this server supports gets here and is answered as a server that predates discover,
    /// which makes a client fall back the same way.
    async fn discover(&self, _context: RequestContext<RoleServer>) -> Result<DiscoverResult, ErrorData> {
        Err(ErrorData::method_not_found::<DiscoverRequestMethod>())
    }

    /// `notifications/claude/channel/permission_request`: relayed to the daemon on a task
    /// of its own, so the MCP service goes on reading meanwhile.
    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        if notification.method != permissions::PERMISSION_REQUEST_METHOD {
            tracing::debug!(method = %notification.method, "ignoring a notification this plugin does not know");
            return;
        }
        if !self.relays_permissions {
            tracing::warn!(
                "the agent session sent a permission request, but agent '{}' has no [permissions] table: not relayed",
                self.daemon.agent()
            );
            return;
        }
        match permissions::read_request(notification.params.as_ref()) {
            Ok(request) => {
                self.tasks.spawn(permissions::relay(self.daemon.clone(), request));
            }
            Err(problem) => tracing::warn!("ignoring a permission request: {problem}"),
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.stream.client_did(ClientEvent::Initialized, context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.stream.client_did(ClientEvent::ListedTools, context.peer.clone());
        // What `#[tool_handler]` would answer.
        let cache_hints =
            context.protocol_version().is_some_and(|version| version >= ProtocolVersion::V_2026_07_28);
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools: self.tool_router.list_all(),
            meta: None,
            next_cursor: None,
            ttl_ms: cache_hints.then_some(0),
            cache_scope: cache_hints.then_some(CacheScope::Public),
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.stream.client_did(ClientEvent::CalledTool, context.peer.clone());
        self.tool_router.call(ToolCallContext::new(self, request, context)).await
    }
}

/// Starts the session stream once [`Startup`] says the agent session is ready; shared with
/// the timer that gives up waiting for a tool list.
#[derive(Clone)]
struct StreamStarter {
    startup: Arc<Mutex<Startup>>,
    daemon: DaemonClient,
    secret_env: String,
    tools: ToolNames,
    refused: Arc<AtomicBool>,
    calls: calls::WaitingCalls,
    media: Media,
    shown: shown::SharedShown,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl StreamStarter {
    /// Notes what the agent session did and, once it is ready for channel notifications,
    /// starts the session stream (see [`startup`]): nothing is pushed, and the daemon
    /// hands this session nothing, before then.
    fn client_did(&self, event: ClientEvent, peer: Peer<RoleServer>) {
        if event == ClientEvent::Initialized {
            let starter = self.clone();
            let timer_peer = peer.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = starter.shutdown.cancelled() => {}
                    () = tokio::time::sleep(startup::NO_TOOL_LIST_WAIT) => {
                        starter.client_did(ClientEvent::WaitedForToolList, timer_peer);
                    }
                }
            });
        }
        let settle = self.startup.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).on(event);
        let Some(settle) = settle else { return };
        tracing::debug!(?event, ?settle, "the agent session is ready for channel notifications");
        let forwarder = SessionForwarder {
            daemon: self.daemon.clone(),
            secret_env: self.secret_env.clone(),
            peer,
            refused: Arc::clone(&self.refused),
            calls: self.calls.clone(),
            tools: self.tools.clone(),
            media: self.media.clone(),
            shown: self.shown.clone(),
            verdicts: permissions::HandedVerdicts::default(),
        };
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(settle) => {}
            }
            forwarder.run(shutdown).await;
        });
    }
}
