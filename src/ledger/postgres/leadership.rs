//! Polling leadership on PostgreSQL (DESIGN.md §16, issue 24): exactly one replica polls a
//! bot token. The decisions are `rules::leadership`'s; this is their I/O.
//!
//! Each replica's candidate has a **dedicated connection**, outside the pool, because what
//! it holds lives and dies with one database session: a session-level advisory lock whose
//! key is derived from the schema and the bot (advisory locks are database-wide; two
//! ledgers in two schemas of one database must not share one). The leader also holds the
//! bot's row of `poller_leases`: its term, its backend's pid and the lease's end on the
//! server's clock, renewed every lease/3 on the same connection.
//!
//! - A leader whose process or connection dies loses the lock with its session: a standby
//!   waits for the lock ([`PollerCandidate::wait_for_lock`]), so it gets it as soon as the
//!   server has ended that session, and is elected (term + 1) at once.
//! - A leader that is paused or hung keeps its session and its lock, but stops renewing:
//!   once the lease has expired on the server's clock, a candidate terminates the backend
//!   holding the lock (`pg_terminate_backend`, which the same database role may do), then
//!   takes the lock and is elected.
//! - A leader that cannot renew before its lease ends steps down by itself
//!   ([`PollerCandidate::hold`]), and closes its connection, so its lock goes too.
//!
//! Whatever a deposed leader still believes, its writes are fenced by its term (see
//! `postgres::fence`): an election takes the lease row `FOR UPDATE`, which waits for every
//! fenced write holding it `FOR KEY SHARE`, so nothing under an older term passes once it
//! is over. Renewals lock it only `FOR NO KEY UPDATE`, so they never wait for fenced writes.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};
use tokio_util::sync::CancellationToken;

use super::PgLedger;
use crate::ledger::{LedgerError, LedgerResult};
use crate::rules::leadership::{
    self, Campaign, Lease, LeaseSeen, Observation, Renewal, Tenancy, Tenure, Term,
};

/// The advisory lock's key for the bot `$1`, in SQL: the schema is part of it, since
/// advisory locks are database-wide and each schema is a ledger of its own (tests run side
/// by side in one database, each in a schema). 64 bits of a hash: two ledgers' keys
/// colliding is as likely as a random 64-bit collision.
macro_rules! lock_key {
    () => {
        "hashtextextended('switchboard poller ' || current_schema() || ' ' || $1::bigint::text, 0)"
    };
}

/// The rows of `pg_locks` that are the bot's advisory lock held by another backend, in SQL,
/// for a query with `key.key` in scope: a 64-bit key shows as its high and low halves
/// (`classid`, `objid`) with `objsubid = 1`.
macro_rules! lock_held_elsewhere {
    () => {
        "locktype = 'advisory' AND granted AND objsubid = 1 \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid = ((key.key >> 32) & 4294967295)::oid AND objid = (key.key & 4294967295)::oid \
         AND pid <> pg_backend_pid()"
    };
}

/// One replica's candidacy for polling one bot: its dedicated connection and what it needs
/// to ask for the lock and the lease.
#[derive(Debug)]
pub struct PollerCandidate {
    /// Where a new dedicated connection comes from after the last one was closed.
    ledger: PgLedger,
    /// The session that holds (or asks for) the advisory lock; `None` after a step-down
    /// closed it, until the next campaign opens another.
    connection: Option<PgConnection>,
    bot_id: i64,
    /// The replica's id, written in the lease for the operator.
    replica: String,
    lease: Lease,
}

/// A campaign's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elected {
    /// This replica leads, for this tenure.
    Leader(Tenure),
    /// Another replica leads (or was just deposed and the lock is not free yet).
    StandBy,
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDown {
    /// Shutdown: it gave the lease up, so a standby takes over at its next try.
    Resigned,
    /// The lease ended without a renewal that succeeded (the database was busy, or did
    /// not answer in time).
    Expired,
    /// Another replica holds the lease now.
    Deposed,
    /// The dedicated connection broke.
    LostConnection,
}

