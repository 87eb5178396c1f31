//! The ledger's transactions on PostgreSQL, which learn their outcome when the answer to
//! their COMMIT is lost.
//!
//! A COMMIT sent down a connection that then breaks (a network path cut, a pooler
//! restarted, the server's answer lost on its way) may have been carried out or not, and
//! the client cannot tell from its side. Taking it for "nothing written" and retrying is
//! wrong when it was written: intake's claim of envelopes for a live session would stand
//! with nothing handed over, and a send attempt recorded as begun would never be made. So
//! each transaction notes, as it begins, its transaction id and the server process running
//! it; a COMMIT that fails without an answer from the server is followed by the question,
//! on another connection, of what became of that transaction (`pg_xact_status`):
//! committed, aborted, or still in progress. One still in progress (the COMMIT not arrived,
//! its process waiting for it) is ended with `pg_terminate_backend`, which aborts it, and
//! the question is asked again. Only a server that cannot be asked for
//! [`LEARN_OUTCOME_WITHIN`] leaves the outcome unknown: an error that is not congestion,
//! which stops intake (the daemon restarts from what the ledger holds) and fails the call
//! at hand.
//!
//! Learning the id and the process costs a round trip of its own before the COMMIT, unless a
//! statement of the transaction selected them already ([`transaction_columns!`], read by
//! [`LedgerTransaction::note`]): the statements on a message's path do.
//!
//! SQLite has no such case: its COMMIT is a call in this process, which returns.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use sqlx::postgres::{PgPool, PgRow, Postgres};
use sqlx::{PgConnection, Row, Transaction};

use super::PgLedger;
use crate::ledger::{LedgerError, LedgerResult};

/// How long a transaction whose COMMIT lost its answer keeps asking the server what became
/// of it: about as long as a statement waits for a connection or a lock.
const LEARN_OUTCOME_WITHIN: Duration = Duration::from_secs(30);

/// How long between two questions about the same transaction.
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// The columns a statement of a transaction selects so that its COMMIT need not ask for
/// them ([`LedgerTransaction::note`]).
macro_rules! transaction_columns {
    () => {
        "pg_current_xact_id()::text::bigint AS xact_id, pg_backend_pid() AS xact_backend"
    };
}
pub(super) use transaction_columns;

/// A transaction of the ledger's: the connection's statements run through it (it derefs to
/// the connection), and [`LedgerTransaction::commit`] reports what the server did.
pub(super) struct LedgerTransaction {
    tx: Transaction<'static, Postgres>,
    /// Which transaction it is on the server, once a statement said so.
    noted: Option<ServerTransaction>,
    /// Where to ask about it should its COMMIT lose its answer.
    pool: PgPool,
}

/// A transaction as the server knows it.
#[derive(Debug, Clone, Copy)]
struct ServerTransaction {
    /// Its id (`pg_current_xact_id`), as a number.
    xid: i64,
    /// The server process running it (`pg_backend_pid`).
    backend: i32,
}

impl PgLedger {
    /// Begins a transaction on a pooled connection.
    pub(super) async fn begin(&self) -> LedgerResult<LedgerTransaction> {
        Ok(LedgerTransaction { tx: self.pool.begin().await?, noted: None, pool: self.pool.clone() })
    }
}

/// What the server says became of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Committed,
    Aborted,
    InProgress,
}

impl LedgerTransaction {
    /// Notes which transaction this is from a row of a statement that selected
    /// [`transaction_columns!`].
    pub(super) fn note(&mut self, row: &PgRow) -> LedgerResult<()> {
        self.noted =
            Some(ServerTransaction { xid: row.try_get("xact_id")?, backend: row.try_get("xact_backend")? });
        Ok(())
    }

    /// Commits. When the answer to the COMMIT is lost, what the server did decides: `Ok`
    /// if it committed, the connection's error if it did not.
    pub(super) async fn commit(self) -> LedgerResult<()> {
        let Self { mut tx, noted, pool } = self;
        let ServerTransaction { xid, backend } = match noted {
            Some(noted) => noted,
            None => {
                let (xid, backend) =
                    sqlx::query_as(concat!("SELECT ", transaction_columns!())).fetch_one(&mut *tx).await?;
                ServerTransaction { xid, backend }
            }
        };
        match tx.commit().await {
            Ok(()) => Ok(()),
            // The server answered: it did not commit.
            Err(error @ sqlx::Error::Database(_)) => Err(error.into()),
            Err(lost) => learn_outcome(&pool, xid, backend, lost).await,
        }
    }

    pub(super) async fn rollback(self) -> LedgerResult<()> {
        Ok(self.tx.rollback().await?)
    }
}

impl Deref for LedgerTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for LedgerTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

