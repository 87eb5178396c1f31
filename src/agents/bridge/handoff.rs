//! Handoffs between agents (DESIGN.md §9): `send_to_agent` (and `call_agent`, which the
//! plugin builds on it), the answer a target gives with `reply` or `ack`, and the meta
//! that tells each side what a handoff envelope is.
//!
//! The guard's decision and the recording of what it admits happen under the delegating
//! agent's decision lock, so two calls in one turn cannot both pass.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Bridge, ToolError};
use crate::agents::api::wire::{AnsweredHandoff, HandoffReceipt, HandoffRequest, ReplyReceipt};
use crate::config::Settings;
use crate::ids::{AgentName, HandoffId, RequestId, TraceId};
use crate::ledger::{
    AttemptPurpose, EnvelopeKind, EnvelopeState, HandoffEnd, HandoffState, LedgerError, LedgerResult,
    NewHandoff, StoredEnvelope, StoredHandoff,
};
use crate::rules::guard::{self, HandoffAsk, Link, PriorHandoff, Situation};
use crate::rules::resolver;
use crate::rules::routes::RouteTarget;
use crate::telegram::envelope::ChatType;
use crate::telegram::outbound::{ReplyPlan, ReplyTarget, TELEGRAM_TEXT_LIMIT, split_text};

/// Where `[handoffs] audit_route` copies go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditChat {
    pub chat_id: i64,
    pub thread_id: Option<i32>,
}

/// The handoff settings the bridge applies.
#[derive(Debug, Clone)]
pub struct HandoffRules {
    pub max_depth: u32,
    pub audit: Option<(String, AuditChat)>,
}

impl HandoffRules {
    /// The handoff settings, with the audit route resolved to its chat.
    pub fn of(settings: &Settings) -> Self {
        let audit = settings.handoffs.audit_route.as_ref().and_then(|name| {
            let route = settings.routes.routes().iter().find(|route| &route.name == name)?;
            let chat = match route.target {
                RouteTarget::Topic { chat_id, thread_id } => {
                    AuditChat { chat_id, thread_id: Some(thread_id) }
                }
                RouteTarget::Chat { chat_id } => AuditChat { chat_id, thread_id: None },
                // Refused when the configuration is loaded.
                RouteTarget::Default => return None,
            };
            Some((name.to_string(), chat))
        });
        Self { max_depth: settings.handoffs.max_depth, audit }
    }
}

impl Bridge {
    /// Hands an instruction to another agent, or refuses and records nothing.
    pub async fn handoff(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: HandoffRequest,
    ) -> Result<HandoffReceipt, ToolError> {
        let session = self.live_session(agent, token)?;
        let request_id = RequestId::parse(&request.request_id).map_err(ToolError::Invalid)?;
        let followup = guard::parse_followup(request.followup.as_ref(), request.intent.as_deref())
            .map_err(|refusal| guard_refused(agent, refusal))?;
        let trace_id = super::reply::parse_optional_trace_id(request.trace_id.as_deref())?;
        let ledger = &self.inner.ledger;
        let slot = self.slot(agent);
        let _decide = slot.decisions.lock().await;
        if let Some(recorded) = ledger.handoff_by_request(agent, request_id.as_str()).await? {
            // The first request may have been dropped between its commit and its wake-up
            // (a caller gone mid-request): waking again is harmless, and the target's
            // session would otherwise not look until something else woke it.
            if let Ok(target) = AgentName::parse(&recorded.to_agent) {
                self.wake(&target);
            }
            return self.receipt(agent, &recorded).await;
        }
        let cause = self.cause_of_handoff(agent, &session, trace_id.as_ref()).await?;
        let cause_depth = match &cause {
            Some(cause) => Some(self.depth_of(cause).await?),
            None => None,
        };
        let now = Utc::now();
        // A handoff a change to the task superseded no longer stands: it delegates nothing,
        // and the new instruction may be handed over again.
        let this_turn = match &cause {
            Some(cause) => {
                let made = ledger.handoffs_for_cause(cause.id).await?;
                priors(made.into_iter().filter(|h| h.state != HandoffState::Superseded).collect(), now)?
            }
            None => Vec::new(),
        };
        let open = priors(ledger.open_handoffs_from(agent).await?, now)?;
        let mut agents: Vec<AgentName> = self.inner.agents.keys().cloned().collect();
        agents.sort();
        let ask = HandoffAsk { from: agent, to: &request.to, text: &request.text, followup };
        let situation = Situation {
            agents: &agents,
            max_depth: self.handoff_rules().max_depth,
            cause_depth,
            this_turn: &this_turn,
            open: &open,
        };
        let admitted = guard::admit(ask, situation).map_err(|refusal| guard_refused(agent, refusal))?;
        let handoff = ledger
            .record_handoff(&NewHandoff {
                from: agent,
                to: &admitted.target,
                instruction: request.text.trim(),
                cause: cause.as_ref(),
                depth: admitted.depth,
                followup_of: admitted.followup_of.as_ref(),
                intent: admitted.intent,
                request_id: request_id.as_str(),
            })
            .await?
            .map_err(|refusal| {
                tracing::warn!(from = %agent, code = refusal.code(), "handoff refused: {refusal}");
                ToolError::Task(refusal)
            })?;
        tracing::info!(
            from = %agent, to = %admitted.target, handoff_id = %handoff.handoff_id, depth = admitted.depth,
            followup_of = admitted.followup_of.as_deref(), "handoff recorded"
        );
        self.wake(&admitted.target);
        self.copy_to_audit(&handoff, agent.as_str(), handoff.to_agent.as_str(), &handoff.instruction);
        self.receipt(agent, &handoff).await
    }

