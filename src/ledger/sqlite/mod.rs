//! The embedded backend: SQLite, through rusqlite alone, on connections the ledger owns.
//! The transactions and reads on the path of every message run on the calling thread
//! (`in_place`, `readers`); the reads that may scan much of the file (the operator's
//! listings, the gauges) run on a reader on a blocking thread; migrations (`migrations`),
//! checkpoints (`checkpoint`) and the readiness probe (`probe`) have connections of their
//! own. Every function fails with [`LedgerError`]: nothing outside `ledger/` knows which
//! library runs the statements.
//!
//! The engine (connections, the writer's turn, checkpoints, the probe, migrations, locks,
//! file modes) is apart from the tables (`envelopes`, `attempts`, `handoffs`, ...), each of
//! which implements one trait of the seam (`super::seam`) for [`SqliteLedger`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use checkpoint::Checkpointer;
use in_place::{Writer, WriterSettings};
use readers::Readers;
use rusqlite::OpenFlags;

use super::seam::Lifecycle;
use crate::config::Synchronous;
use crate::ledger::write_watch::WriteWatch;

/// How long a writer waits for another (e.g. `switchboard ledger reconcile` while the
/// daemon runs) before giving up. SqliteLedger transactions are short, so this is generous.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::clock::{now_text as now, text as timestamp};

#[derive(Debug, Clone)]
pub struct SqliteLedger {
    /// The connection every write of the process runs on, and this process's turn to
    /// write (see `in_place`).
    writer: Arc<Writer>,
    /// Connections for the reads on the path of a message (resolving a reply, the guard of
    /// a handoff) while a write holds the writer (an idle writer serves them itself), and
    /// for the long reads off it, on a blocking thread: they never wait for the writer in
    /// WAL mode. Nothing writes here.
    readers: Arc<Readers>,
    /// Checkpoints off the path of its commits (see `checkpoint`), the daemon's ledger's
    /// and `switchboard ledger`'s alike: left to SQLite, a checkpoint would run inside
    /// whichever commit brought the WAL past 1,000 pages (a prune's batch, say).
    checkpointer: Arc<Checkpointer>,
    /// Whether intake, attempts and checkpoints write, for readiness (see `write_watch`).
    writes: Arc<WriteWatch>,
    /// Readiness's own write, on a connection of its own (see `probe`).
    probe: Arc<LedgerProbe>,
}

/// A row when an action for envelope `?2` may not go out: the SQL of
/// [`crate::rules::revisions::admit`], for statements that record an action and decide its admission in
/// one step (`SqliteLedger::begin_attempt`). `tests::the_admission_in_sql_agrees_with_admit`
/// keeps the two in step.
macro_rules! refused_for_envelope {
    () => {
        "SELECT 1 FROM envelopes e JOIN tasks t ON t.task_id = e.task_id WHERE e.id = ?2 \
         AND (t.state IN ('paused', 'stop_requested', 'stopped', 'replaced') \
              OR e.revision < COALESCE(t.instruction_revision, 0))"
    };
}

mod attempts;
mod engine;
mod envelopes;
mod handoffs;
mod inspect;
mod intake;
mod permissions;
mod prune;
mod questions;
mod reactions;
mod rooms;
mod sessions;
mod tasks;

pub use super::error::{ErrorSource, LedgerError, LedgerResult};
pub use backup::{Backup, BackupError, back_up, staging_path};
pub use checkpoint::{WAL_LIMIT_BYTES, wal_path};
pub use engine::files;
use engine::{backup, checkpoint, columns, in_place, lock, migrations, probe, readers};
pub use in_place::{PAGE_CACHE_KIB, WRITER_SPILL_PAGES};
pub use lock::{LedgerLock, LockError, missing_folder};
pub use migrations::MigrationError;
use migrations::Pending;
pub use probe::{LEDGER_APPLICATION_ID, LedgerProbe};

