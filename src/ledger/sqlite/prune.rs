//! Retention (issue 26): deleting what is finished, in bounded batches.
//!
//! The envelopes are taken a window of ids at a time, oldest first. For each window, one
//! write transaction gathers the facts of its finished envelopes and of every row that
//! references one of them (handoffs, cascades with their turns and posts, tasks with their
//! revisions, and the envelopes those reach), asks [`retention::decide`] what may go, and
//! deletes that, children before parents, so that every foreign key holds at every
//! statement. A batch is atomic: `kill -9` mid-batch loses the batch, never half of it.
//!
//! Between two batches the prune pauses at least as long as the batch held the writer, and
//! at least twice as long as another process's write waiting for the lock pauses between
//! two tries (`in_place::BusyWait`, `prune_batches::pause_after`): a live daemon's write
//! then gets in at the first pause, having waited one batch at most.
//!
//! A batch's commit only appends to the WAL. The prune checkpoints after each batch, on a
//! connection of its own, and waits for it before the next (`checkpoint::BetweenBatches`):
//! the WAL is copied back with no lock held, and no batch can write faster than the file
//! takes it back. The WAL may pass its bound meanwhile; the background checkpointer brings
//! it back. `switchboard ledger prune`'s ledger
//! has a background checkpointer too, as a daemon's has, so SQLite's own checkpoint (which
//! would run inside the commit of whichever batch brought the WAL past 1,000 pages) is
//! only a backstop.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::OptionalExtension;

use super::checkpoint::BetweenBatches;
use super::in_place::{LONGEST_PAUSE, execute_cached, query_all_cached, query_row_cached, text_enum};
use super::{LedgerResult, SqliteLedger};
use crate::ledger::columns::{
    closed_before, envelope_facts_columns, permission_finished_before, question_finished_before,
    reaction_done_before,
};
use crate::ledger::prelude::*;
use crate::ledger::prune_batches::{
    AlreadyCounted, BATCH_ENVELOPES, BATCH_SESSIONS, CascadePart, Newest, TaskRow, cascade_facts_from,
    final_states_sql, next_batch_envelopes, pause_after, task_facts_from,
};
use crate::ledger::{Pages, PruneReport, Pruned};
use crate::rules::retention::{
    self, BatchFacts, CascadeFacts, Doomed, EnvelopeFacts, HandoffFacts, PostFacts, TaskFacts,
};

/// How many times a batch follows references out of its window (an envelope's task, the
/// task's other envelopes, their handoffs…) before it stops looking: what it did not reach
/// stays, for a later batch or a later prune to see whole.
const EXPANSION_ROUNDS: usize = 2;

#[async_trait]
impl Retention for SqliteLedger {
    async fn prune(&self, finished_before: DateTime<Utc>, dry_run: bool) -> LedgerResult<PruneReport> {
        let started = Instant::now();
        let cutoff = super::timestamp(finished_before);
        let mut report = PruneReport { pages_before: self.pages().await?, ..PruneReport::default() };
        // Envelopes stored after the prune began are newer than any cutoff in the past.
        let last_id: i64 = self
            .read_in_place(|db| {
                query_row_cached(db, "SELECT COALESCE(MAX(id), 0) FROM envelopes", [], |r| r.get(0))
            })
            .await?;
        let mut counted = AlreadyCounted::default();
        let mut after = 0;
        let mut batch_envelopes = BATCH_ENVELOPES;
        let mut checkpoints = if dry_run {
            None
        } else {
            let (path, synchronous) = self.writer.file();
            Some(BetweenBatches::open(path, synchronous).await?)
        };
        while after < last_id {
            let window = (after, after + batch_envelopes);
            after += batch_envelopes;
            // A window with nothing finished in it (a run of recent or open envelopes)
            // costs a read, not a turn of the writer.
            let anything = self.read_in_place(|db| any_finished(db, window, &cutoff)).await?;
            if !anything {
                continue;
            }
            let (removed, held) = if dry_run {
                let held_from = Instant::now();
                let doomed = self
                    .read_in_place(|db| {
                        let doomed = gather_and_decide(db, window, &cutoff)?;
                        let new = counted.leave_out(&doomed);
                        Ok((count_doomed(db, &new)?, new))
                    })
                    .await?;
                counted.note(&doomed.1);
                (doomed.0, held_from.elapsed())
            } else {
                let (mut lock_taken, mut deleted) = (None, None);
                let removed = self
                    .write_in_place(|db| {
                        lock_taken = Some(Instant::now());
                        let doomed = gather_and_decide(db, window, &cutoff)?;
                        let removed = delete_doomed(db, &doomed);
                        deleted = Some(Instant::now());
                        removed
                    })
                    .await?;
                let committed = Instant::now();
                let since = |at: Option<Instant>| at.map(|at| committed - at).unwrap_or_default();
                report.batch_commits.push(since(deleted));
                (removed, since(lock_taken))
            };
            if removed.total() > 0 {
                report.batches += 1;
                if removed.envelopes > 0 {
                    tracing::debug!(envelopes = removed.envelopes, up_to_id = window.1, "pruned a batch");
                }
            }
            report.removed.add(&removed);
            report.held_for(held);
            batch_envelopes = next_batch_envelopes(batch_envelopes, held);
            if let Some(checkpoints) = &mut checkpoints {
                checkpoints.checkpoint().await;
            }
            tokio::time::sleep(pause_after(held, LONGEST_PAUSE)).await;
        }
        report.removed.agent_sessions = self.prune_sessions(&cutoff, dry_run, &mut report).await?;
        report.removed.reactions = self.prune_reactions(&cutoff, dry_run, &mut report).await?;
        report.removed.permission_requests = self
            .prune_rows(
                ("permission_requests", "id"),
                permission_finished_before!("?1"),
                &cutoff,
                dry_run,
                &mut report,
            )
            .await?;
        report.removed.operator_questions = self
            .prune_rows(
                ("operator_questions", "id"),
                question_finished_before!("?1"),
                &cutoff,
                dry_run,
                &mut report,
            )
            .await?;
        report.pages_after = self.pages().await?;
        report.took = started.elapsed();
        Ok(report)
    }

