//! The command line (DESIGN.md §7): `run`, `check`, `channel`, `ledger`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::agents::channel;
use crate::app::Daemon;
use crate::config::{ConfigError, ConfigWarning, LogFormat, Settings};
use crate::ids::AgentName;
use crate::ledger::EnvelopeState;
use crate::ledger::{Ledger, ListFilter, Reconciliation, StoredCascade, TurnEnding, files};
use crate::rules::routes::{Audience, RouteTarget};
use crate::telemetry;

#[derive(Debug, Parser)]
#[command(name = "switchboard", version, about = "Routes Telegram conversations to AI agent sessions")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: poll Telegram, route envelopes, serve channel plugins.
    Run {
        #[command(flatten)]
        config: ConfigArg,
        /// Log JSON lines instead of human-readable text.
        #[arg(long)]
        log_json: bool,
    },
    /// Validate a configuration (including its secret variables) and print the routes table.
    Check {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// The MCP channel plugin for one agent session (an agent such as Claude Code starts it):
    /// runs `switchboard-channel`, installed beside this executable, with these arguments.
    Channel(ChannelArgs),
    /// Run the daemon against a fake Telegram inside this process, with scripted agents,
    /// and narrate what happens: no token, no configuration, no network needed.
    Demo {
        /// Leave the ledger and a configuration in DIR (new or empty), for
        /// `switchboard ledger --config DIR/switchboard.toml list`.
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
    },
    /// Ask a running daemon whether it is ready (`GET /readyz`); exit 0 only when it is.
    /// For container health checks, where no curl is at hand.
    Healthcheck {
        /// The daemon's configuration: its `api.listen` is asked (0.0.0.0 on loopback).
        #[arg(long, short = 'c', env = "SWITCHBOARD_CONFIG", required_unless_present = "address")]
        config: Option<PathBuf>,
        /// Ask this address (host:port) instead.
        #[arg(long)]
        address: Option<SocketAddr>,
    },
    /// Inspect envelopes and attempts; reconcile unresolved replies.
    Ledger {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: LedgerCommand,
    },
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// The TOML configuration file.
    #[arg(long, short = 'c', env = "SWITCHBOARD_CONFIG")]
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct ChannelArgs {
    /// The agent this session speaks for (an `[agents.NAME]` table).
    #[arg(long)]
    pub agent: String,
    /// The name the agent session knows this MCP server by (the key in `.mcp.json`, or
    /// `claude mcp add NAME`): Claude Code calls its tools `mcp__NAME__reply` and so on,
    /// and the plugin names them so to the model.
    #[arg(long, default_value = channel::DEFAULT_SERVER_NAME)]
    pub server_name: String,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// `switchboard-channel`: the channel plugin as an executable of its own.
#[derive(Debug, Parser)]
#[command(
    name = "switchboard-channel",
    version,
    about = "The switchboard MCP channel plugin for one agent session"
)]
struct ChannelCli {
    #[command(flatten)]
    args: ChannelArgs,
}

