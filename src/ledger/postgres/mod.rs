//! The ledger on PostgreSQL (DESIGN.md §16, issue 24), through sqlx: a pool for the
//! ledger's statements, the schema of `migrations/postgres/` applied when it connects, and
//! polling leadership across replicas (`leadership`) with the writes it fences.
//!
//! `PgLedger` implements the storage seam (`ledger::seam`), one file per concern as on
//! SQLite, and passes the conformance suite (`ledger::conformance`). Where SQLite's one
//! writer serialised a rule, each file says what keeps two replicas from both winning here
//! (docs/deploy-postgres.md lists them). The daemon opens it when `[storage] database` is
//! a `postgres://` URL.
//!
//! **Fencing.** A fenced transaction takes the bot's lease row `FOR KEY SHARE` first and goes
//! on only while it names the caller's term; an election takes that row `FOR UPDATE` before
//! it changes the term. So an election waits for the fenced transactions in flight, and
//! after it commits every fenced transaction reads the new term: a deposed leader's late
//! write fails with [`FencedError::Deposed`] and changes nothing, however late it comes.
//! `KEY SHARE`, the weakest row lock, because the leader's renewals (a plain `UPDATE` of the
//! lease's end, which locks `FOR NO KEY UPDATE`) must not wait for its own fenced writes:
//! one stuck behind another session's table lock for the whole lock timeout would
//! otherwise hold the renewal past the lease, and the leader would depose itself.

mod attempts;
#[cfg(test)]
mod conformance;
mod envelopes;
mod error;
mod handoffs;
mod inspect;
mod intake;
pub mod leadership;
mod permissions;
mod prune;
mod questions;
mod reactions;
mod relay;
#[cfg(test)]
mod replica_races;
mod rooms;
mod rows;
mod sessions;
mod tasks;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
mod transaction;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};

use crate::ledger::seam::Lifecycle;
use crate::ledger::task_rows::Conversation;
use crate::ledger::{ErrorSource, LedgerError, LedgerResult, WriteWatch};
use crate::rules::leadership::Term;

pub use leadership::{Elected, PollerCandidate, StepDown};
pub use relay::{RELAYED_CHANNEL, RelayedUpdate};
use transaction::{LedgerTransaction, transaction_columns};

/// The schema, embedded at build time (`build.rs` rebuilds when a file changes).
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// How many connections one replica keeps to the database for the ledger's statements.
/// Leadership has its own, outside the pool (see `leadership`).
const POOL_SIZE: u32 = 8;

/// How long a statement waits for a row or table lock another session holds before it fails
/// as `Busy`: SQLite's busy timeout.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a transaction may sit open while its client says nothing, before the server
/// ends its session. The ledger's transactions never wait on anything but the database, so
/// one that goes quiet this long belongs to a replica that was paused (SIGSTOP, a frozen
/// VM) or cut off without a reset: ending it frees the rows it holds (the lease row a
/// fenced write holds, an attempt in flight), so that a standby's election and its start-up
/// recovery, which wait up to [`LOCK_TIMEOUT`] for those rows, get them in that wait
/// instead of waiting for the paused replica to come back. The session ended is `Busy`
/// to its replica, should it resume.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a statement waits for a pooled connection before it fails as `Busy`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection idle longer than this is pinged before it is handed out, and
/// replaced if the server no longer answers on it (ended by a server restart, by
/// `idle_session_timeout`, by a proxy that cuts idle connections). One used more recently
/// was answered on a moment ago: pinging it too cost a round trip on every statement of a
/// message's path, about a fifth of the loop on this machine's loopback (see
/// docs/deploy-postgres.md, "The loop on PostgreSQL").
const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// How long readiness's write may take before the ledger counts as not taking writes.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The ledger on PostgreSQL, shared by the replicas that name the same database.
#[derive(Clone)]
pub struct PgLedger {
    /// The ledger's statements.
    pool: PgPool,
    /// How to open a connection of one's own (leadership's, which must outlive no pool).
    options: PgConnectOptions,
    /// What this replica's writes came to lately, for its readiness.
    writes: Arc<WriteWatch>,
    /// The terms this replica leads polling under, by bot: what its polled batches are
    /// fenced by (see `intake`).
    polling_terms: Arc<std::sync::Mutex<HashMap<i64, Term>>>,
    /// What this replica's work as the leader is fenced by: its sends (see `attempts`), the
    /// webhook deliveries it takes in (see `intake`) and its sessions' claims (see
    /// `envelopes`).
    leading: Arc<std::sync::Mutex<LeaderFence>>,
}

