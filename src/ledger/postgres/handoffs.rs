//! Handoffs between agents (DESIGN.md §9) on PostgreSQL: one row per handoff, and the
//! envelopes that carry its instruction to the target and its answer back to the
//! delegator. Each change is one transaction, so a handoff and its envelopes never
//! disagree. Ending a handoff takes its row `FOR UPDATE` first: of two replicas ending
//! one handoff at once, the second finds it no longer open and writes nothing.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};

use super::PgLedger;
use super::envelopes::transition_in;
use super::rows::{optional_text_enum, text_enum};
use super::tasks::{self, admission_in};
use crate::domain::{EnvelopeKind, EnvelopeState, HandoffEnd, HandoffEnding, NewHandoff, StoredHandoff};
use crate::ids::{AgentName, HandoffId, TaskId, TraceId};
use crate::ledger::columns::handoff_select;
use crate::ledger::prelude::*;
use crate::ledger::{LedgerError, LedgerResult};
use crate::rules::guard::Intent;
use crate::rules::revisions::Refusal;

impl FromRow<'_, PgRow> for StoredHandoff {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            handoff_id: row.try_get("handoff_id")?,
            from_agent: row.try_get("from_agent")?,
            to_agent: row.try_get("to_agent")?,
            instruction: row.try_get("instruction")?,
            cause_envelope_id: row.try_get("cause_envelope_id")?,
            cause_trace_id: row.try_get("cause_trace_id")?,
            depth: row.try_get("depth")?,
            followup_of: row.try_get("followup_of")?,
            intent: optional_text_enum(row, "intent")?,
            request_id: row.try_get("request_id")?,
            envelope_id: row.try_get("envelope_id")?,
            envelope_trace_id: row.try_get("envelope_trace_id")?,
            answer_envelope_id: row.try_get("answer_envelope_id")?,
            answer_trace_id: row.try_get("answer_trace_id")?,
            answer_request_id: row.try_get("answer_request_id")?,
            state: text_enum(row, "state")?,
            opened_at: row.try_get("opened_at")?,
            closed_at: row.try_get("closed_at")?,
            note: row.try_get("note")?,
            task_id: row.try_get("task_id")?,
            late_result: row.try_get("late_result")?,
        })
    }
}

/// Inserts an envelope an agent made: no Telegram fields, queued for `agent`. Returns its id.
async fn insert_agent_envelope(
    tx: &mut PgConnection,
    kind: EnvelopeKind,
    agent: &str,
    from_agent: &str,
    content: &str,
    route: Option<&str>,
) -> LedgerResult<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, state_changed_at) \
         VALUES ($1, NULL, $2, 0, NULL, 'agent', NULL, 0, NULL, NULL, $3, $4, '[]', $4, now(), now(), $5, $6, \
         'queued', now()) RETURNING id",
    )
    .bind(TraceId::generate())
    .bind(kind.as_str())
    .bind(from_agent)
    .bind(content)
    .bind(route)
    .bind(agent)
    .fetch_one(&mut *tx)
    .await?)
}

/// The task and revision a row (an envelope, a handoff) was recorded under.
type TaskTag = (Option<TaskId>, Option<i64>);

