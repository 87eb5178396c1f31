//! `switchboard check`: validates a configuration and prints the routes table.

use std::path::Path;

use crate::config::{ConfigWarning, Database, Settings};
use crate::ledger::files;
use crate::rules::routes::{Audience, RouteTarget};

pub(super) fn check(path: &Path) -> anyhow::Result<()> {
    let settings = Settings::load(path)?;
    // Before anything is said to be valid: what would stop `run` (secrets, a certificate
    // that cannot be served).
    crate::app::start_up_checks(&settings)?;
    for warning in check_warnings(&settings) {
        eprintln!("switchboard: warning: {}: {warning}", path.display());
    }
    println!("{}: configuration is valid", path.display());
    println!("telegram api: {}", settings.telegram.api_url);
    match &settings.api.tls {
        Some(files) => println!("local api:    {} over TLS ({})", settings.api.listen, files.cert.display()),
        None => println!("local api:    {}", settings.api.listen),
    }
    let plugins_reach: Vec<String> = settings.api.daemon_urls().iter().map(ToString::to_string).collect();
    println!("plugins use:  {}", plugins_reach.join(", "));
    println!("database:     {}", settings.storage.database);
    if let Database::Postgres(postgres) = &settings.storage.database {
        println!(
            "replica:      {} (leads the bot or stands by; a lease lasts {}s)",
            postgres.replica,
            postgres.lease.duration().as_secs()
        );
    }
    match settings.storage.retain {
        Some(retain) => println!(
            "retention:    prunes what finished more than {} day(s) ago, every {}s",
            retain.days,
            retain.every.as_secs()
        ),
        None => println!("retention:    keeps everything (storage.retain_days is not set)"),
    }
    println!("agents:       {}", settings.agent_list());
    if settings.telegram.allowed_users.is_empty() {
        println!("senders:      everyone in a routed chat");
    } else {
        println!("senders:      only {:?}", settings.telegram.allowed_users);
    }
    for line in permission_relays(&settings) {
        println!("{line}");
    }
    if let Some(operator) = &settings.operator {
        println!(
            "operator:     unresolved sends are asked in route {} (chat {}); operators {:?}",
            operator.route, operator.chat_id, operator.operators
        );
    }
    println!();
    print!("{}", routes_table(&settings));
    Ok(())
}

/// What `check` warns about: the settings' own warnings, and ledger files that other
/// users could read (reported, not changed: `run` tightens them).
fn check_warnings(settings: &Settings) -> Vec<ConfigWarning> {
    let mut warnings = settings.warnings();
    let Database::Sqlite(database) = &settings.storage.database else {
        return warnings;
    };
    // A warning, not an error: the file may be checked on another machine than the one
    // the daemon runs on (an image being built).
    if let Some(folder) = crate::ledger::sqlite::missing_folder(database) {
        warnings.push(ConfigWarning {
            key: "storage.database".into(),
            problem: format!(
                "the folder {} does not exist here; `switchboard run` refuses to start until it does",
                folder.display()
            ),
        });
    }
    match files::loose_files(database) {
        Ok(loose) => warnings.extend(loose.into_iter().map(|file| ConfigWarning {
            key: "storage.database".into(),
            problem: format!(
                "{} has mode {:04o}, open to other users; `switchboard run` tightens it to {:04o}",
                file.path.display(),
                file.mode,
                files::PRIVATE_MODE
            ),
        })),
        Err(e) => warnings.push(ConfigWarning {
            key: "storage.database".into(),
            problem: format!("cannot check the permissions of {}: {e}", database.display()),
        }),
    }
    warnings
}

