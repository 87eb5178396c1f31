//! PostgreSQL's failures as the ledger's own [`LedgerError`], read from their SQLSTATE
//! (https://www.postgresql.org/docs/current/errcodes-appendix.html), so callers decide as
//! they do on SQLite: intake waits out `Busy` and `DiskFull`, everything else fails the call.
//!
//! A lost connection (the server restarted or failed over, the network dropped, the pool
//! found no live connection in time) is `Busy`: like a lock held too long, it passes by
//! itself (the pool reconnects), and the right reaction is intake's for `Busy` — wait,
//! record nothing, leave the offset where it was — not stopping the daemon, which `Other`
//! would do to every replica at once when the database fails over. A connection lost
//! during COMMIT leaves the commit's outcome unknown; intake's retry is safe (it is
//! deduplicated on the update and sets the offset), and a caller for which it is not
//! (an attempt's record) must treat `Busy` after a commit as "unknown", as it would here.

use crate::ledger::{ErrorSource, LedgerError};

/// What SQLSTATE means to the ledger's callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meaning {
    Busy,
    DiskFull,
    Constraint,
    Corrupt,
    Other,
}

/// The rule, on the five characters of a SQLSTATE.
fn meaning(sqlstate: &str) -> Meaning {
    match sqlstate {
        // serialization_failure, deadlock_detected, lock_not_available: another
        // transaction was in the way; trying again passes.
        "40001" | "40P01" | "55P03" => Meaning::Busy,
        // too_many_connections: the server's limit, which frees up by itself.
        "53300" => Meaning::Busy,
        // admin_shutdown, crash_shutdown, cannot_connect_now: the server went away or is
        // starting; see the module documentation.
        "57P01" | "57P02" | "57P03" => Meaning::Busy,
        // query_canceled (a `statement_timeout` set on the role or database, or an operator's
        // pg_cancel_backend), idle_session_timeout, idle_in_transaction_session_timeout: the
        // statement or the connection was ended from outside, not refused for what it
        // asked; the next try, on a fresh connection, may pass. Stopping the daemon for
        // one would stop every replica in turn under the same setting.
        "57014" | "57P05" | "25P03" => Meaning::Busy,
        "53100" => Meaning::DiskFull,
        "XX001" | "XX002" => Meaning::Corrupt,
        // Class 08: connection exceptions.
        state if state.starts_with("08") => Meaning::Busy,
        // Class 23: integrity constraint violations (unique, foreign key, check, not null,
        // exclusion).
        state if state.starts_with("23") => Meaning::Constraint,
        _ => Meaning::Other,
    }
}

impl From<sqlx::Error> for LedgerError {
    fn from(error: sqlx::Error) -> Self {
        let (meaning, detail) = match &error {
            sqlx::Error::Database(database) => {
                let sqlstate = database.code().map(|code| code.into_owned()).unwrap_or_default();
                (meaning(&sqlstate), format!("{} (SQLSTATE {sqlstate})", database.message()))
            }
            // The connection broke, or none could be had: see the module documentation.
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed => (
                Meaning::Busy,
                format!("the connection to PostgreSQL was lost or none could be had: {error}"),
            ),
            other => (Meaning::Other, other.to_string()),
        };
        let source: ErrorSource = Box::new(error);
        match meaning {
            Meaning::Busy => Self::Busy { detail, source },
            Meaning::DiskFull => Self::DiskFull { detail, source },
            Meaning::Constraint => Self::Constraint { detail, source },
            Meaning::Corrupt => Self::Corrupt { detail, source },
            Meaning::Other => {
                Self::Other { message: format!("the ledger failed: {detail}"), source: Some(source) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_what_callers_decide_on() {
        for busy in [
            "40001", "40P01", "55P03", "53300", "57P01", "57P02", "57P03", "08000", "08006", "08003",
            "57014", "57P05", "25P03",
        ] {
            assert_eq!(meaning(busy), Meaning::Busy, "{busy}");
        }
        assert_eq!(meaning("53100"), Meaning::DiskFull);
        for constraint in ["23000", "23502", "23503", "23505", "23514", "23P01"] {
            assert_eq!(meaning(constraint), Meaning::Constraint, "{constraint}");
        }
        assert_eq!(meaning("XX001"), Meaning::Corrupt);
        assert_eq!(meaning("XX002"), Meaning::Corrupt);
        // An internal error, a syntax error, an undefined table, out of memory, a read-only
        // transaction: none passes by itself.
        for other in ["XX000", "42601", "42P01", "53200", "25006", ""] {
            assert_eq!(meaning(other), Meaning::Other, "{other:?}");
        }
    }

    #[test]
    fn a_broken_connection_is_busy_and_keeps_its_cause() {
        let lost =
            LedgerError::from(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(matches!(lost, LedgerError::Busy { .. }), "{lost:?}");
        assert!(std::error::Error::source(&lost).is_some());
        assert!(matches!(LedgerError::from(sqlx::Error::PoolTimedOut), LedgerError::Busy { .. }));
        assert!(matches!(
            LedgerError::from(sqlx::Error::RowNotFound),
            LedgerError::Other { source: Some(_), .. }
        ));
    }
}
