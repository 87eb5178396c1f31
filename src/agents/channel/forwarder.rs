//! The session stream: from the daemon's local API into the agent session, reconnecting
//! with backoff while the daemon is away.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::{self, BoxFuture};
use futures::stream::FuturesOrdered;
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::agents::api::client::{ClientError, DaemonClient};
use crate::agents::api::wire::{DeliveredEnvelope, DeliveredNotice, ErrorCode, SessionEvent};
use crate::backoff::Backoff;
use crate::ids::AgentName;

use super::calls::WaitingCalls;
use super::downloads::{EAGER_DOWNLOAD_TIMEOUT, attach_image_path};
use super::texts::{ToolNames, channel_notification, notice_notification};

/// First wait before reopening the session stream after the daemon went away; it doubles
/// up to [`MAX_RECONNECT_DELAY`], so a restarting daemon is found again within seconds.
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(500);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

/// Wait between attempts while the daemon refuses this session (another session of the
/// agent is connected, or the secret is wrong): someone has to act first, and polling
/// faster would only fight the other session.
const REFUSED_RETRY_DELAY: Duration = Duration::from_secs(5);

/// Feeds the daemon's session stream into the agent session, reconnecting until shutdown.
pub(super) struct SessionForwarder {
    pub(super) daemon: DaemonClient,
    pub(super) secret_env: String,
    pub(super) peer: Peer<RoleServer>,
    /// Whether the daemon refuses the stream right now (see `ChannelPlugin::stream_refused`).
    pub(super) refused: Arc<AtomicBool>,
    /// `call_agent` calls waiting for a `handoff_answer`.
    pub(super) calls: WaitingCalls,
    /// The names of the tools, for the notifications' `how_to_answer`.
    pub(super) tools: ToolNames,
    /// The inbox a photo is fetched into before its envelope is pushed.
    pub(super) media: super::Media,
    /// What the session was shown, noted as each envelope is pushed.
    pub(super) shown: super::shown::SharedShown,
    /// The permission verdicts handed to Claude Code, so that one the daemon writes again
    /// (it had no confirmation yet) is confirmed, not handed twice.
    pub(super) verdicts: super::permissions::HandedVerdicts,
}

/// Why one connection of the session stream ended.
#[derive(Debug)]
enum SessionEnd {
    /// The daemon closed the stream (it is stopping, or it let this session go).
    Closed,
    /// Opening or reading the stream failed.
    Failed(ClientError),
    /// The agent session no longer takes notifications: it is ending.
    AgentGone,
}

