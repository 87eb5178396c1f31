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
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::ids::{AgentName, RouteName, Secret};
use crate::rules::pacing::PaceLimits;
use crate::rules::routes::{Audience, Route, RouteTarget, RoutesError, RoutesTable};
use crate::rules::turns::{self, RoomMember, RoomRoster, RosterError};

/// Prefix and separator of environment overrides: `SWITCHBOARD__TELEGRAM__API_URL`.
const ENV_PREFIX: &str = "SWITCHBOARD";
const ENV_SEPARATOR: &str = "__";

/// The environment override of `api.listen`. A daemon configured with port 0 reports the
/// port it got; whoever then starts a plugin beside the same file, or restarts the daemon
/// on that address, gives it this way (the tests, the benchmarks, `switchboard demo`).
pub const API_LISTEN_ENV: &str = "SWITCHBOARD__API__LISTEN";

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
    /// `[rooms]`: the limits of a room route that does not set its own.
    pub room_defaults: RoomLimits,
    /// Every room route (DESIGN.md §10), by route name.
    pub rooms: BTreeMap<RouteName, RoomSettings>,
    /// `[operator]`: where unresolved sends are asked about, and who answers.
    pub operator: Option<OperatorSettings>,
    /// `[media]`: files between Telegram and the agents.
    pub media: MediaSettings,
}

/// `[operator]`: each unresolved send is posted to this route's chat with Delivered / Not
/// delivered buttons, which only `operators` may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorSettings {
    pub route: RouteName,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    /// Telegram user ids whose answers count; never empty.
    pub operators: Vec<i64>,
}

/// `[media]`: files between Telegram and the agents (DESIGN.md §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaSettings {
    /// A photo up to this size is downloaded into the agent's inbox before its envelope is
    /// pushed (`meta.image_path`); a larger one waits for `download_attachment`. 0 turns
    /// eager downloads off.
    pub eager_photo_max_bytes: u64,
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
    /// `telegram.webhook`: Telegram pushes updates to this daemon's listener instead of
    /// being polled. `None` polls.
    pub webhook: Option<WebhookSettings>,
}

/// `[telegram] webhook = { public_url, listen, secret_env }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// What Telegram is told to call (`setWebhook`): an https URL with a path, served by
    /// the user's load balancer or reverse proxy, which terminates TLS and forwards to
    /// `listen`.
    pub public_url: reqwest::Url,
    /// Where this daemon listens for Telegram's requests, in plain HTTP: the route is
    /// `public_url`'s path.
    pub listen: SocketAddr,
    /// The environment variable holding the secret Telegram sends back with every request
    /// (`X-Telegram-Bot-Api-Secret-Token`).
    pub secret_env: String,
}

impl WebhookSettings {
    /// The path Telegram's requests arrive on, as the proxy forwards them.
    pub fn path(&self) -> &str {
        self.public_url.path()
    }
}

impl fmt::Display for WebhookSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{ public_url = {}, listen = {}, secret_env = {} }}",
            self.public_url, self.listen, self.secret_env
        )
    }
}

/// Telegram's rule for a webhook's `secret_token`: 1-256 characters, each `A-Z`, `a-z`,
/// `0-9`, `_` or `-`.
const MAX_WEBHOOK_SECRET_LEN: usize = 256;

fn is_webhook_secret(secret: &str) -> bool {
    (1..=MAX_WEBHOOK_SECRET_LEN).contains(&secret.len())
        && secret.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[derive(Debug, Clone)]
pub struct StorageSettings {
    pub database: PathBuf,
    pub synchronous: Synchronous,
    /// The daemon prunes what finished longer ago than this, on a schedule (`None`: keeps
    /// everything, the default).
    pub retain: Option<Retention>,
}

/// `[storage] retain_days`, and how often the daemon prunes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub days: u32,
    /// Between two scheduled prunes (`storage.retention_interval_secs`, an hour by
    /// default, which keeps a busy ledger's batches small).
    pub every: Duration,
}

/// How often the daemon prunes by default: old rows wait at most an hour past their age.
const DEFAULT_RETENTION_INTERVAL_SECS: u64 = 3600;

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone)]
pub struct OutboundSettings {
    /// A reply that would need more Telegram messages than this is refused before
    /// anything is sent: a runaway agent must not flood a chat.
    pub max_reply_parts: usize,
    /// Telegram's limits sends are paced to: the spacing of sends to one private chat and
    /// to one group, and sends a second across all chats; zero turns that pacing off.
    pub pacing: PaceLimits,
    /// `typing` and `typing_max_secs`: how long at most a chat shows "typing…" while a
    /// message the agent was shown waits for its answer; `None` when typing is off.
    pub typing: Option<Duration>,
    /// `ack_reaction`: the reaction set on each user message as it is handed to a
    /// session, one of Telegram's reaction emoji; `None` for none.
    pub ack_reaction: Option<&'static str>,
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
    /// How rooms show the agent (`Builder: …`); `None` shows its name.
    pub display_name: Option<String>,
    /// Extra `@` names it answers to in rooms, without the `@`.
    pub aliases: Vec<String>,
    /// `[agents.NAME.permissions]`: where its session's tool-use approvals are relayed
    /// (DESIGN.md §15); `None` when they are not, and then its plugin does not offer to.
    pub permissions: Option<PermissionSettings>,
}

