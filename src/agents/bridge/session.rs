//! Agent sessions: at most one live session per agent, fed from the ledger, and the token
//! that binds every tool call to it. Who may open one is [`crate::rules::sessions`]: the
//! plugin process that holds the agent replaces its own session whose stream died unnoticed,
//! and keeps the agent for a moment after its stream ended.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Bridge, SessionConflict, ToolError};
use crate::agents::api::present;
use crate::agents::api::wire::{
    DeliveredNotice, MAX_LISTED, SessionEvent, ShownReceipt, ShownRequest, WAITING_NOTICE,
};
use crate::agents::recent::RecentIds;
use crate::ids::{AgentName, TraceId, random_suffix};
use crate::ledger::{EnvelopeKind, LedgerResult, StoredEnvelope};
use crate::rules::revisions::TaskState;
use crate::rules::sessions::{self, Admission};
use crate::telegram::outbound::MessageActionTarget;

/// Room for one envelope in flight between the session task and the HTTP body: the
/// session claims the next queued envelope only once the previous one was taken. (Intake
/// may have marked more `pending` for a connected session; a vanished client leaves them
/// `pending`, and they are redelivered.)
const SESSION_BUFFER: usize = 1;

/// Long enough that a token cannot be guessed by another local client that has the
/// agent's secret but not the session stream.
const SESSION_TOKEN_LEN: usize = 32;

/// How long a plugin process whose session ended has to connect again: a stream that broke
/// (a network blip, a ledger error that ended it) is opened again within seconds. Meanwhile
/// the agent is kept for it (another plugin, a second window in the same project, must not
/// take the agent and its pending envelopes), and its permission requests stay pending.
pub(super) const RECONNECT_GRACE: Duration = Duration::from_secs(10);

/// How many trace ids a session remembers as handed to it, and as shown. An agent with
/// more envelopes than that waiting unanswered must name the older ones in its replies.
const SIGHTINGS_KEPT: usize = 1024;

/// The agent's connected session.
pub(super) struct LiveSession {
    /// Named in logs and the audit table.
    id: String,
    /// Known only to whoever reads the session stream; never logged.
    token: String,
    /// The plugin process behind the session, as it named itself (`wire::PLUGIN_HEADER`): the
    /// one that permission verdicts go to.
    plugin: Option<String>,
    sightings: Sightings,
    /// Ends this session's stream when its plugin replaces it or leaves (or the daemon
    /// stops).
    ended: CancellationToken,
    /// Its plugin said it is leaving: the agent is not kept for it.
    left: bool,
}

/// The agent is kept for the plugin process that held it until `until`.
pub(super) struct Reservation {
    plugin: String,
    until: tokio::time::Instant,
}

/// The envelopes handed to a live session, and those of them its plugin confirmed it
/// pushed into the agent's context: an unnamed reply resolves only among the latter.
///
/// Kept with the session rather than in the ledger. A confirmation means something only
/// to the session that made it (a redelivery to the next session must be shown again), so
/// it has nothing to survive; stored, it cost a write transaction on every message's path.
/// Bounded, oldest forgotten first: forgetting can only make an unnamed reply ask for its
/// trace id, never answer an envelope the agent was not shown.
#[derive(Default)]
struct Sightings {
    handed: RecentIds<SIGHTINGS_KEPT>,
    shown: RecentIds<SIGHTINGS_KEPT>,
}

impl super::AgentSlot {
    /// The live session with id `session`, locked, if it is still the live one.
    fn with_live_session<T>(&self, session: &str, f: impl FnOnce(&mut LiveSession) -> T) -> Option<T> {
        let mut live = self.session.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        live.as_mut().filter(|live| live.id == session).map(f)
    }

    /// Whether the connected session, whichever it is, has this envelope in front of its
    /// agent: it confirmed showing it, or it was handed the envelope, which a plugin
    /// pushes at once (it opens its stream only once its agent session is ready, and
    /// confirms with the agent's next call to it, which may be the reply itself). A stream
    /// whose reader is gone is noticed when its connection closes (at once for a plugin on
    /// this host), or else at the latest when a heartbeat fails, and its session with it.
    pub(super) fn in_front_of_live_session(&self, trace_id: &str) -> bool {
        let live = self.session.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        live.as_ref().is_some_and(|live| {
            live.sightings.shown.contains(trace_id) || live.sightings.handed.contains(trace_id)
        })
    }

