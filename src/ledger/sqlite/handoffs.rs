//! Handoffs between agents (DESIGN.md §9): one row per handoff, and the envelopes that
//! carry its instruction to the target and its answer back to the delegator. Each change
//! is one transaction, so a handoff and its envelopes never disagree.

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::columns::{optional_timestamp, timestamp_column};
use super::envelopes::transition_in;
use super::in_place::{execute_cached, optional_text_enum, query_all_cached, query_row_cached, text_enum};
use super::tasks;
use super::{LedgerError, LedgerResult, SqliteLedger, now};
use crate::domain::{EnvelopeKind, EnvelopeState, HandoffEnd, HandoffEnding, NewHandoff, StoredHandoff};
use crate::ids::{AgentName, HandoffId, TraceId};
use crate::ledger::columns::handoff_select;
use crate::ledger::prelude::*;
use crate::rules::guard::Intent;
use crate::rules::revisions::Refusal;

impl StoredHandoff {
    /// A row of [`handoff_select!`], read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get("id")?,
            handoff_id: row.get("handoff_id")?,
            from_agent: row.get("from_agent")?,
            to_agent: row.get("to_agent")?,
            instruction: row.get("instruction")?,
            cause_envelope_id: row.get("cause_envelope_id")?,
            cause_trace_id: row.get("cause_trace_id")?,
            depth: row.get("depth")?,
            followup_of: row.get("followup_of")?,
            intent: optional_text_enum(row, "intent")?,
            request_id: row.get("request_id")?,
            envelope_id: row.get("envelope_id")?,
            envelope_trace_id: row.get("envelope_trace_id")?,
            answer_envelope_id: row.get("answer_envelope_id")?,
            answer_trace_id: row.get("answer_trace_id")?,
            answer_request_id: row.get("answer_request_id")?,
            state: text_enum(row, "state")?,
            opened_at: timestamp_column(row, "opened_at")?,
            closed_at: optional_timestamp(row, "closed_at")?,
            note: row.get("note")?,
            task_id: row.get("task_id")?,
            late_result: row.get("late_result")?,
        })
    }
}

/// Inserts an envelope an agent made: no Telegram fields, queued for `agent`. Returns its id.
fn insert_agent_envelope(
    db: &rusqlite::Connection,
    kind: EnvelopeKind,
    agent: &str,
    from_agent: &str,
    content: &str,
    route: Option<&str>,
) -> rusqlite::Result<i64> {
    let at = now();
    query_row_cached(
        db,
        "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, state_changed_at) \
         VALUES (?1, NULL, ?2, 0, NULL, 'agent', NULL, 0, NULL, NULL, ?3, ?4, '[]', ?4, ?5, ?5, ?6, ?7, 'queued', ?5) \
         RETURNING id",
        rusqlite::params![TraceId::generate().as_str(), kind.as_str(), from_agent, content, at, route, agent],
        |row| row.get(0),
    )
}

/// Records the task and revision a handoff (and its envelope) was made under.
fn tag_with_task(
    db: &rusqlite::Connection,
    envelope_id: i64,
    handoff_id: Option<&str>,
    task: &(Option<String>, Option<i64>),
) -> rusqlite::Result<()> {
    // A task and its revision are recorded together, or neither is.
    let (Some(task_id), Some(revision)) = task else {
        return Ok(());
    };
    tasks::tag(db, envelope_id, task_id, *revision)?;
    if let Some(handoff_id) = handoff_id {
        execute_cached(
            db,
            "UPDATE handoffs SET task_id = ?, revision = ? WHERE handoff_id = ?",
            rusqlite::params![task_id, revision, handoff_id],
        )?;
    }
    Ok(())
}

/// The task and revision a row (an envelope, a handoff) was recorded under.
fn task_of(db: &rusqlite::Connection, sql: &str, id: i64) -> rusqlite::Result<(Option<String>, Option<i64>)> {
    query_row_cached(db, sql, [id], |row| Ok((row.get(0)?, row.get(1)?)))
}

