//! Checkpoints off the path of commits.
//!
//! In WAL mode a commit appends its pages to the WAL, and SQLite copies them back into
//! the database file in a checkpoint (syncing both files under `synchronous = normal`).
//! Left to itself it checkpoints inside whichever commit crosses `wal_autocheckpoint`
//! pages: about one message in a hundred waited several milliseconds for all the others
//! (most of the hot path's p99). Here a task of its own checkpoints on a connection of its
//! own a moment after commits, in PASSIVE mode, which never blocks a reader or a writer;
//! SQLite's automatic checkpoint stays as a backstop, at a higher threshold.
//!
//! A PASSIVE checkpoint copies the WAL back but never rewinds it: SQLite starts the WAL
//! over only when a writer begins after a checkpoint that caught up with every frame, and
//! under a steady load a commit nearly always lands while the checkpoint runs. The file
//! then grows for as long as the load lasts (17 MiB beside a 26 MiB database after ten
//! minutes at 40 messages a second). So once the WAL holds more than [`WAL_LIMIT_BYTES`],
//! the checkpointer asks for a RESTART checkpoint, after which the next commit writes from
//! the start of the file again and cuts it back to that size (`journal_size_limit`). The
//! file is not emptied when the daemon goes idle: what it keeps is room the next commits
//! reuse, which a nearly full disk still has.
//!
//! A RESTART holds new writers off while it copies and while it waits for the connections
//! in its way (they wait asynchronously). So it is asked for only right after a PASSIVE
//! that copied every frame, and has nothing left to copy but what was committed since;
//! after a PASSIVE that could not (a reader in its way, another connection's checkpoint
//! running, as a prune's between its batches) a PASSIVE is tried again soon instead. A
//! RESTART there would copy the rest, a whole batch of a prune, with every writer waiting:
//! a daemon's write beside a prune waited half a second for one. And it waits for others
//! only so long: [`FORCED_CHECKPOINT_WAIT`] at first.
//! On a loaded machine a reader or a write can take longer than that, and the WAL grew
//! past its bound for as long as RESTARTs kept giving up. So one that could not be had is
//! tried again [`FORCED_CHECKPOINT_RETRY`] later, commits or not (a PASSIVE first, so that
//! the RESTART has only what came since to copy), each waiting twice as long as the one
//! before, up to [`LONGEST_FORCED_CHECKPOINT_WAIT`]: the longer waits, which hold the
//! daemon's writes off longer, come only while the WAL is already past its bound and
//! shorter ones have failed. The decision is [`WalBound`]'s.
//!
//! Syncing and copying back are two jobs, done at two paces. A burst of commits is made
//! safe from a power loss [`CHECKPOINT_DELAY`] after it began, by syncing the WAL file
//! alone; the copy back into the database file, which writes each page again and syncs the
//! database file too, waits for [`COMMITS_PER_COPY_BACK`] commits (about half the WAL's
//! bound), a WAL file past its bound, or [`COPY_BACK_INTERVAL`] since the last one
//! ([`CopyBack`] decides). A PASSIVE checkpoint with half a bound to copy catches up, and
//! the WAL then starts over by itself, with no RESTART to hold writers off. A page that
//! many commits rewrite (an index's last page, the poll offset) is copied once per copy
//! back instead of once a burst, and a moderate load (a message every 50 ms) syncs one file
//! a burst instead of two. An idle ledger is still copied back within the interval.
//!
//! Each time the WAL starts over, the commit that starts it pays for it, on the writer's
//! thread: SQLite syncs the WAL's new header before it writes a frame after it (so that an
//! out-of-order write cannot corrupt the database), and at that commit cuts the file back
//! to `journal_size_limit`. That is a few milliseconds on the loop's path, once per copy
//! back that caught up. So the bound is 16 MiB, not less: under a steady load the WAL starts
//! over about every 85 messages instead of every 20, and the loop's p99 was about a third
//! lower (docs/performance.md). A WAL of up to 4,096 frames keeps its index in one hash
//! table, so reads through it cost no more than through a smaller one.
//!
//! What a commit guarantees does not change: it is in the WAL when it returns, as before
//! (and `synchronous = full` still syncs the WAL at every commit). Under `normal`, a power
//! loss may take what was committed since the WAL was last synced: at most about
//! [`CHECKPOINT_DELAY`] of commits. SQLite's recovery reads a WAL frame by frame and keeps
//! every transaction whose frames all carry valid checksums, so a sync of the file by
//! another descriptor (POSIX syncs the file, not the descriptor) is all it needs; it is the
//! sync SQLite itself makes before each checkpoint.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::in_place::{PAGE_CACHE_KIB, synchronous_pragma};
use crate::config::Synchronous;
use crate::ledger::sqlite::{BUSY_TIMEOUT, LedgerError, LedgerResult};
use crate::ledger::{LedgerWrite, WriteWatch};