    /// Whether the live session `session` confirmed it showed the agent this envelope.
    pub(super) fn was_shown(&self, session: &str, trace_id: &str) -> bool {
        self.with_live_session(session, |live| live.sightings.shown.contains(trace_id)).unwrap_or(false)
    }
}

/// A session the daemon registered: its hello and the stream of events that follows.
pub struct OpenedSession {
    pub events: mpsc::Receiver<SessionEvent>,
}

/// Holds an agent's session slot; dropping it frees the slot.
pub(super) struct SessionGuard {
    bridge: Bridge,
    pub(super) agent: AgentName,
    session_id: String,
    /// The plugin process behind the session, if it named itself.
    pub(super) plugin: Option<String>,
    /// The permission verdicts this stream has carried: each is written once per stream,
    /// and again on the plugin's next stream until the plugin confirms it.
    verdicts_carried: Mutex<HashSet<String>>,
    /// Cancelled when the session is replaced by its plugin's next one, or the daemon stops.
    ended: CancellationToken,
}

impl SessionGuard {
    /// Whether the verdict of request `permission_id` is still to be written to this
    /// stream; from now on it is not.
    pub(super) fn carries_verdict(&self, permission_id: &str) -> bool {
        let mut carried = self.verdicts_carried.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        carried.insert(permission_id.to_owned())
    }

    /// `step`'s answer (false: the stream is gone), or false once the session ended first:
    /// a replaced session must not go on writing into a stream nobody reads.
    async fn while_live(
        &self,
        step: impl std::future::Future<Output = LedgerResult<bool>>,
    ) -> LedgerResult<bool> {
        tokio::select! {
            done = step => done,
            () = self.ended.cancelled() => Ok(false),
        }
    }

    /// Writes one event to the session's stream; false once the stream is gone or the
    /// session ended. A stream whose peer died may take no more (its connection's buffer
    /// is full): a session that was replaced must not wait on it.
    async fn send(&self, tx: &mpsc::Sender<SessionEvent>, event: SessionEvent) -> bool {
        tokio::select! {
            biased;
            () = self.ended.cancelled() => false,
            sent = tx.send(event) => sent.is_ok(),
        }
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.bridge.inner.agents.get(&self.agent) {
            let mut session = slot.session.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(live) = session.take_if(|live| live.id == self.session_id) {
                // Kept for this plugin while it reconnects, unless it said it is leaving; a
                // daemon that stops keeps nothing in memory.
                let reconnecting = !live.left && !self.bridge.inner.shutdown.is_cancelled();
                if let Some(plugin) = self.plugin.clone().filter(|_| reconnecting) {
                    let until = tokio::time::Instant::now() + RECONNECT_GRACE;
                    *slot.reserved.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                        Some(Reservation { plugin, until });
                }
            }
        }
        tracing::info!(agent = %self.agent, session_id = %self.session_id, "agent session disconnected");
        self.bridge.plugin_session_ended(&self.agent, self.plugin.take());
        let ledger = self.bridge.inner.ledger.clone();
        let session_id = std::mem::take(&mut self.session_id);
        self.bridge.inner.tasks.spawn(async move {
            if let Err(e) = ledger.session_closed(&session_id).await {
                tracing::warn!(error = %e, "could not record the end of a session");
            }
        });
    }
}

/// What opening a session leaves to serving it.
struct OpenedStream {
    /// Intake's envelopes for the session, handed over from memory once committed.
    direct: mpsc::UnboundedReceiver<StoredEnvelope>,
    /// Whether envelopes waited for this session (it was handed envelopes taken back).
    waited: bool,
}

