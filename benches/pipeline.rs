//! The pipeline benchmark: the real `switchboard run` binary against the in-process fake
//! Bot API, with synthetic agents that speak the local API exactly as the channel plugin
//! does (`DaemonClient`). It prints figures and asserts no timings:
//!
//! * inbound throughput: envelopes per second from `getUpdates` to committed ledger rows;
//! * the latency of the inbound hop (update pushed to the fake → envelope on the agent's
//!   session stream, which is where the channel plugin writes the MCP notification), of the
//!   outbound hop (reply call → the fake received `sendMessage`) and of the whole reply
//!   call (call → receipt), one message at a time, with a small and a large ledger;
//! * the cost of a speaker hand-over in a group room: a speaker's reply call → the next
//!   speaker's `room_turn` envelope on its session stream (post, confirm, end the turn,
//!   give the floor, hand over), over exchanges of the default ten turns;
//! * the daemon's peak resident memory in each run;
//! * the cost of metrics on the hot path: what the daemon records for one round trip,
//!   timed in this process without a recorder and with the Prometheus recorder installed,
//!   next to the round trip it rides on.
//!
//! Run it with `cargo bench --bench pipeline`. `SWITCHBOARD_BENCH_QUICK=1` makes a smoke
//! run with small numbers; `SWITCHBOARD_BENCH_UPDATES`, `SWITCHBOARD_BENCH_SAMPLES`,
//! `SWITCHBOARD_BENCH_LEDGER_ROWS` (the large ledger) and `SWITCHBOARD_BENCH_HANDOVERS`
//! (room hand-overs; default: as many as round trips) override single numbers. Command
//! line arguments (cargo passes `--bench`) are ignored.

mod common;

use common::config::DaemonConfig;
use common::{PROCESS_POLL_INTERVAL, STEP_TIMEOUT};

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchboard::agents::api::client::{DaemonClient, SessionStream};
use switchboard::agents::api::wire::{DeliveredEnvelope, HandoffRequest, ReplyRequest, SessionEvent};
use switchboard::app::reported_api_address;
use switchboard::config::{Database, Synchronous};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, TEST_TOKEN, UserSpec};
use switchboard::ids::{AgentName, RequestId, Secret};
use switchboard::ledger::{AttemptState, EnvelopeKind, EnvelopeState};
use switchboard::operate::metrics;
use switchboard::rules::routes::RouteTarget;

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// A few agents, like an orchestrator and its workers; every figure covers all of them.
const AGENTS: usize = 4;

/// 500 full `getUpdates` batches (Telegram and the fake return at most 100): enough that
/// start-up effects vanish, few enough to take seconds.
const THROUGHPUT_UPDATES: usize = 50_000;

/// Round trips per ledger size: 20 samples lie above the p99, so it is not one outlier,
/// and the run still takes only seconds.
const LATENCY_SAMPLES: usize = 2_000;

/// Untimed round trips first: they open the HTTP connections and warm SQLite's caches.
const WARMUP_ROUND_TRIPS: usize = 20;

/// The issue asks for reply latency with 1,000 and with 1,000,000 acked envelopes.
const SMALL_LEDGER_ROWS: usize = 1_000;
const LARGE_LEDGER_ROWS: usize = 1_000_000;

/// `SWITCHBOARD_BENCH_QUICK=1`: each part still runs, in a few seconds altogether.
const QUICK_UPDATES: usize = 2_000;
const QUICK_SAMPLES: usize = 50;
const QUICK_LARGE_LEDGER_ROWS: usize = 20_000;

/// Agent `k` talks in the private chat `FIRST_CHAT_ID + k` (private chat ids are user ids,
/// so they are positive).
const FIRST_CHAT_ID: i64 = 500_000_001;

/// How often the throughput run counts ledger rows: its end time is this precise, well
/// under 1% of a run that takes seconds.
const COUNT_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// How long the daemon may take to listen: twice [`common::START_TIMEOUT`], since a large
/// ledger opens slower than an empty one.
const LARGE_LEDGER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the throughput run may take to be committed: far beyond a healthy one.
const THROUGHPUT_TIMEOUT: Duration = Duration::from_secs(300);

/// How much of the daemon's log a failure shows.
const LOG_TAIL_LINES: usize = 40;

const TOKEN_ENV: &str = "SB_BENCH_BOT_TOKEN";

fn main() {
    let params = Params::from_env();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the benchmark's tokio runtime");
    runtime.block_on(run(&params));
}

/// Runs every scenario, then prints the report. The fake and the agents share one thread,
/// so the benchmark itself competes as little as possible with the daemon for the cores.
async fn run(params: &Params) {
    let throughput = inbound_throughput(params).await;
    let mut ledgers = Vec::new();
    for rows in [SMALL_LEDGER_ROWS, params.large_ledger_rows] {
        ledgers.push(round_trips(params, rows).await);
    }
    let handoffs = handoff_round_trips(params).await;
    let handovers = room_handovers(params).await;
    let metrics = metrics_cost(params);
    print_report(params, &throughput, &ledgers, &handovers);
    print_handoffs(params, &handoffs);
    print_metrics_cost(&metrics, &ledgers[0]);
}

