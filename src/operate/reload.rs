//! SIGHUP re-reads the configuration file (DESIGN.md §12).
//!
//! A file that loads, validates and passes `switchboard check`'s other checks (its secret
//! variables set in the daemon's environment, distinct and well formed; `api.tls`'s files
//! servable) replaces, in one step under the reload lock, what the running daemon can
//! change in place: the routes and the allowlist (the poller routes each batch with one
//! snapshot of both), the reply and handoff limits, and the pacing of sends. Everything is
//! logged with what changed. A file that fails any of it is logged with the usual one-line
//! error and changes nothing: applied, it would be what the next restart refuses.
//!
//! The local API's certificate (`api.tls`) is read again from the same files at every
//! SIGHUP, whatever the configuration file holds: renewing a certificate is a reload, not a
//! restart (see `agents::api::tls`).
//!
//! Some settings are fixed for the life of the process: the bot token, Telegram's URL and
//! timeouts, the ledger, the local API's address, the log setup, and the agents (each has a
//! session slot and a secret read from the environment at start). A change to any of them
//! is logged as needing a restart and the running value stays. A route that names an agent
//! the daemon was not started with refuses the whole reload: its messages would queue for
//! an agent that cannot connect.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agents::api::tls::{Reread, ServedCertificate};
use crate::agents::bridge::{Bridge, HandoffRules, ReplyLimits};
use crate::app::StartUpRefusal;
use crate::config::{Database, OutboundSettings, RoomLimits, Settings};
use crate::ids::AgentName;
use crate::operate::metrics;
use crate::rules::routes::{Route, RouteTarget};
use crate::telegram::intake::Routing;
use crate::telegram::outbound::Outbound;

/// What a new file changes, sorted by whether the running daemon can apply it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadPlan {
    /// Applied now, one line each.
    pub changes: Vec<String>,
    /// Kept at the running value until a restart, one line each.
    pub needs_restart: Vec<String>,
}

/// Compares the running settings with a new file's. Refuses (with the reason) a file whose
/// routes name an agent the daemon is not running.
pub fn plan(running: &Settings, new: &Settings) -> Result<ReloadPlan, String> {
    for (index, route) in new.routes.routes().iter().enumerate() {
        if let Some(agent) = route.agents().iter().find(|agent| !running.agents.contains_key(*agent)) {
            return Err(format!(
                "routes[{index}] ('{}') names agent '{agent}', which this daemon was not started with: adding an \
                 agent needs a restart",
                route.name
            ));
        }
    }
    let mut plan = ReloadPlan::default();
    applied_now(running, new, &mut plan.changes);
    kept_until_restart(running, new, &mut plan.needs_restart);
    plan.needs_restart.extend(agent_changes(running, new));
    Ok(plan)
}

/// What the running daemon takes from the new file at once: the routes, the allowlist,
/// the outbound limits and pacing, the handoff rules.
fn applied_now(running: &Settings, new: &Settings, changes: &mut Vec<String>) {
    route_changes(running.routes.routes(), new.routes.routes(), changes);
    let mut applied = |key: &str, old: &dyn Display, new: &dyn Display| {
        if old.to_string() != new.to_string() {
            changes.push(format!("{key}: {old} → {new}"));
        }
    };
    applied(
        "telegram.allowed_users",
        &users(&running.telegram.allowed_users),
        &users(&new.telegram.allowed_users),
    );
    applied("outbound.max_reply_parts", &running.outbound.max_reply_parts, &new.outbound.max_reply_parts);
    applied(
        "outbound.ack_reaction",
        &running.outbound.ack_reaction.unwrap_or("none"),
        &new.outbound.ack_reaction.unwrap_or("none"),
    );
    applied(
        "outbound.private_chat_interval_ms",
        &running.outbound.pacing.private.as_millis(),
        &new.outbound.pacing.private.as_millis(),
    );
    applied(
        "outbound.group_chat_interval_ms",
        &running.outbound.pacing.group.as_millis(),
        &new.outbound.pacing.group.as_millis(),
    );
    applied(
        "outbound.global_per_sec",
        &running.outbound.pacing.overall_per_sec,
        &new.outbound.pacing.overall_per_sec,
    );
    applied("handoffs.max_depth", &running.handoffs.max_depth, &new.handoffs.max_depth);
    applied(
        "handoffs.audit_route",
        &optional(&running.handoffs.audit_route),
        &optional(&new.handoffs.audit_route),
    );
    // A room route's limits (its own keys over `[rooms]`) and its members' names and
    // aliases come with it: the room driver reads them anew.
    for (route, room) in &new.rooms {
        let Some(before) = running.rooms.get(route) else { continue };
        if before.limits != room.limits {
            changes.push(format!(
                "room '{route}' limits: {} → {}",
                room_limits(&before.limits),
                room_limits(&room.limits)
            ));
        }
        if before.roster != room.roster {
            changes.push(format!("room '{route}': its members' names or aliases changed"));
        }
    }
}

