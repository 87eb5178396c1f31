//! Tasks and revisions at the bridge (DESIGN.md §11): carrying out what a recorded change
//! asks for (the bot's acknowledgement in the chat, a pause or resume notice, waking a
//! child), admission's early answer to a tool, and the `revise_task` tool.

use std::collections::BTreeMap;

use super::{Bridge, ToolError};
use crate::agents::api::wire::{DeliveredNotice, RevisionReceipt, RevisionRequest};
use crate::clock::now_text;
use crate::ids::{AgentName, RequestId, TraceId};
use crate::ledger::{DeclareTaskError, EnvelopeState, StoredEnvelope, TaskEffect};
use crate::rules::revisions::ChangeKind;

impl Bridge {
    /// What a committed change asks for. Best-effort and after the commit: the change is
    /// recorded whether or not the chat hears of it.
    pub fn carry_out(&self, effects: Vec<TaskEffect>) {
        for effect in effects {
            match effect {
                // Owed in the ledger with the change; the room driver posts what is owed.
                TaskEffect::Say(post) => {
                    tracing::debug!(trace_id = %post.trace_id, "the switchboard owes a post about a task");
                    self.wake_rooms();
                }
                TaskEffect::Notice { agent, trace_id, kind, task_id, revision } => {
                    let Ok(agent) = AgentName::parse(&agent) else { continue };
                    let content = match kind {
                        ChangeKind::Pause => format!(
                            "{task_id} is paused (revision {revision}): nothing of it is sent until the user \
                             resumes it. Replies and handoffs for it are refused with `paused` meanwhile."
                        ),
                        _ => format!("{task_id} is resumed (revision {revision}): carry on with {trace_id}."),
                    };
                    let extra = BTreeMap::from([
                        ("task".to_owned(), task_id.to_string()),
                        ("revision".to_owned(), revision.to_string()),
                    ]);
                    let notice = DeliveredNotice {
                        trace_id: trace_id.to_string(),
                        kind: kind.as_str().to_owned(),
                        content,
                        ts: now_text(),
                        extra,
                    };
                    self.notify(&agent, notice);
                }
                TaskEffect::Recorded(kind) => crate::operate::metrics::task_revision(kind.as_str()),
                TaskEffect::Wake(agent) => {
                    if let Ok(agent) = AgentName::parse(&agent) {
                        self.wake(&agent);
                    }
                }
            }
        }
    }

    /// For an envelope `agent` named that the resolver would refuse anyway (superseded, or
    /// unresolved in a task that moved on), the task's refusal, which says what to act on
    /// instead. Anything else passes here: a pending envelope is admitted where its action
    /// is recorded, at the moment of sending; another agent's is the resolver's to refuse.
    pub(super) async fn refuse_if_task_moved_on(
        &self,
        agent: &AgentName,
        envelope: Option<&StoredEnvelope>,
    ) -> Result<(), ToolError> {
        let Some(envelope) = envelope.filter(|envelope| {
            envelope.agent.as_deref() == Some(agent.as_str())
                && envelope.state != EnvelopeState::Pending
                && envelope.task_id.is_some()
        }) else {
            return Ok(());
        };
        self.inner.ledger.admission(envelope.id).await?.map_err(|refusal| {
            tracing::warn!(trace_id = %envelope.trace_id, code = refusal.code(), "action refused: {refusal}");
            ToolError::Task(refusal)
        })
    }

    /// `revise_task`: the agent declares that a plain message it received changes its task.
    pub async fn revise_task(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: RevisionRequest,
    ) -> Result<RevisionReceipt, ToolError> {
        self.live_session(agent, token)?;
        let trace_id = TraceId::parse(&request.trace_id).map_err(ToolError::Invalid)?;
        let kind = ChangeKind::parse_declared(&request.kind).ok_or_else(|| {
            ToolError::Invalid(format!(
                "kind must be one of correction, new_objective, pause, cancel (got {:?}); nothing changed",
                request.kind
            ))
        })?;
        let request_id =
            request.request_id.as_deref().map(RequestId::parse).transpose().map_err(ToolError::Invalid)?;
        let slot = self.slot(agent);
        let _decide = slot.decisions.lock().await;
        let declared = self
            .inner
            .ledger
            .declare_revision(
                agent,
                &trace_id,
                kind,
                request.summary.as_deref().unwrap_or_default(),
                request_id.as_ref().map(RequestId::as_str),
            )
            .await;
        let (declared, effects) = match declared {
            Ok(declared) => declared,
            Err(DeclareTaskError::Ledger(e)) => return Err(e.into()),
            Err(DeclareTaskError::Declined(crate::ledger::DeclareError::Refused(refusal))) => {
                return Err(ToolError::Task(refusal));
            }
            Err(DeclareTaskError::Declined(declined)) => {
                return Err(ToolError::NoRevision(declined.to_string()));
            }
        };
        tracing::info!(%agent, task = %declared.task_id, revision = declared.revision, change = %kind, "task revised by its agent");
        // A repeat carries no effects: the first call's acknowledgement is owed in the
        // ledger already, and the room driver posts it once rung; the envelopes it queued
        // for other agents (a child's word that its handoff no longer stands) wait there,
        // and every agent is woken to look. The first call may have been cut off before it
        // rang or woke anyone.
        if effects.is_empty() {
            self.wake_rooms();
            for agent in self.inner.agents.keys() {
                self.wake(agent);
            }
        }
        self.carry_out(effects);
        Ok(RevisionReceipt {
            task: declared.task_id,
            revision: declared.revision,
            change: kind.as_str().to_owned(),
            act_on: declared.act_on,
            next: declared.next,
        })
    }
}
