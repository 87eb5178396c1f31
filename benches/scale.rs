//! Many routes and many sessions (issue 26): the release daemon with 500 routes for 50
//! agents, each agent a real `switchboard channel` child driven by a real rmcp MCP client
//! (`common/agent_side.rs`, as in `hot_path`), beside the same daemon with 5 routes for 5
//! agents, on the same fake Bot API (`switchboard::fake_bot_api`) in one run.
//!
//! Half the routes are private chats, half forum topics (ten to a forum), so routing sees
//! both kinds of target; each agent owns as many routes as every other. One message at a
//! time, round-robin over every route: the user writes, the agent's plugin pushes the
//! envelope, the MCP client answers with `reply` naming it, the reply arrives at the fake
//! in the route's chat and topic (checked, not timed). Printed beside the goals:
//!
//! * the daemon's resident memory (VmRSS) once every session is connected and the warm-up
//!   is answered, and its peak (VmHWM) at the end; each plugin's VmRSS, the largest and the
//!   median;
//! * the loop (message at the fake → reply there), p50 and p99, at 500 routes against 5;
//! * the routing decision alone (`rules::routes::dispose`), timed in this process over
//!   every route's channel, at 500 routes against 5: the part of a message's cost that the
//!   number of routes could change.
//!
//! Run it with `cargo bench --bench scale`; `SWITCHBOARD_BENCH_QUICK=1` makes a smoke run
//! (fewer sessions and messages). `SWITCHBOARD_BENCH_ROUTES`, `SWITCHBOARD_BENCH_AGENTS`
//! and `SWITCHBOARD_BENCH_MESSAGES` override single numbers. Pacing is off, as in
//! `hot_path`: the fake enforces no limits, and the figure is the software's.

#[path = "common/agent_side.rs"]
mod agent_side;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_side::{AgentSession, PluginSpec, Process};
use common::STEP_TIMEOUT;
use common::config::DaemonConfig;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, TEST_TOKEN, UserSpec};
use switchboard::ids::{AgentName, RouteName};
use switchboard::rules::routes::{Audience, Channel, Disposition, Route, RouteTarget, RoutesTable, dispose};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// The scale, and the small table it is compared with.
const ROUTES: usize = 500;
const AGENTS: usize = 50;
const SMALL_ROUTES: usize = 5;
const SMALL_AGENTS: usize = 5;

/// Timed messages per run: every route answered twice.
const MESSAGES: usize = 1_000;
const QUICK_AGENTS: usize = 10;
const QUICK_MESSAGES: usize = 100;

/// Untimed rounds first, a message to each agent per round: they open every connection.
const WARMUP_ROUNDS: usize = 1;

/// Routing decisions timed in a row per table: far above the clock's resolution.
const DISPOSE_ITERATIONS: usize = 2_000_000;

/// Routes of one forum (its topics).
const TOPICS_PER_FORUM: usize = 10;

/// After the warm-up, how long the daemon is left alone before its memory is read.
const IDLE_SETTLE: Duration = Duration::from_millis(500);

const TOKEN_ENV: &str = "SB_SCALE_BOT_TOKEN";
const AGENT_ANSWER: &str = "the answer";

/// Private chat `k` is the user `FIRST_USER + k`; forum `f` is `FIRST_FORUM - f`.
const FIRST_USER: i64 = 600_000_001;
const FIRST_FORUM: i64 = -1_000_600_000_001;

fn main() {
    let params = Params::from_env();
    // The fake and every MCP client share one thread, so the benchmark competes as little
    // as possible with the processes it measures for the cores.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the benchmark's tokio runtime");
    runtime.block_on(run(&params));
}

struct Params {
    quick: bool,
    routes: usize,
    agents: usize,
    messages: usize,
}