    async fn pages(&self) -> LedgerResult<Pages> {
        self.read_in_place(|db| {
            let pragma = |name: &str| -> rusqlite::Result<u64> {
                db.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0)).map(|n| n.max(0) as u64)
            };
            Ok(Pages {
                page_size: pragma("page_size")?,
                page_count: pragma("page_count")?,
                free_pages: pragma("freelist_count")?,
            })
        })
        .await
    }
}

impl SqliteLedger {
    /// Sessions that ended before the cutoff, all but the newest.
    async fn prune_sessions(
        &self,
        cutoff: &str,
        dry_run: bool,
        report: &mut PruneReport,
    ) -> LedgerResult<u64> {
        const ENDED: &str = "disconnected_at IS NOT NULL AND disconnected_at < ?1 \
             AND rowid <> (SELECT rowid FROM agent_sessions ORDER BY connected_at DESC, rowid DESC LIMIT 1)";
        self.prune_rows(("agent_sessions", "rowid"), ENDED, cutoff, dry_run, report).await
    }

    /// Reactions given to a session, or kept for audit only, before the cutoff: rows of
    /// their own, referenced by nothing. One still owed to an agent stays, and the newest.
    async fn prune_reactions(
        &self,
        cutoff: &str,
        dry_run: bool,
        report: &mut PruneReport,
    ) -> LedgerResult<u64> {
        self.prune_rows(("reactions", "id"), reaction_done_before!("?1"), cutoff, dry_run, report).await
    }

    /// The rows of `table` (a table referenced by nothing, keyed by `key`) that `finished`
    /// picks, `?1` being the cutoff: counted on a dry run, else deleted [`BATCH_SESSIONS`]
    /// at a time, the writer released between batches. Each batch's hold of the writer is
    /// counted in the report's batch figures, the last one (which finds less than a
    /// batch, often nothing) too: its search held the writer as long.
    async fn prune_rows(
        &self,
        (table, key): (&str, &str),
        finished: &str,
        cutoff: &str,
        dry_run: bool,
        report: &mut PruneReport,
    ) -> LedgerResult<u64> {
        if dry_run {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE {finished}");
            let count: i64 = self.read_in_place(|db| db.query_row(&sql, [cutoff], |r| r.get(0))).await?;
            return Ok(count.max(0) as u64);
        }
        let sql = delete_rows_sql(table, key, finished);
        let mut removed = 0;
        loop {
            let mut lock_taken = None;
            let deleted = self
                .write_in_place(|db| {
                    lock_taken = Some(Instant::now());
                    db.execute(&sql, rusqlite::params![cutoff, BATCH_SESSIONS])
                })
                .await?;
            let held = lock_taken.map(|at| at.elapsed()).unwrap_or_default();
            report.held_for(held);
            removed += deleted as u64;
            if (deleted as i64) < BATCH_SESSIONS {
                return Ok(removed);
            }
            tokio::time::sleep(pause_after(held, LONGEST_PAUSE)).await;
        }
    }
}

/// One batch of [`SqliteLedger::prune_rows`]: `?1` the cutoff, `?2` the batch's size.
fn delete_rows_sql(table: &str, key: &str, finished: &str) -> String {
    format!("DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {finished} LIMIT ?2)")
}

/// Whether the window holds an envelope that finished before the cutoff.
fn any_finished(
    db: &rusqlite::Connection,
    (after, up_to): (i64, i64),
    cutoff: &str,
) -> rusqlite::Result<bool> {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM envelopes WHERE id > ?1 AND id <= ?2 \
         AND state IN ({}) AND state_changed_at < ?3)",
        final_states_sql()
    );
    db.prepare_cached(&sql)?.query_row(rusqlite::params![after, up_to, cutoff], |r| r.get(0))
}

/// A JSON array of ids, for `IN (SELECT value FROM json_each(?))`.
fn json_ids<'a>(ids: impl IntoIterator<Item = &'a i64>) -> String {
    let ids: Vec<String> = ids.into_iter().map(i64::to_string).collect();
    format!("[{}]", ids.join(","))
}

fn newest(db: &rusqlite::Connection) -> rusqlite::Result<Newest> {
    let one = |sql: &str| -> rusqlite::Result<Option<i64>> { query_row_cached(db, sql, [], |r| r.get(0)) };
    let envelopes = [
        one("SELECT MAX(id) FROM envelopes")?,
        one("SELECT MAX(envelope_id) FROM attempts WHERE id = (SELECT MAX(id) FROM attempts)")?,
        one("SELECT MAX(envelope_id) FROM envelope_events WHERE id = (SELECT MAX(id) FROM envelope_events)")?,
    ];
    Ok(Newest {
        envelopes: envelopes.into_iter().flatten().collect(),
        handoff: one("SELECT MAX(id) FROM handoffs")?,
        cascade: one("SELECT MAX(id) FROM cascades")?,
        turn: one("SELECT MAX(id) FROM cascade_turns")?,
        post: one("SELECT MAX(id) FROM room_posts")?,
        task: one("SELECT MAX(id) FROM tasks")?,
        revision: one("SELECT MAX(id) FROM task_revisions")?,
    })
}