/// Asks the server what became of transaction `xid`, whose COMMIT failed with `lost` before
/// the server answered, until it says committed or aborted.
async fn learn_outcome(pool: &PgPool, xid: i64, backend: i32, lost: sqlx::Error) -> LedgerResult<()> {
    let deadline = tokio::time::Instant::now() + LEARN_OUTCOME_WITHIN;
    let mut asked_error = None;
    loop {
        match status(pool, xid).await {
            Ok(Some(Status::Committed)) => {
                tracing::warn!(xid, error = %lost, "the answer to a COMMIT was lost; the server says the transaction committed");
                return Ok(());
            }
            Ok(Some(Status::Aborted)) => {
                tracing::warn!(xid, error = %lost, "the answer to a COMMIT was lost; the server says the transaction did not commit");
                return Err(lost.into());
            }
            Ok(Some(Status::InProgress)) => {
                // Its process still waits for the COMMIT: ended, it aborts the transaction
                // (only while it still runs that transaction, so never another's work).
                if let Err(error) = end_transaction(pool, xid, backend).await {
                    asked_error = Some(error);
                }
            }
            Ok(None) => {
                return Err(LedgerError::other(format!(
                    "the answer to a COMMIT was lost and the server no longer knows transaction {xid}: \
                     whether it committed is unknown ({lost})"
                )));
            }
            Err(error) => asked_error = Some(error),
        }
        if tokio::time::Instant::now() >= deadline {
            let asked =
                asked_error.map(|error| format!("; asking the server failed: {error}")).unwrap_or_default();
            return Err(LedgerError::other(format!(
                "the answer to a COMMIT was lost and whether transaction {xid} committed could not be learnt \
                 within {}s ({lost}){asked}",
                LEARN_OUTCOME_WITHIN.as_secs()
            )));
        }
        tokio::time::sleep(ASK_AGAIN_AFTER).await;
    }
}

async fn status(pool: &PgPool, xid: i64) -> Result<Option<Status>, sqlx::Error> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT pg_xact_status($1::bigint::text::xid8)").bind(xid).fetch_one(pool).await?;
    Ok(status.and_then(|status| match status.as_str() {
        "committed" => Some(Status::Committed),
        "aborted" => Some(Status::Aborted),
        "in progress" => Some(Status::InProgress),
        _ => None,
    }))
}

async fn end_transaction(pool: &PgPool, xid: i64, backend: i32) -> Result<(), sqlx::Error> {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE pid = $1 AND backend_xid = xid($2::bigint::text::xid8)",
    )
    .bind(backend)
    .bind(xid)
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::test_support::TestSchema;
    use super::*;

    /// The error a COMMIT whose answer was lost fails with.
    fn lost() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the answer to COMMIT was lost",
        ))
    }

    async fn ledger() -> (TestSchema, PgLedger) {
        let schema = TestSchema::create().await;
        let ledger = PgLedger::connect(&schema.url).await.unwrap();
        (schema, ledger)
    }

    /// A transaction that wrote a row of `poller_offsets`, and its id and process.
    async fn wrote(ledger: &PgLedger, bot_id: i64) -> (Transaction<'static, Postgres>, i64, i32) {
        let LedgerTransaction { mut tx, .. } = ledger.begin().await.unwrap();
        let (xid, backend) = sqlx::query_as(concat!(
            "INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES ($1, 1, now()) RETURNING ",
            transaction_columns!()
        ))
        .bind(bot_id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        (tx, xid, backend)
    }

    async fn offsets(ledger: &PgLedger) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM poller_offsets").fetch_one(&ledger.pool).await.unwrap()
    }

    #[tokio::test]
    async fn a_transaction_the_server_committed_counts_as_committed() {
        let (schema, ledger) = ledger().await;
        let (tx, xid, backend) = wrote(&ledger, 1).await;
        tx.commit().await.unwrap();
        learn_outcome(&ledger.pool, xid, backend, lost()).await.unwrap();
        assert_eq!(offsets(&ledger).await, 1);
        ledger.close().await;
        schema.drop().await;
    }

    #[tokio::test]
    async fn a_transaction_the_server_rolled_back_fails_with_the_lost_connection() {
        let (schema, ledger) = ledger().await;
        let (tx, xid, backend) = wrote(&ledger, 1).await;
        tx.rollback().await.unwrap();
        let error = learn_outcome(&ledger.pool, xid, backend, lost()).await.unwrap_err();
        assert!(matches!(error, LedgerError::Busy { .. }), "retried as the lost connection it is: {error:?}");
        assert_eq!(offsets(&ledger).await, 0);
        ledger.close().await;
        schema.drop().await;
    }

    /// A COMMIT that never reached the server: its process waits in the transaction. It is
    /// ended at once (not after the server's idle timeout), and nothing of it stays.
    #[tokio::test]
    async fn a_transaction_still_waiting_for_its_commit_is_ended_and_fails() {
        let (schema, ledger) = ledger().await;
        let (tx, xid, backend) = wrote(&ledger, 1).await;
        let asked = Instant::now();
        let error = learn_outcome(&ledger.pool, xid, backend, lost()).await.unwrap_err();
        assert!(matches!(error, LedgerError::Busy { .. }), "{error:?}");
        assert!(
            asked.elapsed() < super::super::IDLE_IN_TRANSACTION_TIMEOUT,
            "ended by the question, not by the server's timeout: {:?}",
            asked.elapsed()
        );
        assert!(tx.commit().await.is_err(), "its process was ended");
        assert_eq!(offsets(&ledger).await, 0);
        ledger.close().await;
        schema.drop().await;
    }
}
