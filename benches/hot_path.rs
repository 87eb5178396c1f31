//! The hot path against its floors (issue 11), measured side by side in one run on the
//! same fake Bot API (`switchboard::fake_bot_api`):
//!
//! * **one message at a time**: a user writes, the reply arrives at the fake, the next
//!   message goes out. The floor is a bare teloxide echo bot (a long `getUpdates` poll and
//!   one `sendMessage` per message, nothing else), run as a process of its own: this
//!   benchmark executes itself again with [`ECHO_ROLE_ENV`] set. switchboard is the release
//!   daemon plus a real `switchboard channel` child process, driven over stdio by a real
//!   rmcp MCP client that answers every `notifications/claude/channel` with the `reply`
//!   tool, as an agent session does. (That process becomes `switchboard-channel`, which
//!   cargo builds beside `switchboard`; to measure another build, give
//!   `SWITCHBOARD_BENCH_BIN` its `switchboard`, with its `switchboard-channel` beside
//!   it.) Then, with no message in flight, round trips on the two crossings switchboard
//!   adds to the echo bot's, with nothing done on them (`GET /healthz` on the local API,
//!   an MCP `ping` to the plugin): added to the echo loop, they are the floor of
//!   switchboard's process topology ([`Crossings`]). And the ledger's work on a message
//!   alone, through the daemon's own calls in this process ([`LedgerWork`]): with the
//!   crossings, the floor of this design.
//! * **durable ingest**: `getUpdates` → committed envelopes, against a raw batched insert
//!   loop of the same rows into a ledger with the same pragmas as the daemon's writer
//!   (WAL, `synchronous = normal`, its page cache and its `cache_spill`), through the same
//!   SQLite driver, 100 rows (one full `getUpdates` batch) per transaction. And the same
//!   burst fetched alone through the daemon's `getUpdates` client, nothing stored: a batch
//!   is fetched only once the one before is committed, so fetch and insert add up to the
//!   floor of this design.
//!
//! Every figure is printed beside its floor, with the ratio and the goal. CPU is
//! read from `/proc/<pid>/stat` (utime + stime of every process on the serving side:
//! the echo bot; the daemon and the plugin), memory from `/proc/<pid>/status` (VmRSS, once
//! warmed up and idle, and the daemon's again once an ingest burst is committed). The
//! scenarios run [`REPETITIONS`] times, interleaved, and each figure is the median of its
//! repetitions, so a noisy neighbour on a shared machine skews one repetition rather than
//! one side.
//!
//! With `SWITCHBOARD_BENCH_POSTGRES=1`, each repetition also runs switchboard's loop with its
//! ledger on PostgreSQL (the tests' server: `SWITCHBOARD_TEST_POSTGRES`, by default
//! `postgres://postgres@127.0.0.1:5432/test`, in a schema of its own that is dropped after),
//! and the report sets its figures beside the SQLite ledger's.
//!
//! Run it with `cargo bench --bench hot_path`; `SWITCHBOARD_BENCH_QUICK=1` makes a smoke
//! run of a few seconds. `SWITCHBOARD_BENCH_MESSAGES` (one-at-a-time messages per
//! repetition), `SWITCHBOARD_BENCH_UPDATES` (ingest) and `SWITCHBOARD_BENCH_REPETITIONS`
//! override single numbers; `SWITCHBOARD_BENCH_BIN` runs another `switchboard` binary (an
//! older build, or a wrapper that profiles it). The daemon runs with its default settings (log level `info`,
//! `synchronous = normal`) except per-chat pacing, which is off: the fake has no per-chat
//! limits and the echo bot does not pace either.

#[path = "common/agent_side.rs"]
mod agent_side;
mod common;
#[allow(dead_code)]
#[path = "../src/ledger/postgres/test_support.rs"]
mod postgres_schemas;

use std::fmt;

use agent_side::{AgentSession, PluginSpec, Process, thread_counters, threads_cpu_seconds};
use common::config::DaemonConfig;
use common::{PROCESS_POLL_INTERVAL, START_TIMEOUT, STEP_TIMEOUT};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::model::{ClientRequest, PingRequest};
use switchboard::app::reported_api_address;
use switchboard::config::{Database, Synchronous};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, TEST_TOKEN, UserSpec};
use switchboard::ids::{AgentName, RouteName, TraceId};
use switchboard::ledger::sqlite::{PAGE_CACHE_KIB, WRITER_SPILL_PAGES};
use switchboard::ledger::{
    AttemptMethod, AttemptOutcome, AttemptPurpose, EnvelopeKind, EnvelopeState, NewAttempt, RoutedEnvelope,
};
use switchboard::rules::routes::{Channel, RouteTarget};
use switchboard::telegram::envelope::{ChatType, Envelope, Sender};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// Runs another `switchboard` binary than the one this benchmark was built with (an older
/// build to compare against, or a wrapper that profiles it).
const BIN_ENV: &str = "SWITCHBOARD_BENCH_BIN";

fn switchboard_bin() -> PathBuf {
    std::env::var_os(BIN_ENV).map_or_else(|| PathBuf::from(BIN), PathBuf::from)
}

/// Set (to the fake's URL) in the environment of this benchmark's own child: it then runs
/// the teloxide echo bot instead of the benchmark.
const ECHO_ROLE_ENV: &str = "SB_HOT_PATH_ECHO_API_URL";

/// Interleaved repetitions; every figure is the median of its repetitions.
const REPETITIONS: usize = 3;

/// One-at-a-time messages per repetition and system: enough that the CPU figure (read in
/// clock ticks of 10 ms) is precise to a few percent even for the echo bot.
const MESSAGES: usize = 2_000;

/// Updates per ingest repetition: 200 full `getUpdates` batches.
const INGEST_UPDATES: usize = 20_000;

/// `SWITCHBOARD_BENCH_QUICK=1`: each part still runs, in seconds.
const QUICK_MESSAGES: usize = 100;
const QUICK_INGEST_UPDATES: usize = 2_000;
const QUICK_REPETITIONS: usize = 1;

/// Untimed messages first: they open every connection and warm every cache.
const WARMUP_MESSAGES: usize = 20;

/// After the warm-up, how long the serving side is left alone before its idle memory is
/// read: long enough for deferred work (a WAL checkpoint, a closed task) to end.
const IDLE_SETTLE: Duration = Duration::from_millis(300);

