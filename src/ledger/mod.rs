//! The ack ledger: SQLite. The transactions and reads on the path of every message run on
//! connections the ledger owns, on the calling thread (`in_place`, `readers`); sqlx keeps
//! the migrations, the checkpointer and a pool for the rest. Every envelope, every send
//! attempt and the poller's offset live here, so nothing is lost when the daemon dies and
//! nothing is done twice when it starts again.
//!
//! The ledger only stores and transitions; what a transition *means* is decided by the
//! pure code in `routes`, `resolver` and `outbound`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{SecondsFormat, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection as _, SqlitePool};

use crate::config::Synchronous;
use checkpoint::Checkpointer;
use in_place::{Writer, WriterSettings};
use readers::Readers;

/// How long a writer waits for another (e.g. `switchboard ledger reconcile` while the
/// daemon runs) before giving up. Ledger transactions are short, so this is generous.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// One pooled connection: the migrations, and the reads off the path of a message (the
/// operator's listings, the gauges). It writes nothing once the ledger is open: every
/// write runs on the ledger's own writer (`in_place`), since SQLite allows one writer at a
/// time and two connections of this process writing at once would not queue (the second
/// gets `SQLITE_BUSY`, and SQLite's busy handler sleeps before trying again).
const MAX_CONNECTIONS: u32 = 1;

pub fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}
#[derive(Debug, Clone)]
pub struct Ledger {
    /// For the writes off the path of a message (rooms, handoffs, operator commands), in
    /// their turn to write, and the reads off it (see [`MAX_CONNECTIONS`]).
    pool: SqlitePool,
    /// The connection the transactions on the path of a message write on, and this
    /// process's turn to write (see `in_place`).
    writer: Arc<Writer>,
    /// Connections for the reads on the path of a message (resolving a reply, the guard of
    /// a handoff) while a write holds the writer (an idle writer serves them itself): they
    /// never wait for the writer in WAL mode. Nothing writes here.
    readers: Arc<Readers>,
    /// The daemon's ledger checkpoints off the path of its commits (see `checkpoint`);
    /// `switchboard ledger` leaves that to SQLite.
    checkpointer: Option<Arc<Checkpointer>>,
    /// Whether intake, attempts and checkpoints write, for readiness (see `write_watch`).
    writes: Arc<WriteWatch>,
}

/// The columns of [`StoredEnvelope`], as a macro so queries stay `&'static str` literals
/// (sqlx refuses SQL assembled at run time unless it is audited).
macro_rules! envelope_columns {
    () => {
        "id, trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, deliveries, state_changed_at, note, task_id, revision, meta"
    };
}

/// A row when an action for envelope `?2` may not go out: the SQL of
/// [`crate::rules::revisions::admit`], for statements that record an action and decide its admission in
/// one step (`Ledger::begin_attempt`). `tests::the_admission_in_sql_agrees_with_admit`
/// keeps the two in step.
macro_rules! refused_for_envelope {
    () => {
        "SELECT 1 FROM envelopes e JOIN tasks t ON t.task_id = e.task_id WHERE e.id = ?2 \
         AND (t.state IN ('paused', 'stop_requested', 'stopped', 'replaced') \
              OR e.revision < COALESCE(t.instruction_revision, 0))"
    };
}

mod attempts;
mod checkpoint;
mod envelopes;
pub mod files;
mod handoffs;
mod in_place;
mod inspect;
mod intake;
mod lock;
mod probe;
mod readers;
mod rooms;
mod sessions;
mod states;
mod tasks;
mod write_watch;

pub use attempts::{
    AttemptOutcome, AttemptPurpose, AttemptState, NewAttempt, ReconciledOutcome, RecordedReply, ReplyVerdict,
    StoredAttempt,
};
pub use envelopes::{FoundForReply, RoutedEnvelope, StoredEnvelope};
pub use handoffs::{HandoffEnd, HandoffState, NewHandoff, StoredHandoff};
/// How the writer's connection is set up, for a floor that measures SQLite alone with the
/// same settings (`benches/hot_path.rs`).
pub use in_place::{PAGE_CACHE_KIB, WRITER_SPILL_PAGES};
pub use inspect::{ListFilter, ReconcileError, Reconciliation, StoredEvent};
pub use intake::LedgerCongestion;
pub use intake::RecordedBatch;
pub use lock::{LedgerLock, LockError};
pub use probe::{LEDGER_APPLICATION_ID, LedgerProbe};
pub use rooms::{
    AppliedStep, CascadeUpdate, ClaimRefused, NewCascade, NewPost, RoomCascadeState, RoomStep, StoredCascade,
    StoredPost, StoredTurn, TurnClose, TurnEnding, TurnOpen,
};
pub use states::{EnvelopeKind, EnvelopeState};
pub use tasks::{BotPost, DeclareError, DeclareTaskError, DeclaredRevision, StoredRevision, TaskEffect};
pub use write_watch::{LedgerWrite, WriteFailing, WriteProblem, WriteWatch};