/// What a batch has loaded so far.
#[derive(Default)]
struct Gathered {
    facts: BatchFacts,
    handoffs: HashSet<i64>,
    cascades: HashSet<i64>,
    task_posts: HashSet<i64>,
    tasks: HashSet<String>,
}

/// The facts of the window's finished envelopes and of what reaches them, and the
/// decision on them.
fn gather_and_decide(
    db: &rusqlite::Connection,
    window: (i64, i64),
    cutoff: &str,
) -> rusqlite::Result<Doomed> {
    let newest = newest(db)?;
    let seed_sql = format!(
        "SELECT id FROM envelopes WHERE id > ?1 AND id <= ?2 AND state IN ({}) AND state_changed_at < ?3",
        final_states_sql()
    );
    let seeds: Vec<i64> = db
        .prepare_cached(&seed_sql)?
        .query_map(rusqlite::params![window.0, window.1, cutoff], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut gathered = Gathered::default();
    let mut envelopes: BTreeSet<i64> = seeds.iter().copied().collect();
    let mut frontier = seeds;
    for round in 0..=EXPANSION_ROUNDS {
        let reached = discover(db, &frontier, cutoff, &newest, &mut gathered)?;
        // The last round only looks: what references the envelopes reached so far is
        // loaded, so that a row outside the batch keeps what it points at.
        if round == EXPANSION_ROUNDS {
            break;
        }
        frontier = reached.into_iter().filter(|id| envelopes.insert(*id)).collect();
        if frontier.is_empty() {
            break;
        }
    }
    gathered.facts.envelopes = envelope_facts(db, &envelopes, cutoff, &newest)?;
    Ok(retention::decide(&gathered.facts))
}

fn envelope_facts(
    db: &rusqlite::Connection,
    ids: &BTreeSet<i64>,
    cutoff: &str,
    newest: &Newest,
) -> rusqlite::Result<Vec<EnvelopeFacts>> {
    query_all_cached(
        db,
        concat!(
            "SELECT ",
            envelope_facts_columns!("?2"),
            " FROM envelopes e WHERE e.id IN (SELECT value FROM json_each(?1))"
        ),
        rusqlite::params![json_ids(ids), cutoff],
        |r| {
            let id: i64 = r.get(0)?;
            Ok(EnvelopeFacts {
                id,
                state: text_enum(r, "state")?,
                settled_before_cutoff: r.get(2)?,
                task: r.get(3)?,
                unreconciled_attempt: r.get(4)?,
                holds_newest: newest.envelopes.contains(&id),
            })
        },
    )
}

/// Loads every row not loaded yet that references an envelope of `frontier`, whole (a
/// cascade with its turns and posts, a task with its revisions and envelopes): the
/// envelopes those rows reference.
fn discover(
    db: &rusqlite::Connection,
    frontier: &[i64],
    cutoff: &str,
    newest: &Newest,
    gathered: &mut Gathered,
) -> rusqlite::Result<BTreeSet<i64>> {
    let mut reached = BTreeSet::new();
    if frontier.is_empty() {
        return Ok(reached);
    }
    let ids = json_ids(frontier);
    let handoffs = query_all_cached(
        db,
        "SELECT id, state <> 'open' AND COALESCE(closed_at, opened_at) < ?2, cause_envelope_id, envelope_id, answer_envelope_id \
         FROM handoffs WHERE cause_envelope_id IN (SELECT value FROM json_each(?1)) \
           OR envelope_id IN (SELECT value FROM json_each(?1)) OR answer_envelope_id IN (SELECT value FROM json_each(?1))",
        rusqlite::params![ids, cutoff],
        |r| {
            let id = r.get(0)?;
            Ok(HandoffFacts {
                id,
                ended_before_cutoff: r.get(1)?,
                is_newest: newest.handoff == Some(id),
                cause: r.get(2)?,
                envelope: r.get(3)?,
                answer: r.get(4)?,
            })
        },
    )?;
    for handoff in handoffs {
        if gathered.handoffs.insert(handoff.id) {
            reached.extend(handoff.cause.into_iter().chain([handoff.envelope]).chain(handoff.answer));
            gathered.facts.handoffs.push(handoff);
        }
    }

    let cascades: Vec<i64> = query_all_cached(
        db,
        "SELECT id FROM cascades WHERE message_envelope_id IN (SELECT value FROM json_each(?1)) \
         UNION SELECT cascade_id FROM cascade_turns WHERE envelope_id IN (SELECT value FROM json_each(?1)) \
         UNION SELECT cascade_id FROM room_posts WHERE envelope_id IN (SELECT value FROM json_each(?1)) AND cascade_id IS NOT NULL",
        [&ids],
        |r| r.get(0),
    )?;
    for id in cascades {
        if gathered.cascades.insert(id) {
            let cascade = cascade_facts(db, id, cutoff, newest)?;
            reached.extend(&cascade.envelopes);
            gathered.facts.cascades.push(cascade);
        }
    }

    let posts = query_all_cached(
        db,
        "SELECT id, state = 'made' AND COALESCE(made_at, created_at) < ?2, envelope_id FROM room_posts \
         WHERE envelope_id IN (SELECT value FROM json_each(?1)) AND cascade_id IS NULL",
        rusqlite::params![ids, cutoff],
        |r| {
            let id = r.get(0)?;
            Ok(PostFacts {
                id,
                made_before_cutoff: r.get(1)?,
                is_newest: newest.post == Some(id),
                envelope: r.get(2)?,
            })
        },
    )?;
    for post in posts {
        if gathered.task_posts.insert(post.id) {
            reached.insert(post.envelope);
            gathered.facts.task_posts.push(post);
        }
    }

    let tasks: Vec<String> = query_all_cached(
        db,
        "SELECT task_id FROM envelopes WHERE id IN (SELECT value FROM json_each(?1)) AND task_id IS NOT NULL \
         UNION SELECT task_id FROM tasks WHERE first_envelope_id IN (SELECT value FROM json_each(?1)) \
           OR act_on_envelope_id IN (SELECT value FROM json_each(?1)) OR cancel_envelope_id IN (SELECT value FROM json_each(?1)) \
         UNION SELECT task_id FROM task_revisions WHERE envelope_id IN (SELECT value FROM json_each(?1))",
        [&ids],
        |r| r.get(0),
    )?;
    for task_id in tasks {
        if gathered.tasks.insert(task_id.clone())
            && let Some(task) = task_facts(db, &task_id, cutoff, newest)?
        {
            // A task that cannot go keeps what it references; nothing to look into.
            if task.may_go() {
                reached.extend(task.owned.iter().chain(&task.referenced));
            }
            gathered.facts.tasks.push(task);
        }
    }
    Ok(reached)
}

fn cascade_facts(
    db: &rusqlite::Connection,
    id: i64,
    cutoff: &str,
    newest: &Newest,
) -> rusqlite::Result<CascadeFacts> {
    let cascade: (bool, i64) = query_row_cached(
        db,
        "SELECT state IN ('stopped', 'completed', 'budget_exhausted') AND COALESCE(ended_at, updated_at) < ?2, \
           message_envelope_id FROM cascades WHERE id = ?1",
        rusqlite::params![id, cutoff],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let turns: Vec<CascadePart> = query_all_cached(
        db,
        "SELECT id, envelope_id, ended_at IS NOT NULL FROM cascade_turns WHERE cascade_id = ?1",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let posts: Vec<CascadePart> = query_all_cached(
        db,
        "SELECT id, envelope_id, state = 'owed' FROM room_posts WHERE cascade_id = ?1",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(cascade_facts_from(id, cascade, &turns, &posts, newest))
}

fn task_facts(
    db: &rusqlite::Connection,
    task_id: &str,
    cutoff: &str,
    newest: &Newest,
) -> rusqlite::Result<Option<TaskFacts>> {
    let task: Option<TaskRow> = query_row_cached(
        db,
        concat!(
            "SELECT id, ",
            closed_before!("?2"),
            ", first_envelope_id, act_on_envelope_id, cancel_envelope_id FROM tasks WHERE task_id = ?1"
        ),
        rusqlite::params![task_id, cutoff],
        |r| {
            let closed_before_cutoff: bool = r.get(1)?;
            let (act_on, cancel): (Option<i64>, Option<i64>) = (r.get(3)?, r.get(4)?);
            Ok((r.get::<_, i64>(0)?, closed_before_cutoff, r.get::<_, i64>(2)?, act_on, cancel))
        },
    )
    .optional()?;
    // An envelope names a task that is not there: its envelopes stay (the rule keeps an
    // envelope whose task it is not shown).
    let Some(task) = task else { return Ok(None) };
    let revisions: Vec<(i64, Option<i64>)> = query_all_cached(
        db,
        "SELECT id, envelope_id FROM task_revisions WHERE task_id = ?1",
        [task_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let mut facts = task_facts_from(task_id, task, &revisions, newest);
    if facts.may_go() {
        facts.owned =
            query_all_cached(db, "SELECT id FROM envelopes WHERE task_id = ?1", [task_id], |r| r.get(0))?;
    }
    Ok(Some(facts))
}

/// Deletes what was decided, children before parents: every foreign key holds after each
/// statement (SQLite checks them per statement).
fn delete_doomed(db: &rusqlite::Connection, doomed: &Doomed) -> rusqlite::Result<Pruned> {
    if doomed.is_empty() {
        return Ok(Pruned::default());
    }
    let envelopes = json_ids(&doomed.envelopes);
    let cascades = json_ids(&doomed.cascades);
    let tasks = json_ids(&doomed.tasks);
    let delete =
        |sql: &str, ids: &str| -> rusqlite::Result<u64> { execute_cached(db, sql, [ids]).map(|n| n as u64) };
    let task_revisions = delete(
        "DELETE FROM task_revisions WHERE task_id IN (SELECT task_id FROM tasks WHERE id IN (SELECT value FROM json_each(?1)))",
        &tasks,
    )?;
    let tasks = delete("DELETE FROM tasks WHERE id IN (SELECT value FROM json_each(?1))", &tasks)?;
    let room_posts =
        delete("DELETE FROM room_posts WHERE cascade_id IN (SELECT value FROM json_each(?1))", &cascades)?
            + delete(
                "DELETE FROM room_posts WHERE id IN (SELECT value FROM json_each(?1))",
                &json_ids(&doomed.task_posts),
            )?;
    let cascade_turns =
        delete("DELETE FROM cascade_turns WHERE cascade_id IN (SELECT value FROM json_each(?1))", &cascades)?;
    let cascades = delete("DELETE FROM cascades WHERE id IN (SELECT value FROM json_each(?1))", &cascades)?;
    let handoffs = delete(
        "DELETE FROM handoffs WHERE id IN (SELECT value FROM json_each(?1))",
        &json_ids(&doomed.handoffs),
    )?;
    let attempts =
        delete("DELETE FROM attempts WHERE envelope_id IN (SELECT value FROM json_each(?1))", &envelopes)?;
    let envelope_events = delete(
        "DELETE FROM envelope_events WHERE envelope_id IN (SELECT value FROM json_each(?1))",
        &envelopes,
    )?;
    let envelopes =
        delete("DELETE FROM envelopes WHERE id IN (SELECT value FROM json_each(?1))", &envelopes)?;
    Ok(Pruned {
        envelopes,
        attempts,
        envelope_events,
        handoffs,
        cascades,
        cascade_turns,
        room_posts,
        tasks,
        task_revisions,
        ..Pruned::default()
    })
}

/// What [`delete_doomed`] would delete, counted.
fn count_doomed(db: &rusqlite::Connection, doomed: &Doomed) -> rusqlite::Result<Pruned> {
    if doomed.is_empty() {
        return Ok(Pruned::default());
    }
    let envelopes = json_ids(&doomed.envelopes);
    let cascades = json_ids(&doomed.cascades);
    let tasks = json_ids(&doomed.tasks);
    let count = |sql: &str, ids: &str| -> rusqlite::Result<u64> {
        query_row_cached(db, sql, [ids], |r| r.get::<_, i64>(0)).map(|n| n as u64)
    };
    Ok(Pruned {
        envelopes: doomed.envelopes.len() as u64,
        attempts: count(
            "SELECT COUNT(*) FROM attempts WHERE envelope_id IN (SELECT value FROM json_each(?1))",
            &envelopes,
        )?,
        envelope_events: count(
            "SELECT COUNT(*) FROM envelope_events WHERE envelope_id IN (SELECT value FROM json_each(?1))",
            &envelopes,
        )?,
        handoffs: doomed.handoffs.len() as u64,
        cascades: doomed.cascades.len() as u64,
        cascade_turns: count(
            "SELECT COUNT(*) FROM cascade_turns WHERE cascade_id IN (SELECT value FROM json_each(?1))",
            &cascades,
        )?,
        room_posts: doomed.task_posts.len() as u64
            + count(
                "SELECT COUNT(*) FROM room_posts WHERE cascade_id IN (SELECT value FROM json_each(?1))",
                &cascades,
            )?,
        tasks: doomed.tasks.len() as u64,
        task_revisions: count(
            "SELECT COUNT(*) FROM task_revisions WHERE task_id IN (SELECT task_id FROM tasks WHERE id IN (SELECT value FROM json_each(?1)))",
            &tasks,
        )?,
        ..Pruned::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::ledger::prune_batches::MAX_BATCH_ENVELOPES;

    const OLD: &str = "2020-01-01T00:00:00.000Z";
    const RECENT: &str = "2999-01-01T00:00:00.000Z";

    async fn ledger() -> (tempfile::TempDir, SqliteLedger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
        (dir, ledger)
    }

    fn envelope(db: &rusqlite::Connection, id: i64, state: &str, at: &str, task: Option<&str>) {
        db.execute(
            "INSERT INTO envelopes (id, trace_id, kind, chat_id, chat_type, message_id, sender_name, content, \
             sent_at, received_at, state, state_changed_at, task_id) \
             VALUES (?1, 'env_' || ?1, 'message', 42, 'private', ?1, 'Ann', 'hi', ?3, ?3, ?2, ?3, ?4)",
            rusqlite::params![id, state, at, task],
        )
        .unwrap();
    }

    fn attempt(db: &rusqlite::Connection, envelope: i64, outcome: &str, reconciled: Option<&str>) {
        db.execute(
            "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, \
             started_at, reconciled_outcome) \
             VALUES ('op_' || ?1 || '_' || (SELECT COUNT(*) FROM attempts), ?1, 'orch', 42, 0, 1, 'answer', ?2, ?3, ?4)",
            rusqlite::params![envelope, outcome, OLD, reconciled],
        )
        .unwrap();
    }

    fn event(db: &rusqlite::Connection, envelope: i64) {
        db.execute(
            "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) VALUES (?1, ?2, 'pending', 'acked', 'daemon')",
            rusqlite::params![envelope, OLD],
        )
        .unwrap();
    }

    fn handoff(
        db: &rusqlite::Connection,
        id: i64,
        state: &str,
        cause: i64,
        envelope: i64,
        answer: Option<i64>,
    ) {
        db.execute(
            "INSERT INTO handoffs (id, handoff_id, from_agent, to_agent, instruction, cause_envelope_id, depth, \
             envelope_id, answer_envelope_id, state, opened_at, closed_at) \
             VALUES (?1, 'hof_' || ?1, 'orch', 'worker', 'do it', ?2, 1, ?3, ?4, ?5, ?6, ?6)",
            rusqlite::params![id, cause, envelope, answer, state, OLD],
        )
        .unwrap();
    }

    fn cascade(db: &rusqlite::Connection, id: i64, state: &str, message: i64, turn: i64, post: Option<&str>) {
        db.execute(
            "INSERT INTO cascades (id, cascade_id, route, chat_id, message_envelope_id, state, cascade, max_iters, \
             speaker_timeout_secs, created_at, ended_at, updated_at) \
             VALUES (?1, 'cas_' || ?1, 'room', 7, ?2, ?3, '{}', 3, 60, ?4, ?4, ?4)",
            rusqlite::params![id, message, state, OLD],
        )
        .unwrap();
        db.execute(
            "INSERT INTO cascade_turns (cascade_id, speaker, agent, summoned_by, envelope_id, started_at, ended_at, ending) \
             VALUES (?1, 1, 'orch', 'Ann', ?2, ?3, ?3, 'replied')",
            rusqlite::params![id, turn, OLD],
        )
        .unwrap();
        if let Some(state) = post {
            db.execute(
                "INSERT INTO room_posts (key, cascade_id, envelope_id, route, chat_id, text, state, created_at, made_at) \
                 VALUES ('cas_' || ?1 || '/outcome', ?1, ?2, 'room', 7, 'done', ?3, ?4, ?4)",
                rusqlite::params![id, message, state, OLD],
            )
            .unwrap();
        }
    }

    fn task(db: &rusqlite::Connection, id: i64, state: &str, first: i64, revision_envelope: i64) {
        let closed = (state == "done").then_some(OLD);
        db.execute(
            "INSERT INTO tasks (id, task_id, chat_id, agent, route, state, revision, objective, first_envelope_id, \
             started_by, started_source, opened_at, updated_at, closed_at) \
             VALUES (?1, 'task_' || ?1, 42, 'orch', 'dm', ?2, 2, 'work', ?3, 'Ann', 'message', ?4, ?4, ?5)",
            rusqlite::params![id, state, first, OLD, closed],
        )
        .unwrap();
        db.execute(
            "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, envelope_id) \
             VALUES ('task_' || ?1, 2, 'correction', 'message', 'Ann', ?2, 'fix', ?3)",
            rusqlite::params![id, OLD, revision_envelope],
        )
        .unwrap();
    }

    fn session(db: &rusqlite::Connection, id: &str, connected: &str, disconnected: Option<&str>) {
        db.execute(
            "INSERT INTO agent_sessions (id, agent, connected_at, disconnected_at) VALUES (?1, 'orch', ?2, ?3)",
            rusqlite::params![id, connected, disconnected],
        )
        .unwrap();
    }

    async fn ids(ledger: &SqliteLedger, sql: &'static str) -> Vec<i64> {
        ledger.read_in_place(|db| query_all_cached(db, sql, [], |r| r.get(0))).await.unwrap()
    }

    async fn consistent(ledger: &SqliteLedger) {
        let problems: Vec<String> = ledger
            .read_in_place(|db| {
                query_all_cached(db, "PRAGMA foreign_key_check", [], |r| r.get::<_, String>(0))
            })
            .await
            .unwrap();
        assert_eq!(problems, Vec::<String>::new(), "rows reference rows that are gone");
    }

    /// One of each row that must stay, and old finished rows that must go.
    async fn one_of_each(ledger: &SqliteLedger) {
        ledger
            .write_in_place(|db| {
                envelope(db, 1, "acked", OLD, None);
                attempt(db, 1, "sent", None);
                event(db, 1);
                event(db, 1);
                envelope(db, 2, "queued", OLD, None);
                envelope(db, 3, "pending", OLD, None);
                envelope(db, 4, "unresolved", OLD, None);
                attempt(db, 4, "unknown", None);
                envelope(db, 5, "acked", OLD, None);
                envelope(db, 6, "acked", OLD, None);
                attempt(db, 6, "unknown", Some("sent"));
                envelope(db, 7, "acked", RECENT, None);
                // An open handoff keeps its cause and its instruction.
                envelope(db, 8, "acked", OLD, None);
                envelope(db, 9, "acked", OLD, None);
                handoff(db, 1, "open", 8, 9, None);
                // An answered one goes with its three envelopes.
                for id in 10..=12 {
                    envelope(db, id, "acked", OLD, None);
                }
                handoff(db, 2, "answered", 10, 11, Some(12));
                // The newest handoff stays, whatever its state.
                handoff(db, 3, "closed", 8, 9, None);
                // A running cascade keeps its message and its turn's envelope.
                envelope(db, 13, "acked", OLD, None);
                envelope(db, 14, "acked", OLD, None);
                cascade(db, 1, "running", 13, 14, None);
                // A completed one, whose post was made, goes with them.
                envelope(db, 15, "acked", OLD, None);
                envelope(db, 16, "acked", OLD, None);
                cascade(db, 2, "completed", 15, 16, Some("made"));
                // A completed one that still owes its post stays.
                envelope(db, 26, "acked", OLD, None);
                envelope(db, 27, "acked", OLD, None);
                cascade(db, 3, "completed", 26, 27, Some("owed"));
                // An open task with work pending keeps its envelopes; a done one goes with them.
                envelope(db, 17, "acked", OLD, Some("task_1"));
                envelope(db, 28, "pending", OLD, Some("task_1"));
                task(db, 1, "open", 17, 28);
                envelope(db, 18, "acked", OLD, Some("task_2"));
                envelope(db, 19, "superseded", OLD, Some("task_2"));
                task(db, 2, "done", 18, 19);
                for (id, state) in [(20, "unrouted"), (21, "rejected"), (22, "ignored"), (23, "undecodable")]
                {
                    envelope(db, id, state, OLD, None);
                }
                envelope(db, 24, "superseded", OLD, None);
                // The newest attempt's envelope (5) and the newest envelope (29) stay.
                attempt(db, 5, "sent", None);
                envelope(db, 29, "acked", OLD, None);
                event(db, 29);
                // A recent task, the newest, keeps everything of its own.
                task(db, 3, "done", 7, 7);
                session(db, "s1", OLD, Some(OLD));
                session(db, "s2", OLD, None);
                session(db, "s3", "2020-01-02T00:00:00.000Z", Some(OLD));
                // Reactions: given long ago, ignored long ago, and still owed (stays).
                for (update_id, state, delivered) in [(1, "delivered", Some(OLD)), (2, "ignored", None), (3, "owed", None)] {
                    db.execute(
                        "INSERT INTO reactions (update_id, update_digest, chat_id, message_id, user, emoji, reacted_at, \
                         received_at, agent, state, delivered_at) VALUES (?1, 'd', 1, 1, 'u', '👍', ?2, ?2, 'orch', ?3, ?4)",
                        rusqlite::params![update_id, OLD, state, delivered],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
    }

    /// The reactions' batch searches the reactions done before the cutoff by an index, not
    /// the whole table under the writer: the plan of the statement the prune runs reads
    /// `reactions` only through an index.
    #[tokio::test]
    async fn the_reactions_batch_searches_the_old_done_reactions_by_an_index() {
        let (_dir, ledger) = ledger().await;
        let sql =
            format!("EXPLAIN QUERY PLAN {}", delete_rows_sql("reactions", "id", reaction_done_before!("?1")));
        let plan: Vec<String> = ledger
            .read_in_place(move |db| {
                db.prepare(&sql)?
                    .query_map(rusqlite::params![OLD, BATCH_SESSIONS], |r| r.get::<_, String>(3))?
                    .collect()
            })
            .await
            .unwrap();
        assert!(plan.iter().any(|step| step.contains("USING INDEX reactions_done_at")), "{plan:#?}");
        let scans = plan.iter().filter(|step| step.starts_with("SCAN reactions"));
        assert_eq!(scans.count(), 0, "no step reads the whole table: {plan:#?}");
    }

    #[tokio::test]
    async fn a_prune_removes_what_finished_and_keeps_everything_open_unreconciled_or_newest() {
        let (_dir, ledger) = ledger().await;
        one_of_each(&ledger).await;
        let cutoff = Utc::now();
        let dry = ledger.prune(cutoff, true).await.unwrap();
        let expected = Pruned {
            envelopes: 14,
            attempts: 2,
            envelope_events: 2,
            handoffs: 1,
            cascades: 1,
            cascade_turns: 1,
            room_posts: 1,
            tasks: 1,
            task_revisions: 1,
            agent_sessions: 1,
            reactions: 2,
            ..Pruned::default()
        };
        assert_eq!(dry.removed, expected);
        assert_eq!(ids(&ledger, "SELECT COUNT(*) FROM envelopes").await, [28], "a dry run deletes nothing");

        let report = ledger.prune(cutoff, false).await.unwrap();
        assert_eq!(report.removed, expected);
        assert_eq!(
            ids(&ledger, "SELECT id FROM envelopes ORDER BY id").await,
            [2, 3, 4, 5, 7, 8, 9, 13, 14, 17, 26, 27, 28, 29]
        );
        assert_eq!(ids(&ledger, "SELECT envelope_id FROM attempts ORDER BY id").await, [4, 5]);
        assert_eq!(ids(&ledger, "SELECT id FROM handoffs ORDER BY id").await, [1, 3]);
        assert_eq!(ids(&ledger, "SELECT id FROM cascades ORDER BY id").await, [1, 3]);
        assert_eq!(ids(&ledger, "SELECT id FROM tasks ORDER BY id").await, [1, 3]);
        assert_eq!(ids(&ledger, "SELECT COUNT(*) FROM agent_sessions").await, [2]);
        assert_eq!(ids(&ledger, "SELECT update_id FROM reactions").await, [3], "the owed reaction stays");
        consistent(&ledger).await;
        // Nothing is left that may go.
        assert_eq!(ledger.prune(cutoff, false).await.unwrap().removed, Pruned::default());
    }

    #[tokio::test]
    async fn an_idle_open_task_goes_with_its_envelopes_and_revisions_once_all_settled_before_the_cutoff() {
        let (_dir, ledger) = ledger().await;
        ledger
            .write_in_place(|db| {
                // A one-off conversation: answered long ago, never marked done (no next
                // message came).
                envelope(db, 1, "acked", OLD, Some("task_1"));
                envelope(db, 2, "acked", OLD, Some("task_1"));
                task(db, 1, "open", 1, 2);
                // Idle too, but its last envelope settled after the cutoff.
                envelope(db, 3, "acked", OLD, Some("task_2"));
                envelope(db, 4, "acked", RECENT, Some("task_2"));
                task(db, 2, "open", 3, 4);
                // The newest rows of these tables are elsewhere.
                envelope(db, 5, "acked", RECENT, None);
                task(db, 3, "done", 5, 5);
                Ok(())
            })
            .await
            .unwrap();
        let cutoff = "2500-01-01T00:00:00Z".parse().unwrap();
        let removed = ledger.prune(cutoff, false).await.unwrap().removed;
        assert_eq!((removed.tasks, removed.task_revisions, removed.envelopes), (1, 1, 2));
        assert_eq!(ids(&ledger, "SELECT id FROM tasks ORDER BY id").await, [2, 3]);
        assert_eq!(ids(&ledger, "SELECT id FROM envelopes ORDER BY id").await, [3, 4, 5]);
        consistent(&ledger).await;
    }

    /// Six tasks, each replaced by the next with `/new`: the `/new` message is made under
    /// the task it starts and recorded as the end of the one it replaces (its act-on
    /// envelope and its last revision's). Each task far from the next, so that no batch
    /// sees the chain whole (a batch reaches two tasks either way of its own).
    #[tokio::test]
    async fn a_long_chain_of_tasks_replaced_with_new_goes_whole() {
        const CHAIN: i64 = 6;
        let (_dir, ledger) = ledger().await;
        let gap = MAX_BATCH_ENVELOPES + 100;
        let start = |n: i64| (n - 1) * gap + 1;
        let last = CHAIN * gap + 1;
        ledger
            .write_in_place(|db| {
                for id in 1..=last {
                    let n = (id - 1) / gap + 1;
                    // Each task's first envelope and the one after it are made under it.
                    let task = (n <= CHAIN && id - start(n) < 2).then(|| format!("task_{n}"));
                    envelope(db, id, "acked", OLD, task.as_deref());
                }
                for n in 1..=CHAIN {
                    let (state, successor) = if n < CHAIN { ("replaced", Some(start(n + 1))) } else { ("done", None) };
                    db.execute(
                        "INSERT INTO tasks (id, task_id, chat_id, agent, route, state, revision, objective, \
                         first_envelope_id, act_on_envelope_id, started_by, started_source, opened_at, updated_at, \
                         closed_at) VALUES (?1, 'task_' || ?1, 42, 'orch', 'dm', ?2, 2, 'work', ?3, ?4, 'Ann', \
                         'command', ?5, ?5, ?5)",
                        rusqlite::params![n, state, start(n), successor, OLD],
                    )?;
                    db.execute(
                        "INSERT INTO task_revisions (task_id, revision, kind, source, actor, at, summary, envelope_id) \
                         VALUES ('task_' || ?1, 2, 'new_objective', 'command', 'Ann', ?2, 'new', ?3)",
                        rusqlite::params![n, OLD, successor.unwrap_or(start(n) + 1)],
                    )?;
                }
                // The newest task and revision are elsewhere.
                task(db, CHAIN + 1, "open", last, last);
                Ok(())
            })
            .await
            .unwrap();
        let report = ledger.prune(Utc::now(), false).await.unwrap();
        assert_eq!(
            (report.removed.tasks, report.removed.task_revisions),
            (CHAIN as u64, CHAIN as u64),
            "{:?}",
            report.removed
        );
        assert_eq!(ids(&ledger, "SELECT id FROM tasks").await, [CHAIN + 1]);
        assert_eq!(ids(&ledger, "SELECT id FROM envelopes").await, [last]);
        consistent(&ledger).await;
    }

    /// A task that cannot go (open, with work pending) is read without the envelopes made
    /// under it: a long conversation's history is not one batch.
    #[tokio::test]
    async fn a_task_that_cannot_go_is_read_without_its_envelopes() {
        let (_dir, ledger) = ledger().await;
        ledger
            .write_in_place(|db| {
                for id in 1..=50 {
                    envelope(db, id, "acked", OLD, Some("task_1"));
                }
                envelope(db, 51, "pending", OLD, Some("task_1"));
                task(db, 1, "open", 1, 2);
                task(db, 2, "done", 51, 51);
                Ok(())
            })
            .await
            .unwrap();
        let facts = ledger
            .read_in_place(|db| {
                let newest = newest(db)?;
                task_facts(db, "task_1", "2500-01-01T00:00:00Z", &newest)
            })
            .await
            .unwrap()
            .unwrap();
        assert!(!facts.closed_before_cutoff);
        assert_eq!((facts.owned, facts.referenced), (vec![], vec![1, 2]));
    }

    #[tokio::test]
    async fn what_belongs_together_goes_together_across_batches() {
        let (_dir, ledger) = ledger().await;
        let far = 3 * MAX_BATCH_ENVELOPES;
        ledger
            .write_in_place(|db| {
                for id in 1..=far {
                    let task = (id == 10 || id == far - 10).then_some("task_1");
                    envelope(db, id, "acked", OLD, task);
                    attempt(db, id, "sent", None);
                }
                task(db, 1, "done", 10, far - 10);
                // The newest rows of these tables are elsewhere.
                task(db, 2, "open", far, far);
                Ok(())
            })
            .await
            .unwrap();
        let report = ledger.prune(Utc::now(), false).await.unwrap();
        assert_eq!(report.removed.tasks, 1);
        assert_eq!(report.removed.envelopes, (far - 1) as u64);
        assert_eq!(ids(&ledger, "SELECT id FROM envelopes").await, [far]);
        assert!(report.batches >= 3, "{:?}", report.batch_holds);
        consistent(&ledger).await;
    }
}
