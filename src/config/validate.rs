//! Validation: from the raw configuration to typed settings, with every error naming its key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ids::{AgentName, RouteName, Secret};
use crate::rules::leadership::{DEFAULT_LEASE, Lease};
use crate::rules::pacing::PaceLimits;
use crate::rules::retention::MAX_AGE_DAYS;
use crate::rules::routes::{Audience, Route, RouteTarget, RoutesError, RoutesTable};
use crate::rules::turns::{self, RoomMember, RoomRoster, RosterError};

use super::raw::*;
use super::settings::*;
use super::{ConfigError, MAX_POLL_TIMEOUT_SECS};

impl Settings {
    pub(super) fn validate(path: &Path, raw: RawSettings) -> Result<Self, ConfigError> {
        let err = |key: &str, problem: String| ConfigError::new(path, key, problem);

        let telegram = validate_telegram(path, raw.telegram)?;
        let api = validate_api(path, raw.api)?;
        let storage = validate_storage(path, raw.storage)?;
        let outbound = validate_outbound(path, raw.outbound)?;
        if raw.log.filter.trim().is_empty() {
            // An empty filter matches none of switchboard's own lines, errors included.
            return Err(err(
                "log.filter",
                "is empty: name a level, e.g. \"info\" (\"off\" logs nothing)".into(),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&raw.log.filter)
            .map_err(|e| err("log.filter", format!("'{}' is not a log filter: {e}", raw.log.filter)))?;

        let mut agents = BTreeMap::new();
        // Resolved once the routes are known: a relay names a route.
        let mut relays = Vec::new();
        for (name, mut agent) in raw.agents {
            let key = format!("agents.{name}");
            let parsed = AgentName::parse(&name).map_err(|e| err(&key, e))?;
            // Agents are named case-blind where a person or an agent writes a name (a
            // handoff's target, a room's mention), so two that differ only in case would
            // take each other's messages. An environment override's key is lowercased too.
            if let Some(same) =
                agents.keys().find(|known: &&AgentName| known.as_str().eq_ignore_ascii_case(&name))
            {
                return Err(err(
                    &key,
                    format!(
                        "differs from agents.{same} only in case; agents are told apart case-blind (an \
                         environment variable's override names its agent in lower case)"
                    ),
                ));
            }
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

        let handoffs = validate_handoffs(path, raw.handoffs, &routes)?;
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
            telegram,
            storage,
            api,
            log: LogSettings { format: raw.log.format, filter: raw.log.filter },
            outbound,
            handoffs,
            agents,
            routes,
            room_defaults,
            rooms,
            operator,
            media: MediaSettings { eager_photo_max_bytes: raw.media.eager_photo_max_bytes },
        })
    }
}

fn validate_telegram(path: &Path, raw: RawTelegram) -> Result<TelegramSettings, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    let api_url = reqwest::Url::parse(&raw.api_url)
        .map_err(|e| err("telegram.api_url", format!("'{}' is not a URL: {e}", raw.api_url)))?;
    if !matches!(api_url.scheme(), "http" | "https") || api_url.host().is_none() {
        return Err(err("telegram.api_url", format!("'{api_url}' must be an http or https URL with a host")));
    }
    if raw.poll_timeout_secs > MAX_POLL_TIMEOUT_SECS {
        return Err(err(
            "telegram.poll_timeout_secs",
            format!("{} is above Telegram's maximum of {MAX_POLL_TIMEOUT_SECS}", raw.poll_timeout_secs),
        ));
    }
    if raw.poll_timeout_secs == 0 {
        return Err(err(
            "telegram.poll_timeout_secs",
            "must be at least 1: a poll that does not wait is asked again at once, all the time".into(),
        ));
    }
    let send_timeout = seconds(path, "telegram.send_timeout_secs", raw.send_timeout_secs, 1)?;
    let unauthorized_exit = seconds(path, "telegram.unauthorized_exit_secs", raw.unauthorized_exit_secs, 0)?;
    check_env_name(path, "telegram.token_env", &raw.token_env)?;
    let webhook = raw.webhook.map(|raw| validate_webhook(path, raw)).transpose()?;
    Ok(TelegramSettings {
        token_env: raw.token_env,
        api_url,
        poll_timeout: Duration::from_secs(raw.poll_timeout_secs),
        send_timeout,
        allowed_users: raw.allowed_users,
        unauthorized_exit,
        webhook,
    })
}