impl PollerCandidate {
    /// A candidate for `bot_id`, on a dedicated connection of its own.
    pub async fn connect(ledger: &PgLedger, bot_id: i64, replica: &str, lease: Lease) -> LedgerResult<Self> {
        let mut candidate =
            Self { ledger: ledger.clone(), connection: None, bot_id, replica: replica.to_owned(), lease };
        candidate.connection().await?;
        Ok(candidate)
    }

    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// The backend of the dedicated connection (what the lease names as `holder_pid`).
    pub async fn backend_pid(&mut self) -> LedgerResult<i32> {
        Ok(sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(self.connection().await?).await?)
    }

    /// The dedicated connection, opened again if a step-down closed it.
    async fn connection(&mut self) -> LedgerResult<&mut PgConnection> {
        if self.connection.is_none() {
            let name = format!("switchboard poller {} bot {}", self.replica, self.bot_id);
            self.connection = Some(self.ledger.dedicated_connection(&name).await?);
        }
        Ok(self.connection.as_mut().expect("opened above"))
    }

    /// One try: asks for the lock, and is elected if it got it; deposes a holder whose
    /// lease expired and tries once more. A candidate asks every lease/3
    /// ([`Lease::renewal_interval`]) while it stands by, waiting for the lock in between
    /// ([`Self::wait_for_lock`]), and never while it leads (the lock is re-entrant: it
    /// would elect itself again, into the next term).
    pub async fn campaign_once(&mut self) -> LedgerResult<Elected> {
        let result = self.campaign().await;
        if result.is_err() {
            // The session may be broken, or hold the lock without knowing: start afresh.
            self.close().await;
        }
        result
    }

    async fn campaign(&mut self) -> LedgerResult<Elected> {
        for _ in 0..2 {
            let sent_at = Instant::now();
            let observed = self.observe().await?;
            match leadership::campaign(&observed) {
                Campaign::Elect => {
                    let term = self.elect().await?;
                    return Ok(Elected::Leader(Tenure::elected(term, self.lease, sent_at)));
                }
                Campaign::StandBy => return Ok(Elected::StandBy),
                Campaign::Depose { backend } => {
                    let lease = self.lease;
                    tracing::warn!(
                        bot_id = self.bot_id,
                        backend,
                        term = observed.lease.map(|seen| seen.term.get()),
                        "the polling leader's lease expired while it still holds its lock: terminating its \
                         database session to take over"
                    );
                    // Only while that backend still holds the lock and the lease is still
                    // expired (a pid may be reused; a slow leader may have renewed), checked
                    // in the statement that terminates it; waits (up to a lease) for the
                    // backend to be gone, and its lock with it.
                    sqlx::query(concat!(
                        "WITH key AS (SELECT ",
                        lock_key!(),
                        " AS key) \
                         SELECT pg_terminate_backend(pid, $3) FROM pg_locks, key WHERE ",
                        lock_held_elsewhere!(),
                        " AND pid = $2 \
                         AND EXISTS (SELECT 1 FROM poller_leases WHERE bot_id = $1 AND expires_at <= now())"
                    ))
                    .bind(self.bot_id)
                    .bind(backend)
                    .bind(lease.millis())
                    .execute(self.connection().await?)
                    .await?;
                }
            }
        }
        Ok(Elected::StandBy)
    }

    /// Waits up to `within` for the lock, as a standby does between campaigns: a leader
    /// that dies lets go of it with its session, and the waiting standby has it at once,
    /// instead of at its next try. The next [`Self::campaign_once`] finds it held and is
    /// elected; one that is not had in time (a leader alive, or paused: its lease is looked
    /// at then) is no failure. Any other error closes the connection (the next campaign
    /// opens another) after waiting `within`, so a database that refuses does not make the
    /// standby spin.
    pub async fn wait_for_lock(&mut self, within: Duration) {
        let bot_id = self.bot_id;
        let waited = match self.connection().await {
            Ok(connection) => match lock_within(connection, bot_id, within).await {
                Err(error) if is_lock_timeout(&error) => Ok(()),
                waited => waited.map_err(LedgerError::from),
            },
            Err(error) => Err(error),
        };
        if let Err(error) = waited {
            tracing::debug!(bot_id, %error, "waiting for the polling lock failed");
            self.close().await;
            tokio::time::sleep(within).await;
        }
    }

