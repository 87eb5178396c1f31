//! `kill -9` at random points under a steady load (issue 6).
//!
//! A load generator pushes messages from several users into four routed chats of two
//! agents; on the agent side, one loop per agent answers every envelope it is handed by
//! name, through the local API client, reconnecting after each restart. The daemon is
//! killed with SIGKILL after a random short run and started again, cycle after cycle.
//! Once everything has settled, the fake Bot API's records and the ledger must agree:
//!
//! - no update lost, none duplicated: exactly one envelope per pushed `update_id`;
//! - no envelope answered twice: at most one message per envelope (each reply carries its
//!   trace id), unless an operator reconciled it;
//! - no reply in the wrong chat: every message went to its envelope's chat and topic,
//!   threaded to its message; and every attempt the ledger calls `sent` is a message
//!   Telegram has, in that chat;
//! - every envelope that ends `pending` or `unresolved` has a story the ledger tells:
//!   an `unresolved` one has an `unknown` attempt; a `pending` one has no attempt whose
//!   last part went out.
//! - and it does settle: once the load stops and the daemon stays up, nothing is left
//!   `queued` or `pending` (every agent is connected and answers what it is handed).
//!
//! The schedule (run lengths, message targets and pacing, injected slow sends) comes from
//! a seeded RNG. The seed is printed; `CRASH_LOOP_SEED=N` replays a schedule, and
//! `CRASH_LOOP_CYCLES=N` changes the number of cycles. Timing still varies between runs:
//! the seed makes a failure likely to recur, not certain.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::daemon::*;
use switchboard::agents::api::client::{ClientError, DaemonClient};
use switchboard::agents::api::wire::{ReplyRequest, SessionEvent};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault, SentMessage, UserSpec};
use switchboard::ids::{AgentName, Secret};
use switchboard::ledger::{EnvelopeState, ListFilter, StoredAttempt, StoredEnvelope};
use tokio_util::sync::CancellationToken;

/// A few dozen cycles: enough to land kills in every phase of the path, and well under a
/// minute on a small CI machine.
const DEFAULT_CYCLES: usize = 50;

/// The `--ignored` long run.
const LONG_CYCLES: usize = 300;

/// How long the daemon runs between two kills: from barely started to a few batches.
const RUN_MS: std::ops::Range<u64> = 20..300;

/// The gap between two pushed messages: a steady load of roughly 70 messages a second.
const PUSH_GAP_MS: std::ops::Range<u64> = 3..25;

/// Per cycle, the chance that Telegram holds one `sendMessage` after recording it, so a
/// kill is likely to land between Telegram's acceptance and the ledger's record of it.
const SLOW_SEND_CHANCE: f64 = 0.5;

/// How long such a send is held: below the test configuration's 2 s send timeout, so an
/// uninterrupted one is confirmed.
const SLOW_SEND_MS: std::ops::Range<u64> = 50..400;

/// After the last cycle: how long the daemon may take to take in the last updates, and
/// how long the waiting envelopes may go without one of them settling. A backlog that
/// shrinks is waited for however large it is (a slow build on a busy machine leaves the
/// agents more to answer), and a stuck one is still caught.
const SETTLE_LIMIT: Duration = Duration::from_secs(40);

/// However steadily it shrinks, a backlog must be gone this long after the load stopped.
const SETTLE_CAP: Duration = Duration::from_secs(600);

/// How often the settling ledger is looked at.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// After a failed connection, an agent tries again this soon: the daemon is restarting.
const RECONNECT_DELAY: Duration = Duration::from_millis(20);

/// Examples quoted per violated assertion.
const EXAMPLES: usize = 8;

