//! The configuration as written in the file, before validation: every key with its default,
//! and unknown keys denied.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::rules::turns::{self};

use super::settings::{DEFAULT_PERMISSION_TIMEOUT_SECS, LogFormat, Synchronous};

// ---- raw, as written in the file ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSettings {
    /// Every key has a default, and an agent machine's file (the plugin's) has no use
    /// for the table.
    #[serde(default)]
    pub(super) telegram: RawTelegram,
    #[serde(default)]
    pub(super) storage: RawStorage,
    #[serde(default)]
    pub(super) api: RawApi,
    #[serde(default)]
    pub(super) log: RawLog,
    #[serde(default)]
    pub(super) outbound: RawOutbound,
    #[serde(default)]
    pub(super) handoffs: RawHandoffs,
    #[serde(default)]
    pub(super) rooms: RawRooms,
    #[serde(default)]
    pub(super) agents: BTreeMap<String, RawAgent>,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    pub(super) operator: Option<RawOperator>,
    #[serde(default)]
    pub(super) media: RawMedia,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOperator {
    pub(super) route: String,
    #[serde(default)]
    pub(super) operators: Vec<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMedia {
    #[serde(default = "default_eager_photo_max_bytes")]
    pub(super) eager_photo_max_bytes: u64,
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
pub(super) struct RawTelegram {
    #[serde(default = "default_token_env")]
    pub(super) token_env: String,
    #[serde(default = "default_api_url")]
    pub(super) api_url: String,
    #[serde(default = "default_poll_timeout")]
    pub(super) poll_timeout_secs: u64,
    #[serde(default = "default_send_timeout")]
    pub(super) send_timeout_secs: u64,
    #[serde(default)]
    pub(super) allowed_users: Vec<i64>,
    #[serde(default = "default_unauthorized_exit")]
    pub(super) unauthorized_exit_secs: u64,
    #[serde(default)]
    pub(super) webhook: Option<RawWebhook>,
}

impl Default for RawTelegram {
    fn default() -> Self {
        Self {
            token_env: default_token_env(),
            api_url: default_api_url(),
            poll_timeout_secs: default_poll_timeout(),
            send_timeout_secs: default_send_timeout(),
            allowed_users: Vec::new(),
            unauthorized_exit_secs: default_unauthorized_exit(),
            webhook: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhook {
    pub(super) public_url: String,
    pub(super) listen: String,
    #[serde(default = "default_webhook_secret_env")]
    pub(super) secret_env: String,
    #[serde(default = "default_webhook_check_secs")]
    pub(super) check_secs: u64,
}

fn default_webhook_secret_env() -> String {
    "SWITCHBOARD_WEBHOOK_SECRET".into()
}

fn default_webhook_check_secs() -> u64 {
    60
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    /// A file path (SQLite), or a `postgres://` URL.
    #[serde(default = "default_database")]
    pub(super) database: String,
    #[serde(default)]
    pub(super) synchronous: Synchronous,
    /// PostgreSQL only: this replica's name in the lease, and how long a lease lasts.
    #[serde(default)]
    pub(super) replica: Option<String>,
    #[serde(default)]
    pub(super) lease_secs: Option<u64>,
    #[serde(default)]
    pub(super) retain_days: Option<u32>,
    /// For tests: how often to prune (docs do not offer it; an hour is right for a daemon).
    #[serde(default)]
    pub(super) retention_interval_secs: Option<u64>,
    /// Where replies' files are staged, over the default beside the ledger or the file.
    #[serde(default)]
    pub(super) uploads_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApi {
    #[serde(default = "default_listen")]
    pub(super) listen: String,
    #[serde(default)]
    pub(super) tls: Option<RawApiTls>,
    /// Beyond loopback without TLS: allowed only when the operator says so.
    #[serde(default)]
    pub(super) plaintext_beyond_loopback: bool,
    /// The plugin's side: where to reach the daemon.
    #[serde(default)]
    pub(super) daemon: Vec<String>,
    #[serde(default)]
    pub(super) ca: Option<String>,
    /// This process's own address for the operator's routes, in either role.
    #[serde(default)]
    pub(super) health_listen: Option<String>,
    /// The plugin's side: the certificate and key it shows a daemon that asks for one.
    #[serde(default)]
    pub(super) client_cert: Option<String>,
    #[serde(default)]
    pub(super) client_key: Option<String>,
    /// How often an idle session stream carries a heartbeat.
    #[serde(default = "default_session_heartbeat_secs")]
    pub(super) session_heartbeat_secs: u64,
}

fn default_session_heartbeat_secs() -> u64 {
    crate::agents::api::wire::HEARTBEAT_INTERVAL_SECS
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApiTls {
    pub(super) cert: String,
    pub(super) key: String,
    /// Client certificates required, signed by these CAs.
    #[serde(default)]
    pub(super) client_ca: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOutbound {
    #[serde(default = "default_max_reply_parts")]
    pub(super) max_reply_parts: usize,
    #[serde(default = "default_private_chat_interval_ms")]
    pub(super) private_chat_interval_ms: u64,
    #[serde(default = "default_group_chat_interval_ms")]
    pub(super) group_chat_interval_ms: u64,
    #[serde(default = "default_global_per_sec")]
    pub(super) global_per_sec: u32,
    #[serde(default = "default_typing")]
    pub(super) typing: bool,
    #[serde(default = "default_typing_max_secs")]
    pub(super) typing_max_secs: u64,
    #[serde(default)]
    pub(super) ack_reaction: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHandoffs {
    #[serde(default = "default_max_depth")]
    pub(super) max_depth: u32,
    pub(super) audit_route: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    #[serde(default)]
    pub(super) format: LogFormat,
    #[serde(default = "default_filter")]
    pub(super) filter: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRooms {
    #[serde(default = "default_cascade_limit")]
    pub(super) cascade_limit: u32,
    #[serde(default = "default_group_max_iters")]
    pub(super) group_max_iters: i64,
    #[serde(default = "default_speaker_timeout")]
    pub(super) speaker_timeout_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    pub(super) token_env: String,
    pub(super) display_name: Option<String>,
    #[serde(default)]
    pub(super) aliases: Vec<String>,
    pub(super) permissions: Option<RawPermissions>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPermissions {
    pub(super) route: String,
    #[serde(default)]
    pub(super) approvers: Vec<i64>,
    #[serde(default = "default_permission_timeout")]
    pub(super) timeout_secs: u64,
}

fn default_permission_timeout() -> u64 {
    DEFAULT_PERMISSION_TIMEOUT_SECS
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) name: Option<String>,
    pub(super) chat_id: Option<i64>,
    pub(super) thread_id: Option<i32>,
    pub(super) agent: Option<String>,
    /// A room: several agents, in room order.
    pub(super) agents: Option<Vec<String>>,
    /// Who may speak in this route's chat, over `telegram.allowed_users`.
    pub(super) allowed_users: Option<Vec<i64>>,
    /// Only messages addressed to the bot reach the route's agent.
    #[serde(default)]
    pub(super) mention_only: bool,
    /// A room's own limits, over `[rooms]`.
    pub(super) cascade_limit: Option<u32>,
    pub(super) group_max_iters: Option<i64>,
    pub(super) speaker_timeout_secs: Option<u64>,
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
fn default_database() -> String {
    "switchboard.db".into()
}
pub(super) fn default_listen() -> String {
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
            replica: None,
            lease_secs: None,
            retain_days: None,
            retention_interval_secs: None,
            uploads_dir: None,
        }
    }
}
impl Default for RawApi {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            tls: None,
            plaintext_beyond_loopback: false,
            daemon: Vec::new(),
            ca: None,
            health_listen: None,
            client_cert: None,
            client_key: None,
            session_heartbeat_secs: default_session_heartbeat_secs(),
        }
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
