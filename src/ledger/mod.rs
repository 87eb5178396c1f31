//! The ack ledger. Every envelope, every send attempt and the poller's offset live here, so
//! nothing is lost when the daemon dies and nothing is done twice when it starts again.
//!
//! The rest of the daemon sees the ledger through one seam (`seam`): traits in the domain's
//! terms, which a backend implements and the conformance suite (`conformance`) checks.
//! Two backends implement it: SQLite (`sqlite`), embedded in the daemon and the default,
//! and PostgreSQL (`postgres`), which replicas share (`[storage] database = "postgres://…"`). Every method fails with
//! [`LedgerError`], and nothing outside `ledger/` knows which library runs the statements.
//!
//! The ledger only stores and transitions; what a transition *means* is decided by the
//! pure code in `rules`.

use std::sync::Arc;

use crate::config::{Database, Synchronous};

mod album_rows;
mod columns;
mod error;
pub mod postgres;
mod prune_batches;
mod reaction_rows;
mod room_rows;
pub mod seam;
pub mod sqlite;
mod task_rows;
mod write_watch;

#[cfg(test)]
pub(crate) mod conformance;

/// The domain's vocabulary, which the seam speaks.
pub use crate::domain::*;
pub use error::LedgerCongestion;
pub use error::{ErrorSource, LedgerError, LedgerResult};
pub use postgres::{PgLedger, PgOpenError, RelayedUpdate};
pub use seam::Storage;
pub use seam::{CountedByState, ListFilter, Pages, PruneReport, Pruned};
pub use sqlite::{SqliteLedger, files};
pub use write_watch::{LedgerWrite, WriteFailing, WriteProblem, WriteWatch};

/// The traits of the seam, for callers that use the ledger's methods.
pub mod prelude {
    pub use super::seam::{
        Attempts, Envelopes, Handoffs, Inspection, Intake, Lifecycle, Permissions, Questions, Reactions,
        Retention, Rooms, Sessions, Storage, Tasks,
    };
}

/// A ledger, whichever backend keeps it: the handle the poller, the bridge, the drivers,
/// the local API and the CLI share.
pub type Ledger = Arc<dyn Storage>;

/// Why a ledger could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Sqlite(#[from] sqlite::OpenError),
    #[error(transparent)]
    Postgres(#[from] PgOpenError),
}

/// Opens the ledger `[storage] database` names, creating it if needed (a SQLite file, mode
/// `0600`; PostgreSQL's tables in an existing database and schema), and applies pending
/// migrations. `synchronous` is SQLite's; PostgreSQL's durability is the server's.
pub async fn open(database: &Database, synchronous: Synchronous) -> Result<Ledger, OpenError> {
    Ok(match database {
        Database::Sqlite(path) => Arc::new(SqliteLedger::open(path, synchronous).await?),
        Database::Postgres(postgres) => Arc::new(PgLedger::connect(&postgres.url).await?),
    })
}

/// Opens a ledger that must already exist, for `switchboard ledger`: a mistyped path or
/// URL must not become a new, empty ledger.
pub async fn open_existing(database: &Database, synchronous: Synchronous) -> Result<Ledger, OpenError> {
    Ok(match database {
        Database::Sqlite(path) => Arc::new(SqliteLedger::open_existing(path, synchronous).await?),
        Database::Postgres(postgres) => Arc::new(PgLedger::connect_existing(&postgres.url).await?),
    })
}