/// Every reply says which envelope it answers, so Telegram's records can be counted.
const REPLY_PREFIX: &str = "re ";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_with_agents_that_take_an_unknown_outcome_as_final() {
    crash_loop(Caller::TakesUnknownAsFinal, cycles(DEFAULT_CYCLES)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// A reply whose HTTP answer is lost to the kill after the daemon confirmed it is sent again
// with the same request id: the daemon returns the first outcome instead of sending twice.
// (Before request ids, about half of the 50-cycle runs answered an envelope twice.)
async fn kill_9_under_load_with_agents_that_resend_a_reply_whose_outcome_they_did_not_learn() {
    crash_loop(Caller::ResendsUnknown, cycles(DEFAULT_CYCLES)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long run: cargo test --test crash_loop -- --ignored"]
async fn kill_9_under_load_for_hundreds_of_cycles() {
    crash_loop(Caller::TakesUnknownAsFinal, cycles(LONG_CYCLES)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long run: cargo test --test crash_loop -- --ignored"]
async fn kill_9_under_load_for_hundreds_of_cycles_with_agents_that_resend() {
    crash_loop(Caller::ResendsUnknown, cycles(LONG_CYCLES)).await;
}

/// `CRASH_LOOP_CYCLES` overrides a test's number of cycles.
pub(crate) fn cycles(default: usize) -> usize {
    std::env::var("CRASH_LOOP_CYCLES").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

/// What an agent does with a reply whose outcome it did not learn: the daemon was not
/// reachable, or the connection broke before the answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Takes it as final, as the plugin tells the model today ("do not send it again"). If
    /// the envelope is still pending it comes back redelivered, and is answered then.
    TakesUnknownAsFinal,
    /// Sends the same reply again once the daemon is back, before anything else, as a
    /// plugin that asks the daemon what became of its request will. Only the daemon knows
    /// whether the first one went out, so it must not let the second one through.
    ResendsUnknown,
}

/// One pushed update and where it was posted.
#[derive(Debug, Clone, Copy)]
struct Pushed {
    update_id: i64,
    chat_id: i64,
    thread_id: Option<i32>,
}

/// What an agent loop saw, for the summary.
#[derive(Debug, Default)]
struct AgentStats {
    sessions: usize,
    envelopes: usize,
    redelivered: usize,
    replies_sent: usize,
    /// Envelopes handed again that this agent had already answered (or was answering).
    already_answered: usize,
    /// Replies sent again after their first outcome was unknown.
    resent: usize,
    slowest_reply: Duration,
    /// Replies still waiting for the daemon when the test stopped the agents.
    cut_off_by_the_end: usize,
    /// Failed replies by kind: unreachable, no answer, refused (with the code), protocol.
    failures: BTreeMap<String, usize>,
    /// What the agent is doing now, and since when: shown when the run does not settle, to
    /// tell an agent stuck in a call from a daemon that hands nothing over.
    doing: Option<DoingSince>,
}

/// What an agent does, since when (shown as how long ago).
struct DoingSince(Doing, Instant);

impl std::fmt::Debug for DoingSince {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} for {:.1?}", self.0, self.1.elapsed())
    }
}

#[derive(Debug, Clone)]
#[expect(dead_code, reason = "its fields are read through Debug, in the report")]
enum Doing {
    Connecting,
    /// Its session is open; waiting for the next event.
    Listening {
        session: usize,
        envelopes_in_session: usize,
    },
    Replying {
        trace_id: Option<String>,
    },
}

impl AgentStats {
    fn now(&mut self, doing: Doing) {
        self.doing = Some(DoingSince(doing, Instant::now()));
    }
}

fn seed() -> u64 {
    match std::env::var("CRASH_LOOP_SEED") {
        Ok(seed) => seed.parse().expect("CRASH_LOOP_SEED is a number"),
        Err(_) => SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64,
    }
}

async fn crash_loop(caller: Caller, cycles: usize) {
    let fake = Arc::new(FakeTelegram::start().await);
    // The load is far above Telegram's per-chat limits; the fake has none, so sends are not
    // paced here (pacing has its own test).
    let mut daemon = TestDaemon::start_with_env(&fake.api_url(), "", &default_routes(), UNPACED);
    crash_loop_on(&fake, &mut daemon, caller, cycles, RUN_MS).await;
}

/// Sends not paced: the load (about 70 a second) is far above Telegram's per-chat limits
/// and its overall budget, which the fake does not enforce (pacing has its own tests).
/// Paced at 30 a second, the backlog a run leaves would take most of the settling time.
pub(crate) const UNPACED: &[(&str, &str)] = &[
    ("SWITCHBOARD__OUTBOUND__PRIVATE_CHAT_INTERVAL_MS", "0"),
    ("SWITCHBOARD__OUTBOUND__GROUP_CHAT_INTERVAL_MS", "0"),
    ("SWITCHBOARD__OUTBOUND__GLOBAL_PER_SEC", "0"),
];

/// What the crash loop kills: one daemon, or the leader of replicas (`on_postgres`).
pub(crate) trait Deployment {
    /// Where the agents reach whichever daemon serves.
    fn api_addr(&self) -> std::net::SocketAddr;
    /// Kills what serves with SIGKILL and waits until something serves again: how long
    /// that took.
    fn kill_and_recover(&mut self) -> Duration;
    /// The ledger they share (only `switchboard` types cross between test modules, each of
    /// which compiles the harness for itself).
    fn database(&self) -> switchboard::config::Database;
    /// Stops everything gracefully: whether all of it stopped cleanly.
    fn stop(&mut self) -> std::process::ExitStatus;
}

impl Deployment for TestDaemon {
    fn api_addr(&self) -> std::net::SocketAddr {
        TestDaemon::api_addr(self)
    }

    fn kill_and_recover(&mut self) -> Duration {
        self.kill9();
        let killed = Instant::now();
        self.restart();
        killed.elapsed()
    }

    fn database(&self) -> switchboard::config::Database {
        self.ledger_at.database()
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        TestDaemon::stop(self)
    }
}

/// The crash loop on `deployment`, its daemons on `fake`: `cycles` kills, each after a run
/// of `run_ms`.
pub(crate) async fn crash_loop_on(
    fake: &Arc<FakeTelegram>,
    deployment: &mut dyn Deployment,
    caller: Caller,
    cycles: usize,
    run_ms: std::ops::Range<u64>,
) {
    let seed = seed();
    eprintln!("crash loop: {caller:?}, {cycles} cycles, seed {seed} (replay with CRASH_LOOP_SEED={seed})");
    let mut schedule = StdRng::seed_from_u64(seed);
    let load_rng = StdRng::seed_from_u64(seed.wrapping_add(1));
    let fake = Arc::clone(fake);
    let stop_load = CancellationToken::new();
    let stop_agents = CancellationToken::new();
    let pushed: Arc<Mutex<Vec<Pushed>>> = Arc::default();
    let load = tokio::spawn(push_load(Arc::clone(&fake), load_rng, Arc::clone(&pushed), stop_load.clone()));
    let agents: Vec<_> = [("orchestrator", ORCHESTRATOR_SECRET), ("worker", WORKER_SECRET)]
        .into_iter()
        .map(|(name, secret)| {
            let client = DaemonClient::new(
                deployment.api_addr(),
                AgentName::parse(name).unwrap(),
                Secret::new(secret.to_owned()),
            )
            .unwrap();
            let stats = Arc::new(Mutex::new(AgentStats::default()));
            let task =
                tokio::spawn(answer_everything(client, caller, Arc::clone(&stats), stop_agents.clone()));
            (name, stats, task)
        })
        .collect();

    let started = Instant::now();
    let mut recoveries = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        tokio::time::sleep(Duration::from_millis(schedule.random_range(run_ms.clone()))).await;
        if schedule.random_bool(SLOW_SEND_CHANCE) {
            let held = Duration::from_millis(schedule.random_range(SLOW_SEND_MS));
            fake.fail_send_message(Fault::RecordThenHang(held));
        }
        // Blocking: killing, reaping and waiting for the new daemon to listen. The load
        // and the agents go on on the other worker thread.
        recoveries.push(tokio::task::block_in_place(|| deployment.kill_and_recover()));
    }
    let cycling = started.elapsed();
    recoveries.sort_unstable();
    if let (Some(p50), Some(max)) = (recoveries.get(recoveries.len() / 2), recoveries.last()) {
        eprintln!("crash loop: from a kill until a daemon serves again: p50 {p50:.2?}, max {max:.2?}");
    }

    stop_load.cancel();
    load.await.unwrap();
    let pushed = pushed.lock().unwrap().clone();
    let last = pushed.iter().map(|p| p.update_id).max().expect("the load pushed something");
    wait_while_the_backlog_shrinks(&fake).await;
    fake.wait_until_confirmed(last, SETTLE_LIMIT).await;
    let ledger = switchboard::ledger::open(&deployment.database(), switchboard::config::Synchronous::Normal)
        .await
        .expect("open the ledger");
    let settled = settle(&ledger).await;
    if let Err(stuck) = &settled {
        // The daemons' own last log lines follow the failed assertion below: each
        // `TestDaemon` prints them when dropped by a test that panics.
        eprintln!("crash loop: {stuck}");
        for (name, stats, _) in &agents {
            let stats = stats.lock().unwrap();
            eprintln!(
                "crash loop: {name} is now {:?} (sessions {}, replies sent {})",
                stats.doing, stats.sessions, stats.replies_sent
            );
        }
    }

    stop_agents.cancel();
    let mut agent_stats = Vec::new();
    for (name, stats, task) in agents {
        task.await.unwrap();
        agent_stats.push((name, std::mem::take(&mut *stats.lock().unwrap())));
    }
    let status = tokio::task::block_in_place(|| deployment.stop());
    assert!(status.success(), "seed {seed}: the daemon stops cleanly at the end ({status})");

    let envelopes = ledger.list(&ListFilter { limit: i64::MAX, ..Default::default() }).await.unwrap();
    let mut attempts = HashMap::new();
    for envelope in &envelopes {
        attempts.insert(envelope.id, ledger.attempts_for(envelope.id).await.unwrap());
    }
    ledger.close().await;
    let sent = fake.sent_messages();

    eprintln!(
        "crash loop: {cycles} kills in {cycling:.1?}; {} updates pushed, {} envelopes ({}), {} messages sent; \
         attempts: {}; settled: {}",
        pushed.len(),
        envelopes.len(),
        tally(envelopes.iter().map(|e| e.state.to_string())),
        sent.len(),
        tally(attempts.values().flatten().map(outcome_of)),
        if settled.is_ok() { "yes" } else { "no" },
    );
    for (name, stats) in &agent_stats {
        eprintln!("crash loop: {name}: {stats:?}");
    }

    let mut violations = check_invariants(&pushed, &envelopes, &attempts, &sent);
    if let Err(stuck) = settled {
        violations.entry("everything settles once the load stops").or_default().push(stuck);
    }
    let report: Vec<String> = violations
        .iter()
        .filter(|(_, found)| !found.is_empty())
        .map(|(rule, found)| {
            let examples = found.iter().take(EXAMPLES).map(|f| format!("    {f}")).collect::<Vec<_>>();
            format!("  {rule}: {} case(s)\n{}", found.len(), examples.join("\n"))
        })
        .collect();
    assert!(
        report.is_empty(),
        "seed {seed} (replay with CRASH_LOOP_SEED={seed} CRASH_LOOP_CYCLES={cycles}): the ledger and \
         Telegram disagree with the contract:\n{}",
        report.join("\n")
    );
}

/// Pushes messages from several users into the four routed chats until stopped.
async fn push_load(
    fake: Arc<FakeTelegram>,
    mut rng: StdRng,
    pushed: Arc<Mutex<Vec<Pushed>>>,
    stop: CancellationToken,
) {
    let owner = UserSpec::new(OWNER_ID, "Olga").with_username("olga");
    let members: Vec<UserSpec> = (1..=5).map(|n| UserSpec::new(200 + n, &format!("Member {n}"))).collect();
    let dm = ChatSpec::private(OWNER_CHAT);
    let forum = ChatSpec::forum(FORUM_CHAT, "Ops forum");
    let group = ChatSpec::group(GROUP_CHAT, "Team");
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        let text = format!("message {n}");
        let from = &members[rng.random_range(0..members.len())];
        // owner-dm and forum (General) go to the orchestrator; ops-topic and team-group to
        // the worker.
        let (update_id, chat_id, thread_id) = match rng.random_range(0..4) {
            0 => (fake.push_text(&dm, &owner, &text), OWNER_CHAT, None),
            1 => (fake.push_text(&forum, from, &text), FORUM_CHAT, None),
            2 => (fake.push_topic_text(&forum, OPS_TOPIC, from, &text), FORUM_CHAT, Some(OPS_TOPIC)),
            _ => (fake.push_text(&group, from, &text), GROUP_CHAT, None),
        };
        pushed.lock().unwrap().push(Pushed { update_id, chat_id, thread_id });
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(rng.random_range(PUSH_GAP_MS))) => {}
        }
    }
}