/// One line per agent whose tool-use approvals are relayed (DESIGN.md §15).
fn permission_relays(settings: &Settings) -> Vec<String> {
    settings
        .agents
        .iter()
        .filter_map(|(agent, agent_settings)| {
            let relay = agent_settings.permissions.as_ref()?;
            let place = match relay.thread_id {
                Some(thread) => format!("chat {} topic {thread}", relay.chat_id),
                None => format!("chat {}", relay.chat_id),
            };
            Some(format!(
                "permissions:  agent {agent} asks route {} ({place}); approvers {:?}; unanswered prompts expire after {}s",
                relay.route,
                relay.approvers,
                relay.timeout.as_secs()
            ))
        })
        .collect()
}

/// The routes table, most specific first, as `check` prints it.
pub fn routes_table(settings: &Settings) -> String {
    let mut routes: Vec<_> = settings.routes.routes().iter().collect();
    routes.sort_by_key(|route| match route.target {
        RouteTarget::Topic { .. } => 0,
        RouteTarget::Chat { .. } => 1,
        RouteTarget::Default => 2,
    });
    let mut out = format!("{:<24} {:<22} {:<10} {}\n", "ROUTE", "CHAT", "TOPIC", "AGENT");
    for route in routes {
        let (chat, topic) = match route.target {
            RouteTarget::Topic { chat_id, thread_id } => (chat_id.to_string(), thread_id.to_string()),
            RouteTarget::Chat { chat_id } => (chat_id.to_string(), "*".to_owned()),
            RouteTarget::Default => ("* (default)".to_owned(), "*".to_owned()),
        };
        let mut audience = match &route.audience {
            Audience::Agent(agent) => agent.to_string(),
            Audience::Room(agents) => format!("room: {}", join(agents)),
        };
        if route.mention_only {
            audience.push_str(" (mention only)");
        }
        match route.senders.as_deref() {
            None => {}
            Some([]) => audience.push_str(" (senders: everyone)"),
            Some(senders) => audience.push_str(&format!(" (senders: only {senders:?})")),
        }
        out.push_str(&format!("{:<24} {:<22} {:<10} {}\n", route.name, chat, topic, audience));
    }
    if settings.routes.routes().is_empty() {
        out.push_str("(no routes: every message will be recorded as unrouted)\n");
    }
    out.push_str(&rooms_table(settings));
    out
}

/// The group rooms, as `check` prints them: each room's members in room order with the
/// names they answer to, and its limits with what one human message can cost.
pub fn rooms_table(settings: &Settings) -> String {
    let mut out = String::new();
    for route in settings.routes.routes() {
        let Some(room) = settings.rooms.get(&route.name) else { continue };
        let limits = room.limits;
        let place = match room.thread_id {
            Some(thread) => format!("chat {} topic {thread}", room.chat_id),
            None => format!("chat {}", room.chat_id),
        };
        out.push_str(&format!(
            "\nroom {} ({place}): cascade_limit {}, max_iters {}, speaker_timeout {}s; one human message costs at \
             most {} × {} = {} tool iterations\n",
            room.route,
            limits.cascade_limit,
            limits.max_iters,
            limits.speaker_timeout.as_secs(),
            limits.cascade_limit,
            limits.max_iters,
            u64::from(limits.cascade_limit.get()) * u64::from(limits.max_iters),
        ));
        for (position, member) in room.roster.members().iter().enumerate() {
            let answers_to: Vec<String> = answers_to(member);
            out.push_str(&format!(
                "  {}. {:<20} shown as \"{}\"; answers to {}{}\n",
                position + 1,
                member.name,
                member.display_name(),
                answers_to.join(" "),
                if position == 0 { " (speaks first when nobody is mentioned)" } else { "" }
            ));
        }
    }
    out
}

/// The `@` names a room member answers to, each once (compared as mentions compare).
fn answers_to(member: &crate::rules::turns::RoomMember) -> Vec<String> {
    let mut seen = Vec::new();
    let mut shown = Vec::new();
    for form in member.alias_forms() {
        let key = crate::rules::turns::normalise(&form);
        if !seen.contains(&key) && !form.contains(char::is_whitespace) {
            seen.push(key);
            shown.push(format!("@{form}"));
        }
    }
    shown
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}
