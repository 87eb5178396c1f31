//! The configuration every benchmark's daemon runs with, written in one place: a fake Bot
//! API's token and address, a ledger in the run's own directory, the local API on port 0
//! (the daemon reports the port it got), pacing off, and the agents and routes a run
//! names. Each benchmark says only what it changes.

use std::fmt::Write as _;
use std::path::Path;

use switchboard::rules::routes::RouteTarget;

/// Who a route hands its messages to.
#[derive(Debug, Clone)]
enum RouteTo {
    Agent(String),
    /// A group room: several agents, taking turns.
    Room(Vec<String>),
}

/// A `switchboard.toml` for a benchmark's daemon, built up and then written out by
/// [`DaemonConfig::text`].
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    token_env: String,
    api_url: String,
    /// `[storage] database`: a SQLite file's path or a `postgres://` URL.
    database: String,
    poll_timeout_secs: Option<u64>,
    log_filter: Option<String>,
    /// Each agent by name, with the variable its secret is in.
    agents: Vec<(String, String)>,
    routes: Vec<(String, RouteTarget, RouteTo)>,
}

impl DaemonConfig {
    /// The bot's token is read from `token_env`, the Bot API is the fake at `api_url`,
    /// and the ledger is `database`. The log stays at the daemon's default (`info`).
    ///
    /// Pacing is off, per chat and overall: the fake enforces no limits unless a run asks
    /// it to, and the benchmarks write to a chat faster than Telegram allows, so pacing
    /// would measure Telegram's rules, not the software.
    pub fn new(token_env: &str, api_url: &str, database: &Path) -> Self {
        Self {
            token_env: token_env.to_owned(),
            api_url: api_url.to_owned(),
            database: database.display().to_string(),
            poll_timeout_secs: None,
            log_filter: None,
            agents: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// The ledger on PostgreSQL at `url` instead of the SQLite file.
    pub fn on_postgres(mut self, url: &str) -> Self {
        self.database = url.to_owned();
        self
    }

    /// The long poll's timeout (`telegram.poll_timeout_secs`).
    pub fn poll_timeout_secs(mut self, seconds: u64) -> Self {
        self.poll_timeout_secs = Some(seconds);
        self
    }

    /// Logs at `filter` (`warn`, say), so that logging does not weigh on the figures; the
    /// line in which the daemon reports where its local API listens stays at `info`,
    /// since the benchmark reads it.
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = Some(filter.to_owned());
        self
    }

    /// An agent whose secret is in the variable `secret_env`.
    pub fn agent(mut self, name: &str, secret_env: &str) -> Self {
        self.agents.push((name.to_owned(), secret_env.to_owned()));
        self
    }

    /// A route from `target` to one agent.
    pub fn route(mut self, name: &str, target: RouteTarget, agent: &str) -> Self {
        self.routes.push((name.to_owned(), target, RouteTo::Agent(agent.to_owned())));
        self
    }

    /// A group room: a route from `chat_id` to several agents.
    pub fn room(mut self, name: &str, chat_id: i64, agents: &[&str]) -> Self {
        let agents = agents.iter().map(|agent| (*agent).to_owned()).collect();
        self.routes.push((name.to_owned(), RouteTarget::Chat { chat_id }, RouteTo::Room(agents)));
        self
    }

    /// The configuration file's text.
    pub fn text(&self) -> String {
        let mut text = format!(
            "[telegram]\ntoken_env = {}\napi_url = {}\n",
            quoted(&self.token_env),
            quoted(&self.api_url)
        );
        if let Some(seconds) = self.poll_timeout_secs {
            let _ = writeln!(text, "poll_timeout_secs = {seconds}");
        }
        let _ = write!(
            text,
            "\n[storage]\ndatabase = {}\n\n\
             [api]\nlisten = \"127.0.0.1:0\"\n\n\
             [outbound]\nprivate_chat_interval_ms = 0\ngroup_chat_interval_ms = 0\nglobal_per_sec = 0\n",
            quoted(&self.database)
        );
        if let Some(filter) = &self.log_filter {
            let _ =
                write!(text, "\n[log]\nfilter = {}\n", quoted(&format!("{filter},switchboard::app=info")));
        }
        for (name, secret_env) in &self.agents {
            let _ = write!(text, "\n[agents.{name}]\ntoken_env = {}\n", quoted(secret_env));
        }
        for (name, target, to) in &self.routes {
            let _ = write!(text, "\n[[routes]]\nname = {}\n", quoted(name));
            match target {
                RouteTarget::Chat { chat_id } => {
                    let _ = writeln!(text, "chat_id = {chat_id}");
                }
                RouteTarget::Topic { chat_id, thread_id } => {
                    let _ = writeln!(text, "chat_id = {chat_id}\nthread_id = {thread_id}");
                }
                RouteTarget::Default => {}
            }
            match to {
                RouteTo::Agent(agent) => {
                    let _ = writeln!(text, "agent = {}", quoted(agent));
                }
                RouteTo::Room(agents) => {
                    let agents: Vec<String> = agents.iter().map(|agent| quoted(agent)).collect();
                    let _ = writeln!(text, "agents = [{}]", agents.join(", "));
                }
            }
        }
        text
    }

    /// Writes [`Self::text`] to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.text())
            .unwrap_or_else(|e| panic!("writing the configuration {}: {e}", path.display()));
    }
}

/// A TOML basic string.
fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}
