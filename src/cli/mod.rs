//! The command line (DESIGN.md §7): `run`, `check`, `channel`, `ledger`, `demo`,
//! `healthcheck`. This file parses the command line and runs the daemon; each other
//! command has a file of its own.

mod channel;
mod check;
mod ledger;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::app::{Daemon, LedgerHold, StandbyWebhook, Taken};
use crate::config::{DaemonUrl, Database, HealthProbe, LogFormat, Settings};
use crate::operate::health::IntakeMode;
use crate::operate::health_listener::HealthListener;
use crate::telemetry;

pub use channel::{ChannelArgs, channel_main};
pub use check::{rooms_table, routes_table};
pub use ledger::LedgerCommand;

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
        /// The daemon's configuration: its `api.health_listen` is asked, or else its
        /// `api.listen` (0.0.0.0 on loopback). Only `[api]` is read: a mistake elsewhere
        /// in the file does not fail the check of a daemon that runs.
        #[arg(long, short = 'c', env = "SWITCHBOARD_CONFIG", required_unless_present = "address")]
        config: Option<PathBuf>,
        /// Ask this address (host:port, plain HTTP) instead.
        #[arg(long)]
        address: Option<SocketAddr>,
        /// Exit 0 too for a replica that stands by while another leads (and has no other
        /// reason not to be ready): for a container's check beside replicas, with
        /// `api.health_listen`.
        #[arg(long)]
        standby_is_healthy: bool,
    },
    /// Inspect envelopes and attempts; reconcile unresolved replies.
    Ledger {
        /// The TOML configuration file (before or after the ledger command).
        #[arg(long, short = 'c', env = "SWITCHBOARD_CONFIG", global = true)]
        config: Option<PathBuf>,
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

pub fn main() -> ExitCode {
    let command = Cli::parse().command;
    if matches!(command, Command::Ledger { .. } | Command::Check { .. }) {
        end_quietly_when_the_output_is_closed();
    }
    block_on(dispatch(command))
}

/// A report piped into `head` stops when `head` has read enough, quietly and successfully,
/// as Unix tools do; an output that cannot be written (a full disk) is one line and a
/// failure. Without this, either is a panic with its backtrace. Only for the commands that
/// print reports: the daemon's own writes to a closed socket are errors it handles.
fn end_quietly_when_the_output_is_closed() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        let message = panic.payload().downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        if let Some(error) = message.strip_prefix("failed printing to stdout: ") {
            if error.starts_with("Broken pipe") {
                std::process::exit(0);
            }
            eprintln!("switchboard: could not write the output: {error}");
            std::process::exit(1);
        }
        previous(panic);
    }));
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
/// and on SQLite, whose short statements run where they are called (`ledger::in_place`)
/// and whose long ones (checkpoints, listings) on blocking threads. A second runtime
/// worker only added wake-ups and hand-overs between the two on every message (4–7% more
/// CPU per message in `cargo bench --bench hot_path`, at the same latency). The channel
/// plugin relays one session between stdio and the daemon.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config, log_json } => run(&config.config, log_json).await,
        Command::Check { config } => check::check(&config.config),
        Command::Channel(_) => Err(channel::hand_over_to_channel_executable()),
        Command::Ledger { config, command } => {
            let config = config.context("give the configuration: --config FILE (or SWITCHBOARD_CONFIG)")?;
            ledger::ledger(&config, command).await
        }
        Command::Demo { keep } => crate::demo::run(keep).await,
        Command::Healthcheck { config, address, standby_is_healthy } => {
            let (daemon, identity) = match (address, config) {
                (Some(address), _) => (DaemonUrl::beside(address, false), None),
                (None, Some(config)) => healthcheck_target(HealthProbe::load(&config)?)?,
                (None, None) => anyhow::bail!("give --config FILE or --address HOST:PORT"),
            };
            crate::operate::healthcheck::check(&daemon, identity, standby_is_healthy).await
        }
    }
}