// ---------------------------------------------------------------------------
// Metrics on the hot path
// ---------------------------------------------------------------------------

/// Round trips' worth of metrics timed in a row: enough that the clock's resolution is
/// far below the figure.
const METRICS_ITERATIONS: usize = 200_000;
const QUICK_METRICS_ITERATIONS: usize = 20_000;

/// What the daemon records for one envelope's round trip: the envelope counted when it is
/// recorded, its inbound hop when it is handed over, the attempt and its outbound hop.
fn record_round_trip_metrics(received_at: chrono::DateTime<chrono::Utc>) {
    metrics::envelope_recorded(EnvelopeState::Queued);
    metrics::envelope_handed_over(EnvelopeKind::Message, received_at);
    metrics::attempt_finished(AttemptState::Sent, Duration::from_millis(3));
}

struct MetricsCost {
    iterations: usize,
    /// Per round trip, with no recorder (the `metrics` facade's no-op).
    without: Duration,
    /// Per round trip, with the Prometheus recorder the daemon installs.
    with: Duration,
    /// One render of the resulting series, as `/metrics` does per scrape.
    render: Duration,
}

fn metrics_cost(params: &Params) -> MetricsCost {
    let iterations = if params.quick { QUICK_METRICS_ITERATIONS } else { METRICS_ITERATIONS };
    let received_at = chrono::Utc::now();
    let per_round_trip = || {
        let started = Instant::now();
        for _ in 0..iterations {
            record_round_trip_metrics(std::hint::black_box(received_at));
        }
        started.elapsed() / u32::try_from(iterations).expect("iterations fit a u32")
    };
    // The global recorder cannot be taken out again: first without, then with.
    let without = per_round_trip();
    let handle = metrics::install(None);
    let with = per_round_trip();
    let started = Instant::now();
    let text = std::hint::black_box(handle.render());
    let render = started.elapsed();
    assert!(text.contains(metrics::ATTEMPTS), "the recorder rendered what was recorded");
    MetricsCost { iterations, without, with, render }
}

fn print_metrics_cost(cost: &MetricsCost, ledger: &RoundTrips) {
    let reply = ledger.reply_call.p50;
    let extra = cost.with.saturating_sub(cost.without);
    println!();
    println!(
        "metrics on the hot path (per round trip: 2 counters and 2 histogram samples; {} in a row):",
        cost.iterations
    );
    println!(
        "  without a recorder {} ns, with the Prometheus recorder {} ns: {:.4}% of the p50 reply call ({})",
        cost.without.as_nanos(),
        cost.with.as_nanos(),
        100.0 * extra.as_secs_f64() / reply.as_secs_f64(),
        Millis(reply)
    );
    println!(
        "  one render of those series (a /metrics scrape, state gauges aside): {} µs",
        cost.render.as_micros()
    );
}

// ---------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------

struct Params {
    quick: bool,
    updates: usize,
    samples: usize,
    large_ledger_rows: usize,
    handovers: usize,
}

impl Params {
    fn from_env() -> Self {
        let quick = common::quick();
        let (updates, samples, large) = if quick {
            (QUICK_UPDATES, QUICK_SAMPLES, QUICK_LARGE_LEDGER_ROWS)
        } else {
            (THROUGHPUT_UPDATES, LATENCY_SAMPLES, LARGE_LEDGER_ROWS)
        };
        let samples = common::env_count("SWITCHBOARD_BENCH_SAMPLES", samples);
        Self {
            quick,
            updates: common::env_count("SWITCHBOARD_BENCH_UPDATES", updates),
            samples,
            large_ledger_rows: common::env_count("SWITCHBOARD_BENCH_LEDGER_ROWS", large),
            handovers: common::env_count("SWITCHBOARD_BENCH_HANDOVERS", samples),
        }
    }
}

// ---------------------------------------------------------------------------
// Scenario 1: inbound throughput
// ---------------------------------------------------------------------------

struct Throughput {
    envelopes: usize,
    elapsed: Duration,
    get_updates_calls: usize,
    peak_rss_kib: u64,
}

