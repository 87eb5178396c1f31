//! Outbound delivery (DESIGN.md §4): a resolved reply goes to its envelope's chat and topic,
//! threaded to the original message, split under Telegram's size limit, with rate limits
//! waited out. Every send is an attempt recorded before it is made and classified after:
//! sent, not sent, or unknown. An unknown attempt is never retried.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use teloxide::Bot;
use tokio_util::sync::CancellationToken;

use super::bot_api::{Answer, BotApi, Exchange};
use super::files::TelegramFiles;
use super::format;

mod actions;
mod turns;
use crate::backoff::Backoff;
use crate::ids::TraceId;
use crate::ledger::{AttemptMethod, AttemptOutcome, AttemptPurpose, FinishedAttempt, Ledger, NewAttempt};
use crate::operate::metrics;
use crate::rules::media::{self, UploadKind};
use crate::rules::pacing::{Cleared, Deferred, PaceLimits, Pacer};
use crate::rules::revisions::Refusal;
use crate::telegram::envelope::GENERAL_TOPIC_ID;
pub use actions::{MessageAction, MessageActionTarget};

/// Telegram's limit for one message, in UTF-16 code units (how Telegram counts).
pub const TELEGRAM_TEXT_LIMIT: usize = 4096;

/// One reply waits at most this long in all: for its turns in Telegram's pace (behind the
/// sends already queued to its chat) and for `429`s (Telegram saying "not yet": the request
/// did not take effect, so waiting and sending again is safe). A part that would wait
/// longer is not sent, and takes no place in the queue. It stays well below the channel
/// plugin's reply timeout, so the agent always learns the outcome instead of giving up on
/// an answer still coming.
pub const MAX_REPLY_WAIT: Duration = Duration::from_secs(120);

/// A break point this far into a chunk is good enough; earlier ones would make many small
/// messages, so a hard cut is better there.
const MIN_BREAK_FRACTION: usize = 2;

/// Where a reply goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTarget {
    pub envelope_id: i64,
    pub trace_id: TraceId,
    pub agent: String,
    pub route: String,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    /// The message this one answers, threaded to it; none for a copy that answers nothing.
    pub reply_to_message_id: Option<i32>,
}

/// A reply ready to go: its target, the request it answers, its parts, and the parts an
/// earlier, interrupted request with the same text already delivered (never sent again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyPlan {
    pub target: ReplyTarget,
    /// The `reply` request it answers; none for an audit copy.
    pub request_id: Option<String>,
    pub purpose: AttemptPurpose,
    pub parts: Vec<String>,
    /// The parts are Telegram HTML, sent with `parse_mode = "HTML"`; a part Telegram
    /// cannot parse is sent once more as plain text.
    pub html: bool,
    /// (part index, Telegram message id) of parts already confirmed sent.
    pub already_sent: Vec<(usize, i32)>,
    /// Files sent after the text, each a part of its own (its index follows the text's
    /// parts), uploaded from where the daemon staged them.
    pub files: Vec<PlannedFile>,
}

/// A file of a reply, staged by the daemon (DESIGN.md §14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFile {
    /// The staged copy; the daemon never opens a path an agent names.
    pub path: std::path::PathBuf,
    /// The name Telegram shows.
    pub name: String,
    pub size: u64,
    pub kind: UploadKind,
    /// What its attempt records as its text (name, size and digest), by which a repeated
    /// request knows the part it already delivered.
    pub descriptor: String,
}

impl PlannedFile {
    /// The attempt text of a file: the same file (by name, size and content) always gets
    /// the same one.
    pub fn describe(name: &str, size: u64, sha256: &str) -> String {
        format!("[file {name}, {size} bytes, sha256 {sha256}]")
    }

    /// The same staged file, sent as a document (see `rules::media::warrants_document`).
    fn as_document(&self) -> Self {
        Self { kind: UploadKind::Document, ..self.clone() }
    }
}

impl ReplyPlan {
    /// Every part's attempt text, the text's and then the files', in part order.
    pub fn part_texts(&self) -> Vec<String> {
        self.parts.iter().cloned().chain(self.files.iter().map(|f| f.descriptor.clone())).collect()
    }
}

/// The attempt method that sends a file of this kind.
fn upload_method(kind: UploadKind) -> AttemptMethod {
    match kind {
        UploadKind::Photo => AttemptMethod::SendPhoto,
        UploadKind::Animation => AttemptMethod::SendAnimation,
        UploadKind::Video => AttemptMethod::SendVideo,
        UploadKind::Voice => AttemptMethod::SendVoice,
        UploadKind::Audio => AttemptMethod::SendAudio,
        UploadKind::Document => AttemptMethod::SendDocument,
    }
}

/// One part of a reply that had to be split.
struct Chunk<'a> {
    text: &'a str,
    /// Sent with `parse_mode = "HTML"`.
    html: bool,
    /// 0-based position among `count` parts.
    index: usize,
    count: usize,
    /// A file part: `text` is its descriptor, and the file goes instead of a message.
    file: Option<&'a PlannedFile>,
}

