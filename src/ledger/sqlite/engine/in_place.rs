//! Statements run on the calling thread, on the connections the ledger owns: its writer,
//! which every write of the process goes through (and, while no write holds it, the
//! reads: [`Writer::read_if_idle`]), and its readers (`readers`).
//!
//! A statement runs where it is called, with no hand-over to a database thread and back:
//! such a hand-over costs two thread wake-ups, more than the indexed statements on the
//! path of a message take themselves (docs/performance.md has the figures), and each
//! transaction on that path (a batch's intake, a reply's attempt and outcome) makes five
//! or six statements.
//! All the writes run on [`Writer`] ([`SqliteLedger::write_in_place`]), intake's and the others
//! (handoffs, rooms, reconciliation): one connection writes, so the writers of this process
//! queue on its lock in order and never meet in SQLite's busy handler, and every
//! transaction is written with the same synchronous helpers (`transition_in`, tasks'
//! helpers).
//!
//! A section is synchronous: nothing in it awaits, so a cancelled caller can only go away
//! before it starts or after it ends, never halfway through a transaction.
//!
//! What it costs: the statements of a section run on the runtime's thread. With
//! `synchronous = normal` (the default) a commit writes to the WAL without waiting for
//! the disk, so a section takes tens of microseconds. With `synchronous = full` the
//! commit's fsync happens on that thread too. Waiting for another process's write lock
//! never does: [`SqliteLedger::write_in_place`] asks for the lock without SQLite's busy handler
//! and waits between tries asynchronously.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{OpenFlags, TransactionBehavior, ffi};

use super::checkpoint::{BACKSTOP_PAGES, Checkpointer, WAL_LIMIT_BYTES};
use crate::backoff::Backoff;
use crate::config::Synchronous;
use crate::ledger::sqlite::{BUSY_TIMEOUT, LedgerError, LedgerResult, SqliteLedger};

/// The page cache of each connection of the ledger: a negative `cache_size` is in KiB
/// (SQLite's default is 2 MiB). The pages a message touches are the newest rows' and
/// their indexes' few leaves; a smaller cache keeps the daemon's resident memory down when
/// idle at no cost to the hot path (`cargo bench --bench hot_path`: 2 MiB → 512 KiB took
/// idle RSS from 12.2 to 11.7 MiB, 512 → 256 KiB from 12.3 to 11.8, at the same loop
/// latency).
pub const PAGE_CACHE_KIB: i64 = -256;

/// How many pages a transaction of the writer may dirty before SQLite writes some to the
/// WAL ahead of its commit (`cache_spill`). A full batch of intake dirties more than
/// [`PAGE_CACHE_KIB`] holds; spilled, a page was written ahead, and when the batch
/// touched it again, read back and written again at the commit (3% of intake's CPU).
/// The pages above the cache's size are freed when the commit makes them clean, so idle
/// memory stays that of the cache.
pub const WRITER_SPILL_PAGES: u32 = 1024;

/// The first pause between two tries for a lock another process holds, and the longest.
/// A try costs a few system calls, and happens only while another process holds the lock
/// (`switchboard ledger prune`, `reconcile`), so tries come often: a waiting write gets in
/// soon after the lock is free, even when the holder takes it again after a short gap (a
/// prune pauses between its batches, see `prune_batches::pause_after`).
const FIRST_PAUSE: Duration = Duration::from_millis(1);
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_millis(10);

/// Waiting out a lock another process holds: between tries, asynchronously, never in
/// SQLite's busy handler on the runtime's thread; pauses doubling to [`LONGEST_PAUSE`],
/// for as long as the busy timeout, after which the `SQLITE_BUSY` stands.
pub(crate) struct BusyWait {
    give_up_at: Instant,
    pauses: Backoff,
}

impl BusyWait {
    pub(crate) fn new() -> Self {
        Self { give_up_at: Instant::now() + BUSY_TIMEOUT, pauses: Backoff::new(FIRST_PAUSE, LONGEST_PAUSE) }
    }

