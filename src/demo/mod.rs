//! `switchboard demo` (DESIGN.md §12): the real daemon against a Telegram that lives in
//! this process, with scripted agents on the local API, narrated step by step as it
//! happens. Every claim the narration makes is checked against the ledger and the fake
//! Telegram; one that does not hold stops the demo with a non-zero exit. It needs no
//! token, no configuration and no network, and leaves nothing behind unless `--keep DIR`.
//!
//! The parts: [`crate::fake_bot_api`] (the Bot API the tests use too, inside this
//! process), [`cast`] (who writes where), [`daemon`] (`switchboard run` as a child
//! process), [`narrate`] (the voice and the checks) and [`steps`] (what happens).

mod cast;
mod daemon;
mod narrate;
mod steps;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::agents::api::client::{ClientError, DaemonClient, SessionStream};
use crate::agents::api::wire::{DeliveredEnvelope, SessionEvent};
use crate::config::{Database, Synchronous};
use crate::fake_bot_api::{self, FakeTelegram};
use crate::ids::{AgentName, Secret, random_suffix};
use crate::ledger::Ledger;
use daemon::DemoDaemon;
use narrate::Broken;

/// How long any one thing the demo waits for may take before the step counts as broken.
const WAIT: Duration = Duration::from_secs(20);

const TOKEN_ENV: &str = "SWITCHBOARD_DEMO_BOT_TOKEN";
const ORCHESTRATOR: &str = "orchestrator";
const WORKER: &str = "worker";
/// The room's agents, in room order, and the names the room shows them by.
const BUILDER: (&str, &str) = ("builder", "Builder");
const REVIEWER: (&str, &str) = ("reviewer", "Reviewer");
/// The room's own ceiling: short, so the exchange that runs into it stays short.
const ROOM_CASCADE_LIMIT: u32 = 4;
const ROOM_ROUTE: &str = "dev-room";

/// Runs the demo; an error when a step did not behave as narrated (or the demo could not
/// run at all).
pub async fn run(keep: Option<PathBuf>) -> anyhow::Result<()> {
    let workdir = Workdir::new(keep)?;
    let fake = FakeTelegram::try_start().await.context("starting the demo's fake Telegram")?;
    // Privacy mode off, as group rooms need: the bot sees every message in its groups.
    fake.set_privacy_mode(false);
    let secrets = [
        (ORCHESTRATOR, random_secret()),
        (WORKER, random_secret()),
        (BUILDER.0, random_secret()),
        (REVIEWER.0, random_secret()),
    ];
    let config = workdir.path().join("switchboard.toml");
    std::fs::write(&config, config_text(&fake.api_url(), &workdir.path().join("ledger.db")))
        .with_context(|| format!("writing {}", config.display()))?;
    let mut env = vec![(TOKEN_ENV.to_owned(), fake_bot_api::TEST_TOKEN.to_owned())];
    env.extend(secrets.iter().map(|(agent, secret)| (secret_env(agent), secret.clone())));
    let mut daemon = DemoDaemon::new(config.clone(), workdir.path().join("daemon.log"), env);

    narrate::title("switchboard demo: the real daemon, a fake Telegram inside this process, scripted agents");
    narrate::said("directory", workdir.describe());
    let pid = daemon.start().await?;
    let api = daemon.api_addr().context("the daemon started without reporting its address")?;
    narrate::said("daemon", format!("`switchboard run` as pid {pid}, local API on {api}"));
    narrate::more(format!("its log: {}", daemon.log_path().display()));
    let ledger = crate::ledger::open_existing(
        &Database::Sqlite(workdir.path().join("ledger.db")),
        Synchronous::Normal,
    )
    .await?;
    let agent = |name: &'static str, secret: &str| -> anyhow::Result<Agent> {
        let client = DaemonClient::new(
            api,
            AgentName::parse(name).map_err(anyhow::Error::msg)?,
            Secret::new(secret.to_owned()),
        )?;
        Ok(Agent { name, client, stream: None })
    };
    let mut demo = Demo {
        orchestrator: agent(ORCHESTRATOR, &secrets[0].1)?,
        worker: agent(WORKER, &secrets[1].1)?,
        builder: agent(BUILDER.0, &secrets[2].1)?,
        reviewer: agent(REVIEWER.0, &secrets[3].1)?,
        fake,
        daemon,
        ledger,
        config,
        api,
    };
    let outcome = steps::all(&mut demo).await;
    demo.orchestrator.stream = None;
    demo.worker.stream = None;
    demo.builder.stream = None;
    demo.reviewer.stream = None;
    demo.ledger.close().await;
    if let Err(e) = &outcome {
        println!();
        println!("The demo stopped: {e}");
        println!("The daemon's last log lines:\n{}", demo.daemon.log_tail());
    }
    if demo.daemon.pid().is_some() {
        let stopped = demo.daemon.stop().await;
        if outcome.is_ok() {
            let status = stopped?;
            anyhow::ensure!(status.success(), "the daemon did not stop cleanly on SIGTERM ({status})");
        }
    }
    outcome?;
    println!();
    match workdir.kept() {
        Some(dir) => {
            println!(
                "Kept in {}: the ledger (ledger.db), its configuration and the daemon's log. Look at it with",
                dir.display()
            );
            println!("  switchboard ledger --config {} list", dir.join("switchboard.toml").display());
        }
        None => println!(
            "Every step behaved as narrated. `switchboard demo --keep DIR` keeps the ledger to look at."
        ),
    }
    Ok(())
}

