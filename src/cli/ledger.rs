//! `switchboard ledger …`: inspects envelopes, attempts, handoffs, rooms and tasks,
//! reconciles unresolved ones, prunes what finished long ago, and backs the ledger up.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;

use crate::clock::text;
use crate::config::{ConfigError, Database, Settings};
use crate::ids::{CascadeId, TaskId, TraceId};
use crate::ledger::EnvelopeState;
use crate::ledger::{
    Ledger, ListFilter, PruneReport, Reconciliation, StoredCascade, StoredEnvelope, StoredHandoff,
    StoredPermission, TurnEnding,
};
use crate::rules::retention::MAX_AGE_DAYS;

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// List envelopes, oldest first (the newest LIMIT that match).
    List {
        #[arg(long)]
        state: Option<EnvelopeState>,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        route: Option<String>,
        /// Only envelopes holding an attempt whose outcome is unknown and not yet
        /// reconciled (what `ledger stats` counts as unreconciled attempts), whatever their
        /// state: each one waits for `ledger reconcile`.
        #[arg(long)]
        unreconciled: bool,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
    },
    /// Show one envelope (env_…) with its attempts and state history, or one room exchange
    /// (cas_…) with its speakers in order and how it ended.
    Show { trace_id: String },
    /// Count envelopes by state.
    Stats,
    /// List handoffs between agents, oldest first (the newest LIMIT that match).
    Handoffs {
        /// Only handoffs still waiting for their answer.
        #[arg(long)]
        open: bool,
        /// Only handoffs from or to this agent.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
    },
    /// List relayed permission requests (DESIGN.md §15), newest first: who asked, the
    /// tool, the state, the prompt's send, who answered and when.
    Permissions {
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
    },
    /// List group-room exchanges (cascades), oldest first (the newest LIMIT that match).
    Cascades {
        /// Only the exchanges of this room route.
        #[arg(long)]
        room: Option<String>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
    },
    /// Show a task (task_…): where it stands, every revision with what was done and
    /// running at that moment, and its predecessor and successor. With --stopped, record
    /// that a cancelled task has stopped.
    Task {
        task_id: String,
        /// Confirm that the cancelled task has stopped (when its agent cannot ack).
        #[arg(long, requires = "reason")]
        stopped: bool,
        /// Why (kept in the ledger); required with --stopped.
        #[arg(long, value_parser = a_reason)]
        reason: Option<String>,
    },
    /// Delete what finished longer ago than DURATION (acked, superseded, unrouted, rejected,
    /// ignored and undecodable envelopes with their attempts and history; ended handoffs,
    /// room exchanges and tasks; settled permission requests and operator questions), in
    /// short batches beside a running daemon. Nothing open or unreconciled goes.
    Prune {
        /// How long ago a row must have finished, at least an hour: a number and a unit,
        /// `90d`, `12h` or `90min`.
        #[arg(long, value_name = "DURATION")]
        older_than: OlderThan,
        /// Count what would go, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Copy the ledger into a new file while the daemon runs: one consistent snapshot,
    /// compacted, checked, and named PATH only once it is whole. On PostgreSQL, use pg_dump.
    Backup {
        /// The copy to make; it must not exist yet.
        #[arg(value_name = "PATH")]
        to: PathBuf,
    },
    /// Settle an envelope's unknown attempts with what you found in the chat. An unresolved
    /// envelope moves as its reply did; one in any other state (acked, superseded, pending)
    /// keeps it, and only its unknown attempts (a follow-up, an audit copy, a reaction, an
    /// edit) are settled.
    Reconcile {
        trace_id: String,
        /// What was sent did reach the chat: an unresolved envelope becomes acked.
        #[arg(long, conflicts_with = "not_delivered", required_unless_present = "not_delivered")]
        delivered: bool,
        /// It did not: an unresolved envelope goes back to its agent to answer.
        #[arg(long)]
        not_delivered: bool,
        /// Why (kept in the ledger).
        #[arg(long, value_parser = a_reason)]
        reason: String,
    },
}

