//! Typed settings from one TOML file plus `SWITCHBOARD__SECTION__KEY` environment overrides.
//!
//! Loading parses the file, applies the overrides, deserializes into raw structs that deny
//! unknown keys, and then validates everything that can be checked without touching the
//! network. What comes out cannot be wrong later. Secrets are never in the file: it names
//! the environment variables that hold them, read by [`Settings::telegram_token`] and
//! [`Settings::agent_secret`].

mod probe;
mod raw;
mod settings;
#[cfg(test)]
mod tests;
mod validate;

use std::collections::BTreeMap;
use std::path::Path;

use crate::ids::{AgentName, Secret};
use crate::rules::routes::{Route, RouteTarget};

/// Prefix and separator of environment overrides: `SWITCHBOARD__TELEGRAM__API_URL`.
const ENV_PREFIX: &str = "SWITCHBOARD";
const ENV_SEPARATOR: &str = "__";

/// The environment override of `api.listen`. A daemon configured with port 0 reports the
/// port it got; whoever then starts a plugin beside the same file, or restarts the daemon
/// on that address, gives it this way (the tests, the benchmarks, `switchboard demo`).
pub const API_LISTEN_ENV: &str = "SWITCHBOARD__API__LISTEN";

/// The names of the variables in this process's environment that override a setting
/// (`SWITCHBOARD__…`): what a child process that must read only its own file is started
/// without.
pub fn environment_overrides() -> Vec<String> {
    let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

/// The keys whose value is a list, wherever they stand (`agents.NAME.aliases` too). From
/// the environment each is a comma-separated text: one item without a comma, none when
/// empty (which clears what the file lists).
const LIST_KEYS: [&str; 5] = ["allowed_users", "operators", "approvers", "aliases", "daemon"];

/// The file's settings under the environment's overrides. Scalars stay text until each is
/// read as its key's type, so `123` is a number where a number is wanted and a name where
/// a name is; each list key is its items, so a single user is a list of one.
fn with_environment(
    file: config::ConfigBuilder<config::builder::DefaultState>,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<config::ConfigBuilder<config::builder::DefaultState>, config::ConfigError> {
    let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
    let mut builder = file;
    let mut scalars = config::Map::new();
    for (name, value) in vars {
        let Some(key) = name.strip_prefix(&prefix) else { continue };
        let key = key.to_lowercase().replace(ENV_SEPARATOR, ".");
        if LIST_KEYS.iter().any(|list| key.rsplit('.').next() == Some(list)) {
            let items: Vec<&str> = value.split(',').map(str::trim).filter(|item| !item.is_empty()).collect();
            builder = builder.set_override(key, items)?;
        } else {
            scalars.insert(name, value);
        }
    }
    Ok(builder.add_source(
        config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator(ENV_SEPARATOR)
            .separator(ENV_SEPARATOR)
            .source(Some(scalars)),
    ))
}

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

pub use probe::HealthProbe;
use raw::RawSettings;
pub use settings::*;
use settings::{MAX_WEBHOOK_SECRET_LEN, is_webhook_secret};
use validate::{check_distinct_secrets, config_crate_error, join_names, read_secret};

impl Settings {
    /// Loads and validates a configuration file with its environment overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_under(path, std::env::vars())
    }

    /// [`Settings::load`] under the environment `vars`.
    fn load_under(path: &Path, vars: impl Iterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, "(file)", format!("cannot read: {e}")))?;
        let file =
            || config::Config::builder().add_source(config::File::from_str(&text, config::FileFormat::Toml));
        let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
        let vars: Vec<(String, String)> = vars.filter(|(name, _)| name.starts_with(&prefix)).collect();
        let raw: RawSettings = with_environment(file(), vars.iter().cloned())
            .and_then(|builder| builder.build())
            .and_then(config::Config::try_deserialize)
            .map_err(|e| {
                let error = config_crate_error(path, &text, e);
                // Blamed on the file, unless the file alone reads: then an override is at fault.
                let file_alone: Result<RawSettings, _> =
                    file().build().and_then(config::Config::try_deserialize);
                if vars.is_empty() || file_alone.is_err() {
                    return error;
                }
                let names: Vec<&str> = vars.iter().map(|(name, _)| name.as_str()).collect();
                ConfigError {
                    problem: format!(
                        "{} (the file alone reads: the fault is in the environment, which sets {})",
                        error.problem,
                        names.join(", ")
                    ),
                    ..error
                }
            })?;
        Self::validate(path, raw)
    }

    /// The bot token, from the variable `telegram.token_env` names.
    /// The bot token, from the variable `telegram.token_env` names, checked to look like one
    /// (`NUMBER:SECRET`, as @BotFather gives it), so that `check` refuses what `run` would:
    /// the bot's number keys its offsets and its leadership.
    pub fn telegram_token(&self) -> Result<Secret, ConfigError> {
        let key = "telegram.token_env";
        let token = read_secret(&self.source, key, &self.telegram.token_env)?;
        if crate::telegram::poller::bot_id_from_token(token.expose()).is_none() {
            return Err(ConfigError::new(
                &self.source,
                key,
                format!(
                    "the value of {} does not look like a bot token: @BotFather gives one as NUMBER:SECRET \
                     (123456789:AA…), with no spaces",
                    self.telegram.token_env
                ),
            ));
        }
        Ok(token)
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
        let webhook =
            self.telegram.webhook.as_ref().map(|webhook| self.webhook_secret(webhook)).transpose()?;
        Ok(DaemonSecrets { telegram, agents, webhook })
    }

    /// The webhook's secret, from the variable `telegram.webhook.secret_env` names, held to
    /// Telegram's rules for a `secret_token`.
    fn webhook_secret(&self, webhook: &WebhookSettings) -> Result<Secret, ConfigError> {
        let key = "telegram.webhook.secret_env";
        let secret = read_secret(&self.source, key, &webhook.secret_env)?;
        if !is_webhook_secret(secret.expose()) {
            return Err(ConfigError::new(
                &self.source,
                key,
                format!(
                    "the value of {} is not a secret Telegram accepts: 1-{MAX_WEBHOOK_SECRET_LEN} characters, \
                     each A-Z, a-z, 0-9, _ or - (e.g. from `openssl rand -hex 32`)",
                    webhook.secret_env
                ),
            ));
        }
        Ok(secret)
    }

    /// What is allowed but risky in these settings. Pure: file permissions are checked
    /// where the files are (`ledger::loose_files`).
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        let mut warnings = Vec::new();
        let listen = self.api.listen;
        if self.api.tls.is_none() && !listen.ip().is_loopback() {
            warnings.push(ConfigWarning {
                key: "api.listen".into(),
                problem: format!(
                    "{listen} is not a loopback address and the local API has no TLS: every \
                     request carries an agent's secret, readable by anyone on the network path; \
                     api.plaintext_beyond_loopback says this network is private, so make sure it is"
                ),
            });
        }
        let catch_all = self.routes.routes().iter().find(|route| route.target == RouteTarget::Default);
        let open_to_everyone =
            |route: &&Route| route.senders.as_deref().unwrap_or(&self.telegram.allowed_users).is_empty();
        if let Some(route) = catch_all.filter(open_to_everyone) {
            warnings.push(ConfigWarning {
                key: "telegram.allowed_users".into(),
                problem: format!(
                    "is empty and route {} takes every chat no other route names: anyone who finds \
                     the bot, in any chat, reaches its agent; list the senders who may",
                    route.name
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
    /// What Telegram sends with every webhook request, when `telegram.webhook` is set.
    pub webhook: Option<Secret>,
}

impl DaemonSecrets {
    /// Every secret value, for scrubbing logs.
    pub fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.telegram).chain(self.agents.values()).chain(self.webhook.as_ref())
    }
}
