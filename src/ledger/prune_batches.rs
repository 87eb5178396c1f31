//! How a prune goes through the ledger, whichever backend keeps it (DESIGN §17, issue 26):
//! the envelopes a window of ids at a time, oldest first, each window one transaction, the
//! window sized so that a batch holds the writer about [`TARGET_HOLD`], and a dry run's
//! batches each counting only what no earlier one counted. What may go is decided by
//! `rules::retention`; each backend gathers its facts and deletes.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use crate::ledger::EnvelopeState;
use crate::rules::retention::{self, CascadeFacts, Doomed, TaskFacts};

/// How many envelope ids the first batch looks at. A few hundred envelopes with their
/// attempts and events are a few milliseconds of deletes: short enough that a daemon's
/// write waiting behind one does not notice, long enough that a million rows take
/// minutes, not hours.
pub(crate) const BATCH_ENVELOPES: i64 = 500;

/// How long a batch should hold the writer. The window of the next batch halves after a
/// batch that took longer (a slow disk, a busy machine, a window full of tasks) and
/// doubles, up to [`MAX_BATCH_ENVELOPES`], after one that took less than half of it.
pub(crate) const TARGET_HOLD: Duration = Duration::from_millis(20);
pub(crate) const MIN_BATCH_ENVELOPES: i64 = 25;
pub(crate) const MAX_BATCH_ENVELOPES: i64 = 2000;

/// How many sessions (or reactions) one batch deletes (rows of their own, referenced by
/// nothing).
pub(crate) const BATCH_SESSIONS: i64 = 1000;

/// The shortest pause between two batches, even after one that took no time.
pub(crate) const MIN_PAUSE: Duration = Duration::from_millis(2);

/// The pause after a batch that held the one writer `held` (SQLite's), when another
/// process's write waiting for it tries again at least every `waiter_retries_every`. As
/// long as the batch, so that the prune takes at
/// most about half the writer's time; and twice the waiter's longest pause between two
/// tries, so that a waiter, even one that wakes late, tries while the writer is free and
/// waits at most one batch, not several in a row.
pub(crate) fn pause_after(held: Duration, waiter_retries_every: Duration) -> Duration {
    held.max(MIN_PAUSE).max(waiter_retries_every.saturating_mul(2))
}

/// The ids of a dry run's earlier batches: a dry run deletes nothing, so a later batch
/// finds again what an earlier one would have removed; it is counted once.
#[derive(Default)]
pub(crate) struct AlreadyCounted {
    envelopes: HashSet<i64>,
    handoffs: HashSet<i64>,
    cascades: HashSet<i64>,
    task_posts: HashSet<i64>,
    tasks: HashSet<i64>,
}

impl AlreadyCounted {
    pub(crate) fn leave_out(&self, doomed: &Doomed) -> Doomed {
        let new = |ids: &BTreeSet<i64>, seen: &HashSet<i64>| -> BTreeSet<i64> {
            ids.iter().filter(|id| !seen.contains(id)).copied().collect()
        };
        Doomed {
            envelopes: new(&doomed.envelopes, &self.envelopes),
            handoffs: new(&doomed.handoffs, &self.handoffs),
            cascades: new(&doomed.cascades, &self.cascades),
            task_posts: new(&doomed.task_posts, &self.task_posts),
            tasks: new(&doomed.tasks, &self.tasks),
        }
    }

    pub(crate) fn note(&mut self, doomed: &Doomed) {
        self.envelopes.extend(&doomed.envelopes);
        self.handoffs.extend(&doomed.handoffs);
        self.cascades.extend(&doomed.cascades);
        self.task_posts.extend(&doomed.task_posts);
        self.tasks.extend(&doomed.tasks);
    }
}

/// The window of the batch after one of `envelopes` ids that held the writer `held`.
pub(crate) fn next_batch_envelopes(envelopes: i64, held: Duration) -> i64 {
    next_batch_envelopes_for(envelopes, held, TARGET_HOLD)
}

/// [`next_batch_envelopes`] for a backend that aims its batches at `target` instead.
pub(crate) fn next_batch_envelopes_for(envelopes: i64, held: Duration, target: Duration) -> i64 {
    if held > target {
        (envelopes / 2).max(MIN_BATCH_ENVELOPES)
    } else if held < target / 2 {
        (envelopes * 2).min(MAX_BATCH_ENVELOPES)
    } else {
        envelopes
    }
}

