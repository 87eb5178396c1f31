//! The permission relay (DESIGN.md §15): an agent session's tool-use approvals, asked in
//! Telegram and answered by the agent's approvers.
//!
//! A request is a ledger row before anything is posted ([`crate::ledger`]'s
//! `permission_requests`); the prompt's `sendMessage` is then recorded there as an attempt
//! is (in flight, then sent, not sent or unknown; unknown is never sent again). An
//! approver's press or text answer records the verdict, first one wins, and the bridge
//! hands it to the session of the plugin process that asked. The keeper
//! ([`PermissionRelay::run_keeper`]) expires what is due, from the ledger, so expiry
//! survives restarts, and edits every finished prompt to show its outcome without buttons.
//! An edit shows a final state, so doing it again is harmless ("message is not modified"):
//! an edit whose outcome is unknown is simply made again later.
//!
//! The decisions are [`crate::rules::permissions`]'; this is the I/O around them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agents::api::wire::{PermissionReceipt, PermissionRequest};
use crate::backoff::Backoff;
use crate::config::{OperatorSettings, PermissionSettings};
use crate::ids::{AgentName, random_suffix};
use crate::ledger::{
    AnswerRecorded, AttemptOutcome, AttemptState, Ledger, LedgerError, NewPermissionRequest, PermissionState,
    QuestionAnswered, QuestionState, Reconciliation, StoredPermission, StoredQuestion,
};
use crate::operate::metrics;
use crate::rules::permissions::{
    self as rules, Finding, PERMISSION_ID_PREFIX, PERMISSION_ID_SUFFIX_LEN, PressAction, PressDecision,
    PressFacts, PromptEnd, PromptFacts, QUESTION_ID_PREFIX, QuestionFacts, Refusal, RequestFacts, Verdict,
};
use crate::telegram::bot_api::{BotApi, Exchange};
use crate::telegram::outbound::{Observed, Outbound, classify, error_kind, telegram_thread};

/// While something may wait on the keeper (a pending request; with `[operator]`, an
/// unresolved send to ask about or a question to settle), it looks at the ledger at least
/// this often, whatever it expects: a clock that jumped, an unknown outcome of a send that
/// does not ring it (a room's post, a handoff's), or a write of another process
/// (`switchboard ledger reconcile` answering a question) is noticed within it. With none of
/// these it sleeps until rung (see [`keeper_wait`]).
const KEEPER_MAX_SLEEP: Duration = Duration::from_secs(60);

/// After an edit whose outcome is unknown (or a ledger that failed), the keeper tries
/// again this soon, doubling with each round that fails again up to the cap: Telegram out
/// of reach for an hour costs a dozen tries, not one every five seconds.
const KEEPER_RETRY: Duration = Duration::from_secs(5);
const KEEPER_RETRY_CAP: Duration = Duration::from_secs(300);

/// A prompt's send waits out Telegram's rate limits (a 429 proves nothing was posted) for
/// at most this long in all, then counts as not sent.
const PROMPT_RATE_LIMIT_BUDGET: Duration = Duration::from_secs(60);

/// How long recording a prompt's send is tried again while the ledger is busy or full. Past
/// it the row stays `in_flight` until start-up recovery marks its outcome unknown; bounded
/// so that a ledger that stays broken cannot hold a graceful stop.
const PROMPT_RECORD_PATIENCE: Duration = Duration::from_secs(30);

/// Longest description and preview stored: Claude Code cuts the preview at 200
/// characters; a description far longer than a prompt can show is cut here.
const MAX_STORED_FIELD_CHARS: usize = 8 * 1024;

/// What a presser is told when the ledger failed (busy, say) while reading what the press
/// names: nothing changed, and the same press again may go through.
const COULD_NOT_READ: &str = "The switchboard could not read its ledger; try again.";

/// Likewise, when the ledger failed while recording the answer: the request is still
/// pending, so the presser is told to press again, not that it was answered or expired.
const COULD_NOT_RECORD: &str = "The switchboard could not record that; try again.";

/// What recording a verdict came to.
#[derive(Debug)]
enum Recording {
    /// This verdict is the one. The agent whose asking session now has it to be handed
    /// (`None` only for a row whose agent is no longer a valid name).
    Recorded(Option<AgentName>),
    /// The request was no longer pending (answered first, expired, or gone): nothing changed.
    TooLate,
    /// The ledger failed: nothing changed, the request is still pending.
    Failed,
}

/// Relays the approvals of the agents that have `[agents.NAME.permissions]`.
#[derive(Clone)]
pub struct PermissionRelay {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Ledger,
    /// The Bot API, through the send client (its timeout makes a slow send unknown).
    api: BotApi,
    /// Each relayed agent's route, approvers and timeout.
    relays: BTreeMap<AgentName, PermissionSettings>,
    /// `[operator]`: where unresolved sends are asked about, if anywhere.
    operator: Option<OperatorSettings>,
    /// Rung when the keeper has something to do (a new request, a verdict, an ended session).
    keeper: Notify,
    /// Prompts' sends run here, so a caller that goes away cannot cut one between its
    /// record and its outcome.
    tasks: TaskTracker,
    /// Paces prompts, questions and their edits with the replies to the same chat, and
    /// shares the chat's `429` holds with them.
    outbound: Outbound,
}