/// The daemon polls an empty fake; then every update is pushed at once, and the clock runs
/// until the ledger holds them all. No session is connected, so they stay `queued` and the
/// figure is the poller's alone: `getUpdates`, parse, route, commit.
async fn inbound_throughput(params: &Params) -> Throughput {
    eprintln!("inbound throughput: {} updates…", params.updates);
    let fake = FakeTelegram::start().await;
    let workdir = Workdir::new();
    let mut daemon = Daemon::start(&workdir, &fake.api_url());
    daemon.wait_until_listening().await;
    fake.wait_for_get_updates_calls(1, STEP_TIMEOUT).await;
    // A connection beside the daemon's (in WAL mode it reads meanwhile), to count.
    let counter = rusqlite::Connection::open(workdir.database()).expect("opening the ledger to count");
    let polls_before = fake.get_updates_calls();

    let speakers: Vec<Speaker> = (0..AGENTS).map(Speaker::new).collect();
    for n in 0..params.updates {
        let speaker = &speakers[n % AGENTS];
        fake.push_text(&speaker.chat, &speaker.user, &format!("update {n}"));
    }
    // The waiting long poll runs only once this task yields, so the clock starts before
    // the daemon can see the first update.
    let started = Instant::now();
    let deadline = started + THROUGHPUT_TIMEOUT;
    while envelope_count(&counter) < params.updates {
        if Instant::now() > deadline {
            daemon.fail(&format!("the ledger did not reach {} envelopes", params.updates));
        }
        tokio::time::sleep(COUNT_POLL_INTERVAL).await;
    }
    let elapsed = started.elapsed();
    let get_updates_calls = fake.get_updates_calls() - polls_before;
    let peak_rss_kib = daemon.peak_rss_kib();
    drop(counter);
    daemon.stop().await;
    Throughput { envelopes: params.updates, elapsed, get_updates_calls, peak_rss_kib }
}

fn envelope_count(counter: &rusqlite::Connection) -> usize {
    let count: i64 = counter
        .query_row("SELECT COUNT(*) FROM envelopes", [], |row| row.get(0))
        .expect("counting envelopes");
    usize::try_from(count).expect("a count is never negative")
}

// ---------------------------------------------------------------------------
// Scenario 2: round trips, one message at a time, over a small and a large ledger
// ---------------------------------------------------------------------------

struct RoundTrips {
    ledger_rows: usize,
    prepopulation: Duration,
    inbound: Summary,
    outbound: Summary,
    reply_call: Summary,
    peak_rss_kib: u64,
    /// `switchboard run` started → its local API listening, on this ledger.
    start_up: Duration,
    /// `switchboard ledger stats`, the whole process, beside the running daemon.
    stats: Duration,
    /// The database and its WAL, divided by the envelopes pre-filled (each with its
    /// attempt and its event).
    bytes_per_envelope: f64,
}

/// Fills a fresh ledger with `ledger_rows` answered envelopes, starts the daemon, connects
/// one session per agent and times `params.samples` round trips, the agents taking turns.
async fn round_trips(params: &Params, ledger_rows: usize) -> RoundTrips {
    eprintln!("round trips over {ledger_rows} acked envelopes: filling the ledger…");
    let fake = FakeTelegram::start().await;
    let workdir = Workdir::new();
    let prepopulation = prepopulate(&workdir.database(), ledger_rows).await;

    let bytes_per_envelope = ledger_bytes(&workdir.database()) as f64 / ledger_rows.max(1) as f64;

    eprintln!("round trips over {ledger_rows} acked envelopes: {} round trips…", params.samples);
    let starting = Instant::now();
    let mut daemon = Daemon::start(&workdir, &fake.api_url());
    daemon.wait_until_listening().await;
    let start_up = starting.elapsed();
    let mut agents = Vec::with_capacity(AGENTS);
    for k in 0..AGENTS {
        agents.push(Agent::connect(daemon.api_addr(), k).await);
    }

    let mut samples = Samples::default();
    for n in 0..WARMUP_ROUND_TRIPS + params.samples {
        let agent = &mut agents[n % AGENTS];
        let trip = tokio::time::timeout(STEP_TIMEOUT, round_trip(&fake, agent, n)).await;
        let Ok(trip) = trip else {
            daemon.fail(&format!("round trip {n} did not finish within {STEP_TIMEOUT:?}"));
        };
        if n >= WARMUP_ROUND_TRIPS {
            samples.push(trip);
        }
    }
    let peak_rss_kib = daemon.peak_rss_kib();
    let stats = ledger_stats_time(&workdir);
    drop(agents);
    daemon.stop().await;

    // Not a timing: a check that the run did what it claims to have measured.
    let answered = WARMUP_ROUND_TRIPS + params.samples;
    let acked = acked_count(&workdir).await;
    assert_eq!(acked, ledger_rows + answered, "every envelope, old and new, should be acked");

    RoundTrips {
        ledger_rows,
        prepopulation,
        inbound: Summary::of(samples.inbound),
        outbound: Summary::of(samples.outbound),
        reply_call: Summary::of(samples.reply_call),
        peak_rss_kib,
        start_up,
        stats,
        bytes_per_envelope,
    }
}

/// The ledger's size on disk: the database file and what its WAL holds beside it.
fn ledger_bytes(database: &Path) -> u64 {
    let wal = switchboard::ledger::sqlite::wal_path(database);
    [database, wal.as_path()].iter().filter_map(|path| std::fs::metadata(path).ok()).map(|m| m.len()).sum()
}