/// Whether a replica may act as the bot's leader: record a send attempt (and so make the
/// send), take in a webhook delivery, and claim queued envelopes for its sessions. The
/// leader is the one replica that does (DESIGN.md §16), so a replica that led and no longer
/// does does none of it, whatever reached it before it learned so (a reply or a delivery
/// that waited in its socket while it was paused past its lease).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LeaderFence {
    /// This ledger never led: the command line, a test of the ledger alone. Nothing to
    /// fence by.
    #[default]
    NeverLed,
    /// Each write is made only while `bot_id`'s lease still names `term`.
    Leading { bot_id: i64, term: Term },
    /// Its term is over: nothing is written.
    Over { bot_id: i64, term: Term },
}

/// The bot's lease row (its id the statement's parameter named), as a CTE named `lease`
/// locked `FOR KEY SHARE` until the transaction ends: what every fenced write reads the
/// term from. An election takes the row `FOR UPDATE`, so it waits for every write that read
/// it, and a write that waited reads the term the election committed (see [`fence_intake`]).
macro_rules! fenced_lease {
    ($bot_id:literal) => {
        concat!(
            "lease AS MATERIALIZED (SELECT term FROM poller_leases WHERE bot_id = ",
            $bot_id,
            " FOR KEY SHARE)"
        )
    };
}
use fenced_lease;

/// The condition a write fenced by [`fenced_lease!`] adds, given the parameters that bind
/// [`LeaderFence::lease_binds`]: true for a ledger that never led (no bot id), and
/// otherwise only while the lease row names the term.
macro_rules! under_lease {
    ($bot_id:literal, $term:literal) => {
        concat!("(", $bot_id, "::bigint IS NULL OR EXISTS (SELECT 1 FROM lease WHERE term = ", $term, "))")
    };
}
use under_lease;

impl LeaderFence {
    /// The bot's lease a leader's write must find at its term: none for a ledger that
    /// never led; an error once the term is over, so that the write is not even tried.
    fn lease_to_check(self) -> LedgerResult<Option<(i64, Term)>> {
        match self {
            Self::NeverLed => Ok(None),
            Self::Leading { bot_id, term } => Ok(Some((bot_id, term))),
            Self::Over { bot_id, term } => Err(no_longer_leads(bot_id, term)),
        }
    }

    /// [`Self::lease_to_check`] as a fenced statement binds it for [`under_lease!`]: the
    /// bot id and the term, both NULL for a ledger that never led.
    fn lease_binds(self) -> LedgerResult<(Option<i64>, Option<i64>)> {
        Ok(self.lease_to_check()?.map(|(bot_id, term)| (bot_id, term.get())).unzip())
    }
}

/// Without the connection options, whose derived `Debug` would print the password.
impl std::fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLedger").field("pool", &self.pool).finish_non_exhaustive()
    }
}

/// Why the PostgreSQL ledger could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum PgOpenError {
    #[error("the PostgreSQL URL in `[storage] database` is not valid: {detail}")]
    Url { detail: String },
    #[error("connecting to PostgreSQL")]
    Connect(#[source] LedgerError),
    #[error(
        "no switchboard ledger in this PostgreSQL database and schema (no `_sqlx_migrations` table): \
         check `[storage] database`, or start `switchboard run` once to create it"
    )]
    NoLedger,
    #[error(
        "the PostgreSQL search_path names no schema that exists ({search_path}): the ledger's tables \
         have nowhere to go; create the schema (CREATE SCHEMA …) or fix `options=-c search_path=…` in \
         `[storage] database`"
    )]
    NoSchema { search_path: String },
    #[error(
        "the PostgreSQL database's encoding is {encoding}, not UTF8: it cannot store every character \
         Telegram sends (an emoji would fail intake on every try, SQLSTATE 22P05); create the ledger's \
         database with ENCODING 'UTF8' (CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0)"
    )]
    NotUtf8 { encoding: String },
    #[error("applying the PostgreSQL ledger's migrations (`_sqlx_migrations` says which were applied)")]
    Migrate(#[source] ErrorSource),
    #[error(
        "this ledger lacks migration {version} ({description}) and a replica leads on it (its lease is \
         live): a replica of an earlier release would be left on a schema it does not know. Run \
         `switchboard ledger` of the replicas' release, or upgrade the replicas first (each migrates \
         the ledger as it starts)"
    )]
    Behind { version: i64, description: String },
}

/// A fenced write of the polling leader refused, or failed.
#[derive(Debug, thiserror::Error)]
pub enum FencedError {
    /// Another replica was elected since `term`: nothing was written. The caller is no
    /// longer the bot's polling leader and must stop acting as one.
    #[error("deposed: {term} is over (the bot's lease is at {current}); nothing was written")]
    Deposed { term: Term, current: CurrentTerm },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The term a fenced write found, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CurrentTerm {
    /// Nobody was ever elected for the bot.
    None,
    Term(Term),
}

impl std::fmt::Display for CurrentTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("no term: nobody was elected"),
            Self::Term(term) => term.fmt(f),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for PgOpenError {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        Self::Migrate(Box::new(error))
    }
}