/// What a reply's delivery came to. `sent` lists (part index, message id) of every part
/// confirmed sent, earlier requests' included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Every part confirmed sent.
    Delivered { message_ids: Vec<i32> },
    /// A part was provably not sent; nothing after it was tried.
    NotSent { sent: Vec<(usize, i32)>, parts: usize, error: String },
    /// A part may or may not have arrived; nothing after it was tried.
    Unknown { sent: Vec<(usize, i32)>, parts: usize, error: String },
    /// The task the reply acts for changed before a part went out (DESIGN.md §11): that
    /// part and the rest were not sent.
    Refused { sent: Vec<(usize, i32)>, refusal: Refusal },
}

/// How one request ended, from what was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Sent { message_id: i32 },
    NotSent { error: String, retry_after: Option<Duration>, migrated_to: Option<i64> },
    Unknown { error: String },
}

#[derive(Debug, Deserialize)]
struct SentMessage {
    message_id: i32,
}

/// Classifies a `sendMessage` exchange. Only what proves the request had no effect counts
/// as not sent: a connection that was never made, or Telegram's own refusal (a 4xx answer
/// with `ok: false`). Anything after the request may have left is unknown: a timeout, a
/// broken connection, a 5xx (Telegram or a proxy failed somewhere, possibly after posting),
/// an answer that cannot be read.
pub fn classify(exchange: &Exchange) -> Observed {
    classify_as(exchange, |sent: SentMessage| sent.message_id)
}

/// [`classify`] for any Bot API call: `message_id` reads the id of the message it
/// created or acted on from the `result` of a successful answer.
fn classify_as<T: serde::de::DeserializeOwned>(
    exchange: &Exchange,
    message_id: impl Fn(T) -> i32,
) -> Observed {
    let not_sent = |error: String| Observed::NotSent { error, retry_after: None, migrated_to: None };
    let (status, body) = match exchange {
        Exchange::NotConnected(detail) => return not_sent(format!("could not reach Telegram: {detail}")),
        Exchange::NoAnswer(detail) => return Observed::Unknown { error: detail.clone() },
        Exchange::Answered { status, body } => (*status, body),
    };
    if status >= 500 {
        return Observed::Unknown {
            error: format!("Telegram answered HTTP {status}, so the message may or may not have been posted"),
        };
    }
    let Ok(answer) = serde_json::from_slice::<Answer<T>>(body) else {
        return Observed::Unknown { error: format!("Telegram's answer (HTTP {status}) could not be read") };
    };
    match answer {
        Answer { ok: true, result: Some(sent), .. } => Observed::Sent { message_id: message_id(sent) },
        Answer { ok: true, result: None, .. } => {
            Observed::Unknown { error: "Telegram answered ok without the message".to_owned() }
        }
        Answer { ok: false, error_code, description, parameters, .. } => {
            let description =
                description.unwrap_or_else(|| format!("error {}", error_code.unwrap_or(status)));
            let parameters = parameters.unwrap_or_default();
            match (parameters.retry_after, parameters.migrate_to_chat_id) {
                (Some(seconds), _) => Observed::NotSent {
                    error: format!("rate limited by Telegram for {seconds}s"),
                    retry_after: Some(Duration::from_secs(seconds)),
                    migrated_to: None,
                },
                (None, Some(to)) => Observed::NotSent {
                    error: format!("the group became supergroup {to}"),
                    retry_after: None,
                    migrated_to: Some(to),
                },
                (None, None) => not_sent(format!("{REFUSED_BY_TELEGRAM}{description}")),
            }
        }
    }
}

/// Telegram's refusals that no retry can change by itself (lowercased, as they appear in
/// its descriptions): the bot was blocked, kicked or never let in (every 403), the chat or
/// topic is gone or closed, or the bot may not post there. Sending the same again only
/// earns the same answer until someone changes the chat.
const LASTING_REFUSALS: [&str; 8] = [
    "forbidden:",
    "chat not found",
    "message thread not found",
    "topic_closed",
    "topic_deleted",
    "not enough rights",
    "have no rights",
    "chat_write_forbidden",
];

/// Whether a send's error is Telegram refusing it for good ([`LASTING_REFUSALS`]): then its
/// agent is told not to try again but to ack the message. Only Telegram's own refusal
/// counts, not a connection that failed or a wait that was too long.
pub fn refusal_lasts(error: &str) -> bool {
    let Some(description) = error.strip_prefix(REFUSED_BY_TELEGRAM) else { return false };
    let description = description.to_ascii_lowercase();
    LASTING_REFUSALS.iter().any(|refusal| description.contains(refusal))
}

/// How a send's error starts when Telegram refused it (a 4xx answer with `ok: false`).
const REFUSED_BY_TELEGRAM: &str = "Telegram refused it: ";

/// The kind of Bot API failure an exchange was, for `switchboard_bot_api_errors_total`;
/// none when Telegram returned the message.
pub fn error_kind(exchange: &Exchange, observed: &Observed) -> Option<&'static str> {
    let status = match exchange {
        Exchange::NotConnected(_) => return Some("connect"),
        Exchange::NoAnswer(_) => return Some("no_answer"),
        Exchange::Answered { status, .. } => *status,
    };
    Some(match observed {
        Observed::Sent { .. } => return None,
        Observed::Unknown { .. } if status >= 500 => "server",
        Observed::Unknown { .. } => "malformed",
        Observed::NotSent { retry_after: Some(_), .. } => "rate_limited",
        Observed::NotSent { migrated_to: Some(_), .. } => "migrated",
        Observed::NotSent { .. } if status == 401 => "unauthorized",
        Observed::NotSent { .. } => "refused",
    })
}