impl SessionForwarder {
    pub(super) async fn run(self, shutdown: CancellationToken) {
        let mut reconnect = Reconnect::default();
        // The last problem logged, so a daemon that stays down is reported once, not every 5s.
        let mut reported: Option<String> = None;
        loop {
            let end = tokio::select! {
                () = shutdown.cancelled() => return,
                end = self.stream_once(&mut reconnect, &mut reported) => end,
            };
            let delay = match &end {
                SessionEnd::AgentGone => {
                    tracing::debug!(
                        "the agent session stopped taking notifications; stopping the session stream"
                    );
                    return;
                }
                SessionEnd::Closed => {
                    tracing::info!(daemon = %self.daemon.address(), "the daemon closed the session stream; reconnecting");
                    reconnect.after_failure(None)
                }
                SessionEnd::Failed(error) => {
                    self.refused.store(matches!(error, ClientError::Refused { .. }), Ordering::SeqCst);
                    let problem =
                        session_problem(error, self.daemon.agent(), &self.secret_env, &self.daemon.address());
                    if reported.as_deref() == Some(problem.text.as_str()) {
                        tracing::debug!("{}", problem.text);
                    } else {
                        match problem.severity {
                            Severity::Warn => tracing::warn!("{}", problem.text),
                            Severity::Error => tracing::error!("{}", problem.text),
                        }
                        reported = Some(problem.text);
                    }
                    reconnect.after_failure(Some(error))
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
                // A tool call waits for the session: try now, within what it waits.
                () = self.daemon.session_wanted() => {}
            }
        }
    }

    /// One connection: open the stream, push envelopes until it ends.
    ///
    /// An envelope whose photo is being fetched waits in `queue`, and so does everything
    /// the stream brought after it (order is kept), while the stream is read on: a slow
    /// photo holds back what came after it for its own bounded wait only, never the
    /// reading, and a permission verdict or a `call_agent`'s answer not at all.
    async fn stream_once(&self, reconnect: &mut Reconnect, reported: &mut Option<String>) -> SessionEnd {
        let mut session = match self.daemon.open_session().await {
            Ok(session) => session,
            Err(error) => return SessionEnd::Failed(error),
        };
        reconnect.connected();
        self.refused.store(false, Ordering::SeqCst);
        if reported.take().is_some() {
            tracing::info!(daemon = %self.daemon.address(), session_id = %session.session_id, "connected to the switchboard daemon again");
        } else {
            tracing::info!(daemon = %self.daemon.address(), session_id = %session.session_id, "connected to the switchboard daemon");
        }
        let mut queue: FuturesOrdered<BoxFuture<'_, Push>> = FuturesOrdered::new();
        let end = loop {
            tokio::select! {
                // What is ready goes in first; reading the stream resumes right after.
                biased;
                Some(ready) = queue.next() => {
                    if self.push(ready).await.is_err() {
                        return SessionEnd::AgentGone;
                    }
                }
                event = session.next_event() => match event {
                    Ok(Some(SessionEvent::Envelope(envelope))) => {
                        if let Some(envelope) = self.not_a_calls_answer(envelope).await {
                            queue.push_back(self.prepared(envelope));
                        }
                    }
                    // About an envelope the session has, or has queued: it goes after it.
                    Ok(Some(SessionEvent::Notice(notice))) => {
                        queue.push_back(Box::pin(future::ready(Push::Notice(notice))));
                    }
                    // Claude Code waits on it to go on with a tool call: it goes at once.
                    Ok(Some(SessionEvent::PermissionVerdict(verdict))) => {
                        if self.verdicts.hand_over(&verdict) {
                            let notification = super::permissions::verdict_notification(&verdict);
                            if self.notify(notification).await.is_err() {
                                return SessionEnd::AgentGone;
                            }
                            tracing::info!(request_id = %verdict.request_id, behavior = %verdict.behavior, "permission verdict handed to the agent session");
                        }
                        super::permissions::confirm_handed(self.daemon.clone(), verdict);
                    }
                    Ok(Some(SessionEvent::Heartbeat)) => {}
                    Ok(Some(SessionEvent::Hello { .. })) => {
                        tracing::warn!("the daemon said hello twice on one session stream; ignoring it");
                    }
                    Ok(None) => break SessionEnd::Closed,
                    // One bad line does not spoil the stream; its envelope stays pending in
                    // the ledger and is listed by `pending`.
                    Err(error @ ClientError::Protocol { .. }) => {
                        tracing::warn!("skipping a session line: {error}")
                    }
                    Err(error) => break SessionEnd::Failed(error),
                },
            }
        };
        // The stream is over, and its session with it: tool calls made while the photos
        // below are fetched wait for the next session rather than present a token the daemon
        // may have forgotten (it restarted) and be refused.
        drop(session);
        // Every envelope read is pushed once, in order, also when the stream is gone: each
        // waits for its photo no longer than its own deadline.
        while let Some(ready) = queue.next().await {
            if self.push(ready).await.is_err() {
                return SessionEnd::AgentGone;
            }
        }
        end
    }

    /// An envelope to push, or `None` when it was the answer a waiting `call_agent` takes
    /// as its result. A change that retires handoffs ends the calls waiting on them.
    async fn not_a_calls_answer(&self, envelope: DeliveredEnvelope) -> Option<DeliveredEnvelope> {
        if envelope.kind == "handoff_answer" {
            return self.calls.deliver(envelope).await;
        }
        self.calls.retire(&envelope).await;
        Some(envelope)
    }

    /// The envelope, once its photo is fetched into the inbox (`meta.image_path`, so the
    /// model can look at it at once) or given up on [`EAGER_DOWNLOAD_TIMEOUT`] after now,
    /// its arrival.
    fn prepared(&self, mut envelope: DeliveredEnvelope) -> BoxFuture<'_, Push> {
        let give_up_at = tokio::time::Instant::now() + EAGER_DOWNLOAD_TIMEOUT;
        Box::pin(async move {
            let max_bytes = self.media.eager_photo_max_bytes;
            attach_image_path(&self.daemon, &self.media.inbox, &mut envelope, max_bytes, give_up_at).await;
            Push::Envelope(envelope)
        })
    }

    /// Hands an envelope or a notice to the agent session.
    async fn push(&self, ready: Push) -> Result<(), AgentGone> {
        match ready {
            Push::Envelope(envelope) => {
                // Noted before the push, so that every tool call the agent makes once it
                // has seen the envelope confirms it to the daemon (see
                // `DaemonClient::note_shown`).
                self.daemon.note_shown(&envelope.trace_id);
                let sighting = self.shown.note(&envelope);
                self.notify(channel_notification(&envelope, sighting, &self.tools)).await?;
                tracing::debug!(trace_id = %envelope.trace_id, redelivered = envelope.redelivered, "envelope pushed into the agent session");
            }
            Push::Notice(notice) => {
                // About an envelope the session already has: nothing to confirm.
                self.notify(notice_notification(&notice, &self.tools)).await?;
                tracing::debug!(trace_id = %notice.trace_id, kind = %notice.kind, "notice pushed into the agent session");
            }
        }
        Ok(())
    }

    async fn notify(&self, notification: CustomNotification) -> Result<(), AgentGone> {
        let notification = ServerNotification::CustomNotification(notification);
        self.peer.send_notification(notification).await.map_err(|_| AgentGone)
    }
}

/// What goes into the agent session, in the order the stream brought it.
enum Push {
    /// An envelope, its photo fetched or given up on.
    Envelope(DeliveredEnvelope),
    /// A notice about an envelope pushed before it.
    Notice(DeliveredNotice),
}