impl Params {
    fn from_env() -> Self {
        let quick = common::quick();
        let (agents, messages) = if quick { (QUICK_AGENTS, QUICK_MESSAGES) } else { (AGENTS, MESSAGES) };
        let params = Self {
            quick,
            routes: common::env_count("SWITCHBOARD_BENCH_ROUTES", ROUTES),
            agents: common::env_count("SWITCHBOARD_BENCH_AGENTS", agents),
            messages: common::env_count("SWITCHBOARD_BENCH_MESSAGES", messages),
        };
        assert!(params.routes >= params.agents, "every agent needs a route of its own");
        params
    }
}

async fn run(params: &Params) {
    eprintln!("{SMALL_ROUTES} routes, {SMALL_AGENTS} sessions…");
    let small = Run::measure(SMALL_ROUTES, SMALL_AGENTS, params.messages).await;
    eprintln!("{} routes, {} sessions…", params.routes, params.agents);
    let large = Run::measure(params.routes, params.agents, params.messages).await;
    eprintln!("the routing decision alone…");
    let dispose_small = dispose_cost(SMALL_ROUTES, SMALL_AGENTS);
    let dispose_large = dispose_cost(params.routes, params.agents);
    print_report(params, &small, &large, dispose_small, dispose_large);
}

// ---------------------------------------------------------------------------
// The routes
// ---------------------------------------------------------------------------

/// Where route `k` listens: even routes are private chats, odd ones forum topics.
#[derive(Clone, Copy)]
enum Place {
    Private { user_id: i64 },
    Topic { chat_id: i64, thread_id: i32 },
}

impl Place {
    fn of(k: usize) -> Self {
        let half = (k / 2) as i64;
        if k.is_multiple_of(2) {
            Self::Private { user_id: FIRST_USER + half }
        } else {
            let forum = half / TOPICS_PER_FORUM as i64;
            let topic = half % TOPICS_PER_FORUM as i64;
            Self::Topic { chat_id: FIRST_FORUM - forum, thread_id: 2 + topic as i32 }
        }
    }

    fn chat_id(self) -> i64 {
        match self {
            Self::Private { user_id } => user_id,
            Self::Topic { chat_id, .. } => chat_id,
        }
    }

    fn thread_id(self) -> Option<i32> {
        match self {
            Self::Private { .. } => None,
            Self::Topic { thread_id, .. } => Some(thread_id),
        }
    }

    fn target(self) -> RouteTarget {
        match self {
            Self::Private { user_id } => RouteTarget::Chat { chat_id: user_id },
            Self::Topic { chat_id, thread_id } => RouteTarget::Topic { chat_id, thread_id },
        }
    }

    fn channel(self) -> Channel {
        Channel { chat_id: self.chat_id(), thread_id: self.thread_id() }
    }
}

/// Route `k` belongs to agent `k % agents`, so each agent owns as many as the others.
fn agent_of(k: usize, agents: usize) -> String {
    format!("a{}", k % agents)
}

fn secret_env(agent: &str) -> String {
    format!("SB_SCALE_{}_SECRET", agent.to_uppercase())
}

fn secret(agent: &str) -> String {
    format!("bench-secret-of-agent-{agent}")
}

/// `agents` agents and `routes` routes, route `k` at [`Place::of`] for agent
/// [`agent_of`]; only warnings are logged.
fn daemon_config(api_url: &str, database: &Path, routes: usize, agents: usize) -> DaemonConfig {
    let mut config = DaemonConfig::new(TOKEN_ENV, api_url, database).log_filter("warn");
    for a in 0..agents {
        let agent = format!("a{a}");
        config = config.agent(&agent, &secret_env(&agent));
    }
    for k in 0..routes {
        config = config.route(&format!("r{k}"), Place::of(k).target(), &agent_of(k, agents));
    }
    config
}

// ---------------------------------------------------------------------------
// One run: a daemon, its sessions, messages round-robin over its routes
// ---------------------------------------------------------------------------

struct Run {
    routes: usize,
    agents: usize,
    loops: Vec<Duration>,
    daemon_rss_kib: u64,
    daemon_peak_kib: u64,
    plugin_rss_kib: Vec<u64>,
}

