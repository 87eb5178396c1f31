//! Intake: what becomes of updates once Telegram has handed them over, however they came
//! (a `getUpdates` batch or a webhook delivery). Each update is decoded on its own (one
//! that cannot be decoded, or makes the decoder panic, is recorded raw as `undecodable`),
//! routed with one snapshot of the routes, and the batch is committed in one ledger
//! transaction, handing the queued envelopes of live sessions over; only then are the
//! agents' bells rung and the task changes and permission answers carried out.
//!
//! The caller says what confirms the batch to Telegram: the poller's next offset, committed
//! with it, or nothing (a webhook's answer, sent once this returns).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::agents::bridge::Bridge;
use crate::agents::permissions::{self, AnswerChat, TextAnswer};
use crate::config::Settings;
use crate::ids::AgentName;
use crate::ledger::{AlbumKey, EnvelopeState, LedgerError};
use crate::ledger::{Ledger, RoutedEnvelope, RoutedReaction};
use crate::operate::metrics;
use crate::rules::albums::{AlbumItem, addressed_by};
use crate::rules::commands::command_for_another_bot;
use crate::rules::permissions::Verdict;
use crate::rules::routes::RoutesTable;
use crate::rules::routes::{Addressing, BotIdentity, Channel, Disposition, dispose, is_addressed, may_react};
use crate::telegram::envelope::{self, ChatType, Inbound};
use crate::telegram::updates::RawUpdate;
use crate::telemetry;

/// What intake routes with: one snapshot per batch.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    pub routes: RoutesTable,
    /// Sender ids allowed to reach an agent; empty means everyone in a routed chat.
    pub allowed_users: Vec<i64>,
    /// Where approvers answer permission prompts by text (DESIGN.md §15): such an answer is
    /// a verdict, not work for an agent.
    pub answer_chats: Vec<AnswerChat>,
}

impl Routing {
    pub fn of(settings: &Settings) -> Self {
        Self {
            routes: settings.routes.clone(),
            allowed_users: settings.telegram.allowed_users.clone(),
            answer_chats: permissions::answer_chats(settings),
        }
    }
}

/// The note of a message kept as an approver's text answer to a permission prompt.
const TEXT_ANSWER_NOTE: &str = "a text answer to a permission prompt";

/// What confirms a batch to Telegram, so that it is not sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// The poller's next `getUpdates` offset, committed in the batch's transaction.
    Offset(i64),
    /// The webhook's answer, given once the batch is committed: no offset moves.
    Answer,
}

/// What one batch came to in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Rows that were new; an update stored before (a re-poll, a redelivery) is not one.
    pub new_envelopes: usize,
}

/// Takes batches of updates into the ledger and on to the agents. Cheap to clone: the
/// poller holds one, and every webhook request a clone.
#[derive(Clone)]
pub struct UpdateIntake {
    /// Telegram's numeric bot id: the key of this bot's offset in the ledger.
    bot_id: i64,
    ledger: Ledger,
    bridge: Bridge,
    /// The routes and the allowlist; a configuration reload replaces them, and each batch
    /// is routed with one snapshot.
    routing: watch::Receiver<Arc<Routing>>,
}

impl UpdateIntake {
    pub fn new(bot_id: i64, ledger: Ledger, bridge: Bridge, routing: watch::Receiver<Arc<Routing>>) -> Self {
        Self { bot_id, ledger, bridge, routing }
    }

    pub fn bot_id(&self) -> i64 {
        self.bot_id
    }

