//! The ledger on PostgreSQL (DESIGN.md §16, issue 24), through sqlx: a pool for the
//! ledger's statements, the schema of `migrations/postgres/` applied when it connects, and
//! polling leadership across replicas (`leadership`) with the writes it fences.
//!
//! What exists so far is the groundwork: the whole schema, connecting, the error mapping
//! (`error`), leadership with a fenced term, and the two writes of the poller that the
//! term fences, [`PgLedger::commit_offset`] and [`PgLedger::record_updates`]. The rest of the
//! ledger's operations come when this backend implements the storage seam (`ledger::seam`)
//! and passes the conformance suite (`ledger::conformance`).
//!
//! **Fencing.** A fenced transaction takes the bot's lease row `FOR SHARE` first and goes on
//! only while it names the caller's term; an election `UPDATE`s that row. So an election
//! waits for the fenced transactions in flight, and after it commits every fenced
//! transaction reads the new term: a deposed leader's late write fails with
//! [`FencedError::Deposed`] and changes nothing, however late it comes.

#[cfg(test)]
#[allow(unused)] // until a concern's rules run here
mod conformance;
mod error;
pub mod leadership;
mod permissions;
#[cfg(test)]
mod replica_races;
// Until every concern of the seam is built here (`unbuilt.rs`), some helpers wait for
// their callers.
#[allow(unused)]
mod rows;
#[allow(unused)]
mod tasks;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
mod unbuilt;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::ids::{AgentName, RouteName};
use crate::ledger::seam::Lifecycle;
use crate::ledger::{ErrorSource, LedgerError, LedgerResult, RoutedEnvelope, WriteWatch};
use crate::rules::leadership::Term;

pub use leadership::{Elected, PollerCandidate, StepDown};

/// The schema, embedded at build time (`build.rs` rebuilds when a file changes).
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// How many connections one replica keeps to the database for the ledger's statements.
/// Leadership has its own, outside the pool (see `leadership`).
const POOL_SIZE: u32 = 8;