fn room_limits(limits: &RoomLimits) -> String {
    format!(
        "cascade_limit {}, group_max_iters {}, speaker_timeout_secs {}",
        limits.cascade_limit,
        limits.max_iters,
        limits.speaker_timeout.as_secs()
    )
}

/// What is set up once, as the daemon starts (its connections, listeners, ledger and
/// logging), and stays as it is until a restart.
fn kept_until_restart(running: &Settings, new: &Settings, needs_restart: &mut Vec<String>) {
    let mut fixed = |key: &str, old: &dyn Display, new: &dyn Display| {
        if old.to_string() != new.to_string() {
            needs_restart.push(format!("{key}: {old} → {new} needs a restart; {old} stays in effect"));
        }
    };
    let (old, new_t) = (&running.telegram, &new.telegram);
    fixed("telegram.token_env", &old.token_env, &new_t.token_env);
    fixed("telegram.api_url", &old.api_url, &new_t.api_url);
    fixed("telegram.poll_timeout_secs", &old.poll_timeout.as_secs(), &new_t.poll_timeout.as_secs());
    fixed("telegram.send_timeout_secs", &old.send_timeout.as_secs(), &new_t.send_timeout.as_secs());
    fixed(
        "telegram.unauthorized_exit_secs",
        &old.unauthorized_exit.as_secs(),
        &new_t.unauthorized_exit.as_secs(),
    );
    // The listener is bound and `setWebhook` called at start-up, and the intake mode with them.
    let webhook =
        |settings: &Settings| settings.telegram.webhook.as_ref().map_or("none".to_owned(), |w| w.to_string());
    fixed("telegram.webhook", &webhook(running), &webhook(new));
    fixed("storage.database", &running.storage.database, &new.storage.database);
    // The candidacy is made once, at start-up (see `app::hold`).
    let replica = |settings: &Settings| match &settings.storage.database {
        Database::Postgres(postgres) => {
            (postgres.replica.clone(), postgres.lease.duration().as_secs().to_string())
        }
        Database::Sqlite(_) => ("none".to_owned(), "none".to_owned()),
    };
    let ((old_replica, old_lease), (new_replica, new_lease)) = (replica(running), replica(new));
    fixed("storage.replica", &old_replica, &new_replica);
    fixed("storage.lease_secs", &old_lease, &new_lease);
    fixed(
        "storage.synchronous",
        &format!("{:?}", running.storage.synchronous).to_lowercase(),
        &format!("{:?}", new.storage.synchronous).to_lowercase(),
    );
    // The schedule is started with the daemon (see `app::scheduled_prunes`).
    let retain_days =
        |settings: &Settings| settings.storage.retain.map_or("none".to_owned(), |r| r.days.to_string());
    fixed("storage.retain_days", &retain_days(running), &retain_days(new));
    let retention_interval = |settings: &Settings| {
        settings.storage.retain.map_or("none".to_owned(), |r| format!("{}s", r.every.as_secs()))
    };
    fixed("storage.retention_interval_secs", &retention_interval(running), &retention_interval(new));
    let uploads_dir = |settings: &Settings| {
        settings
            .storage
            .uploads_dir
            .as_ref()
            .map_or("the default".to_owned(), |dir| dir.display().to_string())
    };
    fixed("storage.uploads_dir", &uploads_dir(running), &uploads_dir(new));
    // The typing indicator is started with the daemon, with its longest wait.
    let typing = |settings: &Settings| {
        settings.outbound.typing.map_or("off".to_owned(), |max| format!("on for at most {}s", max.as_secs()))
    };
    fixed("outbound.typing", &typing(running), &typing(new));
    fixed("api.listen", &running.api.listen, &new.api.listen);
    let health_listen = |settings: &Settings| {
        settings.api.health_listen.map_or("none".to_owned(), |address| address.to_string())
    };
    fixed("api.health_listen", &health_listen(running), &health_listen(new));
    // Checked as the local API binds, against its address then.
    fixed(
        "api.plaintext_beyond_loopback",
        &running.api.plaintext_beyond_loopback,
        &new.api.plaintext_beyond_loopback,
    );
    // The operator's chat is where start-up recovery and the reconciler ask.
    let operator = |settings: &Settings| {
        settings.operator.as_ref().map_or("none".to_owned(), |operator| {
            let topic = operator.thread_id.map_or(String::new(), |thread| format!(" topic {thread}"));
            format!(
                "route {} (chat {}{topic}), operators {}",
                operator.route,
                operator.chat_id,
                users(&operator.operators)
            )
        })
    };
    fixed("operator", &operator(running), &operator(new));
    // The files are named as the local API binds; what they hold is read at every reload.
    // A client CA named or dropped is a change of files too: the reload reads the files the
    // daemon started with, so it would neither start asking for client certificates nor
    // stop. (`api.daemon`, `api.ca` and `[media]` are the plugins': each reads them as it
    // starts.)
    let tls = |settings: &Settings| {
        settings.api.tls.as_ref().map_or("none".to_owned(), |tls| {
            let client_ca =
                tls.client_ca.as_ref().map_or("no client_ca".to_owned(), |ca| ca.display().to_string());
            format!("{}, {}, {client_ca}", tls.cert.display(), tls.key.display())
        })
    };
    fixed("api.tls", &tls(running), &tls(new));
    fixed(
        "log.format",
        &format!("{:?}", running.log.format).to_lowercase(),
        &format!("{:?}", new.log.format).to_lowercase(),
    );
    fixed("log.filter", &running.log.filter, &new.log.filter);
}

