//! One daemon per ledger. `switchboard run` takes an exclusive advisory lock on a file
//! beside the database before it opens the ledger, so a second daemon on the same ledger
//! stops before its start-up recovery could mistake the first one's in-flight sends for
//! interrupted ones. The `switchboard ledger` commands do not keep it: they are meant to
//! run beside the daemon, and SQLite serialises their writes. They take it only while they
//! open the ledger, to learn whether a daemon runs (a migration waits until none does),
//! so a daemon starting in that moment finds it held by the command.
//!
//! The lock is `flock(2)` through `std::fs::File::try_lock`: the kernel releases it when
//! the process dies, `kill -9` included, so a crash never leaves a stale lock behind. The
//! file itself stays (removing it could let two daemons lock two different files of the
//! same name); it holds the pid of the last daemon that locked it, for the error message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::files::PRIVATE_MODE;

/// What a second daemon is told, and what an operator needs to act on it. The holder may
/// be a `switchboard ledger` command opening the ledger, not only a daemon: the pid is of
/// whichever took the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "a switchboard daemon or `switchboard ledger` command{} holds the ledger lock {}: only one \
         daemon may use a ledger; stop that daemon first (a ledger command lets go as soon as it has \
         opened the ledger: start again), or give this one its own storage.database",
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
        path.display()
    )]
    Held { path: PathBuf, holder: Option<u32> },
    #[error("cannot take the ledger lock {}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "storage.database: the folder {} does not exist; create it (the daemon creates the ledger \
         in it, not the folder)",
        folder.display()
    )]
    NoFolder { folder: PathBuf },
}

/// Held for the daemon's whole life; dropping it (or the process dying) releases the lock.
#[derive(Debug)]
pub struct LedgerLock {
    /// The locked file: the lock lives as long as this open file.
    file: File,
    path: PathBuf,
}

/// The folder a ledger file would be in, when it does not exist (a typo in the path, or a
/// volume not mounted).
pub fn missing_folder(database: &Path) -> Option<PathBuf> {
    let folder = database.parent().filter(|folder| !folder.as_os_str().is_empty())?;
    (!folder.is_dir()).then(|| folder.to_owned())
}

impl LedgerLock {
    /// The lock file of a database: `<database>.lock`, beside it.
    pub fn path_for(database: &Path) -> PathBuf {
        let mut path = database.as_os_str().to_owned();
        path.push(".lock");
        PathBuf::from(path)
    }

    /// Takes the lock without waiting: a daemon that already holds it is refused at once,
    /// naming the lock file and the holder's pid when it is known. Touches nothing but the
    /// lock file, and writes to it only once the lock is ours.
    pub fn acquire(database: &Path) -> Result<Self, LockError> {
        if let Some(folder) = missing_folder(database) {
            return Err(LockError::NoFolder { folder });
        }
        let path = Self::path_for(database);
        let io = |source| LockError::Io { path: path.clone(), source };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(PRIVATE_MODE)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held { holder: read_pid(&mut file), path });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid the holder wrote, if it has written it yet.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

impl Drop for LedgerLock {
    fn drop(&mut self) {
        // Closing the file releases the lock anyway; unlocking first says so explicitly.
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_lock_file_sits_beside_the_database() {
        assert_eq!(
            LedgerLock::path_for(Path::new("/var/lib/sb/ledger.db")),
            Path::new("/var/lib/sb/ledger.db.lock")
        );
        assert_eq!(LedgerLock::path_for(Path::new("switchboard.db")), Path::new("switchboard.db.lock"));
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_file_and_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        let first = LedgerLock::acquire(&database).unwrap();
        let mode = std::fs::metadata(first.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, PRIVATE_MODE, "{mode:o}");

        // flock locks belong to the open file, so a second open in this process conflicts
        // exactly as a second process would.
        let error = LedgerLock::acquire(&database).unwrap_err();
        assert!(
            matches!(&error, LockError::Held { holder: Some(pid), .. } if *pid == std::process::id()),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("ledger.db.lock") && message.contains("storage.database"), "{message}");
        // The holder may be a `ledger` command as well as a daemon: the message says either.
        assert!(message.contains("`switchboard ledger` command"), "{message}");
        assert!(message.contains(&format!("(pid {})", std::process::id())), "{message}");

        drop(first);
        let again = LedgerLock::acquire(&database).unwrap();
        assert_eq!(std::fs::read_to_string(again.path()).unwrap().trim(), std::process::id().to_string());
    }

    #[test]
    fn a_lock_in_a_missing_directory_names_the_folder_and_the_key() {
        let error = LedgerLock::acquire(Path::new("/nonexistent-switchboard-dir/ledger.db")).unwrap_err();
        assert!(matches!(error, LockError::NoFolder { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("/nonexistent-switchboard-dir ") && message.contains("storage.database"),
            "{message}"
        );
    }
}