    /// Whether to try again after `error`: true, after a pause, when it was a busy lock
    /// and there is time left.
    pub(crate) async fn retry_after(&mut self, error: &rusqlite::Error) -> bool {
        if !is_busy(error) || Instant::now() >= self.give_up_at {
            return false;
        }
        tokio::time::sleep(self.pauses.next_delay()).await;
        true
    }
}

/// A connection of the ledger's own to its (existing, migrated) database: no busy handler
/// (see [`BusyWait`]), the ledger's page cache, its statements kept prepared.
pub(crate) fn open_own_connection(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    set_up_own_connection(rusqlite::Connection::open_with_flags(path, OWN_CONNECTION_FLAGS)?)
}

pub(crate) const OWN_CONNECTION_FLAGS: OpenFlags =
    OpenFlags::SQLITE_OPEN_READ_WRITE.union(OpenFlags::SQLITE_OPEN_NO_MUTEX);

fn set_up_own_connection(db: rusqlite::Connection) -> rusqlite::Result<rusqlite::Connection> {
    db.busy_timeout(Duration::ZERO)?;
    db.pragma_update(None, "cache_size", PAGE_CACHE_KIB)?;
    db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(db)
}

/// The ledger's writer: a connection of its own, which every write
/// transaction of the process runs on, on the calling thread, one at a time (its lock is
/// the process's turn to write).
pub(crate) struct Writer {
    path: PathBuf,
    settings: WriterSettings,
    /// `None` after a failure left the connection unusable: the next turn opens another.
    connection: tokio::sync::Mutex<Option<rusqlite::Connection>>,
}

/// What a writer connection is set up with.
pub(crate) struct WriterSettings {
    pub synchronous: Synchronous,
    /// Rung on every commit, when one runs beside (SQLite's own checkpoint is then only a
    /// backstop, see `checkpoint`).
    pub checkpointer: Option<Arc<Checkpointer>>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Writer {
    /// The writer of the (existing, migrated) database at `path`, opened at once so that
    /// a database it cannot write fails at start-up.
    pub(crate) fn open(path: &Path, settings: WriterSettings) -> rusqlite::Result<Self> {
        let connection = open_writer(path, &settings)?;
        Ok(Self { path: path.to_owned(), settings, connection: tokio::sync::Mutex::new(Some(connection)) })
    }

    /// The database file it writes, and how its commits sync.
    pub(crate) fn file(&self) -> (&Path, Synchronous) {
        (&self.path, self.settings.synchronous)
    }

    /// Runs the read `work` on the writer's connection if no write holds it or waits for
    /// it; `None` (and `work` not run) otherwise. The writer's page cache holds what its
    /// last commits wrote, the newest rows a message's lookups are after, where a reader's
    /// cache is emptied by every commit of another connection and read back with a
    /// `pread` a page (about ten a message on the path of a reply).
    ///
    /// `work` runs in a transaction that is always rolled back, and a read that changed a
    /// row fails as it would on a reader (`SQLITE_READONLY`): nothing a read does stays.
    /// (Not `query_only`, as on a reader: setting a flag pragma expires every statement
    /// the connection keeps prepared, and each would be compiled again.)
    pub(crate) fn read_if_idle<T>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        let mut turn = self.connection.try_lock().ok()?;
        let db = turn.as_mut()?;
        // Dropping `tx` rolls it back, however `work` ends.
        let result = db.transaction_with_behavior(TransactionBehavior::Deferred).and_then(|tx| {
            let changes_before = tx.total_changes();
            let read = work(&tx)?;
            if tx.total_changes() != changes_before {
                return Err(rusqlite::Error::SqliteFailure(
                    ffi::Error::new(ffi::SQLITE_READONLY),
                    Some("a read of the ledger changed rows; rolled back".into()),
                ));
            }
            Ok(read)
        });
        close_if_left_in_a_transaction(&mut turn);
        Some(result)
    }
}

/// After a section on the writer: a rollback SQLite refused leaves the connection inside a
/// transaction, so it is closed (which rolls back) and the next write opens another.
fn close_if_left_in_a_transaction(writer: &mut Option<rusqlite::Connection>) {
    if writer.as_ref().is_some_and(|db| !db.is_autocommit()) {
        *writer = None;
    }
}

