//! The tools: `pending`, `reply` (resolve, plan, deliver), what became of a reply request,
//! and `ack`.

use futures::FutureExt;
use tracing::Instrument;

use super::uploads::StagedFiles;
use super::{AgentSlot, Bridge, ResolveError, RunningReply, ToolError, uploads};
use crate::agents::api::present;
use crate::agents::api::wire::{
    AckReceipt, AckRequest, MAX_LISTED, PendingList, PendingSummary, ReplyReceipt, ReplyRequest,
};
use crate::ids::{AgentName, RequestId, TraceId};
use crate::ledger::{
    AttemptPurpose, AttemptState, EnvelopeKind, EnvelopeState, RecordedReply, ReplyTally, ReplyVerdict,
    StoredAttempt, StoredEnvelope,
};
use crate::rules::resolver::{self, Addressed, Answerable, Blocked, Candidate};
use crate::telegram::envelope::ChatType;
use crate::telegram::format::{ReplyFormat, html_to_plain, is_blank_html};
use crate::telegram::outbound::{DeliveryOutcome, PlannedFile, ReplyPlan, ReplyTarget, TELEGRAM_TEXT_LIMIT};

/// A reply request as read: what it asks to send, and to whom when it says.
struct Draft<'a> {
    request_id: RequestId,
    trace_id: Option<TraceId>,
    again: bool,
    /// As the agent wrote it: an answer to a handoff takes it whole.
    text: &'a str,
    /// As Telegram messages.
    parts: Vec<String>,
    html: bool,
    /// How `text` is written: a room turn's reply is split again, behind its speaker's name.
    format: ReplyFormat,
    /// Where the agent said the reply goes (`chat_id`, `reply_to`), if it did.
    at: Addressed,
}

/// What a request never seen before came to.
enum Decided {
    /// A delivery (to Telegram, or a room's turn) runs: its outcome is the reply's.
    Delivering(RunningReply),
    /// Answered at once: an answer to a handoff goes to the agent that asked.
    Answered(ReplyReceipt),
}

/// What the ledger and memory know of a request id seen before.
enum Repeat {
    /// Still being delivered: await the same outcome.
    Running(RunningReply),
    /// Over: its outcome, as the ledger tells it.
    Recorded(Result<ReplyReceipt, ToolError>),
}

impl Bridge {
    pub async fn pending(&self, agent: &AgentName, token: Option<&str>) -> Result<PendingList, ToolError> {
        self.live_session(agent, token)?;
        let pending = self.inner.ledger.pending(agent).await?;
        let replying = self.slot(agent).running().envelopes.clone();
        let listed = pending.iter().take(MAX_LISTED).map(|envelope| PendingSummary {
            replying: replying.contains(&envelope.id),
            ..present::summary(envelope)
        });
        Ok(PendingList { total: pending.len(), pending: listed.collect() })
    }

    /// Resolves the envelope a reply answers (refusing rather than guessing), then
    /// delivers it as a task of its own and awaits the outcome. A request id seen before
    /// gets the first request's outcome: nothing is sent twice for one request.
    pub async fn reply(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: ReplyRequest,
    ) -> Result<ReplyReceipt, ToolError> {
        let session = self.live_session(agent, token)?;
        let request_id = RequestId::parse(&request.request_id).map_err(ToolError::Invalid)?;
        if request.text.trim().is_empty() {
            return Err(ToolError::Invalid("the reply text is empty; nothing was sent".into()));
        }
        let trace_id = parse_optional_trace_id(request.trace_id.as_deref())?;
        let again = parse_again(request.again.as_ref(), trace_id.is_some())?;
        let format = ReplyFormat::parse(request.format.as_deref()).map_err(ToolError::Invalid)?;
        let (parts, html) = format.parts(&request.text, TELEGRAM_TEXT_LIMIT);
        if html && parts.iter().all(|part| is_blank_html(part)) {
            return Err(ToolError::Invalid(format!(
                "the reply shows nothing once its {} is rendered (only markup, or a link without text); \
                 nothing was sent",
                request.format.as_deref().unwrap_or("format")
            )));
        }
        let max = self.limits().max_reply_parts;
        if parts.len() > max {
            tracing::warn!(%agent, parts = parts.len(), max, "reply refused: too long");
            return Err(ToolError::TooLong { parts: parts.len(), max });
        }
        let at = Addressed { chat_id: request.chat_id, message_id: request.reply_to };
        let draft = Draft { request_id, trace_id, again, text: &request.text, parts, html, format, at };
        let slot = self.slot(agent);
        let running = {
            let _decide = slot.decisions.lock().await;
            match self.repeat_of(agent, &draft.request_id).await? {
                Some(Repeat::Running(running)) => running,
                Some(Repeat::Recorded(outcome)) => return outcome,
                None => {
                    // Taken only by a request never seen before: a repeat's were the
                    // first's. Removed again when this request ends without a delivery
                    // taking them over.
                    let staged = self.take_uploads(agent, &request.files)?;
                    match self.decide_reply(agent, slot, &session, draft, staged).await? {
                        Decided::Delivering(running) => running,
                        Decided::Answered(receipt) => return Ok(receipt),
                    }
                }
            }
        };
        running.await
    }