/// How long `switchboard ledger stats` takes against the running daemon's ledger, as an
/// operator would run it: the whole process, start to exit.
fn ledger_stats_time(workdir: &Workdir) -> Duration {
    let started = Instant::now();
    let output = Command::new(BIN)
        .args(["ledger", "--config"])
        .arg(workdir.config())
        .arg("stats")
        .env(TOKEN_ENV, TEST_TOKEN)
        .envs((0..AGENTS).map(|k| (agent_secret_env(k), agent_secret(k))))
        .output()
        .expect("running switchboard ledger stats");
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "switchboard ledger stats failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    took
}

/// The three hops of one round trip.
struct RoundTrip {
    /// Update pushed to the fake → envelope read from the agent's session stream.
    inbound: Duration,
    /// Reply call started → the fake received `sendMessage`.
    outbound: Duration,
    /// Reply call started → receipt returned.
    reply_call: Duration,
}

#[derive(Default)]
struct Samples {
    inbound: Vec<Duration>,
    outbound: Vec<Duration>,
    reply_call: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, trip: RoundTrip) {
        self.inbound.push(trip.inbound);
        self.outbound.push(trip.outbound);
        self.reply_call.push(trip.reply_call);
    }
}

/// A user writes to the agent, the agent receives the envelope and answers it by name.
async fn round_trip(fake: &FakeTelegram, agent: &mut Agent, n: usize) -> RoundTrip {
    let pushed = Instant::now();
    fake.push_text(&agent.speaker.chat, &agent.speaker.user, &format!("question {n}"));
    let envelope = next_envelope(&mut agent.session).await;
    let inbound = pushed.elapsed();

    let request = ReplyRequest::new(format!("answer {n}"), Some(envelope.trace_id));
    let called = Instant::now();
    let receipt = agent.client.reply(&request).await.unwrap_or_else(|e| panic!("reply {n} failed: {e}"));
    let reply_call = called.elapsed();

    let message_id = receipt.message_ids[0];
    let sent = fake
        .sent_message(message_id)
        .unwrap_or_else(|| panic!("the fake never received message {message_id} of the receipt"));
    RoundTrip { inbound, outbound: sent.received_at.duration_since(called), reply_call }
}

/// Handoff round trips (DESIGN.md §9), both agents on the local API.
struct HandoffTrips {
    /// send_to_agent called → the target's session stream carries the handoff.
    to_target: Summary,
    /// send_to_agent called → the delegator's session stream carries the answer, the
    /// target having replied as soon as it read the handoff.
    round_trip: Summary,
}

/// Agent a0 hands an instruction to a1, which answers at once; timed `params.samples`
/// times on a fresh daemon.
async fn handoff_round_trips(params: &Params) -> HandoffTrips {
    eprintln!("handoff round trips: {} round trips…", params.samples);
    let fake = FakeTelegram::start().await;
    let workdir = Workdir::new();
    let mut daemon = Daemon::start(&workdir, &fake.api_url());
    daemon.wait_until_listening().await;
    let mut delegator = Agent::connect(daemon.api_addr(), 0).await;
    let mut target = Agent::connect(daemon.api_addr(), 1).await;
    let (mut to_target, mut round_trip) = (Vec::new(), Vec::new());
    for n in 0..WARMUP_ROUND_TRIPS + params.samples {
        let trip = async {
            // Unprompted (the delegator has nothing pending it was shown): each handoff is
            // its own turn, and the previous one is answered, so the guard lets it through.
            let request = HandoffRequest {
                to: agent_name(1),
                text: format!("task {n}"),
                trace_id: None,
                followup: None,
                intent: None,
                request_id: RequestId::generate().to_string(),
            };
            let called = Instant::now();
            delegator.client.handoff(&request).await.unwrap_or_else(|e| panic!("handoff {n} failed: {e}"));
            let handoff = next_envelope(&mut target.session).await;
            let reached = called.elapsed();
            let answer = ReplyRequest::new(format!("done {n}"), Some(handoff.trace_id));
            target.client.reply(&answer).await.unwrap_or_else(|e| panic!("answer {n} failed: {e}"));
            let answered = next_envelope(&mut delegator.session).await;
            assert_eq!(answered.kind, "handoff_answer", "the delegator hears the answer");
            (reached, called.elapsed())
        };
        let Ok((reached, total)) = tokio::time::timeout(STEP_TIMEOUT, trip).await else {
            daemon.fail(&format!("handoff round trip {n} did not finish within {STEP_TIMEOUT:?}"));
        };
        if n >= WARMUP_ROUND_TRIPS {
            to_target.push(reached);
            round_trip.push(total);
        }
    }
    drop((delegator, target));
    daemon.stop().await;
    HandoffTrips { to_target: Summary::of(to_target), round_trip: Summary::of(round_trip) }
}

fn print_handoffs(params: &Params, handoffs: &HandoffTrips) {
    println!();
    println!("handoff round trip ({} samples):", params.samples);
    table_row("", std::iter::once(format!("{:>9}  {:>9}  {:>9}", "p50", "p99", "max")));
    table_row("to the target (d)", std::iter::once(handoffs.to_target.to_string()));
    table_row("round trip (e)", std::iter::once(handoffs.round_trip.to_string()));
    println!("  (d) send_to_agent called → the handoff envelope on the target's session stream");
    println!("  (e) send_to_agent called → the target's answer on the delegator's session stream");
}