/// An agent that answers every envelope it is handed, by name, one at a time, and
/// reconnects whenever its session ends. It answers each envelope once: a redelivered
/// envelope it already answered, or whose answer it is about to send again, is skipped.
/// What it does with a reply whose outcome it did not learn depends on `caller`.
async fn answer_everything(
    client: DaemonClient,
    caller: Caller,
    stats: Arc<Mutex<AgentStats>>,
    stop: CancellationToken,
) {
    let mut answered: HashSet<String> = HashSet::new();
    let mut unsettled: Vec<ReplyRequest> = Vec::new();
    while !stop.is_cancelled() {
        stats.lock().unwrap().now(Doing::Connecting);
        let mut session = tokio::select! {
            () = stop.cancelled() => return,
            opened = client.open_session() => match opened {
                Ok(session) => session,
                Err(_) => {
                    tokio::time::sleep(RECONNECT_DELAY).await;
                    continue;
                }
            },
        };
        let this_session = {
            let mut stats = stats.lock().unwrap();
            stats.sessions += 1;
            stats.sessions
        };
        let mut envelopes_in_session = 0;
        for reply in std::mem::take(&mut unsettled) {
            stats.lock().unwrap().resent += 1;
            if !send_reply(&client, caller, reply, &mut answered, &mut unsettled, &stats, &stop).await {
                return;
            }
        }
        loop {
            stats.lock().unwrap().now(Doing::Listening { session: this_session, envelopes_in_session });
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = session.next_event() => event,
            };
            let envelope = match event {
                Ok(Some(SessionEvent::Envelope(envelope))) => envelope,
                Ok(Some(_)) | Err(ClientError::Protocol { .. }) => continue,
                Ok(None) | Err(_) => break,
            };
            envelopes_in_session += 1;
            {
                let mut stats = stats.lock().unwrap();
                stats.envelopes += 1;
                stats.redelivered += usize::from(envelope.redelivered);
            }
            let trace = envelope.trace_id;
            if answered.contains(&trace) || unsettled.iter().any(|r| r.trace_id.as_ref() == Some(&trace)) {
                stats.lock().unwrap().already_answered += 1;
                continue;
            }
            // A resend carries the same request (and request id): the daemon then returns
            // the first request's outcome instead of sending again.
            let reply = ReplyRequest::new(format!("{REPLY_PREFIX}{trace}"), Some(trace));
            if !send_reply(&client, caller, reply, &mut answered, &mut unsettled, &stats, &stop).await {
                return;
            }
        }
    }
}