fn validate_storage(path: &Path, raw: RawStorage) -> Result<StorageSettings, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    let database = validate_database(path, &raw)?;
    let retain = match raw.retain_days {
        // An interval alone would read as "pruning is on" while nothing is ever pruned.
        None if raw.retention_interval_secs.is_some() => {
            return Err(err(
                "storage.retention_interval_secs",
                "does nothing without storage.retain_days, which turns pruning on: set retain_days, or \
                 leave both out to keep everything"
                    .into(),
            ));
        }
        None => None,
        Some(0) => {
            return Err(err(
                "storage.retain_days",
                "must be at least 1 (leave it out to keep everything)".into(),
            ));
        }
        Some(days) if i64::from(days) > MAX_AGE_DAYS => {
            return Err(err(
                "storage.retain_days",
                format!(
                    "{days} is more than a century (at most {}); leave it out to keep everything",
                    MAX_AGE_DAYS
                ),
            ));
        }
        Some(days) => {
            let every = raw.retention_interval_secs.unwrap_or(DEFAULT_RETENTION_INTERVAL_SECS);
            let every = seconds(path, "storage.retention_interval_secs", every, 1)?;
            Some(Retention { days, every })
        }
    };
    let uploads_dir = match raw.uploads_dir {
        Some(dir) if dir.trim().is_empty() => {
            return Err(err("storage.uploads_dir", "is empty: give a folder, or leave it out".into()));
        }
        dir => dir.map(PathBuf::from),
    };
    Ok(StorageSettings { database, synchronous: raw.synchronous, retain, uploads_dir })
}

/// `[outbound]`'s pacing, at most.
const MAX_CHAT_INTERVAL_MS: u64 = 60_000;
const MAX_GLOBAL_PER_SEC: u32 = 1_000;

fn validate_outbound(path: &Path, raw: RawOutbound) -> Result<OutboundSettings, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    if raw.max_reply_parts == 0 {
        return Err(err("outbound.max_reply_parts", "must be at least 1".into()));
    }
    if raw.typing_max_secs == 0 {
        return Err(err(
            "outbound.typing_max_secs",
            "must be at least 1 (turn typing off with typing = false)".into(),
        ));
    }
    let typing_max = seconds(path, "outbound.typing_max_secs", raw.typing_max_secs, 1)?;
    // Past a minute apart, no reply of several parts could go out within a reply's wait;
    // past a thousand a second is beyond any budget Telegram sells. Bounded, the pacer's
    // arithmetic stays far from overflow.
    for (key, interval) in [
        ("outbound.private_chat_interval_ms", raw.private_chat_interval_ms),
        ("outbound.group_chat_interval_ms", raw.group_chat_interval_ms),
    ] {
        if interval > MAX_CHAT_INTERVAL_MS {
            return Err(err(
                key,
                format!("is {interval}: at most {MAX_CHAT_INTERVAL_MS} (a minute; 0 turns pacing off)"),
            ));
        }
    }
    if raw.global_per_sec > MAX_GLOBAL_PER_SEC {
        return Err(err(
            "outbound.global_per_sec",
            format!("is {}: at most {MAX_GLOBAL_PER_SEC} (0 turns overall pacing off)", raw.global_per_sec),
        ));
    }
    let ack_reaction = match raw.ack_reaction.as_deref() {
        None => None,
        Some(emoji) => Some(
            crate::telegram::reactions::allowed_reaction(emoji)
                .map_err(|why| err("outbound.ack_reaction", why.replace(". Nothing was sent", "")))?,
        ),
    };
    Ok(OutboundSettings {
        max_reply_parts: raw.max_reply_parts,
        pacing: PaceLimits {
            private: Duration::from_millis(raw.private_chat_interval_ms),
            group: Duration::from_millis(raw.group_chat_interval_ms),
            overall_per_sec: raw.global_per_sec,
        },
        typing: raw.typing.then_some(typing_max),
        ack_reaction,
    })
}

fn validate_handoffs(
    path: &Path,
    raw: RawHandoffs,
    routes: &RoutesTable,
) -> Result<HandoffSettings, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    if raw.max_depth == 0 {
        return Err(err("handoffs.max_depth", "must be at least 1".into()));
    }
    let audit_route = match raw.audit_route {
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
    Ok(HandoffSettings { max_depth: raw.max_depth, audit_route })
}