/// The executable `switchboard channel` hands itself over to, installed beside it.
const CHANNEL_EXECUTABLE: &str = "switchboard-channel";

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// List envelopes, oldest first (the newest LIMIT that match).
    List {
        #[arg(long)]
        state: Option<EnvelopeState>,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        route: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show one envelope (env_…) with its attempts and state history, or one room exchange
    /// (cas_…) with its speakers in order and how it ended.
    Show { trace_id: String },
    /// Count envelopes by state.
    Stats,
    /// List handoffs between agents, oldest first (the newest LIMIT that match).
    Handoffs {
        /// Only handoffs still waiting for their answer.
        #[arg(long)]
        open: bool,
        /// Only handoffs from or to this agent.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// List group-room exchanges (cascades), oldest first (the newest LIMIT that match).
    Cascades {
        /// Only the exchanges of this room route.
        #[arg(long)]
        room: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show a task (task_…): where it stands, every revision with what was done and
    /// running at that moment, and its predecessor and successor. With --stopped, record
    /// that a cancelled task has stopped.
    Task {
        task_id: String,
        /// Confirm that the cancelled task has stopped (when its agent cannot ack).
        #[arg(long, requires = "reason")]
        stopped: bool,
        /// Why (kept in the ledger); required with --stopped.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Settle an unresolved envelope with what you found in the chat.
    Reconcile {
        trace_id: String,
        /// The reply did reach the chat: the envelope becomes acked.
        #[arg(long, conflicts_with = "not_delivered", required_unless_present = "not_delivered")]
        delivered: bool,
        /// The reply did not reach the chat: the envelope is pending again, for its agent to answer.
        #[arg(long)]
        not_delivered: bool,
        /// Why (kept in the ledger).
        #[arg(long)]
        reason: String,
    },
}

pub fn main() -> ExitCode {
    block_on(dispatch(Cli::parse().command))
}

/// The main of `switchboard-channel`.
pub fn channel_main() -> ExitCode {
    let cli = ChannelCli::parse();
    block_on(run_channel(cli.args))
}

/// The plugin and the daemon are executables of their own, each built from its own code
/// alone: a process keeps resident most of the code its executable maps, and a plugin runs
/// as long as its agent session (one per session) while the daemon runs for good. Mapped
/// from `switchboard-channel`, a plugin keeps about 2.7 MiB less resident; without the
/// plugin (the MCP server and its types), the daemon's code is 1.3 MB smaller and it keeps
/// about 0.6 MiB less resident (see docs/performance.md). So `switchboard channel` becomes
/// `switchboard-channel`, installed beside it (same arguments, same process). Returns only
/// when it could not, saying why.
fn hand_over_to_channel_executable() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            return anyhow::anyhow!(
                "cannot tell where this executable is ({e}), to run {CHANNEL_EXECUTABLE}"
            );
        }
    };
    let sibling = exe.with_file_name(CHANNEL_EXECUTABLE);
    if !sibling.is_file() {
        return anyhow::anyhow!(
            "`switchboard channel` runs {CHANNEL_EXECUTABLE}, which is not installed beside {}: install both \
             executables (README, Install), or configure the agent session to run {CHANNEL_EXECUTABLE} itself",
            exe.display()
        );
    }
    // `exec` returns only when it failed.
    let error = std::process::Command::new(&sibling).args(std::env::args_os().skip(2)).exec();
    anyhow::anyhow!("could not start {}: {error}", sibling.display())
}

fn block_on(work: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("switchboard: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchboard: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One thread for every command. The daemon's work is waiting: on Telegram, on sessions
/// and on SQLite, whose statements run on sqlx's own worker threads. A second runtime
/// worker only added wake-ups and hand-overs between the two on every message (4–7% more
/// CPU per message in `cargo bench --bench hot_path`, at the same latency). The channel
/// plugin relays one session between stdio and the daemon.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config, log_json } => run(&config.config, log_json).await,
        Command::Check { config } => check(&config.config),
        Command::Channel(_) => Err(hand_over_to_channel_executable()),
        Command::Ledger { config, command } => ledger(&config.config, command).await,
        Command::Demo { keep } => crate::demo::run(keep).await,
        Command::Healthcheck { config, address } => {
            let address = match (address, config) {
                (Some(address), _) => address,
                (None, Some(config)) => Settings::load(&config)?.api.listen,
                (None, None) => anyhow::bail!("give --config FILE or --address HOST:PORT"),
            };
            crate::operate::healthcheck::check(crate::operate::healthcheck::address_to_ask(address)).await
        }
    }
}

/// `switchboard channel`: the MCP channel plugin for one agent session.
async fn run_channel(args: ChannelArgs) -> anyhow::Result<()> {
    let settings = Settings::load(&args.config.config)?;
    let agent = AgentName::parse(&args.agent).map_err(anyhow::Error::msg)?;
    let secret = settings.agent_secret(&agent)?;
    let server_name = channel::parse_server_name(&args.server_name).map_err(anyhow::Error::msg)?;
    telemetry::init(settings.log.format, &settings.log.filter, vec![secret.expose().to_owned()])?;
    channel::run(settings, agent, server_name).await
}