async fn next_envelope(session: &mut SessionStream) -> DeliveredEnvelope {
    loop {
        match session.next_event().await {
            Ok(Some(SessionEvent::Envelope(envelope))) => return envelope,
            Ok(Some(SessionEvent::Heartbeat)) => continue,
            Ok(Some(other)) => panic!("unexpected session event {other:?}"),
            Ok(None) => panic!("the daemon closed the session stream"),
            Err(e) => panic!("session stream failed: {e}"),
        }
    }
}

/// Fills a fresh ledger with `rows` envelopes as a real answered envelope leaves them: the
/// envelope `acked`, its sent attempt and its state change, spread over the agents. Their
/// ids stay clear of the run's: update ids are negative (the fake's start at 100000), and
/// trace ids are `env_` and ten digits, which an id the daemon generates from 36 characters
/// matches with a chance far below one in a billion. Returns how long it took.
async fn prepopulate(database: &Path, rows: usize) -> Duration {
    let started = Instant::now();
    switchboard::ledger::open(&Database::Sqlite(database.to_path_buf()), Synchronous::Normal)
        .await
        .expect("creating the ledger")
        .close()
        .await;
    let now = switchboard::clock::now_text();
    let mut db = rusqlite::Connection::open(database).expect("opening the ledger to fill it");
    let tx = db.transaction().expect("beginning the pre-population");
    tx.execute(
        "WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < ?1) \
         INSERT INTO envelopes (trace_id, update_id, kind, chat_id, chat_type, chat_title, message_id, \
         sender_id, sender_name, text, content, sent_at, received_at, route, agent, state, deliveries, \
         state_changed_at, note) \
         SELECT printf('env_%010d', n), -1 - n, 'message', ?2 + n % ?3, 'private', 'Bench user', n + 1, \
         ?2 + n % ?3, 'Bench user', 'earlier question ' || n, 'earlier question ' || n, ?4, ?4, \
         'dm-a' || (n % ?3), 'a' || (n % ?3), 'acked', 1, ?4, 'replied' \
         FROM seq",
        rusqlite::params![
            i64::try_from(rows).expect("row count fits i64"),
            FIRST_CHAT_ID,
            AGENTS as i64,
            now
        ],
    )
    .expect("inserting envelopes");
    tx.execute(
        "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, reply_to_message_id, chunk_index, \
         chunk_count, text, outcome, telegram_message_id, started_at, finished_at) \
         SELECT printf('op_%010d', id), id, agent, chat_id, message_id, 0, 1, 'earlier answer', 'sent', \
         message_id, ?1, ?1 FROM envelopes",
        [&now],
    )
    .expect("inserting attempts");
    tx.execute(
        "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor, reason) \
         SELECT id, ?1, 'pending', 'acked', 'agent:' || agent, 'replied' FROM envelopes",
        [&now],
    )
    .expect("inserting events");
    tx.commit().expect("committing the pre-population");
    started.elapsed()
}

async fn acked_count(workdir: &Workdir) -> usize {
    let count: i64 = rusqlite::Connection::open(workdir.database())
        .and_then(|db| {
            db.query_row("SELECT COUNT(*) FROM envelopes WHERE state = 'acked'", [], |row| row.get(0))
        })
        .expect("counting acked envelopes");
    usize::try_from(count).expect("a count is never negative")
}

// ---------------------------------------------------------------------------
// Scenario 3: speaker hand-overs in a group room
// ---------------------------------------------------------------------------

/// The room's chat: agents `a0` and `a1`, in that order.
const ROOM_CHAT_ID: i64 = -1_000_500_000_001;

/// Turns per exchange: `[rooms] cascade_limit`'s default, so the transcript each speaker
/// gets (and the stored cascade) is as long as a real exchange's can be.
const ROOM_TURNS: usize = 10;

/// The room's route, for the room run only, beside every run's. Group pacing is off in
/// every run's configuration (see [`daemon_config`]), so the figure is the switchboard's
/// own cost rather than Telegram's per-group limit (one post every 3 s).
fn room_config(api_url: &str, database: &Path) -> DaemonConfig {
    daemon_config(api_url, database).log_filter(ROOM_LOG_FILTER).room(
        "bench-room",
        ROOM_CHAT_ID,
        &[&agent_name(0), &agent_name(1)],
    )
}

/// The fake reports the bot in privacy mode, which the room driver warns about at
/// start-up; that warning says nothing about this run.
const ROOM_LOG_FILTER: &str = "warn,switchboard::agents::bridge::room::driver=error";

struct Handovers {
    exchanges: usize,
    samples: usize,
    handover: Summary,
    peak_rss_kib: u64,
}