    /// What a request never seen before comes to, decided under the agent's decision lock:
    /// the envelope it answers (refusing rather than guessing), then where the answer goes.
    async fn decide_reply(
        &self,
        agent: &AgentName,
        slot: &AgentSlot,
        session: &str,
        draft: Draft<'_>,
        staged: StagedFiles,
    ) -> Result<Decided, ToolError> {
        let Draft { request_id, trace_id, again, text, parts, html, format, at } = draft;
        let resolved = self.resolve(agent, slot, session, trace_id.as_ref(), at).await;
        let (envelope, replied_before) = match (resolved, &trace_id) {
            // A child answering a handoff a change superseded: its answer is kept as a late
            // result and goes nowhere (DESIGN.md §11).
            (Err(ToolError::Task(refusal)), Some(trace_id)) => {
                let ledger = &self.inner.ledger;
                if ledger.keep_late_result(agent, trace_id, text.trim()).await? {
                    tracing::info!(%agent, %trace_id, "late result kept: its handoff was superseded");
                    // The envelope the refusal names is the delegator's, not the child's.
                    return Err(ToolError::LateResult(refusal));
                }
                return Err(ToolError::Task(refusal));
            }
            (resolved, _) => resolved?,
        };
        let answered = (envelope.state == EnvelopeState::Acked).then(|| envelope.trace_id.clone());
        if !staged.files.is_empty() && envelope.kind == EnvelopeKind::Handoff {
            return Err(ToolError::Invalid(format!(
                "{} is a handoff from another agent: an answer to it is text only, files go to a \
                 Telegram conversation; nothing was sent",
                envelope.trace_id
            )));
        }
        let (conversation, replied_before) = match envelope.kind {
            // An answer to a handoff goes to the agent that asked, not Telegram.
            EnvelopeKind::Handoff => {
                return self.answer_handoff(agent, &envelope, text, &request_id).await.map(Decided::Answered);
            }
            EnvelopeKind::HandoffAnswer => {
                let conversation = self.conversation_of_answer(agent, slot, &envelope).await?;
                if conversation.kind == EnvelopeKind::Handoff {
                    // An answer in a chain: the conversation is the handoff this agent was
                    // given, and the reply answers it (DESIGN.md §9).
                    if !staged.files.is_empty() {
                        return Err(ToolError::Invalid(format!(
                            "{} answers {}, a handoff from another agent: an answer to it is text only, \
                             files go to a Telegram conversation; nothing was sent",
                            envelope.trace_id, conversation.trace_id
                        )));
                    }
                    return self
                        .answer_handoff(agent, &conversation, text, &request_id)
                        .await
                        .map(Decided::Answered);
                }
                (conversation, None)
            }
            // A child's word that its handoff no longer stands answers nobody.
            EnvelopeKind::Revision if envelope.chat_type == ChatType::Agent => {
                return Err(ToolError::Invalid(format!(
                    "{} only tells you that a handoff no longer stands: it has no reply. Ack it; \
                     nothing was sent",
                    envelope.trace_id
                )));
            }
            EnvelopeKind::Message
            | EnvelopeKind::EditedMessage
            | EnvelopeKind::Unknown
            | EnvelopeKind::Revision
            | EnvelopeKind::RoomTurn => (envelope, replied_before),
        };
        if conversation.kind == EnvelopeKind::RoomTurn && !staged.files.is_empty() {
            return Err(ToolError::Invalid(format!(
                "{} is a turn in a group room, which takes text only; nothing was sent",
                conversation.trace_id
            )));
        }
        if conversation.kind == EnvelopeKind::RoomTurn {
            // A room turn's one reply goes to the room under the agent's name.
            return self
                .room_reply(agent, &conversation, text, format, request_id)
                .await
                .map(Decided::Delivering);
        }
        if let Some(answered) = answered.filter(|_| !again) {
            let part_texts: Vec<String> =
                parts.iter().cloned().chain(staged.files.iter().map(|f| f.descriptor.clone())).collect();
            self.refuse_unasked_follow_up(agent, &answered, &conversation, &part_texts).await?;
        }
        let content = ReplyContent { parts, html, files: staged.files.clone() };
        let plan = self.plan(agent, conversation, replied_before, request_id, content).await?;
        if plan.already_sent.len() == plan.parts.len() + plan.files.len() {
            // Dropped, `staged` removes its copies: nothing of them is sent.
            return self.finished_before(agent, &plan).await.map(Decided::Answered);
        }
        // From here the delivery owns the staged files (see `Finished`).
        staged.disarm();
        Ok(Decided::Delivering(self.start_delivery(agent, plan)))
    }