/// The thread id to send with: none outside topics, and none for the General topic,
/// which Telegram refuses to be addressed by id.
pub fn telegram_thread(thread_id: Option<i32>) -> Option<i32> {
    thread_id.filter(|&id| id != GENERAL_TOPIC_ID)
}

/// Splits text into chunks of at most `limit` UTF-16 code units, preferring paragraph,
/// line, sentence and word boundaries, in that order. Whitespace at a break is dropped, but
/// not the indentation of the line a chunk starts with; nothing else is.
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
        let at_line_break = window[chunk_end..next_start].contains('\n');
        rest = if at_line_break {
            skip_blank_lines(&rest[next_start..])
        } else {
            rest[next_start..].trim_start()
        };
    }
    if !rest.trim().is_empty() || chunks.is_empty() {
        chunks.push(rest.to_owned());
    }
    chunks
}

fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// What follows a line break: its blank lines dropped, but not the indentation of the line
/// that continues the text (code keeps its shape).
fn skip_blank_lines(mut rest: &str) -> &str {
    while let Some(end) = rest.find('\n').filter(|&end| rest[..end].trim().is_empty()) {
        rest = &rest[end + 1..];
    }
    if rest.trim().is_empty() { "" } else { rest }
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

/// A ledger write that failed for a passing reason (busy, disk full) is tried again at
/// these intervals: an attempt's outcome, once observed, must reach the ledger.
const LEDGER_RETRY_FIRST: Duration = Duration::from_millis(100);
const LEDGER_RETRY_CAP: Duration = Duration::from_secs(5);

/// Sends replies to Telegram, recording every attempt.
#[derive(Clone)]
pub struct Outbound {
    /// Calls `sendMessage` with a client that times out after `telegram.send_timeout`: a
    /// send slower than that has an unknown outcome.
    api: BotApi,
    ledger: Ledger,
    /// Spaces sends at Telegram's rates: per chat, and across all chats.
    pacer: Arc<Mutex<Pacer>>,
    /// Ends rate-limit and pacing waits when the daemon stops.
    shutdown: CancellationToken,
    /// Uploads the files of replies; none in a daemon built without them (tests).
    files: Option<TelegramFiles>,
    /// One reply at a time in each conversation.
    turns: turns::Turns,
    /// Until when this replica leads the bot (its tenure's end, moved on at each renewal);
    /// `None` on SQLite, whose file lock entitles the process for as long as it lives.
    leads_until: Option<tokio::sync::watch::Receiver<std::time::Instant>>,
}

impl Outbound {
    pub fn new(bot: Bot, ledger: Ledger, pacer: Pacer, shutdown: CancellationToken) -> Self {
        Self {
            api: BotApi::from_bot(&bot),
            ledger,
            pacer: Arc::new(Mutex::new(pacer)),
            shutdown,
            files: None,
            turns: turns::Turns::default(),
            leads_until: None,
        }
    }

    /// The same, for a replica that leads the bot until the time `leads_until` holds: no
    /// request leaves once that has passed.
    pub fn leading_until(mut self, leads_until: tokio::sync::watch::Receiver<std::time::Instant>) -> Self {
        self.leads_until = Some(leads_until);
        self
    }

    /// Whether this replica still leads the bot by its own clock, checked as a request is
    /// about to leave. A leader paused past its lease (SIGSTOP, a frozen VM) may have been
    /// replaced while a request waited for its turn or after its attempt was recorded; the
    /// new leader has made that attempt `unknown` or will send the prompt itself, so the
    /// request must not leave now.
    fn still_leads(&self) -> bool {
        self.leads_until.as_ref().is_none_or(|until| std::time::Instant::now() < *until.borrow())
    }

    /// The same, able to send the files of replies.
    pub fn with_files(mut self, files: TelegramFiles) -> Self {
        self.files = Some(files);
        self
    }

    /// New limits to pace sends to (a configuration reload).
    pub fn set_pacing(&self, limits: PaceLimits) {
        self.pacer().set_limits(limits);
    }

    fn pacer(&self) -> MutexGuard<'_, Pacer> {
        lock_pacer(&self.pacer)
    }

    /// Delivers a planned reply part by part, skipping the parts already delivered. Stops
    /// at the first part that is not confirmed sent. Replies to one conversation go one
    /// after another, never interleaved; waiting for the ones before counts against the
    /// reply's wait.
    pub async fn deliver(&self, plan: &ReplyPlan) -> DeliveryOutcome {
        let count = plan.parts.len() + plan.files.len();
        let mut sent = plan.already_sent.clone();
        let mut wait_budget = MAX_REPLY_WAIT;
        let conversation = (plan.target.chat_id, plan.target.thread_id);
        let waiting = std::time::Instant::now();
        let _turn = tokio::select! {
            turn = tokio::time::timeout(wait_budget, self.turns.take(conversation)) => match turn {
                Ok(turn) => turn,
                Err(_) => {
                    let error = "the replies before this one to the chat would hold it longer than a reply \
                                 waits; nothing was sent"
                        .to_owned();
                    return DeliveryOutcome::NotSent { sent, parts: count, error };
                }
            },
            () = self.shutdown.cancelled() => {
                return DeliveryOutcome::NotSent { sent, parts: count, error: STOPPING.into() };
            }
        };
        wait_budget = wait_budget.saturating_sub(waiting.elapsed());
        let texts =
            plan.parts.iter().map(|text| Chunk { text, html: plan.html, index: 0, count, file: None });
        let files = plan.files.iter().map(|file| Chunk {
            text: &file.descriptor,
            html: false,
            index: 0,
            count,
            file: Some(file),
        });
        for (index, chunk) in texts.chain(files).enumerate() {
            if sent.iter().any(|(done, _)| *done == index) {
                continue;
            }
            let chunk = Chunk { index, ..chunk };
            match self.send_chunk(plan, &chunk, &mut wait_budget).await {
                Ok(Observed::Sent { message_id }) => sent.push((index, message_id)),
                Ok(Observed::NotSent { error, .. }) => {
                    return DeliveryOutcome::NotSent { sent, parts: count, error };
                }
                Ok(Observed::Unknown { error }) => {
                    return DeliveryOutcome::Unknown { sent, parts: count, error };
                }
                Err(refusal) => return DeliveryOutcome::Refused { sent, refusal },
            }
        }
        sent.sort_unstable();
        DeliveryOutcome::Delivered { message_ids: sent.into_iter().map(|(_, id)| id).collect() }
    }

    /// One part, paced to the chat and waiting out rate limits within what is left of the
    /// reply's wait `budget`: each try is its own recorded attempt. Refused when the reply's task no
    /// longer admits it (DESIGN.md §11); then nothing was attempted.
    async fn send_chunk(
        &self,
        plan: &ReplyPlan,
        chunk: &Chunk<'_>,
        budget: &mut Duration,
    ) -> Result<Observed, Refusal> {
        let target = &plan.target;
        // The part as plain text, once Telegram refused its HTML.
        let mut plain: Option<String> = None;
        // The part's file as a document, once Telegram refused it as the kind its name made it.
        let mut document: Option<PlannedFile> = None;
        loop {
            let chunk = &Chunk {
                text: plain.as_deref().unwrap_or(chunk.text),
                html: chunk.html && plain.is_none(),
                file: document.as_ref().or(chunk.file),
                ..*chunk
            };
            // Longer than this reply may wait, or the daemon stops: nothing is attempted.
            let turn = match self.take_turn(target.chat_id, budget).await {
                Ok(turn) => turn,
                Err(not_made) => return Ok(not_made.observed()),
            };
            let observed = self.send_attempt(plan, chunk, turn).await?;
            if let Observed::NotSent { retry_after: Some(wait), .. } = &observed {
                // Whatever the reason (another process on the same token), the chat is held
                // and the overall pace lowered for every send, not only this one, and also
                // when this send does not wait (the next one to the chat is not tried early).
                self.pacer().rate_limited(target.chat_id, *wait, std::time::Instant::now());
            }
            match &observed {
                Observed::NotSent { retry_after: Some(wait), .. } if *wait <= *budget => {
                    *budget -= *wait;
                    metrics::rate_limit_wait("sendMessage", *wait);
                    tracing::warn!(trace_id = %target.trace_id, wait_secs = wait.as_secs(), "Telegram rate limit: waiting before sending again");
                    if self.wait(*wait).await {
                        continue;
                    }
                    return Ok(stopping());
                }
                // A 400 is a confirmed "not sent": the same part once more, as plain text,
                // is a new attempt that cannot make a duplicate.
                Observed::NotSent { error, retry_after: None, migrated_to: None }
                    if chunk.html && format::is_unparsable_entities(error) =>
                {
                    tracing::warn!(trace_id = %target.trace_id, chunk = chunk.index + 1, %error, "Telegram could not parse the part's HTML: sending it once more as plain text");
                    plain = Some(format::html_to_plain(chunk.text));
                    continue;
                }
                // The same reasoning for a file Telegram refused as a photo (its dimensions,
                // an image it cannot process) or a voice message (forbidden by the person):
                // the same staged file once more as a document, which Telegram takes
                // whatever it holds. A document refused is not sent again.
                Observed::NotSent { error, retry_after: None, migrated_to: None }
                    if chunk.file.is_some_and(|file| media::warrants_document(file.kind, error)) =>
                {
                    tracing::warn!(trace_id = %target.trace_id, chunk = chunk.index + 1, %error, "Telegram refused the file as it was sent: sending it once more as a document");
                    document = chunk.file.map(PlannedFile::as_document);
                    continue;
                }
                Observed::NotSent { migrated_to: Some(new_chat), .. } => {
                    tracing::error!(
                        route = %target.route, old_chat_id = target.chat_id, new_chat_id = new_chat,
                        "chat {} became supergroup {new_chat}: change chat_id of route '{}' to {new_chat} and reload (SIGHUP); this reply was not sent",
                        target.chat_id, target.route
                    );
                }
                _ => {}
            }
            return Ok(observed);
        }
    }

    /// A request to `chat_id` that posts or edits something but is no recorded attempt (a
    /// permission prompt, an operator's question, their edits), made with `api`: at the
    /// chat's pace like a send, within a reply's wait, and its `429` holds the chat for
    /// every send, as a send's own does. `Err` says why it was not made.
    pub async fn call_paced(
        &self,
        api: &BotApi,
        chat_id: i64,
        method: &str,
        params: &serde_json::Value,
    ) -> Result<Exchange, String> {
        let mut budget = MAX_REPLY_WAIT;
        let mut turn = self.take_turn(chat_id, &mut budget).await.map_err(NotMade::reason)?;
        if !self.still_leads() {
            return Err(NO_LONGER_LEADS.to_owned());
        }
        turn.leave();
        let exchange = api.call(method, params).await;
        drop(turn);
        self.heard(chat_id, &exchange);
        Ok(exchange)
    }

    /// A request to `chat_id` made outside the pacer (a chat action, an acknowledging
    /// reaction) was answered: a `429` holds the chat for every send, as a send's own does.
    pub fn heard(&self, chat_id: i64, exchange: &Exchange) {
        if let Some(wait) = retry_after(exchange) {
            self.pacer().rate_limited(chat_id, wait, std::time::Instant::now());
        }
    }

    /// Whether Telegram holds `chat_id` (a `429` not over yet): a request to it now would
    /// only earn another.
    pub fn holds(&self, chat_id: i64) -> bool {
        !self.pacer().held_for(chat_id, std::time::Instant::now()).is_zero()
    }

    /// Waits for `chat_id`'s turn in Telegram's pace within what is left of `budget`, which
    /// the wait is taken from: reserved, waited for, and waited for again while a `429` came
    /// for the chat meanwhile (a request waits for that hold, not goes into it); then
    /// cleared ([`Self::clearance`]).
    async fn take_turn(&self, chat_id: i64, budget: &mut Duration) -> Result<Turn<'_>, NotMade> {
        loop {
            let pace = self
                .pacer()
                .reserve_within(chat_id, std::time::Instant::now(), *budget)
                .map_err(NotMade::Deferred)?;
            *budget -= pace;
            if !pace.is_zero() {
                tracing::debug!(
                    chat_id,
                    wait_ms = pace.as_millis() as u64,
                    "pacing sends to Telegram's limits"
                );
                if !self.wait(pace).await {
                    return Err(NotMade::Stopping);
                }
                if self.holds(chat_id) {
                    continue;
                }
            }
            return self.clearance(Some(chat_id), budget).await;
        }
    }

    /// Holds a request whose moment came until the requests actually made leave room for
    /// it in Telegram's overall budget and its group's minute ([`Pacer::clear_to_send`]),
    /// within what is left of `budget`; `chat_id` none for a request outside its chat's
    /// pacing. Usually at once; after a `429` or a reload that lowered the budget, the sends
    /// scheduled before it are held here for as long as the lower budget needs. That is
    /// why it comes before the attempt is recorded: the wait, however long, leaves no
    /// `in_flight` attempt behind it for a crash to make `unknown`, and a stop cuts it
    /// short with nothing sent.
    async fn clearance(&self, chat_id: Option<i64>, budget: &mut Duration) -> Result<Turn<'_>, NotMade> {
        loop {
            let now = std::time::Instant::now();
            let asked = match chat_id {
                Some(chat_id) => self.pacer().clear_to_send(chat_id, now),
                None => self.pacer().clear_overall(now),
            };
            let hold = match asked {
                Ok(cleared) => return Ok(Turn { pacer: &self.pacer, cleared: Some(cleared), left: false }),
                Err(hold) => hold,
            };
            if hold > *budget {
                return Err(NotMade::Deferred(Deferred::Queued(hold)));
            }
            *budget -= hold;
            if !self.wait(hold).await {
                return Err(NotMade::Stopping);
            }
        }
    }

    /// Sleeps, unless the daemon stops first; false when it does.
    async fn wait(&self, duration: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(duration) => true,
            () = self.shutdown.cancelled() => false,
        }
    }

    /// One part's attempt, its `turn` taken: `sendMessage` through [`Self::attempt_call`].
    async fn send_attempt(
        &self,
        plan: &ReplyPlan,
        chunk: &Chunk<'_>,
        turn: Turn<'_>,
    ) -> Result<Observed, Refusal> {
        let target = &plan.target;
        let thread_id = telegram_thread(target.thread_id);
        let attempt = NewAttempt {
            envelope_id: target.envelope_id,
            agent: &target.agent,
            request_id: plan.request_id.as_deref(),
            purpose: plan.purpose,
            method: chunk.file.map_or(AttemptMethod::SendMessage, |file| upload_method(file.kind)),
            target_message_id: None,
            chat_id: target.chat_id,
            thread_id,
            reply_to_message_id: target.reply_to_message_id,
            chunk_index: chunk.index,
            chunk_count: chunk.count,
            text: chunk.text,
        };
        let mut params = json!({ "chat_id": target.chat_id, "text": chunk.text });
        if let Some(reply_to) = target.reply_to_message_id {
            params["reply_parameters"] = json!({"message_id": reply_to, "allow_sending_without_reply": true});
        }
        if let Some(thread_id) = thread_id {
            params["message_thread_id"] = json!(thread_id);
        }
        if chunk.html {
            params["parse_mode"] = json!("HTML");
        }
        let method = chunk.file.map_or("sendMessage", |file| file.kind.method());
        let call = Call { method, params: &params, read: &classify, file: chunk.file };
        let observed = self.attempt_call(&attempt, &target.trace_id, call, turn).await?;
        // A confirmed send is per-message chatter (the reply's `reply delivered` line says
        // it); any other outcome names its op id for whoever reconciles it.
        if matches!(observed, Observed::Sent { .. }) {
            tracing::debug!(trace_id = %target.trace_id, chunk = chunk.index + 1, of = chunk.count, outcome = outcome_label(&observed), "send attempt");
        } else {
            tracing::info!(trace_id = %target.trace_id, chunk = chunk.index + 1, of = chunk.count, outcome = outcome_label(&observed), "send attempt");
        }
        Ok(observed)
    }

    /// The steps of every attempt, its `turn` taken already: recorded (with its
    /// admission) before the request, the request made at once, its outcome recorded
    /// after. A ledger that cannot record the attempt means nothing is sent; a ledger that
    /// cannot record the outcome is tried again until it can, or until the daemon stops —
    /// then the attempt stays `in_flight` and start-up recovery makes it `unknown`, which
    /// is what the caller is told here too.
    async fn attempt_call(
        &self,
        attempt: &NewAttempt<'_>,
        trace_id: &str,
        call: Call<'_>,
        mut turn: Turn<'_>,
    ) -> Result<Observed, Refusal> {
        let op_id = match self.ledger.begin_attempt(attempt).await {
            Ok(Ok(op_id)) => op_id,
            Ok(Err(refusal)) => {
                // A change to the task landed after the action was decided (DESIGN.md §11).
                tracing::warn!(%trace_id, code = refusal.code(), method = call.method, "refused at the moment of sending: {refusal}");
                return Err(refusal);
            }
            Err(e) => {
                tracing::error!(%trace_id, error = %e, method = call.method, "could not record an attempt: not sending");
                return Ok(Observed::NotSent {
                    error: format!("the switchboard ledger could not record the send ({e})"),
                    retry_after: None,
                    migrated_to: None,
                });
            }
        };
        // The attempt is recorded: the request leaves now, with no wait between (the
        // budget's was before the record), and counts in the budget from its answer. Not
        // cut short by shutdown: the attempt goes out either way.
        let started = std::time::Instant::now();
        let observed = if self.still_leads() {
            turn.leave();
            let exchange = match call.file {
                None => self.api.call(call.method, call.params).await,
                Some(file) => self.upload(file, call.params).await,
            };
            drop(turn);
            let observed = (call.read)(&exchange);
            if let Some(kind) = error_kind(&exchange, &observed) {
                metrics::bot_api_error(call.method, kind);
            }
            observed
        } else {
            drop(turn);
            Observed::NotSent { error: NO_LONGER_LEADS.to_owned(), retry_after: None, migrated_to: None }
        };
        let elapsed = started.elapsed();
        let outcome = match &observed {
            Observed::Sent { message_id } => AttemptOutcome::Sent { message_id: *message_id },
            Observed::NotSent { error, .. } => AttemptOutcome::NotSent { error: error.clone() },
            Observed::Unknown { error } => AttemptOutcome::Unknown { error: error.clone() },
        };
        let actor = format!("agent:{}", attempt.agent);
        let mut retry = Backoff::new(LEDGER_RETRY_FIRST, LEDGER_RETRY_CAP);
        loop {
            match self.ledger.finish_attempt(&op_id, &outcome, &actor).await {
                Ok(FinishedAttempt::Recorded) => break,
                Ok(FinishedAttempt::AlreadySettled(settled)) => {
                    // Recovery settled it while the request was out: on PostgreSQL, the
                    // replica that took over from this one. Its word stands, so the agent
                    // hears what the ledger says and an operator reconciles it.
                    tracing::warn!(
                        %trace_id, %op_id, learned = outcome_label(&observed), settled = settled.as_str(),
                        "a send's outcome came after recovery had settled it: the ledger's outcome stands"
                    );
                    return Ok(Observed::Unknown {
                        error: format!(
                            "this send was settled as {} while it was on its way (another replica took over); \
                             an operator reconciles it",
                            settled.as_str()
                        ),
                    });
                }
                Err(e) => {
                    tracing::error!(%trace_id, %op_id, error = %e, "could not record an attempt's outcome; trying again");
                    if !self.wait(retry.next_delay()).await {
                        return Ok(Observed::Unknown {
                            error: format!(
                                "the daemon stopped before it could record this send's outcome ({e})"
                            ),
                        });
                    }
                }
            }
        }
        metrics::attempt_finished(outcome.state(), elapsed);
        if !matches!(observed, Observed::Sent { .. }) {
            tracing::info!(%trace_id, %op_id, method = call.method, outcome = outcome_label(&observed), "attempt");
        }
        Ok(observed)
    }
}