/// Everything the steps act on.
pub(crate) struct Demo {
    /// The Telegram the users write in and the bot answers to.
    fake: FakeTelegram,
    /// `switchboard run`, killed and restarted by the last steps.
    daemon: DemoDaemon,
    /// The demo's own reading connection to the daemon's ledger (SQLite allows both).
    ledger: Ledger,
    /// The daemon's configuration, for the operator's `switchboard ledger` commands.
    config: PathBuf,
    /// The local API, where the agents and the health routes are.
    api: SocketAddr,
    orchestrator: Agent,
    worker: Agent,
    /// The room's agents.
    builder: Agent,
    reviewer: Agent,
}

/// A scripted agent: what the channel plugin does, step by step, on the local API.
pub(crate) struct Agent {
    /// Its `[agents.NAME]`, for the narration.
    name: &'static str,
    /// Authenticated with the agent's secret; speaks for the session `stream` opened.
    client: DaemonClient,
    /// The open session, while there is one.
    stream: Option<SessionStream>,
}

impl Agent {
    async fn connect(&mut self) -> Result<(), Broken> {
        let stream = self
            .client
            .open_session()
            .await
            .map_err(|e| Broken(format!("{}: no session: {e}", self.name)))?;
        self.stream = Some(stream);
        Ok(())
    }

    /// The next envelope on the session stream, confirmed as shown (as the plugin does
    /// before pushing it into the model's context).
    async fn next(&mut self) -> Result<DeliveredEnvelope, Broken> {
        let name = self.name;
        let stream = self.stream.as_mut().ok_or_else(|| Broken(format!("{name} has no session")))?;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let event = tokio::time::timeout_at(deadline, stream.next_event())
                .await
                .map_err(|_| Broken(format!("{name} received nothing within {WAIT:?}")))?
                .map_err(|e| Broken(format!("{name}'s session failed: {e}")))?;
            match event {
                Some(SessionEvent::Envelope(envelope)) => {
                    self.client
                        .shown(&envelope.trace_id)
                        .await
                        .map_err(|e| Broken(format!("{name}: shown: {e}")))?;
                    return Ok(envelope);
                }
                Some(_) => {}
                None => return Err(Broken(format!("{name}'s session stream ended"))),
            }
        }
    }
}

/// Turns a client error into a broken claim, for calls that must succeed.
fn must<T>(what: &str, result: Result<T, ClientError>) -> Result<T, Broken> {
    result.map_err(|e| Broken(format!("{what}: {e}")))
}

/// The demo's directory: a temporary one, removed at the end, or `--keep DIR`.
enum Workdir {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl Workdir {
    fn new(keep: Option<PathBuf>) -> anyhow::Result<Self> {
        let Some(dir) = keep else {
            return Ok(Self::Temporary(tempfile::Builder::new().prefix("switchboard-demo-").tempdir()?));
        };
        anyhow::ensure!(
            !dir.exists() || dir.is_dir(),
            "--keep {}: that is a file, not a directory; give a new or empty directory",
            dir.display()
        );
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let empty =
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?.next().is_none();
        anyhow::ensure!(
            empty,
            "--keep {}: the directory is not empty; give a new or empty one, so the demo's ledger starts fresh",
            dir.display()
        );
        // The kept configuration names the ledger by its absolute path, so `ledger --config`
        // works from any working directory.
        Ok(Self::Kept(std::fs::canonicalize(&dir)?))
    }