/// The id of a forum's General topic, which Telegram never gives as a message's topic.
const GENERAL_TOPIC: i32 = 1;

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
        (Some(_), Some(GENERAL_TOPIC)) => {
            return Err(err(
                "thread_id",
                format!(
                    "route '{name}': thread_id 1 is a forum's General topic, whose messages Telegram sends \
                     without a topic, so no message would ever match; route the chat itself (leave out \
                     thread_id) to take them"
                ),
            ));
        }
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
        Audience::Room(_) if raw.mention_only => {
            return Err(err(
                "mention_only",
                format!(
                    "route '{name}' is a room: its agents take the floor by @mention already, and every \
                     message of the room counts; mention_only is for a route with one `agent`"
                ),
            ));
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
    Ok((Route { name, target, audience, senders: raw.allowed_users, mention_only: raw.mention_only }, room))
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
    seconds(path, key, secs, 1)
}

/// The longest any setting in seconds may be: a year. Each is added to a clock somewhere,
/// and one near `u64::MAX` seconds overflows it (a panic, and a crash at every start if the
/// value is kept in the ledger), where nobody means more than a year.
const MAX_SETTING_SECS: u64 = 365 * 24 * 3600;

/// `secs` of the setting `key`, refused below `at_least` or above [`MAX_SETTING_SECS`].
fn seconds(path: &Path, key: &str, secs: u64, at_least: u64) -> Result<Duration, ConfigError> {
    if secs < at_least {
        return Err(ConfigError::new(path, key, format!("must be at least {at_least}")));
    }
    if secs > MAX_SETTING_SECS {
        return Err(ConfigError::new(
            path,
            key,
            format!("{secs} seconds is more than a year: at most {MAX_SETTING_SECS}"),
        ));
    }
    Ok(Duration::from_secs(secs))
}

/// Refuses two agents that share a secret, naming both agents' keys and never the value.
/// `agents` is (agent, the variable its `token_env` names, the secret read from it).
pub(super) fn check_distinct_secrets(
    path: &Path,
    agents: &[(&AgentName, &str, &Secret)],
) -> Result<(), ConfigError> {
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
    let check_every = seconds(path, "telegram.webhook.check_secs", raw.check_secs, 1)?;
    Ok(WebhookSettings { public_url, listen, secret_env: raw.secret_env, check_every })
}

fn validate_api(path: &Path, raw: RawApi) -> Result<ApiSettings, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    let listen: SocketAddr = raw
        .listen
        .parse()
        .map_err(|_| err("api.listen", format!("'{}' is not an address like 127.0.0.1:7797", raw.listen)))?;
    let tls = raw
        .tls
        .map(|tls| {
            let file = |key: &str, value: String| {
                if value.trim().is_empty() {
                    Err(err(key, "names no file: give the path of a PEM file".into()))
                } else {
                    Ok(PathBuf::from(value))
                }
            };
            Ok::<_, ConfigError>(ApiTls {
                cert: file("api.tls.cert", tls.cert)?,
                key: file("api.tls.key", tls.key)?,
                client_ca: tls.client_ca.map(|ca| file("api.tls.client_ca", ca)).transpose()?,
            })
        })
        .transpose()?;
    if tls.is_none() && !listen.ip().is_loopback() && !raw.plaintext_beyond_loopback {
        return Err(err(
            "api.listen",
            format!(
                "{listen} is not a loopback address, and the local API has no TLS: every request \
                 carries an agent's secret, readable by anyone on the network path. Configure \
                 api.tls = {{ cert = \"…\", key = \"…\" }}, or listen on 127.0.0.1, or (on a private \
                 network such as a container's bridge) set api.plaintext_beyond_loopback = true"
            ),
        ));
    }
    let daemon = raw
        .daemon
        .iter()
        .map(|text| {
            DaemonUrl::parse(text, raw.plaintext_beyond_loopback)
                .map_err(|problem| err("api.daemon", problem))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ca = match raw.ca {
        Some(ca) if ca.trim().is_empty() => {
            return Err(err("api.ca", "names no file: give the path of a PEM file".into()));
        }
        ca => ca.map(PathBuf::from),
    };
    let health_listen = raw
        .health_listen
        .map(|text| {
            let address: SocketAddr = text.parse().map_err(|_| {
                err("api.health_listen", format!("'{text}' is not an address like 127.0.0.1:7798"))
            })?;
            if binds_collide(address, listen) {
                return Err(err(
                    "api.health_listen",
                    format!(
                        "{address} takes api.listen's port ({listen}) too: give the health routes a port of \
                         their own (the local API serves them already)"
                    ),
                ));
            }
            Ok(address)
        })
        .transpose()?;
    let client_identity = match (raw.client_cert, raw.client_key) {
        (None, None) => None,
        (Some(cert), Some(key)) if !cert.trim().is_empty() && !key.trim().is_empty() => {
            Some(ClientIdentity { cert: PathBuf::from(cert), key: PathBuf::from(key) })
        }
        (cert, _) => {
            let missing = if cert.is_none_or(|cert| cert.trim().is_empty()) {
                "api.client_cert"
            } else {
                "api.client_key"
            };
            return Err(err(
                missing,
                "is missing or empty: a client certificate needs both api.client_cert and api.client_key \
                 (PEM files)"
                    .into(),
            ));
        }
    };
    let session_heartbeat = seconds(path, "api.session_heartbeat_secs", raw.session_heartbeat_secs, 1)?;
    Ok(ApiSettings {
        listen,
        tls,
        plaintext_beyond_loopback: raw.plaintext_beyond_loopback,
        daemon,
        ca,
        health_listen,
        client_identity,
        session_heartbeat,
    })
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

pub(super) fn read_secret(path: &Path, key: &str, var: &str) -> Result<Secret, ConfigError> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Ok(Secret::new(value.trim().to_owned())),
        Ok(_) => Err(ConfigError::new(path, key, format!("environment variable {var} is empty"))),
        Err(_) => Err(ConfigError::new(path, key, format!("environment variable {var} is not set"))),
    }
}

