//! The ack ledger. Every envelope, every send attempt and the poller's offset live here, so
//! nothing is lost when the daemon dies and nothing is done twice when it starts again.
//!
//! The rest of the daemon sees the ledger through one seam (`seam`): traits in the domain's
//! terms, which a backend implements and the conformance suite (`conformance`) checks.
//! Today's backend is SQLite (`sqlite`), embedded in the daemon. Every method fails with
//! [`LedgerError`], and nothing outside `ledger/` knows which library runs the statements.
//!
//! The ledger only stores and transitions; what a transition *means* is decided by the
//! pure code in `rules`.

use std::path::Path;
use std::sync::Arc;

use crate::config::Synchronous;

mod error;
pub mod postgres;
mod prune_batches;
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
pub use seam::Storage;
pub use seam::{ListFilter, Pages, PruneReport, Pruned};
pub use sqlite::{OpenError, SqliteLedger, files};
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

/// Opens the daemon's ledger at `path`, creating it (mode `0600`) if needed, and applies
/// pending migrations.
pub async fn open(path: &Path, synchronous: Synchronous) -> Result<Ledger, OpenError> {
    Ok(Arc::new(SqliteLedger::open(path, synchronous).await?))
}

/// Opens a ledger that must already exist, for `switchboard ledger`: a mistyped path must
/// not become a new, empty ledger.
pub async fn open_existing(path: &Path, synchronous: Synchronous) -> Result<Ledger, OpenError> {
    Ok(Arc::new(SqliteLedger::open_existing(path, synchronous).await?))
}
