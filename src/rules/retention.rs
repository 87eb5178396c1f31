//! Retention (issue 26): which finished rows of the ledger may be deleted, decided from
//! the facts of one batch of rows. The ledger gathers the facts (`ledger::prune`), this
//! decides, the ledger deletes what was decided in the same transaction.
//!
//! The rule, in one sentence: a row goes only when it is finished, finished before the
//! cutoff, not the newest of its table, and everything that references it goes with it.
//! Whatever the facts do not show (a reference to a row outside the batch, an entity the
//! batch did not load) keeps the row: if in doubt, keep.

use std::collections::{BTreeMap, BTreeSet};

use crate::ledger::EnvelopeState;

/// The longest retention accepted, in days (`ledger prune --older-than`, `[storage]
/// retain_days`): a century, far past any retention anyone means, and far from the date
/// arithmetic's limits (a cutoff further back than chrono can count panics).
pub const MAX_AGE_DAYS: i64 = 36_525;

/// Whether an envelope's state is final: nothing will happen to it any more, it is kept
/// for audit only. `queued`, `pending` and `unresolved` are work (or an operator's).
pub fn is_final(state: EnvelopeState) -> bool {
    match state {
        EnvelopeState::Acked
        | EnvelopeState::Superseded
        | EnvelopeState::Unrouted
        | EnvelopeState::Rejected
        | EnvelopeState::Ignored
        | EnvelopeState::Undecodable => true,
        EnvelopeState::Queued | EnvelopeState::Pending | EnvelopeState::Unresolved => false,
    }
}

/// One envelope, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeFacts {
    pub id: i64,
    pub state: EnvelopeState,
    /// It reached its state (`state_changed_at`) before the cutoff, and no attempt of it
    /// (a reaction, an edit) started, finished or was reconciled since.
    pub settled_before_cutoff: bool,
    /// One of its attempts is in flight, or unknown and not reconciled: an operator may
    /// still need it, whatever the envelope's state (an acked envelope's follow-up can be
    /// unknown).
    pub unreconciled_attempt: bool,
    /// It is the newest envelope, or carries the newest attempt or event: deleting it
    /// would let SQLite hand that id out again (migration 0009).
    pub holds_newest: bool,
    /// The task it was made under, if any.
    pub task: Option<String>,
}

/// A handoff: its three references to envelopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffFacts {
    pub id: i64,
    /// Answered, closed or superseded, before the cutoff.
    pub ended_before_cutoff: bool,
    pub is_newest: bool,
    pub cause: Option<i64>,
    pub envelope: i64,
    pub answer: Option<i64>,
}

/// A room's cascade with its turns and posts, which go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CascadeFacts {
    pub id: i64,
    /// Stopped, completed or out of budget, before the cutoff.
    pub over_before_cutoff: bool,
    /// A post of it is still owed to the room.
    pub owes_post: bool,
    /// The cascade, one of its turns or one of its posts is the newest of its table.
    pub holds_newest: bool,
    /// Every envelope it references: its message, its turns', its posts'.
    pub envelopes: Vec<i64>,
}

/// A post of no cascade (what the bot said about a task).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostFacts {
    pub id: i64,
    /// Made (not owed), before the cutoff.
    pub made_before_cutoff: bool,
    pub is_newest: bool,
    pub envelope: i64,
}

/// A task with its revisions, which go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFacts {
    pub id: i64,
    pub task_id: String,
    /// Done, stopped or replaced, before the cutoff; or open with nothing of it running
    /// and nothing of it changed since (DESIGN §11: such a task is done).
    pub closed_before_cutoff: bool,
    /// The task or one of its revisions is the newest of its table.
    pub holds_newest: bool,
    /// The envelopes made under it, which go with it and only with it. Left empty for a
    /// task that cannot go (open, recent or the newest): its envelopes stay by the rule
    /// that an envelope goes only with its task, and loading them would make a
    /// conversation's long history one batch.
    pub owned: Vec<i64>,
    /// The envelopes its row and its revisions reference (first, act-on, cancel, each
    /// revision's), which may be another task's (a `/new` is made under the task it
    /// starts and recorded as the end of the one it replaces): kept while it stays, free
    /// to stay when it goes.
    pub referenced: Vec<i64>,
}

