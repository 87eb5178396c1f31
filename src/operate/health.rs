//! Readiness (DESIGN.md §12): is this daemon doing its job right now? These facts decide
//! it, each from where it is known:
//!
//! - the ledger takes a write (probed when asked, see `Lifecycle::probe_write`);
//! - when polling, the last successful `getUpdates` is recent: no older than twice the poll
//!   timeout plus a margin, since a healthy long poll answers at least once per poll timeout;
//! - when polling, Telegram is not refusing the poller: a 401 (token revoked or wrong) or a
//!   409 (another poller on the token, or a webhook) lasts until a `getUpdates` succeeds again;
//! - in webhook mode, Telegram has accepted the webhook (`setWebhook`) and the listener is
//!   up: it is bound before the daemon reports itself running, and a listener that fails
//!   stops the daemon, so `setWebhook` is the fact left to wait for;
//!
//! - intake, attempts and checkpoints write: the probe is one page, which still fits on a
//!   disk too full for a batch, so a failed write of the daemon's own makes it not ready
//!   (`ledger_full`, `intake_failing`, …) until that kind of write succeeds again.
//!
//! The poller publishes its side through [`PollHealth`], the webhook its through
//! [`WebhookHealth`], the ledger its writes through its `WriteWatch`; [`assess`] and
//! [`assess_writes`] are the pure decision.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::ledger::Ledger;
use crate::ledger::{LedgerWrite, WriteFailing, WriteProblem, WriteWatch};
use crate::operate::metrics;
use crate::telegram::updates::FetchError;

/// Beyond two poll timeouts, a poll may take this much longer before it counts as stale:
/// the HTTP client's own allowance over the long poll (see `app`), so one slow answer is
/// not an outage.
pub const STALE_MARGIN: Duration = Duration::from_secs(10);

/// Why Telegram will not serve this poller, until a `getUpdates` succeeds again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TelegramRefusal {
    /// 401: the token was revoked or is wrong.
    Unauthorized,
    /// 409: another process polls this token.
    Conflict,
    /// 409: a webhook is set.
    WebhookActive,
}

/// What the poller has seen, shared with the health routes.
#[derive(Debug, Clone)]
pub struct PollHealth {
    inner: Arc<Mutex<PollState>>,
}

#[derive(Debug)]
struct PollState {
    /// When the poller was made: before its first success, staleness counts from here.
    started: Instant,
    last_success: Option<Instant>,
    refusal: Option<(TelegramRefusal, Instant)>,
}