/// Exchanges of [`ROOM_TURNS`] turns between `a0` and `a1`, each reply mentioning the other
/// (the last mentions nobody, so the exchange completes). A sample is one hand-over: the
/// speaker's reply call started → the next speaker's `room_turn` envelope read from its
/// session stream.
async fn room_handovers(params: &Params) -> Handovers {
    let per_exchange = ROOM_TURNS - 1;
    let exchanges = (WARMUP_ROUND_TRIPS + params.handovers).div_ceil(per_exchange);
    eprintln!("room hand-overs: {exchanges} exchanges of {ROOM_TURNS} turns…");
    let fake = FakeTelegram::start().await;
    let workdir = Workdir::new();
    let mut daemon = Daemon::start_with(&workdir, &room_config(&fake.api_url(), &workdir.database()));
    daemon.wait_until_listening().await;
    let mut agents = [Agent::connect(daemon.api_addr(), 0).await, Agent::connect(daemon.api_addr(), 1).await];
    let room = ChatSpec::supergroup(ROOM_CHAT_ID, "Bench room");
    let human = UserSpec::new(FIRST_CHAT_ID, "Bench owner");

    let mut samples = Vec::new();
    let mut taken = 0;
    for exchange in 0..exchanges {
        fake.push_text(&room, &human, &format!("@{} start exchange {exchange}", agent_name(0)));
        let mut turn = next_envelope(&mut agents[0].session).await;
        for speaker in 1..=ROOM_TURNS {
            let (current, next) = ((speaker - 1) % 2, speaker % 2);
            let text = if speaker < ROOM_TURNS {
                format!("@{} turn {speaker} of exchange {exchange}", agent_name(next))
            } else {
                format!("done with exchange {exchange}")
            };
            let request = ReplyRequest::new(text, Some(turn.trace_id.clone()));
            let called = Instant::now();
            let reply = tokio::time::timeout(STEP_TIMEOUT, agents[current].client.reply(&request)).await;
            match reply {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    daemon.fail(&format!("room reply {speaker} of exchange {exchange} failed: {e}"))
                }
                Err(_) => daemon.fail(&format!("room reply {speaker} of exchange {exchange} took too long")),
            }
            if speaker == ROOM_TURNS {
                break;
            }
            let handed = tokio::time::timeout(STEP_TIMEOUT, next_envelope(&mut agents[next].session)).await;
            let Ok(envelope) = handed else {
                daemon.fail(&format!("speaker {} of exchange {exchange} never got the floor", speaker + 1));
            };
            if taken >= WARMUP_ROUND_TRIPS {
                samples.push(called.elapsed());
            }
            taken += 1;
            turn = envelope;
        }
    }
    let peak_rss_kib = daemon.peak_rss_kib();
    drop(agents);
    daemon.stop().await;
    let posts = fake.sent_messages().len();
    assert_eq!(posts, exchanges * ROOM_TURNS, "every reply posted once, nothing else posted");
    Handovers { exchanges, samples: samples.len(), handover: Summary::of(samples), peak_rss_kib }
}

// ---------------------------------------------------------------------------
// Synthetic agents
// ---------------------------------------------------------------------------

/// The person who writes to agent `k`, in the private chat its route names.
struct Speaker {
    chat: ChatSpec,
    user: UserSpec,
}

impl Speaker {
    fn new(k: usize) -> Self {
        let id = chat_id(k);
        let user = UserSpec::new(id, &format!("Bench user {k}"));
        Self { chat: ChatSpec::private_with(&user), user }
    }
}

/// An agent session as the channel plugin holds it: a client and an open session stream.
struct Agent {
    client: DaemonClient,
    session: SessionStream,
    speaker: Speaker,
}

impl Agent {
    async fn connect(address: SocketAddr, k: usize) -> Self {
        let name = AgentName::parse(&agent_name(k)).expect("a valid agent name");
        let client = DaemonClient::new(address, name, Secret::new(agent_secret(k))).expect("HTTP client");
        let session =
            client.open_session().await.unwrap_or_else(|e| panic!("opening agent {k}'s session: {e}"));
        Self { client, session, speaker: Speaker::new(k) }
    }
}

fn chat_id(k: usize) -> i64 {
    FIRST_CHAT_ID + k as i64
}

fn agent_name(k: usize) -> String {
    format!("a{k}")
}

fn agent_secret(k: usize) -> String {
    format!("bench-secret-of-agent-{k}")
}

fn agent_secret_env(k: usize) -> String {
    format!("SB_BENCH_A{k}_SECRET")
}

// ---------------------------------------------------------------------------
// The daemon process
// ---------------------------------------------------------------------------

/// A temporary directory holding one run's configuration, database and log.
struct Workdir {
    dir: tempfile::TempDir,
}

impl Workdir {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("creating a temporary directory") }
    }

    fn database(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("switchboard.toml")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }
}