    async fn receipt(
        &self,
        caller: &AgentName,
        handoff: &StoredHandoff,
    ) -> Result<HandoffReceipt, ToolError> {
        let target = AgentName::parse(&handoff.to_agent).ok();
        let delivered = target
            .as_ref()
            .and_then(|target| self.inner.agents.get(target))
            .is_some_and(|slot| slot.session.lock().unwrap_or_else(|p| p.into_inner()).is_some());
        let target_awaits_caller = match &target {
            Some(target) => self
                .inner
                .ledger
                .open_handoffs_from(target)
                .await?
                .iter()
                .any(|open| open.to_agent == caller.as_str()),
            None => false,
        };
        Ok(HandoffReceipt {
            handoff_id: handoff.handoff_id.to_string(),
            to: handoff.to_agent.clone(),
            delivered,
            on_behalf_of: handoff.cause_trace_id.as_ref().map(ToString::to_string),
            depth: u32::try_from(handoff.depth).unwrap_or_default(),
            followup_of: handoff.followup_of.as_ref().map(ToString::to_string),
            target_awaits_caller,
        })
    }

    /// The envelope a handoff is made for: the named one (the caller's own pending
    /// envelope) or the only pending one this session was shown; none pending at all
    /// makes it unprompted.
    async fn cause_of_handoff(
        &self,
        agent: &AgentName,
        session: &str,
        trace_id: Option<&TraceId>,
    ) -> Result<Option<StoredEnvelope>, ToolError> {
        let ledger = &self.inner.ledger;
        match trace_id {
            Some(trace_id) => {
                let found = ledger.find(trace_id).await?;
                // An envelope a change superseded is refused by its task, naming what to act
                // on; a pending one is admitted where the handoff is recorded.
                self.refuse_if_task_moved_on(agent, found.as_ref()).await?;
                let found = found.map(resolver::Candidate::free);
                let envelope = resolver::resolve_named(agent.as_str(), trace_id.as_str(), found)?;
                if envelope.state != EnvelopeState::Pending {
                    return Err(ToolError::Refused(resolver::ResolveError::NotAnswerable {
                        trace_id: trace_id.to_string(),
                        state: envelope.state,
                    }));
                }
                Ok(Some(envelope))
            }
            None => {
                let (shown, not_shown): (Vec<_>, Vec<_>) = ledger
                    .pending(agent)
                    .await?
                    .into_iter()
                    .partition(|envelope| self.slot(agent).was_shown(session, &envelope.trace_id));
                let candidates = shown.into_iter().map(resolver::Candidate::free).collect();
                match resolver::resolve_unnamed(candidates, not_shown.len()) {
                    Ok(cause) => Ok(Some(cause)),
                    // Only nothing pending at all makes a handoff unprompted (DESIGN.md §9).
                    // An envelope handed over but not yet confirmed shown (a reconnect, a
                    // retry) is refused as a reply is: it names the turn once seen.
                    Err(resolver::ResolveError::NothingPending { not_shown: 0 }) => Ok(None),
                    Err(refusal) => {
                        tracing::warn!(%agent, "handoff refused: {refusal}");
                        Err(ToolError::Refused(refusal))
                    }
                }
            }
        }
    }

