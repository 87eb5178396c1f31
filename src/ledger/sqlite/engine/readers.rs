//! The ledger's readers: connections that only read, opened and owned here, so a read runs
//! on the calling thread with no hand-over to another thread at all. In WAL mode a reader
//! never waits for the writer, and the lookups it serves are indexed: each takes
//! microseconds. Their statements stay prepared between reads.
//!
//! The reads that may scan much of the ledger (the operator's listings, the gauges
//! `/metrics` reads, start-up recovery's search) run on a reader too, but on a blocking
//! thread ([`SqliteLedger::read_off_thread`]): they are off the path of a message, and on a large
//! ledger they take long enough to hold up the runtime.
//!
//! Only reads run here; the connections are `query_only`, so a statement that would write
//! fails instead.
//!
//! A read runs on the writer itself when no write holds it or waits for it, which on the
//! daemon's one runtime thread is nearly always
//! ([`super::in_place::Writer::read_if_idle`]): every commit of another connection empties
//! a reader's page cache, and it reads back each page it needs, while the writer's cache
//! already holds what its own commits wrote. The readers serve the reads made while a
//! write waits for another process's lock.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::in_place::{BusyWait, open_own_connection};
use crate::ledger::sqlite::{LedgerError, LedgerResult, SqliteLedger};

/// Readers kept open between reads: a reply's and a handoff's lookups come one after
/// another, so one is nearly always enough.
const MAX_IDLE: usize = 2;

pub(crate) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<rusqlite::Connection>>,
}

impl fmt::Debug for Readers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readers").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Readers {
    /// Readers of the (existing, migrated) database at `path`, opened when first needed.
    pub(crate) fn new(path: &Path) -> Self {
        Self { path: path.to_owned(), idle: Mutex::new(Vec::new()) }
    }

    fn take(&self) -> rusqlite::Result<rusqlite::Connection> {
        if let Some(db) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(db);
        }
        let db = open_own_connection(&self.path)?;
        db.pragma_update(None, "query_only", true)?;
        Ok(db)
    }

    fn give_back(&self, db: rusqlite::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(db);
        }
    }

    /// Runs `work` on a reader, taken from the idle ones or opened.
    fn read<T>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let db = self.take()?;
        let result = work(&db);
        self.give_back(db);
        result
    }

    pub(crate) fn close(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl SqliteLedger {
    /// Runs the read `work` on this thread: on the writer if it is idle, on a reader
    /// otherwise. On the rare `SQLITE_BUSY` a WAL reader can meet (another connection
    /// recovering the WAL index, say), `work` runs again after an asynchronous pause, for
    /// as long as the busy timeout.
    pub(crate) async fn read_in_place<T>(
        &self,
        mut work: impl FnMut(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> LedgerResult<T> {
        let mut wait = BusyWait::new();
        loop {
            let result = match self.writer.read_if_idle(&mut work) {
                Some(result) => result,
                None => self.readers.read(&mut work),
            };
            match result {
                Err(e) if wait.retry_after(&e).await => continue,
                result => return result.map_err(LedgerError::from),
            }
        }
    }

    /// Runs the read `work` on a reader, on a blocking thread, for a read that may scan
    /// much of the ledger; busy as [`Self::read_in_place`]. A panic in `work` is the
    /// caller's, as it would be on this thread.
    pub(crate) async fn read_off_thread<T: Send + 'static>(
        &self,
        work: impl Fn(&rusqlite::Connection) -> rusqlite::Result<T> + Send + Sync + 'static,
    ) -> LedgerResult<T> {
        let work = Arc::new(work);
        let mut wait = BusyWait::new();
        loop {
            let readers = Arc::clone(&self.readers);
            let this_try = Arc::clone(&work);
            let result = match tokio::task::spawn_blocking(move || readers.read(&*this_try)).await {
                Ok(result) => result,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => return Err(LedgerError::other(format!("a read of the ledger was cut short: {e}"))),
            };
            match result {
                Err(e) if wait.retry_after(&e).await => continue,
                result => return result.map_err(LedgerError::from),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Synchronous;
    use crate::ledger::SqliteLedger;
    use crate::ledger::prelude::*;

    /// On the writer while it is idle, as here.
    #[tokio::test]
    async fn reads_see_every_commit_and_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
        let count = |ledger: &SqliteLedger| {
            let ledger = ledger.clone();
            async move {
                ledger
                    .read_in_place(|db| {
                        db.query_row("SELECT COUNT(*) FROM poller_offsets", [], |row| row.get::<_, i64>(0))
                    })
                    .await
                    .unwrap()
            }
        };
        assert_eq!(count(&ledger).await, 0);
        ledger.record_batch(7, 8, &[]).await.unwrap();
        // A read sees the commit made meanwhile (the idle writer serves it).
        assert_eq!(count(&ledger).await, 1);
        let write = ledger.read_in_place(|db| db.execute("DELETE FROM poller_offsets", [])).await;
        assert!(write.is_err(), "a read must not write: {write:?}");
        assert_eq!(count(&ledger).await, 1);
        // The writer lent to those reads still writes.
        ledger.record_batch(7, 9, &[]).await.unwrap();
        assert_eq!(ledger.next_offset(7).await.unwrap(), Some(9));
    }

    /// A write waiting for a lock another process holds keeps the writer: reads meanwhile
    /// run on a reader, and do not wait for the write.
    #[tokio::test]
    async fn reads_while_a_write_waits_run_on_a_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let ledger = SqliteLedger::open(&path, Synchronous::Normal).await.unwrap();
        ledger.record_batch(7, 8, &[]).await.unwrap();

        let other_process = rusqlite::Connection::open(&path).unwrap();
        other_process.execute_batch("BEGIN IMMEDIATE").unwrap();
        let waiting_write = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.record_batch(7, 9, &[]).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!waiting_write.is_finished(), "the write waits for the other process's lock");

        let read = ledger.read_in_place(|db| {
            db.query_row("SELECT next_offset FROM poller_offsets WHERE bot_id = 7", [], |row| {
                row.get::<_, i64>(0)
            })
        });
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), read).await;
        assert_eq!(read.expect("the read does not wait for the write").unwrap(), 8);
        let write = ledger.read_in_place(|db| db.execute("DELETE FROM poller_offsets", [])).await;
        assert!(write.is_err(), "a reader must not write: {write:?}");
        assert!(!waiting_write.is_finished());

        other_process.execute_batch("ROLLBACK").unwrap();
        waiting_write.await.unwrap().unwrap();
        assert_eq!(ledger.next_offset(7).await.unwrap(), Some(9));
    }
}