/// Agents `a0…` with their secrets in environment variables, each routed from its own
/// private chat. The long poll is short as in the integration tests (a pushed update ends
/// it at once, so this does not affect latency).
fn daemon_config(api_url: &str, database: &Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(TOKEN_ENV, api_url, database).poll_timeout_secs(1);
    for k in 0..AGENTS {
        let name = agent_name(k);
        config = config.agent(&name, &agent_secret_env(k)).route(
            &format!("dm-{name}"),
            RouteTarget::Chat { chat_id: chat_id(k) },
            &name,
        );
    }
    config
}

/// A running `switchboard run`. Dropping it kills the process.
struct Daemon {
    child: Option<Child>,
    /// Where the local API listens, once the daemon has reported it.
    api_addr: Option<SocketAddr>,
    log: PathBuf,
}

impl Daemon {
    /// Writes every run's configuration, logging only warnings so that logging does not
    /// dominate the figures, and starts the binary; it may not be listening yet.
    fn start(workdir: &Workdir, api_url: &str) -> Self {
        Self::start_with(workdir, &daemon_config(api_url, &workdir.database()).log_filter("warn"))
    }

    /// Like [`Daemon::start`], with this configuration.
    fn start_with(workdir: &Workdir, config: &DaemonConfig) -> Self {
        config.write(&workdir.config());
        let log = std::fs::File::create(workdir.log()).expect("creating the daemon's log file");
        let mut command = Command::new(BIN);
        command
            .args(["run", "--config"])
            .arg(workdir.config())
            .env(TOKEN_ENV, TEST_TOKEN)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for k in 0..AGENTS {
            command.env(agent_secret_env(k), agent_secret(k));
        }
        let child = command.spawn().expect("starting switchboard run");
        Self { child: Some(child), api_addr: None, log: workdir.log() }
    }

    /// The local API's address, as the daemon reported it.
    fn api_addr(&self) -> SocketAddr {
        self.api_addr.expect("the daemon has reported where it listens (wait_until_listening)")
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the daemon is running")
    }

    async fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + LARGE_LEDGER_START_TIMEOUT;
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(addr) = reported_api_address(&log) {
                self.api_addr = Some(addr);
                return;
            }
            if let Some(status) = self.child().try_wait().expect("checking the daemon") {
                self.fail(&format!("the daemon exited during start-up ({status})"));
            }
            if Instant::now() > deadline {
                self.fail(&format!("the daemon did not listen within {LARGE_LEDGER_START_TIMEOUT:?}"));
            }
            tokio::time::sleep(PROCESS_POLL_INTERVAL).await;
        }
    }

    /// The process's peak resident set size so far (`VmHWM`), in KiB.
    fn peak_rss_kib(&mut self) -> u64 {
        let pid = self.child().id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM line in /proc/{pid}/status"))
    }

    /// SIGTERM, then waits for the graceful exit the daemon promises.
    async fn stop(&mut self) {
        let mut child = self.child.take().expect("the daemon is running");
        let pid = child.id().to_string();
        let signalled = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
        assert!(signalled.success(), "kill -TERM {pid} failed");
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            match child.try_wait().expect("waiting for the daemon") {
                Some(status) if status.success() => return self.report_log(),
                Some(status) => panic!("the daemon exited with {status} after SIGTERM\n{}", self.log_tail()),
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    panic!("the daemon did not stop within {STEP_TIMEOUT:?} of SIGTERM\n{}", self.log_tail());
                }
                None => tokio::time::sleep(PROCESS_POLL_INTERVAL).await,
            }
        }
    }

    /// The daemon logs only warnings and errors here: any at all make the figures suspect,
    /// so they are shown beside them rather than lost with the temporary directory.
    fn report_log(&self) {
        let tail = self.log_tail();
        if !tail.trim().is_empty() {
            eprintln!("warning: the daemon logged warnings or errors during this run:\n{tail}");
        }
    }

    /// Stops the benchmark with what went wrong and the end of the daemon's log.
    fn fail(&self, problem: &str) -> ! {
        panic!("{problem}\n--- daemon log (last {LOG_TAIL_LINES} lines) ---\n{}", self.log_tail())
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// Statistics and the report
// ---------------------------------------------------------------------------

struct Summary {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl Summary {
    fn of(mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "no samples to summarise");
        samples.sort_unstable();
        Self {
            p50: common::percentile(&samples, 50),
            p99: common::percentile(&samples, 99),
            max: *samples.last().expect("not empty"),
        }
    }
}

/// A duration in milliseconds, right-aligned in a column.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{:.2} ms", self.0.as_secs_f64() * 1e3);
        f.pad(&text)
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Row labels of the latency table, and the width of one ledger's three figures.
const LABEL_WIDTH: usize = 16;
const GROUP_WIDTH: usize = 31;

/// The latency table's rows, in the order of [`RoundTrips::hops`].
const HOPS: [&str; 3] = ["inbound hop (a)", "outbound hop (b)", "reply call (c)"];

impl RoundTrips {
    fn hops(&self) -> [&Summary; 3] {
        [&self.inbound, &self.outbound, &self.reply_call]
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>9}  {:>9}  {:>9}", Millis(self.p50), Millis(self.p99), Millis(self.max))
    }
}

