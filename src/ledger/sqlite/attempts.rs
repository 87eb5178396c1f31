//! Send attempts (DESIGN.md §4): recorded before the request, classified after, and
//! settling their envelope in the same transaction.

use async_trait::async_trait;

use crate::ledger::prelude::*;

use super::envelopes::transition_in;
use crate::ledger::EnvelopeState;
use rusqlite::OptionalExtension;

use super::in_place::{execute_cached, optional_text_enum, query_all_cached, query_row_cached, text_enum};

use super::write_watch::LedgerWrite;
use super::{LedgerError, LedgerResult, SqliteLedger, now};
use crate::ids::{AttemptId, TraceId};
use crate::rules::revisions::Refusal;

/// What a send attempt is about to do, recorded before the request is made.
#[derive(Debug, Clone)]
pub struct NewAttempt<'a> {
    pub envelope_id: i64,
    pub agent: &'a str,
    /// The `reply` request this attempt belongs to (chosen by the channel plugin).
    pub request_id: Option<&'a str>,
    pub purpose: AttemptPurpose,
    /// The Bot API call this attempt makes.
    pub method: AttemptMethod,
    /// `set_reaction` / `edit_message`: the Telegram message acted on.
    pub target_message_id: Option<i32>,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub reply_to_message_id: Option<i32>,
    pub chunk_index: usize,
    pub chunk_count: usize,
    pub text: &'a str,
}

/// How an attempt ended, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    Sent { message_id: i32 },
    NotSent { error: String },
    Unknown { error: String },
}

impl AttemptOutcome {
    pub fn state(&self) -> AttemptState {
        match self {
            Self::Sent { .. } => AttemptState::Sent,
            Self::NotSent { .. } => AttemptState::NotSent,
            Self::Unknown { .. } => AttemptState::Unknown,
        }
    }
}

/// Why a send is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptPurpose {
    /// A reply to an envelope: its outcome settles the envelope.
    Reply,
    /// A best-effort copy (the handoff audit route): it settles nothing and never waits
    /// for reconciliation.
    Audit,
}

impl AttemptPurpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reply => "reply",
            Self::Audit => "audit",
        }
    }
}

/// The Bot API call an attempt makes (the `method` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptMethod {
    SendMessage,
    SendPhoto,
    SendDocument,
    SendAnimation,
    SendVideo,
    SendVoice,
    SendAudio,
    /// `setMessageReaction` on `target_message_id` (the `react` tool).
    SetReaction,
    /// `editMessageText` of `target_message_id` (the `edit_message` tool).
    EditMessage,
}

impl AttemptMethod {
    pub const ALL: [Self; 9] = [
        Self::SendMessage,
        Self::SendPhoto,
        Self::SendDocument,
        Self::SendAnimation,
        Self::SendVideo,
        Self::SendVoice,
        Self::SendAudio,
        Self::SetReaction,
        Self::EditMessage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SendMessage => "send_message",
            Self::SendPhoto => "send_photo",
            Self::SendDocument => "send_document",
            Self::SendAnimation => "send_animation",
            Self::SendVideo => "send_video",
            Self::SendVoice => "send_voice",
            Self::SendAudio => "send_audio",
            Self::SetReaction => "set_reaction",
            Self::EditMessage => "edit_message",
        }
    }

    /// Whether the attempt is a part of a reply: it posts a message, and its outcome
    /// settles the envelope (the last part confirmed answers it, an unknown one makes it
    /// unresolved). A reaction or an edit is admitted like a reply (DESIGN.md §11) but
    /// answers nothing and, unknown, leaves the envelope as it was; it is not a part of
    /// any [`RecordedReply`] and does not hold a reply back for reconciliation.
    /// `reply_part_method!` (ledger/mod.rs) says the same in SQL.
    pub fn is_reply_part(self) -> bool {
        match self {
            Self::SendMessage
            | Self::SendPhoto
            | Self::SendDocument
            | Self::SendAnimation
            | Self::SendVideo
            | Self::SendVoice
            | Self::SendAudio => true,
            Self::SetReaction | Self::EditMessage => false,
        }
    }
}

impl std::fmt::Display for AttemptMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The `outcome` column of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Recorded; the request may be on its way. A daemon that dies leaves it so, and
    /// start-up turns it into `Unknown`.
    InFlight,
    Sent,
    NotSent,
    Unknown,
}

impl AttemptState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Sent => "sent",
            Self::NotSent => "not_sent",
            Self::Unknown => "unknown",
        }
    }
}

impl ReconciledOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::NotSent => "not_sent",
        }
    }
}

