//! What `/readyz` and `/metrics` read from the ledger: whether it takes a write right now,
//! and the counts of handoffs by state.
//!
//! The write probe commits a real write: it sets the database header's application id (a
//! field that marks the file as a switchboard ledger) to its constant. That is one page
//! through the write-ahead log and a commit, so a read-only or immutable file, a full disk
//! or a lock held by another writer all fail it, and it needs no table of its own. It runs
//! on a connection of its own with a short busy timeout, so a probe never waits ten
//! seconds and never takes a connection from the daemon's pool.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::Mutex;

use super::Ledger;

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
    connection: Mutex<Option<SqliteConnection>>,
}

impl LedgerProbe {
    pub fn new(database: PathBuf) -> Self {
        Self { database, connection: Mutex::new(None) }
    }

    /// Commits one small write, or says why it could not.
    pub async fn check(&self) -> Result<(), String> {
        let mut connection = self.connection.lock().await;
        let outcome = tokio::time::timeout(PROBE_TIMEOUT, self.write(&mut connection)).await;
        let result = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => Err(format!("the ledger refused a write: {e}")),
            Err(_) => Err(format!("the ledger did not take a write within {}s", PROBE_TIMEOUT.as_secs())),
        };
        *connection = None;
        result
    }

    async fn write(&self, connection: &mut Option<SqliteConnection>) -> sqlx::Result<()> {
        if connection.is_none() {
            let options = SqliteConnectOptions::new()
                .filename(&self.database)
                .create_if_missing(false)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(PROBE_BUSY_TIMEOUT)
                .disable_statement_logging();
            *connection = Some(SqliteConnection::connect_with(&options).await?);
        }
        let connection = connection.as_mut().expect("connected above");
        sqlx::query(PROBE_WRITE).execute(&mut *connection).await?;
        connection.ping().await
    }
}

impl Ledger {
    /// Handoffs by state, for `/metrics`.
    pub async fn count_handoffs_by_state(&self) -> sqlx::Result<Vec<(String, i64)>> {
        sqlx::query_as("SELECT state, COUNT(*) FROM handoffs GROUP BY state ORDER BY state")
            .fetch_all(&self.pool)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;

    #[test]
    fn the_probe_writes_the_application_id() {
        assert_eq!(PROBE_WRITE, format!("PRAGMA application_id = {LEDGER_APPLICATION_ID}"));
    }

    #[tokio::test]
    async fn the_probe_commits_a_write_and_fails_while_another_writer_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        let ledger = Ledger::open(&database, Synchronous::Normal).await.unwrap();
        let probe = LedgerProbe::new(database.clone());
        probe.check().await.unwrap();
        let id: i32 = sqlx::query_scalar("PRAGMA application_id").fetch_one(ledger.pool()).await.unwrap();
        assert_eq!(id, LEDGER_APPLICATION_ID);

        let mut holder = ledger.pool().acquire().await.unwrap();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *holder).await.unwrap();
        let refused = probe.check().await.unwrap_err();
        assert!(refused.contains("locked") || refused.contains("busy"), "{refused}");
        sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
        drop(holder);
        probe.check().await.unwrap();
        assert!(ledger.count_handoffs_by_state().await.unwrap().is_empty());
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