/// Agents removed, added, or given another secret or permission relay: each needs a
/// restart.
fn agent_changes(running: &Settings, new: &Settings) -> Vec<String> {
    let mut agents = Vec::new();
    for (agent, settings) in &running.agents {
        match new.agents.get(agent) {
            None => agents.push(format!(
                "agents.{agent} was removed: removing an agent needs a restart; it stays connectable until then"
            )),
            Some(new) if new.token_env != settings.token_env => agents.push(format!(
                "agents.{agent}.token_env: {} → {} needs a restart; {} stays in effect",
                settings.token_env, new.token_env, settings.token_env
            )),
            Some(new) if new.permissions != settings.permissions => agents.push(format!(
                "agents.{agent}.permissions changed: the permission relay's route, approvers and timeout need a \
                 restart; the running ones stay in effect"
            )),
            Some(_) => {}
        }
    }
    for agent in new.agents.keys().filter(|agent| !running.agents.contains_key(*agent)) {
        agents.push(format!("agents.{agent} was added: adding an agent needs a restart"));
    }
    agents
}

fn route_changes(old: &[Route], new: &[Route], changes: &mut Vec<String>) {
    let by_name = |routes: &[Route]| -> BTreeMap<String, Route> {
        routes.iter().map(|route| (route.name.to_string(), route.clone())).collect()
    };
    let (old, new) = (by_name(old), by_name(new));
    for (name, route) in &new {
        match old.get(name) {
            None => changes.push(format!("route '{name}' added: {}", describe(route))),
            Some(before) if before != route => {
                changes.push(format!("route '{name}' changed: {} → {}", describe(before), describe(route)));
            }
            Some(_) => {}
        }
    }
    for (name, route) in old.iter().filter(|(name, _)| !new.contains_key(*name)) {
        changes.push(format!("route '{name}' removed (was {})", describe(route)));
    }
}

