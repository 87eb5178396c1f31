//! What entitles this process to run the daemon on its ledger, taken before anything
//! else touches it, and held until the daemon has stopped.
//!
//! - **SQLite:** the file's lock. One daemon per ledger file; a second one refuses to start.
//! - **PostgreSQL:** leadership of the bot (DESIGN.md §16). Replicas with the same
//!   configuration on one database elect one leader per bot token; the others stand by,
//!   asking every lease/3, and one of them is elected within about a lease once the leader
//!   dies, is paused past its lease, or loses the database. Only the leader runs: it
//!   polls (or takes the webhook's deliveries), serves the agents' sessions, sends and
//!   drives rooms and tasks; in webhook mode a standby also listens for Telegram and
//!   relays each delivery to it (`telegram::relay`). That is what makes start-up
//!   recovery right on a shared database: when a replica is elected, every other one is a standby that sends nothing
//!   or a deposed leader that is stopping, so the sends it finds in flight are the ones
//!   whose outcome nobody will learn, and they are marked unknown, as after a crash.
//!
//! A leader that stops leading (deposed, its lease ran out, its connection to the
//! database broke) stops the daemon with an error, so whatever supervises it (systemd,
//! Docker, Kubernetes) starts it again, and it stands by. Its writes under the old term are
//! refused by the ledger meanwhile (`ledger::postgres`'s fencing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::{Database, PostgresLedger, Synchronous, WebhookSettings};
use crate::ids::Secret;
use crate::ledger::postgres::{Elected, PollerCandidate, StepDown};
use crate::ledger::sqlite::LedgerLock;
use crate::ledger::{Ledger, PgLedger, SqliteLedger};
use crate::operate::health::Leading;
use crate::rules::leadership::Tenure;
use crate::telegram::relay::UpdateRelay;
use crate::telegram::webhook::{self, UpdateSink, WebhookListener};

/// The ledger, opened, with what lets this process run on it.
#[derive(Debug)]
pub struct LedgerHold {
    pub ledger: Ledger,
    pub entitlement: Entitlement,
}

/// Why this process may run on the ledger.
#[derive(Debug)]
pub enum Entitlement {
    /// SQLite's file lock, let go when the process ends.
    FileLock(LedgerLock),
    /// This replica leads the bot on PostgreSQL (boxed: its candidacy holds a connection).
    Leader(Box<Leadership>),
}

/// This replica's tenure as the bot's leader, and the candidacy that renews it.
#[derive(Debug)]
pub struct Leadership {
    candidate: PollerCandidate,
    tenure: Tenure,
    ledger: PgLedger,
    bot_id: i64,
    /// What `/readyz` shows of it; `leads` is cleared when the tenure ends.
    status: Leading,
    /// The tenure's end, moved on at each renewal: sends check it as they leave.
    leads_until: tokio::sync::watch::Sender<std::time::Instant>,
    /// The webhook listener this replica relayed with while it stood by, still open: the
    /// daemon closes it once the lease is being renewed ([`Self::take_relaying`]).
    relaying: Option<Relaying>,
}

/// The webhook a standby listens on while another replica leads: it commits each delivery
/// for the leader (`telegram::relay`), so Telegram and the load balancer in front of the
/// replicas may send to any of them.
#[derive(Debug, Clone)]
pub struct StandbyWebhook {
    pub settings: WebhookSettings,
    pub secret: Secret,
}

/// What came of waiting for the ledger.
#[derive(Debug)]
pub enum Taken {
    Hold(LedgerHold),
    /// Stopped (a signal) while standing by: there is nothing to run and nothing to undo.
    StoppedStandingBy,
}

