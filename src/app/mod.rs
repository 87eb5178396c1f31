//! Builds the daemon from its settings and supervises it: one root cancellation token,
//! a task tracker to wait on, and a subsystem that dies takes the daemon down loudly
//! instead of leaving it half-alive.

pub mod hold;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use teloxide::Bot;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::api;
use crate::agents::api::listener::ApiListener;
use crate::agents::api::server::Operations;
use crate::agents::bridge::{Bridge, BridgeSettings, HandoffRules, ReplyLimits, RoomDriver, Staging};
use crate::agents::permissions::PermissionRelay;
use crate::config::{DaemonSecrets, Database, Retention, Settings};
use crate::ids::Secret;
use crate::ledger::Ledger;
use crate::ledger::postgres::StepDown;
use crate::operate::health::{Health, IntakeHealth, PollHealth, WebhookHealth};
use crate::operate::metrics;
use crate::operate::reload::{self, Reloader};
use crate::rules::pacing::Pacer;
use crate::telegram::bot_api::BotApi;
use crate::telegram::files::TelegramFiles;
use crate::telegram::intake::{Routing, UpdateIntake};
use crate::telegram::menu;
use crate::telegram::outbound::Outbound;
use crate::telegram::poller::{self, Poller};
use crate::telegram::relay::RelayedDeliveries;
use crate::telegram::typing::TypingIndicator;
use crate::telegram::webhook::{self, Registration, UpdateSink, WebhookListener};
pub use hold::{Entitlement, Leadership, LedgerHold, StandbyWebhook, Taken};

/// The long poll's HTTP request may take `poll_timeout` plus this before the client gives
/// up, so a healthy long poll is never cut short by our own timeout.
const POLL_HTTP_MARGIN: Duration = Duration::from_secs(10);

/// Connecting to Telegram should be quick; a connect that never completes is a
/// provably unsent request, so it may fail early.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a file that loads would still not start a daemon: the checks `switchboard check`
/// makes beyond loading it, which `run` makes before it starts and a reload before it
/// applies anything, so that no file is applied that the next restart would refuse.
#[derive(Debug, thiserror::Error)]
pub enum StartUpRefusal {
    /// A secret its variables hold: unset or empty, shared by two agents, or malformed.
    #[error(transparent)]
    Secrets(#[from] crate::config::ConfigError),
    /// `api.tls`'s files hold no certificate the local API can serve.
    #[error("{0:#}")]
    Certificate(anyhow::Error),
}

/// The checks of [`StartUpRefusal`], with the secrets they read.
pub fn start_up_checks(settings: &Settings) -> Result<DaemonSecrets, StartUpRefusal> {
    let secrets = settings.daemon_secrets()?;
    if let Some(files) = &settings.api.tls {
        api::tls::server_config(files).map_err(StartUpRefusal::Certificate)?;
    }
    Ok(secrets)
}

/// What the daemon logs once its local API listens, with the bound address as `api`.
/// Whoever starts it with `api.listen` on port 0 reads the port from this line (the tests,
/// the benchmarks, `switchboard demo`): see [`reported_api_address`].
pub const RUNNING_MESSAGE: &str = "switchboard running";

/// The local API's address in a daemon's log: the `api` of its [`RUNNING_MESSAGE`] line,
/// in either log format (`api=127.0.0.1:7797` as text, `"api":"127.0.0.1:7797"` as JSON).
/// `None` until that line is there.
pub fn reported_api_address(log: &str) -> Option<SocketAddr> {
    reported_address(log, RUNNING_MESSAGE)
}

/// The webhook listener's address in a daemon's log, read as [`reported_api_address`]
/// reads the API's (the line [`webhook::LISTENING_MESSAGE`] comes before the running one).
pub fn reported_webhook_address(log: &str) -> Option<SocketAddr> {
    reported_address(log, webhook::LISTENING_MESSAGE)
}

/// Where `api.health_listen` answers, from the line logged as it binds (before the ledger
/// is taken, so a standby logs it too).
pub fn reported_health_address(log: &str) -> Option<SocketAddr> {
    reported_address(log, crate::operate::health_listener::HEALTH_LISTENING_MESSAGE)
}

/// Where a standby's webhook listener relays from, from the line it logs as it listens.
pub fn reported_relay_address(log: &str) -> Option<SocketAddr> {
    reported_address(log, webhook::RELAYING_MESSAGE)
}

fn reported_address(log: &str, message: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|line| line.contains(message))?;
    line.split(|c: char| c.is_whitespace() || matches!(c, '"' | '=' | ',' | '{' | '}'))
        .find_map(|word| word.parse().ok())
}