#[async_trait]
impl Handoffs for SqliteLedger {
    async fn record_handoff(&self, new: &NewHandoff<'_>) -> LedgerResult<Result<StoredHandoff, Refusal>> {
        let handoff_id = HandoffId::generate();
        let recorded = self
            .write_in_place(|db| {
                let mut task: (Option<String>, Option<i64>) = (None, None);
                if let Some(cause) = new.cause {
                    if let Err(refusal) = tasks::admission_in(db, cause.id)? {
                        return Ok(Err(refusal));
                    }
                    task = task_of(db, "SELECT task_id, revision FROM envelopes WHERE id = ?", cause.id)?;
                }
                let route = new.cause.and_then(|cause| cause.route.as_deref());
                let envelope_id = insert_agent_envelope(
                    db,
                    EnvelopeKind::Handoff,
                    new.to.as_str(),
                    new.from.as_str(),
                    new.instruction,
                    route,
                )?;
                execute_cached(
                    db,
                    "INSERT INTO handoffs (handoff_id, from_agent, to_agent, instruction, cause_envelope_id, depth, \
                     followup_of, intent, request_id, envelope_id, state, opened_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?)",
                    rusqlite::params![
                        handoff_id,
                        new.from.as_str(),
                        new.to.as_str(),
                        new.instruction,
                        new.cause.map(|cause| cause.id),
                        i64::from(new.depth),
                        new.followup_of,
                        new.intent.map(Intent::as_str),
                        new.request_id,
                        envelope_id,
                        now(),
                    ],
                )?;
                tag_with_task(db, envelope_id, Some(&handoff_id), &task)?;
                Ok(Ok(()))
            })
            .await?;
        if let Err(refusal) = recorded {
            return Ok(Err(refusal));
        }
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
        // `None`: the handoff was no longer open, and the answer envelope is rolled back.
        let ended = self
            .write_in_place_if(|db| {
                // An answer is an action for the task the handoff was made under (DESIGN.md §11).
                if let HandoffEnd::Answered { .. } = end
                    && let Err(refusal) = tasks::admission_in(db, handoff.envelope_id)?
                {
                    return Ok(Some(Err(refusal)));
                }
                let route: Option<String> = match handoff.cause_envelope_id {
                    Some(cause) => {
                        query_row_cached(db, "SELECT route FROM envelopes WHERE id = ?", [cause], |row| row.get(0))?
                    }
                    None => None,
                };
                let answer_id = insert_agent_envelope(
                    db,
                    EnvelopeKind::HandoffAnswer,
                    &handoff.from_agent,
                    &handoff.to_agent,
                    &answer,
                    route.as_deref(),
                )?;
                let ended = execute_cached(
                    db,
                    "UPDATE handoffs SET state = ?, answer_envelope_id = ?, answer_request_id = ?, closed_at = ?, \
                     note = ? WHERE id = ? AND state = 'open'",
                    rusqlite::params![state.as_str(), answer_id, request_id, now(), note, handoff.id],
                )?;
                if ended == 0 {
                    return Ok(None);
                }
                // The delegator's answer belongs to the task the handoff was made for.
                let task = task_of(db, "SELECT task_id, revision FROM handoffs WHERE id = ?", handoff.id)?;
                tag_with_task(db, answer_id, None, &task)?;
                transition_in(
                    db,
                    handoff.envelope_id,
                    &[EnvelopeState::Pending, EnvelopeState::Queued],
                    EnvelopeState::Acked,
                    actor,
                    Some(&reason),
                )?;
                // An answer is the reply to the handoff's envelope: it settles the answers
                // made on that envelope's behalf, as a reply to a Telegram message does.
                if let HandoffEnd::Answered { .. } = end {
                    let settled = format!("answered with the answer to {}", handoff.handoff_id);
                    settle_answers_for(db, handoff.envelope_id, actor, &settled)?;
                }
                Ok(Some(Ok(())))
            })
            .await?;
        match ended {
            Some(Err(refusal)) => Ok(Err(refusal)),
            None => Ok(Ok(None)),
            Some(Ok(())) => self.handoff(&handoff.handoff_id).await.map(Ok),
        }
    }

