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
//! reuse, which a nearly full disk still has. A RESTART waits for other connections at
//! most [`FORCED_CHECKPOINT_WAIT`] (new writers are held off while it is pending, and wait
//! asynchronously); one that could not be had is asked for again after the next commits.
//!
//! What a commit guarantees does not change: it is in the WAL when it returns, as before
//! (and `synchronous = full` still syncs the WAL at every commit). Under `normal`, a power
//! loss may take what was committed since the last checkpoint synced the WAL: now at most
//! about [`CHECKPOINT_DELAY`] of commits; before, up to 1000 pages (a hundred messages or
//! so), and at a quiet time every commit since the last busy one.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::in_place::{PAGE_CACHE_KIB, synchronous_pragma};
use crate::config::Synchronous;
use crate::ledger::sqlite::{BUSY_TIMEOUT, LedgerError, LedgerResult};
use crate::ledger::{LedgerWrite, WriteWatch};

/// How long commits may gather before they are checkpointed: a burst of them is copied at
/// once, and a power loss under `synchronous = normal` can take no more than about this
/// much (see the module documentation).
pub(crate) const CHECKPOINT_DELAY: Duration = Duration::from_millis(100);

/// `wal_autocheckpoint` while the checkpointer runs: SQLite checkpoints inside a commit
/// only if the checkpointer has fallen this far behind (40 MB of WAL with 4 KiB pages).
pub(crate) const BACKSTOP_PAGES: u32 = 10_000;

/// The WAL's bound: past it, the next checkpoint rewinds the WAL (RESTART), and the file
/// is cut back to this size when it does (`journal_size_limit` of the writer).
pub const WAL_LIMIT_BYTES: i64 = 4 * 1024 * 1024;

/// How long a RESTART checkpoint may wait for a reader or writer (and holds
/// new writers off meanwhile) before it gives up until the next time.
const FORCED_CHECKPOINT_WAIT: Duration = Duration::from_millis(50);

/// The checkpointing task of one ledger.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    /// Rung by every commit of the ledger's connections (their commit hook).
    commits: Arc<Notify>,
    /// Stops the task when the ledger closes.
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    pub(crate) fn new() -> Self {
        Self { commits: Arc::new(Notify::new()), stop: CancellationToken::new(), task: Mutex::new(None) }
    }

    /// What a connection's commit hook calls. It runs inside SQLite's commit, on the
    /// connection's thread, and only rings a bell.
    pub(crate) fn on_commit(&self) -> impl Fn() + Send + 'static {
        let commits = Arc::clone(&self.commits);
        move || commits.notify_one()
    }

    /// Opens the checkpointer's own connection to the (existing, migrated) database at
    /// `path` and starts it.
    pub(crate) async fn start(
        &self,
        path: &Path,
        synchronous: Synchronous,
        writes: Arc<WriteWatch>,
    ) -> LedgerResult<()> {
        let path = path.to_owned();
        let connection =
            tokio::task::spawn_blocking(move || open(&path, synchronous)).await.map_err(|e| {
                LedgerError::other(format!("opening the checkpointer's connection was cut short: {e}"))
            })??;
        let task = tokio::spawn(run(connection, Arc::clone(&self.commits), self.stop.clone(), writes));
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

/// What a checkpoint is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Copy what it can without waiting for anyone: after commits.
    Passive,
    /// Copy everything and have the next commit start the WAL over: when it is too long.
    Restart,
}

impl Mode {
    fn pragma(self) -> &'static str {
        match self {
            Self::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
            Self::Restart => "PRAGMA wal_checkpoint(RESTART)",
        }
    }
}

/// What the next checkpoint should be, given how long the WAL was at the last one: a
/// pure decision, so the bound is a unit test away.
fn after_passive(wal_frames: i64, page_size: i64) -> Option<Mode> {
    (wal_frames.saturating_mul(page_size) > WAL_LIMIT_BYTES).then_some(Mode::Restart)
}