/// Records the task and revision a handoff (and its envelope) was made under.
async fn tag_with_task(
    tx: &mut PgConnection,
    envelope_id: i64,
    handoff_id: Option<&HandoffId>,
    task: &TaskTag,
) -> LedgerResult<()> {
    // A task and its revision are recorded together, or neither is.
    let (Some(task_id), Some(revision)) = task else {
        return Ok(());
    };
    tasks::tag(tx, envelope_id, task_id, *revision).await?;
    if let Some(handoff_id) = handoff_id {
        sqlx::query("UPDATE handoffs SET task_id = $1, revision = $2 WHERE handoff_id = $3")
            .bind(task_id)
            .bind(revision)
            .bind(handoff_id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

#[async_trait]
impl Handoffs for PgLedger {
    async fn record_handoff(&self, new: &NewHandoff<'_>) -> LedgerResult<Result<StoredHandoff, Refusal>> {
        let handoff_id = HandoffId::generate();
        let mut tx = self.begin().await?;
        let mut task: TaskTag = (None, None);
        if let Some(cause) = new.cause {
            // A refusal ends the transaction with nothing written in it.
            if let Err(refusal) = admission_in(&mut tx, cause.id).await? {
                tx.rollback().await?;
                return Ok(Err(refusal));
            }
            task = sqlx::query_as("SELECT task_id, revision FROM envelopes WHERE id = $1")
                .bind(cause.id)
                .fetch_one(&mut *tx)
                .await?;
        }
        let route = new.cause.and_then(|cause| cause.route.as_deref());
        let envelope_id = insert_agent_envelope(
            &mut tx,
            EnvelopeKind::Handoff,
            new.to.as_str(),
            new.from.as_str(),
            new.instruction,
            route,
        )
        .await?;
        sqlx::query(
            "INSERT INTO handoffs (handoff_id, from_agent, to_agent, instruction, cause_envelope_id, depth, \
             followup_of, intent, request_id, envelope_id, state, opened_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'open', now())",
        )
        .bind(&handoff_id)
        .bind(new.from.as_str())
        .bind(new.to.as_str())
        .bind(new.instruction)
        .bind(new.cause.map(|cause| cause.id))
        .bind(i64::from(new.depth))
        .bind(new.followup_of)
        .bind(new.intent.map(Intent::as_str))
        .bind(new.request_id)
        .bind(envelope_id)
        .execute(&mut *tx)
        .await?;
        tag_with_task(&mut tx, envelope_id, Some(&handoff_id), &task).await?;
        tx.commit().await?;
        self.handoff(&handoff_id)
            .await?
            .ok_or_else(|| LedgerError::other(format!("handoff {handoff_id} was recorded and is not found")))
            .map(Ok)
    }

    async fn end_handoff(
        &self,
        handoff: &StoredHandoff,
        end: HandoffEnd<'_>,
        actor: &str,
    ) -> LedgerResult<Result<Option<StoredHandoff>, Refusal>> {
        let HandoffEnding { state, answer, reason, note, request_id } = end.recorded_as(handoff);
        let mut tx = self.begin().await?;
        // The handoff's row first, held until the end: one that is no longer open ends
        // the transaction with nothing written.
        let open: Option<TaskTag> = sqlx::query_as(
            "SELECT task_id, revision FROM handoffs WHERE id = $1 AND state = 'open' FOR UPDATE",
        )
        .bind(handoff.id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(task) = open else {
            tx.rollback().await?;
            return Ok(Ok(None));
        };
        // An answer is an action for the task the handoff was made under (DESIGN.md §11).
        if let HandoffEnd::Answered { .. } = end
            && let Err(refusal) = admission_in(&mut tx, handoff.envelope_id).await?
        {
            tx.rollback().await?;
            return Ok(Err(refusal));
        }
        let route: Option<String> = match handoff.cause_envelope_id {
            Some(cause) => sqlx::query_scalar("SELECT route FROM envelopes WHERE id = $1")
                .bind(cause)
                .fetch_optional(&mut *tx)
                .await?
                .flatten(),
            None => None,
        };
        let answer_id = insert_agent_envelope(
            &mut tx,
            EnvelopeKind::HandoffAnswer,
            &handoff.from_agent,
            &handoff.to_agent,
            &answer,
            route.as_deref(),
        )
        .await?;
        sqlx::query(
            "UPDATE handoffs SET state = $1, answer_envelope_id = $2, answer_request_id = $3, closed_at = now(), \
             note = $4 WHERE id = $5",
        )
        .bind(state.as_str())
        .bind(answer_id)
        .bind(request_id)
        .bind(note)
        .bind(handoff.id)
        .execute(&mut *tx)
        .await?;
        // The delegator's answer belongs to the task the handoff was made for.
        tag_with_task(&mut tx, answer_id, None, &task).await?;
        transition_in(
            &mut tx,
            handoff.envelope_id,
            &[EnvelopeState::Pending, EnvelopeState::Queued],
            EnvelopeState::Acked,
            actor,
            Some(&reason),
        )
        .await?;
        // An answer is the reply to the handoff's envelope: it settles the answers made on
        // that envelope's behalf, as a reply to a Telegram message does.
        if let HandoffEnd::Answered { .. } = end {
            let settled = format!("answered with the answer to {}", handoff.handoff_id);
            settle_answers_for(&mut tx, handoff.envelope_id, actor, &settled).await?;
        }
        tx.commit().await?;
        self.handoff(&handoff.handoff_id).await.map(Ok)
    }

    async fn keep_late_result(
        &self,
        agent: &AgentName,
        trace_id: &TraceId,
        text: &str,
    ) -> LedgerResult<bool> {
        let kept = sqlx::query(
            "UPDATE handoffs SET late_result = $1, late_at = now() WHERE state = 'superseded' AND late_result IS NULL \
             AND to_agent = $2 AND envelope_id = (SELECT id FROM envelopes WHERE trace_id = $3)",
        )
        .bind(text)
        .bind(agent.as_str())
        .bind(trace_id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(kept == 1)
    }

    async fn handoff(&self, handoff_id: &HandoffId) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.handoff_id = $1");
        Ok(sqlx::query_as(sql).bind(handoff_id).fetch_optional(&self.pool).await?)
    }

    async fn handoff_of_envelope(&self, envelope_id: i64) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.envelope_id = $1 OR h.answer_envelope_id = $1");
        Ok(sqlx::query_as(sql).bind(envelope_id).fetch_optional(&self.pool).await?)
    }

    async fn handoff_by_request(
        &self,
        from: &AgentName,
        request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.from_agent = $1 AND h.request_id = $2");
        Ok(sqlx::query_as(sql).bind(from.as_str()).bind(request_id).fetch_optional(&self.pool).await?)
    }

    async fn handoff_by_answer_request(
        &self,
        agent: &AgentName,
        request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.to_agent = $1 AND h.answer_request_id = $2");
        Ok(sqlx::query_as(sql).bind(agent.as_str()).bind(request_id).fetch_optional(&self.pool).await?)
    }

    async fn handoffs_for_cause(&self, cause_envelope_id: i64) -> LedgerResult<Vec<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.cause_envelope_id = $1 ORDER BY h.id");
        Ok(sqlx::query_as(sql).bind(cause_envelope_id).fetch_all(&self.pool).await?)
    }

    async fn open_handoffs_from(&self, from: &AgentName) -> LedgerResult<Vec<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.from_agent = $1 AND h.state = 'open' ORDER BY h.id");
        Ok(sqlx::query_as(sql).bind(from.as_str()).fetch_all(&self.pool).await?)
    }

    async fn list_handoffs(
        &self,
        open_only: bool,
        agent: Option<&str>,
        limit: i64,
    ) -> LedgerResult<Vec<StoredHandoff>> {
        let sql = concat!(
            handoff_select!(),
            "WHERE (NOT $1 OR h.state = 'open') AND ($2::text IS NULL OR h.from_agent = $2 OR h.to_agent = $2) \
             ORDER BY h.id DESC LIMIT $3"
        );
        let mut rows: Vec<StoredHandoff> =
            sqlx::query_as(sql).bind(open_only).bind(agent).bind(limit).fetch_all(&self.pool).await?;
        rows.reverse();
        Ok(rows)
    }
}

/// Settles, inside a reply's transaction, the pending answers made on behalf of the
/// envelope the reply answered: one reply to the human answers them all. An answer
/// settled so carries its own conversation's answers along (handoffs made on behalf of
/// it): they belong to the same conversation.
pub(super) async fn settle_answers_for(
    tx: &mut PgConnection,
    cause_envelope_id: i64,
    actor: &str,
    reason: &str,
) -> LedgerResult<()> {
    let mut causes = vec![cause_envelope_id];
    while let Some(cause) = causes.pop() {
        let answers: Vec<i64> = sqlx::query_scalar(
            "SELECT e.id FROM handoffs h JOIN envelopes e ON e.id = h.answer_envelope_id \
             WHERE h.cause_envelope_id = $1 AND e.state = 'pending' ORDER BY e.id",
        )
        .bind(cause)
        .fetch_all(&mut *tx)
        .await?;
        for answer in answers {
            // Settled once: a pending answer is no longer pending, so none is seen twice.
            transition_in(tx, answer, &[EnvelopeState::Pending], EnvelopeState::Acked, actor, Some(reason))
                .await?;
            causes.push(answer);
        }
    }
    Ok(())
}
