//! The ack ledger: SQLite through sqlx. Every envelope, every send attempt and the poller's
//! offset live here, so nothing is lost when the daemon dies and nothing is done twice
//! when it starts again.
//!
//! The ledger only stores and transitions; what a transition *means* is decided by the
//! pure code in `routes`, `resolver` and `outbound`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use chrono::{SecondsFormat, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{FromRow, SqlitePool};

use crate::api::wire::{DeliveredEnvelope, PendingSummary};
use crate::config::Synchronous;
use crate::envelope::{Envelope, EnvelopeState, sender_display};
use crate::ids::{AgentName, RouteName, TraceId};

/// How long a writer waits for another (e.g. `switchboard ledger reconcile` while the
/// daemon runs) before giving up. Ledger transactions are short, so this is generous.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// SQLite allows one writer at a time; a handful of connections serves concurrent readers.
const MAX_CONNECTIONS: u32 = 8;

/// How many characters of a message identify it in a candidate list or a listing.
const PREVIEW_CHARS: usize = 80;

pub fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Debug, Clone)]
pub struct Ledger {
    pool: SqlitePool,
}

/// An envelope with the routing decision it is stored with.
#[derive(Debug, Clone)]
pub struct RoutedEnvelope {
    pub envelope: Envelope,
    pub state: EnvelopeState,
    pub route: Option<RouteName>,
    pub agent: Option<AgentName>,
}

/// An envelope as stored.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct StoredEnvelope {
    pub id: i64,
    pub trace_id: String,
    pub update_id: i64,
    pub kind: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub chat_type: String,
    pub chat_title: Option<String>,
    pub message_id: i64,
    pub sender_id: Option<i64>,
    pub sender_username: Option<String>,
    pub sender_name: String,
    pub text: Option<String>,
    pub attachments: String,
    pub content: String,
    pub sent_at: String,
    pub received_at: String,
    pub route: Option<String>,
    pub agent: Option<String>,
    #[sqlx(try_from = "String")]
    pub state: EnvelopeState,
    pub deliveries: i64,
    pub state_changed_at: String,
    pub note: Option<String>,
}

impl StoredEnvelope {
    pub fn user(&self) -> String {
        sender_display(self.sender_username.as_deref(), &self.sender_name)
    }

    pub fn thread_id(&self) -> Option<i32> {
        self.thread_id.and_then(|t| i32::try_from(t).ok())
    }

    pub fn preview(&self) -> String {
        let mut preview: String = self.content.chars().take(PREVIEW_CHARS).collect();
        if self.content.chars().count() > PREVIEW_CHARS {
            preview.push('…');
        }
        preview.replace('\n', " ")
    }

    pub fn summary(&self) -> PendingSummary {
        PendingSummary {
            trace_id: self.trace_id.clone(),
            chat_id: self.chat_id,
            thread_id: self.thread_id(),
            chat_title: self.chat_title.clone(),
            user: self.user(),
            route: self.route.clone().unwrap_or_default(),
            ts: self.sent_at.clone(),
            preview: self.preview(),
        }
    }

    pub fn delivered(&self, redelivered: bool) -> DeliveredEnvelope {
        DeliveredEnvelope {
            trace_id: self.trace_id.clone(),
            content: self.content.clone(),
            chat_id: self.chat_id,
            thread_id: self.thread_id(),
            chat_type: self.chat_type.clone(),
            chat_title: self.chat_title.clone(),
            message_id: i32::try_from(self.message_id).unwrap_or_default(),
            user: self.user(),
            user_id: self.sender_id.unwrap_or_default(),
            ts: self.sent_at.clone(),
            route: self.route.clone().unwrap_or_default(),
            redelivered,
            edited: self.kind == "edited_message",
        }
    }
}

/// What a send attempt is about to do, recorded before the request is made.
#[derive(Debug, Clone)]
pub struct NewAttempt<'a> {
    pub envelope_id: i64,
    pub agent: &'a str,
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

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct StoredAttempt {
    pub op_id: String,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub reply_to_message_id: Option<i64>,
    pub chunk_index: i64,
    pub chunk_count: i64,
    pub text: String,
    pub outcome: String,
    pub telegram_message_id: Option<i64>,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub reconciled_outcome: Option<String>,
    pub reconciled_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct StoredEvent {
    pub at: String,
    pub from_state: String,
    pub to_state: String,
    pub actor: String,
    pub reason: Option<String>,
}

/// Filters of `switchboard ledger list`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<EnvelopeState>,
    pub agent: Option<String>,
    pub route: Option<String>,
    pub limit: i64,
}