/// How long each serving side is watched doing nothing (issue 26's idle cost): long enough
/// that a timer firing every few seconds shows, that the long polls of both
/// (`telegram.poll_timeout_secs`, 10 s by default, and teloxide's 10 s) end and restart a
/// few times, and that the session stream's heartbeat comes once; the fake answers each
/// poll at its timeout, as Telegram does.
const IDLE_WINDOW: Duration = Duration::from_secs(40);
const QUICK_IDLE_WINDOW: Duration = Duration::from_secs(3);

/// How long each serving side winds down from its warm-up before the idle watch starts, so
/// that the watch counts a process waiting, not one finishing what the load left: tokio's
/// blocking threads end 10 s after their last task, the daemon's metrics are tidied 5 s
/// after their last sample.
const IDLE_WIND_DOWN: Duration = Duration::from_secs(15);
const QUICK_IDLE_WIND_DOWN: Duration = Duration::from_secs(1);

/// Round trips timed on each of switchboard's own crossings, once its loop is timed (see
/// [`Crossings`]).
const CROSSING_SAMPLES: usize = 500;

/// The CPU figure is given per this many messages, as in the issue.
const CPU_PER_MESSAGES: usize = 200;

/// Updates in one full `getUpdates` batch (Telegram's largest `limit`), as the daemon
/// asks for them.
const FULL_BATCH: u8 = 100;

/// Rows per raw-insert transaction: one full `getUpdates` batch, as the daemon commits.
const RAW_BATCH: usize = FULL_BATCH as usize;

/// How long an ingest burst may take to be committed: far beyond a healthy one.
const INGEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The one agent, its secret, and the private chat its route names.
/// The goal column of the one-at-a-time figures whose goals issue 26 withdrew: below what
/// this design allows (docs/performance.md, "The floor of this design").
const WITHDRAWN: &str = "withdrawn (issue 26)";

const AGENT: &str = "a0";
const AGENT_SECRET: &str = "bench-secret-of-agent-a0";
const AGENT_SECRET_ENV: &str = "SB_HOT_PATH_A0_SECRET";
const TOKEN_ENV: &str = "SB_HOT_PATH_BOT_TOKEN";
const CHAT_ID: i64 = 500_000_001;

/// What the agent answers to every message.
const AGENT_ANSWER: &str = "the answer";

fn main() {
    if let Ok(api_url) = std::env::var(ECHO_ROLE_ENV) {
        echo_bot(&api_url);
        return;
    }
    let params = Params::from_env();
    // The fake and the MCP client share one thread, so the benchmark competes as little as
    // possible with the processes it measures for the two cores.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the benchmark's tokio runtime");
    runtime.block_on(run(&params));
}

// ---------------------------------------------------------------------------
// The floor: a bare teloxide echo bot
// ---------------------------------------------------------------------------

/// teloxide's echo example: its dispatcher's default long poll, and one `sendMessage` per
/// text message. Runs until killed.
fn echo_bot(api_url: &str) {
    use teloxide::prelude::*;

    let runtime = tokio::runtime::Runtime::new().expect("building the echo bot's runtime");
    runtime.block_on(async {
        let bot = Bot::new(TEST_TOKEN).set_api_url(api_url.parse().expect("the fake's URL"));
        let handler = Update::filter_message().endpoint(|bot: Bot, message: Message| async move {
            if let Some(text) = message.text() {
                bot.send_message(message.chat.id, text).await?;
            }
            respond(())
        });
        Dispatcher::builder(bot, handler).build().dispatch().await;
    });
}

// ---------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------

struct Params {
    quick: bool,
    /// Also run the loop with the ledger on PostgreSQL.
    postgres: bool,
    idle_window: Duration,
    idle_wind_down: Duration,
    messages: usize,
    updates: usize,
    repetitions: usize,
}