impl TaskFacts {
    /// Whether it may go at all, whatever becomes of its envelopes: closed before the
    /// cutoff and not the newest. Only then are the envelopes made under it worth loading.
    pub fn may_go(&self) -> bool {
        self.closed_before_cutoff && !self.holds_newest
    }
}

/// The facts of one batch: its envelopes and every row that references one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchFacts {
    pub envelopes: Vec<EnvelopeFacts>,
    pub handoffs: Vec<HandoffFacts>,
    pub cascades: Vec<CascadeFacts>,
    pub task_posts: Vec<PostFacts>,
    pub tasks: Vec<TaskFacts>,
}

/// What may be deleted, by id (tasks by their row id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Doomed {
    pub envelopes: BTreeSet<i64>,
    pub handoffs: BTreeSet<i64>,
    pub cascades: BTreeSet<i64>,
    pub task_posts: BTreeSet<i64>,
    pub tasks: BTreeSet<i64>,
}

impl Doomed {
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
            && self.handoffs.is_empty()
            && self.cascades.is_empty()
            && self.task_posts.is_empty()
            && self.tasks.is_empty()
    }
}

/// Decides what of `facts` may go. Starts from every envelope that is finished on its own
/// and takes away, until nothing changes, each one that a row which stays still
/// references: a row that stays keeps what it points at, so no reference is ever left
/// dangling and no open thing loses a piece.
pub fn decide(facts: &BatchFacts) -> Doomed {
    let mut envelopes: BTreeSet<i64> = facts
        .envelopes
        .iter()
        .filter(|e| {
            is_final(e.state) && e.settled_before_cutoff && !e.unreconciled_attempt && !e.holds_newest
        })
        .map(|e| e.id)
        .collect();
    let tasks_by_name: BTreeMap<&str, &TaskFacts> =
        facts.tasks.iter().map(|task| (task.task_id.as_str(), task)).collect();
    loop {
        let goes = |id: &i64| envelopes.contains(id);
        let handoffs: BTreeSet<i64> = facts
            .handoffs
            .iter()
            .filter(|h| {
                h.ended_before_cutoff
                    && !h.is_newest
                    && goes(&h.envelope)
                    && h.answer.is_none_or(|a| goes(&a))
            })
            .map(|h| h.id)
            .collect();
        let cascades: BTreeSet<i64> = facts
            .cascades
            .iter()
            .filter(|c| {
                c.over_before_cutoff && !c.owes_post && !c.holds_newest && c.envelopes.iter().all(goes)
            })
            .map(|c| c.id)
            .collect();
        let task_posts: BTreeSet<i64> = facts
            .task_posts
            .iter()
            .filter(|p| p.made_before_cutoff && !p.is_newest && goes(&p.envelope))
            .map(|p| p.id)
            .collect();
        let tasks: BTreeSet<i64> =
            facts.tasks.iter().filter(|t| t.may_go() && t.owned.iter().all(goes)).map(|t| t.id).collect();

        let mut kept: BTreeSet<i64> = BTreeSet::new();
        for h in facts.handoffs.iter().filter(|h| !handoffs.contains(&h.id)) {
            kept.extend(h.cause.into_iter().chain([h.envelope]).chain(h.answer));
        }
        for c in facts.cascades.iter().filter(|c| !cascades.contains(&c.id)) {
            kept.extend(&c.envelopes);
        }
        for p in facts.task_posts.iter().filter(|p| !task_posts.contains(&p.id)) {
            kept.insert(p.envelope);
        }
        for t in facts.tasks.iter().filter(|t| !tasks.contains(&t.id)) {
            kept.extend(t.owned.iter().chain(&t.referenced));
        }
        // An envelope of a task goes with its task: one whose task the facts do not show
        // stays.
        for e in &facts.envelopes {
            if let Some(task) = &e.task
                && !tasks_by_name.get(task.as_str()).is_some_and(|t| tasks.contains(&t.id))
            {
                kept.insert(e.id);
            }
        }

        let before = envelopes.len();
        envelopes.retain(|id| !kept.contains(id));
        if envelopes.len() == before {
            return Doomed { envelopes, handoffs, cascades, task_posts, tasks };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(id: i64, state: EnvelopeState) -> EnvelopeFacts {
        EnvelopeFacts {
            id,
            state,
            settled_before_cutoff: true,
            unreconciled_attempt: false,
            holds_newest: false,
            task: None,
        }
    }

    fn finished(id: i64) -> EnvelopeFacts {
        envelope(id, EnvelopeState::Acked)
    }

    fn ids(set: &BTreeSet<i64>) -> Vec<i64> {
        set.iter().copied().collect()
    }

    #[test]
    fn only_final_states_are_finished() {
        let finals: Vec<_> = EnvelopeState::ALL.into_iter().filter(|s| is_final(*s)).collect();
        assert_eq!(
            finals,
            [
                EnvelopeState::Acked,
                EnvelopeState::Unrouted,
                EnvelopeState::Rejected,
                EnvelopeState::Ignored,
                EnvelopeState::Undecodable,
                EnvelopeState::Superseded
            ]
        );
    }

    #[test]
    fn open_recent_unreconciled_and_newest_envelopes_stay() {
        let mut recent = finished(5);
        recent.settled_before_cutoff = false;
        let mut unknown_attempt = finished(6);
        unknown_attempt.unreconciled_attempt = true;
        let mut newest = finished(7);
        newest.holds_newest = true;
        let facts = BatchFacts {
            envelopes: vec![
                finished(1),
                envelope(2, EnvelopeState::Queued),
                envelope(3, EnvelopeState::Pending),
                envelope(4, EnvelopeState::Unresolved),
                recent,
                unknown_attempt,
                newest,
                envelope(8, EnvelopeState::Rejected),
            ],
            ..BatchFacts::default()
        };
        assert_eq!(ids(&decide(&facts).envelopes), [1, 8]);
    }

    #[test]
    fn a_handoff_goes_once_ended_with_its_envelopes_and_an_open_one_keeps_all_three() {
        let handoff = |id, ended, cause, envelope, answer| HandoffFacts {
            id,
            ended_before_cutoff: ended,
            is_newest: false,
            cause: Some(cause),
            envelope,
            answer,
        };
        let facts = BatchFacts {
            envelopes: (1..=6).map(finished).collect(),
            handoffs: vec![handoff(1, true, 1, 2, Some(3)), handoff(2, false, 4, 5, None)],
            ..BatchFacts::default()
        };
        let doomed = decide(&facts);
        assert_eq!(ids(&doomed.handoffs), [1]);
        assert_eq!(ids(&doomed.envelopes), [1, 2, 3, 6]);
    }

    #[test]
    fn an_ended_handoff_whose_answer_stays_stays_and_keeps_its_cause() {
        let facts = BatchFacts {
            envelopes: vec![finished(1), finished(2), envelope(3, EnvelopeState::Pending)],
            handoffs: vec![HandoffFacts {
                id: 1,
                ended_before_cutoff: true,
                is_newest: false,
                cause: Some(1),
                envelope: 2,
                answer: Some(3),
            }],
            ..BatchFacts::default()
        };
        assert_eq!(decide(&facts), Doomed::default());
    }

    #[test]
    fn a_cascade_goes_only_once_over_with_nothing_owed_and_all_its_envelopes() {
        let cascade = |id, over, owes, envelopes: Vec<i64>| CascadeFacts {
            id,
            over_before_cutoff: over,
            owes_post: owes,
            holds_newest: false,
            envelopes,
        };
        let facts = BatchFacts {
            envelopes: (1..=9).map(finished).collect(),
            cascades: vec![
                cascade(1, true, false, vec![1, 2]),
                cascade(2, false, false, vec![3, 4]),
                cascade(3, true, true, vec![5, 6]),
                // Its third turn's envelope is not in the batch.
                cascade(4, true, false, vec![7, 8, 100]),
            ],
            ..BatchFacts::default()
        };
        let doomed = decide(&facts);
        assert_eq!(ids(&doomed.cascades), [1]);
        assert_eq!(ids(&doomed.envelopes), [1, 2, 9]);
    }

    #[test]
    fn a_task_goes_only_once_closed_with_every_envelope_made_under_it() {
        let task = |id, name: &str, closed, owned: Vec<i64>| TaskFacts {
            id,
            task_id: name.into(),
            closed_before_cutoff: closed,
            holds_newest: false,
            owned,
            referenced: vec![],
        };
        let of = |id, name: &str| EnvelopeFacts { task: Some(name.into()), ..finished(id) };
        let facts = BatchFacts {
            envelopes: vec![
                of(1, "task_done"),
                of(2, "task_done"),
                of(3, "task_open"),
                of(4, "task_pending"),
            ],
            tasks: vec![
                task(1, "task_done", true, vec![1, 2]),
                task(2, "task_open", false, vec![3]),
                task(3, "task_pending", true, vec![4, 5]),
            ],
            ..BatchFacts::default()
        };
        let doomed = decide(&facts);
        assert_eq!(ids(&doomed.tasks), [1]);
        assert_eq!(ids(&doomed.envelopes), [1, 2]);
    }

    #[test]
    fn a_task_goes_without_its_successors_envelope_it_references_and_one_that_stays_keeps_it() {
        // Task 1 was replaced by task 2 with `/new`, envelope 2, made under task 2 and
        // recorded as task 1's end. Task 2 still refers to envelope 3 of task 3, which
        // the batch shows only in part (its envelope 100 is elsewhere).
        let of = |id, name: &str| EnvelopeFacts { task: Some(name.into()), ..finished(id) };
        let task = |id, name: &str, owned: Vec<i64>, referenced: Vec<i64>| TaskFacts {
            id,
            task_id: name.into(),
            closed_before_cutoff: true,
            holds_newest: false,
            owned,
            referenced,
        };
        let facts = BatchFacts {
            envelopes: vec![of(1, "task_1"), of(2, "task_2"), of(3, "task_3")],
            tasks: vec![
                task(1, "task_1", vec![1], vec![1, 2]),
                task(2, "task_2", vec![2], vec![2, 3]),
                task(3, "task_3", vec![3, 100], vec![3]),
            ],
            ..BatchFacts::default()
        };
        let doomed = decide(&facts);
        assert_eq!(ids(&doomed.tasks), [1, 2], "task 3 stays, with envelope 3");
        assert_eq!(ids(&doomed.envelopes), [1, 2]);

        // Had task 1 stayed (its own envelope not finished), it would keep envelope 2, and
        // so task 2.
        let mut open = facts.clone();
        open.envelopes[0].state = EnvelopeState::Pending;
        assert!(decide(&open).is_empty(), "{:?}", decide(&open));
    }

    #[test]
    fn an_envelope_of_a_task_the_batch_does_not_show_stays() {
        let facts = BatchFacts {
            envelopes: vec![EnvelopeFacts { task: Some("task_elsewhere".into()), ..finished(1) }],
            ..BatchFacts::default()
        };
        assert!(decide(&facts).is_empty());
    }

    #[test]
    fn keeping_one_row_keeps_what_it_reaches_through_others() {
        // Task 1's envelope 2 is the cause of an open handoff: the handoff keeps 2, so the
        // task cannot go, so envelope 1 of the task stays too; its post with it.
        let facts = BatchFacts {
            envelopes: vec![
                EnvelopeFacts { task: Some("task_1".into()), ..finished(1) },
                EnvelopeFacts { task: Some("task_1".into()), ..finished(2) },
                finished(3),
            ],
            handoffs: vec![HandoffFacts {
                id: 1,
                ended_before_cutoff: false,
                is_newest: false,
                cause: Some(2),
                envelope: 3,
                answer: None,
            }],
            task_posts: vec![PostFacts { id: 1, made_before_cutoff: true, is_newest: false, envelope: 1 }],
            tasks: vec![TaskFacts {
                id: 1,
                task_id: "task_1".into(),
                closed_before_cutoff: true,
                holds_newest: false,
                owned: vec![1, 2],
                referenced: vec![1],
            }],
            ..BatchFacts::default()
        };
        assert!(decide(&facts).is_empty(), "{:?}", decide(&facts));
    }
}