    /// Asks for the lock, and reads the lease and the lock's holder, in one round trip.
    async fn observe(&mut self) -> LedgerResult<Observation> {
        let bot_id = self.bot_id;
        let row = sqlx::query(concat!(
            "WITH key AS (SELECT ",
            lock_key!(),
            " AS key) \
             SELECT pg_try_advisory_lock(key.key) AS got_lock, \
             (SELECT term FROM poller_leases WHERE bot_id = $1) AS term, \
             (SELECT expires_at <= now() FROM poller_leases WHERE bot_id = $1) AS expired, \
             (SELECT pid FROM pg_locks WHERE ",
            lock_held_elsewhere!(),
            " LIMIT 1) AS holder \
             FROM key"
        ))
        .bind(bot_id)
        .fetch_one(self.connection().await?)
        .await?;
        let term: Option<i64> = row.try_get("term")?;
        let expired: Option<bool> = row.try_get("expired")?;
        Ok(Observation {
            got_lock: row.try_get("got_lock")?,
            lease: term.map(|term| LeaseSeen { term: Term::new(term), expired: expired.unwrap_or(true) }),
            lock_holder: row.try_get("holder")?,
        })
    }

    /// Takes the next term, holding the lock. The row is taken `FOR UPDATE` first, which
    /// waits for the fenced writes in flight (they hold it `FOR KEY SHARE`, which the
    /// upsert's own lock would not wait for), and none of an older term passes after it.
    async fn elect(&mut self) -> LedgerResult<Term> {
        let (bot_id, lease) = (self.bot_id, self.lease);
        let replica = self.replica.clone();
        let mut tx = self.connection().await?.begin().await?;
        sqlx::query("SELECT 1 FROM poller_leases WHERE bot_id = $1 FOR UPDATE")
            .bind(bot_id)
            .execute(&mut *tx)
            .await?;
        let term: i64 = sqlx::query_scalar(
            "INSERT INTO poller_leases AS lease (bot_id, term, holder, holder_pid, elected_at, renewed_at, expires_at) \
             VALUES ($1, 1, $2, pg_backend_pid(), now(), now(), now() + $3 * interval '1 millisecond') \
             ON CONFLICT (bot_id) DO UPDATE SET term = lease.term + 1, holder = EXCLUDED.holder, \
             holder_pid = EXCLUDED.holder_pid, elected_at = EXCLUDED.elected_at, \
             renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at \
             RETURNING term",
        )
        .bind(bot_id)
        .bind(replica)
        .bind(lease.millis() as f64)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(bot_id, term, replica = %self.replica, "elected the bot's polling leader");
        Ok(Term::new(term))
    }