fn print_report(params: &Params, throughput: &Throughput, ledgers: &[RoundTrips], handovers: &Handovers) {
    print_header(params);
    print_throughput(throughput);
    print_latency(params, ledgers);
    print_handovers(handovers);
    print_peak_rss(throughput, ledgers, handovers);
}

fn print_handovers(handovers: &Handovers) {
    println!(
        "group room, {} hand-overs in {} exchanges of {ROOM_TURNS} turns (after {WARMUP_ROUND_TRIPS} untimed):",
        handovers.samples, handovers.exchanges
    );
    table_row("", std::iter::once(format!("{:>9}  {:>9}  {:>9}", "p50", "p99", "max")));
    table_row("hand-over (d)", std::iter::once(handovers.handover.to_string()));
    println!("  (d) a speaker's reply call started → the next speaker's room_turn envelope on its");
    println!("      session stream: claim the turn, post \"Name: text\" and confirm it, end the turn,");
    println!("      give the floor (one transaction), hand the envelope over (group pacing off)");
    println!();
}

fn print_header(params: &Params) {
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!();
    println!("switchboard pipeline benchmark ({profile}, {cores} cores)");
    println!(
        "parameters: {AGENTS} agents; {} updates for throughput; {} round trips per ledger \
         (after {WARMUP_ROUND_TRIPS} untimed){}",
        params.updates,
        params.samples,
        if params.quick { "; QUICK smoke run" } else { "" }
    );
    println!();
}

fn print_throughput(throughput: &Throughput) {
    let seconds = throughput.elapsed.as_secs_f64();
    println!(
        "inbound throughput: {} envelopes in {seconds:.2} s = {:.0} envelopes/s \
         (getUpdates → committed ledger rows; {} getUpdates calls)",
        throughput.envelopes,
        throughput.envelopes as f64 / seconds,
        throughput.get_updates_calls
    );
    println!();
}

fn print_latency(params: &Params, ledgers: &[RoundTrips]) {
    println!(
        "latency, one message at a time, by envelopes already in the ledger ({} samples each):",
        params.samples
    );
    table_row("", ledgers.iter().map(|l| format!("{} acked envelopes", l.ledger_rows)));
    table_row("", ledgers.iter().map(|_| format!("{:>9}  {:>9}  {:>9}", "p50", "p99", "max")));
    for (row, label) in HOPS.iter().enumerate() {
        table_row(label, ledgers.iter().map(|l| l.hops()[row].to_string()));
    }
    println!("  (a) update pushed to the fake → envelope on the agent's session stream,");
    println!("      the point where the channel plugin writes the MCP notification");
    println!("  (b) reply call started → the fake received sendMessage");
    println!("  (c) reply call started → receipt (resolve, record attempt, send, confirm, ack)");
    for ledger in ledgers {
        println!(
            "  ledger of {} acked envelopes (each with its attempt and event) filled in {:.2} s",
            ledger.ledger_rows,
            ledger.prepopulation.as_secs_f64()
        );
    }
    println!();
    print_ledger_scale(ledgers);
}

/// The large ledger against the small one, beside the goals (issue 26: start-up
/// and `ledger stats` within a second, a reply within 1.1× of a 1,000-envelope ledger).
fn print_ledger_scale(ledgers: &[RoundTrips]) {
    let (Some(small), Some(large)) = (ledgers.first(), ledgers.last()) else { return };
    println!("a ledger of months ({} vs {} acked envelopes):", large.ledger_rows, small.ledger_rows);
    let ratio = large.reply_call.p50.as_secs_f64() / small.reply_call.p50.as_secs_f64();
    println!("  reply call p50         {ratio:>6.2}×   (goal ≤ 1.10×)");
    for ledger in [small, large] {
        println!(
            "  {:>10} envelopes: start-up {:>10} (goal ≤ 1 s), ledger stats {:>10} (goal ≤ 1 s), \
             {:.0} bytes on disk per envelope",
            ledger.ledger_rows,
            Millis(ledger.start_up),
            Millis(ledger.stats),
            ledger.bytes_per_envelope
        );
    }
    println!();
}

fn table_row(label: &str, groups: impl Iterator<Item = String>) {
    let mut line = format!("{label:<LABEL_WIDTH$}");
    for group in groups {
        line += &format!("    {group:<GROUP_WIDTH$}");
    }
    println!("{}", line.trim_end());
}

fn print_peak_rss(throughput: &Throughput, ledgers: &[RoundTrips], handovers: &Handovers) {
    let mut peaks = vec![format!("{} (throughput run)", mib(throughput.peak_rss_kib))];
    peaks.extend(
        ledgers.iter().map(|l| format!("{} ({}-envelope ledger)", mib(l.peak_rss_kib), l.ledger_rows)),
    );
    peaks.push(format!("{} (room run)", mib(handovers.peak_rss_kib)));
    println!("daemon peak RSS (VmHWM): {}", peaks.join(", "));
}