/// Waits until Telegram has handed every update over, however long a backlog that keeps
/// shrinking takes: a webhook's deliveries go one at a time, a commit each, so under load
/// the load leaves hundreds behind. What stops shrinking for [`SETTLE_LIMIT`] (or outlasts
/// [`SETTLE_CAP`]) is left to the confirmation's own wait to report.
async fn wait_while_the_backlog_shrinks(fake: &FakeTelegram) {
    let started = Instant::now();
    let (mut least, mut shrank) = (usize::MAX, Instant::now());
    loop {
        let backlog = fake.pending_update_count();
        if backlog == 0 || shrank.elapsed() > SETTLE_LIMIT || started.elapsed() > SETTLE_CAP {
            return;
        }
        if backlog < least {
            (least, shrank) = (backlog, Instant::now());
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// Sends one reply and files it by what the agent now knows: answered, refused (the
/// daemon's word is final), or unsettled (a resending caller sends it again once the
/// daemon is back). False when the test stopped the agent meanwhile.
async fn send_reply(
    client: &DaemonClient,
    caller: Caller,
    reply: ReplyRequest,
    answered: &mut HashSet<String>,
    unsettled: &mut Vec<ReplyRequest>,
    stats: &Mutex<AgentStats>,
    stop: &CancellationToken,
) -> bool {
    let started = Instant::now();
    stats.lock().unwrap().now(Doing::Replying { trace_id: reply.trace_id.clone() });
    let outcome = tokio::select! {
        () = stop.cancelled() => {
            stats.lock().unwrap().cut_off_by_the_end += 1;
            return false;
        }
        outcome = client.reply(&reply) => outcome,
    };
    let mut stats = stats.lock().unwrap();
    stats.slowest_reply = stats.slowest_reply.max(started.elapsed());
    let kind = match &outcome {
        Ok(_) => {
            stats.replies_sent += 1;
            answered.extend(reply.trace_id);
            return true;
        }
        Err(ClientError::Refused { error, .. }) => format!("refused {:?}", error.code),
        Err(ClientError::Unreachable { .. }) => "unreachable".to_owned(),
        Err(ClientError::NoAnswer { .. }) => "no answer".to_owned(),
        Err(ClientError::Protocol { .. }) => "protocol".to_owned(),
    };
    *stats.failures.entry(kind).or_default() += 1;
    let unknown = matches!(outcome, Err(ClientError::Unreachable { .. } | ClientError::NoAnswer { .. }));
    if unknown && caller == Caller::ResendsUnknown {
        unsettled.push(reply);
    }
    true
}

/// Waits until nothing is queued or pending any more (every envelope answered or
/// unresolved); an error says what is still waiting once [`SETTLE_LIMIT`] passed with none
/// of it settling, or [`SETTLE_CAP`] in all.
async fn settle(ledger: &switchboard::ledger::Ledger) -> Result<(), String> {
    let started = Instant::now();
    let mut fewest_waiting = i64::MAX;
    let mut last_settled = Instant::now();
    loop {
        let counts = ledger.count_by_state().await.unwrap();
        let waiting: i64 = counts
            .iter()
            .filter(|(state, _)| state == "queued" || state == "pending")
            .map(|(_, count)| count)
            .sum();
        if waiting == 0 {
            eprintln!("crash loop: settled {:.1?} after the load stopped", started.elapsed());
            return Ok(());
        }
        if waiting < fewest_waiting {
            fewest_waiting = waiting;
            last_settled = Instant::now();
        }
        if last_settled.elapsed() > SETTLE_LIMIT || started.elapsed() > SETTLE_CAP {
            let counts = counts.iter().map(|(state, n)| format!("{state} {n}")).collect::<Vec<_>>();
            return Err(format!(
                "{waiting} envelope(s) still waiting {:.1?} after the load stopped, none settled for {:.1?} ({})",
                started.elapsed(),
                last_settled.elapsed(),
                counts.join(", ")
            ));
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// Every violated rule, with the cases that violate it.
fn check_invariants(
    pushed: &[Pushed],
    envelopes: &[StoredEnvelope],
    attempts: &HashMap<i64, Vec<StoredAttempt>>,
    sent: &[SentMessage],
) -> BTreeMap<&'static str, Vec<String>> {
    let mut violations: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut violation = |rule: &'static str, case: String| violations.entry(rule).or_default().push(case);

    // No update lost, none duplicated.
    let mut by_update: HashMap<i64, Vec<&StoredEnvelope>> = HashMap::new();
    for envelope in envelopes {
        by_update.entry(envelope.update_id.unwrap_or_default()).or_default().push(envelope);
    }
    for p in pushed {
        match by_update.get(&p.update_id).map(Vec::as_slice).unwrap_or_default() {
            [envelope] => {
                if (envelope.chat_id, envelope.thread_id) != (p.chat_id, p.thread_id.map(i64::from)) {
                    violation(
                        "no reply in the wrong chat",
                        format!(
                            "{}: recorded in chat {:?}, the update came from {:?}",
                            envelope.trace_id,
                            (envelope.chat_id, envelope.thread_id),
                            (p.chat_id, p.thread_id)
                        ),
                    );
                }
            }
            [] => violation("no update lost", format!("update {} has no envelope", p.update_id)),
            more => {
                violation("none duplicated", format!("update {} has {} envelopes", p.update_id, more.len()))
            }
        }
    }
    let pushed_ids: std::collections::HashSet<i64> = pushed.iter().map(|p| p.update_id).collect();
    for envelope in envelopes.iter().filter(|e| !pushed_ids.contains(&e.update_id.unwrap_or_default())) {
        violation(
            "none duplicated",
            format!(
                "{} records update {}, never pushed",
                envelope.trace_id,
                envelope.update_id.unwrap_or_default()
            ),
        );
    }

    let by_trace: HashMap<&str, &StoredEnvelope> =
        envelopes.iter().map(|e| (e.trace_id.as_str(), e)).collect();
    let attempts_of = |envelope: &StoredEnvelope| attempts.get(&envelope.id).map_or(&[][..], Vec::as_slice);

    // No reply in the wrong chat; and count the messages per envelope.
    let mut answers: HashMap<&str, Vec<i32>> = HashMap::new();
    for message in sent {
        let trace = message.text.strip_prefix(REPLY_PREFIX).unwrap_or_default();
        let Some(envelope) = by_trace.get(trace) else {
            violation(
                "no reply in the wrong chat",
                format!(
                    "message {} to {} answers no known envelope: {:?}",
                    message.message_id, message.chat_id, message.text
                ),
            );
            continue;
        };
        answers.entry(envelope.trace_id.as_str()).or_default().push(message.message_id);
        let expected = (envelope.chat_id, envelope.thread_id, Some(envelope.message_id));
        let actual = (
            message.chat_id,
            message.message_thread_id.map(i64::from),
            message.reply_to_message_id.map(i64::from),
        );
        if actual != expected {
            violation(
                "no reply in the wrong chat",
                format!(
                    "{}: message {} went to (chat, topic, reply to) {actual:?}, the envelope is {expected:?}",
                    envelope.trace_id, message.message_id
                ),
            );
        }
    }

    // Every attempt the ledger calls sent is a message Telegram has, in that chat.
    let sent_by_id: HashMap<i32, &SentMessage> = sent.iter().map(|m| (m.message_id, m)).collect();
    for envelope in envelopes {
        for attempt in attempts_of(envelope).iter().filter(|a| outcome_of(a) == "sent") {
            let message = attempt.telegram_message_id.and_then(|id| sent_by_id.get(&(id as i32)));
            if message.is_none_or(|m| m.chat_id != attempt.chat_id) {
                violation(
                    "no reply in the wrong chat",
                    format!(
                        "{}: attempt {} is recorded sent as message {:?} to {}, which Telegram does not have there",
                        envelope.trace_id, attempt.op_id, attempt.telegram_message_id, attempt.chat_id
                    ),
                );
            }
        }
    }

    // No envelope answered twice, unless an operator reconciled it (and may have been
    // wrong). Being unresolved excuses nothing here: an unknown attempt may be one message
    // in the chat, but the resolver lets nothing follow it until it is reconciled, so a
    // second message means something went out that should not have.
    for (trace, messages) in &answers {
        let envelope = by_trace[trace];
        let explained = attempts_of(envelope).iter().any(|a| a.reconciled_outcome.is_some());
        if messages.len() > 1 && !explained {
            violation(
                "no envelope answered twice",
                format!(
                    "{trace} ({}) was answered {} times: messages {messages:?}; attempts: {}",
                    envelope.state,
                    messages.len(),
                    describe_attempts(attempts_of(envelope))
                ),
            );
        }
    }

    // Every envelope that ends pending or unresolved has a story the ledger tells.
    for envelope in envelopes {
        let attempts = attempts_of(envelope);
        let (rule, told) = match envelope.state {
            EnvelopeState::Unresolved => (
                "an unresolved envelope has an unknown attempt",
                attempts.iter().any(|a| outcome_of(a) == "unknown" && a.reconciled_outcome.is_none()),
            ),
            EnvelopeState::Pending => (
                "a pending envelope has no reply that went out",
                !attempts.iter().any(|a| outcome_of(a) == "sent" && a.chunk_index + 1 == a.chunk_count),
            ),
            _ => continue,
        };
        if !told {
            violation(rule, format!("{}: attempts: {}", envelope.trace_id, describe_attempts(attempts)));
        }
    }
    violations
}

/// An attempt's outcome as the ledger spells it, whichever type carries it.
fn outcome_of(attempt: &StoredAttempt) -> String {
    attempt.outcome.to_string()
}

fn describe_attempts(attempts: &[StoredAttempt]) -> String {
    if attempts.is_empty() {
        return "none".into();
    }
    attempts
        .iter()
        .map(|a| {
            format!(
                "{} part {}/{} {}{}",
                a.op_id,
                a.chunk_index + 1,
                a.chunk_count,
                a.outcome,
                a.telegram_message_id.map(|m| format!(" (message {m})")).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// "acked 310, unresolved 2" from a list of labels.
fn tally(labels: impl Iterator<Item = String>) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for label in labels {
        *counts.entry(label).or_default() += 1;
    }
    counts.iter().map(|(label, n)| format!("{label} {n}")).collect::<Vec<_>>().join(", ")
}