impl Bridge {
    /// Opens the agent's session and returns the stream of events to send to it, as
    /// [`sessions::admit`] decides: a second plugin's is refused, and so is another plugin's
    /// while the agent is kept for the one whose session just ended; the same plugin's
    /// replaces its own session. The stream ends when the client goes away, its plugin
    /// replaces it, or the daemon stops. `plugin` is the plugin process's name for itself,
    /// when it gave one.
    pub fn open_session(
        &self,
        agent: &AgentName,
        plugin: Option<String>,
    ) -> Result<OpenedSession, SessionConflict> {
        let session_id = format!("ses_{}", &TraceId::generate().as_str()[4..]);
        let token = random_suffix(SESSION_TOKEN_LEN);
        let ended = self.inner.shutdown.child_token();
        {
            let slot = self.slot(agent);
            let mut session = slot.session.lock().unwrap_or_else(|p| p.into_inner());
            let mut reserved = slot.reserved.lock().unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            let admission = sessions::admit(
                session.as_ref().map(|live| sessions::Live { plugin: live.plugin.as_deref() }),
                reserved
                    .as_ref()
                    .map(|kept| sessions::Reserved { plugin: &kept.plugin, until: kept.until.into_std() }),
                plugin.as_deref(),
                now.into_std(),
            );
            match admission {
                Admission::Open => {}
                Admission::Replace => {
                    if let Some(replaced) = session.as_ref() {
                        // Its envelopes stay pending and are redelivered to this session, as
                        // after any reconnect; its plugin's permission requests stay pending.
                        tracing::info!(%agent, replaced = %replaced.id, session_id, "the plugin connected again while its previous session's stream seemed alive: that one is ended and replaced");
                        replaced.ended.cancel();
                    }
                }
                Admission::Connected => {
                    let existing = session.as_ref().map(|live| live.id.clone()).unwrap_or_default();
                    tracing::warn!(%agent, %existing, "refused a second session for the agent");
                    return Err(SessionConflict::Connected { agent: agent.to_string(), existing });
                }
                Admission::Reserved { retry_in } => {
                    // Whole seconds, rounded up: "retry in 0 s" would be refused again.
                    let retry_in_secs = retry_in.as_secs() + u64::from(retry_in.subsec_nanos() > 0);
                    tracing::warn!(%agent, retry_in_secs, "refused a session: the agent is kept for the plugin whose session just ended");
                    return Err(SessionConflict::Reserved { agent: agent.to_string(), retry_in_secs });
                }
            }
            *reserved = None;
            *session = Some(LiveSession {
                id: session_id.clone(),
                token: token.clone(),
                plugin: plugin.clone(),
                sightings: Sightings::default(),
                ended: ended.clone(),
                left: false,
            });
        }
        let guard = SessionGuard {
            bridge: self.clone(),
            agent: agent.clone(),
            session_id,
            plugin,
            verdicts_carried: Mutex::default(),
            ended,
        };
        let (tx, rx) = mpsc::channel(SESSION_BUFFER);
        let bridge = self.clone();
        self.inner.tasks.spawn(async move {
            let agent = guard.agent.clone();
            if let Err(e) = bridge.run_session(&guard, token, tx).await {
                tracing::error!(%agent, error = %e, "agent session failed");
            }
            drop(guard);
        });
        Ok(OpenedSession { events: rx })
    }