/// Why a request was not made by a replica whose tenure ended while it waited.
const NO_LONGER_LEADS: &str = "this replica's lease ended before the request left (it was paused, or lost the database): nothing was sent";

/// One Bot API request of an attempt, and how its exchange is read.
struct Call<'a> {
    method: &'static str,
    params: &'a serde_json::Value,
    read: &'a (dyn Fn(&Exchange) -> Observed + Sync),
    /// The staged file a `send_photo`, `send_document`… uploads; `None` for every other call.
    file: Option<&'a PlannedFile>,
}

impl Outbound {
    /// Sends a staged file with the thread and reply parameters of a text part. A staged
    /// file that cannot be opened provably did not go out.
    async fn upload(&self, file: &PlannedFile, params: &serde_json::Value) -> Exchange {
        let Some(files) = &self.files else {
            return Exchange::NotConnected("this daemon was built without file uploads".into());
        };
        let staged = match tokio::fs::File::open(&file.path).await {
            Ok(staged) => staged,
            Err(e) => {
                return Exchange::NotConnected(format!("the staged file {} cannot be read: {e}", file.name));
            }
        };
        let mut fields: Vec<(&'static str, String)> = vec![("chat_id", params["chat_id"].to_string())];
        for (name, key) in
            [("reply_parameters", "reply_parameters"), ("message_thread_id", "message_thread_id")]
        {
            if let Some(value) = params.get(key) {
                fields.push((name, value.to_string()));
            }
        }
        files
            .upload(file.kind.method(), &fields, file.kind.field(), file.name.clone(), staged, file.size)
            .await
    }
}

/// A request's turn in Telegram's budget, cleared by the pacer ([`Outbound::clearance`]).
/// [`Turn::leave`] says the request is being made; the turn is dropped once its answer
/// came (or its caller went away meanwhile), which counts the request as made then
/// ([`Pacer::made`]). Dropped before it left (its attempt could not be recorded, this
/// daemon no longer leads, its caller went away), it gives its place back.
struct Turn<'a> {
    pacer: &'a Mutex<Pacer>,
    cleared: Option<Cleared>,
    left: bool,
}