    fn path(&self) -> &Path {
        match self {
            Self::Temporary(dir) => dir.path(),
            Self::Kept(dir) => dir,
        }
    }

    fn kept(&self) -> Option<&Path> {
        match self {
            Self::Temporary(_) => None,
            Self::Kept(dir) => Some(dir),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Temporary(dir) => {
                format!("{} (removed at the end; --keep DIR keeps it)", dir.path().display())
            }
            Self::Kept(dir) => format!("{} (kept)", dir.display()),
        }
    }
}

fn secret_env(agent: &str) -> String {
    format!("SWITCHBOARD_DEMO_{}_SECRET", agent.to_ascii_uppercase())
}

/// A fresh secret per run: the demo's daemon is reachable by anyone on this machine's
/// loopback while it runs.
fn random_secret() -> String {
    format!("demo-{}", random_suffix(32))
}

fn config_text(api_url: &str, database: &Path) -> String {
    let (owner, group, room) = (cast::OWNER_DM_ID, cast::OPS_GROUP_ID, cast::DEV_ROOM_ID);
    format!(
        r#"# Written by `switchboard demo`. Its Telegram ({api_url}) lived inside the demo and is
# gone, and its secrets were random: `switchboard ledger --config THIS_FILE list` works on
# the kept ledger, `run` would need a real bot and the secret variables.

[telegram]
token_env = "{TOKEN_ENV}"
api_url = "{api_url}"
poll_timeout_secs = 2                 # short, so a restarted daemon is back within seconds

[storage]
database = "{database}"

[api]
listen = "127.0.0.1:0"                # any free port: the daemon reports the one it got

[outbound]
private_chat_interval_ms = 0          # the fake has no rate limits; a real bot keeps the defaults
group_chat_interval_ms = 0
global_per_sec = 0                   # nor an overall budget

[log]
filter = "info"

[agents.{ORCHESTRATOR}]
token_env = "{orchestrator_secret}"

[agents.{WORKER}]
token_env = "{worker_secret}"

[agents.{builder}]
token_env = "{builder_secret}"
display_name = "{builder_display}"

[agents.{reviewer}]
token_env = "{reviewer_secret}"
display_name = "{reviewer_display}"

[[routes]]
name = "owner-dm"
chat_id = {owner}
agent = "{ORCHESTRATOR}"

[[routes]]
name = "ops-group"
chat_id = {group}
agent = "{ORCHESTRATOR}"

[[routes]]
name = "{ROOM_ROUTE}"
chat_id = {room}
agents = ["{builder}", "{reviewer}"]
cascade_limit = {ROOM_CASCADE_LIMIT}                     # the demo's room runs into its ceiling quickly (default 10)
"#,
        database = database.display(),
        orchestrator_secret = secret_env(ORCHESTRATOR),
        worker_secret = secret_env(WORKER),
        builder = BUILDER.0,
        builder_secret = secret_env(BUILDER.0),
        builder_display = BUILDER.1,
        reviewer = REVIEWER.0,
        reviewer_secret = secret_env(REVIEWER.0),
        reviewer_display = REVIEWER.1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_configuration_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("switchboard.toml");
        std::fs::write(&path, config_text("http://127.0.0.1:9", &dir.path().join("ledger.db"))).unwrap();
        let settings = crate::config::Settings::load(&path).unwrap();
        assert_eq!(settings.routes.routes().len(), 3);
        assert_eq!(settings.agents.len(), 4);
        let room = settings.rooms.values().next().unwrap();
        assert_eq!((room.route.as_str(), room.limits.cascade_limit.get()), (ROOM_ROUTE, ROOM_CASCADE_LIMIT));
    }

    #[test]
    fn keep_refuses_a_directory_that_is_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("something"), "").unwrap();
        let error = Workdir::new(Some(dir.path().to_path_buf())).err().unwrap();
        assert!(error.to_string().contains("not empty"), "{error}");
        let file = Workdir::new(Some(dir.path().join("something"))).err().unwrap();
        assert!(file.to_string().contains("not a directory"), "{file}");
        let fresh = dir.path().join("new");
        assert!(matches!(Workdir::new(Some(fresh.clone())).unwrap(), Workdir::Kept(_)));
        assert!(fresh.is_dir());
    }
}
