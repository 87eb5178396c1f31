//! The bridge between the ledger and agent sessions: each agent's inbox, its one live
//! session, and the reply and ack operations the local API exposes.
//!
//! Delivery is driven by the ledger, not by in-memory queues: a session claims the agent's
//! oldest `queued` envelope, marks it `pending` and writes it to the session stream, and
//! the poller only rings a bell (`Notify`) when it stored something. So an envelope is
//! never in memory only, and a crash at any point leaves it `queued` or `pending`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::agents::api::wire::{
    AckReceipt, AckRequest, ApiError, ErrorCode, HEARTBEAT_INTERVAL_SECS, PendingList, ReplyReceipt,
    ReplyRequest, SessionEvent,
};
use crate::ids::{AgentName, Secret, TraceId};
use crate::ledger::EnvelopeState;
use crate::ledger::{Ledger, StoredEnvelope};
use crate::rules::resolver::{self, ResolveError};
use crate::telegram::outbound::{DeliveryOutcome, Outbound, ReplyTarget};

/// Room for one envelope in flight between the session task and the HTTP body: the
/// session claims the next envelope only once the previous one was taken, so a vanished
/// client leaves at most one envelope `pending` (and it is redelivered).
const SESSION_BUFFER: usize = 1;

#[derive(Clone)]
pub struct Bridge {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Ledger,
    outbound: Outbound,
    agents: HashMap<AgentName, AgentSlot>,
    /// Stops session streams when the daemon stops.
    shutdown: CancellationToken,
    /// Session tasks, so the daemon can wait for them to finish.
    tasks: TaskTracker,
}

struct AgentSlot {
    secret: Secret,
    /// Rung when something was queued for this agent.
    wake: Notify,
    /// The connected session, if any: at most one per agent.
    session: Mutex<Option<String>>,
    /// Serialises this agent's replies and acks, so two concurrent calls cannot both
    /// resolve to the same pending envelope.
    turn: tokio::sync::Mutex<()>,
}

/// Holds an agent's session slot; dropping it frees the slot.
pub struct SessionGuard {
    bridge: Bridge,
    agent: AgentName,
    session_id: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.bridge.inner.agents.get(&self.agent) {
            let mut session = slot.session.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if session.as_deref() == Some(self.session_id.as_str()) {
                *session = None;
            }
        }
        tracing::info!(agent = %self.agent, session_id = %self.session_id, "agent session disconnected");
        let ledger = self.bridge.inner.ledger.clone();
        let session_id = std::mem::take(&mut self.session_id);
        self.bridge.inner.tasks.spawn(async move {
            if let Err(e) = ledger.session_closed(&session_id).await {
                tracing::warn!(error = %e, "could not record the end of a session");
            }
        });
    }
}

impl Bridge {
    pub fn new(
        ledger: Ledger,
        outbound: Outbound,
        secrets: BTreeMap<AgentName, Secret>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        let agents = secrets
            .into_iter()
            .map(|(name, secret)| {
                let slot = AgentSlot {
                    secret,
                    wake: Notify::new(),
                    session: Mutex::new(None),
                    turn: tokio::sync::Mutex::new(()),
                };
                (name, slot)
            })
            .collect();
        Self { inner: Arc::new(Inner { ledger, outbound, agents, shutdown, tasks }) }
    }

    /// Tells an agent's session that something was queued for it.
    pub fn wake(&self, agent: &AgentName) {
        if let Some(slot) = self.inner.agents.get(agent) {
            // notify_one keeps a permit when nobody waits, so a wake-up between the
            // session's ledger check and its wait is not lost.
            slot.wake.notify_one();
        }
    }

    /// Checks an agent's credentials. Unknown agents and wrong secrets get the same answer.
    pub fn authenticate(&self, agent: &str, bearer: Option<&str>) -> Result<AgentName, ApiError> {
        let refuse = || api_error(ErrorCode::Unauthorized, "unknown agent or wrong secret".into());
        let name = AgentName::parse(agent).map_err(|_| refuse())?;
        let slot = self.inner.agents.get(&name).ok_or_else(refuse)?;
        match bearer {
            Some(token) if slot.secret.matches(token) => Ok(name),
            _ => Err(refuse()),
        }
    }

    fn slot(&self, agent: &AgentName) -> &AgentSlot {
        // Only authenticated names reach here, and they come from this map.
        &self.inner.agents[agent]
    }

    // ---- sessions ----