/// A reason kept in the ledger for whoever reads it later: blank says nothing, so it is
/// refused like a missing one.
fn a_reason(text: &str) -> Result<String, String> {
    let reason = text.trim();
    if reason.is_empty() {
        return Err("say why: the reason is kept in the ledger, and a blank one says nothing".into());
    }
    Ok(reason.to_owned())
}

pub(super) async fn ledger(path: &Path, command: LedgerCommand) -> anyhow::Result<()> {
    let settings = Settings::load(path)?;
    let database = &settings.storage.database;
    // Only the daemon creates a ledger: here a missing file is a mistyped path (or the
    // wrong working directory), and an empty ledger would only hide that. (PostgreSQL's
    // opening checks the schema holds a ledger.)
    if let Database::Sqlite(file) = database {
        let exists = file
            .try_exists()
            .with_context(|| format!("cannot look for the ledger database {}", file.display()))?;
        if !exists {
            return Err(missing_ledger(&settings, file).into());
        }
    }
    if let LedgerCommand::Backup { to } = command {
        return back_up(database, &to).await;
    }
    let ledger = crate::ledger::open_existing(database, settings.storage.synchronous)
        .await
        .with_context(|| format!("opening the ledger {database}"))?;
    let result = ledger_command(&ledger, &settings, command).await;
    ledger.close().await;
    result
}

/// `switchboard ledger backup`: a copy of the file, made beside the running daemon.
async fn back_up(database: &Database, to: &Path) -> anyhow::Result<()> {
    let Database::Sqlite(file) = database else {
        anyhow::bail!(
            "`switchboard ledger backup` copies a SQLite ledger; this one is on PostgreSQL ({database}): \
             back it up with pg_dump"
        );
    };
    let (from, target) = (file.clone(), to.to_owned());
    let backup = tokio::task::spawn_blocking(move || crate::ledger::sqlite::back_up(&from, &target))
        .await
        .context("the backup's thread did not finish")??;
    println!(
        "backed up {} envelope(s) to {} ({:.1} MiB) in {:.1} s",
        backup.envelopes,
        to.display(),
        backup.bytes as f64 / (1024.0 * 1024.0),
        backup.took.as_secs_f64()
    );
    Ok(())
}