impl std::fmt::Display for ReconciledOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for AttemptState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What an operator found out about an attempt whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconciledOutcome {
    Sent,
    NotSent,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredAttempt {
    pub op_id: AttemptId,
    pub request_id: Option<String>,
    pub method: AttemptMethod,
    pub target_message_id: Option<i64>,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub chunk_index: i64,
    pub chunk_count: i64,
    pub text: String,
    pub outcome: AttemptState,
    pub telegram_message_id: Option<i64>,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub reconciled_outcome: Option<ReconciledOutcome>,
    pub reconciled_reason: Option<String>,
}

/// What the attempts of one `reply` request add up to, as the ledger tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedReply {
    pub envelope_id: i64,
    pub trace_id: TraceId,
    /// Parts confirmed sent, by part index, with Telegram's message id.
    pub sent: Vec<(usize, i32)>,
    pub parts: usize,
    pub verdict: ReplyVerdict,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyVerdict {
    /// Every part confirmed sent.
    Delivered,
    /// A part was provably not sent and none is unknown: the request is over.
    NotSent { error: String },
    /// A part may or may not have arrived (or is still on its way after a crash, before
    /// start-up recovery ran): the envelope needs reconciling.
    Unknown { error: String },
    /// A part is still in flight in this daemon.
    InFlight,
}

/// What the attempts of one `reply` request add up to, whichever envelope they answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTally {
    /// Parts confirmed sent, by part index, with Telegram's message id.
    pub sent: Vec<(usize, i32)>,
    pub parts: usize,
    pub verdict: ReplyVerdict,
}

impl RecordedReply {
    pub fn from_attempts(envelope_id: i64, trace_id: TraceId, attempts: &[StoredAttempt]) -> Option<Self> {
        let ReplyTally { sent, parts, verdict } = ReplyTally::of(attempts)?;
        Some(Self { envelope_id, trace_id, sent, parts, verdict })
    }
}

impl ReplyTally {
    /// Sums up the attempts of one request, oldest first. Retries of a rate-limited part
    /// are attempts of their own: a part counts as sent once any of its attempts was.
    pub fn of(attempts: &[StoredAttempt]) -> Option<Self> {
        let parts = usize::try_from(attempts.first()?.chunk_count).unwrap_or(0);
        let mut sent: Vec<(usize, i32)> = Vec::new();
        let mut verdict = None;
        let mut last_error = None;
        for attempt in attempts {
            let index = usize::try_from(attempt.chunk_index).unwrap_or(0);
            let effective = match attempt.reconciled_outcome {
                Some(ReconciledOutcome::Sent) => AttemptState::Sent,
                Some(ReconciledOutcome::NotSent) => AttemptState::NotSent,
                None => attempt.outcome,
            };
            match effective {
                AttemptState::Sent => {
                    let id = attempt.telegram_message_id.and_then(|id| i32::try_from(id).ok()).unwrap_or(0);
                    if !sent.iter().any(|(i, _)| *i == index) {
                        sent.push((index, id));
                    }
                }
                AttemptState::InFlight => verdict = Some(ReplyVerdict::InFlight),
                AttemptState::Unknown => {
                    if verdict != Some(ReplyVerdict::InFlight) {
                        verdict =
                            Some(ReplyVerdict::Unknown { error: attempt.error.clone().unwrap_or_default() });
                    }
                }
                AttemptState::NotSent => last_error = attempt.error.clone(),
            }
        }
        sent.sort_unstable();
        let verdict = verdict.unwrap_or_else(|| {
            if sent.len() == parts {
                ReplyVerdict::Delivered
            } else {
                ReplyVerdict::NotSent { error: last_error.unwrap_or_default() }
            }
        });
        Some(Self { sent, parts, verdict })
    }
}

impl StoredAttempt {
    /// A row of [`attempt_columns!`], read in place.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            op_id: row.get("op_id")?,
            request_id: row.get("request_id")?,
            method: text_enum(row, "method")?,
            target_message_id: row.get("target_message_id")?,
            chat_id: row.get("chat_id")?,
            thread_id: row.get("thread_id")?,
            reply_to_message_id: row.get("reply_to_message_id")?,
            chunk_index: row.get("chunk_index")?,
            chunk_count: row.get("chunk_count")?,
            text: row.get("text")?,
            outcome: text_enum(row, "outcome")?,
            telegram_message_id: row.get("telegram_message_id")?,
            error: row.get("error")?,
            started_at: row.get("started_at")?,
            finished_at: row.get("finished_at")?,
            reconciled_outcome: optional_text_enum(row, "reconciled_outcome")?,
            reconciled_reason: row.get("reconciled_reason")?,
        })
    }
}

/// The columns of [`StoredAttempt`].
macro_rules! attempt_columns {
    () => {
        "op_id, request_id, method, target_message_id, chat_id, thread_id, reply_to_message_id, chunk_index, chunk_count, text, outcome, \
         telegram_message_id, error, started_at, finished_at, reconciled_outcome, reconciled_reason"
    };
}