/// Who asks: the session and the plugin process behind it.
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    pub agent: &'a AgentName,
    pub session_id: &'a str,
    pub plugin_id: &'a str,
}

/// Why a request was not relayed; nothing was recorded or posted.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("{0}")]
    Invalid(String),
    #[error(
        "agent '{0}' has no [agents.{0}.permissions] in the switchboard configuration: its approvals are not \
         relayed, answer at the terminal"
    )]
    NotRelayed(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A `callback_query` update: a press on one of the bot's buttons.
#[derive(Debug, Clone, Deserialize)]
pub struct CallbackPress {
    /// Telegram's id of the query, to answer it.
    pub id: String,
    pub from: CallbackUser,
    #[serde(default)]
    pub data: Option<String>,
    /// The message the button is under (absent for inline-mode messages).
    #[serde(default)]
    pub message: Option<CallbackMessage>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CallbackUser {
    pub id: i64,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub first_name: String,
}

impl CallbackUser {
    fn shown(&self) -> String {
        match &self.username {
            Some(username) => format!("@{username}"),
            None => self.first_name.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct CallbackMessage {
    pub message_id: i32,
    pub chat: CallbackChat,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CallbackChat {
    pub id: i64,
}

/// The callback query of a raw update, if it is one. Cheap for every other update: the
/// text is looked at before anything is parsed.
pub fn callback_press(raw_update: &str) -> Option<CallbackPress> {
    #[derive(Deserialize)]
    struct Update {
        callback_query: CallbackPress,
    }
    if !raw_update.contains("\"callback_query\"") {
        return None;
    }
    serde_json::from_str::<Update>(raw_update).ok().map(|update| update.callback_query)
}

/// An approver's `yes <id>` / `no <id>` (or `y`, `n`) in a relay's chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextAnswer {
    pub verdict: Verdict,
    pub request_id: String,
    pub chat_id: i64,
    pub from: i64,
    pub from_shown: String,
}

/// A chat where approvers answer: what the poller needs to tell a text answer from work
/// for an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerChat {
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub approvers: Vec<i64>,
}

/// The chats of every relay in `settings`.
pub fn answer_chats(settings: &crate::config::Settings) -> Vec<AnswerChat> {
    settings
        .agents
        .values()
        .filter_map(|agent| agent.permissions.as_ref())
        .map(|relay| AnswerChat {
            chat_id: relay.chat_id,
            thread_id: relay.thread_id,
            approvers: relay.approvers.clone(),
        })
        .collect()
}

/// Whether a message is an approver's text answer in a relay's chat (and so no work for
/// any agent). Pure: the poller asks it of every message while relays are configured.
pub fn text_answer(
    chats: &[AnswerChat],
    chat_id: i64,
    thread_id: Option<i32>,
    sender: i64,
    text: Option<&str>,
) -> Option<(Verdict, String)> {
    let answer = rules::parse_text_verdict(text?)?;
    let here = |chat: &&AnswerChat| {
        chat.chat_id == chat_id
            && chat.thread_id.is_none_or(|thread| Some(thread) == thread_id)
            && chat.approvers.contains(&sender)
    };
    chats.iter().find(here).map(|_| answer)
}

impl PermissionRelay {
    pub fn new(
        ledger: Ledger,
        api: BotApi,
        relays: BTreeMap<AgentName, PermissionSettings>,
        operator: Option<OperatorSettings>,
        tasks: TaskTracker,
        outbound: Outbound,
    ) -> Self {
        let keeper = Notify::new();
        Self { inner: Arc::new(Inner { ledger, api, relays, operator, keeper, tasks, outbound }) }
    }

    /// A call to `chat_id` at the chat's pace (see [`Outbound::call_paced`]); one not made
    /// comes back as a request that reached nobody.
    async fn call_paced(&self, chat_id: i64, method: &str, params: &serde_json::Value) -> Exchange {
        let made = self.inner.outbound.call_paced(&self.inner.api, chat_id, method, params).await;
        made.unwrap_or_else(|why| Exchange::NotConnected(format!("not asked: {why}")))
    }

    /// The relays of `settings`, by agent.
    pub fn relays_of(settings: &crate::config::Settings) -> BTreeMap<AgentName, PermissionSettings> {
        settings
            .agents
            .iter()
            .filter_map(|(name, agent)| Some((name.clone(), agent.permissions.clone()?)))
            .collect()
    }

    /// Something for the keeper: a request to time, a prompt to edit.
    pub fn ring_keeper(&self) {
        self.inner.keeper.notify_one();
    }

    /// Records the request, then posts its prompt. A request the same plugin already
    /// asked is not posted again: the receipt says what became of it.
    pub async fn ask(
        &self,
        asker: Asker<'_>,
        request: PermissionRequest,
    ) -> Result<PermissionReceipt, AskError> {
        let relay = self
            .inner
            .relays
            .get(asker.agent)
            .ok_or_else(|| AskError::NotRelayed(asker.agent.to_string()))?;
        if !rules::is_claude_request_id(&request.request_id) {
            return Err(AskError::Invalid(format!(
                "request_id {:?} is not a permission request id (five letters a-z without l); nothing was relayed",
                request.request_id
            )));
        }
        if request.tool_name.trim().is_empty() {
            return Err(AskError::Invalid("tool_name is empty; nothing was relayed".into()));
        }
        let id = format!("{PERMISSION_ID_PREFIX}{}", random_suffix(PERMISSION_ID_SUFFIX_LEN));
        // The configuration bounds the timeout to a week, well within chrono's range.
        let timeout = chrono::Duration::from_std(relay.timeout).unwrap_or(chrono::Duration::weeks(1));
        let expires_at = crate::clock::text(Utc::now() + timeout);
        let description = cut(&request.description);
        let input_preview = cut(&request.input_preview);
        let new = NewPermissionRequest {
            id: &id,
            agent: asker.agent.as_str(),
            session_id: asker.session_id,
            plugin_id: asker.plugin_id,
            request_id: &request.request_id,
            tool_name: request.tool_name.trim(),
            description: &description,
            input_preview: &input_preview,
            expires_at: &expires_at,
            route: relay.route.as_str(),
            chat_id: relay.chat_id,
            thread_id: relay.thread_id,
        };
        let (row, new) = self.inner.ledger.record_permission_request(&new).await?;
        if !new {
            tracing::info!(agent = %asker.agent, permission_id = %row.id, "a permission request asked again: not posted again");
            return Ok(receipt(&row));
        }
        tracing::info!(agent = %asker.agent, permission_id = %row.id, request_id = %row.request_id, tool = %row.tool_name, "permission request recorded; posting its prompt");
        self.ring_keeper();
        let relay = self.clone();
        let row = self
            .inner
            .tasks
            .spawn(async move { relay.post_prompt(row).await })
            .await
            .map_err(|e| LedgerError::other(format!("the prompt's send was cut short: {e}")))??;
        Ok(receipt(&row))
    }

    /// Records what a prompt's send came to, trying again while the ledger is busy or full
    /// for up to [`PROMPT_RECORD_PATIENCE`]: the prompt may be in the chat, and a row left
    /// `in_flight` is one the keeper never edits until a restart recovers it.
    async fn record_prompt_send(
        &self,
        id: &str,
        outcome: &AttemptOutcome,
    ) -> Result<StoredPermission, LedgerError> {
        let started = tokio::time::Instant::now();
        let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match self.inner.ledger.finish_prompt_send(id, outcome).await {
                Ok(row) => return Ok(row),
                Err(e) if started.elapsed() < PROMPT_RECORD_PATIENCE => {
                    tracing::error!(permission_id = id, error = %e, "could not record what a permission prompt's send came to; trying again");
                    tokio::time::sleep(retry.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Posts a recorded request's prompt and records what the send came to.
    async fn post_prompt(&self, row: StoredPermission) -> Result<StoredPermission, LedgerError> {
        let facts = prompt_facts(&row);
        let mut params = json!({
            "chat_id": row.chat_id,
            "text": rules::prompt_text(&facts),
            "parse_mode": "HTML",
            "reply_markup": rules::keyboard(&row.id),
        });
        if let Some(thread_id) = telegram_thread(row.thread_id) {
            params["message_thread_id"] = json!(thread_id);
        }
        let mut budget = PROMPT_RATE_LIMIT_BUDGET;
        let observed = loop {
            let exchange = self.call_paced(row.chat_id, "sendMessage", &params).await;
            let observed = classify(&exchange);
            if let Some(kind) = error_kind(&exchange, &observed) {
                metrics::bot_api_error("sendMessage", kind);
            }
            match observed {
                // A 429 proves nothing was posted: waiting and sending again is safe.
                Observed::NotSent { retry_after: Some(wait), .. } if wait <= budget => {
                    budget -= wait;
                    tracing::warn!(permission_id = %row.id, wait_secs = wait.as_secs(), "Telegram rate limit on a permission prompt: waiting");
                    tokio::time::sleep(wait).await;
                }
                observed => break observed,
            }
        };
        let outcome = match observed {
            Observed::Sent { message_id } => AttemptOutcome::Sent { message_id },
            Observed::NotSent { error, .. } => AttemptOutcome::NotSent { error },
            Observed::Unknown { error } => AttemptOutcome::Unknown { error },
        };
        let row = self.record_prompt_send(&row.id, &outcome).await?;
        // The request may have ended while its prompt was on its way (its session did):
        // the keeper edits it now that there is a message to edit.
        if row.state != PermissionState::Pending {
            self.ring_keeper();
        }
        match &outcome {
            AttemptOutcome::Sent { message_id } => {
                tracing::info!(permission_id = %row.id, message_id, chat_id = row.chat_id, "permission prompt posted")
            }
            AttemptOutcome::NotSent { error } => tracing::error!(
                permission_id = %row.id, chat_id = row.chat_id,
                "the permission prompt could not be posted ({error}): the request expired; it is answered at the terminal"
            ),
            AttemptOutcome::Unknown { error } => tracing::error!(
                permission_id = %row.id, chat_id = row.chat_id,
                "the permission prompt may or may not have been posted ({error}); it is not sent again"
            ),
        }
        Ok(row)
    }

    /// A press on a button. Returns the agent whose asking session now has a verdict to be
    /// handed, if the press recorded one.
    pub async fn press(&self, press: &CallbackPress) -> Option<AgentName> {
        if let Some(question) = press.data.as_deref().and_then(rules::parse_question_callback) {
            return self.question_press(press, &question).await;
        }
        let parsed = press.data.as_deref().and_then(rules::parse_callback);
        let row = match &parsed {
            Some(parsed) => match self.inner.ledger.permission(&parsed.permission_id).await {
                Ok(row) => row,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the permission request a press names");
                    self.answer_callback(&press.id, COULD_NOT_READ).await;
                    return None;
                }
            },
            None => None,
        };
        // A button of a prompt in another chat than the request's is not that request's.
        let row =
            row.filter(|row| press.message.as_ref().is_none_or(|message| message.chat.id == row.chat_id));
        let (Some(parsed), Some(row)) = (parsed, row) else {
            tracing::warn!(from = press.from.id, data = ?press.data, "a button press names no permission request: nothing changed");
            self.answer_callback(&press.id, Refusal::NoSuchRequest.explanation()).await;
            return None;
        };
        let decision = self.decide(&row, parsed.action, press.from.id);
        if let (None, Some(message)) = (row.prompt_message_id, &press.message)
            && row.prompt_send == AttemptState::Unknown
        {
            // The press proves the prompt was posted, and where: its final edit can be made.
            match self.inner.ledger.note_prompt_message(&row.id, message.message_id).await {
                Ok(()) => self.ring_keeper(),
                Err(e) => {
                    tracing::warn!(permission_id = %row.id, error = %e, "could not note where a prompt was posted")
                }
            }
        }
        match decision {
            PressDecision::Refuse(refusal) => {
                tracing::warn!(permission_id = %row.id, from = press.from.id, ?refusal, "a press on a permission prompt changed nothing");
                self.answer_callback(&press.id, refusal.explanation()).await;
                None
            }
            PressDecision::ShowMore => {
                self.answer_callback(&press.id, "").await;
                self.show_more(&row, press.message.as_ref().map(|m| m.message_id)).await;
                None
            }
            PressDecision::Record(verdict) => {
                let (text, wake) = match self.record(&row, verdict, press.from.id, &press.from.shown()).await
                {
                    Recording::Recorded(agent) if verdict == Verdict::Allow => ("Allowed.", agent),
                    Recording::Recorded(agent) => ("Denied.", agent),
                    Recording::TooLate => (Refusal::NoLongerPending.explanation(), None),
                    // The request is still pending: a press again may well record it.
                    Recording::Failed => (COULD_NOT_RECORD, None),
                };
                self.answer_callback(&press.id, text).await;
                wake
            }
        }
    }

    /// An approver's text answer (the poller has checked the chat and the approver).
    /// Returns the agent whose session has a verdict to be handed, if it recorded one.
    pub async fn text_answer(&self, answer: &TextAnswer) -> Option<AgentName> {
        let named =
            match self.inner.ledger.pending_permissions_named(&answer.request_id, answer.chat_id).await {
                Ok(named) => named,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the permission request a text answer names");
                    return None;
                }
            };
        let [row] = named.as_slice() else {
            tracing::warn!(
                request_id = %answer.request_id, from = answer.from, matching = named.len(),
                "a text answer names no single pending permission request in this chat: nothing changed"
            );
            return None;
        };
        match self.decide(row, PressAction::Answer(answer.verdict), answer.from) {
            PressDecision::Record(verdict) => {
                match self.record(row, verdict, answer.from, &answer.from_shown).await {
                    Recording::Recorded(agent) => agent,
                    Recording::TooLate | Recording::Failed => None,
                }
            }
            other => {
                tracing::warn!(permission_id = %row.id, from = answer.from, ?other, "a text answer changed nothing");
                None
            }
        }
    }

    fn decide(&self, row: &StoredPermission, action: PressAction, presser: i64) -> PressDecision {
        let agent = AgentName::parse(&row.agent).ok();
        let approvers = agent
            .as_ref()
            .and_then(|agent| self.inner.relays.get(agent))
            .map(|relay| relay.approvers.as_slice())
            .unwrap_or_default();
        let facts = RequestFacts {
            pending: row.state == PermissionState::Pending,
            past_expiry: row.expires_at <= Utc::now(),
        };
        rules::decide_press(action, PressFacts { request: Some(facts), presser, approvers })
    }

    /// Records a verdict, first one wins.
    async fn record(&self, row: &StoredPermission, verdict: Verdict, by: i64, by_shown: &str) -> Recording {
        match self.inner.ledger.answer_permission(&row.id, verdict, by, by_shown).await {
            Ok(AnswerRecorded::Recorded(row)) => {
                tracing::info!(permission_id = %row.id, agent = %row.agent, by, verdict = verdict.behavior(), "permission request answered");
                self.ring_keeper();
                Recording::Recorded(AgentName::parse(&row.agent).ok())
            }
            Ok(AnswerRecorded::TooLate(row)) => {
                tracing::warn!(permission_id = %row.id, state = %row.state, by, "a verdict came too late: nothing changed");
                Recording::TooLate
            }
            Ok(AnswerRecorded::Unknown) => Recording::TooLate,
            Err(e) => {
                tracing::error!(permission_id = %row.id, by, error = %e, "could not record a verdict: nothing changed, the request is still pending");
                Recording::Failed
            }
        }
    }

    /// More: the prompt shows the whole request, its buttons kept.
    async fn show_more(&self, row: &StoredPermission, pressed_on: Option<i32>) {
        let Some(message_id) = row.prompt_message_id.or(pressed_on) else { return };
        let params = json!({
            "chat_id": row.chat_id,
            "message_id": message_id,
            "text": rules::full_prompt_text(&prompt_facts(row)),
            "parse_mode": "HTML",
            "reply_markup": rules::keyboard(&row.id),
        });
        let exchange = self.call_paced(row.chat_id, "editMessageText", &params).await;
        if !matches!(classify(&exchange), Observed::Sent { .. }) {
            tracing::warn!(permission_id = %row.id, ?exchange, "could not show the whole permission request");
        }
        // A verdict (or expiry) may have come while this edit was on its way, and its final
        // edit reached Telegram first: this one brought the buttons back. The final edit is
        // made again, after this one; if it does not go through, the keeper makes it.
        let now = match self.inner.ledger.permission(&row.id).await {
            Ok(Some(now)) if now.state != PermissionState::Pending => now,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(permission_id = %row.id, error = %e, "could not read the request after showing more; the keeper may leave its buttons");
                return;
            }
        };
        if let Ok(true) = self.settle(&now).await {
            return;
        }
        match self.inner.ledger.unsettle_prompt(&now.id).await {
            Ok(()) => self.ring_keeper(),
            Err(e) => {
                tracing::warn!(permission_id = %now.id, error = %e, "could not have the keeper edit a decided prompt again")
            }
        }
    }

    async fn answer_callback(&self, query_id: &str, text: &str) {
        let mut params = json!({ "callback_query_id": query_id });
        if !text.is_empty() {
            params["text"] = json!(text);
        }
        // The spinner on the presser's button stops on its own after a while; an answer
        // that failed is only logged.
        match self.inner.api.call("answerCallbackQuery", &params).await {
            Exchange::Answered { status: 200, .. } => {}
            other => tracing::warn!(?other, "answerCallbackQuery failed"),
        }
    }

    /// Expires what is due and edits the finished prompts, until `shutdown`.
    pub async fn run_keeper(self, shutdown: CancellationToken) {
        let mut retry = Backoff::new(KEEPER_RETRY, KEEPER_RETRY_CAP);
        loop {
            let wait = match self.keep_once().await {
                Ok(left) => {
                    let retry_in = if left.edit_failed {
                        Some(retry.next_delay())
                    } else {
                        retry.reset();
                        None
                    };
                    keeper_wait(left, retry_in)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the permission keeper could not read or write the ledger; trying again");
                    Some(retry.next_delay())
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {}
                () = self.inner.keeper.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// One round of the keeper: returns what it left waiting on it.
    async fn keep_once(&self) -> Result<Outstanding, LedgerError> {
        let ledger = &self.inner.ledger;
        let questions = self.keep_questions().await?;
        // One clock for what is due now and for when to look next.
        let now = Utc::now();
        for row in ledger.expire_due_permissions(now).await? {
            tracing::info!(permission_id = %row.id, agent = %row.agent, "permission request expired unanswered");
        }
        let mut edit_failed = questions.edit_failed;
        for row in ledger.unsettled_prompts().await? {
            match self.settle(&row).await {
                Ok(true) => ledger.settle_prompt(&row.id).await?,
                Ok(false) => edit_failed = true,
                Err(e) => return Err(e),
            }
        }
        let next_expiry =
            ledger.next_permission_expiry().await?.map(|at| (at - now).to_std().unwrap_or(Duration::ZERO));
        Ok(Outstanding { edit_failed, next_expiry, operator_asks: questions.asked })
    }

    /// Edits a finished prompt to its outcome, without buttons. True once it shows it (or
    /// has nothing to show it on, or Telegram refused the edit for good); false when the
    /// edit's outcome is unknown, to be made again.
    async fn settle(&self, row: &StoredPermission) -> Result<bool, LedgerError> {
        let Some(message_id) = row.prompt_message_id else { return Ok(true) };
        let end = match (row.state, &row.answered_by_name, &row.answered_at) {
            (PermissionState::Allowed, Some(by), Some(at)) => {
                PromptEnd::Answered { verdict: Verdict::Allow, by, at: *at }
            }
            (PermissionState::Denied, Some(by), Some(at)) => {
                PromptEnd::Answered { verdict: Verdict::Deny, by, at: *at }
            }
            _ => PromptEnd::Expired,
        };
        let text = rules::final_prompt_text(&prompt_facts(row), end);
        Ok(self.edit_to_final(row.chat_id, message_id, &text, &row.id).await)
    }
}

/// What a keeper's round left waiting on it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Outstanding {
    /// An edit of a finished prompt or question came to an unknown outcome: made again.
    edit_failed: bool,
    /// Until the earliest pending request expires.
    next_expiry: Option<Duration>,
    /// `[operator]` is configured: unresolved sends are asked about, and another process
    /// (`switchboard ledger reconcile`) may answer a question.
    operator_asks: bool,
}

/// What [`PermissionRelay::keep_questions`] left for the keeper.
#[derive(Debug, Clone, Copy, Default)]
struct QuestionsLeft {
    /// `[operator]` is configured.
    asked: bool,
    edit_failed: bool,
}

/// How long the keeper may sleep after a round, `None` for until rung: without a pending
/// request or `[operator]`, only a new request or a verdict can give it work, and each
/// rings it.
/// `retry_in`: the backoff's wait when an edit failed this round.
fn keeper_wait(left: Outstanding, retry_in: Option<Duration>) -> Option<Duration> {
    let safety_net = (left.operator_asks || left.next_expiry.is_some()).then_some(KEEPER_MAX_SLEEP);
    let retry = retry_in.filter(|_| left.edit_failed);
    // The safety net does not cut a retry's backoff short: it is for what the keeper does
    // not expect, and an edit that keeps failing is expected to.
    let safety_net = if left.edit_failed { None } else { safety_net };
    [safety_net, retry, left.next_expiry].into_iter().flatten().min()
}

/// The operator's questions (issue 23): every unresolved send is asked once in the
/// `[operator]` route's chat, and an operator's answer reconciles it as the CLI does.
impl PermissionRelay {
    /// Asks about the unresolved sends not asked about yet, settles questions whose
    /// envelope was reconciled another way, and edits answered ones; returns what is left
    /// for the keeper as far as questions go.
    async fn keep_questions(&self) -> Result<QuestionsLeft, LedgerError> {
        let Some(operator) = &self.inner.operator else { return Ok(QuestionsLeft::default()) };
        let ledger = &self.inner.ledger;
        let new_id = || format!("{QUESTION_ID_PREFIX}{}", random_suffix(PERMISSION_ID_SUFFIX_LEN));
        // A question Telegram did not take (out of reach, refused) is asked again, on the
        // keeper's backoff, before the new ones: an outage must not leave an unresolved
        // send unasked for good.
        let mut edit_failed = false;
        for question in ledger.take_unsent_questions().await? {
            edit_failed |= !self.post_question(&question).await?;
        }
        for question in ledger.record_new_questions(operator.chat_id, operator.thread_id, &new_id).await? {
            edit_failed |= !self.post_question(&question).await?;
        }
        ledger.settle_answered_elsewhere().await?;
        for question in ledger.unsettled_questions().await? {
            let Some(message_id) = question.prompt_message_id else {
                ledger.settle_question_prompt(&question.id).await?;
                continue;
            };
            let found = match (question.state, &question.answered_by_name, &question.answered_at) {
                (QuestionState::Delivered, Some(by), Some(at)) => {
                    Some((Finding::Delivered, by.as_str(), *at))
                }
                (QuestionState::NotDelivered, Some(by), Some(at)) => {
                    Some((Finding::NotDelivered, by.as_str(), *at))
                }
                _ => None,
            };
            let text = rules::final_question_text(&question_facts(&question), found);
            if self.edit_to_final(question.chat_id, message_id, &text, &question.id).await {
                ledger.settle_question_prompt(&question.id).await?;
            } else {
                edit_failed = true;
            }
        }
        Ok(QuestionsLeft { asked: true, edit_failed })
    }

    /// Posts a question and records what its send came to; `false` when Telegram provably
    /// did not take it (then it is asked again later). One that may have arrived is never
    /// sent again.
    async fn post_question(&self, question: &StoredQuestion) -> Result<bool, LedgerError> {
        let mut params = json!({
            "chat_id": question.chat_id,
            "text": rules::question_text(&question_facts(question)),
            "parse_mode": "HTML",
            "reply_markup": rules::question_keyboard(&question.id),
        });
        if let Some(thread_id) = telegram_thread(question.thread_id) {
            params["message_thread_id"] = json!(thread_id);
        }
        let exchange = self.call_paced(question.chat_id, "sendMessage", &params).await;
        let observed = classify(&exchange);
        if let Some(kind) = error_kind(&exchange, &observed) {
            metrics::bot_api_error("sendMessage", kind);
        }
        let outcome = match observed {
            Observed::Sent { message_id } => AttemptOutcome::Sent { message_id },
            Observed::NotSent { error, .. } => AttemptOutcome::NotSent { error },
            Observed::Unknown { error } => AttemptOutcome::Unknown { error },
        };
        self.inner.ledger.finish_question_send(&question.id, &outcome).await?;
        match &outcome {
            AttemptOutcome::Sent { .. } => {
                tracing::info!(question = %question.id, trace_id = %question.trace_id, "asked the operators about an unresolved send")
            }
            AttemptOutcome::NotSent { error } => tracing::warn!(
                question = %question.id, trace_id = %question.trace_id,
                "could not ask the operators about an unresolved send ({error}); asking again later, or reconcile it with `switchboard ledger reconcile`"
            ),
            AttemptOutcome::Unknown { error } => tracing::warn!(
                question = %question.id, trace_id = %question.trace_id,
                "could not ask the operators about an unresolved send ({error}); reconcile it with `switchboard ledger reconcile`"
            ),
        }
        Ok(!matches!(outcome, AttemptOutcome::NotSent { .. }))
    }

    async fn question_press(
        &self,
        press: &CallbackPress,
        parsed: &rules::QuestionPress,
    ) -> Option<AgentName> {
        let question = match self.inner.ledger.question(&parsed.question_id).await {
            Ok(question) => question,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the question a press names");
                self.answer_callback(&press.id, COULD_NOT_READ).await;
                return None;
            }
        };
        let question =
            question.filter(|q| press.message.as_ref().is_none_or(|message| message.chat.id == q.chat_id));
        let operators = self.inner.operator.as_ref().map(|o| o.operators.as_slice()).unwrap_or_default();
        let open = question.as_ref().map(|q| q.state == QuestionState::Open);
        if let Err(refusal) = rules::decide_question(press.from.id, operators, open) {
            tracing::warn!(
                from = press.from.id,
                ?refusal,
                "a press on an operator's question changed nothing"
            );
            self.answer_callback(&press.id, refusal.explanation()).await;
            return None;
        }
        let question = question?;
        let finding = match parsed.finding {
            Finding::Delivered => Reconciliation::Delivered,
            Finding::NotDelivered => Reconciliation::NotDelivered,
        };
        let mut back_to = None;
        let text = match self
            .inner
            .ledger
            .answer_question(&question, finding, press.from.id, &press.from.shown())
            .await
        {
            Ok(QuestionAnswered::Reconciled) => {
                tracing::info!(question = %question.id, trace_id = %question.trace_id, by = press.from.id, ?finding, "an operator reconciled an unresolved send");
                self.ring_keeper();
                back_to = self.agent_of(&question.trace_id).await;
                "Recorded."
            }
            Ok(QuestionAnswered::TooLate) => Refusal::NoLongerPending.explanation(),
            Err(e) => {
                tracing::error!(question = %question.id, error = %e, "could not record an operator's answer");
                COULD_NOT_RECORD
            }
        };
        self.answer_callback(&press.id, text).await;
        back_to
    }

    /// The agent of an envelope a finding sent back to work (queued for its session), to
    /// be woken so that its session is handed it now rather than at its next heartbeat.
    async fn agent_of(&self, trace_id: &crate::ids::TraceId) -> Option<AgentName> {
        let envelope = self.inner.ledger.find(trace_id).await.ok().flatten()?;
        if envelope.state != crate::ledger::EnvelopeState::Queued {
            return None;
        }
        AgentName::parse(envelope.agent.as_deref()?).ok()
    }

    /// Edits a prompt to its final text, without buttons: true once it shows it (or
    /// Telegram refused the edit for good), false to try again.
    async fn edit_to_final(&self, chat_id: i64, message_id: i32, text: &str, id: &str) -> bool {
        let params =
            json!({ "chat_id": chat_id, "message_id": message_id, "text": text, "parse_mode": "HTML" });
        let exchange = self.call_paced(chat_id, "editMessageText", &params).await;
        match classify(&exchange) {
            Observed::Sent { .. } => true,
            Observed::NotSent { retry_after: Some(_), .. } => false,
            Observed::NotSent { error, .. } if error.contains("message is not modified") => true,
            Observed::NotSent { .. } if matches!(exchange, Exchange::NotConnected(_)) => {
                tracing::debug!(id, "no connection to Telegram to edit a prompt; trying again later");
                false
            }
            Observed::NotSent { error, .. } => {
                tracing::warn!(id, "Telegram refused to edit a prompt ({error}); leaving it");
                true
            }
            Observed::Unknown { error } => {
                tracing::warn!(id, "a prompt's edit may not have happened ({error}); trying again");
                false
            }
        }
    }
}

fn question_facts(question: &StoredQuestion) -> QuestionFacts<'_> {
    QuestionFacts {
        trace_id: &question.trace_id,
        chat_id: question.sent_chat_id,
        sent_at: question.sent_at,
        text: &question.sent_text,
    }
}

fn prompt_facts(row: &StoredPermission) -> PromptFacts<'_> {
    PromptFacts {
        agent: &row.agent,
        request_id: &row.request_id,
        tool_name: &row.tool_name,
        description: &row.description,
        input_preview: &row.input_preview,
    }
}

fn receipt(row: &StoredPermission) -> PermissionReceipt {
    PermissionReceipt {
        permission_id: row.id.clone(),
        state: row.state.as_str().to_owned(),
        prompt: row.prompt_send.as_str().to_owned(),
        detail: row.prompt_error.clone(),
    }
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_STORED_FIELD_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_nothing_outstanding_the_keeper_sleeps_until_rung() {
        assert_eq!(keeper_wait(Outstanding::default(), None), None);
        let operator = Outstanding { operator_asks: true, ..Outstanding::default() };
        assert_eq!(keeper_wait(operator, None), Some(KEEPER_MAX_SLEEP), "unresolved sends are looked for");
        let soon = Duration::from_secs(7);
        let pending = Outstanding { next_expiry: Some(soon), ..Outstanding::default() };
        assert_eq!(keeper_wait(pending, None), Some(soon), "a request expires on time");
        let later = Outstanding { next_expiry: Some(Duration::from_secs(3600)), ..Outstanding::default() };
        assert_eq!(keeper_wait(later, None), Some(KEEPER_MAX_SLEEP), "a clock that jumps is noticed");
        let failed = Outstanding { edit_failed: true, ..Outstanding::default() };
        assert_eq!(
            keeper_wait(failed, Some(KEEPER_RETRY)),
            Some(KEEPER_RETRY),
            "an unknown edit is made again"
        );
    }

    /// Telegram out of reach for an hour: the keeper's tries (and their log lines) thin out
    /// to one every five minutes instead of one every five seconds.
    #[test]
    fn an_edit_that_keeps_failing_is_tried_less_and_less_often() {
        let failed = Outstanding { edit_failed: true, operator_asks: true, ..Outstanding::default() };
        // Rounds that fail one after another, as `run_keeper` counts them.
        let rounds = |n: usize| {
            let mut retry = Backoff::new(KEEPER_RETRY, KEEPER_RETRY_CAP);
            (0..n).map(move |_| keeper_wait(failed, Some(retry.next_delay())).unwrap()).collect::<Vec<_>>()
        };
        let waits = rounds(10);
        assert!(waits.windows(2).all(|pair| pair[0] <= pair[1]), "{waits:?}");
        assert_eq!(waits[1], KEEPER_RETRY * 2);
        assert_eq!(*waits.last().unwrap(), KEEPER_RETRY_CAP);
        let hour: Duration = rounds(20).into_iter().sum();
        assert!(hour > Duration::from_secs(3600), "20 tries take more than an hour: {hour:?}");
        // A request still expires on time meanwhile.
        let expiring = Outstanding { next_expiry: Some(Duration::from_secs(9)), ..failed };
        assert_eq!(keeper_wait(expiring, Some(waits[7])), Some(Duration::from_secs(9)));
    }

    fn chats() -> Vec<AnswerChat> {
        vec![AnswerChat { chat_id: 42, thread_id: Some(5), approvers: vec![7] }]
    }

    #[test]
    fn a_text_answer_is_an_approvers_yes_or_no_in_the_relays_chat_and_topic() {
        let answer = Some((Verdict::Allow, "abcde".to_owned()));
        assert_eq!(text_answer(&chats(), 42, Some(5), 7, Some("YES abcde")), answer);
        assert_eq!(text_answer(&chats(), 42, Some(5), 8, Some("yes abcde")), None, "not an approver");
        assert_eq!(text_answer(&chats(), 42, Some(6), 7, Some("yes abcde")), None, "another topic");
        assert_eq!(text_answer(&chats(), 43, Some(5), 7, Some("yes abcde")), None, "another chat");
        assert_eq!(text_answer(&chats(), 42, Some(5), 7, Some("yes, do it")), None, "not an answer");
        assert_eq!(text_answer(&chats(), 42, Some(5), 7, None), None);
    }

    #[test]
    fn only_callback_queries_are_read_as_presses() {
        let press = callback_press(
            r#"{"update_id":5,"callback_query":{"id":"q1","from":{"id":7,"is_bot":false,"first_name":"Ann"},
                "data":"sbp:prm_x:a","message":{"message_id":9,"chat":{"id":42,"type":"private"},"date":0}}}"#,
        )
        .unwrap();
        assert_eq!((press.id.as_str(), press.from.id, press.data.as_deref()), ("q1", 7, Some("sbp:prm_x:a")));
        assert_eq!(press.message.map(|m| (m.message_id, m.chat.id)), Some((9, 42)));
        assert!(callback_press(r#"{"update_id":6,"message":{"text":"\"callback_query\""}}"#).is_none());
    }
}