/// How updates reach the daemon: polled, or pushed to the webhook's listener.
enum Ingress {
    Polling(Poller),
    Webhook {
        listener: WebhookListener,
        /// Told whether Telegram accepted the webhook.
        health: WebhookHealth,
        /// A leader's: where its standbys' deliveries wait, and the intake to take them in.
        relayed: Option<Box<RelayedDeliveries>>,
    },
}

impl Ingress {
    /// The webhook's listener when `telegram.webhook` is set, else the poller; with what
    /// readiness reads of it.
    async fn of(
        settings: &Settings,
        webhook_secret: Option<Secret>,
        relayed_from: Option<crate::ledger::postgres::PgLedger>,
        intake: UpdateIntake,
        poll_bot: Bot,
        ledger: &Ledger,
    ) -> anyhow::Result<(Self, IntakeHealth)> {
        match (&settings.telegram.webhook, webhook_secret) {
            (Some(webhook), Some(secret)) => {
                let health = WebhookHealth::default();
                // A leader on PostgreSQL also takes in what its standbys took (`telegram::relay`).
                let relayed = relayed_from.map(|ledger| {
                    Box::new(RelayedDeliveries { ledger, bot_id: intake.bot_id(), intake: intake.clone() })
                });
                let sink = UpdateSink::Intake(intake);
                let listener = WebhookListener::bind(webhook.clone(), secret, sink).await?;
                let ingress = Self::Webhook { listener, health: health.clone(), relayed };
                Ok((ingress, IntakeHealth::Webhook(health)))
            }
            (Some(_), None) => anyhow::bail!("telegram.webhook is set but its secret was not read"),
            (None, _) => {
                let health = PollHealth::new();
                let poller = Poller::new(poll_bot, intake, ledger.clone(), settings, health.clone());
                Ok((Self::Polling(poller), IntakeHealth::Polling(health)))
            }
        }
    }
}

pub struct Daemon {
    /// One daemon per ledger: held from before the ledger is opened until after it is
    /// closed, so no second daemon can recover (or send) beside this one.
    /// The ledger's lock, or this replica's leadership: held until the daemon has stopped.
    leading: Leading,
    /// Gives a leader's lease up, once the daemon has stopped.
    resign: CancellationToken,
    /// Why the daemon stops, when something failed (leadership lost, a subsystem ended).
    failure: Arc<Mutex<Option<anyhow::Error>>>,
    ledger: Ledger,
    listener: ApiListener,
    bridge: Bridge,
    /// The poller, or the webhook's listener when `telegram.webhook` is set.
    ingress: Ingress,
    /// Calls `setWebhook` in webhook mode.
    webhook_api: BotApi,
    /// Runs the group rooms' exchanges (DESIGN.md §10).
    rooms: RoomDriver,
    /// What `/healthz`, `/readyz` and `/metrics` read.
    operations: Operations,
    /// Applies the configuration file again on SIGHUP.
    reloader: Reloader,
    /// SIGHUP, caught from before the local API listens.
    hangups: Option<tokio::signal::unix::Signal>,
    /// The root token: cancelled by a signal, or by a failing subsystem.
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// `[storage] retain_days`: the scheduled prunes, if any (fixed until a restart).
    retain: Option<Retention>,
    /// The permission relay's keeper: expiry and the prompts' final edits (DESIGN.md §15).
    permissions: PermissionRelay,
    /// Registers the bot's command menu at start-up.
    menu_api: BotApi,
    /// "typing…" while shown messages wait, unless `[outbound] typing = false`.
    typing: Option<TypingIndicator>,
}