    /// A message shaped as a text answer (`yes abcde`) is one only while a request with that
    /// id waits for an answer in its chat. Any other, "yes merge" or "no abort" in an
    /// approvers' chat that is also an agent's conversation, is routed as the message it is:
    /// taken for an answer, it reached nobody. A ledger that cannot tell keeps it an answer
    /// (the batch then likely fails to commit anyway, and is taken again).
    async fn route_answers_naming_no_request(
        &self,
        batch: &mut [RoutedEnvelope],
        routing: &Routing,
        bot: &BotIdentity,
    ) {
        for row in batch.iter_mut() {
            let Some(answer) = text_answer(row) else { continue };
            match self.ledger.pending_permissions_named(&answer.request_id, answer.chat_id).await {
                Ok(named) if named.is_empty() => {
                    *row = route(row.envelope.clone(), row.update_digest.clone(), routing, bot);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "could not tell whether a text answer names a waiting permission request: taken as an answer");
                }
            }
        }
    }

    /// Decodes, routes and commits `updates` as one batch, confirmed by `confirmation`;
    /// then hands over, rings the bells and carries out what the batch asks for. A ledger
    /// error means nothing of the batch was recorded (and no offset moved).
    pub async fn take(
        &self,
        updates: Vec<RawUpdate>,
        confirmation: Confirmation,
    ) -> Result<Taken, LedgerError> {
        // Presses on the permission prompts' buttons: not envelopes, handled once the batch
        // is committed. One lost to a crash before then is pressed again.
        let presses: Vec<_> =
            updates.iter().filter_map(|raw| permissions::callback_press(&raw.text)).collect();
        let routing = Arc::clone(&self.routing.borrow());
        let bot = Arc::new(BotIdentity { id: self.bot_id, username: self.bridge.bot_username() });
        let ReadBatch { envelopes: mut batch, reactions } =
            read_batch(updates, Arc::clone(&routing), Arc::clone(&bot)).await;
        self.route_answers_naming_no_request(&mut batch, &routing, &bot).await;
        address_albums(&mut batch);
        // Agents with a live session get their envelopes handed over by this commit (see
        // `Bridge::open_inboxes`); the others through the ledger, with a wake-up.
        let bridge = self.bridge.clone();
        let inboxes = bridge.open_inboxes(batch.iter().filter_map(queued_for)).await;
        let handed = inboxes.agents();
        let bot_username = bridge.bot_username();
        let recorded = match confirmation {
            Confirmation::Offset(next_offset) => {
                self.ledger
                    .record_batch_with_reactions(
                        self.bot_id,
                        next_offset,
                        &batch,
                        &reactions,
                        &handed,
                        bot_username.as_deref(),
                    )
                    .await?
            }
            Confirmation::Answer => {
                self.ledger.record_pushed_batch(&batch, &reactions, &handed, bot_username.as_deref()).await?
            }
        };
        let handed: Vec<AgentName> = handed.into_iter().cloned().collect();
        inboxes.hand_over(recorded.claimed);
        let inserted = recorded.inserted;
        let joined = recorded.joined;
        // A line per envelope, written together: a full batch is a hundred.
        telemetry::in_one_write(|| {
            for routed in &inserted {
                log_recorded(routed);
                metrics::envelope_recorded(routed.state);
                match (routed.state, &routed.agent) {
                    (EnvelopeState::Queued, Some(agent)) if !handed.contains(agent) => {
                        self.bridge.wake(agent)
                    }
                    (EnvelopeState::Queued, None) => self.bridge.wake_rooms(),
                    _ => {}
                }
            }
            // Album items recorded before as said to nobody that an item of their album,
            // recorded now or before, addressed to the bot: work now, handed over by the
            // commit or woken for.
            for item in &joined {
                tracing::info!(target: RECORD_LOG_TARGET, trace_id = %item.trace_id, agent = %item.agent, "an item of its album is addressed to the bot: queued for its agent");
                match AgentName::parse(&item.agent) {
                    Ok(agent) if !handed.contains(&agent) => self.bridge.wake(&agent),
                    _ => {}
                }
            }
        });
        // A reaction owed to an agent reaches its session, if one is connected, by its bell.
        for reaction in &recorded.reactions {
            tracing::info!(target: RECORD_LOG_TARGET, trace_id = %reaction.trace_id, agent = %reaction.agent, "reaction recorded");
            if let Ok(agent) = AgentName::parse(&reaction.agent) {
                self.bridge.wake(&agent);
            }
        }
        // Task changes (DESIGN.md §11) are recorded: now the chat and the agents hear of them.
        self.bridge.carry_out(recorded.task_effects);
        let texts = batch.iter().filter_map(text_answer).collect();
        self.bridge.permission_answers(presses, texts);
        Ok(Taken { new_envelopes: inserted.len() })
    }
}