/// Where `healthcheck --config` asks, and the client certificate it shows there: the local
/// API asks for one when `api.tls.client_ca` is set, `api.health_listen` never does.
fn healthcheck_target(probe: HealthProbe) -> anyhow::Result<(DaemonUrl, Option<reqwest::Identity>)> {
    let HealthProbe { url, asks_for_a_certificate, client_identity } = probe;
    if !asks_for_a_certificate {
        return Ok((url, None));
    }
    // Only the identity: the check believes any certificate (api.ca is the plugins').
    match &client_identity {
        Some(files) => Ok((url, Some(crate::agents::api::client::client_identity(files)?))),
        None => anyhow::bail!(
            "the local API requires client certificates (api.tls.client_ca): set api.health_listen, which \
             answers health checks without one, or api.client_cert and api.client_key"
        ),
    }
}

async fn run(path: &Path, log_json: bool) -> anyhow::Result<()> {
    let settings = Settings::load(path)?;
    let secrets = settings.daemon_secrets()?;
    let format = if log_json { LogFormat::Json } else { settings.log.format };
    let mut hidden: Vec<String> = secrets.all().map(|s| s.expose().to_owned()).collect();
    if let crate::config::Database::Postgres(postgres) = &settings.storage.database {
        hidden.extend(crate::config::postgres_password(&postgres.url));
    }
    telemetry::init(format, &settings.log.filter, hidden)?;
    // The handlers are installed before anything listens: once the local API
    // accepts a connection, a SIGTERM is a graceful stop, never the default
    // action that kills the process with the signal.
    let stop_signals = StopSignals::install()?;
    // So is SIGHUP's: a reload asked for while the ledger is opened, or while a standby
    // waits for its election, must not kill the process (its default action, which a
    // supervisor counts as a clean exit and does not restart). It is applied once the
    // daemon runs.
    let hangups = crate::operate::reload::catch_hangups();
    let shutdown = CancellationToken::new();
    // Listening from here on: a standby waiting for its election stops on a signal too.
    tokio::spawn(stop_signals.stop_on_signal(shutdown.clone()));
    for warning in settings.warnings() {
        tracing::warn!("{}: {warning}", settings.source.display());
    }
    let bot_id = crate::app::bot_id_of(&secrets)?;
    // A certificate that cannot be served fails now, not when a standby is elected. It is
    // read again as the local API binds: a standby may wait past a certificate's renewal.
    if let Some(files) = &settings.api.tls {
        crate::agents::api::tls::server_config(files)?;
    }
    let storage = &settings.storage;
    // Bound before the ledger is taken: a standby (or a daemon still recovering) answers
    // its supervisor's probes too.
    let health = match settings.api.health_listen {
        Some(address) => {
            let replica = match &storage.database {
                Database::Postgres(postgres) => Some(postgres.replica.clone()),
                Database::Sqlite(_) => None,
            };
            let intake =
                if settings.telegram.webhook.is_some() { IntakeMode::Webhook } else { IntakeMode::Polling };
            Some(HealthListener::bind(address, replica, intake, shutdown.clone()).await?)
        }
        None => None,
    };
    let standby_webhook = match (&settings.telegram.webhook, &secrets.webhook) {
        (Some(settings), Some(secret)) => {
            Some(StandbyWebhook { settings: settings.clone(), secret: secret.clone() })
        }
        _ => None,
    };
    let hold =
        match LedgerHold::take(&storage.database, storage.synchronous, bot_id, standby_webhook, &shutdown)
            .await?
        {
            Taken::Hold(hold) => hold,
            Taken::StoppedStandingBy => {
                tracing::info!("stopped while standing by");
                return Ok(());
            }
        };
    let daemon = Daemon::build(settings, secrets, hold, hangups, shutdown.clone()).await?;
    if let Some(health) = &health {
        health.serve(daemon.operations());
    }
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

    /// The first signal starts a graceful stop, which waits for sends in flight to settle
    /// (a send waits up to `telegram.send_timeout_secs` for Telegram's answer). A second
    /// one ends the process at once, as `kill -9` would: what it cuts off is what start-up
    /// recovery settles (a send in flight becomes unknown, never sent again).
    async fn stop_on_signal(mut self, shutdown: CancellationToken) {
        tokio::select! {
            _ = self.interrupt.recv() => tracing::info!("SIGINT received"),
            _ = self.terminate.recv() => tracing::info!("SIGTERM received"),
            () = shutdown.cancelled() => return,
        }
        shutdown.cancel();
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        tracing::warn!(
            "a second stop signal: exiting now, without waiting for what is in flight; the next start settles it \
             (a send cut off becomes unknown and is not sent again)"
        );
        std::process::exit(1);
    }
}