/// The writer's connection: an own connection (SQLite's default VFS) with the writer's
/// pragmas, and the checkpointer rung on every commit.
fn open_writer(path: &Path, settings: &WriterSettings) -> rusqlite::Result<rusqlite::Connection> {
    let db = open_own_connection(path)?;
    db.pragma_update(None, "foreign_keys", true)?;
    db.pragma_update(None, "synchronous", synchronous_pragma(settings.synchronous))?;
    db.pragma_update(None, "cache_spill", WRITER_SPILL_PAGES)?;
    if let Some(checkpointer) = &settings.checkpointer {
        db.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)?;
        // When a checkpoint has let the WAL start over, the commit that does cuts its file
        // back to the bound (see `checkpoint`).
        db.pragma_update(None, "journal_size_limit", WAL_LIMIT_BYTES)?;
        let ring = checkpointer.on_commit();
        // The hook answers whether to turn the commit into a rollback: never.
        db.commit_hook(Some(move || {
            ring();
            false
        }))?;
    }
    Ok(db)
}

/// `PRAGMA synchronous`'s value for the setting.
pub(crate) fn synchronous_pragma(synchronous: Synchronous) -> &'static str {
    match synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    }
}

impl SqliteLedger {
    /// Runs `work` as one write transaction on the writer, on this thread: `BEGIN
    /// IMMEDIATE`, `work`, `COMMIT`, with no hand-over to another thread. An error (or a
    /// panic) in `work` rolls it back.
    ///
    /// While another process (`switchboard ledger reconcile`, say) holds the write lock,
    /// the section is not entered: the lock is tried without SQLite's busy handler (which
    /// would sleep on this thread) and tried again after an asynchronous pause, for as long
    /// as the busy timeout, after which the `SQLITE_BUSY` is returned as any statement's
    /// would be.
    pub(crate) async fn write_in_place<T>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> LedgerResult<T> {
        self.run_in_place(work, |_| true).await
    }

    /// [`Self::write_in_place`] for work that checks its premises as it goes (a state it
    /// expects, a row it guards on): `None` rolls back whatever the work wrote before it
    /// found one gone; `Some` commits.
    pub(crate) async fn write_in_place_if<T>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<Option<T>>,
    ) -> LedgerResult<Option<T>> {
        self.run_in_place(work, Option::is_some).await
    }

    /// The transaction of [`Self::write_in_place`]: committed when `commits` says so of
    /// the work's result, rolled back otherwise.
    async fn run_in_place<T>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
        commits: impl FnOnce(&T) -> bool,
    ) -> LedgerResult<T> {
        let mut turn = self.writer.connection.lock().await;
        let mut wait = BusyWait::new();
        let mut work = Some((work, commits));
        loop {
            let db = match turn.as_mut() {
                Some(db) => db,
                None => turn.insert(open_writer(&self.writer.path, &self.writer.settings)?),
            };
            // `Err` here: the write lock was not taken, and nothing ran.
            let ran = match db.transaction_with_behavior(TransactionBehavior::Immediate) {
                Ok(tx) => {
                    let (work, commits) =
                        work.take().expect("the work runs once, after the write lock is taken");
                    // Dropping `tx` without committing rolls it back (rusqlite's default).
                    Ok(work(&tx).and_then(|value| {
                        if commits(&value) { tx.commit().map(|()| value) } else { Ok(value) }
                    }))
                }
                Err(e) => Err(e),
            };
            let result = match ran {
                Ok(result) => result,
                Err(e) if wait.retry_after(&e).await => continue,
                Err(e) => Err(e),
            };
            close_if_left_in_a_transaction(&mut turn);
            return result.map_err(LedgerError::from);
        }
    }

    /// One statement committed on its own, on the writer: how many rows it changed.
    pub(crate) async fn execute_in_place(
        &self,
        sql: &str,
        params: impl rusqlite::Params + Send,
    ) -> LedgerResult<usize> {
        self.write_in_place(|db| execute_cached(db, sql, params)).await
    }
}

