//! Retention (DESIGN §17, issue 26) on PostgreSQL: what SQLite's prune does
//! (`sqlite/prune.rs`, whose documentation says how a batch gathers its facts), in the same
//! batches (`ledger::prune_batches`), each its own transaction.
//!
//! **Batches.** SQLite's batches are short and paced, because each holds the one writer
//! every other write waits for. Here a batch locks only the finished envelopes it decided
//! on, which no live replica writes, so batches aim at [`TARGET_HOLD`] (ten times
//! SQLite's), and follow each other after [`MIN_PAUSE`] only: each batch makes a dozen
//! round trips to the server, and short paced ones spent most of a prune waiting.
//!
//! **Beside live replicas.** SQLite's one writer keeps every other write out of a batch.
//! Here a batch decides once on what it reads, takes what it decided on `FOR UPDATE` (the
//! open tasks' conversations first, see [`lock_and_decide`]), and decides again on facts
//! read after the locks: a reply, a transition or a handoff being recorded on one of those
//! envelopes at that moment waits for the batch, and then finds the envelope still there
//! (it was kept) or gone (its write fails and changes nothing; nothing had been sent). A
//! batch never deletes a row that came in before it read its facts the second time, and
//! one that comes in later waits for it. A dry run locks nothing.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::PgLedger;
use super::rows::text_enum;
use super::tasks::hold_conversations;
use crate::ledger::columns::{
    closed_before, envelope_facts_columns, permission_finished_before, question_finished_before,
    reaction_done_before,
};
use crate::ledger::prelude::*;
use crate::ledger::prune_batches::{
    AlreadyCounted, BATCH_ENVELOPES, BATCH_SESSIONS, CascadePart, MIN_PAUSE, Newest, TaskRow,
    cascade_facts_from, final_states_sql, next_batch_envelopes_for, task_facts_from,
};
use crate::ledger::task_rows::Conversation;
use crate::ledger::{LedgerResult, Pages, PruneReport, Pruned};
use crate::rules::retention::{
    self, BatchFacts, CascadeFacts, Doomed, EnvelopeFacts, HandoffFacts, PostFacts, TaskFacts,
};

/// How long a batch should take (see the module documentation).
const TARGET_HOLD: Duration = Duration::from_millis(200);

/// How many times a batch follows references out of its window (see SQLite's).
const EXPANSION_ROUNDS: usize = 2;

#[async_trait]
impl Retention for PgLedger {
    async fn prune(&self, finished_before: DateTime<Utc>, dry_run: bool) -> LedgerResult<PruneReport> {
        let started = Instant::now();
        let mut report = PruneReport { pages_before: self.pages().await?, ..PruneReport::default() };
        // Envelopes stored after the prune began are newer than any cutoff in the past.
        let last_id: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM envelopes").fetch_one(&self.pool).await?;
        let mut counted = AlreadyCounted::default();
        let mut after = 0;
        let mut batch_envelopes = BATCH_ENVELOPES;
        while after < last_id {
            let window = (after, after + batch_envelopes);
            after += batch_envelopes;
            // A window with nothing finished in it costs a read, not a transaction.
            let mut connection = self.pool.acquire().await?;
            if !any_finished(&mut connection, window, finished_before).await? {
                continue;
            }
            drop(connection);
            let held_from = Instant::now();
            let mut tx = self.begin().await?;
            let doomed = if dry_run {
                gather_and_decide(&mut tx, window, finished_before).await?
            } else {
                lock_and_decide(&mut tx, window, finished_before).await?
            };
            let removed = if dry_run {
                let new = counted.leave_out(&doomed);
                let removed = count_doomed(&mut tx, &new).await?;
                counted.note(&new);
                tx.rollback().await?;
                removed
            } else {
                let removed = delete_doomed(&mut tx, &doomed).await?;
                let committing = Instant::now();
                tx.commit().await?;
                report.batch_commits.push(committing.elapsed());
                removed
            };
            let held = held_from.elapsed();
            if removed.total() > 0 {
                report.batches += 1;
                if removed.envelopes > 0 {
                    tracing::debug!(envelopes = removed.envelopes, up_to_id = window.1, "pruned a batch");
                }
            }
            report.removed.add(&removed);
            report.held_for(held);
            batch_envelopes = next_batch_envelopes_for(batch_envelopes, held, TARGET_HOLD);
            tokio::time::sleep(MIN_PAUSE).await;
        }
        report.removed.agent_sessions = self.prune_sessions(finished_before, dry_run, &mut report).await?;
        report.removed.reactions = self.prune_reactions(finished_before, dry_run, &mut report).await?;
        report.removed.permission_requests = self
            .prune_rows(
                "permission_requests",
                permission_finished_before!("$1"),
                finished_before,
                dry_run,
                &mut report,
            )
            .await?;
        report.removed.operator_questions = self
            .prune_rows(
                "operator_questions",
                question_finished_before!("$1"),
                finished_before,
                dry_run,
                &mut report,
            )
            .await?;
        report.pages_after = self.pages().await?;
        report.took = started.elapsed();
        Ok(report)
    }