    async fn keep_late_result(
        &self,
        agent: &AgentName,
        trace_id: &TraceId,
        text: &str,
    ) -> LedgerResult<bool> {
        let kept = self
            .execute_in_place(
                "UPDATE handoffs SET late_result = ?, late_at = ? WHERE state = 'superseded' AND late_result IS NULL \
                 AND to_agent = ? AND envelope_id = (SELECT id FROM envelopes WHERE trace_id = ?)",
                (text, now(), agent.as_str(), trace_id),
            )
            .await?;
        Ok(kept == 1)
    }

    async fn handoff(&self, handoff_id: &HandoffId) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.handoff_id = ?");
        self.read_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![handoff_id], StoredHandoff::from_row).optional()
        })
        .await
    }

    async fn handoff_of_envelope(&self, envelope_id: i64) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.envelope_id = ?1 OR h.answer_envelope_id = ?1");
        self.read_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![envelope_id], StoredHandoff::from_row).optional()
        })
        .await
    }

    async fn handoff_by_request(
        &self,
        from: &AgentName,
        request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.from_agent = ? AND h.request_id = ?");
        self.read_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![from.as_str(), request_id], StoredHandoff::from_row)
                .optional()
        })
        .await
    }

    async fn handoff_by_answer_request(
        &self,
        agent: &AgentName,
        request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.to_agent = ? AND h.answer_request_id = ?");
        self.read_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![agent.as_str(), request_id], StoredHandoff::from_row)
                .optional()
        })
        .await
    }

    async fn handoffs_for_cause(&self, cause_envelope_id: i64) -> LedgerResult<Vec<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.cause_envelope_id = ? ORDER BY h.id");
        self.read_in_place(|db| {
            query_all_cached(db, sql, rusqlite::params![cause_envelope_id], StoredHandoff::from_row)
        })
        .await
    }

    async fn open_handoffs_from(&self, from: &AgentName) -> LedgerResult<Vec<StoredHandoff>> {
        let sql = concat!(handoff_select!(), "WHERE h.from_agent = ? AND h.state = 'open' ORDER BY h.id");
        self.read_in_place(|db| {
            query_all_cached(db, sql, rusqlite::params![from.as_str()], StoredHandoff::from_row)
        })
        .await
    }

    async fn list_handoffs(
        &self,
        open_only: bool,
        agent: Option<&str>,
        limit: i64,
    ) -> LedgerResult<Vec<StoredHandoff>> {
        let sql = concat!(
            handoff_select!(),
            "WHERE (?1 = 0 OR h.state = 'open') AND (?2 IS NULL OR h.from_agent = ?2 OR h.to_agent = ?2) \
             ORDER BY h.id DESC LIMIT ?3"
        );
        let mut rows: Vec<StoredHandoff> = self
            .read_in_place(|db| {
                query_all_cached(db, sql, rusqlite::params![open_only, agent, limit], StoredHandoff::from_row)
            })
            .await?;
        rows.reverse();
        Ok(rows)
    }
}

/// Settles, inside a reply's transaction, the pending answers made on behalf of the
/// envelope the reply answered: one reply to the human answers them all. An answer
/// settled so carries its own conversation's answers along (handoffs made on behalf of
/// it): they belong to the same conversation.
pub(super) fn settle_answers_for(
    db: &rusqlite::Connection,
    cause_envelope_id: i64,
    actor: &str,
    reason: &str,
) -> rusqlite::Result<()> {
    let mut causes = vec![cause_envelope_id];
    while let Some(cause) = causes.pop() {
        let answers: Vec<i64> = query_all_cached(
            db,
            "SELECT e.id FROM handoffs h JOIN envelopes e ON e.id = h.answer_envelope_id \
             WHERE h.cause_envelope_id = ? AND e.state = 'pending'",
            [cause],
            |row| row.get(0),
        )?;
        for answer in answers {
            // Settled once: a pending answer is no longer pending, so none is seen twice.
            transition_in(db, answer, &[EnvelopeState::Pending], EnvelopeState::Acked, actor, Some(reason))?;
            causes.push(answer);
        }
    }
    Ok(())
}