impl Turn<'_> {
    fn leave(&mut self) {
        self.left = true;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let Some(cleared) = self.cleared.take() else { return };
        let mut pacer = lock_pacer(self.pacer);
        if self.left {
            pacer.made(cleared, std::time::Instant::now());
        } else {
            pacer.abandoned(cleared);
        }
    }
}

/// The pacer, whatever a thread that panicked holding it left: its state is counts and
/// times, each change made whole under the lock.
fn lock_pacer(pacer: &Mutex<Pacer>) -> MutexGuard<'_, Pacer> {
    pacer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a request did not get its turn ([`Outbound::take_turn`]): nothing was asked of
/// Telegram.
enum NotMade {
    /// It would have waited longer than its reply may.
    Deferred(Deferred),
    Stopping,
}

impl NotMade {
    /// As a send's outcome.
    fn observed(self) -> Observed {
        match self {
            Self::Deferred(deferred) => held_back(deferred),
            Self::Stopping => stopping(),
        }
    }

    fn reason(self) -> String {
        match self {
            Self::Deferred(deferred) => deferred_reason(deferred),
            Self::Stopping => STOPPING.into(),
        }
    }
}

/// A send not made because it would wait longer than its reply may: nothing was asked of
/// Telegram.
fn held_back(deferred: Deferred) -> Observed {
    let wait = match deferred {
        Deferred::Held(wait) => {
            metrics::rate_limit_wait("sendMessage", wait);
            wait
        }
        Deferred::Queued(wait) => wait,
    };
    Observed::NotSent { error: deferred_reason(deferred), retry_after: Some(wait), migrated_to: None }
}