#[async_trait]
impl Attempts for SqliteLedger {
    async fn begin_attempt(&self, attempt: &NewAttempt<'_>) -> LedgerResult<Result<AttemptId, Refusal>> {
        let op_id = AttemptId::generate();
        let sql = concat!(
            "INSERT INTO attempts (op_id, envelope_id, agent, request_id, purpose, chat_id, thread_id, \
             reply_to_message_id, chunk_index, chunk_count, text, outcome, started_at, method, target_message_id) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'in_flight', ?12, ?13, ?14 \
             WHERE ?5 = 'audit' OR NOT EXISTS (",
            refused_for_envelope!(),
            ")"
        );
        let decided = self.write_in_place(|db| {
            let recorded = execute_cached(
                db,
                sql,
                rusqlite::params![
                    op_id,
                    attempt.envelope_id,
                    attempt.agent,
                    attempt.request_id,
                    attempt.purpose.as_str(),
                    attempt.chat_id,
                    attempt.thread_id,
                    attempt.reply_to_message_id,
                    attempt.chunk_index as i64,
                    attempt.chunk_count as i64,
                    attempt.text,
                    now(),
                    attempt.method.as_str(),
                    attempt.target_message_id,
                ],
            )?;
            if recorded == 1 {
                return Ok(Some(Ok(op_id.clone())));
            }
            // Refused: `admit` explains why, in the same transaction. The two rules are kept
            // in step by a test; should they disagree (`None`), nothing is sent.
            Ok(super::tasks::admission_in(db, attempt.envelope_id)?.err().map(Err))
        });
        let decided = decided.await;
        self.writes.observe(LedgerWrite::Attempt, &decided);
        decided?.ok_or_else(|| {
            LedgerError::other(format!(
                "the admission of a reply to envelope {} disagrees with itself; nothing was sent",
                attempt.envelope_id
            ))
        })
    }

