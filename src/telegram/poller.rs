//! The poller: the one `getUpdates` loop of the bot. It stores each batch's rows and the
//! next offset in one ledger transaction before asking for more, so a crash never loses an
//! update and a re-poll never stores one twice.
//!
//! Each update is decoded on its own: one that cannot be decoded (or makes the decoder
//! panic) is recorded raw as `undecodable` and confirmed with its batch, so intake never
//! stalls on it. A ledger that is busy or a disk that is full is waited out; a token that
//! Telegram keeps refusing stops the daemon after `telegram.unauthorized_exit_secs`.

use std::time::Duration;

use teloxide::Bot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::Settings;
use crate::ledger::{Ledger, LedgerCongestion, LedgerError};
use crate::operate::health::PollHealth;
use crate::telegram::intake::{Confirmation, UpdateIntake};
use crate::telegram::updates::{FetchError, UpdatesClient};

/// Telegram's maximum batch.
const BATCH_LIMIT: u8 = 100;

/// Backoff after a failed poll: quick at first (a blip), capped so a long outage is
/// still noticed within half a minute of its end. The ledger's waits (busy, disk full)
/// use the same curve on a backoff of their own, since a poll can succeed in between.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// What one poll did; the loop around [`Poller::poll_once`] only sleeps on `Wait`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    /// A batch was committed: how many updates came, how many rows were new.
    Committed { updates: usize, new_envelopes: usize },
    /// The long poll ended with nothing.
    Empty,
    /// Telegram, the network or the ledger failed; wait this long before polling again.
    Wait(Duration),
}

pub struct Poller {
    /// `getUpdates` through the bot's HTTP client, whose timeout outlives the long poll
    /// (see `app`).
    updates: UpdatesClient,
    /// Where each batch goes: decoded, routed, committed with its offset, handed over.
    intake: UpdateIntake,
    /// Where the offset is read from once, at the first poll.
    ledger: Ledger,
    /// What `/readyz` learns from the polls: the last success, a lasting refusal.
    health: PollHealth,
    poll_timeout: Duration,
    /// Between failed calls to Telegram.
    backoff: Backoff,
    /// Between batches the ledger could not take.
    ledger_backoff: Backoff,
    /// How long Telegram may refuse the token before the poller gives up.
    unauthorized_exit: Duration,
    /// Since when Telegram has refused the token, with no successful call since.
    refused_since: Option<Instant>,
    /// The offset as committed: read from the ledger once, then kept in step with each
    /// batch this poller commits (nothing else writes it), so a poll costs no read.
    offset: Option<Option<i64>>,
}

