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
use super::write_watch::{LedgerWrite, WriteWatch};
use super::{BUSY_TIMEOUT, LedgerError, LedgerResult};
use crate::config::Synchronous;

/// How long commits may gather before they are checkpointed: a burst of them is copied at
/// once, and a power loss under `synchronous = normal` can take no more than about this
/// much (see the module documentation).
pub(super) const CHECKPOINT_DELAY: Duration = Duration::from_millis(100);

/// `wal_autocheckpoint` while the checkpointer runs: SQLite checkpoints inside a commit
/// only if the checkpointer has fallen this far behind (40 MB of WAL with 4 KiB pages).
pub(super) const BACKSTOP_PAGES: u32 = 10_000;

/// The checkpointing task of one ledger.
#[derive(Debug)]
pub(super) struct Checkpointer {
    /// Rung by every commit of the ledger's connections (their commit hook).
    commits: Arc<Notify>,
    /// Stops the task when the ledger closes.
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    pub(super) fn new() -> Self {
        Self { commits: Arc::new(Notify::new()), stop: CancellationToken::new(), task: Mutex::new(None) }
    }

    /// What a connection's commit hook calls. It runs inside SQLite's commit, on the
    /// connection's thread, and only rings a bell.
    pub(super) fn on_commit(&self) -> impl Fn() + Send + 'static {
        let commits = Arc::clone(&self.commits);
        move || commits.notify_one()
    }

    /// Opens the checkpointer's own connection to the (existing, migrated) database at
    /// `path` and starts it.
    pub(super) async fn start(
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
    pub(super) async fn stop(&self) {
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

/// One PASSIVE checkpoint. It reports a checkpoint it could not write as an error, or in
/// its first column (`busy`) when a reader or writer was in the way, which is no failure.
fn checkpoint(db: &Connection) -> LedgerResult<()> {
    db.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
    Ok(())
}

async fn run(
    mut connection: Connection,
    commits: Arc<Notify>,
    stop: CancellationToken,
    writes: Arc<WriteWatch>,
) {
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
        // The connection goes to the blocking thread and comes back with the outcome.
        let (db, checkpointed) = match tokio::task::spawn_blocking(move || {
            let checkpointed = checkpoint(&connection);
            (connection, checkpointed)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the ledger's checkpointer stopped; SQLite checkpoints by itself once the WAL holds {BACKSTOP_PAGES} pages"
                );
                break;
            }
        };
        connection = db;
        writes.observe(LedgerWrite::Checkpoint, &checkpointed);
        if let Err(e) = checkpointed {
            tracing::warn!(
                error = %e,
                "could not checkpoint the ledger's WAL; SQLite checkpoints by itself once it holds {BACKSTOP_PAGES} pages"
            );
        }
    }
}
