//! Retention against its goals (issue 26): `Ledger::prune` on a ledger of a million
//! finished envelopes, each with a sent attempt and its two state changes, while another
//! connection to the same file keeps writing as a live daemon would.
//!
//! The ledger is filled with direct SQL in large transactions (fast; the rows are what
//! intake and outbound would have written, finished long ago). The prune runs as
//! `switchboard ledger prune` does, on a `Ledger` of its own; the "daemon" is a second
//! `Ledger` on the same file recording a session every few milliseconds
//! (`session_opened`, one write transaction through its writer), and the longest any of
//! those writes took is the longest pause a live daemon would have seen.
//!
//! Printed: the machine's load average (it is shared, and timings move with it), rows
//! removed, time taken, how long each batch held the write lock and of that its commit
//! alone (which is where SQLite runs an automatic checkpoint), the file's bytes and free
//! pages before and after, and the live writer's longest pause, each beside its goal. And
//! `switchboard ledger backup` of the ledger before and after the prune, beside the same
//! live writer: how long it takes, the copy's size, what the writer saw meanwhile. Run it
//! with `cargo bench --bench prune`;
//! `SWITCHBOARD_BENCH_QUICK=1` makes a smoke run of a few seconds, and
//! `SWITCHBOARD_BENCH_ENVELOPES` sets the number of envelopes.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use switchboard::config::{Database, Synchronous};
use switchboard::ids::AgentName;
use switchboard::ledger::Ledger;
use switchboard::ledger::sqlite::{WAL_LIMIT_BYTES, wal_path};

const ENVELOPES: usize = 1_000_000;
const QUICK_ENVELOPES: usize = 20_000;
/// Rows per fill transaction: large, since nothing else runs during the fill.
const FILL_TRANSACTION: usize = 50_000;
/// How often the live writer writes: about a busy bot's rate of commits.
const LIVE_WRITE_EVERY: Duration = Duration::from_millis(5);

/// The goal for a daemon's pause during a prune: a message's write waiting behind
/// one batch is not something a user notices.
const GOAL_LONGEST_PAUSE: Duration = Duration::from_millis(250);
/// What a batch may hold the writer for.
const GOAL_LONGEST_BATCH: Duration = Duration::from_millis(100);

fn main() {
    let quick = std::env::var_os("SWITCHBOARD_BENCH_QUICK").is_some();
    let envelopes = std::env::var("SWITCHBOARD_BENCH_ENVELOPES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { QUICK_ENVELOPES } else { ENVELOPES });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(run(envelopes, quick));
}

async fn run(envelopes: usize, quick: bool) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("ledger.db");
    let daemon = switchboard::ledger::open(&Database::Sqlite(path.clone()), Synchronous::Normal)
        .await
        .expect("the daemon's ledger");

    let fill_started = Instant::now();
    fill(&path, envelopes);
    let filled_in = fill_started.elapsed();

    // `switchboard ledger backup` of the whole ledger, beside the same live writer.
    let live = LiveWriter::start(daemon.clone(), wal_path(&path), "backup");
    let full_backup = back_up(&path, dir.path().join("before-the-prune.db")).await;
    let (mut backup_pauses, backup_wal) = live.stop().await;

    let load_before = load_average();
    let live = LiveWriter::start(daemon.clone(), wal_path(&path), "prune");
    let prune = switchboard::ledger::open_existing(&Database::Sqlite(path.clone()), Synchronous::Normal)
        .await
        .expect("the prune's ledger");
    let cutoff = chrono::Utc::now() - chrono::Duration::days(90);
    let report = prune.prune(cutoff, false).await.expect("the prune");
    let (mut pauses, largest_wal) = live.stop().await;
    let pruned_backup = back_up(&path, dir.path().join("after-the-prune.db")).await;
    prune.close().await;
    daemon.close().await;

    let removed = report.removed;
    let rows = removed.total();
    let (before, after) = (report.pages_before, report.pages_after);
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "prune benchmark: {envelopes} finished envelopes with an attempt and two events each{}",
        if quick { "; QUICK smoke run" } else { "" }
    );
    println!("  load average (1, 5, 15 min): {load_before} before the prune, {} after", load_average());
    println!("  fill (direct SQL):      {:.1} s", filled_in.as_secs_f64());
    println!(
        "  removed:                {rows} rows ({} envelopes, {} attempts, {} events), {} batches",
        removed.envelopes, removed.attempts, removed.envelope_events, report.batches
    );
    println!(
        "  time:                   {:.1} s ({:.0} rows/s)",
        report.took.as_secs_f64(),
        rows as f64 / report.took.as_secs_f64().max(f64::EPSILON)
    );
    let mut holds = report.batch_holds.clone();
    println!(
        "  writer held per batch:  p50 {}, p99 {}, longest {} (goal: longest ≤ {} ms)",
        ms(percentile(&mut holds, 0.50)),
        ms(percentile(&mut holds, 0.99)),
        ms(report.longest_batch),
        GOAL_LONGEST_BATCH.as_millis()
    );
    let mut commits = report.batch_commits.clone();
    println!(
        "    of which the commit:  p50 {}, p99 {}, longest {}",
        ms(percentile(&mut commits, 0.50)),
        ms(percentile(&mut commits, 0.99)),
        ms(commits.iter().copied().max().unwrap_or_default())
    );
    println!(
        "  live writer:            {} writes, p50 {}, p99 {}, longest pause {} (goal ≤ {} ms)",
        pauses.len(),
        ms(percentile(&mut pauses, 0.50)),
        ms(percentile(&mut pauses, 0.99)),
        ms(pauses.iter().copied().max().unwrap_or_default()),
        GOAL_LONGEST_PAUSE.as_millis()
    );
    println!(
        "  WAL:                    largest {:.1} MiB (its bound between checkpoints: {:.1} MiB)",
        mib(largest_wal),
        mib(WAL_LIMIT_BYTES.unsigned_abs())
    );
    println!(
        "  backup before the prune (live writer beside it): {:.1} s, {} envelopes, copy {:.1} MiB; live writer: \
         longest pause {}, WAL largest {:.1} MiB",
        full_backup.took.as_secs_f64(),
        full_backup.envelopes,
        mib(full_backup.bytes),
        ms(backup_pauses.iter().copied().max().unwrap_or_default()),
        mib(backup_wal)
    );
    println!(
        "    p50 of its writes meanwhile {}; backup after the prune: {:.1} s, copy {:.1} MiB (free pages left out)",
        ms(percentile(&mut backup_pauses, 0.50)),
        pruned_backup.took.as_secs_f64(),
        mib(pruned_backup.bytes)
    );
    println!(
        "  file before:            {:.1} MiB ({} pages, {} free)",
        mib(before.bytes()),
        before.page_count,
        before.free_pages
    );
    println!(
        "  file after:             {:.1} MiB ({} pages, {} free: reused by later writes)",
        mib(after.bytes()),
        after.page_count,
        after.free_pages
    );
}