impl Daemon {
    /// With the ledger held ([`LedgerHold::take`]): recovers interrupted sends, binds the
    /// local API and wires the parts together. Nothing talks to Telegram yet. `hangups`:
    /// SIGHUP, listened for since start-up; each one reloads the configuration.
    pub async fn build(
        settings: Settings,
        secrets: DaemonSecrets,
        hold: LedgerHold,
        hangups: Option<tokio::signal::unix::Signal>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let LedgerHold { ledger, mut entitlement } = hold;
        let leading_status = match &entitlement {
            Entitlement::Leader(leadership) => Some(leadership.status()),
            Entitlement::FileLock(_) => None,
        };
        let relayed_from = match &entitlement {
            Entitlement::Leader(leadership) => Some(leadership.ledger()),
            Entitlement::FileLock(_) => None,
        };
        let leads_until = match &entitlement {
            Entitlement::Leader(leadership) => Some(leadership.leads_until()),
            Entitlement::FileLock(_) => None,
        };
        // A leader renews its lease from the moment it is elected: recovery and the rest of
        // start-up may take longer than a lease, and a lease let lapse meanwhile would hand
        // the bot to a standby while this replica goes on starting.
        let failure: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
        // Outside `tasks`: a leader gives its lease up only once everything it started has
        // finished and been recorded, or a standby would find those sends in flight.
        let resign = CancellationToken::new();
        let relaying = match &mut entitlement {
            Entitlement::Leader(leadership) => leadership.take_relaying(),
            Entitlement::FileLock(_) => None,
        };
        let leading = match entitlement {
            Entitlement::FileLock(lock) => Leading::Locked(lock),
            Entitlement::Leader(leadership) => Leading::Renewing(tokio::spawn(lead(
                leadership,
                resign.clone(),
                shutdown.clone(),
                Arc::clone(&failure),
            ))),
        };
        // The standby's listener lets go of the webhook's address once the deliveries it is
        // committing are in (the daemon binds that address itself, and takes them in).
        if let Some(relaying) = relaying {
            relaying.stop().await;
        }
        recover_interrupted_sends(&ledger).await?;
        let listener = ApiListener::bind(&settings.api).await?;

        let token = secrets.telegram.expose();
        let bot_id = bot_id_of(&secrets)?;
        let telegram = &settings.telegram;
        let poll_bot = bot(token, &telegram.api_url, telegram.poll_timeout + POLL_HTTP_MARGIN)?;
        let send_bot = bot(token, &telegram.api_url, telegram.send_timeout)?;
        let room_api = BotApi::from_bot(&send_bot);
        let menu_api = BotApi::from_bot(&send_bot);
        let webhook_api = BotApi::from_bot(&send_bot);
        let typing_api = BotApi::from_bot(&send_bot);

        let metrics = metrics::install(leading_status.as_ref().map(|leading| leading.replica.as_str()));
        if let Some(leading) = &leading_status {
            metrics::set_leader_term(leading.term);
        }
        let certificate = listener.certificate();
        if let Some(certificate) = &certificate {
            metrics::certificate_expires_at(certificate.expires_at());
        }
        let tasks = TaskTracker::new();
        let files = TelegramFiles::new(token, &telegram.api_url, CONNECT_TIMEOUT, telegram.send_timeout)
            .context("building the HTTP client for Telegram's files")?;
        let mut outbound = Outbound::new(
            send_bot,
            ledger.clone(),
            Pacer::new(settings.outbound.pacing),
            shutdown.child_token(),
        )
        .with_files(files.clone());
        if let Some(leads_until) = leads_until {
            outbound = outbound.leading_until(leads_until);
        }
        let limits = ReplyLimits {
            max_reply_parts: settings.outbound.max_reply_parts,
            ack_reaction: settings.outbound.ack_reaction,
        };
        let single_daemon_heartbeat = settings.api.session_heartbeat;
        let session_heartbeat = match &settings.storage.database {
            Database::Sqlite(_) => single_daemon_heartbeat,
            Database::Postgres(postgres) => postgres.lease.session_heartbeat(single_daemon_heartbeat),
        };
        let bridge_settings =
            BridgeSettings { limits, handoff_rules: HandoffRules::of(&settings), session_heartbeat };
        let bridge = Bridge::new(
            ledger.clone(),
            outbound.clone(),
            secrets.agents,
            bridge_settings,
            shutdown.child_token(),
            tasks.clone(),
        );
        // Before the local API serves: each agent waits a moment for the plugin that held it.
        bridge.keep_agents_for_their_last_plugins().await;
        let (routing, routing_now) = watch::channel(Arc::new(Routing::of(&settings)));
        let intake = UpdateIntake::new(bot_id, ledger.clone(), bridge.clone(), routing_now);
        let (ingress, intake_health) =
            Ingress::of(&settings, secrets.webhook, relayed_from, intake, poll_bot, &ledger).await?;
        let mut health = Health::new(intake_health, ledger.clone(), settings.telegram.poll_timeout);
        if let Some(leading) = leading_status {
            health = health.with_leading(leading);
        }
        let operations = Operations { bridge: bridge.clone(), ledger: ledger.clone(), health, metrics };
        bridge.set_rooms(settings.rooms.clone());
        let permissions = PermissionRelay::new(
            ledger.clone(),
            room_api.clone(),
            PermissionRelay::relays_of(&settings),
            settings.operator.clone(),
            tasks.clone(),
            outbound.clone(),
        );
        bridge.set_permissions(permissions.clone());
        bridge.set_files(files);
        let staging_dir = Staging::dir_for(&settings);
        bridge.set_staging(Staging::open(staging_dir.clone()).with_context(|| {
            format!("storage.uploads_dir: opening the folder for replies' files, {}", staging_dir.display())
        })?);
        let rooms = bridge.room_driver(room_api);
        let retain = settings.storage.retain;
        let typing =
            settings.outbound.typing.map(|max| TypingIndicator::new(bridge.clone(), typing_api, max));
        let reloader = Reloader::new(settings, routing, bridge.clone(), outbound, certificate);
        Ok(Self {
            leading,
            resign,
            failure,
            ledger,
            listener,
            bridge,
            ingress,
            webhook_api,
            rooms,
            operations,
            reloader,
            hangups,
            shutdown,
            tasks,
            retain,
            permissions,
            menu_api,
            typing,
        })
    }