fn describe(route: &Route) -> String {
    let target = match route.target {
        RouteTarget::Topic { chat_id, thread_id } => format!("chat {chat_id} topic {thread_id}"),
        RouteTarget::Chat { chat_id } => format!("chat {chat_id}"),
        RouteTarget::Default => "every other chat".to_owned(),
    };
    let agents: Vec<&str> = route.agents().iter().map(AgentName::as_str).collect();
    let mut line = if route.is_room() {
        format!("{target} → room [{}]", agents.join(", "))
    } else {
        format!("{target} → {}", agents.join(", "))
    };
    if let Some(senders) = &route.senders {
        line.push_str(&format!(", senders {}", users(senders)));
    }
    if route.mention_only {
        line.push_str(", mention only");
    }
    line
}

fn users(ids: &[i64]) -> String {
    if ids.is_empty() { "everyone".to_owned() } else { format!("{ids:?}") }
}

fn optional(value: &Option<impl Display>) -> String {
    value.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// Applies a reloaded configuration to the running parts.
pub struct Reloader {
    path: PathBuf,
    /// The settings in effect, as far as reloads change them.
    running: Mutex<Settings>,
    routing: watch::Sender<Arc<Routing>>,
    bridge: Bridge,
    outbound: Outbound,
    /// The local API's certificate, with `api.tls`.
    certificate: Option<ServedCertificate>,
}

impl Reloader {
    pub fn new(
        settings: Settings,
        routing: watch::Sender<Arc<Routing>>,
        bridge: Bridge,
        outbound: Outbound,
        certificate: Option<ServedCertificate>,
    ) -> Self {
        Self {
            path: settings.source.clone(),
            running: Mutex::new(settings),
            routing,
            bridge,
            outbound,
            certificate,
        }
    }

    fn running(&self) -> MutexGuard<'_, Settings> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Re-reads the file and applies it, or refuses it; logs either way. True when applied.
    /// The certificate is read again first, and on its own: a renewal is served even when
    /// the configuration file is refused. The file must pass what `switchboard check`
    /// checks (its secrets, `api.tls`'s files), or it is refused whole: applied, it would
    /// be what the next restart refuses to start with.
    pub fn reload(&self) -> bool {
        self.read_certificate_again();
        let new = match Settings::load(&self.path) {
            Ok(new) => new,
            Err(e) => {
                tracing::error!("configuration reload refused: {e}; the running configuration stays");
                metrics::config_reload(false);
                return false;
            }
        };
        if let Err(refusal) = crate::app::start_up_checks(&new) {
            tracing::error!(
                "configuration reload refused: {}; the running configuration stays",
                refused_at_start(&self.path, &refusal)
            );
            metrics::config_reload(false);
            return false;
        }
        let mut running = self.running();
        let plan = match plan(&running, &new) {
            Ok(plan) => plan,
            Err(reason) => {
                tracing::error!(
                    "configuration reload refused: {}: {reason}; the running configuration stays",
                    self.path.display()
                );
                metrics::config_reload(false);
                return false;
            }
        };
        for warning in new.warnings() {
            tracing::warn!("{}: {warning}", self.path.display());
        }
        for line in &plan.needs_restart {
            tracing::warn!("configuration reload: {line}");
        }
        // Only what can change in place; the fixed settings keep their running values.
        running.routes = new.routes.clone();
        running.telegram.allowed_users = new.telegram.allowed_users.clone();
        // The typing indicator keeps what it started with (see `kept_until_restart`).
        running.outbound = OutboundSettings { typing: running.outbound.typing, ..new.outbound.clone() };
        running.handoffs = new.handoffs.clone();
        running.rooms = new.rooms.clone();
        // Room routes come with their members and limits: the room driver reads them anew,
        // before any message is routed to a room it would not know yet.
        self.bridge.set_rooms(running.rooms.clone());
        self.routing.send_replace(Arc::new(Routing::of(&running)));
        self.bridge.reload_rules(
            ReplyLimits {
                max_reply_parts: running.outbound.max_reply_parts,
                ack_reaction: running.outbound.ack_reaction,
            },
            HandoffRules::of(&running),
        );
        self.outbound.set_pacing(running.outbound.pacing);
        if plan.changes.is_empty() {
            tracing::info!(file = %self.path.display(), "configuration reloaded: nothing that applies in place changed");
        } else {
            tracing::info!(
                file = %self.path.display(),
                changes = plan.changes.len(),
                "configuration reloaded: {}",
                plan.changes.join("; ")
            );
        }
        metrics::config_reload(true);
        true
    }

    fn read_certificate_again(&self) {
        let Some(certificate) = &self.certificate else { return };
        let files = certificate.files();
        match certificate.read_again() {
            Ok(Reread::Renewed) => {
                tracing::info!(
                    cert = %files.cert.display(), expires_at = %certificate.expires_at(),
                    "api.tls: the local API serves the renewed certificate; connections already open keep the one \
                     they were made with"
                );
                metrics::certificate_read("renewed");
                metrics::certificate_expires_at(certificate.expires_at());
            }
            Ok(Reread::Unchanged) => {
                tracing::info!(cert = %files.cert.display(), "api.tls: the certificate is unchanged");
                metrics::certificate_read("unchanged");
            }
            Err(e) => {
                tracing::error!(
                    "api.tls: the certificate was not read again: {e:#}; the running one is still served"
                );
                metrics::certificate_read("refused");
            }
        }
    }
}

/// A start-up check's refusal, said for a reload. A secret is read from the daemon's own
/// environment, fixed when it started: a variable exported since (in a shell, a unit's
/// `Environment=`) is not seen until a restart with it set.
fn refused_at_start(path: &Path, refusal: &StartUpRefusal) -> String {
    match refusal {
        StartUpRefusal::Secrets(e) => format!(
            "{e} (this daemon reads secret variables from the environment it was started with: a variable set \
             or changed since needs a restart with it set)"
        ),
        StartUpRefusal::Certificate(e) => format!("{}: api.tls: {e:#}", path.display()),
    }
}

/// Starts catching SIGHUP, whose default action would end the process: called before the
/// daemon listens, so a reload sent as soon as it answers is never fatal. `None` (logged)
/// when the signal cannot be caught.
pub fn catch_hangups() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP: configuration reload is off");
            None
        }
    }
}