impl Params {
    fn from_env() -> Self {
        let quick = common::quick();
        let (messages, updates, repetitions) = if quick {
            (QUICK_MESSAGES, QUICK_INGEST_UPDATES, QUICK_REPETITIONS)
        } else {
            (MESSAGES, INGEST_UPDATES, REPETITIONS)
        };
        Self {
            quick,
            postgres: std::env::var_os("SWITCHBOARD_BENCH_POSTGRES").is_some_and(|v| v != "0"),
            idle_window: if quick { QUICK_IDLE_WINDOW } else { IDLE_WINDOW },
            idle_wind_down: if quick { QUICK_IDLE_WIND_DOWN } else { IDLE_WIND_DOWN },
            messages: common::env_count("SWITCHBOARD_BENCH_MESSAGES", messages),
            updates: common::env_count("SWITCHBOARD_BENCH_UPDATES", updates),
            repetitions: common::env_count("SWITCHBOARD_BENCH_REPETITIONS", repetitions),
        }
    }
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Results {
    echo: Vec<LoopRun>,
    switchboard: Vec<LoopRun>,
    /// switchboard with its ledger on PostgreSQL (idle figures not watched).
    on_postgres: Vec<LoopRun>,
    raw_insert: Vec<Duration>,
    fetch: Vec<Duration>,
    ingest: Vec<IngestRun>,
    ledger_work: Vec<LedgerWork>,
}

/// What the daemon did with a burst of updates.
struct IngestRun {
    /// The first update pushed → the last one's offset confirmed.
    elapsed: Duration,
    /// The daemon's VmRSS in KiB once the burst is committed and checkpointed: what a
    /// burst leaves behind (the page caches stay at their size).
    rss_after_kib: u64,
}

async fn run(params: &Params) {
    let mut results = Results::default();
    for repetition in 1..=params.repetitions {
        eprintln!("repetition {repetition}/{}: echo floor…", params.repetitions);
        results.echo.push(echo_run(params).await);
        eprintln!("repetition {repetition}/{}: switchboard…", params.repetitions);
        results.switchboard.push(switchboard_run(params, Ledger::Sqlite).await);
        if params.postgres {
            eprintln!("repetition {repetition}/{}: switchboard on PostgreSQL…", params.repetitions);
            let schema = postgres_schemas::TestSchema::create().await;
            results.on_postgres.push(switchboard_run(params, Ledger::Postgres(&schema.url)).await);
            schema.drop().await;
        }
        eprintln!("repetition {repetition}/{}: the ledger's work alone…", params.repetitions);
        results.ledger_work.push(LedgerWork::measure(params.messages).await);
        eprintln!("repetition {repetition}/{}: raw SQLite insert…", params.repetitions);
        results.raw_insert.push(raw_insert_run(params).await);
        eprintln!("repetition {repetition}/{}: fetching alone…", params.repetitions);
        results.fetch.push(fetch_run(params).await);
        eprintln!("repetition {repetition}/{}: durable ingest…", params.repetitions);
        results.ingest.push(ingest_run(params).await);
    }
    print_report(params, &results);
}

/// What one system did with one message at a time.
struct LoopRun {
    /// Spawned → the fake saw its first `getUpdates`.
    spawn_to_poll: Duration,
    /// Message pushed at the fake → reply received by the fake, per message.
    loops: Vec<Duration>,
    /// Push → notification at the MCP client, and `reply` call → result (switchboard only).
    notification: Vec<Duration>,
    reply_call: Vec<Duration>,
    /// Wall time of the timed messages, one after the other.
    elapsed: Duration,
    /// CPU seconds of each serving process over the timed messages.
    cpu: Vec<(&'static str, f64)>,
    /// Each serving process's resident set, warmed up and idle.
    idle_rss: Vec<(&'static str, Resident)>,
    /// Each serving process over [`Params::idle_window`] with nothing to do.
    idle: Vec<(&'static str, Idle)>,
    /// switchboard's crossings with nothing done on them (switchboard only).
    crossings: Crossings,
}

/// A process's resident set, and the part of it that is its own memory rather than pages
/// of its executable (see `Process::anon_rss_kib`).
struct Resident {
    total_kib: u64,
    anon_kib: u64,
}

impl Resident {
    fn of(process: &Process) -> Self {
        Self { total_kib: process.rss_kib(), anon_kib: process.anon_rss_kib() }
    }
}

impl LoopRun {
    fn cpu_total(&self) -> f64 {
        self.cpu.iter().map(|(_, seconds)| seconds).sum()
    }

    /// Every serving process's idle figures added up, per idle hour and per second.
    fn idle_total(&self) -> (f64, f64) {
        let cpu_per_hour = self.idle.iter().map(|(_, idle)| idle.cpu_seconds_per_hour()).sum();
        let wakeups_per_second = self.idle.iter().map(|(_, idle)| idle.wakeups_per_second()).sum();
        (cpu_per_hour, wakeups_per_second)
    }
}

/// What a process did while it had nothing to do: its CPU time and its wake-ups, counted
/// as context switches (voluntary: a thread went to sleep after waking; and not), of each
/// of its threads (`/proc/<pid>/task/*/schedstat` and `status`). Counted per thread, so a
/// thread that ends during the watch (an idle blocking thread of tokio's pool) takes only
/// its own time since the watch began with it, rather than all it ever ran; a thread that
/// starts during it counts whole.
struct Idle {
    window: Duration,
    cpu_seconds: f64,
    context_switches: u64,
}

impl Idle {
    /// Watches these processes, together, for `window`.
    async fn watch(processes: &[&Process], window: Duration) -> Vec<(&'static str, Idle)> {
        let before: Vec<_> = processes.iter().map(|p| thread_counters(p.pid())).collect();
        tokio::time::sleep(window).await;
        processes
            .iter()
            .zip(before)
            .map(|(process, before)| {
                let (mut nanos, mut switches) = (0u64, 0u64);
                for (tid, (cpu, woke)) in thread_counters(process.pid()) {
                    let (cpu_before, woke_before) = before.get(&tid).copied().unwrap_or_default();
                    nanos += cpu.saturating_sub(cpu_before);
                    switches += woke.saturating_sub(woke_before);
                }
                let idle = Idle { window, cpu_seconds: nanos as f64 / 1e9, context_switches: switches };
                (process.name, idle)
            })
            .collect()
    }

    fn cpu_seconds_per_hour(&self) -> f64 {
        self.cpu_seconds * 3600.0 / self.window.as_secs_f64()
    }

    fn wakeups_per_second(&self) -> f64 {
        self.context_switches as f64 / self.window.as_secs_f64()
    }
}

/// The person who writes to the bot.
struct Speaker {
    chat: ChatSpec,
    user: UserSpec,
}

impl Speaker {
    fn new() -> Self {
        let user = UserSpec::new(CHAT_ID, "Bench user");
        Self { chat: ChatSpec::private_with(&user), user }
    }
}

/// Pushes one message and waits for the fake to receive the `count`th reply; returns the
/// time from the push to that reply.
async fn one_message(fake: &FakeTelegram, speaker: &Speaker, n: usize, count: usize) -> Option<Duration> {
    let question = format!("question {n}");
    let pushed = Instant::now();
    fake.push_text(&speaker.chat, &speaker.user, &question);
    let sent = fake.wait_for_nth_sent(count, STEP_TIMEOUT).await?;
    // Not a timing: the reply answers this message (the echo bot repeats it).
    assert!(sent.text == question || sent.text == AGENT_ANSWER, "an unexpected reply: {:?}", sent.text);
    assert_eq!(sent.chat_id, CHAT_ID, "a reply to another chat");
    Some(sent.received_at.duration_since(pushed))
}

async fn echo_run(params: &Params) -> LoopRun {
    let fake = FakeTelegram::start().await;
    let speaker = Speaker::new();
    let spawned = Instant::now();
    let child = Command::new(std::env::current_exe().expect("the benchmark's own path"))
        .env(ECHO_ROLE_ENV, fake.api_url())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the echo bot");
    let echo = Process::new("echo bot", child, None);
    fake.wait_for_get_updates_calls(1, START_TIMEOUT).await;
    let spawn_to_poll = spawned.elapsed();

    let mut count = 0;
    for n in 0..WARMUP_MESSAGES {
        count += 1;
        if one_message(&fake, &speaker, n, count).await.is_none() {
            echo.fail(&format!("warm-up message {n} got no echo"));
        }
    }
    tokio::time::sleep(IDLE_SETTLE).await;
    let idle_rss = vec![("echo bot", Resident::of(&echo))];
    tokio::time::sleep(params.idle_wind_down).await;
    let idle = Idle::watch(&[&echo], params.idle_window).await;

    let cpu_before = echo.cpu_seconds();
    let started = Instant::now();
    let mut loops = Vec::with_capacity(params.messages);
    for n in 0..params.messages {
        count += 1;
        match one_message(&fake, &speaker, WARMUP_MESSAGES + n, count).await {
            Some(took) => loops.push(took),
            None => echo.fail(&format!("message {n} got no echo")),
        }
    }
    let elapsed = started.elapsed();
    let cpu = vec![("echo bot", echo.cpu_seconds() - cpu_before)];
    drop(echo);
    fake.shutdown().await;
    LoopRun {
        spawn_to_poll,
        loops,
        notification: Vec::new(),
        reply_call: Vec::new(),
        elapsed,
        cpu,
        idle_rss,
        idle,
        crossings: Crossings::default(),
    }
}

/// Where a run's daemon keeps its ledger.
#[derive(Clone, Copy)]
enum Ledger<'a> {
    /// A file in the run's directory.
    Sqlite,
    /// This URL's schema.
    Postgres(&'a str),
}

async fn switchboard_run(params: &Params, ledger: Ledger<'_>) -> LoopRun {
    let fake = FakeTelegram::start().await;
    let speaker = Speaker::new();
    let workdir = Workdir::new(&fake.api_url(), ledger);
    let spawned = Instant::now();
    let mut daemon = workdir.start_daemon();
    fake.wait_for_get_updates_calls(1, START_TIMEOUT).await;
    let spawn_to_poll = spawned.elapsed();
    workdir.wait_until_listening(&daemon).await;

    let bin = switchboard_bin();
    let (config, log) = (workdir.config(), workdir.plugin_log());
    let mut agent = AgentSession::start(&PluginSpec {
        bin: &bin,
        config: &config,
        agent: AGENT,
        secret_env: AGENT_SECRET_ENV,
        secret: AGENT_SECRET,
        api_addr: workdir.api_addr(),
        log: &log,
        answer: AGENT_ANSWER,
    })
    .await;
    let mut count = 0;
    for n in 0..WARMUP_MESSAGES {
        count += 1;
        if one_message(&fake, &speaker, n, count).await.is_none() {
            daemon.fail(&format!("warm-up message {n} got no reply"));
        }
    }
    tokio::time::sleep(IDLE_SETTLE).await;
    let idle_rss = vec![("daemon", Resident::of(&daemon)), ("plugin", Resident::of(&agent.plugin))];
    // The idle figures are SQLite's daemon's; on PostgreSQL the loop is what is compared.
    let idle = match ledger {
        Ledger::Sqlite => {
            tokio::time::sleep(params.idle_wind_down).await;
            Idle::watch(&[&daemon, &agent.plugin], params.idle_window).await
        }
        Ledger::Postgres(_) => Vec::new(),
    };
    let answered_before = count;

    let cpu_before = (daemon.cpu_seconds(), agent.plugin.cpu_seconds());
    let started = Instant::now();
    let mut pushes = Vec::with_capacity(params.messages);
    let mut loops = Vec::with_capacity(params.messages);
    for n in 0..params.messages {
        count += 1;
        pushes.push(Instant::now());
        match one_message(&fake, &speaker, WARMUP_MESSAGES + n, count).await {
            Some(took) => loops.push(took),
            None => daemon.fail(&format!("message {n} got no reply")),
        }
    }
    let elapsed = started.elapsed();
    let cpu = vec![
        ("daemon", daemon.cpu_seconds() - cpu_before.0),
        ("plugin", agent.plugin.cpu_seconds() - cpu_before.1),
    ];

    let timings = agent.collect_timings(answered_before + params.messages).await;
    let timed = &timings[answered_before..];
    let notification =
        timed.iter().zip(&pushes).map(|(t, pushed)| t.notified.duration_since(*pushed)).collect();
    let reply_call = timed.iter().map(|t| t.returned.duration_since(t.called)).collect();
    let crossings = Crossings::measure(&workdir, &daemon, &agent).await;

    agent.close().await;
    daemon.stop();
    fake.shutdown().await;
    LoopRun { spawn_to_poll, loops, notification, reply_call, elapsed, cpu, idle_rss, idle, crossings }
}

/// Round trips on the two crossings switchboard adds to the echo bot's, with nothing done
/// on them: an HTTP request to the daemon's local API that reads and writes nothing
/// (`GET /healthz`, on the plugins' listener, over a kept-alive connection as a plugin's),
/// and an MCP `ping` to the plugin over its stdio. A message crosses six process
/// boundaries where the echo bot's crosses two (fake → daemon → plugin → agent → plugin →
/// daemon → fake): the echo loop plus one round trip on each of these is what a loop that
/// did nothing at all on its way would take on this machine, the floor of this process
/// topology.
///
/// Their CPU is a floor too, if a loose one: what the daemon and the plugin each spend on
/// a request they answer at once. A message costs each of them more on these crossings
/// (the daemon also streams the message to the plugin; the plugin is also the local API's
/// client).
#[derive(Default)]
struct Crossings {
    local_api: Vec<Duration>,
    mcp: Vec<Duration>,
    /// The daemon's CPU seconds per local API round trip.
    local_api_cpu: f64,
    /// The plugin's CPU seconds per MCP round trip.
    mcp_cpu: f64,
}

impl Crossings {
    async fn measure(workdir: &Workdir, daemon: &Process, agent: &AgentSession) -> Self {
        let url = format!("http://{}/healthz", workdir.api_addr());
        let http = reqwest::Client::new();
        let peer = agent.client.peer();
        let mut crossings = Self::default();
        let cpu_before = daemon.cpu_seconds_fine();
        for _ in 0..CROSSING_SAMPLES {
            let started = Instant::now();
            match http.get(&url).send().await {
                Ok(response) if response.status().is_success() => {
                    let _ = response.bytes().await;
                }
                failed => daemon.fail(&format!("GET /healthz failed: {failed:?}")),
            }
            crossings.local_api.push(started.elapsed());
        }
        crossings.local_api_cpu = (daemon.cpu_seconds_fine() - cpu_before) / CROSSING_SAMPLES as f64;

        let cpu_before = agent.plugin.cpu_seconds_fine();
        for _ in 0..CROSSING_SAMPLES {
            let started = Instant::now();
            if let Err(error) = peer.send_request(ClientRequest::PingRequest(PingRequest::default())).await {
                agent.plugin.fail(&format!("an MCP ping failed: {error}"));
            }
            crossings.mcp.push(started.elapsed());
        }
        crossings.mcp_cpu = (agent.plugin.cpu_seconds_fine() - cpu_before) / CROSSING_SAMPLES as f64;
        crossings
    }
}

// ---------------------------------------------------------------------------
// The ledger's work on a message, alone
// ---------------------------------------------------------------------------

/// What the ledger does for one message, through the daemon's own calls, in this process
/// with nothing else around it: intake's commit (the envelope, its task, the offset and the
/// hand-over to a connected session, in one transaction), the lookup of a reply that names
/// the envelope, the attempt's commit before `sendMessage` and the outcome's after it.
/// Intake's commit and the attempt's are on the loop's path: the agent is not shown a
/// message until it is stored (DESIGN.md §2), and nothing is sent before its attempt is
/// (§4). With the six crossings ([`Crossings`]) they are the floor of this design: what a
/// loop would take that did nothing else.
#[derive(Default)]
struct LedgerWork {
    intake: Vec<Duration>,
    lookup: Vec<Duration>,
    attempt: Vec<Duration>,
    outcome: Vec<Duration>,
    /// CPU seconds per message of this process's threads: the calling one, and the
    /// ledger's checkpointer.
    cpu: f64,
}

impl LedgerWork {
    async fn measure(messages: usize) -> Self {
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let ledger =
            switchboard::ledger::open(&Database::Sqlite(dir.path().join("work.db")), Synchronous::Normal)
                .await
                .expect("creating the ledger");
        let agent = AgentName::parse(AGENT).expect("the agent's name");
        let actor = format!("agent:{AGENT}");
        let mut work = Self::default();
        let mut cpu_before = 0.0;
        for n in 0..WARMUP_MESSAGES + messages {
            let timed = n >= WARMUP_MESSAGES;
            if n == WARMUP_MESSAGES {
                cpu_before = threads_cpu_seconds(std::process::id());
            }
            let routed = routed_message(n, &agent);
            let update_id = routed.envelope.update_id;

            let started = Instant::now();
            let recorded = ledger
                .record_batch_handing_over(
                    BENCH_BOT_ID,
                    update_id + 1,
                    std::slice::from_ref(&routed),
                    &[&agent],
                    None,
                )
                .await
                .expect("recording a message");
            let intake = started.elapsed();
            let [handed] = recorded.claimed.as_slice() else {
                panic!("intake handed over {} envelopes, not the one it recorded", recorded.claimed.len())
            };

            let started = Instant::now();
            let found = ledger
                .find_for_reply(&handed.trace_id)
                .await
                .expect("looking up a reply's envelope")
                .expect("the envelope just recorded");
            let lookup = started.elapsed();

            let envelope = &found.envelope;
            let started = Instant::now();
            let op_id = ledger
                .begin_attempt(&NewAttempt {
                    envelope_id: envelope.id,
                    agent: AGENT,
                    request_id: Some(&format!("req-{n}")),
                    purpose: AttemptPurpose::Reply,
                    method: AttemptMethod::SendMessage,
                    target_message_id: None,
                    chat_id: envelope.chat_id,
                    thread_id: None,
                    reply_to_message_id: i32::try_from(envelope.message_id).ok(),
                    chunk_index: 0,
                    chunk_count: 1,
                    text: AGENT_ANSWER,
                })
                .await
                .expect("recording an attempt")
                .unwrap_or_else(|refusal| panic!("a reply was refused: {refusal:?}"));
            let attempt = started.elapsed();

            let started = Instant::now();
            let sent = AttemptOutcome::Sent { message_id: i32::try_from(n + 1).expect("a message id") };
            ledger.finish_attempt(&op_id, &sent, &actor).await.expect("recording an outcome");
            let outcome = started.elapsed();

            if timed {
                work.intake.push(intake);
                work.lookup.push(lookup);
                work.attempt.push(attempt);
                work.outcome.push(outcome);
            }
        }
        work.cpu = (threads_cpu_seconds(std::process::id()) - cpu_before) / messages as f64;

        // Not a timing: every message ended answered, as in the daemon.
        let acked: i64 = rusqlite::Connection::open(dir.path().join("work.db"))
            .and_then(|db| {
                db.query_row("SELECT COUNT(*) FROM envelopes WHERE state = 'acked'", [], |row| row.get(0))
            })
            .expect("counting envelopes");
        assert_eq!(acked, (WARMUP_MESSAGES + messages) as i64, "every message should be answered");
        ledger.close().await;
        work
    }
}

/// The getUpdates offset's row in the ledger's own measurement.
const BENCH_BOT_ID: i64 = 1;

/// The `n`th message of the ledger's own measurement, as the poller routes one: to the
/// agent, in the benchmark's private chat.
fn routed_message(n: usize, agent: &AgentName) -> RoutedEnvelope {
    let update_id = 100_000 + n as i64;
    let text = format!("question {n}");
    RoutedEnvelope {
        envelope: Envelope {
            trace_id: TraceId::generate(),
            update_id,
            kind: EnvelopeKind::Message,
            channel: Channel { chat_id: CHAT_ID, thread_id: None },
            chat_type: ChatType::Private,
            chat_title: None,
            message_id: i32::try_from(n + 1).expect("a message id"),
            sender: Sender { id: Some(CHAT_ID), username: None, name: "Bench user".into() },
            text: Some(text),
            attachments: Vec::new(),
            described: None,
            context: Default::default(),
            sent_at: chrono::Utc::now(),
        },
        state: EnvelopeState::Queued,
        route: Some(RouteName::parse("dm-a0").expect("the route's name")),
        agent: Some(agent.clone()),
        update_digest: format!("{:064x}", n as u128 * 0x9E37_79B9_7F4A_7C15),
        note: None,
        raw_update: None,
    }
}

// ---------------------------------------------------------------------------
// Durable ingest and its floor
// ---------------------------------------------------------------------------

/// The daemon polls an empty fake with no session connected; every update is pushed at
/// once, and the clock runs until the fake sees the offset that confirms the last one (the
/// offset is committed in the transaction that stores its batch).
async fn ingest_run(params: &Params) -> IngestRun {
    let fake = FakeTelegram::start().await;
    let workdir = Workdir::new(&fake.api_url(), Ledger::Sqlite);
    let mut daemon = workdir.start_daemon();
    fake.wait_for_get_updates_calls(1, START_TIMEOUT).await;
    workdir.wait_until_listening(&daemon).await;

    let last = push_burst(&fake, params.updates);
    // The waiting long poll runs only once this task yields: the clock starts first.
    let started = Instant::now();
    tokio::time::timeout(INGEST_TIMEOUT, fake.wait_until_confirmed(last, INGEST_TIMEOUT))
        .await
        .unwrap_or_else(|_| daemon.fail("the daemon did not confirm every update"));
    let elapsed = started.elapsed();
    // Past the checkpoint that follows the burst.
    tokio::time::sleep(IDLE_SETTLE).await;
    let rss_after_kib = daemon.rss_kib();
    daemon.stop();
    fake.shutdown().await;

    // Not a timing: a check that the run stored what it claims to have measured.
    let stored: i64 = rusqlite::Connection::open(workdir.database())
        .and_then(|db| {
            db.query_row("SELECT COUNT(*) FROM envelopes WHERE state = 'queued'", [], |row| row.get(0))
        })
        .expect("counting envelopes");
    assert_eq!(stored, params.updates as i64, "every update should be a queued envelope");
    IngestRun { elapsed, rss_after_kib }
}

/// Queues `updates` text messages from the bench's speaker at once, as a backlog; returns
/// the last one's update id.
fn push_burst(fake: &FakeTelegram, updates: usize) -> i64 {
    let speaker = Speaker::new();
    let mut last = 0;
    for n in 0..updates {
        last = fake.push_text(&speaker.chat, &speaker.user, &format!("update {n}"));
    }
    last
}

/// What a poller pays before it stores anything: the same burst fetched from the same
/// fake through the daemon's own `getUpdates` client, in full batches, each call confirming
/// the batch before, until the fake has seen the offset that confirms the last update, as
/// in [`ingest_run`]. Nothing is read or stored. A poller may ask for the next batch only
/// once it has committed the one before (the offset confirms it to Telegram), so fetching
/// and storing add up: with the raw insert, this is the floor of durable ingest.
async fn fetch_run(params: &Params) -> Duration {
    use switchboard::telegram::updates::UpdatesClient;

    let fake = FakeTelegram::start().await;
    let bot = teloxide::Bot::new(TEST_TOKEN).set_api_url(fake.api_url().parse().expect("the fake's URL"));
    let client = UpdatesClient::new(&bot);
    let last = push_burst(&fake, params.updates);
    let started = Instant::now();
    let mut offset = None;
    while offset <= Some(last) {
        let batch = client.get_updates(offset, Duration::ZERO, FULL_BATCH).await.expect("fetching a batch");
        if let Some(newest) = batch.iter().filter_map(|update| update.update_id).max() {
            offset = Some(newest + 1);
        }
    }
    let elapsed = started.elapsed();
    fake.shutdown().await;
    elapsed
}

/// One envelope row as the poller writes it.
struct Row {
    trace_id: String,
    update_id: i64,
    digest: String,
    content: String,
}

/// The same rows inserted straight into a migrated ledger, [`RAW_BATCH`] per transaction,
/// with the pragmas the daemon uses. The rows are made before the clock starts.
async fn raw_insert_run(params: &Params) -> Duration {
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let path = dir.path().join("raw.db");
    switchboard::ledger::open(&Database::Sqlite(path.clone()), Synchronous::Normal)
        .await
        .expect("creating the ledger")
        .close()
        .await;
    let mut connection = rusqlite::Connection::open(&path).expect("opening the raw connection");
    connection
        .execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
             PRAGMA cache_size = {PAGE_CACHE_KIB}; PRAGMA cache_spill = {WRITER_SPILL_PAGES};"
        ))
        .expect("setting up the raw connection");
    let rows: Vec<Row> = (0..params.updates)
        .map(|n| Row {
            // Random, as the poller's: the unique index on trace ids takes each row on
            // a leaf of its own, which a sequence would not.
            trace_id: TraceId::generate().to_string(),
            update_id: 100_000 + n as i64,
            digest: format!("{:064x}", n as u128 * 0x9E37_79B9_7F4A_7C15),
            content: format!("update {n}"),
        })
        .collect();
    let now = "2026-01-01T00:00:00.000Z";

    let started = Instant::now();
    for batch in rows.chunks(RAW_BATCH) {
        let tx =
            connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).expect("BEGIN");
        // One prepared statement, run once per row: the least SQLite needs for the batch.
        let mut insert = tx
            .prepare_cached(
                "INSERT INTO envelopes (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, \
                 chat_title, message_id, sender_id, sender_username, sender_name, text, attachments, content, \
                 sent_at, received_at, route, agent, state, state_changed_at, note, raw_update) \
                 VALUES (?1, ?2, ?3, 'message', ?4, NULL, 'private', NULL, ?2, ?4, NULL, 'Bench user', ?5, '[]', \
                 ?5, ?6, ?6, 'dm-a0', ?7, 'queued', ?6, NULL, NULL)",
            )
            .expect("preparing the insert");
        for row in batch {
            insert
                .execute(rusqlite::params![
                    row.trace_id,
                    row.update_id,
                    row.digest,
                    CHAT_ID,
                    row.content,
                    now,
                    AGENT
                ])
                .expect("inserting a row");
        }
        drop(insert);
        tx.commit().expect("COMMIT");
    }
    let elapsed = started.elapsed();
    drop(connection);
    elapsed
}

/// A temporary directory with one run's configuration, ledger and logs.
struct Workdir {
    dir: tempfile::TempDir,
    /// Where the local API listens, once the daemon has reported it (the file says port 0).
    listen: std::sync::OnceLock<SocketAddr>,
}

impl Workdir {
    fn new(api_url: &str, ledger: Ledger<'_>) -> Self {
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let workdir = Self { dir, listen: std::sync::OnceLock::new() };
        let config = daemon_config(api_url, &workdir.database());
        let config = match ledger {
            Ledger::Sqlite => config,
            Ledger::Postgres(url) => config.on_postgres(url),
        };
        config.write(&workdir.config());
        workdir
    }