async fn run(path: &Path, log_json: bool) -> anyhow::Result<()> {
    let settings = Settings::load(path)?;
    let secrets = settings.daemon_secrets()?;
    let format = if log_json { LogFormat::Json } else { settings.log.format };
    telemetry::init(format, &settings.log.filter, secrets.all().map(|s| s.expose().to_owned()).collect())?;
    // The handlers are installed before anything listens: once the local API
    // accepts a connection, a SIGTERM is a graceful stop, never the default
    // action that kills the process with the signal.
    let stop_signals = StopSignals::install()?;
    let shutdown = CancellationToken::new();
    let daemon = Daemon::build(settings, secrets, shutdown.clone()).await?;
    tokio::spawn(stop_signals.stop_on_signal(shutdown));
    daemon.run().await
}

/// SIGTERM and SIGINT both stop the daemon gracefully.
struct StopSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        let interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
        Ok(Self { terminate, interrupt })
    }

    async fn stop_on_signal(mut self, shutdown: CancellationToken) {
        tokio::select! {
            _ = self.interrupt.recv() => tracing::info!("SIGINT received"),
            _ = self.terminate.recv() => tracing::info!("SIGTERM received"),
            () = shutdown.cancelled() => return,
        }
        shutdown.cancel();
    }
}

fn check(path: &Path) -> anyhow::Result<()> {
    let settings = Settings::load(path)?;
    settings.daemon_secrets()?;
    for warning in check_warnings(&settings) {
        eprintln!("switchboard: warning: {}: {warning}", path.display());
    }
    println!("{}: configuration is valid", path.display());
    println!("telegram api: {}", settings.telegram.api_url);
    println!("local api:    {}", settings.api.listen);
    println!("database:     {}", settings.storage.database.display());
    println!("agents:       {}", settings.agent_list());
    if settings.telegram.allowed_users.is_empty() {
        println!("senders:      everyone in a routed chat");
    } else {
        println!("senders:      only {:?}", settings.telegram.allowed_users);
    }
    println!();
    print!("{}", routes_table(&settings));
    Ok(())
}

/// What `check` warns about: the settings' own warnings, and ledger files that other
/// users could read (reported, not changed: `run` tightens them).
fn check_warnings(settings: &Settings) -> Vec<ConfigWarning> {
    let mut warnings = settings.warnings();
    match files::loose_files(&settings.storage.database) {
        Ok(loose) => warnings.extend(loose.into_iter().map(|file| ConfigWarning {
            key: "storage.database".into(),
            problem: format!(
                "{} has mode {:04o}, open to other users; `switchboard run` tightens it to {:04o}",
                file.path.display(),
                file.mode,
                files::PRIVATE_MODE
            ),
        })),
        Err(e) => warnings.push(ConfigWarning {
            key: "storage.database".into(),
            problem: format!("cannot check the permissions of {}: {e}", settings.storage.database.display()),
        }),
    }
    warnings
}

/// The routes table, most specific first, as `check` prints it.
pub fn routes_table(settings: &Settings) -> String {
    let mut routes: Vec<_> = settings.routes.routes().iter().collect();
    routes.sort_by_key(|route| match route.target {
        RouteTarget::Topic { .. } => 0,
        RouteTarget::Chat { .. } => 1,
        RouteTarget::Default => 2,
    });
    let mut out = format!("{:<24} {:<22} {:<10} {}\n", "ROUTE", "CHAT", "TOPIC", "AGENT");
    for route in routes {
        let (chat, topic) = match route.target {
            RouteTarget::Topic { chat_id, thread_id } => (chat_id.to_string(), thread_id.to_string()),
            RouteTarget::Chat { chat_id } => (chat_id.to_string(), "*".to_owned()),
            RouteTarget::Default => ("* (default)".to_owned(), "*".to_owned()),
        };
        let audience = match &route.audience {
            Audience::Agent(agent) => agent.to_string(),
            Audience::Room(agents) => format!("room: {}", join(agents)),
        };
        out.push_str(&format!("{:<24} {:<22} {:<10} {}\n", route.name, chat, topic, audience));
    }
    if settings.routes.routes().is_empty() {
        out.push_str("(no routes: every message will be recorded as unrouted)\n");
    }
    out.push_str(&rooms_table(settings));
    out
}