    /// A reply to an envelope that is already answered, without `again: true`: answered
    /// with what the earlier reply came to, and nothing is posted. The agent whose call was
    /// cancelled (the user pressed Esc) never learned that outcome, and its retry must not
    /// reach the user a second time. Finishing a reply that was cut off part-way, with the
    /// same text, is not a further message and passes.
    async fn refuse_unasked_follow_up(
        &self,
        agent: &AgentName,
        answered: &str,
        conversation: &StoredEnvelope,
        parts: &[String],
    ) -> Result<(), ToolError> {
        let attempts = match self.inner.ledger.last_reply_for(conversation.id).await? {
            Some((_, attempts)) => attempts,
            None => Vec::new(),
        };
        if !parts_already_delivered(&attempts, parts).is_empty() {
            return Ok(());
        }
        tracing::info!(%agent, trace_id = %answered, "reply to an answered envelope without again: true; nothing posted");
        Err(ToolError::AlreadyAnswered(already_answered(answered, &attempts)))
    }

    /// What became of a reply request: its outcome once it is over (awaited while it
    /// runs), or [`ToolError::UnknownRequest`] when it was never acted on — then nothing
    /// was sent, and the agent may reply again.
    pub async fn reply_outcome(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request_id: &str,
    ) -> Result<ReplyReceipt, ToolError> {
        self.live_session(agent, token)?;
        let request_id = RequestId::parse(request_id).map_err(ToolError::Invalid)?;
        match self.repeat_of(agent, &request_id).await? {
            Some(Repeat::Running(running)) => running.await,
            Some(Repeat::Recorded(outcome)) => outcome,
            None => Err(ToolError::UnknownRequest(request_id.to_string())),
        }
    }

    async fn repeat_of(
        &self,
        agent: &AgentName,
        request_id: &RequestId,
    ) -> Result<Option<Repeat>, ToolError> {
        if let Some(running) = self.slot(agent).running().by_request.get(request_id.as_str()) {
            return Ok(Some(Repeat::Running(running.clone())));
        }
        if !self.inner.ledger.reply_request_seen(agent.as_str(), request_id.as_str()).await? {
            return Ok(None);
        }
        if let Some(answered) = self.recorded_answer(agent, request_id).await? {
            return Ok(Some(Repeat::Recorded(Ok(answered))));
        }
        let Some(recorded) = self.inner.ledger.recorded_reply(agent.as_str(), request_id.as_str()).await?
        else {
            return Ok(None);
        };
        let envelope = self.inner.ledger.find(&recorded.trace_id).await?;
        Ok(Some(Repeat::Recorded(recorded_outcome(&recorded, envelope.as_ref()))))
    }

    /// Picks the envelope a reply acts for: the named one, or the only pending one this
    /// session was shown (of the chat or message `at` names, when it names one). With it,
    /// whether a reply request was made for it before, when that came with the lookup
    /// (`None`: not known yet).
    async fn resolve(
        &self,
        agent: &AgentName,
        slot: &AgentSlot,
        session: &str,
        trace_id: Option<&TraceId>,
        at: Addressed,
    ) -> Result<(StoredEnvelope, Option<bool>), ToolError> {
        let ledger = &self.inner.ledger;
        let resolved = match trace_id {
            Some(trace_id) => {
                let found = ledger.find_for_reply(trace_id).await?;
                // An envelope a change superseded is refused by its task, which names the
                // envelope to act on, before the resolver calls it unanswerable.
                self.refuse_if_task_moved_on(agent, found.as_ref().map(|found| &found.envelope)).await?;
                let replied_before = found.as_ref().map(|found| found.replied_before);
                let candidate = found.map(|found| {
                    let unreconciled =
                        if found.awaiting_reconciliation { vec![found.envelope.id] } else { Vec::new() };
                    blocked_by(slot, vec![found.envelope], &unreconciled).remove(0)
                });
                resolver::resolve_named(agent.as_str(), trace_id.as_str(), candidate)
                    .and_then(|envelope| resolver::check_addressed(at, envelope))
                    .map(|envelope| (envelope, replied_before))
            }
            None => {
                let (shown, not_shown): (Vec<_>, Vec<_>) = ledger
                    .pending(agent)
                    .await?
                    .into_iter()
                    .partition(|envelope| slot.was_shown(session, &envelope.trace_id));
                resolver::resolve_unnamed_at(at, self.candidates(slot, shown).await?, &not_shown)
                    .map(|envelope| (envelope, None))
            }
        };
        resolved.map_err(|refusal| refused("reply", agent, refusal))
    }

    /// The conversation a reply to a `handoff_answer` goes to: the envelope the handoff was
    /// made for, checked like a named reply's target. When that envelope is an answer too
    /// (a handoff made on behalf of an earlier answer), its own conversation, and so on: the
    /// conversation is a Telegram message, a room's turn, or a handoff this agent was given.
    async fn conversation_of_answer(
        &self,
        agent: &AgentName,
        slot: &AgentSlot,
        answer: &StoredEnvelope,
    ) -> Result<StoredEnvelope, ToolError> {
        let ledger = &self.inner.ledger;
        let mut answer = answer.clone();
        loop {
            let cause = match ledger.handoff_of_envelope(answer.id).await? {
                Some(handoff) => handoff.cause_trace_id,
                None => None,
            };
            let Some(cause) = cause else {
                return Err(ToolError::NoConversation { trace_id: answer.trace_id.to_string() });
            };
            let found = ledger.find(&cause).await?;
            let candidate = self.candidates(slot, found.into_iter().collect()).await?.into_iter().next();
            let conversation = resolver::resolve_named(agent.as_str(), &cause, candidate)
                .map_err(|refusal| refused("reply", agent, refusal))?;
            if conversation.kind != EnvelopeKind::HandoffAnswer {
                return Ok(conversation);
            }
            // A cause is always recorded before the answers made on its behalf, so the
            // chain ends; a ledger that says otherwise has no conversation to offer.
            if conversation.id >= answer.id {
                return Err(ToolError::NoConversation { trace_id: answer.trace_id.to_string() });
            }
            answer = conversation;
        }
    }