pub(super) fn join_names<T: fmt::Display>(names: impl Iterator<Item = T>) -> String {
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
pub(super) fn config_crate_error(path: &Path, text: &str, e: config::ConfigError) -> ConfigError {
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

/// `[storage] database`: a `postgres://` (or `postgresql://`) URL selects PostgreSQL, and
/// with it `replica` and `lease_secs`; anything else is the SQLite file's path.
fn validate_database(path: &Path, raw: &RawStorage) -> Result<Database, ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(path, key, problem);
    let is_postgres = ["postgres://", "postgresql://"].iter().any(|scheme| raw.database.starts_with(scheme));
    if !is_postgres {
        for (key, set) in
            [("storage.replica", raw.replica.is_some()), ("storage.lease_secs", raw.lease_secs.is_some())]
        {
            if set {
                return Err(err(
                    key,
                    "is for a PostgreSQL ledger only (storage.database is a SQLite file)".into(),
                ));
            }
        }
        if raw.database.is_empty() {
            return Err(err("storage.database", "is empty: give a file path or a postgres:// URL".into()));
        }
        return Ok(Database::Sqlite(raw.database.clone().into()));
    }
    if reqwest::Url::parse(&raw.database).map_or(true, |url| url.host().is_none()) {
        return Err(err(
            "storage.database",
            "is not a PostgreSQL URL like postgres://user@host:5432/database".into(),
        ));
    }
    let lease = match raw.lease_secs {
        None => Lease::new(DEFAULT_LEASE),
        Some(secs) => Lease::new(seconds(path, "storage.lease_secs", secs, 1)?),
    }
    .map_err(|short| err("storage.lease_secs", short.to_string()))?;
    let replica = match &raw.replica {
        Some(name) if name.trim().is_empty() => return Err(err("storage.replica", "is empty".into())),
        Some(name) => name.clone(),
        None => default_replica_name(),
    };
    Ok(Database::Postgres(PostgresLedger { url: raw.database.clone(), replica, lease }))
}

/// Whether two listening addresses would fight over one port: the same address, or the
/// same port where either is unspecified (0.0.0.0 or ::), which takes that port on every
/// address (:: on IPv4's as well, as Linux binds it by default). Port 0 takes a free port
/// each time, and never collides.
fn binds_collide(one: SocketAddr, other: SocketAddr) -> bool {
    let either_unspecified = one.ip().is_unspecified() || other.ip().is_unspecified();
    one.port() != 0 && one.port() == other.port() && (one.ip() == other.ip() || either_unspecified)
}

/// The host's name and the process id: unique among replicas on one machine, and still
/// saying where a lease's holder runs. The name comes from the system call, not
/// /proc/sys/kernel/hostname, which a sandbox may hide (systemd's `ProcSubset=pid`, as in
/// the shipped unit); "replica" only when the host has no name to give.
fn default_replica_name() -> String {
    replica_name(nix::unistd::gethostname().ok().and_then(|name| name.into_string().ok()), std::process::id())
}

/// [`default_replica_name`] from what the system said.
pub(super) fn replica_name(host: Option<String>, pid: u32) -> String {
    let host = host.map(|name| name.trim().to_owned()).filter(|name| !name.is_empty());
    format!("{}-{pid}", host.as_deref().unwrap_or("replica"))
}
