//! The typed settings that loading and validation produce: what the rest of the daemon reads.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::ids::{AgentName, RouteName};
use crate::rules::leadership::Lease;
use crate::rules::pacing::PaceLimits;
use crate::rules::routes::RoutesTable;
use crate::rules::turns::{self, RoomRoster};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(try_from = "String")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl TryFrom<String> for LogFormat {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        one_of(&[("text", Self::Text), ("json", Self::Json)], &value)
    }
}

/// The value `found` names among `words`, or a refusal that names them all.
fn one_of<T: Copy>(words: &[(&str, T)], found: &str) -> Result<T, String> {
    words.iter().find(|(word, _)| *word == found).map(|(_, value)| *value).ok_or_else(|| {
        let words: Vec<String> = words.iter().map(|(word, _)| format!("\"{word}\"")).collect();
        format!("expected {}, found \"{found}\"", words.join(" or "))
    })
}

/// SQLite's `synchronous` setting. With WAL, `normal` never loses a committed transaction
/// when the process dies (`kill -9`); `full` also survives power loss, at an fsync per
/// commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(try_from = "String")]
pub enum Synchronous {
    #[default]
    Normal,
    Full,
}

impl TryFrom<String> for Synchronous {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        one_of(&[("normal", Self::Normal), ("full", Self::Full)], &value)
    }
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
    /// How often the leader asks Telegram (`getWebhookInfo`) whether the webhook is still
    /// this one and the token still accepted (`telegram.webhook.check_secs`).
    pub check_every: std::time::Duration,
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
            "{{ public_url = {}, listen = {}, secret_env = {}, check_secs = {} }}",
            self.public_url,
            self.listen,
            self.secret_env,
            self.check_every.as_secs()
        )
    }
}

/// Telegram's rule for a webhook's `secret_token`: 1-256 characters, each `A-Z`, `a-z`,
/// `0-9`, `_` or `-`.
pub(super) const MAX_WEBHOOK_SECRET_LEN: usize = 256;

pub(super) fn is_webhook_secret(secret: &str) -> bool {
    (1..=MAX_WEBHOOK_SECRET_LEN).contains(&secret.len())
        && secret.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[derive(Debug, Clone)]
pub struct StorageSettings {
    pub database: Database,
    pub synchronous: Synchronous,
    /// The daemon prunes what finished longer ago than this, on a schedule (`None`: keeps
    /// everything, the default).
    pub retain: Option<Retention>,
    /// Where replies' files are staged (`[storage] uploads_dir`); `None`: the default,
    /// which [`Staging::dir_for`](crate::agents::bridge::Staging::dir_for) chooses.
    pub uploads_dir: Option<PathBuf>,
}

/// `[storage] database`: which backend keeps the ledger, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// An embedded SQLite file (the default, `switchboard.db`), which one daemon holds.
    Sqlite(PathBuf),
    /// A PostgreSQL database that several replicas share (DESIGN.md §16).
    Postgres(PostgresLedger),
}

/// Where a replicated ledger lives, and who this replica is.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresLedger {
    /// `postgres://…` as written, password and all: shown only through [`Database`]'s
    /// `Display`, which hides the password.
    pub url: String,
    /// This replica's name in the lease (`[storage] replica`; the host's name and the
    /// process id unless set), for the operator reading who leads.
    pub replica: String,
    /// `[storage] lease_secs`: how long a leader goes on without a renewal, so about how
    /// long a standby waits before it takes over from a leader that stopped.
    pub lease: Lease,
}

/// Without the URL, whose password a log line must not carry.
impl fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("url", &redact_password(&self.url))
            .field("replica", &self.replica)
            .field("lease", &self.lease)
            .finish()
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => path.display().fmt(f),
            Self::Postgres(postgres) => f.write_str(&redact_password(&postgres.url)),
        }
    }
}

