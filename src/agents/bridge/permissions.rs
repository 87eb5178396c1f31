//! The bridge's half of the permission relay (DESIGN.md §15): a request comes from the
//! agent's live session and is recorded as asked by that session's plugin process; a
//! verdict goes to the live session only when its plugin is the one that asked.
//!
//! **When a plugin's session ends.** A plugin process reconnects with the same name after
//! the daemon restarts (`kill -9` included), so a daemon that stops does not end it: its
//! pending requests stay pending and a later verdict still reaches it. Its session ends
//! when its stream closes while the daemon keeps running (the plugin exited, or its agent
//! session did), or when another plugin process connects for the agent (only one session
//! per agent is live, so the one that asked cannot be answered any more). Either way its
//! pending requests expire and their prompts say so; after a closed stream, only once the
//! same plugin has not connected again for a moment (a stream that broke comes back).

use tokio::sync::mpsc;

use super::session::{RECONNECT_GRACE, SessionGuard};
use super::{Bridge, ToolError};
use crate::agents::api::wire::{DeliveredVerdict, PermissionReceipt, PermissionRequest, SessionEvent};
use crate::agents::permissions::{AskError, Asker, CallbackPress, PermissionRelay, TextAnswer};
use crate::ids::AgentName;
use crate::ledger::{EndedPlugins, LedgerResult, PermissionState};

impl Bridge {
    /// Sets up the relay; without it every request is refused.
    pub fn set_permissions(&self, relay: PermissionRelay) {
        let _ = self.inner.permissions.set(relay);
    }

    fn permissions(&self) -> Option<&PermissionRelay> {
        self.inner.permissions.get()
    }

    /// `POST permissions`: relays a request of the live session's plugin.
    pub async fn ask_permission(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: PermissionRequest,
    ) -> Result<PermissionReceipt, ToolError> {
        let (session_id, plugin) = self.live_session_and_plugin(agent, token)?;
        let plugin = plugin.ok_or_else(|| {
            ToolError::Invalid(format!(
                "this session did not name its plugin process (the {} header when it opened): a verdict could not \
                 be addressed to it, so nothing was relayed",
                crate::agents::api::wire::PLUGIN_HEADER
            ))
        })?;
        let relay = self
            .permissions()
            .ok_or_else(|| ToolError::Invalid(AskError::NotRelayed(agent.to_string()).to_string()))?;
        let asker = Asker { agent, session_id: &session_id, plugin_id: &plugin };
        relay.ask(asker, request).await.map_err(|error| match error {
            AskError::Ledger(e) => ToolError::from(e),
            refused => ToolError::Invalid(refused.to_string()),
        })
    }

    /// Presses and text answers from a batch the poller committed, handled in order on a
    /// task of their own (each is a few Bot API calls).
    pub fn permission_answers(&self, presses: Vec<CallbackPress>, texts: Vec<TextAnswer>) {
        if presses.is_empty() && texts.is_empty() {
            return;
        }
        let Some(relay) = self.permissions().cloned() else {
            tracing::debug!(
                presses = presses.len(),
                "button presses with no permission relay configured: ignored"
            );
            return;
        };
        let bridge = self.clone();
        self.inner.tasks.spawn(async move {
            for press in &presses {
                // A verdict to hand over, or an envelope an operator sent back to it.
                if let Some(agent) = relay.press(press).await {
                    bridge.wake_verdicts(&agent);
                    bridge.wake(&agent);
                }
            }
            for text in &texts {
                if let Some(agent) = relay.text_answer(text).await {
                    bridge.wake_verdicts(&agent);
                }
            }
        });
    }

    fn wake_verdicts(&self, agent: &AgentName) {
        if let Some(slot) = self.inner.agents.get(agent) {
            slot.verdicts.notify_one();
        }
    }

    /// A session of `plugin` opened: requests of any other plugin process of the agent
    /// can no longer be answered (see the module documentation), and this plugin's
    /// verdicts recorded while it was away are handed over. False when the session is gone.
    pub(super) async fn plugin_session_opened(
        &self,
        guard: &SessionGuard,
        tx: &mpsc::Sender<SessionEvent>,
    ) -> LedgerResult<bool> {
        let Some(plugin) = guard.plugin.as_deref() else { return Ok(true) };
        let ended = EndedPlugins::AllBut(plugin);
        let expired =
            self.inner.ledger.expire_permissions_of_ended_session(guard.agent.as_str(), ended).await?;
        if expired > 0 {
            tracing::info!(agent = %guard.agent, expired, "another plugin process connected: the permission requests of the one before expired");
            if let Some(relay) = self.permissions() {
                relay.ring_keeper();
            }
        }
        self.hand_over_verdicts(guard, tx).await
    }