    /// What the operator's routes read, for `api.health_listen`'s listener.
    pub fn operations(&self) -> Operations {
        self.operations.clone()
    }

    /// Where the local API listens (useful when configured with port 0).
    pub fn api_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Runs until the root token is cancelled, then waits for every task: the poller
    /// stops, in-flight replies finish and are recorded, session streams end.
    pub async fn run(self) -> anyhow::Result<()> {
        let Self {
            leading,
            resign,
            failure,
            ledger,
            listener,
            bridge,
            ingress,
            webhook_api,
            rooms,
            operations,
            reloader,
            hangups,
            shutdown,
            tasks,
            retain,
            permissions,
            menu_api,
            typing,
        } = self;
        // The webhook's listener logs its address before the running line, so whoever waits
        // for that line finds both.
        match ingress {
            Ingress::Polling(poller) => {
                spawn_supervised(&tasks, &shutdown, &failure, "poller", poller.run(shutdown.child_token()))
            }
            Ingress::Webhook { listener, health, relayed } => {
                tracing::info!(webhook = %listener.local_addr()?, path = listener.path(), "{}", webhook::LISTENING_MESSAGE);
                let registration = Registration { api: webhook_api, health };
                let webhook = listener.run(Some(registration), tasks.clone(), shutdown.child_token());
                spawn_supervised(&tasks, &shutdown, &failure, "webhook", webhook);
                if let Some(relayed) = relayed {
                    let taking_in = relayed.take_in(shutdown.child_token());
                    spawn_supervised(&tasks, &shutdown, &failure, "relayed webhook deliveries", taking_in);
                }
            }
        }
        tracing::info!(api = %listener.local_addr()?, "{RUNNING_MESSAGE}");

        spawn_supervised(&tasks, &shutdown, &failure, "rooms", rooms.run(shutdown.child_token()));

        let server_stop = shutdown.child_token();
        let upkeep = metrics::upkeep(operations.metrics.clone(), shutdown.child_token());
        let server = listener.serve(api::server::router(bridge, operations), server_stop);
        spawn_supervised(&tasks, &shutdown, &failure, "local API", server);
        tasks.spawn(reload::reload_on_sighup(reloader, hangups, shutdown.child_token()));
        tasks.spawn(upkeep);
        tasks.spawn(permissions.run_keeper(shutdown.child_token()));
        if let Some(retain) = retain {
            tasks.spawn(scheduled_prunes(ledger.clone(), retain, shutdown.child_token()));
        }
        // Best effort, off the path of everything else: a bot without its menu works the same.
        let menu_stop = shutdown.child_token();
        tasks.spawn(async move {
            tokio::select! {
                () = menu::register_commands(&menu_api) => {}
                () = menu_stop.cancelled() => {}
            }
        });
        match typing {
            Some(typing) => {
                tasks.spawn(typing.run(shutdown.child_token()));
            }
            None => tracing::info!("typing indicator off ([outbound] typing = false)"),
        }

        shutdown.cancelled().await;
        tracing::info!("stopping: waiting for in-flight work");
        tasks.close();
        tasks.wait().await;
        match leading {
            Leading::Locked(lock) => {
                ledger.close().await;
                drop(lock);
            }
            Leading::Renewing(renewing) => {
                resign.cancel();
                if let Err(e) = renewing.await {
                    tracing::error!(error = %e, "the task renewing this replica's lease did not finish");
                }
                ledger.close().await;
            }
        }
        let failed = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
        match failed {
            Some(e) => Err(e),
            None => {
                tracing::info!("stopped cleanly");
                Ok(())
            }
        }
    }
}

