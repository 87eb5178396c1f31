//! Outbound delivery (DESIGN.md §4): a resolved reply goes to its envelope's chat and topic,
//! threaded to the original message, split under Telegram's size limit, with rate limits
//! waited out. Every send is an attempt recorded before it is made and classified after:
//! sent, not sent, or unknown. An unknown attempt is never retried.

use std::time::Duration;

use teloxide::RequestError;
use teloxide::prelude::*;
use teloxide::types::{MessageId, ReplyParameters, ThreadId};
use tokio_util::sync::CancellationToken;

use crate::ledger::{AttemptOutcome, Ledger, NewAttempt};
use crate::telegram::envelope::GENERAL_TOPIC_ID;

/// Telegram's limit for one message, in UTF-16 code units (how Telegram counts).
pub const TELEGRAM_TEXT_LIMIT: usize = 4096;

/// A `429` is Telegram saying "not yet": the request did not take effect, so waiting and
/// sending again is safe. One reply waits at most this long in all; a longer limit is
/// reported as not sent. It stays well below the channel plugin's reply timeout, so the
/// agent always learns the outcome instead of giving up on an answer still coming.
pub const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(120);

/// A break point this far into a chunk is good enough; earlier ones would make many small
/// messages, so a hard cut is better there.
const MIN_BREAK_FRACTION: usize = 2;

/// Where a reply goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTarget {
    pub envelope_id: i64,
    pub trace_id: String,
    pub agent: String,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub reply_to_message_id: i32,
}

/// One part of a reply that had to be split.
struct Chunk<'a> {
    text: &'a str,
    /// 0-based position among `count` parts.
    index: usize,
    count: usize,
}

/// What a reply's delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Every chunk confirmed sent.
    Delivered { message_ids: Vec<i32> },
    /// A chunk was provably not sent; `sent` lists the chunks that were, before it.
    NotSent { sent: Vec<i32>, error: String },
    /// A chunk may or may not have arrived; `sent` lists the confirmed ones before it.
    Unknown { sent: Vec<i32>, error: String },
}

/// How one request ended, from what was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Sent { message_id: i32 },
    NotSent { error: String, retry_after: Option<Duration>, migrated_to: Option<i64> },
    Unknown { error: String },
}

/// Classifies a `sendMessage` result. Only what proves the request had no effect counts
/// as not sent: an answer from Telegram that is an error, or a connection that was never
/// made. Anything after the request may have left (timeouts, broken connections,
/// unreadable answers) is unknown.
pub fn classify(result: &Result<Message, RequestError>) -> Observed {
    let not_sent = |error: String| Observed::NotSent { error, retry_after: None, migrated_to: None };
    match result {
        Ok(message) => Observed::Sent { message_id: message.id.0 },
        Err(RequestError::Api(api)) => not_sent(format!("Telegram refused it: {api}")),
        Err(RequestError::RetryAfter(wait)) => Observed::NotSent {
            error: format!("rate limited by Telegram for {}s", wait.seconds()),
            retry_after: Some(wait.duration()),
            migrated_to: None,
        },
        Err(RequestError::MigrateToChatId(to)) => Observed::NotSent {
            error: format!("the group became supergroup {}", to.0),
            retry_after: None,
            migrated_to: Some(to.0),
        },
        Err(RequestError::Network(e)) if e.is_connect() || e.is_builder() => {
            not_sent(format!("could not reach Telegram: {e}"))
        }
        Err(RequestError::Network(e)) if e.is_timeout() => Observed::Unknown {
            error: "Telegram did not answer within telegram.send_timeout_secs".to_owned(),
        },
        Err(RequestError::Network(e)) => Observed::Unknown {
            error: format!("the connection to Telegram failed after the request went out: {e}"),
        },
        Err(other) => Observed::Unknown { error: other.to_string() },
    }
}

/// The thread id to send with: none outside topics, and none for the General topic,
/// which Telegram refuses to be addressed by id.
pub fn telegram_thread(thread_id: Option<i32>) -> Option<i32> {
    thread_id.filter(|&id| id != GENERAL_TOPIC_ID)
}

/// Splits text into chunks of at most `limit` UTF-16 code units, preferring paragraph,
/// line, sentence and word boundaries, in that order. Whitespace at a break is dropped;
/// nothing else is.
///
/// ```
/// use switchboard::telegram::outbound::split_text;
///
/// let chunks = split_text("First paragraph.\n\nSecond one, a little longer.", 30);
/// assert_eq!(chunks, ["First paragraph.", "Second one, a little longer."]);
/// ```
pub fn split_text(text: &str, limit: usize) -> Vec<String> {
    assert!(limit > 0, "a chunk limit of zero cannot hold any text");
    let mut chunks = Vec::new();
    let mut rest = text;
    while utf16_len(rest) > limit {
        let fit = longest_prefix_within(rest, limit);
        let window = &rest[..fit];
        let (chunk_end, next_start) = best_break(window).unwrap_or((fit, fit));
        let chunk = window[..chunk_end].trim_end();
        if !chunk.is_empty() {
            chunks.push(chunk.to_owned());
        }
        rest = rest[next_start..].trim_start();
    }
    if !rest.trim().is_empty() || chunks.is_empty() {
        chunks.push(rest.to_owned());
    }
    chunks
}

fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// Byte length of the longest prefix of `s` (at a char boundary) within `limit` units.
fn longest_prefix_within(s: &str, limit: usize) -> usize {
    let mut units = 0;
    for (index, c) in s.char_indices() {
        units += c.len_utf16();
        if units > limit {
            return index;
        }
    }
    s.len()
}

/// The best place to break `window`: (end of this chunk, start of the next), both byte
/// offsets. `None` when no boundary lies far enough in.
fn best_break(window: &str) -> Option<(usize, usize)> {
    let min = window.len() / MIN_BREAK_FRACTION;
    let after = |at: Option<usize>, sep_len: usize| at.filter(|&i| i >= min).map(|i| (i, i + sep_len));
    after(window.rfind("\n\n"), 2)
        .or_else(|| after(window.rfind('\n'), 1))
        .or_else(|| {
            [". ", "! ", "? ", "; "]
                .iter()
                .filter_map(|sep| window.rfind(sep))
                .max()
                .and_then(|i| after(Some(i + 1), 1))
        })
        .or_else(|| {
            let i = window.rfind(char::is_whitespace)?;
            let width = window[i..].chars().next().map_or(1, char::len_utf8);
            after(Some(i), width)
        })
}

/// Sends replies to Telegram, recording every attempt.
#[derive(Clone)]
pub struct Outbound {
    /// A bot whose HTTP client times out after `telegram.send_timeout`: a send slower
    /// than that has an unknown outcome.
    bot: Bot,
    ledger: Ledger,
    /// Ends rate-limit waits when the daemon stops.
    shutdown: CancellationToken,
}

impl Outbound {
    pub fn new(bot: Bot, ledger: Ledger, shutdown: CancellationToken) -> Self {
        Self { bot, ledger, shutdown }
    }

    /// Delivers `text` as a reply to `target`, chunk by chunk. Stops at the first chunk
    /// that is not confirmed sent.
    pub async fn deliver(&self, target: &ReplyTarget, text: &str) -> sqlx::Result<DeliveryOutcome> {
        let chunks = split_text(text, TELEGRAM_TEXT_LIMIT);
        let mut sent = Vec::with_capacity(chunks.len());
        let mut rate_limit_budget = MAX_RATE_LIMIT_WAIT;
        for (index, text) in chunks.iter().enumerate() {
            let chunk = Chunk { text, index, count: chunks.len() };
            match self.send_chunk(target, &chunk, &mut rate_limit_budget).await? {
                Observed::Sent { message_id } => sent.push(message_id),
                Observed::NotSent { error, .. } => return Ok(DeliveryOutcome::NotSent { sent, error }),
                Observed::Unknown { error } => return Ok(DeliveryOutcome::Unknown { sent, error }),
            }
        }
        Ok(DeliveryOutcome::Delivered { message_ids: sent })
    }

    /// One chunk, waiting out rate limits within the reply's `budget`: each try is its
    /// own recorded attempt.
    async fn send_chunk(
        &self,
        target: &ReplyTarget,
        chunk: &Chunk<'_>,
        budget: &mut Duration,
    ) -> sqlx::Result<Observed> {
        loop {
            let observed = self.send_attempt(target, chunk).await?;
            match &observed {
                Observed::NotSent { retry_after: Some(wait), .. } if *wait <= *budget => {
                    *budget -= *wait;
                    tracing::warn!(trace_id = %target.trace_id, wait_secs = wait.as_secs(), "Telegram rate limit: waiting before sending again");
                    tokio::select! {
                        () = tokio::time::sleep(*wait) => continue,
                        () = self.shutdown.cancelled() => return Ok(Observed::NotSent {
                            error: "the daemon is stopping; the reply was not sent".into(),
                            retry_after: None,
                            migrated_to: None,
                        }),
                    }
                }
                Observed::NotSent { migrated_to: Some(new_chat), .. } => {
                    tracing::error!(
                        route = %target.route, old_chat_id = target.chat_id, new_chat_id = new_chat,
                        "chat {} became supergroup {new_chat}: change chat_id of route '{}' to {new_chat} and restart",
                        target.chat_id, target.route
                    );
                }
                _ => {}
            }
            return Ok(observed);
        }
    }