    /// One renewal of `tenure`'s lease: what it came to.
    pub async fn renew_once(&mut self, term: Term) -> Renewal {
        let (bot_id, lease) = (self.bot_id, self.lease);
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(_) => return Renewal::LostConnection,
        };
        let renewed = sqlx::query(
            "UPDATE poller_leases SET renewed_at = now(), expires_at = now() + $3 * interval '1 millisecond' \
             WHERE bot_id = $1 AND term = $2 AND holder_pid = pg_backend_pid()",
        )
        .bind(bot_id)
        .bind(term.get())
        .bind(lease.millis() as f64)
        .execute(connection)
        .await;
        match renewed {
            Ok(done) if done.rows_affected() == 1 => Renewal::Renewed,
            Ok(_) => Renewal::Deposed,
            Err(error) if connection_lost(&error) => Renewal::LostConnection,
            Err(error) => {
                tracing::warn!(bot_id, term = term.get(), error = %LedgerError::from(error), "renewing the polling lease failed");
                Renewal::Failed
            }
        }
    }

    /// Leads for as long as `tenure` lasts: renews every lease/3 and returns when the
    /// tenure ends, at the latest when its lease does, even while a renewal hangs. The
    /// caller stops polling and writing under the term at once. On any end but a
    /// resignation the dedicated connection is closed, so its lock goes with it.
    /// `leads_until` is kept at the tenure's end, for what checks it by the clock.
    pub async fn hold(
        &mut self,
        mut tenure: Tenure,
        shutdown: &CancellationToken,
        leads_until: &tokio::sync::watch::Sender<Instant>,
    ) -> StepDown {
        let mut renew_at = tenure.renew_at();
        let step_down = loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    self.resign(tenure.term).await;
                    return StepDown::Resigned;
                }
                () = tokio::time::sleep_until(renew_at.into()) => {}
            }
            let sent_at = Instant::now();
            let renewal = tokio::select! {
                renewal = self.renew_once(tenure.term) => renewal,
                () = tokio::time::sleep_until(tenure.ends_at().into()) => break StepDown::Expired,
            };
            match tenure.after(renewal, sent_at, Instant::now()) {
                Tenancy::Lead { renew_at: next } => {
                    leads_until.send_replace(tenure.ends_at());
                    renew_at = next;
                }
                Tenancy::StepDown => {
                    break match renewal {
                        Renewal::Deposed => StepDown::Deposed,
                        Renewal::LostConnection => StepDown::LostConnection,
                        Renewal::Renewed | Renewal::Failed => StepDown::Expired,
                    };
                }
            }
        };
        tracing::warn!(
            bot_id = self.bot_id,
            term = tenure.term.get(),
            ?step_down,
            "no longer the bot's polling leader"
        );
        self.close().await;
        step_down
    }

    /// Gives the lease up at shutdown: ends it now and lets go of the lock, so a standby
    /// is elected at its next try instead of after the lease. Best-effort: a failure
    /// leaves the lease to expire.
    pub async fn resign(&mut self, term: Term) {
        let bot_id = self.bot_id;
        if let Ok(connection) = self.connection().await {
            let ended = sqlx::query(
                "UPDATE poller_leases SET expires_at = now() WHERE bot_id = $1 AND term = $2 AND holder_pid = pg_backend_pid()",
            )
            .bind(bot_id)
            .bind(term.get())
            .execute(&mut *connection)
            .await;
            if let Err(error) = ended {
                tracing::warn!(bot_id, error = %LedgerError::from(error), "ending the polling lease at shutdown failed");
            }
        }
        self.close().await;
    }

    /// Closes the dedicated connection (and so lets go of the lock, if it held it).
    async fn close(&mut self) {
        if let Some(connection) = self.connection.take() {
            // A connection that broke cannot say goodbye; dropping it is enough.
            let _ = connection.close().await;
        }
    }
}

/// Takes the bot's advisory lock on `connection` if it can be had within `within`.
async fn lock_within(
    connection: &mut PgConnection,
    bot_id: i64,
    within: Duration,
) -> Result<(), sqlx::Error> {
    // `lock_timeout` bounds an advisory lock's wait as any lock's; `SET LOCAL` ends with the
    // transaction, and the session-level lock it may take outlives it.
    let mut tx = connection.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("SET LOCAL lock_timeout = {}", within.as_millis().max(1))))
        .execute(&mut *tx)
        .await?;
    sqlx::query(concat!("SELECT pg_advisory_lock(", lock_key!(), ")")).bind(bot_id).execute(&mut *tx).await?;
    tx.commit().await
}

/// Whether `error` is a lock's wait that outlasted `lock_timeout`.
fn is_lock_timeout(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(database) if database.code().as_deref() == Some("55P03"))
}

/// Whether `error` means the session is gone (and any advisory lock with it).
fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
            true
        }
        sqlx::Error::Database(database) => {
            database.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57P"))
        }
        _ => false,
    }
}