impl PgLedger {
    /// Connects to the database at `url` (`postgres://…`; a schema other than the
    /// default's is chosen with the URL's `options=-c search_path=NAME`) and brings its
    /// schema up to date. Migrations already applied are left alone, so every replica
    /// may do this as it starts; sqlx serialises concurrent migrators with a lock of its own.
    pub async fn connect(url: &str) -> Result<Self, PgOpenError> {
        let ledger = Self::pool(url).await?;
        ledger.refuse_an_unfit_database().await?;
        MIGRATOR.run(&ledger.pool).await?;
        Ok(ledger)
    }

    /// Refuses a database the ledger cannot work in. A search_path whose schemas do not
    /// exist leaves `current_schema()` empty, and the migrations would fail statement by
    /// statement with "no schema has been selected"; a database not in UTF8 cannot store
    /// every character a message may hold.
    async fn refuse_an_unfit_database(&self) -> Result<(), PgOpenError> {
        let (schema, search_path, encoding): (Option<String>, String, String) = sqlx::query_as(
            "SELECT current_schema()::text, current_setting('search_path'), current_setting('server_encoding')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(|error| PgOpenError::Connect(error.into()))?;
        if schema.is_none() {
            self.pool.close().await;
            return Err(PgOpenError::NoSchema { search_path });
        }
        // Any other encoding refuses some character a message may hold (22P05), which
        // would stop intake on every try; SQLite stores every one.
        if encoding != "UTF8" {
            self.pool.close().await;
            return Err(PgOpenError::NotUtf8 { encoding });
        }
        Ok(())
    }

    /// Like [`PgLedger::connect`], for `switchboard ledger`: the schema must already hold a
    /// ledger, so a mistyped URL or schema never becomes a new, empty one.
    pub async fn connect_existing(url: &str) -> Result<Self, PgOpenError> {
        let ledger = Self::pool(url).await?;
        ledger.refuse_an_unfit_database().await?;
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&ledger.pool)
            .await
            .map_err(|error| PgOpenError::Connect(error.into()))?;
        if !exists {
            ledger.pool.close().await;
            return Err(PgOpenError::NoLedger);
        }
        if let Some(lacking) = ledger.migration_lacking_under_a_leader().await? {
            ledger.pool.close().await;
            return Err(lacking);
        }
        MIGRATOR.run(&ledger.pool).await?;
        Ok(ledger)
    }

