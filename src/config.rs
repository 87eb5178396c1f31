//! Typed settings from one TOML file plus `SWITCHBOARD__SECTION__KEY` environment overrides.
//!
//! Loading parses the file, applies the overrides, deserializes into raw structs that deny
//! unknown keys, and then validates everything that can be checked without touching the
//! network. What comes out cannot be wrong later. Secrets are never in the file: it names
//! the environment variables that hold them, read by [`Settings::telegram_token`] and
//! [`Settings::agent_secret`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::ids::{AgentName, RouteName, Secret};
use crate::rules::routes::{Route, RouteTarget, RoutesError, RoutesTable};

/// Prefix and separator of environment overrides: `SWITCHBOARD__TELEGRAM__API_URL`.
const ENV_PREFIX: &str = "SWITCHBOARD";
const ENV_SEPARATOR: &str = "__";

/// Telegram holds a long poll open for at most 50 seconds.
const MAX_POLL_TIMEOUT_SECS: u64 = 50;

/// One clear message for bad configuration: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key}: {problem}")]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub problem: String,
}

impl ConfigError {
    fn new(file: &Path, key: impl Into<String>, problem: impl Into<String>) -> Self {
        Self { file: file.display().to_string(), key: key.into(), problem: problem.into() }
    }
}

/// A setting that is allowed but risky: `check` prints it and `run` logs it at `warn`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ConfigWarning {
    pub key: String,
    pub problem: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// SQLite's `synchronous` setting. With WAL, `normal` never loses a committed transaction
/// when the process dies (`kill -9`); `full` also survives power loss, at an fsync per
/// commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    #[default]
    Normal,
    Full,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// The file these settings came from, for messages.
    pub source: PathBuf,
    pub telegram: TelegramSettings,
    pub storage: StorageSettings,
    pub api: ApiSettings,
    pub log: LogSettings,
    pub outbound: OutboundSettings,
    pub handoffs: HandoffSettings,
    pub agents: BTreeMap<AgentName, AgentSettings>,
    pub routes: RoutesTable,
}

#[derive(Debug, Clone)]
pub struct TelegramSettings {
    pub token_env: String,
    pub api_url: reqwest::Url,
    pub poll_timeout: Duration,
    /// How long one `sendMessage` may take before its outcome counts as unknown.
    pub send_timeout: Duration,
    /// Sender ids allowed to reach an agent; empty means everyone in a routed chat.
    pub allowed_users: Vec<i64>,
    /// How long Telegram may refuse the bot token (401) before the daemon stops: a
    /// revoked token must not leave a daemon that silently polls forever.
    pub unauthorized_exit: Duration,
}

#[derive(Debug, Clone)]
pub struct StorageSettings {
    pub database: PathBuf,
    pub synchronous: Synchronous,
}

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone)]
pub struct OutboundSettings {
    /// A reply that would need more Telegram messages than this is refused before
    /// anything is sent: a runaway agent must not flood a chat.
    pub max_reply_parts: usize,
    /// The spacing of sends to one private chat and to one group (Telegram's per-chat
    /// limits); zero turns pacing off for that kind of chat.
    pub private_chat_interval: Duration,
    pub group_chat_interval: Duration,
}

#[derive(Debug, Clone)]
pub struct HandoffSettings {
    /// How deep a chain of handoffs may go: a handoff made for a handoff envelope is one
    /// level deeper than it. Stops two agents from bouncing work forever.
    pub max_depth: u32,
    /// A route whose chat receives a copy of every instruction and answer, best-effort.
    pub audit_route: Option<RouteName>,
}

#[derive(Debug, Clone)]
pub struct LogSettings {
    pub format: LogFormat,
    /// An `EnvFilter` directive; `RUST_LOG` overrides it.
    pub filter: String,
}

#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub token_env: String,
}

