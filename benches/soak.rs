//! A long run (issue 26): the release daemon and one real `switchboard channel` session
//! (driven by a real rmcp MCP client that answers every message with `reply`, as in
//! `hot_path`) under a steady load of messages to one private chat, on the fake Bot API.
//!
//! Every [`SAMPLE_EVERY`] it reads the daemon's and the plugin's resident memory (VmRSS),
//! the ledger's database and WAL file sizes, and how many messages are still unanswered.
//! It prints a line a minute, then the figures against the goals: each process's
//! RSS within 2 MiB of its value after the warm-up, the WAL below its bound, every message
//! answered.
//!
//! Run it with `cargo bench --bench soak`: 40 messages a second for 10 minutes.
//! `SWITCHBOARD_BENCH_SOAK_SECS` sets the length (the goal is an hour: 3600),
//! `SWITCHBOARD_BENCH_SOAK_RATE` the messages a second; `SWITCHBOARD_BENCH_QUICK=1` makes
//! a smoke run of 30 seconds. Pacing is off (per chat and overall): 40 a second to one chat
//! is above Telegram's limits, and the figure is the software's.

#[path = "common/agent_side.rs"]
mod agent_side;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_side::{AgentSession, PluginSpec, Process};
use common::config::DaemonConfig;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, TEST_TOKEN, UserSpec};
use switchboard::ledger::sqlite::WAL_LIMIT_BYTES;
use switchboard::rules::routes::RouteTarget;

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

const RATE: usize = 40;
const SECONDS: usize = 600;
const QUICK_SECONDS: usize = 30;

/// The warm-up: memory is compared with its value at the end of it. Long enough that every
/// cache, connection and buffer of a steady load has reached its size.
const WARMUP: Duration = Duration::from_secs(60);
const QUICK_WARMUP: Duration = Duration::from_secs(10);

const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// A line of the log every this many samples (a minute).
const PRINT_EVERY_SAMPLES: usize = 12;

/// The goals.
const RSS_GROWTH_GOAL_KIB: u64 = 2 * 1024;

/// A reply that has not arrived this long after its message fails the run.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

const TOKEN_ENV: &str = "SB_SOAK_BOT_TOKEN";
const AGENT: &str = "a0";
const SECRET_ENV: &str = "SB_SOAK_A0_SECRET";
const SECRET: &str = "bench-secret-of-agent-a0";
const CHAT_ID: i64 = 700_000_001;
const AGENT_ANSWER: &str = "the answer";

fn main() {
    let quick = common::quick();
    let seconds =
        common::env_count("SWITCHBOARD_BENCH_SOAK_SECS", if quick { QUICK_SECONDS } else { SECONDS });
    let rate = common::env_count("SWITCHBOARD_BENCH_SOAK_RATE", RATE);
    let warmup = if quick { QUICK_WARMUP } else { WARMUP };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the benchmark's tokio runtime");
    runtime.block_on(run(Duration::from_secs(seconds as u64), rate, warmup));
}

/// One agent, routed from one private chat.
fn daemon_config(api_url: &str, database: &Path) -> DaemonConfig {
    DaemonConfig::new(TOKEN_ENV, api_url, database).agent(AGENT, SECRET_ENV).route(
        &format!("dm-{AGENT}"),
        RouteTarget::Chat { chat_id: CHAT_ID },
        AGENT,
    )
}

/// One reading of the serving side.
#[derive(Clone, Copy)]
struct Sample {
    at: Duration,
    daemon_kib: u64,
    plugin_kib: u64,
    database_bytes: u64,
    wal_bytes: u64,
    pushed: usize,
    answered: usize,
}

