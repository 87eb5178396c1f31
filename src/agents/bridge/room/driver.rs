//! The room driver: one task that runs every room's exchanges (DESIGN.md §10).
//!
//! Each pass ([`RoomDriver::pass`]) reads facts from the ledger and applies the steps they
//! call for, each in one transaction with what it causes:
//!
//! 1. the room inbox: a human message becomes a `waiting` cascade, a `/stop` stops the
//!    room's running exchange (or says why it cannot);
//! 2. every busy room: a waiting exchange starts when the room is free; the current
//!    speaker's turn ends when its envelope says so (a confirmed or unknown reply, an ack)
//!    or its time is up; then the next speaker gets a `room_turn` envelope, or the
//!    exchange is over and its outcome is recorded with the post that tells the room;
//! 3. posts owed to rooms go out, one at a time per room, each as an ordinary attempt.
//!
//! Nothing is kept in memory that the ledger does not also say, so after a restart the
//! first pass simply carries on: the open turn's envelope is redelivered by the session
//! like any pending envelope, its timer counts from the stored turn start, and a post
//! whose attempt exists is never made again.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Rooms;
use crate::agents::api::wire::DeliveredNotice;
use crate::agents::bridge::Bridge;
use crate::backoff::Backoff;
use crate::clock::now_text;
use crate::config::{RoomLimits, RoomSettings};
use crate::ids::{AgentName, CascadeId, RouteName, TraceId};
use crate::ledger::{
    AttemptPurpose, CascadeUpdate, EnvelopeKind, EnvelopeState, NewCascade, NewPost, ReplyVerdict, RoomStep,
    StoredCascade, StoredEnvelope, StoredPost, StoredTurn, TurnClose, TurnEnding, TurnOpen,
};
use crate::rules::turns::{
    Cascade, CascadeState, HumanMessage, Next, Outcome, RoomInput, RoomMember, RoomRoster, Stopping, TurnEnd,
    room_input,
};
use crate::telegram::bot_api::{Answer, BotApi, Exchange};
use crate::telegram::outbound::{DeliveryOutcome, ReplyPlan, ReplyTarget, TELEGRAM_TEXT_LIMIT, split_text};

/// Steps one room may take in one pass. A live exchange takes one or two; the cap only
/// stops a guard that keeps failing from spinning the driver.
const MAX_STEPS_PER_ROOM: usize = 64;

/// With rooms configured and nothing scheduled, a pass still runs this often: a safety net
/// under the bell, which is cheap because a pass over idle rooms is two small queries.
/// With no room configured there is nothing for it to catch (a room message comes through
/// intake, which rings the bell, and a reload that adds rooms rings it too), so an idle
/// daemon without rooms waits for the bell alone.
const IDLE_RECHECK: Duration = Duration::from_secs(30);

/// After a failed pass (a busy or failing ledger), the next one waits this long, doubling.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_CAP: Duration = Duration::from_secs(10);

/// The attempts of the switchboard's own room posts carry this agent name.
const POSTER: &str = "switchboard";

/// Who stops the exchanges of a route that is no room in the configuration the daemon
/// started with, as the ledger and the room's outcome post name them.
const STOPPED_BY_GONE_ROOM: &str = "the switchboard (this chat is no room any more)";

/// What the room is told when its exchanges stop because it is no room any more.
const GONE_ROOM: &str = "This chat is no room any more";

/// What the current speaker's turn comes to, from the facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Its reply was posted (or may have been: an unknown outcome): the turn is over.
    Replied,
    /// It acked its turn envelope: it passes.
    Passed,
    /// Its reply is claimed and its envelope still pending: being posted, or the post
    /// died with its delivery (the driver checks which).
    Posting,
    /// Neither a reply nor an ack in time: it loses the floor.
    TimedOut,
    /// Nothing yet: look again by then.
    WaitUntil(DateTime<Utc>),
}

/// Judges the open turn from its envelope's state, whether a reply is claimed, when the
/// turn started and how long a speaker has. Pure.
pub(crate) fn judge_turn(
    envelope: EnvelopeState,
    claimed: bool,
    started_at: DateTime<Utc>,
    timeout: Duration,
    now: DateTime<Utc>,
) -> Judgement {
    match (envelope, claimed) {
        // A confirmed post acks the envelope; an unknown one makes it unresolved. Either
        // way the words are out (or may be), and nothing more is sent for this turn.
        (EnvelopeState::Acked | EnvelopeState::Unresolved, true) => Judgement::Replied,
        (EnvelopeState::Pending | EnvelopeState::Queued, true) => Judgement::Posting,
        (EnvelopeState::Pending | EnvelopeState::Queued, false) => {
            let deadline = started_at + chrono::Duration::from_std(timeout).unwrap_or(chrono::TimeDelta::MAX);
            if now >= deadline { Judgement::TimedOut } else { Judgement::WaitUntil(deadline) }
        }
        // Acked without a reply: a pass. Nothing else can happen to a room_turn envelope
        // without a reply; should it, the speaker has had its turn.
        _ => Judgement::Passed,
    }
}

/// What became of a turn's claimed reply whose envelope is still pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimedReply {
    /// Its delivery runs.
    Delivering,
    /// Nothing of it was posted and no delivery runs: the speaker has its turn back.
    Released,
    /// Its delivery ended after part of it was posted: it may be resumed, not replaced.
    CutOff,
}

/// Who this bot is, from `getMe`.
#[derive(Debug, Deserialize)]
struct Me {
    username: Option<String>,
    can_read_all_group_messages: Option<bool>,
}

/// How soon `getMe` is asked again after it failed, doubling up to the cap.
const IDENTIFY_RETRY_FIRST: Duration = Duration::from_secs(1);
const IDENTIFY_RETRY_CAP: Duration = Duration::from_secs(60);