/// Why the ledger could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("creating the ledger database {} (mode 0600)", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A connection could not be opened or set up; `doing` says which.
    #[error("{doing} {}", path.display())]
    Connect {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: LedgerError,
    },
    #[error("the ledger database {} cannot be put in WAL mode (it stays in {mode:?} mode)", path.display())]
    NotWal { path: PathBuf, mode: String },
    #[error(
        "{} is not a switchboard ledger (it has no migrations table): storage.database names another \
         program's database, an empty file, or a copy that is not whole; nothing was changed in it",
        path.display()
    )]
    NotALedger { path: PathBuf },
    #[error(
        "the ledger database {} cannot be written by this user: the daemon and the ledger \
         commands write to it (and beside it, its -wal and -shm files); make it and its folder writable \
         by the user that runs them, e.g. chmod 600 on the file; nothing was changed",
        path.display()
    )]
    NotWritable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("storage.database names {}, which is a folder: name the ledger's file (in it, say)", path.display())]
    NotAFile { path: PathBuf },
    #[error("applying migrations to {}", path.display())]
    Migrate {
        path: PathBuf,
        #[source]
        source: MigrationError,
    },
}

impl SqliteLedger {
    /// Opens the database, creating it (mode `0600`) if needed, and applies pending
    /// migrations. The daemon's way in.
    pub async fn open(path: &Path, synchronous: Synchronous) -> Result<Self, OpenError> {
        writable(path)?;
        // A file with content is a ledger already, or another program's database, which
        // must not become one (nor have its mode changed).
        if std::fs::metadata(path).is_ok_and(|file| file.len() > 0)
            && !read_tables(path, File::Tables).await?
        {
            return Err(OpenError::NotALedger { path: path.to_owned() });
        }
        files::create_private(path).map_err(|source| OpenError::Create { path: path.to_owned(), source })?;
        tighten_and_warn(path);
        Self::connect(path, synchronous, true, Pending::Apply).await
    }

    /// Opens a database that must already exist. For `switchboard ledger`: a mistyped path
    /// must not become a new, empty ledger. Pending migrations are applied only while no
    /// daemon runs on it (its lock is free, and held meanwhile); beside a running daemon,
    /// a ledger that lacks any is refused, since the daemon, of an earlier release, would
    /// then run on a schema it does not know.
    pub async fn open_existing(path: &Path, synchronous: Synchronous) -> Result<Self, OpenError> {
        // Before anything changes the file (its mode, its journal, its tables): it may be
        // another program's, or one this user may only read, beside which a connection would
        // leave its -wal and -shm files with the file's read-only mode.
        writable(path)?;
        if !read_tables(path, File::MustBeALedger).await? {
            return Err(OpenError::NotALedger { path: path.to_owned() });
        }
        tighten_and_warn(path);
        let no_daemon = LedgerLock::acquire(path).ok();
        let pending = if no_daemon.is_some() { Pending::Apply } else { Pending::Refuse };
        let ledger = Self::connect(path, synchronous, false, pending).await;
        drop(no_daemon);
        ledger
    }

    async fn connect(
        path: &Path,
        synchronous: Synchronous,
        create: bool,
        pending: Pending,
    ) -> Result<Self, OpenError> {
        let connect_error = |doing| move |source| OpenError::Connect { doing, path: path.to_owned(), source };
        // Opening the file, switching it to WAL and migrating it touch the disk and may
        // wait for another process's lock: off the runtime's threads.
        let database = path.to_owned();
        let prepared = tokio::task::spawn_blocking(move || prepare(&database, synchronous, create, pending))
            .await
            .map_err(|e| LedgerError::other(format!("the task preparing the ledger did not finish: {e}")))
            .map_err(connect_error("preparing the ledger database"))??;
        let checkpointer = Arc::new(Checkpointer::new());
        let readers = Arc::new(Readers::new(path));
        let settings = WriterSettings { synchronous, checkpointer: Some(Arc::clone(&checkpointer)) };
        let writer = Writer::open(path, settings)
            .map_err(LedgerError::from)
            .map_err(connect_error("opening for writing the ledger database"))?;
        // Closed only now that the writer is open: the last connection to a database to
        // close checkpoints it and deletes its WAL, and the WAL's file is room that writes
        // reuse (a nearly full disk still takes them) rather than grow into.
        drop(prepared);
        let writes = Arc::new(WriteWatch::default());
        checkpointer
            .start(path, synchronous, Arc::clone(&writes))
            .await
            .map_err(connect_error("opening a checkpointing connection to"))?;
        let probe = Arc::new(LedgerProbe::new(path.to_owned()));
        Ok(Self { writer: Arc::new(writer), readers, checkpointer, writes, probe })
    }
}