/// `timeout_secs` of `[agents.NAME.permissions]` when it is left out.
pub const DEFAULT_PERMISSION_TIMEOUT_SECS: u64 = 600;

/// The longest `timeout_secs`: a week. A prompt that waits longer is forgotten at the
/// terminal anyway, and its buttons would stay live in the chat.
pub const MAX_PERMISSION_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

/// An agent's permission relay (DESIGN.md §15): the route whose chat and topic get the
/// prompts, who may answer them, and when an unanswered one expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionSettings {
    pub route: RouteName,
    pub chat_id: i64,
    /// The route's forum topic, if it has one.
    pub thread_id: Option<i32>,
    /// Telegram user ids whose answers count; never empty.
    pub approvers: Vec<i64>,
    pub timeout: Duration,
}

/// The limits of one room's exchanges (`[rooms]`, or a room route's own keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomLimits {
    /// Agent turns one human message may use.
    pub cascade_limit: NonZeroU32,
    /// The tool-loop budget each speaker is told (`group_max_iters`; 0 or negative
    /// selects [`turns::DEFAULT_GROUP_MAX_ITERS`]). The switchboard cannot enforce it.
    pub max_iters: u32,
    /// A speaker that neither replies nor acks by then loses the floor.
    pub speaker_timeout: Duration,
}

impl Default for RoomLimits {
    fn default() -> Self {
        Self {
            cascade_limit: NonZeroU32::new(turns::DEFAULT_CASCADE_LIMIT).expect("the default is not zero"),
            max_iters: turns::DEFAULT_GROUP_MAX_ITERS,
            speaker_timeout: Duration::from_secs(turns::DEFAULT_SPEAKER_TIMEOUT_SECS),
        }
    }
}