    /// The envelopes with what blocks sending for them: a reply being delivered (known in
    /// memory) or an unknown outcome not yet reconciled (known to the ledger).
    async fn candidates(
        &self,
        slot: &AgentSlot,
        envelopes: Vec<StoredEnvelope>,
    ) -> Result<Vec<Candidate<StoredEnvelope>>, ToolError> {
        let ids: Vec<i64> = envelopes.iter().map(|e| e.id).collect();
        let unreconciled = self.inner.ledger.awaiting_reconciliation(&ids).await?;
        Ok(blocked_by(slot, envelopes, &unreconciled))
    }

    /// The parts to send, and those an interrupted earlier request with the same text
    /// already delivered (nothing to look up when no request was made for it before).
    pub(super) async fn plan(
        &self,
        agent: &AgentName,
        envelope: StoredEnvelope,
        replied_before: Option<bool>,
        request_id: RequestId,
        content: ReplyContent,
    ) -> Result<ReplyPlan, ToolError> {
        let ReplyContent { parts, html, files } = content;
        let last_reply = match replied_before {
            Some(false) => None,
            Some(true) | None => self.inner.ledger.last_reply_for(envelope.id).await?,
        };
        // A file part is known by its descriptor (name, size, digest), as a text part by its text.
        let part_texts: Vec<String> =
            parts.iter().cloned().chain(files.iter().map(|f| f.descriptor.clone())).collect();
        let already_sent = match last_reply {
            Some((_, attempts)) => parts_already_delivered(&attempts, &part_texts),
            None => Vec::new(),
        };
        if !already_sent.is_empty() {
            tracing::info!(trace_id = %envelope.trace_id, already_sent = already_sent.len(), "resuming a reply that was cut off: delivered parts are not sent again");
        }
        let target = ReplyTarget {
            envelope_id: envelope.id,
            trace_id: envelope.trace_id.clone(),
            agent: agent.to_string(),
            route: envelope.route.clone().unwrap_or_default(),
            chat_id: envelope.chat_id,
            thread_id: envelope.thread_id(),
            reply_to_message_id: i32::try_from(envelope.message_id).ok(),
        };
        Ok(ReplyPlan {
            target,
            request_id: Some(request_id.to_string()),
            purpose: AttemptPurpose::Reply,
            parts,
            html,
            already_sent,
            files,
        })
    }

    /// A reply every part of which an earlier request, cut off after them, delivered: what
    /// is left when the part it was cut off at (a file Telegram refused) is left out.
    /// Nothing is sent, and the envelope is answered, as the last part confirmed answers it.
    async fn finished_before(&self, agent: &AgentName, plan: &ReplyPlan) -> Result<ReplyReceipt, ToolError> {
        let target = &plan.target;
        let reason =
            "answered: its reply's parts were all delivered by an earlier request, cut off after them";
        let moved = self
            .inner
            .ledger
            .transition(
                target.envelope_id,
                &[EnvelopeState::Pending, EnvelopeState::Acked],
                EnvelopeState::Acked,
                &format!("agent:{agent}"),
                Some(reason),
            )
            .await?;
        if !moved {
            return Err(ToolError::Invalid(
                "the envelope changed state meanwhile; call `pending` and try again".into(),
            ));
        }
        tracing::info!(%agent, trace_id = %target.trace_id, "reply finished without sending: every part was delivered before");
        Ok(receipt(target, plan.already_sent.iter().map(|(_, id)| *id).collect()))
    }

    /// Starts delivering as a task the daemon waits for on shutdown; the returned future
    /// only observes it. Registered as running before the task can finish, so a repeated
    /// request always finds it (running, or recorded in the ledger).
    pub(super) fn start_delivery(&self, agent: &AgentName, plan: ReplyPlan) -> RunningReply {
        let slot = self.slot(agent);
        let mut running = slot.running();
        let span = tracing::info_span!("envelope", trace_id = %plan.target.trace_id);
        let done = Finished { bridge: self.clone(), agent: agent.clone(), plan: plan.clone() };
        let bridge = self.clone();
        let task = self.inner.tasks.spawn(
            async move {
                let outcome = bridge.inner.outbound.deliver(&done.plan).await;
                bridge.settle(&done.plan, outcome).await
            }
            .instrument(span),
        );
        let trace_id = plan.target.trace_id.clone();
        let observed: RunningReply = async move {
            task.await.unwrap_or_else(|failure| {
                tracing::error!(%trace_id, error = %failure, "a reply delivery task failed");
                Err(ToolError::Unknown {
                    trace_id: trace_id.to_string(),
                    error: format!("the delivery task failed: {failure}"),
                    sent: Vec::new(),
                    parts: 0,
                    stays_answered: false,
                })
            })
        }
        .boxed()
        .shared();
        running.by_request.insert(plan.request_id.clone().unwrap_or_default(), observed.clone());
        running.envelopes.insert(plan.target.envelope_id);
        observed
    }