    /// How deep an envelope sits in a chain of handoffs (see [`guard::depth_of_chain`]):
    /// the envelope, then the causes its answers were made for, read from the ledger.
    async fn depth_of(&self, envelope: &StoredEnvelope) -> Result<u32, ToolError> {
        let ledger = &self.inner.ledger;
        let mut chain = Vec::new();
        let mut at = envelope.id;
        loop {
            let Some(handoff) = ledger.handoff_of_envelope(at).await? else {
                chain.push(self.link_outside_handoffs(envelope, at).await?);
                break;
            };
            if handoff.envelope_id == at {
                chain.push(Link::Handoff { depth: u32::try_from(handoff.depth).unwrap_or(u32::MAX) });
                break;
            }
            chain.push(Link::Answer);
            match handoff.cause_envelope_id {
                // A cause is recorded before the answers made for it: the walk ends.
                Some(cause) if cause < at => at = cause,
                _ => break,
            }
        }
        Ok(guard::depth_of_chain(&chain))
    }

    /// The link of an envelope no handoff carries: a child's word that its handoff no
    /// longer stands sits at that handoff's depth; anything else (a Telegram message, a
    /// room's turn) starts a chain.
    async fn link_outside_handoffs(&self, first: &StoredEnvelope, at: i64) -> Result<Link, ToolError> {
        if first.id != at || first.kind != EnvelopeKind::Revision || first.chat_type != ChatType::Agent {
            return Ok(Link::Outside);
        }
        let handoff_id = first
            .meta
            .as_deref()
            .and_then(|meta| serde_json::from_str::<serde_json::Value>(meta).ok())
            .and_then(|meta| meta.get("handoff_id")?.as_str().map(str::to_owned))
            .and_then(|id| HandoffId::parse(&id).ok());
        let Some(handoff_id) = handoff_id else { return Ok(Link::Outside) };
        Ok(match self.inner.ledger.handoff(&handoff_id).await? {
            Some(handoff) => Link::Handoff { depth: u32::try_from(handoff.depth).unwrap_or(u32::MAX) },
            None => Link::Outside,
        })
    }

    /// A target's `reply` to its handoff envelope: the answer goes to the delegator.
    pub(super) async fn answer_handoff(
        &self,
        agent: &AgentName,
        envelope: &StoredEnvelope,
        text: &str,
        request_id: &RequestId,
    ) -> Result<ReplyReceipt, ToolError> {
        let handoff = self.open_handoff_of(envelope).await?;
        let end = HandoffEnd::Answered { text: text.trim(), request_id: Some(request_id.as_str()) };
        let ended = self.end(agent, &handoff, end).await?;
        self.copy_to_audit(&ended, ended.to_agent.as_str(), ended.from_agent.as_str(), text.trim());
        Ok(answered_receipt(&ended, &envelope.trace_id))
    }

    /// A target's `ack` of its handoff envelope: closed without an answer.
    pub(super) async fn close_handoff(
        &self,
        agent: &AgentName,
        envelope: &StoredEnvelope,
        note: Option<&str>,
    ) -> Result<(), ToolError> {
        let handoff = self.open_handoff_of(envelope).await?;
        self.end(agent, &handoff, HandoffEnd::Closed { note }).await.map(drop)
    }

    async fn open_handoff_of(&self, envelope: &StoredEnvelope) -> Result<StoredHandoff, ToolError> {
        let handoff = self.inner.ledger.handoff_of_envelope(envelope.id).await?.ok_or_else(|| {
            ToolError::Invalid(format!("{} carries no handoff; nothing was changed", envelope.trace_id))
        })?;
        if handoff.state != HandoffState::Open {
            return Err(ToolError::Invalid(format!(
                "handoff {} is already {}; nothing was changed",
                handoff.handoff_id, handoff.state
            )));
        }
        Ok(handoff)
    }