/// Asks Telegram who this bot is until it answers (or the daemon stops): its username,
/// and whether it can see ordinary group messages at all. Until it is known, a command
/// addressed as `/stop@NAME` or `/pause@NAME` counts as ours whatever NAME is and every
/// message of a mention_only route as addressed to the bot (fail-open: nothing meant for
/// it is dropped), so that window is kept as short as Telegram allows: one failure (a
/// network hiccup at boot, a 5xx, a 429) is retried, not kept for the whole run.
async fn identify_until_known(api: BotApi, bridge: Bridge, shutdown: CancellationToken) {
    let mut retry = Backoff::new(IDENTIFY_RETRY_FIRST, IDENTIFY_RETRY_CAP);
    let mut failures = 0u32;
    let no_arguments = json!({});
    loop {
        let exchange = tokio::select! {
            exchange = api.call("getMe", &no_arguments) => exchange,
            () = shutdown.cancelled() => return,
        };
        let me = match &exchange {
            Exchange::Answered { body, .. } => {
                serde_json::from_slice::<Answer<Me>>(body).ok().and_then(|a| a.result)
            }
            _ => None,
        };
        if let Some(me) = me {
            if failures > 0 {
                tracing::info!(failures, "Telegram answered getMe after {failures} failed attempt(s)");
            }
            take_identity(&bridge, me);
            return;
        }
        let delay = retry.next_delay();
        failures += 1;
        if failures == 1 {
            tracing::warn!(
                retry_in_ms = delay.as_millis() as u64,
                "could not ask Telegram who this bot is (getMe): until it answers, a command addressed as \
                 /stop@NAME or /pause@NAME counts as ours whatever NAME is, and every message of a mention_only \
                 route as said to the bot; asking again"
            );
        } else {
            tracing::debug!(failures, retry_in_ms = delay.as_millis() as u64, "getMe failed again");
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

fn take_identity(bridge: &Bridge, me: Me) {
    let name = me.username.clone().unwrap_or_default();
    if me.can_read_all_group_messages == Some(false) && !bridge.rooms().is_empty() {
        tracing::warn!(
            bot = %name,
            "privacy mode is on for @{name}: in a group it only sees commands meant for it and replies to its own messages, unless it is an admin there, so ordinary room messages never arrive. Group rooms need to see every message: turn privacy mode off (@BotFather, /setprivacy, Disable; then remove the bot from the group and add it again) or make the bot an admin of each room's group"
        );
    }
    if let Some(username) = me.username {
        tracing::info!(bot = %username, "this bot is @{username} (getMe)");
        bridge.set_bot_username(username);
    }
}

/// Runs the rooms. Built by [`Bridge::room_driver`]; [`RoomDriver::run`] is its loop.
pub struct RoomDriver {
    bridge: Bridge,
    /// For `getMe`: this bot's username tells `/stop@thisbot` from `/stop@otherbot`.
    api: BotApi,
    /// Conversations (chat and topic) with a post on its way: one at a time in each, so
    /// they arrive in order, and a post retried in one chat (a user who blocked the bot)
    /// holds back no other chat's.
    posting: Arc<Mutex<HashSet<PostedIn>>>,
    /// Exchanges whose stored state cannot be read, reported once each.
    reported_damaged: HashSet<CascadeId>,
}

impl Bridge {
    /// The room driver for this bridge; `api` reaches the bot (for `getMe`).
    pub fn room_driver(&self, api: BotApi) -> RoomDriver {
        RoomDriver { bridge: self.clone(), api, posting: Arc::default(), reported_damaged: HashSet::new() }
    }
}

/// How long after a pass the next one runs unrung, given the wait the pass asked for (a
/// speaker's time running out): at most [`IDLE_RECHECK`] while rooms are configured, and
/// never (`None`: the bell alone) with none configured and nothing scheduled.
fn next_pass(scheduled: Option<Duration>, rooms_configured: bool) -> Option<Duration> {
    match scheduled {
        Some(wait) => Some(wait.min(IDLE_RECHECK)),
        None if rooms_configured => Some(IDLE_RECHECK),
        None => None,
    }
}

impl RoomDriver {
    /// Runs passes until `shutdown`: at once (resuming whatever a previous daemon left),
    /// then whenever the bell rings, a speaker's time runs out, or (with rooms configured)
    /// [`IDLE_RECHECK`] passes.
    /// Failures are logged and retried; they never stop the daemon, and nothing is lost
    /// meanwhile (room messages wait in the ledger).
    pub async fn run(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        // The bot's username tells `/stop@thisbot` (rooms), `/pause@thisbot` (tasks) and a
        // mention (mention_only) from what is for another bot: asked until Telegram answers,
        // beside the passes, which go on meanwhile.
        tokio::spawn(identify_until_known(self.api.clone(), self.bridge.clone(), shutdown.clone()));
        let mut retry = Backoff::new(RETRY_FIRST, RETRY_CAP);
        loop {
            let wait = match self.pass().await {
                Ok(next) => {
                    retry.reset();
                    next_pass(next, !self.bridge.rooms().is_empty())
                }
                Err(e) => {
                    let delay = retry.next_delay();
                    tracing::error!(
                        error = format!("{e:#}"),
                        retry_in_ms = delay.as_millis() as u64,
                        "room driver: a pass failed; retrying"
                    );
                    Some(delay)
                }
            };
            tokio::select! {
                () = self.bridge.inner.rooms.wake.notified() => {}
                () = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {}
                () = shutdown.cancelled() => break,
            }
        }
        tracing::debug!("room driver stopped");
        Ok(())
    }

    /// One pass over the inbox, the busy rooms and the owed posts. Returns how long until a
    /// speaker's time runs out, if one is waited for. A room whose step fails does not hold
    /// up the others: the pass carries on and then reports the first failure (the run loop
    /// retries with backoff). The inbox stops at a message that cannot be taken, so room
    /// messages are never taken out of order.
    pub async fn pass(&mut self) -> anyhow::Result<Option<Duration>> {
        let ledger = self.bridge.inner.ledger.clone();
        let rooms = self.bridge.rooms();
        let mut next: Option<Duration> = None;
        let mut failure: Option<anyhow::Error> = None;
        for envelope in ledger.room_inbox().await.context("reading the room inbox")? {
            let route = envelope.route.clone().unwrap_or_default();
            if let Err(e) = self.take(&rooms, &envelope).await {
                failure = Some(e.context(format!("taking {} in room '{route}'", envelope.trace_id)));
                break;
            }
            // Before the next message: a `/stop` right after a message stops its exchange.
            match self.advance(&rooms, &route).await {
                Ok(wait) => earliest(&mut next, wait),
                Err(e) => {
                    failure.get_or_insert(e.context(format!("moving room '{route}' on")));
                }
            }
        }
        let busy = ledger.busy_rooms().await.context("reading the busy rooms")?;
        for route in &busy {
            match self.advance(&rooms, route).await {
                Ok(wait) => earliest(&mut next, wait),
                Err(e) => {
                    failure.get_or_insert(e.context(format!("moving room '{route}' on")));
                }
            }
        }
        self.bridge.forget_finished_retired_rooms(&busy);
        if let Err(e) = self.post_owed().await {
            failure.get_or_insert(e);
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(next),
        }
    }

    fn room<'r>(rooms: &'r Rooms, route: &str) -> Option<&'r RoomSettings> {
        RouteName::parse(route).ok().and_then(|name| rooms.get(&name))
    }

    // ---- the inbox ----

    /// Takes one room message or command out of the inbox.
    async fn take(&mut self, rooms: &Rooms, envelope: &StoredEnvelope) -> anyhow::Result<()> {
        let span = tracing::info_span!("envelope", trace_id = %envelope.trace_id);
        self.take_in_span(rooms, envelope).instrument(span).await
    }

    async fn take_in_span(&mut self, rooms: &Rooms, envelope: &StoredEnvelope) -> anyhow::Result<()> {
        let route = envelope.route.clone().unwrap_or_default();
        let Some(room) = RouteName::parse(&route).ok().and_then(|name| rooms.get(&name)) else {
            return self
                .settle(envelope, format!("route '{route}' is no room (any more): nothing to do"))
                .await;
        };
        if envelope.kind == EnvelopeKind::EditedMessage {
            return self
                .settle(envelope, "an edit in a room starts no exchange and changes none".into())
                .await;
        }
        let text = envelope.text.as_deref().unwrap_or_default();
        match room_input(text, self.bridge.bot_username().as_deref()) {
            RoomInput::Stop => self.stop(room, envelope).await,
            RoomInput::ForAnotherBot(bot) => {
                let note = format!("a command for @{bot}, not for this bot");
                self.settle(envelope, note).await
            }
            RoomInput::Message => self.record(room, envelope).await,
        }
    }

    /// Leaves an inbox envelope that asks nothing of the room.
    async fn settle(&self, envelope: &StoredEnvelope, note: String) -> anyhow::Result<()> {
        tracing::info!(note = %note, "room message needs nothing");
        let step = RoomStep { settle: Some((envelope, note)), ..RoomStep::default() };
        self.bridge
            .inner
            .ledger
            .apply_room_step(&step, Utc::now())
            .await
            .context("settling a room message")?;
        Ok(())
    }

    /// A human message: its exchange waits for the room (and starts at once if it is free).
    async fn record(&self, room: &RoomSettings, envelope: &StoredEnvelope) -> anyhow::Result<()> {
        let message = HumanMessage {
            author: envelope.user(),
            text: envelope.content.clone(),
            trace_id: TraceId::parse(&envelope.trace_id).map_err(anyhow::Error::msg)?,
        };
        let cascade = Cascade::start(&room.roster, message, room.limits.cascade_limit);
        let seeded: Vec<&str> = cascade.queue().iter().map(|q| q.agent.as_str()).collect();
        let new = NewCascade {
            message: envelope,
            cascade: &cascade,
            max_iters: room.limits.max_iters,
            speaker_timeout_secs: room.limits.speaker_timeout.as_secs(),
        };
        let recorded = self
            .bridge
            .inner
            .ledger
            .record_cascade(&new, "room message: exchange {cascade}")
            .await
            .context("recording a room exchange")?;
        if let Some(cascade_id) = recorded {
            tracing::info!(route = %room.route, %cascade_id, ?seeded, "room message recorded as an exchange");
        }
        Ok(())
    }

    /// `/stop`: the room's running exchange ends before its next speaker.
    async fn stop(&self, room: &RoomSettings, envelope: &StoredEnvelope) -> anyhow::Result<()> {
        let ledger = &self.bridge.inner.ledger;
        let by = envelope.user();
        let Some(stored) = ledger.active_cascade(room.route.as_str()).await? else {
            tracing::info!(%by, route = %room.route, "/stop with nothing running");
            let text = "Nothing is running in this room: there is no exchange to stop.";
            return self.answer_stop(envelope, "/stop: nothing was running".into(), text.into()).await;
        };
        let mut cascade = match stored.cascade() {
            Ok(cascade) => cascade,
            Err(e) => {
                // `advance` reports the damaged exchange; the stop is answered, not lost.
                tracing::error!(cascade_id = %stored.cascade_id, error = %e, "/stop: the running exchange cannot be read");
                let text = format!(
                    "The running exchange ({}) cannot be read, so it cannot be stopped from here; an operator must \
                     look at it with `switchboard ledger show {}`.",
                    stored.cascade_id, stored.cascade_id
                );
                let note = format!("/stop: {} cannot be read: {e}", stored.cascade_id);
                return self.answer_stop(envelope, note, text).await;
            }
        };
        let at = now_text();
        let stopping = match cascade.stop(by.clone(), at) {
            Ok(stopping) => stopping,
            Err(refused) => {
                tracing::info!(%by, cascade_id = %stored.cascade_id, "/stop changed nothing: {refused}");
                let text = format!("{}.", capitalised(&refused.to_string()));
                return self.answer_stop(envelope, format!("/stop changed nothing: {refused}"), text).await;
            }
        };
        let message = self.message_of(&stored).await?;
        let mut update = CascadeUpdate {
            id: stored.id,
            decided_on: stored.version,
            cascade: &cascade,
            stop_by: Some(&by),
            outcome: None,
        };
        let note = format!("/stop: {} stopped", stored.cascade_id);
        // A /stop ends the running exchange only: messages that came before it and wait for
        // exchanges of their own start next, and the post says so rather than promising quiet.
        let waiting = match ledger.waiting_cascades(room.route.as_str()).await? {
            0 => String::new(),
            1 => {
                " One earlier message waits for its own exchange, which starts next; /stop again to stop it."
                    .into()
            }
            n => format!(
                " {n} earlier messages wait for exchanges of their own, which start next, one at a time."
            ),
        };
        let (post, current) = match &stopping {
            Stopping::Requested { current } => {
                let still = cascade.stop_record().map(|s| labels(room, &s.still_queued)).unwrap_or_default();
                let queued =
                    if still.is_empty() { String::new() } else { format!(" (still queued: {still})") };
                let text = format!(
                    "Stopping: {by} asked to stop. {} may finish its turn; nobody else will speak in this \
                     exchange{queued}.{waiting}",
                    room.roster.label(&current.agent)
                );
                (stop_post(envelope, text), Some(current))
            }
            Stopping::Stopped(report) => {
                let text = format!("{}{waiting}", report.render(&room.roster));
                let outcome = Outcome::Stopped(report.clone());
                update.outcome = Some((outcome, Some(text.clone())));
                (NewPost { key: format!("{}/outcome", stored.cascade_id), answers: &message, text }, None)
            }
        };
        let step = RoomStep {
            cascade: Some(update),
            posts: vec![post],
            settle: Some((envelope, note)),
            ..RoomStep::default()
        };
        if ledger.apply_room_step(&step, Utc::now()).await?.is_none() {
            // Only this driver writes exchanges, so this is not expected. The /stop stays in
            // the inbox, and the inbox stops here so that nothing behind it overtakes it.
            anyhow::bail!(
                "{} changed while a /stop was applied to it; taking the /stop again",
                stored.cascade_id
            );
        }
        tracing::info!(%by, cascade_id = %stored.cascade_id, state = %cascade.state(), "room exchange stopped");
        if let Some(current) = current
            && let Some(turn) =
                ledger.turns_of(stored.id).await?.into_iter().find(|t| t.speaker() == current.speaker)
        {
            let why = format!("{by} sent /stop in room {}", room.route);
            self.send_stop_notice(&stored, &turn, &by, &why);
        }
        Ok(())
    }

    /// Answers a `/stop` that stops nothing, and settles it.
    async fn answer_stop(&self, envelope: &StoredEnvelope, note: String, text: String) -> anyhow::Result<()> {
        let step = RoomStep {
            settle: Some((envelope, note)),
            posts: vec![stop_post(envelope, text)],
            ..RoomStep::default()
        };
        self.bridge.inner.ledger.apply_room_step(&step, Utc::now()).await?;
        Ok(())
    }

    /// Tells the speaker holding the floor that its exchange ends with its turn (`why`).
    fn send_stop_notice(&self, stored: &StoredCascade, turn: &StoredTurn, by: &str, why: &str) {
        let Ok(agent) = AgentName::parse(&turn.agent) else { return };
        let content = format!(
            "{why}: this exchange ends with your turn (speaker {}). You may still finish your \
             reply to {} — it is posted, but mentions in it queue nobody — or ack it to pass.",
            turn.speaker, turn.envelope_trace_id
        );
        let extra = BTreeMap::from([
            ("cascade_id".to_owned(), stored.cascade_id.to_string()),
            ("stopped_by".to_owned(), by.to_owned()),
            ("route".to_owned(), stored.route.clone()),
            ("speaker".to_owned(), turn.speaker.to_string()),
        ]);
        let notice = DeliveredNotice {
            trace_id: turn.envelope_trace_id.to_string(),
            kind: "stop".into(),
            content,
            ts: now_text(),
            extra,
        };
        self.bridge.notify(&agent, notice);
    }

    // ---- a room's exchange ----

    /// Takes the room's steps until it waits for someone. Returns how long until the
    /// current speaker's time runs out, if it is waited for.
    async fn advance(&mut self, rooms: &Rooms, route: &str) -> anyhow::Result<Option<Duration>> {
        let ledger = self.bridge.inner.ledger.clone();
        let gone = Self::room(rooms, route).is_none();
        if gone {
            self.stop_exchanges_of_gone_room(route).await?;
        }
        for _ in 0..MAX_STEPS_PER_ROOM {
            let stored = match ledger.active_cascade(route).await? {
                Some(active) => active,
                None => match ledger.next_waiting_cascade(route).await? {
                    Some(waiting) => waiting,
                    None => return Ok(None),
                },
            };
            let cascade = match stored.cascade() {
                Ok(cascade) => cascade,
                Err(e) => {
                    if self.reported_damaged.insert(stored.cascade_id.clone()) {
                        tracing::error!(cascade_id = %stored.cascade_id, route, error = %e, "a stored exchange cannot be read: its room stands still (other rooms go on) until an operator repairs it");
                    }
                    return Ok(None);
                }
            };
            let room = match Self::room(rooms, route) {
                Some(room) => Cow::Borrowed(room),
                // Stopped above: its speaker finishes the turn it has by the usual rules.
                None if gone && cascade.state() != CascadeState::Running => match stand_in(&stored, &cascade)
                {
                    Some(room) => Cow::Owned(room),
                    None => return Ok(None),
                },
                None => return Ok(None),
            };
            let room = room.as_ref();
            let Some(current) = cascade.current() else {
                self.give_floor(room, &stored, cascade).await?;
                continue;
            };
            let turn = ledger.turns_of(stored.id).await?.into_iter().find(|t| t.speaker() == current.speaker);
            let Some(turn) = turn else {
                tracing::error!(cascade_id = %stored.cascade_id, speaker = current.speaker, "a cascade's open turn has no turn row: its room is stuck until an operator repairs it");
                return Ok(None);
            };
            let started = turn.started_at;
            let timeout = Duration::from_secs(u64::try_from(stored.speaker_timeout_secs).unwrap_or(0));
            let now = Utc::now();
            match judge_turn(turn.envelope_state, turn.reply_text.is_some(), started, timeout, now) {
                Judgement::WaitUntil(deadline) => {
                    return Ok(Some((deadline - now).to_std().unwrap_or_default()));
                }
                Judgement::Posting => match self.release_dead_claim(&turn).await? {
                    // Being posted: its outcome rings the bell.
                    ClaimedReply::Delivering => return Ok(None),
                    ClaimedReply::Released => {}
                    // The speaker may resume it within its time; after, what the room saw
                    // is its reply.
                    ClaimedReply::CutOff => {
                        match judge_turn(EnvelopeState::Pending, false, started, timeout, now) {
                            Judgement::WaitUntil(deadline) => {
                                return Ok(Some((deadline - now).to_std().unwrap_or_default()));
                            }
                            _ => {
                                let reason = "its room reply was cut off after part of it was posted, and its turn's time ran out";
                                ledger
                                    .transition(
                                        turn.envelope_id,
                                        &[EnvelopeState::Pending],
                                        EnvelopeState::Acked,
                                        &turn.agent,
                                        Some(reason),
                                    )
                                    .await?;
                                tracing::info!(agent = %turn.agent, trace_id = %turn.envelope_trace_id, "a room reply cut off part-way stands as the speaker's reply: its time ran out");
                            }
                        }
                    }
                },
                Judgement::Replied if !self.reply_went_out(&turn).await? => {
                    // Acked by the speaker after a post that was refused: a pass.
                    self.end_turn(room, &stored, cascade, &turn, TurnEnd::Passed).await?;
                }
                Judgement::Replied => {
                    let end = TurnEnd::Replied {
                        text: turn.reply_text.clone().unwrap_or_default(),
                        trace_id: TraceId::parse(&turn.envelope_trace_id).map_err(anyhow::Error::msg)?,
                    };
                    self.end_turn(room, &stored, cascade, &turn, end).await?;
                }
                Judgement::Passed => self.end_turn(room, &stored, cascade, &turn, TurnEnd::Passed).await?,
                Judgement::TimedOut => {
                    self.end_turn(room, &stored, cascade, &turn, TurnEnd::TimedOut).await?
                }
            }
        }
        tracing::warn!(route, "a room took {MAX_STEPS_PER_ROOM} steps in one pass; carrying on shortly");
        Ok(Some(RETRY_FIRST))
    }

    /// Stops the exchanges of a route that is no room in the configuration the daemon
    /// started with, as a `/stop` would: the running one ends with the turn its speaker
    /// has (finished by the usual rules: a reply, an ack, or its time), those waiting end
    /// unstarted, and the room is told of each. A reload that takes a room away keeps its
    /// settings until its exchanges end; a restart has no such settings (the ledger keeps
    /// no roster), so it cannot answer as the room would, and an exchange left open would
    /// hold its turn, its queue and the messages behind it for good.
    async fn stop_exchanges_of_gone_room(&mut self, route: &str) -> anyhow::Result<()> {
        let ledger = self.bridge.inner.ledger.clone();
        if let Some(active) = ledger.active_cascade(route).await? {
            self.stop_exchange_of_gone_room(route, &active).await?;
        }
        while let Some(waiting) = ledger.next_waiting_cascade(route).await? {
            if !self.stop_exchange_of_gone_room(route, &waiting).await? {
                break;
            }
        }
        Ok(())
    }

    /// Stops one exchange of a route that is no room any more. `false`: it was not stopped
    /// (already stopping, or unreadable, which `advance` reports).
    async fn stop_exchange_of_gone_room(
        &mut self,
        route: &str,
        stored: &StoredCascade,
    ) -> anyhow::Result<bool> {
        let Ok(mut cascade) = stored.cascade() else { return Ok(false) };
        let Ok(stopping) = cascade.stop(STOPPED_BY_GONE_ROOM, now_text()) else { return Ok(false) };
        let names =
            |agents: &[AgentName]| agents.iter().map(AgentName::as_str).collect::<Vec<_>>().join(", ");
        let still = cascade.stop_record().map(|s| names(&s.still_queued)).unwrap_or_default();
        let message = self.message_of(stored).await?;
        let mut update = CascadeUpdate {
            id: stored.id,
            decided_on: stored.version,
            cascade: &cascade,
            stop_by: Some(STOPPED_BY_GONE_ROOM),
            outcome: None,
        };
        let (post, current) = match &stopping {
            Stopping::Requested { current } => {
                let queued =
                    if still.is_empty() { String::new() } else { format!(" (still queued: {still})") };
                let text = format!(
                    "{GONE_ROOM}: {} may finish its turn; nobody else will speak in this exchange{queued}.",
                    current.agent
                );
                (
                    NewPost { key: format!("{}/gone", stored.cascade_id), answers: &message, text },
                    Some(current),
                )
            }
            Stopping::Stopped(report) => {
                let text = if report.turns_used == 0 {
                    format!("{GONE_ROOM}: this message gets no exchange (it asked for {still}).")
                } else if still.is_empty() {
                    format!("{GONE_ROOM}: this exchange ends here.")
                } else {
                    format!("{GONE_ROOM}: this exchange ends here (still queued: {still}).")
                };
                update.outcome = Some((Outcome::Stopped(report.clone()), Some(text.clone())));
                (NewPost { key: format!("{}/outcome", stored.cascade_id), answers: &message, text }, None)
            }
        };
        let step = RoomStep { cascade: Some(update), posts: vec![post], ..RoomStep::default() };
        if self.bridge.inner.ledger.apply_room_step(&step, Utc::now()).await?.is_none() {
            anyhow::bail!("{} changed while it was being stopped; stopping it again", stored.cascade_id);
        }
        match current {
            Some(current) => {
                tracing::info!(route, cascade_id = %stored.cascade_id, speaker = current.speaker, agent = %current.agent, still_queued = %still, "route '{route}' is no room in the configuration the daemon started with: its running exchange is stopped (its speaker may finish its turn; nobody else speaks)");
                let turns = self.bridge.inner.ledger.turns_of(stored.id).await?;
                if let Some(turn) = turns.into_iter().find(|t| t.speaker() == current.speaker) {
                    let why =
                        format!("Route '{route}' is no room in the switchboard's configuration any more");
                    self.send_stop_notice(stored, &turn, STOPPED_BY_GONE_ROOM, &why);
                }
            }
            None => {
                tracing::info!(route, cascade_id = %stored.cascade_id, state = %cascade.state(), still_queued = %still, "route '{route}' is no room in the configuration the daemon started with: its exchange is stopped, nobody else speaks");
            }
        }
        Ok(true)
    }

    /// Whether the turn's claimed reply was posted, or may have been (its attempts say
    /// sent, unknown or in flight), rather than refused before its envelope was acked.
    async fn reply_went_out(&self, turn: &StoredTurn) -> anyhow::Result<bool> {
        let Some(request_id) = &turn.reply_request_id else { return Ok(false) };
        let recorded = self.bridge.inner.ledger.recorded_reply(&turn.agent, request_id).await?;
        Ok(recorded.is_some_and(|reply| {
            !reply.sent.is_empty() || !matches!(reply.verdict, ReplyVerdict::NotSent { .. })
        }))
    }

    /// A claimed reply whose envelope is still pending while no delivery runs for it died
    /// with its delivery (not sent, or the daemon stopped before sending): the speaker
    /// gets its turn back, unless part of the reply was posted (then it may only resume
    /// it). Checked under the agent's decision lock, which a reply holds from its claim
    /// until its delivery is running.
    async fn release_dead_claim(&self, turn: &StoredTurn) -> anyhow::Result<ClaimedReply> {
        let slot = AgentName::parse(&turn.agent).ok().and_then(|agent| self.bridge.inner.agents.get(&agent));
        let _decide = match slot {
            Some(slot) => {
                let decide = slot.decisions.lock().await;
                if slot.running().envelopes.contains(&turn.envelope_id) {
                    return Ok(ClaimedReply::Delivering);
                }
                Some(decide)
            }
            None => None,
        };
        if self.bridge.inner.ledger.release_room_reply(turn.id).await? {
            tracing::info!(agent = %turn.agent, trace_id = %turn.envelope_trace_id, "a room reply that was never posted gave its turn back");
            return Ok(ClaimedReply::Released);
        }
        // Not released with no delivery running: part of it was posted (or the turn moved
        // on meanwhile, which the next look judges afresh).
        Ok(ClaimedReply::CutOff)
    }

    /// Ends the open turn and, in the same step, gives the floor to the next speaker or
    /// records how the exchange ended.
    async fn end_turn(
        &self,
        room: &RoomSettings,
        stored: &StoredCascade,
        mut cascade: Cascade,
        turn: &StoredTurn,
        end: TurnEnd,
    ) -> anyhow::Result<()> {
        let ending = match &end {
            TurnEnd::Replied { .. } => TurnEnding::Replied,
            TurnEnd::Passed => TurnEnding::Passed,
            TurnEnd::TimedOut => TurnEnding::TimedOut,
        };
        let ended = cascade.end_turn(&room.roster, turn.speaker(), end).context("ending a room turn")?;
        tracing::info!(cascade_id = %stored.cascade_id, speaker = turn.speaker, agent = %turn.agent, ending = ending.as_str(), queued = ?ended.queued, "room turn ended");
        let label =
            AgentName::parse(&turn.agent).map(|a| room.roster.label(&a).to_owned()).unwrap_or_default();
        let mut posts = Vec::new();
        let secs = stored.speaker_timeout_secs;
        let reason = format!("speaker timeout: no reply or ack within {secs}s; the floor passed on");
        let message = self.message_of(stored).await?;
        if ending == TurnEnding::TimedOut {
            posts.push(NewPost {
                key: format!("{}/timeout/{}", stored.cascade_id, turn.speaker),
                answers: &message,
                text: format!("{label} did not answer within {secs}s and lost the floor."),
            });
        }
        let close = TurnClose {
            turn,
            ending,
            timed_out: (ending == TurnEnding::TimedOut).then_some(reason.as_str()),
        };
        self.step(room, stored, &message, cascade, Some(close), posts).await
    }

    /// Nobody has the floor: the next speaker gets it, or the exchange is over.
    async fn give_floor(
        &self,
        room: &RoomSettings,
        stored: &StoredCascade,
        cascade: Cascade,
    ) -> anyhow::Result<()> {
        let message = self.message_of(stored).await?;
        self.step(room, stored, &message, cascade, None, Vec::new()).await
    }

    /// Decides what follows the cascade's state and applies it with `close` and `posts`.
    async fn step(
        &self,
        room: &RoomSettings,
        stored: &StoredCascade,
        message: &StoredEnvelope,
        mut cascade: Cascade,
        close: Option<TurnClose<'_>>,
        mut posts: Vec<NewPost<'_>>,
    ) -> anyhow::Result<()> {
        let ledger = &self.bridge.inner.ledger;
        let gone = cascade.leave_out_agents_gone_from(&room.roster);
        if !gone.is_empty() {
            tracing::info!(cascade_id = %stored.cascade_id, ?gone, "agents no longer in the room leave the exchange's queue");
        }
        match cascade.next_speaker() {
            Next::Speak(turn) => {
                let content = cascade.transcript_text(&room.roster);
                let summoned_by = turn.summoned_by.name().to_owned();
                let step = RoomStep {
                    cascade: Some(CascadeUpdate {
                        id: stored.id,
                        decided_on: stored.version,
                        cascade: &cascade,
                        stop_by: None,
                        outcome: None,
                    }),
                    close,
                    open: Some(TurnOpen {
                        speaker: turn.speaker,
                        agent: &turn.agent,
                        summoned_by: &summoned_by,
                        message,
                        content: &content,
                    }),
                    posts,
                    settle: None,
                };
                if let Some(applied) = ledger.apply_room_step(&step, Utc::now()).await? {
                    let trace_id = applied.opened.map(|(_, trace_id)| trace_id).unwrap_or_default();
                    tracing::info!(cascade_id = %stored.cascade_id, speaker = turn.speaker, agent = %turn.agent, %summoned_by, %trace_id, "room: the floor goes to the next speaker");
                    self.bridge.wake(&turn.agent);
                }
            }
            Next::Speaking(turn) => {
                // Only reached with a turn still open, which `advance` judges instead.
                tracing::debug!(cascade_id = %stored.cascade_id, speaker = turn.speaker, "the speaker still has the floor");
            }
            Next::Over(outcome) => {
                let text = match &outcome {
                    Outcome::Completed { .. } => None,
                    Outcome::Stopped(report) => Some(report.render(&room.roster)),
                    Outcome::BudgetExhausted(report) => Some(report.render(&room.roster)),
                };
                if let Some(text) = &text {
                    posts.push(NewPost {
                        key: format!("{}/outcome", stored.cascade_id),
                        answers: message,
                        text: text.clone(),
                    });
                }
                let step = RoomStep {
                    cascade: Some(CascadeUpdate {
                        id: stored.id,
                        decided_on: stored.version,
                        cascade: &cascade,
                        stop_by: None,
                        outcome: Some((outcome, text)),
                    }),
                    close,
                    open: None,
                    posts,
                    settle: None,
                };
                if ledger.apply_room_step(&step, Utc::now()).await?.is_some() {
                    tracing::info!(cascade_id = %stored.cascade_id, state = %cascade.state(), turns = cascade.turns_used(), replies = cascade.replies(), "room exchange over");
                }
            }
        }
        Ok(())
    }

    /// The human message an exchange answers.
    async fn message_of(&self, stored: &StoredCascade) -> anyhow::Result<StoredEnvelope> {
        self.bridge
            .inner
            .ledger
            .find(&stored.message_trace_id)
            .await?
            .with_context(|| format!("the message of {} is missing from the ledger", stored.cascade_id))
    }

    // ---- posts ----

    /// Starts the owed posts: the oldest of each conversation whose previous post is done.
    async fn post_owed(&self) -> anyhow::Result<()> {
        let ledger = &self.bridge.inner.ledger;
        for post in ledger.owed_room_posts().await.context("reading owed room posts")? {
            if !self.posting.lock().unwrap_or_else(|p| p.into_inner()).insert(PostedIn::of(&post)) {
                continue;
            }
            if ledger.room_post_attempted(POSTER, &post.key).await? {
                // Attempted before a restart: made, whatever came of it. Never twice.
                ledger.mark_room_post_made(post.id).await?;
                self.posting.lock().unwrap_or_else(|p| p.into_inner()).remove(&PostedIn::of(&post));
                continue;
            }
            self.spawn_post(post);
        }
        Ok(())
    }

    fn spawn_post(&self, post: StoredPost) {
        let mut parts = split_text(&post.text, TELEGRAM_TEXT_LIMIT);
        parts.truncate(self.bridge.limits().max_reply_parts);
        let plan = ReplyPlan {
            target: ReplyTarget {
                envelope_id: post.envelope_id,
                trace_id: post.envelope_trace_id.clone(),
                agent: POSTER.to_owned(),
                route: post.route.clone(),
                chat_id: post.chat_id,
                thread_id: post.thread_id.and_then(|t| i32::try_from(t).ok()),
                reply_to_message_id: post.reply_to_message_id.and_then(|m| i32::try_from(m).ok()),
            },
            request_id: Some(post.key.clone()),
            // It answers nothing an agent waits on: it settles no envelope.
            purpose: AttemptPurpose::Audit,
            html: false,
            parts,
            already_sent: Vec::new(),
            files: Vec::new(),
        };
        let bridge = self.bridge.clone();
        let posting = Arc::clone(&self.posting);
        self.bridge.inner.tasks.spawn(async move {
            if !deliver_post(&bridge, &post, &plan).await {
                // Stopping with the post still owed: the next start posts it.
                posting.lock().unwrap_or_else(|p| p.into_inner()).remove(&PostedIn::of(&post));
                return;
            }
            let mut retry = Backoff::new(RETRY_FIRST, RETRY_CAP);
            while let Err(e) = bridge.inner.ledger.mark_room_post_made(post.id).await {
                tracing::error!(key = %post.key, error = %e, "could not record a room post as made; trying again");
                tokio::select! {
                    () = tokio::time::sleep(retry.next_delay()) => {}
                    // Its attempt is recorded: the next daemon marks it made without posting.
                    () = bridge.inner.shutdown.cancelled() => break,
                }
            }
            posting.lock().unwrap_or_else(|p| p.into_inner()).remove(&PostedIn::of(&post));
            bridge.wake_rooms();
        });
    }
}

/// The conversation a post goes to: its chat and topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PostedIn {
    chat_id: i64,
    thread_id: Option<i64>,
}