    /// Turns a delivery's outcome into what the agent is told; the ledger already
    /// settled the envelope with the attempt that decided it.
    async fn settle(&self, plan: &ReplyPlan, outcome: DeliveryOutcome) -> Result<ReplyReceipt, ToolError> {
        let target = &plan.target;
        let agent = &target.agent;
        match outcome {
            DeliveryOutcome::Delivered { message_ids } => {
                tracing::info!(%agent, chat_id = target.chat_id, ?message_ids, "reply delivered");
                Ok(receipt(target, message_ids))
            }
            DeliveryOutcome::NotSent { sent, parts, error } => {
                tracing::warn!(%agent, %error, delivered_parts = sent.len(), "reply not sent");
                // Parts go in order: the first not delivered is the one that failed.
                let failed = (0..parts).find(|index| !sent.iter().any(|(done, _)| done == index));
                let cut_at_file = failed
                    .and_then(|index| index.checked_sub(plan.parts.len()))
                    .and_then(|file| plan.files.get(file))
                    .map(|file| file.name.clone());
                Err(ToolError::NotSent {
                    trace_id: target.trace_id.to_string(),
                    error,
                    sent,
                    parts,
                    cut_at_file,
                })
            }
            DeliveryOutcome::Refused { sent, refusal } => {
                tracing::warn!(%agent, delivered_parts = sent.len(), code = refusal.code(), "reply refused at the moment of sending: {refusal}");
                if sent.is_empty() {
                    Err(ToolError::Task(refusal))
                } else {
                    let parts = plan.parts.len() + plan.files.len();
                    Err(ToolError::TaskCutOff { refusal, sent, parts })
                }
            }
            DeliveryOutcome::Unknown { sent, parts, error } => {
                let state = self.inner.ledger.find(&target.trace_id).await.ok().flatten().map(|e| e.state);
                let stays_answered = state == Some(EnvelopeState::Acked);
                tracing::error!(%agent, %error, delivered_parts = sent.len(), stays_answered, "reply outcome unknown: an operator must reconcile it");
                // `[operator]`, when configured, asks about it in Telegram now.
                if let Some(relay) = self.inner.permissions.get() {
                    relay.ring_keeper();
                }
                Err(ToolError::Unknown {
                    trace_id: target.trace_id.to_string(),
                    error,
                    sent,
                    parts,
                    stays_answered,
                })
            }
        }
    }

    /// Marks an envelope handled without a reply.
    pub async fn ack(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        request: AckRequest,
    ) -> Result<AckReceipt, ToolError> {
        self.live_session(agent, token)?;
        let trace_id = TraceId::parse(&request.trace_id).map_err(ToolError::Invalid)?;
        let slot = self.slot(agent);
        let _decide = slot.decisions.lock().await;
        let found = self.inner.ledger.find(&trace_id).await?;
        let candidate = self.candidates(slot, found.into_iter().collect()).await?.into_iter().next();
        let envelope = resolver::resolve_named(agent.as_str(), trace_id.as_str(), candidate)
            .map_err(|refusal| refused("ack", agent, refusal))?;
        if envelope.kind == EnvelopeKind::Handoff {
            // Closing a handoff tells the delegator, with the note.
            self.close_handoff(agent, &envelope, request.note.as_deref()).await?;
            tracing::info!(%agent, trace_id = %trace_id, "handoff closed without an answer");
            return Ok(AckReceipt {
                trace_id: trace_id.to_string(),
                state: EnvelopeState::Acked.to_string(),
            });
        }
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
            .await?;
        if !moved {
            return Err(ToolError::Invalid(
                "the envelope changed state meanwhile; call `pending` and try again".into(),
            ));
        }
        if envelope.kind == EnvelopeKind::RoomTurn {
            // The speaker passes: the room driver ends its turn.
            self.wake_rooms();
        }
        tracing::info!(%agent, trace_id = %trace_id, "envelope acked");
        Ok(AckReceipt { trace_id: trace_id.to_string(), state: EnvelopeState::Acked.to_string() })
    }
}

/// The envelopes with what blocks sending for them: a reply being delivered (known in
/// memory) or an unknown outcome not yet reconciled (`unreconciled`, from the ledger).
fn blocked_by(
    slot: &AgentSlot,
    envelopes: Vec<StoredEnvelope>,
    unreconciled: &[i64],
) -> Vec<Candidate<StoredEnvelope>> {
    let running = slot.running();
    envelopes
        .into_iter()
        .map(|envelope| {
            let blocked = if running.envelopes.contains(&envelope.id) {
                Some(Blocked::ReplyInProgress)
            } else if unreconciled.contains(&envelope.id) {
                Some(Blocked::AwaitingReconciliation)
            } else {
                None
            };
            Candidate { envelope, blocked }
        })
        .collect()
}