// ---- raw, as written in the file ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    telegram: RawTelegram,
    #[serde(default)]
    storage: RawStorage,
    #[serde(default)]
    api: RawApi,
    #[serde(default)]
    log: RawLog,
    #[serde(default)]
    outbound: RawOutbound,
    #[serde(default)]
    handoffs: RawHandoffs,
    #[serde(default)]
    agents: BTreeMap<String, RawAgent>,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelegram {
    #[serde(default = "default_token_env")]
    token_env: String,
    #[serde(default = "default_api_url")]
    api_url: String,
    #[serde(default = "default_poll_timeout")]
    poll_timeout_secs: u64,
    #[serde(default = "default_send_timeout")]
    send_timeout_secs: u64,
    #[serde(default)]
    allowed_users: Vec<i64>,
    #[serde(default = "default_unauthorized_exit")]
    unauthorized_exit_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    #[serde(default = "default_database")]
    database: PathBuf,
    #[serde(default)]
    synchronous: Synchronous,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApi {
    #[serde(default = "default_listen")]
    listen: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutbound {
    #[serde(default = "default_max_reply_parts")]
    max_reply_parts: usize,
    #[serde(default = "default_private_chat_interval_ms")]
    private_chat_interval_ms: u64,
    #[serde(default = "default_group_chat_interval_ms")]
    group_chat_interval_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHandoffs {
    #[serde(default = "default_max_depth")]
    max_depth: u32,
    audit_route: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    #[serde(default)]
    format: LogFormat,
    #[serde(default = "default_filter")]
    filter: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    token_env: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    chat_id: Option<i64>,
    thread_id: Option<i32>,
    agent: Option<String>,
}

fn default_token_env() -> String {
    "TELOXIDE_TOKEN".into()
}
fn default_api_url() -> String {
    "https://api.telegram.org".into()
}
fn default_poll_timeout() -> u64 {
    10
}
fn default_send_timeout() -> u64 {
    15
}
/// Five minutes: long enough to ride out a token being swapped, short enough that a
/// revoked token is noticed (the exit status) the same hour.
fn default_unauthorized_exit() -> u64 {
    300
}
fn default_database() -> PathBuf {
    "switchboard.db".into()
}
fn default_listen() -> String {
    "127.0.0.1:7797".into()
}
/// Ten messages of 4096 characters: a long answer fits, a runaway one does not.
fn default_max_reply_parts() -> usize {
    10
}
/// Telegram: about one message a second to one chat.
fn default_private_chat_interval_ms() -> u64 {
    crate::rules::pacing::PRIVATE_INTERVAL.as_millis() as u64
}
/// Telegram: at most twenty messages a minute to one group.
fn default_group_chat_interval_ms() -> u64 {
    crate::rules::pacing::GROUP_INTERVAL.as_millis() as u64
}
/// Three levels: an orchestrator, a worker, and a helper the worker asks.
fn default_max_depth() -> u32 {
    3
}
fn default_filter() -> String {
    "info".into()
}

impl Default for RawStorage {
    fn default() -> Self {
        Self { database: default_database(), synchronous: Synchronous::default() }
    }
}
impl Default for RawApi {
    fn default() -> Self {
        Self { listen: default_listen() }
    }
}
impl Default for RawOutbound {
    fn default() -> Self {
        Self {
            max_reply_parts: default_max_reply_parts(),
            private_chat_interval_ms: default_private_chat_interval_ms(),
            group_chat_interval_ms: default_group_chat_interval_ms(),
        }
    }
}
impl Default for RawHandoffs {
    fn default() -> Self {
        Self { max_depth: default_max_depth(), audit_route: None }
    }
}
impl Default for RawLog {
    fn default() -> Self {
        Self { format: LogFormat::default(), filter: default_filter() }
    }
}

impl Settings {
    /// Loads and validates a configuration file with its environment overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, "(file)", format!("cannot read: {e}")))?;
        // Parse once ourselves: toml's message carries the line and column of a syntax
        // error, which is what someone fixing the file needs first.
        if let Err(e) = text.parse::<toml::Table>() {
            return Err(ConfigError::new(path, "(syntax)", toml_error_message(&text, &e)));
        }
        let raw: RawSettings = config::Config::builder()
            .add_source(config::File::from_str(&text, config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator(ENV_SEPARATOR)
                    .separator(ENV_SEPARATOR)
                    .try_parsing(true)
                    .list_separator(",")
                    .with_list_parse_key("telegram.allowed_users"),
            )
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| config_crate_error(path, e))?;
        Self::validate(path, raw)
    }

    fn validate(path: &Path, raw: RawSettings) -> Result<Self, ConfigError> {
        let err = |key: &str, problem: String| ConfigError::new(path, key, problem);

        let api_url = reqwest::Url::parse(&raw.telegram.api_url)
            .map_err(|e| err("telegram.api_url", format!("'{}' is not a URL: {e}", raw.telegram.api_url)))?;
        if !matches!(api_url.scheme(), "http" | "https") || api_url.host().is_none() {
            return Err(err(
                "telegram.api_url",
                format!("'{api_url}' must be an http or https URL with a host"),
            ));
        }
        if raw.telegram.poll_timeout_secs > MAX_POLL_TIMEOUT_SECS {
            return Err(err(
                "telegram.poll_timeout_secs",
                format!(
                    "{} is above Telegram's maximum of {MAX_POLL_TIMEOUT_SECS}",
                    raw.telegram.poll_timeout_secs
                ),
            ));
        }
        if raw.telegram.send_timeout_secs == 0 {
            return Err(err("telegram.send_timeout_secs", "must be at least 1".into()));
        }
        check_env_name(path, "telegram.token_env", &raw.telegram.token_env)?;

        let listen: SocketAddr = raw.api.listen.parse().map_err(|_| {
            err("api.listen", format!("'{}' is not an address like 127.0.0.1:7797", raw.api.listen))
        })?;

        if raw.outbound.max_reply_parts == 0 {
            return Err(err("outbound.max_reply_parts", "must be at least 1".into()));
        }

        tracing_subscriber::EnvFilter::try_new(&raw.log.filter)
            .map_err(|e| err("log.filter", format!("'{}' is not a log filter: {e}", raw.log.filter)))?;

        let mut agents = BTreeMap::new();
        for (name, agent) in raw.agents {
            let key = format!("agents.{name}");
            let parsed = AgentName::parse(&name).map_err(|e| err(&key, e))?;
            check_env_name(path, &format!("{key}.token_env"), &agent.token_env)?;
            agents.insert(parsed, AgentSettings { token_env: agent.token_env });
        }

        let mut routes = Vec::with_capacity(raw.routes.len());
        for (index, route) in raw.routes.into_iter().enumerate() {
            routes.push(validate_route(path, index, route, &agents)?);
        }
        let routes = RoutesTable::new(routes).map_err(|e| {
            let index = match &e {
                RoutesError::DuplicateName { second, .. } | RoutesError::SameTarget { second, .. } => *second,
            };
            err(&format!("routes[{index}]"), e.to_string())
        })?;

        if raw.handoffs.max_depth == 0 {
            return Err(err("handoffs.max_depth", "must be at least 1".into()));
        }
        let audit_route = match raw.handoffs.audit_route {
            None => None,
            Some(name) => {
                let route = routes
                    .routes()
                    .iter()
                    .find(|route| route.name.as_str() == name)
                    .ok_or_else(|| err("handoffs.audit_route", format!("no route is named '{name}'")))?;
                if !matches!(route.target, RouteTarget::Chat { .. } | RouteTarget::Topic { .. }) {
                    return Err(err(
                        "handoffs.audit_route",
                        format!("route '{name}' is the default route: the audit copy needs a chat"),
                    ));
                }
                Some(route.name.clone())
            }
        };
        let handoffs = HandoffSettings { max_depth: raw.handoffs.max_depth, audit_route };

        Ok(Settings {
            source: path.to_path_buf(),
            telegram: TelegramSettings {
                token_env: raw.telegram.token_env,
                api_url,
                poll_timeout: Duration::from_secs(raw.telegram.poll_timeout_secs),
                send_timeout: Duration::from_secs(raw.telegram.send_timeout_secs),
                allowed_users: raw.telegram.allowed_users,
                unauthorized_exit: Duration::from_secs(raw.telegram.unauthorized_exit_secs),
            },
            storage: StorageSettings { database: raw.storage.database, synchronous: raw.storage.synchronous },
            api: ApiSettings { listen },
            log: LogSettings { format: raw.log.format, filter: raw.log.filter },
            outbound: OutboundSettings {
                max_reply_parts: raw.outbound.max_reply_parts,
                private_chat_interval: Duration::from_millis(raw.outbound.private_chat_interval_ms),
                group_chat_interval: Duration::from_millis(raw.outbound.group_chat_interval_ms),
            },
            handoffs,
            agents,
            routes,
        })
    }

    /// The bot token, from the variable `telegram.token_env` names.
    pub fn telegram_token(&self) -> Result<Secret, ConfigError> {
        read_secret(&self.source, "telegram.token_env", &self.telegram.token_env)
    }

    /// An agent's secret for the local API, from the variable its `token_env` names.
    pub fn agent_secret(&self, agent: &AgentName) -> Result<Secret, ConfigError> {
        let settings = self.agents.get(agent).ok_or_else(|| {
            ConfigError::new(
                &self.source,
                format!("agents.{agent}"),
                format!("no such agent (declared: {})", self.agent_list()),
            )
        })?;
        read_secret(&self.source, &format!("agents.{agent}.token_env"), &settings.token_env)
    }

    /// Every secret the daemon needs, so a missing one stops start-up before anything runs.
    ///
    /// Two agents with the same secret (whether they name one variable or two that hold
    /// the same value) are refused: the local API knows an agent only by its secret, so
    /// either could act as the other.
    pub fn daemon_secrets(&self) -> Result<DaemonSecrets, ConfigError> {
        let telegram = self.telegram_token()?;
        let agents = self
            .agents
            .keys()
            .map(|agent| Ok((agent.clone(), self.agent_secret(agent)?)))
            .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
        let named = agents
            .iter()
            .map(|(agent, secret)| (agent, self.agents[agent].token_env.as_str(), secret))
            .collect::<Vec<_>>();
        check_distinct_secrets(&self.source, &named)?;
        Ok(DaemonSecrets { telegram, agents })
    }

    /// What is allowed but risky in these settings. Pure: file permissions are checked
    /// where the files are (`ledger::loose_files`).
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        let mut warnings = Vec::new();
        let listen = self.api.listen;
        if !listen.ip().is_loopback() {
            warnings.push(ConfigWarning {
                key: "api.listen".into(),
                problem: format!(
                    "{listen} is not a loopback address: the local API has no TLS and every \
                     request carries an agent's secret, readable by anyone on the network path; \
                     listen on 127.0.0.1 unless a TLS tunnel or a private network protects it"
                ),
            });
        }
        warnings
    }

    pub fn agent_list(&self) -> String {
        join_names(self.agents.keys())
    }
}

/// Secrets read from the environment at start-up.
#[derive(Debug, Clone)]
pub struct DaemonSecrets {
    pub telegram: Secret,
    pub agents: BTreeMap<AgentName, Secret>,
}

impl DaemonSecrets {
    /// Every secret value, for scrubbing logs.
    pub fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.telegram).chain(self.agents.values())
    }
}