    fn database(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    /// The local API's address, as the daemon reported it.
    fn api_addr(&self) -> SocketAddr {
        *self.listen.get().expect("the daemon has reported where it listens (wait_until_listening)")
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("switchboard.toml")
    }

    fn plugin_log(&self) -> PathBuf {
        self.dir.path().join("plugin.log")
    }

    fn daemon_log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    fn start_daemon(&self) -> Process {
        let log = std::fs::File::create(self.daemon_log()).expect("creating the daemon's log");
        let child = Command::new(switchboard_bin())
            .args(["run", "--config"])
            .arg(self.config())
            .env(TOKEN_ENV, TEST_TOKEN)
            .env(AGENT_SECRET_ENV, AGENT_SECRET)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting switchboard run");
        Process::new("daemon", child, Some(self.daemon_log()))
    }

    async fn wait_until_listening(&self, daemon: &Process) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let log = std::fs::read_to_string(self.daemon_log()).unwrap_or_default();
            if let Some(addr) = reported_api_address(&log) {
                self.listen.get_or_init(|| addr);
                return;
            }
            if Instant::now() > deadline {
                daemon.fail(&format!("the daemon did not listen within {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(PROCESS_POLL_INTERVAL).await;
        }
    }
}

/// The defaults an operator runs with (log level info, `synchronous = normal`), one agent
/// routed from one private chat, and no per-chat pacing (see the module documentation).
fn daemon_config(api_url: &str, database: &Path) -> DaemonConfig {
    DaemonConfig::new(TOKEN_ENV, api_url, database).agent(AGENT, AGENT_SECRET_ENV).route(
        &format!("dm-{AGENT}"),
        RouteTarget::Chat { chat_id: CHAT_ID },
        AGENT,
    )
}

// ---------------------------------------------------------------------------
// Statistics and the report
// ---------------------------------------------------------------------------

/// The nearest-rank percentile: the smallest sample that at least `p` percent of all
/// samples do not exceed.
fn percentile(samples: &[Duration], p: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    common::percentile(&sorted, p)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// The median over repetitions of a figure of each.
fn across<T>(runs: &[T], figure: impl Fn(&T) -> f64) -> f64 {
    median(runs.iter().map(figure).collect())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One row of the report: a figure, its floor, the ratio and the goal.
struct Line {
    label: &'static str,
    floor: String,
    ours: String,
    ratio: Option<f64>,
    goal: &'static str,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ratio = self.ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×"));
        write!(f, "{:<44} {:>14} {:>30} {:>8}  {}", self.label, self.floor, self.ours, ratio, self.goal)
    }
}

fn print_report(params: &Params, results: &Results) {
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let (echo, ours) = (&results.echo, &results.switchboard);
    println!();
    println!("switchboard hot path against its floors ({profile}, {cores} cores)");
    println!(
        "{} repetitions, interleaved, medians; {} one-at-a-time messages each (after {WARMUP_MESSAGES} \
         untimed); {} updates ingested each{}",
        params.repetitions,
        params.messages,
        params.updates,
        if params.quick { "; QUICK smoke run" } else { "" }
    );
    println!(
        "idle: each side watched {:.0} s with nothing to do, from {:.0} s after its warm-up",
        params.idle_window.as_secs_f64(),
        params.idle_wind_down.as_secs_f64()
    );
    println!();
    println!(
        "{:<44} {:>14} {:>30} {:>8}  goal",
        "one message at a time", "echo floor", "switchboard", "ratio"
    );

    let p = |runs: &[LoopRun], pct| across(runs, |r| millis(percentile(&r.loops, pct)));
    let (floor_p50, ours_p50) = (p(echo, 50), p(ours, 50));
    let (floor_p99, ours_p99) = (p(echo, 99), p(ours, 99));
    let rate = |runs: &[LoopRun]| across(runs, |r| r.loops.len() as f64 / r.elapsed.as_secs_f64());
    let (floor_rate, ours_rate) = (rate(echo), rate(ours));
    let per = CPU_PER_MESSAGES as f64;
    let cpu = |runs: &[LoopRun], name: Option<&str>| {
        across(runs, |r| {
            let seconds = match name {
                None => r.cpu_total(),
                Some(name) => r.cpu.iter().filter(|(n, _)| *n == name).map(|(_, s)| s).sum(),
            };
            seconds * per / r.loops.len() as f64
        })
    };
    let (floor_cpu, ours_cpu) = (cpu(echo, None), cpu(ours, None));
    let resident = |runs: &[LoopRun], name: &str, kib: fn(&Resident) -> u64| {
        across(runs, |r| r.idle_rss.iter().find(|(n, _)| *n == name).map_or(0.0, |(_, k)| kib(k) as f64))
            / 1024.0
    };
    // VmRSS, and in brackets the process's own memory in it (see `Resident`).
    let rss = |runs: &[LoopRun], name: &str| {
        format!(
            "{:.1} ({:.1} own)",
            resident(runs, name, |r| r.total_kib),
            resident(runs, name, |r| r.anon_kib)
        )
    };
    let spawn = |runs: &[LoopRun]| across(runs, |r| millis(r.spawn_to_poll));
    let idle_cpu = |runs: &[LoopRun]| across(runs, |r| r.idle_total().0);
    let idle_wakeups = |runs: &[LoopRun]| across(runs, |r| r.idle_total().1);
    let idle_of = |runs: &[LoopRun], name: &str| {
        let figure = |r: &LoopRun, of: fn(&Idle) -> f64| {
            r.idle.iter().find(|(n, _)| *n == name).map_or(0.0, |(_, idle)| of(idle))
        };
        (
            across(runs, |r| figure(r, Idle::cpu_seconds_per_hour)),
            across(runs, |r| figure(r, Idle::wakeups_per_second)),
        )
    };
    // Both idle figures side by side: the echo bot's, switchboard's and its two processes'.
    let idle_line = |label, total: &dyn Fn(&[LoopRun]) -> f64, figure: usize| {
        let part = |name| {
            let (cpu, wakeups) = idle_of(ours, name);
            [cpu, wakeups][figure]
        };
        Line {
            label,
            floor: format!("{:.2}", total(echo)),
            ours: format!("{:.2} (daemon {:.2}, plugin {:.2})", total(ours), part("daemon"), part("plugin")),
            ratio: Some(total(ours) / total(echo)),
            goal: "≤ 1.0×",
        }
    };

    let lines = [
        Line {
            label: "loop p50 (message at the fake → reply there)",
            floor: format!("{floor_p50:.2} ms"),
            ours: format!("{ours_p50:.2} ms"),
            ratio: Some(ours_p50 / floor_p50),
            goal: WITHDRAWN,
        },
        Line {
            label: "loop p99",
            floor: format!("{floor_p99:.2} ms"),
            ours: format!("{ours_p99:.2} ms"),
            ratio: Some(ours_p99 / floor_p99),
            goal: "",
        },
        Line {
            label: "messages per second, one at a time",
            floor: format!("{floor_rate:.0}"),
            ours: format!("{ours_rate:.0}"),
            ratio: Some(ours_rate / floor_rate),
            goal: WITHDRAWN,
        },
        Line {
            label: "CPU seconds per 200 messages",
            floor: format!("{floor_cpu:.3}"),
            ours: format!(
                "{ours_cpu:.3} (daemon {:.3}, plugin {:.3})",
                cpu(ours, Some("daemon")),
                cpu(ours, Some("plugin"))
            ),
            ratio: Some(ours_cpu / floor_cpu),
            goal: WITHDRAWN,
        },
        Line {
            label: "idle RSS (VmRSS)",
            floor: format!("{} MiB", rss(echo, "echo bot")),
            ours: format!("daemon {} / plugin {} MiB", rss(ours, "daemon"), rss(ours, "plugin")),
            ratio: None,
            goal: "daemon ≤ 12, plugin ≤ 8 MiB",
        },
        idle_line("idle: CPU seconds per hour", &idle_cpu, 0),
        idle_line("idle: wake-ups per second", &idle_wakeups, 1),
        Line {
            label: "spawn → first getUpdates",
            floor: format!("{:.0} ms", spawn(echo)),
            ours: format!("{:.0} ms", spawn(ours)),
            ratio: Some(spawn(ours) / spawn(echo)),
            goal: "",
        },
    ];
    for line in &lines {
        println!("{line}");
    }
    let hop = |pick: fn(&LoopRun) -> &Vec<Duration>, pct| across(ours, |r| millis(percentile(pick(r), pct)));
    println!(
        "  at the MCP client: message at the fake → notification {:.2} / {:.2} ms (p50 / p99); \
         reply call → result {:.2} / {:.2} ms",
        hop(|r| &r.notification, 50),
        hop(|r| &r.notification, 99),
        hop(|r| &r.reply_call, 50),
        hop(|r| &r.reply_call, 99),
    );
    let (api_trip, mcp_trip) = (hop(|r| &r.crossings.local_api, 50), hop(|r| &r.crossings.mcp, 50));
    let crossings_only = floor_p50 + api_trip + mcp_trip;
    println!(
        "  six crossings, nothing done on them: echo loop {floor_p50:.2} + local API round trip \
         {api_trip:.2} + MCP round trip {mcp_trip:.2} = {crossings_only:.2} ms, {:.2}× the floor \
         (p50s)",
        crossings_only / floor_p50
    );
    let (api_cpu, mcp_cpu) =
        (across(ours, |r| r.crossings.local_api_cpu * per), across(ours, |r| r.crossings.mcp_cpu * per));
    let crossings_cpu = floor_cpu + api_cpu + mcp_cpu;
    println!(
        "    their CPU seconds per 200: echo bot {floor_cpu:.3} + daemon answering the local API \
         {api_cpu:.3} + plugin answering MCP {mcp_cpu:.3} = {crossings_cpu:.3}, {:.2}× the floor",
        crossings_cpu / floor_cpu
    );
    let work = &results.ledger_work;
    let step = |pick: fn(&LedgerWork) -> &Vec<Duration>| across(work, |w| millis(percentile(pick(w), 50)));
    let (intake, lookup, attempt, outcome) =
        (step(|w| &w.intake), step(|w| &w.lookup), step(|w| &w.attempt), step(|w| &w.outcome));
    println!(
        "  the ledger's work on a message alone, in one process (p50s): intake's commit {intake:.3} + \
         the reply's lookup {lookup:.3} + the attempt's commit {attempt:.3} ms on the loop's path; \
         the outcome's commit {outcome:.3} ms"
    );
    let design_floor = crossings_only + intake + lookup + attempt;
    let work_cpu = across(work, |w| w.cpu * per);
    let design_cpu = crossings_cpu + work_cpu;
    println!(
        "    with the six crossings, the floor of this design: {design_floor:.2} ms, {:.2}× the echo \
         loop; CPU seconds per 200 {:.3} + {work_cpu:.3} = {design_cpu:.3}, {:.2}× the floor",
        design_floor / floor_p50,
        crossings_cpu,
        design_cpu / floor_cpu
    );
    println!();
    if !results.on_postgres.is_empty() {
        print_on_postgres(ours, &results.on_postgres);
    }

    let per_second =
        |runs: &[Duration]| median(runs.iter().map(|d| params.updates as f64 / d.as_secs_f64()).collect());
    let (raw, ingest) = (
        per_second(&results.raw_insert),
        per_second(&results.ingest.iter().map(|run| run.elapsed).collect::<Vec<_>>()),
    );
    // Fetching and storing one after the other, repetition by repetition.
    let design: Vec<Duration> =
        results.raw_insert.iter().zip(&results.fetch).map(|(raw, fetch)| *raw + *fetch).collect();
    let (fetch, design) = (per_second(&results.fetch), per_second(&design));
    println!("{:<44} {:>14} {:>30} {:>8}  goal", "durable ingest", "raw SQLite", "switchboard", "ratio");
    println!(
        "{}",
        Line {
            label: "envelopes per second (getUpdates → committed)",
            floor: format!("{raw:.0}"),
            ours: format!("{ingest:.0}"),
            ratio: Some(ingest / raw),
            goal: "≥ 0.9×",
        }
    );
    println!(
        "  fetching alone (the daemon's getUpdates client, nothing stored): {fetch:.0} a second; \
         fetch then raw insert, the floor of this design: {design:.0} a second, {:.2}× the raw insert; \
         switchboard {:.2}× that floor",
        design / raw,
        ingest / design
    );
    println!(
        "  daemon RSS once the burst is committed, idle: {:.1} MiB",
        across(&results.ingest, |run| run.rss_after_kib as f64) / 1024.0
    );
}

/// The loop with its ledger on PostgreSQL beside the same loop on SQLite, in one run.
fn print_on_postgres(sqlite: &[LoopRun], postgres: &[LoopRun]) {
    println!("{:<44} {:>14} {:>30} {:>8}  goal", "the ledger on PostgreSQL", "SQLite", "PostgreSQL", "ratio");
    let p = |runs: &[LoopRun], pct| across(runs, |r| millis(percentile(&r.loops, pct)));
    let per = CPU_PER_MESSAGES as f64;
    let daemon_cpu = |runs: &[LoopRun]| {
        across(runs, |r| {
            r.cpu.iter().filter(|(n, _)| *n == "daemon").map(|(_, s)| s).sum::<f64>() * per
                / r.loops.len() as f64
        })
    };
    let lines = [
        (
            "loop p50",
            format!("{:.2} ms", p(sqlite, 50)),
            format!("{:.2} ms", p(postgres, 50)),
            p(postgres, 50) / p(sqlite, 50),
        ),
        (
            "loop p99",
            format!("{:.2} ms", p(sqlite, 99)),
            format!("{:.2} ms", p(postgres, 99)),
            p(postgres, 99) / p(sqlite, 99),
        ),
        (
            "daemon CPU seconds per 200 messages",
            format!("{:.3}", daemon_cpu(sqlite)),
            format!("{:.3}", daemon_cpu(postgres)),
            daemon_cpu(postgres) / daemon_cpu(sqlite),
        ),
    ];
    for (label, floor, ours, ratio) in lines {
        println!("{}", Line { label, floor, ours, ratio: Some(ratio), goal: "printed (issue 24)" });
    }
    println!("  PostgreSQL's own CPU (the server's processes) is not counted.");
    println!();
}