fn missing_ledger(settings: &Settings, database: &Path) -> ConfigError {
    let relative = if database.is_relative() {
        std::env::current_dir()
            .map(|dir| format!(" (relative to the working directory {})", dir.display()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    ConfigError {
        file: settings.source.display().to_string(),
        key: "storage.database".into(),
        problem: format!(
            "the ledger {}{relative} does not exist; check the path (only `switchboard run` \
             creates a ledger)",
            database.display()
        ),
    }
}

async fn ledger_command(ledger: &Ledger, settings: &Settings, command: LedgerCommand) -> anyhow::Result<()> {
    let database = &settings.storage.database;
    let agents = || settings.agents.keys().map(ToString::to_string).collect::<Vec<_>>();
    match command {
        LedgerCommand::List { state, agent, route, unreconciled, limit } => {
            let filter =
                ListFilter { state, agent: agent.clone(), route: route.clone(), unreconciled, limit };
            let rows = ledger.list(&filter).await?;
            if rows.is_empty() {
                if let Some(agent) = agent {
                    let history =
                        ListFilter { agent: Some(agent.clone()), limit: 1, ..ListFilter::default() };
                    let known = !ledger.list(&history).await?.is_empty();
                    refuse_unknown_name("--agent", "agent", &agent, &agents(), known)?;
                }
                if let Some(route) = route {
                    let history =
                        ListFilter { route: Some(route.clone()), limit: 1, ..ListFilter::default() };
                    let known = !ledger.list(&history).await?.is_empty();
                    let routes: Vec<String> =
                        settings.routes.routes().iter().map(|r| r.name.to_string()).collect();
                    refuse_unknown_name("--route", "route", &route, &routes, known)?;
                }
            }
            print_envelopes(&rows);
        }
        LedgerCommand::Handoffs { open, agent, limit } => {
            let handoffs = ledger.list_handoffs(open, agent.as_deref(), limit).await?;
            if let (true, Some(agent)) = (handoffs.is_empty(), &agent) {
                let known = !ledger.list_handoffs(false, Some(agent), 1).await?.is_empty();
                refuse_unknown_name("--agent", "agent", agent, &agents(), known)?;
            }
            print_handoffs(&handoffs);
        }
        LedgerCommand::Permissions { limit } => print_permissions(&ledger.list_permissions(limit).await?),
        LedgerCommand::Cascades { room, limit } => {
            let cascades = ledger.list_cascades(room.as_deref(), limit).await?;
            if let (true, Some(room)) = (cascades.is_empty(), &room) {
                let rooms: Vec<String> = settings.rooms.keys().map(ToString::to_string).collect();
                refuse_unknown_name("--room", "room route", room, &rooms, false)?;
            }
            print_cascades(ledger, &cascades).await?;
        }
        LedgerCommand::Show { trace_id } if trace_id.trim().starts_with("cas_") => {
            let cascade_id = CascadeId::parse(&trace_id).map_err(anyhow::Error::msg)?;
            let cascade = ledger
                .cascade(&cascade_id)
                .await?
                .with_context(|| format!("no room exchange has id {cascade_id}"))?;
            print_cascade(ledger, &cascade).await?;
        }
        LedgerCommand::Show { trace_id } => {
            let trace_id = TraceId::parse(&trace_id).map_err(anyhow::Error::msg)?;
            let envelope = ledger
                .find(&trace_id)
                .await?
                .with_context(|| format!("no envelope has trace id {trace_id}"))?;
            print_envelope(ledger, &envelope).await?;
        }
        LedgerCommand::Stats => {
            for (state, count) in ledger.count_by_state().await? {
                println!("{state:<11} {count}");
            }
            // An envelope in any state can carry an attempt whose outcome is unknown (an
            // acked one's follow-up, a reaction, an audit copy): it is not counted as
            // unresolved above, but it waits for an operator all the same.
            let unreconciled = ledger.unreconciled_attempts().await?;
            println!("unreconciled attempts: {unreconciled}");
            if unreconciled > 0 {
                println!(
                    "(`switchboard ledger list --unreconciled` lists their envelopes; settle each with `ledger reconcile`)"
                );
            }
        }
        LedgerCommand::Task { task_id, stopped, reason } => {
            let task_id = TaskId::parse(&task_id).map_err(anyhow::Error::msg)?;
            if stopped {
                let reason = reason.unwrap_or_default();
                ledger.mark_task_stopped(&task_id, reason.trim()).await?;
                println!("{task_id}: now stopped");
            }
            print_task(ledger, &task_id).await?;
        }
        LedgerCommand::Prune { older_than, dry_run } => {
            let cutoff = older_than.cutoff(chrono::Utc::now());
            println!(
                "{} what finished before {} ({older_than} ago), in batches",
                if dry_run { "counting (dry run)" } else { "pruning" },
                cutoff.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            let report = ledger.prune(cutoff, dry_run).await?;
            print_prune_report(&report, dry_run, database);
        }
        LedgerCommand::Backup { .. } => unreachable!("a backup copies the file: `ledger` makes it unopened"),
        LedgerCommand::Reconcile { trace_id, delivered, not_delivered: _, reason } => {
            let finding = if delivered { Reconciliation::Delivered } else { Reconciliation::NotDelivered };
            let trace_id = TraceId::parse(&trace_id).map_err(anyhow::Error::msg)?;
            let state = ledger.reconcile(&trace_id, finding, &reason).await?;
            println!("{trace_id}: now {state}");
        }
    }
    Ok(())
}

/// A name given to filter a listing by, which matched nothing: refused when the
/// configuration does not declare it and the ledger holds no row of it (`known`), since
/// then it is a misspelling, and an empty listing would pass for "none". A name the ledger
/// knows (a route or agent removed since) is history, and its empty listing is an answer.
fn refuse_unknown_name(
    flag: &str,
    what: &str,
    given: &str,
    declared: &[String],
    known: bool,
) -> anyhow::Result<()> {
    if known || declared.iter().any(|name| name == given) {
        return Ok(());
    }
    let declared = if declared.is_empty() { "none".to_owned() } else { declared.join(", ") };
    anyhow::bail!(
        "{flag} {given}: the configuration declares no {what} '{given}' (declared: {declared}), and the ledger \
         holds nothing of one; check the spelling"
    )
}

/// `ledger list`: one line an envelope.
fn print_envelopes(rows: &[StoredEnvelope]) {
    println!(
        "{:<15} {:<11} {:<14} {:<14} {:<16} {:<20} PREVIEW",
        "TRACE_ID", "STATE", "AGENT", "ROUTE", "CHAT", "USER"
    );
    for e in rows {
        let chat = match e.thread_id {
            Some(thread) => format!("{}/{thread}", e.chat_id),
            None => e.chat_id.to_string(),
        };
        println!(
            "{:<15} {:<11} {:<14} {:<14} {:<16} {:<20} {}",
            e.trace_id,
            e.state,
            e.agent.as_deref().unwrap_or("-"),
            e.route.as_deref().unwrap_or("-"),
            chat,
            e.user(),
            e.preview()
        );
    }
    println!("({} envelope(s))", rows.len());
}

/// `ledger handoffs`: one line a handoff, and its late result if one came.
fn print_handoffs(handoffs: &[StoredHandoff]) {
    if handoffs.is_empty() {
        println!("no handoffs");
    }
    for h in handoffs {
        println!(
            "{}  {:<10}  {} → {}  depth {}  for {}  {}  \"{}\"",
            h.handoff_id,
            h.state,
            h.from_agent,
            h.to_agent,
            h.depth,
            h.cause_trace_id.as_deref().unwrap_or("(unprompted)"),
            text(h.opened_at),
            preview(&h.instruction)
        );
        if let Some(late) = &h.late_result {
            println!("    late result (never delivered): \"{}\"", preview(late));
        }
    }
}

/// `ledger permissions`: one line a request, with its prompt and how it ended.
fn print_permissions(requests: &[StoredPermission]) {
    if requests.is_empty() {
        println!("no permission requests");
    }
    for p in requests {
        let outcome = match (&p.answered_by_name, &p.answered_at, &p.expired_because) {
            (Some(by), Some(at), _) => {
                // Owed until the asking plugin confirms it gave the verdict to Claude Code.
                let verdict = match (p.verdict_sent_at, p.verdict_handed_at) {
                    (_, Some(handed)) => format!("verdict handed {}", text(handed)),
                    (Some(_), None) => "verdict written, not confirmed".to_owned(),
                    (None, None) => "verdict owed".to_owned(),
                };
                format!("by {by} ({}) at {at}, {verdict}", p.answered_by.unwrap_or_default())
            }
            (_, _, Some(because)) => format!("({because})"),
            _ => format!("expires {}", text(p.expires_at)),
        };
        let prompt = match (p.prompt_message_id, &p.prompt_error) {
            (Some(message_id), _) => format!("{} message {message_id}", p.prompt_send.as_str()),
            (None, Some(error)) => format!("{} ({error})", p.prompt_send.as_str()),
            (None, None) => p.prompt_send.as_str().to_owned(),
        };
        println!(
            "{}  {:<8}  {}  {} asked {} ({})  tool {}  prompt {} in chat {}  {}  \"{}\"",
            p.id,
            p.state,
            text(p.asked_at),
            p.agent,
            p.request_id,
            p.plugin_id,
            p.tool_name,
            prompt,
            p.chat_id,
            outcome,
            preview(&p.description)
        );
    }
}

/// `ledger cascades`: one line a room exchange, with its speakers in order.
async fn print_cascades(ledger: &Ledger, cascades: &[StoredCascade]) -> anyhow::Result<()> {
    if cascades.is_empty() {
        println!("no room exchanges");
    }
    for c in cascades {
        let turns = ledger.turns_of(c.id).await?;
        let replies = turns.iter().filter(|t| t.ending == Some(TurnEnding::Replied)).count();
        let speakers: Vec<&str> = turns.iter().map(|t| t.agent.as_str()).collect();
        let started = c.cascade().map(|cascade| cascade.message().text.clone()).unwrap_or_default();
        println!(
            "{}  {:<16}  {:<16}  {} turn(s), {replies} repl{}  [{}]  {}  \"{}\"",
            c.cascade_id,
            c.route,
            c.state,
            turns.len(),
            if replies == 1 { "y" } else { "ies" },
            speakers.join(" → "),
            text(c.created_at),
            preview(&started)
        );
    }
    Ok(())
}

/// `ledger show env_…`: the envelope, what it belongs to, its attempts and its history.
async fn print_envelope(ledger: &Ledger, e: &StoredEnvelope) -> anyhow::Result<()> {
    println!("trace_id:    {}", e.trace_id);
    println!("state:       {} (since {})", e.state, text(e.state_changed_at));
    println!("agent/route: {} / {}", e.agent.as_deref().unwrap_or("-"), e.route.as_deref().unwrap_or("-"));
    println!(
        "chat:        {} ({}{})",
        e.chat_id,
        e.chat_type,
        e.chat_title.as_deref().map(|t| format!(", {t}")).unwrap_or_default()
    );
    if let Some(thread) = e.thread_id {
        println!("topic:       {thread}");
    }
    println!(
        "message:     {} from {} (user id {}) at {}",
        e.message_id,
        e.user(),
        e.sender_id.map_or("-".into(), |id| id.to_string()),
        text(e.sent_at)
    );
    match e.update_id {
        Some(update_id) => {
            println!("update_id:   {update_id} ({}), received {}", e.kind, text(e.received_at))
        }
        None => println!("kind:        {}, made {}", e.kind, text(e.received_at)),
    }
    println!("deliveries:  {}", e.deliveries);
    if let (Some(task), Some(revision)) = (&e.task_id, e.revision) {
        println!("task:        {task} revision {revision} (switchboard ledger task {task})");
    }
    if let Some(note) = &e.note {
        println!("note:        {note}");
    }
    println!("content:\n  {}", e.content.replace('\n', "\n  "));
    if let Some(handoff) = ledger.handoff_of_envelope(e.id).await? {
        print_handoff(&handoff);
    }
    if let Some(cascade) = ledger.cascade_of_message(e.id).await? {
        println!("room:        started exchange {} ({})", cascade.cascade_id, cascade.state);
    }
    if let Some((turn, cascade)) = ledger.turn_of_envelope(e.id).await? {
        println!(
            "room turn:   speaker {} of {} ({}), summoned by {}{}",
            turn.speaker,
            cascade.cascade_id,
            cascade.route,
            turn.summoned_by,
            turn.ending.map(|ending| format!(", {}", ending.as_str())).unwrap_or_default()
        );
    }
    if let Some(raw) = ledger.raw_update(&e.trace_id).await? {
        println!("raw update (as Telegram sent it):\n  {raw}");
    }
    let attempts = ledger.attempts_for(e.id).await?;
    println!("attempts ({}):", attempts.len());
    for a in attempts {
        let reconciled = a
            .reconciled_outcome
            .as_ref()
            .map(|o| format!(" → reconciled {o} ({})", a.reconciled_reason.as_deref().unwrap_or("")))
            .unwrap_or_default();
        // A reply's part, or what a reaction or an edit acted on.
        let what = match a.target_message_id {
            Some(target) if !a.method.is_reply_part() => format!("{} of message {target}", a.method),
            _ => format!("part {}/{}", a.chunk_index + 1, a.chunk_count),
        };
        println!(
            "  {} {what} to {}{} → {}{}{}{}",
            a.op_id,
            a.chat_id,
            a.thread_id.map(|t| format!("/{t}")).unwrap_or_default(),
            a.outcome,
            a.telegram_message_id.map(|m| format!(" (message {m})")).unwrap_or_default(),
            a.error.as_deref().map(|err| format!(": {err}")).unwrap_or_default(),
            reconciled
        );
    }
    let events = ledger.events_for(e.id).await?;
    println!("history ({}):", events.len());
    for ev in events {
        println!(
            "  {} {} → {} by {}{}",
            ev.at,
            ev.from_state,
            ev.to_state,
            ev.actor,
            ev.reason.map(|r| format!(": {r}")).unwrap_or_default()
        );
    }
    Ok(())
}

/// What a prune removed per table, how long it held the writer, and the space the ledger
/// takes: a SQLite file's pages, or on PostgreSQL its tables' size.
fn print_prune_report(report: &PruneReport, dry_run: bool, database: &Database) {
    let verb = if dry_run { "would remove" } else { "removed" };
    println!("{verb}:");
    for (table, count) in report.removed.by_table() {
        println!("  {table:<20} {count}");
    }
    println!("  {:<20} {}", "total", report.removed.total());
    println!(
        "{} batch(es) in {:.1}s; the longest held the writer {:.1} ms",
        report.batches,
        report.took.as_secs_f64(),
        report.longest_batch.as_secs_f64() * 1000.0
    );
    let (before, after) = (report.pages_before, report.pages_after);
    if let Database::Postgres(_) = database {
        println!("tables: {} bytes before; {} bytes after", before.bytes(), after.bytes());
        if !dry_run {
            // docs/deploy-postgres.md: autovacuum marks the dead rows' space reusable.
            println!(
                "PostgreSQL's autovacuum makes the space of removed rows reusable; the tables do not shrink"
            );
        }
        return;
    }
    println!(
        "file: {} pages ({} bytes), {} free before; {} pages ({} bytes), {} free after",
        before.page_count,
        before.bytes(),
        before.free_pages,
        after.page_count,
        after.bytes(),
        after.free_pages
    );
    if !dry_run {
        // docs/operating.md ("Space"): the file keeps its size, the next writes reuse it.
        println!("freed pages are reused by later writes; the file does not shrink");
    }
}

/// How long ago a row must have finished for `ledger prune`: a whole number of days,
/// hours or minutes, at least [`MIN_AGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OlderThan {
    amount: u32,
    unit: AgeUnit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgeUnit {
    Days,
    Hours,
    Minutes,
}

/// The shortest age accepted. A prune is for history: an hour is past every recovery that
/// still reads a finished row (the plugin asks for a reply's outcome for up to 60 s after
/// a broken connection), and a cutoff minutes ago is more likely a typo than a wish.
const MIN_AGE: chrono::Duration = chrono::Duration::hours(1);

impl OlderThan {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let usage =
            || format!("'{text}' is not a duration like 90d, 12h or 90min (a whole number and d, h or min)");
        let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(usage)?;
        let (digits, unit) = text.split_at(split);
        let unit = match unit {
            "d" => AgeUnit::Days,
            "h" => AgeUnit::Hours,
            "min" => AgeUnit::Minutes,
            "m" => {
                return Err(format!(
                    "'{text}': m could mean minutes or months; write minutes as {digits}min, and months \
                     in days ({}d for {digits} months)",
                    digits.parse::<u64>().unwrap_or(0).saturating_mul(30)
                ));
            }
            _ => return Err(usage()),
        };
        let amount: u32 = digits.parse().map_err(|_| usage())?;
        if amount == 0 {
            return Err(format!(
                "'{text}' is zero: everything finished would go; give at least 1{}",
                unit.suffix()
            ));
        }
        let age = Self { amount, unit };
        if age.duration() > chrono::Duration::days(MAX_AGE_DAYS) {
            return Err(format!("'{text}' is more than a century"));
        }
        if age.duration() < MIN_AGE {
            return Err(format!(
                "'{text}' is under an hour: a prune keeps at least the last hour, which recovery may \
                 still read; give 1h or more"
            ));
        }
        Ok(age)
    }

    fn duration(self) -> chrono::Duration {
        let amount = i64::from(self.amount);
        match self.unit {
            AgeUnit::Days => chrono::Duration::days(amount),
            AgeUnit::Hours => chrono::Duration::hours(amount),
            AgeUnit::Minutes => chrono::Duration::minutes(amount),
        }
    }

    /// The moment before which a row must have finished.
    pub fn cutoff(self, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        now - self.duration()
    }
}

impl AgeUnit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Days => "d",
            Self::Hours => "h",
            Self::Minutes => "min",
        }
    }
}