fn deferred_reason(deferred: Deferred) -> String {
    match deferred {
        Deferred::Held(wait) => format!(
            "rate limited by Telegram for {}s more (an earlier 429 holds this chat); nothing was asked of Telegram",
            wait.as_secs()
        ),
        Deferred::Queued(wait) => format!(
            "too many sends are queued to this chat: Telegram's pace for it would hold this one {}s, longer than a reply waits; nothing was sent",
            wait.as_secs()
        ),
    }
}

/// The wait a `429` answer asks for, whatever the method.
fn retry_after(exchange: &Exchange) -> Option<Duration> {
    match classify_as::<serde_json::Value>(exchange, |_| 0) {
        Observed::NotSent { retry_after, .. } => retry_after,
        _ => None,
    }
}

/// Why a send the daemon's stop cut short was not made.
const STOPPING: &str = "the daemon is stopping; the rest of the reply was not sent";

fn stopping() -> Observed {
    Observed::NotSent { error: STOPPING.into(), retry_after: None, migrated_to: None }
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
    fn a_split_at_a_line_keeps_the_indentation_of_the_next_line() {
        let text = "fn main() {\n    let x = 1;\n\n    println!(\"{x}\");\n}";
        let chunks = split_text(text, 20);
        assert!(chunks.len() > 1, "{chunks:?}");
        assert!(chunks.iter().any(|c| c.starts_with("    ")), "{chunks:?}");
        assert_eq!(chunks.join("\n").replace("\n\n", "\n"), text.replace("\n\n", "\n"));
        assert_eq!(split_text("aaaa   bbbb", 6), ["aaaa", "bbbb"], "between words the spaces go");
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

    fn answered(status: u16, body: &str) -> Exchange {
        Exchange::Answered { status, body: bytes::Bytes::from(body.to_owned()) }
    }

    #[test]
    fn telegram_refusals_are_not_sent_and_everything_after_the_request_left_is_unknown() {
        let sent =
            classify(&answered(200, r#"{"ok":true,"result":{"message_id":77,"date":0,"chat":{"id":1}}}"#));
        assert_eq!(sent, Observed::Sent { message_id: 77 });
        let refused = classify(&answered(
            403,
            r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#,
        ));
        assert!(
            matches!(&refused, Observed::NotSent { retry_after: None, error, .. } if error.contains("blocked")),
            "{refused:?}"
        );
        let limited = classify(&answered(
            429,
            r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#,
        ));
        assert!(
            matches!(limited, Observed::NotSent { retry_after: Some(d), .. } if d == Duration::from_secs(3))
        );
        let migrated = classify(&answered(
            400,
            r#"{"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-100}}"#,
        ));
        assert!(matches!(migrated, Observed::NotSent { migrated_to: Some(-100), .. }));
        assert!(matches!(classify(&Exchange::NotConnected("refused".into())), Observed::NotSent { .. }));

        // A 5xx may come after Telegram posted the message: never "you may send again".
        for body in [
            r#"{"ok":false,"error_code":500,"description":"Internal Server Error"}"#,
            "<html>bad gateway</html>",
        ] {
            assert!(matches!(classify(&answered(502, body)), Observed::Unknown { .. }), "{body}");
        }
        assert!(matches!(classify(&answered(200, "<html>")), Observed::Unknown { .. }));
        assert!(matches!(classify(&answered(200, r#"{"ok":true}"#)), Observed::Unknown { .. }));
        assert!(matches!(classify(&Exchange::NoAnswer("timeout".into())), Observed::Unknown { .. }));
    }

    #[test]
    fn refusals_that_no_retry_changes_are_told_apart() {
        let refused = |description: &str| match classify(&answered(
            400,
            &json!({"ok": false, "error_code": 400, "description": description}).to_string(),
        )) {
            Observed::NotSent { error, .. } => error,
            other => panic!("{other:?}"),
        };
        for lasting in [
            "Forbidden: bot was blocked by the user",
            "Forbidden: bot was kicked from the supergroup chat",
            "Bad Request: chat not found",
            "Bad Request: message thread not found",
            "Bad Request: TOPIC_CLOSED",
            "Bad Request: not enough rights to send text messages to the chat",
        ] {
            assert!(refusal_lasts(&refused(lasting)), "{lasting}");
        }
        for passing in
            ["Bad Request: can't parse entities: Unsupported start tag", "Bad Request: message is too long"]
        {
            assert!(!refusal_lasts(&refused(passing)), "{passing}");
        }
        assert!(!refusal_lasts("could not reach Telegram: chat not found"), "only Telegram's own refusal");
        assert!(!refusal_lasts(STOPPING));
    }

    /// A replica whose tenure ended while a request waited (paused past its lease, say)
    /// makes no request: the replica elected meanwhile answers for the bot now.
    #[tokio::test]
    async fn a_replica_whose_tenure_ended_makes_no_request() {
        let fake = crate::fake_bot_api::FakeTelegram::start().await;
        let dir = tempfile::tempdir().unwrap();
        let ledger = crate::ledger::SqliteLedger::open(&dir.path().join("ledger.db"), Default::default())
            .await
            .unwrap();
        let ledger: Ledger = Arc::new(ledger);
        let bot = Bot::new(crate::fake_bot_api::TEST_TOKEN)
            .set_api_url(reqwest::Url::parse(&fake.api_url()).unwrap());
        let now = std::time::Instant::now();
        let (tenure, leads_until) = tokio::sync::watch::channel(now + Duration::from_secs(60));
        let outbound = Outbound::new(bot.clone(), ledger, Pacer::default(), CancellationToken::new())
            .leading_until(leads_until);
        let api = BotApi::from_bot(&bot);
        let prompt = |text: &str| json!({"chat_id": 42, "text": text});

        assert!(outbound.call_paced(&api, 42, "sendMessage", &prompt("while leading")).await.is_ok());
        tenure.send_replace(std::time::Instant::now());
        let refused = outbound.call_paced(&api, 42, "sendMessage", &prompt("after")).await.unwrap_err();
        assert!(refused.contains("nothing was sent"), "{refused}");
        let sent: Vec<String> = fake.sent_messages().into_iter().map(|sent| sent.text).collect();
        assert_eq!(sent, ["while leading"]);
    }
}