    async fn finish_attempt(
        &self,
        op_id: &AttemptId,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> LedgerResult<()> {
        let (message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => (Some(*message_id), None),
            AttemptOutcome::NotSent { error } | AttemptOutcome::Unknown { error } => {
                (None, Some(error.as_str()))
            }
        };
        let state = outcome.state();
        let finished = self.write_in_place(|db| {
            let sql = "UPDATE attempts SET outcome = ?, telegram_message_id = ?, error = ?, finished_at = ? \
                       WHERE op_id = ? RETURNING envelope_id, chunk_index, chunk_count, purpose, method";
            let (envelope_id, chunk_index, chunk_count, purpose, method): (i64, i64, i64, String, AttemptMethod) =
                query_row_cached(
                    db,
                    sql,
                    rusqlite::params![state.as_str(), message_id, error, now(), op_id],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, text_enum(row, "method")?)),
                )?;
            // An audit copy, a reaction or an edit answers nothing: only its own row changes.
            if purpose == AttemptPurpose::Audit.as_str() || !method.is_reply_part() {
                return Ok(());
            }
            let answerable = [EnvelopeState::Pending, EnvelopeState::Acked];
            match outcome {
                AttemptOutcome::Sent { message_id } if chunk_index + 1 == chunk_count => {
                    let reason = format!("replied ({op_id}, Telegram message {message_id})");
                    transition_in(db, envelope_id, &answerable, EnvelopeState::Acked, actor, Some(&reason))?;
                    // The answers of handoffs made for this conversation are answered too.
                    let reason = format!("answered with the reply {op_id} to its conversation");
                    super::handoffs::settle_answers_for(db, envelope_id, actor, &reason)?;
                }
                AttemptOutcome::Unknown { error } => {
                    let reason = format!("send outcome unknown ({op_id}): {error}");
                    transition_in(
                        db,
                        envelope_id,
                        &[EnvelopeState::Pending],
                        EnvelopeState::Unresolved,
                        actor,
                        Some(&reason),
                    )?;
                }
                _ => {}
            }
            Ok(())
        })
        .await;
        self.writes.observe(LedgerWrite::Attempt, &finished);
        finished
    }

    async fn recover_in_flight(&self) -> LedgerResult<Vec<TraceId>> {
        let stuck: Vec<(AttemptId, TraceId)> = self
            .read_off_thread(|db| {
                query_all_cached(
                    db,
                    "SELECT a.op_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
                     WHERE a.outcome = 'in_flight' ORDER BY a.id",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
            })
            .await?;
        let error = "the daemon stopped while this send was in flight".to_owned();
        for (op_id, _) in &stuck {
            self.finish_attempt(op_id, &AttemptOutcome::Unknown { error: error.clone() }, "daemon").await?;
        }
        Ok(stuck.into_iter().map(|(_, trace_id)| trace_id).collect())
    }

    async fn reply_request_seen(&self, agent: &str, request_id: &str) -> LedgerResult<bool> {
        self.read_in_place(|db| {
            query_row_cached(
                db,
                "SELECT EXISTS (SELECT 1 FROM attempts WHERE agent = ?1 AND request_id = ?2) \
                 OR EXISTS (SELECT 1 FROM handoffs WHERE to_agent = ?1 AND answer_request_id = ?2)",
                [agent, request_id],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn recorded_reply(&self, agent: &str, request_id: &str) -> LedgerResult<Option<RecordedReply>> {
        let sql = concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts WHERE agent = ? AND request_id = ? AND ",
            reply_part_method!(),
            " ORDER BY id"
        );
        self.read_in_place(|db| {
            let envelope: Option<(i64, TraceId)> = query_row_cached(
                db,
                concat!(
                    "SELECT a.envelope_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
                     WHERE a.agent = ? AND a.request_id = ? AND a.",
                    reply_part_method!(),
                    " LIMIT 1"
                ),
                [agent, request_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
            let Some((envelope_id, trace_id)) = envelope else { return Ok(None) };
            let attempts = query_all_cached(db, sql, [agent, request_id], StoredAttempt::from_row)?;
            Ok(RecordedReply::from_attempts(envelope_id, trace_id, &attempts))
        })
        .await
    }

    async fn last_reply_for(&self, envelope_id: i64) -> LedgerResult<Option<(String, Vec<StoredAttempt>)>> {
        let sql = concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts WHERE envelope_id = ? AND request_id = ? AND ",
            reply_part_method!(),
            " ORDER BY id"
        );
        self.read_in_place(|db| {
            let request_id: Option<String> = query_row_cached(
                db,
                concat!(
                    "SELECT request_id FROM attempts WHERE envelope_id = ? AND request_id IS NOT NULL AND ",
                    reply_part_method!(),
                    " ORDER BY id DESC LIMIT 1"
                ),
                [envelope_id],
                |row| row.get(0),
            )
            .optional()?;
            let Some(request_id) = request_id else { return Ok(None) };
            let attempts = query_all_cached(
                db,
                sql,
                rusqlite::params![envelope_id, request_id],
                StoredAttempt::from_row,
            )?;
            Ok(Some((request_id, attempts)))
        })
        .await
    }

    async fn awaiting_reconciliation(&self, envelope_ids: &[i64]) -> LedgerResult<Vec<i64>> {
        if envelope_ids.is_empty() {
            return Ok(Vec::new());
        }
        // The ids as a JSON array, so the statement stays one text, prepared once.
        let ids = serde_json::to_string(envelope_ids).unwrap_or_else(|_| "[]".into());
        self.read_in_place(|db| {
            query_all_cached(
                db,
                concat!(
                    "SELECT DISTINCT envelope_id FROM attempts WHERE outcome IN ('unknown', 'in_flight') \
                     AND reconciled_outcome IS NULL AND purpose = 'reply' AND ",
                    reply_part_method!(),
                    " AND envelope_id IN (SELECT value FROM json_each(?))"
                ),
                [&ids],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn bot_message(
        &self,
        chat_id: i64,
        message_id: i32,
    ) -> LedgerResult<Option<(String, AttemptMethod)>> {
        let sql = concat!(
            "SELECT agent, method FROM attempts WHERE chat_id = ? AND telegram_message_id = ? AND outcome = 'sent' \
             AND ",
            reply_part_method!(),
            " ORDER BY id DESC LIMIT 1"
        );
        self.read_in_place(|db| {
            query_row_cached(db, sql, rusqlite::params![chat_id, message_id], |row| {
                Ok((row.get(0)?, text_enum(row, "method")?))
            })
            .optional()
        })
        .await
    }

    async fn action_attempt(&self, agent: &str, request_id: &str) -> LedgerResult<Option<StoredAttempt>> {
        let sql = concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts WHERE agent = ? AND request_id = ? AND NOT ",
            reply_part_method!(),
            " ORDER BY id DESC LIMIT 1"
        );
        self.read_in_place(|db| {
            query_row_cached(db, sql, [agent, request_id], StoredAttempt::from_row).optional()
        })
        .await
    }

    async fn attempts_for(&self, envelope_id: i64) -> LedgerResult<Vec<StoredAttempt>> {
        let sql = concat!("SELECT ", attempt_columns!(), " FROM attempts WHERE envelope_id = ? ORDER BY id");
        self.read_in_place(|db| query_all_cached(db, sql, [envelope_id], StoredAttempt::from_row)).await
    }
}