/// How long commits may gather before the WAL is synced (or checkpointed): a burst of them
/// is made safe at once, and a power loss under `synchronous = normal` can take no more
/// than about this much (see the module documentation).
pub(crate) const CHECKPOINT_DELAY: Duration = Duration::from_millis(100);

/// How long synced commits may wait in the WAL before they are copied back into the
/// database file, while the WAL is within its bound. Longer saves more copies of pages that
/// commits keep rewriting; the copy back is what lets the WAL start over and what a copy of
/// the database file alone shows, so it stays short.
pub(crate) const COPY_BACK_INTERVAL: Duration = Duration::from_secs(1);

/// How many commits may wait in the WAL before they are copied back, whatever the time:
/// about half the WAL's bound at the frames a message's three commits write (26 pages of
/// 4 KiB in all), so that a steady load is copied back well before the bound would force a
/// RESTART. (The WAL file's length cannot say: it stays at its high-water mark.)
pub(crate) const COMMITS_PER_COPY_BACK: u64 = 256;

/// `wal_autocheckpoint` while the checkpointer runs: SQLite checkpoints inside a commit
/// only if the checkpointer has fallen this far behind (40 MB of WAL with 4 KiB pages).
pub(crate) const BACKSTOP_PAGES: u32 = 10_000;

/// The WAL's bound: past it, the next checkpoint rewinds the WAL (RESTART), and the file
/// is cut back to this size when it does (`journal_size_limit` of the writer). Large
/// enough that the WAL starts over, which costs the commit that starts it a sync, rarely
/// (see the module documentation); 4,096 frames of 4 KiB.
pub const WAL_LIMIT_BYTES: i64 = 16 * 1024 * 1024;

/// How long a RESTART checkpoint first waits for a reader or writer (holding new writers
/// off meanwhile) before it gives up; each one in a row that could not be had waits twice
/// as long as the one before, up to [`LONGEST_FORCED_CHECKPOINT_WAIT`].
const FORCED_CHECKPOINT_WAIT: Duration = Duration::from_millis(50);

/// The longest a RESTART checkpoint waits: the longest a write of the daemon can be held
/// off by one, and only after several in a row could not be had while the WAL was past
/// its bound. Below the quarter of a second a daemon's write may wait beside a prune.
const LONGEST_FORCED_CHECKPOINT_WAIT: Duration = Duration::from_millis(200);

/// How soon a RESTART checkpoint that could not be had is tried again (a PASSIVE first),
/// with or without commits meanwhile.
const FORCED_CHECKPOINT_RETRY: Duration = CHECKPOINT_DELAY;

/// The commits of the ledger's connections, as their commit hooks tell the checkpointer.
#[derive(Debug, Default)]
struct Commits {
    /// Rung by each commit; one ring stands for all the commits before it is heard.
    bell: Notify,
    /// Commits since the checkpointer last took the count.
    count: AtomicU64,
}

impl Commits {
    fn take_count(&self) -> u64 {
        self.count.swap(0, Ordering::Relaxed)
    }
}

/// The checkpointing task of one ledger.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    /// Rung and counted by every commit of the ledger's connections (their commit hook).
    commits: Arc<Commits>,
    /// Stops the task when the ledger closes.
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    pub(crate) fn new() -> Self {
        Self { commits: Arc::default(), stop: CancellationToken::new(), task: Mutex::new(None) }
    }

    /// What a connection's commit hook calls. It runs inside SQLite's commit, on the
    /// connection's thread, and only counts the commit and rings a bell.
    pub(crate) fn on_commit(&self) -> impl Fn() + Send + 'static {
        let commits = Arc::clone(&self.commits);
        move || {
            commits.count.fetch_add(1, Ordering::Relaxed);
            commits.bell.notify_one();
        }
    }

    /// Opens the checkpointer's own connection to the (existing, migrated) database at
    /// `path` and starts it.
    pub(crate) async fn start(
        &self,
        path: &Path,
        synchronous: Synchronous,
        writes: Arc<WriteWatch>,
    ) -> LedgerResult<()> {
        let connection = open_off_runtime(path, synchronous, "the checkpointer's connection").await?;
        let wal = WalFile { path: wal_path(path), synced_by_commits: synchronous == Synchronous::Full };
        let task = tokio::spawn(run(connection, wal, Arc::clone(&self.commits), self.stop.clone(), writes));
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(())
    }

    /// Stops the task and closes its connection.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// The checkpointer's connection: the ledger's page cache and `synchronous` (which says how