    /// Records the attempt, makes the request, records what was observed.
    async fn send_attempt(&self, target: &ReplyTarget, chunk: &Chunk<'_>) -> sqlx::Result<Observed> {
        let thread_id = telegram_thread(target.thread_id);
        let op_id = self
            .ledger
            .begin_attempt(&NewAttempt {
                envelope_id: target.envelope_id,
                agent: &target.agent,
                chat_id: target.chat_id,
                thread_id,
                reply_to_message_id: Some(target.reply_to_message_id),
                chunk_index: chunk.index,
                chunk_count: chunk.count,
                text: chunk.text,
            })
            .await?;
        let mut request = self.bot.send_message(ChatId(target.chat_id), chunk.text).reply_parameters(
            ReplyParameters::new(MessageId(target.reply_to_message_id)).allow_sending_without_reply(),
        );
        if let Some(thread_id) = thread_id {
            request = request.message_thread_id(ThreadId(MessageId(thread_id)));
        }
        let observed = classify(&request.await);
        let outcome = match &observed {
            Observed::Sent { message_id } => AttemptOutcome::Sent { message_id: *message_id },
            Observed::NotSent { error, .. } => AttemptOutcome::NotSent { error: error.clone() },
            Observed::Unknown { error } => AttemptOutcome::Unknown { error: error.clone() },
        };
        self.ledger.finish_attempt(&op_id, &outcome, &format!("agent:{}", target.agent)).await?;
        tracing::info!(trace_id = %target.trace_id, op_id, chunk = chunk.index + 1, of = chunk.count, outcome = outcome_label(&observed), "send attempt");
        Ok(observed)
    }
}

fn outcome_label(observed: &Observed) -> &'static str {
    match observed {
        Observed::Sent { .. } => "sent",
        Observed::NotSent { .. } => "not_sent",
        Observed::Unknown { .. } => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use teloxide::ApiError;
    use teloxide::types::Seconds;

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(split_text("hello", 4096), ["hello"]);
        assert_eq!(split_text("", 4096), [""]);
    }

    #[test]
    fn every_chunk_fits_and_nothing_but_break_whitespace_is_lost() {
        let paragraph = "Lorem ipsum dolor sit amet. Consectetur adipiscing elit! Sed do eiusmod?\n";
        let text = paragraph.repeat(200) + "\n\n" + &"x".repeat(5000) + " end";
        let chunks = split_text(&text, TELEGRAM_TEXT_LIMIT);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(utf16_len(chunk) <= TELEGRAM_TEXT_LIMIT, "chunk of {} units", utf16_len(chunk));
            assert!(!chunk.is_empty());
        }
        let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        assert_eq!(squash(&chunks.concat()), squash(&text));
    }

    #[test]
    fn prefers_paragraphs_then_lines_then_sentences_then_words() {
        assert_eq!(split_text("aaaa bbbb\n\ncccc", 12), ["aaaa bbbb", "cccc"]);
        assert_eq!(split_text("aaaa bbbb\ncccc dd", 12), ["aaaa bbbb", "cccc dd"]);
        assert_eq!(split_text("aaaa. bbbb cccc", 12), ["aaaa. bbbb", "cccc"]);
        assert_eq!(split_text("aaaa. bb cc dddd", 12), ["aaaa. bb cc", "dddd"]);
        assert_eq!(split_text("abcdefghijklmnop", 5), ["abcde", "fghij", "klmno", "p"]);
    }

    #[test]
    fn counts_utf16_units_and_never_splits_a_character() {
        // Each emoji is two UTF-16 units: 3 fit in 6 units, not 6.
        let text = "😀".repeat(7);
        let chunks = split_text(&text, 6);
        assert_eq!(chunks, ["😀😀😀", "😀😀😀", "😀"]);
    }

    #[test]
    fn general_topic_is_addressed_without_a_thread() {
        assert_eq!(telegram_thread(None), None);
        assert_eq!(telegram_thread(Some(GENERAL_TOPIC_ID)), None);
        assert_eq!(telegram_thread(Some(42)), Some(42));
    }

    #[test]
    fn telegram_errors_are_not_sent_and_unreadable_answers_are_unknown() {
        let api = classify(&Err(RequestError::Api(ApiError::BotBlocked)));
        assert!(matches!(api, Observed::NotSent { retry_after: None, .. }), "{api:?}");
        let limited = classify(&Err(RequestError::RetryAfter(Seconds::from_seconds(3))));
        assert!(
            matches!(limited, Observed::NotSent { retry_after: Some(d), .. } if d == Duration::from_secs(3))
        );
        let migrated = classify(&Err(RequestError::MigrateToChatId(ChatId(-100))));
        assert!(matches!(migrated, Observed::NotSent { migrated_to: Some(-100), .. }));
        let garbled = classify(&Err(RequestError::InvalidJson {
            source: Arc::new(serde_json::from_str::<u8>("x").unwrap_err()),
            raw: "<html>".into(),
        }));
        assert!(matches!(garbled, Observed::Unknown { .. }), "{garbled:?}");
        let io = classify(&Err(RequestError::Io(Arc::new(std::io::Error::other("reset")))));
        assert!(matches!(io, Observed::Unknown { .. }));
    }
}