/// What a running daemon holds on its ledger, until it has stopped.
enum Leading {
    Locked(crate::ledger::sqlite::LedgerLock),
    Renewing(tokio::task::JoinHandle<()>),
}

/// Renews this replica's leadership until the daemon has stopped (`resign`). Leading that
/// ends otherwise is a failure that stops the daemon: another replica leads now, or will
/// within a lease, and this one must not go on serving.
async fn lead(
    leadership: Box<Leadership>,
    resign: CancellationToken,
    shutdown: CancellationToken,
    failure: Arc<Mutex<Option<anyhow::Error>>>,
) {
    let step_down = leadership.hold(resign).await;
    if step_down == StepDown::Resigned {
        return;
    }
    let error = anyhow::anyhow!(
        "this replica no longer leads the bot ({step_down:?}): stopping, so that only the elected \
         replica serves; started again, it stands by"
    );
    tracing::error!(error = format!("{error:#}"), "{LEADERSHIP_LOST_MESSAGE}");
    failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error);
    shutdown.cancel();
}

/// Logged when a leading replica stops leading while it runs.
pub const LEADERSHIP_LOST_MESSAGE: &str = "leadership lost: stopping the daemon";

/// The bot's id, the number before the token's colon: what leadership and the ledger's
/// offsets are kept by.
pub fn bot_id_of(secrets: &DaemonSecrets) -> anyhow::Result<i64> {
    poller::bot_id_from_token(secrets.telegram.expose()).context(
        "the bot token does not look like a Telegram token (NUMBER:SECRET); check telegram.token_env",
    )
}