/// a checkpoint syncs). Its checkpoints run on a blocking thread, so SQLite's busy handler
/// may wait there (PASSIVE never calls it; opening the file may).
fn open(path: &Path, synchronous: Synchronous) -> LedgerResult<Connection> {
    let db = Connection::open_with_flags(path, super::in_place::OWN_CONNECTION_FLAGS)?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    db.pragma_update(None, "cache_size", PAGE_CACHE_KIB)?;
    db.pragma_update(None, "synchronous", synchronous_pragma(synchronous))?;
    db.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)?;
    Ok(db)
}

/// [`open`] on a blocking thread (opening the file may wait in SQLite's busy handler);
/// `what` names the connection if that thread is lost.
async fn open_off_runtime(path: &Path, synchronous: Synchronous, what: &str) -> LedgerResult<Connection> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || open(&path, synchronous))
        .await
        .map_err(|e| LedgerError::other(format!("opening {what} was cut short: {e}")))?
}

/// What a checkpoint is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Copy what it can without waiting for anyone: after commits.
    Passive,
    /// Copy everything and have the next commit start the WAL over, waiting for others at
    /// most this long: when the WAL is too long.
    Restart(Duration),
}

impl Mode {
    fn pragma(self) -> &'static str {
        match self {
            Self::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
            Self::Restart(_) => "PRAGMA wal_checkpoint(RESTART)",
        }
    }
}

/// What a checkpoint reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Checkpointed {
    /// A reader or writer kept it from doing all it was asked (SQLite's `busy` column),
    /// which is no failure: what was not done is done next time.
    busy: bool,
    /// How many frames the WAL held; -1 when the checkpoint could not run at all (another
    /// connection's was running).
    wal_frames: i64,
}

/// The checkpointer's hold on the WAL's bound, from one checkpoint to the next: a pure
/// decision, so the bound is a unit test away.
#[derive(Debug, Default)]
struct WalBound {
    /// Whether the last checkpoint that could say found the WAL past its bound.
    past_bound: bool,
    /// RESTART checkpoints in a row that could not be had.
    failed_restarts: u32,
}

/// What the WAL's bound asks for after a PASSIVE checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BoundStep {
    /// The WAL is within its bound: nothing more.
    Within,
    /// Past it, and the PASSIVE copied every frame: a RESTART, waiting for other connections
    /// at most this long, only waits (for readers to move on) while it holds writers off.
    Restart(Duration),
    /// Past it, and the PASSIVE did not copy everything (a reader in its way, or another
    /// connection's checkpoint running): another PASSIVE soon. A RESTART now would copy the
    /// rest, a whole batch of a prune say, while it holds every writer off.
    PassiveAgain,
}

impl WalBound {
    /// After a PASSIVE checkpoint: what the bound asks for.
    fn after_passive(&mut self, passive: Checkpointed, page_size: i64) -> BoundStep {
        if passive.wal_frames >= 0 {
            self.past_bound = passive.wal_frames.saturating_mul(page_size) > WAL_LIMIT_BYTES;
        }
        // Otherwise another connection's checkpoint ran instead: it says nothing of the WAL
        // now, and a bound already passed still stands.
        if !self.past_bound {
            self.failed_restarts = 0;
            BoundStep::Within
        } else if caught_up(passive) {
            BoundStep::Restart(self.restart_wait())
        } else {
            BoundStep::PassiveAgain
        }
    }

    /// A RESTART waits twice as long as the last for every one in a row that failed.
    fn restart_wait(&self) -> Duration {
        let doublings = self.failed_restarts.min(u32::BITS - 1);
        FORCED_CHECKPOINT_WAIT.saturating_mul(1 << doublings).min(LONGEST_FORCED_CHECKPOINT_WAIT)
    }

    /// After a RESTART checkpoint: how soon to try again, when it could not be had (the
    /// WAL is still past its bound, and no commit may come to ask again).
    fn after_restart(&mut self, restart: Checkpointed) -> Option<Duration> {
        if restart.wal_frames < 0 {
            // Another connection's checkpoint was running (another process's checkpointer,
            // say): this one did not wait for anyone, and the next need not wait longer.
            Some(FORCED_CHECKPOINT_RETRY)
        } else if restart.busy {
            self.failed_restarts = self.failed_restarts.saturating_add(1);
            Some(FORCED_CHECKPOINT_RETRY)
        } else {
            self.past_bound = false;
            self.failed_restarts = 0;
            None
        }
    }
}