/// A room route: its chat, its agents in room order with the names they answer to, and
/// its limits.
#[derive(Debug, Clone)]
pub struct RoomSettings {
    pub route: RouteName,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub roster: RoomRoster,
    pub limits: RoomLimits,
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
    rooms: RawRooms,
    #[serde(default)]
    agents: BTreeMap<String, RawAgent>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    operator: Option<RawOperator>,
    #[serde(default)]
    media: RawMedia,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOperator {
    route: String,
    #[serde(default)]
    operators: Vec<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMedia {
    #[serde(default = "default_eager_photo_max_bytes")]
    eager_photo_max_bytes: u64,
}

impl Default for RawMedia {
    fn default() -> Self {
        Self { eager_photo_max_bytes: default_eager_photo_max_bytes() }
    }
}

/// 10 MiB: a phone camera's photo, as Telegram stores its largest size, is well below it.
fn default_eager_photo_max_bytes() -> u64 {
    10 * 1024 * 1024
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
    #[serde(default)]
    webhook: Option<RawWebhook>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    public_url: String,
    listen: String,
    #[serde(default = "default_webhook_secret_env")]
    secret_env: String,
}

fn default_webhook_secret_env() -> String {
    "SWITCHBOARD_WEBHOOK_SECRET".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    #[serde(default = "default_database")]
    database: PathBuf,
    #[serde(default)]
    synchronous: Synchronous,
    #[serde(default)]
    retain_days: Option<u32>,
    /// For tests: how often to prune (docs do not offer it; an hour is right for a daemon).
    #[serde(default)]
    retention_interval_secs: Option<u64>,
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
    #[serde(default = "default_global_per_sec")]
    global_per_sec: u32,
    #[serde(default = "default_typing")]
    typing: bool,
    #[serde(default = "default_typing_max_secs")]
    typing_max_secs: u64,
    #[serde(default)]
    ack_reaction: Option<String>,
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
struct RawRooms {
    #[serde(default = "default_cascade_limit")]
    cascade_limit: u32,
    #[serde(default = "default_group_max_iters")]
    group_max_iters: i64,
    #[serde(default = "default_speaker_timeout")]
    speaker_timeout_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    token_env: String,
    display_name: Option<String>,
    #[serde(default)]
    aliases: Vec<String>,
    permissions: Option<RawPermissions>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPermissions {
    route: String,
    #[serde(default)]
    approvers: Vec<i64>,
    #[serde(default = "default_permission_timeout")]
    timeout_secs: u64,
}

fn default_permission_timeout() -> u64 {
    DEFAULT_PERMISSION_TIMEOUT_SECS
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    chat_id: Option<i64>,
    thread_id: Option<i32>,
    agent: Option<String>,
    /// A room: several agents, in room order.
    agents: Option<Vec<String>>,
    /// A room's own limits, over `[rooms]`.
    cascade_limit: Option<u32>,
    group_max_iters: Option<i64>,
    speaker_timeout_secs: Option<u64>,
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
/// Telegram: about thirty messages a second across all chats.
fn default_global_per_sec() -> u32 {
    crate::rules::pacing::OVERALL_PER_SEC
}
fn default_typing() -> bool {
    true
}
/// Two minutes of "typing…" for one waiting message: long enough for most answers, short
/// enough that an agent that went quiet does not look busy for ever.
fn default_typing_max_secs() -> u64 {
    120
}
/// Three levels: an orchestrator, a worker, and a helper the worker asks.
fn default_max_depth() -> u32 {
    3
}
fn default_filter() -> String {
    "info".into()
}
fn default_cascade_limit() -> u32 {
    turns::DEFAULT_CASCADE_LIMIT
}
fn default_group_max_iters() -> i64 {
    i64::from(turns::DEFAULT_GROUP_MAX_ITERS)
}
fn default_speaker_timeout() -> u64 {
    turns::DEFAULT_SPEAKER_TIMEOUT_SECS
}

impl Default for RawRooms {
    fn default() -> Self {
        Self {
            cascade_limit: default_cascade_limit(),
            group_max_iters: default_group_max_iters(),
            speaker_timeout_secs: default_speaker_timeout(),
        }
    }
}

impl Default for RawStorage {
    fn default() -> Self {
        Self {
            database: default_database(),
            synchronous: Synchronous::default(),
            retain_days: None,
            retention_interval_secs: None,
        }
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
            global_per_sec: default_global_per_sec(),
            typing: default_typing(),
            typing_max_secs: default_typing_max_secs(),
            ack_reaction: None,
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
            .map_err(|e| config_crate_error(path, &text, e))?;
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
        let webhook = raw.telegram.webhook.map(|raw| validate_webhook(path, raw)).transpose()?;

        let listen: SocketAddr = raw.api.listen.parse().map_err(|_| {
            err("api.listen", format!("'{}' is not an address like 127.0.0.1:7797", raw.api.listen))
        })?;

        let retain = match raw.storage.retain_days {
            None => None,
            Some(0) => {
                return Err(err(
                    "storage.retain_days",
                    "must be at least 1 (leave it out to keep everything)".into(),
                ));
            }
            Some(days) => {
                let every = raw.storage.retention_interval_secs.unwrap_or(DEFAULT_RETENTION_INTERVAL_SECS);
                if every == 0 {
                    return Err(err("storage.retention_interval_secs", "must be at least 1".into()));
                }
                Some(Retention { days, every: Duration::from_secs(every) })
            }
        };

        if raw.outbound.max_reply_parts == 0 {
            return Err(err("outbound.max_reply_parts", "must be at least 1".into()));
        }
        if raw.outbound.typing_max_secs == 0 {
            return Err(err(
                "outbound.typing_max_secs",
                "must be at least 1 (turn typing off with typing = false)".into(),
            ));
        }
        let ack_reaction = match raw.outbound.ack_reaction.as_deref() {
            None => None,
            Some(emoji) => Some(
                crate::telegram::reactions::allowed_reaction(emoji)
                    .map_err(|why| err("outbound.ack_reaction", why.replace(". Nothing was sent", "")))?,
            ),
        };

        tracing_subscriber::EnvFilter::try_new(&raw.log.filter)
            .map_err(|e| err("log.filter", format!("'{}' is not a log filter: {e}", raw.log.filter)))?;

        let mut agents = BTreeMap::new();
        // Resolved once the routes are known: a relay names a route.
        let mut relays = Vec::new();
        for (name, mut agent) in raw.agents {
            let key = format!("agents.{name}");
            let parsed = AgentName::parse(&name).map_err(|e| err(&key, e))?;
            check_env_name(path, &format!("{key}.token_env"), &agent.token_env)?;
            if let Some(relay) = agent.permissions.take() {
                relays.push((parsed.clone(), format!("{key}.permissions"), relay));
            }
            agents.insert(parsed, validate_agent(path, &key, agent)?);
        }

        let room_defaults = RoomLimits {
            cascade_limit: cascade_limit(path, "rooms.cascade_limit", raw.rooms.cascade_limit)?,
            max_iters: turns::effective_max_iters(raw.rooms.group_max_iters),
            speaker_timeout: speaker_timeout(
                path,
                "rooms.speaker_timeout_secs",
                raw.rooms.speaker_timeout_secs,
            )?,
        };
        let mut routes = Vec::with_capacity(raw.routes.len());
        let mut rooms = BTreeMap::new();
        for (index, route) in raw.routes.into_iter().enumerate() {
            let (route, room) = validate_route(path, index, route, &agents, room_defaults)?;
            if let Some(room) = room {
                rooms.insert(route.name.clone(), room);
            }
            routes.push(route);
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
        let operator = match raw.operator {
            None => None,
            Some(raw) => {
                let (route, chat_id, thread_id) = chat_route(path, "operator", &raw.route, &routes)?;
                let operators = user_ids(path, "operator.operators", raw.operators, "operators")?;
                Some(OperatorSettings { route, chat_id, thread_id, operators })
            }
        };
        for (agent, key, relay) in relays {
            let settings = validate_permissions(path, &key, relay, &routes)?;
            if let Some(agent) = agents.get_mut(&agent) {
                agent.permissions = Some(settings);
            }
        }

        Ok(Settings {
            source: path.to_path_buf(),
            telegram: TelegramSettings {
                token_env: raw.telegram.token_env,
                api_url,
                poll_timeout: Duration::from_secs(raw.telegram.poll_timeout_secs),
                send_timeout: Duration::from_secs(raw.telegram.send_timeout_secs),
                allowed_users: raw.telegram.allowed_users,
                unauthorized_exit: Duration::from_secs(raw.telegram.unauthorized_exit_secs),
                webhook,
            },
            storage: StorageSettings {
                database: raw.storage.database,
                synchronous: raw.storage.synchronous,
                retain,
            },
            api: ApiSettings { listen },
            log: LogSettings { format: raw.log.format, filter: raw.log.filter },
            outbound: OutboundSettings {
                max_reply_parts: raw.outbound.max_reply_parts,
                pacing: PaceLimits {
                    private: Duration::from_millis(raw.outbound.private_chat_interval_ms),
                    group: Duration::from_millis(raw.outbound.group_chat_interval_ms),
                    overall_per_sec: raw.outbound.global_per_sec,
                },
                typing: raw.outbound.typing.then(|| Duration::from_secs(raw.outbound.typing_max_secs)),
                ack_reaction,
            },
            handoffs,
            agents,
            routes,
            room_defaults,
            rooms,
            operator,
            media: MediaSettings { eager_photo_max_bytes: raw.media.eager_photo_max_bytes },
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
    /// What Telegram sends with every webhook request, when `telegram.webhook` is set.
    pub webhook: Option<Secret>,
}

impl DaemonSecrets {
    /// Every secret value, for scrubbing logs.
    pub fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.telegram).chain(self.agents.values()).chain(self.webhook.as_ref())
    }
}

fn validate_route(
    path: &Path,
    index: usize,
    raw: RawRoute,
    agents: &BTreeMap<AgentName, AgentSettings>,
    room_defaults: RoomLimits,
) -> Result<(Route, Option<RoomSettings>), ConfigError> {
    let key = |field: &str| format!("routes[{index}].{field}");
    let err = |field: &str, problem: String| ConfigError::new(path, key(field), problem);

    let name = raw.name.ok_or_else(|| err("name", "every route needs a name".into()))?;
    let name = RouteName::parse(&name).map_err(|e| err("name", e))?;
    let known = |field: &str, agent: &str| -> Result<AgentName, ConfigError> {
        let agent = AgentName::parse(agent).map_err(|e| err(field, e))?;
        if agents.contains_key(&agent) {
            return Ok(agent);
        }
        let declared = if agents.is_empty() {
            "none; add an [agents.NAME] table".to_owned()
        } else {
            join_names(agents.keys())
        };
        Err(err(field, format!("route '{name}' names unknown agent '{agent}' (declared: {declared})")))
    };
    let audience = match (raw.agent, raw.agents) {
        (Some(_), Some(_)) => {
            return Err(err(
                "agents",
                format!(
                    "route '{name}' has both `agent` and `agents`: a route belongs to one agent (`agent`) or is \
                     a room of several (`agents`), not both"
                ),
            ));
        }
        (None, None) => {
            return Err(err(
                "agent",
                format!("route '{name}' names no agent (set `agent`, or `agents` for a group room)"),
            ));
        }
        (Some(agent), None) => Audience::Agent(known("agent", &agent)?),
        (None, Some(members)) => {
            let members =
                members.iter().map(|agent| known("agents", agent)).collect::<Result<Vec<_>, _>>()?;
            Audience::Room(members)
        }
    };
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
    let room = match &audience {
        Audience::Agent(_) => {
            let room_keys = [
                ("cascade_limit", raw.cascade_limit.is_some()),
                ("group_max_iters", raw.group_max_iters.is_some()),
                ("speaker_timeout_secs", raw.speaker_timeout_secs.is_some()),
            ];
            if let Some((field, _)) = room_keys.iter().find(|(_, set)| *set) {
                return Err(err(
                    field,
                    format!("route '{name}' is not a room: only a route with `agents = [...]` takes {field}"),
                ));
            }
            None
        }
        Audience::Room(members) => {
            let (chat_id, thread_id) = match target {
                RouteTarget::Topic { chat_id, thread_id } => (chat_id, Some(thread_id)),
                RouteTarget::Chat { chat_id } => (chat_id, None),
                RouteTarget::Default => {
                    return Err(err(
                        "chat_id",
                        format!(
                            "route '{name}' is a room and needs a chat_id: a room is one group or forum topic, \
                             not the default route"
                        ),
                    ));
                }
            };
            let roster =
                room_roster(members, agents).map_err(|e| err("agents", format!("route '{name}': {e}")))?;
            let limits = RoomLimits {
                cascade_limit: match raw.cascade_limit {
                    Some(limit) => cascade_limit(path, &key("cascade_limit"), limit)?,
                    None => room_defaults.cascade_limit,
                },
                max_iters: raw.group_max_iters.map_or(room_defaults.max_iters, turns::effective_max_iters),
                speaker_timeout: match raw.speaker_timeout_secs {
                    Some(secs) => speaker_timeout(path, &key("speaker_timeout_secs"), secs)?,
                    None => room_defaults.speaker_timeout,
                },
            };
            Some(RoomSettings { route: name.clone(), chat_id, thread_id, roster, limits })
        }
    };
    Ok((Route { name, target, audience }, room))
}

/// A room's members with their display names and aliases, checked by the pure core.
fn room_roster(
    members: &[AgentName],
    agents: &BTreeMap<AgentName, AgentSettings>,
) -> Result<RoomRoster, RosterError> {
    RoomRoster::new(
        members
            .iter()
            .map(|name| {
                let settings = &agents[name];
                let mut member = RoomMember::new(name.clone()).with_aliases(settings.aliases.iter().cloned());
                if let Some(display_name) = &settings.display_name {
                    member = member.with_display_name(display_name.clone());
                }
                member
            })
            .collect(),
    )
}

/// An agent's table: its display name must show something, and each alias must be
/// something a room message can `@`-mention.
fn validate_agent(path: &Path, key: &str, raw: RawAgent) -> Result<AgentSettings, ConfigError> {
    let display_name = match raw.display_name.as_deref().map(str::trim) {
        None => None,
        Some("") => {
            return Err(ConfigError::new(
                path,
                format!("{key}.display_name"),
                "is empty; leave it out to show the agent's name",
            ));
        }
        Some(shown) => Some(shown.to_owned()),
    };
    let mut aliases = Vec::with_capacity(raw.aliases.len());
    for alias in &raw.aliases {
        let bare = alias.trim().trim_start_matches('@');
        if turns::mention_tokens(&format!("@{bare}")) != [turns::normalise(bare)] {
            return Err(ConfigError::new(
                path,
                format!("{key}.aliases"),
                format!(
                    "'{alias}' cannot be mentioned: an alias is one word of letters, digits, '_' or '-' (a room \
                     message mentions it as @{bare})"
                ),
            ));
        }
        aliases.push(bare.to_owned());
    }
    Ok(AgentSettings { token_env: raw.token_env, display_name, aliases, permissions: None })
}

/// `[agents.NAME.permissions]`: the route must exist and have a chat (a prompt needs one
/// place to go), someone must be able to answer, and a prompt must live a while.
fn validate_permissions(
    path: &Path,
    key: &str,
    raw: RawPermissions,
    routes: &RoutesTable,
) -> Result<PermissionSettings, ConfigError> {
    let err = |field: &str, problem: String| ConfigError::new(path, format!("{key}.{field}"), problem);
    let (route, chat_id, thread_id) = chat_route(path, key, &raw.route, routes)?;
    let approvers = user_ids(path, &format!("{key}.approvers"), raw.approvers, "approvers")?;
    if !(1..=MAX_PERMISSION_TIMEOUT_SECS).contains(&raw.timeout_secs) {
        return Err(err(
            "timeout_secs",
            format!(
                "{} must be at least 1 and at most {MAX_PERMISSION_TIMEOUT_SECS} (a week)",
                raw.timeout_secs
            ),
        ));
    }
    Ok(PermissionSettings {
        route,
        chat_id,
        thread_id,
        approvers,
        timeout: Duration::from_secs(raw.timeout_secs),
    })
}

/// The route a table's `route` names, with its chat and topic: it must exist and have a
/// chat, since a prompt needs one place to go.
fn chat_route(
    path: &Path,
    key: &str,
    name: &str,
    routes: &RoutesTable,
) -> Result<(RouteName, i64, Option<i32>), ConfigError> {
    let err = |problem: String| ConfigError::new(path, format!("{key}.route"), problem);
    let route = routes.routes().iter().find(|route| route.name.as_str() == name).ok_or_else(|| {
        let declared = join_names(routes.routes().iter().map(|route| &route.name));
        err(format!("no route is named '{name}' (routes: {declared})"))
    })?;
    match route.target {
        RouteTarget::Topic { chat_id, thread_id } => Ok((route.name.clone(), chat_id, Some(thread_id))),
        RouteTarget::Chat { chat_id } => Ok((route.name.clone(), chat_id, None)),
        RouteTarget::Default => Err(err(format!(
            "route '{name}' is the default route: prompts with buttons need a route with a chat_id"
        ))),
    }
}

/// A list of Telegram user ids who may answer: someone must be able to.
fn user_ids(path: &Path, key: &str, ids: Vec<i64>, who: &str) -> Result<Vec<i64>, ConfigError> {
    if ids.is_empty() {
        return Err(ConfigError::new(
            path,
            key,
            format!(
                "is empty: list the Telegram user ids allowed to answer (without {who} nobody could, so leave the \
                 whole table out instead)"
            ),
        ));
    }
    if let Some(bad) = ids.iter().find(|&&id| id <= 0) {
        return Err(ConfigError::new(path, key, format!("{bad} is not a Telegram user id")));
    }
    Ok(ids)
}

fn cascade_limit(path: &Path, key: &str, limit: u32) -> Result<NonZeroU32, ConfigError> {
    NonZeroU32::new(limit).ok_or_else(|| {
        ConfigError::new(
            path,
            key,
            "must be at least 1: it is how many agent turns one human message may use",
        )
    })
}

fn speaker_timeout(path: &Path, key: &str, secs: u64) -> Result<Duration, ConfigError> {
    if secs == 0 {
        return Err(ConfigError::new(
            path,
            key,
            "must be at least 1 (seconds a speaker has to reply or ack)",
        ));
    }
    Ok(Duration::from_secs(secs))
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

fn validate_webhook(path: &Path, raw: RawWebhook) -> Result<WebhookSettings, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    let key = "telegram.webhook.public_url";
    let public_url = reqwest::Url::parse(&raw.public_url)
        .map_err(|e| err(key, format!("'{}' is not a URL: {e}", raw.public_url)))?;
    if public_url.scheme() != "https" || public_url.host().is_none() {
        return Err(err(
            key,
            format!(
                "'{public_url}' must be an https URL with a host: Telegram calls webhooks over TLS only \
                 (your load balancer or reverse proxy terminates it)"
            ),
        ));
    }
    if public_url.path() == "/" {
        return Err(err(
            key,
            format!(
                "'{public_url}' has no path: give the one Telegram should call, e.g. \
                 https://bot.example.org/telegram/webhook, which the daemon serves on telegram.webhook.listen"
            ),
        ));
    }
    let listen = raw.listen.parse().map_err(|_| {
        err("telegram.webhook.listen", format!("'{}' is not an address like 0.0.0.0:8443", raw.listen))
    })?;
    check_env_name(path, "telegram.webhook.secret_env", &raw.secret_env)?;
    Ok(WebhookSettings { public_url, listen, secret_env: raw.secret_env })
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

/// Turns the `config` crate's error into ours, with the key the crate's deserializer
/// names (it wraps a problem found under a key in `At`), or the line and column of a
/// syntax error from the toml parser's own error, which the crate keeps as its cause
/// (`config` parses with the same `toml` as this crate).
fn config_crate_error(path: &Path, text: &str, e: config::ConfigError) -> ConfigError {
    match e {
        config::ConfigError::FileParse { cause, .. } => match cause.downcast_ref::<toml::de::Error>() {
            Some(syntax) => ConfigError::new(path, "(syntax)", toml_error_message(text, syntax)),
            None => ConfigError::new(path, "(syntax)", cause.to_string()),
        },
        config::ConfigError::Type { key: Some(key), unexpected, expected, .. } => {
            ConfigError::new(path, key, format!("expected {expected}, found {unexpected}"))
        }
        config::ConfigError::At { error, key: Some(key), .. } => match *error {
            // A problem of a value further down keeps the longer key.
            inner @ (config::ConfigError::At { key: Some(_), .. }
            | config::ConfigError::Type { key: Some(_), .. }) => config_crate_error(path, text, inner),
            inner => ConfigError::new(path, key, inner.to_string()),
        },
        config::ConfigError::NotFound(key) => ConfigError::new(path, key, "is missing".to_owned()),
        other => ConfigError::new(path, "(file)", other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_override_is_named_like_every_override() {
        assert_eq!(API_LISTEN_ENV, format!("{ENV_PREFIX}{ENV_SEPARATOR}API{ENV_SEPARATOR}LISTEN"));
    }
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
        assert_eq!(settings.routes.routes().len(), 4);
        assert_eq!(settings.rooms.len(), 1);
    }

    fn problem(text: &str) -> ConfigError {
        load_str(text).expect_err("configuration should be refused")
    }

    #[test]
    fn typing_is_on_for_two_minutes_by_default_and_the_ack_reaction_must_be_telegrams() {
        let outbound = load_str(MINIMAL).unwrap().outbound;
        assert_eq!((outbound.typing, outbound.ack_reaction), (Some(Duration::from_secs(120)), None));
        let with = |outbound: &str| format!("[outbound]\n{outbound}\n{MINIMAL}");
        let set = load_str(&with("typing_max_secs = 30\nack_reaction = \"👀\"")).unwrap().outbound;
        assert_eq!((set.typing, set.ack_reaction), (Some(Duration::from_secs(30)), Some("👀")));
        assert_eq!(load_str(&with("typing = false")).unwrap().outbound.typing, None);
        let e = problem(&with("ack_reaction = \"🦀\""));
        assert!(e.key == "outbound.ack_reaction" && e.to_string().contains("👍"), "{e}");
        assert_eq!(problem(&with("typing_max_secs = 0")).key, "outbound.typing_max_secs");
    }

    #[test]
    fn retention_is_off_by_default_hourly_when_set_and_at_least_a_day() {
        assert_eq!(load_str(MINIMAL).unwrap().storage.retain, None);
        let with = |storage: &str| format!("[storage]\n{storage}\n{MINIMAL}");
        let retain = load_str(&with("retain_days = 90")).unwrap().storage.retain;
        assert_eq!(retain, Some(Retention { days: 90, every: Duration::from_secs(3600) }));
        let e = problem(&with("retain_days = 0"));
        assert_eq!(e.key, "storage.retain_days");
        assert!(e.problem.contains("at least 1"), "{e}");
        assert!(load_str(&with("retain_days = -3")).is_err());
        let quick = load_str(&with("retain_days = 1\nretention_interval_secs = 1")).unwrap().storage.retain;
        assert_eq!(quick.map(|r| r.every), Some(Duration::from_secs(1)));
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

    const ROOM: &str = r#"
[telegram]
token_env = "SB_TEST_TOKEN"

[agents.builder]
token_env = "SB_TEST_BUILDER"
display_name = "Builder"
aliases = ["bob", "@bobby"]

[agents.reviewer]
token_env = "SB_TEST_REVIEWER"

[[routes]]
name = "dev-room"
chat_id = -1001
agents = ["builder", "reviewer"]
"#;

    #[test]
    fn a_room_route_takes_its_agents_in_order_and_the_room_defaults() {
        let settings = load_str(ROOM).unwrap();
        let route = &settings.routes.routes()[0];
        assert!(route.is_room());
        assert_eq!(route.agent(), None);
        let room = &settings.rooms[&route.name];
        let names: Vec<&str> = room.roster.members().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["builder", "reviewer"]);
        assert_eq!((room.chat_id, room.thread_id), (-1001, None));
        assert_eq!(room.roster.first().display_name(), "Builder");
        assert_eq!(room.roster.members()[0].aliases, ["bob", "bobby"], "a leading @ is forgiven");
        assert_eq!(room.roster.members()[1].display_name(), "reviewer");
        assert_eq!(room.limits, RoomLimits::default());
        assert_eq!(room.limits.cascade_limit.get(), 10);
        assert_eq!(room.limits.max_iters, 50);
        assert_eq!(room.limits.speaker_timeout, Duration::from_secs(600));
    }

    #[test]
    fn a_room_route_may_override_the_room_defaults() {
        let text = ROOM.replace(
            "[[routes]]",
            "[rooms]\ncascade_limit = 4\ngroup_max_iters = 30\nspeaker_timeout_secs = 120\n\n[[routes]]",
        ) + "cascade_limit = 2\nspeaker_timeout_secs = 5\n";
        let settings = load_str(&text).unwrap();
        assert_eq!(settings.room_defaults.cascade_limit.get(), 4);
        let room = settings.rooms.values().next().unwrap();
        assert_eq!(room.limits.cascade_limit.get(), 2);
        assert_eq!(room.limits.max_iters, 30, "from [rooms]");
        assert_eq!(room.limits.speaker_timeout, Duration::from_secs(5));
        for (configured, told) in [("0", 50), ("-3", 50), ("7", 7)] {
            let text = ROOM.replace("agents = [", &format!("group_max_iters = {configured}\nagents = ["));
            assert_eq!(load_str(&text).unwrap().rooms.values().next().unwrap().limits.max_iters, told);
        }
    }

    #[test]
    fn room_configuration_errors_name_the_key() {
        let cases = [
            (ROOM.replace("agents = [", "agent = \"builder\"\nagents = ["), "routes[0].agents", "both"),
            (ROOM.replace("[\"builder\", \"reviewer\"]", "[]"), "routes[0].agents", "at least one agent"),
            (ROOM.replace("\"reviewer\"]", "\"builder\"]"), "routes[0].agents", "listed twice"),
            (ROOM.replace("\"reviewer\"]", "\"ghost\"]"), "routes[0].agents", "unknown agent 'ghost'"),
            (ROOM.replace("\"bob\"", "\"reviewer\""), "routes[0].agents", "name of agent 'reviewer'"),
            (
                ROOM.replace("display_name = \"Builder\"", "display_name = \"Reviewer\""),
                "routes[0].agents",
                "same room",
            ),
            (ROOM.replace("\"bob\"", "\"bob smith\""), "agents.builder.aliases", "cannot be mentioned"),
            (
                ROOM.replace("display_name = \"Builder\"", "display_name = \" \""),
                "agents.builder.display_name",
                "empty",
            ),
            (ROOM.replace("chat_id = -1001\n", ""), "routes[0].chat_id", "needs a chat_id"),
            (
                ROOM.replace("agents = [", "cascade_limit = 0\nagents = ["),
                "routes[0].cascade_limit",
                "at least 1",
            ),
            (
                ROOM.replace("agents = [", "speaker_timeout_secs = 0\nagents = ["),
                "routes[0].speaker_timeout_secs",
                "at least 1",
            ),
            (
                ROOM.replace("[[routes]]", "[rooms]\ncascade_limit = 0\n[[routes]]"),
                "rooms.cascade_limit",
                "at least 1",
            ),
            (
                ROOM.replace(
                    "agents = [\"builder\", \"reviewer\"]",
                    "agent = \"builder\"\ncascade_limit = 3",
                ),
                "routes[0].cascade_limit",
                "not a room",
            ),
            (ROOM.replace("agents = [\"builder\", \"reviewer\"]", ""), "routes[0].agent", "names no agent"),
        ];
        for (text, key, says) in cases {
            let e = problem(&text);
            assert_eq!(e.key, key, "{e}");
            assert!(e.problem.contains(says), "{says:?} not in: {e}");
        }
    }

    fn with_webhook(webhook: &str) -> String {
        MINIMAL.replace(
            "token_env = \"SB_TEST_TOKEN\"",
            &format!("token_env = \"SB_TEST_TOKEN\"\nwebhook = {webhook}"),
        )
    }

    #[test]
    fn a_webhook_takes_an_https_url_with_a_path_and_a_listen_address() {
        assert!(load_str(MINIMAL).unwrap().telegram.webhook.is_none(), "absent: polling");
        let settings = load_str(&with_webhook(
            r#"{ public_url = "https://bot.example.org/telegram/hook", listen = "0.0.0.0:8443" }"#,
        ))
        .unwrap();
        let webhook = settings.telegram.webhook.unwrap();
        assert_eq!(webhook.path(), "/telegram/hook");
        assert_eq!(webhook.listen.to_string(), "0.0.0.0:8443");
        assert_eq!(webhook.secret_env, "SWITCHBOARD_WEBHOOK_SECRET");
    }

    #[test]
    fn a_bad_webhook_names_its_key() {
        let cases = [
            (
                r#"{ public_url = "http://bot.example.org/hook", listen = "0.0.0.0:8443" }"#,
                "telegram.webhook.public_url",
            ),
            (
                r#"{ public_url = "https://bot.example.org/", listen = "0.0.0.0:8443" }"#,
                "telegram.webhook.public_url",
            ),
            (r#"{ public_url = "not a url", listen = "0.0.0.0:8443" }"#, "telegram.webhook.public_url"),
            (
                r#"{ public_url = "https://bot.example.org/hook", listen = "8443" }"#,
                "telegram.webhook.listen",
            ),
            (
                r#"{ public_url = "https://bot.example.org/hook", listen = "0.0.0.0:8443", secret_env = "no-such name" }"#,
                "telegram.webhook.secret_env",
            ),
        ];
        for (webhook, key) in cases {
            assert_eq!(problem(&with_webhook(webhook)).key, key, "{webhook}");
        }
        let e = problem(&with_webhook(r#"{ public_url = "https://bot.example.org/hook" }"#));
        assert!(e.key.starts_with("telegram.webhook"), "{e}");
    }

    #[test]
    fn a_webhook_secret_must_be_one_telegram_accepts_and_set() {
        assert!(is_webhook_secret("abc_DEF-123"));
        assert!(is_webhook_secret(&"x".repeat(256)));
        for refused in ["", "has space", "slash/", "é", &"x".repeat(257)] {
            assert!(!is_webhook_secret(refused), "{refused:?}");
        }
        let unset = with_webhook(
            r#"{ public_url = "https://b.example/h", listen = "0.0.0.0:8443", secret_env = "SB_TEST_SURELY_UNSET" }"#,
        );
        let settings = load_str(&unset).unwrap();
        let e = settings.webhook_secret(settings.telegram.webhook.as_ref().unwrap()).unwrap_err();
        assert_eq!(e.key, "telegram.webhook.secret_env");
        assert!(e.problem.contains("SB_TEST_SURELY_UNSET is not set"), "{e}");
        // HOME holds a path: its slashes are not allowed.
        let home = with_webhook(
            r#"{ public_url = "https://b.example/h", listen = "0.0.0.0:8443", secret_env = "HOME" }"#,
        );
        let settings = load_str(&home).unwrap();
        let e = settings.webhook_secret(settings.telegram.webhook.as_ref().unwrap()).unwrap_err();
        assert!(e.problem.contains("not a secret Telegram accepts"), "{e}");
        assert!(!e.problem.contains(&std::env::var("HOME").unwrap()), "the value is never shown: {e}");
    }

    #[test]
    fn missing_secret_names_the_variable() {
        let settings = load_str(&MINIMAL.replace("SB_TEST_TOKEN", "SB_TEST_SURELY_UNSET")).unwrap();
        let e = settings.daemon_secrets().unwrap_err();
        assert_eq!(e.key, "telegram.token_env");
        assert!(e.problem.contains("SB_TEST_SURELY_UNSET is not set"), "{e}");
    }

    #[test]
    fn a_permission_relay_takes_its_route_chat_and_defaults_its_timeout() {
        let text = MINIMAL.replace(
            "[[routes]]",
            "[agents.orchestrator.permissions]\nroute = \"dm\"\napprovers = [7]\n\n[[routes]]",
        );
        let settings = load_str(&text).unwrap();
        let relay = settings.agents.values().next().unwrap().permissions.clone().unwrap();
        assert_eq!((relay.route.as_str(), relay.chat_id, relay.thread_id), ("dm", 42, None));
        assert_eq!(relay.approvers, [7]);
        assert_eq!(relay.timeout, Duration::from_secs(DEFAULT_PERMISSION_TIMEOUT_SECS));
        assert!(load_str(MINIMAL).unwrap().agents.values().all(|agent| agent.permissions.is_none()));
    }

    #[test]
    fn a_bad_permission_relay_names_its_key() {
        let relay = |body: &str| {
            MINIMAL.replace("[[routes]]", &format!("[agents.orchestrator.permissions]\n{body}\n\n[[routes]]"))
        };
        let cases = [
            (
                relay("route = \"nowhere\"\napprovers = [7]"),
                "agents.orchestrator.permissions.route",
                "nowhere",
            ),
            (relay("route = \"dm\"\napprovers = []"), "agents.orchestrator.permissions.approvers", "empty"),
            (relay("route = \"dm\""), "agents.orchestrator.permissions.approvers", "empty"),
            (
                relay("route = \"dm\"\napprovers = [7]\ntimeout_secs = 0"),
                "agents.orchestrator.permissions.timeout_secs",
                "at least 1",
            ),
            (
                relay("route = \"dm\"\napprovers = [7]\ntimeout_secs = 99999999"),
                "agents.orchestrator.permissions.timeout_secs",
                "at most",
            ),
        ];
        for (text, key, says) in cases {
            let e = problem(&text);
            assert_eq!(e.key, key, "{e}");
            assert!(e.problem.contains(says), "{says:?} not in: {e}");
        }
    }

    #[test]
    fn the_operator_table_names_a_chat_route_and_someone_to_answer() {
        let with = |body: &str| format!("{MINIMAL}\n[operator]\n{body}\n");
        let settings = load_str(&with("route = \"dm\"\noperators = [9]")).unwrap();
        let operator = settings.operator.unwrap();
        assert_eq!((operator.route.as_str(), operator.chat_id, operator.operators), ("dm", 42, vec![9]));
        assert!(load_str(MINIMAL).unwrap().operator.is_none());
        for (body, key, says) in [
            ("route = \"dm\"", "operator.operators", "empty"),
            ("route = \"elsewhere\"\noperators = [9]", "operator.route", "elsewhere"),
        ] {
            let e = problem(&with(body));
            assert_eq!(e.key, key, "{e}");
            assert!(e.problem.contains(says), "{says:?} not in: {e}");
        }
    }
}
