//! The ledger's files on disk hold every message text and reply: only their owner may read
//! them. The database is created `0600` before SQLite opens it; SQLite gives the `-wal` and
//! `-shm` files it creates the database file's mode, so they follow. Files that already
//! exist with a looser mode (an older version, a restored backup) are tightened.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Read and write for the owner only.
pub const PRIVATE_MODE: u32 = 0o600;

/// Permission bits for group and others: none of them may be set on a ledger file.
const GROUP_AND_OTHERS: u32 = 0o077;

/// A ledger file whose mode lets someone other than its owner in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LooseFile {
    pub path: PathBuf,
    /// The permission bits it had (`0o777` mask).
    pub mode: u32,
}

/// The database and the two files SQLite keeps beside it in WAL mode.
pub fn database_files(database: &Path) -> [PathBuf; 3] {
    let beside = |suffix: &str| {
        let mut path = database.as_os_str().to_owned();
        path.push(suffix);
        PathBuf::from(path)
    };
    [database.to_path_buf(), beside("-wal"), beside("-shm")]
}

/// The existing ledger files that group or others may access. Changes nothing, so
/// `switchboard check` can report them.
pub fn loose_files(database: &Path) -> io::Result<Vec<LooseFile>> {
    let mut loose = Vec::new();
    for path in database_files(database) {
        let mode = match std::fs::metadata(&path) {
            Ok(metadata) => metadata.permissions().mode() & 0o777,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if mode & GROUP_AND_OTHERS != 0 {
            loose.push(LooseFile { path, mode });
        }
    }
    Ok(loose)
}

/// Makes sure the database file exists, creating it empty (which SQLite takes as a new
/// database) with mode `0600` whatever the umask allows. An existing file is left alone.
pub fn create_private(database: &Path) -> io::Result<()> {
    match OpenOptions::new().write(true).create_new(true).mode(PRIVATE_MODE).open(database) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets every loose ledger file to `0600`; returns the ones it changed, with their old mode.
pub fn tighten(database: &Path) -> io::Result<Vec<LooseFile>> {
    let loose = loose_files(database)?;
    for file in &loose {
        std::fs::set_permissions(&file.path, std::fs::Permissions::from_mode(PRIVATE_MODE))?;
    }
    Ok(loose)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_wal_files_are_named_after_the_database() {
        let [db, wal, shm] = database_files(Path::new("/srv/ledger.db"));
        assert_eq!(
            [db, wal, shm],
            [PathBuf::from("/srv/ledger.db"), "/srv/ledger.db-wal".into(), "/srv/ledger.db-shm".into()]
        );
    }

    #[test]
    fn a_new_database_file_is_private_whatever_the_umask_allows() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        create_private(&database).unwrap();
        assert_eq!(mode(&database), PRIVATE_MODE);
        assert_eq!(std::fs::metadata(&database).unwrap().len(), 0, "empty: SQLite makes it a database");
    }

    #[test]
    fn loose_files_are_reported_and_then_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        let [db, wal, shm] = database_files(&database);
        for (path, bits) in [(&db, 0o644), (&wal, 0o600), (&shm, 0o660)] {
            std::fs::write(path, b"").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(bits)).unwrap();
        }
        let expected =
            vec![LooseFile { path: db.clone(), mode: 0o644 }, LooseFile { path: shm.clone(), mode: 0o660 }];
        assert_eq!(loose_files(&database).unwrap(), expected, "reporting changes nothing");
        assert_eq!(mode(&db), 0o644);

        create_private(&database).unwrap();
        assert_eq!(mode(&db), 0o644, "creating leaves an existing file alone");
        assert_eq!(tighten(&database).unwrap(), expected);
        for path in [&db, &wal, &shm] {
            assert_eq!(mode(path), PRIVATE_MODE, "{}", path.display());
        }
        assert_eq!(loose_files(&database).unwrap(), []);
    }
}