#[async_trait]
impl Lifecycle for SqliteLedger {
    fn write_watch(&self) -> Arc<WriteWatch> {
        Arc::clone(&self.writes)
    }

    async fn probe_write(&self) -> Result<(), String> {
        self.probe.check().await
    }

    async fn close(&self) {
        self.checkpointer.stop().await;
        self.readers.close();
    }
}

/// Opens the database at `path` on a connection of its own (creating the file when
/// `create`), puts it in WAL mode and applies the migrations it lacks or refuses it, as
/// `pending` says; the connection is
/// returned, for the caller to close once its own are open. Blocking, and it may wait up
/// to [`BUSY_TIMEOUT`] for another process's lock (SQLite's busy handler is fine here: this
/// runs on a blocking thread).
fn prepare(
    path: &Path,
    synchronous: Synchronous,
    create: bool,
    pending: Pending,
) -> Result<rusqlite::Connection, OpenError> {
    let flags = if create {
        in_place::OWN_CONNECTION_FLAGS.union(OpenFlags::SQLITE_OPEN_CREATE)
    } else {
        in_place::OWN_CONNECTION_FLAGS
    };
    let set_up = |db: &rusqlite::Connection| -> rusqlite::Result<String> {
        db.busy_timeout(BUSY_TIMEOUT)?;
        db.pragma_update(None, "cache_size", in_place::PAGE_CACHE_KIB)?;
        db.pragma_update(None, "foreign_keys", true)?;
        db.pragma_update(None, "synchronous", in_place::synchronous_pragma(synchronous))?;
        db.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
    };
    let connect_error = |doing| {
        move |source: rusqlite::Error| OpenError::Connect {
            doing,
            path: path.to_owned(),
            source: source.into(),
        }
    };
    let db = rusqlite::Connection::open_with_flags(path, flags)
        .map_err(connect_error("opening the ledger database"))?;
    let mode = set_up(&db).map_err(connect_error("setting up the ledger database"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::NotWal { path: path.to_owned(), mode });
    }
    migrations::bring_up_to_date(&db, None, pending)
        .map_err(|source| OpenError::Migrate { path: path.to_owned(), source })?;
    Ok(db)
}

/// Refuses a ledger file that exists but this user cannot write, before any connection
/// opens it. A missing file is for the caller to create or refuse.
fn writable(path: &Path) -> Result<(), OpenError> {
    if path.is_dir() {
        return Err(OpenError::NotAFile { path: path.to_owned() });
    }
    match std::fs::OpenOptions::new().write(true).open(path) {
        Err(source) if source.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(OpenError::NotWritable { path: path.to_owned(), source })
        }
        _ => Ok(()),
    }
}

/// What a ledger file may hold before it is opened for writing.
#[derive(Debug, Clone, Copy)]
enum File {
    /// A ledger (`switchboard ledger` on an existing file).
    MustBeALedger,
    /// A ledger, or no table at all (the daemon's first start on an empty database).
    Tables,
}

/// Whether the file at `path` may be opened as `expected` says, read without writing.
async fn read_tables(path: &Path, expected: File) -> Result<bool, OpenError> {
    let database = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let db = rusqlite::Connection::open_with_flags(&database, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        db.busy_timeout(BUSY_TIMEOUT)?;
        if migrations::records_migrations(&db)? {
            return Ok(true);
        }
        let tables: i64 =
            db.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |row| row.get(0))?;
        Ok(matches!(expected, File::Tables) && tables == 0)
    })
    .await
    .map_err(|e| LedgerError::other(format!("the task reading the ledger's tables did not finish: {e}")))
    .and_then(|read: rusqlite::Result<bool>| read.map_err(LedgerError::from))
    .map_err(|source| OpenError::Connect {
        doing: "reading the tables of",
        path: path.to_owned(),
        source,
    })
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