/// The group rooms, as `check` prints them: each room's members in room order with the
/// names they answer to, and its limits with what one human message can cost.
pub fn rooms_table(settings: &Settings) -> String {
    let mut out = String::new();
    for route in settings.routes.routes() {
        let Some(room) = settings.rooms.get(&route.name) else { continue };
        let limits = room.limits;
        let place = match room.thread_id {
            Some(thread) => format!("chat {} topic {thread}", room.chat_id),
            None => format!("chat {}", room.chat_id),
        };
        out.push_str(&format!(
            "\nroom {} ({place}): cascade_limit {}, max_iters {}, speaker_timeout {}s; one human message costs at \
             most {} × {} = {} tool iterations\n",
            room.route,
            limits.cascade_limit,
            limits.max_iters,
            limits.speaker_timeout.as_secs(),
            limits.cascade_limit,
            limits.max_iters,
            u64::from(limits.cascade_limit.get()) * u64::from(limits.max_iters),
        ));
        for (position, member) in room.roster.members().iter().enumerate() {
            let answers_to: Vec<String> = answers_to(member);
            out.push_str(&format!(
                "  {}. {:<20} shown as \"{}\"; answers to {}{}\n",
                position + 1,
                member.name,
                member.display_name(),
                answers_to.join(" "),
                if position == 0 { " (speaks first when nobody is mentioned)" } else { "" }
            ));
        }
    }
    out
}