/// What a reply sends: its text's parts (HTML or plain), then its files.
pub(super) struct ReplyContent {
    pub(super) parts: Vec<String>,
    pub(super) html: bool,
    pub(super) files: Vec<PlannedFile>,
}

/// Removes a delivery from the running set when its task ends, however it ends (a panic
/// included), so the envelope is never blocked for good.
struct Finished {
    bridge: Bridge,
    agent: AgentName,
    plan: ReplyPlan,
}

impl Drop for Finished {
    fn drop(&mut self) {
        // The reply is done with its staged files, whatever it came to.
        uploads::remove_files(&self.plan.files);
        let mut running = self.bridge.slot(&self.agent).running();
        running.by_request.remove(self.plan.request_id.as_deref().unwrap_or_default());
        running.envelopes.remove(&self.plan.target.envelope_id);
    }
}

pub(super) fn parse_optional_trace_id(raw: Option<&str>) -> Result<Option<TraceId>, ToolError> {
    match raw.map(str::trim) {
        None => Ok(None),
        // Refused, not read as none: the caller meant to name an envelope.
        Some("") => Err(ToolError::Invalid(
            "trace_id is empty: name the envelope (env_…) or leave trace_id out; nothing was done".into(),
        )),
        Some(raw) => TraceId::parse(raw).map(Some).map_err(ToolError::Invalid),
    }
}

/// Reads `again` as the tool receives it: a JSON boolean, or nothing.
/// `again`, which adds a message to a conversation already answered, and so must name it:
/// an unnamed reply goes to the one conversation waiting, which is never the answered one
/// the agent means (a result after a progress message would land in another chat).
fn parse_again(again: Option<&serde_json::Value>, named: bool) -> Result<bool, ToolError> {
    match again {
        None | Some(serde_json::Value::Null | serde_json::Value::Bool(false)) => Ok(false),
        Some(serde_json::Value::Bool(true)) if named => Ok(true),
        Some(serde_json::Value::Bool(true)) => Err(ToolError::Invalid(
            "again: true adds a message to a conversation you already answered: name that message with \
             its trace_id; nothing was sent"
                .into(),
        )),
        Some(other) => Err(ToolError::Invalid(format!(
            "again must be the JSON boolean true or false, not {other}; nothing was sent"
        ))),
    }
}

/// How much of the earlier reply [`already_answered`] quotes.
const EARLIER_QUOTE_CHARS: usize = 120;

/// What an answered envelope's earlier reply came to, for an agent that may not have seen
/// it (its call was cancelled, or timed out), and how to send a further message anyway.
/// `last_request`: the attempts of the envelope's most recent reply request, if any.
pub fn already_answered(trace_id: &str, last_request: &[StoredAttempt]) -> String {
    let again =
        "To add another message to this thread, call reply again with this trace_id and `again: true`.";
    let summary = ReplyTally::of(last_request);
    let Some(summary) = summary.filter(|summary| !summary.sent.is_empty()) else {
        return format!(
            "{trace_id} is already answered (it was marked handled, and no reply to it is on record as \
             delivered); nothing was posted. {again}"
        );
    };
    let ids = summary.sent.iter().map(|(_, id)| id.to_string()).collect::<Vec<_>>().join(", ");
    let messages = if summary.sent.len() == 1 { format!("message {ids}") } else { format!("messages {ids}") };
    // Every attempt at one part carries that part's text.
    let first_index = summary.sent[0].0;
    let first_part = last_request
        .iter()
        .find(|attempt| usize::try_from(attempt.chunk_index) == Ok(first_index))
        .map(|attempt| attempt.text.as_str())
        .unwrap_or_default();
    let mut quoted: String = first_part.chars().take(EARLIER_QUOTE_CHARS).collect();
    if first_part.chars().count() > EARLIER_QUOTE_CHARS || summary.parts > 1 {
        quoted.push('…');
    }
    let how = match summary.verdict {
        ReplyVerdict::Delivered => "was delivered".to_owned(),
        _ => format!("was partly delivered ({} of {} parts)", summary.sent.len(), summary.parts),
    };
    format!(
        "your earlier reply to {trace_id} {how} as {messages} (if that call was cancelled or timed out, this is \
         what it came to): \"{quoted}\". Nothing was posted now. {again}"
    )
}

fn receipt(target: &ReplyTarget, message_ids: Vec<i32>) -> ReplyReceipt {
    ReplyReceipt {
        trace_id: target.trace_id.to_string(),
        chat_id: target.chat_id,
        thread_id: target.thread_id,
        route: target.route.clone(),
        message_ids,
        answered_handoff: None,
        room_turn: None,
    }
}