    /// The ledger's tables in blocks (`page_count`: heap, indexes and TOAST). PostgreSQL
    /// keeps no count of free blocks the way SQLite's freelist does (its free space map
    /// is reused in place, and `VACUUM` returns space), so `free_pages` is 0.
    async fn pages(&self) -> LedgerResult<Pages> {
        let row = sqlx::query(
            "SELECT current_setting('block_size')::bigint AS page_size, \
             COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint AS bytes \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relkind = 'r'",
        )
        .fetch_one(&self.pool)
        .await?;
        let page_size = u64::try_from(row.try_get::<i64, _>("page_size")?).unwrap_or(8192).max(1);
        let bytes = u64::try_from(row.try_get::<i64, _>("bytes")?).unwrap_or_default();
        Ok(Pages { page_size, page_count: bytes.div_ceil(page_size), free_pages: 0 })
    }
}

impl PgLedger {
    /// Sessions that ended before the cutoff, all but the newest.
    async fn prune_sessions(
        &self,
        cutoff: DateTime<Utc>,
        dry_run: bool,
        report: &mut PruneReport,
    ) -> LedgerResult<u64> {
        const ENDED: &str = "disconnected_at IS NOT NULL AND disconnected_at < $1 \
             AND id <> (SELECT id FROM agent_sessions ORDER BY connected_at DESC, id DESC LIMIT 1)";
        self.prune_rows("agent_sessions", ENDED, cutoff, dry_run, report).await
    }

    /// Reactions given to a session, or kept for audit only, before the cutoff. One still
    /// owed to an agent stays, and the newest.
    async fn prune_reactions(
        &self,
        cutoff: DateTime<Utc>,
        dry_run: bool,
        report: &mut PruneReport,
    ) -> LedgerResult<u64> {
        self.prune_rows("reactions", reaction_done_before!("$1"), cutoff, dry_run, report).await
    }

    /// The rows of `table` (referenced by nothing, keyed by `id`) that `finished` picks,
    /// `$1` being the cutoff: counted on a dry run, else deleted [`BATCH_SESSIONS`] at a
    /// time, each batch's statement counted in the report's batch figures.
    async fn prune_rows(
        &self,
        table: &'static str,
        finished: &'static str,
        cutoff: DateTime<Utc>,
        dry_run: bool,
        report: &mut PruneReport,
    ) -> LedgerResult<u64> {
        if dry_run {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE {finished}");
            let count: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(cutoff).fetch_one(&self.pool).await?;
            return Ok(count.max(0) as u64);
        }
        // `= ANY (ARRAY(…))`, not `IN (SELECT …)`: the planner joins the latter to a scan of
        // the whole table (a hash semi join), each batch; the ids of an array are looked up
        // by the primary key.
        let sql = format!(
            "DELETE FROM {table} WHERE id = ANY (ARRAY(SELECT id FROM {table} WHERE {finished} LIMIT $2))"
        );
        let mut removed = 0;
        loop {
            let started = Instant::now();
            let deleted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(cutoff)
                .bind(BATCH_SESSIONS)
                .execute(&self.pool)
                .await?
                .rows_affected();
            let held = started.elapsed();
            report.held_for(held);
            removed += deleted;
            if (deleted as i64) < BATCH_SESSIONS {
                return Ok(removed);
            }
            tokio::time::sleep(MIN_PAUSE).await;
        }
    }
}

