//! `switchboard ledger backup`: a copy of the ledger taken while the daemon runs.
//!
//! A copy of the database file alone can miss the commits still in the WAL, or catch the
//! file halfway through a copy back. `VACUUM INTO` reads one consistent snapshot, WAL
//! included, as any reader does, so the daemon keeps writing meanwhile; and it writes the
//! copy compacted, free pages left out. (SQLite's online backup API would start over each
//! time the daemon commits, and under a steady load might never finish.)
//!
//! The copy is made under a staging name beside the target (locked while it is written)
//! and takes the target's name only once it is whole: synced (`VACUUM INTO` does not sync
//! what it writes), checked (`quick_check`, and that it holds a ledger's tables), mode
//! `0600` from its creation, like the ledger itself. So a backup cut short (a full disk,
//! `kill -9`, a power loss) leaves no file a restore could mistake for a backup: at most
//! the staging file, which the next backup removes.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::files::PRIVATE_MODE;
use crate::ledger::sqlite::LedgerError;

const READ_ONLY: OpenFlags = OpenFlags::SQLITE_OPEN_READ_ONLY.union(OpenFlags::SQLITE_OPEN_NO_MUTEX);

/// What a finished backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    /// The envelopes in the copy, as `switchboard ledger stats` counts them.
    pub envelopes: u64,
    /// The copy's size on disk.
    pub bytes: u64,
    pub took: Duration,
}

/// Why no backup was made. In every case the target's name is left as it was: absent,
/// or the file that was there.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{} already exists; remove it or back up to another name", .0.display())]
    TargetExists(PathBuf),
    #[error("another backup to {} is running", .0.display())]
    Running(PathBuf),
    #[error("preparing the copy {}", path.display())]
    Staging {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The directory the copy was to go to.
    #[error("the disk holding {} is full: the copy did not fit, and was removed", .0.display())]
    DiskFull(PathBuf),
    #[error("copying the ledger {} into {}", from.display(), to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: LedgerError,
    },
    #[error("the copy {} is not a whole ledger ({detail}); it was removed", path.display())]
    Unsound { path: PathBuf, detail: String },
}

/// Copies the ledger at `database` into a new file `target`, which must not exist yet.
/// Blocking: it reads the whole ledger.
pub fn back_up(database: &Path, target: &Path) -> Result<Backup, BackupError> {
    let started = Instant::now();
    if target.try_exists().map_err(|source| BackupError::Staging { path: target.to_owned(), source })? {
        return Err(BackupError::TargetExists(target.to_owned()));
    }
    let staging = Staging::claim(target)?;
    let outcome = copy_into(database, &staging).and_then(|envelopes| {
        staging.finish_as(target)?;
        Ok(envelopes)
    });
    let envelopes = match outcome {
        Ok(envelopes) => envelopes,
        Err(error) => {
            // Whatever was written is not a backup; a file already gone is fine.
            let _ = std::fs::remove_file(&staging.path);
            return Err(error);
        }
    };
    let bytes = std::fs::metadata(target).map(|m| m.len()).unwrap_or_default();
    Ok(Backup { envelopes, bytes, took: started.elapsed() })
}

/// Where a backup to `target` is written until it is whole: `<target>.partial`, in the
/// same directory, so that the link that finishes it is atomic.
pub fn staging_path(target: &Path) -> PathBuf {
    let mut name = OsString::from(target.as_os_str());
    name.push(".partial");
    PathBuf::from(name)
}

/// The staging file of one backup, created empty and private (which `VACUUM INTO`
/// accepts, keeping the mode), and locked (`flock`) for as long as the backup runs: a
/// second backup to the same name at the same time must not remove or finish this one's
/// half-written copy. SQLite's own locks on the file are of another kind (`fcntl`), and
/// closing its descriptor does not release this one.
struct Staging {
    path: PathBuf,
    /// Open, and locked, for as long as the backup runs.
    file: File,
}

impl Staging {
    /// A staging file left by a backup cut short is not locked, and is replaced.
    fn claim(target: &Path) -> Result<Self, BackupError> {
        let path = staging_path(target);
        let staging_error = |source| BackupError::Staging { path: path.clone(), source };
        let running = || BackupError::Running(target.to_owned());
        // Each turn either claims the file or removes a stale one; only another backup
        // racing this one for the name makes it take a second turn.
        for _ in 0..3 {
            match OpenOptions::new().write(true).create_new(true).mode(PRIVATE_MODE).open(&path) {
                Ok(file) => {
                    return match file.try_lock() {
                        Ok(()) => Ok(Self { path, file }),
                        Err(TryLockError::WouldBlock) => Err(running()),
                        Err(TryLockError::Error(e)) => Err(staging_error(e)),
                    };
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(staging_error(e)),
            }
            let left = match File::open(&path) {
                Ok(left) => left,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(staging_error(e)),
            };
            match left.try_lock() {
                Ok(()) => match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(staging_error(e)),
                },
                Err(TryLockError::WouldBlock) => return Err(running()),
                Err(TryLockError::Error(e)) => return Err(staging_error(e)),
            }
        }
        Err(running())
    }

    /// Gives the whole copy the target's name: a hard link, which fails rather than
    /// replace a file that took the name meanwhile, then the staging name removed.
    fn finish_as(&self, target: &Path) -> Result<(), BackupError> {
        match std::fs::hard_link(&self.path, target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(BackupError::TargetExists(target.to_owned()));
            }
            Err(source) => return Err(BackupError::Staging { path: target.to_owned(), source }),
        }
        std::fs::remove_file(&self.path)
            .and_then(|()| sync_directory_of(target))
            .map_err(|source| BackupError::Staging { path: self.path.clone(), source })
    }
}