/// A request's outcome as the ledger tells it, for a repeated request or a status query.
fn recorded_outcome(
    recorded: &RecordedReply,
    envelope: Option<&StoredEnvelope>,
) -> Result<ReplyReceipt, ToolError> {
    let trace_id = recorded.trace_id.clone();
    let (sent, parts) = (recorded.sent.clone(), recorded.parts);
    match &recorded.verdict {
        ReplyVerdict::Delivered => Ok(ReplyReceipt {
            trace_id: trace_id.to_string(),
            chat_id: envelope.map_or(0, |e| e.chat_id),
            thread_id: envelope.and_then(StoredEnvelope::thread_id),
            route: envelope.and_then(|e| e.route.clone()).unwrap_or_default(),
            message_ids: sent.iter().map(|(_, id)| *id).collect(),
            answered_handoff: None,
            room_turn: None,
        }),
        ReplyVerdict::NotSent { error } => {
            // Which part failed is not told again: its advice came with the first answer.
            Err(ToolError::NotSent {
                trace_id: trace_id.to_string(),
                error: error.clone(),
                sent,
                parts,
                cut_at_file: None,
            })
        }
        // In flight in the ledger but not running here: the daemon that made it stopped.
        ReplyVerdict::Unknown { error } => Err(ToolError::Unknown {
            trace_id: trace_id.to_string(),
            error: error.clone(),
            sent,
            parts,
            stays_answered: envelope.is_some_and(|e| e.state == EnvelopeState::Acked),
        }),
        ReplyVerdict::InFlight => Err(ToolError::Unknown {
            trace_id: trace_id.to_string(),
            error: "the daemon stopped while this reply was in flight".into(),
            sent,
            parts,
            stays_answered: envelope.is_some_and(|e| e.state == EnvelopeState::Acked),
        }),
    }
}

/// The parts of `parts` that the envelope's last reply request already delivered, when
/// that request was cut off part-way: the longest run of parts from the first that are the
/// ones it delivered, text for text and file for file. Sending the same text again then
/// only sends what is missing, whatever comes after (a file that was refused, left out).
/// Anything else starts from scratch.
pub fn parts_already_delivered(last_request: &[StoredAttempt], parts: &[String]) -> Vec<(usize, i32)> {
    let Some(summary) = ReplyTally::of(last_request) else {
        return Vec::new();
    };
    let cut_off = matches!(summary.verdict, ReplyVerdict::NotSent { .. }) && !summary.sent.is_empty();
    if !cut_off {
        return Vec::new();
    }
    let same_text = |index: usize| {
        last_request.iter().any(|a| {
            a.effective_outcome() == AttemptState::Sent
                && usize::try_from(a.chunk_index) == Ok(index)
                // A part Telegram could not parse as HTML went out as its plain text.
                && (a.text == parts[index] || a.text == html_to_plain(&parts[index]))
        })
    };
    // A part is delivered in order or not at all, so the delivered parts are a prefix.
    summary
        .sent
        .into_iter()
        .enumerate()
        .take_while(|&(position, (index, _))| position == index && index < parts.len() && same_text(index))
        .map(|(_, sent)| sent)
        .collect()
}

/// A stored envelope, as the resolver reads it.
impl Answerable for StoredEnvelope {
    fn trace_id(&self) -> &str {
        &self.trace_id
    }

    fn agent(&self) -> Option<&str> {
        self.agent.as_deref()
    }

    fn state(&self) -> EnvelopeState {
        self.state
    }

    fn chat_id(&self) -> i64 {
        self.chat_id
    }

    fn message_id(&self) -> i64 {
        self.message_id
    }
}