/// `switchboard ledger backup` of the ledger at `path`, to `to`.
async fn back_up(path: &std::path::Path, to: PathBuf) -> switchboard::ledger::sqlite::Backup {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || switchboard::ledger::sqlite::back_up(&path, &to))
        .await
        .expect("the backup's thread")
        .expect("the backup")
}

/// The machine's load average (`/proc/loadavg`): the machine is shared, and its timings
/// are read beside it.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// The `q` quantile of `values` (sorted in place); zero when there are none.
fn percentile(values: &mut [Duration], q: f64) -> Duration {
    values.sort_unstable();
    let Some(last) = values.len().checked_sub(1) else {
        return Duration::ZERO;
    };
    values[((last as f64) * q).round() as usize]
}

/// `count` envelopes acked 400 days ago, each with a sent attempt and two events, then one
/// recent envelope (the newest stays anyway; this one also shows that recent rows do).
fn fill(path: &std::path::Path, count: usize) {
    let mut db = rusqlite::Connection::open(path).expect("a filling connection");
    db.pragma_update(None, "synchronous", "OFF").expect("synchronous off for the fill");
    let old = (chrono::Utc::now() - chrono::Duration::days(400))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut id = 0;
    while id < count {
        let tx = db.transaction().expect("a fill transaction");
        {
            let mut envelope = tx
                .prepare(
                    "INSERT INTO envelopes (id, trace_id, update_id, update_digest, kind, chat_id, chat_type, message_id, \
                     sender_id, sender_name, text, content, sent_at, received_at, route, agent, state, deliveries, state_changed_at) \
                     VALUES (?1, 'env_bench' || ?1, ?1, 'digest', 'message', 42, 'private', ?1, 42, 'Ann', \
                     'a message of an ordinary length, as a user would write it', \
                     'a message of an ordinary length, as a user would write it', ?2, ?2, 'dm', 'orch', 'acked', 1, ?2)",
                )
                .expect("the envelope insert");
            let mut attempt = tx
                .prepare(
                    "INSERT INTO attempts (id, op_id, envelope_id, agent, chat_id, reply_to_message_id, chunk_index, \
                     chunk_count, text, outcome, telegram_message_id, started_at, finished_at) \
                     VALUES (?1, 'op_bench' || ?1, ?1, 'orch', 42, ?1, 0, 1, 'an answer of an ordinary length too', \
                     'sent', ?1, ?2, ?2)",
                )
                .expect("the attempt insert");
            let mut event = tx
                .prepare(
                    "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) \
                     VALUES (?1, ?2, ?3, ?4, 'daemon')",
                )
                .expect("the event insert");
            for _ in 0..FILL_TRANSACTION.min(count - id) {
                id += 1;
                envelope.execute(rusqlite::params![id as i64, old]).expect("an envelope");
                attempt.execute(rusqlite::params![id as i64, old]).expect("an attempt");
                event.execute(rusqlite::params![id as i64, old, "queued", "pending"]).expect("an event");
                event.execute(rusqlite::params![id as i64, old, "pending", "acked"]).expect("an event");
            }
        }
        tx.commit().expect("the fill's commit");
    }
}

/// A daemon's writes during the prune: one session recorded every [`LIVE_WRITE_EVERY`],
/// each timed. Between writes it reads the WAL file's size, whose largest it reports.
struct LiveWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<Duration>, u64)>,
}

impl LiveWriter {
    /// `during` names its sessions, apart from another writer's on the same ledger.
    fn start(ledger: Ledger, wal: PathBuf, during: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let agent = AgentName::parse("orch").expect("an agent name");
            let mut pauses = Vec::new();
            let mut largest_wal = 0;
            while !stopping.load(Ordering::Relaxed) {
                let started = Instant::now();
                let session = format!("{during}-{}", pauses.len());
                ledger.session_opened(&session, &agent, None, 0).await.expect("a live write");
                pauses.push(started.elapsed());
                largest_wal = largest_wal.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
                tokio::time::sleep(LIVE_WRITE_EVERY).await;
            }
            (pauses, largest_wal)
        });
        Self { stop, task }
    }

    /// How long each write took, and the WAL's largest size meanwhile.
    async fn stop(self) -> (Vec<Duration>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the live writer")
    }
}