    async fn end(
        &self,
        agent: &AgentName,
        handoff: &StoredHandoff,
        end: HandoffEnd<'_>,
    ) -> Result<StoredHandoff, ToolError> {
        let ended = self
            .inner
            .ledger
            .end_handoff(handoff, end, &format!("agent:{agent}"))
            .await?
            .map_err(ToolError::Task)?
            .ok_or_else(|| {
                ToolError::Invalid(format!(
                    "handoff {} changed meanwhile; nothing was changed",
                    handoff.handoff_id
                ))
            })?;
        tracing::info!(handoff_id = %ended.handoff_id, from = %ended.to_agent, to = %ended.from_agent, state = %ended.state, "handoff answered");
        if let Ok(delegator) = AgentName::parse(&ended.from_agent) {
            self.wake(&delegator);
        }
        Ok(ended)
    }

    /// The receipt a repeated answer request gets.
    pub(super) async fn recorded_answer(
        &self,
        agent: &AgentName,
        request_id: &RequestId,
    ) -> Result<Option<ReplyReceipt>, ToolError> {
        let Some(handoff) = self.inner.ledger.handoff_by_answer_request(agent, request_id.as_str()).await?
        else {
            return Ok(None);
        };
        // As for a repeated handoff: the first may have been dropped before its wake-up.
        if let Ok(delegator) = AgentName::parse(&handoff.from_agent) {
            self.wake(&delegator);
        }
        Ok(Some(answered_receipt(&handoff, &handoff.envelope_trace_id)))
    }

    /// The meta a handoff or answer envelope carries, beside the common keys.
    pub(super) async fn handoff_meta(
        &self,
        envelope: &StoredEnvelope,
    ) -> LedgerResult<BTreeMap<String, String>> {
        let mut meta = BTreeMap::new();
        let Some(handoff) = self.inner.ledger.handoff_of_envelope(envelope.id).await? else {
            return Ok(meta);
        };
        meta.insert("handoff_id".to_owned(), handoff.handoff_id.to_string());
        if handoff.envelope_id == envelope.id {
            meta.insert("from_agent".to_owned(), handoff.from_agent.clone());
            meta.insert("depth".to_owned(), handoff.depth.to_string());
            if let Some(earlier) = &handoff.followup_of {
                meta.insert("followup_of".to_owned(), earlier.to_string());
            }
            if let Some(intent) = handoff.intent {
                meta.insert("intent".to_owned(), intent.as_str().to_owned());
            }
        } else {
            meta.insert("from_agent".to_owned(), handoff.to_agent.clone());
            if let Some(cause) = &handoff.cause_trace_id {
                meta.insert("on_behalf_of".to_owned(), cause.to_string());
            }
            if handoff.state == HandoffState::Closed {
                meta.insert("closed".to_owned(), "true".to_owned());
            }
        }
        Ok(meta)
    }

    /// Posts `from → to: text` to the audit route's chat, best-effort: an ordinary outbound
    /// attempt that settles nothing.
    fn copy_to_audit(&self, handoff: &StoredHandoff, from: &str, to: &str, text: &str) {
        let Some((route, chat)) = self.handoff_rules().audit else { return };
        let copy = format!("{from} → {to}: {text}");
        let mut parts = split_text(&copy, TELEGRAM_TEXT_LIMIT);
        parts.truncate(self.limits().max_reply_parts);
        let plan = ReplyPlan {
            target: ReplyTarget {
                envelope_id: handoff.envelope_id,
                trace_id: handoff.envelope_trace_id.clone(),
                agent: from.to_owned(),
                route,
                chat_id: chat.chat_id,
                thread_id: chat.thread_id,
                reply_to_message_id: None,
            },
            request_id: None,
            purpose: AttemptPurpose::Audit,
            html: false,
            parts,
            already_sent: Vec::new(),
            files: Vec::new(),
        };
        let outbound = self.inner.outbound.clone();
        let handoff_id = handoff.handoff_id.clone();
        self.inner.tasks.spawn(async move {
            let outcome = outbound.deliver(&plan).await;
            tracing::debug!(%handoff_id, ?outcome, "handoff copied to the audit route");
        });
    }
}