impl PostedIn {
    fn of(post: &StoredPost) -> Self {
        Self { chat_id: post.chat_id, thread_id: post.thread_id }
    }
}

/// How long a post that provably went nowhere (Telegram out of reach, a rate limit longer
/// than a send waits) is tried again, and how far apart the tries are at most. A refusal
/// that will not pass (the bot removed from the group) costs a few requests in that time.
const POST_RETRY_WINDOW: Duration = Duration::from_secs(600);
const POST_RETRY_CAP: Duration = Duration::from_secs(60);

/// Posts `plan`, trying again while nothing of it went out, for [`POST_RETRY_WINDOW`].
/// `false` when the daemon stops first: the post stays owed (its attempts are all
/// `not_sent`, so the next start posts it). A post of which a part went out, or whose
/// outcome is unknown, is never tried again.
async fn deliver_post(bridge: &Bridge, post: &StoredPost, plan: &ReplyPlan) -> bool {
    let started = tokio::time::Instant::now();
    let mut retry = Backoff::new(Duration::from_secs(2), POST_RETRY_CAP);
    loop {
        let outcome = bridge.inner.outbound.deliver(plan).await;
        let went_nowhere = matches!(&outcome, DeliveryOutcome::NotSent { sent, .. } if sent.is_empty());
        if !went_nowhere || started.elapsed() >= POST_RETRY_WINDOW {
            if went_nowhere {
                tracing::warn!(key = %post.key, route = %post.route, ?outcome, "room post given up: Telegram refused it for {}s", POST_RETRY_WINDOW.as_secs());
            } else {
                tracing::info!(key = %post.key, route = %post.route, ?outcome, "room post");
            }
            return true;
        }
        let delay = retry.next_delay();
        tracing::warn!(key = %post.key, route = %post.route, ?outcome, retry_in_ms = delay.as_millis() as u64, "room post not sent; trying again");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = bridge.inner.shutdown.cancelled() => return false,
        }
    }
}