fn validate_route(
    path: &Path,
    index: usize,
    raw: RawRoute,
    agents: &BTreeMap<AgentName, AgentSettings>,
) -> Result<Route, ConfigError> {
    let key = |field: &str| format!("routes[{index}].{field}");
    let err = |field: &str, problem: String| ConfigError::new(path, key(field), problem);

    let name = raw.name.ok_or_else(|| err("name", "every route needs a name".into()))?;
    let name = RouteName::parse(&name).map_err(|e| err("name", e))?;
    let agent = raw.agent.ok_or_else(|| err("agent", format!("route '{name}' names no agent")))?;
    let agent = AgentName::parse(&agent).map_err(|e| err("agent", e))?;
    if !agents.contains_key(&agent) {
        let declared = if agents.is_empty() {
            "none; add an [agents.NAME] table".to_owned()
        } else {
            join_names(agents.keys())
        };
        return Err(err(
            "agent",
            format!("route '{name}' names unknown agent '{agent}' (declared: {declared})"),
        ));
    }
    let target = match (raw.chat_id, raw.thread_id) {
        (Some(0), _) => return Err(err("chat_id", format!("route '{name}': 0 is not a Telegram chat id"))),
        (Some(chat_id), Some(thread_id)) if thread_id > 0 => RouteTarget::Topic { chat_id, thread_id },
        (Some(_), Some(thread_id)) => {
            return Err(err("thread_id", format!("route '{name}': {thread_id} is not a forum topic id")));
        }
        (Some(chat_id), None) => RouteTarget::Chat { chat_id },
        (None, Some(_)) => {
            return Err(err("thread_id", format!("route '{name}' has a thread_id but no chat_id")));
        }
        (None, None) => RouteTarget::Default,
    };
    Ok(Route { name, target, agent })
}