/// Writes the copy into the empty staging file, syncs and checks it; returns the envelopes
/// it holds.
fn copy_into(database: &Path, staging: &Staging) -> Result<u64, BackupError> {
    let (file, staging) = (&staging.file, staging.path.as_path());
    let staging_error = |source| BackupError::Staging { path: staging.to_owned(), source };
    let copy_error = |source: rusqlite::Error| match LedgerError::from(source) {
        LedgerError::DiskFull { .. } => BackupError::DiskFull(directory_of(staging).to_owned()),
        source => BackupError::Copy { from: database.to_owned(), to: staging.to_owned(), source },
    };
    // A reader, which never waits for the daemon's writer, and cannot write the ledger.
    // (`query_only` would refuse the copy's own writes too.)
    let source = Connection::open_with_flags(database, READ_ONLY).map_err(copy_error)?;
    let staging_text = staging.to_str().ok_or_else(|| {
        staging_error(io::Error::new(io::ErrorKind::InvalidInput, "the path is not valid UTF-8"))
    })?;
    source.execute("VACUUM INTO ?1", [staging_text]).map_err(copy_error)?;
    drop(source);

    // SQLite wrote through a descriptor of its own; a sync of the file by this one covers it.
    file.sync_all().map_err(staging_error)?;
    check(staging)
}

/// Whether the file at `path` is a whole ledger; its envelopes if so.
fn check(path: &Path) -> Result<u64, BackupError> {
    let unsound = |detail: String| BackupError::Unsound { path: path.to_owned(), detail };
    let copy = Connection::open_with_flags(path, READ_ONLY).map_err(|e| unsound(e.to_string()))?;
    let verdict: String =
        copy.query_row("PRAGMA quick_check", [], |row| row.get(0)).map_err(|e| unsound(e.to_string()))?;
    if verdict != "ok" {
        return Err(unsound(format!("quick_check: {verdict}")));
    }
    // A ledger records the migrations applied to it: a copy of another database has none.
    let migrations: i64 = copy
        .query_row("SELECT count(*) FROM _sqlx_migrations WHERE success", [], |row| row.get(0))
        .map_err(|e| unsound(format!("no record of a ledger's migrations: {e}")))?;
    if migrations == 0 {
        return Err(unsound("no migration of a ledger applied".to_owned()));
    }
    let envelopes: i64 = copy
        .query_row("SELECT count(*) FROM envelopes", [], |row| row.get(0))
        .map_err(|e| unsound(e.to_string()))?;
    Ok(envelopes.unsigned_abs())
}

/// Makes a new name of a file in this directory (the backup's link) survive a power loss.
fn sync_directory_of(path: &Path) -> io::Result<()> {
    File::open(directory_of(path))?.sync_all()
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::Synchronous;
    use crate::ledger::sqlite::SqliteLedger;

    async fn ledger_in(dir: &Path) -> PathBuf {
        let database = dir.join("ledger.db");
        let ledger = SqliteLedger::open(&database, Synchronous::Normal).await.unwrap();
        drop(ledger);
        database
    }

    #[tokio::test]
    async fn a_backup_is_a_whole_private_ledger_and_leaves_no_staging_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let database = ledger_in(dir.path()).await;
        let target = dir.path().join("copy.db");
        let backup = back_up(&database, &target).unwrap();
        assert_eq!(backup.envelopes, 0);
        assert!(backup.bytes > 0);
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, PRIVATE_MODE);
        assert!(!staging_path(&target).exists());
        assert_eq!(check(&target).unwrap(), 0);
    }

    #[tokio::test]
    async fn an_existing_target_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let database = ledger_in(dir.path()).await;
        let target = dir.path().join("copy.db");
        std::fs::write(&target, b"yesterday's backup").unwrap();
        assert!(matches!(back_up(&database, &target), Err(BackupError::TargetExists(_))));
        assert_eq!(std::fs::read(&target).unwrap(), b"yesterday's backup");
    }

    #[tokio::test]
    async fn a_staging_file_left_by_a_backup_cut_short_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let database = ledger_in(dir.path()).await;
        let target = dir.path().join("copy.db");
        std::fs::write(staging_path(&target), b"half a copy").unwrap();
        back_up(&database, &target).unwrap();
        assert_eq!(check(&target).unwrap(), 0);
        assert!(!staging_path(&target).exists());
    }

    #[tokio::test]
    async fn a_backup_running_to_the_same_name_is_left_to_finish() {
        let dir = tempfile::tempdir().unwrap();
        let database = ledger_in(dir.path()).await;
        let target = dir.path().join("copy.db");
        let running = Staging::claim(&target).unwrap();
        let error = back_up(&database, &target).unwrap_err();
        assert!(matches!(error, BackupError::Running(_)), "{error}");
        assert!(running.path.exists() && !target.exists());
        // Once it is over (here: cut short), its file is a stale one, and replaced.
        drop(running);
        back_up(&database, &target).unwrap();
        assert_eq!(check(&target).unwrap(), 0);
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_ledger_is_not_taken_for_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other.db");
        Connection::open(&other).unwrap().execute_batch("CREATE TABLE envelopes (id INTEGER)").unwrap();
        let target = dir.path().join("copy.db");
        let error = back_up(&other, &target).unwrap_err();
        assert!(matches!(error, BackupError::Unsound { .. }), "{error}");
        assert!(!target.exists() && !staging_path(&target).exists());
    }

    #[tokio::test]
    async fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let database = ledger_in(dir.path()).await;
        let target = dir.path().join("no-such-dir").join("copy.db");
        let error = back_up(&database, &target).unwrap_err();
        assert!(error.to_string().contains("no-such-dir"), "{error}");
    }
}