/// Whether the window holds an envelope that finished before the cutoff.
async fn any_finished(
    db: &mut PgConnection,
    (after, up_to): (i64, i64),
    cutoff: DateTime<Utc>,
) -> LedgerResult<bool> {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM envelopes WHERE id > $1 AND id <= $2 \
         AND state IN ({}) AND state_changed_at < $3)",
        final_states_sql()
    );
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(after)
        .bind(up_to)
        .bind(cutoff)
        .fetch_one(&mut *db)
        .await?)
}

fn id_array<'a>(ids: impl IntoIterator<Item = &'a i64>) -> Vec<i64> {
    ids.into_iter().copied().collect()
}

async fn newest(tx: &mut PgConnection) -> LedgerResult<Newest> {
    async fn one(tx: &mut PgConnection, sql: &'static str) -> LedgerResult<Option<i64>> {
        Ok(sqlx::query_scalar(sql).fetch_one(&mut *tx).await?)
    }
    let envelopes = [
        one(tx, "SELECT MAX(id) FROM envelopes").await?,
        one(tx, "SELECT MAX(envelope_id) FROM attempts WHERE id = (SELECT MAX(id) FROM attempts)").await?,
        one(
            tx,
            "SELECT MAX(envelope_id) FROM envelope_events WHERE id = (SELECT MAX(id) FROM envelope_events)",
        )
        .await?,
    ];
    Ok(Newest {
        envelopes: envelopes.into_iter().flatten().collect(),
        handoff: one(tx, "SELECT MAX(id) FROM handoffs").await?,
        cascade: one(tx, "SELECT MAX(id) FROM cascades").await?,
        turn: one(tx, "SELECT MAX(id) FROM cascade_turns").await?,
        post: one(tx, "SELECT MAX(id) FROM room_posts").await?,
        task: one(tx, "SELECT MAX(id) FROM tasks").await?,
        revision: one(tx, "SELECT MAX(id) FROM task_revisions").await?,
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

/// The decision on the window's finished envelopes and what reaches them ([`gather`]).
async fn gather_and_decide(
    tx: &mut PgConnection,
    window: (i64, i64),
    cutoff: DateTime<Utc>,
) -> LedgerResult<Doomed> {
    Ok(retention::decide(&gather(tx, window, cutoff).await?))
}

/// The facts of the window's finished envelopes and of what reaches them.
async fn gather(
    tx: &mut PgConnection,
    window: (i64, i64),
    cutoff: DateTime<Utc>,
) -> LedgerResult<BatchFacts> {
    let newest = newest(tx).await?;
    let seed_sql = format!(
        "SELECT id FROM envelopes WHERE id > $1 AND id <= $2 AND state IN ({}) AND state_changed_at < $3 ORDER BY id",
        final_states_sql()
    );
    let seeds: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(seed_sql))
        .bind(window.0)
        .bind(window.1)
        .bind(cutoff)
        .fetch_all(&mut *tx)
        .await?;
    let mut gathered = Gathered::default();
    let mut envelopes: BTreeSet<i64> = seeds.iter().copied().collect();
    let mut frontier = seeds;
    for round in 0..=EXPANSION_ROUNDS {
        let reached = discover(tx, &frontier, cutoff, &newest, &mut gathered).await?;
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
    gathered.facts.envelopes = envelope_facts(tx, &envelopes, cutoff, &newest).await?;
    Ok(gathered.facts)
}

/// What a batch deletes, decided twice: once on what it reads, to know what to lock, and
/// again under the locks, on facts read after them (a statement reads what was committed
/// when it began, so the facts must not share the locks' statement). In between it holds,
/// in this order (the order intake and admission take them in, so no two transactions
/// wait for each other crosswise): the conversations of the open tasks it decided on
/// (intake joins a message to its conversation's task under that lock, see
/// `tasks::hold_conversations`), those tasks' rows, and the envelopes it decided on, each
/// `FOR UPDATE`. The second decision sees only the envelopes it holds: a row that came in
/// before the locks references one of them and keeps it, or an envelope it does not hold
/// and keeps what references that; a row that comes in after them waits for the batch. A
/// task the first decision did not doom (so is not held) keeps the whole batch.
async fn lock_and_decide(
    tx: &mut PgConnection,
    window: (i64, i64),
    cutoff: DateTime<Utc>,
) -> LedgerResult<Doomed> {
    let first = gather_and_decide(tx, window, cutoff).await?;
    if first.is_empty() {
        return Ok(first);
    }
    let tasks = id_array(&first.tasks);
    let conversations: Vec<Conversation> =
        sqlx::query_as("SELECT chat_id, thread_id, agent FROM tasks WHERE id = ANY($1) AND state = 'open'")
            .bind(&tasks)
            .fetch_all(&mut *tx)
            .await?;
    hold_conversations(tx, &conversations).await?;
    sqlx::query("SELECT id FROM tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(&tasks)
        .execute(&mut *tx)
        .await?;
    let locked: BTreeSet<i64> =
        sqlx::query_scalar("SELECT id FROM envelopes WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(id_array(&first.envelopes))
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
    let mut facts = gather(tx, window, cutoff).await?;
    facts.envelopes.retain(|envelope| locked.contains(&envelope.id));
    let second = retention::decide(&facts);
    if !second.tasks.is_subset(&first.tasks) {
        return Ok(Doomed::default());
    }
    Ok(second)
}

/// The envelopes' facts.
async fn envelope_facts(
    tx: &mut PgConnection,
    ids: &BTreeSet<i64>,
    cutoff: DateTime<Utc>,
    newest: &Newest,
) -> LedgerResult<Vec<EnvelopeFacts>> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        envelope_facts_columns!("$2"),
        " FROM envelopes e WHERE e.id = ANY($1)"
    ))
    .bind(id_array(ids))
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    let mut facts = Vec::with_capacity(rows.len());
    for row in rows {
        let id: i64 = row.try_get("id")?;
        facts.push(EnvelopeFacts {
            id,
            state: text_enum(&row, "state")?,
            settled_before_cutoff: row.try_get("settled_before_cutoff")?,
            task: row.try_get("task_id")?,
            unreconciled_attempt: row.try_get("unreconciled_attempt")?,
            holds_newest: newest.envelopes.contains(&id),
        });
    }
    Ok(facts)
}

/// Loads every row not loaded yet that references an envelope of `frontier`, whole: the
/// envelopes those rows reference.
async fn discover(
    tx: &mut PgConnection,
    frontier: &[i64],
    cutoff: DateTime<Utc>,
    newest: &Newest,
    gathered: &mut Gathered,
) -> LedgerResult<BTreeSet<i64>> {
    let mut reached = BTreeSet::new();
    if frontier.is_empty() {
        return Ok(reached);
    }
    let ids = id_array(frontier);
    let handoffs = sqlx::query(
        "SELECT id, state <> 'open' AND COALESCE(closed_at, opened_at) < $2 AS ended_before_cutoff, \
         cause_envelope_id, envelope_id, answer_envelope_id FROM handoffs \
         WHERE cause_envelope_id = ANY($1) OR envelope_id = ANY($1) OR answer_envelope_id = ANY($1) ORDER BY id",
    )
    .bind(&ids)
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    for row in handoffs {
        let id: i64 = row.try_get("id")?;
        let handoff = HandoffFacts {
            id,
            ended_before_cutoff: row.try_get("ended_before_cutoff")?,
            is_newest: newest.handoff == Some(id),
            cause: row.try_get("cause_envelope_id")?,
            envelope: row.try_get("envelope_id")?,
            answer: row.try_get("answer_envelope_id")?,
        };
        if gathered.handoffs.insert(handoff.id) {
            reached.extend(handoff.cause.into_iter().chain([handoff.envelope]).chain(handoff.answer));
            gathered.facts.handoffs.push(handoff);
        }
    }

    let cascades: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM cascades WHERE message_envelope_id = ANY($1) \
         UNION SELECT cascade_id FROM cascade_turns WHERE envelope_id = ANY($1) \
         UNION SELECT cascade_id FROM room_posts WHERE envelope_id = ANY($1) AND cascade_id IS NOT NULL",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    for id in cascades {
        if gathered.cascades.insert(id) {
            let cascade = cascade_facts(tx, id, cutoff, newest).await?;
            reached.extend(&cascade.envelopes);
            gathered.facts.cascades.push(cascade);
        }
    }

    let posts = sqlx::query(
        "SELECT id, state = 'made' AND COALESCE(made_at, created_at) < $2 AS made_before_cutoff, envelope_id \
         FROM room_posts WHERE envelope_id = ANY($1) AND cascade_id IS NULL ORDER BY id",
    )
    .bind(&ids)
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    for row in posts {
        let id: i64 = row.try_get("id")?;
        let post = PostFacts {
            id,
            made_before_cutoff: row.try_get("made_before_cutoff")?,
            is_newest: newest.post == Some(id),
            envelope: row.try_get("envelope_id")?,
        };
        if gathered.task_posts.insert(post.id) {
            reached.insert(post.envelope);
            gathered.facts.task_posts.push(post);
        }
    }

    let tasks: Vec<String> = sqlx::query_scalar(
        "SELECT task_id FROM envelopes WHERE id = ANY($1) AND task_id IS NOT NULL \
         UNION SELECT task_id FROM tasks WHERE first_envelope_id = ANY($1) \
           OR act_on_envelope_id = ANY($1) OR cancel_envelope_id = ANY($1) \
         UNION SELECT task_id FROM task_revisions WHERE envelope_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    for task_id in tasks {
        if gathered.tasks.insert(task_id.clone())
            && let Some(task) = task_facts(tx, &task_id, cutoff, newest).await?
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

async fn cascade_facts(
    tx: &mut PgConnection,
    id: i64,
    cutoff: DateTime<Utc>,
    newest: &Newest,
) -> LedgerResult<CascadeFacts> {
    let cascade: (bool, i64) = sqlx::query_as(
        "SELECT state IN ('stopped', 'completed', 'budget_exhausted') AND COALESCE(ended_at, updated_at) < $2, \
           message_envelope_id FROM cascades WHERE id = $1",
    )
    .bind(id)
    .bind(cutoff)
    .fetch_one(&mut *tx)
    .await?;
    let turns: Vec<CascadePart> = sqlx::query_as(
        "SELECT id, envelope_id, ended_at IS NOT NULL FROM cascade_turns WHERE cascade_id = $1",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    let posts: Vec<CascadePart> =
        sqlx::query_as("SELECT id, envelope_id, state = 'owed' FROM room_posts WHERE cascade_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
    Ok(cascade_facts_from(id, cascade, &turns, &posts, newest))
}

async fn task_facts(
    tx: &mut PgConnection,
    task_id: &str,
    cutoff: DateTime<Utc>,
    newest: &Newest,
) -> LedgerResult<Option<TaskFacts>> {
    let task: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT id, ",
        closed_before!("$2"),
        ", first_envelope_id, act_on_envelope_id, cancel_envelope_id FROM tasks WHERE task_id = $1"
    ))
    .bind(task_id)
    .bind(cutoff)
    .fetch_optional(&mut *tx)
    .await?;
    // An envelope names a task that is not there: its envelopes stay.
    let Some(task) = task else { return Ok(None) };
    let revisions: Vec<(i64, Option<i64>)> =
        sqlx::query_as("SELECT id, envelope_id FROM task_revisions WHERE task_id = $1")
            .bind(task_id)
            .fetch_all(&mut *tx)
            .await?;
    let mut facts = task_facts_from(task_id, task, &revisions, newest);
    if facts.may_go() {
        facts.owned = sqlx::query_scalar("SELECT id FROM envelopes WHERE task_id = $1")
            .bind(task_id)
            .fetch_all(&mut *tx)
            .await?;
    }
    Ok(Some(facts))
}

/// Deletes what was decided, children before parents, so every foreign key holds.
async fn delete_doomed(tx: &mut PgConnection, doomed: &Doomed) -> LedgerResult<Pruned> {
    if doomed.is_empty() {
        return Ok(Pruned::default());
    }
    let envelopes = id_array(&doomed.envelopes);
    let cascades = id_array(&doomed.cascades);
    let tasks = id_array(&doomed.tasks);
    async fn delete(tx: &mut PgConnection, sql: &'static str, ids: &[i64]) -> LedgerResult<u64> {
        Ok(sqlx::query(sql).bind(ids).execute(&mut *tx).await?.rows_affected())
    }
    let task_revisions = delete(
        tx,
        "DELETE FROM task_revisions WHERE task_id IN (SELECT task_id FROM tasks WHERE id = ANY($1))",
        &tasks,
    )
    .await?;
    let tasks = delete(tx, "DELETE FROM tasks WHERE id = ANY($1)", &tasks).await?;
    let room_posts = delete(tx, "DELETE FROM room_posts WHERE cascade_id = ANY($1)", &cascades).await?
        + delete(tx, "DELETE FROM room_posts WHERE id = ANY($1)", &id_array(&doomed.task_posts)).await?;
    let cascade_turns = delete(tx, "DELETE FROM cascade_turns WHERE cascade_id = ANY($1)", &cascades).await?;
    let cascades = delete(tx, "DELETE FROM cascades WHERE id = ANY($1)", &cascades).await?;
    let handoffs = delete(tx, "DELETE FROM handoffs WHERE id = ANY($1)", &id_array(&doomed.handoffs)).await?;
    let attempts = delete(tx, "DELETE FROM attempts WHERE envelope_id = ANY($1)", &envelopes).await?;
    let envelope_events =
        delete(tx, "DELETE FROM envelope_events WHERE envelope_id = ANY($1)", &envelopes).await?;
    let envelopes = delete(tx, "DELETE FROM envelopes WHERE id = ANY($1)", &envelopes).await?;
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
async fn count_doomed(tx: &mut PgConnection, doomed: &Doomed) -> LedgerResult<Pruned> {
    if doomed.is_empty() {
        return Ok(Pruned::default());
    }
    let envelopes = id_array(&doomed.envelopes);
    let cascades = id_array(&doomed.cascades);
    let tasks = id_array(&doomed.tasks);
    async fn count(tx: &mut PgConnection, sql: &'static str, ids: &[i64]) -> LedgerResult<u64> {
        let n: i64 = sqlx::query_scalar(sql).bind(ids).fetch_one(&mut *tx).await?;
        Ok(n.max(0) as u64)
    }
    Ok(Pruned {
        envelopes: doomed.envelopes.len() as u64,
        attempts: count(tx, "SELECT COUNT(*) FROM attempts WHERE envelope_id = ANY($1)", &envelopes).await?,
        envelope_events: count(tx, "SELECT COUNT(*) FROM envelope_events WHERE envelope_id = ANY($1)", &envelopes)
            .await?,
        handoffs: doomed.handoffs.len() as u64,
        cascades: doomed.cascades.len() as u64,
        cascade_turns: count(tx, "SELECT COUNT(*) FROM cascade_turns WHERE cascade_id = ANY($1)", &cascades).await?,
        room_posts: doomed.task_posts.len() as u64
            + count(tx, "SELECT COUNT(*) FROM room_posts WHERE cascade_id = ANY($1)", &cascades).await?,
        tasks: doomed.tasks.len() as u64,
        task_revisions: count(
            tx,
            "SELECT COUNT(*) FROM task_revisions WHERE task_id IN (SELECT task_id FROM tasks WHERE id = ANY($1))",
            &tasks,
        )
        .await?,
        ..Pruned::default()
    })
}

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    use super::*;
    use crate::ledger::postgres::test_support::{TestSchema, admin};

    const OLD: &str = "2020-01-01T00:00:00Z";

    /// How long a prune that waits for nothing may take here.
    const PROMPTLY: Duration = Duration::from_secs(20);

    async fn ledger() -> (TestSchema, PgLedger, PgConnection) {
        let schema = TestSchema::create().await;
        let ledger = PgLedger::connect(&schema.url).await.unwrap();
        let db = PgConnection::connect(&schema.url).await.unwrap();
        (schema, ledger, db)
    }

    async fn run(db: &mut PgConnection, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(db).await.unwrap();
    }

    /// Envelope `id` of chat 42, in `state` since long ago, under `task` if any.
    fn envelope(id: i64, state: &str, task: Option<&str>) -> String {
        let task = task.map_or("NULL".to_owned(), |task| format!("'{task}'"));
        format!(
            "INSERT INTO envelopes (id, trace_id, kind, chat_id, chat_type, message_id, sender_name, content, \
             sent_at, received_at, route, agent, state, state_changed_at, task_id) \
             VALUES ({id}, 'env_{id}', 'message', 42, 'private', {id}, 'Ann', 'hi', '{OLD}', '{OLD}', 'dm', \
             'orch', '{state}', '{OLD}', {task});"
        )
    }

    fn attempt(id: i64, envelope: i64, outcome: &str) -> String {
        format!(
            "INSERT INTO attempts (id, op_id, envelope_id, agent, chat_id, chunk_index, chunk_count, text, outcome, started_at) \
             VALUES ({id}, 'op_{id}', {envelope}, 'orch', 42, 0, 1, 'answer', '{outcome}', '{OLD}');"
        )
    }

    async fn count(db: &mut PgConnection, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(db).await.unwrap()
    }

    /// Waits until a session of the server waits for a lock `backend` holds.
    async fn wait_until_blocked_by(backend: i32) {
        let mut admin = admin().await;
        let deadline = Instant::now() + PROMPTLY;
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
            )
            .bind(backend)
            .fetch_one(&mut admin)
            .await
            .unwrap();
            if waiting > 0 {
                return;
            }
            assert!(Instant::now() < deadline, "nothing waited for the lock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// An attempt begun on an old answered envelope (a reaction, an edit) while a batch
    /// decides on it: the batch waits for it, sees it in flight, and keeps the envelope.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attempt_begun_while_a_batch_decides_keeps_its_envelope() {
        let (schema, ledger, mut db) = ledger().await;
        // The newest envelope and the newest attempt are elsewhere (2, attempt 2).
        let rows = [envelope(1, "acked", None), envelope(2, "acked", None), attempt(2, 2, "sent")];
        run(&mut db, &rows.concat()).await;
        // Another replica begins an attempt on envelope 1 and has not committed yet: it
        // holds the envelope's key (KEY SHARE), as `begin_attempt` does.
        let mut replica = PgConnection::connect(&schema.url).await.unwrap();
        let backend: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut replica).await.unwrap();
        run(&mut replica, &format!("BEGIN; {}", attempt(1, 1, "in_flight"))).await;
        let pruning = {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.prune(Utc::now(), false).await.unwrap() })
        };
        wait_until_blocked_by(backend).await;
        run(&mut replica, "COMMIT").await;
        let report = tokio::time::timeout(PROMPTLY, pruning).await.unwrap().unwrap();
        assert_eq!(report.removed.envelopes, 0, "{:?}", report.removed);
        assert_eq!(count(&mut db, "SELECT COUNT(*) FROM attempts WHERE outcome = 'in_flight'").await, 1);
        assert_eq!(count(&mut db, "SELECT COUNT(*) FROM envelopes").await, 2);
        ledger.close().await;
        schema.drop().await;
    }

    /// Intake joins a message to its conversation's task holding the conversation: a batch
    /// deciding on that task, idle until then, waits for it and keeps the task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_joining_an_idle_task_while_a_batch_decides_keeps_the_task() {
        let (schema, ledger, mut db) = ledger().await;
        let task = |id: i64, first: i64| {
            format!(
                "INSERT INTO tasks (id, task_id, chat_id, agent, route, state, revision, objective, first_envelope_id, \
                 started_by, started_source, opened_at, updated_at) \
                 VALUES ({id}, 'task_{id}', 42, 'orch', 'dm', 'open', 1, 'work', {first}, 'Ann', 'message', '{OLD}', '{OLD}');"
            )
        };
        // Task 1, answered long ago; task 2 (another conversation's) the newest.
        let rows = [
            envelope(1, "acked", Some("task_1")),
            task(1, 1),
            envelope(2, "acked", None),
            task(2, 2),
            "UPDATE tasks SET chat_id = 43 WHERE id = 2;".to_owned(),
        ];
        run(&mut db, &rows.concat()).await;
        let mut intake = PgConnection::connect(&schema.url).await.unwrap();
        let backend: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut intake).await.unwrap();
        run(&mut intake, "BEGIN").await;
        hold_conversations(&mut intake, &[(42, None, "orch".to_owned())]).await.unwrap();
        run(&mut intake, &envelope(3, "pending", Some("task_1")).replace("'2020-01-01T00:00:00Z'", "now()"))
            .await;
        let pruning = {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                ledger.prune(Utc::now() - chrono::Duration::seconds(1), false).await.unwrap()
            })
        };
        wait_until_blocked_by(backend).await;
        run(&mut intake, "COMMIT").await;
        let report = tokio::time::timeout(PROMPTLY, pruning).await.unwrap().unwrap();
        assert_eq!((report.removed.tasks, report.removed.envelopes), (0, 0), "{:?}", report.removed);
        assert_eq!(count(&mut db, "SELECT COUNT(*) FROM tasks WHERE task_id = 'task_1'").await, 1);
        ledger.close().await;
        schema.drop().await;
    }

    /// A prune (or a dry run) locks only what it removes: an open task's pending envelope,
    /// held by another transaction, does not hold it up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prune_locks_only_what_it_removes() {
        let (schema, ledger, mut db) = ledger().await;
        let rows = [
            envelope(1, "acked", Some("task_1")),
            envelope(2, "pending", Some("task_1")),
            format!(
                "INSERT INTO tasks (task_id, chat_id, agent, route, state, revision, objective, first_envelope_id, \
                 started_by, started_source, opened_at, updated_at) \
                 VALUES ('task_1', 42, 'orch', 'dm', 'open', 1, 'work', 1, 'Ann', 'message', '{OLD}', '{OLD}');"
            ),
            envelope(3, "acked", None),
            envelope(4, "acked", None),
        ];
        run(&mut db, &rows.concat()).await;
        let mut other = PgConnection::connect(&schema.url).await.unwrap();
        run(&mut other, "BEGIN; SELECT id FROM envelopes WHERE id = 2 FOR UPDATE;").await;
        for dry_run in [true, false] {
            let report = tokio::time::timeout(PROMPTLY, ledger.prune(Utc::now(), dry_run))
                .await
                .expect("the prune waited for an envelope it does not remove")
                .unwrap();
            assert_eq!(report.removed.envelopes, 1, "envelope 3 alone (dry run: {dry_run})");
        }
        run(&mut other, "ROLLBACK").await;
        assert_eq!(count(&mut db, "SELECT COUNT(*) FROM envelopes").await, 3);
        ledger.close().await;
        schema.drop().await;
    }
}