/// Reloads on every SIGHUP until `shutdown`.
pub async fn reload_on_sighup(reloader: Reloader, hangups: Option<Signal>, shutdown: CancellationToken) {
    let Some(mut hangups) = hangups else { return };
    loop {
        tokio::select! {
            received = hangups.recv() => {
                if received.is_none() {
                    return;
                }
                tracing::info!(file = %reloader.path.display(), "SIGHUP received: reloading the configuration");
                reloader.reload();
            }
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BASE: &str = r#"
[telegram]
token_env = "SB_RELOAD_TOKEN"
allowed_users = [1]

[agents.orchestrator]
token_env = "SB_RELOAD_ORCH"

[agents.worker]
token_env = "SB_RELOAD_WORKER"

[[routes]]
name = "dm"
chat_id = 42
agent = "orchestrator"
"#;

    fn load(text: &str) -> Settings {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        Settings::load(file.path()).unwrap()
    }

    #[test]
    fn nothing_changed_is_an_empty_plan() {
        assert_eq!(plan(&load(BASE), &load(BASE)), Ok(ReloadPlan::default()));
    }

    #[test]
    fn routes_allowlist_and_limits_apply_in_place() {
        let new = BASE
            .replace("allowed_users = [1]", "allowed_users = []")
            .replace("chat_id = 42", "chat_id = 43")
            + "\n[[routes]]\nname = \"ops\"\nchat_id = -100\nagent = \"worker\"\n[outbound]\nmax_reply_parts = 3\n";
        let plan = plan(&load(BASE), &load(&new)).unwrap();
        assert_eq!(
            plan.changes,
            [
                "route 'dm' changed: chat 42 → orchestrator → chat 43 → orchestrator",
                "route 'ops' added: chat -100 → worker",
                "telegram.allowed_users: [1] → everyone",
                "outbound.max_reply_parts: 10 → 3",
            ]
        );
        assert!(plan.needs_restart.is_empty(), "{:?}", plan.needs_restart);
    }

    /// Client certificates turned on by a reload would not be asked for (the reload reads
    /// the files the daemon started with): it says a restart is needed, not "nothing
    /// changed". So does the prune schedule's interval.
    #[test]
    fn a_client_ca_named_and_the_prune_interval_are_reported_as_needing_a_restart() {
        let tls = "[api]\ntls = { cert = \"c.pem\", key = \"k.pem\" }\n[telegram]";
        let before = BASE.replace("[telegram]", tls);
        let after = BASE.replace("[telegram]", &tls.replace("\" }", "\", client_ca = \"ca.pem\" }"));
        let tls_plan = plan(&load(&before), &load(&after)).unwrap();
        let restart = &tls_plan.needs_restart;
        assert_eq!(restart.len(), 1, "{restart:?}");
        assert!(restart[0].starts_with("api.tls:") && restart[0].contains("ca.pem"), "{restart:?}");

        let every = |secs: u32| {
            BASE.replace(
                "[telegram]",
                &format!("[storage]\nretain_days = 90\nretention_interval_secs = {secs}\n[telegram]"),
            )
        };
        let interval_plan = plan(&load(&every(3600)), &load(&every(60))).unwrap();
        let restart = &interval_plan.needs_restart;
        assert_eq!(restart.len(), 1, "{restart:?}");
        assert!(restart[0].starts_with("storage.retention_interval_secs: 3600s → 60s"), "{restart:?}");
    }

    #[test]
    fn fixed_settings_are_reported_as_needing_a_restart() {
        let new = BASE.replace(
            "[telegram]",
            "[api]\nlisten = \"127.0.0.1:9999\"\n[storage]\ndatabase = \"other.db\"\n[telegram]",
        );
        let plan = plan(&load(BASE), &load(&new)).unwrap();
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);
        assert_eq!(plan.needs_restart.len(), 2, "{:?}", plan.needs_restart);
        assert!(
            plan.needs_restart[0].starts_with("storage.database: switchboard.db → other.db needs a restart")
        );
        assert!(
            plan.needs_restart[1].starts_with("api.listen: 127.0.0.1:7797 → 127.0.0.1:9999 needs a restart")
        );
    }

    /// Every key the reload leaves as it was is named, and every one it applies: the health
    /// listener, the plaintext word and the operator's chat are set up at start-up; the
    /// ack reaction and a route's own senders apply at once.
    #[test]
    fn the_health_listener_and_the_operator_need_a_restart_and_the_ack_reaction_applies() {
        let new = BASE
            .replace(
                "[telegram]",
                "[api]\nhealth_listen = \"127.0.0.1:7798\"\nplaintext_beyond_loopback = true\n\
                 [outbound]\nack_reaction = \"👀\"\n[operator]\nroute = \"dm\"\noperators = [1]\n[telegram]",
            )
            .replace(
                "agent = \"orchestrator\"",
                "agent = \"orchestrator\"\nallowed_users = []\nmention_only = true",
            );
        let plan = plan(&load(BASE), &load(&new)).unwrap();
        let restart = plan.needs_restart.join("\n");
        for key in ["api.health_listen", "api.plaintext_beyond_loopback", "operator"] {
            assert!(restart.contains(&format!("{key}: ")), "{key} is named: {restart}");
        }
        assert_eq!(plan.needs_restart.len(), 3, "{restart}");
        let changes = plan.changes.join("\n");
        assert!(changes.contains("outbound.ack_reaction: none → 👀"), "{changes}");
        assert!(
            changes.contains("route 'dm' changed") && changes.contains("senders everyone, mention only"),
            "{changes}"
        );
    }

    /// The operator's chat is where unresolved sends are asked about, set up at start-up:
    /// moving the operator's route to another chat needs a restart and says so (it was
    /// reported as an applied route change). A webhook's check interval is named too.
    #[test]
    fn moving_the_operators_chat_or_the_webhook_check_needs_a_restart_and_says_so() {
        let with_operator =
            BASE.replace("[telegram]", "[operator]\nroute = \"dm\"\noperators = [1]\n[telegram]");
        let moved = with_operator.replace("chat_id = 42", "chat_id = 43");
        let moving = plan(&load(&with_operator), &load(&moved)).unwrap();
        let restart = moving.needs_restart.join("\n");
        assert!(
            restart.contains("operator: ") && restart.contains("chat 42") && restart.contains("chat 43"),
            "{restart}"
        );

        let hook = |secs: u64| {
            BASE.replace(
                "allowed_users = [1]",
                &format!(
                    "allowed_users = [1]\nwebhook = {{ public_url = \"https://bot.example.test/hook\", listen = \"127.0.0.1:8443\", secret_env = \"SB_RELOAD_HOOK\", check_secs = {secs} }}"
                ),
            )
        };
        let checking = plan(&load(&hook(60)), &load(&hook(300))).unwrap();
        assert!(
            checking.needs_restart.join("\n").contains("telegram.webhook"),
            "{:?}",
            checking.needs_restart
        );
    }

    /// The typing indicator and the staging folder are set up as the daemon starts: a new
    /// file that changes them says so instead of reporting nothing changed.
    #[test]
    fn typing_and_the_staging_folder_need_a_restart() {
        let new = BASE.replace(
            "[telegram]",
            "[outbound]\ntyping = false\n[storage]\nuploads_dir = \"/srv/staged\"\n[telegram]",
        );
        let plan = plan(&load(BASE), &load(&new)).unwrap();
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);
        let [uploads, typing] = plan.needs_restart.as_slice() else { panic!("{:?}", plan.needs_restart) };
        assert!(
            uploads.starts_with("storage.uploads_dir: the default → /srv/staged needs a restart"),
            "{uploads}"
        );
        assert!(typing.starts_with("outbound.typing: on for at most 120s → off needs a restart"), "{typing}");
    }

    /// A room's limits and its members' names are applied in place, and said.
    #[test]
    fn a_rooms_limits_and_names_are_reported_as_they_change() {
        let room = "\n[[routes]]\nname = \"team\"\nchat_id = -100\nagents = [\"orchestrator\", \"worker\"]\n";
        let running = BASE.to_owned() + room;
        let new = running
            .replace("[agents.worker]", "[agents.worker]\naliases = [\"w\"]")
            .replace("[telegram]", "[rooms]\ncascade_limit = 3\n[telegram]");
        let plan = plan(&load(&running), &load(&new)).unwrap();
        assert_eq!(
            plan.changes,
            [
                "room 'team' limits: cascade_limit 10, group_max_iters 50, speaker_timeout_secs 600 → \
                 cascade_limit 3, group_max_iters 50, speaker_timeout_secs 600",
                "room 'team': its members' names or aliases changed",
            ]
        );
        assert!(plan.needs_restart.is_empty(), "{:?}", plan.needs_restart);
    }

    #[test]
    fn a_route_to_an_agent_the_daemon_does_not_run_refuses_the_reload() {
        let new = BASE.to_owned()
            + "\n[agents.helper]\ntoken_env = \"SB_RELOAD_HELPER\"\n[[routes]]\nname = \"h\"\nchat_id = 7\nagent = \"helper\"\n";
        let refused = plan(&load(BASE), &load(&new)).unwrap_err();
        assert!(
            refused.contains("routes[1] ('h') names agent 'helper'") && refused.contains("restart"),
            "{refused}"
        );
        // Declared but not routed to: applied, with the agent reported.
        let unused = BASE.to_owned() + "\n[agents.helper]\ntoken_env = \"SB_RELOAD_HELPER\"\n";
        let plan = plan(&load(BASE), &load(&unused)).unwrap();
        assert_eq!(plan.needs_restart, ["agents.helper was added: adding an agent needs a restart"]);
    }
}