impl Run {
    async fn measure(routes: usize, agents: usize, messages: usize) -> Self {
        let fake = FakeTelegram::start().await;
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let config = dir.path().join("switchboard.toml");
        let database = dir.path().join("ledger.db");
        daemon_config(&fake.api_url(), &database, routes, agents).write(&config);

        let daemon_log = dir.path().join("daemon.log");
        let mut command = Command::new(BIN);
        command
            .args(["run", "--config"])
            .arg(&config)
            .env(TOKEN_ENV, TEST_TOKEN)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&daemon_log).expect("creating the daemon's log"));
        for a in 0..agents {
            let agent = format!("a{a}");
            command.env(secret_env(&agent), secret(&agent));
        }
        let mut daemon = Process::new(
            "daemon",
            command.spawn().expect("starting switchboard run"),
            Some(daemon_log.clone()),
        );
        let api_addr = daemon.wait_until_listening(&daemon_log).await;

        let bin = PathBuf::from(BIN);
        let mut sessions = Vec::with_capacity(agents);
        for a in 0..agents {
            let agent = format!("a{a}");
            let log = dir.path().join(format!("plugin-{agent}.log"));
            let (env, secret) = (secret_env(&agent), secret(&agent));
            sessions.push(
                AgentSession::start(&PluginSpec {
                    bin: &bin,
                    config: &config,
                    agent: &agent,
                    secret_env: &env,
                    secret: &secret,
                    api_addr,
                    log: &log,
                    answer: AGENT_ANSWER,
                })
                .await,
            );
        }

        // Route k belongs to agent k % agents: the first rounds reach every agent.
        let warmup = WARMUP_ROUNDS * agents;
        let mut sent = 0;
        for n in 0..warmup {
            sent += 1;
            if one_message(&fake, n % routes, n, sent).await.is_none() {
                daemon.fail(&format!("warm-up message {n} got no reply"));
            }
        }
        tokio::time::sleep(IDLE_SETTLE).await;
        let daemon_rss_kib = daemon.rss_kib();
        let mut plugin_rss_kib: Vec<u64> = sessions.iter().map(|s| s.plugin.rss_kib()).collect();
        plugin_rss_kib.sort_unstable();

        let mut loops = Vec::with_capacity(messages);
        for n in 0..messages {
            sent += 1;
            match one_message(&fake, n % routes, warmup + n, sent).await {
                Some(took) => loops.push(took),
                None => daemon.fail(&format!("message {n} (route r{}) got no reply", n % routes)),
            }
        }
        let daemon_peak_kib = daemon.peak_rss_kib();

        for session in sessions {
            session.close().await;
        }
        daemon.stop();
        fake.shutdown().await;
        Self { routes, agents, loops, daemon_rss_kib, daemon_peak_kib, plugin_rss_kib }
    }
}

/// Writes into route `k`'s chat and waits for the `count`th reply at the fake, which must
/// answer in that chat and topic; returns the time from the push to the reply.
async fn one_message(fake: &FakeTelegram, k: usize, n: usize, count: usize) -> Option<Duration> {
    let place = Place::of(k);
    let text = format!("question {n}");
    let pushed = Instant::now();
    match place {
        Place::Private { user_id } => {
            let user = UserSpec::new(user_id, "Bench user");
            fake.push_text(ChatSpec::private_with(&user), &user, &text);
        }
        Place::Topic { chat_id, thread_id } => {
            let user = UserSpec::new(FIRST_USER, "Bench user");
            fake.push_topic_text(ChatSpec::forum(chat_id, "Bench forum"), thread_id, &user, &text);
        }
    }
    let reply = fake.wait_for_nth_sent(count, STEP_TIMEOUT).await?;
    // Not a timing: the reply went where the message came from.
    assert_eq!(reply.chat_id, place.chat_id(), "route r{k}'s reply went to another chat");
    assert_eq!(reply.message_thread_id, place.thread_id(), "route r{k}'s reply went to another topic");
    assert_eq!(reply.text, AGENT_ANSWER);
    Some(reply.received_at.duration_since(pushed))
}