/// How long a statement waits for a pooled connection before it fails as `Busy`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ledger on PostgreSQL, shared by the replicas that name the same database.
#[derive(Clone)]
pub struct PgLedger {
    /// The ledger's statements.
    pool: PgPool,
    /// How to open a connection of one's own (leadership's, which must outlive no pool).
    options: PgConnectOptions,
    /// What this replica's writes came to lately, for its readiness.
    writes: Arc<WriteWatch>,
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
    #[error("applying the PostgreSQL ledger's migrations (`_sqlx_migrations` says which were applied)")]
    Migrate(#[source] ErrorSource),
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
        let options = PgConnectOptions::from_str(url)
            .map_err(|error| PgOpenError::Url { detail: error.to_string() })?;
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await
            .map_err(|error| PgOpenError::Connect(error.into()))?;
        MIGRATOR.run(&pool).await?;
        Ok(Self { pool, options, writes: Arc::default() })
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

    /// The offset the bot's poller goes on from, if one was ever committed.
    pub async fn next_offset(&self, bot_id: i64) -> LedgerResult<Option<i64>> {
        Ok(sqlx::query_scalar("SELECT next_offset FROM poller_offsets WHERE bot_id = $1")
            .bind(bot_id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Moves the bot's offset to `next_offset`, if `term` is still the bot's current term.
    pub async fn commit_offset(&self, term: Term, bot_id: i64, next_offset: i64) -> Result<(), FencedError> {
        let mut tx = self.pool.begin().await.map_err(LedgerError::from)?;
        fence(&mut tx, term, bot_id).await?;
        set_offset(&mut tx, bot_id, next_offset).await?;
        tx.commit().await.map_err(LedgerError::from)?;
        Ok(())
    }

    /// Intake's write on this backend, fenced by `term`: the batch's envelopes, deduplicated
    /// on (`update_id`, `update_digest`) as on SQLite, and the offset that confirms them, in
    /// one transaction. Returns, for each row of `batch`, whether it was new.
    ///
    /// It takes what the seam's intake takes (`seam::Intake::record_batch`) and stores the same
    /// columns, but not yet what SQLite's intake does around the rows: tasks, the hand-over
    /// to live sessions, reactions and a quote's trace id (`meta` is written without
    /// `reply_to_trace_id`). Those come with the seam's implementation.
    pub async fn record_updates(
        &self,
        term: Term,
        bot_id: i64,
        next_offset: i64,
        batch: &[RoutedEnvelope],
    ) -> Result<Vec<bool>, FencedError> {
        let rows = EnvelopeColumns::of(batch);
        let mut tx = self.pool.begin().await.map_err(LedgerError::from)?;
        fence(&mut tx, term, bot_id).await?;
        // One statement for the whole batch: a statement is a round trip here.
        let stored: Vec<(i64, String)> = sqlx::query_as(
            "INSERT INTO envelopes (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, \
             chat_title, message_id, sender_id, sender_username, sender_name, text, attachments, content, \
             sent_at, received_at, route, agent, state, state_changed_at, note, raw_update, meta) \
             SELECT trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, chat_title, \
             message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, now(), \
             route, agent, state, now(), note, raw_update, meta \
             FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], \
             $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[], $13::text[], \
             $14::text[], $15::text[], $16::timestamptz[], $17::text[], $18::text[], $19::text[], $20::text[], \
             $21::text[], $22::text[]) WITH ORDINALITY \
             AS batch (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, chat_title, \
             message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, route, \
             agent, state, note, raw_update, meta, position) \
             ORDER BY position \
             ON CONFLICT (update_id, update_digest) DO NOTHING \
             RETURNING update_id, update_digest",
        )
        .bind(rows.trace_id)
        .bind(rows.update_id)
        .bind(&rows.update_digest)
        .bind(rows.kind)
        .bind(rows.chat_id)
        .bind(rows.thread_id)
        .bind(rows.chat_type)
        .bind(rows.chat_title)
        .bind(rows.message_id)
        .bind(rows.sender_id)
        .bind(rows.sender_username)
        .bind(rows.sender_name)
        .bind(rows.text)
        .bind(rows.attachments)
        .bind(rows.content)
        .bind(rows.sent_at)
        .bind(rows.route)
        .bind(rows.agent)
        .bind(rows.state)
        .bind(rows.note)
        .bind(rows.raw_update)
        .bind(rows.meta)
        .fetch_all(&mut *tx)
        .await
        .map_err(LedgerError::from)?;
        set_offset(&mut tx, bot_id, next_offset).await?;
        tx.commit().await.map_err(LedgerError::from)?;
        Ok(batch
            .iter()
            .map(|routed| {
                stored.iter().any(|(update_id, digest)| {
                    *update_id == routed.envelope.update_id && *digest == routed.update_digest
                })
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl Lifecycle for PgLedger {
    fn write_watch(&self) -> Arc<WriteWatch> {
        Arc::clone(&self.writes)
    }

    async fn close(&self) {
        PgLedger::close(self).await;
    }
}

/// Goes on only while `term` is the bot's current term, holding the lease row `FOR SHARE`
/// until the transaction ends, so no election commits in between (see the module
/// documentation).
async fn fence(tx: &mut PgConnection, term: Term, bot_id: i64) -> Result<(), FencedError> {
    let current: Option<i64> =
        sqlx::query_scalar("SELECT term FROM poller_leases WHERE bot_id = $1 FOR SHARE")
            .bind(bot_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(LedgerError::from)?;
    match current {
        Some(current) if current == term.get() => Ok(()),
        Some(current) => Err(FencedError::Deposed { term, current: CurrentTerm::Term(Term::new(current)) }),
        None => Err(FencedError::Deposed { term, current: CurrentTerm::None }),
    }
}

async fn set_offset(tx: &mut PgConnection, bot_id: i64, next_offset: i64) -> LedgerResult<()> {
    sqlx::query(
        "INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES ($1, $2, now()) \
         ON CONFLICT (bot_id) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at",
    )
    .bind(bot_id)
    .bind(next_offset)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A batch of envelopes column by column, as `UNNEST` takes it.
#[derive(Default)]
struct EnvelopeColumns {
    trace_id: Vec<String>,
    update_id: Vec<i64>,
    update_digest: Vec<String>,
    kind: Vec<&'static str>,
    chat_id: Vec<i64>,
    thread_id: Vec<Option<i64>>,
    chat_type: Vec<&'static str>,
    chat_title: Vec<Option<String>>,
    message_id: Vec<i64>,
    sender_id: Vec<Option<i64>>,
    sender_username: Vec<Option<String>>,
    sender_name: Vec<String>,
    text: Vec<Option<String>>,
    attachments: Vec<String>,
    content: Vec<String>,
    sent_at: Vec<DateTime<Utc>>,
    route: Vec<Option<String>>,
    agent: Vec<Option<String>>,
    state: Vec<&'static str>,
    note: Vec<Option<String>>,
    raw_update: Vec<Option<String>>,
    meta: Vec<Option<String>>,
}

impl EnvelopeColumns {
    /// The columns SQLite's intake writes (`ledger/sqlite/intake.rs`), from the same values.
    fn of(batch: &[RoutedEnvelope]) -> Self {
        let mut columns = Self::default();
        for routed in batch {
            let e = &routed.envelope;
            columns.trace_id.push(e.trace_id.as_str().to_owned());
            columns.update_id.push(e.update_id);
            columns.update_digest.push(routed.update_digest.clone());
            columns.kind.push(e.kind.as_str());
            columns.chat_id.push(e.channel.chat_id);
            columns.thread_id.push(e.channel.thread_id.map(i64::from));
            columns.chat_type.push(e.chat_type.as_str());
            columns.chat_title.push(e.chat_title.clone());
            columns.message_id.push(i64::from(e.message_id));
            columns.sender_id.push(e.sender.id);
            columns.sender_username.push(e.sender.username.clone());
            columns.sender_name.push(e.sender.name.clone());
            columns.text.push(e.text.clone());
            columns.attachments.push(serde_json::to_string(&e.attachments).unwrap_or_else(|_| "[]".into()));
            columns.content.push(e.content());
            // Telegram's times are whole seconds, as SQLite stores them.
            columns.sent_at.push(e.sent_at.with_nanosecond(0).unwrap_or(e.sent_at));
            columns.route.push(routed.route.as_ref().map(RouteName::as_str).map(str::to_owned));
            columns.agent.push(routed.agent.as_ref().map(AgentName::as_str).map(str::to_owned));
            columns.state.push(routed.state.as_str());
            columns.note.push(routed.note.clone());
            columns.raw_update.push(routed.raw_update.clone());
            columns.meta.push(e.context.meta(None).map(|meta| serde_json::Value::Object(meta).to_string()));
        }
        columns
    }
}
