//! Removing what is finished (DESIGN §17).

use super::*;

#[async_trait]
pub trait Retention: Send + Sync {
    /// Deletes what finished before `finished_before` (see `rules::retention` for what
    /// that is), in bounded batches, each its own transaction; with `dry_run`, deletes
    /// nothing and counts what would go.
    async fn prune(&self, finished_before: DateTime<Utc>, dry_run: bool) -> LedgerResult<PruneReport>;

    /// The file's pages and free pages.
    async fn pages(&self) -> LedgerResult<Pages>;
}