/// The guard's refusals are logged at warn, like the resolver's. One that quotes the
/// instruction standing in its way names that handoff there, and says the rest only at
/// debug: an instruction is a message body.
fn guard_refused(agent: &AgentName, refusal: guard::Refusal) -> ToolError {
    match &refusal {
        guard::Refusal::AlreadyDelegated { target, first: standing }
        | guard::Refusal::AlreadyRunning { target, open: standing } => {
            let standing = &standing.handoff_id;
            tracing::warn!(%agent, code = refusal.code(), %target, %standing, "handoff refused");
            tracing::debug!(%agent, "handoff refused: {refusal}");
        }
        _ => tracing::warn!(%agent, code = refusal.code(), "handoff refused: {refusal}"),
    }
    ToolError::Handoff(refusal)
}

/// The earlier handoffs the guard weighs. Read strictly: a handoff whose target or time
/// cannot be read refuses the new one (a ledger error), since skipping it could let a
/// second instruction through that the guard exists to stop.
fn priors(handoffs: Vec<StoredHandoff>, now: DateTime<Utc>) -> Result<Vec<PriorHandoff>, ToolError> {
    handoffs
        .into_iter()
        .map(|handoff| {
            let unreadable = |what: String| {
                tracing::error!(handoff_id = %handoff.handoff_id, "a handoff in the ledger cannot be read: {what}");
                ToolError::from(LedgerError::other(format!("handoff {}: {what}", handoff.handoff_id)))
            };
            let opened = handoff.opened_at;
            let to = AgentName::parse(&handoff.to_agent)
                .map_err(|e| unreadable(format!("to_agent {:?}: {e}", handoff.to_agent)))?;
            Ok(PriorHandoff {
                handoff_id: handoff.handoff_id,
                to,
                instruction: handoff.instruction,
                age: (now - opened).to_std().unwrap_or(Duration::ZERO),
            })
        })
        .collect()
}

fn answered_receipt(handoff: &StoredHandoff, trace_id: &str) -> ReplyReceipt {
    ReplyReceipt {
        trace_id: trace_id.to_owned(),
        chat_id: 0,
        thread_id: None,
        route: String::new(),
        message_ids: Vec::new(),
        answered_handoff: Some(AnsweredHandoff {
            handoff_id: handoff.handoff_id.to_string(),
            to_agent: handoff.from_agent.clone(),
        }),
        room_turn: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::HandoffState;

    fn open_handoff(to_agent: &str, opened_at: &str) -> StoredHandoff {
        StoredHandoff {
            id: 1,
            handoff_id: "hof_aaaaaaaaaa".into(),
            from_agent: "orchestrator".into(),
            to_agent: to_agent.into(),
            instruction: "build it".into(),
            cause_envelope_id: None,
            cause_trace_id: None,
            depth: 1,
            followup_of: None,
            intent: None,
            request_id: None,
            envelope_id: 2,
            envelope_trace_id: "env_bbbbbbbbbb".into(),
            answer_envelope_id: None,
            answer_trace_id: None,
            answer_request_id: None,
            state: HandoffState::Open,
            opened_at: DateTime::parse_from_rfc3339(opened_at).unwrap().with_timezone(&Utc),
            closed_at: None,
            note: None,
            task_id: None,
            late_result: None,
        }
    }

    #[test]
    fn an_earlier_handoff_the_guard_cannot_read_refuses_the_new_one() {
        let now = Utc::now();
        let readable = priors(vec![open_handoff("worker", "2026-01-01T00:00:00.000Z")], now).unwrap();
        assert_eq!(readable.len(), 1);
        assert_eq!(readable[0].to.as_str(), "worker");
        // Skipped, it would let a second instruction through: an error instead. (A time
        // the ledger cannot read never reaches the guard: reading the row fails.)
        assert!(matches!(
            priors(vec![open_handoff("", "2026-01-01T00:00:00Z")], now),
            Err(ToolError::Ledger(_))
        ));
    }
}