/// What the checkpointer does for a burst of commits, once it has gathered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterCommits {
    /// Sync the WAL file: the burst is safe from a power loss, and its copy back into the
    /// database file waits for more.
    SyncWal,
    /// Copy the WAL back into the database file (a PASSIVE checkpoint, which syncs the WAL
    /// first), then see to the WAL's bound.
    Checkpoint,
}

/// When the WAL is copied back into the database file: a pure decision, from the time of
/// the last checkpoint and the WAL file's length.
#[derive(Debug)]
struct CopyBack {
    /// When the last checkpoint ran (or the checkpointer started).
    last: Instant,
    /// Commits since then.
    commits: u64,
}

impl CopyBack {
    fn new(now: Instant) -> Self {
        Self { last: now, commits: 0 }
    }

    /// For a burst of `commits` that has gathered: a checkpoint once [`COMMITS_PER_COPY_BACK`]
    /// commits wait in the WAL, the WAL file is past its bound or the last checkpoint is
    /// [`COPY_BACK_INTERVAL`] old; else a sync.
    ///
    /// The file's length is the WAL's high-water mark: a WAL that starts over is written
    /// again from its start, and cut back to the bound, so a file past the bound means
    /// frames past it (or a file not yet cut back, which one checkpoint more settles).
    fn after_commits(&mut self, commits: u64, now: Instant, wal_bytes: u64) -> AfterCommits {
        self.commits = self.commits.saturating_add(commits);
        if self.commits >= COMMITS_PER_COPY_BACK
            || wal_bytes > WAL_LIMIT_BYTES.unsigned_abs()
            || now.duration_since(self.last) >= COPY_BACK_INTERVAL
        {
            AfterCommits::Checkpoint
        } else {
            AfterCommits::SyncWal
        }
    }

    /// When commits synced but not copied back are due to be, with or without more commits.
    fn due(&self) -> Instant {
        self.last + COPY_BACK_INTERVAL
    }

    /// Whether commits synced but not copied back wait in the WAL.
    fn owes(&self) -> bool {
        self.commits > 0
    }

    fn checkpointed(&mut self, at: Instant) {
        self.last = at;
        self.commits = 0;
    }
}

/// The ledger's WAL file, which the checkpointer syncs between checkpoints.
#[derive(Debug, Clone)]
struct WalFile {
    path: PathBuf,
    /// Under `synchronous = full` every commit has synced it already.
    synced_by_commits: bool,
}

impl WalFile {
    fn bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Syncs the file's data (the frames and the length that counts them), as SQLite's own
    /// sync of the WAL before a checkpoint does, on a blocking thread: it takes
    /// milliseconds.
    async fn sync_off_runtime(&self) -> LedgerResult<()> {
        if self.synced_by_commits {
            return Ok(());
        }
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            std::fs::File::open(&path).and_then(|file| file.sync_data()).map_err(|e| wal_sync_error(&path, e))
        })
        .await
        .unwrap_or_else(|e| Err(LedgerError::other(format!("syncing the ledger's WAL was cut short: {e}"))))
    }
}

/// Where SQLite keeps the WAL of the database at `database`: its name with `-wal` after it.
pub fn wal_path(database: &Path) -> PathBuf {
    let mut name = OsString::from(database.as_os_str());
    name.push("-wal");
    PathBuf::from(name)
}

fn wal_sync_error(wal: &Path, error: io::Error) -> LedgerError {
    let detail = format!("syncing {}: {error}", wal.display());
    if error.kind() == io::ErrorKind::StorageFull {
        LedgerError::DiskFull { detail, source: Box::new(error) }
    } else {
        LedgerError::Other {
            message: format!("could not sync the ledger's WAL ({detail})"),
            source: Some(Box::new(error)),
        }
    }
}

/// One checkpoint. It reports a checkpoint it could not write as an error, and a reader or
/// writer in its way as `busy`. A RESTART waits for others only as long as it says.
fn checkpoint(db: &Connection, mode: Mode) -> LedgerResult<Checkpointed> {
    if let Mode::Restart(wait) = mode {
        db.busy_timeout(wait)?;
    }
    let reported = db.query_row(mode.pragma(), [], |row| {
        Ok(Checkpointed { busy: row.get::<_, i64>(0)? != 0, wal_frames: row.get(1)? })
    });
    if mode != Mode::Passive {
        db.busy_timeout(BUSY_TIMEOUT)?;
    }
    Ok(reported?)
}