/// Runs `work` as a task of its own and watches it: an error, a panic, or an end before
/// shutdown is logged at error naming the subsystem and stops the daemon, which then exits
/// non-zero. Nothing can leave a half-alive process behind.
fn spawn_supervised(
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    failure: &Arc<Mutex<Option<anyhow::Error>>>,
    name: &'static str,
    work: impl Future<Output = anyhow::Result<()>> + Send + 'static,
) {
    let shutdown = shutdown.clone();
    let failure = Arc::clone(failure);
    // The work gets a task of its own so that a panic in it ends that task, not the
    // watcher: awaiting its handle observes the panic.
    let running = tasks.spawn(work);
    tasks.spawn(async move {
        let result = match running.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".to_owned());
                Err(anyhow::anyhow!("{name} panicked: {message}"))
            }
            Err(e) => Err(anyhow::anyhow!("{name} was cancelled: {e}")),
        };
        if !shutdown.is_cancelled() || result.is_err() {
            let error = result.err().unwrap_or_else(|| anyhow::anyhow!("{name} ended unexpectedly"));
            tracing::error!(
                subsystem = name,
                error = format!("{error:#}"),
                "subsystem failed: stopping the daemon"
            );
            failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error.context(name));
            shutdown.cancel();
        }
    });
}

/// The first scheduled prune comes this long after start (or sooner, when the interval is
/// shorter): soon enough that a restart applies a new `retain_days`, late enough to stay
/// out of start-up's own work (recovery, redeliveries).
const FIRST_PRUNE_AFTER: Duration = Duration::from_secs(60);

/// Prunes what finished more than `retain.days` ago, shortly after start and then every
/// `retain.every`, until `shutdown`, with the batches of `switchboard ledger prune`. A
/// failed prune is logged and tried again next time: what it left is still there.
async fn scheduled_prunes(ledger: Ledger, retain: Retention, shutdown: CancellationToken) {
    let mut wait = FIRST_PRUNE_AFTER.min(retain.every);
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
        wait = retain.every;
        let cutoff = chrono::Utc::now() - chrono::Duration::days(i64::from(retain.days));
        // The ledger's writes run on the thread that awaits them, so a prune runs on a
        // blocking thread of its own: its batches (tens of milliseconds each) then never
        // hold up a runtime worker that the poller, the API or a delivery is waiting for.
        // Cancelled between two batches at worst: each batch is one transaction.
        let pruning = {
            let (ledger, shutdown, runtime) =
                (ledger.clone(), shutdown.clone(), tokio::runtime::Handle::current());
            tokio::task::spawn_blocking(move || {
                runtime.block_on(async {
                    tokio::select! {
                        pruned = ledger.prune(cutoff, false) => Some(pruned),
                        () = shutdown.cancelled() => None,
                    }
                })
            })
        };
        let pruned = match pruning.await {
            Ok(Some(pruned)) => pruned,
            Ok(None) => return,
            Err(e) => Err(crate::ledger::LedgerError::other(format!("the prune's thread ended: {e}"))),
        };
        match pruned {
            Ok(report) if report.removed.total() == 0 => {
                tracing::debug!(retain_days = retain.days, "scheduled prune: nothing finished that long ago");
            }
            Ok(report) => {
                let removed: Vec<String> = report
                    .removed
                    .by_table()
                    .iter()
                    .filter(|(_, count)| *count > 0)
                    .map(|(table, count)| format!("{table} {count}"))
                    .collect();
                tracing::info!(
                    retain_days = retain.days,
                    batches = report.batches,
                    longest_batch_ms = report.longest_batch.as_millis() as u64,
                    free_pages = report.pages_after.free_pages,
                    "scheduled prune removed {}",
                    removed.join(", ")
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "scheduled prune failed; trying again in {}s", retain.every.as_secs())
            }
        }
    }
}