impl std::str::FromStr for OlderThan {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl std::fmt::Display for OlderThan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.amount, self.unit.suffix())
    }
}

/// A task, its revisions, and the tasks before and after it.
async fn print_task(ledger: &Ledger, task_id: &TaskId) -> anyhow::Result<()> {
    let Some((task, revisions, effects)) = ledger.task(task_id).await? else {
        anyhow::bail!("no task has id {task_id}");
    };
    println!("{}", crate::rules::revisions::texts::describe(&task, &effects));
    println!(
        "conversation: {} chat {}{} → agent {}",
        task.route,
        task.chat_id,
        task.thread_id.map(|t| format!(" topic {t}")).unwrap_or_default(),
        task.agent
    );
    println!(
        "opened {}{}",
        text(task.opened_at),
        task.closed_at.map(|c| format!(", closed {}", text(c))).unwrap_or_default()
    );
    println!();
    println!("revisions:");
    for r in revisions {
        println!(
            "  r{:<3} {:<14} {:<8} {:<24} {}  {}{}",
            r.revision,
            r.kind,
            r.source,
            r.actor,
            r.at,
            r.summary,
            r.envelope_trace_id.as_ref().map(|t| format!(" [{t}]")).unwrap_or_default()
        );
        if let Some(text) = &r.text {
            println!("        text: {}", preview(text));
        }
        println!("        at that moment: {}", r.snapshot);
    }
    Ok(())
}