    /// Opens the agent's session, refusing a second one, and returns the stream of
    /// events to send to it. The stream ends when the client goes away or the daemon stops.
    pub fn open_session(&self, agent: &AgentName) -> Result<mpsc::Receiver<SessionEvent>, ApiError> {
        let session_id = format!("ses_{}", &TraceId::generate().as_str()[4..]);
        {
            let mut session = self.slot(agent).session.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(existing) = session.as_ref() {
                tracing::warn!(%agent, existing = %existing, "refused a second session for the agent");
                return Err(api_error(
                    ErrorCode::SessionConflict,
                    format!(
                        "agent '{agent}' already has a connected session ({existing}); only one session per agent may be connected — close the other one first"
                    ),
                ));
            }
            *session = Some(session_id.clone());
        }
        let guard = SessionGuard { bridge: self.clone(), agent: agent.clone(), session_id };
        let (tx, rx) = mpsc::channel(SESSION_BUFFER);
        let bridge = self.clone();
        self.inner.tasks.spawn(async move {
            let agent = guard.agent.clone();
            if let Err(e) = bridge.run_session(&guard, tx).await {
                tracing::error!(%agent, error = %e, "agent session failed");
            }
            drop(guard);
        });
        Ok(rx)
    }

    /// Feeds one session: first the envelopes a previous session left pending (marked
    /// redelivered), then every queued envelope as it arrives, oldest first.
    async fn run_session(&self, guard: &SessionGuard, tx: mpsc::Sender<SessionEvent>) -> sqlx::Result<()> {
        let agent = &guard.agent;
        let ledger = &self.inner.ledger;
        let slot = self.slot(agent);
        let hello = SessionEvent::Hello { agent: agent.to_string(), session_id: guard.session_id.clone() };
        if tx.send(hello).await.is_err() {
            return Ok(());
        }
        let redelivered = ledger.take_pending_for_redelivery(agent).await?;
        ledger.session_opened(&guard.session_id, agent, redelivered.len()).await?;
        tracing::info!(%agent, session_id = %guard.session_id, redelivered = redelivered.len(), "agent session connected");
        for envelope in redelivered {
            if !self.hand_over(&tx, &envelope, true).await {
                return Ok(());
            }
        }
        let heartbeat = Duration::from_secs(HEARTBEAT_INTERVAL_SECS);
        loop {
            while let Some(envelope) = ledger.claim_next_queued(agent).await? {
                if !self.hand_over(&tx, &envelope, false).await {
                    return Ok(());
                }
            }
            tokio::select! {
                () = slot.wake.notified() => {}
                () = tokio::time::sleep(heartbeat) => {
                    if tx.send(SessionEvent::Heartbeat).await.is_err() {
                        return Ok(());
                    }
                }
                () = tx.closed() => return Ok(()),
                () = self.inner.shutdown.cancelled() => return Ok(()),
            }
        }
    }

    /// Writes one envelope to the session; false when the session is gone.
    async fn hand_over(
        &self,
        tx: &mpsc::Sender<SessionEvent>,
        envelope: &StoredEnvelope,
        redelivered: bool,
    ) -> bool {
        tracing::info_span!("envelope", trace_id = %envelope.trace_id).in_scope(|| {
            tracing::info!(
                agent = envelope.agent.as_deref().unwrap_or_default(),
                redelivered,
                "handed to agent session"
            )
        });
        tx.send(SessionEvent::Envelope(envelope.delivered(redelivered))).await.is_ok()
    }

    // ---- tools ----

    pub async fn pending(&self, agent: &AgentName) -> Result<PendingList, ApiError> {
        let pending = self.inner.ledger.pending(agent).await.map_err(internal)?;
        Ok(PendingList { pending: pending.iter().map(StoredEnvelope::summary).collect() })
    }

    /// Resolves the envelope a reply answers (refusing rather than guessing), then
    /// delivers it and records what happened.
    pub async fn reply(&self, agent: &AgentName, request: ReplyRequest) -> Result<ReplyReceipt, ApiError> {
        if request.text.trim().is_empty() {
            return Err(api_error(ErrorCode::BadRequest, "the reply text is empty; nothing was sent".into()));
        }
        let _turn = self.slot(agent).turn.lock().await;
        let envelope = self.resolve(agent, request.trace_id.as_deref()).await?;
        let span = tracing::info_span!("envelope", trace_id = %envelope.trace_id);
        self.deliver_reply(agent, envelope, &request.text).instrument(span).await
    }