/// The `@` names a room member answers to, each once (compared as mentions compare).
fn answers_to(member: &crate::rules::turns::RoomMember) -> Vec<String> {
    let mut seen = Vec::new();
    let mut shown = Vec::new();
    for form in member.alias_forms() {
        let key = crate::rules::turns::normalise(&form);
        if !seen.contains(&key) && !form.contains(char::is_whitespace) {
            seen.push(key);
            shown.push(format!("@{form}"));
        }
    }
    shown
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

async fn ledger(path: &Path, command: LedgerCommand) -> anyhow::Result<()> {
    let settings = Settings::load(path)?;
    let database = &settings.storage.database;
    // Only the daemon creates a ledger: here a missing file is a mistyped path (or the
    // wrong working directory), and an empty ledger would only hide that.
    let exists = database
        .try_exists()
        .with_context(|| format!("cannot look for the ledger database {}", database.display()))?;
    if !exists {
        return Err(missing_ledger(&settings).into());
    }
    let ledger = Ledger::open_existing(database, settings.storage.synchronous).await?;
    let result = ledger_command(&ledger, command).await;
    ledger.close().await;
    result
}

fn missing_ledger(settings: &Settings) -> ConfigError {
    let database = &settings.storage.database;
    let relative = if database.is_relative() {
        std::env::current_dir()
            .map(|dir| format!(" (relative to the working directory {})", dir.display()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    ConfigError {
        file: settings.source.display().to_string(),
        key: "storage.database".into(),
        problem: format!(
            "the ledger {}{relative} does not exist; check the path (only `switchboard run` \
             creates a ledger)",
            database.display()
        ),
    }
}

async fn ledger_command(ledger: &Ledger, command: LedgerCommand) -> anyhow::Result<()> {
    match command {
        LedgerCommand::List { state, agent, route, limit } => {
            let rows = ledger.list(&ListFilter { state, agent, route, limit }).await?;
            println!(
                "{:<15} {:<11} {:<14} {:<14} {:<16} {:<20} PREVIEW",
                "TRACE_ID", "STATE", "AGENT", "ROUTE", "CHAT", "USER"
            );
            for e in &rows {
                let chat = match e.thread_id {
                    Some(thread) => format!("{}/{thread}", e.chat_id),
                    None => e.chat_id.to_string(),
                };
                println!(
                    "{:<15} {:<11} {:<14} {:<14} {:<16} {:<20} {}",
                    e.trace_id,
                    e.state,
                    e.agent.as_deref().unwrap_or("-"),
                    e.route.as_deref().unwrap_or("-"),
                    chat,
                    e.user(),
                    e.preview()
                );
            }
            println!("({} envelope(s))", rows.len());
        }
        LedgerCommand::Handoffs { open, agent, limit } => {
            let handoffs = ledger.list_handoffs(open, agent.as_deref(), limit).await?;
            if handoffs.is_empty() {
                println!("no handoffs");
            }
            for h in handoffs {
                println!(
                    "{}  {:<10}  {} → {}  depth {}  for {}  {}  \"{}\"",
                    h.handoff_id,
                    h.state,
                    h.from_agent,
                    h.to_agent,
                    h.depth,
                    h.cause_trace_id.as_deref().unwrap_or("(unprompted)"),
                    h.opened_at,
                    preview(&h.instruction)
                );
                if let Some(late) = &h.late_result {
                    println!("    late result (never delivered): \"{}\"", preview(late));
                }
            }
        }
        LedgerCommand::Cascades { room, limit } => {
            let cascades = ledger.list_cascades(room.as_deref(), limit).await?;
            if cascades.is_empty() {
                println!("no room exchanges");
            }
            for c in cascades {
                let turns = ledger.turns_of(c.id).await?;
                let replies = turns.iter().filter(|t| t.ending == Some(TurnEnding::Replied)).count();
                let speakers: Vec<&str> = turns.iter().map(|t| t.agent.as_str()).collect();
                let started = c.cascade().map(|cascade| cascade.message().text.clone()).unwrap_or_default();
                println!(
                    "{}  {:<16}  {:<16}  {} turn(s), {replies} repl{}  [{}]  {}  \"{}\"",
                    c.cascade_id,
                    c.route,
                    c.state,
                    turns.len(),
                    if replies == 1 { "y" } else { "ies" },
                    speakers.join(" → "),
                    c.created_at,
                    preview(&started)
                );
            }
        }
        LedgerCommand::Show { trace_id } if trace_id.trim().starts_with("cas_") => {
            let cascade = ledger
                .cascade(trace_id.trim())
                .await?
                .with_context(|| format!("no room exchange has id {}", trace_id.trim()))?;
            print_cascade(ledger, &cascade).await?;
        }
        LedgerCommand::Show { trace_id } => {
            let e = ledger
                .find(trace_id.trim())
                .await?
                .with_context(|| format!("no envelope has trace id {trace_id}"))?;
            println!("trace_id:    {}", e.trace_id);
            println!("state:       {} (since {})", e.state, e.state_changed_at);
            println!(
                "agent/route: {} / {}",
                e.agent.as_deref().unwrap_or("-"),
                e.route.as_deref().unwrap_or("-")
            );
            println!(
                "chat:        {} ({}{})",
                e.chat_id,
                e.chat_type,
                e.chat_title.as_deref().map(|t| format!(", {t}")).unwrap_or_default()
            );
            if let Some(thread) = e.thread_id {
                println!("topic:       {thread}");
            }
            println!(
                "message:     {} from {} (user id {}) at {}",
                e.message_id,
                e.user(),
                e.sender_id.map_or("-".into(), |id| id.to_string()),
                e.sent_at
            );
            match e.update_id {
                Some(update_id) => {
                    println!("update_id:   {update_id} ({}), received {}", e.kind, e.received_at)
                }
                None => println!("kind:        {}, made {}", e.kind, e.received_at),
            }
            println!("deliveries:  {}", e.deliveries);
            if let (Some(task), Some(revision)) = (&e.task_id, e.revision) {
                println!("task:        {task} revision {revision} (switchboard ledger task {task})");
            }
            if let Some(note) = &e.note {
                println!("note:        {note}");
            }
            println!("content:\n  {}", e.content.replace('\n', "\n  "));
            if let Some(handoff) = ledger.handoff_of_envelope(e.id).await? {
                print_handoff(&handoff);
            }
            if let Some(cascade) = ledger.cascade_of_message(e.id).await? {
                println!("room:        started exchange {} ({})", cascade.cascade_id, cascade.state);
            }
            if let Some((turn, cascade)) = ledger.turn_of_envelope(e.id).await? {
                println!(
                    "room turn:   speaker {} of {} ({}), summoned by {}{}",
                    turn.speaker,
                    cascade.cascade_id,
                    cascade.route,
                    turn.summoned_by,
                    turn.ending.map(|ending| format!(", {}", ending.as_str())).unwrap_or_default()
                );
            }
            if let Some(raw) = ledger.raw_update(&e.trace_id).await? {
                println!("raw update (as Telegram sent it):\n  {raw}");
            }
            let attempts = ledger.attempts_for(e.id).await?;
            println!("attempts ({}):", attempts.len());
            for a in attempts {
                let reconciled = a
                    .reconciled_outcome
                    .as_ref()
                    .map(|o| format!(" → reconciled {o} ({})", a.reconciled_reason.as_deref().unwrap_or("")))
                    .unwrap_or_default();
                println!(
                    "  {} part {}/{} to {}{} → {}{}{}{}",
                    a.op_id,
                    a.chunk_index + 1,
                    a.chunk_count,
                    a.chat_id,
                    a.thread_id.map(|t| format!("/{t}")).unwrap_or_default(),
                    a.outcome,
                    a.telegram_message_id.map(|m| format!(" (message {m})")).unwrap_or_default(),
                    a.error.as_deref().map(|err| format!(": {err}")).unwrap_or_default(),
                    reconciled
                );
            }
            let events = ledger.events_for(e.id).await?;
            println!("history ({}):", events.len());
            for ev in events {
                println!(
                    "  {} {} → {} by {}{}",
                    ev.at,
                    ev.from_state,
                    ev.to_state,
                    ev.actor,
                    ev.reason.map(|r| format!(": {r}")).unwrap_or_default()
                );
            }
        }
        LedgerCommand::Stats => {
            for (state, count) in ledger.count_by_state().await? {
                println!("{state:<11} {count}");
            }
            // An acked envelope can carry a follow-up whose outcome is unknown: it is
            // not counted as unresolved above, but it waits for an operator all the same.
            println!("unreconciled attempts: {}", ledger.unreconciled_attempts().await?);
        }
        LedgerCommand::Task { task_id, stopped, reason } => {
            let task_id = task_id.trim();
            if stopped {
                let reason = reason.unwrap_or_default();
                ledger.mark_task_stopped(task_id, reason.trim()).await?;
                println!("{task_id}: now stopped");
            }
            print_task(ledger, task_id).await?;
        }
        LedgerCommand::Reconcile { trace_id, delivered, not_delivered: _, reason } => {
            let finding = if delivered { Reconciliation::Delivered } else { Reconciliation::NotDelivered };
            let state = ledger.reconcile(trace_id.trim(), finding, &reason).await?;
            println!("{}: now {state}", trace_id.trim());
        }
    }
    Ok(())
}

/// A task, its revisions, and the tasks before and after it.
async fn print_task(ledger: &Ledger, task_id: &str) -> anyhow::Result<()> {
    let Some((task, revisions, effects)) = ledger.task(task_id).await? else {
        anyhow::bail!("no task has id {task_id}");
    };
    println!("{}", crate::ledger::describe_task(&task, &effects));
    println!(
        "conversation: {} chat {}{} → agent {}",
        task.route,
        task.chat_id,
        task.thread_id.map(|t| format!(" topic {t}")).unwrap_or_default(),
        task.agent
    );
    println!(
        "opened {}{}",
        task.opened_at,
        task.closed_at.as_ref().map(|c| format!(", closed {c}")).unwrap_or_default()
    );
    println!();
    println!("revisions:");
    for r in revisions {
        println!(
            "  r{:<3} {:<14} {:<8} {:<24} {}  {}{}",
            r.revision,
            r.kind,
            r.source,
            r.actor,
            r.at,
            r.summary,
            r.envelope_trace_id.as_ref().map(|t| format!(" [{t}]")).unwrap_or_default()
        );
        if let Some(text) = &r.text {
            println!("        text: {}", preview(text));
        }
        println!("        at that moment: {}", r.snapshot);
    }
    Ok(())
}

/// One room exchange: what started it, its speakers in order, and how it ended (who
/// stopped it, or what the ceiling left open).
async fn print_cascade(ledger: &Ledger, c: &StoredCascade) -> anyhow::Result<()> {
    let cascade = c.cascade().context("reading the stored exchange")?;
    println!("cascade:     {}", c.cascade_id);
    println!(
        "room:        {} (chat {}{})",
        c.route,
        c.chat_id,
        c.thread_id.map(|t| format!(", topic {t}")).unwrap_or_default()
    );
    println!("state:       {} (since {})", c.state, c.updated_at);
    println!(
        "started by:  {} with {} at {}",
        cascade.message().author,
        c.message_trace_id,
        c.started_at.as_deref().unwrap_or("(not yet: waiting for the room)")
    );
    println!("message:     {}", preview(&cascade.message().text));
    println!(
        "limits:      cascade_limit {}, max_iters {}, speaker_timeout {}s; {} of {} turns used",
        cascade.cascade_limit(),
        c.max_iters,
        c.speaker_timeout_secs,
        cascade.turns_used(),
        cascade.cascade_limit()
    );
    let turns = ledger.turns_of(c.id).await?;
    println!("speakers ({}):", turns.len());
    for t in &turns {
        let ending = match (t.ending, &t.reply_text) {
            (Some(TurnEnding::Replied), Some(text)) => format!("replied \"{}\"", preview(text)),
            (Some(ending), _) => ending.as_str().to_owned(),
            (None, Some(_)) => "has the floor; its reply is being posted".to_owned(),
            (None, None) => format!("has the floor since {}", t.started_at),
        };
        println!(
            "  {}. {:<16} summoned by {:<16} {} ({})",
            t.speaker, t.agent, t.summoned_by, ending, t.envelope_trace_id
        );
    }
    if !cascade.queue().is_empty() {
        let queued: Vec<&str> = cascade.queue().iter().map(|q| q.agent.as_str()).collect();
        println!("queued:      {}", queued.join(", "));
    }
    if let Some(stop) = cascade.stop_record() {
        let still: Vec<&str> = stop.still_queued.iter().map(|a| a.as_str()).collect();
        println!(
            "stop:        by {} at {}{}; still queued then: {}",
            stop.by,
            stop.at,
            stop.during.map(|s| format!(", during speaker {s}")).unwrap_or_default(),
            if still.is_empty() { "nobody".to_owned() } else { still.join(", ") }
        );
    }
    match &c.outcome_text {
        Some(text) => println!("outcome:\n  {}", text.replace('\n', "\n  ")),
        None if c.ended_at.is_some() => {
            println!(
                "outcome:     {} after {} turn(s), {} repl(ies); nothing was posted",
                c.state,
                cascade.turns_used(),
                cascade.replies()
            )
        }
        None => {}
    }
    let posts = ledger.posts_of(c.id).await?;
    if !posts.is_empty() {
        println!("posts ({}):", posts.len());
        for p in posts {
            println!(
                "  {} {}: \"{}\"",
                p.key,
                if p.made {
                    format!("made {}", p.made_at.as_deref().unwrap_or(""))
                } else {
                    "owed".to_owned()
                },
                preview(&p.text)
            );
        }
    }
    Ok(())
}

/// The handoff an envelope carries: who asked whom, for which conversation, and its answer.
fn print_handoff(h: &crate::ledger::StoredHandoff) {
    println!(
        "handoff:     {} ({}), {} → {}, depth {}",
        h.handoff_id, h.state, h.from_agent, h.to_agent, h.depth
    );
    println!("  cause:     {}", h.cause_trace_id.as_deref().unwrap_or("none (unprompted)"));
    if let (Some(earlier), Some(intent)) = (&h.followup_of, &h.intent) {
        println!("  follow-up: {intent} {earlier}");
    }
    println!("  instruction envelope: {}", h.envelope_trace_id);
    println!("  instruction: {}", preview(&h.instruction));
    match &h.answer_trace_id {
        Some(answer) => println!(
            "  answer:    {answer} at {}{}",
            h.closed_at.as_deref().unwrap_or("-"),
            h.note.as_deref().map(|note| format!(" (note: {note})")).unwrap_or_default()
        ),
        None => println!("  answer:    none yet (opened {})", h.opened_at),
    }
}

/// The start of a text on one line.
fn preview(text: &str) -> String {
    const CHARS: usize = 60;
    let mut shown: String = text.chars().take(CHARS).collect::<String>().replace('\n', " ");
    if text.chars().count() > CHARS {
        shown.push('…');
    }
    shown
}