fn bot(token: &str, api_url: &reqwest::Url, timeout: Duration) -> anyhow::Result<Bot> {
    let client = teloxide::net::default_reqwest_settings()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(timeout)
        .build()
        .context("building the HTTP client for Telegram")?;
    Ok(Bot::with_client(token, client).set_api_url(api_url.clone()))
}

/// At start-up, before anything is sent: what a daemon that stopped left on its way to
/// Telegram may have arrived. Each such send becomes `unknown`, never sent again.
async fn recover_interrupted_sends(ledger: &Ledger) -> anyhow::Result<()> {
    for trace_id in ledger.recover_in_flight().await.context("recovering interrupted sends")? {
        tracing::error!(%trace_id, "a reply was in flight when the daemon stopped: marked unresolved; reconcile it with `switchboard ledger reconcile`");
    }
    let unknown_prompts =
        ledger.recover_prompt_sends().await.context("recovering interrupted permission prompts")?
            + ledger.recover_question_sends().await.context("recovering interrupted operator questions")?;
    if unknown_prompts > 0 {
        tracing::warn!(
            unknown_prompts,
            "prompts with buttons were being posted when the daemon stopped: marked unknown, never posted again"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reported_address_is_read_from_either_log_format() {
        let text =
            "2026-12-01T23:00:00.000001Z  INFO switchboard::app: switchboard running api=127.0.0.1:40123\n";
        let json = r#"{"timestamp":"2026-12-01T23:00:00Z","level":"INFO","message":"switchboard running","api":"[::1]:7797","target":"switchboard::app"}"#;
        let before = "2026-12-01T23:00:00Z  INFO switchboard::app: ledger opened\n";
        assert_eq!(
            reported_api_address(&format!("{before}{text}")),
            Some("127.0.0.1:40123".parse().unwrap())
        );
        assert_eq!(reported_api_address(json), Some("[::1]:7797".parse().unwrap()));
        assert_eq!(reported_api_address(before), None, "not until the line is there");
    }

    /// A subsystem that panics stops the daemon with its failure recorded, which makes
    /// `Daemon::run` return an error and the process exit non-zero.
    #[tokio::test]
    async fn a_panicking_subsystem_stops_the_daemon_with_a_failure() {
        let tasks = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let failure: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
        let healthy = shutdown.child_token();
        spawn_supervised(&tasks, &shutdown, &failure, "healthy", async move {
            healthy.cancelled().await;
            Ok(())
        });
        spawn_supervised(&tasks, &shutdown, &failure, "poller", async {
            tokio::task::yield_now().await;
            panic!("decoder bug");
        });
        tokio::time::timeout(Duration::from_secs(5), shutdown.cancelled()).await.expect("the daemon stops");
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await.expect("every task ends");
        let failed = failure.lock().unwrap().take().expect("the panic is the daemon's failure");
        let text = format!("{failed:#}");
        assert!(text.starts_with("poller: poller panicked: decoder bug"), "{text}");
    }

    #[tokio::test]
    async fn a_subsystem_that_ends_early_stops_the_daemon_and_one_that_stops_on_shutdown_does_not() {
        let tasks = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let failure: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
        spawn_supervised(&tasks, &shutdown, &failure, "server", async { Ok(()) });
        tokio::time::timeout(Duration::from_secs(5), shutdown.cancelled()).await.expect("the daemon stops");
        tasks.close();
        tasks.wait().await;
        let failed = failure.lock().unwrap().take().expect("an early end is a failure");
        assert!(format!("{failed:#}").contains("server ended unexpectedly"), "{failed:#}");

        let tasks = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let stop = shutdown.child_token();
        spawn_supervised(&tasks, &shutdown, &failure, "poller", async move {
            stop.cancelled().await;
            Ok(())
        });
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        assert!(failure.lock().unwrap().is_none(), "a clean stop is no failure");
    }
}