/// The agent session no longer takes notifications: it is ending.
#[derive(Debug)]
struct AgentGone;

/// Delays between attempts to open the session stream.
#[derive(Debug)]
struct Reconnect {
    backoff: Backoff,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self { backoff: Backoff::new(FIRST_RECONNECT_DELAY, MAX_RECONNECT_DELAY) }
    }
}

impl Reconnect {
    fn connected(&mut self) {
        self.backoff.reset();
    }

    /// The wait before the next attempt. A refusal waits [`REFUSED_RETRY_DELAY`]; anything
    /// else backs off from [`FIRST_RECONNECT_DELAY`] to [`MAX_RECONNECT_DELAY`].
    fn after_failure(&mut self, error: Option<&ClientError>) -> Duration {
        if error.is_some_and(|e| matches!(e, ClientError::Refused { .. })) {
            return REFUSED_RETRY_DELAY;
        }
        self.backoff.next_delay()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Severity {
    Warn,
    Error,
}

/// A session-stream failure as the operator reads it on stderr.
#[derive(Debug, PartialEq, Eq)]
struct SessionProblem {
    severity: Severity,
    text: String,
}

fn session_problem(
    error: &ClientError,
    agent: &AgentName,
    secret_env: &str,
    address: &str,
) -> SessionProblem {
    let retry_secs = REFUSED_RETRY_DELAY.as_secs();
    let (severity, text) = match error {
        ClientError::Refused { error: refusal, .. } => match refusal.code {
            ErrorCode::SessionConflict => (
                Severity::Error,
                format!(
                    "another session for agent '{agent}' is already connected to the switchboard daemon at \
                     {address}, or the agent is kept for it while it reconnects ({}); this one gets no messages \
                     until that one ends (checking again every {retry_secs}s)",
                    refusal.message
                ),
            ),
            ErrorCode::Unauthorized => (
                Severity::Error,
                format!(
                    "the switchboard daemon at {address} refused the secret of agent '{agent}' (from ${secret_env}): \
                     {}; `switchboard run` and `switchboard channel` need the same value (retrying every {retry_secs}s)",
                    refusal.message
                ),
            ),
            _ => (
                Severity::Warn,
                format!(
                    "the switchboard daemon at {address} refused the session stream: {} (retrying every {retry_secs}s)",
                    refusal.message
                ),
            ),
        },
        ClientError::Unreachable { .. } => (Severity::Warn, format!("{error}; retrying until it is")),
        ClientError::NoAnswer { .. } | ClientError::Protocol { .. } => {
            (Severity::Warn, format!("lost the session stream: {error}; reconnecting"))
        }
    };
    SessionProblem { severity, text }
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::*;
    use crate::agents::api::wire::ApiError;

    fn agent() -> AgentName {
        AgentName::parse("worker").unwrap()
    }

    fn refused(code: ErrorCode, message: &str) -> ClientError {
        ClientError::Refused { status: StatusCode::CONFLICT, error: ApiError::new(code, message) }
    }

    fn unreachable() -> ClientError {
        ClientError::Unreachable {
            address: "http://127.0.0.1:7797".into(),
            detail: "Connection refused (os error 111)".into(),
        }
    }

    #[test]
    fn reconnect_backs_off_to_a_cap_and_resets_on_success() {
        let mut reconnect = Reconnect::default();
        let delays: Vec<_> = (0..6).map(|_| reconnect.after_failure(Some(&unreachable()))).collect();
        let millis: Vec<_> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [500, 1000, 2000, 4000, 5000, 5000]);
        reconnect.connected();
        assert_eq!(reconnect.after_failure(None), FIRST_RECONNECT_DELAY);
    }

    #[test]
    fn refusals_retry_slowly() {
        let mut reconnect = Reconnect::default();
        let conflict = refused(ErrorCode::SessionConflict, "taken");
        assert_eq!(reconnect.after_failure(Some(&conflict)), REFUSED_RETRY_DELAY);
        assert_eq!(reconnect.after_failure(Some(&conflict)), REFUSED_RETRY_DELAY);
    }

    #[test]
    fn session_problems_say_what_is_wrong() {
        let address = "http://127.0.0.1:7797";
        let conflict = session_problem(&refused(ErrorCode::SessionConflict, "taken"), &agent(), "S", address);
        assert_eq!(conflict.severity, Severity::Error);
        assert!(
            conflict.text.starts_with("another session for agent 'worker' is already connected"),
            "{conflict:?}"
        );

        let secret =
            session_problem(&refused(ErrorCode::Unauthorized, "no"), &agent(), "WORKER_SECRET", address);
        assert_eq!(secret.severity, Severity::Error);
        assert!(
            secret.text.contains("refused the secret of agent 'worker' (from $WORKER_SECRET)"),
            "{secret:?}"
        );

        let down = session_problem(&unreachable(), &agent(), "S", address);
        assert_eq!(down.severity, Severity::Warn);
        assert!(down.text.contains("127.0.0.1:7797 is not reachable"), "{down:?}");
    }
}
