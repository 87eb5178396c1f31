//! The ledger's schema: the SQL files in `migrations/`, applied in order when the ledger
//! opens, each once.
//!
//! A runner of our own, of a few dozen lines, rather than a crate: what is applied is
//! recorded in the table sqlx's migrator kept (`_sqlx_migrations`), row for row as sqlx
//! wrote it (version, description, success, the SHA-384 of the SQL, execution time). Every
//! ledger in the field was migrated by sqlx, so it opens as it is, with nothing to convert
//! and nothing run twice, and a release from before this one can still open a ledger this
//! one migrated. The crates for rusqlite keep their own record (`rusqlite_migration`
//! counts in `PRAGMA user_version`, with no checksum), which every existing ledger would
//! have to be converted to, and they do not run a migration outside a transaction, which
//! `0002_intake.sql` needs (`-- no-transaction`, as sqlx spells it).
//!
//! What sqlx refused is refused here, with the same reasons: a migration recorded as
//! failed, a migration this switchboard does not know (a newer release migrated the
//! ledger), and a migration whose SQL differs from what was applied (a shipped file was
//! edited).

use std::time::Instant;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use sha2::{Digest, Sha384};

use crate::ledger::sqlite::LedgerError;

/// The table that records the migrations applied, sqlx's name and layout (see the module
/// documentation).
const APPLIED_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
)";

/// How a migration that manages its own transaction begins (sqlx's directive).
const NO_TRANSACTION: &str = "-- no-transaction";

/// One file of `migrations/`.
pub(crate) struct Migration {
    pub version: i64,
    /// `NNNN_what_it_does.sql`.
    pub file: &'static str,
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $file:literal) => {
        Migration {
            version: $version,
            file: $file,
            sql: include_str!(concat!("../../../../migrations/", $file)),
        }
    };
}

/// Every migration, in order. A new file in `migrations/` is added here too
/// (`tests::every_file_is_listed_once` fails until it is).
pub(crate) const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_ledger.sql"),
    migration!(2, "0002_intake.sql"),
    migration!(3, "0003_replies.sql"),
    migration!(4, "0004_handoffs.sql"),
    migration!(5, "0005_rooms.sql"),
    migration!(6, "0006_tasks.sql"),
    migration!(7, "0007_shown_in_memory.sql"),
    migration!(8, "0008_checks_without_in_lists.sql"),
    migration!(9, "0009_ids_without_autoincrement.sql"),
    migration!(10, "0010_cascade_versions.sql"),
    migration!(11, "0011_prune_indexes.sql"),
    migration!(12, "0012_reply_lookup.sql"),
    migration!(13, "0013_attempt_methods.sql"),
    migration!(14, "0014_permission_requests.sql"),
    migration!(15, "0015_revision_requests.sql"),
    migration!(16, "0016_album_items.sql"),
    migration!(17, "0017_verdicts_handed.sql"),
    migration!(18, "0018_session_plugins.sql"),
    migration!(19, "0019_reaction_prune_index.sql"),
];

impl Migration {
    /// What the file's name says after its version, as sqlx recorded it:
    /// `0002_intake.sql` is "intake", `0007_shown_in_memory.sql` "shown in memory".
    pub fn description(&self) -> String {
        let name = self.file.split_once('_').map_or(self.file, |(_version, name)| name);
        name.trim_end_matches(".sql").replace('_', " ")
    }

    /// The SHA-384 of its SQL, as sqlx recorded it.
    pub fn checksum(&self) -> Vec<u8> {
        Sha384::digest(self.sql.as_bytes()).to_vec()
    }

    fn manages_its_own_transaction(&self) -> bool {
        self.sql.starts_with(NO_TRANSACTION)
    }
}

/// Why the ledger's schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error(
        "migration {version} is recorded as failed in this ledger (`_sqlx_migrations`): \
         restore the ledger from a backup, or repair it by hand, before opening it"
    )]
    Dirty { version: i64 },
    #[error(
        "this ledger has migration {version}, which this switchboard does not know: a newer \
         release migrated it; run that release (or a later one) on it"
    )]
    Unknown { version: i64 },
    #[error(
        "migration {version} ({file}) is not the one this ledger applied (its checksum differs): \
         a migration that has shipped must never be edited"
    )]
    Changed { version: i64, file: &'static str },
    #[error("applying migration {version} ({file})")]
    Failed {
        version: i64,
        file: &'static str,
        #[source]
        source: LedgerError,
    },
    #[error(
        "this ledger lacks migration {version} ({file}) and a daemon holds it (its lock is taken): a \
         daemon of an earlier release would be left on a schema it does not know. Run `switchboard \
         ledger` of the daemon's release, or stop the daemon first (an upgraded daemon migrates the \
         ledger as it starts)"
    )]
    Behind { version: i64, file: &'static str },
    #[error("reading which migrations this ledger has")]
    Ledger(#[from] LedgerError),
}

/// What opening a ledger does with the migrations it lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Applies them: nothing else runs on the ledger.
    Apply,
    /// Refuses the ledger if it lacks any: a daemon of an earlier release runs on it, and
    /// a newer schema would break it (and its restart, and a rollback).
    Refuse,
}