/// `postgres://user:secret@host/db` as `postgres://user:***@host/db`, and a `password=`
/// in the query (which the driver takes too) as `password=***`; a URL it cannot read is
/// hidden whole rather than risk showing a password.
fn redact_password(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        return "postgres://(a URL that cannot be read)".into();
    };
    if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
        return "postgres://(a URL that cannot be shown)".into();
    }
    if parsed.query_pairs().any(|(key, _)| key.eq_ignore_ascii_case("password")) {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let value =
                    if key.eq_ignore_ascii_case("password") { "***".into() } else { value.into_owned() };
                (key.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// The password a `postgres://` URL carries (after `user:`, or as `password=` in its
/// query), for the log filter to hide wherever it would show.
pub fn postgres_password(url: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let in_query = parsed.query_pairs().find(|(key, _)| key.eq_ignore_ascii_case("password"));
    let password = match in_query {
        Some((_, value)) => value.into_owned(),
        None => percent_encoding::percent_decode_str(parsed.password()?).decode_utf8_lossy().into_owned(),
    };
    (!password.is_empty()).then_some(password)
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
pub(super) const DEFAULT_RETENTION_INTERVAL_SECS: u64 = 3600;

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub listen: SocketAddr,
    /// `api.tls`: the daemon serves its local API over TLS with this certificate.
    pub tls: Option<ApiTls>,
    /// `api.plaintext_beyond_loopback`: the operator's word that a network path without
    /// TLS is private (a container's bridge, a VPN), so `listen` may leave loopback.
    pub plaintext_beyond_loopback: bool,
    /// `api.daemon` (or the plugin's `--daemon`): where a plugin reaches the daemon, tried
    /// in turn; by default, `listen` itself.
    pub daemon: Vec<DaemonUrl>,
    /// `api.ca`: certificates (PEM) a plugin trusts for the daemon's, beside the system's.
    pub ca: Option<PathBuf>,
    /// `api.health_listen`: this process's own address for `/healthz`, `/readyz` and
    /// `/metrics`, served whether it leads or stands by (`operate::health_listener`).
    pub health_listen: Option<SocketAddr>,
    /// `api.client_cert` and `api.client_key`: what a plugin (or `healthcheck`) shows a
    /// daemon whose `api.tls.client_ca` asks for a client certificate.
    pub client_identity: Option<ClientIdentity>,
    /// `api.session_heartbeat_secs`: how often an idle session stream of a single daemon
    /// carries a heartbeat; a plugin gives up on a stream after three missed ones.
    pub session_heartbeat: std::time::Duration,
}

/// A client certificate chain and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ApiSettings {
    /// Where a plugin with these settings reaches the daemon, in the order it tries them.
    pub fn daemon_urls(&self) -> Vec<DaemonUrl> {
        if self.daemon.is_empty() { vec![self.own_url()] } else { self.daemon.clone() }
    }

    /// The daemon's own local API as asked on its machine (`listen`, over TLS with `tls`).
    pub fn own_url(&self) -> DaemonUrl {
        DaemonUrl::beside(self.listen, self.tls.is_some())
    }

    /// Where `switchboard healthcheck` asks on this machine: `health_listen` (plain HTTP,
    /// answered by a standby too) when it is set, else the local API.
    pub fn health_url(&self) -> DaemonUrl {
        match self.health_listen {
            Some(address) => DaemonUrl::beside(address, false),
            None => self.own_url(),
        }
    }
}

/// `api.tls`: the certificate chain and private key files (PEM) the daemon serves with,
/// and the CAs whose client certificates it requires, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `api.tls.client_ca`: every connection must show a certificate one of these signed.
    pub client_ca: Option<PathBuf>,
}

/// Where a plugin reaches a daemon: `http://` or `https://`, a host and a port, nothing
/// more. Plain `http://` only to loopback, unless `api.plaintext_beyond_loopback`. Held as
/// its origin (`scheme://host:port`), which every call's URL begins with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonUrl(String);

impl DaemonUrl {
    /// Parses one address a plugin is given; the problem, for the key that gave it.
    pub fn parse(text: &str, plaintext_allowed: bool) -> Result<Self, String> {
        let url = reqwest::Url::parse(text)
            .map_err(|e| format!("'{text}' is not a URL like https://switchboard.internal:7797 ({e})"))?;
        let tls = match url.scheme() {
            "https" => true,
            "http" => false,
            other => return Err(format!("'{text}': the scheme is {other}; give http:// or https://")),
        };
        if url.host().is_none() || url.port_or_known_default().is_none() {
            return Err(format!("'{text}' names no host"));
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() || !url.username().is_empty() {
            return Err(format!(
                "'{text}' has more than a scheme, a host and a port: the daemon's routes are its own"
            ));
        }
        if !tls && !plaintext_allowed && !Self::is_loopback(&url) {
            return Err(format!(
                "'{text}' is plain http beyond loopback: the agent's secret would cross the network \
                 readable; give https:// (the daemon's api.tls), or set api.plaintext_beyond_loopback \
                 = true on a private network"
            ));
        }
        Ok(Self(url.origin().ascii_serialization()))
    }

    /// The address a plugin beside the daemon uses: `listen`, asked on loopback when it
    /// is a wildcard.
    pub fn beside(listen: SocketAddr, tls: bool) -> Self {
        let ask = match listen.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), listen.port())
            }
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), listen.port())
            }
            _ => listen,
        };
        let scheme = if tls { "https" } else { "http" };
        // Through the URL parser, so a default port is left out as in every other origin.
        let url = reqwest::Url::parse(&format!("{scheme}://{ask}")).expect("a socket address makes a URL");
        Self(url.origin().ascii_serialization())
    }

    pub fn is_tls(&self) -> bool {
        self.0.starts_with("https://")
    }

    /// `scheme://host:port`, without a trailing slash, for routes to follow.
    pub fn origin(&self) -> &str {
        &self.0
    }

    fn is_loopback(url: &reqwest::Url) -> bool {
        let host = url.host_str().unwrap_or_default();
        match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => host.eq_ignore_ascii_case("localhost"),
        }
    }
}

impl fmt::Display for DaemonUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
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