/// Refuses two agents that share a secret, naming both agents' keys and never the value.
/// `agents` is (agent, the variable its `token_env` names, the secret read from it).
fn check_distinct_secrets(path: &Path, agents: &[(&AgentName, &str, &Secret)]) -> Result<(), ConfigError> {
    for (later, &(agent, var, secret)) in agents.iter().enumerate() {
        for &(earlier, earlier_var, earlier_secret) in &agents[..later] {
            let key = format!("agents.{agent}.token_env");
            let problem = if var == earlier_var {
                format!(
                    "names the same variable as agents.{earlier}.token_env ({var}); \
                     each agent needs a secret of its own, or either could act as the other"
                )
            } else if secret.matches(earlier_secret.expose()) {
                format!(
                    "holds the same secret as agents.{earlier}.token_env ({var} and {earlier_var} \
                     have the same value); each agent needs a secret of its own, or either could \
                     act as the other"
                )
            } else {
                continue;
            };
            return Err(ConfigError::new(path, key, problem));
        }
    }
    Ok(())
}

fn check_env_name(path: &Path, key: &str, name: &str) -> Result<(), ConfigError> {
    let valid = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if valid {
        Ok(())
    } else {
        Err(ConfigError::new(path, key, format!("'{name}' is not an environment variable name")))
    }
}