// ---------------------------------------------------------------------------
// The routing decision alone
// ---------------------------------------------------------------------------

/// Nanoseconds per `dispose` over a table of `routes` routes, asked for every route's
/// channel in turn (and an unrouted one, as a stray message is).
fn dispose_cost(routes: usize, agents: usize) -> f64 {
    let table = RoutesTable::new(
        (0..routes)
            .map(|k| Route {
                name: RouteName::parse(&format!("r{k}")).expect("a route name"),
                target: Place::of(k).target(),
                audience: Audience::Agent(AgentName::parse(&agent_of(k, agents)).expect("an agent name")),
                senders: None,
                mention_only: false,
            })
            .collect(),
    )
    .expect("the routes are distinct");
    let mut channels: Vec<Channel> = (0..routes).map(|k| Place::of(k).channel()).collect();
    channels.push(Channel { chat_id: 42, thread_id: None });
    // Not timed: how many of the decisions below find a route (all but the stray's).
    let expected = (0..DISPOSE_ITERATIONS).filter(|i| i % channels.len() != routes).count();
    let started = Instant::now();
    let mut delivered = 0usize;
    for i in 0..DISPOSE_ITERATIONS {
        let channel = channels[i % channels.len()];
        if matches!(dispose(&table, &[], std::hint::black_box(channel), Some(7)), Disposition::Deliver(_)) {
            delivered += 1;
        }
    }
    let took = started.elapsed();
    assert_eq!(delivered, expected, "every routed channel finds its route, and the stray one none");
    took.as_nanos() as f64 / DISPOSE_ITERATIONS as f64
}

// ---------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------

fn percentile_ms(samples: &[Duration], p: usize) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    common::percentile(&sorted, p).as_secs_f64() * 1e3
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_report(params: &Params, small: &Run, large: &Run, dispose_small: f64, dispose_large: f64) {
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!();
    println!("switchboard at scale: many routes, many sessions ({profile}, {cores} cores)");
    println!(
        "{} one-at-a-time messages per run, round-robin over every route (half private chats, \
         half forum topics){}",
        params.messages,
        if params.quick { "; QUICK smoke run" } else { "" }
    );
    println!();
    let label = |run: &Run| format!("{} routes / {} sessions", run.routes, run.agents);
    println!("{:<40} {:>26} {:>26} {:>8}  goal", "", label(small), label(large), "ratio");
    let row = |name: &str, a: f64, b: f64, unit: &str, goal: &str| {
        println!(
            "{name:<40} {:>26} {:>26} {:>8}  {goal}",
            format!("{a:.2} {unit}"),
            format!("{b:.2} {unit}"),
            format!("{:.2}×", b / a)
        );
    };
    row(
        "loop p50 (message at the fake → reply)",
        percentile_ms(&small.loops, 50),
        percentile_ms(&large.loops, 50),
        "ms",
        "≤ 1.10×",
    );
    row("loop p99", percentile_ms(&small.loops, 99), percentile_ms(&large.loops, 99), "ms", "");
    row("routing decision alone (dispose)", dispose_small, dispose_large, "ns", "≤ 1.10×");
    row(
        "daemon VmRSS, sessions connected",
        mib(small.daemon_rss_kib),
        mib(large.daemon_rss_kib),
        "MiB",
        "≤ 32 MiB",
    );
    row("daemon peak (VmHWM)", mib(small.daemon_peak_kib), mib(large.daemon_peak_kib), "MiB", "");
    let largest = |run: &Run| mib(run.plugin_rss_kib.last().copied().unwrap_or_default());
    let median = |run: &Run| mib(run.plugin_rss_kib[run.plugin_rss_kib.len() / 2]);
    row("largest plugin VmRSS", largest(small), largest(large), "MiB", "≤ 8 MiB each");
    row("median plugin VmRSS", median(small), median(large), "MiB", "");
}