/// Runs one checkpoint on a blocking thread; the connection goes there and comes back.
async fn on_blocking_thread(
    connection: Connection,
    mode: Mode,
) -> Option<(Connection, LedgerResult<Checkpointed>)> {
    match tokio::task::spawn_blocking(move || {
        let checkpointed = checkpoint(&connection, mode);
        (connection, checkpointed)
    })
    .await
    {
        Ok(done) => Some(done),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "the ledger's checkpointer stopped; SQLite checkpoints by itself once the WAL holds {BACKSTOP_PAGES} pages"
            );
            None
        }
    }
}

async fn run(
    mut connection: Connection,
    wal: WalFile,
    commits: Arc<Commits>,
    stop: CancellationToken,
    writes: Arc<WriteWatch>,
) {
    let page_size: i64 = connection.query_row("PRAGMA page_size", [], |row| row.get(0)).unwrap_or(4096);
    let mut bound = WalBound::default();
    let mut copy_back = CopyBack::new(Instant::now());
    let mut retry_in = None;
    loop {
        let step = if let Some(pause) = retry_in.take() {
            // The WAL is past its bound and the last RESTART could not be had: try again
            // soon, commits or not. An idle daemon's next commit could be hours away, and
            // the reader that was in the way may be gone.
            tokio::select! {
                () = tokio::time::sleep(pause) => AfterCommits::Checkpoint,
                () = stop.cancelled() => break,
            }
        } else {
            tokio::select! {
                () = commits.bell.notified() => {
                    // Let the burst this commit began go by; the commits meanwhile ring
                    // again, and get the next sync.
                    tokio::select! {
                        () = tokio::time::sleep(CHECKPOINT_DELAY) => {}
                        () = stop.cancelled() => break,
                    }
                    copy_back.after_commits(commits.take_count(), Instant::now(), wal.bytes())
                }
                // Commits synced but not copied back yet are due at `copy_back.due()`.
                () = tokio::time::sleep_until(copy_back.due()), if copy_back.owes() => AfterCommits::Checkpoint,
                () = stop.cancelled() => break,
            }
        };
        if step == AfterCommits::SyncWal {
            match wal.sync_off_runtime().await {
                // Not observed as a checkpoint that succeeded: a sync needs no room on the
                // disk, and a checkpoint failing for want of it fails until one succeeds.
                Ok(()) => continue,
                // The checkpoint syncs the WAL too, and says whether it can.
                Err(e) => {
                    tracing::warn!(error = %e, "could not sync the ledger's WAL; checkpointing it instead");
                    writes.observe::<()>(LedgerWrite::Checkpoint, &Err(e));
                }
            }
        }
        // Copying the WAL back and syncing both files takes milliseconds: off the runtime.
        // A PASSIVE first even when the WAL is past its bound, so that the RESTART, which
        // holds new writers off, has only what came since to copy.
        // What committed until now is in this checkpoint's reach.
        let started = Instant::now();
        commits.take_count();
        let Some((db, passive)) = on_blocking_thread(connection, Mode::Passive).await else { break };
        connection = db;
        copy_back.checkpointed(started);
        let step = match &passive {
            Ok(passive) => bound.after_passive(*passive, page_size),
            Err(_) => BoundStep::Within,
        };
        writes.observe(LedgerWrite::Checkpoint, &passive);
        if let Err(e) = passive {
            tracing::warn!(
                error = %e,
                "could not checkpoint the ledger's WAL; SQLite checkpoints by itself once it holds {BACKSTOP_PAGES} pages"
            );
        }
        if step == BoundStep::PassiveAgain {
            retry_in = Some(FORCED_CHECKPOINT_RETRY);
        }
        if let BoundStep::Restart(wait) = step {
            let mode = Mode::Restart(wait);
            let Some((db, restart)) = on_blocking_thread(connection, mode).await else { break };
            connection = db;
            // A RESTART that failed outright (not merely busy) is asked for again after the
            // next commits, as a PASSIVE that failed is.
            if let Ok(restart) = restart {
                retry_in = bound.after_restart(restart);
                if restart.busy {
                    tracing::debug!(
                        ?mode,
                        failed_in_a_row = bound.failed_restarts,
                        "the WAL is past its bound and a RESTART checkpoint could not be had"
                    );
                }
            }
        }
    }
}

