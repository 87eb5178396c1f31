//! SQLite's result codes, read here and nowhere else, as the [`LedgerError`] callers decide on.

use crate::ledger::{ErrorSource, LedgerError};

impl From<rusqlite::Error> for LedgerError {
    fn from(error: rusqlite::Error) -> Self {
        // The primary code (the low byte of the extended one) is what classifies:
        // https://www.sqlite.org/rescode.html
        let code = error.sqlite_error_code();
        // What SQLite said, for people, and the error underneath: for a failure, its code.
        let (detail, source): (String, ErrorSource) = match error {
            rusqlite::Error::SqliteFailure(code, message) => {
                (message.unwrap_or_else(|| code.to_string()), Box::new(code))
            }
            // A statement SQLite could not prepare: its text (all of a migration's file,
            // say) is left out; what SQLite said and where stays.
            rusqlite::Error::SqlInputError { error, msg, offset, .. } => {
                (format!("{msg} (at byte {offset} of the statement)"), Box::new(error))
            }
            other => (other.to_string(), Box::new(other)),
        };
        match code {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Self::Busy { detail, source }
            }
            Some(rusqlite::ErrorCode::DiskFull) => Self::DiskFull { detail, source },
            Some(rusqlite::ErrorCode::ConstraintViolation) => Self::Constraint { detail, source },
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                Self::Corrupt { detail, source }
            }
            _ => Self::Other { message: format!("the ledger failed: {detail}"), source: Some(source) },
        }
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::ffi;

    use super::*;

    fn failure(code: i32) -> LedgerError {
        LedgerError::from(rusqlite::Error::SqliteFailure(ffi::Error::new(code), None))
    }

    #[test]
    fn sqlite_codes_map_to_what_callers_decide_on() {
        assert!(matches!(failure(ffi::SQLITE_BUSY), LedgerError::Busy { .. }));
        assert!(matches!(failure(ffi::SQLITE_BUSY_SNAPSHOT), LedgerError::Busy { .. }));
        assert!(matches!(failure(ffi::SQLITE_LOCKED), LedgerError::Busy { .. }));
        assert!(matches!(failure(ffi::SQLITE_FULL), LedgerError::DiskFull { .. }));
        assert!(matches!(failure(ffi::SQLITE_CONSTRAINT_PRIMARYKEY), LedgerError::Constraint { .. }));
        assert!(matches!(failure(ffi::SQLITE_CONSTRAINT_CHECK), LedgerError::Constraint { .. }));
        assert!(matches!(failure(ffi::SQLITE_CONSTRAINT_FOREIGNKEY), LedgerError::Constraint { .. }));
        assert!(matches!(failure(ffi::SQLITE_CORRUPT), LedgerError::Corrupt { .. }));
        assert!(matches!(failure(ffi::SQLITE_NOTADB), LedgerError::Corrupt { .. }));
        assert!(matches!(failure(ffi::SQLITE_IOERR_WRITE), LedgerError::Other { .. }));
        assert!(matches!(failure(ffi::SQLITE_READONLY), LedgerError::Other { .. }));
        assert!(matches!(
            LedgerError::from(rusqlite::Error::QueryReturnedNoRows),
            LedgerError::Other { source: Some(_), .. }
        ));
        let db = rusqlite::Connection::open_in_memory().unwrap();
        let unprepared =
            LedgerError::from(db.execute_batch("CREATE TABLE t (x); CREATE TABLE t (x);").unwrap_err());
        let message = unprepared.to_string();
        assert!(message.contains("table t already exists"), "{message}");
        assert!(!message.contains("CREATE TABLE"), "the statement's text is left out: {message}");
    }

    /// What people read keeps SQLite's words beside the meaning.
    #[test]
    fn the_message_says_what_happened_and_keeps_sqlites_words() {
        let busy = failure(ffi::SQLITE_BUSY).to_string();
        assert!(busy.starts_with("the ledger is locked by another connection"), "{busy}");
        assert!(busy.contains("database is locked"), "{busy}");
        let full = failure(ffi::SQLITE_FULL).to_string();
        assert!(full.contains("disk holding the ledger is full"), "{full}");
        let source = std::error::Error::source(&failure(ffi::SQLITE_FULL)).map(ToString::to_string);
        assert!(source.is_some_and(|s| s.contains("database or disk is full")));
    }
}