/// A refusal: nothing is sent and nothing changes; logged at warn with its candidates so
/// an operator watching the logs sees it.
fn refused(tool: &str, agent: &AgentName, refusal: ResolveError) -> ToolError {
    let listed: Vec<String> = match &refusal {
        ResolveError::Ambiguous { candidates } => candidates
            .iter()
            .take(MAX_LISTED)
            .map(|c| format!("{} ({} in chat {})", c.trace_id, c.user(), c.chat_id))
            .collect(),
        _ => Vec::new(),
    };
    tracing::warn!(%agent, candidates = ?listed, "{tool} refused: {refusal}");
    ToolError::Refused(refusal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(
        index: i64,
        count: i64,
        text: &str,
        outcome: AttemptState,
        message_id: Option<i64>,
    ) -> StoredAttempt {
        crate::domain::attempts::reply_part_attempt("req_abcdefgh", index, count, text, outcome, message_id)
    }

    fn parts(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn a_reply_cut_off_part_way_resumes_after_the_delivered_parts() {
        let last = [
            attempt(0, 3, "one", AttemptState::Sent, Some(10)),
            attempt(1, 3, "two", AttemptState::Sent, Some(11)),
            attempt(2, 3, "three", AttemptState::NotSent, None),
        ];
        assert_eq!(parts_already_delivered(&last, &parts(&["one", "two", "three"])), [(0, 10), (1, 11)]);
        // Different text from the first part: start from scratch.
        assert!(parts_already_delivered(&last, &parts(&["ONE", "two", "three"])).is_empty());
    }

    /// The delivered parts are skipped as far as the new reply repeats them, whatever
    /// follows: a reply cut off at a file is finished without that file, and never
    /// repeats its text.
    #[test]
    fn a_reply_is_resumed_as_far_as_it_repeats_the_delivered_parts() {
        let last = [
            attempt(0, 3, "one", AttemptState::Sent, Some(10)),
            attempt(1, 3, "[file a.png, 3 bytes, sha256 ab]", AttemptState::Sent, Some(11)),
            attempt(2, 3, "[file b.png, 3 bytes, sha256 cd]", AttemptState::NotSent, None),
        ];
        assert_eq!(parts_already_delivered(&last, &parts(&["one"])), [(0, 10)], "the files left out");
        let other_file = parts(&["one", "[file c.pdf, 9 bytes, sha256 ef]"]);
        assert_eq!(parts_already_delivered(&last, &other_file), [(0, 10)]);
        let without_the_refused_one = parts(&["one", "[file a.png, 3 bytes, sha256 ab]"]);
        assert_eq!(parts_already_delivered(&last, &without_the_refused_one), [(0, 10), (1, 11)]);
        assert_eq!(parts_already_delivered(&last, &parts(&["one", "TWO"])), [(0, 10)]);
    }

    /// A part Telegram could not parse as HTML went out as its plain text: resending the
    /// same HTML reply does not send that part again.
    #[test]
    fn a_part_sent_as_its_plain_text_fallback_counts_as_delivered() {
        let last = [
            attempt(0, 2, "<b>one</b>", AttemptState::NotSent, None),
            attempt(0, 2, "one", AttemptState::Sent, Some(10)),
            attempt(1, 2, "<i>two</i>", AttemptState::NotSent, None),
        ];
        assert_eq!(parts_already_delivered(&last, &parts(&["<b>one</b>", "<i>two</i>"])), [(0, 10)]);
    }

    #[test]
    fn an_answered_envelope_says_what_its_earlier_reply_came_to_and_how_to_add_one() {
        let delivered = [attempt(0, 1, "interrupted answer", AttemptState::Sent, Some(3))];
        let text = already_answered("env_abcdefghij", &delivered);
        assert!(text.contains("delivered as message 3"), "{text}");
        assert!(text.contains("\"interrupted answer\""), "{text}");
        assert!(text.contains("again: true"), "{text}");

        let two = [
            attempt(0, 2, "one", AttemptState::Sent, Some(7)),
            attempt(1, 2, "two", AttemptState::Sent, Some(8)),
        ];
        assert!(
            already_answered("env_x", &two).contains("messages 7, 8"),
            "{}",
            already_answered("env_x", &two)
        );

        let acked_only = already_answered("env_x", &[]);
        assert!(
            acked_only.contains("already answered") && acked_only.contains("again: true"),
            "{acked_only}"
        );
    }

    #[test]
    fn again_is_a_json_boolean_or_nothing() {
        assert!(!parse_again(None, false).unwrap());
        assert!(!parse_again(Some(&serde_json::json!(false)), false).unwrap());
        assert!(parse_again(Some(&serde_json::json!(true)), true).unwrap());
        for wrong in [serde_json::json!("true"), serde_json::json!(1)] {
            let error = parse_again(Some(&wrong), true).unwrap_err().to_string();
            assert!(error.contains("JSON boolean") && error.contains("nothing was sent"), "{error}");
        }
    }

    #[test]
    fn again_names_the_conversation_it_adds_to() {
        let error = parse_again(Some(&serde_json::json!(true)), false).unwrap_err().to_string();
        assert!(error.contains("trace_id") && error.contains("nothing was sent"), "{error}");
    }

    /// An operator found the unknown part of a reply cut short delivered: the envelope went
    /// back to its agent to finish the reply, and that part counts as delivered too.
    #[test]
    fn a_part_reconciled_as_delivered_is_not_sent_again() {
        let mut found = attempt(1, 3, "two", AttemptState::Unknown, None);
        found.reconciled_outcome = Some(crate::ledger::ReconciledOutcome::Sent);
        let last = [attempt(0, 3, "one", AttemptState::Sent, Some(10)), found];
        assert_eq!(parts_already_delivered(&last, &parts(&["one", "two", "three"])), [(0, 10), (1, 0)]);
    }

    #[test]
    fn only_a_reply_that_was_cut_off_is_resumed() {
        // Fully delivered: the same text again is a new message (an agent may say "OK" twice).
        let delivered = [attempt(0, 1, "OK", AttemptState::Sent, Some(10))];
        assert!(parts_already_delivered(&delivered, &parts(&["OK"])).is_empty());
        // Unknown: never built on (the resolver refuses it until reconciled anyway).
        let unknown = [
            attempt(0, 2, "a", AttemptState::Sent, Some(10)),
            attempt(1, 2, "b", AttemptState::Unknown, None),
        ];
        assert!(parts_already_delivered(&unknown, &parts(&["a", "b"])).is_empty());
        // Nothing delivered: nothing to skip.
        let refused = [attempt(0, 2, "a", AttemptState::NotSent, None)];
        assert!(parts_already_delivered(&refused, &parts(&["a", "b"])).is_empty());
    }
}