async fn run(length: Duration, rate: usize, warmup: Duration) {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let config = dir.path().join("switchboard.toml");
    let database = dir.path().join("ledger.db");
    daemon_config(&fake.api_url(), &database).write(&config);
    let daemon_log = dir.path().join("daemon.log");
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .env(TOKEN_ENV, TEST_TOKEN)
        .env(SECRET_ENV, SECRET)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&daemon_log).expect("creating the daemon's log"))
        .spawn()
        .expect("starting switchboard run");
    let mut daemon = Process::new("daemon", child, Some(daemon_log.clone()));
    let api_addr = daemon.wait_until_listening(&daemon_log).await;
    let (bin, plugin_log) = (PathBuf::from(BIN), dir.path().join("plugin.log"));
    let session = AgentSession::start(&PluginSpec {
        bin: &bin,
        config: &config,
        agent: AGENT,
        secret_env: SECRET_ENV,
        secret: SECRET,
        api_addr,
        log: &plugin_log,
        answer: AGENT_ANSWER,
    })
    .await;

    eprintln!("soak: {rate} messages a second for {} s…", length.as_secs());
    let user = UserSpec::new(CHAT_ID, "Soak user");
    let chat = ChatSpec::private_with(&user);
    let mut pushes = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    // A late tick is made up at once, so the load is the rate asked for on average.
    pushes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sampling = tokio::time::interval(SAMPLE_EVERY);
    sampling.tick().await;
    let started = Instant::now();
    let (mut pushed, mut answered) = (0usize, 0usize);
    let mut samples: Vec<Sample> = Vec::new();
    let mut oldest_unanswered_since = None;
    loop {
        tokio::select! {
            _ = pushes.tick(), if started.elapsed() < length => {
                fake.push_text(&chat, &user, &format!("message {pushed}"));
                pushed += 1;
            }
            _ = sampling.tick() => {
                answered = answered_so_far(&fake, answered).await;
                let sample = Sample {
                    at: started.elapsed(),
                    daemon_kib: daemon.rss_kib(),
                    plugin_kib: session.plugin.rss_kib(),
                    database_bytes: file_len(&database),
                    wal_bytes: file_len(&switchboard::ledger::sqlite::wal_path(&database)),
                    pushed,
                    answered,
                };
                if samples.len().is_multiple_of(PRINT_EVERY_SAMPLES) {
                    print_sample(&sample);
                }
                samples.push(sample);
                // Unanswered for too long: the run has failed, not slowed down.
                if answered < pushed {
                    let since = *oldest_unanswered_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > ANSWER_TIMEOUT && answered == samples.iter().rev().nth(1).map_or(0, |s| s.answered) {
                        daemon.fail(&format!("no reply for {ANSWER_TIMEOUT:?}: {answered} of {pushed} answered"));
                    }
                } else {
                    oldest_unanswered_since = None;
                }
                if started.elapsed() >= length && answered == pushed {
                    break;
                }
            }
        }
    }
    session.close().await;
    daemon.stop();
    fake.shutdown().await;
    report(&samples, warmup, rate, length);
}

/// The replies the fake has accepted, counted on from `before` without copying them all.
async fn answered_so_far(fake: &FakeTelegram, before: usize) -> usize {
    let mut count = before;
    while let Some(reply) = fake.wait_for_nth_sent(count + 1, Duration::ZERO).await {
        assert_eq!(reply.chat_id, CHAT_ID, "a reply to another chat");
        count += 1;
    }
    count
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_sample(sample: &Sample) {
    eprintln!(
        "  {:>5.0} s: daemon {:.1} MiB, plugin {:.1} MiB, database {:.1} MiB, WAL {:.1} MiB; {} sent, {} unanswered",
        sample.at.as_secs_f64(),
        mib(sample.daemon_kib),
        mib(sample.plugin_kib),
        sample.database_bytes as f64 / 1_048_576.0,
        sample.wal_bytes as f64 / 1_048_576.0,
        sample.pushed,
        sample.pushed - sample.answered
    );
}

fn report(samples: &[Sample], warmup: Duration, rate: usize, length: Duration) {
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let Some(last) = samples.last() else { panic!("the soak took no sample") };
    let after_warmup = samples.iter().find(|s| s.at >= warmup).unwrap_or(last);
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at >= warmup).collect();
    let peak = |pick: fn(&Sample) -> u64| steady.iter().map(|s| pick(s)).max().unwrap_or_default();
    let (daemon_peak, plugin_peak) = (peak(|s| s.daemon_kib), peak(|s| s.plugin_kib));
    let wal_peak = samples.iter().map(|s| s.wal_bytes).max().unwrap_or_default();
    let backlog = samples.iter().map(|s| s.pushed - s.answered).max().unwrap_or_default();
    println!();
    println!(
        "switchboard soak ({profile}): {rate} messages a second for {} s, one session; {} messages, all answered",
        length.as_secs(),
        last.pushed
    );
    println!("memory after the warm-up ({} s) and its largest value after:", warmup.as_secs());
    let growth = |from: u64, to: u64| {
        let grew = to.saturating_sub(from);
        format!(
            "{:.1} → {:.1} MiB (+{:.1} MiB; goal ≤ +{:.1} MiB: {})",
            mib(from),
            mib(to),
            mib(grew),
            mib(RSS_GROWTH_GOAL_KIB),
            if grew <= RSS_GROWTH_GOAL_KIB { "met" } else { "NOT met" }
        )
    };
    println!("  daemon VmRSS  {}", growth(after_warmup.daemon_kib, daemon_peak));
    println!("  plugin VmRSS  {}", growth(after_warmup.plugin_kib, plugin_peak));
    // The bound is checked at each checkpoint: the WAL may pass it by what the commits of
    // one checkpoint interval add before it is rewound.
    println!(
        "ledger: database {:.1} MiB at the end; WAL largest {:.1} MiB (bound {:.1} MiB, checked at every \
         checkpoint), at the end {:.1} MiB",
        last.database_bytes as f64 / 1_048_576.0,
        wal_peak as f64 / 1_048_576.0,
        WAL_LIMIT_BYTES as f64 / 1_048_576.0,
        last.wal_bytes as f64 / 1_048_576.0
    );
    println!("largest backlog seen at a sample: {backlog} messages unanswered");
}
