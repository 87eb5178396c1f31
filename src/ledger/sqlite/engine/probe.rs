//! What `/readyz` and `/metrics` read from the ledger: whether it takes a write right now,
//! and the counts of handoffs by state.
//!
//! The write probe commits a real write: it sets the database header's application id (a
//! field that marks the file as a switchboard ledger) to its constant. That is one page
//! through the write-ahead log and a commit, so a read-only or immutable file, a full disk
//! or a lock held by another writer all fail it, and it needs no table of its own. It runs
//! on a connection of its own with a short busy timeout, so a probe never waits ten
//! seconds and never takes the writer's turn; on a blocking thread, since SQLite's busy
//! handler sleeps where it runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Mutex;

use crate::ledger::sqlite::{LedgerError, LedgerResult};

/// "SWBD": the header field `PRAGMA application_id` sets, naming the file's application.
pub const LEDGER_APPLICATION_ID: i32 = 0x5357_4244;

/// The probe's write; a literal (a PRAGMA takes no bound parameters), checked against
/// [`LEDGER_APPLICATION_ID`] by a test.
const PROBE_WRITE: &str = "PRAGMA application_id = 1398227524";

/// A writer holding the lock longer than this makes the ledger count as not writable for
/// now: the daemon's own writes are milliseconds long.
const PROBE_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

/// An upper bound on the whole probe (connecting included): a disk that hangs must not
/// hang the readiness check.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Checks that the ledger takes a write. Cheap to share: probes are serialised.
#[derive(Debug)]
pub struct LedgerProbe {
    database: PathBuf,
    /// Kept between probes; dropped after a failure so the next probe starts afresh.
    connection: Mutex<Option<Connection>>,
}

impl LedgerProbe {
    pub fn new(database: PathBuf) -> Self {
        Self { database, connection: Mutex::new(None) }
    }

    /// Commits one small write, or says why it could not.
    pub async fn check(&self) -> Result<(), String> {
        let mut kept = self.connection.lock().await;
        let database = self.database.clone();
        let connection = kept.take();
        let write = tokio::task::spawn_blocking(move || {
            let db = match connection {
                Some(db) => db,
                None => connect(&database)?,
            };
            db.execute_batch(PROBE_WRITE)?;
            Ok::<_, LedgerError>(db)
        });
        // On a timeout the write goes on by itself and its connection is dropped with it:
        // the next probe opens another.
        match tokio::time::timeout(PROBE_TIMEOUT, write).await {
            Ok(Ok(Ok(db))) => {
                *kept = Some(db);
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(format!("the ledger refused a write: {e}")),
            Ok(Err(e)) => Err(format!("the ledger's write probe did not finish: {e}")),
            Err(_) => Err(format!("the ledger did not take a write within {}s", PROBE_TIMEOUT.as_secs())),
        }
    }
}

/// The probe's connection: the database must exist (a probe never creates one), in WAL
/// mode, with [`PROBE_BUSY_TIMEOUT`].
fn connect(database: &Path) -> LedgerResult<Connection> {
    let db = Connection::open_with_flags(
        database,
        OpenFlags::SQLITE_OPEN_READ_WRITE.union(OpenFlags::SQLITE_OPEN_NO_MUTEX),
    )?;
    db.busy_timeout(PROBE_BUSY_TIMEOUT)?;
    db.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::ledger::SqliteLedger;
    use crate::ledger::prelude::*;

    #[test]
    fn the_probe_writes_the_application_id() {
        assert_eq!(PROBE_WRITE, format!("PRAGMA application_id = {LEDGER_APPLICATION_ID}"));
    }

    #[tokio::test]
    async fn the_probe_commits_a_write_and_fails_while_another_writer_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        let ledger = SqliteLedger::open(&database, Synchronous::Normal).await.unwrap();
        let probe = LedgerProbe::new(database.clone());
        probe.check().await.unwrap();
        let holder = Connection::open(&database).unwrap();
        let id: i32 = holder.query_row("PRAGMA application_id", [], |row| row.get(0)).unwrap();
        assert_eq!(id, LEDGER_APPLICATION_ID);

        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let refused = probe.check().await.unwrap_err();
        assert!(refused.contains("locked") || refused.contains("busy"), "{refused}");
        holder.execute_batch("ROLLBACK").unwrap();
        drop(holder);
        probe.check().await.unwrap();
        assert!(ledger.count_by_state_of(crate::ledger::CountedByState::Handoffs).await.unwrap().is_empty());
        ledger.close().await;
    }

    #[tokio::test]
    async fn a_missing_ledger_is_not_writable_and_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("missing.db");
        assert!(LedgerProbe::new(database.clone()).check().await.is_err());
        assert!(!database.exists());
    }
}