/// One checkpoint; answers how many frames the WAL held. It reports a checkpoint it could
/// not write as an error, or in its first column (`busy`) when a reader or writer was in
/// the way, which is no failure: what was not copied is copied next time. A RESTART waits
/// for others only [`FORCED_CHECKPOINT_WAIT`].
fn checkpoint(db: &Connection, mode: Mode) -> LedgerResult<i64> {
    if mode != Mode::Passive {
        db.busy_timeout(FORCED_CHECKPOINT_WAIT)?;
    }
    let frames = db.query_row(mode.pragma(), [], |row| row.get::<_, i64>(1));
    if mode != Mode::Passive {
        db.busy_timeout(BUSY_TIMEOUT)?;
    }
    Ok(frames?)
}

/// Runs one checkpoint on a blocking thread; the connection goes there and comes back.
async fn on_blocking_thread(connection: Connection, mode: Mode) -> Option<(Connection, LedgerResult<i64>)> {
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
    commits: Arc<Notify>,
    stop: CancellationToken,
    writes: Arc<WriteWatch>,
) {
    let page_size: i64 = connection.query_row("PRAGMA page_size", [], |row| row.get(0)).unwrap_or(4096);
    loop {
        tokio::select! {
            () = commits.notified() => {}
            () = stop.cancelled() => break,
        }
        // Let the burst this commit began go by; the commits meanwhile ring again, and
        // get the next checkpoint.
        tokio::select! {
            () = tokio::time::sleep(CHECKPOINT_DELAY) => {}
            () = stop.cancelled() => break,
        }
        // Copying the WAL back and syncing both files takes milliseconds: off the runtime.
        let Some((db, checkpointed)) = on_blocking_thread(connection, Mode::Passive).await else { break };
        connection = db;
        let forced = match &checkpointed {
            Ok(frames) => after_passive(*frames, page_size),
            Err(_) => None,
        };
        writes.observe(LedgerWrite::Checkpoint, &checkpointed);
        if let Err(e) = checkpointed {
            tracing::warn!(
                error = %e,
                "could not checkpoint the ledger's WAL; SQLite checkpoints by itself once it holds {BACKSTOP_PAGES} pages"
            );
        }
        if let Some(mode) = forced {
            // Busy (a long read elsewhere) is no failure: the bound is tried for again
            // after the next commits.
            let Some((db, _)) = on_blocking_thread(connection, mode).await else { break };
            connection = db;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::SqliteLedger;
    use crate::ledger::prelude::*;

    /// A steady load of commits with no pause long enough for SQLite to rewind the WAL by
    /// itself: without the bound, the file grows by every byte written (40 MiB here).
    #[tokio::test]
    async fn under_a_steady_load_of_commits_the_wal_stays_near_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
        ledger.execute_in_place("CREATE TABLE load (bytes BLOB)", []).await.unwrap();
        let wal = path.with_extension("db-wal");
        let mut largest = 0;
        for _ in 0..4_000 {
            ledger.execute_in_place("INSERT INTO load VALUES (randomblob(10000))", []).await.unwrap();
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            // A commit every millisecond or so, as a busy daemon's: the checkpointer runs
            // between them.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        ledger.close().await;
        let bound = WAL_LIMIT_BYTES as u64;
        assert!(largest <= 3 * bound, "the WAL grew to {largest} bytes, its bound is {bound}");
    }

    #[test]
    fn a_wal_past_its_bound_is_rewound_and_one_within_it_is_left_to_passive_checkpoints() {
        let page = 4096;
        let frames_at_bound = WAL_LIMIT_BYTES / page;
        assert_eq!(after_passive(0, page), None);
        assert_eq!(after_passive(frames_at_bound, page), None);
        assert_eq!(after_passive(frames_at_bound + 1, page), Some(Mode::Restart));
        // A WAL SQLite reports as not in WAL mode (-1) is no reason to force anything.
        assert_eq!(after_passive(-1, page), None);
    }
}