/// The final states, as the SQL of the seed query lists them.
pub(crate) fn final_states_sql() -> String {
    let finals: Vec<String> = EnvelopeState::ALL
        .into_iter()
        .filter(|state| retention::is_final(*state))
        .map(|state| format!("'{}'", state.as_str()))
        .collect();
    finals.join(", ")
}

/// The newest row of each table, which stays (SQLite would hand a deleted newest id out
/// again: migration 0009): the newest envelope, the envelopes carrying the newest attempt
/// and the newest event, and the newest row of each other table.
#[derive(Debug, Default)]
pub(crate) struct Newest {
    pub(crate) envelopes: BTreeSet<i64>,
    pub(crate) handoff: Option<i64>,
    pub(crate) cascade: Option<i64>,
    pub(crate) turn: Option<i64>,
    pub(crate) post: Option<i64>,
    pub(crate) task: Option<i64>,
    pub(crate) revision: Option<i64>,
}

/// A cascade's turn or post as its facts need it: its id, its envelope, and whether it
/// ended (a turn) or is still owed (a post).
pub(crate) type CascadePart = (i64, i64, bool);

/// A cascade's facts, from its row (whether it was over before the cutoff, its message)
/// and its turns' and posts' rows.
pub(crate) fn cascade_facts_from(
    id: i64,
    (over_before_cutoff, message): (bool, i64),
    turns: &[CascadePart],
    posts: &[CascadePart],
    newest: &Newest,
) -> CascadeFacts {
    let holds_newest = newest.cascade == Some(id)
        || turns.iter().any(|(turn, ..)| newest.turn == Some(*turn))
        || posts.iter().any(|(post, ..)| newest.post == Some(*post));
    // A turn still open means the cascade is not over, whatever its state says.
    let turns_ended = turns.iter().all(|(_, _, ended)| *ended);
    CascadeFacts {
        id,
        over_before_cutoff: over_before_cutoff && turns_ended,
        owes_post: posts.iter().any(|(_, _, owed)| *owed),
        holds_newest,
        envelopes: [message]
            .into_iter()
            .chain(turns.iter().map(|(_, envelope, _)| *envelope))
            .chain(posts.iter().map(|(_, envelope, _)| *envelope))
            .collect(),
    }
}

/// A task's row as its facts need it: id, whether it closed before the cutoff, and its
/// first, act-on and cancel envelopes.
pub(crate) type TaskRow = (i64, bool, i64, Option<i64>, Option<i64>);

/// A task's facts, from its row and its revisions' (id, envelope), without the envelopes
/// made under it: the caller loads those only for a task that may go
/// ([`TaskFacts::may_go`]).
pub(crate) fn task_facts_from(
    task_id: &str,
    (id, closed_before_cutoff, first, act_on, cancel): TaskRow,
    revisions: &[(i64, Option<i64>)],
    newest: &Newest,
) -> TaskFacts {
    let holds_newest =
        newest.task == Some(id) || revisions.iter().any(|(revision, _)| newest.revision == Some(*revision));
    let referenced = [Some(first), act_on, cancel]
        .into_iter()
        .flatten()
        .chain(revisions.iter().filter_map(|(_, envelope)| *envelope))
        .collect::<BTreeSet<i64>>()
        .into_iter()
        .collect();
    TaskFacts {
        id,
        task_id: task_id.to_owned(),
        closed_before_cutoff,
        holds_newest,
        owned: Vec::new(),
        referenced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_batch_halves_the_next_window_and_a_quick_one_doubles_it_within_bounds() {
        assert_eq!(next_batch_envelopes(500, TARGET_HOLD * 2), 250);
        assert_eq!(next_batch_envelopes(MIN_BATCH_ENVELOPES, TARGET_HOLD * 2), MIN_BATCH_ENVELOPES);
        assert_eq!(next_batch_envelopes(500, TARGET_HOLD * 3 / 4), 500);
        assert_eq!(next_batch_envelopes(500, Duration::ZERO), 1000);
        assert_eq!(next_batch_envelopes(MAX_BATCH_ENVELOPES, Duration::ZERO), MAX_BATCH_ENVELOPES);
    }

    #[test]
    fn a_pause_lasts_as_long_as_its_batch_and_leaves_a_retrying_waiter_two_tries() {
        let ms = Duration::from_millis;
        assert_eq!(pause_after(ms(30), ms(10)), ms(30));
        assert_eq!(pause_after(ms(5), ms(10)), ms(20), "a short batch: still two tries of a waiter");
        assert_eq!(pause_after(Duration::ZERO, Duration::ZERO), MIN_PAUSE);
        assert_eq!(pause_after(ms(5), Duration::ZERO), ms(5), "waiters that queue need no more");
    }
}