/// The checkpoints of a long run of write transactions (a prune's batches): one after each,
/// waited for, on a connection of their own. Left to the background checkpointer, such a
/// run writes the WAL faster than a PASSIVE checkpoint copies it back (a checkpoint writes
/// pages all over the database file, a batch appends them to the WAL). Waited for between
/// the batches, a PASSIVE copies a batch's pages back with no lock held, and paces the
/// batches at the rate the file takes them.
///
/// No RESTART follows it here. A RESTART holds every writer off while it copies what was
/// committed since and syncs the database file, and on a disk busy with a prune's writes
/// that sync took up to 440 ms, which a live daemon's write waited out. Without it the WAL
/// may pass its bound while a prune runs (a live writer's commits keep it from starting
/// over by itself); the background checkpointer's RESTART, which follows only a PASSIVE
/// that caught up, brings it back.
pub(crate) struct BetweenBatches {
    /// `None` while a checkpoint has it on a blocking thread, or after one was lost.
    connection: Option<Connection>,
}

impl BetweenBatches {
    pub(crate) async fn open(path: &Path, synchronous: Synchronous) -> LedgerResult<Self> {
        let connection =
            open_off_runtime(path, synchronous, "a connection for the checkpoints between batches").await?;
        Ok(Self { connection: Some(connection) })
    }

    /// PASSIVE checkpoints, until one has caught up with the WAL. One that fails or cannot
    /// catch up is no failure of the batches (what it did not copy back stays in the WAL for
    /// the next): logged, at debug level when merely busy.
    pub(crate) async fn checkpoint(&mut self) {
        for _ in 0..PASSIVE_TRIES {
            match self.run(Mode::Passive).await {
                Some(passive) if caught_up(passive) => return,
                Some(_) => tokio::time::sleep(PASSIVE_RETRY).await,
                None => return,
            }
        }
        tracing::debug!("no checkpoint between two batches caught up with the WAL; the next one tries again");
    }

    async fn run(&mut self, mode: Mode) -> Option<Checkpointed> {
        let connection = self.connection.take()?;
        let (connection, checkpointed) = on_blocking_thread(connection, mode).await?;
        self.connection = Some(connection);
        match checkpointed {
            Ok(checkpointed) => Some(checkpointed),
            Err(e) => {
                tracing::warn!(error = %e, ?mode, "could not checkpoint the ledger's WAL between two batches");
                None
            }
        }
    }
}

/// How many PASSIVE checkpoints a pause between two batches tries for one that catches up,
/// and how long it waits between two.
const PASSIVE_TRIES: usize = 3;
const PASSIVE_RETRY: Duration = Duration::from_millis(10);