impl LedgerHold {
    /// Takes the ledger `[storage] database` names: SQLite's lock at once (or an error if
    /// another daemon holds it), PostgreSQL's leadership of `bot_id` once elected, standing
    /// by until then or until `shutdown`.
    pub async fn take(
        database: &Database,
        synchronous: Synchronous,
        bot_id: i64,
        webhook: Option<StandbyWebhook>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Taken> {
        match database {
            Database::Sqlite(path) => {
                // Before the ledger is even opened: a second daemon must not migrate,
                // recover or bind anything while the first one runs.
                let lock = LedgerLock::acquire(path)?;
                let ledger = SqliteLedger::open(path, synchronous).await?;
                Ok(Taken::Hold(Self { ledger: Arc::new(ledger), entitlement: Entitlement::FileLock(lock) }))
            }
            Database::Postgres(postgres) => Leadership::stand(postgres, bot_id, webhook, shutdown).await,
        }
    }
}

impl Leadership {
    /// Connects, then campaigns every lease/3, waiting for the lock in between, until
    /// elected or stopped. An unreachable
    /// database at start is an error (the configuration may be wrong); once connected, a
    /// failed campaign is logged and tried again.
    async fn stand(
        postgres: &PostgresLedger,
        bot_id: i64,
        webhook: Option<StandbyWebhook>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Taken> {
        let ledger = PgLedger::connect(&postgres.url).await.with_context(|| {
            format!("opening the PostgreSQL ledger {}", Database::Postgres(postgres.clone()))
        })?;
        let mut candidate = PollerCandidate::connect(&ledger, bot_id, &postgres.replica, postgres.lease)
            .await
            .context("opening the connection that holds this replica's candidacy")?;
        let mut said_standing_by = false;
        let mut relaying: Option<Relaying> = None;
        let tenure = loop {
            match candidate.campaign_once().await {
                Ok(Elected::Leader(tenure)) => break tenure,
                Ok(Elected::StandBy) if !said_standing_by => {
                    tracing::info!(replica = %postgres.replica, bot_id, "{STANDING_BY_MESSAGE}");
                    said_standing_by = true;
                    if let Some(webhook) = &webhook {
                        let relay = UpdateRelay::new(ledger.clone(), bot_id, postgres.replica.clone());
                        relaying = Some(Relaying::start(webhook.clone(), relay).await?);
                    }
                }
                Ok(Elected::StandBy) => {}
                Err(error) => {
                    tracing::warn!(bot_id, %error, "campaigning for the bot's lease failed; trying again")
                }
            }
            let relay_failed = async {
                match relaying.as_mut() {
                    Some(relaying) => relaying.failed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // A leader that dies lets go of the lock at once: waiting for it, rather than
                // asking again after a pause, makes its end the moment of the takeover.
                () = candidate.wait_for_lock(postgres.lease.renewal_interval()) => {}
                error = relay_failed => {
                    ledger.close().await;
                    return Err(error);
                }
                () = shutdown.cancelled() => {
                    if let Some(relaying) = relaying {
                        relaying.stop().await;
                    }
                    ledger.close().await;
                    return Ok(Taken::StoppedStandingBy);
                }
            }
        };
        tracing::info!(replica = %postgres.replica, bot_id, term = tenure.term.get(), "{LEADING_MESSAGE}");
        ledger.lead_polling(bot_id, tenure.term);
        let hold = LedgerHold {
            ledger: Arc::new(ledger.clone()),
            entitlement: Entitlement::Leader(Box::new(Self {
                candidate,
                tenure,
                ledger,
                bot_id,
                status: Leading {
                    replica: postgres.replica.clone(),
                    term: tenure.term.get(),
                    leads: Arc::new(AtomicBool::new(true)),
                },
                leads_until: tokio::sync::watch::Sender::new(tenure.ends_at()),
                relaying,
            })),
        };
        Ok(Taken::Hold(hold))
    }

    /// Renews the lease until `resign` (the daemon has stopped: the lease is given up, so a
    /// standby is elected at once) or until leading ends otherwise, which is returned.
    /// Either way this replica's polled intake is refused from then on.
    pub async fn hold(mut self, resign: CancellationToken) -> StepDown {
        let step_down = self.candidate.hold(self.tenure, &resign, &self.leads_until).await;
        self.leads_until.send_replace(std::time::Instant::now());
        self.status.leads.store(false, Ordering::Release);
        self.ledger.stop_leading_polling(self.bot_id, self.tenure.term);
        step_down
    }

    /// The webhook listener this replica relayed with while it stood by. The daemon binds
    /// that address itself once it is closed, which waits for the deliveries being
    /// committed (each bounded by the ledger's lock timeout, seconds): so it is closed once
    /// the lease is being renewed, or a lease shorter than that wait would lapse and hand
    /// the bot to another replica before this one served at all.
    pub fn take_relaying(&mut self) -> Option<Relaying> {
        self.relaying.take()
    }

    /// The ledger this replica leads on, for what only PostgreSQL has (relayed deliveries).
    pub fn ledger(&self) -> PgLedger {
        self.ledger.clone()
    }

    /// Until when this replica leads the bot by its own clock (see `Outbound::leading_until`).
    pub fn leads_until(&self) -> tokio::sync::watch::Receiver<std::time::Instant> {
        self.leads_until.subscribe()
    }

    /// Who this replica is and whether it still leads, for `/readyz` and `/metrics`.
    pub fn status(&self) -> Leading {
        self.status.clone()
    }
}

/// Logged once by a replica that another one leads.
pub const STANDING_BY_MESSAGE: &str = "standing by: another replica leads this bot";

/// Logged when this replica is elected, before it recovers and starts.
pub const LEADING_MESSAGE: &str = "elected: this replica leads the bot";

/// A standby's webhook listener, relaying deliveries to the leader.
#[derive(Debug)]
pub struct Relaying {
    serving: tokio::task::JoinHandle<anyhow::Result<()>>,
    tasks: tokio_util::task::TaskTracker,
    stop: CancellationToken,
}

impl Relaying {
    async fn start(webhook: StandbyWebhook, relay: UpdateRelay) -> anyhow::Result<Self> {
        let sink = UpdateSink::Relay(Box::new(relay));
        let listener = WebhookListener::bind(webhook.settings, webhook.secret, sink).await?;
        tracing::info!(webhook = %listener.local_addr()?, path = listener.path(), "{}", webhook::RELAYING_MESSAGE);
        let (tasks, stop) = (tokio_util::task::TaskTracker::new(), CancellationToken::new());
        let serving = tokio::spawn(listener.run(None, tasks.clone(), stop.clone()));
        Ok(Self { serving, tasks, stop })
    }

    /// Waits until the listener fails; what it failed with.
    async fn failed(&mut self) -> anyhow::Error {
        match (&mut self.serving).await {
            Ok(Err(error)) => error.context("the standby's webhook listener"),
            Ok(Ok(())) => anyhow::anyhow!("the standby's webhook listener stopped by itself"),
            Err(panicked) => anyhow::anyhow!("the standby's webhook listener failed: {panicked}"),
        }
    }

    /// Stops listening once the deliveries being committed are: the port is free after.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let _ = self.serving.await;
    }
}