    /// A daemon that starts keeps each agent a moment for the plugin process whose session
    /// it had last (`held`, as the ledger recorded them, `(agent, plugin)`): that plugin
    /// reconnects within seconds, and another must not take the agent and its pending
    /// envelopes by reconnecting first.
    pub async fn keep_agents_for_their_last_plugins(&self) {
        let held = match self.inner.ledger.last_session_plugins().await {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(%error, "could not read which plugin held each agent; the first to connect gets it");
                return;
            }
        };
        let until = tokio::time::Instant::now() + RECONNECT_GRACE;
        for (agent, plugin) in held {
            let Some(slot) = AgentName::parse(&agent).ok().and_then(|agent| self.inner.agents.get(&agent))
            else {
                continue;
            };
            let session = slot.session.lock().unwrap_or_else(|p| p.into_inner());
            if session.is_none() {
                *slot.reserved.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Reservation { plugin, until });
            }
        }
    }

    /// The live session's plugin is leaving (its agent session ended): its stream ends, and
    /// the agent is free for the next session at once.
    pub fn end_session(&self, agent: &AgentName, token: Option<&str>) -> Result<(), ToolError> {
        let session = self.live_session(agent, token)?;
        self.slot(agent).with_live_session(&session, |live| {
            live.left = true;
            live.ended.cancel();
        });
        tracing::info!(%agent, session_id = %session, "the agent session's plugin is leaving");
        // So that a daemon that starts does not keep the agent for it either.
        let ledger = self.inner.ledger.clone();
        self.inner.tasks.spawn(async move {
            if let Err(e) = ledger.session_left(&session).await {
                tracing::warn!(error = %e, "could not record that a session's plugin left");
            }
        });
        Ok(())
    }

    /// The agents with a connected session now, in name order (for `/readyz` and
    /// `/metrics`).
    pub fn connected_agents(&self) -> Vec<String> {
        let connected =
            |slot: &super::AgentSlot| slot.session.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        let mut agents: Vec<String> = self
            .inner
            .agents
            .iter()
            .filter(|(_, slot)| connected(slot))
            .map(|(agent, _)| agent.to_string())
            .collect();
        agents.sort();
        agents
    }

    /// The live session's id when `token` is its token; every tool call goes through here.
    pub(super) fn live_session(&self, agent: &AgentName, token: Option<&str>) -> Result<String, ToolError> {
        let session = self.slot(agent).session.lock().unwrap_or_else(|p| p.into_inner());
        match (session.as_ref(), token) {
            (Some(live), Some(token)) if live.token == token => Ok(live.id.clone()),
            _ => {
                tracing::warn!(%agent, "tool call refused: not from the agent's live session");
                Err(ToolError::NotLiveSession { agent: agent.to_string() })
            }
        }
    }

    /// The plugin process behind the agent's live session, if one is connected and named
    /// itself.
    pub(super) fn live_plugin(&self, agent: &AgentName) -> Option<String> {
        let session = self.slot(agent).session.lock().unwrap_or_else(|p| p.into_inner());
        session.as_ref().and_then(|live| live.plugin.clone())
    }

    /// The live session's id and its plugin's name when `token` is its token.
    pub(super) fn live_session_and_plugin(
        &self,
        agent: &AgentName,
        token: Option<&str>,
    ) -> Result<(String, Option<String>), ToolError> {
        let id = self.live_session(agent, token)?;
        let plugin = self.slot(agent).with_live_session(&id, |live| live.plugin.clone()).flatten();
        Ok((id, plugin))
    }

    /// Checks that a call comes from the agent's live session (for calls that need
    /// nothing else from it).
    pub fn check_session(&self, agent: &AgentName, token: Option<&str>) -> Result<(), ToolError> {
        self.live_session(agent, token).map(drop)
    }

    /// The plugin pushed an envelope into the agent's context: from now on an unnamed
    /// reply in this session may resolve to it. Only an envelope handed to this session
    /// can be marked; the receipt says whether it was.
    pub fn shown(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: ShownRequest,
    ) -> Result<ShownReceipt, ToolError> {
        let trace_id = TraceId::parse(&request.trace_id).map_err(ToolError::Invalid)?;
        let marked = self.mark_shown(agent, token, std::slice::from_ref(&trace_id))? == 1;
        Ok(ShownReceipt { marked })
    }

    /// [`Self::shown`] for several envelopes at once (a call's `x-switchboard-shown`
    /// header); returns how many were handed to this session and are now marked.
    pub fn mark_shown(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        trace_ids: &[TraceId],
    ) -> Result<usize, ToolError> {
        let session = self.live_session(agent, token)?;
        let mut newly_shown = false;
        let marked = self.slot(agent).with_live_session(&session, |live| {
            let handed: Vec<&TraceId> =
                trace_ids.iter().filter(|id| live.sightings.handed.contains(id.as_str())).collect();
            for trace_id in &handed {
                newly_shown |= !live.sightings.shown.contains(trace_id.as_str());
                live.sightings.shown.insert(trace_id.as_str());
            }
            handed.len()
        });
        if newly_shown {
            self.inner.shown_bell.notify_one();
        }
        Ok(marked.unwrap_or(0))
    }

    /// Feeds one session: first the envelopes a previous session left pending (marked
    /// redelivered), then every queued envelope as it arrives, oldest first.
    async fn run_session(
        &self,
        guard: &SessionGuard,
        session_token: String,
        tx: mpsc::Sender<SessionEvent>,
    ) -> LedgerResult<()> {
        match self.open_stream(guard, session_token, &tx).await? {
            Some(opened) => self.serve_session(guard, &tx, opened).await,
            None => Ok(()),
        }
    }

    /// The opening of a session's stream: its hello, then the verdicts and the envelopes
    /// that waited for its plugin. `None` once the stream is gone.
    async fn open_stream(
        &self,
        guard: &SessionGuard,
        session_token: String,
        tx: &mpsc::Sender<SessionEvent>,
    ) -> LedgerResult<Option<OpenedStream>> {
        let agent = &guard.agent;
        let ledger = &self.inner.ledger;
        let slot = self.slot(agent);
        let hello = SessionEvent::Hello {
            agent: agent.to_string(),
            session_id: guard.session_id.clone(),
            session_token,
            heartbeat_ms: u64::try_from(self.inner.session_heartbeat.as_millis()).unwrap_or(u64::MAX),
        };
        if !guard.send(tx, hello).await {
            return Ok(None);
        }
        // Verdicts recorded while this plugin was away (the daemon restarted) go first. Its
        // writes come before the envelopes are taken back: a ledger that refuses them
        // (locked, full) ends the opening before anything is counted as delivered.
        if !guard.while_live(self.plugin_session_opened(guard, tx)).await? {
            return Ok(None);
        }
        // Under the inbox lock, so intake claims nothing for this agent between taking the
        // pending envelopes back and registering the inbox: whatever it claimed before is
        // pending now and redelivered here; whatever it claims after comes through the inbox.
        let (inbox, direct) = mpsc::unbounded_channel();
        let redelivered = {
            let mut registered = slot.inbox.lock().await;
            let redelivered = ledger.take_pending_for_redelivery(agent).await?;
            *registered = Some(inbox);
            redelivered
        };
        // Only an audit row: once the envelopes are counted as delivered again, the session
        // gets them whether or not it could be written, so the ledger's counts stay true.
        if let Err(error) =
            ledger.session_opened(&guard.session_id, agent, guard.plugin.as_deref(), redelivered.len()).await
        {
            tracing::warn!(%agent, session_id = %guard.session_id, %error, "the session's opening could not be recorded; serving it all the same");
        }
        tracing::info!(%agent, session_id = %guard.session_id, redelivered = redelivered.len(), plugin = guard.plugin.as_deref().unwrap_or("-"), "agent session connected");
        let waited = !redelivered.is_empty();
        for envelope in redelivered {
            if !self.hand_over(guard, tx, &envelope, true).await {
                return Ok(None);
            }
        }
        Ok(Some(OpenedStream { direct, waited }))
    }

    /// Serves an opened session until its stream or the daemon ends: intake's envelopes
    /// and the queued ones as they come, oldest first, then the notices, reactions and
    /// verdicts owed to it, with a heartbeat while there is nothing.
    async fn serve_session(
        &self,
        guard: &SessionGuard,
        tx: &mpsc::Sender<SessionEvent>,
        opened: OpenedStream,
    ) -> LedgerResult<()> {
        let agent = &guard.agent;
        let ledger = &self.inner.ledger;
        let slot = self.slot(agent);
        let OpenedStream { mut direct, mut waited } = opened;
        // Whether the backlog (claimed before the session first finds nothing left to
        // take) is behind it: the `waiting` notice follows it once.
        let mut backlog_taken = false;
        let heartbeat = self.inner.session_heartbeat;
        // Whether queued envelopes may wait in the ledger: at first, and after each wake-up.
        let mut look_in_ledger = true;
        let mut look_for_reactions = true;
        loop {
            // Intake's envelopes first: its claim took every queued envelope of the agent,
            // so any still queued is younger.
            let next = {
                let _claiming = slot.inbox.lock().await;
                // A session its plugin replaced claims nothing more (checked under the lock
                // the next session takes the pending envelopes under): what it claimed
                // would go to a stream nobody reads, and wait there for a reconnect.
                if guard.ended.is_cancelled() {
                    return Ok(());
                }
                match direct.try_recv() {
                    Ok(envelope) => Some(envelope),
                    Err(_) if look_in_ledger => ledger.claim_next_queued(agent).await?,
                    Err(_) => None,
                }
            };
            if let Some(envelope) = next {
                // Queued again after it was handed over once (an operator found its reply
                // never arrived): the agent sees it marked redelivered.
                let redelivered = envelope.deliveries > 1;
                if !self.hand_over(guard, tx, &envelope, redelivered).await {
                    return Ok(());
                }
                waited |= !backlog_taken;
                continue;
            }
            look_in_ledger = false;
            if !std::mem::replace(&mut backlog_taken, true)
                && waited
                && let Some(notice) = self.waiting_notice(agent).await?
                && !guard.send(tx, SessionEvent::Notice(notice)).await
            {
                return Ok(());
            }
            while let Some(notice) = slot.take_notice() {
                if !guard.send(tx, SessionEvent::Notice(notice)).await {
                    return Ok(());
                }
            }
            // Reactions owed in the ledger: at first, and after each wake-up (intake rings
            // the bell for a reaction as for an envelope).
            if std::mem::take(&mut look_for_reactions)
                && !guard.while_live(self.give_owed_reactions(agent, tx)).await?
            {
                return Ok(());
            }
            tokio::select! {
                biased;
                envelope = direct.recv() => {
                    // The sender stays in the slot until the next session replaces it.
                    let Some(envelope) = envelope else { return Ok(()) };
                    if !self.hand_over(guard, tx, &envelope, false).await {
                        return Ok(());
                    }
                }
                () = slot.wake.notified() => {
                    look_in_ledger = true;
                    look_for_reactions = true;
                }
                () = slot.verdicts.notified() => {
                    if !guard.while_live(self.hand_over_verdicts(guard, tx)).await? {
                        return Ok(());
                    }
                }
                () = tokio::time::sleep(heartbeat) => {
                    if !guard.send(tx, SessionEvent::Heartbeat).await {
                        return Ok(());
                    }
                    // A quiet while is also when the ledger is looked in without a wake:
                    // work recorded where no bell rang for it (on PostgreSQL, a deposed
                    // replica's late write) still reaches the session, a heartbeat later.
                    look_in_ledger = true;
                    look_for_reactions = true;
                }
                () = tx.closed() => return Ok(()),
                // Replaced by its plugin's next session, or the daemon stops.
                () = guard.ended.cancelled() => return Ok(()),
            }
        }
    }

    /// The one notice a session gets after the envelopes that waited for it (DESIGN.md §8,
    /// kind `waiting`): how many are still pending, with their trace ids. Each came as its
    /// own notification; should the agent session have lost one (a client that drops what
    /// comes before it is ready, or anything else between the plugin and the model), this
    /// says what to answer. About the oldest of them; `None` when all were answered already.
    async fn waiting_notice(&self, agent: &AgentName) -> LedgerResult<Option<DeliveredNotice>> {
        let pending = self.inner.ledger.pending(agent).await?;
        let Some(oldest) = pending.first() else { return Ok(None) };
        let listed: Vec<String> = pending
            .iter()
            .take(MAX_LISTED)
            .map(|envelope| {
                let summary = present::summary(envelope);
                format!(
                    "- trace_id {} from {} in chat {}: \"{}\"",
                    summary.trace_id, summary.user, summary.chat_id, summary.preview
                )
            })
            .collect();
        let count = pending.len();
        let more = if count > listed.len() {
            format!("\n(and {} more: `pending` lists them)", count - listed.len())
        } else {
            String::new()
        };
        let content = format!(
            "No new message: {count} waiting for your answer, each delivered to you as its own <channel> event \
             at the start of this session:\n{}{more}\nAnswer each with `reply` naming its trace_id, or `ack` one \
             that needs no answer; `pending` lists them again.",
            listed.join("\n")
        );
        let extra = BTreeMap::from([("waiting".to_owned(), count.to_string())]);
        Ok(Some(DeliveredNotice {
            trace_id: oldest.trace_id.to_string(),
            kind: WAITING_NOTICE.to_owned(),
            content,
            ts: crate::clock::now_text(),
            extra,
        }))
    }

    /// Writes one envelope to the session; false when the session is gone.
    async fn hand_over(
        &self,
        guard: &SessionGuard,
        tx: &mpsc::Sender<SessionEvent>,
        envelope: &StoredEnvelope,
        redelivered: bool,
    ) -> bool {
        // Per-message chatter: an operator follows a message by its `envelope recorded` and
        // `reply delivered` lines (and a redelivery by the session's `connected` line).
        tracing::debug_span!("envelope", trace_id = %envelope.trace_id).in_scope(|| {
            tracing::debug!(
                agent = envelope.agent.as_deref().unwrap_or_default(),
                redelivered,
                "handed to agent session"
            )
        });
        if !redelivered {
            crate::operate::metrics::envelope_handed_over(envelope.kind, envelope.received_at);
        }
        let mut delivered = present::delivered(envelope, redelivered);
        let extra = match envelope.kind {
            EnvelopeKind::Handoff | EnvelopeKind::HandoffAnswer => self.handoff_meta(envelope).await,
            EnvelopeKind::RoomTurn => self.room_meta(envelope).await,
            _ => Ok(Default::default()),
        };
        match extra {
            Ok(extra) => delivered.extra.extend(extra),
            Err(e) => {
                tracing::warn!(trace_id = %envelope.trace_id, error = %e, "could not read what an envelope belongs to")
            }
        }
        // A pause or a cancel notice is not stored: a session that missed it learns the
        // task's state from the redelivered envelope (`task_state`), as a room turn carries
        // `stop_requested_by`.
        if let (true, Some(task_id)) = (redelivered, &envelope.task_id) {
            match self.inner.ledger.task_state(task_id).await {
                Ok(Some(state)) if state != TaskState::Open => {
                    delivered.extra.insert("task_state".to_owned(), state.as_str().to_owned());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(trace_id = %envelope.trace_id, error = %e, "could not read an envelope's task")
                }
            }
        }
        // Before the session can see it, so that its confirmation finds it.
        self.slot(&guard.agent)
            .with_live_session(&guard.session_id, |live| live.sightings.handed.insert(&envelope.trace_id));
        // Its chat may start showing "typing…" (`telegram::typing`).
        self.inner.shown_bell.notify_one();
        let handed = guard.send(tx, SessionEvent::Envelope(delivered)).await;
        if let (true, EnvelopeKind::Message, Some(emoji)) =
            (handed, envelope.kind, self.limits().ack_reaction)
        {
            self.react_on_hand_over(envelope, emoji);
        }
        handed
    }

    /// `[outbound] ack_reaction` on a user message just handed to its session, as a task
    /// of its own: it never holds up the session stream.
    fn react_on_hand_over(&self, envelope: &StoredEnvelope, emoji: &'static str) {
        let Ok(message_id) = i32::try_from(envelope.message_id) else { return };
        let target = MessageActionTarget {
            envelope_id: envelope.id,
            trace_id: envelope.trace_id.to_string(),
            agent: envelope.agent.clone().unwrap_or_default(),
            chat_id: envelope.chat_id,
            request_id: format!("ack_reaction:{}", envelope.trace_id),
        };
        let outbound = self.inner.outbound.clone();
        self.inner.tasks.spawn(async move { outbound.ack_reaction(&target, message_id, emoji).await });
    }
}