/// The settings an exchange of a route that is no room any more finishes its stopped turn
/// with: its own chat and limits, and as members the agents it names (by name: their
/// display names and aliases were the room's). `None` for an exchange that names nobody.
fn stand_in(stored: &StoredCascade, cascade: &Cascade) -> Option<RoomSettings> {
    let mut members: Vec<RoomMember> = Vec::new();
    let named = cascade.turns().iter().map(|t| &t.agent).chain(cascade.queue().iter().map(|q| &q.agent));
    for agent in named {
        if !members.iter().any(|m| m.name == *agent) {
            members.push(RoomMember::new(agent.clone()));
        }
    }
    Some(RoomSettings {
        route: RouteName::parse(&stored.route).ok()?,
        chat_id: stored.chat_id,
        thread_id: stored.thread_id.and_then(|t| i32::try_from(t).ok()),
        roster: RoomRoster::new(members).ok()?,
        limits: RoomLimits {
            cascade_limit: cascade.cascade_limit(),
            max_iters: u32::try_from(stored.max_iters).unwrap_or(u32::MAX),
            speaker_timeout: Duration::from_secs(u64::try_from(stored.speaker_timeout_secs).unwrap_or(0)),
        },
    })
}

fn earliest(next: &mut Option<Duration>, candidate: Option<Duration>) {
    if let Some(candidate) = candidate {
        *next = Some(next.map_or(candidate, |current| current.min(candidate)));
    }
}

