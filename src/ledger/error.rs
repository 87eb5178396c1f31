//! The ledger's own error: what went wrong, in the terms its callers decide on. Intake
//! waits out [`LedgerError::Busy`] and [`LedgerError::DiskFull`] (they pass by themselves),
//! readiness reports them apart (`write_watch`), and everything else is a failure of the
//! write or read at hand. Each backend maps its engine's errors to these (`sqlite::error`,
//! `postgres::error`): no caller outside `ledger/` knows which library runs the statements.

use std::error::Error as StdError;
use std::fmt;

/// The error a failure came with (SQLite's, or an encoder's), kept for whoever walks the
/// chain of sources.
pub type ErrorSource = Box<dyn StdError + Send + Sync + 'static>;

/// What every public function of the ledger fails with (directly, or inside a domain error
/// such as `ReconcileError`).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Another connection (another process, say `switchboard ledger reconcile`) held the
    /// lock past the busy timeout (`SQLITE_BUSY`, `SQLITE_LOCKED`). It passes by itself.
    #[error("the ledger is locked by another connection ({detail})")]
    Busy { detail: String, source: ErrorSource },
    /// The disk, or SQLite's page limit, is full (`SQLITE_FULL`). Nothing of the failed
    /// write stays; it passes when room is made.
    #[error("the disk holding the ledger is full ({detail})")]
    DiskFull { detail: String, source: ErrorSource },
    /// A row broke one of the schema's constraints (a unique key, a CHECK, a foreign key):
    /// a bug, or a premise another writer changed.
    #[error("the ledger refused a row that breaks its constraints ({detail})")]
    Constraint { detail: String, source: ErrorSource },
    /// The file is damaged, or is not a SQLite database at all (`SQLITE_CORRUPT`,
    /// `SQLITE_NOTADB`): an operator must look at it.
    #[error("the ledger file is damaged or is not a ledger ({detail})")]
    Corrupt { detail: String, source: ErrorSource },
    /// Anything else: an I/O error, a read-only file, a row this switchboard cannot read.
    #[error("{message}")]
    Other {
        message: String,
        #[source]
        source: Option<ErrorSource>,
    },
}

/// What the ledger's functions return.
pub type LedgerResult<T> = Result<T, LedgerError>;

impl LedgerError {
    /// A failure found by the code reading the ledger (a row that contradicts another, a
    /// value it cannot read), with no error underneath.
    pub fn other(message: impl Into<String>) -> Self {
        Self::Other { message: message.into(), source: None }
    }

    /// A value that could not be encoded for a column (a cascade as JSON, say): `what` says
    /// which.
    pub(super) fn encoding(what: &str, source: impl StdError + Send + Sync + 'static) -> Self {
        Self::Other { message: format!("encoding {what}: {source}"), source: Some(Box::new(source)) }
    }
}

/// A ledger error that passes by itself: intake waits it out (offset not moved, nothing
/// recorded) instead of stopping the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerCongestion {
    /// Another connection holds the write lock past the busy timeout
    /// ([`LedgerError::Busy`]).
    Busy,
    /// The disk (or SQLite's page limit) is full ([`LedgerError::DiskFull`]).
    DiskFull,
}

impl LedgerCongestion {
    /// Whether `error` is one intake waits out; any other ledger error is fatal.
    pub fn of(error: &LedgerError) -> Option<Self> {
        match error {
            LedgerError::Busy { .. } => Some(Self::Busy),
            LedgerError::DiskFull { .. } => Some(Self::DiskFull),
            LedgerError::Constraint { .. } | LedgerError::Corrupt { .. } | LedgerError::Other { .. } => None,
        }
    }
}

impl fmt::Display for LedgerCongestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Busy => "the ledger is locked by another connection",
            Self::DiskFull => "the disk holding the ledger is full",
        })
    }
}