    /// Sends a resolved reply and tells the agent what came of it.
    async fn deliver_reply(
        &self,
        agent: &AgentName,
        envelope: StoredEnvelope,
        text: &str,
    ) -> Result<ReplyReceipt, ApiError> {
        let target = ReplyTarget {
            envelope_id: envelope.id,
            trace_id: envelope.trace_id.clone(),
            agent: agent.to_string(),
            route: envelope.route.clone().unwrap_or_default(),
            chat_id: envelope.chat_id,
            thread_id: envelope.thread_id(),
            reply_to_message_id: i32::try_from(envelope.message_id).unwrap_or_default(),
        };
        match self.inner.outbound.deliver(&target, text).await.map_err(internal)? {
            // The ledger settled the envelope with the attempt that decided it: acked by
            // the last part confirmed sent, unresolved by an unknown outcome.
            DeliveryOutcome::Delivered { message_ids } => {
                tracing::info!(%agent, chat_id = target.chat_id, ?message_ids, "reply delivered");
                Ok(ReplyReceipt {
                    trace_id: target.trace_id,
                    chat_id: target.chat_id,
                    thread_id: target.thread_id,
                    route: target.route,
                    message_ids,
                })
            }
            DeliveryOutcome::NotSent { sent, error } => {
                tracing::warn!(%agent, %error, delivered_parts = sent.len(), "reply not sent");
                let partial = if sent.is_empty() {
                    String::new()
                } else {
                    format!(" The first {} part(s) were delivered (message ids {sent:?}).", sent.len())
                };
                Err(api_error(
                    ErrorCode::NotSent,
                    format!(
                        "Telegram did not take the reply to {}: {error}.{partial} The envelope is unchanged ({}); you may reply again.",
                        target.trace_id, envelope.state
                    ),
                ))
            }
            DeliveryOutcome::Unknown { sent, error } => {
                tracing::error!(%agent, %error, delivered_parts = sent.len(), "reply outcome unknown: envelope is unresolved until an operator reconciles it");
                Err(api_error(
                    ErrorCode::Unresolved,
                    format!(
                        "the reply to {} may or may not have reached the chat ({error}). It is marked unresolved and an operator will reconcile it with `switchboard ledger`. Do not send it again.",
                        target.trace_id
                    ),
                ))
            }
        }
    }

    async fn resolve(&self, agent: &AgentName, trace_id: Option<&str>) -> Result<StoredEnvelope, ApiError> {
        let ledger = &self.inner.ledger;
        let resolved = match trace_id {
            Some(raw) => {
                let trace_id = TraceId::parse(raw).map_err(|e| api_error(ErrorCode::BadRequest, e))?;
                let found = ledger.find(trace_id.as_str()).await.map_err(internal)?;
                resolver::resolve_named(agent.as_str(), trace_id.as_str(), found)
            }
            None => resolver::resolve_unnamed(ledger.pending(agent).await.map_err(internal)?),
        };
        resolved.map_err(|refusal| refused(agent, refusal))
    }

    /// Marks an envelope handled without a reply.
    pub async fn ack(&self, agent: &AgentName, request: AckRequest) -> Result<AckReceipt, ApiError> {
        let trace_id = TraceId::parse(&request.trace_id).map_err(|e| api_error(ErrorCode::BadRequest, e))?;
        let _turn = self.slot(agent).turn.lock().await;
        let found = self.inner.ledger.find(trace_id.as_str()).await.map_err(internal)?;
        let envelope = resolver::resolve_named(agent.as_str(), trace_id.as_str(), found)
            .map_err(|r| refused(agent, r))?;
        let reason =
            request.note.as_deref().map_or_else(|| "acked".to_owned(), |note| format!("acked: {note}"));
        let moved = self
            .inner
            .ledger
            .transition(
                envelope.id,
                &[EnvelopeState::Pending, EnvelopeState::Acked],
                EnvelopeState::Acked,
                &format!("agent:{agent}"),
                Some(&reason),
            )
            .await
            .map_err(internal)?;
        if !moved {
            return Err(api_error(
                ErrorCode::Internal,
                "the envelope changed state meanwhile; try again".into(),
            ));
        }
        tracing::info!(%agent, trace_id = %trace_id, "envelope acked");
        Ok(AckReceipt { trace_id: trace_id.to_string(), state: EnvelopeState::Acked.to_string() })
    }
}

/// A refusal: nothing is sent and nothing changes; logged at warn with its candidates so an
/// operator watching the logs sees it.
fn refused(agent: &AgentName, refusal: ResolveError) -> ApiError {
    let (code, candidates) = match &refusal {
        ResolveError::Ambiguous { candidates } => {
            (ErrorCode::Ambiguous, candidates.iter().map(StoredEnvelope::summary).collect())
        }
        ResolveError::NothingPending => (ErrorCode::NothingPending, Vec::new()),
        ResolveError::UnknownTraceId { .. } => (ErrorCode::UnknownTraceId, Vec::new()),
        ResolveError::NotYours { .. } => (ErrorCode::NotYours, Vec::new()),
        ResolveError::NotAnswerable { .. } => (ErrorCode::NotAnswerable, Vec::new()),
    };
    let listed: Vec<String> =
        candidates.iter().map(|c| format!("{} ({} in chat {})", c.trace_id, c.user, c.chat_id)).collect();
    tracing::warn!(%agent, code = ?code, candidates = ?listed, "reply refused: {refusal}");
    ApiError { code, message: refusal.to_string(), candidates }
}

fn api_error(code: ErrorCode, message: String) -> ApiError {
    ApiError { code, message, candidates: Vec::new() }
}

fn internal(e: sqlx::Error) -> ApiError {
    tracing::error!(error = %e, "ledger error");
    api_error(ErrorCode::Internal, format!("the switchboard ledger failed: {e}"))
}