/// From how many updates a batch is read on two threads: decoding is a fifth of intake's
/// time, and a batch's commit cannot start before its last update is read. A single
/// message stays on the runtime's thread, with no hand-over.
const READ_IN_PARALLEL_FROM: usize = 16;

/// The rows a batch of updates becomes, in the batch's order. A large batch's second half
/// is read on a blocking thread meanwhile (see [`READ_IN_PARALLEL_FROM`]).
async fn read_batch(mut updates: Vec<RawUpdate>, routing: Arc<Routing>, bot: Arc<BotIdentity>) -> ReadBatch {
    let read = |updates: &[RawUpdate], routing: &Routing, bot: &BotIdentity| -> ReadBatch {
        let mut batch = ReadBatch::default();
        for raw in updates {
            read_update(raw, routing, bot, &mut batch);
        }
        batch
    };
    if updates.len() < READ_IN_PARALLEL_FROM {
        return read(&updates, &routing, &bot);
    }
    let second_half = updates.split_off(updates.len() / 2);
    let helper = {
        let (routing, bot) = (Arc::clone(&routing), Arc::clone(&bot));
        tokio::task::spawn_blocking(move || read(&second_half, &routing, &bot))
    };
    let mut rows = read(&updates, &routing, &bot);
    match helper.await {
        Ok(more) => {
            rows.envelopes.extend(more.envelopes);
            rows.reactions.extend(more.reactions);
        }
        // A panic reading an update is caught in `envelope::read`; one elsewhere goes on
        // as it would have on this thread.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
    rows
}

/// A batch as the ledger records it: rows of `envelopes`, and reactions (`ledger::reactions`),
/// each in the batch's order.
#[derive(Default)]
struct ReadBatch {
    envelopes: Vec<RoutedEnvelope>,
    reactions: Vec<RoutedReaction>,
}

/// Adds what one update becomes in the ledger, if anything, to `batch`.
fn read_update(raw: &RawUpdate, routing: &Routing, bot: &BotIdentity, batch: &mut ReadBatch) {
    let digest = raw.digest();
    let routed = match envelope::read(raw) {
        Inbound::Envelope(envelope) if is_text_answer(&envelope, routing) => {
            audit_row(*envelope, EnvelopeState::Ignored, digest, TEXT_ANSWER_NOTE.to_owned(), None)
        }
        Inbound::Envelope(envelope) => route(*envelope, digest, routing, bot),
        Inbound::Ignored { envelope, reason } => {
            audit_row(*envelope, EnvelopeState::Ignored, digest, reason, None)
        }
        Inbound::Migrated { envelope, reason, to_chat_id } => {
            report_migration(routing, envelope.update_id, envelope.channel.chat_id, to_chat_id);
            audit_row(*envelope, EnvelopeState::Ignored, digest, reason, None)
        }
        // Whom it reaches, if anyone, intake decides: it knows what the bot sent.
        Inbound::Reaction(reaction) => {
            let sender_rejected =
                !may_react(&routing.routes, &routing.allowed_users, reaction.chat_id, reaction.user_id);
            batch.reactions.push(RoutedReaction {
                reaction: *reaction,
                update_digest: digest,
                sender_rejected,
            });
            return;
        }
        Inbound::NotAMessage { update_id, kind } => {
            tracing::debug!(update_id, kind, "update of a kind switchboard does not route");
            return;
        }
        Inbound::Undecodable { update_id, reason } => {
            let envelope = envelope::undecodable_envelope(raw, update_id);
            audit_row(envelope, EnvelopeState::Undecodable, digest, reason, Some(raw.text.clone()))
        }
    };
    batch.envelopes.push(routed);
}

fn route(
    envelope: envelope::Envelope,
    update_digest: String,
    routing: &Routing,
    bot: &BotIdentity,
) -> RoutedEnvelope {
    // In a group with several bots, `/cmd@other_bot` is the other bot's. A room settles it
    // in its own inbox; an agent's route never makes it the agent's work.
    let for_another_bot = envelope
        .text
        .as_deref()
        .and_then(|text| command_for_another_bot(text, bot.username.as_deref()))
        .map(str::to_owned);
    let (state, route) =
        match dispose(&routing.routes, &routing.allowed_users, envelope.channel, envelope.sender.id) {
            Disposition::Deliver(route) if route.agent().is_some() && for_another_bot.is_some() => {
                let note =
                    format!("a command for @{}, not for this bot", for_another_bot.unwrap_or_default());
                let mut row = audit_row(envelope, EnvelopeState::Ignored, update_digest, note, None);
                row.route = Some(route.name.clone());
                return row;
            }
            Disposition::Deliver(route) if route.mention_only && !addressed_to(&envelope, bot) => {
                let note = format!("not addressed to the bot (route {} is mention_only)", route.name);
                let mut row = audit_row(envelope, EnvelopeState::Ignored, update_digest, note, None);
                row.route = Some(route.name.clone());
                return row;
            }
            Disposition::Deliver(route) => (EnvelopeState::Queued, Some(route)),
            Disposition::Unrouted => (EnvelopeState::Unrouted, None),
            Disposition::Rejected(route) => (EnvelopeState::Rejected, Some(route)),
        };
    // Kept on the row, so `ledger show` says which list to change.
    let note = (state == EnvelopeState::Rejected)
        .then(|| route.map(|r| format!("the sender is not on {}", r.speakers_list())))
        .flatten();
    RoutedEnvelope {
        state,
        route: route.map(|r| r.name.clone()),
        // A room's messages belong to the room, not to one of its agents.
        agent: route.and_then(|r| r.agent().cloned()),
        envelope,
        update_digest,
        note,
        raw_update: None,
    }
}

/// An item of an album not addressed to the bot is when another item of its album in the
/// batch is, before or after it ([`rules::albums`](crate::rules::albums)): it goes to that
/// item's agent. The ledger joins the items of other batches when it records this one.
fn address_albums(batch: &mut [RoutedEnvelope]) {
    let mut albums: HashMap<AlbumKey, Vec<usize>> = HashMap::new();
    for (index, routed) in batch.iter().enumerate() {
        if let Some(album) = routed.album() {
            albums.entry(album).or_default().push(index);
        }
    }
    for items in albums.values().filter(|items| items.len() > 1) {
        let rule: Vec<AlbumItem> = items
            .iter()
            .map(|&index| AlbumItem {
                addressed: !batch[index].unaddressed(),
                sent_at: batch[index].envelope.sent_at,
            })
            .collect();
        for (&index, by) in items.iter().zip(addressed_by(&rule)) {
            let Some(by) = by.filter(|_| batch[index].unaddressed()) else { continue };
            let agent = batch[items[by]].agent.clone();
            let row = &mut batch[index];
            row.state = EnvelopeState::Queued;
            row.agent = agent;
            row.note = None;
        }
    }
}

fn addressed_to(envelope: &envelope::Envelope, bot: &BotIdentity) -> bool {
    let message = Addressing {
        private_chat: envelope.chat_type == ChatType::Private,
        text: envelope.text.as_deref(),
        replies_to: envelope.context.quoted.as_ref().and_then(|quoted| quoted.sender_id),
    };
    is_addressed(&message, bot)
}

fn report_migration(routing: &Routing, update_id: i64, from_chat_id: i64, to_chat_id: i64) {
    let routes: Vec<&str> = routing.routes.routes_for_chat(from_chat_id).map(|r| r.name.as_str()).collect();
    if routes.is_empty() {
        tracing::warn!(
            update_id,
            from_chat_id,
            to_chat_id,
            "chat {from_chat_id} became supergroup {to_chat_id}; no route names it"
        );
    } else {
        // Where the supergroup's messages go until the routes name it: the fallback route
        // takes them, under the global allowlist, not the old route's.
        let meanwhile = match routing.routes.route_for(Channel { chat_id: to_chat_id, thread_id: None }) {
            Some(fallback) => format!(
                "until then its messages go to the fallback route '{}' (agent or room of that route, global \
                 allowed_users)",
                fallback.name
            ),
            None => "until then its messages are kept as unrouted".to_owned(),
        };
        tracing::error!(
            update_id,
            from_chat_id,
            to_chat_id,
            ?routes,
            "chat {from_chat_id} became supergroup {to_chat_id}: change chat_id to {to_chat_id} in route(s) {} and \
             reload (SIGHUP); {meanwhile}",
            routes.join(", ")
        );
    }
}

/// Whether a message is an approver's `yes <id>` / `no <id>` in a relay's chat.
fn is_text_answer(envelope: &envelope::Envelope, routing: &Routing) -> bool {
    !routing.answer_chats.is_empty()
        && envelope.kind == crate::ledger::EnvelopeKind::Message
        && text_answer_of(envelope, routing).is_some()
}

fn text_answer_of(envelope: &envelope::Envelope, routing: &Routing) -> Option<(Verdict, String)> {
    permissions::text_answer(
        &routing.answer_chats,
        envelope.channel.chat_id,
        envelope.channel.thread_id,
        envelope.sender.id?,
        envelope.text.as_deref(),
    )
}

/// The text answer a recorded row holds, if it is one (see [`TEXT_ANSWER_NOTE`]).
fn text_answer(routed: &RoutedEnvelope) -> Option<TextAnswer> {
    if routed.note.as_deref() != Some(TEXT_ANSWER_NOTE) {
        return None;
    }
    let e = &routed.envelope;
    let (verdict, request_id) = crate::rules::permissions::parse_text_verdict(e.text.as_deref()?)?;
    let from_shown = e.sender.username.as_ref().map_or_else(|| e.sender.name.clone(), |u| format!("@{u}"));
    let from = e.sender.id?;
    Some(TextAnswer { verdict, request_id, chat_id: e.channel.chat_id, from, from_shown })
}

/// The agent a row is work for, if it is.
fn queued_for(routed: &RoutedEnvelope) -> Option<&AgentName> {
    routed.agent.as_ref().filter(|_| routed.state == EnvelopeState::Queued)
}

/// A row kept for audit, handed to no agent.
fn audit_row(
    envelope: envelope::Envelope,
    state: EnvelopeState,
    update_digest: String,
    note: String,
    raw_update: Option<String>,
) -> RoutedEnvelope {
    RoutedEnvelope { envelope, state, route: None, agent: None, update_digest, note: Some(note), raw_update }
}

/// The target of the lines that follow each update into the ledger (`envelope recorded`,
/// `recorded as unrouted`, ...): the one they had before intake served the webhook too,
/// since operators' log filters and tools that follow a message by its lines select them
/// by it. A webhook delivery is logged the same way.
const RECORD_LOG_TARGET: &str = "switchboard::telegram::poller";

fn log_recorded(routed: &RoutedEnvelope) {
    let e = &routed.envelope;
    let span = tracing::info_span!(target: RECORD_LOG_TARGET, "envelope", trace_id = %e.trace_id);
    let _entered = span.enter();
    let route = routed.route.as_ref().map(|r| r.as_str()).unwrap_or("-");
    let agent = routed.agent.as_ref().map(|a| a.as_str()).unwrap_or("-");
    match routed.state {
        EnvelopeState::Unrouted => tracing::warn!(
            target: RECORD_LOG_TARGET,
            update_id = e.update_id,
            chat_id = e.channel.chat_id,
            thread_id = e.channel.thread_id,
            "no route matches this chat: recorded as unrouted"
        ),
        EnvelopeState::Rejected => tracing::warn!(
            target: RECORD_LOG_TARGET,
            update_id = e.update_id,
            chat_id = e.channel.chat_id,
            sender_id = e.sender.id,
            route,
            "{}: recorded as rejected",
            routed.note.as_deref().unwrap_or("the sender may not speak on this route")
        ),
        EnvelopeState::Ignored => tracing::info!(
            target: RECORD_LOG_TARGET,
            update_id = e.update_id,
            chat_id = e.channel.chat_id,
            reason = routed.note.as_deref().unwrap_or_default(),
            "no work for an agent: recorded as ignored"
        ),
        EnvelopeState::Undecodable => {
            // The update id only: the raw text carries the message, and the reason may
            // quote it.
            tracing::warn!(
                target: RECORD_LOG_TARGET,
                update_id = e.update_id,
                "undecodable update recorded raw and confirmed (Telegram sent something teloxide could not read): see `switchboard ledger show` for this trace id"
            );
            tracing::debug!(
                target: RECORD_LOG_TARGET,
                reason = routed.note.as_deref().unwrap_or_default(),
                raw = routed.raw_update.as_deref().unwrap_or_default(),
                "undecodable update"
            );
            return;
        }
        _ => tracing::info!(
            target: RECORD_LOG_TARGET,
            update_id = e.update_id,
            chat_id = e.channel.chat_id,
            thread_id = e.channel.thread_id,
            route,
            agent,
            kind = e.kind.as_str(),
            "envelope recorded"
        ),
    }
    tracing::debug!(target: RECORD_LOG_TARGET, text = e.content(), "envelope content");
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ids::{AgentName, RouteName};
    use crate::rules::routes::{Audience, Route, RouteTarget, RoutesTable};

    const DM: i64 = 123_456_789;

    fn routing() -> Arc<Routing> {
        let route = Route {
            name: RouteName::parse("owner-dm").unwrap(),
            target: RouteTarget::Chat { chat_id: DM },
            audience: Audience::Agent(AgentName::parse("a").unwrap()),
            senders: None,
            mention_only: false,
        };
        Arc::new(Routing {
            routes: RoutesTable::new(vec![route]).unwrap(),
            allowed_users: vec![],
            answer_chats: vec![],
        })
    }

    /// Routed, unrouted, undecodable and not-a-message updates, in turn.
    fn updates(count: i64) -> Vec<RawUpdate> {
        (1..=count)
            .map(|id| {
                let chat = if id % 3 == 0 { 42 } else { DM };
                let text = match id % 5 {
                    0 => format!(r#"{{"update_id":{id},"message":"not an object"}}"#),
                    4 => format!(r#"{{"update_id":{id},"poll_answer":{{"poll_id":"p","user":{{"id":1,"is_bot":false,"first_name":"U"}},"option_ids":[]}}}}"#),
                    _ => format!(
                        r#"{{"update_id":{id},"message":{{"message_id":{id},"date":1,"chat":{{"id":{chat},"type":"private","first_name":"U"}},"from":{{"id":{chat},"is_bot":false,"first_name":"U"}},"text":"message {id}"}}}}"#
                    ),
                };
                RawUpdate::new(&text)
            })
            .collect()
    }

    fn summary(rows: &[RoutedEnvelope]) -> Vec<(i64, EnvelopeState, Option<String>)> {
        rows.iter().map(|r| (r.envelope.update_id, r.state, r.envelope.text.clone())).collect()
    }

    #[tokio::test]
    async fn a_batch_read_on_two_threads_is_the_batch_read_in_order() {
        let routing = routing();
        let batch = updates(100);
        let bot = Arc::new(BotIdentity::default());
        let mut one_by_one = ReadBatch::default();
        for raw in &batch {
            read_update(raw, &routing, &bot, &mut one_by_one);
        }
        let one_by_one = one_by_one.envelopes;
        let read = read_batch(batch, Arc::clone(&routing), bot).await.envelopes;
        assert_eq!(summary(&read), summary(&one_by_one));
        // Every kind of row is in it, and the update that is not a message is not.
        let states: Vec<EnvelopeState> = read.iter().map(|r| r.state).collect();
        for state in [EnvelopeState::Queued, EnvelopeState::Unrouted, EnvelopeState::Undecodable] {
            assert!(states.contains(&state), "no {state:?} row in {states:?}");
        }
        assert_eq!(read.len(), 80);
        let ids: Vec<i64> = read.iter().map(|r| r.envelope.update_id).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "out of order: {ids:?}");
    }

    /// `/cmd@other_bot` is another bot's command: no work for the route's agent, whatever
    /// the route; one to this bot, or to none, is the agent's.
    #[test]
    fn a_command_for_another_bot_is_no_agents_work() {
        let routing = routing();
        let bot = Arc::new(BotIdentity { id: 1, username: Some("switchboard_bot".into()) });
        let read = |id: i64, text: &str| {
            let raw = RawUpdate::new(&format!(
                r#"{{"update_id":{id},"message":{{"message_id":{id},"date":1,"chat":{{"id":{DM},"type":"private","first_name":"U"}},"from":{{"id":{DM},"is_bot":false,"first_name":"U"}},"text":"{text}"}}}}"#
            ));
            let mut batch = ReadBatch::default();
            read_update(&raw, &routing, &bot, &mut batch);
            batch.envelopes.remove(0)
        };
        let theirs = read(1, "/status@other_bot");
        assert_eq!(theirs.state, EnvelopeState::Ignored);
        assert!(theirs.note.as_deref().is_some_and(|note| note.contains("@other_bot")), "{:?}", theirs.note);
        for ours in ["/status@Switchboard_Bot", "/status", "status@other_bot"] {
            assert_eq!(read(2, ours).state, EnvelopeState::Queued, "{ours}");
        }
    }

    /// A group whose route is `mention_only`: an album said to the bot by one caption is
    /// work whole, whichever item has it; an album said to nobody, a photo of no album and
    /// an edit stay as they were.
    #[tokio::test]
    async fn an_album_is_addressed_by_the_caption_of_any_of_its_items() {
        const GROUP: i64 = -100_777;
        let route = Route {
            name: RouteName::parse("team").unwrap(),
            target: RouteTarget::Chat { chat_id: GROUP },
            audience: Audience::Agent(AgentName::parse("worker").unwrap()),
            senders: None,
            mention_only: true,
        };
        let routing = Arc::new(Routing {
            routes: RoutesTable::new(vec![route]).unwrap(),
            allowed_users: vec![],
            answer_chats: vec![],
        });
        let bot = Arc::new(BotIdentity { id: 1, username: Some("the_bot".into()) });
        let photo = |id: i64, kind: &str, group: Option<&str>, caption: Option<&str>| {
            let mut message = serde_json::json!({
                "message_id": id, "date": 1_700_000_000,
                "chat": {"id": GROUP, "type": "supergroup", "title": "Team"},
                "from": {"id": 8, "is_bot": false, "first_name": "Mia"},
                "photo": [{"file_id": format!("p{id}"), "file_unique_id": format!("u{id}"), "width": 9, "height": 9}],
            });
            if let Some(group) = group {
                message["media_group_id"] = group.into();
            }
            if let Some(caption) = caption {
                message["caption"] = caption.into();
            }
            if kind == "edited_message" {
                message["edit_date"] = 1_700_000_100.into();
            }
            RawUpdate::new(&serde_json::json!({"update_id": id, kind: message}).to_string())
        };
        let updates = vec![
            photo(1, "message", Some("first"), None),
            photo(2, "message", Some("first"), None),
            photo(3, "message", Some("first"), Some("@the_bot which one?")),
            photo(4, "message", Some("quiet"), None),
            photo(5, "message", Some("quiet"), Some("no mention")),
            photo(6, "message", None, None),
            photo(7, "edited_message", Some("first"), None),
        ];
        let mut batch = read_batch(updates, routing, bot).await.envelopes;
        address_albums(&mut batch);
        let fates: Vec<(i64, EnvelopeState, Option<&str>)> = batch
            .iter()
            .map(|r| (r.envelope.update_id, r.state, r.agent.as_ref().map(AgentName::as_str)))
            .collect();
        assert_eq!(
            fates,
            [
                (1, EnvelopeState::Queued, Some("worker")),
                (2, EnvelopeState::Queued, Some("worker")),
                (3, EnvelopeState::Queued, Some("worker")),
                (4, EnvelopeState::Ignored, None),
                (5, EnvelopeState::Ignored, None),
                (6, EnvelopeState::Ignored, None),
                (7, EnvelopeState::Ignored, None),
            ]
        );
        assert!(batch[..3].iter().all(|r| r.note.is_none()), "no reason to be ignored is kept");
    }
}