/// One room exchange: what started it, its speakers in order, and how it ended (who
/// stopped it, or what the ceiling left open).
async fn print_cascade(ledger: &Ledger, c: &StoredCascade) -> anyhow::Result<()> {
    let cascade = c.cascade().context("reading the stored exchange")?;
    println!("cascade:     {}", c.cascade_id);
    println!(
        "room:        {} (chat {}{})",
        c.route,
        c.chat_id,
        c.thread_id.map(|t| format!(", topic {t}")).unwrap_or_default()
    );
    println!("state:       {} (since {})", c.state, text(c.updated_at));
    println!(
        "started by:  {} with {} at {}",
        cascade.message().author,
        c.message_trace_id,
        c.started_at.map_or_else(|| "(not yet: waiting for the room)".to_owned(), text)
    );
    println!("message:     {}", preview(&cascade.message().text));
    println!(
        "limits:      cascade_limit {}, max_iters {}, speaker_timeout {}s; {} of {} turns used",
        cascade.cascade_limit(),
        c.max_iters,
        c.speaker_timeout_secs,
        cascade.turns_used(),
        cascade.cascade_limit()
    );
    let turns = ledger.turns_of(c.id).await?;
    println!("speakers ({}):", turns.len());
    for t in &turns {
        let ending = match (t.ending, &t.reply_text) {
            (Some(TurnEnding::Replied), Some(text)) => format!("replied \"{}\"", preview(text)),
            (Some(ending), _) => ending.as_str().to_owned(),
            (None, Some(_)) => "has the floor; its reply is being posted".to_owned(),
            (None, None) => format!("has the floor since {}", text(t.started_at)),
        };
        println!(
            "  {}. {:<16} summoned by {:<16} {} ({})",
            t.speaker, t.agent, t.summoned_by, ending, t.envelope_trace_id
        );
    }
    if !cascade.queue().is_empty() {
        let queued: Vec<&str> = cascade.queue().iter().map(|q| q.agent.as_str()).collect();
        println!("queued:      {}", queued.join(", "));
    }
    if let Some(stop) = cascade.stop_record() {
        let still: Vec<&str> = stop.still_queued.iter().map(|a| a.as_str()).collect();
        println!(
            "stop:        by {} at {}{}; still queued then: {}",
            stop.by,
            stop.at,
            stop.during.map(|s| format!(", during speaker {s}")).unwrap_or_default(),
            if still.is_empty() { "nobody".to_owned() } else { still.join(", ") }
        );
    }
    match &c.outcome_text {
        Some(text) => println!("outcome:\n  {}", text.replace('\n', "\n  ")),
        None if c.ended_at.is_some() => {
            println!(
                "outcome:     {} after {} turn(s), {} repl(ies); nothing was posted",
                c.state,
                cascade.turns_used(),
                cascade.replies()
            )
        }
        None => {}
    }
    let posts = ledger.posts_of(c.id).await?;
    if !posts.is_empty() {
        println!("posts ({}):", posts.len());
        for p in posts {
            println!(
                "  {} {}: \"{}\"",
                p.key,
                if p.made {
                    format!("made {}", p.made_at.map(text).unwrap_or_default())
                } else {
                    "owed".to_owned()
                },
                preview(&p.text)
            );
        }
    }
    Ok(())
}