fn read_secret(path: &Path, key: &str, var: &str) -> Result<Secret, ConfigError> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Ok(Secret::new(value.trim().to_owned())),
        Ok(_) => Err(ConfigError::new(path, key, format!("environment variable {var} is empty"))),
        Err(_) => Err(ConfigError::new(path, key, format!("environment variable {var} is not set"))),
    }
}

fn join_names<T: fmt::Display>(names: impl Iterator<Item = T>) -> String {
    names.map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
}

/// "line L, column C: what is wrong" — toml's own Display spans several lines.
fn toml_error_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    let Some(span) = e.span() else {
        return message.to_owned();
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

/// Turns the `config` crate's error into ours, keeping the key it names when it names one.
fn config_crate_error(path: &Path, e: config::ConfigError) -> ConfigError {
    match e {
        config::ConfigError::Type { key: Some(key), unexpected, expected, .. } => {
            ConfigError::new(path, key, format!("expected {expected}, found {unexpected}"))
        }
        config::ConfigError::Message(message) => {
            // Deserialization messages look like "unknown field `x`, expected one of … for key `telegram`".
            match message.rsplit_once(" for key `") {
                Some((problem, key)) => ConfigError::new(path, key.trim_end_matches('`'), problem),
                None => ConfigError::new(path, "(file)", message),
            }
        }
        other => ConfigError::new(path, "(file)", other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const MINIMAL: &str = r#"
[telegram]
token_env = "SB_TEST_TOKEN"

[agents.orchestrator]
token_env = "SB_TEST_ORCH"

[[routes]]
name = "dm"
chat_id = 42
agent = "orchestrator"
"#;

    fn load_str(text: &str) -> Result<Settings, ConfigError> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        Settings::load(file.path())
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let settings = load_str(MINIMAL).unwrap();
        assert_eq!(settings.telegram.api_url.as_str(), "https://api.telegram.org/");
        assert_eq!(settings.telegram.poll_timeout, Duration::from_secs(10));
        assert_eq!(settings.telegram.unauthorized_exit, Duration::from_secs(300));
        assert_eq!(settings.api.listen.to_string(), "127.0.0.1:7797");
        assert_eq!(settings.storage.synchronous, Synchronous::Normal);
        assert_eq!(settings.routes.routes().len(), 1);
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/switchboard.example.toml");
        let settings = Settings::load(&path).unwrap();
        assert_eq!(settings.routes.routes().len(), 3);
    }

    fn problem(text: &str) -> ConfigError {
        load_str(text).expect_err("configuration should be refused")
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = problem("[telegram]\ntoken_env = \"X\"\napi_url = \n");
        assert_eq!(e.key, "(syntax)");
        assert!(e.problem.contains("line 3"), "{e}");
    }

    #[test]
    fn unknown_agent_in_a_route_is_named() {
        let e = problem(&MINIMAL.replace("agent = \"orchestrator\"", "agent = \"ghost\""));
        assert_eq!(e.key, "routes[0].agent");
        assert!(e.problem.contains("'ghost'") && e.problem.contains("orchestrator"), "{e}");
    }

    #[test]
    fn route_without_agent_is_refused() {
        let e = problem(&MINIMAL.replace("agent = \"orchestrator\"", ""));
        assert_eq!(e.key, "routes[0].agent");
    }

    #[test]
    fn duplicate_routes_are_refused() {
        let text = format!("{MINIMAL}\n[[routes]]\nname = \"dm2\"\nchat_id = 42\nagent = \"orchestrator\"\n");
        let e = problem(&text);
        assert_eq!(e.key, "routes[1]");
        assert!(e.problem.contains("'dm'") && e.problem.contains("'dm2'"), "{e}");
    }

    #[test]
    fn two_default_routes_are_refused() {
        let text = format!(
            "{MINIMAL}\n[[routes]]\nname = \"a\"\nagent = \"orchestrator\"\n[[routes]]\nname = \"b\"\nagent = \"orchestrator\"\n"
        );
        assert_eq!(problem(&text).key, "routes[2]");
    }

    #[test]
    fn thread_without_chat_is_refused() {
        let e = problem(&MINIMAL.replace("chat_id = 42", "thread_id = 7"));
        assert_eq!(e.key, "routes[0].thread_id");
    }

    #[test]
    fn bad_api_url_is_refused() {
        let e = problem(&MINIMAL.replace("[telegram]", "[telegram]\napi_url = \"not a url\""));
        assert_eq!(e.key, "telegram.api_url");
        let e = problem(&MINIMAL.replace("[telegram]", "[telegram]\napi_url = \"ftp://example.org\""));
        assert_eq!(e.key, "telegram.api_url");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = problem(&MINIMAL.replace("chat_id = 42", "chat_id = 42\nchat-id = 43"));
        assert!(e.problem.contains("chat-id"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_key() {
        let e = problem(&MINIMAL.replace("[telegram]", "[telegram]\npoll_timeout_secs = \"soon\""));
        assert!(e.to_string().contains("poll_timeout_secs"), "{e}");
    }

    #[test]
    fn only_a_non_loopback_listen_address_is_a_warning() {
        assert_eq!(load_str(MINIMAL).unwrap().warnings(), []);
        let ipv6 = MINIMAL.replace("[telegram]", "[api]\nlisten = \"[::1]:7797\"\n[telegram]");
        assert_eq!(load_str(&ipv6).unwrap().warnings(), []);
        for open in ["0.0.0.0:7797", "192.168.1.5:7797", "[::]:7797"] {
            let text = MINIMAL.replace("[telegram]", &format!("[api]\nlisten = \"{open}\"\n[telegram]"));
            let warnings = load_str(&text).unwrap().warnings();
            assert_eq!(warnings.len(), 1, "{open}");
            assert_eq!(warnings[0].key, "api.listen");
            assert!(
                warnings[0].problem.contains(open) && warnings[0].problem.contains("no TLS"),
                "{}",
                warnings[0]
            );
        }
    }

    #[test]
    fn agents_sharing_a_secret_are_refused_naming_both_keys_but_not_the_value() {
        let path = Path::new("switchboard.toml");
        let (orch, worker) = (AgentName::parse("orch").unwrap(), AgentName::parse("worker").unwrap());
        let (one, other) = (Secret::new("s3cret-value-1".into()), Secret::new("s3cret-value-2".into()));

        let distinct = [(&orch, "ORCH", &one), (&worker, "WORKER", &other)];
        assert_eq!(check_distinct_secrets(path, &distinct), Ok(()));

        let same_value = [(&orch, "ORCH", &one), (&worker, "WORKER", &one.clone())];
        let e = check_distinct_secrets(path, &same_value).unwrap_err();
        assert_eq!(e.key, "agents.worker.token_env");
        assert!(e.problem.contains("agents.orch.token_env") && e.problem.contains("same secret"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "the value is never shown: {e}");

        let same_variable = [(&orch, "SHARED", &one), (&worker, "SHARED", &one.clone())];
        let e = check_distinct_secrets(path, &same_variable).unwrap_err();
        assert_eq!(e.key, "agents.worker.token_env");
        assert!(e.problem.contains("agents.orch.token_env") && e.problem.contains("SHARED"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn missing_secret_names_the_variable() {
        let settings = load_str(&MINIMAL.replace("SB_TEST_TOKEN", "SB_TEST_SURELY_UNSET")).unwrap();
        let e = settings.daemon_secrets().unwrap_err();
        assert_eq!(e.key, "telegram.token_env");
        assert!(e.problem.contains("SB_TEST_SURELY_UNSET is not set"), "{e}");
    }
}