/// Whether this PASSIVE copied every frame, so that a RESTART right after it copies little
/// while it holds the writers off. After one that another connection's checkpoint kept
/// from running, or a reader kept from finishing, a RESTART would copy back (and sync) a
/// whole batch with every writer waiting.
fn caught_up(passive: Checkpointed) -> bool {
    !passive.busy && passive.wal_frames >= 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::SqliteLedger;
    use crate::ledger::prelude::*;

    /// A new ledger in `dir` with a `load` table to fill, and its file's path.
    async fn ledger_with_a_load_table(dir: &Path) -> (SqliteLedger, std::path::PathBuf) {
        let path = dir.join("ledger.db");
        let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
        ledger.execute_in_place("CREATE TABLE load (bytes BLOB)", []).await.unwrap();
        (ledger, path)
    }

    /// A steady load of commits with no pause long enough for SQLite to rewind the WAL by
    /// itself: without the bound, the file grows by every byte written (six times the
    /// bound here).
    #[tokio::test]
    async fn under_a_steady_load_of_commits_the_wal_stays_near_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, path) = ledger_with_a_load_table(dir.path()).await;
        let wal = wal_path(&path);
        let mut largest = 0;
        for _ in 0..(6 * WAL_LIMIT_BYTES / 40_000) {
            ledger.execute_in_place("INSERT INTO load VALUES (randomblob(40000))", []).await.unwrap();
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            // A commit every millisecond or so, as a busy daemon's: the checkpointer runs
            // between them.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        ledger.close().await;
        let bound = WAL_LIMIT_BYTES as u64;
        assert!(largest <= 3 * bound, "the WAL grew to {largest} bytes, its bound is {bound}");
    }

    /// A reader holding its snapshot while the WAL passes its bound keeps every RESTART
    /// from being had. Once it lets go, the WAL is rewound with no commit to ask for it:
    /// before, the next RESTART came only after the next commits, and an idle ledger's WAL
    /// stayed past its bound.
    #[tokio::test]
    async fn a_wal_a_reader_held_past_its_bound_is_rewound_once_it_lets_go_with_no_commit_since() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, path) = ledger_with_a_load_table(dir.path()).await;
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader.query_row("SELECT COUNT(*) FROM load", [], |row| row.get(0)).unwrap();
        // Twice the bound, slowly enough that the checkpointer tries (and fails) a few times.
        for _ in 0..(2 * WAL_LIMIT_BYTES / 10_000) {
            ledger.execute_in_place("INSERT INTO load VALUES (randomblob(10000))", []).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Long enough for the checkpointer to be done with every commit's ring, having failed.
        tokio::time::sleep(15 * FORCED_CHECKPOINT_RETRY).await;
        reader.execute_batch("COMMIT").unwrap();
        // The retries run on a clock, with no commit to ring them: this waits out a few.
        tokio::time::sleep(10 * FORCED_CHECKPOINT_RETRY).await;
        // One commit now starts the WAL over, if a RESTART was had since the reader let go,
        // and cuts the file back to the bound; else it appends to the long WAL.
        ledger.execute_in_place("INSERT INTO load VALUES (randomblob(10))", []).await.unwrap();
        let wal = std::fs::metadata(wal_path(&path)).unwrap().len();
        ledger.close().await;
        assert!(wal <= WAL_LIMIT_BYTES as u64, "the WAL holds {wal} bytes, its bound is {WAL_LIMIT_BYTES}");
    }

    #[test]
    fn a_burst_of_commits_is_synced_and_copied_back_once_enough_wait_or_the_interval_is_up() {
        let start = Instant::now();
        let soon = start + CHECKPOINT_DELAY;
        let within = WAL_LIMIT_BYTES.unsigned_abs();
        let mut copy_back = CopyBack::new(start);
        assert_eq!(copy_back.after_commits(3, soon, within), AfterCommits::SyncWal);
        assert_eq!(copy_back.after_commits(1, soon, 0), AfterCommits::SyncWal, "no WAL file yet");
        assert_eq!(copy_back.after_commits(1, soon, within + 1), AfterCommits::Checkpoint, "past the bound");

        // Commits add up across syncs, and a checkpoint starts the count again.
        let mut copy_back = CopyBack::new(start);
        assert_eq!(copy_back.after_commits(COMMITS_PER_COPY_BACK - 1, soon, within), AfterCommits::SyncWal);
        assert_eq!(copy_back.after_commits(1, soon, within), AfterCommits::Checkpoint);
        copy_back.checkpointed(soon);
        assert_eq!(copy_back.after_commits(1, soon + CHECKPOINT_DELAY, within), AfterCommits::SyncWal);

        // Time alone: synced commits are copied back at the interval, with or without commits
        // since.
        let mut copy_back = CopyBack::new(start);
        let just_before = start + COPY_BACK_INTERVAL - Duration::from_millis(1);
        assert_eq!(copy_back.after_commits(1, just_before, within), AfterCommits::SyncWal);
        assert_eq!(copy_back.due(), start + COPY_BACK_INTERVAL);
        assert_eq!(copy_back.after_commits(1, start + COPY_BACK_INTERVAL, 0), AfterCommits::Checkpoint);
        let later = start + 3 * COPY_BACK_INTERVAL;
        copy_back.checkpointed(later);
        assert_eq!(copy_back.due(), later + COPY_BACK_INTERVAL);
        assert_eq!(copy_back.after_commits(1, later + CHECKPOINT_DELAY, within), AfterCommits::SyncWal);
    }

    #[tokio::test]
    async fn the_wal_synced_between_checkpoints_is_the_file_sqlite_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, path) = ledger_with_a_load_table(dir.path()).await;
        ledger.execute_in_place("INSERT INTO load VALUES (randomblob(10))", []).await.unwrap();
        let wal = WalFile { path: wal_path(&path), synced_by_commits: false };
        assert_eq!(wal.path, dir.path().join("ledger.db-wal"));
        assert!(wal.bytes() > 0, "SQLite's WAL is where the checkpointer looks for it");
        wal.sync_off_runtime().await.unwrap();
        ledger.close().await;
        // A WAL that is not there is not synced silently.
        let gone = WalFile { path: dir.path().join("nothing-wal"), synced_by_commits: false };
        assert!(gone.sync_off_runtime().await.is_err());
    }

    #[test]
    fn a_passive_caught_up_only_when_it_copied_every_frame() {
        assert!(caught_up(Checkpointed { busy: false, wal_frames: 600 }));
        assert!(caught_up(Checkpointed { busy: false, wal_frames: 0 }));
        assert!(!caught_up(Checkpointed { busy: true, wal_frames: 600 }), "a reader in the way");
        assert!(!caught_up(Checkpointed { busy: true, wal_frames: -1 }), "another checkpoint ran");
    }

    fn passive(wal_frames: i64) -> Checkpointed {
        Checkpointed { busy: false, wal_frames }
    }

    const BUSY: Checkpointed = Checkpointed { busy: true, wal_frames: 2000 };
    const DONE: Checkpointed = Checkpointed { busy: false, wal_frames: 2000 };

    #[test]
    fn a_wal_past_its_bound_is_rewound_and_one_within_it_is_left_to_passive_checkpoints() {
        let page = 4096;
        let frames_at_bound = WAL_LIMIT_BYTES / page;
        let mut bound = WalBound::default();
        assert_eq!(bound.after_passive(passive(0), page), BoundStep::Within);
        assert_eq!(bound.after_passive(passive(frames_at_bound), page), BoundStep::Within);
        assert_eq!(
            bound.after_passive(passive(frames_at_bound + 1), page),
            BoundStep::Restart(FORCED_CHECKPOINT_WAIT)
        );
        // A WAL SQLite reports as not in WAL mode, or a checkpoint another connection was
        // running (-1), is no reason to force anything.
        assert_eq!(WalBound::default().after_passive(passive(-1), page), BoundStep::Within);
    }

    #[test]
    fn a_restart_follows_only_a_passive_that_copied_every_frame() {
        let page = 4096;
        let past_bound = WAL_LIMIT_BYTES / page + 1;
        let mut bound = WalBound::default();
        // A reader kept the PASSIVE from copying everything: a RESTART would copy the rest
        // with every writer held off. Another PASSIVE soon instead.
        let held = Checkpointed { busy: true, wal_frames: past_bound };
        assert_eq!(bound.after_passive(held, page), BoundStep::PassiveAgain);
        // Another connection's checkpoint ran instead (a prune's, between its batches): the
        // bound stands, and the next PASSIVE comes soon.
        let other_checkpoint = Checkpointed { busy: true, wal_frames: -1 };
        assert_eq!(bound.after_passive(other_checkpoint, page), BoundStep::PassiveAgain);
        // Once one catches up, the RESTART only waits.
        assert_eq!(
            bound.after_passive(passive(past_bound), page),
            BoundStep::Restart(FORCED_CHECKPOINT_WAIT)
        );
    }

    #[test]
    fn a_restart_that_could_not_be_had_is_tried_again_soon_waiting_longer_each_time_up_to_a_cap() {
        let page = 4096;
        let past_bound = passive(WAL_LIMIT_BYTES / page + 1);
        let mut bound = WalBound::default();
        let mut waits = Vec::new();
        for _ in 0..6 {
            let BoundStep::Restart(wait) = bound.after_passive(past_bound, page) else {
                panic!("a WAL past its bound is rewound")
            };
            waits.push(wait.as_millis());
            assert_eq!(
                bound.after_restart(BUSY),
                Some(FORCED_CHECKPOINT_RETRY),
                "tried again, commits or not"
            );
        }
        assert_eq!(waits, [50, 100, 200, 200, 200, 200]);

        // One that another connection's checkpoint kept from running waited for no one: tried
        // again, no longer.
        let other_checkpoint = Checkpointed { busy: true, wal_frames: -1 };
        assert_eq!(bound.after_restart(other_checkpoint), Some(FORCED_CHECKPOINT_RETRY));
        assert_eq!(bound.after_passive(past_bound, page), BoundStep::Restart(LONGEST_FORCED_CHECKPOINT_WAIT));
        // Nor does another connection's PASSIVE in the way of this one put the bound aside.
        bound.after_restart(BUSY);
        assert_eq!(bound.after_passive(other_checkpoint, page), BoundStep::PassiveAgain);
        assert_eq!(bound.after_passive(past_bound, page), BoundStep::Restart(LONGEST_FORCED_CHECKPOINT_WAIT));

        // One that was had waits for commits again, and the next starts from the shortest wait.
        assert_eq!(bound.after_restart(DONE), None);
        assert_eq!(bound.after_passive(past_bound, page), BoundStep::Restart(FORCED_CHECKPOINT_WAIT));
        // So does the next one after the WAL came back within its bound by itself.
        bound.after_restart(BUSY);
        bound.after_restart(BUSY);
        assert_eq!(bound.after_passive(passive(10), page), BoundStep::Within);
        assert_eq!(bound.after_passive(past_bound, page), BoundStep::Restart(FORCED_CHECKPOINT_WAIT));
    }
}