/// The handoff an envelope carries: who asked whom, for which conversation, and its answer.
fn print_handoff(h: &StoredHandoff) {
    println!(
        "handoff:     {} ({}), {} → {}, depth {}",
        h.handoff_id, h.state, h.from_agent, h.to_agent, h.depth
    );
    println!("  cause:     {}", h.cause_trace_id.as_deref().unwrap_or("none (unprompted)"));
    if let (Some(earlier), Some(intent)) = (&h.followup_of, &h.intent) {
        println!("  follow-up: {intent} {earlier}");
    }
    println!("  instruction envelope: {}", h.envelope_trace_id);
    println!("  instruction: {}", preview(&h.instruction));
    match &h.answer_trace_id {
        Some(answer) => println!(
            "  answer:    {answer} at {}{}",
            h.closed_at.map_or_else(|| "-".to_owned(), text),
            h.note.as_deref().map(|note| format!(" (note: {note})")).unwrap_or_default()
        ),
        None => println!("  answer:    none yet (opened {})", text(h.opened_at)),
    }
}

/// The start of a text on one line.
fn preview(text: &str) -> String {
    const CHARS: usize = 60;
    let mut shown: String = text.chars().take(CHARS).collect::<String>().replace('\n', " ");
    if text.chars().count() > CHARS {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_name_is_refused_only_when_neither_the_configuration_nor_the_ledger_knows_it() {
        let declared = ["orchestrator".to_owned(), "worker".to_owned()];
        assert!(refuse_unknown_name("--agent", "agent", "worker", &declared, false).is_ok());
        assert!(refuse_unknown_name("--agent", "agent", "retired", &declared, true).is_ok(), "history");
        let refused =
            refuse_unknown_name("--agent", "agent", "wokrer", &declared, false).unwrap_err().to_string();
        assert!(refused.contains("wokrer") && refused.contains("orchestrator, worker"), "{refused}");
        let none = refuse_unknown_name("--room", "room route", "lab", &[], false).unwrap_err().to_string();
        assert!(none.contains("declared: none"), "{none}");
    }

    #[test]
    fn ages_are_a_whole_number_of_days_hours_or_minutes() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-03-01T12:00:00Z").unwrap().to_utc();
        let cutoff = |text: &str| OlderThan::parse(text).unwrap().cutoff(now).to_rfc3339();
        assert_eq!(cutoff("90d"), "2025-12-01T12:00:00+00:00");
        assert_eq!(cutoff("12h"), "2026-03-01T00:00:00+00:00");
        assert_eq!(cutoff(" 90min "), "2026-03-01T10:30:00+00:00");
        assert_eq!(OlderThan::parse("90d").unwrap().to_string(), "90d");
        assert_eq!(OlderThan::parse("90min").unwrap().to_string(), "90min");
        assert_eq!(cutoff("1h"), cutoff("60min"), "an hour is the shortest age");
    }

    #[test]
    fn a_bare_m_is_refused_as_minutes_or_months_and_months_are_given_in_days() {
        let refused = OlderThan::parse("3m").unwrap_err();
        assert!(refused.contains("min") && refused.contains("90d"), "{refused}");
        assert!(OlderThan::parse("90m").is_err(), "not read as minutes either");
    }

    #[test]
    fn zero_other_units_and_nonsense_are_refused_saying_why() {
        assert!(OlderThan::parse("0d").unwrap_err().contains("zero"));
        assert!(OlderThan::parse("00h").unwrap_err().contains("zero"));
        for text in ["", "d", "90", "90 d", "90D", "1w", "1.5d", "-1d", "+1d", "90dd", "1d12h"] {
            let refused = OlderThan::parse(text).unwrap_err();
            assert!(refused.contains("like 90d, 12h or 90min"), "{text}: {refused}");
        }
        for short in ["30min", "59min", "1min"] {
            assert!(OlderThan::parse(short).unwrap_err().contains("hour"), "{short}");
        }
        assert!(OlderThan::parse("99999999d").unwrap_err().contains("century"));
        assert!(OlderThan::parse("99999999999d").is_err());
    }
}