/// What an operator found out about an unresolved reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciliation {
    /// The reply did reach the chat: the envelope is answered.
    Delivered,
    /// It did not: the envelope goes back to `pending` so its agent can answer again.
    NotDelivered,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("no envelope has trace id {0}")]
    Unknown(String),
    #[error("{trace_id} is {state}, not unresolved: there is nothing to reconcile")]
    NotUnresolved { trace_id: String, state: EnvelopeState },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The columns of [`StoredEnvelope`], as a macro so queries stay `&'static str` literals
/// (sqlx refuses SQL assembled at run time unless it is audited).
macro_rules! envelope_columns {
    () => {
        "id, trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, deliveries, state_changed_at, note"
    };
}

impl Ledger {
    /// Opens (creating if needed) the database and applies pending migrations.
    pub async fn open(path: &Path, synchronous: Synchronous) -> anyhow::Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                Synchronous::Normal => SqliteSynchronous::Normal,
                Synchronous::Full => SqliteSynchronous::Full,
            })
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .connect_with(options)
            .await
            .with_context(|| format!("opening the ledger database {}", path.display()))?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .with_context(|| format!("applying migrations to {}", path.display()))?;
        Ok(Self { pool })
    }

    /// A transaction that takes SQLite's write lock at once. A read-then-write
    /// transaction that started as a reader could fail with `SQLITE_BUSY` instead of
    /// waiting when another writer commits in between; taking the lock up front makes
    /// concurrent writers (the daemon and `switchboard ledger`) queue on the busy timeout.
    async fn write_transaction(&self) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    // ---- the poller ----

    pub async fn next_offset(&self, bot_id: i64) -> sqlx::Result<Option<i64>> {
        sqlx::query_scalar("SELECT next_offset FROM poller_offsets WHERE bot_id = ?")
            .bind(bot_id)
            .fetch_optional(&self.pool)
            .await
    }

    /// Stores a batch of envelopes and advances the offset in one transaction: either both
    /// happen or neither does, so a crash can neither lose nor duplicate an update.
    /// Returns the envelopes that were new (a re-polled update is skipped).
    pub async fn record_batch<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
    ) -> sqlx::Result<Vec<&'a RoutedEnvelope>> {
        let mut tx = self.write_transaction().await?;
        let received_at = now();
        // One multi-row statement per batch: each statement is a round trip to sqlx's
        // SQLite worker thread, and those hand-offs, not SQLite, bound inbound throughput.
        let mut stored_update_ids = Vec::new();
        if !batch.is_empty() {
            let mut insert = sqlx::QueryBuilder::new(
                "INSERT INTO envelopes (trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, \
                 message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, \
                 received_at, route, agent, state, state_changed_at) ",
            );
            insert.push_values(batch, |mut row, routed| {
                let e = &routed.envelope;
                let attachments = serde_json::to_string(&e.attachments).unwrap_or_else(|_| "[]".into());
                row.push_bind(e.trace_id.as_str())
                    .push_bind(e.update_id)
                    .push_bind(e.kind.as_str())
                    .push_bind(e.channel.chat_id)
                    .push_bind(e.channel.thread_id)
                    .push_bind(e.chat_type)
                    .push_bind(e.chat_title.as_deref())
                    .push_bind(e.message_id)
                    .push_bind(e.sender.id)
                    .push_bind(e.sender.username.as_deref())
                    .push_bind(e.sender.name.as_str())
                    .push_bind(e.text.as_deref())
                    .push_bind(attachments)
                    .push_bind(e.content())
                    .push_bind(e.sent_at.to_rfc3339_opts(SecondsFormat::Secs, true))
                    .push_bind(received_at.as_str())
                    .push_bind(routed.route.as_ref().map(RouteName::as_str))
                    .push_bind(routed.agent.as_ref().map(AgentName::as_str))
                    .push_bind(routed.state.as_str())
                    .push_bind(received_at.as_str());
            });
            // A re-polled update is already stored: skip it, and learn which rows are new.
            insert.push(" ON CONFLICT (update_id) DO NOTHING RETURNING update_id");
            stored_update_ids = insert.build_query_scalar::<i64>().fetch_all(&mut *tx).await?;
        }
        sqlx::query(
            "INSERT INTO poller_offsets (bot_id, next_offset, updated_at) VALUES (?, ?, ?) \
             ON CONFLICT (bot_id) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at",
        )
        .bind(bot_id)
        .bind(next_offset)
        .bind(&received_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(batch.iter().filter(|routed| stored_update_ids.contains(&routed.envelope.update_id)).collect())
    }

    // ---- sessions ----

    /// Moves the agent's oldest `queued` envelope to `pending` and returns it.
    pub async fn claim_next_queued(&self, agent: &AgentName) -> sqlx::Result<Option<StoredEnvelope>> {
        let sql = concat!(
            "UPDATE envelopes SET state = 'pending', deliveries = deliveries + 1, state_changed_at = ? \
             WHERE id = (SELECT id FROM envelopes WHERE agent = ? AND state = 'queued' ORDER BY id LIMIT 1) \
             RETURNING ",
            envelope_columns!(),
            ""
        );
        sqlx::query_as(sql).bind(now()).bind(agent.as_str()).fetch_optional(&self.pool).await
    }

    /// The agent's `pending` envelopes, oldest first, counted as delivered once more: a new
    /// session gets them again, marked as redelivered.
    pub async fn take_pending_for_redelivery(&self, agent: &AgentName) -> sqlx::Result<Vec<StoredEnvelope>> {
        let sql = concat!(
            "UPDATE envelopes SET deliveries = deliveries + 1 WHERE agent = ? AND state = 'pending' \
             RETURNING ",
            envelope_columns!(),
            ""
        );
        let mut rows: Vec<StoredEnvelope> =
            sqlx::query_as(sql).bind(agent.as_str()).fetch_all(&self.pool).await?;
        // RETURNING gives no order guarantee.
        rows.sort_by_key(|row| row.id);
        Ok(rows)
    }

    pub async fn pending(&self, agent: &AgentName) -> sqlx::Result<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes WHERE agent = ? AND state = 'pending' ORDER BY id"
        );
        sqlx::query_as(sql).bind(agent.as_str()).fetch_all(&self.pool).await
    }

    pub async fn find(&self, trace_id: &str) -> sqlx::Result<Option<StoredEnvelope>> {
        let sql = concat!("SELECT ", envelope_columns!(), " FROM envelopes WHERE trace_id = ?");
        sqlx::query_as(sql).bind(trace_id).fetch_optional(&self.pool).await
    }

    pub async fn session_opened(
        &self,
        session_id: &str,
        agent: &AgentName,
        redelivered: usize,
    ) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO agent_sessions (id, agent, connected_at, redelivered) VALUES (?, ?, ?, ?)")
            .bind(session_id)
            .bind(agent.as_str())
            .bind(now())
            .bind(redelivered as i64)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    pub async fn session_closed(&self, session_id: &str) -> sqlx::Result<()> {
        sqlx::query("UPDATE agent_sessions SET disconnected_at = ? WHERE id = ?")
            .bind(now())
            .bind(session_id)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    // ---- state transitions ----

    /// Moves an envelope to `to` if it is in one of `from`, recording who did it and why.
    /// Returns false (and changes nothing) when the envelope was not in an allowed state.
    pub async fn transition(
        &self,
        envelope_id: i64,
        from: &[EnvelopeState],
        to: EnvelopeState,
        actor: &str,
        reason: Option<&str>,
    ) -> sqlx::Result<bool> {
        let mut tx = self.write_transaction().await?;
        let moved = transition_in(&mut tx, envelope_id, from, to, actor, reason).await?;
        tx.commit().await?;
        Ok(moved)
    }

    // ---- attempts ----

    /// Records an attempt before its request is made; returns its operation id.
    pub async fn begin_attempt(&self, attempt: &NewAttempt<'_>) -> sqlx::Result<String> {
        let op_id = format!("op_{}", &TraceId::generate().as_str()[4..]);
        sqlx::query(
            "INSERT INTO attempts (op_id, envelope_id, agent, chat_id, thread_id, reply_to_message_id, \
             chunk_index, chunk_count, text, outcome, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'in_flight', ?)",
        )
        .bind(&op_id)
        .bind(attempt.envelope_id)
        .bind(attempt.agent)
        .bind(attempt.chat_id)
        .bind(attempt.thread_id)
        .bind(attempt.reply_to_message_id)
        .bind(attempt.chunk_index as i64)
        .bind(attempt.chunk_count as i64)
        .bind(attempt.text)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(op_id)
    }

    /// Records what an attempt came to and, in the same transaction, what that proves
    /// about its envelope: the last part of a reply confirmed sent answers it (`acked`);
    /// an unknown outcome makes it `unresolved`. A crash can therefore never leave a
    /// confirmed or unknown send beside an envelope that still looks unanswered.
    pub async fn finish_attempt(
        &self,
        op_id: &str,
        outcome: &AttemptOutcome,
        actor: &str,
    ) -> sqlx::Result<()> {
        let (label, message_id, error) = match outcome {
            AttemptOutcome::Sent { message_id } => ("sent", Some(*message_id), None),
            AttemptOutcome::NotSent { error } => ("not_sent", None, Some(error.as_str())),
            AttemptOutcome::Unknown { error } => ("unknown", None, Some(error.as_str())),
        };
        let mut tx = self.write_transaction().await?;
        let (envelope_id, chunk_index, chunk_count): (i64, i64, i64) = sqlx::query_as(
            "UPDATE attempts SET outcome = ?, telegram_message_id = ?, error = ?, finished_at = ? WHERE op_id = ? \
             RETURNING envelope_id, chunk_index, chunk_count",
        )
        .bind(label)
        .bind(message_id)
        .bind(error)
        .bind(now())
        .bind(op_id)
        .fetch_one(&mut *tx)
        .await?;
        let answerable = [EnvelopeState::Pending, EnvelopeState::Acked];
        match outcome {
            AttemptOutcome::Sent { message_id } if chunk_index + 1 == chunk_count => {
                let reason = format!("replied ({op_id}, Telegram message {message_id})");
                transition_in(&mut tx, envelope_id, &answerable, EnvelopeState::Acked, actor, Some(&reason))
                    .await?;
            }
            AttemptOutcome::Unknown { error } => {
                let reason = format!("send outcome unknown ({op_id}): {error}");
                transition_in(
                    &mut tx,
                    envelope_id,
                    &answerable,
                    EnvelopeState::Unresolved,
                    actor,
                    Some(&reason),
                )
                .await?;
            }
            _ => {}
        }
        tx.commit().await
    }

    /// At start-up: attempts left `in_flight` by a daemon that died mid-send may have
    /// reached Telegram. They become `unknown` and their envelopes `unresolved`; an
    /// operator reconciles them. Returns the trace ids affected.
    pub async fn recover_in_flight(&self) -> sqlx::Result<Vec<String>> {
        let stuck: Vec<(String, String)> = sqlx::query_as(
            "SELECT a.op_id, e.trace_id FROM attempts a JOIN envelopes e ON e.id = a.envelope_id \
             WHERE a.outcome = 'in_flight' ORDER BY a.id",
        )
        .fetch_all(&self.pool)
        .await?;
        let error = "the daemon stopped while this send was in flight".to_owned();
        for (op_id, _) in &stuck {
            self.finish_attempt(op_id, &AttemptOutcome::Unknown { error: error.clone() }, "daemon").await?;
        }
        Ok(stuck.into_iter().map(|(_, trace_id)| trace_id).collect())
    }

    // ---- inspection and reconciliation (`switchboard ledger`) ----

    pub async fn list(&self, filter: &ListFilter) -> sqlx::Result<Vec<StoredEnvelope>> {
        let sql = concat!(
            "SELECT ",
            envelope_columns!(),
            " FROM envelopes \
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR agent = ?2) AND (?3 IS NULL OR route = ?3) \
             ORDER BY id DESC LIMIT ?4"
        );
        let mut rows: Vec<StoredEnvelope> = sqlx::query_as(sql)
            .bind(filter.state.map(EnvelopeState::as_str))
            .bind(&filter.agent)
            .bind(&filter.route)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await?;
        rows.reverse();
        Ok(rows)
    }

    pub async fn count_by_state(&self) -> sqlx::Result<Vec<(String, i64)>> {
        sqlx::query_as("SELECT state, COUNT(*) FROM envelopes GROUP BY state ORDER BY state")
            .fetch_all(&self.pool)
            .await
    }

    pub async fn attempts_for(&self, envelope_id: i64) -> sqlx::Result<Vec<StoredAttempt>> {
        sqlx::query_as(
            "SELECT op_id, chat_id, thread_id, reply_to_message_id, chunk_index, chunk_count, text, outcome, \
             telegram_message_id, error, started_at, finished_at, reconciled_outcome, reconciled_reason \
             FROM attempts WHERE envelope_id = ? ORDER BY id",
        )
        .bind(envelope_id)
        .fetch_all(&self.pool)
        .await
    }

    pub async fn events_for(&self, envelope_id: i64) -> sqlx::Result<Vec<StoredEvent>> {
        sqlx::query_as(
            "SELECT at, from_state, to_state, actor, reason FROM envelope_events WHERE envelope_id = ? ORDER BY id",
        )
        .bind(envelope_id)
        .fetch_all(&self.pool)
        .await
    }

    /// Settles an unresolved envelope with what the operator found out; the reason is
    /// kept on the envelope, its unknown attempts and its event history.
    pub async fn reconcile(
        &self,
        trace_id: &str,
        finding: Reconciliation,
        reason: &str,
    ) -> Result<EnvelopeState, ReconcileError> {
        let envelope =
            self.find(trace_id).await?.ok_or_else(|| ReconcileError::Unknown(trace_id.to_owned()))?;
        let (to, attempt_outcome) = match finding {
            Reconciliation::Delivered => (EnvelopeState::Acked, "sent"),
            Reconciliation::NotDelivered => (EnvelopeState::Pending, "not_sent"),
        };
        let reason = format!("reconciled: {reason}");
        // The envelope and its attempts are settled together or not at all.
        let mut tx = self.write_transaction().await?;
        let moved =
            transition_in(&mut tx, envelope.id, &[EnvelopeState::Unresolved], to, "operator", Some(&reason))
                .await?;
        if !moved {
            return Err(ReconcileError::NotUnresolved {
                trace_id: trace_id.to_owned(),
                state: envelope.state,
            });
        }
        sqlx::query(
            "UPDATE attempts SET reconciled_outcome = ?, reconciled_reason = ?, reconciled_at = ? \
             WHERE envelope_id = ? AND outcome = 'unknown' AND reconciled_outcome IS NULL",
        )
        .bind(attempt_outcome)
        .bind(&reason)
        .bind(now())
        .bind(envelope.id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(to)
    }
}

/// The body of [`Ledger::transition`], inside a caller's write transaction.
async fn transition_in(
    tx: &mut sqlx::SqliteConnection,
    envelope_id: i64,
    from: &[EnvelopeState],
    to: EnvelopeState,
    actor: &str,
    reason: Option<&str>,
) -> sqlx::Result<bool> {
    let current: Option<String> = sqlx::query_scalar("SELECT state FROM envelopes WHERE id = ?")
        .bind(envelope_id)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(current) = current.and_then(|s| EnvelopeState::parse(&s).ok()) else {
        return Ok(false);
    };
    if !from.contains(&current) {
        return Ok(false);
    }
    let at = now();
    sqlx::query(
        "UPDATE envelopes SET state = ?, state_changed_at = ?, note = COALESCE(?, note) WHERE id = ?",
    )
    .bind(to.as_str())
    .bind(&at)
    .bind(reason)
    .bind(envelope_id)
    .execute(&mut *tx)
    .await?;
    if current != to {
        sqlx::query(
            "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor, reason) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(envelope_id)
        .bind(&at)
        .bind(current.as_str())
        .bind(to.as_str())
        .bind(actor)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{EnvelopeKind, Sender};
    use crate::routes::Channel;

    async fn ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.db"), Synchronous::Normal).await.unwrap();
        (dir, ledger)
    }

    fn routed(update_id: i64, state: EnvelopeState) -> RoutedEnvelope {
        RoutedEnvelope {
            envelope: Envelope {
                trace_id: TraceId::generate(),
                update_id,
                kind: EnvelopeKind::Message,
                channel: Channel { chat_id: 42, thread_id: None },
                chat_type: "private",
                chat_title: Some("Ann".into()),
                message_id: update_id as i32,
                sender: Sender { id: Some(42), username: Some("ann".into()), name: "Ann".into() },
                text: Some(format!("message {update_id}")),
                attachments: vec![],
                sent_at: Utc::now(),
            },
            state,
            route: Some(RouteName::parse("dm").unwrap()),
            agent: Some(AgentName::parse("orch").unwrap()),
        }
    }

    #[tokio::test]
    async fn the_database_uses_wal_and_the_configured_durability() {
        for (setting, expected) in [(Synchronous::Normal, 1), (Synchronous::Full, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let ledger = Ledger::open(&dir.path().join("ledger.db"), setting).await.unwrap();
            let mode: String =
                sqlx::query_scalar("PRAGMA journal_mode").fetch_one(ledger.pool()).await.unwrap();
            assert_eq!(mode, "wal");
            let sync: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(ledger.pool()).await.unwrap();
            assert_eq!(sync, expected, "{setting:?}");
        }
    }

    #[tokio::test]
    async fn a_batch_and_its_offset_commit_together_and_replays_are_skipped() {
        let (_dir, ledger) = ledger().await;
        let batch = [routed(1, EnvelopeState::Queued), routed(2, EnvelopeState::Queued)];
        assert_eq!(ledger.record_batch(7, 3, &batch).await.unwrap().len(), 2);
        assert_eq!(ledger.next_offset(7).await.unwrap(), Some(3));
        // The same updates polled again (new trace ids, same update ids) are not stored twice.
        let replay = [routed(2, EnvelopeState::Queued), routed(3, EnvelopeState::Queued)];
        let inserted = ledger.record_batch(7, 4, &replay).await.unwrap();
        assert_eq!(inserted.iter().map(|r| r.envelope.update_id).collect::<Vec<_>>(), [3]);
        let all = ledger.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(all.iter().map(|e| e.update_id).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[tokio::test]
    async fn claims_go_oldest_first_and_redelivery_counts() {
        let (_dir, ledger) = ledger().await;
        let agent = AgentName::parse("orch").unwrap();
        ledger
            .record_batch(
                1,
                4,
                &[
                    routed(1, EnvelopeState::Queued),
                    routed(2, EnvelopeState::Unrouted),
                    routed(3, EnvelopeState::Queued),
                ],
            )
            .await
            .unwrap();
        let first = ledger.claim_next_queued(&agent).await.unwrap().unwrap();
        assert_eq!((first.update_id, first.state, first.deliveries), (1, EnvelopeState::Pending, 1));
        let second = ledger.claim_next_queued(&agent).await.unwrap().unwrap();
        assert_eq!(second.update_id, 3);
        assert!(ledger.claim_next_queued(&agent).await.unwrap().is_none());
        let again = ledger.take_pending_for_redelivery(&agent).await.unwrap();
        assert_eq!(again.iter().map(|e| (e.update_id, e.deliveries)).collect::<Vec<_>>(), [(1, 2), (3, 2)]);
    }

    #[tokio::test]
    async fn transitions_only_from_allowed_states_and_are_audited() {
        let (_dir, ledger) = ledger().await;
        ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
        let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
        assert!(
            !ledger
                .transition(e.id, &[EnvelopeState::Queued], EnvelopeState::Acked, "agent:orch", None)
                .await
                .unwrap()
        );
        assert!(
            ledger
                .transition(e.id, &[EnvelopeState::Pending], EnvelopeState::Acked, "agent:orch", Some("done"))
                .await
                .unwrap()
        );
        let e = ledger.find(&e.trace_id).await.unwrap().unwrap();
        assert_eq!((e.state, e.note.as_deref()), (EnvelopeState::Acked, Some("done")));
        let events = ledger.events_for(e.id).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].from_state.as_str(), events[0].to_state.as_str()), ("pending", "acked"));
    }

    #[tokio::test]
    async fn finishing_an_attempt_settles_its_envelope_in_the_same_step() {
        let (_dir, ledger) = ledger().await;
        ledger
            .record_batch(1, 3, &[routed(1, EnvelopeState::Pending), routed(2, EnvelopeState::Pending)])
            .await
            .unwrap();
        let rows = ledger.list(&ListFilter { limit: 2, ..Default::default() }).await.unwrap();
        let attempt = |envelope_id, chunk_index| NewAttempt {
            envelope_id,
            agent: "orch",
            chat_id: 42,
            thread_id: None,
            reply_to_message_id: Some(1),
            chunk_index,
            chunk_count: 2,
            text: "part",
        };
        let state = |trace: String| {
            let ledger = ledger.clone();
            async move { ledger.find(&trace).await.unwrap().unwrap().state }
        };

        // Two parts: the first confirmed leaves the envelope pending, the last answers it.
        let first = ledger.begin_attempt(&attempt(rows[0].id, 0)).await.unwrap();
        ledger.finish_attempt(&first, &AttemptOutcome::Sent { message_id: 10 }, "agent:orch").await.unwrap();
        assert_eq!(state(rows[0].trace_id.clone()).await, EnvelopeState::Pending);
        let last = ledger.begin_attempt(&attempt(rows[0].id, 1)).await.unwrap();
        ledger.finish_attempt(&last, &AttemptOutcome::Sent { message_id: 11 }, "agent:orch").await.unwrap();
        assert_eq!(state(rows[0].trace_id.clone()).await, EnvelopeState::Acked);

        // Not sent changes nothing; unknown makes the envelope unresolved.
        let refused = ledger.begin_attempt(&attempt(rows[1].id, 0)).await.unwrap();
        ledger
            .finish_attempt(&refused, &AttemptOutcome::NotSent { error: "400".into() }, "agent:orch")
            .await
            .unwrap();
        assert_eq!(state(rows[1].trace_id.clone()).await, EnvelopeState::Pending);
        let lost = ledger.begin_attempt(&attempt(rows[1].id, 0)).await.unwrap();
        ledger
            .finish_attempt(&lost, &AttemptOutcome::Unknown { error: "timeout".into() }, "agent:orch")
            .await
            .unwrap();
        assert_eq!(state(rows[1].trace_id.clone()).await, EnvelopeState::Unresolved);
    }

    #[tokio::test]
    async fn in_flight_attempts_become_unknown_at_start_up_and_can_be_reconciled() {
        let (_dir, ledger) = ledger().await;
        ledger.record_batch(1, 2, &[routed(1, EnvelopeState::Pending)]).await.unwrap();
        let e = ledger.list(&ListFilter { limit: 1, ..Default::default() }).await.unwrap().remove(0);
        let attempt = NewAttempt {
            envelope_id: e.id,
            agent: "orch",
            chat_id: 42,
            thread_id: None,
            reply_to_message_id: Some(1),
            chunk_index: 0,
            chunk_count: 1,
            text: "hi",
        };
        ledger.begin_attempt(&attempt).await.unwrap();
        assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);
        assert_eq!(ledger.recover_in_flight().await.unwrap(), std::slice::from_ref(&e.trace_id));
        assert_eq!(ledger.find(&e.trace_id).await.unwrap().unwrap().state, EnvelopeState::Unresolved);
        assert_eq!(ledger.attempts_for(e.id).await.unwrap()[0].outcome, "unknown");

        let state =
            ledger.reconcile(&e.trace_id, Reconciliation::NotDelivered, "not in the chat").await.unwrap();
        assert_eq!(state, EnvelopeState::Pending);
        let attempts = ledger.attempts_for(e.id).await.unwrap();
        assert_eq!(attempts[0].reconciled_outcome.as_deref(), Some("not_sent"));
        assert!(attempts[0].reconciled_reason.as_deref().unwrap().contains("not in the chat"));
        assert!(matches!(
            ledger.reconcile(&e.trace_id, Reconciliation::Delivered, "again").await,
            Err(ReconcileError::NotUnresolved { .. })
        ));
    }
}
