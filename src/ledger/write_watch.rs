//! What the ledger's own writes came to lately, for readiness (DESIGN.md §12): the probe
//! of `probe` commits one page, which still fits on a disk too full for a batch of
//! messages, so the writes that matter say for themselves whether they failed.
//!
//! Three kinds are watched: intake (a batch of updates and its offset), attempts (a send
//! recorded before it is made, and its outcome) and checkpoints (the WAL copied back into
//! the database). A kind is failing from its first failed write until its next write
//! succeeds, or a batch of intake does: intake retries by itself, but an attempt waits for
//! the next send and a checkpoint for the next commit, and a committed batch is the larger
//! write to the same file. Each failure is counted in
//! `switchboard_ledger_write_failures_total`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{LedgerError, LedgerResult};
use crate::operate::metrics;

/// A kind of write the ledger watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerWrite {
    Intake,
    Attempt,
    Checkpoint,
}

impl LedgerWrite {
    pub const ALL: [Self; 3] = [Self::Intake, Self::Attempt, Self::Checkpoint];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intake => "intake",
            Self::Attempt => "attempt",
            Self::Checkpoint => "checkpoint",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Intake => 0,
            Self::Attempt => 1,
            Self::Checkpoint => 2,
        }
    }
}

/// Why a write failed, as far as an operator can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteProblem {
    /// The disk (or SQLite's page limit) is full.
    DiskFull,
    /// Another connection held the write lock too long.
    Busy,
    /// Anything else (an I/O error, a read-only file, …).
    Other,
}

impl WriteProblem {
    pub fn of(error: &LedgerError) -> Self {
        match error {
            LedgerError::DiskFull { .. } => Self::DiskFull,
            LedgerError::Busy { .. } => Self::Busy,
            LedgerError::Constraint { .. } | LedgerError::Corrupt { .. } | LedgerError::Other { .. } => {
                Self::Other
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::DiskFull => "disk_full",
            Self::Busy => "busy",
            Self::Other => "other",
        }
    }
}

/// A kind of write that is failing now: since how long, and (its latest) why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFailing {
    pub write: LedgerWrite,
    pub problem: WriteProblem,
    pub lasting: Duration,
    /// The latest error, for people (no message content: SQLite's own words).
    pub error: String,
}

#[derive(Debug)]
struct Failing {
    since: Instant,
    problem: WriteProblem,
    error: String,
}

/// Shared by the ledger's writers and the health routes.
#[derive(Debug, Default)]
pub struct WriteWatch {
    failing: Mutex<[Option<Failing>; 3]>,
}

impl WriteWatch {
    /// Notes what a write of `write` came to.
    pub fn observe<T>(&self, write: LedgerWrite, outcome: &LedgerResult<T>) {
        let mut failing = self.failing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match outcome {
            // A batch recorded shows the ledger takes writes again, whatever failed before.
            Ok(_) if write == LedgerWrite::Intake => *failing = Default::default(),
            Ok(_) => failing[write.index()] = None,
            Err(error) => {
                let slot = &mut failing[write.index()];
                let problem = WriteProblem::of(error);
                metrics::ledger_write_failed(write.as_str(), problem.as_str());
                let since = slot.as_ref().map_or_else(Instant::now, |earlier| earlier.since);
                *slot = Some(Failing { since, problem, error: error.to_string() });
            }
        }
    }

    /// The kinds failing now, in [`LedgerWrite::ALL`] order.
    pub fn failing(&self) -> Vec<WriteFailing> {
        let now = Instant::now();
        let failing = self.failing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        LedgerWrite::ALL
            .into_iter()
            .filter_map(|write| {
                failing[write.index()].as_ref().map(|f| WriteFailing {
                    write,
                    problem: f.problem,
                    lasting: now.saturating_duration_since(f.since),
                    error: f.error.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::ffi;

    use super::*;

    fn busy() -> LedgerError {
        LedgerError::from(rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_BUSY), None))
    }

    #[test]
    fn the_problem_is_read_from_the_variant() {
        let full = LedgerError::from(rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_FULL), None));
        assert_eq!(WriteProblem::of(&full), WriteProblem::DiskFull);
        assert_eq!(WriteProblem::of(&busy()), WriteProblem::Busy);
        assert_eq!(WriteProblem::of(&LedgerError::other("something else")), WriteProblem::Other);
    }

    #[test]
    fn a_kind_fails_from_its_first_failure_until_its_next_success() {
        let watch = WriteWatch::default();
        assert!(watch.failing().is_empty());
        watch.observe::<()>(LedgerWrite::Intake, &Err(busy()));
        let first = watch.failing();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].write, first[0].problem), (LedgerWrite::Intake, WriteProblem::Busy));
        std::thread::sleep(Duration::from_millis(20));
        watch.observe::<()>(LedgerWrite::Intake, &Err(LedgerError::other("something else")));
        let again = watch.failing();
        assert_eq!(again[0].problem, WriteProblem::Other, "the latest reason");
        assert!(again[0].lasting >= Duration::from_millis(20), "since the first failure: {again:?}");
        // An attempt's success says nothing about intake, which retries by itself.
        watch.observe(LedgerWrite::Attempt, &Ok(()));
        assert_eq!(watch.failing().len(), 1);
        watch.observe(LedgerWrite::Intake, &Ok(()));
        assert!(watch.failing().is_empty());
    }

    #[test]
    fn a_recorded_batch_clears_the_kinds_that_do_not_retry_by_themselves() {
        let watch = WriteWatch::default();
        watch.observe::<()>(LedgerWrite::Attempt, &Err(busy()));
        watch.observe::<()>(LedgerWrite::Checkpoint, &Err(busy()));
        watch.observe(LedgerWrite::Checkpoint, &Ok(()));
        assert_eq!(watch.failing().iter().map(|f| f.write).collect::<Vec<_>>(), [LedgerWrite::Attempt]);
        watch.observe(LedgerWrite::Intake, &Ok(()));
        assert!(watch.failing().is_empty());
    }
}
