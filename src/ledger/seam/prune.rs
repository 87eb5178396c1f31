//! Removing what is finished (DESIGN §17).

use std::time::Duration;

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

/// What a prune removed (or, dry, would remove), per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub envelopes: u64,
    pub attempts: u64,
    pub envelope_events: u64,
    pub handoffs: u64,
    pub cascades: u64,
    pub cascade_turns: u64,
    pub room_posts: u64,
    pub tasks: u64,
    pub task_revisions: u64,
    pub agent_sessions: u64,
    pub reactions: u64,
    pub permission_requests: u64,
    pub operator_questions: u64,
}

impl Pruned {
    /// Each table with its count, in the order the tables were made.
    pub fn by_table(&self) -> [(&'static str, u64); 13] {
        [
            ("envelopes", self.envelopes),
            ("attempts", self.attempts),
            ("envelope_events", self.envelope_events),
            ("handoffs", self.handoffs),
            ("cascades", self.cascades),
            ("cascade_turns", self.cascade_turns),
            ("room_posts", self.room_posts),
            ("tasks", self.tasks),
            ("task_revisions", self.task_revisions),
            ("agent_sessions", self.agent_sessions),
            ("reactions", self.reactions),
            ("permission_requests", self.permission_requests),
            ("operator_questions", self.operator_questions),
        ]
    }

    pub fn total(&self) -> u64 {
        self.by_table().iter().map(|(_, count)| count).sum()
    }

    pub(crate) fn add(&mut self, other: &Pruned) {
        self.envelopes += other.envelopes;
        self.attempts += other.attempts;
        self.envelope_events += other.envelope_events;
        self.handoffs += other.handoffs;
        self.cascades += other.cascades;
        self.cascade_turns += other.cascade_turns;
        self.room_posts += other.room_posts;
        self.tasks += other.tasks;
        self.task_revisions += other.task_revisions;
        self.agent_sessions += other.agent_sessions;
        self.reactions += other.reactions;
        self.permission_requests += other.permission_requests;
        self.operator_questions += other.operator_questions;
    }
}

/// The size of the ledger's file in pages, and how many of them are free (reused by later
/// writes; see docs/operating.md on space).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pages {
    pub page_size: u64,
    pub page_count: u64,
    pub free_pages: u64,
}

impl Pages {
    pub fn bytes(&self) -> u64 {
        self.page_size * self.page_count
    }
}

/// What a prune did.
#[derive(Debug, Clone, Default)]
pub struct PruneReport {
    pub removed: Pruned,
    /// Batches that deleted (or, dry, would have deleted) something.
    pub batches: u64,
    /// The longest a batch held the write lock, from taking it to the end of its commit.
    pub longest_batch: Duration,
    /// How long each batch held it, in order (a dry run's: how long it read): the
    /// envelopes' batches, then those of the tables of their own (sessions, reactions,
    /// permission requests, questions), each of those tables' last batch too, though it
    /// deleted less than a batch or nothing (its search held the lock as long).
    pub batch_holds: Vec<Duration>,
    /// Of each envelope batch's hold, its commit alone, in order (none for a dry run).
    pub batch_commits: Vec<Duration>,
    pub took: Duration,
    pub pages_before: Pages,
    pub pages_after: Pages,
}

impl PruneReport {
    /// A batch held the write lock for `held`: counted in [`Self::batch_holds`] and
    /// [`Self::longest_batch`].
    pub fn held_for(&mut self, held: Duration) {
        self.longest_batch = self.longest_batch.max(held);
        self.batch_holds.push(held);
    }
}