/// Whether `db` has the table that records migrations: every ledger has it from its first
/// opening, and another program's database does not.
pub(crate) fn records_migrations(db: &Connection) -> rusqlite::Result<bool> {
    db.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations')",
        [],
        |row| row.get(0),
    )
}

/// Applies, in order, every migration up to `up_to` (all when `None`) that `db` has not
/// had yet. Blocking: the caller runs it off the runtime's threads.
#[cfg(test)]
pub(crate) fn migrate(db: &Connection, up_to: Option<i64>) -> Result<(), MigrationError> {
    bring_up_to_date(db, up_to, Pending::Apply)
}

/// [`migrate`], doing with the migrations `db` lacks what `pending` says.
pub(crate) fn bring_up_to_date(
    db: &Connection,
    up_to: Option<i64>,
    pending: Pending,
) -> Result<(), MigrationError> {
    db.execute_batch(APPLIED_TABLE).map_err(LedgerError::from)?;
    let dirty: Option<i64> = db
        .query_row(
            "SELECT version FROM _sqlx_migrations WHERE success = false ORDER BY version LIMIT 1",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(LedgerError::from)?;
    if let Some(version) = dirty {
        return Err(MigrationError::Dirty { version });
    }
    let applied: Vec<(i64, Vec<u8>)> = db
        .prepare("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
        .and_then(|mut select| select.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?.collect())
        .map_err(LedgerError::from)?;
    if let Some(&(version, _)) =
        applied.iter().find(|(version, _)| !MIGRATIONS.iter().any(|known| known.version == *version))
    {
        return Err(MigrationError::Unknown { version });
    }
    for migration in MIGRATIONS.iter().filter(|m| up_to.is_none_or(|up_to| m.version <= up_to)) {
        match applied.iter().find(|(version, _)| *version == migration.version) {
            Some((_, checksum)) if *checksum == migration.checksum() => {}
            Some(_) => {
                return Err(MigrationError::Changed { version: migration.version, file: migration.file });
            }
            None if pending == Pending::Refuse => {
                return Err(MigrationError::Behind { version: migration.version, file: migration.file });
            }
            None => apply(db, migration).map_err(|source| MigrationError::Failed {
                version: migration.version,
                file: migration.file,
                source,
            })?,
        }
    }
    Ok(())
}

/// Runs one migration and records it, in one transaction unless it manages its own; then
/// how long it took, as sqlx did.
fn apply(db: &Connection, migration: &Migration) -> Result<(), LedgerError> {
    let started = Instant::now();
    let record = |db: &Connection| {
        db.execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (?1, ?2, TRUE, ?3, -1)",
            rusqlite::params![migration.version, migration.description(), migration.checksum()],
        )
    };
    if migration.manages_its_own_transaction() {
        db.execute_batch(migration.sql)?;
        record(db)?;
    } else {
        let tx = rusqlite::Transaction::new_unchecked(db, TransactionBehavior::Immediate)?;
        tx.execute_batch(migration.sql)?;
        record(&tx)?;
        tx.commit()?;
    }
    let nanos = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    db.execute(
        "UPDATE _sqlx_migrations SET execution_time = ?1 WHERE version = ?2",
        rusqlite::params![nanos, migration.version],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list above and the files in `migrations/` are the same migrations, in order.
    #[test]
    fn every_file_is_listed_once() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        files.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|m| m.file).collect();
        assert_eq!(files, listed, "every file of migrations/ is in MIGRATIONS, in order");
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, index as i64 + 1, "{}", migration.file);
            let version: i64 = migration.file.split_once('_').unwrap().0.parse().unwrap();
            assert_eq!(version, migration.version, "{}", migration.file);
        }
    }

    #[test]
    fn descriptions_and_checksums_are_sqlxs() {
        let shown = &MIGRATIONS[6];
        assert_eq!(shown.description(), "shown in memory");
        assert_eq!(MIGRATIONS[0].description(), "ledger");
        // sqlx's checksum is the SHA-384 of the file's text: 48 bytes.
        assert_eq!(shown.checksum().len(), 48);
        assert_eq!(
            hex::encode(Migration { version: 0, file: "0_x.sql", sql: "" }.checksum()),
            "38b060a751ac96384cd9327eb1b1e36a21fdb71114be07434c0cc7bf63f6e1da274edebfe76f65fbd51ad2f14898b95b"
        );
        assert!(MIGRATIONS[1].manages_its_own_transaction());
        assert!(!MIGRATIONS[0].manages_its_own_transaction());
    }
}