fn labels(room: &RoomSettings, agents: &[AgentName]) -> String {
    agents.iter().map(|a| room.roster.label(a)).collect::<Vec<_>>().join(", ")
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| first.to_uppercase().chain(chars).collect())
}

/// The room's answer to a `/stop`, keyed by it so that it is posted once.
fn stop_post(envelope: &StoredEnvelope, text: String) -> NewPost<'_> {
    NewPost { key: format!("{}/stop", envelope.trace_id), answers: envelope, text }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    const TIMEOUT: Duration = Duration::from_secs(600);

    #[test]
    fn without_rooms_an_idle_driver_waits_for_the_bell_alone() {
        assert_eq!(next_pass(None, false), None, "no room, nothing scheduled: no timer");
        assert_eq!(next_pass(None, true), Some(IDLE_RECHECK), "rooms keep their safety net");
        let soon = Duration::from_secs(3);
        for rooms in [false, true] {
            assert_eq!(next_pass(Some(soon), rooms), Some(soon), "a speaker's time is always kept");
            assert_eq!(next_pass(Some(TIMEOUT), rooms), Some(IDLE_RECHECK));
        }
    }

    #[test]
    fn a_posted_or_possibly_posted_reply_ends_the_turn() {
        for state in [EnvelopeState::Acked, EnvelopeState::Unresolved] {
            assert_eq!(judge_turn(state, true, at(0), TIMEOUT, at(1)), Judgement::Replied, "{state}");
            // Even after the deadline: the reply came in time.
            assert_eq!(judge_turn(state, true, at(0), TIMEOUT, at(10_000)), Judgement::Replied, "{state}");
        }
    }

    #[test]
    fn an_ack_without_a_reply_is_a_pass() {
        assert_eq!(judge_turn(EnvelopeState::Acked, false, at(0), TIMEOUT, at(1)), Judgement::Passed);
    }

    #[test]
    fn a_reply_on_its_way_is_never_timed_out() {
        for state in [EnvelopeState::Pending, EnvelopeState::Queued] {
            assert_eq!(judge_turn(state, true, at(0), TIMEOUT, at(1)), Judgement::Posting);
            assert_eq!(judge_turn(state, true, at(0), TIMEOUT, at(10_000)), Judgement::Posting);
        }
    }

    #[test]
    fn silence_waits_until_the_deadline_counted_from_the_turn_start() {
        for state in [EnvelopeState::Pending, EnvelopeState::Queued] {
            assert_eq!(judge_turn(state, false, at(0), TIMEOUT, at(599)), Judgement::WaitUntil(at(600)));
            assert_eq!(judge_turn(state, false, at(0), TIMEOUT, at(600)), Judgement::TimedOut);
            // A restart long after the turn started: the stored start counts, not the restart.
            assert_eq!(judge_turn(state, false, at(0), TIMEOUT, at(3_600)), Judgement::TimedOut);
        }
    }
}