impl Ledger {
    /// Opens the database, creating it (mode `0600`) if needed, and applies pending
    /// migrations. The daemon's way in.
    pub async fn open(path: &Path, synchronous: Synchronous) -> anyhow::Result<Self> {
        files::create_private(path)
            .with_context(|| format!("creating the ledger database {} (mode 0600)", path.display()))?;
        tighten_and_warn(path);
        Self::connect(path, synchronous, true, Some(Checkpointer::new())).await
    }

    /// Opens a database that must already exist, and applies pending migrations. For
    /// `switchboard ledger`: a mistyped path must not become a new, empty ledger.
    pub async fn open_existing(path: &Path, synchronous: Synchronous) -> anyhow::Result<Self> {
        tighten_and_warn(path);
        Self::connect(path, synchronous, false, None).await
    }

    async fn connect(
        path: &Path,
        synchronous: Synchronous,
        create: bool,
        checkpointer: Option<Checkpointer>,
    ) -> anyhow::Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                Synchronous::Normal => SqliteSynchronous::Normal,
                Synchronous::Full => SqliteSynchronous::Full,
            })
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            // The pool and the checkpointer are off the path of a message: the same small
            // page cache as the connections the ledger owns (see `in_place`).
            .pragma("cache_size", in_place::PAGE_CACHE_KIB.to_string());
        let checkpointer = checkpointer.map(Arc::new);
        let options = match &checkpointer {
            Some(_) => options.pragma("wal_autocheckpoint", checkpoint::BACKSTOP_PAGES.to_string()),
            None => options,
        };
        let hook = checkpointer.clone();
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            // sqlx pings a pooled connection before every use by default, for servers that
            // may have hung up. A SQLite connection is a file handle in this process; the
            // ping was a round trip to its worker thread before every statement, and a
            // broken connection is still closed on release (below).
            .test_before_acquire(false)
            // SQLite rolls a transaction back by itself on some errors (a full disk, for
            // one); sqlx's ROLLBACK then fails and the connection would go back to the pool
            // believing it is still inside a transaction, refusing every later BEGIN. Such
            // a connection is closed instead, and the pool opens a fresh one.
            .after_release(|connection, _| {
                let healthy = !connection.is_in_transaction();
                Box::pin(async move { Ok(healthy) })
            })
            // Every commit tells the checkpointer there is something to checkpoint.
            .after_connect(move |connection, _| {
                let on_commit = hook.as_ref().map(|checkpointer| checkpointer.on_commit());
                Box::pin(async move {
                    if let Some(on_commit) = on_commit {
                        connection.lock_handle().await?.set_commit_hook(on_commit);
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await
            .with_context(|| format!("opening the ledger database {}", path.display()))?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .with_context(|| format!("applying migrations to {}", path.display()))?;
        let readers = Arc::new(Readers::new(path));
        let settings = WriterSettings { synchronous, checkpointer: checkpointer.clone() };
        let writer = Arc::new(
            Writer::open(path, settings)
                .with_context(|| format!("opening the ledger database {} for writing", path.display()))?,
        );
        let writes = Arc::new(WriteWatch::default());
        if let Some(checkpointer) = &checkpointer {
            checkpointer
                .start(&options, Arc::clone(&writes))
                .await
                .with_context(|| format!("opening a checkpointing connection to {}", path.display()))?;
        }
        Ok(Self { pool, writer, readers, checkpointer, writes })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// What intake, attempts and checkpoints came to lately, for readiness.
    pub fn write_watch(&self) -> Arc<WriteWatch> {
        Arc::clone(&self.writes)
    }

    pub async fn close(&self) {
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.stop().await;
        }
        self.readers.close();
        self.pool.close().await;
    }
}

/// Tightens ledger files that group or others could read, saying so: a warning, not a
/// failure, because the daemon can still work (and the operator can fix it) when it is
/// not allowed to change a mode.
fn tighten_and_warn(database: &Path) {
    match files::tighten(database) {
        Ok(tightened) => {
            for file in tightened {
                tracing::warn!(
                    "ledger file {} had mode {:04o}, open to other users: tightened to {:04o}",
                    file.path.display(),
                    file.mode,
                    files::PRIVATE_MODE
                );
            }
        }
        Err(e) => tracing::warn!(
            "cannot restrict the ledger files of {} to their owner (mode {:04o}): {e}",
            database.display(),
            files::PRIVATE_MODE
        ),
    }
}

#[cfg(test)]
mod tests;