impl Default for PollHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl PollHealth {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(PollState {
                started: Instant::now(),
                last_success: None,
                refusal: None,
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, PollState> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A `getUpdates` call succeeded: Telegram serves this poller.
    pub fn succeeded(&self) {
        let mut state = self.state();
        state.last_success = Some(Instant::now());
        state.refusal = None;
    }

    /// A `getUpdates` call failed; counted by kind, and remembered when it is a refusal.
    pub fn failed(&self, error: &FetchError) {
        metrics::bot_api_error("getUpdates", fetch_error_kind(error));
        if let FetchError::RetryAfter(wait) = error {
            metrics::rate_limit_wait("getUpdates", *wait);
        }
        let refusal = match error {
            FetchError::Unauthorized { .. } => TelegramRefusal::Unauthorized,
            FetchError::Conflict => TelegramRefusal::Conflict,
            FetchError::WebhookActive => TelegramRefusal::WebhookActive,
            _ => return,
        };
        let mut state = self.state();
        let since = match state.refusal {
            Some((same, since)) if same == refusal => since,
            _ => Instant::now(),
        };
        state.refusal = Some((refusal, since));
    }

    /// The poller's side of readiness, as of `now`.
    pub fn facts(&self, now: Instant) -> PollFacts {
        let state = self.state();
        PollFacts {
            since_success: now.saturating_duration_since(state.last_success.unwrap_or(state.started)),
            ever_succeeded: state.last_success.is_some(),
            refusal: state.refusal.map(|(refusal, since)| (refusal, now.saturating_duration_since(since))),
        }
    }
}

/// What the webhook has seen, shared with the health routes.
#[derive(Debug, Clone, Default)]
pub struct WebhookHealth {
    inner: Arc<Mutex<WebhookState>>,
}

#[derive(Debug, Default)]
struct WebhookState {
    /// `setWebhook` succeeded: Telegram delivers to this daemon's public URL.
    registered: bool,
    /// Why the last `setWebhook` failed, while none has succeeded.
    refused: Option<String>,
    /// Since when Telegram has refused the bot token (401), while it does.
    token_refused_since: Option<Instant>,
}

impl WebhookHealth {
    fn state(&self) -> MutexGuard<'_, WebhookState> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Telegram accepted the webhook (set it, or said it is still set).
    pub fn registered(&self) {
        let mut state = self.state();
        state.registered = true;
        state.refused = None;
        state.token_refused_since = None;
    }

    /// A `setWebhook` failed, or the webhook is no longer set to this daemon, for this
    /// reason (no secrets, no content).
    pub fn refused(&self, why: String) {
        let mut state = self.state();
        state.registered = false;
        state.refused = Some(why);
    }

    /// Telegram refused the bot token (401): no update arrives and nothing can be sent.
    pub fn token_refused(&self) {
        self.state().token_refused_since.get_or_insert_with(Instant::now);
    }

    pub fn facts(&self, now: Instant) -> WebhookFacts {
        let state = self.state();
        WebhookFacts {
            registered: state.registered,
            refused: state.refused.clone(),
            token_refused_for: state.token_refused_since.map(|since| now.saturating_duration_since(since)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookFacts {
    pub registered: bool,
    /// Why the webhook is not set to this daemon, while it is not.
    pub refused: Option<String>,
    /// How long Telegram has refused the bot token, while it does.
    pub token_refused_for: Option<Duration>,
}

/// How updates reach this daemon, and what that way of intake has seen.
#[derive(Debug, Clone)]
pub enum IntakeHealth {
    Polling(PollHealth),
    Webhook(WebhookHealth),
}

impl IntakeHealth {
    pub fn facts(&self, now: Instant) -> IntakeFacts {
        match self {
            Self::Polling(poll) => IntakeFacts::Polling(poll.facts(now)),
            Self::Webhook(webhook) => IntakeFacts::Webhook(webhook.facts(now)),
        }
    }
}

/// Intake's side of readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntakeFacts {
    Polling(PollFacts),
    Webhook(WebhookFacts),
}

/// How updates reach the daemon, as `/readyz` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IntakeMode {
    /// `getUpdates`, the default.
    #[default]
    Polling,
    /// Telegram pushes updates to `telegram.webhook`.
    Webhook,
}

/// The metric label of a `getUpdates` failure.
pub fn fetch_error_kind(error: &FetchError) -> &'static str {
    match error {
        FetchError::Unauthorized { .. } => "unauthorized",
        FetchError::Conflict => "conflict",
        FetchError::WebhookActive => "webhook_active",
        FetchError::RetryAfter(_) => "rate_limited",
        FetchError::MigrateToChatId(_) => "migrated",
        FetchError::Server { .. } => "server",
        FetchError::Api { .. } => "refused",
        FetchError::Network(_) => "network",
        FetchError::Malformed { .. } => "malformed",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollFacts {
    /// Since the last successful `getUpdates` (or since start, before the first).
    pub since_success: Duration,
    pub ever_succeeded: bool,
    /// A refusal that lasts, and for how long.
    pub refusal: Option<(TelegramRefusal, Duration)>,
}

/// One reason not to be ready. `code` is stable, for machines; `detail` is for people and
/// never holds message content or secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotReady {
    pub code: String,
    pub detail: String,
}

/// The body of `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    pub reasons: Vec<NotReady>,
    /// How updates reach the daemon.
    #[serde(default)]
    pub intake: IntakeMode,
    /// Seconds since the last successful `getUpdates`; none before the first, and none in
    /// webhook mode.
    pub last_poll_success_secs: Option<u64>,
    /// On PostgreSQL: this replica, and whether it still leads the bot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<ReplicaReadiness>,
    /// The agents whose session this process holds now, by name: with replicas, where
    /// each agent is served (none at a standby).
    #[serde(default)]
    pub sessions: Vec<String>,
}

/// A replica's part of `/readyz`. `leads` is false while a replica that lost its lease
/// stops, and at a standby's `api.health_listen`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReadiness {
    pub name: String,
    pub leads: bool,
    /// The term it was elected for; none for a standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<i64>,
}

/// What a replica on PostgreSQL knows of its leadership, shared with the health routes.
#[derive(Debug, Clone)]
pub struct Leading {
    pub replica: String,
    pub term: i64,
    /// Cleared when its tenure ends.
    pub leads: Arc<std::sync::atomic::AtomicBool>,
}

impl Leading {
    fn readiness(&self) -> (ReplicaReadiness, Option<NotReady>) {
        let leads = self.leads.load(std::sync::atomic::Ordering::Acquire);
        let status = ReplicaReadiness { name: self.replica.clone(), leads, term: Some(self.term) };
        let reason = (!leads).then(|| NotReady {
            code: "not_leading".into(),
            detail: format!(
                "replica {} no longer leads the bot (term {} is over): it is stopping, and another replica serves",
                self.replica, self.term
            ),
        });
        (status, reason)
    }
}

/// `/readyz`'s reason at a replica that stands by.
pub const STANDING_BY_CODE: &str = "standing_by";

/// `/readyz` of a process that does not run the daemon yet (`api.health_listen`): a replica
/// standing by while another leads (`replica`), or a daemon still starting (recovering its
/// ledger, binding its listeners).
pub fn not_running_yet(replica: Option<&str>, intake: IntakeMode) -> Readiness {
    let reason = match replica {
        Some(name) => NotReady {
            code: STANDING_BY_CODE.into(),
            detail: format!(
                "replica {name} stands by: another replica leads this bot and serves its agents (its /readyz \
                 names it); this one is elected once that one stops leading"
            ),
        },
        None => NotReady {
            code: "starting".into(),
            detail: "the daemon is starting: it recovers its ledger, then binds its listeners".into(),
        },
    };
    Readiness {
        ready: false,
        reasons: vec![reason],
        intake,
        last_poll_success_secs: None,
        replica: replica.map(|name| ReplicaReadiness { name: name.to_owned(), leads: false, term: None }),
        sessions: Vec::new(),
    }
}

/// The reasons the daemon's own failing writes give: one `ledger_full` for every kind
/// that fails on a full disk (it is one disk), and `<kind>_failing` for each kind that
/// fails otherwise. Each says what cannot be recorded and for how long.
pub fn assess_writes(failing: &[WriteFailing]) -> Vec<NotReady> {
    let mut reasons = Vec::new();
    let full: Vec<&WriteFailing> = failing.iter().filter(|f| f.problem == WriteProblem::DiskFull).collect();
    if let Some(longest) = full.iter().map(|f| f.lasting).max() {
        let kinds: Vec<&str> = full.iter().map(|f| what_cannot_be_written(f.write)).collect();
        reasons.push(NotReady {
            code: "ledger_full".into(),
            detail: format!(
                "the disk holding the ledger is full: {} failed for {}s; free space (nothing is lost: Telegram \
                 keeps the updates until they are recorded)",
                kinds.join(", "),
                longest.as_secs()
            ),
        });
    }
    for failure in failing.iter().filter(|f| f.problem != WriteProblem::DiskFull) {
        let code = match failure.write {
            LedgerWrite::Intake => "intake_failing",
            LedgerWrite::Attempt => "attempts_failing",
            LedgerWrite::Checkpoint => "checkpoints_failing",
        };
        let why = match failure.problem {
            WriteProblem::Busy => "the ledger is locked by another connection".to_owned(),
            WriteProblem::DiskFull | WriteProblem::Other => failure.error.clone(),
        };
        reasons.push(NotReady {
            code: code.into(),
            detail: format!(
                "{} failed for {}s: {why}",
                what_cannot_be_written(failure.write),
                failure.lasting.as_secs()
            ),
        });
    }
    reasons
}

fn what_cannot_be_written(write: LedgerWrite) -> &'static str {
    match write {
        LedgerWrite::Intake => "recording incoming messages",
        LedgerWrite::Attempt => "recording send attempts",
        LedgerWrite::Checkpoint => "checkpointing the write-ahead log",
    }
}

/// The decision, from the facts.
pub fn assess(
    ledger: Result<(), String>,
    writes: &[WriteFailing],
    intake: IntakeFacts,
    poll_timeout: Duration,
) -> Readiness {
    let mut reasons = Vec::new();
    if let Err(problem) = ledger {
        reasons.push(NotReady { code: "ledger_not_writable".into(), detail: problem });
    }
    reasons.extend(assess_writes(writes));
    match intake {
        IntakeFacts::Polling(poll) => {
            reasons.extend(assess_polling(poll, poll_timeout));
            Readiness {
                ready: reasons.is_empty(),
                reasons,
                intake: IntakeMode::Polling,
                last_poll_success_secs: poll.ever_succeeded.then_some(poll.since_success.as_secs()),
                replica: None,
                sessions: Vec::new(),
            }
        }
        IntakeFacts::Webhook(webhook) => {
            reasons.extend(webhook.token_refused_for.map(token_refused));
            if !webhook.registered {
                let why = webhook.refused.unwrap_or_else(|| "no answer yet".to_owned());
                reasons.push(NotReady {
                    code: "webhook_not_set".into(),
                    detail: format!(
                        "Telegram has not accepted the webhook (setWebhook to telegram.webhook.public_url): {why}; \
                         retrying"
                    ),
                });
            }
            Readiness {
                ready: reasons.is_empty(),
                reasons,
                intake: IntakeMode::Webhook,
                last_poll_success_secs: None,
                replica: None,
                sessions: Vec::new(),
            }
        }
    }
}

/// Telegram refuses the bot token, polled or not.
fn token_refused(lasting: Duration) -> NotReady {
    NotReady {
        code: "telegram_unauthorized".into(),
        detail: format!(
            "Telegram has refused the bot token (401) for {}s: it was revoked or is wrong; check the variable \
             telegram.token_env names",
            lasting.as_secs()
        ),
    }
}

/// The poller's reasons: a lasting refusal, a poll gone stale.
fn assess_polling(poll: PollFacts, poll_timeout: Duration) -> Vec<NotReady> {
    let mut reasons = Vec::new();
    if let Some((refusal, lasting)) = poll.refusal {
        let secs = lasting.as_secs();
        let (code, detail) = match refusal {
            TelegramRefusal::Unauthorized => {
                let NotReady { code, detail } = token_refused(lasting);
                (code, detail)
            }
            TelegramRefusal::Conflict => (
                "telegram_conflict".to_owned(),
                format!(
                    "Telegram answers 409 Conflict for {secs}s: another process polls this bot token; stop it"
                ),
            ),
            TelegramRefusal::WebhookActive => (
                "telegram_webhook_active".to_owned(),
                format!(
                    "Telegram answers 409 for {secs}s because a webhook is set for this bot; remove it \
                     (deleteWebhook) so switchboard can poll"
                ),
            ),
        };
        reasons.push(NotReady { code, detail });
    }
    let stale_after = poll_timeout * 2 + STALE_MARGIN;
    if poll.since_success > stale_after {
        let since = poll.since_success.as_secs();
        let detail = if poll.ever_succeeded {
            format!("the last successful getUpdates was {since}s ago (more than {}s)", stale_after.as_secs())
        } else {
            format!(
                "no getUpdates has succeeded in the {since}s since start (allowed: {}s)",
                stale_after.as_secs()
            )
        };
        reasons.push(NotReady { code: "polling_stale".into(), detail });
    }
    reasons
}

/// Everything the health routes need: the poller's facts, the ledger (probed) and the poll
/// timeout the staleness limit derives from.
#[derive(Debug, Clone)]
pub struct Health {
    /// The poller's or the webhook's side.
    pub intake: IntakeHealth,
    ledger: Ledger,
    /// The ledger's own writes: intake, attempts, checkpoints.
    writes: Arc<WriteWatch>,
    poll_timeout: Duration,
    /// On PostgreSQL, this replica's leadership.
    leading: Option<Leading>,
}

impl Health {
    pub fn new(intake: IntakeHealth, ledger: Ledger, poll_timeout: Duration) -> Self {
        let writes = ledger.write_watch();
        Self { intake, ledger, writes, poll_timeout, leading: None }
    }