/// `Connection::execute`, with the statement kept prepared on the connection: the writer
/// and the readers live as long as the ledger, so each statement is parsed once.
pub(crate) fn execute_cached(
    db: &rusqlite::Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<usize> {
    db.prepare_cached(sql)?.execute(params)
}

/// `Connection::query_row`, with the statement kept prepared (see [`execute_cached`]).
pub(crate) fn query_row_cached<T>(
    db: &rusqlite::Connection,
    sql: &str,
    params: impl rusqlite::Params,
    row: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    db.prepare_cached(sql)?.query_row(params, row)
}

/// Every row of a query, mapped by `row`, with the statement kept prepared (see
/// [`execute_cached`]).
pub(crate) fn query_all_cached<T>(
    db: &rusqlite::Connection,
    sql: &str,
    params: impl rusqlite::Params,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    db.prepare_cached(sql)?.query_map(params, row)?.collect()
}

/// How many prepared statements each connection the ledger owns keeps (rusqlite keeps 16
/// by default): the writer runs every write and, while idle, the reads, about 90
/// statements where rooms, handoffs and tasks are all in use; with fewer, the least
/// recently used of them would be parsed again each time it came back. A statement takes
/// memory only once it has been prepared.
pub(crate) const STATEMENT_CACHE: usize = 128;

/// A text column holding one of the ledger's enums (a state, a kind), by the snake_case
/// name serde gives it.
pub(crate) fn text_enum<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    column: &str,
) -> rusqlite::Result<T> {
    parse_text_enum(row, column, &row.get::<_, String>(column)?)
}

/// [`text_enum`] of a column that may be NULL.
pub(crate) fn optional_text_enum<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    column: &str,
) -> rusqlite::Result<Option<T>> {
    row.get::<_, Option<String>>(column)?.map(|text| parse_text_enum(row, column, &text)).transpose()
}

/// A column that holds JSON or NULL, read strictly into `T`: JSON this switchboard cannot
/// read (a row written by a newer version, say) is an error naming the column, never a
/// default.
pub(crate) fn optional_json<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    column: &str,
) -> rusqlite::Result<Option<T>> {
    let Some(text) = row.get::<_, Option<String>>(column)? else { return Ok(None) };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            row.as_ref().column_index(column).unwrap_or_default(),
            rusqlite::types::Type::Text,
            format!("{column} {text:?}: {e}").into(),
        )
    })
}