impl Poller {
    /// A poller for the bot behind `bot`, handing each batch to `intake` and reporting to
    /// `health`.
    pub fn new(
        bot: Bot,
        intake: UpdateIntake,
        ledger: Ledger,
        settings: &Settings,
        health: PollHealth,
    ) -> Self {
        Self {
            updates: UpdatesClient::new(&bot),
            intake,
            ledger,
            health,
            poll_timeout: settings.telegram.poll_timeout,
            backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_CAP),
            ledger_backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_CAP),
            unauthorized_exit: settings.telegram.unauthorized_exit,
            refused_since: None,
            offset: None,
        }
    }

    /// Polls until `shutdown`. A poll in flight when the daemon stops is abandoned: its
    /// updates were not committed, so Telegram sends them again next time.
    pub async fn run(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(bot_id = self.intake.bot_id(), "poller started");
        loop {
            let outcome = tokio::select! {
                outcome = self.poll_once() => outcome?,
                () = shutdown.cancelled() => break,
            };
            if let PollOutcome::Wait(delay) = outcome {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => break,
                }
            }
        }
        tracing::info!("poller stopped");
        Ok(())
    }

    /// One `getUpdates` call and the commit of its batch. Errors are returned only when
    /// the daemon must stop: a ledger error other than a busy lock or a full disk
    /// (nothing could be stored safely), or a token refused for too long.
    pub async fn poll_once(&mut self) -> anyhow::Result<PollOutcome> {
        let offset = match self.offset {
            Some(offset) => offset,
            None => match self.ledger.next_offset(self.intake.bot_id()).await {
                Ok(offset) => *self.offset.insert(offset),
                Err(e) => return self.ledger_trouble(e, "reading the poll offset"),
            },
        };
        let updates = match self.updates.get_updates(offset, self.poll_timeout, BATCH_LIMIT).await {
            Ok(updates) => updates,
            Err(e) => {
                self.health.failed(&e);
                return self.fetch_failed(&e).map(PollOutcome::Wait);
            }
        };
        self.health.succeeded();
        self.refused_since = None;
        if updates.is_empty() {
            self.backoff.reset();
            return Ok(PollOutcome::Empty);
        }
        // Telegram confirms every update below the offset: one past the last update (an id
        // at the type's end, which no real update has, stays there: it is deduplicated).
        let Some(next_offset) =
            updates.iter().rev().find_map(|update| update.update_id).map(|id| id.saturating_add(1))
        else {
            let delay = self.backoff.next_delay();
            tracing::warn!(
                updates = updates.len(),
                retry_in_ms = delay.as_millis() as u64,
                "getUpdates failed; retrying: no update of the batch has a readable update_id"
            );
            return Ok(PollOutcome::Wait(delay));
        };
        // Reset only by a batch that can be taken: one that cannot backs off, doubling,
        // instead of being asked for twice a second.
        self.backoff.reset();

        let update_count = updates.len();
        let taken = match self.intake.take(updates, Confirmation::Offset(next_offset)).await {
            Ok(taken) => taken,
            Err(e) => return self.ledger_trouble(e, "recording a batch"),
        };
        self.ledger_backoff.reset();
        self.offset = Some(Some(next_offset));
        Ok(PollOutcome::Committed { updates: update_count, new_envelopes: taken.new_envelopes })
    }

    /// A ledger error: waited out when it passes by itself (busy, disk full), else fatal.
    fn ledger_trouble(&mut self, error: LedgerError, doing: &str) -> anyhow::Result<PollOutcome> {
        let Some(congestion) = LedgerCongestion::of(&error) else {
            return Err(anyhow::Error::new(error).context(format!("{doing} in the ledger")));
        };
        let delay = self.ledger_backoff.next_delay();
        tracing::error!(
            error = %error,
            retry_in_ms = delay.as_millis() as u64,
            "{congestion} ({doing}): nothing recorded and the offset not moved, so Telegram keeps the updates; retrying"
        );
        Ok(PollOutcome::Wait(delay))
    }

    /// How long to wait after a failed poll, saying what is wrong at the right volume; an
    /// error when the token has been refused for `telegram.unauthorized_exit_secs`.
    fn fetch_failed(&mut self, error: &FetchError) -> anyhow::Result<Duration> {
        let delay = match error {
            FetchError::RetryAfter(wait) => {
                tracing::warn!(wait_secs = wait.as_secs(), "Telegram rate limit on getUpdates: waiting");
                *wait
            }
            FetchError::Conflict => {
                let delay = self.backoff.next_delay();
                tracing::error!(
                    retry_in_ms = delay.as_millis() as u64,
                    "409 Conflict: another process is polling this bot token. Only one poller per token may run: stop the other one (another switchboard, or a plugin that calls getUpdates)"
                );
                delay
            }
            FetchError::WebhookActive => {
                let delay = self.backoff.next_delay();
                tracing::error!(
                    retry_in_ms = delay.as_millis() as u64,
                    "a webhook is set for this bot, so Telegram refuses getUpdates: remove it (Bot API deleteWebhook) to let switchboard poll"
                );
                delay
            }
            FetchError::Unauthorized { .. } => return self.token_refused(),
            other => {
                let delay = self.backoff.next_delay();
                tracing::warn!(error = %other, retry_in_ms = delay.as_millis() as u64, "getUpdates failed; retrying");
                delay
            }
        };
        Ok(delay)
    }

    /// A 401 is an error on every retry; once it has lasted `unauthorized_exit`, the
    /// poller gives up and the daemon stops with a non-zero exit.
    fn token_refused(&mut self) -> anyhow::Result<Duration> {
        let refused_for = self.refused_since.get_or_insert_with(Instant::now).elapsed();
        let limit_secs = self.unauthorized_exit.as_secs();
        if refused_for >= self.unauthorized_exit {
            tracing::error!(
                refused_for_secs = refused_for.as_secs(),
                "Telegram has refused the bot token for {limit_secs} s (telegram.unauthorized_exit_secs): stopping the daemon. The token was revoked or is wrong: put a valid one in the variable telegram.token_env names"
            );
            anyhow::bail!(
                "Telegram refused the bot token for {limit_secs} s (telegram.unauthorized_exit_secs)"
            );
        }
        let remaining = self.unauthorized_exit - refused_for;
        let delay = self.backoff.next_delay().min(remaining);
        tracing::error!(
            retry_in_ms = delay.as_millis() as u64,
            stopping_in_secs = remaining.as_secs(),
            "Telegram refuses the bot token: check the variable telegram.token_env names"
        );
        Ok(delay)
    }
}

/// The numeric bot id is the part of the token before the colon; `None` when the token
/// does not look like one @BotFather gives (`NUMBER:SECRET`, the secret with no
/// whitespace). The one reader of a token's shape: `check` refuses what `run` would.
pub fn bot_id_from_token(token: &str) -> Option<i64> {
    let (id, secret) = token.split_once(':')?;
    let id = id.parse::<i64>().ok().filter(|id| *id > 0)?;
    (!secret.is_empty() && !secret.chars().any(char::is_whitespace)).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bot_id_is_the_token_prefix() {
        assert_eq!(bot_id_from_token("123456:ABC-def"), Some(123_456));
        assert_eq!(bot_id_from_token("nonsense"), None);
        assert_eq!(bot_id_from_token("abc:def"), None);
        for not_a_token in ["123456:", ":secret", "123456:two words", "-5:abc", "0:abc"] {
            assert_eq!(bot_id_from_token(not_a_token), None, "{not_a_token}");
        }
    }
}