    /// For `switchboard ledger`: the first migration this ledger lacks while a replica
    /// leads on it (a live lease), which would leave that replica, of an earlier release,
    /// on a schema it does not know. None when nothing is lacking or nobody leads.
    async fn migration_lacking_under_a_leader(&self) -> Result<Option<PgOpenError>, PgOpenError> {
        let connect = |error: sqlx::Error| PgOpenError::Connect(error.into());
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&self.pool)
            .await
            .map_err(connect)?;
        let Some(lacking) = MIGRATOR.iter().find(|migration| {
            migration.migration_type.is_up_migration() && !applied.contains(&migration.version)
        }) else {
            return Ok(None);
        };
        let has_leases: bool = sqlx::query_scalar("SELECT to_regclass('poller_leases') IS NOT NULL")
            .fetch_one(&self.pool)
            .await
            .map_err(connect)?;
        let led = has_leases
            && sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM poller_leases WHERE expires_at > now())",
            )
            .fetch_one(&self.pool)
            .await
            .map_err(connect)?;
        Ok(led.then(|| PgOpenError::Behind {
            version: lacking.version,
            description: lacking.description.to_string(),
        }))
    }

    async fn pool(url: &str) -> Result<Self, PgOpenError> {
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|error| PgOpenError::Url { detail: error.to_string() })?;
        // As SQLite's busy timeout: a lock held elsewhere (an operator's session left in a
        // transaction) is waited for this long, then the statement fails as `Busy`, which
        // intake waits out, instead of hanging the write forever. The URL may set its own.
        let timeouts = [
            ("lock_timeout", LOCK_TIMEOUT),
            ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION_TIMEOUT),
        ];
        for (setting, timeout) in timeouts {
            if !options.get_options().is_some_and(|given| given.contains(setting)) {
                options = options.options([(setting, format!("{}ms", timeout.as_millis()))]);
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|connection, held| {
                Box::pin(async move {
                    if held.idle_for > PING_AFTER_IDLE {
                        sqlx::Connection::ping(connection).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options.clone())
            .await
            .map_err(|error| PgOpenError::Connect(error.into()))?;
        Ok(Self {
            pool,
            options,
            writes: Arc::default(),
            polling_terms: Arc::default(),
            leading: Arc::default(),
        })
    }

    /// Closes the pool's connections, waiting for the statements under way.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A connection of its own, outside the pool: leadership's.
    async fn dedicated_connection(&self, application_name: &str) -> LedgerResult<PgConnection> {
        use sqlx::ConnectOptions;
        Ok(self.options.clone().application_name(application_name).connect().await?)
    }

    /// Moves the bot's offset to `next_offset`, if `term` is still the bot's current term.
    pub async fn commit_offset(&self, term: Term, bot_id: i64, next_offset: i64) -> Result<(), FencedError> {
        let mut tx = self.begin().await?;
        fence_intake(&mut tx, term, bot_id, Some(next_offset), &[]).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Lifecycle for PgLedger {
    fn write_watch(&self) -> Arc<WriteWatch> {
        Arc::clone(&self.writes)
    }

    /// A transaction that takes a transaction id and commits: the server must write its
    /// log for that, so a full disk, a read-only standby or a server that does not answer
    /// in time all fail it.
    async fn probe_write(&self) -> Result<(), String> {
        let probe = async {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT pg_current_xact_id()").execute(&mut *tx).await?;
            tx.commit().await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(format!("the ledger refused a write: {}", LedgerError::from(error))),
            Err(_) => Err(format!("the ledger did not take a write within {}s", PROBE_TIMEOUT.as_secs())),
        }
    }

    async fn close(&self) {
        PgLedger::close(self).await;
    }
}

/// Why a replica that led writes nothing more as the leader: it sends nothing it could not
/// record, and takes in nothing it could not hand to the leader's sessions.
fn no_longer_leads(bot_id: i64, term: Term) -> LedgerError {
    LedgerError::other(format!(
        "this replica no longer leads bot {bot_id} ({term} is over): only the leader sends and takes updates in"
    ))
}

/// Goes on only while `term` is the bot's current term, holding the lease row `FOR KEY SHARE`
/// until the transaction ends, so no election commits in between (see the module
/// documentation), and moves the bot's offset to `next_offset` under it (a polled batch's;
/// a pushed one has none). In the same statement it holds the conversations `hold`
/// (intake's, see `tasks::hold_conversations`).
///
/// One statement, so one round trip: the offset is written from the lease row the
/// statement locked, and only while that row names `term`. Under `READ COMMITTED` a lock
/// that waited for an election reads the row the election committed, so a deposed
/// leader's write is refused, as when the check and the write were two statements. The
/// conversations' locks are taken once the lease row is (the select list reads `held` for
/// it); what they guard is read by later statements, which see what their holders
/// committed. A deposed leader's transaction is rolled back, its locks with it.
async fn fence_intake(
    tx: &mut LedgerTransaction,
    term: Term,
    bot_id: i64,
    next_offset: Option<i64>,
    hold: &[Conversation],
) -> Result<(), FencedError> {
    let (chat_ids, thread_ids, agents) = tasks::conversation_columns(hold);
    let lease: Option<PgRow> = sqlx::query(concat!(
        "WITH ",
        fenced_lease!("$1"),
        ", moved AS (INSERT INTO poller_offsets (bot_id, next_offset, updated_at) \
         SELECT $1, $3, now() FROM lease WHERE term = $2 AND $3::bigint IS NOT NULL \
         ON CONFLICT (bot_id) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at), \
         held AS MATERIALIZED (SELECT pg_advisory_xact_lock(key) FROM (",
        tasks::conversation_lock_keys!("$4", "$5", "$6"),
        ") AS keys ORDER BY key) \
         SELECT term, (SELECT count(*) FROM held) AS held, ",
        transaction_columns!(),
        " FROM lease",
    ))
    .bind(bot_id)
    .bind(term.get())
    .bind(next_offset)
    .bind(chat_ids)
    .bind(thread_ids)
    .bind(agents)
    .fetch_optional(&mut **tx)
    .await
    .map_err(LedgerError::from)?;
    let current = match lease {
        Some(row) => {
            tx.note(&row)?;
            Some(row.try_get::<i64, _>("term").map_err(LedgerError::from)?)
        }
        None => None,
    };
    match current {
        Some(current) if current == term.get() => Ok(()),
        Some(current) => Err(FencedError::Deposed { term, current: CurrentTerm::Term(Term::new(current)) }),
        None => Err(FencedError::Deposed { term, current: CurrentTerm::None }),
    }
}
