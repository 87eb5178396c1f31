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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection as _, SqliteConnection};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::write_watch::{LedgerWrite, WriteWatch};

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
    pub(super) fn on_commit(&self) -> impl FnMut() -> bool + Send + 'static {
        let commits = Arc::clone(&self.commits);
        move || {
            commits.notify_one();
            // `true` lets the commit go ahead (`false` would turn it into a rollback).
            true
        }
    }

    /// Opens the checkpointer's own connection and starts it.
    pub(super) async fn start(
        &self,
        options: &SqliteConnectOptions,
        writes: Arc<WriteWatch>,
    ) -> sqlx::Result<()> {
        let connection = SqliteConnection::connect_with(options).await?;
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

async fn run(
    mut connection: SqliteConnection,
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
        // PASSIVE reports a checkpoint it could not write as an error, or in its first
        // column (`busy`) when a reader or writer was in the way, which is no failure.
        let checkpointed = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut connection).await;
        writes.observe(LedgerWrite::Checkpoint, &checkpointed);
        if let Err(e) = checkpointed {
            tracing::warn!(
                error = %e,
                "could not checkpoint the ledger's WAL; SQLite checkpoints by itself once it holds {BACKSTOP_PAGES} pages"
            );
        }
    }
    let _ = connection.close().await;
}