fn parse_text_enum<T: serde::de::DeserializeOwned>(
    row: &rusqlite::Row<'_>,
    column: &str,
    text: &str,
) -> rusqlite::Result<T> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text)).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            row.as_ref().column_index(column).unwrap_or_default(),
            rusqlite::types::Type::Text,
            Box::new(e),
        )
    })
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::ledger::LedgerCongestion;

    async fn ledger() -> (tempfile::TempDir, SqliteLedger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
        (dir, ledger)
    }

    fn store_offset(db: &rusqlite::Connection, bot_id: i64) -> rusqlite::Result<usize> {
        db.execute(
            "INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES (?, 1, 'now')",
            [bot_id],
        )
    }

    async fn offsets(ledger: &SqliteLedger) -> Vec<i64> {
        ledger
            .read_in_place(|db| {
                query_all_cached(db, "SELECT bot_id FROM poller_offsets ORDER BY bot_id", [], |row| {
                    row.get(0)
                })
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn work_that_fails_or_finds_a_premise_gone_is_rolled_back_and_the_writer_stays_usable() {
        let (_dir, ledger) = ledger().await;
        let failed = ledger
            .write_in_place(|db| {
                store_offset(db, 1)?;
                Err::<(), _>(rusqlite::Error::QueryReturnedNoRows)
            })
            .await;
        assert!(matches!(failed, Err(LedgerError::Other { .. })), "{failed:?}");
        assert_eq!(offsets(&ledger).await, Vec::<i64>::new());
        ledger.write_in_place(|db| store_offset(db, 2)).await.unwrap();
        // Work that finds a premise gone (`None`) rolls back what it wrote before.
        let kept = ledger.write_in_place_if(|db| store_offset(db, 3).map(|_| None::<()>)).await.unwrap();
        assert_eq!(kept, None);
        assert_eq!(offsets(&ledger).await, vec![2]);
        ledger.write_in_place_if(|db| store_offset(db, 3).map(Some)).await.unwrap();
        assert_eq!(offsets(&ledger).await, vec![2, 3]);
    }

    #[tokio::test]
    async fn a_panic_in_work_rolls_back() {
        let (_dir, ledger) = ledger().await;
        let panicking = ledger.clone();
        let joined = tokio::spawn(async move {
            panicking
                .write_in_place(|db| -> rusqlite::Result<()> {
                    store_offset(db, 1)?;
                    panic!("a bug halfway through a transaction")
                })
                .await
        })
        .await;
        assert!(joined.unwrap_err().is_panic());
        ledger.write_in_place(|db| store_offset(db, 2)).await.unwrap();
        assert_eq!(offsets(&ledger).await, vec![2]);
    }

    /// Waiting for another writer's lock happens between tries, not in SQLite's busy
    /// handler on this (the runtime's only) thread: the runtime keeps running, and the
    /// write goes through once the lock is released.
    #[tokio::test]
    async fn waiting_for_another_writer_leaves_the_runtime_running() {
        let (dir, ledger) = ledger().await;
        let holder = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
        holder.execute_batch("BEGIN EXCLUSIVE").unwrap();

        let writer = ledger.clone();
        let write = tokio::spawn(async move { writer.write_in_place(|db| store_offset(db, 7)).await });
        let mut ticks = 0;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            ticks += 1;
        }
        assert!(!write.is_finished(), "the write waits for the lock");
        holder.execute_batch("ROLLBACK").unwrap();
        drop(holder);
        write.await.unwrap().unwrap();
        assert_eq!(ticks, 20);
        assert_eq!(offsets(&ledger).await, vec![7]);
    }

    #[tokio::test]
    async fn errors_keep_what_sqlite_said() {
        let (_dir, ledger) = ledger().await;
        ledger.write_in_place(|db| store_offset(db, 1)).await.unwrap();
        let duplicate = ledger.write_in_place(|db| store_offset(db, 1)).await.unwrap_err();
        assert!(matches!(duplicate, LedgerError::Constraint { .. }), "a duplicate key: {duplicate:?}");
        assert!(
            duplicate.to_string().contains("UNIQUE constraint failed: poller_offsets.bot_id"),
            "{duplicate}"
        );
        let failure = |code| LedgerError::from(rusqlite::Error::SqliteFailure(ffi::Error::new(code), None));
        assert_eq!(LedgerCongestion::of(&failure(ffi::SQLITE_BUSY)), Some(LedgerCongestion::Busy));
        assert_eq!(LedgerCongestion::of(&failure(ffi::SQLITE_LOCKED)), Some(LedgerCongestion::Busy));
        assert_eq!(LedgerCongestion::of(&failure(ffi::SQLITE_FULL)), Some(LedgerCongestion::DiskFull));
        assert_eq!(LedgerCongestion::of(&failure(ffi::SQLITE_CORRUPT)), None);
    }

    /// What the writer's commits must hold on SQLite's own WAL writer, with the writer's
    /// connection as `open_writer` opens it (its flags, pragmas, `cache_spill`,
    /// `synchronous`), against another connection, a crash and a full file.
    mod durability {
        use std::path::{Path, PathBuf};
        use std::process::Command;

        use rusqlite::Connection;

        use super::super::{WriterSettings, open_writer};
        use crate::config::Synchronous;

        /// The writer's connection to a new WAL database at `path`, with a table of rows
        /// spread over several indexes, as the ledger's are; no automatic checkpoint, so
        /// the commits stay in the WAL for another connection (or a recovered copy) to
        /// read from there.
        fn writer(path: &Path) -> Connection {
            let created = Connection::open(path).unwrap();
            created.pragma_update(None, "journal_mode", "WAL").unwrap();
            created
                .execute_batch(
                    "CREATE TABLE rows (id INTEGER PRIMARY KEY, name TEXT, body BLOB);
                     CREATE INDEX rows_by_name ON rows (name);
                     CREATE INDEX rows_by_body ON rows (substr(body, 1, 16));",
                )
                .unwrap();
            drop(created);
            let settings = WriterSettings { synchronous: Synchronous::Normal, checkpointer: None };
            let db = open_writer(path, &settings).unwrap();
            db.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
            db
        }

        /// A new database in a directory of its own, and [`writer`]'s connection to it.
        fn fresh(name: &str) -> (tempfile::TempDir, PathBuf, Connection) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(name);
            let db = writer(&path);
            (dir, path, db)
        }

        /// A page cache of a few pages, which spills a transaction of more to the WAL
        /// before it ends.
        fn spill_early(db: &Connection) {
            db.pragma_update(None, "cache_size", 4).unwrap();
            db.pragma_update(None, "cache_spill", 4).unwrap();
        }

        /// Another connection, as the readers' and another process's are.
        fn other(path: &Path) -> Connection {
            Connection::open(path).unwrap()
        }

        fn insert(db: &Connection, id: i64, body_bytes: usize) {
            let body: Vec<u8> = (0..body_bytes).map(|i| (i as i64 * 31 + id) as u8).collect();
            db.execute(
                "INSERT INTO rows (id, name, body) VALUES (?1, ?2, ?3)",
                rusqlite::params![id, format!("row {id}"), body],
            )
            .unwrap();
        }

        /// The ids and bodies another connection reads, and whether it finds the file whole.
        fn read_back(path: &Path) -> (Vec<(i64, usize)>, String) {
            let db = other(path);
            let rows = db
                .prepare("SELECT id, length(body) FROM rows ORDER BY id")
                .unwrap()
                .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as usize)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let integrity = db.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
            (rows, integrity)
        }

        #[test]
        fn a_commit_is_in_the_wal_for_another_connection_when_it_returns() {
            let (_dir, path, db) = fresh("one.db");
            insert(&db, 1, 100);
            // A row of 10 KB and its indexes: several pages, each a frame.
            insert(&db, 2, 10_000);
            // Another connection reads it from the WAL while the writer is still open.
            assert_eq!(read_back(&path), (vec![(1, 100), (2, 10_000)], "ok".into()));
        }

        #[test]
        fn a_transaction_rolled_back_after_it_spilled_to_the_wal_leaves_nothing() {
            let (_dir, path, db) = fresh("spilled.db");
            insert(&db, 1, 100);
            spill_early(&db);
            db.execute_batch("BEGIN").unwrap();
            for id in 2..40 {
                insert(&db, id, 3_000);
            }
            db.execute_batch("ROLLBACK").unwrap();
            insert(&db, 40, 100);
            assert_eq!(read_back(&path), (vec![(1, 100), (40, 100)], "ok".into()));
        }

        #[test]
        fn what_a_rolled_back_transaction_spilled_never_overwrites_a_later_commit_of_another_connection() {
            let (_dir, path, db) = fresh("shared.db");
            for id in 1..=8 {
                insert(&db, id, 3_000);
            }
            // The writer spills frames to the WAL and rolls back: they were never committed.
            spill_early(&db);
            db.execute_batch(
                "BEGIN; INSERT INTO rows (id, name, body) VALUES (9, 'row 9', zeroblob(150000)); ROLLBACK;",
            )
            .unwrap();
            // Another connection (another process, say) commits frames where they were.
            let theirs = other(&path);
            theirs.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
            theirs.execute("UPDATE rows SET name = 'theirs'", []).unwrap();
            // The writer's next read and write leave them standing.
            let names: i64 = db
                .query_row("SELECT count(*) FROM rows WHERE name = 'theirs'", [], |row| row.get(0))
                .unwrap();
            insert(&db, 20, 100);
            let (rows, integrity) = read_back(&path);
            assert_eq!(integrity, "ok");
            assert_eq!(rows.len(), 9);
            assert_eq!(names, 8, "the writer reads the other's commit");
            let names: i64 = other(&path)
                .query_row("SELECT count(*) FROM rows WHERE name = 'theirs'", [], |row| row.get(0))
                .unwrap();
            assert_eq!(names, 8, "the other connection's commit stands");
        }

        /// A copy of the database and its WAL as a crash would leave them now (no
        /// wal-index), opened and so recovered from the WAL by another connection.
        fn recovered_copy(dir: &Path, name: &str) -> (Vec<(i64, usize)>, String) {
            let copy = dir.join("copy");
            std::fs::create_dir_all(&copy).unwrap();
            std::fs::copy(dir.join(name), copy.join(name)).unwrap();
            std::fs::copy(dir.join(format!("{name}-wal")), copy.join(format!("{name}-wal"))).unwrap();
            read_back(&copy.join(name))
        }

        #[test]
        fn a_transaction_that_wrote_a_page_twice_commits_whole_and_survives_recovery() {
            let (dir, path, db) = fresh("twice.db");
            insert(&db, 1, 100);
            // The transaction spills its pages to the WAL, the update writes spilled pages
            // again, in place, and the commit recomputes the frames' checksums.
            spill_early(&db);
            db.execute_batch("BEGIN").unwrap();
            for id in 2..30 {
                insert(&db, id, 2_000);
            }
            db.execute("UPDATE rows SET name = 'again'", []).unwrap();
            db.execute_batch("COMMIT").unwrap();
            let expected: Vec<(i64, usize)> =
                std::iter::once((1, 100)).chain((2..30).map(|id| (id, 2_000))).collect();
            assert_eq!(read_back(&path), (expected.clone(), "ok".into()));
            assert_eq!(recovered_copy(dir.path(), "twice.db"), (expected, "ok".into()));
        }

        /// Set in the child process of the test below, which runs with a limit on file sizes.
        const FULL_FILE_CHILD: &str = "SB_WRITER_FULL_FILE_DIR";

        #[test]
        fn a_write_that_fails_fails_its_commit_and_leaves_the_database_whole() {
            if let Some(dir) = std::env::var_os(FULL_FILE_CHILD) {
                return fail_a_commit_in(Path::new(&dir));
            }
            // A limit on file sizes holds for the whole process: it runs in a process of its
            // own (this test binary, running only this test). Beyond the limit a write fails
            // with EFBIG (as a full disk fails one with ENOSPC) instead of SIGXFSZ killing
            // the process: the shell ignores the signal, and an ignored signal stays
            // ignored across `exec`.
            let test = concat!(
                module_path!(),
                "::a_write_that_fails_fails_its_commit_and_leaves_the_database_whole"
            );
            let test = test.split_once("::").map_or(test, |(_crate, path)| path);
            let dir = tempfile::tempdir().unwrap();
            let output = Command::new("sh")
                .args(["-c", r#"trap "" XFSZ; exec "$0" "$@""#])
                .arg(std::env::current_exe().unwrap())
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env(FULL_FILE_CHILD, dir.path())
                .output()
                .unwrap();
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(output.status.success(), "{log}");
            assert!(log.contains("1 passed"), "the child ran the test: {log}");
            // What the failed commit left, read by another process: the rows committed
            // before and after it, a whole file.
            assert_eq!(read_back(&dir.path().join("full.db")), (vec![(1, 100), (3, 100)], "ok".into()));
        }

        fn fail_a_commit_in(dir: &Path) {
            use nix::sys::resource::{Resource, getrlimit, setrlimit};

            let path = dir.join("full.db");
            let db = writer(&path);
            insert(&db, 1, 100);
            let (_, hard) = getrlimit(Resource::RLIMIT_FSIZE).unwrap();
            let wal_size = std::fs::metadata(dir.join("full.db-wal")).unwrap().len();
            setrlimit(Resource::RLIMIT_FSIZE, wal_size + 2_000, hard).unwrap();

            let failed =
                db.execute("INSERT INTO rows (id, name, body) VALUES (2, 'row 2', zeroblob(20000))", []);
            assert!(failed.is_err(), "a commit that could not be written succeeded: {failed:?}");

            setrlimit(Resource::RLIMIT_FSIZE, hard, hard).unwrap();
            insert(&db, 3, 100);
            let count: i64 = db.query_row("SELECT count(*) FROM rows", [], |row| row.get(0)).unwrap();
            assert_eq!(count, 2, "the failed row is not there");
        }
    }
}