    /// For a replica on PostgreSQL: `/readyz` says which it is and whether it still leads.
    pub fn with_leading(mut self, leading: Leading) -> Self {
        self.leading = Some(leading);
        self
    }

    /// Probes the ledger and assesses readiness now.
    pub async fn readiness(&self) -> Readiness {
        let ledger = self.ledger.probe_write().await;
        let mut readiness =
            assess(ledger, &self.writes.failing(), self.intake.facts(Instant::now()), self.poll_timeout);
        if let Some(leading) = &self.leading {
            let (status, not_leading) = leading.readiness();
            readiness.replica = Some(status);
            if let Some(reason) = not_leading {
                readiness.reasons.push(reason);
                readiness.ready = false;
            }
        }
        readiness
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL_TIMEOUT: Duration = Duration::from_secs(10);

    fn poll(since_success: u64, refusal: Option<TelegramRefusal>) -> PollFacts {
        PollFacts {
            since_success: Duration::from_secs(since_success),
            ever_succeeded: true,
            refusal: refusal.map(|r| (r, Duration::from_secs(3))),
        }
    }

    fn facts(since_success: u64, refusal: Option<TelegramRefusal>) -> IntakeFacts {
        IntakeFacts::Polling(poll(since_success, refusal))
    }

    fn codes(readiness: &Readiness) -> Vec<&str> {
        readiness.reasons.iter().map(|r| r.code.as_str()).collect()
    }

    #[test]
    fn a_writable_ledger_and_a_recent_poll_are_ready() {
        let readiness = assess(Ok(()), &[], facts(5, None), POLL_TIMEOUT);
        assert!(readiness.ready);
        assert_eq!(readiness.last_poll_success_secs, Some(5));
    }

    #[test]
    fn each_cause_is_named_and_they_add_up() {
        assert_eq!(
            codes(&assess(Err("read-only".into()), &[], facts(1, None), POLL_TIMEOUT)),
            ["ledger_not_writable"]
        );
        assert_eq!(
            codes(&assess(Ok(()), &[], facts(1, Some(TelegramRefusal::Unauthorized)), POLL_TIMEOUT)),
            ["telegram_unauthorized"]
        );
        assert_eq!(
            codes(&assess(Ok(()), &[], facts(1, Some(TelegramRefusal::Conflict)), POLL_TIMEOUT)),
            ["telegram_conflict"]
        );
        assert_eq!(
            codes(&assess(Ok(()), &[], facts(1, Some(TelegramRefusal::WebhookActive)), POLL_TIMEOUT)),
            ["telegram_webhook_active"]
        );
        let all =
            assess(Err("full".into()), &[], facts(60, Some(TelegramRefusal::Unauthorized)), POLL_TIMEOUT);
        assert!(!all.ready);
        assert_eq!(codes(&all), ["ledger_not_writable", "telegram_unauthorized", "polling_stale"]);
    }

    fn failing(write: LedgerWrite, problem: WriteProblem, secs: u64) -> WriteFailing {
        WriteFailing {
            write,
            problem,
            lasting: Duration::from_secs(secs),
            error: "database or disk is full".into(),
        }
    }

    #[test]
    fn failing_writes_make_the_daemon_not_ready_with_what_and_how_long() {
        // The one-page probe passes on a disk too full for a batch: the writes decide.
        let full = [
            failing(LedgerWrite::Intake, WriteProblem::DiskFull, 12),
            failing(LedgerWrite::Checkpoint, WriteProblem::DiskFull, 3),
        ];
        let readiness = assess(Ok(()), &full, facts(1, None), POLL_TIMEOUT);
        assert!(!readiness.ready);
        assert_eq!(codes(&readiness), ["ledger_full"], "one disk, one reason");
        let detail = &readiness.reasons[0].detail;
        assert!(detail.contains("incoming messages") && detail.contains("checkpointing"), "{detail}");
        assert!(detail.contains("12s"), "the longest: {detail}");

        let busy = [
            failing(LedgerWrite::Intake, WriteProblem::Busy, 5),
            failing(LedgerWrite::Attempt, WriteProblem::Other, 1),
        ];
        let readiness = assess(Ok(()), &busy, facts(1, None), POLL_TIMEOUT);
        assert_eq!(codes(&readiness), ["intake_failing", "attempts_failing"]);
        assert!(readiness.reasons[0].detail.contains("locked"), "{:?}", readiness.reasons);
        assert!(assess_writes(&[]).is_empty());
    }

    #[test]
    fn a_poll_is_stale_past_two_timeouts_and_the_margin() {
        // 2 × 10 s + 10 s.
        assert!(assess(Ok(()), &[], facts(30, None), POLL_TIMEOUT).ready);
        let stale = assess(Ok(()), &[], facts(31, None), POLL_TIMEOUT);
        assert_eq!(codes(&stale), ["polling_stale"]);
        assert!(stale.reasons[0].detail.contains("31s ago"), "{:?}", stale.reasons);
        let never = PollFacts { ever_succeeded: false, ..poll(31, None) };
        let stale = assess(Ok(()), &[], IntakeFacts::Polling(never), POLL_TIMEOUT);
        assert!(stale.reasons[0].detail.contains("since start"), "{:?}", stale.reasons);
        assert_eq!(stale.last_poll_success_secs, None);
    }

    #[test]
    fn in_webhook_mode_readiness_waits_for_set_webhook_and_never_for_a_poll() {
        let webhook = WebhookHealth::default();
        let not_yet = assess(Ok(()), &[], IntakeFacts::Webhook(webhook.facts(Instant::now())), POLL_TIMEOUT);
        assert_eq!(codes(&not_yet), ["webhook_not_set"]);
        assert_eq!(not_yet.intake, IntakeMode::Webhook);
        webhook.refused("Telegram refused setWebhook (400): bad webhook: HTTPS url must be provided".into());
        let refused = assess(Ok(()), &[], IntakeFacts::Webhook(webhook.facts(Instant::now())), POLL_TIMEOUT);
        assert!(refused.reasons[0].detail.contains("HTTPS url must be provided"), "{:?}", refused.reasons);
        webhook.registered();
        // No getUpdates ever succeeds in webhook mode, and that is no reason.
        let ready = assess(Ok(()), &[], IntakeFacts::Webhook(webhook.facts(Instant::now())), POLL_TIMEOUT);
        assert!(ready.ready, "{:?}", ready.reasons);
        assert_eq!(ready.last_poll_success_secs, None);
        let full = [failing(LedgerWrite::Intake, WriteProblem::DiskFull, 2)];
        assert_eq!(
            codes(&assess(Ok(()), &full, IntakeFacts::Webhook(webhook.facts(Instant::now())), POLL_TIMEOUT)),
            ["ledger_full"]
        );
        // The token revoked after the webhook was set: no update comes, nothing can be sent.
        webhook.token_refused();
        let refused = assess(Ok(()), &[], IntakeFacts::Webhook(webhook.facts(Instant::now())), POLL_TIMEOUT);
        assert_eq!(codes(&refused), ["telegram_unauthorized"]);
        webhook.registered();
        assert!(assess(Ok(()), &[], IntakeFacts::Webhook(webhook.facts(Instant::now())), POLL_TIMEOUT).ready);
    }

    #[test]
    fn a_refusal_lasts_until_a_poll_succeeds_and_keeps_its_start() {
        let health = PollHealth::new();
        health.failed(&FetchError::Unauthorized { status: 401 });
        let first = health.facts(Instant::now()).refusal.unwrap();
        assert_eq!(first.0, TelegramRefusal::Unauthorized);
        // A network error in between is no news about the token.
        health.failed(&FetchError::Malformed { status: 502, detail: String::new() });
        assert_eq!(health.facts(Instant::now()).refusal.map(|r| r.0), Some(TelegramRefusal::Unauthorized));
        health.failed(&FetchError::Conflict);
        assert_eq!(health.facts(Instant::now()).refusal.map(|r| r.0), Some(TelegramRefusal::Conflict));
        health.succeeded();
        let facts = health.facts(Instant::now());
        assert_eq!(facts.refusal, None);
        assert!(facts.ever_succeeded);
    }
}