    /// Writes the verdicts owed to this session's plugin that this stream has not carried
    /// yet; false when the session is gone.
    ///
    /// A verdict is owed until the plugin confirms it handed it to Claude Code
    /// ([`Self::verdict_handed`]), not merely until it is written: a stream can take bytes
    /// and still never bring them to the plugin (a connection dead without a word, a
    /// daemon killed right after the write). So each stream the plugin opens carries every
    /// verdict still owed to it, once. The plugin hands a verdict to Claude Code once,
    /// however often it comes (a confirmation lost on its way is followed by the verdict
    /// again).
    pub(super) async fn hand_over_verdicts(
        &self,
        guard: &SessionGuard,
        tx: &mpsc::Sender<SessionEvent>,
    ) -> LedgerResult<bool> {
        let Some(plugin) = guard.plugin.as_deref() else { return Ok(true) };
        for row in self.inner.ledger.undelivered_verdicts(plugin).await? {
            let behavior = match row.state {
                PermissionState::Allowed => "allow",
                PermissionState::Denied => "deny",
                PermissionState::Pending | PermissionState::Expired => continue,
            };
            if !guard.carries_verdict(&row.id) {
                continue;
            }
            let verdict = DeliveredVerdict {
                permission_id: row.id.clone(),
                request_id: row.request_id.clone(),
                behavior: behavior.to_owned(),
            };
            if tx.send(SessionEvent::PermissionVerdict(verdict)).await.is_err() {
                return Ok(false);
            }
            self.inner.ledger.verdict_sent(&row.id).await?;
            tracing::info!(agent = %guard.agent, permission_id = %row.id, behavior, "permission verdict written to the plugin that asked");
        }
        Ok(true)
    }

    /// `POST permissions/{id}/handed`: the live session's plugin handed the verdict of
    /// request `id` to Claude Code, so it is no longer owed.
    pub async fn verdict_handed(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        id: &str,
    ) -> Result<(), ToolError> {
        let (_session_id, plugin) = self.live_session_and_plugin(agent, token)?;
        let plugin = plugin.ok_or_else(|| {
            ToolError::Invalid(
                "this session did not name its plugin process: it was handed no verdict".to_owned(),
            )
        })?;
        if self.inner.ledger.verdict_handed(id, &plugin).await? {
            tracing::debug!(%agent, permission_id = id, "the plugin handed the verdict to Claude Code");
            Ok(())
        } else {
            Err(ToolError::Invalid(format!(
                "this plugin asked no answered permission request {id}: nothing was changed"
            )))
        }
    }

    /// A plugin's session ended while the daemon runs: its pending requests expire, unless
    /// the same plugin process connects again within [`RECONNECT_GRACE`] (its stream broke,
    /// and the agent still waits at its prompt; the verdict reaches it once reconnected). A
    /// daemon that is stopping ends no plugin's session (the plugin reconnects).
    pub(super) fn plugin_session_ended(&self, agent: &AgentName, plugin: Option<String>) {
        let Some(plugin) = plugin else { return };
        if self.inner.shutdown.is_cancelled() {
            return;
        }
        let bridge = self.clone();
        let agent = agent.clone();
        self.inner.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(RECONNECT_GRACE) => {}
                () = bridge.inner.shutdown.cancelled() => return,
            }
            if bridge.live_plugin(&agent).as_deref() == Some(plugin.as_str()) {
                return;
            }
            let ended = EndedPlugins::This(&plugin);
            match bridge.inner.ledger.expire_permissions_of_ended_session(agent.as_str(), ended).await {
                Ok(0) => {}
                Ok(expired) => {
                    tracing::info!(%agent, plugin, expired, "the asking plugin's session ended: its permission requests expired");
                    if let Some(relay) = bridge.permissions() {
                        relay.ring_keeper();
                    }
                }
                Err(e) => tracing::warn!(%agent, error = %e, "could not expire the permission requests of an ended session"),
            }
        });
    }
}
